"""Text others control, made safe to show on a terminal (:func:`printable`).

Nothing but the standard library: ``ctx run`` (which starts without click) reports with it,
and so do programs built into the storage root (:mod:`cortexfs.tools.core.launcher`)."""

from __future__ import annotations

import shlex
from collections.abc import Iterable


def printable(text: str) -> str:
    """``text`` safe to show on a terminal: every character that is not printable (a control
    character, which can start an escape sequence that retitles or rewrites the screen; a
    line break; a bidirectional override; a byte of a name that is not UTF-8) as its Python
    escape (``\\x1b``, ``\\u202e``, ``\\udcfe``).  For text others control: file names a
    group member planted, descriptions a manifest or an MCP server gave, error messages
    quoting either.  JSON output escapes what JSON must; cortexfs.cli.common.terminal_json,
    which writes readable UTF-8, escapes the rest as JSON does (\\u009b)."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escaped(char) for char in text)


def printable_text(text: str) -> str:
    """:func:`printable` for a page of text: its line ends and tabs are kept, every other
    character that is not printable escaped."""
    return "\n".join("\t".join(map(printable, line.split("\t"))) for line in text.split("\n"))


def shell_word(word: str) -> str:
    """``word`` as a shell reads it back, for a command a message suggests: quoted as
    ``shlex.quote`` does while it is all printable, else in ANSI-C quotes (``$'a\\nb'``,
    which bash, zsh, ksh and POSIX.1-2024 shells read), each byte of a character that is not
    printable written ``\\xHH``, so that :func:`printable` leaves the suggestion as it is
    and, copied, it names the very path (a line break, an escape, a byte that is not UTF-8)."""
    if word.isprintable():
        return shlex.quote(word)
    spelled = []
    for char in word:
        if char.isprintable():
            spelled.append("\\" + char if char in "\\'" else char)
        else:
            spelled.extend(f"\\x{byte:02x}" for byte in char.encode("utf-8", "surrogateescape"))
    return "$'" + "".join(spelled) + "'"


def shell_words(words: Iterable[str]) -> str:
    """:func:`shell_word` of each of ``words``, joined with spaces: a command line."""
    return " ".join(shell_word(word) for word in words)


def shortened(word: str, shown: int = 64) -> str:
    """``word``, cut so that a message about a megabyte-long name or line stays one readable
    line, saying how long it was."""
    if len(word) <= shown:
        return word
    return f"{word[:shown]}… ({len(word)} characters)"


def quoted(word: str, shown: int = 64) -> str:
    """``repr(word)``, cut as :func:`shortened` cuts."""
    if len(word) <= shown:
        return repr(word)
    return f"{word[:shown]!r}… ({len(word)} characters)"


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
