"""End-to-end flows of a mounted ``/ctx`` (SPEC §13 F-1, T-5, §5) while the administrator
changes things underneath it: an agent's view (``ctx mount --as coder``) beside the host's
view, with programs of the agent's uid holding files open for reading and writing when the
agent's policy is edited to deny (the descriptor already open against the next open), a tool
switched off, removed and reinstalled while mounted, a space and an agent created while
mounted, writes fsynced through the view read directly on the storage root, and browsing
with ``ls``, ``find``, ``cat`` and ``stat`` that leaves nothing behind, even while the agent's
entry is briefly broken.  What ordinary programs (``cat``, ``ls``, Python's ``open``) meet is
checked as the errno they report."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    MOUNT_WAIT,
    ROOT_ENTRIES,
    clean_env,
    ctx_run,
    mounted_at,
    needs_fuse,
    needs_fuse_as_root,
    new_scratch_dir,
    scratch_top,
    serving,
    tool_manifest,
    wait_for,
    write_durably,
)
from tests.support.users import UnprivilegedUser, find_or_create_user

SCRATCH = scratch_top(__file__)
AGENT, LABEL = "coder", "coder_t"
SPACE, HIDDEN = "team", "secret"
TOOL = "demo.greet"
# docs/mount.md: the mount keeps an answer half a second, the kernel half a second more.
WITHIN = 3.0

pytestmark = [needs_fuse_as_root, needs_fuse]  # a mount serving other uids needs root

# ------------------------------------------------------------------------------ helpers


@dataclass
class World:
    """A storage root with spaces ``team`` (granted read and write to agent ``coder``) and
    ``secret`` (not granted), both of the test user's group, agent ``coder`` running as that
    user, whose home exists; ``top`` is searchable by every uid and holds the mount points."""

    top: Path
    storage: Path
    user: UnprivilegedUser

    @property
    def home(self) -> Path:
        return self.storage / "home" / str(self.user.uid)

    @property
    def policy(self) -> Path:
        return self.storage / "agent" / f"{AGENT}.d" / "policy"

    def mountpoint(self, name: str) -> Path:
        path = self.top / name
        path.mkdir(mode=0o755, exist_ok=True)
        return path

    def ctx(self, *args, **kw):
        kw.setdefault("env", clean_env(CTX_STORAGE=str(self.storage)))
        return ctx_run(*args, **kw)

    def edit_policy(self, drop: list[str] = (), add: list[str] = ()) -> None:
        """The administrator's edit of ``agent/coder.d/policy`` on the storage root: a whole
        new file renamed into place, as an editor saves it."""
        rules = [line for line in self.policy.read_text().splitlines() if line not in drop]
        rules += add
        write_durably(self.policy.parent, "policy", ("\n".join(rules) + "\n").encode())
        self.policy.chmod(0o644)


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH)
    storage = top / "storage"
    shutil.copytree(_template, storage, symlinks=True)
    for space in (SPACE, HIDDEN):
        r = ctx_run("shared", "create", space, "--group", str(user.gid), "--storage", storage)
        assert r.rc == 0, r
    req = {"name": AGENT, "label": LABEL, "tools": [], "shared": {SPACE: ["read", "write"]}}
    r = ctx_run(
        "agent", "create", "--storage", storage, "--user", user.name, "-", input=json.dumps(req)
    )
    assert r.rc == 0, r
    home = storage / "home" / str(user.uid)  # R-4, made by the host (docs/sessions.md)
    home.mkdir(mode=0o755)
    os.chown(home, user.uid, user.gid)
    try:
        yield World(top, storage, user)
    finally:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            where = line.split()[4]
            if where.startswith(str(top) + "/"):
                subprocess.run(["umount", "-l", where], check=False)
        shutil.rmtree(top, ignore_errors=True)


def sh(argv: list, user: UnprivilegedUser | None = None, cwd: Path | None = None):
    """``argv`` as root, or as ``user`` with its own group only (the agent's identity)."""
    ids = {}
    if user is not None:
        ids = {"user": user.uid, "group": user.gid, "extra_groups": [user.gid]}
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"},
        timeout=60,
        **ids,
    )


