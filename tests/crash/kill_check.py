"""What a kill -9 run must show once recover and a drain have run (docs/crash-model.md §6).

The logs written by :mod:`tests.crash.kill_runner` are the oracle: every job whose publish
returned ends in ``done/`` or ``failed/`` (I-1: none lost), no job runs after its finish was
acknowledged (I-3), and a job runs a second time only after the process running it was
killed (I-4: at most one live worker holds a job).
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from cortexfs.queue import Queue
from cortexfs.queue import evidence as ev
from tests.crash.kill_runner import outcome_of


@dataclass(frozen=True)
class Event:
    subject: str  # a job, or for kills the process killed
    process: str  # pid@start-time of the process that wrote the line
    ns: int


def read_log(logs: Path, name: str) -> list[Event]:
    path = logs / name
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        subject, process, ns = line.split(" ")
        events.append(Event(subject, process, int(ns)))
    return events


@dataclass
class KillRun:
    published: int
    executions: int
    reexecutions: int  # runs of a job beyond its first: each one follows a kill
    acknowledged: int
    sigkills: int
    lost: int


def check_run(queue_dir: Path, logs: Path) -> tuple[KillRun, list[str]]:
    published = {e.subject for e in read_log(logs, "published")}
    executions = read_log(logs, "exec")
    acks = read_log(logs, "ack")
    died_at = {e.subject: e.ns for e in read_log(logs, "kills")}
    problems: list[str] = []

    with Queue.open(queue_dir) as queue:
        found = ev.scan(queue)
        states = {job: ev.assess(e).state for job, e in found.jobs.items()}
    lost = sorted(job for job in published if states.get(job) not in ("done", "failed"))
    problems += [f"I-1: published {job} is {states.get(job, 'gone')}" for job in lost]
    problems += [
        f"I-1: {job} is {state} after recover and a drain"
        for job, state in sorted(states.items())
        if state not in ("done", "failed")
    ]
    problems += [f"Q-6: inbox/{temp.name} survived recover --reconcile" for temp in found.temps]

    ack_counts = Counter(e.subject for e in acks)
    problems += [f"I-3: {job} was acknowledged {n} times" for job, n in ack_counts.items() if n > 1]
    acked_at = {e.subject: e.ns for e in acks}
    problems += [
        f"I-3: {e.subject} ran in {e.process} after its finish was acknowledged"
        for e in executions
        if e.subject in acked_at and e.ns > acked_at[e.subject]
    ]

    runs: defaultdict[str, list[Event]] = defaultdict(list)
    for e in sorted(executions, key=lambda e: e.ns):
        runs[e.subject].append(e)
    for job, attempts in runs.items():
        for earlier, later in itertools.pairwise(attempts):
            if died_at.get(earlier.process, later.ns + 1) > later.ns:
                problems.append(
                    f"I-4: {job} ran in {later.process} while {earlier.process}, which ran it "
                    "before, was still alive"
                )
    problems += wrong_results(queue_dir, states, runs)

    run = KillRun(
        published=len(published),
        executions=len(executions),
        reexecutions=len(executions) - len(runs),
        acknowledged=len(acks),
        sigkills=len(died_at),
        lost=len(lost),
    )
    return run, problems


def wrong_results(
    queue_dir: Path, states: dict[str, str], runs: dict[str, list[Event]]
) -> list[str]:
    """Each result was written by a process that ran the job, in the state its outcome says."""
    problems = []
    for job, state in states.items():
        expected = "done" if outcome_of(job) else "failed"
        if state != expected:
            problems.append(f"Q-4: {job} ended {state}, its run said {expected}")
            continue
        result = json.loads((queue_dir / state / f"{job}.result").read_text())
        if result["output"]["by"] not in {e.process for e in runs.get(job, [])}:
            problems.append(f"Q-4: the result of {job} comes from a process that never ran it")
    return problems
