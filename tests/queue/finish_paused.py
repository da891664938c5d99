"""A worker process that claims one job and stops in the middle of its finish.

Usage: python -m tests.queue.finish_paused QUEUE_DIR STEP
The process claims the next job (it is the lease holder, alive), starts finishing it, and at
the protocol step STEP (``finish.request``: the result is in place, the request still claimed;
``finish.cleanup``: the request has moved, the lease and ``claimed/J`` are left) prints the
job's name and waits for a line on stdin before it completes the finish.  Meanwhile it holds
``claimed/J``'s lock, as every finish does.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from cortexfs.durable import FsOps
from cortexfs.queue import Holder, Queue, claim, finish


class PausingOps(FsOps):
    """Real operations that stop at one protocol step until told to go on."""

    def __init__(self, pause_at: str) -> None:
        super().__init__()
        self.pause_at = pause_at
        self.job = ""

    def step(self, name: str) -> None:
        if name == self.pause_at:
            print(self.job, flush=True)
            sys.stdin.readline()


def main(queue_dir: Path, pause_at: str) -> None:
    ops = PausingOps(pause_at)
    with Queue.open(queue_dir, ops) as queue:
        won = claim(queue, Holder.for_process(worker=f"paused-{os.getpid()}"))
        assert won is not None, "nothing to claim"
        ops.job = won.job
        finish(queue, won.job, True, {"by": os.getpid()})


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
