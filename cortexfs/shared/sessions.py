"""Sessions: ordinary directories holding an ``events.jsonl`` timeline (SPEC S-1, S-2, S-6).

::

    home/<uid>/agent/<agent>/session/<session>/events.jsonl        the agent's own session
    shared/<space>/agent/<agent>/session/<session>/events.jsonl    a session in a shared space

A session in the agent's home belongs to the agent's uid and gid (mode 0700, events 0600): it
is that user's tier (R-4), and agents sharing a group read none of it.  A session in a shared
space is group-writable, setgid and sticky (03770, events 0660) so that everyone the space's
group admits can read it and none renames or removes another's.  Before the tool runner
records a call in a shared session it asks the authority chain for ``shared:<space> write``
(the call writes in the space); whether an agent may itself read, write or resume a session as
an object is the chain's answer to ``session:<name> read|write|resume`` (S-6).
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

from cortexfs import durable
from cortexfs.errors import CtxError, invalid, not_found
from cortexfs.names import (
    MAX_ID,
    check_object_name,
    decimal_value,
    is_id,
    is_object_name,
)
from cortexfs.shared.events import EVENTS_FILE, EventLog, make_event
from cortexfs.shared.tree import Ownership, ensure_directories, ensure_home, open_beneath
from cortexfs.storage import check_space_name, not_readable

DEFAULT_SESSION = "default"
HOME_SESSION_MODE = 0o700  # the agent's own: agents sharing a group read none of it
HOME_EVENTS_MODE = 0o600
# A space's members may write in a shared session (S-6: with the grants), and none may rename
# or remove what the agent made there (sticky: its session/, each session, events.jsonl).
SHARED_MODE = 0o3770
SHARED_EVENTS_MODE = 0o660


# A NamedTuple, not a dataclass (see cortexfs.tools.result); SessionRef checks its fields on
# construction, since they become a path: hence the fields in a base class.
class _SessionPlace(NamedTuple):
    root: Path
    agent: str
    name: str
    uid: int | None
    space: str | None


class SessionRef(_SessionPlace):
    """Where one session lives: in an agent's home (``uid``) or in a shared ``space``."""

    __slots__ = ()

    def __new__(
        cls,
        root: str | os.PathLike[str],
        agent: str,
        name: str = DEFAULT_SESSION,
        uid: int | None = None,
        space: str | None = None,
    ) -> SessionRef:
        check_object_name(agent, "agent")
        check_object_name(name, "session")
        if (uid is None) == (space is None):
            raise invalid("a session lives either in a home (uid) or in a shared space")
        if space is not None:
            check_object_name(space, "shared space")
        if uid is not None and not is_id(uid):
            # Refused here, before open_session makes home/<uid>/: a float or a bool would
            # name a directory (home/1.5, home/True) that no user's home is.
            raise invalid(f"{uid!r} is not a uid (an integer from 0 to {MAX_ID})")
        return super().__new__(cls, Path(root), agent, name, uid, space)

    @classmethod
    def home(
        cls, root: str | os.PathLike[str], uid: int, agent: str, name: str = DEFAULT_SESSION
    ) -> SessionRef:
        return cls(root, agent, name, uid=uid)

    @classmethod
    def shared(
        cls, root: str | os.PathLike[str], space: str, agent: str, name: str = DEFAULT_SESSION
    ) -> SessionRef:
        return cls(root, agent, name, space=space)

    @property
    def location(self) -> str:
        """The directory holding the session, relative to the root (the chain's location)."""
        if self.space is not None:
            return f"shared/{self.space}/agent/{self.agent}/session"
        return f"home/{self.uid}/agent/{self.agent}/session"

    @property
    def relative(self) -> PurePosixPath:
        return PurePosixPath(self.location, self.name)

    @property
    def path(self) -> Path:
        return self.root / self.relative

    @property
    def events_path(self) -> Path:
        return self.path / EVENTS_FILE

    def __str__(self) -> str:
        return f"{self.location}/{self.name}"  # str(self.relative), without making the path


