"""What leaks out of a call: secrets into the records of a call, and the caller's environment
into what the call runs (SPEC S-3, S-4, T-3, T-5, T-6, T-7, W-1, M-4; docs/sessions.md "What
logs may say (S-4)", docs/tools.md "Environment", "Hooks (T-6)", "MCP servers as tool
sources").

Logs: a call's input (native stdin), its argv (terminal mode, and through tsh), its output,
its error message, a hook's message, an MCP call's arguments and a queue job run by a worker
all reach the session's ``events.jsonl`` and the tool's ``log`` only through the documented
rule (``cortexfs/shared/redact.py``): secret-naming keys of every spelling the rule names
lose their values at any depth and in lists, ``Bearer``/``Basic`` values, armored private
keys and well-known tokens go wherever they are, ``key=value`` text and secret options lose
their values, long text keeps its first 200 characters.  ``ctx session show`` and ``tail``
print what is stored.  What the caller gets (the ``result`` frame, a queue request or result,
which is queue evidence) keeps the data as it was.  Stderr is not logged, except the last
line the documented error message quotes (redacted).

Environment: a tool, a hook, an MCP server started by a projected tool, a worker's tool and a
tool run from tsh get exactly the documented variables (the tool's environment, plus
``CTX_HOOK`` for a hook, ``TERM`` in terminal mode, the configuration's ``env`` for an MCP
server), never the caller's ``AWS_SECRET_ACCESS_KEY``, ``SSH_AUTH_SOCK``, ``LD_PRELOAD``,
``PYTHONPATH`` or forged ``CTX_*`` values.  Agents run as the real test user ``ctxtest``
(the terminal's agent as ``nobody``)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    REPO,
    Run,
    clean_env,
    closing_all,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, Raw, coder_host
from tests.support.mcp_wire import WIRE
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: agents run as the test user's uid"
)

SCRATCH = scratch_top(__file__)
PYTHON = REPO / ".venv" / "bin" / "python"
CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
TOOL_PATH = "/usr/local/bin:/usr/bin:/bin"
# docs/tools.md "Environment": what a native call gets, and nothing else.
NATIVE_ENV = {
    "PATH", "HOME", "LANG", "CTX_AGENT", "CTX_SESSION", "CTX_CALL", "CTX_TOOL", "CTX_MODE",
    "CTX_PATH", "CTX_MOUNTS", "CTX_CWD",
}  # fmt: skip
# What a careless or hostile caller has in its environment: none of it is the tool's.
HOST_SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "aws-host-secret-41c7",
    "SSH_AUTH_SOCK": "/tmp/ssh-host-agent.sock",
    "LD_PRELOAD": "/tmp/host-preload.so",
    "PYTHONPATH": "/tmp/host-pythonpath",
    "GITHUB_TOKEN": "host-github-token-88d1",
    "CTX_MOUNTS": '[["/", "/", "rw"]]',
    "CTX_SESSION": "forged-session",
    "CTX_CALL": "forged-call",
    "CTX_TOOL": "forged-tool",
    "CTX_MODE": "forged-mode",
    "CTX_HOOK": "forged-hook",
    "CTX_CWD": "/",
    "HOME": "/root",
    "LANG": "fr_FR.ISO-8859-1",
    "LC_ALL": "fr_FR.ISO-8859-1",
}
# Prints its uid, argv and whole environment as one JSON object (stdin read and kept).
ENV_DUMP = """#!/usr/bin/python3 -I
import json, os, sys
data = sys.stdin.read() if os.environ.get("CTX_MODE") == "native" else ""
print(json.dumps({"uid": os.getuid(), "argv": sys.argv[1:], "stdin": data,
                  "env": dict(os.environ)}))
