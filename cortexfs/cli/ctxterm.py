"""``bin/ctxterm``: start an agent terminal and stay in the foreground until it ends (SPEC H-1,
A-1).  The program ``ctx bootstrap`` writes to ``bin/ctxterm`` calls :func:`main`."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from cortexfs.cli.agent import (
    start_warnings,
    terminal_facts,
    workspace_directory,
    workspace_options,
)
from cortexfs.cli.common import (
    echo_printable,
    emit_json,
    handles_errors,
    json_option,
    object_name_argument,
)
from cortexfs.cli.params import NonEmptyPath
from cortexfs.shared.sessions import DEFAULT_SESSION
from cortexfs.storage import resolve_root, root_from_environment


@click.command("ctxterm", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("agent")
@click.option("--session", default=DEFAULT_SESSION, show_default=True, help="The session.")
@workspace_options
@click.option(
    "--storage",
    "storage_dir",
    type=NonEmptyPath(file_okay=False, path_type=Path),
    help="Storage root (default: $CTX_STORAGE, else the root this ctxterm belongs to).",
)
@json_option
@click.version_option(package_name="cortexfs")
@click.pass_obj
@handles_errors
def ctxterm(
    home_root: str | None,
    agent: str,
    session: str,
    workspace: Path | None,
    no_workspace: bool,
    storage_dir: Path | None,
    as_json: bool,
) -> None:
    """Start AGENT's terminal, as 'ctx agent start' does, and serve it in the foreground.

    \b
    tsh runs in AGENT's sandbox on a PTY this process owns; watch it with
    'ctx agent watch AGENT --session S', join with 'ctx agent attach'.  ctxterm returns
    when the terminal ends ('exit' in tsh, 'ctx agent stop', SIGTERM, SIGHUP or Ctrl-C here),
    with tsh's exit status (137 when a stop killed it).  Needs root, bubblewrap and the
    'fuse' extra.
    """
    from cortexfs.agents.ctxterm import serve_in_foreground, start_terminal

    root = resolve_root(storage_dir or root_from_environment() or home_root)
    agent = object_name_argument(agent, "agent")
    session = object_name_argument(session, "session")
    terminal = start_terminal(root, agent, session, workspace_directory(workspace, no_workspace))
    for warning in start_warnings(terminal, explicit_workspace=workspace is not None):
        echo_printable(f"ctxterm: warning: {warning}", err=True)
    facts = {**terminal_facts(terminal), "pid": os.getpid()}
    if as_json:
        emit_json(facts)
    else:
        echo_printable(
            f"ctxterm: {agent}, session {session}: {facts['socket']} (pid {os.getpid()})"
        )
    raise SystemExit(serve_in_foreground(terminal))


def main(storage: str | None = None) -> None:
    """Entry point of ``bin/ctxterm``; ``storage``: the root the program was written into.
    Its refusals read as ``ctx``'s do: ``ctxterm: EINVAL: …`` for a malformed command line."""
    from cortexfs.cli.usage import run_click
    from cortexfs.standard_streams import prepare_standard_streams

    prepare_standard_streams()
    run_click(ctxterm, sys.argv[1:], "ctxterm", obj=storage)
