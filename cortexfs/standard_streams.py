"""Standard streams a command line was started without (``ctx … <&-``, ``>&-``).

A closed descriptor 0, 1 or 2 is the lowest free number, so the next file the command opens
would take it: a request file read as standard input, a lease written where stdout goes, a
tool started with that file as its own stdin.  And Python leaves ``sys.stdin`` None, which the
first ``-`` argument trips over.  Every such descriptor is opened on /dev/null first: a closed
stdin reads as empty (an empty request is refused with its reason), closed output is dropped,
as the caller asked.  The descriptor stays inheritable, as a standard stream is: a tool that
``ctx run`` starts on the caller's streams (T-3) gets /dev/null too, not a descriptor closed
at its exec that the next file it opens would take.

Which of them were closed is remembered (:func:`closed_at_start`): a command whose whole
answer is on standard output (the job name a ``publish`` or ``claim`` prints, any ``--json``
output) refuses to start without it rather than act and print into /dev/null.

An open standard output may still refuse what is written (``> /dev/full``, a full disk):
after :func:`tell_output_errors` that failure is an :class:`OutputError`, so that a command
can tell its output failing from a file of its own work failing with the same errno, and
:func:`discard_output` drops what such a stream still holds.  :func:`write_some` writes
with the same refusals, unbuffered, for a caller that must know what an interruption left
unwritten.
"""

from __future__ import annotations

import codecs
import fcntl
import io
import os
import sys
from typing import Any, BinaryIO, TextIO

from cortexfs.readiness import readable, writable

_STREAMS = ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w"))
_closed_at_start: set[int] = set()


def prepare_standard_streams() -> None:
    """Reopen the closed standard streams on /dev/null (above), and let standard output
    write what its encoding cannot: under a locale of a narrow charset (ISO-8859-1…), a
    character it lacks (``✓`` in a request, a page's ``—``) is written as ``\\u2713`` rather
    than end the command in a traceback.  (Python writes standard error that way already.)"""
    _reopen_closed_standard_streams()
    stdout = sys.stdout
    if isinstance(stdout, io.TextIOWrapper) and not writes_utf8(stdout):
        stdout.reconfigure(errors="backslashreplace")
    _drop_what_standard_error_refuses()


def writes_utf8(stream: TextIO) -> bool:
    """Whether ``stream`` writes text as UTF-8 (not in the narrow charset of a locale)."""
    return _codec(getattr(stream, "encoding", None) or "utf-8") == "utf-8"


def _codec(encoding: str) -> str:
    try:
        return codecs.lookup(encoding).name
    except LookupError:
        return encoding


def _reopen_closed_standard_streams() -> None:
    for fd, name, mode in _STREAMS:
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        _closed_at_start.add(fd)
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        else:  # os.open made it close-on-exec (PEP 446); dup2 does not
            os.set_inheritable(fd, True)
        if getattr(sys, name) is None:  # the stream lives as long as the process
            stream = open(fd, mode, closefd=False, errors="surrogateescape")  # noqa: SIM115
            setattr(sys, name, stream)


def closed_at_start(fd: int) -> bool:
    """Whether standard descriptor ``fd`` was closed when this process started (it reads or
    writes /dev/null since :func:`reopen_closed_standard_streams`)."""
    return fd in _closed_at_start


def open_write_only(fd: int) -> bool:
    """Whether descriptor ``fd`` was opened for writing only: a script's ``0>>FILE`` gives a
    command a standard input that every read refuses (EBADF)."""
    try:
        return fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_WRONLY
    except OSError:
        return False


class _StandardError(io.FileIO):
    """Standard error, whose writes never end a command: a note or a refusal it refuses
    (``2>/dev/full``, a reader that left) is dropped, and changes neither what the command did
    nor its exit status, which say the rest.  Left to fail, it would stop a command midway,
    lose a ``--json`` error object written after it, or turn the exit status into 120 at the
    interpreter's last flush.  A full non-blocking pipe is waited on, not dropped."""

    def write(self, data: bytes) -> int:  # type: ignore[override]
        while True:
            try:
                written = super().write(data)
            except OSError:
                return len(data)
            if written is not None:
                return written
            writable([self], None)  # non-blocking and full: wait for room


