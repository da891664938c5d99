"""End-to-end flows of a third-party client of an agent's terminal socket (SPEC §8 A-1, A-2;
docs/tools.md "the terminal socket"): ``ctx agent start`` from a workspace, then hand-written
AF_UNIX clients on the place ``ctx agent start --json`` reports and on the session's A-2 link:
mode lines sent whole, glued to input, dribbled, never sent or malformed; several watchers
and attachers at once; a watcher that never reads; a client that half-closes; binary bytes
and a megabyte paste through ``attach``; who may connect by peer uid; the terminal stopped
with every kind of client connected.  ``ctx agent watch``/``attach`` run beside the raw
clients, and what they relay is compared byte for byte.

test_acceptance_terminal.py, test_acceptance_flows_terminals.py and tests/agents/test_terminal*.py
check the single claims (mode lines in pieces, exact mode lines, the 64-client bound, who may
watch); here they are met as a client author meets them.  Black-box: the installed ``ctx``,
real processes, PTYs, sockets, uids, FUSE views and bubblewrap sandboxes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    scratch_top,
    wait_for,
)
from tests.acceptance.terminalcli import CoderHost, Raw, coder_host
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
PROMPT = b"coder$ "
NOTE = "notes kept in the operator's workspace"
BIG_END = b"END-OF-THE-BIG-FILE"
PASTE = 1 << 20  # bytes the raw tool reads from the PTY
RAW_TAIL = b"\xff\xfe\xc3(\x1d\x00END-OF-RAW"  # what the raw tool prints last: not UTF-8
SCROLLBACK = 64 * 1024  # docs: "a new one first gets the last 64 KiB"
PYTHON = Path("/usr/bin/python3")  # for clients running as other uids

# A tool that puts the PTY in raw mode, says so, reads PASTE bytes and prints their SHA-256,
# then bytes that are not UTF-8 (a Ctrl-] and a NUL among them).
RAWSUM = f"""#!/bin/sh
stty raw -echo -iexten
printf 'READY\\n'
head -c {PASTE} | sha256sum
printf '\\377\\376\\303(\\035\\000END-OF-RAW'
stty sane
"""

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)


# ---------------------------------------------------------------------------------- the host


@pytest.fixture
def host(_template: Path) -> Iterator[CoderHost]:
    """Agent ``coder`` allowed ``fs.read`` and ``rawsum`` in both policies, and a workspace
    holding small notes and a file of about 400 KB that ends in :data:`BIG_END`."""
    files = {"notes.txt": NOTE + "\n"}
    files.update({f"{name}.txt": f"content of {name}-{name}\n" for name in "abc"})
    lines = "".join(f"line {n:06d} of a long listing\n" for n in range(12000))
    files["big.txt"] = lines + BIG_END.decode() + "\n"
    tools = ["fs.read", "rawsum"]
    with coder_host(_template, SCRATCH, tools, files) as host:
        host.install("rawsum", RAWSUM)
        for tool in tools:
            host.grant_in_tool(tool)
        yield host


# ------------------------------------------------------------------------------- the clients


class CtxClient:
    """``ctx agent watch|attach`` on pipes, its output collected in a thread."""

    def __init__(self, host: CoderHost, verb: str, session: str) -> None:
        argv = [*CTX_ARGV, "agent", verb, "coder", "--session", session]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=host.env, cwd=host.top, start_new_session=True,
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

    def end_input(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def wait(self, seconds: float = 20) -> tuple[int, str]:
        """Its exit status and standard error, once it has ended on its own."""
        assert self.proc.stderr is not None
        self.proc.wait(timeout=seconds)
        self.reader.join(timeout=5)
        return self.proc.returncode, self.proc.stderr.read().decode("utf-8", "replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
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
            thing.kill() if isinstance(thing, CtxClient) else thing.close()


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


def argv_of(host: CoderHost, session: str, tool: str = "fs.read") -> list[list[str]]:
    return [e["argv"] for e in host.calls(session, tool, "tool_call")]


# ------------------------------------------------------------------------------------ the flows


def test_mode_lines_glued_dribbled_missing_or_malformed_as_a_client_author_meets_them(
    host: CoderHost,
) -> None:
    """A-2 and its docs: input glued to ``attach\\n`` in one write is typed, glued to
    ``watch\\n`` it is ignored; an empty or binary first line is refused and closed; a mode
    line dribbled a byte at a time is served if it ends within ten seconds of the connect,
    while a client that sends none (or not all of it) in ten seconds is closed without a byte
    of output, and all this time the operator's typing is answered promptly."""
    term = host.start()
    with closing_all() as opened:
        operator = Raw(term.listening_at, b"attach\n")
        silent = Raw(term.listening_at)
        in_time = Raw(term.listening_at)
        too_slow = Raw(term.listening_at)
        opened += [operator, silent, in_time, too_slow]
        t0 = time.monotonic()
        assert operator.shows(PROMPT), operator.data

        glued = Raw(term.listening_at, b"attach\nfs.read notes.txt\r")
        ignored = Raw(term.listening_at, b"watch\nfs.read never-typed.txt\r")
        empty = Raw(term.listening_at, b"\n")
        binary = Raw(term.listening_at, b"\xff\xfe\x00attach\n")
        opened += [glued, ignored, empty, binary]
        assert glued.shows(NOTE), glued.data
        assert ignored.shows(NOTE), ignored.data  # it watches what the other typed
        for refused in (empty, binary):
            assert refused.eof.wait(5), refused.data
            assert refused.data.startswith(b"ctxterm: ") and PROMPT not in refused.data

        schedule = sorted(
            [(0.3 + 1.4 * n, in_time, byte) for n, byte in enumerate(b"watch\n")]
            + [(0.3 + 2.0 * n, too_slow, byte) for n, byte in enumerate(b"watch")]
            + [(11.0, too_slow, ord("\n"))],  # after its ten seconds
            key=lambda item: item[0],
        )
        typed = False
        for at, client, byte in schedule:
            time.sleep(max(0.0, t0 + at - time.monotonic()))
            client.send(bytes([byte]))
            if not typed and at > 3:  # the dribblers are half-way: the operator types
                typed = True
                operator.type("fs.read a.txt")
                assert operator.shows("content of a-a", seconds=3), operator.data[-300:]
        assert in_time.shows(PROMPT, seconds=3), in_time.data  # served: the scrollback
        assert "content of a-a" in in_time.data.decode(errors="replace")

        for dropped in (silent, too_slow):
            assert dropped.eof.wait(4), "a client without its mode line was kept"
            assert dropped.ended_at is not None
            assert 9.0 <= dropped.ended_at - dropped.connected <= 13.0, (
                dropped.ended_at - dropped.connected
            )
            assert dropped.data == b"", dropped.data
        assert not in_time.eof.is_set() and not operator.eof.is_set()
        operator.type("which fs.read")
        assert in_time.shows("/ctx/tool/fs.read"), in_time.data[-300:]
        assert not ignored.eof.is_set()

    assert wait_for(lambda: len(host.calls(term.session, "fs.read", "tool_result")) == 2)
    assert argv_of(host, term.session) == [["notes.txt"], ["a.txt"]]


