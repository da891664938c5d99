"""How the MCP bridge reads its tool's controls: a control it cannot read makes the tool
damaged (ENOEXEC), but the host's shortage of descriptors or memory is said as such, so that a
worker leaves the job claimed rather than failing it for good (docs/workers.md)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from cortexfs.tools.core import mcp_bridge
from cortexfs.tools.core.toolio import ToolFailure


@pytest.mark.parametrize("read", [mcp_bridge.read_schema, mcp_bridge.read_locator])
def test_a_control_that_cannot_be_read_is_damage_but_a_shortage_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, read: object
) -> None:
    executable = tmp_path / "gh.search"
    executable.write_text("")
    (tmp_path / "gh.search.d").mkdir()

    with pytest.raises(ToolFailure) as missing:
        read(str(executable))  # type: ignore[operator]

    def out_of_descriptors(self: Path) -> bytes:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), str(self))

    monkeypatch.setattr(Path, "read_bytes", out_of_descriptors)
    with pytest.raises(ToolFailure) as short:
        read(str(executable))  # type: ignore[operator]

    assert missing.value.errno == errno.ENOEXEC
    assert short.value.errno == errno.EMFILE
