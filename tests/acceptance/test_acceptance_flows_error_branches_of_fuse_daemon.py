"""The error branches of the ``ctx mount`` daemon, reached from outside through real mounts
(SPEC F-1 with T-5, R-2, P-5; docs/mount.md: the opening section, *What each view shows*,
*What the mount promises* — *Names*, *Open files*, *Ownership*, *Permissions and ACLs*,
*Errors of its own* — and the help of ``ctx mount``).

The angle: each refusal the daemon can answer a request with is provoked as a user provokes
it, with states made by hand on the storage root beneath, and the answer is compared with the
one the storage root itself gives the same caller:

* POSIX access ACLs that refuse a caller what the mode bits (the ACL's mask) show it: the
  daemon's own check before it opens, truncates, executes, lists, makes, removes, renames or
  links for the caller — each of those refused with ``EACCES`` as on the storage root, with
  nothing changed; an ACL whose group entry matches without granting, one whose mask is
  empty, root, a file reached through ``/proc/self/fd`` once unlinked, and the agent's view;
* a caller whose groups the daemon cannot read (a mount served from another pid namespace):
  refused only where the answer turns on them;
* the set-group-ID bit of a file a user makes in another group's setgid directory, and the
  set-user-ID bit of an append-only file a user appends to;
* another process's lease on a file: ``EWOULDBLOCK`` for ``O_NONBLOCK``, else a wait in the
  caller's own request while the daemon answers everyone else;
* a daemon short of file descriptors: ``EMFILE`` with nothing mounted at its start, and
  ``EMFILE`` (never a bug's ``EIO``) for the requests it cannot serve once mounted;
* a symbolic link held by an ``O_PATH`` descriptor once the agent's grant is revoked;
* an agent whose label, policy or mount control is unusable when its view is mounted: a view
  that grants nothing, and a warning naming the control.

Every mount is made by the test and unmounted by it, whatever happens; the daemon must never
leave a traceback on its standard error.  Needs root (a mount serving other uids, ACLs naming
another uid) and the test user of tests/support/users.py."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import resource
import shutil
import stat
import struct
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
    CTX_ARGV,
    MOUNT_WAIT,
    ROOT_ENTRIES,
    clean_env,
    ctx_run,
    mounted_at,
    needs_fuse,
    needs_fuse_as_root,
    new_scratch_dir,
    processes_of,
    scratch_top,
    serving,
    snapshot,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = [needs_fuse_as_root, needs_fuse]

SCRATCH = scratch_top(__file__)
AGENT = "coder"
SPACE = "team"
OTHER_UID, OTHER_GID = 4321, 4322  # an owner that is neither root nor the test user
TRACEBACK = "Traceback (most recent call last)"

# The kernel's form of a POSIX access ACL (linux/posix_acl_xattr.h).
ACCESS_ACL = "system.posix_acl_access"
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
NO_ID = 0xFFFFFFFF
R, W, X = 4, 2, 1


# ------------------------------------------------------------------------------ helpers


def acl(*rules: tuple[int, int, int]) -> bytes:
    """An access ACL as the kernel stores it: version 2, then (tag, permissions, id) sorted."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in sorted(rules))


def set_acl(path: Path, owner: tuple[int, int], *rules: tuple[int, int, int]) -> None:
    """``path`` given ``owner`` (uid, gid), then the access ACL of ``rules``, which sets its
    mode bits too (the group bits become the mask)."""
    os.chown(path, *owner)
    try:
        os.setxattr(path, ACCESS_ACL, acl(*rules))
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
            pytest.skip(f"{path}'s filesystem keeps no POSIX ACL")
        raise


def entries(owner: int, user: tuple[int, int] | None, group: int, mask: int, other: int):
    """The entries of an ACL: the owner's, one named user's (``(uid, perms)``), the owning
    group's, the mask and other's."""
    made = [(USER_OBJ, owner, NO_ID), (GROUP_OBJ, group, NO_ID), (MASK, mask, NO_ID)]
    made.append((OTHER, other, NO_ID))
    if user is not None:
        made.append((USER, user[1], user[0]))
    return made


def write(path: Path, text: str, owner: tuple[int, int], mode: int) -> Path:
    path.write_text(text)
    os.chown(path, *owner)
    path.chmod(mode)
    return path


def directory(path: Path, owner: tuple[int, int], mode: int = 0o755) -> Path:
    path.mkdir()
    os.chown(path, *owner)
    path.chmod(mode)
    return path


# What every probe starts with: ``e(NAME, f, ...)`` records "ok" or the errno's name under
# NAME in ``out``, printed as JSON at the end; ``p(...)`` is a path below ``sys.argv[1]``.
PRELUDE = textwrap.dedent(
    """
    import errno, json, os, stat, subprocess, sys
    base = sys.argv[1]
    out = {}
    def p(*names):
        return os.path.join(base, *names)
    def e(name, f, *a, **k):
        try:
            r = f(*a, **k)
        except OSError as x:
            out[name] = errno.errorcode.get(x.errno, str(x.errno))
            return None
        out[name] = "ok"
        return r
    """
)


def probe(user: UnprivilegedUser | None, body: str, base: Path, *args: object) -> dict:
    """What ``PRELUDE + body`` records, run in a new process as ``user`` (root when None)
    with ``base`` as ``sys.argv[1]`` and ``args`` after it."""
    ids = {} if user is None else {"user": user.uid, "group": user.gid, "extra_groups": []}
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n",
         str(base), *map(str, args)],
        capture_output=True, text=True, timeout=60, **ids,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def answer(action: Callable[[], object]) -> str:
    """``ok``, or the errno name of the OSError ``action`` raised."""
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return "ok"


