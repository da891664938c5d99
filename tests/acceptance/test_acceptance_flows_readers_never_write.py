"""Commands that only read never write (SPEC §2.4 ``status``, ``list``, ``show``, Q-6 ``recover
--dry-run``, §4 S-5 ``session show|tail|list``, §5 P-8 ``policy explain|check|query``, §6 T-8a
``object which|list``, T-8 ``object check``, §8 ``agent list|show|watch``, §12 D-1 ``ctx man``,
the ``--help`` of every command, §13 F-1 ``ctx mount`` used to look; docs/queue.md "Scale"
(the claim-order hint) and "recover", docs/sessions.md "Reading, torn lines and repair",
docs/tools.md "ctx tool").

The angle is that of a reader.  One storage root is populated the way a busy host has it: a
queue holding jobs in every state (pending; claimed by a live holder, by a dead one, under an
expired lease; done; failed), incomplete pairs (a claim without a lease, an empty claim, an
orphan lease, an interrupted finish), a conflict, ignored entries (a dot-file, a symlink, a
FIFO, an illegal name) and a stray temp file; a shared space of a group with its own queue and
tool tier; an agent whose home and shared sessions end with a torn line; a tool installed in
the system, user and space tiers.  A copy of it belongs to a user who owns it (its host
administrator).

Every read-only command is run on it by root, by that owner (on their copy), by the uid the
agent runs as (a member of the space's group) and by an outsider: before and after each the
whole root is recorded — every path's type, mode, owner, size, mtime, ctime, inode, link
count, content digest, link target and extended attributes — and nothing may differ: no cache
or lock file, no repaired line, no bumped time.  The caller's HOME, TMPDIR and (for root) its
claim-order cache directory are recorded too: readers add nothing there either, since the
docs let ``list --state pending`` read the hint and only writers (publish, claim, init, a
recover that is not a dry run) rewrite it.  The one documented write of a reading call, the
``tool/tsh.config.d/log`` line of ``ctx tool tsh.config``, is checked to be that line alone.

Then the root is bind-mounted read-only on itself (below this file's scratch directory,
unmounted at the end): every reader gives the output it gave on the writable root (the age of
the stray temp file aside), ``recover --dry-run`` reports as errors, in the real run's words,
the moves a read-only filesystem refuses (docs/queue.md), and every command that writes fails
with ``EROFS`` naming the read-only filesystem.  Finally ``ctx mount`` of the root (host view
and an agent's view, and of the read-only root) is walked with ls/stat/xattr/read of every
entry, and the root is unchanged."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MAN_PAGES,
    Run,
    age,
    needs_fuse,
    needs_fuse_as_root,
    new_scratch_dir,
    result,
    scratch_top,
    serving,
    tool_manifest,
    wait_for,
)
from tests.support.scratch_mounts import ScratchMounts
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, members_of, users_named

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acts as several users: needs root")

SCRATCH = scratch_top(__file__)
TRACEBACK = "Traceback (most recent call last)"
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
GROUP = "ctxrnw-g"
AGENT_USER, OUTSIDER, OWNER = "ctxrnw-a", "ctxrnw-o", "ctxrnw-u"
SPACE = "team"
REQUEST = json.dumps({"tool": "fs.stat", "input": {"path": "/ctx"}})
STAT_INPUT = '{"path": "/ctx"}'
STATES = ("pending", "claimed", "done", "failed", "incomplete", "conflict")
# The jobs of the queue of project proj, by what they show.
JOBS = (
    "c-live",  # claimed, its holder alive
    "c-dead",  # claimed, its holder exited
    "c-exp",  # claimed, its lease expired
    "half",  # an interrupted finish: result in done/, request still claimed
    "d1",  # done
    "f1",  # failed
    "p1",  # pending
    "p2",  # pending
    "nolease",  # claimed without a lease
    "empty",  # an empty claim directory
    "orphan",  # a lease without a claim
    "both",  # pending and done: a conflict
)
TORN = {
    "home": b'{"ts":"2026-06-22T12:00:00Z","type":"tool_c',
    "space": b'{"ts":"2026-06-22T12:00:00Z","ty',
}
EVENT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT")
TEMP_AGE = re.compile(r"\(\d+s old\)")
TEMP_AGE_JSON = re.compile(r'"age_seconds": [0-9.]+')
INODE_JSON = re.compile(r'"inode": \d+')
ERRNO_LINE = re.compile(r"^ctx: E[A-Z0-9]+: \S", re.M)

# ------------------------------------------------------------------------------ snapshots

_DIGESTS: dict[tuple, str] = {}


def _digest(path: str, st: os.stat_result) -> str:
    """The SHA-256 of a regular file, kept per (inode, size, mtime, ctime): a write that left
    all four as they were would have to have restored the ctime, which no call can."""
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    if key not in _DIGESTS:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as stream:
            _DIGESTS[key] = hashlib.sha256(stream.read()).hexdigest()
    return _DIGESTS[key]


def _xattrs(path: str) -> tuple:
    try:
        names = os.listxattr(path, follow_symlinks=False)
        return tuple(sorted((n, os.getxattr(path, n, follow_symlinks=False).hex()) for n in names))
    except OSError as exc:
        return (f"errno {exc.errno}",)


def _entry(path: str) -> tuple:
    st = os.lstat(path)
    kind = stat.S_IFMT(st.st_mode)
    content: str | None = None
    if stat.S_ISREG(st.st_mode):
        content = _digest(path, st)
    elif stat.S_ISLNK(st.st_mode):
        content = os.readlink(path)
    return (
        kind,
        oct(stat.S_IMODE(st.st_mode)),
        st.st_uid,
        st.st_gid,
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
        st.st_ino,
        st.st_nlink,
        content,
        _xattrs(path),
    )


def tree(top: Path) -> dict[str, tuple]:
    """Every path under ``top`` and ``top`` itself, never following a link: type, mode, owner,
    size, mtime, ctime, inode, link count, content digest or link target, extended attributes."""
    found = {".": _entry(str(top))}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            found[os.path.relpath(path, top)] = _entry(path)
    return found


def differences(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    return [
        f"{path}: {before.get(path)} -> {after.get(path)}"
        for path in sorted(set(before) | set(after))
        if before.get(path) != after.get(path)
    ]


# ------------------------------------------------------------------------------ callers


@dataclass(frozen=True)
class Caller:
    """Who runs a command: root (``user`` None) or a real user; a HOME and TMPDIR of its own,
    and for root a claim-order cache directory of its own (XDG_CACHE_HOME)."""

    label: str
    user: UnprivilegedUser | None
    home: Path
    tmp: Path
    cache: Path | None = None

    def env(self, storage: Path | None) -> dict[str, str]:
        name = "root" if self.user is None else self.user.name
        env = {
            "PATH": PATH,
            "HOME": str(self.home),
            "USER": name,
            "LOGNAME": name,
            "LANG": "C.UTF-8",
            "TMPDIR": str(self.tmp),
        }
        if self.cache is not None:
            env["XDG_CACHE_HOME"] = str(self.cache)
        if storage is not None:
            env["CTX_STORAGE"] = str(storage)
        return env

    def run(
        self,
        *args: object,
        storage: Path | None,
        stdin: str = "",
        timeout: float = 60,
    ) -> Run:
        as_user = {}
        if self.user is not None:
            as_user = {
                "user": self.user.uid,
                "group": self.user.gid,
                "extra_groups": self.user.groups,
            }
        done = subprocess.run(
            [*CTX_ARGV, *map(str, args)],
            input=stdin.encode(),
            capture_output=True,
            env=self.env(storage),
            cwd=self.home,
            umask=0o022,
            timeout=timeout,
            **as_user,
        )
        return Run(
            [str(a) for a in args],
            done.returncode,
            done.stdout.decode("utf-8", "replace"),
            done.stderr.decode("utf-8", "replace"),
        )

    def own_dirs(self) -> list[Path]:
        return [p for p in (self.home, self.tmp, self.cache) if p is not None]


def make_caller(top: Path, label: str, user: UnprivilegedUser | None) -> Caller:
    home, tmp = top / f"home-{label}", top / f"tmp-{label}"
    for directory in (home, tmp):
        directory.mkdir(mode=0o700)
        if user is not None:
            os.chown(directory, user.uid, user.gid)
    cache = None
    if user is None:
        cache = top / "cache-root"
        cache.mkdir(mode=0o700)
    return Caller(label, user, home, tmp, cache)


# ------------------------------------------------------------------------------ the world


@dataclass
class World:
    top: Path
    storage: Path  # root's root
    owner_root: Path  # the owner's copy of it, all the owner's
    manifest: Path  # a v2 manifest outside the root, readable by all
    root: Caller
    owner: Caller
    agent: Caller  # the uid coder runs as, a member of GROUP
    outsider: Caller
    holder: subprocess.Popen  # the live holder of c-live

    @property
    def queue(self) -> Path:
        return self.storage / "shared" / "proj" / "queue"

    def ok(self, *args: object, stdin: str = "", storage: Path | None = None) -> Run:
        done = self.root.run(*args, storage=storage or self.storage, stdin=stdin)
        assert done.rc == 0 and TRACEBACK not in done.err, done
        return done


def _populate_queue(world: World) -> None:
    """The queue of project proj in every state (see JOBS), with ignored entries and a stray
    temp file; one pending job in the space's queue."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    for name in ("c-live", "c-dead", "c-exp", "half", "d1", "f1", "p1", "p2"):
        world.ok("queue", "publish", "--project", "proj", "--name", name, "-", stdin=REQUEST)
    live = str(world.holder.pid)
    claims = [
        ("c-live", ["--pid", live, "--ttl", "3600"]),
        ("c-dead", ["--pid", str(dead.pid), "--ttl", "3600"]),
        ("c-exp", ["--pid", live, "--ttl", "1"]),
        ("half", ["--pid", str(dead.pid), "--ttl", "3600"]),
        ("d1", ["--pid", live]),
        ("f1", ["--pid", live]),
    ]
    for name, options in claims:
        claimed = world.ok("queue", "claim", "--project", "proj", *options)
        assert claimed.out == f"{name}.req.json\n", claimed
    world.ok("queue", "finish", "--project", "proj", "d1", "--ok", "-", stdin='{"a": 1}')
    world.ok("queue", "finish", "--project", "proj", "f1", "--error", "-", stdin='{"a": 2}')
    q = world.queue
    (q / "done" / "half.req.json.result").write_text(json.dumps(result("done")))
    (q / "claimed" / "nolease.req.json").mkdir()
    (q / "claimed" / "nolease.req.json" / "nolease.req.json").write_text(REQUEST)
    (q / "claimed" / "empty.req.json").mkdir()
    (q / "lease" / "orphan.req.json").mkdir()
    shutil.copy(q / "lease" / "c-live.req.json" / "worker", q / "lease" / "orphan.req.json")
    (q / "pending" / "both.req.json").write_text(REQUEST)
    (q / "done" / "both.req.json").write_text(REQUEST)
    (q / "done" / "both.req.json.result").write_text(json.dumps(result("done")))
    (q / "pending" / ".hidden.req.json").write_text(REQUEST)
    (q / "pending" / "bad name.req.json").write_text(REQUEST)
    os.symlink("/etc/passwd", q / "pending" / "link.req.json")
    os.mkfifo(q / "pending" / "fifo.req.json")
    (q / "inbox" / ".stray.tmp").write_text("half a request")
    age(q / "inbox" / ".stray.tmp", 7200)
    world.ok("queue", "publish", "--project", SPACE, "--name", "t1", "-", stdin=REQUEST)
    expires = json.loads((q / "lease" / "c-exp.req.json" / "worker").read_text())["expires_at"]
    ends = datetime.fromisoformat(expires.replace("Z", "+00:00")).timestamp()
    assert wait_for(lambda: time.time() > ends + 0.1, 5), expires


