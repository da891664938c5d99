"""The Python interfaces the docs give library callers, used by a program that embeds them:
``run_native``/``run_terminal`` (docs/tools.md "For workers and other callers"),
``open_session``/``SessionRef`` (docs/sessions.md) and ``check_tool_execute``/
``check_authority`` (docs/policy.md), called from many threads at once, from a thread pool
and from ``asyncio.to_thread``, in a process that forks after using them, with signals
arriving, and with the caller's own process state unusual (its working directory removed,
umask 077, stdin closed, SIGCHLD ignored, SIGPIPE at its default, children of its own).

SPEC ids: T-3 (two modes, one chain), T-7 and S-2 (each call's ``tool_call`` and
``tool_result`` recorded), S-1 and S-5 (session files, whole lines, no interleaving), P-5 and
P-6 (the chain's decisions), W-1 and W-4 (exit status and timeout of a call), I-4 (no process
of a call outlives it).

Each program runs in a subprocess of the install's interpreter, as an embedding program
would, under a deadline: a deadlock fails the test instead of hanging it.  The storage root
is made by ``ctx bootstrap``; the agent ``ci`` (uid nobody) by ``ctx agent create``."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    tool_manifest,
)
from tests.acceptance.workercli import allow_in_tool_policy, make_agent
from tests.support.storage import copy_of_root

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="the agent runs as uid nobody: needs root"),
    pytest.mark.timeout(60),
]

PYTHON = str(Path(CTX_ARGV[0]).parent / "python")
SCRATCH = scratch_top(__file__)
NOBODY = 65534
DEADLINE = 25.0  # seconds an embedding program may take before it counts as hung

# What every embedding program starts with: the documented imports and a few helpers.
PRELUDE = """\
import asyncio, json, os, signal, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from cortexfs.policy import AuthorityRequest, Credentials, check_authority, check_tool_execute
from cortexfs.shared.sessions import SessionRef, open_session
from cortexfs.shared.tree import Ownership
from cortexfs.tools.runner import run_native, run_terminal

root = Path(sys.argv[1])

def call(cmd, session="s", **kw):
    kw.setdefault("timeout", 30)
    return run_native(root, "ci", "shell.exec", {"cmd": cmd}, session=session, **kw)

def summary(r):
    err = r.error
    return [r.ok, r.output, r.exit_status, None if err is None else [err.errno, err.stage]]

def children():
    me = str(os.getpid())
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[1] == me:
            found.append((int(pid), fields[0]))
    return sorted(found)

def fds():
    return sorted(int(fd) for fd in os.listdir("/proc/self/fd"))

def done(value):
    sys.stdout.flush()
    print("\\nRESULT " + json.dumps(value), flush=True)
