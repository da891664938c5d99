"""The ``ctx`` command line: a thin layer over the library (one module per command group)."""

from __future__ import annotations

from pathlib import Path

import click

from cortexfs.cli import agent as agent_commands
from cortexfs.cli import object as object_commands
from cortexfs.cli import policy as policy_commands
from cortexfs.cli import queue as queue_commands
from cortexfs.cli import run as run_commands
from cortexfs.cli import session as session_commands
from cortexfs.cli import shared as shared_commands
from cortexfs.cli import storage as storage_commands
from cortexfs.cli import work as work_commands


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--storage",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Storage root for every subcommand (default: $CTX_STORAGE, else the embedded default).",
)
@click.version_option(package_name="cortexfs")
@click.pass_context
def main(ctx: click.Context, storage: Path | None) -> None:
    """CortexFS: tools as files, a crash-safe shared job queue, policy v0.

    The storage root is chosen by --storage, else $CTX_STORAGE, else
    /var/lib/cortexfs/storage/current for root and
    $XDG_DATA_HOME/cortexfs/storage/current for other users.
    """
    ctx.obj = {"storage": storage}


main.add_command(storage_commands.bootstrap)
main.add_command(queue_commands.queue)
queue_commands.queue.add_command(work_commands.work)
main.add_command(policy_commands.policy)
main.add_command(object_commands.object_group)
main.add_command(run_commands.run)
main.add_command(agent_commands.agent)
main.add_command(session_commands.session)
main.add_command(shared_commands.shared)
