"""Every crash state of every workload, judged with the real recover (docs/crash-model.md §2-§4).

Exhaustive per workload under the configurations that must be clean — atomic rename with
the rename strategy, pessimistic rename with the link strategy (what the product picks where
rename is not atomic) and kill -9 with either — plus the demonstration that the rename
strategy does lose jobs where rename is not atomic.  Crowded crash points are sampled from
the seed in ``CTX_CRASH_SEED`` (default below), which the result table prints.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from cortexfs.durable import MOVE_LINK, MOVE_RENAME
from cortexfs.queue import Holder
from tests.crash.harness import Outcome, explore
from tests.crash.persistence import Mode
from tests.crash.workloads import Workload, crowded_workloads, workloads

SEED = int(os.environ.get("CTX_CRASH_SEED", "20260622"))
TARGETS = [
    (Mode.ATOMIC, MOVE_RENAME),
    (Mode.PESSIMISTIC, MOVE_LINK),
    (Mode.PROCESS, MOVE_RENAME),
    (Mode.PROCESS, MOVE_LINK),
]
ALL = workloads()
LIVE_SLICE = ("claim + lease", "renew", "lifecycle", "recover --reconcile")


def by_name(names: tuple[str, ...]) -> list[Workload]:
    return [w for w in ALL if w.name in names]


def run(
    workload: Workload,
    mode: Mode,
    strategy: str,
    holder: Holder,
    drainer: Holder,
    table: Callable[..., None],
    **options: Any,
) -> Outcome:
    outcome = explore(workload, mode, strategy, holder, drainer, seed=SEED, **options)
    rows = [w.row for w in ALL]
    table(
        "states",
        workload=workload.row,
        order=rows.index(workload.row) if workload.row in rows else len(rows),
        config=f"{mode}/{strategy}",
        states=outcome.states,
        violations=len(outcome.violations),
        sampled=outcome.sampled_points,
        seed=SEED,
    )
    assert outcome.states > 0, "no crash state was explored"
    return outcome


def failures(outcome: Outcome) -> str:
    shown = "\n".join(outcome.violations[:15])
    return f"{len(outcome.violations)} violations (seed {SEED}):\n{shown}"


@pytest.mark.parametrize(("mode", "strategy"), TARGETS, ids=[f"{m}-{s}" for m, s in TARGETS])
@pytest.mark.parametrize("workload", ALL, ids=[w.name for w in ALL])
def test_no_crash_state_breaks_an_invariant(workload, mode, strategy, dead_holder, drainer, table):
    outcome = run(workload, mode, strategy, dead_holder, drainer, table)
    assert not outcome.violations, failures(outcome)


@pytest.mark.slow
@pytest.mark.parametrize(("mode", "strategy"), TARGETS[:2], ids=["atomic", "pessimistic"])
@pytest.mark.parametrize("workload", crowded_workloads(), ids=lambda w: w.name)
def test_crowded_crash_points_are_sampled_and_hold(
    workload, mode, strategy, dead_holder, drainer, table
):
    outcome = run(workload, mode, strategy, dead_holder, drainer, table, limit=512)
    assert outcome.sampled_points > 0, "this workload is meant to exceed the exhaustive limit"
    assert not outcome.violations, failures(outcome)


def test_the_rename_strategy_loses_jobs_where_rename_is_not_atomic(dead_holder, drainer, table):
    (claim,) = by_name(("claim + lease",))
    outcome = run(claim, Mode.PESSIMISTIC, MOVE_RENAME, dead_holder, drainer, table)
    assert any("has no request left anywhere" in v for v in outcome.violations), failures(outcome)


@pytest.mark.slow
@pytest.mark.parametrize("workload", ALL, ids=[w.name for w in ALL])
def test_the_rename_strategy_where_rename_is_not_atomic(workload, dead_holder, drainer, table):
    """Not a target: the table shows how unsafe it is, workload by workload."""
    run(workload, Mode.PESSIMISTIC, MOVE_RENAME, dead_holder, drainer, table)


@pytest.mark.parametrize(
    "workload",
    [
        w if w.name in LIVE_SLICE else pytest.param(w, marks=pytest.mark.slow)
        for w in ALL
        if not w.without_flock
    ],
    ids=lambda w: w.name,
)
def test_recover_never_touches_the_job_of_a_live_holder(workload, live_holder, drainer):
    outcome = explore(
        workload, Mode.ATOMIC, MOVE_RENAME, live_holder, drainer, seed=SEED, holder_alive=True
    )
    assert outcome.states > 0
    assert not outcome.violations, failures(outcome)
