"""An operator's fleet of ``ctx queue work`` processes (SPEC §3 with §2 and §4): several workers
on the queues of two shared spaces at once, running as agents with different grants, a tool
with a vetoing pre-hook and a failing post-hook, jobs whose tool is missing or denied, a worker
restarted mid-stream, one worker stopped with SIGTERM and another with SIGKILL while the rest
go on, ``ctx queue recover`` run while live workers hold leases, and the books balanced at the
end: every published job finished once, its result and reason, its call once in one session."""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
    tool_manifest,
    wait_for,
)
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as other uids and the spaces have a group: needs root"
)

STAMP = "fleet.stamp"
RESULT_KEYS = {"status", "output", "worker", "started", "finished"}  # §2.1
S2_KEYS = {"ts", "type", "agent", "session", "object", "status"}  # S-2

# The tool the fleet's jobs call: it records who ran it for which tag, then answers in JSON.
STAMP_PROGRAM = """#!/bin/sh
in=$(cat)
tag=$(printf '%s' "$in" | jq -r .tag)
out=$(printf '%s' "$in" | jq -r .out)
echo "$CTX_AGENT $tag" >> "$out/stamps"
printf '{"stamped": "%s", "by": "%s"}\\n' "$tag" "$CTX_AGENT"
"""
# T-6: a guard that notes every call it is asked about and vetoes forbidden input ...
PRE_GUARD = """#!/bin/sh
in=$(cat)
printf '%s\\n' "$in" | jq -c --arg uid "$(id -u)" \
    '{call, agent, tag: .input.tag, uid: ($uid | tonumber)}' >> {out}/pre
if printf '%s' "$in" | jq -e '.input.forbidden == true' > /dev/null; then
    echo "guard: tag $(printf '%s' "$in" | jq -r .input.tag) is forbidden" >&2
    exit 3
fi
"""
# ... and a notifier that sees each result, then fails (its pager is down).
POST_NOTIFY = """#!/bin/sh
printf '%s\\n' "$(cat)" | jq -c '{call, tag: .input.tag, status: .result.status}' >> {out}/post
echo "notify: pager unreachable" >&2
exit 5
"""

# The processes of the first test, and the worker id (and session) each runs under: the
# auditor's two runs are one worker restarted.
WORKER_ID = {"wa1": "wa1", "wa2": "wa2", "wb": "wb", "audit1": "audit", "audit2": "audit"}

needs_jq = pytest.mark.skipif(
    not os.path.exists("/usr/bin/jq"), reason="the fleet's tool and hooks are jq scripts"
)

# ------------------------------------------------------------------------------ helpers


def env_for(storage: Path) -> dict[str, str]:
    path = f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return clean_env(CTX_STORAGE=str(storage), PATH=path)


def write_executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def stamp_job(tag: str, outbox: Path, **extra) -> dict:
    return {"tool": STAMP, "input": {"tag": tag, "out": str(outbox), **extra}}


def shell_job(cmd: str) -> dict:
    return {"tool": "shell.exec", "input": {"cmd": cmd}}


def publish(queue: QueueCLI, name: str, req: dict) -> str:
    r = queue.run("publish", "--name", name, "-", input=json.dumps(req))
    assert r.rc == 0 and r.lines() == [f"{name}.req.json"], r  # §2.4
    return r.out.strip()


