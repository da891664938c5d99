"""Acceptance tests of SPEC §4 (sessions, logs and events: S-1 … S-6) and T-7 (tool calls
logged to ``tool/<name>.d/log`` and to the session's ``events.jsonl``), run against the
installed ``ctx``: real agents running as real uids, real tool calls through ``ctx run`` and
``ctx queue work``, and ``ctx session show|tail|repair|list`` on what they leave behind."""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    ROOT_ENTRIES,
    OnStorage,
    Run,
    clean_env,
    ctx_run,
    rfc3339,
    tool_manifest,
)
from tests.support.strace import trace_lines
from tests.support.users import UnprivilegedUser, access_as, find_or_create_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as other uids")

S2_KEYS = ["ts", "type", "agent", "session", "object", "status"]
SPACE = "project-a"

ECHO = """\
#!/bin/sh
# Native mode: the JSON input arrives on stdin and is printed back; terminal mode: the argv.
if [ "$#" -gt 0 ]; then printf '%s\\n' "$*"; else cat; fi
"""

FAIL = """\
#!/bin/sh
echo "demo.fail: could not reach the build server" >&2
exit 3
"""


@dataclass
class World(OnStorage):
    """A storage root every uid may search, with agents and tools ready to be called."""

    storage: Path
    top: Path
    user: UnprivilegedUser
    nobody: int

    def native(self, agent: str, tool: str, payload: dict, *options: str) -> Run:
        return self.ctx("run", "--agent", agent, *options, "--native", tool,
                        input=json.dumps(payload))  # fmt: skip

    def home_session(self, agent: str, session: str = "default", uid: int | None = None) -> Path:
        uid = self.user.uid if uid is None else uid
        return self.storage / "home" / str(uid) / "agent" / agent / "session" / session

    def shared_session(self, agent: str, session: str) -> Path:
        return self.storage / "shared" / SPACE / "agent" / agent / "session" / session

    def tool_log(self, tool: str) -> Path:
        return self.storage / "tool" / f"{tool}.d" / "log"


