"""The instants a timestamp may name (docs/queue.md: "an instant of the years 1 to 9999"):
both ends taken and written back, a second beyond either refused, in any offset."""

from __future__ import annotations

import pytest

from cortexfs.timefmt import parse_time, rfc3339


@pytest.mark.parametrize(
    ("text", "written"),
    [
        ("0001-01-01T00:00:00Z", "0001-01-01T00:00:00.000000Z"),
        ("9999-12-31T23:59:59Z", "9999-12-31T23:59:59.000000Z"),
        ("0001-01-01T00:00:00-12:00", "0001-01-01T12:00:00.000000Z"),
    ],
)
def test_the_first_and_last_instants_of_years_1_to_9999_are_times(text: str, written: str) -> None:
    parsed = parse_time(text)
    assert parsed is not None and rfc3339(parsed[0]) == written


@pytest.mark.parametrize(
    "text", ["0001-01-01T00:00:00+00:01", "9999-12-31T23:59:59-00:01", "10000-01-01T00:00:00Z"]
)
def test_an_instant_past_either_end_is_no_time(text: str) -> None:
    assert parse_time(text) is None
