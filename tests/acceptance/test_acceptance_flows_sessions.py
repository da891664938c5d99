"""End-to-end flows of sessions and logs (SPEC §4 S-1 … S-6, T-7, W-1) while things run at
once: several ``ctx run`` processes and a ``ctx queue work`` worker recording into one session
under a ``ctx session tail --follow``, a caller killed in the middle of a call, two agents of
one shared space, and what the logs keep of secrets and long inputs."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    alive,
    clean_env,
    ctx_run,
    tool_manifest,
    wait_for,
)
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as other uids")

SPACE = "flow-space"
JOBS = "flow-jobs"

ECHO = """\
#!/bin/sh
if [ "$#" -gt 0 ]; then printf '%s\\n' "$*"; else cat; fi
"""

NAP = """\
#!/bin/sh
cat >/dev/null
sleep 30
echo '{"slept": true}'
"""

TOOLS = ["demo.echo", "demo.nap", "fs.list", "fs.read"]
AGENTS = ("alpha", "beta")


@dataclass
class World(OnStorage):
    storage: Path
    top: Path
    user: UnprivilegedUser

    def native(self, agent: str, tool: str, payload: dict, *options: str) -> Run:
        return self.ctx("run", "--agent", agent, *options, "--native", tool,
                        input=json.dumps(payload))  # fmt: skip

    def home_session(self, agent: str, session: str) -> Path:
        return self.storage / "home" / str(self.user.uid) / "agent" / agent / "session" / session

    def shared_session(self, agent: str, session: str) -> Path:
        return self.storage / "shared" / SPACE / "agent" / agent / "session" / session

    def tool_log(self, tool: str) -> list[dict]:
        path = self.storage / "tool" / f"{tool}.d" / "log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def policy(self, agent: str) -> Path:
        return self.storage / "agent" / f"{agent}.d" / "policy"


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    top = Path(tempfile.mkdtemp(prefix="cortexfs-flow-sessions-", dir="/tmp"))
    try:
        top.chmod(0o755)
        user = find_or_create_user()
        storage = top / "storage"
        env = clean_env(CTX_STORAGE=str(storage))
        assert ctx_run("bootstrap", "--storage", storage).rc == 0
        group = grp.getgrgid(user.gid).gr_name
        r = ctx_run("shared", "create", SPACE, "--group", group, env=env)
        assert r.rc == 0, r
        for name, program in (("demo.echo", ECHO), ("demo.nap", NAP)):
            r = ctx_run("object", "install", tool_manifest(top, name, program), "--tier", "system",
                        env=env)  # fmt: skip
            assert r.rc == 0, r
        for name in AGENTS:
            request = {"name": name, "label": f"{name}_t", "mount": [], "tools": TOOLS,
                       "shared": {SPACE: ["read", "write"]}}  # fmt: skip
            (top / f"{name}.json").write_text(json.dumps(request))
            r = ctx_run("agent", "create", "--user", user.name, top / f"{name}.json", env=env)
            assert r.rc == 0, r
            for tool in TOOLS:
                with (storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
                    policy.write(f"allow {name}_t tool:{tool} execute\n")
        yield World(storage, top, user)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def events_of(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-200:]
    return [json.loads(line) for line in data.decode().splitlines()]


def shown(world: World, *args: str) -> list[dict]:
    r = world.ctx("session", "show", *args, "--json")
    assert r.rc == 0, r
    return [json.loads(line) for line in r.lines()]


def pairs_of(events: list[dict]) -> dict[str, list[str]]:
    """Each call id and the types of its events, in the order they were recorded."""
    calls: dict[str, list[str]] = {}
    for event in events:
        if event["type"] in ("tool_call", "tool_result"):
            calls.setdefault(event["call"], []).append(event["type"])
    return calls


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


# ------------------------------------------------------------------ concurrency


def test_runs_in_both_modes_and_a_worker_record_into_one_followed_session(world):
    """S-2, S-5, T-7, W-1: native and terminal ``ctx run`` processes and a ``ctx queue work``
    worker record into one session at the same time while ``ctx session tail --follow --json``
    watches it; every ``tool_call`` gets its ``tool_result`` (same ``call``), no line is torn or
    lost, the watcher printed exactly what ``session show --json`` shows at the end, and the
    tool's ``log`` holds one line per result of that session."""
    session = "busy-mixed"
    assert world.native("alpha", "demo.echo", {"n": "first"}, "--session", session).rc == 0
    assert world.ctx("queue", "init", "--project", JOBS).rc == 0
    jobs = 4
    for i in range(jobs):
        req = {"tool": "demo.echo", "input": {"job": i, "pad": "j" * 900}, "from": "t",
               "created": "2026-06-22T12:00:00Z"}  # fmt: skip
        r = world.ctx("queue", "publish", "--project", JOBS, "--name", f"mix{i}", "-",
                      input=json.dumps(req))  # fmt: skip
        assert r.rc == 0, r

    watched = world.top / "watched-mixed.jsonl"
    with watched.open("wb") as out:
        tail = subprocess.Popen(
            [*CTX_ARGV, "session", "tail", "alpha", session, "-n", "1000", "--follow", "--json"],
            stdout=out, stderr=subprocess.DEVNULL, env=world.env, start_new_session=True,
        )  # fmt: skip
    procs: list[tuple[str, subprocess.Popen]] = []
    try:
        assert wait_for(lambda: len(watched.read_bytes().splitlines()) == 2, 15)
        base = [*CTX_ARGV, "run", "--agent", "alpha", "--session", session]
        worker = subprocess.Popen(
            [*CTX_ARGV, "queue", "work", "--project", JOBS, "--agent", "alpha",
             "--session", session, "--drain"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=world.env,
            start_new_session=True,
        )  # fmt: skip
        procs.append(("worker", worker))
        for i in range(4):
            payload = json.dumps({"i": i, "pad": chr(97 + i) * 3000}).encode()
            native = subprocess.Popen([*base, "--native", "demo.echo"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=world.env, start_new_session=True)  # fmt: skip
            procs.append((f"native{i}", native))
            native.stdin.write(payload)
            native.stdin.close()
            native.stdin = None
            term = subprocess.Popen([*base, "demo.echo", f"term{i}", "x" * 150],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=world.env,
                                    start_new_session=True)  # fmt: skip
            procs.append((f"term{i}", term))
        for name, proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, (name, out[-500:], err[-2000:])

        events_file = world.home_session("alpha", session) / "events.jsonl"
        final = events_of(events_file)  # every line whole JSON, the file ends with a newline
        assert shown(world, "alpha", session) == final
        assert wait_for(lambda: len(watched.read_bytes().splitlines()) >= len(final), 15)
        time.sleep(0.5)
        assert [json.loads(line) for line in watched.read_bytes().splitlines()] == final
    finally:
        stop(tail)
        for _, proc in procs:
            stop(proc)

    calls = pairs_of(final)
    total = 1 + 4 + 4 + jobs
    assert len(calls) == total, calls
    assert all(types == ["tool_call", "tool_result"] for types in calls.values()), calls
    modes = sorted(e["mode"] for e in final if e["type"] == "tool_call")
    assert modes.count("terminal") == 4, modes
    types = [e["type"] for e in final]
    assert any(t.startswith("queue.") for t in types), types
    for event in final:
        assert (event["agent"], event["session"]) == ("alpha", session), event
    logged = [e for e in world.tool_log("demo.echo") if e.get("session") == session]
    assert sorted(e["call"] for e in logged) == sorted(calls), logged
    assert all(e["type"] == "tool_result" for e in logged), logged
    assert {e["session_dir"] for e in logged} == {
        f"home/{world.user.uid}/agent/alpha/session/{session}"
    }


# ------------------------------------------------------------------ a caller killed mid-call


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                found.append(child)
                todo.append(child)
    return found


def sleeping(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"30"]
    except OSError:
        return False


def test_a_caller_killed_mid_call_leaves_whole_lines_and_the_session_goes_on(world):
    """S-2, S-5, T-7: ``ctx run`` SIGKILLed while its tool sleeps leaves the call's
    ``tool_call`` as a whole line and no result (nothing could record it), and no process of
    the call left running; ``session show``
    still reads the session, a torn line such a crash may leave is ignored by readers, cut by
    ``session repair`` (its size reported), and the next calls append whole paired lines."""
    session = "killed"
    assert world.native("alpha", "demo.echo", {"n": 0}, "--session", session).rc == 0
    events_file = world.home_session("alpha", session) / "events.jsonl"
    caller = subprocess.Popen(
        [*CTX_ARGV, "run", "--agent", "alpha", "--session", session, "--native", "demo.nap"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=world.env,
        start_new_session=True,
    )  # fmt: skip
    children: list[int] = []
    try:
        caller.stdin.write(b'{"why": "nap"}')
        caller.stdin.close()
        caller.stdin = None
        assert wait_for(lambda: len(events_file.read_bytes().splitlines()) == 3, 20)
        time.sleep(0.5)  # the tool is sleeping now
        children = descendants(caller.pid)
        sleepers = [pid for pid in children if sleeping(pid)]
        assert sleepers, children
        caller.send_signal(signal.SIGKILL)
        caller.wait(timeout=10)
        # No process of the call outlives its caller (docs/tools.md, "Process group").
        assert wait_for(lambda: not any(alive(pid) for pid in sleepers), 5), sleepers
    finally:
        stop(caller)
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
    events = events_of(events_file)
    assert [e["type"] for e in events] == ["tool_call", "tool_result", "tool_call"], events
    killed = events[-1]
    assert (killed["object"], killed["status"]) == ("tool/demo.nap", "ok"), killed
    assert shown(world, "alpha", session) == events
    assert not [e for e in world.tool_log("demo.nap") if e.get("call") == killed["call"]]

    fragment = b'{"ts":"2026-06-22T12:00:00Z","type":"tool_result","agent":"alpha","sess'
    with events_file.open("ab") as f:
        f.write(fragment)
    r = world.ctx("session", "show", "alpha", session)
    assert r.rc == 0 and "torn" in (r.out + r.err).lower(), r
    assert shown(world, "alpha", session) == events
    r = world.ctx("session", "repair", "alpha", session, "--json")
    assert r.rc == 0, r
    report = r.json()
    assert report["truncated_bytes"] == len(fragment), report
    assert report["session"] == f"home/{world.user.uid}/agent/alpha/session/{session}", report
    assert events_of(events_file) == events
    r = world.ctx("session", "repair", "alpha", session)
    assert r.rc == 0 and "nothing to do" in r.out, r

    assert world.native("alpha", "demo.echo", {"n": 1}, "--session", session).rc == 0
    assert world.ctx("run", "--agent", "alpha", "--session", session, "demo.echo", "t").rc == 0
    after = events_of(events_file)
    assert after[:3] == events
    calls = pairs_of(after[3:])
    assert len(calls) == 2 and all(t == ["tool_call", "tool_result"] for t in calls.values())


# ------------------------------------------------------------------ a shared space, two agents


def test_two_agents_of_a_space_keep_their_own_sessions_and_read_another_only_by_rule(world):
    """S-1, S-6, X-1: two agents recording a session of the same name in one shared space each
    get their own ``agent/<a>/session/<s>/``; in its view, a session of the space — the other
    agent's, and its own alike (a shared session is the chain's ``session:<name>``) — is
    neither listed nor readable until its policy holds ``session:<name> read``, then it is,
    holding exactly what ``ctx session show --project`` shows."""
    session = "sync"
    for agent in AGENTS:
        r = world.native(agent, "demo.echo", {"by": agent}, "--project", SPACE,
                         "--session", session)  # fmt: skip
        assert r.rc == 0, r
    for agent in AGENTS:
        events = events_of(world.shared_session(agent, session) / "events.jsonl")
        assert {e["agent"] for e in events} == {agent}, events
        assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
        assert shown(world, agent, session, "--project", SPACE) == events
        assert (world.shared_session(agent, session) / "events.jsonl").stat().st_mode & 0o777 == (
            0o660
        )
    other = f"/ctx/shared/{SPACE}/agent/alpha/session"
    own = f"/ctx/shared/{SPACE}/agent/beta/session"
    policy = world.policy("beta")
    kept = policy.read_text()
    try:
        for sessions in (other, own):
            listing = world.native("beta", "fs.list", {"path": sessions})
            assert listing.rc == 0, listing
            assert json.loads(listing.lines()[-1])["output"]["entries"] == [], listing
        denied = world.native("beta", "fs.read", {"path": f"{other}/{session}/events.jsonl"})
        assert denied.rc != 0 and "EACCES" in denied.out, denied
        policy.write_text(kept + f"allow beta_t session:{session} read\n")
        time.sleep(1.1)
        for sessions in (other, own):
            listing = world.native("beta", "fs.list", {"path": sessions})
            assert listing.rc == 0 and session in listing.out, listing
        read = world.native("beta", "fs.read", {"path": f"{other}/{session}/events.jsonl"})
        assert read.rc == 0, read
        frame = json.loads(read.lines()[-1])
        assert frame["session"] == f"home/{world.user.uid}/agent/beta/session/default", frame
        content = json.loads(read.lines()[-1])["output"]["content"]
        alpha_events = shown(world, "alpha", session, "--project", SPACE)
        assert [json.loads(line) for line in content.splitlines()] == alpha_events
    finally:
        policy.write_text(kept)
    # Reading it recorded beta's calls in beta's home session, never in alpha's.
    assert {e["agent"] for e in events_of(world.shared_session("alpha", session) /
                                          "events.jsonl")} == {"alpha"}  # fmt: skip


# ------------------------------------------------------------------ secrets and long inputs


def test_a_secret_and_a_long_string_are_summarised_alike_in_the_session_and_the_tool_log(world):
    """S-4, T-7: an input with a password-like field and a 5000-character string is recorded
    with the field ``[redacted]`` and the string cut to its first 200 characters with a note of
    what went, the same summary in the session's ``tool_call`` and the tool log's line, while
    the caller gets the output whole."""
    secret = "hunter2-Zq81-very-secret"
    long = "L" * 5000
    payload = {"user": "ana", "db_password": secret, "notes": long}
    session = "summaries"
    r = world.native("alpha", "demo.echo", payload, "--session", session)
    assert r.rc == 0, r
    assert json.loads(r.lines()[-1])["output"] == payload
    events = events_of(world.home_session("alpha", session) / "events.jsonl")
    call = next(e for e in events if e["type"] == "tool_call")
    summary = call["input"]
    assert summary["user"] == "ana" and summary["db_password"] == "[redacted]", summary
    assert summary["notes"].startswith("L" * 200) and "L" * 201 not in summary["notes"], summary
    assert summary["notes"] == "L" * 200 + "…[+4800 chars]", summary  # and how many went
    logged = [e for e in world.tool_log("demo.echo") if e.get("call") == call["call"]]
    assert len(logged) == 1 and logged[0]["input"] == summary, logged
    for text in (json.dumps(events), json.dumps(logged)):
        assert secret not in text and "L" * 201 not in text
    # Terminal mode: the same rule on the argv.
    r = world.ctx("run", "--agent", "alpha", "--session", session, "demo.echo",
                  "--password", secret, long)  # fmt: skip
    assert r.rc == 0 and secret in r.out, r
    events = events_of(world.home_session("alpha", session) / "events.jsonl")
    argv_call = [e for e in events if e["type"] == "tool_call"][-1]
    logged = [e for e in world.tool_log("demo.echo") if e.get("call") == argv_call["call"]]
    assert len(logged) == 1, logged
    for text in (json.dumps(argv_call), json.dumps(logged)):
        assert secret not in text and "L" * 201 not in text, text
    assert "--password" in json.dumps(argv_call["argv"]), argv_call


def test_repair_run_while_calls_record_never_cuts_a_line_in_flight(world):
    """S-5: ``ctx session repair`` run again and again while several ``ctx run`` processes
    append to the session takes the exclusive lock, so it never mistakes a line being written
    for a torn one: it truncates nothing, and every call keeps its two whole events."""
    session = "repaired-live"
    assert world.native("alpha", "demo.echo", {"n": "first"}, "--session", session).rc == 0
    base = [*CTX_ARGV, "run", "--agent", "alpha", "--session", session]
    procs = []
    try:
        for i in range(6):
            argv = [*base, "demo.echo", f"call{i}", chr(97 + i) * 20000]
            procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          env=world.env, start_new_session=True))  # fmt: skip
        reports = []
        while any(p.poll() is None for p in procs) or not reports:
            r = world.ctx("session", "repair", "alpha", session, "--json")
            assert r.rc == 0, r
            reports.append(r.json()["truncated_bytes"])
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err[-2000:]
    finally:
        for proc in procs:
            stop(proc)
    assert set(reports) == {0}, reports
    events = events_of(world.home_session("alpha", session) / "events.jsonl")
    calls = pairs_of(events)
    assert len(calls) == 7 and all(t == ["tool_call", "tool_result"] for t in calls.values())
