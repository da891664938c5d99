"""What stands at a core tool's name in a storage root: bootstrap's install of this version,
of another version, or an administrator's own tool (SPEC R-5).

Two questions are answered here without installing anything:

* **Whose is the tool at a core name?**  A name becomes core in some version of ctx; before
  it, an administrator may have installed a tool of their own under it in the system tier.
  Its ``origin`` control names the manifest it was installed from: bootstrap installs from
  ``cortexfs/tools/core/manifests/<name>.json`` (of whichever installed package or source
  tree), an administrator from a manifest of their own.  Only that evidence makes a tool the
  administrator's (:func:`administrators_manifest`): a missing or unreadable ``origin``, or
  a missing executable, is what a crash leaves of bootstrap's own install, and bootstrap
  repairs it.
* **Were the core tools installed by this ctx?**  (:func:`tools_of_another_version`.)  The
  runner hands a core tool its context in the shape this version writes; a tool copied by
  an older bootstrap may read another shape and fail every call.  A core tool is a zip
  application (:mod:`cortexfs.tools.core.launcher`) whose second line stamps the digest of
  its interpreter line, its module and every file it bundles: its first two lines are read
  and compared with the stamp of this version's sources, and a launcher without a stamp
  (every one before it) is another version's.  That costs a millisecond or two, without
  opening the archive, so a worker can ask at start and ``ctx run`` at each call of a core
  tool; bootstrap itself also checks every byte of the archive against the digest the
  stamp ends with (``bootstrap._is_current``).
* **Is a core tool damaged inside its archive?**  (:func:`damaged_core_launcher`.)  The stamp
  does not show it; the runner asks only after a call of a core tool ended by a signal that
  damaged bytecode causes, since reading the whole launcher is what a call that works must not
  pay.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Collection
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from cortexfs import jsontext
from cortexfs.errors import HOST_SHORTAGES, CtxError
from cortexfs.tools.controls import ToolObject, read_control
from cortexfs.tools.core import CORE_TOOLS
from cortexfs.tools.core.launcher import (
    STAMPED_HEAD_BYTES,
    bundled_sources,
    carries_bytecode,
    core_interpreter,
    damaged_archive,
    interpreter_line,
    package_parent,
    read_stamp,
    resized_since_stamped,
    sources_digest,
    stamp,
)

if TYPE_CHECKING:
    # Only named: the runner asks require_this_versions_tool at each call of a core tool, and
    # ctx run, one process a call, would pay tens of milliseconds to import the installer.
    from cortexfs.tools.install import Tier

# Where every core manifest lies, in an installed package as in a source tree.
CORE_MANIFEST_DIRECTORY = ("cortexfs", "tools", "core", "manifests")
# The module whose run() each tool bootstrap installs calls (tsh's program is bin/tsh's).
CORE_MODULES = {**CORE_TOOLS, "tsh": "tsh"}
# A core tool's executable is a few hundred kilobytes; what is far bigger is not one.
_MAX_EXECUTABLE_BYTES = 64 * 1024 * 1024
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def administrators_manifest(tier: Tier, name: str) -> str | None:
    """The manifest the tool at core name ``name`` of ``tier`` was installed from, when its
    ``origin`` proves it is not bootstrap's install: a readable origin naming a manifest other
    than ``…/cortexfs/tools/core/manifests/<name>.json``.  None when there is no such tool, or
    when its origin is missing, unreadable or not JSON (damage bootstrap repairs), or names a
    core manifest."""
    return _administrators_manifest_of(tier.tool(name))


def _administrators_manifest_of(tool: ToolObject) -> str | None:
    try:
        manifest = _origin_manifest(tool)
    except CtxError as exc:
        if exc.errno in HOST_SHORTAGES:  # the host's state says nothing of whose it is
            raise
        return None
    if manifest is None:
        return None
    return None if _is_core_manifest(manifest, tool.name) else manifest


def _origin_manifest(tool: ToolObject) -> str | None:
    """The manifest ``tool``'s ``origin`` names; None when the origin is missing, not JSON
    or names none.  CtxError when it cannot be read."""
    data = read_control(tool, "origin")
    try:
        # Strict, as every JSON an administrator may edit is read: nested past the limit it
        # is no JSON, where json.loads recursed until the command died (RecursionError).
        origin = jsontext.loads_strict(data, unique_names=False) if data is not None else None
    except ValueError:
        return None
    manifest = origin.get("manifest") if isinstance(origin, dict) else None
    return manifest if isinstance(manifest, str) and manifest else None


def tools_of_another_version(root: Path, names: Collection[str] = tuple(CORE_MODULES)) -> list[str]:
    """The core tools of ``root``'s system tier (those of ``names``, by default all) that are
    not what this ctx's bootstrap would install: their launcher carries no stamp, or a stamp
    of another interpreter line, module or bundled file (a module, a manifest), or is not the
    size its stamp gives.  A core name that holds nothing, or holds an administrator's tool
    (:func:`administrators_manifest`), is not counted: the first is bootstrap's to make, the
    second is not a core tool.  Reading this version's sources costs about a millisecond,
    once for all ``names``; each name then a few reads."""
    stamps = _StampsOfThisVersion()
    another = []
    for name, module in CORE_MODULES.items():
        if name in names and _of_another_version(root, name, stamps.of(module)):
            another.append(name)
    return another


class _StampsOfThisVersion:
    """The interpreter line and stamp this version's bootstrap writes into the launcher of
    each core module, its sources read once for all."""

    def __init__(self) -> None:
        self.interpreter, _ = core_interpreter()
        self.sources = sources_digest(bundled_sources(package_parent()))
        self.with_bytecode = carries_bytecode(self.interpreter)

    def of(self, module: str) -> tuple[bytes, str]:
        return (
            interpreter_line(self.interpreter),
            stamp(self.interpreter, module, self.sources, self.with_bytecode),
        )


def _of_another_version(root: Path, name: str, wanted: tuple[bytes, str]) -> bool:
    tool = ToolObject(name, root / "tool")
    found = _stamp_of(tool.executable)
    if found is _MISSING or _administrators_manifest_of(tool) is not None:
        return False
    return found != wanted


def require_this_versions_tools(
    root: Path, not_done: str, names: Collection[str] = tuple(CORE_MODULES)
) -> None:
    """EINVAL, naming the remedy and what was ``not_done`` ("the worker claimed no job"),
    when :func:`tools_of_another_version` finds one of ``names``: a worker (or a call) would
    otherwise run each of them against a context of another shape, and fail every job for
    good."""
    to_reinstall = tools_of_another_version(root, names)
    if not to_reinstall:
        return
    damaged = [name for name in to_reinstall if _resized(ToolObject(name, root / "tool"))]
    if len(damaged) < len(to_reinstall):
        raise CtxError(
            errno.EINVAL,
            f"the core tools in {root} were installed by another version of ctx; run 'ctx "
            f"bootstrap' ({not_done})",
        )
    raise CtxError(
        errno.EINVAL,
        f"core {'tool' if len(damaged) == 1 else 'tools'} {', '.join(damaged)} in {root} "
        f"{'is' if len(damaged) == 1 else 'are'} damaged: not the size bootstrap wrote (cut "
        f"short, or appended to), and bootstrap reinstalls {'it' if len(damaged) == 1 else 'them'}"
        f": run 'ctx bootstrap' ({not_done})",
    )


def require_this_versions_tool(root: Path, name: str, not_done: str) -> None:
    """:func:`require_this_versions_tools` for the one core tool ``name`` a call is about to
    run, judged once per installed version of it in this process: the answer is kept under
    the executable's identity (device, inode, change time, size), which every reinstall and
    every write changes, so a worker's or a server's later calls of that tool cost one
    ``lstat`` (a few microseconds) instead of the millisecond or more a judgement costs."""
    executable = ToolObject(name, root / "tool").executable
    before = _identity(executable)
    if before is not None and before in _JUDGED_THIS_VERSIONS:
        return
    require_this_versions_tools(root, not_done, (name,))
    # Kept only when nothing replaced it while it was judged; a refusal is not kept, but
    # judged again at the next call.
    if before is not None and _identity(executable) == before:
        _JUDGED_THIS_VERSIONS.add(before)


def installed_by_bootstrap(tool: ToolObject) -> bool:
    """Whether ``tool``, at a core tool's name in the system tier, proves to be bootstrap's
    install: its ``origin`` names ``…/cortexfs/tools/core/manifests/<name>.json``, or, with
    no ``origin`` at all, its executable carries this version's stamp for that tool's module.
    Stricter than the converse of :func:`administrators_manifest`, which gives a broken origin
    the benefit of the doubt so that bootstrap repairs it: what the host does for a core tool
    alone (the run capability of A-5) asks for evidence.  ``origin`` is diagnostic, no stable
    ABI (T-1), so its absence is not held against the tool: the stamp, a digest of the sources
    bootstrap installs, is evidence enough.  An origin that names another manifest, or that
    cannot be read, is not."""
    try:
        if read_control(tool, "origin") is None:
            return _carries_this_versions_stamp(tool)
    except CtxError:
        return False
    return origin_names_core_manifest(tool)


def origin_names_core_manifest(tool: ToolObject) -> bool:
    """Whether ``tool``'s ``origin`` is readable and names the core manifest of its name, as
    bootstrap's install writes it (and ``ctx bootstrap`` puts back)."""
    try:
        manifest = _origin_manifest(tool)
    except CtxError:
        return False
    return manifest is not None and _is_core_manifest(manifest, tool.name)