def _build(
    top: Path, template: Path, holder: subprocess.Popen, agent_user, outsider_user, owner_user
) -> World:
    manifest = tool_manifest(top / "src", "hello", "#!/bin/sh\necho hi\n")
    for entry in (manifest.parent, *manifest.parent.iterdir()):
        entry.chmod(0o755 if entry.is_dir() else 0o644)
    world = World(
        top=top,
        storage=copy_of_root(template, top / "storage"),
        owner_root=top / "owned" / "storage",
        manifest=manifest,
        root=make_caller(top, "root", None),
        owner=make_caller(top, "owner", owner_user),
        agent=make_caller(top, "agent", agent_user),
        outsider=make_caller(top, "outsider", outsider_user),
        holder=holder,
    )
    world.ok("shared", "create", SPACE, "--group", GROUP)
    coder = {
        "name": "coder",
        "label": "coder_t",
        "tools": ["fs.stat", "hello"],
        "shared": {SPACE: ["read", "write"]},
    }
    world.ok("agent", "create", "--user", AGENT_USER, "-", stdin=json.dumps(coder))
    for tier in ("system", "user", f"shared:{SPACE}"):
        world.ok("object", "install", manifest, "--tier", tier)
    with (world.storage / "tool" / "fs.stat.d" / "policy").open("a") as policy:
        policy.write("allow coder_t tool:fs.stat execute\n")
    world.ok("run", "--agent", "coder", "--native", "fs.stat", stdin=STAT_INPUT)
    world.ok("run", "--agent", "coder", "--session", "whole", "--native", "fs.stat",
             stdin=STAT_INPUT)  # fmt: skip
    world.ok("run", "--agent", "coder", "--project", SPACE, "--session", "s2", "--native",
             "fs.stat", stdin=STAT_INPUT)  # fmt: skip
    with open(home_events(world.storage, agent_user.uid, "default"), "ab") as events:
        events.write(TORN["home"])
    with open(space_events(world.storage, "s2"), "ab") as events:
        events.write(TORN["space"])
    _populate_queue(world)
    # The owner's copy: the whole root, as the owner's own bootstrap would have it owned.
    world.owner_root.parent.mkdir(mode=0o755)
    subprocess.run(["cp", "-a", str(world.storage), str(world.owner_root)], check=True)
    subprocess.run(
        ["chown", "-hR", f"{owner_user.uid}:{owner_user.gid}", str(world.owner_root)],
        check=True,
    )
    return world


def home_events(storage: Path, uid: int, session: str) -> Path:
    return storage / "home" / str(uid) / "agent" / "coder" / "session" / session / "events.jsonl"


def space_events(storage: Path, session: str) -> Path:
    return storage / "shared" / SPACE / "agent" / "coder" / "session" / session / "events.jsonl"


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    (agent_user,), _gid = members_of(GROUP, AGENT_USER)
    outsider_user, owner_user = users_named(OUTSIDER, OWNER)
    top = new_scratch_dir(SCRATCH, "w")
    holder = subprocess.Popen(["sleep", "600"])
    try:
        yield _build(top, _template, holder, agent_user, outsider_user, owner_user)
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------------------ the readers


def queue_readers() -> list[tuple[str, ...]]:
    proj = ("--project", "proj")
    readers = [
        ("queue", "status", *proj),
        ("queue", "status", *proj, "--json"),
        ("queue", "list", *proj),
        ("queue", "list", *proj, "--json"),
        *[("queue", "list", *proj, "--state", state) for state in STATES],
        ("queue", "list", *proj, "--state", "pending", "--json"),
        *[("queue", "show", *proj, job) for job in JOBS],
        ("queue", "show", *proj, "both", "--json"),
        ("queue", "show", *proj, "half.req.json", "--json"),
        ("queue", "show", *proj, "nosuch"),
        ("queue", "show", *proj, "bad name"),
        ("queue", "status", "--project", SPACE),
        ("queue", "list", "--project", SPACE, "--state", "pending"),
        ("queue", "show", "--project", SPACE, "t1"),
    ]
    return readers


def recover_dry_runs() -> list[tuple[str, ...]]:
    base = ("queue", "recover", "--project", "proj", "--dry-run")
    return [
        base,
        (*base, "--json"),
        (*base, "--reconcile"),
        (*base, "--reconcile", "--json"),
        (*base, "--reconcile", "--grace", "0"),
        ("queue", "recover", "--project", SPACE, "--dry-run", "--reconcile"),
    ]


def session_readers(agent_uid: int) -> list[tuple[str, ...]]:
    return [
        ("session", "show", "coder"),
        ("session", "show", "coder", "--json"),
        ("session", "tail", "coder"),
        ("session", "tail", "coder", "-n", "1", "--json"),
        ("session", "list", "coder"),
        ("session", "list", "coder", "--json"),
        ("session", "list", "coder", "--uid", str(agent_uid)),
        ("session", "show", "coder", "whole"),
        ("session", "show", "coder", "s2", "--project", SPACE),
        ("session", "tail", "coder", "--session", "s2", "--project", SPACE, "--json"),
        ("session", "list", "coder", "--project", SPACE),
    ]


