"""The parser on arbitrary input: rules or EINVAL, never anything else (SPEC P-1..P-4)."""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from cortexfs.errors import CtxError
from cortexfs.policy import (
    CLASS_PERMISSIONS,
    PolicySyntaxError,
    Rule,
    grammar,
    parse_rule,
    parse_rules,
    parse_rules_bytes,
)

WORD_CHARACTERS = "abcxyzABC019._-"
name_parts = st.text(WORD_CHARACTERS, min_size=1, max_size=20).filter(
    lambda name: name[0].isalnum() and not name.endswith(".d")
)
subjects = name_parts.filter(lambda name: len(name) <= 62).map(lambda name: f"{name}_t")


@st.composite
def rules(draw: st.DrawFn) -> Rule:
    object_class = draw(st.sampled_from(sorted(CLASS_PERMISSIONS)))
    if object_class == "network":
        name = "default"
    elif object_class == "model":
        name = f"{draw(name_parts)}/{draw(name_parts)}"
    else:
        name = draw(name_parts)
    permission = draw(st.sampled_from(CLASS_PERMISSIONS[object_class]))
    return Rule(draw(subjects), object_class, name, permission)


# Lines that are near misses of valid rules find more interesting faults than random noise.
near_misses = st.lists(
    st.one_of(
        st.sampled_from(["allow", "deny", "#", "*", "tool:", ":", "execute", "_t", "\t", " "]),
        name_parts,
        st.text(max_size=8),
    ),
    max_size=7,
).map(" ".join)


def assert_rules_or_einval(parse: Callable[[Any], list[Rule]], data: str | bytes) -> None:
    """Any exception but the EINVAL :class:`PolicySyntaxError` escapes and fails the test."""
    try:
        result = parse(data)
    except PolicySyntaxError as exc:
        assert exc.errno == errno.EINVAL
        assert exc.problems
        for problem in exc.problems:
            assert problem.line >= 1
            assert str(problem).startswith(f"<policy>:{problem.line}: EINVAL: ")
            assert "\n" not in problem.reason
    else:
        assert all(isinstance(rule, Rule) for rule in result)


@settings(max_examples=500)
@given(st.text())
def test_arbitrary_text_gives_rules_or_einval(text: str) -> None:
    assert_rules_or_einval(parse_rules, text)


@settings(max_examples=500)
@given(st.binary())
def test_arbitrary_bytes_give_rules_or_einval(data: bytes) -> None:
    assert_rules_or_einval(parse_rules_bytes, data)


@settings(max_examples=500)
@given(st.lists(near_misses, max_size=6).map("\n".join))
def test_near_misses_give_rules_or_einval(text: str) -> None:
    assert_rules_or_einval(parse_rules, text)


@given(st.lists(rules(), max_size=20))
def test_valid_rules_survive_printing_and_parsing(generated: list[Rule]) -> None:
    text = "\n".join(str(rule) for rule in generated)
    assert parse_rules(text) == generated
    assert parse_rules_bytes(text.encode()) == generated


@given(st.lists(rules(), min_size=1, max_size=10), st.data())
def test_one_bad_line_makes_the_whole_policy_invalid(
    generated: list[Rule], data: st.DataObject
) -> None:
    lines = [str(rule) for rule in generated]
    position = data.draw(st.integers(0, len(lines)))
    lines.insert(
        position,
        data.draw(st.sampled_from(["deny a_t tool:x execute", "allow a_t tool:* execute"])),
    )
    try:
        parse_rules("\n".join(lines))
    except PolicySyntaxError as exc:
        assert [problem.line for problem in exc.problems] == [position + 1]
    else:
        raise AssertionError("a policy with an invalid line was accepted")


def outcome_of(parse: Callable[[str], Rule | None], line: str) -> Rule | str | None:
    try:
        return parse(line)
    except CtxError as exc:
        return errno.errorcode[exc.errno]


@settings(max_examples=1000)
@given(
    st.one_of(
        near_misses,
        rules().map(str),
        st.tuples(rules().map(str), st.integers(0, 60), st.sampled_from("*/.d_:\t -$xT")).map(
            lambda mutation: mutation[0][: mutation[1]] + mutation[2] + mutation[0][mutation[1] :]
        ),
    )
)
@example("allow a_t model:openai.d/gpt use")
@example("allow a_t model:openai/gpt.d use")
@example("allow a_t tool:fs/read execute")
@example("allow a_t tool:fs.d execute")
@example("allow a_t network:defaults connect")
@example("allow a_t tool:fs.read read")
@example("allow a_t tooling:fs.read execute")
def test_the_fast_path_agrees_with_the_word_by_word_parser(line: str) -> None:
    # The fast path is an optimisation only: it must accept exactly what the full parser does.
    assert outcome_of(parse_rule, line) == outcome_of(grammar._parse_rule_word_by_word, line)
