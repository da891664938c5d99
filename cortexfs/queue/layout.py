"""Where a queue lives and how it is opened: the six directories, the config, safe reads.

A queue is ``shared/<project>/queue/`` with exactly the directories of :data:`STATE_DIRS`
(SPEC §2).  :class:`Queue` holds one ``O_NOFOLLOW`` descriptor per directory for its lifetime,
so every later operation is relative to those descriptors (SPEC Q-8): a symlink swapped into
the tree cannot redirect anything outside it.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import fcntl
import math
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cortexfs import durable, keyvalue
from cortexfs.errors import DISK_ERROR_REMEDY, CtxError, explain_host_trouble, invalid, not_found
from cortexfs.file_attributes import attribute_refusal, entry_attribute_refusal
from cortexfs.locks import flock_within
from cortexfs.names import decimal_value, shown_number
from cortexfs.printable import quoted
from cortexfs.queue.claim_order import ClaimOrder, start_hint
from cortexfs.queue.holder import MAX_LEASE_TTL, check_ttl
from cortexfs.storage import check_space_name, not_reachable, not_readable, require_writable
from cortexfs.timefmt import MAX_SECONDS, SECONDS_TEXT

STATE_DIRS = ("inbox", "pending", "lease", "claimed", "done", "failed")
CONFIG_MODE = 0o644
CONFIG_NAME = "config"
LEASE_FILE = "worker"
RESULT_SUFFIX = ".result"
TEMP_SUFFIX = ".tmp"

_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Refusal(CtxError):
    """A step of a transition the kernel refused, in the words of :meth:`Queue.refusal`.
    ``without_retry`` is its message up to the remedy, without the command line's last step
    (``…, then finish it again``): a caller that goes on otherwise (a worker leaving a job it
    could not finish to recover) says its own next step instead of that one."""

    def __init__(self, code: int, message: str, without_retry: str) -> None:
        super().__init__(code, message)
        self.without_retry = without_retry


@dataclass(frozen=True)
class QueueConfig:
    """``queue/config``: a key=value data file (blank lines and ``#`` comments allowed)."""

    max_request_bytes: int = 1024 * 1024
    max_result_bytes: int = 16 * 1024 * 1024
    lease_ttl: float = 300.0
    grace: float = 60.0
    move: str | None = None

    @classmethod
    def parse(cls, text: str, origin: str = CONFIG_NAME) -> QueueConfig:
        # A key given again counts from there on, as in a shell's settings: a line appended
        # to the config init wrote (which gives every key) overrides it.
        values: dict[str, object] = {}
        for line in keyvalue.lines(text):
            key, value, where = line.key, line.value, f"{origin}:{line.number}"
            if key is None:
                raise invalid(f"{where}: expected key=value, got {quoted(line.raw)}")
            if key in ("max_request_bytes", "max_result_bytes"):
                values[key] = _positive_int(value, where, key)
            elif key == "lease_ttl":
                values[key] = _lease_ttl(value, where)
            elif key == "grace":
                values[key] = _non_negative_float(value, where, key)
                if values[key] > MAX_SECONDS:  # as recover's --grace is bounded
                    raise invalid(
                        f"{where}: grace must be at most {MAX_SECONDS:.0f} seconds (366 days), "
                        f"not {shown_number(value)}"
                    )
            elif key == "move":
                if value not in (durable.MOVE_RENAME, durable.MOVE_LINK):
                    raise invalid(f"{where}: move must be 'rename' or 'link', not {quoted(value)}")
                values[key] = value
            else:
                known = "max_request_bytes, max_result_bytes, lease_ttl, grace, move"
                raise invalid(f"{where}: unknown key {quoted(key)} (known keys: {known})")
        return cls(**values)  # type: ignore[arg-type]

    def render(self) -> str:
        return (
            "# CortexFS queue configuration (key=value; see docs/queue.md)\n"
            f"max_request_bytes={self.max_request_bytes}\n"
            f"max_result_bytes={self.max_result_bytes}\n"
            f"lease_ttl={self.lease_ttl:g}\n"
            f"grace={self.grace:g}\n"
            + (
                f"move={self.move}\n"
                if self.move
                else "# move=rename or move=link (default: chosen by the filesystem's type)\n"
            )
        )


def _positive_int(value: str, where: str, key: str) -> int:
    number = decimal_value(value)
    if number is None or number <= 0:
        raise invalid(f"{where}: {key} must be a positive integer, not {shown_number(value)}")
    return number


def _lease_ttl(value: str, where: str) -> float:
    """A lease lifetime as ``claim --ttl`` takes it; refused naming that rule (above 0: a
    negative value breaks it as 0 does) and the value as written."""
    number = float(value) if SECONDS_TEXT.fullmatch(value) else math.nan
    try:
        return check_ttl(number)  # the rule claim --ttl follows, in one place
    except CtxError:
        raise invalid(
            f"{where}: lease_ttl must be a number of seconds above 0 and at most "
            f"{MAX_LEASE_TTL:.0f} (366 days), not {shown_number(value)}"
        ) from None


def _non_negative_float(value: str, where: str, key: str) -> float:
    number = float(value) if SECONDS_TEXT.fullmatch(value) else -1.0
    if not number >= 0 or number == float("inf"):
        raise invalid(
            f"{where}: {key} must be a non-negative number of seconds, not {shown_number(value)}"
        )
    return number


def as_path(path: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> Path:
    """``path`` given as ``os`` takes one (a str, bytes or a path-like object) as a Path;
    TypeError for anything else (None is no path, not a missing one)."""
    return Path(os.fsdecode(path))


def queue_path(root: Path, project: str) -> Path:
    """``<root>/shared/<project>/queue``; the project must be a legal object name (R-3) and a
    possible space: not the manual bundle (X-2)."""
    return root / "shared" / check_space_name(project, "project") / "queue"


class _StateDirs(dict[str, int]):
    """A queue's state directories by name, as descriptors; a closed queue holds none, and
    asking it for one is a ValueError, as an operation on a closed file is."""

    def __init__(self, path: Path, opened: dict[str, int] | None = None) -> None:
        super().__init__(opened or {})
        self.path = path

    def __missing__(self, name: str) -> int:
        raise ValueError(f"queue {self.path} is closed: open it again with Queue.open")


@dataclass
class Queue:
    """An opened queue: one descriptor per state directory, the config, the operations object."""

    path: Path
    ops: durable.FsOps
    config: QueueConfig
    root_fd: int
    dirs: dict[str, int] = field(default_factory=dict)
    claim_order: ClaimOrder = field(default_factory=ClaimOrder)
    # The access the queue directory grants its group (0o070 in a shared space, X-1): every
    # directory the protocol makes in the queue gets it, every file its read and write bits,
    # whatever the creating process's umask, so that another member of the group can recover
    # or finish a claim this process leaves behind.
    group_access: int = 0

    def __post_init__(self) -> None:
        self.dirs = _StateDirs(self.path, self.dirs)

    # ------------------------------------------------------------------ opening and closing

    @classmethod
    def open(
        cls, path: Path, ops: durable.FsOps | None = None, *, within: Path | None = None
    ) -> Queue:
        """Open the queue at ``path``, never through a symlink at its last component.

        ``within``: a directory ``path`` lies below (the storage root of a project's queue,
        ``ROOT/shared/P/queue``): no component below it is followed either (Q-8), so a
        symlinked ``shared/P`` cannot take the queue outside the root (ELOOP).
        """
        path = as_path(path)  # str, bytes or PathLike, as os takes them; else TypeError
        ops = ops or durable.default_ops()
        root_fd = _open_queue_dir(ops, path, within)
        queue = cls(
            path=path, ops=ops, config=QueueConfig(), root_fd=root_fd, claim_order=ClaimOrder(path)
        )
        queue.group_access = stat.S_IMODE(os.fstat(root_fd).st_mode) & 0o070
        try:
            for name in STATE_DIRS:
                queue.dirs[name] = queue._open_state_dir(name)
            queue.config = queue._read_config()
        except BaseException:
            queue.close()
            raise
        if queue.config.move and ops.move_strategy is None:
            queue.ops = _with_move_strategy(ops, queue.config.move)
        return queue

    def _open_state_dir(self, name: str) -> int:
        try:
            return self.ops.open_dir(name, self.root_fd)
        except FileNotFoundError as exc:
            raise not_found(
                f"queue {self.path} has no {name}/ directory; repair it with 'ctx queue init'"
            ) from exc
        except PermissionError:
            raise not_readable(self.path / name, f"open queue {self.path}") from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._not_a_real_directory(name, exc) from exc
            raise self._refused_opening(name, exc) from None

    def _not_a_real_directory(self, name: str, exc: OSError) -> CtxError:
        """A state directory that is a link (ELOOP, as a link anywhere on a queue's path:
        the kernel says ENOTDIR of a link opened as a directory without following it) or
        another kind of file (ENOTDIR)."""
        try:
            found = lstat_at(self.root_fd, name)
        except OSError:
            found = None
        is_link = exc.errno == errno.ELOOP if found is None else stat.S_ISLNK(found.st_mode)
        if is_link:
            return CtxError(
                errno.ELOOP,
                f"{self.path}/{name} is a symlink, not a real directory; refusing to follow it",
            )
        return CtxError(
            errno.ENOTDIR, f"{self.path}/{name} is not a real directory; refusing to use it"
        )

    def reread_config(self) -> None:
        """Read ``config`` again: a long-lived user of the queue (a worker, before each claim)
        is held to the limits an administrator set after it opened the queue, and stops, as
        every command refuses, at a config it can no longer read.  The ``move`` strategy stays
        the one it opened the queue with: every step of a job goes by one."""
        self.config = self._read_config()

    def _read_config(self) -> QueueConfig:
        try:
            data = read_regular_file(self.root_fd, CONFIG_NAME, 64 * 1024)
        except FileNotFoundError:
            return QueueConfig()
        except PermissionError:
            # Never the defaults instead: the queue's limits are what its config says.
            raise not_readable(self.path / CONFIG_NAME, f"open queue {self.path}") from None
        except CtxError as exc:
            # read_regular_file names the config alone, which says nothing of which queue.
            raise CtxError(
                exc.errno,
                f"{self.path}/{exc.message}; move it aside, and 'ctx queue init' writes the "
                "default config in its place",
            ) from None
        except OSError as exc:
            raise self._refused_opening(CONFIG_NAME, exc) from None
        return QueueConfig.parse(data.decode("utf-8", "replace"), f"{self.path}/{CONFIG_NAME}")

    def _refused_opening(self, name: str, exc: OSError) -> CtxError:
        """The error for the queue's own ``name`` (a state directory, its config) the kernel
        refused to open for a reason other than what it is (EMFILE, ENOMEM, EIO…): opening
        changes nothing in the queue, and the error says so, what ran short and what to do."""
        shortage, fix = self._what_ran_short(exc.errno)
        return _cannot_open(self.path, exc, shortage, fix, refused=f"{self.path}/{name}")

    def close(self) -> None:
        for fd in self.dirs.values():
            os.close(fd)
        self.dirs.clear()
        if self.root_fd >= 0:
            os.close(self.root_fd)
            self.root_fd = -1

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ directories

    @property
    def inbox(self) -> int:
        return self.dirs["inbox"]

    @property
    def pending(self) -> int:
        return self.dirs["pending"]

    @property
    def lease(self) -> int:
        return self.dirs["lease"]

    @property
    def claimed(self) -> int:
        return self.dirs["claimed"]

    @property
    def done(self) -> int:
        return self.dirs["done"]

    @property
    def failed(self) -> int:
        return self.dirs["failed"]

    @property
    def file_group(self) -> int:
        """The group bits a file the protocol creates gets (read and write, never execute)."""
        return self.group_access & 0o060

    def terminal(self, ok: bool) -> int:
        return self.done if ok else self.failed

    def open_job_dir(self, state: str, job: str) -> int:
        """Open ``claimed/J`` or ``lease/J`` (never through a symlink)."""
        return self.ops.open_dir(job, self.dirs[state])

    def open_held_job_dir(self, state: str, job: str) -> int:
        """:meth:`open_job_dir` for a command that acts on J's claim (renew, finish): what
        stands at ``claimed/J`` or ``lease/J`` when it is no directory (a symlink another
        member put there, a file) is refused as the conflict it is, naming it; ENOENT and
        the host's refusals are raised as they are, for the caller to say."""
        try:
            return self.open_job_dir(state, job)
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            found = lstat_at(self.dirs[state], job)
            if found is None:
                raise
            if stat.S_ISDIR(found.st_mode):
                # Swapped back since the open met something else there: say what it met.
                raise NotADirectoryOfTheJob(
                    exc.errno,
                    f"job {job}'s {state}/{job} was no directory when this command opened it "
                    "(a symbolic link or a file, which a queue command never follows, Q-8), "
                    "and is a directory again now: another process is exchanging it; nothing "
                    f"was changed: 'ctx queue show {job}' lists its evidence",
                ) from None
            raise NotADirectoryOfTheJob(
                errno.ELOOP if stat.S_ISLNK(found.st_mode) else errno.ENOTDIR,
                f"job {job}'s {state}/{job} is a {kind_of(found)}, not a directory: a conflict "
                "that no command resolves, and nothing was changed (a queue command never "
                f"follows it, Q-8); 'ctx queue show {job}' lists its evidence: put the "
                "directory back, or move the job's entries aside by hand",
            ) from None

    def require_writable(self, action: str, places: tuple[str, ...] = STATE_DIRS) -> None:
        """EACCES (EROFS on a read-only filesystem), saying who may write there and what to
        do, unless this process may write every directory of ``places`` (paths in the queue:
        ``pending``, ``claimed/J``; by default every state directory, as a worker needs;
        ``action``: what for).  For a transition that cannot undo its later steps (finish)."""
        for place in places:
            state, _, job = place.partition("/")
            # Relative to the descriptors we hold: a finish asks about six directories.
            parent, name = (self.dirs[state], job) if job else (self.root_fd, state)
            if not os.access(name, os.W_OK | os.X_OK, dir_fd=parent, effective_ids=True):
                refused = self._why_not_writable(place, action)
            else:
                # access(2) knows the immutable attribute but not the append-only one, which
                # lets entries in and never out: asked of each directory all the same.
                refused = self._attribute_refusal(place, action)
            if refused is not None:
                raise refused

    def require_unpinned(self, action: str, places: tuple[str, ...], done: str) -> None:
        """EPERM naming the attribute and the ``chattr`` that lifts it, followed by ``done``
        (what the step did: ``nothing was published``), when a directory of ``places`` is
        immutable or append-only.  Asked by a step that stages a file in ``inbox/`` and then
        moves it out, before it writes anything: an append-only inbox lets the file in, and
        neither out nor away again."""
        for place in places:
            refused = self._attribute_refusal(place, action)
            if refused is not None:
                raise refused.then(done)

    def require_changeable(self, action: str, entries: tuple[str, ...]) -> None:
        """EPERM, naming the attribute and the ``chattr`` that lifts it, when one of the files
        ``entries`` (paths in the queue: ``claimed/J/J``, ``lease/J/worker``) that ``action``
        will move, replace or remove is immutable or append-only: its directory's mode allows
        the step, and the kernel refuses it all the same.  For a transition that cannot undo
        its later steps (finish), as :meth:`require_writable` is."""
        for entry in entries:
            refused = self._pinned(entry, action)
            if refused is not None:
                raise refused

    def refusal_now(
        self, action: str, places: tuple[str, ...], entries: tuple[str, ...] = ()
    ) -> CtxError | None:
        """What would refuse ``action`` now, asked without trying it (a dry run): an
        immutable or append-only attribute of one of the files ``entries`` or of the
        directories ``places``, a read-only filesystem, a mode; None when nothing does."""
        for entry in entries:
            refused = self._pinned(entry, action)
            if refused is not None:
                return refused
        for place in places:
            refused = self._why_not_writable(place, action)
            if refused is not None:
                return refused
        return None

    def _pinned(self, entry: str, action: str) -> CtxError | None:
        """The refusal of ``action`` by an attribute of ``entry`` (``pending/J``,
        ``lease/J/worker``), or None."""
        place, _, name = entry.rpartition("/")
        state, _, job = place.partition("/")
        try:
            fd = self.open_job_dir(state, job) if job else os.dup(self.dirs[state])
        except OSError:
            return None  # what is missing is the step's own error to tell
        try:
            return entry_attribute_refusal(fd, name, f"{action} in queue {self.path}",
                                           self.path / entry)  # fmt: skip
        finally:
            os.close(fd)

    def _why_not_writable(self, place: str, action: str) -> CtxError | None:
        """Why this process may not change ``place`` (``pending``, ``claimed/J``), in the
        words of a refusal of ``action``: an immutable or append-only attribute (EPERM, which
        no mode explains), a read-only filesystem (EROFS), or who may write there (EACCES).
        None when nothing refuses it now."""
        refused = self._attribute_refusal(place, action)
        if refused is not None:
            return refused
        try:
            require_writable(self.path / place, f"{action} in queue {self.path}")
        except CtxError as exc:
            return exc
        return None

    def _attribute_refusal(self, place: str, action: str) -> CtxError | None:
        """The refusal of ``action`` by an attribute of the directory ``place`` (``inbox``,
        ``claimed/J``), or None: none, or no such directory (its mode or its absence is
        the step's own error to tell)."""
        try:
            fd = self._open_place(place)
        except OSError:
            return None
        return attribute_refusal(fd, f"{action} in queue {self.path}", self.path / place)

    def _open_place(self, place: str) -> int:
        """A descriptor of its own (the caller closes it) of the directory ``place``, as
        :meth:`require_writable` names them: a state (``inbox``) or a job's (``claimed/J``)."""
        state, _, job = place.partition("/")
        return self.open_job_dir(state, job) if job else os.dup(self.dirs[state])

    def refusal(
        self,
        action: str,
        state: str,
        refused: OSError,
        done: str,
        again: str,
        entries: tuple[str, ...] = (),
    ) -> Refusal:
        """The error for ``action`` refused by the kernel (``refused``) in the directory
        ``state`` (``inbox``, ``lease/J``…): it names that directory, says what the command did
        and did not do (``done``: ``nothing was published``) and what to do before ``again``
        (``publish again``).  For EACCES, EPERM or EROFS: an immutable or append-only attribute
        and who may remove it, that its filesystem is read-only, or who may write there; for a
        shortage (ENOSPC, EDQUOT, EMFILE…): what ran short, and what frees it.  Never a bare
        errno, which says neither where nor whether anything changed.  ``entries``: the files
        the step moves or replaces (``pending/J``), whose own attributes are asked first."""
        return self.refusal_among(action, (state,), refused, done, again, entries)

    def refusal_among(
        self,
        action: str,
        places: tuple[str, ...],
        refused: OSError,
        done: str,
        again: str,
        entries: tuple[str, ...] = (),
    ) -> Refusal:
        """:meth:`refusal` for a step that changes several directories (``places``, as
        :meth:`require_writable` takes them), when which one refused is not known: it names the
        first of them that refuses now, and all of them when none does (the mode changed back
        since, or a security module refused)."""
        if refused.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            # Only EPERM comes of an attribute of an entry (immutable, append-only).
            pinnable = entries if refused.errno == errno.EPERM else ()
            explained = self.refusal_now(action, places, pinnable)
            if explained is not None:
                said = f"{explained.message}; {done}"
                return Refusal(explained.errno, said, said)
        if refused.errno == errno.EXDEV:
            places = self._on_other_mounts(places) or places
        if len(places) == 1:
            where = str(self.path / places[0])
        else:
            where = f"one of {', '.join(f'{place}/' for place in places)}"
        shortage, fix = self._what_ran_short(refused.errno)
        cause = (
            f"cannot {action} in queue {self.path}: {where} refused: {refused.strerror}"
            f"{shortage}; {done}: {fix}"
        )
        return Refusal(refused.errno or errno.EIO, f"{cause}, then {again}", cause)

    def _on_other_mounts(self, places: tuple[str, ...]) -> tuple[str, ...]:
        """Those of ``places`` (``pending``, ``claimed/J``) on another mount than the queue
        directory itself (another filesystem, or a bind mount of the same one: a rename
        crosses neither), as far as the kernel tells."""
        queue_mount = _mount_of(self.root_fd)
        apart = []
        for place in places:
            try:
                fd = self._open_place(place)
            except OSError:
                continue
            try:
                if _mount_of(fd) != queue_mount:
                    apart.append(place)
            finally:
                os.close(fd)
        return tuple(apart)

    def _what_ran_short(self, code: int | None) -> tuple[str, str]:
        """`` (what ran short)`` for a refusal's message, and what to do about it."""
        if code == errno.EXDEV:
            return (
                " (a directory of the queue is on another filesystem than the rest, and a "
                "rename never crosses filesystems)",
                "put the queue's directories on one filesystem ('findmnt -T DIR' shows which "
                "each is on)",
            )
        trouble = explain_host_trouble(code, filesystem=self.root_fd, uid=os.geteuid())
        if trouble is None:
            return "", "fix the cause ('ctx queue status' shows the queue as it stands)"
        return trouble.aside, trouble.remedy

    def temp_name(self, job: str, purpose: str) -> str:
        """A fresh staging name in ``inbox/`` that says which job and step it belongs to."""
        return f"{job}.{purpose}.{os.urandom(6).hex()}{TEMP_SUFFIX}"

    def publish_temp_name(self, job: str) -> str:
        """The one staging name of a publish of ``job``: creating it (``O_EXCL``) is the
        arbitration between publishers of the same name (Q-1), as ``mkdir claimed/J`` is
        between claimers; the move into ``pending/`` releases it."""
        return f"{job}.publish{TEMP_SUFFIX}"


def _mount_of(fd: int) -> tuple[str, int]:
    """Which mount ``fd`` lies on: its mount id (``/proc/self/fdinfo``), else, where that
    cannot be read, its device (which tells filesystems apart, not bind mounts)."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as info:
            for line in info:
                if line.startswith(b"mnt_id:"):
                    return ("mount", int(line.split()[1]))
    except (OSError, ValueError, IndexError):
        pass
    return ("device", os.fstat(fd).st_dev)


def open_dir_below(ops: durable.FsOps, top: Path, path: Path) -> int:
    """Open the directory ``path`` one component at a time from ``top``, following no symlink
    below ``top`` (``O_NOFOLLOW`` relative to the descriptor of the component before).

    ``top`` itself is reached as it is named: a storage root may be a symlink its
    administrator made (``storage/current`` -> a release).  ELOOP naming the first component
    that is a symlink, ENOTDIR one that is not a directory, FileNotFoundError a missing one,
    PermissionError naming the directory that refused (``top`` itself: a root its owner may
    enter but not list).
    """
    try:
        names = path.relative_to(top).parts
    except ValueError:
        raise invalid(f"{path} does not lie below {top}") from None
    try:
        fd = durable.open_dir_path(ops, os.path.realpath(top))
    except PermissionError as exc:
        raise PermissionError(exc.errno, exc.strerror, str(top)) from None
    reached = top
    for name in names:
        reached = reached / name
        try:
            inner = ops.open_dir(name, fd)
        except OSError as exc:
            found = lstat_at(fd, name) if exc.errno in (errno.ELOOP, errno.ENOTDIR) else None
            ops.close(fd)
            if isinstance(exc, PermissionError):
                raise PermissionError(exc.errno, exc.strerror, str(reached)) from None
            if found is not None and stat.S_ISLNK(found.st_mode):
                raise CtxError(
                    errno.ELOOP,
                    f"{reached} is a symlink; nothing below {top} is followed (Q-8), so "
                    "refusing to use it: replace it with the directory itself",
                ) from None
            if found is not None:
                raise CtxError(
                    errno.ENOTDIR,
                    f"{reached} is not a directory: it is in the way; move it aside, nothing "
                    "was changed",
                ) from None
            raise
        passed, fd = fd, inner  # rebound before the close: the cleanup after a Ctrl-C
        ops.close(passed)  # between the two must not close this one again
    return fd


def _open_queue_dir(ops: durable.FsOps, path: Path, within: Path | None) -> int:
    """The queue directory's descriptor (see :meth:`Queue.open`)."""
    try:
        if within is None:
            return durable.open_dir_path(ops, str(path))
        return open_dir_below(ops, within, path)
    except FileNotFoundError as exc:
        raise not_found(f"no queue at {path}; create it with 'ctx queue init'") from exc
    except PermissionError as exc:
        raise _refused_opening_queue(Path(path), exc) from None
    except OSError as exc:
        trouble = explain_host_trouble(exc.errno)
        if trouble is None:
            raise
        raise _cannot_open(path, exc, trouble.aside, trouble.remedy) from None


def _refused_opening_queue(path: Path, exc: PermissionError) -> CtxError:
    """The EACCES for queue ``path`` whose opening the kernel refused at the directory
    ``exc`` names, which need not be the queue: the storage root above it, say, that its
    owner made unlistable.  One on the way is named as a directory the caller may not
    enter, when it may not; else as one it may not read."""
    action = f"open queue {path}"
    refused = Path(exc.filename) if exc.filename else path
    if refused != path and refused in path.parents:
        below = refused / path.relative_to(refused).parts[0]
        on_the_way = not_reachable(below, action)
        if on_the_way is not None:
            return on_the_way
    return not_readable(refused, action)


def _cannot_open(
    path: Path, exc: OSError, shortage: str, fix: str, *, refused: str | None = None
) -> CtxError:
    """The error for queue ``path`` that could not be opened, the kernel's ``exc`` met at
    ``refused`` (one of its own entries) or at the queue itself: opening changes nothing in
    it, and the error says so, what ran short (``shortage``) and what to do (``fix``)."""
    where = f"{refused} refused: " if refused else ""
    return CtxError(
        exc.errno or errno.EIO,
        f"cannot open queue {path}: {where}{exc.strerror}{shortage}; nothing in it was "
        f"changed: {fix}, then run the command again",
    )


def check_existing_queue(
    path: Path, ops: durable.FsOps | None = None, *, within: Path | None = None
) -> None:
    """Refuse what :meth:`Queue.open` would refuse of what exists at ``path``, with its error:
    a symlink on the way (ELOOP), a state directory that is not a real one, a config that
    cannot be read or parsed.  What is missing (the queue, a state directory, the config) is
    not refused: ``queue init`` makes it, and it is the only repair init makes.  So init
    never calls "ready" a queue every other command refuses, and refuses before it changes
    anything."""
    ops = ops or durable.default_ops()
    try:
        root_fd = _open_queue_dir(ops, path, within)
    except CtxError as exc:
        if exc.errno == errno.ENOENT:
            return
        raise
    found = Queue(path=path, ops=ops, config=QueueConfig(), root_fd=root_fd)
    try:
        for name in STATE_DIRS:
            try:
                found.dirs[name] = found._open_state_dir(name)
            except CtxError as exc:
                if exc.errno != errno.ENOENT:
                    raise
        found._read_config()
    finally:
        found.close()


def _with_move_strategy(ops: durable.FsOps, strategy: str) -> durable.FsOps:
    """A copy of ``ops`` (same class, same hooks) that always uses ``strategy``."""
    clone = object.__new__(type(ops))
    clone.__dict__.update(ops.__dict__)
    clone.move_strategy = strategy
    return clone


def init_queue(
    path: Path, ops: durable.FsOps | None = None, *, explain_refusals: bool = True
) -> list[str]:
    """Create the queue directories (and missing parents) durably; return what was created.

    Idempotent.  A default ``config`` is written when none exists, so the knobs are
    discoverable.  A step the kernel refuses is a :class:`CtxError` naming the directory that
    refused and what to do (:func:`_init_refused_in`); with ``explain_refusals`` false, the
    kernel's own error, for a caller that explains it as part of a larger whole (a shared
    space being made).
    """
    path = as_path(path)
    ops = ops or durable.default_ops()

    def refused_in(directory: Path) -> contextlib.AbstractContextManager[None]:
        if explain_refusals:
            return _init_refused_in(path, directory)
        return contextlib.nullcontext()

    created: list[str] = []
    missing: list[Path] = []
    probe = path
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = probe.parent
    for directory in reversed(missing):
        with refused_in(directory.parent):
            parent_fd = durable.open_dir_path(ops, str(directory.parent))
            try:
                if durable.make_dir_synced(ops, parent_fd, directory.name, 0o775):
                    created.append(str(directory))
            finally:
                ops.close(parent_fd)
    with refused_in(path):
        root_fd = durable.open_dir_path(ops, str(path))
    try:
        with refused_in(path):
            created += _make_queue_entries(ops, path, root_fd)
    finally:
        ops.close(root_fd)
    return created


def _make_queue_entries(ops: durable.FsOps, path: Path, root_fd: int) -> list[str]:
    """Make the state directories and the default ``config`` missing in the queue directory
    ``path`` (open as ``root_fd``); return what was made."""
    created: list[str] = []
    for name in STATE_DIRS:
        if durable.make_dir_synced(ops, root_fd, name, 0o775):
            created.append(f"{path}/{name}")
            _give_the_queue_group(ops, root_fd, name)
            if name == "pending":
                start_hint(path)  # an empty pending/ is completely described by no names
    _remove_stray_config_temps(ops, root_fd)
    if lstat_at(root_fd, CONFIG_NAME) is None:
        tmp = f".{CONFIG_NAME}.{os.urandom(6).hex()}{TEMP_SUFFIX}"
        # Readable by everyone who may reach the queue whatever the creator's umask: every
        # member of a shared space's group opens the queue through it.
        config = QueueConfig().render().encode()
        try:
            durable.write_file_synced(ops, root_fd, tmp, config, CONFIG_MODE, exact_mode=True)
            durable.move_noreplace(ops, root_fd, tmp, root_fd, CONFIG_NAME)
            created.append(f"{path}/{CONFIG_NAME}")
        except FileExistsError:
            durable.remove_entries(ops, [(root_fd, tmp, False)])  # another init's won
        except BaseException:
            # Refused midway (a full disk, an I/O error): no temp of ours outlives it,
            # where nothing would ever look for it.
            with contextlib.suppress(OSError):
                durable.remove_entries(ops, [(root_fd, tmp, False)])
            raise
    return created


@contextlib.contextmanager
def _init_refused_in(queue: Path, directory: Path) -> Iterator[None]:
    """Turn the kernel's refusal of what ``queue init`` makes in ``directory`` (the queue, or
    the parent of a missing one) into an error naming that directory and what to do: who may
    write there, the attribute and its ``chattr``, a read-only filesystem, or what ran short
    and the bytes and inodes left.  Never the bare errno, which names a temp of the config
    no listing shows, or a state directory without its queue."""
    try:
        yield
    except OSError as exc:
        action = f"init queue {queue}"
        again = "then run the same command again (what it made is kept)"
        refused = exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
        if refused:
            try:
                require_writable(directory, action)
            except CtxError as explained:
                raise explained.then(again) from None
            if exc.errno == errno.EACCES and not os.access(directory, os.R_OK | os.X_OK):
                # Writable but not readable (mode 0300): what init opens, it must read.
                explained = not_readable(directory, action)
                raise explained.then(again) from None
        trouble = explain_host_trouble(exc.errno, filesystem=str(directory), uid=os.geteuid())
        if trouble is None and not refused and exc.errno != errno.EIO:
            raise
        if trouble is not None:
            aside, fix = trouble.aside, trouble.remedy
        elif exc.errno == errno.EIO:
            aside, fix = "", DISK_ERROR_REMEDY
        else:  # refused by no mode, attribute or read-only filesystem that shows now
            aside, fix = "", "check its ACL and the security module's log"
        raise CtxError(
            exc.errno or errno.EIO,
            f"cannot {action}: {directory} refused: {exc.strerror}{aside}: {fix}, {again}",
        ) from None


# A config temp younger than this may be another init's, still being written.
_CONFIG_TEMP_GRACE = 60.0


def _remove_stray_config_temps(ops: durable.FsOps, root_fd: int) -> None:
    """Remove the temps of ``config`` an init killed before its rename left in the queue's
    directory, once they are a minute old: nothing but init makes them, and nothing else
    looks there for them (recover sweeps ``inbox/``)."""
    stray = re.compile(rf"\.{re.escape(CONFIG_NAME)}\.[0-9a-f]{{12}}{re.escape(TEMP_SUFFIX)}")
    old = time.time() - _CONFIG_TEMP_GRACE
    names = [
        name
        for name in os.listdir(root_fd)
        if stray.fullmatch(name)
        and (status := lstat_at(root_fd, name)) is not None
        and stat.S_ISREG(status.st_mode)
        and status.st_mtime < old
    ]
    if names:
        with contextlib.suppress(OSError):  # left for the next init, as it was
            durable.remove_entries(ops, [(root_fd, name, False) for name in names])


def _give_the_queue_group(ops: durable.FsOps, root_fd: int, name: str) -> None:
    """A state directory just made in a queue its group may write (one a umask of 002 left
    group-writable; a shared space's inherits the bit from the space) is made setgid with
    the queue's group, so that what members make in it is the group's, as ``ctx queue
    status`` checks (:func:`cortexfs.queue.inspect.state_dirs_not_giving_the_queue_group`)."""
    queue = os.fstat(root_fd)
    if not queue.st_mode & stat.S_IWGRP:
        return
    fd = ops.open_dir(name, root_fd)
    try:
        made = os.fstat(fd)
        if made.st_gid == queue.st_gid and not made.st_mode & stat.S_ISGID:
            ops.fchmod(fd, stat.S_IMODE(made.st_mode) | stat.S_ISGID)
            durable.sync_dir(ops, fd)  # the mode reaches the disk with the directory
    finally:
        ops.close(fd)


class NotADirectoryOfTheJob(CtxError):
    """``claimed/J`` or ``lease/J`` is no directory: a refusal complete in itself, which no
    caller dresses as another (a lease that is not a lease, a job that is not claimed)."""


# --------------------------------------------------------------------------- safe reads

lstat_at = durable.lstat_at


def kind_of(st: os.stat_result) -> str:
    """A word for what a directory entry is, for 'ignored' reasons."""
    mode = st.st_mode
    for test, word in (
        (stat.S_ISREG, "regular file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(mode):
            return word
    return "special file"


def read_regular_file(dir_fd: int, name: str, limit: int) -> bytes:
    """Read a regular file without following a symlink or blocking on a FIFO.

    ELOOP for a symlink, EINVAL for anything that is not a regular file, EFBIG above ``limit``.
    """
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CtxError(errno.ELOOP, f"{name} is a symlink; it is never followed") from exc
        # What open refuses with ENXIO is a socket (or a device without its driver): said as
        # for a FIFO or a directory, by what it is, rather than as "No such device".
        if exc.errno == errno.ENXIO and (st := lstat_at(dir_fd, name)) is not None:
            raise invalid(f"{name} is a {kind_of(st)}, not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise invalid(f"{name} is a {kind_of(st)}, not a regular file")
        if st.st_size > limit:
            raise CtxError(errno.EFBIG, f"{name} is {st.st_size} bytes; the limit is {limit}")
        chunks = []
        remaining = limit + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        if len(data) > limit:
            raise CtxError(errno.EFBIG, f"{name} grew beyond the limit of {limit} bytes")
        return data
    finally:
        os.close(fd)


class DirLock(enum.Enum):
    """What :func:`take_dir_lock` got: the lock, nothing (another holds it), or no lock to
    be had (the filesystem refuses ``flock`` on directories, as some NFS setups do)."""

    HELD = "held"
    BUSY = "busy"
    UNSUPPORTED = "unsupported"


# How long recover waits for readers (status, list, show) to end their look at a job, whose
# shared lock it finds where it wants the exclusive one: a look is a few reads, and a reader
# stopped longer than this keeps the job untouched for this run, as a transition would.
READERS_WAIT_SECONDS = 10.0


def take_dir_lock(fd: int, *, within: float, past_readers: float = 0.0) -> DirLock:
    """Take an exclusive ``flock`` on a directory descriptor, waiting at most ``within``
    seconds (0: not at all), and, when only readers hold its shared lock
    (:func:`read_lock_dir`), at most ``past_readers`` seconds more for them to let go.

    Used on ``claimed/J`` by whoever is in the middle of a transition of J (a claimer before
    its lease exists, a finisher, recover) so that recover never acts on a half-done step of
    a live process.  The kernel drops the lock when the holder dies.  Where the filesystem
    refuses it, the caller goes on without it and relies on the liveness rules (and, for a
    claim at work, on time: :mod:`cortexfs.queue.recovery`)."""
    try:
        if flock_within(fd, fcntl.LOCK_EX, within):
            return DirLock.HELD
        # A shared lock to be had means no transition holds J: only readers, each for a look.
        if past_readers and flock_within(fd, fcntl.LOCK_SH, 0):
            if flock_within(fd, fcntl.LOCK_EX, past_readers):
                return DirLock.HELD
            fcntl.flock(fd, fcntl.LOCK_UN)
        return DirLock.BUSY
    except OSError as exc:
        if exc.errno in (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            return DirLock.UNSUPPORTED
        raise


def lock_dir(fd: int, *, within: float, past_readers: float = 0.0) -> bool:
    """:func:`take_dir_lock`: False when another process holds the lock; True when it is
    ours, or when the filesystem has none to give."""
    return take_dir_lock(fd, within=within, past_readers=past_readers) is not DirLock.BUSY


def read_lock_dir(fd: int) -> bool:
    """A shared ``flock`` on ``claimed/J``, not waited for, for a reader that looks at J
    again: False when a transition holds J's exclusive lock (J is moving).  Shared, it keeps
    no other reader out, and recover waits for it (``past_readers``) rather than take J for
    a job in motion (Q-6: status, list and show read the queue, they never hold it up)."""
    try:
        return flock_within(fd, fcntl.LOCK_SH, 0)
    except OSError as exc:
        if exc.errno in (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
            return True
        raise