@dataclass
class World:
    """A storage root holding space ``team`` (group: the test user's) and agent ``coder``
    (the test user's uid, ``team`` read-write), with its home; mounted as the host's view
    and as ``coder``'s view."""

    top: Path
    storage: Path
    host: Path
    view: Path
    user: UnprivilegedUser

    @property
    def home(self) -> Path:
        return self.storage / "home" / str(self.user.uid)

    @property
    def data(self) -> Path:
        return self.storage / "shared" / SPACE / "data"

    def through(self, mount: Path, path: Path) -> Path:
        """``path`` (below the storage root) as ``mount`` shows it."""
        return mount / path.relative_to(self.storage)

    def pair(self, name: str, below: Path | None = None) -> tuple[Path, Path, Path]:
        """Two fresh root-owned directories ``NAME/disk`` and ``NAME/mount`` below ``below``
        (the space's ``data/``): the first used directly, the second through the host's view
        (its storage path and its path in the mount)."""
        holder = directory((below or self.data) / name, (0, 0))
        disk = directory(holder / "disk", (0, 0))
        stored = directory(holder / "mount", (0, 0))
        return disk, stored, self.through(self.host, stored)

    def said(self, mount: Path) -> str:
        return mount.with_name(mount.name + ".stderr").read_text()

    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def ctx(self, *args: object, **kw):
        kw.setdefault("env", self.env())
        return ctx_run(*args, **kw)


def unmount_everything_below(top: Path) -> None:
    """What a test mounted below ``top`` and left there (a failure half-way), unmounted."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        where = line.split()[4]
        if where.startswith(str(top) + "/"):
            subprocess.run(["umount", "-l", where], check=False)


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH)
    storage = copy_of_root(_template, top / "storage")
    try:
        made = ctx_run("shared", "create", SPACE, "--group", str(user.gid), "--storage", storage)
        assert made.rc == 0, made
        request = {"name": AGENT, "label": f"{AGENT}_t", "tools": [],
                   "shared": {SPACE: ["read", "write"]}}  # fmt: skip
        made = ctx_run("agent", "create", "--storage", storage, "--user", user.name, "-",
                       input=json.dumps(request))  # fmt: skip
        assert made.rc == 0, made
        directory(storage / "home" / str(user.uid), (user.uid, user.gid))
        host, view = directory(top / "host", (0, 0)), directory(top / "view", (0, 0))
        with serving(storage, host), serving(storage, view, "--as", AGENT):
            yield World(top, storage, host, view, user)
    finally:
        unmount_everything_below(top)
        shutil.rmtree(top, ignore_errors=True)


def assert_no_traceback(world: World, *mounts: Path) -> None:
    """docs/mount.md, *Errors of its own*: a refusal is an errno, never a bug's EIO."""
    for mount in mounts or (world.host, world.view):
        said = world.said(mount)
        assert TRACEBACK not in said and "answered EIO" not in said, said


# --------------------------------------------- ACLs the daemon evaluates for the caller


def acl_stage(base: Path, user: UnprivilegedUser) -> None:
    """Files and directories of root's, in the test user's group, whose ACLs give the user
    (a named user entry) less than their mode bits show it (the mask), and two directories
    of the user's own:

    * ``noread`` (mode 0640): no read for the user;
    * ``nowrite`` (0664): read only;
    * ``noexec`` (0750, a script): read only;
    * ``nolist/`` (0750): search only; its ``inside`` is readable;
    * ``closed/`` (0775): read and search only; holds ``victim`` (0664) and ``sub/``;
    * ``own/`` and ``own2/``: the user's; ``own/`` holds ``mine`` and ``moving/``, a
      directory (0775) whose ACL gives the user read and search only."""
    uid, gid = user.uid, user.gid
    mine, ours = (uid, gid), (0, gid)
    write(base / "noread", "secret\n", ours, 0o640)
    set_acl(base / "noread", ours, *entries(R | W, (uid, 0), R, R, 0))
    write(base / "nowrite", "original\n", ours, 0o664)
    set_acl(base / "nowrite", ours, *entries(R | W, (uid, R), R | W, R | W, R))
    write(base / "noexec", "#!/bin/sh\necho ran\n", ours, 0o750)
    set_acl(base / "noexec", ours, *entries(R | W | X, (uid, R), R | X, R | X, 0))
    nolist = directory(base / "nolist", ours, 0o750)
    write(nolist / "inside", "inside\n", (0, 0), 0o644)
    set_acl(nolist, ours, *entries(R | W | X, (uid, X), R | X, R | X, 0))
    closed = directory(base / "closed", ours, 0o775)
    write(closed / "victim", "victim\n", ours, 0o664)
    directory(closed / "sub", ours, 0o775)
    set_acl(closed, ours, *entries(R | W | X, (uid, R | X), R | W | X, R | W | X, R | X))
    own = directory(base / "own", mine)
    write(own / "mine", "mine\n", mine, 0o644)
    moving = directory(own / "moving", ours, 0o775)
    set_acl(moving, ours, *entries(R | W | X, (uid, R | X), R | W | X, R | W | X, R | X))
    directory(base / "own2", mine)


# Each: what the user does; "op" must be EACCES on the storage root and through the mount.
ACL_REFUSALS = {
    "read a file": 'e("op", lambda: open(p("noread")).read())',
    "open for writing with O_TRUNC": 'e("op", os.open, p("nowrite"), os.O_WRONLY | os.O_TRUNC)',
    "append": 'e("op", os.open, p("nowrite"), os.O_WRONLY | os.O_APPEND)',
    "truncate by name": 'e("op", os.truncate, p("nowrite"), 0)',
    "execute": 'e("op", subprocess.run, [p("noexec")], capture_output=True)',
    "list a directory": 'e("op", os.listdir, p("nolist"))\n'
    'out["inside"] = open(p("nolist", "inside")).read()',
    "create in a directory": 'e("op", os.open, p("closed", "new"), os.O_CREAT | os.O_WRONLY)',
    "mkdir in a directory": 'e("op", os.mkdir, p("closed", "new"))',
    "unlink in a directory": 'e("op", os.unlink, p("closed", "victim"))',
    "rmdir in a directory": 'e("op", os.rmdir, p("closed", "sub"))',
    "rename within a directory": 'e("op", os.rename, p("closed", "victim"), p("closed", "v2"))',
    "rename into a directory": 'e("op", os.rename, p("own", "mine"), p("closed", "mine"))',
    "rename out of a directory": 'e("op", os.rename, p("closed", "victim"), p("own", "v"))',
    "move a directory to another": 'e("op", os.rename, p("own", "moving"), p("own2", "moving"))',
    "link into a directory": 'e("op", os.link, p("own", "mine"), p("closed", "linked"))',
}


