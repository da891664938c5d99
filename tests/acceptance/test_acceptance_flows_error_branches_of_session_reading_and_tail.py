"""The error branches of reading a session — ``ctx session show``, ``tail`` (also
``--follow``), ``list`` and ``repair`` — each reached from outside (SPEC S-1, S-2, S-5, R-3,
R-4; docs/sessions.md "Where sessions live", "Appending, crash-safely", "Reading, torn lines
and repair", "Commands"; the help of ``ctx session show|tail|repair|list``).

The angle: what the readers' own code refuses or mends, line by line, met as an agent or an
operator meets it in a home: a session directory its owner may list but not search, or
search but not list; an ``events.jsonl`` its owner made read-only, append-only or immutable
with a torn line, or kept locked; a session on a filesystem that is full; a home named with
a leading zero beside the real one; lines that a text editor or another program wrote (a
byte-order mark, CRLF ends, padding, a nested ``ts``), and more damaged lines than a note
lists; a reader whose standard output is a pipe nobody reads (Ctrl-C), or whose reader left;
a follower that runs out of descriptors, or whose session directory becomes a file; the
same session named twice.

Each check reads the exit status, the errno word of the ``ctx: ERRNO: sentence`` line (and
of the ``--json`` error object), that the message names the thing at fault by its whole path
and the remedy the documents promise, that no traceback is printed, and that nothing is
half-done: the file byte for byte and its modes as they were, or, where the message names a
repair, the repair run and its result read back."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
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
    Run,
    clean_env,
    ctx_run,
    limited,
    new_scratch_dir,
    scratch_top,
    wait_for,
)
from tests.support.scratch_mounts import ScratchMounts
from tests.support.storage import attribute
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="acts as the agent's uid, mounts and chattr: needs root"
)

SCRATCH = scratch_top(__file__)
AGENT = "reader"
TS = "2026-06-22T12:00:00Z"
TRACEBACK = "Traceback"
DEADLINE = 20.0


@dataclass
class World:
    storage: Path
    top: Path
    user: UnprivilegedUser  # the uid whose home holds the sessions

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def home(self, uid: int | None = None) -> Path:
        return self.storage / "home" / str(self.user.uid if uid is None else uid)

    def session_dir(self, name: str, *, agent: str = AGENT) -> Path:
        return self.home() / "agent" / agent / "session" / name

    def args(self, name: str) -> list[str]:
        """AGENT SESSION --uid U: the agent has no ``agent/`` entry, its sessions stay."""
        return [AGENT, name, "--uid", str(self.user.uid)]

    def ctx(self, *args: str | os.PathLike, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def ctx_as_user(self, *args: str | os.PathLike) -> Run:
        """``ctx ARGS`` run by the home's own uid (no other group)."""
        proc = subprocess.run(
            [*CTX_ARGV, *map(str, args)],
            env=self.env,
            user=self.user.uid,
            group=self.user.gid,
            extra_groups=[],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=60,
        )
        return Run(
            [str(a) for a in args],
            proc.returncode,
            proc.stdout.decode("utf-8", "replace"),
            proc.stderr.decode("utf-8", "replace"),
        )

    def as_user(self, *argv: str | os.PathLike) -> None:
        """``argv`` run by the home's own uid (what it may do to its own files)."""
        done = subprocess.run([*map(str, argv)], user=self.user.uid, group=self.user.gid,
                              extra_groups=[], capture_output=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    top = new_scratch_dir(SCRATCH)
    try:
        user = find_or_create_user()
        storage = top / "storage"
        made = ctx_run("bootstrap", "--storage", storage)
        assert made.rc == 0, made
        yield World(storage, top, user)
    finally:
        subprocess.run(["chattr", "-R", "-i", "-a", str(top)], capture_output=True)
        subprocess.run(["rm", "-rf", str(top)], capture_output=True)


@pytest.fixture
def mounts(world: World) -> Iterator[ScratchMounts]:
    made = ScratchMounts(new_scratch_dir(world.top, "mnt"))
    try:
        yield made
    finally:
        made.close()


# ------------------------------------------------------------------ helpers


def event(kind: str, session: str = "s", **facts: object) -> dict:
    return {"ts": TS, "type": kind, "agent": AGENT, "session": session, "object": "test/read",
            "status": "ok", **facts}  # fmt: skip


def line(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode() + b"\n"


def make_session(
    world: World,
    name: str,
    data: bytes,
    *,
    dir_mode: int = 0o700,
    file_mode: int = 0o600,
    uid: int | None = None,
    agent: str = AGENT,
) -> Path:
    """A home session made as the product makes one (``home/<uid>`` 0755, below 0700, the
    file 0600, all the home uid's) holding ``data``; its ``events.jsonl``."""
    uid = world.user.uid if uid is None else uid
    gid = world.user.gid
    home = world.storage / "home" / str(uid)
    levels = [home, home / "agent", home / "agent" / agent, home / "agent" / agent / "session"]
    for level, mode in zip(levels, (0o755, 0o700, 0o700, 0o700), strict=True):
        if not level.exists():
            level.mkdir(mode=mode)
            os.chown(level, uid, gid)
            level.chmod(mode)
    session = levels[-1] / name
    session.mkdir()
    events = session / "events.jsonl"
    events.write_bytes(data)
    for path, mode in ((events, file_mode), (session, dir_mode)):
        os.chown(path, uid, gid)
        path.chmod(mode)
    return events


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def last_error(r: Run) -> str:
    assert r.err.strip(), r
    return r.err.strip().splitlines()[-1]


def refused(r: Run, code: str, status: int = 1) -> str:
    """The refusal's message, after checking the exit status, that no traceback was printed
    and that the last stderr line is ``ctx: CODE: …``."""
    assert r.rc == status, r
    assert TRACEBACK not in r.err, r
    said = last_error(r)
    assert said.startswith(f"ctx: {code}: "), r
    return said


def json_error(r: Run) -> dict:
    return json.loads(r.lines()[-1])


def shown_types(out: str) -> list[str]:
    return [json.loads(text)["type"] for text in out.split("\n") if text]


def pipe_holds(read_end: int) -> int:
    """How many bytes wait in the pipe whose read end is ``read_end``."""
    return int.from_bytes(fcntl.ioctl(read_end, termios.FIONREAD, b"\0\0\0\0"), "little")


@contextlib.contextmanager
def writing_to_a_stalled_pipe(world: World, *args: str) -> Iterator[subprocess.Popen]:
    """``ctx ARGS`` writing to a pipe nobody reads, once the pipe is full; killed at the end
    of the block if it is still running."""
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([*CTX_ARGV, *args], stdout=write_end, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, env=world.env)  # fmt: skip
    os.close(write_end)
    try:
        # Full: more than half of the pipe's 64 KiB taken, and no more taken since a moment
        # ago (the line that would not fit waits in the command's write).
        held = [-1]

        def full() -> bool:
            now, held[0] = pipe_holds(read_end), pipe_holds(read_end)
            time.sleep(0.3)
            return now > 32768 and pipe_holds(read_end) == now

        assert wait_for(full, DEADLINE), f"the pipe never filled ({held[0]} bytes)"
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=DEADLINE)
        os.close(read_end)


def long_session(world: World, name: str) -> Path:
    """A session of 20 000 events, megabytes more than a pipe holds."""
    body = b"".join(line(event("many", name, n=n, pad="p" * 120)) for n in range(20000))
    return make_session(world, name, body)


@contextlib.contextmanager
def following(world: World, *args: str) -> Iterator[tuple[subprocess.Popen, Path, Path]]:
    """``ctx session tail ARGS --follow --json`` in the background, its output in files."""
    stamp = time.monotonic_ns()
    out, err = world.top / f"follow-{stamp}.out", world.top / f"follow-{stamp}.err"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen([*CTX_ARGV, "session", "tail", *args, "--follow", "--json"],
                                stdout=o, stderr=e, stdin=subprocess.DEVNULL, env=world.env,
                                start_new_session=True)  # fmt: skip
    try:
        yield proc, out, err
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=DEADLINE)


