"""Following an event log as it grows (``ctx session tail --follow``, SPEC S-5).

The log is followed by its name, as ``tail -F`` follows a file: one removed is waited for,
one renamed away or replaced is read to its end before the file then at the name is read
from its start.  What is read is read as :mod:`cortexfs.shared.events` reads a log: a torn
last line waits for its end, a damaged line is skipped and told.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cortexfs.errors import CtxError
from cortexfs.shared.events import EventScan, open_to_read, stream_open_events


def follow_events(
    path: Path,
    *,
    offset: int = 0,
    first_line: int = 1,
    poll_interval: float = 0.2,
    dir_fd: int | None = None,
    open_directory: Callable[[], int] | None = None,
    on_restart: Callable[[str], None] | None = None,
    on_damaged: Callable[[EventScan], None] | None = None,
    held: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield events as they are appended (``tail --follow``); runs until the caller stops.

    Follows the name, as ``tail -F`` does.  The file is opened by its name at every look, so
    that one made unreadable ends the following with its error; the descriptor of the file
    being read is kept until the next look, so that a file renamed away or removed is read to
    its end before the name is followed further: a follower that fell behind loses none of
    its events.  A file that shrank below what was read (cut by someone who may write it) or
    that another file replaced is read again from its start, and ``on_restart`` is told why:
    waiting for it to grow past the old end would skip, silently, every event appended
    meanwhile.  A removed file is waited for, and read from its start when one is there again.
    A name that can no longer be followed (a link, a FIFO or a directory put there, a
    directory that may not be entered) ends the following with its error, once what is held
    has been read to its end.

    ``first_line`` is the number of the line at ``offset`` (one more than the lines read
    before it), so that the damaged lines told are numbered as :func:`read_events` numbers
    them from the file's start.  ``dir_fd`` as for :func:`read_events`; ``open_directory``,
    when given, opens the file's directory anew at each look (the caller closes nothing), so
    that a directory removed and made again is followed too.  ``on_damaged`` gets the scan of
    each read that skipped complete lines holding no event (:class:`EventScan` ``damaged``).

    ``held``, when given, is a descriptor of the file the caller has read up to ``offset``,
    which the follow takes over (and closes): what is appended to that file from then on is
    read, even when it is renamed away or removed before the first look.  Without it the
    file is opened by its name, and its absence is an error (ENOENT)."""
    # held: the file being read, until the name leads elsewhere
    named: int | None = None  # what the name leads to at this look
    line = first_line
    gone = False
    try:
        if held is None:
            held = _open_to_follow(path, dir_fd, open_directory)
        if held is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        while True:
            # The name is looked up before what is held is read to its end: an event appended
            # to a file just before it is renamed away is read from the held descriptor.
            try:
                named = _open_to_follow(path, dir_fd, open_directory)
            except (CtxError, OSError):
                # Whatever took the name, the held file was the one followed until then: the
                # events a follower that fell behind has not read yet are still yielded before
                # the refusal ends the following.
                if held is not None:
                    yield from _follow_read(held, EventScan(end=offset), line, on_damaged)
                raise
            if held is not None:
                scan = EventScan(end=offset)
                yield from _follow_read(held, scan, line, on_damaged)
                offset, line = scan.end, line + scan.lines
                same = named is not None and _identity(named) == _identity(held)
                # Forgotten before it is closed: a ^C just after the close would otherwise have
                # the cleanup below close it again (EBADF in place of the interrupt).
                read, held = held, None
                os.close(read)
                if same:
                    held, named = named, None  # the same file, held through the new descriptor
                    size = os.fstat(held).st_size
                    if size < offset:
                        why = f"{path} shrank to {size} bytes, from the {offset} read"
                        _restart(on_restart, why)
                        offset, line = 0, 1
                    elif scan.lines == 0:
                        time.sleep(poll_interval)
                    continue
            if named is None:
                if not gone:
                    _restart(on_restart, f"{path} is gone", "waiting for it to appear again")
                gone = True
                time.sleep(poll_interval)
                continue
            why = f"{path} appeared again" if gone else f"{path} was replaced by another file"
            _restart(on_restart, why)
            held, named, gone, offset, line = named, None, False, 0, 1
    finally:
        for fd in (held, named):
            if fd is not None:
                os.close(fd)


def _restart(
    on_restart: Callable[[str], None] | None,
    why: str,
    then: str = "following it again from its start",
) -> None:
    if on_restart is not None:
        on_restart(f"{why}: {then}")


def _follow_read(
    fd: int, scan: EventScan, first_line: int, on_damaged: Callable[[EventScan], None] | None
) -> Iterator[dict[str, Any]]:
    """The events of ``fd`` from ``scan.end`` on, as :func:`stream_events` reads them, and
    ``scan`` to ``on_damaged`` when it skipped damaged lines."""
    yield from stream_open_events(fd, scan, first_line)
    if scan.damaged_count and on_damaged is not None:
        on_damaged(scan)


def _open_to_follow(
    path: Path, dir_fd: int | None, open_directory: Callable[[], int] | None
) -> int | None:
    """A descriptor of the file at ``path`` now; None when nothing is there (nor, with
    ``open_directory``, its directory).  Any other error names ``path`` whole."""
    if open_directory is None:
        try:
            return open_to_read(path, dir_fd)
        except FileNotFoundError:
            return None
    try:
        directory = open_directory()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    try:
        return open_to_read(path, directory)
    except FileNotFoundError:
        return None
    finally:
        os.close(directory)


def _identity(fd: int) -> tuple[int, int]:
    status = os.fstat(fd)
    return status.st_dev, status.st_ino
