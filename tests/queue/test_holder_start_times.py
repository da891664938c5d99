"""A lease's start time: written to the second (by hand) it proves another process only a
second or more apart; read from psutil it is exact to the clock tick, also when a tick falls
on a whole second, so that a pid reused within that second is not taken for its holder."""

from __future__ import annotations

import pytest

from cortexfs.queue.holder import _start_time, _started_apart


@pytest.mark.parametrize(
    ("written", "to_the_second"),
    [(1000, True), ("1970-01-01T00:16:40Z", True), (1000.0, False), (1000.25, False),
     ("1970-01-01T00:16:40.000Z", False)],
)  # fmt: skip
def test_a_start_time_is_coarse_only_when_written_to_the_second(written, to_the_second) -> None:
    start = _start_time(written, "create_time")
    assert isinstance(start, int) is to_the_second
    # A process that started half a second later: another one, unless the lease could not
    # say its start more finely than the second.
    assert _started_apart(start, 1000.5) is not to_the_second


def test_psutil_start_times_a_tick_apart_on_a_whole_second_are_two_processes() -> None:
    assert _started_apart(1700000000.0, 1700000000.07)
    assert not _started_apart(1700000000.0, 1700000000.0)
