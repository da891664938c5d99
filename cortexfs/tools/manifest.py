"""Object manifests, version 2 (SPEC T-8): what ``ctx object check`` validates and installs.

A v2 manifest is one JSON object::

    {
      "manifest": 2,
      "kind": "tool",
      "name": "fs.read",                          an object name (R-3)
      "description": "Read a file …",
      "schema": {"type": "object", …},            the input JSON Schema; must be a valid schema
      "cap": {"side_effects": false, "network": false},   declared facts (see below)
      "exec": "bin/fs-read",                      the program, relative to the manifest …
      "mcp": {"transport": "stdio", …},           … or the locator of an MCP-backed tool (M-4)
      "program": {"type": "object", …}            optional success-result schema (C-2)
    }

``cap`` is any JSON object of declared facts.  ``side_effects`` and ``network``, when present,
are booleans; a fact left out counts as the cautious value (side effects possible, network
possible: :func:`cortexfs.tools.controls.cap_fact`).  Facts describe; they grant nothing.

Exactly one of ``exec`` and ``mcp``.  Nothing in a manifest grants anything: there is no
policy field, and the installed ``policy`` control starts empty (default deny, P-2).
:func:`load_manifest` lists *every* reason a manifest is invalid, not just the first.

An install run as root must not become a reader for the manifest's author: the program is
read once, with the manifest, from below the manifest's directory and never through a
symbolic link, and one the author could not read by the mode bits of the file and of every
directory on the way to it, from ``/`` down, is refused (:func:`_read_program`).  Those bytes
are what check reports on and install writes.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, NoReturn

from cortexfs import jsontext
from cortexfs.errors import HOST_SHORTAGES, CtxError, invalid
from cortexfs.mcp.config import config_path_problem
from cortexfs.names import object_name_problem
from cortexfs.policy.controls import control_limit
from cortexfs.regular_file import read_regular_file_and_status
from cortexfs.tools.install_failure import advice
from cortexfs.tools.schemas import brief_message, schema_problems

if TYPE_CHECKING:
    from jsonschema import ValidationError

MANIFEST_VERSION = 2
MAX_MANIFEST_BYTES = 1024 * 1024
MAX_PROGRAM_BYTES = 64 * 1024 * 1024

# The shape of a manifest; names, embedded schemas and the exec file are checked in code so
# that each problem gets a sentence of its own.
MANIFEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["manifest", "kind", "name", "description", "schema", "cap"],
    "additionalProperties": False,
    "properties": {
        "manifest": {"const": MANIFEST_VERSION},
        "kind": {"const": "tool"},
        "name": {"type": "string"},
        "description": {"type": "string", "minLength": 1, "maxLength": 8192},
        "schema": {"type": "object"},
        "cap": {
            "type": "object",
            "properties": {"side_effects": {"type": "boolean"}, "network": {"type": "boolean"}},
        },
        "exec": {"type": "string", "minLength": 1},
        "mcp": {
            "type": "object",
            "required": ["transport", "config", "server", "tool"],
            "additionalProperties": False,
            "properties": {
                "transport": {"const": "stdio"},
                "config": {"type": "string", "pattern": "^/"},
                "server": {"type": "string"},
                "tool": {"type": "string"},
            },
        },
        "program": {"type": "object"},
    },
}


class ManifestError(CtxError):
    """A manifest refused; :attr:`problems` holds every reason and :attr:`codes` the errno of
    each: EINVAL for what is wrong with the manifest, ELOOP or EACCES for a program that was
    not read (a link on the way to it, or a file its author could not read).  The error's own
    errno is EINVAL when the manifest is invalid at all, else the refusal's."""

    def __init__(
        self, source: str, problems: Sequence[str], codes: Sequence[int] | None = None
    ) -> None:
        codes = tuple(codes) if codes is not None else (errno.EINVAL,) * len(problems)
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        code = errno.EINVAL if errno.EINVAL in codes else codes[0]
        super().__init__(code, f"{source}: {problems[0]}{more}")
        self.source = source
        self.problems = tuple(problems)
        self.codes = codes