def test_a_watcher_that_never_reads_is_let_go_and_a_late_one_gets_the_last_64_kib(
    host: CoderHost,
) -> None:
    """A-2 and its docs ("a client that takes none of it for two seconds ... is closed, while
    the other clients go on"; "a new one first gets the last 64 KiB"): a watcher that never
    reads costs the operator nothing and finds its connection closed, short of the output;
    a raw watcher and ``ctx agent watch`` that come later both get exactly the last 64 KiB
    the operator saw, then the same bytes as each other."""
    term = host.start()
    with closing_all() as opened:
        operator = Raw(term.listening_at, b"attach\n")
        stalled = Raw(term.listening_at, b"watch\n", read=False, rcvbuf=4096)
        opened += [operator, stalled]
        assert operator.shows(PROMPT)
        began = time.monotonic()
        operator.type("fs.read big.txt")
        assert operator.shows(BIG_END, seconds=10), operator.data[-300:]
        assert operator.shows(PROMPT, 2)
        assert time.monotonic() - began < 5, "the operator waited for a client that never reads"

        time.sleep(2.6)  # more than two seconds in which it took nothing
        got, closed = stalled.drain()
        assert closed, "a watcher that took nothing for two seconds was kept"
        assert BIG_END not in got and len(got) < len(operator.data), len(got)

        seen = settle(operator)
        late = Raw(term.listening_at, b"watch\n")
        watch = CtxClient(host, "watch", term.session)
        opened += [late, watch]
        assert settle(late) == seen[-SCROLLBACK:], (len(late.data), late.data[:80])
        assert len(late.data) == SCROLLBACK
        assert settle(watch) == late.data  # ctx agent watch relays the bytes as they are

        operator.type("which fs.read")
        assert late.shows("/ctx/tool/fs.read") and watch.shows("/ctx/tool/fs.read")
        assert settle(watch) == settle(late)
        assert not late.eof.is_set() and watch.proc.poll() is None


