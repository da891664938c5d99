"""The tool runner end to end: real executables, a real second uid, real process groups."""

from __future__ import annotations

import errno
import fcntl
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any

import psutil
import pytest

from cortexfs import beneath, durable
from cortexfs.errors import CtxError
from cortexfs.locks import LOCK_FILE
from cortexfs.shared.sessions import SessionRef
from cortexfs.shared.spaces import create_shared_space
from cortexfs.tools import controls, record, spawn
from cortexfs.tools.result import ToolResult
from cortexfs.tools.runner import run_native, run_terminal
from tests.support.cli import ctx
from tests.support.unwritable import to_closed_pipe, to_full_disk, with_room_for
from tests.support.users import group_named
from tests.tools.held_locks import held_by
from tests.tools.support import World, effective_user

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]

WHOAMI = """#!/bin/sh
# Reports who it runs as, what it was given, and where.
read -r input
printf '{"uid": %s, "gid": %s, "groups": "%s", "input": %s, "cwd": "%s", "argc": %s}\\n' \
    "$(id -u)" "$(id -g)" "$(id -G)" "$input" "$(pwd)" "$#"
"""

ARGV = """#!/bin/sh
# Terminal mode: prints its argv one per line, then copies stdin.
for word in "$@"; do printf '[%s]\\n' "$word"; done
cat
exit 7
"""


@pytest.fixture
def coder(world: World) -> World:
    world.install("whoami", WHOAMI)
    world.install("argv", ARGV)
    world.agent("coder", tools=["whoami", "argv", "fs.read"])
    for tool in ("whoami", "argv", "fs.read"):
        world.allow_tool(tool)
    return world


def test_native_call_runs_as_the_agents_uid_gid_and_groups(coder: World) -> None:
    extra_group = 4242
    coder.agent("grouped", tools=["whoami"], groups=[extra_group])
    coder.allow_tool("whoami", "grouped_t")

    result = coder.run("whoami", {"n": 1}, agent="grouped")

    assert result.ok, result.error
    assert result.output["uid"] == coder.user.uid != os.geteuid()
    assert result.output["gid"] == coder.user.gid
    assert result.output["groups"].split() == [str(coder.user.gid), str(extra_group)]
    assert result.output["input"] == {"n": 1}
    assert result.output["cwd"] == str(coder.workspace)
    assert result.output["argc"] == 0


def test_the_kernel_enforces_mode_bits_for_the_agent(coder: World) -> None:
    secret = coder.workspace / "secret.txt"
    secret.write_text("root only\n")
    os.chown(secret, 0, 0)
    secret.chmod(0o600)
    (coder.workspace / "open.txt").write_text("anyone\n")

    denied = coder.run("fs.read", {"path": "secret.txt"})
    allowed = coder.run("fs.read", {"path": "/workspace/open.txt"})

    assert denied.status == "error" and denied.error.errno == errno.EACCES
    assert denied.error.stage == "exit" and denied.exit_status == 1
    assert allowed.ok and allowed.output["content"] == "anyone\n"


def test_every_call_is_recorded_as_tool_call_and_tool_result(coder: World) -> None:
    result = coder.run("whoami", {"password": "hunter2", "note": "x" * 500})

    events = [event for event in coder.events() if event["call"] == result.call]
    assert [event["type"] for event in events] == ["tool_call", "tool_result"]
    for event in events:
        assert list(event)[:6] == ["ts", "type", "agent", "session", "object", "status"]
        assert event["agent"] == "coder" and event["session"] == "default"
        assert event["object"] == "tool/whoami"
    assert events[0]["status"] == "ok"
    assert events[0]["input"]["password"] == "[redacted]"
    assert len(events[0]["input"]["note"]) < 300
    assert events[1]["status"] == "ok" and events[1]["exit_status"] == 0
    log = [line for line in coder.tool_log("whoami") if line["call"] == result.call]
    assert len(log) == 1 and log[0]["status"] == "ok" and log[0]["agent"] == "coder"
    assert "hunter2" not in (coder.root / "tool/whoami.d/log").read_text()


@pytest.mark.parametrize(
    "printed",
    ['{"a": NaN, "b": Infinity}', "[" * 1000 + "]" * 1000, '{"big": 1e999}'],
    ids=["nan", "deep", "beyond-a-float"],
)
def test_output_no_json_reader_agrees_on_is_kept_as_text(world: World, printed: str) -> None:
    """Output Python's reader takes but JSON has no such document for: recorded as the text
    it is, so the session's events and the tool's log stay JSON every reader can read."""
    world.install("odd", f"#!/bin/sh\ncat >/dev/null\necho '{printed}'\n")
    world.agent("coder", tools=["odd"])
    world.allow_tool("odd")

    result = world.run("odd", {})

    assert result.ok and result.output == printed + "\n", result
    session = world.root / "home" / str(world.user.uid) / "agent/coder/session/default"
    for log in (session / "events.jsonl", world.root / "tool/odd.d/log"):
        for line in log.read_text().splitlines():
            json.loads(line, parse_constant=pytest.fail)  # no NaN, no Infinity


def test_native_input_is_validated_against_the_schema(coder: World) -> None:
    result = coder.run("fs.read", {"path": 42})

    assert result.status == "error" and result.exit_status is None
    assert result.error.errno == errno.EINVAL and result.error.stage == "schema"
    assert "/path" in result.error.message
    assert coder.events()[-1]["stage"] == "schema"


def test_an_agent_without_the_grant_is_refused_whatever_its_input(world: World) -> None:
    """P-6: otherwise EACCES; the schema is judged only for a call the agent may make, so a
    caller without the grant learns nothing of what the tool accepts."""
    world.agent("outsider", tools=[])
    for value in ({"path": 42}, {"bogus": 1}):
        result = world.run("fs.read", value, agent="outsider")
        assert result.error.errno == errno.EACCES, result
        assert (result.error.stage, result.error.step) == ("authorize", 5)
        assert "Additional properties" not in result.error.message


def test_observer_receives_call_stderr_and_result_frames(coder: World) -> None:
    coder.install("noisy", "#!/bin/sh\necho one >&2\necho two >&2\necho '{\"done\": true}'\n")
    coder.agent("loud", tools=["noisy"])
    coder.allow_tool("noisy", "loud_t")
    frames: list[dict[str, object]] = []

    result = coder.run("noisy", {}, agent="loud", observer=frames.append)

    assert [frame["type"] for frame in frames] == ["call", "stderr", "stderr", "result"]
    assert [frame.get("text") for frame in frames[1:3]] == ["one", "two"]
    assert frames[-1]["output"] == {"done": True} == result.output
    assert frames[0]["pid"] > 0


def test_a_timeout_kills_the_whole_process_group(coder: World) -> None:
    pid_file = coder.workspace / "grandchild.pid"
    coder.install("sleeper", f"#!/bin/sh\nsleep 300 &\necho $! > {pid_file}\nwait\n", schema={})
    coder.agent("slow", tools=["sleeper"])
    coder.allow_tool("sleeper", "slow_t")

    started = time.monotonic()
    result = coder.run("sleeper", {}, agent="slow", timeout=1.0)

    assert time.monotonic() - started < 10
    assert result.error.errno == errno.ETIMEDOUT and result.error.stage == "run"
    grandchild = int(pid_file.read_text())
    assert _gone(grandchild), "the tool's background child outlived the call"


