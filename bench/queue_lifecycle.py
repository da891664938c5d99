"""Queue lifecycle benchmark: our throughput against this disk's fsync floor and peer queues.

Everything is measured in one run on one filesystem and reported as ratios:

(a) the fsync floor — the measured latency of a file fsync and of a directory fsync, times the
    number of each that the protocol issues per job (counted through ``durable.FsOps``), and
    beside it what creating a small file costs in that directory, no barrier but the
    filesystem's own price (a NOTE is printed where it is far above the usual);
(b) our lifecycle (publish → claim → finish, library API, one process) and batch publish;
(c) peers at equal durability: persist-queue ``SQLiteAckQueue`` (WAL, synchronous=FULL, checked)
    and litequeue (WAL, switched to synchronous=FULL), plus python-dirq ``QueueSimple``, which
    never fsyncs, as a non-durable upper bound;
(d) the cost of a claim with 1 000 and with 100 000 jobs pending, the two queues taking turns:
    durable, and with the fsyncs left out (the part of a claim that could grow with the queue).

Beside the peers it prints the least a design can pay that keeps each job in files of its own
and acknowledges each step durably (3 file + 3 directory fsyncs per job, at this run's
latencies): the ceiling against which the SQLite comparison should be read.

The contenders of (b) and (c) and the fsync probe of (a) take turns (``--rounds``), so that a
disk whose speed drifts during the run affects each of them alike.

Usage: python bench/queue_lifecycle.py [--jobs N] [--rounds N] [--big N] [--dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from cortexfs.durable import FsOps
from cortexfs.queue import Holder, Queue, claim, finish, init_queue, publish, publish_batch

REQUEST = {"tool": "fs.stat", "input": {"path": "/srv/data/report.csv"}}

# Above this, creating a small file costs more than a local filesystem usually asks
# (ext4 and xfs on an idle SSD: 10-30 us): what a create costs is then the allocator's.
SLOW_CREATE = 100e-6


class CountingOps(FsOps):
    """Real operations that count file fsyncs, directory fsyncs, syncfs calls and the entries
    created (files and directories), and time each fsync with the queue-relative name of what
    it made durable (``J`` for the job)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.barriers: list[tuple[str, float]] = []

    def fsync(self, fd: int) -> None:
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        self.counts[f"{kind}_fsync"] += 1
        target = os.readlink(f"/proc/self/fd/{fd}").rsplit("/count/", 1)[-1]
        start = time.perf_counter()
        super().fsync(fd)
        self.barriers.append((f"{kind} {target}", time.perf_counter() - start))

    def syncfs(self, fd: int) -> None:
        self.counts["syncfs"] += 1
        super().syncfs(fd)

    def create_file(self, name: str, dir_fd: int, mode: int = 0o666) -> int:
        self.counts["create"] += 1
        return super().create_file(name, dir_fd, mode)

    def mkdir(self, name: str, dir_fd: int, mode: int = 0o777) -> None:
        self.counts["create"] += 1
        self.counts["mkdir"] += 1
        super().mkdir(name, dir_fd, mode)


def fresh_queue(base: Path, name: str, ops: FsOps | None = None) -> Queue:
    path = base / name
    shutil.rmtree(path, ignore_errors=True)
    init_queue(path)
    return Queue.open(path, ops)


# ----------------------------------------------------------------------------- (a) floor


class Latencies(NamedTuple):
    """Seconds each probe took: creating a small file, its fsync, a directory's fsync."""

    create: list[float]
    file_fsync: list[float]
    dir_fsync: list[float]
    directory: list[float]