class Session:
    """A session opened for recording; one descriptor serves every event.

    With ``reopen`` (a long-lived recorder: a worker), an ``events.jsonl`` renamed away (a
    rotation, docs/sessions.md) is followed: the next event goes to a new file at the name,
    where the tool calls' events go, rather than on into the renamed one.  The renamed log
    stays open until the session closes: another thread may be appending to it."""

    def __init__(
        self, ref: SessionRef, log: EventLog, reopen: Callable[[], EventLog] | None = None
    ) -> None:
        self.ref = ref
        self._log = log
        self._reopen = reopen
        self._rotated: list[EventLog] = []
        self._swap = threading.Lock()

    def _current_log(self) -> EventLog:
        if self._reopen is not None and self._log.moved():
            with self._swap:
                if self._log.moved():
                    self._rotated.append(self._log)
                    self._log = self._reopen()
        return self._log

    def record(
        self,
        event_type: str,
        *,
        object: str,
        status: str,
        durable_event: bool = False,
        **facts: Any,
    ) -> dict[str, Any]:
        """Append one event (S-2 shape plus ``facts``); durable ones are on disk on return."""
        event = make_event(
            event_type,
            agent=self.ref.agent,
            session=self.ref.name,
            object=object,
            status=status,
            **facts,
        )
        self._current_log().append(event, durable_event=durable_event)
        return event

    def sync(self) -> None:
        """Make every event recorded so far durable."""
        for log in (*self._rotated, self._log):
            log.sync()

    def close(self) -> None:
        for log in (*self._rotated, self._log):
            log.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_session(
    ref: SessionRef,
    *,
    owner: Ownership | None = None,
    ops: durable.FsOps | None = None,
    follow_rotation: bool = False,
) -> Session:
    """Open ``ref`` for recording, creating its directories and ``events.jsonl`` if missing.

    ``owner`` is the agent's uid and gid, given to what is created in its home (as root).  A
    shared session needs its space to exist already (``ctx shared create``): ENOENT otherwise,
    and EINVAL in the manual bundle, which is no space (X-2).  ``follow_rotation``: see
    :class:`Session`.
    """
    log = _open_events(ref, owner, ops or durable.default_ops())
    if not follow_rotation:
        return Session(ref, log)
    return Session(ref, log, lambda: _open_events(ref, owner, ops or durable.default_ops()))


def _open_events(ref: SessionRef, owner: Ownership | None, ops: durable.FsOps) -> EventLog:
    if ref.space is not None:
        # shared/cortexfs-docs is the manual bundle, no space; a session opened there
        # would write in it.  Refused where sessions are made, not in SessionRef, which only
        # names a place: 'ctx run --project cortexfs-docs' is refused by the chain (EACCES,
        # exit 126) before it opens any.
        check_space_name(ref.space, "shared space")
        mode, events_mode = SHARED_MODE, SHARED_EVENTS_MODE
        # The space's group, given rather than left to the setgid bit of agent/: a space that
        # lost it would have the host (root) give its own group to what it makes there.
        owner = Ownership(owner.uid, _space_group(ref)) if owner else None
    else:
        mode, events_mode = HOME_SESSION_MODE, HOME_EVENTS_MODE
    # Walked without following links: a home or a space belongs to users who could plant one.
    try:
        dir_fd = open_beneath(ops, ref.root, ref.relative.parts)
    except FileNotFoundError:
        if ref.space is not None and owner is not None:
            _require_agents_own(ref, owner.uid)  # nothing is made in another member's directory
        try:
            _create_session_directories(ref, mode, owner, ops)
        except OSError as exc:
            # Made at a directory descriptor, the name the system gives is the last part alone
            # ("s1: No space left on device"); the session's whole path says where.
            raise OSError(exc.errno, exc.strerror, str(ref.root / ref.relative)) from None
        dir_fd = open_beneath(ops, ref.root, ref.relative.parts)
    try:
        if ref.space is not None and owner is not None:
            _require_agents_own(ref, owner.uid)
        return EventLog(ref.events_path, mode=events_mode, owner=owner, ops=ops, dir_fd=dir_fd)
    finally:
        ops.close(dir_fd)


def open_session_directory(ref: SessionRef, ops: durable.FsOps | None = None) -> int:
    """A descriptor of ``ref``'s directory for reading it, reached from the storage root
    without following any link: a home or a space belongs to users who could plant one, and
    the host reading or repairing a session (often as root) must never be led outside.

    FileNotFoundError when a component is missing; ELOOP/ENOTDIR (a CtxError) when one is a
    link or not a directory.
    """
    return open_beneath(ops or durable.default_ops(), ref.root, ref.relative.parts)