AGENTS = {
    # name: (runs as the test user?, its request's tools and shared spaces)
    "coder": (True, {"tools": ["demo.echo", "demo.fail", "shell.exec", "fs.read"]}),
    "builder": (True, {"tools": ["demo.echo"], "shared": {SPACE: ["read", "write"]}}),
    "reader": (True, {"tools": ["demo.echo", "fs.read"], "shared": {SPACE: ["read"]}}),
    "stranger": (True, {"tools": ["demo.echo", "fs.read"]}),
    "outsider": (False, {"tools": ["demo.echo", "fs.read"], "shared": {SPACE: ["read", "write"]}}),
}


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    """One world for the module (an agent's mount control names its storage root's real path,
    so a root cannot be copied per test); each test records in sessions of its own."""
    top = Path(tempfile.mkdtemp(prefix="cortexfs-sessions-", dir="/tmp"))
    try:
        top.chmod(0o755)
        user = find_or_create_user()
        storage = top / "storage"
        env = clean_env(CTX_STORAGE=str(storage))
        assert ctx_run("bootstrap", "--storage", storage).rc == 0
        group = grp.getgrgid(user.gid).gr_name
        r = ctx_run("shared", "create", SPACE, "--group", group, env=env)
        assert r.rc == 0, r
        for name, program in (("demo.echo", ECHO), ("demo.fail", FAIL)):
            r = ctx_run("object", "install", tool_manifest(top, name, program), "--tier", "system",
                        env=env)  # fmt: skip
            assert r.rc == 0, r
        for name, (as_user, grants) in AGENTS.items():
            request = {"name": name, "label": f"{name}_t", "mount": [], **grants}
            (top / f"{name}.json").write_text(json.dumps(request))
            who = ["--user", user.name] if as_user else []
            r = ctx_run("agent", "create", *who, top / f"{name}.json", env=env)
            assert r.rc == 0, r
            for tool in grants["tools"]:  # P-6: the tool's own policy is the second layer
                with (storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
                    policy.write(f"allow {name}_t tool:{tool} execute\n")
        yield World(storage, top, user, pwd.getpwnam("nobody").pw_uid)
    finally:
        shutil.rmtree(top)


def events_of(path: Path) -> list[dict]:
    """Every line of an events file, each of which must be one whole JSON object."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-200:]
    return [json.loads(line) for line in data.decode().splitlines()]


def assert_s2_shape(event: dict, agent: str, session: str) -> None:
    assert list(event)[:6] == S2_KEYS, event
    assert rfc3339(event["ts"].replace("Z", "+00:00")).utcoffset().total_seconds() == 0, event
    assert (event["agent"], event["session"]) == (agent, session), event


# ------------------------------------------------------------------ S-1: where sessions live


def test_s1_a_tool_call_records_in_an_ordinary_home_session_directory(world):
    """S-1, R-4: ``home/<uid>/agent/<agent>/session/<session>/`` is an ordinary directory
    holding ``events.jsonl``; the session named by ``--session`` (else ``default``)."""
    assert world.native("coder", "demo.echo", {"n": 1}).rc == 0
    assert world.native("coder", "demo.echo", {"n": 2}, "--session", "review-1").rc == 0
    for name in ("default", "review-1"):
        session = world.home_session("coder", name)
        assert stat.S_ISDIR(session.lstat().st_mode), session
        assert stat.S_ISREG((session / "events.jsonl").lstat().st_mode)
        assert events_of(session / "events.jsonl")
    # Every component on the way is a real directory, none a link.
    for part in [*world.home_session("coder").relative_to(world.storage).parents][:-1]:
        assert stat.S_ISDIR((world.storage / part).lstat().st_mode), part


def test_s1_a_call_in_a_shared_space_records_in_its_shared_session(world):
    """S-1, X-1: ``shared/<name>/agent/<agent>/session/<session>/events.jsonl``."""
    r = world.native("builder", "demo.echo", {"n": 1}, "--project", SPACE, "--session", "s1")
    assert r.rc == 0, r
    session = world.shared_session("builder", "s1")
    assert stat.S_ISDIR(session.lstat().st_mode)
    events = events_of(session / "events.jsonl")
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    assert not world.home_session("builder", "s1").exists()  # recorded there, not in the home


# ------------------------------------------------------------------ S-2: event shape


def test_s2_a_tool_call_is_a_tool_call_and_a_tool_result_event_of_the_minimal_shape(world):
    """S-2: every event has ``ts`` (RFC 3339), ``type``, ``agent``, ``session``, ``object``
    and ``status``; a tool call is recorded as ordinary ``tool_call``/``tool_result`` events,
    ``object`` being ``tool/<name>``."""
    r = world.native("coder", "demo.echo", {"path": "README.md"}, "--session", "s2")
    assert r.rc == 0, r
    events = events_of(world.home_session("coder", "s2") / "events.jsonl")
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    for event in events:
        assert_s2_shape(event, "coder", "s2")
        assert event["object"] == "tool/demo.echo"
        assert event["status"] == "ok"
    assert rfc3339(events[0]["ts"]) <= rfc3339(events[1]["ts"])


def test_s2_a_terminal_mode_call_is_recorded_the_same_way(world):
    """S-2, T-3: both invocation modes are tool calls, recorded alike."""
    r = world.ctx("run", "--agent", "coder", "--session", "term", "demo.echo", "hello")
    assert (r.rc, r.out) == (0, "hello\n"), r
    events = events_of(world.home_session("coder", "term") / "events.jsonl")
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    for event in events:
        assert_s2_shape(event, "coder", "term")
        assert (event["object"], event["status"]) == ("tool/demo.echo", "ok")


def test_s2_a_failed_call_is_a_tool_result_with_status_error(world):
    """S-2, S-4: logs record errors: a tool that exits non-zero leaves a ``tool_result``
    whose status is not ``ok``."""
    r = world.native("coder", "demo.fail", {}, "--session", "bad")
    assert r.rc == 1, r
    events = events_of(world.home_session("coder", "bad") / "events.jsonl")
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    assert events[-1]["status"] == "error", events
    assert_s2_shape(events[-1], "coder", "bad")


def test_s2_a_refused_call_is_recorded_too(world):
    """S-2 (history is auditable), P-5 (the decision records which step denied): a call the
    authority chain refuses is still a recorded call, with status error."""
    r = world.native("stranger", "shell.exec", {"cmd": "id"}, "--session", "refused")
    assert r.rc == 1, r
    events = events_of(world.home_session("stranger", "refused") / "events.jsonl")
    assert events[-1]["type"] == "tool_result", events
    assert events[-1]["status"] == "error"
    assert events[-1]["object"] == "tool/shell.exec"


# ------------------------------------------------------------------ S-3, T-7: logs with objects


def test_t7_a_call_is_logged_to_the_tool_log_and_to_the_session(world):
    """T-7, S-3: one call leaves its record in ``tool/<name>.d/log`` and in the session's
    ``events.jsonl``, both JSON lines of the S-2 shape naming the same agent and tool."""
    log = world.tool_log("demo.echo")
    before = log.read_bytes() if log.exists() else b""
    assert world.native("coder", "demo.echo", {"q": "t7"}, "--session", "t7").rc == 0
    added = log.read_bytes()[len(before) :]
    assert added.endswith(b"\n") and added, added
    logged = [json.loads(line) for line in added.decode().splitlines()]
    assert logged, added
    for event in logged:
        assert list(event)[:6] == S2_KEYS, event
        assert (event["agent"], event["object"]) == ("coder", "tool/demo.echo"), event
        assert event["session"] == "t7", event
    session = events_of(world.home_session("coder", "t7") / "events.jsonl")
    assert any(e["type"] == "tool_result" for e in session), session


def test_t7_a_failed_call_is_logged_with_its_error_in_the_tool_log(world):
    """T-7, S-4 (logs record facts and errors)."""
    assert world.native("coder", "demo.fail", {}, "--session", "t7f").rc == 1
    logged = [json.loads(line) for line in world.tool_log("demo.fail").read_text().splitlines()]
    assert logged and logged[-1]["status"] == "error", logged
    assert logged[-1]["session"] == "t7f"


def test_t7_a_space_tool_is_logged_in_its_own_control_directory(world):
    """T-7, S-3 (logs live with their object), X-1: the call of a tool of a shared space is
    logged to ``shared/<space>/tool/<name>.d/log``, where the tool lives, and to the session."""
    r = world.ctx("object", "install", tool_manifest(world.top, "space.echo", ECHO),
                  "--tier", f"shared:{SPACE}")  # fmt: skip
    assert r.rc == 0, r
    control = world.storage / "shared" / SPACE / "tool" / "space.echo.d"
    with (control / "policy").open("a") as policy:
        policy.write("allow builder_t tool:space.echo execute\n")
    agent_policy = world.storage / "agent" / "builder.d" / "policy"
    kept = agent_policy.read_text()
    try:
        agent_policy.write_text(kept + "allow builder_t tool:space.echo execute\n")
        r = world.native("builder", "space.echo", {"n": 1}, "--session", "space-tool")
        assert r.rc == 0, r
    finally:
        agent_policy.write_text(kept)
    logged = [json.loads(line) for line in (control / "log").read_text().splitlines()]
    assert [e["session"] for e in logged] == ["space-tool"], logged
    assert list(logged[0])[:6] == S2_KEYS
    events = events_of(world.home_session("builder", "space-tool") / "events.jsonl")
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    assert not (world.storage / "tool" / "space.echo.d").exists()


def test_t7_a_call_typed_in_the_agent_terminal_is_logged_in_its_session(world):
    """T-7, T-3, A-2: a tool run through tsh in the agent's terminal (session ``tsh``) is
    logged to the tool's log and to that session's ``events.jsonl``."""
    r = world.ctx("agent", "start", "coder", "--session", "tsh", "--no-workspace")
    assert r.rc == 0, r
    session = world.home_session("coder", "tsh")
    try:
        with socket.socket(socket.AF_UNIX) as terminal:
            terminal.connect(str(session / "terminal" / "main.sock"))
            terminal.sendall(b"attach\n")
            time.sleep(1)
            terminal.sendall(b"demo.echo typed-in-tsh\r")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                recorded = (session / "events.jsonl").read_text()
                if '"tool_result"' in recorded:
                    break
                time.sleep(0.2)
    finally:
        assert world.ctx("agent", "stop", "coder", "--session", "tsh").rc == 0
    events = [e for e in events_of(session / "events.jsonl") if e["type"].startswith("tool_")]
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    assert all(e["object"] == "tool/demo.echo" and e["session"] == "tsh" for e in events)
    logged = [json.loads(line) for line in world.tool_log("demo.echo").read_text().splitlines()]
    assert any(e["session"] == "tsh" for e in logged), logged


def test_s3_an_agent_has_its_log_and_the_root_has_no_audit(world):
    """S-3, R-2: ``agent/<name>.d/log`` lives with the agent; after calls of every kind the
    root still holds exactly the six root entries and no ``audit`` exists anywhere."""
    assert world.native("coder", "demo.echo", {}).rc == 0
    assert world.native("coder", "demo.fail", {}).rc == 1
    assert world.native("builder", "demo.echo", {}, "--project", SPACE).rc == 0
    log = world.storage / "agent" / "coder.d" / "log"
    assert stat.S_ISREG(log.lstat().st_mode)
    for line in log.read_text().splitlines():
        assert list(json.loads(line))[:6] == S2_KEYS, line
    assert set(os.listdir(world.storage)) == ROOT_ENTRIES
    audits = [p for p in world.storage.rglob("*") if p.name.lower() == "audit"]
    assert audits == []


# ------------------------------------------------------------------ S-4: facts, not secrets

SECRET = "hunter2-correct-horse-battery"
TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"


def test_s4_secrets_in_the_input_and_output_are_not_logged(world):
    """S-4: by default logs record facts and errors, not whole secrets: a password, an API
    token and an Authorization header given to a tool (and echoed back as its output) appear
    neither in the session's events nor in the tool's log."""
    payload = {
        "user": "ana",
        "password": SECRET,
        "api_key": TOKEN,
        "headers": {"Authorization": f"Bearer {TOKEN}"},
        "url": f"https://ana:{SECRET}@git.example/repo",
    }
    r = world.native("coder", "demo.echo", payload, "--session", "secrets")
    assert r.rc == 0, r
    result = json.loads(r.lines()[-1])
    assert result["output"] == payload  # the caller gets the output as it was
    for path in (world.home_session("coder", "secrets") / "events.jsonl",
                 world.tool_log("demo.echo")):  # fmt: skip
        text = path.read_text()
        assert SECRET not in text, path
        assert TOKEN not in text, path
        assert "ana" in text, path  # the facts stay


def test_s4_a_secret_on_a_command_line_is_not_logged(world):
    """S-4 for terminal-mode argv and a shell command's text."""
    r = world.ctx("run", "--agent", "coder", "--session", "argv", "demo.echo",
                  "--password", SECRET, f"TOKEN={TOKEN}")  # fmt: skip
    assert r.rc == 0, r
    r = world.native("coder", "shell.exec", {"cmd": f"echo password={SECRET}"},
                     "--session", "argv")  # fmt: skip
    assert r.rc == 0, r
    for path in (world.home_session("coder", "argv") / "events.jsonl",
                 world.tool_log("demo.echo"), world.tool_log("shell.exec")):  # fmt: skip
        text = path.read_text()
        assert SECRET not in text and TOKEN not in text, path


@pytest.mark.parametrize(
    "cmd",
    [
        # GitHub's API documents ``Authorization: token …`` as well as ``Bearer``.
        f"curl -sH 'Authorization: token {SECRET}' https://api.github.example/user",
        f'curl -sH "Authorization: token {SECRET}" https://api.github.example/user',
        f"curl -H 'Cookie: theme=dark; session={SECRET}' https://app.example/",
        f"echo 'retrying with Authorization: token {SECRET}'",
    ],
)
def test_s4_a_credential_in_a_header_of_a_command_is_not_logged(world, cmd):
    """S-4: a credential sent in an HTTP header of a shell command is a whole secret, whatever
    the header's scheme word or how many cookies it holds; the log keeps the command's facts
    (the program, the URL) but not the credential."""
    r = world.native("coder", "shell.exec", {"cmd": cmd}, "--session", "headers")
    assert r.rc in (0, 1), r
    for path in (world.home_session("coder", "headers") / "events.jsonl",
                 world.tool_log("shell.exec")):  # fmt: skip
        text = path.read_text()
        assert SECRET not in text, path
        assert cmd.split()[0] in text, path


@pytest.mark.parametrize(
    "payload",
    [
        {"argv": ["mysql", "--user", "ana", "--password", SECRET, "app"]},
        {"args": ["curl", "-u", f"ana:{SECRET}", "https://api.example/"]},
        {"env": [{"name": "API_TOKEN", "value": SECRET}]},  # as Kubernetes writes it
        {"headers": [{"name": "Authorization", "value": f"token {SECRET}"}]},  # HAR
        {"headers": [["Cookie", f"sid={SECRET}"]]},
    ],
)
def test_s4_a_secret_in_a_structured_input_is_not_logged(world, payload):
    """S-4: a native input holds command lines and name/value pairs as JSON lists and
    objects; the secret they carry is not logged, and the rest of the facts are."""
    r = world.native("coder", "demo.echo", payload, "--session", "structured")
    assert r.rc == 0, r
    for path in (world.home_session("coder", "structured") / "events.jsonl",
                 world.tool_log("demo.echo")):  # fmt: skip
        text = path.read_text()
        assert SECRET not in text, path
        assert next(iter(payload)) in text, path


def test_s4_a_long_prompt_is_not_logged_whole(world):
    """S-4: logs do not record long prompts: a 200 KB prompt passed to a tool leaves a
    record far smaller than itself."""
    prompt = "Summarise the design document. " * 6500  # about 200 KB
    r = world.native("coder", "demo.echo", {"prompt": prompt}, "--session", "prompt")
    assert r.rc == 0, r
    events = world.home_session("coder", "prompt") / "events.jsonl"
    assert events.stat().st_size < 64 * 1024, events.stat().st_size
    assert world.tool_log("demo.echo").stat().st_size < 64 * 1024
    assert prompt not in events.read_text()


# ------------------------------------------------------------------ S-5: crash-safe appends


def torn(world: World, agent: str, session: str) -> tuple[Path, bytes]:
    """A session whose last line is torn: whole events, then half of one without newline."""
    assert world.native(agent, "demo.echo", {"n": 1}, "--session", session).rc == 0
    events = world.home_session(agent, session) / "events.jsonl"
    whole = events.read_bytes()
    with events.open("ab") as f:
        f.write(b'{"ts":"2026-06-22T12:00:00Z","type":"tool_call","agent":"cod')
    return events, whole


def test_s5_readers_ignore_a_torn_last_line(world):
    """S-5: ``ctx session show`` and ``tail`` read the whole events and ignore the torn last
    line, exit 0."""
    _, whole = torn(world, "coder", "torn")
    stored = whole.decode().splitlines()
    r = world.ctx("session", "show", "coder", "torn", "--json")
    assert r.rc == 0, r
    assert [json.loads(line) for line in r.lines()] == [json.loads(line) for line in stored]
    r = world.ctx("session", "tail", "coder", "torn", "-n", "1", "--json")
    assert r.rc == 0, r
    assert [json.loads(line) for line in r.lines()] == [json.loads(stored[-1])]
    r = world.ctx("session", "show", "coder", "torn")
    assert r.rc == 0, r
    assert len(r.lines()) == len(stored), r  # text mode: one line per event


def test_s5_repair_truncates_the_torn_last_line_and_nothing_else(world):
    """S-5: ``ctx session repair`` truncates a torn last line; complete lines are kept;
    a second repair has nothing to do."""
    events, whole = torn(world, "coder", "fix")
    r = world.ctx("session", "repair", "coder", "fix")
    assert r.rc == 0, r
    assert events.read_bytes() == whole
    r = world.ctx("session", "repair", "coder", "fix", "--json")
    assert r.rc == 0, r
    assert r.json()["truncated_bytes"] == 0, r
    assert events.read_bytes() == whole


def test_s5_the_next_append_never_glues_onto_a_torn_line(world):
    """S-5: one event = one line: an append after a crash that tore the last line still
    writes each event as a line of its own, which readers read."""
    events, whole = torn(world, "coder", "glue")
    assert world.native("coder", "demo.echo", {"n": 2}, "--session", "glue").rc == 0
    r = world.ctx("session", "show", "coder", "glue", "--json")
    assert r.rc == 0, r
    shown = [json.loads(line) for line in r.lines()]
    assert [e["type"] for e in shown] == ["tool_call", "tool_result"] * 2, shown
    assert events.read_bytes().startswith(whole)


def test_s5_repair_of_a_shared_session(world):
    """S-5, S-1: ``ctx session repair --project`` truncates a torn line of a shared session."""
    r = world.native("builder", "demo.echo", {}, "--project", SPACE, "--session", "fixme")
    assert r.rc == 0, r
    events = world.shared_session("builder", "fixme") / "events.jsonl"
    whole = events.read_bytes()
    with events.open("ab") as f:
        f.write(b'{"ts":"2026-06-22T12:00:00Z","ty')
    r = world.ctx("session", "repair", "builder", "fixme", "--project", SPACE)
    assert r.rc == 0, r
    assert events.read_bytes() == whole


def test_s5_a_torn_line_in_a_tool_log_is_not_glued_onto(world):
    """S-5, T-7: the tool's log is appended the same way: after a torn last line the next
    call's record is a line of its own."""
    assert world.native("coder", "demo.echo", {"n": 0}, "--session", "tl-torn").rc == 0
    log = world.tool_log("demo.echo")
    with log.open("ab") as f:
        f.write(b'{"ts":"2026-06-22T12:00:00Z","type":"tool_res')
    assert world.native("coder", "demo.echo", {"n": 1}, "--session", "tl-torn").rc == 0
    last = log.read_text().splitlines()[-1]
    event = json.loads(last)
    assert (event["session"], event["object"]) == ("tl-torn", "tool/demo.echo"), last


def test_s5_tail_follow_prints_events_as_they_are_appended(world):
    """S-5: ``ctx session tail --follow`` keeps printing new events as whole lines."""
    assert world.native("coder", "demo.echo", {"n": 0}, "--session", "follow").rc == 0
    argv = [*CTX_ARGV, "session", "tail", "coder", "follow", "-n", "0", "--follow", "--json"]
    follower = subprocess.Popen(argv, stdout=subprocess.PIPE, env=world.env)
    try:
        time.sleep(1)
        assert world.native("coder", "demo.echo", {"n": 1}, "--session", "follow").rc == 0
        seen = [json.loads(follower.stdout.readline()) for _ in range(2)]
        assert [e["type"] for e in seen] == ["tool_call", "tool_result"], seen
    finally:
        follower.kill()
        follower.wait()


def test_s5_concurrent_appenders_never_interleave_inside_a_line(world):
    """S-5: many calls recording at once into one session, each event larger than a pipe's
    atomic write (4 KiB), leave whole lines only, two per call."""
    payload = {f"k{i:02d}": chr(ord("a") + i) * 190 for i in range(20)}
    calls = 16

    def call(i: int) -> int:
        return world.native("coder", "demo.echo", {**payload, "i": str(i)}, "--session", "busy").rc

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(call, range(calls))) == [0] * calls
    events = events_of(world.home_session("coder", "busy") / "events.jsonl")
    assert len(events) == 2 * calls
    assert max(len(json.dumps(e)) for e in events) > 4096
    assert sorted(e["type"] for e in events) == ["tool_call"] * calls + ["tool_result"] * calls


