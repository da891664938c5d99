"""End-to-end flows of ``ctx mount`` (SPEC §13 F-1, T-5) over a mount's lifetime, as an
administrator who keeps ``/ctx`` mounted for months meets them: the mount process SIGKILLed
while programs of an agent's uid write, fsync, publish, read and list through it (what they
get, what lies on disk, how ``ctx mount`` and ``ctx umount`` answer at the dead mount point);
``ctx umount`` and SIGTERM while another uid holds a file open and its working directory
inside; the host's view and an agent's view of one root side by side; and the storage root
moved, replaced or deleted under live mounts."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
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
    MOUNT_WAIT,
    ROOT_ENTRIES,
    ctx_run,
    mounted_at,
    needs_fuse,
    needs_fuse_as_root,
    new_scratch_dir,
    request,
    scratch_top,
    serving,
    wait_for,
)
from tests.support.users import UnprivilegedUser, find_or_create_user

SCRATCH = scratch_top(__file__)
AGENT, SPACE, HIDDEN = "coder", "team", "secret"

pytestmark = [needs_fuse_as_root, needs_fuse]  # a mount serving other uids needs root

# ------------------------------------------------------------------------------ helpers


@dataclass
class World:
    """A storage root with spaces ``team`` (agent ``coder`` may read and write it) and
    ``secret`` (not granted), both of the test user's group; ``coder`` runs as that user,
    whose home ``home/<uid>/`` exists.  ``top`` is a directory every uid may search, where
    mount points and the programs' reports go."""

    top: Path
    storage: Path
    user: UnprivilegedUser
    template: Path

    @property
    def home(self) -> Path:
        return self.storage / "home" / str(self.user.uid)

    def mountpoint(self, name: str) -> Path:
        path = self.top / name
        path.mkdir(mode=0o755, exist_ok=True)
        return path


def make_world(
    template: Path, storage: Path, user: UnprivilegedUser, *, grant_hidden: bool
) -> None:
    """A root made by ``ctx bootstrap`` (a copy of the suite's) at ``storage``, with the two
    spaces made by ``ctx shared create`` and agent ``coder`` by ``ctx agent create``."""
    shutil.copytree(template, storage, symlinks=True)
    for space in (SPACE, HIDDEN):
        r = ctx_run("shared", "create", space, "--group", str(user.gid), "--storage", storage)
        assert r.rc == 0, r
    shared = {SPACE: ["read", "write"]}
    if grant_hidden:
        shared[HIDDEN] = ["read"]
    req = {"name": AGENT, "label": f"{AGENT}_t", "tools": [], "shared": shared}
    r = ctx_run(
        "agent", "create", "--storage", storage, "--user", user.name, "-", input=json.dumps(req)
    )
    assert r.rc == 0, r
    home = storage / "home" / str(user.uid)  # made by the host (docs/sessions.md)
    home.mkdir(mode=0o755)
    os.chown(home, user.uid, user.gid)


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH)
    make_world(_template, top / "storage", user, grant_hidden=False)
    yield World(top, top / "storage", user, _template)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        where = line.split()[4]
        if where.startswith(str(top) + "/"):
            subprocess.run(["umount", "-l", where], check=False)
    shutil.rmtree(top, ignore_errors=True)