def _carries_this_versions_stamp(tool: ToolObject) -> bool:
    module = CORE_MODULES.get(tool.name)
    return module is not None and _stamp_of(tool.executable) == _StampsOfThisVersion().of(module)


def _is_core_manifest(manifest: str, name: str) -> bool:
    """Whether ``manifest`` is ``…/cortexfs/tools/core/manifests/<name>.json``."""
    path = PurePosixPath(manifest)
    return path.name == f"{name}.json" and path.parent.parts[-4:] == CORE_MANIFEST_DIRECTORY


# The executables require_this_versions_tool found to be this version's, by their identity.
_JUDGED_THIS_VERSIONS: set[tuple[int, int, int, int]] = set()


def _identity(path: Path) -> tuple[int, int, int, int] | None:
    try:
        status = os.lstat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino, status.st_ctime_ns, status.st_size


_MISSING = (b"", "")  # what _stamp_of says of a name that holds no file


def _stamp_of(executable: Path) -> tuple[bytes, str] | None:
    """The interpreter line and stamp (:func:`~cortexfs.tools.core.launcher.read_stamp`) of
    the executable at ``executable``; :data:`_MISSING` when nothing is there, and None for
    what carries no stamp or is no regular file (never equal to a launcher's)."""
    try:
        read = _read_executable(executable, STAMPED_HEAD_BYTES)
    except FileNotFoundError:
        return _MISSING
    if read is None:
        return None
    head, size = read
    return read_stamp(head, size)


