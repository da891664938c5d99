"""The answers kept for showing tools (:class:`RecentDecisions`): how long each is kept, and
that threads may ask at once.  The chain itself is replaced here by a table of answers, so
that what is checked is the keeping alone."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from cortexfs.agents import projection
from cortexfs.agents.projection import FRESH_SECONDS, RecentDecisions

VIEW = SimpleNamespace(root=Path("/srv/ctx"), name="coder", workspace=None)


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> dict[str, bool]:
    """What the chain answers for each tool; a tool not in it may run."""
    table: dict[str, bool] = {}
    monkeypatch.setattr(projection, "may_run", lambda _view, tool: table.get(tool, True))
    return table


def test_an_answer_is_as_old_as_the_controls_it_was_decided_from(answers: dict[str, bool]) -> None:
    """A view read half of FRESH_SECONDS ago decides now: its answer goes stale when the
    view does, not FRESH_SECONDS after the decision."""
    kept = RecentDecisions()
    read_at = time.monotonic() - FRESH_SECONDS / 2
    assert kept.may_run(VIEW, "fs.stat", read_at=read_at)  # type: ignore[arg-type]
    answers["fs.stat"] = False  # revoked

    time.sleep(FRESH_SECONDS / 2 + 0.05)

    assert not kept.may_run(VIEW, "fs.stat")  # type: ignore[arg-type]


class _PausedTidy(dict):  # type: ignore[type-arg]
    """A table of stale answers whose tidying pauses after its first entry until told to go
    on.  Its length, asked during the pause, is what a thread that asked just before the
    pause began saw: less than the tidying threshold."""

    def __init__(self, entries: dict[object, object]) -> None:
        super().__init__(entries)
        self.paused = threading.Event()
        self.go_on = threading.Event()

    def __len__(self) -> int:
        return 0 if self.paused.is_set() else super().__len__()

    def items(self):  # type: ignore[no-untyped-def]
        for n, item in enumerate(super().items()):
            if n == 1:
                self.paused.set()
                self.go_on.wait(5)
            yield item


def test_an_answer_kept_while_another_thread_tidies_waits_for_it(answers: dict[str, bool]) -> None:
    """A worker's job slots share one table: one thread drops the stale answers while
    another keeps its own.  The keeping waits; it does not change the table under the
    tidying (which would fail the first call, and with it its job)."""
    kept = RecentDecisions()
    stale = {(str(VIEW.root), VIEW.name, "", f"old{n}"): (0.0, True) for n in range(1024)}
    table = kept._answers = _PausedTidy(stale)
    failures: list[BaseException] = []

    def ask(tool: str) -> None:
        try:
            kept.may_run(VIEW, tool)  # type: ignore[arg-type]
        except BaseException as failure:  # reported below, whatever it is
            failures.append(failure)

    tidying = threading.Thread(target=ask, args=("fs.stat",))
    tidying.start()
    assert table.paused.wait(5)
    keeping = threading.Thread(target=ask, args=("fs.list",))
    keeping.start()
    keeping.join(0.5)
    table.go_on.set()
    tidying.join()
    keeping.join()

    assert failures == []
    assert set(kept._answers) == {
        (str(VIEW.root), VIEW.name, "", "fs.stat"),
        (str(VIEW.root), VIEW.name, "", "fs.list"),
    }