@dataclass(frozen=True)
class Manifest:
    """A valid v2 manifest, with the bytes of its ``exec`` program as they were read, once,
    when the manifest was: what ``ctx object check`` judged, the review saw and ``ctx object
    install`` writes are the same bytes, whatever the file holds by then."""

    source: Path
    name: str
    description: str
    schema: dict[str, Any]
    cap: dict[str, Any]
    exec_path: Path | None
    mcp: dict[str, str] | None
    program: dict[str, Any] | None
    executable: bytes | None = None

    def controls(self) -> dict[str, bytes]:
        """The controls this manifest defines, as files of the installed ``<name>.d/``."""
        files = {
            "name": f"{self.name}\n".encode(),
            "description": f"{self.description.rstrip()}\n".encode(),
            "schema": _json_file(self.schema),
            "cap": _json_file(self.cap),
        }
        if self.program is not None:
            files["program"] = _json_file(self.program)
        if self.mcp is not None:
            files["mcp"] = _json_file(self.mcp)
        return files

    def read_program(self) -> bytes:
        """The bytes of the ``exec`` program; an MCP-backed tool has none (ENOSYS: it is
        installed with the bridge built into ctx, see ``install_manifest``)."""
        if self.executable is None:
            raise CtxError(errno.ENOSYS, f"{self.name} is MCP-backed: it has no program of its own")
        return self.executable


@dataclass(frozen=True)
class _Origin:
    """Where a manifest was read from, for reading its program from the same place.

    ``directory``: a descriptor of the directory the manifest was read from (None: open
    ``source``'s parent when a relative ``exec`` needs it).  ``authors``: the uids other than
    root and the installer that own the manifest file or a link to it, for whom the installer
    must not become a reader; empty for a document of the caller's own."""

    source: Path
    directory: int | None = None
    authors: frozenset[int] = frozenset()


def names_a_directory(path: str) -> bool:
    """Whether ``path`` is ``.`` or ends in ``/`` or ``/.``: the kernel then takes the name
    before it for a directory's, and answers ENOTDIR for a file there, where
    :class:`~pathlib.Path`, which drops both, would name the file (and ``.`` names no file at
    all to it: its name is empty)."""
    return path == "." or path.endswith(("/", "/."))


def load_manifest(path: Path | str) -> Manifest:
    """Read and validate the manifest at ``path``; :class:`ManifestError` lists every problem.

    The manifest is read as a regular file (a final link followed: it is the file the caller
    named), at most :data:`MAX_MANIFEST_BYTES`, never waiting on a FIFO; its program is read
    from the directory the manifest was read from (:func:`_read_program`).  A ``path`` given
    as text that :func:`names_a_directory` names no manifest: ENOTDIR for a file there, as
    the kernel says, EINVAL for a directory."""
    source = str(path)
    if names_a_directory(source):
        _refuse_a_directory_name(source)
    path = Path(path)
    try:
        directory = os.open(path.parent, _PLACE | os.O_DIRECTORY)
    except OSError as exc:
        raise _unreadable(source, exc) from None
    try:
        data, authors = _read_manifest_file(path, directory)
        origin = _Origin(path, directory, authors)
        try:
            document = jsontext.loads_strict(data)
        except jsontext.DuplicateNames as exc:
            # A reviewer could approve one `exec` while another is installed: every problem
            # of the manifest as Python reads it is listed too, so that one round fixes them.
            document = jsontext.loads_strict(data, unique_names=False)
            problems, codes, _ = _problems_and_program(document, origin)
            first = f"the manifest {jsontext.duplicate_names_problem(exc.names)}"
            raise ManifestError(source, [first, *problems], [errno.EINVAL, *codes]) from None
        except jsontext.NotAJsonNumber as exc:
            raise ManifestError(source, [f"not JSON: {exc} is not a JSON number"]) from None
        except UnicodeDecodeError as exc:
            problem = f"not UTF-8, as JSON is: {exc.reason} at byte {exc.start}"
            raise ManifestError(source, [problem]) from None
        except ValueError as exc:
            raise ManifestError(source, [f"not JSON: {exc}"]) from None
        return _parse(document, origin)
    finally:
        os.close(directory)