def policy_readers(storage: Path) -> list[tuple[str, ...]]:
    agent_policy = str(storage / "agent" / "coder.d" / "policy")
    tool_policy = str(storage / "tool" / "fs.stat.d" / "policy")
    location = f"shared/{SPACE}/agent/coder/session"
    return [
        ("policy", "explain", "coder", "tool:fs.stat", "execute"),
        ("policy", "explain", "coder", "tool:fs.stat", "execute", "--json"),
        ("policy", "explain", "coder", "tool:hello", "execute"),
        ("policy", "explain", "coder", f"shared:{SPACE}", "write"),
        ("policy", "explain", "coder", "session:s2", "read", "--location", location),
        ("policy", "explain", "coder", "mount:ctx", "read"),
        ("policy", "check", agent_policy, tool_policy),
        ("policy", "check", "--json", agent_policy, tool_policy),
        (
            "policy",
            "query",
            "--policy",
            agent_policy,
            "--policy",
            tool_policy,
            "coder_t",
            "tool:fs.stat",
            "execute",
        ),
    ]


def object_readers(manifest: Path) -> list[tuple[str, ...]]:
    return [
        ("object", "which", "fs.stat"),
        ("object", "which", "hello", "--json"),
        ("object", "which", "nosuch"),
        ("object", "list"),
        ("object", "list", "--json"),
        ("object", "list", "--tier", "system"),
        ("object", "list", "--tier", "user"),
        ("object", "list", "--tier", f"shared:{SPACE}"),
        ("object", "check", str(manifest)),
        ("object", "check", "--json", str(manifest)),
    ]


def agent_readers() -> list[tuple[str, ...]]:
    return [
        ("agent", "list"),
        ("agent", "list", "--json"),
        ("agent", "show", "coder"),
        ("agent", "show", "coder", "--json"),
        ("agent", "watch", "coder"),
    ]


def man_readers() -> list[tuple[str, ...]]:
    return [("man",), ("man", "--json"), ("man", "README"), *[("man", t) for t in MAN_PAGES]]


def every_reader(world: World, storage: Path, agent_uid: int) -> list[tuple[str, ...]]:
    """One or more readers of each kind (queue, recover --dry-run, session, policy, object,
    agent, man), the set every caller runs."""
    proj = ("--project", "proj")
    agent_policy = str(storage / "agent" / "coder.d" / "policy")
    return [
        ("queue", "status", *proj, "--json"),
        ("queue", "list", *proj),
        ("queue", "list", *proj, "--state", "pending"),
        ("queue", "show", *proj, "c-live"),
        ("queue", "show", *proj, "half", "--json"),
        ("queue", "show", *proj, "both"),
        ("queue", "recover", *proj, "--dry-run", "--reconcile", "--json"),
        ("queue", "status", "--project", SPACE),
        ("queue", "list", "--project", SPACE, "--state", "pending"),
        ("session", "show", "coder"),
        ("session", "tail", "coder", "--json"),
        ("session", "list", "coder", "--uid", str(agent_uid)),
        ("session", "show", "coder", "s2", "--project", SPACE),
        ("policy", "explain", "coder", "tool:fs.stat", "execute", "--json"),
        ("policy", "check", agent_policy),
        ("object", "which", "hello"),
        ("object", "list", "--json"),
        ("object", "check", str(world.manifest)),
        ("agent", "list", "--json"),
        ("agent", "show", "coder"),
        ("man",),
        ("man", "agent"),
    ]


# ------------------------------------------------------------------------------ checks


def clean(done: Run) -> Run:
    """No traceback; a failure says why with an errno word (``ctx: EXXX: …``), exit 1 or 2
    (3 is claim's alone)."""
    assert TRACEBACK not in done.err + done.out, done
    if done.rc != 0:
        assert done.rc in (1, 2), done
        if done.rc == 2 or not done.out:
            assert ERRNO_LINE.search(done.err), done
    return done


def read_only_run(
    caller: Caller, storage: Path, commands: Sequence[Sequence[str]], *, outside: bool = True
) -> dict[tuple[str, ...], Run]:
    """Run each command as ``caller`` on ``storage``; after each, the root and the caller's own
    directories (``outside``) must be exactly as before.  Returns each command's run."""
    runs: dict[tuple[str, ...], Run] = {}
    root_before = tree(storage)
    own_before = {p: tree(p) for p in caller.own_dirs()} if outside else {}
    for command in commands:
        done = clean(caller.run(*command, storage=storage))
        runs[tuple(command)] = done
        changed = differences(root_before, tree(storage))
        assert changed == [], (caller.label, done, changed)
        for directory, before in own_before.items():
            changed = differences(before, tree(directory))
            assert changed == [], (caller.label, done, directory, changed)
    return runs


def steady(text: str) -> str:
    """Output without what the clock changes between two runs: the stray temp file's age."""
    return TEMP_AGE_JSON.sub('"age_seconds": N', TEMP_AGE.sub("(Ns old)", text))


@contextlib.contextmanager
def read_only(storage: Path) -> Iterator[None]:
    """``storage`` bind-mounted read-only on itself for the block (a mount of our own, below
    nothing of anyone else's), then unmounted."""
    mounts = ScratchMounts(new_scratch_dir(SCRATCH, "ro"))
    try:
        mounts.bind_self(storage, "ro")
        probe = storage / ".probe"
        with pytest.raises(OSError) as refused:
            probe.write_text("x")
        assert refused.value.errno == errno.EROFS
        yield
    finally:
        mounts.close()


def writer(world: World) -> Caller:
    """Root with a claim-order cache of its own: what a refused writer does to its hint (a
    claim takes a name off it first, docs/queue.md) stays out of the one the readers read."""
    return make_caller(new_scratch_dir(world.top, "writer"), "root", None)


def erofs(done: Run, *words: str, rc: int = 1) -> None:
    """Refused with EROFS (exit ``rc``), saying the filesystem is read-only; no traceback."""
    assert TRACEBACK not in done.err + done.out, done
    assert done.rc == rc, done
    text = done.err + done.out
    assert "EROFS" in text, done
    assert "read-only" in text.lower(), done
    for word in words:
        assert word in text, (word, done)


# ============================================================ root, on the writable root


def test_queue_status_list_and_show_as_root_change_nothing(world: World) -> None:
    """§2.4, Q-6, Q-8: status, list (every --state) and show (every job, text and --json) of
    a queue in every state: exit 1 where a conflict is listed, the counts as populated, the
    ignored entries and the stray temp reported; the root, root's claim-order cache and its
    HOME and TMPDIR are unchanged after each."""
    runs = read_only_run(world.root, world.storage, queue_readers())
    status = runs[("queue", "status", "--project", "proj", "--json")]
    assert status.rc == 1, status
    counts = status.json()["counts"]
    expected = {
        "pending": 2,
        "claimed": 3,
        "done": 1,
        "failed": 1,
        "incomplete": 4,
        "conflict": 1,
        "ignored": 4,
    }
    assert {k: counts[k] for k in expected} == expected, status
    assert {i["path"] for i in status.json()["ignored"]} == {
        "pending/.hidden.req.json",
        "pending/bad name.req.json",
        "pending/link.req.json",
        "pending/fifo.req.json",
    }, status
    assert [t["path"] for t in status.json()["temps"]] == ["inbox/.stray.tmp"], status
    pending = runs[("queue", "list", "--project", "proj", "--state", "pending")]
    assert (pending.rc, pending.lines()) == (0, ["p1.req.json", "p2.req.json"]), pending
    assert runs[("queue", "show", "--project", "proj", "both")].rc == 1
    unknown = runs[("queue", "show", "--project", "proj", "nosuch")]
    assert unknown.rc == 1 and unknown.err.startswith("ctx: ENOENT: "), unknown
    illegal = runs[("queue", "show", "--project", "proj", "bad name")]
    assert illegal.rc == 2 and illegal.err.startswith("ctx: EINVAL: "), illegal
    assert runs[("queue", "show", "--project", SPACE, "t1")].rc == 0


def test_recover_dry_run_as_root_plans_every_transition_and_applies_none(world: World) -> None:
    """Q-5, Q-6, I-5, docs/queue.md: --dry-run (plain, --reconcile, --grace 0, --json) says
    what it would requeue (the dead and the expired holder's jobs), repair and remove, with
    "applied": false, leaves c-live untouched, exits 1 (the queue stays inconsistent), and
    changes nothing: no requeue, no removed temp, no lock, no hint rewritten."""
    runs = read_only_run(world.root, world.storage, recover_dry_runs())
    for command, done in runs.items():
        assert done.rc == (0 if SPACE in command else 1), done
    report = runs[("queue", "recover", "--project", "proj", "--dry-run", "--reconcile", "--json")]
    got = report.json()
    assert got["dry_run"] is True and got["consistent"] is False, report
    assert {r["job"] for r in got["requeued"]} == {"c-dead.req.json", "c-exp.req.json"}, report
    assert {r["job"] for r in got["repaired"]} == {
        "half.req.json",
        "nolease.req.json",
        "empty.req.json",
        "orphan.req.json",
    }, report
    assert all(r["applied"] is False for r in got["requeued"] + got["repaired"]), report
    assert [u["job"] for u in got["untouched"]] == ["c-live.req.json"], report
    assert got["removed_temps"] == [] and got["stale_temps"] == ["inbox/.stray.tmp"], report
    text = runs[("queue", "recover", "--project", "proj", "--dry-run", "--reconcile")].out
    assert "would requeue  c-dead.req.json" in text and "would remove" in text, text
    assert (world.queue / "inbox" / ".stray.tmp").is_file()


