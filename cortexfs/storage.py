"""The storage root and its root ABI (SPEC R-1, R-2).

A storage root is an ordinary directory tree holding every durable object.  Which one a
command uses (R-1): ``--storage DIR``, else ``$CTX_STORAGE``, else the embedded default —
``/var/lib/cortexfs/storage/current`` for root, ``$XDG_DATA_HOME/cortexfs/storage/current``
(``~/.local/share/…``) for everyone else.

The root holds exactly :data:`ROOT_ENTRIES` (R-2).  Nothing else is ever created at the root:
no ``mcp/``, no ``audit/``, no ``queue/``, no registry.

Every agent reaches its objects through the root and these six directories, under a uid that
is usually neither their owner nor in their group: bootstrap makes them :data:`ABI_MODE`
whatever its caller's umask, and runs its later steps under :data:`BOOTSTRAP_UMASK`, so that a
root bootstrapped under ``umask 077`` is the root a default umask makes.  On an existing root
it never widens a mode (an administrator may have narrowed one on purpose): a directory that
others may not read and search is a warning naming it and the ``chmod`` that would open it.
One that is wider — writable by its group or others, or another uid's than the root's owner
— is given back (:mod:`cortexfs.bootstrap_repair`): the authority chain refuses every object
below it.  ``tool/`` is reported instead: it holds the administrator's policies and hooks.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath

from cortexfs import bootstrap_repair, capabilities, durable, mount_table
from cortexfs.absolute_paths import absolute
from cortexfs.errors import (
    HOST_SHORTAGES,
    CtxError,
    explain_host_trouble,
    invalid,
    not_found,
    owner_left_out,
)
from cortexfs.file_attributes import attribute_refusal
from cortexfs.names import check_object_name
from cortexfs.printable import shell_word
from cortexfs.user_namespace import unmapped_owner

ROOT_ENTRIES = ("bin", "tool", "agent", "model", "home", "shared")
ABI_MODE = 0o755  # the root and its six entries: everyone reads and searches, the owner writes
PRIVATE_MODE = 0o700  # a user's XDG data home and the directories above it, made by bootstrap
BOOTSTRAP_UMASK = 0o022  # what the later steps run under: the umask of a default install
_OTHERS_READ_SEARCH = stat.S_IROTH | stat.S_IXOTH  # what an agent's uid needs on the ABI
# The one name under shared/ that is not a shared space: the system's manual bundle.
DOCS_BUNDLE = "cortexfs-docs"


def check_space_name(name: str, kind: str = "shared space") -> str:
    """``name`` when it may name a shared space (``kind``: what the caller calls it): an object
    name (R-3) other than the manual bundle's (X-2); EINVAL otherwise."""
    check_object_name(name, kind)
    if name == DOCS_BUNDLE:
        raise invalid(f"{name} is the system-maintained manual bundle (X-2), not a space")
    return name


SYSTEM_DEFAULT_ROOT = Path("/var/lib/cortexfs/storage/current")
STORAGE_ENV = "CTX_STORAGE"


