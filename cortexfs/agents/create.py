"""``ctx agent create``: an agent as an ordinary ``agent/<name>`` entry and its controls (A-3).

::

    agent/<name>                     the executable entry: runs ``ctx agent start <name>``
    agent/<name>.d/label             its subject type, one line (policy v0)
    agent/<name>.d/policy            the rules generated from the request (P-1, P-7)
    agent/<name>.d/identity          {"uid": N, "gid": N, "groups": [N, ...]}
    agent/<name>.d/mount             [[source, target, "ro"|"rw"], ...], with /ctx
    agent/<name>.d/model             one model name per line
    agent/<name>.d/system.md         its system prompt (grants nothing, P-6)
    agent/<name>.d/prompt.template.md
    agent/<name>.d/log               the agent's own log (S-3): :mod:`cortexfs.agents.log`

Only the host administrator — root or the owner of the storage root — creates agents, and
the controls belong to them: the agent's uid must not be able to rewrite a grant (step 4 of the
authority chain checks that on every decision).  The log is the one control given to the
storage root's owner when root creates the agent in a root another uid owns: the host records
in it while the agent is used, and may be that owner (:mod:`cortexfs.tools.pairs`).

The identity defaults to the creating user, except that an agent never runs as root (P-5
step 1): root's default is the unprivileged user :data:`ROOT_DEFAULT_USER` (``nobody``), and
an identity with uid 0 is refused.  No new root
namespace is created; the pair appears atomically (:mod:`cortexfs.tools.pairs`), and an
existing agent is never overwritten (EEXIST).
"""

from __future__ import annotations

import errno
import json
import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cortexfs import durable, storage
from cortexfs.agents import log as agent_log
from cortexfs.agents.entries import agents_directory, entry_program
from cortexfs.agents.host import require_host_administrator
from cortexfs.agents.request import AgentRequest
from cortexfs.bootstrap_repair import storage_owner
from cortexfs.errors import CtxError, describe, exists, invalid
from cortexfs.names import is_object_name
from cortexfs.policy import Identity
from cortexfs.policy.controls import parse_identity, read_label
from cortexfs.policy.linux import closed_directory, unsearchable, writable_entries
from cortexfs.policy.mounts import CTX_TARGET, Mount, views_of
from cortexfs.shared.events import encode_event, make_event
from cortexfs.tools.pair_layout import PairKind
from cortexfs.tools.pairs import install_pair

CONTROLS = (
    "label",
    "policy",
    "identity",
    "mount",
    "model",
    "system.md",
    "prompt.template.md",
)
# Root creating an agent without naming a user gets this one: unprivileged by definition.
ROOT_DEFAULT_USER = "nobody"
# The host records in the agent's log while the agent is used (cortexfs.agents.log).
AGENT_KIND = PairKind(
    defined=frozenset(CONTROLS),
    defaults={"log": b""},
    modes={"log": 0o640},
    host_written=frozenset({"log"}),
)


@dataclass(frozen=True)
class CreatedAgent:
    name: str
    entry: Path
    controls: Path
    identity: Identity
    default_user: str | None = None  # the user chosen because none was named, if any
    warnings: tuple[str, ...] = ()  # what may not work as the request meant (see warnings_for)

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "entry": str(self.entry),
            "controls": str(self.controls),
            "identity": identity_json(self.identity),
            "default_user": self.default_user,
            "warnings": list(self.warnings),
        }


def identity_json(identity: Identity) -> dict[str, object]:
    return {"uid": identity.uid, "gid": identity.gid, "groups": sorted(identity.groups)}


def default_identity() -> tuple[Identity, str | None]:
    """The identity an agent gets when none is named, and the user name it was chosen by.

    The creating user's own; for root, :data:`ROOT_DEFAULT_USER` from the password database,
    since an agent never runs as root (P-5 step 1).  EINVAL when root has no such user.
    """
    if os.geteuid() != 0:
        return Identity(os.geteuid(), os.getegid(), frozenset(os.getgroups())), None
    try:
        entry = pwd.getpwnam(ROOT_DEFAULT_USER)
    except KeyError:
        entry = None
    if entry is None or entry.pw_uid == 0:
        raise invalid(
            "an agent never runs as root (SPEC P-5 step 1) and this host has no unprivileged "
            f"user {ROOT_DEFAULT_USER!r} to default to; give it a user with --user"
        )
    groups = frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))
    return Identity(entry.pw_uid, entry.pw_gid, groups), entry.pw_name