def strace(
    world: World, *args: str, payload: dict, calls: str = "openat,write,fsync,fdatasync"
) -> tuple[Run, list[str]]:
    """``ctx ARGS`` under strace, which prints each of its ``calls`` in every process."""
    trace = world.top / f"trace-{os.getpid()}-{time.monotonic_ns()}"
    argv = ["strace", "-f", "-qq", "-y", "-s", "65536", "-o", str(trace),
            "-e", f"trace={calls}", *CTX_ARGV, *args]  # fmt: skip
    proc = subprocess.run(argv, input=json.dumps(payload).encode(), capture_output=True,
                          env=world.env, timeout=60)  # fmt: skip
    run = Run(list(args), proc.returncode, proc.stdout.decode(), proc.stderr.decode())
    return run, trace_lines(trace)


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_s5_one_event_is_one_write_on_an_o_append_descriptor_synced_before_done(world):
    """S-5: each event is one ``write`` of a whole line on a descriptor opened ``O_APPEND``,
    and the tool result is fsynced before the call is reported done (the result frame)."""
    run, trace = strace(world, "run", "--agent", "coder", "--session", "traced", "--native",
                        "demo.echo", payload={"n": 1})  # fmt: skip
    if run.rc != 0 and "PTRACE" in run.err.upper():
        pytest.skip(f"strace cannot trace here: {run.err}")
    assert run.rc == 0, run
    events = world.home_session("coder", "traced") / "events.jsonl"
    opens = [line for line in trace if "openat(" in line and str(events) in line]
    assert opens and all("O_APPEND" in line for line in opens), opens
    writes = [line for line in trace if re.search(rf"write\(\d+<{re.escape(str(events))}>", line)]
    assert len(writes) == len(events_of(events)) == 2, writes
    # strace prints the bytes written, then their count (a short line padded to a column
    # before "="): each write is a whole line.
    assert all(re.search(r'\\n", (\d+)\)\s+=\s+\1$', line) for line in writes), writes
    result_write = next(i for i, line in enumerate(trace) if re.search(r"tool_result", line)
                        and str(events) in line)  # fmt: skip
    frame = next(i for i, line in enumerate(trace) if '\\"type\\": \\"result\\"' in line
                 and "write(1" in line)  # fmt: skip
    syncs = [i for i, line in enumerate(trace)
             if re.search(rf"f(data)?sync\(\d+<{re.escape(str(events))}>", line)]  # fmt: skip
    assert any(result_write < i < frame for i in syncs), (result_write, syncs, frame)


