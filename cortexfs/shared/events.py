"""Append-only event logs: a session's ``events.jsonl`` and an object's ``log`` (SPEC S-2..S-5).

One event is one JSON object on one line, and its first key is always ``ts``::

    {"ts":"2026-06-22T12:00:00.000000Z","type":"tool_call","agent":"coder","session":"default","object":"tool/fs.read","status":"ok"}

Writing (S-5).  :meth:`EventLog.append` writes the whole line with one ``write`` on an
``O_APPEND`` descriptor, so the kernel places it at the end of the file in one piece and
concurrent appenders — threads, processes, workers — never interleave inside a line.  Each
append holds a shared ``flock`` for its write (and fsync), so ``ctx session repair``, which takes
the exclusive lock, can never cut a line that is being written.  A durable append is fsynced
before it returns: tool results and queue transitions are recorded that way, so an action
reported done has its event on disk.

Reading.  A crash in the middle of a write can leave the last line torn (no newline).  Readers
ignore it and :func:`repair` truncates it.  If nobody repaired and a later append glued a whole
event to the torn fragment, readers resynchronise on the ``{"ts":`` that starts every event,
so the later event is not lost with the fragment.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from cortexfs import capabilities, durable, jsontext
from cortexfs.errors import CtxError, invalid, owner_left_out, too_big
from cortexfs.file_attributes import refusing_attribute
from cortexfs.locks import flock_within
from cortexfs.shared.tree import Ownership
from cortexfs.timefmt import rfc3339

EVENTS_FILE = "events.jsonl"
# An event is a summary of facts (S-4), never a payload; a line this long is a bug upstream.
MAX_EVENT_BYTES = 64 * 1024
EVENT_START = b'{"ts":'
_READ_CHUNK = 64 * 1024


# An event carries a tool's input or output, each at most jsontext.MAX_DEPTH deep, a few
# levels down: room for them, and far from the interpreter's recursion limit.  Readers take
# no deeper line, so none is written (:func:`encode_event`).
MAX_EVENT_DEPTH = 2 * jsontext.MAX_DEPTH


def make_event(
    event_type: str, *, agent: str, session: str, object: str, status: str, **facts: Any
) -> dict[str, Any]:
    """An event of the minimal shape of S-2 (in that key order) plus extra facts.  A fact
    named ``ts`` or ``type`` is a TypeError, as one named ``agent`` is: the timestamp and the
    type are what the event is made with, never replaced by a fact."""
    event = {
        "ts": rfc3339(),
        "type": event_type,
        "agent": agent,
        "session": session,
        "object": object,
        "status": status,
    }
    replaced = [key for key in ("ts", "type") if key in facts]
    if replaced:
        raise TypeError(
            f"make_event() got a fact named {replaced[0]!r}, which the event is made with "
            "(S-2); give that fact another name"
        )
    event.update(facts)
    return event


def encode_event(event: Mapping[str, Any]) -> bytes:
    """One compact JSON line; EINVAL unless ``ts`` comes first or when no reader would take
    the line back (:func:`parse_event_line`), EFBIG when it is too long.

    An event holding a lone surrogate is written all escaped, so it is recorded as it came
    rather than refused (:func:`cortexfs.jsontext.dumps_utf8`).
    """
    if next(iter(event), None) != "ts":
        raise invalid("an event's first key must be 'ts' (readers resynchronise on it)")
    try:
        # As strictly as readers parse a line: NaN, an infinity, an integer of more digits
        # than Python reads or nesting past MAX_EVENT_DEPTH would be a line every reader
        # skips as damaged, after the appender reported the event recorded.
        line = jsontext.dumps_document(
            event, separators=(",", ":"), default=str, max_depth=MAX_EVENT_DEPTH
        )
    except jsontext.Unwritable as exc:
        raise invalid(
            f"the event {exc}, so readers would skip its line as damaged; it was not "
            "recorded: give that fact as text, or summarise it"
        ) from None
    if len(line) >= MAX_EVENT_BYTES:
        raise too_big(f"an event of {len(line)} bytes exceeds {MAX_EVENT_BYTES}; summarise it")
    return line + b"\n"


class EventLog:
    """An event log opened for appending; keep it open to append many events cheaply.

    Creating the file also makes its name durable (the parent directory is synced), so the
    first durable event of a new session survives a crash together with the file holding it.
    A file created by root is given to ``owner`` (the agent whose session or home it is in).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        mode: int = 0o640,
        owner: Ownership | None = None,
        ops: durable.FsOps | None = None,
        dir_fd: int | None = None,
        create: bool = True,
    ) -> None:
        """Open ``path`` (a str or a path-like object, as the readers take it); with ``dir_fd``
        (which stays the caller's), its name in that directory.  Without ``create``, a missing
        log is FileNotFoundError (a tool's log is a control its installation makes, never a
        call)."""
        path = self.path = Path(path)
        self._ops = ops or durable.default_ops()
        self._threads = threading.Lock()  # guards _appending and the descriptor's flock
        self._appending = 0  # threads of this process between their lock and their unlock
        own_dir_fd = dir_fd is None
        if dir_fd is None:
            dir_fd = durable.open_dir_path(self._ops, str(path.parent))
        try:
            self._fd, created = self._open(path, dir_fd, mode, create)
            if created:
                # Only the file this open made is given away and chmodded: one found at the
                # name may be anybody's, put there by a user who may write the directory.
                if owner is not None and os.geteuid() == 0:
                    os.fchown(self._fd, owner.uid, owner.gid)
                os.fchmod(self._fd, mode)  # open() applied the umask; the mode is the contract
                durable.sync_dir(self._ops, dir_fd)
            else:
                self._cut_torn_line()
        except BaseException:
            if getattr(self, "_fd", -1) >= 0:
                self._ops.close(self._fd)
            raise
        finally:
            if own_dir_fd:
                self._ops.close(dir_fd)

    def _open(self, path: Path, dir_fd: int, mode: int, create: bool) -> tuple[int, bool]:
        """The log's descriptor, and whether this open created the file.  An existing file is
        appended to only when it is a regular file with no other name: a hard link put at the
        name would have the events (and a torn line's truncation) land in another file."""
        for _ in range(8):  # a name removed and made again between the two opens: once more
            existing = durable.lstat_at(dir_fd, path.name)
            if existing is not None and not stat.S_ISREG(existing.st_mode):
                raise invalid(f"{path} is not a regular file; refusing to append to it")
            if existing is None and not create:
                raise FileNotFoundError(errno.ENOENT, f"{path} does not exist")
            try:
                if existing is None:
                    return self._ops.open_append(path.name, dir_fd, mode, create=True), True
                fd = self._ops.open_append(path.name, dir_fd, mode, create=False)
            except (FileExistsError, FileNotFoundError):
                continue
            except OSError as exc:
                # Opened in its directory, the kernel names only the file ("events.jsonl: Read-
                # only file system"): the path says which log of which session it was.
                raise OSError(exc.errno, exc.strerror, str(path)) from None
            why = _not_a_lone_regular_file(os.fstat(fd))
            if why:
                self._ops.close(fd)
                raise invalid(f"{path} is {why}; refusing to append to it")
            return fd, False
        raise CtxError(errno.EAGAIN, f"{path} kept appearing and disappearing; try again")

    def _cut_torn_line(self) -> None:
        """Truncate a torn last line before the first append, which would otherwise be glued
        onto it, making one unreadable line of a torn fragment and a whole event (S-5).

        Checked under the exclusive lock: appends in flight hold it shared, so a last line
        without its newline seen then is a crash's leftover, not someone's append."""
        if not _ends_torn(self._fd):
            return
        try:
            _truncate_torn_line(self._ops, self._fd, self.path)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def append(self, event: Mapping[str, Any], *, durable_event: bool = False) -> None:
        """Append one event as one line; with ``durable_event`` it is on disk when this returns."""
        line = encode_event(event)
        self._begin_append()
        try:
            self._ops.write(self._fd, line)
            if durable_event:
                self._ops.fsync(self._fd)
        except OSError as exc:
            raise self._naming_the_log(exc) from None
        finally:
            self._end_append()

    def _begin_append(self) -> None:
        """Hold the log's shared lock for this thread's append.

        flock belongs to the descriptor, which the threads appending through one log share (a
        worker's job slots): the first of them to begin takes it and the last to end lets it
        go, so that no thread's unlock drops the lock another thread's write still needs.  The
        first one also cuts a fragment that a writer which died mid-append left since the log
        was opened (S-5), as an open cuts it: no event of this process is half-written then,
        and the exclusive lock the cut takes waits for other processes' appends."""
        with self._threads:
            if self._appending == 0:
                _lock(self._fd, fcntl.LOCK_SH, self.path)
                try:
                    if _ends_torn(self._fd):
                        _truncate_torn_line(self._ops, self._fd, self.path)
                        _lock(self._fd, fcntl.LOCK_SH, self.path)
                except BaseException:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)
                    raise
            self._appending += 1

    def _end_append(self) -> None:
        with self._threads:
            self._appending -= 1
            if self._appending == 0:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def moved(self) -> bool:
        """Whether the log's name now holds another file, or none: it was renamed away (a
        rotation) or removed since it was opened."""
        try:
            named = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return True
        except OSError:
            return False  # nothing to tell: appends go on where they went
        held = os.fstat(self._fd)
        return (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino)

    def sync(self) -> None:
        """Make every event appended so far durable (one fsync for several appends)."""
        try:
            self._ops.fsync(self._fd)
        except OSError as exc:
            raise self._naming_the_log(exc) from None

    def _naming_the_log(self, exc: OSError) -> OSError:
        """``exc`` of a write or fsync through the descriptor, which names no file ("No space
        left on device"), as the same error naming this log."""
        return OSError(exc.errno, exc.strerror, str(self.path))

    def close(self) -> None:
        if self._fd >= 0:
            self._ops.close(self._fd)
            self._fd = -1

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def append_event(
    path: str | os.PathLike[str],
    event: Mapping[str, Any],
    *,
    durable_event: bool = False,
    mode: int = 0o640,
    ops: durable.FsOps | None = None,
) -> None:
    """Open, append one event, close: for a single event (hold an :class:`EventLog` for many)."""
    with EventLog(path, mode=mode, ops=ops) as log:
        log.append(event, durable_event=durable_event)


