"""The agent terminal end to end: ``ctx agent start``, the terminal socket, tsh (SPEC A-1, A-2,
H-1, T-3, T-5).

A real sandbox (bubblewrap), a real FUSE view, a real PTY and a real second uid.  The tests
speak the socket protocol of A-2 directly: one mode line, then raw bytes.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cortexfs.agents.terminal_runtime import run_directory
from cortexfs.shared.events import read_events
from tests.fuse.support import mounted
from tests.support.cli import ctx
from tests.support.users import group_named
from tests.tools.support import World

try:
    import pyfuse3
except ImportError:  # pragma: no cover - depends on the machine
    pyfuse3 = None

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a sandboxed terminal needs root"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse on this machine"),
    pytest.mark.skipif(pyfuse3 is None, reason="pyfuse3 (the 'fuse' extra) is not installed"),
]


def fresh_session() -> str:
    """A session name no other test uses: the terminal's sockets live under /run, and tests
    may run side by side."""
    return f"t{uuid.uuid4().hex[:12]}"


def lifecycle(world: World, session: str, agent: str = "coder") -> list[dict[str, object]]:
    """The terminal's facts in the agent's log (S-3), for ``session``."""
    events = read_events(world.root / "agent" / f"{agent}.d" / "log").events
    return [e for e in events if e["type"].startswith("terminal.") and e["session"] == session]


class Client:
    """One connection to the terminal socket, in ``watch`` or ``attach`` mode."""

    def __init__(self, path: str, mode: str) -> None:
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket.connect(path)
        self.socket.sendall(mode.encode() + b"\n")
        self.seen = b""

    def expect(self, pattern: str, timeout: float = 20) -> str:
        """Read until ``pattern`` (a regular expression) appears; the text read so far."""
        deadline = time.monotonic() + timeout
        while not re.search(pattern.encode(), self.seen):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"{pattern!r} never came; got {self.seen[-500:]!r}"
            self.socket.settimeout(remaining)
            data = self.socket.recv(65536)
            assert data, f"the terminal closed before {pattern!r}; got {self.seen[-500:]!r}"
            self.seen += data
        return self.seen.decode(errors="replace")

    def type(self, line: str) -> None:
        self.socket.sendall(line.encode() + b"\r")

    def close(self) -> None:
        self.socket.close()


@contextlib.contextmanager
def running_terminal(world: World, agent: str) -> Iterator[dict[str, str]]:
    """A terminal of ``agent`` in a session of its own, as ``ctx agent start --json`` reports
    it (``session``, ``listening_at``…); stopped at the end unless it has ended already."""
    session = fresh_session()
    started = ctx(world.root, "agent", "start", agent, "--session", session, "--json")
    assert started.returncode == 0, started.stderr
    try:
        yield json.loads(started.stdout)
    finally:
        ctx(world.root, "agent", "stop", agent, "--session", session)


@contextlib.contextmanager
def calling_in_terminal(
    world: World, agent: str, tool: str, program: str
) -> Iterator[tuple[dict[str, str], Client]]:
    """A terminal of ``agent``, which may run ``tool`` (installed with ``program``), and a
    client attached to it that has typed ``tool``: its call is under way in the block."""
    world.install(tool, program)
    world.agent(agent, tools=[tool])
    world.allow_tool(tool, label=f"{agent}_t")
    with running_terminal(world, agent) as facts:
        client = Client(facts["listening_at"], "attach")
        client.expect(rf"{agent}\$ ")
        client.type(tool)
        yield facts, client


@pytest.fixture
def terminal(world: World) -> Iterator[dict[str, str]]:
    world.agent("coder", tools=["fs.stat"])
    world.allow_tool("fs.stat")
    with running_terminal(world, "coder") as facts:
        yield facts


def test_tsh_runs_a_tool_through_the_chain_and_records_it(
    world: World, terminal: dict[str, str]
) -> None:
    client = Client(terminal["listening_at"], "attach")
    client.expect(r"coder\$ ")

    client.type("fs.stat /workspace")

    assert "type: directory" in client.expect(r"type: directory[\s\S]*coder\$ ")
    events = world.events("coder", terminal["session"])
    assert [e["type"] for e in events][-2:] == ["tool_call", "tool_result"]
    assert events[-2]["mode"] == "terminal" and events[-2]["argv"] == ["/workspace"]
    client.close()


def test_tsh_runs_no_host_command_and_no_tool_outside_the_agents_view(
    terminal: dict[str, str],
) -> None:
    client = Client(terminal["listening_at"], "attach")
    client.expect(r"coder\$ ")

    # Each refusal is followed by its prompt before the next line is typed: the terminal
    # echoes typed input at once, which could otherwise land before the previous prompt.
    client.type("ls /")
    client.expect(r"tsh: ls: not a tool on CTX_PATH[^\n]*\n[\s\S]*coder\$ ")
    client.type("shell.exec 'id'")
    client.expect(r"tsh: shell.exec: not a tool on CTX_PATH[^\n]*\n[\s\S]*coder\$ ")
    client.type("tools")

    listed = client.expect(r"tools\r?\n[\s\S]*coder\$ ").rsplit("tools", 1)[1]
    assert [line.strip() for line in listed.splitlines() if line.strip()][:-1] == ["fs.stat"]
    client.close()


def test_ctx_agent_attach_with_piped_input_shows_what_it_answers(
    world: World, terminal: dict[str, str]
) -> None:
    """A script piped into attach is typed, and attach stays until the terminal is quiet."""
    command = ["agent", "attach", "coder", "--session", terminal["session"]]
    attached = subprocess.run(
        [sys.executable, "-m", "cortexfs", "--storage", str(world.root), *command],
        input=b"fs.stat /workspace\r",
        capture_output=True,
        timeout=60,
    )

    assert attached.returncode == 0, attached.stderr
    assert re.search(rb"fs\.stat /workspace[\s\S]*type: directory", attached.stdout), attached


def test_a_watcher_sees_the_output_and_cannot_type(world: World, terminal: dict[str, str]) -> None:
    watcher = Client(terminal["listening_at"], "watch")
    watcher.expect(r"coder\$ ")
    watcher.type("fs.stat /etc")  # ignored: watch is read-only
    time.sleep(1)
    user = Client(terminal["listening_at"], "attach")
    user.expect(r"coder\$ ")

    user.type("fs.stat /workspace")

    watcher.expect(r"type: directory")
    calls = [e for e in world.events("coder", terminal["session"]) if e["type"] == "tool_call"]
    assert [e["argv"] for e in calls] == [["/workspace"]]
    watcher.close()
    user.close()


def test_a_mode_line_that_arrives_in_pieces_is_one_line(terminal: dict[str, str]) -> None:
    """A-2: a stream keeps no write boundaries; the mode line ends at its newline."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(terminal["listening_at"])
    for piece in (b"att", b"ach", b"\n"):
        client.sendall(piece)
        time.sleep(0.3)  # each piece its own read on the terminal's side
    client.sendall(b"fs.stat /workspace\r")
    seen = b""
    client.settimeout(20)
    while b"type: directory" not in seen:
        data = client.recv(65536)
        assert data, f"the terminal closed the connection; got {seen!r}"
        seen += data
    assert b"ctxterm: expected" not in seen
    client.close()