def test_binary_input_and_a_megabyte_paste_reach_a_raw_tool_whole(host: CoderHost) -> None:
    """A-2 ("then raw PTY bytes flow"): a command line that is not UTF-8 is refused like any
    other and tsh goes on; 1 MiB of random bytes (Ctrl-C, Ctrl-D, Ctrl-], NUL among them)
    sent by a raw attach client reaches a tool that put the PTY in raw mode byte for byte, and
    what the tool prints that is not UTF-8 reaches a raw watcher and ``ctx agent watch``
    untouched.  ``ctx agent attach`` fed from a pipe does the same (its one special byte,
    Ctrl-], left out)."""
    term = host.start()
    with closing_all() as opened:
        operator = Raw(term.listening_at, b"attach\n")
        watcher = Raw(term.listening_at, b"watch\n")
        watch = CtxClient(host, "watch", term.session)
        opened += [operator, watcher, watch]
        assert operator.shows(PROMPT) and watch.shows(PROMPT)

        operator.type(b"\xff\xfe\xc3( \x80")
        assert operator.shows("not a tool on CTX_PATH"), operator.data[-300:]
        assert operator.shows(PROMPT, 2)

        special = bytes([0x03, 0x04, 0x1D, 0x00, 0x11, 0x13, 0x1A, 0x7F, 0x0D, 0x0A])
        paste = special + os.urandom(PASTE - len(special))
        operator.type("rawsum")
        assert operator.shows("READY\n"), operator.data[-300:]
        operator.send(paste)
        digest = hashlib.sha256(paste).hexdigest().encode()
        assert operator.shows(digest + b"  -\n", seconds=20), operator.data[-300:]
        for client in (operator, watcher, watch):
            assert client.shows(digest + b"  -\n" + RAW_TAIL + PROMPT), client.data[-300:]
        assert paste[100:140] not in watcher.data  # raw, without echo: never shown

        attach = CtxClient(host, "attach", term.session)
        opened.append(attach)
        assert attach.shows(PROMPT)
        attach.write(b"rawsum\r")
        assert watcher.shows("READY\n", 2), watcher.data[-300:]
        piped = paste.replace(b"\x1d", b"\x1c")
        attach.write(piped)
        attach.end_input()
        status, err = attach.wait()
        assert status == 0 and "closed the connection" not in err, err
        digest = hashlib.sha256(piped).hexdigest().encode()
        assert digest + b"  -\n" + RAW_TAIL in attach.data, attach.data[-300:]
        assert watch.shows(digest) and watcher.shows(digest)

        operator.type("fs.read notes.txt")
        assert watcher.shows(NOTE) and watch.shows(NOTE)
        assert settle(watch)[-2000:] == settle(watcher)[-2000:]
    results = host.calls(term.session, "rawsum", "tool_result")
    assert [(e["status"], e["exit_status"]) for e in results] == [("ok", 0), ("ok", 0)], results


def test_a_nul_byte_in_a_typed_line_costs_that_line_only(host: CoderHost) -> None:
    """A-2, H-1 and the docs ("What an attached client types reaches tsh whole"; a command
    line is a tool and its arguments, anything else refused): a line holding a NUL byte is
    answered on its own, and the next line typed runs as typed."""
    term = host.start()
    with closing_all() as opened:
        operator = Raw(term.listening_at, b"attach\n")
        opened.append(operator)
        assert operator.shows(PROMPT)
        operator.type(b"abc\x00def")
        operator.type("fs.read notes.txt")
        shown = operator.shows(NOTE, seconds=1.5)
        assert shown, operator.data.decode(errors="replace")
        assert operator.shows(PROMPT, 3), operator.data.decode(errors="replace")
    assert argv_of(host, term.session) == [["notes.txt"]]