# ------------------------------------------------------------------------------- reading


class EventScan:
    """What a read found: the events in order, and what it had to skip.

    ``end`` is the offset just past the last complete line: resume reading there; ``lines``
    how many complete lines were read.  ``damaged`` holds the numbers of the first
    :data:`DAMAGED_LISTED` complete lines that held no event, ``damaged_count`` how many
    there were in all; ``torn_tail`` the byte count of an unterminated last line (a torn
    write, or one still being written).
    """

    # A plain class, not a dataclass: ``ctx run`` imports this module (see cortexfs.tools.result).
    __slots__ = ("damaged", "damaged_count", "end", "events", "lines", "torn_tail")

    def __init__(self, *, end: int = 0) -> None:
        self.events: list[dict[str, Any]] = []
        self.damaged: list[int] = []
        self.damaged_count = 0
        self.lines = 0
        self.torn_tail = 0
        self.end = end

    def _take(self, raw: bytes, number: int) -> dict[str, Any] | None:
        """The event on complete line ``number`` (None when it holds none, which is noted)."""
        self.lines += 1
        event = parse_event_line(raw)
        if event is None:
            self.damaged_count += 1
            if len(self.damaged) < DAMAGED_LISTED:
                self.damaged.append(number)
        return event


DAMAGED_LISTED = 100  # damaged line numbers a scan keeps: a file of empty lines stays small