"""
# Prints its stdin back (native: the JSON input; terminal: whatever stdin held), and a line
# of its own on stderr.
ECHO = """#!/bin/sh
input=$(cat)
printf '%s\\n' "echo tool's own stderr line" >&2
printf '%s\\n' "$input"
"""


def secret_spellings() -> dict[str, str]:
    """One secret per documented shape, each a distinct marker that must never be logged."""
    return {
        "password": "PWnested-a1",
        "apiKey": "AKcamel-b2",
        "API-KEY": "AKshout-c3",
        "api_key": "AKsnake-d4",
        "x-auth": "XAUTH-e5",
        "client_secret": "CSEC-f6",
        "Cookie": "sid=COOK-g7",
        "privateKey": "PRIV-h8",
        "credentials": "CRED-i9",
    }


def secret_input() -> tuple[dict, list[str]]:
    """A native input holding a secret in every shape the rule names, and those secrets."""
    keyed = secret_spellings()
    pem = (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1PEMBODY-j10\n"
        "-----END OPENSSH PRIVATE KEY-----"
    )
    value = {
        "db": {"conn": {"settings": keyed}},
        "hosts": [{"name": "a", "token": "TKlist-k11"}, {"name": "b", "token": 12345678}],
        "tokens": ["TKarr-l12", "TKarr-m13"],
        "headers": {"X-Forwarded": "Bearer BRany-n14"},
        "note": "Basic QmFzaWMtbzE1",
        "key_file": pem,
        "env": [{"name": "DB_PASSWORD", "value": "PWpair-p16"}],
        "pair": ["Authorization", "Bearer BRpair-q17"],
        "argv": ["psql", "--port", 5432, "--password", "PWargv-r18"],
        "cmd": "curl -H 'Authorization: token GHhdr-s19' https://api/?api_key=AKurl-t20&page=2",
        "url": "postgres://app:PWurl-u21@db/app",
        "gh": "ghp_" + "Z" * 36,
        "long": "L" * 5000,
    }
    secrets = [
        *(v.split("=")[-1] for v in keyed.values()),
        "TKlist-k11", "12345678", "TKarr-l12", "TKarr-m13", "BRany-n14", "QmFzaWMtbzE1",
        "PEMBODY-j10", "PWpair-p16", "BRpair-q17", "PWargv-r18", "GHhdr-s19", "AKurl-t20",
        "PWurl-u21", "Z" * 36,
    ]  # fmt: skip
    return value, secrets


# ---------------------------------------------------------------------------------- helpers


@dataclass
class Host:
    """A storage root every uid may search, in a scratch directory of its own; agent
    ``coder`` runs as the test user."""

    top: Path
    storage: Path
    user: UnprivilegedUser

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage), PATH=PATH)

    def ctx(self, *args, env: dict | None = None, **kw) -> Run:
        return ctx_run(*args, env={**self.env, **(env or {})}, **kw)

    def install(self, name: str, program: str, schema: dict | None = None) -> None:
        manifest = tool_manifest(self.top / "src", name, program)
        if schema is not None:
            document = json.loads(manifest.read_text())
            document["schema"] = schema
            manifest.write_text(json.dumps(document))
        done = self.ctx("object", "install", manifest, "--tier", "system")
        assert done.rc == 0, done

    def grant(self, *tools: str) -> None:
        for tool in tools:
            with (self.storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
                policy.write(f"allow coder_t tool:{tool} execute\n")

    def agent(self, tools: list[str], mount: list | None = None) -> None:
        req = {"name": "coder", "label": "coder_t", "tools": tools, "mount": mount or []}
        made = self.ctx("agent", "create", "-", "--user", self.user.name, input=json.dumps(req))
        assert made.rc == 0, made
        self.grant(*tools)

    def session(self, name: str = "default") -> Path:
        return self.storage / "home" / str(self.user.uid) / "agent" / "coder" / "session" / name

    def events(self, name: str = "default") -> list[dict]:
        return read_jsonl(self.session(name) / "events.jsonl")

    def log(self, tool: str) -> Path:
        return self.storage / "tool" / f"{tool}.d" / "log"

    def native(self, tool: str, value, *opts: str, env: dict | None = None) -> dict:
        text = value if isinstance(value, str) else json.dumps(value)
        ran = self.ctx("run", "--agent", "coder", "--native", *opts, tool, input=text, env=env)
        frames = [json.loads(line) for line in ran.lines() if line.strip()]
        assert frames and frames[-1]["type"] == "result", ran
        return frames[-1]

    def records(self, session: str, *tools: str) -> str:
        """Every byte the call records hold: the session and each tool's log."""
        texts = [(self.session(session) / "events.jsonl").read_text()]
        texts += [self.log(tool).read_text() for tool in tools]
        return "\n".join(texts)


@pytest.fixture(scope="module")
def user() -> UnprivilegedUser:
    return find_or_create_user()


@pytest.fixture
def host(_template: Path, user: UnprivilegedUser) -> Iterator[Host]:
    top = new_scratch_dir(SCRATCH, "h")
    try:
        yield Host(top, copy_of_root(_template, top / "storage"), user)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def leaked(text: str, secrets: list[str]) -> list[str]:
    return [secret for secret in secrets if secret in text]


def home_of(user: UnprivilegedUser) -> str:
    return pwd.getpwuid(user.uid).pw_dir or "/"


def assert_tool_environment(host: Host, env: dict[str, str], mode: str, tool: str) -> None:
    """``env`` is exactly the documented environment of a ``mode`` call of ``tool`` (plus
    ``TERM`` in terminal mode), whatever the caller had."""
    expected = NATIVE_ENV | ({"TERM"} if mode == "terminal" else set())
    assert set(env) == expected, sorted(set(env) ^ expected)
    assert env["PATH"] == TOOL_PATH and env["LANG"] == "C.UTF-8", env
    assert env["HOME"] == home_of(host.user), env
    assert (env["CTX_AGENT"], env["CTX_TOOL"], env["CTX_MODE"]) == ("coder", tool, mode), env
    assert env["CTX_PATH"] == f"/ctx/tool:/ctx/home/{host.user.uid}/tool", env
    assert ["/", "/", "rw"] not in json.loads(env["CTX_MOUNTS"]), env
    for value in HOST_SECRETS.values():
        assert value not in env.values(), (value, env)


