"""``ctx session show``, ``tail [--follow] [--json]`` and ``repair`` at unusual moments (SPEC
§4 S-1, S-2, S-5, S-6; docs/sessions.md "Reading, torn lines and repair" and "Commands").

A follower runs while other processes append to its session (the documented Python API from
several processes at once, and raw writes of torn, damaged, non-UTF-8 and overlong lines),
while ``repair`` cuts a torn line, while the session's file or directory is renamed away,
removed, or replaced by a link, a FIFO or a directory, and while its own standard output is
a pipe nobody reads, a pipe whose reader left, or ``/dev/full``.  Sessions live in a home and
in a shared space, the latter followed by a member of the space who is not the agent.

What must hold: every complete event is printed exactly once, in file order, never a torn
fragment; what the follower held when the name moved on is printed before it ends or goes
on; its notes name the lines ``show`` names; Ctrl-C ends it with exit 0 whatever it is doing,
SIGTERM and SIGHUP end it as those signals end a program, a reader that left ends it with
141 and an output that cannot be written with 74; and no reader changes the file, its modes
or its directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import json
import os
import shutil
import signal
import stat
import subprocess
import termios
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    OnStorage,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    wait_for,
)
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acts as other uids: needs root")

AGENT = "coder"
SPACE = "follow-space"
TS = "2026-06-22T12:00:00Z"
PYTHON = str(REPO / ".venv" / "bin" / "python")
AGENT_UID_OFFSET = 7  # the shared session's agent: another uid than the member who follows

# Records COUNT events tagged TAG through the documented API (docs/sessions.md, "For workers
# and other callers"), in a home (WHERE is the uid) or in a shared space (WHERE is its name).
API_WRITER = """\
import sys
from pathlib import Path
from cortexfs.shared.sessions import SessionRef, open_session
from cortexfs.shared.tree import Ownership

root, kind, where, agent, name, uid, gid, count, tag = sys.argv[1:10]
if kind == "home":
    ref = SessionRef.home(Path(root), int(where), agent, name)
else:
    ref = SessionRef.shared(Path(root), where, agent, name)
with open_session(ref, owner=Ownership(int(uid), int(gid))) as session:
    for seq in range(int(count)):
        session.record("api.note", object="test/" + tag, status="ok",
                       durable_event=seq % 16 == 0, writer=tag, seq=seq)
"""


@dataclass
class World(OnStorage):
    storage: Path
    top: Path
    user: UnprivilegedUser  # the home's agent, and the member of the space

    @property
    def agent_uid(self) -> int:
        """The uid of the agent that records in the shared space (no account needed)."""
        return self.user.uid + AGENT_UID_OFFSET

    def home_dir(self, session: str) -> Path:
        home = self.storage / "home" / str(self.user.uid)
        return home / "agent" / AGENT / "session" / session

    def shared_dir(self, session: str) -> Path:
        return self.storage / "shared" / SPACE / "agent" / AGENT / "session" / session

    def home_args(self, session: str) -> list[str]:
        return [AGENT, session, "--uid", str(self.user.uid)]

    def shared_args(self, session: str) -> list[str]:
        return [AGENT, session, "--project", SPACE]

    def writer(self, session: str, count: int, tag: str, *, shared: bool = False, uid=None):
        """The API writer recording COUNT events in SESSION, started in the background: in
        the space (as its agent's uid), else in the home of ``uid`` (default: the user's)."""
        if shared:
            kind, where, owner = "shared", SPACE, self.agent_uid
        else:
            owner = self.user.uid if uid is None else uid
            kind, where = "home", str(owner)
        argv = [PYTHON, "-c", API_WRITER, str(self.storage), kind, where, AGENT, session,
                str(owner), str(self.user.gid), str(count), tag]  # fmt: skip
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=clean_env(), cwd=self.top)  # fmt: skip

    def record(self, session: str, count: int, tag: str, **where) -> None:
        proc = self.writer(session, count, tag, **where)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()

    def home_session(self, session: str, count: int = 2) -> Path:
        """A home session made by the API, holding COUNT events: its events.jsonl."""
        self.record(session, count, session)
        return self.home_dir(session) / "events.jsonl"


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    top = new_scratch_dir(scratch_top(__file__))
    try:
        user = find_or_create_user()
        storage = top / "storage"
        r = ctx_run("bootstrap", "--storage", storage)
        assert r.rc == 0, r
        group = grp.getgrgid(user.gid).gr_name
        r = ctx_run("shared", "create", SPACE, "--group", group,
                    env=clean_env(CTX_STORAGE=str(storage)))  # fmt: skip
        assert r.rc == 0, r
        yield World(storage, top, user)
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------ helpers


def event_line(kind: str, **facts: object) -> bytes:
    event = {"ts": TS, "type": kind, "agent": AGENT, "session": "s", "object": "test/raw",
             "status": "ok", **facts}  # fmt: skip
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def append(path: Path, data: bytes) -> None:
    """``data`` appended with one write on an O_APPEND descriptor, as S-5 appends."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def whole_events(path: Path) -> list[dict]:
    """The events of the complete lines of ``path`` that hold one (what readers print)."""
    found = []
    for raw in path.read_bytes().split(b"\n")[:-1]:
        if len(raw) >= 64 << 10:  # longer than any event: a damaged line
            continue
        with contextlib.suppress(ValueError):
            value = json.loads(raw.decode())
            if isinstance(value, dict) and "ts" in value:
                found.append(value)
    return found