class Programs:
    """Processes a test starts (each in its own session), killed at the end."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def start(self, argv: list[str], user: UnprivilegedUser | None = None, **kw):
        if user is not None:
            kw.update(user=user.uid, group=user.gid, extra_groups=[user.gid])
        kw.setdefault("stdin", subprocess.DEVNULL)
        kw.setdefault("env", {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"})
        proc = subprocess.Popen(argv, start_new_session=True, **kw)
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                proc.communicate(timeout=10)


@pytest.fixture
def programs() -> Iterator[Programs]:
    running = Programs()
    yield running
    running.stop_all()


def as_user(user: UnprivilegedUser, script: str, *args: str) -> subprocess.CompletedProcess:
    """A Python ``script`` run as ``user`` with its own group only (the agent's identity)."""
    return subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        user=user.uid, group=user.gid, extra_groups=[user.gid],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def errno_of(action) -> str:
    """``"ok"``, or the errno name ``action()`` failed with."""
    try:
        action()
    except OSError as e:
        return errno.errorcode[e.errno]
    return "ok"


def mount_options(where: Path) -> tuple[str, set[str]]:
    """(filesystem type, its super options) of the mount at ``where`` (proc(5) mountinfo)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        if fields[4] == str(where):
            kind = fields.index("-") + 1
            return fields[kind], set(fields[kind + 2].split(","))
    raise AssertionError(f"{where} is not mounted")


# Programs of the agent's uid that work through its view until the mount dies.  Each writes
# one line per step it has completed to its report file, and at the end the errno it met.
WRITER = """
import errno, os, sys
path, report = sys.argv[1], open(sys.argv[2], "w")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
i = 0
try:
    while True:
        os.write(fd, b"record %06d %s\\n" % (i, b"x" * 100))
        os.fsync(fd)  # F-1: once this returns, the record is on the storage root
        print(i, file=report, flush=True)
        i += 1
except OSError as e:
    print(errno.errorcode[e.errno], file=report, flush=True)
"""

READER = """
import errno, hashlib, os, sys
path, digest, report = sys.argv[1], sys.argv[2], open(sys.argv[3], "w")
try:
    while True:
        with open(path, "rb") as f:
            seen = hashlib.sha256(f.read()).hexdigest()
        print("same" if seen == digest else "DIFFERENT", file=report, flush=True)
except OSError as e:
    print(errno.errorcode[e.errno], file=report, flush=True)
"""

LISTER = """
import errno, os, sys
path, report = sys.argv[1], open(sys.argv[2], "w")
try:
    while True:
        names = os.listdir(path)
        print("complete" if {"big.bin", "kept.txt"} <= set(names) else names,
              file=report, flush=True)
except OSError as e:
    print(errno.errorcode[e.errno], file=report, flush=True)
"""

# Publishes job after job through the view with `ctx queue publish --queue`; each name is
# reported once the command said it was published (Q-1: durable once it returns).
PUBLISHER = """
i=0
while "$CTX" queue publish --queue "$QUEUE" --name "j$i" "$REQUEST" >/dev/null 2>"$ERR"; do
    echo "j$i.req.json" >> "$REPORT"
    i=$((i + 1))
done
"""


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


# ------------------------------------------------------------------------ the tests


def test_an_agents_view_killed_mid_work_keeps_what_was_fsynced_and_is_removed_once_free(
    world: World, programs: Programs
):
    """F-1 (durability after ``fsync``, ``ctx umount``) with T-5 and Q-1: while programs of
    the agent's uid append and fsync records in its home, publish jobs with ``ctx queue
    publish``, read and list a space through ``ctx mount --as coder``, the mount process is
    SIGKILLed. Each program then fails with ENOTCONN (ECONNABORTED for a request in flight)
    instead of hanging; every record whose fsync returned and every job whose publish
    returned is on the storage root; ``ctx mount`` there says ENOTCONN and names ``ctx
    umount``; ``ctx umount`` is EBUSY while a process keeps its working directory in the dead
    mount, and removes it once that process is gone; a new view on the same mount point
    serves the same bytes."""
    user, storage = world.user, world.storage
    data = storage / "shared" / SPACE / "data"
    big = os.urandom(1 << 20)
    (data / "big.bin").write_bytes(big)
    (data / "kept.txt").write_text("kept\n")
    for name in ("big.bin", "kept.txt"):
        os.chown(data / name, 0, user.gid)
        (data / name).chmod(0o640)
    digest = hashlib.sha256(big).hexdigest()
    req = world.top / "request.json"
    req.write_text(json.dumps(request("fs.read", tag="through-the-view")))
    req.chmod(0o644)
    reports = world.top / "reports"
    reports.mkdir(mode=0o777)
    reports.chmod(0o777)

    view = world.mountpoint("view")
    vhome = view / "home" / str(user.uid)
    vdata = view / "shared" / SPACE / "data"
    with serving(storage, view, "--as", AGENT) as mount:
        assert as_user(user, "import os,sys; print(os.listdir(sys.argv[1]))", vdata).returncode == 0
        env = {
            "PATH": "/usr/bin:/bin",
            "LC_ALL": "C",
            "CTX": CTX_ARGV[0],
            "QUEUE": str(view / "shared" / SPACE / "queue"),
            "REQUEST": str(req),
            "REPORT": str(reports / "published"),
            "ERR": str(reports / "publish.err"),
        }
        py = [sys.executable, "-c"]
        writer = programs.start([*py, WRITER, vhome / "journal.log", reports / "written"], user)
        reader = programs.start([*py, READER, vdata / "big.bin", digest, reports / "read"], user)
        lister = programs.start([*py, LISTER, vdata, reports / "listed"], user)
        publisher = programs.start(["sh", "-c", PUBLISHER], user, env=env)
        holder = programs.start(["sleep", "600"], user, cwd=vdata)
        working = (writer, reader, lister, publisher)
        assert wait_for(
            lambda: (
                len(lines(reports / "written")) >= 30
                and len(lines(reports / "published")) >= 3
                and len(lines(reports / "read")) >= 3
                and len(lines(reports / "listed")) >= 3
            ),
            20,
        ), [p.poll() for p in working]
        assert all(p.poll() is None for p in working)

        mount.proc.send_signal(signal.SIGKILL)
        mount.proc.wait(timeout=10)
        # Every program meets the dead mount and ends, none waits forever.
        for proc in working:
            proc.wait(timeout=15)
        written, read = lines(reports / "written"), lines(reports / "read")
        listed, published = lines(reports / "listed"), lines(reports / "published")
        # ENOTCONN, or ECONNABORTED for the request the kernel had sent when the daemon died.
        dead = {"ENOTCONN", "ECONNABORTED"}
        assert written[-1] in dead, written[-3:]
        assert read[-1] in dead and set(read[:-1]) == {"same"}, read[-3:]
        assert listed[-1] in dead and set(listed[:-1]) == {"complete"}, listed[-3:]
        said = (reports / "publish.err").read_text()
        assert said.startswith(("ctx: ENOTCONN: ", "ctx: ECONNABORTED: ")), said
        assert holder.poll() is None

        # The mount point: still in the table, every access ENOTCONN.
        assert mounted_at(view)
        assert errno_of(lambda: os.listdir(view)) == "ENOTCONN"
        again = ctx_run("mount", "--storage", storage, "--as", AGENT, view, timeout=30)
        assert again.rc == 1, again
        assert again.err.startswith("ctx: ENOTCONN: "), again
        assert f"ctx umount {view}" in again.err, again
        busy = ctx_run("umount", view, timeout=30)
        assert busy.rc == 1, busy
        assert busy.err.startswith("ctx: EBUSY: "), busy
        assert "Device or resource busy" in busy.err, busy  # the system's reason
        assert mounted_at(view)

        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        done = ctx_run("umount", view, timeout=30)
        assert done.rc == 0, done
        assert not mounted_at(view) and os.listdir(view) == []

    # Durable: every record whose fsync returned, every job whose publish returned.
    count = len(written) - 1
    on_disk = (world.home / "journal.log").read_bytes().splitlines()
    assert len(on_disk) in (count, count + 1), (len(on_disk), count)
    assert on_disk[:count] == [b"record %06d %s" % (i, b"x" * 100) for i in range(count)]
    st = (world.home / "journal.log").stat()
    assert (st.st_uid, st.st_gid) == (user.uid, user.gid)
    pending = storage / "shared" / SPACE / "queue" / "pending"
    assert set(published) <= set(os.listdir(pending)), (published, os.listdir(pending))
    for job in published:
        assert json.loads((pending / job).read_text())["tag"] == "through-the-view"
    recovered = ctx_run("queue", "recover", "--project", SPACE, "--storage", storage)
    assert recovered.rc == 0, recovered

    # A new view on the same mount point: the same bytes, and it takes writes again.
    with serving(storage, view, "--as", AGENT):
        shown = as_user(
            user,
            "import os, sys; h, q = sys.argv[1:]; "
            "print(len(open(h + '/journal.log', 'rb').read().splitlines()), "
            "len(os.listdir(q)))",
            vhome,
            view / "shared" / SPACE / "queue" / "pending",
        )
        assert shown.stdout.split() == [str(len(on_disk)), str(len(os.listdir(pending)))], shown


# Runs as the second uid with its working directory and a file open in the mount; does one
# step per line it reads and reports what each call gave.
HOLDER = """
import errno, json, os, sys
os.chdir(sys.argv[1])
fd = os.open("held.txt", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
os.write(fd, b"before\\n")
print("ready", flush=True)
for line in sys.stdin:
    said = {}
    for name, call in (("write", lambda: os.write(fd, line.encode())),
                       ("list", lambda: os.listdir(".")), ("getcwd", os.getcwd),
                       ("fstat", lambda: os.fstat(fd))):
        try:
            call()
            said[name] = "ok"
        except OSError as e:
            said[name] = errno.errorcode[e.errno]
    print(json.dumps(said), flush=True)
"""


def test_umount_is_ebusy_and_sigterm_detaches_while_another_uid_works_in_the_mount(
    world: World, programs: Programs
):
    """F-1 and docs/mount.md as root serving every uid: the mount is ``fuse.cortexfs`` with
    ``allow_other`` and ``default_permissions``, so a second uid gets the kernel's mode-bit
    answers (EACCES on a 0600 root file and in ``tool/``, its own uid and umask on what it
    makes); while that uid keeps a file open and its working directory inside, ``ctx umount``
    is EBUSY with the system's reason and changes nothing; SIGTERM then ends ``ctx mount``
    with exit 0 and nothing left in the mount table, a new mount on the same point serves at
    once, and the holder's next calls fail with ENOTCONN instead of hanging."""
    user, storage = world.user, world.storage
    where = world.mountpoint("ctx")
    with serving(storage, where) as mount:
        kind, options = mount_options(where)
        assert kind == "fuse.cortexfs", kind
        assert {"allow_other", "default_permissions", "user_id=0"} <= options, options

        data = where / "shared" / SPACE / "data"
        (data / "root-only").write_text("root\n")
        (data / "root-only").chmod(0o600)
        (data / "group-read").write_text("group\n")
        (data / "group-read").chmod(0o640)
        checks = as_user(
            user,
            textwrap.dedent(
                """
                import errno, json, os, sys
                data, tool, home = sys.argv[1:]
                def code(f):
                    try:
                        f()
                        return "ok"
                    except OSError as e:
                        return errno.errorcode[e.errno]
                os.umask(0o027)
                out = {
                    "root_only": code(lambda: open(data + "/root-only").read()),
                    "group_read": open(data + "/group-read").read(),
                    "in_tool": code(lambda: open(tool + "/mine", "w")),
                    "tsh_config": code(lambda: open(tool + "/tsh.d/config").read()),
                    "mine": code(lambda: open(home + "/mine", "w").write("x")),
                    "in_space": code(lambda: os.mkdir(data + "/made", 0o777)),
                }
                print(json.dumps(out))
                """
            ),
            data,
            where / "tool",
            where / "home" / str(user.uid),
        )
        assert checks.returncode == 0, checks.stderr
        assert json.loads(checks.stdout) == {
            "root_only": "EACCES",
            "group_read": "group\n",
            "in_tool": "EACCES",
            "tsh_config": "ok",
            "mine": "ok",
            "in_space": "ok",
        }
        mine = (world.home / "mine").stat()
        assert (mine.st_uid, mine.st_gid, stat.S_IMODE(mine.st_mode)) == (
            user.uid,
            user.gid,
            0o640,
        )
        made = (storage / "shared" / SPACE / "data" / "made").stat()
        # the caller's umask; the setgid space's group and bit
        assert stat.S_IMODE(made.st_mode) == 0o2750 and made.st_gid == user.gid

        holder = programs.start(
            [sys.executable, "-c", HOLDER, where / "home" / str(user.uid)],
            user,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout.readline() == "ready\n"

        def step(text: str) -> dict:
            holder.stdin.write(text + "\n")
            holder.stdin.flush()
            return json.loads(holder.stdout.readline())

        busy = ctx_run("umount", where, timeout=30)
        assert busy.rc == 1, busy
        assert busy.err.startswith(f"ctx: EBUSY: cannot unmount {where}: "), busy
        assert "Device or resource busy" in busy.err, busy
        assert mounted_at(where) and mount.proc.poll() is None
        assert set(os.listdir(where)) == ROOT_ENTRIES
        assert step("during") == dict.fromkeys(("write", "list", "getcwd", "fstat"), "ok")

        mount.proc.send_signal(signal.SIGTERM)
        assert mount.proc.wait(timeout=MOUNT_WAIT) == 0, mount.said()
        assert not mounted_at(where)
        assert os.listdir(where) == []  # the bare directory again
        held = world.home / "held.txt"
        assert held.read_text() == "before\nduring\n"
        assert (held.stat().st_uid, held.stat().st_gid) == (user.uid, user.gid)

        # The same mount point serves again at once, while the holder still sits in the old one.
        with serving(storage, where):
            assert (where / "home" / str(user.uid) / "held.txt").read_text() == "before\nduring\n"
            after = step("after")
            assert set(after.values()) <= {"ENOTCONN", "ECONNABORTED"}, after
            holder.stdin.close()
            assert holder.wait(timeout=10) == 0
        assert held.read_text() == "before\nduring\n"


def write_through(directory: Path, name: str, text: str) -> None:
    """``directory/name`` replaced as an editor saves it: temp file, fsync, rename."""
    temp = directory / f".{name}.new"
    with open(temp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    shutil.copystat(directory / name, temp)
    os.rename(temp, directory / name)


AGENT_STEPS = """
import errno, json, os, sys
view, uid, step = sys.argv[1], sys.argv[2], sys.argv[3]
def code(f):
    try:
        return f()
    except OSError as e:
        return errno.errorcode[e.errno]
out = {"shared": sorted(os.listdir(view + "/shared"))}
data = view + "/shared/team/data"
if step == "first":
    out["from_host"] = code(lambda: open(data + "/from-host").read())
    with open(view + "/home/" + uid + "/from-agent", "w") as f:
        f.write("agent wrote this\\n")
    with open(data + "/agent-report", "w") as f:
        f.write("for the team\\n")
out["plans"] = code(lambda: open(view + "/shared/secret/data/plans").read())
print(json.dumps(out))
"""


def test_the_hosts_view_and_an_agents_view_of_one_root_serve_side_by_side(world: World):
    """F-1 and T-5 with two mounts of one root: what the host writes through its view shows in
    the agent's view (``--as coder``) and what the agent writes shows in the host's, with the
    agent's uid and the space's group; a grant added to the agent's policy through the host's
    view shows the space in the agent's view within a second, and its removal hides it again;
    ``ctx umount`` of the host's view leaves the agent's view serving; both processes exit
    0 and nothing written to build the projection is left on the storage root."""
    user, storage = world.user, world.storage
    secret = storage / "shared" / HIDDEN / "data" / "plans"
    secret.write_text("classified\n")
    os.chown(secret, 0, user.gid)
    secret.chmod(0o640)
    host, view = world.mountpoint("host"), world.mountpoint("agent")
    before = {p.relative_to(storage) for p in storage.rglob("*")}

    def agent(step: str) -> dict:
        done = as_user(user, AGENT_STEPS, view, user.uid, step)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    with serving(storage, host) as host_mount, serving(storage, view, "--as", AGENT) as mine:
        (host / "shared" / SPACE / "data" / "from-host").write_text("host wrote this\n")
        (host / "shared" / SPACE / "data" / "from-host").chmod(0o644)
        seen = agent("first")
        assert seen == {
            "shared": ["cortexfs-docs", SPACE],
            "from_host": "host wrote this\n",
            "plans": "ENOENT",
        }, seen
        # The agent's writes, seen through the host's view: its uid, the space's group.
        mine_st = (host / "home" / str(user.uid) / "from-agent").stat()
        assert (mine_st.st_uid, mine_st.st_gid) == (user.uid, user.gid)
        report = host / "shared" / SPACE / "data" / "agent-report"
        assert report.read_text() == "for the team\n"
        assert (report.stat().st_uid, report.stat().st_gid) == (user.uid, user.gid)
        assert set(os.listdir(host / "shared")) == {"cortexfs-docs", "proj", SPACE, HIDDEN}

        # A grant edited through the host's view reaches the agent's view within a second.
        controls = host / "agent" / f"{AGENT}.d"
        policy = (controls / "policy").read_text()
        write_through(controls, "policy", policy + f"allow {AGENT}_t shared:{HIDDEN} read\n")
        assert wait_for(lambda: agent("again")["plans"] == "classified\n", 1.5), agent("again")
        assert agent("again")["shared"] == sorted(["cortexfs-docs", SPACE, HIDDEN])
        write_through(controls, "policy", policy)
        assert wait_for(lambda: agent("again")["plans"] == "ENOENT", 1.5), agent("again")
        assert agent("again")["shared"] == ["cortexfs-docs", SPACE]

        # Ending the host's view leaves the agent's serving.
        done = ctx_run("umount", host, timeout=30)
        assert done.rc == 0, done
        assert host_mount.proc.wait(timeout=MOUNT_WAIT) == 0
        assert not mounted_at(host) and mounted_at(view)
        assert agent("again")["shared"] == ["cortexfs-docs", SPACE]
        mine.proc.send_signal(signal.SIGTERM)
        assert mine.proc.wait(timeout=MOUNT_WAIT) == 0, mine.said()
    assert not mounted_at(view)
    after = {p.relative_to(storage) for p in storage.rglob("*")}
    home = Path("home") / str(user.uid)
    data = Path("shared") / SPACE / "data"
    assert after - before == {home / "from-agent", data / "from-host", data / "agent-report"}


LOOK = """
import errno, json, os, sys
view, uid = sys.argv[1], sys.argv[2]
def code(f):
    try:
        return f()
    except OSError as e:
        return errno.errorcode[e.errno]
print(json.dumps({
    "root": code(lambda: sorted(os.listdir(view))),
    "shared": code(lambda: sorted(os.listdir(view + "/shared"))),
    "note": code(lambda: open(view + "/home/" + uid + "/note").read()),
    "plans": code(lambda: open(view + "/shared/secret/data/plans").read()),
}))
"""


def agent_looks(world: World, view: Path) -> dict:
    done = as_user(world.user, LOOK, view, world.user.uid)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_storage_root_moved_away_and_back_then_deleted_under_live_mounts(world: World):
    """F-1 and docs/mount.md (a view stays mounted and fail-closed whatever happens to the
    agent's controls): the storage root renamed under a host view and an agent view: the host
    view goes on serving the same directory (its writes land in the renamed root), ``ctx
    mount`` of the old path is ENOENT, the agent view is empty with the documented warning,
    and shows its entries again within a second of the rename back, with a note. The root
    then deleted: the host view lists nothing and makes nothing, and ``ctx umount`` still
    ends both mounts with exit 0."""
    user, storage = world.user, world.storage
    (world.home / "note").write_text("mine\n")
    os.chown(world.home / "note", user.uid, user.gid)
    moved = world.top / "storage.moved"
    host, view = world.mountpoint("host"), world.mountpoint("agent")
    full = {
        "root": sorted(ROOT_ENTRIES),
        "shared": ["cortexfs-docs", SPACE],
        "note": "mine\n",
        "plans": "ENOENT",
    }
    with serving(storage, host) as hmount, serving(storage, view, "--as", AGENT) as amount:
        assert agent_looks(world, view) == full
        os.rename(storage, moved)
        # The host's view follows the directory it serves.
        assert set(os.listdir(host)) == ROOT_ENTRIES
        (host / "shared" / SPACE / "data" / "while-moved").write_text("x\n")
        assert (moved / "shared" / SPACE / "data" / "while-moved").read_text() == "x\n"
        elsewhere = world.mountpoint("elsewhere")
        refused = ctx_run("mount", "--storage", storage, elsewhere, timeout=30)
        assert refused.rc == 1 and refused.err.startswith("ctx: ENOENT: storage root "), refused
        assert not mounted_at(elsewhere)
        # The agent's view: empty while its controls cannot be read, and says so.
        empty = {"root": [], "shared": "ENOENT", "note": "ENOENT", "plans": "ENOENT"}
        assert wait_for(lambda: agent_looks(world, view) == empty, 1.5), agent_looks(world, view)
        warning = f"ctx mount: warning: agent {AGENT}'s view is empty until it is repaired: ENOENT"
        assert wait_for(lambda: warning in amount.said(), 1), amount.said()
        assert amount.proc.poll() is None and mounted_at(view)

        os.rename(moved, storage)
        assert wait_for(lambda: agent_looks(world, view) == full, 1.5), agent_looks(world, view)
        note = f"ctx mount: note: agent {AGENT}'s view shows its entries again"
        assert wait_for(lambda: note in amount.said(), 1), amount.said()

        # Deleted under the mounts: nothing to show, nothing made, the daemons still answer.
        shutil.rmtree(storage)
        assert os.listdir(host) == []
        assert errno_of(lambda: os.listdir(host / "shared")) == "ENOENT"
        assert errno_of(lambda: (host / "home" / "x").write_text("x")) == "ENOENT"
        assert wait_for(lambda: agent_looks(world, view)["root"] == [], 1.5)
        for mount in (hmount, amount):
            done = ctx_run("umount", mount.where, timeout=30)
            assert done.rc == 0, done
            assert mount.proc.wait(timeout=MOUNT_WAIT) == 0, mount.said()
            assert not mounted_at(mount.where)
    assert not storage.exists() and not moved.exists()


def test_a_storage_root_replaced_at_its_path_does_not_lend_its_grants_to_a_live_view(
    world: World,
):
    """F-1 and T-5: an agent's view shows only what the authority chain of the storage root
    it serves lets it see. When the administrator moves the root aside and bootstraps a new
    one at its path (where ``coder`` is granted ``shared:secret read``), the live view still
    serves the old tree: that tree's ``secret`` space, never granted there, must stay hidden
    (or the view go empty), not be shown under the new root's policy."""
    user, storage = world.user, world.storage
    plans = storage / "shared" / HIDDEN / "data" / "plans"
    plans.write_text("classified in the old root\n")
    os.chown(plans, 0, user.gid)
    plans.chmod(0o640)
    view = world.mountpoint("agent")
    with serving(storage, view, "--as", AGENT):
        assert agent_looks(world, view)["plans"] == "ENOENT"
        os.rename(storage, world.top / "storage.old")
        make_world(world.template, storage, user, grant_hidden=True)
        # Within two seconds (the projection's half second and the kernel's, twice over) the
        # old tree's secret space must never show.
        leaked = wait_for(lambda: agent_looks(world, view)["plans"] != "ENOENT", 2)
        seen = agent_looks(world, view)
    assert not leaked, seen
    assert seen["plans"] == "ENOENT" and HIDDEN not in seen["shared"], seen
