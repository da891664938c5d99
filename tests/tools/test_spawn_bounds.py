"""What a captured call keeps of a tool that writes too much: the output limit exactly, and a
stderr line without end passed on in pieces rather than held whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

from cortexfs.tools.spawn import MAX_STDERR_TAIL, SIGNALLED_GRACE, ProcessSpec, run_captured


def _shell(script: str) -> ProcessSpec:
    return ProcessSpec(["/bin/sh", "-c", script], dict(os.environ), "/", None, timeout=60)


def test_output_over_the_limit_is_kept_to_the_limit_exactly() -> None:
    finished = run_captured(_shell("head -c 1000000 /dev/zero"), b"", max_output=100_000)

    assert finished.output_overflow and len(finished.stdout) == 100_000


def test_a_stderr_line_without_end_arrives_in_pieces_no_character_split() -> None:
    """3 MiB of '€' (three bytes each) and no newline: pieces of at most MAX_STDERR_TAIL bytes,
    each whole UTF-8, together the whole text."""
    pieces: list[str] = []
    script = "yes € | tr -d '\\n' | head -c 3145728 >&2"

    finished = run_captured(_shell(script), b"", on_stderr_line=pieces.append)

    assert finished.exit_status == 0 and len(pieces) >= 3 * 1024 * 1024 // MAX_STDERR_TAIL
    assert all(len(piece.encode()) <= MAX_STDERR_TAIL for piece in pieces)
    assert "".join(pieces) == "€" * (3 * 1024 * 1024 // 3)


def test_a_long_line_whose_end_comes_in_a_later_read_is_still_passed_on_in_pieces() -> None:
    """60 000 bytes, a pause, then 10 000 more and the newline: the line ends in a read after
    its start was held, and still arrives in pieces of at most MAX_STDERR_TAIL bytes."""
    pieces: list[str] = []
    script = (
        "head -c 60000 /dev/zero | tr '\\0' a >&2; sleep 0.3; "
        "head -c 10000 /dev/zero | tr '\\0' a >&2; echo >&2"
    )

    finished = run_captured(_shell(script), b"", on_stderr_line=pieces.append)

    assert finished.exit_status == 0
    assert all(len(piece.encode()) <= MAX_STDERR_TAIL for piece in pieces), [
        len(piece) for piece in pieces
    ]
    assert "".join(pieces) == "a" * 70_000


def test_the_stderr_tail_starts_at_a_character_the_tool_wrote() -> None:
    """30 000 '€' then a last line: the tail kept is at most MAX_STDERR_TAIL bytes, a true end
    of what was written, never a U+FFFD of a character cut in two at its start."""
    script = "yes € | tr -d '\\n' | head -c 90000 >&2; printf '\\nlast\\n' >&2"

    finished = run_captured(_shell(script), b"")

    tail = finished.stderr_tail.decode()  # strict: a cut character would raise here
    assert len(finished.stderr_tail) <= MAX_STDERR_TAIL
    assert ("€" * 30_000 + "\nlast\n").endswith(tail) and len(tail) > 20_000


# Runs a tool on the caller's streams that ignores SIGTERM (and its child too), then gets
# SIGTERM itself once the tool runs; prints how the tool ended and how long that took.
_SIGNALLED_CALLER = """
import json, os, signal, threading, time
from cortexfs.tools.spawn import SIGNALLED_GRACE, ProcessSpec, run_attached
script = "trap '' TERM; sleep 300 & sleep 300"
spec = ProcessSpec(["/bin/sh", "-c", script], dict(os.environ), "/", None, timeout=60,
                   network=True, signalled_grace=SIGNALLED_GRACE)
started = time.monotonic()
def signalled(pid):
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
finished = run_attached(spec, on_start=signalled)
print(json.dumps([finished.exit_status, finished.passed_on, finished.timed_out,
                  time.monotonic() - started]))
"""


def test_a_tool_on_the_callers_terminal_that_ignores_a_passed_on_signal_is_killed() -> None:
    """T-3: a termination signal to the caller is passed on to the tool's group, which has
    SIGNALLED_GRACE to end; one that ignores it is killed then (not a timeout: the call was
    ended by the signal), where the caller waited for it as long as its timeout."""
    done = subprocess.run(
        [sys.executable, "-c", _SIGNALLED_CALLER], capture_output=True, text=True, timeout=60
    )

    exit_status, passed_on, timed_out, took = json.loads(done.stdout)
    assert (exit_status, passed_on, timed_out) == (137, signal.SIGTERM, False), done.stderr
    assert SIGNALLED_GRACE <= took < SIGNALLED_GRACE + 5
