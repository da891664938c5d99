"""The error branches of ``ctx run`` and of the runner and process spawner behind it, reached
from outside through the installed commands, in terminal and ``--native`` mode.

Sources: SPEC T-3, T-6, T-7, S-2, S-5, W-4, R-3; docs/tools.md ("Running a tool" and its
table of stages, "Terminal CLI mode", "Agent native mode and its frames", "The result",
"Hooks (T-6)", "Errors you will see"); the help of ``ctx run``.

The angle: each refusal the command line, the storage root, the session, the resolution, the
spawn and the recording of a call can give is provoked as a user provokes it — an option
misspelt or given ``--`` as its value, a timeout no call can take, two storage roots, a root
that names no directory, a standard input that is a directory, endless or not UTF-8, a session
that is a link or whose events file is a directory, a space that does not exist, a tool that
is not available or whose hooks control is a file, an argv the kernel will not pass on, a
timeout, a tool that handles the signal its caller got, a tool killed by a signal or shutting
its streams, hooks that flood, fail or cannot start, an output that cannot take the frames,
a tool log that cannot be written — and what is checked is the documented exit status, the
errno word of the ``ctx: ERRNO: …`` line and of the native ``result`` frame, that the message
names the thing at fault and what to do where the docs promise it, and that nothing is left
half-done: no tool run that was refused, no session made for a call refused before it, no
``tool_call`` without its ``tool_result``, no process of the call left running."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
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
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.support.storage import attribute, copy_of_root, small_tmpfs

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid than their creator's: needs root"
)

TOP = scratch_top(__file__)
AGENT, LABEL = "coder", "coder_t"
LIMIT = 16 * 1024 * 1024  # docs/tools.md: what a native input may hold

# Each tool leaves ``ran-<name>`` in the agent's working directory (its workspace), so that a
# refused call provably ran nothing; those that wait leave the pid of their child in
# ``<name>-child``, so that a test can see it was killed with the call.
PROGRAMS = {
    "t": '#!/bin/sh\ntouch ran-t\necho "t $*"\n',
    "slow": "#!/bin/sh\ntouch ran-slow\nsleep 30 &\necho $! > slow-child\necho started\nwait\n",
    "graceful0": (
        "#!/bin/sh\ntrap 'echo cleaned; exit 0' TERM HUP INT\ntouch ran-graceful0\n"
        "sleep 30 &\necho $! > graceful0-child\necho started\nwait\n"
    ),
    "graceful5": (
        "#!/bin/sh\ntrap 'echo cleaned; exit 5' TERM HUP INT\ntouch ran-graceful5\n"
        "sleep 30 &\necho $! > graceful5-child\necho started\nwait\n"
    ),
    "chatty": (
        "#!/bin/sh\ntouch ran-chatty\ni=0\n"
        'while [ $i -lt 500 ]; do echo "line $i" >&2; i=$((i+1)); done\n'
        "sleep 30 &\necho $! > chatty-child\nwait\n"
    ),
    "talker": (
        "#!/bin/sh\nsleep 0.3\ni=0\n"
        'while [ $i -lt 2000 ]; do echo "line $i" >&2; i=$((i+1)); done\n'
        "touch ran-talker\necho ok\n"
    ),
    "fails": (
        '#!/bin/sh\ntouch ran-fails\necho \'{"errno": 28, "message": "disk full"}\'\nexit 3\n'
    ),
    "segv": "#!/bin/sh\ntouch ran-segv\nkill -SEGV $$\n",
    "shut": "#!/bin/sh\nexec 0<&- 1>&-\ntouch ran-shut\necho bye >&2\nsleep 0.2\nexit 4\n",
}


@dataclass(repr=False)
class World(OnStorage):
    """A bootstrapped root holding the tools of :data:`PROGRAMS` in the system tier, all
    allowed to agent ``coder`` (label ``coder_t``, root's default agent user) in both layers
    of P-6, whose workspace ``ws`` is its first mount and its working directory."""

    top: Path
    storage: Path
    ws: Path
    uid: int = 0

    @property
    def sessions(self) -> Path:
        return self.storage / "home" / str(self.uid) / "agent" / AGENT / "session"

    def session_name(self, session: str = "default") -> str:
        return f"home/{self.uid}/agent/{AGENT}/session/{session}"

    def events(self, session: str = "default") -> list[dict]:
        return read_jsonl(self.sessions / session / "events.jsonl")

    def tool_dir(self, name: str) -> Path:
        return self.storage / "tool" / f"{name}.d"

    def terminal(self, tool: str, *argv: str, options: tuple = (), **kw) -> Run:
        return self.ctx("run", "--agent", AGENT, *options, tool, *argv, **kw)

    def native(self, tool: str, data: str | bytes = "{}", options: tuple = (), **kw) -> Run:
        return self.ctx("run", "--agent", AGENT, "--native", *options, tool, input=data, **kw)

    def ran(self, tool: str = "t") -> bool:
        return (self.ws / f"ran-{tool}").exists()

    def records(self) -> dict:
        """What a refused call must leave as it was: the homes (sessions) and t's log."""
        return {"home": snapshot(self.storage / "home"), "log": (self.tool_dir("t") / "log")
                .read_bytes()}  # fmt: skip

    def pre_hook(self, name: str, body: str | bytes, tool: str = "t", mode: int = 0o755) -> Path:
        return self._hook("pre.d", name, body, tool, mode)

    def post_hook(self, name: str, body: str | bytes, tool: str = "t", mode: int = 0o755) -> Path:
        return self._hook("post.d", name, body, tool, mode)

    def _hook(self, phase: str, name: str, body: str | bytes, tool: str, mode: int) -> Path:
        path = self.tool_dir(tool) / "hooks" / phase / name
        path.write_bytes(body.encode() if isinstance(body, str) else body)
        path.chmod(mode)
        return path


def grant(policy: Path, tool: str) -> None:
    with policy.open("a") as rules:
        rules.write(f"allow {LABEL} tool:{tool} execute\n")


@pytest.fixture(scope="session")
def template() -> Iterator[World]:
    """Per test process: ``ctx bootstrap``, ``ctx agent create`` and the installs once; each
    test works on a copy."""
    top = new_scratch_dir(TOP, "template-")
    ws = top / "ws"
    ws.mkdir()
    manifests = top / "m"
    manifests.mkdir()
    w = World(top, top / "storage", ws)
    made = ctx_run("bootstrap", "--storage", w.storage)
    assert made.rc == 0, made
    agent = w.create_agent({"name": AGENT, "label": LABEL, "mount": [[str(ws), "/workspace",
                                                                       "rw"]]})  # fmt: skip
    w.uid = agent["identity"]["uid"]
    installs = []
    for name, program in PROGRAMS.items():
        (manifests / f"{name}.sh").write_text(program)
        document = {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": f"The {name} tool.",
            "schema": {"type": "object"},
            "cap": {"side_effects": False, "network": False},
            "exec": f"{name}.sh",
        }
        (manifests / f"{name}.json").write_text(json.dumps(document))
        # At once: each install takes the tier's lock in turn (docs/tools.md).
        argv = [*CTX_ARGV, "object", "install", str(manifests / f"{name}.json"), "--tier",
                "system"]  # fmt: skip
        installs.append(subprocess.Popen(argv, env=w.env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE))  # fmt: skip
    for proc in installs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (out, err)
    for name in PROGRAMS:
        grant(w.tool_dir(name) / "policy", name)
        grant(w.storage / "agent" / f"{AGENT}.d" / "policy", name)
    yield w
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def world(template: World) -> Iterator[World]:
    """A copy of the template's root, the agent's mounts pointed at a workspace of its own (as
    docs/policy.md says to do for a root copied elsewhere); what the tools left running is
    killed on the way out."""
    top = new_scratch_dir(TOP, "w-")
    storage = copy_of_root(template.storage, top / "storage")
    ws = top / "ws"
    ws.mkdir()
    ws.chmod(0o777)
    mount = storage / "agent" / f"{AGENT}.d" / "mount"
    mount.write_text(json.dumps([[str(ws), "/workspace", "rw"], [str(storage), "/ctx", "ro"]]))
    entry = storage / "agent" / AGENT
    entry.write_text(entry.read_text().replace(str(template.storage), str(storage)))
    w = World(top, storage, ws, template.uid)
    yield w
    for child in ws.glob("*-child"):
        with contextlib.suppress(ValueError, OSError):
            pid = int(child.read_text())
            if os.readlink(f"/proc/{pid}/cwd") == str(ws):  # still a tool's child, in ws
                os.kill(pid, signal.SIGKILL)
    shutil.rmtree(top, ignore_errors=True)


def frames_of(run: Run) -> list[dict]:
    return [json.loads(line) for line in run.out.splitlines() if line.strip()]


def result_frame(run: Run) -> dict:
    frames = frames_of(run)
    assert frames and frames[-1]["type"] == "result", run
    return frames[-1]


def launch(
    argv: list[str],
    env: dict[str, str],
    *,
    stdin=subprocess.DEVNULL,
    stdout=subprocess.PIPE,
    preexec_fn=None,
    timeout: float = 60,
) -> Run:
    """``ctx ARGV`` with the standard streams given (descriptors, files or pipes)."""
    proc = subprocess.run(
        [*CTX_ARGV, *argv],
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=preexec_fn,
        timeout=timeout,
    )
    out = b"" if proc.stdout is None else proc.stdout
    return Run(argv, proc.returncode, out.decode("utf-8", "replace"), proc.stderr.decode())


def to_dev_full(world: World, argv: list[str], data: bytes = b"{}", **env: str) -> Run:
    """``ctx ARGV`` with its standard output ``/dev/full`` (no frame can be written)."""
    with open("/dev/full", "wb") as full:
        return launch(argv, {**world.env, **env}, stdin=_bytes_in(world, data), stdout=full)


def _bytes_in(world: World, data: bytes):
    path = world.top / f"stdin-{os.urandom(4).hex()}"
    path.write_bytes(data)
    return path.open("rb")


def last_pair(world: World, session: str = "default") -> tuple[dict, dict]:
    """The session's last ``tool_call`` and its ``tool_result`` (S-2: one call, both lines)."""
    events = [e for e in world.events(session) if e["type"] in ("tool_call", "tool_result")]
    assert [e["type"] for e in events[-2:]] == ["tool_call", "tool_result"], events
    assert events[-1]["call"] == events[-2]["call"], events
    return events[-2], events[-1]


def usage_refusal(run: Run, reason: str) -> None:
    """A malformed command line as docs/tools.md gives it: exit 2, the usage, then
    ``ctx: EINVAL: REASON`` as the last line; nothing on standard output."""
    assert run.rc == 2 and run.out == "", run
    assert run.err.startswith("Usage: ctx run [OPTIONS] TOOL [ARGS]..."), run
    assert run.err.endswith(f"\nctx: EINVAL: {reason}\n"), run


# ======================================================================= the command line


@pytest.mark.parametrize(
    ("given", "meant"),
    [("--nat", "--native"), ("--sesion", "--session"), ("--time-out", "--timeout")],
)
def test_a_misspelt_option_is_refused_with_its_suggestion_before_anything_runs(world, given, meant):
    """docs/tools.md "Terminal CLI mode": options are spelt out (``--nat`` is no
    ``--native`` but an unknown option, refused, exit 2, before anything runs); the
    refusal reads as click's for every other command, naming the option meant."""
    before = world.records()
    run = world.terminal("t", options=(given,))
    usage_refusal(run, f"No such option '{given}'. Did you mean '{meant}'?")
    assert not world.ran() and world.records() == before


def test_a_double_dash_given_as_the_timeout_is_judged_as_that_value(world):
    """``ctx run --help``: a malformed command line is EINVAL, exit 2, nothing run or
    recorded; ``--timeout=--`` gives the value ``--``, which is no number of seconds, not
    the end of the options."""
    before = world.records()
    reason = "Invalid value for '--timeout': invalid value: '--'"
    usage_refusal(world.terminal("t", options=("--timeout=--",)), reason)
    assert not world.ran() and world.records() == before


def test_a_storage_root_named_double_dash_is_a_directory_like_any_other(world):
    """R-1: ``--storage DIR`` overrides the default everywhere; ``--`` is a directory name
    like any other, which click's commands and ``ctx --storage=-- run`` take as the root it
    names (relative to the current directory); so must ``ctx run --storage=--``."""
    dashes = copy_of_root(world.storage, world.top / "--")
    mount = dashes / "agent" / f"{AGENT}.d" / "mount"
    mount.write_text(json.dumps([[str(world.ws), "/workspace", "rw"], [str(dashes), "/ctx", "ro"]]))
    env = clean_env()
    listed = ctx_run("object", "list", "--storage=--", env=env, cwd=world.top)
    assert listed.rc == 0 and re.search(r"^t +system +available ", listed.out, re.M), listed
    group = ctx_run("--storage=--", "run", "--agent", AGENT, "t", "g", env=env, cwd=world.top)
    assert (group.rc, group.out) == (0, "t g\n"), group
    own = ctx_run("run", "--storage=--", "--agent", AGENT, "t", "o", env=env, cwd=world.top)
    assert (own.rc, own.out, own.err) == (0, "t o\n", ""), own


@pytest.mark.parametrize("option", ["--agent", "--session", "--project"])
def test_a_double_dash_given_as_a_name_is_an_illegal_name(world, option):
    """R-3 and ``ctx run --help``: an agent, space or session name that is not an object name
    is EINVAL, exit 2, nothing run or recorded; ``--agent=--`` names ``--``, which must
    start with a letter or digit."""
    kinds = {"--agent": "agent", "--session": "session", "--project": "shared space"}
    before = world.records()
    argv = ["run", "--agent", AGENT, f"{option}=--", "t"]
    if option == "--agent":
        argv = ["run", "--agent=--", "t"]
    run = world.ctx(*argv)
    assert (run.rc, run.out) == (2, ""), run
    said = f"ctx: EINVAL: illegal {kinds[option]} name: '--' must start with a letter or digit"
    assert said in run.err, run
    assert not world.ran() and world.records() == before


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("0", "'0' is not a positive number of seconds"),
        ("-1", "'-1' is not a positive number of seconds"),
        ("nan", "'nan' is not a number of seconds"),
        ("5s", "'5s' is not a number of seconds"),
        ("31622400.5", "'31622400.5' is longer than a year and a day (31622400 seconds)"),
    ],
)
def test_a_timeout_no_call_can_take_is_refused_before_anything_runs(world, value, why):
    """docs/tools.md: ``--timeout`` is at most a year and a day (31 622 400 s), and seconds
    above 0; anything else is a malformed command line (EINVAL, exit 2) naming the value,
    in either mode, before anything is run or recorded."""
    before = world.records()
    usage_refusal(world.terminal("t", options=("--timeout", value)), f"Invalid value for "
                  f"'--timeout': {why}")  # fmt: skip
    usage_refusal(world.native("t", options=("--timeout", value)), f"Invalid value for "
                  f"'--timeout': {why}")  # fmt: skip
    assert not world.ran() and world.records() == before