# ------------------------------------------------------------------ what the records keep


def test_native_secrets_of_every_documented_shape_stay_out_of_both_records_and_their_readers(
    host: Host,
) -> None:
    """S-4, T-7: a native input (and the same output) holding secrets under every spelling
    of the key rule, at depth, in lists, as name/value and two-word pairs, as a command line,
    as Bearer/Basic values, an armored key, a URL password and a GitHub token reaches the
    session, the tool's log, ``ctx session show --json`` and ``tail --json`` with none of
    them, and a 5000-character text as its first 200 characters with the count dropped; the
    ``result`` frame keeps the output as the tool printed it."""
    host.install("demo.echo", ECHO)
    host.agent(["demo.echo"])
    value, secrets = secret_input()
    result = host.native("demo.echo", value, "--session", "s1")
    assert result["status"] == "ok", result
    assert result["output"] == value  # what the caller gets is the tool's output, whole
    records = host.records("s1", "demo.echo")
    assert leaked(records, secrets) == [], records
    call, done = (e for e in host.events("s1") if e["type"] in ("tool_call", "tool_result"))
    logged = read_jsonl(host.log("demo.echo"))[-1]
    for summary in (call["input"], done["output"], logged["input"], logged["output"]):
        assert summary["db"]["conn"]["settings"] == dict.fromkeys(secret_spellings(), "[redacted]")
        assert summary["env"] == [{"name": "DB_PASSWORD", "value": "[redacted]"}], summary
        assert summary["pair"] == ["Authorization", "[redacted]"], summary
        assert summary["argv"] == ["psql", "--port", 5432, "--password", "[redacted]"]
        assert summary["long"] == "L" * 200 + "…[+4800 chars]", summary["long"][-40:]
    for verb in ("show", "tail"):
        shown = host.ctx("session", verb, "coder", "--session", "s1", "--json")
        assert shown.rc == 0, shown
        assert leaked(shown.out, secrets) == [] and shown.out.count("[redacted]") > 20, shown


def test_terminal_argv_secrets_are_redacted_and_its_stdin_and_stdout_never_recorded(
    host: Host,
) -> None:
    """S-4, T-3: ``ctx run --agent coder TOOL --password=x …``: the argv in both records keeps
    every word but the secrets the rule names (``--password=X``, ``--password X``,
    ``--api-key X``, ``--apiKey X``, ``TOKEN=X``, ``Authorization: Bearer X`` as one word and
    as three, a URL password); the tool gets its argv as given; what it read on stdin and
    wrote on stdout, inherited from the caller, is in neither record."""
    host.install("demo.echo", ECHO)
    host.agent(["demo.echo"])
    argv = [
        "--password=PWt1", "--password", "PWt2", "--api-key", "AKt3", "--apiKey", "AKt4",
        "AWS_SECRET_ACCESS_KEY=SKt5", "-H", "Authorization: Bearer BRt6", "Authorization:",
        "Bearer", "BRt7", "https://ana:PWt8@git.example/r", "--token=TKt9",
    ]  # fmt: skip
    ran = host.ctx("run", "--agent", "coder", "--session", "s2", "demo.echo", *argv,
                   input="stdin holds PLAINSTDIN-10 and password=PWt11\n")  # fmt: skip
    assert ran.rc == 0, ran
    assert ran.out == "stdin holds PLAINSTDIN-10 and password=PWt11\n", ran
    secrets = ["PWt1", "PWt2", "AKt3", "AKt4", "SKt5", "BRt6", "BRt7", "PWt8", "TKt9"]
    records = host.records("s2", "demo.echo")
    assert leaked(records, [*secrets, "PLAINSTDIN-10", "PWt11", "own stderr"]) == [], records
    call = next(e for e in host.events("s2") if e["type"] == "tool_call")
    assert call["argv"] == [
        "--password=[redacted]", "--password", "[redacted]", "--api-key", "[redacted]",
        "--apiKey", "[redacted]", "AWS_SECRET_ACCESS_KEY=[redacted]", "-H",
        "Authorization: [redacted]", "Authorization:", "Bearer", "[redacted]",
        "https://ana:[redacted]@git.example/r", "--token=[redacted]",
    ], call  # fmt: skip
    assert read_jsonl(host.log("demo.echo"))[-1]["argv"] == call["argv"]


