"""Eight workers, random SIGKILLs and restarts: every job ends exactly once (W-3, I-3, I-4).

Each job's tool appends its number and start time to a log before doing anything else.  The
oracle: every published job has exactly one terminal pair, and no execution started after the
job's result was written.  The default suite runs a slice; ``-m slow`` runs 8 x 1000.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time

import pytest

from cortexfs.timefmt import parse_rfc3339
from tests.workers.conftest import PROJECT, Farm


def run_fuzz(farm: Farm, jobs: int, workers: int, seed: int) -> dict[str, int]:
    rng = random.Random(seed)
    log = farm.scratch / "logs" / "starts.log"
    batch = "".join(
        json.dumps(
            {
                "tool": "shell.exec",
                "input": {"cmd": f"echo {n} $(date +%s.%N) >> {log}; sleep 0.0{n % 5}; echo {n}"},
            }
        )
        + "\n"
        for n in range(jobs)
    )
    published = farm.ctx("queue", "publish", "--project", PROJECT, "--batch", "-", stdin=batch)
    names = published.stdout.split()
    assert len(names) == jobs

    def terminal_count() -> int:
        return sum(1 for n in os.listdir(farm.queue / "done") if n.endswith(".result")) + sum(
            1 for n in os.listdir(farm.queue / "failed") if n.endswith(".result")
        )

    output = farm.scratch / "workers.log"

    def start() -> subprocess.Popen[str]:
        return farm.worker("--drain", output=output)

    pool: list[subprocess.Popen[str]] = [start() for _ in range(workers)]
    kills, deadline = 0, time.monotonic() + 300
    try:
        while terminal_count() < jobs and time.monotonic() < deadline:
            time.sleep(rng.uniform(0.05, 0.4))
            victim = rng.randrange(len(pool))
            if pool[victim].poll() is None:
                pool[victim].kill()
                kills += 1
            pool[victim].wait()
            pool[victim] = start()
            if rng.random() < 0.3:
                # A kill between claim and lease leaves a claim without lease: --reconcile.
                farm.ctx("queue", "recover", "--project", PROJECT, "--reconcile")
            for n, worker in enumerate(pool):
                if worker.poll() is not None:  # drained early: another may still need help
                    pool[n] = start()
                    farm.ctx("queue", "recover", "--project", PROJECT, "--reconcile")
    finally:
        for worker in pool:
            worker.send_signal(signal.SIGTERM)
        for worker in pool:
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
                pytest.fail(f"a worker ignored SIGTERM for 60 s; its log: {output}")
    final = farm.ctx("queue", "recover", "--project", PROJECT, "--reconcile", "--grace", "0")
    assert final.returncode == 0, final.stdout + final.stderr
    if terminal_count() < jobs:
        drained = farm.ctx("queue", "work", "--project", PROJECT, "--agent", "runner", "--drain")
        assert drained.returncode == 0

    time.sleep(0.5)  # tools orphaned by a killed worker finish their short sleep
    starts: dict[str, list[float]] = {}
    for line in log.read_text().splitlines():
        number, when = line.split()
        starts.setdefault(names[int(number)], []).append(float(when))
    after_ack = lost = 0
    for job in names:
        pairs = []
        for state in ("done", "failed"):
            if (farm.queue / state / job).exists() and (
                farm.queue / state / f"{job}.result"
            ).exists():
                pairs.append(state)
        if len(pairs) != 1:
            lost += 1
            continue
        result = json.loads((farm.queue / pairs[0] / f"{job}.result").read_text())
        finished = parse_rfc3339(result["finished"])
        after_ack += sum(1 for t in starts.get(job, []) if t > finished)
    for state in ("pending", "claimed", "lease"):
        assert os.listdir(farm.queue / state) == []
    return {
        "kills": kills,
        "lost": lost,
        "after_ack": after_ack,
        "reruns": sum(len(t) - 1 for t in starts.values()),
    }


def test_workers_killed_at_random_finish_every_job_exactly_once(farm: Farm) -> None:
    seed = int(os.environ.get("CORTEXFS_FUZZ_SEED", time.time_ns() % 100_000))
    print(f"kill fuzz seed {seed}")
    outcome = run_fuzz(farm, jobs=120, workers=8, seed=seed)
    print(f"kill fuzz: {outcome}")
    assert outcome["kills"] > 0
    assert (outcome["lost"], outcome["after_ack"]) == (0, 0), outcome


@pytest.mark.slow
def test_eight_workers_and_1000_jobs_under_random_kills(farm: Farm) -> None:
    seed = int(os.environ.get("CORTEXFS_FUZZ_SEED", time.time_ns() % 100_000))
    print(f"kill fuzz seed {seed}")
    outcome = run_fuzz(farm, jobs=1000, workers=8, seed=seed)
    print(f"kill fuzz: {outcome}")
    assert (outcome["lost"], outcome["after_ack"]) == (0, 0), outcome
