"""A child's exit seen without reaping it, with and without a pidfd (a kernel or a seccomp
filter that refuses pidfd_open); and a tool run through the pump either way."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from cortexfs.exit_watch import ExitWatch
from cortexfs.tools.spawn import ProcessSpec, run_captured


@pytest.fixture(params=["pidfd", "no pidfd"])
def pidfd(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "no pidfd":

        def refused(pid: int, flags: int = 0) -> int:
            raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

        monkeypatch.setattr(os, "pidfd_open", refused)
    return str(request.param)


def test_an_exit_is_seen_and_left_to_be_reaped(pidfd: str) -> None:
    child = subprocess.Popen(["sh", "-c", "read line; exit 7"], stdin=subprocess.PIPE)
    watch = ExitWatch(child.pid)
    try:
        assert (watch.fd is None) == (pidfd == "no pidfd")
        assert not watch.exited() and not watch.wait(0.05)
        assert child.stdin is not None
        child.stdin.close()
        assert watch.wait(30)
        assert watch.exited()
        assert child.wait() == 7  # not reaped by the watch
        assert watch.exited()  # and still said once reaped
    finally:
        watch.close()


def test_a_tool_s_output_and_exit_status_come_through_the_pump(pidfd: str) -> None:
    spec = ProcessSpec(["/bin/sh", "-c", "cat; echo err >&2; exit 3"], {}, "/", None, timeout=60)

    finished = run_captured(spec, b"input")

    assert (finished.exit_status, finished.stdout, finished.stderr_tail) == (3, b"input", b"err\n")
    assert not finished.timed_out
