"""Flows of ``ctx queue work`` running jobs whose tools start descendants that misbehave
(SPEC W-1, W-4, section 3, T-3; docs/workers.md "One job" and "Signals", docs/tools.md
"Process group and bounds"):

* a job that runs past its timeout with children that ignore SIGTERM and SIGHUP (``nohup``,
  a double fork, a subshell) fails with ``ETIMEDOUT`` at stage ``run``, keeps what it wrote,
  and leaves no process of its group; one that left the group with ``setsid`` is documented
  as not killed, and runs as the agent's uid, never root's;
* a tool that exits while a child of its group ignores SIGTERM, or while a ``setsid``
  descendant keeps its stdout and stderr open, is finished at once with its own outcome;
* SIGTERM to the worker while such a job runs: the job finishes (or times out) once, the
  worker exits 0, later jobs stay pending, nothing is left claimed;
* SIGKILL to the worker: the orphan guard kills the job's group, ``recover`` requeues the
  job and a second worker runs it to the end.

Every process a tool starts writes its pid in the outbox; each test kills what is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, QueueCLI, alive, clean_env, wait_for
from tests.acceptance.workercli import AGENT, result_of, shell_job, start_worker
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid (nobody)")
pytestmark = needs_root

TRACEBACK = "Traceback (most recent call last)"


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def box(outbox: Path) -> Iterator[Path]:
    """The outbox; every pid written in ``*.pid`` there is SIGKILLed at the end."""
    try:
        yield outbox
    finally:
        for pidfile in outbox.glob("*.pid"):
            with contextlib.suppress(ValueError, ProcessLookupError, OSError):
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)


def pid_of(box: Path, name: str) -> int:
    assert wait_for(lambda: (box / f"{name}.pid").is_file()
                    and (box / f"{name}.pid").read_text().strip(), 20), name  # fmt: skip
    return int((box / f"{name}.pid").read_text().split()[0])


def gone(pid: int, seconds: float = 10) -> bool:
    return wait_for(lambda: not alive(pid), seconds)


def pgid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[2])


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(pid)


def drain(queue: QueueCLI, *args: str) -> tuple[int, list[dict], str]:
    proc = subprocess.run(
        [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT, "--json",
         "--drain", *args],
        env=clean_env(CTX_STORAGE=str(queue.storage)), capture_output=True, text=True,
        timeout=90,
    )  # fmt: skip
    assert TRACEBACK not in proc.stderr, proc.stderr
    return proc.returncode, [json.loads(x) for x in proc.stdout.splitlines()], proc.stderr


@contextlib.contextmanager
def worker(queue: QueueCLI, *args: str) -> Iterator[subprocess.Popen]:
    proc = start_worker(queue, "--json", *args)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def nothing_claimed(queue: QueueCLI) -> None:
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()
    assert "queue consistent" in queue.run("recover", "--dry-run").out


# A group child that ignores SIGTERM and SIGHUP (nohup), a double-forked grandchild and a
# subshell child, all of the tool's process group; the tool writes, then waits for ever.
STUBBORN = (
    "trap '' TERM HUP; "
    "nohup sh -c 'trap \"\" TERM HUP; echo $$ > {b}/nohup.pid; exec sleep 300' "
    ">/dev/null 2>&1 & "
    "(sh -c 'echo $$ > {b}/double.pid; exec sleep 300' &) ; "
    "sh -c 'trap \"\" TERM HUP; echo $$ > {b}/top.pid; exec sleep 300' & "
    "echo $$ >> {b}/runs; printf partial; wait"
)
NAMES = ("nohup", "double", "top")


# ------------------------------------------------------------------------------ timeouts


def test_a_timeout_kills_children_that_ignore_sigterm_and_keeps_the_partial_output(
    queue, agent, box
):
    """W-4, T-3: the job runs past ``--timeout 2`` with descendants that ignore SIGTERM and
    SIGHUP: it is failed with ``ETIMEDOUT`` at stage ``run``, its output so far kept, its
    reason saying the group was killed; every process of its group is gone; the next job
    runs, once."""
    slow = queue.publish(shell_job(STUBBORN.format(b=box)), name="a-slow")
    next_job = queue.publish(shell_job(f"echo next >> {box}/runs-next"), name="b-next")
    rc, events, err = drain(queue, "--timeout", "2")
    assert rc == 0, (events, err)
    pids = [pid_of(box, n) for n in NAMES]
    res = result_of(queue, slow)
    assert queue.state(slow) == "failed", res
    assert res["error"]["error"] == "ETIMEDOUT" and res["error"]["stage"] == "run", res
    assert res["reason"].startswith("ETIMEDOUT"), res
    assert "process group" in res["reason"], res
    assert res["output"] == "partial", res
    for pid in pids:
        assert gone(pid), (pid, Path(f"/proc/{pid}/cmdline").read_bytes())
    assert queue.state(next_job) == "done"
    assert len((box / "runs").read_text().splitlines()) == 1
    assert (box / "runs-next").read_text() == "next\n"
    nothing_claimed(queue)


def test_a_timeout_leaves_a_setsid_daemon_running_as_the_agent_not_as_root(queue, agent, box):
    """W-4 kills the call's process group; docs/tools.md: a process that left it with
    ``setsid`` is no longer in it and is not killed.  The job still fails at its timeout,
    and the daemon left behind runs as the agent's uid in a group of its own."""
    cmd = (f"setsid sh -c 'trap \"\" TERM HUP; echo $$ > {box}/daemon.pid; exec sleep 300' "
           f"</dev/null >/dev/null 2>&1 & echo $$ > {box}/tool.pid; exec sleep 300")  # fmt: skip
    job = queue.publish(shell_job(cmd), name="daemon")
    rc, events, err = drain(queue, "--timeout", "2")
    assert rc == 0, (events, err)
    res = result_of(queue, job)
    assert res["error"]["error"] == "ETIMEDOUT", res
    tool, daemon = pid_of(box, "tool"), pid_of(box, "daemon")
    assert gone(tool)
    assert alive(daemon), "a process that left the group is documented as left running"
    assert pgid(daemon) == daemon and uid_of(daemon) != 0
    nothing_claimed(queue)


