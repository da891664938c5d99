"""``ctx bootstrap``: create or repair a storage root (SPEC R-5)."""

from __future__ import annotations

from pathlib import Path

import click

# The layers that add bootstrap steps register them when imported; this command is where they
# are composed (the core tools and tool/tsh.d/config, R-5).
import cortexfs.tools.core.bootstrap  # noqa: F401
from cortexfs import storage
from cortexfs.cli.common import (
    emit_json,
    handles_errors,
    json_option,
    resolve_storage,
    storage_option,
)


@click.command()
@click.argument("source", required=False, type=click.Path(path_type=Path))
@storage_option
@json_option
@handles_errors
def bootstrap(source: Path | None, storage_dir: Path | None, as_json: bool) -> None:
    """Create or repair the storage root: the root ABI and its core objects.

    Idempotent; never destroys user data.  SOURCE optionally names a source tree whose
    docs bundle is installed.  Prints what was created or repaired.
    """
    root = resolve_storage(storage_dir)
    report = storage.bootstrap(root, source)
    if as_json:
        emit_json(report.to_json())
        return
    click.echo(f"storage root: {root}")
    for path in report.created:
        click.echo(f"created   {path}")
    for path in report.repaired:
        click.echo(f"repaired  {path}")
    for problem in report.problems:
        click.echo(f"problem   {problem}")
    if not (report.created or report.repaired or report.problems):
        click.echo("nothing to do: the storage root is complete")
