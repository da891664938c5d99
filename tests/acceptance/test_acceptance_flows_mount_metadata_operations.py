"""Metadata operations through ``ctx mount`` (SPEC §13 F-1 with T-5 and R-2; docs/mount.md),
as a user or a tool does them: ``chmod``/``chown``/``utime``/``truncate``/``fallocate``,
``rename`` over an existing name and across directories, ``renameat2`` with
``RENAME_NOREPLACE``/``RENAME_EXCHANGE``/``RENAME_WHITEOUT``, ``link``/``symlink``/
``readlink``/``mkfifo``, ``mkdir``/``rmdir`` of non-empty directories, extended attributes,
``statfs``, ``access()``, ``O_APPEND``/``O_EXCL``/``O_TRUNC`` opens, ``mmap``, and ``flock``/
``fcntl`` locks, as root and as an unprivileged user.

One storage root is mounted twice for the whole file: the host's view and the view of agent
``coder`` (``ctx mount --as coder``), which runs as the test user and may write space
``team`` and its home, only read space ``audit``, and not see space ``secret``.  The same
sequence of calls is made directly on the storage root and through the mount, in sibling
directories: every answer must be the same, but for the refusals docs/mount.md names
(symbolic links and device nodes: ``ENOSYS``; ``RENAME_WHITEOUT``: ``EINVAL``; extended
attributes), and what the mount shows must be what the storage root then holds.  In the
agent's view every change the chain does not grant is ``EACCES`` with nothing changed on
disk, whoever the caller is."""

from __future__ import annotations

import errno
import fcntl
import itertools
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    ROOT_ENTRIES,
    ctx_run,
    needs_fuse,
    needs_fuse_as_root,
    new_scratch_dir,
    scratch_top,
    serving,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, find_or_create_user

SCRATCH = scratch_top(__file__)
AGENT = "coder"
WRITABLE, READ_ONLY, HIDDEN = "team", "audit", "secret"
OTHER_UID, OTHER_GID = 4321, 4322  # an owner that is neither root nor the test user

pytestmark = [needs_fuse_as_root, needs_fuse]  # a mount serving other uids needs root

EOPNOTSUPP = errno.errorcode[errno.EOPNOTSUPP]
SEQUENCE = itertools.count()  # the directories of one world, each used once


# ------------------------------------------------------------------------------ helpers


@dataclass
class World:
    """The storage root, its host view and agent ``coder``'s view, both mounted."""

    storage: Path
    host: Path
    view: Path
    user: UnprivilegedUser

    def data(self, space: str) -> Path:
        return self.storage / "shared" / space / "data"

    @property
    def home(self) -> Path:
        return self.storage / "home" / str(self.user.uid)

    def through(self, mount: Path, path: Path) -> Path:
        """``path`` (below the storage root) as ``mount`` shows it."""
        return mount / path.relative_to(self.storage)

    def fresh(self, space: str, name: str, owner: UnprivilegedUser | None) -> Path:
        """A new directory ``data/NAME`` of ``space`` on the storage root, owned by ``owner``
        (root when None), in which a sequence of calls is made."""
        path = self.data(space) / name
        path.mkdir()
        if owner is not None:
            os.chown(path, owner.uid, owner.gid)
        return path


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH)
    storage = copy_of_root(_template, top / "storage")
    try:
        for space in (WRITABLE, READ_ONLY, HIDDEN):
            made = ctx_run("shared", "create", space, "--group", str(user.gid),
                           "--storage", storage)  # fmt: skip
            assert made.rc == 0, made
        req = {
            "name": AGENT,
            "label": f"{AGENT}_t",
            "tools": [],
            "shared": {WRITABLE: ["read", "write"], READ_ONLY: ["read"]},
        }
        made = ctx_run("agent", "create", "--storage", storage, "--user", user.name, "-",
                       input=json.dumps(req))  # fmt: skip
        assert made.rc == 0, made
        home = storage / "home" / str(user.uid)  # R-4, made by the host (docs/sessions.md)
        home.mkdir(mode=0o755)
        os.chown(home, user.uid, user.gid)
        host, view = top / "host", top / "view"
        host.mkdir(mode=0o755)
        view.mkdir(mode=0o755)
        with serving(storage, host), serving(storage, view, "--as", AGENT):
            yield World(storage, host, view, user)
    finally:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            where = line.split()[4]
            if where.startswith(str(top) + "/"):
                subprocess.run(["umount", "-l", where], check=False)
        shutil.rmtree(top, ignore_errors=True)


