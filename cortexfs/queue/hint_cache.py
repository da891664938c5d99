"""The cache directory of claim-order hints: where it is, who may read it, how it stays small.

A *hint* (:class:`cortexfs.queue.claim_order.HintFile`) keeps a queue's claim order between
``ctx queue claim`` processes: one file per queue and user, named by a hash of the queue's
real path, in ``$XDG_CACHE_HOME/cortexfs/claim-order/`` (``~/.cache/…``, or
``/var/cache/cortexfs/claim-order/`` for root).

**Private.**  A hint holds the names of a queue's pending jobs, which a user who may not enter
the queue's shared space must not learn from the cache.  Every directory made for the cache is
mode 0700 and every hint 0600, set on the descriptor whatever the umask; a hint an older
version left readable by others is made 0600 when it is next opened.

**Bounded.**  Each hint records the real path of its queue.  Now and then the directory is
cleaned (:func:`prune_now_and_then`): a hint whose queue no longer exists goes, as does one
unused for :data:`UNUSED_SECONDS`, and any other file (a hint of an older format, a temp file
a killed process left) once it is :data:`PRUNE_INTERVAL` old.  "Now and then" is when a hint is
written anew after a listing of ``pending/`` (a claim that pays for a listing anyway, or
``queue init``), and at most once per :data:`PRUNE_INTERVAL`, as the mtime of
``claim-order/.pruned`` records.  So a claim served from its hint never lists the cache: its
cost depends neither on the number of pending jobs (Q-10) nor on the number of cache files,
and the hourly clean-up costs one ``stat`` and one short read per file.

Nothing here is evidence: a hint removed, or never written, costs its queue one listing.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from cortexfs.storage import user_directory

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700
PRUNE_INTERVAL = 3600.0
UNUSED_SECONDS = 30 * 24 * 3600.0
PRUNED_MARKER = ".pruned"

_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def hint_path(queue_path: Path) -> Path:
    """This user's hint file for the queue at ``queue_path``: under ``$XDG_CACHE_HOME/cortexfs``
    (when that is an absolute path, and for root a directory of root's), else
    ``/var/cache/cortexfs`` for root and ``~/.cache/cortexfs`` for everyone else."""
    return hint_location(queue_path)[0]


def hint_location(queue_path: Path) -> tuple[Path, str]:
    """The hint file for the queue at ``queue_path``, and the queue's real path it records."""
    environ = os.environ
    return _hint_location(
        queue_path, os.geteuid(), environ.get("XDG_CACHE_HOME", ""), environ.get("HOME", "")
    )


@functools.lru_cache(maxsize=64)
def _hint_location(queue_path: Path, euid: int, cache_home: str, home: str) -> tuple[Path, str]:
    """:func:`hint_location`, once per process, queue and user: every publish and claim asks,
    and ``realpath`` costs a ``lstat`` per component.  Should the queue's path be re-pointed
    meanwhile, the hint goes to the old queue's file, which costs a listing, nothing more."""
    if euid == 0 and not _roots_own_directory(cache_home):
        # Root keeps its hints in a directory of its own: a user's XDG_CACHE_HOME, which
        # `su` without `-` leaves in the environment, could lead root through that user's
        # links to make directories and files wherever they point.
        cache = Path("/var/cache/cortexfs")
    else:
        environ = {"XDG_CACHE_HOME": cache_home, "HOME": home}
        cache = user_directory("XDG_CACHE_HOME", ".cache", euid, environ) / "cortexfs"
    import hashlib  # OpenSSL's start, a few milliseconds, paid by the commands that claim

    real = os.path.realpath(queue_path)
    key = hashlib.sha256(os.fsencode(real)).hexdigest()[:32]
    return cache / "claim-order" / key, real


def _roots_own_directory(path: str) -> bool:
    """Whether ``path`` is absolute and names a directory of root's, itself no link, or one
    still to be made below such a directory (its nearest existing part)."""
    if not os.path.isabs(path):
        return False
    place = Path(path)
    while True:
        try:
            status = os.lstat(place)
            break
        except FileNotFoundError:
            if place == place.parent:
                return False
            place = place.parent
        except OSError:
            return False
    return stat.S_ISDIR(status.st_mode) and status.st_uid == 0


# A hint is ``BASE/cortexfs/claim-order/KEY``: BASE (``~/.cache``, ``$XDG_CACHE_HOME``,
# ``/var/cache``) may be made, as the XDG base directory specification has it, but not what
# holds it: a home directory that is missing is not a cache's to make.
_LEVELS_BELOW_THE_BASES_PARENT = 3


def make_private_directories(directory: Path) -> None:
    """``directory`` (a hint's, ``BASE/cortexfs/claim-order``) and its missing parents up to
    BASE, each one made mode 0700 whatever the umask; FileNotFoundError, making nothing, when
    the directory that holds BASE (the home) is missing."""
    parents = directory.parents
    top = parents[min(_LEVELS_BELOW_THE_BASES_PARENT, len(parents)) - 1]  # BASE may be /
    if not os.path.isdir(top):
        raise FileNotFoundError(errno.ENOENT, "no directory to keep a cache in", str(top))
    missing = []
    while not os.path.isdir(directory):
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            os.mkdir(path, DIRECTORY_MODE)
            fd = os.open(path, _DIRECTORY)
            try:
                os.fchmod(fd, DIRECTORY_MODE)
            finally:
                os.close(fd)


def create_private_file(path: Path) -> int:
    """A new file at ``path`` (never an existing one, never through a symlink), mode 0600
    whatever the umask, open for writing."""
    fd = os.open(path, _NEW_FILE, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def keep_private(fd: int, st: os.stat_result) -> None:
    """Make the hint open as ``fd`` (whose status is ``st``) mode 0600, if it is not: one
    written with the umask by an older version.  Another user's file is left as it is."""
    if stat.S_IMODE(st.st_mode) != FILE_MODE:
        with contextlib.suppress(PermissionError):
            os.fchmod(fd, FILE_MODE)


def prune_now_and_then(
    directory: Path, recorded_queue: Callable[[int], str | None], now: float | None = None
) -> None:
    """Clean the hint ``directory`` (see the module's docstring) unless that was done less
    than :data:`PRUNE_INTERVAL` ago.  ``recorded_queue(fd)`` reads the queue a hint records
    (None: it records none), ValueError for a file that is not a hint.  Best effort: what
    cannot be looked at or removed stays, for the next time."""
    now = time.time() if now is None else now
    marker = directory / PRUNED_MARKER
    try:
        if now - os.stat(marker).st_mtime < PRUNE_INTERVAL:
            return
    except FileNotFoundError:
        pass
    with contextlib.suppress(OSError):
        with contextlib.suppress(FileExistsError):
            os.close(create_private_file(marker))
        os.utime(marker, (now, now))  # first: a concurrent claim skips the clean-up
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.name != PRUNED_MARKER:
                    with contextlib.suppress(OSError):
                        _prune_entry(Path(entry.path), recorded_queue, now)


def _prune_entry(path: Path, recorded_queue: Callable[[int], str | None], now: float) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return  # nothing this module made: left alone
        age = now - st.st_mtime
        try:
            queue = recorded_queue(fd)
        except ValueError:
            stale = age >= PRUNE_INTERVAL  # an older format, or a temp file left behind
        else:
            stale = age >= UNUSED_SECONDS or (queue is not None and not _is_queue(queue))
        if not stale:
            keep_private(fd, st)
            return
    finally:
        os.close(fd)
    os.unlink(path)


def _is_queue(path: str) -> bool:
    """Whether ``path`` still holds a queue; True when that cannot be told (EACCES)."""
    try:
        return stat.S_ISDIR(os.stat(os.path.join(path, "pending")).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True