def test_session_readers_skip_torn_lines_and_never_cut_them(world: World) -> None:
    """S-5, docs/sessions.md: show, tail (text, --json, -n) and list of a home and a shared
    session that end with a torn line print the whole events, skip the torn one with a note
    naming 'ctx session repair', and leave its bytes at the end of the file."""
    agent_uid = world.agent.user.uid
    runs = read_only_run(world.root, world.storage, session_readers(agent_uid))
    show = runs[("session", "show", "coder")]
    assert show.rc == 0 and len(show.lines()) == 2, show
    assert all(EVENT_LINE.match(line) for line in show.lines()), show
    assert "torn line" in show.err and "ctx session repair coder" in show.err, show
    tail = runs[("session", "tail", "coder", "-n", "1", "--json")]
    assert json.loads(tail.out)["type"] == "tool_result", tail
    shared = runs[("session", "show", "coder", "s2", "--project", SPACE)]
    assert "torn line" in shared.err and "--project team" in shared.err, shared
    whole = runs[("session", "show", "coder", "whole")]
    assert whole.rc == 0 and "torn" not in whole.err, whole
    assert home_events(world.storage, agent_uid, "default").read_bytes().endswith(TORN["home"])
    assert space_events(world.storage, "s2").read_bytes().endswith(TORN["space"])


def test_session_tail_follow_stopped_with_ctrl_c_changes_nothing(
    world: World, tmp_path: Path
) -> None:
    """docs/sessions.md, ``ctx session tail --help``: ``tail --follow`` prints the last events,
    keeps following, and Ctrl-C stops it with exit 0; the torn line stays and nothing else
    changes."""
    before = tree(world.storage)
    out = tmp_path / "follow.out"
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [*CTX_ARGV, "session", "tail", "coder", "-n", "2", "--follow"],
            stdout=sink, stderr=subprocess.PIPE, env=world.root.env(world.storage),
        )  # fmt: skip
    try:
        assert wait_for(lambda: out.read_bytes().count(b"\n") >= 2, 10), out.read_bytes()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out_text = out.read_text()
    assert proc.returncode == 0, (proc.returncode, err)
    assert TRACEBACK.encode() not in err, err
    assert [line.split()[1] for line in out_text.splitlines()] == ["tool_call", "tool_result"]
    assert differences(before, tree(world.storage)) == []


def test_policy_explain_check_and_query_as_root_change_nothing(world: World) -> None:
    """P-5, P-8, docs/policy.md: explain walks the six steps (allowed for fs.stat, denied at
    step 6 for hello whose tool policy holds no rule), check validates the policy files of
    the root, query answers allow; nothing in the root changes."""
    runs = read_only_run(world.root, world.storage, policy_readers(world.storage))
    assert runs[("policy", "explain", "coder", "tool:fs.stat", "execute")].rc == 0
    denied = runs[("policy", "explain", "coder", "tool:hello", "execute")]
    assert denied.rc == 1 and "deny" in denied.out, denied
    checked = [r for c, r in runs.items() if c[:2] == ("policy", "check")]
    assert [r.rc for r in checked] == [0, 0], checked
    query = next(r for c, r in runs.items() if c[:2] == ("policy", "query"))
    assert (query.rc, query.out) == (0, "allow\n"), query


def test_object_which_list_and_check_as_root_change_nothing(world: World) -> None:
    """T-4, T-8, T-8a: which resolves fs.stat and hello (exit 1 for a name on no tier), list
    shows the tool in every tier, check validates a manifest; no install lock, log or control
    is made or touched."""
    runs = read_only_run(world.root, world.storage, object_readers(world.manifest))
    which = runs[("object", "which", "fs.stat")]
    assert (which.rc, which.out) == (0, f"{world.storage}/tool/fs.stat\n"), which
    assert runs[("object", "which", "nosuch")].rc == 1
    listed = runs[("object", "list", "--json")].json()
    rows = listed if isinstance(listed, list) else listed["tools"]
    tiers = {row["tier"] for row in rows if row["name"] == "hello"}
    assert tiers == {"system", "user", f"shared:{SPACE}"}, listed
    assert runs[("object", "check", str(world.manifest))].rc == 0


def test_agent_list_show_and_watch_as_root_change_nothing(world: World) -> None:
    """§8, A-2: list and show describe coder (its uid, label); watch with no terminal running
    is ENOENT naming 'ctx agent start'; nothing under the root changes (no log line, no
    terminal directory, no home)."""
    runs = read_only_run(world.root, world.storage, agent_readers())
    listed = runs[("agent", "list", "--json")].json()
    assert [(a["name"], a["label"]) for a in listed] == [("coder", "coder_t")], listed
    assert listed[0]["identity"]["uid"] == world.agent.user.uid, listed
    watch = runs[("agent", "watch", "coder")]
    assert watch.rc == 1 and watch.err.startswith("ctx: ENOENT: "), watch
    assert "ctx agent start coder" in watch.err, watch


def test_man_pages_as_root_change_nothing(world: World) -> None:
    """D-1: ``ctx man`` lists the topics, and each topic (README included) prints the
    installed page of the bundle, byte for byte; the bundle is unchanged."""
    runs = read_only_run(world.root, world.storage, man_readers())
    docs = world.storage / "shared" / "cortexfs-docs"
    for topic, page in MAN_PAGES.items():
        shown = runs[("man", topic)]
        assert shown.rc == 0 and shown.out == (docs / "man" / page).read_text(), shown
    assert runs[("man", "README")].out == (docs / "README.md").read_text()


def test_help_of_every_command_changes_nothing_and_creates_no_root(world: World) -> None:
    """The ``--help`` of ctx (and ``-h``, ``--version``), of every group and of every
    subcommand its help lists: exit 0, usage on stdout, nothing changed in the root; given
    after the arguments of a command that writes (bootstrap, queue init, shared create, agent
    create, object install, run) on a root that does not exist, it prints the usage and the
    root is not made."""
    first = read_only_run(world.root, world.storage, [("--help",), ("-h",), ("--version",)])
    groups = _commands_listed(first[("--help",)].out)
    assert {"queue", "session", "policy", "object", "agent", "man"} <= set(groups), first
    grouped = read_only_run(world.root, world.storage, [(g, "--help") for g in groups])
    subcommands = [
        (group, sub, "--help")
        for group in groups
        for sub in _commands_listed(grouped[(group, "--help")].out)
    ]
    assert {("queue", "recover", "--help"), ("session", "tail", "--help")} <= set(subcommands)
    runs = {**first, **grouped, **read_only_run(world.root, world.storage, subcommands)}
    for command, done in runs.items():
        assert done.rc == 0 and done.out.strip(), (command, done)
        assert "usage" in done.out.lower() or command == ("--version",), (command, done)
    missing = world.top / "nowhere" / "storage"
    for command in [
        ("bootstrap", "--json", "--help"),
        ("queue", "init", "--project", "newproj", "--help"),
        ("shared", "create", "newspace", "--help"),
        ("agent", "create", "-", "--help"),
        ("object", "install", str(world.manifest), "--tier", "system", "--help"),
        ("run", "--agent", "coder", "--help"),
    ]:
        done = clean(world.root.run(*command, storage=missing))
        assert done.rc == 0 and "usage" in done.out.lower(), done
    assert not (world.top / "nowhere").exists()


def _commands_listed(help_text: str) -> list[str]:
    """The command names of a click help's 'Commands:' section."""
    if "Commands:" not in help_text:
        return []
    section = help_text.split("Commands:", 1)[1]
    return [line.split()[0] for line in section.splitlines() if line.startswith("  ") and
            not line.startswith("   ")]  # fmt: skip