def test_a_timeout_of_exactly_a_year_and_a_day_is_taken(world):
    """docs/tools.md: ``--timeout`` is *at most* a year and a day: 31622400 itself runs."""
    run = world.terminal("t", "x", options=("--timeout", "31622400"))
    assert (run.rc, run.out, run.err) == (0, "t x\n", ""), run


def test_native_mode_given_arguments_after_the_tool_runs_nothing(world):
    """``ctx run --help`` (native mode reads the tool's JSON input from stdin): words after
    TOOL in native mode are a malformed command line, exit 2, and the input piped in is not
    taken either: nothing run, nothing recorded."""
    before = world.records()
    run = world.ctx("run", "--agent", AGENT, "--native", "t", "x", input="{}")
    usage_refusal(run, "native mode takes its input on stdin, not as arguments")
    assert not world.ran() and world.records() == before


def test_two_storage_roots_on_one_command_line_are_a_usage_error(world, tmp_path):
    """R-1 (``--storage DIR`` overrides CTX_STORAGE): ``ctx --storage A run --storage B``
    names two roots; refused (EINVAL, exit 2) naming both, in neither of them anything run or
    recorded; the same root given twice is one root, and the call runs."""
    other = copy_of_root(world.storage, tmp_path / "other")
    before = world.records()
    env = clean_env()
    run = ctx_run("--storage", world.storage, "run", "--storage", other, "--agent", AGENT, "t",
                  env=env)  # fmt: skip
    assert (run.rc, run.out) == (2, ""), run
    assert run.err.startswith("ctx: EINVAL: two storage roots given: "), run
    assert f"'{world.storage}' before the command" in run.err, run
    assert f"'{other}' after it; give one" in run.err, run
    assert not world.ran() and world.records() == before
    assert not (other / "home" / str(world.uid) / "agent" / AGENT / "session").exists()
    same = ctx_run("--storage", world.storage, "run", "--storage", world.storage, "--agent",
                   AGENT, "t", "once", env=env)  # fmt: skip
    assert (same.rc, same.out, same.err) == (0, "t once\n", ""), same


