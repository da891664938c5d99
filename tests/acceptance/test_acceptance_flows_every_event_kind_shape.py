"""Every kind of session event the product writes, and its shape (SPEC S-1 … S-6, T-6, T-7,
W-1, W-4, A-1, M-4).

Each kind is produced through the real commands — ``ctx run`` in terminal and native mode,
refusals at each stage of a call (resolve, authorize, schema, a pre-hook's veto, a non-zero
exit with and without an errno, a timeout, an interrupt), a post-hook that fails, a tool
projected from an MCP stdio server, a ``ctx queue work`` worker (``queue.claim``,
``queue.start``, ``queue.refuse``, ``queue.finish``), an agent terminal started and stopped
(``terminal.started``, ``terminal.stopped`` and tsh's calls), ``agent.created`` — and then
checked line by line: one strict JSON object per line of UTF-8 (no NaN, no infinity), the six
keys of S-2 first and in order, ``ts`` in RFC 3339 UTC, ``tool_call``/``tool_result`` paired by
``call``, the documented facts with their documented types, secrets redacted and long inputs
cut as docs/sessions.md says, and ``ctx session show``/``tail`` (text and ``--json``) giving
back each event without losing or inventing a field."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    OnStorage,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, Raw
from tests.support.mcp_wire import WIRE
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as another uid")

SCRATCH = scratch_top(__file__)
CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
PYTHON = REPO / ".venv" / "bin" / "python"

AGENT = "coder"
LABEL = "coder_t"
SPACE = "evk-space"
S2_KEYS = ["ts", "type", "agent", "session", "object", "status"]
TS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?Z")
CALL_ID = re.compile(r"[0-9a-f]{8,64}")
STAGES = {"caller", "agent", "session", "resolve", "authorize", "schema", "hook", "output",
          "run", "exit", "record"}  # fmt: skip

ECHO = """\
#!/bin/sh
if [ "$#" -gt 0 ]; then printf '%s\\n' "$*"; else cat; fi
"""
# Exits 3 naming an errno (28, ENOSPC) in the documented form, a secret in its message.
FAILS = """\
#!/bin/sh
cat >/dev/null
echo '{"errno": 28, "message": "volume full token=fails-secret-7781"}'
exit 3
"""
# Exits 4 with no errno at all.
PLAIN_FAIL = """\
#!/bin/sh
cat >/dev/null
echo 'no luck' >&2
exit 4
"""
NAP = """\
#!/bin/sh
cat >/dev/null
sleep 30
"""
VETO_HOOK = """\
#!/bin/sh
cat >/dev/null
echo "vetoed: password=veto-secret-4411" >&2
exit 4
"""
SAD_POST_HOOK = """\
#!/bin/sh
cat >/dev/null
echo "post hook unhappy, api_key=post-secret-5512" >&2
exit 5
"""
STRICT_SCHEMA = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}

MCP_SERVER = (
    WIRE
    + r"""
