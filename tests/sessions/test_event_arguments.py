"""What the appenders take from a library caller (SPEC S-2, S-5): only events every reader
reads back, the S-2 keys as the event was made, and a path however ``os`` spells one."""

from __future__ import annotations

import errno
import json
import math
from pathlib import Path
from typing import Any

import pytest

from cortexfs.errors import CtxError
from cortexfs.shared.events import (
    MAX_EVENT_DEPTH,
    EventLog,
    append_event,
    make_event,
    read_events,
)
from cortexfs.shared.sessions import SessionRef, open_session


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A storage root as far as a home session needs one: its ``home/``."""
    (tmp_path / "home").mkdir()
    return tmp_path


def nested(levels: int) -> list[Any]:
    """A list ``levels`` arrays deep (``[]`` is one)."""
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def cyclic() -> dict[str, Any]:
    value: dict[str, Any] = {}
    value["self"] = value
    return value


def strict_lines(path: Path) -> list[dict[str, Any]]:
    """Each line of ``path`` as JSON with no NaN or Infinity in it."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is no JSON number")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


# The event itself is one level: a fact MAX_EVENT_DEPTH arrays deep makes one level too many.
UNWRITABLE = {
    "nan": (math.nan, "NaN"),
    "infinity": ([-math.inf], "infinite"),
    "huge integer": (10**5000, "digits"),
    "too deep": (nested(MAX_EVENT_DEPTH), str(MAX_EVENT_DEPTH)),
    "itself": (cyclic(), "circular"),
}


@pytest.mark.parametrize(("value", "named"), UNWRITABLE.values(), ids=UNWRITABLE.keys())
def test_a_fact_no_reader_takes_back_is_refused_and_nothing_is_appended(
    root: Path, value: Any, named: str
) -> None:
    """S-2, S-5: recorded, such a fact would be a line every reader skips as damaged, after
    the record was reported done; EINVAL saying why instead, and the log stays as it was."""
    ref = SessionRef.home(root, 0, "coder", "s")
    with open_session(ref) as session:
        session.record("note", object="x", status="ok")
        before = ref.events_path.read_bytes()
        with pytest.raises(CtxError) as refused:
            session.record("note", object="x", status="ok", v=value, durable_event=True)

    assert refused.value.errno == errno.EINVAL
    assert named in refused.value.message and "not recorded" in refused.value.message
    assert ref.events_path.read_bytes() == before
    scan = read_events(ref.events_path)
    assert (len(scan.events), scan.damaged_count) == (1, 0)


def test_an_event_as_deep_as_readers_take_is_appended_and_read_back(tmp_path: Path) -> None:
    """The appender's limit is the reader's: the deepest event it writes is read back."""
    path = tmp_path / "events.jsonl"
    event = make_event("note", agent="a", session="s", object="x", status="ok")
    event["v"] = nested(MAX_EVENT_DEPTH - 1)

    append_event(path, event)

    scan = read_events(path)
    assert (len(scan.events), scan.damaged_count) == (1, 0)
    assert scan.events[0]["v"] == event["v"]


@pytest.mark.parametrize("key", ["ts", "type"])
def test_a_fact_named_like_a_key_the_event_is_made_with_is_a_type_error(
    root: Path, key: str
) -> None:
    """S-2: ``ts`` is the recorder's RFC 3339 stamp and ``type`` the event's type; a fact of
    that name is refused as one named ``agent`` is, never written over them."""
    ref = SessionRef.home(root, 0, "coder", "s")
    with open_session(ref) as session:
        with pytest.raises(TypeError, match=repr(key)):
            session.record("note", object="x", status="ok", **{key: "bogus"})
        with pytest.raises(TypeError, match="agent"):
            session.record("note", object="x", status="ok", agent="other")  # type: ignore[misc]
        session.record("note", object="x", status="ok")

    events = strict_lines(ref.events_path)
    assert [(event["type"], event["ts"] != "bogus") for event in events] == [("note", True)]


@pytest.mark.parametrize("spelled", [str, Path], ids=["str", "Path"])
def test_event_logs_take_a_path_as_the_readers_do(tmp_path: Path, spelled: type) -> None:
    """S-5 (docs/sessions.md): ``EventLog(path)`` and ``append_event(path, …)`` append to a
    path given as a str as to a Path, as ``read_events`` reads either."""
    path = spelled(tmp_path / "events.jsonl")
    event = make_event("note", agent="a", session="s", object="x", status="ok")

    with EventLog(path) as log:
        log.append(event)
    append_event(path, event, durable_event=True)

    assert len(read_events(path).events) == 2
    assert log.path == tmp_path / "events.jsonl"


def test_an_event_log_of_no_path_is_a_type_error(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        EventLog(5)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []
