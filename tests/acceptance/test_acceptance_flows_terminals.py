"""End-to-end flows of an operator living with an agent's terminal (SPEC §7 H-1..H-5, §8 A-1,
A-2, A-5, §4 S-2): ``ctx agent start`` from a workspace, several clients on the terminal socket
at once (raw ``watch``/``attach`` clients and ``ctx agent watch``/``attach`` on a pty), tool
calls typed through one and seen by all, clients that vanish or stop reading, detach and
reattach, an interactive shell tool, ``tsh.config`` changed under a running terminal, and the
end of it all (``exit`` in tsh or ``ctx agent stop``) checked in ``/proc``.

The single claims are checked one by one in test_acceptance_terminal.py, test_acceptance_tsh.py
and tests/agents/; here they are chained as a user runs them.  Black-box: the installed ``ctx``,
real processes, PTYs, sockets, FUSE views and bubblewrap sandboxes."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    clean_env,
    scratch_top,
    wait_for,
)
from tests.acceptance.terminalcli import CoderHost, Raw, Term, coder_host

SCRATCH = scratch_top(__file__)
NOTE = "notes kept in the operator's workspace\n"
BIG_END = "END-OF-THE-BIG-FILE"
PROMPT = "coder$ "
S2_KEYS = ["ts", "type", "agent", "session", "object", "status"]
TOOLS = ["fs.read", "fs.list", "fs.write", "tsh.config", "agent.update", "bash"]
DETACH = b"\x1d"  # Ctrl-]

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)


# ---------------------------------------------------------------------------------- the host


@pytest.fixture
def host(_template: Path) -> Iterator[CoderHost]:
    """Agent ``coder`` (uid ``nobody``) allowed :data:`TOOLS` in both policies, and the
    operator's workspace ``ws`` holding a note and a file of about 840 KB that ends in
    :data:`BIG_END`."""
    lines = "".join(f"line {n:06d} of a long listing\n" for n in range(30000))
    files = {"notes.txt": NOTE, "big.txt": lines + BIG_END + "\n"}
    with coder_host(_template, SCRATCH, TOOLS, files) as host:
        program = "#!/bin/sh\nexec /bin/bash --norc --noprofile -i\n"  # H-5: a shell is a tool
        host.install("bash", program, side_effects=True)
        for tool in TOOLS:
            host.grant_in_tool(tool)
        yield host


# ------------------------------------------------------------------------------- the clients


class OnPty:
    """``ctx agent watch|attach`` run on a pty of its own (``pty.fork``: its controlling
    terminal), as an operator runs it; what it prints is collected in a thread."""

    def __init__(self, host: CoderHost, verb: str, session: str) -> None:
        argv = [*CTX_ARGV, "agent", verb, "coder", "--session", session]
        env = {**host.env, "TERM": "xterm"}
        pid, fd = pty.fork()
        if pid == 0:  # the child: become ctx at once
            try:
                os.chdir(host.top)
                os.execve(argv[0], argv, env)
            finally:
                os._exit(127)
        self.pid, self.fd = pid, fd
        self.data = b""
        self.status: int | None = None
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.data += chunk

    def shows(self, text: str, count: int = 1, seconds: float = 20) -> bool:
        return wait_for(lambda: self.data.count(text.encode()) >= count, seconds)

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait(self, seconds: float = 20) -> int | None:
        """Its exit status once it has ended on its own, or None."""

        def ended() -> bool:
            if self.status is None:
                pid, raw = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.status = os.waitstatus_to_exitcode(raw)
            return self.status is not None

        wait_for(ended, seconds)
        return self.status

    def kill(self) -> None:
        """SIGKILL to its whole process group (it leads a session of its own)."""
        if self.status is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGKILL)
            _, raw = os.waitpid(self.pid, 0)
            self.status = os.waitstatus_to_exitcode(raw)
        self.reader.join(timeout=5)
        with contextlib.suppress(OSError):
            os.close(self.fd)

    def text(self) -> str:
        return self.data.decode("utf-8", "replace").replace("\r\n", "\n")


@contextlib.contextmanager
def closing_all() -> Iterator[list]:
    """Clients opened in the block, each closed (a pty client killed) on the way out."""
    opened: list = []
    try:
        yield opened
    finally:
        for thing in reversed(opened):
            if isinstance(thing, OnPty):
                thing.kill()
            elif isinstance(thing, subprocess.Popen):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(thing.pid, signal.SIGKILL)
                thing.wait()
                if thing.stdout:
                    thing.stdout.close()
            else:
                thing.close()


# ------------------------------------------------------------------------------ what is left


def terminal_processes(host: CoderHost, term: Term) -> list[str]:
    """The processes of the terminal seen in /proc: any whose working directory is the
    workspace (ctxterm, its view's mount process, bwrap, tsh and the tools all start there)
    or whose command line names the terminal's runtime directory."""
    wanted = host.ws.stat()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            here = os.stat(f"/proc/{entry}/cwd")
            if (here.st_dev, here.st_ino) == (wanted.st_dev, wanted.st_ino) or str(
                term.rundir
            ).encode() in cmdline:
                found.append(f"{entry}: {cmdline.decode('utf-8', 'replace')}")
    return found


def processes_running(needle: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").strip() == (
                    needle.encode()
                ):
                    pids.append(int(entry))
    return pids


def mounts_under(directory: Path) -> list[str]:
    return [
        line
        for line in Path("/proc/self/mounts").read_text().splitlines()
        if str(directory) in line
    ]


def refuses_connections(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except (FileNotFoundError, ConnectionRefusedError):
            return True
    return False


def assert_ended_cleanly(host: CoderHost, term: Term) -> None:
    """Nothing of the terminal is left: no process, no view mounted, its sockets and the
    session's link gone, nobody answering where it listened."""
    assert wait_for(lambda: not terminal_processes(host, term), 15), terminal_processes(host, term)
    assert mounts_under(term.rundir) == []
    assert not os.path.lexists(term.link)
    assert not os.path.lexists(term.listening_at)
    assert refuses_connections(term.listening_at)
    alias = Path(f"/run/cortexfs/terminal/{host.uid}/coder/{term.session}/main.sock")
    assert not os.path.lexists(alias)


def assert_s2_shape(events: list[dict], session: str) -> None:
    for event in events:
        assert list(event)[:6] == S2_KEYS, event
        assert (event["agent"], event["session"]) == ("coder", session), event


# ------------------------------------------------------------------------------------ the flows


def test_one_terminal_many_clients_a_stalled_and_two_vanished_watchers_stall_nothing(
    host: CoderHost,
) -> None:
    """A-1, A-2, H-1, S-2: started in the workspace, the terminal writes there as the agent;
    what the operator's attach client types runs once and every watcher sees it, while one
    watcher never reads (its socket fills) and two others vanish mid-stream (a raw client
    closed, ``ctx agent watch`` SIGKILLed); the rest get the whole output and keep being served
    promptly, a host command is refused, and the session records each call."""
    term = host.start()
    with closing_all() as opened:
        watcher = Raw(term.listening_at, b"watch\n")
        stalled = Raw(term.listening_at, b"watch\n", read=False, rcvbuf=4096)
        vanishing = Raw(term.listening_at, b"watch\n")
        typist = Raw(term.listening_at, b"attach\n")
        opened += [watcher, stalled, vanishing, typist]
        on_pty = OnPty(host, "watch", term.session)
        opened.append(on_pty)
        assert typist.shows(PROMPT) and watcher.shows(PROMPT) and on_pty.shows(PROMPT)
        assert terminal_processes(host, term)  # the probe sees the terminal while it runs

        payload = {"path": "from-terminal.txt", "content": "written in /workspace\n"}
        typist.type(f"fs.write '{json.dumps(payload)}'")
        assert watcher.shows("wrote 22 bytes to"), watcher.text()
        written = host.ws / "from-terminal.txt"
        assert written.read_text() == payload["content"]
        assert written.stat().st_uid == host.uid  # written as the agent, in the caller's cwd

        began = time.monotonic()
        typist.type("fs.read big.txt")
        assert vanishing.shows("line 005000") and on_pty.shows("line 005000")
        vanishing.close()  # gone in the middle of the stream
        on_pty.kill()
        for client in (typist, watcher):
            assert client.shows(BIG_END, seconds=15), client.text()[-500:]
        assert time.monotonic() - began < 15

        began = time.monotonic()
        typist.type("fs.list")
        assert watcher.shows("from-terminal.txt\r\n"), watcher.text()[-500:]
        typist.type("cat /etc/shadow")
        assert watcher.shows("cat: not a tool on CTX_PATH"), watcher.text()[-500:]
        assert typist.shows("cat: not a tool on CTX_PATH")
        assert time.monotonic() - began < 10, "the terminal stalled on its vanished clients"
        assert not watcher.eof.is_set() and not typist.eof.is_set()
        assert watcher.count(BIG_END) == 1  # each call ran once

    assert wait_for(lambda: len(host.calls(term.session, "fs.list")) == 2)
    events = host.events(term.session)
    assert_s2_shape(events, term.session)
    for tool, argv in (
        ("fs.write", [json.dumps(payload)]),
        ("fs.read", ["big.txt"]),
        ("fs.list", []),
    ):
        calls = host.calls(term.session, tool)
        assert [(e["type"], e["status"]) for e in calls] == [
            ("tool_call", "ok"),
            ("tool_result", "ok"),
        ], calls
        assert calls[0]["mode"] == "terminal" and calls[0]["argv"] == argv, calls
        assert calls[1]["exit_status"] == 0 and calls[0]["call"] == calls[1]["call"], calls
    assert not [e for e in events if e.get("object", "").endswith("/cat")], events


def test_attach_on_a_pty_detaches_reattaches_and_exit_in_tsh_ends_everything(
    host: CoderHost,
) -> None:
    """A-2, A-5, A-1: ``ctx agent attach`` on a pty types a call and the agent's own prompt
    update; Ctrl-] leaves with exit 0 while the terminal and a watcher go on; a second attach
    first shows what came before (the scrollback), types on, and ``exit`` in tsh ends the
    terminal: both clients are told, nothing of it is left in /proc or the mount table, and
    the agent's log and the session hold the whole story."""
    term = host.start()
    system_md = host.storage / "agent" / "coder.d" / "system.md"
    prompt = "Answer the operator in one paragraph.\n"
    with closing_all() as opened:
        watcher = Raw(term.listening_at, b"watch\n")
        first = OnPty(host, "attach", term.session)
        opened += [watcher, first]
        assert first.shows(PROMPT), first.text()
        first.send(b"fs.read notes.txt\r")
        assert first.shows(NOTE.strip()) and watcher.shows(NOTE.strip()), first.text()
        update = json.dumps({"control": "system.md", "content": prompt})
        first.send(f"agent.update '{update}'\r".encode())
        assert wait_for(lambda: len(host.calls(term.session, "agent.update")) == 2)
        first.send(DETACH)
        assert first.wait() == 0, first.text()
        assert "closed the connection" not in first.text()
        assert system_md.read_text() == prompt

        time.sleep(0.5)  # the terminal lives on without it
        assert not watcher.eof.is_set() and os.path.samefile(term.link, term.listening_at)
        second = OnPty(host, "attach", term.session)
        opened.append(second)
        assert second.shows(NOTE.strip()), second.text()  # the scrollback, before any typing
        second.send(b"which fs.read\r")
        assert second.shows("/ctx/tool/fs.read") and watcher.shows("/ctx/tool/fs.read")
        second.send(b"exit\r")
        assert second.wait() == 0, second.text()
        assert "closed the connection" in second.text(), second.text()
        assert watcher.eof.wait(15), "the watcher was not let go"
    assert_ended_cleanly(host, term)

    kinds = [e["type"] for e in host.lifecycle(term.session)]
    assert kinds == ["terminal.started", "agent.updated", "terminal.stopped"], kinds
    for tool in ("fs.read", "agent.update"):
        calls = host.calls(term.session, tool)
        assert [(e["type"], e["status"]) for e in calls] == [
            ("tool_call", "ok"),
            ("tool_result", "ok"),
        ], (tool, calls)
    assert_s2_shape(host.events(term.session), term.session)


def test_an_interactive_shell_returns_to_tsh_with_its_status_while_watched(host: CoderHost) -> None:
    """H-5, S-2, A-2: ``bash`` is an ordinary tool: typed through the attach client it runs on
    the terminal (watchers see what it prints), ``exit 3`` returns to tsh, which goes on
    running tools; the session records the shell's call with its exit status 3.  A
    ``ctx agent watch`` left with Ctrl-C leaves the terminal running."""
    term = host.start()
    with closing_all() as opened:
        typist = Raw(term.listening_at, b"attach\n")
        watcher = Raw(term.listening_at, b"watch\n")
        on_pty = OnPty(host, "watch", term.session)
        opened += [typist, watcher, on_pty]
        assert typist.shows(PROMPT) and on_pty.shows(PROMPT)
        typist.type("bash")
        assert typist.shows("bash-"), typist.text()
        typist.type("echo inside-$((6*7)) in $PWD as $(id -u)")
        shown = f"inside-42 in {host.ws} as {host.uid}"  # a tool runs on the host, as the agent
        for client in (typist, watcher, on_pty):
            assert client.shows(shown), client.text()[-500:]
        typist.type("exit 3")
        assert typist.shows(PROMPT, count=2), typist.text()[-500:]
        typist.type("fs.read notes.txt")
        assert watcher.shows(NOTE.strip()) and on_pty.shows(NOTE.strip())

        on_pty.send(b"\x03")  # Ctrl-C stops watching
        assert on_pty.wait() is not None, on_pty.text()
        typist.type("which bash")
        assert watcher.shows("/ctx/tool/bash"), watcher.text()[-500:]
        assert not typist.eof.is_set()

    assert wait_for(lambda: len(host.calls(term.session, "fs.read")) == 2)
    shell = host.calls(term.session, "bash")
    assert [(e["type"], e["status"]) for e in shell] == [
        ("tool_call", "ok"),
        ("tool_result", "error"),
    ], shell
    assert shell[1]["exit_status"] == 3 and shell[1]["stage"] == "exit", shell
    assert shell[1]["errno"] is None, shell
    assert_s2_shape(host.events(term.session), term.session)


def _shell_with_work(host: CoderHost, term: Term, opened: list) -> tuple[Raw, OnPty, list[str]]:
    """An operator's attach client that started ``bash`` with a background job and a
    foreground one still running (their command lines returned), and a ``ctx agent watch``
    on a pty."""
    first = 100000 + uuid.uuid4().int % 800000  # no other test's sleep has these
    jobs = [f"sleep {first}", f"sleep {first + 1}"]
    typist = Raw(term.listening_at, b"attach\n")
    on_pty = OnPty(host, "watch", term.session)
    opened += [typist, on_pty]
    assert typist.shows(PROMPT)
    typist.type("bash")
    assert typist.shows("bash-")
    typist.type(f"{jobs[0]} &")
    typist.type(jobs[1])
    assert wait_for(lambda: all(map(processes_running, jobs))), jobs
    assert wait_for(lambda: len(host.calls(term.session, "bash")) == 1)
    return typist, on_pty, jobs


def test_stop_while_a_shell_tool_works_ends_everything_cleanly(host: CoderHost) -> None:
    """A-1, A-2, H-5: ``ctx agent stop`` while the attached operator's ``bash`` runs a command
    and a background job ends all of it: the stop answers in its JSON shape, every client is
    let go (``ctx agent watch`` with exit 0, saying the terminal closed the connection), no
    process of the terminal or of the shell's work is left, the view is unmounted and the
    socket is gone."""
    term = host.start()
    with closing_all() as opened:
        typist, on_pty, jobs = _shell_with_work(host, term, opened)
        pid = int((term.rundir / "pid").read_text())
        stopped = host.ctx("agent", "stop", "coder", "--session", term.session, "--json")
        assert stopped.rc == 0, stopped
        assert stopped.json() == {"agent": "coder", "session": term.session, "pid": pid}
        assert typist.eof.wait(15)
        assert on_pty.wait() == 0, on_pty.text()
        assert "closed the connection" in on_pty.text(), on_pty.text()
    assert_ended_cleanly(host, term)
    assert wait_for(lambda: not any(map(processes_running, jobs)), 10), jobs
    assert [e["type"] for e in host.lifecycle(term.session)] == [
        "terminal.started",
        "terminal.stopped",
    ]
    again = host.ctx("agent", "stop", "coder", "--session", term.session)
    assert again.rc == 1 and "ENOENT" in again.err, again


def test_a_shell_call_cut_short_by_stop_still_gets_its_tool_result(host: CoderHost) -> None:
    """S-2 and docs/sessions.md: "A recorded tool_call always gets its tool_result, whatever
    goes wrong after it": the ``bash`` call a ``ctx agent stop`` interrupts (and kills two
    seconds later, as the docs say) is in the session with its result."""
    term = host.start()
    with closing_all() as opened:
        _shell_with_work(host, term, opened)
        stopped = host.ctx("agent", "stop", "coder", "--session", term.session)
        assert stopped.rc == 0, stopped
    assert_ended_cleanly(host, term)
    assert wait_for(lambda: len(host.calls(term.session, "bash")) == 2, 3), host.calls(
        term.session, "bash"
    )
    result = host.calls(term.session, "bash")[1]
    assert result["type"] == "tool_result" and result["status"] == "error", result


def test_tsh_config_changed_under_a_running_terminal_applies_at_its_next_start(
    host: CoderHost,
) -> None:
    """H-4, H-3, S-1: the host lowers ``max_loaded_tools`` with ``ctx tool tsh.config`` while
    the terminal runs: ``tsh.config`` typed there shows the new file at once, but the running
    tsh keeps the settings it read when it started; the same session started again obeys the
    new bound (the least recently used tool is unloaded), and both runs' calls land in that
    one session."""
    term = host.start()
    with closing_all() as opened:
        typist = Raw(term.listening_at, b"attach\n")
        opened.append(typist)
        assert typist.shows(PROMPT)
        typist.answer("load fs.read fs.list")

        tool_env = clean_env(CTX_STORAGE=str(host.storage), CTX_PATH=str(host.storage / "tool"))
        tuned = host.ctx("tool", "tsh.config", "max_loaded_tools=1", env=tool_env)
        assert tuned.rc == 0, tuned
        shown = typist.answer("tsh.config")
        assert "max_loaded_tools=1\n" in shown, shown
        typist.answer("load fs.write agent.update")
        listed = typist.answer("loaded")
        names = {line.split(":")[0] for line in listed.splitlines()}
        assert names == {"fs.read", "fs.list", "tsh.config", "fs.write", "agent.update"}, listed
        assert "max_loaded_tools reached" not in typist.text(), typist.text()
    stopped = host.ctx("agent", "stop", "coder", "--session", term.session)
    assert stopped.rc == 0, stopped
    assert_ended_cleanly(host, term)

    term = host.start(term.session)
    with closing_all() as opened:
        typist = Raw(term.listening_at, b"attach\n")
        opened.append(typist)
        assert typist.shows(PROMPT)
        shown = typist.answer("load fs.read fs.list")
        assert "tsh: unloaded fs.read (max_loaded_tools reached)" in shown, shown
        ran = typist.answer("fs.read notes.txt")  # running a tool loads it
        assert ran == "tsh: unloaded fs.list (max_loaded_tools reached)\n" + NOTE, ran
        listed = typist.answer("loaded")
        assert [line.split(":")[0] for line in listed.splitlines()] == ["fs.read"], listed
    results = [e for e in host.calls(term.session, "tsh.config") if e["type"] == "tool_result"]
    assert [e["status"] for e in results] == ["ok"], results
    assert wait_for(lambda: len(host.calls(term.session, "fs.read")) == 2)
    kinds = [e["type"] for e in host.lifecycle(term.session)]
    assert kinds == ["terminal.started", "terminal.stopped", "terminal.started"], kinds


# A process of the agent's uid: opens N watch connections that never read, says so, and
# sleeps until killed.
HOLDER = r"""
import socket, sys, time
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(sys.argv[1])
    s.sendall(b"watch\n")
    held.append(s)
print("holding", flush=True)
time.sleep(120)
"""


def test_watchers_of_the_agent_that_never_read_do_not_freeze_the_operator(host: CoderHost) -> None:
    """A-2 (docs: the agent's own uid may watch; "nothing the agent runs can keep its operator
    out"): a process running as the agent opens several watch connections and never reads
    from them; the operator's attached client still gets its answers promptly."""
    python = Path("/usr/bin/python3")
    if not python.exists():
        pytest.skip("no /usr/bin/python3 for a client running as the agent's uid")
    term = host.start()
    with closing_all() as opened:
        typist = Raw(term.listening_at, b"attach\n")
        opened.append(typist)
        assert typist.shows(PROMPT)
        holder = subprocess.Popen(
            [str(python), "-c", HOLDER, str(term.listening_at), "8"],
            stdout=subprocess.PIPE, user=host.uid, group=host.gid, extra_groups=[],
            start_new_session=True, cwd="/",
        )  # fmt: skip
        opened.append(holder)
        assert holder.stdout.readline() == b"holding\n"
        time.sleep(0.5)  # the terminal has taken their mode lines
        began = time.monotonic()
        typist.type("fs.read big.txt")  # 840 KB: more than their sockets hold
        shown = typist.shows(BIG_END, seconds=8)
        took = time.monotonic() - began
        assert shown and took < 5, f"the operator waited {took:.1f} s for 840 KB"