def test_a_tool_exiting_with_a_straggler_still_returns_and_the_straggler_is_killed(
    coder: World,
) -> None:
    pid_file = coder.workspace / "straggler.pid"
    coder.install("quitter", f"#!/bin/sh\nsleep 300 &\necho $! > {pid_file}\necho '{{}}'\n")
    coder.agent("quick", tools=["quitter"])
    coder.allow_tool("quitter", "quick_t")

    result = coder.run("quitter", {}, agent="quick", timeout=60)

    assert result.ok and result.timings["run"] < 10_000
    assert _gone(int(pid_file.read_text()))


def test_a_terminal_mode_straggler_is_killed_after_the_grace_too(coder: World) -> None:
    pid_file = coder.workspace / "straggler.pid"
    coder.install("quitter", f"#!/bin/sh\nsleep 300 &\necho $! > {pid_file}\n")
    coder.agent("quick", tools=["quitter"])
    coder.allow_tool("quitter", "quick_t")

    started = time.monotonic()
    result = run_terminal(coder.root, "quick", "quitter", [])

    assert result.exit_status == 0 and time.monotonic() - started < 10
    assert _gone(int(pid_file.read_text())), "the tool's background child outlived the call"


def test_terminal_mode_keeps_argv_inherits_stdio_and_returns_the_exit_status(
    coder: World,
) -> None:
    probe = (
        "from pathlib import Path; from cortexfs.tools.runner import run_terminal; "
        f"r = run_terminal(Path({str(coder.root)!r}), 'coder', 'argv', ['a b', '', '-x']); "
        "print('exit', r.exit_status)"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], input="from stdin\n", capture_output=True, text=True
    )

    assert completed.stdout == "[a b]\n[]\n[-x]\nfrom stdin\nexit 7\n", completed.stderr
    result_event = coder.events()[-1]
    assert result_event["status"] == "error" and result_event["exit_status"] == 7
    assert coder.events()[-2]["argv"] == ["a b", "", "-x"]


def test_terminal_mode_accepts_an_empty_argv(coder: World) -> None:
    result = run_terminal(coder.root, "coder", "argv", [], timeout=30)

    assert result.exit_status == 7 and result.error.stage == "exit"


@pytest.mark.parametrize("interpreter", ["/nonexistent/interp", "/bin/sh\r"])
def test_a_tool_whose_interpreter_is_missing_never_ran_in_either_mode(
    coder: World, interpreter: str
) -> None:
    """docs/tools.md: a tool that could not start is an error at stage run, never an exit
    status 126 or 127 of a tool that never ran; on a terminal as in native mode (where the
    launcher's complaint goes to the person, not to the runner)."""
    coder.install("noint", f"#!{interpreter}\necho ran\n")
    coder.agent("starter", tools=["noint"])
    coder.allow_tool("noint", "starter_t")
    native = coder.run("noint", {}, agent="starter")
    terminal = run_terminal(coder.root, "starter", "noint", [], timeout=30)

    for result in (native, terminal):
        assert result.error is not None and result.error.stage == "run", result
        assert result.error.errno == errno.ENOENT and result.exit_status is None, result
    results = [e for e in coder.events("starter") if e["type"] == "tool_result"]
    assert [(e["errno"], e["stage"], e["exit_status"]) for e in results] == [
        ("ENOENT", "run", None)
    ] * 2, results


def test_ctx_run_terminal_exit_statuses(coder: World) -> None:
    base = [*CTX, "--storage", str(coder.root), "run", "--agent", "coder"]

    found = subprocess.run([*base, "argv", "--flag"], capture_output=True, text=True, input="")
    missing = subprocess.run([*base, "nosuch"], capture_output=True, text=True)
    refused = subprocess.run([*base, "fs.stat", "x"], capture_output=True, text=True)

    assert (found.returncode, found.stdout) == (7, "[--flag]\n")
    assert missing.returncode == 127 and "ENOENT" in missing.stderr
    assert refused.returncode == 126 and "step 5 (object policy)" in refused.stderr


@pytest.mark.parametrize(
    ("words", "seen"),
    [
        (["--", "a"], "[--]\n[a]\n"),
        (["--", "--", "b"], "[--]\n[--]\n[b]\n"),
        (["--agent", "other", "--native", "-x"], "[--agent]\n[other]\n[--native]\n[-x]\n"),
        (["--help"], "[--help]\n"),
    ],
)
def test_every_word_after_tool_reaches_the_tool_exactly(
    coder: World, words: list[str], seen: str
) -> None:
    """T-3 "argv kept": options of ctx run come before TOOL; after it, nothing is ctx's."""
    direct = ctx(coder.root, "run", "--agent", "coder", "argv", *words)
    grouped = ctx(
        coder.root, "--storage", str(coder.root), "run", "--agent", "coder", "argv", *words
    )

    assert (direct.returncode, direct.stdout) == (7, seen), direct.stderr
    assert (grouped.returncode, grouped.stdout) == (7, seen), grouped.stderr
    assert coder.events()[-2]["argv"] == words


def test_a_double_dash_before_tool_ends_ctx_runs_options(coder: World) -> None:
    completed = ctx(coder.root, "run", "--agent", "coder", "--", "argv", "-x")

    assert (completed.returncode, completed.stdout) == (7, "[-x]\n"), completed.stderr


def test_ctx_run_native_prints_jsonl_frames(coder: World) -> None:
    command = [*CTX, "--storage", str(coder.root), "run", "--agent", "coder", "--native"]

    ok = subprocess.run([*command, "whoami"], input='{"k": 2}', capture_output=True, text=True)
    bad = subprocess.run([*command, "whoami"], input="not json", capture_output=True, text=True)

    frames = [json.loads(line) for line in ok.stdout.splitlines()]
    assert ok.returncode == 0
    assert [frame["type"] for frame in frames] == ["call", "result"]
    assert frames[-1]["status"] == "ok" and frames[-1]["output"]["input"] == {"k": 2}
    # Input that is not JSON is refused like input its schema refuses: exit 2, a result
    # frame saying why, and the refused call in the session.
    assert bad.returncode == 2
    refusal = json.loads(bad.stdout.splitlines()[-1])
    assert (refusal["type"], refusal["status"]) == ("result", "error")
    assert (refusal["error"]["error"], refusal["error"]["stage"]) == ("EINVAL", "schema")
    assert "the input is not JSON" in refusal["error"]["message"]
    recorded = coder.events()[-2:]
    assert [event["type"] for event in recorded] == ["tool_call", "tool_result"]
    assert recorded[0]["input"] == "not json" and recorded[1]["errno"] == "EINVAL"


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ('{"k": 1, "k": 2}', "gives the name 'k' twice"),
        ('{"k": NaN}', "holds NaN"),
        ('{"k": 1e999}', "holds 1e999"),
        ("[" * 200 + "]" * 200, "nested deeper than 128 levels"),
    ],
)
def test_ctx_run_native_refuses_input_readers_would_disagree_on(
    coder: World, given: str, reason: str
) -> None:
    """The logged input must be the one the tool gets: with a name given twice, Python's
    reader keeps the last value and others the first."""
    command = [*CTX, "--storage", str(coder.root), "run", "--agent", "coder", "--native"]

    refused = subprocess.run([*command, "whoami"], input=given, capture_output=True, text=True)

    assert refused.returncode == 2, refused.stderr
    refusal = json.loads(refused.stdout.splitlines()[-1])
    assert (refusal["error"]["error"], refusal["error"]["stage"]) == ("EINVAL", "schema")
    assert reason in refusal["error"]["message"], refusal["error"]["message"]


