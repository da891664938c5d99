"""Tiers and the tool lifecycle: install, list, repair (SPEC T-8, T-8a, R-4, X-1).

========================  ================================  ==================================
tier                      directory (under the root)        who it is for
========================  ================================  ==================================
``system``                ``tool/``                         everyone (the default CTX_PATH)
``user``                  ``home/<uid>/tool/``              the installing user (R-4)
``shared:<name>``         ``shared/<name>/tool/``           a shared space's members (X-1)
========================  ================================  ==================================

An install writes the manifest's controls (``name``, ``description``, ``schema``, ``cap``,
``program``, ``mcp``, ``origin``) and the program as the executable, atomically
(:mod:`cortexfs.tools.pairs`).  It grants nothing: a new tool's ``policy`` holds no rule, and a
reinstall keeps the previous version's policy, status, log and hooks exactly as they were.
A new tool's log that root makes in a storage root another uid owns is that uid's (mode 0640
and group kept): the storage root's owner records every call it runs there (T-7).
A reinstall replaces only what an install wrote: a directory where the executable belongs, a
file where the control directory belongs, and the like, are refused (EISDIR, ENOTDIR, EEXIST)
with nothing changed (:func:`tool_obstacles`).
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cortexfs import beneath, durable, storage
from cortexfs.absolute_paths import absolute
from cortexfs.bootstrap_repair import storage_owner
from cortexfs.errors import CtxError, exists, invalid, not_found, too_big
from cortexfs.names import check_object_name, is_object_name
from cortexfs.shared.tree import ensure_directories, ensure_home, user_ownership
from cortexfs.timefmt import rfc3339
from cortexfs.tools.commit_marker import read_one_version
from cortexfs.tools.controls import (
    HOOK_DIRS,
    STATUS_AVAILABLE,
    STATUS_DISABLED,
    STATUS_UNAVAILABLE,
    ControlRefused,
    ToolObject,
    program_problem,
    read_control,
    read_controls,
    readable_layout_problems,
)
from cortexfs.tools.core import BOOTSTRAP_TOOLS
from cortexfs.tools.manifest import Manifest, oversized_controls
from cortexfs.tools.pair_layout import Obstacle, PairKind, obstacles
from cortexfs.tools.pairs import install_pair, repair_staged

POLICY_TEMPLATE = (
    b"# This tool's own policy v0, the second layer of SPEC P-6.  A call needs\n"
    b"#     allow <label> tool:<name> execute\n"
    b"# here and in the calling agent's policy.  Installing granted nothing.\n"
)
TOOL_KIND = PairKind(
    defined=frozenset({"name", "description", "schema", "cap", "program", "mcp", "origin"}),
    defaults={"policy": POLICY_TEMPLATE, "status": f"{STATUS_AVAILABLE}\n".encode(), "log": b""},
    directories=HOOK_DIRS[1:],
    modes={"log": 0o640},
    host_written=frozenset({"log"}),  # T-7: every call is recorded there, by the caller
)


@dataclass(frozen=True)
class Tier:
    """A directory tools are installed into; ``location`` is relative to the storage root."""

    name: str
    root: Path
    location: str

    @property
    def directory(self) -> Path:
        return self.root / self.location

    def tool(self, name: str) -> ToolObject:
        return ToolObject(name, self.directory)

    def reached_without_links(self) -> bool:
        """Whether every directory from the storage root down to this tier's is a directory
        and none a symbolic link: ``shared``, a space or a home is a place others may change,
        and a link there would lead bootstrap's repairs of the tier outside the root (R-5)."""
        location = PurePosixPath(self.location)
        try:  # the root itself may be reached through a link
            walked = beneath.walk(Path(os.path.realpath(self.root)), location)
        except OSError:
            return False
        return len(walked) == len(location.parts) + 1 and walked[-1].is_directory


@dataclass(frozen=True)
class Installed:
    name: str
    tier: str
    path: Path
    replaced: bool
    # The control directory was there without its executable (a removal done half, or a
    # damaged tool): its local state was taken as a reinstall takes it, policy included.
    took_leftover_controls: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "tier": self.tier,
            "path": str(self.path),
            "replaced": self.replaced,
            "took_leftover_controls": self.took_leftover_controls,
        }


