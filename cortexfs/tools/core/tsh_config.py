"""``tsh.config``: read or update tsh's configuration, ``tsh.d/config`` (SPEC H-4, R-5).

The configuration is data, never code: blank lines, ``#`` comments and ``key=value`` lines
for the keys of :data:`DEFAULTS`, each given once, a positive integer (``window_percent`` at
most 100, ``cache_capacity`` and ``max_loaded_tools`` at most 65536).
It lives in the control directory ``tsh.d/`` beside this tool's executable, so the tool
always edits the configuration of its own tier.

Input ``{"set": {"key": value, ...}}`` updates those keys; without ``set`` the configuration
is only read. The arguments may be ``key=value`` settings instead: ``tsh.config
cache_capacity=64 window_percent=2``. Every setting is checked before anything is written,
and all are written together or none. Native output ``{"path", "config", "changed",
"warnings"}``, ``changed`` the keys whose value the update changed (an update that changes
nothing leaves the file untouched); terminal output the effective ``key=value`` lines, the
warnings on stderr: each line of the file tsh cannot use (its default applies), or a file
that is missing (all the defaults apply, as in tsh; an update creates it). An update
rewrites the file in one rename, keeping its comments and the order of its lines; a key that
was absent is appended; concurrent updates take turns under the lock of the tier's installs,
so none is lost. Who may update it is the tier's owner (and root): the file belongs to the
storage root's owner, and the lock, ``.install-lock`` of the tier, only its owner may open,
so an agent, or another uid, can read the configuration but not change it, even where the
file and ``tsh.d/`` were made writable to it.

``ctx tool tsh.config …`` runs this same code inside ``ctx``, as the host user (SPEC H-3).
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cortexfs import durable, jsontext, keyvalue
from cortexfs.names import is_decimal
from cortexfs.printable import quoted
from cortexfs.regular_file import read_regular_file
from cortexfs.tools.core.toolio import Reply, ToolFailure, core_main

TOOL = "tsh.config"
DEFAULTS = {"max_loaded_tools": 64, "cache_capacity": 32, "window_percent": 1}
# window_percent is a percentage.  tsh sizes the frequency sketch of its path cache by
# cache_capacity when it starts: 2**16 names take it tens of MB and a tenth of a second, while
# a capacity in the millions would hold tsh for minutes or exhaust its memory.
# max_loaded_tools bounds what tsh keeps of tools' metadata in memory: no terminal runs more.
_LIMITS = {"window_percent": 100, "cache_capacity": 65536, "max_loaded_tools": 65536}
_MAX_DIGITS = 64  # past every limit, far short of the 4300 digits Python reads into an int
DEFAULT_TEXT = "# tsh configuration (SPEC H-4): data, never code.\n" + "".join(
    f"{key}={value}\n" for key, value in DEFAULTS.items()
)
CONFIG_NAME = "config"
CONFIG_MODE = 0o644  # the host's to write, every agent's to read
MAX_CONFIG_BYTES = 64 * 1024


def config_path(executable: str) -> Path:
    """``tsh.d/config`` in the directory that holds the ``tsh.config`` executable."""
    return Path(os.path.abspath(executable)).parent / "tsh.d" / CONFIG_NAME


def problems(text: str) -> list[str]:
    """What is wrong with a configuration's text, one sentence per line at fault."""
    found = []
    first_line: dict[str, int] = {}
    for line in keyvalue.lines(text):
        where = f"tsh.d/config:{line.number}"
        if line.key is not None and line.key.startswith("\ufeff"):
            found.append(
                f"{where}: the line starts with a byte order mark (U+FEFF), which is no part "
                "of a key, so the setting is not read: save the file without it"
            )
            continue
        if line.key not in DEFAULTS:
            found.append(f"{where}: expected one of {', '.join(DEFAULTS)} as key=value")
            continue
        problem = value_problem(line.key, line.value)
        if problem:
            found.append(f"{where}: {problem}")
        if line.key in first_line:
            found.append(
                f"{where}: {line.key} is given again (first on line {first_line[line.key]}), "
                "so which one holds is unclear; keep one"
            )
        first_line.setdefault(line.key, line.number)
    return found


def value_problem(key: str, value: object) -> str | None:
    """Why ``value`` (an int, or its text) is not a valid setting of ``key``; None if it is."""
    if isinstance(value, str):
        value = _decimal(value)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        if isinstance(value, str) and is_decimal(value):  # too long for _decimal to read
            most = f"at most {_LIMITS[key]}" if key in _LIMITS else "a smaller number"
            return f"{key} must be {most}, not a number of {len(value)} digits"
        # A word of the command line is quoted; a JSON value is spelt as JSON spells it.
        shown = quoted(value) if isinstance(value, str) else jsontext.spelt(value)
        return f"{key} must be a positive integer, not {shown}"
    limit = _LIMITS.get(key)
    if limit is not None and value > limit:
        return f"{key} must be at most {limit}, not {value}"
    return None