def _refuse_a_directory_name(source: str) -> NoReturn:
    """Refuse the manifest ``source``, a name ending in ``/``, with what the kernel answers."""
    try:
        os.stat(source)
    except OSError as exc:
        raise _unreadable(source, exc) from None
    raise _not_a_regular_file(source)


def _not_a_regular_file(source: str) -> CtxError:
    return invalid(
        f"{source} is not a regular file (a FIFO, device or directory); give a manifest file; "
        "nothing was read from it"
    )


def _read_manifest_file(path: Path, directory: int) -> tuple[bytes, frozenset[int]]:
    """The manifest's bytes and its authors (see :class:`_Origin`)."""
    source = str(path)
    try:
        data, status = read_regular_file_and_status(
            path.name, MAX_MANIFEST_BYTES, follow_link=True, dir_fd=directory
        )
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            raise ManifestError(
                source, [f"a manifest is at most {MAX_MANIFEST_BYTES} bytes"]
            ) from None
        if exc.errno == errno.EINVAL:
            raise _not_a_regular_file(source) from None
        raise _unreadable(source, exc) from None
    owners = {status.st_uid}
    try:
        named = os.stat(path.name, dir_fd=directory, follow_symlinks=False)
    except OSError:
        named = None
    if named is not None and stat.S_ISLNK(named.st_mode):
        owners.add(named.st_uid)
    return data, frozenset(owners - {0, os.geteuid()})


def parse_manifest(document: object, *, source: Path) -> Manifest:
    """Validate a decoded manifest of the caller's own and read its program once: a relative
    ``exec`` from ``source``'s directory, as :func:`load_manifest` reads it."""
    return _parse(document, _Origin(source))


def _parse(document: object, origin: _Origin) -> Manifest:
    problems, codes, executable = _problems_and_program(document, origin)
    if problems:
        raise ManifestError(str(origin.source), problems, codes)
    assert isinstance(document, dict)
    exec_value = document.get("exec")
    manifest = Manifest(
        source=origin.source,
        name=document["name"],
        description=document["description"],
        schema=document["schema"],
        cap=document["cap"],
        exec_path=None if exec_value is None else _exec_path(exec_value, origin.source.parent),
        mcp=document.get("mcp"),
        program=document.get("program"),
        executable=executable,
    )
    # Judged as install writes them (indented JSON can be several times the manifest's
    # bytes), so that what check calls valid install does not refuse.
    oversized = oversized_controls(manifest.controls())
    if oversized:
        raise ManifestError(str(origin.source), oversized, [errno.EFBIG] * len(oversized))
    return manifest


def oversized_controls(controls: dict[str, bytes]) -> list[str]:
    """Why each of ``controls`` (name: bytes as installed) is over the size a control of its
    name may hold (:func:`cortexfs.policy.controls.control_limit`); empty when none is."""
    problems = []
    for name, data in controls.items():
        limit = control_limit(PurePosixPath(name))
        if len(data) > limit:
            problems.append(
                f"its {name} control would hold {len(data)} bytes as installed, more than "
                f"the {limit} bytes a control may hold; make it smaller"
            )
    return problems


def manifest_problems(document: object, base: Path) -> list[str]:
    """Every reason ``document``, a manifest of the caller's own in directory ``base``, is not
    a valid v2 manifest; empty when it is one."""
    return _problems_and_program(document, _Origin(base / "manifest"))[0]


def _problems_and_program(
    document: object, origin: _Origin
) -> tuple[list[str], list[int], bytes | None]:
    """Every problem of ``document`` with its errno, and the bytes of its ``exec`` program when
    that could be read."""
    problems = _document_problems(document)
    codes = [errno.EINVAL] * len(problems)
    executable = None
    if (
        isinstance(document, dict)
        and isinstance(document.get("exec"), str)
        and document["exec"]
        and "\0" not in document["exec"]
        and jsontext.lone_surrogate(document["exec"]) is None
    ):
        read = _read_program(document["exec"], origin)
        if isinstance(read, bytes):
            executable = read
        else:
            problems.append(read[1])
            codes.append(read[0])
    return problems, codes, executable


