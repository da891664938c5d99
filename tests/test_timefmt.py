"""The instants a timestamp may name (docs/queue.md: "an instant of the years 1 to 9999"):
both ends taken and written back, a second beyond either refused, in any offset."""

from __future__ import annotations

import pytest

from cortexfs.errors import CtxError
from cortexfs.timefmt import file_time, parse_rfc3339, parse_time, rfc3339


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


@pytest.mark.parametrize(
    ("nanoseconds", "written"),
    [
        # stat(1) shows .651308886: the microsecond it lies in, never the next one.
        (1_764_999_999_651_308_886, "2025-12-06T05:46:39.651308Z"),
        (1_764_999_999_999_999_999, "2025-12-06T05:46:39.999999Z"),
        (-500_000_001, "1969-12-31T23:59:59.499999Z"),
        (253_402_300_799_999_999_999, "9999-12-31T23:59:59.999999Z"),
        (253_402_300_800_000_000_000, None),  # year 10000: kept by tmpfs, no RFC 3339 time
    ],
)
def test_a_files_time_is_cut_to_its_microsecond_as_stat_shows_it(
    nanoseconds: int, written: str | None
) -> None:
    assert file_time(nanoseconds) == written


@pytest.mark.parametrize(
    "stamp",
    [
        "20260622T120000Z",
        "2026-W25-1T12:00:00Z",
        "2026-06-22T12:00Z",
        "2026-06-22T12:00:00+0000",
        "2026-06-22T12Z",
        "2026-06-22T12:00:00,5Z",
        "2026-06-22T12:00:00 Z",
    ],
)
def test_iso_8601_forms_rfc_3339_does_not_allow_are_refused(stamp: str) -> None:
    with pytest.raises(CtxError, match="is not an RFC 3339 timestamp"):
        parse_rfc3339(stamp)


@pytest.mark.parametrize(
    "stamp",
    [
        "2026-06-22T12:00:00Z",
        "2026-06-22t12:00:00.5z",
        "2026-06-22 12:00:00+02:00",
        "2016-12-31T23:59:60Z",
    ],
)
def test_rfc_3339_date_times_are_taken(stamp: str) -> None:
    assert parse_rfc3339(stamp) > 0