def test_a_mode_line_that_never_ends_is_refused(terminal: dict[str, str]) -> None:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(terminal["listening_at"])
    client.sendall(b"w" * 100)
    client.settimeout(20)
    assert client.recv(65536) == b"ctxterm: expected 'watch' or 'attach' on the first line\n"
    assert client.recv(65536) == b""
    client.close()


@pytest.mark.parametrize("line", [b" attach\n", b"attach\r\n", b"attach \n", b"ATTACH\n"])
def test_a_mode_line_other_than_exactly_watch_or_attach_is_refused(
    terminal: dict[str, str], line: bytes
) -> None:
    """A-2: the first line is ``watch\\n`` or ``attach\\n``, nothing near it."""
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(terminal["listening_at"])
    client.sendall(line + b"fs.stat /workspace\r")
    client.settimeout(20)
    assert client.recv(65536) == b"ctxterm: expected 'watch' or 'attach' on the first line\n"
    assert client.recv(65536) == b""
    client.close()


def test_exit_ends_the_terminal_and_leaves_nothing_behind(
    world: World, terminal: dict[str, str]
) -> None:
    run_dir = Path(terminal["listening_at"]).parent
    client = Client(terminal["listening_at"], "attach")
    client.expect(r"coder\$ ")

    client.type("exit")

    deadline = time.monotonic() + 30
    while run_dir.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not run_dir.exists(), "sockets and the view's mount point are removed"
    assert not Path(terminal["socket"]).is_symlink()
    mounts = Path("/proc/self/mounts").read_text()
    assert str(run_dir) not in mounts, "the agent's view is unmounted"
    stopped = lifecycle(world, terminal["session"])[-1]
    assert stopped["type"] == "terminal.stopped"
    assert (stopped["reason"], stopped["exit_status"]) == ("exit", 0)


