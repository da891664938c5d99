"""The agent request of SPEC A-3 and the controls it becomes.

::

    {
      "name": "reviewer",
      "label": "reviewer_t",
      "model": ["openai/gpt-5.6"],
      "tools": ["fs.read"],
      "shared": {"project-a": ["read"]},
      "mount": [["/work", "/work", "ro"], ["/shared/project-a", "/shared/project-a", "ro"]]
    }

Only ``name`` and ``label`` are required.  A space's permissions in ``shared`` are a list or
a string — one permission, or several separated by spaces (``"read write"``).
:func:`parse_request` lists *every* problem.  The
policy the host writes grants exactly what the request lists, as concrete ``allow`` rules
(P-7), and nothing else:

* ``tools`` → ``allow <label> tool:<t> execute``;
* ``model`` → ``allow <label> model:<m> use``;
* ``shared`` → ``allow <label> shared:<space> read|write``;
* ``mount`` → ``allow <label> mount:<name> read`` for each mount, plus ``write`` for ``rw``
  ones; a mount is named by the last component of its target, so those names must differ.

Every agent also sees the storage root read-only at ``/ctx`` (its CortexFS view, T-5): the
tools on its ``CTX_PATH`` must be visible through a mount for step 3 of the authority chain.
``/ctx`` is that view's place: a request mounting anything at or under it is EINVAL.  So is
a target at or under a directory the terminal's sandbox takes from the system or makes
itself — ``/usr``, ``/etc``, ``/bin``, ``/lib*``, ``/proc``, ``/dev``, ``/run``, ``/tmp`` and
the like (:data:`cortexfs.policy.mounts.SYSTEM_TARGETS`) — or at ``/``.  Sources are recorded
as their real paths; a source reached through a symbolic link that neither the creator nor
root owns is recorded all the same, and ``ctx agent create`` warns of it, naming the path
written and the path recorded (:class:`LinkedSource`): whoever owns the link chose the latter.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from cortexfs import jsontext
from cortexfs.agents.view import agent_ctx_path, spaces_with_tiers
from cortexfs.errors import CtxError, too_big
from cortexfs.names import MAX_ID, object_name_problem
from cortexfs.policy import Policy
from cortexfs.policy.grammar import check_subject_type, policy_object_name_problem
from cortexfs.policy.mounts import parse_mount_entries, target_problem, whole_root_problem
from cortexfs.regular_file import read_regular_file
from cortexfs.tools.ctxpath import CTX_MOUNT
from cortexfs.tools.schemas import brief_message
from cortexfs.tools.spawn import MAX_ARG_STRLEN

if TYPE_CHECKING:
    from jsonschema import ValidationError

MAX_REQUEST_BYTES = 256 * 1024
# The share of MAX_ARG_STRLEN a request's own mounts may take in CTX_MOUNTS, which also lists
# the storage view's entries (the tools the agent may run, for one).
MAX_MOUNTS_ENVIRONMENT = 64 * 1024
# As many links as the kernel follows in one path lookup (MAXSYMLINKS); past them realpath
# stops resolving too.
_MAX_LINKS = 40
SHARED_PERMISSIONS = ("read", "write")

REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "label"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string"},
        "label": {"type": "string"},
        "model": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "tools": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "shared": {
            "type": "object",
            "additionalProperties": {
                "type": ["array", "string"],
                "items": {"type": "string"},
                "uniqueItems": True,
            },
        },
        "mount": {
            "type": "array",
            "items": {
                "type": "array",
                "prefixItems": [{"type": "string"}, {"type": "string"}, {"enum": ["ro", "rw"]}],
                "minItems": 3,
                "maxItems": 3,
            },
        },
    },
}


class RequestError(CtxError):
    """EINVAL for an invalid agent request; :attr:`problems` holds every reason."""

    def __init__(self, source: str, problems: list[str]) -> None:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(errno.EINVAL, f"{source}: {problems[0]}{more}")
        self.problems = tuple(problems)


@dataclass(frozen=True)
class LinkedSource:
    """A mount source written as ``written`` and recorded as ``recorded``, its real path, which
    a symbolic link owned by another uid (``owner``, the first such link met: ``link``) chose."""

    written: str
    recorded: str
    target: str
    link: str
    owner: int

    def warning(self) -> str:
        return (
            f"the source {self.written} of the mount at {self.target} is recorded as "
            f"{self.recorded}: the way there goes through the symbolic link {self.link}, "
            f"which uid {self.owner} owns and may point anywhere; if that is not the directory "
            "you meant to give the agent, write the real path you meant in the agent's mount "
            "control (agent/<name>.d/mount) by hand"
        )


@dataclass(frozen=True)
class AgentRequest:
    name: str
    label: str
    models: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    shared: tuple[tuple[str, tuple[str, ...]], ...] = ()
    mounts: tuple[tuple[str, str, str], ...] = ()
    linked_sources: tuple[LinkedSource, ...] = ()

    def policy_text(self) -> str:
        """The agent's ``policy`` control: one concrete rule per grant (P-1, P-7)."""
        rules = [f"allow {self.label} tool:{tool} execute" for tool in self.tools]
        rules += [f"allow {self.label} model:{model} use" for model in self.models]
        rules += [
            f"allow {self.label} shared:{space} {permission}"
            for space, permissions in self.shared
            for permission in permissions
        ]
        for _, target, mode in self.mounts:
            name = PurePosixPath(target).name
            rules.append(f"allow {self.label} mount:{name} read")
            if mode == "rw":
                rules.append(f"allow {self.label} mount:{name} write")
        text = (
            f"# Policy v0 of agent {self.name}, written by 'ctx agent create' (SPEC A-3).\n"
            "# Host-owned.  It grants exactly what the request listed; default deny (P-2).\n"
            + "".join(rule + "\n" for rule in rules)
        )
        Policy.from_text(text, source="generated policy")  # a generated rule must be a rule
        return text

    def mount_table(self) -> list[list[str]]:
        return [list(mount) for mount in self.mounts]