def holds_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open."""
    fds = Path(f"/proc/{pid}/fd")
    with contextlib.suppress(OSError):
        for fd in fds.iterdir():
            with contextlib.suppress(OSError):
                if os.readlink(fd) == str(path):
                    return True
    return False


def printed(out: Path) -> list[dict]:
    """The events a follower printed (``--json``), without the error object that may end it."""
    lines = (json.loads(text) for text in out.read_text().split("\n") if text)
    return [value for value in lines if "ts" in value]


# ---------------------------------------------- a session directory closed to its owner


@pytest.mark.parametrize("command", ["show", "tail", "repair"])
def test_a_session_directory_its_owner_may_list_but_not_search_is_named_whole(
    world: World, command: str
) -> None:
    """docs/sessions.md "Commands" (a directory on the way that is closed to the caller is
    EACCES, exit 1, naming its whole path, its owner, group and mode, and who may read it):
    the agent's own session directory, mode 0400 (r without x).  Read by the agent, every
    reader refuses with EACCES naming that directory and its mode, and the file and the
    directory stay as they were."""
    name = f"nosearch-{command}"
    body = line(event("kept", name)) + b'{"ts":"torn'
    events = make_session(world, name, body, dir_mode=0o400)
    r = world.ctx_as_user("session", command, *world.args(name), "--json")
    said = refused(r, "EACCES")
    assert str(events.parent) in said and "0400" in said, r
    assert json_error(r)["error"] == "EACCES", r
    os.chmod(events.parent, 0o700)
    assert events.read_bytes() == body


def test_a_session_directory_its_owner_may_search_but_not_list_says_chmod_and_that_mends_it(
    world: World,
) -> None:
    """docs/sessions.md "Commands" (a directory closed to the caller is EACCES naming its
    whole path and mode) and S-5 (the session is reached by a walk that opens every
    component): the agent's own session directory, mode 0100 (x without r), cannot be opened
    as a directory.  Every reader says EACCES naming it, that the caller owns it and
    ``chmod u+r``; once the agent runs that, ``show`` reads its events."""
    name = "nolist"
    body = line(event("kept", name))
    events = make_session(world, name, body, dir_mode=0o100)
    for command in ("show", "tail", "repair"):
        r = world.ctx_as_user("session", command, *world.args(name))
        said = refused(r, "EACCES")
        assert str(events.parent) in said and "0100" in said, r
        assert "chmod u+r" in said, r
    assert mode_of(events.parent) == 0o100
    world.as_user("chmod", "u+r", events.parent)
    r = world.ctx_as_user("session", "show", *world.args(name), "--json")
    assert r.rc == 0 and shown_types(r.out) == ["kept"], r
    assert events.read_bytes() == body


def test_sessions_its_owner_may_not_list_are_eacces_naming_the_directory_not_an_empty_list(
    world: World,
) -> None:
    """docs/sessions.md "Commands" (``list`` prints one session name a line; a directory on
    the way closed to the caller is EACCES, exit 1, naming its whole path and mode): the
    agent made its own ``session/`` directory 0300 (it may add and enter entries, not read
    the names).  ``list`` (also ``--json``) is refused with EACCES naming that directory, its
    mode and ``chmod u+r`` — never an empty list, which would say there are none; after the
    named chmod the sessions are listed."""
    make_session(world, "listed", line(event("kept", "listed")), agent="hider")
    sessions = world.home() / "agent" / "hider" / "session"
    sessions.chmod(0o300)
    try:
        for extra in ([], ["--json"]):
            r = world.ctx_as_user("session", "list", "hider", "--uid", str(world.user.uid), *extra)
            said = refused(r, "EACCES")
            assert str(sessions) in said and "0300" in said and "chmod u+r" in said, r
            if extra:
                assert json_error(r)["error"] == "EACCES", r
            else:
                assert r.out == "", r
        world.as_user("chmod", "u+r", sessions)
        r = world.ctx_as_user("session", "list", "hider", "--uid", str(world.user.uid))
        assert r.rc == 0 and r.lines() == ["listed"], r
    finally:
        sessions.chmod(0o700)


# ------------------------------------------------------------------ repair where it cannot write


def test_repair_by_the_owner_of_a_read_only_torn_file_names_the_chmod_that_lets_it(
    world: World,
) -> None:
    """docs/sessions.md "Reading, torn lines and repair" (run by a caller who may read the file
    but not write it, a torn line cannot be cut: EACCES, exit 1, naming the file and the torn
    bytes, nothing changed): the agent made its own ``events.jsonl`` 0400.  The refusal names
    the file and the torn bytes; its remedy must be one the caller can follow — as the
    readers say it to an owner whose mode leaves it out (``chmod u+w``), not to repair it "as
    its owner", which it is.  The remedy, run, lets the repair cut the line."""
    name = "readonly-owner"
    whole = line(event("kept", name))
    events = make_session(world, name, whole + b'{"ts":"torn', file_mode=0o400)
    r = world.ctx_as_user("session", "repair", *world.args(name))
    said = refused(r, "EACCES")
    assert str(events) in said and "11 bytes" in said and "nothing was changed" in said, r
    assert events.read_bytes() == whole + b'{"ts":"torn'
    assert "chmod u+w" in said, r
    world.as_user("chmod", "u+w", events)
    r = world.ctx_as_user("session", "repair", *world.args(name))
    assert r.rc == 0 and events.read_bytes() == whole, r


