"""A real ``ctx mount`` for the FUSE tests, and a way to act through it as another uid."""

from __future__ import annotations

import functools
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cortexfs.fuse.mounts import mounted_type
from tests.support.users import UnprivilegedUser

try:
    import pyfuse3
except ImportError:  # pragma: no cover - depends on the machine
    pyfuse3 = None

NEEDS_A_MOUNT = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a mount for other uids needs root"),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse on this machine"),
    pytest.mark.skipif(pyfuse3 is None, reason="pyfuse3 (the 'fuse' extra) is not installed"),
]


@contextmanager
def mounted(
    root: Path, mountpoint: Path, *args: str, open_files: int | None = None
) -> Iterator[subprocess.Popen[str]]:
    """``ctx mount`` running in the background until the block ends (then SIGTERM);
    ``open_files``: the most descriptors it may hold (``ulimit -n``)."""
    mountpoint.mkdir(exist_ok=True)
    limited = None
    if open_files is not None:
        limited = functools.partial(
            resource.setrlimit, resource.RLIMIT_NOFILE, (open_files, open_files)
        )
    process = subprocess.Popen(
        [sys.executable, "-m", "cortexfs", "--storage", str(root), "mount", *args, str(mountpoint)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limited,
    )
    deadline = time.monotonic() + 30
    while not os.path.ismount(mountpoint):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the mount did not appear"
        time.sleep(0.05)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
        # The mount table, not ismount(): a mount whose daemon died answers stat with ENOTCONN,
        # which ismount() takes for "not a mount point".
        left = mounted_type(Path(os.path.abspath(mountpoint)))
        if left is not None:
            subprocess.run(["umount", "--lazy", str(mountpoint)], check=False)
        assert left is None, f"still mounted ({left}) after the process ended"


def as_user(user: UnprivilegedUser, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups",
         "sh", "-c", script],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
