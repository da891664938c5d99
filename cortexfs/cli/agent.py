"""``ctx agent``: create agents and look at them, on the host side (SPEC A-3)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from cortexfs.absolute_paths import absolute
from cortexfs.agents.create import ROOT_DEFAULT_USER, create_agent, default_identity, identity_json
from cortexfs.agents.request import (
    MAX_REQUEST_BYTES,
    RequestError,
    load_request,
    parse_request_bytes,
)
from cortexfs.agents.view import AgentView
from cortexfs.cli.common import (
    STORAGE_SELECTION_KEY,
    F,
    changed,
    echo_printable,
    emit_json,
    fail_with_problems,
    for_this_storage,
    handles_errors,
    json_option,
    object_name_argument,
    require_standard_input,
    resolve_storage,
    storage_option,
    under_way,
    usage_problem,
)
from cortexfs.cli.params import MAX_ID, NonEmptyPath
from cortexfs.errors import CtxError, describe, invalid, not_found
from cortexfs.names import decimal_value, is_decimal, object_name_problem, shown_number
from cortexfs.policy import AgentFacts, Identity
from cortexfs.printable import shell_word
from cortexfs.process_limits import no_process_could_be_made
from cortexfs.regular_file import read_up_to
from cortexfs.shared.sessions import DEFAULT_SESSION

STDIN = "-"
STDIN_NAME = "<stdin>"  # how a request read from standard input is named in its errors

if TYPE_CHECKING:
    from cortexfs.agents import terminal_socket
    from cortexfs.agents.terminal import Terminal


@click.group()
def agent() -> None:
    """Agents: host-owned identities, mounts and policies (SPEC §8).

    \b
    An agent is agent/<name> (its executable entry) plus agent/<name>.d/ controls:
    label, policy, identity, mount, model, system.md, prompt.template.md, log.
    See docs/tools.md for how a tool call uses them.
    """


@agent.command()
@click.argument("request", type=NonEmptyPath(path_type=Path))
@click.option(
    "--user",
    help=f"Run the agent as this user (name or uid); default: you, or for root the user "
    f"{ROOT_DEFAULT_USER!r} (an agent never runs as root; root and uid 0 are refused).",
)
@click.option("--gid", help="Its primary group's id (default: the user's).")
@click.option(
    "--groups", help="Its supplementary groups, comma-separated ids (default: the user's)."
)
@storage_option
@json_option
@handles_errors
def create(
    request: Path,
    user: str | None,
    gid: str | None,
    groups: str | None,
    storage_dir: Path | None,
    as_json: bool,
) -> None:
    """Create the agent described by REQUEST ('-' reads standard input) (SPEC A-3).

    \b
    REQUEST is one JSON object:
      {"name": "reviewer", "label": "reviewer_t", "model": ["openai/gpt-5.6"],
       "tools": ["fs.read"], "shared": {"project-a": ["read"]},
       "mount": [["/work", "/work", "ro"]]}

    It is at most 256 KiB (262144 bytes), from a file or standard input alike.  A space's
    permissions are a list or a string ("read write").  The policy grants exactly the listed
    tools, models, shared spaces and mounts; the storage root is mounted read-only at /ctx
    (no mount may target /ctx).  Only root or the owner of the storage root may create
    agents; an existing agent is never overwritten.

    The agent runs as you by default.  An agent never runs as root (SPEC P-5): when root
    creates one without --user, it runs as the unprivileged user 'nobody' (its uid and gid
    from the password database), and the output says so; --user root (or uid 0) is refused
    (EINVAL, exit 2).  Anyone but root can give an agent only their own uid and groups (EPERM
    otherwise): only root can run processes as another.
    """
    root = resolve_storage(storage_dir)
    try:
        if str(request) == STDIN:
            require_standard_input("request")
            # As much as the limit of a request FILE, and a byte more to tell one past it.
            data = read_up_to(sys.stdin.fileno(), MAX_REQUEST_BYTES)
            parsed = parse_request_bytes(data, STDIN_NAME, root)
        else:
            parsed = load_request(request, root)
    except RequestError as exc:
        source = STDIN_NAME if str(request) == STDIN else request
        fail_with_problems(source, exc, exc.problems, as_json)
    identity, default_user = _identity(user, gid, groups)
    created = create_agent(root, parsed, identity, default_user=default_user)
    changed(f"agent {created.name} was created (do not create it again)")
    if as_json:
        # Its warnings' suggested commands name the root this one was given, as on stderr.
        emit_json({**created.to_json(), "warnings": list(map(for_this_storage, created.warnings))})
    else:
        ids = created.identity
        echo_printable(
            f"created agent {created.name}: {created.entry} (uid {ids.uid}, gid {ids.gid})"
        )
        if created.default_user is not None:
            echo_printable(
                f"it runs as user {created.default_user}: an agent never runs as root, so that "
                "is root's default; choose another with --user"
            )
    for warning in created.warnings:
        echo_printable(f"ctx: warning: {warning}", err=True)


@agent.command()
@click.argument("name")
@storage_option
@json_option
@handles_errors
def show(name: str, storage_dir: Path | None, as_json: bool) -> None:
    """Show what the runtime derives from agent NAME's controls.

    Its identity, label, CTX_PATH, the mounts its policy lets it use, and its working
    directory; a mount of the control that is never used (a system directory as its target, a
    source that is no longer the real path recorded) is listed as withheld, with the reason,
    and a label, policy or mount control that is unusable (and so grants nothing) as a
    problem; the terminals of NAME that run, by session (with --json, "terminals": [{"session",
    "uid", "pid"}]), a uid other than its identity's when one was changed since it started.
    The storage root at /ctx reaches a tool only as NAME's view of it (ctx mount
    --as NAME): with --json, "tool_mounts" are the mounts its tools get (CTX_MOUNTS), the
    root as filtered mounts, each showing only the names listed, read-write only for its
    home and the spaces it may write.
    """
    from cortexfs.agents.terminal_socket import running_terminals
    from cortexfs.policy.controls import withheld_mounts

    name = object_name_argument(name, "agent")
    root = resolve_storage(storage_dir)
    view = AgentView.load(root, name)
    cwd, _ = view.working_directory()
    mounts = [
        [str(m.source), str(m.target), "rw" if m.writable else "ro"] for m in view.visible_mounts()
    ]
    try:
        withheld = withheld_mounts(root, name)
    except CtxError:
        withheld = ()  # a malformed mount control: the chain says so at every call
    facts = {
        "name": view.name,
        "label": view.label or None,
        "identity": identity_json(view.identity),
        "ctx_path": view.ctx_path(),
        "mounts": mounts,
        "withheld_mounts": [
            {"mount": [str(m.source), str(m.target), "rw" if m.writable else "ro"], "reason": why}
            for m, why in withheld
        ],
        "cwd": str(cwd),
        "problems": view.control_problems(),
        "terminals": [terminal._asdict() for terminal in running_terminals(root, name)],
    }
    if as_json:
        emit_json({**facts, "tool_mounts": [mount.to_json() for mount in view.tool_mounts()]})
        return
    ids = view.identity
    echo_printable(f"name: {view.name}")
    echo_printable(f"label: {view.label or '(none)'}")
    groups = ",".join(str(group) for group in sorted(ids.groups)) or "(none)"
    echo_printable(f"identity: uid {ids.uid}, gid {ids.gid}, groups {groups}")
    echo_printable(f"ctx_path: {facts['ctx_path']}")
    for source, target, access in mounts:
        echo_printable(f"mount: {source} at {target} ({access})")
    for mount, why in withheld:
        echo_printable(f"withheld mount: {mount.source} at {mount.target}: {why}")
    echo_printable(f"cwd: {cwd}")
    for problem in facts["problems"]:
        echo_printable(f"problem: {problem}")
    for running in facts["terminals"]:
        former_uid = "" if running["uid"] == ids.uid else f", as uid {running['uid']}"
        echo_printable(f"terminal: session {running['session']} (pid {running['pid']}{former_uid})")


@agent.command("list")
@storage_option
@json_option
@handles_errors
def list_command(storage_dir: Path | None, as_json: bool) -> None:
    """List the agents of the storage root, one a line: name, label, uid and gid.

    An agent whose controls cannot be used (a missing identity, a malformed label, policy or
    mount control) is listed with its problems ('ctx agent show NAME' says more).  With
    --json, one JSON array of {"name", "label", "identity", "problems"} objects, identity
    (or label) null when it cannot be read.  A root without its agent/ directory (never
    bootstrapped) is ENOENT, exit 1, naming 'ctx bootstrap'; an agent/ that is a symbolic
    link is never followed: ELOOP, exit 1, naming it, as for 'ctx agent create'.
    """
    from cortexfs.agents.entries import agents_directory
    from cortexfs.policy.controls import agent_exists

    root = resolve_storage(storage_dir)
    entries = sorted(os.listdir(agents_directory(root)))
    agents = []
    for name in entries:
        if name.endswith(".d") or object_name_problem(name) or not agent_exists(root, name):
            continue
        try:
            view = AgentView.load(root, name)
        except CtxError as exc:  # its identity: the rest is still worth telling
            facts = AgentFacts(root, name)
            label = None
            with contextlib.suppress(CtxError):
                label = facts.declared_label or None
            unusable = {"name": name, "label": label, "identity": None}
            agents.append({**unusable, "problems": [exc.message]})
            continue
        agents.append(
            {
                "name": name,
                "label": view.label or None,
                "identity": identity_json(view.identity),
                "problems": view.control_problems(),
            }
        )
    if as_json:
        emit_json(agents)
        return
    for facts in agents:
        identity = facts["identity"]
        ids = (
            "uid ?, gid ?" if identity is None else f"uid {identity['uid']}, gid {identity['gid']}"
        )
        line = f"{facts['name']}  {facts['label'] or '(no label)'}  {ids}"
        if facts["problems"]:
            line += f"  ({len(facts['problems'])} problem(s): {facts['problems'][0]})"
        echo_printable(line)


def _identity(
    user: str | None, gid_text: str | None, groups: str | None
) -> tuple[Identity | None, str | None]:
    """The identity the options describe (None: the creating user's, when none is given),
    and the user it defaulted to when ``--gid`` or ``--groups`` came without ``--user``."""
    if user is None and gid_text is None and groups is None:
        return None, None
    gid = None if gid_text is None else _parse_id(gid_text, "--gid")
    default_user = None
    if user is None:
        default, default_user = default_identity()
        uid, primary, extra = default.uid, default.gid, default.groups
    else:
        entry = _lookup_user(user)
        if entry is None:
            if gid is None:
                raise usage_problem(invalid(f"uid {user} is not a known user; give --gid too"))
            uid, primary, extra = _parse_id(user, "--user"), gid, frozenset()
        else:
            uid, primary = entry.pw_uid, entry.pw_gid
            extra = frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))
        if uid == 0:  # a command line no agent can have, as every other bad --user (exit 2)
            raise usage_problem(
                invalid(
                    "an agent never runs as root (SPEC P-5 step 1); give it an unprivileged user"
                )
            )
    if gid is not None:
        primary = gid
    if groups is not None:
        extra = frozenset(_parse_id(group, "--groups") for group in groups.split(",") if group)
    return Identity(uid, primary, extra), default_user


def _parse_id(text: str, option: str) -> int:
    """A uid or gid given as ``option``: decimal, from 0 to 2**32 - 2 ((uid_t)-1 is no id)."""
    number = decimal_value(text)
    if number is None or not 0 <= number <= MAX_ID:
        raise usage_problem(
            invalid(
                f"{option} takes ids, integers from 0 to {MAX_ID}: {shown_number(text)} is not one"
            )
        )
    return number


def _lookup_user(user: str) -> pwd.struct_passwd | None:
    """The user database entry of a name or uid; None for a uid it does not know."""
    try:
        return pwd.getpwuid(_parse_id(user, "--user")) if is_decimal(user) else pwd.getpwnam(user)
    except KeyError:
        if is_decimal(user):
            return None
        raise usage_problem(invalid(f"no such user: {user!r}")) from None


# ------------------------------------------------------------------------ the terminal (§8)

_SESSION = click.option(
    "--session", default=DEFAULT_SESSION, show_default=True, help="The terminal's session."
)


def workspace_options(fn: F) -> F:
    """``--workspace DIR`` / ``--no-workspace``, for every command that starts a terminal."""
    fn = click.option(
        "--no-workspace", is_flag=True, help="Mount no default /workspace; start in '/' instead."
    )(fn)
    return click.option(
        "--workspace",
        type=NonEmptyPath(exists=True, file_okay=False, path_type=Path),
        help="The directory mounted read-write at /workspace when the agent's mounts have "
        "none (default: the current directory).",
    )(fn)


def workspace_directory(workspace: Path | None, no_workspace: bool) -> Path | None:
    """The directory to mount at /workspace by default (A-1), or None for none."""
    if workspace is not None and no_workspace:
        raise usage_problem(invalid("give --workspace DIR or --no-workspace, not both"))
    if no_workspace:
        return None
    if workspace is not None:
        try:
            return Path(absolute(workspace))  # the terminal outlives this directory
        except FileNotFoundError:
            raise not_found(
                f"--workspace {workspace} is relative, and the current directory no longer "
                "exists: give an absolute path, or change to a directory that exists"
            ) from None
    try:
        return Path.cwd()
    except FileNotFoundError:
        raise not_found(
            "the current directory, the terminal's default /workspace, no longer exists: "
            "change to another, or give --workspace DIR or --no-workspace"
        ) from None


def start_warnings(terminal: Terminal, *, explicit_workspace: bool) -> list[str]:
    """What a terminal's starter is told: what the start cleaned up, a workspace that grants
    more than meant, and a --workspace DIR the agent's own /workspace overrides."""
    overridden = terminal.workspace_overridden() if explicit_workspace else None
    found = (terminal.cleaned_warning(), terminal.workspace_warning(), overridden)
    return [warning for warning in found if warning is not None]


def terminal_facts(terminal: Terminal) -> dict[str, object]:
    """What a started terminal tells its starter (``--json``), with ``cleaned`` when the start
    removed what a terminal of the session that died had left."""
    from cortexfs.agents.terminal_socket import terminal_link

    workspace = terminal.workspace_source()
    facts: dict[str, object] = {
        "agent": terminal.view.name,
        "session": terminal.session.name,
        "socket": str(terminal_link(terminal.session)),
        "listening_at": str(terminal.main_socket),
        "workspace": None if workspace is None else str(workspace),
    }
    if terminal.cleaned:
        facts["cleaned"] = terminal.cleaned
    return facts


def _workspace_kind(terminal: Terminal) -> str:
    """Whose the terminal's ``/workspace`` is: the default its starter gave (this terminal's
    only, read-write), or the agent's own mount there, which wins over it, with its mode."""
    if terminal.view.workspace is not None:
        return "read-write, this terminal only"
    own = terminal.workspace_mount()
    mode = "read-write" if own is not None and own.writable else "read-only"
    return f"{mode}, agent {terminal.view.name}'s own mount"


@agent.command()
@click.argument("name")
@_SESSION
@workspace_options
@storage_option
@json_option
@handles_errors
def start(
    name: str,
    session: str,
    workspace: Path | None,
    no_workspace: bool,
    storage_dir: Path | None,
    as_json: bool,
) -> None:
    """Start NAME's terminal: tsh in a sandbox, on a PTY that ctxterm owns (SPEC A-1).

    The sandbox (bubblewrap) shows /ctx as NAME's view of the storage root (ctx mount
    --as NAME), NAME's visible mounts at their targets, /usr and /etc read-only;
    tsh runs there as NAME's uid and runs only CortexFS tools, each through the whole
    authority chain and recorded in the session.  Prints the terminal socket; watch with
    'ctx agent watch NAME --session S', join with 'ctx agent attach', end with 'exit' in
    tsh or 'ctx agent stop'.  Needs root, bubblewrap and the 'fuse' extra.

    By default the current directory is mounted at /workspace, read-write as far as
    Linux lets NAME's uid write, and the terminal (and each tool it runs) starts there;
    --workspace DIR mounts DIR instead, --no-workspace nothing.  This grant is for this
    terminal only and is not written to NAME's controls; a /workspace in NAME's mount
    control wins over it.
    """
    from cortexfs.agents.host import require_host_administrator
    from cortexfs.agents.terminal import Terminal

    root = resolve_storage(storage_dir)
    name = object_name_argument(name, "agent")
    session = object_name_argument(session, "session")
    directory = workspace_directory(workspace, no_workspace)
    require_host_administrator(root, "start an agent")
    terminal = Terminal(root, name, session, directory)
    terminal.prepare()
    with under_way(
        f"agent {name}'s terminal, session {session}, was starting ('ctx agent show {name}' "
        f"lists the terminals that run, 'ctx agent stop {name} --session {session}' ends it)"
    ):
        _daemonize(terminal)
    changed(f"agent {name}'s terminal, session {session}, was started ('ctx agent stop' ends it)")
    for warning in start_warnings(terminal, explicit_workspace=workspace is not None):
        echo_printable(f"ctx: warning: {warning}", err=True)
    facts = terminal_facts(terminal)
    if as_json:
        emit_json(facts)
        return
    echo_printable(f"started {name}, session {session}: {facts['socket']}")
    if facts["workspace"] is not None:
        echo_printable(f"/workspace is {facts['workspace']} ({_workspace_kind(terminal)})")
    # Copied into a shell without $CTX_STORAGE, the commands must still reach this root.
    selected = click.get_current_context().meta.get(STORAGE_SELECTION_KEY)
    on_root = "" if selected is None else f" --storage {shell_word(selected)}"
    echo_printable(
        f"watch: ctx agent watch {name} --session {session}{on_root}   "
        f"join: ctx agent attach {name} --session {session}{on_root}"
    )


@agent.command()
@click.argument("name")
@_SESSION
@storage_option
@json_option
@handles_errors
def stop(name: str, session: str, storage_dir: Path | None, as_json: bool) -> None:
    """End NAME's terminal: tsh is killed, the view unmounted, the sockets removed.

    Returns once it has ended and prints 'stopped NAME, session S (pid N)'.  A terminal that
    died without cleaning up (killed: its view still mounted, its mount process running) is
    cleaned up after instead: 'cleaned up after NAME, session S (pid N), which had ended
    without cleaning up: …' says what was removed.  --json: {"agent", "session", "pid"},
    and "running" (false: it had ended) and "cleaned" (what was removed) when something was
    cleaned up.  ENOENT (exit 1) when no terminal runs and none left anything."""
    from cortexfs.agents import terminal_socket

    whose, session = _terminal_to_stop(storage_dir, name, session)
    stopped = terminal_socket.stop(whose, session)
    changed(f"agent {whose.name}'s terminal, session {session}, was stopped")
    if as_json:
        facts: dict[str, object] = {"agent": whose.name, "session": session, "pid": stopped.pid}
        if stopped.cleaned:
            facts.update(running=stopped.running, cleaned=list(stopped.cleaned))
        emit_json(facts)
        return
    terminal = f"{whose.name}, session {session}"
    if stopped.pid is not None:
        terminal += f" (pid {stopped.pid})"
    done = "; ".join(stopped.cleaned)
    if not stopped.running:
        echo_printable(f"cleaned up after {terminal}, which had ended without cleaning up: {done}")
    elif done:
        echo_printable(f"stopped {terminal} and cleaned up what it left: {done}")
    else:
        echo_printable(f"stopped {terminal}")


@agent.command()
@click.argument("name")
@_SESSION
@storage_option
@handles_errors
def watch(name: str, session: str, storage_dir: Path | None) -> None:
    """Watch NAME's terminal: its output, read-only (A-2, the observe-first default).

    Ctrl-C stops watching; the terminal goes on.  When the terminal ends, watching ends
    too, with a line on standard error saying so."""
    from cortexfs.agents import terminal_socket

    root, view, session = _terminal_of(storage_dir, name, session)
    closed = False
    with (
        terminal_socket.connect(root, view, session, b"watch") as connection,
        contextlib.suppress(KeyboardInterrupt),
    ):
        closed = terminal_socket.relay(connection, write=False)
    if closed:
        _say_the_terminal_closed(terminal_socket.socket_path(view, session), view.name, session)


@agent.command()
@click.argument("name")
@_SESSION
@storage_option
@handles_errors
def attach(name: str, session: str, storage_dir: Path | None) -> None:
    """Join NAME's terminal: see its output and type into it (A-2).

    What you type reaches tsh as if the agent typed it.  Ctrl-] detaches; the terminal
    goes on.  Input piped in (a script) is sent, then the output is shown until the
    terminal has been quiet for a second.  When the terminal ends, so does attach, with a
    line on standard error saying so."""
    from cortexfs.agents import terminal_socket

    root, view, session = _terminal_of(storage_dir, name, session)
    with terminal_socket.connect(root, view, session, b"attach") as connection:
        closed = terminal_socket.relay(connection, write=True)
    if closed:
        _say_the_terminal_closed(terminal_socket.socket_path(view, session), view.name, session)


def _say_the_terminal_closed(path: Path, agent: str, session: str) -> None:
    """That the terminal closed the connection: it has ended (exit 0), or, when it still
    answers at ``path``, it let this client go (ECONNABORTED, exit 1).  After the output,
    which may have left the cursor mid-line (a prompt)."""
    from cortexfs.agents import terminal_socket

    where = f"the terminal of {agent} in session {session}"
    if terminal_socket.still_serves(path):
        click.echo(err=True)
        raise CtxError(
            errno.ECONNABORTED,
            f"{where} still runs, but let this client go: it took none of the output for "
            f"{terminal_socket.STALL_SECONDS:g} s, or fell more than "
            f"{terminal_socket.MAX_BEHIND // 1024 // 1024} MiB behind it; what it shows is cut "
            "short: watch again",
        )
    click.echo(f"\nctx: {where} closed the connection: it has ended", err=True)


def _terminal_of(storage_dir: Path | None, name: str, session: str) -> tuple[Path, AgentView, str]:
    """The storage root, the agent NAME and the session: both names checked first (EINVAL,
    exit 2), as a malformed name is a usage error whatever the root and the agents."""
    name = object_name_argument(name, "agent")
    session = object_name_argument(session, "session")
    root = resolve_storage(storage_dir)
    return root, AgentView.load(root, name), session


def _terminal_to_stop(
    storage_dir: Path | None, name: str, session: str
) -> tuple[terminal_socket.Whose, str]:
    """The agent whose terminal of ``session`` is to be stopped: as :func:`_terminal_of`; or,
    when the agent's controls were removed or damaged while its terminal ran, the agent by
    its name alone, if a terminal of the session is found: it must still be stoppable (a
    warning names what is wrong with the controls).  The agent's error otherwise."""
    from cortexfs.agents import terminal_socket

    name = object_name_argument(name, "agent")
    session = object_name_argument(session, "session")
    root = resolve_storage(storage_dir)
    try:
        return terminal_socket.Whose.of(AgentView.load(root, name)), session
    except CtxError as unusable:
        whose = terminal_socket.Whose(root, name, None)
        if not root.is_dir() or terminal_socket.terminal_uid(whose, session) is None:
            raise
        if os.path.lexists(root / "agent" / name):  # there, but its controls are not
            echo_printable(
                f"ctx: warning: {unusable.message}; the terminal was found by the agent's name",
                err=True,
            )
        return whose, session


def _close_what_the_caller_passed() -> None:
    """Close the descriptors above 2 that this command's caller passed down: the terminal
    outlives the command, and would keep a caller's pipe from ending and its locks held until
    ``ctx agent stop``.  They are the inheritable ones: what Python opens never is (PEP 446),
    and a fork, unlike an exec, keeps those too."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
            if fd > 2 and os.get_inheritable(fd):
                os.close(fd)


def _tell_the_starter(ready_write: int, exc: BaseException) -> None:
    """Tell ``ctx agent start``, waiting on the pipe's other end, why the terminal did not
    start: the errno of what refused it (EAGAIN: no process could be made)."""
    if isinstance(exc, CtxError):
        failure = exc
    elif isinstance(exc, OSError) and exc.errno == errno.EAGAIN:  # fork refused
        failure = CtxError(exc.errno, f"{exc.strerror} ({no_process_could_be_made()})")
    elif isinstance(exc, OSError) and exc.errno:
        failure = CtxError(exc.errno, describe(exc))
    else:
        failure = CtxError(errno.EIO, str(exc))
    with contextlib.suppress(OSError):  # told already (a pipe closed once it listened)
        os.write(ready_write, json.dumps([failure.errno, failure.message]).encode())


def _daemonize(terminal: Terminal) -> None:
    """Leave ``terminal`` running in a process of its own; return once it listens."""
    from cortexfs.agents.ctxterm import take_the_name

    ready_read, ready_write = os.pipe()
    child = os.fork()
    if child == 0:
        # Nothing of this process may return into the command: whatever fails here is told to
        # the starter through the pipe, and the process ends.
        try:
            os.close(ready_read)
            os.setsid()
            if os.fork() != 0:
                os._exit(0)
            take_the_name()
            devnull = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            _close_what_the_caller_passed()
            try:
                terminal.start()
                terminal.runtime.record_pid(os.getpid())
            except BaseException as exc:  # reported to the parent, then this process ends
                _tell_the_starter(ready_write, exc)
                terminal.close()
                os._exit(1)
            os.write(ready_write, b"")
            os.close(ready_write)
            os._exit(terminal.serve())
        except BaseException as exc:  # before the terminal started: its second process refused
            _tell_the_starter(ready_write, exc)
            os._exit(1)
    os.close(ready_write)
    os.waitpid(child, 0)
    with os.fdopen(ready_read, "rb") as ready:
        answer = ready.read()
    if answer:
        code, message = json.loads(answer)
        raise CtxError(code, f"the terminal did not start: {message}")