# ========================================================================== the storage root


@pytest.mark.parametrize("shape", ["empty", "loop"])
def test_a_root_that_names_no_directory_is_refused_in_both_modes(world, shape):
    """docs/tools.md: a call refused is 126 in terminal mode with the reason on stderr; in
    native mode the answer is a lone ``result`` frame (stage ``agent``: nothing run or
    recorded, no session, no exit status), exit 1.  A CTX_STORAGE set but empty names no
    root (EINVAL, saying to unset it); one that is a loop of links is ELOOP, naming the
    link and saying what to do."""
    if shape == "empty":
        value, word = "", "EINVAL"
        said = "CTX_STORAGE is set but empty, which names no storage root; unset it"
    else:
        (world.top / "loop-a").symlink_to("loop-b")
        (world.top / "loop-b").symlink_to("loop-a")
        value, word = str(world.top / "loop-a"), "ELOOP"
        said = f"storage root {value} is a symbolic link to loop-b that the kernel will not follow"
    env = clean_env(CTX_STORAGE=value)
    before = world.records()
    term = world.terminal("t", env=env)
    assert (term.rc, term.out) == (126, ""), term
    assert term.err.startswith(f"ctx: {word}: {said}"), term
    assert ("unset it to use the default" if shape == "empty" else "point the link at the "
            "storage root, or name another root") in term.err, term  # fmt: skip
    native = world.native("t", env=env)
    assert native.rc == 1, native
    (frame,) = frames_of(native)
    assert frame["type"] == "result" and frame["status"] == "error", frame
    assert (frame["session"], frame["exit_status"], frame["output"]) == ("", None, None)
    assert (frame["error"]["error"], frame["error"]["stage"]) == (word, "agent"), frame
    assert native.err == f"ctx: {word}: {frame['error']['message']}\n", native
    assert not world.ran() and world.records() == before