def _drop_what_standard_error_refuses() -> None:
    """``sys.stderr`` on :class:`_StandardError`, line-buffered as Python makes it."""
    sys.stderr = _written_through(sys.stderr, _StandardError, line_buffering=True)


def _written_through(stream: TextIO, raw: type[io.FileIO], *, line_buffering: bool) -> TextIO:
    """``stream`` writing through ``raw`` (on its descriptor), its encoding and errors as they
    were; ``stream`` itself when it already does, or has no descriptor (a caller's own)."""
    if isinstance(getattr(getattr(stream, "buffer", None), "raw", None), raw):
        return stream
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):
        return stream
    stream.flush()
    return io.TextIOWrapper(
        io.BufferedWriter(raw(fd, "w", closefd=False)),
        encoding=stream.encoding,
        errors=stream.errors,
        line_buffering=line_buffering,
    )


class OutputError(OSError):
    """Standard output refused what was written (``ENOSPC``, ``EIO``…); a reader that left is
    still a plain ``BrokenPipeError``."""


class _StandardOutput(io.FileIO):
    """Standard output whose refusals are :class:`OutputError`, and which waits for room when
    it is non-blocking and full (a pipe whose other end set ``O_NONBLOCK``, as node does, and
    which a reader empties at its own pace): the output is whole, never cut at 64 KiB."""

    def write(self, data: bytes) -> int:  # type: ignore[override]
        while True:
            try:
                written = super().write(data)
            except BrokenPipeError:
                raise
            except OSError as exc:
                raise OutputError(exc.errno, exc.strerror) from None
            if written is not None:
                return written
            writable([self], None)


def write_some(fd: int, data: bytes | memoryview) -> int:
    """One write of ``data`` (not empty) to output descriptor ``fd``: how many of its bytes
    went out, as :class:`_StandardOutput` writes (a refusal an :class:`OutputError`, a reader
    that left a ``BrokenPipeError``, room waited for when ``fd`` is non-blocking and full).
    Unbuffered, so that a caller keeping count of what went out knows what an interruption
    (Ctrl-C, SIGTERM) left unwritten: a buffered stream keeps what a raising write was given,
    and writes it again at its next flush, bytes that had gone out included."""
    while True:
        try:
            return os.write(fd, data)
        except BlockingIOError:
            writable([fd], None)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise OutputError(exc.errno, exc.strerror) from None


class _WaitingInput(io.FileIO):
    """Standard input that waits when it is non-blocking and empty for now: read as it
    comes, ``EAGAIN`` reads as its end, and a request, a batch or a result would be taken
    whole when only its first part had arrived."""

    def readinto(self, buffer: Any) -> int:  # type: ignore[override]
        while True:
            got = super().readinto(buffer)
            if got is not None:
                return got
            readable([self], None)


def standard_input() -> BinaryIO:
    """Standard input's bytes, read to their end whether its descriptor blocks or not."""
    return io.BufferedReader(_WaitingInput(0, "r", closefd=False))


def tell_output_errors() -> None:
    """Make ``sys.stdout`` raise :class:`OutputError` when its descriptor refuses a write;
    everything else about it (encoding, errors, line buffering) stays as it was.  Once is
    enough: a command that runs another's code (``ctx --storage DIR run``) may call it again."""
    stdout = sys.stdout
    buffering = getattr(stdout, "line_buffering", False)
    sys.stdout = _written_through(stdout, _StandardOutput, line_buffering=buffering)


def discard_output(stream: TextIO) -> None:
    """Point ``stream``'s descriptor at /dev/null: what it still buffers, and whatever is
    written to it later, goes nowhere instead of failing again (at the interpreter's last
    flush, which would turn the exit status into 120)."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, stream.fileno())
    finally:
        os.close(null)