def test_tsh_config_read_adds_only_its_documented_log_line(world: World) -> None:
    """docs/tools.md "ctx tool": reading the tsh settings is a call of the safe core CLI, whose
    one documented trace is a ``tool_result`` line in ``tool/tsh.config.d/log`` (mode host,
    empty agent and session, root's uid): that line is the only change in the root, and
    tsh.d/config is untouched."""
    log = world.storage / "tool" / "tsh.config.d" / "log"
    before = tree(world.storage)
    old = log.read_bytes()
    done = clean(world.root.run("tool", "tsh.config", storage=world.storage))
    assert done.rc == 0 and "cache_capacity=32" in done.lines(), done
    after = tree(world.storage)
    changed = {line.split(":", 1)[0] for line in differences(before, after)}
    assert changed == {"tool/tsh.config.d/log"}, differences(before, after)
    new = log.read_bytes()
    assert new.startswith(old)
    lines = new[len(old) :].decode().splitlines()
    assert len(lines) == 1, lines
    event = json.loads(lines[0])
    assert (event["type"], event["mode"], event["uid"]) == ("tool_result", "host", 0), event
    assert event["agent"] in ("", None) and event["session"] in ("", None), event


# ============================================================ other callers, writable root


def test_storage_owner_readers_on_their_root_change_nothing(world: World) -> None:
    """The owner of a root (its host administrator, R-1) reads it as root reads root's: every
    queue, session, man and object reader exits as root's did on the same content and prints
    the same (its paths and inode numbers aside); nothing of the owner's root changes, not
    even the agent entry that names root's root (bootstrap's to rewrite, not a reader's), nor
    anything in the owner's HOME or TMPDIR."""
    owner_root = world.owner_root
    commands = every_reader(world, owner_root, world.agent.user.uid)
    owned = read_only_run(world.owner, owner_root, commands)
    compared = [c for c in commands if c[0] in ("queue", "session", "man")]
    mine = read_only_run(world.root, world.storage, compared)
    for command in compared:
        theirs, want = owned[command], mine[command]
        expected = comparable(want.out).replace(str(world.storage), str(owner_root))
        assert (theirs.rc, comparable(theirs.out)) == (want.rc, expected), (command, theirs, want)
    entry = (owner_root / "agent" / "coder").read_bytes()
    assert str(world.storage).encode() in entry


def comparable(text: str) -> str:
    """:func:`steady`, and without the inode numbers of evidence (a copy has others)."""
    return INODE_JSON.sub('"inode": N', steady(text))


def test_agent_uid_readers_change_nothing_and_refusals_name_their_errno(world: World) -> None:
    """P-5 step 1-2, S-6, X-1: the uid coder runs as, a member of the space's group, reads
    the space's queue and its own sessions as root does (same output), is refused the
    project queue it may not enter (EACCES, naming the directory), and changes nothing by
    any reader: not its torn lines, though it may write its session, nor a hint in its HOME."""
    agent = world.agent
    commands = every_reader(world, world.storage, agent.user.uid)
    runs = read_only_run(agent, world.storage, commands)
    refused = runs[("queue", "status", "--project", "proj", "--json")]
    assert refused.json()["error"] == "EACCES", refused
    assert refused.rc == 1 and refused.err.startswith("ctx: EACCES: "), refused
    assert str(world.storage / "shared" / "proj") in refused.err, refused
    for command in [
        ("queue", "status", "--project", SPACE),
        ("queue", "list", "--project", SPACE, "--state", "pending"),
        ("session", "show", "coder"),
        ("session", "show", "coder", "s2", "--project", SPACE),
        ("man", "agent"),
        ("agent", "list", "--json"),
    ]:
        mine = world.root.run(*command, storage=world.storage)
        assert (runs[command].rc, runs[command].out) == (mine.rc, mine.out), (command, mine)
    assert home_events(world.storage, agent.user.uid, "default").read_bytes().endswith(TORN["home"])


def test_outsider_readers_change_nothing_and_are_refused_with_eacces(world: World) -> None:
    """X-1, S-6, docs/queue.md: an outsider may read the manual, the agents and the tools, and
    is refused every queue and session of the root with EACCES naming the directory it may
    not enter and the way out; no reader changes anything, and nothing appears in its HOME
    or TMPDIR."""
    outsider = world.outsider
    commands = every_reader(world, world.storage, world.agent.user.uid)
    runs = read_only_run(outsider, world.storage, commands)
    for command, done in runs.items():
        if command[0] in ("queue", "session"):
            assert done.rc == 1 and done.err.startswith("ctx: EACCES: "), done
            assert "may not" in done.err, done
    for command in [
        ("man",),
        ("man", "agent"),
        ("agent", "list", "--json"),
        ("object", "which", "hello"),
    ]:
        assert runs[command].rc == 0, runs[command]


def test_readers_on_a_root_that_does_not_exist_make_nothing(world: World) -> None:
    """R-1: a reader given a storage root that does not exist — named by CTX_STORAGE, or a
    user's embedded default under XDG_DATA_HOME — says ENOENT (naming 'ctx bootstrap' or
    'ctx queue init') or, for the manual, falls back to the built-in copy with a note; it
    never makes the root, its parents or the user's data directory."""
    missing = world.top / "absent" / "storage"
    commands = [
        ("queue", "status", "--project", "proj"),
        ("queue", "list", "--project", "proj"),
        ("queue", "show", "--project", "proj", "p1"),
        ("queue", "recover", "--project", "proj", "--dry-run", "--reconcile"),
        ("session", "list", "coder"),
        ("session", "show", "coder"),
        ("policy", "explain", "coder", "tool:fs.stat", "execute"),
        ("object", "which", "fs.stat"),
        ("object", "list"),
        ("agent", "list"),
        ("agent", "show", "coder"),
        ("man", "agent"),
    ]
    for caller, some in ((world.root, commands), (world.outsider, commands[::3])):
        for command in some:
            done = clean(caller.run(*command, storage=missing))
            if command[0] == "man":
                assert done.rc == 0 and "built into ctx" in done.err, done
            else:
                assert done.rc == 1 and done.err.startswith("ctx: ENOENT: "), done
            assert not missing.parent.exists(), done
    home_before = tree(world.outsider.home)
    for command in commands[1::2]:
        clean(world.outsider.run(*command, storage=None))
    assert differences(home_before, tree(world.outsider.home)) == []
    assert not (world.outsider.home / ".local").exists()


# ============================================================ damaged or older roots


@pytest.fixture
def spare(searchable_storage: Path, tmp_path: Path) -> tuple[Path, Caller]:
    """A root of its own (the bootstrapped template with queue proj, where an agent's uid may
    reach it) and root as its caller."""
    return searchable_storage, make_caller(tmp_path, "root", None)


def test_readers_do_not_remake_missing_queue_parts(spare: tuple[Path, Caller]) -> None:
    """docs/queue.md "Configuration" and ``ctx queue init``: with queue/config removed,
    status, list and recover --dry-run note that the defaults apply and name 'ctx queue
    init', and do not write a config; with inbox/ removed they refuse with ENOENT naming the
    repair, and do not make it."""
    storage, caller = spare
    queue = storage / "shared" / "proj" / "queue"
    (queue / "config").unlink()
    readers = [
        ("queue", "status", "--project", "proj"),
        ("queue", "list", "--project", "proj", "--state", "pending"),
        ("queue", "recover", "--project", "proj", "--dry-run", "--reconcile"),
    ]
    runs = read_only_run(caller, storage, readers)
    status = runs[readers[0]]
    assert status.rc == 0 and "config is missing" in status.err, status
    assert "ctx queue init" in status.err, status
    assert not (queue / "config").exists()
    (queue / "inbox").rmdir()
    runs = read_only_run(caller, storage, [*readers, ("queue", "show", "--project", "proj", "x")])
    for done in runs.values():
        assert done.rc == 1 and done.err.startswith("ctx: ENOENT: "), done
        assert "no inbox/ directory" in done.err and "ctx queue init" in done.err, done
    assert not (queue / "inbox").exists()


def test_readers_do_not_make_a_home_or_session_for_an_agent(spare: tuple[Path, Caller]) -> None:
    """S-1, R-4: an agent that never ran has no home: session list/show/tail, agent show,
    policy explain (tool and session) and a session that holds no events.jsonl yet answer
    (empty list, ENOENT) without making the home, the session or its events.jsonl."""
    storage, caller = spare
    fresh = {"name": "fresh", "label": "fresh_t", "tools": ["fs.stat"]}
    made = caller.run("agent", "create", "-", storage=storage, stdin=json.dumps(fresh))
    assert made.rc == 0, made
    uid = json.loads((storage / "agent" / "fresh.d" / "identity").read_text())["uid"]
    readers = [
        ("session", "list", "fresh"),
        ("session", "show", "fresh"),
        ("session", "tail", "fresh", "--session", "s9"),
        ("agent", "show", "fresh"),
        ("policy", "explain", "fresh", "tool:fs.stat", "execute"),
        (
            "policy",
            "explain",
            "fresh",
            "session:default",
            "read",
            "--location",
            f"home/{uid}/agent/fresh/session",
        ),
    ]
    runs = read_only_run(caller, storage, readers)
    assert runs[readers[0]].rc == 0 and runs[readers[0]].out == "", runs[readers[0]]
    assert runs[readers[1]].rc == 1 and "ENOENT" in runs[readers[1]].err
    assert not (storage / "home" / str(uid)).exists()
    session = storage / "home" / str(uid) / "agent" / "fresh" / "session" / "idle"
    session.mkdir(parents=True)
    runs = read_only_run(caller, storage, [("session", "show", "fresh", "idle")])
    assert "has no events.jsonl" in runs[("session", "show", "fresh", "idle")].err
    assert not (session / "events.jsonl").exists()