def test_a_root_refusal_whose_frame_cannot_be_written_says_what_became_of_the_call(world):
    """``ctx run --help``: when a frame cannot be written (``> /dev/full``), exit 74,
    ``ctx: ENOSPC: cannot write standard output (...)`` and whether the tool ran and where
    its result is recorded — as it is said for every other refusal (see the next test)."""
    run = to_dev_full(world, ["run", "--agent", AGENT, "--native", "t"], CTX_STORAGE="")
    assert run.rc == 74, run
    assert "ctx: ENOSPC: cannot write standard output" in run.err, run
    assert "t did not run" in run.err and "nothing was recorded" in run.err, run


def test_refused_calls_whose_frame_cannot_be_written_say_what_became_of_them(world):
    """``ctx run --help``, docs/tools.md "Agent native mode and its frames": a ``result``
    frame that cannot be written ends ``ctx run`` with exit 74 and ``ctx: ENOSPC: cannot
    write standard output (…)``, saying whether the tool ran and where the call is
    recorded: an unknown agent's call did not run and was recorded nowhere (its reason
    names ``ctx agent list``); an unknown tool's did not run and is recorded in the
    session, ENOENT at stage ``resolve``."""
    ghost = to_dev_full(world, ["run", "--agent", "ghost", "--native", "t"])
    assert ghost.rc == 74 and ghost.out == "", ghost
    assert ghost.err.startswith(
        "ctx: ENOSPC: cannot write standard output (No space left on device); t did not run "
        "(ENOENT: there is no agent 'ghost'"
    ), ghost
    assert "'ctx agent list'" in ghost.err, ghost
    assert ghost.err.endswith(" [agent]); nothing was recorded\n"), ghost
    assert not (world.storage / "agent" / "ghost").exists()

    missing = to_dev_full(world, ["run", "--agent", AGENT, "--native", "nosuch"])
    assert missing.rc == 74, missing
    assert missing.err == (
        "ctx: ENOSPC: cannot write standard output (No space left on device); nosuch did not "
        f"run (ENOENT: no tool 'nosuch' on the CTX_PATH of agent '{AGENT}' (/ctx/tool:/ctx/"
        f"home/{world.uid}/tool) [resolve]); the call is recorded in session "
        f"{world.session_name()}\n"
    ), missing
    call, result = last_pair(world)
    assert call["object"] == result["object"] == "tool/nosuch", result
    assert (result["errno"], result["stage"], result["exit_status"]) == ("ENOENT", "resolve", None)


# ============================================================================ standard input