def test_s5_queue_transitions_and_tool_results_are_in_the_worker_session(world):
    """S-5, W-1: a worker records the queue transitions and the job's tool call in its
    session, as ordinary events."""
    env = world.env
    assert world.ctx("queue", "init", "--project", "jobs").rc == 0
    request = {"tool": "demo.echo", "input": {"x": 1}, "from": "t",
               "created": "2026-06-22T12:00:00Z"}  # fmt: skip
    r = world.ctx("queue", "publish", "--project", "jobs", "--name", "j1", "-",
                  input=json.dumps(request), env=env)  # fmt: skip
    assert r.rc == 0, r
    r = world.ctx("queue", "work", "--project", "jobs", "--agent", "coder", "--drain")
    assert r.rc == 0, r
    events = events_of(world.home_session("coder", "worker") / "events.jsonl")
    types = [e["type"] for e in events]
    assert "tool_call" in types and "tool_result" in types, types
    assert any(t.startswith("queue.") for t in types), types
    for event in events:
        assert list(event)[:6] == S2_KEYS, event


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_s5_queue_transitions_are_synced_before_the_tool_starts_and_before_done(world):
    """S-5: a worker's queue transitions are durable events: its claim is fsynced before the
    job's tool starts, its finish before the worker reports the job done."""
    assert world.ctx("queue", "init", "--project", "traced").rc == 0
    request = {"tool": "demo.echo", "input": {"x": 1}, "from": "t",
               "created": "2026-06-22T12:00:00Z"}  # fmt: skip
    r = world.ctx("queue", "publish", "--project", "traced", "--name", "tj", "-",
                  input=json.dumps(request))  # fmt: skip
    assert r.rc == 0, r
    run, trace = strace(world, "queue", "work", "--project", "traced", "--agent", "coder",
                        "--session", "traced-worker", "--drain", payload={},
                        calls="openat,write,fsync,fdatasync,execve")  # fmt: skip
    assert run.rc == 0, run
    events = world.home_session("coder", "traced-worker") / "events.jsonl"
    path = re.escape(str(events))

    def first(pattern: str, after: int = 0) -> int:
        return next(i for i, line in enumerate(trace) if i >= after and re.search(pattern, line))

    claim = first(rf"write\(\d+<{path}>.*queue\.claim")
    tool = first(r'execve\("[^"]*/tool/demo\.echo"', claim)
    assert any(re.search(rf"f(data)?sync\(\d+<{path}>", line) for line in trace[claim:tool])
    finish = first(rf"write\(\d+<{path}>.*queue\.finish", tool)
    done = first(r"write\(1<.*done +tj\.req\.json", finish)
    assert any(re.search(rf"f(data)?sync\(\d+<{path}>", line) for line in trace[finish:done])