STATUS_DAMAGED = "damaged"
# What a lister that may not read a control of the tool says: not damage, since a call runs
# with other rights (root's runner), and whether it meets the tool available is not for the
# lister to tell.
STATUS_UNKNOWN = "unknown"


@dataclass(frozen=True)
class Listing:
    """One installed tool as ``ctx object list`` shows it.

    ``status`` is what a call would meet: ``damaged`` (a control missing or malformed, see
    ``problems``), else the status control's word (``available``, ``disabled``,
    ``unavailable``), except that a ``program`` control failing C-2 makes it ``unavailable``
    whatever the control says.  ``reason`` is the text after ``unavailable:`` (the C-2 reason,
    or the administrator's).  ``unknown`` when the lister may not read a control: ``reason``
    names it and who may read it."""

    name: str
    tier: str
    path: Path
    status: str
    reason: str
    description: str
    problems: list[str]

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "tier": self.tier,
            "path": str(self.path),
            "status": self.status,
            "reason": self.reason,
            "description": self.description,
            "problems": self.problems,
        }


def parse_tier(root: Path, text: str, *, uid: int | None = None) -> Tier:
    """``system``, ``user`` (the caller's home, or ``uid``'s) or ``shared:<name>``; else EINVAL."""
    if text == "system":
        return Tier("system", root, "tool")
    if text == "user":
        owner = os.getuid() if uid is None else uid
        return Tier("user", root, f"home/{owner}/tool")
    kind, colon, space = text.partition(":")
    if kind == "shared" and colon:
        check_object_name(space, "shared space")
        if space == storage.DOCS_BUNDLE:
            raise invalid(f"shared/{space} is the manual bundle (X-2), not a shared space")
        return Tier(text, root, f"shared/{space}/tool")
    raise invalid(f"unknown tier {text!r}; use system, user or shared:<name>")


def all_tiers(root: Path, uid: int, unlisted: list[Path] | None = None) -> list[Tier]:
    """The system tier, ``uid``'s user tier and every shared space's tier, in that order.

    ``shared/`` that the caller may search but not list (mode 0711) hides which spaces there
    are: with ``unlisted`` given, it is noted there and the other tiers are returned (a
    listing leaves the spaces out, saying so); without, PermissionError."""
    tiers = [parse_tier(root, "system"), parse_tier(root, "user", uid=uid)]
    try:
        spaces = sorted(os.listdir(root / "shared"))
    except (FileNotFoundError, NotADirectoryError):
        spaces = []
    except PermissionError:
        if unlisted is None:
            raise
        unlisted.append(root / "shared")
        spaces = []
    tiers += [
        parse_tier(root, f"shared:{space}")
        for space in spaces
        if is_object_name(space) and space != storage.DOCS_BUNDLE
    ]
    return tiers


def install_manifest(
    root: Path, manifest: Manifest, tier: Tier, *, ops: durable.FsOps | None = None
) -> Installed:
    """``ctx object install``: the manifest's tool, into ``tier``, replacing an older version.

    A core tool's name is refused in the system tier (EEXIST, nothing changed): bootstrap
    keeps its own version there and would put it back.  An MCP-backed tool's executable is
    the bridge built into ctx, which calls the tool its ``mcp`` control locates
    (:mod:`cortexfs.tools.core.mcp_bridge`)."""
    if tier.name == "system" and manifest.name in BOOTSTRAP_TOOLS:
        raise exists(
            f"{manifest.name} is a core tool, maintained by 'ctx bootstrap', which would put "
            "its own version back over another; install yours under another name"
        )
    if manifest.mcp is not None:
        from cortexfs.tools.core import launcher  # renders programs: only this case needs it

        program, _ = launcher.program("mcp_bridge")
        return install_tool(tier, manifest, program, ops=ops)
    return install_tool(tier, manifest, manifest.read_program(), ops=ops)


def _where(source: Path) -> str:
    """Where the manifest was, as ``origin`` records it: its path made absolute (read later,
    from anywhere, ``manifest.json`` would name nothing), or as given when the current
    directory is gone."""
    try:
        return absolute(source)
    except OSError:
        return str(source)


