"""The orphan guard (cortexfs.tools.orphans): what it kills when its process is gone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import psutil

from tests.support.waiting import wait_until

BEYOND_PID_MAX = 2**22 + 1  # no process group can have this number: safe for a guard to kill

STALLED_GUARD = f"""
import os, signal, subprocess, time
from cortexfs.tools.orphans import GUARD

finished = subprocess.Popen(
    ["sleep", "120"], start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
)
print(finished.pid, flush=True)
with GUARD.watching({BEYOND_PID_MAX}):
    pass  # starts the guard
guard = GUARD._guard.pid
print(guard, flush=True)
os.kill(guard, signal.SIGSTOP)
with GUARD.watching(finished.pid):  # a call whose group the guard was told of
    for _ in range(20_000):  # far more lines than the pipe holds while the guard is stopped
        with GUARD.watching({BEYOND_PID_MAX + 1}):
            pass
os.kill(guard, signal.SIGCONT)
deadline = time.monotonic() + 60
while GUARD._unsent and time.monotonic() < deadline:  # the guard reads a byte at a time
    time.sleep(0.1)
    with GUARD.watching({BEYOND_PID_MAX + 2}):
        pass  # each later call's lines carry those that waited
assert not GUARD._unsent, "the guard never caught up"
"""


def test_a_group_whose_call_ended_while_the_guard_was_stopped_is_never_killed() -> None:
    """Had ``-PGID`` been dropped for want of room in the pipe, the guard would kill that
    group when its process ends: by then, any group that has the number."""
    done = subprocess.run(
        [sys.executable, "-c", STALLED_GUARD], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    group, guard = map(int, done.stdout.split())
    try:
        # The guard kills what it still holds when it reads end-of-file, then exits: once it is
        # gone, whatever it was going to kill is dead.
        deadline = time.monotonic() + 30
        while is_running(guard):
            assert time.monotonic() < deadline, "the guard outlived its process"
            time.sleep(0.05)
        assert is_running(group), "the guard killed a group whose call had ended"
    finally:
        os.killpg(group, signal.SIGKILL)


def is_running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


SESSION_CALL = """
import os, subprocess, time
from cortexfs.tools.orphans import GUARD

# A call that leads a session of its own, as a shell typed at tsh does, with a job of that
# shell's in a process group of its own; this process then dies without a word.
JOB = "import os, time; os.setpgid(0, 0); print(os.getpid(), flush=True); time.sleep(120)"
leader = subprocess.Popen(
    ["/bin/sh", "-c", f"python3 -c '{JOB}' & exec sleep 120"],
    start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
)
job = int(leader.stdout.readline())
with GUARD.watching(leader.pid, session=True):
    print(leader.pid, job, GUARD._guard.pid, flush=True)
    os._exit(0)
"""


def test_a_call_that_leads_a_session_has_every_process_of_it_killed() -> None:
    """A session registered with the guard (a tool that leads the terminal, H-5) is killed
    whole when the guard's process is gone: its job in another group too, which the group's
    kill would miss."""
    done = subprocess.run(
        [sys.executable, "-c", SESSION_CALL], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    leader, job, guard = map(int, done.stdout.split())
    try:
        assert (os.getsid(job), os.getpgid(job)) == (leader, job), "a job in a group of its own"
        deadline = time.monotonic() + 30
        while is_running(guard) or is_running(leader) or is_running(job):
            assert time.monotonic() < deadline, "the session outlived its call"
            time.sleep(0.05)
    finally:
        for pid in (leader, job):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


ADOPTING_CALLER = """
import os, subprocess
from cortexfs.tools.orphans import GUARD, adopting

# A daemon's double fork into a session of its own, and a process that left with setsid while
# its parent lives on: both are out of the call's group and session.
CALL = "setsid sh -c 'sleep 120 & echo $!'; setsid sleep 120 & echo $!; sleep 120"
with adopting():
    with GUARD.watching(os.getpid() + 10**7):  # the guard runs, and must be spared
        call = subprocess.Popen(["/bin/sh", "-c", CALL], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
        left = [call.stdout.readline().strip() for _ in range(2)]
        print(call.pid, *left, GUARD.pids()[0], flush=True)
        os.kill(call.pid, 9)
        call.wait()
        input()  # the test looks at the processes first
print("ended", flush=True)
input()
"""


def test_a_command_adopting_its_calls_orphans_kills_what_left_their_group_as_it_ends() -> None:
    """adopting (ctx run): what a call left running in sessions of its own, orphaned (a
    daemon's double fork) or not, is killed as the block ends, while the command still runs;
    the orphan guard, which serves every call of the command, is spared."""
    command = subprocess.Popen(
        [sys.executable, "-c", ADOPTING_CALLER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert command.stdin and command.stdout
    try:
        _, orphan, setsid_child, guard = map(int, command.stdout.readline().split())
        # Orphaned by its parent's exit: the command has it, not init.
        assert wait_until(lambda: psutil.Process(orphan).ppid() == command.pid)
        assert wait_until(lambda: os.getsid(setsid_child) == setsid_child)  # setsid(1) has run
        command.stdin.write("\n")
        command.stdin.flush()
        assert command.stdout.readline() == "ended\n"
        assert not is_running(orphan) and not is_running(setsid_child)
        assert is_running(guard)
    finally:
        command.kill()
        command.wait()
