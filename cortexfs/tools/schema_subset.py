"""Input checks for schemas written with the common JSON Schema keywords, without jsonschema.

Every native call checks its input against the tool's schema, and ``ctx run --native`` is a
new process for each call: importing jsonschema (with referencing, attrs and rpds) costs that
process about 100 ms, more than a trivial tool takes to run.  Tool schemas are nearly always
an object of typed properties, so the keywords below are checked here directly, with the
meaning JSON Schema (draft 6 and later) gives them.  :func:`problems` answers ``None`` for a
schema that uses anything else (``$ref``, ``oneOf``, ``patternProperties``, a tuple
``items``, a draft 3/4 ``$schema``…), and the caller asks jsonschema instead; the two are
compared on generated schemas and inputs in ``tests/tools/test_schema_subset.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from cortexfs.tools import ecma_regex

_OLD_DRAFTS = ("draft-03", "draft-04")  # different meanings (boolean exclusiveMinimum…)

Path = tuple[str | int, ...]
Problem = tuple[Path, str]


def well_formed(schema: object) -> bool:
    """True when ``schema`` is a valid JSON Schema written only with the keywords below.

    False means *not known here* (another keyword, or a value of an unexpected shape): ask
    jsonschema.  A well-formed schema is valid against its meta-schema, so a tool's schema
    control needs no meta-schema check on each call.
    """
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    for keyword, value in schema.items():
        shape = _SHAPES.get(keyword)
        if shape is None or not shape(value):
            return False
    return True


def problems(schema: object, instance: object) -> list[Problem] | None:
    """Every ``(path, message)`` by which ``instance`` fails ``schema``, in document order;
    ``None`` when the schema is not :func:`well_formed`."""
    if not well_formed(schema):
        return None
    found: list[Problem] = []
    _check(schema, instance, (), found)
    return sorted(found, key=lambda problem: [str(part) for part in problem[0]])


def _check(schema: object, instance: object, path: Path, found: list[Problem]) -> None:
    if schema is True:
        return
    if schema is False:
        found.append((path, f"False schema does not allow {show(instance)}"))
        return
    assert isinstance(schema, dict)
    for keyword, value in schema.items():
        rule = _RULES.get(keyword)
        if rule is not None:
            rule(value, instance, path, found, schema)


Rule = Callable[[Any, object, Path, list[Problem], Mapping[str, Any]], None]


def _type(expected: object, instance: object, path: Path, found: list[Problem], _: Any) -> None:
    names = [expected] if isinstance(expected, str) else expected
    if not any(_TYPE_TESTS[name](instance) for name in names):
        shown = repr(expected) if isinstance(expected, str) else repr(names)
        found.append((path, f"{show(instance)} is not of type {shown}"))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_integer(value: object) -> bool:
    return _is_number(value) and (isinstance(value, int) or float(value).is_integer())  # type: ignore[arg-type]


_TYPE_TESTS: dict[str, Callable[[object], bool]] = {
    "object": lambda value: isinstance(value, dict),
    "array": lambda value: isinstance(value, list),
    "string": lambda value: isinstance(value, str),
    "number": _is_number,
    "integer": _is_integer,
    "boolean": lambda value: isinstance(value, bool),
    "null": lambda value: value is None,
}


def _properties(
    properties: Mapping[str, Any], instance: object, path: Path, found: list[Problem], _: Any
) -> None:
    if isinstance(instance, dict):
        for name, subschema in properties.items():
            if name in instance:
                _check(subschema, instance[name], (*path, name), found)


def _additional(
    extra: object, instance: object, path: Path, found: list[Problem], schema: Mapping[str, Any]
) -> None:
    if not isinstance(instance, dict):
        return
    declared = schema.get("properties", {})
    unexpected = [name for name in instance if name not in declared]
    if extra is False and unexpected:
        listed = ", ".join(repr(name) for name in unexpected)
        verb = "was" if len(unexpected) == 1 else "were"
        found.append((path, f"Additional properties are not allowed ({listed} {verb} unexpected)"))
    elif extra is not False:
        for name in unexpected:
            _check(extra, instance[name], (*path, name), found)


def _required(names: list[str], instance: object, path: Path, found: list[Problem], _: Any) -> None:
    if isinstance(instance, dict):
        for name in names:
            if name not in instance:
                found.append((path, f"{name!r} is a required property"))


def _items(items: object, instance: object, path: Path, found: list[Problem], _: Any) -> None:
    if not isinstance(instance, list):
        return
    if items is False and instance:  # one violation for the array, as jsonschema reports it
        found.append((path, f"{show(instance)} has items, but none are allowed"))
        return
    for index, item in enumerate(instance):
        _check(items, item, (*path, index), found)


def _enum(choices: list[Any], instance: object, path: Path, found: list[Problem], _: Any) -> None:
    if not any(_json_equal(choice, instance) for choice in choices):
        found.append((path, f"{show(instance)} is not one of {show(choices)}"))


def _const(value: object, instance: object, path: Path, found: list[Problem], _: Any) -> None:
    if not _json_equal(value, instance):
        found.append((path, f"{value!r} was expected"))


def _bound(
    keyword: str, applies: Callable[[object], bool], measure: Callable[[Any], Any], fails: str
) -> Rule:
    """A keyword comparing a measure of the instance (its value, length or count) to a limit."""
    compare = {
        "min": lambda size, limit: size < limit,
        "max": lambda size, limit: size > limit,
        "exclusiveMin": lambda size, limit: size <= limit,
        "exclusiveMax": lambda size, limit: size >= limit,
    }[keyword]

    def rule(limit: object, instance: object, path: Path, found: list[Problem], _: Any) -> None:
        if applies(instance) and compare(measure(instance), limit):
            found.append((path, f"{show(instance)} {fails} {limit!r}"))

    return rule


def _pattern(pattern: str, instance: object, path: Path, found: list[Problem], _: Any) -> None:
    if isinstance(instance, str) and ecma_regex.compiled(pattern).search(instance) is None:
        found.append((path, f"{show(instance)} does not match {pattern!r}"))


def _json_equal(one: object, other: object) -> bool:
    """Equality of JSON values: ``1 == 1.0``, but ``true`` is not ``1``."""
    if isinstance(one, bool) or isinstance(other, bool):
        return isinstance(one, bool) and isinstance(other, bool) and one == other
    if isinstance(one, dict) and isinstance(other, dict):
        return one.keys() == other.keys() and all(_json_equal(one[k], other[k]) for k in one)
    if isinstance(one, list) and isinstance(other, list):
        return len(one) == len(other) and all(map(_json_equal, one, other))
    comparable = type(one) is type(other) or (_is_number(one) and _is_number(other))
    return comparable and one == other


def show(instance: object) -> str:
    """``instance`` (or a keyword's value, an enum's choices) as a message quotes it: its
    repr, cut to 80 characters."""
    text = repr(instance)
    return text if len(text) <= 80 else text[:77] + "..."


def _itself(value: object) -> object:
    return value


_is_string = _TYPE_TESTS["string"]
_is_array = _TYPE_TESTS["array"]
_is_object = _TYPE_TESTS["object"]
_RULES: dict[str, Rule] = {
    "type": _type,
    "properties": _properties,
    "additionalProperties": _additional,
    "required": _required,
    "items": _items,
    "enum": _enum,
    "const": _const,
    "minimum": _bound("min", _is_number, _itself, "is less than the minimum of"),
    "maximum": _bound("max", _is_number, _itself, "is greater than the maximum of"),
    "exclusiveMinimum": _bound("exclusiveMin", _is_number, _itself, "is less than or equal to"),
    "exclusiveMaximum": _bound("exclusiveMax", _is_number, _itself, "is greater than or equal to"),
    "minLength": _bound("min", _is_string, len, "is shorter than"),
    "maxLength": _bound("max", _is_string, len, "is longer than"),
    "minItems": _bound("min", _is_array, len, "has fewer items than"),
    "maxItems": _bound("max", _is_array, len, "has more items than"),
    "minProperties": _bound("min", _is_object, len, "has fewer properties than"),
    "maxProperties": _bound("max", _is_object, len, "has more properties than"),
    "pattern": _pattern,
}


def _schema_map(value: object) -> bool:
    return isinstance(value, dict) and all(map(well_formed, value.values()))


def _type_names(value: object) -> bool:
    if isinstance(value, str):
        return value in _TYPE_TESTS
    names = value if isinstance(value, list) else []
    known = all(isinstance(name, str) and name in _TYPE_TESTS for name in names)
    return bool(names) and known and len(set(names)) == len(names)


def _unique_strings(value: object) -> bool:
    return (
        isinstance(value, list)
        and all(isinstance(name, str) for name in value)
        and len(set(value)) == len(value)
    )


def _count(value: object) -> bool:
    return _is_integer(value) and value >= 0  # type: ignore[operator]


def _regex(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        ecma_regex.compiled(value)
    except re.error:
        return False
    return True


def _draft(value: object) -> bool:
    return isinstance(value, str) and not any(draft in value for draft in _OLD_DRAFTS)


def _anything(_: object) -> bool:
    return True


def _string(value: object) -> bool:
    return isinstance(value, str)


def _flag(value: object) -> bool:
    return isinstance(value, bool)


# What each keyword's value must look like.  Keywords that describe and never constrain are
# here with no rule in _RULES; ``format`` asserts nothing unless a validator is asked to check
# formats, and the runner does not ask (nor does jsonschema by default).
_SHAPES: dict[str, Callable[[object], bool]] = {
    "$schema": _draft,
    # No "$id": what it may hold depends on the draft and on where it stands (a fragment,
    # an id below the top names a resource references resolve to), jsonschema's to judge.
    "$comment": _string,
    "title": _string,
    "description": _string,
    "default": _anything,
    "examples": lambda value: isinstance(value, list),
    "deprecated": _flag,
    "readOnly": _flag,
    "writeOnly": _flag,
    "format": _string,
    "type": _type_names,
    "properties": _schema_map,
    "additionalProperties": well_formed,
    "required": _unique_strings,
    "items": well_formed,  # a schema; the tuple form of draft 7 (a list) is not known here
    "enum": lambda value: isinstance(value, list),
    "const": _anything,
    "minimum": _is_number,
    "maximum": _is_number,
    "exclusiveMinimum": _is_number,  # draft 4's boolean form is refused by _draft and here
    "exclusiveMaximum": _is_number,
    "minLength": _count,
    "maxLength": _count,
    "minItems": _count,
    "maxItems": _count,
    "minProperties": _count,
    "maxProperties": _count,
    "pattern": _regex,
}