def read_events(
    path: Path, *, offset: int = 0, first_line: int = 1, dir_fd: int | None = None
) -> EventScan:
    """The events of ``path`` from byte ``offset`` (the start of a line) to the last full line.

    With ``dir_fd`` (which stays the caller's), ``path``'s name in that directory: a directory
    reached without following links, for a file inside a tree its users may change.  Read as
    :func:`stream_events` reads it.
    """
    scan = EventScan(end=offset)
    scan.events.extend(stream_events(path, scan, first_line=first_line, dir_fd=dir_fd))
    return scan


def stream_events(
    path: Path, scan: EventScan, *, first_line: int = 1, dir_fd: int | None = None
) -> Iterator[dict[str, Any]]:
    """Yield the events of ``path`` from byte ``scan.end`` on, one line at a time, recording
    in ``scan`` what was read and skipped (its ``events`` are left to the caller).

    The file is read in pieces (:class:`_Lines`), so a file whoever may write the session
    directory put there — a sparse file of gigabytes with no newline, say — costs what it
    holds in data, never its apparent size, and at most two pieces of memory.  A complete
    line longer than any event (which no writer writes, :func:`encode_event`) is a damaged
    line like any other, and an unterminated last line of any length a torn one.
    """
    fd = open_to_read(path, dir_fd)
    try:
        yield from stream_open_events(fd, scan, first_line)
    finally:
        os.close(fd)


