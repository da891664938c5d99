"""What a schema's references may do (cortexfs.tools.schema_references): every reference
that does not resolve inside the schema is named, and a cycle that consumes nothing is found
wherever it is, not only at the top."""

from __future__ import annotations

import pytest

from cortexfs.tools.schemas import instance_problems, schema_problems


def test_every_reference_outside_the_schema_is_named_beside_its_meta_schema_problems() -> None:
    schema = {
        "properties": {
            "a": {"$ref": "https://x.invalid/a.json"},
            "b": {"$ref": "file:///etc/passwd"},
            "c": {"type": "strin"},
        }
    }
    problems = schema_problems(schema, "schema")
    assert any("https://x.invalid/a.json" in p for p in problems), problems
    assert any("file:///etc/passwd" in p for p in problems), problems
    assert any("is not a valid JSON Schema" in p for p in problems), problems


@pytest.mark.parametrize(
    "cycle",
    [
        {"$ref": "#"},
        {"properties": {"a": {"$ref": "#/$defs/p"}}, "$defs": {"p": {"$ref": "#/$defs/q"},
                                                                  "q": {"$ref": "#/$defs/p"}}},
        {"$defs": {"p": {"allOf": [{"$ref": "#/$defs/p"}]}},
         "properties": {"a": {"$ref": "#/$defs/p"}}},
    ],
)  # fmt: skip
def test_a_cycle_of_references_that_consumes_nothing_is_refused_wherever_it_is(cycle) -> None:
    problems = schema_problems(cycle, "schema")
    assert any("refers to itself without end" in p for p in problems), problems


def test_recursion_through_a_property_and_a_dynamic_anchor_are_places_it_holds() -> None:
    tree = {"properties": {"child": {"$ref": "#"}, "v": {"type": "integer"}}}
    assert schema_problems(tree, "schema") == []
    assert instance_problems(tree, {"child": {"child": {"v": "x"}}}) == [
        "at /child/child/v: 'x' is not of type 'integer'"
    ]
    dynamic = {"$dynamicAnchor": "node", "properties": {"child": {"$dynamicRef": "#node"}}}
    assert schema_problems(dynamic, "schema") == []


def test_a_draft4_id_below_the_top_and_a_schema_keyword_not_a_string_are_refused() -> None:
    old = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "properties": {"a": {"id": "http://h/a.json"}},
    }
    assert any("declares id 'http://h/a.json'" in p for p in schema_problems(old, "schema"))
    for declared in (42, True, [], {}):
        (problem,) = schema_problems({"$schema": declared, "type": "object"}, "schema")
        assert "$schema must be a string" in problem
