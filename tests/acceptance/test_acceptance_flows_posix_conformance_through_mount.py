"""``ctx mount`` (SPEC §13 F-1, docs/mount.md) checked as a POSIX filesystem, the way a
filesystem conformance suite checks one: the errno of every open flag, rename, link, unlink,
rmdir, mkdir, truncate and ``utimensat`` case; ``O_EXCL`` races and ``O_APPEND`` writers
(S-5); names at and past ``NAME_MAX``; random walks of name changes with descriptors held;
the root's six entries (R-2); ``fsync`` and ``fdatasync`` of files and directories;
listings read with ``telldir``/``seekdir``/``rewinddir`` while entries come and go; large
offsets, holes and shared mappings; ``statfs``; every ``lstat`` field, inode numbers and
link counts across lookups, renames, links and a second mount; times of a file and of its
directory; a descriptor of an unlinked file; the caller's umask, file size limit and
ownership; and the bytes, which must be the same seen through the mount and on the storage
root, whichever side wrote them.

Most sequences run twice, once directly on the storage root and once through the host's view
in a sibling directory: every answer must be the one POSIX gives, and the same on both sides,
but for what docs/mount.md sets apart (symbolic links, device nodes: ``ENOSYS``; extended
attributes; ``RENAME_WHITEOUT``: ``EINVAL``; the agent's view counts no directory links; a
directory swapped or replaced behind the mount is ``ENOENT``/``ESTALE``/``ELOOP``/``ENOTDIR``).
The agent's view (``ctx mount --as coder``, running as an unprivileged user that may write
space ``team`` and its home, only read space ``audit``, and not see space ``secret``) is
checked for the same calls, with ``EACCES`` and ``ENOENT`` where the page says so."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import json
import mmap
import os
import random
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    ROOT_ENTRIES,
    Mount,
    ctx_run,
    mounted_at,
    needs_fuse,
    needs_fuse_as_root,
    new_scratch_dir,
    scratch_top,
    serving,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, find_or_create_user

SCRATCH = scratch_top(__file__)
AGENT = "coder"
WRITABLE, READ_ONLY, HIDDEN = "team", "audit", "secret"
OTHER_UID, OTHER_GID = 4321, 4322  # an owner that is neither root nor the test user
EOPNOTSUPP = errno.errorcode[errno.EOPNOTSUPP]  # Python names 95 ENOTSUP
SEQUENCE = itertools.count()  # the directories of one world, each used once
ALIASES = 1 << 62  # docs/mount.md: a reused inode number still held is shown above 2^62

pytestmark = [needs_fuse_as_root, needs_fuse]  # a mount serving other uids needs root

# ------------------------------------------------------------------------------ libc

LIBC = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT = 1, 2, 4
UTIME_NOW, UTIME_OMIT = (1 << 30) - 1, (1 << 30) - 2
DT_DIR, DT_REG, DT_LNK = 4, 8, 10


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class Dirent(ctypes.Structure):
    _fields_ = [
        ("d_ino", ctypes.c_uint64),
        ("d_off", ctypes.c_int64),
        ("d_reclen", ctypes.c_ushort),
        ("d_type", ctypes.c_ubyte),
        ("d_name", ctypes.c_char * 256),
    ]


LIBC.opendir.restype = ctypes.c_void_p
LIBC.opendir.argtypes = [ctypes.c_char_p]
LIBC.readdir.restype = ctypes.POINTER(Dirent)
LIBC.readdir.argtypes = [ctypes.c_void_p]
LIBC.telldir.restype = ctypes.c_long
LIBC.telldir.argtypes = [ctypes.c_void_p]
LIBC.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
LIBC.rewinddir.argtypes = [ctypes.c_void_p]
LIBC.closedir.argtypes = [ctypes.c_void_p]


def _failed(path: object) -> None:
    code = ctypes.get_errno()
    raise OSError(code, os.strerror(code), str(path))


def renameat2(old: Path, new: Path, flags: int) -> None:
    if LIBC.renameat2(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), flags) != 0:
        _failed(old)


def utimensat(path: Path, atime: tuple[int, int], mtime: tuple[int, int]) -> None:
    times = (Timespec * 2)(Timespec(*atime), Timespec(*mtime))
    if LIBC.utimensat(AT_FDCWD, os.fsencode(path), times, 0) != 0:
        _failed(path)


@contextlib.contextmanager
def opened_directory(path: Path) -> Iterator[int]:
    """A ``DIR *`` of ``path`` (libc's ``opendir``), closed at the end."""
    handle = LIBC.opendir(os.fsencode(path))
    if not handle:
        _failed(path)
    try:
        yield handle
    finally:
        LIBC.closedir(handle)


def next_entry(handle: int) -> tuple[str, int, int] | None:
    """The next ``readdir`` entry of ``handle``: name, ``d_ino``, ``d_type``; None at the end."""
    entry = LIBC.readdir(handle)
    if not entry:
        return None
    found = entry.contents
    return os.fsdecode(found.d_name), found.d_ino, found.d_type


def answer(call: Callable, *args, **kwargs) -> str:
    """``ok``, or the errno name of the OSError ``call(*args, **kwargs)`` raised."""
    try:
        result = call(*args, **kwargs)
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    del result
    return "ok"


def opened(path: Path, flags: int, mode: int = 0o644, **kwargs) -> None:
    """``open(2)`` of ``path`` with ``flags``, the descriptor closed at once."""
    os.close(os.open(path, flags, mode, **kwargs))


def kinds(top: Path) -> dict[str, tuple]:
    """Each entry under ``top`` (never following links): kind and content, or link target."""
    shown: dict[str, tuple] = {}
    for path in sorted(top.rglob("*")):
        st = path.lstat()
        rel = str(path.relative_to(top))
        if stat.S_ISREG(st.st_mode):
            shown[rel] = ("file", path.read_bytes())
        elif stat.S_ISDIR(st.st_mode):
            shown[rel] = ("dir",)
        elif stat.S_ISLNK(st.st_mode):
            shown[rel] = ("link", os.readlink(path))
        else:
            shown[rel] = ("other", stat.S_IFMT(st.st_mode))
    return shown


# ------------------------------------------------------------------------------ the world


@dataclass
class World:
    """A storage root mounted twice: the host's view and agent ``coder``'s view."""

    top: Path
    storage: Path
    host: Path
    view: Path
    user: UnprivilegedUser

    def data(self, space: str = WRITABLE) -> Path:
        return self.storage / "shared" / space / "data"

    @property
    def home(self) -> Path:
        return self.storage / "home" / str(self.user.uid)

    def through(self, mount: Path, path: Path) -> Path:
        """``path`` (below the storage root) as ``mount`` shows it."""
        return mount / path.relative_to(self.storage)

    def fresh(self, label: str, mode: int = 0o777, space: str = WRITABLE) -> Path:
        """A new directory of ``space``'s ``data/`` on the storage root, of mode ``mode``
        exactly (no set-group-ID bit inherited), owned by root."""
        path = self.data(space) / f"{label}-{next(SEQUENCE)}"
        path.mkdir()
        path.chmod(mode)
        return path

    def pair(self, label: str, mode: int = 0o777) -> tuple[Path, Path, Path]:
        """Two new sibling directories: one used directly on the storage root, one through
        the host's view; (the first, the second on disk, the second through the mount)."""
        disk, stored = self.fresh(f"{label}-disk", mode), self.fresh(f"{label}-mount", mode)
        return disk, stored, self.through(self.host, stored)


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
            yield World(top, storage, host, view, user)
    finally:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            where = line.split()[4]
            if where.startswith(str(top) + "/"):
                subprocess.run(["umount", "-l", where], check=False)
        shutil.rmtree(top, ignore_errors=True)


# A program run as the test user: ``e(NAME, f, ...)`` records "ok" or the errno's name under
# NAME in ``out``, printed as JSON at the end; ``d`` is ``sys.argv[1]``.
PRELUDE = textwrap.dedent(
    """
    import ctypes, errno, json, os, stat, subprocess, sys
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
    def renameat2(a, b, flags):
        if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), flags) != 0:
            n = ctypes.get_errno()
            raise OSError(n, os.strerror(n))
    def mode(path):
        return oct(stat.S_IMODE(os.lstat(path).st_mode))
    d = sys.argv[1]
    p = lambda *names: os.path.join(d, *names)
    """
)


def as_user(user: UnprivilegedUser, body: str, directory: Path, *args: object) -> dict:
    """The answers of ``PRELUDE + body`` run by ``user`` (its own group only) in
    ``directory`` (``sys.argv[1]``, then ``args``)."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n",
         str(directory), *map(str, args)],
        capture_output=True, text=True, timeout=60, cwd="/",
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"},
        user=user.uid, group=user.gid, extra_groups=[user.gid],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def owned_by_another(directory: Path, name: str, mode: int, text: str = "theirs\n") -> Path:
    """``directory/name`` holding ``text``, of another owner and of mode ``mode``."""
    path = directory / name
    path.write_text(text)
    os.chown(path, OTHER_UID, OTHER_GID)
    path.chmod(mode)
    return path


# ------------------------------------------------------------------ opens, host's view


def open_flag_answers(d: Path) -> dict[str, str]:
    (d / "f").write_text("hello")
    (d / "dir").mkdir()
    return {
        "O_DIRECTORY of a file": answer(opened, d / "f", os.O_RDONLY | os.O_DIRECTORY),
        "O_CREAT|O_DIRECTORY": answer(opened, d / "new", os.O_RDONLY | os.O_CREAT | os.O_DIRECTORY),
        "O_WRONLY of a directory": answer(opened, d / "dir", os.O_WRONLY),
        "O_RDWR|O_CREAT of a directory": answer(opened, d / "dir", os.O_RDWR | os.O_CREAT),
        "O_DIRECTORY of a directory": answer(opened, d / "dir", os.O_RDONLY | os.O_DIRECTORY),
        "O_EXCL of a file": answer(opened, d / "f", os.O_WRONLY | os.O_CREAT | os.O_EXCL),
        "O_EXCL of a directory": answer(opened, d / "dir", os.O_RDONLY | os.O_CREAT | os.O_EXCL),
        "O_EXCL of a dangling link": answer(
            opened, d / "dangling", os.O_WRONLY | os.O_CREAT | os.O_EXCL
        ),
        "O_NOFOLLOW of a link": answer(opened, d / "link", os.O_RDONLY | os.O_NOFOLLOW),
        "O_NOFOLLOW|O_DIRECTORY of a link": answer(
            opened, d / "dirlink", os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY
        ),
        "O_PATH|O_NOFOLLOW of a link": answer(opened, d / "link", os.O_PATH | os.O_NOFOLLOW),
        "O_DIRECTORY through a link to a directory": answer(
            opened, d / "dirlink", os.O_RDONLY | os.O_DIRECTORY
        ),
        "a link followed": (d / "link").read_text(),
        "O_CREAT through a dangling link": answer(opened, d / "dangling", os.O_WRONLY | os.O_CREAT),
        "a path through a file": answer(opened, d / "f" / "x", os.O_RDONLY),
        "O_CREAT through a file": answer(opened, d / "f" / "x", os.O_WRONLY | os.O_CREAT),
        "O_CREAT below a missing directory": answer(
            opened, d / "missing" / "x", os.O_WRONLY | os.O_CREAT
        ),
        "a missing name": answer(opened, d / "missing", os.O_RDONLY),
    }


def links_on_disk(directory: Path) -> None:
    """Symbolic links made on the storage root (the mount makes none): to a file, to a
    directory, and to a name that does not exist yet."""
    os.symlink("f", directory / "link")
    os.symlink("dir", directory / "dirlink")
    os.symlink("made-by-link", directory / "dangling")


def test_open_flags_answer_with_the_errnos_posix_gives(world):
    """F-1, open(2): ``O_DIRECTORY`` of a file (``ENOTDIR``), ``O_WRONLY``/``O_CREAT`` of a
    directory (``EISDIR``), ``O_EXCL`` of a file, a directory or a dangling link
    (``EEXIST``), ``O_NOFOLLOW`` of a link (``ELOOP``; with ``O_DIRECTORY``: ``ENOTDIR``), a
    path through a file (``ENOTDIR``), a missing parent (``ENOENT``); links made on disk are
    followed by the caller, and ``O_CREAT`` through a dangling one makes its target: the same
    answers through the host's view as on the storage root, and the same tree left."""
    disk, stored, mounted = world.pair("open")
    links_on_disk(disk)
    links_on_disk(stored)
    on_disk, through = open_flag_answers(disk), open_flag_answers(mounted)
    assert through == on_disk
    assert through == {
        **on_disk,
        "O_DIRECTORY of a file": "ENOTDIR",
        "O_WRONLY of a directory": "EISDIR",
        "O_RDWR|O_CREAT of a directory": "EISDIR",
        "O_DIRECTORY of a directory": "ok",
        "O_EXCL of a file": "EEXIST",
        "O_EXCL of a directory": "EEXIST",
        "O_EXCL of a dangling link": "EEXIST",
        "O_NOFOLLOW of a link": "ELOOP",
        "O_NOFOLLOW|O_DIRECTORY of a link": "ENOTDIR",
        "O_PATH|O_NOFOLLOW of a link": "ok",
        "O_DIRECTORY through a link to a directory": "ok",
        "a link followed": "hello",
        "O_CREAT through a dangling link": "ok",
        "a path through a file": "ENOTDIR",
        "O_CREAT through a file": "ENOTDIR",
        "O_CREAT below a missing directory": "ENOENT",
        "a missing name": "ENOENT",
    }
    assert kinds(stored) == kinds(disk)
    assert kinds(stored)["made-by-link"] == ("file", b"")


def test_o_excl_has_one_winner_among_threads_and_leaves_the_first_file_whole(world):
    """open(2) ``O_CREAT|O_EXCL`` through the host's view: of eight threads racing for each
    of 24 names exactly one creates it, the others get ``EEXIST``; a later ``O_EXCL`` with
    ``O_TRUNC`` is ``EEXIST`` too and neither truncates nor changes the mode of the file."""
    _, stored, mounted = world.pair("excl")
    names = [f"n{i}" for i in range(24)]
    results: dict[str, list[str]] = {name: [] for name in names}
    lock = threading.Lock()

    def racer(tag: int) -> None:
        for name in names:
            try:
                fd = os.open(mounted / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except OSError as exc:
                outcome = errno.errorcode[exc.errno]
            else:
                os.write(fd, f"winner {tag}".encode())
                os.close(fd)
                outcome = f"won {tag}"
            with lock:
                results[name].append(outcome)

    threads = [threading.Thread(target=racer, args=(tag,)) for tag in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, outcomes in results.items():
        winners = [o for o in outcomes if o.startswith("won")]
        assert len(winners) == 1 and outcomes.count("EEXIST") == 7, (name, outcomes)
        assert (stored / name).read_text() == "winner " + winners[0].split()[1]
    again = answer(opened, mounted / "n0", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_TRUNC)
    assert again == "EEXIST"
    assert (stored / "n0").read_text().startswith("winner ")
    assert stat.S_IMODE((stored / "n0").stat().st_mode) == 0o600


def test_o_trunc_empties_the_file_on_disk_and_marks_its_times(world):
    """open(2) ``O_TRUNC`` through the host's view empties the file on the storage root at
    once and marks its mtime and ctime, as directly; ``O_TRUNC`` of an empty file too."""
    _, stored, mounted = world.pair("trunc")
    (stored / "f").write_bytes(b"0123456789")
    (stored / "empty").write_bytes(b"")
    for name in ("f", "empty"):
        os.utime(stored / name, ns=(1_000_000_000, 1_000_000_000))
        ctime = (stored / name).stat().st_ctime_ns
        time.sleep(0.02)
        fd = os.open(mounted / name, os.O_WRONLY | os.O_TRUNC)
        assert (stored / name).stat().st_size == 0  # before the close
        os.close(fd)
        on_disk, shown = (stored / name).stat(), (mounted / name).stat()
        assert on_disk.st_mtime_ns > 1_000_000_000 and on_disk.st_ctime_ns > ctime, name
        assert (shown.st_size, shown.st_mtime_ns) == (0, on_disk.st_mtime_ns)


APPENDER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
for i in range(int(sys.argv[3])):
    os.write(fd, f"{sys.argv[2]} {i:05d} ".encode() + b"x" * 990 + b"\\n")
os.close(fd)
"""

# Appends short lines to a file on the storage root until a flag file appears; says "go"
# once it has its descriptor.
DIRECT_APPENDER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND)
print("go", flush=True)
i = 0
while i % 64 or not os.path.exists(sys.argv[2]):
    os.write(fd, b"d %07d " % i + b"y" * 21 + b"\\n")
    i += 1
"""


def whole_lines(data: bytes) -> tuple[dict[bytes, list[int]], list[bytes]]:
    """The numbers of each writer's whole lines (999 bytes from a mount writer, 31 from a
    direct one) and every line that is neither (torn)."""
    numbers: dict[bytes, list[int]] = {}
    torn = []
    for line in data.splitlines():
        tag, _, rest = line.partition(b" ")
        whole = rest[6:] == b"x" * 990 if len(line) == 999 else rest[8:] == b"y" * 21
        if len(line) in (999, 31) and whole:
            numbers.setdefault(tag, []).append(int(rest[:5] if len(line) == 999 else rest[:7]))
        else:
            torn.append(line[:24] + b"..." + line[-24:])
    return numbers, torn


def test_o_append_writers_all_through_the_mount_tear_or_lose_no_line(world):
    """open(2) ``O_APPEND`` with S-5 (one line one ``write``; concurrent appenders never
    interleave inside a line): three processes appending lines of 999 bytes, which cross
    page boundaries, through the host's view: every line is on the storage root once, whole
    and in its writer's order, and the mount reads what the disk holds."""
    _, stored, mounted = world.pair("append")
    (stored / "log").write_bytes(b"")
    writers = [
        subprocess.Popen([sys.executable, "-c", APPENDER, str(mounted / "log"), tag, "150"])
        for tag in ("m1", "m2", "m3")
    ]
    assert [w.wait(timeout=60) for w in writers] == [0, 0, 0]
    numbers, torn = whole_lines((stored / "log").read_bytes())
    assert torn == []
    assert numbers == {tag: list(range(150)) for tag in (b"m1", b"m2", b"m3")}
    assert (mounted / "log").read_bytes() == (stored / "log").read_bytes()


@contextlib.contextmanager
def slowed_writes(mount: Mount, microseconds: int) -> Iterator[None]:
    """Each ``pwrite64`` of the ``ctx mount`` process held for ``microseconds`` after it
    returns (``strace`` attached for the block, detached after): the daemon answers as on a
    busy machine, where a writer on the storage root runs between two of its calls."""
    tracer = subprocess.Popen(
        ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=pwrite64",
         "-e", f"inject=pwrite64:delay_exit={microseconds}", "-p", str(mount.proc.pid)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert wait_for(lambda: tracer.poll() is not None or traced_by(mount.proc.pid), 30)
        assert tracer.poll() is None, tracer.communicate()
        yield
    finally:
        if tracer.poll() is None:
            tracer.send_signal(signal.SIGINT)  # detaches; the daemon goes on
        tracer.communicate(timeout=30)


def traced_by(pid: int) -> bool:
    """Whether every thread of ``pid`` has a tracer attached."""
    tasks = Path(f"/proc/{pid}/task")
    return all(
        int(re.search(r"TracerPid:\s+(\d+)", (t / "status").read_text()).group(1)) != 0
        for t in tasks.iterdir()
    )


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_line_appended_through_the_mount_is_whole_beside_an_appender_on_the_storage_root(
    world,
):
    """S-5 with docs/mount.md (a write through the mount is the same write made directly;
    the runner appends to sessions on the storage root while the agent's ``/ctx`` is a
    mount): 40 lines of 999 bytes, each one ``write`` on an ``O_APPEND`` descriptor through
    a host's view whose daemon is slowed as on a busy machine, while another process appends
    short lines to the same file directly on the storage root: every line of both is whole
    on disk, each writer's in order."""
    stored = world.fresh("append-mixed")
    (stored / "log").write_bytes(b"")
    where = world.top / f"slow-{next(SEQUENCE)}"
    where.mkdir(mode=0o755)
    flag = world.top / f"stop-{next(SEQUENCE)}"
    with serving(world.storage, where) as mount, slowed_writes(mount, 25_000):
        direct = subprocess.Popen(
            [sys.executable, "-c", DIRECT_APPENDER, str(stored / "log"), str(flag)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert direct.stdout.readline() == "go\n"
            fd = os.open(world.through(where, stored) / "log", os.O_WRONLY | os.O_APPEND)
            try:
                for i in range(40):
                    os.write(fd, f"m0 {i:05d} ".encode() + b"x" * 990 + b"\n")
            finally:
                os.close(fd)
        finally:
            flag.write_bytes(b"")
            assert direct.wait(timeout=60) == 0
    numbers, torn = whole_lines((stored / "log").read_bytes())
    assert torn == []
    assert numbers[b"m0"] == list(range(40))
    assert numbers[b"d"] == list(range(len(numbers[b"d"])))


def symlink_answers(d: Path) -> dict:
    out = {
        "readlink": os.readlink(d / "link"),
        "lstat": stat.S_ISLNK(os.lstat(d / "link").st_mode),
        "lchown": answer(os.chown, d / "link", OTHER_UID, OTHER_GID, follow_symlinks=False),
        "lutimes": answer(os.utime, d / "link", ns=(10**9, 3 * 10**9), follow_symlinks=False),
        "fchmodat AT_SYMLINK_NOFOLLOW": answer(lchmod, d / "link", 0o600),
        "readlink of a file": answer(os.readlink, d / "f"),
        "hard link of the link": answer(os.link, d / "link", d / "link2", follow_symlinks=False),
        "rename of the link": answer(os.rename, d / "link2", d / "moved"),
        "unlink of the link": answer(os.unlink, d / "link"),
    }
    st = os.lstat(d / "moved")
    out["moved"] = [os.readlink(d / "moved"), st.st_uid, st.st_mtime_ns, st.st_nlink]
    out["target"] = [(d / "f").read_text(), stat.S_IMODE((d / "f").stat().st_mode)]
    return out


def lchmod(path: Path, mode: int) -> None:
    if LIBC.fchmodat(AT_FDCWD, os.fsencode(path), mode, 0x100) != 0:  # AT_SYMLINK_NOFOLLOW
        _failed(path)


def test_links_made_on_the_storage_root_are_shown_changed_and_moved_as_links(world):
    """docs/mount.md (symbolic links are shown as links and never followed by the daemon):
    a link made on the storage root reads back its target through the host's view; its owner
    and times change (``lchown``, ``lutimes``), its mode does not (``EOPNOTSUPP``), the file
    it names untouched; it is hard-linked, renamed and unlinked as a link: as on the storage
    root."""
    disk, stored, mounted = world.pair("links")
    for d in (disk, stored):
        (d / "f").write_text("target")
        (d / "f").chmod(0o644)
        os.symlink("f", d / "link")
    on_disk, through = symlink_answers(disk), symlink_answers(mounted)
    assert through == on_disk
    assert on_disk == {
        "readlink": "f",
        "lstat": True,
        "lchown": "ok",
        "lutimes": "ok",
        "fchmodat AT_SYMLINK_NOFOLLOW": EOPNOTSUPP,
        "readlink of a file": "EINVAL",
        "hard link of the link": "ok",
        "rename of the link": "ok",
        "unlink of the link": "ok",
        "moved": ["f", OTHER_UID, 3 * 10**9, 1],
        "target": ["target", 0o644],
    }
    assert kinds(stored) == kinds(disk) == {"f": ("file", b"target"), "moved": ("link", "f")}


# ---------------------------------------------------------------- names, host's view


def rename_answers(d: Path) -> dict:
    for name, text in (("a", "A"), ("b", "B"), ("c", "C")):
        (d / name).write_text(text)
    for name in ("sub", "full", "empty", "e1", "e2"):
        (d / name).mkdir()
    (d / "sub" / "inside").write_text("I")
    (d / "full" / "x").write_text("X")
    inode_of_a = os.stat(d / "a").st_ino
    out = {
        "over an existing file": answer(os.rename, d / "a", d / "b"),
        "over an empty directory": answer(os.rename, d / "sub", d / "empty"),
        "over a non-empty directory": answer(os.rename, d / "empty", d / "full"),
        "a file over a directory": answer(os.rename, d / "b", d / "full"),
        "a directory over a file": answer(os.rename, d / "full", d / "b"),
        "a directory into itself": answer(os.rename, d / "full", d / "full" / "inner"),
        "a missing name": answer(os.rename, d / "missing", d / "anything"),
        "below a file": answer(os.rename, d / "c", d / "b" / "x"),
        "to a name with a trailing slash": answer(os.rename, d / "c", str(d / "c2") + "/"),
        "of a dot": answer(os.rename, f"{d}/full/.", d / "dot"),
    }
    os.link(d / "c", d / "c-twin")
    out["onto another name of the same file"] = answer(os.rename, d / "c", d / "c-twin")
    out["twin link count"] = os.stat(d / "c-twin").st_nlink
    out["moved file keeps its inode"] = os.stat(d / "b").st_ino == inode_of_a
    out["an empty directory over an empty one"] = answer(os.rename, d / "e1", d / "e2")
    return out


def test_renames_over_files_and_directories_answer_as_posix_says(world):
    """rename(2) through the host's view: over a file (replaced, the moved file keeps its
    inode), a directory over an empty one (taken, its content with it) or a non-empty one
    (``ENOTEMPTY``), a file over a directory (``EISDIR``), a directory over a file
    (``ENOTDIR``), into itself (``EINVAL``), a missing name (``ENOENT``), below a file
    (``ENOTDIR``), onto another name of the same file (nothing done, both names kept): the
    same answers and the same tree as on the storage root."""
    disk, stored, mounted = world.pair("rename")
    on_disk, through = rename_answers(disk), rename_answers(mounted)
    assert through == on_disk
    assert {k: through[k] for k in list(through)[:8]} == {
        "over an existing file": "ok",
        "over an empty directory": "ok",
        "over a non-empty directory": "ENOTEMPTY",
        "a file over a directory": "EISDIR",
        "a directory over a file": "ENOTDIR",
        "a directory into itself": "EINVAL",
        "a missing name": "ENOENT",
        "below a file": "ENOTDIR",
    }
    assert through["onto another name of the same file"] == "ok"
    assert through["twin link count"] == 2 and through["moved file keeps its inode"] is True
    assert kinds(stored) == kinds(disk)
    assert kinds(stored)["b"] == ("file", b"A") and kinds(stored)["empty/inside"] == (
        "file",
        b"I",
    )
    assert {"c", "c-twin"} <= set(os.listdir(stored)) and "a" not in os.listdir(stored)


def renameat2_answers(d: Path, whiteout: bool) -> dict:
    (d / "a").write_text("A")
    (d / "b").write_text("B")
    (d / "dir").mkdir()
    (d / "dir" / "in").write_text("I")
    out = {
        "NOREPLACE over an existing name": answer(renameat2, d / "a", d / "b", RENAME_NOREPLACE),
        "NOREPLACE to a new name": answer(renameat2, d / "a", d / "n", RENAME_NOREPLACE),
        "EXCHANGE of two files": answer(renameat2, d / "n", d / "b", RENAME_EXCHANGE),
        "EXCHANGE of a file and a directory": answer(
            renameat2, d / "n", d / "dir", RENAME_EXCHANGE
        ),
        "EXCHANGE with a missing name": answer(renameat2, d / "b", d / "none", RENAME_EXCHANGE),
        "NOREPLACE|EXCHANGE": answer(
            renameat2, d / "b", d / "n", RENAME_NOREPLACE | RENAME_EXCHANGE
        ),
    }
    if whiteout:
        (d / "w").write_text("W")
        out["WHITEOUT"] = answer(renameat2, d / "w", d / "w2", RENAME_WHITEOUT)
    return out


def test_renameat2_flags_are_passed_through_and_whiteout_is_refused_whole(world):
    """docs/mount.md (``RENAME_NOREPLACE`` and ``RENAME_EXCHANGE`` passed through;
    ``RENAME_WHITEOUT`` ``EINVAL`` with nothing renamed): ``NOREPLACE`` over an existing
    name is ``EEXIST`` with both files unchanged, to a new name moves; ``EXCHANGE`` swaps two
    files, or a file and a directory with its content; with a missing name ``ENOENT``; both
    flags together ``EINVAL``: the same as on the storage root."""
    disk, stored, mounted = world.pair("renameat2")
    on_disk, through = renameat2_answers(disk, False), renameat2_answers(mounted, True)
    assert through == {**on_disk, "WHITEOUT": "EINVAL"}
    assert on_disk == {
        "NOREPLACE over an existing name": "EEXIST",
        "NOREPLACE to a new name": "ok",
        "EXCHANGE of two files": "ok",
        "EXCHANGE of a file and a directory": "ok",
        "EXCHANGE with a missing name": "ENOENT",
        "NOREPLACE|EXCHANGE": "EINVAL",
    }
    expected = {**kinds(disk), "w": ("file", b"W")}
    assert kinds(stored) == expected
    assert expected["n/in"] == ("file", b"I") and expected["dir"] == ("file", b"B")


def name_answers(d: Path) -> dict:
    (d / "f").write_text("F")
    (d / "dir").mkdir()
    (d / "full").mkdir()
    (d / "full" / "x").write_text("X")
    return {
        "link of a directory": answer(os.link, d / "dir", d / "dir2"),
        "link onto an existing name": answer(os.link, d / "f", d / "full" / "x"),
        "link of a missing name": answer(os.link, d / "missing", d / "m2"),
        "link below a file": answer(os.link, d / "f", d / "f" / "x"),
        "link": answer(os.link, d / "f", d / "f2"),
        "rmdir of a file": answer(os.rmdir, d / "f"),
        "rmdir of a non-empty directory": answer(os.rmdir, d / "full"),
        "rmdir of a dot": answer(os.rmdir, f"{d}/dir/."),
        "rmdir of a missing name": answer(os.rmdir, d / "missing"),
        "unlink of a directory": answer(os.unlink, d / "dir"),
        "unlink of a missing name": answer(os.unlink, d / "missing"),
        "unlink below a file": answer(os.unlink, d / "f" / "x"),
        "mkdir of an existing file": answer(os.mkdir, d / "f"),
        "mkdir of an existing directory": answer(os.mkdir, d / "dir"),
        "mkdir below a file": answer(os.mkdir, d / "f" / "x"),
        "mkdir below a missing directory": answer(os.mkdir, d / "missing" / "x"),
        "rmdir of an empty directory": answer(os.rmdir, d / "dir"),
        "unlink of one name": answer(os.unlink, d / "f2"),
        "link count after": os.stat(d / "f").st_nlink,
    }


def test_link_unlink_rmdir_and_mkdir_answer_with_the_errnos_posix_gives(world):
    """link(2), unlink(2), rmdir(2), mkdir(2) through the host's view: a directory cannot be
    linked (``EPERM``), nor linked onto an existing name (``EEXIST``); ``rmdir`` of a file
    ``ENOTDIR``, of a non-empty directory ``ENOTEMPTY``, of ``.`` ``EINVAL``; ``unlink`` of a
    directory ``EISDIR``; ``mkdir`` of an existing name ``EEXIST``, below a file
    ``ENOTDIR``; a missing name ``ENOENT``: as on the storage root, with the same tree."""
    disk, stored, mounted = world.pair("names")
    on_disk, through = name_answers(disk), name_answers(mounted)
    assert through == on_disk
    assert on_disk == {
        "link of a directory": "EPERM",
        "link onto an existing name": "EEXIST",
        "link of a missing name": "ENOENT",
        "link below a file": "ENOTDIR",
        "link": "ok",
        "rmdir of a file": "ENOTDIR",
        "rmdir of a non-empty directory": "ENOTEMPTY",
        "rmdir of a dot": "EINVAL",
        "rmdir of a missing name": "ENOENT",
        "unlink of a directory": "EISDIR",
        "unlink of a missing name": "ENOENT",
        "unlink below a file": "ENOTDIR",
        "mkdir of an existing file": "EEXIST",
        "mkdir of an existing directory": "EEXIST",
        "mkdir below a file": "ENOTDIR",
        "mkdir below a missing directory": "ENOENT",
        "rmdir of an empty directory": "ok",
        "unlink of one name": "ok",
        "link count after": 1,
    }
    assert kinds(stored) == kinds(disk) == {"f": ("file", b"F"), "full": ("dir",),
                                            "full/x": ("file", b"X")}  # fmt: skip


def long_name_answers(d: Path) -> dict:
    longest, too_long = "a" * 255, "b" * 256
    wide = "\u20ac" * 85  # 255 bytes of UTF-8
    (d / "f").write_text("F")
    deep = str(d) + "/" + "/".join(["c" * 200] * 21)  # longer than PATH_MAX
    return {
        "create 255": answer(opened, d / longest, os.O_WRONLY | os.O_CREAT),
        "stat 255": answer(os.stat, d / longest),
        "mkdir 255 bytes of UTF-8": answer(os.mkdir, d / wide),
        "rename to 255": answer(os.rename, d / "f", d / ("r" * 255)),
        "link to 255": answer(os.link, d / ("r" * 255), d / ("l" * 255)),
        "create 256": answer(opened, d / too_long, os.O_WRONLY | os.O_CREAT),
        "mkdir 256": answer(os.mkdir, d / too_long),
        "stat 256": answer(os.stat, d / too_long),
        "rename to 256": answer(os.rename, d / ("r" * 255), d / too_long),
        "link to 256": answer(os.link, d / ("r" * 255), d / too_long),
        "unlink 256": answer(os.unlink, d / too_long),
        "rmdir 256": answer(os.rmdir, d / too_long),
        "create 1100": answer(opened, d / ("z" * 1100), os.O_WRONLY | os.O_CREAT),
        "a path past PATH_MAX": answer(os.stat, deep),
        "names": sorted(len(os.fsencode(n)) for n in os.listdir(d)),
    }


def test_names_of_255_bytes_work_and_longer_ones_are_enametoolong_with_nothing_made(world):
    """NAME_MAX through the host's view: a name of 255 bytes (ASCII, or UTF-8 characters)
    is made, stated, renamed to and linked to; one of 256 bytes or more is ``ENAMETOOLONG``
    for every call, with nothing made; a path past PATH_MAX is ``ENAMETOOLONG``: as on the
    storage root."""
    disk, stored, mounted = world.pair("long")
    on_disk, through = long_name_answers(disk), long_name_answers(mounted)
    assert through == on_disk
    assert {k: v for k, v in through.items() if k.endswith("255") or "UTF-8" in k} == {
        "create 255": "ok",
        "stat 255": "ok",
        "mkdir 255 bytes of UTF-8": "ok",
        "rename to 255": "ok",
        "link to 255": "ok",
    }
    too_long = {k: v for k, v in through.items() if k[-3:] in ("256", "100") or "PATH" in k}
    assert set(too_long.values()) == {"ENAMETOOLONG"}, too_long
    assert through["names"] == [255, 255, 255, 255]
    assert sorted(len(os.fsencode(n)) for n in os.listdir(stored)) == [255] * 4


# ---------------------------------------------------------- sizes and times, host's view


def size_answers(d: Path) -> dict:
    f = d / "f"
    f.write_bytes(b"0123456789")
    out = {"grow": answer(os.truncate, f, 5000)}
    out["grown"] = [
        f.stat().st_size,
        f.read_bytes()[:10].decode(),
        f.read_bytes()[10:] == bytes(4990),
    ]
    out["shrink"] = answer(os.truncate, f, 4)
    out["shrunk"] = f.read_bytes().decode()
    (d / "dir").mkdir()
    out["truncate of a directory"] = answer(os.truncate, d / "dir", 0)
    out["negative size"] = answer(os.truncate, f, -1)
    out["truncate of a missing name"] = answer(os.truncate, d / "missing", 0)
    fd = os.open(f, os.O_RDONLY)
    out["ftruncate of a read-only descriptor"] = answer(os.ftruncate, fd, 0)
    out["write to a read-only descriptor"] = answer(os.write, fd, b"x")
    os.close(fd)
    fd = os.open(f, os.O_WRONLY)
    out["read from a write-only descriptor"] = answer(os.read, fd, 1)
    out["ftruncate to grow"] = answer(os.ftruncate, fd, 8)
    out["pwrite past the end"] = answer(os.pwrite, fd, b"Z", 12)
    os.close(fd)
    out["after"] = f.read_bytes().hex()
    fd = os.open(d / "dir", os.O_RDONLY | os.O_DIRECTORY)
    out["ftruncate of a directory"] = answer(os.ftruncate, fd, 0)
    out["read of a directory"] = answer(os.read, fd, 10)
    os.close(fd)
    return out


def test_truncate_and_ftruncate_grow_with_zeros_shrink_and_refuse_the_wrong_target(world):
    """truncate(2)/ftruncate(2) through the host's view: growing fills with zeros, shrinking
    cuts; a directory is ``EISDIR`` (``EINVAL`` through a descriptor), a negative size
    ``EINVAL``, a read-only descriptor ``EINVAL``; writing a read-only descriptor and
    reading a write-only one ``EBADF``; a write past the end leaves a zero-filled gap: as on
    the storage root, whose file ends as the mount shows it."""
    disk, stored, mounted = world.pair("sizes")
    on_disk, through = size_answers(disk), size_answers(mounted)
    assert through == on_disk
    assert on_disk["grown"] == [5000, "0123456789", True] and on_disk["shrunk"] == "0123"
    assert (on_disk["truncate of a directory"], on_disk["negative size"]) == ("EISDIR", "EINVAL")
    assert on_disk["ftruncate of a read-only descriptor"] == "EINVAL"
    assert on_disk["write to a read-only descriptor"] == "EBADF"
    assert on_disk["read from a write-only descriptor"] == "EBADF"
    assert on_disk["after"] == b"0123\0\0\0\0\0\0\0\0Z".hex()
    assert (stored / "f").read_bytes() == (disk / "f").read_bytes()


def time_answers(d: Path) -> dict:
    f = d / "f"
    f.write_text("t")
    out = {"exact": answer(os.utime, f, ns=(1_000_000_001, 2_000_000_002))}
    out["after exact"] = [f.stat().st_atime_ns, f.stat().st_mtime_ns]
    before = time.time_ns() - 2 * 10**9
    out["NOW, OMIT"] = answer(utimensat, f, (0, UTIME_NOW), (0, UTIME_OMIT))
    st = f.stat()
    out["after NOW, OMIT"] = [st.st_atime_ns > before, st.st_mtime_ns]
    os.utime(f, ns=(1_000_000_001, 2_000_000_002))
    out["OMIT, NOW"] = answer(utimensat, f, (0, UTIME_OMIT), (0, UTIME_NOW))
    st = f.stat()
    out["after OMIT, NOW"] = [st.st_atime_ns, st.st_mtime_ns > before]
    os.utime(f, ns=(3_000_000_003, 4_000_000_004))
    ctime = f.stat().st_ctime_ns
    time.sleep(0.02)
    out["OMIT, OMIT"] = answer(utimensat, f, (0, UTIME_OMIT), (0, UTIME_OMIT))
    st = f.stat()
    out["after OMIT, OMIT"] = [st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns == ctime]
    out["before 1970"] = answer(os.utime, f, ns=(-1_500_000_000, -2_000_000_000))
    out["after before 1970"] = [f.stat().st_atime_ns, f.stat().st_mtime_ns]
    out["a nanosecond field of 10^9"] = answer(utimensat, f, (0, 10**9), (0, 0))
    out["of a missing name"] = answer(utimensat, d / "missing", (0, UTIME_NOW), (0, UTIME_NOW))
    return out


def test_utimensat_sets_exact_times_now_and_leaves_omitted_ones(world):
    """utimensat(2) through the host's view: exact nanosecond times; ``UTIME_NOW`` for one
    time and ``UTIME_OMIT`` for the other set the first to now and leave the second; both
    ``UTIME_OMIT`` change nothing, not even the ctime; times before 1970 are kept; a
    nanosecond field of 10^9 is ``EINVAL``: as on the storage root, which holds the times the
    mount shows."""
    disk, stored, mounted = world.pair("times")
    on_disk, through = time_answers(disk), time_answers(mounted)
    assert through == on_disk
    assert on_disk == {
        "exact": "ok",
        "after exact": [1_000_000_001, 2_000_000_002],
        "NOW, OMIT": "ok",
        "after NOW, OMIT": [True, 2_000_000_002],
        "OMIT, NOW": "ok",
        "after OMIT, NOW": [1_000_000_001, True],
        "OMIT, OMIT": "ok",
        "after OMIT, OMIT": [3_000_000_003, 4_000_000_004, True],
        "before 1970": "ok",
        "after before 1970": [-1_500_000_000, -2_000_000_000],
        "a nanosecond field of 10^9": "EINVAL",
        "of a missing name": "ENOENT",
    }
    shown, held = (mounted / "f").stat(), (stored / "f").stat()
    assert (shown.st_atime_ns, shown.st_mtime_ns) == (held.st_atime_ns, held.st_mtime_ns)


def change_marks(d: Path) -> dict[str, list[str]]:
    """Which of mtime and ctime each change marks, on the file or directory it concerns."""
    (d / "a").mkdir()
    (d / "b").mkdir()
    (d / "f").write_bytes(b"abcdef")

    def marks(path: Path, change: Callable[[], object], now: Path | None = None) -> list[str]:
        before = path.stat()
        time.sleep(0.015)
        change()
        after = (now or path).stat()
        return [
            name
            for name, old, new in (("mtime", before.st_mtime_ns, after.st_mtime_ns),
                                   ("ctime", before.st_ctime_ns, after.st_ctime_ns))
            if new != old
        ]  # fmt: skip

    def write_nothing() -> None:
        fd = os.open(d / "f", os.O_WRONLY)
        os.write(fd, b"")
        os.close(fd)

    return {
        "file made: its directory": marks(d / "a", lambda: (d / "a" / "x").write_text("x")),
        "write: the file": marks(d / "f", lambda: (d / "f").write_bytes(b"ABCDEF")),
        "empty write: the file": marks(d / "f", write_nothing),
        "truncate to its size: the file": marks(d / "f", lambda: os.truncate(d / "f", 6)),
        "chmod: the file": marks(d / "f", lambda: os.chmod(d / "f", 0o640)),
        "chown to its owner: the file": marks(d / "f", lambda: os.chown(d / "f", 0, 0)),
        "link: the file": marks(d / "f", lambda: os.link(d / "f", d / "f2")),
        "unlink of a name: the file": marks(d / "f", lambda: os.unlink(d / "f2")),
        "moved out: the old directory": marks(
            d / "a", lambda: os.rename(d / "a" / "x", d / "b" / "x")
        ),
        "moved in: the new directory": marks(
            d / "a", lambda: os.rename(d / "b" / "x", d / "a" / "y")
        ),
        "renamed: the file": marks(
            d / "a" / "y", lambda: os.rename(d / "a" / "y", d / "a" / "z"), d / "a" / "z"
        ),
        "removed: its directory": marks(d / "a", lambda: os.unlink(d / "a" / "z")),
        "subdirectory made: its directory": marks(d / "b", lambda: os.mkdir(d / "b" / "s")),
    }


def test_the_times_each_change_marks_are_the_ones_the_storage_root_marks(world):
    """POSIX times through the host's view: making, moving and removing a name marks its
    directory's mtime and ctime; a write the file's mtime and ctime, an empty write nothing;
    chmod, chown, link and unlink the file's ctime only; a rename the moved file's ctime;
    truncate to the same size both: each as on the storage root."""
    disk, _, mounted = world.pair("marks")
    on_disk, through = change_marks(disk), change_marks(mounted)
    assert through == on_disk
    both, ctime = ["mtime", "ctime"], ["ctime"]
    assert on_disk["file made: its directory"] == both
    assert on_disk["write: the file"] == both and on_disk["empty write: the file"] == []
    assert on_disk["chmod: the file"] == ctime and on_disk["link: the file"] == ctime
    assert on_disk["renamed: the file"] == ctime and on_disk["removed: its directory"] == both


# --------------------------------------------------------------- durability and listings


def test_fsync_and_fdatasync_of_files_and_directories_succeed_and_the_bytes_are_on_disk(world):
    """docs/mount.md *Durability*: ``fsync``/``fdatasync`` through the host's view succeed on
    a file opened for writing or for reading only, on a directory, on a space and on the
    mount's root; once a write returns its bytes are on the storage root (no cache held back
    until the close)."""
    _, stored, mounted = world.pair("sync")
    fd = os.open(mounted / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"first ")
    assert (stored / "f").read_bytes() == b"first "
    assert (answer(os.fsync, fd), answer(os.fdatasync, fd)) == ("ok", "ok")
    os.pwrite(fd, b"second", 6)
    assert (stored / "f").read_bytes() == b"first second"
    os.close(fd)
    answers = {}
    for label, path in (("read-only file", mounted / "f"), ("directory", mounted),
                        ("space", world.through(world.host, world.data().parent)),
                        ("root", world.host)):  # fmt: skip
        flags = os.O_RDONLY | (0 if label.endswith("file") else os.O_DIRECTORY)
        fd = os.open(path, flags)
        answers[label] = [answer(os.fsync, fd), answer(os.fdatasync, fd)]
        os.close(fd)
    assert answers == {k: ["ok", "ok"] for k in answers}
    assert mounted_at(world.host) and sorted(os.listdir(world.host)) == sorted(ROOT_ENTRIES)


def test_a_listing_read_with_telldir_seekdir_and_rewinddir_repeats_and_misses_nothing(world):
    """readdir(3) through the host's view of a directory of 400 long names: every entry and
    ``.``/``..`` once; ``seekdir`` to a ``telldir`` position gives the same entries from
    there; ``rewinddir`` shows an entry added meanwhile; a loop that removes what it lists,
    while new names are added, removes every listed name, none twice."""
    _, stored, mounted = world.pair("listing")
    for i in range(400):
        (stored / f"n{i:04d}-{'x' * 120}").write_bytes(b"")
    with opened_directory(mounted) as handle:
        seen, marks = [], []
        while True:
            mark = LIBC.telldir(handle)
            entry = next_entry(handle)
            if entry is None:
                break
            seen.append(entry)
            marks.append(mark)
        names = [name for name, _, _ in seen]
        assert len(names) == len(set(names)) == 402
        assert set(names) == {".", "..", *os.listdir(stored)}
        LIBC.seekdir(handle, marks[251])
        again = []
        while (entry := next_entry(handle)) is not None:
            again.append(entry)
        assert again == seen[251:]
        (stored / "added").write_bytes(b"")
        LIBC.rewinddir(handle)
        listed = []
        while (entry := next_entry(handle)) is not None:
            listed.append(entry[0])
            if entry[0].startswith("n"):
                os.unlink(mounted / entry[0])
                if len(listed) % 40 == 0:
                    (mounted / f"late-{len(listed)}").write_bytes(b"")
    assert "added" in listed and len(listed) == len(set(listed))
    assert not [name for name in os.listdir(stored) if name.startswith("n")]


def test_listing_entries_give_the_inode_numbers_and_types_stat_gives_and_the_disk_holds(world):
    """readdir(3) through the host's view: each entry's ``d_ino`` is the ``st_ino`` of
    ``lstat`` through the mount and on the storage root, ``.`` and ``..`` those of the
    directory and its parent, and ``d_type`` tells files, directories and symbolic links
    (made on the storage root) apart."""
    _, stored, mounted = world.pair("dino")
    (stored / "file").write_text("f")
    (stored / "dir").mkdir()
    os.symlink("file", stored / "link")
    os.link(stored / "file", stored / "twin")
    with opened_directory(mounted) as handle:
        entries = {}
        while (entry := next_entry(handle)) is not None:
            entries[entry[0]] = entry[1:]
    assert set(entries) == {".", "..", "file", "dir", "link", "twin"}
    assert entries["."][0] == mounted.stat().st_ino == stored.stat().st_ino
    assert entries[".."][0] == mounted.parent.stat().st_ino == stored.parent.stat().st_ino
    types = {"file": DT_REG, "twin": DT_REG, "dir": DT_DIR, "link": DT_LNK}
    for name, kind in types.items():
        assert entries[name] == (os.lstat(stored / name).st_ino, kind), name
        assert os.lstat(mounted / name).st_ino == entries[name][0], name
    assert entries["file"][0] == entries["twin"][0]


def random_walk(d: Path, seed: int, steps: int) -> tuple[list, dict]:
    """``steps`` calls drawn by ``seed`` among create, mkdir, link, rename, unlink, rmdir,
    ``RENAME_EXCHANGE``, ``RENAME_NOREPLACE``, ``lstat``, holding a descriptor and using a
    held one (a file: read it and count its links; a directory: make a file in it and list
    it), on a dozen names in ``d``: each answer, and the tree left."""
    rng = random.Random(seed)
    d.mkdir()
    names = ["a", "b", "c", "d1", "d2", "d1/x", "d1/y", "d2/x", "d2/d3", "d2/d3/z", "d1/d4",
             "d1/d4/w"]  # fmt: skip
    log: list = []
    held: dict[int, int] = {}

    def append(path: Path, step: int) -> None:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
        os.write(fd, f"{step};".encode())
        os.close(fd)

    def used(fd: int, step: int) -> tuple:
        try:
            st = os.fstat(fd)
        except OSError as exc:
            # A directory removed meanwhile: ESTALE through the mount, where the storage
            # root gives a link count of 0 (docs/mount.md is silent on directories).
            return ("gone",) if exc.errno == errno.ESTALE else (errno.errorcode[exc.errno],)
        if not stat.S_ISDIR(st.st_mode):
            return ("file", os.pread(fd, 4096, 0).decode(), st.st_nlink)
        if st.st_nlink == 0:
            return ("gone",)
        made = answer(opened, f"n{step}", os.O_WRONLY | os.O_CREAT, dir_fd=fd)
        return ("dir", made, sorted(os.listdir(fd)))

    try:
        for step in range(steps):
            op = rng.choice(["create", "mkdir", "link", "rename", "unlink", "rmdir", "exchange",
                             "noreplace", "hold", "use", "lstat"])  # fmt: skip
            a, b = rng.choice(names), rng.choice(names)
            pa, pb = d / a, d / b
            if op == "create":
                log.append((op, a, answer(append, pa, step)))
            elif op == "mkdir":
                log.append((op, a, answer(os.mkdir, pa)))
            elif op == "link":
                log.append((op, a, b, answer(os.link, pa, pb)))
            elif op == "rename":
                log.append((op, a, b, answer(os.rename, pa, pb)))
            elif op == "unlink":
                log.append((op, a, answer(os.unlink, pa)))
            elif op == "rmdir":
                log.append((op, a, answer(os.rmdir, pa)))
            elif op == "exchange":
                log.append((op, a, b, answer(renameat2, pa, pb, RENAME_EXCHANGE)))
            elif op == "noreplace":
                log.append((op, a, b, answer(renameat2, pa, pb, RENAME_NOREPLACE)))
            elif op == "hold":
                try:
                    held[step] = os.open(pa, os.O_RDONLY)
                except OSError as exc:
                    log.append((op, a, errno.errorcode[exc.errno]))
                else:
                    log.append((op, a, "ok"))
            elif op == "use" and held:
                which = rng.choice(sorted(held))
                log.append((op, which, *used(held[which], step)))
            elif op == "lstat":
                try:
                    st = os.lstat(pa)
                except OSError as exc:
                    log.append((op, a, errno.errorcode[exc.errno]))
                else:
                    links = -1 if stat.S_ISDIR(st.st_mode) else st.st_nlink
                    log.append((op, a, stat.S_IFMT(st.st_mode), links))
    finally:
        for fd in held.values():
            os.close(fd)
    return log, kinds(d)


@pytest.mark.parametrize("seeds", [range(0, 8), range(8, 16)])
def test_random_walks_of_name_changes_answer_as_on_the_storage_root(world, seeds):
    """rename(2), link(2), unlink(2), rmdir(2), mkdir(2), ``renameat2`` and opens drawn at
    random over a dozen names, with descriptors held across the changes and used later
    (docs/mount.md *Names*, *Identity*: a rename or removal through the mount is applied to
    the daemon's names at once): every answer through the host's view, what each held
    descriptor reads and makes, and the tree left, as on the storage root; then every inode
    number shown is the one on disk."""
    for seed in seeds:
        disk, stored, mounted = world.pair(f"walk-{seed}")
        on_disk = random_walk(disk / "w", seed, 250)
        through = random_walk(mounted / "w", seed, 250)
        assert through[0] == on_disk[0], seed
        assert through[1] == on_disk[1] == kinds(stored / "w"), seed
        for name in through[1]:
            shown, held = (os.lstat(mounted / "w" / name).st_ino,
                           os.lstat(stored / "w" / name).st_ino)  # fmt: skip
            assert shown == held or shown >= ALIASES, (seed, name)  # a number still held


# ----------------------------------------------------------- offsets, holes and mappings


def sparse_answers(d: Path) -> dict:
    fd = os.open(d / "sparse", os.O_CREAT | os.O_RDWR, 0o644)
    out: dict = {}
    try:
        for offset in (1 << 20, 1 << 30, 1 << 40):
            out[f"pwrite at {offset}"] = answer(os.pwrite, fd, b"END", offset)
            out[f"pread at {offset}"] = os.pread(fd, 3, offset).decode()
        out["size"] = os.fstat(fd).st_size
        out["a hole"] = os.pread(fd, 4096, 1 << 35) == bytes(4096)
        out["past the end"] = os.pread(fd, 8, (1 << 40) + 100)
        out["SEEK_END"] = os.lseek(fd, 0, os.SEEK_END)
        out["a negative offset"] = answer(os.lseek, fd, -1, os.SEEK_SET)
        out["pwrite past the largest file"] = answer(os.pwrite, fd, b"x", 1 << 62)
        out["ftruncate past the largest file"] = answer(os.ftruncate, fd, 1 << 62)
        out["blocks"] = os.fstat(fd).st_blocks
    finally:
        os.close(fd)
    return out


def test_writes_at_large_offsets_leave_holes_that_read_as_zeros_on_both_sides(world):
    """lseek(2)/pread/pwrite through the host's view: writes at 1 MiB, 1 GiB and 1 TiB make
    a sparse file of that size whose holes read as zeros, which takes as few blocks on the
    storage root as one written there directly; a read past the end is empty; a negative
    offset ``EINVAL``; past the largest file the filesystem allows the same refusal as on
    the storage root."""
    disk, stored, mounted = world.pair("sparse")
    on_disk, through = sparse_answers(disk), sparse_answers(mounted)
    assert through == on_disk
    for offset in (1 << 20, 1 << 30, 1 << 40):
        assert through[f"pwrite at {offset}"] == "ok" and through[f"pread at {offset}"] == "END"
    assert through["size"] == through["SEEK_END"] == (1 << 40) + 3
    assert through["a hole"] is True and through["past the end"] == b""
    assert through["a negative offset"] == "EINVAL"
    assert through["pwrite past the largest file"] in ("EFBIG", "EINVAL")
    assert through["blocks"] < 256  # three small extents, not a terabyte
    assert (stored / "sparse").stat().st_blocks == through["blocks"]


def rewrite_in_place(path: Path, data: bytes) -> None:
    """``path`` rewritten with ``data`` of its own size, its times put back (``cp -p``,
    ``rsync --inplace --times``)."""
    before = path.stat()
    assert len(data) == before.st_size
    with path.open("r+b") as f:
        f.write(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_shared_mapping_writes_through_to_disk_and_maps_what_the_disk_holds(world):
    """mmap(2) through the host's view: bytes written into a ``MAP_SHARED`` mapping are on
    the storage root once ``msync`` returns; a file rewritten in place on the storage root,
    size and mtime kept, is mapped afresh by the next open (docs/mount.md); a writable
    shared mapping of a read-only descriptor is ``EACCES``."""
    _, stored, mounted = world.pair("mmap")
    (stored / "m").write_bytes(b"a" * 8192)
    fd = os.open(mounted / "m", os.O_RDWR)
    with mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as region:
        region[4090:4102] = b"across-pages"
        region.flush()
        assert (stored / "m").read_bytes()[4090:4102] == b"across-pages"
    os.close(fd)
    with (mounted / "m").open("rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as region:
        assert region[4090:4102] == b"across-pages"
    rewrite_in_place(stored / "m", b"b" * 8192)
    with (mounted / "m").open("rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as region:
        assert region[:] == b"b" * 8192
    fd = os.open(mounted / "m", os.O_RDONLY)
    try:
        refused = answer(mmap.mmap, fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    assert refused == "EACCES"


def test_bytes_written_on_either_side_read_the_same_on_the_other(world):
    """What is written through the host's view is byte for byte what the storage root holds,
    whatever the sizes and offsets of the writes (1 byte to 128 KiB + 1, a patch by
    ``pwrite``); what is written on the storage root reads the same through the mount; a
    reader holding a file open through the mount sees bytes appended on the storage root
    within a second."""
    _, stored, mounted = world.pair("bytes")
    data = random.Random(20260622).randbytes(1 << 20)
    fd = os.open(mounted / "blob", os.O_WRONLY | os.O_CREAT, 0o644)
    position = 0
    for size in itertools.cycle((1, 4095, 4097, 65537, 131073, 7)):
        if position >= len(data):
            break
        position += os.write(fd, data[position : position + size])
    os.pwrite(fd, b"PATCH", 123_457)
    os.close(fd)
    expected = data[:123_457] + b"PATCH" + data[123_462:]
    assert (stored / "blob").read_bytes() == expected
    (stored / "other").write_bytes(data[::-1])
    assert (mounted / "other").read_bytes() == data[::-1]
    reader = os.open(mounted / "other", os.O_RDONLY)
    try:
        first = bytearray()
        while chunk := os.read(reader, 1 << 20):
            first.extend(chunk)
        assert bytes(first) == data[::-1]
        with (stored / "other").open("ab") as f:
            f.write(b"TAIL")
        got = bytearray()

        def tail_seen() -> bool:
            got.extend(os.read(reader, 100))
            return bytes(got) == b"TAIL"

        assert wait_for(tail_seen, 5), bytes(got)
    finally:
        os.close(reader)


def test_statfs_through_both_views_is_the_storage_filesystems(world):
    """statfs(2) through the host's and the agent's view gives the storage filesystem's
    block size, fragment size, total blocks and inodes and longest name; its free blocks
    within what other writers may have used meanwhile."""
    disk = os.statvfs(world.storage)
    for mount in (world.host, world.view):
        shown = os.statvfs(mount)
        for field in ("f_bsize", "f_frsize", "f_blocks", "f_files", "f_namemax"):
            assert getattr(shown, field) == getattr(disk, field), (mount, field)
        assert abs(shown.f_bavail - os.statvfs(world.storage).f_bavail) < disk.f_blocks // 100


# -------------------------------------------------------------- inode numbers and links


FIELDS = ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size", "st_blksize",
          "st_blocks", "st_atime_ns", "st_mtime_ns", "st_ctime_ns", "st_rdev")  # fmt: skip


def test_every_status_field_but_the_device_is_the_storage_roots_in_both_views(world):
    """F-1, docs/mount.md (a file keeps the owner and mode it has on disk; the host's view
    shows link counts on disk, an agent's view 1 for a directory): ``lstat`` through the
    host's view of a file of another owner, an executable, an empty file, a sparse file, a
    file of two names, a directory with subdirectories and a symbolic link gives every
    field the storage root gives (mode, inode, links, owner, size, block size, blocks,
    nanosecond times) but the device; the agent's view the same, but 1 for a directory's
    link count."""
    stored = world.fresh("fields", 0o755)
    owned_by_another(stored, "theirs", 0o640)
    (stored / "tool.sh").write_text("#!/bin/sh\n")
    (stored / "tool.sh").chmod(0o755)
    (stored / "empty").write_bytes(b"")
    with (stored / "sparse").open("wb") as f:
        f.seek(1 << 30)
        f.write(b"end")
    os.link(stored / "tool.sh", stored / "twin")
    (stored / "dir" / "a").mkdir(parents=True)
    (stored / "dir" / "b").mkdir()
    os.symlink("theirs", stored / "link")
    names = ["theirs", "tool.sh", "empty", "sparse", "twin", "dir", "dir/a", "link"]
    for i, name in enumerate(names):
        os.utime(stored / name, ns=(10**9 + i, 2 * 10**9 + 7 * i), follow_symlinks=False)
    for mount in (world.host, world.view):
        shown = world.through(mount, stored)
        for name in names:
            on_disk, seen = os.lstat(stored / name), os.lstat(shown / name)
            expected = [getattr(on_disk, f) for f in FIELDS]
            if mount == world.view and stat.S_ISDIR(on_disk.st_mode):
                expected[FIELDS.index("st_nlink")] = 1
            assert [getattr(seen, f) for f in FIELDS] == expected, (mount.name, name)
    assert os.lstat(stored / "dir").st_nlink == 4


def test_inode_numbers_are_the_disks_across_renames_links_and_a_second_mount(world):
    """docs/mount.md *Identity* (every file shows its number on disk): ``st_ino`` through
    the host's view is the storage root's for files and directories; it stays the same
    after a rename and a link through the mount, and after a rename made on the storage
    root (once the old name has gone, within a second); a second mount of the same root
    shows the same numbers."""
    _, stored, mounted = world.pair("ino")
    (mounted / "f").write_text("f")
    (mounted / "sub").mkdir()
    (mounted / "sub" / "g").write_text("g")
    names = ["f", "sub", "sub/g"]
    assert [os.stat(mounted / n).st_ino for n in names] == [
        os.stat(stored / n).st_ino for n in names
    ]
    number = os.stat(mounted / "f").st_ino
    os.rename(mounted / "f", mounted / "sub" / "moved")
    os.link(mounted / "sub" / "moved", mounted / "twin")
    assert os.stat(mounted / "sub" / "moved").st_ino == number == os.stat(mounted / "twin").st_ino
    os.rename(stored / "sub", stored / "renamed-on-disk")
    assert wait_for(lambda: answer(os.stat, mounted / "sub") == "ENOENT", 5)
    assert os.stat(mounted / "renamed-on-disk" / "moved").st_ino == number
    names = ["twin", "renamed-on-disk", "renamed-on-disk/moved", "renamed-on-disk/g"]
    second = world.top / f"second-{next(SEQUENCE)}"
    second.mkdir(mode=0o755)
    with serving(world.storage, second):
        other = world.through(second, stored)
        for name in names:
            on_disk = os.stat(stored / name).st_ino
            assert os.stat(mounted / name).st_ino == os.stat(other / name).st_ino == on_disk
        assert os.stat(second / "shared").st_ino == os.stat(world.host / "shared").st_ino


def test_link_counts_in_the_host_view_are_the_counts_on_disk(world):
    """docs/mount.md (the host's view shows the count on disk): a file's ``st_nlink`` after
    links and unlinks through the mount, seen through either name, and a directory's after
    ``mkdir``/``rmdir`` of subdirectories (2 plus their number), as the storage root counts."""
    _, stored, mounted = world.pair("nlink")
    (mounted / "f").write_text("f")
    (mounted / "d").mkdir()

    def counts() -> list[int]:
        shown = [os.stat(mounted / n).st_nlink for n in ("f", "d")]
        assert shown == [os.stat(stored / n).st_nlink for n in ("f", "d")]
        return shown

    assert counts() == [1, 2]
    os.link(mounted / "f", mounted / "d" / "f2")
    os.link(mounted / "f", mounted / "f3")
    os.mkdir(mounted / "d" / "s1")
    os.mkdir(mounted / "d" / "s2")
    assert counts() == [3, 4] and os.stat(mounted / "d" / "f2").st_nlink == 3
    os.unlink(mounted / "f3")
    os.rmdir(mounted / "d" / "s1")
    assert counts() == [2, 3] and os.stat(mounted / "d" / "f2").st_nlink == 2
    os.unlink(mounted / "f")
    assert os.stat(mounted / "d" / "f2").st_nlink == 1 == os.stat(stored / "d" / "f2").st_nlink


# -------------------------------------------------------- descriptors and names changing


def test_an_unlinked_open_file_stays_usable_through_its_descriptor(world):
    """docs/mount.md *Open files*: a file unlinked through the host's view while open stays
    usable through its descriptor, as on a local filesystem: ``fstat`` (link count 0, also
    once the kernel's cached answer is older than a second), ``pwrite``/``pread``, ``fsync``,
    ``fchmod``, ``fchown``, ``futimens``, ``ftruncate``, a shared mapping and a reopen of
    ``/proc/self/fd/N``; nothing of it is left on the storage root."""
    _, stored, mounted = world.pair("unlinked")
    (stored / "f").write_text("hello world")
    fd = os.open(mounted / "f", os.O_RDWR)
    try:
        os.unlink(mounted / "f")
        assert os.fstat(fd).st_nlink == 0
        time.sleep(1.1)
        assert os.fstat(fd).st_nlink == 0
        assert os.pwrite(fd, b"HELLO", 0) == 5 and os.pread(fd, 11, 0) == b"HELLO world"
        os.fsync(fd)
        os.fchmod(fd, 0o600)
        os.fchown(fd, OTHER_UID, -1)
        os.utime(fd, ns=(5 * 10**9, 6 * 10**9))
        st = os.fstat(fd)
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_mtime_ns) == (
            0o600,
            OTHER_UID,
            6 * 10**9,
        )
        os.ftruncate(fd, 5)
        assert os.fstat(fd).st_size == 5
        with mmap.mmap(fd, 5) as region:
            region[0:1] = b"J"
            region.flush()
        assert Path(f"/proc/self/fd/{fd}").read_bytes() == b"JELLO"
    finally:
        os.close(fd)
    assert os.listdir(stored) == []


def test_a_file_made_in_a_directory_removed_meanwhile_lands_nowhere(world):
    """docs/mount.md *Identity*: a descriptor of a directory removed through the host's view
    makes no file or directory (``ENOENT`` or ``ESTALE``), not even in a new directory made
    at the same name, which the storage filesystem may give the old one's inode number: the
    mount then shows it under a number of its own above 2^62, never the number the removed
    directory had."""
    _, stored, mounted = world.pair("removed")
    (mounted / "A").mkdir()
    held = os.open(mounted / "A", os.O_RDONLY | os.O_DIRECTORY)
    try:
        old = os.fstat(held).st_ino
        os.rmdir(mounted / "A")
        (mounted / "A").mkdir()
        refused = [
            answer(opened, "x", os.O_WRONLY | os.O_CREAT, dir_fd=held),
            answer(os.mkdir, "y", dir_fd=held),
        ]
        shown, on_disk = os.stat(mounted / "A").st_ino, os.stat(stored / "A").st_ino
    finally:
        os.close(held)
    assert set(refused) <= {"ENOENT", "ESTALE"}, refused
    assert os.listdir(stored / "A") == [] and os.listdir(mounted / "A") == []
    assert shown != old
    assert shown == on_disk if on_disk != old else shown >= ALIASES


def test_a_directory_swapped_for_a_link_on_disk_never_leads_the_mount_outside(world):
    """docs/mount.md *Names*: a directory the kernel knows, renamed away on the storage root
    and replaced by a symbolic link to a directory outside it, is never followed by the
    daemon: opens and creations by its old descriptor and path are refused (``ESTALE``,
    ``ENOTDIR``, ``ELOOP`` or ``ENOENT``) and nothing outside is read or made; within a
    second the name shows as the link it now is, and the moved directory at its new name."""
    _, stored, mounted = world.pair("swap")
    outside = world.top / f"outside-{next(SEQUENCE)}"
    outside.mkdir()
    (outside / "secret").write_text("outside")
    (mounted / "sub").mkdir()
    (mounted / "sub" / "mine").write_text("mine")
    held = os.open(mounted / "sub", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.stat(mounted / "sub" / "mine")
        os.rename(stored / "sub", stored / "sub.old")
        os.symlink(outside, stored / "sub")
        tries = [
            answer(opened, "secret", os.O_RDONLY, dir_fd=held),
            answer(opened, "made", os.O_WRONLY | os.O_CREAT, dir_fd=held),
            answer(opened, "mine", os.O_RDONLY, dir_fd=held),
        ]
    finally:
        os.close(held)
    assert set(tries) <= {"ESTALE", "ENOTDIR", "ELOOP", "ENOENT"}, tries
    assert os.listdir(outside) == ["secret"]
    assert wait_for(lambda: os.path.islink(mounted / "sub"), 5)
    assert os.readlink(mounted / "sub") == str(outside)
    assert (mounted / "sub.old" / "mine").read_text() == "mine"


def test_descriptors_of_exchanged_and_renamed_directories_make_files_where_they_went(world):
    """rename(2) and ``RENAME_EXCHANGE`` of two directories through the host's view while
    descriptors of one and of its subdirectory are held: files made through those
    descriptors land in the directories where they now are on the storage root."""
    _, stored, mounted = world.pair("moved-fds")
    (mounted / "X" / "deep").mkdir(parents=True)
    (mounted / "Y").mkdir()
    x = os.open(mounted / "X", os.O_RDONLY | os.O_DIRECTORY)
    deep = os.open(mounted / "X" / "deep", os.O_RDONLY | os.O_DIRECTORY)
    try:
        renameat2(mounted / "X", mounted / "Y", RENAME_EXCHANGE)
        opened("one", os.O_WRONLY | os.O_CREAT, dir_fd=x)
        opened("two", os.O_WRONLY | os.O_CREAT, dir_fd=deep)
        os.rename(mounted / "Y", mounted / "Z")
        opened("three", os.O_WRONLY | os.O_CREAT, dir_fd=x)
        os.mkdir("four", dir_fd=deep)
        listed = sorted(os.listdir(x))
    finally:
        os.close(x)
        os.close(deep)
    assert listed == ["deep", "one", "three"]
    assert set(kinds(stored)) == {"X", "Z", "Z/deep", "Z/one", "Z/three", "Z/deep/two",
                                  "Z/deep/four"}  # fmt: skip


FSIZE = """
import errno, json, os, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (10000, 10000))
path = sys.argv[1]
out = {}
def e(name, f, *a):
    try:
        out[name] = f(*a)
    except OSError as x:
        out[name] = errno.errorcode[x.errno]
fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
e("write 8000", os.write, fd, b"a" * 8000)
e("write 8000 more", os.write, fd, b"b" * 8000)
e("pwrite past the limit", os.pwrite, fd, b"c", 20000)
e("ftruncate past the limit", os.ftruncate, fd, 50000)
e("truncate past the limit", os.truncate, path, 50000)
out["size"] = os.fstat(fd).st_size
print(json.dumps(out))
"""


def test_the_callers_file_size_limit_holds_through_the_mount(world):
    """setrlimit(2) ``RLIMIT_FSIZE`` of the caller (the daemon writing as root has none of
    its own): a write through the host's view stops at the limit (a short write, then
    ``EFBIG``), and neither ``ftruncate`` nor ``truncate`` grows a file past it, as on the
    storage root."""
    disk, stored, mounted = world.pair("fsize")

    def run(path: Path) -> dict:
        done = subprocess.run([sys.executable, "-c", FSIZE, str(path)], capture_output=True,
                              text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    on_disk, through = run(disk / "f"), run(mounted / "f")
    assert (
        through
        == on_disk
        == {
            "write 8000": 8000,
            "write 8000 more": 2000,
            "pwrite past the limit": "EFBIG",
            "ftruncate past the limit": "EFBIG",
            "truncate past the limit": "EFBIG",
            "size": 10000,
        }
    )
    assert (stored / "f").read_bytes() == b"a" * 8000 + b"b" * 2000


def test_copy_file_range_and_sendfile_through_the_mount_copy_exact_bytes(world):
    """copy_file_range(2) within the host's view and into it from outside, and sendfile(2)
    out of it, copy exactly the bytes of the source, which the storage root then holds."""
    _, stored, mounted = world.pair("copy")
    data = random.Random(7).randbytes(300_000)
    (stored / "src").write_bytes(data)
    outside = world.top / f"outside-copy-{next(SEQUENCE)}"
    outside.write_bytes(data[::-1])

    def copy(source: Path, target: Path, how: str) -> None:
        fi = os.open(source, os.O_RDONLY)
        fo = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            done = 0
            while True:
                if how == "copy_file_range":
                    n = os.copy_file_range(fi, fo, 1 << 20)
                else:
                    n = os.sendfile(fo, fi, done, 1 << 20)
                if n == 0:
                    break
                done += n
        finally:
            os.close(fi)
            os.close(fo)

    sent = world.top / f"out-{next(SEQUENCE)}"
    copy(mounted / "src", mounted / "within", "copy_file_range")
    copy(outside, mounted / "into", "sendfile")
    copy(mounted / "src", sent, "sendfile")
    assert (stored / "within").read_bytes() == data
    assert (stored / "into").read_bytes() == data[::-1]
    assert sent.read_bytes() == data


# --------------------------------------------------------- what the mount does not provide


def test_what_the_mount_does_not_provide_is_refused_with_nothing_made(world):
    """docs/mount.md *Not provided*: symbolic links, FIFOs and device nodes are ``ENOSYS``,
    extended attributes ``EOPNOTSUPP`` (set, get, list, remove); so are a regular file made
    by ``mknod`` and a socket bound at a name (both ``mknod`` to the kernel), and an
    ``O_TMPFILE`` open is ``EOPNOTSUPP``: nothing is made on the storage root, where each of
    them works."""
    disk, stored, mounted = world.pair("absent")
    for d in (disk, mounted):
        (d / "f").write_text("f")

    def attempts(d: Path) -> dict:
        def bound() -> None:  # by the directory's descriptor: the path may pass 108 bytes
            directory = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.bind(f"/proc/self/fd/{directory}/sock")
            finally:
                os.close(directory)

        return {
            "symlink": answer(os.symlink, "f", d / "link"),
            "mkfifo": answer(os.mkfifo, d / "fifo"),
            "mknod of a device": answer(
                os.mknod, d / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3)
            ),
            "mknod of a file": answer(os.mknod, d / "reg", stat.S_IFREG | 0o644),
            "bind": answer(bound),
            "setxattr": answer(os.setxattr, d / "f", "user.a", b"1"),
            "getxattr": answer(os.getxattr, d / "f", "user.a"),
            "listxattr": answer(os.listxattr, d / "f"),
            "removexattr": answer(os.removexattr, d / "f", "user.a"),
            "O_TMPFILE": answer(opened, d, os.O_TMPFILE | os.O_RDWR, 0o600),
        }

    on_disk, through = attempts(disk), attempts(mounted)
    assert set(on_disk.values()) == {"ok"}
    assert through == {
        "symlink": "ENOSYS",
        "mkfifo": "ENOSYS",
        "mknod of a device": "ENOSYS",
        "mknod of a file": "ENOSYS",
        "bind": "ENOSYS",
        "setxattr": EOPNOTSUPP,
        "getxattr": EOPNOTSUPP,
        "listxattr": EOPNOTSUPP,
        "removexattr": EOPNOTSUPP,
        "O_TMPFILE": EOPNOTSUPP,
    }
    assert os.listdir(stored) == ["f"] and os.listxattr(stored / "f") == []


# ---------------------------------------------------------------------- the root


def test_the_root_takes_no_new_entry_and_keeps_its_six_whoever_asks(world):
    """docs/mount.md *What each view shows* (R-2): through the host's view nothing is made
    at the root (``EACCES``: mkdir, create, link, a rename to a new name there) and none of
    the six is removed, renamed away or replaced (``EPERM``; ``unlink`` of one ``EISDIR``);
    a ``chmod`` of the root and of an entry is applied to the storage root, and an ``fsync``
    of the root succeeds; the storage root ends with its six entries."""
    stored = world.fresh("root-entries")
    (stored / "f").write_text("f")
    mounted = world.through(world.host, stored)
    root = world.host
    tries = {
        "mkdir": answer(os.mkdir, root / "new"),
        "create": answer(opened, root / "new", os.O_WRONLY | os.O_CREAT),
        "link": answer(os.link, mounted / "f", root / "new"),
        "rename to a new name": answer(os.rename, mounted / "f", root / "new"),
        "rmdir of an entry": answer(os.rmdir, root / "model"),
        "unlink of an entry": answer(os.unlink, root / "bin"),
        "rename of an entry": answer(os.rename, root / "model", root / "models"),
        "rename over an entry": answer(os.rename, mounted, root / "model"),
        "exchange of an entry": answer(renameat2, mounted, root / "home", RENAME_EXCHANGE),
    }
    assert tries == {
        "mkdir": "EACCES",
        "create": "EACCES",
        "link": "EACCES",
        "rename to a new name": "EACCES",
        "rmdir of an entry": "EPERM",
        "unlink of an entry": "EISDIR",
        "rename of an entry": "EPERM",
        "rename over an entry": "EPERM",
        "exchange of an entry": "EPERM",
    }
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in (world.storage, world.storage / "model")}
    try:
        os.chmod(root, 0o751)
        os.chmod(root / "model", 0o750)
        assert stat.S_IMODE(world.storage.stat().st_mode) == 0o751
        assert stat.S_IMODE((world.storage / "model").stat().st_mode) == 0o750
    finally:
        for path, mode in modes.items():
            os.chmod(world.through(root, path) if path != world.storage else root, mode)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert answer(os.fsync, fd) == "ok"
    finally:
        os.close(fd)
    assert sorted(os.listdir(root)) == sorted(os.listdir(world.storage)) == sorted(ROOT_ENTRIES)
    assert os.listdir(stored) == ["f"]


def test_touching_the_root_of_the_host_view_sets_its_times_and_the_mount_keeps_serving(
    storage, tmp_path
):
    """docs/mount.md (the host's view is the storage root as it is; a ``chmod`` of the root
    is applied): ``touch`` of the mount point, with exact times and with ``UTIME_NOW``, sets
    the storage root's times, and the mount goes on serving."""
    where = tmp_path / "ctx"
    where.mkdir()
    with serving(storage, where) as mount:
        exact = answer(os.utime, where, ns=(1_000_000_000, 2_000_000_000))
        now = answer(os.utime, where)
        serving_still = mounted_at(where) and answer(os.listdir, where) == "ok"
        assert (exact, now, serving_still) == ("ok", "ok", True), mount.said()[-600:]
        assert storage.stat().st_mtime_ns > 2_000_000_000
        assert sorted(os.listdir(where)) == sorted(ROOT_ENTRIES)


def test_chgrp_of_the_root_of_the_host_view_is_applied_and_the_mount_keeps_serving(
    storage, tmp_path
):
    """docs/mount.md: ``chgrp`` of the mount point of the host's view changes the storage
    root's group, as ``chmod`` of it changes its mode, and the mount goes on serving."""
    where = tmp_path / "ctx"
    where.mkdir()
    with serving(storage, where) as mount:
        changed = answer(os.chown, where, -1, OTHER_GID)
        serving_still = mounted_at(where) and answer(os.listdir, where) == "ok"
        assert (changed, serving_still) == ("ok", True), mount.said()[-600:]
        assert storage.stat().st_gid == OTHER_GID


# ---------------------------------------------------------- a user through the host's view


MADE_BY_A_USER = """
os.umask(0o027)
fd = os.open(p("ro"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o444)
e("write to the new read-only file", os.write, fd, b"data")
os.close(fd)
e("open it again for writing", os.open, p("ro"), os.O_WRONLY)
os.close(os.open(p("rw"), os.O_CREAT | os.O_WRONLY, 0o666))
os.mkdir(p("dir"), 0o777)
os.mkdir(p("sticky"), 0o1777)
out["modes"] = [mode(p(n)) for n in ("ro", "rw", "dir", "sticky")]
out["owners"] = [[os.stat(p(n)).st_uid, os.stat(p(n)).st_gid] for n in ("ro", "dir")]
out["content"] = open(p("ro")).read()
open(p("suid"), "w").write("s")
os.chmod(p("suid"), 0o6750)
out["set-id bits set"] = mode(p("suid"))
with open(p("suid"), "a") as f:
    f.write("more")
out["after a write"] = mode(p("suid"))
os.chmod(p("suid"), 0o4750)
os.truncate(p("suid"), 0)
out["after a truncate"] = mode(p("suid"))
"""


def test_a_users_new_files_take_its_umask_and_ids_and_a_read_only_one_is_written_once(world):
    """docs/mount.md (the mode asked less the *caller's* umask; what a caller creates is its
    own): a user making files and directories through the host's view with umask 027 gets
    0440/0640/0750/01750 and its uid and gid; a file created with mode 0444 still gives its
    creator a writable descriptor (open(2)), and a later open for writing is ``EACCES``;
    a write or a truncate by the user clears the set-user-ID and set-group-ID bits of its
    file (write(2), truncate(2)), though the daemon writes as root."""
    disk, stored, mounted = world.pair("user-made")
    on_disk, through = (
        as_user(world.user, MADE_BY_A_USER, disk),
        as_user(world.user, MADE_BY_A_USER, mounted),
    )
    assert through == on_disk
    ids = [world.user.uid, world.user.gid]
    assert on_disk == {
        "write to the new read-only file": "ok",
        "open it again for writing": "EACCES",
        "modes": ["0o440", "0o640", "0o750", "0o1750"],
        "owners": [ids, ids],
        "content": "data",
        "set-id bits set": "0o6750",
        "after a write": "0o750",
        "after a truncate": "0o750",
    }
    assert (stored / "ro").read_text() == "data" and (stored / "ro").stat().st_uid == ids[0]


OWNERS = """
e("chmod of another's file", os.chmod, p("theirs"), 0o600)
e("chown of another's file to oneself", os.chown, p("theirs"), os.getuid(), -1)
e("chmod of one's file", os.chmod, p("mine"), 0o600)
e("chown of one's file to another uid", os.chown, p("mine"), 4321, -1)
e("chgrp of one's file to one's group", os.chown, p("mine"), -1, os.getgid())
e("chgrp of one's file to another group", os.chown, p("mine"), -1, 4322)
e("exact times on another's file", os.utime, p("theirs"), ns=(10**9, 10**9))
e("now on another's writable file", os.utime, p("theirs"))
e("now on another's read-only file", os.utime, p("locked"))
e("exact times on one's file", os.utime, p("mine"), ns=(10**9, 2 * 10**9))
e("open another's read-only file for writing", os.open, p("locked"), os.O_WRONLY)
e("O_TRUNC of it", os.open, p("locked"), os.O_RDONLY | os.O_TRUNC)
e("O_APPEND of it", os.open, p("locked"), os.O_WRONLY | os.O_APPEND)
e("truncate of it", os.truncate, p("locked"), 0)
e("read it", lambda: open(p("locked")).read())
e("link it", os.link, p("locked"), p("locked-link"))
e("O_NOATIME of it", os.open, p("locked"), os.O_RDONLY | os.O_NOATIME)
e("create in another's 0755 directory", os.open, p("closed", "new"), os.O_CREAT | os.O_WRONLY)
e("mkdir there", os.mkdir, p("closed", "new"))
e("rename one's file into it", os.rename, p("mine"), p("closed", "mine"))
e("unlink in it", os.unlink, p("closed", "file"))
e("read in it", lambda: open(p("closed", "file")).read())
e("stat in another's 0700 directory", os.stat, p("private", "file"))
e("list it", os.listdir, p("private"))
out["theirs"] = [mode(p("theirs")), os.stat(p("theirs")).st_uid]
out["locked"] = [mode(p("locked")), os.stat(p("locked")).st_size]
st = os.stat(p("mine"))
out["mine"] = [mode(p("mine")), st.st_uid, st.st_mtime_ns]
"""


def test_owner_and_permission_checks_of_a_user_are_the_kernels_as_on_the_storage_root(world):
    """docs/mount.md (``default_permissions``: a file keeps its owner and mode, the kernel
    checks the caller's): a user may ``chmod``, ``chgrp`` to its own group and set exact
    times of its own file only (``EPERM`` for another's, and for ``chown`` to another
    uid); ``touch`` of another's file needs write permission (``EACCES``); another's 0644
    file cannot be opened for writing, truncated or appended to (``EACCES``): each answer as
    on the storage root, and no refused change reaches the disk."""
    disk, stored, mounted = world.pair("owners")
    for d in (disk, stored):
        owned_by_another(d, "theirs", 0o666)
        owned_by_another(d, "locked", 0o644, "locked\n")
        (d / "mine").write_text("mine")
        os.chown(d / "mine", world.user.uid, world.user.gid)
        for name, mode in (("closed", 0o755), ("private", 0o700)):
            (d / name).mkdir()
            owned_by_another(d / name, "file", 0o644)
            os.chown(d / name, OTHER_UID, OTHER_GID)
            (d / name).chmod(mode)
    on_disk, through = as_user(world.user, OWNERS, disk), as_user(world.user, OWNERS, mounted)
    assert through == on_disk
    assert {k: v for k, v in on_disk.items() if not isinstance(v, list) and k != "link it"} == {
        "chmod of another's file": "EPERM",
        "chown of another's file to oneself": "EPERM",
        "chmod of one's file": "ok",
        "chown of one's file to another uid": "EPERM",
        "chgrp of one's file to one's group": "ok",
        "chgrp of one's file to another group": "EPERM",
        "exact times on another's file": "EPERM",
        "now on another's writable file": "ok",
        "now on another's read-only file": "EACCES",
        "exact times on one's file": "ok",
        "open another's read-only file for writing": "EACCES",
        "O_TRUNC of it": "EACCES",
        "O_APPEND of it": "EACCES",
        "truncate of it": "EACCES",
        "read it": "ok",
        "O_NOATIME of it": "EPERM",
        "create in another's 0755 directory": "EACCES",
        "mkdir there": "EACCES",
        "rename one's file into it": "EACCES",
        "unlink in it": "EACCES",
        "read in it": "ok",
        "stat in another's 0700 directory": "EACCES",
        "list it": "EACCES",
    }
    assert on_disk["theirs"] == ["0o666", OTHER_UID] and on_disk["locked"] == ["0o644", 7]
    assert on_disk["mine"] == ["0o600", world.user.uid, 2 * 10**9]
    assert (stored / "locked").read_text() == "locked\n"
    assert sorted(os.listdir(stored / "closed")) == ["file"]


STICKY = """
e("unlink another's file", os.unlink, p("theirs"))
e("rename another's file", os.rename, p("theirs"), p("taken"))
open(p("mine"), "w").write("mine")
e("rename one's file over another's", os.rename, p("mine"), p("theirs"))
e("rmdir another's directory", os.rmdir, p("their-dir"))
e("unlink one's file", os.unlink, p("mine"))
out["left"] = sorted(os.listdir(d))
"""


def test_a_sticky_directory_keeps_another_owners_entries_from_a_user(world):
    """unlink(2)/rename(2)/rmdir(2) in a world-writable sticky directory (mode 1777) through
    the host's view: a user may not remove, rename or replace another owner's file or
    directory (``EPERM``) and may remove its own: as on the storage root."""
    disk, stored, mounted = world.pair("sticky", mode=0o1777)
    for d in (disk, stored):
        owned_by_another(d, "theirs", 0o666)
        (d / "their-dir").mkdir()
        os.chown(d / "their-dir", OTHER_UID, OTHER_GID)
    on_disk, through = as_user(world.user, STICKY, disk), as_user(world.user, STICKY, mounted)
    assert (
        through
        == on_disk
        == {
            "unlink another's file": "EPERM",
            "rename another's file": "EPERM",
            "rename one's file over another's": "EPERM",
            "rmdir another's directory": "EPERM",
            "unlink one's file": "ok",
            "left": ["their-dir", "theirs"],
        }
    )
    assert (stored / "theirs").read_text() == "theirs\n"


# ------------------------------------------------------------------------ the agent's view


FIND = """
done = subprocess.run(["find", d, "-type", "d"], capture_output=True, text=True)
out["find"] = sorted(os.path.relpath(line, d) for line in done.stdout.split())
out["find status"] = done.returncode
out["directory links"] = sorted({os.stat(os.path.join(top, n)).st_nlink
                                 for top, dirs, _ in os.walk(d) for n in dirs + ["."]})
out["file links"] = [os.stat(p("a", "f")).st_nlink, os.stat(p("g")).st_nlink]
out["root links"] = os.stat(sys.argv[2]).st_nlink
"""


def test_the_agents_view_counts_no_directory_links_and_find_still_walks_every_directory(world):
    """docs/mount.md: every directory of an agent's view has ``st_nlink`` 1 ("not counted"),
    its root too, so ``find`` makes no assumption from it and walks every subdirectory; a
    file keeps its own link count; the host's view shows the counts on disk."""
    stored = world.fresh("walk", 0o755)
    for sub in ("a/b/c", "a/d", "e"):
        (stored / sub).mkdir(parents=True)
    (stored / "a" / "f").write_text("f")
    os.link(stored / "a" / "f", stored / "g")
    viewed = world.through(world.view, stored)
    seen = as_user(world.user, FIND, viewed, world.view)
    assert seen == {
        "find": [".", "a", "a/b", "a/b/c", "a/d", "e"],
        "find status": 0,
        "directory links": [1],
        "file links": [2, 2],
        "root links": 1,
    }
    hosts = as_user(world.user, FIND, world.through(world.host, stored), world.host)
    assert hosts["find"] == seen["find"] and hosts["directory links"] == [2, 3, 4]
    assert hosts["root links"] == world.storage.stat().st_nlink


AGENT_REFUSALS = """
team, audit, secret, home = sys.argv[2:6]
j = os.path.join
e("stat of a hidden space", os.stat, secret)
e("open in a hidden space", os.open, j(secret, "data", "s.txt"), os.O_RDONLY)
e("mkdir of a hidden space's name", os.mkdir, secret)
e("read in the read-only space", lambda: open(j(audit, "a.txt")).read())
e("create in the read-only space", os.open, j(audit, "new"), os.O_CREAT | os.O_WRONLY, 0o644)
e("open for writing there", os.open, j(audit, "a.txt"), os.O_WRONLY)
e("O_TRUNC there", os.open, j(audit, "a.txt"), os.O_RDONLY | os.O_TRUNC)
e("truncate there", os.truncate, j(audit, "a.txt"), 0)
e("touch there", os.utime, j(audit, "a.txt"))
e("chmod there", os.chmod, j(audit, "a.txt"), 0o600)
def synced(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
e("fsync of a file there", synced, j(audit, "a.txt"))
e("unlink there", os.unlink, j(audit, "a.txt"))
e("mkdir there", os.mkdir, j(audit, "d"))
e("rename out of it", os.rename, j(audit, "a.txt"), j(team, "a.txt"))
e("rename into it", os.rename, j(team, "t.txt"), j(audit, "t.txt"))
e("link out of it", os.link, j(audit, "a.txt"), j(team, "a-link"))
e("link into it", os.link, j(team, "t.txt"), j(audit, "t-link"))
e("exchange with it", renameat2, j(team, "t.txt"), j(audit, "a.txt"), 2)
e("mkdir at the root", os.mkdir, sys.argv[6] + "/x")
e("write in the writable space", lambda: open(j(team, "w.txt"), "w").write("w"))
e("chmod in the writable space", os.chmod, j(team, "t.txt"), 0o600)
out["shared"] = sorted(os.listdir(j(sys.argv[6], "shared")))
"""


def test_the_agents_view_refuses_what_it_may_not_change_and_hides_what_it_may_not_see(world):
    """docs/mount.md: in agent ``coder``'s view a name it may not see is ``ENOENT``
    (``mkdir`` of it ``EACCES``: nothing is made there), every change it may not make in its
    read-only space ``EACCES`` — create, open for writing, ``O_TRUNC``, truncate, touch,
    unlink, mkdir, rename or link in or out, exchange — while it reads there and writes in
    its writable space; no refused change reaches the storage root."""
    team, audit = world.fresh("agent-w", 0o2775), world.fresh("agent-r", 0o2775, READ_ONLY)
    for d in (team, audit):
        os.chown(d, world.user.uid, world.user.gid)
    (audit / "a.txt").write_text("audit")
    os.chown(audit / "a.txt", world.user.uid, world.user.gid)
    (team / "t.txt").write_text("team")
    os.chown(team / "t.txt", world.user.uid, world.user.gid)
    secret = world.storage / "shared" / HIDDEN
    (secret / "data" / "s.txt").write_text("secret")
    before = kinds(audit), (audit / "a.txt").stat()
    v = world.view
    seen = as_user(world.user, AGENT_REFUSALS, world.through(v, team),
                   world.through(v, team), world.through(v, audit),
                   world.through(v, secret), world.through(v, world.home), v)  # fmt: skip
    assert seen == {
        "stat of a hidden space": "ENOENT",
        "open in a hidden space": "ENOENT",
        "mkdir of a hidden space's name": "EACCES",
        "read in the read-only space": "ok",
        "create in the read-only space": "EACCES",
        "open for writing there": "EACCES",
        "O_TRUNC there": "EACCES",
        "truncate there": "EACCES",
        "touch there": "EACCES",
        "chmod there": "EACCES",
        "fsync of a file there": "ok",
        "unlink there": "EACCES",
        "mkdir there": "EACCES",
        "rename out of it": "EACCES",
        "rename into it": "EACCES",
        "link out of it": "EACCES",
        "link into it": "EACCES",
        "exchange with it": "EACCES",
        "mkdir at the root": "EACCES",
        "write in the writable space": "ok",
        "chmod in the writable space": "ok",
        "shared": sorted({WRITABLE, READ_ONLY, "cortexfs-docs"}),
    }
    after = (audit / "a.txt").stat()
    assert kinds(audit) == before[0]
    assert (after.st_mode, after.st_mtime_ns) == (before[1].st_mode, before[1].st_mtime_ns)
    assert stat.S_IMODE((team / "t.txt").stat().st_mode) == 0o600
    assert kinds(team) == {"t.txt": ("file", b"team"), "w.txt": ("file", b"w")}
    assert sorted(os.listdir(secret / "data")) == ["s.txt"]


AGENT_NUMBERS = """
import ctypes
home, team = sys.argv[2], sys.argv[3]
j = os.path.join
open(j(home, "h.txt"), "w").write("home")
os.mkdir(j(team, "sub"))
open(j(team, "sub", "t.txt"), "w").write("team")
made = (("h", j(home, "h.txt")), ("sub", j(team, "sub")), ("t", j(team, "sub", "t.txt")))
out["numbers"] = {n: os.stat(x).st_ino for n, x in made}
out["d_ino"] = {x.name: x.inode() == os.stat(x.path, follow_symlinks=False).st_ino
                for x in os.scandir(team)}
e("rename home to space", os.rename, j(home, "h.txt"), j(team, "from-home"))
e("rename space to home", os.rename, j(team, "sub", "t.txt"), j(home, "from-team"))
open(j(home, "h2"), "w").write("h2")
e("NOREPLACE over an existing name", renameat2, j(home, "h2"), j(team, "from-home"), 1)
e("exchange home and space", renameat2, j(home, "h2"), j(team, "from-home"), 2)
e("link home into space", os.link, j(home, "from-team"), j(team, "linked"))
out["moved numbers"] = [os.stat(j(home, "h2")).st_ino, os.stat(j(team, "linked")).st_ino]
"""


def test_the_agents_view_shows_disk_inode_numbers_and_moves_files_between_home_and_space(
    world,
):
    """docs/mount.md (writes are allowed in the agent's home and in the spaces it may
    write; every file shows its number on disk): in agent ``coder``'s view ``st_ino`` and
    ``d_ino`` are the storage root's; renames both ways between its home and its writable
    space, ``RENAME_NOREPLACE`` (``EEXIST`` over a name) and ``RENAME_EXCHANGE`` and a link
    across them land on the storage root with the files' numbers kept."""
    team = world.fresh("agent-moves", 0o2775)
    os.chown(team, world.user.uid, world.user.gid)
    home = world.home / f"moves-{next(SEQUENCE)}"
    home.mkdir()
    os.chown(home, world.user.uid, world.user.gid)
    seen = as_user(world.user, AGENT_NUMBERS, world.view, world.through(world.view, home),
                   world.through(world.view, team))  # fmt: skip
    h, t = seen["numbers"]["h"], seen["numbers"]["t"]
    assert seen["numbers"] == {"h": h, "sub": (team / "sub").stat().st_ino, "t": t}
    assert seen["d_ino"] == {"sub": True}
    assert {k: v for k, v in seen.items() if isinstance(v, str)} == {
        "rename home to space": "ok",
        "rename space to home": "ok",
        "NOREPLACE over an existing name": "EEXIST",
        "exchange home and space": "ok",
        "link home into space": "ok",
    }
    assert kinds(home) == {"from-team": ("file", b"team"), "h2": ("file", b"home")}
    assert kinds(team) == {
        "sub": ("dir",),
        "from-home": ("file", b"h2"),
        "linked": ("file", b"team"),
    }
    assert seen["moved numbers"] == [h, t]
    assert os.stat(home / "h2").st_ino == h and os.stat(team / "linked").st_ino == t
