"""What tsh keeps in memory about tools: loaded metadata and the tool-path cache (SPEC H-4).

* **The context** — the metadata (``description``, ``schema``, ``cap``) of the tools loaded
  into this tsh: by ``load`` and ``pin``, and by running a tool.  It holds at most
  ``max_loaded_tools`` unpinned tools; loading one more unloads the least recently used.
* **The tool-path cache** — NAME → the path ``CTX_PATH`` resolved it to, at most
  ``cache_capacity`` unpinned names under W-TinyLFU (:mod:`cortexfs.tools.tinylfu`), whose
  admission window is ``window_percent`` % of it.

Pinned tools are exempt from both: never unloaded, never evicted.  Neither part grants or
loads anything executable; they only spare lookups and keep descriptions at hand.

A cached path is a hint that is checked before use, so the cache never changes what T-4
resolves: CTX_PATH must be the same up to the directory that held the tool, the tool must
still be an executable regular file, and the name in every earlier directory must still be
no hit.  That last check looks at the name itself, not at its directory: a ``chmod +x`` of an
earlier file that was no hit changes neither the directory's inode nor its modification
time, and a directory's modification time moves in clock ticks of several milliseconds, so
a name added within the tick of the check would go unseen.  Otherwise the name is looked up
again.
"""

from __future__ import annotations

import errno
import json
import os
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from cortexfs.errors import CtxError
from cortexfs.regular_file import read_regular_file
from cortexfs.tools import ctxpath
from cortexfs.tools.core.tsh_config import DEFAULTS, MAX_CONFIG_BYTES, effective, problems
from cortexfs.tools.tinylfu import WTinyLFU

_MAX_CONTROL_BYTES = 64 * 1024  # a description or schema larger than this is not shown


class Resolution(NamedTuple):
    """Where a name resolved, and the search path up to the directory that held it."""

    path: str
    directories: tuple[str, ...]


class ToolInfo(NamedTuple):
    """A tool's metadata, from the ``.d/`` beside the executable that resolved (T-4)."""

    name: str
    path: str
    description: str
    schema: Any
    cap: Any

    def summary(self) -> str:
        first_line = self.description.strip().splitlines()[:1]
        return f"{self.name}: {first_line[0] if first_line else '(no description)'}"

    def to_json(self) -> dict[str, Any]:
        return self._asdict()


def read_settings(config: str) -> tuple[dict[str, int], list[str]]:
    """The effective settings of the config file at ``config`` and what is wrong with it;
    the defaults when it cannot be read (a standalone tsh may have no root around it).
    Read as a control is: never through a symlink, never waiting on a FIFO."""
    try:
        data = read_regular_file(config, MAX_CONFIG_BYTES)
    except OSError as exc:
        return unreadable_settings(config, exc)
    return settings_of(data)


def settings_of(data: bytes) -> tuple[dict[str, int], list[str]]:
    """The effective settings of a config file's ``data`` and what is wrong with its lines."""
    text = data.decode("utf-8", "replace")
    return effective(text), problems(text)


def unreadable_settings(config: str, exc: OSError) -> tuple[dict[str, int], list[str]]:
    """The defaults, for the config file at ``config`` that reading refused with ``exc``, and
    why, unless there is no such file."""
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return dict(DEFAULTS), []  # no config: every default, as H-4 gives them
    # Said, as a bad line is: tsh.config refuses the same file with its errno.
    why = _UNUSABLE.get(exc.errno, exc.strerror)
    return dict(DEFAULTS), [f"{config} cannot be read ({why}): every setting"]


_UNUSABLE = {
    errno.ELOOP: "a symbolic link, never followed",
    errno.EINVAL: "not a regular file",
    errno.EFBIG: f"larger than {MAX_CONFIG_BYTES} bytes",
}


_FAILING_FILESYSTEM = frozenset({errno.ENOTCONN, errno.EIO, errno.ESTALE})


