"""The programs built into ctx, as executables of the storage root: self-contained launchers.

A core tool (and the bridge that runs an MCP-backed tool) is installed as a Python zip
application: ``#!<python> -IS`` followed by a zip archive that carries the few modules the
program imports and the core tools' manifests, whose input schemas the programs check
(:data:`BUNDLED`), and a ``__main__`` calling its ``run()``.  The program is
thus one self-contained file of the storage root: an agent uid needs to read nothing of the
installed package, wherever (and however privately) it lives.

Between the interpreter line and the archive (a zip application may carry any prefix) a second
line stamps what the program was made of: ``#cortexfs-bundle <digest> <archive size> <archive
digest>``, the digest (:func:`stamp`) of the interpreter line, the ``__main__`` naming the
module whose ``run()`` it calls, and every bundled source and manifest (and whether their
bytecode comes with them), then the archive's size and the digest of its bytes.  Whether a
core tool is this version's install then takes reading its first two lines and this version's
sources (:func:`read_stamp`, :mod:`cortexfs.tools.core.installed`), without opening the
archive, which ``ctx run`` would pay for at each call of a core tool.  Bootstrap asks the same
of the whole program and checks its archive against that digest (:func:`same_program`): two
renders of the same sources are not always the same bytes, since the bytecode marshal writes
depends on the state of the process that compiled it.  The archive's digest is
the ``__main__``'s (:data:`_MAIN`): compared only when a call fails with an exception, it tells
a damaged launcher (a byte of a module, a manifest or the zip's directory changed, which the
stamp cannot show) from a bug of the tool itself, at no cost to a call that works.  Damaged
bytecode may instead crash the interpreter, which leaves the ``__main__`` no word to say: the
runner then compares the archive itself (:func:`damaged_archive`) after a core tool ended by
such a signal.

``-IS`` keeps the environment (``PYTHONPATH``, user site-packages) and site-packages out of the
program.  The interpreter must be one every agent uid can execute: this one when its whole
path is world-executable, else the first world-executable ``python3`` (>= 3.11) on the system
path.
"""

from __future__ import annotations

import io
import marshal
import os
import stat
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import zipfile

try:
    # hashlib's own blake2b, without the ~5 ms hashlib spends loading OpenSSL at each ctx run
    # of a core tool, which reads this module to judge the tool's stamp.
    from _blake2 import blake2b
except ImportError:  # an interpreter built without it: hashlib's, from OpenSSL
    from hashlib import blake2b

