"""Hostile local clients of the sockets around an agent terminal (SPEC §8 A-1, A-2, A-5, §7
H-1, H-2; docs/tools.md "the terminal socket", "the run socket" and the run capability):
the terminal socket ``main.sock`` is fed mode lines holding NUL and control bytes, look-alike
letters, a megabyte of line, half a line and a half-closed connection; it is flooded by root,
by a stranger uid and by slow-loris connections of the agent's own uid; a watcher of the
agent's uid types control keys while a tool runs; a watcher trickles output a mebibyte behind;
the agent's uid plants decoy links and directories where the session's A-2 link goes, and owns
a level of the runtime directory; a process of the agent's uid goes for the run socket through
every process of the sandbox and forges the credentials of an ``agent.update`` tool on a
stolen run capability; ``agent.update`` names other controls, carries escape bytes, or goes
past 8 KiB by a byte or by tens of KiB.  After each attack the operator's attached client is
still answered promptly, other clients see the same bytes, the terminal holds no descriptor
more than before, nothing outside the session is followed or removed, refused calls change no
file and leave tool_call/tool_result pairs, and a start that is refused leaves nothing
running."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import select
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, closing_all, read_jsonl, scratch_top, wait_for
from tests.acceptance.terminalcli import CoderHost, Raw, Term, coder_host, tsh_of
from tests.acceptance.test_acceptance_flows_self_update import ended, pending_update
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
PROMPT = b"coder$ "
PYTHON = "/usr/bin/python3"  # for the clients that run as other uids
RUN_BASE = Path("/run/cortexfs/terminal")
REFUSED_LINE = b"ctxterm: expected 'watch' or 'attach' on the first line\n"
TOOLS = ["fs.read", "slow", "flood", "agent.update"]
FLOOD_LINES = 300_000  # about 2.4 MB through the PTY: more than a client may fall behind

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or shutil.which("bwrap") is None
    or not os.path.exists("/dev/fuse")
    or not os.access(PYTHON, os.X_OK),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse; clients of other uids "
    "need /usr/bin/python3",
)


# ---------------------------------------------------------------------------------- the host


SLOW = """#!/bin/sh
echo SLOW-START pid=$$
i=0
while [ ! -e go ] && [ $i -lt 300 ]; do /bin/sleep 0.05; i=$((i+1)); done
rm -f go
echo SLOW-DONE
"""


@pytest.fixture(scope="module")
def coder(_template: Path) -> Iterator[CoderHost]:
    """Agent ``coder`` (uid ``nobody``) allowed :data:`TOOLS` in both policies: ``slow``
    (prints SLOW-START and its pid, waits for a file ``go`` in its working directory, the
    workspace, then prints SLOW-DONE) and ``flood`` (prints :data:`FLOOD_LINES`
    numbered lines, then FLOOD-END).  Its workspace holds ``a.txt`` and ``b.txt``."""
    files = {f"{name}.txt": f"content of {name}-{name}\n" for name in "ab"}
    with coder_host(_template, SCRATCH, TOOLS, files) as host:
        host.install("slow", SLOW)
        host.install("flood", f"#!/bin/sh\n/usr/bin/seq 1 {FLOOD_LINES}\necho FLOOD-END\n")
        for tool in TOOLS:
            host.grant_in_tool(tool)
        yield host


@pytest.fixture
def host(coder: CoderHost) -> Iterator[CoderHost]:
    """:func:`coder`, its terminals started by the test stopped at the test's end."""
    yield coder
    for session in coder.started:
        coder.ctx("agent", "stop", "coder", "--session", session)
    coder.started.clear()
    with contextlib.suppress(FileNotFoundError):
        (coder.ws / "go").unlink()


# What a reader process of :class:`Apart` runs: everything from the socket at its descriptor
# argv[1] into the file argv[2], until the end of the connection.
_READER = """
import os, sys
fd, out = int(sys.argv[1]), os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND)
try:
    os.nice(-10)  # root: ahead of the load of a suite running beside it
except OSError:
    pass
while chunk := os.read(fd, 1 << 20):
    os.write(out, chunk)
"""


class Apart(Raw):
    """:class:`Raw` whose reading is done by a process of its own, into a file: a client
    that must keep up with megabytes of output.  A reading thread shares this process's
    interpreter lock with every other client of a test, and on a loaded machine can fall
    the 1 MiB behind for which the terminal lets any client go (docs/tools.md), as a
    watcher starved of the CPU would; what it types is sent from here."""

    def __init__(self, path: Path, first: bytes = b"") -> None:
        super().__init__(path, first, read=False)
        fd, name = tempfile.mkstemp(dir=SCRATCH, prefix="watcher-")
        os.close(fd)
        self.kept = Path(name)
        self.reader_process = subprocess.Popen(
            [sys.executable, "-c", _READER, str(self.sock.fileno()), name],
            pass_fds=(self.sock.fileno(),),
        )
        self.eof = _Exited(self.reader_process)

    @property
    def data(self) -> bytes:
        kept = getattr(self, "kept", None)
        return kept.read_bytes() if kept else b""

    @data.setter
    def data(self, _: bytes) -> None:
        """What the reader process wrote is read from its file; nothing is kept here."""

    def close(self) -> None:
        super().close()
        self.reader_process.kill()
        self.reader_process.wait()
        self.kept.unlink(missing_ok=True)


