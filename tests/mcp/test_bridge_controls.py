"""How the MCP bridge reads its tool's controls: a control it cannot read makes the tool
damaged (ENOEXEC), but the host's shortage of descriptors or memory is said as such, so that a
worker leaves the job claimed rather than failing it for good (docs/workers.md)."""

from __future__ import annotations

import errno
import json
import os
import time
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

    def out_of_descriptors(path: Path, limit: int) -> bytes:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), str(path))

    monkeypatch.setattr(mcp_bridge, "read_regular_file", out_of_descriptors)
    with pytest.raises(ToolFailure) as short:
        read(str(executable))  # type: ignore[operator]

    assert missing.value.errno == errno.ENOEXEC
    assert short.value.errno == errno.EMFILE


@pytest.mark.parametrize(
    ("read", "control"), [(mcp_bridge.read_schema, "schema"), (mcp_bridge.read_locator, "mcp")]
)
def test_a_sparse_control_is_refused_with_efbig_and_a_fifo_is_not_waited_on(
    tmp_path: Path, read: object, control: str
) -> None:
    """No more than a byte past 1 MiB of a control grown sparse to 4 GiB is read; a FIFO in a
    control's place is damage at once, not a wait for a writer."""
    executable = tmp_path / "gh.search"
    executable.write_text("")
    path = tmp_path / "gh.search.d" / control
    path.parent.mkdir()
    path.touch()
    os.truncate(path, 4 << 30)

    started = time.monotonic()
    with pytest.raises(ToolFailure) as too_big:
        read(str(executable))  # type: ignore[operator]
    path.unlink()
    os.mkfifo(path)
    with pytest.raises(ToolFailure) as fifo:
        read(str(executable))  # type: ignore[operator]

    assert time.monotonic() - started < 5
    assert too_big.value.errno == errno.EFBIG
    assert f"{path} holds more than 1048576 bytes, the limit of a control" in str(too_big.value)
    assert fifo.value.errno == errno.ENOEXEC


def test_a_locator_whose_configuration_path_holds_a_nul_is_damage(tmp_path: Path) -> None:
    """M-4: no file's path holds a NUL, so such a locator names no configuration: the tool is
    damaged (ENOEXEC), before anything is looked up, not refused as if the call's input were
    bad (EINVAL, exit 2), and the manifest check refuses it as well."""
    executable = tmp_path / "gh.search"
    executable.write_text("")
    (tmp_path / "gh.search.d").mkdir()
    locator = {"transport": "stdio", "config": "/mcp/m.json\0", "server": "gh", "tool": "search"}
    (tmp_path / "gh.search.d" / "mcp").write_text(json.dumps(locator))

    with pytest.raises(ToolFailure) as refused:
        mcp_bridge.read_locator(str(executable))

    assert refused.value.errno == errno.ENOEXEC
    assert "NUL" in str(refused.value)