def _decimal(text: str) -> int | str:
    """``text`` as an int when it is written in ASCII decimal digits, at most
    :data:`_MAX_DIGITS` of them past its leading zeros, else ``text`` itself (Python refuses
    to read an int of over 4300 digits, and no setting needs one)."""
    digits = text.lstrip("0") or "0"
    return int(digits) if is_decimal(text) and len(digits) <= _MAX_DIGITS else text


def effective(text: str) -> dict[str, int]:
    """The settings ``text`` gives, the defaults for keys it leaves out, sets badly, or sets
    more than once (:func:`problems` says which)."""
    lines = list(keyvalue.lines(text))
    given = [line.key for line in lines]
    settings = dict(DEFAULTS)
    for line in lines:
        if line.key not in DEFAULTS or given.count(line.key) > 1:
            continue
        value = _decimal(line.value)  # thousands of leading zeros are no int() to Python
        if isinstance(value, int) and value_problem(line.key, value) is None:
            settings[line.key] = value
    return settings


def updated(text: str, changes: dict[str, int]) -> str:
    """``text`` with each changed key's lines rewritten in place (or appended)."""
    rows = text.split("\n")  # as keyvalue.lines numbers them
    if rows[-1] == "":
        rows.pop()  # what followed the newline that ends the last line
    pending = dict(changes)
    for line in keyvalue.lines(text):
        if line.key in changes:
            # A line that ended "\r\n" still does: a file saved with CRLF stays one.
            carriage_return = "\r" if line.raw.endswith("\r") else ""
            rows[line.number - 1] = f"{line.key}={changes[line.key]}{carriage_return}"
            pending.pop(line.key, None)
    rows += [f"{key}={value}" for key, value in pending.items()]
    return "".join(f"{row}\n" for row in rows)


def configure(
    path: Path, request: dict[str, Any], native: bool, program: str | None = None
) -> Reply:
    """Read ``path``'s configuration and apply the request's ``set``, if any.

    In terminal mode a read also warns of each line tsh cannot use (on stderr, as ``program``
    when it runs inside one): the settings shown are then the defaults for those keys, and
    without the warning they would pass for what the file says."""
    changes = _changes(request.get("set"))
    before, text = _update(path, changes) if changes else (None, _read(path))
    if text is None:
        notes = [
            f"{path} does not exist: every default applies ('ctx bootstrap' or an update "
            "creates it)"
        ]
        text = DEFAULT_TEXT
    else:
        notes = [f"{problem} (ignored; the default applies)" for problem in problems(text)]
    settings = effective(text)
    # What the update changed, not what it was asked: setting a key to the value it has is
    # no change (and leaves the file as it was).
    changed = [] if before is None else sorted(k for k in changes if before[k] != settings[k])
    data = {"path": str(path), "config": settings, "changed": changed, "warnings": notes}
    speaker = f"{program}: warning: {TOOL}" if program else f"{TOOL}: warning"
    return Reply(
        data,
        text="".join(f"{k}={v}\n" for k, v in settings.items()).encode(),
        stderr="".join(f"{speaker}: {note}\n" for note in notes).encode(),
    )


def settings_from_arguments(arguments: list[str]) -> dict[str, Any]:
    """The shorthand ``tsh.config key=value [key=value…]``: ``{"set": {key: value, …}}``, each
    value a number when it is written in decimal digits (else as given, for
    :func:`value_problem` to refuse).  A key given twice is refused, as a JSON object naming it
    twice is."""
    settings: dict[str, Any] = {}
    for argument in arguments:
        key, equals, value = (part.strip() for part in argument.partition("="))
        if not equals:
            raise ToolFailure(errno.EINVAL, f"expected key=value, not {argument!r}", usage=True)
        if key in settings:
            raise ToolFailure(errno.EINVAL, f"{key!r} is given twice", usage=True)
        settings[key] = _decimal(value)
    return {"set": settings}


def _changes(requested: object) -> dict[str, int]:
    if requested is None:
        return {}
    if not isinstance(requested, dict):
        raise ToolFailure(errno.EINVAL, "'set' must be an object of settings", usage=True)
    for key, value in requested.items():
        if key not in DEFAULTS:
            known = ", ".join(DEFAULTS)
            raise ToolFailure(errno.EINVAL, f"unknown setting {key!r}; known: {known}", usage=True)
        problem = value_problem(key, value)
        if problem:
            raise ToolFailure(errno.EINVAL, problem, usage=True)
    # "64" is written as 64; "0…064" too, however many its zeros (judged valid above).
    return {
        key: int(_decimal(value) if isinstance(value, str) else value)
        for key, value in requested.items()
    }


