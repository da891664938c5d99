"""The workloads whose crash states the harness explores: each verb alone, a full lifecycle,
two workers contending, same-name publishers, two finishers without flock, and recover
itself crashing midway (docs/crash-model.md §4).

A workload has an unrecorded ``setup`` that builds its durable starting state and a
recorded ``run``.  Every lease is held by the stage's holder: a process that has exited (so
any crash state may be recovered) or, for the "never touch a live holder" checks, one that
is still running.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass

from cortexfs import durable
from cortexfs.durable import MOVE_LINK
from cortexfs.queue import Holder
from tests.crash.stage import Stage, preempt


@dataclass(frozen=True)
class Workload:
    name: str
    run: Callable[[Stage], None]
    setup: Callable[[Stage], None] = lambda stage: None
    group: str = ""
    without_flock: bool = False  # run on a filesystem where flock fails (some NFS setups)

    @property
    def row(self) -> str:
        """The line of the result table this workload counts towards."""
        return self.group or self.name


# ---------------------------------------------------------------------- setups


def one_pending(stage: Stage) -> None:
    with stage.plain_queue() as q:
        stage.publish(q, "a", pad=1200)


def two_pending(stage: Stage) -> None:
    with stage.plain_queue() as q:
        stage.publish(q, "a", pad=1200)
        stage.publish(q, "b")


def one_claimed(stage: Stage) -> None:
    with stage.plain_queue() as q:
        stage.publish(q, "a", pad=1200)
        stage.claim(q, "a")


class SimulatedDeath(BaseException):
    """A process dying at a named point: raised through the protocol, caught by no one."""


class DiesAt(durable.FsOps):
    """Real operations until the protocol reaches ``step`` (or completes ``syscall``)."""

    def __init__(self, strategy: str, step: str = "", syscall: str = "") -> None:
        super().__init__(strategy)
        self.at_step, self.after_syscall = step, syscall

    def step(self, name: str) -> None:
        if name == self.at_step:
            raise SimulatedDeath(name)

    def link(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
        super().link(src, src_dir_fd, dst, dst_dir_fd)
        if self.after_syscall == "link":
            raise SimulatedDeath("link")


def leftovers(stage: Stage) -> None:
    """One job of every kind recover handles, each left by a real process dying midway."""
    with stage.plain_queue() as q:
        for name in ("p1", "c1", "u1", "r1", "o1", "e1", "d1"):
            stage.publish(q, name)
        for name in ("c1", "r1", "o1", "d1"):
            stage.claim(q, name)
        stage.finish(q, "d1.req.json", ok=True)

    def dying(step: str = "", syscall: str = "", *, verb: Callable[..., object]) -> None:
        with (
            stage.plain_queue(DiesAt(stage.strategy, step, syscall)) as q,
            suppress(SimulatedDeath),
        ):
            verb(q)

    dying("lease.write", verb=lambda q: stage.claim(q, "u1"))
    dying("finish.request", verb=lambda q: stage.finish(q, "r1.req.json", ok=True))
    dying("finish.cleanup", verb=lambda q: stage.finish(q, "o1.req.json", ok=False))
    dying("claim.move", verb=lambda q: stage.claim(q, "e1"))
    dying("publish.move", verb=lambda q: stage.publish(q, "t1"))
    if stage.strategy == MOVE_LINK:
        with stage.plain_queue() as q:
            stage.publish(q, "k1")
        dying(syscall="link", verb=lambda q: stage.claim(q, "k1"))


def remote_holder() -> Holder:
    """A worker on another machine: only its lease's expiry can prove it gone (Q-5, N-1)."""
    return Holder(
        worker="remote",
        host="elsewhere.example",
        machine_id="0" * 32,
        boot_id="00000000-0000-0000-0000-000000000000",
        pid_ns=1,
        pid=1,
        start_time=0.0,
    )


def expired_and_reclaimed(stage: Stage) -> None:
    """A remote worker's lease expired; recover requeued the job; it was claimed again.
    The remote worker does not know, and still runs the job."""
    with stage.plain_queue() as q:
        stage.publish(q, "a")
        stage.claim(q, "a", holder=remote_holder(), ttl=0.001)
        time.sleep(0.01)
        stage.recover(q, reconcile=False)
        stage.claim(q, "a")


# ---------------------------------------------------------------------- runs


def lifecycle(stage: Stage) -> None:
    with stage.queue("worker") as q:
        stage.publish(q, "a", pad=1200)
        stage.publish(q, "b")
        stage.claim(q, "a")
        stage.renew(q, "a.req.json")
        stage.finish(q, "a.req.json", ok=True)
        stage.claim(q, "b")
        stage.finish(q, "b.req.json", ok=False)


