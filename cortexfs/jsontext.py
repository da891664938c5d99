"""JSON text as CortexFS reads and writes it.

Reading (:func:`loads_strict`).  Python's reader accepts two things other readers do not agree
on: a name given twice in one object (Python keeps the last value, others keep the first) and
``NaN``/``Infinity`` (JSON has no such numbers).  A request, manifest or agent request holding
either would be one document here and another to the next reader — a reviewer could approve
one tool or label while a program gets the other — so both are refused.  So are numbers
beyond a float (``1e999``, which Python reads as infinity) and integers of more digits than
Python converts, and documents nested deeper than :data:`MAX_DEPTH`: whatever reads such a
document next — a re-encoding, a schema check, another language's reader — may fail on it
where we accepted it.

Writing (:func:`dumps_utf8`).  Text is written as UTF-8, except in a document holding a lone
surrogate, which UTF-8 cannot hold: valid JSON as an escape (``"\\ud800"``), and how Python
spells a byte of a file name that is not UTF-8 (``"\\udcff"`` for 0xff).  That document is
written with every non-ASCII character escaped, so that the value comes back as it went out.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from typing import Any


class NotAJsonNumber(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity``: Python's json reads them, JSON has none."""


class DuplicateNames(ValueError):
    """Names given twice in one JSON object (``names``, in the order they were met)."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(names)
        self.names = names


# How deeply arrays and objects may nest: serde_json's default recursion limit.  Deep enough
# for any document a person or a program means to write, and far from the interpreter's
# recursion limit, which the reader, the writer and a schema check all spend a frame of per
# level (or several).
MAX_DEPTH = 128


def loads_strict(
    data: str | bytes, *, unique_names: bool = True, max_depth: int = MAX_DEPTH
) -> Any:
    """``json.loads``, refusing NaN, the infinities and numbers beyond a float
    (:class:`NotAJsonNumber`) and, unless ``unique_names`` is false, a name given twice in one
    object (:class:`DuplicateNames`, with every such name).  Malformed JSON is
    :class:`json.JSONDecodeError`, as ever, and so are a document nested deeper than
    ``max_depth`` (:data:`MAX_DEPTH` unless told: a message that carries documents, an MCP
    server's, may allow them more room, as long as the interpreter can read it) and an integer
    of more digits than Python converts."""
    duplicates: list[str] = []

    def noting_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        document: dict[str, Any] = {}
        for name, value in pairs:
            if name in document and name not in duplicates:
                duplicates.append(name)
            document[name] = value
        return document

    hook = noting_duplicates if unique_names else None
    if isinstance(data, bytes | bytearray):
        # JSON between programs is UTF-8 (RFC 8259, 8.1), a byte order mark before it
        # ignored as json.loads ignores it; json.loads would also take bytes that look like
        # UTF-16 or UTF-32 for such a text, which no other reader does.
        data = bytes(data).decode("utf-8-sig")
    try:
        value = json.loads(
            data, parse_constant=_refuse_constant, parse_float=_finite, object_pairs_hook=hook
        )
    except RecursionError:
        raise _too_deep(data, max_depth) from None
    except (UnicodeDecodeError, json.JSONDecodeError, NotAJsonNumber):
        raise
    except ValueError:  # int() refuses that many digits
        digits = sys.get_int_max_str_digits()
        problem = f"an integer of more than {digits} digits, more than Python reads"
        text = _text(data)
        raise json.JSONDecodeError(problem, text, _long_integer_at(text, digits)) from None
    if duplicates:
        raise DuplicateNames(duplicates)
    if nested_deeper(value, max_depth):
        raise _too_deep(data, max_depth)
    return value


def _long_integer_at(text: str, digits: int) -> int:
    """Where the first number of more than ``digits`` digits starts in ``text``, strings
    passed over (0 when none is found: the error then points at the document)."""
    pattern = re.compile(rf'"(?:[^"\\]|\\.)*"|(-?[0-9]{{{digits + 1},}})')
    for found in pattern.finditer(text):
        if found.group(1) is not None:
            return found.start(1)
    return 0


def loads_text(data: bytes) -> Any:
    """:func:`loads_strict` of a file's bytes read as UTF-8 text (a byte-order mark allowed),
    for a small control a person may have to repair; ValueError with a reason in plain words.

    Decoded here rather than by ``json.loads``, which takes bytes holding a NUL for UTF-16 or
    UTF-32 and would then blame a codec for a file that is merely damaged."""
    nul = data.find(b"\0")
    if nul >= 0:
        raise ValueError(f"it holds a NUL byte (byte {nul}), so it is not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"byte {exc.start} is not UTF-8 text") from None
    if not text.strip():
        raise ValueError("it is empty")
    try:
        # As strictly as a manifest is checked: a control that another reader would take
        # for another document (NaN, a name given twice) is no more valid on disk.
        return loads_strict(text)
    except DuplicateNames as exc:
        raise ValueError(f"it {duplicate_names_problem(exc.names)}") from None
    except NotAJsonNumber as exc:
        raise ValueError(f"{exc} is not a JSON number") from None
    except json.JSONDecodeError as exc:
        # Python's message for a control character ends in "at" already.
        problem = exc.msg.removesuffix(" at")
        raise ValueError(f"{problem} at line {exc.lineno}, column {exc.colno}") from None


def _refuse_constant(name: str) -> Any:
    raise NotAJsonNumber(name)


def _finite(spelling: str) -> float:
    number = float(spelling)
    if math.isinf(number):
        raise NotAJsonNumber(f"{spelling} (beyond the largest float)")
    return number


def nested_deeper(value: Any, limit: int) -> bool:
    """Whether ``value`` has arrays or objects more than ``limit`` levels deep (iteratively:
    the point is not to recurse)."""
    level: list[Any] = [value] if isinstance(value, dict | list) else []
    for _ in range(limit):
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, dict | list)
        ]
        if not level:
            return False
    return True


def _too_deep(data: str | bytes, limit: int) -> json.JSONDecodeError:
    """The error for a document nested deeper than ``limit``, at the bracket that opens the
    first level too many."""
    text = _text(data)
    message = f"nested deeper than {limit} levels"
    return json.JSONDecodeError(message, text, _first_bracket_too_deep(text, limit))


def _first_bracket_too_deep(text: str, limit: int) -> int:
    depth, in_string, escaped = 0, False, False
    for position, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return position
        elif char in "]}":
            depth -= 1
    return 0


def _text(data: str | bytes) -> str:
    return data if isinstance(data, str) else data.decode("utf-8", "replace")


def lone_surrogate(value: Any) -> str | None:
    """The first lone surrogate in a name or string of the JSON value ``value``, or None.
    JSON can spell one (``"\\ud800"``), but it is no character: no UTF-8 text holds it.
    Iterative, as :func:`nested_deeper`."""
    pending = [value]
    while pending:
        item = pending.pop()
        texts = [item] if isinstance(item, str) else item.keys() if isinstance(item, dict) else ()
        for text in texts:
            try:
                text.encode()
            except UnicodeEncodeError as exc:
                return text[exc.start]
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return None


def shown_as_text(value: Any) -> Any:
    """``value`` with each lone surrogate of its strings and names replaced by the text of
    its escape (``\\ud800``, six characters): for words of others that are shown (an MCP
    server's names and descriptions), not taken back, in output a strict reader of another
    language takes."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, dict):
        return {shown_as_text(key): shown_as_text(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shown_as_text(item) for item in value]
    return value


def spelt(value: Any, shown: int = 80) -> str:
    """``value`` as JSON spells it, for a message about a JSON document: ``true``, ``null``,
    ``["/tmp"]``, where Python's repr would say ``True``, ``None``, ``['/tmp']``, which the
    document's writer never wrote.  Compact, cut to ``shown`` characters."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=repr)
    return text if len(text) <= shown else text[: shown - 3] + "..."


def what_it_is(value: Any) -> str:
    """A parsed JSON value's type as JSON names it, with its article (``an array``,
    ``null``), for a message about a document of the wrong shape: Python's names (``list``,
    ``NoneType``) mean nothing to whoever wrote the JSON."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def not_a_json_number_problem(spelling: object) -> str:
    """What is wrong with a document holding ``spelling`` (``NaN``, ``1e999``, or words for
    them) as a number, to follow ``it``: ``holds NaN, which JSON has no number for``."""
    return f"holds {spelling}, which JSON has no number for"


def duplicate_names_problem(names: list[str], where: str = "in one object") -> str:
    """What is wrong with a document that gives ``names`` twice, to follow its subject:
    ``gives the name 'exec' twice in one object; …``."""
    listed = ", ".join(repr(name) for name in names)
    noun = "name" if len(names) == 1 else "names"
    return (
        f"gives the {noun} {listed} twice {where}; JSON readers disagree on which one "
        "counts, so give each name once"
    )


class Unwritable(ValueError):
    """A value :func:`dumps_document` cannot write as a document strict readers take back;
    the message says why, to follow ``it``: ``refers to itself …``."""


def dumps_document(
    value: Any,
    *,
    separators: tuple[str, str] | None = None,
    default: Callable[[Any], Any] | None = None,
    max_depth: int | None = MAX_DEPTH,
) -> bytes:
    """:func:`dumps_utf8` of a value that :func:`loads_strict` will read back as it is, else
    :class:`Unwritable`: NaN or an infinity, an integer of more digits than Python reads, a
    value that holds itself, or one nested deeper than ``max_depth`` (None: as deep as the
    interpreter can write).  ``default`` as for ``json.dumps``."""
    too_deep = "is nested deeper than " + (
        f"{max_depth} levels" if max_depth is not None else "Python can write"
    )
    try:
        data = dumps_utf8(value, separators=separators, default=default, allow_nan=False)
    except RecursionError:
        raise Unwritable(too_deep) from None
    except ValueError as exc:
        raise Unwritable(_unwritable_problem(exc)) from None
    deeper, twice = _shape(value, max_depth)
    if deeper:
        raise Unwritable(too_deep)
    if twice:
        where = "in one object once its keys are written as text"
        raise Unwritable(duplicate_names_problem(twice, where))
    return data


def _shape(value: Any, max_depth: int | None) -> tuple[bool, list[str]]:
    """In one walk of ``value``, level by level (iteratively: the point is not to recurse):
    whether it nests deeper than ``max_depth`` (None: no bound), as :func:`nested_deeper`
    says of a bound of 1 or more, and the names an object of it gives twice once
    ``json.dumps`` has written its keys as text (``{1: …, "1": …}``, ``{True: …, "true":
    …}``), in the order met; only an object with a key that is no str can."""
    twice: list[str] = []
    level: list[Any] = [value] if isinstance(value, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if max_depth is not None and depth > max_depth:
            return True, twice
        below: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                if not all(type(key) is str for key in item):
                    seen: set[str] = set()
                    for name in map(_name_written, item):
                        if name in seen and name not in twice:
                            twice.append(name)
                        seen.add(name)
                children = item.values()
            else:
                children = item
            below.extend(child for child in children if isinstance(child, dict | list))
        level = below
    return False, twice


def _name_written(key: Any) -> str:
    """The name ``json.dumps`` writes for an object's key (a str, number, bool or None)."""
    return key if isinstance(key, str) else json.dumps(key)


def _unwritable_problem(refusal: ValueError) -> str:
    """Why ``json.dumps`` refused a value, from its message (CPython's own words)."""
    said = str(refusal)
    if said.startswith("Circular reference"):
        return "refers to itself (a circular reference), which no JSON document can hold"
    if "digits" in said:
        digits = sys.get_int_max_str_digits()
        return f"holds an integer of more than {digits} digits, more than Python reads"
    return not_a_json_number_problem("a NaN or infinite number")


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