def _missing(path: Path) -> ToolFailure:
    return ToolFailure(errno.ENOENT, f"{path.parent} does not exist; ctx bootstrap creates it")


def _read(path: Path, errors: str = "replace") -> str | None:
    """The configuration's text; None when there is no file (tsh then takes every default).
    ``errors="surrogateescape"`` keeps bytes that are not UTF-8 (an update writes them back
    as they were); the default shows each as U+FFFD."""
    try:
        data = read_regular_file(path, MAX_CONFIG_BYTES)
    except FileNotFoundError:
        if not path.parent.is_dir():
            raise _missing(path) from None
        return None
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise ToolFailure(errno.EINVAL, f"{path} is not a regular file") from None
        if exc.errno == errno.EFBIG:
            too_large = f"{path} is larger than {MAX_CONFIG_BYTES} bytes"
            raise ToolFailure(errno.EFBIG, too_large) from None
        raise
    return data.decode("utf-8", errors)


def _update(path: Path, changes: dict[str, int]) -> tuple[dict[str, int], str]:
    """Apply ``changes`` to the configuration; the settings before, and the new text.

    Read, update and replace happen under the exclusive lock of the tier (``tool/``) that
    installs of tsh hold (:mod:`cortexfs.tools.pairs`): two updates at once (of different
    keys, say) are applied one after the other and neither is lost, and an update never lands
    in a ``tsh.d/`` that a reinstall of tsh has carried over and is about to retire.  The new
    text is written beside the old and renamed into place: readers see one or the other, and
    a crash leaves one or the other (plus, at worst, a temporary file)."""
    ops = durable.default_ops()
    lock = _tier_locked(ops, path)
    try:
        try:
            directory = durable.open_dir_path(ops, str(path.parent))
        except FileNotFoundError:
            raise _missing(path) from None
        try:
            return _update_locked(ops, path, directory, changes)
        finally:
            ops.close(directory)
    finally:
        os.close(lock)  # lets the lock go


def _update_locked(
    ops: durable.FsOps, path: Path, directory: int, changes: dict[str, int]
) -> tuple[dict[str, int], str]:
    # Comments are kept byte for byte, also bytes that are not UTF-8; what is judged and
    # shown reads those as U+FFFD.
    old = _read(path, errors="surrogateescape")
    if old is None:
        text, mode = DEFAULT_TEXT, CONFIG_MODE  # made as bootstrap makes it
        status = os.fstat(directory)
    else:
        text = old
        status = os.stat(path.name, dir_fd=directory, follow_symlinks=False)
        mode = stat.S_IMODE(status.st_mode)
    # The file is the storage root's owner's (docs/tools.md): root's update keeps it theirs,
    # as the file it replaces was, or as its directory is when there was none.
    owner = status.st_uid if os.geteuid() == 0 else None
    shown = _shown(text)
    bad = problems(shown)
    if bad:
        raise ToolFailure(errno.EINVAL, f"{path} must be fixed by hand first: {bad[0]}")
    before = effective(shown)
    text = updated(text, changes)
    if text == old:  # every key already said so: nothing to write
        return before, _shown(text)
    try:
        data = text.encode("utf-8", "surrogateescape")
        durable.replace_file_synced(ops, directory, path.name, data, mode, owner=owner)
    except OSError as exc:
        # The replacement is written beside the file first: the OSError names that
        # temporary, which tells the caller nothing about what was refused and why.
        raise _refused(path, exc) from None
    return before, _shown(text)


