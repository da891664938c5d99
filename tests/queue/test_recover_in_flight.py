"""recover --reconcile beside a finish in progress: the pair it is completing is not an
interrupted finish (docs/queue.md: a job whose ``claimed/J`` is locked counts as untouched)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cortexfs.queue import Queue, publish, recover
from cortexfs.queue.evidence import assess, evidence_of
from tests.queue.helpers import PROJECT, request
from tests.support.cli import ctx

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def paused_finisher(queue_dir: Path, step: str, job: str) -> Iterator[subprocess.Popen[str]]:
    """The process of a live holder of ``job`` whose finish is paused at protocol ``step``,
    holding ``claimed/J``'s lock (tests/queue/finish_paused.py); told to go on when the
    block ends, it must complete its finish (exit 0); it is killed if the block fails."""
    finisher = subprocess.Popen(
        [sys.executable, "-m", "tests.queue.finish_paused", str(queue_dir), step],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert finisher.stdout is not None and finisher.stdin is not None
        assert finisher.stdout.readline().strip() == job  # paused, holding claimed/J's lock
        yield finisher
        finisher.stdin.write("go on\n")
        finisher.stdin.flush()
        assert finisher.wait(60) == 0
    finally:
        if finisher.poll() is None:
            finisher.kill()
            finisher.wait()


@pytest.mark.parametrize(
    ("step", "repair"), [("finish.request", "roll-forward"), ("finish.cleanup", "remove-orphans")]
)
def test_a_finish_in_progress_of_a_live_holder_is_untouched_and_consistent(
    root: Path, queue: Queue, queue_dir: Path, step: str, repair: str
) -> None:
    job = publish(queue, request(), name="inflight")
    with paused_finisher(queue_dir, step, job):
        scanned = assess(evidence_of(queue, job))
        assert (scanned.state, scanned.repair) == ("incomplete", repair)

        checked = ctx(root, "queue", "recover", "--project", PROJECT, "--reconcile", "--json")
        assert checked.returncode == 0, checked.stdout + checked.stderr
        report = json.loads(checked.stdout)
        assert report["consistent"] and report["incomplete"] == []
        assert [f["job"] for f in report["untouched"]] == [job]
        assert "another process is moving this job" in report["untouched"][0]["detail"]
        assert "interrupted" not in checked.stdout
        after = assess(evidence_of(queue, job))
        assert (after.state, after.repair) == ("incomplete", repair)  # nothing was changed
    assert assess(evidence_of(queue, job)).state == "done"
    assert recover(queue, reconcile=True).consistent


@pytest.mark.parametrize(
    ("step", "lease_gone"),
    [("finish.request", False), ("finish.cleanup", False), ("finish.cleanup", True)],
)
def test_a_job_whose_finish_placed_its_result_reads_as_done_while_the_finish_completes(
    root: Path, queue: Queue, queue_dir: Path, step: str, lease_gone: bool
) -> None:
    """From the moment its result is in place a job is done to every reader, while its finish
    moves the request and removes the claim and the lease, never a claim without its lease
    (``lease_gone``: the instant between the lease's removal and the claim directory's)."""
    job = publish(queue, request(), name="inflight")
    with paused_finisher(queue_dir, step, job) as finisher:
        if lease_gone:
            (queue_dir / "lease" / job / "worker").unlink()
        shown = ctx(root, "queue", "show", "--project", PROJECT, job, "--json")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        detail = json.loads(shown.stdout)
        assert detail["state"] == "done", detail
        assert "the rest of its finish is under way" in detail["detail"]
        assert detail["result"]["output"] == {"by": finisher.pid}, detail
        assert detail["request"]["tool"], detail
        listed = ctx(root, "queue", "list", "--project", PROJECT, "--json")
        assert json.loads(listed.stdout) == [{"name": job, "state": "done"}], listed.stdout
        status = ctx(root, "queue", "status", "--project", PROJECT, "--json")
        assert json.loads(status.stdout)["counts"]["done"] == 1, status.stdout
    assert assess(evidence_of(queue, job)).state == "done"
    assert recover(queue, reconcile=True).consistent
