"""Recording a tool call: session events and the tool's own log (SPEC S-2..S-5, T-7).

Every call that gets as far as its session leaves two events in the session's
``events.jsonl``:

* ``tool_call`` (status ``ok``, as in S-2's example: the call was received) when the call is
  received, with the input — or the argv in terminal mode — summarised by the log rule
  (:mod:`cortexfs.shared.redact`);
* ``tool_result`` (status ``ok`` or ``error``) when it is over: exit status, errno, the stage
  and chain step that refused it, duration, and a summary of the output.  It is fsynced before
  the call is reported done (S-5).

The same result, with the input summary, is one fsynced line of ``<tier>/<name>.d/log``
(T-7), so a tool's history can be audited without knowing the sessions that used it.  Its
``session`` is the session's name, as in ``events.jsonl`` (S-2), and ``session_dir`` says
where that session is (home or shared space), relative to the storage root.  A call
refused before its tool was found has no tool log to go to; one refused before its session
was opened (an unknown agent, a caller who is not the host administrator) is reported to the
caller only.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

from cortexfs import durable
from cortexfs.errors import CtxError
from cortexfs.jsontext import dumps_utf8
from cortexfs.locks import flock_within, open_lock_file
from cortexfs.shared.events import EventLog, make_event
from cortexfs.shared.redact import (
    MAX_ITEMS,
    MAX_SUMMARY_BYTES,
    bounded_argv_summary,
    bounded_summary,
    summarize,
)
from cortexfs.shared.redact_quoted import hidden_values, without_hidden
from cortexfs.shared.sessions import Session
from cortexfs.shared.tree import open_beneath
from cortexfs.tools.result import ToolResult

TOOL_LOG_MODE = 0o640


def request_facts(
    call: str,
    mode: str,
    input_value: Any = None,
    argv: list[str] | None = None,
    job: str | None = None,
) -> dict[str, Any]:
    """The facts of a request that may be logged (S-4); ``job``, the queue job a worker's
    call runs, so that the session ties each call to its job even when the worker dies
    before it records anything of the job's end."""
    facts: dict[str, Any] = {"call": call, "mode": mode}
    if job is not None:
        facts["job"] = job
    if argv is not None:
        facts["argv"] = bounded_argv_summary(argv)
    else:
        facts["input"] = bounded_summary(input_value)
    return facts


def text_of_input(input_value: Any, problem: str) -> str:
    """The text a call's record gives for an input no strict reader could take back (NaN, an
    integer of more digits than Python reads, a value holding itself; ``problem`` says which,
    to follow ``it``), so that its ``tool_call`` is a line readers read: its summary, secrets
    redacted, as Python's json writes it (``NaN``, ``Infinity``), or the problem where not even
    that can be written."""
    try:
        return json.dumps(summarize(input_value), default=str)
    except ValueError:  # an integer of more digits than Python writes
        return f"[an input that {problem.removeprefix('it ')}]"


def result_facts(result: ToolResult, called_with: Any = None) -> dict[str, Any]:
    """The facts of a result that may be logged (S-4).  ``called_with``: the call's input (or
    argv), whose values its summary redacted a message loses too: a schema's refusal quotes
    the value it refuses (:func:`~cortexfs.shared.redact_quoted.hidden_values`)."""
    messages = result.error is not None or bool(result.post_hooks)
    hidden = hidden_values(called_with) if messages and called_with is not None else frozenset()
    facts: dict[str, Any] = {
        "call": result.call,
        "exit_status": result.exit_status,
        "duration_ms": result.timings.get("total"),
    }
    if result.error is not None:
        facts.update(
            errno=result.error.code_name,
            stage=result.error.stage,
            step=result.error.step,
            message=summarize(without_hidden(result.error.message, hidden)),
        )
    if result.output is not None:
        facts["output"] = bounded_summary(result.output)
    if result.post_hooks:
        listed = _logged_post_hooks(result.post_hooks, hidden)
        facts["post_hooks"] = listed
        if len(listed) < len(result.post_hooks):
            facts["post_hooks_unlisted"] = len(result.post_hooks) - len(listed)
    return facts


# The failed post-hooks a result's record lists, and the bytes they may take there, as a
# summary may (:data:`~cortexfs.shared.redact.MAX_SUMMARY_BYTES`): a tool may have any number
# of hooks, each named by up to 255 bytes, and listed whole they could make the event longer
# than any event may be (EFBIG), leaving the call's tool_call without its tool_result.
LOGGED_POST_HOOKS = MAX_ITEMS
LOGGED_POST_HOOKS_BYTES = MAX_SUMMARY_BYTES


def _logged_post_hooks(
    post_hooks: Sequence[Mapping[str, Any]], hidden: frozenset[str]
) -> list[dict[str, Any]]:
    """The first of ``post_hooks`` as a record gives them: at most :data:`LOGGED_POST_HOOKS`,
    and no more than fit in :data:`LOGGED_POST_HOOKS_BYTES` (the first always does: its name
    and summarised message are a few KiB at most)."""
    listed: list[dict[str, Any]] = []
    size = 0
    for hook in post_hooks[:LOGGED_POST_HOOKS]:
        # A hook's message is the last line of its stderr: any length, and as apt as the
        # tool's own to hold a secret.
        entry = {**hook, "message": summarize(without_hidden(hook["message"], hidden))}
        size += len(dumps_utf8(entry, separators=(",", ":"), default=str)) + 1
        if listed and size > LOGGED_POST_HOOKS_BYTES:
            break
        listed.append(entry)
    return listed


