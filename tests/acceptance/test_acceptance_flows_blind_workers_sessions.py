"""SPEC §3 (workers) and §4 (sessions, logs and events) taken at their word, from a fresh
storage root and the command line only: ``ctx queue publish``/``work``/``recover``/``show``/
``list``/``status``, ``ctx object install`` and ``ctx session show``/``tail``/``list``/
``repair``.  Each flow runs a worker as agent ``ci`` and reads its jobs back twice: from the
queue's files and from the session the worker recorded them in."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    ROOT_ENTRIES,
    clean_env,
    ctx_run,
    find_values,
    request,
    rfc3339,
    tool_manifest,
    wait_for,
)
from tests.acceptance.workercli import (
    AGENT,
    allow_in_tool_policy,
    make_agent,
    result_of,
    shell_job,
    start_worker,
)
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root")

S2_KEYS = {"ts", "type", "agent", "session", "object", "status"}  # S-2, the minimal shape
RESULT_KEYS = {"status", "output", "worker", "started", "finished"}  # §2.1


# ------------------------------------------------------------------------------ helpers


def session_file(storage: Path, session: str) -> Path:
    """S-1: ``home/<uid>/agent/<agent>/session/<session>/events.jsonl`` (the agent's uid)."""
    found = list(storage.glob(f"home/*/agent/{AGENT}/session/{session}/events.jsonl"))
    assert len(found) == 1, found
    return found[0]


def events_in(path: Path) -> list[dict]:
    """Every line of an events file; each must be one whole JSON object (S-5)."""
    events = []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        assert isinstance(event, dict), line
        events.append(event)
    return events


def shown(storage: Path, *args: str) -> list[dict]:
    """``ctx session show ci ARGS --json``: the events as stored, one object a line."""
    r = ctx_run("session", "show", AGENT, *args, "--json", env=clean_env(CTX_STORAGE=str(storage)))
    assert r.rc == 0, r
    return [json.loads(line) for line in r.lines()]


def check_minimal_shape(events: list[dict], session: str) -> None:
    """S-2: ts (RFC 3339 in UTC, as the example writes it), type, agent, session, object,
    status on every event; the worker's agent and the session's own name."""
    assert events
    for event in events:
        assert event.keys() >= S2_KEYS, event
        assert event["ts"].endswith("Z"), event
        rfc3339(event["ts"].replace("Z", "+00:00"))
        assert (event["agent"], event["session"]) == (AGENT, session), event
        assert isinstance(event["object"], str) and event["object"], event


def about(event: dict, job: str) -> bool:
    return job in json.dumps(event)


def of_kind(events: list[dict], word: str) -> list[dict]:
    """Queue events whose type names the step ``word`` (claim, finish)."""
    return [e for e in events if word in e["type"] and not e["type"].startswith("tool")]


def says(res: dict, *words: str) -> bool:
    text = json.dumps(res).lower()
    return any(word.lower() in text for word in words)


# ------------------------------------------------------------------------------ the flows


def test_a_requeued_job_is_taken_first_and_the_session_replays_both_runs(
    storage, queue, agent, outbox
):
    """Q-3, Q-5, Q-9, W-1, W-2, S-1, S-2, S-3: a worker SIGKILLed while it runs ``zz-first``
    leaves it claimed; ``recover`` puts it back keeping its publish time, so ``list --state
    pending`` and the next ``--drain`` take it before three younger jobs whose names sort
    first.  The session (one directory, shared by both runs) holds both claims and each
    finished job's call between its claim and its finish, as ``ctx session show`` prints it;
    the root still has only its six entries (no ``audit/``)."""
    started = outbox / "started"
    hold = (
        f"if [ -e {started} ]; then echo again; else echo $$ > {started}; "
        f"until [ -e {outbox}/go ]; do sleep 0.05; done; fi"
    )
    first = queue.publish(shell_job(hold), name="zz-first")
    crashed = start_worker(queue, "--session", "order", "--worker", "crashed")
    try:
        assert wait_for(lambda: started.exists() and started.read_text().strip(), 20)
        assert queue.state(first) == "claimed"
        assert queue.lease(first)["worker"] == "crashed"  # the lease names its holder
    finally:
        crashed.kill()
        crashed.communicate()
    try:
        later = [queue.publish(shell_job(f"echo {n}"), name=n) for n in ("yy", "mm", "aa")]
        r = queue.run("recover")
        assert r.rc == 0, r
        assert queue.state(first) == "pending"
        listed = queue.run("list", "--state", "pending")
        assert listed.rc == 0 and listed.lines() == [first, *later], listed
        (outbox / "go").touch()
        r = queue.run(
            "work", "--agent", AGENT, "--drain", "--session", "order", "--worker", "second"
        )
        assert r.rc == 0, r
    finally:
        (outbox / "go").touch()  # whatever of the first run may still wait, ends by itself
    jobs = [first, *later]
    assert [queue.state(j) for j in jobs] == ["done"] * 4
    assert "again" in json.dumps(result_of(queue, first)["output"])

    path = session_file(storage, "order")
    assert path.parent.is_dir() and not path.parent.is_symlink() and path.is_file()  # S-1
    events = events_in(path)
    check_minimal_shape(events, "order")
    assert shown(storage, "order") == events
    claims = of_kind(events, "claim")
    claimed = [next(j for j in jobs if about(e, j)) for e in claims]
    assert claimed == [first, *jobs], claimed  # the crashed run's claim, then Q-9 order
    assert sum(e["type"] == "tool_result" for e in events) == 4
    for job in jobs:
        last_claim = max(events.index(e) for e in claims if about(e, job))
        finishes = [events.index(e) for e in of_kind(events, "finish") if about(e, job)]
        assert len(finishes) == 1, (job, finishes)
        between = [e["type"] for e in events[last_claim + 1 : finishes[0]]]
        assert [t for t in between if t.startswith("tool")] == ["tool_call", "tool_result"]
        assert events[finishes[0]]["status"] == "ok", events[finishes[0]]
    r = ctx_run("session", "list", AGENT, "--json", env=clean_env(CTX_STORAGE=str(storage)))
    assert r.rc == 0, r
    assert {"name": "order", "path": str(path.parent)} in r.json(), r
    assert set(os.listdir(storage)) == ROOT_ENTRIES  # R-2, S-3: logs live with their objects


def test_a_waiting_worker_takes_a_batch_in_line_order_and_stops_on_sigterm(storage, queue, agent):
    """W-2, Q-9, W-4, §2.4, S-2, S-5: a worker started without ``--drain`` waits; a batch
    published meanwhile (``publish --batch -`` prints each J) is run in its line order, as the
    worker's ``--json`` events and the session both show; SIGTERM then ends it with exit 0, and
    ``ctx session tail -n`` prints the session's last events as stored."""
    proc = start_worker(queue, "--json", "--session", "waiting")
    try:
        first = json.loads(proc.stdout.readline())
        assert first["event"] == "start", first
        lines = [3, 1, 4, 1.5, 9, 2.6]
        batch = "".join(json.dumps(shell_job(f"echo line-{n}")) + "\n" for n in lines)
        r = queue.run("publish", "--batch", "-", input=batch)
        assert r.rc == 0, r
        names = r.lines()
        assert len(names) == len(set(names)) == len(lines), r
        assert wait_for(lambda: all(queue.state(j) == "done" for j in names), 20)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    reported = [json.loads(line) for line in out.splitlines()]
    claimed = [e["job"] for e in reported if e["event"] == "claim"]
    assert claimed == names, reported
    for job, n in zip(names, lines, strict=True):
        assert result_of(queue, job)["output"] == f"line-{n}\n"
    events = events_in(session_file(storage, "waiting"))
    check_minimal_shape(events, "waiting")
    order = [next(j for j in names if about(e, j)) for e in of_kind(events, "claim")]
    assert order == names
    outputs = [e.get("output") for e in events if e["type"] == "tool_result"]
    assert outputs == [f"line-{n}\n" for n in lines]
    env = clean_env(CTX_STORAGE=str(storage))
    tail = ctx_run("session", "tail", AGENT, "waiting", "-n", "3", "--json", env=env)
    assert tail.rc == 0, tail
    assert [json.loads(line) for line in tail.lines()] == events[-3:]


def test_requests_move_by_rename_with_the_publishers_fields_and_show_names_the_pair(
    storage, queue, agent
):
    """§2.1, Q-2, Q-4, §2.4, W-1: the worker moves the very request file that was published
    (same inode, same bytes, the publisher's extra fields kept and not in the way) from
    ``pending/`` to ``done/J`` or ``failed/J`` beside a §2.1 result; ``ctx queue show J``
    names exactly that pair, ``list`` and ``status`` agree, and the session's finish events
    say the same state as the disk."""
    extra = {"priority": 7, "reply_to": "ops@example", "labels": ["nightly", "é"]}
    ok = queue.publish(shell_job("echo fine", **extra), name="ok")
    bad = queue.publish(shell_job("echo broken >&2; exit 4", **extra), name="bad")
    before = {}
    for job in (ok, bad):
        path = queue.dir / "pending" / job
        before[job] = (path.stat().st_ino, path.read_bytes())
        assert json.loads(before[job][1]).items() >= extra.items()
    r = queue.run("work", "--agent", AGENT, "--drain", "--session", "moves")
    assert r.rc == 0, r
    for job, state in ((ok, "done"), (bad, "failed")):
        moved = queue.dir / state / job
        assert (moved.stat().st_ino, moved.read_bytes()) == before[job], job
        res = result_of(queue, job)
        assert res.keys() >= RESULT_KEYS, res
        assert res["status"] == ("ok" if state == "done" else "error"), res
        assert rfc3339(res["started"]) <= rfc3339(res["finished"])
        show = queue.run("show", job, "--json")
        assert show.rc == 0, show
        paths = {p for p in find_values(show.json(), "path") if isinstance(p, str)}
        assert {f"{state}/{job}", f"{state}/{job}.result"} <= paths, show
        assert not {p for p in paths if p.split("/")[0] in ("pending", "claimed", "lease")}
        listed = queue.run("list", "--state", state)
        assert listed.rc == 0 and listed.lines() == [job], listed
    assert says(result_of(queue, bad), "broken")  # W-1: the reason is recorded
    status = queue.run("status", "--json")
    assert status.rc == 0, status
    counts = status.json()["counts"]
    assert (counts["pending"], counts["claimed"], counts["done"], counts["failed"]) == (0, 0, 1, 1)
    events = events_in(session_file(storage, "moves"))
    check_minimal_shape(events, "moves")
    for job, state in ((ok, "done"), (bad, "failed")):
        finishes = [e for e in of_kind(events, "finish") if about(e, job)]
        assert len(finishes) == 1 and state in json.dumps(finishes[0]), finishes
        assert finishes[0]["status"] == ("ok" if state == "done" else "error"), finishes


def test_the_tool_gets_its_input_whole_while_session_and_logs_keep_only_facts(
    storage, queue, outbox, tmp_path
):
    """W-1, S-4, S-3, T-7, T-8: a tool installed with ``ctx object install`` and granted in
    both policies gets a job's input exactly (secrets, a long text, non-ASCII, a 20-digit
    number) and its output is the job's result; the worker's session, the tool's log and the
    agent's log record the call (facts) without the whole secrets or the long text."""
    tool = "echo.input"
    manifest = tool_manifest(tmp_path / "manifests", tool, "#!/bin/sh\ncat\n")
    env = clean_env(CTX_STORAGE=str(storage))
    r = ctx_run("object", "install", manifest, "--tier", "system", env=env)
    assert r.rc == 0, r
    make_agent(storage, ["shell.exec", tool])
    allow_in_tool_policy(storage, tool)
    password, token = "hunter2-Horse-Battery-77", "ghp_" + "Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2Rr1Qq0Pp9Oo8"
    long_text = "".join(f"{n:05d}" for n in range(4000))  # 20 000 characters, never repeating
    payload = {
        "user": "ana",
        "password": password,
        "headers": {"Authorization": f"Bearer {token}"},
        "notes": long_text,
        "city": "Zürich ✓",
        "big": 12345678901234567890,
    }
    job = queue.publish(request(tool, input=payload), name="whole-input")
    r = queue.run("work", "--agent", AGENT, "--drain", "--session", "facts")
    assert r.rc == 0, r
    res = result_of(queue, job)
    assert res["status"] == "ok", res
    assert res["output"] == payload  # W-1: "with its input"; §2.1 the tool's output
    session = session_file(storage, "facts")
    events = events_in(session)
    check_minimal_shape(events, "facts")
    calls = [e for e in events if e["type"] in ("tool_call", "tool_result")]
    assert [(e["type"], e["object"]) for e in calls] == [
        ("tool_call", f"tool/{tool}"),
        ("tool_result", f"tool/{tool}"),
    ], calls
    assert calls[-1]["status"] == "ok"
    logs = {
        "session": session,
        "tool log": storage / "tool" / f"{tool}.d" / "log",
        "agent log": storage / "agent" / f"{AGENT}.d" / "log",
    }
    assert logs["tool log"].stat().st_size > 0  # T-7
    for what, path in logs.items():
        text = path.read_text()
        assert password not in text and token not in text, what
        assert long_text[:500] not in text and long_text[-500:] not in text, what
    assert "ana" in session.read_text()  # the facts stay


def test_every_way_a_job_fails_is_failed_with_its_reason_and_recorded_as_a_call(
    storage, queue, agent
):
    """W-1, W-4, S-2, T-7: in one drain, a job that succeeds, one that exits 5, one that
    outlives ``--timeout 1``, one whose tool the agent's policy does not grant and one whose
    tool does not exist end in ``done/``/``failed/`` with the reason; the session has a finish
    for each with the disk's state, every call that ran is a ``tool_call``/``tool_result``
    pair with an error status when it failed, and the tool's log holds the same results."""
    jobs = {
        queue.publish(shell_job("echo fine"), name="a-ok"): ("done", ()),
        queue.publish(shell_job("echo nope >&2; exit 5"), name="b-exit5"): (
            "failed",
            ("status 5", "exit 5", "exited 5", '"exit_status": 5'),
        ),
        queue.publish(shell_job("sleep 30"), name="c-slow"): (
            "failed",
            ("ETIMEDOUT", "timed out", "timeout"),
        ),
        queue.publish(request("fs.list", input={"path": "/"}), name="d-denied"): (
            "failed",
            ("EACCES",),
        ),
        queue.publish(request("no.such-tool", input={}), name="e-missing"): (
            "failed",
            ("ENOENT", "EACCES"),
        ),
    }
    r = queue.run("work", "--agent", AGENT, "--drain", "--timeout", "1", "--session", "fails")
    assert r.rc == 0, r  # a job's failure is not the worker's
    for job, (state, words) in jobs.items():
        assert queue.state(job) == state, (job, r)
        res = result_of(queue, job)
        assert res.keys() >= RESULT_KEYS, res
        if words:
            assert says(res, *words), (job, res)
    assert queue.entries("claimed") == queue.entries("lease") == set()

    events = events_in(session_file(storage, "fails"))
    check_minimal_shape(events, "fails")
    for job, (state, _) in jobs.items():
        finishes = [e for e in of_kind(events, "finish") if about(e, job)]
        assert len(finishes) == 1 and state in json.dumps(finishes[0]), (job, finishes)
    results = [e for e in events if e["type"] == "tool_result"]
    shell = sorted(e["status"] for e in results if e["object"] == "tool/shell.exec")
    assert shell == ["error", "error", "ok"], results
    calls = [e for e in events if e["type"] == "tool_call"]
    assert len(calls) == len(results)
    for call in calls:  # each call has its result, with the same object, after it
        later = events[events.index(call) + 1 :]
        assert any(e["type"] == "tool_result" and e["object"] == call["object"] for e in later)
    denied = [e for e in results if e["object"] == "tool/fs.list"]
    assert [e["status"] for e in denied] == ["error"], results
    log = events_in(storage / "tool" / "shell.exec.d" / "log")
    logged = sorted(e["status"] for e in log if e.get("session") == "fails")
    assert logged.count("error") == 2 and "ok" in logged, log


def test_a_worker_appending_after_a_torn_tail_loses_no_whole_event(storage, queue, agent):
    """S-5, S-1, W-1: a session whose last line was torn by a crash is read without it
    (``show`` says so); a worker recording into that session afterwards neither glues its
    first event onto the fragment nor loses one: ``show --json`` gives the earlier events and
    the new ones, every line whole, and ``repair`` leaves nothing to cut."""
    env = clean_env(CTX_STORAGE=str(storage))
    first = queue.publish(shell_job("echo before"), name="before")
    assert queue.run("work", "--agent", AGENT, "--drain", "--session", "torn").rc == 0
    path = session_file(storage, "torn")
    earlier = events_in(path)
    fragment = b'{"ts":"2026-06-22T12:00:00Z","type":"tool_result","agent":"ci","sess'
    with path.open("ab") as f:
        f.write(fragment)
    r = ctx_run("session", "show", AGENT, "torn", env=env)
    assert r.rc == 0 and "torn" in (r.out + r.err).lower(), r
    assert shown(storage, "torn") == earlier

    second = queue.publish(shell_job("echo after"), name="after")
    assert queue.run("work", "--agent", AGENT, "--drain", "--session", "torn").rc == 0
    assert queue.state(first) == queue.state(second) == "done"
    data = path.read_bytes()
    assert data.endswith(b"\n")
    whole = []
    for line in data.splitlines():
        with contextlib.suppress(ValueError):
            whole.append(json.loads(line))
            continue
        assert line == fragment, line  # only the crash's own fragment may be left, unglued
    assert whole[: len(earlier)] == earlier
    added = whole[len(earlier) :]
    check_minimal_shape(added, "torn")
    assert any(e["type"] == "tool_result" and e.get("output") == "after\n" for e in added)
    assert [e for e in of_kind(added, "finish") if about(e, second)], added
    assert shown(storage, "torn") == whole
    r = ctx_run("session", "repair", AGENT, "torn", "--json", env=env)
    assert r.rc == 0 and r.json()["truncated_bytes"] == 0, r
