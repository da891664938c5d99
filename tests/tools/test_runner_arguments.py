"""``run_native`` called by a program with arguments of the wrong kind or value (SPEC T-3, S-2,
T-7; docs/tools.md "For workers and other callers"): a root however ``os`` spells a path,
a timeout that is seconds or a refusal, and an input JSON cannot hold refused at stage
``schema`` with both of its events readable.  Never an exception out of the call."""

from __future__ import annotations

import errno
import json
import math
from pathlib import Path
from typing import Any

import pytest

from cortexfs.shared.sessions import SessionRef
from cortexfs.tools.runner import run_native
from tests.tools.support import World

REPORT_INPUT = """#!/bin/sh
# Prints the input it was given.
cat
"""


@pytest.fixture
def coder(world: World) -> World:
    world.install("echo-input", REPORT_INPUT)
    world.agent("coder", tools=["echo-input"])
    world.allow_tool("echo-input")
    return world


def session_path(world: World, name: str) -> Path:
    return SessionRef.home(world.root, world.user.uid, "coder", name).events_path


def strict_lines(path: Path) -> list[dict[str, Any]]:
    """Each line of ``path`` as JSON with no NaN or Infinity in it."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is no JSON number")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


def test_a_root_given_as_a_str_runs_the_call(coder: World) -> None:
    result = run_native(str(coder.root), "coder", "echo-input", {"n": 1}, session="str-root")

    assert result.ok, result.error
    assert result.output == {"n": 1}


def test_a_relative_root_names_the_same_tree_where_the_tool_starts(
    coder: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T-3: the tool starts in the agent's working directory; the root it was found in is
    taken from the caller's, once, as the call starts."""
    monkeypatch.chdir(coder.root.parent)

    result = run_native(Path(coder.root.name), "coder", "echo-input", {"n": 2}, session="rel")

    assert result.ok, result.error
    assert [event["type"] for event in strict_lines(session_path(coder, "rel"))] == [
        "tool_call",
        "tool_result",
    ]


def test_a_root_that_is_no_path_is_a_type_error(coder: World) -> None:
    with pytest.raises(TypeError):
        run_native(None, "coder", "echo-input", {})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "timeout",
    [math.nan, math.inf, "10", True, 0, -1.0, 31_622_401, 10**5000],
    ids=["nan", "inf", "str", "bool", "zero", "negative", "past-a-year-and-a-day", "digits"],
)
def test_a_timeout_that_is_no_number_of_seconds_is_refused_before_anything_is_recorded(
    coder: World, timeout: object
) -> None:
    """T-3: the caller's mistake, EINVAL at stage ``caller`` naming the timeout, as
    ``ctx run --timeout`` refuses it: the session is not opened and the tool never starts."""
    result = run_native(
        coder.root,
        "coder",
        "echo-input",
        {},
        session="timeouts",
        timeout=timeout,  # type: ignore[arg-type]
    )

    assert (result.ok, result.exit_status) == (False, None)
    assert (result.error.errno, result.error.stage) == (errno.EINVAL, "caller")
    assert "timeout" in result.error.message and "a year and a day" in result.error.message
    assert not session_path(coder, "timeouts").exists()


def test_no_timeout_and_the_longest_are_taken(coder: World) -> None:
    for timeout in (None, 31_622_400, 0.5):
        result = run_native(coder.root, "coder", "echo-input", {}, timeout=timeout)
        assert result.ok, (timeout, result.error)


def itself() -> dict[str, Any]:
    value: dict[str, Any] = {"password": "hunter2"}
    value["self"] = value
    return value


def nested(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


UNREADABLE = {
    "nan": (math.nan, "NaN"),
    "infinity": ([math.inf], "infinite"),
    "digits": (10**5000, "digits"),
    "itself": (itself(), "circular"),
    "too deep": (nested(200), "128"),
    "a set": ({1, 2}, "set"),
}


@pytest.mark.parametrize(("value", "named"), UNREADABLE.values(), ids=UNREADABLE.keys())
def test_an_input_json_cannot_hold_is_refused_at_schema_and_both_events_are_readable(
    coder: World, value: Any, named: str
) -> None:
    """S-2, T-7 (docs/tools.md: input that is not JSON, or that JSON readers disagree on, is
    refused at stage ``schema``): EINVAL saying why, the tool never started, and the call's
    ``tool_call`` (its input recorded as text, secrets redacted) and ``tool_result`` are
    lines every reader takes."""
    given = {"password": "hunter2", "v": value}

    result = run_native(coder.root, "coder", "echo-input", given, session="unreadable")

    assert (result.ok, result.exit_status) == (False, None)
    assert (result.error.errno, result.error.stage) == (errno.EINVAL, "schema")
    assert named in result.error.message, result.error.message
    path = session_path(coder, "unreadable")
    events = strict_lines(path)
    assert [event["type"] for event in events] == ["tool_call", "tool_result"]
    assert isinstance(events[0]["input"], str)
    assert "hunter2" not in path.read_text()
    assert [line["stage"] for line in coder.tool_log("echo-input")] == ["schema"]