def test_repair_of_an_append_only_torn_file_names_chattr_and_that_mends_it(world: World) -> None:
    """docs/sessions.md "Reading, torn lines and repair" (an append-only ``events.jsonl`` may
    never be cut, by root too; a torn line that cannot be cut: exit 1 naming the file and the
    torn bytes, nothing changed): root's repair of a torn append-only file is EPERM naming
    the file, the 11 torn bytes, the attribute and ``chattr -a PATH``; ``show`` still reads
    it; with nothing torn the repair has nothing to do; after the named chattr the repair
    cuts the line and only it."""
    name = "append-only"
    whole = line(event("kept", name))
    events = make_session(world, name, whole + b'{"ts":"torn')
    with attribute(events, "a"):
        r = world.ctx("session", "repair", *world.args(name), "--json")
        said = refused(r, "EPERM")
        assert str(events) in said and "11 bytes" in said, r
        assert "append-only" in said and f"chattr -a {events}" in said, r
        assert json_error(r)["error"] == "EPERM", r
        assert events.read_bytes() == whole + b'{"ts":"torn'
        shown = world.ctx("session", "show", *world.args(name), "--json")
        assert shown.rc == 0 and shown_types(shown.out) == ["kept"], shown
    subprocess.run(["chattr", "-a", str(events)], check=True)
    r = world.ctx("session", "repair", *world.args(name))
    assert r.rc == 0 and "11 bytes" in r.out, r
    assert events.read_bytes() == whole
    with attribute(events, "a"):
        r = world.ctx("session", "repair", *world.args(name))
        assert r.rc == 0 and r.out.startswith("nothing to do"), r


def test_repair_of_an_immutable_file_kept_locked_gives_up_after_ten_seconds(world: World) -> None:
    """S-5, docs/sessions.md "Appending, crash-safely" (a repair waits no more than ten seconds
    for the lock; a log kept locked longer fails it with EAGAIN, naming the file): a repair
    that may not write the file (immutable) still takes the exclusive lock to tell a torn
    line from one in flight.  Another process holds the file's shared lock: the repair gives
    up after about ten seconds with EAGAIN naming the file and ``fuser``, nothing changed."""
    name = "locked-immutable"
    body = line(event("kept", name)) + b'{"ts":"torn'
    events = make_session(world, name, body)
    with attribute(events, "i"), open(events, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        started = time.monotonic()
        r = world.ctx("session", "repair", *world.args(name))
        waited = time.monotonic() - started
    said = refused(r, "EAGAIN")
    assert str(events) in said and "fuser" in said, r
    assert 9 <= waited < 40, waited
    assert events.read_bytes() == body


def test_repair_on_a_full_filesystem_still_cuts_the_torn_line_and_tightens(
    world: World, mounts: ScratchMounts
) -> None:
    """S-5, docs/sessions.md "Reading, torn lines and repair" and "Sessions made by older
    versions": the agent's ``session/`` directory is a small tmpfs filled to its last byte,
    holding a session an older version made (0750, ``events.jsonl`` 0640) whose last line is
    torn.  Cutting and tightening need no space: the repair lists both modes it tightened
    and the bytes it cut, exit 0; ``show`` then mentions no torn line."""
    name = "full"
    first = make_session(world, "full-first", line(event("kept", "full-first")))
    sessions = first.parent.parent
    ids = f"uid={world.user.uid},gid={world.user.gid}"
    mounts.tmpfs(sessions, f"size=256k,mode=0700,{ids}")  # over what the home held there
    whole = line(event("kept", name))
    events = sessions / name / "events.jsonl"
    (sessions / name).mkdir()
    events.write_bytes(whole + b'{"ts":"torn')
    for path, mode in ((events, 0o640), (events.parent, 0o750)):
        os.chown(path, world.user.uid, world.user.gid)
        path.chmod(mode)
    filler = subprocess.run(["dd", "if=/dev/zero", f"of={sessions / 'filler'}", "bs=4k"],
                            capture_output=True)  # fmt: skip
    assert b"No space left" in filler.stderr, filler.stderr
    assert os.statvfs(sessions).f_bavail == 0
    r = world.ctx("session", "repair", *world.args(name))
    assert r.rc == 0 and TRACEBACK not in r.err, r
    assert f"tightened {events.parent} (mode 0750 -> 0700)" in r.out, r
    assert f"tightened {events} (mode 0640 -> 0600)" in r.out, r
    assert f"truncated a torn last line of 11 bytes from {events}" in r.out, r
    assert events.read_bytes() == whole
    assert (mode_of(events.parent), mode_of(events)) == (0o700, 0o600)
    shown = world.ctx("session", "show", *world.args(name))
    assert shown.rc == 0 and shown.err == "", shown


def test_repair_whose_reader_left_still_cuts_and_ends_quietly_with_141(world: World) -> None:
    """docs/sessions.md "Commands" (a standard output that refuses what ``repair`` prints does
    not stop the repair: the torn line is cut all the same, then the command ends as every
    command whose output failed; for a reader that left, quietly with 141): a repair of an
    older session with a torn line, its standard output a pipe whose reader has gone.  The
    line is cut, the modes tightened, exit 141, nothing on stderr."""
    name = "reader-left"
    whole = line(event("kept", name))
    events = make_session(world, name, whole + b'{"ts":"torn', dir_mode=0o750, file_mode=0o640)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([*CTX_ARGV, "session", "repair", *world.args(name)],
                              stdout=write_end, stderr=subprocess.PIPE, env=world.env,
                              timeout=60)  # fmt: skip
    finally:
        os.close(write_end)
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == b"", proc.stderr
    assert events.read_bytes() == whole
    assert (mode_of(events.parent), mode_of(events)) == (0o700, 0o600)


# -------------------------------------------------- readers whose output stalls or goes


@pytest.mark.parametrize("command", [["show"], ["tail", "-n", "20000"]])
def test_ctrl_c_ends_a_reader_whose_reader_stopped_reading(
    world: World, command: list[str]
) -> None:
    """docs/queue.md (exit 130 after Ctrl-C, ``ctx: EINTR``), docs/sessions.md "Commands"
    (Ctrl-C ends ``tail --follow`` at once also while a reader that stopped reading leaves
    the pipe full: what it had not written yet is dropped): ``show`` and ``tail`` of a long
    session write into a pipe nobody reads; Ctrl-C must end them within seconds with EINTR
    and exit 130, not leave them blocked until someone reads."""
    name = f"stalled-{command[0]}"
    long_session(world, name)
    args = ["session", command[0], *world.args(name), *command[1:]]
    with writing_to_a_stalled_pipe(world, *args) as proc:
        proc.send_signal(signal.SIGINT)
        assert wait_for(lambda: proc.poll() is not None, 5), "Ctrl-C did not end it"
        assert proc.returncode == 130
        said = proc.stderr.read().decode() if proc.stderr else ""
        assert "ctx: EINTR: " in said and TRACEBACK not in said, said


def test_a_reader_whose_own_reader_left_ends_quietly_with_141(world: World) -> None:
    """docs/sessions.md "Commands" and the exit statuses of every command (141 when the
    reader of the output left): ``show`` and ``tail`` of a long session into a pipe whose
    reader reads a little and closes it end with 141, no traceback, no "Exception ignored",
    and the session unchanged."""
    name = "reader-closes"
    events = long_session(world, name)
    before = events.read_bytes()
    for command in (["show"], ["tail", "-n", "5000"]):
        proc = subprocess.Popen([*CTX_ARGV, "session", command[0], *world.args(name),
                                 *command[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=world.env)  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read(4096)
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=DEADLINE) == 141, err
        assert err == "", err
    assert events.read_bytes() == before


# ------------------------------------------------------------------ lines other programs wrote


def test_lines_an_editor_wrote_are_events_and_a_nested_ts_is_a_damaged_line(world: World) -> None:
    """docs/sessions.md "Reading, torn lines and repair" (every event starts with ``{"ts":``;
    a complete line that holds no event is reported as damaged and skipped) and S-2: a file
    saved by an editor — a UTF-8 byte-order mark before the first event, CRLF line ends, a
    line padded with blanks — still holds its events, which ``show`` prints (text and
    ``--json``, without the mark or the CR) and ``tail -n 2`` takes from the end; an object
    whose only ``ts`` is nested holds no event (line 4, named in the note); nothing is
    changed by reading, and ``repair`` has nothing to do."""
    name = "edited"
    body = (
        b"\xef\xbb\xbf" + line(event("bom", name))[:-1] + b"\r\n"
        + line(event("crlf", name))[:-1] + b"\r\n"
        + b" \t" + line(event("padded", name))[:-1] + b" \t\r\n"
        + line({"wrapper": event("nested", name)})
        + line(event("last", name))
    )  # fmt: skip
    events = make_session(world, name, body)
    note = f"ctx: note: skipped damaged lines 4 of {events}"
    r = world.ctx("session", "show", *world.args(name), "--json")
    assert r.rc == 0 and shown_types(r.out) == ["bom", "crlf", "padded", "last"], r
    assert "\r" not in r.out and "\ufeff" not in r.out, r
    assert r.err.strip() == note, r
    text = world.ctx("session", "show", *world.args(name))
    assert [row.split()[1] for row in text.lines()] == ["bom", "crlf", "padded", "last"], text
    tail = world.ctx("session", "tail", *world.args(name), "-n", "2", "--json")
    assert tail.rc == 0 and shown_types(tail.out) == ["padded", "last"], tail
    assert tail.err.strip() == note, tail
    repair = world.ctx("session", "repair", *world.args(name))
    assert repair.rc == 0 and repair.out.startswith("nothing to do"), repair
    assert events.read_bytes() == body


def test_more_damaged_lines_than_a_note_lists_are_counted_and_tail_counts_events(
    world: World,
) -> None:
    """docs/sessions.md "Commands" and "Reading, torn lines and repair" (the note names the
    damaged lines; ``tail -n N`` prints the last N events): 250 damaged lines between two
    events, an array after them, then an event and a torn line.  ``tail -n 2`` prints the
    last two *events*, whatever lies between them; the note names the first ten damaged
    lines and counts the other 241, as ``show`` does; the torn line is mentioned with the
    repair command, which, run as printed, cuts it."""
    name = "damaged-many"
    body = (
        line(event("first", name))
        + b"".join(b"junk %d\n" % n for n in range(250))
        + line(event("second", name))
        + b"[]\n"
        + line(event("third", name))
    )
    events = make_session(world, name, body + b'{"ts":"torn')
    numbers = ", ".join(str(n) for n in range(2, 12))
    note = f"ctx: note: skipped damaged lines {numbers} and 241 more of {events}"
    for command in (["tail", "-n", "2"], ["show"]):
        r = world.ctx("session", *command[:1], *world.args(name), *command[1:], "--json")
        assert r.rc == 0 and TRACEBACK not in r.err, r
        expected = ["second", "third"] if command[0] == "tail" else ["first", "second", "third"]
        assert shown_types(r.out) == expected, r
        notes = r.err.strip().splitlines()
        assert note in notes and len(notes) == 2, r
        torn = next(n for n in notes if "torn line of 11 bytes" in n)
    repair = torn.split("'")[1]
    assert repair.startswith("ctx session repair "), torn
    fixed = world.ctx(*shlex.split(repair)[1:])
    assert fixed.rc == 0 and "11 bytes" in fixed.out, fixed
    assert events.read_bytes() == body


# ----------------------------------------------- whose home holds a gone agent's sessions


def test_a_home_named_with_a_leading_zero_does_not_count_a_home_twice(world: World) -> None:
    """docs/sessions.md "Commands" (once ``agent/<name>`` is gone, the home that still holds
    its sessions is read, else the only one; when several homes hold some, ``--uid`` says
    which) and R-4 (``home/<uid>``): beside the real ``home/<uid>`` holding a gone agent's
    session, an operator's copy named ``home/0<uid>`` holds nothing under that name's uid.
    Only one home holds sessions of the agent: ``show`` and ``list`` read it, and never name
    one uid twice."""
    ghost = "ghost"
    events = make_session(world, "kept", line(event("kept", "kept")), agent=ghost)
    padded = world.storage / "home" / f"0{world.user.uid}"
    (padded / "agent" / ghost / "session" / "kept").mkdir(parents=True)
    try:
        r = world.ctx("session", "show", ghost, "kept", "--json")
        uid = str(world.user.uid)
        assert f"{uid}, {uid}" not in r.err, r
        assert r.rc == 0 and shown_types(r.out) == ["kept"], r
        listed = world.ctx("session", "list", ghost)
        assert listed.rc == 0 and listed.lines() == ["kept"], listed
        assert events.exists()
    finally:
        subprocess.run(["rm", "-rf", str(padded)], check=True)


def test_a_gone_agents_only_home_is_read_and_two_homes_need_uid(world: World) -> None:
    """docs/sessions.md "Commands" (once ``agent/<name>`` is gone, the home that still holds
    ``agent/<name>/session/`` is read — the caller's own first, else the only one; when
    several hold some, ``--uid`` says which: EINVAL, exit 2): a gone agent's session in one
    home is read without ``--uid``; a second home (another uid) holding one too makes the
    same command a usage error naming both uids and ``--uid``; the agent's own home, asked
    by its own uid, is read first."""
    ghost = "ghost2"
    other = world.user.uid + 11
    make_session(world, "one", line(event("mine", "one")), agent=ghost)
    r = world.ctx("session", "show", ghost, "one", "--json")
    assert r.rc == 0 and shown_types(r.out) == ["mine"], r
    make_session(world, "one", line(event("theirs", "one")), agent=ghost, uid=other)
    try:
        r = world.ctx("session", "show", ghost, "one", "--json")
        said = refused(r, "EINVAL", 2)
        assert f"{world.user.uid}, {other}" in said and "--uid" in said, r
        assert json_error(r)["error"] == "EINVAL", r
        own = world.ctx_as_user("session", "show", ghost, "one", "--json")
        assert own.rc == 0 and shown_types(own.out) == ["mine"], own
    finally:
        subprocess.run(["rm", "-rf", str(world.home(other))], check=True)


# ------------------------------------------------------------------ followers


def test_a_follower_out_of_descriptors_ends_naming_the_limit_after_its_events(
    world: World,
) -> None:
    """docs/sessions.md "Commands" (a follower that can no longer follow ends with the error,
    naming the path, once what it held was read): ``tail --follow`` started with so few
    descriptors that it cannot open the file again at its first look prints the last events
    first, then ends with EMFILE, exit 1, naming the file and the limit to raise (``ulimit
    -n``) — no traceback, the file unchanged."""
    name = "few-descriptors"
    body = line(event("one", name)) + line(event("two", name))
    events = make_session(world, name, body)
    r = limited(world.env, "session", "tail", *world.args(name), "--follow", "--json",
                nofile=6, timeout=DEADLINE)  # fmt: skip
    said = refused(r, "EMFILE")
    assert str(events) in said and "ulimit -n" in said, r
    assert [json.loads(text)["type"] for text in r.lines()[:2]] == ["one", "two"], r
    assert json_error(r)["error"] == "EMFILE", r
    assert events.read_bytes() == body


def test_a_follower_whose_session_directory_becomes_a_file_prints_what_it_held_then_enotdir(
    world: World,
) -> None:
    """docs/sessions.md "Commands" (a follower that fell behind prints every event it held;
    something that is no directory put at the session's directory ends it, ``ENOTDIR``, once
    the file it followed has been read to its end): a stopped follower's session gets one
    more event, the directory is moved away and a regular file put at its name.  Going on,
    the follower prints the event it held, then ends with ENOTDIR naming the session
    directory, exit 1; the file put there is not touched."""
    name = "dir-becomes-file"
    events = make_session(world, name, line(event("one", name)))
    directory = events.parent
    with following(world, *world.args(name)) as (proc, out, err):
        assert wait_for(lambda: len(printed(out)) == 1, DEADLINE), err.read_text()
        proc.send_signal(signal.SIGSTOP)
        try:
            with events.open("ab") as log:
                log.write(line(event("held", name)))
            directory.rename(directory.with_name(name + ".moved"))
            directory.write_bytes(b"planted\n")
        finally:
            proc.send_signal(signal.SIGCONT)
        assert wait_for(lambda: proc.poll() is not None, DEADLINE), err.read_text()
    said = err.read_text()
    assert proc.returncode == 1 and TRACEBACK not in said, said
    last = said.strip().splitlines()[-1]
    assert last.startswith("ctx: ENOTDIR: ") and str(directory) in last, said
    assert [e["type"] for e in printed(out)] == ["one", "held"], out.read_text()
    assert json.loads(out.read_text().strip().splitlines()[-1])["error"] == "ENOTDIR"
    assert directory.read_bytes() == b"planted\n"


def test_a_follower_started_with_n_0_prints_only_what_is_appended(world: World) -> None:
    """docs/sessions.md "Commands" (``tail -n N``, N from 0; ``--follow`` keeps printing; a
    damaged line appended while it follows is skipped with the note ``show`` prints, N
    counted from the file's first line): ``tail -n 0 --follow`` of a session of three events
    prints none of them; an appended damaged line is named as line 4 and the event after it
    printed; Ctrl-C ends it with exit 0."""
    name = "n-zero"
    events = make_session(world, name, b"".join(line(event(f"old{n}", name)) for n in range(3)))
    with following(world, *world.args(name), "-n", "0") as (proc, out, err):
        # Printing nothing, it is following once it holds the file open: appended before,
        # the event would be one of the last 0.
        assert wait_for(lambda: holds_open(proc.pid, events), DEADLINE), err.read_text()
        with events.open("ab") as log:
            log.write(b"not an event\n" + line(event("new", name)))
        assert wait_for(lambda: len(printed(out)) == 1, DEADLINE), err.read_text()
        note = f"ctx: note: skipped damaged lines 4 of {events}"
        assert wait_for(lambda: note in err.read_text(), DEADLINE), err.read_text()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=DEADLINE) == 0, err.read_text()
    assert [e["type"] for e in printed(out)] == ["new"], out.read_text()
    assert TRACEBACK not in err.read_text()


# ------------------------------------------------------------------ names


def test_the_same_session_given_as_argument_and_option_is_one_session(world: World) -> None:
    """docs/sessions.md "Commands" (SESSION may also be given as ``--session SESSION``): the
    same name given both ways is one session, read by every reader; two different names are
    EINVAL, exit 2, naming both, and with ``--json`` the error object says so too."""
    name = "twice"
    make_session(world, name, line(event("once", name)))
    for command in ("show", "tail"):
        r = world.ctx("session", command, *world.args(name), "--session", name, "--json")
        assert r.rc == 0 and shown_types(r.out) == ["once"], r
    r = world.ctx("session", "repair", *world.args(name), "--session", name)
    assert r.rc == 0 and r.out.startswith("nothing to do"), r
    r = world.ctx("session", "show", *world.args(name), "--session", "other", "--json")
    said = refused(r, "EINVAL", 2)
    assert "'twice'" in said and "'other'" in said, r
    assert json_error(r)["error"] == "EINVAL", r


@pytest.mark.parametrize("planted", ["link-at-directory", "directory-at-file"])
def test_a_follower_waiting_for_a_removed_file_ends_when_something_odd_takes_its_place(
    world: World, planted: str
) -> None:
    """docs/sessions.md "Commands" (one removed is waited for, with a note; a link, a FIFO or
    a directory put at ``events.jsonl``, or a link put at the session's directory, ends the
    follower, ``EINVAL`` or ``ELOOP``, exit 1): with nothing held any more, the follower
    waits for a removed file; then a link takes the session directory's place (to a
    directory holding another event), or a directory takes the file's.  It ends naming the
    path, never printing what the link leads to."""
    name = f"gone-then-{planted}"
    events = make_session(world, name, line(event("one", name)))
    directory = events.parent
    with following(world, *world.args(name)) as (proc, out, err):
        assert wait_for(lambda: len(printed(out)) == 1, DEADLINE), err.read_text()
        events.unlink()
        gone = f"ctx: note: {events} is gone: waiting for it to appear again"
        assert wait_for(lambda: gone in err.read_text(), DEADLINE), err.read_text()
        if planted == "link-at-directory":
            elsewhere = directory.with_name(name + ".elsewhere")
            directory.rename(elsewhere)
            (elsewhere / "events.jsonl").write_bytes(line(event("elsewhere", name)))
            directory.symlink_to(elsewhere.name)
            codes = ("ELOOP", "ENOTDIR")  # O_DIRECTORY|O_NOFOLLOW on a link: either
        else:
            events.mkdir()
            codes = ("EINVAL",)
        assert wait_for(lambda: proc.poll() is not None, DEADLINE), err.read_text()
    said = err.read_text()
    assert proc.returncode == 1 and TRACEBACK not in said, said
    last = said.strip().splitlines()[-1]
    assert last.split(":")[1].strip() in codes and str(directory) in last, said
    assert [e["type"] for e in printed(out)] == ["one"], out.read_text()


def test_a_follower_numbers_damaged_lines_from_the_start_of_each_file_it_reads_again(
    world: World,
) -> None:
    """docs/sessions.md "Commands" (a file that another file replaces, or that shrinks below
    what was read, is read again from its start after a note; a damaged line is skipped with
    the note ``show`` prints, N counted from the file's first line): a followed file is
    rotated (a new file with a damaged first line, then an event), then cut to nothing and
    given the same again.  Each time the follower says why it starts again, names the
    damaged line as line 1 of the file it now reads, and prints each new event once."""
    name = "renumbered"
    events = make_session(world, name, line(event("old0", name)) + line(event("old1", name)))
    damaged = f"ctx: note: skipped damaged lines 1 of {events}"
    with following(world, *world.args(name)) as (proc, out, err):
        assert wait_for(lambda: len(printed(out)) == 2, DEADLINE), err.read_text()
        fresh = events.with_name("events.jsonl.new")
        fresh.write_bytes(b"rotated junk\n" + line(event("rotated", name)))
        events.rename(events.with_name("events.jsonl.1"))
        fresh.rename(events)
        replaced = f"ctx: note: {events} was replaced by another file: following it again"
        assert wait_for(lambda: len(printed(out)) == 3, DEADLINE), err.read_text()
        assert replaced in err.read_text() and err.read_text().count(damaged) == 1
        size = events.stat().st_size
        os.truncate(events, 0)
        shrank = f"ctx: note: {events} shrank to 0 bytes, from the {size} read"
        assert wait_for(lambda: shrank in err.read_text(), DEADLINE), err.read_text()
        with events.open("ab") as log:
            log.write(b"cut junk\n" + line(event("after-cut", name)))
        assert wait_for(lambda: len(printed(out)) == 4, DEADLINE), err.read_text()
        assert wait_for(lambda: err.read_text().count(damaged) == 2, DEADLINE), err.read_text()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=DEADLINE) == 0, err.read_text()
    assert [e["type"] for e in printed(out)] == ["old0", "old1", "rotated", "after-cut"]
    assert TRACEBACK not in err.read_text()


