"""Keeping a worker's leases alive while their jobs run (SPEC Q-3, Q-5, I-4): the one
thread of a worker that renews them, and what it does when the host refuses a renewal.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable

from cortexfs.errors import CtxError
from cortexfs.queue import Holder, Lease, Queue, renew
from cortexfs.queue.leasing import NotHeld
from cortexfs.queue.transition import LOCK_WAIT_SECONDS

# How long a round first waits for a job's lock (at most a quarter of a round): a claim,
# finish or recover holds it for a few fsyncs.
_BRIEF_LOCK_WAIT = 1.0

RenewalRefused = Callable[[str, CtxError | OSError, float], None]


class LeaseKeeper(threading.Thread):
    """Renews this worker's leases of running jobs every third of their lifetime.

    A job claimed just after a round is renewed at the next one, a third of the lifetime
    later: every lease is renewed with at least two thirds of its lifetime left.  An expired
    lease is proof that its holder is gone (Q-5), so a lease must never get that far while
    its job runs.

    A renewal the host refuses (a full disk, a read-only or immutable directory, an I/O
    error) is said at once (``on_refused``) and tried again every round.  When such a lease
    has less than one round left, it would lapse before the next one, and recover would
    requeue its job while it still runs: it is tried once more, and if that fails too its
    job is given up (``on_lapsing``: its tool killed, the job left claimed) before it lapses.
    Both are called with the job, the refusal and when the lease expires.

    A job's lock held by another process (a ``recover`` stopped with Ctrl-Z, a stuck script)
    is such a refusal too, met within half a round for all the jobs of the round together:
    waited for as long as a claim waits, one job's lock would hold up every other job's
    renewal until their leases lapsed.
    """

    def __init__(
        self,
        queue: Queue,
        holder: Holder,
        ttl: float,
        on_refused: RenewalRefused,
        on_lapsing: RenewalRefused,
        on_taken: Callable[[str, float, NotHeld], None] = lambda job, claimed_at, exc: None,
    ) -> None:
        super().__init__(name="lease-keeper", daemon=True)
        self.queue, self.holder, self.ttl = queue, holder, ttl
        self.period = ttl / 3
        self.on_refused, self.on_lapsing, self.on_taken = on_refused, on_lapsing, on_taken
        # Which claim of each running job is kept: a worker stopped past its lease may claim
        # the job again once recover requeued it, and only the later claim is its own.
        self.claims: dict[str, float] = {}
        self.expires: dict[
            str, float
        ] = {}  # each running job: when its lease, as last written, expires
        self.refused: dict[str, CtxError | OSError] = {}  # jobs whose last renewal the host refused
        self.given_up: set[str] = set()
        self.lock = threading.Lock()
        self.stopped = threading.Event()

    def keep(self, lease: Lease) -> None:
        """Renew ``lease``'s job from now on (this claim of it, the one it was taken by)."""
        with self.lock:
            self.expires[lease.job] = lease.expires_at
            self.claims[lease.job] = lease.claimed_at

    def expiry_of(self, job: str, claimed_at: float) -> float | None:
        """When the lease of this claim of ``job`` expires, as last written; None when the
        claim is not the one kept (released, or the job claimed again)."""
        with self.lock:
            return self.expires[job] if self.claims.get(job) == claimed_at else None

    def release(self, job: str, claimed_at: float | None = None) -> None:
        """Renew ``job`` no more (it is finished, lost or left claimed); given ``claimed_at``,
        only while that claim is the one kept (a later claim of the job is kept on)."""
        with self.lock:
            if claimed_at is not None and self.claims.get(job) != claimed_at:
                return
            self.expires.pop(job, None)
            self.claims.pop(job, None)
            self.refused.pop(job, None)
            self.given_up.discard(job)

    def run(self) -> None:
        due = time.time() + self.period
        while not self.stopped.wait(max(0.0, self._next_wake(due) - time.time())):
            now = time.time()
            with self.lock:
                if now >= due:
                    due = now + self.period
                    jobs = sorted(set(self.expires) - self.given_up)
                else:  # a refused lease about to have less than a round left: a last try
                    jobs = sorted(j for j in self.refused if self._last_round(j, now))
            # Each job first with a brief wait for its lock, which a claim, finish or recover
            # holds for one transition; then those still locked, sharing what is left of half
            # a round: one job's lock held by a stopped or stuck process holds up no other
            # job's renewal, and a busy lock is a refusal only once that time has passed.
            round_ends = time.monotonic() + self.period / 2
            brief = min(_BRIEF_LOCK_WAIT, self.period / 4)
            busy = [job for job in jobs if not self._renew(job, brief, last_try=False)]
            for job in busy:
                left = min(LOCK_WAIT_SECONDS, round_ends - time.monotonic())
                self._renew(job, max(brief, left), last_try=True)
            self._give_up_lapsing()

    def _last_round(self, job: str, now: float) -> bool:
        return self.expires[job] - now < self.period

    def _next_wake(self, due: float) -> float:
        """The next round, or sooner the moment a refused lease has one round left."""
        with self.lock:
            return min([due, *(self.expires[job] - self.period for job in self.refused)])

    def _renew(self, job: str, lock_wait: float, *, last_try: bool) -> bool:
        """Renew ``job``'s lease, waiting ``lock_wait`` seconds at most for its lock; False
        when the lock was still held and this was not the ``last_try`` of the round (nothing
        said then), True otherwise, whatever came of it."""
        with self.lock:
            claimed_at = self.claims.get(job)
        if claimed_at is None:
            return True  # released meanwhile
        try:
            lease = renew(
                self.queue,
                job,
                [self.holder],
                self.ttl,
                claimed_at=claimed_at,
                lock_wait=lock_wait,
            )
        except NotHeld as exc:
            # Finished meanwhile, or the claim was lost (its lease expired and recover
            # requeued the job, Q-5; perhaps claimed again since): not ours to run on.
            with self.lock:
                ours = self.claims.get(job) == claimed_at
            if ours:
                self.on_taken(job, claimed_at, exc)
            return True
        except CtxError as exc:
            if exc.errno == errno.EAGAIN and not last_try:
                return False  # its lock is held: tried again once the other jobs are renewed
            self._refused(job, exc)
            return True
        except Exception as exc:
            # Whatever stops a renewal is refused like a full disk is: said, tried again, the
            # job given up before its lease lapses.  Never the end of this thread, which
            # renews every running job's lease: without it they would all lapse while their
            # tools run, and recover would hand them out a second time (I-4).
            if not isinstance(exc, OSError):
                exc = CtxError(errno.EIO, f"an unexpected error: {type(exc).__name__}: {exc}")
            self._refused(job, exc)
            return True
        with self.lock:
            if self.claims.get(job) == claimed_at:
                self.expires[job] = lease.expires_at
                self.refused.pop(job, None)
        return True

    def _refused(self, job: str, exc: CtxError | OSError) -> None:
        """Note the refusal of ``job``'s renewal, said the first time (``on_refused``)."""
        with self.lock:
            if job not in self.expires or job in self.given_up:
                return
            first = job not in self.refused
            self.refused[job] = exc
            expires = self.expires[job]
        if first:
            self.on_refused(job, exc, expires)

    def _give_up_lapsing(self) -> None:
        now = time.time()
        with self.lock:
            lapsing = [
                (j, self.refused.pop(j)) for j in sorted(self.refused) if self._last_round(j, now)
            ]
            self.given_up.update(job for job, _ in lapsing)
            expiries = [self.expires[job] for job, _ in lapsing]
        for (job, exc), expires in zip(lapsing, expiries, strict=True):
            self.on_lapsing(job, exc, expires)