def record_requested(session: Session, object_ref: str, facts: dict[str, Any]) -> None:
    session.record("tool_call", object=object_ref, status="ok", **facts)


class Recorded(NamedTuple):
    """What became of a result's records: whether its ``tool_result`` is durably in the
    session, and the first failure of either record (None when both were made)."""

    in_session: bool
    failure: CtxError | OSError | None = None


def record_result(
    session: Session | None,
    root: Path,
    tool_log: PurePosixPath | None,
    object_ref: str,
    result: ToolResult,
    request: dict[str, Any],
    called_with: Any = None,
) -> Recorded:
    """``tool_result`` in the session and a line in the tool's log, both durable on return.

    The session's line comes first, so that a ``tool_call`` is never left without its
    ``tool_result`` because of the tool's log (a damaged tool may have none).  Both lines are
    written before either is synced: on a journaling filesystem the first fsync then commits
    the second file's append too, and the second fsync finds little left.  Each record is
    written whatever became of the other: the session belongs to the agent's uid, under
    which the tool itself ran, so a tool that locked or broke its session must not keep its
    call out of the log the host owns (T-7).  The first failure is returned, not raised, with
    whether the session holds the result all the same: a log that refused its line must not
    be told as a session that lacks the call.
    """
    facts = result_facts(result, called_with)
    failures: list[CtxError | OSError] = []
    session_name = "" if session is None else session.ref.name
    if session is not None:
        try:
            session.record("tool_result", object=object_ref, status=result.status, **facts)
        except (CtxError, OSError) as exc:
            failures.append(exc)
            session = None  # nothing of this call's to sync there
    in_session = False
    log = None
    if tool_log is not None:
        try:
            log = _open_tool_log(root, tool_log)
        except (CtxError, OSError) as exc:
            failures.append(exc)  # the call is an error: its log does not have it
    try:
        if log is not None:
            line = make_event(
                "tool_result",
                agent=result.agent,
                session=session_name,
                object=object_ref,
                status=result.status,
                session_dir=result.session,
                **{**request, **facts},
            )
            _each_of(failures, log.append, line)
        if session is not None:
            in_session = _each_of(failures, session.sync)
        if log is not None:
            _each_of(failures, log.sync)
    finally:
        if log is not None:
            log.close()
    return Recorded(in_session, failures[0] if failures else None)


def _each_of(failures: list[CtxError | OSError], action: Callable[..., object], *args: Any) -> bool:
    """``action(*args)``, its failure added to ``failures`` rather than raised: what the
    other record still needs is done all the same.  Whether it was done."""
    try:
        action(*args)
    except (CtxError, OSError) as exc:
        failures.append(exc)
        return False
    return True


def record_host_call(
    root: Path,
    tool_log: PurePosixPath,
    object_ref: str,
    argv: list[str],
    exit_status: int | None,
    refusal: CtxError | None = None,
) -> bool:
    """One line of the tool's log for a call the host made as itself (``ctx tool``, H-3): no
    agent and no session, the caller's uid instead; ``refusal``, why the call was refused
    before the tool ran (``exit_status`` None), as a refused agent call's line says it.
    Best effort, and False when the log cannot be written (a user who may read the tool but
    not write its log)."""
    try:
        log = _open_tool_log(root, tool_log)
    except (CtxError, OSError):
        return False
    if log is None:
        return False
    why = (
        {}
        if refusal is None
        else {"errno": refusal.code_name, "message": summarize(refusal.message)}
    )
    try:
        status = "ok" if exit_status == 0 else "error"
        log.append(
            make_event(
                "tool_result",
                agent="",
                session="",
                object=object_ref,
                status=status,
                mode="host",
                uid=os.getuid(),
                argv=bounded_argv_summary(argv),
                exit_status=exit_status,
                **why,
            )
        )
        log.sync()
    except (CtxError, OSError):
        return False
    finally:
        log.close()
    return True


def _open_tool_log(root: Path, relative: PurePosixPath) -> EventLog | None:
    """The tool's log, its directories walked without following links; None when the tool has
    none (ENOENT) or what is there is no log to append to (not a regular file, or one with
    two names).  A refusal of the kernel (EACCES, EPERM from an immutable log, EROFS, EIO…)
    raises, naming the log: the call cannot be logged (T-7).

    A reinstall gives the log a second name for as long as it takes (it carries the log over
    to the new version as a hard link), holding its tier's install lock all the while
    (:mod:`cortexfs.tools.pairs`): a log refused while a regular file is looked at once more
    when such an install has ended, so that a call that ends beside a reinstall is still
    logged.  With no install of the tool under way the log is left at once, as when the lock
    is not this uid's to take.

    A user tier belongs to a user who could swap a directory for a link to redirect a write
    made by root: the chain has refused such a call at step 2 already.  A damaged tool may have
    no control directory or no log at all (ENOEXEC at stage ``resolve``); a log is never created
    for it: the log is a control (T-1) its installation makes.
    """
    ops = durable.default_ops()
    log, refused_regular_file = _open_log_if_appendable(ops, root, relative)
    if refused_regular_file:
        log = _open_once_its_install_ends(ops, root, relative)
    return log