def test_readers_leave_older_session_modes_to_repair(spare: tuple[Path, Caller]) -> None:
    """docs/sessions.md: a home session an older version made 0750 with events.jsonl 0640 is
    tightened by bootstrap and 'ctx session repair', not by show, tail or list, which leave
    both modes as they are."""
    storage, caller = spare
    agent = {"name": "old", "label": "old_t", "tools": ["fs.stat"]}
    assert caller.run("agent", "create", "-", storage=storage, stdin=json.dumps(agent)).rc == 0
    with (storage / "tool" / "fs.stat.d" / "policy").open("a") as policy:
        policy.write("allow old_t tool:fs.stat execute\n")
    ran = caller.run("run", "--agent", "old", "--native", "fs.stat", storage=storage,
                     stdin=STAT_INPUT)  # fmt: skip
    assert ran.rc == 0, ran
    uid = json.loads((storage / "agent" / "old.d" / "identity").read_text())["uid"]
    session = storage / "home" / str(uid) / "agent" / "old" / "session" / "default"
    session.chmod(0o750)
    (session / "events.jsonl").chmod(0o640)
    read_only_run(caller, storage, [
        ("session", "show", "old"), ("session", "tail", "old", "--json"),
        ("session", "list", "old"), ("agent", "show", "old"),
    ])  # fmt: skip
    assert stat.S_IMODE(session.stat().st_mode) == 0o750
    assert stat.S_IMODE((session / "events.jsonl").stat().st_mode) == 0o640


def test_tool_readers_leave_damage_and_leftovers_to_bootstrap(
    spare: tuple[Path, Caller], tmp_path: Path
) -> None:
    """docs/tools.md (no control directory or log is made up; interrupted installs are
    bootstrap's to finish or discard): with a tool's log and status removed, a user tier
    without its .install-lock and a leftover of an interrupted install in tool/, object
    list/which and policy explain report what they find and change none of it."""
    storage, caller = spare
    manifest = tool_manifest(tmp_path / "src", "hello", "#!/bin/sh\necho hi\n")
    for tier in ("system", "user"):
        assert caller.run("object", "install", manifest, "--tier", tier, storage=storage).rc == 0
    (storage / "tool" / "hello.d" / "log").unlink()
    (storage / "tool" / "hello.d" / "status").unlink()
    (storage / "home" / "0" / "tool" / ".install-lock").unlink()
    leftover = storage / "tool" / ".hello2~0123456789ab~controls"
    leftover.mkdir()
    (leftover / "name").write_text("hello2\n")
    age(leftover, 3600)
    runs = read_only_run(caller, storage, [
        ("object", "list"), ("object", "list", "--json"), ("object", "list", "--tier", "user"),
        ("object", "which", "hello"), ("object", "which", "hello2"),
        ("policy", "explain", "nobody", "tool:hello", "execute"),
    ])  # fmt: skip
    assert runs[("object", "which", "hello2")].rc == 1
    assert not (storage / "tool" / "hello.d" / "log").exists()
    assert not (storage / "home" / "0" / "tool" / ".install-lock").exists()
    assert leftover.is_dir()


def test_man_does_not_install_a_missing_or_stale_bundle(spare: tuple[Path, Caller]) -> None:
    """D-1, ``ctx man --help``: a stale installed page is shown with a note naming 'ctx
    bootstrap', not replaced; with the bundle gone the built-in copy is shown with a note,
    and no bundle is made."""
    storage, caller = spare
    docs = storage / "shared" / "cortexfs-docs"
    page = docs / "man" / "ctx.agent.md"
    page.chmod(0o644)
    with page.open("a") as text:
        text.write("\nA line this version never wrote.\n")
    page.chmod(0o444)
    stale = read_only_run(caller, storage, [("man", "agent"), ("man", "agent", "--json")])
    shown = stale[("man", "agent")]
    assert shown.out == page.read_text() and "ctx bootstrap" in shown.err, shown
    shutil.rmtree(docs)
    gone = read_only_run(caller, storage, [("man", "agent"), ("man", "README"), ("man",)])
    assert gone[("man", "agent")].rc == 0 and "built into ctx" in gone[("man", "agent")].err
    assert not docs.exists()


def test_queue_readers_do_not_block_on_or_touch_fifo_evidence(
    spare: tuple[Path, Caller],
) -> None:
    """Q-8, Q-6: FIFOs where a result, a lease and a claimed request belong are evidence of
    the wrong kind, never opened: status, list, show and recover --dry-run return at once,
    call each job a conflict, and change nothing."""
    storage, caller = spare
    q = storage / "shared" / "proj" / "queue"
    (q / "done" / "fr.req.json").write_text(REQUEST)
    os.mkfifo(q / "done" / "fr.req.json.result")
    (q / "claimed" / "fl.req.json").mkdir()
    (q / "claimed" / "fl.req.json" / "fl.req.json").write_text(REQUEST)
    (q / "lease" / "fl.req.json").mkdir()
    os.mkfifo(q / "lease" / "fl.req.json" / "worker")
    readers = [
        ("queue", "status", "--project", "proj", "--json"),
        ("queue", "list", "--project", "proj", "--state", "conflict"),
        ("queue", "show", "--project", "proj", "fr"),
        ("queue", "show", "--project", "proj", "fl", "--json"),
        ("queue", "recover", "--project", "proj", "--dry-run", "--reconcile"),
    ]
    runs = read_only_run(caller, storage, readers)
    assert runs[readers[1]].lines() == ["fl.req.json", "fr.req.json"], runs[readers[1]]
    for done in runs.values():
        assert done.rc == 1, done


def test_only_writers_rewrite_the_claim_order_hint(spare: tuple[Path, Caller]) -> None:
    """docs/queue.md "Scale": list --state pending reads this user's hint (the order of its
    next claims) and status, show and recover --dry-run leave it alone, also after a job was
    put in pending/ by hand; a recover that is not a dry run lists pending/ into it anew."""
    storage, caller = spare
    dead = subprocess.Popen(["true"])
    dead.wait()
    for name in ("a1", "a2", "a3"):
        done = caller.run("queue", "publish", "--project", "proj", "--name", name, "-",
                          storage=storage, stdin=REQUEST)  # fmt: skip
        assert done.rc == 0, done
    claimed = caller.run("queue", "claim", "--project", "proj", "--pid", str(dead.pid),
                         storage=storage)  # fmt: skip
    assert claimed.out == "a1.req.json\n", claimed
    (storage / "shared" / "proj" / "queue" / "pending" / "byhand.req.json").write_text(REQUEST)
    hints = caller.cache / "cortexfs" / "claim-order"
    assert [p for p in hints.iterdir() if not p.name.startswith(".")], "no hint was written"
    runs = read_only_run(caller, storage, [
        ("queue", "list", "--project", "proj", "--state", "pending"),
        ("queue", "status", "--project", "proj"),
        ("queue", "show", "--project", "proj", "a1"),
        ("queue", "recover", "--project", "proj", "--dry-run"),
        ("queue", "recover", "--project", "proj", "--dry-run", "--reconcile", "--json"),
    ])  # fmt: skip
    listed = runs[("queue", "list", "--project", "proj", "--state", "pending")]
    assert listed.lines() == ["a2.req.json", "a3.req.json", "byhand.req.json"], listed
    before = tree(hints)
    requeued = caller.run("queue", "recover", "--project", "proj", storage=storage)
    assert requeued.rc == 0 and "a1.req.json" in requeued.out, requeued
    assert differences(before, tree(hints)) != [], "a real recover rewrites the hint"


