"""Many processes racing for the same jobs: each job is claimed exactly once (Q-2, I-4)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from cortexfs.queue import Queue, publish_batch
from tests.queue.helpers import request

REPO = Path(__file__).resolve().parents[2]


def test_eight_processes_claim_2000_jobs_each_exactly_once(
    queue: Queue, queue_dir: Path, tmp_path: Path
) -> None:
    jobs = set(publish_batch(queue, [request(n) for n in range(2000)]))
    log = tmp_path / "claims.log"
    racers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.queue.claim_loop", str(queue_dir), str(log)], cwd=REPO
        )
        for _ in range(8)
    ]
    assert [r.wait(timeout=600) for r in racers] == [0] * 8
    claims = Counter(log.read_text().split())
    assert set(claims) == jobs
    assert max(claims.values()) == 1
    done = os.listdir(queue_dir / "done")
    assert len(done) == 4000 and {n for n in done if not n.endswith(".result")} == jobs
    for state in ("pending", "claimed", "lease", "inbox"):
        assert os.listdir(queue_dir / state) == []
