"""A child forked while other threads held locks or imported modules (cortexfs.forks).

Each case runs as a program of its own, so that its threads and forks are its alone; a child
that would wait forever is ended by its alarm, and its status says so (-14).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

STUCK = -14  # a child ended by its SIGALRM: it waited for a lock nobody in it would let go

PRELUDE = """
import json, os, signal, sys, threading, time

def forked(child):
    '''The exit status of a child forked now that runs ``child()``: 0 when it returns True.'''
    pid = os.fork()
    if pid == 0:
        signal.alarm(3)
        os._exit(0 if child() else 1)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
"""


def run(body: str, *, path: str | Path | None = None) -> object:
    program = PRELUDE + textwrap.dedent(body)
    env = None if path is None else {"PYTHONPATH": str(path), "PATH": "/usr/bin:/bin"}
    ran = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, env=env
    )
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout.splitlines()[-1])


def held_by_a_thread(make_lock: str, preamble: str = "pass") -> str:
    """A program where a thread holds ``make_lock`` while the main thread forks, then lets
    it go: it prints the child's status, and whether the parent can take the lock after."""
    return f"""
    {preamble}
    lock = {make_lock}
    holding, release = threading.Event(), threading.Event()
    def hold():
        with lock:
            holding.set()
            release.wait()
    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait()
    def take():
        with lock:
            return True
    status = forked(take)
    release.set()
    thread.join()
    print(json.dumps({{"child": status, "parent_after": take()}}))
    """


def test_a_process_lock_another_thread_held_at_the_fork_is_free_in_the_child() -> None:
    got = run(held_by_a_thread("ProcessLock()", "from cortexfs.forks import ProcessLock"))
    assert got == {"child": 0, "parent_after": True}


def test_a_plain_lock_another_thread_held_at_the_fork_stays_held_in_the_child() -> None:
    """What ProcessLock is for: the same program with ``threading.Lock`` leaves the child
    waiting (the case above is no accident of timing)."""
    got = run(held_by_a_thread("threading.Lock()"))
    assert got == {"child": STUCK, "parent_after": True}


SLOW_MODULE = """
import os, time
os.write(int(os.environ["STARTED_FD"]), b"x")  # the import is under way
time.sleep(1)
VALUE = 42
"""


def importing_while_forking(preamble: str) -> str:
    """A program where a thread imports ``slow`` (a second long) while the main thread forks
    and the child imports it too: it prints the child's status."""
    return f"""
    {preamble}
    started, says = os.pipe()
    os.environ["STARTED_FD"] = str(says)
    thread = threading.Thread(target=lambda: __import__("slow"))
    thread.start()
    os.read(started, 1)
    status = forked(lambda: __import__("slow").VALUE == 42)
    thread.join()
    print(json.dumps({{"child": status}}))
    """


def test_a_module_another_thread_was_importing_at_the_fork_is_whole_in_the_child(
    tmp_path: Path,
) -> None:
    (tmp_path / "slow.py").write_text(SLOW_MODULE)
    sources = Path(__file__).resolve().parents[1]
    got = run(importing_while_forking("import cortexfs.forks"), path=f"{tmp_path}:{sources}")
    assert got == {"child": 0}


def test_without_the_hook_the_child_waits_for_the_import_forever(tmp_path: Path) -> None:
    """What the hook is for: without cortexfs.forks, the same child is stuck."""
    (tmp_path / "slow.py").write_text(SLOW_MODULE)
    assert run(importing_while_forking("pass"), path=tmp_path) == {"child": STUCK}


def test_an_import_the_forking_thread_has_under_way_does_not_hold_up_its_fork(
    tmp_path: Path,
) -> None:
    """A module that forks while it is being imported (the forking thread's own import under
    way) forks at once: the hook re-enters that import rather than waiting for it."""
    (tmp_path / "forking.py").write_text(
        textwrap.dedent(
            """
            import os, time
            import cortexfs.forks
            began = time.monotonic()
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            TOOK = time.monotonic() - began
            """
        )
    )
    sources = Path(__file__).resolve().parents[1]
    got = run("import forking\nprint(json.dumps(forking.TOOK))", path=f"{tmp_path}:{sources}")
    assert got < 2.0


def test_a_child_forked_while_a_schema_was_being_checked_has_its_callers_recursion_limit() -> None:
    """The recursion limit raised for jsonschema while a thread checked an input is the
    caller's own again in a child forked meanwhile: no thread of the child holds it."""
    got = run(
        """
        from cortexfs.tools import schemas
        sys.setrecursionlimit(1500)
        inside, leave = threading.Event(), threading.Event()
        def check():
            with schemas._headroom.held():
                inside.set()
                leave.wait()
        thread = threading.Thread(target=check)
        thread.start()
        inside.wait()
        raised = sys.getrecursionlimit()
        def child():
            with schemas._headroom.held():
                pass
            return sys.getrecursionlimit() == 1500
        status = forked(child)
        leave.set()
        thread.join()
        print(json.dumps([raised, status, sys.getrecursionlimit()]))
        """
    )
    assert got == [6000, 0, 1500]


LOGGING_MODULE = """
import logging, os, time
os.write(int(os.environ["STARTED_FD"]), b"x")  # the import is under way
time.sleep(0.5)
logging.getLogger("slow")  # takes logging's lock, which logging's own fork hook holds
VALUE = 42
"""


def test_an_import_that_waits_for_a_lock_the_fork_holds_delays_the_fork_not_for_ever(
    tmp_path: Path,
) -> None:
    """logging, imported after cortexfs.forks, takes its lock in its own hook before ours
    runs; a thread whose import then waits for that lock cannot end while the fork waits
    for it: the fork goes on after IMPORT_WAIT_SECONDS."""
    (tmp_path / "slow.py").write_text(LOGGING_MODULE)
    sources = Path(__file__).resolve().parents[1]
    got = run(
        """
        import cortexfs.forks
        cortexfs.forks.IMPORT_WAIT_SECONDS = 0.5
        import logging
        started, says = os.pipe()
        os.environ["STARTED_FD"] = str(says)
        thread = threading.Thread(target=lambda: __import__("slow"))
        thread.start()
        os.read(started, 1)
        began = time.monotonic()
        status = forked(lambda: True)
        took = time.monotonic() - began
        thread.join()
        print(json.dumps([status, took < 5, __import__("slow").VALUE]))
        """,
        path=f"{tmp_path}:{sources}",
    )
    assert got == [0, True, 42]


def test_a_process_lock_the_forking_thread_holds_is_its_own_in_the_child() -> None:
    got = run(
        """
        from cortexfs.forks import ProcessLock
        lock = ProcessLock()
        with lock:
            status = forked(lambda: lock.__exit__(None, None, None) is None)
        print(json.dumps({"child": status}))
        """
    )
    assert got == {"child": 0}
