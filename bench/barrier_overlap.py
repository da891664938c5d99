"""Two ways to hide a lifecycle's time behind its barriers, measured against the protocol as it is.

The lifecycle costs more than its fsync floor (``bench/queue_lifecycle.py``): besides the
barriers, the entries it creates and removes cost system time, most of it right after a
barrier.  Two ways to overlap that time are measured here, each against the way the protocol
works, in turns on one filesystem:

(a) **two barriers at once** — a rename changes two directories, and ``move_noreplace`` syncs
    the destination, then the source.  Neither sync depends on the other, so a second thread
    could issue one while the caller issues the other; the figure is the pair's latency at
    once against in turn.
(b) **teardown off the caller's path** — ``finish`` removes ``lease/J/worker``, ``lease/J`` and
    ``claimed/J``; the filesystem frees an inode at its last close (or at the unlink of a file
    nobody holds open).  Here a helper thread makes those last closes, so that the freeing
    could overlap the next barrier; the figure is the whole lifecycle against the real one.

A ratio under 1.00 would be time saved.  Neither is, on the ext4 of the development VM
(docs/queue.md, "Performance"): each directory fsync forces a journal commit of its own,
and the freeing of an inode joins the transaction the next barrier commits either way.

Usage: python bench/barrier_overlap.py [--pairs N] [--jobs N] [--rounds N] [--dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from cortexfs.durable import FsOps
from cortexfs.queue import Holder, Queue, claim, finish, init_queue, publish
from cortexfs.queue.layout import LEASE_FILE

REQUEST = {"tool": "fs.stat", "input": {"path": "/srv/data/report.csv"}}


class Helper(threading.Thread):
    """A thread that runs what it is handed, in order; ``wait`` returns once it has run one
    more action (one thread for each measurement, so that no release is left over)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.work: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self.idle = threading.Semaphore(0)
        self.start()

    def run(self) -> None:
        while True:
            self.work.get()()
            self.idle.release()

    def hand(self, action: Callable[[], object]) -> None:
        self.work.put(action)

    def wait(self) -> None:
        self.idle.acquire()


# ------------------------------------------------------------------ (a) two barriers at once


def barrier_pairs(base: Path, pairs: int, helper: Helper) -> dict[str, float]:
    """Median seconds of the two directory fsyncs after a rename from ``a/`` to ``b/``: in
    turn, and at once (the destination's on the helper thread)."""
    a, b = base / "a", base / "b"
    a.mkdir()
    b.mkdir()
    a_fd = os.open(a, os.O_RDONLY | os.O_DIRECTORY)
    b_fd = os.open(b, os.O_RDONLY | os.O_DIRECTORY)
    took: dict[str, list[float]] = {"in turn": [], "at once": []}
    try:
        for n in range(pairs * 2):
            os.close(os.open(f"x{n}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=a_fd))
            os.fsync(a_fd)
            os.rename(f"x{n}", f"x{n}", src_dir_fd=a_fd, dst_dir_fd=b_fd)
            start = time.perf_counter()
            if n % 2:
                helper.hand(lambda: os.fsync(b_fd))
                os.fsync(a_fd)
                helper.wait()
            else:
                os.fsync(b_fd)
                os.fsync(a_fd)
            took["at once" if n % 2 else "in turn"].append(time.perf_counter() - start)
    finally:
        os.close(a_fd)
        os.close(b_fd)
    return {how: statistics.median(times) for how, times in took.items()}


# ---------------------------------------------------------- (b) teardown off the caller's path


class TeardownOffPath(FsOps):
    """The real operations, but every close is made by the helper thread, and the lease file
    is held open across its unlink so that its inode, too, is freed there."""

    def __init__(self, helper: Helper) -> None:
        super().__init__()
        self.helper = helper

    def close(self, fd: int) -> None:
        self.helper.hand(lambda: os.close(fd))

    def unlink(self, name: str, dir_fd: int) -> None:
        held = None
        if name == LEASE_FILE:
            held = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        super().unlink(name, dir_fd)
        if held is not None:
            self.close(held)


def lifecycles(q: Queue, holder: Holder, jobs: int) -> None:
    for _ in range(jobs):
        publish(q, REQUEST)
        won = claim(q, holder)
        assert won is not None
        finish(q, won.job, True, {"size": 1})


def lifecycle_seconds(base: Path, jobs: int, rounds: int, helper: Helper) -> dict[str, float]:
    """Seconds per lifecycle, the protocol as it is and with its teardown on the helper,
    taking turns (``jobs`` per turn, ``rounds`` turns each)."""
    holder = Holder.for_process(worker="bench")
    queues = {}
    for name, ops in (("as it is", None), ("teardown off path", TeardownOffPath(helper))):
        init_queue(base / name.replace(" ", "-"))
        queues[name] = Queue.open(base / name.replace(" ", "-"), ops)
    took = dict.fromkeys(queues, 0.0)
    try:
        for q in queues.values():
            lifecycles(q, holder, jobs)  # warm up: imports, the claim order, the first inodes
        for _ in range(rounds):
            for name, q in queues.items():
                os.sync()
                start = time.perf_counter()
                lifecycles(q, holder, jobs)
                took[name] += time.perf_counter() - start
    finally:
        for q in queues.values():
            q.close()
    return {name: seconds / (jobs * rounds) for name, seconds in took.items()}


# ------------------------------------------------------------------------------ report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=300, help="barrier pairs timed each way")
    parser.add_argument("--jobs", type=int, default=30, help="lifecycles per turn")
    parser.add_argument("--rounds", type=int, default=20, help="turns each way")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to measure (default: /var/tmp)"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="cortexfs-bench-", dir=args.dir or "/var/tmp"))
    try:
        pairs = barrier_pairs(base, args.pairs, Helper())
        lifecycle = lifecycle_seconds(base, args.jobs, args.rounds, Helper())
    finally:
        shutil.rmtree(base, ignore_errors=True)
    figures = {
        "pair_in_turn_us": pairs["in turn"] * 1e6,
        "pair_at_once_us": pairs["at once"] * 1e6,
        "pair_at_once_vs_in_turn": pairs["at once"] / pairs["in turn"],
        "lifecycle_us": lifecycle["as it is"] * 1e6,
        "lifecycle_teardown_off_path_us": lifecycle["teardown off path"] * 1e6,
        "teardown_off_path_vs_as_it_is": lifecycle["teardown off path"] / lifecycle["as it is"],
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"barrier overlap, on {args.dir or '/var/tmp'} (under 1.00 would be time saved)")
    print(
        f"  (a) two directory fsyncs of one rename: in turn {figures['pair_in_turn_us']:.0f} us, "
        f"at once {figures['pair_at_once_us']:.0f} us = "
        f"{figures['pair_at_once_vs_in_turn']:.2f} x"
    )
    print(
        f"  (b) lifecycle: as it is {figures['lifecycle_us']:.0f} us, teardown off the caller's "
        f"path {figures['lifecycle_teardown_off_path_us']:.0f} us = "
        f"{figures['teardown_off_path_vs_as_it_is']:.2f} x"
    )
    print(f"  command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