@pytest.mark.parametrize("action", list(ACL_REFUSALS))
def test_what_an_acl_refuses_on_the_storage_root_it_refuses_through_the_host_view(world, action):
    """docs/mount.md, *Permissions and ACLs*: "whenever the daemon opens a file or a
    directory (to read, write, truncate or execute it), truncates a file by name, or makes,
    removes, renames or links a name in a directory (which asks write and search of it, and
    write of a directory moved into another), it first evaluates the access ACL … and
    answers EACCES where the storage root would".  The test user, in the owning group of
    root's files whose mode bits (the mask) show it more than its named entry gives, does
    ACTION directly and through the host's view: ``EACCES`` both times, nothing changed on
    either side, and no traceback from the daemon."""
    slug = re.sub(r"\W+", "-", action)
    disk, stored, mounted = world.pair(f"acl-{slug}")
    for base in (disk, stored):
        acl_stage(base, world.user)
    before = snapshot(disk), snapshot(stored)
    on_disk = probe(world.user, ACL_REFUSALS[action], disk)
    through = probe(world.user, ACL_REFUSALS[action], mounted)
    assert on_disk["op"] == "EACCES", on_disk  # the storage root's own verdict
    assert through == on_disk
    assert (snapshot(disk), snapshot(stored)) == before
    assert_no_traceback(world)


GROUP_ENTRY = """
e("write", lambda: open(p("f"), "a").write("more\\n"))
e("read", lambda: open(p("f")).read())
"""


def test_a_group_entry_that_matches_without_granting_refuses_and_never_falls_to_other(world):
    """acl(5), which docs/mount.md says the daemon follows: a caller that matches the owning
    group entry, which grants only read, is refused write even though "other" would grant
    it and the mode bits (0666: the mask shows rw) let the kernel through.  The test user
    gets the same answers through the host's view as on the storage root: read ``ok``,
    write ``EACCES``, the file unchanged."""
    disk, stored, mounted = world.pair("group-entry")
    owner = (0, world.user.gid)
    rules = [*entries(R | W, None, R, R | W, R | W), (GROUP, R | W, OTHER_GID)]
    for base in (disk, stored):
        write(base / "f", "original\n", owner, 0o666)
        set_acl(base / "f", owner, *rules)
    assert stat.S_IMODE((stored / "f").stat().st_mode) == 0o666
    on_disk = probe(world.user, GROUP_ENTRY, disk)
    assert on_disk == {"write": "EACCES", "read": "ok"}
    assert probe(world.user, GROUP_ENTRY, mounted) == on_disk
    assert (stored / "f").read_text() == "original\n"


def test_an_acl_whose_mask_is_empty_leaves_the_verdict_to_the_mode_bits(world):
    """The Linux rule the storage root follows (no ACL is consulted for a file whose group
    bits, the mask, are empty: "other" decides): a file whose ACL names the test user with
    no permission, under an empty mask and ``other::r--``, is read by the user on the
    storage root, and so through the host's view; writing it is refused on both."""
    disk, stored, mounted = world.pair("empty-mask")
    rules = entries(R | W, (world.user.uid, 0), 0, 0, R)
    for base in (disk, stored):
        write(base / "f", "readable\n", (0, OTHER_GID), 0o604)
        set_acl(base / "f", (0, OTHER_GID), *rules)
    assert stat.S_IMODE((stored / "f").stat().st_mode) == 0o604
    on_disk = probe(world.user, GROUP_ENTRY, disk)
    assert on_disk == {"write": "EACCES", "read": "ok"}
    assert probe(world.user, GROUP_ENTRY, mounted) == on_disk
    assert (stored / "f").read_text() == "readable\n"


ROOT_THROUGH_ACLS = """
e("read", lambda: open(p("f")).read())
e("append", lambda: open(p("f"), "a").write("root\\n"))
e("truncate", os.truncate, p("f"), 5)
e("create", lambda: open(p("d", "new"), "w").write("x"))
e("rename", os.rename, p("d", "new"), p("d", "renamed"))
e("unlink", os.unlink, p("d", "renamed"))
e("list", os.listdir, p("d"))
"""


def test_root_is_refused_nothing_by_an_acl_that_refuses_everyone_else(world):
    """docs/mount.md: the daemon answers EACCES "where the storage root would"; root's
    capabilities override ACLs as they override mode bits.  Root reads, appends, truncates,
    and creates, renames and removes in a directory, all of whose ACL entries grant nothing,
    through the host's view exactly as on the storage root, and the files end the same."""
    disk, stored, mounted = world.pair("root-acl")
    nothing = entries(0, (world.user.uid, 0), 0, 0, 0)
    for base in (disk, stored):
        write(base / "f", "written by the host\n", (OTHER_UID, OTHER_GID), 0o600)
        set_acl(base / "f", (OTHER_UID, OTHER_GID), *nothing)
        set_acl(directory(base / "d", (0, 0)), (OTHER_UID, OTHER_GID), *nothing)
    on_disk = probe(None, ROOT_THROUGH_ACLS, disk)
    assert set(on_disk.values()) == {"ok"}, on_disk
    assert probe(None, ROOT_THROUGH_ACLS, mounted) == on_disk
    assert snapshot(stored) == snapshot(disk)


UNLINKED_OPEN = """
fd = os.open(p("own", "held"), os.O_RDONLY)
os.unlink(p("own", "held"))
e("reopen for writing", os.open, f"/proc/self/fd/{fd}", os.O_WRONLY)
e("truncate through /proc", os.truncate, f"/proc/self/fd/{fd}", 0)
out["read"] = os.pread(fd, 100, 0).decode()
e("fstat", os.fstat, fd)
"""


