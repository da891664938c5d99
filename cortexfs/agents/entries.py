"""An agent's executable entry ``agent/<name>`` (SPEC A-3): what ``ctx agent create`` writes
there, and how ``ctx bootstrap`` brings the entries another install of ctx wrote up to date.

The entry is a five-line Python script that names the interpreter of the install that wrote it
and the storage root it was written for.  After an upgrade into a new environment, or a root
moved to another path, an old entry still runs the old install's ``ctx agent start`` on the
old path — or nothing at all once that environment is gone (exit 127).  Bootstrap rewrites an
entry that has exactly the shape ``ctx agent create`` gives it when it names another
interpreter, or a root that is not this directory; the same root reached through another path
(``storage/current`` is a link) is this root, and its entries are left as they are.  Any other
program in an entry's place is left alone: an administrator may have put their own entry
there, and it is theirs (R-5).
"""

from __future__ import annotations

import ast
import errno
import os
import re
import stat
import sys
from pathlib import Path
from typing import NamedTuple

from cortexfs import bootstrap_repair, durable, storage
from cortexfs.errors import CtxError
from cortexfs.names import is_object_name
from cortexfs.regular_file import read_regular_file
from cortexfs.tools.pairs import repair_staged

ENTRY_MODE = 0o755
_LARGEST_ENTRY = 64 * 1024  # far more than any entry ctx writes: what is longer is not one


def agents_directory(root: Path) -> Path:
    """``root``'s own ``agent/`` directory, where agents are made and listed: ELOOP naming it
    when it is a symbolic link, which is never followed (R-2: a link there would make and list
    the agents of whatever tree it leads to, as ``ctx bootstrap`` reports it); ENOENT naming
    ``ctx bootstrap`` when there is none (:func:`storage.require_agents_directory`)."""
    storage.require_root(root)
    agents = root / "agent"
    if os.path.islink(agents):
        raise CtxError(errno.ELOOP, linked_agents_directory(agents))
    return storage.require_agents_directory(root)


def linked_agents_directory(agents: Path) -> str:
    """What a symbolic link at ``agents`` (a root's ``agent/``) is, and what to do about it."""
    return (
        f"{agents} is a symbolic link, never followed: the agents of a storage root are those "
        "of its own directory agent/ (R-2); put the directory the link leads to in its place"
    )


def entry_program(root: Path, name: str) -> bytes:
    """The agent's executable entry, run by the host: ``ctx agent start <name>`` (A-1)."""
    return _entry_text(sys.executable, repr(str(root)), name).encode()


class WrittenEntry(NamedTuple):
    """What an entry ``ctx agent create`` wrote runs: an interpreter, on a storage root."""

    interpreter: str
    root: str


def written_by_ctx(program: bytes, name: str) -> WrittenEntry | None:
    """What ``program`` runs when it is an entry ``ctx agent create`` wrote for agent ``name``,
    by any install of ctx and for a storage root at any path; None when it is not one."""
    try:
        text = program.decode()
    except UnicodeDecodeError:
        return None
    # Neither marker can occur in an object name, nor does re.escape change it.
    shape = re.escape(_entry_text("<interpreter>", "<root>", name))
    shape = shape.replace("<interpreter>", r"(?P<interpreter>/[^\n]+)", 1)
    shape = shape.replace("<root>", r"(?P<root>[^\n]+)", 1)
    written = re.fullmatch(shape, text)
    if written is None:
        return None
    try:
        root = ast.literal_eval(written["root"])
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        # An expression nested past the parser's limits (a hand-edited entry of
        # ``1+1+…``) is no string literal either, not a failure of bootstrap.
        root = None
    # An entry of this shape whose root is no string literal runs nothing: it is one to rewrite.
    return WrittenEntry(written["interpreter"], root if isinstance(root, str) else "")


def _entry_text(interpreter: str, root_literal: str, name: str) -> str:
    arguments = f"['--storage', {root_literal}, 'agent', 'start', {name!r}]"
    return (
        f"#!{interpreter} -I\n"
        f'"""Agent {name}: its executable entry (SPEC A-3), written by ctx agent create."""\n'
        "import sys\n"
        "from cortexfs.cli import main\n"
        f"main([*{arguments}, *sys.argv[1:]], prog_name='ctx')\n"
    )


