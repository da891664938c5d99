"""A schema's pattern means what ECMA-262 says, whichever checker applies it (SPEC T-1)."""

from __future__ import annotations

import re

import pytest

from cortexfs.tools import ecma_regex, schema_patterns, schema_subset
from cortexfs.tools.schemas import instance_problems, schema_problems

# (pattern, text, whether ECMA-262 finds the pattern in the text)
CASES = [
    ("^[a-z]+$", "abc", True),
    ("^[a-z]+$", "abc\n", False),  # Python's $ takes a last newline
    ("^\\d+$", "12", True),
    ("^\\d+$", "\u0661\u0662", False),  # Arabic-Indic digits are \d to Python
    ("^\\w+$", "caf\u00e9", False),
    ("\\bx", "\u00e9x", True),  # é is no word character: a boundary before x
    ("^a.b$", "a\rb", False),
    ("^a.b$", "a\u2028b", False),
    ("^a.b$", "a-b", True),
    ("^\\s$", "\ufeff", True),  # the byte order mark is ECMA-262 white space
    ("^\\s$", "\x1c", False),  # an ASCII separator is Python's, not ECMA-262's
    ("^\\S$", "\u00a0", False),
    ("^[\\s]$", "\u3000", True),
    ("[]", "", False),
    ("^[^]$", "\n", True),
    ("^(?<twice>ab)\\k<twice>$", "abab", True),
    ("^(?<twice>ab)\\k<twice>$", "abba", False),
    ("^[[]$", "[", True),
    ("^\\$$", "$", True),
    ("^\\u{1F600}$", "\U0001f600", True),
    ("^\\cJ$", "\n", True),
    ("^a$|^b$", "b\n", False),
    ("(?<=a)b", "ab", True),
    ("x\\Z", "x", True),  # Python's own spellings keep their meaning
    ("(?i)^abc$", "ABC", True),
]


@pytest.mark.parametrize(("pattern", "text", "found"), CASES)
def test_both_checkers_apply_the_ecma_262_meaning(pattern: str, text: str, found: bool) -> None:
    common = {"type": "string", "pattern": pattern}
    assert schema_subset.well_formed(common)
    through_jsonschema = {"allOf": [common]}  # a keyword the subset leaves to jsonschema
    assert not schema_subset.well_formed(through_jsonschema)
    assert schema_problems(common, "schema") == []
    assert schema_problems(through_jsonschema, "schema") == []
    for schema in (common, through_jsonschema):
        assert (instance_problems(schema, text) == []) is found, (schema, text)


def test_pattern_properties_and_additional_properties_read_names_the_same_way() -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^x\\d$": {"type": "integer"}},
        "additionalProperties": False,
    }
    assert instance_problems(schema, {"x1": 1}) == []
    assert instance_problems(schema, {"x1": "one"}) == ["at /x1: 'one' is not of type 'integer'"]
    # "x1\n" and "x\u0661" are no names of the pattern: additional, and refused as such.
    for name in ("x1\n", "x\u0661"):
        assert instance_problems(schema, {name: 1}) == [
            f"{name!r} does not match any of the regexes: '^x\\\\d$'"
        ]


def test_a_refusal_quotes_the_pattern_as_the_schema_holds_it() -> None:
    common = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"}}}
    deep = {"type": "object", "properties": {"id": {"allOf": [{"pattern": "^[a-z]+$"}]}}}
    for schema in (common, deep):
        assert instance_problems(schema, {"id": "abc\n"}) == [
            "at /id: 'abc\\n' does not match '^[a-z]+$'"
        ]


def test_a_pattern_is_refused_when_ecma_262_cannot_read_it_and_taken_when_only_python_cannot() -> (
    None
):
    for pattern in ("(", "a{2,1}", "\\", "\\u{110000}"):
        assert schema_problems({"pattern": pattern}, "schema"), pattern
        assert schema_problems({"allOf": [{"pattern": pattern}]}, "schema"), pattern
    # A named group as ECMA-262 spells it, which Python's re alone refuses.
    with pytest.raises(re.error):
        re.compile("(?<n>a)")
    assert schema_problems({"allOf": [{"pattern": "(?<n>a)"}]}, "schema") == []


def test_the_backtracking_judgment_sees_the_pattern_that_runs() -> None:
    assert schema_patterns.may_backtrack({"pattern": "^(a+)+$"})
    assert schema_patterns.may_backtrack({"pattern": "^(.\\s?)*$"})
    assert not schema_patterns.may_backtrack({"pattern": "^[a-z.]+$"})


def test_the_rewriting_is_scoped_so_patterns_joined_with_a_bar_still_compile() -> None:
    # jsonschema joins patternProperties names with "|" to find additional properties.
    joined = "|".join(ecma_regex.python_pattern(p) for p in ("^b$", "(?i)^a$", "[]"))
    assert re.compile(joined).search("A") and not re.compile(joined).search("B")


@pytest.mark.parametrize(
    "pattern", ["a{4294967296}", "(" * 1000 + "a" + ")" * 1000], ids=["a-huge-count", "deep"]
)
def test_a_pattern_too_large_for_re_is_no_pattern_for_either_checker(pattern: str) -> None:
    """re raises OverflowError for a count past its limit and RecursionError for groups
    nested past the interpreter's recursion limit: each is a schema's problem, never an
    exception out of the check."""
    with pytest.raises(re.error, match="too large to compile"):
        ecma_regex.compiled(pattern)
    assert schema_problems({"pattern": pattern}, "schema"), pattern
    assert schema_problems({"allOf": [{"pattern": pattern}]}, "schema"), pattern
    assert schema_problems({"patternProperties": {pattern: {}}}, "schema"), pattern