def test_an_unlinked_open_file_keeps_its_acl_when_reopened_or_truncated_through_proc(world):
    """docs/mount.md, *Open files* (a file unlinked while open stays usable through its
    descriptor — reopening ``/proc/PID/fd/N``, ``ftruncate`` — as on a local filesystem)
    with *Permissions and ACLs*: the test user holds root's file open for reading, unlinks
    it (through the host's view, in a directory of its own), then reopens it for writing and
    truncates it through ``/proc/self/fd``: ``EACCES`` for both where its ACL gives the user
    read only, as on the storage root, and its bytes are still there to read."""
    disk, stored, mounted = world.pair("unlinked")
    uid, gid = world.user.uid, world.user.gid
    for base in (disk, stored):
        own = directory(base / "own", (uid, gid))
        write(own / "held", "kept\n", (0, gid), 0o664)
        set_acl(own / "held", (0, gid), *entries(R | W, (uid, R), R | W, R | W, R))
    on_disk = probe(world.user, UNLINKED_OPEN, disk)
    assert on_disk == {
        "reopen for writing": "EACCES",
        "truncate through /proc": "EACCES",
        "read": "kept\n",
        "fstat": "ok",
    }
    assert probe(world.user, UNLINKED_OPEN, mounted) == on_disk
    assert os.listdir(stored / "own") == []
    assert_no_traceback(world)


AGENT_ACL = """
e("write", os.open, p("nowrite"), os.O_WRONLY)
e("truncate", os.truncate, p("nowrite"), 0)
e("create", os.open, p("closed", "new"), os.O_CREAT | os.O_WRONLY)
e("unlink", os.unlink, p("closed", "victim"))
e("read", lambda: open(p("nowrite")).read())
"""


def test_an_acl_in_the_agents_home_refuses_through_its_view_what_it_refuses_on_disk(world):
    """docs/mount.md, *Permissions and ACLs* ("in every view (the host's and an agent's)"):
    in the agent's home, which its view lets it write, a file and a directory of root's
    whose ACLs give the agent's uid read only are refused to it — write, truncate, create,
    unlink ``EACCES`` — through ``ctx mount --as coder`` exactly as on the storage root;
    reading is allowed; nothing changes."""
    disk, stored, _ = world.pair("agent-acl", below=world.home)
    for base in (disk, stored):
        acl_stage(base, world.user)
    before = snapshot(disk), snapshot(stored)
    on_disk = probe(world.user, AGENT_ACL, disk)
    assert on_disk == {
        "write": "EACCES",
        "truncate": "EACCES",
        "create": "EACCES",
        "unlink": "EACCES",
        "read": "ok",
    }
    assert probe(world.user, AGENT_ACL, world.through(world.view, stored)) == on_disk
    assert (snapshot(disk), snapshot(stored)) == before
    assert_no_traceback(world)


# ----------------------------------------- a caller whose groups the daemon cannot read


