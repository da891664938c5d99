"""The error branches of what a ``ctx mount`` shows, the host's view and an agent's view (SPEC
F-1 with T-5, R-2, P-5; docs/mount.md: the opening section, *What each view shows*, *What
the mount promises* — *Names*, *Listings*, *Open files* — and the help of ``ctx mount`` and
``ctx umount``), reached from outside as a user reaches them.

The angle: each refusal a view answers with, and each failure it turns into an answer, met
through real mounts by the programs of three callers — root, the agent's own uid and a
second real user who is neither — on every kind of entry of the root ABI, and while entries
are changed on the storage root underneath:

* an agent's view and the host's view, entry kind by entry kind and operation by operation
  (list, stat, read, create, mkdir, rmdir, unlink, rename, ``RENAME_WHITEOUT``, link,
  symlink, mkfifo, mknod, chmod, xattrs, statvfs): a name the view hides is ``ENOENT``, a
  change it refuses ``EACCES``, a root entry removed or moved ``EPERM``, what the mount does
  not provide ``ENOSYS``/``EOPNOTSUPP``, and the kernel's own mode-bit answer comes first
  for a caller the mode bits refuse;
* a directory listed through the mount while it is moved or replaced on the storage root
  (or through another mount of it): every entry once, or an error — never a listing that
  quietly ends early or goes on with another directory's entries;
* a name swapped on the storage root, under the kernel's entry, for a socket, a FIFO, a
  directory or a symbolic link: each call answers as on the storage root; a space swapped
  for a link to a space the agent may not see, under its working directory: no way in;
* entries the host left by hand beside the objects (an executable without controls, a
  provider or a space that is a link or a file, a space closed to the agent's uid), each
  granted by the agent's policy: hidden, never an error of the daemon's own;
* an agent's view emptied while mounted (its entry removed or made a link, its identity
  removed or half-written, the root moved aside, a root link pointed at another root): one
  warning naming what is at fault, on one line whatever the root's path holds, every name
  ``ENOENT``, descriptors opened before still usable, one note once repaired;
* a root entry missing on disk, foreign entries beside the six, and ``ctx umount`` without a
  MOUNTPOINT while two mounts are up.

Every mount is made by the test and unmounted by it, whatever happens.  Needs root (a mount
serving other uids) and the test users of tests/support/users.py."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    ROOT_ENTRIES,
    clean_env,
    ctx_run,
    mounted_at,
    needs_fuse,
    needs_fuse_as_root,
    new_scratch_dir,
    scratch_top,
    serving,
    snapshot,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, find_or_create_user, run_as, users_named

pytestmark = [needs_fuse_as_root, needs_fuse]

SCRATCH = scratch_top(__file__)
AGENT, LABEL = "coder", "coder_t"
SPACE, READ_ONLY, HIDDEN = "team", "ro", "secret"
OUTSIDER = "ctxfv-o"  # a second real user: neither root nor the agent's uid
TRACEBACK = "Traceback (most recent call last)"
# The mount keeps an answer half a second after it read the controls, the kernel half a
# second more (docs/mount.md): a change shows within a second; waits allow twice that.
WITHIN = 2.5
LISTED = 2000  # entries of a listed directory: more than one getdents(2) takes
# Python names errno 95 ENOTSUP, its other name.
EOPNOTSUPP = errno.errorcode[errno.EOPNOTSUPP]


# ------------------------------------------------------------------------------ helpers


def directory(path: Path, owner: tuple[int, int] = (0, 0), mode: int = 0o755) -> Path:
    path.mkdir()
    os.chown(path, *owner)
    path.chmod(mode)
    return path


def owned_file(path: Path, text: str, owner: tuple[int, int], mode: int = 0o644) -> Path:
    path.write_text(text)
    os.chown(path, *owner)
    path.chmod(mode)
    return path


def answer(action) -> str:
    """``ok``, or the errno name of the OSError ``action`` raised."""
    try:
        action()
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
    return "ok"


# What every probe starts with: ``e(NAME, f, ...)`` records under NAME the list ``f``
# returned, "ok", or the errno's name; ``p(...)`` is a path below ``sys.argv[1]``.
PRELUDE = textwrap.dedent(
    """
    import ctypes, errno, json, os, sys
    base = sys.argv[1]
    out = {}
    os.umask(0o022)
    libc = ctypes.CDLL(None, use_errno=True)
    def p(*names):
        return os.path.join(base, *names)
    def e(name, f, *a, **k):
        try:
            r = f(*a, **k)
        except OSError as x:
            out[name] = errno.errorcode.get(x.errno, str(x.errno))
            return None
        out[name] = r if isinstance(r, list) else "ok"
        return r
    def listing(path):
        return sorted(os.listdir(path))
    def text(path):
        with open(path) as f:
            return f.read()
    def opened(path, flags, mode=0o644):
        os.close(os.open(path, flags, mode))
    def renameat2(old, new, flags):
        if libc.renameat2(-100, os.fsencode(old), -100, os.fsencode(new), flags) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
    CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    APPEND = os.O_WRONLY | os.O_APPEND
    """
)


def probe(user: UnprivilegedUser | None, body: str, base: Path, *args: object) -> dict:
    """What ``PRELUDE + body`` records, run in a new process as ``user`` (root when None,
    the user's own groups otherwise) with ``base`` as ``sys.argv[1]`` and ``args`` after."""
    ids = {}
    if user is not None:
        ids = {"user": user.uid, "group": user.gid, "extra_groups": user.groups}
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n",
         str(base), *map(str, args)],
        capture_output=True, text=True, timeout=60, **ids,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def unmount_everything_below(top: Path) -> None:
    """What a test mounted below ``top`` and left there (a failure half-way), unmounted."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        where = line.split()[4]
        if where.startswith(str(top) + "/"):
            subprocess.run(["umount", "-l", where], check=False)


def ctx(storage: Path, *args: object, **kw):
    kw.setdefault("env", clean_env(CTX_STORAGE=str(storage)))
    return ctx_run(*args, **kw)


def make_agent(storage: Path, user: UnprivilegedUser, request: dict) -> None:
    made = ctx(storage, "agent", "create", "--user", user.name, "-", input=json.dumps(request))
    assert made.rc == 0, made


def root_with_agent(template: Path, storage: Path, user: UnprivilegedUser) -> Path:
    """A copy of the bootstrapped root at ``storage`` holding agent ``coder`` (``user``'s
    uid, no grant but its mount of the root) and its home with a file ``h``."""
    copy_of_root(template, storage)
    make_agent(storage, user, {"name": AGENT, "label": LABEL, "tools": []})
    home = directory(storage / "home" / str(user.uid), (user.uid, user.gid))
    owned_file(home / "h", "home\n", (user.uid, user.gid))
    return storage


def warnings_in(said: str, kind: str) -> list[str]:
    return [line for line in said.splitlines() if line.startswith(f"ctx mount: {kind}: ")]


def assert_no_traceback(*said: str) -> None:
    for text in said:
        assert TRACEBACK not in text and "answered EIO" not in text, text


@dataclass
class World:
    """A storage root holding spaces ``team`` (agent ``coder`` may read and write it),
    ``ro`` (it may only read it) and ``secret`` (not granted), each of the test user's
    group; agent ``coder`` (the test user's uid), granted ``fs.read`` in both layers and
    model ``local/m1``; agent ``other``; the agent's home.  Mounted as the host's view and
    as ``coder``'s view."""

    top: Path
    storage: Path
    host: Path
    view: Path
    user: UnprivilegedUser
    other: UnprivilegedUser

    @property
    def home(self) -> Path:
        return self.storage / "home" / str(self.user.uid)

    def data(self, space: str = SPACE) -> Path:
        return self.storage / "shared" / space / "data"

    def through(self, mount: Path, path: Path) -> Path:
        return mount / path.relative_to(self.storage)

    def said(self, mount: Path) -> str:
        return mount.with_name(mount.name + ".stderr").read_text()

    @property
    def mine(self) -> tuple[int, int]:
        return self.user.uid, self.user.gid


def build(storage: Path, user: UnprivilegedUser) -> None:
    for space in (SPACE, READ_ONLY, HIDDEN):
        made = ctx(storage, "shared", "create", space, "--group", str(user.gid))
        assert made.rc == 0, made
    request = {"name": AGENT, "label": LABEL, "tools": ["fs.read"], "model": ["local/m1"],
               "shared": {SPACE: ["read", "write"], READ_ONLY: ["read"]}}  # fmt: skip
    make_agent(storage, user, request)
    make_agent(storage, user, {"name": "other", "label": "other_t", "tools": []})
    with (storage / "tool" / "fs.read.d" / "policy").open("a") as policy:
        policy.write(f"allow {LABEL} tool:fs.read execute\n")
    provider = directory(storage / "model" / "local")
    for model in ("m1", "m2"):
        owned_file(provider / model, f"{model}\n", (0, 0))
        directory(provider / f"{model}.d")
        rule = f"allow {LABEL} model:local/{model} use\n"
        owned_file(provider / f"{model}.d" / "policy", rule, (0, 0))
    mine = (user.uid, user.gid)
    home = directory(storage / "home" / str(user.uid), mine)
    owned_file(home / "h", "home\n", mine)
    for space in (SPACE, READ_ONLY, HIDDEN):
        owned_file(storage / "shared" / space / "data" / "f", f"{space}\n", mine, 0o664)


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    user = find_or_create_user()
    (other,) = users_named(OUTSIDER)
    top = new_scratch_dir(SCRATCH)
    storage = copy_of_root(_template, top / "storage")
    try:
        build(storage, user)
        host, view = directory(top / "host"), directory(top / "view")
        with serving(storage, host), serving(storage, view, "--as", AGENT):
            yield World(top, storage, host, view, user, other)
    finally:
        unmount_everything_below(top)
        shutil.rmtree(top, ignore_errors=True)


@dataclass
class Lone:
    """A directory of a test's own (every uid may search it), the test user, and the
    suite's bootstrapped root to copy, for a test that moves or damages a root of its own."""

    top: Path
    user: UnprivilegedUser
    template: Path

    def root(self, name: str = "storage") -> Path:
        return root_with_agent(self.template, self.top / name, self.user)


@pytest.fixture
def lone(_template: Path) -> Iterator[Lone]:
    """A :class:`Lone`; whatever was mounted below it unmounted, and it removed, at the end."""
    top = new_scratch_dir(SCRATCH, "lone-")
    try:
        yield Lone(top, find_or_create_user(), _template)
    finally:
        unmount_everything_below(top)
        shutil.rmtree(top, ignore_errors=True)


def caller_of(world: World, who: str) -> UnprivilegedUser | None:
    return {"root": None, "agent": world.user, "outsider": world.other}[who]


# ------------------------------------------------- an agent's view, entry kind by entry kind

AGENT_VIEW_CALLS = """
U, C = sys.argv[2], sys.argv[3]
home = p("home", U)
new = lambda *names: p(*names, "new-" + C)
e("list the root", listing, p())
e("list tool/", listing, p("tool"))
e("list agent/", listing, p("agent"))
e("list home/", listing, p("home"))
e("list shared/", listing, p("shared"))
e("list model/", listing, p("model"))
e("list a provider", listing, p("model", "local"))
e("stat a tool not granted", os.stat, p("tool", "shell.exec"))
e("stat another agent's policy", os.stat, p("agent", "other.d", "policy"))
e("stat a file of a space not granted", os.stat, p("shared", "secret", "data", "f"))
e("stat a model not granted", os.stat, p("model", "local", "m2"))
e("read its own policy", text, p("agent", "coder.d", "policy"))
e("read the manual", text, p("shared", "cortexfs-docs", "README.md"))
e("read a read-only space's file", text, p("shared", "ro", "data", "f"))
e("statvfs", os.statvfs, p())
e("getxattr of the root", os.getxattr, p(), "user.note")
e("mkdir at the root", os.mkdir, p("x-" + C))
e("rmdir bin/", os.rmdir, p("bin"))
e("rename model/ into the home", os.rename, p("model"), os.path.join(home, "model-" + C))
e("append to bin/tsh", opened, p("bin", "tsh"), APPEND)
e("append to a tool's policy", opened, p("tool", "fs.read.d", "policy"), APPEND)
e("append to its own policy", opened, p("agent", "coder.d", "policy"), APPEND)
e("create in tool/", opened, new("tool"), CREATE)
e("create over a tool not granted", opened, p("tool", "shell.exec"), os.O_WRONLY | os.O_CREAT)
e("create in its home", opened, new("home", U), CREATE)
e("unlink in its home", os.unlink, os.path.join(home, "victim-" + C))
e("chmod of its home itself", os.chmod, home, 0o755)
e("create in a writable space", opened, new("shared", "team", "data"), CREATE)
e("append in a writable space", opened, p("shared", "team", "data", "f"), APPEND)
e("create in a writable space's tool/", opened, new("shared", "team", "tool"), CREATE)
e("create in a read-only space", opened, new("shared", "ro", "data"), CREATE)
e("append in a read-only space", opened, p("shared", "ro", "data", "f"), APPEND)
e("create in the manual", opened, new("shared", "cortexfs-docs"), CREATE)
e("mkdir in a provider", os.mkdir, new("model", "local"))
e("link from a read-only space to a writable one", os.link,
  p("shared", "ro", "data", "f"), p("shared", "team", "data", "link-" + C))
e("rename onto a tool not granted", os.rename,
  os.path.join(home, "mover-" + C), p("tool", "shell.exec"))
e("symlink in its home", os.symlink, "target", os.path.join(home, "symlink-" + C))
e("mkfifo in its home", os.mkfifo, os.path.join(home, "fifo-" + C))
e("RENAME_WHITEOUT in its home", renameat2,
  os.path.join(home, "white-" + C), os.path.join(home, "whiter-" + C), 4)
e("setxattr in its home", os.setxattr, os.path.join(home, "h"), "user.note", b"1")
"""

SHOWN = {
    "list the root": sorted(ROOT_ENTRIES),
    "list tool/": ["fs.read", "fs.read.d", "tsh.d"],
    "list agent/": [AGENT, f"{AGENT}.d"],
    "list shared/": ["cortexfs-docs", READ_ONLY, SPACE],
    "list model/": ["local"],
    "list a provider": ["m1", "m1.d"],
    "stat a tool not granted": "ENOENT",
    "stat another agent's policy": "ENOENT",
    "stat a file of a space not granted": "ENOENT",
    "stat a model not granted": "ENOENT",
    "statvfs": "ok",
    "getxattr of the root": EOPNOTSUPP,
}
# What the view itself decides, for a caller the mode bits let through (root): EACCES for a
# change it refuses, EPERM for a root entry, ENOSYS/EOPNOTSUPP/EINVAL for what it lacks.
VIEW_ANSWERS = {
    "read its own policy": "ok",
    "read the manual": "ok",
    "read a read-only space's file": "ok",
    "mkdir at the root": "EACCES",
    "rmdir bin/": "EPERM",
    "rename model/ into the home": "EPERM",
    "append to bin/tsh": "EACCES",
    "append to a tool's policy": "EACCES",
    "append to its own policy": "EACCES",
    "create in tool/": "EACCES",
    "create over a tool not granted": "EACCES",
    "create in its home": "ok",
    "unlink in its home": "ok",
    "chmod of its home itself": "EACCES",
    "create in a writable space": "ok",
    "append in a writable space": "ok",
    "create in a writable space's tool/": "EACCES",
    "create in a read-only space": "EACCES",
    "append in a read-only space": "EACCES",
    "create in the manual": "EACCES",
    "mkdir in a provider": "EACCES",
    "link from a read-only space to a writable one": "EACCES",
    "rename onto a tool not granted": "EACCES",
    "symlink in its home": "ENOSYS",
    "mkfifo in its home": "ENOSYS",
    "RENAME_WHITEOUT in its home": "EINVAL",
    "setxattr in its home": EOPNOTSUPP,
}
# The agent's uid: the kernel's mode-bit check comes first (docs/mount.md: "In an agent's
# view the kernel checks the mode bits first").
AS_THE_AGENT = {
    **VIEW_ANSWERS,
    "rmdir bin/": "EACCES",
    "rename model/ into the home": "EACCES",
}
# A second user, whom the modes would let read the agent's home (0755): the view serves the
# agent and whoever mounted it, nobody else (P-5 step 1, docs/mount.md), so each call the
# kernel passes on is EACCES before any name is looked at.  But for what the kernel answers
# itself: the root's extended attributes, which the daemon does not keep, and a chmod by a
# uid that owns nothing, refused EPERM while the kernel keeps the home's entry from a caller
# served (half a second).
NOT_SERVED_BUT = {
    "getxattr of the root": {EOPNOTSUPP},
    "chmod of its home itself": {"EACCES", "EPERM"},
}
EXPECTED_IN_THE_AGENTS_VIEW = {
    "root": VIEW_ANSWERS,
    "agent": AS_THE_AGENT,
    "outsider": {},
}


@pytest.mark.parametrize("who", list(EXPECTED_IN_THE_AGENTS_VIEW))
def test_each_kind_of_entry_in_the_agents_view_answers_each_caller_as_the_docs_say(world, who):
    """docs/mount.md, *What each view shows* (the table; "a name it may not see is ENOENT, a
    change it may not make is EACCES"; root entries ``EPERM``, "In an agent's view the kernel
    checks the mode bits first"; *Not provided*: links and device nodes ``ENOSYS``, no
    extended attributes, ``RENAME_WHITEOUT`` ``EINVAL``) and the help of ``ctx mount``: WHO
    (root, the agent's uid, a second real user) lists, reads and changes every kind of entry
    of ``coder``'s view — ``bin/``, granted and ungranted tools, its own and another agent's
    controls, its home, a writable, a read-only and an ungranted space, a space's ``tool/``,
    the manual bundle, granted and ungranted models — and gets the view's answer where the
    mode bits let it through, the kernel's where they do not; every refused change leaves the
    storage root as it was, every allowed one lands there, owned by the caller."""
    caller = caller_of(world, who)
    tag = f"{who}-{os.getpid()}"
    for name in ("victim", "mover", "white"):
        owned_file(world.home / f"{name}-{tag}", "v\n", world.mine)
    before = snapshot(world.storage)
    seen = probe(caller, AGENT_VIEW_CALLS, world.view, world.user.uid, tag)
    after = snapshot(world.storage)
    if who == "outsider":
        assert all(got in NOT_SERVED_BUT.get(k, {"EACCES"}) for k, got in seen.items()), seen
    else:
        assert {k: seen[k] for k in SHOWN} == SHOWN, seen
    expected = EXPECTED_IN_THE_AGENTS_VIEW[who]
    assert {k: seen[k] for k in expected} == expected, seen
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    home = str(world.home.relative_to(world.storage))
    data = f"shared/{SPACE}/data"
    made = {f"{home}/new-{tag}", f"{data}/new-{tag}"}
    removed = {f"{home}/victim-{tag}"}
    if who == "outsider":
        assert changed == set(), changed
    else:
        assert changed == made | removed, changed
        assert not (world.storage / data / f"link-{tag}").exists()
        for path in made:
            status = (world.storage / path).stat()
            assert (status.st_uid, status.st_mode & 0o7777) == (caller.uid if caller else 0, 0o644)
        for path in made:
            (world.storage / path).unlink()
    assert_no_traceback(world.said(world.view))


# ------------------------------------------------------------ the host's view, by caller

HOST_VIEW_CALLS = """
C, data = sys.argv[2], p("shared", "team", "data")
mine = lambda name: os.path.join(data, name + "-" + C)
e("list the root", listing, p())
e("stat a foreign entry", os.stat, p("audit"))
e("mkdir over a foreign directory", os.mkdir, p("audit"))
e("create over a foreign file", opened, p("stray"), os.O_WRONLY | os.O_CREAT)
e("link onto a foreign file", os.link, mine("mover"), p("stray"))
e("rename onto a foreign directory", os.rename, mine("dir"), p("audit"))
e("mkdir a new root entry", os.mkdir, p("new-" + C))
e("rmdir a root entry", os.rmdir, p("model"))
e("rename a root entry away", os.rename, p("model"), mine("model"))
e("rename over a root entry", os.rename, mine("dir"), p("model"))
e("exchange a root entry", renameat2, p("model"), mine("dir"), 2)
e("chmod a root entry", os.chmod, p("model"), 0o755)
e("statvfs", os.statvfs, p())
e("symlink", os.symlink, "target", mine("symlink"))
e("mknod", os.mknod, mine("node"))
e("setxattr", os.setxattr, mine("mover"), "user.note", b"1")
e("listxattr", os.listxattr, mine("mover"))
"""

HOST_VIEW_ANSWERS = {
    "list the root": sorted(ROOT_ENTRIES),
    "stat a foreign entry": "ENOENT",
    "mkdir over a foreign directory": "EACCES",
    "create over a foreign file": "EACCES",
    "link onto a foreign file": "EACCES",
    "rename onto a foreign directory": "EACCES",
    "mkdir a new root entry": "EACCES",
    "rmdir a root entry": "EPERM",
    "rename a root entry away": "EPERM",
    "rename over a root entry": "EPERM",
    "exchange a root entry": "EPERM",
    "chmod a root entry": "ok",
    "statvfs": "ok",
    "symlink": "ENOSYS",
    "mknod": "ENOSYS",
    "setxattr": EOPNOTSUPP,
    "listxattr": EOPNOTSUPP,
}
# The kernel refuses a change of the root directory (root's, 0755) to anyone else first,
# and a chmod to anyone but the owner.
HOST_AS_THE_AGENT = {
    **HOST_VIEW_ANSWERS,
    "rmdir a root entry": "EACCES",
    "rename a root entry away": "EACCES",
    "rename over a root entry": "EACCES",
    "exchange a root entry": "EACCES",
    "chmod a root entry": "EPERM",
}
# Outside the space's group, the second user does not even reach its data/.
HOST_AS_AN_OUTSIDER = {
    **HOST_AS_THE_AGENT,
    "link onto a foreign file": "EACCES",
    "symlink": "EACCES",
    "mknod": "EACCES",
    "setxattr": "EACCES",
    "listxattr": "EACCES",
}
EXPECTED_IN_THE_HOST_VIEW = {
    "root": HOST_VIEW_ANSWERS,
    "agent": HOST_AS_THE_AGENT,
    "outsider": HOST_AS_AN_OUTSIDER,
}


@pytest.mark.parametrize("who", list(EXPECTED_IN_THE_HOST_VIEW))
def test_the_host_view_keeps_its_six_entries_and_hides_foreign_ones_from_each_caller(world, who):
    """R-2 ("Nothing else may be created at the root") and docs/mount.md (the root holds
    exactly the six entries, "nothing else is made there (EACCES), and none of the six is
    removed, renamed away or replaced through the mount (EPERM), even by the host"; *Not
    provided*): with a foreign directory ``audit/`` and a foreign file ``stray`` made by hand
    beside the six on the storage root, WHO finds neither through the host's view — a stat is
    ``ENOENT``, and making, linking or renaming onto those names is ``EACCES``, never an
    ``EEXIST`` that would tell they are there — cannot remove, move, replace or exchange a
    root entry, makes no symbolic link, node or extended attribute; the kernel's mode-bit
    answer comes first for a caller other than root.  The storage root is left as it was."""
    caller = caller_of(world, who)
    tag = f"{who}-{os.getpid()}"
    audit = world.storage / "audit"
    if not audit.exists():
        audit.mkdir(mode=0o755)
        (audit / "log").write_text("kept\n")
        (world.storage / "stray").write_text("stray\n")
    owned_file(world.data() / f"mover-{tag}", "m\n", world.mine, 0o664)
    directory(world.data() / f"dir-{tag}", world.mine, 0o775)
    before = snapshot(world.storage)
    seen = probe(caller, HOST_VIEW_CALLS, world.host, tag)
    after = snapshot(world.storage)
    assert seen == EXPECTED_IN_THE_HOST_VIEW[who], seen
    assert after == before
    assert sorted(os.listdir(world.storage)) == sorted(ROOT_ENTRIES | {"audit", "stray"})
    assert_no_traceback(world.said(world.host))


# ------------------------------------------------ entries the host left by hand, and grants

# Entries beside the installed objects, each (but the dot-name, which no rule can name)
# granted in the agent's policy by GRANTS_BY_HAND.
BY_HAND = {
    "tool/.hidden": "an executable file with a dot-name",
    "tool/UPPER": "an executable file without controls",
    "tool/orphan.d": "controls without an executable",
    "tool/fs.read.bak": "an executable copy of an installed tool",
    "model/broken": "a regular file in a provider's place",
    "model/dangling": "a link to nothing in a provider's place",
    "model/alias": "a link to a provider",
    "shared/alias": "a link to a granted space",
    "shared/closed": "a space the agent's uid may not enter (0700)",
    "shared/plain": "a regular file in a space's place",
}
GRANTS_BY_HAND = [
    "tool:UPPER execute", "tool:orphan execute", "tool:fs.read.bak execute",
    "model:broken/x use", "model:dangling/x use", "model:alias/m1 use",
    "shared:alias read", "shared:closed read", "shared:plain read",
]  # fmt: skip


def leave_by_hand(storage: Path) -> None:
    tool = storage / "tool"
    for name in (".hidden", "UPPER"):
        owned_file(tool / name, "#!/bin/sh\necho hi\n", (0, 0), 0o755)
    directory(tool / "orphan.d")
    owned_file(tool / "orphan.d" / "policy", f"allow {LABEL} tool:orphan execute\n", (0, 0))
    shutil.copy2(tool / "fs.read", tool / "fs.read.bak")
    (storage / "model" / "broken").write_text("not a provider\n")
    (storage / "model" / "dangling").symlink_to("nowhere")
    (storage / "model" / "alias").symlink_to("local")
    (storage / "shared" / "alias").symlink_to(SPACE)
    directory(storage / "shared" / "closed", (0, 0), 0o700)
    (storage / "shared" / "plain").write_text("not a space\n")
    with (storage / "agent" / f"{AGENT}.d" / "policy").open("a") as policy:
        policy.writelines(f"allow {LABEL} {grant}\n" for grant in GRANTS_BY_HAND)


LOOKS = """
names = json.loads(sys.argv[2])
for top in ("tool", "model", "shared"):
    e("list " + top, listing, p(top))
e("list a provider", listing, p("model", "local"))
for name in names:
    e(name, os.stat, p(name))
"""


def test_entries_left_by_hand_beside_objects_stay_hidden_from_the_agent_whatever_it_is_granted(
    lone,
):
    """T-5 ("Listings MAY show only tools that pass the whole effective-authority check"),
    X-1 (a space's directory permissions are part of its visibility) and docs/mount.md
    (*What each view shows*: tools the whole chain lets the agent execute, spaces its policy
    lets it read, models it may use through the whole chain): beside the installed objects
    the host left by hand a dot-named executable, an executable without controls, controls
    without an executable, a copy of an installed tool, a file, a dangling link and a link
    in a provider's place, a link to a granted space, a space closed to the agent's uid and
    a file in a space's place — each but the dot-name granted in the agent's policy.  Through the
    agent's view none is listed and each is ``ENOENT``, for root and for the agent's uid
    alike, with the granted objects still shown and no error of the daemon's own; the host's
    view shows them all."""
    storage = copy_of_root(lone.template, lone.top / "storage")
    build(storage, lone.user)
    leave_by_hand(storage)
    host, view = directory(lone.top / "host"), directory(lone.top / "view")
    with serving(storage, host) as hosts, serving(storage, view, "--as", AGENT) as views:
        answers = [probe(who, LOOKS, view, json.dumps(list(BY_HAND))) for who in (None, lone.user)]
        in_host = {name: answer(lambda n=name: os.lstat(host / n)) for name in BY_HAND}
        said = hosts.said() + views.said()
    for seen in answers:
        assert {name: seen[name] for name in BY_HAND} == dict.fromkeys(BY_HAND, "ENOENT"), seen
        assert seen["list tool"] == ["fs.read", "fs.read.d", "tsh.d"], seen
        assert seen["list model"] == ["local"] and seen["list a provider"] == ["m1", "m1.d"]
        assert seen["list shared"] == ["cortexfs-docs", READ_ONLY, SPACE], seen
    assert in_host == dict.fromkeys(BY_HAND, "ok")
    assert_no_traceback(said)


HELD_IN_A_SPACE = """
import time
os.chdir(p("shared", "team", "data"))
print(json.dumps([sorted(os.listdir(".")), text("f")]), flush=True)
sys.stdin.readline()
for when in ("at once", "later"):
    e(when + ": list the working directory", listing, ".")
    e(when + ": read by a relative name", lambda: [text("f")])
    e(when + ": read by its path", lambda: [text(p("shared", "team", "data", "f"))])
    e(when + ": create by a relative name", opened, "new", CREATE)
    if when == "at once":
        time.sleep(1.2)  # past the mount's half second and the kernel's
e("list shared/", listing, p("shared"))
"""


def test_a_space_swapped_for_a_link_to_a_hidden_one_leads_the_agent_nowhere(lone):
    """docs/mount.md, *What the mount promises* — *Names* ("Every name is walked from the
    storage root one component at a time without following links, so a directory swapped
    for a symbolic link cannot lead the daemon outside the root (ELOOP/ENOTDIR)"; "Symbolic
    links are shown as links and never followed by the daemon") — with T-5 and X-1 (a link
    in a space's place is no space): the agent's uid works in ``shared/team/data`` through
    its view when the host swaps ``team`` on the storage root for a link to ``secret``, a
    space its mode bits would let it read but its policy does not.  Neither at once nor a
    second later does a listing, a read or a create, by relative name or by path, reach
    ``secret``: each is refused with an errno, ``shared/`` no longer lists ``team``, and
    nothing is made on either side."""
    storage = copy_of_root(lone.template, lone.top / "storage")
    build(storage, lone.user)
    view = directory(lone.top / "view")
    spaces = storage / "shared"
    before = snapshot(spaces / HIDDEN)
    with serving(storage, view, "--as", AGENT) as mount:
        proc = subprocess.Popen(
            [sys.executable, "-c", PRELUDE + textwrap.dedent(HELD_IN_A_SPACE)
             + "\nprint(json.dumps(out))\n", str(view)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            user=lone.user.uid, group=lone.user.gid, extra_groups=lone.user.groups,
        )  # fmt: skip
        try:
            first = json.loads(proc.stdout.readline())
            os.rename(spaces / SPACE, spaces / "team.real")
            (spaces / SPACE).symlink_to(HIDDEN)
            try:
                out, _ = proc.communicate("\n", timeout=60)
            finally:
                (spaces / SPACE).unlink()
                os.rename(spaces / "team.real", spaces / SPACE)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        said = mount.said()
    seen = json.loads(out.splitlines()[-1])
    assert first == [["f"], f"{SPACE}\n"]
    assert seen.pop("list shared/") == ["cortexfs-docs", READ_ONLY], seen
    assert set(seen.values()) <= {"ENOENT", "ENOTDIR", "ELOOP", "ESTALE"}, seen
    assert snapshot(spaces / HIDDEN) == before
    assert sorted(os.listdir(spaces / SPACE / "data")) == ["f"]
    assert_no_traceback(said)


# -------------------------------------------------------- listings while a directory moves


def listed_directory(world: World, name: str) -> tuple[Path, list[str]]:
    """``data/NAME``, root's, holding :data:`LISTED` files, and their names."""
    where = directory(world.data() / name, (0, 0), 0o777)
    names = [f"entry-{i:05d}" for i in range(LISTED)]
    for entry in names:
        (where / entry).touch()
    return where, names


def list_while(path: Path, change) -> tuple[list[os.DirEntry], str | None]:
    """The entries a listing of ``path`` gives when ``change()`` runs after its first
    entry, and the errno name it ended with (None when it ended by itself)."""
    entries: list[os.DirEntry] = []
    with os.scandir(path) as listing:
        try:
            entries.append(next(listing))
            change()
            entries.extend(listing)
        except OSError as exc:
            return entries, errno.errorcode.get(exc.errno, str(exc.errno))
    return entries, None


# How the listed directory is moved, and through which mount it is listed.
MOVES = {
    "moved on the storage root, listed through the host's view": ("disk", "host"),
    "moved through the agent's view, listed through the host's view": ("view", "host"),
    "moved on the storage root, listed through the agent's view": ("disk", "view"),
}


@pytest.mark.parametrize("how", list(MOVES))
def test_a_directory_moved_while_listed_is_listed_whole_or_refused(world, how):
    """docs/mount.md, *Listings* ("Each open directory lists the names it held when its
    listing began … every other entry shows exactly once, so a loop that removes what it
    lists … empties the directory as on a local disk") and *Names* ("a name changed outside
    the mount is found again at the next lookup (meanwhile an operation on the old name is
    ENOENT, or ESTALE …)"): root lists a directory of 2000 files of the agent's writable
    space through a view (a backup, ``find``); after the first entry the directory is
    renamed — by ``mv`` on the storage root, or by the agent's uid through its own view —
    HOW.  On a local disk the listing goes on to the end; through the mount it must give
    every entry once, or stop with an error (``ENOENT``/``ESTALE``): a listing that ends
    early without one looks complete."""
    mover, lister = MOVES[how]
    where, names = listed_directory(world, f"moved-{mover}-{lister}-{os.getpid()}")
    moved = where.with_name(where.name + ".moved")

    def move() -> None:
        if mover == "disk":
            os.rename(where, moved)
        else:
            old = world.through(world.view, where)
            done = run_as(world.user, ["mv", str(old), str(old) + ".moved"], world.user.groups)
            assert done.returncode == 0, done.stderr

    mount = world.host if lister == "host" else world.view
    entries, error = list_while(world.through(mount, where), move)
    seen = [entry.name for entry in entries]
    assert sorted(os.listdir(moved)) == names  # nothing was lost on disk
    assert len(seen) == len(set(seen)), "an entry shown twice"
    assert error in ("ENOENT", "ESTALE") or sorted(seen) == names, (error, len(seen))
    assert_no_traceback(world.said(world.host), world.said(world.view))


def test_a_directory_replaced_while_listed_never_lists_the_other_ones(world):
    """docs/mount.md, *Names* ("an operation on the old name is … ESTALE when the name now
    leads to another file") and *Identity* (what the kernel holds "stands for that file
    only"): a listing through the host's view of a directory of 2000 files, which after its
    first entry is renamed aside on the storage root and replaced by a directory holding a
    subdirectory of each name, must go on with the files it began with (as on a local disk)
    or stop with ``ESTALE``: never describe the new directory's subdirectories under the
    listed directory's names."""
    where, names = listed_directory(world, f"replaced-{os.getpid()}")
    moved = where.with_name(where.name + ".moved")

    def replace() -> None:
        os.rename(where, moved)
        where.mkdir()
        for entry in names:
            (where / entry).mkdir()

    entries, error = list_while(world.through(world.host, where), replace)
    kinds = {entry.is_dir(follow_symlinks=False) for entry in entries}
    assert error in ("ESTALE", "ENOENT") or kinds == {False}, (error, len(entries), kinds)
    assert_no_traceback(world.said(world.host))


def test_a_directory_moved_through_the_same_mount_while_listed_lists_every_entry_once(world):
    """docs/mount.md, *Names* ("A rename … through the mount is applied to the daemon's names
    at once") and *Listings*: the same listing of 2000 files through the host's view, the
    directory renamed through that very mount after the first entry: every entry shows
    exactly once, as on a local disk, and the directory is where the rename put it."""
    where, names = listed_directory(world, f"moved-here-{os.getpid()}")
    mounted = world.through(world.host, where)
    entries, error = list_while(mounted, lambda: os.rename(mounted, f"{mounted}.moved"))
    seen = [entry.name for entry in entries]
    assert error is None
    assert sorted(seen) == names and len(seen) == LISTED
    assert not where.exists() and sorted(os.listdir(f"{where}.moved")) == names
    assert_no_traceback(world.said(world.host))


REWOUND = {"moved away": "ENOENT", "replaced": "ESTALE"}


@pytest.mark.parametrize("how", list(REWOUND))
def test_a_listing_rewound_after_its_directory_changed_on_disk_is_the_documented_errno(world, how):
    """docs/mount.md, *Listings* (a listing begins again when rewound) and *Names* ("an
    operation on the old name is ENOENT, or ESTALE when the name now leads to another
    file"): a directory descriptor opened and listed through the host's view, then the
    directory HOW on the storage root: listed again from the start through the same
    descriptor it is ``ENOENT`` (nothing has its name) or ``ESTALE`` (another directory has
    it), never the other directory's names; a new open by name finds what is there now."""
    where = directory(world.data() / f"rewound-{how.split()[0]}-{os.getpid()}")
    (where / "kept").write_text("kept\n")
    mounted = world.through(world.host, where)
    fd = os.open(mounted, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert os.listdir(fd) == ["kept"]
        os.rename(where, f"{where}.old")
        if how == "replaced":
            where.mkdir()
            (where / "newcomer").write_text("new\n")
        again = answer(lambda: os.listdir(fd))
    finally:
        os.close(fd)
    assert again == REWOUND[how]
    assert os.listdir(f"{where}.old") == ["kept"]
    if how == "replaced":
        assert wait_for(lambda: answer(lambda: os.listdir(mounted)) == "ok", WITHIN)
        assert os.listdir(mounted) == ["newcomer"]
    assert_no_traceback(world.said(world.host))


# ---------------------------------------- a name swapped on disk under the kernel's entry


# What each call answers on the storage root once the file is KIND (opens are O_NONBLOCK:
# a FIFO without a writer is not waited for).
SWAPS = {
    "a socket": {"read": "ENXIO", "write": "ENXIO", "truncate": "EINVAL", "chmod": "ok"},
    "a directory": {"read": "ok", "write": "EISDIR", "truncate": "EISDIR", "chmod": "ok"},
    "a FIFO": {"read": "ok", "write": "ENXIO", "truncate": "EINVAL", "chmod": "ok"},
    "a symbolic link": {"read": "ok", "write": "ok", "truncate": "ok", "chmod": "ok"},
}


def swapped(base: Path, kind: str, cache: Path | None) -> list:
    """``base/n`` made a file (looked up through ``cache``, the mount's path to ``base``, so
    the kernel holds its entry), then replaced on disk by KIND (a link leads to ``target``
    beside it); what must be kept open meanwhile."""
    (base / "target").write_text("target\n")
    (base / "n").write_text("file\n")
    if cache is not None:
        os.stat(cache / "n")
    (base / "n").unlink()
    if kind == "a directory":
        (base / "n").mkdir(mode=0o755)
    elif kind == "a FIFO":
        os.mkfifo(base / "n", 0o644)
    elif kind == "a symbolic link":
        (base / "n").symlink_to("target")
    else:
        server = socket.socket(socket.AF_UNIX)
        held = os.open(base, os.O_PATH | os.O_DIRECTORY)
        try:  # by a short name: a socket's path holds 108 bytes at most
            server.bind(f"/proc/self/fd/{held}/n")
        finally:
            os.close(held)
        return [server]
    return []


def described(base: Path) -> dict[str, tuple]:
    return {
        name: (stat_of.st_mode, stat_of.st_size if os.path.isfile(base / name) else None)
        for name in sorted(os.listdir(base))
        for stat_of in [os.lstat(base / name)]
    }


@pytest.mark.parametrize("kind", list(SWAPS))
def test_a_file_swapped_for_another_kind_under_the_kernels_entry_answers_as_on_disk(world, kind):
    """docs/mount.md, *Names* ("For a file swapped on the storage root for a FIFO, a device
    or another file it answers ESTALE, with nothing opened, truncated (O_TRUNC) or waited
    for; the kernel then looks the name up once more, and the caller opens what is there
    now"): a file whose entry the kernel holds is replaced on the storage root by KIND;
    opening it for reading and for writing, truncating it and changing its mode through the
    host's view answer what the same calls answer on the storage root, and act on what is
    there now exactly as they do there."""
    holder = directory(world.data() / f"swap-{kind.split()[-1]}-{os.getpid()}")
    disk, stored = directory(holder / "disk"), directory(holder / "mount")
    mounted = world.through(world.host, stored)
    kept = [*swapped(disk, kind, None), *swapped(stored, kind, mounted)]
    nonblocking = os.O_NONBLOCK | os.O_CLOEXEC
    try:
        calls = {
            "read": lambda base: os.close(os.open(base / "n", os.O_RDONLY | nonblocking)),
            "write": lambda base: os.close(os.open(base / "n", os.O_WRONLY | nonblocking)),
            "truncate": lambda base: os.truncate(base / "n", 0),
            "chmod": lambda base: os.chmod(base / "n", 0o700),
        }
        on_disk = {name: answer(lambda c=call: c(disk)) for name, call in calls.items()}
        through = {name: answer(lambda c=call: c(mounted)) for name, call in calls.items()}
    finally:
        for server in kept:
            server.close()
    assert on_disk == SWAPS[kind]
    assert through == on_disk
    assert described(stored) == described(disk)
    assert_no_traceback(world.said(world.host))


# ------------------------------------------- an agent's view emptied while it is mounted


def aside(path: Path) -> Path:
    return path.with_name(path.name + ".aside")


def move_aside(path: Path) -> None:
    os.rename(path, aside(path))


def link_in_its_place(path: Path) -> None:
    move_aside(path)
    path.symlink_to(aside(path).name)


def half_write(path: Path) -> None:
    whole = path.read_text()
    aside(path).write_text(whole)
    path.write_text(whole[: len(whole) // 2])


def put_back(path: Path) -> None:
    if path.is_symlink():
        path.unlink()
    os.replace(aside(path), path)


def entry(storage: Path) -> Path:
    return storage / "agent" / AGENT


def identity(storage: Path) -> Path:
    return storage / "agent" / f"{AGENT}.d" / "identity"


# What is damaged, how; how the warning's reason starts after "repaired: " ({root}: the
# storage root's path), and what else it must say.
CAUSES = {
    "its entry removed": (
        entry,
        move_aside,
        "ENOENT: there is no agent 'coder' ({root}/agent/coder does not exist)",
        ("'ctx agent list' lists the agents there are", "'ctx agent create REQUEST.json'"),
    ),
    "its entry made a symbolic link": (
        entry,
        link_in_its_place,
        "ENOENT: there is no agent 'coder' ({root}/agent/coder is a symbolic link, never "
        "followed: an agent is an entry of its own)",
        ("'ctx agent list' lists the agents there are",),
    ),
    "its identity removed": (
        identity,
        move_aside,
        "EACCES: agent 'coder' has no identity (agent/coder.d/identity is missing)",
        (),
    ),
    "its identity half-written": (
        identity,
        half_write,
        "EACCES: agent/coder.d/identity is invalid: not JSON",
        (),
    ),
    "the storage root moved aside": (
        lambda storage: storage,
        move_aside,
        "ENOENT: {root} is no longer the storage root this mount serves (it was moved or replaced)",
        ("unmount it and mount the root again",),
    ),
}


@pytest.mark.parametrize("cause", list(CAUSES))
def test_a_view_emptied_while_mounted_says_why_once_and_comes_back_with_one_note(world, cause):
    """docs/mount.md, *What each view shows*: "While the agent's entry (agent/<a>) or
    identity … cannot be read — removed, renamed away, damaged, or caught half-written by an
    edit — and while the storage root's path names another directory than the one the mount
    serves …, the view is empty: its root lists nothing, every name is ENOENT and nothing
    may be changed. ctx mount says so on standard error (ctx mount: warning: agent coder's
    view is empty until it is repaired: EACCES: …) and goes on serving; the view shows its
    entries again within a second of the repair (ctx mount: note: …)".  With CAUSE, the
    warning is said once however often the view is looked at meanwhile, with the errno, the
    thing at fault and what to do; nothing is made in the home; the host's view serves on;
    the repair brings one note."""
    damaged, damage, reason, words = CAUSES[cause]
    view, storage = world.view, world.storage
    home = view / "home" / str(world.user.uid)
    said_before = len(world.said(view))
    assert (home / "h").read_text() == "home\n"
    damage(damaged(storage))
    try:
        assert wait_for(lambda: os.listdir(view) == [], WITHIN), os.listdir(view)
        assert wait_for(lambda: answer(lambda: os.stat(home)) == "ENOENT", WITHIN)
        deadline = time.monotonic() + 0.7  # looked at again and again: read again meanwhile
        while time.monotonic() < deadline:
            assert answer(lambda: os.stat(home)) == "ENOENT"
            time.sleep(0.1)
        made = answer(lambda: (home / f"new-{os.getpid()}").write_text("x"))
        hosts = sorted(os.listdir(world.host))
    finally:
        put_back(damaged(storage))
    assert wait_for(lambda: sorted(os.listdir(view)) == sorted(ROOT_ENTRIES), WITHIN)
    assert (home / "h").read_text() == "home\n"
    said = world.said(view)[said_before:]
    assert made in ("ENOENT", "EACCES")
    assert not (world.home / f"new-{os.getpid()}").exists()
    assert hosts == sorted(ROOT_ENTRIES)
    assert mounted_at(view)
    warnings = warnings_in(said, "warning")
    prefix = f"ctx mount: warning: agent {AGENT}'s view is empty until it is repaired: "
    assert len(warnings) == 1, said
    assert warnings[0].startswith(prefix + reason.format(root=storage)), said
    assert all(word in warnings[0] for word in words), said
    note = f"ctx mount: note: agent {AGENT}'s view shows its entries again"
    assert warnings_in(said, "note") == [note], said
    assert_no_traceback(said)


def pointed(link: Path, target: str) -> None:
    """``link`` made to lead to ``target`` at once, as ``ln -sfn`` then ``mv -T`` does."""
    fresh = link.with_name(link.name + ".new")
    fresh.symlink_to(target)
    os.replace(fresh, link)


def test_a_root_link_pointed_at_another_root_empties_the_agents_view_not_the_hosts(lone):
    """docs/mount.md, *What each view shows* ("while the storage root's path names another
    directory than the one the mount serves (the root moved aside and another made in its
    place: its controls would grant over the old root's files) … the view is empty") with
    R-1 (a root such as ``storage/current``, reached through a link its administrator
    made): both views mounted through the link ``current``; the link pointed at another
    root empties the agent's view, with one warning naming ``current`` and what to do, while
    the host's view goes on serving the root it mounted (a file written through it lands
    there, not in the other root); pointed back, the view comes back with one note."""
    first = lone.root("first")
    second = copy_of_root(lone.template, lone.top / "second")
    current = lone.top / "current"
    current.symlink_to("first")
    host, view = directory(lone.top / "host"), directory(lone.top / "view")
    uid = str(lone.user.uid)
    with serving(current, host), serving(current, view, "--as", AGENT) as mount:
        assert sorted(os.listdir(view)) == sorted(ROOT_ENTRIES)
        assert (view / "home" / uid / "h").read_text() == "home\n"
        pointed(current, "second")
        try:
            assert wait_for(lambda: os.listdir(view) == [], WITHIN), os.listdir(view)
            (host / "home" / uid / "while-pointed-away").write_text("host\n")
        finally:
            pointed(current, "first")
        assert wait_for(lambda: sorted(os.listdir(view)) == sorted(ROOT_ENTRIES), WITHIN)
        assert (view / "home" / uid / "while-pointed-away").read_text() == "host\n"
        said = mount.said()
    assert (first / "home" / uid / "while-pointed-away").read_text() == "host\n"
    assert not (second / "home" / uid).exists()
    warning = (
        f"ctx mount: warning: agent {AGENT}'s view is empty until it is repaired: ENOENT: "
        f"{current} is no longer the storage root this mount serves (it was moved or "
        "replaced); unmount it and mount the root again"
    )
    assert warnings_in(said, "warning") == [warning], said
    assert warnings_in(said, "note") == [
        f"ctx mount: note: agent {AGENT}'s view shows its entries again"
    ]
    assert_no_traceback(said)


def test_the_warning_of_a_root_whose_path_holds_control_characters_is_one_escaped_line(lone):
    """docs/tools.md ("what it quotes is escaped, as every message is"; shown escaped,
    ``\\x1b``, never raw to the terminal) with docs/mount.md (``ctx mount`` says on standard
    error that the view is empty, naming the root that moved): a storage root whose path
    holds a line feed and an escape sequence, moved aside under an agent's view: the warning
    is one line, the path escaped, and no raw control character reaches the daemon's
    standard error."""
    odd = lone.top / "odd\nname\x1b[31m"
    odd.mkdir(mode=0o755)
    storage = root_with_agent(lone.template, odd / "storage", lone.user)
    view = directory(lone.top / "view")
    with serving(storage, view, "--as", AGENT) as mount:
        assert sorted(os.listdir(view)) == sorted(ROOT_ENTRIES)
        os.rename(storage, odd / "aside")
        try:
            assert wait_for(lambda: os.listdir(view) == [], WITHIN), os.listdir(view)
        finally:
            os.rename(odd / "aside", storage)
        assert wait_for(lambda: sorted(os.listdir(view)) == sorted(ROOT_ENTRIES), WITHIN)
        said = mount.said()
    assert "\x1b" not in said
    assert all(line.startswith("ctx mount: ") for line in said.splitlines()), said
    warnings = warnings_in(said, "warning")
    assert len(warnings) == 1, said
    escaped = str(lone.top) + "/odd\\x0aname\\x1b[31m/storage is no longer the storage root"
    assert escaped in warnings[0], said


def test_descriptors_opened_before_the_view_emptied_keep_working_and_nothing_new_opens(lone):
    """docs/mount.md, *Open files* ("In an agent view the chain judges the open … a
    descriptor opened before goes on reading, and, opened for writing, writing and
    truncating … What opens nothing by itself is no way around the revocation") and *What
    each view shows* (an emptied view: "every name is ENOENT and nothing may be changed"):
    a file of the agent's home opened for writing through its view, then the agent's entry
    moved aside: the descriptor still writes, truncates, syncs and is stat'ed; its mode is
    not changed (``EACCES``); the file is opened neither by name nor through
    ``/proc/self/fd`` (``ENOENT``); the view's root is still stat'ed, its filesystem
    still described, and not changed (``EACCES``).  The storage root holds what the
    descriptor wrote, its mode and the root's as they were."""
    storage = lone.root()
    root_mode = storage.stat().st_mode & 0o7777
    view = directory(lone.top / "view")
    mounted = view / "home" / str(lone.user.uid) / "h"
    with serving(storage, view, "--as", AGENT) as mount:
        fd = os.open(mounted, os.O_RDWR)
        move_aside(entry(storage))
        try:
            assert wait_for(lambda: os.listdir(view) == [], WITHIN), os.listdir(view)
            assert wait_for(lambda: answer(lambda: os.stat(mounted)) == "ENOENT", WITHIN)
            seen = {
                "write": answer(lambda: os.pwrite(fd, b"HOME, kept", 0)),
                "ftruncate": answer(lambda: os.ftruncate(fd, 4)),
                "fsync": answer(lambda: os.fsync(fd)),
                "fstat": answer(lambda: os.fstat(fd)),
                "fchmod": answer(lambda: os.fchmod(fd, 0o600)),
                "open by name": answer(lambda: os.close(os.open(mounted, os.O_RDONLY))),
                "reopen through /proc": answer(
                    lambda: os.close(os.open(f"/proc/self/fd/{fd}", os.O_RDONLY))
                ),
                "stat of the view's root": answer(lambda: os.stat(view)),
                "statvfs of the view's root": answer(lambda: os.statvfs(view)),
                "chmod of the view's root": answer(lambda: os.chmod(view, 0o755)),
            }
        finally:
            os.close(fd)
            put_back(entry(storage))
        assert wait_for(lambda: sorted(os.listdir(view)) == sorted(ROOT_ENTRIES), WITHIN)
        said = mount.said()
    assert seen == {
        "write": "ok",
        "ftruncate": "ok",
        "fsync": "ok",
        "fstat": "ok",
        "fchmod": "EACCES",
        "open by name": "ENOENT",
        "reopen through /proc": "ENOENT",
        "stat of the view's root": "ok",
        "statvfs of the view's root": "ok",
        "chmod of the view's root": "EACCES",
    }
    on_disk = storage / "home" / str(lone.user.uid) / "h"
    assert on_disk.read_text() == "HOME" and on_disk.stat().st_mode & 0o7777 == 0o644
    assert storage.stat().st_mode & 0o7777 == root_mode
    assert_no_traceback(said)


# ------------------------------------------------------------------ the root's six entries


def test_a_root_entry_missing_on_disk_is_made_again_by_root_through_the_host_view_only(lone):
    """R-2 (the root ABI has exactly six entries) and docs/mount.md (in every view the root
    holds the six; "nothing else is made there (EACCES)"; none of the six is "renamed away
    or replaced through the mount (EPERM)"; the kernel checks each caller's mode bits):
    with ``model/`` removed from the storage root, the host's view shows five entries; a
    second user's ``mkdir`` of it is the kernel's ``EACCES``, root's through the agent's
    view the view's ``EACCES``, a directory renamed into its place ``EPERM``; root's
    ``mkdir`` through the host's view makes it again, root's, and both views show six."""
    (other,) = users_named(OUTSIDER)
    storage = lone.root()
    (storage / "model").rmdir()
    host, view = directory(lone.top / "host"), directory(lone.top / "view")
    spare = directory(storage / "home" / "spare")
    with serving(storage, host), serving(storage, view, "--as", AGENT):
        five = sorted(os.listdir(host))
        seen = {
            "a second user's mkdir": probe(other, 'e("mkdir", os.mkdir, p("model"))', host),
            "root's mkdir through the agent's view": answer(lambda: os.mkdir(view / "model")),
            "a directory renamed into its place": answer(
                lambda: os.rename(host / "home" / "spare", host / "model")
            ),
            "root's mkdir through the host's view": answer(lambda: os.mkdir(host / "model")),
        }
        six = sorted(os.listdir(host)), sorted(os.listdir(view))
    assert five == sorted(ROOT_ENTRIES - {"model"})
    assert seen == {
        "a second user's mkdir": {"mkdir": "EACCES"},
        "root's mkdir through the agent's view": "EACCES",
        "a directory renamed into its place": "EPERM",
        "root's mkdir through the host's view": "ok",
    }
    assert six == (sorted(ROOT_ENTRIES), sorted(ROOT_ENTRIES))
    made = (storage / "model").stat()
    assert (made.st_uid, made.st_gid) == (0, 0) and spare.is_dir()


# ------------------------------------------------------------- ctx umount without a name


def test_umount_without_a_mountpoint_while_two_are_up_names_them_and_unmounts_neither(world):
    """The help of ``ctx umount`` and docs/mount.md ("ctx umount without MOUNTPOINT …
    unmounts the one storage root mounted with ctx mount by the caller (by anyone, for
    root): none is ENOENT (exit 1), several EINVAL (exit 2), naming them"): root runs
    ``ctx umount`` while the host's view and the agent's view of this file are up: exit 2,
    one ``ctx: EINVAL:`` line naming both mount points and saying to name the MOUNTPOINT;
    both stay mounted and serving."""
    done = ctx_run("umount", timeout=30)
    assert done.rc == 2, done
    lines = done.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctx: EINVAL: "), done
    head, _, listed = lines[0].partition(" storage roots are mounted with 'ctx mount' (")
    assert listed.endswith("): name the MOUNTPOINT to unmount"), done
    named = listed.removesuffix("): name the MOUNTPOINT to unmount").split(", ")
    assert int(head.removeprefix("ctx: EINVAL: ")) == len(named) >= 2, done
    assert {str(world.host), str(world.view)} <= set(named), done
    assert done.out == ""
    assert mounted_at(world.host) and mounted_at(world.view)
    assert sorted(os.listdir(world.host)) == sorted(ROOT_ENTRIES)
    assert sorted(os.listdir(world.view)) == sorted(ROOT_ENTRIES)