class _Exited:
    """``eof.is_set()`` for :class:`Apart`: its reader process ends at the end of the
    connection."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process

    def is_set(self) -> bool:
        return self.process.poll() is not None


def operator_of(term: Term, opened: list, kind: type[Raw] = Raw) -> Raw:
    """The operator's raw attach client (root), once tsh's prompt has reached it."""
    operator = kind(term.listening_at, b"attach\n")
    opened.append(operator)
    assert operator.shows(PROMPT), operator.data
    return operator


def answered(client: Raw, line: str, wanted: str, seconds: float = 5) -> float:
    """Type ``line`` and return how long ``wanted`` took to show, failing past ``seconds``."""
    began = time.monotonic()
    seen = client.count(wanted)
    client.type(line)
    assert client.shows(wanted, seen + 1, seconds), client.text()[-600:]
    return time.monotonic() - began


def calls(host: CoderHost, session: str, tool: str, kind: str = "tool_call") -> list[dict]:
    return host.calls(session, tool, kind)


# --------------------------------------------------------------------------- the terminal's side


def ctxterm_pid(term: Term) -> int:
    return int((term.rundir / "pid").read_text())


def descriptors(pid: int) -> list[str]:
    """What each open descriptor of process ``pid`` is (its ``/proc/PID/fd`` link)."""
    found = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            found.append(os.readlink(f"/proc/{pid}/fd/{name}"))
    return found


def back_to(pid: int, count: int, seconds: float = 5) -> bool:
    """Whether process ``pid`` is back to at most ``count`` descriptors within ``seconds``."""
    return wait_for(lambda: len(descriptors(pid)) <= count, seconds)


def listener_inodes(*paths: Path) -> set[str]:
    """The ``socket:[N]`` names of the sockets listening at ``paths`` (``/proc/net/unix``:
    the connections they accepted bear the path too, without the listening flag)."""
    wanted = {str(path) for path in paths}
    found = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7] in wanted and fields[3] == "00010000":
            found.add(f"socket:[{fields[6]}]")
    return found


def pid_namespace(pid: int | str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def sandbox_processes(session: str) -> list[int]:
    """Every process in the pid namespace of the sandbox that runs ``session``'s tsh."""
    namespace = pid_namespace(tsh_of(session))
    return [
        int(p) for p in filter(str.isdigit, os.listdir("/proc")) if pid_namespace(p) == namespace
    ]


def levels_of(term: Term) -> list[Path]:
    """The directories from :data:`RUN_BASE` down to the terminal's runtime directory."""
    below = [p for p in reversed(term.rundir.parents) if RUN_BASE in p.parents]
    return [RUN_BASE, *below, term.rundir]


# ------------------------------------------------------------------ clients of other uids

# Run as another uid: connect to argv[1] and hand the connection over descriptor argv[2].
HAND_OVER = r"""
import array, socket, sys
channel = socket.socket(fileno=int(sys.argv[2]))
connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
connection.connect(sys.argv[1])
handed = array.array("i", [connection.fileno()])
channel.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, handed)])
"""


def connected_as(uid: int, gid: int, path: Path) -> socket.socket:
    """A connection to ``path`` made by a process of ``uid`` (so its ``SO_PEERCRED`` says
    ``uid``), handed to this process to drive."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        done = subprocess.run(
            [PYTHON, "-c", HAND_OVER, str(path), str(theirs.fileno())], capture_output=True,
            text=True, timeout=30, pass_fds=[theirs.fileno()], user=uid, group=gid,
            extra_groups=[], cwd="/",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        _, ancillary, _, _ = ours.recvmsg(1, socket.CMSG_SPACE(4))
    (descriptor,) = struct.unpack("i", ancillary[0][2][:4])
    return socket.socket(fileno=descriptor)


class RawOf(Raw):
    """:class:`Raw` over a connection made elsewhere (:func:`connected_as`)."""

    def __init__(self, sock: socket.socket, first: bytes) -> None:
        self.sock = sock
        self.connected = time.monotonic()
        sock.sendall(first)
        self.data = b""
        self.eof = threading.Event()
        self.ended_at = None
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()


def unread(sock: socket.socket) -> int:
    """Bytes ``sock`` sent that its peer has not read yet (``SIOCOUTQ``)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]