@contextlib.contextmanager
def served_from_another_pid_namespace(storage: Path, where: Path) -> Iterator[Path]:
    """``ctx mount`` of ``storage`` at ``where`` started in a pid namespace of its own: the
    kernel gives it the callers of this one with pid 0, whose groups it cannot read.
    Unmounted at the end, whatever happened."""
    log = where.with_name(where.name + ".stderr")
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            ["unshare", "--pid", "--fork", "--kill-child", *CTX_ARGV, "mount",
             "--storage", str(storage), str(where)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            env=clean_env(), start_new_session=True,
        )  # fmt: skip
    try:
        if not wait_for(lambda: mounted_at(where) or proc.poll() is not None, MOUNT_WAIT):
            pytest.fail("ctx mount in its own pid namespace did not mount in time")
        if proc.poll() is not None:
            said = log.read_text()
            if "unshare" in said:
                pytest.skip(f"no pid namespace here: {said}")
            pytest.fail(f"ctx mount exited {proc.returncode}: {said}")
        yield log
    finally:
        if mounted_at(where):
            ctx_run("umount", where, timeout=30)
        if mounted_at(where):
            subprocess.run(["umount", "-l", str(where)], check=False)
        try:
            proc.wait(timeout=MOUNT_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def groups_stage(base: Path, user: UnprivilegedUser) -> None:
    """``by-groups``: an ACL whose verdict for the test user turns on its groups (a named
    group entry, the user in none of them: "other" grants read); ``by-name``: one naming the
    user (in the file's group, whose bits, the mask, let the kernel through); ``plain``:
    no ACL; ``own``: the user's, with an ACL."""
    uid = user.uid
    write(base / "by-groups", "by groups\n", (0, OTHER_GID), 0o644)
    set_acl(base / "by-groups", (0, OTHER_GID),
            *entries(R | W, None, R, R, R), (GROUP, R, 4242))  # fmt: skip
    write(base / "by-name", "by name\n", (0, user.gid), 0o640)
    set_acl(base / "by-name", (0, user.gid), *entries(R | W, (uid, R), R, R, 0))
    write(base / "plain", "plain\n", (0, OTHER_GID), 0o644)
    write(base / "own", "own\n", (uid, OTHER_GID), 0o644)
    set_acl(base / "own", (uid, OTHER_GID), *entries(R | W, (4242, R), R, R, 0))


READS = """
for name in ("by-groups", "by-name", "plain", "own"):
    e(name, lambda: open(p(name)).read())
"""


@pytest.fixture
def far_mount(world: World) -> Iterator[Path]:
    """The storage root mounted a second time, from another pid namespace."""
    where = directory(world.top / f"far-{os.getpid()}-{time.monotonic_ns()}", (0, 0))
    try:
        with served_from_another_pid_namespace(world.storage, where) as log:
            yield where
            said = log.read_text()
            assert TRACEBACK not in said and "answered EIO" not in said, said
    finally:
        with contextlib.suppress(OSError):
            where.rmdir()


def test_a_caller_whose_groups_cannot_be_read_is_refused_only_where_they_decide(world, far_mount):
    """docs/mount.md, *Permissions and ACLs*: "Where the answer turns on the caller's
    supplementary groups and they cannot be read (a caller in another pid namespace), the
    mount refuses."  Served from a pid namespace of its own, the mount refuses the test
    user (``EACCES``) a file whose ACL decides by a named group entry, which the storage root
    lets it read as "other"; a file whose ACL names the user, one the user owns and one
    without an ACL are read as on the storage root."""
    disk, stored, _ = world.pair("far")
    for base in (disk, stored):
        groups_stage(base, world.user)
    on_disk = probe(world.user, READS, disk)
    assert on_disk == {"by-groups": "ok", "by-name": "ok", "plain": "ok", "own": "ok"}
    far = probe(world.user, READS, world.through(far_mount, stored))
    assert far == {**on_disk, "by-groups": "EACCES"}
    # The same mount's refusal is its own: the host's view, whose daemon reads the caller's
    # groups, reads every file.
    assert probe(world.user, READS, world.through(world.host, stored)) == on_disk


FAR_CHANGES = """
e("append", lambda: open(p("a"), "a").write("appended\\n"))
e("open with O_TRUNC", os.open, p("b"), os.O_WRONLY | os.O_TRUNC)
e("truncate", os.truncate, p("a"), 0)
"""


def test_changes_refused_to_a_caller_whose_groups_cannot_be_read_change_nothing(world, far_mount):
    """docs/mount.md, *Permissions and ACLs*: through the mount served from another pid
    namespace, the test user's append, ``O_TRUNC`` open and truncate of files whose ACL
    decides by the caller's groups (a named group entry; "other" grants ``rw`` on the
    storage root, where all three succeed) are ``EACCES`` with the files unchanged; root,
    whose capabilities decide whatever its groups, is refused none of them there."""
    disk, stored, _ = world.pair("far-changes")
    rules = [*entries(R | W, None, R | W, R | W, R | W), (GROUP, R | W, 4242)]
    for base in (disk, stored):
        for name in ("a", "b"):
            write(base / name, f"{name}\n", (0, OTHER_GID), 0o666)
            set_acl(base / name, (0, OTHER_GID), *rules)
    mounted = world.through(far_mount, stored)
    before = snapshot(stored)
    far = probe(world.user, FAR_CHANGES, mounted)
    assert far == dict.fromkeys(["append", "open with O_TRUNC", "truncate"], "EACCES")
    assert snapshot(stored) == before
    assert probe(world.user, FAR_CHANGES, disk) == dict.fromkeys(far, "ok")
    assert probe(None, FAR_CHANGES, mounted) == dict.fromkeys(far, "ok")
    assert [(stored / name).read_text() for name in ("a", "b")] == ["", ""]


# --------------------------------------------------------------------- set-ID bits


SET_ID = """
os.umask(0)
for name, mode in (("setgid", 0o2755), ("setuid", 0o4755), ("both", 0o6775)):
    os.close(os.open(p("sg", name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, mode))
os.mkdir(p("sg", "dir"), 0o755)
for name in ("setgid", "setuid", "both", "dir"):
    st = os.stat(p("sg", name))
    out[name] = [oct(stat.S_IMODE(st.st_mode)), st.st_uid, st.st_gid]
"""


def test_a_user_making_set_id_files_in_another_groups_setgid_directory_as_on_disk(world):
    """docs/mount.md, *Ownership* (what a caller creates is its own; its gid the setgid
    directory's) and the opening section (the mode asked for less the caller's umask, as on
    the storage root): in a world-writable setgid directory of a group the test user is not
    in, the user's new files take that group, and the set-group-ID bit it asked for is
    dropped (it is not in the group) while the set-user-ID bit stays; a new directory
    inherits the setgid bit — through the host's view as on the storage root."""
    disk, stored, mounted = world.pair("set-id")
    for base in (disk, stored):
        directory(base / "sg", (OTHER_UID, OTHER_GID), 0o2777)
    on_disk = probe(world.user, SET_ID, disk)
    uid = world.user.uid
    assert on_disk == {
        "setgid": ["0o755", uid, OTHER_GID],
        "setuid": ["0o4755", uid, OTHER_GID],
        "both": ["0o4775", uid, OTHER_GID],
        "dir": ["0o2755", uid, OTHER_GID],
    }
    assert probe(world.user, SET_ID, mounted) == on_disk


APPEND = """
try:
    fd = os.open(p("f"), os.O_WRONLY | os.O_APPEND)
except OSError as x:
    out["open"] = errno.errorcode[x.errno]
else:
    out["open"] = "ok"
    e("write", os.write, fd, b"appended\\n")
    os.close(fd)
out["mode"] = oct(stat.S_IMODE(os.stat(p("f")).st_mode))
"""


def chattr(flag: str, path: Path) -> None:
    if shutil.which("chattr") is None:
        pytest.skip("needs chattr")
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"chattr {flag} does not work here: {done.stderr.strip()}")


def test_an_append_to_an_append_only_set_user_id_file_never_keeps_the_bit(world):
    """docs/mount.md, *Appends*: a write on a descriptor opened with ``O_APPEND`` "clears the
    file's set-user-ID bit … whoever writes".  Another owner's set-user-ID file (04777) made
    append-only (``chattr +a``): on the storage root the test user's append is refused
    (``EPERM``: the kernel cannot clear the bit of an append-only file); through the host's
    view it must be refused likewise, or clear the bit — never add bytes to a file that is
    still set-user-ID."""
    disk, stored, mounted = world.pair("append-suid")
    files = [write(base / "f", "one\n", (OTHER_UID, OTHER_GID), 0o4777) for base in (disk, stored)]
    try:
        for path in files:
            path.chmod(0o4777)
            chattr("+a", path)
        on_disk = probe(world.user, APPEND, disk)
        through = probe(world.user, APPEND, mounted)
        content = (stored / "f").read_text()
    finally:
        for path in files:
            subprocess.run(["chattr", "-a", str(path)], capture_output=True)
    assert on_disk == {"open": "ok", "write": "EPERM", "mode": "0o4777"}
    assert (disk / "f").read_text() == "one\n"
    appended_keeping_the_bit = through.get("write") == "ok" and through["mode"] == "0o4777"
    assert not appended_keeping_the_bit, (through, content)
    assert through == on_disk or through["mode"] == "0o777", through