def test_native_input_that_is_not_json_is_recorded_as_text_under_the_same_rule(
    host: Host,
) -> None:
    """docs/tools.md (input that is not JSON, or that JSON readers disagree on, is refused at
    stage ``schema``, its text summarised as an input is), S-4: YAML-ish text, a name given
    twice and a ``NaN`` are recorded without the secrets they hold, and the refusal says
    why without them."""
    host.install("demo.echo", ECHO)
    host.agent(["demo.echo"])
    texts = [
        "password: PWx1\napi_key=AKx2 Authorization: Bearer BRx3",
        '{"password": "a", "password": "PWx4"}',
        '{"token": "TKx5", "n": NaN}',
    ]
    for text in texts:
        frame = host.native("demo.echo", text, "--session", "s7")
        assert (frame["error"]["error"], frame["error"]["stage"]) == ("EINVAL", "schema"), frame
        assert frame["exit_status"] is None, frame  # never started
    records = host.records("s7", "demo.echo")
    assert leaked(records, ["PWx1", "AKx2", "BRx3", "PWx4", "TKx5"]) == [], records
    inputs = [e["input"] for e in host.events("s7") if e["type"] == "tool_call"]
    assert inputs[0] == "password: [redacted]\napi_key=[redacted] Authorization: [redacted]"
    assert all(isinstance(text, str) for text in inputs), inputs


def test_a_host_call_of_a_safe_core_tool_logs_its_argv_redacted(host: Host) -> None:
    """H-3, T-7, S-4: ``ctx tool tsh.config`` run by the host as itself leaves a line of the
    tool's log with the caller's uid and its argv, secrets redacted, even when refused."""
    ran = host.ctx("tool", "tsh.config", "--token=TKh1", "password=PWh2")
    assert ran.rc == 2 and ran.err.startswith("ctx: EINVAL: "), ran
    line = read_jsonl(host.log("tsh.config"))[-1]
    assert (line["mode"], line["uid"], line["agent"]) == ("host", 0, ""), line
    assert line["argv"] == ["--token=[redacted]", "password=[redacted]"], line
    assert leaked(host.log("tsh.config").read_text(), ["TKh1", "PWh2"]) == []


def test_a_failing_tools_message_and_last_stderr_line_are_redacted_and_earlier_stderr_unlogged(
    host: Host,
) -> None:
    """S-4, docs/tools.md stage ``exit``: a tool that names its errno with a message holding
    a password, a Bearer header and a private key, and one that exits non-zero with a
    secret on its last stderr line (the message quotes it): both records keep the errno and
    the message without the secrets; stderr lines before the last are in neither record,
    though the ``result`` frame's ``stderr`` has them."""
    message = (
        "login refused: password=PWm2, sent Authorization: Bearer BRm3 and "
        "-----BEGIN RSA PRIVATE KEY-----\nKEYm4\n-----END RSA PRIVATE KEY-----"
    )
    printed = json.dumps({"errno": 13, "message": message})
    named = f"""#!/bin/sh
cat >/dev/null
echo "first stderr line EARLYERR-1" >&2
printf '%s\\n' '{printed}'
exit 1
"""
    plain = """#!/bin/sh
cat >/dev/null
echo "first stderr line EARLYERR-5" >&2
echo "connect failed: api_key=AKm6 token: TKm7" >&2
exit 4
"""
    host.install("demo.named", named)
    host.install("demo.plain", plain)
    host.agent(["demo.named", "demo.plain"])
    first = host.native("demo.named", {}, "--session", "s3")
    second = host.native("demo.plain", {}, "--session", "s3")
    assert first["error"]["error"] == "EACCES" and first["error"]["stage"] == "exit", first
    assert "PWm2" in first["error"]["message"] and "EARLYERR-1" in first["stderr"], first
    assert second["error"]["errno"] is None and second["exit_status"] == 4, second
    assert "AKm6" in second["error"]["message"], second  # the caller's copy is whole
    records = host.records("s3", "demo.named", "demo.plain")
    secrets = ["PWm2", "BRm3", "KEYm4", "AKm6", "TKm7", "EARLYERR-1", "EARLYERR-5"]
    assert leaked(records, secrets) == [], records
    results = [e for e in host.events("s3") if e["type"] == "tool_result"]
    assert [(e["errno"], e["stage"]) for e in results] == [("EACCES", "exit"), (None, "exit")]
    assert results[0]["message"].endswith(
        ": login refused: password=[redacted], sent Authorization: [redacted] and [redacted]"
    ), results
    assert results[1]["message"].endswith("api_key=[redacted] token: [redacted]"), results