def _shown(text: str) -> str:
    """``text`` read with ``surrogateescape`` as a reader shows it: each byte that is not
    UTF-8 as U+FFFD."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _tier_locked(ops: durable.FsOps, path: Path) -> int:
    """The lock file of the tier that holds ``tsh.d/`` (``path``'s directory), locked
    exclusively; its descriptor, whose closing lets the lock go.

    Only those who may install into the tier can open its lock file, so no other uid can
    hold an update back; one that may not is refused as :func:`cortexfs.locks.open_lock_file`
    refuses it, naming the lock file and who may take it.  The lock file is opened as that
    function opens it, never made here: this tool runs from a bundle of its own modules, and
    every install and ``ctx bootstrap`` makes it."""
    tier = path.parent.parent
    try:
        tier_fd = durable.open_dir_path(ops, str(tier))
    except FileNotFoundError:
        raise _missing(path) from None
    try:
        lock = os.open(LOCK_FILE, _LOCK_FLAGS, dir_fd=tier_fd)
    except FileNotFoundError:
        raise ToolFailure(
            errno.ENOENT,
            f"{tier / LOCK_FILE}, the lock that updates of {path} take turns under, is "
            "missing; 'ctx bootstrap' makes it",
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _not_a_lock_file(tier) from None
        raise _lock_refused(tier_fd, tier, path, exc) from None
    finally:
        ops.close(tier_fd)
    try:
        if not stat.S_ISREG(os.fstat(lock).st_mode):
            raise _not_a_lock_file(tier)
        fcntl.flock(lock, fcntl.LOCK_EX)
    except BaseException:
        os.close(lock)
        raise
    return lock


# The tier's lock file, as cortexfs.locks names and opens it (it is not bundled with the tool;
# tests/tools/test_install_lock.py checks that the two agree).
LOCK_FILE = ".install-lock"
_LOCK_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def _not_a_lock_file(tier: Path) -> ToolFailure:
    return ToolFailure(
        errno.EEXIST, f"{tier / LOCK_FILE} is no regular file, so not the tier's lock: move it away"
    )


def _lock_refused(tier_fd: int, tier: Path, path: Path, exc: OSError) -> Exception:
    """What a refusal of the kernel to open the tier's lock file tells the caller: the lock
    file, whose it is, and who may update the configuration (worded as
    :func:`cortexfs.locks.open_lock_file` words it), when the configuration itself is
    writable to the caller; otherwise that the configuration is not its to change."""
    if exc.errno not in (errno.EACCES, errno.EPERM):
        return exc
    if not os.access(path.parent, os.W_OK | os.X_OK, effective_ids=True):
        # The configuration is not the caller's to change either (it is replaced through its
        # directory): that is the refusal to tell, as the configuration's owner is who may.
        return _refused(path, exc)
    try:
        held = os.stat(LOCK_FILE, dir_fd=tier_fd, follow_symlinks=False)
        whose = f" (it belongs to uid {held.st_uid}, mode {stat.S_IMODE(held.st_mode):04o})"
    except OSError:
        whose = ""
    owner = os.fstat(tier_fd).st_uid
    return ToolFailure(
        exc.errno,
        f"{tier / LOCK_FILE} cannot be opened by uid {os.geteuid()}: {exc.strerror}{whose}; "
        f"updates of {path} take turns under it with the installs into {tier}, and only those "
        f"who may install there may take it: run 'ctx tool {TOOL} KEY=VALUE' as the "
        f"directory's owner (uid {owner})",
    )


def _refused(path: Path, exc: OSError) -> Exception:
    """What a refusal of the kernel to change the configuration at ``path`` tells the caller:
    the read-only filesystem to remount, or the owner who may change it."""
    if exc.errno == errno.EROFS:
        return ToolFailure(
            exc.errno,
            f"{path} cannot be changed: it is on a read-only filesystem; remount it read-write",
        )
    if exc.errno not in (errno.EACCES, errno.EPERM):
        return exc
    return ToolFailure(
        exc.errno,
        f"{path} cannot be changed by uid {os.geteuid()} ({exc.strerror}): the "
        "configuration belongs to the storage root's owner, who changes it with "
        f"'ctx tool {TOOL} KEY=VALUE'",
    )


def run_configure(
    path: Path,
    argv: list[str],
    program: str | None = None,
    suggest: Callable[[str], str] | None = None,
) -> int:
    """The tool's command line on the configuration at ``path`` (inside ``program``, if any:
    see :func:`toolio.main`).  ``suggest`` rewrites what it says, so that a command it
    suggests (``'ctx bootstrap'``) names the storage root ``program`` was given."""

    def handle(request: dict[str, Any], native: bool) -> Reply:
        if suggest is None:
            return configure(path, request, native, program)
        try:
            reply = configure(path, request, native, program)
        except ToolFailure as refused:
            said = suggest(refused.message)
            raise ToolFailure(refused.errno, said, usage=refused.usage) from None
        warnings = [suggest(note) for note in reply.data["warnings"]]
        return reply._replace(
            data={**reply.data, "warnings": warnings},
            stderr=suggest(reply.stderr.decode("utf-8", "surrogateescape")).encode(
                "utf-8", "surrogateescape"
            ),
        )

    return core_main(TOOL, settings_from_arguments, handle, argv, program)


def run() -> int:
    return run_configure(config_path(sys.argv[0]), sys.argv[1:])