def refresh_entries(root: Path, source: Path | None, report: storage.BootstrapReport) -> None:
    """The bootstrap step: every ``agent/<name>`` written by ``ctx agent create`` for another
    install of ctx or another path of this root is rewritten as this install writes it, whole
    and durably (a new file renamed over the old one), and reported as repaired; then the
    ``agent/`` pairs are repaired as a tool tier's are (:func:`repair_staged`).

    Nothing is written into an ``agent/`` another uid could change: whoever could write it could
    have swapped two agents' entries, and the root's step reports it (see
    :func:`cortexfs.storage._tighten_root_abi`)."""
    directory = root / "agent"
    owner = bootstrap_repair.storage_owner(root)
    ops = durable.default_ops()
    try:
        directory_fd = durable.open_dir_path(ops, str(directory))
    except FileNotFoundError:
        return  # the root's step reported the missing directory
    except CtxError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            return  # a link or a file in its place: the root's step reported that too
        raise
    try:
        if bootstrap_repair.untrusted(os.fstat(directory_fd), owner):
            return
        names = sorted(os.listdir(directory_fd))
        for name in names:
            if is_object_name(name):
                with report.step(f"agent/{name}", directory / name):
                    _refresh_entry(ops, directory_fd, root, name, report)
        if not names:
            return  # nothing to repair: an empty agent/ is left empty, without a lock file
        with report.step("agent", directory):
            # Imported here: cortexfs.agents.create imports this module for entry_program.
            from cortexfs.agents.create import AGENT_KIND

            # An interrupted ctx agent create is finished or discarded, and an agent's log an
            # earlier create left root's in a root another uid owns is given to that owner,
            # who records in it (as for the tools' logs).
            report.repaired += repair_staged(directory, AGENT_KIND, ops, host=owner)
        report.warnings += _halves_of_agents(sorted(os.listdir(directory_fd)))
    finally:
        os.close(directory_fd)


def _halves_of_agents(names: list[str]) -> list[str]:
    """A warning for each agent of which only the entry or only its controls are left (the
    other removed by hand: an install cut short was settled before): no agent, and nothing
    bootstrap may make up, but a name ``ctx agent create`` refuses until it is moved away."""
    entries = {name for name in names if is_object_name(name)}
    controls = {name[:-2] for name in names if name.endswith(".d") and is_object_name(name[:-2])}
    warnings = []
    for name in sorted(entries ^ controls):
        left, missing = (name, f"{name}.d") if name in entries else (f"{name}.d", name)
        warnings.append(
            f"agent/{left} is left without agent/{missing}, so there is no agent {name}; move "
            f"agent/{left} away, then 'ctx agent create' makes the agent again"
        )
    return warnings


def _refresh_entry(
    ops: durable.FsOps, directory_fd: int, root: Path, name: str, report: storage.BootstrapReport
) -> None:
    status = durable.lstat_at(directory_fd, name)
    if status is None or not stat.S_ISREG(status.st_mode):
        return  # an agent's controls, or no entry ctx wrote: not bootstrap's to replace
    try:
        program = read_regular_file(name, _LARGEST_ENTRY, dir_fd=directory_fd)
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            return
        raise
    written = written_by_ctx(program, name)
    if written is None:
        return
    if written.interpreter == sys.executable and _same_directory(written.root, root):
        return
    durable.replace_file_synced(ops, directory_fd, name, entry_program(root, name), ENTRY_MODE)
    report.repaired.append(f"agent/{name}")


def _same_directory(path: str, root: Path) -> bool:
    """Whether ``path`` names the directory ``root`` is, by whatever links either goes."""
    try:
        named, this = os.stat(path), os.stat(root)
    except (OSError, ValueError):
        return False  # a root no longer there, or no path at all
    return (named.st_dev, named.st_ino) == (this.st_dev, this.st_ino)


storage.register_bootstrap_step(refresh_entries)
