"""Disable one sync or one no-replace guard at a time: the harness must notice
(docs/crash-model.md §5).  The kill ratio is in the result table; every survivor is a guard
that cannot fire, or a sync Q-7's letter asks for that no crash state tells from its absence,
named with its reason in :data:`tests.crash.mutants.JUSTIFIED`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cortexfs.queue
from tests.crash.mutants import SYNC_KINDS, Mutant, Verdict, discover, hunt
from tests.crash.workloads import workloads

DURABILITY_CALLS = {
    "write_file_synced",
    "move_noreplace",
    "move_noreplace_batch",
    "replace_synced",
    "sync_dir",
    "sync_dirs",
    "sync_filesystem",
    "make_dir_synced",
}
# The modules of the protocol's verbs and of recover: every durability call in them is checked.
PROTOCOL_MODULES = ("publishing", "claiming", "leasing", "finishing", "transition", "recovery")
# Protocol calls of those primitives that no workload reaches, each with the reason.
UNREACHED = {
    ("claiming.claim_job", "move_noreplace"): (
        "puts a claimed request back when it is not a regular file: only something swapped "
        "into pending/ between claim's check and its move (Q-8) gets there; no crash does"
    ),
    ("claiming._taken_back_meanwhile", "sync_dir"): (
        "withdraws the lease of a claim that a recover took back, on a filesystem without "
        "flock, once the claim was stalled past a lease lifetime: a race of two live "
        "processes, which no crash point stages (tests/queue/test_claim_without_flock.py does)"
    ),
}


@pytest.fixture(scope="module")
def reached(dead_holder):
    return discover(workloads(), dead_holder)


def record(table, verdict: Verdict) -> None:
    mutant = verdict.mutant
    table(
        "mutants",
        kind="sync" if mutant.kind in SYNC_KINDS else "guard",
        site=mutant.site,
        killed=verdict.killed,
        justified=mutant.justification,
    )


def durability_calls() -> list[tuple[str, str, int]]:
    """(module.function, primitive, line) of every durability call in the protocol."""
    calls = []
    for module in PROTOCOL_MODULES:
        source = Path(cortexfs.queue.__file__).with_name(f"{module}.py").read_text()
        for function in ast.walk(ast.parse(source)):
            if not isinstance(function, ast.FunctionDef):
                continue
            for node in ast.walk(function):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "durable"
                    and node.func.attr in DURABILITY_CALLS
                ):
                    calls.append((f"{module}.{function.name}", node.func.attr, node.lineno))
    return calls


def test_every_durability_call_of_the_protocol_is_exercised(reached):
    callers = {m.site.split(" @ ", 1)[1].split(" > ", 1)[0] for m in reached}
    missing = [
        f"{caller}:{line} ({primitive})"
        for caller, primitive, line in durability_calls()
        if f"{caller}:{line}" not in callers and (caller, primitive) not in UNREACHED
    ]
    assert not missing, f"no workload reaches {missing}: the mutation check cannot see them"


def test_every_mutant_without_a_justification_is_killed(reached, dead_holder, drainer, table):
    survivors = []
    for mutant, where in sorted(reached.items(), key=lambda kv: kv[0].site):
        if mutant.justification is not None:
            continue
        verdict = hunt(mutant, where, dead_holder, drainer, limit=256)
        record(table, verdict)
        if not verdict.killed:
            survivors.append(f"{mutant.site}\n    tried: {verdict.tried}")
    assert not survivors, "mutants the harness does not notice:\n" + "\n".join(survivors)


@pytest.mark.slow
def test_the_justified_guards_are_the_only_survivors(reached, dead_holder, drainer, table):
    """Explored in full: a justified guard that gets killed means the justification is stale."""
    killed: list[Mutant] = []
    for mutant, where in sorted(reached.items(), key=lambda kv: kv[0].site):
        if mutant.justification is None:
            continue
        verdict = hunt(mutant, where, dead_holder, drainer, limit=4096)
        record(table, verdict)
        if verdict.killed:
            killed.append(mutant)
    assert not killed, f"justified but killed (update JUSTIFIED and the doc): {killed}"
