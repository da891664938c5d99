"""Acceptance tests of §7 (tsh, its configuration, ``ctx tool``), §8 (the agent terminal),
§10 (ctxmcp), §11 and §12 (``ctx man``), run against the installed commands: unusual but
legal inputs, closed streams, repeated commands and the exact shape of what they print."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import select
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, clean_env, ctx_run
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user


def tool_env(storage: Path, **extra: str) -> dict[str, str]:
    """The environment of a host user whose CTX_PATH is the storage root's system tier."""
    return clean_env(CTX_STORAGE=str(storage), CTX_PATH=str(storage / "tool"), **extra)


def config_of(storage: Path) -> Path:
    return storage / "tool" / "tsh.d" / "config"


# ------------------------------------------------------------------ H-4: tsh.d/config


@pytest.mark.parametrize("digits", ["²", "٣", "６４"])
def test_tsh_config_refuses_digits_that_are_not_ascii(storage, digits):
    """H-4: settings are decimal numbers; other scripts' digits are refused with EINVAL (exit
    2), and the file is left as it was."""
    before = config_of(storage).read_bytes()
    r = ctx_run("tool", "tsh.config", f"cache_capacity={digits}", env=tool_env(storage))
    assert r.rc == 2, r
    assert r.err.startswith("ctx: EINVAL: tsh.config: cache_capacity must be"), r
    assert "Traceback" not in r.err
    set_json = json.dumps({"set": {"cache_capacity": digits}})
    r = ctx_run("tool", "--json", "tsh.config", set_json, env=tool_env(storage))
    assert r.rc == 2, r
    assert r.json()["error"] == "EINVAL"
    assert config_of(storage).read_bytes() == before


def test_a_config_line_with_a_superscript_is_reported_not_a_crash(storage):
    """H-4: a config line tsh cannot use is a problem that bootstrap, ctx tool and tsh report;
    the defaults apply to it and nothing crashes."""
    config = config_of(storage)
    config.chmod(0o644)
    with config.open("a") as text:
        text.write("cache_capacity=²\n")
    r = ctx_run("bootstrap", "--storage", storage)
    assert r.rc == 1, r
    assert "tool/tsh.d/config:5: cache_capacity must be a positive integer" in r.out, r
    r = ctx_run("tool", "tsh.config", env=tool_env(storage))
    assert r.rc == 0, r
    assert "cache_capacity=32" in r.lines()
    tsh = subprocess.run(
        [storage / "bin" / "tsh", "tools"], capture_output=True, text=True,
        env=tool_env(storage), timeout=60,
    )  # fmt: skip
    assert tsh.returncode == 0, tsh
    assert "tsh.config" in tsh.stdout.split()
    assert "cache_capacity must be a positive integer" in tsh.stderr
    assert "Traceback" not in tsh.stderr


def test_reading_a_config_with_a_line_tsh_cannot_use_warns_of_it(storage):
    """H-4: the settings shown for a config with a bad line are partly the defaults; a read
    says so on stderr (exit 0), through ctx tool and when the tool runs directly."""
    config_of(storage).write_text("max_loaded_tools=12\ncache_capacity=lots\n")
    warning = (
        "tsh.d/config:2: cache_capacity must be a positive integer, not 'lots' "
        "(ignored; the default applies)\n"
    )
    r = ctx_run("tool", "tsh.config", env=tool_env(storage))
    assert r.rc == 0, r
    assert r.out == "max_loaded_tools=12\ncache_capacity=32\nwindow_percent=1\n"
    assert r.err == f"ctx: warning: tsh.config: {warning}"
    direct = subprocess.run(
        [storage / "tool" / "tsh.config"], capture_output=True, text=True, timeout=60,
        stdin=subprocess.DEVNULL, env=tool_env(storage),
    )  # fmt: skip
    assert (direct.returncode, direct.stdout) == (0, r.out), direct
    assert direct.stderr == f"tsh.config: warning: {warning}"


def test_a_numeric_string_in_set_is_written_as_a_number(storage):
    r = ctx_run(
        "tool", "--json", "tsh.config", '{"set": {"cache_capacity": "48"}}', env=tool_env(storage)
    )
    assert r.rc == 0, r
    assert r.json()["config"]["cache_capacity"] == 48
    assert r.json()["changed"] == ["cache_capacity"]
    assert "cache_capacity=48" in config_of(storage).read_text().splitlines()