"""


def embed(root: Path, body: str, *, timeout: float = DEADLINE) -> dict:
    """Run ``PRELUDE + body`` as a program of its own; the value it passed to ``done``."""
    program = PRELUDE + textwrap.dedent(body)
    try:
        ran = subprocess.run(
            [PYTHON, "-c", program, str(root)],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the embedding program did not end within {timeout}s: {hung.stderr!r}")
    marked = [line for line in ran.stdout.splitlines() if line.startswith("RESULT ")]
    assert ran.returncode == 0 and marked, (ran.returncode, ran.stdout[-2000:], ran.stderr)
    return json.loads(marked[-1][len("RESULT ") :])


def session_events(root: Path, name: str) -> list[dict]:
    return read_jsonl(root / f"home/{NOBODY}/agent/ci/session/{name}/events.jsonl")


def assert_each_call_recorded_once(events: list[dict], calls: list[str]) -> None:
    """S-2, T-7: one ``tool_call`` and one ``tool_result`` per call, nothing else."""
    by_call: dict[str, list[str]] = {}
    for event in events:
        by_call.setdefault(event.get("call"), []).append(event["type"])
    assert sorted(by_call) == sorted(calls), by_call
    assert all(types == ["tool_call", "tool_result"] for types in by_call.values()), by_call


def prepared_root(template: Path) -> Iterator[Path]:
    """A copy of the bootstrapped ``template`` where uid nobody may search, with agent ``ci``
    allowed ``shell.exec`` and ``quiet`` (a tool that never reads its input) in both layers
    of P-6; removed afterwards."""
    parent = new_scratch_dir(SCRATCH, "root")
    storage = copy_of_root(template, parent / "storage")
    manifest = tool_manifest(parent / "manifests", "quiet", "#!/bin/sh\nexit 0\n")
    r = ctx_run("object", "install", "--storage", storage, manifest, "--tier", "system")
    assert r.rc == 0, r
    make_agent(storage, ["shell.exec", "quiet"])
    allow_in_tool_policy(storage, "shell.exec")
    allow_in_tool_policy(storage, "quiet")
    yield storage
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture(scope="module")
def root(_template: Path) -> Iterator[Path]:
    """One prepared root for the tests of a process: each names sessions of its own."""
    yield from prepared_root(_template)


@pytest.fixture
def own_root(_template: Path) -> Iterator[Path]:
    """A prepared root for one test, which changes the agent's controls."""
    yield from prepared_root(_template)


# ------------------------------------------------------------------------- many threads


def test_calls_from_many_threads_match_one_threaded_calls_and_are_recorded_once(
    root: Path,
) -> None:
    """T-3, T-7, S-2, S-5: sixteen threads calling ``run_native`` at once into one session get
    what the same calls get one at a time; each observer sees only its own call's frames; the
    session holds each call's two events, whole, and the tool's log one line per call."""
    out = embed(
        root,
        """
        cmds = [f"echo v{i}; echo e{i} >&2; exit {i % 3}" for i in range(16)]
        alone = [summary(call(c, "alone")) for c in cmds]
        frames = {i: [] for i in range(16)}
        results = {}
        start = threading.Barrier(16)
        def worker(i):
            start.wait()
            results[i] = call(cmds[i], "crowd", observer=frames[i].append)
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        done({
            "alone": alone,
            "crowd": [summary(results[i]) for i in range(16)],
            "calls": [results[i].to_json()["call"] for i in range(16)],
            "frames": [[(f["type"], f["call"], f.get("text")) for f in frames[i]]
                       for i in range(16)],
        })
        """,
    )
    assert out["crowd"] == out["alone"]
    assert out["crowd"][4] == [False, "v4\n", 1, [0, "exit"]], out["crowd"][4]
    for i, (frames, call) in enumerate(zip(out["frames"], out["calls"], strict=True)):
        assert [f[0] for f in frames] == ["call", "stderr", "result"], frames
        assert {f[1] for f in frames} == {call} and frames[1][2] == f"e{i}", frames
    assert len(set(out["calls"])) == 16
    assert_each_call_recorded_once(session_events(root, "crowd"), out["calls"])
    log = read_jsonl(root / "tool/shell.exec.d/log")
    crowd = [line["call"] for line in log if line.get("session") == "crowd"]
    assert sorted(crowd) == sorted(out["calls"])


def test_a_thread_pool_and_asyncio_to_thread_give_the_one_threaded_results(root: Path) -> None:
    """T-3: the same calls through ``ThreadPoolExecutor.map`` and through
    ``asyncio.gather(asyncio.to_thread(...))`` come back in order with the same results."""
    out = embed(
        root,
        """
        cmds = [f"printf 'p{i}'; exit {i % 2}" for i in range(12)]
        alone = [summary(call(c, "alone")) for c in cmds]
        with ThreadPoolExecutor(6) as pool:
            pooled = [summary(r) for r in pool.map(lambda c: call(c, "pool"), cmds)]
        async def main():
            return await asyncio.gather(*[asyncio.to_thread(call, c, "aio") for c in cmds])
        awaited = [summary(r) for r in asyncio.run(main())]
        done({"alone": alone, "pooled": pooled, "awaited": awaited})
        """,
    )
    assert out["pooled"] == out["alone"] and out["awaited"] == out["alone"]
    assert out["alone"][3] == [False, "p3", 1, [0, "exit"]]
    assert len(session_events(root, "pool")) == len(session_events(root, "aio")) == 24


