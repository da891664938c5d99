"""A job slot that meets an error which is not a job's failure stops the worker, which says
so, instead of draining on with one slot less (or none) and reporting success."""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from cortexfs.errors import CtxError
from cortexfs.queue import Queue, init_queue, publish
from cortexfs.tools.result import ToolError
from cortexfs.worker import loop
from cortexfs.worker.loop import Worker, WorkerOptions
from cortexfs.worker.outcome import Outcome, failure
from tests.queue.helpers import NoDescriptorForTheLease, request


class DefectiveExecutor:
    """An executor whose look at a pending request fails as a defect would."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def accepts(self, request: Mapping[str, Any]) -> bool:
        raise RuntimeError("the request reader broke")

    def record(self, event: str, job: str, status: str, **facts: Any) -> None:
        pass

    def abort_running(self) -> None:
        pass

    def abort_job(self, job: str) -> None:
        pass

    session_file = None

    def close(self) -> None:
        pass

    def __call__(self, job: Any, control: Any) -> Any:
        self.ran.append(job.job)
        raise AssertionError("never reached: accepts fails first")


def test_a_slot_that_fails_stops_the_worker_with_the_failure(tmp_path: Path) -> None:
    queue_dir = tmp_path / "queue"
    init_queue(queue_dir)
    with Queue.open(queue_dir) as queue:
        jobs = [publish(queue, request(n)) for n in range(3)]
    events: list[tuple[str, dict[str, Any]]] = []
    executor = DefectiveExecutor()

    summary = Worker(
        queue_dir,
        executor,  # type: ignore[arg-type]
        WorkerOptions(drain=True, concurrency=2, max_wait=0.1),
        lambda event, fields: events.append((event, fields)),
    ).run()

    assert summary.failure == "RuntimeError: the request reader broke"
    assert summary.stopped_by == "failure" and (summary.done, summary.failed) == (0, 0)
    assert events[-1][0] == "stop" and events[-1][1]["failure"] == summary.failure
    assert executor.ran == [] and sorted(os.listdir(queue_dir / "pending")) == sorted(jobs)
    assert os.listdir(queue_dir / "claimed") == []


def test_a_worker_never_reaches_a_projects_queue_through_a_symlink(tmp_path: Path) -> None:
    """Q-8: the space swapped for a link after ``ctx queue work`` checked it is still refused
    when the worker opens the queue, before any claim."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    init_queue(outside / "queue")
    with Queue.open(outside / "queue") as queue:
        jobs = [publish(queue, request(0))]
    (root / "shared").mkdir(parents=True)
    (root / "shared" / "proj").symlink_to(outside)
    executor = DefectiveExecutor()

    worker = Worker(
        root / "shared" / "proj" / "queue",
        executor,  # type: ignore[arg-type]
        WorkerOptions(drain=True, max_wait=0.1),
        within=root,
    )

    with pytest.raises(CtxError) as refused:
        worker.run()
    assert refused.value.errno == errno.ELOOP
    assert os.listdir(outside / "queue" / "pending") == jobs and executor.ran == []


class ShortOfDescriptorsExecutor(DefectiveExecutor):
    """Every tool fails to start: the host is out of descriptors (EMFILE, no exit status)."""

    def accepts(self, request: Mapping[str, Any]) -> bool:
        return True

    def __call__(self, job: Any, control: Any) -> Any:
        self.ran.append(job.job)
        error = ToolError(errno.EMFILE, "resolve", "tool sh.x's manifest cannot be read now")
        return failure(error, {"exit_status": None})


def test_a_tool_the_host_could_not_start_stays_claimed_and_stops_the_worker(
    tmp_path: Path,
) -> None:
    """Out of descriptors is not the job's failure: finished in failed/ it would never run."""
    queue_dir = tmp_path / "queue"
    init_queue(queue_dir)
    with Queue.open(queue_dir) as queue:
        jobs = [publish(queue, request(n)) for n in range(3)]
    executor = ShortOfDescriptorsExecutor()

    summary = Worker(
        queue_dir,
        executor,
        WorkerOptions(drain=True, max_wait=0.1),
        lambda *_: None,  # type: ignore[arg-type]
    ).run()

    assert summary.failure_errno == errno.EMFILE and summary.stopped_by == "failure"
    assert (summary.done, summary.failed) == (0, 0)
    assert os.listdir(queue_dir / "claimed") == executor.ran  # the one it took, still claimed
    assert len(executor.ran) == 1 and sorted(os.listdir(queue_dir / "pending")) == sorted(
        set(jobs) - set(executor.ran)
    )
    assert os.listdir(queue_dir / "failed") == []


class SucceedingExecutor(ShortOfDescriptorsExecutor):
    def __call__(self, job: Any, control: Any) -> Any:
        self.ran.append(job.job)
        return Outcome(True, {"done": True})


def test_an_outcome_that_cannot_be_finished_stops_the_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its disk full, the worker would run job after job and record none of them."""
    queue_dir = tmp_path / "queue"
    init_queue(queue_dir)
    with Queue.open(queue_dir) as queue:
        for n in range(3):
            publish(queue, request(n))

    def full_disk(*_: Any, **__: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(loop, "finish", full_disk)
    events: list[tuple[str, dict[str, Any]]] = []
    executor = SucceedingExecutor()

    summary = Worker(
        queue_dir,
        executor,  # type: ignore[arg-type]
        WorkerOptions(drain=True, max_wait=0.1),
        lambda event, fields: events.append((event, fields)),
    ).run()

    assert summary.failure_errno == errno.ENOSPC and summary.lost == 1
    assert len(executor.ran) == 1 and len(os.listdir(queue_dir / "pending")) == 2
    lost = [fields for event, fields in events if event == "lost"]
    assert "ran, but could not be finished: ENOSPC" in lost[0]["reason"]


def test_a_claim_the_host_refuses_stops_the_worker_saying_it_was_undone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors when it opens lease/J, the claim puts J back; the worker stops with
    EMFILE and says so, rather than only naming the file it could not open."""
    queue_dir = tmp_path / "queue"
    init_queue(queue_dir)
    with Queue.open(queue_dir) as queue:
        jobs = [publish(queue, request(n)) for n in range(2)]

    real_claim = loop.claim

    def claim_short_of_descriptors(queue: Queue, *args: Any) -> Any:
        ops = NoDescriptorForTheLease()
        ops.lease = queue.lease
        monkeypatch.setattr(queue, "ops", ops)
        return real_claim(queue, *args)

    monkeypatch.setattr(loop, "claim", claim_short_of_descriptors)
    executor = SucceedingExecutor()

    summary = Worker(
        queue_dir,
        executor,
        WorkerOptions(drain=True, max_wait=0.1),
        lambda *_: None,  # type: ignore[arg-type]
    ).run()

    assert summary.failure_errno == errno.EMFILE and summary.stopped_by == "failure"
    assert summary.failure is not None and summary.failure.startswith("EMFILE: a claim failed (")
    assert summary.failure.endswith(
        "'ctx queue recover --reconcile' settles whatever could not be undone"
    )
    assert executor.ran == [] and sorted(os.listdir(queue_dir / "pending")) == sorted(jobs)
    assert os.listdir(queue_dir / "claimed") == os.listdir(queue_dir / "lease") == []