while True:
    message = receive()
    if "id" not in message:
        continue
    method, ident = message.get("method"), message["id"]
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "evk", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": [
            {"name": "echo", "description": "Echo.", "inputSchema": {"type": "object"}}]}})
    elif method == "tools/call":
        args = message["params"].get("arguments", {})
        if args.get("fail"):
            send({"jsonrpc": "2.0", "id": ident, "result": {"isError": True, "content": [
                {"type": "text", "text": "remote failed secret=mcp-secret-9931"}]}})
        else:
            send({"jsonrpc": "2.0", "id": ident, "result": {"structuredContent": args,
                "content": [{"type": "text", "text": json.dumps(args)}]}})
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
"""
)

TOOLS = ["demo.echo", "demo.fails", "demo.plain", "demo.nap", "demo.veto", "demo.sad",
         "demo.strict", "demo.ungranted", "evk.echo"]  # fmt: skip


# ---------------------------------------------------------------------------------- helpers


@dataclass
class World(OnStorage):
    top: Path
    storage: Path
    user: UnprivilegedUser
    ws: Path

    def native(self, tool: str, payload: object, *options: str, session: str = "default") -> Run:
        text = payload if isinstance(payload, str) else json.dumps(payload)
        return self.ctx("run", "--agent", AGENT, "--session", session, *options, "--native",
                        tool, input=text)  # fmt: skip

    def terminal(self, tool: str, *argv: str | bytes, session: str = "default") -> Run:
        proc = subprocess.run(
            [*map(os.fsencode, [*CTX_ARGV, "run", "--agent", AGENT, "--session", session, tool]),
             *map(os.fsencode, argv)],
            capture_output=True, env=self.env, timeout=60, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        return Run(["run", tool], proc.returncode, proc.stdout.decode("utf-8", "replace"),
                   proc.stderr.decode("utf-8", "replace"))  # fmt: skip

    def session_file(self, session: str) -> Path:
        home = self.storage / "home" / str(self.user.uid)
        return home / "agent" / AGENT / "session" / session / "events.jsonl"

    def events(self, session: str) -> list[dict]:
        return strict_lines(self.session_file(session))


def _reject_constant(name: str) -> None:
    raise ValueError(f"non-JSON constant {name} in an event line")


def strict_lines(path: Path) -> list[dict]:
    """The events of ``path``, each line checked: whole (ends in a newline), strict UTF-8, one
    JSON object, no NaN or infinity, no duplicate key."""

    def no_duplicates(pairs: list) -> dict:
        keys = [key for key, _ in pairs]
        assert len(keys) == len(set(keys)), f"duplicate key in an event: {keys}"
        return dict(pairs)

    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-200:]
    events = []
    for raw in data.split(b"\n")[:-1]:
        text = raw.decode("utf-8")  # strict: raises on any byte that is not UTF-8
        assert "\n" not in text and "\r" not in text
        event = json.loads(text, parse_constant=_reject_constant, object_pairs_hook=no_duplicates)
        assert isinstance(event, dict), text[:200]
        events.append(event)
    return events


def stamp(event: dict) -> datetime:
    assert isinstance(event["ts"], str) and TS.fullmatch(event["ts"]), event["ts"]
    parsed = datetime.fromisoformat(event["ts"])
    assert parsed.utcoffset() is not None and parsed.utcoffset().total_seconds() == 0
    return parsed


def check_s2(event: dict, agent: str, session: str) -> None:
    """The minimal shape of S-2: its six keys first, in that order, each a string."""
    assert list(event)[:6] == S2_KEYS, event
    for key in S2_KEYS:
        assert isinstance(event[key], str), (key, event)
    stamp(event)
    assert event["agent"] == agent and event["session"] == session, event
    assert event["status"] in ("ok", "error"), event


def check_call_pairs(events: list[dict]) -> dict[str, tuple[dict, dict]]:
    """Every ``tool_call`` has exactly one ``tool_result`` after it with the same ``call`` and
    ``object``; each call id is used by one call only.  Returns call id -> (call, result)."""
    pairs: dict[str, list[dict]] = {}
    for event in events:
        if event["type"] in ("tool_call", "tool_result"):
            assert isinstance(event["call"], str) and CALL_ID.fullmatch(event["call"]), event
            pairs.setdefault(event["call"], []).append(event)
    found = {}
    for call, two in pairs.items():
        assert [e["type"] for e in two] == ["tool_call", "tool_result"], (call, two)
        first, second = two
        assert first["object"] == second["object"], two
        assert first["status"] == "ok", first
        assert stamp(first) <= stamp(second), two
        found[call] = (first, second)
    return found


def check_call_event(event: dict) -> None:
    assert event["mode"] in ("native", "terminal"), event
    if event["mode"] == "native":
        assert "input" in event and "argv" not in event, event
    else:
        assert isinstance(event["argv"], list) and "input" not in event, event
        assert all(isinstance(word, str) for word in event["argv"]), event
    if "job" in event:
        assert isinstance(event["job"], str), event


def check_result_event(event: dict) -> None:
    assert event["exit_status"] is None or type(event["exit_status"]) is int, event
    assert isinstance(event["duration_ms"], int | float), event
    assert event["duration_ms"] >= 0, event
    assert type(event["duration_ms"]) is not bool, event
    if event["status"] == "error":
        for key in ("errno", "stage", "step", "message"):
            assert key in event, (key, event)
        assert event["errno"] is None or re.fullmatch(r"E[A-Z0-9]+", event["errno"]), event
        assert event["stage"] in STAGES, event
        assert event["step"] is None or type(event["step"]) is int, event
        assert 1 <= (event["step"] or 1) <= 6, event
        assert isinstance(event["message"], str) and event["message"], event
    else:
        assert "errno" not in event and "stage" not in event, event
    for hook in event.get("post_hooks", []):
        assert set(hook) == {"hook", "exit_status", "message"}, hook
        assert isinstance(hook["hook"], str) and type(hook["exit_status"]) is int, hook


def check_file(world: World, session: str) -> list[dict]:
    """Every event of ``session`` of the world's agent, checked as a whole."""
    events = world.events(session)
    assert events, session
    for event in events:
        check_s2(event, AGENT, session)
        if event["type"] == "tool_call":
            check_call_event(event)
        elif event["type"] == "tool_result":
            check_result_event(event)
    check_call_pairs(events)
    return events


def results(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "tool_result"]


def text_line(event: dict) -> str:
    """The documented text rendering of one event: time, type, object, status, then the
    other facts as ``key=value``, each value as JSON."""
    rest = " ".join(
        f"{key}={json.dumps(value, ensure_ascii=False)}"
        for key, value in event.items()
        if key not in S2_KEYS
    )
    return f"{event['ts']}  {event['type']:<12} {event['object']:<24} {event['status']:<10} {rest}"


def shown_json(world: World, *args: str) -> list[dict]:
    r = world.ctx("session", *args, "--json")
    assert r.rc == 0, r
    out = []
    for line in r.out.splitlines():
        event = json.loads(line, parse_constant=_reject_constant)
        assert isinstance(event, dict), line
        out.append(event)
    return out


