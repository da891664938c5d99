"""Standard outputs that refuse what is written, for a real ``ctx`` process: all of it
(/dev/full), after a given number of bytes (a file at the file-size limit), or a pipe whose
reader left."""

from __future__ import annotations

import os
import resource
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

# A file at ``LIMIT - room`` bytes takes ``room`` more, then refuses with EFBIG: RLIMIT_FSIZE
# of the command (Python ignores SIGXFSZ).  Its own files (events, logs) stay far below.
LIMIT = 1 << 20


def run_with_stdout(
    argv: Sequence[str],
    stdout: IO[bytes] | int,
    *,
    env: Mapping[str, str],
    stdin: str = "",
    limit: int | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    def limited() -> None:
        if limit is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(
        list(argv),
        input=stdin,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(env),
        cwd=cwd,
        preexec_fn=limited,
        timeout=120,
    )


def to_full_disk(
    argv: Sequence[str], *, env: Mapping[str, str], stdin: str = "", cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``ARGV > /dev/full``: every write to standard output fails with ENOSPC."""
    with open("/dev/full", "wb") as full:
        return run_with_stdout(argv, full, env=env, stdin=stdin, cwd=cwd)


def with_room_for(
    argv: Sequence[str],
    room: int,
    output: Path,
    *,
    env: Mapping[str, str],
    stdin: str = "",
    cwd: Path | None = None,
) -> tuple[subprocess.CompletedProcess[str], bytes]:
    """``ARGV >> OUTPUT`` where standard output takes ``room`` bytes, then fails with EFBIG;
    and what it wrote."""
    output.write_bytes(b"x" * (LIMIT - room))
    with open(output, "ab") as sink:
        done = run_with_stdout(argv, sink, env=env, stdin=stdin, limit=LIMIT, cwd=cwd)
    return done, output.read_bytes()[LIMIT - room :]


def to_closed_pipe(
    argv: Sequence[str], *, env: Mapping[str, str], stdin: str = "", cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``ARGV | …`` whose reader has left: every write to standard output fails with EPIPE."""
    reader, writer = os.pipe()
    os.close(reader)
    try:
        return run_with_stdout(argv, writer, env=env, stdin=stdin, cwd=cwd)
    finally:
        os.close(writer)
