"""``ctx bootstrap`` for tools: the core tools, ``tool/tsh.d/config``, interrupted installs (R-5).

Each core tool is installed through the ordinary lifecycle (:func:`cortexfs.tools.install.
install_tool`) from its manifest in ``manifests/`` and a generated executable: a Python zip
application (``#!<python> -IS`` followed by a zip archive) that carries the few modules the
tool imports (:data:`BUNDLED`) and a ``__main__`` calling its ``run()``.  The tool is thus one
self-contained file of the storage root: an agent uid needs to read nothing of the installed
package, wherever (and however privately) it lives.  The archive is byte-for-byte the same for
the same sources, so an unchanged tool is recognised as current.

``-IS`` keeps the environment (``PYTHONPATH``, user site-packages) and site-packages out of the
tool.  The interpreter must be one every agent uid can execute: this one when its whole path
is world-executable, else the first world-executable ``python3`` (>= 3.11) on the system path.

A core tool is reinstalled when it is missing, damaged, or differs from what this version
would install; its policy, status, log and hooks are kept (:mod:`cortexfs.tools.pairs`).
``tool/tsh.d/config`` is created with the defaults of H-4 when missing and never overwritten.
"""

from __future__ import annotations

import importlib.util
import io
import json
import marshal
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import cortexfs
from cortexfs import durable, storage
from cortexfs.errors import CtxError
from cortexfs.tools.controls import ToolObject, layout_problems, read_control
from cortexfs.tools.core import CORE_TOOLS, tsh_config
from cortexfs.tools.install import Tier, all_tiers, install_tool, parse_tier, repair_tier
from cortexfs.tools.manifest import Manifest, parse_manifest

MANIFESTS = Path(__file__).parent / "manifests"
_SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
_MINIMUM_PYTHON = (3, 11)


def bootstrap_tools(root: Path, source: Path | None, report: storage.BootstrapReport) -> None:
    """The bootstrap step: finish interrupted installs, then the core tools and tsh config."""
    for tier in all_tiers(root, os.getuid()):
        report.repaired += repair_tier(tier)
    interpreter, problem = core_interpreter()
    if problem:
        report.problems.append(problem)
    package_parent = Path(cortexfs.__file__).resolve().parent.parent
    modules = bundled_modules(interpreter, package_parent)  # shared by every core tool
    system = parse_tier(root, "system")
    for name, module in CORE_TOOLS.items():
        launcher = render_launcher(interpreter, modules, module)
        _install_core_tool(system, name, launcher, report)
    _ensure_tsh_config(root, report)


def core_manifest(name: str, exec_path: Path) -> Manifest:
    """The packaged manifest of a core tool, with ``exec`` naming its rendered launcher."""
    path = MANIFESTS / f"{name}.json"
    document = json.loads(path.read_text())
    document["exec"] = str(exec_path)
    return parse_manifest(document, source=path)


# What a core tool imports: the standard library and these modules, nothing else.
BUNDLED = (
    "cortexfs/__init__.py",
    "cortexfs/durable.py",
    "cortexfs/errors.py",
    "cortexfs/keyvalue.py",
    "cortexfs/timefmt.py",
    "cortexfs/tools/__init__.py",
    "cortexfs/tools/core/__init__.py",
    "cortexfs/tools/core/confine.py",
    "cortexfs/tools/core/toolio.py",
    *(f"cortexfs/tools/core/{module}.py" for module in sorted(set(CORE_TOOLS.values()))),
)
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # fixed entry times: the same sources, the same bytes


def bundled_modules(interpreter: str, package_parent: Path) -> list[tuple[str, bytes]]:
    """The archive entries of :data:`BUNDLED`: each module's source, and next to it its
    bytecode when ``interpreter`` is the one running now (it compiles for its own version
    only).  zipimport never writes bytecode, so without it every call would compile every
    module again (tens of milliseconds).  The bytecode is hash-based and unchecked (PEP 552)
    so that the archive stays the same bytes for the same sources; an interpreter of another
    version ignores it and reads the source."""
    with_bytecode = os.path.realpath(interpreter) == os.path.realpath(sys.executable)
    entries = []
    for name in BUNDLED:
        source = (package_parent / name).read_bytes()
        entries.append((name, source))
        if with_bytecode:
            entries.append((name + "c", _unchecked_bytecode(source, name)))
    return entries


