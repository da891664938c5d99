"""A worker draining the queue names the jobs it left pending, and why (W-2, Q-6).

`--drain` stops when nothing can be claimed; jobs held by a crash's leftover claim or by a
conflict stay pending.  The worker still exits 0, and says which and why on stderr, and in
the `left_pending` of its `stop` event, so that "drained" is never mistaken for "empty".
"""

from __future__ import annotations

import json

from tests.workers.conftest import AGENT, PROJECT, Farm


def test_a_drained_worker_names_the_jobs_a_leftover_claim_and_a_conflict_hold(
    farm: Farm,
) -> None:
    runs = farm.publish("fs.stat", {"path": str(farm.scratch)})
    held = farm.publish("fs.stat", {"path": str(farm.scratch)})
    twice = farm.publish("fs.stat", {"path": str(farm.scratch)})
    (farm.queue / "claimed" / held).mkdir()  # a claim cut short after its mkdir
    (farm.queue / "done" / twice).write_text((farm.queue / "pending" / twice).read_text())
    done = farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain", "--json")
    assert done.returncode == 0, done.stderr
    assert farm.result(runs)[0] == "done"
    stop = json.loads(done.stdout.splitlines()[-1])
    assert stop["event"] == "stop"
    assert stop["left_pending"] == {held: "claimed", twice: "finished"}
    assert f"left pending, with claimed/J there already: {held}" in done.stderr
    assert f"a conflict: {twice}" in done.stderr


def test_a_worker_that_drained_the_queue_empty_says_nothing_more(farm: Farm) -> None:
    farm.publish("fs.stat", {"path": str(farm.scratch)})
    done = farm.ctx(
        "queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain", "--concurrency", "4"
    )
    assert done.returncode == 0, done.stderr
    assert "left pending" not in done.stderr
    stop = farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain", "--json")
    assert json.loads(stop.stdout.splitlines()[-1])["left_pending"] == {}
