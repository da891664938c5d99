"""``ctx session``: read a session as a timeline, follow it, repair it (SPEC S-1..S-5)."""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from cortexfs.cli.columns import padded
from cortexfs.cli.common import (
    changed,
    echo_printable,
    emit_json,
    handles_errors,
    is_utf8_text,
    json_option,
    printable,
    readable_json,
    resolve_storage,
    storage_option,
    terminal_json,
    usage_problem,
)
from cortexfs.cli.params import UID, Integer
from cortexfs.errors import CtxError, invalid, not_found
from cortexfs.names import check_object_name
from cortexfs.policy.controls import agent_entry, agent_exists, control_path, read_identity
from cortexfs.shared import events
from cortexfs.shared.follow import follow_events
from cortexfs.shared.home_sessions import Tightening, tighten_session
from cortexfs.shared.sessions import (
    DEFAULT_SESSION,
    SessionRef,
    homes_with_sessions,
    list_sessions,
    open_session_directory,
)
from cortexfs.standard_streams import OutputError, discard_output
from cortexfs.storage import check_space_name, require_root

_S2_KEYS = ("ts", "type", "agent", "session", "object", "status")


# show and tail print events, one JSON object per line (JSON Lines), not one JSON document.
jsonl_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="JSON Lines: each event as it is stored, one JSON object per line.",
)


def session_options(fn: Any, *, output: Any = json_option) -> Any:
    fn = _one_session(fn)
    for decorator in reversed(
        [
            click.argument("agent"),
            click.argument("session", required=False),
            click.option(
                "--session",
                "session_option",
                metavar="SESSION",
                help=f"The session, as ctx run and ctx agent name it (default: {DEFAULT_SESSION}).",
            ),
            click.option("--project", help="A session in shared/PROJECT/ instead of the home."),
            click.option("--uid", type=UID, help="The home's uid (default: the agent's)."),
            storage_option,
            output,
            handles_errors,
        ]
    ):
        fn = decorator(fn)
    return fn


def event_session_options(fn: Any) -> Any:
    """:func:`session_options` for the commands that print events (``--json``: JSON Lines)."""
    return session_options(fn, output=jsonl_option)


def _one_session(fn: Any) -> Any:
    """SESSION may be given as an argument or as ``--session``, not as two different names."""

    @functools.wraps(fn)
    def wrapper(*, session: str | None, session_option: str | None, **rest: Any) -> Any:
        if session is not None and session_option is not None and session != session_option:
            raise usage_problem(
                invalid(f"two sessions given: {session!r} and --session {session_option!r}")
            )
        # An empty SESSION is a name R-3 refuses, not a way to say "the default".
        given = session if session is not None else session_option
        return fn(session=DEFAULT_SESSION if given is None else given, **rest)

    return wrapper


@click.group()
def session() -> None:
    """Sessions: home/<uid>/agent/<agent>/session/<s>/ and shared/<p>/agent/<agent>/session/<s>/.

    Each holds events.jsonl, one JSON event per line, appended crash-safely (SPEC S-5).
    """


@session.command()
@event_session_options
def show(
    agent: str,
    session: str,
    project: str | None,
    uid: int | None,
    storage_dir: Path | None,
    as_json: bool,
) -> None:
    """Print SESSION (default: default) of AGENT as a timeline, oldest first.

    A torn last line (a crash in the middle of an append) is skipped and mentioned.
    """
    ref = _session_ref(storage_dir, agent, session, project, uid)
    scan = events.EventScan()
    with _session_directory(ref, _listing(agent, project, uid)) as directory:
        # Printed as read: a long session is never held in memory whole.
        for event in events.stream_events(ref.events_path, scan, dir_fd=directory):
            _render(event, ref, as_json)
    _warn(ref, scan)


@session.command()
@event_session_options
@click.option(
    "-n",
    "lines",
    type=Integer(min=0, max=sys.maxsize),
    default=10,
    show_default=True,
    help=f"How many of the last events to print first (0 to {sys.maxsize}).",
)
@click.option("--follow", "-f", is_flag=True, help="Keep printing events as they are appended.")
def tail(
    agent: str,
    session: str,
    project: str | None,
    uid: int | None,
    storage_dir: Path | None,
    as_json: bool,
    lines: int,
    follow: bool,
) -> None:
    """Print the last events of SESSION; with --follow, keep printing new ones (Ctrl-C stops
    it, exit 0)."""
    ref = _session_ref(storage_dir, agent, session, project, uid)
    with _session_directory(ref, _listing(agent, project, uid)) as directory:
        read = events.open_to_read(ref.events_path, directory)
        if not follow:
            try:
                _print_last(ref, read, lines, as_json)
            finally:
                os.close(read)
            return
        try:
            scan = _print_last(ref, read, lines, as_json)
            # The file the last events were printed from is handed over, not opened again by
            # its name: one removed or renamed away meanwhile is still read to its end, then
            # its name waited for.
            followed = follow_events(
                ref.events_path,
                offset=scan.end,
                first_line=scan.lines + 1,  # numbered as show numbers them
                open_directory=lambda: open_session_directory(ref),
                on_restart=_restarted,
                on_damaged=lambda damaged: _warn_damaged(ref, damaged),
                held=read,
            )
            for event in followed:
                _render(event, ref, as_json)
        except KeyboardInterrupt:
            # Ctrl-C is how a follow ends as asked, whether it is still printing the last
            # events or waiting for new ones.  What standard output still holds is dropped:
            # written at the exit, it would keep the process there for as long as a reader
            # that stopped reading leaves the pipe full.
            discard_output(sys.stdout)


