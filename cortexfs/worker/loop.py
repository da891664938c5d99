"""The worker: claim, lease, execute, finish — N jobs at a time (SPEC §3, W-1..W-4).

One worker process holds every lease it takes (the lease names this process) and is the only
process that renews them (Q-3): a :class:`LeaseKeeper` thread rewrites the leases of running
jobs every third of their lifetime.  What "execute" means is the :class:`Executor`'s business
(running a tool through the authority chain, a shell command…); the loop only guarantees the
queue discipline around it:

* execution starts only after :func:`~cortexfs.queue.claim` returned, i.e. after the claim and
  the lease are durable (I-4);
* every claimed job is finished, in ``done/`` or ``failed/`` — an executor that raises fails
  the job with the reason rather than leaving it claimed;
* SIGTERM (or a first SIGINT) stops claiming; running jobs finish or time out; then the worker
  exits 0.  A second SIGINT aborts: running executions are cancelled and the worker exits 130
  without finishing them — their leases name a dead process, so ``recover`` requeues them.
"""

from __future__ import annotations

import contextlib
import errno
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cortexfs.errors import HOST_SHORTAGES, CtxError, describe
from cortexfs.queue import Claim, Holder, Queue, claim, finish, renew
from cortexfs.queue.claim_order import HintedClaimOrder
from cortexfs.queue.holder import check_worker_ttl
from cortexfs.queue.layout import Refusal
from cortexfs.tools.result import ToolError
from cortexfs.worker.inotify import PendingWatch, Wakeup

EXIT_ABORTED = 130


@dataclass
class Outcome:
    """What an execution produced: success, the output, and facts for the result file."""

    ok: bool
    output: Any = None
    reason: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


# Why finishing a job refuses when the job is no longer this worker's: another holder's
# lease (EACCES), or the job no longer claimed (ENOENT, EEXIST).
_TAKEN_AWAY = frozenset({errno.EACCES, errno.ENOENT, errno.EEXIST})


def _host_shortage(outcome: Outcome) -> int | None:
    """The errno when ``outcome`` is a tool that never started because the host was short
    of descriptors, memory or space (:data:`HOST_SHORTAGES`); None otherwise."""
    error, ran = outcome.details.get("error"), outcome.details.get("exit_status") is not None
    if outcome.ok or ran or not isinstance(error, Mapping):
        return None
    code = error.get("errno")
    return code if code in HOST_SHORTAGES else None


def _claim_refused(exc: CtxError | OSError) -> CtxError:
    """A claim the host refused (out of descriptors, a read-only disk…), saying what became of
    the jobs: a claim refused midway is undone (:func:`cortexfs.queue.claim_job`)."""
    return CtxError(
        exc.errno or errno.EIO,
        f"a claim failed ({describe(exc)}); a claim refused midway is undone, and 'ctx "
        "queue recover --reconcile' settles whatever could not be undone",
    )


def failure(error: ToolError, details: Mapping[str, Any] | None = None) -> Outcome:
    """A job failed by ``error``: its ``reason`` (:func:`reason_of`) and its ``error`` object,
    the one shape every failed result has (the tool runner's, docs/tools.md), over the other
    facts in ``details``."""
    return Outcome(False, None, reason_of(error), {**(details or {}), "error": error.to_json()})


def reason_of(error: ToolError) -> str:
    """A failed job's ``reason``: ``EACCES: step 6 (tool/model policy): … [authorize]`` — the
    errno when there is one, the sentence, the stage."""
    return f"{error} [{error.stage}]"


class JobControl:
    """Handed to the executor: the job's deadline and the worker's abort signal."""

    def __init__(self, timeout: float, abort: threading.Event) -> None:
        self.timeout = timeout
        self.abort = abort


class Executor(Protocol):
    """Runs claimed jobs, records queue transitions in its session, can kill what it runs."""

    def __call__(self, job: Claim, control: JobControl) -> Outcome: ...

    def record(self, event: str, job: str, status: str, **facts: Any) -> None: ...

    def abort_running(self) -> None: ...

    def accepts(self, request: Mapping[str, Any]) -> bool:
        """Whether to claim a pending job with this request at all (others stay pending)."""
        ...


