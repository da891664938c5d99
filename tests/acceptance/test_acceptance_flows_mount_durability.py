"""What ``ctx mount`` promises about durability and atomicity (SPEC §13 F-1, docs/mount.md
*What the mount promises*, with the queue of §2 and docs/queue.md), checked through real
mounts of a scratch storage root, the host's view and ``ctx mount --as coder``, with
``strace`` attached to the mount's own process where the promise is about the calls it
makes on the storage root: an ``fsync``/``fdatasync``/``msync`` through the mount is one on
the file or directory behind it; renames keep their flags and their atomicity; ``O_APPEND``
writers and ``O_EXCL`` creators racing through the mount and on the storage root; locks as
the page describes them; a file being written when the mount's process is SIGKILLed; sizes,
holes and mapped writes; and the whole queue protocol worked through the mount leaving what
it leaves when worked on the storage root, each name change and sync in the same order."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MOUNT_WAIT,
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
from tests.support.strace import trace_lines
from tests.support.users import UnprivilegedUser, find_or_create_user

SCRATCH = scratch_top(__file__)
AGENT, SPACE = "coder", "team"
RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2
REQUEST = {"tool": "fs.stat", "input": {"path": "/"}}

needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
pytestmark = [needs_fuse_as_root, needs_fuse]  # a mount serving other uids needs root

# ------------------------------------------------------------------------------ helpers


@dataclass
class World:
    """A storage root with space ``team`` (made by ``ctx shared create``, of the test user's
    group); :meth:`create_agent` adds agent ``coder``, running as that user, which may read
    and write it.  ``top`` is searchable by every uid and holds the mount points, logs and
    caches."""

    top: Path
    storage: Path
    user: UnprivilegedUser

    @property
    def data(self) -> Path:
        return self.storage / "shared" / SPACE / "data"

    def create_agent(self) -> None:
        req = {
            "name": AGENT,
            "label": f"{AGENT}_t",
            "tools": [],
            "shared": {SPACE: ["read", "write"]},
        }
        made = ctx_run("agent", "create", "--storage", self.storage, "--user", self.user.name,
                       "-", input=json.dumps(req))  # fmt: skip
        assert made.rc == 0, made

    def mountpoint(self, name: str) -> Path:
        path = self.top / name
        path.mkdir(mode=0o755, exist_ok=True)
        return path

    def drop(self, name: str) -> Path:
        """A directory every uid may write (logs of ``strace``, reports of programs)."""
        path = self.top / name
        path.mkdir(exist_ok=True)
        path.chmod(0o1777)
        return path

    def env(self, as_agent: bool) -> dict[str, str]:
        """A plain environment with a claim-order cache of the runner's own under ``top``."""
        cache = self.top / ("cache-agent" if as_agent else "cache-root")
        if not cache.exists():
            cache.mkdir(mode=0o700)
            if as_agent:
                os.chown(cache, self.user.uid, self.user.gid)
        return {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "XDG_CACHE_HOME": str(cache)}


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH)
    storage = copy_of_root(_template, top / "storage")
    made = ctx_run("shared", "create", SPACE, "--group", str(user.gid), "--storage", storage)
    assert made.rc == 0, made
    try:
        yield World(top, storage, user)
    finally:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            where = line.split()[4]
            if where.startswith(str(top) + "/"):
                subprocess.run(["umount", "-l", where], check=False)
        shutil.rmtree(top, ignore_errors=True)