def test_hook_messages_are_redacted_their_stdout_unlogged_and_they_get_the_tools_environment(
    host: Host,
) -> None:
    """T-6, S-4: a pre-hook's veto and a post-hook's failure quote the last line of their
    stderr, which holds secrets: recorded redacted; what they write on stdout is dropped;
    each hook runs as the agent with the tool's environment plus ``CTX_HOOK``, none of the
    caller's variables."""
    host.install("demo.echo", ECHO)
    host.agent(["demo.echo"])
    out = host.top / "out"
    out.mkdir(mode=0o777)
    out.chmod(0o1777)
    hooks = host.storage / "tool" / "demo.echo.d" / "hooks"
    dump = f"""#!/usr/bin/python3 -I
import json, os, sys
event = json.load(sys.stdin)
name = os.path.join({str(out)!r}, event["hook"] + ".json")
with open(name, "w") as f:
    json.dump({{"uid": os.getuid(), "env": dict(os.environ)}}, f)
print("hook stdout HOOKOUT-1 password=PWk0")
print("hook earlier line HOOKEARLY-2", file=sys.stderr)
if event["hook"] == "pre" and event["input"].get("veto"):
    print("vetoed: secret=SKk3 and Bearer BRk4", file=sys.stderr)
    sys.exit(1)
if event["hook"] == "post":
    print("post failed: passwd=PWk5 ghp_{"Y" * 36}", file=sys.stderr)
    sys.exit(3)
"""
    for kind in ("pre", "post"):
        hook = hooks / f"{kind}.d" / "10-dump"
        hook.write_text(dump)
        hook.chmod(0o755)
    env = {**host.env, **HOST_SECRETS}
    passed = host.native("demo.echo", {"x": 1}, "--session", "s4", env=env)
    vetoed = host.native("demo.echo", {"veto": True}, "--session", "s4", env=env)
    assert passed["status"] == "ok" and passed["post_hooks"][0]["exit_status"] == 3, passed
    assert (vetoed["error"]["error"], vetoed["error"]["stage"]) == ("EACCES", "hook"), vetoed
    records = host.records("s4", "demo.echo")
    secrets = ["PWk0", "HOOKOUT-1", "HOOKEARLY-2", "SKk3", "BRk4", "PWk5", "Y" * 36]
    assert leaked(records, secrets) == [], records
    results = [e for e in host.events("s4") if e["type"] == "tool_result"]
    assert results[0]["post_hooks"][0]["message"] == "post failed: passwd=[redacted] [redacted]"
    assert results[1]["message"].endswith("vetoed: secret=[redacted] and Bearer [redacted]")
    for kind in ("pre", "post"):
        seen = json.loads((out / f"{kind}.json").read_text())
        assert seen["uid"] == host.user.uid, seen
        assert seen["env"].pop("CTX_HOOK") == kind, seen
        assert_tool_environment(host, seen["env"], "native", "demo.echo")


def test_a_schema_error_naming_the_secret_key_itself_is_recorded_without_the_value(
    host: Host,
) -> None:
    """S-4 (an error message is text: ``key: value`` after a secret-naming key loses its
    value), docs/tools.md stage ``schema``: the validator's message quoting a refused value at
    ``/db/password`` or ``/apiKey`` is recorded with ``[redacted]`` in place of the value,
    while the caller's frame quotes it."""
    schema = {
        "type": "object",
        "properties": {
            "db": {"type": "object", "properties": {"password": {"type": "integer"}}},
            "apiKey": {"enum": ["a"]},
        },
    }
    host.install("demo.typed", ECHO, schema)
    host.agent(["demo.typed"])
    nested = host.native("demo.typed", {"db": {"password": "PWs1"}}, "--session", "s5")
    enum = host.native("demo.typed", {"apiKey": "AKs2"}, "--session", "s5")
    for frame, secret in ((nested, "PWs1"), (enum, "AKs2")):
        assert frame["error"]["stage"] == "schema" and secret in frame["error"]["message"]
    records = host.records("s5", "demo.typed")
    assert leaked(records, ["PWs1", "AKs2"]) == [], records


def test_a_schema_error_below_a_secret_key_does_not_repeat_the_redacted_value(
    host: Host,
) -> None:
    """S-4 (the value under a key naming a secret is redacted whatever its type, a list or an
    object): ``{"passwords": ["PWl1"]}`` refused at ``/passwords/0`` and ``{"tokens":
    {"github": "TKl2"}}`` at ``/tokens/github`` are recorded with their inputs redacted, and
    their error messages must not give those values back, in either validator (the subset,
    and jsonschema for a ``$ref`` schema); nor may the message for the input
    ``["--password", "PWl3"]``, recorded as the command line it is."""
    plain = {
        "type": "object",
        "properties": {
            "passwords": {"type": "array", "items": {"type": "integer"}},
            "tokens": {"type": "object", "additionalProperties": {"type": "integer"}},
        },
    }
    reffed = {
        "type": "object",
        "$defs": {"i": {"type": "integer"}},
        "properties": {
            "passwords": {"type": "array", "items": {"$ref": "#/$defs/i"}},
            "tokens": {"type": "object", "additionalProperties": {"$ref": "#/$defs/i"}},
        },
    }
    host.install("demo.plain", ECHO, plain)
    host.install("demo.reffed", ECHO, reffed)
    host.agent(["demo.plain", "demo.reffed"])
    for tool in ("demo.plain", "demo.reffed"):
        for value in ({"passwords": ["PWl1"]}, {"tokens": {"github": "TKl2"}}):
            frame = host.native(tool, value, "--session", "s6")
            assert frame["error"]["stage"] == "schema", frame
    listed = host.native("demo.plain", ["--password", "PWl3"], "--session", "s6")
    assert listed["error"]["stage"] == "schema", listed
    calls = [e["input"] for e in host.events("s6") if e["type"] == "tool_call"]
    assert calls[:4] == [{"passwords": "[redacted]"}, {"tokens": "[redacted]"}] * 2, calls
    assert calls[4] == ["--password", "[redacted]"], calls
    records = host.records("s6", "demo.plain", "demo.reffed")
    assert leaked(records, ["PWl1", "TKl2", "PWl3"]) == [], records


