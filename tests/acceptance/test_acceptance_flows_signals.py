"""End-to-end flows of an operator signalling long-running CortexFS processes (SPEC W-2, W-4,
Q-1, Q-5, S-2, S-5, F-1; docs/workers.md "Signals", docs/tools.md, docs/sessions.md,
docs/queue.md, docs/mount.md): ``ctx queue work`` idle and mid-job (a second and third signal
during its shutdown included), with ``ctx session tail --follow`` watching its session;
``ctx run`` in terminal and native mode stopped while a tool and its background child run;
``ctx queue publish`` reading a slow stdin; and ``ctx mount`` hit by several signals while a
program works in it.  Each case checks the documented exit status, that nothing prints a
traceback, that no process is left behind and that the queue has nothing to repair."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    alive,
    clean_env,
    ctx_run,
    mounted_at,
    needs_fuse_as_root,
    serving,
    wait_for,
)
from tests.acceptance.terminalcli import Raw
from tests.acceptance.workercli import AGENT, shell_job, start_worker
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid (nobody)")


# ------------------------------------------------------------------------------ helpers


def dfl_sigint() -> None:
    """SIGINT's default disposition, as a shell gives the command it runs in the foreground
    (a background job of a non-interactive shell would inherit it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def descendants(pid: int) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    return []


def none_alive(pids: list[int], seconds: float = 10) -> bool:
    return wait_for(lambda: not any(alive(p) for p in pids), seconds)


def session_events(storage: Path, session: str) -> list[dict]:
    r = ctx_run(
        "session", "show", AGENT, session, "--json", env=clean_env(CTX_STORAGE=str(storage))
    )
    assert r.rc == 0, r
    return [json.loads(line) for line in r.lines()]


def assert_nothing_to_repair(queue: QueueCLI) -> dict:
    """``ctx queue status`` and ``ctx queue recover --dry-run`` agree there is nothing to do."""
    status = queue.run("status", "--json")
    assert status.rc == 0, status
    facts = status.json()
    assert facts["claimed"] == 0 and facts["conflict"] == 0, facts
    assert facts["incomplete"] == [] and facts["temps"] == [], facts
    dry = queue.run("recover", "--dry-run", "--json")
    assert dry.rc == 0, dry
    assert "queue consistent" in queue.run("recover", "--dry-run").out
    assert queue.entries("lease") == set() and queue.entries("claimed") == set()
    assert queue.entries("inbox") == set()
    return facts


def killed_by(returncode: int, signum: int) -> bool:
    """What a shell reports as 128 + N: the process died of signal N, or exited 128 + N."""
    return returncode in (-signum, 128 + signum)


@contextlib.contextmanager
def started(argv: list[str], **kw) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(argv, preexec_fn=dfl_sigint, **kw)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def follower(storage: Path, session: str) -> subprocess.Popen:
    argv = [*CTX_ARGV, "session", "tail", AGENT, session, "--follow", "--json", "-n", "100"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(CTX_STORAGE=str(storage)),
                            preexec_fn=dfl_sigint)  # fmt: skip


def background_tool(outbox: Path, tag: str, seconds: int = 300) -> str:
    """A shell command that starts a background child (its pid in ``bg-TAG``) and waits."""
    return f"sleep {seconds} & echo $! > {outbox}/bg-{tag}; touch {outbox}/up-{tag}; wait"


# ------------------------------------------------------------------------------ the worker


@needs_root
def test_a_worker_told_to_stop_three_times_still_finishes_its_job_once(queue, agent, outbox):
    """W-4, S-5, Q-5, S-2: SIGTERM to a busy ``ctx queue work``, then SIGTERM again and SIGHUP
    while it waits for its job (an impatient operator, a closing ssh session): the running
    job still finishes in ``done/`` exactly once, nothing more is claimed, the worker exits 0
    with a ``stop`` naming the first signal; its session holds claim, start, call, result and
    finish; ``tail --follow`` on that session sees the finish and ends with 0 on ^C; no tool,
    guard or child process is left; status and ``recover --dry-run`` find nothing to do."""
    running = queue.publish(
        shell_job(f"echo run >> {outbox}/runs; touch {outbox}/started; sleep 2; echo finished"),
        name="a-running",
    )
    later = queue.publish(shell_job(f"touch {outbox}/later"), name="b-later")
    worker = start_worker(queue, "--json", "--session", "sig")
    watch = None
    try:
        assert wait_for(lambda: (outbox / "started").exists(), 20), worker.poll()
        watch = follower(queue.storage, "sig")  # the session exists once the job runs
        family = descendants(worker.pid)
        assert len(family) >= 2, family  # the tool's shell (and sleep) and the orphan guard
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        worker.send_signal(signal.SIGHUP)
        assert worker.poll() is None  # still finishing its job
        out, err = worker.communicate(timeout=30)
        assert worker.returncode == 0, err
        assert "Traceback" not in err, err
        events = [json.loads(line) for line in out.splitlines()]
        stop = events[-1]
        assert stop["event"] == "stop" and stop["stopped_by"] == "SIGTERM", stop
        assert (stop["done"], stop["failed"], stop["aborted"]) == (1, 0, False), stop
        assert [e["job"] for e in events if e["event"] == "claim"] == [running], events
        assert queue.state(running) == "done" and queue.state(later) == "pending"
        assert (outbox / "runs").read_text() == "run\n" and not (outbox / "later").exists()
        assert none_alive(family), [p for p in family if alive(p)]

        kinds = [e["type"] for e in session_events(queue.storage, "sig")]
        assert kinds == ["queue.claim", "queue.start", "tool_call", "tool_result", "queue.finish"]
        seen: list[dict] = []
        while len(seen) < 5:
            line = watch.stdout.readline()
            assert line, (seen, watch.poll())
            seen.append(json.loads(line))
        assert seen[-1]["type"] == "queue.finish" and seen[-1]["state"] == "done", seen
        watch.send_signal(signal.SIGINT)  # docs/sessions.md: ^C ends --follow with 0
        tail_err = watch.communicate(timeout=10)[1]
        assert watch.returncode == 0 and "Traceback" not in tail_err, tail_err
    finally:
        for proc in (worker, watch):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert_nothing_to_repair(queue)


@needs_root
@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGINT, signal.SIGTERM])
def test_an_idle_worker_stops_at_once_and_leaves_no_guard(queue, agent, signum):
    """W-2, W-4 (docs/workers.md "Signals"): a worker waiting for work on ``pending/`` and
    sent SIGHUP (its terminal closed), a first ^C or SIGTERM exits 0 within a moment with a
    ``stop`` event naming the signal and nothing done; it claimed nothing and its session
    records no transition; its orphan guard is gone; a job published afterwards is pending."""
    with started([*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT,
                  "--json", "--session", "idle"],
                 env=clean_env(CTX_STORAGE=str(queue.storage)), stdin=subprocess.DEVNULL,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:  # fmt: skip
        first = json.loads(proc.stdout.readline())
        assert first["event"] == "start" and first["wait"] == "inotify", first
        time.sleep(0.5)  # waiting on pending/
        family = descendants(proc.pid)
        began = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=15)
        took = time.monotonic() - began
    assert proc.returncode == 0, err
    assert took < 5, took  # the wait is bounded (2 s) and a signal ends it
    assert "Traceback" not in err, err
    events = [json.loads(line) for line in out.splitlines()]
    stop = events[-1]
    assert stop["event"] == "stop" and stop["stopped_by"] == signum.name, events
    assert (stop["done"], stop["failed"], stop["lost"]) == (0, 0, 0), stop
    assert not [e for e in events if e["event"] == "claim"], events
    assert none_alive(family), [p for p in family if alive(p)]
    home = queue.storage / "home"
    sessions = list(home.glob(f"*/agent/{AGENT}/session/idle/events.jsonl"))
    recorded = [json.loads(x) for s in sessions for x in s.read_text().splitlines()]
    assert not [e for e in recorded if e["type"].startswith("queue.")], recorded
    job = queue.publish(shell_job("true"))
    assert queue.state(job) == "pending"
    assert_nothing_to_repair(queue)