# ------------------------------------------------------------------ S-6: shared sessions


def test_s6_a_home_session_is_not_readable_by_another_uid(world):
    """S-6, R-4 (Linux permissions): the agent's home session is its own; another uid (here
    nobody, the outsider agent's uid) may not read its events."""
    assert world.native("coder", "demo.echo", {}, "--session", "private").rc == 0
    events = world.home_session("coder", "private") / "events.jsonl"
    nobody = UnprivilegedUser("nobody", world.nobody, pwd.getpwnam("nobody").pw_gid)
    assert access_as(nobody, [(str(events), "r"), (str(events.parent), "r")]) == [False, False]


def test_s6_writing_a_shared_session_needs_the_policy(world):
    """S-6: an agent whose policy holds ``shared:<space> read`` but not ``write`` cannot
    write a session in the space (EACCES), and nothing is made there."""
    r = world.native("reader", "demo.echo", {}, "--project", SPACE, "--session", "dr")
    assert r.rc != 0, r
    assert "EACCES" in r.out + r.err, r
    assert not (world.storage / "shared" / SPACE / "agent" / "reader").exists()


def test_s6_writing_a_shared_session_needs_the_linux_permissions(world):
    """S-6: an agent whose policy allows the space but whose uid and groups the space's mode
    bits shut out cannot write a session there (EACCES)."""
    r = world.native("outsider", "demo.echo", {}, "--project", SPACE, "--session", "dr")
    assert r.rc != 0, r
    assert "EACCES" in r.out + r.err, r
    assert not (world.storage / "shared" / SPACE / "agent" / "outsider").exists()


