"""Real processes for the kill -9 tests: workers, publishers and recover, killable at will.

    python -m tests.crash.kill_runner work    QUEUE LOGS [--renew] [--die-at POINT]
    python -m tests.crash.kill_runner publish QUEUE LOGS NAME... [--batch] [--die-at POINT]
    python -m tests.crash.kill_runner recover QUEUE LOGS [--reconcile] [--die-at POINT]
    python -m tests.crash.kill_runner fuzz    QUEUE LOGS --kills N --seed S

``--die-at POINT`` installs an :class:`cortexfs.durable.FsOps` that SIGKILLs the process when
the protocol reaches that named step, or right after a successful ``link`` (the middle of a
link-strategy move); ``--occurrence`` picks the n-th time.  That hook exists only here: the
product has no way to enable it.

Every event the checks need is one line written with one ``write`` on an ``O_APPEND`` file
in LOGS: the subject, the process (``pid@start-time``: unlike a pid, never reused) and
``CLOCK_MONOTONIC`` (one clock for every process on the machine).  ``published`` after
publish returned, ``exec`` once a job is claimed (before its finish), ``ack`` after finish
returned, ``kills`` just *before* a SIGKILL is sent (so nothing the victim's death allows,
like a requeue, can be logged ahead of it).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import psutil

from cortexfs import durable
from cortexfs.queue import Holder, Queue, claim, finish, publish, publish_batch, recover, renew


class DyingOps(durable.FsOps):
    """Real operations that SIGKILL this process at a chosen point (and log it first)."""

    def __init__(self, strategy: str | None, logs: Path, at: str, occurrence: int = 1) -> None:
        super().__init__(strategy)
        self.logs, self.at, self.left = logs, at, occurrence

    def _reached(self, point: str) -> None:
        if point == self.at:
            self.left -= 1
            if self.left == 0:
                Log(self.logs, "kills").write(identity())
                os.kill(os.getpid(), signal.SIGKILL)

    def step(self, name: str) -> None:
        self._reached(name)

    def link(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
        super().link(src, src_dir_fd, dst, dst_dir_fd)
        self._reached("link")


def identity(pid: int | None = None) -> str:
    """``pid@start-time`` of a process (default: this one)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}@{psutil.Process(pid).create_time():.3f}"


class Log:
    """An append-only event log: one line, one write."""

    def __init__(self, logs: Path, name: str) -> None:
        self.fd = os.open(logs / name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, subject: str) -> None:
        line = f"{subject} {identity()} {time.monotonic_ns()}\n"
        os.write(self.fd, line.encode())


def ops_for(args: argparse.Namespace) -> durable.FsOps:
    if args.die_at:
        return DyingOps(args.strategy, args.logs, args.die_at, args.occurrence)
    return durable.FsOps(args.strategy)


def outcome_of(job: str) -> bool:
    """Jobs fail deterministically one time in four, so failed/ is exercised too."""
    return sum(job.encode()) % 4 != 0


def work(
    queue_dir: Path, logs: Path, ops: durable.FsOps, *, forever: bool, renew_too: bool
) -> None:
    """Claim, execute (log it), optionally renew, finish (log the ack); until the queue is
    empty, or forever (the fuzz kills us)."""
    holder = Holder.for_process(worker=f"worker-{os.getpid()}")
    executed, acked = Log(logs, "exec"), Log(logs, "ack")
    with Queue.open(queue_dir, ops=ops) as queue:
        while True:
            won = claim(queue, holder, ttl=600)
            if won is None:
                if not forever:
                    return
                time.sleep(0.005)
                continue
            executed.write(won.job)
            if renew_too:
                renew(queue, won.job, [holder], ttl=600)
            finish(queue, won.job, outcome_of(won.job), {"by": identity()})
            acked.write(won.job)


def publish_jobs(
    queue_dir: Path, logs: Path, ops: durable.FsOps, names: list[str], batch: bool
) -> None:
    published = Log(logs, "published")
    with Queue.open(queue_dir, ops=ops) as queue:
        requests = [request_for(name) for name in names]
        if batch:
            for job in publish_batch(queue, requests, names):
                published.write(job)
        else:
            for name, doc in zip(names, requests, strict=True):
                published.write(publish(queue, doc, name))