# -------------------------------------------------------------- leases on a file

HOLDER = """
import fcntl, os, signal, sys
marker = sys.argv[1]
signal.signal(signal.SIGIO, lambda *_: open(marker, "w").close())
held = []
for path in sys.argv[2:]:
    fd = os.open(path, os.O_RDONLY)
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    held.append(fd)
print("held", flush=True)
sys.stdin.readline()
for fd in held:
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
print("released", flush=True)
sys.stdin.readline()
"""


@dataclass
class Lease:
    proc: subprocess.Popen
    marker: Path

    def broken(self) -> bool:
        """Whether the kernel has asked the holder to let go (an open conflicted)."""
        return self.marker.exists()

    def release(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline() == "released\n"


@contextlib.contextmanager
def leased(marker: Path, *paths: Path) -> Iterator[Lease]:
    """A read lease (``F_SETLEASE``) another process holds on each of ``paths`` until
    :meth:`Lease.release`; the process ends with the block."""
    if int(Path("/proc/sys/fs/lease-break-time").read_text()) < 10:
        pytest.skip("lease-break-time is too short here to watch an open wait for a lease")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(marker), *map(str, paths)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout.readline() == "held\n"
        yield Lease(proc, marker)
    finally:
        proc.kill()
        proc.wait()


NONBLOCKING = """
e("open", os.open, p(sys.argv[2]), os.O_WRONLY | os.O_NONBLOCK | os.O_TRUNC)
"""


def test_an_open_o_nonblock_of_a_leased_file_is_ewouldblock_with_nothing_truncated(world):
    """docs/mount.md, *Names*: an open that must wait for a lease another process holds on the
    file is ``EWOULDBLOCK`` "when the caller asked for ``O_NONBLOCK``, as on a local
    filesystem".  The test user's ``open(O_WRONLY | O_NONBLOCK | O_TRUNC)`` of a file under a
    read lease answers ``EAGAIN`` (``EWOULDBLOCK``) directly and through the host's view,
    with neither file truncated; once the lease is let go the same open succeeds."""
    disk, stored, mounted = world.pair("lease-nonblocking")
    for base in (disk, stored):
        write(base / "f", "original\n", (0, 0), 0o666)
    with leased(world.top / f"broken-{os.getpid()}", disk / "f", stored / "f") as lease:
        on_disk = probe(world.user, NONBLOCKING, disk, "f")
        through = probe(world.user, NONBLOCKING, mounted, "f")
        contents = [(base / "f").read_text() for base in (disk, stored)]
        lease.release()
        after = probe(world.user, NONBLOCKING, mounted, "f")
    assert on_disk == {"open": errno.errorcode[errno.EWOULDBLOCK]}
    assert through == on_disk
    assert contents == ["original\n", "original\n"]
    assert after == {"open": "ok"} and (stored / "f").read_text() == ""
    assert_no_traceback(world)


def waiting_in_a_thread(action: Callable[[], object]) -> tuple[threading.Thread, dict]:
    done: dict = {}

    def run() -> None:
        done["answer"] = answer(action)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done


def others_are_answered(world: World, stored: Path) -> float:
    """Seconds the host's view takes to answer a stat, a listing and a read of other names."""
    started = time.monotonic()
    other = world.through(world.host, stored / "other")
    os.stat(other)
    assert other.read_text() == "other\n"
    assert "other" in os.listdir(other.parent)
    assert sorted(os.listdir(world.host)) == sorted(ROOT_ENTRIES)
    return time.monotonic() - started


def blocked_then_released(world: World, name: str, action: Callable[[Path], object]):
    """``action`` on a leased file through the host's view, in a thread: it waits for the
    holder, which the kernel is asked to break; meanwhile the mount answers others.  Then
    the holder lets go.  The file's storage path, and what was seen."""
    _, stored, mounted = world.pair(name)
    write(stored / "f", "original\n", (0, 0), 0o666)
    write(stored / "other", "other\n", (0, 0), 0o644)
    with leased(world.top / f"broken-{name}-{os.getpid()}", stored / "f") as lease:
        thread, done = waiting_in_a_thread(lambda: action(mounted / "f"))
        broke = wait_for(lease.broken, 10)
        time.sleep(0.3)
        waiting = thread.is_alive() and (stored / "f").read_text() == "original\n"
        seconds = others_are_answered(world, stored)
        lease.release()
        thread.join(15)
    return stored / "f", {"broke": broke, "waiting": waiting, "others": seconds, **done}


def test_an_open_waiting_for_a_lease_waits_alone_while_the_mount_answers_others(world):
    """docs/mount.md, *Names*: "an open that must wait for a lease another process holds on
    the file … waits in the caller's own request, as it would on the storage root …, while
    the daemon goes on answering everyone else".  ``open(O_WRONLY | O_TRUNC)`` of a leased
    file through the host's view waits (nothing truncated) until the holder lets go, then
    succeeds; a stat, a read and listings of other names meanwhile are answered at once."""

    def rewrite(path: Path) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, b"rewritten\n")
        finally:
            os.close(fd)

    path, seen = blocked_then_released(world, "lease-open", rewrite)
    assert seen["broke"] and seen["waiting"], seen
    assert seen["others"] < 2.0, seen
    assert seen.get("answer") == "ok", seen
    assert path.read_text() == "rewritten\n"
    assert_no_traceback(world)


