"""``ctx object``: check and install v2 manifests, resolve and list tools (SPEC T-8, T-8a, T-4)."""

from __future__ import annotations

import os
import sys
from errno import errorcode
from pathlib import Path
from typing import Any

import click

from cortexfs.cli.columns import table
from cortexfs.cli.common import (
    EXIT_OK,
    EXIT_REFUSED,
    changed,
    echo_printable,
    emit_json,
    fail_with_problems,
    handles_errors,
    json_option,
    object_name_argument,
    resolve_storage,
    storage_option,
    usage_problem,
)
from cortexfs.cli.params import NonEmptyPath
from cortexfs.errors import CtxError, invalid
from cortexfs.tools.ctxpath import which_on_user_path
from cortexfs.tools.install import (
    Tier,
    all_tiers,
    install_manifest,
    list_tools,
    parse_tier,
    require_tier,
)
from cortexfs.tools.manifest import ManifestError, load_manifest, names_a_directory


class _ManifestPath(NonEmptyPath):
    """A MANIFEST argument: a Path, but for a name ending in ``/`` (or ``/.``), kept as the
    text given: the kernel takes it for a directory's (ENOTDIR for a file), and
    :func:`~cortexfs.tools.manifest.load_manifest` refuses it so, where a Path, dropping the
    slash, would name the file before it."""

    def __init__(self) -> None:
        super().__init__(path_type=Path)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = super().convert(value, param, ctx)
        return value if isinstance(value, str) and names_a_directory(value) else path


@click.group("object")
def object_group() -> None:
    """Tool objects: check and install v2 manifests, resolve names, list what is installed.

    \b
    A v2 manifest is one JSON object:
      {"manifest": 2, "kind": "tool", "name": "fs.read", "description": "...",
       "schema": {...input JSON Schema...},
       "cap": {"side_effects": false, "network": false},
       "exec": "path/to/program"}
    ("mcp": {...} in place of "exec" for an MCP tool; "program": {...} optional).

    cap is any JSON object of declared facts; side_effects and network, when present, are
    booleans, and one left out counts as true (the cautious value).  Installing grants
    nothing: a tool runs only when both the agent's and the tool's own policy allow it.  See
    docs/tools.md.
    """


@object_group.command()
@click.argument("manifests", nargs=-1, required=True, type=_ManifestPath())
@json_option
def check(manifests: tuple[Path | str, ...], as_json: bool) -> None:
    """Validate MANIFEST files (SPEC T-8).

    Exit 0 when every manifest is valid.  Otherwise exit 1 and print every reason, one line
    each, on standard error as  MANIFEST: EINVAL: <reason>  (ELOOP: the program is reached
    through a symbolic link; EACCES: another uid's manifest names a program outside its
    directory, or one that uid could not read).  The manifest and its program must be regular
    files; a relative exec is reached without following links.  See docs/tools.md.
    """
    reports = []
    for path in manifests:
        # One shape for every manifest, so that a script can read any entry's problems.
        report: dict[str, Any] = {
            "manifest": str(path), "valid": False, "name": None, "problems": [], "codes": [],
            "error": None,
        }  # fmt: skip
        try:
            manifest = load_manifest(path)
        except ManifestError as exc:
            report["problems"] = exc.problems
            report["codes"] = [errorcode.get(code, f"E{code}") for code in exc.codes]
        except CtxError as exc:  # unreadable: its own errno, not EINVAL
            report["error"] = exc.to_json()
            echo_printable(f"{path}: {exc}", err=True)
        else:
            report.update(valid=True, name=manifest.name)
        reports.append(report)
    for report in reports:
        for problem, code in zip(report["problems"], report["codes"], strict=True):
            echo_printable(f"{report['manifest']}: {code}: {problem}", err=True)
    if as_json:
        emit_json(reports)
    else:
        for report in reports:
            if report["valid"]:
                echo_printable(f"{report['manifest']}: valid ({report['name']})")
    sys.exit(EXIT_OK if all(report["valid"] for report in reports) else EXIT_REFUSED)


@object_group.command()
@click.argument("manifest", type=_ManifestPath())
@click.option(
    "--tier",
    required=True,
    metavar="TIER",
    help="system (tool/), user (home/<uid>/tool/) or shared:<name> (shared/<name>/tool/).",
)
@click.option(
    "--source",
    "source_dir",
    type=NonEmptyPath(file_okay=False, path_type=Path),
    help="The storage root to install into (same as --storage).",
)
@storage_option
@json_option
@handles_errors
def install(
    manifest: Path | str,
    tier: str,
    source_dir: Path | None,
    storage_dir: Path | None,
    as_json: bool,
) -> None:
    """Install MANIFEST's tool into a tier of the storage root (SPEC T-8).

    The executable and its complete control directory appear together; a reinstall replaces
    the previous version atomically and keeps its policy, status, log and hooks.  Installing
    grants no agent any permission.  An install that fails (ENOSPC, EMFILE: exit 1) has
    installed nothing and left nothing; free what ran out and run the same command again.

    The names of the core tools and tsh are refused in the system tier (EEXIST, exit 1):
    'ctx bootstrap' maintains them there and would put its own version back.

    --source names the storage root as --storage does (before or after 'object'): naming two
    different roots is a usage error (EINVAL, exit 2).  $CTX_STORAGE is only the default, which
    --source overrides.
    """
    _refuse_two_roots(source_dir, storage_dir)
    root = resolve_storage(source_dir or storage_dir)
    target = _tier_option(root, tier)
    try:
        loaded = load_manifest(manifest)
    except ManifestError as exc:
        fail_with_problems(manifest, exc, exc.problems, as_json)
    installed = install_manifest(root, loaded, target)
    changed(f"{installed.name} was installed in tier {installed.tier} (do not install it again)")
    if installed.took_leftover_controls:
        # Said on stderr in either mode: the rules of a policy written for a program removed
        # since now apply to this one, which only its administrator can judge.
        echo_printable(
            f"ctx: warning: {installed.path}.d was there without its executable (a removal "
            "done half, or a damaged tool): its policy, status, hooks and log were kept, as a "
            "reinstall keeps them, and its policy's rules apply to this program; to install it "
            f"as a new tool, remove {installed.path}.d and install again",
            err=True,
        )
    if as_json:
        emit_json(installed.to_json())
    else:
        verb = "replaced" if installed.replaced else "installed"
        echo_printable(f"{verb} {installed.name} in tier {installed.tier}: {installed.path}")


