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
ENOENT.
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from pathlib import Path, PurePosixPath

from cortexfs import jsontext
from cortexfs.errors import HOST_SHORTAGES, CtxError, denied, invalid, not_found, too_big
from cortexfs.policy import beneath
from cortexfs.policy.decision import Policy
from cortexfs.policy.grammar import PolicySyntaxError, check_subject_type
from cortexfs.policy.linux import Identity
from cortexfs.policy.mounts import Mount, mount_problem, parse_mount_table
from cortexfs.regular_file import MAX_CONTROL_BYTES, MAX_POLICY_BYTES
from cortexfs.storage import require_root

AGENTS = PurePosixPath("agent")
HOST_OWNED_CONTROLS = ("identity", "mount", "label", "policy")
_IDENTITY_KEYS = {"uid", "gid", "groups"}
_MAX_ID = 2**32 - 2  # (uid_t)-1 means "no id" to the kernel
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
    """ENOENT unless :func:`agent_exists`; a storage root that is not there is said first,
    since that, not the agent, is what the caller has to fix (a mistyped --storage)."""
    if not agent_exists(root, agent):
        require_root(root)
        raise not_found(f"there is no agent {agent!r} ({agent_entry(agent)} does not exist)")


def read_identity(root: Path, agent: str) -> Identity:
    data = _read_control(root, control_path(agent, "identity"), f"agent {agent!r} has no identity")
    try:
        return parse_identity(data)
    except CtxError as exc:
        raise denied(f"{control_path(agent, 'identity')} is invalid: {exc.message}") from None


def read_mounts(root: Path, agent: str) -> tuple[Mount, ...]:
    """The agent's usable mounts; none when the control is absent.

    A mount :func:`withheld_mounts` names is left out: never shown to a tool, never bound in
    the terminal's sandbox.  Sources are used as recorded, never resolved again: a link put on
    the way since would otherwise lead the mount wherever its writer chose.
    """
    return tuple(mount for mount, problem in _judged_mounts(root, agent) if not problem)


def withheld_mounts(root: Path, agent: str) -> tuple[tuple[Mount, str], ...]:
    """The mounts of the agent's control that are unusable, each with the reason: a target the
    system or the storage view owns, or a source that is no longer the real path recorded."""
    return tuple((mount, problem) for mount, problem in _judged_mounts(root, agent) if problem)


def _judged_mounts(root: Path, agent: str) -> list[tuple[Mount, str]]:
    path = control_path(agent, "mount")
    data = _read_optional(root, path)
    if data is None:
        return []
    try:
        mounts = parse_mount_table(data)
    except CtxError as exc:
        raise denied(f"{path} is invalid: {exc.message}") from None
    storage_root = PurePosixPath(os.path.realpath(root))
    return [(mount, mount_problem(mount, storage_root, agent)) for mount in mounts]


def read_label(root: Path, agent: str) -> str:
    path = control_path(agent, "label")
    data = _read_control(root, path, f"agent {agent!r} has no label, so it has no subject type")
    try:
        return check_subject_type(data.decode("ascii").strip())
    except (UnicodeDecodeError, CtxError) as exc:
        reason = exc.message if isinstance(exc, CtxError) else "it is not ASCII"
        raise denied(f"{path} is invalid: {reason}") from None


def read_policy(root: Path, path: PurePosixPath) -> Policy:
    """The policy at ``path``; a missing or invalid policy grants nothing (EACCES)."""
    data = _read_control(root, path, "no policy, so nothing is allowed")
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
        if not _is_id(value):
            raise invalid(f"{value!r} is not a uid or gid (an integer from 0 to {_MAX_ID})")
    return Identity(uid, gid, frozenset(groups))


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_ID


def control_limit(path: PurePosixPath) -> int:
    """The most the control at ``path`` may hold: :data:`MAX_POLICY_BYTES` for a policy,
    :data:`MAX_CONTROL_BYTES` for any other control of an agent, a tool or a model."""
    return MAX_POLICY_BYTES if path.name == "policy" else MAX_CONTROL_BYTES


def too_large(path: PurePosixPath) -> str:
    """What to say of the control at ``path`` when it is over its :func:`control_limit`."""
    kind = "a policy" if path.name == "policy" else "a control"
    return f"{path} holds more than {control_limit(path)} bytes, the limit of {kind}"


def _read_control(root: Path, path: PurePosixPath, when_missing: str) -> bytes:
    data = _read_optional(root, path)
    if data is None:
        raise denied(f"{when_missing} ({path} is missing)")
    return data


def _read_optional(root: Path, path: PurePosixPath) -> bytes | None:
    limit = control_limit(path)
    try:
        return beneath.read_file(root, path, limit)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in HOST_SHORTAGES:  # not judged: denied all the same, for that reason
            raise CtxError(exc.errno, f"{path} cannot be read now: {exc.strerror}") from None
        if exc.errno == errno.EFBIG:  # denied all the same, saying what to fix
            raise too_big(f"{too_large(path)}, so it is not read; rewrite it") from None
        reason = "a link or not a regular file" if exc.errno in _NOT_A_FILE else exc.strerror
        raise denied(f"{path} cannot be read safely: {reason}") from None