def create_agent(
    root: Path,
    request: AgentRequest,
    identity: Identity | None = None,
    *,
    parent: str | None = None,
    session: str = "",
    default_user: str | None = None,
    refuse_under_lock: Callable[[], None] | None = None,
    ops: durable.FsOps | None = None,
) -> CreatedAgent:
    """Create ``request``'s agent in ``root``; EEXIST when it exists, EACCES for non-admins.

    ``identity`` None means :func:`default_identity`; an identity with uid 0 is EINVAL.
    ``default_user`` names the user a given identity was defaulted to (root's, under another
    group), which the result reports as when ``identity`` is None.  ``refuse_under_lock``
    raises the refusal of a creation that another one made meanwhile wrong, judged under
    ``agent/``'s install lock (:func:`~cortexfs.tools.pairs.install_pair`).  The
    creation is recorded in the agent's log and, for a child made by agent ``parent`` (A-4)
    during a call in ``session``, in the parent's log too.  The result carries the same
    :func:`warnings_for` either way: ``ctx agent create`` prints them, ``agent.create`` returns
    them to the parent.
    """
    storage.require_root(root)
    require_host_administrator(root, "create agents")
    agents_directory(root)
    if identity is None:
        identity, default_user = default_identity()
    if identity.uid == 0:
        raise invalid("an agent never runs as root (SPEC P-5 step 1); give it an unprivileged user")
    _require_identity_of_creator(identity)
    warnings = warnings_for(root, request, identity)
    identity_control = (json.dumps(identity_json(identity)) + "\n").encode()
    try:
        parse_identity(identity_control)  # what every later use of the agent reads it with
    except CtxError as exc:
        raise invalid(f"the agent's identity: {exc.message}") from None
    controls = {
        "label": f"{request.label}\n".encode(),
        "policy": request.policy_text().encode(),
        "identity": identity_control,
        "mount": (json.dumps(request.mount_table(), indent=1) + "\n").encode(),
        "model": "".join(f"{model}\n" for model in request.models).encode(),
        "system.md": _system_prompt(request).encode(),
        "prompt.template.md": b"{{input}}\n",
    }
    facts: dict[str, object] = {
        "by": "ctx agent create" if parent is None else "agent.create",
        "label": request.label,
        "uid": identity.uid,
        "gid": identity.gid,
    }
    if parent is not None:
        facts["parent"] = parent
    # The agent's log is installed holding its creation, so that the agent and the record of
    # it appear together or not at all (S-5), whatever runs out on the way.
    created = make_event(
        agent_log.CREATED,
        agent=request.name,
        session=session,
        object=f"agent/{request.name}",
        status="ok",
        **facts,
    )
    controls[agent_log.LOG] = encode_event(created)
    directory = root / "agent"
    try:
        install_pair(
            directory,
            request.name,
            AGENT_KIND,
            entry=entry_program(root, request.name),
            controls=controls,
            replace=False,
            ops=ops,
            host=storage_owner(root),
            refuse_under_lock=refuse_under_lock,
        )
    except CtxError as exc:
        if exc.errno != errno.EEXIST:
            raise
        if not os.path.lexists(directory / request.name):
            raise exists(f"{leftover_controls(request.name)}; nothing was created") from None
        if not os.path.lexists(directory / f"{request.name}.d"):
            raise exists(f"{leftover_entry(request.name)}; nothing was created") from None
        raise exists(
            f"{exc.message}: change its controls in agent/{request.name}.d/, or create the "
            "agent under another name"
        ) from None
    if parent is not None:
        warnings = (*warnings, *_record_in_parent(root, parent, request.name, session, facts))
    return CreatedAgent(
        request.name,
        directory / request.name,
        directory / f"{request.name}.d",
        identity,
        default_user,
        warnings,
    )