def test_threads_opening_a_new_session_at_once_all_get_it(root: Path) -> None:
    """S-1: twelve threads whose first call names a session nobody made yet all run; the
    session is one directory of the documented modes holding all their events."""
    out = embed(
        root,
        """
        start = threading.Barrier(12)
        results = {}
        def worker(i):
            start.wait()
            results[i] = call(f"echo n{i}", "brand-new")
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        done([summary(results[i]) for i in range(12)])
        """,
    )
    assert out == [[True, f"n{i}\n", 0, None] for i in range(12)]
    where = root / f"home/{NOBODY}/agent/ci/session/brand-new"
    assert (os.stat(where).st_mode & 0o7777, os.stat(where / "events.jsonl").st_mode & 0o777) == (
        0o700,
        0o600,
    )
    assert len(session_events(root, "brand-new")) == 24


def test_open_session_from_threads_and_forked_processes_keeps_every_line_whole(
    root: Path,
) -> None:
    """S-5: threads of the parent and of forked children, each with ``open_session`` on one
    ``SessionRef``, record events of very different sizes; every line is one whole event and
    none is lost or doubled."""
    embed(
        root,
        """
        ref = SessionRef.home(root, 65534, "ci", "shared-log")
        def writer(tag):
            with open_session(ref, owner=Ownership(65534, 65534)) as session:
                for k in range(60):
                    session.record("note", object=f"x/{tag}", status="ok",
                                   durable_event=(k % 20 == 0), n=k, pad="p" * (k * 97 % 6000))
        def threads_of(prefix):
            threads = [threading.Thread(target=writer, args=(f"{prefix}{t}",)) for t in range(4)]
            [t.start() for t in threads]
            [t.join() for t in threads]
        writer("first")  # the parent has used the session before it forks
        pids = []
        for p in range(3):
            pid = os.fork()
            if pid == 0:
                signal.alarm(15)
                threads_of(f"c{p}-")
                os._exit(0)
            pids.append(pid)
        threads_of("parent-")
        statuses = [os.waitpid(pid, 0)[1] for pid in pids]
        assert statuses == [0, 0, 0], statuses
        done(True)
        """,
    )
    path = root / f"home/{NOBODY}/agent/ci/session/shared-log/events.jsonl"
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""  # the file ends with a whole line
    events = [json.loads(line) for line in lines[:-1]]
    seen = sorted((e["object"], e["n"]) for e in events)
    tags = ["first"] + [f"{p}{t}" for p in ("c0-", "c1-", "c2-", "parent-") for t in range(4)]
    assert seen == sorted((f"x/{tag}", k) for tag in tags for k in range(60))
    assert all(len(e["pad"]) == e["n"] * 97 % 6000 for e in events)