def contention(step: str) -> Callable[[Stage], None]:
    """Workers A and B each claim, execute and finish one job; A is preempted at ``step``."""

    def run(stage: Stage) -> None:
        with stage.queue("A") as qa, stage.queue("B") as qb:
            preempt(
                stage.journal,
                lambda: stage.work_once(qa),
                lambda: stage.work_once(qb),
                actor="A",
                step=step,
            )

    return run


def publish_race(step: str) -> Callable[[Stage], None]:
    """A and B publish the same name; A is preempted at ``step``.  One of them must be
    refused (Q-1), whoever comes second."""

    def run(stage: Stage) -> None:
        with stage.queue("A") as qa, stage.queue("B") as qb:
            preempt(
                stage.journal,
                lambda: stage.publish(qa, "a", author="A"),
                lambda: stage.publish(qb, "a", author="B"),
                actor="A",
                step=step,
            )

    return run


def publish_batch_race(stage: Stage) -> None:
    """A publishes a batch, B one of its names while A's temp files are being written."""
    with stage.queue("A") as qa, stage.queue("B") as qb:
        preempt(
            stage.journal,
            lambda: stage.publish_batch(qa, ["a", "b"], author="A"),
            lambda: stage.publish(qb, "a", author="B"),
            actor="A",
            step="publish_batch.move",
        )


def two_finishers(step: str, ok: bool) -> Callable[[Stage], None]:
    """The remote worker (A) and the new holder (B) finish the same job with the same
    outcome; A is preempted at ``step``.  Without flock only the no-replace result move
    decides: one of them must be refused (Q-4)."""

    def run(stage: Stage) -> None:
        with stage.queue("A") as qa, stage.queue("B") as qb:
            preempt(
                stage.journal,
                lambda: stage.finish(qa, "a.req.json", ok),
                lambda: stage.finish(qb, "a.req.json", ok),
                actor="A",
                step=step,
            )

    return run


def worker_steps() -> Iterator[str]:
    yield from ("claim.mkdir", "claim.move", "lease.write", "lease.mkdir", "lease.move")
    yield from ("finish.write", "finish.result", "finish.request", "finish.cleanup")


def workloads() -> list[Workload]:
    """Every workload, in the order of the result table."""

    def run_in(actor: str, body: Callable[..., None]) -> Callable[[Stage], None]:
        def run(stage: Stage) -> None:
            with stage.queue(actor) as q:
                body(stage, q)

        return run

    return [
        Workload("publish", run_in("publisher", lambda s, q: s.publish(q, "a", pad=1200))),
        Workload(
            "publish --batch", run_in("publisher", lambda s, q: s.publish_batch(q, ["b", "c"]))
        ),
        Workload("claim + lease", run_in("worker", lambda s, q: s.claim(q)), one_pending),
        Workload("renew", run_in("worker", lambda s, q: s.renew(q, "a.req.json")), one_claimed),
        Workload(
            "finish ok",
            run_in("worker", lambda s, q: s.finish(q, "a.req.json", ok=True)),
            one_claimed,
        ),
        Workload(
            "finish error",
            run_in("worker", lambda s, q: s.finish(q, "a.req.json", ok=False)),
            one_claimed,
        ),
        Workload("lifecycle", lifecycle),
        *(
            Workload(f"contention@{step}", contention(step), two_pending, "two workers")
            for step in worker_steps()
        ),
        *(
            Workload(f"publish race@{step}", publish_race(step), group="same-name publish")
            for step in ("publish.move", "publish.done")
        ),
        Workload("publish race@publish_batch.move", publish_batch_race, group="same-name publish"),
        *(
            Workload(f"one job, two workers@{step}", contention(step), one_pending, "two workers")
            for step in ("claim.mkdir", "claim.move")
        ),
        *(
            Workload(
                f"two finishers ({'ok' if ok else 'error'})@{step}",
                two_finishers(step, ok),
                expired_and_reclaimed,
                "two finishers, no flock",
                without_flock=True,
            )
            for step in ("finish.write", "finish.result", "finish.request")
            for ok in (True, False)
        ),
        Workload("recover", run_in("recover", lambda s, q: s.recover(q, False)), leftovers),
        Workload(
            "recover --reconcile",
            run_in("recover", lambda s, q: s.recover(q, True)),
            leftovers,
        ),
    ]


def crowded_workloads() -> list[Workload]:
    """Workloads whose crash points hold more subsets than the exhaustive limit: sampled."""

    def batch_of_eight(stage: Stage) -> None:
        with stage.queue("publisher") as q:
            stage.publish_batch(q, [f"j{n}" for n in range(8)])

    return [Workload("publish --batch of 8", batch_of_eight)]
