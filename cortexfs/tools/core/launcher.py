"""The programs built into ctx, as executables of the storage root: self-contained launchers.

A core tool (and the bridge that runs an MCP-backed tool) is installed as a Python zip
application: ``#!<python> -IS`` followed by a zip archive that carries the few modules the
program imports and the core tools' manifests, whose input schemas the programs check
(:data:`BUNDLED`), and a ``__main__`` calling its ``run()``.  The program is
thus one self-contained file of the storage root: an agent uid needs to read nothing of the
installed package, wherever (and however privately) it lives.  The archive is byte-for-byte
the same for the same sources, so an unchanged program is recognised as current.

``-IS`` keeps the environment (``PYTHONPATH``, user site-packages) and site-packages out of the
program.  The interpreter must be one every agent uid can execute: this one when its whole
path is world-executable, else the first world-executable ``python3`` (>= 3.11) on the system
path.
"""

from __future__ import annotations

import importlib.util
import io
import marshal
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import cortexfs
from cortexfs.tools.core import CORE_TOOLS

_SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
_MINIMUM_PYTHON = (3, 11)


def program(module: str) -> tuple[bytes, str]:
    """The launcher of ``cortexfs.tools.core.<module>``, and a problem sentence when no
    interpreter every uid can execute was found (the launcher then names this one)."""
    interpreter, problem = core_interpreter()
    modules = bundled_modules(interpreter, package_parent())
    return render_launcher(interpreter, modules, module), problem


def package_parent() -> Path:
    """The directory that holds the ``cortexfs`` package: where :data:`BUNDLED` is read."""
    return Path(cortexfs.__file__).resolve().parent.parent


# What a program built into ctx imports: the standard library and these modules, nothing else;
# and the core tools' manifests, which toolio.core_schema reads their input schemas from.
BUNDLED = (
    "cortexfs/__init__.py",
    "cortexfs/durable.py",
    "cortexfs/errors.py",
    "cortexfs/jsontext.py",
    "cortexfs/keyvalue.py",
    "cortexfs/libc.py",
    "cortexfs/printable.py",
    "cortexfs/mcp/__init__.py",
    "cortexfs/mcp/client.py",
    "cortexfs/mcp/config.py",
    "cortexfs/names.py",
    "cortexfs/regular_file.py",
    "cortexfs/standard_streams.py",
    "cortexfs/strict_modes.py",
    "cortexfs/timefmt.py",
    "cortexfs/tools/__init__.py",
    "cortexfs/tools/core/__init__.py",
    "cortexfs/tools/core/confine.py",
    "cortexfs/tools/core/hostcall.py",
    "cortexfs/tools/core/mcp_bridge.py",
    "cortexfs/tools/core/toolio.py",
    "cortexfs/tools/core/tsh.py",
    "cortexfs/tools/core/tsh_context.py",
    "cortexfs/tools/ctxpath.py",
    "cortexfs/tools/schema_subset.py",
    "cortexfs/tools/tinylfu.py",
    *(f"cortexfs/tools/core/{module}.py" for module in sorted(set(CORE_TOOLS.values()))),
    *(f"cortexfs/tools/core/manifests/{name}.json" for name in sorted(CORE_TOOLS)),
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
        if with_bytecode and name.endswith(".py"):
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


def render_ctxterm(root: Path) -> bytes:
    """``bin/ctxterm`` (H-1): the host's program that starts an agent terminal in the
    foreground (:mod:`cortexfs.cli.ctxterm`).  Unlike a core tool it runs as the host
    administrator with the whole installed package (the terminal mounts a FUSE view), so it is
    a short script for this very interpreter — a virtual environment's, unresolved, keeps its
    site-packages — not a self-contained archive.  ``root`` is its default storage root."""
    return (
        f"#!{sys.executable} -I\n"
        '"""CortexFS ctxterm, written by ctx bootstrap (SPEC H-1): '
        'ctxterm AGENT [--session S]."""\n'
        "import sys\n\n"
        f"sys.path.insert(0, {str(package_parent())!r})\n"
        "from cortexfs.cli.ctxterm import main\n\n"
        f"main(storage={str(root)!r})\n"
    ).encode()


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