# ------------------------------------------------------------------ sizes at the edges


def test_a_line_of_64_kib_is_an_event_and_one_byte_more_is_a_damaged_line(world: World) -> None:
    """docs/sessions.md "Reading, torn lines and repair" (readers hold at most two pieces of
    64 KiB; a complete line longer than any event is a damaged line like any other): events
    whose lines are 65 535 and 65 536 bytes long are printed by ``show`` and ``tail``; one of
    65 537 bytes is damaged line 3, named in the note, and ``tail -n 1`` then prints the
    longest event still read."""
    name = "at-the-edge"

    def sized(kind: str, length: int) -> bytes:
        bare = line(event(kind, name, pad=""))[:-1]
        text = line(event(kind, name, pad="q" * (length - len(bare))))
        assert len(text) == length + 1
        return text

    body = sized("edge-1", 65535) + sized("edge0", 65536) + sized("edge+1", 65537)
    events = make_session(world, name, body)
    note = f"ctx: note: skipped damaged lines 3 of {events}"
    r = world.ctx("session", "show", *world.args(name), "--json")
    assert r.rc == 0 and shown_types(r.out) == ["edge-1", "edge0"], r.err
    assert r.err.strip() == note, r.err
    tail = world.ctx("session", "tail", *world.args(name), "-n", "1", "--json")
    assert tail.rc == 0 and shown_types(tail.out) == ["edge0"], tail.err
    assert tail.err.strip() == note, tail.err
    assert events.read_bytes() == body