def fingerprint(path: Path) -> tuple:
    status = os.lstat(path)
    return (status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns,
            status.st_mode, status.st_uid, status.st_gid, status.st_nlink)  # fmt: skip


def blocked_writing(pid: int, read_end: int) -> bool:
    """Whether process ``pid`` waits in a write to the full pipe whose read end is
    ``read_end`` (the kernel's wait channel says so; else the pipe holds nearly 64 KiB)."""
    with contextlib.suppress(OSError):
        channel = Path(f"/proc/{pid}/wchan").read_text()
        if channel not in ("", "0"):
            return "pipe_write" in channel and pipe_bytes(read_end) > 0
    return pipe_bytes(read_end) >= 60_000


def pipe_bytes(fd: int) -> int:
    """How many bytes wait in the pipe whose read end is ``fd``."""
    held = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, held)
    return int.from_bytes(held, "little")


def drain(fd: int) -> bytes:
    """Everything the pipe's read end ``fd`` gives until its writers are gone."""
    taken = []
    while chunk := os.read(fd, 1 << 16):
        taken.append(chunk)
    return b"".join(taken)


class Follower:
    """``ctx session tail ARGS --follow`` in the background, its stdout and stderr in files
    (or stdout on ``stdout``, a descriptor the caller keeps)."""

    def __init__(self, world: World, *args: str, stdout: int | None = None, user=None):
        stamp = time.monotonic_ns()
        self.out = world.top / f"follow-{stamp}.out"
        self.err = world.top / f"follow-{stamp}.err"
        self.argv = ["session", "tail", *args, "--follow"]
        as_user = {}
        if user is not None:
            as_user = {"user": user.uid, "group": user.gid, "extra_groups": []}
        with self.out.open("wb") as o, self.err.open("wb") as e:
            self.proc = subprocess.Popen(
                [*CTX_ARGV, *self.argv], stdout=o if stdout is None else stdout, stderr=e,
                stdin=subprocess.DEVNULL, env=world.env, start_new_session=True, **as_user,
            )  # fmt: skip

    def printed(self) -> bytes:
        return self.out.read_bytes()

    def count(self) -> int:
        return self.printed().count(b"\n")

    def json(self) -> list:
        return [json.loads(text) for text in self.printed().decode().split("\n") if text]

    def said(self) -> str:
        return self.err.read_text()

    def signal(self, signum: int, seconds: float = 10) -> int | None:
        """Send ``signum``; the exit status if it ends within ``seconds``, else None."""
        self.proc.send_signal(signum)
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def interrupt(self, seconds: float = 10) -> int | None:
        return self.signal(signal.SIGINT, seconds)

    def run(self) -> Run:
        return Run(self.argv, self.proc.returncode, self.printed().decode(), self.said())

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


@contextlib.contextmanager
def following(world: World, *args: str, **kw) -> Iterator[Follower]:
    follower = Follower(world, *args, **kw)
    try:
        yield follower
    finally:
        follower.close()


# ------------------------------------------------------------------ torn lines and repair