def _print_last(ref: SessionRef, read: int, count: int, as_json: bool) -> events.EventScan:
    """Print the last ``count`` events of the session's file open as ``read`` (then what the
    read skipped, on stderr); the scan of the whole file, whose ``end`` and ``lines`` a follow
    goes on from."""
    scan = events.EventScan()
    # Where each of the last N events starts (past the event before it), not the events: they
    # are read again from there and printed as read, so that a tail of a long session holds
    # no more than show does.
    starts: collections.deque[int] = collections.deque(maxlen=count)
    after_previous = scan.end
    for _ in events.stream_open_events(read, scan):
        starts.append(after_previous)
        after_previous = scan.end
    if starts:
        again = events.EventScan(end=starts[0])
        for event in events.stream_open_events(read, again):
            if again.end > scan.end:
                break  # appended since: --follow prints it
            _render(event, ref, as_json)
    _warn(ref, scan)
    return scan


def _restarted(why: str) -> None:
    echo_printable(f"ctx: note: {why}", err=True)


@session.command()
@session_options
def repair(
    agent: str,
    session: str,
    project: str | None,
    uid: int | None,
    storage_dir: Path | None,
    as_json: bool,
) -> None:
    """Truncate a torn last line of SESSION's events.jsonl (SPEC S-5).

    Waits for appends in flight; complete lines are never touched.  Prints how many bytes
    it removed, or that there was nothing to do; --json: {"session", "truncated_bytes",
    "tightened", "left"} (0 when nothing was torn).  A home session that an older version
    made readable by the agent's group (0750, events.jsonl 0640) is made 0700 and 0600
    first, each listed as 'tightened PATH (mode 0750 -> 0700)' (on a read-only filesystem
    it is left as it is); an events.jsonl of another uid than the session's, or with more
    than one name (a hard link), is not changed but named in a 'ctx: warning:' line.  Exit
    0 either way, on a read-only filesystem too when nothing is torn; a torn line there
    cannot be cut (EROFS, exit 1, nothing changed).  A repair refused (a hard-linked
    events.jsonl, EINVAL; an immutable one, EPERM naming the attribute and the chattr that
    lifts it) leaves the file as it is; the modes tightened before are kept, and the refusal
    says so, as does the EINTR of a Ctrl-C while it waits for appends in flight.
    """
    ref = _session_ref(storage_dir, agent, session, project, uid)
    done = Tightening()
    with _session_directory(ref, _listing(agent, project, uid)) as directory:
        try:
            try:
                if ref.space is None:
                    # A home session an older version made readable by the agent's group is
                    # the agent's alone again (as 'ctx bootstrap' makes every one).
                    _tighten(directory, ref, done)
            finally:
                # Said before the repair, which may still be refused or interrupted while it
                # waits for the lock, and also when the tightening itself was refused
                # part-way: the modes changed either way.
                if done.tightened:
                    changed(f"{ref.path} was made readable by the agent alone")
                output_lost = _say_tightened(done, as_json)
            removed = events.repair(ref.events_path, dir_fd=directory)
        except (CtxError, OSError) as exc:
            if not done.tightened:
                raise
            # Refused after the modes changed: said, also with --json, where no line said it.
            said = exc.message if isinstance(exc, CtxError) else _os_error_said(exc)
            tightened = "; ".join(done.tightened)
            raise CtxError(
                exc.errno or errno.EIO, f"{said} (before that, it tightened {tightened})"
            ) from None
    if removed:
        changed(f"a torn last line of {removed} bytes was truncated from {ref.events_path}")
    if output_lost is not None:
        raise output_lost  # ends the command saying what it changed (exit 74, or 141)
    if as_json:
        emit_json(
            {
                "session": str(ref),
                "truncated_bytes": removed,
                "tightened": done.tightened,
                "left": done.left,
            }
        )
        return
    if removed:
        echo_printable(f"truncated a torn last line of {removed} bytes from {ref.events_path}")
    else:
        echo_printable(f"nothing to do: {ref.events_path} ends with a complete line")


