"""What a captured call keeps of a tool that writes too much: the output limit exactly, and a
stderr line without end passed on in pieces rather than held whole."""

from __future__ import annotations

import os

from cortexfs.tools.spawn import MAX_STDERR_TAIL, ProcessSpec, run_captured


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