def run_py(
    script: str, *args: object, user: UnprivilegedUser | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``script`` in a new interpreter, as root or as ``user`` with its own group only."""
    ids = {} if user is None else {"user": user.uid, "group": user.gid, "extra_groups": [user.gid]}
    return subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True, text=True, timeout=timeout, **ids,
    )  # fmt: skip


def ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def traced_by(pid: int) -> bool:
    """Whether every thread of ``pid`` has a tracer attached."""
    tasks = Path(f"/proc/{pid}/task")
    return all(
        int(re.search(r"TracerPid:\s+(\d+)", (t / "status").read_text()).group(1)) != 0
        for t in tasks.iterdir()
    )


@contextlib.contextmanager
def traced_daemon(mount: Mount, calls: str) -> Iterator[list[str]]:
    """``strace -f -y -e trace=CALLS`` attached to the ``ctx mount`` process for the block;
    the list yielded is filled, after the block, with the whole calls it made."""
    log = mount.where.with_name(mount.where.name + ".daemon.strace")
    tracer = subprocess.Popen(
        ["strace", "-f", "-qq", "-y", "-s", "4096", "-e", f"trace={calls}", "-o", str(log),
         "-p", str(mount.proc.pid)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    seen: list[str] = []
    try:
        assert wait_for(lambda: tracer.poll() is not None or traced_by(mount.proc.pid), 30)
        assert tracer.poll() is None, tracer.communicate()
        yield seen
    finally:
        if tracer.poll() is None:
            tracer.send_signal(signal.SIGINT)  # detaches, the daemon goes on
        tracer.communicate(timeout=30)
    seen.extend(trace_lines(log))


_CALL = re.compile(r"^\d+\s+(?P<call>\w+)\((?P<args>.*)\)\s+=\s+(?P<ret>-?\d+)")
_FD = re.compile(r"(?:-?\d+|AT_FDCWD)<(?P<path>[^>]*)>")
_STRING = re.compile(r'"(?P<text>(?:[^"\\]|\\.)*)"')
SYNCS = {"fsync", "fdatasync", "syncfs", "sync"}
NAME_CHANGES = {"linkat", "unlinkat", "renameat", "renameat2", "rename", "link", "unlink"}


def events(lines: list[str], under: str) -> list[tuple[str, ...]]:
    """The successful syncs and name changes of a ``strace -y`` log whose paths lie below
    ``under``, each ``(kind, path…)`` with paths made relative to ``under``: ``fsync``,
    ``fdatasync`` and ``syncfs`` of a descriptor (``sync`` has none); ``link``, ``unlink``,
    ``rmdir``, ``rename`` and ``rename:FLAGS`` with the names they change (``dirfd
    path/name``)."""
    found: list[tuple[str, ...]] = []
    for line in lines:
        m = _CALL.match(line)
        if not m or m["ret"] != "0" or m["call"] not in SYNCS | NAME_CHANGES:
            continue
        call, args = m["call"], m["args"]
        if call == "sync":
            found.append(("sync",))
            continue
        dirs = [d["path"] for d in _FD.finditer(args)]
        names = [s["text"] for s in _STRING.finditer(args)]
        if call in SYNCS:
            paths, kind = dirs[:1], call
        else:
            # linkat/unlinkat/renameat*: each name relative to the directory before it;
            # link/unlink/rename: the names themselves.
            paths = [os.path.join(d, n) for d, n in zip(dirs, names, strict=False)] or names
            if call.startswith("unlink"):
                kind = "rmdir" if "AT_REMOVEDIR" in args else "unlink"
            elif call.startswith("link"):
                kind = "link"
            else:
                flags = args.rsplit(",", 1)[-1].strip() if call == "renameat2" else "0"
                kind = "rename" if flags == "0" else f"rename:{flags}"
        inside = under.rstrip("/") + "/"
        if paths and all(p == under or p.startswith(inside) for p in paths):
            found.append((kind, *(os.path.relpath(p, under) for p in paths)))
    return found


def renameat2(old: Path, new: Path, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, bytes(old), -100, bytes(new), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(old))


def errno_of(action) -> str:
    try:
        action()
    except OSError as e:
        return errno.errorcode[e.errno]
    return "ok"


# ------------------------------------------------------------- fsync reaches the disk

SYNCING = textwrap.dedent(
    """
    import mmap, os, sys
    d = sys.argv[1]
    fd = os.open(f"{d}/f", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"first\\n")
    os.fsync(fd)
    os.write(fd, b"second\\n")
    os.fdatasync(fd)
    os.close(fd)
    fd = os.open(f"{d}/g", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.ftruncate(fd, 8192)
    m = mmap.mmap(fd, 8192)
    m[100:112] = b"mapped bytes"
    m.flush()  # msync(MS_SYNC)
    m.close()
    os.close(fd)
    os.mkdir(f"{d}/sub")
    dfd = os.open(f"{d}/sub", os.O_RDONLY | os.O_DIRECTORY)
    t = os.open(f"{d}/sub/h.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(t, b"h\\n")
    os.fsync(t)
    os.close(t)
    os.rename(f"{d}/sub/h.tmp", f"{d}/sub/h")
    os.fsync(dfd)
    os.rename(f"{d}/sub", f"{d}/moved")  # through the mount: the same directory, renamed
    os.fdatasync(dfd)
    os.close(dfd)
    """
)


@needs_strace
@pytest.mark.parametrize("view", ["host", "agent"])
def test_each_fsync_through_the_mount_is_an_fsync_of_the_file_or_directory_behind_it(
    world: World, view: str
):
    """F-1 and docs/mount.md *Durability* ("``fsync`` on a file or a directory of the mount
    is ``fsync`` on the file or directory behind it"), in the host's view as root and in
    ``ctx mount --as coder`` as the agent's uid: the mount's process answers an ``fsync`` of
    a file with ``fsync`` of that file on the storage root, an ``fdatasync`` with
    ``fdatasync``, an ``msync(MS_SYNC)`` of a shared mapping with a sync of the mapped file,
    and an ``fsync`` of a directory with one of the directory behind it, also once the
    directory was renamed through the mount — one each, in the caller's order, nothing
    else; and the bytes are on the storage root."""
    user = world.user if view == "agent" else None
    if view == "agent":
        world.create_agent()
    where = world.mountpoint("view")
    args = ("--as", AGENT) if view == "agent" else ()
    with (
        serving(world.storage, where, *args) as mount,
        traced_daemon(mount, "fsync,fdatasync,syncfs,sync") as calls,
    ):
        ok(run_py(SYNCING, where / "shared" / SPACE / "data", user=user))
    seen = events(calls, str(world.data))
    assert [path for _, path in seen] == ["f", "f", "g", "sub/h.tmp", "sub", "moved"], calls
    kinds = [kind for kind, _ in seen]
    assert kinds[:2] == ["fsync", "fdatasync"], seen
    assert kinds[2] in ("fsync", "fdatasync"), seen
    assert kinds[3:] == ["fsync", "fsync", "fsync"], seen  # a directory's fsync is a full one
    assert (world.data / "f").read_bytes() == b"first\nsecond\n"
    assert (world.data / "g").read_bytes()[100:112] == b"mapped bytes"
    assert (world.data / "moved" / "h").read_bytes() == b"h\n"
    owner = (world.user.uid if view == "agent" else 0, world.user.gid)  # setgid space
    st = (world.data / "f").stat()
    assert (st.st_uid, st.st_gid) == owner


@needs_strace
def test_fsync_of_an_open_directory_whose_name_was_swapped_on_disk_syncs_that_directory(
    world: World,
):
    """F-1 and docs/mount.md *Durability* and *Names*: a directory opened through the mount,
    given an entry there, is renamed on the storage root and another directory made at its
    name; an ``fsync`` of the open descriptor must sync the directory it stands for (which
    now holds the entry under its new name) or fail with ``ESTALE`` ("ESTALE when the name
    now leads to another file"), as a listing through the same descriptor does — never
    report success for an fsync of the other directory."""
    where = world.mountpoint("view")
    here, disk = where / "shared" / SPACE / "data", world.data
    (disk / "D").mkdir()
    with serving(world.storage, where) as mount:
        fd = os.open(here / "D", os.O_RDONLY | os.O_DIRECTORY)
        try:
            (here / "D" / "entry").write_bytes(b"made through the mount\n")
            os.rename(disk / "D", disk / "D.old")
            (disk / "D").mkdir()
            listed = errno_of(lambda: os.listdir(f"/proc/self/fd/{fd}"))
            with traced_daemon(mount, "fsync,fdatasync") as calls:
                synced = errno_of(lambda: os.fsync(fd))
        finally:
            os.close(fd)
    assert listed == "ESTALE"  # the same descriptor, listed: the daemon checks identity
    assert os.listdir(disk / "D.old") == ["entry"] and os.listdir(disk / "D") == []
    targets = [path for _, path in events(calls, str(disk))]
    assert synced == "ESTALE" or (synced == "ok" and targets == ["D.old"]), (synced, calls)


# ------------------------------------------------------------------------------ renames

READER = textwrap.dedent(
    """
    import errno, json, os, sys
    from collections import Counter
    names, stop, size = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
    seen = Counter()
    while not os.path.exists(stop):
        for name in names:
            try:
                with open(name, "rb") as f:
                    data = f.read()
                whole = len(data) == size and len(set(data.splitlines())) == 1
                seen["whole" if whole else "torn"] += 1
            except OSError as e:
                seen[errno.errorcode[e.errno]] += 1
    print(json.dumps(seen))
    """
)


def version(i: int) -> bytes:
    return (b"version %06d\n" % i) * 64  # 960 bytes, every line the same


def test_renames_through_the_mount_are_atomic_for_readers_of_the_mount(world: World):
    """F-1 and docs/mount.md *Durability*/*Names* ("``renameat2`` flags are passed through
    as the same atomic call"): while two processes keep opening and reading names through
    the mount, a third replaces ``target`` by ``os.rename`` of a fully written temp file 100
    times, then swaps ``a`` and ``b`` by ``RENAME_EXCHANGE`` 100 times, all through the
    mount: no reader ever meets a missing name (``ENOENT``) or a file not whole, and the
    storage root ends with exactly the last version and the swapped pair.  (An open that
    meets the replaced file's node once it is gone answers ``ESTALE`` now and then: the
    next test shows why, deterministically.)"""
    where = world.mountpoint("view")
    here, disk = where / "shared" / SPACE / "data", world.data
    (disk / "target").write_bytes(version(0))
    (disk / "a").write_bytes(version(1_000_000 - 1))
    (disk / "b").write_bytes(version(999_000))
    stop = world.drop("flags") / "stop"
    with serving(world.storage, where):
        names = ",".join(str(here / n) for n in ("target", "a", "b"))
        readers = [
            subprocess.Popen(
                [sys.executable, "-c", READER, names, str(stop), str(len(version(0)))],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        try:
            for i in range(1, 101):
                temp = here / f"target.{i}.tmp"
                temp.write_bytes(version(i))
                os.rename(temp, here / "target")
            for _ in range(100):
                renameat2(here / "a", here / "b", RENAME_EXCHANGE)
        finally:
            stop.touch()
            said = [r.communicate(timeout=60) for r in readers]
    for out, err in said:
        assert err == "", err
        seen = json.loads(out)
        assert seen.get("whole", 0) > 0 and set(seen) <= {"whole", "ESTALE"}, seen
    assert sorted(os.listdir(disk)) == ["a", "b", "target"]
    assert (disk / "target").read_bytes() == version(100)
    assert (disk / "a").read_bytes() == version(999_999)  # an even number of exchanges
    assert (disk / "b").read_bytes() == version(999_000)


@pytest.mark.xfail(
    strict=True,
    reason="a descriptor (O_PATH) of a file replaced or unlinked through the mount answers "
    "ESTALE to fstat and to reopening /proc/self/fd/N",
)
def test_a_file_renamed_over_or_unlinked_through_the_mount_stays_reachable_by_descriptor(
    world: World,
):
    """F-1, docs/mount.md *Open files* ("a file unlinked while it is open stays usable
    through its descriptor until the last one is closed (``fstat``, …, reopening
    ``/proc/PID/fd/N``), as on a local filesystem") and rename(2)'s atomicity: a process
    holds an ``O_PATH`` descriptor of ``target`` (what the kernel holds of a file between
    the lookup of its name and its open); another process replaces ``target`` by a rename
    through the mount, and ``gone`` is unlinked through the mount.  Each descriptor still
    ``fstat``s its file (link count 0) and reopens it through ``/proc/self/fd/N`` with its
    old bytes — as on the storage root itself, checked first.  Through the mount both answer
    ``ESTALE``, the answer an ``open`` of the name racing a rename over it meets now and
    then (above), where a local filesystem never fails to open a name that always exists."""
    where = world.mountpoint("view")
    here, disk = where / "shared" / SPACE / "data", world.data

    def held_then_replaced(directory: Path) -> dict[str, object]:
        (directory / "target").write_bytes(b"old\n")
        (directory / "target.new").write_bytes(b"new\n")
        (directory / "gone").write_bytes(b"gone\n")
        replaced = os.open(directory / "target", os.O_PATH)
        unlinked = os.open(directory / "gone", os.O_PATH)
        try:
            script = "import os, sys; os.rename(sys.argv[1], sys.argv[2]); os.unlink(sys.argv[3])"
            ok(run_py(script, directory / "target.new", directory / "target", directory / "gone"))
            seen: dict[str, object] = {}
            for name, fd in (("replaced", replaced), ("unlinked", unlinked)):
                try:
                    seen[f"{name} links"] = os.fstat(fd).st_nlink
                except OSError as e:
                    seen[f"{name} links"] = errno.errorcode[e.errno]
                try:
                    with open(f"/proc/self/fd/{fd}", "rb") as again:
                        seen[f"{name} bytes"] = again.read()
                except OSError as e:
                    seen[f"{name} bytes"] = errno.errorcode[e.errno]
            return seen
        finally:
            os.close(replaced)
            os.close(unlinked)

    expected = {"replaced links": 0, "replaced bytes": b"old\n",
                "unlinked links": 0, "unlinked bytes": b"gone\n"}  # fmt: skip
    (disk / "direct").mkdir()
    assert held_then_replaced(disk / "direct") == expected
    (disk / "mounted").mkdir()
    with serving(world.storage, where):
        seen = held_then_replaced(here / "mounted")
        assert (here / "mounted" / "target").read_bytes() == b"new\n"
    assert seen == expected


RACER = textwrap.dedent(
    """
    import ctypes, errno, os, random, sys, time
    here, tag, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    go, done, jitter = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
    libc = ctypes.CDLL(None, use_errno=True)
    said = []
    for i in range(rounds):
        os.read(go, 1)  # the signal to start this round
        time.sleep(random.random() * jitter)
        old, new = f"{here}/{tag}.{i}".encode(), f"{here}/t.{i}".encode()
        if libc.renameat2(-100, old, -100, new, 1) == 0:  # RENAME_NOREPLACE
            said.append("ok")
        else:
            said.append(errno.errorcode[ctypes.get_errno()])
        os.write(done, b".")
    print(" ".join(said))
    """
)


@needs_strace
def test_rename_noreplace_through_the_mount_and_on_disk_race_with_one_winner(world: World):
    """F-1 and docs/mount.md: ``RENAME_NOREPLACE`` through the mount is the same single call
    on the storage root (the mount's process makes ``renameat2(…, RENAME_NOREPLACE)``, not a
    test then a rename; ``RENAME_EXCHANGE`` likewise; a plain ``rename`` stays plain), so a
    process renaming through the mount and one renaming directly on the storage root onto
    the same new name, at the same moment, 60 times: each time exactly one wins, the other
    gets ``EEXIST``, the name holds the winner's file and the loser's file is still there."""
    rounds = 60
    where = world.mountpoint("view")
    here, disk = where / "shared" / SPACE / "data", world.data
    for i in range(rounds):
        (disk / f"m.{i}").write_bytes(b"from the mount\n")
        (disk / f"s.{i}").write_bytes(b"from the storage root\n")
    with serving(world.storage, where) as mount:
        with traced_daemon(mount, "renameat2,renameat,rename") as calls:
            (here / "x").write_bytes(b"x\n")
            (here / "y").write_bytes(b"y\n")
            renameat2(here / "x", here / "z", RENAME_NOREPLACE)
            renameat2(here / "z", here / "y", RENAME_EXCHANGE)
            os.rename(here / "y", here / "z")
        pipes = []
        racers = []
        for base, tag, jitter in ((here, "m", "0"), (disk, "s", "0.0004")):
            go_r, go_w = os.pipe()
            done_r, done_w = os.pipe()
            argv = [sys.executable, "-c", RACER, str(base), tag, str(rounds),
                    str(go_r), str(done_w), jitter]  # fmt: skip
            racers.append(
                subprocess.Popen(argv, pass_fds=(go_r, done_w), stdout=subprocess.PIPE, text=True)
            )
            os.close(go_r)
            os.close(done_w)
            pipes.append((go_w, done_r))
        try:
            for _ in range(rounds):
                for go, _ in pipes:
                    os.write(go, b".")
                for _, done in pipes:
                    assert os.read(done, 1) == b"."
            outs = [r.communicate(timeout=60)[0].split() for r in racers]
        finally:
            for go, done in pipes:
                os.close(go)
                os.close(done)
            for r in racers:
                if r.poll() is None:
                    r.kill()
                    r.wait()
    renames = [e for e in events(calls, str(disk)) if e[0].startswith("rename")]
    assert renames == [
        ("rename:RENAME_NOREPLACE", "x", "z"),
        ("rename:RENAME_EXCHANGE", "z", "y"),
        ("rename", "y", "z"),
    ], calls
    for i, pair in enumerate(zip(*outs, strict=True)):
        assert sorted(pair) == ["EEXIST", "ok"], (i, pair)
        winner, loser = ("m", "s") if pair[0] == "ok" else ("s", "m")
        won = b"from the mount\n" if winner == "m" else b"from the storage root\n"
        assert (disk / f"t.{i}").read_bytes() == won
        assert (disk / f"{loser}.{i}").exists() and not (disk / f"{winner}.{i}").exists()


# ------------------------------------------------------------------ appends and creates

APPENDER = textwrap.dedent(
    """
    import os, sys
    path, tag, count, size = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[4])
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for i in range(count):
        record = b"%s %04d " % (tag, i)
        record += tag * (size - len(record) - 1) + b"\\n"
        assert os.write(fd, record) == size
    os.close(fd)
    """
)


def test_o_append_writes_of_several_processes_through_the_mount_never_interleave(world: World):
    """F-1 with S-5 (appends, one record a ``write`` on an ``O_APPEND`` descriptor; readers
    never see two interleaved): three processes append records of 1.5 MiB each — more than
    one FUSE write request carries, so the kernel splits each — to one file through the
    mount at once.  The file on the storage root holds every record whole, each process's
    in its own order, and nothing else."""
    size, count = 3 << 19, 6
    where = world.mountpoint("view")
    with serving(world.storage, where):
        log = where / "shared" / SPACE / "data" / "events.log"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", APPENDER, str(log), tag, str(count), str(size)],
                stderr=subprocess.PIPE,
                text=True,
            )
            for tag in "ABC"
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
    data = (world.data / "events.log").read_bytes()
    assert len(data) == 3 * count * size
    records = [data[i : i + size] for i in range(0, len(data), size)]
    for tag in "ABC":
        mine = [r for r in records if r[:1] == tag.encode()]
        assert len(mine) == count
        for i, record in enumerate(mine):
            head = b"%s %04d " % (tag.encode(), i)
            assert record == head + tag.encode() * (size - len(head) - 1) + b"\n", (tag, i)


CREATOR = textwrap.dedent(
    """
    import errno, os, random, sys, time
    here, tag, rounds, flags = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    go, done, jitter = int(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
    said = []
    for i in range(rounds):
        if os.read(go, 1) != b".":
            break
        if jitter:
            time.sleep(random.random() * jitter)
        try:
            fd = os.open(f"{here}/c.{i}", flags, 0o644)
            os.write(fd, tag.encode())
            os.close(fd)
            said.append("ok")
        except OSError as e:
            said.append(errno.errorcode[e.errno])
        os.write(done, said[-1].encode() + b"\\n")
    print(" ".join(said))
    """
)


def race_creates(
    bases: list[tuple[Path, str, float]], rounds: int, flags: int, until=None
) -> list[list[str]]:
    """Processes, one per ``(directory, tag, jitter)``, that each open ``c.<i>`` with
    ``flags`` (and write their tag) at the same signal, round after round; the outcomes of
    each.  ``until(outcomes of a round)`` ends the race early when it holds."""
    pipes, procs = [], []
    for base, tag, jitter in bases:
        go_r, go_w = os.pipe()
        done_r, done_w = os.pipe()
        argv = [sys.executable, "-c", CREATOR, str(base), tag, str(rounds), str(flags),
                str(go_r), str(done_w), str(jitter)]  # fmt: skip
        procs.append(
            subprocess.Popen(argv, pass_fds=(go_r, done_w), stdout=subprocess.PIPE, text=True)
        )
        os.close(go_r)
        os.close(done_w)
        pipes.append((go_w, os.fdopen(done_r, "rb")))
    try:
        for _ in range(rounds):
            for go, _ in pipes:
                os.write(go, b".")
            outcome = [done.readline().strip().decode() for _, done in pipes]
            if until is not None and until(outcome):
                break
        for go, _ in pipes:
            os.close(go)
        return [p.communicate(timeout=60)[0].split() for p in procs]
    finally:
        for go, done in pipes:
            with contextlib.suppress(OSError):
                os.close(go)
            done.close()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_o_excl_create_is_exclusive_between_the_mount_and_the_storage_root(world: World):
    """F-1: ``open(O_CREAT | O_EXCL)`` of one new name by a process through the mount and
    one directly on the storage root at the same moment, 80 times, and by two processes
    through the mount, 80 times: each time exactly one creates the file and the other gets
    ``EEXIST``; the file holds the creator's bytes only."""
    rounds = 80
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    where = world.mountpoint("view")
    disk = world.data
    (disk / "mixed").mkdir()
    (disk / "mounted").mkdir()
    with serving(world.storage, where):
        here = where / "shared" / SPACE / "data"
        mixed = race_creates(
            [(here / "mixed", "M", 0.0), (disk / "mixed", "S", 0.0003)], rounds, flags
        )
        both = race_creates(
            [(here / "mounted", "A", 0.0), (here / "mounted", "B", 0.0002)], rounds, flags
        )
    for directory, outcomes, tags in (
        (disk / "mixed", mixed, "MS"),
        (disk / "mounted", both, "AB"),
    ):
        assert all(len(o) == rounds for o in outcomes), outcomes
        for i, pair in enumerate(zip(*outcomes, strict=True)):
            assert sorted(pair) == ["EEXIST", "ok"], (directory.name, i, pair)
            assert (directory / f"c.{i}").read_text() == tags[pair.index("ok")]


def test_open_o_creat_without_o_excl_through_the_mount_never_fails_with_eexist(world: World):
    """F-1 (the storage root, mounted) and open(2): without ``O_EXCL``, ``open(O_CREAT)``
    opens the file that is there or makes it — ``EEXIST`` is only for ``O_CREAT | O_EXCL``.
    An appender that opens ``O_WRONLY | O_CREAT | O_APPEND`` through the mount (the way an
    event log is opened, S-5) while a process on the storage root makes the same name must
    get a descriptor of that file, round after round (up to 400)."""
    rounds = 400
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    where = world.mountpoint("view")
    disk = world.data
    with serving(world.storage, where):
        here = where / "shared" / SPACE / "data"
        mounted, direct = race_creates(
            [(here, "M", 0.0), (disk, "S", 0.0004)],
            rounds,
            flags,
            until=lambda outcome: "ok" not in outcome[:1],
        )
    assert set(direct) == {"ok"}, Counter(direct)
    assert set(mounted) == {"ok"}, Counter(mounted)


# ------------------------------------------------------------------------------ locks

LOCKER = textwrap.dedent(
    """
    import errno, fcntl, sys
    path, kind = sys.argv[1], sys.argv[2]
    with open(path, "r+") as f:
        try:
            if kind == "flock":
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:
                fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            print("got")
        except OSError as e:
            print(errno.errorcode[e.errno])
    """
)


@pytest.mark.parametrize("kind", ["flock", "fcntl"])
def test_locks_through_the_mount_exclude_within_the_mount_only_as_the_page_says(
    world: World, kind: str
):
    """docs/mount.md *Locks*: a lock (``flock``, or an ``fcntl`` record lock) taken through
    the mount excludes another process asking for it through the same mount, is not seen
    by a process locking the file directly on the storage root (the kernel keeps it for the
    mount), nor does one taken on the storage root exclude the mount's; released when its
    holder closes the file, the next process through the mount gets it."""
    where = world.mountpoint("view")
    (world.data / "lockfile").write_text("x\n")
    here = where / "shared" / SPACE / "data" / "lockfile"
    disk = world.data / "lockfile"

    def take(f) -> None:
        if kind == "flock":
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def other(path: Path) -> str:
        return ok(run_py(LOCKER, path, kind)).strip()

    with serving(world.storage, where):
        with open(here, "r+") as held:
            take(held)
            assert other(here) == "EAGAIN"
            assert other(disk) == "got"  # documented: not seen on the storage root
        assert other(here) == "got"
        with open(disk, "r+") as held:
            take(held)
            assert other(disk) == "EAGAIN"
            assert other(here) == "got"  # documented: the mount does not see it either


# ------------------------------------------------------------- the mount's process killed

WRITER = textwrap.dedent(
    """
    import errno, os, sys
    path, report = sys.argv[1], open(sys.argv[2], "w")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    i = 0
    try:
        while True:
            os.write(fd, b"%06d " % i + b"r" * 4088 + b"\\n")
            print("w", i, file=report, flush=True)
            if i % 4 == 3:
                os.fdatasync(fd)  # F-1: once it returns, records 0..i are on the storage root
                print("s", i, file=report, flush=True)
            i += 1
    except OSError as e:
        print("e", errno.errorcode[e.errno], file=report, flush=True)
    """
)


def record(i: int) -> bytes:
    return b"%06d " % i + b"r" * 4088 + b"\n"


def test_a_file_being_written_when_the_mount_process_is_killed_and_ctx_umount_after(
    world: World,
):
    """F-1 (durability once ``fdatasync`` returns; ``ctx umount`` removes a mount whose
    process was killed, docs/mount.md): a program writes 4 KiB records through the mount
    without pause, ``fdatasync`` after every fourth, when the mount's process is SIGKILLed.
    The program's next call fails with ``ENOTCONN`` (or ``ECONNABORTED`` for the request in
    flight) instead of hanging; the file on the storage root is whole records only — every
    one whose ``fdatasync`` returned, in order, nothing torn or foreign — and nothing else
    was left in the directory; ``ctx umount`` then removes the dead mount (exit 0, the mount
    point an empty directory again), and a new mount there serves the same bytes."""
    where = world.mountpoint("view")
    reports = world.drop("reports")

    def progress() -> list[list[str]]:
        path = reports / "writer"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    with serving(world.storage, where) as mount:
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, where / "shared" / SPACE / "data" / "journal",
             reports / "writer"],
            stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            assert wait_for(lambda: sum(1 for s in progress() if s[0] == "s") >= 8, 30)
            mount.proc.send_signal(signal.SIGKILL)
            mount.proc.wait(timeout=MOUNT_WAIT)
            writer.wait(timeout=30)
        finally:
            if writer.poll() is None:
                os.killpg(writer.pid, signal.SIGKILL)
            writer.communicate(timeout=30)
        said = progress()
        assert said[-1][0] == "e" and said[-1][1] in ("ENOTCONN", "ECONNABORTED"), said[-3:]
        assert mounted_at(where)
        assert errno_of(lambda: os.listdir(where)) == "ENOTCONN"
        removed = ctx_run("umount", where, timeout=30)
        assert removed.rc == 0, removed
        assert not mounted_at(where) and os.listdir(where) == []
    synced = max(int(s[1]) for s in said if s[0] == "s")
    written = max(int(s[1]) for s in said if s[0] == "w")
    assert os.listdir(world.data) == ["journal"]
    data = (world.data / "journal").read_bytes()
    assert len(data) % 4096 == 0, len(data)
    count = len(data) // 4096
    assert synced + 1 <= count <= written + 2, (synced, written, count)
    assert data == b"".join(record(i) for i in range(count))
    with serving(world.storage, where):
        assert (where / "shared" / SPACE / "data" / "journal").read_bytes() == data


# -------------------------------------------------- sizes, holes, mappings and syncfs

SIZES = textwrap.dedent(
    """
    import ctypes, errno, json, mmap, os, sys
    d = sys.argv[1]
    out = {}
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"{d}/sized", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"0123456789" * 100)
    os.ftruncate(fd, 10)             # shrink through the descriptor
    os.truncate(f"{d}/sized", 4096)  # grow by path (setattr with no descriptor)
    os.fsync(fd)
    os.close(fd)
    fd = os.open(f"{d}/sparse", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.pwrite(fd, b"head", 0)
    os.pwrite(fd, b"tail", 64 << 20)  # a 64 MiB hole between
    os.fsync(fd)
    before = os.fstat(fd).st_size
    r = libc.fallocate(fd, 0, ctypes.c_long(0), ctypes.c_long(1 << 20))
    out["fallocate"] = "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
    out["fallocate_size_kept"] = os.fstat(fd).st_size == before
    os.close(fd)
    fd = os.open(f"{d}/prealloc", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.write(fd, b"kept")
    os.posix_fallocate(fd, 0, 3 << 12)  # the C library's fallback where fallocate is refused
    os.close(fd)
    fd = os.open(f"{d}/mapped", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    os.ftruncate(fd, 3 << 12)
    m = mmap.mmap(fd, 3 << 12)
    m[5000:5011] = b"across page"
    m.flush()
    m[0:5] = b"first"
    m.flush(0, 4096)
    out["syncfs"] = "ok" if libc.syncfs(fd) == 0 else errno.errorcode[ctypes.get_errno()]
    os.sync()
    m.close()
    os.close(fd)
    print(json.dumps(out))
    """
)


@needs_strace
def test_truncates_holes_preallocation_and_mapped_writes_through_the_mount(world: World):
    """F-1 (the storage root as it is, durable once synced): through the agent's view, as
    its uid, ``ftruncate`` and ``truncate`` by path set the size on the storage root (zeros
    where it grew); a write 64 MiB past the end leaves a hole there, not 64 MiB of blocks;
    ``fallocate`` either allocates or is refused (``EOPNOTSUPP``) leaving the size alone, and
    ``posix_fallocate`` gives the size asked keeping the bytes written; writes to a shared
    mapping reach the file behind it, each ``msync`` as a sync of that file; ``syncfs`` and
    ``sync`` succeed (the page promises nothing more of them: see the batch test)."""
    world.create_agent()
    where = world.mountpoint("view")
    with (
        serving(world.storage, where, "--as", AGENT) as mount,
        traced_daemon(mount, "fsync,fdatasync,syncfs,sync") as calls,
    ):
        out = json.loads(ok(run_py(SIZES, where / "shared" / SPACE / "data", user=world.user)))
    disk = world.data
    assert (disk / "sized").read_bytes() == b"0123456789" + bytes(4086)
    sparse = (disk / "sparse").stat()
    assert sparse.st_size == (64 << 20) + 4
    assert sparse.st_blocks * 512 < (1 << 20), sparse.st_blocks  # the hole stayed a hole
    with open(disk / "sparse", "rb") as f:
        assert f.read(4) == b"head"
        f.seek(64 << 20)
        assert f.read() == b"tail"
    assert out["fallocate"] in ("ok", "EOPNOTSUPP", "ENOTSUP"), out
    assert out["fallocate_size_kept"], out
    assert (disk / "prealloc").read_bytes() == b"kept" + bytes((3 << 12) - 4)
    mapped = (disk / "mapped").read_bytes()
    assert mapped[5000:5011] == b"across page" and mapped[:5] == b"first"
    assert out["syncfs"] == "ok"
    synced = [(kind, path) for kind, path in events(calls, str(disk))]
    assert ("fsync", "sized") in synced and ("fsync", "sparse") in synced, calls
    assert [path for _, path in synced if path == "mapped"] == ["mapped", "mapped"], calls
    for name in ("sized", "sparse", "prealloc", "mapped"):
        st = (disk / name).stat()
        assert (st.st_uid, st.st_gid) == (world.user.uid, world.user.gid), name


# ------------------------------------------------------------------------------ the queue


CLIENT_CALLS = "fsync,fdatasync,syncfs,linkat,unlinkat,renameat,renameat2,rename"


def ctx_as(
    world: World, as_agent: bool, argv: list[str], *, stdin: str = "", trace: Path | None = None
):
    """``ctx ARGV`` as root or as the agent's uid; under ``strace -f -y`` into ``trace`` when
    given (its syncs and name changes are then what the mount's process was asked)."""
    prefix = []
    if trace is not None:
        prefix = ["strace", "-f", "-qq", "-y", "-s", "4096", "-o", str(trace),
                  "-e", f"trace={CLIENT_CALLS}"]  # fmt: skip
    ids = {}
    if as_agent:
        ids = {"user": world.user.uid, "group": world.user.gid, "extra_groups": [world.user.gid]}
    return subprocess.run(
        [*prefix, *CTX_ARGV, *argv], input=stdin, capture_output=True, text=True,
        env=world.env(as_agent), timeout=60, **ids,
    )  # fmt: skip


VOLATILE = {"created", "claimed_at", "expires_at", "started", "finished"}


def stable(value):
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def queue_tree(queue: Path) -> dict[str, tuple]:
    """Every entry of a queue directory: kind, mode, owner, link count, and content (JSON
    without its timestamps)."""
    tree: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(queue):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            facts = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
            if stat.S_ISREG(st.st_mode):
                raw = path.read_bytes()
                try:
                    content = stable(json.loads(raw))
                except ValueError:
                    content = raw
                facts = (*facts, st.st_nlink, json.dumps(content, sort_keys=True, default=str))
            tree[str(path.relative_to(queue))] = facts
    return tree


def protocol(
    world: World, queue: Path, as_agent: bool, move: str, dead: int, logs: Path | None
) -> list:
    """init, publish, claim and finish, a claim whose holder (pid ``dead``) is gone and
    ``recover``, all with ``--queue QUEUE``: what each said."""
    alive = os.getpid()
    steps: list[tuple[list[str], str]] = [
        (["init"], ""),
        *[(["publish", "--name", n, "-"], json.dumps({**REQUEST, "tag": n})) for n in "ab"],
        (["claim", "--worker", "w1", "--pid", str(alive)], ""),
        (["finish", "a.req.json", "--ok", "-"], '{"answer": 42}'),
        (["claim", "--worker", "w3", "--pid", str(dead)], ""),
        (["recover"], ""),
    ]
    said = []
    for number, (argv, stdin) in enumerate(steps):
        command = ["queue", argv[0], "--queue", str(queue), *argv[1:]]
        trace = None if logs is None else logs / f"client-{number:02d}.strace"
        done = ctx_as(world, as_agent, command, stdin=stdin, trace=trace)
        out = done.stdout.replace(str(queue), "QUEUE")
        said.append((argv[0], done.returncode, out))
        assert done.returncode == 0, (argv, done.stderr)
        if argv[0] == "init":
            with open(queue / "config", "a") as config:
                config.write(f"move={move}\n")
    return said


@needs_strace
@pytest.mark.parametrize(
    ("view", "move"), [("host", "link"), ("agent", "rename")], ids=["host-link", "agent-rename"]
)
def test_the_queue_worked_through_the_mount_leaves_what_it_leaves_on_the_storage_root(
    world: World, view: str, move: str
):
    """F-1 with Q-1..Q-7 and docs/mount.md ("The queue works through the mount (its
    no-replace move is ``link`` + ``unlink``, and ``renameat2`` flags are passed through as
    the same atomic call)") and docs/queue.md (``move=link|rename``): the same protocol —
    init, two publishes, claim and finish, a claim whose holder has exited and ``recover``
    requeueing it — run with ``--queue`` on the storage root and with ``--queue`` through the
    mount (the host's view as root with ``move=link``; ``ctx mount --as coder`` as the
    agent's uid with ``move=rename``) says the same and leaves the same queue on disk: the
    same entries, modes, owners, link counts and contents.  And every sync and name change
    each ``ctx`` made through the mount reached the storage root as the same call on the
    same names in the same order (a link's destination synced before its source is
    unlinked, as Q-7 needs)."""
    as_agent = view == "agent"
    if as_agent:
        world.create_agent()
    where = world.mountpoint("view")
    logs = world.drop("logs")
    direct = world.storage / "shared" / SPACE / "q-direct"
    through = world.storage / "shared" / SPACE / "q-mount"
    gone = subprocess.Popen(["true"])
    gone.wait()
    reference = protocol(world, direct, as_agent, move, gone.pid, None)
    args = ("--as", AGENT) if as_agent else ()
    with serving(world.storage, where, *args) as mount:
        viewed = where / "shared" / SPACE / "q-mount"
        with traced_daemon(mount, CLIENT_CALLS) as daemon:
            worked = protocol(world, viewed, as_agent, move, gone.pid, logs)
    assert worked == reference
    assert queue_tree(through) == queue_tree(direct)
    assert {e[0] for e in events(daemon, str(through))} >= {"fsync", "unlink", "rmdir"}
    asked: list[tuple[str, ...]] = []
    for log in sorted(logs.glob("client-*.strace")):
        asked.extend(events(trace_lines(log), str(viewed)))
    assert events(daemon, str(through)) == asked
    # The strategy the config names, from the first publish on (init moved its config in
    # by the filesystem's default, link on a FUSE mount).
    after_init = [e for log in sorted(logs.glob("client-*.strace"))[1:]
                  for e in events(trace_lines(log), str(viewed))]  # fmt: skip
    kinds = {e[0] for e in after_init}
    if move == "link":
        assert "link" in kinds and not any(k.startswith("rename") for k in kinds), kinds
    else:
        assert "rename:RENAME_NOREPLACE" in kinds and "link" not in kinds, kinds


@needs_strace
def test_a_batch_published_through_the_mount_is_synced_on_disk_before_its_names_move(
    world: World,
):
    """Q-1 and Q-7 ("data files are fsynced before they are renamed into place"), I-2, and
    docs/mount.md ("The queue works through the mount"; durability only through ``fsync``):
    ``ctx queue publish --batch --queue`` on the host's view.  Every request must be durable
    on the storage root before its name appears in ``pending/``: the mount's process must
    have synced each staging file (``fsync``/``fdatasync``) or the whole filesystem
    (``syncfs``/``sync``) before it links or renames it there."""
    where = world.mountpoint("view")
    queue = where / "shared" / SPACE / "queue"
    lines = "".join(json.dumps({**REQUEST, "n": i}) + "\n" for i in range(3))
    with serving(world.storage, where) as mount:
        calls = "fsync,fdatasync,syncfs,sync,linkat,renameat,renameat2,rename"
        with traced_daemon(mount, calls) as daemon:
            done = ctx_as(world, False, ["queue", "publish", "--queue", str(queue), "--batch", "-"],
                          stdin=lines)  # fmt: skip
    assert done.returncode == 0, done.stderr
    jobs = done.stdout.split()
    assert len(jobs) == 3
    disk = world.storage / "shared" / SPACE / "queue"
    assert sorted(os.listdir(disk / "pending")) == sorted(jobs)
    seen = events(daemon, "/")
    for job in jobs:
        moved = [
            n
            for n, e in enumerate(seen)
            if e[0] in ("link", "rename", "rename:RENAME_NOREPLACE")
            and "/" + e[-1] == str(disk / "pending" / job)
        ]
        assert len(moved) == 1, seen
        staged = str(disk / "inbox" / job)
        synced_before = [
            e
            for e in seen[: moved[0]]
            if e[0] in ("sync", "syncfs")
            or (e[0] in ("fsync", "fdatasync") and ("/" + e[1]).startswith(staged))
        ]
        assert synced_before, (job, seen)