def _tighten(directory: int, ref: SessionRef, done: Tightening) -> None:
    """:func:`tighten_session` into ``done``, except on a read-only filesystem, where nothing
    can change (and the torn line, if any, is refused with EROFS by the repair itself)."""
    try:
        tighten_session(directory, str(ref.path), done)
    except OSError as exc:
        if exc.errno != errno.EROFS:
            raise


def _say_tightened(done: Tightening, as_json: bool) -> OSError | None:
    """What a repair left as it is (a warning each, on stderr) and, in text, what it
    tightened (``--json`` gives both in its answer).

    A standard output that refuses the lines (``> /dev/full``, a reader that left) is
    returned, not raised: the repair still cuts the torn line, and the command then ends as
    every command whose output failed ends, saying what it changed, rather than as a refusal
    of a repair it never tried."""
    for line in done.left:
        click.echo(printable(f"ctx: warning: {line}"), err=True)
    if as_json:
        return None
    try:
        for line in done.tightened:
            click.echo(printable(f"tightened {line}"))
    except (OutputError, BrokenPipeError) as lost:
        return lost
    return None


def _os_error_said(exc: OSError) -> str:
    """An OSError as a sentence: its reason, then the path it names, if it names one."""
    return exc.strerror if exc.filename is None else f"{exc.strerror}: {exc.filename}"


@session.command("list")
@click.argument("agent")
@click.option("--project", help="Sessions in shared/PROJECT/ instead of the home.")
@click.option("--uid", type=UID, help="The home's uid (default: the agent's).")
@storage_option
@json_option
@handles_errors
def list_command(
    agent: str, project: str | None, uid: int | None, storage_dir: Path | None, as_json: bool
) -> None:
    """List AGENT's sessions (in its home, or in shared space PROJECT), one name a line.

    With --json, one JSON array of {"name", "path"} objects, path being the session's
    directory.
    """
    ref = _session_ref(storage_dir, agent, DEFAULT_SESSION, project, uid)
    _require_space(ref, project)
    names = list_sessions(ref.path.parent, root=ref.root)
    kept_there = ref.path.parents[1]  # <home or space>/agent/<agent>
    if not names and not agent_exists(ref.root, agent) and not os.path.lexists(kept_there):
        # As without --project or --uid: an agent that is not, and never kept sessions
        # there, is no empty list (a misspelt name would read as "no sessions").
        raise not_found(
            f"there is no agent {agent!r} ({ref.root / agent_entry(agent)} does not exist), "
            f"and {kept_there} holds no sessions of it"
        )
    if as_json:
        emit_json([{"name": name, "path": str(ref.path.parent / name)} for name in names])
    else:
        for name in names:
            click.echo(name)


def _session_ref(
    storage_dir: Path | None, agent: str, session: str, project: str | None, uid: int | None
) -> SessionRef:
    root = resolve_storage(storage_dir)
    try:
        # Every name first: a malformed one is a usage error whatever the root and the agents.
        check_object_name(agent, "agent")
        check_object_name(session, "session")
        if project is not None and uid is not None:
            # A session lives in a home (--uid) or in a space (--project), never both (S-1).
            raise invalid(
                f"--project {project} names a session in a shared space and --uid {uid} one "
                "in a home: give one of them"
            )
        if project is not None:
            # The manual bundle is no space and holds no session: none is ever made
            # there, so a listing there is no empty one but a misnamed project.
            check_space_name(project, "shared space")
            ref = SessionRef.shared(root, project, agent, session)
        else:
            if uid is None:
                uid = _home_uid(root, agent)
            ref = SessionRef.home(root, uid, agent, session)
        # After the names are checked: a malformed one is a usage error whatever the root.
        require_root(root)
        return ref
    except CtxError as exc:
        if exc.errno == errno.EINVAL:
            raise usage_problem(exc) from None
        raise


def _home_uid(root: Path, agent: str) -> int:
    """Whose home holds AGENT's sessions: the agent's uid while it exists; once it is gone,
    the home that still holds its sessions (S-1: they are ordinary directories), the
    caller's own first."""
    check_object_name(agent, "agent")
    require_root(root)
    if agent_exists(root, agent):
        try:
            return read_identity(root, agent).uid
        except CtxError as exc:  # the agent's control is at fault, not the command line
            raise CtxError(
                exc.errno,
                f"cannot tell agent {agent!r}'s uid: {exc.message}; fix "
                f"{control_path(agent, 'identity')}, or give --uid",
            ) from None
    homes = homes_with_sessions(root, agent)
    if os.getuid() in homes:
        return os.getuid()
    if len(homes) == 1:
        return homes[0]
    if not homes:  # ENOENT, exit 1: not a malformed command line
        raise not_found(
            f"there is no agent {agent!r} ({root / agent_entry(agent)} does not exist), "
            f"and no home holds sessions of it"
        )
    raise usage_problem(
        invalid(
            f"there is no agent {agent!r}, and the homes of uids "
            f"{', '.join(map(str, homes))} hold sessions of it; give --uid"
        )
    )