def stream_open_events(fd: int, scan: EventScan, first_line: int = 1) -> Iterator[dict[str, Any]]:
    """The events of the open file ``fd`` (which stays the caller's) from byte ``scan.end``
    on, as :func:`stream_events` yields them, recording in ``scan`` what was read and
    skipped.  Read by offset: the descriptor's own position is neither used nor moved."""
    lines = _Lines(fd, scan.end)
    for number, (text, end) in enumerate(lines, start=first_line):
        event = scan._take(text, number)
        scan.end = end
        if event is not None:
            yield event
    scan.torn_tail = lines.torn_tail


class _Lines:
    """The complete lines of an open file from ``offset`` on, as ``(text, end)``: ``end`` is
    the offset just past the newline, and ``text`` the line without it — or, for a line longer
    than any event, only its last :data:`MAX_EVENT_BYTES`, where an event glued to a torn
    fragment would be (:func:`parse_event_line`).  Once iterated, ``torn_tail`` is the length
    of an unterminated last line.

    Past the first :data:`MAX_EVENT_BYTES` of a line, the holes of a sparse file are skipped
    rather than read: a hole reads as NULs, which hold no newline and are in no event.
    """

    def __init__(self, fd: int, offset: int) -> None:
        self._fd = fd
        self._offset = offset
        self.torn_tail = 0

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        position = line_start = self._offset
        held = b""  # the line read so far; once it is too long for an event, only its end
        while True:
            if position - line_start >= MAX_EVENT_BYTES:
                data = _next_data(self._fd, position)
                if data != position:
                    position, held = data, b""
            chunk = os.pread(self._fd, _READ_CHUNK, position)
            if not chunk:
                break
            start = 0
            while (newline := chunk.find(b"\n", start)) != -1:
                line_start = position + newline + 1
                yield (held + chunk[start:newline])[-MAX_EVENT_BYTES:], line_start
                held, start = b"", newline + 1
            held = (held + chunk[start:])[-MAX_EVENT_BYTES:]
            position += len(chunk)
        self.torn_tail = position - line_start


def _next_data(fd: int, offset: int) -> int:
    """Where the first byte of data at or after ``offset`` is, skipping a hole (the file's
    size when only a hole follows; ``offset`` itself on a filesystem that cannot tell)."""
    try:
        return os.lseek(fd, offset, os.SEEK_DATA)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            return max(offset, os.fstat(fd).st_size)
        if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return offset
        raise