def fsync_latencies(base: Path, samples: int) -> Latencies:
    """Seconds of file fsyncs (fresh small files) and of dir fsyncs after a rename, and of
    creating those files.  A create costs no barrier, but its cost is the filesystem's, not
    ours: ext4's inode allocator has been seen to take 25 us in one directory of a disk and
    700 us in another of the same disk (a virtual one, after many files came and went), and
    the lifecycle creates a few entries a job.  Beside them: a directory made, opened, removed
    and closed, no barrier either, as a claim makes ``claimed/J`` and ``lease/J`` and a finish
    removes them (ext4 gives a directory a block of its own, freed when the last descriptor of
    the removed directory is closed)."""
    probe = base / "fsync-probe"
    probe.mkdir()
    dir_fd = os.open(probe, os.O_RDONLY | os.O_DIRECTORY)
    create_times: list[float] = []
    file_times: list[float] = []
    dir_times: list[float] = []
    directory_times: list[float] = []
    try:
        for n in range(samples):
            start = time.perf_counter()
            fd = os.open(f"f{n}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=dir_fd)
            create_times.append(time.perf_counter() - start)
            os.write(fd, json.dumps(REQUEST).encode())
            start = time.perf_counter()
            os.fsync(fd)
            file_times.append(time.perf_counter() - start)
            os.close(fd)
            os.rename(f"f{n}", f"g{n}", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            start = time.perf_counter()
            os.fsync(dir_fd)
            dir_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            os.mkdir(f"d{n}", dir_fd=dir_fd)
            made_fd = os.open(f"d{n}", os.O_RDONLY | os.O_DIRECTORY, dir_fd=dir_fd)
            os.rmdir(f"d{n}", dir_fd=dir_fd)
            os.close(made_fd)
            directory_times.append(time.perf_counter() - start)
    finally:
        os.close(dir_fd)
        shutil.rmtree(probe)
    return Latencies(create_times, file_times, dir_times, directory_times)


def fsyncs_per_job(
    base: Path, holder: Holder, jobs: int = 50
) -> tuple[Counter[str], list[tuple[str, float]]]:
    """The fsyncs of one lifecycle: counts per kind, and each barrier in order with its
    median latency (what it made durable, seconds)."""
    ops = CountingOps()
    rounds: list[list[tuple[str, float]]] = []
    with fresh_queue(base, "count", ops) as q:
        for _ in range(jobs):
            ops.barriers.clear()
            publish(q, REQUEST)
            won = claim(q, holder)
            assert won is not None
            finish(q, won.job, True, {"size": 1})
            rounds.append([(what.replace(won.job, "J"), took) for what, took in ops.barriers])
    counts = Counter({k: v // jobs for k, v in ops.counts.items()})
    trace = [
        (steps[0][0], statistics.median(took for _, took in steps))
        for steps in zip(*rounds, strict=True)
    ]
    return counts, trace


# ------------------------------------------------------------------- (b) ours, (c) peers
#
# Each contender is set up once and then runs ``n`` lifecycles (or publishes) per call; the
# contenders take turns round after round, so that a disk whose latency drifts during the
# run (a shared or virtual disk does) weighs on all of them alike.

Run = Callable[[int], object]


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def our_lifecycle(q: Queue, holder: Holder) -> Run:
    def run(jobs: int) -> None:
        for _ in range(jobs):
            publish(q, REQUEST)
            won = claim(q, holder)
            assert won is not None
            finish(q, won.job, True, {"size": 1})

    return run


def single_publish(q: Queue) -> Run:
    return lambda jobs: [publish(q, REQUEST) for _ in range(jobs)]


def batch_publish(q: Queue) -> Run:
    return lambda jobs: publish_batch(q, [REQUEST] * jobs)


def persist_queue_lifecycle(base: Path) -> tuple[Run, str]:
    from persistqueue import SQLiteAckQueue

    q = SQLiteAckQueue(str(base / "persistqueue"), auto_commit=True, multithreading=True)
    mode = q._getter.execute("PRAGMA journal_mode").fetchone()[0]
    sync = q._getter.execute("PRAGMA synchronous").fetchone()[0]
    if (mode, sync) != ("wal", 2):
        raise SystemExit(f"persist-queue is not at equal durability: {mode}, synchronous={sync}")

    def run(jobs: int) -> None:
        for _ in range(jobs):
            q.put(REQUEST)
            item = q.get(block=False)
            q.ack(item)

    return run, f"journal_mode={mode}, synchronous={sync} (FULL)"


def litequeue_lifecycle(base: Path) -> tuple[Run, str]:
    from litequeue import LiteQueue

    q = LiteQueue(str(base / "litequeue.db"))
    q.conn.execute("PRAGMA synchronous = FULL;")  # its default NORMAL does not sync each commit
    mode = q.conn.execute("PRAGMA journal_mode").fetchone()[0]
    sync = q.conn.execute("PRAGMA synchronous").fetchone()[0]
    payload = json.dumps(REQUEST)

    def run(jobs: int) -> None:
        for _ in range(jobs):
            q.put(payload)
            message = q.pop()
            q.done(message.message_id)

    return run, f"journal_mode={mode}, synchronous={sync} (FULL)"


def dirq_lifecycle(base: Path) -> tuple[Run, str]:
    from dirq.QueueSimple import QueueSimple

    q = QueueSimple(str(base / "dirq"))
    payload = json.dumps(REQUEST)

    def run(jobs: int) -> None:
        for _ in range(jobs):
            name = q.add(payload)
            assert q.lock(name)
            q.get(name)
            q.remove(name)

    return run, "no fsync at all (non-durable upper bound)"


def rates_in_turns(
    contenders: dict[str, tuple[Run, int]], base: Path, rounds: int
) -> tuple[dict[str, float], tuple[float, float, float, float]]:
    """Items per second of each contender (``run``, items per turn), and the median latencies
    of the probes sampled between the turns: create, file fsync, directory fsync, a directory
    made and removed."""
    seconds = dict.fromkeys(contenders, 0.0)
    samples = Latencies([], [], [], [])
    for _ in range(rounds):
        for kind, taken in zip(samples, fsync_latencies(base, 20), strict=True):
            kind += taken
        for name, (run, items) in contenders.items():
            # Each turn starts with nothing dirty on the filesystem: what a contender that never
            # syncs (dirq, the unsynced lifecycle) leaves behind would otherwise be written out
            # by the next one's barrier (a group commit's syncfs flushes the whole filesystem).
            os.sync()
            seconds[name] += timed(lambda run=run, items=items: run(items))
    rates = {name: contenders[name][1] * rounds / took for name, took in seconds.items()}
    t_create, t_file, t_dir, t_directory = (statistics.median(kind) for kind in samples)
    return rates, (t_create, t_file, t_dir, t_directory)


# ------------------------------------------------------------------------ (d) Q-10


class CpuTimed:
    """A :data:`Run` that adds up the user and system CPU time of its calls."""

    def __init__(self, run: Run) -> None:
        self.run, self.user, self.system = run, 0.0, 0.0

    def __call__(self, items: int) -> object:
        before = os.times()
        try:
            return self.run(items)
        finally:
            after = os.times()
            self.user += after.user - before.user
            self.system += after.system - before.system


class UnsyncedOps(FsOps):
    """Real operations with every fsync left out: what a claim costs apart from the disk's
    barriers, which is the part Q-10 speaks of (a listing and a sort grow with the queue;
    a barrier does not)."""

    def fsync(self, fd: int) -> None:
        pass


class ClaimCost(NamedTuple):
    first_ms: float  # the first claim of a fresh process, which scans pending/ once
    mean_ms: float  # mean over every claim, the first included
    steady_ms: float  # mean over the claims after the first


def claim_costs(
    base: Path, holder: Holder, sizes: tuple[int, ...], claims: int, rounds: int, ops: FsOps
) -> dict[int, ClaimCost]:
    """Claims from queues of each size in ``sizes``, in turns (``rounds``), so that a drift of
    the disk's speed during the run falls on every size alike."""
    paths = {}
    for pending in sizes:
        paths[pending] = path = base / f"scale-{pending}"
        shutil.rmtree(path, ignore_errors=True)
        init_queue(path)
        with Queue.open(path) as q:
            chunk = 20_000
            for start in range(0, pending, chunk):
                publish_batch(q, [REQUEST] * min(chunk, pending - start))
    queues = {pending: Queue.open(path, ops) for pending, path in paths.items()}
    try:
        first = {n: timed(lambda q=q: claim(q, holder)) for n, q in queues.items()}
        rest = dict.fromkeys(sizes, 0.0)
        per_round = max(1, (claims - 1) // rounds)
        for _ in range(rounds):
            for pending, q in queues.items():
                rest[pending] += timed(lambda q=q: [claim(q, holder) for _ in range(per_round)])
    finally:
        for q in queues.values():
            q.close()
        for path in paths.values():
            shutil.rmtree(path)
    steady_claims = per_round * rounds
    return {
        n: ClaimCost(
            first[n] * 1e3,
            (first[n] + rest[n]) / (steady_claims + 1) * 1e3,
            rest[n] / steady_claims * 1e3,
        )
        for n in sizes
    }


# ------------------------------------------------------------------------------ report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300, help="jobs per lifecycle measurement")
    parser.add_argument(
        "--rounds", type=int, default=10, help="turns the contenders take (--jobs split among them)"
    )
    parser.add_argument("--big", type=int, default=100_000, help="pending jobs for the Q-10 run")
    parser.add_argument("--claims", type=int, default=1000, help="claims timed per Q-10 run")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to measure (default: /var/tmp)"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args()

    # What earlier work left the kernel to write (a previous run's 100 000-entry queue, removed
    # at its end) is written first, or every contender of this run would pay for it in turn.
    os.sync()
    base = Path(tempfile.mkdtemp(prefix="cortexfs-bench-", dir=args.dir or "/var/tmp"))
    holder = Holder.for_process(worker="bench")
    per_turn = max(1, args.jobs // args.rounds)
    try:
        per_job, barriers = fsyncs_per_job(base, holder)
        pq_run, pq_mode = persist_queue_lifecycle(base)
        lq_run, lq_mode = litequeue_lifecycle(base)
        dq_run, dq_mode = dirq_lifecycle(base)
        with (
            fresh_queue(base, "lifecycle") as lifecycle_q,
            fresh_queue(base, "unsynced", UnsyncedOps()) as unsynced_q,
            fresh_queue(base, "single") as single_q,
            fresh_queue(base, "batch") as batch_q,
        ):
            unsynced = CpuTimed(our_lifecycle(unsynced_q, holder))
            rates, (t_create, t_file, t_dir, t_directory) = rates_in_turns(
                {
                    "ours": (our_lifecycle(lifecycle_q, holder), per_turn),
                    "unsynced": (unsynced, per_turn),
                    "persist_queue": (pq_run, per_turn),
                    "litequeue": (lq_run, per_turn),
                    "dirq": (dq_run, per_turn),
                    "single": (single_publish(single_q), per_turn),
                    "batch": (batch_publish(batch_q), args.jobs),  # one batch of --jobs a turn
                },
                base,
                args.rounds,
            )
        # The 1 000-job queue must not run dry: at most 900 claims from each.
        sizes, claims = (1000, args.big), min(args.claims, 900)
        durable_claims = claim_costs(base, holder, sizes, claims, args.rounds, FsOps())
        unsynced_claims = claim_costs(base, holder, sizes, claims, args.rounds, UnsyncedOps())
    finally:
        shutil.rmtree(base, ignore_errors=True)
    floor_seconds = per_job["file_fsync"] * t_file + per_job["dir_fsync"] * t_dir
    floor = 1 / floor_seconds
    # The least any design can pay that keeps a job's request, lease and result in files of
    # their own and acknowledges publish, claim and finish only once each is durable: per
    # step one file fsync (the data before its name) and one directory fsync (the name), and
    # that only where the filesystem persists metadata in order, so that one barrier covers
    # every rename before it.  SQLite in WAL mode pays one fsync per commit, three per job.
    least = 1 / (3 * t_file + 3 * t_dir)
    ours, single, batch = rates["ours"], rates["single"], rates["batch"]
    # What the protocol costs besides its barriers: the same lifecycle with every fsync left
    # out (the creates, mkdirs, renames and removals the layout of Q-1..Q-4 requires, and our
    # Python), split into user and system CPU.  The floor plus that is what the lifecycle
    # could reach if no barrier overlapped any other work.
    unsynced_job = 1 / rates["unsynced"]
    cpu_jobs = per_turn * args.rounds
    user_us, system_us = unsynced.user / cpu_jobs * 1e6, unsynced.system / cpu_jobs * 1e6
    with_metadata = 1 / (floor_seconds + unsynced_job)
    pq, lq, dq = rates["persist_queue"], rates["litequeue"], rates["dirq"]

    figures = {
        "file_create_us": t_create * 1e6,
        "creates_per_job": per_job["create"],
        "directory_made_and_removed_us": t_directory * 1e6,
        "directories_per_job": per_job["mkdir"],
        "file_fsync_us": t_file * 1e6,
        "dir_fsync_us": t_dir * 1e6,
        "fsyncs_per_job": {k: n for k, n in per_job.items() if k not in ("create", "mkdir")},
        "barriers_us": [[what, took * 1e6] for what, took in barriers],
        "floor_jobs_per_s": floor,
        "least_file_per_state_jobs_per_s": least,
        "least_file_per_state_vs_persist_queue": least / pq,
        "lifecycle_jobs_per_s": ours,
        "lifecycle_vs_floor": ours / floor,
        "unsynced_lifecycle_us": unsynced_job * 1e6,
        "unsynced_user_cpu_us": user_us,
        "unsynced_system_cpu_us": system_us,
        "floor_with_metadata_jobs_per_s": with_metadata,
        "lifecycle_vs_floor_with_metadata": ours / with_metadata,
        "persist_queue_jobs_per_s": pq,
        "lifecycle_vs_persist_queue": ours / pq,
        "litequeue_jobs_per_s": lq,
        "lifecycle_vs_litequeue": ours / lq,
        "dirq_jobs_per_s": dq,
        "lifecycle_vs_dirq": ours / dq,
        "single_publish_per_s": single,
        "batch_publish_per_s": batch,
        "batch_vs_single_publish": batch / single,
        "claims_per_size": claims,
        "claim_ms": {
            "durable": {str(n): cost._asdict() for n, cost in durable_claims.items()},
            "without_fsync": {str(n): cost._asdict() for n, cost in unsynced_claims.items()},
        },
        "claim_big_vs_1k": {
            "durable_mean": durable_claims[args.big].mean_ms / durable_claims[1000].mean_ms,
            "durable_steady": durable_claims[args.big].steady_ms / durable_claims[1000].steady_ms,
            "without_fsync_mean": unsynced_claims[args.big].mean_ms / unsynced_claims[1000].mean_ms,
        },
        "big": args.big,
        "jobs": args.jobs,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(
        f"queue lifecycle benchmark, {per_turn * args.rounds} jobs per contender in "
        f"{args.rounds} turns, on {args.dir or '/var/tmp'}"
    )
    print(f"  fsync latency: file {t_file * 1e6:.0f} us, directory {t_dir * 1e6:.0f} us")
    print(f"  creating a small file (no fsync): {t_create * 1e6:.0f} us; the lifecycle creates "
          f"{per_job['create']} entries a job, batch publish one")  # fmt: skip
    directories_us = per_job["mkdir"] * t_directory * 1e6
    print(f"  making and removing a directory (no fsync): {t_directory * 1e6:.0f} us; the "
          f"lifecycle makes and removes {per_job['mkdir']} a job (claimed/J, lease/J): "
          f"{directories_us:.0f} us of the fsync-free lifecycle below")  # fmt: skip
    if t_create > SLOW_CREATE:
        # Not a cost of the protocol: the same creates take tens of microseconds elsewhere.
        print(f"  NOTE: creating a file here costs {t_create / SLOW_CREATE:.0f} x the "
              f"{SLOW_CREATE * 1e6:.0f} us a filesystem usually takes; every figure that creates "
              "files (the lifecycle, publish) is slowed by it and the SQLite peers are not.  "
              "Measure elsewhere too (--dir).")  # fmt: skip
    print(f"  fsyncs per job (publish+claim+lease+finish): {per_job['file_fsync']} file, "
          f"{per_job['dir_fsync']} directory")  # fmt: skip
    # No barrier is free: each fsync waits for a device cache flush, even one whose journal
    # transaction an earlier fsync already committed.
    print("  each barrier of one lifecycle, in order (median latency):")
    for step, (what, took) in enumerate(barriers, 1):
        print(f"    {step:2} {what:<44}{took * 1e6:6.0f} us")
    print(f"    sum {sum(took for _, took in barriers) * 1e6:.0f} us per job")
    rows = [
        ("(a) fsync floor of this disk", floor, "1.00"),
        ("(b) cortexfs lifecycle", ours, f"{ours / floor:.2f} x floor"),
        (
            "    the same, every fsync left out",
            rates["unsynced"],
            f"{unsynced_job * 1e6:.0f} us/job: {user_us:.0f} us user CPU, "
            f"{system_us:.0f} us system CPU",
        ),
        ("    floor + that", with_metadata, f"ours {ours / with_metadata:.2f} x"),
        ("(c) persist-queue SQLiteAckQueue", pq, f"ours {ours / pq:.2f} x  [{pq_mode}]"),
        ("    least any file-per-state design", least, f"{least / pq:.2f} x persist-queue"),
        ("(c) litequeue", lq, f"ours {ours / lq:.2f} x  [{lq_mode}]"),
        ("(c) python-dirq QueueSimple", dq, f"ours {ours / dq:.2f} x  [{dq_mode}]"),
        ("(b) single publish", single, "1.00"),
        ("(b) batch publish", batch, f"{batch / single:.1f} x single"),
    ]
    print(f"  {'':<36}{'jobs/s':>10}   ratio")
    for label, rate, ratio in rows:
        print(f"  {label:<36}{rate:>10.0f}   {ratio}")
    print(f"  (d) claim at 1 000 vs {args.big:,} pending, {claims} claims from each in turns:")
    for label, costs in (("durable", durable_claims), ("without fsync", unsynced_claims)):
        small, big = costs[1000], costs[args.big]
        print(f"      {label:<14} first {small.first_ms:7.2f} vs {big.first_ms:7.2f} ms, "
              f"mean {small.mean_ms:.3f} vs {big.mean_ms:.3f} ms = "
              f"{big.mean_ms / small.mean_ms:.2f} x, "
              f"steady {small.steady_ms:.3f} vs {big.steady_ms:.3f} ms = "
              f"{big.steady_ms / small.steady_ms:.2f} x")  # fmt: skip
    print(f"  command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
