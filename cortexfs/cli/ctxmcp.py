"""``ctxmcp``: list an MCP stdio server's tools, or project them into manifest candidates (§10)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import click

from cortexfs import jsontext
from cortexfs.cli.common import (
    EXIT_REFUSED,
    echo_printable,
    emit_json,
    handles_errors,
    json_option,
    printable,
    resolve_storage,
    storage_option,
    usage_problem,
)
from cortexfs.cli.params import NonEmptyPath, Seconds
from cortexfs.errors import CtxError
from cortexfs.mcp.candidates import write_candidates
from cortexfs.mcp.client import DEFAULT_TIMEOUT, StdioClient
from cortexfs.mcp.config import ServerSpec, load_server
from cortexfs.mcp.out_directory import check_out_directory
from cortexfs.mcp.project import LISTING_CONFIG, check_runtime_config, project_tools
from cortexfs.printable import shortened
from cortexfs.tools import orphans

_CONFIG = click.option(
    "--config",
    "config_path",
    required=True,
    type=NonEmptyPath(dir_okay=False, path_type=Path),
    help="The MCP client configuration to read (an mcpServers object).",
)
_SERVER = click.option("--server", required=True, help="The stdio server to start.")
_TIMEOUT = click.option(
    "--timeout",
    type=Seconds(min=0, min_open=True),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds to wait for each answer of the server.",
)


def main(args: list[str] | None = None) -> None:
    """The ``ctxmcp`` console script."""
    from cortexfs.cli.usage import run_click
    from cortexfs.interrupts import Stopped, reset_inherited_signal_state, stops_raise
    from cortexfs.standard_streams import prepare_standard_streams

    prepare_standard_streams()
    reset_inherited_signal_state()
    argv = sys.argv[1:] if args is None else list(args)
    try:
        # SIGTERM and SIGHUP unwind like ^C, so that the server's process group, a session of
        # its own that no signal of ours reaches, is killed on the way out; one its caller
        # ignores (nohup) stays ignored.
        with stops_raise():
            run_click(ctxmcp, argv, "ctxmcp")
    except MemoryError:
        from cortexfs.cli.exits import ran_out_of_memory

        ran_out_of_memory("ctxmcp", "--json" in argv)
    except Stopped as stopped:
        # The server is gone; now end as the signal would have ended us.
        signal.signal(stopped.signum, signal.SIG_DFL)
        os.kill(os.getpid(), stopped.signum)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cortexfs")
def ctxmcp() -> None:
    """Project the tools of an external MCP stdio server into v2 manifest candidates.

    ctxmcp installs nothing, grants nothing and writes nothing under the storage root: a
    candidate is installed, like any manifest, with 'ctx object install', and an agent
    runs it only when its policy and the tool's allow it.  Each tool is named exactly
    SERVER.TOOL (M-3), so SERVER must be a name without dots.  The protocol version
    announced is 2025-11-25; a server that negotiates anything but 2025-11-25, 2025-06-18,
    2025-03-26 or 2024-11-05 is refused (M-2).  Exit 0 success; 1 the server failed or was
    refused, or 'project' skipped a tool or found earlier candidates in the way; 2 usage
    error; 74 the output could not be written (the candidates 'project' wrote stay written).
    """


@ctxmcp.command("list")
@_CONFIG
@_SERVER
@_TIMEOUT
@json_option
@handles_errors
def list_command(config_path: Path, server: str, timeout: float, as_json: bool) -> None:
    """List SERVER's tools with the name each would be projected as, or why it would not."""
    spec = _server(config_path, server)
    with StdioClient(spec, timeout=timeout, guard=orphans.GUARD.watching) as client:
        projections = project_tools(server, client.list_tools(), LISTING_CONFIG)
        if as_json:
            # The server's words: a lone surrogate in them is shown as its escape's text.
            listing = _session(client) | {"tools": [p.to_json() for p in projections]}
            emit_json(jsontext.shown_as_text(listing))
            return
    for projection in projections:
        if projection.manifest is None:
            problem = printable(f"(not projectable: {projection.problem})")
            click.echo(f"{printable(shortened(projection.remote))}\t{problem}")
        else:
            # A remote server's words: never raw on the operator's terminal.
            click.echo(f"{projection.name}\t{printable(_first_line(projection.description))}")