# --------------------------------------------------------------------------- queue and worker


def test_a_published_request_keeps_its_secrets_in_the_queue_and_none_in_the_workers_records(
    host: Host,
) -> None:
    """W-1, S-4, §2.1: a request published with secrets in its input is evidence as it was
    (``pending/J``, then ``done/J``); the worker's session (``queue.claim``, ``queue.start``,
    ``tool_call``, ``tool_result``, ``queue.finish``) and the tool's log carry none of them;
    ``done/J.result`` holds the output the caller gets, whole.  The worker was started with
    the caller's secrets in its environment, and the tool got none of them."""
    host.install("demo.echo", ECHO)
    host.install("env.dump", ENV_DUMP)
    host.agent(["demo.echo", "env.dump"])
    assert host.ctx("queue", "init", "--project", "proj").rc == 0
    value, secrets = secret_input()
    jobs = {
        "echo": {"tool": "demo.echo", "input": value, "from": "tester", "api_token": "TKx99"},
        "env": {"tool": "env.dump", "input": {}},
    }
    for name, req in jobs.items():
        done = host.ctx("queue", "publish", "--project", "proj", "--name", name, "-",
                        input=json.dumps(req))  # fmt: skip
        assert done.rc == 0, done
    queue = host.storage / "shared" / "proj" / "queue"
    assert json.loads((queue / "pending" / "echo.req.json").read_text())["input"] == value
    worked = host.ctx("queue", "work", "--project", "proj", "--agent", "coder", "--session",
                      "w", "--drain", env=HOST_SECRETS)  # fmt: skip
    assert worked.rc == 0, worked
    assert json.loads((queue / "done" / "echo.req.json").read_text())["input"] == value
    assert json.loads((queue / "done" / "echo.req.json.result").read_text())["output"] == value
    records = host.records("w", "demo.echo", "env.dump")
    assert leaked(records, [*secrets, "TKx99"]) == [], records
    kinds = [e["type"] for e in host.events("w") if e["object"] == "queue/echo.req.json"]
    assert kinds == ["queue.claim", "queue.start", "queue.finish"], kinds
    seen = json.loads((queue / "done" / "env.req.json.result").read_text())["output"]
    assert seen["uid"] == host.user.uid, seen
    assert seen["env"]["CTX_SESSION"] == "w", seen
    assert_tool_environment(host, seen["env"], "native", "env.dump")


def drop(queue: Path, name: str, document: dict) -> None:
    """A malformed request put in ``pending/`` by hand (``ctx queue publish`` refuses it)."""
    (queue / "pending" / f"{name}.req.json").write_text(json.dumps(document))


def test_a_malformed_requests_refusal_is_recorded_in_the_workers_session_without_its_secrets(
    host: Host,
) -> None:
    """S-4, docs/workers.md stage ``request``: a request put in ``pending/`` by hand whose
    ``tool`` is ``--password=PWr1`` and ``created`` is ``secret=SKr2`` fails with EINVAL at
    stage ``request`` (its result, queue evidence, may say why as it likes); the worker's
    session records the refusal as an error message, which the rule redacts like any other
    (``key=value`` after a secret-naming key)."""
    host.agent([])
    assert host.ctx("queue", "init", "--project", "proj").rc == 0
    queue = host.storage / "shared" / "proj" / "queue"
    drop(queue, "bad", {"tool": "--password=PWr1", "input": {}, "created": "secret=SKr2"})
    worked = host.ctx("queue", "work", "--project", "proj", "--agent", "coder", "--session",
                      "w", "--drain")  # fmt: skip
    assert worked.rc == 0, worked
    result = json.loads((queue / "failed" / "bad.req.json.result").read_text())
    assert result["reason"].startswith("EINVAL: ") and result["error"]["stage"] == "request"
    refusals = [e for e in host.events("w") if e["type"] == "queue.refuse"]
    assert len(refusals) == 1, host.events("w")
    records = (host.session("w") / "events.jsonl").read_text()
    assert leaked(records, ["PWr1", "SKr2"]) == [], records