def test_cache_capacity_has_a_ceiling_tsh_can_start_with(storage):
    """H-4: tsh sizes its path cache by cache_capacity when it starts, so a capacity beyond
    65536 is refused (EINVAL, exit 2, the file unchanged), and such a line written by hand
    is a problem tsh reports while it starts with the default."""
    before = config_of(storage).read_bytes()
    for value in ("65537", "99999999999999999999999"):
        r = ctx_run("tool", "tsh.config", f"cache_capacity={value}", env=tool_env(storage))
        assert r.rc == 2, r
        refusal = f"cache_capacity must be at most 65536, not {value}"
        assert r.err == f"ctx: EINVAL: tsh.config: {refusal}\n", r
    assert config_of(storage).read_bytes() == before
    r = ctx_run("tool", "tsh.config", "cache_capacity=65536", env=tool_env(storage))
    assert r.rc == 0 and "cache_capacity=65536" in r.lines(), r
    config_of(storage).write_text("cache_capacity=99999999999999999999999\n")
    tsh = subprocess.run(
        [storage / "bin" / "tsh", "which", "fs.read"], capture_output=True, text=True,
        env=tool_env(storage), timeout=60,
    )  # fmt: skip
    assert tsh.returncode == 0, tsh
    assert tsh.stdout == f"{storage}/tool/fs.read\n"
    assert tsh.stderr == (
        "tsh: tsh.d/config:1: cache_capacity must be at most 65536, not 99999999999999999999999 "
        "(ignored; the default applies)\n"
    )


def test_a_user_who_may_not_write_the_config_is_told_whose_it_is(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
):
    """H-4: the configuration is the storage root owner's; anyone else running tsh.config
    reads it, and an update is EACCES naming the file and how its owner changes it — not the
    name of a temporary file the reader never heard of."""
    storage = traversable_tmp / "storage"
    assert ctx_run("bootstrap", "--storage", storage).rc == 0
    before = config_of(storage).read_bytes()
    tool = str(storage / "tool" / "tsh.config")
    shown = run_as(unprivileged_user, [tool], env=tool_env(storage), cwd=Path("/"))
    assert shown.returncode == 0, shown
    assert shown.stdout == "max_loaded_tools=64\ncache_capacity=32\nwindow_percent=1\n"
    refused = run_as(
        unprivileged_user, [tool, "cache_capacity=5"], env=tool_env(storage), cwd=Path("/")
    )
    assert refused.returncode == 1, refused
    assert refused.stderr == (
        f"tsh.config: EACCES: {config_of(storage)} cannot be changed by uid "
        f"{unprivileged_user.uid} (Permission denied): the configuration belongs to the "
        "storage root's owner, who changes it with 'ctx tool tsh.config KEY=VALUE'\n"
    )
    assert config_of(storage).read_bytes() == before
    assert not [p.name for p in config_of(storage).parent.iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------ H-1, T-3: tsh itself


def tsh(storage: Path, *args: str, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE):
    """The storage root's ``bin/tsh``, run as a standalone human tsh (H-2)."""
    return subprocess.run(
        [storage / "bin" / "tsh", *args], stdin=stdin, stdout=stdout, stderr=subprocess.PIPE,
        env=tool_env(storage), timeout=60, text=True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "status"),
    [(["7"], 7), (["256"], 0), (["-1"], 255), (["²"], 2), (["foo"], 2), ([], 0)],
)
def test_tsh_exit_takes_a_decimal_status_as_a_shell_does(storage, argv, status):
    r = tsh(storage, "exit", *argv)
    assert r.returncode == status, r
    assert "Traceback" not in r.stderr
    if status == 2:
        assert r.stderr == f"tsh: exit: {argv[0]}: a decimal number is needed (exit [N])\n"


def test_tsh_exit_with_two_arguments_does_not_leave(storage):
    r = subprocess.run(
        [storage / "bin" / "tsh"], input="exit 1 2\nexit 5\n", capture_output=True,
        env=tool_env(storage), timeout=60, text=True,
    )  # fmt: skip
    assert r.returncode == 5, r
    assert r.stderr == "tsh: exit: too many arguments (exit [N])\n"


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (["which"], "tsh: which: a tool name is needed (which NAME...)"),
        (["describe"], "tsh: describe: a tool name is needed (describe NAME...)"),
        (["tools", "fs.read"], "tsh: tools: takes no arguments (tools)"),
        (["loaded", "fs.read"], "tsh: loaded: takes no arguments (loaded)"),
        (["rehash", "now"], "tsh: rehash: takes no arguments (rehash)"),
        (["help", "which"], "tsh: help: takes no arguments (help)"),
    ],
)
def test_a_built_in_used_wrongly_is_a_usage_error(storage, argv, complaint):
    """A built-in given no names where it needs some, or words where it takes none, says its
    form and exits 2, as its sibling built-ins do, instead of quietly doing nothing."""
    r = tsh(storage, *argv)
    assert r.returncode == 2, r
    assert (r.stdout, r.stderr) == ("", complaint + "\n")