@dataclass
class WorkerOptions:
    drain: bool = False
    max_jobs: int | None = None
    concurrency: int = 1
    lease_ttl: float | None = None
    job_timeout: float = 300.0
    worker_id: str | None = None
    max_wait: float = 2.0


@dataclass
class JobRecord:
    """One finished job, as the worker reports it."""

    job: str
    ok: bool
    reason: str | None
    seconds: float
    tool: str | None
    lost: bool = False  # ran, but this worker could not finish it

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "state": "lost" if self.lost else "done" if self.ok else "failed",
            "reason": self.reason,
            "seconds": round(self.seconds, 6),
            "tool": self.tool,
        }


@dataclass
class WorkerSummary:
    done: int = 0
    failed: int = 0
    lost: int = 0  # ran, but could not be finished by this worker (see Worker._finish)
    started_at: float = field(default_factory=time.time)
    aborted: bool = False
    stopped_by: str | None = None
    # What stopped a job slot that is not a job's failure (a defect, or the host short of
    # descriptors, memory or space): the worker then stops and exits non-zero instead of
    # draining with one slot less, or none, or running jobs it cannot record.
    failure: str | None = None
    failure_errno: int | None = None  # its errno, when it had one

    @property
    def rate(self) -> float:
        elapsed = max(time.time() - self.started_at, 1e-9)
        return (self.done + self.failed) / elapsed

    def to_json(self) -> dict[str, Any]:
        return {
            "done": self.done,
            "failed": self.failed,
            "lost": self.lost,
            "seconds": round(time.time() - self.started_at, 3),
            "rate": round(self.rate, 3),
            "aborted": self.aborted,
            "stopped_by": self.stopped_by,
            "failure": self.failure,
        }


Listener = Callable[[str, dict[str, Any]], None]


class LeaseKeeper(threading.Thread):
    """Renews this worker's leases of running jobs every third of their lifetime.

    A job claimed just after a round is renewed at the next one, a third of the lifetime
    later: every lease is renewed with at least two thirds of its lifetime left.  An expired
    lease is proof that its holder is gone (Q-5), so a lease must never get that far while
    its job runs.
    """

    def __init__(self, queue: Queue, holder: Holder, ttl: float) -> None:
        super().__init__(name="lease-keeper", daemon=True)
        self.queue, self.holder, self.ttl = queue, holder, ttl
        self.jobs: set[str] = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.ttl / 3):
            with self.lock:
                running = sorted(self.jobs)
            for job in running:
                # Finished meanwhile, or the lease was taken away (expired and requeued, Q-5):
                # nothing to renew; finish will find out and say so.
                with contextlib.suppress(CtxError, OSError):
                    renew(self.queue, job, [self.holder], self.ttl)