def test_the_chain_from_many_threads_decides_as_one_thread_does(root: Path) -> None:
    """P-5, P-6: ``check_tool_execute`` from sixteen pool threads gives, call for call, the
    decision one thread gives (allowed, step, errno, reason); a malformed ``check_authority``
    from a thread raises the documented ``CtxError`` with EINVAL."""
    out = embed(
        root,
        """
        me = Credentials(65534, 65534)
        asks = ["shell.exec", "fs.read", "quiet", "no-such-tool"] * 60
        def decide(tool):
            d = check_tool_execute(root, "ci", tool, me, location="tool")
            return [d.allowed, None if d.step is None else int(d.step), d.errno, d.reason]
        alone = [decide(t) for t in asks[:4]]
        with ThreadPoolExecutor(16) as pool:
            crowd = list(pool.map(decide, asks))
        def malformed(_):
            try:
                check_authority(AuthorityRequest(root, "ci", "bogus", "x", "read", me))
            except Exception as exc:
                return [type(exc).__name__, getattr(exc, "errno", None)]
            return None
        with ThreadPoolExecutor(8) as pool:
            refused = list(pool.map(malformed, range(16)))
        done({"alone": alone, "crowd": crowd, "refused": refused})
        """,
    )
    alone = out["alone"]
    assert [a[0] for a in alone] == [True, False, True, False]
    assert alone[1][1:3] == [5, 13] and alone[1][3].startswith("step 5 (object policy)")
    assert out["crowd"] == alone * 60
    assert out["refused"] == [["CtxError", 22]] * 16


# ------------------------------------------------------------- what the caller is left with


def test_repeated_calls_leave_no_descriptor_child_or_thread_behind(root: Path) -> None:
    """I-4: after a first call has set up what a process keeps for all its calls, twenty more
    native calls (from threads too) and five terminal calls change neither the caller's open
    descriptors, nor its children, nor its threads."""
    out = embed(
        root,
        """
        call("true")
        before = [fds(), children(), threading.active_count()]
        for i in range(10):
            call("echo x >&2; sleep 0.01 &")
        with ThreadPoolExecutor(5) as pool:
            list(pool.map(lambda i: call("true"), range(10)))
        for i in range(5):
            r = run_terminal(root, "ci", "shell.exec", ['{"cmd":"true"}'], session="s", timeout=30)
            assert r.ok, r.to_json()
        time.sleep(0.1)
        after = [fds(), children(), threading.active_count()]
        done({"before": before, "after": after})
        """,
    )
    assert out["after"] == out["before"]
    assert len(out["before"][1]) <= 1, out  # at most one helper (the orphan guard)


def test_the_callers_environment_cwd_umask_and_signal_handlers_are_left_as_they_were(
    root: Path,
) -> None:
    """T-3: a program that set handlers of its own (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1,
    one ignored) finds them, its environment, working directory and umask unchanged after
    native and terminal calls."""
    out = embed(
        root,
        """
        def mine(*_):
            pass
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
            signal.signal(s, mine)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGQUIT, signal.SIG_IGN)
        os.umask(0o027)
        os.environ["EMBEDDER_SETTING"] = "kept"
        def state():
            um = os.umask(0o027)
            os.umask(um)
            handlers = {s.name: repr(signal.getsignal(s)) for s in signal.Signals
                        if s not in (signal.SIGKILL, signal.SIGSTOP)}
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
            return [dict(os.environ), os.getcwd(), um, handlers, blocked]
        before = state()
        native = call("echo $EMBEDDER_SETTING; pwd")
        terminal = run_terminal(root, "ci", "shell.exec", ['{"cmd":"true"}'], session="s",
                                timeout=30)
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda i: call("true"), range(4)))
        after = state()
        done({"same": before == after, "before": repr(before), "after": repr(after),
              "native": summary(native), "terminal": summary(terminal)})
        """,
    )
    assert out["same"], (out["before"], out["after"])
    assert out["native"][0] and "EMBEDDER_SETTING" not in out["native"][1]
    assert out["native"][1].strip() != "kept"  # the tool's environment is its own
    assert out["terminal"] == [True, None, 0, None]