def test_describe_takes_several_names(storage):
    r = tsh(storage, "describe", "fs.read", "fs.list")
    assert r.returncode == 0, r
    decoder, text, names = json.JSONDecoder(), r.stdout, []
    while text.strip():
        described, end = decoder.raw_decode(text.lstrip())
        names.append(described["name"])
        text = text.lstrip()[end:]
    assert names == ["fs.read", "fs.list"]


def test_tools_prints_nothing_when_ctx_path_holds_none(storage, tmp_path):
    r = subprocess.run(
        [storage / "bin" / "tsh", "tools"], capture_output=True, text=True, timeout=60,
        env=clean_env(CTX_STORAGE=str(storage), CTX_PATH=str(tmp_path)),
    )  # fmt: skip
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


def test_tsh_reading_a_script_prints_no_prompts(storage):
    """Commands piped into tsh answer with their output alone, as a POSIX shell's do; the
    prompt is for a person at a terminal."""
    r = subprocess.run(
        [storage / "bin" / "tsh"], input="which fs.read\nwhich fs.list\n", capture_output=True,
        env=tool_env(storage), timeout=60, text=True,
    )  # fmt: skip
    assert r.returncode == 0, r
    assert r.stdout == f"{storage}/tool/fs.read\n{storage}/tool/fs.list\n"
    assert r.stderr == ""
    pid, terminal = pty.fork()
    if pid == 0:
        try:
            os.execve(storage / "bin" / "tsh", [str(storage / "bin" / "tsh")], tool_env(storage))
        finally:
            os._exit(127)
    os.write(terminal, b"exit 3\n")
    shown, deadline = b"", time.monotonic() + 30
    with contextlib.suppress(OSError):  # EIO once tsh has left
        while time.monotonic() < deadline and select.select([terminal], [], [], 1)[0]:
            chunk = os.read(terminal, 65536)
            if not chunk:
                break
            shown += chunk
    _, status = os.waitpid(pid, 0)
    os.close(terminal)
    assert os.waitstatus_to_exitcode(status) == 3
    assert b"tsh$ " in shown


@pytest.mark.parametrize("option", ["--help", "-h"])
def test_tsh_help_option_prints_usage(storage, option):
    r = tsh(storage, option)
    assert r.returncode == 0, r
    assert r.stdout.startswith("usage: tsh [NAME [ARG...]]\n")
    assert "which NAME..." in r.stdout
    assert r.stderr == ""


def test_tsh_with_closed_standard_streams_is_no_traceback(storage):
    """A closed stdin reads as end of input (tsh leaves with status 0); closed output is dropped."""
    closed_stdin = subprocess.run(
        f"exec {storage}/bin/tsh <&-", shell=True, capture_output=True, text=True,
        env=tool_env(storage), timeout=60,
    )  # fmt: skip
    assert closed_stdin.returncode == 0, closed_stdin
    assert closed_stdin.stderr == ""
    for command in ("help", "describe fs.read", "which fs.read"):
        closed_stdout = subprocess.run(
            f"exec {storage}/bin/tsh {command} >&-", shell=True, capture_output=True, text=True,
            env=tool_env(storage), timeout=60,
        )  # fmt: skip
        assert closed_stdout.returncode == 0, closed_stdout
        assert closed_stdout.stderr == ""
    closed_stderr = subprocess.run(
        f"exec {storage}/bin/tsh which nope 2>&-", shell=True, capture_output=True, text=True,
        env=tool_env(storage), timeout=60,
    )  # fmt: skip
    assert closed_stderr.returncode == 1
    assert closed_stderr.stdout == ""  # the complaint is not moved to stdout


# ------------------------------------------------------------------ ctx agent create

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents with other uids need root")