@pytest.mark.parametrize(
    ("host_term", "seen"),
    [
        ("screen-256color", "screen-256color"),
        (None, "xterm-256color"),
        ("x;rm -rf /", "xterm-256color"),
    ],
)
def test_a_terminal_mode_tool_is_told_the_terminal_type(
    coder: World, host_term: str | None, seen: str
) -> None:
    """H-5: shells, pagers and multiplexers run as tools, so terminal mode passes TERM (a
    plain terminfo name, else xterm-256color); native mode writes no terminal and gets none."""
    coder.install("term", '#!/bin/sh\nprintf "%s|%s\\n" "${TERM-unset}" "$CTX_MODE"\n')
    coder.agent("termer", tools=["term"])
    coder.allow_tool("term", "termer_t")
    env = {k: v for k, v in os.environ.items() if k != "TERM"}
    if host_term is not None:
        env["TERM"] = host_term
    command = [*CTX, "--storage", str(coder.root), "run", "--agent", "termer"]

    terminal = subprocess.run([*command, "term"], capture_output=True, text=True, env=env)
    native = subprocess.run(
        [*command, "--native", "term"], input="{}", capture_output=True, text=True, env=env
    )

    assert terminal.stdout == f"{seen}|terminal\n", terminal.stderr
    assert json.loads(native.stdout.splitlines()[-1])["output"] == "unset|native\n"


@pytest.mark.parametrize("mode", ["terminal", "native"])
def test_the_longest_timeout_ctx_run_takes_can_be_waited_for(coder: World, mode: str) -> None:
    """A year and a day is longer than one epoll wait can be (2**31 ms): waited in turns."""
    command = [*CTX, "--storage", str(coder.root), "run", "--agent", "coder"]
    if mode == "native":
        command += ["--timeout", "31622400", "--native", "whoami"]
    else:
        command += ["--timeout", "31622400", "argv", "x"]
    done = subprocess.run(command, input="{}\n", capture_output=True, text=True)

    assert "Traceback" not in done.stderr and "Overflow" not in done.stdout, done.stdout
    if mode == "native":
        assert json.loads(done.stdout.splitlines()[-1])["status"] == "ok", done.stdout
    else:
        assert (done.returncode, done.stdout) == (7, "[x]\n{}\n"), done.stderr


@pytest.mark.parametrize("timeout", ["1e10", "31622401"])
def test_ctx_run_refuses_a_timeout_no_timed_wait_can_hold(coder: World, timeout: str) -> None:
    refused = ctx(coder.root, "run", "--agent", "coder", "--timeout", timeout, "argv")

    assert refused.returncode == 2 and "longer than a year and a day" in refused.stderr


def test_ctx_run_reads_the_same_arguments_before_and_after_the_group(coder: World) -> None:
    """``ctx run …`` starts without the click group; ``ctx --storage D run …`` goes through it.
    Both reach one parser, and a malformed command line is exit 2 with EINVAL either way."""
    direct = [*CTX, "run", "--storage", str(coder.root), "--agent", "coder", "argv", "-x"]
    grouped = [*CTX, "--storage", str(coder.root), "run", "--agent", "coder", "argv", "-x"]
    for command in (direct, grouped):
        completed = subprocess.run(command, capture_output=True, text=True, input="")
        assert (completed.returncode, completed.stdout) == (7, "[-x]\n"), completed.stderr
    for malformed in (
        ["run"],
        ["run", "--agent"],
        ["run", "--agent", "a", "--timeout", "0", "t"],
        ["run", "--agent", "a", "--native", "t", "x"],
    ):
        completed = subprocess.run([*CTX, *malformed], capture_output=True, text=True)
        assert completed.returncode == 2, completed.stderr
        assert completed.stderr.startswith("Usage: ctx run [OPTIONS] TOOL [ARGS]...\n")
        assert completed.stderr.splitlines()[-1].startswith("ctx: EINVAL: ")
        assert "ARGS" not in completed.stderr.splitlines()[-1]  # an empty argv is legal (T-3)
    helped = subprocess.run(
        [*CTX, "--storage", str(coder.root), "run", "--help"], capture_output=True, text=True
    )
    assert helped.returncode == 0 and "JSONL frames" in helped.stdout


def test_only_the_host_administrator_may_run_a_tool_as_an_agent(coder: World) -> None:
    before = (coder.root / "tool/whoami.d/log").read_bytes()

    with effective_user(coder.user):
        result = coder.run("whoami", {})

    assert result.error.errno == errno.EACCES and result.error.stage == "caller"
    assert (result.error.step, result.error.step_name) == (1, "peer credentials")
    assert "host administrator" in result.error.message
    assert "or use a storage root of your own" in result.error.message  # what to do
    assert result.exit_status is None
    assert (coder.root / "tool/whoami.d/log").read_bytes() == before


def test_an_unknown_agent_or_tool_is_enoent(coder: World) -> None:
    no_agent = coder.run("whoami", {}, agent="ghost")
    no_tool = coder.run("ghost", {})

    assert (no_agent.error.errno, no_agent.error.stage) == (errno.ENOENT, "agent")
    assert (no_tool.error.errno, no_tool.error.stage) == (errno.ENOENT, "resolve")
    assert coder.events()[-1]["object"] == "tool/ghost"


def test_a_disabled_tool_is_refused(coder: World) -> None:
    (coder.root / "tool/whoami.d/status").write_text("disabled\n")

    result = coder.run("whoami", {})

    assert result.error.errno == errno.EACCES and "disabled" in result.error.message
    assert result.error.message.endswith(
        "it runs again once its status control whoami.d/status reads 'available'"
    )


def test_a_malformed_program_control_makes_the_tool_unavailable(coder: World) -> None:
    (coder.root / "tool/whoami.d/program").write_text('{"type": 12}')

    result = coder.run("whoami", {})

    assert result.error.errno == errno.EACCES and "unavailable" in result.error.message
    assert result.error.message.endswith(
        "reinstall it with a valid program control, or without one"
    )


