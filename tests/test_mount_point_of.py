"""Which mount holds a path, as the refusals of a ``noexec`` filesystem name it (T-5)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cortexfs.mount_table import mount_point_of
from cortexfs.storage import executes_nothing

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")


def test_the_deepest_mount_is_named_with_its_spaces_and_a_bind_mount_is_told_apart(
    tmp_path: Path,
) -> None:
    spaced = tmp_path / "a dir\twith blanks"
    spaced.mkdir()
    bound = tmp_path / "bound"
    bound.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,noexec", "t", spaced], check=True)
    try:
        # A bind mount of the same filesystem has its device number: only the table differs.
        subprocess.run(["mount", "--bind", spaced, bound], check=True)
        try:
            (spaced / "sub").mkdir()
            assert mount_point_of(spaced / "sub" / "tool") == str(spaced)
            assert mount_point_of(bound / "sub") == str(bound)
            assert mount_point_of(tmp_path) != str(spaced)
            said = executes_nothing(spaced / "sub" / "t", "tool/t", "the tool")
            assert said == (
                f"tool/t is on a filesystem mounted noexec at {spaced}: the kernel executes "
                f"nothing there, whatever its mode (T-5); remount {spaced} with exec, or put "
                "the tool on a filesystem mounted with exec"
            )
        finally:
            subprocess.run(["umount", "-l", bound], check=True)
    finally:
        subprocess.run(["umount", "-l", spaced], check=True)