@needs_root
@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--user", "nobody", "--gid", "-5"], "--gid takes ids"),
        (["--user", "nobody", "--gid", "4294967295"], "--gid takes ids"),
        (["--user", "nobody", "--groups", "10,-1"], "--groups takes ids"),
        (["--user", "4294967296", "--gid", "1"], "--user takes ids"),
        (["--user", "²"], "no such user: '²'"),
    ],
)
def test_agent_create_refuses_an_identity_no_kernel_has(storage, options, message):
    """A-3, P-5 step 1: ids are integers from 0 to 2**32 - 2; anything else is a usage error
    (EINVAL, exit 2) and nothing is created — not an agent that every later use refuses."""
    request = json.dumps({"name": "triage", "label": "triage_t"})
    r = ctx_run("agent", "create", "-", *options, "--storage", storage, input=request)
    assert r.rc == 2, r
    assert r.err.startswith("ctx: EINVAL: ") and message in r.err, r
    assert "Traceback" not in r.err
    assert not (storage / "agent" / "triage").exists()
    assert not (storage / "agent" / "triage.d").exists()


@needs_root
def test_agent_create_takes_the_largest_gid(storage):
    request = json.dumps({"name": "triage", "label": "triage_t"})
    options = ["--user", "nobody", "--gid", "4294967294", "--groups", "1,,2"]
    r = ctx_run("agent", "create", "-", *options, "--json", "--storage", storage, input=request)
    assert r.rc == 0, r
    assert r.json()["identity"]["gid"] == 4294967294
    assert r.json()["identity"]["groups"] == [1, 2]
    shown = ctx_run("agent", "show", "triage", "--json", "--storage", storage)
    assert shown.rc == 0, shown


@needs_root
def test_agent_show_text_is_for_people_not_python_reprs(storage):
    request = json.dumps({"name": "triage", "label": "triage_t"})
    options = ["--user", "nobody", "--gid", "7", "--groups", "20,10"]
    r = ctx_run("agent", "create", "-", *options, "--storage", storage, input=request)
    assert r.rc == 0, r
    shown = ctx_run("agent", "show", "triage", "--storage", storage)
    assert shown.rc == 0, shown
    uid = ctx_run("agent", "show", "triage", "--json", "--storage", storage).json()["identity"]
    assert shown.lines() == [
        "name: triage",
        "label: triage_t",
        f"identity: uid {uid['uid']}, gid 7, groups 10,20",
        f"ctx_path: /ctx/tool:/ctx/home/{uid['uid']}/tool",
        f"mount: {storage} at /ctx (ro)",
        "cwd: /ctx",
    ]


# ------------------------------------------------------------------ the workspace


def test_start_from_a_removed_directory_says_which_directory(storage, tmp_path):
    """A-1: the current directory is the default /workspace; when it is gone the refusal
    says so (ENOENT, exit 1) instead of a bare 'No such file or directory'."""
    gone = tmp_path / "gone"
    gone.mkdir()
    ctx = Path(CTX_ARGV[0])
    for command in (f"{ctx} agent start coder", f"{storage}/bin/ctxterm coder"):
        r = subprocess.run(
            f"cd {gone} && rmdir {gone} && exec {command} --storage {storage}",
            shell=True, capture_output=True, text=True, env=clean_env(), timeout=60,
        )  # fmt: skip
        assert r.returncode == 1, r
        assert "ENOENT: the current directory, the terminal's default /workspace" in r.stderr
        gone.mkdir()


# ------------------------------------------------------------------ start and stop

needs_terminal = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)


@needs_terminal
def test_start_stop_and_their_refusals_say_what_to_do(storage):
    """Starting a running terminal is EEXIST, stopping or watching one that is not running
    ENOENT; each says which command does what the user wanted.  A stop prints what it
    stopped, as a start prints what it started, and --json gives the same facts."""
    request = json.dumps({"name": "triage", "label": "triage_t"})
    assert ctx_run("agent", "create", "-", "--storage", storage, input=request).rc == 0
    session = f"s{uuid.uuid4().hex[:12]}"  # the sockets under /run are shared by all roots
    where = ["triage", "--session", session, "--storage", storage]
    started = ctx_run("agent", "start", *where, "--no-workspace", "--json")
    assert started.rc == 0, started
    try:
        again = ctx_run("agent", "start", *where, "--no-workspace")
        assert again.rc == 1, again
        assert again.err == (
            f"ctx: EEXIST: the terminal of triage in session {session} is already running: "
            f"watch it with 'ctx agent watch triage --session {session} --storage {storage}', "
            f"end it with 'ctx agent stop triage --session {session} --storage {storage}', or "
            "start another session with "
            "--session\n"
        )
        pid = int(Path(started.json()["listening_at"]).with_name("pid").read_text())
    finally:
        stopped = ctx_run("agent", "stop", *where, "--json")
        if stopped.rc != 0:  # leave no terminal running whatever went wrong
            ctx_run("agent", "stop", *where)
    assert stopped.rc == 0, stopped
    assert stopped.json() == {"agent": "triage", "session": session, "pid": pid}
    assert not Path(started.json()["listening_at"]).exists()
    not_running = (
        f"ctx: ENOENT: no terminal of triage in session {session} is running; start one with "
        f"'ctx agent start triage --session {session} --storage {storage}'\n"
    )
    for command in ("stop", "watch", "attach"):
        r = ctx_run("agent", command, *where)
        assert (r.rc, r.out, r.err) == (1, "", not_running), r
    r = ctx_run("agent", "stop", *where, "--json")
    assert r.rc == 1 and r.json()["error"] == "ENOENT", r