def test_a_gigabyte_hole_after_the_last_line_is_one_torn_line_cut_at_once(world: World) -> None:
    """docs/sessions.md "Reading, torn lines and repair" (past the first 64 KiB of a line the
    holes of a sparse file are skipped, so a file grown to gigabytes with ``truncate`` costs
    what it holds in data; a longer unterminated last line is a torn line, skipped by
    ``show`` and ``tail``, cut by ``repair``): one event, then a hole up to 1 GiB.  ``show``
    and ``tail`` print the event and name a torn line of the hole's size; ``repair`` cuts
    exactly it, within seconds; the file is then the event alone."""
    name = "sparse"
    whole = line(event("kept", name))
    events = make_session(world, name, whole)
    os.truncate(events, 1 << 30)
    torn = (1 << 30) - len(whole)
    for command in ("show", "tail"):
        started = time.monotonic()
        r = world.ctx("session", command, *world.args(name), "--json")
        assert r.rc == 0 and shown_types(r.out) == ["kept"], r
        assert f"ends with a torn line of {torn} bytes" in r.err, r
        assert time.monotonic() - started < 15
    started = time.monotonic()
    r = world.ctx("session", "repair", *world.args(name))
    assert r.rc == 0 and f"truncated a torn last line of {torn} bytes from {events}" in r.out, r
    assert time.monotonic() - started < 15
    assert events.read_bytes() == whole


