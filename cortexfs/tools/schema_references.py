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
# Keywords whose values are data, not schemas: a "$ref" inside an enum is a string like any.
_DATA_KEYWORDS = frozenset({"const", "default", "enum", "examples"})


def reference_problem(schema: Any, what: str) -> str | None:
    """Why a reference of ``schema`` would not resolve inside it, or None."""
    anchors = {
        node["$anchor"] for node, _ in _schemas(schema) if isinstance(node.get("$anchor"), str)
    }
    for node, top in _schemas(schema):
        if isinstance(node.get("$id"), str) and not top:
            return (
                f"{what} declares $id {node['$id']!r} below its top, which changes what the "
                "references under it mean; only references within the one document resolve"
            )
        for keyword in _REFERENCES:
            reference = node.get(keyword)
            if not isinstance(reference, str):
                continue
            if not reference.startswith("#"):
                return (
                    f"{what} refers to {reference!r}, outside itself: nothing is fetched, so "
                    "no call could be checked against it"
                )
            if not _resolves(schema, reference[1:], anchors):
                return f"{what} refers to {reference!r}, which it does not hold"
    return None


def _schemas(schema: Any) -> Iterator[tuple[dict[str, Any], bool]]:
    """Every object of ``schema`` that is read as a schema, and whether it is the top."""
    pending: list[tuple[Any, bool]] = [(schema, True)]
    while pending:
        node, top = pending.pop()
        if isinstance(node, list):
            pending.extend((item, False) for item in node)
        elif isinstance(node, dict):
            yield node, top
            pending.extend(
                (value, False) for key, value in node.items() if key not in _DATA_KEYWORDS
            )


def _resolves(schema: Any, fragment: str, anchors: set[str]) -> bool:
    """Whether the fragment of a ``#…`` reference names a place in ``schema``."""
    fragment = unquote(fragment)
    if fragment == "":
        return True
    if not fragment.startswith("/"):
        return fragment in anchors
    node = schema
    for token in fragment[1:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and 0 <= _index(token) < len(node):
            node = node[_index(token)]
        else:
            return False
    return True


def _index(token: str) -> int:
    """The array index a JSON Pointer token names, else -1."""
    index = decimal_value(token)
    return -1 if index is None else index
