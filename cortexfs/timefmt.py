"""Timestamps as RFC 3339 UTC strings (``2026-06-22T12:00:00.123456Z``), the one format on disk."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

from cortexfs.errors import invalid

# The longest duration a command takes (a timeout, a grace period): a year and a day.  Longer
# than any job or wait is meant to last, and far within what the interpreter's clocks and
# timed waits hold (about 292 years of nanoseconds), beyond which a timeout given on the
# command line would fail only once a job used it.
MAX_SECONDS = 366 * 24 * 3600.0

# A number of seconds as people write one: digits, a decimal point, an exponent, a sign to be
# refused by its range.  Not what else Python's float() reads ("1_000", " 5 ", "+5",
# "infinity", "nan", digits of other scripts), which a control file refuses as much.
SECONDS_TEXT = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", re.ASCII)


# The instants every timestamp written here can name: years 1 to 9999 in UTC, to the second
# (a time read in another offset counts by its instant: 9999-12-31T23:00:00-12:00 is past
# them).  Whole seconds, which a float holds exactly there, so that each end can be written.
EARLIEST = datetime(1, 1, 1, tzinfo=UTC).timestamp()
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def is_seconds(value: object, *, zero: bool = False) -> bool:
    """Whether ``value`` is a number of seconds a command takes as a period: an int or a
    float (not a bool) above 0 (from 0 with ``zero``) and at most :data:`MAX_SECONDS`; NaN
    is none, failing every comparison."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    above_least = value >= 0 if zero else value > 0
    return above_least and value <= MAX_SECONDS


def rfc3339(epoch: float | None = None) -> str:
    """Format seconds since the epoch (default: now) as RFC 3339 UTC with microseconds."""
    return _written(datetime.fromtimestamp(time.time() if epoch is None else epoch, tz=UTC))


def _written(m: datetime) -> str:
    # Not strftime's %Y, which the C library leaves unpadded below year 1000 ("999-06-01"),
    # a form no reader takes for RFC 3339.
    return (
        f"{m.year:04d}-{m.month:02d}-{m.day:02d}T{m.hour:02d}:{m.minute:02d}:{m.second:02d}"
        f".{m.microsecond:06d}Z"
    )


def file_time(nanoseconds: int) -> str | None:
    """A file's time in nanoseconds (``st_mtime_ns``) as :func:`rfc3339` writes it, cut to
    the microsecond as ``stat`` and ``ls --full-time`` cut it (a float's seconds would be
    rounded, into the next microsecond half the time); None when it lies outside RFC 3339's
    years 1 to 9999, which tmpfs and btrfs keep (``touch -d @253402300800``)."""
    try:
        # In whole microseconds, counted exactly: a float of seconds holds no microsecond
        # beyond some 2**33 s (year 2242) exactly.
        return _written(_EPOCH + timedelta(microseconds=nanoseconds // 1000))
    except (ValueError, OverflowError, OSError):
        return None


def parse_time(text: str) -> tuple[float, bool] | None:
    """Seconds since the epoch of an RFC 3339 timestamp, or of an ISO 8601 one without a zone
    (read as UTC), and whether ``text`` gave its zone; None when it is neither, or names an
    instant beyond :data:`EARLIEST` .. :data:`LATEST`.  RFC 3339's lower-case ``t`` and ``z``
    (§5.6) are taken, and a leap second (``23:59:60``, §5.7) as the instant after
    ``23:59:59``, which is what the system clock shows then."""
    iso = text.strip()
    if len(iso) > 10 and iso[10] in "t ":
        iso = iso[:10] + "T" + iso[11:]
    if iso[-1:] in ("z", "Z"):
        iso = iso[:-1] + "+00:00"
    leap = iso[16:19] == ":60" and iso[10:11] == "T"
    if leap:
        iso = iso[:16] + ":59" + iso[19:]
    try:
        moment = datetime.fromisoformat(iso)
        zoned = moment.tzinfo is not None
        seconds = (moment if zoned else moment.replace(tzinfo=UTC)).timestamp() + leap
    except (ValueError, OverflowError):
        return None
    if not EARLIEST <= seconds <= LATEST:
        return None
    return seconds, zoned


# RFC 3339 §5.6's date-time (with §5.6's note: a space may stand for the "T"), the zone
# optional here so that a timestamp without one is told so; ISO 8601's other forms (basic
# format, week dates, no seconds, an offset without its colon) are no RFC 3339.
_RFC3339_LOCAL = r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?"
_RFC3339 = re.compile(rf"{_RFC3339_LOCAL}(?P<zone>[Zz]|[+-][0-9]{{2}}:[0-9]{{2}})?", re.ASCII)


def parse_rfc3339(text: object) -> float:
    """Seconds since the epoch of an RFC 3339 timestamp; EINVAL when it is not one."""
    form = _RFC3339.fullmatch(text.strip()) if isinstance(text, str) else None
    parsed = None if form is None else parse_time(form.string)
    if form is None or parsed is None:
        raise invalid(f"{text!r} is not an RFC 3339 timestamp")
    if form["zone"] is None:
        raise invalid(f"{text!r} has no time zone; RFC 3339 timestamps need one")
    return parsed[0]
