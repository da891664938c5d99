"""Exit statuses of every ``ctx`` command (SPEC §2.4, plus 128 + the signal for a command a
signal stopped — 130 for Ctrl-C —, 141 for a reader that left and 74 for an output that could
not be written), the error that selects status 2, and the end of a command Ctrl-C stopped or
whose output was lost.

Written without click, like ``ctx run``, which starts without it (:mod:`cortexfs.cli`): every
command ends through here, the click commands by way of :mod:`cortexfs.cli.common`."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator
from typing import NoReturn

from cortexfs.errors import CtxError, out_of_memory
from cortexfs.printable import printable
from cortexfs.readiness import writable
from cortexfs.standard_streams import discard_output

EXIT_OK = 0
EXIT_REFUSED = 1  # an operation or request was refused, or a conflict was found
EXIT_USAGE = 2  # a malformed command line
EXIT_NOTHING = 3  # nothing to do
# The reader of the output left (`ctx queue status | head -1`): 128 + SIGPIPE, as the shell
# reports a command that SIGPIPE ended, never 1, which would say a conflict was found.
EXIT_READER_GONE = 141
# Standard output could not be written (a full disk, `> /dev/full`): the command's answer was
# lost, which is not a refusal, a denial or a conflict found (1 says those), nor a malformed
# command line (2).  EX_IOERR of sysexits.h.
EXIT_OUTPUT_FAILED = 74


class UsageProblem(CtxError):
    """A malformed command line (a bad name, a bad number): exit status 2, not 1."""


def usage_problem(error: CtxError) -> UsageProblem:
    return UsageProblem(error.errno, error.message)


def exit_status(error: CtxError) -> int:
    return EXIT_USAGE if isinstance(error, UsageProblem) else EXIT_REFUSED


def interrupted(prog_name: str, as_json: bool, signum: int = signal.SIGINT) -> NoReturn:
    """End a command stopped by Ctrl-C (or, for ``ctx run``, by SIGTERM or SIGHUP: see
    :func:`cortexfs.interrupts.stops_raise`) as every refusal ends (``ctx: EINTR: …``, the
    error object on stdout with --json), with the status a shell gives a command that signal
    killed (128 + its number).

    Written without click: a Ctrl-C may land while click itself is being imported."""
    how = "interrupted" if signum == signal.SIGINT else "stopped"
    context = "".join(
        f", {words}: {'; '.join(statements)}"
        for words, statements in (
            ("after it had done this", _changes),
            ("while this was under way, and may be done now", _under_way),
        )
        if statements
    )
    error = CtxError(
        errno.EINTR,
        f"{how} ({signal.Signals(signum).name}) before the command completed{context}: what it "
        "printed is done; check the rest and run it again if it is still wanted",
    )
    sys.stderr.write(f"{prog_name}: {printable(str(error))}\n")
    _leave_output(json.dumps(error.to_json()) + "\n" if as_json else "")
    sys.exit(128 + signum)


# How long the error object of an interrupted --json command waits for room in its standard
# output: a reader that reads makes room at once, and one that stopped reading must not keep
# the command from ending.
_ANSWER_WAIT_SECONDS = 1.0


def _leave_output(answer: str) -> None:
    """Drop what standard output still holds, then write ``answer`` (the error object of
    --json, or nothing) if the output takes it within :data:`_ANSWER_WAIT_SECONDS`.

    Every line a command prints is flushed as it is printed (click.echo): what is still held
    is what the write Ctrl-C interrupted had not got out, a reader that stopped reading
    leaving the pipe full.  Written at the exit, it would keep the command there for as long
    as nobody reads, Ctrl-C or not."""
    try:
        kept = os.dup(sys.stdout.fileno())
    except (AttributeError, ValueError, OSError):  # a caller's own stream, with no descriptor
        sys.stdout.write(answer)
        return
    try:
        discard_output(sys.stdout)
        # A second Ctrl-C ends the wait; an output that refuses the answer loses it alone.
        with contextlib.suppress(OSError, KeyboardInterrupt):
            _write_within(kept, answer.encode(), time.monotonic() + _ANSWER_WAIT_SECONDS)
    finally:
        os.close(kept)


def _write_within(fd: int, data: bytes, deadline: float) -> None:
    """``data`` written to ``fd`` as far as it takes it before ``deadline``: a pipe said to
    have room takes at least ``PIPE_BUF`` bytes at once, so no write waits past it."""
    while data:
        left = deadline - time.monotonic()
        if left <= 0 or not writable([fd], left):
            return
        data = data[os.write(fd, data[: select.PIPE_BUF]) :]


def ran_out_of_memory(prog_name: str, as_json: bool, *, queue_command: bool = False) -> NoReturn:
    """End a command that ran out of memory (a MemoryError) as every refusal ends (``ctx:
    ENOMEM: …``, the error object on stdout with --json, exit 1), saying what it had changed
    for good before, and for a ``queue_command`` what settles one stopped midway: never a
    traceback."""
    done = f" after it had done this: {'; '.join(_changes)}" if _changes else ""
    queue = " ('ctx queue recover' settles a queue command stopped midway)" if queue_command else ""
    error = out_of_memory(f"the command stopped{done}{queue}")
    sys.stderr.write(f"{prog_name}: {printable(str(error))}\n")
    if as_json:
        sys.stdout.write(json.dumps(error.to_json()) + "\n")
    sys.exit(1)


# What this command has changed so far, each as a sentence saying what not to do again
# (:func:`changed`).  A process runs one command.
_changes: list[str] = []


# What this command has set going and cannot tell yet whether it happened, each as a
# sentence saying how to find out or undo it (:func:`under_way`).
_under_way: list[str] = []


@contextlib.contextmanager
def under_way(statement: str) -> Iterator[None]:
    """Within the block, an interruption says ``statement`` may have happened: a step handed
    to another process (a terminal that starts in a process of its own) goes on whatever
    becomes of this one, and "run it again" alone would send the user into its ``EEXIST``."""
    _under_way.append(statement)
    try:
        yield
    except Exception:  # the step failed, and says so: nothing is under way any more
        _under_way.remove(statement)
        raise
    else:
        _under_way.remove(statement)
    # An interrupt (KeyboardInterrupt, or SystemExit on its way out) leaves it for
    # interrupted() to say.


def changed(statement: str) -> None:
    """Note what the command has just changed for good, in words that say what not to do
    again: ``job J was finished (do not finish it again)``.  Called once the change is made
    and before its output is written: should the output then fail, :func:`output_failed`
    says it, rather than a bare ``ENOSPC`` that reads as a refusal."""
    _changes.append(statement)


def output_failed(error: OSError, prog_name: str, suggest: Callable[[str], str] = str) -> NoReturn:
    """End a command whose standard output could not be written: ``ctx: ENOSPC: cannot write
    standard output (…)``, and what it had :func:`changed`, on standard error; exit
    :data:`EXIT_OUTPUT_FAILED`, which no answer of a command (a denial, a conflict, a
    refusal) shares.  What stdout still buffers is dropped: it can go nowhere.  ``suggest``
    rewrites the commands the message suggests (to name the queue the command was given)."""
    discard_output(sys.stdout)
    reason = f"cannot write standard output ({error.strerror or error})"
    failure = CtxError(error.errno or errno.EIO, suggest("; ".join([reason, *_changes])))
    sys.stderr.write(f"{prog_name}: {printable(str(failure))}\n")
    sys.stderr.flush()
    sys.exit(EXIT_OUTPUT_FAILED)


def reader_gone() -> NoReturn:
    """End a command whose reader left (a closed pipe): quietly, exit
    :data:`EXIT_READER_GONE`, with stdout pointed at /dev/null so that the interpreter's last
    flush cannot complain either."""
    discard_output(sys.stdout)
    sys.exit(EXIT_READER_GONE)
