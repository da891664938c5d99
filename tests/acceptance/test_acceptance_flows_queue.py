"""End-to-end flows of a multi-agent project exchanging jobs through ``shared/<project>/queue``
(SPEC §2, §3, §4, §9, §14): a space made with ``ctx shared create``, agents made with ``ctx
agent create REQUEST.json``, publishers, several ``ctx queue work`` processes, a crash in the
middle of a job and of a claim, the recovery a user runs afterwards, a worker written as a shell
script with the queue's command line, and a worker stopped while its jobs time out or run."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
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

SPACE = "team"
TOOLS = ["shell.exec", "fs.write", "fs.read"]
AGENTS = ("builder", "checker")
RESULT_KEYS = {"status", "output", "worker", "started", "finished"}  # §2.1
S2_KEYS = {"ts", "type", "agent", "session", "object", "status"}  # S-2

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid and the space has a group: needs root"
)

# ------------------------------------------------------------------------------ helpers


def shell_job(cmd: str) -> dict:
    """A request as a user writes it: tool and input, ``from`` and ``created`` left to publish."""
    return {"tool": "shell.exec", "input": {"cmd": cmd}}


def killable_job(outbox: Path, tag: str, seconds: int = 30) -> dict:
    """A job whose first run hangs for ``seconds`` (its ``sleep`` pid in ``bg-TAG``) unless
    killed, and whose later runs finish at once; every run is one line of ``runs-TAG``."""
    first = f"touch {outbox}/once-{tag}; sleep {seconds} & echo $! > {outbox}/bg-{tag}; wait"
    return shell_job(
        f"echo run >> {outbox}/runs-{tag}; if [ ! -e {outbox}/once-{tag} ]; then {first}; fi; "
        f"echo {tag}-finished"
    )


def _written(path: Path) -> bool:
    """Whether ``path`` holds a whole line (a pid its writer has finished writing)."""
    try:
        return path.read_text().endswith("\n")
    except FileNotFoundError:
        return False


def env_for(storage: Path, **extra: str) -> dict[str, str]:
    """A user's shell environment: the storage root, and the venv's ``ctx`` first on PATH."""
    path = f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return clean_env(CTX_STORAGE=str(storage), PATH=path, **extra)


def publish(queue: QueueCLI, req: dict, name: str, agent: str | None = None) -> str:
    env = env_for(queue.storage, **({"CTX_AGENT": agent} if agent else {}))
    r = queue.run("publish", "--name", name, "-", input=json.dumps(req), env=env)
    assert r.rc == 0, r
    assert r.lines() == [f"{name}.req.json"], r  # §2.4: the job name alone
    return r.out.strip()


def publish_batch(queue: QueueCLI, requests: list[dict], scratch: Path) -> list[str]:
    """``ctx queue publish --batch FILE``: one request a line, one name a line back."""
    batch = scratch / "batch.jsonl"
    batch.write_text("".join(json.dumps(req) + "\n" for req in requests))
    r = queue.run("publish", "--batch", batch)
    assert r.rc == 0, r
    assert len(r.lines()) == len(requests) == len(set(r.lines())), r
    return r.lines()


def work(queue: QueueCLI, agent: str, *args: str) -> subprocess.Popen:
    """``ctx queue work`` as a user starts it: a process of its own, JSON lines out."""
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", agent, "--json"]
    return subprocess.Popen(
        [*argv, *args],
        env=env_for(queue.storage),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextmanager
def workers(*procs: subprocess.Popen) -> Iterator[tuple[subprocess.Popen, ...]]:
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


def events_of(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def finished_by(events: list[dict]) -> dict[str, str]:
    """Job -> the state a worker's ``finish`` events report."""
    return {e["job"]: e["state"] for e in events if e.get("event") == "finish"}


def session(storage: Path, agent: str, name: str) -> list[dict]:
    """S-1: the worker's session ``home/<uid>/agent/<agent>/session/<name>/events.jsonl``."""
    found = list(storage.glob(f"home/*/agent/{agent}/session/{name}/events.jsonl"))
    assert len(found) == 1, found
    lines = found[0].read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def terminal_state(queue: QueueCLI, job: str) -> str:
    """The one terminal state holding ``job``'s pair; it is nowhere else (I-1, Q-6)."""
    d = queue.dir
    holders = [s for s in ("done", "failed") if (d / s / job).exists()]
    results = [s for s in ("done", "failed") if (d / s / f"{job}.result").exists()]
    assert holders == results and len(holders) == 1, (job, holders, results)
    assert not (d / "pending" / job).exists()
    assert not (d / "claimed" / job).exists() and not (d / "lease" / job).exists()
    return holders[0]


