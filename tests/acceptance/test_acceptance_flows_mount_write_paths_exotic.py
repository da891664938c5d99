"""Write paths an ordinary program takes through ``ctx mount`` (SPEC §13 F-1, with T-5, X-1
and the queue of §2; docs/mount.md *What each view shows* and *What the mount promises*):
descriptors that outlive a rename over their file, an unlink, an exchange or a rename of the
directory above; a working directory renamed away; ``O_TMPFILE`` and the fallback programs
take when it is refused; ``O_EXCL`` creates racing through the host's view and an agent's view
at once; sparse files and offsets up to the filesystem's limit; ``O_DIRECT``; ``futimens``,
``fchmod``, ``fchown``, ``fsync``/``fdatasync`` and shared mappings on such descriptors; and
queue jobs published and claimed with ``ctx queue`` through an agent's view while a program
publishes by hand beside them.

One storage root is mounted twice for the whole file: the host's view and the view of agent
``coder`` (``ctx mount --as coder``), which runs as the test user and may write space ``team``
and its home, and only read space ``audit``.  Each sequence of calls is made on the storage
root directly and through a mount, in sibling directories: the answers must be the same but
where docs/mount.md says otherwise, and the storage root must end as the plain directory did.
"""

from __future__ import annotations

import errno
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
    CTX_ARGV,
    ctx_run,
    needs_fuse,
    needs_fuse_as_root,
    new_scratch_dir,
    requests_by_state,
    scratch_top,
    serving,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, find_or_create_user

SCRATCH = scratch_top(__file__)
AGENT = "coder"
WRITABLE, READ_ONLY = "team", "audit"
EOPNOTSUPP = errno.errorcode[errno.EOPNOTSUPP]
SEQUENCE = itertools.count()  # each directory a test makes in a space, used once

pytestmark = [needs_fuse_as_root, needs_fuse]  # a mount serving other uids needs root


# ------------------------------------------------------------------------------ helpers


@dataclass
class World:
    """The storage root, mounted as the host's view and as agent ``coder``'s view."""

    top: Path
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

    def fresh(self, parent: Path, stem: str, owner: UnprivilegedUser | None) -> Path:
        """A new directory below ``parent`` on the storage root, owned by ``owner`` (root
        when None)."""
        path = parent / f"{stem}-{next(SEQUENCE)}"
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
        for space in (WRITABLE, READ_ONLY):
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
        home = storage / "home" / str(user.uid)  # R-4, made by the host
        home.mkdir(mode=0o755)
        os.chown(home, user.uid, user.gid)
        host, view = top / "host", top / "view"
        host.mkdir(mode=0o755)
        view.mkdir(mode=0o755)
        with serving(storage, host), serving(storage, view, "--as", AGENT):
            yield World(top, storage, host, view, user)
    finally:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            where = line.split()[4]
            if where.startswith(str(top) + "/"):
                subprocess.run(["umount", "-l", where], check=False)
        shutil.rmtree(top, ignore_errors=True)


# ``e(NAME, f, ...)`` records "ok" or the errno's name under NAME in ``out``, printed as JSON
# at the end; ``linkat_follow`` is linkat(2) with AT_SYMLINK_FOLLOW (what gives a name to an
# O_TMPFILE file through /proc/self/fd/N), ``renameat2`` the kernel's call.
PRELUDE = textwrap.dedent(
    """
    import ctypes, errno, json, mmap, os, stat, sys
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
    def linkat_follow(src, dst):
        if libc.linkat(-100, os.fsencode(src), -100, os.fsencode(dst), 0x400) != 0:
            failed()
    def renameat2(a, b, flags):
        if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), flags) != 0:
            failed()
    def files(top):
        shown = {}
        for dirpath, dirnames, filenames in os.walk(top):
            for name in sorted(dirnames + filenames):
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                body = open(path, "rb").read().decode() if stat.S_ISREG(st.st_mode) else ""
                mtime = st.st_mtime_ns if st.st_mtime_ns < 10**10 else "now"
                shown[os.path.relpath(path, top)] = [
                    stat.filemode(st.st_mode), st.st_nlink if body else 0, body, mtime]
        return shown
    p = lambda *names: os.path.join(d, *names)
    d = sys.argv[1]
    os.umask(0o022)
    """
)


def ids_of(user: UnprivilegedUser | None) -> dict:
    """``subprocess`` arguments for running as ``user`` with its own group only (root: none)."""
    return {} if user is None else {"user": user.uid, "group": user.gid,
                                    "extra_groups": [user.gid]}  # fmt: skip


