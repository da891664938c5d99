"""``CTX_PATH``: how a tool name becomes a tool object (SPEC T-4).

The search goes left to right; the first directory holding an *executable regular file* of
that name wins.  "Executable" means the file has an execute bit at all (owner, group or other):
a file with none, a directory, a symlink or anything else of that name is not a hit and the
search goes on.  Whether a given agent may execute the hit is not the search's question: the
authority chain answers it at step 2 (mode bits, EACCES), so a tool an agent may not run is
refused with the reason instead of being reported missing, and ``ctx object which``, the
runner and ``ctx policy explain`` all name the same file.  The control directory is ``<that
directory>/<name>.d/``: never one found in another directory of the path.

Where the path comes from:

* a standalone human (``ctx object which``, a human ``tsh``): ``CTX_PATH=`` in
  ``$CTX_HOME/.tshrc`` when present and not empty (a ``KEY=VALUE`` data file, never executed;
  other lines are ignored with a warning), else the process's ``CTX_PATH``, else
  ``/ctx/tool:/ctx/home/<uid>/tool``.  ``CTX_HOME`` defaults to
  ``/ctx/home/<uid>``.
* an agent: the runtime derives it from the agent's uid and policy
  (:meth:`cortexfs.agents.view.AgentView.search_path`) and it is authoritative.

Entries are absolute paths; empty and relative entries are ignored (an empty ``PATH`` entry
meaning "the current directory" is a classic way to run the wrong program).  ``/ctx/…`` names
the CortexFS view: when ``/ctx`` is not a mount point on this host, it is mapped onto the
storage root, so ``/ctx/tool`` is ``<root>/tool``.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from cortexfs import keyvalue
from cortexfs.errors import CtxError, invalid, not_found
from cortexfs.names import check_object_name
from cortexfs.printable import printable, shell_word
from cortexfs.regular_file import read_regular_file

CTX_MOUNT = PurePosixPath("/ctx")
DEFAULT_CTX_PATH = "/ctx/tool:/ctx/home/{uid}/tool"
TSHRC = ".tshrc"
_MAX_TSHRC_BYTES = 64 * 1024
_TIER_LOCATION = re.compile(r"tool|home/[0-9]+/tool|shared/[^/]+/tool")

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

IsExecutable = Callable[[Path, os.stat_result], bool]
Warn = Callable[[str], None]


class SearchPath(NamedTuple):
    """A search path as written (``entries``), where it came from, and its directories."""

    entries: tuple[str, ...]
    source: str
    directories: tuple[Path, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "ctx_path": ":".join(self.entries),
            "source": self.source,
            "directories": [str(directory) for directory in self.directories],
        }


class Resolution(NamedTuple):
    """Where a name resolved: the winning directory, and the earlier non-hits with reasons."""

    name: str
    directory: Path
    skipped: Sequence[str] = ()

    @property
    def executable(self) -> Path:
        return self.directory / self.name

    @property
    def control_dir(self) -> Path:
        return self.directory / f"{self.name}.d"

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name,
            "path": str(self.executable),
            "controls": str(self.control_dir),
            "skipped": list(self.skipped),
        }


def human_search_path(
    root: Path,
    *,
    uid: int,
    environ: Mapping[str, str],
    warn: Warn | None = None,
    tshrc: bool = True,
) -> SearchPath:
    """The search path of a standalone human (T-4 sources 1 to 3; ``tshrc=False`` leaves
    out the first, for a shell that goes on without an unusable one)."""
    home = environ.get("CTX_HOME") or f"/ctx/home/{uid}"
    from_tshrc = read_tshrc(view_to_storage(root, home) / TSHRC, warn=warn) if tshrc else None
    if from_tshrc is not None:
        text, source = from_tshrc, f"{home}/{TSHRC}"
    elif environ.get("CTX_PATH"):
        text, source = environ["CTX_PATH"], "CTX_PATH"
    else:
        text, source = DEFAULT_CTX_PATH.format(uid=uid), "default"
    return search_path(root, text, source)


def search_path(root: Path, text: str, source: str, *, agent_view: bool = False) -> SearchPath:
    """``text`` (a ``CTX_PATH``) as the directories it names on this host; ``agent_view``: an
    agent's, whose ``/ctx`` is always the storage root (see :func:`view_to_storage`)."""
    entries = tuple(text.split(":"))
    directories = tuple(
        view_to_storage(root, entry, agent_view=agent_view)
        for entry in entries
        if entry.startswith("/")
    )
    return SearchPath(entries, source, directories)


def read_tshrc(path: Path, *, warn: Warn | None = None) -> str | None:
    """``CTX_PATH`` from a ``.tshrc`` data file; None when the file or the key is absent, or
    the last ``CTX_PATH=`` line gives it no value.

    The file holds ``KEY=VALUE`` lines, blank lines and ``#`` comments; keys other than
    ``CTX_PATH`` belong to tsh and are ignored here.  It is read, never executed: a line that
    is not ``KEY=VALUE`` (``echo hi``, ``export CTX_PATH=…``) is ignored, with one warning
    naming the file and the line (to ``warn``, by default standard error).
    """
    fix = "make it a file of KEY=VALUE lines, or remove it"
    try:
        # The user's own file.  A link is followed (dotfiles are often links), to a file of
        # the home's owner only, so that whoever reads it (root, too) never takes another
        # user's file, /etc/shadow say, for this user's settings; a file in the home itself
        # is the home's, whoever wrote it (an administrator may).  A FIFO is refused, not
        # waited on.
        home_owner = os.stat(path.parent).st_uid
        owner = home_owner if os.path.islink(path) else None
        data = read_regular_file(path, _MAX_TSHRC_BYTES, follow_link=True, owner=owner)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise invalid(f"{path} is not a regular file; {fix}") from None
        if exc.errno == errno.EPERM:
            raise CtxError(
                errno.EPERM,
                f"{path} leads to a file of another user ({exc.strerror}), not of uid "
                f"{home_owner} whose home holds it; {fix}",
            ) from None
        if exc.errno == errno.EFBIG:
            raise invalid(f"{path} is larger than {_MAX_TSHRC_BYTES} bytes; {fix}") from None
        # A loop of links, a file its owner made unreadable, a disk's EIO: said as a refusal
        # naming the file, which a person's tsh warns of and passes over.
        code = exc.errno or errno.EIO
        raise CtxError(code, f"{path}: {exc.strerror or exc}; {fix}") from None
    value = None
    # Bytes that are not UTF-8 are kept as the kernel's (surrogate escapes), as they are kept
    # in the environment's CTX_PATH: a directory's name is any bytes.
    for line in keyvalue.lines(data.decode("utf-8", "surrogateescape")):
        if line.key is None or not _KEY.fullmatch(line.key):
            (warn or _warn_on_stderr)(
                f"{path}:{line.number}: ignored, not KEY=VALUE (.tshrc is data, never run): "
                f"{line.raw.strip()!r}"
            )
        elif line.key == "CTX_PATH":
            if "\0" in line.value:
                raise invalid(
                    f"{path}:{line.number}: CTX_PATH holds a NUL character, which no path can "
                    f"hold; {fix}"
                )
            value = line.value
    return value or None  # CTX_PATH= with nothing after it: not set here


def _warn_on_stderr(message: str) -> None:
    """``ctx: warning: …``, as every other message of ctx (tsh passes its own ``warn``),
    escaped: it quotes paths and lines that the environment and the user's file gave."""
    print(f"ctx: warning: {printable(message)}", file=sys.stderr)


def view_to_storage(root: Path, path: str, *, agent_view: bool = False) -> Path:
    """A ``/ctx/…`` path as the storage path it names: for a person, when ``/ctx`` is not
    mounted here (T-4); in an ``agent_view``, always, since an agent's ``/ctx`` is its own
    view of this storage root, whatever this host has mounted at ``/ctx`` (another agent's
    view, another root), and what it may run there is the chain's to decide."""
    pure = PurePosixPath(path)
    below = pure.parts[len(CTX_MOUNT.parts) :]
    under_ctx = pure.parts[: len(CTX_MOUNT.parts)] == CTX_MOUNT.parts
    if under_ctx and (agent_view or not os.path.ismount(CTX_MOUNT)):
        return root.joinpath(*below)
    return Path(pure)


