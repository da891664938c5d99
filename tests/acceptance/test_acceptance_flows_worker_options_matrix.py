"""Every option of the queue workers, alone and in combination (SPEC §3 W-1…W-5, §2.2 Q-3,
§2.3 I-1/I-4, docs/workers.md, workers/README.md): ``ctx queue work`` and the ready programs
``workers/tool_worker.py`` and ``workers/shell_worker.py``.

* the agent from ``--agent`` or ``$CTX_AGENT`` (W-1): which wins, an empty one, an illegal or
  unknown one, a worker without one, a worker started by someone other than the host
  administrator;
* the queue from ``--project``, ``--queue`` or ``$CTX_PROJECT``, and contradictory choices;
* ``--drain``, ``--max-jobs``, ``--concurrency``, ``--kind``, ``--timeout`` (W-4), ``--ttl``
  and ``queue/config``'s ``lease_ttl`` (Q-3), ``--worker``, ``--session``: which jobs are
  claimed, which stay pending, what the lease and the result say;
* the values each refuses (extreme, malformed, contradictory): exit 2 with an errno-style
  line (an error object with ``--json``) before anything is claimed or made;
* the stop signals (SIGTERM, SIGHUP, ^C once or twice, SIGKILL, a signal while starting) and
  what becomes of the job in hand under each (W-4, I-4);
* what is printed: text lines, ``--json`` events whose ``stop`` summary adds up to the
  queue on disk, output that cannot be written, and ``--help`` against the documented
  options and limits.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    QueueCLI,
    alive,
    clean_env,
    ctx_run,
    rfc3339,
    snapshot,
    wait_for,
)
from tests.acceptance.workercli import AGENT, allow_in_tool_policy, make_agent
from tests.acceptance.workercli import storage as storage
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the worker's agent runs as another uid: needs root"
)

PYTHON = str(REPO / ".venv" / "bin" / "python")
READY = {
    "tool_worker.py": [PYTHON, str(REPO / "workers" / "tool_worker.py")],
    "shell_worker.py": [PYTHON, str(REPO / "workers" / "shell_worker.py")],
}
MAX_SECONDS = 31622400  # a year and a day: --timeout and --ttl at most (docs/workers.md)
DEADLINE = 20.0

# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def agent(storage: Path) -> str:
    """Agent ``ci`` (uid nobody), allowed ``shell.exec`` in both layers of P-6 and nothing
    else."""
    make_agent(storage, ["shell.exec"])
    allow_in_tool_policy(storage, "shell.exec")
    return AGENT


def shell(cmd: str) -> dict:
    return {"tool": "shell.exec", "input": {"cmd": cmd}}


def gated(outbox: Path, tag: str) -> dict:
    """A job that notes its start (and its shell's pid), then waits for ``TAG.go`` in
    ``outbox`` (at most 30 s) and answers in JSON."""
    o = f"{outbox}/{tag}"
    return shell(
        f"echo $$ > {o}.pid; touch {o}.started; n=0; "
        f"while [ ! -e {o}.go ] && [ $n -lt 1500 ]; do sleep 0.02; n=$((n+1)); done; "
        f'echo \'{{"tag": "{tag}"}}\''
    )


def started(outbox: Path, tag: str) -> bool:
    return (outbox / f"{tag}.started").exists()


def release(outbox: Path, *tags: str) -> None:
    for tag in tags:
        (outbox / f"{tag}.go").touch()


def publish(queue: QueueCLI, name: str, req: dict, env: dict | None = None) -> str:
    r = queue.run("publish", "--name", name, "-", input=json.dumps(req), env=env or env_of(queue))
    assert r.rc == 0, r
    return r.out.strip()


def env_of(queue: QueueCLI, **extra: str) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(queue.storage), **extra)


def work_argv(queue: QueueCLI, *args: str, program: str = "ctx") -> list[str]:
    base = [*CTX_ARGV, "queue", "work"] if program == "ctx" else READY[program]
    return [*base, "--project", queue.project, *args]


def events_of(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def work(queue: QueueCLI, *args: str, env: dict | None = None, program: str = "ctx"):
    """A worker run to its end: (exit status, stdout, stderr)."""
    proc = subprocess.run(
        work_argv(queue, *args, program=program),
        env=env if env is not None else env_of(queue),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


class Running:
    """A worker in the background, its stdout lines collected as they come."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def events(self) -> list[dict]:
        return [json.loads(x) for x in list(self.lines) if x.strip()]

    def saw(self, event: str) -> bool:
        return any(e["event"] == event for e in self.events())

    def end(self, timeout: float = DEADLINE) -> tuple[int, list[dict], str]:
        rc = self.proc.wait(timeout=timeout)
        self.reader.join(timeout)
        err = self.proc.stderr.read()
        assert "Traceback" not in err, err
        return rc, self.events(), err


@contextlib.contextmanager
def running(
    queue: QueueCLI, *args: str, env: dict | None = None, program: str = "ctx", **popen
) -> Iterator[Running]:
    proc = subprocess.Popen(
        work_argv(queue, *args, program=program),
        env=env if env is not None else env_of(queue),
        stdin=subprocess.DEVNULL,
        stdout=popen.pop("stdout", subprocess.PIPE),
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )
    worker = Running(proc)
    try:
        yield worker
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stderr.close()


def signal_landed(pid: int, signum: int) -> None:
    """Wait until ``signum`` is no longer pending for ``pid``, then a short while for the
    interpreter's handler to run on the main thread (it looks every 0.1 s)."""
    bit = 1 << (signum - 1)

    def delivered() -> bool:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except FileNotFoundError:
            return True
        masks = [int(line.split()[1], 16) for line in status.splitlines()
                 if line.startswith(("SigPnd", "ShdPnd"))]  # fmt: skip
        return not any(m & bit for m in masks)

    assert wait_for(delivered, DEADLINE)
    time.sleep(0.5)


def states(queue: QueueCLI) -> dict[str, str | None]:
    """Every job of the queue and its §2.1 state (None for an incomplete one)."""
    return {job: queue.state(job) for job in queue.requests()}


def assert_balanced(queue: QueueCLI, evs: list[dict]) -> dict:
    """The ``stop`` summary is the last event and adds up: its counts are the ``finish``
    events, each claim finished once, and each finished job in that state on disk."""
    assert evs and evs[-1]["event"] == "stop", evs
    stop = evs[-1]
    finishes = {e["job"]: e["state"] for e in evs if e["event"] == "finish"}
    claims = [e["job"] for e in evs if e["event"] == "claim"]
    assert len(finishes) == len([e for e in evs if e["event"] == "finish"]), evs
    assert sorted(claims) == sorted(finishes) == sorted(set(claims)), evs
    counted = {s: list(finishes.values()).count(s) for s in ("done", "failed")}
    assert (stop["done"], stop["failed"], stop["lost"]) == (counted["done"], counted["failed"], 0)
    for job, state in finishes.items():
        assert queue.only_result(job)[0] == state, (job, state)
    return stop


def session_events(storage: Path, agent: str, session: str) -> list[dict]:
    found = list(storage.glob(f"home/*/agent/{agent}/session/{session}/events.jsonl"))
    assert len(found) == 1, found
    return [json.loads(x) for x in found[0].read_text().splitlines() if x.strip()]


def lease_lifetime(lease: dict) -> float:
    return (rfc3339(lease["expires_at"]) - rfc3339(lease["claimed_at"])).total_seconds()


def set_lease_ttl(queue: QueueCLI, value: str) -> None:
    config = queue.dir / "config"
    text = re.sub(r"(?m)^lease_ttl=.*$", f"lease_ttl={value}", config.read_text())
    assert f"lease_ttl={value}" in text
    config.write_text(text)


def nothing_moved(queue: QueueCLI, jobs: list[str]) -> None:
    for job in jobs:
        assert queue.state(job) == "pending", (job, states(queue))
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()
    assert queue.entries("done") == set() and queue.entries("failed") == set()


# ------------------------------------------------------------------- refusals before a claim

REFUSED = [
    ("--max-jobs", "0"),
    ("--max-jobs", "-1"),
    ("--max-jobs", "1.5"),
    ("--concurrency", "0"),
    ("--concurrency", "1025"),
    ("--timeout", "0"),
    ("--timeout", "nan"),
    ("--timeout", "inf"),
    ("--timeout", str(MAX_SECONDS + 1)),
    ("--ttl", "0.999"),
    ("--ttl", "nan"),
    ("--ttl", str(MAX_SECONDS + 1)),
    ("--kind", "python"),
    ("--worker", ""),
    ("--worker", "a\nb"),
    ("--worker", "w" * 256),
    ("--worker", "é" * 128),  # 256 bytes
    ("--session", "a/b"),
    ("--session", "s" * 65),
    ("--session", "worker.d"),
    ("--agent", ""),
    ("--agent", "a/b"),
    ("--queue", "/tmp"),  # beside --project
]


def test_a_value_out_of_range_is_a_usage_error_before_anything_is_claimed_or_made(
    queue: QueueCLI, agent: str
) -> None:
    """W-*, §2.4: each malformed command line exits 2 with ``EINVAL`` (an error object with
    ``--json``), the job pending and no session made for the agent."""
    job = publish(queue, "j1", shell("echo hi"))
    home = snapshot(queue.storage / "home")
    wrong = []
    for option, value in REFUSED:
        args = ["--agent", agent, "--drain", "--json", option, value]
        if option == "--agent":
            args = args[2:]
        rc, out, err = work(queue, *args)
        objects = events_of(out)
        if not (
            rc == 2
            and err.splitlines()[-1].startswith("ctx: EINVAL: ")
            and len(objects) == 1
            and objects[0].get("error") == "EINVAL"
            and objects[0].get("errno") == 22
        ):
            wrong.append((option, value, rc, out, err))
    assert wrong == []
    nothing_moved(queue, [job])
    assert snapshot(queue.storage / "home") == home


READY_REFUSED = [
    ("shell_worker.py", ["--concurrency", "0"], "--concurrency"),
    ("tool_worker.py", ["--timeout", "0"], "--timeout"),
    ("tool_worker.py", ["--ttl", "0.5"], "not in the range 1.0<=x"),
    ("shell_worker.py", ["--worker", ""], "--worker"),
    ("tool_worker.py", ["--max-jobs", "0"], "--max-jobs"),
    ("shell_worker.py", ["--session", "a/b"], "session"),
    ("tool_worker.py", ["--kind", "shell"], "--kind"),
]


def test_the_ready_programs_refuse_what_ctx_refuses_under_their_own_name(
    queue: QueueCLI, agent: str
) -> None:
    """W-5 and workers/README.md: the same limits, exit 2, ``PROGRAM: ERRNO: sentence``."""
    job = publish(queue, "j1", shell("echo hi"))
    for program, args, needle in READY_REFUSED:
        rc, out, err = work(queue, "--agent", agent, "--drain", *args, program=program)
        assert rc == 2 and out == "", (program, args, rc, out, err)
        last = err.splitlines()[-1]
        assert last.startswith(f"{program}: EINVAL: ") and needle in last, (program, err)
    nothing_moved(queue, [job])


@pytest.mark.parametrize("program", sorted(READY))
def test_a_ready_program_needs_agent_on_its_command_line(
    queue: QueueCLI, agent: str, program: str
) -> None:
    """workers/README.md: ``--agent`` required (``$CTX_AGENT`` is ``ctx queue work``'s), and
    ``--agent ''`` an illegal name: both exit 2, nothing claimed."""
    job = publish(queue, "j1", shell("echo hi"))
    rc, _, err = work(queue, "--drain", env=env_of(queue, CTX_AGENT=agent), program=program)
    assert rc == 2 and f"{program}: EINVAL: " in err and "--agent" in err, err
    rc, _, err = work(queue, "--drain", "--agent", "", program=program)
    assert rc == 2 and f"{program}: EINVAL: illegal agent name" in err, err
    argv = [*READY[program], "--agent", agent, "--storage", str(queue.storage)]
    done = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--project" in done.stderr, done  # nor $CTX_PROJECT
    rc, _, err = work(queue, "--drain", "--agent", agent, "-p", "nosuch", program=program)
    assert rc == 1 and err.startswith(f"{program}: ENOENT: no queue at "), err
    nothing_moved(queue, [job])


# ------------------------------------------------------------------- the agent and the queue


@pytest.mark.parametrize(
    ("env_agent", "option", "rc", "outcome"),
    [
        ("ci", None, 0, "done"),
        ("nosuch", "ci", 0, "done"),  # the option wins over the environment
        ("", None, 0, "failed"),  # an empty $CTX_AGENT is unset
        ("nosuch", None, 1, "pending"),
        ("ci", "", 2, "pending"),  # an empty --agent is an illegal name, whatever the env
        ("a/b", None, 2, "pending"),
    ],
)
def test_the_agent_comes_from_the_option_else_the_environment(
    queue: QueueCLI,
    agent: str,
    env_agent: str,
    option: str | None,
    rc: int,
    outcome: str,
) -> None:
    """W-1, docs/workers.md: ``--agent``, else ``$CTX_AGENT`` (an empty one unset: one
    warning, every job failed ``EACCES`` at stage ``authorize``)."""
    jobs = [publish(queue, f"j{n}", shell("echo hi")) for n in (1, 2)]
    args = ["--drain"] + ([] if option is None else ["--agent", option])
    got, out, err = work(queue, *args, env=env_of(queue, CTX_AGENT=env_agent))
    assert got == rc, (got, out, err)
    for job in jobs:
        assert queue.state(job) == outcome, (job, states(queue))
    warnings = [line for line in err.splitlines() if "warning" in line]
    if outcome == "done":
        assert err == "" and queue.only_result(jobs[0])[1]["agent"] == agent
    elif outcome == "failed":
        assert len(warnings) == 1 and "without --agent or CTX_AGENT" in warnings[0], err
        for job in jobs:
            res = queue.only_result(job)[1]
            assert res["error"]["error"] == "EACCES" and res["error"]["stage"] == "authorize"
            assert res["reason"].startswith("EACCES: this worker was started without --agent")
    else:
        expected = "ENOENT" if rc == 1 else "EINVAL"
        assert err.splitlines()[-1].startswith(f"ctx: {expected}: "), err
        assert queue.entries("claimed") == set()


@pytest.mark.parametrize("via", ["option", "environment"])
def test_only_the_host_administrator_may_start_a_worker_with_an_agent(
    queue: QueueCLI, agent: str, unprivileged_user: UnprivilegedUser, via: str
) -> None:
    """docs/workers.md, "Who may start one": another user (here one who may enter the
    space) is refused ``EACCES``, exit 1, before any claim, whether the agent is given by
    ``--agent`` or by ``$CTX_AGENT``."""
    job = publish(queue, "j1", shell("echo hi"))
    env = env_of(queue, PATH="/usr/bin:/bin")
    args = ["--drain", "--json"]
    if via == "option":
        args += ["--agent", agent]
    else:
        env["CTX_AGENT"] = agent
    done = run_as(unprivileged_user, work_argv(queue, *args), groups=[0], env=env)
    assert done.returncode == 1, done
    assert "EACCES: only the host administrator" in done.stderr, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["error"] == "EACCES", done.stdout
    nothing_moved(queue, [job])


QUEUE_CHOICES = [
    ("proj", ["--project", "nosuch"], 1),  # --project wins over $CTX_PROJECT
    ("", [], 2),  # an empty $CTX_PROJECT names no queue
    (None, ["--project", "proj", "--queue", "QUEUE"], 2),  # contradictory
    (None, ["--queue", "QUEUE", "-p", "proj"], 2),  # in either order
    ("proj", [], 0),
    ("nosuch", ["--queue", "QUEUE"], 0),  # --queue wins over $CTX_PROJECT
]


def test_the_queue_comes_from_project_queue_or_the_environment(queue: QueueCLI, agent: str) -> None:
    """§2.4: ``--project``, ``--queue`` or ``$CTX_PROJECT``; a contradiction is exit 2 and an
    unknown project exit 1, the job pending either way."""
    for env_project, args, rc in QUEUE_CHOICES:
        job = publish(queue, f"j{len(queue.requests())}", shell("echo hi"))
        args = [str(queue.dir) if a == "QUEUE" else a for a in args]
        env = env_of(queue) if env_project is None else env_of(queue, CTX_PROJECT=env_project)
        argv = [*CTX_ARGV, "queue", "work", "--agent", agent, "--drain", *args]
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == rc, (env_project, args, done)
        if rc == 0:
            assert queue.only_result(job)[0] == "done"
        else:
            assert done.stderr.splitlines()[-1].startswith(
                "ctx: ENOENT: no queue at" if rc == 1 else "ctx: EINVAL: "
            ), done.stderr
            assert queue.state(job) == "pending"
            assert queue.entries("claimed") == set()


# ----------------------------------------------------------------------- which jobs are taken


def test_max_jobs_bounds_the_claims_of_many_slots(queue: QueueCLI, agent: str) -> None:
    """``--max-jobs 2 --concurrency 5 --drain`` on five jobs: exactly two are claimed and
    finished, three stay pending, and the summary says so (W-2)."""
    jobs = [publish(queue, f"m{n}", shell(f"echo {n}")) for n in range(5)]
    rc, out, err = work(
        queue, "--agent", agent, "--drain", "--json", "--max-jobs", "2", "--concurrency", "5"
    )
    assert rc == 0, err
    stop = assert_balanced(queue, events_of(out))
    assert stop["done"] == 2 and stop["left_pending"] == {} and stop["left_claimed"] == []
    got = states(queue)
    assert sorted(got.values()) == ["done", "done", "pending", "pending", "pending"], got
    assert set(got) == set(jobs)


def test_max_jobs_without_drain_waits_for_work_then_takes_exactly_that_many(
    queue: QueueCLI, agent: str
) -> None:
    """``--max-jobs 1`` on an empty queue waits (W-2: inotify); of two jobs published then,
    it claims one and exits 0; the other stays pending."""
    with running(queue, "--agent", agent, "--json", "--max-jobs", "1") as worker:
        assert wait_for(lambda: worker.saw("start"), DEADLINE)
        assert worker.proc.poll() is None  # an empty queue is no reason to stop
        jobs = [publish(queue, f"w{n}", shell("echo hi")) for n in (1, 2)]
        rc, evs, err = worker.end()
    assert rc == 0, err
    stop = assert_balanced(queue, evs)
    assert stop["done"] == 1
    assert sorted(states(queue)[j] for j in jobs) == ["done", "pending"]


def test_kind_shell_with_max_jobs_passes_over_other_tools_without_counting_them(
    queue: QueueCLI, agent: str
) -> None:
    """``--kind shell --max-jobs 1 --drain``: a job of another tool is never claimed, costs
    no claim of the budget, and is not reported as left pending (docs/workers.md)."""
    other = publish(queue, "a-other", {"tool": "fs.stat", "input": {"path": "/"}})
    first = publish(queue, "b-shell", shell("echo one"))
    second = publish(queue, "c-shell", shell("echo two"))
    rc, out, err = work(
        queue, "--agent", agent, "--kind", "shell", "--max-jobs", "1", "--drain", "--json"
    )
    assert rc == 0, err
    stop = assert_balanced(queue, events_of(out))
    assert stop["done"] == 1 and stop["left_pending"] == {}, stop
    got = states(queue)
    assert got[other] == "pending", got
    assert sorted([got[first], got[second]]) == ["done", "pending"], got
    # and drained without a budget, every shell job is run and the other tool's stays
    rc, out, err = work(queue, "--agent", agent, "--kind", "shell", "--drain", "--json")
    assert rc == 0 and assert_balanced(queue, events_of(out))["left_pending"] == {}
    assert states(queue) == {other: "pending", first: "done", second: "done"}


def test_shell_worker_prints_finished_jobs_only_and_leaves_other_tools(
    queue: QueueCLI, agent: str
) -> None:
    """workers/README.md: each finished job one JSON line (and the summary), every event with
    ``--json``; a job of another tool stays pending for a tool worker."""
    other = publish(queue, "a-other", {"tool": "fs.stat", "input": {"path": "/"}})
    mine = publish(queue, "b-shell", shell("echo hi"))
    rc, out, err = work(queue, "--agent", agent, "--drain", program="shell_worker.py")
    assert rc == 0 and err == "", (rc, err)
    evs = events_of(out)
    assert [e["event"] for e in evs] == ["finish", "stop"], evs
    assert evs[0]["job"] == mine and evs[0]["state"] == "done"
    assert states(queue) == {other: "pending", mine: "done"}
    last = publish(queue, "c-shell", shell("echo again"))
    rc, out, _ = work(queue, "--agent", agent, "--drain", "--json", program="shell_worker.py")
    assert rc == 0
    assert [e["event"] for e in events_of(out)] == ["start", "claim", "finish", "stop"]
    assert queue.state(last) == "done" and queue.state(other) == "pending"


def test_concurrency_runs_that_many_jobs_at_once(queue: QueueCLI, agent: str, outbox: Path) -> None:
    """``--concurrency 3``: three jobs that each wait until all three have started all
    finish; they could not under one slot."""
    wait_all = (
        f"touch {outbox}/$TAG.started; n=0; "
        f"until [ $(ls {outbox} | grep -c '[.]started$') -ge 3 ]; do "
        "sleep 0.02; n=$((n+1)); [ $n -gt 500 ] && exit 7; done; echo ok"
    )
    for n in range(3):
        publish(queue, f"c{n}", shell(f"TAG=c{n}; {wait_all}"))
    rc, out, err = work(queue, "--agent", agent, "--drain", "--json", "--concurrency", "3")
    assert rc == 0, err
    stop = assert_balanced(queue, events_of(out))
    assert (stop["done"], stop["failed"]) == (3, 0), events_of(out)


def test_the_largest_concurrency_on_a_small_queue(queue: QueueCLI, agent: str) -> None:
    """``--concurrency 1024`` (the documented maximum) with ``--max-jobs 2`` on three jobs:
    two done, one pending, exit 0."""
    for n in range(3):
        publish(queue, f"x{n}", shell("echo hi"))
    rc, out, err = work(
        queue, "--agent", agent, "--drain", "--json", "--concurrency", "1024", "--max-jobs", "2"
    )
    assert rc == 0, err
    assert assert_balanced(queue, events_of(out))["done"] == 2
    assert sorted(states(queue).values()) == ["done", "done", "pending"]


# ------------------------------------------------------------------------ timeout and lease


def test_timeout_kills_the_whole_process_group_and_fails_the_job(
    queue: QueueCLI, agent: str, outbox: Path
) -> None:
    """W-4: ``--timeout 0.5``: the job fails ``ETIMEDOUT`` at stage ``run`` and what its
    tool started in the background is killed with it; the worker goes on to the next job."""
    slow = publish(queue, "a-slow", shell(f"sleep 30 & echo $! > {outbox}/child; wait"))
    quick = publish(queue, "b-quick", shell("echo hi"))
    rc, out, err = work(queue, "--agent", agent, "--drain", "--json", "--timeout", "0.5")
    assert rc == 0, err
    assert_balanced(queue, events_of(out))
    state, res = queue.only_result(slow)
    assert state == "failed" and res["error"]["error"] == "ETIMEDOUT", res
    assert res["error"]["stage"] == "run" and res["reason"].startswith("ETIMEDOUT"), res
    child = int((outbox / "child").read_text())
    assert wait_for(lambda: not alive(child), DEADLINE), "the tool's background child lives"
    assert queue.only_result(quick)[0] == "done"


@pytest.mark.parametrize(
    ("args", "config_ttl", "lifetime"),
    [
        (["--ttl", "1"], None, 1.0),
        ([], "7", 7.0),  # the queue's lease_ttl when there is no --ttl
        (["--ttl", "2"], "0.5", 2.0),  # --ttl wins over a lease_ttl too short for a worker
        (["--ttl", str(MAX_SECONDS), "--timeout", str(MAX_SECONDS)], None, float(MAX_SECONDS)),
    ],
    ids=["ttl-1", "config-7", "ttl-over-config", "ttl-max"],
)
def test_the_lease_lifetime_comes_from_ttl_else_the_queue_config(
    queue: QueueCLI,
    agent: str,
    outbox: Path,
    args: list[str],
    config_ttl: str | None,
    lifetime: float,
) -> None:
    """Q-3, docs/workers.md: the lease's ``expires_at`` is ``claimed_at`` plus ``--ttl``,
    else ``lease_ttl`` of ``queue/config``; the worker's id is in it; a 1 s lease is renewed
    while its job runs, and the job is finished, not lost."""
    if config_ttl is not None:
        set_lease_ttl(queue, config_ttl)
    job = publish(queue, "g", gated(outbox, "g"))
    wid = "build host #1"
    with running(queue, "--agent", agent, "--drain", "--json", "--worker", wid, *args) as w:
        assert wait_for(lambda: started(outbox, "g"), DEADLINE), w.lines
        lease = queue.lease(job)
        assert lease["worker"] == wid and lease["pid"] == w.proc.pid, lease
        assert abs(lease_lifetime(lease) - lifetime) < 0.01, lease
        if lifetime < 2:
            assert wait_for(lambda: "renewed_at" in queue.lease(job), DEADLINE)
            renewed = queue.lease(job)
            assert rfc3339(renewed["expires_at"]) > rfc3339(lease["expires_at"]), renewed
        release(outbox, "g")
        rc, evs, err = w.end()
    assert rc == 0, err
    assert evs[0] == {"event": "start", "worker": wid, "pid": w.proc.pid, "wait": "inotify"}
    stop = assert_balanced(queue, evs)
    assert stop["done"] == 1 and stop["lost"] == 0
    assert queue.only_result(job)[1]["worker"]["id"] == wid


def test_a_lease_ttl_below_a_second_in_the_config_stops_the_worker_before_a_claim(
    queue: QueueCLI, agent: str
) -> None:
    """docs/workers.md: a ``lease_ttl`` under 1 s in ``queue/config`` stops the worker before
    its first claim, exit 1 (``--ttl`` below it is exit 2)."""
    set_lease_ttl(queue, "0.5")
    job = publish(queue, "j1", shell("echo hi"))
    for program in ("ctx", "tool_worker.py"):
        rc, out, err = work(queue, "--agent", agent, "--drain", "--json", program=program)
        assert rc == 1, (program, rc, out, err)
        assert err.splitlines()[-1].startswith(f"{program}: EINVAL: "), err
        assert json.loads(out.splitlines()[-1])["error"] == "EINVAL", out
    nothing_moved(queue, [job])


def test_the_refusal_of_a_short_config_lease_ttl_says_where_it_came_from(
    queue: QueueCLI, agent: str
) -> None:
    set_lease_ttl(queue, "0.5")
    rc, _, err = work(queue, "--agent", agent, "--drain")
    assert rc == 1, err
    assert "lease_ttl" in err or "config" in err, err


def test_worker_id_and_session_name_what_the_worker_records(
    queue: QueueCLI, agent: str, storage: Path
) -> None:
    """``--worker`` is the id in the result, ``--session`` the session recording
    ``queue.claim``, ``queue.start``, the call and ``queue.finish`` (docs/workers.md)."""
    job = publish(queue, "j1", shell("echo hi"))
    wid = "w-é-" + "x" * 200
    rc, out, err = work(queue, "--agent", agent, "--drain", "--json", "--worker", wid,
                        "--session", "nightly")  # fmt: skip
    assert rc == 0, err
    assert events_of(out)[0]["worker"] == wid
    assert queue.only_result(job)[1]["worker"]["id"] == wid
    types = [e["type"] for e in session_events(storage, agent, "nightly")]
    assert types == ["queue.claim", "queue.start", "tool_call", "tool_result", "queue.finish"]
    assert not list(storage.glob(f"home/*/agent/{agent}/session/worker"))


# -------------------------------------------------------------------------------- output


def test_json_summary_adds_up_to_the_queue_on_disk(
    queue: QueueCLI, agent: str, outbox: Path
) -> None:
    """``--json``: ``start`` first, a ``claim`` before each ``finish``, ``stop`` last with
    counts that are the jobs now in ``done/`` and ``failed/``; stdout holds JSON only."""
    ok = publish(queue, "a-ok", shell("echo hi"))
    bad = publish(queue, "b-exit", shell("echo broken >&2; exit 3"))
    denied = publish(queue, "c-denied", {"tool": "fs.stat", "input": {"path": "/"}})
    (queue.dir / "pending" / "d-malformed.req.json").write_text("not json")
    rc, out, err = work(queue, "--agent", agent, "--drain", "--json")
    assert rc == 0, err
    evs = events_of(out)  # every line parses
    assert evs[0]["event"] == "start"
    for job in (ok, bad, denied, "d-malformed.req.json"):
        kinds = [e["event"] for e in evs if e.get("job") == job]
        assert kinds == ["claim", "finish"], (job, evs)
    stop = assert_balanced(queue, evs)
    assert (stop["done"], stop["failed"]) == (1, 3), stop
    done_files = {n for n in queue.entries("done") if not n.endswith(".result")}
    failed_files = {n for n in queue.entries("failed") if not n.endswith(".result")}
    assert (len(done_files), len(failed_files)) == (stop["done"], stop["failed"])
    assert queue.only_result(bad)[1]["exit_status"] == 3
    assert queue.only_result("d-malformed.req.json")[1]["error"]["stage"] == "request"
    queue.assert_settled()


def test_text_output_is_one_line_per_event_on_stdout(queue: QueueCLI, agent: str) -> None:
    """docs/workers.md, Output: not on a terminal, a start line, one line per finished job
    and the summary; nothing on stderr."""
    ok = publish(queue, "a-ok", shell("echo hi"))
    bad = publish(queue, "b-exit", shell("exit 3"))
    rc, out, err = work(queue, "--agent", agent, "--drain", "--worker", "wk1")
    assert rc == 0 and err == "", (rc, err)
    lines = out.splitlines()
    assert lines[0] == "worker wk1 started (waiting with inotify)", lines
    assert re.fullmatch(rf"done    {re.escape(ok)} \(\d+\.\d{{3}}s\)", lines[1]), lines
    assert lines[2].startswith(f"failed  {bad}: ") and "status 3" in lines[2], lines
    assert re.fullmatch(r"worker stopped: 1 done, 1 failed, \d+\.\d jobs/s", lines[3]), lines
    assert len(lines) == 4


def test_json_with_standard_output_closed_is_refused_before_a_claim(
    queue: QueueCLI, agent: str
) -> None:
    """A command whose answer is its JSON output refuses ``EBADF`` when stdout is closed,
    before anything is done."""
    job = publish(queue, "j1", shell("echo hi"))
    argv = ["/bin/sh", "-c", 'exec "$@" >&-', "sh", *work_argv(queue, "--agent", agent,
            "--drain", "--json")]  # fmt: skip
    done = subprocess.run(argv, env=env_of(queue), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "ctx: EBADF: " in done.stderr, done
    nothing_moved(queue, [job])


def test_a_full_disk_for_standard_output_exits_74_having_claimed_nothing(
    queue: QueueCLI, agent: str
) -> None:
    """docs/workers.md, Output: ``> /dev/full`` stops the worker; exit 74 with ``ENOSPC``
    saying what it finished (here: nothing, as its first line could not be written)."""
    jobs = [publish(queue, f"j{n}", shell("echo hi")) for n in (1, 2)]
    for as_json in ([], ["--json"]):
        argv = work_argv(queue, "--agent", agent, "--drain", *as_json)
        with open("/dev/full", "w") as full:
            done = subprocess.run(argv, env=env_of(queue), stdout=full, stderr=subprocess.PIPE,
                                  text=True, timeout=60)  # fmt: skip
        assert done.returncode == 74, done
        assert "ctx: ENOSPC: cannot write standard output" in done.stderr
        assert "it finished no job" in done.stderr, done.stderr
        nothing_moved(queue, jobs)


def test_a_reader_that_leaves_ends_the_worker_quietly_with_the_job_in_hand_finished(
    queue: QueueCLI, agent: str
) -> None:
    """docs/workers.md, Output: a closed pipe stops the worker as SIGTERM does, the job in
    hand is finished, the next stays pending, exit 141 without a word."""
    proc = subprocess.Popen(
        work_argv(queue, "--agent", agent, "--json"),
        env=env_of(queue),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], DEADLINE)
        assert ready and json.loads(proc.stdout.readline())["event"] == "start"
        proc.stdout.close()
        jobs = [publish(queue, f"j{n}", shell("echo hi")) for n in (1, 2)]
        assert proc.wait(timeout=DEADLINE) == 141
        err = proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert err == "", err
    assert sorted(states(queue)[j] for j in jobs) == ["done", "pending"], states(queue)


# -------------------------------------------------------------------------------- signals


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_signal_finishes_the_job_in_hand_and_claims_no_more(
    queue: QueueCLI, agent: str, outbox: Path, signum: signal.Signals
) -> None:
    """W-4, docs/workers.md, Signals: SIGTERM, SIGHUP or a first ^C (here to the worker's
    whole process group, as a terminal sends it): stop claiming, the running job finishes,
    exit 0, ``stopped_by`` the signal."""
    jobs = {publish(queue, tag, gated(outbox, tag)): tag for tag in ("s1", "s2")}
    with running(queue, "--agent", agent, "--json", start_new_session=True) as w:
        assert wait_for(lambda: any(started(outbox, t) for t in jobs.values()), DEADLINE)
        if signum == signal.SIGINT:
            os.killpg(w.proc.pid, signum)
            assert wait_for(lambda: w.saw("interrupt"), DEADLINE), w.lines
        else:
            w.proc.send_signal(signum)
            signal_landed(w.proc.pid, signum)
        release(outbox, *jobs.values())
        rc, evs, err = w.end()
    assert rc == 0, err
    stop = assert_balanced(queue, evs)
    assert stop["stopped_by"] == signum.name and stop["done"] == 1 and not stop["aborted"]
    assert sorted(states(queue).values()) == ["done", "pending"]


def test_a_stop_signal_while_idle_ends_every_waiting_slot(queue: QueueCLI, agent: str) -> None:
    """SIGTERM to a worker of four slots all waiting on an empty queue: exit 0 without a
    claim, and a job published afterwards stays pending."""
    with running(queue, "--agent", agent, "--json", "--concurrency", "4") as w:
        assert wait_for(lambda: w.saw("start"), DEADLINE)
        w.proc.send_signal(signal.SIGTERM)
        rc, evs, err = w.end()
    assert rc == 0 and err == "", err
    assert [e["event"] for e in evs] == ["start", "stop"] and evs[-1]["stopped_by"] == "SIGTERM"
    job = publish(queue, "late", shell("echo hi"))
    assert queue.state(job) == "pending"


def test_a_stop_signal_lets_the_job_in_hand_time_out(
    queue: QueueCLI, agent: str, outbox: Path
) -> None:
    """W-4 with ``--timeout``: after SIGTERM, a job that would run on is killed at its
    timeout and finished as failed; the worker then exits 0."""
    job = publish(queue, "g", gated(outbox, "g"))
    with running(queue, "--agent", agent, "--json", "--timeout", "1") as w:
        assert wait_for(lambda: started(outbox, "g"), DEADLINE)
        w.proc.send_signal(signal.SIGTERM)
        rc, evs, err = w.end()
    assert rc == 0, err
    stop = assert_balanced(queue, evs)
    assert stop["stopped_by"] == "SIGTERM" and stop["failed"] == 1
    assert queue.only_result(job)[1]["error"]["error"] == "ETIMEDOUT"
    pid = int((outbox / "g.pid").read_text())
    assert wait_for(lambda: not alive(pid), DEADLINE)


def test_a_second_interrupt_aborts_the_job_in_hand_for_recover(
    queue: QueueCLI, agent: str, outbox: Path
) -> None:
    """docs/workers.md: ^C twice kills the running tool and exits 130 without finishing its
    job; the job is named as left claimed, and ``recover`` requeues it to run once more."""
    job = publish(queue, "g", gated(outbox, "g"))
    with running(queue, "--agent", agent, "--json") as w:
        assert wait_for(lambda: started(outbox, "g"), DEADLINE)
        w.proc.send_signal(signal.SIGINT)
        assert wait_for(lambda: w.saw("interrupt"), DEADLINE), w.lines
        w.proc.send_signal(signal.SIGINT)
        rc, evs, err = w.end()
    assert rc == 130, err
    stop = evs[-1]
    assert stop["event"] == "stop" and stop["aborted"] and stop["left_claimed"] == [job]
    assert "left claimed" in err and job in err, err
    assert queue.state(job) == "claimed"
    pid = int((outbox / "g.pid").read_text())
    assert wait_for(lambda: not alive(pid), DEADLINE), "the aborted tool still runs"
    assert queue.run("recover").rc == 0
    assert queue.state(job) == "pending"
    release(outbox, "g")
    rc, out, err = work(queue, "--agent", agent, "--drain", "--json")
    assert rc == 0 and assert_balanced(queue, events_of(out))["done"] == 1, err
    queue.assert_settled()


def test_one_interrupt_after_sigterm_still_lets_the_job_finish(
    queue: QueueCLI, agent: str, outbox: Path
) -> None:
    job = publish(queue, "g", gated(outbox, "g"))
    with running(queue, "--agent", agent, "--json") as w:
        assert wait_for(lambda: started(outbox, "g"), DEADLINE)
        w.proc.send_signal(signal.SIGTERM)
        signal_landed(w.proc.pid, signal.SIGTERM)
        w.proc.send_signal(signal.SIGINT)
        signal_landed(w.proc.pid, signal.SIGINT)
        release(outbox, "g")
        rc, _, err = w.end()
    assert rc == 0, (rc, err)
    assert queue.only_result(job)[0] == "done"


def test_sigkill_leaves_the_job_claimed_its_tool_killed_and_recover_requeues_it(
    queue: QueueCLI, agent: str, outbox: Path
) -> None:
    """docs/workers.md, SIGKILL: the worker ends where it is; its tool's process group is
    killed by the orphan guard; the lease names a dead process, so ``recover`` requeues the
    job, which then runs once (I-1, I-4)."""
    job = publish(queue, "g", gated(outbox, "g"))
    with running(queue, "--agent", agent, "--json", "--concurrency", "2") as w:
        assert wait_for(lambda: started(outbox, "g"), DEADLINE)
        w.proc.kill()
        assert w.proc.wait(timeout=DEADLINE) == -signal.SIGKILL
    pid = int((outbox / "g.pid").read_text())
    assert wait_for(lambda: not alive(pid), DEADLINE), "the tool outlived its worker"
    assert queue.state(job) == "claimed"
    r = queue.run("recover", "--json")
    assert r.rc == 0 and r.json()["requeued"], r
    release(outbox, "g")
    rc, out, err = work(queue, "--agent", agent, "--drain", "--json")
    assert rc == 0 and assert_balanced(queue, events_of(out))["done"] == 1, err
    queue.assert_settled()


@pytest.mark.parametrize(
    ("program", "signum"),
    [("ctx", signal.SIGTERM), ("shell_worker.py", signal.SIGHUP)],
)
def test_a_stop_signal_while_starting_claims_nothing_or_stops_as_usual(
    queue: QueueCLI, agent: str, program: str, signum: signal.Signals
) -> None:
    """docs/workers.md, Signals: a stop signal once the command has taken it (its first
    step), while the worker starts: exit 0 and a ``stop`` summary; stopped before its first
    claim it says so under its name and the job stays pending; otherwise the job it claimed
    is finished.  Never a job left claimed, never 143 or 129."""
    job = publish(queue, "j1", shell("echo hi"))
    bit = 1 << (signum - 1)
    with running(queue, "--agent", agent, "--drain", "--json", program=program) as w:

        def caught() -> bool:
            try:
                status = Path(f"/proc/{w.proc.pid}/status").read_text()
            except FileNotFoundError:
                return True
            line = next(x for x in status.splitlines() if x.startswith("SigCgt"))
            return bool(int(line.split()[1], 16) & bit)

        assert wait_for(caught, DEADLINE, step=0.0005)
        with contextlib.suppress(ProcessLookupError):
            w.proc.send_signal(signum)
        rc, evs, err = w.end()
    assert rc == 0, (rc, err)
    assert evs and evs[-1]["event"] == "stop", evs
    name = "ctx" if program == "ctx" else program
    if f"{name}: stopped by {signum.name} while starting; no job was claimed" in err:
        assert evs[-1]["done"] == 0 and evs[-1]["stopped_by"] == signum.name
        assert queue.state(job) == "pending"
    else:
        assert queue.state(job) in ("pending", "done"), states(queue)
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()


# -------------------------------------------------------------------------------- --help

OPTIONS = {
    "--storage": "CTX_STORAGE",
    "--project": "CTX_PROJECT",
    "--queue": "",
    "--json": "",
    "--session": "[default: worker]",
    "--drain": "",
    "--max-jobs": "[x>=1]",
    "--concurrency": "1<=x<=1024",
    "--timeout": f"0<x<={MAX_SECONDS}",
    "--ttl": "at least 1",
    "--worker": "HOST:PID",
}


@pytest.mark.parametrize("program", ["ctx", *sorted(READY)])
def test_help_names_every_documented_option_with_its_limits(program: str) -> None:
    """docs/workers.md and workers/README.md: the options, their defaults and limits; the
    agent from ``$CTX_AGENT`` for ``ctx queue work`` only, required by the ready programs,
    whose kind is fixed."""
    argv = [*CTX_ARGV, "queue", "work", "--help"] if program == "ctx" else [*READY[program], "-h"]
    done = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done
    text = " ".join(done.stdout.split())
    options = text.split("Options:", 1)[1]
    for option, fact in OPTIONS.items():
        assert option in options, option
        segment = options.split(option, 1)[1][:400]
        assert fact in segment, (option, fact, segment)
    if program == "ctx":
        assert "--kind [tool|shell]" in options and "[default: tool]" in options
        assert "$CTX_AGENT" in text and "EACCES" in text and "exit 130" in text
    else:
        assert "--agent AGENT" in options and "[required]" in options
        assert "--kind" not in options


def test_help_shows_the_ttl_range_the_worker_accepts() -> None:
    done = ctx_run("queue", "work", "--help")
    text = " ".join(done.out.split())
    segment = text.split("--ttl SECONDS", 1)[1].split("--worker", 1)[0]
    assert "0<x" not in segment, segment