def probe(body: str, directory: Path, user: UnprivilegedUser | None, *args: object) -> dict:
    """The answers of ``PRELUDE + body`` run in ``directory`` (``sys.argv[1]``, then
    ``args``), as root or as ``user``."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n",
         str(directory), *map(str, args)],
        capture_output=True, text=True, timeout=60, **ids_of(user),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def tree(top: Path) -> dict[str, tuple]:
    """Each entry under ``top`` (never following links): kind and mode, owner, size and
    content — what a plain directory and a directory worked through the mount must share."""
    shown: dict[str, tuple] = {}
    for path in sorted(top.rglob("*")):
        st = path.lstat()
        content = path.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        size = st.st_size if not stat.S_ISDIR(st.st_mode) else 0
        shown[str(path.relative_to(top))] = (st.st_mode, st.st_uid, st.st_gid, size, content)
    return shown


def owners_swapped(top: Path, user: UnprivilegedUser | None) -> dict[str, tuple]:
    """:func:`tree` with the owner given as ``"caller"`` where it is ``user``'s (or root's)."""
    uid = 0 if user is None else user.uid
    return {k: (v[0], "caller" if v[1] == uid else v[1], *v[2:]) for k, v in tree(top).items()}


def same_calls(
    world: World, body: str, user: UnprivilegedUser | None, mount: Path | None = None
) -> tuple[dict, dict, Path, Path]:
    """``body`` run by ``user`` (root when None) in a new directory of space ``team`` on the
    storage root and in another one through ``mount`` (the host's view by default): both
    answers and both directories on the storage root."""
    mount = world.host if mount is None else mount
    local = world.fresh(world.data(WRITABLE), "local", user)
    mounted = world.fresh(world.data(WRITABLE), "mount", user)
    on_disk = probe(body, local, user)
    through = probe(body, world.through(mount, mounted), user)
    return on_disk, through, local, mounted


WHO = pytest.mark.parametrize("who", ["root", "user"])


def caller(world: World, who: str) -> UnprivilegedUser | None:
    return world.user if who == "user" else None


# ------------------------------------------------------- descriptors outliving their names


DESCRIPTORS = """
def fdops(tag, fd):
    e(f"{tag}: write", os.pwrite, fd, b"W", 0)
    e(f"{tag}: ftruncate", os.ftruncate, fd, 3)
    e(f"{tag}: fchmod", os.fchmod, fd, 0o640)
    e(f"{tag}: fchown to its own group", os.fchown, fd, -1, os.getgid())
    e(f"{tag}: reopen /proc/self/fd", lambda: os.close(os.open(f"/proc/self/fd/{fd}", os.O_RDWR)))
    e(f"{tag}: fsync", os.fsync, fd)
    e(f"{tag}: fdatasync", os.fdatasync, fd)
    e(f"{tag}: futimens", os.utime, fd, ns=(10**9, 4 * 10**9))
    st = os.fstat(fd)
    out[f"{tag}: fstat"] = [st.st_nlink, st.st_size, stat.filemode(st.st_mode), st.st_mtime_ns]
    out[f"{tag}: bytes"] = os.pread(fd, 16, 0).decode()
    os.close(fd)
def made(name, text):
    with open(p(name), "w") as f:
        f.write(text)
made("U", "uuuu")
fd = os.open(p("U"), os.O_RDWR)
os.unlink(p("U"))
fdops("unlinked", fd)
made("T", "tttt"); made("S", "ssss")
fd = os.open(p("T"), os.O_RDWR)
os.rename(p("S"), p("T"))
fdops("renamed over", fd)
made("K", "kkkk"); os.link(p("K"), p("K2")); made("R", "rrrr")
fd = os.open(p("K"), os.O_RDWR)
os.rename(p("R"), p("K"))
fdops("renamed over, another name left", fd)
made("L", "llll"); os.link(p("L"), p("L2"))
fd = os.open(p("L"), os.O_RDWR)
os.unlink(p("L"))
fdops("unlinked, another name left", fd)
made("X", "xxxx"); made("Y", "yyyy")
fd = os.open(p("X"), os.O_RDWR)
renameat2(p("X"), p("Y"), 2)
fdops("exchanged", fd)
os.mkdir(p("D")); made("D/f", "dddd")
fd = os.open(p("D", "f"), os.O_RDWR)
os.rename(p("D"), p("E"))
fdops("its directory renamed", fd)
os.mkdir(p("F")); made("F/g", "ffff"); os.mkdir(p("G"))
fd = os.open(p("F", "g"), os.O_RDWR)
os.rename(p("F"), p("G"))
os.unlink(p("G", "g"))
fdops("its directory renamed over an empty one, then unlinked", fd)
fd = os.open(p("M"), os.O_CREAT | os.O_RDWR, 0o644)
os.ftruncate(fd, 8192)
region = mmap.mmap(fd, 8192)
os.unlink(p("M"))
region[4096:4102] = b"mapped"
e("mapped, unlinked: msync", region.flush)
region.close()
out["mapped, unlinked: bytes"] = os.pread(fd, 6, 4096).decode()
os.close(fd)
directory = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
e("fsync of the directory", os.fsync, directory)
os.close(directory)
out["files"] = files(d)
"""


@WHO
def test_descriptors_outlive_renames_unlinks_and_exchanges_made_through_the_host_view(world, who):
    """docs/mount.md *Open files* and *Identity* ("what the kernel holds of a file (a
    descriptor…) stands for that file only"), F-1 (``fsync``/``fdatasync`` as on the file
    behind): a descriptor held while its file is unlinked, renamed over (with and without a
    second name left), exchanged (``RENAME_EXCHANGE``), or while its directory is renamed,
    even over an empty directory and then unlinked, still writes, ``ftruncate``s,
    ``fchmod``s, ``fchown``s, reopens through ``/proc/self/fd/N``, syncs, sets its times
    (``futimens``) and ``fstat``s as on a plain directory; a shared mapping of an unlinked
    file ``msync``s; and the storage root ends as the plain directory did, as root and as a
    user."""
    user = caller(world, who)
    on_disk, through, local, mounted = same_calls(world, DESCRIPTORS, user)
    assert through == on_disk
    assert on_disk["unlinked: fstat"] == [0, 3, "-rw-r-----", 4 * 10**9]
    assert on_disk["renamed over, another name left: bytes"] == "Wkk"
    assert on_disk["files"]["K2"] == ["-rw-r-----", 1, "Wkk", 4 * 10**9]
    assert on_disk["files"]["K"][2] == "rrrr" and on_disk["files"]["Y"][2] == "Wxx"
    assert on_disk["mapped, unlinked: bytes"] == "mapped"
    assert owners_swapped(mounted, user) == owners_swapped(local, user)


WORKING_DIRECTORY = """
os.makedirs(p("a", "b"))
start = os.getcwd()
os.chdir(p("a", "b"))
held = os.open("held", os.O_CREAT | os.O_WRONLY, 0o644)
os.rename(os.path.join(start, p("a")), os.path.join(start, p("moved")))
e("create in the working directory", lambda: os.close(os.open("made", os.O_CREAT | os.O_WRONLY,
                                                                0o600)))
