"""A schema's ``pattern`` with the meaning JSON Schema gives it, run by Python's ``re``
(SPEC T-1; docs/tools.md, *How an input is checked*).

JSON Schema's patterns are ECMA-262 regular expressions.  Python's ``re`` reads most of one
the same way, but not where a tool author keeps an input to one line or to ASCII digits:
``$`` also matches before a last newline, ``\\d`` and ``\\w`` take any Unicode digit and
letter, ``.`` takes a carriage return and the Unicode line and paragraph separators, and
``\\s`` misses the byte order mark and takes the separators U+001C to U+001F.
:func:`python_pattern` rewrites a pattern into the Python pattern of ECMA-262's meaning,
which both checkers (the schema subset and jsonschema) then run:

* the whole pattern is scoped ASCII (``(?a:…)``): ``\\d``, ``\\w`` and ``\\b`` as ECMA-262;
* ``$`` outside a class is ``\\Z``, the end of the text only;
* ``.`` outside a class is every character but the four line terminators;
* ``\\s`` is ECMA-262's white space and line terminators (``\\S`` outside a class too);
* ``(?<name>…)`` and ``\\k<name>`` are Python's ``(?P<name>…)`` and ``(?P=name)``;
* ``\\u{1F600}`` is the code point, ``\\cJ`` the control character;
* ``[]`` matches nothing and ``[^]`` any character; a ``[`` inside a class is itself.

Anything else is kept as written, so a schema written for Python's reading (``\\Z``,
``(?P<n>…)``, leading flags ``(?i)``, ``(?m)``, ``(?s)``, ``(?x)``) means what it meant.
``\\S`` inside a class keeps Python's ASCII meaning.
"""

from __future__ import annotations

import functools
import re
import sys

# ECMA-262 WhiteSpace and LineTerminator (ECMAScript 2023, 12.2 and 12.3), as class members.
_WHITE = "\\t\\n\\v\\f\\r \\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"
_NOT_A_LINE_END = "[^\\n\\r\\u2028\\u2029]"
_ESCAPE = re.compile(
    r"\\(?:k<(?P<name>[A-Za-z_][A-Za-z0-9_]*)>|u\{(?P<code>[0-9A-Fa-f]{1,6})\}"
    r"|c(?P<control>[A-Za-z])|(?P<other>.))",
    re.DOTALL,
)
# Members Python reads as set operations to come (a FutureWarning now): literal in ECMA-262.
_LITERAL_IN_CLASS = frozenset("[&~|")


# Each rewritten pattern and the pattern written, for the messages that quote one.
_WRITTEN: dict[str, str] = {}


def written(python: str) -> str:
    """The pattern a schema holds, of a :func:`python_pattern` run; itself when unknown."""
    return _WRITTEN.get(python, python)


@functools.lru_cache(maxsize=1024)
def python_pattern(pattern: str) -> str:
    """The Python pattern that matches what ECMA-262 matches with ``pattern``."""
    # Python's global flags, which only lead a pattern, become flags of the scope: a pattern
    # stays one group, which jsonschema may join to others with "|".  ASCII is not theirs
    # to change.
    leading = re.match(r"(?:\(\?[aiLmsux]+\))*", pattern)[0]  # type: ignore[index]
    flags = "".join(sorted(set(leading) & set("imsx")))
    out: list[str] = []
    in_class = False
    i = len(leading)
    while i < len(pattern):
        char = pattern[i]
        escape = _ESCAPE.match(pattern, i)
        if escape:
            out.append(_python_escape(escape, in_class))
            i = escape.end()
            continue
        if in_class:
            if char == "]":
                in_class = False
            out.append("\\" + char if char in _LITERAL_IN_CLASS else char)
        elif char == "[":
            opening = "[^" if pattern.startswith("[^", i) else "["
            if pattern.startswith("]", i + len(opening)):
                out.append("(?!)" if opening == "[" else "(?s:.)")
                i += len(opening) + 1
                continue
            out.append(opening)
            in_class = True
            i += len(opening)
            continue
        elif char == "$":
            out.append("\\Z")
        elif char == ".":
            out.append(_NOT_A_LINE_END)
        elif pattern.startswith("(?<", i) and not pattern.startswith(("(?<=", "(?<!"), i):
            out.append("(?P<")
            i += 3
            continue
        else:
            out.append(char)
        i += 1
    python = f"(?a{flags}:" + "".join(out) + ")"
    if len(_WRITTEN) < 4096:  # the patterns of a few hundred schemas
        _WRITTEN[python] = pattern
    return python


def _python_escape(escape: re.Match[str], in_class: bool) -> str:
    """The Python spelling of one escape of an ECMA-262 pattern."""
    if escape["name"] and not in_class:
        return f"(?P={escape['name']})"
    if escape["code"] and int(escape["code"], 16) <= sys.maxunicode:
        return f"\\U{int(escape['code'], 16):08x}"
    if escape["control"]:
        return f"\\x{ord(escape['control']) % 32:02x}"
    if escape["other"] == "s":
        return _WHITE if in_class else f"[{_WHITE}]"
    if escape["other"] == "S" and not in_class:
        return f"[^{_WHITE}]"
    return escape[0]


@functools.lru_cache(maxsize=1024)
def compiled(pattern: str) -> re.Pattern[str]:
    """:func:`python_pattern` of ``pattern``, compiled; ``re.error`` when it is no pattern,
    or one ``re`` cannot compile: a repeat count past its limit (``a{4294967296}``) raises
    OverflowError, groups nested past the interpreter's recursion limit RecursionError, and
    every caller judges a pattern by ``re.error`` alone."""
    try:
        return re.compile(python_pattern(pattern))
    except OverflowError as exc:
        raise re.error(f"too large to compile: {exc}") from None
    except RecursionError:
        raise re.error("too large to compile: its groups are nested too deep") from None