def test_a_core_tool_with_a_malformed_program_control_is_repaired_by_bootstrap(
    coder: World,
) -> None:
    """Nobody installs a core tool: the refusal sends its reader to 'ctx bootstrap', which
    puts it back without a program control."""
    (coder.root / "tool/fs.stat.d/program").write_text('{"type": 12}')

    result = coder.run("fs.stat", {"path": "/workspace"})

    assert result.error.errno == errno.EACCES and "unavailable" in result.error.message
    assert result.error.message.endswith(
        "repair the storage root ('ctx bootstrap'), which puts it back without one"
    )


def _member(world: World, name: str, permissions: list[str], *, mounted: bool = True) -> None:
    """An agent of space ``proj`` with ``permissions`` on it, the space mounted read-write, or
    seen only through the agent's view of the storage root at ``/ctx``, which is writable in
    the spaces its policy lets it write (P-5 step 3, T-5)."""
    mounts = [[str(world.workspace), "/workspace", "rw"]]
    if mounted:
        mounts.append([str(world.root / "shared" / "proj"), "/shared/proj", "rw"])
    world.agent(name, tools=["fs.list"], shared={"proj": permissions}, mounts=mounts)
    world.allow_tool("fs.list", f"{name}_t")


def test_a_shared_session_is_written_only_with_shared_write(world: World) -> None:
    create_shared_space(world.root, "proj", gid=world.user.gid)
    _member(world, "member", ["read", "write"])
    _member(world, "reader", ["read"])
    _member(world, "viewer", ["read", "write"], mounted=False)
    _member(world, "outsider", [])

    def run(agent: str) -> ToolResult:
        where = SessionRef.shared(world.root, "proj", agent, "s9")
        return run_native(world.root, agent, "fs.list", {}, session=where)

    member, reader, viewer, outsider = map(run, ["member", "reader", "viewer", "outsider"])

    assert member.ok and viewer.ok, (member.error, viewer.error)
    for writer in ("member", "viewer"):
        events = world.root / f"shared/proj/agent/{writer}/session/s9/events.jsonl"
        assert [json.loads(line)["type"] for line in events.read_text().splitlines()] == [
            "tool_call",
            "tool_result",
        ]
    assert reader.error.errno == errno.EACCES and reader.error.stage == "session"
    assert reader.error.step == 5 and "shared:proj write" in reader.error.message
    assert outsider.error.stage == "session" and outsider.error.step == 5
    for refused in ("reader", "outsider"):
        assert not (world.root / "shared/proj/agent" / refused).exists(), refused


def test_ctx_run_in_a_shared_session_needs_shared_write(world: World) -> None:
    create_shared_space(world.root, "proj", gid=world.user.gid)
    _member(world, "reader", ["read"])

    refused = ctx(
        world.root, "run", "--agent", "reader", "--project", "proj", "--session", "s9", "fs.list"
    )

    assert refused.returncode != 0
    assert "EACCES" in refused.stderr and "step 5" in refused.stderr, refused.stderr
    assert not (world.root / "shared/proj/agent/reader").exists()


def test_ctx_run_in_a_shared_session_through_the_agents_view_of_ctx(world: World) -> None:
    """A member made with ``shared: {proj: [read, write]}`` and no mount of its own writes
    its session through its view of ``/ctx``; the chain says so as the run does."""
    create_shared_space(world.root, "proj", gid=world.user.gid)
    _member(world, "viewer", ["read", "write"], mounted=False)

    ran = ctx(
        world.root, "run", "--agent", "viewer", "--project", "proj", "--session", "s9", "fs.list"
    )
    explained = ctx(world.root, "policy", "explain", "viewer", "shared:proj", "write")

    assert ran.returncode == 0, ran.stderr
    assert (world.root / "shared/proj/agent/viewer/session/s9/events.jsonl").is_file()
    assert explained.returncode == 0, explained.stdout
    assert "writable in the agent's view of the storage root" in explained.stdout


def test_ctx_run_in_a_space_that_does_not_exist_says_how_to_make_it(world: World) -> None:
    _member(world, "reader", ["read", "write"])

    refused = ctx(world.root, "run", "--agent", "reader", "--project", "nospace", "fs.list")

    assert refused.returncode == 126
    assert "ENOENT: step 2" in refused.stderr and "shared/nospace does not exist" in refused.stderr
    assert "make the space with 'ctx shared create nospace'" in refused.stderr
    assert not (world.root / "shared" / "nospace").exists()


def test_a_session_of_another_agent_is_refused(coder: World) -> None:
    result = coder.run("whoami", {}, session=SessionRef.home(coder.root, 1, "other"))

    assert result.error.errno == errno.EINVAL


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_links_planted_in_a_users_home_never_redirect_roots_writes(coder: World) -> None:
    elsewhere = coder.scratch / "elsewhere"
    (elsewhere / "coder" / "session" / "default").mkdir(parents=True)
    home_agents = coder.root / "home" / str(coder.user.uid) / "agent"
    coder.run("whoami", {})  # the home exists, owned by the agent's user
    os.rename(home_agents, coder.scratch / "moved-away")
    home_agents.symlink_to(elsewhere)  # what that user could do to their own home

    result = coder.run("whoami", {})

    assert result.error.stage == "session" and result.error.errno in (errno.ELOOP, errno.ENOTDIR)
    assert not (elsewhere / "coder" / "session" / "default" / "events.jsonl").exists()


def test_a_linked_user_tier_is_refused_and_its_log_never_written(coder: World) -> None:
    coder.install("mine", "#!/bin/sh\ncat\n", tier="user")
    coder.agent("owner", tools=["mine"])
    tier = coder.root / "home" / str(coder.user.uid) / "tool"
    coder.allow_tool("mine", "owner_t", location=f"home/{coder.user.uid}/tool")
    os.rename(tier, coder.scratch / "real-tier")
    tier.symlink_to(coder.scratch / "real-tier")
    log = coder.scratch / "real-tier" / "mine.d" / "log"
    before = log.read_bytes()

    result = coder.run("mine", {}, agent="owner")

    assert result.exit_status is None, "the tool never ran"
    assert result.error.errno in (errno.ENOEXEC, errno.EACCES)  # its controls are out of reach
    assert log.read_bytes() == before


def test_a_tool_whose_control_directory_is_missing_is_damaged_everywhere(coder: World) -> None:
    """T-4, S-2: ENOEXEC at stage resolve, a result frame, and every tool_call its result."""
    os.rename(coder.root / "tool/whoami.d", coder.scratch / "whoami.d")

    terminal = ctx(coder.root, "run", "--agent", "coder", "whoami")
    native = ctx(coder.root, "run", "--agent", "coder", "--native", "whoami", stdin="{}")

    assert terminal.returncode == 126
    assert terminal.stderr.startswith("ctx: ENOEXEC: tool whoami in ")
    assert "its control directory whoami.d/ is missing" in terminal.stderr
    assert native.returncode == 1
    result = json.loads(native.stdout.splitlines()[-1])
    assert (result["type"], result["error"]["error"], result["error"]["stage"]) == (
        "result",
        "ENOEXEC",
        "resolve",
    )
    recorded = coder.events()
    assert [event["type"] for event in recorded] == ["tool_call", "tool_result"] * 2
    assert {event["errno"] for event in recorded[1::2]} == {"ENOEXEC"}
    assert not (coder.root / "tool/whoami.d").exists(), "no control directory is made up"