def read_shared_session(world: World, agent: str) -> Run:
    path = "/ctx/shared/" + SPACE + "/agent/builder/session/dr/events.jsonl"
    return world.native(agent, "fs.read", {"path": path})


def test_s6_reading_a_shared_session_needs_policy_permissions_and_visibility(world):
    """S-6: another agent's shared session is readable to an agent only when Linux
    permissions, mount visibility and policy v0 all allow it: ``shared:<space> read`` and
    ``session:<name> read``; with any of them missing the read is refused."""
    assert world.native("builder", "demo.echo", {}, "--project", SPACE, "--session", "dr").rc == 0
    policies = {name: world.storage / "agent" / f"{name}.d" / "policy" for name in AGENTS}
    kept = {name: path.read_text() for name, path in policies.items()}
    try:
        assert read_shared_session(world, "reader").rc != 0  # no session:dr read yet
        policies["reader"].write_text(kept["reader"] + "allow reader_t session:dr read\n")
        r = read_shared_session(world, "reader")
        assert r.rc == 0, r
        assert '"tool_result"' in json.loads(r.lines()[-1])["output"]["content"]
        # The same uid and group and the session rule, but no shared:<space> read: refused.
        policies["stranger"].write_text(kept["stranger"] + "allow stranger_t session:dr read\n")
        assert read_shared_session(world, "stranger").rc != 0
        # The policy, but not the Linux permissions (nobody is not in the space's group).
        policies["outsider"].write_text(kept["outsider"] + "allow outsider_t session:dr read\n")
        assert read_shared_session(world, "outsider").rc != 0
        # Mount visibility: without its view of the storage root the session is not visible.
        policies["reader"].write_text(
            policies["reader"].read_text().replace("allow reader_t mount:ctx read\n", "")
        )
        assert read_shared_session(world, "reader").rc != 0
    finally:
        for name, path in policies.items():
            path.write_text(kept[name])


