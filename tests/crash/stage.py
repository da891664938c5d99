"""Where a workload acts: a queue directory, its journal, and verbs that acknowledge.

Each verb marks what the workload is attempting (``Attempt``) before calling the real
protocol, what it was told (``Ack``) once the call succeeded, and that it returned
(``Returned``) — the oracle's only source of truth, as ALICE uses the output a program
printed.  A refusal the protocol is allowed to give (EEXIST for a name another publisher took
first) is a return without an acknowledgement; anything else the protocol raises is a defect
and propagates.
"""

from __future__ import annotations

import errno
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cortexfs import durable
from cortexfs.errors import CtxError
from cortexfs.queue import (
    Claim,
    Holder,
    Queue,
    claim_job,
    finish,
    publish,
    publish_batch,
    recover,
    renew,
)
from cortexfs.queue import claim as claim_next
from cortexfs.queue.layout import lock_dir
from cortexfs.queue.requests import encode_request
from tests.crash.microops import Attempt, Returned
from tests.crash.recorder import Journal, RecordingOps

REQUEST_LIMIT = 1024 * 1024


def request(job: str, author: str = "publisher", pad: int = 0) -> dict[str, Any]:
    """A request whose encoding is known in advance (``from`` and ``created`` given).

    ``pad`` bytes of filler make it span several disk blocks, so torn writes have pieces.
    """
    doc: dict[str, Any] = {"tool": "fs.stat", "input": {"job": job}, "from": author}
    doc["created"] = "2026-01-01T00:00:00.000000Z"
    if pad:
        doc["input"]["pad"] = "x" * pad
    return doc


def job_file(name: str) -> str:
    return name if name.endswith(".req.json") else f"{name}.req.json"


@dataclass
class Stage:
    """A queue directory being worked on, and the journal of everything done to it."""

    path: Path
    strategy: str
    holder: Holder
    journal: Journal = field(init=False)

    def __post_init__(self) -> None:
        self.journal = Journal(self.path)

    def queue(self, actor: str) -> Queue:
        """The queue as ``actor`` sees it: recorded once the journal has begun."""
        return Queue.open(self.path, ops=RecordingOps(self.journal, actor, self.strategy))

    def plain_queue(self, ops: durable.FsOps | None = None) -> Queue:
        return Queue.open(self.path, ops=ops or durable.FsOps(self.strategy))

    @contextmanager
    def call(self, queue: Queue, what: str, job: str) -> Iterator[str]:
        """Mark a protocol call: its attempt, then its return.  A refusal the protocol may
        give (EEXIST: another publisher or finisher came first) is swallowed: the body's
        acknowledgement is then never reached."""
        actor = getattr(queue.ops, "actor", "setup")
        self.journal.record(actor, Attempt(what, job))
        try:
            yield actor
        except CtxError as exc:
            if exc.errno != errno.EEXIST:
                raise
        self.journal.record(actor, Returned())

    # ------------------------------------------------------------------ verbs

    def publish(self, queue: Queue, name: str, author: str = "publisher", pad: int = 0) -> bool:
        job = job_file(name)
        doc = request(job, author, pad)
        with self.call(queue, "publish", job) as actor:
            publish(queue, doc, job)
            self.journal.ack(actor, "publish", job, encode_request(doc, REQUEST_LIMIT))
            return True
        return False

    def publish_batch(self, queue: Queue, names: list[str], author: str = "publisher") -> None:
        jobs = [job_file(n) for n in names]
        docs = [request(job, author) for job in jobs]
        with self.call(queue, "publish", ",".join(jobs)) as actor:
            publish_batch(queue, docs, jobs)
            for job, doc in zip(jobs, docs, strict=True):
                self.journal.ack(actor, "publish", job, encode_request(doc, REQUEST_LIMIT))

    def claim(
        self,
        queue: Queue,
        name: str | None = None,
        holder: Holder | None = None,
        ttl: float | None = None,
    ) -> str | None:
        """Claim (the named job, or the next one), then start executing it."""
        holder = holder or self.holder
        won: Claim | None = None
        with self.call(queue, "claim", job_file(name) if name else "*") as actor:
            won = (
                claim_job(queue, job_file(name), holder, ttl)
                if name
                else claim_next(queue, holder, ttl)
            )
            if won is not None:
                self.journal.ack(actor, "claim", won.job, won.lease.encode())
                self.journal.executed(actor, won.job)
        return None if won is None else won.job

    def renew(self, queue: Queue, job: str) -> None:
        with self.call(queue, "renew", job) as actor:
            lease = renew(queue, job, [self.holder], ttl=600)
            self.journal.ack(actor, "renew", job, lease.encode())

    def finish(self, queue: Queue, job: str, ok: bool) -> None:
        with self.call(queue, "finish", job) as actor:
            result = finish(queue, job, ok, {"job": job}, worker={"name": actor})
            self.journal.ack(actor, "finish", job, (ok, result))

    def recover(self, queue: Queue, reconcile: bool) -> None:
        with self.call(queue, "recover --reconcile" if reconcile else "recover", "*"):
            recover(queue, reconcile=reconcile, grace=0)

    def work_once(self, queue: Queue, ok: bool = True) -> None:
        """One worker iteration: claim the next job, execute it, finish it."""
        job = self.claim(queue)
        if job is not None:
            self.finish(queue, job, ok)


def preempt(
    journal: Journal,
    first: Callable[[], None],
    second: Callable[[], None],
    *,
    actor: str,
    step: str,
) -> None:
    """Run ``first`` until ``actor`` reaches ``step``, then ``second`` to its end, then the
    rest of ``first``: one deterministic preemption (the schedules CHESS calls bound 1).

    If ``second`` waits for the lock of a ``claimed/J`` that ``first`` holds (only a mutant
    lets that happen), ``first`` resumes.  An exception in either is re-raised here.
    """
    reached, resume = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def pause(who: str, name: str) -> None:
        if who == actor and name == step and not reached.is_set():
            reached.set()
            resume.wait()

    def guarded(body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as exc:
                errors.append(exc)
            finally:
                reached.set()

        return run

    journal.on_step = pause
    try:
        one = threading.Thread(target=guarded(first), daemon=True)
        one.start()
        reached.wait()
        two = threading.Thread(target=guarded(second), daemon=True)
        two.start()
        waiting_since = None
        while two.is_alive():
            two.join(0.01)
            in_lock = waiting_for_lock(two)
            waiting_since = (waiting_since or time.monotonic()) if in_lock else None
            if waiting_since is not None and time.monotonic() - waiting_since > 0.2:
                break
        resume.set()
        for thread in (one, two):
            thread.join(30)
            if thread.is_alive():
                raise AssertionError(f"interleaving at {actor}:{step} deadlocked")
    finally:
        journal.on_step = None
        resume.set()
    if errors:
        raise errors[0]


def waiting_for_lock(thread: threading.Thread) -> bool:
    """Whether ``thread`` is inside :func:`cortexfs.queue.layout.lock_dir` right now."""
    frame = sys._current_frames().get(thread.ident or 0)
    while frame is not None:
        if frame.f_code is lock_dir.__code__:
            return True
        frame = frame.f_back
    return False
