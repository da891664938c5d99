"""``fs.stat``: facts about one entry inside the agent's visible mounts (SPEC R-5, T-2).

Input ``{"path": str}``.  Native output ``{"path", "type", "size", "mode", "uid", "gid",
"mtime"}``; a symbolic link is described as a link, never followed.  Terminal output: one
``key: value`` line per fact.
"""

from __future__ import annotations

import errno
import os
import stat

from cortexfs.timefmt import file_time
from cortexfs.tools.core import confine
from cortexfs.tools.core.fs_list import entry_type
from cortexfs.tools.core.toolio import Reply, ToolFailure, core_main, main_parameter, require


def stat_entry(request: dict[str, object], native: bool) -> Reply:
    place = confine.View.from_environment(os.environ).locate(require(request, "path", str))
    if place.parts:
        parent = confine.open_parent(place)
        try:
            # A directory on the way the agent may not search refuses the look (EACCES):
            # named by its view path, as the walk to it names every other refusal.
            with confine.reporting(place):
                status = confine.lstat_at(parent, place.name)
        finally:
            os.close(parent)
    else:
        fd = confine.open_directory(place)
        try:
            status = os.fstat(fd)
        finally:
            os.close(fd)
    if status is None:
        raise ToolFailure(errno.ENOENT, f"{place.view} does not exist")
    confine.refuse_file_named_as_directory(place, status)
    facts = {
        "path": str(place.view),
        "type": entry_type(status),
        "size": status.st_size,
        "mode": f"{stat.S_IMODE(status.st_mode):04o}",
        "uid": status.st_uid,
        "gid": status.st_gid,
        "mtime": file_time(status.st_mtime_ns),  # None beyond RFC 3339's years 1 to 9999
    }
    shown = {**facts, "mtime": facts["mtime"] or "a time beyond years 1 to 9999"}
    text = "".join(f"{key}: {value}\n" for key, value in shown.items())
    return Reply(facts, text=os.fsencode(text))


def run() -> int:
    return core_main("fs.stat", main_parameter("path"), stat_entry)