def request_for(name: str) -> dict[str, Any]:
    return {"tool": "fs.stat", "input": {"job": name}}


def recover_once(queue_dir: Path, ops: durable.FsOps, reconcile: bool) -> None:
    with Queue.open(queue_dir, ops=ops) as queue:
        recover(queue, reconcile=reconcile, grace=0)


# --------------------------------------------------------------------------- the fuzz


def fuzz(queue_dir: Path, logs: Path, kills: int, seed: int, strategy: str | None) -> int:
    """Four forked workers and one recover loop, SIGKILLed at random moments and restarted,
    until ``kills`` SIGKILLs have been sent; jobs are published as the queue runs low.

    Returns how many processes ended on their own (an error: their traceback is on stderr)."""
    rng = random.Random(seed)
    killed, published = Log(logs, "kills"), 0

    def spawn(role: str) -> int:
        pid = os.fork()
        if pid == 0:
            random.seed()
            try:
                if role == "worker":
                    work(queue_dir, logs, durable.FsOps(strategy), forever=True, renew_too=True)
                else:
                    recover_loop(queue_dir, logs, strategy)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(1)
        return pid

    roles = {spawn("worker"): "worker" for _ in range(4)}
    roles[spawn("recover")] = "recover"
    sent = failed = 0
    while sent < kills:
        while (ended := os.waitpid(-1, os.WNOHANG)[0]) != 0:
            failed += 1
            role = roles.pop(ended)
            roles[spawn(role)] = role
        if pending_count(queue_dir) < 20:
            names = [f"f{published + i:05d}.req.json" for i in range(40)]
            publish_jobs(queue_dir, logs, durable.FsOps(strategy), names, batch=True)
            published += len(names)
        time.sleep(rng.uniform(0, 0.03))
        victim = rng.choice(
            [p for p, role in roles.items() if role == "worker"] * 4
            + [p for p, role in roles.items() if role == "recover"]
        )
        killed.write(identity(victim))
        os.kill(victim, signal.SIGKILL)
        os.waitpid(victim, 0)
        sent += 1
        role = roles.pop(victim)
        roles[spawn(role)] = role
    for pid in roles:
        killed.write(identity(pid))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    print(f"{sent + len(roles)} SIGKILLs, {published} jobs published, {failed} failed")
    return failed


def recover_loop(queue_dir: Path, logs: Path, strategy: str | None) -> None:
    """``recover --reconcile`` again and again next to live workers, with the default grace
    period: it must never touch a job whose holder is alive (Q-6).  What it did is logged."""
    applied = Log(logs, "recovered")
    with Queue.open(queue_dir, ops=durable.FsOps(strategy)) as queue:
        while True:
            report = recover(queue, reconcile=True)
            for finding in report.requeued + report.repaired:
                applied.write(f"{finding.job}:{finding.action}")
            time.sleep(0.02)


def pending_count(queue_dir: Path) -> int:
    return len(os.listdir(queue_dir / "pending"))


# --------------------------------------------------------------------------- command line


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="kill_runner")
    parser.add_argument("mode", choices=["work", "publish", "recover", "fuzz"])
    parser.add_argument("queue", type=Path)
    parser.add_argument("logs", type=Path)
    parser.add_argument("names", nargs="*")
    parser.add_argument("--strategy", choices=[durable.MOVE_RENAME, durable.MOVE_LINK])
    parser.add_argument("--die-at", help="SIGKILL at this step, or after this call")
    parser.add_argument("--occurrence", type=int, default=1)
    parser.add_argument("--batch", action="store_true")
    parser.add_argument("--renew", action="store_true")
    parser.add_argument("--reconcile", action="store_true")
    parser.add_argument("--kills", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_intermixed_args(argv)
    ops = ops_for(args)
    if args.mode == "work":
        work(args.queue, args.logs, ops, forever=False, renew_too=args.renew)
    elif args.mode == "publish":
        publish_jobs(args.queue, args.logs, ops, args.names, args.batch)
    elif args.mode == "recover":
        recover_once(args.queue, ops, args.reconcile)
    elif fuzz(args.queue, args.logs, args.kills, args.seed, args.strategy):
        sys.exit("fuzz: processes died of an error instead of a SIGKILL (see above)")


if __name__ == "__main__":
    main(sys.argv[1:])