# What every probe starts with: ``e(NAME, f, ...)`` records "ok" or the errno's name under
# NAME in ``out``, printed as JSON at the end; ``renameat2``, ``fallocate`` and
# ``utimensat`` (with UTIME_OMIT) through ctypes.
PRELUDE = textwrap.dedent(
    """
    import ctypes, errno, fcntl, json, mmap, os, stat, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    out = {}
    def e(name, f, *a, **k):
        try:
            r = f(*a, **k)
        except OSError as x:
            out[name] = errno.errorcode.get(x.errno, str(x.errno))
            return None
        out[name] = "ok"
        return r
    def failed():
        n = ctypes.get_errno()
        raise OSError(n, os.strerror(n))
    def renameat2(a, b, flags):
        if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), flags) != 0:
            failed()
    def fallocate(fd, mode, offset, length):
        if libc.fallocate(fd, mode, ctypes.c_long(offset), ctypes.c_long(length)) != 0:
            failed()
    class Timespec(ctypes.Structure):
        _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]
    OMIT = (1 << 30) - 2
    def utimensat(path, atime, mtime):
        pair = (Timespec * 2)(Timespec(*atime), Timespec(*mtime))
        if libc.utimensat(-100, os.fsencode(path), pair, 0) != 0:
            failed()
    def mode(path):
        return oct(stat.S_IMODE(os.lstat(path).st_mode))
    def listing(d):
        shown = {}
        for name in sorted(os.listdir(d)):
            st = os.lstat(os.path.join(d, name))
            if stat.S_ISREG(st.st_mode):
                shown[name] = ["file", open(os.path.join(d, name), "rb").read().decode()]
            elif stat.S_ISDIR(st.st_mode):
                shown[name] = ["dir", sorted(os.listdir(os.path.join(d, name)))]
            else:
                shown[name] = [stat.filemode(st.st_mode)[0]]
        return shown
    d = sys.argv[1]
    """
)


def ids_of(user: UnprivilegedUser | None) -> dict:
    """``subprocess`` arguments for running as ``user`` with its own group only (root: none)."""
    return {} if user is None else {"user": user.uid, "group": user.gid,
                                    "extra_groups": [user.gid]}  # fmt: skip


def probe(body: str, directory: Path, user: UnprivilegedUser | None = None, *args: object) -> dict:
    """The answers of ``PRELUDE + body`` run in ``directory`` (``sys.argv[1]``, then
    ``args``), as root or as ``user``."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n",
         str(directory), *map(str, args)],
        capture_output=True, text=True, timeout=60, **ids_of(user),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def state(top: Path) -> dict[str, tuple]:
    """Each entry under ``top`` (never following links): kind, mode, owner, size, mtime and
    content: what the storage root holds, or what a mount shows of it."""
    shown: dict[str, tuple] = {}
    for path in sorted(top.rglob("*")):
        st = path.lstat()
        if stat.S_ISREG(st.st_mode):
            content = path.read_bytes()
        elif stat.S_ISLNK(st.st_mode):
            content = os.readlink(path).encode()
        else:
            content = b""
        shown[str(path.relative_to(top))] = (
            st.st_mode,
            st.st_uid,
            st.st_gid,
            st.st_size if not stat.S_ISDIR(st.st_mode) else 0,
            st.st_mtime_ns,
            content,
        )
    return shown


def same_calls(world: World, who: str, body: str, prepare=None) -> tuple[dict, dict, Path]:
    """``body`` run by ``who`` (``root`` or ``user``) in a new directory on the storage root
    and in another one through the host's view; both answers, and the storage path of the
    second directory, whose state the mount must show as the storage root holds it."""
    user = owner = owner_of(world, who)
    number = next(SEQUENCE)
    local = world.fresh(WRITABLE, f"local-{number}", owner)
    mounted = world.fresh(WRITABLE, f"mount-{number}", owner)
    if prepare is not None:
        prepare(local)
        prepare(mounted)
    on_disk = probe(body, local, user)
    through = probe(body, world.through(world.host, mounted), user)
    assert state(world.through(world.host, mounted)) == state(mounted)
    return on_disk, through, mounted


def other_owners_files(directory: Path) -> None:
    """Files of another owner: ``theirs`` (0666) and ``locked`` (0644)."""
    for name, mode in (("theirs", 0o666), ("locked", 0o644)):
        path = directory / name
        path.write_text(f"{name} content\n")
        os.chown(path, OTHER_UID, OTHER_GID)
        path.chmod(mode)


WHO = pytest.mark.parametrize("who", ["root", "user"])


def owner_of(world: World, who: str) -> UnprivilegedUser | None:
    return world.user if who == "user" else None


# ------------------------------------------------------------ the host view, as local


MODES_AND_TIMES = """
os.umask(0o022)
f = os.path.join(d, "f")
open(f, "w").write("hello")
for m in (0o4755, 0o2755, 0o1755, 0o600, 0o7777, 0o644):
    e(f"chmod {m:o}", os.chmod, f, m)
    out[f"mode after {m:o}"] = mode(f)