@pytest.mark.parametrize(
    "damage",
    ["description", "name", "log", "hooks/pre.d", "hooks/post.d", "hooks", "another name"],
)
def test_a_tool_missing_any_control_of_t1_is_refused_as_object_list_reports_it(
    coder: World, damage: str
) -> None:
    """T-1: every control is part of the tool; a call never runs what is left of one."""
    controls = coder.root / "tool/whoami.d"
    if damage == "another name":
        (controls / "name").write_text("argv\n")
    elif damage.startswith("hooks"):
        shutil.rmtree(controls / damage)
    else:
        (controls / damage).unlink()

    result = coder.run("whoami", {})
    listed = ctx(coder.root, "object", "list", "--json")

    assert (result.error.errno, result.error.stage) == (errno.ENOEXEC, "resolve")
    assert result.exit_status is None, "the tool never ran"
    shown = {o["name"]: o for o in json.loads(listed.stdout)}["whoami"]
    assert shown["status"] == "damaged"
    assert result.error.message.split("is damaged: ")[1].split(";")[0] in shown["problems"]
    if damage == "log":
        assert not (controls / "log").exists(), "a missing control is not made up"


@pytest.mark.parametrize("damage", ["missing", "a link"])
def test_a_tool_without_a_policy_of_its_own_is_refused_at_step_6(coder: World, damage: str) -> None:
    """P-6: without the tool's own policy nothing is allowed, EACCES, and the chain names the
    step, as 'ctx policy explain' does; the listing still calls the tool damaged (T-1)."""
    policy = coder.root / "tool/whoami.d/policy"
    kept = policy.read_text()
    policy.unlink()
    if damage == "a link":
        (coder.scratch / "policy").write_text(kept)
        policy.symlink_to(coder.scratch / "policy")

    result = coder.run("whoami", {})
    explained = ctx(coder.root, "policy", "explain", "coder", "tool:whoami", "execute")
    listed = {o["name"]: o for o in json.loads(ctx(coder.root, "object", "list", "--json").stdout)}

    assert (result.error.errno, result.error.stage, result.error.step) == (
        errno.EACCES,
        "authorize",
        6,
    ), result.error
    assert result.exit_status is None, "the tool never ran"
    assert explained.returncode == 1 and "step 6" in explained.stdout
    assert listed["whoami"]["status"] == "damaged"


def test_whatever_fails_after_tool_call_still_records_tool_result(coder: World) -> None:
    """A caller's observer that fails, or an interrupt, cannot leave a tool_call alone in the
    session, nor the tool's process running."""
    started: list[int] = []

    def failing(frame: dict[str, object]) -> None:
        if frame["type"] == "call":
            started.append(int(frame["pid"]))
            raise RuntimeError("the observer broke")

    def interrupting(frame: dict[str, object]) -> None:
        if frame["type"] == "call":
            started.append(int(frame["pid"]))
            raise KeyboardInterrupt

    failed = coder.run("whoami", {}, observer=failing)
    with pytest.raises(KeyboardInterrupt):
        coder.run("whoami", {}, observer=interrupting)

    # The observer's failure is its caller's: the tool was killed before its input (stage output).
    assert (failed.error.errno, failed.error.stage) == (errno.EIO, "output")
    assert "RuntimeError: the observer broke" in failed.error.message
    assert failed.exit_status is None
    recorded = coder.events()
    assert [event["type"] for event in recorded] == ["tool_call", "tool_result"] * 2
    assert [event["errno"] for event in recorded[1::2]] == ["EIO", "EINTR"]
    assert all(_gone(pid) for pid in started)


def test_logs_never_keep_a_secret_a_tool_printed_or_was_given(coder: World) -> None:
    """S-4: outputs and header-style argv follow the same redaction rule as inputs."""
    coder.install("say", '#!/bin/sh\necho \'login ok: password=hunter2 {"password":"hunter2"}\'\n')
    coder.install("json.say", '#!/bin/sh\necho \'{"password":"hunter2","user":"ana"}\'\n')
    coder.agent("talker", tools=["say", "json.say", "argv"])
    for tool in ("say", "json.say", "argv"):
        coder.allow_tool(tool, "talker_t")

    said = ctx(coder.root, "run", "--agent", "talker", "--native", "say", stdin="{}")
    said_json = ctx(coder.root, "run", "--agent", "talker", "--native", "json.say", stdin="{}")
    headers = ctx(
        coder.root,
        "run",
        "--agent",
        "talker",
        "argv",
        "-H",
        "Authorization: Bearer xyz",
        "Cookie: sid=s3cr3t",
    )

    assert json.loads(said.stdout.splitlines()[-1])["output"].count("hunter2") == 2, "the caller's"
    assert json.loads(said_json.stdout.splitlines()[-1])["output"]["password"] == "hunter2"
    assert headers.returncode == 7
    logged = [
        coder.root / f"home/{coder.user.uid}/agent/talker/session/default/events.jsonl",
        coder.root / "tool/say.d/log",
        coder.root / "tool/json.say.d/log",
        coder.root / "tool/argv.d/log",
    ]
    for path in logged:
        text = path.read_text()
        for secret in ("hunter2", "xyz", "s3cr3t"):
            assert secret not in text, (path, secret)
    outputs = [event.get("output") for event in coder.events("talker") if "output" in event]
    assert outputs[:2] == [
        'login ok: password=[redacted] {"password":"[redacted]"}\n',
        {"password": "[redacted]", "user": "ana"},
    ]
    argv = [event["argv"] for event in coder.events("talker") if "argv" in event]
    assert argv == [["-H", "Authorization: [redacted]", "Cookie: [redacted]"]]