@pytest.mark.xfail(
    strict=True,
    reason="T-3: 'ctx run --native' with standard input a directory ('< DIR') dies before ctx "
    "runs ('Fatal Python error: init_sys_streams: <stdin> is a directory, cannot continue', "
    "exit 1) instead of the 'ctx: ERRNO: …' refusal it gives a closed or write-only standard "
    "input (EBADF, nothing run or recorded)",
)
def test_a_standard_input_that_is_a_directory_is_refused_with_an_errno_line(world):
    """docs/tools.md "Agent native mode and its frames": a standard input closed when ctx
    starts, or open for writing only, holds no input, which is not an empty one: refused
    ``ctx: EBADF: standard input is …``, exit 1, nothing run or recorded.  A directory holds
    no input either: one ``ctx: ERRNO:`` line, exit 1, no interpreter crash."""
    before = world.records()
    fd = os.open(world.ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        run = launch(["run", "--agent", AGENT, "--native", "t"], world.env, stdin=fd)
    finally:
        os.close(fd)
    assert not world.ran() and world.records() == before
    assert "Fatal Python error" not in run.err and "Traceback" not in run.err, run
    assert run.rc == 1 and run.err.startswith("ctx: E"), run


def test_an_endless_native_input_is_efbig_with_nothing_run_or_recorded(world):
    """docs/tools.md: a native input is at most 16 MiB; a longer one — a source that never
    ends — is refused before anything runs or is recorded, ``ctx: EFBIG: …``, exit 1, no
    frame, no session."""
    before = world.records()
    with open("/dev/zero", "rb") as zero:
        run = launch(["run", "--agent", AGENT, "--native", "t"], world.env, stdin=zero)
    assert (run.rc, run.out) == (1, ""), run
    assert run.err == (
        f"ctx: EFBIG: standard input holds more than {LIMIT} bytes, more than a tool's input "
        "may; nothing was run\n"
    ), run
    assert not world.ran() and world.records() == before


def test_native_input_that_is_not_utf8_is_refused_at_stage_schema_and_recorded(world):
    """docs/tools.md: input that is not JSON is refused at stage ``schema`` like input the
    schema refuses — a ``result`` frame with EINVAL, exit 2 — and the call is recorded in
    the session, its text summarised as an input is; the tool does not run."""
    run = world.native("t", b"\xff\xfe{}")
    assert run.rc == 2, run
    (frame,) = frames_of(run)
    error = frame["error"]
    assert (error["error"], error["stage"], frame["exit_status"]) == ("EINVAL", "schema", None)
    assert error["message"].startswith("the input is not JSON: "), error
    assert "can't decode byte 0xff" in error["message"], error
    call, result = last_pair(world)
    assert result["call"] == frame["call"], result
    assert isinstance(call["input"], str) and call["input"].endswith("{}"), call
    assert (result["errno"], result["stage"]) == ("EINVAL", "schema"), result
    assert not world.ran()


# ================================================================================ the session


def test_a_session_whose_events_file_is_a_directory_refuses_the_call(world):
    """docs/tools.md stage ``session``: the session opens, or the call is refused there
    (terminal 126, the reason on stderr naming the file; native: a ``result`` frame at
    stage ``session``, exit 1); the tool does not run, the directory is left as it was,
    and nothing reaches the tool's log (the tool was never found)."""
    events = world.sessions / "odd" / "events.jsonl"
    events.mkdir(parents=True)
    log = (world.tool_dir("t") / "log").read_bytes()
    term = world.terminal("t", options=("--session", "odd"))
    said = f"{events} is not a regular file; refusing to append to it"
    assert (term.rc, term.out, term.err) == (126, "", f"ctx: EINVAL: {said}\n"), term
    native = world.native("t", options=("--session", "odd"))
    assert native.rc == 1, native
    (frame,) = frames_of(native)
    assert (frame["error"]["error"], frame["error"]["stage"]) == ("EINVAL", "session"), frame
    assert frame["error"]["message"] == said and frame["exit_status"] is None, frame
    assert events.is_dir() and list(events.iterdir()) == []
    assert (world.tool_dir("t") / "log").read_bytes() == log
    assert not world.ran()


def test_a_session_that_is_a_link_is_left_untouched_and_nothing_is_made_behind_it(world):
    """docs/sessions.md, S-1 (sessions are ordinary directories): a session that is a
    symbolic link is refused (ENOTDIR naming it, terminal 126, native stage ``session``);
    nothing is written where the link leads and the tool does not run."""
    elsewhere = world.top / "elsewhere"
    elsewhere.mkdir()
    world.sessions.mkdir(parents=True, exist_ok=True)
    (world.sessions / "lnk").symlink_to(elsewhere)
    term = world.terminal("t", options=("--session", "lnk"))
    said = f"{world.sessions / 'lnk'} is not a directory (or is a symlink); left untouched"
    assert (term.rc, term.err) == (126, f"ctx: ENOTDIR: {said}\n"), term
    frame = result_frame(world.native("t", options=("--session", "lnk")))
    assert (frame["error"]["error"], frame["error"]["stage"]) == ("ENOTDIR", "session"), frame
    assert list(elsewhere.iterdir()) == [] and not world.ran()


def test_a_session_in_a_space_is_refused_step_by_step_as_the_advice_is_followed(world):
    """docs/tools.md stage ``session``: a session in ``shared/<space>/`` needs the space and
    ``shared:<space> write`` through the whole chain, refused naming the step and nothing
    created.  A space that does not exist is ENOENT naming the command that makes it (with
    the root the command line named); once made as advised, the agent's missing write on it
    is EACCES at step 2 naming its mode; neither refusal makes anything in the space or runs
    the tool."""
    env = clean_env()
    term = ctx_run("run", "--storage", world.storage, "--agent", AGENT, "--project", "lab", "t",
                   env=env)  # fmt: skip
    assert (term.rc, term.out) == (126, ""), term
    advice = f"make the space with 'ctx shared create lab --storage {world.storage}'"
    assert term.err == f"ctx: ENOENT: step 2 (mode bits): shared/lab does not exist; {advice}\n"
    frame = result_frame(world.native("t", options=("--project", "lab")))
    error = frame["error"]
    assert (error["error"], error["stage"], error["step"]) == ("ENOENT", "session", 2), frame
    assert not (world.storage / "shared" / "lab").exists()

    made = ctx_run("shared", "create", "lab", "--storage", world.storage, env=env)
    assert made.rc == 0, made
    agents = world.storage / "shared" / "lab" / "agent"
    before = snapshot(agents)
    term = world.terminal("t", options=("--project", "lab"))
    assert term.rc == 126, term
    assert term.err.startswith("ctx: EACCES: step 2 (mode bits): shared/lab needs -wx"), term
    assert f"to uid {world.uid}" in term.err, term
    error = result_frame(world.native("t", options=("--project", "lab")))["error"]
    assert (error["error"], error["stage"], error["step"], error["step_name"]) == (
        "EACCES", "session", 2, "mode bits"), error  # fmt: skip
    assert snapshot(agents) == before and not world.ran()


# ================================================================================ resolution


def test_a_tool_without_an_execute_bit_is_not_found_and_127_in_terminal_mode(world):
    """T-4 (a non-executable file is not a hit) and docs/tools.md "Terminal CLI mode" (127
    when the tool was not found, the reason on stderr): the call names the agent's CTX_PATH,
    runs nothing and is recorded ENOENT at stage ``resolve``; native mode exits 1 with the
    same error; with the bit back the call runs."""
    executable = world.storage / "tool" / "t"
    executable.chmod(0o644)
    term = world.terminal("t", "x")
    assert (term.rc, term.out) == (127, ""), term
    assert term.err.startswith(
        f"ctx: ENOENT: no tool 't' on the CTX_PATH of agent '{AGENT}' (/ctx/tool:/ctx/home/"
        f"{world.uid}/tool)"
    ), term
    _, result = last_pair(world)
    assert (result["errno"], result["stage"], result["exit_status"]) == ("ENOENT", "resolve", None)
    native = world.native("t")
    assert native.rc == 1, native
    error = result_frame(native)["error"]
    assert (error["error"], error["stage"]) == ("ENOENT", "resolve"), error
    assert not world.ran()
    executable.chmod(0o755)
    assert world.terminal("t", "x").out == "t x\n"


@pytest.mark.parametrize(
    ("status", "shown"), [("disabled\n", "disabled"), ("", "empty"), ("AVAILABLE\n", "AVAILABLE")]
)
def test_a_status_other_than_available_refuses_the_call_until_it_reads_available(
    world, status, shown
):
    """docs/tools.md stage ``resolve``: the tool must be ``available`` (EACCES otherwise,
    saying what makes it available again); the session records the refusal; once the status
    control reads ``available`` the same call runs."""
    control = world.tool_dir("t") / "status"
    control.write_text(status)
    term = world.terminal("t", "x")
    assert (term.rc, term.out) == (126, ""), term
    assert term.err == (
        f"ctx: EACCES: tool t is not available (status: {shown}); it runs again once its "
        "status control t.d/status reads 'available'\n"
    ), term
    _, result = last_pair(world)
    assert (result["errno"], result["stage"], result["exit_status"]) == ("EACCES", "resolve", None)
    assert not world.ran()
    control.write_text("available\n")
    again = world.terminal("t", "x")
    assert (again.rc, again.out) == (0, "t x\n"), again


def test_a_hooks_control_that_is_a_file_is_damage_that_moving_it_and_reinstalling_mends(
    world, template
):
    """docs/tools.md "Hooks": ``hooks/`` is opened without following links, and what is not
    a directory there makes the tool damaged (ENOEXEC, naming ``t.d/hooks/`` and the
    reinstall); the advised reinstall refuses to replace what it did not make (naming it, and
    to move it away), and once it is moved away the reinstall mends the tool: the call runs."""
    hooks = world.tool_dir("t") / "hooks"
    shutil.rmtree(hooks)
    hooks.write_text("not a directory\n")
    term = world.terminal("t")
    assert term.rc == 126, term
    assert term.err == (
        f"ctx: ENOEXEC: tool t in {world.storage}/tool is damaged: t.d/hooks/ is missing or not "
        "a directory; reinstall it with 'ctx object install MANIFEST --tier system' ('ctx "
        "bootstrap' repairs only the core tools)\n"
    ), term
    manifest = template.top / "m" / "t.json"
    install = world.ctx("object", "install", manifest, "--tier", "system")
    assert install.rc == 1, install
    assert install.err.startswith(f"ctx: ENOTDIR: {hooks} is a file, not a directory"), install
    assert "move it away and install again" in install.err, install
    assert hooks.read_text() == "not a directory\n" and not world.ran()
    hooks.rename(world.top / "hooks-moved-away")
    assert world.ctx("object", "install", manifest, "--tier", "system").rc == 0
    grant(world.tool_dir("t") / "policy", "t")
    again = world.terminal("t", "mended")
    assert (again.rc, again.out) == (0, "t mended\n"), again


# =============================================================================== the spawn


def test_an_argv_the_kernel_cannot_pass_on_is_e2big_at_stage_run(world):
    """docs/tools.md stage ``run``: the process could not start (the kernel refused its
    exec) is said with the errno, never as an exit status of a tool that never ran.  With a
    stack limit of 1 MiB the kernel passes 256 KiB of arguments and environment: an argv
    that just fits ``ctx run``'s own start does not fit the tool's, whose environment is
    the agent's (CTX_MOUNTS, CTX_PATH…): E2BIG, exit 126, saying the arguments and
    environment together are too much, recorded at stage ``run`` with no exit status."""
    stack = 1024 * 1024
    env = {"CTX_STORAGE": str(world.storage), "PATH": "/usr/local/bin:/usr/bin:/bin"}
    head = ["run", "--agent", AGENT, "--session", "big", "t"]
    argv0 = [*CTX_ARGV, *head]

    def size(words: list[str]) -> int:
        strings = sum(len(os.fsencode(w)) + 1 for w in words)
        strings += sum(len(os.fsencode(f"{k}={v}")) + 1 for k, v in env.items())
        return strings + 8 * (len(words) + len(env) + 2)

    room = stack // 4 - size(argv0) - 250  # what ctx's own start leaves of the kernel's limit
    words: list[str] = []
    while room > 200:
        take = min(room - 9, 100_000)
        words.append("a" * take)
        room -= take + 1 + 8

    def small_stack() -> None:
        resource.setrlimit(resource.RLIMIT_STACK, (stack, stack))

    run = launch([*head, *words], env, preexec_fn=small_stack)
    assert (run.rc, run.out) == (126, ""), run
    assert run.err == (
        f"ctx: E2BIG: cannot start {world.storage}/tool/t: Argument list too long (its "
        "arguments and environment together are more than the kernel passes)\n"
    ), run
    call, result = last_pair(world, "big")
    assert len(call["argv"]) == len(words), call["argv"][:1]
    assert (result["errno"], result["stage"], result["exit_status"]) == ("E2BIG", "run", None)
    assert not world.ran()


def test_a_terminal_timeout_is_said_on_stderr_and_leaves_nothing_running(world):
    """docs/tools.md "Process group and bounds": a timeout kills the whole group with
    SIGKILL; terminal mode exits with the tool's status (137) and says ``ctx: ETIMEDOUT:
    timed out after Ns; its process group was killed``; the tool's background child is gone
    too, and the session records ETIMEDOUT at stage ``run``."""
    run = world.terminal("slow", options=("--timeout", "0.5", "--session", "late"))
    assert (run.rc, run.out) == (137, "started\n"), run
    assert run.err == "ctx: ETIMEDOUT: timed out after 0.5s; its process group was killed\n"
    child = int((world.ws / "slow-child").read_text())
    assert wait_for(lambda: not alive(child), 5), child
    _, result = last_pair(world, "late")
    assert (result["errno"], result["stage"], result["exit_status"]) == ("ETIMEDOUT", "run", 137)


def run_until_started(world: World, tool: str, session: str, signum: int) -> tuple[Run, int]:
    """``ctx run --agent coder --session SESSION TOOL`` (terminal mode) sent ``signum`` once
    the tool said ``started``; what it did, and the pid of the tool's background child."""
    proc = subprocess.Popen(
        [*CTX_ARGV, "run", "--agent", AGENT, "--session", session, tool],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=world.env,
    )
    try:
        first = proc.stdout.readline()
        assert first == b"started\n", first
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    child = int((world.ws / f"{tool}-child").read_text())
    run = Run(["run", tool], proc.returncode, (first + out).decode(), err.decode())
    return run, child


def test_a_tool_that_handles_its_callers_signal_and_fails_ends_as_interrupted(world):
    """docs/tools.md "Agent native mode and its frames" (terminal mode): the signal is passed
    on to the tool's process group, which may handle it; the call ends as EINTR at stage
    ``run`` with the tool's exit status, and ``ctx run`` exits 128 + the number of the
    signal it got.  A tool that cleans up and exits 5 on SIGHUP: exit 129, its output whole,
    the reason on stderr, its background child gone, EINTR recorded with exit status 5."""
    run, child = run_until_started(world, "graceful5", "hup", signal.SIGHUP)
    assert (run.rc, run.out) == (129, "started\ncleaned\n"), run
    assert run.err == (
        "ctx: EINTR: interrupted: its caller got SIGHUP and passed it on to its process group, "
        "killed if it still ran 2 s later (exit status 5)\n"
    ), run
    assert wait_for(lambda: not alive(child), 5), child
    _, result = last_pair(world, "hup")
    assert (result["errno"], result["stage"], result["exit_status"]) == ("EINTR", "run", 5)


def test_a_tool_that_handles_its_callers_signal_and_exits_0_still_ends_as_interrupted(world):
    """``ctx run --help``: SIGTERM to ``ctx run`` stops the tool's process group and records
    the call as ended (EINTR); exit 128 + the signal's number; docs/tools.md: the group may
    handle the signal, and "either way" the call ends as EINTR at stage ``run`` with the
    tool's exit status.  A tool that cleans up and exits 0 is no exception."""
    run, child = run_until_started(world, "graceful0", "term", signal.SIGTERM)
    assert run.out == "started\ncleaned\n", run
    assert wait_for(lambda: not alive(child), 5), child
    _, result = last_pair(world, "term")
    assert result["exit_status"] == 0, result
    assert run.rc == 143, run
    assert (result["errno"], result["stage"]) == ("EINTR", "run"), result


def test_a_tool_killed_by_its_own_signal_fails_with_the_shells_status_in_both_modes(world):
    """docs/tools.md "The result": ``exit_status`` is 128 + N after signal N, at stage
    ``exit`` with no errno (the tool named none); terminal mode exits with that status, as
    a shell does, and prints nothing of its own."""
    term = world.terminal("segv")
    assert (term.rc, term.out, term.err) == (139, "", ""), term
    frame = result_frame(world.native("segv"))
    assert (frame["status"], frame["exit_status"]) == ("error", 139), frame
    assert frame["error"] == {
        "error": None,
        "errno": None,
        "stage": "exit",
        "step": None,
        "step_name": None,
        "message": "segv exited with status 139",
    }, frame
    _, result = last_pair(world)
    assert (result["stage"], result["exit_status"], result["errno"]) == ("exit", 139, None)


def test_a_tool_that_shuts_its_streams_before_reading_a_large_input_just_fails(world):
    """docs/tools.md: the tool is given its input on stdin and its stdout is captured; one that
    closes both at once and exits 4 ends as a tool that exited 4 (stage ``exit``, its stderr's
    last line quoted), not as a failure of the runner to hand it its 4 MB input."""
    data = json.dumps({"x": "a" * 4_000_000})
    native = world.native("shut", data)
    assert native.rc == 1, native
    frame = result_frame(native)
    assert (frame["output"], frame["exit_status"], frame["stderr"]) == ("", 4, "bye\n"), frame
    assert frame["error"]["stage"] == "exit" and frame["error"]["errno"] is None, frame
    assert frame["error"]["message"] == "shut exited with status 4: bye", frame
    assert world.ran("shut")


# ============================================================================== the hooks


def test_a_pre_hook_flooding_stdout_with_bytes_and_failing_vetoes_without_a_message(world):
    """T-6, docs/tools.md "Hooks": what a hook writes on stdout is read and dropped, however
    much (100 KB of random bytes); a non-zero exit vetoes (EACCES, exit 126) naming the hook
    and its exit status, quoting nothing when its stderr said nothing; the tool does not
    run and the veto is recorded at stage ``hook``."""
    world.pre_hook("10-junk", "#!/bin/sh\nhead -c 100000 /dev/urandom\nexit 3\n")
    term = world.terminal("t")
    assert (term.rc, term.out) == (126, ""), term
    assert term.err == "ctx: EACCES: hooks/pre.d/10-junk vetoed the call (exit 3)\n", term
    _, result = last_pair(world)
    assert (result["errno"], result["stage"]) == ("EACCES", "hook"), result
    assert not world.ran()


def test_a_pre_hook_that_never_reads_a_large_input_lets_the_call_through(world):
    """T-6, docs/tools.md "Hooks": each hook is handed the call on stdin; one that exits 0
    without reading it passes, whatever the input's size (4 MB: more than a pipe holds), in
    native and terminal mode alike."""
    world.pre_hook("10-deaf", "#!/bin/sh\nexit 0\n")
    frame = result_frame(world.native("t", json.dumps({"x": "a" * 4_000_000})))
    assert (frame["status"], frame["output"]) == ("ok", "t \n"), frame
    term = world.terminal("t", "b" * 100_000)
    assert term.rc == 0 and term.out == f"t {'b' * 100_000}\n", term.rc


def test_post_hooks_that_cannot_run_are_listed_and_change_nothing(world):
    """docs/tools.md "What counts as a hook": a socket, an emptied guard (text with no ``#!``
    line: ENOEXEC) and a truncated ELF file are failed hooks (exit 126, saying why); in
    ``post.d`` each is listed in ``post_hooks`` — in the result and the session — and the
    call stays ``ok``."""
    world.post_hook("10-empty", b"")
    short = Path("/tmp") / f"sock-{os.getpid()}-{os.urandom(4).hex()}"  # a socket's path is short
    with contextlib.closing(socket.socket(socket.AF_UNIX)) as sock:
        sock.bind(str(short))
    short.rename(world.tool_dir("t") / "hooks" / "post.d" / "20-sock")
    world.post_hook("30-elf", b"\x7fELF\x02\x01\x01")
    native = world.native("t")
    assert native.rc == 0, native
    frame = result_frame(native)
    expected = [
        {"hook": "hooks/post.d/10-empty", "exit_status": 126,
         "message": "cannot be run: Exec format error"},
        {"hook": "hooks/post.d/20-sock", "exit_status": 126, "message": "is not a regular file"},
        {"hook": "hooks/post.d/30-elf", "exit_status": 126,
         "message": "cannot be run: Exec format error"},
    ]  # fmt: skip
    assert (frame["status"], frame["post_hooks"]) == ("ok", expected), frame
    _, result = last_pair(world)
    assert result["status"] == "ok" and result["post_hooks"] == expected, result
    term = world.terminal("t", "x")
    assert (term.rc, term.out, term.err) == (0, "t x\n", ""), term


# ======================================================================= frames and records


def test_a_native_reader_that_leaves_after_the_call_frame_lets_the_tool_finish(world):
    """docs/tools.md: a frame after ``call`` that cannot be written lets the tool run to its
    end and its result be recorded; a reader that left (a closed pipe) ends ``ctx run``
    quietly, exit 141."""
    proc = subprocess.Popen(
        [*CTX_ARGV, "run", "--agent", AGENT, "--native", "--session", "gone", "talker"],
        stdin=_bytes_in(world, b"{}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=world.env,
    )
    try:
        first = json.loads(proc.stdout.readline())
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=30) == 141
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stderr.close()
    assert first["type"] == "call" and err == b"", (first, err)
    assert world.ran("talker")
    _, result = last_pair(world, "gone")
    assert result["call"] == first["call"], result
    assert (result["status"], result["exit_status"], result["output"]) == ("ok", 0, "ok\n")


def test_frames_lost_to_a_full_disk_after_a_timeout_say_the_tool_ran_and_timed_out(world):
    """docs/tools.md: when its frames cannot be written ``ctx run --native`` exits 74 with
    ``ctx: ENOSPC: cannot write standard output (…)`` and what became of the call; a tool
    that timed out once its first frames were out ran and exited 137, and that is said with
    its reason and stage, the call recorded in its session; its child is gone, and what
    reached the disk begins with the whole ``call`` frame."""
    with small_tmpfs(world.top / "small", "4k", 0o755) as small:
        with open(small / "frames", "wb") as out:
            run = launch(
                ["run", "--agent", AGENT, "--native", "--timeout", "1", "--session", "full",
                 "chatty"],
                world.env, stdin=_bytes_in(world, b"{}"), stdout=out,
            )  # fmt: skip
        written = (small / "frames").read_bytes()
    assert run.rc == 74, run
    assert run.err == (
        "ctx: ENOSPC: cannot write standard output (No space left on device); chatty ran and "
        "exited 137 (ETIMEDOUT: timed out after 1s; its process group was killed [run]); the "
        f"call is recorded in session {world.session_name('full')}\n"
    ), run
    call = json.loads(written.split(b"\n")[0])
    assert call["type"] == "call" and call["tool"] == "chatty", call
    _, result = last_pair(world, "full")
    assert result["call"] == call["call"], result
    assert (result["errno"], result["stage"], result["exit_status"]) == ("ETIMEDOUT", "run", 137)
    child = int((world.ws / "chatty-child").read_text())
    assert wait_for(lambda: not alive(child), 5), child


def test_a_tool_log_that_cannot_be_written_is_not_blamed_on_the_session(world):
    """docs/tools.md: when the frames cannot be written, ctx says what became of the call:
    ``… the call is recorded in session …``, or ``…, but the call could not be recorded …``
    when the session's disk is full too.  The session is written first and whatever became
    of the tool's log; with only the log refused, the session holds the call, and the
    message must not say it does not."""
    with attribute(world.tool_dir("t") / "log", "i"):
        run = to_dev_full(world, ["run", "--agent", AGENT, "--native", "--session", "imm", "t"])
    assert run.rc == 74, run
    assert run.err.startswith("ctx: ENOSPC: cannot write standard output"), run
    _, result = last_pair(world, "imm")
    assert (result["errno"], result["stage"]) == ("ENOSPC", "output"), result
    assert "could not be recorded in session" not in run.err, run


def test_a_tool_log_that_cannot_be_written_fails_a_call_that_exited_0(world):
    """docs/tools.md stage ``record``: a result that cannot be recorded in the tool's log
    makes the call an error whatever the tool did: terminal mode exits 1 for a tool that
    exited 0, saying so; native mode keeps the output and exit status, EPERM at stage
    ``record``; the session, written first, holds the call."""
    with attribute(world.tool_dir("t") / "log", "i"):
        term = world.terminal("t", "x", options=("--session", "imm"))
        native = world.native("t", options=("--session", "imm"))
    assert (term.rc, term.out) == (1, "t x\n"), term
    assert term.err.startswith(
        "ctx: EPERM: the tool exited 0, but its result could not be recorded"
    ), term
    assert native.rc == 1, native
    frame = result_frame(native)
    assert (frame["exit_status"], frame["output"]) == (0, "t \n"), frame
    assert (frame["error"]["error"], frame["error"]["stage"]) == ("EPERM", "record"), frame
    _, result = last_pair(world, "imm")
    assert result["call"] == frame["call"] and result["status"] == "ok", result


def test_a_tool_log_that_cannot_be_written_is_said_in_the_error_of_a_call_that_failed(world):
    """docs/tools.md stage ``record``: a call that had failed already keeps its error (its
    stage ``exit``, the errno the tool named), which then says the record is missing too;
    terminal mode exits with the tool's own status, its output kept."""
    with attribute(world.tool_dir("fails") / "log", "i"):
        frame = result_frame(world.native("fails", options=("--session", "imm")))
        term = world.terminal("fails", options=("--session", "imm"))
    error = frame["error"]
    assert (error["error"], error["stage"], frame["exit_status"]) == ("ENOSPC", "exit", 3)
    assert error["message"].startswith("fails exited with status 3: disk full; and its result "
                                       "could not be recorded (EPERM: "), error  # fmt: skip
    assert (term.rc, term.out) == (3, '{"errno": 28, "message": "disk full"}\n'), term
    assert world.ran("fails")