def _resized(tool: ToolObject) -> bool:
    """Whether ``tool``'s executable is a stamped launcher of another size than its stamp
    gives (:func:`~cortexfs.tools.core.launcher.resized_since_stamped`)."""
    try:
        read = _read_executable(tool.executable, STAMPED_HEAD_BYTES)
    except FileNotFoundError:
        return False
    return read is not None and resized_since_stamped(*read)


def damaged_core_launcher(tool: ToolObject) -> bool:
    """Whether ``tool``, at a core tool's name in the system tier, is bootstrap's launcher
    damaged inside its archive (:func:`~cortexfs.tools.core.launcher.damaged_archive`), which
    ``ctx bootstrap`` repairs.  Read in full, so asked only after a call of it ended as such
    damage can end it; False when it cannot be read, and for an administrator's tool."""
    try:
        read = _read_executable(tool.executable, _MAX_EXECUTABLE_BYTES)
    except FileNotFoundError:
        return False
    if read is None or _administrators_manifest_of(tool) is not None:
        return False
    program, _ = read
    return damaged_archive(program)


def _read_executable(executable: Path, amount: int) -> tuple[bytes, int] | None:
    """Up to ``amount`` first bytes of the executable at ``executable`` and its size, read
    without following a link and without waiting on a FIFO; None when it is no regular file,
    is bigger than any launcher, or cannot be read.  FileNotFoundError when nothing is there."""
    try:
        fd = os.open(executable, _READ_FLAGS)
    except FileNotFoundError:
        raise  # nothing there, which callers tell apart from what they cannot read
    except OSError:
        return None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_size > _MAX_EXECUTABLE_BYTES:
            return None
        chunks = []
        while amount > 0 and (chunk := os.read(fd, amount)):
            chunks.append(chunk)
            amount -= len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks), status.st_size