def test_a_line_torn_then_completed_and_a_fragment_repair_cut_are_followed_once(world):
    """S-5, docs/sessions.md ("Readers ignore it (``ctx session show`` mentions it), and ``ctx
    session repair`` truncates it"; ``repair --json`` prints ``{"session", "truncated_bytes",
    "tightened", "left"}``): a follower starts on a session whose last line is torn (it says
    so); the writer completes that line, and the event is printed once, whole; a second
    fragment is cut by ``repair`` while the follower runs, which is no shrink of what it read
    (no note); the next API event is printed.  What it printed is the file's events, in order,
    and Ctrl-C ends it with exit 0."""
    session = "torn-then-whole"
    path = world.home_session(session)
    finished = event_line("finished", n=1)
    append(path, finished[:25])
    with following(world, *world.home_args(session), "--json") as follower:
        torn_note = f"{path} ends with a torn line of 25 bytes"
        assert wait_for(lambda: torn_note in follower.said() and follower.count() == 2, 20)
        time.sleep(0.5)  # a few polls see the unfinished line
        append(path, finished[25:])
        assert wait_for(lambda: follower.count() == 3, 20), follower.said()

        append(path, b'{"ts":"2026-06-22T12:00:01Z","type":"never-fin')
        repaired = world.ctx("session", "repair", *world.home_args(session), "--json")
        assert repaired.rc == 0, repaired
        assert repaired.json() == {
            "session": f"home/{world.user.uid}/agent/{AGENT}/session/{session}",
            "truncated_bytes": 46,
            "tightened": [],
            "left": [],
        }, repaired
        world.record(session, 1, "after-repair")
        assert wait_for(lambda: follower.count() == 4, 20), follower.said()
        time.sleep(0.4)  # nothing more comes
        assert follower.interrupt() == 0
        assert follower.json() == whole_events(path)
        assert "shrank" not in follower.said() and "Traceback" not in follower.said()
    assert path.read_bytes().endswith(b"\n")


def test_a_torn_line_longer_than_any_event_completed_by_a_glued_event_prints_that_event(world):
    """S-5, docs/sessions.md (a longer unterminated last line is a torn line like any other;
    a longer complete line is damaged, "its last 64 KiB are still searched for a glued
    event"): a follower starts on a session ending with 200 KiB of an unfinished line; the
    line is then finished by a whole event glued to it.  The follower prints that event
    alone, none of the padding, and says it skipped nothing it should have printed."""
    session = "huge-torn"
    path = world.home_session(session)
    fragment = b'{"ts":"' + b"q" * (200 << 10)
    append(path, fragment)
    glued = event_line("glued", n=2)
    with following(world, *world.home_args(session), "--json") as follower:
        note = f"ends with a torn line of {len(fragment)} bytes"
        assert wait_for(lambda: note in follower.said() and follower.count() == 2, 20)
        append(path, glued)
        assert wait_for(lambda: follower.count() == 3, 20), follower.said()
        time.sleep(0.4)
        assert follower.interrupt() == 0
        assert follower.json()[-1] == json.loads(glued)
        assert b"qqqqqqqq" not in follower.printed()
        assert "Traceback" not in follower.said()


# ------------------------------------------------------------------ many writers, shared space


def test_a_member_follows_a_shared_session_four_writers_fill_and_never_a_home_session(world):
    """S-1, S-5, S-6, docs/sessions.md (a session in a shared space is the agent's uid's and
    the space's group's, 0660; a home session is the agent's alone): a member of the space
    who is not the agent follows a shared session with ``--project`` while four processes
    record through the API at once, and a raw writer adds a line holding no event.  It prints
    every event once, in file order, and names the damaged line; the same member following
    a home session of another uid is refused with EACCES naming the directory, exit 1."""
    session = "crowd"
    world.record(session, 1, "first", shared=True)
    path = world.shared_dir(session) / "events.jsonl"
    status = os.lstat(path)
    assert (status.st_uid, stat.S_IMODE(status.st_mode)) == (world.agent_uid, 0o660)
    with following(world, *world.shared_args(session), "--json", user=world.user) as follower:
        assert wait_for(lambda: follower.count() == 1, 20), follower.said()
        writers = [world.writer(session, 60, f"w{n}", shared=True) for n in range(4)]
        append(path, b"[1, 2, 3]\n")
        for proc in writers:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err.decode()
        final = whole_events(path)
        assert len(final) == 241
        assert wait_for(lambda: follower.count() == 241, 20), follower.said()
        time.sleep(0.4)
        assert follower.interrupt() == 0
        assert follower.json() == final
        assert "skipped damaged lines" in follower.said(), follower.said()
        for tag in ("w0", "w1", "w2", "w3"):
            assert [e["seq"] for e in final if e.get("writer") == tag] == list(range(60))

    world.record("private", 1, "private", uid=world.agent_uid)
    others = [AGENT, "private", "--uid", str(world.agent_uid)]
    with following(world, *others, user=world.user) as outsider:
        assert wait_for(lambda: outsider.proc.poll() is not None, 20)
        r = outsider.run()
    assert r.rc == 1 and "EACCES" in r.err and str(world.storage / "home") in r.err, r
    assert r.out == "" and "Traceback" not in r.err, r


