"""``ctx bootstrap``: create or repair a storage root (SPEC R-5)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

import cortexfs.bootstrap_steps  # every step bootstrap runs, registered on import
import cortexfs.manual
from cortexfs import storage
from cortexfs.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    changed,
    emit_json,
    for_this_storage,
    handles_errors,
    json_option,
    printable,
    resolve_storage,
    storage_option,
)
from cortexfs.cli.exits import usage_problem
from cortexfs.cli.params import NonEmptyPath
from cortexfs.errors import CtxError


@click.command()
@click.argument(
    "source", required=False, type=NonEmptyPath(exists=True, file_okay=False, path_type=Path)
)
@storage_option
@json_option
@handles_errors
def bootstrap(source: Path | None, storage_dir: Path | None, as_json: bool) -> None:
    """Create or repair the storage root: the root ABI and its core objects.

    Idempotent; never destroys user data.  Prints what was created or repaired, and every
    problem it left alone (something in the way that is not ours to remove, a full disk, a
    path too long), each naming its path; when there is one it ends with a
    'ctx: E<NAME>: ...' line on stderr (the first problem's errno) and exit 1, and a run
    after the cause is removed repairs the rest.  --json prints {"root", "created",
    "repaired", "problems", "warnings"}, and with a problem that line's "error", "errno"
    and "message" too.

    What it makes has the modes agents need whatever your umask: the root and its six
    directories 0755.  It never widens the mode of one that exists: when others may not
    read and search one of them, agents cannot use the root, and a 'warning' line names
    them and the chmod that opens them (exit 0).

    Home sessions an older version made readable by the agent's group (directories 0750,
    events.jsonl 0640) are tightened to 0700 and 0600, never through a link ('repaired',
    with the mode before and after); an entry there that is not the home owner's, or a file
    with several names (hard links), is left as it is and named in a warning.

    A shared space whose directories an older version made without the modes this one
    gives (queue/ and session directories not sticky) is named in a warning with the
    command that repairs it, 'ctx shared create NAME --group G'; nothing in it is changed.

    The entry agent/NAME that 'ctx agent create' wrote for another install of ctx, or for
    a root that is not this directory (a root moved or copied; this root through a link is
    this root), is rewritten to run this install on this root ('repaired agent/NAME'); a
    program of another shape there is left as it is.

    Installs interrupted in a tier are finished or discarded: tool/ first, then the core
    tools; a user's or a space's tier after them, waiting at most 10 s for its
    .install-lock (another process holding it longer is a problem naming its pid).

    A tool in tool/ that an administrator installed under a name that a later version
    made a core tool's (its origin names a manifest of theirs) is left as it is, and no
    core tool is installed there: a problem names it and what to do (reinstall it under
    another name, remove it, run bootstrap again).

    The manual bundle shared/cortexfs-docs/ (read with 'ctx man') is installed from the
    copy built into ctx, or from SOURCE/docs/spec/ when SOURCE, a CortexFS source tree of
    the matching version, is given; stale pages are replaced.  A SOURCE without the pages
    is refused (EINVAL, exit 2) before anything is changed, and so is the tree of another
    version: one whose pyproject.toml declares another version, or declares this one but
    holds other pages (each named).

    After installing a new ctx, run 'ctx bootstrap' on each storage root before starting
    workers or terminals (README, 'Upgrading').
    """
    root = resolve_storage(storage_dir)
    try:
        cortexfs.manual.check_source(source)
    except CtxError as error:
        raise usage_problem(error) from None
    report = storage.bootstrap(root, source)
    if report.created or report.repaired:
        changed(f"the storage root {root} was bootstrapped (running it again is safe)")
    # The commands its lines suggest act on the root this one was given (--storage).
    report.problems[:] = map(for_this_storage, report.problems)
    report.warnings[:] = map(for_this_storage, report.warnings)
    if as_json:
        # Problems left make the run's error, given as every --json error is (its errno word,
        # number and message) beside the report: a script reads why without parsing stderr.
        error = report.error()
        said = (
            {} if error is None else {**error.to_json(), "message": for_this_storage(error.message)}
        )
        emit_json({**report.to_json(), **said})
        _end(report)
    # Names below homes and spaces are their users' choice: escaped, they cannot drive the
    # administrator's terminal.
    click.echo(f"storage root: {printable(str(root))}")
    for path in report.created:
        click.echo(f"created   {printable(path)}")
    for path in report.repaired:
        click.echo(f"repaired  {printable(path)}")
    for problem in report.problems:
        click.echo(f"problem   {printable(problem)}")
    for warning in report.warnings:
        click.echo(f"warning   {printable(warning)}")
    if not (report.created or report.repaired or report.problems or report.warnings):
        click.echo("nothing to do: the storage root is complete")
    _end(report)


def _end(report: storage.BootstrapReport) -> None:
    """Exit 0, or, when problems were left, 1 after the ``ctx: E<NAME>: …`` line every
    refusal ends with (the first problem's errno), so a script sees why on stderr."""
    error = report.error()
    if error is None:
        sys.exit(EXIT_OK)
    sys.stdout.flush()
    click.echo(f"ctx: {printable(for_this_storage(str(error)))}", err=True)
    sys.exit(EXIT_REFUSED)