def install_tool(
    tier: Tier,
    manifest: Manifest,
    program: bytes,
    *,
    ops: durable.FsOps | None = None,
    unless_current: Callable[[], bool] | None = None,
) -> Installed | None:
    """Install ``program`` as the executable of ``manifest``'s tool in ``tier``; None when
    ``unless_current``, asked under the tier's lock, finds it installed already
    (:func:`~cortexfs.tools.pairs.install_pair`)."""
    ops = ops or durable.default_ops()
    _ensure_tier(tier, ops)
    origin = {
        "manifest": _where(manifest.source),
        "installed": rfc3339(),
        "uid": os.getuid(),
        "sha256": hashlib.sha256(program).hexdigest(),
    }
    controls = manifest.controls()
    controls["origin"] = (json.dumps(origin, indent=2) + "\n").encode()
    oversized = oversized_controls(controls)
    if oversized:  # refused now rather than installed as a tool found damaged
        raise too_big(f"{manifest.source}: {oversized[0]}")
    leftover: list[bool] = []

    def note_leftover_controls() -> None:  # under the tier's lock: what the install meets
        entry = tier.directory / manifest.name
        leftover.append(
            not os.path.lexists(entry) and (tier.directory / f"{entry.name}.d").is_dir()
        )

    replaced = install_pair(
        tier.directory,
        manifest.name,
        TOOL_KIND,
        entry=program,
        controls=controls,
        replace=True,
        ops=ops,
        settled_by="running the same command again, or 'ctx bootstrap',",
        host=storage_owner(tier.root),
        unless_current=unless_current,
        refuse_under_lock=note_leftover_controls,
        root=tier.root,
    )
    if replaced is None:
        return None
    path = tier.directory / manifest.name
    return Installed(manifest.name, tier.name, path, replaced, any(leftover))


def tool_obstacles(tier: Tier, name: str) -> list[Obstacle]:
    """What stands in ``tier`` where an install of ``name`` would write and is not ours."""
    return obstacles(tier.directory, name, TOOL_KIND)


def list_tools(tiers: list[Tier], unreadable: list[Tier] | None = None) -> list[Listing]:
    """Every installed tool of ``tiers`` (hidden staging names and strays are not tools);
    the tiers this process may not list go to ``unreadable``."""
    found = []
    for tier in tiers:
        try:
            names = sorted(os.listdir(tier.directory))
        except PermissionError:
            if unreadable is not None:
                unreadable.append(tier)
            continue
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            if not is_object_name(name) or not os.path.isfile(tier.directory / name):
                continue
            found.append(_listing(tier, tier.tool(name)))
    return found


def _listing(tier: Tier, tool: ToolObject) -> Listing:
    """``tool`` as a call would meet it: its controls read as one whole version, as the runner
    reads them (:func:`~cortexfs.tools.commit_marker.read_one_version`), so that a reinstall
    between two swaps is waited out rather than listed."""
    try:
        return read_one_version(tier.directory, tool.name, lambda: _steady_listing(tier, tool))
    except CtxError as exc:
        if exc.errno != errno.EAGAIN:
            raise
        # Every call refuses it (EAGAIN) until the install ends or bootstrap finishes it;
        # its description is of one version or the other.
        listing = _steady_listing(tier, tool)
        return dataclasses.replace(listing, status=STATUS_UNAVAILABLE, reason=exc.message)


def _steady_listing(tier: Tier, tool: ToolObject) -> Listing:
    try:
        description = (read_control(tool, "description") or b"").decode("utf-8", "replace")
    except CtxError:  # a damaged control directory: layout_problems says what is wrong
        description = ""
    summary = description.strip().splitlines()[0] if description.strip() else ""
    try:
        problems = readable_layout_problems(tool)
        if problems:
            status, reason = STATUS_DAMAGED, ""
        else:
            status, reason = _status_and_reason(read_controls(tool).status)
            if program_problem(tool):
                problems = [f"{tool.name}.d/program: {reason}"]
    except ControlRefused as refusal:
        status, reason, problems = STATUS_UNKNOWN, refusal.message, []
    return Listing(tool.name, tier.name, tool.executable, status, reason, summary, problems)


