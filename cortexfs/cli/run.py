"""``ctx run``: run one tool as an agent, in terminal CLI or agent native mode (SPEC T-3)."""

from __future__ import annotations

import errno
import json
import sys
from pathlib import Path
from typing import Any

import click

from cortexfs.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    handles_errors,
    resolve_storage,
    storage_option,
)
from cortexfs.names import check_object_name
from cortexfs.shared.sessions import DEFAULT_SESSION, SessionRef
from cortexfs.tools.result import ToolResult
from cortexfs.tools.runner import DEFAULT_TIMEOUT, run_native, run_terminal

# The shell's convention for a command that was not found / could not be run (terminal mode).
EXIT_NOT_FOUND = 127
EXIT_CANNOT_RUN = 126


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--agent", required=True, help="The agent whose identity, mounts and policy apply.")
@click.option("--session", default=DEFAULT_SESSION, show_default=True, help="Session to record in.")
@click.option("--project", help="Record in shared/PROJECT/agent/AGENT/session/SESSION instead.")
@click.option("--native", is_flag=True, help="Agent native mode: JSON on stdin, JSONL frames out.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    help=f"Kill the tool's process group after this many seconds (native default "
    f"{DEFAULT_TIMEOUT:g}; terminal default: none).",
)
@storage_option
@click.argument("tool")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@handles_errors
def run(
    agent: str,
    session: str,
    project: str | None,
    native: bool,
    timeout: float | None,
    storage_dir: Path | None,
    tool: str,
    args: tuple[str, ...],
) -> None:
    """Run TOOL as AGENT through the whole authority chain (SPEC T-3, P-5, P-6).

    \b
    Terminal CLI mode (default): ARGs are passed as they are, stdin/stdout/stderr are the
    tool's; the exit status is the tool's (126: refused, 127: not found).
    Native mode (--native): the tool's JSON input is read from stdin and checked against
    its schema; stdout carries JSONL frames, one object per line:
      {"type": "call", ...}    the tool started (call id, pid)
      {"type": "stderr", ...}  one line of the tool's stderr
      {"type": "result", ...}  the outcome: status, output, exit_status, error (errno,
                               stage, denying chain step), timings; always the last frame
    Exit 0 when the result is ok, 1 otherwise, 2 for unusable input.

    Only the host administrator (root, or the owner of the storage root) may run tools as
    an agent.  Every call is recorded in the session's events.jsonl and the tool's log.
    """
    root = resolve_storage(storage_dir)
    where = _session(root, agent, session, project)
    if native:
        sys.exit(_run_native(root, agent, tool, args, where, timeout))
    result = run_terminal(root, agent, tool, list(args), session=where, timeout=timeout)
    if result.exit_status is None and result.error is not None:
        click.echo(f"ctx: {result.error}", err=True)
        missing = result.error.errno == errno.ENOENT and result.error.stage == "resolve"
        sys.exit(EXIT_NOT_FOUND if missing else EXIT_CANNOT_RUN)
    if result.error is not None and result.error.stage == "run":
        click.echo(f"ctx: {result.error}", err=True)
    sys.exit(result.exit_status)


def _run_native(
    root: Path,
    agent: str,
    tool: str,
    args: tuple[str, ...],
    where: SessionRef | str,
    timeout: float | None,
) -> int:
    if args:
        click.echo("ctx: EINVAL: native mode takes its input on stdin, not as arguments", err=True)
        return EXIT_USAGE
    try:
        input_value: Any = json.loads(sys.stdin.buffer.read())
    except ValueError as exc:
        click.echo(f"ctx: EINVAL: the input on stdin is not JSON: {exc}", err=True)
        return EXIT_USAGE
    result = run_native(
        root,
        agent,
        tool,
        input_value,
        session=where,
        timeout=DEFAULT_TIMEOUT if timeout is None else timeout,
        observer=_print_frame,
    )
    return _native_exit(result)


def _native_exit(result: ToolResult) -> int:
    if result.ok:
        return EXIT_OK
    if result.error is not None and result.error.stage == "schema":
        return EXIT_USAGE
    return EXIT_REFUSED


def _print_frame(frame: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(frame, default=str) + "\n")
    sys.stdout.flush()


def _session(root: Path, agent: str, session: str, project: str | None) -> SessionRef | str:
    check_object_name(session, "session")
    if project is None:
        return session
    return SessionRef.shared(root, project, agent, session)
