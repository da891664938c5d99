"""Running out, for real: a tmpfs with few inodes filled to the count a test wants left, and
``ctx`` run with a limit on open files."""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def inode_limited_tmpfs(mountpoint: Path, inodes: int = 400) -> Iterator[Path]:
    """A tmpfs of 8 MiB but only ``inodes`` inodes at ``mountpoint`` (made here, 0755), for
    the block; the test is skipped where no tmpfs can be mounted."""
    mountpoint.mkdir()
    options = f"size=8m,nr_inodes={inodes}"
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mountpoint)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    mountpoint.chmod(0o755)
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def fill_to(disk: Path, free_inodes: int) -> Path:
    """Empty files in ``disk/fill`` until ``free_inodes`` inodes are left; the directory."""
    fill = disk / "fill"
    fill.mkdir(exist_ok=True)
    count = len(os.listdir(fill))
    while os.statvfs(disk).f_ffree > free_inodes:
        (fill / str(count)).touch()
        count += 1
    return fill


def empty(fill: Path) -> None:
    """Give back the inodes :func:`fill_to` took."""
    for name in os.listdir(fill):
        (fill / name).unlink()


def run_ctx(
    root: Path, *args: str, descriptors: int | None = None
) -> subprocess.CompletedProcess[str]:
    """``ctx --storage ROOT ARGS…`` in a process of its own, with at most ``descriptors``
    open files when given."""

    def limit() -> None:
        if descriptors is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))

    return subprocess.run(
        [sys.executable, "-m", "cortexfs", "--storage", str(root), *args],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        preexec_fn=limit,
        timeout=120,
    )