import cortexfs
from cortexfs.names import is_decimal
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
    "cortexfs/cgroups.py",
    "cortexfs/durable.py",
    "cortexfs/errors.py",
    "cortexfs/file_attributes.py",
    "cortexfs/jsontext.py",
    "cortexfs/keyvalue.py",
    "cortexfs/libc.py",
    "cortexfs/printable.py",
    "cortexfs/process_limits.py",
    "cortexfs/readiness.py",
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
    "cortexfs/tools/core/tsh_line.py",
    "cortexfs/tools/ctxpath.py",
    "cortexfs/tools/ecma_regex.py",
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
    module again (tens of milliseconds).  The bytecode is hash-based and unchecked (PEP 552):
    no file time is in it, and zipimport has none to check it against; an interpreter of
    another version ignores it and reads the source."""
    with_bytecode = carries_bytecode(interpreter)
    entries = []
    for name, source in bundled_sources(package_parent):
        entries.append((name, source))
        if with_bytecode and name.endswith(".py"):
            entries.append((name + "c", _unchecked_bytecode(source, name)))
    return entries


def bundled_sources(package_parent: Path) -> list[tuple[str, bytes]]:
    """Each file of :data:`BUNDLED` and its bytes, as read under ``package_parent``.  Read
    with the os calls alone: at each ctx run of a core tool (whose stamp is judged against
    them) ``Path.read_bytes`` would cost about a millisecond more."""
    directory = os.open(package_parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return [(name, _read_all(name, directory)) for name in BUNDLED]
    finally:
        os.close(directory)


def _read_all(name: str, directory: int) -> bytes:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=directory)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def carries_bytecode(interpreter: str) -> bool:
    """Whether a launcher for ``interpreter`` bundles bytecode: only for the running one."""
    return os.path.realpath(interpreter) == os.path.realpath(sys.executable)


def render_launcher(interpreter: str, modules: list[tuple[str, bytes]], module: str) -> bytes:
    """A core tool as a self-contained zip application for ``interpreter``: the bundled
    ``modules`` (:func:`bundled_modules`) and a ``__main__`` calling ``module``'s ``run()``,
    after an interpreter line and the stamp of all of them."""
    # Imported here, as importlib.util is by _unchecked_bytecode: only bootstrap renders, and
    # the version check at each ctx run of a core tool, which reads this module's stamp,
    # would pay ~7 ms for zipfile (with shutil and the compression modules it loads).
    import zipfile

    sources = [(name, data) for name, data in modules if not name.endswith(".pyc")]
    with_bytecode = len(sources) < len(modules)
    main = [("__main__.py", _main(module))]
    if with_bytecode:  # the interpreter would compile it at each call: over a millisecond
        main.append(("__main__.pyc", _unchecked_bytecode(main[0][1], "__main__.py")))
    # The __main__ appended to an archive of the modules alone, made once for all the
    # launchers of the same modules: compressing them is most of a render (some 40 ms).
    archive = io.BytesIO(_modules_archive(modules))
    with zipfile.ZipFile(archive, "a") as bundle:
        _add_entries(bundle, main)
    digest = stamp(interpreter, module, sources_digest(sources), with_bytecode)
    archive_bytes = archive.getvalue()
    return (
        interpreter_line(interpreter)
        + _STAMP_MARK
        + f" {digest} {len(archive_bytes)} {archive_digest(archive_bytes)}\n".encode()
        + archive_bytes
    )


# The digest of the modules last archived, and their archive: one is enough, as the launchers
# a process renders (bootstrap's ten, an install's bridge) bundle the same modules.
_archived: tuple[bytes, bytes] = (b"", b"")


def _modules_archive(modules: list[tuple[str, bytes]]) -> bytes:
    """A zip archive of ``modules`` alone, kept for the next launcher of the same modules
    (``ctx bootstrap`` renders ten): its digest covers each name and every byte."""
    global _archived
    digest = sources_digest(modules)
    kept = _archived  # read once: another thread may archive other modules meanwhile
    if kept[0] != digest:
        import zipfile

        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w") as bundle:
            _add_entries(bundle, modules)
        kept = _archived = (digest, archive.getvalue())
    return kept[1]


def _add_entries(bundle: zipfile.ZipFile, entries: list[tuple[str, bytes]]) -> None:
    """Each entry, deflated, with fixed times and modes: the same entries, the same bytes."""
    import zipfile

    for name, data in entries:
        info = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        bundle.writestr(info, data)


def same_program(installed: bytes, rendered: bytes) -> bool:
    """Whether the launcher ``installed`` runs what ``rendered``, a launcher this process
    rendered, would: the same interpreter line and stamp, and an archive that is the bytes the
    digest its stamp ends with gives (no byte of it damaged).  Not the same bytes: marshal
    marks a string interned, or as referenced again, after the reference counts of the process
    that compiles it (CPython issue gh-98819), so the bytecode ``ctx bootstrap`` bundles may
    differ from a longer-lived process's for the same sources.  Programs without a stamp
    (``bin/ctxterm``) are compared byte for byte."""
    wanted = read_stamp(rendered, len(rendered))
    if wanted is None:
        return installed == rendered
    return read_stamp(installed, len(installed)) == wanted and not damaged_archive(installed)


def archive_digest(archive: bytes) -> str:
    """The digest a launcher's stamp ends with: of the bytes of its ``archive``.  The
    ``__main__``'s ``refuse_if_damaged`` (:data:`_MAIN`) computes the same inside the program,
    which imports nothing of ours."""
    return blake2b(archive, digest_size=32).hexdigest()


def damaged_archive(program: bytes) -> bool:
    """Whether the launcher ``program`` has a stamp whose last field is not the digest of the
    archive after it: a byte of a bundled module, a manifest or the zip's directory changed
    since bootstrap wrote it, which the rest of the stamp cannot show.  False for a program
    without a stamp of four fields: there is nothing to compare its archive with."""
    _, _, rest = program.partition(b"\n")
    second, newline, archive = rest.partition(b"\n")
    fields = second.split(b" ")
    if not newline or len(fields) != 4 or fields[0] != _STAMP_MARK:
        return False
    return fields[3] != archive_digest(archive).encode()


def interpreter_line(interpreter: str) -> bytes:
    """The first line of a launcher for ``interpreter``."""
    # -I: nothing from the environment (PYTHONPATH, user site); -S: no site-packages, whose
    # .pth files would run code in every tool process.  One argument: a shebang passes one.
    return f"#!{interpreter} -IS\n".encode()


def _main(module: str) -> bytes:
    """The ``__main__`` of ``module``'s launcher: :data:`_MAIN`, then the call of its ``run()``."""
    remedy = _REMEDIES.get(module, "run 'ctx bootstrap' to repair it")
    return (
        _MAIN
        + "try:\n"
        + f"    from cortexfs.tools.core.{module} import run\n\n"
        + "    status = run()\n"
        + "except Exception as failure:\n"
        + f"    refuse_if_damaged(failure, {remedy!r})\n"
        + "    raise\n"
        + "sys.exit(status)\n"
    ).encode()