def leftover_controls(name: str) -> str:
    """What ``agent/<name>.d/`` without ``agent/<name>`` is, and how to settle it: no agent
    (every command looks for the entry), but a create never overwrites it."""
    return (
        f"agent/{name}.d exists without agent/{name}, so it is no agent's controls: left "
        f"when agent/{name} was removed without them, or made by hand; look at what it holds, "
        f"then remove agent/{name}.d to create agent {name}, or create it under another name"
    )


def leftover_entry(name: str) -> str:
    """What ``agent/<name>`` without ``agent/<name>.d/`` is, and how to settle it: an entry
    with no controls is no usable agent (no identity, no label), and a create never
    overwrites it."""
    return (
        f"agent/{name} exists but agent/{name}.d does not exist, so it is an agent with no "
        f"controls: left when agent/{name}.d was removed without it, or made by hand; remove "
        f"agent/{name} to create agent {name}, or create it under another name"
    )


def _record_in_parent(
    root: Path, parent: str, child: str, session: str, facts: dict[str, object]
) -> list[str]:
    """Record the creation of ``child`` in its parent's log too (A-4); a warning when that
    cannot be done, for the child exists by then and its own log records its creation."""
    facts = {key: value for key, value in facts.items() if key != "parent"}
    try:
        agent_log.record(
            root, parent, agent_log.CREATED, session=session, about=child, child=child, **facts
        )
    except (OSError, CtxError) as exc:
        return [
            f"agent {child} was created and its own log records it, but agent {parent}'s log "
            f"could not be written ({describe(exc)})"
        ]
    return []


def label_owners(root: Path, label: str) -> list[str]:
    """The existing agents whose label is ``label``, in name order."""
    owners = []
    for entry in sorted(os.listdir(root / "agent")):
        if entry.endswith(".d") or not is_object_name(entry):
            continue
        try:
            if read_label(root, entry) == label:
                owners.append(entry)
        except CtxError:
            continue  # an unreadable label is nobody's
    return owners


def warnings_for(root: Path, request: AgentRequest, identity: Identity) -> tuple[str, ...]:
    """What a request makes that may not work as meant, said at creation rather than found
    later, to the host administrator (``ctx agent create``) and to a parent agent
    (``agent.create``) alike: a label another agent has (tool and model policies grant
    by label, so the two agents share every such grant), a storage root the agent's uid
    cannot reach through the directories above it (every tool call is refused at step 2), a
    shared grant of a space not made yet (or whose name holds a link or a file), or one that
    grants nothing (write to the manuals,
    or to a space it may not read), a mount whose source does not exist (the agent's
    terminal does not start until it does) or is closed to the agent's uid, a source
    recorded as a real path that another uid's symbolic link chose, and a read-write mount
    through which the agent could change its own controls (every call is refused at step
    4)."""
    warnings = [
        f"label {request.label} is also agent {owner}'s: tool and model policies grant by "
        "label, so the two agents share every grant made to it"
        for owner in label_owners(root, request.label)
    ]
    unreachable = unsearchable(root, identity)
    if unreachable:
        warnings.append(f"every tool call of the agent will be refused: {unreachable}")
    for space, permissions in request.shared:
        if space != storage.DOCS_BUNDLE:
            warnings.extend(_space_not_there(root / "shared" / space, space))
        if space == storage.DOCS_BUNDLE and "write" in permissions:
            warnings.append(
                f"shared:{space} write grants nothing: the manual bundle is read-only (D-1)"
            )
        elif "write" in permissions and "read" not in permissions:
            warnings.append(
                f"shared:{space} write without read grants nothing: a space the agent may not "
                "read is not in its view, so it can write nothing there (add read)"
            )
    for source, target, _ in request.mounts:
        if PurePosixPath(target) == CTX_TARGET:
            continue
        if not os.path.exists(source):
            warnings.append(
                f"the source {source} of the mount at {target} does not exist: the agent's "
                "terminal does not start until it does, and its tools find nothing there"
            )
        elif closed := closed_directory(Path(source), identity):
            warnings.append(
                f"the source {source} of the mount at {target} is closed to the agent: "
                f"{closed}; its tools find nothing there"
            )
    warnings += [linked.warning() for linked in request.linked_sources]
    warnings += _controls_in_reach(root, request, identity)
    return tuple(warnings)