def test_a_call_that_ends_beside_a_reinstall_of_its_tool_is_still_logged(coder: World) -> None:
    """T-7: a reinstall gives the log a second name (carried over as a hard link) while it
    holds its tier's install lock; the call's record waits for it, then logs the call."""
    tier, log = coder.root / "tool", coder.root / "tool/whoami.d/log"
    staging = tier / ".whoami~0123456789ab~controls"
    staging.mkdir()
    os.link(log, staging / "log")
    lock = os.open(tier / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    fcntl.flock(lock, fcntl.LOCK_EX)  # as install_pair holds it for the whole install

    def install_ends() -> None:
        time.sleep(0.5)
        shutil.rmtree(staging)
        os.close(lock)  # lets the lock go

    ending = threading.Thread(target=install_ends)
    ending.start()
    try:
        result = coder.run("whoami", {"n": 1})
    finally:
        ending.join()

    assert result.ok, result.error
    assert [line for line in coder.tool_log("whoami") if line["call"] == result.call]


def test_calls_made_while_their_tool_is_reinstalled_again_and_again_are_all_logged(
    coder: World,
) -> None:
    reinstalling = threading.Event()
    reinstalling.set()

    def reinstall() -> None:
        while reinstalling.is_set():
            coder.install("whoami", WHOAMI)

    installer = threading.Thread(target=reinstall)
    installer.start()
    try:
        results = [coder.run("whoami", {"n": 1}) for _ in range(40)]
    finally:
        reinstalling.clear()
        installer.join()

    assert all(result.ok for result in results), [r.error for r in results if not r.ok]
    logged = {line["call"] for line in coder.tool_log("whoami")}
    assert {result.call for result in results} <= logged


def test_a_log_refused_for_a_reinstall_that_has_swapped_its_directory_since_is_found(
    coder: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The narrowest turn of a reinstall: the call's record opens the control directory,
    the log is refused for the second name the install's carry-over gave it, and before the
    record looks at the name again the install has swapped the directories and removed the
    old one's name.  The record finds the log in the new directory (one name again)."""
    tier = coder.root / "tool"
    staged = tier / ".whoami~0123456789ab~controls"
    staged.mkdir()
    os.link(tier / "whoami.d/log", staged / "log")  # the carry-over
    real_event_log = record.EventLog

    def refused_then_swapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return real_event_log(*args, **kwargs)
        except CtxError:
            if staged.exists():  # the install goes on meanwhile: swap, then remove the old
                tier_fd = os.open(tier, os.O_RDONLY | os.O_DIRECTORY)
                try:
                    durable.default_ops().rename_exchange(staged.name, tier_fd, "whoami.d", tier_fd)
                finally:
                    os.close(tier_fd)
                shutil.rmtree(staged)
            raise

    monkeypatch.setattr(record, "EventLog", refused_then_swapped)
    log = record._open_tool_log(coder.root, PurePosixPath("tool/whoami.d/log"))

    assert log is not None
    log.close()
    assert not staged.exists() and os.stat(tier / "whoami.d/log").st_nlink == 1


# A call that waited for an install it did not need would take this long at least.
NO_WAIT = record.INSTALL_WAIT_SECONDS / 2


def test_a_log_with_two_names_and_no_install_under_way_is_left_at_once(coder: World) -> None:
    tier, log = coder.root / "tool", coder.root / "tool/whoami.d/log"
    os.link(log, tier / ".whoami-log-elsewhere")
    started = time.monotonic()

    result = coder.run("whoami", {"n": 1})

    assert result.ok, result.error
    assert time.monotonic() - started < NO_WAIT
    assert not [line for line in coder.tool_log("whoami") if line["call"] == result.call]


def test_a_lock_held_with_no_install_of_the_tool_under_way_delays_no_call(
    coder: World,
) -> None:
    """The tier's lock held by something else than an install of this tool (tsh.config, a
    repair, an install of another tool, a stuck process): a log with two names is left at
    once, not after the whole wait."""
    tier, log = coder.root / "tool", coder.root / "tool/whoami.d/log"
    os.link(log, tier / ".whoami-log-elsewhere")
    (tier / ".other~0123456789ab~controls").mkdir()  # another tool's install under way
    lock = os.open(tier / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = time.monotonic()
        result = coder.run("whoami", {"n": 1})
        took = time.monotonic() - started
    finally:
        os.close(lock)

    assert result.ok, result.error
    assert took < NO_WAIT, took
    assert not [line for line in coder.tool_log("whoami") if line["call"] == result.call]


def test_another_uid_holding_the_tier_directory_never_delays_a_call(coder: World) -> None:
    """Any uid that may read ``tool/`` may ``flock`` it: the record waits only for the lock
    file installs take, which that uid cannot open."""
    tier, log = coder.root / "tool", coder.root / "tool/whoami.d/log"
    with held_by(coder.user, tier, tier / "whoami.d"):
        started = time.monotonic()
        logged = coder.run("whoami", {"n": 1})
        os.link(log, tier / ".whoami-log-elsewhere")
        left = coder.run("whoami", {"n": 2})
        took = time.monotonic() - started

    assert logged.ok and left.ok, (logged.error, left.error)
    assert took < NO_WAIT
    calls = {line["call"] for line in coder.tool_log("whoami")}
    assert logged.call in calls and left.call not in calls


def test_the_tool_log_and_the_session_name_the_session_alike(world: World) -> None:
    """S-3, T-7: ``session`` is the session's name in both logs; the log also says where."""
    create_shared_space(world.root, "proj", gid=world.user.gid)
    _member(world, "member", ["read", "write"])

    ctx(world.root, "run", "--agent", "member", "--session", "s1", "fs.list")
    ctx(world.root, "run", "--agent", "member", "--project", "proj", "--session", "s2", "fs.list")

    home, shared = world.tool_log("fs.list")[-2:]
    in_home = world.events("member", "s1")[-1]
    assert (home["session"], in_home["session"]) == ("s1", "s1")
    assert home["session_dir"] == f"home/{world.user.uid}/agent/member/session/s1"
    assert shared["session"] == "s2"
    assert shared["session_dir"] == "shared/proj/agent/member/session/s2"
    assert home["call"] == in_home["call"]


PDEATHSIG = """#!/usr/bin/python3
# Reports its uid and its parent-death signal (prctl PR_GET_PDEATHSIG).
import ctypes, json, os
signal = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(signal))
print(json.dumps({"uid": os.getuid(), "pdeathsig": signal.value}))
"""


def test_a_tool_dies_with_its_caller_signal_set_after_the_uid_switch(coder: World) -> None:
    """I-4: the parent-death signal survives the switch to the agent's uid (a credential change
    clears it, so it is set after), in both modes."""
    coder.install("pdeathsig", PDEATHSIG)
    coder.agent("dying", tools=["pdeathsig"])
    coder.allow_tool("pdeathsig", "dying_t")

    native = coder.run("pdeathsig", {}, agent="dying")
    terminal = ctx(coder.root, "run", "--agent", "dying", "pdeathsig")

    assert native.output == {"uid": coder.user.uid, "pdeathsig": signal.SIGKILL}, native.error
    assert json.loads(terminal.stdout) == native.output, terminal.stderr


def test_without_setpriv_the_child_sets_the_signal_itself(
    coder: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback where setpriv(1) is missing: subprocess switches the credentials and the
    child sets the parent-death signal after them."""
    monkeypatch.setattr(spawn, "_SETPRIV", None)
    coder.install("pdeathsig", PDEATHSIG)
    coder.agent("dying", tools=["pdeathsig"])
    coder.allow_tool("pdeathsig", "dying_t")

    native = coder.run("pdeathsig", {}, agent="dying")

    assert native.output == {"uid": coder.user.uid, "pdeathsig": signal.SIGKILL}, native.error


def test_calls_during_reinstalls_each_run_one_whole_version(world: World) -> None:
    """T-8a: while a tool is reinstalled again and again, calls from other processes always
    find it, with its controls and policy, and run the old or the new version; none fails."""
    programs = [f"#!/bin/sh\necho '{{\"version\": {n}}}'\n" for n in (1, 2)]
    world.install("probe", programs[0])
    world.agent("coder", tools=["probe"])
    world.allow_tool("probe")
    stop = multiprocessing.Event()
    outcomes: Any = multiprocessing.Queue()
    callers = [
        multiprocessing.Process(target=_call_until_stopped, args=(world, stop, outcomes))
        for _ in range(2)
    ]
    for caller in callers:
        caller.start()
    try:
        for round_number in range(1, 25):
            world.install("probe", programs[round_number % 2])
    finally:
        stop.set()
        try:
            seen = [outcomes.get(timeout=60) for _ in callers]
        finally:
            for caller in callers:
                caller.join(30)
                if caller.is_alive():  # hung: it fails the test, it does not outlive it
                    caller.kill()
                    caller.join(10)
    assert all(set(outcome) <= {"version 1", "version 2"} for outcome in seen), seen


def test_a_call_whose_tool_is_reinstalled_while_it_is_admitted_is_judged_by_the_new_version(
    world: World,
) -> None:
    """Never judged by one version's schema and run as the next one's program: a reinstall
    while the call's pre-hook runs has the call admitted again, by the new controls."""

    def version(n: int) -> tuple[str, dict[str, Any]]:
        program = f"#!/bin/sh\ncat >/dev/null\necho '{{\"version\": {n}}}'\n"
        schema = {"type": "object", "properties": {"v": {"const": n}}, "required": ["v"]}
        return program, schema

    program, schema = version(1)
    world.install("vt", program, schema=schema)
    hook = world.root / "tool/vt.d/hooks/pre.d/10-slow"
    # Long enough for the reinstall to be over, on a busy machine too, before the tool starts.
    hook.write_text("#!/bin/sh\ncat >/dev/null\nsleep 3\n")
    hook.chmod(0o755)
    world.agent("coder", tools=["vt"])
    world.allow_tool("vt")
    program, schema = version(2)
    reinstall = threading.Timer(0.4, world.install, ("vt", program), {"schema": schema})
    reinstall.start()
    try:
        judged = world.run("vt", {"v": 1})
    finally:
        reinstall.join()

    assert (judged.error.errno, judged.error.stage) == (errno.EINVAL, "schema"), judged
    assert "2 was expected" in judged.error.message and judged.output is None
    assert world.run("vt", {"v": 2}).output == {"version": 2}


def test_a_tool_removed_while_the_call_is_admitted_is_missing_not_being_installed(
    world: World,
) -> None:
    world.install("vt", "#!/bin/sh\ncat >/dev/null\necho '{}'\n")
    hook = world.root / "tool/vt.d/hooks/pre.d/10-slow"
    hook.write_text("#!/bin/sh\ncat >/dev/null\nsleep 1\n")
    hook.chmod(0o755)
    world.agent("coder", tools=["vt"])
    world.allow_tool("vt")
    removal = threading.Timer(0.4, os.unlink, (world.root / "tool/vt",))
    removal.start()
    try:
        result = world.run("vt", {})
    finally:
        removal.join()

    # Gone by the start: nothing to execute, the tool never ran (ENOENT), as a start without
    # setpriv says it too.
    assert result.exit_status is None and result.error is not None
    assert (result.error.errno, result.error.stage) == (errno.ENOENT, "run"), result.error
    assert "cannot start" in result.error.message
    assert "No such file or directory" in result.error.message


def _call_until_stopped(world: World, stop: Any, outcomes: Any) -> None:
    seen: dict[str, int] = {}
    while not stop.is_set() or not seen:
        result = world.run("probe")
        if result.ok:
            outcome = f"version {result.output['version']}"
        else:
            assert result.error is not None
            outcome = f"{result.error.stage}: {result.error.message}"
        seen[outcome] = seen.get(outcome, 0) + 1
    outcomes.put(seen)


def test_a_control_the_host_cannot_open_now_is_not_called_damaged(
    coder: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors, the tool's cap control cannot be opened: the call fails with EMFILE,
    not with ENOEXEC and advice to reinstall a tool that is intact."""
    read_regular_file = controls.read_regular_file  # what opens a control in <tool>.d/

    def out_of_descriptors(path: Any, limit: int, **options: Any) -> bytes:
        if os.fspath(path) == "cap":
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return read_regular_file(path, limit, **options)

    monkeypatch.setattr(controls, "read_regular_file", out_of_descriptors)

    result = run_native(coder.root, "coder", "whoami", {})

    assert result.error is not None and result.exit_status is None
    assert (result.error.errno, result.error.stage) == (errno.EMFILE, "resolve"), result.error
    assert "damaged" not in result.error.message


def test_a_control_directory_the_host_cannot_open_now_is_not_called_damaged(
    coder: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors, the tool's control directory, through which its controls are read,
    cannot be opened: EMFILE, not ENOEXEC and advice to reinstall a tool that is intact."""
    open_directory = beneath.open_directory

    def out_of_descriptors(top: Path, relative: Any) -> int:
        if relative.name == "whoami.d":
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return open_directory(top, relative)

    monkeypatch.setattr(beneath, "open_directory", out_of_descriptors)

    result = run_native(coder.root, "coder", "whoami", {})

    assert result.error is not None and result.exit_status is None
    assert (result.error.errno, result.error.stage) == (errno.EMFILE, "resolve"), result.error
    assert "damaged" not in result.error.message and "whoami.d" in result.error.message


# --- ctx run's own standard output cannot be written ----------------------------------------

# Acts only on its input: had it been given one, the workspace holds `ran`.
MARK = """#!/bin/sh
read -r input
echo "starting" >&2
echo "$input" > ran
echo '{"marked": true}'
"""


@pytest.fixture
def marker(world: World) -> World:
    world.install("mark", MARK)
    world.agent("coder", tools=["mark"])
    world.allow_tool("mark")
    return world


def _ctx_run(world: World, *args: str, group: bool = False) -> list[str]:
    """``ctx run ARGS`` as a shell starts it, or through the group (``ctx --storage DIR run``)."""
    if group:
        return [*CTX, "--storage", str(world.root), "run", *args]
    return [*CTX, "run", "--storage", str(world.root), *args]


def _session(world: World) -> str:
    return f"home/{world.user.uid}/agent/coder/session/default"


@pytest.mark.parametrize("group", [False, True])
def test_a_call_frame_that_cannot_be_written_gives_the_tool_no_input_and_exits_74(
    marker: World, group: bool
) -> None:
    """``ctx run --native > /dev/full``: the lost output is ctx's, not the tool's.  The tool's
    process, started already (the frame carries its pid), is killed before it is given its
    input; the call is recorded so at stage output (not as a tool that could not start), and
    the line says so, exit 74."""
    argv = _ctx_run(marker, "--agent", "coder", "--native", "mark", group=group)

    lost = to_full_disk(argv, env=os.environ, stdin='{"n": 1}')

    assert (lost.returncode, lost.stderr) == (
        74,
        "ctx: ENOSPC: cannot write standard output (No space left on device); mark was killed "
        "before it was given its input (its process had started); the call is recorded in "
        f"session {_session(marker)}\n",
    )
    assert not (marker.workspace / "ran").exists()
    call, result = marker.events()[-2:]
    assert call["type"] == "tool_call" and call["call"] == result["call"]
    assert (result["type"], result["status"], result["exit_status"]) == (
        "tool_result",
        "error",
        None,
    )
    assert (result["errno"], result["stage"]) == ("ENOSPC", "output"), result
    assert "the caller's output could not take" in result["message"]
    assert "cannot start" not in result["message"]


def test_frames_lost_after_the_call_frame_let_the_tool_finish_and_be_recorded(
    marker: World, tmp_path: Path
) -> None:
    """Room for the call frame only: the stderr frame fails while the tool runs.  The tool is
    not killed midway; its result is recorded as it is; ctx says it ran, exit 74."""
    sample = {
        "type": "call",
        "call": "0" * 16,
        "tool": "mark",
        "agent": "coder",
        "session": _session(marker),
        "pid": 9_999_999,
        "ts": "2026-12-02T08:23:47.620065Z",
    }
    room = len(json.dumps(sample)) + 1 + 20  # the call frame, never the stderr frame after it
    argv = _ctx_run(marker, "--agent", "coder", "--native", "mark")

    lost, written = with_room_for(argv, room, tmp_path / "out", env=os.environ, stdin="{}")

    assert (lost.returncode, lost.stderr) == (
        74,
        "ctx: EFBIG: cannot write standard output (File too large); mark ran and exited 0; "
        f"the call is recorded in session {_session(marker)}\n",
    )
    assert json.loads(written.splitlines()[0])["type"] == "call"
    assert (marker.workspace / "ran").read_text() == "{}\n"
    result = marker.events()[-1]
    assert (result["status"], result["exit_status"], result["output"]) == (
        "ok",
        0,
        {"marked": True},
    )


def test_a_reader_that_left_before_the_call_frame_ends_ctx_run_quietly_with_141(
    marker: World,
) -> None:
    argv = _ctx_run(marker, "--agent", "coder", "--native", "mark")

    gone = to_closed_pipe(argv, env=os.environ, stdin="{}")

    assert (gone.returncode, gone.stderr) == (141, "")
    assert not (marker.workspace / "ran").exists()
    result = marker.events()[-1]
    assert (result["errno"], result["stage"], result["exit_status"]) == ("EPIPE", "output", None)


def test_in_terminal_mode_the_tools_lost_output_is_its_own_and_ctxs_own_is_74(
    world: World,
) -> None:
    """The tool writes on the stdout it was lent: failing there is its business (its exit
    status, its record).  What ctx run writes itself (--help) ends as every command's does."""
    world.install("loud", "#!/bin/sh\necho hello || exit 9\n")
    world.agent("coder", tools=["loud"])
    world.allow_tool("loud")

    ran = to_full_disk(_ctx_run(world, "--agent", "coder", "loud"), env=os.environ)
    helped = to_full_disk([*CTX, "run", "--help"], env=os.environ)

    assert ran.returncode == 9 and "cannot write standard output" not in ran.stderr, ran.stderr
    result = world.events()[-1]
    assert (result["status"], result["stage"], result["exit_status"]) == ("error", "exit", 9)
    assert (helped.returncode, helped.stderr) == (
        74,
        "ctx: ENOSPC: cannot write standard output (No space left on device)\n",
    )


def test_a_group_named_like_an_agents_gid_never_stands_in_for_it(coder: World) -> None:
    """setpriv(1) reads a --regid or --groups value as a group name before it reads it as a
    number: with a group named "4242" whose gid is another, the tool must still run with gid
    4242."""
    extra = 4242
    coder.agent("grouped", tools=["whoami"], groups=[extra])
    coder.allow_tool("whoami", "grouped_t")

    with group_named(str(extra)) as stand_in:
        native = coder.run("whoami", {}, agent="grouped")

    assert native.ok, native.error
    assert native.output["gid"] == coder.user.gid
    groups = [int(gid) for gid in native.output["groups"].split()]
    assert groups == [coder.user.gid, extra], f"not the stand-in {stand_in}"


SESSION_LOCKER = """#!/bin/sh
# Leaves a process of its own, in a session of its own, holding its session's events locked.
cat >/dev/null
setsid flock --exclusive {events} sh -c 'echo $$ > {pid_file}; exec sleep 600' \\
    </dev/null >/dev/null 2>&1 &
while [ ! -s {pid_file} ]; do sleep 0.01; done
echo '{{"locked": true}}'
"""


def test_a_tool_that_locks_its_session_still_leaves_its_call_in_the_tool_log(
    coder: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T-7: the session is the agent's file, so a tool may keep its tool_result out of it;
    the tool's log is the host's, and the call is there all the same.  The caller is told the
    record failed (stage record, EAGAIN)."""
    from cortexfs.shared import events

    monkeypatch.setattr(events, "LOCK_WAIT_SECONDS", 0.3)
    session_events = SessionRef.home(coder.root, coder.user.uid, "locking", "default").events_path
    pid_file = coder.scratch / "locker.pid"
    coder.scratch.chmod(0o777)
    script = SESSION_LOCKER.format(events=session_events, pid_file=pid_file)
    coder.install("session.locker", script)
    coder.agent("locking", tools=["whoami", "session.locker"])
    for tool in ("whoami", "session.locker"):
        coder.allow_tool(tool, "locking_t")
    coder.run("whoami", {}, agent="locking")  # its session exists before the locker runs
    try:
        result = coder.run("session.locker", {}, agent="locking")
        assert result.error is not None and result.error.stage == "record", result
        assert result.error.errno == errno.EAGAIN
        logged = [line for line in coder.tool_log("session.locker") if line["call"] == result.call]
        assert len(logged) == 1 and logged[0]["status"] == "ok", logged
        assert logged[0]["output"] == {"locked": True}
    finally:
        os.kill(int(pid_file.read_text()), signal.SIGKILL)


def test_a_session_that_refuses_the_tool_call_is_not_waited_for_again(
    coder: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S-2: a session kept locked refuses the call's tool_call (stage session, EAGAIN); with no
    tool_call there, no tool_result is owed to it, and the call does not wait a second time
    to be told the same."""
    from cortexfs.shared import events

    monkeypatch.setattr(events, "LOCK_WAIT_SECONDS", 0.3)
    coder.run("whoami", {})
    session_events = SessionRef.home(coder.root, coder.user.uid, "coder", "default").events_path
    before = session_events.read_bytes()
    with held_by(coder.user, session_events):
        result = coder.run("whoami", {})
    assert result.error is not None and result.error.stage == "session", result
    assert result.error.errno == errno.EAGAIN and "could not be recorded" not in str(result.error)
    # A worker still learns that the host could not record the call (and leaves its job).
    assert result.record_error is not None and result.record_error.errno == errno.EAGAIN
    assert result.timings["record"] < 300, result.timings  # no second wait for the lock
    assert not result.recorded and result.exit_status is None
    assert session_events.read_bytes() == before