class TshContext:
    """The loaded metadata and the tool-path cache of one tsh."""

    def __init__(self, settings: dict[str, int], search_path: Callable[[], list[str]]) -> None:
        self.max_loaded_tools = settings["max_loaded_tools"]
        self.paths: WTinyLFU[str, Resolution] = WTinyLFU(
            settings["cache_capacity"], settings["window_percent"]
        )
        self._search_path = search_path
        self._loaded: OrderedDict[str, ToolInfo] = OrderedDict()  # last = most recently used
        self._pinned: dict[str, ToolInfo] = {}

    # ------------------------------------------------------------------ the path cache

    def which(self, name: str) -> str | None:
        """The first executable regular file ``name`` on CTX_PATH (T-4), through the cache."""
        if "/" in name or name in ("", ".", ".."):
            return None
        directories = self._search_path()
        cached = self.paths.get(name)
        if cached is not None and _still_resolves(cached, directories):
            return cached.path
        found = _resolve(name, directories)
        if found is None:
            self.paths.discard(name)
        else:
            self.paths.put(name, found)  # a pinned name stays pinned, with its new path
        return None if found is None else found.path

    def unreachable(self) -> tuple[str, OSError] | None:
        """The first CTX_PATH directory whose filesystem fails to answer (``ENOTCONN`` of a
        view whose mount ended, ``EIO``, ``ESTALE``), with the error: a lookup finds nothing
        there, which would otherwise read as a name no tool has.  A directory missing or
        closed to this uid is no failure: it holds no tool of this user's."""
        for directory in self._search_path():
            try:
                os.stat(directory)
            except OSError as exc:
                if exc.errno in _FAILING_FILESYSTEM:
                    return directory, exc
        return None

    def rehash(self) -> None:
        """Forget every unpinned path (like a POSIX shell's ``hash -r``)."""
        self.paths.clear()

    # ------------------------------------------------------------------- the context

    def load(self, name: str) -> tuple[ToolInfo, list[str]]:
        """Load ``name``'s metadata (again, if it changed); it and the names this unloaded.

        LookupError when ``name`` is not a tool on CTX_PATH."""
        info = self._read(name)
        if name in self._pinned:
            self._pinned[name] = info
            return info, []
        self._loaded[name] = info
        self._loaded.move_to_end(name)
        return info, self._unload_beyond_limit()

    def pin(self, name: str) -> ToolInfo:
        """Load ``name`` and exempt it, and its path, from unload and eviction."""
        info = self._read(name)
        self._loaded.pop(name, None)
        self._pinned[name] = info
        resolution = self.paths.get(name)
        if resolution is not None:
            self.paths.pin(name, resolution)
        return info

    def unpin(self, name: str) -> list[str]:
        """Make ``name`` an ordinary loaded tool again; the names that unloads (KeyError when
        it was not pinned)."""
        self._loaded[name] = self._pinned.pop(name)
        self.paths.unpin(name)
        return self._unload_beyond_limit()

    def _read(self, name: str) -> ToolInfo:
        path = self.which(name)
        if path is None:
            raise LookupError(name)
        return read_tool_info(name, path)

    def _unload_beyond_limit(self) -> list[str]:
        """Unload the least recently used unpinned tools past ``max_loaded_tools``."""
        unloaded = []
        while len(self._loaded) > self.max_loaded_tools:
            oldest, _ = self._loaded.popitem(last=False)
            unloaded.append(oldest)
        return unloaded

    def unload(self, name: str) -> None:
        """Drop ``name``'s metadata (KeyError when it is not loaded, ValueError when pinned)."""
        if name in self._pinned:
            raise ValueError(name)
        del self._loaded[name]

    def loaded(self) -> list[tuple[ToolInfo, bool]]:
        """The context: pinned tools first, then the rest from the most recently used."""
        return [(info, True) for info in self._pinned.values()] + [
            (info, False) for info in reversed(self._loaded.values())
        ]


def _resolve(name: str, directories: list[str]) -> Resolution | None:
    """T-4's lookup (:func:`ctxpath.which`), with the search path up to the hit."""
    paths = [Path(directory) for directory in directories]
    try:
        found = ctxpath.which(name, paths)
    except CtxError:
        return None  # not an object name: no tool can have it
    if found is None:
        return None
    upto = paths.index(found.directory) + 1
    return Resolution(str(found.directory / name), tuple(directories[:upto]))


def _still_resolves(cached: Resolution, directories: list[str]) -> bool:
    """Whether T-4 would find the cached path now: the same search path up to it, no earlier
    directory holding a hit (looked at name by name), and the path itself still a hit."""
    if list(cached.directories) != directories[: len(cached.directories)]:
        return False  # CTX_PATH itself changed
    name = os.path.basename(cached.path)
    found = ctxpath.which(name, [Path(directory) for directory in cached.directories])
    return found is not None and str(found.executable) == cached.path


def read_tool_info(name: str, path: str) -> ToolInfo:
    """``description``, ``schema`` and ``cap`` from ``<dir>/<name>.d/`` (T-4): what a human
    may read of a tool (H-2).  A missing or unreadable control reads as empty."""
    controls = os.path.join(os.path.dirname(path), f"{name}.d")
    return ToolInfo(
        name=name,
        path=path,
        description=_read_control(controls, "description") or "",
        schema=_json_control(controls, "schema"),
        cap=_json_control(controls, "cap"),
    )


def _read_control(controls: str, control: str) -> str | None:
    """A control's text; None when it is not a regular file of the tool's own ``.d/`` (a
    link, a FIFO, a directory), cannot be read, or is too large."""
    try:
        data = read_regular_file(os.path.join(controls, control), _MAX_CONTROL_BYTES)
    except OSError:
        return None
    return data.decode("utf-8", "replace")


def _json_control(controls: str, control: str) -> Any:
    return json_or_none(_read_control(controls, control))


def json_or_none(text: str | None) -> Any:
    """The JSON value of a control's ``text``; None when it was not read or is not JSON (a
    listing shows such a tool without its schema or cap rather than failing)."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # nested past what the parser recurses through
        return None