def result_of(queue: QueueCLI, job: str) -> dict:
    state = terminal_state(queue, job)
    res = json.loads((queue.dir / state / f"{job}.result").read_text())
    assert res.keys() >= RESULT_KEYS, res  # §2.1
    assert res["status"] == ("ok" if state == "done" else "error"), res
    assert isinstance(res["worker"], dict) and res["worker"], res
    assert rfc3339(res["started"]) <= rfc3339(res["finished"]), res
    return res


def nothing_in_flight(queue: QueueCLI) -> None:
    for sub in ("pending", "claimed", "lease", "inbox"):
        assert queue.entries(sub) == set(), (sub, queue.entries(sub))


def consistent_status(queue: QueueCLI, **counts: int) -> dict:
    r = queue.run("status", "--json")
    assert r.rc == 0, r
    report = r.json()
    assert report["incomplete"] == [] and report["conflicts"] == [], report
    for state, n in counts.items():
        assert report[state] == n, (state, report)
    return report


def converged(queue: QueueCLI) -> None:
    """I-5: on a consistent queue recover and --reconcile exit 0 and change nothing."""
    before = snapshot(queue.dir)
    for args in ((), ("--reconcile",)):
        r = queue.run("recover", "--json", *args)
        assert r.rc == 0, r
        report = r.json()
        assert report["consistent"] is True, report
        assert report["requeued"] == [] and report["repaired"] == [], report
        assert snapshot(queue.dir) == before


# A ``ctx`` that sends itself signal argv[2] when the protocol reaches step argv[1]: SIGKILL
# stops it there as a power cut or an OOM kill would, SIGSTOP holds it there as a slow disk
# would (the same hook test_acceptance_interrupts.py uses for SIGINT).
_CTX_SIGNALLED_AT_STEP = """
import os, signal, sys
from cortexfs import durable
from cortexfs.cli import main

STEP, SIGNAL = sys.argv[1], getattr(signal, sys.argv[2])

class SignalAt(durable.FsOps):
    def step(self, name):
        if name == STEP:
            os.kill(os.getpid(), SIGNAL)

durable._DEFAULT_OPS = SignalAt()
sys.argv = ["ctx", *sys.argv[3:]]
main()
"""