def test_an_installed_tool_past_its_timeout_reports_the_kill(queue, agent, box, tmp_path):
    """W-1, T-3 (docs/tools.md "Process group and bounds"; docs/workers.md "One job"): an
    installed tool that ignores SIGTERM and never ends is SIGKILLed with its group: the
    job's result says ``ETIMEDOUT`` at stage ``run``, an exit status of a killed process
    (137) or none, and the worker's ``finish`` event names the failure."""
    from tests.acceptance.ctxcli import ctx_run, tool_manifest
    from tests.acceptance.workercli import allow_in_tool_policy, make_agent

    program = ("#!/bin/sh\ncat >/dev/null\ntrap '' TERM HUP INT\n"
               f"sh -c 'trap \"\" TERM; echo $$ > {box}/kid.pid; exec sleep 300' &\n"
               "echo '{\"progress\": 1}'\nwhile :; do sleep 1; done\n")  # fmt: skip
    manifest = tool_manifest(tmp_path / "src", "stubborn.wait", program)
    r = ctx_run("object", "install", "--source", queue.storage, manifest, "--tier", "system")
    assert r.rc == 0, r
    make_agent(queue.storage, ["shell.exec", "stubborn.wait"], name="ci2")
    allow_in_tool_policy(queue.storage, "stubborn.wait", label="ci2_t")
    job = queue.publish({"tool": "stubborn.wait", "input": {}}, name="stubborn")
    proc = subprocess.run(
        [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", "ci2", "--json", "--drain",
         "--timeout", "2"],
        env=clean_env(CTX_STORAGE=str(queue.storage)), capture_output=True, text=True,
        timeout=90,
    )  # fmt: skip
    assert proc.returncode == 0 and TRACEBACK not in proc.stderr, proc.stderr
    finishes = [json.loads(x) for x in proc.stdout.splitlines()]
    finishes = [e for e in finishes if e["event"] == "finish"]
    assert [e["job"] for e in finishes] == [job], finishes
    res = result_of(queue, job)
    assert res["error"]["error"] == "ETIMEDOUT" and res["error"]["stage"] == "run", res
    assert res["exit_status"] in (137, None), res
    assert res["output"] == {"progress": 1}, res
    assert gone(pid_of(box, "kid"))


