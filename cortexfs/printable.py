"""Text others control, made safe to show on a terminal (:func:`printable`).

Nothing but the standard library: ``ctx run`` (which starts without click) reports with it,
and so do programs built into the storage root (:mod:`cortexfs.tools.core.launcher`)."""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` safe to show on a terminal: every character that is not printable (a control
    character, which can start an escape sequence that retitles or rewrites the screen; a
    line break; a bidirectional override; a byte of a name that is not UTF-8) as its Python
    escape (``\\x1b``, ``\\u202e``, ``\\udcfe``).  For text others control: file names a
    group member planted, descriptions a manifest or an MCP server gave, error messages
    quoting either.  JSON output needs none of this: it escapes them already."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else _escaped(char) for char in text)


def _escaped(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