# ------------------------------------------------------------------ the name moves on


@pytest.mark.parametrize("planted", ["link", "fifo", "directory", "session-link"])
def test_a_follower_prints_what_it_held_before_a_non_regular_file_takes_the_name(world, planted):
    """S-5, docs/sessions.md ("A file renamed away (a rotation) or removed is first read to
    its end, so a follower that fell behind (stopped, or held by a full pipe) prints every
    event it held"; a link, FIFO or directory at events.jsonl is refused, ``EINVAL``): a
    follower falls behind (stopped); an event is appended; the file (or the whole session
    directory) is renamed away and a link, a FIFO or a directory put at its name.  Going on,
    the follower prints the event it held, then ends with exit 1 naming the path."""
    session = f"swap-{planted}"
    path = world.home_session(session)
    directory = path.parent
    with following(world, *world.home_args(session), "--json") as follower:
        assert wait_for(lambda: follower.count() == 2, 20), follower.said()
        follower.proc.send_signal(signal.SIGSTOP)
        try:
            append(path, event_line("unread", n=3))
            expected = whole_events(path)
            if planted == "session-link":
                directory.rename(directory.with_name(session + ".moved"))
                directory.symlink_to(session + ".moved")
            else:
                path.rename(path.with_name("events.jsonl.1"))
                if planted == "link":
                    path.symlink_to("events.jsonl.1")
                elif planted == "fifo":
                    os.mkfifo(path)
                else:
                    path.mkdir()
        finally:
            follower.proc.send_signal(signal.SIGCONT)
        assert wait_for(lambda: follower.proc.poll() is not None, 20), "the follower went on"
        r = follower.run()
    assert r.rc == 1 and "Traceback" not in r.err, r
    assert str(directory) in r.err.splitlines()[-1], r
    printed = [json.loads(text) for text in r.lines()]
    assert printed[:-1] == expected, r
    assert printed[-1]["error"] in ("EINVAL", "ENOTDIR", "ELOOP"), r


def test_a_session_directory_renamed_away_and_back_is_read_to_its_end_then_again(world):
    """S-1, S-5, docs/sessions.md (a file renamed away is first read to its end; one that is
    removed is waited for, with a note, and read from its start when a file is there again):
    a stopped follower's session directory gets one more event and is renamed away; going
    on, the follower prints that event and says the file is gone.  Renamed back, the file
    is read from its start (a note says so), and a later event is printed."""
    session = "moved-dir"
    path = world.home_session(session)
    directory = path.parent
    moved = directory.with_name(session + ".moved")
    with following(world, *world.home_args(session), "--json") as follower:
        assert wait_for(lambda: follower.count() == 2, 20), follower.said()
        follower.proc.send_signal(signal.SIGSTOP)
        try:
            append(path, event_line("unread", n=3))
            first = whole_events(path)
            directory.rename(moved)
        finally:
            follower.proc.send_signal(signal.SIGCONT)
        gone = f"ctx: note: {path} is gone: waiting for it to appear again"
        assert wait_for(lambda: gone in follower.said(), 20), follower.said()
        assert wait_for(lambda: follower.count() == 3, 20), follower.said()
        moved.rename(directory)
        again = f"ctx: note: {path} appeared again: following it again from its start"
        assert wait_for(lambda: again in follower.said(), 20), follower.said()
        world.record(session, 1, "after-return")
        final = whole_events(path)
        assert wait_for(lambda: follower.count() == 3 + len(final), 20), follower.said()
        time.sleep(0.4)
        assert follower.interrupt() == 0
        assert follower.json() == first + final


# ------------------------------------------------------------------ damaged lines