def check_rendering(world: World, session: str, *, exact_text: bool = True) -> None:
    """``show``/``tail`` in both forms give back each event of the file: the same events in
    the same order with the same keys and values (``--json``), one text line per event
    holding its columns and every other fact (text)."""
    events = world.events(session)
    assert shown_json(world, "show", AGENT, session) == events
    assert [list(e) for e in shown_json(world, "show", AGENT, session)] == [list(e) for e in events]
    n = min(3, len(events))
    assert shown_json(world, "tail", AGENT, session, "-n", str(n)) == events[-n:]
    text = world.ctx("session", "show", AGENT, session)
    assert text.rc == 0, text
    lines = text.out.splitlines()
    assert len(lines) == len(events), text
    tail = world.ctx("session", "tail", AGENT, session, "-n", str(n))
    assert tail.rc == 0 and tail.out.splitlines() == lines[-n:], (tail, lines[-n:])
    for line, event in zip(lines, events, strict=True):
        fields = line.split()
        assert fields[:4] == [event["ts"], event["type"], event["object"], event["status"]], (
            line,
            event,
        )
        if exact_text:
            assert line == text_line(event).rstrip(), (line, event)


# ---------------------------------------------------------------------------------- world


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "w-")
    try:
        user = find_or_create_user()
        storage = top / "storage"
        env = clean_env(CTX_STORAGE=str(storage))
        r = ctx_run("bootstrap", "--storage", storage)
        assert r.rc == 0, r
        group = grp.getgrgid(user.gid).gr_name
        r = ctx_run("shared", "create", SPACE, "--group", group, env=env)
        assert r.rc == 0, r
        r = ctx_run("queue", "init", "--project", "jobs", env=env)
        assert r.rc == 0, r
        manifests = top / "manifests"
        for name, program in (
            ("demo.echo", ECHO), ("demo.fails", FAILS), ("demo.plain", PLAIN_FAIL),
            ("demo.nap", NAP), ("demo.veto", ECHO), ("demo.sad", ECHO),
            ("demo.strict", ECHO), ("demo.ungranted", ECHO),
        ):  # fmt: skip
            path = tool_manifest(manifests, name, program)
            if name == "demo.strict":
                document = json.loads(path.read_text())
                document["schema"] = STRICT_SCHEMA
                path.write_text(json.dumps(document))
            r = ctx_run("object", "install", path, "--tier", "system", env=env)
            assert r.rc == 0, r
        hooks = storage / "tool"
        for tool, where, name, program in (
            ("demo.veto", "pre.d", "10-veto", VETO_HOOK),
            ("demo.sad", "post.d", "20-sad", SAD_POST_HOOK),
        ):
            hook = hooks / f"{tool}.d" / "hooks" / where / name
            hook.write_text(program)
            hook.chmod(0o755)

        mcp = top / "mcp"
        mcp.mkdir(mode=0o755)
        (mcp / "server.py").write_text(MCP_SERVER)
        (mcp / "server.py").chmod(0o644)
        config = mcp / "mcp.json"
        entry = {"command": str(PYTHON), "args": [str(mcp / "server.py")],
                 "env": {"EVK_TOKEN": "sk-evk-config-secret-000"}}  # fmt: skip
        config.write_text(json.dumps({"mcpServers": {"evk": entry}}))
        config.chmod(0o644)
        out = top / "candidates"
        projected = subprocess.run(
            [str(CTXMCP), "project", "--config", str(config), "--runtime-config", str(config),
             "--server", "evk", "--out", str(out)],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert projected.returncode == 0, projected
        r = ctx_run("object", "install", out / "evk.echo.manifest.json", "--tier", "system",
                    env=env)  # fmt: skip
        assert r.rc == 0, r

        request = {"name": AGENT, "label": LABEL, "tools": TOOLS,
                   "mount": [[str(mcp), str(mcp), "ro"]],
                   "shared": {SPACE: ["read", "write"]}}  # fmt: skip
        r = ctx_run("agent", "create", "--user", user.name, "-", input=json.dumps(request),
                    env=env)  # fmt: skip
        assert r.rc == 0, r
        for tool in TOOLS:
            if tool != "demo.ungranted":
                with (storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
                    policy.write(f"allow {LABEL} tool:{tool} execute\n")
        ws = top / "ws"
        ws.mkdir(mode=0o755)
        os.chown(ws, user.uid, user.gid)
        yield World(top, storage, user, ws)
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ---------------------------------------------------------------------------------- tests


def test_native_and_terminal_calls_leave_paired_events_of_the_documented_shape(world):
    """S-2, T-3, T-7: a native and a terminal call each leave a ``tool_call`` (``call``,
    ``mode``, ``input`` or ``argv``) and a ``tool_result`` (``call``, ``exit_status``,
    ``duration_ms``, the output's summary in native mode) with the same id; the same id is
    the one the native ``call`` and ``result`` frames carry, and the tool's log holds the
    result with ``session`` the name and ``session_dir`` the path."""
    session = "both-modes"
    native = world.native("demo.echo", {"hello": "world", "n": 3}, session=session)
    assert native.rc == 0, native
    frames = [json.loads(line) for line in native.lines()]
    assert [f["type"] for f in frames] == ["call", "result"], frames
    term = world.terminal("demo.echo", "plain", "words", session=session)
    assert term.rc == 0 and term.out == "plain words\n", term

    events = check_file(world, session)
    assert [e["type"] for e in events] == ["tool_call", "tool_result"] * 2, events
    pairs = check_call_pairs(events)
    assert list(pairs) == [frames[0]["call"], events[2]["call"]]
    (n_call, n_result), (t_call, t_result) = pairs.values()
    assert n_call["object"] == t_call["object"] == "tool/demo.echo"
    assert n_call["mode"] == "native" and n_call["input"] == {"hello": "world", "n": 3}
    assert t_call["mode"] == "terminal" and t_call["argv"] == ["plain", "words"]
    assert n_result["status"] == t_result["status"] == "ok"
    assert n_result["exit_status"] == t_result["exit_status"] == 0
    assert n_result["output"] == {"hello": "world", "n": 3}, n_result
    assert frames[1]["call"] == n_result["call"]
    assert all(e["session"] == session for e in events)

    log = strict_lines(world.storage / "tool" / "demo.echo.d" / "log")
    mine = [e for e in log if e.get("call") in pairs]
    assert len(mine) == 2, log
    where = f"home/{world.user.uid}/agent/{AGENT}/session/{session}"
    for line in mine:
        assert list(line)[:6] == S2_KEYS and line["type"] == "tool_result", line
        assert line["session"] == session and line["session_dir"] == where, line
        assert line["mode"] in ("native", "terminal"), line
    check_rendering(world, session)


def test_a_refusal_at_each_stage_leaves_a_pair_naming_errno_stage_and_step(world):
    """S-2 (docs/sessions.md, docs/tools.md "stages"): a call refused at resolve (ENOENT),
    authorize (EACCES, step 6), schema (EINVAL), by a pre-hook (EACCES, stage hook), one
    that exits naming an errno (stage exit, errno kept) or naming none (errno null), and one
    that times out (ETIMEDOUT, stage run, exit status of the killed group): each leaves its
    ``tool_call`` and a ``tool_result`` with ``errno``, ``stage``, ``step``, ``message``."""
    session = "refusals"
    expected = [
        (world.native("demo.nowhere", {}, session=session), 1, "ENOENT", "resolve", None),
        (world.native("demo.ungranted", {}, session=session), 1, "EACCES", "authorize", 6),
        (world.native("demo.strict", {"n": "x"}, session=session), 2, "EINVAL", "schema", None),
        (world.native("demo.veto", {}, session=session), 1, "EACCES", "hook", None),
        (world.terminal("demo.veto", "a", session=session), 126, "EACCES", "hook", None),
        (world.native("demo.fails", {}, session=session), 1, "ENOSPC", "exit", None),
        (world.native("demo.plain", {}, session=session), 1, None, "exit", None),
        (world.native("demo.nap", {}, "--timeout", "1", session=session), 1, "ETIMEDOUT", "run",
         None),
    ]  # fmt: skip
    for run, rc, *_ in expected:
        assert run.rc == rc, run
    events = check_file(world, session)
    done = results(events)
    assert len(done) == len(expected), events
    for result, (_run, _rc, code, stage, step) in zip(done, expected, strict=True):
        assert result["status"] == "error", result
        assert (result["errno"], result["stage"], result["step"]) == (code, stage, step), result
    by_stage = {(r["stage"], r["errno"]): r for r in done}
    assert by_stage[("exit", "ENOSPC")]["exit_status"] == 3
    assert by_stage[("exit", None)]["exit_status"] == 4
    assert "no luck" in by_stage[("exit", None)]["message"]
    assert by_stage[("run", "ETIMEDOUT")]["exit_status"] == 128 + signal.SIGKILL
    for refused_before_running in ("resolve", "authorize", "schema", "hook"):
        hit = [r for r in done if r["stage"] == refused_before_running]
        assert hit and all(r["exit_status"] is None for r in hit), hit
    assert "step 6" in by_stage[("authorize", "EACCES")]["message"]
    # The pre-hook's and the tool's secrets are not in any line.
    raw = world.session_file(session).read_text()
    assert "veto-secret-4411" not in raw and "fails-secret-7781" not in raw, raw
    check_rendering(world, session)


def test_a_failing_post_hook_is_listed_with_its_message_redacted(world):
    """T-6, S-4: a post-hook that exits non-zero changes nothing but is listed in the
    ``tool_result``'s ``post_hooks`` as ``{hook, exit_status, message}``, its message (the
    last line of its stderr) summarised by the log rule."""
    session = "post-hook"
    ran = world.native("demo.sad", {"k": 1}, session=session)
    assert ran.rc == 0, ran
    events = check_file(world, session)
    (result,) = results(events)
    assert result["status"] == "ok" and result["exit_status"] == 0, result
    (hook,) = result["post_hooks"]
    assert hook["hook"] == "hooks/post.d/20-sad" and hook["exit_status"] == 5, hook
    assert "post hook unhappy" in hook["message"], hook
    assert "post-secret-5512" not in world.session_file(session).read_text()
    log = (world.storage / "tool" / "demo.sad.d" / "log").read_text()
    assert "post-secret-5512" not in log
    check_rendering(world, session)


def test_an_interrupted_call_records_eintr_at_stage_run(world):
    """docs/sessions.md: SIGTERM to ``ctx run`` while its tool runs records the call as
    ended, ``EINTR`` at stage ``run``, before the interrupt goes on (exit 143)."""
    session = "interrupted"
    proc = subprocess.Popen(
        [*CTX_ARGV, "run", "--agent", AGENT, "--session", session, "--native", "demo.nap"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=world.env,
    )  # fmt: skip
    try:
        proc.stdin.write(b"{}")
        proc.stdin.close()
        proc.stdin = None
        first = proc.stdout.readline()
        assert json.loads(first)["type"] == "call", first
        assert wait_for(lambda: world.session_file(session).exists(), 10)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    events = check_file(world, session)
    (result,) = results(events)
    assert (result["errno"], result["stage"]) == ("EINTR", "run"), result
    check_rendering(world, session)


def test_mcp_backed_calls_are_ordinary_pairs_with_secrets_redacted(world):
    """M-4, S-2, S-4: a tool projected from an MCP stdio server is called like any other:
    its pair names ``tool/evk.echo``; a remote ``isError`` is an error at stage ``exit``; the
    input's and the remote message's secrets are redacted, and the server configuration's
    secret appears nowhere."""
    session = "mcp"
    ok = world.native("evk.echo", {"q": 1, "token": "mcp-input-secret-3313"}, session=session)
    assert ok.rc == 0, ok
    assert json.loads(ok.lines()[-1])["output"]["structuredContent"]["token"] == (
        "mcp-input-secret-3313"
    )  # what the caller gets is not redacted
    bad = world.native("evk.echo", {"fail": True}, session=session)
    assert bad.rc == 1, bad
    term = world.terminal("evk.echo", '{"w": 2}', session=session)
    assert term.rc == 0, term
    events = check_file(world, session)
    assert {e["object"] for e in events} == {"tool/evk.echo"}
    first, second, third = results(events)
    assert first["status"] == "ok" and first["output"]["structuredContent"]["token"] == (
        "[redacted]"
    ), first
    assert second["status"] == "error" and second["stage"] == "exit", second
    assert third["status"] == "ok", third
    raw = world.session_file(session).read_text()
    for secret in ("mcp-input-secret-3313", "mcp-secret-9931", "sk-evk-config-secret-000"):
        assert secret not in raw, secret
    check_rendering(world, session)


def test_worker_events_have_their_documented_facts_in_order(world):
    """W-1, W-4, S-2, S-5 (docs/workers.md): a ``ctx queue work --drain`` worker records,
    per job, ``queue.claim`` (``queue``, ``tool``, ``lease``), ``queue.start`` (``queue``,
    ``tool``), the runner's pair (its ``tool_call`` naming the ``job``) and ``queue.finish``
    (``queue``, ``state``), in that order and in time order; a request it refuses leaves
    ``queue.refuse`` (``reason``) and no pair; a timed-out job is finished failed."""
    session = "worker-kinds"
    env = world.env
    jobs = {
        "good": {"tool": "demo.echo", "input": {"i": 1, "password": "worker-secret-6612"}},
        "veto": {"tool": "demo.veto", "input": {}},
        "slow": {"tool": "demo.nap", "input": {}},
    }
    for name, req in jobs.items():
        req.update({"from": "t", "created": "2026-06-22T12:00:00Z"})
        r = world.ctx("queue", "publish", "--project", "jobs", "--name", name, "-",
                      input=json.dumps(req), env=env)  # fmt: skip
        assert r.rc == 0, r
    queue = world.storage / "shared" / "jobs" / "queue"
    (queue / "pending" / "junk.req.json").write_text("[1, 2]")
    worker = world.ctx("queue", "work", "--project", "jobs", "--agent", AGENT, "--session",
                       session, "--drain", "--timeout", "1", "--json")  # fmt: skip
    assert worker.rc == 0, worker
    stop = json.loads(worker.lines()[-1])
    assert (stop["event"], stop["done"], stop["failed"]) == ("stop", 1, 3), worker

    events = check_file(world, session)
    by_job: dict[str, list[dict]] = {}
    calls = check_call_pairs(events)
    for event in events:
        if event["type"].startswith("queue."):
            assert event["object"].startswith("queue/"), event
            assert event["queue"] == "shared/jobs/queue", event
            by_job.setdefault(event["object"].removeprefix("queue/"), []).append(event)
        elif event["type"] == "tool_call":
            by_job.setdefault(event["job"], []).append(event)
        else:
            by_job.setdefault(calls[event["call"]][0]["job"], []).append(event)
    assert set(by_job) == {f"{n}.req.json" for n in (*jobs, "junk")}, by_job
    for job, seq in by_job.items():
        kinds = [e["type"] for e in seq]
        times = [stamp(e) for e in seq]
        assert times == sorted(times), (job, seq)
        claim = seq[0]
        assert claim["type"] == "queue.claim" and claim["status"] == "ok", seq
        assert set(claim) - set(S2_KEYS) == {"queue", "tool", "lease"}, claim
        assert isinstance(claim["lease"], dict) and claim["lease"]["job"] == job, claim
        assert seq[-1]["type"] == "queue.finish", seq
        assert set(seq[-1]) - set(S2_KEYS) == {"queue", "state"}, seq[-1]
        if job == "junk.req.json":
            assert kinds == ["queue.claim", "queue.refuse", "queue.finish"], seq
            assert claim["tool"] is None and seq[1]["status"] == "error", seq
            assert isinstance(seq[1]["reason"], str) and seq[1]["reason"].startswith("EINVAL")
            assert seq[-1]["state"] == "failed" and seq[-1]["status"] == "error", seq
            continue
        assert kinds == ["queue.claim", "queue.start", "tool_call", "tool_result",
                         "queue.finish"], (job, kinds)  # fmt: skip
        assert set(seq[1]) - set(S2_KEYS) == {"queue", "tool"}, seq[1]
        assert seq[1]["tool"] == claim["tool"] == seq[2]["object"].removeprefix("tool/")
        assert seq[2]["mode"] == "native" and seq[2]["job"] == job, seq[2]
        state = "done" if job == "good.req.json" else "failed"
        assert seq[-1]["state"] == state, seq[-1]
        assert seq[-1]["status"] == ("ok" if state == "done" else "error"), seq[-1]
        assert seq[3]["status"] == seq[-1]["status"], seq
    slow = by_job["slow.req.json"][3]
    assert (slow["errno"], slow["stage"]) == ("ETIMEDOUT", "run"), slow
    assert "worker-secret-6612" not in world.session_file(session).read_text()
    check_rendering(world, session, exact_text=False)


def test_a_call_recorded_in_a_shared_space_has_the_same_shape(world):
    """S-1, S-2, S-6: a call recorded with ``--project`` lands in
    ``shared/<space>/agent/<agent>/session/<session>/events.jsonl`` with the same pair and
    facts, ``session`` the session's name; ``show --project`` renders it."""
    session = "in-space"
    ran = world.ctx("run", "--agent", AGENT, "--project", SPACE, "--session", session,
                    "--native", "demo.echo", input='{"s": 1}')  # fmt: skip
    assert ran.rc == 0, ran
    path = world.storage / "shared" / SPACE / "agent" / AGENT / "session" / session
    events = strict_lines(path / "events.jsonl")
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    for event in events:
        check_s2(event, AGENT, session)
    check_call_pairs(events)
    shown = world.ctx("session", "show", AGENT, session, "--project", SPACE, "--json")
    assert shown.rc == 0 and [json.loads(x) for x in shown.lines()] == events, shown
    text = world.ctx("session", "show", AGENT, session, "--project", SPACE)
    assert text.rc == 0 and text.out.splitlines() == [text_line(e).rstrip() for e in events]


def test_secrets_are_redacted_and_long_inputs_cut_as_documented(world):
    """S-4 (docs/sessions.md "What logs may say"): a value under a key naming a secret, a
    ``--token`` word and a ``Bearer`` credential in an argv are ``[redacted]``; a string keeps
    200 characters and says how many went, an object 20 keys (``[+N keys]``), a list 20 items,
    nesting stops at depth 6, a summary over 8 KiB becomes a note of its size, an argv byte
    that is not UTF-8 is written ``\\xNN``; the caller still gets the whole output."""
    session = "summaries"
    payload = {
        "apiKey": "redact-me-1",
        "nested": {"db_password": 12345, "ok": "visible"},
        "long": "L" * 500,
        "many": {f"k{i:02d}": i for i in range(25)},
        "items": list(range(30)),
        "deep": {"a": {"b": {"c": {"d": {"e": {"f": 1}}}}}},
    }
    ran = world.native("demo.echo", payload, session=session)
    assert ran.rc == 0, ran
    assert json.loads(ran.lines()[-1])["output"] == payload  # the caller's copy is whole
    words = ["deploy", "--token", "argv-secret-8821", b"\xffraw", "Authorization:", "Bearer",
             "bearer-secret-7"]  # fmt: skip
    term = world.terminal("demo.echo", *words, session=session)
    assert term.rc == 0, term
    huge = {"x": ["y" * 300] * 40, "z": {f"q{i}": "w" * 300 for i in range(20)}}
    assert world.native("demo.echo", huge, session=session).rc == 0

    events = check_file(world, session)
    n_call, _n_result, t_call, _t_result, h_call, h_result = events
    summary = n_call["input"]
    assert summary["apiKey"] == "[redacted]", summary
    assert summary["nested"] == {"db_password": "[redacted]", "ok": "visible"}, summary
    assert summary["long"].startswith("L" * 200) and "300" in summary["long"], summary
    assert not summary["long"].startswith("L" * 201), summary
    assert list(summary["many"])[:20] == [f"k{i:02d}" for i in range(20)], summary
    assert summary["many"]["[+5 keys]"] is None and len(summary["many"]) == 21, summary
    assert summary["items"][:20] == list(range(20)) and len(summary["items"]) == 21, summary
    assert "10" in str(summary["items"][20]), summary
    assert summary["deep"]["a"]["b"]["c"]["d"] != {"e": {"f": 1}}, summary  # cut at depth 6
    argv = t_call["argv"]
    assert argv[:2] == ["deploy", "--token"] and argv[2] == "[redacted]", argv
    assert argv[3] == "\\xffraw", argv
    assert "bearer-secret-7" not in json.dumps(argv), argv
    for event in (h_call, h_result):
        value = event["input"] if event is h_call else event["output"]
        assert isinstance(value, str) and re.fullmatch(r"\[summary of \d+ bytes elided\]", value)
    raw = world.session_file(session).read_bytes()
    for secret in (b"redact-me-1", b"12345", b"argv-secret-8821", b"bearer-secret-7"):
        assert secret not in raw, secret
    assert max(len(line) for line in raw.splitlines()) < 64 * 1024
    check_rendering(world, session)


def test_inputs_json_cannot_hold_leave_strict_lines_and_exotic_text_round_trips(world):
    """S-5, S-2 (docs/sessions.md): an input holding NaN and Infinity is refused at stage
    ``schema`` and its ``tool_call`` records it as text, never as a bare NaN; non-ASCII text,
    a bidirectional override, an escape sequence, a NUL, a lone surrogate, a big integer and
    -0.0 are stored as strict JSON and given back unchanged by ``show --json``, while the
    text form shows none of the controls raw."""
    session = "exotic"
    nan = world.native("demo.echo", '{"a": NaN, "b": Infinity}', session=session)
    assert nan.rc == 2, nan
    exotic = ('{"uni": "h\\u00e9llo \\u202e \\ud83d\\ude00", "ctl": "a\\u001b[31mred\\u0000z",'
              ' "sur": "\\ud800x", "big": 1180591620717411303424, "neg": -0.0}')  # fmt: skip
    assert world.native("demo.echo", exotic, session=session).rc == 0
    events = check_file(world, session)
    first = events[0]
    assert isinstance(first["input"], str) and "NaN" in first["input"], first
    assert (events[1]["errno"], events[1]["stage"]) == ("EINVAL", "schema"), events[1]
    stored = events[2]["input"]
    assert stored == json.loads(exotic), stored
    assert str(stored["neg"]) == "-0.0"
    check_rendering(world, session, exact_text=False)
    text = world.ctx("session", "show", AGENT, session)
    assert "\x1b" not in text.out and "\x00" not in text.out and "\u202e" not in text.out, text


def test_torn_line_is_skipped_by_readers_and_repair_reports_its_shape(world):
    """S-5 (docs/sessions.md "Reading, torn lines and repair"): a torn last line is skipped
    by ``show`` (and mentioned), ``repair --json`` prints ``{session, truncated_bytes,
    tightened, left}`` with those types and cuts exactly the fragment, and the next call's
    events follow the earlier ones whole."""
    session = "torn"
    assert world.native("demo.echo", {"before": 1}, session=session).rc == 0
    path = world.session_file(session)
    whole = path.read_bytes()
    fragment = b'{"ts":"2026-01-01T00:00:00Z","type":"tool_call","ag'
    with path.open("ab") as file:
        file.write(fragment)
    shown = world.ctx("session", "show", AGENT, session, "--json")
    assert shown.rc == 0 and len(shown.lines()) == 2 and "torn" in shown.err, shown
    repaired = world.ctx("session", "repair", AGENT, session, "--json")
    assert repaired.rc == 0, repaired
    answer = repaired.json()
    assert set(answer) == {"session", "truncated_bytes", "tightened", "left"}, answer
    assert answer["truncated_bytes"] == len(fragment), answer
    assert answer["session"] == f"home/{world.user.uid}/agent/{AGENT}/session/{session}"
    assert isinstance(answer["tightened"], list) and isinstance(answer["left"], list)
    assert path.read_bytes() == whole
    assert world.native("demo.echo", {"after": 2}, session=session).rc == 0
    assert len(check_file(world, session)) == 4
    check_rendering(world, session)


def test_agent_log_and_terminal_events_have_their_documented_facts(world):
    """A-1, S-3, T-3 (docs/sessions.md "An agent's log"): ``agent.created`` (``by``,
    ``label``, ``uid``, ``gid``), ``terminal.started`` (``pid``, ``workspace``) and
    ``terminal.stopped`` (``reason`` ``stop``) in ``agent/<name>.d/log``, S-2's shape each;
    a tool run by tsh in that terminal is an ordinary terminal-mode pair in the session."""
    session = "term"
    started = world.ctx("agent", "start", AGENT, "--session", session, "--json", cwd=world.ws)
    if started.rc != 0 and ("bubblewrap" in started.err or "bwrap" in started.err):
        pytest.skip(f"no agent terminal here: {started.err.strip()}")
    assert started.rc == 0, started
    try:
        client = Raw(Path(started.json()["listening_at"]), b"attach\n")
        try:
            assert client.shows(AGENT_PROMPT), client.text()
            client.type("demo.echo from-tsh")
            assert client.shows("from-tsh\r\n"), client.text()
            assert wait_for(
                lambda: (
                    world.session_file(session).exists()
                    and world.session_file(session).read_bytes().count(b"\n") >= 2
                ),
                15,
            )
        finally:
            client.close()
    finally:
        stopped = world.ctx("agent", "stop", AGENT, "--session", session)
    assert stopped.rc == 0, stopped
    events = check_file(world, session)
    calls = [e for e in events if e["type"] == "tool_call" and e["object"] == "tool/demo.echo"]
    assert calls and calls[0]["mode"] == "terminal" and calls[0]["argv"] == ["from-tsh"], events

    log_path = world.storage / "agent" / f"{AGENT}.d" / "log"
    assert wait_for(
        lambda: any(e["type"] == "terminal.stopped" for e in strict_lines(log_path)), 15
    )
    log = strict_lines(log_path)
    for event in log:
        assert list(event)[:6] == S2_KEYS, event
        stamp(event)
        assert event["agent"] == AGENT and event["object"] == f"agent/{AGENT}", event
    created = [e for e in log if e["type"] == "agent.created"]
    assert len(created) == 1 and created[0]["session"] == "", created
    assert created[0]["label"] == LABEL and created[0]["uid"] == world.user.uid, created
    assert type(created[0]["gid"]) is int and isinstance(created[0]["by"], str), created
    mine = [e for e in log if e["session"] == session]
    assert [e["type"] for e in mine] == ["terminal.started", "terminal.stopped"], log
    up, down = mine
    assert type(up["pid"]) is int and up["pid"] > 0, up
    assert up["workspace"] in (str(world.ws), None), up
    assert down["reason"] == "stop", down
    assert stamp(up) <= stamp(down)
    stamps = [stamp(e) for e in log]
    assert stamps == sorted(stamps), log
    check_rendering(world, session)


def test_every_session_written_here_has_strict_lines_and_calls_paired(world):
    """S-2, S-5: across every session of the agent in its home, whatever kinds it holds,
    each line is one strict UTF-8 JSON object starting with S-2's keys, and every
    ``tool_call`` has its ``tool_result``; ``ctx session list --json`` names each of them."""
    home = world.storage / "home" / str(world.user.uid) / "agent" / AGENT / "session"
    names: list[str] = []
    with contextlib.suppress(FileNotFoundError):
        names = sorted(p.name for p in home.iterdir() if (p / "events.jsonl").exists())
    if not names:
        assert world.native("demo.echo", {}, session="fresh").rc == 0
        names = ["fresh"]
    listed = world.ctx("session", "list", AGENT, "--json")
    assert listed.rc == 0, listed
    entries = listed.json()
    assert isinstance(entries, list) and all(set(e) == {"name", "path"} for e in entries)
    assert set(names) <= {e["name"] for e in entries}, (names, entries)
    for name in names:
        check_file(world, name)


def test_tsh_exiting_records_terminal_stopped_with_reason_exit_and_its_status(world):
    """A-1, S-3 (docs/sessions.md "An agent's log"): when tsh exits (``exit`` typed at its
    prompt) the terminal records ``terminal.stopped`` with ``reason`` ``exit`` and the
    ``exit_status``, an integer, after its ``terminal.started``."""
    session = "term-exit"
    started = world.ctx("agent", "start", AGENT, "--session", session, "--json", cwd=world.ws)
    if started.rc != 0 and ("bubblewrap" in started.err or "bwrap" in started.err):
        pytest.skip(f"no agent terminal here: {started.err.strip()}")
    assert started.rc == 0, started
    log_path = world.storage / "agent" / f"{AGENT}.d" / "log"

    def stopped() -> list[dict]:
        return [e for e in strict_lines(log_path)
                if e["session"] == session and e["type"] == "terminal.stopped"]  # fmt: skip

    try:
        client = Raw(Path(started.json()["listening_at"]), b"attach\n")
        try:
            assert client.shows(AGENT_PROMPT), client.text()
            client.type("exit")
            assert wait_for(lambda: bool(stopped()), 15), strict_lines(log_path)
        finally:
            client.close()
    finally:
        world.ctx("agent", "stop", AGENT, "--session", session)
    mine = [e for e in strict_lines(log_path) if e["session"] == session]
    assert [e["type"] for e in mine] == ["terminal.started", "terminal.stopped"], mine
    down = mine[1]
    assert list(down)[:6] == S2_KEYS and down["reason"] == "exit", down
    assert type(down["exit_status"]) is int, down
    assert stamp(mine[0]) <= stamp(down)
