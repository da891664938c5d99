"""``ctx bootstrap`` on a full disk and under a storage root path too long for its entries:
every problem line names its path, the run ends with a ``ctx: E<NAME>: …`` line (the first
problem's errno) and exit 1, and a run after the cause is gone repairs the root (SPEC R-5).

Real ``ctx`` processes; the full disk is a real tmpfs (needs root to mount it).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import ctx
from tests.support.storage import small_tmpfs
from tests.support.storage import traversable_tmp as traversable_tmp

PATH_MAX = 4096


@pytest.fixture
def small_disk(traversable_tmp: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    with small_tmpfs(traversable_tmp / "disk", "1m") as disk:
        yield disk


def _problems(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("problem")]


def test_a_bootstrap_on_a_full_disk_ends_with_enospc_and_a_rerun_repairs(small_disk: Path) -> None:
    root = small_disk / "root"

    full = ctx(root, "bootstrap")
    as_json = ctx(root, "bootstrap", "--json")
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    repaired = ctx(root, "bootstrap")
    again = ctx(root, "bootstrap")

    assert full.returncode == 1, full
    assert full.stderr.startswith(f"ctx: ENOSPC: bootstrap of {root} left "), full.stderr
    assert full.stderr.count("\n") == 1 and "run 'ctx bootstrap' again" in full.stderr
    problems = _problems(full.stdout)
    assert problems and "(None)" not in full.stdout
    for line in problems:  # a file: "…: No space left on device (ROOT/X)"; a tool's install
        where = line.split()[1].rstrip(":")  # "…: ENOSPC: cannot install ROOT/tool/X: No space…"
        assert f"No space left on device ({root}/{where})" in line or (
            f"cannot install {root}/{where}: No space left on device" in line
        ), line
    assert as_json.returncode == 1 and as_json.stderr.startswith("ctx: ENOSPC: ")
    assert json.loads(as_json.stdout)["problems"], as_json.stdout
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout
    for entry in ("tool/fs.read", "tool/shell.exec", "tool/tsh.d/config", "bin/tsh"):
        assert (root / entry).exists(), entry


def _long_directory(base: Path, length: int) -> Path:
    """A directory whose path is ``length`` bytes long, made one level at a time."""
    path = str(base)
    while len(path) < length - 250:
        path += "/" + "d" * 200
    path += "/" + "e" * (length - len(path) - 1)
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in Path(path).relative_to(base).parts:
            os.mkdir(part, dir_fd=fd)
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    return Path(path)


def test_a_storage_root_path_too_long_for_its_entries_ends_with_enametoolong(
    traversable_tmp: Path,
) -> None:
    root = _long_directory(traversable_tmp, PATH_MAX - 12) / "rb"

    done = ctx(root, "bootstrap")

    assert done.returncode == 1, done
    assert done.stderr.startswith(f"ctx: ENAMETOOLONG: bootstrap of {root} left "), done.stderr
    problems = _problems(done.stdout)
    assert problems and "(None)" not in done.stdout
    for line in problems:
        where = line.split()[1].rstrip(":")
        assert f"File name too long ({root}/{where})" in line, line