def load_request(path: Path, storage_root: Path) -> AgentRequest:
    """Read and validate a request file; ``-`` is not accepted here (the CLI reads stdin).

    Read as a regular file (a final link followed: it is the file the caller named), at most
    :data:`MAX_REQUEST_BYTES`: a FIFO is EINVAL, never waited on, and a huge file is not read
    whole."""
    try:
        data = read_regular_file(path, MAX_REQUEST_BYTES, follow_link=True)
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            raise too_big(_too_big_message(str(path))) from None
        if exc.errno == errno.EINVAL:
            raise CtxError(
                errno.EINVAL,
                f"{path} is not a regular file (a FIFO, device or directory); give a request "
                "file, or '-' to read one from a pipe; nothing was created",
            ) from None
        raise CtxError(exc.errno or errno.EIO, f"{path}: {exc.strerror}") from None
    return parse_request_bytes(data, str(path), storage_root)


def _too_big_message(source: str) -> str:
    return f"{source}: a request is at most {MAX_REQUEST_BYTES} bytes; nothing was created"


def parse_request_bytes(data: bytes, source: str, storage_root: Path) -> AgentRequest:
    if len(data) > MAX_REQUEST_BYTES:
        raise too_big(_too_big_message(source))
    try:
        document = jsontext.loads_strict(data)
    except jsontext.DuplicateNames as exc:
        # A reviewer could approve one label or tool list while the agent gets the other.
        problem = f"the request {jsontext.duplicate_names_problem(exc.names)}"
        raise RequestError(source, [problem]) from None
    except jsontext.NotAJsonNumber as exc:
        raise RequestError(source, [f"not JSON: {exc} is not a JSON number"]) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise RequestError(source, [f"not JSON: {exc}"]) from None
    return parse_request(document, source, storage_root)