class Worker:
    """A claim/execute/finish loop over one queue, ``concurrency`` jobs at a time."""

    def __init__(
        self,
        queue_dir: Path,
        executor: Executor,
        options: WorkerOptions | None = None,
        listener: Listener | None = None,
        *,
        within: Path | None = None,
    ) -> None:
        self.queue_dir = queue_dir
        self.within = within  # the storage root of a project's queue: nothing below followed
        self.executor = executor
        self.options = options or WorkerOptions()
        self.listener = listener or (lambda event, fields: None)
        self.summary = WorkerSummary()
        self.stopping = threading.Event()
        self.abort = threading.Event()
        self.wakeup = Wakeup()
        self._claimed = 0
        self._count_lock = threading.Lock()
        self._claim_lock = threading.Lock()

    # ---------------------------------------------------------------- signals

    def stop(self, why: str = "request") -> None:
        """Stop claiming; running jobs finish."""
        if not self.stopping.is_set():
            self.summary.stopped_by = why
            self.stopping.set()
            self.wakeup.ring()

    def install_signal_handlers(self) -> None:
        def on_term(signum: int, frame: object) -> None:
            self.stop("SIGTERM")

        def on_int(signum: int, frame: object) -> None:
            if self.stopping.is_set():
                self.summary.aborted = True
                self.abort.set()
                self.executor.abort_running()
            else:
                self.listener("interrupt", {"message": "finishing running jobs; ^C again aborts"})
                self.stop("SIGINT")

        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_int)

    # ---------------------------------------------------------------- the loop

    def run(self) -> WorkerSummary:
        holder = Holder.for_process(worker=self.options.worker_id)
        with Queue.open(self.queue_dir, within=self.within) as queue:
            # Refused before the first claim, not by the kernel inside a job slot's thread.
            queue.require_writable("work")
            # The claim order this user's other claimers on this host share (ctx queue claim,
            # other workers): the first claim reads a name instead of listing pending/, and
            # workers started side by side are handed different jobs instead of racing for one.
            queue.claim_order = HintedClaimOrder(queue.path)
            ttl = check_worker_ttl(self.options.lease_ttl or queue.config.lease_ttl)
            keeper = LeaseKeeper(queue, holder, ttl)
            keeper.start()
            watch = PendingWatch(self.queue_dir / "pending", max_wait=self.options.max_wait)
            self.listener(
                "start", {"worker": holder.worker, "pid": holder.pid, "wait": watch.reason}
            )
            threads = [
                threading.Thread(
                    target=self._slot, args=(queue, holder, ttl, keeper, watch), name=f"slot-{n}"
                )
                for n in range(max(1, self.options.concurrency))
            ]
            for thread in threads:
                thread.start()
            try:
                # Join with a timeout so the main thread keeps handling signals.
                while any(t.is_alive() for t in threads) and not self.abort.is_set():
                    for thread in threads:
                        thread.join(0.1)
            finally:
                keeper.stopped.set()
                watch.close()
                self.wakeup.close()
        self.listener("stop", self.summary.to_json())
        return self.summary

    def _take_ticket(self) -> bool:
        """Reserve one of the ``--max-jobs`` claims; False when none are left."""
        with self._count_lock:
            if self.options.max_jobs is not None and self._claimed >= self.options.max_jobs:
                return False
            self._claimed += 1
            return True

    def _return_ticket(self) -> None:
        with self._count_lock:
            self._claimed -= 1

    def _slot(
        self, queue: Queue, holder: Holder, ttl: float, keeper: LeaseKeeper, watch: PendingWatch
    ) -> None:
        try:
            self._serve(queue, holder, ttl, keeper, watch)
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        """Stop the worker for ``exc``, which is not a job's failure; the first one is its
        :attr:`WorkerSummary.failure`."""
        with self._count_lock:
            if self.summary.failure is None:
                self.summary.failure = describe(exc)
                code = exc.errno if isinstance(exc, CtxError | OSError) else None
                self.summary.failure_errno = code or None
        self.stop("failure")

    def _serve(
        self, queue: Queue, holder: Holder, ttl: float, keeper: LeaseKeeper, watch: PendingWatch
    ) -> None:
        while not self.stopping.is_set():
            if not self._take_ticket():
                return
            with self._claim_lock:
                try:
                    won = claim(queue, holder, ttl, self.executor.accepts)
                except (CtxError, OSError) as exc:
                    raise _claim_refused(exc) from exc
            if won is None:
                self._return_ticket()
                if self.options.drain:
                    return
                watch.wait(self.wakeup)
                continue
            watch.found_work()
            with keeper.lock:
                keeper.jobs.add(won.job)
            try:
                record = self._execute_and_finish(queue, holder, won)
            finally:
                with keeper.lock:
                    keeper.jobs.discard(won.job)
            if record is None:
                return  # aborted: the job stays claimed for recover
            with self._count_lock:
                if record.lost:
                    self.summary.lost += 1
                elif record.ok:
                    self.summary.done += 1
                else:
                    self.summary.failed += 1
            self.listener("lost" if record.lost else "finish", record.to_json())

    def _execute_and_finish(self, queue: Queue, holder: Holder, won: Claim) -> JobRecord | None:
        tool = won.request.get("tool")
        self.executor.record("queue.claim", won.job, "ok", tool=tool, lease=won.lease.to_json())
        self.listener("claim", {"job": won.job, "tool": tool})
        started = time.time()
        control = JobControl(self.options.job_timeout, self.abort)
        try:
            outcome = self.executor(won, control)
        except Exception as exc:  # the job fails; the worker goes on
            code = exc.errno if isinstance(exc, CtxError | OSError) and exc.errno else errno.EIO
            message = f"the worker failed around the call: {type(exc).__name__}: {exc}"
            outcome = failure(ToolError(code, "worker", message))
        if self.abort.is_set():
            return None
        short = _host_shortage(outcome)
        if short is not None:
            # The tool never started for want of descriptors, memory or space: not the job's
            # failure, and every job after it would meet the same.  It stays claimed, and
            # recover requeues it once this worker is gone.
            raise CtxError(
                short,
                f"job {won.job} did not run: {outcome.reason}; it stays claimed, and 'ctx queue "
                "recover' requeues it once this worker has exited",
            )
        try:
            outcome = self._finish(queue, holder, won.job, outcome, started)
        except (CtxError, OSError) as exc:
            if exc.errno in _TAKEN_AWAY:
                reason = (
                    f"not finished by this worker: {describe(exc)}; its outcome is discarded "
                    "(if its lease expired and recover requeued the job, the job runs again)"
                )
            else:
                # Recording the outcome failed (ENOSPC, EROFS, EIO…): the next job's would too.
                # The refusal's own last step ("then finish it again") is the command line's:
                # a finish by hand would record an outcome this worker never gave.
                cause = (
                    f"{exc.code_name}: {exc.without_retry}"
                    if isinstance(exc, Refusal)
                    else describe(exc)
                )
                reason = (
                    f"ran, but could not be finished: {cause}; it is left as it is, and 'ctx "
                    "queue recover --reconcile' completes it (when its result is in place) or "
                    "requeues it to run again, once this worker has exited"
                )
                self._fail(CtxError(exc.errno or errno.EIO, f"job {won.job} {reason}"))
            self.executor.record("queue.lost", won.job, "error", reason=reason)
            return JobRecord(won.job, False, reason, time.time() - started, tool, lost=True)
        state = "done" if outcome.ok else "failed"
        self.executor.record("queue.finish", won.job, "ok" if outcome.ok else "error", state=state)
        return JobRecord(won.job, outcome.ok, outcome.reason, time.time() - started, tool)

    def _finish(
        self, queue: Queue, holder: Holder, job: str, outcome: Outcome, started: float
    ) -> Outcome:
        """Finish J with ``outcome``, as its lease holder; returns the outcome recorded.

        A result over the queue's ``max_result_bytes`` fails the job instead (EFBIG), with
        the output omitted: the job is finished either way, never left claimed.  Finishing
        as someone who no longer holds J's lease (EACCES), or a J that is no longer claimed,
        raises: the job is another holder's now, or back in pending.
        """
        worker = holder.summary()
        extra = {"reason": outcome.reason, **outcome.details}
        try:
            finish(
                queue,
                job,
                outcome.ok,
                outcome.output,
                worker=worker,
                started=started,
                extra=extra,
                holder=holder,
            )
            return outcome
        except CtxError as exc:
            if exc.errno != errno.EFBIG:
                raise
            too_big = exc
        error = ToolError(errno.EFBIG, "finish", f"{too_big.message}; the output is omitted")
        omitted = failure(error, {**outcome.details, "output_omitted": True})
        extra = {"reason": omitted.reason, **omitted.details}
        # The record of why is small and bounded: written even when a tiny max_result_bytes
        # would refuse it, rather than leave the job claimed.
        finish(
            queue,
            job,
            False,
            None,
            worker=worker,
            started=started,
            extra=extra,
            holder=holder,
            enforce_limit=False,
        )
        return omitted