def _require_agents_own(ref: SessionRef, uid: int) -> None:
    """EACCES unless ``shared/<space>/agent/<agent>/`` and what leads from it to the session
    belong to the agent (or to root, who made them): any member of the space may make
    directories in its ``agent/``, so one may have made another agent's before that agent
    first recorded there, to read and rewrite what it records."""
    parts = ref.relative.parts
    for depth in range(4, len(parts) + 1):  # shared/<space>/agent/<agent>, then below
        where = ref.root.joinpath(*parts[:depth])
        try:
            status = os.lstat(where)
        except FileNotFoundError:
            return  # not made yet: what is made from here is the agent's
        if status.st_uid not in (uid, 0):
            raise CtxError(
                errno.EACCES,
                f"{where} belongs to uid {status.st_uid}, not to agent {ref.agent!r} (uid "
                f"{uid}): another member of space {ref.space!r} made it, or an earlier agent "
                f"of that name ran as uid {status.st_uid} and recorded there; the host "
                "administrator moves it away after reading what it holds (keeping what an "
                "earlier agent recorded), and the agent's next call makes its own",
            )


def _space_group(ref: SessionRef) -> int:
    """The group of ``ref``'s space (ENOENT when there is no such space)."""
    try:
        return os.lstat(ref.root / "shared" / str(ref.space)).st_gid
    except FileNotFoundError:
        raise _no_space(ref) from None


def _no_space(ref: SessionRef) -> CtxError:
    return not_found(f"there is no shared space {ref.space!r}; create it with 'ctx shared create'")


def _create_session_directories(
    ref: SessionRef, mode: int, owner: Ownership | None, ops: durable.FsOps
) -> None:
    if ref.space is not None:
        top = ref.root / "shared" / ref.space
        if not top.is_dir():
            raise _no_space(ref)
        if not (top / "agent").is_dir():
            # The space's own agent/ is the host's, made with the space: made here, it would
            # be the first recording agent's, free to move away every other agent's sessions.
            raise not_found(
                f"shared space {ref.space!r} has no agent/ directory for its sessions; "
                f"'ctx shared create {ref.space}' makes what the space lacks"
            )
    else:
        assert ref.uid is not None
        top = ensure_home(ops, ref.root, owner or Ownership(ref.uid, -1))
    ensure_directories(ops, top, list(ref.relative.parts[2:]), mode=mode, owner=owner)


def homes_with_sessions(root: Path, agent: str) -> list[int]:
    """The uids whose home holds a session directory of ``agent``, in numeric order.

    Sessions are ordinary directories (S-1): they outlive the agent that wrote them, so they
    are found by looking, not through ``agent/<name>``.  EACCES, naming ``home/`` and who may
    read it, when the caller may not list it.
    """
    check_object_name(agent, "agent")
    try:
        names = os.listdir(root / "home")
    except (FileNotFoundError, NotADirectoryError):
        return []
    except PermissionError:
        # Whose homes hold them is not known: the caller is told which directory refused and
        # who may read it, not only the kernel's "Permission denied".
        raise not_readable(
            root / "home", f"find the homes holding sessions of agent {agent!r}"
        ) from None
    uids = sorted(int(name) for name in names if _is_home_name(name))
    return [uid for uid in uids if _is_dir(SessionRef.home(root, uid, agent).path.parent)]


def _is_home_name(name: str) -> bool:
    """Whether ``name`` is the one a uid's home has (SessionRef's ``home/<uid>``).

    A home/4294967295 (or one of hundreds of digits) made by hand is no user's home, and must
    not end the listing of the others; nor is a home/0999, which reads as uid 999 too and
    would count the home of 999 twice."""
    uid = decimal_value(name)
    return is_id(uid) and str(uid) == name


def list_sessions(parent: Path, *, root: Path) -> list[str]:
    """The session names under a ``…/agent/<agent>/session`` directory (none when missing),
    reached from ``root``, the storage root it lies in, without following links
    (:func:`open_session_directory`'s reason).
    """
    try:
        fd = open_beneath(durable.default_ops(), root, parent.relative_to(root).parts)
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise CtxError(errno.ENOTDIR, f"{parent} is not a directory") from None
    try:
        names = os.listdir(fd)
        return sorted(name for name in names if is_object_name(name) and _is_dir_at(fd, name))
    except PermissionError:
        # Its names could be read but not looked up (r without x): which of them are
        # sessions is not known, and an empty list would say there are none.
        raise CtxError(
            errno.EACCES,
            f"{parent} may be listed but not searched by uid {os.geteuid()} (its mode lacks x "
            "for it), so its sessions cannot be told from its other entries",
        ) from None
    finally:
        os.close(fd)


def _is_dir_at(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def _is_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return False