def as_uid(uid: int, gid: int, script: str, *args: str) -> dict:
    """Run ``script`` as ``uid``; the JSON object it printed last."""
    done = subprocess.run(
        [PYTHON, "-c", script, *args], capture_output=True, text=True, timeout=60,
        user=uid, group=gid, extra_groups=[], cwd="/",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


# What a connection was told, read until the prompt or the end (a reset after the terminal
# closed with our bytes unread is an end too), in latin-1.
TOLD = r"""
import json, os, socket, sys, time
def connect(path, first=b""):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    if first:
        try:
            s.sendall(first)
        except OSError:
            pass
    return s
def told(s, until=b"coder$ "):
    s.settimeout(5)
    data = b""
    try:
        while until not in data:
            chunk = s.recv(65536)
            if not chunk:
                data += b"<EOF>"
                break
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        data += b"<EOF>"
    except OSError:
        data += b"<TIMEOUT>"
    return data.decode("latin-1")
"""


# ------------------------------------------------------------------------------ mode lines

LOOK_ALIKES = [
    b"watch\x00\n",
    b"attach\x00\n",
    b"\x00attach\n",
    b"ATTACH\n",
    b" attach\n",
    b"attach \n",
    b"attach\r\n",  # a telnet-style line end
    b"\x1b[2Jattach\n",
    b"attach\x1b\n",
    b"watch\x7fattach\n",
    b"attach\twatch\n",
    "\u0430ttach\n".encode(),  # a Cyrillic a
    b"\xffattach\n",
]


def test_mode_lines_with_nul_control_bytes_look_alike_letters_or_cut_short_are_refused(
    host: CoderHost,
) -> None:
    """A-2 ("the client sends one mode line": ``watch\\n`` or ``attach\\n``): a line that only
    looks like one — a NUL after or before the word (a C string would stop there), an escape
    sequence, a DEL, a tab, a CR before the newline, capitals, spaces, a Cyrillic letter, a
    byte that is not UTF-8 — is answered with one plain refusal line and closed, even from
    root: no scrollback, nothing of the client's bytes echoed, and the command line glued
    after it is never typed.  A connection is kept "only for ten seconds without its mode
    line" (docs/tools.md), and not that long once the line can no longer come: one that shuts
    its sending side having sent nothing, or half a word, is closed at once without a byte,
    while one that sent ``watch\n`` and shut its side is served."""
    term = host.start()
    with closing_all() as opened:
        operator = operator_of(term, opened)
        tricksters = [Raw(term.listening_at, line + b"fs.read a.txt\r") for line in LOOK_ALIKES]
        opened += tricksters
        silent, half_watch, half_attach, whole = (
            Raw(term.listening_at, first) for first in (b"", b"wat", b"atta", b"watch\n")
        )
        opened += [silent, half_watch, half_attach, whole]
        began = time.monotonic()
        for client in (silent, half_watch, half_attach, whole):
            client.sock.shutdown(socket.SHUT_WR)
        for line, client in zip(LOOK_ALIKES, tricksters, strict=True):
            assert client.eof.wait(5), (line, client.data)
            assert client.data == REFUSED_LINE, (line, client.data)
        for client in (silent, half_watch, half_attach):
            assert client.eof.wait(3) and client.data == b"", client.data
        assert time.monotonic() - began < 3, "kept as if its mode line could still come"
        assert whole.shows(PROMPT, seconds=3), whole.data
        answered(operator, "fs.read b.txt", "content of b-b")
        assert whole.shows("content of b-b", seconds=3) and not whole.eof.is_set()
        assert "content of a-a" not in operator.text()
    assert [e["argv"] for e in calls(host, term.session, "fs.read")] == [["b.txt"]]


def test_a_megabyte_mode_line_is_cut_off_at_once_and_costs_the_operator_nothing(
    host: CoderHost,
) -> None:
    """A-2 and docs/tools.md (the terminal never waits on a client): 4 MiB sent without a
    newline, and 100 KB that end in one, are refused after the first bytes that cannot be a
    mode line — the sender finds its connection closed long before the megabytes are taken —
    while the operator's calls are answered as usual; the terminal is left holding no
    descriptor more than before."""
    term = host.start()
    pid = ctxterm_pid(term)
    with closing_all() as opened:
        operator = operator_of(term, opened)
        before = len(descriptors(pid))
        outcomes: dict[str, dict] = {"long": {}, "endless": {}}

        def send(payload: bytes, outcome: dict) -> None:
            """Send ``payload`` as a first line; how far it went, and what came back."""
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.connect(str(term.listening_at))
                sock.settimeout(10)
                try:
                    sock.sendall(payload)
                    outcome["sent"] = "all"
                except OSError as exc:
                    outcome["sent"] = type(exc).__name__
                got = b""
                with contextlib.suppress(OSError):
                    while chunk := sock.recv(65536):
                        got += chunk
                outcome["got"] = got

        began = time.monotonic()
        senders = [
            threading.Thread(target=send, args=(payload, outcomes[name]), daemon=True)
            for name, payload in (
                ("endless", b"w" * (4 << 20)),
                ("long", b"watch" + b" " * 100_000 + b"\n"),
            )
        ]
        for sender in senders:
            sender.start()
        assert answered(operator, "fs.read a.txt", "content of a-a") < 3
        for sender in senders:
            sender.join(timeout=10)
            assert not sender.is_alive(), "a sender was never let go"
        assert time.monotonic() - began < 8
        endless = outcomes["endless"]
        # Cut off by the terminal, not merely slowed down until the sender gave up.
        assert endless["sent"] in ("BrokenPipeError", "ConnectionResetError"), endless["sent"]
        for outcome in outcomes.values():
            assert outcome["got"] in (b"", REFUSED_LINE), outcome["got"][:200]
        assert back_to(pid, before), (before, descriptors(pid))
        answered(operator, "fs.read b.txt", "content of b-b")


# ------------------------------------------------------------------------ floods and places

# As the agent's uid: 70 connections asking to attach, one after another, and what each is
# told; 64 connections that send half a mode line and hold it; a 65th connection, and what
# it is told; then, once a line comes on stdin, the 64 are closed and a new watcher
# connects: what it is told, and how long after the release.
LORIS = (
    TOLD
    + r"""
path, count = sys.argv[1], int(sys.argv[2])
refusals = [told(connect(path, b"attach\n")) for _ in range(70)]
held = [connect(path, b"wat") for _ in range(count)]
extra = told(connect(path, b"watch\n"))
print(json.dumps({"refusals": refusals, "extra": extra}), flush=True)
sys.stdin.readline()
released = time.monotonic()
for s in held:
    s.close()
after = told(connect(path, b"watch\n"))
print(json.dumps({"after": after, "seconds": time.monotonic() - released}), flush=True)
"""
)


def test_slow_loris_connections_of_the_agents_uid_fill_only_its_own_64_places(
    host: CoderHost,
) -> None:
    """docs/tools.md: "The agent's own uid ... holds at most 64 connections at once; the 65th
    is told ctxterm: EAGAIN", "Root's and the storage owner's connections do not count", and
    the agent's uid may watch, not attach.  A process of that uid is refused 70 attaches
    (``ctxterm: EACCES``, no output), which leave no place taken: it still holds 64
    half-sent mode lines, and gets EAGAIN on its 65th connection, while the operator
    attaches anew and is answered at once; the places come back as soon as those
    connections close (not ten seconds later): a new watcher of that uid is served."""
    term = host.start()
    with closing_all() as opened:
        operator = operator_of(term, opened)
        loris = subprocess.Popen(
            [PYTHON, "-c", LORIS, str(term.listening_at), "64"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            user=host.uid, group=host.gid, extra_groups=[], cwd="/", start_new_session=True,
        )  # fmt: skip
        with ended(loris):
            assert loris.stdout is not None and loris.stdin is not None
            holding = time.monotonic()
            told = json.loads(loris.stdout.readline())
            for refusal in told["refusals"]:
                assert refusal.startswith(f"ctxterm: EACCES: uid {host.uid} may not attach")
                assert refusal.endswith("<EOF>") and "coder$" not in refusal, refusal
            extra = told["extra"]
            assert extra.startswith("ctxterm: EAGAIN: the terminal serves 64 clients"), extra
            assert extra.endswith("<EOF>") and "coder$" not in extra, extra

            late = operator_of(term, opened)  # root's: not counted among the 64
            assert answered(late, "fs.read a.txt", "content of a-a") < 3
            assert operator.shows("content of a-a")
            assert time.monotonic() - holding < 8, "too slow to tell a release from a timeout"
            loris.stdin.write("release\n")
            loris.stdin.flush()
            after = json.loads(loris.stdout.readline())
        assert "coder$ " in after["after"] and "ctxterm" not in after["after"], after
        assert after["seconds"] < 3, after


# As the agent's uid: 64 watchers one after another, each reading the scrollback and then
# closing its connection; then one more watcher, and what it is told.
POLLS = (
    TOLD
    + r"""
path = sys.argv[1]
for _ in range(64):
    s = connect(path, b"watch\n")
    told(s)
    s.close()
print("looked", flush=True)
sys.stdin.readline()
print(json.dumps({"next": told(connect(path, b"watch\n"))}), flush=True)
"""
)


def test_watchers_that_came_and_went_on_an_idle_terminal_leave_nothing_behind(
    host: CoderHost,
) -> None:
    """docs/tools.md: a client that shut its sending side "keeps receiving the output until it
    closes", and the agent's uid "holds at most 64 connections at once": a process of that
    uid that looks at the idle terminal 64 times (connects, reads the scrollback, closes)
    holds no connection afterwards, so its next look is served, and the terminal is back to
    the descriptors it had — without waiting for tsh to print something."""
    term = host.start()
    pid = ctxterm_pid(term)
    with closing_all() as opened:
        operator_of(term, opened)
        before = len(descriptors(pid))
        looker = subprocess.Popen(
            [PYTHON, "-c", POLLS, str(term.listening_at)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, user=host.uid, group=host.gid, extra_groups=[],
            cwd="/", start_new_session=True,
        )  # fmt: skip
        with ended(looker):
            assert looker.stdout is not None and looker.stdin is not None
            assert looker.stdout.readline() == "looked\n"
            gone = back_to(pid, before, 0.5)
            looker.stdin.write("again\n")
            looker.stdin.flush()
            told = json.loads(looker.stdout.readline())
        assert gone, (before, len(descriptors(pid)))
        assert told["next"].endswith("coder$ ") and "ctxterm" not in told["next"], told


STRANGER = (
    TOLD
    + r"""
path, count = sys.argv[1], int(sys.argv[2])
answers = {}
for n in range(count):
    got = told(connect(path, b"watch\n" if n % 2 else b"attach\n"))
    key = "prompt" if "coder$" in got else got[:15]
    answers[key] = answers.get(key, 0) + 1
print(json.dumps(answers))
"""
)


def test_a_stranger_flooding_connections_is_refused_each_time_and_leaves_nothing_behind(
    host: CoderHost, unprivileged_user: UnprivilegedUser
) -> None:
    """A-2 (``SO_PEERCRED``: the peer's uid decides, not its groups): a uid that is neither
    the host's administrators' nor the agent's, holding the agent's gid and gid 0 among its
    groups, opens 300 connections one after another; every one is told ``ctxterm: EACCES``
    and closed, none sees a byte of the terminal, the operator is answered meanwhile, and
    the terminal is back to the descriptors it had."""
    term = host.start()
    pid = ctxterm_pid(term)
    with closing_all() as opened:
        operator = operator_of(term, opened)
        before = len(descriptors(pid))
        stranger = unprivileged_user
        argv = [PYTHON, "-c", STRANGER, str(term.listening_at), "300"]
        flood = subprocess.Popen(
            argv, stdout=subprocess.PIPE, text=True, user=stranger.uid, group=stranger.gid,
            extra_groups=[host.gid, 0], cwd="/",
        )  # fmt: skip
        with ended(flood):
            assert answered(operator, "fs.read a.txt", "content of a-a") < 3
            out, _ = flood.communicate(timeout=60)
        assert flood.returncode == 0
        assert json.loads(out) == {"ctxterm: EACCES": 300}, out
        assert back_to(pid, before), (before, descriptors(pid))
        answered(operator, "fs.read b.txt", "content of b-b")


def test_two_hundred_root_watchers_get_the_same_bytes_and_leave_no_descriptor(
    host: CoderHost,
) -> None:
    """docs/tools.md ("output to every client"; root's connections are not counted): 200
    watchers of root connected at once each get the same scrollback and the same answer to
    the operator's call, byte for byte; once they have closed and the terminal has printed
    again, it holds no descriptor more than before and goes on answering."""
    term = host.start()
    pid = ctxterm_pid(term)
    with closing_all() as opened:
        operator = operator_of(term, opened)
        before = len(descriptors(pid))
        crowd = []
        for _ in range(200):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            opened.append(sock)
            sock.connect(str(term.listening_at))
            sock.sendall(b"watch\n")
            crowd.append(sock)
        assert wait_for(lambda: len(descriptors(pid)) >= before + 200, 10)
        answered(operator, "fs.read a.txt", "content of a-a")
        seen = []
        for sock in crowd:
            sock.settimeout(5)
            data = b""
            while data.count(PROMPT) < 2:
                chunk = sock.recv(65536)
                assert chunk, data
                data += chunk
            seen.append(data)
        assert b"content of a-a" in seen[0] and len(set(seen)) == 1, set(seen)
        for sock in crowd:
            sock.close()
        answered(operator, "fs.read b.txt", "content of b-b")
        assert back_to(pid, before), (before, len(descriptors(pid)))
        answered(operator, "fs.read a.txt", "content of a-a")


# ------------------------------------------------------------------- watchers that misbehave


def test_a_watchers_control_keys_and_typing_never_reach_the_pty(host: CoderHost) -> None:
    """A-2 (``watch\\n`` = read PTY output only): while the operator's tool runs, a watcher of
    the agent's uid sends Ctrl-C, Ctrl-\\, Ctrl-Z, Ctrl-D, ``exit`` and 700 KB of command
    lines, all taken by the terminal: the tool is not interrupted and ends when it is let
    (exit 0), tsh lives on, none of the lines runs, and the watcher keeps seeing the
    terminal.  The same Ctrl-C from the attached operator does interrupt the tool (the docs'
    exit status 130)."""
    term = host.start()
    with closing_all() as opened:
        operator = operator_of(term, opened)
        watcher = RawOf(connected_as(host.uid, host.gid, term.listening_at), b"watch\n")
        opened.append(watcher)
        assert watcher.shows(PROMPT)
        operator.type("slow")
        assert operator.shows("SLOW-START"), operator.text()[-300:]
        watcher.send(b"\x03\x03\x1c\x1a\x04exit\rfs.read a.txt\r" + b"fs.read a.txt\r" * 50_000)
        assert wait_for(lambda: unread(watcher.sock) == 0, 10)  # the terminal took every byte
        (host.ws / "go").touch()  # the tool may end now: it was waiting for this file
        assert operator.shows("SLOW-DONE", seconds=6), operator.text()[-300:]
        assert operator.shows(PROMPT, 2)
        answered(operator, "fs.read b.txt", "content of b-b")
        assert watcher.shows("SLOW-DONE") and watcher.shows("content of b-b")
        assert not watcher.eof.is_set()

        operator.type("slow")
        assert operator.shows("SLOW-START", 2)
        operator.send(b"\x03")
        assert wait_for(lambda: len(calls(host, term.session, "slow", "tool_result")) == 2, 10)
        assert operator.count("SLOW-DONE") == 1
    results = calls(host, term.session, "slow", "tool_result")
    assert [r["exit_status"] for r in results] == [0, 130], results
    assert [e["argv"] for e in calls(host, term.session, "fs.read")] == [["b.txt"]]


def test_a_watcher_that_trickles_is_let_go_with_an_exact_prefix_of_the_output(
    host: CoderHost,
) -> None:
    """docs/tools.md: a client that "falls more than 1 MiB behind, is closed, while the other
    clients go on as before": a watcher that reads a few KiB at a time while a tool prints
    2.4 MB is closed short of the end, and what it did get is exactly the start of what a
    watcher reading at full speed got — nothing skipped or reordered — while that watcher and
    the operator get everything, promptly."""
    term = host.start()
    with closing_all() as opened:
        operator = operator_of(term, opened, Apart)
        fast = Apart(term.listening_at, b"watch\n")
        slow = Raw(term.listening_at, b"watch\n", read=False, rcvbuf=4096)
        opened += [fast, slow]
        assert fast.shows(PROMPT)
        got = bytearray()
        full_speed = threading.Event()
        finished = threading.Event()

        def trickle() -> None:
            slow.sock.settimeout(0.2)
            while True:
                try:
                    chunk = slow.sock.recv(65536 if full_speed.is_set() else 2048)
                except TimeoutError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                got.extend(chunk)
                if not full_speed.is_set():
                    # 4 KiB a second: however slowly a loaded machine runs the flood, what
                    # this watcher takes meanwhile leaves it more than 1 MiB behind.
                    time.sleep(0.5)
            finished.set()

        reader = threading.Thread(target=trickle, daemon=True)
        reader.start()
        began = time.monotonic()
        operator.type("flood")
        # Wide bounds for a loaded machine: a watcher held back to the trickle's pace (4 KiB a
        # second) would need ten minutes for the 2.4 MB.
        assert fast.shows("FLOOD-END", seconds=40) and operator.shows("FLOOD-END", seconds=20)
        assert time.monotonic() - began < 60
        full_speed.set()  # now take whatever is left: the end of the connection must follow
        assert finished.wait(10), "the trickling watcher was never let go"
        assert b"FLOOD-END" not in got, len(got)
        assert bytes(got) == fast.data[: len(got)], len(got)
        assert fast.data.count(b"\n") > FLOOD_LINES
        answered(operator, "fs.read a.txt", "content of a-a")
        assert fast.shows("content of a-a") and not fast.eof.is_set()


# -------------------------------------------------------------------- what tools and tsh hold


def test_tools_run_from_the_terminal_hold_none_of_its_sockets_or_its_pty_master(
    host: CoderHost,
) -> None:
    """H-1, A-1, A-5: a tool tsh runs is a process of the agent's uid on the host; were it to
    inherit the terminal's listening sockets, its PTY master or a client's connection, it
    could accept the operator's connections or read what the operator types.  A tool running
    at the terminal, watched, holds none of ctxterm's sockets, no ``/dev/ptmx``, nothing of
    the runtime directory and no run capability, and tsh in the sandbox holds neither
    listening socket."""
    term = host.start()
    pid = ctxterm_pid(term)
    with closing_all() as opened:
        operator = operator_of(term, opened)
        watcher = Raw(term.listening_at, b"watch\n")
        opened.append(watcher)
        operator.type("slow")
        started = re.compile(rb"SLOW-START pid=(\d+)\r\n")
        assert wait_for(lambda: started.search(operator.data)), operator.text()[-300:]
        tool = int(started.search(operator.data).group(1))
        assert os.stat(f"/proc/{tool}").st_uid == host.uid

        held = set(descriptors(tool))
        terminals = set(descriptors(pid))
        listeners = listener_inodes(term.listening_at, term.rundir / "private" / "run.sock")
        assert len(listeners) == 2 and listeners <= terminals, (listeners, terminals)
        shared = {d for d in held & terminals if d.startswith("socket:")}
        assert shared == set(), shared
        assert not [d for d in held if d.endswith("ptmx") or str(term.rundir) in d], held
        environment = Path(f"/proc/{tool}/environ").read_bytes().split(b"\0")
        assert not [v for v in environment if v.startswith(b"CTX_RUN_CAPABILITY=")]
        assert not listeners & set(descriptors(tsh_of(term.session)))

        (host.ws / "go").touch()
        assert operator.shows("SLOW-DONE") and watcher.shows("SLOW-DONE")
        answered(operator, "fs.read a.txt", "content of a-a")


# As the agent's uid: for each path, connect and send a run request with three descriptors
# (tsh's protocol), or an interrupt; how the connect went and the answer line.
OUTSIDER = r"""
import array, errno, json, os, socket, sys
message = sys.argv[1].encode() + b"\n"
seen = []
for path in sys.argv[2:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError as exc:
        seen.append({"path": path, "connect": errno.errorcode[exc.errno]})
        continue
    r, w = os.pipe()
    os.close(w)
    s.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r, 1, 2]))])
    s.settimeout(10)
    answer = s.makefile("rb").readline().decode()
    seen.append({"path": path, "connect": "connected", "answer": answer})
print(json.dumps(seen))
"""


def test_no_process_of_the_agents_uid_reaches_the_run_socket_through_the_sandbox(
    host: CoderHost,
) -> None:
    """H-2 and docs/tools.md "the run socket" (it "serves tsh and nothing else"): a process of
    the agent's uid on the host tries the run socket on the host and through the root of every
    process of the sandbox (``/proc/PID/root/run/ctx/run.sock``), with a command line and with
    an interrupt while the operator's tool runs: every try is refused (EACCES, at the connect
    or in the answer), no call runs, and the operator's tool is not interrupted."""
    term = host.start()
    with closing_all() as opened:
        operator = operator_of(term, opened)
        paths = [str(term.rundir / "private" / "run.sock")]
        paths += [f"/proc/{pid}/root/run/ctx/run.sock" for pid in sandbox_processes(term.session)]
        assert len(paths) >= 2, paths
        run = json.dumps({"tool": "fs.read", "argv": ["a.txt"]})
        operator.type("slow")
        assert operator.shows("SLOW-START")
        tries = []
        for message in (run, json.dumps({"interrupt": True})):
            done = subprocess.run(
                [PYTHON, "-c", OUTSIDER, message, *paths], capture_output=True, text=True,
                user=host.uid, group=host.gid, extra_groups=[], cwd="/", timeout=60,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            tries += json.loads(done.stdout)
        assert operator.count("SLOW-DONE") == 0  # the tries came while the tool ran
        (host.ws / "go").touch()
        assert operator.shows("SLOW-DONE", seconds=6), operator.text()[-300:]
    for tried in tries:
        if tried["connect"] == "connected":
            answer = json.loads(tried["answer"])
            assert answer["exit_status"] == 126, tried
            assert answer["error"].startswith("EACCES: "), tried
        else:
            assert tried["connect"] == "EACCES", tried
    assert calls(host, term.session, "fs.read") == []
    results = calls(host, term.session, "slow", "tool_result")
    assert [(r["status"], r["exit_status"]) for r in results] == [("ok", 0)], results


# --------------------------------------------------------------- the session's A-2 link


@contextlib.contextmanager
def running_as(host: CoderHost, script: str, *args: str) -> Iterator[subprocess.Popen]:
    """``script`` running as the agent's uid, once it printed its first line; killed after."""
    proc = subprocess.Popen(
        [PYTHON, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        user=host.uid, group=host.gid, extra_groups=[], cwd="/", start_new_session=True,
    )  # fmt: skip
    with ended(proc):
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.strip() == "planted", (first, proc.stderr.read() if proc.poll() else "")
        yield proc


# As the agent's uid, while its terminal runs: the session's terminal/ moved aside, a
# terminal/ of its own in its place whose main.sock leads to a decoy socket it listens on;
# one line per connection the decoy accepts.
DECOY = r"""
import os, socket, sys
session, decoy = sys.argv[1], sys.argv[2]
os.rename(os.path.join(session, "terminal"), os.path.join(session, "terminal.moved"))
os.mkdir(os.path.join(session, "terminal"), 0o755)
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(decoy)
os.chmod(decoy, 0o666)
server.listen(16)
os.symlink(decoy, os.path.join(session, "terminal", "main.sock"))
print("planted", flush=True)
while True:
    connection, _ = server.accept()
    print("accepted", connection.recv(100), flush=True)
    connection.close()
"""


def test_a_decoy_planted_at_the_sessions_link_fools_neither_watch_attach_nor_stop(
    host: CoderHost,
) -> None:
    """A-2 (the session's ``terminal/main.sock`` is a link in a directory of the agent's uid)
    and docs/tools.md ("Every command ... finds its root's terminal in the root's directory and
    nowhere else"): the agent swaps the link for one to a socket of its own; ``ctx agent
    watch`` still shows the real terminal, what the operator types through ``ctx agent
    attach`` runs there, the decoy is never connected to, and ``ctx agent stop`` ends the
    terminal without following the planted link: the decoy's socket file is still there."""
    term = host.start()
    decoy = host.ws / "decoy.sock"
    session = host.session_dir(term.session)
    with running_as(host, DECOY, str(session), str(decoy)) as planted:
        assert os.path.realpath(term.link) == str(decoy)
        argv = [*CTX_ARGV, "agent", "watch", "coder", "--session", term.session]
        watch = subprocess.Popen(argv, stdout=subprocess.PIPE, env=host.env, start_new_session=True)
        with ended(watch):
            assert watch.stdout is not None
            shown = b""
            deadline = time.monotonic() + 10
            while PROMPT not in shown and time.monotonic() < deadline:
                if select.select([watch.stdout], [], [], 0.2)[0]:
                    shown += watch.stdout.read1(65536)
            assert PROMPT in shown, shown
        typed = "fs.read a.txt\r\x1d"  # a line, then Ctrl-] to detach at once
        attach = host.ctx("agent", "attach", "coder", "--session", term.session, input=typed)
        assert attach.rc == 0, attach
        assert wait_for(lambda: calls(host, term.session, "fs.read", "tool_result"), 10)
        stopped = host.ctx("agent", "stop", "coder", "--session", term.session)
        assert stopped.rc == 0, stopped
        planted.kill()
        out, _ = planted.communicate()
    assert "accepted" not in out, out
    assert stat.S_ISSOCK(os.lstat(decoy).st_mode), "the planted link was followed"
    assert not term.rundir.exists() and not os.path.lexists(term.listening_at)
    assert [e["argv"] for e in calls(host, term.session, "fs.read")] == [["a.txt"]]


# As the agent's uid, while its terminal runs: the session's terminal/ moved aside and a
# symbolic link to argv[2] (a directory of root's) put in its place.
LINKED = r"""
import os, sys
session, victim = sys.argv[1], sys.argv[2]
os.rename(os.path.join(session, "terminal"), os.path.join(session, "terminal.moved"))
os.symlink(victim, os.path.join(session, "terminal"))
print("planted", flush=True)
"""


def test_a_link_in_place_of_the_sessions_terminal_directory_is_never_followed(
    host: CoderHost,
) -> None:
    """A-2 and terminal_runtime's rule (the session "could plant a link there: it is reached,
    and used, without following any"): the agent replaces its session's ``terminal/`` with a
    link to a directory of root's holding a file named ``main.sock``; ``ctx agent stop`` ends
    the terminal and removes nothing there; the next start in that session is refused with
    ELOOP naming the link, leaves nothing running and nothing in root's directory."""
    term = host.start()
    victim = host.top / "root-owned"
    victim.mkdir(mode=0o755)
    (victim / "main.sock").write_text("root's own file\n")
    session = host.session_dir(term.session)
    with running_as(host, LINKED, str(session), str(victim)):
        pass
    stopped = host.ctx("agent", "stop", "coder", "--session", term.session)
    assert stopped.rc == 0, stopped
    assert not term.rundir.exists()
    assert sorted(os.listdir(victim)) == ["main.sock"]
    assert (victim / "main.sock").read_text() == "root's own file\n"

    again = host.ctx("agent", "start", "coder", "--session", term.session, cwd=host.ws)
    assert again.rc == 1, again
    assert again.err.startswith("ctx: ELOOP: ") and f"{session}/terminal" in again.err, again
    assert "Traceback" not in again.err
    assert sorted(os.listdir(victim)) == ["main.sock"]
    assert (victim / "main.sock").read_text() == "root's own file\n"
    assert not term.rundir.exists()
    assert [
        m for m in Path("/proc/self/mounts").read_text().splitlines() if str(term.rundir) in m
    ] == []
    kinds = [e["type"] for e in host.lifecycle(term.session)]
    assert kinds == ["terminal.started", "terminal.stopped"], kinds


PLANT_DIRECTORY = r"""
import os, sys
place = os.path.join(sys.argv[1], "terminal", "main.sock")
os.makedirs(place, 0o755)
with open(os.path.join(place, "keep.txt"), "w") as kept:
    kept.write("the agent's own file\n")
print("planted", flush=True)
"""


def test_a_directory_planted_where_the_sessions_link_goes_is_refused_by_name(
    host: CoderHost,
) -> None:
    """A-2 and docs/tools.md (each thing in the terminal's places is named with its errno):
    the agent's uid, which owns its sessions, makes a session with a directory of its own
    where the session's link goes; the start of a terminal in that session is refused with
    EISDIR naming that path (not a Python message), leaves the agent's directory and its
    file as they were, and leaves nothing running."""
    if not host.session_dir("x").parent.exists():  # a first start makes it, the agent's
        first = host.start()
        assert host.ctx("agent", "stop", "coder", "--session", first.session).rc == 0
    name = f"s{uuid.uuid4().hex[:10]}"
    session = host.session_dir(name)
    with running_as(host, PLANT_DIRECTORY, str(session)):
        pass
    again = host.ctx("agent", "start", "coder", "--session", name, cwd=host.ws)
    place = session / "terminal" / "main.sock"
    assert again.rc == 1, again
    assert (place / "keep.txt").read_text() == "the agent's own file\n"
    key = hashlib.sha256(os.fsencode(os.path.realpath(host.storage))).hexdigest()[:16]
    assert not (RUN_BASE / key / str(host.uid) / "coder" / name).exists()
    assert host.lifecycle(name) == []
    assert again.err.startswith("ctx: EISDIR: ") and str(place) in again.err, again
    assert "[Errno" not in again.err, again


def test_a_runtime_directory_level_owned_by_the_agents_uid_is_not_served_from(
    host: CoderHost,
) -> None:
    """docs/tools.md ("the directories are root's and searchable (0711)") and A-2: a level of
    the runtime directory that exists already, owned by the agent's uid (left by an older
    install or a careless chown), is not one the terminal may listen under — whoever owns it
    can rename the session's directory away and put a socket and a pid file of its own in
    its place.  The start either refuses, naming the directory, or every level it serves from
    is root's and out of the agent's reach."""
    key = hashlib.sha256(os.fsencode(os.path.realpath(host.storage))).hexdigest()[:16]
    owned = RUN_BASE / key / str(host.uid) / "coder"
    owned.mkdir(mode=0o755, parents=True, exist_ok=True)
    os.chown(owned, host.uid, host.gid)
    session = f"s{uuid.uuid4().hex[:10]}"
    try:
        started = host.ctx("agent", "start", "coder", "--session", session, "--json", cwd=host.ws)
        if started.rc != 0:
            assert started.err.startswith("ctx: E") and str(owned) in started.err, started
            assert not (owned / session).exists()
            return
        host.started.append(session)
        term = Term(session, host.session_dir(session) / "terminal" / "main.sock",
                    Path(started.json()["listening_at"]))  # fmt: skip
        for level in levels_of(term):
            status = level.stat()
            assert (level, status.st_uid) == (level, 0), oct(status.st_mode)
            assert not status.st_mode & 0o022, (level, oct(status.st_mode))
    finally:
        with contextlib.suppress(OSError):
            os.chown(owned, 0, 0)  # the terminal's stop removes it with its runtime directory
            owned.rmdir()


# ----------------------------------------------------------------------- the run capability

# As the agent's uid: a copy of descriptor argv[2] of process argv[1] (pidfd_getfd, syscall
# 438), then one agent.update request written on it with credentials claiming to be that
# process (SCM_CREDENTIALS), and again claiming uid 0; what each write met.
FORGER = r"""
import ctypes, errno, json, os, socket, struct, sys
pid, target = int(sys.argv[1]), int(sys.argv[2])
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(438, os.pidfd_open(pid), target, 0)
if fd < 0:
    print(json.dumps({"took": False, "errno": ctypes.get_errno()}))
    sys.exit(0)
copy = socket.socket(fileno=fd)
request = json.dumps({"op": "agent.update", "control": "system.md", "content": "forged\n"})
seen = {"took": True}
for name, creds in (("pid", (pid, os.getuid(), os.getgid())), ("root", (os.getpid(), 0, 0))):
    try:
        copy.sendmsg([request.encode() + b"\n"],
                     [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, struct.pack("iII", *creds))])
        seen[name] = "sent"
    except OSError as exc:
        seen[name] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(seen))
"""


def test_credentials_forged_on_a_stolen_run_capability_reach_nothing_and_the_call_goes_on(
    host: CoderHost,
) -> None:
    """A-5 and docs/tools.md (the host answers "only writes that the kernel attributes to the
    tool's own process"): a process of the agent's uid takes a copy of an ``agent.update``
    call's capability and writes a request claiming, in its credentials, to be the tool's
    process, then to be root: both writes are refused before anything reaches the host, so
    the real call goes on and replaces system.md with its own text; the agent's log holds that
    one update, and the call is an ordinary tool_call/tool_result pair."""
    system_md = host.storage / "agent" / "coder.d" / "system.md"
    session = f"s{uuid.uuid4().hex[:10]}"
    with pending_update(host, session) as (call, pid, descriptor):
        forged = as_uid(host.uid, host.gid, FORGER, str(pid), str(descriptor))
        if not forged["took"]:
            pytest.skip(f"pidfd_getfd is not usable here (errno {forged['errno']})")
        payload = json.dumps({"control": "system.md", "content": "mine\n"}).encode()
        stdout, stderr = call.communicate(payload, timeout=60)
    assert forged == {"took": True, "pid": "EPERM", "root": "EPERM"}, forged
    assert (call.returncode, stdout) == (0, b"system.md of agent coder updated\n"), stderr
    assert system_md.read_text() == "mine\n"
    log = read_jsonl(host.storage / "agent" / "coder.d" / "log")
    updated = [
        (e["control"], e["session"], e["bytes"]) for e in log if e["type"] == "agent.updated"
    ]
    assert updated == [("system.md", session, 5)], updated
    pair = host.calls(session, "agent.update")
    assert [(e["type"], e["status"]) for e in pair] == [("tool_call", "ok"), ("tool_result", "ok")]


def test_refused_self_updates_typed_at_the_terminal_change_nothing_and_show_no_raw_escape(
    host: CoderHost,
) -> None:
    """A-5 typed at the terminal (A-2): ``agent.update`` naming the policy or a path to another
    agent's control, content carrying an escape sequence, or 8193 bytes (ASCII, or two-byte
    letters), is refused (EINVAL, EFBIG), shown to the operator and a watcher of the
    agent's uid without a raw escape byte; the controls keep their bytes and their inodes, no
    temporary file is left beside them, the log holds no update, and each call is a
    tool_call/tool_result pair.  Then 8192 bytes go in one rename (a new inode, root's, 0644)
    and the log records the size, not the text."""
    controls = host.storage / "agent" / "coder.d"
    before = {p.name: (p.read_bytes(), p.stat().st_ino) for p in controls.iterdir()}
    names = sorted(before)
    term = host.start()
    refused = [
        ({"control": name, "content": "allow coder_t tool:bash execute\n"}, "EINVAL")
        for name in ("policy", "../other.d/system.md")
    ] + [
        ({"control": "system.md", "content": "hi \x1b[2J\x1b]0;owned\x07 there\n"}, "EINVAL"),
        ({"control": "prompt.template.md", "content": "x" * 8193}, "EFBIG"),
        ({"control": "system.md", "content": "\u00e9" * 4096 + "!"}, "EFBIG"),
    ]
    with closing_all() as opened:
        operator = operator_of(term, opened)
        watcher = RawOf(connected_as(host.uid, host.gid, term.listening_at), b"watch\n")
        opened.append(watcher)
        assert watcher.shows(PROMPT)
        for request, word in refused:
            said = operator.answer(f"agent.update '{json.dumps(request)}'")
            assert f"agent.update: {word}" in said, (request["control"], said)
            assert "\x1b" not in said and "\x07" not in said, said
        after = {p.name: (p.read_bytes(), p.stat().st_ino) for p in controls.iterdir()}
        assert sorted(after) == names, sorted(after)
        assert {n: after[n] for n in names if n != "log"} == {
            n: before[n] for n in names if n != "log"
        }
        assert b"\x1b" not in watcher.data.split(PROMPT, 1)[1], watcher.data[-400:]

        full = "\u00e9" * 4096  # 8192 bytes of UTF-8
        said = operator.answer(
            f"agent.update '{json.dumps({'control': 'system.md', 'content': full})}'"
        )
        assert said == "system.md of agent coder updated\n", said
    system_md = controls / "system.md"
    status = system_md.stat()
    assert system_md.read_text() == full and status.st_ino != before["system.md"][1]
    assert (status.st_uid, stat.S_IMODE(status.st_mode)) == (0, 0o644), oct(status.st_mode)
    assert sorted(os.listdir(controls)) == names
    log = read_jsonl(controls / "log")
    updated = [
        (e["control"], e["bytes"])
        for e in log
        if e["type"] == "agent.updated" and e["session"] == term.session
    ]
    assert updated == [("system.md", 8192)], updated
    assert full[:20] not in (controls / "log").read_text()
    pairs = host.calls(term.session, "agent.update")
    assert [e["type"] for e in pairs] == ["tool_call", "tool_result"] * (len(refused) + 1)
    statuses = [e["status"] for e in pairs if e["type"] == "tool_result"]
    assert statuses == ["error"] * len(refused) + ["ok"], statuses


def test_a_prompt_far_over_8_kib_is_refused_as_too_big_not_as_a_silent_host(
    host: CoderHost,
) -> None:
    """A-5 ("rejects payloads over 8 KiB") and docs/tools.md ("the size (at most 8 KiB of
    UTF-8, EFBIG above)"): a pasted prompt of 64 KiB, or of 22 KB of two-byte letters (which
    JSON carries as 66 KB of escapes), is refused like one of 8193 bytes — EFBIG, naming the
    bound — and changes nothing; each call is a tool_call/tool_result pair."""
    system_md = host.storage / "agent" / "coder.d" / "system.md"
    kept = system_md.read_bytes()
    session = f"s{uuid.uuid4().hex[:10]}"
    said = []
    for content in ("x" * 65536, "\u00e9" * 11000):
        payload = json.dumps({"control": "system.md", "content": content})
        said.append(
            host.ctx("run", "--agent", "coder", "--session", session, "agent.update", payload)
        )
    assert system_md.read_bytes() == kept
    pairs = host.calls(session, "agent.update")
    assert [(e["type"], e["status"]) for e in pairs] == [
        ("tool_call", "ok"),
        ("tool_result", "error"),
    ] * 2
    for run in said:
        assert run.rc == 1, run
        assert run.err.startswith("agent.update: EFBIG: system.md may hold at most 8192 bytes"), run