def _document_problems(document: object) -> list[str]:
    import jsonschema  # here: about 100 ms that no other command of ctx needs

    validator = jsonschema.Draft202012Validator(MANIFEST_SCHEMA)
    problems = [_describe(error) for error in validator.iter_errors(document)]
    if not isinstance(document, dict):
        return problems
    for field, value in document.items():
        character = jsontext.lone_surrogate([field, value])
        # JSON can spell one ("\\ud800"), but no control, name or path can hold it; the
        # schema and the program say so as schemas (schema_problems).
        if character is not None and field not in ("schema", "program"):
            problems.append(f"{field}: holds {character!r}, a lone surrogate, not a character")
    if isinstance(document.get("exec"), str) and "\0" in document["exec"]:
        problems.append("exec: holds a NUL character, which no path can hold")
    name = document.get("name")
    if isinstance(name, str):
        problem = object_name_problem(name)
        if problem:
            problems.append(f"name: {problem}")
    description = document.get("description")
    if isinstance(description, str) and description and not description.strip():
        # Installed with its trailing blanks cut, it would be an empty control (T-1).
        problems.append("description: only blanks; say what the tool does")
    if isinstance(document.get("schema"), dict):
        problems += schema_problems(document["schema"], "schema")
    if isinstance(document.get("program"), dict):
        problems += schema_problems(document["program"], "program")
    has_exec, has_mcp = "exec" in document, "mcp" in document
    if has_exec == has_mcp:
        problems.append("a manifest names exactly one of 'exec' (a program) and 'mcp'")
    if isinstance(document.get("mcp"), dict):
        problems += _mcp_problems(document["mcp"], name)
    return problems


def _describe(error: ValidationError) -> str:
    path = "/".join(str(part) for part in error.absolute_path)
    if error.validator == "additionalProperties" and not path:
        return f"{brief_message(error)}; a v2 manifest has no such field"
    return f"{path or 'manifest'}: {brief_message(error)}"


def _exec_path(value: str, base: Path) -> Path:
    return Path(value) if os.path.isabs(value) else base / value


# O_PATH: a descriptor that only names a place, for walking; no permission on it is needed.
_PLACE = os.O_PATH | os.O_CLOEXEC


def _read_program(value: str, origin: _Origin) -> bytes | tuple[int, str]:
    """The bytes of the program ``exec`` names, read once; else ``(errno, problem)``.

    A relative ``exec`` is walked from the manifest's directory one component at a time,
    never through a symbolic link (ELOOP, naming the link): a link would let whoever wrote
    the manifest hand the installer any file it may read.  An absolute one, or one climbing
    out with ``..``, is read only for a manifest of the installer's (or root's) own, through
    the links of the path but never a final link; another uid's is refused (EACCES).  The
    program is read as a regular file (a FIFO is not waited on), at most
    :data:`MAX_PROGRAM_BYTES`, and then judged on the mode bits of that file and of every
    directory above it, up to ``/``: one the manifest's other author could not read, or could
    not reach (a private directory of someone else's inside a shared one, a home of mode
    0700), is refused (EACCES), for root must not read on their behalf what every agent would
    read once installed."""
    shown: Path | str = _exec_path(value, origin.source.parent)
    parts = [part for part in value.split("/") if part not in ("", ".")]
    outside = value.startswith("/") or ".." in parts
    if outside and origin.authors:
        return errno.EACCES, (
            f"exec: {value} is outside the manifest's directory, and the manifest "
            f"{origin.source} belongs to {_uids(origin.authors)}, not to {_installer()}: "
            "another uid's manifest may name only a program below "
            "its own directory; put the program there, or install as that uid"
        )
    if not parts:
        return errno.EINVAL, f"exec: {shown} is not a regular file (a FIFO, device or directory)"
    if names_a_directory(value):
        shown = f"{shown}/"  # as the kernel reads it: the slash the walk drops decides
    absolute = value.startswith("/")
    try:
        if absolute:
            # The installer's own choice of path: its directories are taken as they resolve.
            directory = os.open("/" + "/".join(parts[:-1]), _PLACE | os.O_DIRECTORY)
        elif origin.directory is None:
            directory = os.open(origin.source.parent, _PLACE | os.O_DIRECTORY)
        else:
            directory = origin.directory
    except OSError as exc:
        return _refusal(exc, origin, shown, value, None)
    owned = directory != origin.directory  # the manifest's own is closed by its reader
    try:
        for depth, part in enumerate([] if absolute else parts[:-1]):
            try:
                inner = os.open(part, _PLACE | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory)
            except OSError as exc:
                walked = "/".join(parts[: depth + 1])
                return _refusal(exc, origin, shown, walked, _link_target(directory, part))
            passed, passed_owned = directory, owned
            directory, owned = inner, True  # before the close, as in the walks of beneath.py
            if passed_owned:
                os.close(passed)
        if names_a_directory(value):
            return _named_as_a_directory(directory, parts[-1], origin, shown, value)
        try:
            data, status = read_regular_file_and_status(
                parts[-1], MAX_PROGRAM_BYTES, dir_fd=directory
            )
        except OSError as exc:
            return _refusal(exc, origin, shown, value, _link_target(directory, parts[-1]))
        barred = {author: _closed_directory(author, directory) for author in origin.authors}
    finally:
        if owned:
            os.close(directory)
    for author in sorted(origin.authors):
        if barred[author] is not None:
            return errno.EACCES, (
                f"exec: {shown}: uid {author}, who owns the manifest {origin.source}, may not "
                f"pass {barred[author]}, so it could not read the program; an installed tool is "
                f"readable by every agent, so it is not installed for them: put the program "
                f"where uid {author} can reach it (every directory above it searchable by that "
                f"uid's mode bits), or install as uid {author}{_unknown_groups(author)}"
            )
        if not _readable_by(author, status):
            return errno.EACCES, (
                f"exec: {shown} (uid {status.st_uid}, gid {status.st_gid}, mode "
                f"{stat.S_IMODE(status.st_mode):04o}) is not readable by uid {author}, who owns "
                f"the manifest {origin.source}; an installed tool is readable by every agent, "
                f"so it is not installed for them: make it readable to uid {author} (by its "
                f"mode bits), or install as uid {author}{_unknown_groups(author)}"
            )
    return data