def which(
    name: str, directories: Iterable[Path], *, is_executable: IsExecutable | None = None
) -> Resolution | None:
    """The first directory holding an executable regular file ``name``; None when none does.

    ``is_executable`` narrows what counts as executable (default :func:`has_execute_bit`).
    """
    check_object_name(name, "tool")
    directory, skipped = _search(name, directories, is_executable or has_execute_bit)
    return None if directory is None else Resolution(name, directory, skipped)


def _search(
    name: str, directories: Iterable[Path], executable: IsExecutable
) -> tuple[Path | None, list[str]]:
    """The first directory holding an executable regular file ``name`` (None when none
    does), and each candidate passed over on the way, with why."""
    skipped = []
    for directory in directories:
        candidate = directory / name
        try:
            status = os.lstat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            skipped.append(f"{candidate}: {exc.strerror}")
            continue
        if not stat.S_ISREG(status.st_mode):
            skipped.append(f"{candidate}: {_kind(status)}, not a regular file")
        elif not executable(candidate, status):
            skipped.append(f"{candidate}: not executable")
        else:
            return directory, skipped
    return None, skipped


def which_on_user_path(
    root: Path, name: str, *, uid: int, environ: Mapping[str, str], warn: Warn | None = None
) -> tuple[Resolution, SearchPath]:
    """``name`` on the search path of a user outside any agent terminal, and that path;
    ENOENT naming the path, and what on it was passed over, when no directory on it holds an
    executable ``name``."""
    search_path = human_search_path(root, uid=uid, environ=environ, warn=warn)
    check_object_name(name, "tool")
    directory, skipped = _search(name, search_path.directories, has_execute_bit)
    if directory is None:
        missing = f"{name} is not on CTX_PATH ({_first_of(search_path.entries, ':')})"
        raise not_found(f"{missing}; {_what_to_do(root, skipped)}")
    return Resolution(name, directory, skipped), search_path


# Entries an error names of a list that may be long: a CTX_PATH of thousands of entries makes
# an error line no one reads whole.
_NAMED = 16


def _first_of(items: Sequence[str], separator: str) -> str:
    more = len(items) - _NAMED
    return separator.join(items[:_NAMED]) + (f" … and {more} more" if more > 0 else "")


def _what_to_do(root: Path, skipped: Sequence[str]) -> str:
    """What to do about a name found nowhere: what was passed over, and why, is what to mend
    when there is any; a storage root without its system tier has no tool at all yet, which
    ``ctx bootstrap`` mends; else see what is installed."""
    remedies = [f"passed over: {_first_of(skipped, '; ')}"] if skipped else []
    if not (root / "tool").is_dir():
        bootstrap = f"ctx bootstrap --storage {shell_word(str(root))}"
        remedies.append(
            f"the storage root {root} has no tools yet: '{bootstrap}' installs the core tools"
        )
    return "; ".join(remedies or ["'ctx object list' lists the tools installed"])


def has_execute_bit(path: Path, status: os.stat_result) -> bool:
    """T-4's "executable": any of the three ``x`` bits.  Who may execute it is step 2's question."""
    return bool(status.st_mode & 0o111)


def tier_location(root: Path, directory: Path) -> str | None:
    """``tool``, ``home/<uid>/tool`` or ``shared/<space>/tool`` when ``directory`` is a tier."""
    try:
        relative = directory.relative_to(root).as_posix()
    except ValueError:
        return None
    return relative if _TIER_LOCATION.fullmatch(relative) else None


def _kind(status: os.stat_result) -> str:
    if stat.S_ISLNK(status.st_mode):
        return "a symbolic link"
    if stat.S_ISDIR(status.st_mode):
        return "a directory"
    return "a special file"
