"""What a tool leaves running in its group when it exits (W-4; docs/tools.md "Process group
and bounds"): the tool's own exit decides how the call ended, and what it left is killed
STRAGGLER_GRACE after that exit or at the timeout, whichever comes first, with its output
captured (native mode, a worker) or on the caller's streams (terminal mode) alike."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cortexfs.tools.spawn import STRAGGLER_GRACE, Finished, ProcessSpec, run_attached, run_captured

TIMEOUT = 0.8


def _captured(spec: ProcessSpec) -> Finished:
    return run_captured(spec, b"")


RUNS: list[Callable[[ProcessSpec], Finished]] = [_captured, run_attached]


@pytest.mark.parametrize("run", RUNS, ids=["captured", "attached"])
def test_a_tool_that_exits_in_time_is_no_timeout_and_its_straggler_dies_at_the_timeout(
    tmp_path: Path, run: Callable[[ProcessSpec], Finished]
) -> None:
    """The tool exits 0 at 0.3 s, leaving a child that still holds its output, within a
    timeout of 0.8 s that comes before the grace ends (1.3 s): the call is the tool's exit 0,
    not a timeout, and the child is killed at the timeout, before it could mark at 1.1 s."""
    mark = tmp_path / "outlived"
    script = f"(sleep 1.1; touch {mark}) & sleep 0.3; exit 0"
    spec = ProcessSpec(["/bin/sh", "-c", script], dict(os.environ), "/", None, timeout=TIMEOUT)
    assert 0.3 + STRAGGLER_GRACE > TIMEOUT

    started = time.monotonic()
    finished = run(spec)
    took = time.monotonic() - started

    assert (finished.exit_status, finished.timed_out) == (0, False), finished
    time.sleep(max(1.1 + 0.5 - took, 0.0))  # past the mark the child would have left
    assert not mark.exists(), "the tool's child outlived the call's timeout"
