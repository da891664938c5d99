"""An agent's own log, ``agent/<name>.d/log``: what happened to the agent, as facts (SPEC S-3).

One event per line, with the shape of S-2 and written as a session's events are
(:mod:`cortexfs.shared.events`): one ``write`` on an ``O_APPEND`` descriptor, fsynced before
the action is reported done (S-5).  The ``agent`` key names whose log it is, ``object`` what
the fact is about:

======================  ========================================================================
``agent.created``       the agent was made: ``by`` (``ctx agent create`` or ``agent.create``),
                        ``label``, ``uid``, ``gid``, and for a child its ``parent``.  A parent's log
                        gets the same type with ``object`` ``agent/<child>`` and ``child``
``terminal.started``    ``ctx agent start``: ``pid`` of ctxterm, ``workspace`` (the host
                        directory at ``/workspace``, or null)
``terminal.stopped``    the terminal ended: ``reason`` ``stop`` (SIGTERM, ``ctx agent stop``) or
                        ``exit`` (tsh exited, ``exit_status``); or ``lost``: it ended without
                        cleaning up (killed), found so by the next ``ctx agent stop`` or
                        ``start`` of its session, which cleaned up after it (``pid``, ``cleaned``)
``terminal.view_lost``  the mount of the agent's view ended while the terminal served on (the
                        agent's ``/ctx`` answers ``ENOTCONN`` until a stop and a start): ``pid``
                        of the mount, its ``exit_status`` (128 + N after signal N)
``agent.updated``       ``agent.update`` replaced ``control`` with ``bytes`` bytes (A-5)
======================  ========================================================================

Facts only (S-4): never a prompt, a control's content or a policy's text.  The log belongs to
the host like the other controls (root's, mode 0640); its directory is reached without
following a link.  A change that must not happen unrecorded (``agent.update``) opens the log
first (:func:`open_log`) and is refused, unmade, when it cannot be appended to.
"""

from __future__ import annotations

import contextlib
import errno
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cortexfs import durable
from cortexfs.errors import CtxError
from cortexfs.file_attributes import entry_attribute_refusal
from cortexfs.shared.events import EventLog, make_event
from cortexfs.shared.tree import open_beneath

LOG = "log"
LOG_MODE = 0o640
CREATED = "agent.created"
TERMINAL_STARTED = "terminal.started"
TERMINAL_STOPPED = "terminal.stopped"
TERMINAL_VIEW_LOST = "terminal.view_lost"
UPDATED = "agent.updated"


def record_lost_terminal(
    root: Path, agent: str, session: str, pid: int | None, cleaned: Sequence[str]
) -> None:
    """``terminal.stopped`` with reason ``lost`` for a terminal that ended without cleaning
    up, whose end only the command that cleaned up after it knows: without it the log would
    read as if that terminal still ran.  A log that cannot be written stops nothing."""
    with contextlib.suppress(OSError, CtxError):
        record(root, agent, TERMINAL_STOPPED, session=session, reason="lost", pid=pid,
               cleaned=list(cleaned))  # fmt: skip


def record(
    root: Path,
    agent: str,
    event_type: str,
    *,
    session: str = "",
    about: str | None = None,
    status: str = "ok",
    **facts: Any,
) -> None:
    """Append one fact to ``agent``'s log, durably; ``about`` names another agent it concerns."""
    event = make_fact(agent, event_type, session=session, about=about, status=status, **facts)
    ops = durable.default_ops()
    directory = open_beneath(ops, root, ("agent", f"{agent}.d"))
    try:
        with EventLog(_log_path(root, agent), mode=LOG_MODE, ops=ops, dir_fd=directory) as log:
            log.append(event, durable_event=True)
    finally:
        ops.close(directory)


def make_fact(
    agent: str,
    event_type: str,
    *,
    session: str = "",
    about: str | None = None,
    status: str = "ok",
    **facts: Any,
) -> dict[str, Any]:
    """The event :func:`record` appends, for a log opened with :func:`open_log`."""
    return make_event(
        event_type,
        agent=agent,
        session=session,
        object=f"agent/{about or agent}",
        status=status,
        **facts,
    )


def open_log(root: Path, agent: str) -> EventLog:
    """``agent``'s log, opened for appending (the caller closes it), before a change that must
    be recorded is made: a log that cannot take the record refuses the change while nothing is
    changed yet, instead of failing after it.

    Every refusal is a :class:`CtxError` naming the log, and the host's, never the caller's
    input: EISDIR for a directory at its name, ELOOP for a symbolic link (never followed),
    EEXIST for anything else that is no file of its own (a FIFO, a hard link); EPERM naming an
    immutable or append-only attribute and the ``chattr`` that lifts it; the kernel's errno
    otherwise."""
    ops = durable.default_ops()
    path = _log_path(root, agent)
    try:
        directory = open_beneath(ops, root, ("agent", f"{agent}.d"))
    except OSError as exc:
        raise CtxError(
            exc.errno or errno.EIO, f"cannot open {path.parent}: {exc.strerror}"
        ) from None
    try:
        return EventLog(path, mode=LOG_MODE, ops=ops, dir_fd=directory)
    except CtxError as exc:
        if exc.errno != errno.EINVAL:
            raise
        # EventLog's EINVAL says what stands at the name is no log to append to: a fault of
        # the host's tree, which the caller's input (EINVAL's meaning to a tool) did not make.
        found = durable.lstat_at(directory, LOG)
        kind = None if found is None else stat.S_IFMT(found.st_mode)
        code = {stat.S_IFDIR: errno.EISDIR, stat.S_IFLNK: errno.ELOOP}.get(kind, errno.EEXIST)
        remedy = "have the host administrator move it aside (the next record makes a new log)"
        raise CtxError(code, f"{exc.message}; {remedy}") from None
    except OSError as exc:
        refused = None
        if exc.errno == errno.EPERM:
            refused = entry_attribute_refusal(directory, LOG, "append to the agent's log", path)
        if refused is not None:
            raise refused from None
        raise CtxError(exc.errno or errno.EIO, f"cannot append to {path}: {exc.strerror}") from None
    finally:
        ops.close(directory)


def _log_path(root: Path, agent: str) -> Path:
    return root / "agent" / f"{agent}.d" / LOG