def _open_log_if_appendable(
    ops: durable.FsOps, root: Path, relative: PurePosixPath
) -> tuple[EventLog | None, bool]:
    """The log, or None; and whether it was refused while a regular file: of two names (or
    of one again since: a reinstall was ending).

    Only what is at the name is left so (EINVAL: no plain file of one name).  A log that is
    one but cannot take the call's line raises, naming it: one ending with a torn line it
    may not cut (append-only, EPERM) or that another process keeps locked (EAGAIN), as any
    refusal of its open does."""
    path = root / relative
    try:
        for _ in range(8):  # a control directory retired while we looked into it: once more
            try:
                dir_fd = open_beneath(ops, root, relative.parent.parts)
            except CtxError as exc:
                if exc.errno not in (errno.ENOENT, errno.ELOOP, errno.ENOTDIR):
                    raise  # a directory the kernel refuses this uid: as any refusal, named
                return None, False  # no control directory there (or a link): no log
            try:
                log = EventLog(path, mode=TOOL_LOG_MODE, ops=ops, dir_fd=dir_fd, create=False)
                return log, False
            except CtxError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                if _retired(root / relative.parent, dir_fd):
                    # Refused for the second name a reinstall gave it, which has swapped the
                    # directories since (and may have removed the old name already): the log
                    # is looked for in the new one.
                    continue
                # What is at the name is no plain file of one name: never appended to, the
                # session has the result.
                found = durable.lstat_at(dir_fd, path.name)
                return None, found is not None and stat.S_ISREG(found.st_mode)
            except FileNotFoundError:
                if not _retired(root / relative.parent, dir_fd):
                    raise
            finally:
                ops.close(dir_fd)
        return None, False
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None, False
        raise CtxError(
            exc.errno or errno.EIO, f"cannot open the tool's log {path}: {exc.strerror}"
        ) from None


def _retired(controls: Path, dir_fd: int) -> bool:
    """Whether the control directory open as ``dir_fd`` is no longer the one ``controls``
    names: a reinstall swapped a new one in, then removed the old one's entries."""
    try:
        current = os.stat(controls, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(dir_fd)
    return (current.st_dev, current.st_ino) != (held.st_dev, held.st_ino)


# How long a call's record waits for an install of its tool to end: a commit is a few
# renames and fsyncs, and the call has already run.
INSTALL_WAIT_SECONDS = 5.0


def _open_once_its_install_ends(
    ops: durable.FsOps, root: Path, relative: PurePosixPath
) -> EventLog | None:
    """The log refused while a regular file, looked at again once no install of its tool is
    under way, or once it has one name again (the install that linked it is over, and the
    next has not yet linked it), within :data:`INSTALL_WAIT_SECONDS`; None when it is still
    refused then.

    An install of the tool is under way while the tier's install lock is held and the tool's
    staged names or commit marker are in the tier
    (:func:`~cortexfs.tools.pairs.install_under_way`): then only is
    the call's record kept waiting.  A lock held by anything else (``tsh.config``, a repair,
    an install of another tool, a stuck process), staging an interrupted install left with
    nobody holding the lock, a lock file this uid may not open (only those who may install
    there can, so no other uid can make a call wait) or a tier without one: the log is looked
    at once more and left."""
    # Imported here, on this rare path: a call whose log opens at once never needs the
    # install's module.
    from cortexfs.tools.pairs import install_under_way

    tier = relative.parent.parent
    name = relative.parent.name.removesuffix(".d")
    try:
        tier_fd = open_beneath(ops, root, tier.parts)
    except (CtxError, OSError):
        return _open_log_if_appendable(ops, root, relative)[0]  # one more look, no wait
    try:
        try:
            lock = open_lock_file(tier_fd, root / tier, create=False)
        except (CtxError, OSError):
            return _open_log_if_appendable(ops, root, relative)[0]
        try:
            deadline = time.monotonic() + INSTALL_WAIT_SECONDS
            pause = 0.001
            while True:
                if flock_within(lock, fcntl.LOCK_SH, 0):
                    # Looked at under the lock, no install can give it a second name meanwhile.
                    return _open_log_if_appendable(ops, root, relative)[0]
                log, refused_regular_file = _open_log_if_appendable(ops, root, relative)
                if not refused_regular_file or time.monotonic() >= deadline:
                    return log
                if not install_under_way(tier_fd, name):
                    # One more look: an install that ended between the look and this check
                    # has given the log its one name back.
                    return _open_log_if_appendable(ops, root, relative)[0]
                time.sleep(pause)
                pause = min(2 * pause, 0.05)
        finally:
            os.close(lock)  # lets the lock go, if it was taken
    finally:
        ops.close(tier_fd)