# A program of the agent's uid that keeps descriptors open between the test's steps: one JSON
# command a line on stdin, one JSON answer a line on stdout ({"ok": ...} or {"err": ERRNO}).
DRIVER = r"""
import errno, json, os, sys
fds = {}
FLAGS = {"r": os.O_RDONLY, "a": os.O_WRONLY | os.O_APPEND, "w": os.O_WRONLY | os.O_CREAT,
         "d": os.O_RDONLY | os.O_DIRECTORY}
def step(op, *a):
    if op == "open":
        if a[0] in fds:  # asked again (a test waiting for a refusal): one descriptor a key
            os.close(fds.pop(a[0]))
        fds[a[0]] = os.open(a[1], FLAGS[a[2]], 0o640)
        return True
    if op == "pread":
        return os.pread(fds[a[0]], 1 << 16, 0).decode()
    if op == "write":
        return os.write(fds[a[0]], a[1].encode())
    if op == "fsync":
        os.fsync(fds[a[0]])
        return True
    if op == "fstat":
        st = os.fstat(fds[a[0]])
        return [st.st_size, st.st_uid]
    if op == "listfd":
        return sorted(os.listdir(fds[a[0]]))
    if op == "ftruncate":
        os.ftruncate(fds[a[0]], a[1])
        return True
    if op == "close":
        os.close(fds.pop(a[0]))
        return True
    if op == "read":
        with open(a[0]) as f:
            return f.read()
    if op == "create":
        with open(a[0], "x") as f:
            f.write(a[1])
        return True
    if op == "listdir":
        return sorted(os.listdir(a[0]))
    if op == "chdir":
        os.chdir(a[0])
        return True
    raise ValueError(op)
for line in sys.stdin:
    try:
        out = {"ok": step(*json.loads(line))}
    except OSError as e:
        out = {"err": errno.errorcode[e.errno]}
    print(json.dumps(out), flush=True)
"""