def parse_request(document: object, source: str, storage_root: Path) -> AgentRequest:
    """Validate a decoded request and add the ``/ctx`` view of ``storage_root``."""
    import jsonschema  # here: about 100 ms that no other command of ctx needs

    validator = jsonschema.Draft202012Validator(REQUEST_SCHEMA)
    errors = list(validator.iter_errors(document))
    if not isinstance(document, dict):
        raise RequestError(source, [_describe(error) for error in errors])
    problems = [_describe(error) for error in errors]
    character = jsontext.lone_surrogate(document)
    if character is not None:
        # JSON can spell one ("\ud800"), but no name, path or control file can hold it: the
        # checks below, which resolve paths and measure names in bytes, are not reached.
        problems.append(f"the request holds {character!r}, a lone surrogate, which is no character")
        raise RequestError(source, problems)
    # Every problem at once: what the schema refused is left out of the checks below, which
    # judge the rest of the request as if it were all there is.
    sound = _well_typed(document, errors)
    shared = {
        space: _permission_list(permissions)
        for space, permissions in sound.get("shared", {}).items()
    }
    problems += _name_problems(sound)
    problems += _shared_problems(shared)
    problems += _search_path_problems(shared)
    problems += _mount_problems(sound.get("mount", []), storage_root)
    if problems:
        raise RequestError(source, problems)
    # Recorded as real paths, which is all a mount control's reader uses (a source is never
    # resolved again, so a link repointed later leads nowhere).
    mounts, linked = [], []
    for source, target, mode in document.get("mount", []):
        real, links = resolve_links(source)
        mounts.append((real, target, mode))
        foreign = [(link, owner) for link, owner in links if owner not in (0, os.geteuid())]
        if foreign:
            linked.append(LinkedSource(source, real, target, *foreign[0]))
    mounts.append((str(storage_root.resolve()), str(CTX_MOUNT), "ro"))
    return AgentRequest(
        name=document["name"],
        label=document["label"],
        models=tuple(document.get("model", [])),
        tools=tuple(document.get("tools", [])),
        shared=tuple((space, tuple(permissions)) for space, permissions in shared.items()),
        mounts=tuple(mounts),  # type: ignore[arg-type]
        linked_sources=tuple(linked),
    )


def resolve_links(path: str) -> tuple[str, list[tuple[str, int]]]:
    """The real path of the absolute ``path``, as :func:`os.path.realpath` makes it, and each
    symbolic link met on the way there with its owner, from the same look at each component
    (a link swapped in between could not be recorded unseen).  A component that cannot be
    looked at is kept as written, as realpath keeps it."""
    pending = list(reversed(path.split("/")))
    resolved, links = "/", []
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            resolved = os.path.dirname(resolved)
            continue
        candidate = os.path.join(resolved, part)
        try:
            status = os.lstat(candidate)
        except OSError:
            status = None
        if status is None or not stat.S_ISLNK(status.st_mode) or len(links) >= _MAX_LINKS:
            resolved = candidate
            continue
        links.append((candidate, status.st_uid))
        try:
            target = os.readlink(candidate)
        except OSError:  # gone since the look: taken as written
            resolved = candidate
            continue
        if target.startswith("/"):
            resolved = "/"
        pending.extend(reversed(target.split("/")))
    return resolved, links


def _well_typed(document: dict[str, Any], errors: list[ValidationError]) -> dict[str, Any]:
    """``document`` without what ``errors`` are about: a member of the request, an entry of
    one of its lists, or a space of ``shared``, each left out whole."""
    broken: dict[str, set[object]] = {}
    for error in errors:
        path = list(error.absolute_path)
        if path:
            broken.setdefault(str(path[0]), set()).add(path[1] if len(path) > 1 else None)
    sound: dict[str, Any] = {}
    for key, value in document.items():
        if key not in REQUEST_SCHEMA["properties"]:
            continue
        parts = broken.get(key, set())
        if None in parts:
            continue  # the member itself has the wrong type
        if isinstance(value, list):
            value = [item for index, item in enumerate(value) if index not in parts]
        elif isinstance(value, dict):
            value = {name: item for name, item in value.items() if name not in parts}
        sound[key] = value
    return sound


def _permission_list(permissions: str | list[str]) -> list[str]:
    """A space's permissions as a list: a string holds one, or several separated by spaces."""
    if isinstance(permissions, str):
        return list(dict.fromkeys(permissions.split()))
    return permissions


def _shared_problems(shared: dict[str, list[str]]) -> list[str]:
    return [
        f"shared/{space}: {permission!r} is not one of {list(SHARED_PERMISSIONS)}"
        for space, permissions in shared.items()
        for permission in permissions
        if permission not in SHARED_PERMISSIONS
    ]