def test_s6_there_is_no_shared_control_in_an_agent(world):
    """S-6: there is no ``agent/<name>.d/shared``, even for agents granted a space."""
    assert world.native("builder", "demo.echo", {}, "--project", SPACE).rc == 0
    for name in AGENTS:
        assert not os.path.lexists(world.storage / "agent" / f"{name}.d" / "shared")


@pytest.mark.parametrize("permission", ["read", "write", "resume"])
def test_s6_session_permissions_are_read_write_resume(tmp_path, permission):
    """S-6, P-3: ``session:<name> read|write|resume`` are the session class's permissions,
    and nothing else is."""
    rule = f"allow coder_t session:design-review {permission}\n"
    r = ctx_run("policy", "query", "--policy", "-", "coder_t", "session:design-review",
                permission, input=rule)  # fmt: skip
    assert (r.rc, r.out) == (0, "allow\n"), r
    r = ctx_run("policy", "check", "-", input="allow coder_t session:design-review execute\n")
    assert r.rc == 1 and "EINVAL" in r.err, r


# ------------------------------------------------------------------ ctx session commands


def test_session_show_prints_the_timeline_oldest_first(world):
    """S-1, S-2: ``ctx session show AGENT SESSION --json`` gives the events as stored."""
    for n in range(3):
        assert world.native("coder", "demo.echo", {"n": n}, "--session", "tl").rc == 0
    stored = events_of(world.home_session("coder", "tl") / "events.jsonl")
    r = world.ctx("session", "show", "coder", "tl", "--json")
    assert r.rc == 0, r
    assert [json.loads(line) for line in r.lines()] == stored
    assert [e["ts"] for e in stored] == sorted(e["ts"] for e in stored)
    r = world.ctx("session", "show", "coder", "--session", "tl")
    assert r.rc == 0 and len(r.lines()) == 6, r
    r = world.ctx("session", "tail", "coder", "tl", "-n", "2", "--json")
    assert [json.loads(line) for line in r.lines()] == stored[-2:], r


