"""Fixtures of the crash harness, and the result table printed at the end of the run.

Tests add rows with the ``table`` fixture; ``pytest_terminal_summary`` gathers them from
every test report (pytest-xdist ships ``user_properties`` back to the controller) and prints
one table per section.  ``make crash`` runs everything and shows it.
"""

from __future__ import annotations

import subprocess
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from cortexfs.queue import Holder
from tests.crash.report import render

TABLE_PREFIX = "crash-table:"


@pytest.fixture(scope="session")
def dead_holder() -> Holder:
    """The identity of a worker process that has exited: every lease it holds is stale."""
    child = subprocess.Popen(["sleep", "60"])
    holder = Holder.for_process(child.pid, worker="crashed-worker")
    child.kill()
    child.wait()
    return holder


@pytest.fixture(scope="session")
def drainer() -> Holder:
    """The worker that drains crash states: this process, alive while it works."""
    return Holder.for_process(worker="drain")


@pytest.fixture
def live_holder() -> Iterator[Holder]:
    """A worker process that stays alive for the whole test."""
    child = subprocess.Popen(["sleep", "600"])
    try:
        yield Holder.for_process(child.pid, worker="live-worker")
    finally:
        child.kill()
        child.wait()


@pytest.fixture
def table(record_property: Callable[[str, object], None]) -> Callable[..., None]:
    def add(section: str, **row: Any) -> None:
        record_property(TABLE_PREFIX + section, row)

    return add


def pytest_terminal_summary(terminalreporter: Any) -> None:
    sections: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for name, row in getattr(report, "user_properties", ()):
                if name.startswith(TABLE_PREFIX):
                    sections[name.removeprefix(TABLE_PREFIX)].append(row)
    if not sections:
        return
    terminalreporter.write_sep("=", "crash harness results")
    for line in render(sections):
        terminalreporter.write_line(line)
