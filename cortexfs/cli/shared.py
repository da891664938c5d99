"""``ctx shared``: shared spaces (SPEC X-1)."""

from __future__ import annotations

import grp
from pathlib import Path

import click

from cortexfs.cli.common import (
    changed,
    echo_printable,
    emit_json,
    handles_errors,
    json_option,
    resolve_storage,
    storage_option,
    usage_problem,
)
from cortexfs.errors import CtxError, invalid
from cortexfs.names import decimal_value, is_decimal, shown_number
from cortexfs.shared.space_modes_check import space_modes_warning
from cortexfs.shared.spaces import check_space_name, create_shared_space


@click.group()
def shared() -> None:
    """Shared spaces: shared/<name>/ with tool/, data/, queue/ and agent/ (SPEC X-1)."""


@shared.command()
@click.argument("name")
@click.option("--group", help="The space's group (name or gid); default: your group.")
@storage_option
@json_option
@handles_errors
def create(name: str, group: str | None, storage_dir: Path | None, as_json: bool) -> None:
    """Create shared space NAME, or complete it where parts are missing.

    Its directories belong to the group and are setgid, so everything created inside
    belongs to the group and nobody else sees in: data/ and the queue's six directories
    group-writable (2770), the space, agent/ and queue/ also sticky (3770: members never
    rename or remove each other's entries), tool/ the owner's alone (2750: members run its
    tools, only the owner installs them).  Which agents
    may use it is then up to their uid/gid, mounts and policy (shared:NAME read|write).
    Without --group, parts that are missing are made with the group the space has (or,
    for a new space, yours), and existing parts are left as they are.  --group G given for
    a space that has another group (one 'ctx queue init' made, say) gives G every entry of
    the space that had its old group, never through a link; a file with other names (hard
    links, which may lie outside the space) keeps it, as does what lies more than 256
    directories deep, each listed as kept.  --group G also repairs each of the space's own
    directories (the space, tool/, data/, agent/, queue/ and the queue's six) whose group
    is not G or whose mode is not the one above ('repaired'), and gives each session
    directory (agent/AGENT/, its session/ and each session) the setgid and sticky bits it
    lacks, as an older version made them ('repaired  PATH (mode 2770 -> 3770)'), never
    through a link.  Root may regroup any entry (a root whose capability set lacks
    CAP_CHOWN or CAP_FSETID, or CAP_FOWNER for an existing space, is refused naming it,
    nothing made), anyone else only their own: EPERM, nothing changed; and a directory of
    the space that belongs to another uid than the space's owner is not repaired but refused (EPERM,
    naming it, nothing changed).  A missing tool/ or agent/ of an existing space is made
    only by its owner or root, never by another member, whose own it would be (EPERM,
    naming it, nothing made).  A directory this command makes is given its group and
    mode only when it is still the one it made (EEXIST otherwise).  An illegal NAME, or
    cortexfs-docs (the manual bundle), is a usage error (EINVAL, exit 2).  A run cut short
    (ENOSPC, EDQUOT, EMFILE, EROFS: exit 1) names what it made, which is kept; the same
    command run again, once that is fixed, completes the space.  Two runs at once take
    turns (a lock on shared/), so the second completes, or with another --group regroups,
    the space the first made; the space never keeps two groups.  A lock held for 10 s by
    another process is not waited for longer: the run goes on without it.
    """
    try:
        check_space_name(name)
    except CtxError as exc:  # an illegal or reserved name is a malformed command line
        raise usage_problem(exc) from None
    gid = None if group is None else _gid(group)
    report = create_shared_space(resolve_storage(storage_dir), name, gid=gid)
    changed(f"shared space {name} is complete ({report.path})")
    # Without --group what exists is kept as it is, and a mode it should have and lacks named.
    if gid is None and (warning := space_modes_warning(report.path)) is not None:
        echo_printable(f"ctx: warning: {warning}", err=True)
    if as_json:
        emit_json(report.to_json())
        return
    if report.regrouped_from is not None:
        echo_printable(
            f"regrouped {report.path}: group {report.regrouped_from} -> {report.gid} "
            f"({report.regrouped} entries)"
        )
    for kept in report.kept:
        echo_printable(
            f"kept      {kept['path']}: group {report.regrouped_from}, since {kept['reason']}"
        )
    for path in report.repaired:
        echo_printable(
            f"repaired  {path}: group {report.gid}, mode as the space's directories have"
        )
    for line in report.sessions_repaired:
        echo_printable(f"repaired  {line}")
    for path in report.created:
        echo_printable(f"created   {path}")
    if (
        not (report.created or report.repaired or report.sessions_repaired)
        and report.regrouped_from is None
    ):
        echo_printable(f"nothing to do: {report.path} is complete")


_NO_GID = 2**32 - 1  # (gid_t) -1: "leave the group as it is" to chown, never a group


def _gid(group: str) -> int:
    try:
        gid = decimal_value(group) if is_decimal(group) else grp.getgrnam(group).gr_gid
    except KeyError:
        raise usage_problem(invalid(f"no such group: {group!r}")) from None
    if gid is None or gid >= _NO_GID:
        raise usage_problem(
            invalid(f"{shown_number(group)} is not a group id (at most {_NO_GID - 1})")
        )
    return gid
