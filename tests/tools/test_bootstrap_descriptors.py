"""``ctx bootstrap`` out of descriptors (RLIMIT_NOFILE in its own process): an EMFILE error
that says what was made and to run it again, never a traceback."""

from __future__ import annotations

from pathlib import Path

from tests.support.exhaustion import run_ctx


def test_bootstrap_out_of_descriptors_is_an_emfile_error(traversable_tmp: Path) -> None:
    root = traversable_tmp / "st"

    short = run_ctx(root, "bootstrap", descriptors=5)
    again = run_ctx(root, "bootstrap")

    assert short.returncode == 1, short.stderr
    assert "Traceback" not in short.stderr, short.stderr
    assert short.stderr.splitlines()[-1].startswith(f"ctx: EMFILE: bootstrap of {root} left ")
    assert again.returncode == 0, again.stderr
