"""The ``ctx`` command group: every command but a bare ``ctx run …`` starts here (click)."""

from __future__ import annotations

from pathlib import Path

import click

from cortexfs.cli.lazy import LazyGroup
from cortexfs.cli.params import NonEmptyPath

COMMANDS = {
    "bootstrap": "cortexfs.cli.storage:bootstrap",
    "queue": "cortexfs.cli.queue:queue",
    "policy": "cortexfs.cli.policy:policy",
    "object": "cortexfs.cli.object:object_group",
    "agent": "cortexfs.cli.agent:agent",
    "session": "cortexfs.cli.session:session",
    "shared": "cortexfs.cli.shared:shared",
    "man": "cortexfs.cli.man:man",
    "tool": "cortexfs.cli.tool:tool",
    "mount": "cortexfs.cli.mount:mount",
    "umount": "cortexfs.cli.mount:umount",
}


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--storage",
    type=NonEmptyPath(file_okay=False, path_type=Path),
    default=None,
    help="Storage root for every subcommand (default: $CTX_STORAGE, else the embedded default).",
)
@click.version_option(package_name="cortexfs")
@click.pass_context
def main(ctx: click.Context, storage: Path | None) -> None:
    """CortexFS: tools as files, a crash-safe shared job queue, policy v0.

    The storage root is chosen by --storage, else $CTX_STORAGE, else
    /var/lib/cortexfs/storage/current for root and
    $XDG_DATA_HOME/cortexfs/storage/current for other users.  --storage may be
    given here or after the command; given both ways, it must name the same root
    (else EINVAL, exit 2).
    """
    ctx.obj = {"storage": storage}
    from cortexfs.locks import WAITING_NOTICE
    from cortexfs.printable import printable

    WAITING_NOTICE.set(lambda notice: click.echo(f"{ctx.info_name}: {printable(notice)}", err=True))


@main.command(
    "run",
    add_help_option=False,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
    short_help="Run TOOL as AGENT through the whole authority chain.",
)
@click.argument("argv", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run(ctx: click.Context, argv: tuple[str, ...]) -> None:
    """Run TOOL as AGENT (see ``ctx run --help``); its own parser reads the arguments."""
    from cortexfs.cli.run import main as run_main

    ctx.exit(run_main(list(argv), storage_dir=ctx.find_root().obj["storage"]))