# ------------------------------------------------------------------------------ ctx run


@needs_root
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_ctx_run_in_terminal_mode_passes_a_signal_to_the_tools_group(queue, agent, outbox, signum):
    """T-3, S-2, S-5 (docs/tools.md "Process group and bounds", result ``exit_status``
    "128 + N after signal N"): ``ctx run --agent`` in terminal mode stopped while its tool
    waits on a background child: the signal reaches the tool's process group, ``ctx run``
    exits with the tool's status 128 + N, no process of the call is left, and the session
    holds the call and its ``tool_result`` (error, exit status 128 + N, EINTR at stage
    ``run``: the call was ended by its caller's signal, as ``ctx run --help`` says)."""
    session = f"term-{signum.name.lower()}"
    cmd = background_tool(outbox, "t")
    argv = [*CTX_ARGV, "run", "--agent", AGENT, "--session", session, "shell.exec"]
    with started([*argv, json.dumps({"cmd": cmd})], env=clean_env(CTX_STORAGE=str(queue.storage)),
                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True) as proc:  # fmt: skip
        assert wait_for(lambda: (outbox / "up-t").exists(), 20), proc.poll()
        family = descendants(proc.pid)
        bg = int((outbox / "bg-t").read_text())
        proc.send_signal(signum)
        err = proc.communicate(timeout=20)[1]
    assert proc.returncode == 128 + signum, (proc.returncode, err)
    assert "Traceback" not in err, err
    assert none_alive([bg, *family]), [p for p in [bg, *family] if alive(p)]
    events = session_events(queue.storage, session)
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    call, result = events
    assert call["call"] == result["call"] and call["mode"] == "terminal", events
    assert result["status"] == "error" and result["exit_status"] == 128 + signum, result
    assert (result["errno"], result["stage"]) == ("EINTR", "run"), result
    assert f"ctx: EINTR: interrupted: its caller got {signum.name}" in err, err


