"""Patterns that may backtrack for ever (cortexfs.tools.schema_patterns): known by their form,
and an input checked against them in a child process bounded by the call's time."""

from __future__ import annotations

import contextlib
import errno
import subprocess
import sys
import time

import psutil
import pytest

from cortexfs.errors import CtxError
from cortexfs.tools.schema_patterns import may_backtrack
from cortexfs.tools.schemas import UnusableSchema, instance_problems


def schema_with(pattern: str, keyword: str = "pattern") -> dict:
    if keyword == "patternProperties":
        return {"patternProperties": {pattern: {}}}
    return {"properties": {"s": {"type": "string", keyword: pattern}}}


@pytest.mark.parametrize(
    ("pattern", "nested"),
    [
        ("^(a+)+$", True),
        ("^(\\w+\\s?)*$", True),
        ("(a{1,10})+", True),
        ("^([a-z0-9-]+\\.)+[a-z]+$", True),  # cannot backtrack for ever, but is of that form
        ("(\\d{3}-)+", False),  # a fixed count has one way to match
        ("^[a-z]+$", False),
        ("^(a|a?)+$", True),  # an optional part of a repeated alternation
        ("(foo|bar)*", True),  # an alternation in an unbounded repeat, however distinct
        ("(?:x|y)+z", False),  # one character class to re, not an alternation
        ("(?:a*+)*", False),  # possessive: gives nothing back
        ("(unclosed", False),  # not a pattern: the schema's own check refuses it
    ],
)
def test_a_repeat_of_a_repeat_is_known_by_its_form(pattern: str, nested: bool) -> None:
    assert may_backtrack(schema_with(pattern)) is nested
    assert may_backtrack(schema_with(pattern, "patternProperties")) is nested


def test_an_input_a_pattern_would_backtrack_on_for_ever_is_refused_in_the_time_given() -> None:
    schema = {"properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    assert instance_problems(schema, {"s": "aaa"}, within=30) == []
    assert instance_problems(schema, {"s": "aab"}, within=30) == [
        "at /s: 'aab' does not match '^(a+)+$'"
    ]
    started = time.monotonic()
    with pytest.raises(CtxError) as refused:
        instance_problems(schema, {"s": "a" * 40 + "!"}, within=0.5)
    assert refused.value.errno == errno.ETIMEDOUT
    assert time.monotonic() - started < 10


def test_a_schema_judged_in_the_child_that_cannot_be_applied_says_so() -> None:
    schema = {
        "properties": {"s": {"pattern": "^(a+)+$"}, "t": {"$ref": "#/$defs/p"}},
        "$defs": {"p": {"$ref": "#/$defs/p"}},
    }
    with pytest.raises(UnusableSchema):
        instance_problems(schema, {"t": 1}, within=30)


def test_the_judge_of_an_input_dies_with_the_process_that_asked_for_it() -> None:
    """I-4: a caller SIGKILLed while its input is judged (a worker, a ``ctx run``) takes the
    judge with it, which would otherwise spin on the backtracking pattern, an orphan with
    no bound of its own."""
    asking = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from cortexfs.tools.schemas import instance_problems; instance_problems("
            "{'properties': {'s': {'type': 'string', 'pattern': '^(a+)+$'}}}, "
            "{'s': 'a' * 40 + '!'}, within=300)",
        ]
    )
    judges: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 30
        while not judges and time.monotonic() < deadline:
            time.sleep(0.05)
            judges = [
                child
                for child in psutil.Process(asking.pid).children()
                if "cortexfs.tools.schema_patterns" in child.cmdline()
            ]
        assert judges, "the input was never given to a judge"
        time.sleep(0.5)  # the judge is past its start, at work on the pattern
        asking.kill()
        asking.wait()
        _, alive = psutil.wait_procs(judges, timeout=10)
        assert alive == [], "the judge outlived the process that started it"
    finally:
        asking.kill()
        asking.wait()
        for judge in judges:
            with contextlib.suppress(psutil.Error):
                judge.kill()
