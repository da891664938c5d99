"""Whether every reference of a JSON Schema resolves inside it (SPEC T-1).

A tool's ``schema`` checks every native call's input, and nothing is ever fetched to check
one: a ``$ref`` is a JSON pointer (``#/$defs/x``) or an ``$anchor`` of this very document.  A
reference to another document (``file:///etc/passwd``, ``https://…``) or to a place the
schema does not hold would fail every call that reaches it, and an ``$id`` below the top
would change what the references under it mean; such a schema is no usable schema, refused
by ``ctx object check`` and ``install``, and skipped by ``ctxmcp project``.

The walk is iterative: it must hold for a schema too deep to recurse into.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote

from cortexfs.names import decimal_value

_REFERENCES = ("$ref", "$dynamicRef")
_ANCHORS = ("$anchor", "$dynamicAnchor")
# Keywords whose values are data, not schemas: a "$ref" inside an enum is a string like any.
DATA_KEYWORDS = frozenset({"const", "default", "enum", "examples"})
# Drafts 3 and 4 spell $id as "id".
_OLD_DRAFTS = ("draft-03", "draft-04")
# Keywords that apply a subschema to the very instance in hand: a cycle through them and
# references consumes nothing of it, and never ends.
_IN_PLACE = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else")


def reference_problems(schema: Any, what: str) -> list[str]:
    """Every reason a reference of ``schema`` would not resolve inside it, or would lead back
    to where it started without consuming anything of the input; empty when none."""
    declared = schema.get("$schema") if isinstance(schema, dict) else None
    old_draft = isinstance(declared, str) and any(d in declared for d in _OLD_DRAFTS)
    id_keywords = ("$id", "id") if old_draft else ("$id",)
    anchors = {
        node[keyword]
        for node, _ in schema_nodes(schema)
        for keyword in _ANCHORS
        if isinstance(node.get(keyword), str)
    }
    problems = []
    for node, top in schema_nodes(schema):
        for keyword in id_keywords:
            if isinstance(node.get(keyword), str) and not top:
                problems.append(
                    f"{what} declares {keyword} {node[keyword]!r} below its top, which changes "
                    "what the references under it mean; only references within the one "
                    "document resolve"
                )
        for keyword in _REFERENCES:
            reference = node.get(keyword)
            if not isinstance(reference, str):
                continue
            if not reference.startswith("#"):
                problems.append(
                    f"{what} refers to {reference!r}, outside itself: nothing is fetched, so "
                    "no call could be checked against it"
                )
            elif _target(schema, reference[1:], anchors) is None:
                problems.append(f"{what} refers to {reference!r}, which it does not hold")
    if not problems:
        cycle = _endless_reference(schema, anchors)
        if cycle is not None:
            problems.append(
                f"{what} refers to itself without end: {cycle} leads back to itself without "
                "consuming anything of the input (a $ref cycle)"
            )
    return problems


def _endless_reference(schema: Any, anchors: set[str]) -> str | None:
    """The first reference (``$ref`` value) on a cycle of references and in-place
    applicators (:data:`_IN_PLACE`), which validating any input would follow for ever; None
    when there is none.  Iterative (a depth-first walk with an explicit stack)."""
    visiting: set[int] = set()
    done: set[int] = set()
    for start, _ in schema_nodes(schema):
        if id(start) in done:
            continue
        stack: list[tuple[dict[str, Any], Iterator[tuple[str | None, Any]]]] = [
            (start, _in_place_steps(schema, start, anchors))
        ]
        visiting.add(id(start))
        while stack:
            node, steps = stack[-1]
            step = next(steps, None)
            if step is None:
                stack.pop()
                visiting.discard(id(node))
                done.add(id(node))
                continue
            reference, target = step
            if id(target) in visiting:
                return repr(reference) if reference else "an applicator"
            if id(target) not in done:
                visiting.add(id(target))
                stack.append((target, _in_place_steps(schema, target, anchors)))
    return None


def _in_place_steps(
    schema: Any, node: dict[str, Any], anchors: set[str]
) -> Iterator[tuple[str | None, Any]]:
    """The subschemas ``node`` applies to the same instance: what its references name (with
    the reference), and its in-place applicators' schemas."""
    for keyword in _REFERENCES:
        reference = node.get(keyword)
        if isinstance(reference, str) and reference.startswith("#"):
            target = _target(schema, reference[1:], anchors)
            if isinstance(target, dict):
                yield reference, target
    for keyword in _IN_PLACE:
        value = node.get(keyword)
        for subschema in value if isinstance(value, list) else [value]:
            if isinstance(subschema, dict):
                yield None, subschema


def schema_nodes(schema: Any) -> Iterator[tuple[dict[str, Any], bool]]:
    """Every object of ``schema`` that is read as a schema, and whether it is the top."""
    pending: list[tuple[Any, bool]] = [(schema, True)]
    while pending:
        node, top = pending.pop()
        if isinstance(node, list):
            pending.extend((item, False) for item in node)
        elif isinstance(node, dict):
            yield node, top
            pending.extend(
                (value, False) for key, value in node.items() if key not in DATA_KEYWORDS
            )


def _target(schema: Any, fragment: str, anchors: set[str]) -> Any:
    """What the fragment of a ``#…`` reference names in ``schema``: the node a JSON pointer
    leads to, the schema itself for an anchor (an anchor's place is known to exist) or for
    ``#``; None when it names no place."""
    fragment = unquote(fragment)
    if fragment == "":
        return schema
    if not fragment.startswith("/"):
        return _anchored(schema, fragment) if fragment in anchors else None
    node = schema
    for token in fragment[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and 0 <= _index(token) < len(node):
            node = node[_index(token)]
        else:
            return None
    return node


def _anchored(schema: Any, anchor: str) -> Any:
    """The node of ``schema`` that declares ``anchor``."""
    for node, _ in schema_nodes(schema):
        if anchor in (node.get(keyword) for keyword in _ANCHORS):
            return node
    return None


def _index(token: str) -> int:
    """The array index a JSON Pointer token names, else -1."""
    index = decimal_value(token)
    return -1 if index is None else index