@needs_root
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_ctx_run_native_stopped_records_eintr_and_leaves_nothing_running(
    queue, agent, outbox, signum
):
    """S-2, S-5, T-3 (docs/sessions.md: "even an interrupt of the caller (EINTR, recorded
    before the interrupt goes on — … for ``ctx run`` SIGTERM or SIGHUP too"): a native call
    stopped by SIGTERM (``timeout``, a service manager) or SIGHUP (a closed terminal) ends
    with a ``result`` frame of EINTR at stage ``run``, ``ctx: EINTR`` on stderr and exit
    128 + N; the call's ``tool_result`` says the same; the tool and its child are gone."""
    session = f"native-{signum.name.lower()}"
    argv = [*CTX_ARGV, "run", "--agent", AGENT, "--session", session, "--native", "shell.exec"]
    with started(argv, env=clean_env(CTX_STORAGE=str(queue.storage)), stdin=subprocess.PIPE,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:  # fmt: skip
        proc.stdin.write(json.dumps({"cmd": background_tool(outbox, "n")}))
        proc.stdin.close()
        proc.stdin = None
        assert wait_for(lambda: (outbox / "up-n").exists(), 20), proc.poll()
        family = descendants(proc.pid)
        bg = int((outbox / "bg-n").read_text())
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 128 + signum, (proc.returncode, err)
    assert "Traceback" not in err, err
    assert err.startswith("ctx: EINTR: ") and signum.name in err, err
    frames = [json.loads(line) for line in out.splitlines()]
    assert [f["type"] for f in frames] == ["call", "result"], frames
    result = frames[-1]
    assert result["status"] == "error", result
    assert (result["error"]["error"], result["error"]["stage"]) == ("EINTR", "run"), result
    assert none_alive([bg, *family]), [p for p in [bg, *family] if alive(p)]
    events = session_events(queue.storage, session)
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    recorded = events[1]
    assert recorded["call"] == result["call"], (recorded, result)
    assert (recorded["errno"], recorded["stage"]) == ("EINTR", "run"), recorded


@needs_root
def test_ctx_run_native_stopped_reports_the_killed_tools_exit_status(queue, agent, outbox):
    """T-3, S-2 (docs/tools.md, the result's ``exit_status``: "the tool's exit status (128 + N
    after signal N); null when it never ran, or was killed before it was given its input"):
    a tool that read its input and was then killed because ``ctx run`` got SIGTERM has an
    exit status, as the worker's second ^C records 137 for the tools it kills."""
    argv = [*CTX_ARGV, "run", "--agent", AGENT, "--session", "status", "--native", "shell.exec"]
    with started(argv, env=clean_env(CTX_STORAGE=str(queue.storage)), stdin=subprocess.PIPE,
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:  # fmt: skip
        proc.stdin.write(json.dumps({"cmd": background_tool(outbox, "x")}))
        proc.stdin.close()
        proc.stdin = None
        assert wait_for(lambda: (outbox / "up-x").exists(), 20), proc.poll()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    result = json.loads(out.splitlines()[-1])
    assert isinstance(result["exit_status"], int) and result["exit_status"] > 128, result
    recorded = session_events(queue.storage, "status")[-1]
    assert recorded["exit_status"] == result["exit_status"], recorded


# ------------------------------------------------------------------------------ terminal

needs_sandbox = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)


@needs_sandbox
def test_a_terminal_hung_up_and_told_again_ends_its_tool_call_and_cleans_up(storage, agent, outbox):
    """A-1, A-2, S-2, H-1 (docs/tools.md: "on ``ctx agent stop`` (SIGTERM) or a hangup
    (SIGHUP), ctxterm first ends the tool calls still running … records ``terminal.stopped``,
    then closes its clients, unmounts the view and removes its sockets"): SIGHUP to a
    terminal whose attached operator runs a tool with a background child, then SIGTERM and
    SIGHUP again while it ends: the call gets its ``tool_result``, ``terminal.stopped`` is
    recorded once, the client is let go, no process of the terminal or the call is left, the
    view is unmounted and the sockets are gone, so ``ctx agent stop`` finds nothing to stop."""
    env = clean_env(CTX_STORAGE=str(storage))
    begun = ctx_run("agent", "start", AGENT, "--session", "hup", "--no-workspace", "--json",
                    env=env)  # fmt: skip
    assert begun.rc == 0, begun
    try:
        listening = Path(begun.json()["listening_at"])
        link = Path(begun.json()["socket"])
        pid = int((listening.parent / "pid").read_text())
        client = Raw(listening, b"attach\n")
        try:
            assert client.shows(f"{AGENT}$ "), client.text()
            cmd = json.dumps({"cmd": background_tool(outbox, "term")})
            client.type(f"shell.exec '{cmd}'")
            assert wait_for(lambda: (outbox / "up-term").exists(), 20), client.text()
            bg = int((outbox / "bg-term").read_text())
            family = descendants(pid)
            os.kill(pid, signal.SIGHUP)
            time.sleep(0.3)  # it is ending the running call
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                time.sleep(0.1)
                os.kill(pid, signal.SIGHUP)
            assert client.eof.wait(20), client.text()
        finally:
            client.close()
        assert none_alive([pid, bg, *family], 15), [p for p in [pid, bg, *family] if alive(p)]
        assert not os.path.lexists(listening) and not os.path.lexists(link)
        mounts = Path("/proc/self/mounts").read_text()
        assert str(listening.parent) not in mounts
        log = storage / "agent" / f"{AGENT}.d" / "log"
        lifecycle = [json.loads(x) for x in log.read_text().splitlines()]
        ends = [e for e in lifecycle if e["type"] == "terminal.stopped" and e["session"] == "hup"]
        assert len(ends) == 1 and ends[0]["reason"] == "stop", lifecycle
        events = session_events(storage, "hup")
        calls = [e for e in events if e["object"] == "tool/shell.exec"]
        assert [e["type"] for e in calls] == ["tool_call", "tool_result"], events
        assert calls[0]["call"] == calls[1]["call"] and calls[1]["status"] == "error", calls
    finally:
        stopped = ctx_run("agent", "stop", AGENT, "--session", "hup", env=env)
    assert stopped.rc == 1 and "ENOENT" in stopped.err, stopped


# ------------------------------------------------------------------------------ publish


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_publish_stopped_while_its_slow_stdin_trickles_in_publishes_nothing(queue, signum):
    """Q-1, I-2, Q-6: ``ctx queue publish -`` (and ``--batch -``) reading a request that is
    still arriving (a slow pipe, a person typing) and stopped by SIGTERM or SIGHUP ends as a
    shell reports that signal (128 + N), quietly: nothing reaches ``pending/``, no temp file is
    left in ``inbox/``, ``status`` and ``recover --dry-run`` find nothing, and the same names
    publish normally afterwards."""
    env = clean_env(CTX_STORAGE=str(queue.storage))
    base = [*CTX_ARGV, "queue", "publish", "--project", queue.project]
    head = b'{"tool": "shell.exec", "input": {"cmd": '
    cases = [
        ([*base, "--name", "slow", "-"], head),
        ([*base, "--batch", "-"], b'{"tool": "shell.exec", "input": {"cmd": "true"}}\n' + head),
    ]
    for argv, partial in cases:
        with started(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE) as proc:  # fmt: skip
            proc.stdin.write(partial)
            proc.stdin.flush()
            time.sleep(0.8)  # it is reading, waiting for the rest
            assert proc.poll() is None
            proc.send_signal(signum)
            out, err = proc.communicate(timeout=15)
        assert killed_by(proc.returncode, signum), (argv, proc.returncode, err)
        assert out == b"" and b"Traceback" not in err, (out, err)
        assert queue.entries("pending") == set(), argv
    assert_nothing_to_repair(queue)
    whole = json.dumps(shell_job("true"))
    again = ctx_run(*base[1:], "--name", "slow", "-", input=whole, env=env)
    assert again.rc == 0 and again.out.strip() == "slow.req.json", again
    batch = ctx_run(*base[1:], "--batch", "-", input=whole + "\n" + whole + "\n", env=env)
    assert batch.rc == 0 and len(batch.lines()) == 2, batch
    assert len(queue.entries("pending")) == 3


# ------------------------------------------------------------------------------ mount


def hammer(mount, first: signal.Signals, then: signal.Signals, seconds: float = 0.1) -> None:
    """``first``, then ``then`` again and again (every half millisecond) while ``ctx mount``
    shuts down: an operator pressing ^C after a ``kill``, a service manager's SIGTERM after a
    closing terminal's SIGHUP."""
    mount.proc.send_signal(first)
    end = time.monotonic() + seconds
    while time.monotonic() < end and mount.proc.poll() is None:
        mount.proc.send_signal(then)
        time.sleep(0.0005)


@needs_fuse_as_root
@pytest.mark.parametrize(
    ("first", "then"),
    [
        (signal.SIGTERM, signal.SIGINT),
        (signal.SIGHUP, signal.SIGTERM),
        (signal.SIGINT, signal.SIGINT),
    ],
    ids=["term-then-int", "hup-then-term", "int-then-int"],
)
def test_a_busy_mount_signalled_again_during_its_shutdown_still_unmounts_and_exits_0(
    storage, tmp_path, first, then
):
    """F-1 (docs/mount.md: "until SIGTERM, SIGINT or SIGHUP …; either way it unmounts cleanly
    and exits 0", a mount still in use lazily): more stop signals arriving while ``ctx mount``
    unmounts a view a program still works in change nothing of that: exit 0, no traceback,
    nothing left in the mount table or running, never a dead mount failing every access
    with ENOTCONN; the program's working directory is cut off; the directory mounts again."""
    where = tmp_path / "ctx"
    where.mkdir()
    with serving(storage, where) as mount:
        # A program working in the mount: its working directory and an open file are there.
        holder = subprocess.Popen(["sh", "-c", "exec sleep 60 < bin/tsh"], cwd=where)
        try:
            time.sleep(0.2)
            family = descendants(mount.proc.pid)
            hammer(mount, first, then)
            status = mount.proc.wait(timeout=15)
            left = mounted_at(where)
            assert (status, left) == (0, False), mount.said()
            assert "Traceback" not in mount.said(), mount.said()
            assert none_alive(family)
            with pytest.raises(OSError) as gone:
                os.listdir(f"/proc/{holder.pid}/cwd")
            assert gone.value.errno in (107, 2), gone.value  # ENOTCONN, or detached
        finally:
            holder.kill()
            holder.wait()
    with serving(storage, where) as again:
        assert sorted(os.listdir(where)) == ["agent", "bin", "home", "model", "shared", "tool"]
        again.proc.send_signal(signal.SIGTERM)
        assert again.proc.wait(timeout=15) == 0, again.said()
    assert not mounted_at(where)