def test_a_caller_without_a_working_directory_stdin_or_permissive_umask_gets_the_same_call(
    root: Path,
) -> None:
    """S-1, T-3: a caller whose working directory was removed, whose umask is 077 and whose
    stdin is closed gets the one-threaded result; the session it makes has the documented
    modes whatever the umask; the umask and the removed directory are still its own."""
    out = embed(
        root,
        """
        import tempfile
        gone = tempfile.mkdtemp()
        os.chdir(gone)
        os.rmdir(gone)
        os.umask(0o077)
        os.close(0)
        native = call("echo ok; cat", "odd")
        terminal = run_terminal(root, "ci", "shell.exec", ['{"cmd":"cat; echo t"}'],
                                session="odd", timeout=30)
        um = os.umask(0o077)
        done({"native": summary(native), "terminal": summary(terminal), "umask": um,
              "cwd": os.readlink("/proc/self/cwd"), "gone": gone})
        """,
    )
    assert out["native"] == [True, "ok\n", 0, None]
    assert out["terminal"] == [True, None, 0, None]
    assert out["umask"] == 0o077 and out["cwd"] == out["gone"] + " (deleted)"
    where = root / f"home/{NOBODY}/agent/ci/session/odd"
    assert (os.stat(where).st_mode & 0o777, os.stat(where / "events.jsonl").st_mode & 0o777) == (
        0o700,
        0o600,
    )
    assert len(session_events(root, "odd")) == 4


def test_the_callers_own_children_are_neither_reaped_nor_killed_by_calls(root: Path) -> None:
    """I-4 concerns a call's processes only: a child the program started itself, one that
    ends during the calls and one still running after them, keep their exit statuses for the
    program's own ``waitpid``."""
    out = embed(
        root,
        """
        import subprocess
        quick = subprocess.Popen(["sh", "-c", "sleep 0.05; exit 7"])
        told, tell = os.pipe()
        slow = os.fork()
        if slow == 0:
            os.close(tell)
            os.read(told, 1)  # until the calls are over, however long they take
            os._exit(9)
        os.close(told)
        results = [summary(call(f"sleep 0.05; echo r{i}")) for i in range(6)]
        with ThreadPoolExecutor(3) as pool:
            results += [summary(r) for r in pool.map(lambda i: call("true"), range(3))]
        slow_alive = os.waitpid(slow, os.WNOHANG) == (0, 0)
        os.close(tell)
        done({"results": results, "quick": quick.wait(timeout=10), "slow_alive": slow_alive,
              "slow": os.waitstatus_to_exitcode(os.waitpid(slow, 0)[1])})
        """,
    )
    assert out["results"][:6] == [[True, f"r{i}\n", 0, None] for i in range(6)]
    assert (out["quick"], out["slow_alive"], out["slow"]) == (7, True, 9)


# ---------------------------------------------------------------------------------- signals


def test_signals_handled_by_the_caller_during_a_call_do_not_disturb_it(root: Path) -> None:
    """T-3: a stream of SIGUSR1 and SIGALRM, each handled by the program, arriving while a
    tool runs, neither cuts the call short nor changes its result or its record."""
    out = embed(
        root,
        """
        seen = []
        signal.signal(signal.SIGUSR1, lambda *_: seen.append("usr1"))
        signal.signal(signal.SIGALRM, lambda *_: seen.append("alrm"))
        signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)
        me = os.getpid()
        def pester():
            for _ in range(40):
                os.kill(me, signal.SIGUSR1)
                time.sleep(0.01)
        sender = threading.Thread(target=pester)
        sender.start()
        r = call("sleep 0.6; echo finished", "pestered")
        sender.join()
        signal.setitimer(signal.ITIMER_REAL, 0)
        done({"r": summary(r), "usr1": seen.count("usr1"), "alrm": seen.count("alrm")})
        """,
    )
    assert out["r"] == [True, "finished\n", 0, None]
    assert out["usr1"] > 0 and out["alrm"] > 0
    assert [e["type"] for e in session_events(root, "pestered")] == ["tool_call", "tool_result"]