os.chmod(f, 0o6755)
e("chown to self", os.chown, f, os.getuid(), os.getgid())
out["mode after chown to self"] = mode(f)
e("chgrp to own group", os.chown, f, -1, os.getgid())
e("chown to another uid", os.chown, f, 4321, -1)
e("chgrp to another group", os.chown, f, -1, 4322)
st = os.stat(f)
out["owner"] = [st.st_uid, st.st_gid]
e("utime exact", os.utime, f, ns=(1_000_000_123, 2_000_000_456))
out["times exact"] = [os.stat(f).st_atime_ns, os.stat(f).st_mtime_ns]
e("atime omitted", utimensat, f, (0, OMIT), (7, 8))
out["after atime omitted"] = [os.stat(f).st_atime_ns, os.stat(f).st_mtime_ns]
e("mtime omitted", utimensat, f, (9, 10), (0, OMIT))
out["after mtime omitted"] = [os.stat(f).st_atime_ns, os.stat(f).st_mtime_ns]
before = time.time_ns()
e("touch theirs now", os.utime, os.path.join(d, "theirs"))
late = os.stat(os.path.join(d, "theirs")).st_mtime_ns
out["touched now"] = before - 10**9 <= late <= time.time_ns() + 10**9
e("touch theirs to a date", os.utime, os.path.join(d, "theirs"), ns=(5 * 10**9, 6 * 10**9))
e("chmod theirs", os.chmod, os.path.join(d, "theirs"), 0o600)
e("chown theirs to self", os.chown, os.path.join(d, "theirs"), os.getuid(), -1)
out["theirs"] = mode(os.path.join(d, "theirs"))
"""


@WHO
def test_chmod_chown_and_times_through_the_host_view_answer_as_the_storage_root(world, who):
    """F-1, docs/mount.md (a file keeps the owner and mode it has on disk; the kernel checks
    each caller's mode bits): ``chmod`` with and without the set-id and sticky bits,
    ``chown``/``chgrp`` (root may give a file away, a user only to its own group), exact
    nanosecond times, ``UTIME_OMIT`` for either time (``touch -a``/``touch -m``), ``touch``
    of another owner's writable file (now: allowed; a date: ``EPERM``) answer through the
    host's view as on the storage root, as root and as a user, and the storage root holds
    what the mount shows."""
    on_disk, through, mounted = same_calls(world, who, MODES_AND_TIMES, other_owners_files)
    assert through == on_disk
    assert on_disk["touched now"] is True
    assert on_disk["mode after chown to self"] == "0o755"  # chown drops the set-id bits
    if who == "user":
        assert on_disk["chown to another uid"] == "EPERM"
        assert on_disk["touch theirs to a date"] == "EPERM"
        assert on_disk["after mtime omitted"] == [9_000_000_010, 7_000_000_008]
    else:
        assert on_disk["owner"] == [OTHER_UID, OTHER_GID]
        assert (mounted / "f").stat().st_uid == OTHER_UID


SIZES_AND_OPENS = """
f = os.path.join(d, "s")
fd = os.open(f, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
os.write(fd, b"0123456789")
os.close(fd)
e("O_EXCL on an existing name", os.open, f, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
e("truncate to grow", os.truncate, f, 4096)
out["grown"] = [os.stat(f).st_size, open(f, "rb").read()[-3:].hex()]
e("truncate to shrink", os.truncate, f, 4)
fd = os.open(f, os.O_WRONLY | os.O_APPEND)
os.write(fd, b"ab")
os.lseek(fd, 0, os.SEEK_SET)
os.write(fd, b"cd")
os.close(fd)
out["appended"] = open(f).read()
fd = os.open(f, os.O_RDWR)
e("posix_fallocate", os.posix_fallocate, fd, 0, 65536)
out["after posix_fallocate"] = [os.fstat(fd).st_size, os.pread(fd, 8, 0).decode()]
os.close(fd)
fd = os.open(f, os.O_WRONLY | os.O_TRUNC)
os.close(fd)
out["after O_TRUNC"] = os.stat(f).st_size
e("O_TRUNC of a file not ours", os.open, os.path.join(d, "locked"), os.O_WRONLY | os.O_TRUNC)
e("truncate of a file not ours", os.truncate, os.path.join(d, "locked"), 0)
e("truncate of a writable file not ours", os.truncate, os.path.join(d, "theirs"), 3)
out["locked"] = os.stat(os.path.join(d, "locked")).st_size
m = os.path.join(d, "mapped")
fd = os.open(m, os.O_CREAT | os.O_RDWR, 0o644)
os.ftruncate(fd, 4096)
with mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as region:
    region[0:6] = b"mapped"
    region.flush()
os.close(fd)
out["mapped"] = open(m, "rb").read(6).decode()
fd = os.open(os.path.join(d, "theirs"), os.O_RDONLY)
e("mmap of a read-only descriptor for shared writes", mmap.mmap, fd, 0, mmap.MAP_SHARED,
  mmap.PROT_READ | mmap.PROT_WRITE)
os.close(fd)
"""


@WHO
def test_truncate_append_excl_trunc_and_mmap_through_the_host_view_answer_as_the_storage_root(
    world, who
):
    """F-1: ``truncate`` (grow with zeros, shrink), ``O_EXCL`` on an existing name
    (``EEXIST``), ``O_APPEND`` writes landing at the end after an ``lseek``,
    ``posix_fallocate``, ``O_TRUNC``, refusals to truncate another owner's file, and a
    shared writable ``mmap`` answer through the host's view as on the storage root; the
    mapped bytes are on the storage root once ``msync`` returns."""
    on_disk, through, mounted = same_calls(world, who, SIZES_AND_OPENS, other_owners_files)
    assert through == on_disk
    assert on_disk["appended"] == "0123abcd"
    assert (mounted / "mapped").read_bytes()[:6] == b"mapped"
    if who == "user":
        assert on_disk["O_TRUNC of a file not ours"] == "EACCES"
        assert on_disk["locked"] == len("locked content\n")


RAW_FALLOCATE = """
f = os.path.join(d, "big")
fd = os.open(f, os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, b"x" * 8192)
e("fallocate", fallocate, fd, 0, 0, 131072)
e("punch a hole", fallocate, fd, 3, 0, 4096)
out["size"] = os.fstat(fd).st_size
out["start"] = os.pread(fd, 4, 0).decode(errors="replace")
os.close(fd)
"""


def test_fallocate_through_the_mount_is_refused_cleanly_and_posix_fallocate_still_works(world):
    """docs/mount.md is silent on ``fallocate(2)``: the mount refuses it (and a punched hole)
    with ``EOPNOTSUPP`` and changes nothing, where the storage root grows or punches the
    file; glibc's ``posix_fallocate`` falls back to writing and works through the mount
    (checked above)."""
    on_disk, through, mounted = same_calls(world, "user", RAW_FALLOCATE)
    assert on_disk == {"fallocate": "ok", "punch a hole": "ok", "size": 131072,
                       "start": "\x00\x00\x00\x00"}  # fmt: skip
    assert through == {"fallocate": EOPNOTSUPP, "punch a hole": EOPNOTSUPP, "size": 8192,
                       "start": "xxxx"}  # fmt: skip
    assert (mounted / "big").read_bytes() == b"x" * 8192


NAMES = """
os.umask(0o022)
def w(name, text):
    open(os.path.join(d, name), "w").write(text)
p = lambda *names: os.path.join(d, *names)
w("a", "A"); w("b", "B"); w("g", "G")
os.mkdir(p("sub")); os.mkdir(p("full")); w("full/x", "X")
e("rename over an existing file", os.rename, p("g"), p("a"))
e("rename across directories", os.rename, p("a"), p("sub", "a"))
e("rename a directory over a non-empty one", os.rename, p("sub"), p("full"))
e("rename a file over a directory", os.rename, p("b"), p("full"))
e("rename a directory over a file", os.rename, p("full"), p("b"))
e("rename a directory into itself", os.rename, p("full"), p("full", "inner"))
os.mkdir(p("empty"))
e("rename a directory over an empty one", os.rename, p("sub"), p("empty"))
w("c", "C")
e("RENAME_NOREPLACE over an existing name", renameat2, p("c"), p("b"), 1)
e("RENAME_NOREPLACE to a new name", renameat2, p("c"), p("n"), 1)
e("RENAME_EXCHANGE of two files", renameat2, p("n"), p("b"), 2)
e("RENAME_EXCHANGE of a file and a directory", renameat2, p("n"), p("full"), 2)
e("RENAME_EXCHANGE with a missing name", renameat2, p("b"), p("nothing"), 2)
e("link", os.link, p("b"), p("b2"))
out["link count"] = os.stat(p("b")).st_nlink
e("link of a directory", os.link, p("empty"), p("empty2"))
e("link onto an existing name", os.link, p("b"), p("full"))
out["readlink"] = os.readlink(p("made-on-disk"))
e("lutimes of a link", os.utime, p("made-on-disk"), ns=(10**9, 3 * 10**9),
  follow_symlinks=False)
out["link mtime"] = os.lstat(p("made-on-disk")).st_mtime_ns
e("rmdir of a non-empty directory", os.rmdir, p("n"))
e("rmdir of a file", os.rmdir, p("b"))
e("unlink of a directory", os.unlink, p("empty"))
e("mkdir of an existing name", os.mkdir, p("empty"))
e("mkdir in a setgid directory", os.mkdir, p("empty", "inner"), 0o775)
out["inner"] = [mode(p("empty", "inner")), os.stat(p("empty", "inner")).st_gid]
out["listing"] = listing(d)
e("symlink", os.symlink, "b", p("made-here"))
e("mkfifo", os.mkfifo, p("fifo"))
"""


def names_on_disk(directory: Path) -> None:
    """A symbolic link made on the storage root (of the directory's owner), and the directory
    set-group-ID."""
    os.symlink("b", directory / "made-on-disk")
    owner = directory.stat()
    os.chown(directory / "made-on-disk", owner.st_uid, owner.st_gid, follow_symlinks=False)
    directory.chmod(0o2775)


@WHO
def test_renames_links_mkdir_and_rmdir_through_the_host_view_answer_as_the_storage_root(world, who):
    """F-1 and docs/mount.md (``renameat2`` flags passed through; links shown, never made):
    rename over an existing file, across directories, over empty and non-empty directories,
    a file over a directory and back, a directory into itself; ``RENAME_NOREPLACE`` and
    ``RENAME_EXCHANGE`` (two files, a file and a directory, a missing name); ``link`` (count,
    a directory: ``EPERM``, onto an existing name: ``EEXIST``); ``readlink`` and ``lutimes``
    of a link made on disk; ``rmdir``/``unlink`` of the wrong kind; ``mkdir`` in a setgid
    directory: every answer as on the storage root, but ``symlink`` and ``mkfifo``
    (``ENOSYS``), and the storage root ends as the mount shows it."""
    on_disk, through, mounted = same_calls(world, who, NAMES, names_on_disk)
    made_here = {"symlink": "ENOSYS", "mkfifo": "ENOSYS"}
    assert on_disk["symlink"] == on_disk["mkfifo"] == "ok"
    assert through == {**on_disk, **made_here}
    assert through["rename a directory over a non-empty one"] == "ENOTEMPTY"
    assert through["RENAME_NOREPLACE over an existing name"] == "EEXIST"
    assert through["listing"]["b"] == ["file", "C"]  # the exchange swapped the two files
    assert through["listing"]["n"] == ["dir", ["x"]]  # and then a file with a directory
    assert through["inner"][0] == "0o2755"  # set-group-ID inherited, the umask applied
    assert not (mounted / "made-here").exists() and not (mounted / "fifo").exists()


def test_rename_whiteout_through_the_host_view_is_einval_with_nothing_renamed(world):
    """docs/mount.md: ``renameat2`` with ``RENAME_WHITEOUT`` is ``EINVAL``, with nothing
    renamed (the mount never makes the device node it would leave)."""
    mounted = world.fresh(WRITABLE, "whiteout", None)
    (mounted / "from").write_text("F")
    through = probe(
        """
        e("whiteout", renameat2, os.path.join(d, "from"), os.path.join(d, "to"), 4)
        out["listing"] = listing(d)
        """,
        world.through(world.host, mounted),
    )
    assert through == {"whiteout": "EINVAL", "listing": {"from": ["file", "F"]}}
    assert sorted(os.listdir(mounted)) == ["from"]


XATTRS = """
f = os.path.join(d, "f")
open(f, "w").write("x")
e("setxattr", os.setxattr, f, "user.note", b"v")
e("getxattr", os.getxattr, f, "user.note")
e("listxattr", os.listxattr, f)
e("removexattr", os.removexattr, f, "user.note")
e("setxattr on the directory", os.setxattr, d, "user.note", b"v")
"""


@WHO
def test_extended_attributes_are_refused_through_the_host_view_and_none_is_set(world, who):
    """docs/mount.md: extended attributes are not provided: set, get, list and remove are all
    ``EOPNOTSUPP`` through the mount, for a file and a directory, and none lands on disk."""
    mounted = world.fresh(WRITABLE, f"xattr-{next(SEQUENCE)}", owner_of(world, who))
    through = probe(XATTRS, world.through(world.host, mounted), owner_of(world, who))
    assert through == {
        "setxattr": EOPNOTSUPP,
        "getxattr": EOPNOTSUPP,
        "listxattr": EOPNOTSUPP,
        "removexattr": EOPNOTSUPP,
        "setxattr on the directory": EOPNOTSUPP,
    }
    for path in (mounted, mounted / "f"):
        try:
            assert "user.note" not in os.listxattr(path)
        except OSError as exc:  # a storage filesystem without user attributes
            assert exc.errno == errno.EOPNOTSUPP


ACCESS = """
for name in sorted(os.listdir(d)):
    p = os.path.join(d, name)
    out[name] = [os.access(p, m) for m in (os.F_OK, os.R_OK, os.W_OK, os.X_OK)]
v = os.statvfs(d)
out["statvfs"] = [v.f_bsize, v.f_frsize, v.f_blocks, v.f_files, v.f_namemax]
"""


def test_access_and_statfs_as_a_user_through_both_views_answer_as_the_storage_root(world):
    """F-1 with docs/mount.md (``default_permissions``: the kernel checks the caller's mode
    bits): ``access()`` for each of R, W and X on files of every owner and mode answers a
    user through the host's view as on the storage root, and ``statvfs`` gives the storage
    filesystem's sizes, in the host's and in the agent's view."""
    directory = world.fresh(WRITABLE, "access", None)
    directory.chmod(0o2775)
    owners = {"root": (0, 0), "mine": (world.user.uid, world.user.gid),
              "group": (OTHER_UID, world.user.gid), "other": (OTHER_UID, OTHER_GID)}  # fmt: skip
    for label, (uid, gid) in owners.items():
        for mode in (0o000, 0o400, 0o040, 0o004, 0o600, 0o060, 0o006, 0o755, 0o750, 0o705):
            path = directory / f"{label}-{mode:03o}"
            path.write_text("x")
            os.chown(path, uid, gid)
            path.chmod(mode)
    (directory / "subdir").mkdir(mode=0o750)
    on_disk = probe(ACCESS, directory, world.user)
    through = probe(ACCESS, world.through(world.host, directory), world.user)
    agents = probe(ACCESS, world.through(world.view, directory), world.user)
    assert through == on_disk
    assert agents == on_disk  # its writable space: the same answers
    assert on_disk["mine-600"] == [True, True, True, False]
    assert on_disk["group-060"] == [True, True, True, False]
    assert on_disk["other-006"] == [True, True, True, False]
    assert on_disk["root-750"] == [True, False, False, False]


LOCKER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
answers = []
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    answers.append("flock taken")
except BlockingIOError:
    answers.append("flock busy")
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    answers.append("lockf taken")
except OSError:
    answers.append("lockf busy")
print(" ".join(answers))
"""


def test_flock_and_fcntl_locks_exclude_within_one_mount_only_as_the_page_says(world):
    """docs/mount.md *Locks*: ``flock`` and ``fcntl`` locks taken through a mount exclude
    other locks through the same mount (as root or as a user), and neither a lock directly
    on the storage root nor one through another mount of it sees them."""
    directory = world.fresh(WRITABLE, "locks", world.user)
    target = directory / "lockfile"
    target.write_text("")
    os.chown(target, world.user.uid, world.user.gid)
    target.chmod(0o660)

    def other(path: Path, user: UnprivilegedUser | None) -> str:
        done = subprocess.run([sys.executable, "-c", LOCKER, str(path)], capture_output=True,
                              text=True, timeout=60, **ids_of(user))  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    fd = os.open(world.through(world.host, target), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert other(world.through(world.host, target), None) == "flock busy lockf busy"
        assert other(world.through(world.host, target), world.user) == "flock busy lockf busy"
        assert other(target, world.user) == "flock taken lockf taken"
        assert other(world.through(world.view, target), world.user) == "flock taken lockf taken"
    finally:
        os.close(fd)
    assert other(world.through(world.host, target), world.user) == "flock taken lockf taken"


ROOT_ENTRY_CHANGES = """
p = lambda *names: os.path.join(d, *names)
m = lambda name: p("shared", "team", "data", sys.argv[2], name)
e("chmod of a root entry", os.chmod, p("model"), 0o755)
e("utime of a root entry", os.utime, p("model"))
e("chown of a root entry", os.chown, p("model"), 0, 0)
e("rename of a root entry", os.rename, p("model"), p("models"))
e("rename over a root entry", os.rename, m("dir"), p("model"))
e("exchange of two root entries", renameat2, p("model"), p("bin"), 2)
e("exchange of a root entry", renameat2, m("dir"), p("tool"), 2)
e("rmdir of a root entry", os.rmdir, p("model"))
e("rename into the root", os.rename, m("f"), p("f"))
e("link into the root", os.link, m("f"), p("f"))
e("mkdir at the root", os.mkdir, p("audit"))
e("create at the root", os.open, p("queue"), os.O_CREAT | os.O_WRONLY, 0o644)
out["root"] = sorted(os.listdir(d))
"""


def test_root_entries_take_attribute_changes_but_are_never_moved_removed_or_added_to(world):
    """R-2 with docs/mount.md: through the host's view, root may ``chmod``/``utime``/
    ``chown`` the six root entries as on disk, but none is renamed, replaced, exchanged or
    removed (``EPERM``) and nothing is made or moved beside them (``EACCES``); the storage
    root still holds exactly the six."""
    moves = world.fresh(WRITABLE, f"rootmoves-{next(SEQUENCE)}", None)
    (moves / "dir").mkdir()
    (moves / "f").write_text("f")
    model = world.storage / "model"
    before = model.stat()
    answers = probe(ROOT_ENTRY_CHANGES, world.host, None, moves.name)
    assert answers == {
        "chmod of a root entry": "ok",
        "utime of a root entry": "ok",
        "chown of a root entry": "ok",
        "rename of a root entry": "EPERM",
        "rename over a root entry": "EPERM",
        "exchange of two root entries": "EPERM",
        "exchange of a root entry": "EPERM",
        "rmdir of a root entry": "EPERM",
        "rename into the root": "EACCES",
        "link into the root": "EACCES",
        "mkdir at the root": "EACCES",
        "create at the root": "EACCES",
        "root": sorted(ROOT_ENTRIES),
    }
    assert set(os.listdir(world.storage)) == ROOT_ENTRIES
    assert model.stat().st_ino == before.st_ino and sorted(os.listdir(moves)) == ["dir", "f"]


# ---------------------------------------------------------------- the agent's view


READ_ONLY_CHANGES = """
p = lambda *names: os.path.join(d, *names)
A = p("shared", "audit", "data", "ro")
T = p("shared", "team", "data", "rw")
H = p("home", sys.argv[2])
e("chmod", os.chmod, p(A, "f"), 0o666)
e("chown to self", os.chown, p(A, "f"), os.getuid(), os.getgid())
e("utime exact", os.utime, p(A, "f"), ns=(10**9, 10**9))
e("touch", os.utime, p(A, "f"))
e("truncate", os.truncate, p(A, "f"), 0)
e("open for writing", os.open, p(A, "f"), os.O_WRONLY)
e("open O_APPEND", os.open, p(A, "f"), os.O_WRONLY | os.O_APPEND)
e("open O_RDONLY|O_TRUNC", os.open, p(A, "f"), os.O_RDONLY | os.O_TRUNC)
e("create", os.open, p(A, "new"), os.O_CREAT | os.O_WRONLY, 0o644)
e("mkdir", os.mkdir, p(A, "newdir"))
e("rmdir", os.rmdir, p(A, "dir"))
e("unlink", os.unlink, p(A, "f"))
e("rename out to a writable space", os.rename, p(A, "f"), p(T, "taken"))
e("rename in from a writable space", os.rename, p(T, "t"), p(A, "t"))
e("rename over a read-only file", os.rename, p(T, "t"), p(A, "f"))
e("RENAME_NOREPLACE in", renameat2, p(T, "t"), p(A, "t"), 1)
e("RENAME_EXCHANGE across", renameat2, p(T, "t"), p(A, "f"), 2)
e("RENAME_EXCHANGE with the home", renameat2, p(H, "h"), p(A, "f"), 2)
e("link out to a writable space", os.link, p(A, "f"), p(T, "linked"))
e("link out to the home", os.link, p(A, "f"), p(H, "linked"))
e("link in", os.link, p(T, "t"), p(A, "linked"))
fd = os.open(p(A, "f"), os.O_RDONLY)
e("fchmod", os.fchmod, fd, 0o666)
e("mmap for shared writes", mmap.mmap, fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
with mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ) as region:
    out["mapped read"] = region[:8].decode()
os.close(fd)
out["read"] = open(p(A, "f")).read()
out["access W"] = os.access(p(A, "f"), os.W_OK)
e("hidden space", os.stat, p("shared", "secret"))
e("a link into the hidden space", os.open, p(T, "to-secret"), os.O_RDONLY)
e("a link to the read-only space, for writing", os.open, p(T, "to-audit"), os.O_WRONLY)
out["a link to the read-only space, read"] = open(p(T, "to-audit")).read()
out["listing"] = listing(A)
"""


@pytest.mark.parametrize("who", ["agent's user", "root"])
def test_no_metadata_change_reaches_a_read_only_space_through_the_agents_view(world, who):
    """F-1 and T-5 (docs/mount.md: a change the agent may not make is ``EACCES``): in space
    ``audit``, which agent ``coder`` may only read, and whose mode bits would let its user
    write, every change — ``chmod``, ``chown``, times, ``truncate``, opens for writing,
    ``O_TRUNC``, create, ``mkdir``/``rmdir``/``unlink``, renames and ``RENAME_EXCHANGE``
    either way, links either way, ``fchmod``, a shared writable ``mmap`` — is ``EACCES``
    through the agent's view, for the agent's user and for root alike, and the storage root
    is left exactly as it was; reads work, and the kernel's ``access()`` answers from the
    mode bits alone.  A link on disk that leads into the hidden space is ``ENOENT``, one
    into the read-only space only reads."""
    tag = "root" if who == "root" else "user"
    read_only = world.fresh(READ_ONLY, "ro", world.user)  # removed again at the end
    read_only.chmod(0o2775)
    (read_only / "f").write_text("audited\n")
    (read_only / "dir").mkdir()
    for path in (read_only / "f", read_only / "dir"):
        os.chown(path, world.user.uid, world.user.gid)
        path.chmod(0o2775 if path.is_dir() else 0o664)
    writable = world.fresh(WRITABLE, "rw", world.user)
    (writable / "t").write_text("team\n")
    os.chown(writable / "t", world.user.uid, world.user.gid)
    os.symlink(f"../../../{HIDDEN}/data/s", writable / "to-secret")
    os.symlink(f"../../../{READ_ONLY}/data/ro/f", writable / "to-audit")
    (world.data(HIDDEN) / "s").write_text("hidden\n")
    (world.home / "h").write_text("home\n")
    os.chown(world.home / "h", world.user.uid, world.user.gid)
    before = state(world.storage / "shared") | state(world.home)
    try:
        caller = None if who == "root" else world.user
        answers = probe(READ_ONLY_CHANGES, world.view, caller, world.user.uid)
    finally:
        after = state(world.storage / "shared") | state(world.home)
        shutil.rmtree(read_only)
        shutil.rmtree(writable)
        (world.home / "h").unlink()
    refused = {name: answer for name, answer in answers.items() if answer != "ok"}
    changes = [
        "chmod", "chown to self", "utime exact", "touch", "truncate", "open for writing",
        "open O_APPEND", "open O_RDONLY|O_TRUNC", "create", "mkdir", "rmdir", "unlink",
        "rename out to a writable space", "rename in from a writable space",
        "rename over a read-only file", "RENAME_NOREPLACE in", "RENAME_EXCHANGE across",
        "RENAME_EXCHANGE with the home", "link out to a writable space", "link out to the home",
        "link in", "fchmod", "mmap for shared writes",
        "a link to the read-only space, for writing",
    ]  # fmt: skip
    assert {name: refused.get(name) for name in changes} == dict.fromkeys(changes, "EACCES"), tag
    assert answers["hidden space"] == "ENOENT"
    assert answers["a link into the hidden space"] == "ENOENT"
    assert answers["read"] == answers["a link to the read-only space, read"] == "audited\n"
    assert answers["mapped read"] == "audited\n"
    assert answers["access W"] is True  # the kernel's answer: mode bits only
    assert answers["listing"] == {"dir": ["dir", []], "f": ["file", "audited\n"]}
    assert after == before


WRITABLE_MOVES = """
p = lambda *names: os.path.join(d, *names)
T = p("shared", "team", "data", "moves")
H = p("home", sys.argv[2], "moves")
os.makedirs(p(T, "x", "in")); open(p(T, "x", "in", "f"), "w").write("X")
os.makedirs(p(H, "y", "in")); open(p(H, "y", "in", "f"), "w").write("Y")
os.stat(p(T, "x", "in", "f")); os.stat(p(H, "y", "in", "f"))
e("RENAME_EXCHANGE of a space's directory and a home's", renameat2, p(T, "x"), p(H, "y"), 2)
out["after exchange"] = [open(p(T, "x", "in", "f")).read(), open(p(H, "y", "in", "f")).read()]
e("chmod below the exchanged directory", os.chmod, p(T, "x", "in", "f"), 0o600)
e("utime below the other", os.utime, p(H, "y", "in", "f"), ns=(10**9, 2 * 10**9))
e("rename from the space to the home", os.rename, p(T, "x"), p(H, "moved"))
e("chmod below the moved directory", os.chmod, p(H, "moved", "in", "f"), 0o640)
e("chown in the home to its own group", os.chown, p(H, "moved", "in", "f"), -1, os.getgid())
e("link from the home to the space", os.link, p(H, "moved", "in", "f"), p(T, "linked"))
e("RENAME_NOREPLACE onto the link", renameat2, p(H, "y", "in", "f"), p(T, "linked"), 1)
e("chmod of the home itself", os.chmod, p("home", sys.argv[2]), 0o750)
e("touch of the home itself", os.utime, p("home", sys.argv[2]))
out["home"] = listing(H)
out["space"] = listing(T)
"""


def test_exchanges_and_moves_between_the_home_and_a_writable_space_land_on_disk(world):
    """F-1 and T-5: through the agent's view its user exchanges (``RENAME_EXCHANGE``) a
    directory of its writable space with one of its home, changes files below both through
    the names the kernel already holds, moves a directory from the space to the home, links
    back, and is refused a no-replace rename onto the link (``EEXIST``); the storage root
    ends as the view shows it.  The home directory itself is the host's to change
    (``EACCES``, docs/mount.md: writes are allowed *in* the home)."""
    (world.data(WRITABLE) / "moves").mkdir()
    os.chown(world.data(WRITABLE) / "moves", world.user.uid, world.user.gid)
    home_moves = world.home / "moves"
    home_moves.mkdir()
    os.chown(home_moves, world.user.uid, world.user.gid)
    answers = probe(WRITABLE_MOVES, world.view, world.user, world.user.uid)
    assert {k: v for k, v in answers.items() if v != "ok"} == {
        "after exchange": ["Y", "X"],
        "RENAME_NOREPLACE onto the link": "EEXIST",
        "chmod of the home itself": "EACCES",
        "touch of the home itself": "EACCES",
        "home": {"moved": ["dir", ["in"]], "y": ["dir", ["in"]]},
        "space": {"linked": ["file", "Y"]},
    }
    moved, other = home_moves / "moved" / "in" / "f", home_moves / "y" / "in" / "f"
    assert moved.read_text() == "Y" and stat.S_IMODE(moved.stat().st_mode) == 0o640
    assert other.read_text() == "X" and other.stat().st_mtime_ns == 2 * 10**9
    assert moved.stat().st_nlink == 2
    assert os.path.samefile(moved, world.data(WRITABLE) / "moves" / "linked")
    assert not (world.data(WRITABLE) / "moves" / "x").exists()
    assert stat.S_IMODE(world.home.stat().st_mode) == 0o755
    view_home = world.through(world.view, home_moves)
    assert state(view_home) == state(home_moves)


# ------------------------------------------------------------ what does not hold today


CREATE_SET_ID = """
os.umask(0o022)
for name, m in (("setuid", 0o4755), ("setgid", 0o2755), ("sticky", 0o1755)):
    fd = os.open(os.path.join(d, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, m)
    os.close(fd)
    out[name] = mode(os.path.join(d, name))
"""


@WHO
def test_a_file_created_with_set_id_bits_keeps_them_as_on_the_storage_root(world, who):
    """F-1 with docs/mount.md (a file made through the mount gets the mode asked for less
    the caller's umask, as it would on the storage root): ``open(O_CREAT, 04755)`` and
    ``02755`` — an installer, ``cp`` of a set-id program, ``install -m`` — give the same
    mode through the host's view as directly, as root and as the file's own user."""
    on_disk, through, mounted = same_calls(world, who, CREATE_SET_ID)
    assert on_disk == {"setuid": "0o4755", "setgid": "0o2755", "sticky": "0o1755"}
    assert through == on_disk
    assert stat.S_IMODE((mounted / "setuid").stat().st_mode) == 0o4755


def linked_across_spaces(world: World, name: str) -> tuple[Path, Path]:
    """A file of the agent's user, in the read-only space, with a second name (a hard link
    the host made) in the writable space: (writable name, read-only name) in the view."""
    read_only = world.data(READ_ONLY) / name
    read_only.write_text("shared by two spaces\n")
    os.chown(read_only, world.user.uid, world.user.gid)
    read_only.chmod(0o664)
    writable = world.data(WRITABLE) / name
    os.link(read_only, writable)
    return world.through(world.view, writable), world.through(world.view, read_only)


ORDER_OF_LOOKUPS = """
first, last, action = sys.argv[2], sys.argv[3], sys.argv[4]
answers = []
for _ in range(20):
    os.stat(first)
    os.stat(last)
    try:
        if action == "write":
            os.close(os.open(first, os.O_WRONLY))
        else:
            os.chmod(first, 0o664)
        answers.append("ok")
    except OSError as x:
        answers.append(errno.errorcode[x.errno])
out["answers"] = sorted(set(answers))
"""


def lookups(world: World, first: Path, last: Path, action: str) -> list[str]:
    """The answers to ``action`` (``write`` or ``chmod``) on ``first``, made right after
    ``first`` then ``last`` (two names of one file) were looked up, twenty times over."""
    return probe(ORDER_OF_LOOKUPS, first.parent, world.user, first, last, action)["answers"]


@pytest.mark.xfail(
    strict=True,
    reason="F-1: opening for writing a file's name in a writable space is EACCES when the "
    "file's other name, in a read-only space, was looked up last (the mount judges the "
    "node's most recent name, not the one used)",
)
def test_a_write_through_a_writable_name_is_not_refused_for_another_name_of_the_file(world):
    """F-1 (writes checked with the same chain as ``ctx policy explain`` for that path): a
    file with one name in space ``team`` (writable for the agent) and one in ``audit``
    (read-only) may be opened for writing through its ``team`` name whatever name was looked
    up just before."""
    writable, read_only = linked_across_spaces(world, "two-names-write")
    assert lookups(world, writable, read_only, "write") == ["ok"]


@pytest.mark.xfail(
    strict=True,
    reason="F-1: chmod through a file's name in a read-only space succeeds when its other "
    "name, in a writable space, was looked up last; through that name it is EACCES otherwise",
)
def test_a_chmod_through_a_read_only_name_is_refused_whatever_was_looked_up_before(world):
    """F-1 and docs/mount.md (a change the agent may not make is ``EACCES``): ``chmod``
    through a file's name in space ``audit``, which the agent may only read, is refused even
    right after the file's other name, in writable space ``team``, was looked up."""
    writable, read_only = linked_across_spaces(world, "two-names-chmod")
    before = os.stat(world.data(READ_ONLY) / "two-names-chmod").st_ctime_ns
    assert lookups(world, read_only, writable, "chmod") == ["EACCES"]
    assert os.stat(world.data(READ_ONLY) / "two-names-chmod").st_ctime_ns == before