@needs_terminal
def test_start_and_stop_say_what_they_did(storage):
    request = json.dumps({"name": "triage", "label": "triage_t"})
    assert ctx_run("agent", "create", "-", "--storage", storage, input=request).rc == 0
    session = f"s{uuid.uuid4().hex[:12]}"
    where = ["triage", "--session", session, "--storage", storage]
    started = ctx_run("agent", "start", *where, "--no-workspace", "--json")
    assert started.rc == 0, started
    pid = Path(started.json()["listening_at"]).with_name("pid").read_text()
    stopped = ctx_run("agent", "stop", *where)
    assert (stopped.rc, stopped.out) == (0, f"stopped triage, session {session} (pid {pid})\n")
    started = ctx_run("agent", "start", *where, "--no-workspace")
    stopped = ctx_run("agent", "stop", *where)
    uid = ctx_run("agent", "show", "triage", "--json", "--storage", storage).json()["identity"]
    home = storage / "home" / str(uid["uid"]) / "agent" / "triage"
    link = home / "session" / session / "terminal"
    assert started.lines() == [
        f"started triage, session {session}: {link / 'main.sock'}",
        # Given --storage, the commands it suggests name the root too, so that they reach it
        # from a shell without $CTX_STORAGE.
        f"watch: ctx agent watch triage --session {session} --storage {storage}   "
        f"join: ctx agent attach triage --session {session} --storage {storage}",
    ], started
    assert stopped.rc == 0, stopped


@needs_terminal
def test_what_is_typed_before_ctrl_close_bracket_reaches_the_terminal(storage):
    """A-2: attach writes its input to the PTY; Ctrl-] detaches.  Input that arrives in the
    same read as the Ctrl-] (pasted, or written by a script) is still delivered."""
    request = json.dumps({"name": "triage", "label": "triage_t"})
    assert ctx_run("agent", "create", "-", "--storage", storage, input=request).rc == 0
    session = f"s{uuid.uuid4().hex[:12]}"
    where = ["triage", "--session", session, "--storage", storage]
    started = ctx_run("agent", "start", *where, "--no-workspace", "--json")
    assert started.rc == 0, started
    try:
        pid, terminal = pty.fork()
        if pid == 0:
            try:
                os.execve(CTX_ARGV[0], [*CTX_ARGV, "agent", "attach", *where], clean_env())
            finally:
                os._exit(127)
        shown, deadline = b"", time.monotonic() + 20
        while b"triage$ " not in shown and time.monotonic() < deadline:
            # the prompt, relayed: attach has connected and put its pty in raw mode
            if select.select([terminal], [], [], 0.5)[0]:
                shown += os.read(terminal, 65536)
        assert b"triage$ " in shown, shown
        os.write(terminal, b"help\r\x1d")
        status, deadline = None, time.monotonic() + 20
        while status is None and time.monotonic() < deadline:
            reaped, code = os.waitpid(pid, os.WNOHANG)
            if reaped:
                status = code
            else:
                time.sleep(0.05)
        if status is None:  # never detached: end it rather than hang the suite
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(terminal)
        assert status is not None and os.waitstatus_to_exitcode(status) == 0, status
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as watcher:
            watcher.connect(started.json()["listening_at"])
            watcher.sendall(b"watch\n")
            seen, deadline = b"", time.monotonic() + 20
            while b"tsh runs CortexFS tools" not in seen and time.monotonic() < deadline:
                watcher.settimeout(max(deadline - time.monotonic(), 0.1))
                seen += watcher.recv(65536)
        assert b"tsh runs CortexFS tools" in seen, seen
    finally:
        ctx_run("agent", "stop", *where)