def test_session_show_reads_a_shared_session(world):
    """S-1: ``--project`` names the session in ``shared/<project>/``."""
    assert world.native("builder", "demo.echo", {}, "--project", SPACE, "--session", "sh").rc == 0
    r = world.ctx("session", "show", "builder", "sh", "--project", SPACE, "--json")
    assert r.rc == 0, r
    stored = events_of(world.shared_session("builder", "sh") / "events.jsonl")
    assert [json.loads(line) for line in r.lines()] == stored
    r = world.ctx("session", "list", "builder", "--project", SPACE)
    assert r.rc == 0 and "sh" in r.lines(), r


def test_session_show_of_a_missing_session_is_enoent(world):
    """S-1: a session is a directory; one that does not exist is ENOENT, exit 1."""
    assert world.native("coder", "demo.echo", {}).rc == 0
    r = world.ctx("session", "show", "coder", "nosuch")
    assert r.rc == 1 and "ENOENT" in r.err, r


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "x.d", "a" * 65])
def test_an_illegal_session_name_is_einval(world, name):
    """R-3: a session name is an object name; anything else is EINVAL."""
    for args in (("session", "show", "coder", name),
                 ("run", "--agent", "coder", "--session", name, "demo.echo")):  # fmt: skip
        r = world.ctx(*args)
        assert r.rc == 2 and "EINVAL" in r.err, r
    assert not (world.storage / "home" / str(world.user.uid) / "agent" / "coder" / "x").exists()
