"""Timestamps as RFC 3339 UTC strings (``2026-06-22T12:00:00.123456Z``), the one format on disk."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from cortexfs.errors import invalid

# The longest duration a command takes (a timeout, a grace period): a year and a day.  Longer
# than any job or wait is meant to last, and far within what the interpreter's clocks and
# timed waits hold (about 292 years of nanoseconds), beyond which a timeout given on the
# command line would fail only once a job used it.
MAX_SECONDS = 366 * 24 * 3600.0


def rfc3339(epoch: float | None = None) -> str:
    """Format seconds since the epoch (default: now) as RFC 3339 UTC with microseconds."""
    moment = datetime.fromtimestamp(time.time() if epoch is None else epoch, tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(text: object) -> float:
    """Seconds since the epoch of an RFC 3339 timestamp; EINVAL when it is not one."""
    if not isinstance(text, str):
        raise invalid(f"{text!r} is not an RFC 3339 timestamp")
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise invalid(f"{text!r} is not an RFC 3339 timestamp") from exc
    if moment.tzinfo is None:
        raise invalid(f"{text!r} has no time zone; RFC 3339 timestamps need one")
    return moment.timestamp()
