"""A worker stopped by SIGTERM or SIGHUP while it starts says so and exits 0, as one stopped
later does (SPEC W-4, docs/workers.md "Signals"); it never vanishes without a word.

The moments are taken from the outside, with nothing added to the worker for the test: an
inotify watch tells when the worker first opens its queue (it has begun its own work by
then), and a worker frozen with SIGSTOP shows in ``/proc/PID/status`` whether it catches
SIGTERM at the moment the signal is delivered (a stopped process cannot change that).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.workers.conftest import AGENT, PROJECT, REPO, Farm

STARTING_LINE = "ctx: stopped by {} while starting; no job was claimed"
IN_OPEN = 0x00000020
_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


@contextlib.contextmanager
def opens_of(directory: Path) -> Iterator[int]:
    """An inotify descriptor that becomes readable when ``directory`` is opened."""
    fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        pytest.skip(f"inotify unavailable: {os.strerror(ctypes.get_errno())}")
    try:
        if _libc.inotify_add_watch(fd, os.fsencode(directory), IN_OPEN) < 0:
            pytest.skip(f"inotify watch refused: {os.strerror(ctypes.get_errno())}")
        yield fd
    finally:
        os.close(fd)


def was_opened(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def start_worker(farm: Farm, *extra: str) -> subprocess.Popen[str]:
    """``ctx queue work`` without --drain: it runs until a signal stops it."""
    work = ["queue", "work", "--project", PROJECT, "--agent", AGENT, *extra]
    return subprocess.Popen(
        [sys.executable, "-m", "cortexfs", *work],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CTX_STORAGE": str(farm.root)},
        cwd=REPO,
    )


def catches(pid: int, signum: int) -> bool:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    raise AssertionError(f"no SigCgt line in /proc/{pid}/status")


def frozen(pid: int) -> bool:
    """Whether ``pid`` is stopped now (False once it has ended)."""
    with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0] == "T"
    return False


def said_its_stop(out: str, err: str, signal_name: str) -> bool:
    """The line of a worker stopped while starting, or the summary of one stopped later."""
    return STARTING_LINE.format(signal_name) in err.splitlines() or any(
        line.startswith("worker stopped: 0 done, 0 failed") for line in out.splitlines()
    )


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_once_the_worker_opened_its_queue_is_said_and_claims_nothing(
    farm: Farm, signum: signal.Signals
) -> None:
    job = farm.publish("shell.exec", {"cmd": "echo ran"})
    with opens_of(farm.queue) as opened:
        worker = start_worker(farm)
        ready, _, _ = select.select([opened], [], [], 60)
        assert ready, "the worker never opened its queue"
        worker.send_signal(signum)
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, (worker.returncode, out, err)
    assert said_its_stop(out, err, signum.name), (out, err)
    assert (farm.queue / "pending" / job).is_file(), "nothing was claimed"


def test_the_line_and_the_summary_of_a_worker_stopped_while_starting(farm: Farm) -> None:
    with opens_of(farm.queue) as opened:
        worker = start_worker(farm, "--json")
        assert select.select([opened], [], [], 60)[0], "the worker never opened its queue"
        worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    if events[0]["event"] == "start":
        pytest.skip("the signal came after the worker had started (a slow host)")
    assert err.splitlines()[-1] == STARTING_LINE.format("SIGTERM")
    assert [e["event"] for e in events] == ["stop"]
    assert events[0]["stopped_by"] == "SIGTERM" and events[0]["done"] == 0


def test_a_sigterm_at_any_moment_of_startup_is_said_or_finds_nothing_begun(farm: Farm) -> None:
    """50 workers, each frozen at a later moment of its startup and sent SIGTERM there: one
    that catches SIGTERM then says its stop and exits 0; one that does not yet is ended by
    it, and had not opened its queue (the interpreter and ``ctx`` were still loading)."""
    outcomes = {"said": 0, "ended before its work": 0}
    for run in range(50):
        with opens_of(farm.queue) as opened:
            worker = start_worker(farm)
            time.sleep(run * 0.005)
            worker.send_signal(signal.SIGSTOP)
            deadline = time.monotonic() + 30
            while not frozen(worker.pid):
                assert time.monotonic() < deadline, "the worker did not stop for SIGSTOP"
                time.sleep(0.001)
            caught = catches(worker.pid, signal.SIGTERM)
            worker.send_signal(signal.SIGTERM)
            worker.send_signal(signal.SIGCONT)
            out, err = worker.communicate(timeout=60)
            queue_opened = was_opened(opened)
        what = (run, caught, worker.returncode, out, err)
        if caught:
            assert worker.returncode == 0, what
            assert said_its_stop(out, err, "SIGTERM"), what
            outcomes["said"] += 1
        else:
            assert worker.returncode == -signal.SIGTERM, what
            assert not queue_opened, f"a worker ended silently after opening its queue: {what}"
            outcomes["ended before its work"] += 1
    assert all(outcomes.values()), outcomes