# What repairs a damaged launcher: bootstrap for its own; the MCP bridge is installed with the
# tool that runs it.
_REMEDIES = {"mcp_bridge": "reinstall it ('ctx object install MANIFEST')"}

# The head of every launcher's __main__, before the call of its module.  Only when importing
# or running the module raised is the archive read and compared with the digest its stamp ends
# with, so a call that works pays nothing.  A damaged archive (zipimport, zlib, marshal or the
# compiler failing on a byte of a module, a manifest or the zip's directory) then ends in one
# line, ENOEXEC (the program's format is broken, as controls.damaged says of a broken control;
# EIO would send the user to the disk, whose reads succeeded), naming the remedy, exit status
# 1 as every core tool's failure; an intact archive means the failure is the tool's own, raised
# as before.  It imports nothing from the archive, which may be what is damaged.  The
# interpreter runs the __main__'s bytecode (its source is read only without it); damage to that
# bytecode or to what the interpreter reads to find it (the zip's end record, its entry) fails
# before any of this runs, with the interpreter's own message: only bootstrap's comparison of
# every byte finds it.
_MAIN = '''"""CortexFS core tool, written by ctx bootstrap (SPEC R-5)."""
import sys


def refuse_if_damaged(failure, remedy):
    """Exit naming the remedy when this archive is not the bytes its stamp's digest gives."""
    path = __loader__.archive
    try:
        with open(path, "rb") as launcher:
            _, stamp, archive = launcher.read().split(b"\\n", 2)
    except ValueError:  # the interpreter line and the stamp are not both there
        archive = stamp = b""
    except OSError:  # unreadable: nothing says the failure is not the tool's own
        return
    try:
        from _blake2 import blake2b
    except ImportError:
        from hashlib import blake2b
    if stamp.split(b" ")[3:] == [blake2b(archive, digest_size=32).hexdigest().encode()]:
        return
    import errno
    import json
    import os

    kind = type(failure)
    name = kind.__qualname__
    if kind.__module__ != "builtins":  # zlib.error, zipimport.ZipImportError
        name = f"{kind.__module__}.{name}"
    reason = repr(f"{name}: {failure}")[1:-1]
    message = f"{path} is damaged ({reason}); {remedy}"
    sys.stderr.write(f"{os.path.basename(path)}: ENOEXEC: {message}\\n")
    if os.environ.get("CTX_MODE") == "native":
        report = {"error": "ENOEXEC", "errno": errno.ENOEXEC, "message": message}
        sys.stdout.write(json.dumps(report) + "\\n")
    sys.exit(1)


'''