def _controls_in_reach(root: Path, request: AgentRequest, identity: Identity) -> list[str]:
    """One warning for each read-write mount that shows the agent its own controls, or a
    directory above them, that its uid or groups may change: step 4 of the chain then
    refuses every call of the agent (a grant it could rewrite is no grant).  A source above
    the storage root is allowed, so this is easy to ask for: a user's home, mounted
    read-write, that holds the user's default root."""
    real_root = PurePosixPath(os.path.realpath(root))
    changeable = writable_entries(Path(real_root), PurePosixPath("agent"), identity)
    if identity.uid == os.geteuid():
        # The controls about to be written are the creator's files, so that uid's too.
        changeable.append(f"agent/{request.name}.d")
    mounts = [
        Mount(PurePosixPath(source), PurePosixPath(target), mode == "rw")
        for source, target, mode in request.mounts
    ]
    warnings = []
    for mount in mounts:
        if not mount.writable:
            continue
        seen = next(
            (
                (entry, view.path)
                for entry in changeable
                for view in views_of(mounts, real_root / entry)
                if view.mount == mount
            ),
            None,
        )
        if seen is not None:
            entry, shown = seen
            what = "the storage root" if real_root / entry == real_root else f"the root's {entry}"
            warnings.append(
                "every call of the agent will be denied at step 4 of the authority chain: "
                f"through its read-write mount {mount} it sees {what} at {shown}, which uid "
                f"{identity.uid} may change, so it could rewrite its own controls "
                f"(agent/{request.name}.d); mount a directory that does not hold the storage "
                f"root {real_root} instead, or make this mount 'ro'"
            )
    return warnings


def _require_identity_of_creator(identity: Identity) -> None:
    """EPERM, before anything is made, when a creator other than root gives the agent a uid or
    a group it does not hold itself.  Only root can start processes with another's
    credentials, so nobody else could ever run such an agent (its calls fail at step 1 of the
    chain, or when the kernel refuses the group), and a root that did would hand out
    credentials the creator never had."""
    if os.geteuid() == 0:
        return
    own_groups = {os.getegid(), *os.getgroups()}
    foreign = []
    if identity.uid != os.geteuid():
        foreign.append(f"uid {identity.uid}")
    foreign += [f"group {gid}" for gid in sorted({identity.gid, *identity.groups} - own_groups)]
    if foreign:
        mine = ", ".join(str(gid) for gid in sorted(own_groups))
        raise CtxError(
            errno.EPERM,
            f"only root can create an agent that runs as {', '.join(foreign)}: you (uid "
            f"{os.geteuid()}, groups {mine}) can give an agent only your own uid and groups; "
            "leave out --user, --gid and --groups, or have root create the agent",
        )


def _system_prompt(request: AgentRequest) -> str:
    tools = ", ".join(request.tools) or "none"
    return (
        f"# {request.name}\n\n"
        f"You are the agent {request.name}.  Your tools: {tools}.\n"
        "Nothing written here grants a permission; your policy does (SPEC P-6).\n"
    )


def _space_not_there(place: Path, space: str) -> list[str]:
    """What a shared grant of ``space`` is told when nothing, or no space, is at ``place``."""
    if not os.path.lexists(place):
        return [
            f"shared:{space} names no shared space yet: the grant takes effect once "
            f"'ctx shared create {space}' makes it"
        ]
    if place.is_symlink() or not place.is_dir():
        what = "a symbolic link" if place.is_symlink() else "no directory"
        return [
            f"shared:{space} names {what} at {place}, which is no shared space: the grant "
            f"takes effect once it is removed and 'ctx shared create {space}' makes it"
        ]
    return []