def test_a_follower_names_an_appended_damaged_line_by_the_number_show_gives_it(world):
    """S-5, docs/sessions.md ("a damaged line appended while it follows is skipped with the
    note ``show`` prints (``ctx: note: skipped damaged lines N of PATH``)"): a session holds
    ten events; while ``tail -n 2 --follow`` runs, a line of non-UTF-8 bytes is appended,
    then an event.  ``show`` calls it line 11; so does the follower."""
    session = "numbered"
    path = world.home_session(session, 10)
    with following(world, *world.home_args(session), "-n", "2", "--json") as follower:
        assert wait_for(lambda: follower.count() == 2, 20), follower.said()
        append(path, b"\xff\xfe\x80 not text\n" + event_line("after", n=12))
        assert wait_for(lambda: follower.count() == 3, 20), follower.said()
        assert wait_for(lambda: "skipped damaged" in follower.said(), 5), follower.said()
        shown = world.ctx("session", "show", *world.home_args(session))
        assert shown.rc == 0 and f"skipped damaged lines 11 of {path}" in shown.err, shown
        assert follower.interrupt() == 0
        assert f"ctx: note: skipped damaged lines 11 of {path}" in follower.said()


def test_lines_that_are_json_but_no_event_are_skipped_and_json_output_stays_events(world):
    """S-2, S-5, docs/sessions.md ("A complete line that holds no event is reported as
    damaged and skipped"; ``show --json`` and ``tail --json`` print JSON Lines, "the events
    themselves"): a session holds events between lines that are JSON but no event (a list,
    a string, a number, null, an object without ``ts``) and a line of non-UTF-8 bytes.
    ``show --json``, ``tail -n 3 --json`` and a follower print only the events, each an
    object whose first key is ``ts``; the notes name the damaged lines' numbers."""
    session = "json-not-events"
    path = world.home_session(session, 1)
    noise = [b"[1, 2]", b'"text"', b"42", b"null", b'{"type":"no ts"}', b"\xc3\x28\xa0\xa1"]
    for n, raw in enumerate(noise):
        append(path, raw + b"\n" + event_line("kept", n=n))
    expected = whole_events(path)
    assert len(expected) == 7
    damaged = "skipped damaged lines 2, 4, 6, 8, 10, 12 of"
    shown = world.ctx("session", "show", *world.home_args(session), "--json")
    assert shown.rc == 0 and damaged in shown.err, shown
    tail = world.ctx("session", "tail", *world.home_args(session), "-n", "3", "--json")
    assert tail.rc == 0, tail
    for r, want in ((shown, expected), (tail, expected[-3:])):
        printed = [json.loads(text) for text in r.lines()]
        assert printed == want, r
        assert all(next(iter(e)) == "ts" for e in printed), r
    with following(world, *world.home_args(session), "-n", "0", "--json") as follower:
        time.sleep(0.5)
        append(path, b"[]\n" + b"{}\n" + event_line("live", n=9))
        assert wait_for(lambda: follower.count() == 1, 20), follower.said()
        time.sleep(0.4)
        assert follower.interrupt() == 0
        assert follower.json() == [json.loads(event_line("live", n=9))]
        assert "skipped damaged lines" in follower.said(), follower.said()


# ------------------------------------------------------------------ how a follower ends


