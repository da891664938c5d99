"""JSON text as CortexFS reads and writes it.

Reading (:func:`loads_strict`).  Python's reader accepts two things other readers do not agree
on: a name given twice in one object (Python keeps the last value, others keep the first) and
``NaN``/``Infinity`` (JSON has no such numbers).  A request, manifest or agent request holding
either would be one document here and another to the next reader — a reviewer could approve
one tool or label while a program gets the other — so both are refused.

Writing (:func:`dumps_utf8`).  Text is written as UTF-8, except in a document holding a lone
surrogate, which UTF-8 cannot hold: valid JSON as an escape (``"\\ud800"``), and how Python
spells a byte of a file name that is not UTF-8 (``"\\udcff"`` for 0xff).  That document is
written with every non-ASCII character escaped, so that the value comes back as it went out.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


class NotAJsonNumber(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity``: Python's json reads them, JSON has none."""


class DuplicateNames(ValueError):
    """Names given twice in one JSON object (``names``, in the order they were met)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(names)
        self.names = names


def loads_strict(data: str | bytes, *, unique_names: bool = True) -> Any:
    """``json.loads``, refusing NaN and the infinities (:class:`NotAJsonNumber`) and, unless
    ``unique_names`` is false, a name given twice in one object (:class:`DuplicateNames`, with
    every such name).  Malformed JSON is :class:`json.JSONDecodeError`, as ever."""
    duplicates: list[str] = []

    def noting_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        document: dict[str, Any] = {}
        for name, value in pairs:
            if name in document and name not in duplicates:
                duplicates.append(name)
            document[name] = value
        return document

    hook = noting_duplicates if unique_names else None
    value = json.loads(data, parse_constant=_refuse_constant, object_pairs_hook=hook)
    if duplicates:
        raise DuplicateNames(duplicates)
    return value


def _refuse_constant(name: str) -> Any:
    raise NotAJsonNumber(name)


def duplicate_names_problem(names: list[str]) -> str:
    """What is wrong with a document that gives ``names`` twice, to follow its subject:
    ``gives the name 'exec' twice in one object; …``."""
    listed = ", ".join(repr(name) for name in names)
    noun = "name" if len(names) == 1 else "names"
    return (
        f"gives the {noun} {listed} twice in one object; JSON readers disagree on which one "
        "counts, so give each name once"
    )


def dumps_utf8(
    value: Any,
    *,
    separators: tuple[str, str] | None = None,
    default: Callable[[Any], Any] | None = None,
    allow_nan: bool = True,
) -> bytes:
    """``value`` as JSON in UTF-8, all escaped when it holds a lone surrogate (see above).
    ``allow_nan=False`` raises ValueError for NaN and the infinities, as ``json.dumps``."""
    options: dict[str, Any] = {"separators": separators, "default": default, "allow_nan": allow_nan}
    text = json.dumps(value, ensure_ascii=False, **options)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(value, **options).encode()
