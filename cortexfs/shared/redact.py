"""What logs and events may say about a call: facts and errors, not secrets or long text (S-4).

The rule, applied to every input, argv and output summary before it reaches ``events.jsonl``
or an object's ``log`` (docs/sessions.md states it for users):

* a value under a key that names a secret — after lower-casing and dropping everything but
  letters and digits, the key contains ``password``, ``passwd``, ``passphrase``, ``secret``,
  ``token``, ``apikey``, ``authorization``, ``credential``, ``privatekey`` or ``cookie`` — is
  replaced by ``"[redacted]"``;
* a string that looks like a credential whatever its key (``Bearer …``/``Basic …``
  authorisation values, PEM private keys) is replaced by ``"[redacted]"``;
* in an argv, ``--token=X`` / ``TOKEN=X`` keep the key and lose the value, and the word after a
  secret-naming option (``--password X``) is redacted;
* a string longer than :data:`MAX_TEXT` characters keeps its first :data:`MAX_TEXT` and says
  how many it dropped; a list keeps :data:`MAX_ITEMS` items; nesting deeper than
  :data:`MAX_DEPTH` is elided;
* a summary whose JSON is still longer than :data:`MAX_SUMMARY_BYTES` is replaced by a note
  of its size, so one event stays one short line.

Policy v0 has no class for logging, so this rule holds for every caller; a tool that needs
the whole payload recorded writes it to a file of its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

REDACTED = "[redacted]"
MAX_TEXT = 200
MAX_ITEMS = 20
MAX_DEPTH = 6
MAX_SUMMARY_BYTES = 8 * 1024

_SECRET_WORDS = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "apikey",
    "authorization",
    "credential",
    "privatekey",
    "cookie",
)
_CREDENTIAL_VALUE = re.compile(
    r"\s*(?:(?:bearer|basic)\s+\S+|-----BEGIN [A-Z ]*PRIVATE KEY-----)", re.IGNORECASE
)
_KEY_CHARACTERS = re.compile(r"[^a-z0-9]")


def is_secret_key(key: str) -> bool:
    normalised = _KEY_CHARACTERS.sub("", key.lower())
    return any(word in normalised for word in _SECRET_WORDS)


def bounded_summary(value: Any) -> Any:
    """:func:`summarize`, then a size note instead when even that is too long."""
    summary = summarize(value)
    size = len(json.dumps(summary, ensure_ascii=False))
    return summary if size <= MAX_SUMMARY_BYTES else f"[summary of {size} bytes elided]"


def summarize(value: Any, depth: int = 0) -> Any:
    """A JSON value safe to log: secrets redacted, long strings and lists shortened."""
    if isinstance(value, str):
        return _short_text(value)
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return f"[{len(value)} keys elided]"
        return {
            str(key): REDACTED if is_secret_key(str(key)) else summarize(item, depth + 1)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        if depth >= MAX_DEPTH:
            return [f"[{len(value)} items elided]"]
        kept = [summarize(item, depth + 1) for item in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            kept.append(f"[+{len(value) - MAX_ITEMS} items]")
        return kept
    if value is None or isinstance(value, bool | int | float):
        return value
    return _short_text(str(value))


def summarize_argv(argv: Sequence[str]) -> list[str]:
    """An argv safe to log: secret option values redacted, long words shortened."""
    kept: list[str] = []
    hide_next = False
    for word in argv[:MAX_ITEMS]:
        if hide_next:
            kept.append(REDACTED)
            hide_next = False
            continue
        key, equals, _ = word.partition("=")
        if equals and is_secret_key(key):
            kept.append(f"{key}={REDACTED}")
        elif word.startswith("-") and is_secret_key(word):
            kept.append(word)
            hide_next = True
        else:
            kept.append(_short_text(word))
    if len(argv) > MAX_ITEMS:
        kept.append(f"[+{len(argv) - MAX_ITEMS} words]")
    return kept


def _short_text(text: str) -> str:
    if _CREDENTIAL_VALUE.match(text):
        return REDACTED
    if len(text) <= MAX_TEXT:
        return text
    return f"{text[:MAX_TEXT]}…[+{len(text) - MAX_TEXT} chars]"
