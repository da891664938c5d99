"""Run a workload under the recorder, enumerate its crash states, judge every one.

This is the loop the tests, the mutation check and ``make crash`` share: record (on tmpfs,
where fsync is cheap — the model, not the device, decides what survives), explore with
:class:`tests.crash.persistence.Explorer`, judge with :class:`tests.crash.oracle.Oracle`.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

from cortexfs import locks
from cortexfs.queue import Holder, init_queue
from tests.crash.expectations import Expectations
from tests.crash.microops import Ack, Attempt, Executed, Returned, Step
from tests.crash.oracle import Oracle
from tests.crash.persistence import CrashState, Explorer, Mode, Unit
from tests.crash.recorder import Journal, Mutant
from tests.crash.stage import Stage
from tests.crash.workloads import Workload

SCRATCH = Path("/dev/shm") if Path("/dev/shm").is_dir() else None


@contextmanager
def scratch_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cortexfs-crash-", dir=SCRATCH))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


class NoFlock:
    """:mod:`fcntl` as a filesystem without flock on directories shows it: every flock fails
    with ENOLCK, which :func:`cortexfs.queue.layout.lock_dir` reports as taken (N-1).  It
    stands in where the flock is taken, :mod:`cortexfs.locks` (the queue's workloads write
    no event log, whose locks go through it too)."""

    LOCK_SH, LOCK_EX, LOCK_NB = fcntl.LOCK_SH, fcntl.LOCK_EX, fcntl.LOCK_NB

    @staticmethod
    def flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))


@contextmanager
def without_flock() -> Iterator[None]:
    with mock.patch.object(locks, "fcntl", NoFlock()):
        yield


@dataclass
class Outcome:
    """What exploring one workload under one configuration found."""

    workload: str
    row: str
    mode: Mode
    strategy: str
    states: int = 0
    sampled_points: int = 0
    violations: list[str] = field(default_factory=list)


def record(
    workload: Workload,
    strategy: str,
    holder: Holder,
    directory: Path,
    mutant: Mutant | None = None,
    watch_sites: bool = False,
) -> tuple[Stage, list[str]]:
    """Set the workload up, then run it under the recorder; returns the problems of the run
    itself (an unexpected error, a job acknowledged twice or run twice)."""
    stage = Stage(directory / "queue", strategy, holder)
    init_queue(stage.path)
    journal = stage.journal
    problems = []
    with without_flock() if workload.without_flock else nullcontext():
        workload.setup(stage)
        journal.begin()
        journal.mutant, journal.watch_sites = mutant, watch_sites
        try:
            workload.run(stage)
        except Exception as exc:
            problems.append(f"the workload failed: {exc!r}")
        finally:
            journal.mutant = None
    journal.verify_live()
    everything = Expectations.at(journal.records, len(journal.records))
    for job, count in everything.publish_acks.items():
        if count > 1:
            problems.append(f"Q-1: publishing {job} was acknowledged {count} times")
    return stage, problems + executed_twice(journal)


def executed_twice(journal: Journal) -> list[str]:
    """I-4 on the crash-free run: a job runs again only after recover put it back."""
    problems, running = [], set()
    for line in journal.records:
        match line.op:
            case Attempt("recover" | "recover --reconcile"):
                running.clear()
            case Executed(job) if job in running:
                problems.append(f"I-4: {job} was executed twice without a recover between")
            case Executed(job):
                running.add(job)
    return problems


def returns_not_durable(explorer: Explorer, journal: Journal) -> list[str]:
    """Q-7: when a call returns, every entry operation it made is durable."""
    durable = dict(explorer.durable())
    records, problems = journal.records, []
    began: dict[str, int] = {}
    for index in range(journal.start, len(records)):
        actor, op = records[index].actor, records[index].op
        if isinstance(op, Attempt):
            began[actor] = index
        elif isinstance(op, Returned) and actor in began:
            start = began.pop(actor)
            call = records[start].op
            assert isinstance(call, Attempt)
            for unit in explorer.units:
                if (
                    start < unit.index < index
                    and records[unit.index].actor == actor
                    and unit.data_node is None
                    and unit not in durable[index + 1]
                ):
                    problems.append(
                        f"Q-7: {call.what} {call.job} returned before {unit.describe()} "
                        f"({entry_paths(journal, unit)}) was durable"
                    )
    return problems


def entry_paths(journal: Journal, unit: Unit) -> str:
    return ", ".join(f"{journal.generic_path(parent)}{name}" for parent, name in unit.changes)


def explore(
    workload: Workload,
    mode: Mode,
    strategy: str,
    holder: Holder,
    drainer: Holder,
    *,
    limit: int = 4096,
    seed: int = 0,
    mutant: Mutant | None = None,
    first_violation: bool = False,
    holder_alive: bool = False,
) -> Outcome:
    """Every crash state of ``workload`` under ``mode`` and ``strategy``, judged."""
    outcome = Outcome(workload.name, workload.row, mode, strategy)
    with scratch_dir() as directory:
        stage, problems = record(workload, strategy, holder, directory, mutant)
        journal = stage.journal
        outcome.violations += [f"{workload.name} [{strategy}]: {p}" for p in problems]
        if problems and first_violation:
            return outcome
        explorer = Explorer(
            journal.base, journal.records, journal.start, mode, limit, random.Random(seed)
        )
        outcome.violations += [
            f"{workload.name} [{mode}/{strategy}]: {p}"
            for p in returns_not_durable(explorer, journal)
        ]
        if outcome.violations and first_violation:
            return outcome
        oracle = Oracle(journal, strategy, directory / "state", mode, drainer, holder_alive)
        epochs = marker_epochs(journal)
        seen: set[object] = set()
        for state in explorer.states():
            key = (state.image.canonical(), epochs[state.point])
            if key in seen:
                continue
            seen.add(key)
            outcome.states += 1
            for problem in oracle.judge(state):
                where = describe(workload, mode, strategy, journal, state, problem)
                outcome.violations.append(where)
            if first_violation and outcome.violations:
                break
        outcome.sampled_points = explorer.sampled_points
    return outcome


def marker_epochs(journal: Journal) -> list[int]:
    """For every crash point, how many markers came before it: states with the same image
    and the same markers behind them are judged once."""
    epochs, count = [0], 0
    for record_ in journal.records:
        count += isinstance(record_.op, Step | Attempt | Returned | Ack | Executed)
        epochs.append(count)
    return epochs


def describe(
    workload: Workload,
    mode: Mode,
    strategy: str,
    journal: Journal,
    state: CrashState,
    problem: str,
) -> str:
    """A violation, with the crash state it was found in (the last protocol step reached and
    which volatile units were kept or lost)."""
    last_step = "the start"
    for line in journal.records[journal.start : state.point]:
        if isinstance(line.op, Step):
            last_step = f"{line.actor}:{line.op.name}"
    return f"{workload.name} [{mode}/{strategy}] after {last_step}, {state.describe()}: {problem}"