def open_to_read(path: Path, dir_fd: int | None = None) -> int:
    """A descriptor of the events file ``path`` (``dir_fd`` as for :func:`read_events`) for
    reading.  A symbolic link or anything but a regular file is refused (EINVAL); any other
    error is an OSError naming ``path`` whole."""
    try:
        fd = _open_file(path, os.O_RDONLY, dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise invalid(f"{path} is a symbolic link; refusing to read it") from None
        if exc.errno == errno.ENXIO:  # a socket: open says "No such device or address"
            raise invalid(f"{path} is not a regular file") from None
        raise OSError(exc.errno, exc.strerror, str(path)) from None  # named whole, not by dir_fd
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise invalid(f"{path} is not a regular file")
    return fd


def scan_lines(data: bytes, *, offset: int = 0, first_line: int = 1) -> EventScan:
    """Parse event lines held in memory; see :class:`EventScan` for what is skipped and
    reported (no line is refused for its length here: the caller has read it already)."""
    scan = EventScan(end=offset)
    complete, _, tail = data.rpartition(b"\n")
    scan.torn_tail = len(tail)
    if not complete and not data.endswith(b"\n"):
        return scan
    for number, raw in enumerate(complete.split(b"\n"), start=first_line):
        event = scan._take(raw, number)
        if event is not None:
            scan.events.append(event)
    scan.end = offset + len(complete) + 1
    return scan


def parse_event_line(raw: bytes) -> dict[str, Any] | None:
    """The event on one line, resynchronising past a torn fragment glued in front of it.

    An event is a JSON object with a ``ts`` (S-2): any other JSON value on a line (``{}``,
    ``[1]``, ``"x"``) holds no event and the line is damaged."""
    start = 0
    while start != -1:
        try:
            # Strictly: NaN or Infinity would be written back by show --json as no JSON, and
            # a line nested past the interpreter's recursion would end the reader.  Decoded
            # here, as UTF-8: json.loads would take bytes holding NULs for UTF-16.
            text = raw[start:].decode()
            event = jsontext.loads_strict(text, unique_names=False, max_depth=MAX_EVENT_DEPTH)
        except ValueError:
            event = None
        if isinstance(event, dict) and "ts" in event:
            return event
        # A nested object that happens to start with "ts" parses but does not reach the end
        # of the line ("extra data"), so only a whole event can be accepted here.
        start = raw.find(EVENT_START, start + 1)
    return None


def repair(path: Path, ops: durable.FsOps | None = None, *, dir_fd: int | None = None) -> int:
    """Truncate a torn last line (S-5); return the number of bytes removed (0: nothing torn).

    Holds the exclusive lock, which waits for every append in flight (they hold it shared).
    ``dir_fd`` as for :func:`read_events`.  A file with another name is refused (EINVAL), as
    the appender refuses it: a hard link put at the name would have the cut land in another
    file, wherever that file's other name is.
    """
    ops = ops or durable.default_ops()
    try:
        fd = _open_file(path, os.O_RDWR, dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise invalid(f"{path} is a symbolic link; refusing to repair it") from None
        if exc.errno in (errno.EISDIR, errno.ENXIO):  # ENXIO: a socket
            raise invalid(f"{path} is not a regular file") from None
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return _repair_unwritable(path, dir_fd, exc.errno)
        raise OSError(exc.errno, exc.strerror, str(path)) from None  # named whole, as show does
    try:
        _require_lone_regular_file(fd, path)
        return _truncate_torn_line(ops, fd, path)
    finally:
        ops.close(fd)


def _repair_unwritable(path: Path, dir_fd: int | None, refused: int) -> int:
    """:func:`repair` of a file that may not be written (``refused``: EROFS, a read-only
    filesystem; EACCES or EPERM, a caller who may only read it): 0 when its last line is
    whole, so that there is nothing to do; ``refused``, saying what is torn, when it is not.
    Under the exclusive lock, as a repair: a line in flight is not taken for a torn one."""
    try:
        fd = _open_file(path, os.O_RDONLY, dir_fd)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None  # named whole
    try:
        _require_lone_regular_file(fd, path)
        _lock(fd, fcntl.LOCK_EX, path)
        if not _ends_torn(fd):
            return 0
        status = os.fstat(fd)
        torn = status.st_size - _end_of_last_line(fd, status.st_size)
        pinned = refusing_attribute(fd)
    finally:
        os.close(fd)
    if refused == errno.EROFS:
        why, remedy = "while its filesystem is read-only", "remount it read-write and repair again"
    elif pinned is not None:
        why = f"while it is {pinned.name} (attribute '{pinned.letter}', which 'lsattr' shows)"
        remedy = f"have root remove it with 'chattr -{pinned.letter} {path}' and repair again"
    else:
        why = "by a caller who may not write it"
        if status.st_uid == os.geteuid():
            remedy = f"{owner_left_out('w')} and repair again"
        else:
            remedy = (
                capabilities.root_without(capabilities.CAP_DAC_OVERRIDE)
                or "repair it as its owner or as root"
            )
    raise CtxError(
        refused,
        f"{path} ends with a torn line of {torn} bytes, which cannot be cut {why}; nothing "
        f"was changed: {remedy}",
    )


def _not_a_lone_regular_file(status: os.stat_result) -> str:
    """What makes a log unsafe to change through its descriptor, or "": not a regular file,
    or a file with another name (a hard link to a file elsewhere)."""
    if not stat.S_ISREG(status.st_mode):
        return "not a regular file"
    if status.st_nlink != 1:
        return f"a file with {status.st_nlink} names (hard links)"
    return ""


def _require_lone_regular_file(fd: int, path: Path) -> None:
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode):
        raise invalid(f"{path} is not a regular file")  # as show and tail say it
    why = _not_a_lone_regular_file(status)
    if why:
        raise invalid(f"{path} is {why}; refusing to repair it")


def _open_file(path: Path, access: int, dir_fd: int | None) -> int:
    flags = access | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    if dir_fd is None:
        return os.open(path, flags)
    return os.open(path.name, flags, dir_fd=dir_fd)


LOCK_WAIT_SECONDS = 10.0  # an append holds its lock for one write and fsync, never longer


def _lock(fd: int, kind: int, path: Path | None) -> None:
    """``flock(fd, kind)``, waiting at most :data:`LOCK_WAIT_SECONDS`: a process that keeps a
    log locked (anyone who may open it may lock it) must not hold a tool call, a worker or
    ``ctx session repair`` forever.  EAGAIN, saying so, when the wait runs out."""
    if not flock_within(fd, kind, LOCK_WAIT_SECONDS):
        raise CtxError(
            errno.EAGAIN,
            f"{path or 'the event log'} stayed locked by another process for "
            f"{LOCK_WAIT_SECONDS:g} s; an append or repair takes milliseconds, so "
            "something keeps it locked: find it with 'fuser' and end it",
        )


def _truncate_torn_line(ops: durable.FsOps, fd: int, path: Path | None = None) -> int:
    """Take the exclusive lock (held on return; closing or unlocking ``fd`` releases it),
    which waits for every append in flight, then cut a torn last line durably.  The number
    of bytes removed (0: nothing torn)."""
    _lock(fd, fcntl.LOCK_EX, path)
    size = os.fstat(fd).st_size
    keep = _end_of_last_line(fd, size)
    if keep == size:
        return 0
    try:
        ops.truncate(fd, keep)
    except OSError as exc:
        raise _cut_refused(exc, fd, path, size - keep) from None
    ops.fsync(fd)
    return size - keep


def _cut_refused(exc: OSError, fd: int, path: Path | None, torn: int) -> CtxError | OSError:
    """The error of cutting the ``torn`` bytes of the log open as ``fd`` that the kernel
    refused with ``exc``, naming the log: a truncate names no file.  An append-only log,
    which an appender opens (``O_APPEND``) but may never cut, to root too, is refused with
    its attribute and the ``chattr`` that lifts it, not a bare "Operation not permitted"."""
    pinned = refusing_attribute(fd) if exc.errno == errno.EPERM else None
    if pinned is None:
        return OSError(exc.errno, exc.strerror, None if path is None else str(path))
    shown = path or "the event log"
    return CtxError(
        errno.EPERM,
        f"{shown} ends with a torn line of {torn} bytes, which cannot be cut while it is "
        f"{pinned.name} (attribute '{pinned.letter}', which 'lsattr' shows), and no event is "
        "appended after a torn line (it would be glued onto it); nothing was changed: have "
        f"root lift the attribute with 'chattr -i -a {shown}', and the next append cuts it",
    )


def _ends_torn(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


def _end_of_last_line(fd: int, size: int) -> int:
    """The offset just past the last newline of the file (0 when it holds none).

    A torn append is shorter than one event, so the last :data:`MAX_EVENT_BYTES` hold that
    newline but for a last line someone else wrote.  Then the file is read through from its
    start, a piece at a time and past the holes of a sparse file (they hold no newline): that
    costs what the file holds in data, never its apparent size, in time or memory.
    """
    start = max(0, size - MAX_EVENT_BYTES)
    newline = os.pread(fd, size - start, start).rfind(b"\n")
    if newline != -1:
        return start + newline + 1
    last_end, position = 0, 0
    while (position := _next_data(fd, position)) < start:
        piece = os.pread(fd, min(_READ_CHUNK, start - position), position)
        if not piece:
            break
        newline = piece.rfind(b"\n")
        if newline != -1:
            last_end = position + newline + 1
        position += len(piece)
    return last_end
