"""One agent terminal with many clients at once (SPEC §8 A-1, A-2; §7 H-1, H-5; docs/tools.md
"The agent terminal"): several ``ctx agent attach`` typing at the same moment beside several
``ctx agent watch`` and raw watchers, who all see the same bytes in the same order; watchers
joining while output streams, each getting a gapless tail of it; mode lines sent in pieces,
with a CR, a space, capitals, too long, or followed at once by input; clients that come and
go in a loop; two sessions of one agent (names differing only in case, or only in the last
of 64 bytes) side by side; the storage owner, the agent's uid and a stranger using ``ctx
agent watch|attach``; watch and attach after ``ctx agent stop``, after ``exit`` in tsh, after
a ``kill -9`` and after each restart; ``ctx agent watch`` with ``--json`` or odd
``--session`` names; a multiplexer (tmux) run from tsh and shared by every client.

Black-box: the installed ``ctx``, real processes, PTYs, sockets, uids, FUSE views and
bubblewrap sandboxes."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, scratch_top, wait_for
from tests.acceptance.terminalcli import CoderHost, Raw, Term, coder_host
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
PROMPT = b"coder$ "
REFUSED = b"ctxterm: expected 'watch' or 'attach' on the first line\n"
CLOSED = "closed the connection"
BIG_END = "END-OF-THE-BIG-FILE"
SCROLLBACK = 64 * 1024  # docs: "a new one first gets the last 64 KiB"
PYTHON = Path("/usr/bin/python3")  # for clients running as other uids
LETTERS = "abcdefghijkl"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or shutil.which("bwrap") is None
    or not os.path.exists("/dev/fuse")
    or not PYTHON.exists(),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse; other uids need python3",
)


# ---------------------------------------------------------------------------------- the host


@pytest.fixture
def host(_template: Path) -> Iterator[CoderHost]:
    """Agent ``coder`` allowed ``fs.read`` and ``tmux`` in both policies; a workspace holding
    small notes ``a.txt`` .. ``l.txt`` and a file of about 370 KB ending in :data:`BIG_END`."""
    files = {f"{n}.txt": f"content of {n}-{n}\n" for n in LETTERS}
    lines = "".join(f"line {n:06d} of a long listing\n" for n in range(12000))
    files["big.txt"] = lines + BIG_END + "\n"
    tools = ["fs.read", "tmux"]
    with coder_host(_template, SCRATCH, tools, files) as host:
        # H-5: a multiplexer is an ordinary tool; its socket lives in the workspace, the
        # directory the tool runs in (the agent owns it), so that nothing is left in /tmp.
        program = (
            "#!/bin/sh\n"
            'SHELL=/bin/sh exec /usr/bin/tmux -S "$PWD/.tmux.sock" -f /dev/null '
            "new-session -A -s main\n"
        )
        host.install("tmux", program, side_effects=True)
        for tool in tools:
            host.grant_in_tool(tool)
        yield host


# ------------------------------------------------------------------------------- the clients


class CtxClient:
    """``ctx agent watch|attach`` on pipes (run as ``user``, a ``(uid, gid)``, when given),
    its output collected in a thread."""

    def __init__(
        self, host: CoderHost, verb: str, *args: str, user: tuple[int, int] | None = None
    ) -> None:
        argv = [*CTX_ARGV, "agent", verb, "coder", *args]
        ids = {"user": user[0], "group": user[1], "extra_groups": []} if user else {}
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=host.env, cwd="/", start_new_session=True, **ids,
        )  # fmt: skip
        self.data = b""
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        while chunk := os.read(self.proc.stdout.fileno(), 65536):
            self.data += chunk

    def shows(self, text: str | bytes, count: int = 1, seconds: float = 15) -> bool:
        wanted = text.encode() if isinstance(text, str) else text
        return wait_for(lambda: self.data.count(wanted) >= count, seconds)

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def wait(self, seconds: float = 20) -> tuple[int, str]:
        """Its exit status and standard error, once it has ended on its own."""
        assert self.proc.stderr is not None
        self.proc.wait(timeout=seconds)
        self.reader.join(timeout=5)
        return self.proc.returncode, self.proc.stderr.read().decode("utf-8", "replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.reader.join(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            with contextlib.suppress(OSError):
                stream.close()  # type: ignore[union-attr]


@contextlib.contextmanager
def closing_all() -> Iterator[list]:
    opened: list = []
    try:
        yield opened
    finally:
        for thing in reversed(opened):
            thing.close()


def settle(client: Raw | CtxClient, quiet: float = 0.5, seconds: float = 10) -> bytes:
    """What ``client`` got once nothing more came for ``quiet`` seconds."""
    deadline = time.monotonic() + seconds
    seen, since = len(client.data), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        if len(client.data) != seen:
            seen, since = len(client.data), time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return client.data


def settle_all(clients: list, quiet: float = 0.4, seconds: float = 10) -> list[bytes]:
    """What each of ``clients`` got once nothing more came to any of them for ``quiet``
    seconds."""
    deadline = time.monotonic() + seconds
    seen, since = [len(c.data) for c in clients], time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = [len(c.data) for c in clients]
        if now != seen:
            seen, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return [c.data for c in clients]


def argv_of(host: CoderHost, session: str) -> list[list[str]]:
    return [e["argv"] for e in host.calls(session, "fs.read", "tool_call")]


def drained(fd: int, seconds: float) -> bytes:
    """What can be read from the pipe ``fd`` until its end, or until ``seconds`` pass."""
    got = b""
    os.set_blocking(fd, False)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            time.sleep(0.02)
            continue
        if not chunk:
            break
        got += chunk
    return got


def ctxterm_pid(term: Term) -> int:
    return int((term.rundir / "pid").read_text())


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def as_uid(uid: int, gid: int, script: str, *args: str, stdin: str = "") -> dict:
    """Run the Python ``script`` as ``uid``; the JSON object it printed last."""
    done = subprocess.run(
        [str(PYTHON), "-c", script, *args], input=stdin, capture_output=True, text=True,
        timeout=60, user=uid, group=gid, extra_groups=[], cwd="/",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def ctx_as(uid: int, gid: int, host: CoderHost, *args: str, stdin: bytes = b"") -> tuple:
    """``ctx ARGS`` run as ``uid``: exit status, stdout, stderr."""
    done = subprocess.run(
        [*CTX_ARGV, *args], input=stdin, capture_output=True, timeout=60, env=host.env,
        user=uid, group=gid, extra_groups=[], cwd="/",
    )  # fmt: skip
    return done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode()


@contextlib.contextmanager
def storage_owned_by(host: CoderHost, uid: int, gid: int) -> Iterator[None]:
    """The storage root (its top directory) owned by ``uid`` for the block."""
    before = host.storage.stat()
    os.chown(host.storage, uid, gid)
    try:
        yield
    finally:
        os.chown(host.storage, before.st_uid, before.st_gid)


# ------------------------------------------------------------------------------------ the flows


def test_three_attachers_typing_at_once_each_line_runs_once_and_everyone_sees_the_same_bytes(
    host: CoderHost,
) -> None:
    """A-2 ("output to every client", "an attach client's input to the PTY"): three ``ctx
    agent attach`` each send three command lines at the same moment, while three ``ctx agent
    watch`` and two raw watchers look on.  Each of the nine lines runs exactly once, each
    attacher's lines in the order it typed them, and every client — the attachers too — ends
    up with the very same bytes, prompt by prompt."""
    term = host.start()
    with closing_all() as opened:
        attachers = [CtxClient(host, "attach", "--session", term.session) for _ in range(3)]
        watchers = [CtxClient(host, "watch", "--session", term.session) for _ in range(3)]
        raws = [Raw(term.listening_at, b"watch\n") for _ in range(2)]
        opened += [*attachers, *watchers, *raws]
        everyone = [*attachers, *watchers, *raws]
        assert all(client.shows(PROMPT) for client in everyone)

        names = iter(LETTERS)
        lines = [[f"{next(names)}.txt" for _ in range(3)] for _ in attachers]
        start = threading.Barrier(len(attachers))

        def type_all(client: CtxClient, files: list[str]) -> None:
            start.wait()
            for name in files:
                client.write(f"fs.read {name}\r".encode())

        typists = [
            threading.Thread(target=type_all, args=pair)
            for pair in zip(attachers, lines, strict=True)
        ]
        for typist in typists:
            typist.start()
        for typist in typists:
            typist.join()
        for client in everyone:
            assert client.shows(PROMPT, 10, seconds=20), client.data[-400:]
        assert wait_for(lambda: len(argv_of(host, term.session)) == 9)
        ran = [argv[0] for argv in argv_of(host, term.session)]
        assert sorted(ran) == sorted(name for files in lines for name in files), ran
        for files in lines:  # each attacher's own order is kept
            assert [name for name in ran if name in files] == files, (files, ran)
        seen = settle_all(everyone)
        assert len(set(seen)) == 1, [len(data) for data in seen]
        for name in ran:
            letter = name[0]
            assert f"content of {letter}-{letter}".encode() in seen[0]
        assert all(client.proc.poll() is None for client in [*attachers, *watchers])


def test_watchers_joining_while_output_streams_each_get_a_gapless_tail_of_it(
    host: CoderHost,
) -> None:
    """A-2 and the docs ("a new one first gets the last 64 KiB", then everything the shell
    prints): raw watchers and ``ctx agent watch`` that join one after another while a 370 KB
    file is being printed each end up with a tail of exactly what the operator saw — no
    byte lost, doubled or out of order where the scrollback meets the live output — and at
    least the 64 KiB of scrollback."""
    term = host.start()
    with closing_all() as opened:
        operator = Raw(term.listening_at, b"attach\n")
        opened.append(operator)
        assert operator.shows(PROMPT)
        operator.type("fs.read big.txt")
        assert operator.shows("line 000500 of"), operator.data[-300:]
        joined: list[Raw | CtxClient] = []
        for n in range(6):
            client = (
                Raw(term.listening_at, b"watch\n")
                if n % 2
                else CtxClient(host, "watch", "--session", term.session)
            )
            opened.append(client)
            joined.append(client)
            time.sleep(0.03)
        assert operator.shows(BIG_END, seconds=20) and operator.shows(PROMPT, 2)
        whole = settle(operator)
        assert len(whole) > 4 * SCROLLBACK, len(whole)
        for n, tail in enumerate(settle_all(joined)):
            assert len(tail) >= SCROLLBACK, (n, len(tail))
            assert whole.endswith(tail), (n, len(tail), tail[:80])
        operator.type("fs.read a.txt")
        for client in joined:
            assert client.shows("content of a-a"), client.data[-200:]


# Mode lines sent a piece at a time: what each client sends, and whether it is then served
# with what follows typed, served with what follows ignored, or refused.
MODE_LINES = [
    ([b"att", b"ach", b"\nfs.read a.txt\r"], "typed"),  # split, then input
    ([b"w", b"a", b"t", b"c", b"h", b"\nfs.read l.txt\r"], "watched"),  # input ignored
    ([b"wat", b"ch\r", b"\n"], "refused"),  # a CR before the newline
    ([b"attach\r\n"], "refused"),
    ([b"watch ", b"\n"], "refused"),  # a trailing space
    ([b"WAT", b"CH\n"], "refused"),  # upper case
    ([b"Attach\n"], "refused"),
    ([b"w" * 64, b"\n"], "refused"),  # 64 bytes are waited for, then refused
    ([b"watch" + b" " * 60], "refused"),  # 65 bytes without a newline: at once
    ([b"watch" * 13, b"atch\n"], "refused"),
]


def test_mode_lines_in_pieces_or_odd_forms_are_served_or_refused_each_as_one_line(
    host: CoderHost,
) -> None:
    """A-2 ("the client sends one mode line, then raw PTY bytes flow"; docs: exactly
    ``watch\\n`` or ``attach\\n``): ten clients at once send their first line a piece at a
    time, interleaved.  A mode line arriving in pieces counts once its newline comes, and what
    follows it is typed by an attacher and ignored from a watcher; a line with a CR, a
    trailing space or capitals, or longer than a mode line can be, is refused with one plain
    line and closed without a byte of the terminal.  ``ctx agent watch`` and the operator
    see only the operator's call and the split attacher's run."""
    term = host.start()
    with closing_all() as opened:
        operator = Raw(term.listening_at, b"attach\n")
        witness = CtxClient(host, "watch", "--session", term.session)
        opened += [operator, witness]
        assert operator.shows(PROMPT) and witness.shows(PROMPT)
        clients = [Raw(term.listening_at) for _ in MODE_LINES]
        opened += clients
        for step in range(max(len(pieces) for pieces, _ in MODE_LINES)):
            time.sleep(0.1)
            for client, (pieces, _) in zip(clients, MODE_LINES, strict=True):
                if step < len(pieces):
                    client.send(pieces[step])
        for client, (pieces, answer) in zip(clients, MODE_LINES, strict=True):
            if answer == "refused":
                assert client.eof.wait(5), (pieces, client.data)
                assert client.data == REFUSED, (pieces, client.data)
            else:
                assert client.shows(PROMPT), (pieces, client.data)
        assert operator.shows("content of a-a"), operator.data[-300:]
        operator.type("fs.read b.txt")
        assert witness.shows("content of b-b"), witness.data[-300:]
        assert wait_for(lambda: len(argv_of(host, term.session)) == 2)
        time.sleep(0.3)
        assert argv_of(host, term.session) == [["a.txt"], ["b.txt"]]
        for client, (pieces, answer) in zip(clients, MODE_LINES, strict=True):
            if answer != "refused":
                assert client.shows("content of b-b") and not client.eof.is_set(), pieces
        assert witness.proc.poll() is None and not operator.eof.is_set()
        seen = settle(witness)
        assert b"l.txt" not in seen and REFUSED not in seen, seen[-300:]


def test_two_sessions_of_one_agent_side_by_side_never_show_each_other(host: CoderHost) -> None:
    """A-2 (one socket per agent and session): four terminals of one agent at once, in
    sessions ``s1`` and ``S1`` (differing in case only) and two of 64 bytes differing in the
    last byte only (their sockets are past a socket address's length), each with a ``ctx
    agent attach``, a ``ctx agent watch`` and a raw watcher; what is typed in each is run and
    recorded in that session alone, and no watcher of one sees a byte of another's."""
    long_a, long_b = "x" * 63 + "a", "x" * 63 + "b"
    sessions = ["s1", "S1", long_a, long_b]
    terms = [host.start(session) for session in sessions]
    assert len({term.listening_at for term in terms}) == 4
    with closing_all() as opened:
        clients = {}
        for term in terms:
            trio = (
                CtxClient(host, "attach", "--session", term.session),
                CtxClient(host, "watch", "--session", term.session),
                Raw(term.listening_at, b"watch\n"),
            )
            opened += trio
            clients[term.session] = trio
        for trio in clients.values():
            assert all(client.shows(PROMPT) for client in trio)
        for session, letter in zip(sessions, "abcd", strict=True):
            clients[session][0].write(f"fs.read {letter}.txt\r".encode())
        for session, letter in zip(sessions, "abcd", strict=True):
            for client in clients[session]:
                assert client.shows(f"content of {letter}-{letter}"), (session, client.data)
        everyone = [client for trio in clients.values() for client in trio]
        got = dict(zip(everyone, settle_all(everyone), strict=True))
        for session, letter in zip(sessions, "abcd", strict=True):
            assert argv_of(host, session) == [[f"{letter}.txt"]], session
            seen = [got[client] for client in clients[session]]
            assert len(set(seen)) == 1, (session, seen)
            others = set("abcd") - {letter}
            for other in others:
                assert f"content of {other}-{other}".encode() not in seen[0], (session, other)
            assert seen[0].count(b"fs.read ") == 1, (session, seen[0])


def test_the_owner_attaches_the_agent_watches_and_anyone_else_is_refused_by_ctx(
    host: CoderHost, unprivileged_user: UnprivilegedUser
) -> None:
    """A-2 and the docs ("root and the owner of the storage root may watch and attach, the
    agent's own uid may watch; anyone else is refused with EACCES — by ctx agent watch|attach
    before it connects"): a stranger's ``ctx agent watch`` and ``attach`` are EACCES, exit 1,
    nothing shown; the agent's uid watches with ``ctx agent watch`` but its ``attach`` (with
    a command line piped in) is EACCES and nothing runs; once the stranger owns the storage
    root its ``ctx agent attach`` types a line that runs and every watcher sees, 70 raw
    watchers of its uid are all served (not counted among the agent's 64), and its ``ctx
    agent stop`` is EPERM (root started the terminal)."""
    term = host.start()
    stranger = unprivileged_user
    session = ("--session", term.session)
    with closing_all() as opened:
        operator = Raw(term.listening_at, b"attach\n")
        opened.append(operator)
        assert operator.shows(PROMPT)
        for verb in ("watch", "attach"):
            rc, out, err = ctx_as(
                stranger.uid, stranger.gid, host, "agent", verb, "coder", *session
            )
            assert (rc, out) == (1, ""), (verb, rc, out, err)
            assert err.startswith(f"ctx: EACCES: uid {stranger.uid} may not {verb}"), err

        agents_watch = CtxClient(host, "watch", *session, user=(host.uid, host.gid))
        opened.append(agents_watch)
        assert agents_watch.shows(PROMPT), agents_watch.data
        rc, out, err = ctx_as(
            host.uid, host.gid, host, "agent", "attach", "coder", *session,
            stdin=b"fs.read c.txt\r",
        )  # fmt: skip
        assert (rc, out) == (1, "") and err.startswith(f"ctx: EACCES: uid {host.uid}"), err

        with storage_owned_by(host, stranger.uid, stranger.gid):
            rc, out, err = ctx_as(
                stranger.uid, stranger.gid, host, "agent", "attach", "coder", *session,
                stdin=b"fs.read d.txt\r",
            )  # fmt: skip
            assert rc == 0 and "content of d-d" in out, (rc, out, err)
            assert CLOSED not in err, err
            crowd = as_uid(stranger.uid, stranger.gid, CROWD, str(term.listening_at), "70")
            assert crowd == {"served": 70, "refused": []}, crowd
            rc, out, err = ctx_as(
                stranger.uid, stranger.gid, host, "agent", "stop", "coder", *session
            )
            assert rc == 1 and err.startswith("ctx: EPERM: "), (rc, err)
        for client in (operator, agents_watch):
            assert client.shows("content of d-d"), client.data[-300:]
        assert b"content of c-c" not in operator.data
        assert agents_watch.proc.poll() is None
    assert argv_of(host, term.session) == [["d.txt"]]


# As some uid: COUNT watchers connected at once, each reading up to the prompt; how many were
# served, and what the others were told.
CROWD = r"""
import json, socket, sys
path, count = sys.argv[1], int(sys.argv[2])
held, served, refused = [], 0, []
for _ in range(count):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(b"watch\n")
    s.settimeout(10)
    data = b""
    try:
        while b"coder$ " not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    if b"coder$ " in data:
        served += 1
    else:
        refused.append(data.decode("latin-1")[:40])
    held.append(s)
print(json.dumps({"served": served, "refused": refused}), flush=True)
"""

# As the agent's uid: ROUNDS connections that come and go — after a whole mode line (unread
# scrollback), half-way through one, refused asking to attach, or without a byte — then 64
# watchers held at once and a 65th; what the 64 and the 65th were told.
CHURN = r"""
import json, socket, sys
path, rounds = sys.argv[1], int(sys.argv[2])
def connect(first):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    if first:
        try:
            s.sendall(first)
        except OSError:
            pass
    return s
for n in range(rounds):
    s = connect([b"watch\n", b"wat", b"attach\n", b""][n % 4])
    if n % 8 == 2:
        s.settimeout(5)
        try:
            s.recv(4096)
        except OSError:
            pass
    s.close()
def told(s):
    s.settimeout(10)
    data = b""
    try:
        while b"coder$ " not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data.decode("latin-1")
held = [connect(b"watch\n") for _ in range(64)]
answers = [told(s) for s in held]
extra = told(connect(b"watch\n"))
print(json.dumps({"served": sum("coder$ " in a for a in answers), "extra": extra}))
"""


def test_clients_that_come_and_go_in_a_loop_leave_every_place_and_descriptor_free(
    host: CoderHost,
) -> None:
    """Docs ("A client that closes its connection frees its place at once"; the agent's uid
    "holds at most 64 connections at once"): ``ctx agent watch`` and ``attach`` killed one
    after another, raw root clients closing before, during and after their mode line, and
    200 connections of the agent's uid that come and go in every way leave the terminal
    with the descriptors it had; that uid then still gets all its 64 places (the 65th is
    EAGAIN), and the operator is answered throughout."""
    term = host.start()
    pid = ctxterm_pid(term)
    with closing_all() as opened:
        operator = Raw(term.listening_at, b"attach\n")
        opened.append(operator)
        assert operator.shows(PROMPT)
        before = descriptors(pid)
        for n in range(6):
            verb = "attach" if n % 2 else "watch"
            client = CtxClient(host, verb, "--session", term.session)
            assert client.shows(PROMPT), client.data
            client.close()  # SIGKILL, as a closed window does
        for n in range(60):
            first = [b"", b"wat", b"watch\n", b"attach\n", b"watch\nfs.read"][n % 5]
            raw = Raw(term.listening_at, first, read=False)
            raw.close()
        operator.type("fs.read a.txt")
        assert operator.shows("content of a-a", seconds=5), operator.data[-300:]
        told = as_uid(host.uid, host.gid, CHURN, str(term.listening_at), "200")
        assert told["served"] == 64, told
        assert told["extra"].startswith("ctxterm: EAGAIN: the terminal serves 64"), told
        assert wait_for(lambda: descriptors(pid) == before, 10), (before, descriptors(pid))
        operator.type("fs.read b.txt")
        assert operator.shows("content of b-b", seconds=5), operator.data[-300:]
    assert argv_of(host, term.session) == [["a.txt"], ["b.txt"]]


def lifecycle(host: CoderHost, session: str) -> list[tuple]:
    return [
        (e["type"], e.get("reason"))
        for e in host.lifecycle(session)
        if e["type"] in ("terminal.started", "terminal.stopped")
    ]


def test_watch_and_attach_after_a_stop_an_exit_a_kill_and_each_restart(host: CoderHost) -> None:
    """A-1, A-2 and the docs' end of a terminal: with ``ctx agent watch``, ``attach`` and a
    raw client connected, ``ctx agent stop`` ends every one of them (the ``ctx`` ones exit 0
    saying the terminal closed the connection); watch and attach are then ENOENT, exit 1,
    naming the session and how to start it.  A restart of the same session is served on the
    same paths and its clients see only the new terminal's output, never the old one's;
    ``exit`` typed by one of several attachers ends it for all of them; after a ``kill -9``
    every client ends too, watch is ENOENT, and the next start cleans up and serves again."""
    session = f"s{uuid.uuid4().hex[:8]}"
    gone = f"ctx: ENOENT: no terminal of coder in session {session} is running; start one"

    def refused_now() -> None:
        for verb in ("watch", "attach"):
            again = host.ctx("agent", verb, "coder", "--session", session)
            assert (again.rc, again.out) == (1, "") and again.err.startswith(gone), again

    def all_end(clients: list, raws: list[Raw]) -> None:
        for client in clients:
            status, err = client.wait()
            assert status == 0 and CLOSED in err, (status, err)
        for raw in raws:
            assert raw.eof.wait(5), raw.data[-200:]

    with closing_all() as opened:
        first = host.start(session)
        watch = CtxClient(host, "watch", "--session", session)
        attach = CtxClient(host, "attach", "--session", session)
        raw = Raw(first.link, b"watch\n")
        opened += [watch, attach, raw]
        assert all(client.shows(PROMPT) for client in (watch, attach, raw))
        attach.write(b"fs.read a.txt\r")
        assert watch.shows("content of a-a") and raw.shows("content of a-a")
        assert host.ctx("agent", "stop", "coder", "--session", session).rc == 0
        host.started.remove(session)
        all_end([watch, attach], [raw])
        refused_now()

        second = host.start(session)
        assert (second.listening_at, second.link) == (first.listening_at, first.link)
        watchers = [CtxClient(host, "watch", "--session", session) for _ in range(2)]
        attachers = [CtxClient(host, "attach", "--session", session) for _ in range(2)]
        raw = Raw(second.link, b"watch\n")
        opened += [*watchers, *attachers, raw]
        everyone = [*watchers, *attachers, raw]
        assert all(client.shows(PROMPT) for client in everyone)
        attachers[1].write(b"fs.read b.txt\r")
        assert all(client.shows("content of b-b") for client in everyone)
        for data in settle_all(everyone):
            assert b"content of a-a" not in data, data
        attachers[0].write(b"exit\r")
        host.started.remove(session)
        all_end([*watchers, *attachers], [raw])
        assert wait_for(lambda: not os.path.lexists(second.listening_at), 10)
        refused_now()

        third = host.start(session)
        watch = CtxClient(host, "watch", "--session", session)
        raw = Raw(third.listening_at, b"attach\n")
        opened += [watch, raw]
        assert watch.shows(PROMPT) and raw.shows(PROMPT)
        assert b"content of" not in watch.data and b"exit" not in watch.data, watch.data
        os.kill(ctxterm_pid(third), signal.SIGKILL)
        all_end([watch], [raw])
        refused_now()

        fourth = host.start(session)
        watch = CtxClient(host, "watch", "--session", session)
        opened.append(watch)
        assert watch.shows(PROMPT)
        assert settle(watch) == PROMPT, watch.data
        assert fourth.listening_at == first.listening_at
    assert argv_of(host, session) == [["a.txt"], ["b.txt"]]
    assert lifecycle(host, session)[:5] == [
        ("terminal.started", None),
        ("terminal.stopped", "stop"),
        ("terminal.started", None),
        ("terminal.stopped", "exit"),
        ("terminal.started", None),
    ], lifecycle(host, session)


# ``ctx agent ARGS`` (after the agent's name; RUN stands for the running session) while a
# terminal runs in session ``up``: the exit status and what standard error says.
ODD_COMMANDS = [
    (["watch", "--json"], 2, "ctx: EINVAL: No such option '--json'"),
    (["attach", "--json"], 2, "ctx: EINVAL: No such option '--json'"),
    (["watch", "--session", ""], 2, "ctx: EINVAL: illegal session name: "),
    (["watch", "--session", "-"], 2, "ctx: EINVAL: illegal session name: "),
    (["watch", "--session", ".."], 2, "ctx: EINVAL: illegal session name: "),
    (["attach", "--session", "../RUN"], 2, "ctx: EINVAL: illegal session name: "),
    (["watch", "--session", "RUN/x"], 2, "ctx: EINVAL: illegal session name: "),
    (["watch", "--session", "RUN "], 2, "ctx: EINVAL: illegal session name: "),
    (["watch", "--session", "RUN.d"], 2, "ctx: EINVAL: illegal session name: "),
    (["watch", "--session", "x" * 65], 2, "ctx: EINVAL: illegal session name: "),
    (["watch", "--session", "r\u00fcn"], 2, "ctx: EINVAL: illegal session name: "),
    (["watch", "--session", "UP"], 1, "ctx: ENOENT: no terminal of coder in session UP "),
    (["attach", "--session", "UP"], 1, "ctx: ENOENT: no terminal of coder in session UP "),
    (["watch"], 1, "ctx: ENOENT: no terminal of coder in session default "),
]


def test_ctx_agent_watch_with_json_or_odd_session_names_connects_to_nothing(
    host: CoderHost,
) -> None:
    """A-2 (``ctx agent watch <agent> --session S``) and R-3 (session names): with a terminal
    running in session ``up``, ``--json`` (watch relays raw bytes) is a usage error, a name
    R-3 forbids is EINVAL (exit 2), and ``UP`` — legal, differing in case only — or no
    ``--session`` at all (``default``) is ENOENT naming that session; none of them reaches
    the running terminal (it holds no more descriptors), whose watcher sees nothing typed,
    though each was given a command line on its standard input."""
    term = host.start("up")
    pid = ctxterm_pid(term)
    with closing_all() as opened:
        watcher = Raw(term.listening_at, b"watch\n")
        opened.append(watcher)
        assert watcher.shows(PROMPT)
        before = descriptors(pid)
        for args, rc, said in ODD_COMMANDS:
            argv = [arg.replace("RUN", "up") for arg in args]
            done = host.ctx("agent", argv[0], "coder", *argv[1:], input=b"fs.read a.txt\r")
            assert done.rc == rc and done.out == "", done
            assert said in done.err and "Traceback" not in done.err, done
            assert descriptors(pid) == before, done
        assert settle(watcher, quiet=0.3) == PROMPT
    assert argv_of(host, "up") == []


def test_a_multiplexer_run_from_tsh_is_shared_by_every_client_and_exit_returns_to_tsh(
    host: CoderHost,
) -> None:
    """H-5 ("Interactive shells and multiplexers (bash, tmux, zellij) are ordinary tools;
    exit in them returns to tsh") with many clients: ``tmux`` started by one attacher takes
    input from a second attacher (``ctx agent attach``) and draws for every watcher, a
    watcher joining while it runs gets its screen from the scrollback, and ``exit`` typed by
    the second attacher ends tmux's shell and returns everyone to tsh's prompt, where calls
    go on; the session records the tmux call as one that ended with status 0."""
    term = host.start()
    with closing_all() as opened:
        first = Raw(term.listening_at, b"attach\n")
        second = CtxClient(host, "attach", "--session", term.session)
        watcher = CtxClient(host, "watch", "--session", term.session)
        opened += [first, second, watcher]
        assert first.shows(PROMPT) and second.shows(PROMPT) and watcher.shows(PROMPT)
        first.type("tmux")
        assert watcher.shows("[main]", seconds=10), watcher.data[-400:]  # tmux's status line
        assert wait_for(lambda: len(host.calls(term.session, "tmux", "tool_call")) == 1)
        # tmux's shell prompt is drawn before input is taken: wait for it.
        shell_prompt = lambda: watcher.data.count(b"$ ") > watcher.data.count(PROMPT)  # noqa: E731
        assert wait_for(shell_prompt, 10), watcher.data[-300:]
        second.write(b"echo inside-tmux-$((6*7))\r")
        for client in (first, second, watcher):
            assert client.shows("inside-tmux-42", seconds=10), client.data[-400:]
        late = Raw(term.listening_at, b"watch\n")
        opened.append(late)
        assert late.shows("inside-tmux-42"), late.data[-400:]
        second.write(b"exit\r")
        for client in (first, second, watcher, late):
            assert client.shows(PROMPT, 2 if client is not late else 1, seconds=10)
        assert late.shows("[exited]"), late.data[-300:]
        first.type("fs.read a.txt")
        for client in (first, second, watcher, late):
            assert client.shows("content of a-a"), client.data[-300:]
    assert wait_for(lambda: len(host.calls(term.session, "tmux", "tool_result")) == 1)
    result = host.calls(term.session, "tmux", "tool_result")[0]
    assert (result["status"], result["exit_status"]) == ("ok", 0), result
    assert argv_of(host, term.session) == [["a.txt"]]


# ------------------------------------------------------------------------ what ctx says


def test_a_ctx_watch_that_falls_behind_is_not_told_the_terminal_ended(host: CoderHost) -> None:
    """A-2 and the docs ("a client that takes none of it for two seconds, or falls more than
    1 MiB behind, is closed, while the other clients go on"; ``ctx agent watch`` leaves
    "saying on standard error that the terminal closed the connection" when the terminal
    ends): among several watchers, a ``ctx agent watch`` whose output is not read for a few
    seconds (a pager, a slow pipe) is let go with part of the output — and must not tell its
    user the terminal has ended when it runs on and serves the others."""
    term = host.start()
    with closing_all() as opened:
        operator = Raw(term.listening_at, b"attach\n")
        others = CtxClient(host, "watch", "--session", term.session)
        opened += [operator, others]
        assert operator.shows(PROMPT) and others.shows(PROMPT)
        reading, writing = os.pipe()
        slow = subprocess.Popen(
            [*CTX_ARGV, "agent", "watch", "coder", "--session", term.session],
            stdin=subprocess.DEVNULL, stdout=writing, stderr=subprocess.PIPE, env=host.env,
            start_new_session=True,
        )  # fmt: skip
        os.close(writing)
        try:
            time.sleep(1.0)
            for _ in range(2):
                operator.type("fs.read big.txt")
            assert operator.shows(BIG_END, 2, seconds=20) and operator.shows(PROMPT, 3)
            assert others.shows(BIG_END, 2, seconds=20)
            time.sleep(3.0)  # more than the two seconds a client may take nothing
            got = drained(reading, 15)
            slow.wait(timeout=5)
        finally:
            os.close(reading)
            if slow.poll() is None:
                slow.kill()
                slow.wait()
        assert slow.stderr is not None
        err = slow.stderr.read().decode()
        slow.stderr.close()
        assert got.count(BIG_END.encode()) < 2, "the watcher was not behind after all"
        operator.type("fs.read a.txt")
        assert others.shows("content of a-a"), "the terminal did not go on"
        assert "has ended" not in err, (slow.returncode, err)


def test_a_ctx_watch_the_terminal_turns_away_reports_the_terminals_errno(
    host: CoderHost,
) -> None:
    """Docs ("The agent's own uid ... holds at most 64 connections at once; the 65th is told
    ``ctxterm: EAGAIN: …`` and closed"): while 64 watchers of the agent's uid are connected,
    that uid's ``ctx agent watch`` is turned away; it ends with a non-zero status and says
    EAGAIN on standard error — the reason the terminal gave — not an errno of its own
    making."""
    term = host.start()
    holder = subprocess.Popen(
        [str(PYTHON), "-c", CROWD + "import sys; sys.stdin.readline()\n",
         str(term.listening_at), "64"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, user=host.uid,
        group=host.gid, extra_groups=[], cwd="/", start_new_session=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert json.loads(holder.stdout.readline()) == {"served": 64, "refused": []}
        rc, out, err = ctx_as(host.uid, host.gid, host, "agent", "watch", "coder",
                              "--session", term.session)  # fmt: skip
        assert rc not in (0, 128 + signal.SIGPIPE), (rc, out, err)
        assert err.startswith("ctx: EAGAIN"), (rc, out, err)
    finally:
        with contextlib.suppress(OSError):
            holder.stdin.close()  # type: ignore[union-attr]
        holder.kill()
        holder.wait()
