"""An agent's host-owned controls and the objects' own policies, read from a storage root.

::

    agent/<name>              the agent's executable entry: the agent exists
    agent/<name>.d/identity   {"uid": int, "gid": int, "groups": [int, ...]}  (step 1)
    agent/<name>.d/mount      [[source, target, "ro"|"rw"], ...]              (step 3)
                              (real paths; a mount on a system target or a source
                              that runs through a link is withheld)
    agent/<name>.d/label      one line: the agent's subject type, e.g. coder_t (step 4)
    agent/<name>.d/policy     policy v0: what the agent may do               (step 5)
    <object>.d/policy         a tool's or model's own policy                 (step 6)

These files are the only source of grants (P-6: prompts, system prompts and model output
never grant anything).  Every control is read without following links and no further than its
limit (:data:`~cortexfs.regular_file.MAX_POLICY_BYTES` for a policy,
:data:`~cortexfs.regular_file.MAX_CONTROL_BYTES` for the others), and every failure to read one
fails closed: EFBIG for a control over its limit, EACCES otherwise; only a missing agent is
ENOENT.  A control the kernel refused this process (:class:`UnreadableControl`) keeps that
refusal, for the chain to tell whether it is the agent's too.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from collections import Counter
from pathlib import Path, PurePosixPath

from cortexfs import beneath, jsontext
from cortexfs.errors import HOST_SHORTAGES, CtxError, denied, invalid, not_found, too_big
from cortexfs.names import MAX_ID, is_id
from cortexfs.policy.decision import Policy
from cortexfs.policy.grammar import PolicySyntaxError, check_subject_type
from cortexfs.policy.linux import Identity
from cortexfs.policy.mounts import CTX_TARGET, Mount, mount_problem, parse_mount_table
from cortexfs.regular_file import MAX_CONTROL_BYTES, MAX_POLICY_BYTES, read_regular_file
from cortexfs.storage import require_root

AGENTS = PurePosixPath("agent")
HOST_OWNED_CONTROLS = ("identity", "mount", "label", "policy")
_IDENTITY_KEYS = {"uid", "gid", "groups"}
_NOT_A_FILE = {errno.ELOOP, errno.ENOTDIR, errno.EINVAL, errno.EISDIR}


# Paths are values, kept once made: every call asks for the same few of its agent, and a
# PurePosixPath is slow to make on Python 3.11.
_PATHS_KEPT = 256


@functools.lru_cache(maxsize=_PATHS_KEPT)
def agent_entry(agent: str) -> PurePosixPath:
    return AGENTS / agent


@functools.lru_cache(maxsize=_PATHS_KEPT)
def control_dir(agent: str) -> PurePosixPath:
    return AGENTS / f"{agent}.d"


@functools.lru_cache(maxsize=_PATHS_KEPT)
def control_path(agent: str, control: str) -> PurePosixPath:
    return control_dir(agent) / control


def agent_exists(root: Path, agent: str) -> bool:
    """Whether ``agent/<name>`` exists (as any entry other than a link)."""
    status = beneath.lstat(root, agent_entry(agent))
    return status is not None and not stat.S_ISLNK(status.st_mode)


def require_agent(root: Path, agent: str) -> None:
    """ENOENT unless :func:`agent_exists`, saying how to find the agents there are and make
    one; a storage root that is not there is said first, since that, not the agent, is what
    the caller has to fix (a mistyped --storage)."""
    if not agent_exists(root, agent):
        require_root(root)
        entry = root / agent_entry(agent)
        what = (
            "is a symbolic link, never followed: an agent is an entry of its own"
            if beneath.lstat(root, agent_entry(agent)) is not None
            else "does not exist"
        )
        raise not_found(
            f"there is no agent {agent!r} ({entry} {what}); 'ctx agent list' lists the agents "
            "there are, and 'ctx agent create REQUEST.json' makes one (the request's form: "
            "'ctx agent create --help')"
        )


class UnreadableControl(CtxError):
    """The EACCES of a control the kernel refused this process to read (EACCES or EPERM),
    keeping that ``refusal``: the chain reads with the asking process's rights, so it asks
    whether the agent would be refused too before it calls this a verdict on the agent
    (:func:`~cortexfs.policy.chain.refusal_of_this_process`)."""

    def __init__(self, path: PurePosixPath, refusal: OSError) -> None:
        super().__init__(errno.EACCES, f"{path} cannot be read safely: {refusal.strerror}")
        self.path = path
        self.refusal = refusal


class AgentControlFiles:
    """An agent's host-owned controls (:data:`HOST_OWNED_CONTROLS`) read together, through one
    descriptor of ``agent/<name>.d/`` opened without following links, where reading each by
    its path walks to it again.  Each is kept as what reading it alone gives: its bytes, None
    when it is missing, or the error reading it raised, raised again whenever it is asked
    for.  A reader (:class:`~cortexfs.policy.chain.AgentFacts`) passes these to the
    ``read_*`` functions below; they are as current as the moment they were read."""

    def __init__(self, root: Path, agent: str) -> None:
        self._read: dict[PurePosixPath, bytes | CtxError | None] = {}
        directory, unopened = None, None
        try:
            directory = beneath.open_directory(root, control_dir(agent))
        except OSError as exc:
            unopened = exc  # what reading each control by its path would meet
        try:
            for control in HOST_OWNED_CONTROLS:
                path = control_path(agent, control)
                try:
                    if directory is None:
                        assert unopened is not None
                        self._read[path] = _unread(path, unopened)
                    else:
                        self._read[path] = _read_in(directory, path)
                except CtxError as exc:
                    self._read[path] = exc
        finally:
            if directory is not None:
                os.close(directory)

    def holds(self, path: PurePosixPath) -> bool:
        return path in self._read

    def read(self, path: PurePosixPath) -> bytes | None:
        """The control at ``path`` (one of :meth:`holds`), as :func:`_read_optional` reads it."""
        outcome = self._read[path]
        if isinstance(outcome, UnreadableControl):
            raise UnreadableControl(outcome.path, outcome.refusal)
        if isinstance(outcome, CtxError):
            raise CtxError(outcome.errno, outcome.message)
        return outcome


def read_identity(root: Path, agent: str, files: AgentControlFiles | None = None) -> Identity:
    path = control_path(agent, "identity")
    data = _read_control(root, path, f"agent {agent!r} has no identity", files)
    try:
        return parse_identity(data)
    except CtxError as exc:
        raise denied(f"{control_path(agent, 'identity')} is invalid: {exc.message}") from None


def read_mounts(
    root: Path, agent: str, files: AgentControlFiles | None = None
) -> tuple[Mount, ...]:
    """The agent's usable mounts; none when the control is absent.

    A mount :func:`withheld_mounts` names is left out: never shown to a tool, never bound in
    the terminal's sandbox, never a way the chain sees an object.  Sources are used as
    recorded, never resolved again: a link put on the way since would otherwise lead the mount
    wherever its writer chose.  No two of them share a name.
    """
    return tuple(mount for mount, problem in _judged_mounts(root, agent, files) if not problem)


def withheld_mounts(root: Path, agent: str) -> tuple[tuple[Mount, str], ...]:
    """The mounts of the agent's control that are unusable, each with the reason: a target the
    system or the storage view owns, a source that is no longer the real path recorded, or a
    name (its target's last component) that another usable mount has too, which no policy
    rule could grant one of (:func:`~cortexfs.policy.mounts.granted_mounts`)."""
    return tuple((mount, problem) for mount, problem in _judged_mounts(root, agent) if problem)


def _judged_mounts(
    root: Path, agent: str, files: AgentControlFiles | None = None
) -> list[tuple[Mount, str]]:
    """Each mount of the agent's control with why it is withheld ("" for a usable one)."""
    path = control_path(agent, "mount")
    data = _read_optional(root, path, files)
    if data is None:
        return []
    try:
        mounts = parse_mount_table(data)
    except CtxError as exc:
        raise denied(f"{path} is invalid: {exc.message}") from None
    storage_root = PurePosixPath(os.path.realpath(root))
    judged = []
    for mount in mounts:
        problem = mount_problem(mount, storage_root, agent)
        if not problem and mount.target == CTX_TARGET and mount.source != storage_root:
            # The same directory as this root reached by another path (a bind mount of it):
            # the mount is judged, shown and bound as this root, which its objects lie under.
            mount = mount._replace(source=storage_root)
        judged.append((mount, problem))
    # Judged after the places: a mount withheld for its place leaves its name to the other.
    named = Counter(mount.name for mount, problem in judged if not problem)
    return [(mount, problem or _shared_name(mount, named[mount.name])) for mount, problem in judged]


def _shared_name(mount: Mount, sharing: int) -> str:
    """Why ``mount`` is withheld when ``sharing`` usable mounts, itself among them, have its
    name: all of them are, as no rule could grant one; "" for a name of its own."""
    if sharing < 2:
        return ""
    return (
        f"{sharing} mounts are named {mount.name!r} (the last component of their targets): a "
        f"rule 'mount:{mount.name}' could not say which it grants, so none of them is used"
    )


def read_label(root: Path, agent: str, files: AgentControlFiles | None = None) -> str:
    path = control_path(agent, "label")
    missing = f"agent {agent!r} has no label, so it has no subject type"
    data = _read_control(root, path, missing, files)
    try:
        return check_subject_type(data.decode("ascii").strip())
    except (UnicodeDecodeError, CtxError) as exc:
        reason = exc.message if isinstance(exc, CtxError) else "it is not ASCII"
        raise denied(f"{path} is invalid: {reason}") from None


def read_policy(root: Path, path: PurePosixPath, files: AgentControlFiles | None = None) -> Policy:
    """The policy at ``path``; a missing or invalid policy grants nothing (EACCES)."""
    data = _read_control(root, path, "no policy, so nothing is allowed", files)
    try:
        return Policy.from_bytes(data, source=str(path))
    except PolicySyntaxError as exc:
        raise denied(f"{exc.message}; an invalid policy grants nothing") from None


def parse_identity(data: bytes) -> Identity:
    """An identity control; EINVAL saying what is wrong in words an administrator can act on."""
    try:
        fields = jsontext.loads_text(data)
    except ValueError as exc:
        raise invalid(f"not JSON: {exc}") from None
    if not isinstance(fields, dict) or set(fields) != _IDENTITY_KEYS:
        raise invalid('expected exactly {"uid": N, "gid": N, "groups": [N, ...]}')
    uid, gid, groups = fields["uid"], fields["gid"], fields["groups"]
    if not isinstance(groups, list):
        raise invalid("groups must be a list of group ids")
    for value in (uid, gid, *groups):
        if not is_id(value):
            raise invalid(
                f"{jsontext.spelt(value)} is not a uid or gid (an integer from 0 to {MAX_ID})"
            )
    return Identity(uid, gid, frozenset(groups))


def control_limit(path: PurePosixPath) -> int:
    """The most the control at ``path`` may hold: :data:`MAX_POLICY_BYTES` for a policy,
    :data:`MAX_CONTROL_BYTES` for any other control of an agent, a tool or a model."""
    return MAX_POLICY_BYTES if path.name == "policy" else MAX_CONTROL_BYTES


def too_large(path: PurePosixPath) -> str:
    """What to say of the control at ``path`` when it is over its :func:`control_limit`."""
    kind = "a policy" if path.name == "policy" else "a control"
    return f"{path} holds more than {control_limit(path)} bytes, the limit of {kind}"


def _read_control(
    root: Path, path: PurePosixPath, when_missing: str, files: AgentControlFiles | None = None
) -> bytes:
    data = _read_optional(root, path, files)
    if data is None:
        raise denied(f"{when_missing} ({path} is missing)")
    return data


def _read_optional(
    root: Path, path: PurePosixPath, files: AgentControlFiles | None = None
) -> bytes | None:
    """The control at ``path`` (from ``files`` when they hold it), None when it is missing."""
    if files is not None and files.holds(path):
        return files.read(path)
    try:
        return beneath.read_file(root, path, control_limit(path))
    except OSError as exc:
        return _unread(path, exc)


def _read_in(directory: int, path: PurePosixPath) -> bytes | None:
    """The control at ``path``, read by its name in its ``directory`` (a descriptor)."""
    try:
        return read_regular_file(path.name, control_limit(path), dir_fd=directory)
    except OSError as exc:
        return _unread(path, exc)


def _unread(path: PurePosixPath, exc: OSError) -> None:
    """None for a control that is missing (``exc`` is ENOENT); for any other failure to read
    it, raise the CtxError that denies it, naming ``path`` and what to do."""
    if isinstance(exc, FileNotFoundError):
        return None
    if exc.errno in HOST_SHORTAGES:  # not judged: denied all the same, for that reason
        raise CtxError(exc.errno, f"{path} cannot be read now: {exc.strerror}") from None
    if exc.errno == errno.EFBIG:  # denied all the same, saying what to fix
        raise too_big(f"{too_large(path)}, so it is not read; rewrite it") from None
    if exc.errno in (errno.EACCES, errno.EPERM):
        raise UnreadableControl(path, exc) from None
    reason = "a link or not a regular file" if exc.errno in _NOT_A_FILE else exc.strerror
    raise denied(f"{path} cannot be read safely: {reason}") from None