def default_root(euid: int | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """The embedded default storage root for this user (R-1)."""
    env = os.environ if environ is None else environ
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return SYSTEM_DEFAULT_ROOT
    return user_directory("XDG_DATA_HOME", ".local/share", euid, env) / "cortexfs/storage/current"


def user_directory(
    variable: str,
    under_home: str,
    euid: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> Path:
    """An XDG base directory of this user: ``$variable`` (``XDG_DATA_HOME``, ``XDG_CACHE_HOME``)
    when it holds an absolute path, else ``under_home`` in the home directory.

    Only absolute paths count: the XDG base directory specification calls a relative one
    invalid, to be ignored, and a relative (or empty) HOME is no better, so the password
    database names the home then; either would put our files wherever ctx was started.
    """
    env = os.environ if environ is None else environ
    chosen = env.get(variable, "")
    if os.path.isabs(chosen):
        return Path(chosen)
    home = env.get("HOME", "")
    if not os.path.isabs(home):
        home = _password_home(os.geteuid() if euid is None else euid)
    return Path(home) / under_home


def _password_home(uid: int) -> str:
    """``uid``'s home directory in the password database ("/" when it has none)."""
    try:
        return pwd.getpwuid(uid).pw_dir or "/"
    except KeyError:
        return "/"


# The most bytes a path given to the kernel may hold, its NUL included (Linux's PATH_MAX).
PATH_MAX = 4096


def require_openable_path(root: Path) -> None:
    """ENAMETOOLONG for a root whose path the kernel refuses in every call (longer than
    PATH_MAX), as given or as its links resolve: bootstrap would otherwise make the
    directories above it that fit, and leave them, before the first that does not."""
    for path in (os.fsencode(root), os.fsencode(os.path.realpath(root))):
        if len(path) >= PATH_MAX:
            raise CtxError(
                errno.ENAMETOOLONG,
                f"the storage root {root} is a path of {len(path)} bytes, where the kernel "
                f"takes at most {PATH_MAX - 1}: nothing was made; choose a shorter storage "
                "root path (--storage DIR or CTX_STORAGE)",
            )


def one_storage_option(
    before: str | os.PathLike[str] | None, after: str | os.PathLike[str] | None
) -> str | os.PathLike[str] | None:
    """The ``--storage`` of a command line that may give it before the command (``ctx
    --storage A queue status``) and after it: EINVAL when both are given and name two
    directories, where taking either would act on a root the other word did not mean."""
    if before is None or after is None:
        return after if before is None else before
    if os.path.realpath(before) != os.path.realpath(after):
        raise invalid(
            f"two storage roots given: --storage {os.fspath(before)!r} before the command and "
            f"--storage {os.fspath(after)!r} after it; give one"
        )
    return after


def resolve_root(explicit: str | os.PathLike[str] | None = None) -> Path:
    """``--storage`` beats ``$CTX_STORAGE`` beats the embedded default; always absolute.

    ENOENT when it is a symbolic link to nothing (``storage/current`` to a release moved
    away): every command would otherwise meet it in its own way, and bootstrap would make an
    empty root where the administrator's was."""
    root = _absolute(Path(explicit), "--storage") if explicit else None
    root = root or root_from_environment() or default_root()
    if len(os.fsencode(root)) >= PATH_MAX:  # the links it may hold are resolved by bootstrap
        require_openable_path(root)
    if os.path.islink(root):
        _require_followable(root)
    return root


def _require_followable(link: Path) -> None:
    """ENOENT when the link that names the storage root leads to nothing, ELOOP when the
    kernel will not follow it (a loop, or a filesystem mounted ``nosymfollow``)."""
    try:
        os.stat(link)
    except FileNotFoundError:
        raise not_found(
            f"storage root {link} is a symbolic link to {os.readlink(link)}, which does not "
            "exist; point the link at the storage root, or move the root back to where it "
            "leads, or name another root (--storage DIR or CTX_STORAGE)"
        ) from None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            return  # what the link's path says (EACCES…) is each command's to meet and say
        target = os.path.realpath(link)
        if target != str(link) and os.path.isdir(target):  # resolved without the kernel's help
            remedy = f"name the root by its own path, {target}"
            why = "a filesystem on its way is mounted nosymfollow"
        else:
            remedy = "point the link at the storage root"
            why = "the links lead round in a loop"
        raise CtxError(
            errno.ELOOP,
            f"storage root {link} is a symbolic link to {os.readlink(link)} that the kernel "
            f"will not follow ({why}); {remedy}, or name another root (--storage DIR or "
            "CTX_STORAGE)",
        ) from None


def root_from_environment() -> Path | None:
    """``$CTX_STORAGE`` made absolute; None when it is not set.

    Set but empty, it is refused (EINVAL) rather than read as unset: an empty value is most
    often a variable that failed to expand, and falling back to the default root — for root,
    the system's — would act on a storage root nobody named."""
    from_env = os.environ.get(STORAGE_ENV)
    if from_env is None:
        return None
    if not from_env:
        raise invalid(
            f"{STORAGE_ENV} is set but empty, which names no storage root; unset it to use "
            f"the default ({default_root()}), or set it to a directory"
        )
    return _absolute(Path(from_env), STORAGE_ENV)


def _absolute(path: Path, given_as: str) -> Path:
    try:
        return Path(absolute(path))
    except FileNotFoundError:  # getcwd() of a directory that was removed
        raise relative_to_a_removed_directory(path, given_as) from None


def relative_to_a_removed_directory(path: Path, given_as: str) -> CtxError:
    """ENOENT for ``path``, given as ``given_as`` (an option, a variable), relative to a
    current directory that was removed: getcwd's bare "No such file or directory" would
    name neither the path nor the way out."""
    return not_found(
        f"{given_as} {path} is relative, and the current directory no longer exists; "
        "give an absolute path, or change to a directory that exists"
    )


def require_root(root: Path) -> Path:
    """ENOENT with the fix when ``root`` is not an initialised storage root; ENOTDIR when
    something else is at its path."""
    if not root.is_dir():
        if os.path.lexists(root):
            raise not_a_directory(root)
        raise not_found(f"storage root {root} does not exist; create it with 'ctx bootstrap'")
    return root


def place_in_root(root: Path, path: str | os.PathLike[str]) -> PurePosixPath | None:
    """Where ``path`` lies in storage root ``root``, relative to it, or None when outside it.

    Judged by path, then by the identity (device and inode) of each directory above it: a
    bind mount of the root, or of a directory above it, names the same directory otherwise,
    and what is made through it is made in the root all the same (R-2)."""
    real_root, real_path = os.path.realpath(root), Path(os.path.realpath(path))
    if os.path.commonpath([real_root, real_path]) == real_root:
        return PurePosixPath(os.path.relpath(real_path, real_root))
    try:
        root_status = os.stat(real_root)
    except OSError:
        return None
    for directory in (real_path, *real_path.parents):
        try:
            status = os.stat(directory)
        except OSError:
            continue  # not there yet, or not ours to look at: not the root
        if (status.st_dev, status.st_ino) == (root_status.st_dev, root_status.st_ino):
            return PurePosixPath(real_path.relative_to(directory))
    return None


def require_agents_directory(root: Path) -> Path:
    """``root``'s ``agent/`` directory, or ENOENT naming bootstrap: the agents' directory is
    the root's (R-2), so a root without it was never bootstrapped (or was damaged), and
    neither an empty listing nor the kernel's bare 'No such file' would say so."""
    require_root(root)
    agents = root / "agent"
    if not agents.is_dir():
        raise not_found(
            f"{root} has no directory agent/: it is no storage root (or a damaged one); "
            "run 'ctx bootstrap'"
        )
    return agents


def not_a_directory(root: Path) -> CtxError:
    """The storage root's path holds a file (or a link to one): nothing to create there."""
    return CtxError(
        errno.ENOTDIR,
        f"storage root {root} is not a directory; move it aside, or name a directory "
        "(--storage DIR or CTX_STORAGE)",
    )


def use_own_root() -> str:
    """The way out of a refusal in a storage root that is not this user's: a root of their
    own, and where their default one is."""
    return (
        "use a storage root of your own (--storage DIR or CTX_STORAGE; without them yours is "
        f"{default_root()})"
    )


def require_writable(directory: Path, action: str, fix: str | None = None) -> None:
    """EACCES unless this process may create entries in ``directory`` (write and search it),
    saying who may and what to do (``fix``, else: be root or the owner, or use a root of your
    own); EROFS on a read-only filesystem, EPERM for an immutable or append-only directory.
    Checked before anything is made: otherwise the first mkdir or temporary file of the
    action is refused naming only itself, after what came before it was made."""
    if os.access(directory, os.W_OK | os.X_OK, effective_ids=True):
        return
    try:
        st = os.stat(directory)
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return  # nothing to judge: the action meets what is there and says so
    if read_only:
        # No owner, group or mode would let anyone write there: say what does.
        raise CtxError(
            errno.EROFS,
            f"cannot {action}: {directory} is on a read-only filesystem; remount it "
            "read-write, or use a storage root on a writable one",
        )
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        fd = None
    refused = None if fd is None else attribute_refusal(fd, action, directory)
    if refused is not None:
        raise refused
    raise _refusal(action, f"write in {directory}", st, stat.S_IWGRP, fix, directory)


def not_readable(path: Path, action: str, fix: str | None = None) -> CtxError:
    """The EACCES for ``action`` when the kernel refused to open ``path``: it names the
    directory on the way this process may not enter, or else ``path`` itself, who owns it and
    its mode, and what to do (``fix``, else: be root, the owner or of the group, or use a root
    of your own) — not only the name that was refused."""
    refusal = not_reachable(path, action, fix)
    if refusal is not None:
        return refusal
    try:
        st = os.stat(path)
    except OSError as exc:
        return CtxError(errno.EACCES, f"cannot {action}: {path}: {exc.strerror}")
    return _refusal(action, f"read {path}", st, stat.S_IRGRP, fix, path)


def not_reachable(path: Path, action: str, fix: str | None = None) -> CtxError | None:
    """The EACCES for ``action`` when a directory on the way to ``path`` may not be entered by
    this process, naming it, who owns it, its mode and what to do (as :func:`not_readable`);
    None when every directory on the way may be entered."""
    ancestor = closed_on_the_way(path)
    if ancestor is None:
        return None
    try:
        st = os.stat(ancestor)
    except OSError as exc:
        return CtxError(errno.EACCES, f"cannot {action}: {ancestor}: {exc.strerror}")
    return _refusal(action, f"enter {ancestor}", st, stat.S_IXGRP, fix, ancestor)


def closed_on_the_way(path: Path) -> Path | None:
    """The first directory on the way to ``path``, from ``/`` down, that this process may not
    search (enter); None when it may enter every one."""
    for ancestor in reversed(path.absolute().parents):
        if not os.access(ancestor, os.X_OK, effective_ids=True):
            return ancestor
    return None


def _refusal(
    action: str, what: str, st: os.stat_result, group_bit: int, fix: str | None, path: Path
) -> CtxError:
    """``cannot ACTION: uid U may not WHAT (owner, group, mode); FIX``."""
    if fix is None and st.st_uid == os.geteuid():
        # Telling its owner to run as its owner would help nobody: the mode is what is missing.
        letter = {stat.S_IWGRP: "w", stat.S_IRGRP: "r", stat.S_IXGRP: "x"}.get(group_bit, "rwx")
        fix = owner_left_out(letter)
        if not _default_root_behind(path, group_bit):  # "a root of your own" is no way out
            fix += f", or {use_own_root()}"
    if fix is None and os.geteuid() == 0:
        fix = unmapped_owner(st.st_uid)
        if fix is not None:
            fix += " (--storage DIR or CTX_STORAGE)"
    if fix is None:
        fix = capabilities.root_without(capabilities.CAP_DAC_OVERRIDE)
    if fix is None:
        who = "as root or as that owner"
        if st.st_mode & group_bit:
            who = f"as root, as that owner or as a member of group {st.st_gid}"
        instead = use_own_root()
        if group_bit == stat.S_IXGRP and _default_root_behind(path, group_bit):
            instead = "use another storage root (--storage DIR or CTX_STORAGE)"
        fix = f"run it {who}, or {instead}"
        if group_bit == stat.S_IXGRP:
            # A directory on the way (another user's 0700 home): what is below may well be
            # the caller's, and a search bit its owner grants opens the way to it alone.
            fix = f"have that owner grant you search (x) on it, or {fix}"
    return CtxError(
        errno.EACCES,
        f"cannot {action}: uid {os.geteuid()} may not {what} (owner uid {st.st_uid}, group "
        f"{st.st_gid}, mode {stat.S_IMODE(st.st_mode):04o}); {fix}",
    )


def _default_root_behind(path: Path, group_bit: int) -> bool:
    """Whether this user's default storage root is refused by ``path`` too, so that "a root
    of your own" would be no way out: ``path`` is that root or lies inside it, or, refused
    search (``group_bit`` ``S_IXGRP``), lies on the way to it (``$XDG_DATA_HOME`` below a
    directory the user may not enter)."""
    real, default = os.path.realpath(path), os.path.realpath(default_root())
    pairs = [(real, default)] + ([(default, real)] if group_bit == stat.S_IXGRP else [])
    return any(
        inner == outer or inner.startswith(outer.rstrip("/") + "/") for inner, outer in pairs
    )


class BootstrapReport:
    """What ``ctx bootstrap`` did: every path it created or repaired, problems it left alone,
    and warnings: what it left as it is although agents may not be able to use it."""

    # A plain class, not a dataclass: ``ctx run`` imports this module (see cortexfs.tools.result).
    __slots__ = ("_errnos", "created", "problems", "repaired", "root", "warnings")

    def __init__(self, root: Path) -> None:
        self.root = root
        self.created: list[str] = []
        self.repaired: list[str] = []
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self._errnos: dict[int, int] = {}  # problem index -> its errno, where one is known

    def add_problem(self, problem: str, code: int) -> None:
        """A problem left alone, with the errno that says what kind it is."""
        self._errnos[len(self.problems)] = code
        self.problems.append(problem)

    def error(self) -> CtxError | None:
        """The refusal the problems amount to (None when there are none): the first problem's
        errno (EEXIST for one that did not say: something in the way, left untouched), the
        number of problems and the first, and what to do."""
        if not self.problems:
            return None
        count = len(self.problems)
        return CtxError(
            self._errnos.get(0, errno.EEXIST),
            f"bootstrap of {self.root} left {count} problem{'s' if count > 1 else ''} as "
            f"{'they were' if count > 1 else 'it was'} (the first: {self.problems[0]}); what "
            "it could make is made: remove the cause (free space, move aside what is in the "
            "way, a shorter storage root path; for what another uid could change, check it "
            "and then chown or chmod go-w it, as its line says) and run 'ctx bootstrap' "
            "again, which repairs the rest",
        )

    @contextlib.contextmanager
    def step(self, where: str, path: Path | None = None) -> Iterator[None]:
        """One step of bootstrap that does not depend on the others: an error in it becomes a
        problem on ``where`` and bootstrap goes on with the next step (R-5 repairs all it can).
        A kernel error that names no file (a full disk refuses a ``write``) names ``path``,
        by default ``where`` in the root."""
        try:
            yield
        except CtxError as exc:
            self.add_problem(f"{where}: {exc}; left as it was", exc.errno)
        except OSError as exc:
            named = exc.filename if exc.filename is not None else (path or self.root / where)
            reason = exc.strerror or str(exc)
            code = exc.errno or errno.EIO
            self.add_problem(f"{where}: {reason} ({os.fsdecode(named)}); left as it was", code)

    def to_json(self) -> dict[str, object]:
        return {
            "root": str(self.root),
            "created": self.created,
            "repaired": self.repaired,
            "problems": self.problems,
            "warnings": self.warnings,
        }


class RootDirectoriesCutShort(CtxError):
    """The host ran short (:data:`~cortexfs.errors.HOST_SHORTAGES`: space, inodes,
    descriptors, memory) while :func:`ensure_root_abi` made the storage root's own
    directories, the root's and those above it.  The error names the directory it could not
    make by its full path (the kernel names only the last component given to mkdirat), and
    ``report`` holds what was made before it, which bootstrap prints with :attr:`problem`
    (R-5: what was created, and every problem, each naming its path)."""

    def __init__(self, report: BootstrapReport, shown: str, path: Path, exc: OSError) -> None:
        code = exc.errno or errno.EIO
        trouble = explain_host_trouble(code, filesystem=path.parent)
        aside, remedy = (trouble.aside, trouble.remedy) if trouble else ("", "free it")
        super().__init__(code, f"cannot create {path}: {exc.strerror}{aside}")
        self.report = report
        # Every later directory and step would meet the same shortage: bootstrap stops here.
        self.problem = f"{shown}: {self}; bootstrap made nothing after it: {remedy}"


def ensure_root_abi(root: Path, ops: durable.FsOps | None = None) -> BootstrapReport:
    """Create the storage root and its six root entries where missing; never touch anything else.

    What it makes is :data:`ABI_MODE` (the directories above the root it makes too, but for
    the private ones of :func:`_xdg_data_home_and_above`), whatever the umask.  A root entry
    that exists but is not a directory (a file, a symlink) is reported as a problem and left
    alone: bootstrap never destroys user data.  Existing directories keep their modes; those
    others may not read and search are a warning (:func:`_closed_to_agents`).  The host
    running short while they are made is :class:`RootDirectoriesCutShort`, carrying the
    report of what was made.
    """
    ops = ops or durable.default_ops()
    report = BootstrapReport(root=root)
    require_openable_path(root)
    missing_parents = []
    probe = root
    # Links on the way to the root are the administrator's (/srv/ctx -> /data/ctx), followed
    # as every command follows them: by their resolved path, which also finds what a
    # filesystem mounted nosymfollow would not let the kernel follow.
    while _known_missing(probe) and probe != probe.parent:
        missing_parents.append(probe)
        probe = probe.parent
    private = _xdg_data_home_and_above()
    for path in reversed(missing_parents):
        try:
            parent_fd = ops.open_dir(os.path.realpath(path.parent))
            try:
                mode = PRIVATE_MODE if path in private else ABI_MODE
                if _make_dir(ops, parent_fd, path.name, mode):
                    report.created.append(str(path))
            finally:
                ops.close(parent_fd)
        except OSError as exc:
            if exc.errno in HOST_SHORTAGES:  # not this path's doing: said with what was made
                raise RootDirectoriesCutShort(report, str(path), path, exc) from None
            # The storage root's own directories are made here; a kernel's refusal names only
            # the last component, which says nothing of which root or what to do.
            raise CtxError(
                exc.errno or errno.EIO,
                f"cannot create {path} for the storage root {root}: {exc.strerror}; create "
                "it yourself, or choose a storage root you may create (--storage DIR or "
                "CTX_STORAGE)",
            ) from None
    try:
        # The root is what the administrator named, and may be a symlink to the directory
        # (storage/current -> a release): every command reaches it through the link, so
        # bootstrap does too.  Below the root nothing is followed.
        root_fd = durable.open_dir_path(ops, os.path.realpath(root))
    except NotADirectoryError as exc:
        raise not_a_directory(root) from exc
    except PermissionError:
        # A directory on the way that may not be searched, or a root its mode leaves the
        # caller out of reading (0300): the kernel's refusal names neither which nor the fix.
        raise not_readable(root, f"open the storage root {root}") from None
    except CtxError as exc:
        if exc.errno == errno.ENOTDIR:
            raise not_a_directory(root) from None
        raise
    try:
        root_status = os.fstat(root_fd)
        _require_administrators_link(root, root_status)
        closed = _closed_to_agents(root, root_status, "")
        # Root making the six in a root another uid owns makes them that owner's, as the owner
        # would have: root's, the owner could not make a space, a home or a tool of its own in
        # the root it administers.  Only a directory made here, still empty, is given away.
        given_to = root_status.st_uid if os.geteuid() == 0 and root_status.st_uid != 0 else None
        if given_to is not None and any(durable.lstat_at(root_fd, n) is None for n in ROOT_ENTRIES):
            capabilities.require(
                f"making the root entries of {root} its owner's (uid {given_to})",
                capabilities.CAP_CHOWN,
            )
        for name in ROOT_ENTRIES:
            st = durable.lstat_at(root_fd, name)
            if st is None:
                try:
                    made = _make_dir(ops, root_fd, name, ABI_MODE, owner=given_to)
                except OSError as exc:
                    if exc.errno in HOST_SHORTAGES:
                        raise RootDirectoriesCutShort(report, name, root / name, exc) from None
                    # The kernel names only the entry: say which root, and that the directory
                    # may be no place for one (/proc, /sys).
                    raise CtxError(
                        exc.errno or errno.EIO,
                        f"cannot create {name} in the storage root {root}: {exc.strerror}; "
                        "name a directory of an ordinary filesystem that you may write "
                        "(--storage DIR or CTX_STORAGE)",
                    ) from None
                if made:  # not when a bootstrap running at the same time made it first
                    report.created.append(name)
            elif not _is_dir(st):
                report.add_problem(
                    f"{name}: exists but is not a directory; left untouched", errno.ENOTDIR
                )
            else:
                closed += _closed_to_agents(root, st, name)
        strangers = sorted(set(os.listdir(root_fd)) - set(ROOT_ENTRIES))
    finally:
        ops.close(root_fd)
    if closed:
        report.warnings.append(_closed_warning(root, closed))
    if mounted_noexec(root):
        # No tool, worker job or agent terminal of this root can run.
        report.warnings.append(executes_nothing(root, root, "the storage root"))
    if strangers:
        # Never removed (bootstrap destroys no data), never shown: /ctx shows the six.
        report.warnings.append(
            f"{', '.join(strangers)} at the root of {root} "
            f"{'is' if len(strangers) == 1 else 'are'} not part of the root ABI (R-2: "
            f"{', '.join(ROOT_ENTRIES)}); no view of the root shows "
            f"{'it' if len(strangers) == 1 else 'them'}: move "
            f"{'it' if len(strangers) == 1 else 'them'} elsewhere"
        )
    return report


def _known_missing(path: Path) -> bool:
    """Whether nothing is at ``path`` (links on the way resolved), as far as this process may
    look: a path below a directory it may not search is not known to be missing, so bootstrap
    does not try to make it (and be refused naming a directory that exists); opening the
    root then names the directory that refuses."""
    try:
        os.lstat(os.path.realpath(path))
    except PermissionError:
        return False
    except OSError:
        return True
    return False


def mounted_noexec(path: Path) -> bool:
    """Whether ``path`` lies on a filesystem mounted ``noexec`` (False when it cannot be
    looked at: whoever uses it says why)."""
    try:
        return bool(os.statvfs(path).f_flag & os.ST_NOEXEC)
    except OSError:
        return False


def executes_nothing(path: Path, shown: object, keep: str) -> str:
    """Why nothing at ``path`` (said as ``shown``) can run, a filesystem mounted ``noexec``
    holding it, and the remedy, naming that mount when it can be found (a project's
    ``tool/`` may be a mount of its own below a root that allows exec); ``keep`` is what to
    move elsewhere instead ("the storage root")."""
    mount = mount_table.mount_point_of(path)
    if mount is None:
        where, remedy = "", f"put {keep} on a filesystem mounted with exec"
    else:
        where = f" at {mount}"
        remedy = f"remount {mount} with exec, or put {keep} on a filesystem mounted with exec"
    return (
        f"{shown} is on a filesystem mounted noexec{where}: the kernel executes nothing there, "
        f"whatever its mode (T-5); {remedy}"
    )


def _require_administrators_link(root: Path, target: os.stat_result) -> None:
    """EPERM when ``root`` is a symbolic link that neither its caller, nor root, nor the owner
    of the directory it leads to made: only a link its administrator made may lead to a
    storage root (``storage/current`` -> a release), and one another user planted — in a
    directory of theirs that ``CTX_STORAGE`` names — must not lead root to make the root's
    entries in a directory of its own choosing."""
    try:
        link = os.lstat(root)
    except OSError:
        return
    if not stat.S_ISLNK(link.st_mode) or link.st_uid in (0, os.geteuid(), target.st_uid):
        return
    raise CtxError(
        errno.EPERM,
        f"storage root {root} is a symbolic link of uid {link.st_uid} to a directory of uid "
        f"{target.st_uid}: only a link its administrator made (root, you, or the directory's "
        "owner) may lead to a storage root; name the directory itself (--storage DIR or "
        "CTX_STORAGE)",
    )


def _make_dir(
    ops: durable.FsOps, parent_fd: int, name: str, mode: int, *, owner: int | None = None
) -> bool:
    """``make_dir_synced`` with exactly ``mode`` (and given to uid ``owner``, group kept,
    unless None): mkdir applies the umask, so the mode is set on the new directory, reached
    without following a link.  False when it already exists (its mode and owner are left as
    they are).  What is opened by its name is given to ``owner`` only while it is empty: that
    owner may rename in the parent (a root that root bootstraps for it), and could have put
    another directory there since the mkdir, with what it holds.  Without an owner to give it
    to, nobody but the caller may rename there, and no listing spends a descriptor."""
    if not durable.make_dir_synced(ops, parent_fd, name, mode):
        return False
    fd = ops.open_dir(name, parent_fd)
    try:
        status = os.fstat(fd)
        if owner is not None and os.listdir(fd):
            return True
        changed = False
        if owner is not None and status.st_uid != owner:
            ops.chown_opened(fd, owner)
            changed = True
        if stat.S_IMODE(status.st_mode) != mode:
            ops.fchmod(fd, mode)  # after the chown: a chown may clear set-id bits
            changed = True
        if changed:
            durable.sync_dir(ops, fd)  # mode and owner reach the disk with the directory
    finally:
        ops.close(fd)
    return True


def _closed_to_agents(root: Path, st: os.stat_result, name: str) -> list[tuple[Path, int]]:
    """``[(path, mode)]`` when the directory ``name`` of the root (``""``: the root) does not
    let others read and search it: an agent's uid, which is usually neither its owner nor in
    its group, could not reach what is below."""
    mode = stat.S_IMODE(st.st_mode)
    if mode & _OTHERS_READ_SEARCH == _OTHERS_READ_SEARCH:
        return []
    return [(root / name if name else root, mode)]


def _closed_warning(root: Path, closed: list[tuple[Path, int]]) -> str:
    listed = ", ".join(f"{path} ({mode:04o})" for path, mode in closed)
    paths = " ".join(shell_word(str(path)) for path, _ in closed)
    return (
        f"others may not read and search (r-x) {listed}: an agent whose uid is neither the "
        "owner nor in the group cannot reach the storage root's objects (EACCES at step 2 of "
        f"the authority chain); bootstrap makes them {ABI_MODE:04o} but leaves the mode of an "
        f"existing one as it is; to open them: chmod o+rx {paths}"
    )


# Later layers add their own bootstrap steps (core tools, docs bundle…) by registering a
# function here; bootstrap runs them in registration order after the root ABI exists.  A step
# that reads SOURCE registers a check too: every check runs before anything is made, so a
# bad SOURCE leaves the root as it was.
BootstrapStep = Callable[[Path, Path | None, BootstrapReport], None]
SourceCheck = Callable[[Path | None], None]
_BOOTSTRAP_STEPS: list[BootstrapStep] = []
_SOURCE_CHECKS: list[SourceCheck] = []


def register_bootstrap_step(
    step: BootstrapStep, check_source: SourceCheck | None = None
) -> BootstrapStep:
    _BOOTSTRAP_STEPS.append(step)
    if check_source is not None:
        _SOURCE_CHECKS.append(check_source)
    return step


def bootstrap(root: Path, source: Path | None = None) -> BootstrapReport:
    """Create or repair a storage root (R-5).  Idempotent; never destroys user data."""
    for check in _SOURCE_CHECKS:
        check(source)
    if os.path.isdir(root):
        require_writable(root, f"bootstrap the storage root {root}")
    try:
        report = ensure_root_abi(root)
    except RootDirectoriesCutShort as short:
        # What was made is named, and the shortage is the run's problem; the later steps
        # would each meet it again, in a root without its six entries.
        short.report.add_problem(short.problem, short.errno)
        return short.report
    with report.step(str(root)):
        _tighten_root_abi(root, report)
    # The later steps (core tools, tsh config, manual bundle) create files and directories that
    # agents read and search: under the caller's umask 077 they would be the owner's alone.
    saved = os.umask(BOOTSTRAP_UMASK)
    try:
        for step in _BOOTSTRAP_STEPS:
            with report.step(step.__module__, root):
                step(root, source, report)
    finally:
        os.umask(saved)
    return report


# Never given back (see _tighten_root_abi): what they hold is looked up by name, and whoever
# could write them could have swapped two entries that both still belong to root.
_HOLDS_OBJECTS = ("tool", "agent", "model", "home", "shared")


def _tighten_root_abi(root: Path, report: BootstrapReport) -> None:
    """The root and its six entries, checked against another uid (the rule of
    :mod:`cortexfs.bootstrap_repair`).  Only ``bin/`` is given back to the root's owner and
    made writable by its owner alone (:func:`cortexfs.bootstrap_repair.tighten`): what it holds
    bootstrap writes anew.  The root itself and ``tool/``, ``agent/``, ``model/``, ``home/``,
    ``shared/`` hold what is looked up by name — objects, their controls, homes, spaces — and
    whoever could write them could have swapped two entries that both still belong to root
    (two agents' ``.d``, two spaces): giving such a directory back would vouch for that, so it
    is reported and left as it is, and the core tools' step writes nothing into a ``tool/`` so
    reported.  A mode narrower than :data:`ABI_MODE` is left as it is (see
    :func:`_closed_to_agents`)."""
    real = os.path.realpath(root)
    owner = bootstrap_repair.storage_owner(real)
    root_fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in (None, *ROOT_ENTRIES):
            shown = str(root) if name is None else name
            with report.step(shown):
                if name is not None and name not in _HOLDS_OBJECTS:
                    changed = bootstrap_repair.tighten(root_fd, name, owner, shown)
                    if changed:
                        report.repaired.append(f"{shown} ({changed})")
                    continue
                status = os.fstat(root_fd) if name is None else durable.lstat_at(root_fd, name)
                held = status is not None and stat.S_ISDIR(status.st_mode)
                if held and bootstrap_repair.untrusted(status, owner):
                    path = str(root if name is None else root / name)
                    problem = bootstrap_repair.kept_problem(shown, status, owner, path)
                    report.add_problem(problem, errno.EACCES)
    finally:
        os.close(root_fd)


def _xdg_data_home_and_above() -> set[Path]:
    """For a user other than root: the XDG data home and the directories above it, which the
    XDG base directory specification has made mode 0700 when they do not exist (a missing
    ~/.local, ~/.local/share); the storage root below them is made as any other."""
    if os.geteuid() == 0:
        return set()
    data_home = user_directory("XDG_DATA_HOME", ".local/share")
    return {data_home, *data_home.parents}


def _is_dir(st: os.stat_result) -> bool:
    return stat.S_ISDIR(st.st_mode)