def test_ctrl_c_while_a_follower_prints_its_first_events_ends_it_with_exit_0(world):
    """S-5, docs/sessions.md ("``tail --follow`` runs until Ctrl-C, which ends it with exit
    0: the following ended as asked"): ``tail -n 3000 --follow`` of a long session writes
    into a pipe that is not read yet, so it is still printing the last events when Ctrl-C
    comes.  Once the pipe is read, it ends with exit 0, and no error is said."""
    session = "long-backlog"
    world.home_session(session, 3000)
    read_end, write_end = os.pipe()
    try:
        with following(world, *world.home_args(session), "-n", "3000", "--json",
                       stdout=write_end) as follower:  # fmt: skip
            os.close(write_end)
            write_end = -1
            assert wait_for(lambda: blocked_writing(follower.proc.pid, read_end), 20)
            follower.proc.send_signal(signal.SIGINT)
            printed = drain(read_end)
            assert follower.proc.wait(timeout=20) == 0, follower.said()
            assert "EINTR" not in follower.said()
            assert printed.endswith(b"\n")
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def test_ctrl_c_ends_a_follower_whose_reader_stopped_reading(world):
    """S-5, docs/sessions.md (Ctrl-C ends ``tail --follow`` with exit 0; a follower may be
    "held by a full pipe"): a follower prints into a pipe whose reader stopped reading (a
    pager scrolled back, a stalled consumer) until the pipe is full.  Ctrl-C ends it, exit 0,
    without waiting for the reader."""
    session = "full-pipe"
    path = world.home_session(session, 1)
    read_end, write_end = os.pipe()
    try:
        with following(world, *world.home_args(session), "-n", "0", "--json",
                       stdout=write_end) as follower:  # fmt: skip
            os.close(write_end)
            write_end = -1
            time.sleep(0.5)
            append(path, b"".join(event_line("bulk", n=n, pad="p" * 200) for n in range(1500)))
            assert wait_for(lambda: blocked_writing(follower.proc.pid, read_end), 20)
            status = follower.interrupt(seconds=3)
            assert status == 0, (status, follower.said())
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def test_ctrl_c_while_a_follower_waits_for_a_removed_session_ends_it_with_exit_0(world):
    """S-5, docs/sessions.md (a removed file is waited for, with a note; Ctrl-C ends the
    following with exit 0): the session directory is removed while a text follower runs; it
    says it is waiting, and Ctrl-C then ends it with exit 0, its output whole lines."""
    session = "removed-wait"
    path = world.home_session(session)
    with following(world, *world.home_args(session)) as follower:
        assert wait_for(lambda: follower.count() == 2, 20), follower.said()
        shutil.rmtree(path.parent)
        gone = f"ctx: note: {path} is gone: waiting for it to appear again"
        assert wait_for(lambda: gone in follower.said(), 20), follower.said()
        assert follower.interrupt() == 0
        assert follower.printed().endswith(b"\n") and follower.count() == 2
        assert follower.said().strip() == gone


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_end_a_follower_as_the_signal_ends_a_program(world, signum):
    """S-5 and the CLI's exit statuses (README: 128 + the signal for a command a signal
    stopped): SIGTERM (a service manager) or SIGHUP (a closed terminal) ends a follower as
    that signal ends a program, with no traceback, its output whole lines, the session as
    it was."""
    session = f"signal-{signum.name.lower()}"
    path = world.home_session(session)
    before, data = fingerprint(path), path.read_bytes()
    with following(world, *world.home_args(session)) as follower:
        assert wait_for(lambda: follower.count() == 2, 20), follower.said()
        status = follower.signal(signum)
        assert status in (-signum, 128 + signum), (status, follower.said())
        assert follower.printed().endswith(b"\n") and "Traceback" not in follower.said()
    assert (fingerprint(path), path.read_bytes()) == (before, data)


def test_a_follower_whose_reader_left_ends_quietly_with_141_at_the_next_event(world):
    """README exit statuses (141 "when the reader of the output left, as in ``| head -1``"):
    a follower's reader takes the first events and closes the pipe; the next event
    appended ends the follower with 141 and nothing on stderr."""
    session = "reader-left"
    path = world.home_session(session)
    read_end, write_end = os.pipe()
    try:
        with following(world, *world.home_args(session), stdout=write_end) as follower:
            os.close(write_end)
            write_end = -1
            assert wait_for(lambda: pipe_bytes(read_end) > 0, 20), follower.said()
            os.close(read_end)
            read_end = -1
            append(path, event_line("after-reader", n=3))
            assert wait_for(lambda: follower.proc.poll() is not None, 20), follower.said()
            assert follower.proc.returncode == 141 and follower.said() == ""
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)


def test_a_follower_writing_to_a_full_device_ends_with_74_saying_so(world):
    """README exit statuses (74 "when the output cannot be written, as with ``>
    /dev/full``"): a follower whose standard output is /dev/full ends with 74 and a
    ``ctx: ENOSPC: cannot write standard output`` line, no traceback, the session as it
    was."""
    session = "dev-full"
    path = world.home_session(session)
    before = fingerprint(path)
    fd = os.open("/dev/full", os.O_WRONLY)
    try:
        with following(world, *world.home_args(session), stdout=fd) as follower:
            assert wait_for(lambda: follower.proc.poll() is not None, 20), follower.said()
            assert follower.proc.returncode == 74, follower.said()
            said = follower.said()
    finally:
        os.close(fd)
    assert said.startswith("ctx: ENOSPC: cannot write standard output"), said
    assert "Traceback" not in said and fingerprint(path) == before


# ------------------------------------------------------------------ readers change nothing