# ------------------------------------------------------------------------------ exits


def test_a_tool_that_exits_while_a_group_child_ignores_sigterm_is_done_and_the_child_killed(
    queue, agent, box
):
    """docs/tools.md: "when the tool exits, whatever it left running in its group is killed
    after a one-second grace": a child that ignores SIGTERM and SIGHUP and does not hold the
    pipes does not hold the job, which is done with the tool's output; the child is gone."""
    cmd = (f"nohup sh -c 'trap \"\" TERM HUP; echo $$ > {box}/left.pid; exec sleep 300' "
           f"</dev/null >/dev/null 2>&1 & "
           f"while [ ! -s {box}/left.pid ]; do sleep 0.05; done; echo finished")  # fmt: skip
    job = queue.publish(shell_job(cmd), name="left")
    rc, events, err = drain(queue, "--timeout", "60")
    assert rc == 0, (events, err)
    res = result_of(queue, job)
    assert queue.state(job) == "done" and res["exit_status"] == 0, res
    assert res["output"] == "finished\n", res
    assert gone(pid_of(box, "left"))


def test_a_group_child_off_the_pipes_gets_the_one_second_grace(queue, agent, box):
    """docs/tools.md "Process group and bounds": "when the tool exits, whatever it left
    running in its group is killed after a one-second grace".  A child with its stdio on
    ``/dev/null`` that needs 0.3 s to write its last file gets to write it."""
    cmd = (f"sh -c 'sleep 0.3; echo written > {box}/late.txt' </dev/null >/dev/null 2>&1 & "
           f"echo $! > {box}/late.pid; exit 0")  # fmt: skip
    job = queue.publish(shell_job(cmd), name="late")
    rc, events, err = drain(queue, "--timeout", "60")
    assert rc == 0, (events, err)
    assert queue.state(job) == "done"
    assert gone(pid_of(box, "late"))
    assert (box / "late.txt").exists(), "the child was killed within its grace"


def test_a_setsid_descendant_holding_stdout_and_stderr_does_not_hold_the_job(queue, agent, box):
    """docs/tools.md: a process that left the group "is not waited for": a tool that exits
    while a ``setsid`` grandchild (SIGHUP ignored) keeps its stdout and stderr open is
    finished with its own exit, output and stderr long before the job's timeout."""
    cmd = (f"setsid sh -c 'trap \"\" TERM HUP; echo $$ > {box}/holder.pid; exec sleep 300' & "
           f"echo out; echo err >&2; exit 3")  # fmt: skip
    job = queue.publish(shell_job(cmd), name="holder")
    with worker(queue, "--timeout", "120") as proc:
        holder = pid_of(box, "holder")
        assert wait_for(lambda: queue.state(job) in ("done", "failed"), 30), queue.state(job)
        assert alive(holder)  # it was not waited for: the job ended while it still runs
        res = result_of(queue, job)
        assert queue.state(job) == "failed" and res["exit_status"] == 3, res
        assert res["error"]["stage"] == "exit", res
        assert res["output"] == "out\n" and "err" in res["stderr"], res
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0 and TRACEBACK not in err, err
    nothing_claimed(queue)


# ------------------------------------------------------------------------------ signals


def test_sigterm_to_the_worker_lets_a_job_with_stubborn_children_finish_once(queue, agent, box):
    """W-4, docs/workers.md "Signals": SIGTERM while a job runs whose group holds children
    that ignore SIGTERM: the worker stops claiming, the job ends on its own (done, once),
    the children are killed after it, the worker exits 0 and the next job stays pending."""
    cmd = (
        f"nohup sh -c 'trap \"\" TERM HUP; echo $$ > {box}/kid.pid; exec sleep 300' "
        f">/dev/null 2>&1 & echo $$ >> {box}/runs; touch {box}/up; sleep 1.5; echo ok"
    )
    job = queue.publish(shell_job(cmd), name="a-job")
    later = queue.publish(shell_job(f"touch {box}/later"), name="b-later")
    with worker(queue, "--timeout", "60") as proc:
        assert wait_for(lambda: (box / "up").exists(), 20), proc.poll()
        kid = pid_of(box, "kid")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and TRACEBACK not in err, err
    events = [json.loads(x) for x in out.splitlines()]
    assert events[-1]["event"] == "stop" and events[-1]["stopped_by"] == "SIGTERM", events
    assert queue.state(job) == "done" and result_of(queue, job)["output"] == "ok\n"
    assert queue.state(later) == "pending" and not (box / "later").exists()
    assert len((box / "runs").read_text().splitlines()) == 1
    assert gone(kid)
    nothing_claimed(queue)


