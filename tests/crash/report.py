"""The result table of the crash harness: crash states, mutation check, kill -9 runs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

# Column order: the configurations that must be clean, then the one shown to be unsafe.
CONFIGS = (
    "atomic/rename",
    "pessimistic/link",
    "process/rename",
    "process/link",
    "pessimistic/rename",
)
EXPECTED_UNSAFE = "pessimistic/rename"


def render(sections: dict[str, list[dict[str, Any]]]) -> Iterator[str]:
    if "states" in sections:
        yield from render_states(sections["states"])
    if "mutants" in sections:
        yield from render_mutants(sections["mutants"])
    if "kills" in sections:
        yield from render_kills(sections["kills"])


def render_states(rows: list[dict[str, Any]]) -> Iterator[str]:
    cells: defaultdict[str, dict[str, list[int]]] = defaultdict(dict)
    order = sorted(
        {r["workload"] for r in rows},
        key=lambda w: min(r["order"] for r in rows if r["workload"] == w),
    )
    sampled: list[str] = []
    for row in rows:
        cell = cells[row["workload"]].setdefault(row["config"], [0, 0])
        cell[0] += row["states"]
        cell[1] += row["violations"]
        if row["sampled"]:
            sampled.append(f"{row['workload']} [{row['config']}] seed {row['seed']}")
    configs = [c for c in CONFIGS if any(c in by_config for by_config in cells.values())]
    yield "crash states checked / invariant violations, per workload and model/strategy"
    yield "  " + f"{'workload':<26}" + "".join(f"{c:>20}" for c in configs)
    totals = {c: [0, 0] for c in configs}
    for workload in order:
        line = f"  {workload:<26}"
        for config in configs:
            checked, bad = cells[workload].get(config, (0, 0))
            totals[config][0] += checked
            totals[config][1] += bad
            line += f"{f'{checked} / {bad}' if checked else '-':>20}"
        yield line
    yield (
        "  "
        + f"{'total':<26}"
        + "".join(f"{f'{totals[c][0]} / {totals[c][1]}':>20}" for c in configs)
    )
    if EXPECTED_UNSAFE in configs:
        yield f"  ({EXPECTED_UNSAFE}: rename strategy, rename not atomic: expected unsafe)"
    for line in sampled:
        yield f"  sampled crash points: {line}"


def render_mutants(rows: list[dict[str, Any]]) -> Iterator[str]:
    yield "mutation check: each sync and no-replace guard disabled alone"
    for kind in ("sync", "guard"):
        mine = [r for r in rows if r["kind"] == kind]
        if not mine:
            continue
        killed = sum(r["killed"] for r in mine)
        yield f"  {kind} sites: {killed}/{len(mine)} killed ({100 * killed / len(mine):.0f} %)"
        for r in mine:
            if not r["killed"]:
                yield f"    survivor: {r['site']}"
                yield f"      justified: {r['justified']}"


KILL_COUNTS = ("sigkills", "published", "executions", "reexecutions", "lost", "after_ack")


def render_kills(rows: list[dict[str, Any]]) -> Iterator[str]:
    """One line per kind of run (the step kills of one strategy add up to one line)."""
    runs: defaultdict[str, defaultdict[str, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        for key in KILL_COUNTS:
            runs[r["run"]][key] += r[key]
            runs["total"][key] += r[key]
    yield "kill -9 runs (real processes, then recover --reconcile and a drain)"
    yield (
        f"  {'run':<46}{'SIGKILLs':>9}{'published':>10}{'runs':>7}{'re-runs':>8}"
        f"{'lost':>6}{'run after ack':>14}"
    )
    for name in [*sorted(n for n in runs if n != "total"), "total"]:
        c = runs[name]
        yield (
            f"  {name:<46}{c['sigkills']:>9}{c['published']:>10}{c['executions']:>7}"
            f"{c['reexecutions']:>8}{c['lost']:>6}{c['after_ack']:>14}"
        )
