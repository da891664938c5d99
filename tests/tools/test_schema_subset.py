"""The schema subset agrees with jsonschema on every schema it claims to know."""

from __future__ import annotations

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortexfs.tools import schema_subset
from cortexfs.tools.schemas import instance_problems, schema_problems

NAMES = st.sampled_from(["a", "b", "path", "n"])
TYPES = st.sampled_from(["object", "array", "string", "number", "integer", "boolean", "null"])
PATTERNS = st.sampled_from(["^a", "b$", "[0-9]+", "^$", "x|y"])
SMALL = st.integers(min_value=0, max_value=4)
LIMITS = st.integers(min_value=-3, max_value=3) | st.floats(-3, 3, allow_nan=False)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(-5, 5, allow_nan=False)
    | st.sampled_from([1.0, 2.0, 0.0, -0.0])
    | st.text(alphabet="abxy0129", max_size=5)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(NAMES, inner, max_size=4),
    max_leaves=12,
)


def keyword_sets(inner: st.SearchStrategy[object]) -> st.SearchStrategy[dict[str, object]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "type": TYPES | st.lists(TYPES, min_size=1, max_size=3, unique=True),
            "properties": st.dictionaries(NAMES, inner, max_size=3),
            "additionalProperties": st.booleans() | inner,
            "required": st.lists(NAMES, max_size=3, unique=True),
            "items": inner,
            "enum": st.lists(json_values, max_size=3),
            "const": json_values,
            "minimum": LIMITS,
            "maximum": LIMITS,
            "exclusiveMinimum": LIMITS,
            "exclusiveMaximum": LIMITS,
            "minLength": SMALL,
            "maxLength": SMALL,
            "minItems": SMALL,
            "maxItems": SMALL,
            "minProperties": SMALL,
            "maxProperties": SMALL,
            "pattern": PATTERNS,
            "description": st.text(max_size=5),
            "default": json_values,
        },
    )


schemas = st.recursive(st.booleans() | keyword_sets(st.nothing()), keyword_sets, max_leaves=8)


def paths(problems: list[tuple[list[str], bool]]) -> tuple[list[list[str]], int]:
    """The places of the violations, apart from those of ``false`` subschemas: jsonschema
    reports those without the path that led to them, so only their number is compared."""
    return sorted(path for path, by_false in problems if not by_false), sum(
        by_false for _, by_false in problems
    )


@settings(max_examples=800, deadline=None)
@given(schemas, json_values)
def test_the_subset_finds_exactly_the_violations_jsonschema_finds(
    schema: object, instance: object
) -> None:
    assert schema_subset.well_formed(schema)
    ours = schema_subset.problems(schema, instance)
    assert ours is not None
    theirs = jsonschema.Draft202012Validator(schema).iter_errors(instance)
    assert paths(
        [
            ([str(part) for part in path], message.startswith("False schema"))
            for path, message in ours
        ]
    ) == paths(
        [([str(part) for part in error.absolute_path], error.validator is None) for error in theirs]
    )


@settings(max_examples=300, deadline=None)
@given(schemas)
def test_a_well_formed_schema_is_valid_against_the_meta_schema(schema: object) -> None:
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}},
        {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
        {"type": "array", "items": [{"type": "string"}]},
        {"$schema": "http://json-schema.org/draft-04/schema#", "minimum": 1},
        {"type": "strnig"},
        {"required": ["a", "a"]},
        {"minLength": -1},
        {"pattern": "("},
        {"properties": {"a": {"type": 3}}},
        ["not", "an", "object"],
        {"type": [{}]},
        {"type": []},
        {"required": [1]},
        {"enum": 3},
        {"properties": ["a"]},
        {"minimum": True},
        {"items": [True]},
    ],
)
def test_anything_else_is_left_to_jsonschema(schema: object) -> None:
    assert not schema_subset.well_formed(schema)
    assert schema_subset.problems(schema, {}) is None


def test_an_unknown_keyword_still_gets_a_full_check() -> None:
    schema = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    assert instance_problems(schema, 3) == []
    assert instance_problems(schema, 3.5)  # jsonschema answered
    assert schema_problems({"type": "strnig"}, "schema")  # the meta-schema answered


def test_the_messages_name_the_place_and_the_rule() -> None:
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string", "minLength": 1}, "n": {"maximum": 3}},
        "required": ["path"],
        "additionalProperties": False,
    }
    assert instance_problems(schema, {"path": "", "n": 4, "x": 1}) == [
        "Additional properties are not allowed ('x' was unexpected)",
        "at /n: 4 is greater than the maximum of 3",
        "at /path: '' is shorter than 1",
    ]
    assert instance_problems(schema, {}) == ["'path' is a required property"]
    assert instance_problems({"enum": [1, "a"]}, True) == ["True is not one of [1, 'a']"]