def test_sigterm_to_the_worker_while_its_job_runs_past_the_timeout(queue, agent, box):
    """W-4: after SIGTERM the running job still ends at its timeout (``ETIMEDOUT``, its
    group killed); the worker then exits 0 with the job in ``failed/``, none claimed, the
    next job pending."""
    job = queue.publish(shell_job(STUBBORN.format(b=box)), name="a-slow")
    later = queue.publish(shell_job(f"touch {box}/later"), name="b-later")
    with worker(queue, "--timeout", "3") as proc:
        pids = [pid_of(box, n) for n in NAMES]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and TRACEBACK not in err, err
    events = [json.loads(x) for x in out.splitlines()]
    stop = events[-1]
    assert stop["event"] == "stop" and (stop["done"], stop["failed"]) == (0, 1), stop
    res = result_of(queue, job)
    assert res["error"]["error"] == "ETIMEDOUT", res
    assert queue.state(later) == "pending"
    for pid in pids:
        assert gone(pid), pid
    nothing_claimed(queue)


def test_sigterm_twice_then_sighup_while_a_tool_ignoring_them_times_out(queue, agent, box):
    """W-4: repeated SIGTERM and SIGHUP (first-signal rules: no abort) do not cut the job:
    it times out once, its group killed, and the worker exits 0."""
    job = queue.publish(shell_job(STUBBORN.format(b=box)), name="slow")
    with worker(queue, "--timeout", "3") as proc:
        pids = [pid_of(box, n) for n in NAMES]
        for signum in (signal.SIGTERM, signal.SIGTERM, signal.SIGHUP):
            proc.send_signal(signum)
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0 and TRACEBACK not in err, err
    assert queue.state(job) == "failed"
    assert result_of(queue, job)["error"]["error"] == "ETIMEDOUT"
    assert len((box / "runs").read_text().splitlines()) == 1
    for pid in pids:
        assert gone(pid), pid
    nothing_claimed(queue)


def test_sigkill_to_the_worker_kills_the_group_and_recover_runs_the_job_again(queue, agent, box):
    """W-4, I-4 (docs/workers.md step 2: the orphan guard): the worker SIGKILLed while its
    job's group holds children that ignore SIGTERM and SIGHUP: they are killed with it;
    ``recover`` requeues the job, and a second worker finishes it (not lost, run once to
    its end)."""
    cmd = (
        f'nohup sh -c \'trap "" TERM HUP; echo $$ > {box}/kid-$CTX_CALL.pid; '
        f"exec sleep 300' >/dev/null 2>&1 & echo $$ >> {box}/runs; "
        f"if [ -e {box}/second ]; then echo again; exit 0; fi; touch {box}/up; sleep 300"
    )
    job = queue.publish(shell_job(cmd), name="killed")
    with worker(queue, "--timeout", "60") as proc:
        assert wait_for(lambda: (box / "up").exists(), 20), proc.poll()
        assert wait_for(lambda: list(box.glob("kid-*.pid")), 20)
        kids = [int(p.read_text()) for p in box.glob("kid-*.pid")]
        proc.kill()
        proc.communicate()
    for pid in kids:
        assert gone(pid), pid
    r = queue.run("recover")
    assert r.rc == 0 and TRACEBACK not in r.err, r
    assert queue.state(job) == "pending", r
    (box / "second").touch()
    rc, events, err = drain(queue, "--timeout", "60")
    assert rc == 0, (events, err)
    assert queue.state(job) == "done" and result_of(queue, job)["output"] == "again\n"
    assert len((box / "runs").read_text().splitlines()) == 2
    nothing_claimed(queue)