def render_launcher(interpreter: str, modules: list[tuple[str, bytes]], module: str) -> bytes:
    """A core tool as a self-contained zip application for ``interpreter``: the bundled
    ``modules`` (:func:`bundled_modules`) and a ``__main__`` calling ``module``'s ``run()``."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
        main = (
            '"""CortexFS core tool, written by ctx bootstrap (SPEC R-5)."""\n'
            f"import sys\nfrom cortexfs.tools.core.{module} import run\nsys.exit(run())\n"
        )
        for name, data in [("__main__.py", main.encode()), *modules]:
            info = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            bundle.writestr(info, data)
    # -I: nothing from the environment (PYTHONPATH, user site); -S: no site-packages, whose
    # .pth files would run code in every tool process.  One argument: a shebang passes one.
    return f"#!{interpreter} -IS\n".encode() + archive.getvalue()


def _unchecked_bytecode(source: bytes, name: str) -> bytes:
    """A PEP 552 .pyc: magic, flags (hash-based, not checked), source hash, code."""
    code = compile(source, name, "exec", dont_inherit=True)
    flags = (0b01).to_bytes(4, "little")
    return (
        importlib.util.MAGIC_NUMBER
        + flags
        + importlib.util.source_hash(source)
        + marshal.dumps(code)
    )


def core_interpreter() -> tuple[str, str]:
    """A Python every uid can execute, and a problem sentence when there is none."""
    own = os.path.realpath(sys.executable)
    if _world_reachable(Path(own)):
        return own, ""
    for directory in _SYSTEM_PATH.split(":"):
        candidate = shutil.which("python3", path=directory)
        if candidate and _world_reachable(Path(candidate)) and _recent_enough(candidate):
            return os.path.realpath(candidate), ""
    return own, (
        f"{own} is not executable by every user and no other python3 >= 3.11 was found; "
        "core tools run only for users who can reach it"
    )


def _install_core_tool(
    tier: Tier, name: str, launcher: bytes, report: storage.BootstrapReport
) -> None:
    with tempfile.TemporaryDirectory(prefix="cortexfs-core-") as scratch:
        exec_path = Path(scratch) / name
        exec_path.write_bytes(launcher)
        manifest = core_manifest(name, exec_path)
        tool = tier.tool(name)
        present = os.path.lexists(tool.executable)
        if present and _is_current(tool, manifest, launcher):
            return
        install_tool(tier, manifest, launcher)
    (report.repaired if present else report.created).append(f"tool/{name}")


def _is_current(tool: ToolObject, manifest: Manifest, launcher: bytes) -> bool:
    if layout_problems(tool):
        return False
    try:
        if tool.executable.read_bytes() != launcher:
            return False
        wanted = manifest.controls()
        return all(read_control(tool, control) == data for control, data in wanted.items())
    except (OSError, CtxError):
        return False


def _ensure_tsh_config(root: Path, report: storage.BootstrapReport) -> None:
    """H-4: ``tool/tsh.d/config`` with its defaults; an existing one is only checked."""
    ops = durable.default_ops()
    tool_fd = durable.open_dir_path(ops, str(root / "tool"))
    try:
        if durable.make_dir_synced(ops, tool_fd, "tsh.d", 0o755):
            report.created.append("tool/tsh.d")
        config_dir = ops.open_dir("tsh.d", tool_fd)
    finally:
        ops.close(tool_fd)
    try:
        try:
            existing = os.stat("config", dir_fd=config_dir, follow_symlinks=False)
        except FileNotFoundError:
            existing = None
        if existing is None:
            temporary = f".config.{os.urandom(6).hex()}.tmp"
            durable.write_file_synced(ops, config_dir, temporary, tsh_config.DEFAULT_TEXT.encode())
            durable.move_noreplace(ops, config_dir, temporary, config_dir, "config")
            report.created.append("tool/tsh.d/config")
        elif not stat.S_ISREG(existing.st_mode):
            report.problems.append("tool/tsh.d/config is not a regular file; left untouched")
        else:
            text = (root / "tool/tsh.d/config").read_text()
            report.problems += [f"tool/{problem}" for problem in tsh_config.problems(text)]
    finally:
        ops.close(config_dir)


def _world_reachable(path: Path) -> bool:
    """Every directory above ``path`` is searchable and ``path`` readable/executable by others."""
    try:
        for directory in path.parents:
            if not os.stat(directory).st_mode & stat.S_IXOTH:
                return False
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return bool(mode & (stat.S_IXOTH if stat.S_ISREG(mode) else stat.S_IROTH | stat.S_IXOTH))


def _recent_enough(interpreter: str) -> bool:
    check = f"import sys; sys.exit(sys.version_info < {_MINIMUM_PYTHON!r})"
    completed = subprocess.run([interpreter, "-I", "-c", check], check=False, timeout=30)
    return completed.returncode == 0


storage.register_bootstrap_step(bootstrap_tools)