def _named_as_a_directory(
    directory: int, name: str, origin: _Origin, shown: Path | str, value: str
) -> tuple[int, str]:
    """The problem of an ``exec`` ending in ``/``: it names the directory ``name`` in
    ``directory``, never a program; the kernel's answer (ENOTDIR for a file, ELOOP for a link)
    is said as the walk's are, and a directory is no regular file."""
    try:
        os.close(os.open(name, _PLACE | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=directory))
    except OSError as exc:
        return _refusal(exc, origin, shown, value, _link_target(directory, name))
    return errno.EINVAL, f"exec: {shown} is not a regular file (a FIFO, device or directory)"


def _refusal(
    exc: OSError, origin: _Origin, shown: Path | str, component: str, link: str | None
) -> tuple[int, str]:
    """The problem of an ``exec`` that could not be read; ``link`` is the target of the
    component (the file, when the walk got there) that is a symbolic link, if one is.  What
    the host ran short of (EMFILE, ENOMEM) says nothing of the manifest: it is raised."""
    if exc.errno in HOST_SHORTAGES:
        raise _unreadable(f"{shown}, the program of {origin.source}", exc)
    if link is not None:
        return errno.ELOOP, (
            f"exec: {shown}: {component} is a symbolic link (to {link}), which is never "
            "followed to a program: it could hand over a file the manifest's author may not "
            "read; name the file itself"
        )
    if exc.errno == errno.EINVAL:
        return errno.EINVAL, f"exec: {shown} is not a regular file (a FIFO, device or directory)"
    if exc.errno == errno.EFBIG:
        return errno.EINVAL, f"exec: {shown} is larger than {MAX_PROGRAM_BYTES} bytes"
    if exc.errno == errno.EACCES:
        return errno.EACCES, f"exec: {shown} is not readable"
    return errno.EINVAL, f"exec: {shown}: {exc.strerror}"


def _unreadable(what: object, exc: OSError) -> CtxError:
    """The error of a manifest or program that could not be read: nothing was read or
    installed, and, for what the host ran short of, what to free first."""
    code = exc.errno or errno.EIO
    fix = f": {advice(code)}" if code in HOST_SHORTAGES else ""
    return CtxError(
        code, f"cannot read {what}: {exc.strerror}; nothing was checked or installed{fix}"
    )