def _status_and_reason(text: str) -> tuple[str, str]:
    """The status column for a status control reading ``text``: what a call would meet.

    Only ``available`` itself lets a call through (``require_available``); text that is none
    of the three settings (``Available``, ``available: x``, an empty control) refuses calls
    too, so it is listed as ``unavailable``, the reason quoting it."""
    word, _, reason = text.partition(":")
    word, reason = word.strip(), reason.strip()
    if text == STATUS_AVAILABLE or word in (STATUS_DISABLED, STATUS_UNAVAILABLE):
        return word, reason
    return STATUS_UNAVAILABLE, (
        f"the status control reads {text!r}, which is not {STATUS_AVAILABLE}, "
        f"{STATUS_DISABLED} or {STATUS_UNAVAILABLE}: <reason>"
    )


def repair_tier(
    tier: Tier, ops: durable.FsOps | None = None, *, wait: float | None = None
) -> list[str]:
    """Finish or discard interrupted installs in ``tier`` (for ``ctx bootstrap``); run as
    root, give the storage root's owner each tool log root has there, so that the calls that
    owner runs can be recorded (T-7, :func:`cortexfs.tools.pairs.repair_staged`).  ``wait``:
    at most that many seconds for the tier's lock (EAGAIN, naming the holder), else no limit."""
    if not tier.reached_without_links():
        return []  # nothing of it is the root's to repair: the root's step says what is there
    return repair_staged(
        tier.directory, TOOL_KIND, ops, host=storage_owner(tier.root), wait=wait, root=tier.root
    )


def require_tier(tier: Tier) -> None:
    """ENOENT, with the fix, when the storage root or the directory of a system or shared
    tier does not exist.  A user tier is made by the first install into it: before that it
    simply holds no tool."""
    storage.require_root(tier.root)
    if tier.name == "user" and not (tier.root / "home").is_dir():
        # The homes are the root's: a root without them was never bootstrapped.
        raise not_found(
            f"tier user has no {tier.root / 'home'}: {tier.root} is no storage root (or a "
            "damaged one); run 'ctx bootstrap'"
        )
    if tier.name != "user" and not tier.directory.is_dir():
        space = tier.location.split("/")[1] if tier.name != "system" else None
        fix = f"create it with 'ctx shared create {space}'" if space else "run 'ctx bootstrap'"
        if os.path.lexists(tier.directory) and not os.path.islink(tier.directory):
            # A file in the way: the command that makes the directory would refuse it too.
            raise CtxError(
                errno.ENOTDIR,
                f"tier {tier.name}: {tier.directory} is not a directory; move it aside, then "
                f"{fix.replace('create it with', 'create the directory with')}",
            )
        raise not_found(f"tier {tier.name} has no directory {tier.directory}; {fix}")


def _require_writable_tier(tier: Tier) -> None:
    """EACCES, saying who may write there and what to do, before anything of the install is
    made: the tier's directory, or where a user tier's missing directories would be made."""
    action = f"install into tier {tier.name}"
    directory = tier.directory
    while not directory.is_dir() and directory != tier.root:
        directory = directory.parent
    if tier.name == "user" and directory == tier.root / "home":
        home = tier.directory.parent
        fix = (
            f"ask an administrator to create {home} owned by you (install -d -o "
            f"{os.geteuid()} -g {os.getegid()} -m 0755 {home}), or {storage.use_own_root()}"
        )
        storage.require_writable(directory, action, fix)
    else:
        storage.require_writable(directory, action)


def _ensure_tier(tier: Tier, ops: durable.FsOps) -> None:
    require_tier(tier)
    if tier.name != "user" and not tier.reached_without_links():
        # A space is its owner's to change: a link put at shared/<space> would lead the
        # install (as root, too) out of the storage root.
        raise CtxError(
            errno.ELOOP,
            f"tier {tier.name} is not reached without a symbolic link from the storage root "
            f"{tier.root} ({tier.location} runs through one, or through something not a "
            "directory): an install never follows one; make it a directory of the root "
            "again ('ctx bootstrap' says what is there)",
        )
    _require_writable_tier(tier)
    if tier.name == "user":
        owner = user_ownership(int(tier.location.split("/")[1]))
        home = ensure_home(ops, tier.root, owner)
        ensure_directories(ops, home, ["tool"], mode=0o755, owner=owner)