def test_a_truncate_by_name_of_a_leased_file_waits_for_the_holder_then_truncates(world):
    """docs/mount.md (*Names*: a lease is waited for in the caller's own request; the daemon
    truncates a file by name by opening it): ``truncate(path, 3)`` of a leased file through
    the host's view waits, the file untouched and the mount answering others meanwhile,
    and truncates it once the holder lets go."""
    path, seen = blocked_then_released(world, "lease-truncate", lambda p: os.truncate(p, 3))
    assert seen["broke"] and seen["waiting"], seen
    assert seen["others"] < 2.0, seen
    assert seen.get("answer") == "ok", seen
    assert path.read_text() == "ori"
    assert_no_traceback(world)


# ------------------------------------------------------------- the daemon's own start


@contextlib.contextmanager
def started_with(world: World, where: Path, limit: int) -> Iterator[tuple[subprocess.Popen, Path]]:
    """``ctx mount`` of the world's root at ``where`` started with ``limit`` open files allowed
    (soft and hard, as ``ulimit -n`` sets them), once it has mounted or ended (its standard
    error kept in a file); unmounted and ended at the end, whatever happened."""
    log = where.with_name(f"{where.name}.{limit}.stderr")
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [*CTX_ARGV, "mount", "--storage", str(world.storage), str(where)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            env=clean_env(), start_new_session=True,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)),
        )  # fmt: skip
    try:
        ended_or_mounted = wait_for(lambda: proc.poll() is not None or mounted_at(where), 15)
        assert ended_or_mounted, f"ctx mount with {limit} descriptors neither mounted nor ended"
        if proc.poll() is None:
            time.sleep(0.3)  # one that mounts and then fails, ends now
        yield proc, log
    finally:
        if mounted_at(where):
            ctx_run("umount", where, timeout=30)
        if mounted_at(where):
            subprocess.run(["umount", "-l", str(where)], check=False)
        try:
            proc.wait(timeout=MOUNT_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_a_mount_short_of_descriptors_is_emfile_with_nothing_mounted_or_left_running(world):
    """docs/mount.md ("a failure to mount is an error naming libfuse's reason … with
    nothing mounted"): ``ctx mount`` started with very few open files allowed (``ulimit -n``
    of 5 to 9) exits 1 with one ``ctx: EMFILE:`` line saying to raise ``ulimit -n`` — no
    traceback, nothing left mounted once it has ended (one that mounted first unmounts),
    no process left — and with an ordinary limit it mounts and serves."""
    where = directory(world.top / f"short-{os.getpid()}", (0, 0))
    refusals = []
    for limit in range(5, 10):
        with started_with(world, where, limit) as (proc, log):
            if proc.poll() is not None:
                refusals.append((limit, proc.returncode, log.read_text()))
                assert not mounted_at(where) and processes_of(where) == [], limit
    assert refusals, "5 to 9 descriptors were enough to mount"
    for limit, rc, err in refusals:
        lines = err.splitlines()
        assert rc == 1 and len(lines) == 1, (limit, rc, err)
        assert lines[0].startswith("ctx: EMFILE: ") and "ulimit -n" in lines[0], (limit, err)
    with started_with(world, where, 256) as (proc, log):
        assert proc.poll() is None, log.read_text()
        assert sorted(os.listdir(where)) == sorted(ROOT_ENTRIES)
    assert proc.returncode == 0 and log.read_text() == ""
    assert os.listdir(where) == []


REQUESTS = """
e("stat", os.stat, p("tool", "tsh.d", "config"))
e("list", os.listdir, p("tool"))
e("read", lambda: open(p("tool", "tsh.d", "config")).read())
"""


def test_a_mount_left_without_descriptors_answers_emfile_and_never_a_bugs_eio(world):
    """docs/mount.md, *Errors of its own* (EIO with the traceback is the answer to a request
    the daemon fails "because of an error of its own (a bug)"), and F-1: ``ctx mount``
    started with a ``ulimit -n`` that lets it mount but leaves it few or no descriptors
    answers a stat, a listing and a read through the mount each either as the storage root
    would or with ``EMFILE`` — a shortage of descriptors is no bug of the daemon's, and the
    same daemon answers it ``EMFILE`` at other limits — never ``EIO``, and writes no
    traceback; ``ctx umount`` then ends it with exit 0."""
    where = directory(world.top / f"starved-{os.getpid()}", (0, 0))
    answers, said, exits = {}, {}, {}
    # From a limit too low to mount, up to the first that serves all three.
    for limit in range(8, 25):
        with started_with(world, where, limit) as (proc, log):
            if proc.poll() is None:
                answers[limit] = probe(None, REQUESTS, where)
        said[limit], exits[limit] = log.read_text(), proc.returncode
        if set(answers.get(limit, {}).values()) == {"ok"}:
            break
    starved = {limit: seen for limit, seen in answers.items() if seen != dict.fromkeys(seen, "ok")}
    assert starved, answers
    for limit, seen in starved.items():
        assert set(seen.values()) <= {"ok", "EMFILE"}, (limit, seen)
        assert TRACEBACK not in said[limit] and exits[limit] == 0, (limit, said[limit])


# ----------------------------------------------- what a revocation leaves reachable

HOLDER_OF_A_LINK = """
import errno, json, os, sys
def a(f):
    try:
        return f()
    except OSError as x:
        return errno.errorcode[x.errno]
link = sys.argv[1]
fd = os.open(link, os.O_PATH | os.O_NOFOLLOW)
before = {"readlink": a(lambda: os.readlink("", dir_fd=fd)), "name": a(lambda: os.readlink(link))}
print(json.dumps(before), flush=True)
sys.stdin.readline()
after = {
    "readlink": a(lambda: os.readlink("", dir_fd=fd)),
    "fstat": a(lambda: os.fstat(fd) and "ok"),
    "name": a(lambda: os.readlink(link)),
}
print(json.dumps(after), flush=True)
"""


def test_a_link_held_by_an_o_path_descriptor_tells_nothing_once_its_space_is_hidden(world):
    """docs/mount.md, *Open files*: "What opens nothing by itself is no way around the
    revocation: an ``O_PATH`` descriptor … is ENOENT …, as the name is", and F-1 (reads
    through the view are checked with the same chain).  The agent's uid holds an ``O_PATH``
    descriptor of a symbolic link in space ``team`` (reading its target works); the host
    removes ``shared:team read`` from the agent's policy; a second and a half later the name
    and ``fstat`` of the descriptor are ``ENOENT``, and ``readlinkat(fd, "")`` must be too,
    not the link's target."""
    agent = "linker"
    request = {"name": agent, "label": f"{agent}_t", "tools": [], "shared": {SPACE: ["read"]}}
    made = world.ctx("agent", "create", "--user", world.user.name, "-", input=json.dumps(request))
    assert made.rc == 0, made
    holder = directory(world.data / "links", (0, world.user.gid), 0o755)
    os.symlink("the-target-text", holder / "ln")
    policy = world.storage / "agent" / f"{agent}.d" / "policy"
    granted = policy.read_text()
    assert f"allow {agent}_t shared:{SPACE} read\n" in granted
    where = directory(world.top / f"linker-{os.getpid()}", (0, 0))
    with serving(world.storage, where, "--as", agent) as mount:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER_OF_A_LINK, str(world.through(where, holder / "ln"))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            user=world.user.uid, group=world.user.gid, extra_groups=[],
        )  # fmt: skip
        try:
            before = json.loads(proc.stdout.readline() or "{}")
            revoked = granted.replace(f"allow {agent}_t shared:{SPACE} read\n", "")
            temp = policy.with_name("policy.new")
            temp.write_text(revoked)
            temp.chmod(0o644)
            temp.rename(policy)
            time.sleep(1.5)
            out, err = proc.communicate("\n", timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        said = mount.said()
    assert before == {"readlink": "the-target-text", "name": "the-target-text"}, err
    after = json.loads(out)
    assert after["name"] == "ENOENT" and after["fstat"] == "ENOENT", after
    assert TRACEBACK not in said
    assert after["readlink"] == "ENOENT", after


# -------------------------------------------------- an agent's unusable controls at mount


DAMAGES = {
    "a policy with a glob": ("policy", "policy:"),
    "a policy the agent's uid owns": ("policy", "policy is not host-owned"),
    "a label that is no name": ("label", "label is invalid"),
    "a mount control that is no JSON": ("mount", "mount is invalid"),
}


def damage(world: World, agent: str, what: str) -> None:
    controls = world.storage / "agent" / f"{agent}.d"
    if what == "a policy with a glob":
        with (controls / "policy").open("a") as policy:
            policy.write(f"allow {agent}_t agent:* create\n")
    elif what == "a policy the agent's uid owns":
        os.chown(controls / "policy", world.user.uid, world.user.gid)
    elif what == "a label that is no name":
        (controls / "label").write_text("not a label!\n")
    else:
        (controls / "mount").write_text("garbage\n")


@pytest.mark.parametrize("what", list(DAMAGES))
def test_a_view_of_an_agent_with_an_unusable_control_grants_nothing_and_names_it(world, what):
    """docs/mount.md, *What each view shows* ("A malformed label, policy or mount control
    counts as empty, as it does for the runner"; "nothing but bin/ and tool/tsh.d/ when its
    policy grants no mount of the storage root") and the help of ``ctx mount``: ``ctx mount
    --as A`` of an agent whose control is WHAT mounts, says on its standard error which
    control of A counts as empty and why, and shows the six root entries with nothing in
    them but ``bin/`` and ``tool/tsh.d``; nothing is written to the agent's controls."""
    control, reason = DAMAGES[what]
    agent = "warned-" + re.sub(r"\W+", "-", what).strip("-")[:40]
    request = {"name": agent, "label": f"{agent}_t", "tools": [], "shared": {SPACE: ["read"]}}
    made = world.ctx("agent", "create", "--user", world.user.name, "-", input=json.dumps(request))
    assert made.rc == 0, made
    damage(world, agent, what)
    controls = world.storage / "agent" / f"{agent}.d"
    before = snapshot(controls)
    where = directory(world.top / f"warned-{control}-{os.getpid()}-{len(what)}", (0, 0))
    with serving(world.storage, where, "--as", agent) as mount:
        shown = {entry: sorted(os.listdir(where / entry)) for entry in sorted(os.listdir(where))}
        said = mount.said()
    assert sorted(shown) == sorted(ROOT_ENTRIES)
    assert shown["tool"] == ["tsh.d"] and shown["bin"] == sorted(os.listdir(world.storage / "bin"))
    assert all(shown[entry] == [] for entry in ("agent", "home", "model", "shared")), shown
    warning = f"ctx mount: warning: agent {agent}'s view grants as if this control were empty: "
    lines = [line for line in said.splitlines() if line.startswith(warning)]
    assert len(lines) == 1, said
    assert lines[0].startswith(f"{warning}agent/{agent}.d/{control}") and reason in lines[0]
    assert TRACEBACK not in said
    assert snapshot(controls) == before
    assert not mounted_at(where)


def test_the_module_mounts_were_never_answered_with_a_bugs_eio(world):
    """docs/mount.md, *Errors of its own*: a request the daemon fails on by a bug is EIO
    with a traceback on its standard error.  After the refusals of this file (whichever ran
    first), neither the host's view nor the agent's view has written one, and both still
    serve: the root's six entries in the host's, the agent's own entry in its view."""
    assert_no_traceback(world)
    assert sorted(os.listdir(world.host)) == sorted(ROOT_ENTRIES)
    assert sorted(os.listdir(world.view / "agent")) == [AGENT, f"{AGENT}.d"]
    assert stat.S_ISDIR(os.stat(world.through(world.view, world.home)).st_mode)
    fd = os.open(world.through(world.host, world.data), os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        os.fsync(fd)
    finally:
        os.close(fd)