def test_an_empty_file_and_a_file_of_empty_lines_hold_no_event_and_nothing_to_repair(
    world: World,
) -> None:
    """docs/sessions.md "Reading, torn lines and repair" (a complete line that holds no event
    is reported as damaged and skipped; ``repair`` of a file whose last line is whole has
    nothing to do): an empty ``events.jsonl`` prints nothing and says nothing; one of three
    empty lines prints nothing and names lines 1, 2 and 3; ``repair`` of either has nothing
    to do (``--json``: ``truncated_bytes`` 0) and leaves the bytes as they were."""
    for name, body, note in (("empty", b"", ""), ("blank", b"\n\n\n", "1, 2, 3")):
        events = make_session(world, name, body)
        said = f"ctx: note: skipped damaged lines {note} of {events}" if note else ""
        for command in ("show", "tail"):
            r = world.ctx("session", command, *world.args(name), "--json")
            assert r.rc == 0 and r.out == "" and r.err.strip() == said, r
        r = world.ctx("session", "repair", *world.args(name), "--json")
        assert r.rc == 0 and r.json()["truncated_bytes"] == 0, r
        assert r.json()["session"] == f"home/{world.user.uid}/agent/{AGENT}/session/{name}", r
        assert events.read_bytes() == body


# ------------------------------------------------------------------ repairs that may go ahead