e("mkdir in the working directory", os.mkdir, "sub", 0o750)
e("rename in the working directory", os.rename, "held", "held2")
e("O_EXCL on the renamed name", os.open, "held2", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
e("write the held file", os.write, held, b"held")
e("getcwd", os.getcwd)
out["cwd tail"] = os.getcwd().split(os.sep)[-2:]
os.close(held)
os.chdir(start)
os.mkdir(p("empty"))
e("rename a directory over an empty one", os.rename, p("moved", "b"), p("empty"))
e("rename a directory over a non-empty one", os.rename, p("moved"), p("empty"))
e("rename a directory into its own child", os.rename, p("empty"), p("empty", "sub", "x"))
e("the old name", os.stat, p("moved", "b"))
out["files"] = files(d)
"""


@WHO
def test_a_working_directory_renamed_through_the_host_view_takes_new_files_to_its_new_place(
    world, who
):
    """F-1 and docs/mount.md (*Names*: a rename through the mount is applied to the daemon's
    names at once): a process whose working directory is renamed away (with its parent)
    through the mount makes files and directories there, renames and writes in it, and
    ``getcwd`` names its new place; that directory is then renamed over an empty one
    (allowed), over a non-empty one (``ENOTEMPTY``) and into its own child (``EINVAL``); the
    storage root ends as the plain directory did."""
    user = caller(world, who)
    on_disk, through, local, mounted = same_calls(world, WORKING_DIRECTORY, user)
    assert through == on_disk
    assert on_disk["cwd tail"] == ["moved", "b"]
    assert on_disk["rename a directory over a non-empty one"] == "ENOTEMPTY"
    assert on_disk["rename a directory into its own child"] == "EINVAL"
    assert sorted(on_disk["files"]) == ["empty", "empty/held2", "empty/made", "empty/sub",
                                        "moved"]  # fmt: skip
    assert owners_swapped(mounted, user) == owners_swapped(local, user)


# ------------------------------------------------------------------ the agent's own view


AGENTS_DESCRIPTORS = """
A, H, T = sys.argv[2], sys.argv[3], sys.argv[4]
fd = os.open(os.path.join(A, "f"), os.O_RDONLY)
e("read-only space: futimens", os.utime, fd, ns=(10**9, 10**9))
e("read-only space: futimens now", os.utime, fd)
e("read-only space: fchown to self", os.fchown, fd, os.getuid(), os.getgid())
e("read-only space: fchmod", os.fchmod, fd, 0o600)
e("read-only space: ftruncate of a read-only descriptor", os.ftruncate, fd, 0)
e("read-only space: reopen for writing",
  lambda: os.close(os.open(f"/proc/self/fd/{fd}", os.O_RDWR)))
e("read-only space: fsync", os.fsync, fd)
os.close(fd)
e("read-only space: O_TMPFILE", os.open, A, os.O_TMPFILE | os.O_RDWR, 0o600)
e("home: symlink", os.symlink, "target", os.path.join(H, "link"))
fd = os.open(os.path.join(H, "u"), os.O_CREAT | os.O_RDWR, 0o644)
os.write(fd, b"home")
os.unlink(os.path.join(H, "u"))
e("home, unlinked: write", os.write, fd, b"+more")
e("home, unlinked: ftruncate", os.ftruncate, fd, 16)
e("home, unlinked: fchmod", os.fchmod, fd, 0o600)
e("home, unlinked: fchown to its own group", os.fchown, fd, -1, os.getgid())
e("home, unlinked: fchown to root", os.fchown, fd, 0, -1)
e("home, unlinked: futimens", os.utime, fd, ns=(10**9, 3 * 10**9))
e("home, unlinked: reopen", lambda: os.close(os.open(f"/proc/self/fd/{fd}", os.O_WRONLY)))
e("home, unlinked: fdatasync", os.fdatasync, fd)
st = os.fstat(fd)
out["home, unlinked: fstat"] = [st.st_nlink, st.st_size, stat.filemode(st.st_mode),
                                st.st_mtime_ns]
os.close(fd)
with open(os.path.join(T, "config"), "w") as f:
    f.write("old")
fd = os.open(os.path.join(T, "config"), os.O_RDWR)
with open(os.path.join(T, "config.new"), "w") as f:
    f.write("new")
e("space: rename over an open file", os.rename, os.path.join(T, "config.new"),
  os.path.join(T, "config"))
e("space: write the replaced file", os.pwrite, fd, b"OLD", 0)
e("space: ftruncate the replaced file", os.ftruncate, fd, 2)
out["space: replaced bytes"] = os.pread(fd, 8, 0).decode()
os.close(fd)
out["space"] = files(T)
out["home"] = files(H)
"""


def test_the_agents_view_keeps_descriptors_in_its_home_and_space_and_refuses_read_only_ones(
    world,
):
    """F-1 and T-5 through ``ctx mount --as coder``, as the agent's uid: a descriptor of a
    file in space ``audit``, which the agent may only read, changes nothing through ``futimens``
    (exact or now), ``fchown``, ``fchmod`` or a reopen for writing (``EACCES``, docs/mount.md);
    ``ftruncate`` of a read-only descriptor is the kernel's ``EINVAL``; ``O_TMPFILE`` there is
    refused.  In its home a file unlinked while open keeps taking writes, truncates, mode,
    group and times (a chown to root stays ``EPERM``) and reopens; a symbolic link is
    ``ENOSYS`` (*Not provided*); in space ``team`` a file renamed over while open keeps its
    old bytes for its descriptor.  Nothing of ``audit`` changes on the storage root."""
    read_only = world.fresh(world.data(READ_ONLY), "ro", world.user)
    read_only.chmod(0o2775)
    (read_only / "f").write_text("audited\n")
    os.chown(read_only / "f", world.user.uid, world.user.gid)
    (read_only / "f").chmod(0o664)
    home = world.fresh(world.home, "descriptors", world.user)
    space = world.fresh(world.data(WRITABLE), "replace", world.user)
    before = tree(read_only)
    stamp = os.stat(read_only / "f").st_mtime_ns
    through = [world.through(world.view, path) for path in (read_only, home, space)]
    answers = probe(AGENTS_DESCRIPTORS, world.view, world.user, *through)
    refused = {k: v for k, v in answers.items() if k.startswith("read-only space")}
    assert refused == {
        "read-only space: futimens": "EACCES",
        "read-only space: futimens now": "EACCES",
        "read-only space: fchown to self": "EACCES",
        "read-only space: fchmod": "EACCES",
        "read-only space: ftruncate of a read-only descriptor": "EINVAL",
        "read-only space: reopen for writing": "EACCES",
        "read-only space: fsync": "ok",
        "read-only space: O_TMPFILE": EOPNOTSUPP,
    }
    assert tree(read_only) == before and os.stat(read_only / "f").st_mtime_ns == stamp
    mine = {k: v for k, v in answers.items() if k.startswith("home")}
    assert mine == {
        "home: symlink": "ENOSYS",
        "home, unlinked: write": "ok",
        "home, unlinked: ftruncate": "ok",
        "home, unlinked: fchmod": "ok",
        "home, unlinked: fchown to its own group": "ok",
        "home, unlinked: fchown to root": "EPERM",
        "home, unlinked: futimens": "ok",
        "home, unlinked: reopen": "ok",
        "home, unlinked: fdatasync": "ok",
        "home, unlinked: fstat": [0, 16, "-rw-------", 3 * 10**9],
        "home": {},
    }
    assert os.listdir(home) == []
    assert answers["space: rename over an open file"] == "ok"
    assert answers["space: replaced bytes"] == "OL"
    assert answers["space"] == {"config": ["-rw-r--r--", 1, "new", "now"]}
    config = (space / "config").stat()
    assert (config.st_uid, config.st_gid) == (world.user.uid, world.user.gid)


# ------------------------------------------------------------------------- O_TMPFILE


TMPFILE = """
def tmpfile_or_fallback(directory, name, data):
    try:
        fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY, 0o640)
    except OSError as x:
        if x.errno not in (errno.EOPNOTSUPP, errno.EISDIR):
            raise
        out["O_TMPFILE"] = errno.errorcode[x.errno]
        out["left by the refusal"] = sorted(os.listdir(directory))
        temp = os.path.join(directory, "." + name + ".tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        os.write(fd, data)
        os.fsync(fd)
        os.close(fd)
        os.link(temp, os.path.join(directory, name))
        os.unlink(temp)
    else:
        out["O_TMPFILE"] = "ok"
        os.write(fd, data)
        os.fsync(fd)
        e("linkat", linkat_follow, f"/proc/self/fd/{fd}", os.path.join(directory, name))
        os.close(fd)
tmpfile_or_fallback(d, "result", b"written whole, then named")
e("O_TMPFILE | O_EXCL", os.open, d, os.O_TMPFILE | os.O_EXCL | os.O_RDWR, 0o600)
out["files"] = files(d)
"""


@pytest.mark.parametrize("view", ["host", "agent"])
def test_o_tmpfile_is_refused_as_open_2_says_and_the_usual_fallback_leaves_the_same_file(
    world, view
):
    """F-1 (docs/mount.md is silent on ``O_TMPFILE``): on the storage root a program makes an
    unnamed file with ``O_TMPFILE``, writes it whole and names it with ``linkat``; through
    the host's view (as root) and through the agent's view (as its uid, in its writable
    space) ``open(O_TMPFILE)`` is refused with ``EOPNOTSUPP`` — the answer open(2) gives for a
    filesystem without it, on which programs fall back to a named temporary file and a
    ``link`` — leaving nothing behind, and the fallback leaves the same file (bytes, mode,
    owner, group) on the storage root as the unnamed file did."""
    user = world.user if view == "agent" else None
    mount = world.view if view == "agent" else world.host
    on_disk, through, local, mounted = same_calls(world, TMPFILE, user, mount)
    assert on_disk["O_TMPFILE"] == "ok" and on_disk["linkat"] == "ok"
    assert through["O_TMPFILE"] == EOPNOTSUPP and through["left by the refusal"] == []
    assert through["O_TMPFILE | O_EXCL"] == EOPNOTSUPP
    assert through["files"] == on_disk["files"]
    assert owners_swapped(mounted, user) == owners_swapped(local, user)


# --------------------------------------------------------------- O_EXCL across two views


CREATOR = """
import errno, os, sys
here, tag, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.umask(0o022)
sys.stdin.read(1)  # both start together
said = []
for i in range(rounds):
    try:
        fd = os.open(f"{here}/c.{i}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        os.write(fd, tag.encode())
        os.close(fd)
        said.append("ok")
    except OSError as x:
        said.append(errno.errorcode[x.errno])
print(" ".join(said))
"""


def test_o_excl_creates_racing_through_the_host_view_and_the_agents_view_have_one_winner(
    world,
):
    """F-1 and docs/mount.md (*Ownership*; X-1): root through the host's view and the agent's
    uid through its own view create the same 300 names with ``O_CREAT | O_EXCL`` at the same
    time: each name has exactly one creator, the other gets ``EEXIST``, and the file on the
    storage root holds the winner's bytes and is the winner's (its uid, the space's group of
    the setgid directory, mode 0640)."""
    rounds = 300
    race = world.fresh(world.data(WRITABLE), "race", world.user)
    race.chmod(0o2775)
    racers = []
    for mount, tag, user in ((world.host, "H", None), (world.view, "V", world.user)):
        racer = subprocess.Popen(
            [sys.executable, "-c", CREATOR, str(world.through(mount, race)), tag, str(rounds)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **ids_of(user),
        )  # fmt: skip
        racers.append(racer)
    for racer in racers:
        racer.stdin.write(".")
        racer.stdin.flush()
    outcomes = [racer.communicate(timeout=60)[0].split() for racer in racers]
    assert [len(o) for o in outcomes] == [rounds, rounds], outcomes
    group = race.stat().st_gid
    wrong = []
    for i, pair in enumerate(zip(*outcomes, strict=True)):
        st = (race / f"c.{i}").stat()
        if sorted(pair) != ["EEXIST", "ok"]:
            wrong.append((i, pair))
            continue
        tag, uid = ("H", 0) if pair[0] == "ok" else ("V", world.user.uid)
        seen = ((race / f"c.{i}").read_text(), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
        if seen != (tag, uid, group, 0o640):
            wrong.append((i, pair, seen))
    assert wrong == []
    assert sorted(os.listdir(race)) == sorted(f"c.{i}" for i in range(rounds))


# -------------------------------------------------------------- sizes, holes, O_DIRECT


LARGE = """
f = p("big")
fd = os.open(f, os.O_CREAT | os.O_RDWR, 0o644)
e("pwrite at 1 TiB", os.pwrite, fd, b"T", 1 << 40)
e("pwrite at 16 TiB", os.pwrite, fd, b"T", 1 << 44)
e("pwrite at 2^62", os.pwrite, fd, b"T", 1 << 62)
e("ftruncate to 2^50", os.ftruncate, fd, 1 << 50)
e("truncate to 2^50", os.truncate, f, 1 << 50)
if e("lseek to 2^62", os.lseek, fd, 1 << 62, os.SEEK_SET) is not None:
    e("write after the lseek", os.write, fd, b"x")
st = os.fstat(fd)
out["size"] = st.st_size
out["allocated less than 1 MiB"] = st.st_blocks * 512 < (1 << 20)
out["last byte"] = os.pread(fd, 1, 1 << 40).decode()
out["zeros in the hole"] = os.pread(fd, 4, 1 << 39) == bytes(4)
e("ftruncate back to 4 KiB", os.ftruncate, fd, 4096)
out["size after"] = os.fstat(fd).st_size
os.close(fd)
fd = os.open(p("sparse"), os.O_CREAT | os.O_WRONLY, 0o644)
os.pwrite(fd, b"head", 0)
os.pwrite(fd, b"tail", 32 << 20)
os.close(fd)
"""


def allocated(path: Path) -> int:
    return path.stat().st_blocks * 512


@WHO
def test_sparse_files_and_offsets_up_to_the_filesystems_limit_answer_as_the_storage_root(
    world, who
):
    """F-1 (the storage root as it is): writes at 1 TiB, 16 TiB and 2^62, truncates to 2^50 by
    descriptor and by path, a write after ``lseek`` to 2^62 (refused at the
    ``lseek`` or at the write), and a shrink afterwards answer
    through the host's view as on the storage root (``EFBIG`` where its filesystem's limit
    says so), and the holes stay holes on disk; ``cp --sparse=always`` of a 32 MiB sparse
    file into the mount and out of it copies the bytes and keeps the holes."""
    if shutil.which("cp") is None:
        pytest.skip("cp is not installed")
    user = caller(world, who)
    on_disk, through, local, mounted = same_calls(world, LARGE, user)
    # Past the filesystem's limit the storage root refuses the lseek (EINVAL), the mount the
    # write after it (EFBIG): either way nothing is written there.
    seeks = [answers.pop("lseek to 2^62") for answers in (on_disk, through)]
    writes = [answers.pop("write after the lseek", None) for answers in (on_disk, through)]
    for seek, write in zip(seeks, writes, strict=True):
        assert (seek, write) in (("EINVAL", None), ("ok", "EFBIG")), (seeks, writes)
    assert through == on_disk
    assert on_disk["last byte"] == "T" and on_disk["zeros in the hole"] is True
    assert on_disk["allocated less than 1 MiB"] is True
    assert allocated(mounted / "big") < (1 << 20)
    assert owners_swapped(mounted, user) == owners_swapped(local, user)
    into = world.through(world.host, mounted / "copied-in")
    copied = subprocess.run(["cp", "--sparse=always", str(local / "sparse"), str(into)],
                            capture_output=True, text=True, **ids_of(user))  # fmt: skip
    assert copied.returncode == 0, copied.stderr
    out_of = local / "copied-out"
    copied = subprocess.run(
        ["cp", "--sparse=always", str(world.through(world.host, mounted / "sparse")), str(out_of)],
        capture_output=True, text=True, **ids_of(user),
    )  # fmt: skip
    assert copied.returncode == 0, copied.stderr
    original = (local / "sparse").read_bytes()
    for copy in (mounted / "copied-in", out_of):
        assert copy.read_bytes() == original
        assert allocated(copy) < (1 << 20), copy


DIRECT = """
buffer = mmap.mmap(-1, 8192)
buffer.write(b"d" * 8192)
fd = e("open O_DIRECT", os.open, p("direct"), os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o644)
if fd is not None:
    out["write"] = e("aligned write", os.pwrite, fd, buffer, 0)
    back = mmap.mmap(-1, 4096)
    out["read"] = e("aligned read", os.preadv, fd, [back], 4096)
    out["bytes"] = back[:4].decode()
    os.close(fd)
with open(p("existing"), "wb") as f:
    f.write(b"e" * 8192)
fd = os.open(p("existing"), os.O_RDONLY | os.O_DIRECT)
back = mmap.mmap(-1, 4096)
out["read of a file written before"] = e("aligned read of a file written before", os.preadv,
                                         fd, [back], 4096)
out["bytes of a file written before"] = back[:4].decode()
os.close(fd)
out["files"] = files(d)
"""


def test_aligned_o_direct_writes_and_reads_through_the_mount_work_as_on_the_storage_root(world):
    """F-1 (the storage root, mounted: "the host's view is the storage root"): a program
    that opens with ``O_DIRECT`` (``dd oflag=direct``, a database) and writes and reads
    page-aligned buffers of whole pages gets the same answers through the host's view as on
    the storage root, and the same file."""
    on_disk, through, _, _ = same_calls(world, DIRECT, None)
    if on_disk.get("aligned write") != "ok":
        pytest.skip(f"the storage filesystem takes no O_DIRECT: {on_disk}")
    assert through == on_disk


CHANGED_BEHIND = """
disk = sys.argv[2]
for how in ("unlinked", "replaced"):
    name = f"open-{how}"
    with open(p(name), "w") as f:
        f.write("original")
    fd = os.open(p(name), os.O_RDWR)
    os.stat(p(name))
    if how == "unlinked":
        os.unlink(os.path.join(disk, name))
    else:
        with open(os.path.join(disk, name + ".new"), "w") as f:
            f.write("replacement")
        os.rename(os.path.join(disk, name + ".new"), os.path.join(disk, name))
    e(f"{how}: write", os.pwrite, fd, b"ORIG", 0)
    e(f"{how}: ftruncate", os.ftruncate, fd, 4)
    e(f"{how}: fchmod", os.fchmod, fd, 0o600)
    e(f"{how}: futimens", os.utime, fd, ns=(10**9, 2 * 10**9))
    e(f"{how}: fsync", os.fsync, fd)
    e(f"{how}: reopen /proc/self/fd",
      lambda: os.close(os.open(f"/proc/self/fd/{fd}", os.O_RDWR)))
    st = os.fstat(fd)
    out[f"{how}: fstat"] = [st.st_nlink, st.st_size, stat.filemode(st.st_mode), st.st_mtime_ns]
    out[f"{how}: bytes"] = os.pread(fd, 16, 0).decode()
    os.close(fd)
out["files"] = files(d)
"""


def test_a_descriptor_stays_usable_when_its_file_is_unlinked_or_replaced_on_the_storage_root(
    world,
):
    """docs/mount.md *Open files* ("a file unlinked while it is open stays usable through its
    descriptor until the last one is closed (``fstat``, ``read``, ``write``, ``ftruncate``,
    ``fchmod``, reopening ``/proc/PID/fd/N``), as on a local filesystem") and *Identity* (a
    descriptor stands for its file): a program holds a file open through the host's view
    while another program, on the host, unlinks it or renames a new file over it on the
    storage root (an editor saving, a configuration tool); every call through the held
    descriptor answers as it does when both programs work on the storage root."""
    user = world.user
    local = world.fresh(world.data(WRITABLE), "local", user)
    mounted = world.fresh(world.data(WRITABLE), "mount", user)
    on_disk = probe(CHANGED_BEHIND, local, user, local)
    through = probe(CHANGED_BEHIND, world.through(world.host, mounted), user, mounted)
    assert on_disk["unlinked: fstat"] == [0, 4, "-rw-------", 2 * 10**9]
    assert through == on_disk


# ------------------------------------------------------------ the queue, worked at once


WORKER = """
import json, os, subprocess, sys, time
ctx, queue, worker, stop = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
done = []
while True:
    claim = subprocess.run([ctx, "queue", "claim", "--queue", queue, "--worker", worker,
                            "--pid", str(os.getpid())], capture_output=True, text=True)
    if claim.returncode == 3:
        if os.path.exists(stop):
            break
        time.sleep(0.02)
        continue
    if claim.returncode != 0:
        print(json.dumps({"error": ["claim", claim.returncode, claim.stderr]}))
        sys.exit(1)
    job = claim.stdout.strip()
    finish = subprocess.run([ctx, "queue", "finish", "--queue", queue, job, "--ok", "-"],
                            input=json.dumps({"by": worker}), capture_output=True, text=True)
    if finish.returncode != 0:
        print(json.dumps({"error": ["finish", job, finish.returncode, finish.stderr]}))
        sys.exit(1)
    done.append(job)
print(json.dumps({"done": done}))
"""

PUBLISHERS = """
import json, os, subprocess, sys
ctx, queue, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
request = {"tool": "fs.stat", "input": {"path": "/"}}
def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
# "cli": one `ctx queue publish` each; "hand": Q-1 with plain calls, through the same view.
if sys.argv[4] == "cli":
    for i in range(count):
        done = subprocess.run([ctx, "queue", "publish", "--queue", queue, "--name",
                               f"cli-{i:03d}", "-"], input=json.dumps({**request, "n": i}),
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
else:
    for i in range(count):
        job = f"hand-{i:03d}.req.json"
        temp = os.path.join(queue, "inbox", job + ".publish.tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o660)
        os.write(fd, json.dumps({**request, "n": i}).encode())
        os.fsync(fd)
        os.close(fd)
        os.link(temp, os.path.join(queue, "pending", job))
        os.unlink(temp)
        fsync_dir(os.path.join(queue, "pending"))
        fsync_dir(os.path.join(queue, "inbox"))
"""


def test_jobs_published_by_cli_and_by_hand_and_claimed_at_once_through_the_view_run_once(
    world,
):
    """F-1 with Q-1..Q-6 and docs/mount.md ("The queue works through the mount"; locks hold
    within one mount, so the whole queue is worked through the one view): as the agent's uid,
    through its view, ``ctx queue publish`` publishes 8 jobs while a program publishes 8
    more by hand (temp in ``inbox/``, fsync, ``link`` into ``pending/``, ``unlink``) and two
    workers each loop on ``ctx queue claim`` and ``ctx queue finish``.  Every job ends in
    ``done/`` once, finished by exactly one worker, its result the agent's; nothing is left
    in flight, and ``ctx queue recover`` through the same view calls the queue consistent."""
    count = 8
    queue_dir = world.storage / "shared" / WRITABLE / "queue"
    viewed = world.through(world.view, queue_dir)
    scratch = world.fresh(world.top, "queue-race", world.user)
    stop = scratch / "stop"
    cache = scratch / "cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, world.user.uid, world.user.gid)
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "HOME": str(scratch),
           "XDG_CACHE_HOME": str(cache)}  # fmt: skip
    ctx = CTX_ARGV[0]

    def start(script: str, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", script, ctx, str(viewed), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            **ids_of(world.user),
        )  # fmt: skip

    workers = [start(WORKER, f"w{n}", str(stop)) for n in (1, 2)]
    publishers = [start(PUBLISHERS, str(count), how) for how in ("cli", "hand")]
    try:
        for publisher in publishers:
            _, err = publisher.communicate(timeout=120)
            assert publisher.returncode == 0, err
    finally:
        stop.touch()
    finished = []
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, (out, err)
        finished.append(json.loads(out)["done"])
    jobs = sorted(f"{how}-{i:03d}.req.json" for how in ("cli", "hand") for i in range(count))
    assert sorted(finished[0] + finished[1]) == jobs
    assert requests_by_state(queue_dir) == {job: ["done"] for job in jobs}
    for job in jobs:
        result = queue_dir / "done" / f"{job}.result"
        by = json.loads(result.read_text())["output"]["by"]
        assert job in finished[0 if by == "w1" else 1], (job, by)
        assert result.stat().st_uid == world.user.uid
    for sub in ("inbox", "pending", "claimed", "lease"):
        assert os.listdir(queue_dir / sub) == [], sub
    recovered = subprocess.run(
        [ctx, "queue", "recover", "--queue", str(viewed), "--json"],
        capture_output=True, text=True, env=env, timeout=60, **ids_of(world.user),
    )  # fmt: skip
    assert recovered.returncode == 0, recovered.stderr
    assert json.loads(recovered.stdout)["consistent"] is True, recovered.stdout