@ctxmcp.command("project")
@_CONFIG
@click.option(
    "--runtime-config",
    required=True,
    help="The configuration's absolute path as agents will see it (the locator names it).",
)
@_SERVER
@click.option(
    "--out",
    required=True,
    type=NonEmptyPath(file_okay=False, path_type=Path),
    help="Directory for the candidates, SERVER.TOOL.manifest.json (made if missing).",
)
@click.option(
    "--replace",
    is_flag=True,
    help="Overwrite candidates already in OUT (each is reported as replaced); without it an "
    "earlier candidate of the same name refuses the projection (EEXIST).",
)
@_TIMEOUT
@storage_option
@json_option
@handles_errors
def project_command(
    config_path: Path,
    runtime_config: str,
    server: str,
    out: Path,
    replace: bool,
    timeout: float,
    storage_dir: Path | None,
    as_json: bool,
) -> None:
    """Write a manifest candidate for each of SERVER's tools into OUT.

    A candidate's mcp locator holds the transport (stdio), --runtime-config, the server and
    the tool; the configuration's command, arguments and environment are never copied.

    Tools whose projected name is illegal (R-3), that the server lists more than once
    (neither copy is written), or whose input schema is missing, not a valid JSON Schema,
    of a type that admits no arguments object, nested deeper than a manifest holds, holding
    a lone surrogate, or with a $ref or $id that does not resolve inside it, tools whose
    candidate would be larger than a manifest may be (1048576 bytes), and entries of the
    listing that are not tool objects are skipped and reported on stderr ('skipped' in
    --json), and the exit status is then 1; the others are written, all or none.  A
    description longer than 8192 characters is cut to fit, with a note on stderr ('notes'
    in --json).

    A listing past 1000 pages, a message nested deeper than 512 levels, or an answer to an
    id that was never asked is the server's protocol error (EPROTO).

    An OUT inside /ctx, inside any other 'ctx mount' or inside the storage root, whether or
    not that exists yet, is refused (EINVAL, exit 2) before the server starts and before
    anything is made: ctxmcp writes nothing there (M-1).

    A candidate already in OUT is never overwritten silently: the projection is refused
    with EEXIST before anything is written, unless --replace is given.

    \b
    Next:
      ctx object check OUT/SERVER.TOOL.manifest.json
      ctx object install --source STORAGE \\
          OUT/SERVER.TOOL.manifest.json --tier system
    """
    spec = _server(config_path, server)
    try:
        check_runtime_config(runtime_config)
        root = resolve_storage(storage_dir)
        check_out_directory(out, root)
    except CtxError as error:
        raise usage_problem(error) from None
    with StdioClient(spec, timeout=timeout, guard=orphans.GUARD.watching) as client:
        projections = project_tools(server, client.list_tools(), runtime_config)
        session = _session(client)
    # Checked again on the directory written through: the server ran meanwhile (M-1).
    written = write_candidates(projections, out, replace=replace, root=root)
    skipped = [p for p in projections if p.manifest is None]
    noted = [p for p in projections if p.manifest is not None and p.note]
    if as_json:
        emit_json(
            session
            | {
                "written": [str(entry.path) for entry in written],
                "replaced": [str(entry.path) for entry in written if entry.replaced],
                "skipped": [p.to_json() for p in skipped],
                "notes": [p.to_json() for p in noted],
            }
        )
    else:
        for entry in written:
            echo_printable(str(entry.path))
            if entry.replaced:
                echo_printable(f"ctxmcp: replaced {entry.path}", err=True)
        for projection in noted:
            echo_printable(f"ctxmcp: note: {projection.name}: {projection.note}", err=True)
        for projection in skipped:
            echo_printable(
                f"ctxmcp: skipped {shortened(projection.remote)}: {projection.problem}", err=True
            )
    if skipped:
        sys.exit(EXIT_REFUSED)  # written as asked, except what was skipped


def _server(config_path: Path, name: str) -> ServerSpec:
    """The configuration entry; a configuration or name that cannot be used is exit 2."""
    try:
        return load_server(config_path, name)
    except CtxError as error:
        raise usage_problem(error) from None


def _session(client: StdioClient) -> dict[str, object]:
    return {
        "server": client.spec.name,
        "protocolVersion": client.protocol_version,
        "serverInfo": client.server_info,
    }


def _first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""