def _search_path_problems(shared: dict[str, list[str]]) -> list[str]:
    """The agent's ``CTX_PATH`` lists ``/ctx/shared/<space>/tool`` for each space it may read
    (T-4): refused here when the kernel would start none of its tools with it (E2BIG), rather
    than every call failing later."""
    readable = [s for s, permissions in shared.items() if "read" in permissions]
    longest = agent_ctx_path(MAX_ID, readable)  # the uid is not known yet: the longest one's
    size = len(f"CTX_PATH={longest}".encode())
    if size < MAX_ARG_STRLEN:
        return []
    spaces = len(spaces_with_tiers(readable))
    return [
        f"shared: the {spaces} spaces it may read make a CTX_PATH of {size} bytes (one "
        f"{CTX_MOUNT}/shared/<space>/tool entry each), more than the {MAX_ARG_STRLEN} the "
        "kernel passes a program in one variable (E2BIG), so none of its tools could start: "
        "grant read on fewer spaces"
    ]


def _name_problems(document: dict[str, Any]) -> list[str]:
    problems = []
    name_problem = object_name_problem(document["name"]) if "name" in document else ""
    if name_problem:
        problems.append(f"name: {name_problem}")
    try:
        if "label" in document:
            check_subject_type(document["label"])
    except CtxError as exc:
        problems.append(f"label: {exc.message}")
    checks = [("model", model) for model in document.get("model", [])]
    checks += [("tool", tool) for tool in document.get("tools", [])]
    checks += [("shared", space) for space in document.get("shared", {})]
    for object_class, name in checks:
        problem = policy_object_name_problem(object_class, name)
        if problem:
            problems.append(problem)
    return problems


def _mount_problems(mounts: list[list[str]], storage_root: Path) -> list[str]:
    table, malformed = parse_mount_entries(list(mounts))
    problems = [f"mount: {problem}" for problem in malformed]
    seen: dict[str, PurePosixPath] = {}
    root = PurePosixPath(os.path.realpath(storage_root))
    for mount in table:
        source = PurePosixPath(os.path.realpath(mount.source))
        if source == root:
            # The whole root, raw: every agent's controls and sessions, past the filtered
            # view an agent is given of it (T-5).  (A directory above it, a home holding the
            # user's default root, is the administrator's choice.)
            problems.append(whole_root_problem(mount.source))
        problem = object_name_problem(mount.name)
        # No request mounts /ctx: the host adds the storage root's own mount there.
        target_refused = target_problem(mount, storage_root=PurePosixPath())
        if target_refused:
            problems.append(target_refused)
        elif problem:
            problems.append(
                f"mount target {mount.target}: its last part names it in policy, and {problem}"
            )
        elif mount.name == CTX_MOUNT.name and mount.target != CTX_MOUNT:
            problems.append(
                f"mount target {mount.target}: the name {CTX_MOUNT.name!r} belongs to the "
                f"storage view at {CTX_MOUNT}"
            )
        elif mount.name in seen:
            problems.append(
                f"mount targets {seen[mount.name]} and {mount.target} share the name "
                f"{mount.name!r}; policy names a mount by the last part of its target"
            )
        seen.setdefault(mount.name, mount.target)
    # Measured as the mount control records the sources: as real paths, which a link makes
    # longer than the path written.
    size = len(json.dumps([[os.path.realpath(m.source), str(m.target), "rw"] for m in table]))
    if size > MAX_MOUNTS_ENVIRONMENT:
        problems.append(
            f"mount: its {len(table)} mounts take {size} bytes of CTX_MOUNTS, the environment "
            f"variable every tool of the agent is started with, which also lists what the "
            f"storage view at {CTX_MOUNT} shows; the kernel starts no program with a variable "
            f"over {MAX_ARG_STRLEN} bytes (E2BIG): keep the mounts within "
            f"{MAX_MOUNTS_ENVIRONMENT} bytes (fewer mounts, or a common parent mounted once)"
        )
    return problems


def _describe(error: ValidationError) -> str:
    path = "/".join(str(part) for part in error.absolute_path)
    return f"{path or 'request'}: {brief_message(error)}"