def test_an_immutable_session_directory_does_not_stop_a_repair_of_its_file(world: World) -> None:
    """S-5, docs/sessions.md "Reading, torn lines and repair": a session directory made
    immutable (``chattr +i``) whose modes are already the agent's alone.  Cutting the torn
    line changes the file, not the directory: the repair cuts it, exit 0, and leaves the
    directory immutable and its entries as they were."""
    name = "immutable-directory"
    whole = line(event("kept", name))
    events = make_session(world, name, whole + b'{"ts":"torn')
    with attribute(events.parent, "i"):
        r = world.ctx("session", "repair", *world.args(name))
        assert r.rc == 0 and TRACEBACK not in r.err, r
        assert r.out.strip() == f"truncated a torn last line of 11 bytes from {events}", r
        assert events.read_bytes() == whole
        listed = subprocess.run(["lsattr", "-d", str(events.parent)], capture_output=True)
        assert listed.stdout.split()[0].count(b"i") == 1, listed
        assert sorted(os.listdir(events.parent)) == ["events.jsonl"]


def test_the_owner_repairs_its_own_older_session_without_root(world: World) -> None:
    """docs/sessions.md "Sessions made by older versions" (``ctx session repair`` tightens
    the home session it repairs; what the home owner owns is changed by root or, for its own
    entries, by the owner) and "Reading, torn lines and repair": the agent itself repairs a
    session an older version made (0750, ``events.jsonl`` 0640) with a torn line: both modes
    are tightened and listed, the line cut, exit 0; ``--json`` then has nothing left to do."""
    name = "owner-repairs"
    whole = line(event("kept", name))
    events = make_session(world, name, whole + b'{"ts":"torn', dir_mode=0o750, file_mode=0o640)
    r = world.ctx_as_user("session", "repair", *world.args(name))
    assert r.rc == 0 and TRACEBACK not in r.err, r
    assert r.lines() == [
        f"tightened {events.parent} (mode 0750 -> 0700)",
        f"tightened {events} (mode 0640 -> 0600)",
        f"truncated a torn last line of 11 bytes from {events}",
    ], r
    assert (mode_of(events.parent), mode_of(events)) == (0o700, 0o600)
    assert events.read_bytes() == whole
    again = world.ctx_as_user("session", "repair", *world.args(name), "--json")
    assert again.rc == 0 and again.json()["truncated_bytes"] == 0, again
    assert again.json()["tightened"] == [] and again.json()["left"] == [], again


def interrupted_repair(world: World, name: str, *extra: str) -> tuple[Run, Path, bytes]:
    """``ctx session repair`` of an older session with a torn line, whose file another
    process keeps locked, interrupted (Ctrl-C) once it has tightened the modes and waits for
    the lock; what it did, the file and its bytes."""
    body = line(event("kept", name)) + b'{"ts":"torn'
    events = make_session(world, name, body, dir_mode=0o750, file_mode=0o640)
    with open(events, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        proc = subprocess.Popen([*CTX_ARGV, "session", "repair", *world.args(name), *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, env=world.env)  # fmt: skip
        try:
            assert wait_for(lambda: mode_of(events) == 0o600, DEADLINE), "never tightened"
            time.sleep(0.5)  # now waiting for the lock
            assert proc.poll() is None
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=DEADLINE)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    run = Run(["session", "repair", name, *extra], proc.returncode, out.decode(), err.decode())
    return run, events, body


def test_ctrl_c_while_a_repair_waits_for_the_lock_cuts_nothing_and_says_what_it_tightened(
    world: World,
) -> None:
    """docs/sessions.md "Appending, crash-safely" (``repair`` takes the exclusive lock, waiting
    for appends in flight) and the exit statuses (130 and ``ctx: EINTR`` after Ctrl-C, what
    it printed being done): Ctrl-C while a repair waits for the lock ends it at once with
    EINTR, exit 130; the torn line is still there, and the lines it printed say which modes
    it tightened before."""
    r, events, body = interrupted_repair(world, "interrupted-text")
    assert r.rc == 130 and "ctx: EINTR: " in r.err and TRACEBACK not in r.err, r
    assert f"tightened {events.parent} (mode 0750 -> 0700)" in r.out, r
    assert events.read_bytes() == body


def test_ctrl_c_while_a_json_repair_waits_for_the_lock_says_what_it_tightened(
    world: World,
) -> None:
    """docs/sessions.md "Commands" (``repair --json`` gives the modes it tightened in its
    answer; a refusal after the modes changed says so, also with ``--json``, where no line
    said it) and the exit statuses (``ctx: EINTR: …`` after Ctrl-C says what the command
    had done): interrupted while it waits for the lock, a ``--json`` repair that has already
    tightened the session's modes must say so in its EINTR error, since nothing it printed
    did."""
    r, events, body = interrupted_repair(world, "interrupted-json", "--json")
    assert r.rc == 130 and TRACEBACK not in r.err, r
    error = json_error(r)
    assert error["error"] == "EINTR", r
    assert events.read_bytes() == body
    assert str(events.parent) in error["message"], r