def holds_flock(path: Path) -> bool:
    """Whether some process holds a flock on ``path`` (``/proc/locks``), found without taking
    or trying the lock ourselves."""
    st = os.stat(path)
    where = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with open("/proc/locks") as table:
        return any(
            len(parts) > 5 and parts[1] == "FLOCK" and parts[5] == where
            for parts in (line.split() for line in table)
        )


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_recover_while_status_reads_does_not_call_an_incomplete_queue_consistent(
    spare: tuple[Path, Caller],
) -> None:
    """Q-6, docs/queue.md "Command line" (status, list and show read the queue without its
    locks) and "recover" (untouched: a pair a claim, finish or recover holds locked): a
    claim without a lease is incomplete; while ``ctx queue status`` reads the queue (held at
    its first flock for two seconds by strace, as a reader preempted or stopped there is),
    ``recover --reconcile`` exits 0 only if the queue is consistent after it."""
    storage, caller = spare
    claim = storage / "shared" / "proj" / "queue" / "claimed" / "nolease.req.json"
    claim.mkdir()
    (claim / "nolease.req.json").write_text(REQUEST)
    tracer = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=flock",
              "-e", "inject=flock:delay_exit=2000000:when=1"]  # fmt: skip
    reader = subprocess.Popen(
        [*tracer, *CTX_ARGV, "queue", "status", "--project", "proj", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=caller.env(storage),
    )  # fmt: skip
    try:
        assert wait_for(lambda: holds_flock(claim), 10), "status never took the lock"
        recovered = clean(caller.run("queue", "recover", "--project", "proj", "--reconcile",
                                     "--json", storage=storage))  # fmt: skip
        out, err = reader.communicate(timeout=30)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert reader.returncode == 0, (out, err)
    after = clean(caller.run("queue", "status", "--project", "proj", "--json", storage=storage))
    left = after.json()["counts"]["incomplete"] + after.json()["counts"]["conflict"]
    assert (recovered.rc == 0) == (left == 0), (recovered, after)
    assert recovered.json()["consistent"] is (left == 0), (recovered, after)


def test_readers_never_make_the_claim_order_cache_directory(
    spare: tuple[Path, Caller], tmp_path: Path
) -> None:
    """docs/queue.md "Scale": the hint directory is made by whoever writes a hint; root with
    an XDG_CACHE_HOME of its own that does not exist yet runs list --state pending, status,
    show and recover --dry-run, and the directory is still not there; a claim, which lists
    pending/ and starts the hint, makes it."""
    storage, caller = spare
    cache = tmp_path / "cache"  # to be made in a directory of root's (docs/queue.md)
    reader = Caller("root", None, caller.home, caller.tmp, cache)
    claim = ("queue", "claim", "--project", "proj", "--pid", str(os.getpid()))
    queue = storage / "shared" / "proj" / "queue"
    (queue / "pending" / "j0.req.json").write_text(REQUEST)
    read_only_run(reader, storage, [
        ("queue", "list", "--project", "proj", "--state", "pending"),
        ("queue", "list", "--project", "proj", "--state", "pending", "--json"),
        ("queue", "status", "--project", "proj"),
        ("queue", "show", "--project", "proj", "j0"),
        ("queue", "recover", "--project", "proj", "--dry-run", "--reconcile"),
    ], outside=False)  # fmt: skip
    assert not cache.exists()
    assert reader.run(*claim, storage=storage).out == "j0.req.json\n"
    assert (cache / "cortexfs" / "claim-order").is_dir()


# ============================================================ the read-only root


def test_read_only_root_gives_every_reader_the_writable_roots_output(world: World) -> None:
    """Bind-mounted read-only, the root answers the readers of each kind (queue status, list
    and show of jobs in every state, sessions with torn lines, policy, object, agent, man) as
    root exactly as it did writable — exit status, stdout and stderr, the stray temp file's
    age aside — and nothing changes."""
    proj = ("--project", "proj")
    commands = [
        *[c for c in every_reader(world, world.storage, 0) if "recover" not in c],
        ("queue", "status", *proj),
        ("queue", "list", *proj, "--state", "incomplete"),
        *[("queue", "show", *proj, job) for job in ("c-dead", "c-exp", "d1", "nolease")],
        ("queue", "show", *proj, "orphan", "--json"),
    ]
    writable = read_only_run(world.root, world.storage, commands)
    with read_only(world.storage):
        frozen = read_only_run(world.root, world.storage, commands)
    for command in commands:
        want, got = writable[command], frozen[command]
        assert (got.rc, steady(got.out), steady(got.err)) == (
            want.rc,
            steady(want.out),
            steady(want.err),
        ), (command, want, got)


def test_read_only_root_answers_other_callers_as_the_writable_one(world: World) -> None:
    """The same for the agent's uid and an outsider: each reader exits and prints as on the
    writable root (refusals included: EACCES, not EROFS, for what they may not enter)."""
    commands = [
        ("queue", "status", "--project", "proj"),
        ("queue", "status", "--project", SPACE, "--json"),
        ("queue", "show", "--project", SPACE, "t1"),
        ("session", "show", "coder"),
        ("session", "list", "coder", "--project", SPACE),
        ("agent", "show", "coder", "--json"),
        ("object", "which", "hello"),
        ("man", "agent"),
    ]
    for caller, some in ((world.agent, commands), (world.outsider, commands[:4])):
        writable = read_only_run(caller, world.storage, some)
        with read_only(world.storage):
            frozen = read_only_run(caller, world.storage, some)
        for command in some:
            want, got = writable[command], frozen[command]
            assert (got.rc, steady(got.out), steady(got.err)) == (
                want.rc,
                steady(want.out),
                steady(want.err),
            ), (caller.label, command, want, got)


def test_read_only_root_dry_run_predicts_the_erofs_refusals_of_the_real_run(
    world: World,
) -> None:
    """docs/queue.md "recover": --dry-run makes the checks the run makes before each move, so
    on a read-only root the requeues and repairs it planned on the writable root become
    errors — EROFS, naming the read-only filesystem, 'left as it is' — in the very words of
    the real recover there, which fails the same way and changes nothing; exit 1."""
    base = ("queue", "recover", "--project", "proj")
    with read_only(world.storage):
        runs = read_only_run(
            world.root,
            world.storage,
            [(*base, "--dry-run", "--reconcile", "--json"), (*base, "--dry-run")],
        )
        # The real runs rewrite their caller's claim-order hint (docs/queue.md): a cache of
        # their own keeps the one the readers read as it is.
        apart = writer(world)
        real_json = clean(apart.run(*base, "--reconcile", "--json", storage=world.storage))
        real_text = clean(apart.run(*base, storage=world.storage))
    dry = runs[(*base, "--dry-run", "--reconcile", "--json")].json()
    real = real_json.json()
    assert dry["requeued"] == dry["repaired"] == real["requeued"] == real["repaired"] == []
    planned = {e["job"] for e in dry["errors"]}
    assert {"c-dead.req.json", "c-exp.req.json", "nolease.req.json"} <= planned, dry
    assert [(e["job"], e["error"], e["detail"]) for e in dry["errors"]] == [
        (e["job"], e["error"], e["detail"]) for e in real["errors"]
    ], (dry, real)
    for entry in dry["errors"]:
        assert entry["error"] == "EROFS" and "read-only filesystem" in entry["detail"], entry
    dry_lines = [x for x in runs[(*base, "--dry-run")].lines() if x.startswith("error")]
    real_lines = [x for x in real_text.lines() if x.startswith("error")]
    assert dry_lines == real_lines and len(real_lines) == 2, (dry_lines, real_lines)
    assert real_text.rc == real_json.rc == 1


def test_read_only_root_refuses_every_queue_writer_with_erofs(world: World) -> None:
    """Q-1..Q-4, §2.4, docs/queue.md, docs/workers.md: publish (one, --batch, --json), claim,
    finish, renew by the holder, init of a new project and a draining worker each fail with
    EROFS naming the read-only filesystem and what was left as it was; exit 1.  ``init`` of
    the existing queue, which has nothing to make, says it is ready (exit 0)."""
    holder = str(world.holder.pid)
    two = REQUEST + "\n" + REQUEST + "\n"
    proj = ("--project", "proj")
    run = writer(world).run
    st = world.storage
    with read_only(st):
        before = tree(st)
        erofs(
            run("queue", "publish", *proj, "-", storage=st, stdin=REQUEST), "nothing was published"
        )
        erofs(run("queue", "publish", *proj, "--batch", "-", storage=st, stdin=two))
        published = run("queue", "publish", *proj, "--json", "-", storage=st, stdin=REQUEST)
        erofs(published)
        assert published.json()["error"] == "EROFS", published
        erofs(run("queue", "claim", *proj, "--pid", holder, storage=st), "stays pending")
        erofs(run("queue", "finish", *proj, "c-live", "--ok", "-", storage=st, stdin="{}"),
              "stays claimed")  # fmt: skip
        erofs(run("queue", "renew", *proj, "c-live", "--pid", holder, storage=st), "unchanged")
        erofs(run("queue", "init", "--project", "newproj", storage=st))
        again = clean(run("queue", "init", *proj, storage=st))  # nothing missing: nothing to do
        assert again.rc == 0 and again.out.endswith(" ready\n"), again
        erofs(run("queue", "work", *proj, "--agent", "coder", "--drain", storage=st),
              "no job was claimed")  # fmt: skip
        assert differences(before, tree(st)) == []


def test_read_only_root_refuses_every_other_writer_with_erofs(world: World) -> None:
    """R-5, A-3, T-8, X-1, H-3/H-4, T-3, S-5: bootstrap, agent create, object install (each
    tier), shared create of a new space, a tsh.config update, ``ctx run`` (native: a result
    frame with EROFS at stage session, the tool not run; terminal: exit 126) and the repair
    of a torn line each fail with EROFS; shared create of the complete space (nothing to make
    or repair) exits 0, and so does the repair of a session whose last line is whole
    ('nothing to do', docs/sessions.md)."""
    st = world.storage
    run = writer(world).run
    agent = json.dumps({"name": "newbie", "label": "newbie_t"})
    with read_only(st):
        before = tree(st)
        erofs(run("bootstrap", storage=st))
        erofs(run("agent", "create", "-", storage=st, stdin=agent), "nothing was installed")
        for tier in ("system", "user", f"shared:{SPACE}"):
            erofs(run("object", "install", world.manifest, "--tier", tier, storage=st))
        erofs(run("shared", "create", "newspace", storage=st))
        complete = clean(run("shared", "create", SPACE, "--group", GROUP, storage=st))
        assert complete.rc == 0, complete  # a complete space: nothing to make or repair
        erofs(run("tool", "tsh.config", "cache_capacity=64", storage=st))
        native = run("run", "--agent", "coder", "--native", "fs.stat", storage=st,
                     stdin=STAT_INPUT)  # fmt: skip
        assert native.rc == 1, native
        frame = json.loads(native.lines()[-1])
        assert (frame["type"], frame["error"]["error"], frame["error"]["stage"]) == (
            "result",
            "EROFS",
            "session",
        ), native
        erofs(run("run", "--agent", "coder", "fs.stat", "/ctx", storage=st), "did not run",
              rc=126)  # fmt: skip
        erofs(run("session", "repair", "coder", storage=st), "nothing was changed")
        erofs(run("session", "repair", "coder", "--session", "s2", "--project", SPACE,
                  storage=st))  # fmt: skip
        whole = clean(run("session", "repair", "coder", "--session", "whole", "--json",
                          storage=st))  # fmt: skip
        assert whole.rc == 0 and whole.json()["truncated_bytes"] == 0, whole
        assert differences(before, tree(st)) == []


def test_read_only_root_tsh_config_read_still_prints_the_settings(world: World) -> None:
    """docs/tools.md "ctx tool": the log line is written 'when the caller may write the log';
    on a read-only root reading the settings still prints what it prints on the writable one,
    exit 0, and the root is unchanged."""
    writable = clean(world.root.run("tool", "tsh.config", storage=world.storage))
    with read_only(world.storage):
        before = tree(world.storage)
        frozen = clean(world.root.run("tool", "tsh.config", storage=world.storage))
        assert differences(before, tree(world.storage)) == []
    assert (frozen.rc, frozen.out) == (writable.rc, writable.out) == (0, writable.out), frozen


# ============================================================ through ctx mount

WALKER = r"""
import errno, os, stat, sys, json
top = sys.argv[1]
seen = errors = 0
problems = []
for dirpath, dirnames, filenames in os.walk(top):
    for name in dirnames + filenames:
        path = os.path.join(dirpath, name)
        seen += 1
        try:
            st = os.lstat(path)
            try:
                os.listxattr(path, follow_symlinks=False)
            except OSError as exc:  # docs/mount.md: extended attributes are not provided
                if exc.errno != errno.EOPNOTSUPP:
                    raise
            if stat.S_ISLNK(st.st_mode):
                os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    f.read()
            elif stat.S_ISDIR(st.st_mode):
                os.listdir(path)
        except OSError as exc:
            errors += 1
            problems.append([os.path.relpath(path, top), exc.errno])
print(json.dumps({"seen": seen, "errors": errors, "problems": problems}))
"""


def walk_as(user: UnprivilegedUser | None, top: Path) -> dict:
    """ls, stat, listxattr, readlink and read of every entry under ``top``, as ``user``."""
    as_user = {}
    if user is not None:
        as_user = {"user": user.uid, "group": user.gid, "extra_groups": user.groups}
    done = subprocess.run(
        [sys.executable, "-I", "-c", WALKER, str(top)], capture_output=True, text=True,
        timeout=120, cwd="/", **as_user,
    )  # fmt: skip
    assert done.returncode == 0, done
    return json.loads(done.stdout)


@needs_fuse_as_root
@needs_fuse
def test_fuse_host_view_walked_and_read_changes_nothing(world: World) -> None:
    """F-1: the host's ``ctx mount`` of the root shows every area (the six root entries, the
    queue with its ignored entries, the sessions, the tiers); walking it — ls, stat, xattrs,
    readlink, reading every regular file — reads what is on disk and changes nothing in the
    root."""
    top = new_scratch_dir(SCRATCH, "fuse")
    for name in ("host", "view"):
        (top / name).mkdir()
    before = tree(world.storage)
    try:
        with serving(world.storage, top / "host"):
            seen = walk_as(None, top / "host")
            assert set(os.listdir(top / "host")) == {
                "bin", "tool", "agent", "model", "home", "shared",
            }  # fmt: skip
            pending = top / "host" / "shared" / "proj" / "queue" / "pending"
            assert (pending / "p1.req.json").read_bytes() == (
                world.queue / "pending" / "p1.req.json"
            ).read_bytes()
            assert stat.S_ISFIFO(os.lstat(pending / "fifo.req.json").st_mode)
            events = home_events(top / "host", world.agent.user.uid, "default")
            assert events.read_bytes().endswith(TORN["home"])
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert seen["seen"] >= len(before) - 1 and seen["errors"] == 0, seen
    assert differences(before, tree(world.storage)) == []


@needs_fuse_as_root
@needs_fuse
def test_fuse_agent_view_read_by_the_agent_changes_nothing(world: World) -> None:
    """F-1, T-5: coder's view (``ctx mount --as coder``), walked and read by coder's uid,
    holds its agent entry, its home with its torn session, the space it may read and the
    tools it may run; nothing of it is made persistent and the root is unchanged."""
    top = new_scratch_dir(SCRATCH, "fuse")
    for name in ("host", "view"):
        (top / name).mkdir()
    before = tree(world.storage)
    try:
        with serving(world.storage, top / "view", "--as", "coder"):
            seen = walk_as(world.agent.user, top / "view")
            view = top / "view"
            assert (view / "agent" / "coder").exists()
            assert not (view / "shared" / "proj").exists()
            events = home_events(view, world.agent.user.uid, "default")
            assert events.read_bytes().endswith(TORN["home"])
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert seen["seen"] > 10, seen
    assert differences(before, tree(world.storage)) == []


@needs_fuse_as_root
@needs_fuse
def test_fuse_mount_of_the_read_only_root_reads_and_refuses_writes_with_erofs(
    world: World,
) -> None:
    """F-1 on a read-only root: ``ctx mount`` serves it, every file reads the bytes on disk,
    and a write, a mkdir or a touch through the mount fails with EROFS; nothing changes."""
    top = new_scratch_dir(SCRATCH, "fuse")
    for name in ("host", "view"):
        (top / name).mkdir()
    try:
        with read_only(world.storage):
            before = tree(world.storage)
            with serving(world.storage, top / "host"):
                mnt = top / "host"
                seen = walk_as(None, mnt)
                policy = Path("agent/coder.d/policy")
                assert (mnt / policy).read_bytes() == (world.storage / policy).read_bytes()
                for attempt in (
                    lambda: (mnt / "shared" / SPACE / "data" / "new").write_text("x"),
                    lambda: (mnt / "shared" / SPACE / "data" / "dir").mkdir(),
                    lambda: os.utime(mnt / "tool" / "fs.stat"),
                ):
                    with pytest.raises(OSError) as refused:
                        attempt()
                    assert refused.value.errno == errno.EROFS
            assert differences(before, tree(world.storage)) == []
    finally:
        shutil.rmtree(top, ignore_errors=True)
    assert seen["errors"] == 0, seen