def _link_target(directory: int, name: str) -> str | None:
    """What the symbolic link ``name`` in ``directory`` points to; None when it is none."""
    try:
        return os.readlink(name, dir_fd=directory)
    except OSError:
        return None


def _readable_by(uid: int, status: os.stat_result) -> bool:
    """Whether the mode bits of ``status`` let ``uid`` read it, as the kernel judges them:
    the owner's bits for its owner, the group's for a member, the others' for the rest."""
    return _granted(uid, status, (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH))


def _searchable_by(uid: int, status: os.stat_result) -> bool:
    """Whether the mode bits of ``status``, a directory, let ``uid`` pass it (search, x)."""
    return _granted(uid, status, (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH))


def _granted(uid: int, status: os.stat_result, bits: tuple[int, int, int]) -> bool:
    if uid == 0:
        return True
    owner, group, others = bits
    if status.st_uid == uid:
        return bool(status.st_mode & owner)
    if status.st_gid in _groups_of(uid):
        return bool(status.st_mode & group)
    return bool(status.st_mode & others)


def _closed_directory(uid: int, directory: int) -> str | None:
    """The first directory, from ``directory`` up to ``/``, that ``uid`` may not pass by its
    mode bits (its path, owner and mode, to name it), or None when it may pass them all.

    Walked up through ``..`` from the descriptor the program was read through, so it judges
    the directories the program was read from, whatever links the path named to reach them."""
    current = os.open(".", _PLACE | os.O_DIRECTORY, dir_fd=directory)
    try:
        while True:
            status = os.fstat(current)
            if not _searchable_by(uid, status):
                return (
                    f"{_path_of(current)} (uid {status.st_uid}, gid {status.st_gid}, mode "
                    f"{stat.S_IMODE(status.st_mode):04o})"
                )
            parent = os.open("..", _PLACE | os.O_DIRECTORY, dir_fd=current)
            above = os.fstat(parent)
            # Rebound before the close: the cleanup after a Ctrl-C between the two must not
            # close this one again.
            passed, current = current, parent
            os.close(passed)
            if (above.st_dev, above.st_ino) == (status.st_dev, status.st_ino):
                return None  # "/": its own parent
    finally:
        os.close(current)


def _path_of(directory: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{directory}")
    except OSError:
        return "a directory above it"


def _groups_of(uid: int) -> frozenset[int]:
    """The groups the password and group databases give ``uid``; none for a uid they do not
    know (an agent's uid may have no entry), so that a group's bits never count by guess."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return frozenset()
    return frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))


def _unknown_groups(uid: int) -> str:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return f" (uid {uid} has no entry in the password database: no group's bits count for it)"
    return ""


def _installer() -> str:
    uid = os.geteuid()
    return "you (uid 0)" if uid == 0 else f"you (uid {uid}) or root"


def _uids(uids: frozenset[int]) -> str:
    return " and ".join(f"uid {uid}" for uid in sorted(uids))


def _mcp_problems(locator: dict[str, Any], name: object) -> list[str]:
    """M-3: an MCP-backed tool is named exactly ``<server>.<remote_tool>``.

    The server is an object name of its own (a key of the configuration, named in tool
    names); the remote tool's name need only make that whole name legal (R-3), so a server's
    ``-dash`` is projected as ``srv.-dash``."""
    problems = []
    config = locator.get("config")
    if isinstance(config, str) and config.startswith("/"):  # the schema wants the '/'
        problem = config_path_problem(config)
        if problem:
            problems.append(f"mcp/config: {problem}")
    server, remote = locator.get("server"), locator.get("tool")
    if not (isinstance(server, str) and isinstance(remote, str)):
        return problems
    problem = object_name_problem(server)
    if problem:
        problems.append(f"mcp/server: {problem}")
    if not remote:
        problems.append("mcp/tool: the remote tool's name must not be empty")
    if name != f"{server}.{remote}":
        problems.append(
            f"name: an MCP-backed tool is named '{server}.{remote}' (M-3), not {name!r}"
        )
    return problems


def _json_file(value: object) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