def test_sigint_during_a_call_raises_keyboardinterrupt_after_recording_and_ending_it(
    root: Path,
) -> None:
    """T-7, I-4 (docs: an interrupt goes on once the call's ``tool_result`` is recorded): Ctrl-C
    while a tool runs reaches the program as KeyboardInterrupt; the session holds the call's
    ``tool_result`` with EINTR, and no process of the tool is left running."""
    out = embed(
        root,
        """
        me = os.getpid()
        threading.Timer(0.4, lambda: os.kill(me, signal.SIGINT)).start()
        try:
            call("sleep 7.1" + "23; echo never", "interrupted")
            outcome = "returned"
        except KeyboardInterrupt:
            outcome = "KeyboardInterrupt"
        deadline = time.monotonic() + 5
        def running():
            found = []
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or int(pid) == me:
                    continue
                try:
                    cmd = open(f"/proc/{pid}/cmdline", "rb").read()
                    state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue
                if b"7.123" in cmd and state != "Z":
                    found.append(pid)
            return found
        while running() and time.monotonic() < deadline:
            time.sleep(0.05)
        done({"outcome": outcome, "running": running()})
        """,
    )
    assert out == {"outcome": "KeyboardInterrupt", "running": []}
    events = session_events(root, "interrupted")
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    assert events[1]["status"] == "error" and events[1]["errno"] == "EINTR", events[1]


# ------------------------------------------------------------------------------------ forks


def test_a_process_forked_after_calls_runs_calls_of_its_own(root: Path) -> None:
    """T-3: a program that called tools, then forks a multiprocessing pool (start method
    fork) and plain ``os.fork`` children, gets the right results in every child and in itself
    afterwards; each child's calls are recorded once."""
    out = embed(
        root,
        """
        import multiprocessing
        first = summary(call("echo parent", "forked"))
        def job(i):
            r = call(f"echo child{i}", "forked")
            return summary(r) + [r.to_json()["call"]]
        with multiprocessing.get_context("fork").Pool(3) as pool:
            pooled = pool.map(job, range(6))
        statuses = []
        for i in range(3):
            pid = os.fork()
            if pid == 0:
                signal.alarm(15)
                r = call(f"echo raw{i}", "forked")
                os._exit(0 if summary(r) == [True, f"raw{i}\\n", 0, None] else 1)
            statuses.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        last = summary(call("echo parent-again", "forked"))
        done({"first": first, "pooled": pooled, "statuses": statuses, "last": last})
        """,
    )
    assert out["first"] == [True, "parent\n", 0, None]
    assert [p[:4] for p in out["pooled"]] == [[True, f"child{i}\n", 0, None] for i in range(6)]
    assert out["statuses"] == [0, 0, 0]
    assert out["last"] == [True, "parent-again\n", 0, None]
    events = session_events(root, "forked")
    assert len(events) == 2 * (1 + 6 + 3 + 1)
    assert_each_call_recorded_once(events, list({e["call"] for e in events}))


def test_a_child_forked_while_other_threads_are_calling_runs_its_own_call(own_root: Path) -> None:
    """T-3: a program whose threads call tools while it forks (a worker pool handing work to
    a forked helper) gets, in each child, its call's result within a few seconds; forks are
    tried until one child fails or twenty-five succeeded.  The agent's policy is a large one
    (docs/policy.md measures 10 000 rules), so that reading it takes the threads a while."""
    with open(own_root / "agent/ci.d/policy", "a") as policy:
        policy.writelines(f"allow ci_t session:kept-{n} read\n" for n in range(10_000))
    out = embed(
        own_root,
        """
        stop = threading.Event()
        def busy():
            while not stop.is_set():
                call("echo busy", "busy")
        threads = [threading.Thread(target=busy) for _ in range(4)]
        [t.start() for t in threads]
        time.sleep(0.2)
        statuses, told = [], []
        for i in range(25):
            time.sleep(0.003 * (i % 5))
            said, says = os.pipe()
            pid = os.fork()
            if pid == 0:
                signal.alarm(3)  # a child that has not finished its call by then is stuck
                r = call(f"echo c{i}", "forked-busy")
                got = summary(r) + [r.error and r.error.message]
                os.write(says, json.dumps(got).encode())  # what went wrong, if anything did
                os._exit(0 if got[:4] == [True, f"c{i}\\n", 0, None] else 1)
            os.close(says)
            status = os.waitpid(pid, 0)[1]
            statuses.append(os.waitstatus_to_exitcode(status))
            told.append(os.read(said, 1 << 16).decode())
            os.close(said)
            if status:
                break
        stop.set()
        [t.join() for t in threads]
        done([statuses, told[-1]])
        """,
        timeout=40,
    )
    statuses, last_child_said = out
    # -14: killed by its alarm, stuck; else the last child's summary says what it got
    assert all(status == 0 for status in statuses), (statuses, last_child_said)