def test_readers_change_nothing_in_an_odd_session_an_older_version_made_and_repair_only_cuts(
    world,
):
    """S-5, docs/sessions.md (readers skip a torn line and damaged lines; ``repair`` cuts the
    torn line only and tightens a home session an older version made 0750/0640): a session
    holding events, a 100 KiB line, a line of non-UTF-8 bytes, JSON that is no event and a
    torn last line, with the older modes, is read by ``show``, ``show --json``, ``tail``,
    ``tail -n 2 --json``, ``list`` and a follower stopped by Ctrl-C.  Neither the file nor
    its directory changes in any way; then ``repair --json`` cuts exactly the torn bytes,
    keeps every complete line as it was, and lists the two modes it tightened."""
    session = "older-odd"
    path = world.home_session(session, 3)
    directory = path.parent
    append(path, b'{"ts":"' + b"L" * (100 << 10) + b'"}\n' + b"\xff\xff\n" + b"[true]\n")
    append(path, event_line("last-whole", n=4))
    torn = b'{"ts":"2026-06-22T12:00:09Z","type":"cut-he'
    append(path, torn)
    directory.chmod(0o750)
    path.chmod(0o640)
    data = path.read_bytes()
    before = (fingerprint(directory), fingerprint(path))
    expected = whole_events(path)
    args = world.home_args(session)
    for command in (["show", *args], ["show", *args, "--json"], ["tail", *args],
                    ["tail", *args, "-n", "2", "--json"]):  # fmt: skip
        r = world.ctx("session", *command)
        assert r.rc == 0 and "Traceback" not in r.err, r
        assert f"torn line of {len(torn)} bytes" in r.err, r
        assert "LLLLLLLL" not in r.out, r
    listed = world.ctx("session", "list", AGENT, "--uid", str(world.user.uid), "--json")
    assert listed.rc == 0 and {"name": session, "path": str(directory)} in listed.json()
    with following(world, *args, "--json") as follower:
        assert wait_for(lambda: follower.count() == len(expected), 20), follower.said()
        time.sleep(0.4)
        assert follower.interrupt() == 0
        assert follower.json() == expected
    assert (fingerprint(directory), fingerprint(path), path.read_bytes()) == (*before, data)

    repaired = world.ctx("session", "repair", *args, "--json")
    assert repaired.rc == 0, repaired
    answer = repaired.json()
    assert answer["truncated_bytes"] == len(torn) and answer["left"] == [], repaired
    assert answer["tightened"] == [f"{directory} (mode 0750 -> 0700)",
                                   f"{path} (mode 0640 -> 0600)"], repaired  # fmt: skip
    assert path.read_bytes() == data[: -len(torn)]


def test_a_shared_session_repair_and_list_say_where_it_is_and_tighten_nothing(world):
    """S-1, S-5, docs/sessions.md (``repair --json``: ``session`` the directory relative to
    the storage root; ``list --json``: ``{"name", "path"}``; a space's modes are its group's
    choice): a torn line of a shared session is cut by ``repair --json``, which tightens
    nothing; a second repair has nothing to do; an empty events file is shown as nothing,
    exit 0, with no note."""
    session = "shared-torn"
    world.record(session, 2, session, shared=True)
    path = world.shared_dir(session) / "events.jsonl"
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    append(path, b'{"ts":"x')
    args = world.shared_args(session)
    repaired = world.ctx("session", "repair", *args, "--json")
    assert repaired.rc == 0 and repaired.json() == {
        "session": f"shared/{SPACE}/agent/{AGENT}/session/{session}",
        "truncated_bytes": 8,
        "tightened": [],
        "left": [],
    }, repaired
    assert stat.S_IMODE(os.lstat(path).st_mode) == mode
    again = world.ctx("session", "repair", *args)
    assert again.rc == 0 and again.out == f"nothing to do: {path} ends with a complete line\n"
    listed = world.ctx("session", "list", AGENT, "--project", SPACE, "--json")
    assert listed.rc == 0 and {"name": session, "path": str(path.parent)} in listed.json()

    world.record("shared-empty", 0, "none", shared=True)
    empty = world.shared_dir("shared-empty") / "events.jsonl"
    assert empty.read_bytes() == b""
    for command in ("show", "tail"):
        r = world.ctx("session", command, *world.shared_args("shared-empty"), "--json")
        assert (r.rc, r.out, r.err) == (0, "", ""), r