def _refuse_two_roots(source_dir: Path | None, storage_dir: Path | None) -> None:
    """EINVAL (a usage error) when --source and a --storage, the subcommand's or ctx's own,
    name two storage roots: which one the install is meant for cannot be told.  T-8 spells the
    root --source, every other command --storage; the same root given both ways is fine."""
    if source_dir is None:
        return
    given = [("--storage", storage_dir), ("ctx --storage", _group_storage())]
    for option, other in given:
        if other is not None and os.path.realpath(source_dir) != os.path.realpath(other):
            raise usage_problem(
                invalid(
                    f"--source {source_dir} and {option} {other} name two storage roots; "
                    "give one of them"
                )
            )


def _group_storage() -> Path | None:
    """``ctx --storage DIR``, given before the command group, if it was."""
    ctx = click.get_current_context(silent=True)
    root_ctx = ctx.find_root() if ctx else None
    return root_ctx.obj.get("storage") if root_ctx is not None and root_ctx.obj else None


def _tier_option(root: Path, text: str) -> Tier:
    """``--tier``: a malformed one is a usage error (EINVAL, exit 2)."""
    try:
        return parse_tier(root, text)
    except CtxError as exc:
        raise usage_problem(exc) from None


@object_group.command("which")
@click.argument("name")
@storage_option
@json_option
@handles_errors
def which_command(name: str, storage_dir: Path | None, as_json: bool) -> None:
    """Print the path CTX_PATH resolves NAME to; exit 1 when there is none (SPEC T-8a).

    The search path is CTX_PATH= from $CTX_HOME/.tshrc, else $CTX_PATH, else
    /ctx/tool:/ctx/home/<uid>/tool (/ctx maps onto the storage root when not mounted).
    Only regular files with an execute bit count (whose bit it is does not matter: whether an
    agent may run the file is step 2 of the authority chain, see ctx policy explain); --json
    also lists what was skipped and why.
    """
    name = object_name_argument(name, "tool")
    root = resolve_storage(storage_dir)
    found, path = which_on_user_path(root, name, uid=os.getuid(), environ=os.environ)
    if as_json:
        emit_json({**found.to_json(), "search_path": path.to_json()})
    else:
        echo_printable(str(found.executable))


@object_group.command("list")
@click.option("--tier", metavar="TIER", help="Only this tier: system, user or shared:<name>.")
@storage_option
@json_option
@handles_errors
def list_command(tier: str | None, storage_dir: Path | None, as_json: bool) -> None:
    """List installed tools: name, tier, status and description (SPEC T-8a).

    ENOENT (exit 1) when the storage root, or the tier named with --tier (a shared space, the
    system tier), does not exist; a malformed --tier is a usage error (EINVAL, exit 2).

    Without --tier: the system tier, your user tier and every shared space's tier; a tier you
    may not list is left out with a note on stderr (a space of a group you are not in).  The status
    is what a call would meet: available, disabled, unavailable (with its reason: a status
    control reading none of its settings is quoted; a malformed program control makes a tool
    unavailable, SPEC C-2), damaged (a control of its layout missing or malformed; see
    --json's problems) or unknown (a control you may not read, named in its reason: a call
    reads it with the runner's rights).  Who may run it is not listed: the tool's own policy
    is judged with the agent's at each call (ctx policy explain AGENT tool:NAME execute).
    """
    root = resolve_storage(storage_dir)
    spaces_unlisted: list[Path] = []
    tiers = (
        [_tier_option(root, tier)]
        if tier is not None
        else all_tiers(root, os.getuid(), spaces_unlisted)
    )
    require_tier(tiers[0])  # a missing root or named tier is ENOENT, not an empty listing
    for shared in spaces_unlisted:
        echo_printable(
            f"ctx: note: {shared} cannot be listed by uid {os.getuid()} (Permission denied), "
            "so the tiers of its spaces are left out: name one with --tier shared:NAME",
            err=True,
        )
    unreadable: list[Tier] = []
    listings = list_tools(tiers, unreadable)
    for tier in unreadable:  # a listing that leaves a tier out unsaid would read as complete
        echo_printable(
            f"ctx: note: tier {tier.name} ({tier.directory}) cannot be listed by uid "
            f"{os.getuid()} (Permission denied): its tools are left out",
            err=True,
        )
    if as_json:
        emit_json([listing.to_json() for listing in listings])
        return
    rows = [
        [
            listing.name,
            listing.tier,
            listing.status,
            listing.description + (f"  ({listing.reason})" if listing.reason else ""),
        ]
        for listing in listings
    ]
    for line in table(rows):
        echo_printable(line)