# -------------------------------------------------------------- dispositions a caller sets


def test_a_caller_that_ignores_sigchld_still_gets_the_tools_exit_status(root: Path) -> None:
    """W-1: a program that ignores SIGCHLD (so that its own children are reaped for it) is
    told a tool's non-zero exit status as any other program is, and the session records it."""
    out = embed(
        root,
        """
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)
        r = call("echo out; exit 3", "no-sigchld")
        done({"r": summary(r), "kept": signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN})
        """,
    )
    assert out["kept"]
    assert out["r"] == [False, "out\n", 3, [0, "exit"]], out
    result = session_events(root, "no-sigchld")[-1]
    assert (result["status"], result["exit_status"]) == ("error", 3), result


def test_a_caller_with_sigpipe_at_its_default_survives_a_tool_that_reads_no_input(
    root: Path,
) -> None:
    """S-2: many programs put SIGPIPE back to its default; such a program calling a tool
    that exits without reading its (large) input gets the call's result, and the session the
    call's ``tool_result``, as a program that ignores SIGPIPE does."""
    for disposition in ("SIG_IGN", "SIG_DFL"):
        out = embed(
            root,
            f"""
            signal.signal(signal.SIGPIPE, signal.{disposition})
            r = run_native(root, "ci", "quiet", {{"pad": "x" * 4_000_000}},
                           session="pipe-{disposition}", timeout=30)
            done(summary(r))
            """,
        )
        assert out == [True, "", 0, None], (disposition, out)
        events = session_events(root, f"pipe-{disposition}")
        assert [e["type"] for e in events] == ["tool_call", "tool_result"], disposition


def test_run_terminal_from_a_pool_thread_runs_the_call_as_the_main_thread_does(
    root: Path,
) -> None:
    """T-3, W-4: ``run_terminal`` called from a ``ThreadPoolExecutor`` thread gives the result
    the main thread gets: the tool's exit status, and a tool that overruns its timeout killed
    (its later side effect never happens), with no unreaped child left behind."""
    outbox = new_scratch_dir(SCRATCH, "outbox")
    outbox.chmod(0o1777)
    late = outbox / "late"
    out = embed(
        root,
        f"""
        def terminal(cmd, timeout=30):
            argv = [json.dumps({{"cmd": cmd}})]
            return run_terminal(root, "ci", "shell.exec", argv, session="pooled", timeout=timeout)
        main = summary(terminal("exit 4"))
        with ThreadPoolExecutor(1) as pool:
            pooled = summary(pool.submit(terminal, "exit 4").result())
            overran = summary(pool.submit(terminal, "sleep 1.5; touch {late}", 0.5).result())
            time.sleep(2)
            zombies = [c for c in children() if c[1] == "Z"]
        done({{"main": main, "pooled": pooled, "overran": overran, "zombies": zombies,
               "late": os.path.exists("{late}")}})
        """,
    )
    shutil.rmtree(outbox)
    assert out["main"][:3] == [False, None, 4], out
    assert out["pooled"] == out["main"], out
    assert out["overran"][0] is False and out["overran"][3][0] == errno.ETIMEDOUT, out
    assert not out["late"] and out["zombies"] == [], out