def test_the_last_terminal_of_an_agent_to_end_removes_the_agents_run_directory(
    world: World,
) -> None:
    """The first session's terminal makes the agent's run directory; ended while a second
    session's is in it, it must leave it, and the second, ending last, removes it."""
    agent = f"a{uuid.uuid4().hex[:12]}"  # no other test's terminal shares its run directory
    world.agent(agent, tools=["fs.stat"])
    world.allow_tool("fs.stat", label=f"{agent}_t")
    first, second = fresh_session(), fresh_session()
    try:
        started = [
            ctx(world.root, "agent", "start", agent, "--session", session, "--json")
            for session in (first, second)
        ]
        assert all(done.returncode == 0 for done in started), [d.stderr for d in started]
        agent_dir = Path(json.loads(started[0].stdout)["listening_at"]).parent.parent
        assert sorted(os.listdir(agent_dir)) == sorted([first, second])
    finally:
        for session in (first, second):
            ctx(world.root, "agent", "stop", agent, "--session", session)

    assert not agent_dir.exists(), f"left behind: {agent_dir}"


def test_stop_ends_a_running_terminal(world: World, terminal: dict[str, str]) -> None:
    pid = int(Path(terminal["listening_at"]).parent.joinpath("pid").read_text())
    # the process that owns the PTY is ctxterm, as ps and pgrep -x name it.
    assert Path(f"/proc/{pid}/comm").read_text() == "ctxterm\n"
    shown = ctx(world.root, "agent", "show", "coder", "--json")
    uid = json.loads(shown.stdout)["identity"]["uid"]
    running = {"session": terminal["session"], "uid": uid, "pid": pid}
    assert json.loads(shown.stdout)["terminals"] == [running], shown.stdout
    said = ctx(world.root, "agent", "show", "coder").stdout
    assert f"terminal: session {terminal['session']} (pid {pid})\n" in said, said
    stopped = ctx(world.root, "agent", "stop", "coder", "--session", terminal["session"])

    assert stopped.returncode == 0, stopped.stderr
    assert not Path(terminal["listening_at"]).exists()
    started, ended = lifecycle(world, terminal["session"])
    assert (started["type"], started["agent"], started["status"]) == (
        "terminal.started",
        "coder",
        "ok",
    )
    assert started["pid"] > 1
    assert (ended["type"], ended["reason"]) == ("terminal.stopped", "stop")
    again = ctx(world.root, "agent", "stop", "coder", "--session", terminal["session"])
    assert again.returncode == 1 and "ENOENT" in again.stderr
    shown = ctx(world.root, "agent", "show", "coder", "--json")
    assert json.loads(shown.stdout)["terminals"] == [], shown.stdout


def test_a_session_runs_once(world: World, terminal: dict[str, str]) -> None:
    twice = ctx(world.root, "agent", "start", "coder", "--session", terminal["session"])

    assert twice.returncode == 1 and "EEXIST" in twice.stderr