# The second line of a launcher starts so; a program without it (every launcher before the
# stamp), or with a stamp of three fields (every one before the archive's digest), has none.
_STAMP_MARK = b"#cortexfs-bundle"
# What read_stamp reads of a launcher: its interpreter line (a path is at most 4096 bytes) and
# its stamp.
STAMPED_HEAD_BYTES = 8192


def sources_digest(sources: Iterable[tuple[str, bytes]]) -> bytes:
    """The digest of bundled files (each name and its bytes, :func:`bundled_sources`), computed
    once for the stamps of every core tool."""
    digest = blake2b(digest_size=32)
    for name, data in sources:
        digest.update(b"%s\0%d\0" % (name.encode(), len(data)))
        digest.update(data)
    return digest.digest()


def stamp(interpreter: str, module: str, digest_of_sources: bytes, with_bytecode: bool) -> str:
    """The stamp of ``module``'s launcher for ``interpreter``: the digest of its interpreter
    line, its ``__main__``, the ``digest_of_sources`` it bundles (:func:`sources_digest`)
    and whether their bytecode comes with them.  Whatever decides what bootstrap would install
    is in it; the bytecode itself follows from the sources and the interpreter."""
    digest = blake2b(digest_size=32)
    for part in (interpreter_line(interpreter), _main(module), digest_of_sources):
        digest.update(b"%d\0" % len(part))
        digest.update(part)
    digest.update(b"with bytecode" if with_bytecode else b"sources only")
    return digest.hexdigest()


def read_stamp(head: bytes, size: int) -> tuple[bytes, str] | None:
    """The interpreter line and stamp of the program whose first bytes (at least
    :data:`STAMPED_HEAD_BYTES`, or all of it) are ``head`` and whose size is ``size``.  None
    when it carries no stamp, or when it is not the size its stamp gives (cut short, or
    appended to): no launcher bootstrap writes."""
    stamped = _stamp_fields(head)
    if stamped is None or stamped[2] != size:
        return None
    return stamped[0], stamped[1]


def resized_since_stamped(head: bytes, size: int) -> bool:
    """Whether the program whose first bytes are ``head`` carries a launcher's stamp but is
    not the size that stamp gives: bootstrap's launcher, cut short or appended to since."""
    stamped = _stamp_fields(head)
    return stamped is not None and stamped[2] != size


def _stamp_fields(head: bytes) -> tuple[bytes, str, int] | None:
    """The interpreter line, the stamp and the size of the whole program that the second
    line of ``head`` gives; None when that line is no launcher's stamp."""
    first, _, rest = head.partition(b"\n")
    second, newline, _ = rest.partition(b"\n")
    fields = second.split(b" ")
    if not newline or len(fields) != 4:
        return None
    # The archive's digest is the __main__'s (_MAIN) and damaged_archive's.
    mark, digest, archive_size, _ = fields
    # Twenty digits are far beyond any real size, and int() of thousands of them refuses.
    if mark != _STAMP_MARK or not (is_decimal(archive_size) and len(archive_size) <= 20):
        return None
    program_size = len(first) + len(second) + 2 + int(archive_size)
    return first + b"\n", digest.decode("ascii", "replace"), program_size


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


def ctxterm_root(program: bytes) -> str | None:
    """The storage root a ``bin/ctxterm`` of :func:`render_ctxterm` names, an absolute path;
    None for a program of any other form."""
    import ast  # here: only bootstrap reads an installed ctxterm back
    import re

    named = re.search(rb"^main\(storage=(.*)\)$", program, re.MULTILINE)
    try:
        path = ast.literal_eval(named[1].decode()) if named else None
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        return None
    return path if isinstance(path, str) and os.path.isabs(path) else None


def _unchecked_bytecode(source: bytes, name: str) -> bytes:
    """A PEP 552 .pyc: magic, flags (hash-based, not checked), source hash, code."""
    import importlib.util  # here: ~0.8 ms that judging a stamp at each ctx run need not pay

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
        candidate = os.path.join(directory, "python3")
        if (
            os.path.isfile(candidate)
            and _world_reachable(Path(candidate))
            and _recent_enough(candidate)
        ):
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