def _require_space(ref: SessionRef, project: str | None) -> None:
    if project is not None and not ref.path.parents[3].is_dir():  # shared/<project>
        raise not_found(
            f"there is no shared space {project!r}; make it with 'ctx shared create {project}'"
        )


def _listing(agent: str, project: str | None, uid: int | None) -> str:
    """The command that lists the sessions beside the one asked for."""
    where = f" --project {project}" if project is not None else ""
    if project is None and uid is not None:
        where = f" --uid {uid}"
    return f"ctx session list {agent}{where}"


@contextlib.contextmanager
def _session_directory(ref: SessionRef, listing: str) -> Iterator[int]:
    """The session's directory, reached without following links (a home or a space is its
    users' to change), holding ``events.jsonl``; else ENOENT saying what is missing — the
    space, the session, or only its events — and how to find the sessions there are."""
    _require_space(ref, ref.space)
    try:
        directory = open_session_directory(ref)
    except FileNotFoundError:
        raise not_found(
            f"there is no session {ref}; '{listing}' lists the sessions there are"
        ) from None
    try:
        try:
            os.stat(events.EVENTS_FILE, dir_fd=directory, follow_symlinks=False)
        except FileNotFoundError:
            raise not_found(
                f"session {ref} has no events.jsonl: nothing was recorded in it yet, or the "
                "file was removed (the next event recorded in the session makes it again)"
            ) from None
        except PermissionError as exc:
            # Refused at the directory's descriptor, the system names the last part alone
            # ("events.jsonl"); the whole path lets the refusal name the directory closed
            # to the caller, its owner, group and mode, and what opens it.
            raise OSError(exc.errno, exc.strerror, str(ref.events_path)) from None
        yield directory
    finally:
        os.close(directory)


def _render(event: dict[str, Any], ref: SessionRef, as_json: bool) -> None:
    if as_json:
        # As events.jsonl holds it, compact, keys in order; terminal-safe all the same.
        click.echo(terminal_json(event, separators=(",", ":")))
        return
    # The agent and session go without saying, unless the event names others: whoever may
    # write the file (the agent itself, in its home) could make a line claim another's.
    own = {"agent": ref.agent, "session": ref.name}
    rest = {
        key: value
        for key, value in event.items()
        if key not in _S2_KEYS or (key in own and value != own[key])
    }
    details = " ".join(f"{key}={readable_json(value)}" for key, value in rest.items())
    ts, kind = _column(event, "ts", "?"), _column(event, "type", "?")
    thing, status = _column(event, "object", "-"), _column(event, "status", "-")
    # Whoever may write the file chose every character: none reaches the terminal as a
    # control, a line break or a bidirectional override.  Padded by the cells each value takes
    # once printable, so that a wide character or an escaped tab does not push the columns
    # after it.
    line = f"{printable(ts)}  {padded(kind, 12)} {padded(thing, 24)} {padded(status, 10)} "
    click.echo((line + printable(details)).rstrip())


def _column(event: dict[str, Any], key: str, missing: str) -> str:
    """One of the S-2 columns as text: a file someone else wrote may hold any JSON value
    there (``"status": null``), which is shown as JSON rather than refused."""
    value = event.get(key, missing)
    return value if isinstance(value, str) and is_utf8_text(value) else _compact(value)


def _compact(value: Any) -> str:
    return readable_json(value, separators=(",", ":"))


def _warn(ref: SessionRef, scan: events.EventScan) -> None:
    if scan.torn_tail:
        echo_printable(
            f"ctx: note: {ref.events_path} ends with a torn line of {scan.torn_tail} bytes "
            f"(skipped; '{_repair_command(ref)}' truncates it)",
            err=True,
        )
    _warn_damaged(ref, scan)


def _repair_command(ref: SessionRef) -> str:
    """The command that repairs the session ``ref`` (its names are legal object names, R-3:
    nothing in them needs quoting)."""
    where = f"--project {ref.space}" if ref.space is not None else f"--uid {ref.uid}"
    return f"ctx session repair {ref.agent} --session {ref.name} {where}"


def _warn_damaged(ref: SessionRef, scan: events.EventScan) -> None:
    if scan.damaged:
        lines = ", ".join(str(number) for number in scan.damaged[:10])
        more = scan.damaged_count - len(scan.damaged[:10])
        lines += f" and {more} more" if more else ""
        echo_printable(f"ctx: note: skipped damaged lines {lines} of {ref.events_path}", err=True)