def test_a_malformed_request_with_a_long_field_is_refused_as_malformed_and_logged_short(
    host: Host,
) -> None:
    """S-4 (long text keeps its first 200 characters; an event stays one short line),
    docs/workers.md stage ``request``: requests put in ``pending/`` by hand whose ``created``
    is 20 000 and 70 000 characters long both fail with EINVAL at stage ``request``, and the
    worker's session records each refusal on a line far shorter than the field."""
    host.agent([])
    assert host.ctx("queue", "init", "--project", "proj").rc == 0
    queue = host.storage / "shared" / "proj" / "queue"
    for name, size in (("long", 20_000), ("longer", 70_000)):
        drop(queue, name, {"tool": "fs.stat", "input": {}, "created": "y" * size})
    worked = host.ctx("queue", "work", "--project", "proj", "--agent", "coder", "--session",
                      "w", "--drain")  # fmt: skip
    assert worked.rc == 0, worked
    for name in ("long", "longer"):
        result = json.loads((queue / "failed" / f"{name}.req.json.result").read_text())
        assert result["error"]["stage"] == "request", (name, result["reason"][:200])
    lines = (host.session("w") / "events.jsonl").read_text().splitlines()
    refusals = [line for line in lines if '"queue.refuse"' in line]
    assert len(refusals) == 2 and all(len(line) < 8192 for line in refusals), [
        len(line) for line in refusals
    ]


# --------------------------------------------------------------------------------- environment


def test_native_and_terminal_tools_get_exactly_the_documented_environment(host: Host) -> None:
    """T-3, T-5, docs/tools.md "Environment": whatever the caller's environment holds
    (credentials, an agent socket, a preload, a Python path, forged ``CTX_*`` values, its own
    home and locale), a native call's tool gets exactly the documented variables, a
    terminal call's the same plus ``TERM`` (the caller's when a plain terminfo name, else
    ``xterm-256color``), as the test user."""
    host.install("env.dump", ENV_DUMP)
    host.agent(["env.dump"])
    env = {**host.env, **HOST_SECRETS, "TERM": "screen-256color"}
    native = host.native("env.dump", {}, "--session", "e1", env=env)
    assert native["status"] == "ok", native
    assert native["output"]["uid"] == host.user.uid, native
    assert native["output"]["env"]["CTX_SESSION"] == "e1", native
    assert_tool_environment(host, native["output"]["env"], "native", "env.dump")
    for term, expected in (("screen-256color", "screen-256color"), ("x\x1b]0;t\x07", None)):
        ran = host.ctx("run", "--agent", "coder", "--session", "e2", "env.dump", "--flag",
                       env={**env, "TERM": term})  # fmt: skip
        assert ran.rc == 0, ran
        seen = json.loads(ran.out)
        assert seen["argv"] == ["--flag"] and seen["uid"] == host.user.uid, seen
        assert seen["env"]["TERM"] == (expected or "xterm-256color"), seen
        assert_tool_environment(host, seen["env"], "terminal", "env.dump")


MCP_SERVER = (
    WIRE
    + r"""
OUT = sys.argv[1]
while True:
    message = receive()
    if "id" not in message:
        continue
    method, ident = message.get("method"), message["id"]
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "probe", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": [
            {"name": "echo", "description": "Echo.", "inputSchema": {"type": "object"}}]}})
    elif method == "tools/call":
        arguments = message["params"].get("arguments", {})
        with open(os.path.join(OUT, os.environ.get("CTX_MODE", "none") + ".json"), "w") as f:
            json.dump({"uid": os.getuid(), "env": dict(os.environ)}, f)
        failed = bool(arguments.get("fail"))
        text = "remote refused: password=PWsrv9 Bearer BRsrv10" if failed else json.dumps(
            arguments)
        send({"jsonrpc": "2.0", "id": ident,
              "result": {"content": [{"type": "text", "text": text}], "isError": failed}})
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
"""
)


@pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed in the venv")
def test_an_mcp_servers_environment_and_the_call_arguments_records_through_ctxmcp(
    host: Host,
) -> None:
    """M-4, docs/tools.md "MCP servers as tool sources" (the server runs as the agent with the
    environment of the call plus the configuration's ``env``), S-4: a projected tool called
    natively and in terminal mode with the caller's secrets in its environment starts its
    server as the test user with the tool's environment and the configuration's token only;
    call arguments holding secrets and the server's ``isError`` text holding a password are
    recorded redacted; the candidate manifest never copies the configuration's token."""
    mcp = host.top / "mcp"
    mcp.mkdir(mode=0o755)
    out = host.top / "seen"
    out.mkdir()
    out.chmod(0o1777)
    (mcp / "server.py").write_text(MCP_SERVER)
    config = mcp / "mcp.json"
    token = "sk-config-token-3f9a0c77d1e24b6a"
    entry = {"command": str(PYTHON), "args": [str(mcp / "server.py"), str(out)],
             "env": {"API_TOKEN": token}}  # fmt: skip
    config.write_text(json.dumps({"mcpServers": {"probe": entry}}))
    candidates = host.top / "candidates"
    projected = subprocess.run(
        [str(CTXMCP), "project", "--config", str(config), "--runtime-config", str(config),
         "--server", "probe", "--out", str(candidates)],
        capture_output=True, text=True, env=host.env, timeout=60,
    )  # fmt: skip
    assert projected.returncode == 0, projected
    manifest = candidates / "probe.echo.manifest.json"
    assert token not in manifest.read_text()
    assert host.ctx("object", "install", manifest, "--tier", "system").rc == 0
    host.agent(["probe.echo"], mount=[[str(mcp), str(mcp), "ro"]])
    env = {**host.env, **HOST_SECRETS, "TERM": "vt100"}
    arguments = {"auth": {"user": "ana", "password": "PWmcp1"}, "query": "Bearer BRmcp2"}
    called = host.native("probe.echo", arguments, "--session", "m", env=env)
    assert called["status"] == "ok", called
    ran = host.ctx("run", "--agent", "coder", "--session", "m", "probe.echo",
                   json.dumps({"api_key": "AKmcp3"}), env=env)  # fmt: skip
    assert ran.rc == 0, ran
    refused = host.native("probe.echo", {"fail": True}, "--session", "m", env=env)
    assert refused["error"]["error"] == "EREMOTEIO", refused
    records = host.records("m", "probe.echo")
    secrets = ["PWmcp1", "BRmcp2", "AKmcp3", "PWsrv9", "BRsrv10", token]
    assert leaked(records, secrets) == [], records
    for mode in ("native", "terminal"):
        seen = json.loads((out / f"{mode}.json").read_text())
        assert seen["uid"] == host.user.uid, seen
        assert seen["env"].pop("API_TOKEN") == token, seen
        seen["env"].pop("LC_CTYPE", None)  # Python's own locale coercion (PEP 538) may add it
        assert_tool_environment(host, seen["env"], mode, "probe.echo")


@pytest.mark.skipif(
    shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs bubblewrap and /dev/fuse",
)
def test_a_tool_run_from_tsh_gets_the_terminal_environment_and_its_argv_is_recorded_redacted(
    _template: Path,
) -> None:
    """H-1, H-2, T-3, S-4: a terminal started by an operator whose environment holds
    credentials, an agent socket, a preload and forged ``CTX_*`` values runs a tool typed at
    tsh with the documented terminal environment only; the secret options typed on that
    line are recorded redacted in the terminal's session."""
    with coder_host(_template, SCRATCH, ["env.dump"], {}) as host, closing_all() as opened:
        host.install("env.dump", ENV_DUMP)
        host.grant_in_tool("env.dump")
        env = {**host.env, **HOST_SECRETS, "PATH": PATH, "TERM": "vt100"}
        session = "t1"
        started = ctx_run("agent", "start", "coder", "--session", session, "--json",
                          env=env, cwd=host.ws)  # fmt: skip
        assert started.rc == 0, started
        host.started.append(session)
        typist = Raw(Path(started.json()["listening_at"]), b"attach\n")
        opened.append(typist)
        assert typist.shows(AGENT_PROMPT), typist.text()
        answer = typist.answer("env.dump --password PWtsh1 --api-key=AKtsh2")
        seen = json.loads(answer[answer.index("{") : answer.rindex("}") + 1])
        assert seen["argv"] == ["--password", "PWtsh1", "--api-key=AKtsh2"], seen
        assert seen["uid"] == host.uid, seen
        env_seen = seen["env"]
        expected = NATIVE_ENV | {"TERM"}
        assert set(env_seen) == expected, sorted(set(env_seen) ^ expected)
        assert (env_seen["PATH"], env_seen["LANG"]) == (TOOL_PATH, "C.UTF-8"), env_seen
        assert (env_seen["CTX_MODE"], env_seen["CTX_SESSION"]) == ("terminal", session)
        for value in HOST_SECRETS.values():
            assert value not in env_seen.values(), (value, env_seen)
        assert wait_for(lambda: len(host.calls(session, "env.dump")) == 2), host.events(session)
        call = host.calls(session, "env.dump", "tool_call")[0]
        assert call["argv"] == ["--password", "[redacted]", "--api-key=[redacted]"], call
        text = (host.session_dir(session) / "events.jsonl").read_text()
        text += (host.storage / "tool" / "env.dump.d" / "log").read_text()
        assert leaked(text, ["PWtsh1", "AKtsh2"]) == [], text