def ctx_signalled_at(step: str, sig: str, storage: Path, *args: str) -> subprocess.Popen:
    python = str(REPO / ".venv" / "bin" / "python")
    return subprocess.Popen(
        [python, "-c", _CTX_SIGNALLED_AT_STEP, step, sig, *args],
        env=env_for(storage),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stopped(proc: subprocess.Popen) -> bool:
    stat = Path(f"/proc/{proc.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    return tmp_path


@pytest.fixture
def space(searchable_storage: Path, scratch: Path) -> QueueCLI:
    """``ctx shared create team --group <nobody's group>`` and two agents made from request
    files, both running as ``nobody`` (root's default), members of the space's group, granted
    shell.exec, fs.write and fs.read in their policy and in each tool's policy (P-6)."""
    storage = searchable_storage
    group = pwd.getpwnam("nobody").pw_gid
    made = ctx_run("shared", "create", SPACE, "--group", str(group), env=env_for(storage))
    assert made.rc == 0, made
    for agent in AGENTS:
        req = scratch / f"{agent}.json"
        req.write_text(
            json.dumps(
                {
                    "name": agent,
                    "label": f"{agent}_t",
                    "tools": TOOLS,
                    "shared": {SPACE: ["read", "write"]},
                }
            )
        )
        r = ctx_run("agent", "create", req, env=env_for(storage))
        assert r.rc == 0, r
        for tool in TOOLS:
            with open(storage / "tool" / f"{tool}.d" / "policy", "a") as policy:
                policy.write(f"allow {agent}_t tool:{tool} execute\n")
    return QueueCLI(storage, SPACE)


# ------------------------------------------------------------------------------ flows


@needs_root
def test_two_agents_workers_drain_singles_and_a_batch_each_job_once(space, outbox, scratch):
    """Q-1, Q-2, Q-4, W-1, W-3, X-1, S-2, S-5: agents' jobs published one by one and a user's
    batch are drained by two ``ctx queue work --drain --concurrency 2`` workers running as two
    agents at once; every job ends exactly once in done/ or failed/ with a §2.1 result, and the
    session of the worker that ran it records claim, tool_call, tool_result and finish."""
    queue = space
    data = queue.storage / "shared" / SPACE / "data"
    (data / "readme.txt").write_text("read me\n")
    notes = {}
    for n in range(3):
        req = {"tool": "fs.write", "input": {"path": f"/ctx/shared/{SPACE}/data/note-{n}.txt",
                                             "content": f"note {n}\n"}}  # fmt: skip
        notes[publish(queue, req, f"note-{n}", agent="builder")] = n
    readme = publish(
        queue,
        {"tool": "fs.read", "input": {"path": f"/ctx/shared/{SPACE}/data/readme.txt"}},
        "readme",
        agent="checker",
    )
    # Each shell job waits at a barrier until four run at once: two slots of each worker.
    barrier = f"until [ -e {outbox}/go ]; do sleep 0.05; done"
    shell = [shell_job(f"touch {outbox}/started-{n}; {barrier}; echo {n} >> {outbox}/runs")
             for n in range(10)]  # fmt: skip
    batch = publish_batch(
        queue,
        [
            *shell,
            shell_job("echo giving-up >&2; exit 3"),
            {"tool": "fs.list", "input": {"path": "/ctx"}},  # granted to neither agent
        ],
        scratch,
    )
    runs, exit3, denied = batch[:10], batch[10], batch[11]
    jobs = [*notes, readme, *batch]
    assert len(queue.entries("pending")) == len(jobs) == 16

    wb = work(queue, "builder", "--drain", "--concurrency", "2", "--worker", "wb",
              "--session", "wb")  # fmt: skip
    wc = work(queue, "checker", "--drain", "--concurrency", "2", "--worker", "wc",
              "--session", "wc")  # fmt: skip
    with workers(wb, wc):
        started = lambda: len(list(outbox.glob("started-*"))) >= 4  # noqa: E731
        assert wait_for(started, 30), (wb.poll(), wc.poll())
        (outbox / "go").touch()
        out_b, err_b = wb.communicate(timeout=60)
        out_c, err_c = wc.communicate(timeout=60)
    assert wb.returncode == 0 and wc.returncode == 0, (err_b, err_c)
    by = {"wb": finished_by(events_of(out_b)), "wc": finished_by(events_of(out_c))}
    assert by["wb"] and by["wc"], by  # both drained (four jobs ran at once, two each)
    assert not by["wb"].keys() & by["wc"].keys(), by  # W-3, I-4
    assert sorted([*by["wb"], *by["wc"]]) == sorted(jobs)
    for name, events in (("wb", events_of(out_b)), ("wc", events_of(out_c))):
        stop = events[-1]
        assert stop["event"] == "stop" and stop["lost"] == 0, stop
        assert stop["done"] + stop["failed"] == len(by[name]), stop

    # Every job once, in the state its worker reported, with a §2.1 result naming it.
    results = {}
    for job in jobs:
        worker = "wb" if job in by["wb"] else "wc"
        results[job] = res = result_of(queue, job)
        assert terminal_state(queue, job) == by[worker][job], job
        assert res["worker"]["id"] == worker, res
    nothing_in_flight(queue)
    assert sorted((outbox / "runs").read_text().split(), key=int) == [str(n) for n in range(10)]
    assert all(terminal_state(queue, j) == "done" for j in [*notes, readme, *runs])
    nobody = pwd.getpwnam("nobody")
    for job, n in notes.items():
        note = data / f"note-{n}.txt"
        assert note.read_text() == f"note {n}\n"
        # Written as the agent's uid into the setgid space: the group's file.
        assert (note.stat().st_uid, note.stat().st_gid) == (nobody.pw_uid, nobody.pw_gid)
        assert results[job]["output"]["bytes"] == len(f"note {n}\n")
    assert results[readme]["output"]["content"] == "read me\n"
    assert results[exit3]["error"]["stage"] == "exit" and results[exit3]["exit_status"] == 3
    assert results[denied]["error"]["error"] == "EACCES", results[denied]
    # publish fills in "from": the agent in $CTX_AGENT, else the user.
    me = pwd.getpwuid(os.geteuid()).pw_name
    stored = {j: json.loads((queue.dir / terminal_state(queue, j) / j).read_text()) for j in jobs}
    assert {stored[j]["from"] for j in notes} == {"builder"}
    assert stored[readme]["from"] == "checker"
    assert {stored[j]["from"] for j in batch} == {me}

    # S-2, S-5: each worker's session records its own jobs' transitions and tool calls.
    for worker, agent in (("wb", "builder"), ("wc", "checker")):
        events = session(queue.storage, agent, worker)
        for event in events:
            assert event.keys() >= S2_KEYS and event["agent"] == agent, event
        for job in by[worker]:
            mine = [e for e in events if e["object"] == f"queue/{job}"]
            assert [e["type"] for e in mine] == ["queue.claim", "queue.start", "queue.finish"]
            assert mine[0]["lease"]["worker"] == worker, mine[0]
            assert mine[-1]["state"] == by[worker][job], mine[-1]
            call = [e for e in events if e.get("call") == results[job]["call"]]
            assert [e["type"] for e in call] == ["tool_call", "tool_result"], (job, call)
            assert call[0]["object"] == f"tool/{stored[job]['tool']}"
            order = [events.index(e) for e in (mine[0], call[0], call[1], mine[-1])]
            assert order == sorted(order), (job, order)
        other = "wc" if worker == "wb" else "wb"
        assert not any(e["object"] == f"queue/{j}" for e in events for j in by[other])

    consistent_status(queue, pending=0, claimed=0, done=14, failed=2)
    converged(queue)


@needs_root
def test_a_worker_killed_mid_job_and_a_claim_killed_mid_claim_are_recovered_once(
    space, outbox, scratch
):
    """Q-3, Q-5, Q-6, I-1, I-3, I-5, W-1: a worker running two jobs at once is SIGKILLed while
    their tools run, and a shell's ``ctx queue claim`` is killed between its move and its
    lease; another worker drains on meanwhile.  The user then runs status, ``recover
    --dry-run --json``, plain ``recover`` (requeues the dead holder's jobs, reports the claim
    without a lease, exit 1), ``--reconcile`` (dry run first), recover again (no change), and
    drains: nothing is lost, each killed job runs once more, every other job exactly once."""
    queue = space

    slow = [publish(queue, killable_job(outbox, f"slow-{n}"), f"slow-{n}") for n in range(2)]
    victim = work(queue, "builder", "--concurrency", "2", "--worker", "victim",
                  "--session", "victim")  # fmt: skip
    with workers(victim):
        both = lambda: all(_written(outbox / f"bg-slow-{n}") for n in range(2))  # noqa: E731
        assert wait_for(both, 30), victim.poll()
        for job in slow:
            assert queue.state(job) == "claimed" and queue.lease(job)["pid"] == victim.pid
        quick = publish_batch(
            queue, [shell_job(f"echo {n} >> {outbox}/runs") for n in range(6)], scratch
        )
        survivor = work(queue, "checker", "--drain", "--concurrency", "2", "--worker",
                        "survivor", "--session", "survivor")  # fmt: skip
        with workers(survivor):
            out, err = survivor.communicate(timeout=60)
        assert survivor.returncode == 0, err
        assert sorted(finished_by(events_of(out))) == sorted(quick)  # the slow ones are held
        tools = [int((outbox / f"bg-slow-{n}").read_text()) for n in range(2)]
        assert all(map(alive, tools))
        victim.send_signal(signal.SIGKILL)
        victim.communicate(timeout=30)
    # The killed worker's tools go with it (a re-run never runs beside a leftover).
    assert wait_for(lambda: not any(map(alive, tools)), 10), "a killed worker's tool survived"
    half = publish(queue, shell_job(f"echo half >> {outbox}/half.runs"), "half")
    killed = ctx_signalled_at("lease.write", "SIGKILL", queue.storage, "queue", "claim",
                              "-p", SPACE)  # fmt: skip
    assert killed.wait(timeout=60) == -signal.SIGKILL, killed.communicate()
    killed.communicate()
    assert (queue.dir / "claimed" / half / half).is_file()
    assert not (queue.dir / "lease" / half).exists()

    # What the user sees after the crash.
    status = queue.run("status", "--json")
    assert status.rc == 0, status  # incomplete pairs are no conflict
    report = status.json()
    assert (report["claimed"], report["pending"], report["done"]) == (2, 0, 6), report
    assert [i["job"] for i in report["incomplete"]] == [half], report
    before = snapshot(queue.dir)
    dry = queue.run("recover", "--dry-run", "--json")
    assert dry.rc == 1, dry  # an incomplete pair stays after a plain recover
    plan = dry.json()
    assert sorted((r["job"], r["applied"]) for r in plan["requeued"]) == [
        (job, False) for job in slow
    ], plan
    assert [i["job"] for i in plan["incomplete"]] == [half], plan
    assert snapshot(queue.dir) == before
    plain = queue.run("recover")
    assert plain.rc == 1, plain
    assert all(f"requeue  {job}" in plain.out for job in slow), plain
    assert f"incomplete {half}" in plain.out and "NOT consistent" in plain.out, plain
    for job in slow:
        assert queue.state(job) == "pending" and not (queue.dir / "claimed" / job).exists()
    assert (queue.dir / "claimed" / half / half).is_file()  # plain recover changes no pair
    again = queue.run("recover", "--json")
    assert again.rc == 1 and again.json()["requeued"] == [], again
    before = snapshot(queue.dir)
    dry = queue.run("recover", "--reconcile", "--dry-run", "--json")
    assert dry.rc == 1, dry
    assert [(r["job"], r["applied"]) for r in dry.json()["repaired"]] == [(half, False)], dry
    assert snapshot(queue.dir) == before
    fixed = queue.run("recover", "--reconcile", "--json")
    assert fixed.rc == 0, fixed
    assert [(r["job"], r["applied"]) for r in fixed.json()["repaired"]] == [(half, True)], fixed
    assert fixed.json()["consistent"] is True, fixed
    assert [queue.state(job) for job in [*slow, half]] == ["pending"] * 3
    converged(queue)

    finisher = work(queue, "builder", "--drain", "--worker", "finisher", "--session", "fin")
    with workers(finisher):
        out, err = finisher.communicate(timeout=60)
    assert finisher.returncode == 0, err
    assert finished_by(events_of(out)) == {job: "done" for job in [*slow, half]}
    for n, job in enumerate(slow):
        res = result_of(queue, job)
        assert f"slow-{n}-finished" in json.dumps(res["output"]), res
        assert res["worker"]["id"] == "finisher", res
        # Killed once, run once more.
        assert (outbox / f"runs-slow-{n}").read_text() == "run\nrun\n"
    assert (outbox / "half.runs").read_text() == "half\n"  # its tool never started before
    assert sorted((outbox / "runs").read_text().split()) == [str(n) for n in range(6)]
    for job in [*quick, half]:
        assert result_of(queue, job)["status"] == "ok"
    nothing_in_flight(queue)
    # S-5: the victim's session holds the claims and calls of the jobs it never finished.
    killed_session = session(queue.storage, "builder", "victim")
    for job in slow:
        of_job = [e["type"] for e in killed_session if e["object"] == f"queue/{job}"]
        assert of_job == ["queue.claim", "queue.start"], of_job
    assert sum(e["type"] == "tool_call" for e in killed_session) == 2
    assert not any(e["type"] == "tool_result" for e in killed_session)
    finishes = [
        e["object"]
        for name, agent in (("victim", "builder"), ("survivor", "checker"), ("fin", "builder"))
        for e in session(queue.storage, agent, name)
        if e["type"] == "queue.finish"
    ]
    assert sorted(finishes) == sorted(f"queue/{j}" for j in [*quick, *slow, half])
    consistent_status(queue, pending=0, claimed=0, done=9, failed=0)
    converged(queue)


LOOP = r"""
set -u
sleep 600 & helper=$!
echo "$helper" > "$OUT/helper"
held=$(ctx queue claim -p "$P" --pid "$helper" --worker helper)
echo "$held" > "$OUT/held"
until [ -e "$OUT/go" ]; do sleep 0.05; done
n=0
while :; do
    J=$(ctx queue claim -p "$P" --worker loop --ttl 5)
    rc=$?
    [ "$rc" -eq 0 ] || break
    ctx queue renew -p "$P" "$J" --ttl 120 > /dev/null || exit 9
    echo "$J" >> "$OUT/claimed"
    n=$((n + 1))
    if [ "$n" -eq 1 ]; then
        touch "$OUT/holding"
        until [ -e "$OUT/go2" ]; do sleep 0.05; done
    fi
    case "$J" in
        bad-*) printf '{"why": "bad input %s"}' "$n" | ctx queue finish -p "$P" "$J" --error - ;;
        *) printf '{"n": %s}' "$n" | ctx queue finish -p "$P" "$J" --ok - ;;
    esac > /dev/null || exit 8
done
echo "$rc" > "$OUT/rc"
"""


def test_a_shell_script_works_the_queue_until_claim_exits_3(queue, scratch):
    """§2.4, Q-3, Q-5, I-4: a worker written in bash with the queue's commands only
    (``J=$(ctx queue claim …)``, ``renew``, ``finish --ok/--error``, until claim exits 3).
    The lease holder is the script (``$$``), or the process ``--pid`` names; recover leaves a
    live holder's job alone, requeues the job of a ``--pid`` holder once it is gone, and every
    job is finished once with the result the script gave."""
    jobs = publish_batch(queue, [shell_job(f"echo {n}") for n in range(4)], scratch)
    bad = publish(queue, shell_job("false"), "bad-1")
    out = scratch / "loop"
    out.mkdir()
    env = env_for(queue.storage, OUT=str(out), P=queue.project)
    script = subprocess.Popen(["bash", "-c", LOOP], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert wait_for(lambda: (out / "held").exists(), 30), script.poll()
        held = (out / "held").read_text().strip()
        helper = int((out / "helper").read_text())
        lease = queue.lease(held)
        assert (lease["pid"], lease["worker"]) == (helper, "helper"), lease
        # A live --pid holder: neither recover nor --reconcile touches its job.
        before = snapshot(queue.dir)
        for args in ((), ("--reconcile",)):
            r = queue.run("recover", *args)
            assert r.rc == 0, r
        assert snapshot(queue.dir) == before and queue.state(held) == "claimed"
        os.kill(helper, signal.SIGKILL)  # the process the script named is gone
        assert wait_for(lambda: not alive(helper), 10)
        r = queue.run("recover", "--json")
        assert r.rc == 0, r
        assert [e["job"] for e in r.json()["requeued"]] == [held], r
        assert queue.state(held) == "pending"

        (out / "go").touch()
        assert wait_for(lambda: (out / "holding").exists(), 30), script.poll()
        first = (out / "claimed").read_text().split()[0]
        lease = queue.lease(first)
        # J=$(ctx queue claim …) leases to the script's shell itself, renewed by renew.
        assert (lease["pid"], lease["worker"]) == (script.pid, "loop"), lease
        assert "renewed_at" in lease, lease
        left = rfc3339(lease["expires_at"]) - datetime.now(UTC)
        assert 60 < left.total_seconds() <= 120, lease
        before = snapshot(queue.dir)
        for args in ((), ("--reconcile",)):
            r = queue.run("recover", *args)
            assert r.rc == 0, r
        assert snapshot(queue.dir) == before and queue.state(first) == "claimed"
        (out / "go2").touch()
        _stdout, err = script.communicate(timeout=60)
    finally:
        if script.poll() is None:
            script.kill()
            script.communicate()
    assert script.returncode == 0, err
    assert (out / "rc").read_text().strip() == "3"  # claim's "nothing to claim"
    claimed = (out / "claimed").read_text().split()
    assert sorted(claimed) == sorted([*jobs, bad]), claimed  # each job once, the held one too
    for n, job in enumerate(claimed, start=1):
        res = result_of(queue, job)
        assert res["worker"]["id"] == "loop" and res["worker"]["pid"] == script.pid, res
        if job == bad:
            assert terminal_state(queue, job) == "failed"
            assert res["output"] == {"why": f"bad input {n}"}, res
        else:
            assert terminal_state(queue, job) == "done"
            assert res["output"] == {"n": n}, res
    assert rfc3339(result_of(queue, first)["started"]) == rfc3339(lease["claimed_at"])
    nothing_in_flight(queue)
    r = queue.run("claim")
    assert (r.rc, r.out) == (3, ""), r
    consistent_status(queue, pending=0, claimed=0, done=4, failed=1)
    converged(queue)


@needs_root
def test_a_hung_job_times_out_and_sigterm_lets_the_running_job_finish(space, outbox):
    """W-4, W-1, S-5, W-2: a user's worker (``--timeout 2 --json``) kills a hung job's process
    group and fails it with ETIMEDOUT, goes on to the next job; SIGTERM then lets that running
    job finish and the worker exits 0, claiming nothing more; another worker drains the rest."""
    queue = space
    hung = publish(queue, shell_job(f"sleep 30 & echo $! > {outbox}/bg; wait"), "a-hung")
    running = publish(queue, shell_job(f"touch {outbox}/b; sleep 1.5; echo b-finished"), "b-run")
    rest = [publish(queue, shell_job(f"echo {n} >> {outbox}/rest"), f"c-{n}") for n in range(2)]
    proc = work(queue, "builder", "--timeout", "2", "--worker", "w", "--session", "w")
    events = []
    with workers(proc):
        for line in proc.stdout:
            events.append(json.loads(line))
            if events[-1].get("event") == "claim" and events[-1]["job"] == running:
                break
        assert wait_for(lambda: (outbox / "b").exists(), 20)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    events += events_of(out)
    finish = [e for e in events if e.get("event") == "finish"]
    assert [(e["job"], e["state"]) for e in finish] == [(hung, "failed"), (running, "done")]
    assert 2 <= finish[0]["seconds"] < 10, finish[0]
    stop = events[-1]
    assert stop["event"] == "stop" and stop["stopped_by"] == "SIGTERM", stop
    assert (stop["done"], stop["failed"], stop["lost"]) == (1, 1, 0), stop

    res = result_of(queue, hung)
    assert res["error"]["error"] == "ETIMEDOUT" and "ETIMEDOUT" in res["reason"], res
    assert not alive(int((outbox / "bg").read_text()))  # its whole process group
    assert "b-finished" in json.dumps(result_of(queue, running)["output"])
    assert [queue.state(j) for j in rest] == ["pending", "pending"]  # it stopped claiming
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()
    events = session(queue.storage, "builder", "w")
    timed_out = [e for e in events if e.get("call") == res["call"]]
    assert [e["type"] for e in timed_out] == ["tool_call", "tool_result"], timed_out
    assert timed_out[1]["status"] == "error" and timed_out[1].get("errno") == "ETIMEDOUT"
    assert [e["state"] for e in events if e["type"] == "queue.finish"] == ["failed", "done"]

    drain = work(queue, "checker", "--drain", "--worker", "next")
    with workers(drain):
        out, err = drain.communicate(timeout=60)
    assert drain.returncode == 0, err
    assert sorted(finished_by(events_of(out))) == sorted(rest)
    assert sorted((outbox / "rest").read_text().split()) == ["0", "1"]
    nothing_in_flight(queue)
    consistent_status(queue, pending=0, claimed=0, done=3, failed=1)
    converged(queue)


def test_recover_beside_a_claim_and_a_finish_in_progress_calls_the_queue_consistent(queue, child):
    """Q-6, I-4, §2.4: a user runs recover while a claim is between its move and its lease and
    a finish between its result and its request (each holding ``claimed/J``'s lock, as on a
    slow disk).  Neither is a crash leftover (docs/queue.md: the claim locks ``claimed/J`` "so
    recover never mistakes the claim in progress for a crash leftover"): recover, plain or
    ``--reconcile``, changes nothing and exits 0; both commands then complete."""
    finishing = queue.publish(name="finishing")  # the older: claimed first
    claiming = queue.publish(name="claiming")
    assert queue.claim("--pid", str(child.pid)) == finishing
    env_args = ("-p", queue.project)
    claim = ctx_signalled_at("lease.write", "SIGSTOP", queue.storage, "queue", "claim",
                             *env_args)  # fmt: skip
    finish = ctx_signalled_at("finish.request", "SIGSTOP", queue.storage, "queue", "finish",
                              *env_args, finishing, "--ok")  # fmt: skip
    try:
        assert wait_for(lambda: stopped(claim) and stopped(finish), 30)
        assert (queue.dir / "claimed" / claiming / claiming).is_file()
        assert (queue.dir / "done" / f"{finishing}.result").is_file()
        before = snapshot(queue.dir)
        reconciled = queue.run("recover", "--reconcile", "--json")
        assert snapshot(queue.dir) == before
        assert reconciled.rc == 0, reconciled
        untouched = sorted(f["job"] for f in reconciled.json()["untouched"])
        assert untouched == sorted([claiming, finishing]), reconciled
        plain = queue.run("recover", "--json")
        assert snapshot(queue.dir) == before
        assert plain.rc == 0, plain
        assert plain.json()["incomplete"] == [] and plain.json()["consistent"], plain
    finally:
        said = {}
        for proc in (claim, finish):
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
            said[proc] = proc.communicate(timeout=60)
    assert claim.returncode == 0 and said[claim][0].strip() == claiming, said[claim]
    assert finish.returncode == 0, said[finish]
    assert queue.state(claiming) == "claimed" and queue.state(finishing) == "done"


LAZY = r"""
J=$(ctx queue claim -p "$P" --worker lazy --ttl 1)
echo "$J" > "$OUT/job"
until [ -e "$OUT/go" ]; do sleep 0.05; done
ctx queue renew -p "$P" "$J" 2> "$OUT/renew.err"
echo $? > "$OUT/renew.rc"
until [ -e "$OUT/go2" ]; do sleep 0.05; done
printf '{"by": "lazy"}' | ctx queue finish -p "$P" "$J" --ok - 2> "$OUT/finish.err"
echo $? > "$OUT/finish.rc"
"""


@needs_root
def test_a_shell_worker_that_lets_its_lease_expire_loses_the_job_to_a_real_worker(
    space, outbox, scratch
):
    """Q-5, I-3, I-4, §2.4: a script claims with ``--ttl 1`` and never renews in time.  Its
    lease expires while the script still runs, so recover requeues the job (an expired lease is
    proof), a ``ctx queue work`` worker runs it once; the script's late ``renew`` and ``finish``
    are refused (exit 1) and the worker's result stands."""
    queue = space
    job = publish(queue, shell_job(f"echo ran >> {outbox}/runs"), "lazy")
    out = scratch / "lazy"
    out.mkdir()
    env = env_for(queue.storage, OUT=str(out), P=queue.project)
    script = subprocess.Popen(["bash", "-c", LAZY], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert wait_for(lambda: (out / "job").exists(), 30), script.poll()
        assert (out / "job").read_text().strip() == job
        lease = queue.lease(job)
        assert (lease["pid"], lease["worker"]) == (script.pid, "lazy"), lease
        expiry = rfc3339(lease["expires_at"])
        assert (expiry - rfc3339(lease["claimed_at"])).total_seconds() == pytest.approx(1, 0.1)
        assert wait_for(lambda: datetime.now(UTC) > expiry, 10)
        assert alive(script.pid)  # the holder runs on; its lease has expired
        r = queue.run("recover", "--json")
        assert r.rc == 0, r
        assert [f["job"] for f in r.json()["requeued"]] == [job], r
        assert queue.state(job) == "pending"
        (out / "go").touch()
        assert wait_for(lambda: (out / "renew.rc").exists(), 30), script.poll()
        assert (out / "renew.rc").read_text().strip() == "1"
        assert "ENOENT" in (out / "renew.err").read_text()
        real = work(queue, "builder", "--drain", "--worker", "real")
        with workers(real):
            _out, err = real.communicate(timeout=60)
        assert real.returncode == 0, err
        (out / "go2").touch()
        _stdout, err = script.communicate(timeout=60)
    finally:
        if script.poll() is None:
            script.kill()
            script.communicate()
    assert script.returncode == 0, err
    assert (out / "finish.rc").read_text().strip() == "1"
    assert "EEXIST" in (out / "finish.err").read_text()
    res = result_of(queue, job)
    assert (res["status"], res["worker"]["id"]) == ("ok", "real"), res
    assert (outbox / "runs").read_text() == "ran\n"  # the script never ran it; the worker once
    nothing_in_flight(queue)
    converged(queue)


@needs_root
def test_ctrl_c_twice_aborts_a_busy_worker_and_recover_hands_its_jobs_on(space, outbox):
    """W-4, Q-5, S-2, docs/workers.md Signals: a first ^C stops claiming and lets the running
    jobs go on; a second aborts them: their tools are killed, the worker exits 130 without
    finishing them, the session records each killed call (EINTR, exit status 137).  recover
    then requeues both (their holder is gone) and another worker runs each once more."""
    queue = space
    jobs = [publish(queue, killable_job(outbox, f"long-{n}"), f"long-{n}") for n in range(2)]
    waiting = publish(queue, shell_job(f"echo w >> {outbox}/waiting"), "waiting")
    proc = work(queue, "builder", "--concurrency", "2", "--worker", "w", "--session", "intr")
    with workers(proc):
        both = lambda: all(_written(outbox / f"bg-long-{n}") for n in range(2))  # noqa: E731
        assert wait_for(both, 30), proc.poll()
        tools = [int((outbox / f"bg-long-{n}").read_text()) for n in range(2)]
        proc.send_signal(signal.SIGINT)
        first = [json.loads(proc.stdout.readline()) for _ in range(4)]  # start, 2 claims, ...
        assert first[-1]["event"] == "interrupt", first
        time.sleep(0.2)  # a person's second ^C
        assert proc.poll() is None and all(map(alive, tools))  # the jobs run on
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    stop = events_of(out)[-1]
    assert stop["event"] == "stop" and stop["aborted"] is True, stop
    assert (stop["done"], stop["failed"], stop["stopped_by"]) == (0, 0, "SIGINT"), stop
    assert wait_for(lambda: not any(map(alive, tools)), 10)
    assert [queue.state(j) for j in jobs] == ["claimed", "claimed"]
    assert queue.state(waiting) == "pending"
    killed = [e for e in session(queue.storage, "builder", "intr") if e["type"] == "tool_result"]
    assert [(e["errno"], e["stage"], e["exit_status"]) for e in killed] == [
        ("EINTR", "run", 137)
    ] * 2
    assert not any(e["type"] == "queue.finish" for e in session(queue.storage, "builder", "intr"))

    r = queue.run("recover", "--json")
    assert r.rc == 0, r
    assert sorted(f["job"] for f in r.json()["requeued"]) == sorted(jobs), r
    again = work(queue, "checker", "--drain", "--worker", "again")
    with workers(again):
        out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert finished_by(events_of(out)) == {jobs[0]: "done", jobs[1]: "done", waiting: "done"}
    for n in range(2):
        assert (outbox / f"runs-long-{n}").read_text() == "run\nrun\n"
    nothing_in_flight(queue)
    converged(queue)


@needs_root
def test_ctrl_c_twice_aborts_a_worker_whose_output_reader_lags(space, outbox):
    """W-4, docs/workers.md Signals: ``ctx queue work --json | less`` (a reader that stopped
    reading, so the pipe is full): the first ^C's notice waits for the reader, and a second
    ^C still aborts: the running tools are killed and the worker exits 130 at once."""
    queue = space
    jobs = [publish(queue, killable_job(outbox, f"j{n}", 6), f"j{n}") for n in range(2)]
    read_end, write_end = os.pipe()
    argv = [*CTX_ARGV, "queue", "work", "-p", queue.project, "--agent", "builder", "--json"]
    proc = subprocess.Popen([*argv, "--concurrency", "2"], env=env_for(queue.storage),
                            stdin=subprocess.DEVNULL, stdout=write_end,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    os.close(write_end)
    chunks: list[bytes] = []
    reader = threading.Thread(
        target=lambda: chunks.extend(iter(lambda: os.read(read_end, 1 << 16), b""))
    )
    try:
        # Both tools have written their pid (a file that exists may not hold it yet).
        both = lambda: all(_written(outbox / f"bg-j{n}") for n in range(2))  # noqa: E731
        assert wait_for(both, 30), proc.poll()
        tools = [int((outbox / f"bg-j{n}").read_text()) for n in range(2)]
        # The reader has stopped: fill the pipe through a description of its own (never the
        # worker's, whose blocking mode stays as it is).
        filler = os.open(f"/proc/self/fd/{read_end}", os.O_WRONLY | os.O_NONBLOCK)
        for size in (4096, 1):
            try:
                while True:
                    os.write(filler, b" " * size)
            except BlockingIOError:
                pass
        os.close(filler)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        reader.start()  # the reader comes back
        began = time.monotonic()
        err = proc.communicate(timeout=60)[1]
        elapsed = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if reader.ident is None:
            reader.start()
        reader.join(10)
        os.close(read_end)
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    assert elapsed < 3, elapsed  # aborted, not waited for
    assert wait_for(lambda: not any(map(alive, tools)), 5)
    assert [queue.state(j) for j in jobs] == ["claimed", "claimed"]  # for recover
