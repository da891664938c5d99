"""§2 Q-10: the cost of one claim does not grow linearly with the number of pending jobs, and a
queue of 100 000 pending jobs stays usable.  Slow: run with ``-m slow``."""

from __future__ import annotations

import json
import resource
import time

import pytest

from tests.acceptance.ctxcli import QueueCLI, request

BIG = 100_000


def claim_cost(queue: QueueCLI) -> tuple[float, float]:
    """CPU seconds (user + system) and wall seconds of one ``ctx queue claim``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    queue.claim()
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


@pytest.mark.slow
def test_one_claim_costs_about_the_same_with_100000_pending_jobs(storage, tmp_path):
    """Q-10: no full listdir + sort per claim: one claim from a queue of 100 000 published jobs
    costs (in CPU time) no more than a quarter of a second above a claim from a tiny queue.

    # reading: "one claim" is one ``ctx queue claim`` command, the unit a user runs.
    """
    small, big = QueueCLI(storage, "proj"), QueueCLI(storage, "big")
    assert big.run("init").rc == 0
    batch = tmp_path / "big.jsonl"
    batch.write_text("".join(json.dumps(request(n=i)) + "\n" for i in range(BIG)))
    assert big.run("publish", "--batch", batch, timeout=600).rc == 0
    for i in range(3):
        small.drop(f"s{i}")

    base = min(claim_cost(small)[0] for _ in range(3))
    cpu, wall = min(claim_cost(big) for _ in range(3))
    assert wall < 10, "a queue of 100 000 pending jobs stays usable"
    assert cpu < base + 0.25, (base, cpu)
