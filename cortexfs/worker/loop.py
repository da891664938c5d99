"""The worker: claim, lease, execute, finish — N jobs at a time (SPEC §3, W-1..W-4).

One worker process holds every lease it takes (the lease names this process) and is the only
process that renews them (Q-3): a :class:`~cortexfs.worker.lease_keeper.LeaseKeeper` thread
rewrites the leases of running jobs every third of their lifetime.  What "execute" means is
the :class:`~cortexfs.worker.outcome.Executor`'s business (running a tool through the
authority chain, a shell command…); the loop only guarantees the queue discipline around it:

* execution starts only after :func:`~cortexfs.queue.claim` returned, i.e. after the claim and
  the lease are durable (I-4);
* every claimed job is finished, in ``done/`` or ``failed/`` — an executor that raises fails
  the job with the reason rather than leaving it claimed;
* SIGTERM, SIGHUP (or a first SIGINT) stops claiming; running jobs finish or time out; then
  the worker exits 0.  A second SIGINT aborts: running executions are cancelled and the worker
  exits 130 without finishing them — their leases name a dead process, so ``recover``
  requeues them;
* a job whose lease cannot be renewed is killed before the lease lapses and left claimed: an
  expired lease is proof that its holder is gone (Q-5), and the job must never run beside
  the copy recover would requeue (I-4).
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cortexfs.errors import (
    HOST_SHORTAGES,
    PROCESS_SHORTAGES,
    CtxError,
    describe,
    out_of_memory,
)
from cortexfs.process_limits import no_process_could_be_made
from cortexfs.queue import Claim, Holder, Queue, claim, finish, renew
from cortexfs.queue.claim_order import HintedClaimOrder
from cortexfs.queue.claiming import still_pending
from cortexfs.queue.holder import check_worker_ttl
from cortexfs.queue.layout import Refusal
from cortexfs.queue.leasing import NotHeld
from cortexfs.queue.requests import ResultOverLimit
from cortexfs.timefmt import rfc3339
from cortexfs.tools.result import ToolError
from cortexfs.worker.inotify import PendingWatch, Wakeup
from cortexfs.worker.lease_keeper import LeaseKeeper
from cortexfs.worker.outcome import (
    HOST_REFUSALS,
    Executor,
    JobControl,
    Outcome,
    failure,
    host_remedy,
)
from cortexfs.worker.stop_signals import STOP_SIGNALS

EXIT_ABORTED = 130
# How long an abort waits for a job slot whose report waits for a reader (see
# Worker._slots_left_telling): a report to a reader that reads is written in milliseconds.
ABANDONED_REPORT_SECONDS = 1.0


def _cause(exc: CtxError | OSError) -> str:
    """``exc`` in a line, without a queue refusal's command-line last step (``then renew it
    again``): the worker says its own next step."""
    if isinstance(exc, Refusal):
        return f"{exc.code_name}: {exc.without_retry}"
    return describe(exc)


def _unrecorded_by_host(outcome: Outcome) -> int | None:
    """The errno when ``outcome`` is a call whose result the host refused to record (the
    session or the tool's log on a full or read-only disk…, :data:`HOST_REFUSALS`), also when
    the call had failed already; None otherwise.  Whatever the tool did, that is not the job's
    failure."""
    return outcome.unrecorded if outcome.unrecorded in HOST_REFUSALS else None


# The stages that start a process: there an EAGAIN is fork's, a limit of processes reached.
_STARTING_STAGES = ("hook", "run")


def _host_shortage(outcome: Outcome) -> int | None:
    """The errno when ``outcome`` is a tool that never started because the host was short
    of descriptors, memory or space (:data:`HOST_SHORTAGES`), or of processes where a hook or
    the tool was to start (:data:`PROCESS_SHORTAGES`); None otherwise."""
    error, ran = outcome.details.get("error"), outcome.details.get("exit_status") is not None
    if outcome.ok or ran or not isinstance(error, Mapping):
        return None
    code = error.get("errno")
    starting = error.get("stage") in _STARTING_STAGES
    return code if code in (PROCESS_SHORTAGES if starting else HOST_SHORTAGES) else None


# The stages that judge the worker's agent and its host, not the job: an error there is met
# by every job after it, as at the worker's start (a deleted agent, a broken identity).
_WORKER_STAGES = ("caller", "agent")


def _agent_unusable(outcome: Outcome) -> int | None:
    """The errno when ``outcome`` is a call refused at a stage of :data:`_WORKER_STAGES`
    before anything ran; None otherwise."""
    error = outcome.details.get("error")
    if outcome.ok or not isinstance(error, Mapping) or error.get("stage") not in _WORKER_STAGES:
        return None
    return error.get("errno") or errno.EIO


def _claim_refused(exc: CtxError | OSError) -> CtxError:
    """A claim the host refused (out of descriptors, a read-only disk…), saying what became of
    the jobs: a claim refused midway is undone (:func:`cortexfs.queue.claim_job`)."""
    return CtxError(
        exc.errno or errno.EIO,
        f"a claim failed ({describe(exc)}); a claim refused midway is undone, and 'ctx "
        "queue recover --reconcile' settles whatever could not be undone",
    )


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


class LeftClaimed(CtxError):
    """A failure around a job that stops the worker with the job left claimed, no result
    written, for ``ctx queue recover`` to requeue once the worker has exited."""


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
    # What a worker draining the queue left pending, and why (protocol.LEFT_PENDING).
    left_pending: dict[str, str] = field(default_factory=dict)
    # The jobs an abort (a second SIGINT) or a failure that stopped the worker left claimed,
    # their tools killed, never started, or their calls not on record.
    left_claimed: list[str] = field(default_factory=list)

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
            "left_pending": self.left_pending,
            "left_claimed": self.left_claimed,
        }


Listener = Callable[[str, dict[str, Any]], None]


def _gone_elsewhere(
    path: Path, identity: tuple[int, int], since: str, *, follow_symlinks: bool = True
) -> tuple[int, str] | None:
    """None while ``path`` names the directory of ``identity`` (``st_dev``, ``st_ino``), the
    one this worker ``since`` (started on, opened); else the errno and the words that say
    where it went: ENOENT when nothing is there, ESTALE when another directory is."""
    try:
        now = os.stat(path, follow_symlinks=follow_symlinks)
    except FileNotFoundError:
        return errno.ENOENT, "no longer exists"
    if (now.st_dev, now.st_ino) == identity:
        return None
    return errno.ESTALE, f"now names another directory than the one this worker {since}"


def check_workable(queue: Queue, options: WorkerOptions) -> None:
    """What refuses a worker on ``queue`` before its first claim: a directory it may not
    change (its mode, an immutable or append-only attribute), a lease lifetime it cannot keep
    renewed.  Asked by the command line before the worker's session is made, so that a
    refused worker leaves nothing of it, and by :meth:`Worker.run` again."""
    try:
        queue.require_writable("work")
        lease_ttl_of(queue, options)
    except CtxError as exc:
        raise exc.then("no job was claimed") from None


def lease_ttl_of(queue: Queue, options: WorkerOptions) -> float:
    """The lifetime of a worker's leases: ``--ttl``, else the queue's ``lease_ttl``; EINVAL
    saying which, when a worker cannot keep it renewed."""
    if options.lease_ttl:
        return check_worker_ttl(options.lease_ttl)
    try:
        return check_worker_ttl(queue.config.lease_ttl)
    except CtxError as exc:
        raise CtxError(
            exc.errno,
            f"{exc.message}; it is the lease_ttl of {queue.path}/config: set lease_ttl to 1 or "
            "more there, or give this worker --ttl",
        ) from None


def _gone_from(path: Path, held: int) -> tuple[int, str] | None:
    """:func:`_gone_elsewhere` for the directory this worker opened as ``held``, which
    ``path`` named then (its last component never followed)."""
    opened = os.fstat(held)
    return _gone_elsewhere(path, (opened.st_dev, opened.st_ino), "opened", follow_symlinks=False)


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
        root: Path | None = None,
    ) -> None:
        self.queue_dir = queue_dir
        self.within = within  # the storage root of a project's queue: nothing below followed
        # The storage root the jobs' tools run in, reached by its path at each call, while the
        # queue is worked through the descriptors opened at the start: see _require_same_root.
        self.root = root
        self._root_identity: tuple[int, int] | None = None
        self.executor = executor
        self.options = options or WorkerOptions()
        self.listener = listener or (lambda event, fields: None)
        self.summary = WorkerSummary()
        self.stopping = threading.Event()
        self.abort = threading.Event()
        self.interrupted = False  # a ^C came: the next one aborts (docs/workers.md, Signals)
        self.wakeup = Wakeup()
        self._claimed = 0
        self._count_lock = threading.Lock()
        self._claim_lock = threading.Lock()
        self._controls: dict[str, JobControl] = {}  # the running jobs' (under _count_lock)
        self._renewal_failure: str | None = None  # a failure that a job given up says better
        # The threads telling the listener of an event, and since when (time.monotonic()).
        self._telling: dict[int, float] = {}
        # Set when an abort left job slots that waited for a reader to take their report: the
        # command then ends without waiting for them (see _slots_left_telling).
        self.reports_abandoned = False

    # ---------------------------------------------------------------- signals

    def stop(self, why: str = "request") -> None:
        """Stop claiming; running jobs finish."""
        if not self.stopping.is_set():
            self.summary.stopped_by = why
            self.stopping.set()
            self.wakeup.ring()

    def install_signal_handlers(self) -> None:
        def on_term(signum: int, frame: object) -> None:
            self.stop(signal.Signals(signum).name)

        def on_int(signum: int, frame: object) -> None:
            if self.interrupted:
                self.summary.aborted = True
                self.abort.set()
                self.executor.abort_running()
                return
            # A first ^C, also after a SIGTERM or a failure stopped the worker: the running
            # jobs finish; only a second one aborts them.  Noted first: the notice below may
            # wait for a reader that stopped reading (``| less``), and a second ^C meanwhile
            # runs this handler again, inside that write; it must find the first, and abort.
            self.interrupted = True
            self.stop("SIGINT")
            try:
                self.listener("interrupt", {"message": "finishing running jobs; ^C again aborts"})
            except RuntimeError as exc:
                # The ^C came while this thread was writing to the same stream (the start or
                # stop line, to a full pipe): the notice is dropped, the stop stands.
                if "reentrant call" not in str(exc):
                    raise

        for signum in STOP_SIGNALS:
            signal.signal(signum, on_term)
        signal.signal(signal.SIGINT, on_int)

    # ---------------------------------------------------------------- the loop

    def run(self) -> WorkerSummary:
        holder = Holder.for_process(worker=self.options.worker_id)
        if self.root is not None:
            started_on = os.stat(self.root)
            self._root_identity = (started_on.st_dev, started_on.st_ino)
        with Queue.open(self.queue_dir, within=self.within) as queue:
            # Refused before the first claim, not by the kernel inside a job slot's thread.
            check_workable(queue, self.options)
            # The claim order this user's other claimers on this host share (ctx queue claim,
            # other workers): the first claim reads a name instead of listing pending/, and
            # workers started side by side are handed different jobs instead of racing for one.
            queue.claim_order = HintedClaimOrder(queue.path)
            ttl = lease_ttl_of(queue, self.options)
            keeper = LeaseKeeper(
                queue,
                holder,
                ttl,
                self._renewal_refused,
                self._lease_lapsing,
                self._claim_taken,
            )
            _start(keeper, "no job was claimed")
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
            try:
                for thread in threads:
                    _start(thread, "the slots that started finish the job each runs, then it stops")
                # Join with a timeout so the main thread keeps handling signals.  An abort
                # waits too: its tools are killed, so the slots end at once, but a claim or a
                # finish under way completes first, on the queue's descriptors that are
                # closed below, and a tool that had ended has its job finished.
                while running := [t for t in threads if t.is_alive()]:
                    if self._slots_left_telling(running):
                        break
                    for thread in running:
                        thread.join(0.1)
            except CtxError:
                self.stop("a job slot could not start")  # the others finish the job they run
                for thread in threads:
                    if thread.ident is not None:
                        thread.join()
                # What the slots that started did is said, as at every stop, before the error.
                self.listener("stop", self.summary.to_json())
                raise
            finally:
                keeper.stopped.set()
                watch.close()
                self.wakeup.close()
            # One slot may pass over a job another slot of ours was claiming at that moment.
            self.summary.left_pending = still_pending(queue, self.summary.left_pending)
        self.listener("stop", self.summary.to_json())
        return self.summary

    def _tell(self, event: str, fields: dict[str, Any]) -> None:
        """The listener told of ``event`` by a job slot or the lease keeper, which meanwhile
        counts as telling (see :meth:`_slots_left_telling`: a slot tells of a job once it is
        finished, or claimed before its tool starts)."""
        me = threading.get_ident()
        self._telling[me] = time.monotonic()
        try:
            self.listener(event, fields)
        finally:
            self._telling.pop(me, None)

    def _slots_left_telling(self, running: list[threading.Thread]) -> bool:
        """Whether an abort stops waiting for the ``running`` slots: each has been telling
        the listener for :data:`ABANDONED_REPORT_SECONDS`, its output waiting for a reader
        that stopped reading (``ctx queue work | less``, its pager stopped).  An abort does
        not wait for a reader: the jobs such slots still hold (a claim they were reporting)
        are counted left claimed, and :attr:`reports_abandoned` tells the command to end
        without them."""
        if not self.abort.is_set():
            return False
        now = time.monotonic()
        since = [self._telling.get(thread.ident or 0) for thread in running]
        if any(t is None or now - t < ABANDONED_REPORT_SECONDS for t in since):
            return False
        with self._count_lock:
            self.summary.left_claimed.extend(
                job for job in self._controls if job not in self.summary.left_claimed
            )
        self.reports_abandoned = True
        return True

    def _require_same_root(self) -> None:
        """Before each claim: the storage root's path still names the directory the worker
        started on.  Moved (``mv``), or a link on its path (``storage/current``) now leading
        to another release, the queue the worker holds open would go on handing out jobs
        whose tools, policy and logs the path finds elsewhere, or nowhere: the worker stops,
        and the job stays pending."""
        if self.root is None or self._root_identity is None:
            return
        gone = _gone_elsewhere(self.root, self._root_identity, "started on")
        if gone is None:
            return
        code, where = gone
        raise CtxError(
            code,
            f"the storage root {self.root} {where} (it was moved, or a link on its path "
            "changed): the worker claims no more jobs, so that none runs with another root's "
            "tools, policy and logs; start it again on the root's path",
        )

    def _require_same_queue(self, queue: Queue) -> None:
        """Before each claim: the queue's path still names the directory the worker opened.
        A project removed (and perhaps made again) leaves the worker holding a queue nobody
        publishes to: it would wait on it for ever, blind to the jobs of the queue now at
        that path.  The worker stops, saying so; started again, it works the new one."""
        gone = _gone_from(queue.path, queue.root_fd)
        if gone is not None:
            code, where = gone
            raise CtxError(
                code,
                f"the queue {queue.path} {where} (its project was removed, or made again): the "
                "worker claims no more jobs from it; start it again to work the queue at that "
                "path",
            )
        # A state directory replaced by hand (pending/ moved aside and made again) would be
        # as blind: jobs published into the new one would wait for ever.
        for name, fd in queue.dirs.items():
            gone = _gone_from(queue.path / name, fd)
            if gone is not None:
                code, where = gone
                raise CtxError(
                    code,
                    f"{queue.path / name} {where} (replaced or moved by hand): the worker "
                    "claims no more jobs from the queue; start it again to work the queue as "
                    "it is now ('ctx queue status' shows it)",
                )

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
        except MemoryError:
            self._fail(out_of_memory("the job this slot ran is left as it stands"))
        except Exception as exc:
            self._fail(exc)

    def _fail(self, exc: Exception, *, renewal: bool = False) -> None:
        """Stop the worker for ``exc``, which is not a job's failure; the first one is its
        :attr:`WorkerSummary.failure`, except that a job given up for its lease replaces the
        refused renewal that led to it (``renewal``: ``exc`` is that renewal)."""
        with self._count_lock:
            first = self.summary.failure is None
            if first or self.summary.failure == self._renewal_failure:
                self.summary.failure = describe(exc)
                code = exc.errno if isinstance(exc, CtxError | OSError) else None
                self.summary.failure_errno = code or None
                self._renewal_failure = self.summary.failure if renewal else None
        self.stop("failure")

    def _renewal_refused(self, job: str, exc: CtxError | OSError, expires: float) -> None:
        """The host refused to renew J's lease (the lease keeper's ``on_refused``): said at
        once on every channel that may still work, and no more jobs are claimed; J runs on
        while the keeper tries again."""
        code = exc.errno or errno.EIO
        reason = (
            f"its lease could not be renewed ({_cause(exc)}); the worker claims no more jobs "
            "and tries again; unless a renewal succeeds, the job's tool is killed before its "
            f"lease expires at {rfc3339(expires)}, and the job is left claimed"
        )
        self._tell(
            "renew_failed",
            {"job": job, "error": errno.errorcode.get(code), "errno": code, "reason": reason},
        )
        # The session may be on the very disk that refused: said on the other channels then.
        with contextlib.suppress(CtxError, OSError):
            self.executor.record("queue.renew", job, "error", reason=reason)
        self._fail(
            CtxError(
                code,
                f"renewing the lease of job {job} failed ({_cause(exc)}), so the worker "
                f"stopped claiming jobs: {host_remedy(code)}, then start the worker again",
            ),
            renewal=True,
        )

    def _lease_lapsing(self, job: str, exc: CtxError | OSError, expires: float) -> None:
        """J's lease, which the host would not renew, is about to lapse: J's tool is killed
        and J left claimed, unless its finish has begun (it then lands while the lease holds,
        or is refused as another holder's)."""
        with self._count_lock:
            control = self._controls.get(job)
            if control is None or control.finishing:
                return
            control.given_up.set()
        self.executor.abort_job(job)
        code = exc.errno or errno.EIO
        self._fail(
            CtxError(
                code,
                f"job {job} was given up: its lease could not be renewed ({_cause(exc)}) and "
                f"would have expired at {rfc3339(expires)}, after which 'ctx queue recover' "
                f"requeues it as its holder's; so that it never runs twice at once, its tool's "
                f"process group was killed, and {job} stays claimed with no result written: "
                f"{host_remedy(code)}, then run 'ctx queue recover' (it requeues {job} once "
                "this worker has exited, and the job runs again) and start the worker again",
            )
        )

    def _claim_taken(self, job: str, claimed_at: float, exc: NotHeld) -> None:
        """J's claim was lost while its tool ran or was about to (this worker was stopped past
        J's lease, and recover requeued J): its tool is killed, or never started, and its
        outcome is not J's (its finish is refused as a lost claim's), so that J never runs
        twice at once, nor after another holder finished it."""
        with self._count_lock:
            control = self._controls.get(job)
            if control is None or control.claimed_at != claimed_at or control.finishing:
                return
            control.taken.set()
        self.executor.abort_job(job)

    def _confirmer(
        self, queue: Queue, holder: Holder, won: Claim, ttl: float, keeper: LeaseKeeper
    ) -> Callable[[], str | None]:
        """What the runner asks just before J's tool starts: whether this claim still holds J
        (a worker stopped past the lease while J's pre-hooks ran finds J requeued, or
        finished by another), its lease renewed first when less than half of it is left."""

        def confirm() -> str | None:
            expires = keeper.expiry_of(won.job, won.lease.claimed_at)
            if expires is not None and expires - time.time() >= ttl / 2:
                return None  # kept in time by the keeper (an expiry is the only way to lose
                # a live worker's claim, Q-5): nothing is read or written
            try:
                lease = renew(queue, won.job, [holder], ttl, claimed_at=won.lease.claimed_at)
            except NotHeld as exc:
                return f"this worker's claim of {won.job} was lost: {describe(exc)}"
            except (CtxError, OSError):
                return None  # the host's trouble: the keeper says it and gives the job up
            keeper.keep(lease)
            return None

        return confirm

    def _serve(
        self, queue: Queue, holder: Holder, ttl: float, keeper: LeaseKeeper, watch: PendingWatch
    ) -> None:
        while not self.stopping.is_set():
            if not self._take_ticket():
                return
            with self._claim_lock:
                self._require_same_root()
                self._require_same_queue(queue)
                try:
                    queue.reread_config()  # the limits for this job are the config's now
                except (CtxError, OSError) as exc:
                    raise CtxError(
                        exc.errno or errno.EIO,
                        f"the queue's config can no longer be read ({describe(exc)}); the "
                        "worker claims no more jobs: start it again once the config is repaired",
                    ) from exc
                left: dict[str, str] = {}
                try:
                    won = claim(queue, holder, ttl, self.executor.accepts, left)
                except (CtxError, OSError) as exc:
                    raise _claim_refused(exc) from exc
            if won is None:
                self._return_ticket()
                if self.options.drain:
                    with self._count_lock:
                        self.summary.left_pending.update(left)
                    return
                watch.wait(self.wakeup)
                continue
            watch.found_work()
            control = JobControl(
                self.options.job_timeout,
                self.abort,
                won.lease.claimed_at,
                self._confirmer(queue, holder, won, ttl, keeper),
            )
            with self._count_lock:
                earlier = self._controls.get(won.job)
                self._controls[won.job] = control
            if earlier is not None:
                # Another slot still runs an earlier claim of J, lost while this worker was
                # stopped past its lease: J was requeued, and is this claim's now.
                earlier.taken.set()
                self.executor.abort_job(won.job)
            keeper.keep(won.lease)
            try:
                record = self._execute_and_finish(queue, holder, won, control)
            except LeftClaimed:
                with self._count_lock:
                    self.summary.left_claimed.append(won.job)
                raise
            finally:
                keeper.release(won.job, won.lease.claimed_at)
                with self._count_lock:
                    if self._controls.get(won.job) is control:
                        del self._controls[won.job]
            if record is None:
                with self._count_lock:
                    if won.job not in self.summary.left_claimed:  # counted if left behind
                        self.summary.left_claimed.append(won.job)
                return  # aborted: the job stays claimed for recover
            with self._count_lock:
                if record.lost:
                    self.summary.lost += 1
                elif record.ok:
                    self.summary.done += 1
                else:
                    self.summary.failed += 1
            self._tell("lost" if record.lost else "finish", record.to_json())

    def _execute_and_finish(
        self, queue: Queue, holder: Holder, won: Claim, control: JobControl
    ) -> JobRecord | None:
        tool = won.request.get("tool")
        try:
            self._record(
                "queue.claim",
                won.job,
                "ok",
                f"job {won.job} is claimed and did not run; it stays claimed",
                "run 'ctx queue recover' once this worker has exited (it requeues the job)",
                tool=tool,
                lease=won.lease.to_json(),
            )
        except CtxError as exc:
            raise LeftClaimed(exc.errno, exc.message) from exc.__cause__
        self._tell("claim", {"job": won.job, "tool": tool})
        if self.abort.is_set():
            return None  # the abort came while the claim was under way: the tool never starts
        started = time.time()
        try:
            outcome = self.executor(won, control)
        except Exception as exc:
            if self.abort.is_set():
                return None  # what failed may be the abort's doing: left for recover
            code = exc.errno if isinstance(exc, CtxError | OSError) and exc.errno else errno.EIO
            if code in HOST_REFUSALS and isinstance(exc, CtxError | OSError):
                # The host refused what the worker does around the call (its session on a
                # full or read-only disk…): not the job's failure, and the next job would
                # meet the same.
                raise LeftClaimed(
                    code,
                    f"job {won.job} did not run: the worker failed around the call "
                    f"({describe(exc)}; it records every job in {self._session_file()}); it "
                    f"stays claimed with no result written: {host_remedy(code)}, then run "
                    "'ctx queue recover' once this worker has exited (it requeues the job)",
                ) from exc
            message = f"the worker failed around the call: {type(exc).__name__}: {exc}"
            outcome = failure(ToolError(code, "worker", message))  # the job fails; we go on
        if self.abort.is_set() and outcome.interrupted:
            return None  # its tool was killed: the job stays claimed, and runs again
        # An outcome the tool gave of its own, even after an abort: it is known, so the job is
        # finished with it rather than run a second time after recover.
        with self._count_lock:
            given_up = control.given_up.is_set()
            control.finishing = not given_up
        if given_up:
            # Its lease could not be kept (_lease_lapsing, which stopped the worker and says
            # why): finished by nobody, it stays claimed for recover.
            reason = (
                "given up: its lease could not be renewed, so its tool was killed before the "
                "lease expired; it stays claimed with no result written, and 'ctx queue "
                "recover' requeues it once this worker has exited"
            )
            self._record_lost(won.job, reason)
            with self._count_lock:
                self.summary.left_claimed.append(won.job)
            return JobRecord(won.job, False, reason, time.time() - started, tool, lost=True)
        unrecorded = _unrecorded_by_host(outcome)
        if unrecorded is not None:
            # The tool ran, but its call is not on record: finishing the job would make an
            # unlogged call a job's outcome, or fail a job for want of disk (docs/workers.md).
            raise LeftClaimed(
                unrecorded,
                f"job {won.job} was left claimed: {outcome.reason}; this worker records every "
                f"call in its session {self._session_file()} and in the tool's log, and "
                f"finishes no job whose call is not on record; no result of {won.job} was "
                f"written: {host_remedy(unrecorded)}, then run 'ctx queue recover' once this "
                "worker has exited (it requeues the job, which runs again)",
            )
        short = _host_shortage(outcome)
        if short is not None:
            # The tool never started for want of descriptors, memory or space: not the job's
            # failure, and every job after it would meet the same.  It stays claimed, and
            # recover requeues it once this worker is gone.
            raise LeftClaimed(
                short,
                f"job {won.job} did not run: {outcome.reason}; it stays claimed, and 'ctx queue "
                "recover' requeues it once this worker has exited",
            )
        unusable = _agent_unusable(outcome)
        if unusable is not None:
            # The agent was deleted or its controls broken since the worker started: no job
            # can run as it, none by its own fault, and failing them would drain the queue
            # into failed/ where a worker of another agent could run them.
            raise LeftClaimed(
                unusable,
                f"job {won.job} did not run: {outcome.reason}; no job can run as this "
                "worker's agent, so the worker stops; the job stays claimed, and 'ctx queue "
                "recover' requeues it once this worker has exited",
            )
        try:
            outcome = self._finish(queue, holder, won, outcome, started)
        except (CtxError, OSError) as exc:
            if isinstance(exc, NotHeld):
                # The queue's own refusal: another holder's lease, the job back in pending or
                # finished by someone else.  The same errnos from the kernel (a directory's
                # mode: EACCES) are the host's, and stop the worker below.
                reason = (
                    f"not finished by this worker: {exc.code_name}: {exc.fact}; its outcome is "
                    "discarded (if its lease expired and recover requeued the job, the job runs "
                    "again)"
                )
            else:
                # Recording the outcome failed (ENOSPC, EROFS, EIO…): the next job's would too.
                # The refusal's own last step ("then finish it again") is the command line's:
                # a finish by hand would record an outcome this worker never gave.
                reason = (
                    f"ran, but could not be finished: {_cause(exc)}; it is left as it is, and 'ctx "
                    "queue recover --reconcile' completes it (when its result is in place) or "
                    "requeues it to run again, once this worker has exited"
                )
                self._fail(CtxError(exc.errno or errno.EIO, f"job {won.job} {reason}"))
                with self._count_lock:
                    self.summary.left_claimed.append(won.job)  # J is as it was: still claimed
            self._record_lost(won.job, reason)
            return JobRecord(won.job, False, reason, time.time() - started, tool, lost=True)
        state = "done" if outcome.ok else "failed"
        self._record(
            "queue.finish",
            won.job,
            "ok" if outcome.ok else "error",
            f"job {won.job} is finished in {state}/ (nothing more is to be done for it), but "
            "the session does not say so",
            "start the worker again",
            state=state,
        )
        return JobRecord(won.job, outcome.ok, outcome.reason, time.time() - started, tool)

    def _session_file(self) -> str:
        return str(self.executor.session_file or "the worker's session")

    def _record(
        self, event: str, job: str, status: str, standing: str, then: str, /, **facts: Any
    ) -> None:
        """A queue transition in the executor's session; refused, an error that names the
        session's file, the job and where it is ``standing``, the remedy and what to do
        ``then``."""
        try:
            self.executor.record(event, job, status, **facts)
        except (CtxError, OSError) as exc:
            code = exc.errno or errno.EIO
            raise CtxError(
                code,
                f"cannot record {event} in the worker's session {self._session_file()} "
                f"({describe(exc)}); {standing}: {host_remedy(code)}, then {then}",
            ) from exc

    def _record_lost(self, job: str, reason: str) -> None:
        """``queue.lost`` in the session; refused, the worker stops, and the job's ``lost``
        line (its reason) is still shown."""
        try:
            self._record(
                "queue.lost",
                job,
                "error",
                f"job {job} was not finished ({reason})",
                "start the worker again",
                reason=reason,
            )
        except CtxError as exc:
            self._fail(exc)

    def _finish(
        self, queue: Queue, holder: Holder, won: Claim, outcome: Outcome, started: float
    ) -> Outcome:
        """Finish J with ``outcome``, as its lease holder; returns the outcome recorded.

        A result over the queue's ``max_result_bytes`` fails the job instead (EFBIG), with
        the output omitted: the job is finished either way, never left claimed.  Finishing
        as someone who no longer holds J's lease (EACCES), or a J that is no longer claimed,
        raises: the job is another holder's now, or back in pending.
        """
        job = won.job
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
                claimed_at=won.lease.claimed_at,
            )
            return outcome
        except ResultOverLimit as exc:
            too_big = exc  # the result's doing; an EFBIG of the host's (ulimit -f) is raised
        # A call that failed already (its output over the runner's limit, say) keeps its reason.
        before = (
            "" if outcome.reason is None else f"; the call had failed already: {outcome.reason}"
        )
        error = ToolError(
            errno.EFBIG, "finish", f"{too_big.message}; the output is omitted{before}"
        )
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
            claimed_at=won.lease.claimed_at,
            enforce_limit=False,
        )
        return omitted


def _start(thread: threading.Thread, then: str) -> None:
    """Start ``thread``; EAGAIN, saying ``then`` (what the worker does about it), when the
    host refuses it one: for want of room under the limit of processes (``ulimit -u``),
    which counts threads too, or of the system's threads, or by a filter on ``clone3`` (a
    container's seccomp profile).  Python does not say which; the limit is named only when
    there is one that applies."""
    try:
        thread.start()
    except RuntimeError as exc:
        why = no_process_could_be_made()
        raise CtxError(
            errno.EAGAIN, f"the worker cannot start its thread {thread.name} ({exc}): {why}; {then}"
        ) from None
