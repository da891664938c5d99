"""What a message about a call may not quote: the values the summary of the call's input or
argv hid (docs/sessions.md, "in a message about the call").

A tool's error, a schema's refusal or a hook's message may quote what the call was given: a
schema refuses the value at ``/passwords/0`` by quoting it, a failing tool prints
``json.dumps`` of its input.  :func:`hidden_values` collects what the input's summary
(:func:`cortexfs.shared.redact.summarize`) redacted, whole values and parts of texts alike,
and :func:`without_hidden` takes each out of a message, as it is and as JSON or Python spell
it, before the message is logged.
"""

from __future__ import annotations

import json
import re
from typing import Any

from cortexfs.shared.redact import summarize
from cortexfs.shared.secret_keys import REDACTED

# A value shorter than this is not looked for in a message: replacing every "1" or "id" of a
# message would garble it, and no password is that short.
_SHORTEST_HIDDEN = 3


def hidden_values(value: Any) -> frozenset[str]:
    """The texts of ``value`` (a call's input, or its argv) that its summary redacts, whole
    values and parts of texts alike, as a message would quote them: a schema's refusal of the
    value at ``/passwords/0`` quotes that value, which :func:`without_hidden` then takes out
    of the message before it is logged, as the input's summary took it out of the input."""
    found: set[str] = set()
    _hidden_in(value, summarize(value), found)
    return frozenset(text for text in found if len(text) >= _SHORTEST_HIDDEN)


def without_hidden(text: str, hidden: frozenset[str]) -> str:
    """``text`` with every value of ``hidden`` (:func:`hidden_values`) replaced, as it is and
    as a program that reports its input writes it.

    Every character any occurrence covers goes, and a run of them becomes one ``[redacted]``:
    replacing one value after another would leave of two overlapping values (``abcd`` and
    ``bcde`` in ``abcde``) what the first replacement cut out of the second, and which that
    is would depend on the order the values came in."""
    spellings = {spelling for value in hidden for spelling in _spellings(value) if spelling}
    found: list[tuple[int, int]] = []
    for spelling in spellings:
        at = text.find(spelling)
        while at != -1:
            found.append((at, at + len(spelling)))
            at = text.find(spelling, at + 1)
    pieces: list[str] = []
    kept_from = 0  # where the text not yet copied or covered begins
    for start, end in sorted(found):
        if start > kept_from or not pieces:
            pieces += [text[kept_from:start], REDACTED]
        kept_from = max(kept_from, end)
    return "".join([*pieces, text[kept_from:]])


def _spellings(value: str) -> set[str]:
    """``value`` as it is, and as JSON (``\\u00fc`` for ``ü`` unless written as UTF-8, ``\\"``
    for ``"``) and Python's ``repr`` and ``ascii`` write it between their quotes: a tool that
    fails printing ``json.dumps`` of what it was given quotes a password so."""
    return {
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        repr(value)[1:-1],
        ascii(value)[1:-1],
    }


def _hidden_in(value: Any, summary: Any, found: set[str]) -> None:
    """Add to ``found`` what of ``value`` its ``summary`` (:func:`summarize` of it) redacted,
    walking the two side by side: a summary keeps the order of keys and items."""
    if summary == REDACTED and value != REDACTED:
        found.update(_texts_of(value))
    elif isinstance(value, dict) and isinstance(summary, dict):
        for item, said in zip(value.values(), summary.values(), strict=False):
            _hidden_in(item, said, found)
    elif isinstance(value, list | tuple) and isinstance(summary, list):
        for item, said in zip(value, summary, strict=False):
            _hidden_in(item, said, found)
    elif isinstance(value, str) and isinstance(summary, str) and REDACTED in summary:
        found.update(_redacted_parts(value, summary))


# The note :func:`_short_text` ends a text it cut with, and the redactions of a summary (two
# side by side are one: nothing kept between them tells where the first ended).
_CUT_NOTE = re.compile(r"…\[\+[0-9]+ chars\]\Z")
_REDACTIONS = re.compile(r"(?:\[redacted\])+")


def _redacted_parts(text: str, summary: str) -> list[str]:
    """What of ``text`` its ``summary`` replaced by ``[redacted]``, wherever it stood: an argv
    word's value (``--password=[redacted]``), and a secret amid a text (``deploy --token
    [redacted] --verbose``), which a message may quote as well.

    The summary is ``text`` with parts replaced, so what it kept between two redactions is
    found again in ``text``, in order, and what lies between is a part it hid, without the
    blanks around it, as a message quotes it.  What a cut summary's last redaction hid up to
    the cut is not known, and a text kept without its terminal's control sequences
    (:func:`redact_text`) is not found in order: what is not found is not guessed."""
    cut = _CUT_NOTE.search(summary)
    first, *between, last = _REDACTIONS.split(summary[: cut.start()] if cut else summary)
    if not text.startswith(first):
        return []
    parts, position = [], len(first)
    for kept in between:
        end = text.find(kept, position)
        if end < 0:
            break
        parts.append(text[position:end])
        position = end + len(kept)
    else:
        if cut:
            end = text.find(last, position) if last else -1
        else:
            end = len(text) - len(last) if text.endswith(last) else -1
        if end >= position:
            parts.append(text[position:end])
    return [part.strip() for part in parts if part.strip() not in ("", REDACTED)]


def _texts_of(value: Any) -> list[str]:
    """The scalars of ``value`` as a message would quote them."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int | float):
        return [json.dumps(value)]
    if isinstance(value, dict):
        return [text for item in value.values() for text in _texts_of(item)]
    if isinstance(value, list | tuple):
        return [text for item in value for text in _texts_of(item)]
    return []