def worker(
    queue: QueueCLI, agent: str, wid: str, *args: str, marker: str | None = None
) -> subprocess.Popen:
    """``ctx queue work --json`` with its own worker id and session (both ``wid``); ``marker``
    names a variable set in its environment, to find what it left running."""
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", agent, "--json"]
    argv += ["--worker", wid, "--session", wid, *args]
    return subprocess.Popen(
        argv,
        env={**env_for(queue.storage), **({marker: "1"} if marker else {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextmanager
def fleet() -> Iterator[list[subprocess.Popen]]:
    """A list the test adds its worker processes to; whatever still runs is killed after."""
    procs: list[subprocess.Popen] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


def ended(proc: subprocess.Popen, timeout: float = 60) -> list[dict]:
    """The worker's exit, and its JSON events; it must exit 0 with a ``stop`` summary last."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, (proc.args, proc.returncode, err)
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert events and events[0]["event"] == "start" and events[-1]["event"] == "stop", events
    assert "Traceback" not in err, err
    return events


def finishes(events: list[dict]) -> dict[str, str]:
    """Job -> the state the worker's ``finish`` events report (each job once)."""
    done = [(e["job"], e["state"]) for e in events if e["event"] == "finish"]
    assert len(done) == len(dict(done)), done
    return dict(done)


def terminal(queue: QueueCLI, job: str) -> tuple[str, dict]:
    """The one terminal state holding J's pair (I-1), and its §2.1 result."""
    d = queue.dir
    holders = [s for s in ("done", "failed") if (d / s / job).is_file()]
    results = [s for s in ("done", "failed") if (d / s / f"{job}.result").is_file()]
    assert holders == results and len(holders) == 1, (job, holders, results)
    for sub in ("pending", "claimed", "lease"):
        assert not (d / sub / job).exists(), (job, sub)
    res = json.loads((d / holders[0] / f"{job}.result").read_text())
    assert res.keys() >= RESULT_KEYS, res
    assert res["status"] == ("ok" if holders[0] == "done" else "error"), res
    assert rfc3339(res["started"]) <= rfc3339(res["finished"]), res
    return holders[0], res


def sessions(storage: Path) -> dict[str, list[dict]]:
    """Every worker session of the root (S-1), by its path relative to the root."""
    found = {}
    for path in storage.glob("home/*/agent/*/session/*/events.jsonl"):
        lines = path.read_text().splitlines()
        found[str(path.parent.relative_to(storage))] = [json.loads(x) for x in lines if x]
    return found


def calls_by_session(all_sessions: dict[str, list[dict]]) -> dict[str, dict[str, list[str]]]:
    """Call id -> session -> the types of its tool_call/tool_result events there."""
    calls: dict[str, dict[str, list[str]]] = {}
    for where, events in all_sessions.items():
        for event in events:
            assert event.keys() >= S2_KEYS, event
            if event["type"] in ("tool_call", "tool_result"):
                calls.setdefault(event["call"], {}).setdefault(where, []).append(event["type"])
    return calls


def queue_events(events: list[dict], job: str) -> list[dict]:
    return [e for e in events if e["object"] == f"queue/{job}"]


def status(queue: QueueCLI) -> dict:
    r = queue.run("status", "--json")
    assert r.rc == 0, r
    report = r.json()
    assert report["incomplete"] == [] and report["conflicts"] == [], report
    return report


def carriers(marker: str) -> list[int]:
    """Live processes whose environment holds ``marker``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if f"{marker}=1".encode() in environ.split(b"\0") and alive(int(entry)):
                pids.append(int(entry))
    return pids


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# ------------------------------------------------------------------------------ the fleet


@pytest.fixture
def fleet_root(
    searchable_storage: Path, outbox: Path, tmp_path: Path, unprivileged_user: UnprivilegedUser
) -> Path:
    """Spaces ``alpha`` and ``beta`` (``ctx shared create --group nogroup``), tool fleet.stamp
    installed (``ctx object install``) with a guard pre-hook and a failing post-hook, agent
    ``builder`` (nobody) granted shell.exec and fleet.stamp in both layers of P-6, agent
    ``auditor`` (the test user) holding both in its own policy but only shell.exec in the
    tools' policies: fleet.stamp's policy leaves it out."""
    storage = searchable_storage
    env = env_for(storage)
    group = str(pwd.getpwnam("nobody").pw_gid)
    for space in ("alpha", "beta"):
        r = ctx_run("shared", "create", space, "--group", group, env=env)
        assert r.rc == 0, r
    manifest = tool_manifest(tmp_path / "manifests", STAMP, STAMP_PROGRAM, side_effects=True)
    r = ctx_run("object", "install", manifest, "--tier", "system", env=env)
    assert r.rc == 0, r
    control = storage / "tool" / f"{STAMP}.d"
    write_executable(
        control / "hooks" / "pre.d" / "10-guard", PRE_GUARD.replace("{out}", str(outbox))
    )
    write_executable(
        control / "hooks" / "post.d" / "50-notify", POST_NOTIFY.replace("{out}", str(outbox))
    )
    agents = {
        "builder": ("nobody", {"alpha": ["read", "write"], "beta": ["read", "write"]}),
        "auditor": (unprivileged_user.name, {"beta": ["read", "write"]}),
    }
    for agent, (user, shared) in agents.items():
        req = tmp_path / f"{agent}.json"
        req.write_text(
            json.dumps(
                {
                    "name": agent,
                    "label": f"{agent}_t",
                    "tools": ["shell.exec", STAMP],
                    "shared": shared,
                }
            )
        )
        r = ctx_run("agent", "create", req, "--user", user, env=env)
        assert r.rc == 0, r
    with open(storage / "tool" / "shell.exec.d" / "policy", "a") as policy:
        policy.write("allow builder_t tool:shell.exec execute\n")
        policy.write("allow auditor_t tool:shell.exec execute\n")
    with open(control / "policy", "a") as policy:
        policy.write(f"allow builder_t tool:{STAMP} execute\n")
    return storage


@needs_jq
def test_two_spaces_two_agents_hooks_and_denials_every_job_once_in_its_session(
    fleet_root: Path, outbox: Path, unprivileged_user: UnprivilegedUser
):
    """W-1, W-3, T-6, P-5, P-6, S-2, S-5, T-7, Q-4, I-1: four workers on the queues of two
    spaces at once, as two agents with different grants, one of them restarted after
    ``--max-jobs``.  Each job ends once in done/ or failed/ with the reason the docs name
    (pre-hook veto, missing tool, agent policy, tool policy, exit status); a failing post-hook
    changes nothing but is recorded with the call; the guard is asked only about calls that
    passed the chain, as the agent; every job's call is in exactly one session, its worker's."""
    storage = fleet_root
    alpha, beta = QueueCLI(storage, "alpha"), QueueCLI(storage, "beta")
    nobody = pwd.getpwnam("nobody").pw_uid

    # What alpha's jobs are to end as: state, and errno/stage of a failure (docs/workers.md).
    expect_alpha: dict[str, tuple] = {}
    for n in range(6):
        expect_alpha[publish(alpha, f"stamp-{n}", stamp_job(f"a{n}", outbox))] = ("done",)
    vetoed = publish(alpha, "forbidden", stamp_job("secret", outbox, forbidden=True))
    expect_alpha[vetoed] = ("failed", "EACCES", "hook")
    missing = publish(alpha, "missing", {"tool": "no.such-tool", "input": {}})
    expect_alpha[missing] = ("failed", "ENOENT", "resolve")
    unlisted = publish(alpha, "unlisted", {"tool": "fs.list", "input": {"path": "/ctx"}})
    expect_alpha[unlisted] = ("failed", "EACCES", "authorize")
    exit4 = publish(alpha, "exit4", shell_job("echo broken pipe-line >&2; exit 4"))
    expect_alpha[exit4] = ("failed", None, "exit")

    # Beta, first shift: the auditor alone, told to stop after two jobs.
    first = [
        publish(beta, "audit-stamp", stamp_job("b-first", outbox)),
        publish(beta, "audit-shell", shell_job(f"id -u > {outbox}/auditor-uid")),
    ]
    with fleet() as procs:
        procs.append(worker(beta, "auditor", "audit", "--max-jobs", "2"))
        shift1 = ended(procs[0])
    assert finishes(shift1) == {first[0]: "failed", first[1]: "done"}, shift1
    assert shift1[-1]["done"] == 1 and shift1[-1]["failed"] == 1, shift1[-1]
    assert (outbox / "auditor-uid").read_text().split() == [str(unprivileged_user.uid)]

    # Second shift: beta gets more work and two workers (the auditor restarted, a builder),
    # while two builders drain alpha, all at once.
    rest = [publish(beta, f"b-stamp-{n}", stamp_job(f"b{n}", outbox)) for n in range(5)]
    rest += [publish(beta, f"b-shell-{n}", shell_job(f"echo b-shell-{n}")) for n in range(3)]
    with fleet() as procs:
        procs += [
            worker(alpha, "builder", "wa1", "--drain", "--concurrency", "2"),
            worker(alpha, "builder", "wa2", "--drain"),
            worker(beta, "builder", "wb", "--drain"),
            worker(beta, "auditor", "audit", "--drain"),
        ]
        out = {
            wid: ended(proc)
            for wid, proc in zip(("wa1", "wa2", "wb", "audit2"), procs, strict=True)
        }
    out["audit1"] = shift1
    reported = {wid: finishes(events) for wid, events in out.items()}
    for wid, events in out.items():
        stop = events[-1]
        assert stop["lost"] == 0 and stop["stopped_by"] is None, (wid, stop)
        assert stop["done"] + stop["failed"] == len(reported[wid]), (wid, stop)
    # W-3: no job reported by two workers; the fleet reported every published job.
    everyone = [job for by in reported.values() for job in by]
    assert len(everyone) == len(set(everyone)), reported
    assert sorted(everyone) == sorted([*expect_alpha, *first, *rest])
    assert set(reported["wa1"]) | set(reported["wa2"]) == set(expect_alpha)
    assert set(reported["wb"]) | set(reported["audit2"]) == set(rest)
    worker_of = {job: wid for wid, by in reported.items() for job in by}

    results = {}
    for queue, jobs in ((alpha, expect_alpha), (beta, [*first, *rest])):
        for job in jobs:
            state, res = terminal(queue, job)
            results[job] = res
            wid = worker_of[job]
            assert reported[wid][job] == state, (job, wid)
            assert res["worker"]["id"] == WORKER_ID[wid], (job, res["worker"])
        counts = status(queue)
        # published = done + failed, nothing left anywhere else.
        assert counts["done"] + counts["failed"] == len(jobs), counts
        assert counts["pending"] == counts["claimed"] == 0, counts
        for sub in ("pending", "claimed", "lease", "inbox"):
            assert queue.entries(sub) == set(), (queue.project, sub)

    # Alpha: each job's outcome and reason (W-1 "recording the reason").
    for job, (state, *why) in expect_alpha.items():
        res = results[job]
        assert terminal(alpha, job)[0] == state, (job, res)
        assert res["agent"] == "builder", res
        if state == "done":
            assert res["error"] is None and res["exit_status"] == 0, res
            assert res["output"] == {"stamped": job.split(".")[0].replace("stamp-", "a"),
                                     "by": "builder"}  # fmt: skip
            continue
        errno, stage = why
        assert res["error"]["error"] == errno and res["error"]["stage"] == stage, res
        assert res["reason"].endswith(f"[{stage}]"), res
    assert "hooks/pre.d/10-guard" in results[vetoed]["reason"], results[vetoed]
    assert "guard: tag secret is forbidden" in results[vetoed]["reason"], results[vetoed]
    assert results[vetoed]["exit_status"] is None and results[vetoed]["output"] is None
    assert results[unlisted]["error"]["step"] == 5, results[unlisted]  # the agent's policy
    assert results[exit4]["exit_status"] == 4 and results[exit4]["error"]["errno"] is None
    assert "broken pipe-line" in results[exit4]["reason"], results[exit4]

    # Beta: a fleet.stamp job is done when a builder took it, and refused by the tool's own
    # policy (step 6) when the auditor did; shell jobs are done whoever took them.
    for job in [*first, *rest]:
        res = results[job]
        took = "auditor" if worker_of[job].startswith("audit") else "builder"
        assert res["agent"] == took, (job, res)
        if results[job]["tool"] == "shell.exec" or took == "builder":
            assert terminal(beta, job)[0] == "done", (job, res)
        else:
            assert terminal(beta, job)[0] == "failed", (job, res)
            assert (res["error"]["error"], res["error"]["stage"]) == ("EACCES", "authorize")
            assert res["error"]["step"] == 6, res
            assert f"tool/{STAMP}.d/policy" in res["reason"], res

    # The tool ran once per done fleet.stamp job, as the builder, never for a refused call.
    stamped = {
        job for job, res in results.items() if res["tool"] == STAMP and res["status"] == "ok"
    }
    assert sorted(lines_of(outbox / "stamps")) == sorted(
        f"builder {results[job]['output']['stamped']}" for job in stamped
    )
    # T-6: the guard was asked about each call that passed the chain (done ones and the veto),
    # as the agent's uid, once; never about a call the policy had refused already.
    asked = [json.loads(line) for line in lines_of(outbox / "pre")]
    assert sorted(a["call"] for a in asked) == sorted(
        results[job]["call"] for job in [*stamped, vetoed]
    ), asked
    assert {(a["agent"], a["uid"]) for a in asked} == {("builder", nobody)}, asked
    # The failing post-hook saw each result of a call that ran, and changed none of them.
    seen = [json.loads(line) for line in lines_of(outbox / "post")]
    assert sorted(s["call"] for s in seen) == sorted(results[j]["call"] for j in stamped), seen
    assert {s["status"] for s in seen} == {"ok"}

    # S-2, S-5, T-7: every job's call is one tool_call and one tool_result, in the session of
    # the worker that finished it, between its queue.claim/start and its queue.finish.
    all_sessions = sessions(storage)
    calls = calls_by_session(all_sessions)
    assert len(calls) == len(results), (len(calls), len(results))
    for job, res in results.items():
        wid = WORKER_ID[worker_of[job]]
        uid = nobody if res["agent"] == "builder" else unprivileged_user.uid
        where = f"home/{uid}/agent/{res['agent']}/session/{wid}"
        assert res["session"] == where, res
        assert calls[res["call"]] == {where: ["tool_call", "tool_result"]}, (
            job,
            calls[res["call"]],
        )
        events = all_sessions[where]
        mine = queue_events(events, job)
        assert [e["type"] for e in mine] == ["queue.claim", "queue.start", "queue.finish"], mine
        assert (
            mine[0]["lease"]["worker"] == wid
            and mine[-1]["state"] == terminal(alpha if job in expect_alpha else beta, job)[0]
        ), mine
        call = [e for e in events if e.get("call") == res["call"]]
        order = [events.index(e) for e in (mine[1], call[0], call[1], mine[2])]
        assert order == sorted(order), (job, order)
        assert call[0]["object"] == f"tool/{res['tool']}", call
    # The post-hook's failure is recorded with the call (docs/tools.md: post_hooks).
    for job in stamped:
        where = results[job]["session"]
        result_event = next(
            e for e in all_sessions[where]
            if e["type"] == "tool_result" and e["call"] == results[job]["call"]
        )  # fmt: skip
        assert result_event["post_hooks"] == [
            {"hook": "hooks/post.d/50-notify", "exit_status": 5,
             "message": "notify: pager unreachable"}
        ], result_event  # fmt: skip
    # The restarted auditor appended to its session: two runs, one session, no job twice.
    audit = all_sessions[f"home/{unprivileged_user.uid}/agent/auditor/session/audit"]
    claimed = [e["object"] for e in audit if e["type"] == "queue.claim"]
    assert len(claimed) == len(set(claimed)) == len(reported["audit1"]) + len(reported["audit2"])
    log = (storage / "tool" / f"{STAMP}.d" / "log").read_text().splitlines()
    logged = [json.loads(line)["call"] for line in log if line]
    for job in [*stamped, vetoed]:
        assert logged.count(results[job]["call"]) == 1, (job, logged)


# ------------------------------------------------------------------------------ stop, kill


def hold_job(outbox: Path, tag: str) -> dict:
    """A job that notes each of its runs, then waits for ``go`` and answers its tag."""
    return shell_job(
        f"echo run >> {outbox}/runs-{tag}; echo $$ > {outbox}/pid-{tag}; "
        f"until [ -e {outbox}/go ]; do sleep 0.05; done; echo {tag}-finished"
    )


@needs_jq
def test_sigterm_and_sigkill_mid_stream_recover_beside_live_leases_and_a_restart(
    fleet_root: Path, outbox: Path
):
    """W-4, Q-5, I-3, I-4, W-3, S-5, W-2: three builders each hold a job; one is SIGKILLed
    (its tool dies with it), one gets SIGTERM (it finishes its job, claims nothing more,
    exits 0).  The killed worker is restarted under the same id and session and works new
    jobs, but never touches the dead claim; ``ctx queue recover`` run while live workers hold
    leases requeues only the dead one's job, leaving live leases byte for byte; the job runs
    once more, every other once.  Published = done + failed, and nothing runs again after."""
    storage = fleet_root
    queue = QueueCLI(storage, "alpha")
    holds = {publish(queue, f"hold-{n}", hold_job(outbox, f"h{n}")): f"h{n}" for n in range(3)}
    with fleet() as procs:
        marker = f"CTX_FLEET_TEST_{os.getpid()}_{time.monotonic_ns()}"
        procs += [worker(queue, "builder", "k", marker=marker)]
        procs += [worker(queue, "builder", wid) for wid in ("t", "l")]
        kill_me, term_me, live = procs
        started = lambda: all((outbox / f"pid-{t}").exists() for t in holds.values())  # noqa: E731
        assert wait_for(started, 30), [p.poll() for p in procs]
        holder = {queue.lease(job)["pid"]: job for job in holds}
        assert sorted(holder) == sorted(p.pid for p in procs), holder  # one job each
        dead_job, term_job, live_job = (holder[p.pid] for p in procs)
        dead_tool = int((outbox / f"pid-{holds[dead_job]}").read_text())

        kill_me.send_signal(signal.SIGKILL)
        kill_me.communicate(timeout=30)
        term_me.send_signal(signal.SIGTERM)
        assert wait_for(lambda: not alive(dead_tool), 10), "the killed worker's tool survived"
        # Nothing of the killed worker lingers (its tool, its orphan guard) beside the restart.
        assert wait_for(lambda: not carriers(marker), 10), carriers(marker)

        # The operator restarts the killed worker; new work arrives.  The restarted worker
        # takes the new jobs, never the old claim: nothing recovers it in the background.
        procs.append(worker(queue, "builder", "k", "--concurrency", "2"))
        restarted = procs[-1]
        quick = [publish(queue, f"quick-{n}", shell_job(f"echo q{n} >> {outbox}/quick"))
                 for n in range(5)]  # fmt: skip
        broken = publish(queue, "broken", shell_job("echo no-such-input >&2; exit 3"))
        settled = lambda: all(queue.state(j) in ("done", "failed") for j in [*quick, broken])  # noqa: E731
        assert wait_for(settled, 30), [queue.state(j) for j in [*quick, broken]]
        assert queue.state(dead_job) == "claimed" and queue.lease(dead_job)["pid"] == kill_me.pid
        assert term_me.poll() is None and live.poll() is None  # both still run their jobs
        assert lines_of(outbox / f"runs-{holds[dead_job]}") == ["run"]

        # Recover beside live leases: only the dead holder's job goes back.
        leases = {
            j: (queue.dir / "lease" / j / "worker").read_bytes() for j in (term_job, live_job)
        }
        r = queue.run("recover", "--json")
        assert r.rc == 0, r
        report = r.json()
        assert [x["job"] for x in report["requeued"]] == [dead_job], report
        assert report["consistent"] is True and report["conflicts"] == [], report
        for job, lease in leases.items():
            assert queue.state(job) == "claimed", job
            assert (queue.dir / "lease" / job / "worker").read_bytes() == lease, job
        # The restarted worker, the only one claiming, runs the requeued job again.
        rerun = lambda: len(lines_of(outbox / f"runs-{holds[dead_job]}")) == 2  # noqa: E731
        assert wait_for(rerun, 20), queue.state(dead_job)
        assert queue.lease(dead_job)["pid"] == restarted.pid

        (outbox / "go").touch()
        stopped = ended(term_me)
        assert wait_for(lambda: all(queue.state(j) == "done" for j in holds), 30)
        for proc in (live, restarted):
            proc.send_signal(signal.SIGTERM)
        by_live, by_restarted = ended(live), ended(restarted)

    # SIGTERM: the running job finished, nothing more claimed, exit 0 (W-4).
    assert finishes(stopped) == {term_job: "done"}, stopped
    assert [e["job"] for e in stopped if e["event"] == "claim"] == [term_job]
    assert stopped[-1]["stopped_by"] == "SIGTERM" and stopped[-1]["done"] == 1, stopped[-1]
    assert finishes(by_live) == {live_job: "done"}, by_live
    assert finishes(by_restarted) == {
        dead_job: "done",
        **{j: "done" for j in quick},
        broken: "failed",
    }, by_restarted

    # The books: published = done + failed, each job once, the killed one run twice.
    published = [*holds, *quick, broken]
    counts = status(queue)
    assert (counts["done"], counts["failed"]) == (len(published) - 1, 1), counts
    assert counts["pending"] == counts["claimed"] == 0, counts
    results = {job: terminal(queue, job)[1] for job in published}
    assert results[broken]["error"]["stage"] == "exit" and results[broken]["exit_status"] == 3
    assert "no-such-input" in results[broken]["reason"], results[broken]
    for job, tag in holds.items():
        assert f"{tag}-finished" in json.dumps(results[job]["output"]), results[job]
        assert lines_of(outbox / f"runs-{tag}") == ["run"] * (2 if job == dead_job else 1)
    assert sorted(lines_of(outbox / "quick")) == [f"q{n}" for n in range(5)]
    wid = {term_job: "t", live_job: "l", dead_job: "k", **{j: "k" for j in [*quick, broken]}}
    for job, res in results.items():
        assert res["worker"]["id"] == wid[job], (job, res["worker"])
    assert results[dead_job]["worker"]["pid"] == restarted.pid

    # Each finished call once, in its worker's session; the killed call's tool_call is in the
    # session "k" without a result; nothing else is unpaired.
    all_sessions = sessions(storage)
    calls = calls_by_session(all_sessions)
    nobody = pwd.getpwnam("nobody").pw_uid
    home = f"home/{nobody}/agent/builder/session"
    for job, res in results.items():
        assert res["session"] == f"{home}/{wid[job]}", res
        assert calls.pop(res["call"]) == {res["session"]: ["tool_call", "tool_result"]}, job
    assert list(calls.values()) == [{f"{home}/k": ["tool_call"]}], calls
    k_events = queue_events(all_sessions[f"{home}/k"], dead_job)
    assert [e["type"] for e in k_events] == [
        "queue.claim", "queue.start", "queue.claim", "queue.start", "queue.finish"
    ], k_events  # fmt: skip
    assert [e["lease"]["pid"] for e in k_events if e["type"] == "queue.claim"] == [
        kill_me.pid, restarted.pid
    ]  # fmt: skip

    # I-3: after finish nothing runs again: recover changes nothing, a drain finds no work.
    before = snapshot(queue.dir)
    for args in ((), ("--reconcile",)):
        r = queue.run("recover", "--json", *args)
        assert r.rc == 0 and r.json()["requeued"] == [], r
    assert snapshot(queue.dir) == before
    with fleet() as procs:
        procs.append(worker(queue, "builder", "late", "--drain"))
        late = ended(procs[0])
    assert finishes(late) == {} and late[-1]["done"] == late[-1]["failed"] == 0, late
    assert snapshot(queue.dir) == before
    for job, tag in holds.items():
        assert lines_of(outbox / f"runs-{tag}") == ["run"] * (2 if job == dead_job else 1)
