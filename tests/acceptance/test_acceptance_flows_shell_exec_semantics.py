"""What ``shell.exec`` does with a command, as a user sees it through ``ctx run --agent``
(native and terminal mode) and through queue workers (``ctx queue work``,
``workers/shell_worker.py``).

Requirements checked (SPEC §6 T-2, T-3, T-7, §3 W-1, W-4, §5 P-4, P-5; docs/tools.md "Running
a tool", "Process group and bounds", "Environment", "Agent native mode and its frames", "The
result", "The core tools" and its table of inputs; ``ctx man coreutils`` "shell.exec";
docs/workers.md "One job"):

* every documented input field (``cmd``, ``cwd``, ``stdin``) does what it says, and nothing
  else is an input: ``env`` or ``timeout`` in the input are refused before anything runs, in
  both modes and in a worker, with the documented messages;
* ``cwd`` is a view path confined like every ``fs.*`` path (``..``, links, files, missing
  directories, places outside every mount, hidden names under ``/ctx``), and the command then
  stands in the host directory behind it;
* the command's exit status, 0 to 255, and death by a signal (128 + N) are the call's: the
  ``result`` frame, ``ctx run``'s own exit status, a worker's ``done/``/``failed/`` and its
  ``reason``, the session and the tool's log agree;
* stdout is the call's ``output`` (its JSON value when it prints one, text without a trailing
  newline kept as it is), capped at 16 MiB in native mode (``EFBIG``) and passed through
  whole in terminal mode; stderr arrives whole in ``stderr`` frames and its last 64 KiB in
  the result;
* without ``stdin`` a native command reads nothing (never the caller's JSON), a terminal
  command reads the caller's stdin; ``stdin`` is fed byte-exact, NUL included;
* a timeout, a SIGTERM to ``ctx run``, and the end of the command each leave no process of
  the call's group behind, background children included;
* the command gets exactly the documented environment, whatever the host's holds (secrets,
  ``LC_ALL``, a ``PATH`` with a planted program, forged ``CTX_*`` settings): ``PATH``,
  ``LANG=C.UTF-8`` in effect, ``HOME`` of the agent's user (``/`` without one), ``TERM``
  only in terminal mode and sanitised;
* it runs as the agent's uid, gid and exactly its groups, with no capability and no
  descriptor of the caller's but the standard three, offline without ``network:default``,
  SIGPIPE and SIGXFSZ at their defaults, in a process group of its own whose id is the
  ``call`` frame's ``pid``;
* the same holds for a host administrator who is not root (the storage root's owner, the
  real test user).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pwd
import resource
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    alive,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as other uids than the host's: needs root"
)

SCRATCH = scratch_top(__file__)
REPO = Path(__file__).resolve().parents[2]
TRACEBACK = "Traceback (most recent call last)"
LIMIT = 16 * 1024 * 1024  # a native call's captured output
STDERR_TAIL = 64 * 1024  # the result's ``stderr``
TOOL_PATH = "/usr/local/bin:/usr/bin:/bin"
NATIVE_ENV = {
    "PATH",
    "HOME",
    "LANG",
    "CTX_AGENT",
    "CTX_SESSION",
    "CTX_CALL",
    "CTX_TOOL",
    "CTX_MODE",
    "CTX_PATH",
    "CTX_MOUNTS",
    "CTX_CWD",
}
# Settings a host's environment commonly holds, none of which a tool may see.
HOST_SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "aws-secret-value-1234",
    "GITHUB_TOKEN": "ghp_notarealtokenbutsecret",
    "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",
    "DATABASE_URL": "postgres://u:hunter2@db/x",
    "LC_ALL": "C",
    "TZ": "Asia/Tokyo",
    "ENV": "/tmp/evil-env.sh",
    "BASH_ENV": "/tmp/evil-env.sh",
    "PYTHONPATH": "/nonexistent-python-path",
    "CTX_MOUNTS": '[["/", "/", "rw"]]',
    "CTX_CWD": "/etc",
    "CTX_AGENT": "root",
    "CTX_PATH": "/tmp",
}
SECRET_NAMES = ("AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "SSH_AUTH_SOCK", "DATABASE_URL")
# The shell's own environment as exec gave it (not what the shell adds, such as PWD).
SHOW_ENV = "tr '\\0' '\\n' < /proc/$$/environ"


# ------------------------------------------------------------------------------ helpers


@dataclass
class Native:
    """One ``ctx run --native`` call: exit status, frames checked, stderr."""

    rc: int
    frames: list[dict]
    err: str

    @property
    def result(self) -> dict:
        return self.frames[-1]

    @property
    def call(self) -> dict:
        return self.frames[0]


@dataclass
class Terminal:
    """One ``ctx run`` call in terminal mode: exit status, raw stdout and stderr."""

    rc: int
    out: bytes
    err: str


class World:
    """A bootstrapped root whose agents may run ``shell.exec`` (both layers of P-6), each with
    the host directory ``ws`` mounted read-write at ``/proj``."""

    def __init__(self, top: Path, storage: Path) -> None:
        self.top = top
        self.storage = storage
        self.ws = top / "ws"
        self.env = clean_env(CTX_STORAGE=str(storage))
        self.queue = QueueCLI(storage, "proj")

    def agent(self, name: str, *options: str) -> dict:
        request = {
            "name": name,
            "label": f"{name}_t",
            "tools": ["shell.exec"],
            "mount": [[str(self.ws), "/proj", "rw"]],
        }
        made = ctx_run(
            "agent", "create", "-", "--json", *options, input=json.dumps(request), env=self.env
        )
        assert made.rc == 0, made
        with open(self.storage / "tool" / "shell.exec.d" / "policy", "a") as policy:
            policy.write(f"allow {name}_t tool:shell.exec execute\n")
        return made.json()

    def native(
        self,
        value: dict | str,
        *options: str,
        agent: str = "sx",
        env: dict[str, str] | None = None,
        pass_fds: tuple[int, ...] = (),
        preexec_fn=None,
    ) -> Native:
        text = value if isinstance(value, str) else json.dumps(value)
        proc = subprocess.run(
            [*CTX_ARGV, "run", "--agent", agent, "--native", *options, "shell.exec"],
            input=text.encode(),
            capture_output=True,
            env=env or self.env,
            pass_fds=pass_fds,
            preexec_fn=preexec_fn,
            timeout=90,
        )
        err = proc.stderr.decode("utf-8", "replace")
        assert TRACEBACK not in err, err
        frames = [json.loads(line) for line in proc.stdout.splitlines()]
        kinds = [f["type"] for f in frames]
        assert kinds[-1] == "result" and kinds.count("result") == 1, kinds
        assert set(kinds) <= {"call", "stderr", "result"}, kinds
        if kinds[0] == "call":
            assert kinds.count("call") == 1, kinds
            assert {f["call"] for f in frames} == {frames[0]["call"]}
        return Native(proc.returncode, frames, err)

    def terminal(
        self,
        *argv: str,
        agent: str = "sx",
        options: tuple[str, ...] = (),
        stdin: bytes | None = b"",
        env: dict[str, str] | None = None,
        pass_fds: tuple[int, ...] = (),
        preexec_fn=None,
    ) -> Terminal:
        proc = subprocess.run(
            [*CTX_ARGV, "run", "--agent", agent, *options, "shell.exec", *argv],
            input=stdin,
            stdin=subprocess.DEVNULL if stdin is None else None,
            capture_output=True,
            env=env or self.env,
            pass_fds=pass_fds,
            preexec_fn=preexec_fn,
            timeout=90,
        )
        err = proc.stderr.decode("utf-8", "replace")
        assert TRACEBACK not in err, err
        return Terminal(proc.returncode, proc.stdout, err)

    def publish(self, name: str, value: dict) -> str:
        return self.queue.publish({"tool": "shell.exec", "input": value}, name=name)

    def drain(self, *options: str, env: dict[str, str] | None = None, argv=None) -> list[dict]:
        """A worker for agent ``sx`` run to the end of the queue: its JSON events."""
        command = argv or [*CTX_ARGV, "queue", "work"]
        proc = subprocess.run(
            [*command, "--project", "proj", "--agent", "sx", "--drain", "--json", *options],
            capture_output=True,
            text=True,
            env=env or self.env,
            timeout=90,
        )
        assert TRACEBACK not in proc.stderr, proc.stderr
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        return [json.loads(line) for line in proc.stdout.splitlines()]

    def tool_log_line(self, call: str) -> dict:
        (line,) = [
            e
            for e in read_jsonl(self.storage / "tool" / "shell.exec.d" / "log")
            if e.get("call") == call
        ]
        return line


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "world-")
    storage = copy_of_root(_template, top / "storage")
    made = World(top, storage)
    made.ws.mkdir()
    made.ws.chmod(0o1777)  # every agent's uid leaves its traces there
    (made.ws / "sub").mkdir(mode=0o755)
    (made.ws / "sub").chmod(0o755)
    (made.ws / "afile").write_text("a file\n")
    (made.ws / "alink").symlink_to("sub")
    (made.ws / "private").mkdir()
    (made.ws / "private").chmod(0o700)  # root's: no agent may enter it
    made.agent("sx")
    try:
        yield made
    finally:
        for pid_file in made.ws.glob("*.pid"):
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def test_user() -> UnprivilegedUser:
    return find_or_create_user()


def pids_in(path: Path) -> list[int]:
    """The process ids a command wrote in ``path``, one or more per line."""
    assert wait_for(lambda: path.is_file() and path.read_text().strip() != "", 20), path
    return [int(word) for word in path.read_text().split()]


def gone(pid: int) -> bool:
    return wait_for(lambda: not alive(pid), 20)


def environ_of(output: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in output.splitlines() if line)
    return dict(pairs)


# ------------------------------------------------------------------------------ inputs


def test_cmd_stdin_and_cwd_are_the_inputs_and_nothing_else_is(world: World) -> None:
    """``env`` or ``timeout`` given as inputs are refused before anything runs, in both modes
    and in a worker; so are a missing or mistyped ``cmd``, two arguments and a NUL."""
    marker = world.ws / "ran-with-extra-input"
    touch = f"touch {marker}"

    for extra in ({"env": {"A": "1"}}, {"timeout": 5}):
        (key,) = extra
        native = world.native({"cmd": touch, **extra})
        assert native.rc == 2, native
        error = native.result["error"]
        assert (error["error"], error["errno"], error["stage"]) == ("EINVAL", 22, "schema")
        assert f"'{key}' was unexpected" in error["message"], error
        assert native.result["exit_status"] is None and native.result["output"] is None
        assert native.frames[0]["type"] == "result"  # no process was started

        terminal = world.terminal(json.dumps({"cmd": touch, **extra}))
        assert terminal.rc == 2, terminal
        assert terminal.err == (
            f"shell.exec: EINVAL: '{key}' is not an input of shell.exec "
            "(its inputs: 'cmd', 'cwd', 'stdin')\n"
        )
    assert not marker.exists()

    refused = {
        '{"cwd": "sub"}': "shell.exec: EINVAL: 'cmd' is required\n",
        '{"cmd": 5}': "shell.exec: EINVAL: 'cmd' must be of type string\n",
        '{"cmd": "pwd", "stdin": 7}': "shell.exec: EINVAL: 'stdin' must be of type string\n",
        '{"cmd": "echo a\\u0000b"}': "shell.exec: EINVAL: cmd must not contain NUL\n",
    }
    for argument, message in refused.items():
        terminal = world.terminal(argument)
        assert (terminal.rc, terminal.err, terminal.out) == (2, message, b""), argument
    two = world.terminal("echo", "hi")
    assert two.rc == 2 and two.out == b"", two
    assert two.err == "shell.exec: EINVAL: expected one argument (a JSON object or a value)\n"

    jobs = {
        "extra-env": {"cmd": touch, "env": {"A": "1"}},
        "extra-timeout": {"cmd": touch, "timeout": 5},
        "empty-cmd": {"cmd": ""},
    }
    for name, value in jobs.items():
        world.publish(name, value)
    world.drain()
    for name in jobs:
        state, result = world.queue.only_result(f"{name}.req.json")
        assert state == "failed", result
        assert result["error"]["stage"] == "schema" and result["error"]["error"] == "EINVAL"
        assert result["exit_status"] is None
        assert result["reason"].startswith("EINVAL: input does not match the schema"), result
        assert result["reason"].endswith("[schema]"), result
    assert not marker.exists()


def test_a_shorthand_argument_is_the_command_and_json_is_the_way_to_give_the_rest(
    world: World,
) -> None:
    """One argument that is not a JSON object is ``cmd``; a JSON object gives every field."""
    plain = world.terminal("printf '%s|' \"$0\" one 'two words'")
    assert (plain.rc, plain.out, plain.err) == (0, b"/bin/sh|one|two words|", "")

    fields = world.terminal(json.dumps({"cmd": "pwd; cat", "cwd": "sub", "stdin": "fed"}))
    assert (fields.rc, fields.err) == (0, "")
    assert fields.out == f"{world.ws / 'sub'}\nfed".encode()

    # An argument starting with '{' is read as JSON: a brace group must come as a JSON cmd.
    brace = world.terminal("{ echo hi; }")
    assert brace.rc == 2 and brace.out == b"", brace
    assert brace.err.startswith("shell.exec: EINVAL: input is not JSON: "), brace
    group = world.terminal(json.dumps({"cmd": "{ echo hi; }"}))
    assert (group.rc, group.out) == (0, b"hi\n"), group


# ------------------------------------------------------------------------------ cwd


def test_cwd_is_a_view_path_and_the_command_stands_in_the_host_directory(world: World) -> None:
    uid = pwd.getpwnam("nobody").pw_uid
    places = {
        None: world.ws,
        "sub": world.ws / "sub",
        "/proj/sub": world.ws / "sub",
        "/proj//sub/./": world.ws / "sub",
        "/ctx": world.storage,
        f"/ctx/home/{uid}": world.storage / "home" / str(uid),
    }
    for cwd, host in places.items():
        value = {"cmd": "pwd"} if cwd is None else {"cmd": "pwd", "cwd": cwd}
        native = world.native(value)
        assert native.rc == 0, (cwd, native)
        assert native.result["output"] == f"{host}\n", (cwd, native.result)
    terminal = world.terminal(json.dumps({"cmd": "pwd", "cwd": "/proj/sub"}))
    assert (terminal.rc, terminal.out) == (0, f"{world.ws / 'sub'}\n".encode()), terminal


def test_cwd_outside_the_view_or_through_a_link_is_refused_with_its_errno(world: World) -> None:
    refused = {
        "/etc": ("EACCES", 13, 1, "/etc is outside every mount visible to the agent"),
        "/proj/../etc": ("EINVAL", 22, 2, "'/proj/../etc': '..' is not allowed in a path"),
        "/proj/alink": (
            "ELOOP",
            40,
            1,
            "/proj/alink is a symbolic link; links are never followed",
        ),
        "/proj/afile": ("ENOTDIR", 20, 1, "/proj/afile is not a directory"),
        "/proj/missing": ("ENOENT", 2, 1, "/proj/missing does not exist"),
        "/ctx/agent/other": (
            "EACCES",
            13,
            1,
            "/ctx/agent/other is not in the agent's view "
            "(/ctx/agent shows only what the agent's authority allows)",
        ),
    }
    marker = world.ws / "ran-in-a-refused-cwd"
    for cwd, (name, number, status, message) in refused.items():
        native = world.native({"cmd": f"touch {marker}", "cwd": cwd})
        result = native.result
        assert native.rc == 1, (cwd, native)
        assert result["status"] == "error" and result["exit_status"] == status, (cwd, result)
        assert result["output"] == {"error": name, "errno": number, "message": message}
        assert result["error"]["error"] == name and result["error"]["errno"] == number
        assert result["error"]["stage"] == "exit", result
        assert result["error"]["message"] == f"shell.exec exited with status {status}: {message}"
        assert result["stderr"] == f"shell.exec: {name}: {message}\n"

        if cwd in ("/proj/../etc", "/proj/alink", "/ctx/agent/other"):
            terminal = world.terminal(json.dumps({"cmd": f"touch {marker}", "cwd": cwd}))
            assert (terminal.rc, terminal.out) == (status, b""), (cwd, terminal)
            assert terminal.err == f"shell.exec: {name}: {message}\n"
    assert not marker.exists()

    # Host variables that would widen the view are not read: the runner sets them.
    forged = world.terminal(
        json.dumps({"cmd": f"touch {marker}", "cwd": "/etc"}),
        env={**world.env, "CTX_MOUNTS": '[["/", "/", "rw"]]', "CTX_CWD": "/etc"},
    )
    assert forged.rc == 1, forged
    assert forged.err == "shell.exec: EACCES: /etc is outside every mount visible to the agent\n"
    assert not marker.exists()

    world.publish("cwd-outside", {"cmd": f"touch {marker}", "cwd": "/etc"})
    world.drain()
    state, result = world.queue.only_result("cwd-outside.req.json")
    assert state == "failed" and result["exit_status"] == 1, result
    assert result["reason"] == (
        "EACCES: shell.exec exited with status 1: /etc is outside every mount visible to the "
        "agent [exit]"
    )
    assert not marker.exists()


def test_a_cwd_the_agent_may_not_enter_is_refused_naming_it(world: World) -> None:
    native = world.native({"cmd": "pwd", "cwd": "private"})
    assert native.rc == 1 and native.result["exit_status"] == 1, native
    assert native.result["error"]["error"] == "EACCES", native.result
    terminal = world.terminal(json.dumps({"cmd": "pwd", "cwd": "/proj/private"}))
    assert terminal.rc == 1 and terminal.out == b"", terminal
    assert terminal.err.startswith("shell.exec: EACCES: "), terminal
    assert "/proj/private" in native.result["error"]["message"], native.result
    assert "/proj/private" in terminal.err, terminal


# ------------------------------------------------------------------------------ exit


def test_exit_statuses_0_to_255_are_the_calls_in_both_modes(world: World) -> None:
    for status in (0, 1, 126, 127, 128, 255):
        terminal = world.terminal(f"echo told {status} >&2; exit {status}")
        assert terminal.rc == status, (status, terminal)
        assert terminal.err == f"told {status}\n", terminal
    for status in (0, 2, 127, 255):
        native = world.native({"cmd": f"echo told {status} >&2; exit {status}"})
        result = native.result
        assert result["exit_status"] == status, (status, result)
        assert result["stderr"] == f"told {status}\n"
        if status == 0:
            assert (native.rc, result["status"], result["error"]) == (0, "ok", None)
            continue
        assert (native.rc, result["status"]) == (1, "error"), (status, native)
        assert result["error"] == {
            "error": None,
            "errno": None,
            "stage": "exit",
            "step": None,
            "step_name": None,
            "message": f"shell.exec exited with status {status}: told {status}",
        }
        assert world.tool_log_line(result["call"])["exit_status"] == status
    # The shell keeps the low 8 bits, as every exit status is.
    wrapped = world.native({"cmd": "exit 256"})
    assert wrapped.rc == 0 and wrapped.result["exit_status"] == 0, wrapped


def test_a_command_killed_by_a_signal_is_128_plus_its_number(world: World) -> None:
    for signame, number in (("TERM", 15), ("KILL", 9), ("SEGV", 11)):
        status = 128 + number
        native = world.native({"cmd": f"echo before; kill -{signame} $$; echo after"})
        result = native.result
        assert native.rc == 1 and result["exit_status"] == status, (signame, native)
        assert result["output"] == "before\n", result
        assert result["error"]["stage"] == "exit" and result["error"]["errno"] is None
        assert result["error"]["message"].startswith(f"shell.exec exited with status {status}")
        events = read_jsonl(
            world.storage / "home" / str(pwd.getpwnam("nobody").pw_uid)
            / "agent" / "sx" / "session" / "default" / "events.jsonl"
        )  # fmt: skip
        recorded = [e for e in events if e.get("call") == result["call"]]
        assert [e["type"] for e in recorded] == ["tool_call", "tool_result"], recorded
        assert recorded[1]["exit_status"] == status, recorded
        assert world.tool_log_line(result["call"])["exit_status"] == status

    for signame, number in (("INT", 2), ("PIPE", 13)):
        terminal = world.terminal(f"echo before; kill -{signame} $$; echo after")
        assert (terminal.rc, terminal.out) == (128 + number, b"before\n"), (signame, terminal)


def test_exit_statuses_and_signals_through_a_worker(world: World) -> None:
    jobs = {
        "exit-0": ({"cmd": "echo fine"}, "done", 0, None),
        "exit-3": ({"cmd": "echo bad >&2; exit 3"}, "failed", 3, "shell.exec exited with "
                   "status 3: bad [exit]"),
        "exit-126": ({"cmd": "exit 126"}, "failed", 126, "shell.exec exited with status 126 "
                     "[exit]"),
        "exit-127": ({"cmd": "no-such-command-here"}, "failed", 127, "shell.exec exited with "
                     "status 127: /bin/sh: 1: no-such-command-here: not found [exit]"),
        "exit-255": ({"cmd": "exit 255"}, "failed", 255, "shell.exec exited with status 255 "
                     "[exit]"),
        "killed": ({"cmd": "kill -KILL $$"}, "failed", 137, "shell.exec exited with status 137 "
                   "[exit]"),
        "named-errno": ({"cmd": 'printf \'{"errno": 28, "message": "disk full"}\'; exit 1'},
                        "failed", 1, "ENOSPC: shell.exec exited with status 1: disk full "
                        "[exit]"),
    }  # fmt: skip
    for name, (value, _, _, _) in jobs.items():
        world.publish(name, value)
    events = world.drain("--concurrency", "2")
    finished = {e["job"]: e for e in events if e["event"] == "finish"}
    for name, (_, state, status, reason) in jobs.items():
        job = f"{name}.req.json"
        got, result = world.queue.only_result(job)
        assert (got, result["exit_status"], result["reason"]) == (state, status, reason), result
        assert finished[job]["state"] == state and finished[job]["reason"] == reason
    assert world.queue.only_result("exit-0.req.json")[1]["output"] == "fine\n"
    errno_result = world.queue.only_result("named-errno.req.json")[1]
    assert errno_result["error"]["error"] == "ENOSPC" and errno_result["error"]["errno"] == 28


# ------------------------------------------------------------------------------ output


def test_stdout_is_the_output_as_a_json_value_or_as_its_text(world: World) -> None:
    shapes = {
        "printf abc": "abc",
        "printf 42": 42,
        "echo '{\"a\": [1, true]}'": {"a": [1, True]},
        'printf \'{"a":1}\\n{"b":2}\'': '{"a":1}\n{"b":2}',
        "true": "",
        # Bytes that are not UTF-8 reach JSON as U+FFFD; NUL and CR are kept.
        "printf 'ab\\000c\\r\\n\\377\\376'": "ab\x00c\r\n\ufffd\ufffd",
    }
    for cmd, output in shapes.items():
        native = world.native({"cmd": cmd})
        assert native.rc == 0 and native.result["status"] == "ok", (cmd, native)
        assert native.result["output"] == output, (cmd, native.result)
    # JSON null printed is an output of null, with status ok and exit status 0.
    null = world.native({"cmd": "echo null"})
    assert null.rc == 0 and null.result["output"] is None, null
    assert null.result["exit_status"] == 0

    raw = world.terminal("printf 'ab\\000c\\r\\n\\377\\376'")
    assert (raw.rc, raw.out, raw.err) == (0, b"ab\x00c\r\n\xff\xfe", "")


def test_native_output_is_capped_at_16_mib_and_terminal_output_is_not(world: World) -> None:
    exact = world.native({"cmd": f"head -c {LIMIT} /dev/zero | tr '\\0' x"})
    assert exact.rc == 0 and exact.result["status"] == "ok", exact.result["error"]
    assert exact.result["output"] == "x" * LIMIT

    over = world.native({"cmd": f"head -c {LIMIT + 1} /dev/zero | tr '\\0' x; echo after"})
    result = over.result
    assert over.rc == 1 and result["status"] == "error", result["error"]
    assert result["error"]["error"] == "EFBIG" and result["error"]["stage"] == "run", result
    assert str(LIMIT) in result["error"]["message"], result["error"]

    size = 20_000_000
    through = world.terminal(
        f"head -c {size} /dev/zero | tr '\\0' t; head -c 3000000 /dev/zero | tr '\\0' e >&2"
    )
    assert through.rc == 0, through.err[-200:]
    assert through.out == b"t" * size
    assert through.err == "e" * 3000000


def test_stderr_arrives_whole_in_frames_and_its_tail_in_the_result(world: World) -> None:
    cmd = (
        'i=0; while [ $i -lt 3000 ]; do echo "stderr line $i, padded to be long enough" >&2;'
        " i=$((i+1)); done; head -c 300000 /dev/zero | tr '\\0' z >&2; printf LAST >&2;"
        " printf out"
    )
    lines = [f"stderr line {i}, padded to be long enough" for i in range(3000)]
    expected = "".join(f"{line}\n" for line in lines) + "z" * 300000 + "LAST"
    native = world.native({"cmd": cmd})
    assert native.rc == 0 and native.result["output"] == "out", native.result["error"]
    # One frame per line, its line end left out; the last line, of no line end and longer
    # than 64 KiB, in pieces of at most 64 KiB.
    texts = [f["text"] for f in native.frames if f["type"] == "stderr"]
    assert texts[:3000] == lines, texts[:3]
    assert "".join(texts[3000:]) == "z" * 300000 + "LAST"
    assert max(map(len, texts)) <= STDERR_TAIL and len(texts) == 3000 + 5, len(texts)
    assert native.result["stderr"] == expected[-STDERR_TAIL:]


# ------------------------------------------------------------------------------ stdin


def test_stdin_is_fed_byte_exact_and_without_it_a_native_command_reads_nothing(
    world: World,
) -> None:
    # The caller's JSON input on ctx run's stdin is never the command's.
    alone = world.native({"cmd": "cat; echo end"})
    assert alone.result["output"] == "end\n", alone.result
    empty = world.native({"cmd": "cat | wc -c", "stdin": ""})
    assert empty.result["output"] == 0, empty.result

    text = "a\x00b\u00e9\r\n\u2603 last line without newline"
    fed = world.native({"cmd": "base64 -w0", "stdin": text})
    assert base64.b64decode(fed.result["output"]) == text.encode(), fed.result

    large = "line of input\n" * 300_000
    counted = world.native({"cmd": "wc -c; cat >/dev/null", "stdin": large})
    assert counted.result["output"] == len(large), counted.result

    surrogate = world.native('{"cmd": "cat", "stdin": "\\ud800"}')
    assert surrogate.rc == 1 and surrogate.result["exit_status"] == 2, surrogate.result
    assert surrogate.result["output"] == {
        "error": "EINVAL",
        "errno": 22,
        "message": "stdin holds '\\ud800' at character 0, a lone surrogate, which is no text",
    }


def test_a_terminal_command_reads_the_callers_stdin_unless_stdin_is_given(
    world: World,
) -> None:
    data = b"\x00\xffbinary from the caller\n"
    piped = world.terminal("od -An -tx1 | tr -d ' \\n'", stdin=data)
    assert (piped.rc, piped.out) == (0, data.hex().encode()), piped

    given = world.terminal(json.dumps({"cmd": "cat", "stdin": "from the input"}), stdin=data)
    assert (given.rc, given.out) == (0, b"from the input"), given

    nothing = world.terminal("cat; echo rc=$?", stdin=None)
    assert (nothing.rc, nothing.out) == (0, b"rc=0\n"), nothing

    # With no argument, the input itself is read from stdin.
    from_stdin = world.terminal(stdin=json.dumps({"cmd": "echo from-stdin"}).encode())
    assert (from_stdin.rc, from_stdin.out) == (0, b"from-stdin\n"), from_stdin
    missing = world.terminal(stdin=b"")
    assert (missing.rc, missing.err) == (2, "shell.exec: EINVAL: 'cmd' is required\n")


# ------------------------------------------------------------------------------ processes


def test_background_children_do_not_outlive_the_call(world: World) -> None:
    """Children left running (holding the output pipe, double-forked, under nohup) are
    killed once the command exits; the call does not wait for them to end on their own."""
    start = (
        "sleep 300 & echo $! >> {f}; (sleep 300 & echo $! >> {f});"
        " nohup sleep 300 >/dev/null 2>&1 & echo $! >> {f}; echo left"
    )
    pid_file = world.ws / "bg-native.pid"
    native = world.native({"cmd": start.format(f=pid_file)})
    assert native.rc == 0 and native.result["output"] == "left\n", native.result
    pids = pids_in(pid_file)
    assert len(pids) == 3, pids
    for pid in pids:
        assert gone(pid), pid

    pid_file = world.ws / "bg-terminal.pid"
    terminal = world.terminal(start.format(f=pid_file))
    assert (terminal.rc, terminal.out) == (0, b"left\n"), terminal
    for pid in pids_in(pid_file):
        assert gone(pid), pid

    pid_file = world.ws / "bg-worker.pid"
    world.publish("background", {"cmd": f"sleep 300 & echo $! > {pid_file}; echo left"})
    world.drain()
    state, result = world.queue.only_result("background.req.json")
    assert (state, result["output"]) == ("done", "left\n"), result
    for pid in pids_in(pid_file):
        assert gone(pid), pid


def test_a_timeout_kills_the_command_with_everything_it_started(world: World) -> None:
    pid_file = world.ws / "timeout-native.pid"
    native = world.native(
        {"cmd": f"sleep 300 & echo $! > {pid_file}; echo $$ >> {pid_file}; sleep 300"},
        "--timeout",
        "1",
    )
    result = native.result
    assert native.rc == 1 and result["exit_status"] == 137, result
    assert result["error"]["error"] == "ETIMEDOUT" and result["error"]["stage"] == "run"
    assert result["error"]["message"] == "timed out after 1s; its process group was killed"
    for pid in pids_in(pid_file):
        assert gone(pid), pid

    pid_file = world.ws / "timeout-terminal.pid"
    terminal = world.terminal(
        f"sleep 300 & echo $! > {pid_file}; sleep 300", options=("--timeout", "1")
    )
    assert terminal.rc == 137, terminal
    assert terminal.err == "ctx: ETIMEDOUT: timed out after 1s; its process group was killed\n"
    for pid in pids_in(pid_file):
        assert gone(pid), pid

    pid_file = world.ws / "timeout-worker.pid"
    world.publish("too-slow", {"cmd": f"sleep 300 & echo $! > {pid_file}; sleep 300"})
    world.drain("--timeout", "1")
    state, result = world.queue.only_result("too-slow.req.json")
    assert state == "failed" and result["exit_status"] == 137, result
    assert result["reason"] == ("ETIMEDOUT: timed out after 1s; its process group was killed [run]")
    for pid in pids_in(pid_file):
        assert gone(pid), pid


def test_sigterm_to_ctx_run_reaches_the_command_and_its_children(world: World) -> None:
    pid_file = world.ws / "sigterm.pid"
    proc = subprocess.Popen(
        [*CTX_ARGV, "run", "--agent", "sx", "shell.exec",
         f"sleep 300 & echo $! > {pid_file}; echo $$ >> {pid_file}; wait"],
        env=world.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        pids = pids_in(pid_file)
        assert len(pids) == 2, pids
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, (out, err)
    assert err.decode() == (
        "ctx: EINTR: interrupted: its caller got SIGTERM and passed it on to its process group, "
        "killed if it still ran 2 s later (exit status 143)\n"
    )
    for pid in pids:
        assert gone(pid), pid


def test_the_command_is_its_own_process_group_with_only_the_standard_descriptors(
    world: World,
) -> None:
    probe = (
        "python3 -c \"import os; print(sorted(int(f) for f in os.listdir('/proc/%d/fd' %"
        ' os.getppid())), os.getpgid(0) == os.getppid())"; echo $$'
    )
    secret = world.top / "caller-secret"
    secret.write_text("secret the caller holds open\n")
    with open(secret) as held:
        native = world.native({"cmd": probe}, pass_fds=(held.fileno(),))
        terminal = world.terminal(probe, pass_fds=(held.fileno(),))
    listed, shell_pid = native.result["output"].splitlines()
    assert listed == "[0, 1, 2] True", native.result
    assert int(shell_pid) == native.call["pid"], native.frames
    assert terminal.rc == 0 and terminal.out.splitlines()[0] == b"[0, 1, 2] True", terminal


# ------------------------------------------------------------------------------ environment


def test_the_environment_is_exactly_the_documented_one_in_every_way_of_running(
    world: World,
) -> None:
    planted = world.top / "planted-bin"
    planted.mkdir(exist_ok=True)
    (planted / "id").write_text("#!/bin/sh\necho planted\n")
    (planted / "id").chmod(0o755)
    host = {**world.env, **HOST_SECRETS, "PATH": f"{planted}:{os.environ['PATH']}"}
    nobody = pwd.getpwnam("nobody")
    cmd = f"{SHOW_ENV}; echo; command -v id; printf '\\303\\251' | wc -m"

    def check(output: str, mode: str, session: str, call: str) -> None:
        shown, rest = output.split("\n\n")
        env = environ_of(shown)
        expected = NATIVE_ENV | ({"TERM"} if mode == "terminal" else set())
        assert set(env) == expected, (mode, sorted(env))
        assert env["PATH"] == TOOL_PATH and env["LANG"] == "C.UTF-8"
        assert env["HOME"] == nobody.pw_dir
        assert (env["CTX_AGENT"], env["CTX_TOOL"], env["CTX_MODE"]) == ("sx", "shell.exec", mode)
        assert (env["CTX_SESSION"], env["CTX_CALL"], env["CTX_CWD"]) == (session, call, "/proj")
        assert env["CTX_PATH"] == f"/ctx/tool:/ctx/home/{nobody.pw_uid}/tool"
        assert json.loads(env["CTX_MOUNTS"])[0] == [str(world.ws), "/proj", "rw"]
        # The planted program is not found, and the locale counts characters, not bytes.
        assert rest == "/usr/bin/id\n1\n", (mode, rest)
        for name in SECRET_NAMES:
            assert HOST_SECRETS[name] not in output, name

    native = world.native({"cmd": cmd}, env=host)
    assert native.rc == 0, native
    check(native.result["output"], "native", "default", native.result["call"])

    terminal = world.terminal(cmd, env={**host, "TERM": "vt100"})
    assert terminal.rc == 0, terminal
    call = [e for e in read_jsonl(world.storage / "tool" / "shell.exec.d" / "log")][-1]["call"]
    check(terminal.out.decode(), "terminal", "default", call)
    assert environ_of(terminal.out.decode().split("\n\n")[0])["TERM"] == "vt100"

    world.publish("environment", {"cmd": cmd})
    world.drain(env=host)
    state, result = world.queue.only_result("environment.req.json")
    assert state == "done", result
    check(result["output"], "native", "worker", result["call"])

    pid_file = world.ws / "shell-worker.env"
    world.publish("shell-worker-env", {"cmd": f"{SHOW_ENV} > {pid_file}"})
    world.drain(env=host, argv=[str(REPO / ".venv" / "bin" / "python"),
                                str(REPO / "workers" / "shell_worker.py")])  # fmt: skip
    assert world.queue.only_result("shell-worker-env.req.json")[0] == "done"
    assert set(environ_of(pid_file.read_text())) == NATIVE_ENV


def test_term_is_passed_only_when_it_is_a_plain_terminfo_name(world: World) -> None:
    for given, seen in (
        ("screen.xterm-256color", "screen.xterm-256color"),
        ("xterm\x1b]0;owned\x07", "xterm-256color"),
        ("../../tmp/x", "xterm-256color"),
        (None, "xterm-256color"),
    ):
        env = {k: v for k, v in world.env.items() if k != "TERM"}
        if given is not None:
            env["TERM"] = given
        terminal = world.terminal('printf %s "$TERM"', env=env)
        assert (terminal.rc, terminal.out) == (0, seen.encode()), (given, terminal)
    native = world.native({"cmd": 'printf %s "${TERM-unset}"'}, env={**world.env, "TERM": "vt100"})
    assert native.result["output"] == "unset", native.result


def test_the_command_runs_as_the_agents_uid_gid_and_exactly_its_groups(
    world: World, test_user: UnprivilegedUser
) -> None:
    world.agent("gx", "--user", test_user.name, "--groups", "4,20")
    world.agent("nu", "--user", "4242", "--gid", "4343", "--groups", "4444")
    nobody = json.loads((world.storage / "agent" / "sx.d" / "identity").read_text())
    probe = (
        "id -u; id -g; grep -E '^(Groups|CapInh|CapPrm|CapEff|CapAmb):' /proc/self/status"
        " | tr -s '\\t ' ' '; echo \"$HOME\"; touch {f}; stat -c '%u:%g' {f}"
    )
    cases = (
        ("gx", test_user.uid, test_user.gid, "4 20", pwd.getpwnam(test_user.name).pw_dir),
        ("nu", 4242, 4343, "4444", "/"),
        ("sx", nobody["uid"], nobody["gid"], " ".join(map(str, nobody["groups"])),
         pwd.getpwuid(nobody["uid"]).pw_dir),
    )  # fmt: skip
    for agent, uid, gid, groups, home in cases:
        made = world.ws / f"made-by-{agent}"
        expected = (
            f"{uid}\n{gid}\nGroups: {groups} \nCapInh: 0000000000000000\n"
            "CapPrm: 0000000000000000\nCapEff: 0000000000000000\nCapAmb: 0000000000000000\n"
            f"{home}\n{uid}:{gid}\n"
        )
        native = world.native({"cmd": probe.format(f=made)}, agent=agent)
        assert native.rc == 0, (agent, native)
        assert native.result["output"] == expected, (agent, native.result["output"])
        made.unlink()
        terminal = world.terminal(probe.format(f=made), agent=agent)
        assert (terminal.rc, terminal.out.decode()) == (0, expected), (agent, terminal)
        made.unlink()


def test_signals_start_at_their_defaults_and_none_is_blocked(world: World) -> None:
    """The caller ignoring SIGPIPE and SIGXFSZ (as Python does) changes nothing for the
    command: ``yes | head -1`` ends, a write past ``ulimit -f`` ends it with 153."""

    def at_defaults() -> None:
        # Whatever the test runner's own parent ignored (a signal a job control or a
        # supervisor set aside) is not the caller's doing here.  glibc keeps signals 32 and
        # 33 to itself (sigaction refuses them): one ignored above stays so, for the caller
        # and the command alike.
        for number in range(1, signal.NSIG):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])

    def ignoring() -> None:
        at_defaults()
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    probe = "grep -E '^Sig(Blk|Ign):' /proc/$$/status | tr -s '\\t' ' '"
    baseline = subprocess.run(["sh", "-c", probe], preexec_fn=at_defaults, capture_output=True)
    quiet = baseline.stdout.decode()
    assert quiet.startswith("SigBlk: 0000000000000000\nSigIgn: "), quiet
    native = world.native({"cmd": probe}, preexec_fn=ignoring)
    assert native.result["output"] == quiet, native.result
    terminal = world.terminal(probe, preexec_fn=ignoring)
    assert terminal.out.decode() == quiet, terminal

    pipe = world.native({"cmd": "yes | head -1"}, preexec_fn=ignoring)
    assert (pipe.rc, pipe.result["output"]) == (0, "y\n"), pipe.result
    big = world.ws / "past-fsize"
    fsize = world.native(
        {"cmd": f"echo before; ulimit -f 1; head -c 5000 /dev/zero > {big}"},
        preexec_fn=ignoring,
    )
    assert fsize.result["exit_status"] == 153, fsize.result
    assert fsize.result["output"] == "before\n" and big.stat().st_size == 512, fsize.result

    world.publish("signals", {"cmd": probe})
    world.drain()
    state, result = world.queue.only_result("signals.req.json")
    assert (state, result["output"]) == ("done", quiet), result


def test_umask_and_limits_are_the_callers(world: World) -> None:
    def tight() -> None:
        os.umask(0o077)
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))

    probe = "umask; ulimit -n"
    native = world.native({"cmd": probe}, preexec_fn=tight)
    assert native.result["output"] == "0077\n512\n", native.result
    terminal = world.terminal(probe, preexec_fn=tight)
    assert terminal.out == b"0077\n512\n", terminal


def test_the_command_is_offline_without_network_default(world: World) -> None:
    probe = (
        'python3 -c "\nimport errno, socket\ns = socket.socket()\ntry:\n'
        "    s.connect(('127.0.0.1', 9))\nexcept OSError as e:\n"
        '    print(errno.errorcode[e.errno])\n"; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " "'
    )
    native = world.native({"cmd": probe})
    assert native.result["output"] == "ENETUNREACH\nlo\n", native.result
    terminal = world.terminal(probe)
    assert terminal.out == b"ENETUNREACH\nlo\n", terminal


# ------------------------------------------------------------------------------ non-root


def test_a_storage_owner_who_is_not_root_runs_commands_as_itself_with_nothing_of_its_env(
    test_user: UnprivilegedUser,
) -> None:
    top = new_scratch_dir(SCRATCH, "owner-")
    try:
        os.chown(top, test_user.uid, test_user.gid)
        storage = top / "storage"
        env = {
            "PATH": TOOL_PATH,
            "HOME": str(top),
            "CTX_STORAGE": str(storage),
            "OWNER_SECRET": "owner-secret-value-98765",
            "LC_ALL": "C",
        }

        def as_owner(*args: str, stdin: str = "", umask: int = 0o022):
            def switch() -> None:
                os.umask(umask)

            return subprocess.run(
                [*CTX_ARGV, *args], input=stdin, capture_output=True, text=True, env=env,
                cwd=top, user=test_user.uid, group=test_user.gid, extra_groups=[],
                preexec_fn=switch, timeout=90,
            )  # fmt: skip

        made = as_owner("bootstrap")
        assert made.returncode == 0, made.stderr
        request = {"name": "me", "label": "me_t", "tools": ["shell.exec"]}
        made = as_owner("agent", "create", "-", stdin=json.dumps(request))
        assert made.returncode == 0, made.stderr
        with open(storage / "tool" / "shell.exec.d" / "policy", "a") as policy:
            policy.write("allow me_t tool:shell.exec execute\n")

        cmd = f"id -u; id -G; pwd; {SHOW_ENV}"
        terminal = as_owner("run", "--agent", "me", "shell.exec", cmd)
        assert terminal.returncode == 0 and TRACEBACK not in terminal.stderr, terminal
        uid, groups, where, *shown = terminal.stdout.splitlines()
        assert (uid, groups) == (str(test_user.uid), str(test_user.gid)), terminal.stdout
        assert where == str(storage / "home" / str(test_user.uid)), terminal.stdout
        env_seen = environ_of("\n".join(shown))
        assert set(env_seen) == NATIVE_ENV | {"TERM"}, sorted(env_seen)
        assert "owner-secret-value-98765" not in terminal.stdout

        native = as_owner(
            "run", "--agent", "me", "--native", "shell.exec",
            stdin=json.dumps({"cmd": "umask; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"}),
            umask=0o027,
        )  # fmt: skip
        frames = [json.loads(line) for line in native.stdout.splitlines()]
        assert native.returncode == 0, native
        assert frames[-1]["output"] == "0027\nlo\n", frames[-1]
    finally:
        shutil.rmtree(top, ignore_errors=True)