def test_a_client_that_half_closes_its_side_still_reads_the_terminal(host: CoderHost) -> None:
    """A-2 (``watch`` = read PTY output only; docs: "output to every client"): a watcher that
    shuts down its sending side after its mode line, as ``nc -N`` or ``socat`` do at the end
    of their input, goes on receiving what the terminal prints; an attach client that sends
    its line and half-closes gets the answer to it."""
    term = host.start()
    with closing_all() as opened:
        operator = Raw(term.listening_at, b"attach\n")
        quiet = Raw(term.listening_at, b"watch\n")
        quiet.sock.shutdown(socket.SHUT_WR)
        opened += [operator, quiet]
        assert operator.shows(PROMPT) and quiet.shows(PROMPT)
        time.sleep(0.5)
        operator.type("fs.read a.txt")
        assert operator.shows("content of a-a")
        one_shot = Raw(term.listening_at, b"attach\nfs.read b.txt\r")
        one_shot.sock.shutdown(socket.SHUT_WR)
        opened.append(one_shot)
        assert wait_for(lambda: len(host.calls(term.session, "fs.read", "tool_result")) == 2)
        assert operator.shows("content of b-b")
        assert quiet.shows("content of a-a", seconds=1.5), quiet.data
        assert one_shot.shows("content of b-b", seconds=1.5), one_shot.data


# A client of the terminal socket run as another uid: connects to argv[1] (from its
# directory), sends the mode line argv[2] (a terminal that refused the uid at once may have
# closed already), reads until EOF or the prompt; prints {"errno", "data"} as JSON.
PEER = r"""
import json, os, socket, sys
out = {"errno": None, "data": ""}
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    os.chdir(os.path.dirname(sys.argv[1]))  # a path of any length
    s.connect(os.path.basename(sys.argv[1]))
except OSError as exc:
    out["errno"] = exc.errno
else:
    try:
        s.sendall(sys.argv[2].encode() + b"\n")
    except OSError:
        pass
    s.settimeout(10)
    data = b""
    while b"coder$ " not in data:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:  # closed with our mode line unread
            chunk = b""
        if not chunk:
            data += b"<EOF>"
            break
        data += chunk
    out["data"] = data.decode("latin-1")
print(json.dumps(out))
"""


