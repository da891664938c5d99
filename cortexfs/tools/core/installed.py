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
  application (:mod:`cortexfs.tools.core.launcher`): its interpreter line and the names and
  CRC-32 checksums of the files it bundles, read from the archive's central directory, are
  compared with this version's sources.  That costs a few milliseconds, so a worker can ask
  at start; bootstrap itself compares every byte (``bootstrap._is_current``).
"""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import sys
import zipfile
import zlib
from collections.abc import Collection
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from cortexfs.errors import HOST_SHORTAGES, CtxError
from cortexfs.tools.controls import ToolObject, read_control
from cortexfs.tools.core import CORE_TOOLS
from cortexfs.tools.core.launcher import BUNDLED, core_interpreter, package_parent, render_launcher

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
        origin = json.loads(data) if data is not None else None
    except ValueError:
        return None
    manifest = origin.get("manifest") if isinstance(origin, dict) else None
    return manifest if isinstance(manifest, str) and manifest else None


def tools_of_another_version(root: Path, names: Collection[str] = tuple(CORE_MODULES)) -> list[str]:
    """The core tools of ``root``'s system tier (those of ``names``, by default all) that are
    not what this ctx's bootstrap would install: their interpreter line differs, or a file
    they bundle (a module, a manifest) is missing, extra or of other content.  A core name
    that holds nothing, or holds an administrator's tool (:func:`administrators_manifest`),
    is not counted: the first is bootstrap's to make, the second is not a core tool.  One
    name costs about a millisecond (a caller about to run one core tool asks for it alone)."""
    interpreter, _ = core_interpreter()
    sources = _source_checksums(interpreter)
    return [
        name
        for name in CORE_MODULES
        if name in names and _of_another_version(root, name, interpreter, sources)
    ]


def _of_another_version(root: Path, name: str, interpreter: str, sources: dict[str, int]) -> bool:
    tool = ToolObject(name, root / "tool")
    listing = _bundle_of(tool.executable)
    if listing is _MISSING or _administrators_manifest_of(tool) is not None:
        return False
    return not _matches(listing, _expected(interpreter, CORE_MODULES[name], sources))


def require_this_versions_tools(
    root: Path, not_done: str, names: Collection[str] = tuple(CORE_MODULES)
) -> None:
    """EINVAL, naming the remedy and what was ``not_done`` ("the worker claimed no job"),
    when :func:`tools_of_another_version` finds one of ``names``: a worker (or a call) would
    otherwise run each of them against a context of another shape, and fail every job for
    good."""
    if tools_of_another_version(root, names):
        raise CtxError(
            errno.EINVAL,
            f"the core tools in {root} were installed by another version of ctx; run 'ctx "
            f"bootstrap' ({not_done})",
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
    """Whether ``tool``, at a core tool's name, proves to be bootstrap's install: its
    ``origin`` is readable and names ``…/cortexfs/tools/core/manifests/<name>.json``.
    Stricter than the converse of :func:`administrators_manifest`, which gives a missing or
    broken origin the benefit of the doubt so that bootstrap repairs it: what the host does
    for a core tool alone (the run capability of A-5) asks for the evidence."""
    try:
        manifest = _origin_manifest(tool)
    except CtxError:
        return False
    return manifest is not None and _is_core_manifest(manifest, tool.name)


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


_MISSING = (b"", {})  # what _bundle_of says of a name that holds no file


def _bundle_of(executable: Path) -> tuple[bytes, dict[str, int]]:
    """The interpreter line of the executable at ``executable`` and the CRC-32 of each file
    its archive holds, read without following a link; :data:`_MISSING` when nothing is
    there, and ``(b"?", {})`` for what is no zip application (never equal to a launcher)."""
    try:
        fd = os.open(executable, _READ_FLAGS)
    except FileNotFoundError:
        return _MISSING
    except OSError:
        return b"?", {}
    with os.fdopen(fd, "rb") as program:
        status = os.fstat(program.fileno())
        if not stat.S_ISREG(status.st_mode) or status.st_size > _MAX_EXECUTABLE_BYTES:
            return b"?", {}
        shebang = program.readline(4096)
        try:
            with zipfile.ZipFile(program) as bundle:
                return shebang, {entry.filename: entry.CRC for entry in bundle.infolist()}
        except (zipfile.BadZipFile, OSError, ValueError):
            return b"?", {}


def _source_checksums(interpreter: str) -> dict[str, int]:
    """The CRC-32 of each file this version bundles, and the names of the bytecode entries
    that come with them (:func:`~cortexfs.tools.core.launcher.bundled_modules`: only for the
    running interpreter), whose checksum is not compared (-1): it follows the source."""
    with_bytecode = os.path.realpath(interpreter) == os.path.realpath(sys.executable)
    checksums = {}
    parent = package_parent()  # resolved once: a judgement at each ctx run pays for each
    for name in BUNDLED:
        checksums[name] = zlib.crc32((parent / name).read_bytes())
        if with_bytecode and name.endswith(".py"):
            checksums[name + "c"] = -1
    return checksums


def _matches(found: tuple[bytes, dict[str, int]], wanted: tuple[bytes, dict[str, int]]) -> bool:
    """The same interpreter line and files, each of the same checksum where one is wanted."""
    (shebang, checksums), (wanted_shebang, wanted_checksums) = found, wanted
    return (
        shebang == wanted_shebang
        and checksums.keys() == wanted_checksums.keys()
        and all(crc in (-1, checksums[name]) for name, crc in wanted_checksums.items())
    )


def _expected(
    interpreter: str, module: str, sources: dict[str, int]
) -> tuple[bytes, dict[str, int]]:
    """What :func:`_bundle_of` should find in ``module``'s launcher: its interpreter line
    and checksums, rendered around an empty bundle (cheap) for the ``__main__`` it writes."""
    bare = render_launcher(interpreter, [], module)
    shebang, _, archive = bare.partition(b"\n")
    with zipfile.ZipFile(io.BytesIO(archive)) as bundle:
        main = {entry.filename: entry.CRC for entry in bundle.infolist()}
    return shebang + b"\n", {**main, **sources}
