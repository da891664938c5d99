"""``fs.list``: the entries of a directory inside the agent's visible mounts (SPEC R-5, T-2).

Input ``{"path": str = "."}``.  Native output ``{"path", "entries": [{"name", "type", "size"}]}``
in name order; ``type`` is ``file``, ``directory``, ``symlink`` or ``other`` (links are shown,
never followed).  Terminal output: one name per line, ``/`` after directories, ``@`` after links,
a character that is not printable as ``\\xHH`` of its bytes and a backslash doubled (``ls -b``);
bytes that are not UTF-8 as they are.
"""

from __future__ import annotations

import os
import stat

from cortexfs.tools.core import confine
from cortexfs.tools.core.toolio import Reply, core_main, main_parameter, require

_MARKS = {"directory": "/", "symlink": "@"}


def entry_type(status: os.stat_result) -> str:
    if stat.S_ISREG(status.st_mode):
        return "file"
    if stat.S_ISDIR(status.st_mode):
        return "directory"
    if stat.S_ISLNK(status.st_mode):
        return "symlink"
    return "other"


def list_directory(request: dict[str, object], native: bool) -> Reply:
    place = confine.View.from_environment(os.environ).locate(require(request, "path", str, "."))
    fd = confine.open_directory(place, listable=True)
    try:
        entries = []
        with confine.reporting(place):
            names = confine.listed(place, os.listdir(fd))
        for name in names:
            status = confine.lstat_at(fd, name)
            if status is not None:
                entries.append({"name": name, "type": entry_type(status), "size": status.st_size})
    finally:
        os.close(fd)
    text = "".join(f"{_shown(entry['name'])}{_MARKS.get(entry['type'], '')}\n" for entry in entries)
    return Reply({"path": str(place.view), "entries": entries}, text=os.fsencode(text))


def _shown(name: str) -> str:
    """``name`` as one line of the terminal listing: each control character (a line break, an
    escape) and every other character that is not printable as ``\\xHH`` of its UTF-8 bytes,
    a backslash doubled (as ``ls -b`` shows them), so that every name is one line that reads
    back unambiguously and sends nothing to the terminal; the bytes of a name that are not
    UTF-8 stay themselves, as the name went out (a caller passes them back as they are)."""
    if name.isprintable() and "\\" not in name:
        return name
    shown = []
    for char in name:
        if char == "\\":
            shown.append("\\\\")
        elif char.isprintable() or "\udc80" <= char <= "\udcff":
            shown.append(char)
        else:
            shown.extend(f"\\x{byte:02x}" for byte in char.encode("utf-8"))
    return "".join(shown)


def run() -> int:
    return core_main("fs.list", main_parameter("path"), list_directory)
