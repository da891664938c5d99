"""A tool's control directory that cannot be opened for a reason of the host's, not the
tool's, is reported with the kernel's errno, never as a damaged tool to reinstall (T-1)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from cortexfs import storage
from cortexfs.errors import CtxError
from cortexfs.tools.controls import ToolObject, layout_problems, read_controls
from tests.support.users import UnprivilegedUser
from tests.tools.support import effective_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")


def test_a_tier_the_caller_may_not_search_is_eacces_not_damage(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    tier = traversable_tmp / "tool"
    (tier / "x.d").mkdir(parents=True)
    (tier / "x").write_text("#!/bin/sh\n")
    tier.chmod(0o700)  # root's alone: a root-squashed export looks like this to root

    with effective_user(unprivileged_user), pytest.raises(CtxError) as refused:
        read_controls(ToolObject("x", tier))

    assert refused.value.errno == errno.EACCES
    assert f"{tier}/x.d cannot be opened" in refused.value.message
    assert "reinstall" not in refused.value.message


def test_a_missing_control_directory_is_still_damage(traversable_tmp: Path) -> None:
    tier = traversable_tmp / "tool"
    tier.mkdir()
    (tier / "x").write_text("#!/bin/sh\n")

    with pytest.raises(CtxError) as refused:
        read_controls(ToolObject("x", tier))

    assert refused.value.errno == errno.ENOEXEC
    assert "x.d/ is missing or not a directory" in refused.value.message


def test_a_name_control_naming_another_tool_is_quoted_as_text(tmp_path: Path) -> None:
    """The damage names what the control holds as text (never as a bytes repr), cut short."""
    root = tmp_path / "storage"
    storage.bootstrap(root)
    (root / "tool" / "fs.stat.d" / "name").write_bytes(b"other\n")
    (root / "tool" / "fs.read.d" / "name").write_text("é" * 100)

    assert "fs.stat.d/name names 'other', not fs.stat" in layout_problems(
        ToolObject("fs.stat", root / "tool")
    )
    [problem] = layout_problems(ToolObject("fs.read", root / "tool"))
    assert problem == f"fs.read.d/name names {'é' * 64!r}… (100 characters), not fs.read"