class Driver:
    """:data:`DRIVER` running as the agent's uid."""

    def __init__(self, user: UnprivilegedUser) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DRIVER],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            user=user.uid, group=user.gid, extra_groups=[user.gid], start_new_session=True,
        )  # fmt: skip

    def __call__(self, *command):
        self.proc.stdin.write(json.dumps([str(c) if isinstance(c, Path) else c for c in command]))
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        return answer["ok"] if "ok" in answer else answer["err"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.communicate(timeout=10)


@pytest.fixture
def drivers(world: World) -> Iterator[list[Driver]]:
    started: list[Driver] = []
    yield started
    for driver in started:
        driver.stop()


def errno_of(action) -> str:
    try:
        action()
    except OSError as e:
        return errno.errorcode[e.errno]
    return "ok"


def facts(top: Path) -> dict[str, tuple]:
    """Each entry under ``top`` (links not followed): type and mode, owner, size, mtime,
    ctime and content: what any write, chmod, chown or new file would change."""
    seen = {}
    for path in [top, *sorted(top.rglob("*"))]:
        st = path.lstat()
        content = path.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        seen[str(path.relative_to(top))] = (
            st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_ctime_ns, content,
        )  # fmt: skip
    return seen


def tools_in(view: Path) -> set[str]:
    return {name for name in os.listdir(view / "tool") if not name.endswith(".d")}


# ------------------------------------------------------------------------ the tests


def test_descriptors_open_before_a_grant_is_revoked_keep_working_the_next_open_is_refused(
    world: World, drivers
):
    """F-1, T-5, P-5 step 5 and docs/mount.md: a program of the agent's uid holds files of
    the space open for reading and appending when the administrator takes ``shared:team
    write`` out of the agent's policy: within a second the next open for writing (Python,
    ``sh >>``, ``touch``) is EACCES while ``cat`` still reads; taking ``read`` out as well hides
    the space (``cat``/``ls``: No such file or directory, ENOENT) even relative to a working
    directory inside it.  The descriptors opened before go on as on a local disk (permission
    is checked at open), what they fsync is on the storage root, and the grant restored
    lets the next open in again."""
    user, storage = world.user, world.storage
    data_disk = storage / "shared" / SPACE / "data"
    (data_disk / "spec").write_text("the spec\n")
    os.chown(data_disk / "spec", 0, user.gid)
    (data_disk / "spec").chmod(0o664)
    view = world.mountpoint("agent")
    data = view / "shared" / SPACE / "data"
    rw = [f"allow {LABEL} shared:{SPACE} write"]
    ro = [f"allow {LABEL} shared:{SPACE} read"]
    prog = Driver(user)
    drivers.append(prog)
    with serving(storage, view, "--as", AGENT) as mount:
        assert prog("create", data / "log", "opened\n") is True
        assert prog("open", "w", data / "log", "a") is True
        assert prog("open", "r", data / "spec", "r") is True
        assert prog("open", "dir", data, "d") is True
        assert prog("chdir", data) is True
        assert prog("write", "w", "before the revoke\n") == 18 and prog("fsync", "w") is True
        assert (data_disk / "log").read_text() == "opened\nbefore the revoke\n"

        world.edit_policy(drop=rw)
        assert wait_for(lambda: prog("open", "w2", data / "log", "a") == "EACCES", WITHIN)
        assert prog("create", data / "new", "x") == "EACCES"
        appended = sh(["sh", "-c", f"echo more >> {data / 'log'}"], user)
        assert appended.returncode != 0 and "Permission denied" in appended.stderr, appended
        touched = sh(["touch", data / "fresh"], user)
        assert touched.returncode == 1 and "Permission denied" in touched.stderr, touched
        assert sh(["cat", data / "spec"], user).stdout == "the spec\n"
        # The descriptor opened for writing before the revoke still writes, durably.
        assert prog("write", "w", "after write was revoked\n") == 24
        assert prog("fsync", "w") is True
        assert (data_disk / "log").read_text().endswith("after write was revoked\n")
        assert not (data_disk / "new").exists() and not (data_disk / "fresh").exists()

        world.edit_policy(drop=ro)
        assert wait_for(lambda: prog("read", data / "spec") == "ENOENT", WITHIN)
        assert wait_for(lambda: SPACE not in prog("listdir", view / "shared"), WITHIN)
        cat = sh(["cat", data / "spec"], user)
        assert cat.returncode == 1 and "No such file or directory" in cat.stderr, cat
        listed = sh(["ls", view / "shared" / SPACE], user)
        assert listed.returncode == 2 and "No such file or directory" in listed.stderr, listed
        # Relative to the working directory inside: the kernel may answer from the entry it
        # keeps for "spec" below it until that entry's half second is over (docs/mount.md).
        assert wait_for(lambda: prog("read", "spec") == "ENOENT", WITHIN)
        assert prog("open", "r2", "spec", "r") == "ENOENT"
        # What was open before stays usable through its descriptor.
        assert prog("pread", "r") == "the spec\n"
        assert prog("fstat", "r") == [9, 0]
        assert prog("write", "w", "after read was revoked\n") == 23
        assert prog("fsync", "w") is True
        assert (data_disk / "log").read_text() == (
            "opened\nbefore the revoke\nafter write was revoked\nafter read was revoked\n"
        )
        # Root, through the same view, is held to the same projection.
        assert errno_of(lambda: (data / "spec").read_text()) == "ENOENT"

        world.edit_policy(add=ro + rw)
        assert wait_for(lambda: prog("open", "w3", data / "log", "a") is True, WITHIN)
        assert prog("write", "w3", "granted again\n") == 14 and prog("fsync", "w3") is True
        assert sh(["cat", data / "log"], user).stdout.endswith("granted again\n")
        assert sorted(prog("listfd", "dir")) == ["log", "spec"]
        for key in ("w", "w3", "r", "dir"):
            assert prog("close", key) is True
        prog.stop()
        done = ctx_run("umount", view, timeout=30)
        assert done.rc == 0, done
        assert mount.proc.wait(timeout=MOUNT_WAIT) == 0, mount.said()
    log = data_disk / "log"
    assert (log.stat().st_uid, log.stat().st_gid) == (user.uid, user.gid)
    assert sorted(p.name for p in data_disk.iterdir()) == ["log", "spec"]


def test_a_tool_switched_off_removed_and_reinstalled_while_both_views_are_mounted(
    world: World, drivers
):
    """F-1, T-5, T-8 and docs/tools.md (*status*, *Removing a projected tool*): a tool both
    policies allow is listed and runs through the agent's view; ``disabled`` in its status
    takes it out of the agent's listing within a second (ENOENT for ``cat``/``ls``) but not
    the host's, ``available`` brings it back; ``rm tool/T && rm -r tool/T.d`` takes it out of
    both (a description held open stays readable); reinstalled while mounted it is back in
    the host's view at once but not in the agent's, since its own policy went with ``T.d/``."""
    user, storage = world.user, world.storage
    manifest = tool_manifest(world.top / "src", TOOL, "#!/bin/sh\necho hello from greet\n")
    r = world.ctx("object", "install", "--tier", "system", manifest)
    assert r.rc == 0, r
    world.edit_policy(add=[f"allow {LABEL} tool:{TOOL} execute"])
    tool_policy = storage / "tool" / f"{TOOL}.d" / "policy"
    with open(tool_policy, "a") as policy:
        policy.write(f"allow {LABEL} tool:{TOOL} execute\n")
    status = storage / "tool" / f"{TOOL}.d" / "status"
    host, view = world.mountpoint("host"), world.mountpoint("agent")
    prog = Driver(user)
    drivers.append(prog)
    with serving(storage, host), serving(storage, view, "--as", AGENT):
        assert wait_for(lambda: tools_in(view) == {TOOL}, WITHIN), os.listdir(view / "tool")
        ran = sh([view / "tool" / TOOL], user)
        assert (ran.returncode, ran.stdout) == (0, "hello from greet\n"), ran
        description = view / "tool" / f"{TOOL}.d" / "description"
        assert prog("open", "desc", description, "r") is True
        said = prog("pread", "desc")
        assert said.strip() == f"The {TOOL} test tool."

        write_durably(status.parent, "status", b"disabled\n")
        assert wait_for(lambda: TOOL not in tools_in(view), WITHIN)
        assert wait_for(lambda: not os.path.lexists(view / "tool" / TOOL), WITHIN)
        cat = sh(["cat", description], user)
        assert cat.returncode == 1 and "No such file or directory" in cat.stderr, cat
        listed = sh(["ls", view / "tool" / f"{TOOL}.d"], user)
        assert listed.returncode == 2 and "No such file or directory" in listed.stderr, listed
        assert {TOOL, f"{TOOL}.d"} <= set(os.listdir(host / "tool"))
        shown = {t["name"]: t for t in world.ctx("object", "list", "--json").json()}
        assert shown[TOOL]["status"] == "disabled", shown[TOOL]
        write_durably(status.parent, "status", b"available\n")
        assert wait_for(lambda: tools_in(view) == {TOOL}, WITHIN)

        # Removed as docs/tools.md says: the executable first, then its control directory.
        os.unlink(storage / "tool" / TOOL)
        shutil.rmtree(storage / "tool" / f"{TOOL}.d")
        assert wait_for(lambda: not ({TOOL, f"{TOOL}.d"} & set(os.listdir(host / "tool"))), 1)
        assert wait_for(lambda: tools_in(view) == set(), WITHIN)
        # The kernel may keep the name's entry half a second (docs/mount.md, *Names*).
        assert wait_for(lambda: errno_of(lambda: os.stat(host / "tool" / TOOL)) == "ENOENT", 1)
        gone = sh(["sh", "-c", '"$0"', view / "tool" / TOOL], user)
        assert gone.returncode == 127 and "not found" in gone.stderr, gone
        assert prog("pread", "desc") == said  # docs/mount.md, *Open files*
        assert prog("close", "desc") is True

        r = world.ctx("object", "install", "--tier", "system", manifest)
        assert r.rc == 0, r
        assert wait_for(lambda: TOOL in os.listdir(host / "tool"), 1)
        fresh = (host / "tool" / f"{TOOL}.d" / "policy").read_text().splitlines()
        assert not [line for line in fresh if line.startswith("allow")], fresh
        time.sleep(1.2)  # longer than both caches: the agent's own rule alone grants nothing
        assert tools_in(view) == set()
        assert errno_of(lambda: os.stat(view / "tool" / TOOL)) == "ENOENT"
        with open(tool_policy, "a") as policy:
            policy.write(f"allow {LABEL} tool:{TOOL} execute\n")
        assert wait_for(lambda: tools_in(view) == {TOOL}, WITHIN)
        ran = sh([view / "tool" / TOOL], user)
        assert (ran.returncode, ran.stdout) == (0, "hello from greet\n"), ran


def test_a_space_and_an_agent_created_while_mounted_then_written_and_fsynced_through_the_view(
    world: World,
):
    """F-1, X-1, T-5, R-2 and docs/mount.md *Durability*, *Ownership*: ``ctx shared create
    lab`` and ``ctx agent create reviewer`` while both views are mounted show at once in the
    host's view; the agent's view shows neither (the space: ENOENT until ``shared:lab read``
    and ``write`` are granted, within a second; the other agent: never).  What the agent then
    writes there (``dd conv=fsync``, Python with ``fsync`` of file and directory, a rename
    into place) is, once ``fsync`` returns and before the file is closed, byte for byte on
    the storage root, the agent's uid and the space's group, and the same in the host's view."""
    user, storage = world.user, world.storage
    host, view = world.mountpoint("host"), world.mountpoint("agent")
    lab_disk = storage / "shared" / "lab" / "data"
    writer = r"""
import os, sys
data, storage_data = sys.argv[1], sys.argv[2]
fd = os.open(data + "/results.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
os.write(fd, b"\x00\xffresults" * 4096)
os.fsync(fd)
# F-1: once fsync returned, the write is on the storage root, with the file still open.
with open(storage_data + "/results.bin", "rb") as direct:
    print(direct.read() == b"\x00\xffresults" * 4096)
os.close(fd)
tmp = data + "/summary.tmp"
with open(tmp, "w") as f:
    f.write("summary v1\n")
    f.flush()
    os.fsync(f.fileno())
os.rename(tmp, data + "/summary.txt")
dfd = os.open(data, os.O_RDONLY | os.O_DIRECTORY)
os.fsync(dfd)
os.close(dfd)
print(open(storage_data + "/summary.txt").read() == "summary v1\n")
"""
    with serving(storage, host), serving(storage, view, "--as", AGENT):
        assert sorted(os.listdir(view / "shared")) == ["cortexfs-docs", SPACE]
        r = world.ctx("shared", "create", "lab", "--group", str(user.gid))
        assert r.rc == 0, r
        req = {"name": "reviewer", "label": "reviewer_t", "tools": []}
        r = world.ctx("agent", "create", "-", input=json.dumps(req))
        assert r.rc == 0, r
        assert wait_for(lambda: "lab" in os.listdir(host / "shared"), 1)
        assert {"tool", "data", "queue"} <= set(os.listdir(host / "shared" / "lab"))
        assert {"reviewer", "reviewer.d"} <= set(os.listdir(host / "agent"))
        assert set(os.listdir(host)) == ROOT_ENTRIES and set(os.listdir(view)) == ROOT_ENTRIES
        time.sleep(1.2)  # longer than both caches: neither is the agent's to see
        assert "lab" not in os.listdir(view / "shared")
        listed = sh(["ls", view / "shared" / "lab"], user)
        assert listed.returncode == 2 and "No such file or directory" in listed.stderr, listed
        assert set(os.listdir(view / "agent")) == {AGENT, f"{AGENT}.d"}
        assert errno_of(lambda: os.stat(view / "agent" / "reviewer.d")) == "ENOENT"

        world.edit_policy(add=[f"allow {LABEL} shared:lab read"])
        assert wait_for(lambda: "lab" in os.listdir(view / "shared"), WITHIN)
        refused = sh(["touch", view / "shared" / "lab" / "data" / "early"], user)
        assert refused.returncode == 1 and "Permission denied" in refused.stderr, refused
        world.edit_policy(add=[f"allow {LABEL} shared:lab write"])
        data = view / "shared" / "lab" / "data"
        assert wait_for(lambda: sh(["touch", data / "hello"], user).returncode == 0, WITHIN)

        dd = sh(["dd", "if=/dev/urandom", f"of={data / 'random.bin'}", "bs=64k", "count=4",
                 "conv=fsync", "status=none"], user)  # fmt: skip
        assert dd.returncode == 0, dd.stderr
        wrote = sh([sys.executable, "-c", writer, data, lab_disk], user)
        assert (wrote.returncode, wrote.stdout) == (0, "True\nTrue\n"), wrote.stderr
        for name in ("random.bin", "results.bin", "summary.txt", "hello"):
            disk, seen = lab_disk / name, host / "shared" / "lab" / "data" / name
            st, through = disk.stat(), seen.stat()
            assert (st.st_uid, st.st_gid) == (user.uid, user.gid), name
            assert (through.st_ino, through.st_size, through.st_mtime_ns) == (
                st.st_ino, st.st_size, st.st_mtime_ns,
            ), name  # fmt: skip
            assert seen.read_bytes() == disk.read_bytes() == (data / name).read_bytes()
        assert (lab_disk / "random.bin").stat().st_size == 4 * 65536
        assert stat.S_IMODE((lab_disk / "results.bin").stat().st_mode) == 0o640
        assert not (lab_disk / "summary.tmp").exists() and not (lab_disk / "early").exists()
    made = sorted(p.name for p in lab_disk.iterdir())
    assert made == ["hello", "random.bin", "results.bin", "summary.txt"]


BROWSE = r"""
set -u
v=$1 uid=$2
ls -laR "$v" > /dev/null 2>&1
find "$v" -ls > /dev/null 2>&1
find "$v" -type f -readable -exec cat {} + > /dev/null 2>&1
du -s "$v" > /dev/null 2>&1
stat "$v/shared/secret" "$v/agent/reviewer" > /dev/null 2>&1
for p in "$v/shared/secret/data/plans" "$v/tool/fs.write" "$v/agent/coder.d/identity" \
         "$v/home/0" "$v/tool/.hidden" "$v/nothing"; do
    cat "$p" > /dev/null 2>&1; test -e "$p"; ls "$p" > /dev/null 2>&1
done
ls "$v/home" "$v/shared/team/data" "$v/agent"
"""


def test_browsing_the_agents_view_writes_nothing_even_while_its_entry_is_broken(world: World):
    """F-1 and T-5 (a projection computed in memory, no persistent file as a side effect) with
    docs/mount.md (fail-closed, still mounted, while ``agent/coder`` cannot be read): the
    agent's uid and root browse the view with ``ls -laR``, ``find``, ``cat``, ``du`` and
    ``stat``, hidden names answering ENOENT; the administrator then moves ``agent/coder``
    away: the view's root lists nothing, ``cat`` of the agent's own note is ENOENT, the
    mount warns and goes on serving; moved back, it shows its entries again with a note.
    No file, mode, owner, size or time on the storage root changes, and nothing is made
    beside it."""
    user, storage = world.user, world.storage
    (world.home / "note").write_text("mine\n")
    os.chown(world.home / "note", user.uid, user.gid)
    plans = storage / "shared" / HIDDEN / "data" / "plans"
    plans.write_text("classified\n")
    os.chown(plans, 0, user.gid)
    plans.chmod(0o640)
    view = world.mountpoint("agent")
    note = view / "home" / str(user.uid) / "note"
    time.sleep(0.05)  # so that anything touched later has another time
    before = facts(storage)
    beside = sorted({*os.listdir(world.top), "agent", "agent.stderr"})
    with serving(storage, view, "--as", AGENT) as mount:
        browsed = sh(["sh", "-c", BROWSE, "sh", view, user.uid], user)
        assert browsed.returncode == 0, browsed.stderr
        assert browsed.stdout.split("\n\n") == [
            f"{view}/agent:\n{AGENT}\n{AGENT}.d",
            f"{view}/home:\n{user.uid}",
            f"{view}/shared/team/data:\n",
        ], browsed.stdout
        sh(["sh", "-c", BROWSE, "sh", view, user.uid])  # root, through the same view
        cat = sh(["cat", view / "shared" / HIDDEN / "data" / "plans"], user)
        assert cat.returncode == 1 and "No such file or directory" in cat.stderr, cat
        assert sh(["cat", note], user).stdout == "mine\n"
        for hidden in ("shared/secret", "tool/fs.write", "agent/ci", "home/0", "model/x"):
            assert errno_of(lambda h=hidden: (view / h).read_bytes()) == "ENOENT", hidden
        assert errno_of(lambda: (view / "tool" / "planted").write_text("x")) == "EACCES"
        assert errno_of(lambda: os.mkdir(view / "extra")) == "EACCES"

        entry = storage / "agent" / AGENT
        os.rename(entry, world.top / "coder.aside")
        assert wait_for(lambda: os.listdir(view) == [], WITHIN), os.listdir(view)
        assert wait_for(lambda: sh(["cat", note], user).returncode == 1, WITHIN)
        cat = sh(["cat", note], user)
        assert "No such file or directory" in cat.stderr, cat
        assert errno_of(lambda: (view / "home" / str(user.uid) / "x").write_text("x")) in (
            "ENOENT",
            "EACCES",
        )
        listed = sh(["ls", "-A", view], user)
        assert (listed.returncode, listed.stdout) == (0, ""), listed
        sh(["sh", "-c", BROWSE, "sh", view, user.uid], user)
        warning = f"ctx mount: warning: agent {AGENT}'s view is empty until it is repaired: "
        assert wait_for(lambda: warning in mount.said(), 1), mount.said()
        assert mount.proc.poll() is None and mounted_at(view)

        os.rename(world.top / "coder.aside", entry)
        assert wait_for(lambda: set(os.listdir(view)) == ROOT_ENTRIES, WITHIN)
        assert wait_for(lambda: sh(["cat", note], user).stdout == "mine\n", WITHIN)
        back = f"ctx mount: note: agent {AGENT}'s view shows its entries again"
        assert wait_for(lambda: back in mount.said(), 1), mount.said()
        sh(["sh", "-c", BROWSE, "sh", view, user.uid], user)
    after = facts(storage)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    # Only the admin's own rename touched the agent/ directory (and the entry's ctime).
    assert changed <= {"agent", f"agent/{AGENT}"}, changed
    assert sorted(os.listdir(world.top)) == beside


def test_the_agents_mount_grant_or_label_taken_away_leaves_bin_and_tsh_alone(world: World, drivers):
    """F-1, T-5, P-5 steps 3-5 and docs/tools.md (without ``mount:ctx read`` the view shows
    ``bin/`` and ``tool/tsh.d/`` alone): the administrator takes ``allow coder_t mount:ctx
    read`` out of the agent's policy, and later changes the agent's ``label`` so that none of
    its rules names it; each time, within a second, the agent's home and space are gone
    (``cat``: No such file or directory) while the root keeps its six entries, and each
    repair brings them back. A file of the home held open for appending keeps its writes
    throughout, all of them on the storage root after ``fsync``."""
    user, storage = world.user, world.storage
    (world.home / "journal").write_text("")
    os.chown(world.home / "journal", user.uid, user.gid)
    (storage / "shared" / SPACE / "data" / "board").write_text("team board\n")
    view = world.mountpoint("agent")
    journal = view / "home" / str(user.uid) / "journal"
    board = view / "shared" / SPACE / "data" / "board"
    mount_rule = f"allow {LABEL} mount:ctx read"
    label = storage / "agent" / f"{AGENT}.d" / "label"
    prog = Driver(user)
    drivers.append(prog)
    full = {
        "root": sorted(ROOT_ENTRIES),
        "bin": sorted(os.listdir(storage / "bin")),
        "tool": ["tsh.d"],
        "home": [str(user.uid)],
        "shared": ["cortexfs-docs", SPACE],
        "agent": [AGENT, f"{AGENT}.d"],
    }
    bare = {**full, "home": [], "shared": [], "agent": []}

    def seen() -> dict:
        return {
            "root": prog("listdir", view),
            **{k: prog("listdir", view / k) for k in ("bin", "tool", "home", "shared", "agent")},
        }

    with serving(storage, view, "--as", AGENT):
        assert seen() == full
        assert prog("open", "j", journal, "a") is True
        for n, (cut, repair) in enumerate(
            [
                (
                    lambda: world.edit_policy(drop=[mount_rule]),
                    lambda: world.edit_policy(add=[mount_rule]),
                ),
                (
                    lambda: write_durably(label.parent, "label", b"intruder_t\n"),
                    lambda: write_durably(label.parent, "label", f"{LABEL}\n".encode()),
                ),
            ]
        ):
            cut()
            assert wait_for(lambda: seen()["shared"] == [], WITHIN), seen()
            assert wait_for(lambda: prog("read", board) == "ENOENT", WITHIN)
            assert seen() == bare, seen()
            # A name the kernel looked up may be kept half a second more (docs/mount.md).
            assert wait_for(lambda: sh(["cat", journal], user).returncode == 1, WITHIN)
            cat = sh(["cat", journal], user)
            assert "No such file or directory" in cat.stderr, cat
            assert prog("write", "j", f"while cut {n}\n") == 12 and prog("fsync", "j") is True
            repair()
            assert wait_for(lambda: seen() == full, WITHIN), seen()
            assert wait_for(lambda: prog("read", board) == "team board\n", WITHIN)
            assert prog("write", "j", f"repaired {n}\n") == 11 and prog("fsync", "j") is True
            assert sh(["cat", journal], user).stdout.endswith(f"repaired {n}\n")
        assert prog("close", "j") is True
    assert (world.home / "journal").read_text() == (
        "while cut 0\nrepaired 0\nwhile cut 1\nrepaired 1\n"
    )


def test_write_and_ftruncate_on_one_descriptor_answer_alike_after_a_revoke(world: World, drivers):
    """F-1 (writes are checked with the same chain) and docs/mount.md (*Open files*: a file
    stays usable through its descriptor with ``write`` and ``ftruncate`` alike): once
    ``shared:team write`` is revoked, a descriptor the agent opened for writing before
    either goes on changing the file's content with both calls or with neither; ``write``
    appending while ``ftruncate`` on the same descriptor is EACCES is neither."""
    user, storage = world.user, world.storage
    view = world.mountpoint("agent")
    data = view / "shared" / SPACE / "data"
    prog = Driver(user)
    drivers.append(prog)
    with serving(storage, view, "--as", AGENT):
        assert prog("create", data / "draft", "0123456789\n") is True
        assert prog("open", "w", data / "draft", "a") is True
        world.edit_policy(drop=[f"allow {LABEL} shared:{SPACE} write"])
        assert wait_for(lambda: prog("open", "w2", data / "draft", "a") == "EACCES", WITHIN)
        answers = {"write": prog("write", "w", "more\n"), "ftruncate": prog("ftruncate", "w", 4)}
        prog("close", "w")  # w2 was never opened: its open was refused
    on_disk = (storage / "shared" / SPACE / "data" / "draft").read_text()
    served = {"write": 5, "ftruncate": True}
    refused = {"write": "EACCES", "ftruncate": "EACCES"}
    assert answers in (served, refused), answers
    assert on_disk == ("0123" if answers == served else "0123456789\n"), on_disk


RUNNING = """#!/bin/sh
echo started
while [ ! -e "$GO" ]; do sleep 0.05; done
echo finished
"""


def test_a_tool_running_when_its_grant_is_revoked_finishes_the_next_exec_is_refused(
    world: World, drivers
):
    """F-1, T-5 and P-6 (executes are checked with the same chain): the agent's uid starts a
    tool through its view (``/ctx/tool/T`` run as a file, T-2); while it runs, the
    administrator takes the tool's rule out of the agent's policy.  The running tool, whose
    script the shell still reads through its descriptor, finishes with its output; within a
    second the tool leaves the listing and the next exec is refused (``sh``: not found, 127;
    Python: ENOENT) while ``ctx run`` refuses it at step 5; put back, it runs again."""
    user, storage = world.user, world.storage
    manifest = tool_manifest(world.top / "src", TOOL, RUNNING)
    r = world.ctx("object", "install", "--tier", "system", manifest)
    assert r.rc == 0, r
    rule = f"allow {LABEL} tool:{TOOL} execute"
    world.edit_policy(add=[rule])
    with open(storage / "tool" / f"{TOOL}.d" / "policy", "a") as policy:
        policy.write(rule + "\n")
    go = world.top / "go"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C", "GO": str(go)}
    view = world.mountpoint("agent")
    tool = view / "tool" / TOOL
    with serving(storage, view, "--as", AGENT):
        assert wait_for(lambda: tools_in(view) == {TOOL}, WITHIN)
        running = subprocess.Popen(
            [str(tool)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
            stdin=subprocess.DEVNULL, user=user.uid, group=user.gid, extra_groups=[user.gid],
            start_new_session=True,
        )  # fmt: skip
        try:
            assert running.stdout.readline() == "started\n"
            world.edit_policy(drop=[rule])
            assert wait_for(lambda: TOOL not in tools_in(view), WITHIN)
            assert wait_for(lambda: not os.path.lexists(tool), WITHIN)
            again = sh(["sh", "-c", '"$0"', tool], user)
            assert again.returncode == 127 and "not found" in again.stderr, again
            assert errno_of(lambda: subprocess.run([str(tool)], user=user.uid)) == "ENOENT"
            refused = world.ctx("run", "--agent", AGENT, TOOL)
            assert refused.rc == 126 and "EACCES: step 5 " in refused.err, refused
            go.touch()
            out, err = running.communicate(timeout=30)
            assert (running.returncode, out) == (0, "finished\n"), err
        finally:
            if running.poll() is None:
                os.killpg(running.pid, signal.SIGKILL)
                running.communicate()
        world.edit_policy(add=[rule])
        assert wait_for(lambda: os.access(tool, os.X_OK), WITHIN)
        ran = subprocess.run([str(tool)], capture_output=True, text=True, env=env, timeout=30,
                             user=user.uid, group=user.gid, extra_groups=[user.gid])  # fmt: skip
        assert (ran.returncode, ran.stdout) == (0, "started\nfinished\n"), ran