def test_the_peers_uid_decides_who_connects_not_its_groups(
    host: CoderHost, unprivileged_user: UnprivilegedUser
) -> None:
    """A-2 and its docs: where the terminal listens the socket is root's and 0666 in a
    root-owned 0711 directory beside a 0700 ``private/``; the session's link leads there
    through the alias.  A second uid that holds the agent's gid is refused by the terminal
    (``ctxterm: EACCES``, no output), and the link in the agent's 0700 session directory is
    out of its reach (EACCES); the agent's uid with another gid watches but may not attach."""
    if not PYTHON.exists():
        pytest.skip("no /usr/bin/python3 for a client running as another uid")
    term = host.start()
    sock = os.lstat(term.listening_at)
    assert stat.S_ISSOCK(sock.st_mode) and sock.st_uid == 0, sock
    assert stat.S_IMODE(sock.st_mode) == 0o666, oct(sock.st_mode)
    for directory, mode in ((term.rundir, 0o711), (term.rundir / "private", 0o700)):
        held = directory.stat()
        assert (held.st_uid, stat.S_IMODE(held.st_mode)) == (0, mode), (directory, held)
    alias = Path(os.readlink(term.link))
    assert alias == Path(f"/run/cortexfs/terminal/{host.uid}/coder/{term.session}/main.sock")
    assert Path(os.readlink(alias)) == term.listening_at

    def peer(uid: int, gid: int, groups: list[int], path: Path, mode: str) -> dict:
        done = subprocess.run(
            [str(PYTHON), "-c", PEER, str(path), mode], capture_output=True, text=True,
            user=uid, group=gid, extra_groups=groups, cwd="/", timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    stranger = unprivileged_user
    for mode in ("watch", "attach"):
        told = peer(stranger.uid, stranger.gid, [host.gid], term.listening_at, mode)
        assert told["data"].startswith(f"ctxterm: EACCES: uid {stranger.uid} may not"), told
        assert told["data"].endswith("<EOF>") and "coder$" not in told["data"], told
    told = peer(stranger.uid, host.gid, [], term.link, "watch")
    assert told["errno"] == 13, told  # the session directory is the agent's: EACCES
    watched = peer(host.uid, stranger.gid, [], term.listening_at, "watch")
    assert "coder$ " in watched["data"] and "ctxterm" not in watched["data"], watched
    refused = peer(host.uid, stranger.gid, [], term.link, "attach")
    assert refused["data"].startswith("ctxterm: EACCES: "), refused


def test_several_attachers_type_in_turn_then_a_stop_lets_every_client_go(host: CoderHost) -> None:
    """A-2, A-1 and the docs' end of a terminal: two raw attach clients and ``ctx agent
    attach`` each type a line, which runs once and every client sees; then ``ctx agent stop``
    with a reading watcher, one that never reads, one that sent no mode line and one half-way
    through it returns promptly, every raw client sees EOF, ``ctx agent watch|attach`` leave
    with 0 saying the terminal closed the connection, and socket, alias, link and run
    directory are gone (a new connect is ENOENT)."""
    term = host.start()
    with closing_all() as opened:
        first = Raw(term.listening_at, b"attach\n")
        second = Raw(term.link, b"attach\n")  # through A-2's link and the alias
        watcher = Raw(term.listening_at, b"watch\n")
        attach = CtxClient(host, "attach", term.session)
        watch = CtxClient(host, "watch", term.session)
        opened += [first, second, watcher, attach, watch]
        everyone = (first, second, watcher, attach, watch)
        assert all(client.shows(PROMPT) for client in everyone)
        for n, (typist, name) in enumerate(((first, "a"), (second, "b"), (attach, "c"))):
            line = f"fs.read {name}.txt\r".encode()
            if isinstance(typist, CtxClient):
                typist.write(line)
            else:
                typist.send(line)
            for client in everyone:
                assert client.shows(f"content of {name}-{name}"), (n, client.data[-300:])
            assert wait_for(
                lambda n=n: len(host.calls(term.session, "fs.read", "tool_call")) == n + 1
            )
        assert argv_of(host, term.session) == [["a.txt"], ["b.txt"], ["c.txt"]]

        stalled = Raw(term.listening_at, b"watch\n", read=False, rcvbuf=4096)
        mute = Raw(term.listening_at)
        halfway = Raw(term.listening_at, b"atta")
        opened += [stalled, mute, halfway]
        first.type("fs.read big.txt")
        assert watcher.shows(BIG_END), watcher.data[-300:]
        pid = int((term.rundir / "pid").read_text())
        began = time.monotonic()
        stopped = host.ctx("agent", "stop", "coder", "--session", term.session, "--json")
        assert stopped.rc == 0, stopped
        assert time.monotonic() - began < 6, "the stop waited on clients"
        assert stopped.json() == {"agent": "coder", "session": term.session, "pid": pid}
        for client in (first, second, watcher, mute, halfway):
            assert client.eof.wait(5), client.data[-200:]
        assert mute.data == b"" and halfway.data == b""
        assert stalled.drain(5)[1], "the stalled watcher's connection stayed open"
        for client in (attach, watch):
            status, err = client.wait()
            assert status == 0 and "closed the connection" in err, (status, err)

    assert not os.path.lexists(term.listening_at) and not term.rundir.exists()
    assert not os.path.lexists(term.link)
    assert not os.path.lexists(f"/run/cortexfs/terminal/{host.uid}/coder/{term.session}")
    with (
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe,
        pytest.raises(FileNotFoundError),
    ):
        probe.connect(str(term.listening_at))
    again = host.ctx("agent", "watch", "coder", "--session", term.session)
    assert again.rc == 1 and "ENOENT" in again.err, again
