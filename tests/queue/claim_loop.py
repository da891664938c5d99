"""A worker process for the race tests: claim and finish until the queue is empty.

Usage: python -m tests.queue.claim_loop QUEUE_DIR LOG_FILE
Every claimed job name is appended to LOG_FILE (one line, one write) before it is finished.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from cortexfs.queue import Holder, Queue, claim, finish


def main(queue_dir: Path, log: Path) -> None:
    holder = Holder.for_process(worker=f"racer-{os.getpid()}")
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    with Queue.open(queue_dir) as queue:
        while (won := claim(queue, holder)) is not None:
            os.write(fd, f"{won.job}\n".encode())
            finish(queue, won.job, True, {"by": os.getpid()})
    os.close(fd)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