def test_names_of_the_longest_legal_length_make_a_terminal(world: World) -> None:
    """R-3 names may be 64 bytes: the run directory's socket is then longer than a UNIX
    socket address holds, and the terminal still starts, answers, and stops."""
    agent = "a" * 52 + uuid.uuid4().hex[:10]  # 62 bytes: its label, agent_t, is 64
    world.agent(agent, tools=["fs.stat"])
    session = "s" * 64
    started = ctx(world.root, "agent", "start", agent, "--session", session, "--json")
    try:
        assert started.returncode == 0, started.stderr
        listening_at = json.loads(started.stdout)["listening_at"]
        assert len(listening_at.encode()) > 107
        twice = ctx(world.root, "agent", "start", agent, "--session", session)
        assert twice.returncode == 1 and "EEXIST" in twice.stderr, twice.stderr
        watch = ["agent", "watch", agent, "--session", session]
        watcher = subprocess.Popen(
            [sys.executable, "-m", "cortexfs", "--storage", str(world.root), *watch],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            prompt = read_at_most(watcher, len(agent) + 2)  # the scrollback: tsh's prompt
        finally:
            watcher.kill()
            watcher.wait()
        assert prompt == f"{agent}$ ".encode()
    finally:
        stopped = ctx(world.root, "agent", "stop", agent, "--session", session)
    assert stopped.returncode == 0, stopped.stderr
    assert not Path(listening_at).parent.exists()


def read_at_most(process: subprocess.Popen[bytes], size: int, timeout: float = 20) -> bytes:
    """Up to ``size`` bytes of ``process``'s standard output: what came within ``timeout``."""
    deadline, seen = time.monotonic() + timeout, b""
    while len(seen) < size:
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([process.stdout], [], [], max(remaining, 0))
        if not ready:
            break
        data = os.read(process.stdout.fileno(), size - len(seen))
        if not data:
            break
        seen += data
    return seen


def test_watch_and_attach_need_a_running_terminal(world: World) -> None:
    world.agent("coder", tools=["fs.stat"])

    refused = ctx(world.root, "agent", "watch", "coder", "--session", "none")

    assert refused.returncode == 1 and "ENOENT" in refused.stderr


def test_stop_ends_the_tool_calls_still_running(world: World) -> None:
    """A-1: no tool call outlives its terminal: a stop interrupts it, its result is recorded
    before the terminal's end, and the tool writes nothing after the stop."""
    late = world.workspace / "late"  # a tool runs on the host: its host path
    program = f"#!/bin/sh\nsleep 6\necho late > {late}\n"
    with calling_in_terminal(world, "sleeper", "sh.late", program) as (facts, _):
        session = facts["session"]
        deadline = time.monotonic() + 20
        while not [e for e in world.events("sleeper", session) if e["type"] == "tool_call"]:
            assert time.monotonic() < deadline, "the call never started"
            time.sleep(0.1)
        stopped = ctx(world.root, "agent", "stop", "sleeper", "--session", session)

    assert stopped.returncode == 0, stopped.stderr
    time.sleep(8)  # past the moment the tool would have written
    assert not late.exists()
    events = world.events("sleeper", session)
    assert [e["type"] for e in events][-2:] == ["tool_call", "tool_result"]
    log = read_events(world.root / "agent" / "sleeper.d" / "log").events
    kinds = [e["type"] for e in log if e.get("session") == session]
    assert kinds[-1] == "terminal.stopped"


def test_a_hangup_ends_the_terminal_as_a_stop_does(world: World, terminal: dict[str, str]) -> None:
    pid = int(Path(terminal["listening_at"]).parent.joinpath("pid").read_text())

    os.kill(pid, signal.SIGHUP)

    deadline = time.monotonic() + 30
    while Path(terminal["listening_at"]).exists():
        assert time.monotonic() < deadline, "the terminal did not end on SIGHUP"
        time.sleep(0.1)
    assert lifecycle(world, terminal["session"])[-1]["type"] == "terminal.stopped"


def test_a_start_interrupted_while_its_terminal_starts_says_it_may_run_and_how_to_end_it(
    world: World,
) -> None:
    world.agent("coder", tools=["fs.stat"])
    session = fresh_session()
    argv = [sys.executable, "-m", "cortexfs", "agent", "start", "coder", "--session", session]
    start = subprocess.Popen(
        argv, env={**os.environ, "CTX_STORAGE": str(world.root)}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        # The terminal starts in a process of its own, whose view's mount process (named by
        # the session) is held stopped: the start waits for it, and cannot end meanwhile.
        deadline = time.monotonic() + 30
        while not (mounts := _processes_naming(session.encode(), b"mount")):
            assert time.monotonic() < deadline and start.poll() is None, start.communicate()
            time.sleep(0.005)
        for pid in mounts:
            os.kill(pid, signal.SIGSTOP)
        start.send_signal(signal.SIGINT)
        _, err = start.communicate(timeout=60)
        for pid in mounts:
            os.kill(pid, signal.SIGCONT)
    finally:
        stopped = ctx(world.root, "agent", "stop", "coder", "--session", session)

    assert start.returncode == 130, err
    assert err.lstrip("\n").startswith(  # click starts a new line after the ^C
        "ctx: EINTR: interrupted (SIGINT) before the command completed, while this was under "
        f"way, and may be done now: agent coder's terminal, session {session}, was starting "
    ), err
    assert f"'ctx agent stop coder --session {session}' ends it" in err, err
    assert stopped.returncode == 0, stopped.stderr  # it had started: the stop ended it


def _processes_naming(*words: bytes) -> list[int]:
    """The processes whose command line holds every word."""
    found = []
    for entry in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if entry.isdigit() and all(
                w in Path(f"/proc/{entry}/cmdline").read_bytes() for w in words
            ):
                found.append(int(entry))
    return found


def test_a_view_whose_mount_dies_is_reaped_logged_and_unmounted_at_the_stop(
    world: World, terminal: dict[str, str]
) -> None:
    run_dir = Path(terminal["listening_at"]).parent
    ctxterm = int(run_dir.joinpath("pid").read_text())
    children = Path(f"/proc/{ctxterm}/task/{ctxterm}/children").read_text().split()
    mounts = [int(p) for p in children if b"mount" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(mounts) == 1, children
    view = run_dir / "private" / "ctx"  # where the terminal mounts the agent's view
    assert os.path.ismount(view)

    os.kill(mounts[0], signal.SIGKILL)

    deadline = time.monotonic() + 20
    while not [e for e in lifecycle(world, terminal["session"]) if e["type"].endswith("view_lost")]:
        assert time.monotonic() < deadline, lifecycle(world, terminal["session"])
        time.sleep(0.1)
    lost = lifecycle(world, terminal["session"])[-1]
    assert (lost["type"], lost["pid"], lost["exit_status"]) == (
        "terminal.view_lost",
        mounts[0],
        137,
    )
    assert not Path(f"/proc/{mounts[0]}").exists()  # reaped, not a zombie under ctxterm
    with pytest.raises(OSError) as gone:
        os.listdir(view)
    assert gone.value.errno == errno.ENOTCONN
    client = Client(terminal["listening_at"], "attach")  # the terminal serves on, saying so
    client.expect(r"coder\$ ")
    client.type("fs.stat /workspace")
    said = client.expect(r"stop and start the terminal\r?\n")
    assert "fs.stat: not a tool on CTX_PATH: the CTX_PATH directory /ctx/" in said, said
    assert "cannot be reached (ENOTCONN: " in said, said
    client.close()

    stopped = ctx(world.root, "agent", "stop", "coder", "--session", terminal["session"])

    assert stopped.returncode == 0, stopped.stderr
    assert not view.exists() and not os.path.ismount(view)
    assert [e["type"] for e in lifecycle(world, terminal["session"])][-2:] == [
        "terminal.view_lost",
        "terminal.stopped",
    ]


def test_a_uid_that_may_not_watch_is_turned_away_at_once(terminal: dict[str, str]) -> None:
    """The socket is open to every uid; one that may not even watch holds none of the
    terminal's descriptors: it is refused before any mode line."""
    script = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "s.connect(sys.argv[1])\n"
        "s.settimeout(20)\n"
        "print(s.recv(4096).decode(), end='')\n"
        "print('EOF' if s.recv(4096) == b'' else 'open')\n"
    )
    nobody = pwd.getpwnam("nobody")
    answered = subprocess.run(
        [sys.executable, "-c", script, terminal["listening_at"]],
        capture_output=True,
        text=True,
        timeout=60,
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        extra_groups=[],
    )

    assert answered.stdout.startswith("ctxterm: EACCES: uid"), answered
    assert answered.stdout.endswith("EOF\n"), answered


def test_watch_and_attach_say_when_the_terminal_ends(
    world: World, terminal: dict[str, str]
) -> None:
    """Leaving because the terminal ended is said, not a silent exit 0; a detach is not."""
    command = [sys.executable, "-m", "cortexfs", "--storage", str(world.root), "agent"]
    session = ["coder", "--session", terminal["session"]]
    detached = subprocess.run(
        [*command, "attach", *session], input=b"\x1d", capture_output=True, timeout=60
    )
    watcher = subprocess.Popen(
        [*command, "watch", *session], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert read_at_most(watcher, 7) == b"coder$ "  # watching: the scrollback came
        attached = subprocess.run(
            [*command, "attach", *session], input=b"exit 3\r", capture_output=True, timeout=60
        )
        _, watched = watcher.communicate(timeout=60)
    finally:
        watcher.kill()
        watcher.wait()

    assert detached.returncode == 0 and b"closed the connection" not in detached.stderr
    ended = f"ctx: the terminal of coder in session {terminal['session']} closed the connection"
    for left in (attached.stderr, watched):
        assert ended.encode() in left, left
    assert attached.returncode == watcher.returncode == 0


def test_a_long_paste_through_attach_is_typed_whole(world: World, terminal: dict[str, str]) -> None:
    """More than the PTY takes at once: every line still reaches tsh, in order."""
    lines = [f"fs.stat /workspace/{n:03d}{'x' * 150}" for n in range(100)]
    command = ["agent", "attach", "coder", "--session", terminal["session"]]
    attached = subprocess.run(
        [sys.executable, "-m", "cortexfs", "--storage", str(world.root), *command],
        input="".join(line + "\r" for line in lines).encode(),
        capture_output=True,
        timeout=240,
    )

    assert attached.returncode == 0, attached.stderr

    # attach leaves once the terminal is quiet for a second; tsh may still be at work then
    def calls() -> list[dict[str, object]]:
        events = world.events("coder", terminal["session"])
        return [event for event in events if event["type"] == "tool_call"]

    deadline = time.monotonic() + 120
    while len(calls()) < 100:
        assert time.monotonic() < deadline, f"{len(calls())} of 100 lines ran"
        time.sleep(0.5)
    assert [call["argv"] for call in calls()] == [line.split()[1:] for line in lines]


def test_ctrl_c_interrupts_the_running_tool_not_the_terminal(world: World) -> None:
    program = "#!/bin/sh\nsleep 60\n"
    with calling_in_terminal(world, "sleeper", "sh.sleep", program) as (facts, client):
        session = facts["session"]
        time.sleep(2)
        began = time.monotonic()

        client.socket.sendall(b"\x03")  # Ctrl-C, through the PTY's line discipline

        client.expect(r"sh\.sleep\r?\n[\s\S]*sleeper\$ ")
        assert time.monotonic() - began < 20, "the tool was interrupted, not waited for"
        result = [e for e in world.events("sleeper", session) if e["type"] == "tool_result"][-1]
        assert result["exit_status"] == 130  # 128 + SIGINT
        client.type("help")
        client.expect(r"tsh runs CortexFS tools")  # the terminal goes on


def test_a_link_planted_in_the_session_does_not_redirect_the_socket(world: World) -> None:
    """The session directory belongs to the agent's uid; root never writes through its links."""
    world.agent("coder", tools=["fs.stat"])
    name = fresh_session()
    session = world.root / "home" / str(world.user.uid) / "agent" / "coder" / "session" / name
    session.mkdir(parents=True)
    elsewhere = world.scratch / "elsewhere"
    elsewhere.mkdir()
    (session / "terminal").symlink_to(elsewhere)

    started = ctx(world.root, "agent", "start", "coder", "--session", name)

    try:
        assert started.returncode == 1, started.stdout
        assert "ELOOP" in started.stderr
        assert os.listdir(elsewhere) == []
        leftovers = run_directory(world.root, world.user.uid, "coder", name)
        assert not leftovers.exists(), "a failed start cleans up after itself"
    finally:
        ctx(world.root, "agent", "stop", "coder", "--session", name)


def test_a_file_planted_as_the_sessions_terminal_directory_is_enotdir(world: World) -> None:
    """Not a link, so not ELOOP: the refusal says what is there, whose, and what to do."""
    world.agent("coder", tools=["fs.stat"])
    name = fresh_session()
    session = world.root / "home" / str(world.user.uid) / "agent" / "coder" / "session" / name
    session.mkdir(parents=True)
    (session / "terminal").write_text("")
    os.chown(session / "terminal", world.user.uid, world.user.gid)

    started = ctx(world.root, "agent", "start", "coder", "--session", name)

    try:
        assert started.returncode == 1, started.stdout
        assert started.stderr.startswith("ctx: ENOTDIR: the terminal did not start: "), (
            started.stderr
        )
        assert f"terminal is a regular file of uid {world.user.uid}" in started.stderr
        assert "remove it" in started.stderr and "never put through a link" not in started.stderr
        assert (session / "terminal").read_text() == ""
        assert not run_directory(world.root, world.user.uid, "coder", name).exists()
    finally:
        ctx(world.root, "agent", "stop", "coder", "--session", name)


def test_a_directory_where_the_terminal_socket_belongs_is_named_with_what_to_do(
    world: World,
) -> None:
    """Only root can put one there; start and stop both say what it is and how to settle it,
    and a failed start still removes the rest of what it made."""
    world.agent("coder", tools=["fs.stat"])
    name = fresh_session()
    run = run_directory(world.root, world.user.uid, "coder", name)
    (run / "main.sock").mkdir(parents=True)

    try:
        started = ctx(world.root, "agent", "start", "coder", "--session", name)
        stopped = ctx(world.root, "agent", "stop", "coder", "--session", name)

        for refused in (started, stopped):
            assert refused.returncode == 1, refused.stdout
            assert refused.stderr.startswith(f"ctx: EISDIR: {run}/main.sock is a directory, "), (
                refused.stderr
            )
            assert f"rmdir {run}/main.sock" in refused.stderr
        assert os.listdir(run) == ["main.sock"]  # nothing else of the start is left
    finally:
        (run / "main.sock").rmdir()
        ctx(world.root, "agent", "stop", "coder", "--session", name)
    assert not run.exists()


def tsh_process(session: str, timeout: float = 20) -> int:
    """The pid of the tsh serving ``session``, found by the environment ctxterm gave it (and
    not bubblewrap's, which was given the same)."""
    marker = f"CTX_SESSION={session}".encode()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                environment = Path("/proc", entry, "environ").read_bytes().split(b"\0")
                command = Path("/proc", entry, "cmdline").read_bytes()
            except OSError:
                continue
            program = os.path.basename(command.split(b"\0")[0])
            if marker in environment and b"/ctx/bin/tsh" in command and program != b"bwrap":
                return int(entry)
        time.sleep(0.1)
    raise AssertionError(f"no tsh for session {session}")


@pytest.mark.parametrize("may_connect", [False, True])
def test_the_terminal_has_a_network_only_with_the_grant(world: World, may_connect: bool) -> None:
    world.agent("coder", tools=["fs.stat"])
    if may_connect:
        with open(world.root / "agent" / "coder.d" / "policy", "a") as policy:
            policy.write("allow coder_t network:default connect\n")
    session = fresh_session()
    started = ctx(world.root, "agent", "start", "coder", "--session", session)
    assert started.returncode == 0, started.stderr
    try:
        tsh = tsh_process(session)

        same_network = os.readlink(f"/proc/{tsh}/ns/net") == os.readlink("/proc/self/ns/net")
        interfaces = [
            line.split(":")[0].strip()
            for line in Path(f"/proc/{tsh}/net/dev").read_text().splitlines()[2:]
        ]

        assert same_network is may_connect
        assert (interfaces == ["lo"]) is not may_connect
    finally:
        ctx(world.root, "agent", "stop", "coder", "--session", session)


@pytest.fixture
def project(traversable_tmp: Path, world: World) -> Path:
    """A directory a person starts a terminal from, holding a file, the agent's to write."""
    directory = traversable_tmp / "project"
    directory.mkdir()
    (directory / "notes.txt").write_text("found in the project\n")
    os.chown(directory, world.user.uid, world.user.gid)
    return directory


def start_in(world: World, directory: Path, agent: str, session: str, *options: str) -> dict:
    """``ctx agent start`` run from ``directory``, as a person at a shell there would."""
    started = subprocess.run(
        [sys.executable, "-m", "cortexfs", "agent", "start", agent, "--session", session,
         "--json", *options],
        cwd=directory, capture_output=True, text=True, timeout=60,
        env={**os.environ, "CTX_STORAGE": str(world.root)},
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    return json.loads(started.stdout)


def unmounted_agent(world: World, name: str = "coder") -> None:
    """An agent whose mount control has no /workspace (only the /ctx view)."""
    world.agent(name, tools=["fs.read", "fs.write"], mounts=[])
    for tool in ("fs.read", "fs.write"):
        world.allow_tool(tool, label=f"{name}_t")


def test_the_current_directory_is_the_terminals_workspace(world: World, project: Path) -> None:
    unmounted_agent(world)
    session = fresh_session()
    facts = start_in(world, project, "coder", session)
    try:
        tsh = tsh_process(session)
        client = Client(facts["listening_at"], "attach")
        client.expect(r"coder\$ ")

        client.type("fs.read notes.txt")
        client.expect(r"found in the project[\s\S]*coder\$ ")
        client.seen = b""
        client.type("fs.read /workspace/notes.txt")
        client.expect(r"found in the project[\s\S]*coder\$ ")
        client.type("""fs.write '{"path": "made.txt", "content": "written by the agent"}'""")
        client.expect(r"made\.txt[\s\S]*coder\$ ")

        assert facts["workspace"] == str(project)
        assert os.readlink(f"/proc/{tsh}/cwd") == "/workspace"
        assert os.stat(f"/proc/{tsh}/cwd").st_ino == project.stat().st_ino
        made = project / "made.txt"
        assert made.read_text() == "written by the agent"
        assert made.stat().st_uid == world.user.uid, "written as the agent's uid"
        results = [e for e in world.events("coder", session) if e["type"] == "tool_result"]
        assert [e["status"] for e in results] == ["ok", "ok", "ok"]
        started = lifecycle(world, session)[0]
        assert started["workspace"] == str(project)
        mounts = json.loads((world.root / "agent/coder.d/mount").read_text())
        assert [target for _, target, _ in mounts] == ["/ctx"], "the grant is not persisted"
        client.close()
    finally:
        ctx(world.root, "agent", "stop", "coder", "--session", session)


def test_workspace_option_no_workspace_and_the_agents_own_workspace(
    world: World, project: Path
) -> None:
    unmounted_agent(world)
    world.agent("mounted", tools=["fs.read"])  # its mount control has /workspace
    world.allow_tool("fs.read", label="mounted_t")
    (world.workspace / "notes.txt").write_text("the agent's own workspace\n")
    chosen, bare, own = fresh_session(), fresh_session(), fresh_session()
    try:
        by_option = start_in(world, world.scratch, "coder", chosen, "--workspace", str(project))
        without = start_in(world, project, "coder", bare, "--no-workspace")
        started = subprocess.run(
            [sys.executable, "-m", "cortexfs", "agent", "start", "mounted", "--session", own,
             "--json", "--workspace", str(project)],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "CTX_STORAGE": str(world.root)},
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        mounted = json.loads(started.stdout)

        assert by_option["workspace"] == str(project)
        assert os.stat(f"/proc/{tsh_process(chosen)}/cwd").st_ino == project.stat().st_ino
        assert without["workspace"] is None
        assert os.readlink(f"/proc/{tsh_process(bare)}/cwd") == "/"
        client = Client(without["listening_at"], "attach")
        client.expect(r"coder\$ ")
        client.type("fs.read /workspace/notes.txt")
        client.expect(r"outside every mount[\s\S]*coder\$ ")
        client.close()
        # the agent's own /workspace wins over --workspace, and the starter is told so
        assert mounted["workspace"] == os.path.realpath(world.workspace)
        assert f"ctx: warning: {os.path.realpath(project)} is not mounted at /workspace" in (
            started.stderr
        )
        assert os.stat(f"/proc/{tsh_process(own)}/cwd").st_ino == world.workspace.stat().st_ino
        client = Client(mounted["listening_at"], "attach")
        client.expect(r"mounted\$ ")
        client.type("fs.read notes.txt")
        client.expect(r"the agent's own workspace[\s\S]*mounted\$ ")
        client.close()
    finally:
        ctx(world.root, "agent", "stop", "coder", "--session", chosen)
        ctx(world.root, "agent", "stop", "coder", "--session", bare)
        ctx(world.root, "agent", "stop", "mounted", "--session", own)


def test_a_workspace_with_storage_objects_past_the_view_is_warned_of(
    world: World, project: Path
) -> None:
    """Started in the storage root (or above it), inside it, or on a CortexFS mount of it, the
    default /workspace shows the agent storage objects past its view of /ctx and its policy:
    the start says so, and how to grant less."""
    unmounted_agent(world)
    sessions = [fresh_session() for _ in range(4)]

    def start(directory: Path, session: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cortexfs", "agent", "start", "coder", "--session", session],
            cwd=directory, capture_output=True, text=True, timeout=60,
            env={**os.environ, "CTX_STORAGE": str(world.root)},
        )  # fmt: skip

    served = world.scratch / "served"
    try:
        above = start(world.root, sessions[0])
        inside = start(world.root / "shared", sessions[1])
        with mounted(world.root, served):
            on_mount = start(served / "shared", sessions[2])
        quiet = start(project, sessions[3])

        for warned in (above, inside, on_mount):
            assert warned.returncode == 0, warned.stderr
            assert warned.stderr.startswith("ctx: warning: /workspace is "), warned.stderr
            assert "past its view of /ctx and its policy" in warned.stderr
            assert "--no-workspace" in warned.stderr
        assert "which holds the storage root" in above.stderr
        assert f"/shared, inside the storage root {world.root}" in inside.stderr
        assert f"/shared, on the CortexFS mount {served}:" in on_mount.stderr
        assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    finally:
        for session in sessions:
            ctx(world.root, "agent", "stop", "coder", "--session", session)


def test_workspace_and_no_workspace_exclude_each_other(world: World, project: Path) -> None:
    unmounted_agent(world)

    both = ctx(world.root, "agent", "start", "coder", "--workspace", str(project), "--no-workspace")

    assert both.returncode == 2 and "EINVAL" in both.stderr, both.stderr


def test_a_group_named_like_an_agents_gid_refuses_the_start(world: World) -> None:
    """setpriv, which switches tsh to the agent's ids in the sandbox, reads a group name
    before a number: with a group named "4243" whose gid is another, the terminal of an agent
    of gid 4243 would run with that other gid, so it is not started, and says why."""
    world.agent("grouped", tools=["fs.stat"], groups=[4243])
    name = fresh_session()

    with group_named("4243") as stand_in:
        started = ctx(world.root, "agent", "start", "grouped", "--session", name)

    assert started.returncode == 1, started.stdout
    assert started.stderr.startswith("ctx: EINVAL: the terminal of grouped cannot be started "), (
        started.stderr
    )
    assert f"the group named 4243 is gid {stand_in}, not 4243" in started.stderr
    assert not run_directory(world.root, world.user.uid, "grouped", name).exists()
    after = ctx(world.root, "agent", "start", "grouped", "--session", name)
    try:
        assert after.returncode == 0, after.stderr
    finally:
        ctx(world.root, "agent", "stop", "grouped", "--session", name)
