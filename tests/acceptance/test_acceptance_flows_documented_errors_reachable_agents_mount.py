"""Every documented refusal of agents, terminals, shared spaces, ctxmcp, the manual bundle and
the mount is reachable, with the documented errno, exit status and nothing left half-done.

SPEC ids: §7 H-1, H-2, H-3, H-4 (tsh, ``ctx tool``, ``tsh.config``); §8 A-1, A-2, A-3, A-4,
A-5 (``ctx agent create|start|stop|watch|attach``, ctxterm, the terminal socket and the run
socket, ``agent.create``, ``agent.update``); §9 X-1, X-2 (``ctx shared create``); §10 M-1 to
M-4 (``ctxmcp``); §12 D-1 (``ctx man``, ``ctx bootstrap SOURCE``); §13 F-1 (``ctx mount``,
``ctx umount``).  Docs: docs/mount.md (the mount point rules, ``ctx umount``, *What each view
shows*, *Not provided*), docs/tools.md (*Agents, host side*, *The agent terminal*, *ctx tool*,
*MCP servers as tool sources*, *ctx bootstrap*), docs/sessions.md (*Commands*, *Shared
spaces*) and the ``--help`` texts of ``ctx agent create|start|stop``, ``ctx shared create``,
``ctx mount``, ``ctx umount``, ``ctx man`` and ``ctxmcp``.

The angle: each sentence of those texts saying that an input or a situation is refused, or
giving its errno or exit status, is provoked as a user provokes it (limits, option values, a
second start, a stop of what does not run, a file or directory in the way, another uid), and
the answer is checked: the errno word in the message (and in ``--json`` where the command has
it), the exact exit status, and that nothing is left half-done: no process, mount or ``/run``
entry of the refused command, and the storage root unchanged where the refusal changes
nothing."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    alive,
    clean_env,
    ctx_run,
    kill_processes_of,
    mounted_at,
    new_scratch_dir,
    processes_of,
    read_jsonl,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, CoderHost, Raw, Term, coder_host
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

TOP = scratch_top(__file__)
BIN = Path(CTX_ARGV[0]).parent
REPO = BIN.parents[1]
CTXMCP = [str(BIN / "ctxmcp")]
PYTHON = sys.executable
RUN_BASE = Path("/run/cortexfs/terminal")
ROOT_ENTRIES = {"bin", "tool", "agent", "model", "home", "shared"}
WAIT = 15.0

needs_fuse = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/fuse"), reason="needs root and /dev/fuse"
)
needs_terminal = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (other uids)")


# ------------------------------------------------------------------------------ helpers


def as_user(
    user: UnprivilegedUser,
    argv: list,
    *,
    env: dict[str, str] | None = None,
    stdin: str | bytes = b"",
    timeout: float = 30,
) -> Run:
    """``argv`` run as ``user`` (no supplementary group), in ``/``."""
    done = subprocess.run(
        [str(a) for a in argv],
        input=stdin.encode() if isinstance(stdin, str) else stdin,
        capture_output=True,
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        env=env if env is not None else clean_env(HOME="/nonexistent"),
        cwd="/",
        timeout=timeout,
    )
    return Run(
        [str(a) for a in argv],
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


def ctx_as(
    user: UnprivilegedUser, *args, storage: Path | None = None, stdin: str = "", timeout=30
) -> Run:
    """``ctx ARGS`` as ``user``, on ``storage`` (``CTX_STORAGE``) when given."""
    env = clean_env(HOME="/nonexistent")
    if storage is not None:
        env["CTX_STORAGE"] = str(storage)
    return as_user(user, [*CTX_ARGV, *args], env=env, stdin=stdin, timeout=timeout)


def ctxmcp(*args, stdout=subprocess.PIPE, timeout: float = 30) -> Run:
    argv = [*CTXMCP, *map(str, args)]
    done = subprocess.run(
        argv, input=b"", stdout=stdout, stderr=subprocess.PIPE, env=clean_env(), timeout=timeout
    )
    out = done.stdout.decode("utf-8", "replace") if done.stdout is not None else ""
    return Run(argv, done.returncode, out, done.stderr.decode("utf-8", "replace"))


def refused(run: Run, errno_name: str, status: int, prog: str = "ctx") -> None:
    """``run`` ended with ``status`` and said ``PROG: ERRNO: …`` on standard error."""
    assert run.rc == status, run
    assert f"{prog}: {errno_name}: " in run.err, run


def refused_json(run: Run, errno_name: str, status: int, prog: str = "ctx") -> None:
    """As :func:`refused`, for a ``--json`` run: its stdout is the error object too."""
    refused(run, errno_name, status, prog)
    assert run.json()["error"] == errno_name, run


def modes(top: Path) -> dict[str, tuple]:
    """Owner, group and mode of ``top`` and of every entry below it (links not followed)."""
    found = {".": _mode_of(top)}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            found[str(path.relative_to(top))] = _mode_of(path)
    return found


def _mode_of(path: Path) -> tuple:
    status = path.lstat()
    return status.st_uid, status.st_gid, status.st_mode


def mounts_under(top: Path, kind: str | None = None) -> list[str]:
    """The mount points of this machine at or below ``top`` (of filesystem type ``kind``)."""
    prefix = str(top).rstrip("/")
    with open("/proc/self/mountinfo") as table:
        entries = [line.split() for line in table]
    return [
        fields[4]
        for fields in entries
        if (fields[4] == prefix or fields[4].startswith(prefix + "/"))
        and (kind is None or fields[fields.index("-") + 1] == kind)
    ]


def unmount_under(top: Path) -> None:
    """Unmount what a test left mounted below its own directory ``top``, deepest first."""
    cortexfs = set(mounts_under(top, "fuse.cortexfs"))
    for point in sorted(set(mounts_under(top)), key=len, reverse=True):
        if point in cortexfs:
            ctx_run("umount", point, timeout=30)
        if mounted_at(Path(point)):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def bind(source: Path, target: Path) -> None:
    """``source`` bind-mounted at ``target``, made here; skips where that is not allowed."""
    target.mkdir(exist_ok=True)
    made = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {made.stderr.decode().strip()}")


def remove_empty_directories(top: Path) -> None:
    """``top`` and the directories below it that are empty, deepest first (what a test made
    in ``/run/cortexfs/terminal`` for its own storage root, and nothing else, is removed)."""
    if not top.is_dir() or top.is_symlink():
        return
    for dirpath, _, _ in sorted(os.walk(top), key=lambda entry: -len(entry[0])):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)


def root_key(storage: Path) -> str:
    """The storage root's key in ``/run/cortexfs/terminal`` (docs/tools.md)."""
    return hashlib.sha256(os.fsencode(os.path.realpath(storage))).hexdigest()[:16]


def children_of(pid: int) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[1]) == pid:
                found.append(int(entry))
    return found


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@dataclass(repr=False)
class World(OnStorage):
    """A copy of the bootstrapped root in a scratch directory every uid may search."""

    top: Path
    storage: Path

    def agent(self, request: dict, *options: str) -> dict:
        return self.create_agent(request, *options)

    def everything(self) -> dict:
        return snapshot(self.storage)


@pytest.fixture(scope="session")
def template() -> Iterator[Path]:
    """One root made by ``ctx bootstrap`` per test process, copied for each world."""
    top = new_scratch_dir(TOP, "template-")
    root = top / "storage"
    made = ctx_run("bootstrap", "--storage", root)
    assert made.rc == 0, made
    yield root
    shutil.rmtree(top, ignore_errors=True)


@contextlib.contextmanager
def new_world(template: Path) -> Iterator[World]:
    top = new_scratch_dir(TOP)
    world = World(top, copy_of_root(template, top / "storage"))
    try:
        yield world
    finally:
        unmount_under(top)
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def world(template: Path) -> Iterator[World]:
    with new_world(template) as made:
        yield made


@pytest.fixture(scope="module")
def host(template: Path) -> Iterator[CoderHost]:
    """Agent ``coder`` (uid ``nobody``) allowed ``fs.read`` in both policies, with a
    workspace holding ``notes.txt``; agent ``up`` allowed ``agent.update`` and
    ``agent.create``, ``tsh`` and ``fs.read`` in both policies and ``agent:kid`` and
    ``agent:kid2`` create, where the sessions of an earlier agent ``kid2`` remain.  Its
    terminals are stopped at the end."""
    if os.geteuid() != 0:
        pytest.skip("needs root (agents run as another uid)")
    runtime: list[Path] = []
    try:
        with coder_host(template, TOP, ["fs.read"], {"notes.txt": "a note\n"}) as made:
            runtime.append(RUN_BASE / root_key(made.storage))
            made.grant_in_tool("fs.read")
            tools = ["agent.update", "agent.create", "tsh", "fs.read"]
            made.create_agent({"name": "up", "label": "up_t", "tools": tools})
            made.allow_tool("up_t", *tools)
            with (made.storage / "agent" / "up.d" / "policy").open("a") as policy:
                policy.write("allow up_t agent:kid create\nallow up_t agent:kid2 create\n")
            sessions = made.storage / "home" / str(made.uid) / "agent" / "kid2" / "session"
            (sessions / "old").mkdir(parents=True)
            try:
                yield made
            finally:
                unmount_under(runtime[0])
    finally:
        for directory in runtime:  # this root's runtime directories, once its terminals ended
            remove_empty_directories(directory)


def agent_user(host: CoderHost) -> UnprivilegedUser:
    return UnprivilegedUser("coder", host.uid, host.gid)


# ====================================================================== §13 ctx mount


def _missing_point(w: World):
    return [], w.top / "absent", ()


def _file_point(w: World):
    point = w.top / "file"
    point.write_text("not a directory\n")
    return [], point, ()


def _full_point(w: World):
    point = w.top / "full"
    point.mkdir()
    (point / "kept.txt").write_text("kept\n")
    return [], point, ()


def _point_inside(w: World):
    point = w.storage / "home" / "mp"
    point.mkdir()
    return [], point, ()


def _point_below_bound_root(w: World):
    (w.storage / "home" / "mp").mkdir()
    bind(w.storage, w.top / "bound")
    return [], w.top / "bound" / "home" / "mp", ()


def _missing_root(w: World):
    (w.top / "mp").mkdir()
    return ["--storage", w.top / "missing-root"], w.top / "mp", ()


def _not_a_root(w: World):
    plain = w.top / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("no root here\n")
    (w.top / "mp").mkdir()
    return ["--storage", plain], w.top / "mp", ()


def _unknown_agent(w: World):
    (w.top / "mp").mkdir()
    return ["--as", "ghost"], w.top / "mp", ()


def _unreadable_identity(w: World):
    w.agent({"name": "coder", "label": "coder_t"})
    (w.storage / "agent" / "coder.d" / "identity").write_text('{"uid": 65534')
    (w.top / "mp").mkdir()
    return ["--as", "coder"], w.top / "mp", ()


def _no_dev_fuse(w: World):
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1)")
    (w.top / "mp").mkdir()
    hide = ["unshare", "--mount", "--propagation", "private", "sh", "-c"]
    return [], w.top / "mp", (*hide, 'mount -t tmpfs none /dev && exec "$@"', "sh")


MOUNT_REFUSALS = [
    ("missing mount point is ENOENT, answered with the mkdir", _missing_point, "ENOENT"),
    ("a file as mount point is ENOTDIR", _file_point, "ENOTDIR"),
    ("a mount point that is not empty is ENOTEMPTY", _full_point, "ENOTEMPTY"),
    ("a mount point inside the storage root is EINVAL", _point_inside, "EINVAL"),
    ("below a bind mount of the storage root is inside it too", _point_below_bound_root, "EINVAL"),
    ("a missing storage root is ENOENT", _missing_root, "ENOENT"),
    ("a directory that is no storage root is EINVAL", _not_a_root, "EINVAL"),
    ("an unusable agent at the start is an error: unknown, ENOENT", _unknown_agent, "ENOENT"),
    ("an unusable agent at the start: unreadable identity, EACCES", _unreadable_identity, "EACCES"),
    ("a failure to mount names libfuse's reason: ENODEV without /dev/fuse", _no_dev_fuse, "ENODEV"),
]


@needs_fuse
@pytest.mark.parametrize(
    ("prepare", "errno_name"),
    [pytest.param(p, e, id=i) for i, p, e in MOUNT_REFUSALS],
)
def test_ctx_mount_refusals_mount_nothing_and_exit_1(
    world: World, prepare: Callable, errno_name: str
) -> None:
    """docs/mount.md: the mount point must be an existing, empty directory outside the
    storage root (decided by device and inode, so through a bind mount too), and the storage
    root must exist; otherwise nothing is mounted and ``ctx mount`` exits 1 with ENOENT,
    ENOTDIR, ENOTEMPTY or EINVAL; a failure to mount names libfuse's reason (ENODEV for a
    missing /dev/fuse); only at the start is an unusable agent an error (ENOENT, EACCES)."""
    args, point, wrap = prepare(world)
    before = world.everything()
    argv = [*wrap, *CTX_ARGV, "mount", *map(str, args), str(point)]
    done = subprocess.run(argv, capture_output=True, env=world.env, timeout=30)
    run = Run(argv, done.returncode, done.stdout.decode(), done.stderr.decode())
    refused(run, errno_name, 1)
    if errno_name == "ENOENT" and not args:
        assert f"mkdir {point}" in run.err, run
    assert not mounted_at(point)
    assert processes_of(world.top) == []
    assert world.everything() == before


@dataclass
class Served:
    """The module's root (:func:`host`) mounted twice while the module runs: the host's view
    and agent ``coder``'s (``--as coder``)."""

    world: CoderHost
    host: Path
    view: Path
    agent_user: UnprivilegedUser
    host_proc: subprocess.Popen

    def everything(self) -> dict:
        return snapshot(self.world.storage)


MCP_SERVER = r"""
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "started"), "a") as marker:
    marker.write("started\n")
mode = sys.argv[1] if len(sys.argv) > 1 else "2025-11-25"
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    if message["method"] == "initialize":
        if mode == "exit":
            sys.exit(3)
        result = {"protocolVersion": mode, "capabilities": {"tools": {}},
                  "serverInfo": {"name": "spec", "version": "1"}}
    elif message["method"] == "tools/list":
        schema = {"type": "object", "properties": {"text": {"type": "string"}}}
        result = {"tools": [{"name": "echo", "description": "Echo.", "inputSchema": schema}]}
    else:
        result = {"content": [{"type": "text", "text": "x"}], "isError": False}
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
"""


def mcp_setup(directory: Path) -> Path:
    """A small stdio MCP server in ``directory`` (it notes each start in ``started``) and
    ``mcp.json`` naming it as ``demo`` and ``a.b``, beside one with a NUL in an ``env``
    value, one that answers a draft protocol version and one that exits; its path."""
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    server = directory / "server.py"
    server.write_text(MCP_SERVER)

    def entry(*args: str, **extra) -> dict:
        return {"command": PYTHON, "args": [str(server), *args], **extra}

    servers = {
        "demo": entry(),
        "a.b": entry(),
        "nulenv": entry(env={"TOKEN": "topsecret\u0000value"}),
        "draft": entry("2026-01-01"),
        "exits": entry("exit"),
    }
    config = directory / "mcp.json"
    config.write_text(json.dumps({"mcpServers": servers}))
    for made in directory.iterdir():
        made.chmod(0o644)
    return config


@contextlib.contextmanager
def mounts(storage: Path, *points: tuple[Path, tuple[str, ...]]) -> Iterator[list]:
    """``ctx mount`` of ``storage`` at each ``(point, options)``, served in the background
    until the block ends, then all ended at once with SIGTERM (which unmounts, F-1)."""
    procs: list[subprocess.Popen] = []
    try:
        for point, options in points:
            point.mkdir(exist_ok=True)
            with open(point.with_name(point.name + ".stderr"), "wb") as log:
                procs.append(subprocess.Popen(
                    [*CTX_ARGV, "mount", "--storage", str(storage), *options, str(point)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                    env=clean_env(), start_new_session=True,
                ))  # fmt: skip
        for proc, (point, _) in zip(procs, points, strict=True):
            up = wait_for(lambda p=point, q=proc: mounted_at(p) or q.poll() is not None, WAIT)
            said = point.with_name(point.name + ".stderr").read_text()
            assert up and proc.poll() is None, said
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc, (point, _) in zip(procs, points, strict=False):
            try:
                proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if mounted_at(point):
                subprocess.run(["umount", "-l", str(point)], check=False)


@pytest.fixture(scope="module")
def served(host: CoderHost) -> Iterator[Served]:
    if not os.path.exists("/dev/fuse"):
        pytest.skip("needs /dev/fuse")
    points = (host.top / "host-view", ()), (host.top / "coder-view", ("--as", "coder"))
    with mounts(host.storage, *points) as procs:
        yield Served(host, points[0][0], points[1][0], agent_user(host), procs[0])


def _second_mount(s: Served, user) -> tuple[Run, str, int]:
    return s.world.ctx("mount", s.host, timeout=30), "EBUSY", 1


def _root_on_a_mount(s: Served, user) -> tuple[Run, str, int]:
    point = new_scratch_dir(s.world.top, "mp-")
    try:
        return s.world.ctx("mount", "--storage", s.host, point, timeout=30), "EINVAL", 1
    finally:
        point.rmdir()


def _out_in_a_mount(s: Served, user) -> tuple[Run, str, int]:
    config = mcp_setup(s.world.top / f"mcp-{uuid.uuid4().hex[:8]}")
    out = s.host / "home" / "candidates"
    run = ctxmcp(
        "project", "--config", config, "--runtime-config", "/mcp/mcp.json",
        "--server", "demo", "--out", out,
    )  # fmt: skip
    assert not (config.parent / "started").exists(), "the server was started"
    assert not (s.world.storage / "home" / "candidates").exists()
    return run, "EINVAL", 2


def _umount_by_another_uid(s: Served, user) -> tuple[Run, str, int]:
    return ctx_as(user, "umount", s.host), "EPERM", 1


def _umount_in_use(s: Served, user) -> tuple[Run, str, int]:
    holder = subprocess.Popen(["sleep", "60"], cwd=s.host / "home")
    try:
        return s.world.ctx("umount", s.host, timeout=30), "EBUSY", 1
    finally:
        holder.kill()
        holder.wait()


LIVE_MOUNT_REFUSALS = [
    ("a mount point already a CortexFS mount is EBUSY", _second_mount, "ctx"),
    ("a storage root that lies on a CortexFS mount is EINVAL", _root_on_a_mount, "ctx"),
    ("ctxmcp --out inside any other ctx mount is EINVAL, exit 2", _out_in_a_mount, "ctxmcp"),
    ("ctx umount of another uid's mount is EPERM", _umount_by_another_uid, "ctx"),
    ("ctx umount of a mount still in use is EBUSY", _umount_in_use, "ctx"),
]


@needs_fuse
@pytest.mark.parametrize(
    ("provoke", "prog"), [pytest.param(p, g, id=i) for i, p, g in LIVE_MOUNT_REFUSALS]
)
def test_refusals_against_a_live_mount_leave_it_served(
    served: Served, unprivileged_user, provoke: Callable, prog: str
) -> None:
    """docs/mount.md, ``ctx mount --help``, docs/tools.md (ctxmcp): a mount point that is
    already a CortexFS mount is EBUSY; a storage root on a CortexFS mount EINVAL; ctxmcp
    refuses an ``--out`` inside any ``ctx mount`` (EINVAL, exit 2, before the server starts);
    ``ctx umount`` of another uid's mount is EPERM, of one still in use EBUSY.  The mount
    refused stays mounted and served by its process, and the storage root is unchanged."""
    before = served.everything()
    run, errno_name, status = provoke(served, unprivileged_user)
    refused(run, errno_name, status, prog)
    assert mounted_at(served.host) and served.host_proc.poll() is None
    assert set(os.listdir(served.host)) == ROOT_ENTRIES
    assert served.everything() == before


ATTEMPT = r"""
import ctypes, errno, os, sys
root = sys.argv[1]
def attempt():
{body}
try:
    attempt()
    print("ok")
except OSError as failed:
    print(errno.errorcode[failed.errno])
"""

THROUGH_THE_MOUNT = [
    ("host", "nothing else is made at the root: mkdir is EACCES", "EACCES",
     "os.mkdir(root + '/extra')"),
    ("host", "none of the six is removed: EPERM", "EPERM", "os.rmdir(root + '/model')"),
    ("host", "none of the six is renamed away: EPERM", "EPERM",
     "os.rename(root + '/model', root + '/home/model-moved')"),
    ("host", "none of the six is replaced: EPERM", "EPERM",
     "os.mkdir(root + '/home/x')\n"
     "    try:\n        os.rename(root + '/home/x', root + '/model')\n"
     "    finally:\n        os.rmdir(root + '/home/x')"),
    ("host", "symbolic links cannot be made: ENOSYS", "ENOSYS",
     "os.symlink('/etc', root + '/home/ln')"),
    ("host", "device nodes cannot be made: ENOSYS", "ENOSYS", "os.mkfifo(root + '/home/fifo')"),
    ("host", "renameat2 RENAME_WHITEOUT is EINVAL, nothing renamed", "EINVAL",
     "a, b = root + '/home/w-a', root + '/home/w-b'\n"
     "    open(a, 'w').close()\n"
     "    try:\n"
     "        libc = ctypes.CDLL(None, use_errno=True)\n"
     "        if libc.renameat2(-100, a.encode(), -100, b.encode(), 4) != 0:\n"
     "            number = ctypes.get_errno()\n"
     "            raise OSError(number, os.strerror(number))\n"
     "    finally:\n"
     "        assert os.path.exists(a) and not os.path.lexists(b)\n"
     "        os.unlink(a)"),
    ("agent", "the agent meets EACCES at its view's root", "EACCES",
     "os.mkdir(root + '/extra')"),
    ("agent", "a name it may not see is ENOENT", "ENOENT", "os.stat(root + '/agent/up')"),
    ("agent", "a change it may not make is EACCES: the manual bundle", "EACCES",
     "os.close(os.open(root + '/shared/cortexfs-docs/README.md', os.O_WRONLY | os.O_APPEND))"),
]  # fmt: skip


@needs_fuse
@pytest.mark.parametrize(
    ("view", "wanted", "body"),
    [pytest.param(v, e, b, id=f"{v} view: {i}") for v, i, e, b in THROUGH_THE_MOUNT],
)
def test_changes_the_mount_refuses_change_nothing(
    served: Served, view: str, wanted: str, body: str
) -> None:
    """docs/mount.md *What each view shows* and *Not provided*: in every view nothing else is
    made at the root (EACCES) and none of the six entries is removed, renamed away or
    replaced (EPERM); symbolic links and device nodes cannot be made (ENOSYS);
    ``RENAME_WHITEOUT`` is EINVAL with nothing renamed; in an agent's view the root is not
    the agent's to write (EACCES), a name it may not see is ENOENT and a change it may not
    make EACCES.  The storage root is unchanged and the mount still served."""
    script = ATTEMPT.format(body="    " + body)
    before = served.everything()
    if view == "host":
        done = subprocess.run(
            [PYTHON, "-c", script, str(served.host)], capture_output=True, text=True, timeout=30
        )
        answer = Run(["host"], done.returncode, done.stdout, done.stderr)
    else:
        answer = as_user(served.agent_user, [PYTHON, "-c", script, served.view])
    assert answer.rc == 0 and answer.out.strip() == wanted, answer
    assert served.everything() == before
    assert mounted_at(served.host) and mounted_at(served.view)


@needs_fuse
def test_a_mount_whose_process_died_is_enotconn_until_ctx_umount_removes_it(
    world: World,
) -> None:
    """docs/mount.md: a mount whose process died is still there (every access ENOTCONN);
    ``ctx mount`` there is refused, exit 1, with ENOTCONN and ``ctx umount`` as the way out;
    ``ctx umount`` finds it in the mount table and removes it; a second ``ctx umount`` of what
    is no longer a CortexFS mount is EINVAL (``ctx umount --help``)."""
    point = world.top / "mp"
    point.mkdir()
    proc = subprocess.Popen([*CTX_ARGV, "mount", str(point)], env=world.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        assert wait_for(lambda: mounted_at(point) or proc.poll() is not None, WAIT)
        assert mounted_at(point), "ctx mount did not mount"
    finally:
        proc.kill()
        proc.wait()
    before = world.everything()
    with pytest.raises(OSError) as dead:
        os.listdir(point)
    assert dead.value.errno == 107  # ENOTCONN
    again = world.ctx("mount", point, timeout=30)
    refused(again, "ENOTCONN", 1)
    assert f"ctx umount {point}" in again.err, again
    removed = world.ctx("umount", point, timeout=30)
    assert removed.rc == 0, removed
    assert not mounted_at(point)
    second = world.ctx("umount", point, timeout=30)
    refused(second, "EINVAL", 1)
    assert world.everything() == before
    assert processes_of(world.top) == []


@needs_fuse
def test_signals_the_instant_the_mount_appears_and_while_it_shuts_down_exit_0(
    world: World,
) -> None:
    """docs/mount.md: SIGTERM, SIGINT or SIGHUP unmounts cleanly and exits 0, even when the
    signal comes the instant the mount appears, and when more come while it shuts down."""
    point = world.top / "mp"
    point.mkdir()
    proc = subprocess.Popen([*CTX_ARGV, "mount", str(point)], env=world.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert wait_for(lambda: mounted_at(point) or proc.poll() is not None, WAIT, 0.002)
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert not mounted_at(point)


def _umount_missing(w: World, user):
    return w.ctx("umount", w.top / "absent"), "ENOENT", 1


def _umount_plain_directory(w: World, user):
    (w.top / "plain").mkdir()
    return w.ctx("umount", w.top / "plain"), "EINVAL", 1


def _umount_a_tmpfs(w: World, user):
    point = w.top / "tm"
    point.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point)])
    if made.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    run = w.ctx("umount", point)
    assert mounted_at(point), "ctx umount removed a mount it did not make"
    return run, "EINVAL", 1


def _umount_none_of_yours(w: World, user):
    return ctx_as(user, "umount", storage=w.storage), "ENOENT", 1


def _mount_by_ordinary_uid(w: World, user):
    if os.stat("/dev/fuse").st_mode & 0o006:
        pytest.skip("/dev/fuse is open to every uid here")
    point = w.top / "mine"
    point.mkdir()
    os.chown(point, user.uid, user.gid)
    run = ctx_as(user, "mount", point, storage=w.storage)
    assert "/dev/fuse" in run.err, run
    assert not mounted_at(point)
    return run, "EACCES", 1


UMOUNT_REFUSALS = [
    ("ctx umount of a missing path is ENOENT", _umount_missing),
    ("ctx umount of a directory that is no mount is EINVAL", _umount_plain_directory),
    ("ctx umount of a mount ctx mount did not make is EINVAL", _umount_a_tmpfs),
    ("ctx umount without MOUNTPOINT, none of the caller's: ENOENT exit 1", _umount_none_of_yours),
    ("ctx mount by an ordinary uid where /dev/fuse is root's: EACCES", _mount_by_ordinary_uid),
]


@needs_fuse
@pytest.mark.parametrize("provoke", [pytest.param(p, id=i) for i, p in UMOUNT_REFUSALS])
def test_ctx_umount_refusals(world: World, unprivileged_user, provoke: Callable) -> None:
    """docs/mount.md, ``ctx umount --help``, docs/tools.md *Mounting /ctx*: ``ctx umount``
    unmounts only what ``ctx mount`` made (anything else EINVAL, a missing path ENOENT);
    without MOUNTPOINT and no storage root mounted by the caller it is ENOENT, exit 1; a mount
    the kernel refuses (an ordinary uid where /dev/fuse is root's) is EACCES naming libfuse's
    reason, exit 1, nothing mounted."""
    before = world.everything()
    run, errno_name, status = provoke(world, unprivileged_user)
    refused(run, errno_name, status)
    assert world.everything() == before
    assert processes_of(world.top) == []


# ====================================================================== §8 agents, host side

SRC = "{src}"


def _padded(size: int) -> str:
    text = json.dumps({"name": "padded", "label": "padded_t"})
    return text + " " * (size - len(text))


AGENT_REFUSALS = [
    ("every problem of a request is listed",
     '{"name": "../x", "label": "a b", "tools": ["bad/name"], "mount": [["{src}", "/etc", "ro"]]}',
     (), None, "EINVAL", 1, ["'../x'", "'a b'", "bad/name", "/etc"]),
    ("a target under a system directory such as /run is EINVAL",
     '{"name": "a1", "label": "a_t", "mount": [["{src}", "/run/data", "ro"]]}',
     (), None, "EINVAL", 1, ["/run belongs to the system"]),
    ("two mounts may not share the last component of their target",
     '{"name": "a1", "label": "a_t", "mount": [["{src}", "/a/data", "ro"], '
     '["{src}", "/b/data", "ro"]]}', (), None, "EINVAL", 1, ["'data'"]),
    ("--user root is refused, EINVAL exit 2",
     '{"name": "a1", "label": "a_t"}', ("--user", "root"), None, "EINVAL", 2, []),
    ("an existing agent is never overwritten: EEXIST",
     '{"name": "kept", "label": "other_t"}', (), None, "EEXIST", 1, ["kept"]),
    ("a request over 256 KiB is EFBIG",
     "PAD262145", (), None, "EFBIG", 1, ["262144"]),
    ("anyone but root gives an agent only their own uid: EPERM",
     '{"name": "a1", "label": "a_t"}', ("--user", "nobody"), "owner", "EPERM", 1, []),
]  # fmt: skip


@needs_root
@pytest.mark.parametrize(
    ("text", "options", "who", "errno_name", "status", "named"),
    [pytest.param(*case[1:], id=case[0]) for case in AGENT_REFUSALS],
)
def test_ctx_agent_create_refusals_create_nothing(
    world: World, unprivileged_user, text, options, who, errno_name, status, named
) -> None:
    """docs/tools.md *Agents, host side* and ``ctx agent create --help``: every problem of a
    request is listed (EINVAL); a mount target at or under a system directory of the sandbox
    (``/run`` among them) is EINVAL, and so are two mounts whose targets end in the same
    name; ``--user root`` is EINVAL, exit 2; an existing agent is never overwritten
    (EEXIST); a request is at most 256 KiB (EFBIG); anyone but root gives an agent only
    their own uid (EPERM).  Nothing is created, in ``agent/`` or anywhere else in the
    storage root."""
    src = world.top / "src"
    src.mkdir()
    if '"kept"' in text:
        world.agent({"name": "kept", "label": "kept_t"})
    if who == "owner":
        for dirpath, dirnames, filenames in os.walk(world.storage):
            for name in [".", *dirnames, *filenames]:
                os.lchown(Path(dirpath, name), unprivileged_user.uid, unprivileged_user.gid)
    body = _padded(262145) if text == "PAD262145" else text
    body = body.replace(SRC, str(src))
    before = world.everything()
    args = ("agent", "create", "-", "--json", *options)
    if who is None:
        run = world.ctx(*args, input=body)
    else:
        run = ctx_as(unprivileged_user, *args, storage=world.storage, stdin=body)
    refused_json(run, errno_name, status)
    for part in named:
        assert part in run.err, (part, run)
    assert world.everything() == before


@needs_root
def test_a_request_of_exactly_256_kib_is_accepted(world: World) -> None:
    """``ctx agent create --help``: a request is at most 256 KiB (262144 bytes), from a file
    or standard input alike: exactly that many bytes is a request."""
    path = world.top / "request.json"
    path.write_text(_padded(262144))
    assert path.stat().st_size == 262144
    made = world.ctx("agent", "create", path, "--json")
    assert made.rc == 0 and made.json()["name"] == "padded", made
    assert (world.storage / "agent" / "padded").is_file()


# ====================================================================== §8 the terminal


@pytest.fixture(scope="module")
def running(host: CoderHost) -> Term:
    """One terminal of ``coder`` that runs while the module runs."""
    return host.start()


def ctxterm_pid(term: Term) -> int:
    return int((term.rundir / "pid").read_text())


def left_of(term: Term, pid: int) -> dict[str, object]:
    """What a terminal that should have ended left: its process, its runtime directory, its
    view's mount, the session's link."""
    left: dict[str, object] = {}
    if alive(pid):
        left["ctxterm"] = pid
    if term.rundir.exists():
        left["rundir"] = sorted(p.name for p in term.rundir.iterdir())
    if mounted_at(term.rundir / "private" / "ctx"):
        left["view"] = "mounted"
    if os.path.lexists(term.link):
        left["link"] = os.readlink(term.link)
    return left


CLIENT = r"""
import socket, sys
sock = socket.socket(socket.AF_UNIX)
sock.connect(sys.argv[1])
try:
    sock.sendall(sys.argv[2].encode().decode("unicode_escape").encode())
except OSError:  # refused at once: what it said waits to be read
    pass
sock.settimeout(5)
data = b""
try:
    while chunk := sock.recv(65536):
        data += chunk
except OSError:
    pass
sys.stdout.write(data.decode("utf-8", "replace"))
"""


def _second_start(h: CoderHost, t: Term, user):
    run = h.ctx("agent", "start", "coder", "--session", t.session, "--json", cwd=h.ws)
    assert run.json()["error"] == "EEXIST", run
    return run, "EEXIST", 1, "ctx"


def _start_by_another_uid(h: CoderHost, t: Term, user):
    run = ctx_as(user, "agent", "start", "coder", "--session", t.session, storage=h.storage)
    return run, "EACCES", 1, "ctx"


def _stop_by_another_uid(h: CoderHost, t: Term, user):
    run = ctx_as(user, "agent", "stop", "coder", "--session", t.session, storage=h.storage)
    return run, "EPERM", 1, "ctx"


def _watch_by_another_uid(h: CoderHost, t: Term, user):
    run = ctx_as(user, "agent", "watch", "coder", "--session", t.session, storage=h.storage,
                 timeout=10)  # fmt: skip
    return run, "EACCES", 1, "ctx"


def _attach_by_the_agent_uid(h: CoderHost, t: Term, user):
    run = ctx_as(agent_user(h), "agent", "attach", "coder", "--session", t.session,
                 storage=h.storage, timeout=10)  # fmt: skip
    return run, "EACCES", 1, "ctx"


def _raw_client_of_another_uid(h: CoderHost, t: Term, user):
    run = as_user(user, [PYTHON, "-c", CLIENT, t.listening_at, "watch\\n"], timeout=15)
    assert run.out.startswith("ctxterm: EACCES: "), run
    return Run(run.argv, 1, "", run.out), "EACCES", 1, "ctxterm"


def _raw_attach_of_the_agent_uid(h: CoderHost, t: Term, user):
    run = as_user(agent_user(h), [PYTHON, "-c", CLIENT, t.listening_at, "attach\\nexit\\r"],
                  timeout=15)  # fmt: skip
    assert run.out.startswith("ctxterm: EACCES: "), run
    return Run(run.argv, 1, "", run.out), "EACCES", 1, "ctxterm"


def _run_socket_peer_outside(h: CoderHost, t: Term, user):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(t.rundir / "private" / "run.sock"))
        sock.sendall(json.dumps({"argv": ["fs.read", "notes.txt"]}).encode() + b"\n")
        data = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                data += chunk
    lines = data.decode().splitlines()
    assert len(lines) == 1, data
    answer = json.loads(lines[0])
    assert answer["exit_status"] == 126 and answer["error"].startswith("EACCES: "), answer
    return Run(["run.sock"], 126, "", "run.sock: " + answer["error"]), "EACCES", 126, "run.sock"


TERMINAL_REFUSALS = [
    ("one terminal per agent and session: a second start is EEXIST", _second_start),
    ("ctx agent start by anyone but the host administrator is EACCES", _start_by_another_uid),
    ("ctx agent stop of a terminal another user started is EPERM", _stop_by_another_uid),
    ("watch by a uid not root, the owner or the agent's is EACCES", _watch_by_another_uid),
    ("the agent's own uid may watch, not attach: EACCES", _attach_by_the_agent_uid),
    ("a client that skips that check is told ctxterm: EACCES", _raw_client_of_another_uid),
    ("an attach of the agent's uid is refused and types nothing", _raw_attach_of_the_agent_uid),
    ("the run socket answers another peer one line: EACCES, 126", _run_socket_peer_outside),
]


@needs_terminal
@pytest.mark.parametrize("provoke", [pytest.param(p, id=i) for i, p in TERMINAL_REFUSALS])
def test_refusals_against_a_running_terminal_leave_it_as_it_was(
    host: CoderHost, running: Term, unprivileged_user, provoke: Callable
) -> None:
    """docs/tools.md *The agent terminal*: one terminal per agent and session (EEXIST);
    ``ctx agent start`` is root's (the host administrator's); a terminal another user
    started is EPERM to stop; root and the storage root's owner may watch and attach, the
    agent's own uid may watch; anyone else is refused with EACCES by ``ctx agent
    watch|attach`` before it connects and by the terminal itself (``ctxterm: EACCES: …``);
    the run socket serves tsh and nothing else: any other peer gets one line,
    ``{"error": "EACCES: …", "exit_status": 126}``, and nothing is run.  The terminal runs
    on with the same ctxterm, and nothing is recorded in its session."""
    pid = ctxterm_pid(running)
    calls = host.calls(running.session, "fs.read")
    run, errno_name, status, prog = provoke(host, running, unprivileged_user)
    refused(run, errno_name, status, prog)
    assert ctxterm_pid(running) == pid and alive(pid)
    assert os.path.samefile(running.link, running.listening_at)
    assert host.calls(running.session, "fs.read") == calls
    assert [e["type"] for e in host.lifecycle(running.session)] == ["terminal.started"]


HOLDER = r"""
import json, socket, sys, time
path = sys.argv[1]

def client():
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    try:
        sock.sendall(b"watch\n")
    except OSError:  # refused at once: what it said waits to be read
        pass
    sock.settimeout(5)
    return sock

def first(sock):
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return [data.decode(errors="replace"), True]
            data += chunk
            if b"$ " in data:
                return [data.decode(errors="replace"), False]
    except OSError:
        return [data.decode(errors="replace"), False]

held = [client() for _ in range(64)]
print(json.dumps([said for said, ended in map(first, held) if ended]), flush=True)
sys.stdin.readline()
print(json.dumps(first(client())), flush=True)
sys.stdin.readline()
held.pop().close()
deadline = time.monotonic() + 3  # "at once": well before the 10 s a silent client is kept
while True:
    answer = first(client())
    if not answer[1] or time.monotonic() > deadline:
        break
    time.sleep(0.1)
print(json.dumps(answer), flush=True)
sys.stdin.readline()
"""


@needs_terminal
def test_the_65th_connection_of_the_agents_uid_is_eagain(host: CoderHost, running: Term) -> None:
    """docs/tools.md *The agent terminal*: the agent's own uid holds at most 64 connections at
    once; the 65th is told ``ctxterm: EAGAIN: …`` and closed (``ctx agent watch`` then exits
    1 with ``ctx: EAGAIN: the terminal refused this client: …``); root's connections do not
    count; a client that closes its connection frees its place at once."""
    user = agent_user(host)
    holder = subprocess.Popen(
        [PYTHON, "-c", HOLDER, str(running.listening_at)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        user=user.uid, group=user.gid, extra_groups=[], cwd="/",
    )  # fmt: skip
    try:
        assert json.loads(holder.stdout.readline()) == [], "some of 64 were refused"
        watch = ctx_as(user, "agent", "watch", "coder", "--session", running.session,
                       storage=host.storage, timeout=15)  # fmt: skip
        refused(watch, "EAGAIN", 1)
        assert "ctx: EAGAIN: the terminal refused this client: " in watch.err, watch
        operator = Raw(running.listening_at, b"watch\n")
        try:
            assert operator.shows(AGENT_PROMPT, seconds=10), operator.text()
        finally:
            operator.close()
        holder.stdin.write("next\n")
        holder.stdin.flush()
        said, ended = json.loads(holder.stdout.readline())
        assert ended and said.startswith("ctxterm: EAGAIN: "), said
        holder.stdin.write("next\n")
        holder.stdin.flush()
        said, ended = json.loads(holder.stdout.readline())
        assert not ended and AGENT_PROMPT in said, said
    finally:
        holder.kill()
        holder.wait()
    assert alive(ctxterm_pid(running))


@needs_terminal
def test_stop_then_stop_and_watch_of_what_no_longer_runs_are_enoent(host: CoderHost) -> None:
    """docs/tools.md *The agent terminal*, ``ctx agent stop --help``: ``ctx agent stop``
    prints ``stopped NAME, session S (pid N)`` and leaves nothing (its process, view, sockets,
    link); a watcher then leaves with exit 0, saying on stderr that the terminal closed the
    connection; a terminal that is not running is ENOENT (exit 1) to stop, and no terminal
    answering is ENOENT to watch."""
    term = host.start()
    pid = ctxterm_pid(term)
    shown = host.top / f"watch-{term.session}.out"
    with open(shown, "wb") as sink:
        watcher = subprocess.Popen(
            [*CTX_ARGV, "agent", "watch", "coder", "--session", term.session],
            stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.PIPE, env=host.env,
        )  # fmt: skip
    try:
        assert wait_for(lambda: AGENT_PROMPT.encode() in shown.read_bytes(), 10)
        stopped = host.ctx("agent", "stop", "coder", "--session", term.session)
        assert stopped.rc == 0, stopped
        assert stopped.out.strip() == f"stopped coder, session {term.session} (pid {pid})"
        host.started.remove(term.session)
        _, err = watcher.communicate(timeout=WAIT)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait()
    assert watcher.returncode == 0, err
    assert b"closed the connection" in err, err
    assert wait_for(lambda: left_of(term, pid) == {}, 10), left_of(term, pid)
    again = host.ctx("agent", "stop", "coder", "--session", term.session, "--json")
    refused_json(again, "ENOENT", 1)
    refused(host.ctx("agent", "watch", "coder", "--session", term.session, timeout=10),
            "ENOENT", 1)  # fmt: skip
    assert left_of(term, pid) == {}


@needs_terminal
def test_tsh_refusals_in_the_terminal_and_exit_takes_the_last_status(host: CoderHost) -> None:
    """docs/tools.md *The agent terminal* (H-1): a command line that is not a tool on
    ``CTX_PATH`` is refused (``tsh: ls: not a tool on CTX_PATH``); an argument holding a NUL
    character is refused (EINVAL, stage ``run``), nothing run; a built-in used wrongly is a
    usage error, exit 2, naming its form; ``exit`` without N leaves with the last status,
    recorded with ``terminal.stopped``, and the terminal leaves nothing."""
    term = host.start()
    pid = ctxterm_pid(term)
    typist = Raw(term.listening_at, b"attach\n")
    try:
        assert typist.shows(AGENT_PROMPT), typist.text()
        typist.type("ls")
        assert typist.shows("tsh: ls: not a tool on CTX_PATH"), typist.text()
        assert typist.shows(AGENT_PROMPT, 2), typist.text()
        typist.type(b"fs.read a\x00b")
        assert typist.shows("tsh: fs.read: EINVAL: "), typist.text()
        assert typist.shows(AGENT_PROMPT, 3), typist.text()
        typist.type("which")
        assert typist.shows("tsh: which: a tool name is needed (which NAME...)"), typist.text()
        assert typist.shows(AGENT_PROMPT, 4), typist.text()
        typist.type("exit")
        assert typist.eof.wait(WAIT), typist.text()
    finally:
        typist.close()
    host.started.remove(term.session)
    assert wait_for(lambda: left_of(term, pid) == {}, 10), left_of(term, pid)
    stopped = [e for e in host.lifecycle(term.session) if e["type"] == "terminal.stopped"]
    assert [(e["reason"], e["exit_status"]) for e in stopped] == [("exit", 2)], stopped
    results = host.calls(term.session, "fs.read", "tool_result")
    assert [(r["errno"], r["stage"], r["exit_status"]) for r in results] == [
        ("EINVAL", "run", None)
    ], results


def _missing_source(h: CoderHost, agent: str, session: str, user) -> tuple[str, str]:
    source = h.top / f"gone-{agent}"
    source.mkdir()
    h.create_agent({"name": agent, "label": f"{agent}_t",
                    "mount": [[str(source), "/data", "ro"]]})  # fmt: skip
    source.rmdir()
    return "ENOENT", "start"


def _sandbox_ends(h: CoderHost, agent: str, session: str, user) -> tuple[str, str]:
    outer, inner = h.top / f"outer-{agent}", h.top / f"inner-{agent}"
    outer.mkdir()
    inner.mkdir()
    mounts_ = [[str(outer), "/outer", "ro"], [str(inner), "/outer/x", "rw"]]
    h.create_agent({"name": agent, "label": f"{agent}_t", "mount": mounts_})
    return "EROFS", "start"


def _directory_at_link(h: CoderHost, agent: str, session: str, user) -> tuple[str, str]:
    (h.session_dir(session) / "terminal" / "main.sock").mkdir(parents=True)
    return "EISDIR", "start"


def _session_level(h: CoderHost, session: str) -> Path:
    """The runtime directory of ``coder``'s terminal of ``session``, made with the levels
    above it as root's 0711 directories where missing."""
    level = RUN_BASE.parent
    for part in (RUN_BASE.name, root_key(h.storage), str(h.uid), "coder", session):
        level = level / part
        if not level.exists():
            level.mkdir(mode=0o711)
            level.chmod(0o711)
    return level


def _directory_at_pid(h: CoderHost, agent: str, session: str, user) -> tuple[str, str]:
    (_session_level(h, session) / "pid").mkdir()
    return "EISDIR", "start and stop"


def _level_of_another_uid(h: CoderHost, agent: str, session: str, user) -> tuple[str, str]:
    os.chown(_session_level(h, session), user.uid, 0)
    return "EPERM", "start"


START_REFUSALS = [
    ("a visible mount whose source is missing is ENOENT before anything starts", _missing_source,
     True),
    ("a sandbox that ends before tsh runs fails the start with its errno", _sandbox_ends, True),
    ("a directory planted at the session's terminal/main.sock is EISDIR", _directory_at_link,
     False),
    ("a directory where the pid file belongs is EISDIR to start and stop", _directory_at_pid,
     False),
    ("a runtime directory level that is another uid's is EPERM", _level_of_another_uid, False),
]  # fmt: skip


@needs_terminal
@pytest.mark.parametrize(
    ("prepare", "own_agent"), [pytest.param(p, a, id=i) for i, p, a in START_REFUSALS]
)
def test_ctx_agent_start_refusals_leave_nothing_running(
    host: CoderHost, unprivileged_user, prepare: Callable, own_agent: bool
) -> None:
    """docs/tools.md *The agent terminal*: a visible mount whose source is missing is ENOENT
    before anything is started; a sandbox that ends before tsh runs fails the start with what
    it said and its errno (EROFS), exit 1, with nothing left running or mounted and no
    ``terminal.started`` logged; a directory planted where the session's ``terminal/main.sock``
    link goes is EISDIR; a directory where the pid file belongs is EISDIR to ``start`` and
    ``stop``; a runtime directory level that is not root's is EPERM, naming it.  The homes
    are left as they were: no session, events file or directory of the start's making."""
    agent = f"a{uuid.uuid4().hex[:8]}" if own_agent else "coder"
    session = f"r{uuid.uuid4().hex[:10]}"
    mine = RUN_BASE / root_key(host.storage) / str(host.uid) / agent
    if not own_agent:
        mine = mine / session
    try:
        errno_name, verbs = prepare(host, agent, session, unprivileged_user)
        controls = snapshot(host.storage / "agent")
        homes = snapshot(host.storage / "home")
        planted = sorted(map(str, mine.rglob("*"))) if mine.exists() else []
        for verb in verbs.split(" and "):
            extra = ("--no-workspace",) if verb == "start" else ()
            run = host.ctx("agent", verb, agent, "--session", session, "--json", *extra,
                           timeout=60)  # fmt: skip
            refused_json(run, errno_name, 1)
            if errno_name == "EROFS":
                assert "bwrap: " in run.err, run
        log = read_jsonl(host.storage / "agent" / f"{agent}.d" / "log")
        assert [e for e in log if e.get("session") == session] == []
        assert snapshot(host.storage / "agent") == controls
        assert snapshot(host.storage / "home") == homes  # no session left of the start's making
        assert mounts_under(mine) == []
        assert (sorted(map(str, mine.rglob("*"))) if mine.exists() else []) == planted
        assert not os.path.lexists(RUN_BASE / str(host.uid) / agent / session)
        assert processes_of(mine) == []
    finally:
        if any(mine.rglob("main.sock")):
            host.ctx("agent", "stop", agent, "--session", session, timeout=60)
        unmount_under(mine)
        if mine.exists():
            os.chown(mine, 0, 0)
            shutil.rmtree(mine, ignore_errors=True)


@needs_terminal
@pytest.mark.parametrize(
    "verb",
    ["stop", "start"],
)
def test_a_dead_terminals_busy_view_is_ebusy_with_the_rest_left_as_it_is(
    host: CoderHost, unprivileged_user, verb: str
) -> None:
    """docs/tools.md *A terminal that was killed*: its next ``ctx agent stop`` or ``start``
    cleans up after it; only root cleans up (anyone else is told EPERM); a view that cannot
    be unmounted is EBUSY, naming it, with nothing started.  Once the view is free, ``ctx
    agent stop`` cleans up, exit 0, naming the dead terminal's pid (``"running": false``),
    and leaves nothing."""
    term = host.start()
    pid = ctxterm_pid(term)
    mounters = [c for c in children_of(pid) if b"mount" in cmdline(c)]
    assert mounters, "the view's mount process was not found"
    view = term.rundir / "private" / "ctx"
    alias = RUN_BASE / str(host.uid) / "coder" / term.session / "main.sock"
    sleeper = subprocess.Popen(["sleep", "60"], cwd=view)
    try:
        for victim in (pid, *mounters):
            os.kill(victim, signal.SIGKILL)
        assert wait_for(lambda: not any(alive(p) for p in (pid, *mounters)), 10)

        def runtime() -> dict:
            return {
                "rundir": sorted(p.name for p in term.rundir.iterdir()),
                "private": sorted(p.name for p in (term.rundir / "private").iterdir()),
                "alias": os.path.lexists(alias),
                "link": os.readlink(term.link) if os.path.lexists(term.link) else None,
                "view": mounted_at(view),
            }

        before = runtime()
        assert before["view"] and before["alias"] and "pid" in before["rundir"], before
        if verb == "stop":
            not_root = ctx_as(unprivileged_user, "agent", "stop", "coder", "--session",
                              term.session, "--json", storage=host.storage)  # fmt: skip
            refused_json(not_root, "EPERM", 1)
            assert runtime() == before
        busy = host.ctx("agent", verb, "coder", "--session", term.session, "--json", cwd=host.ws)
        refused_json(busy, "EBUSY", 1)
        assert str(view) in busy.json()["message"], busy
        started = [e for e in host.lifecycle(term.session) if e["type"] == "terminal.started"]
        assert len(started) == 1, started
        assert runtime() == before
    finally:
        sleeper.kill()
        sleeper.wait()
    cleaned = host.ctx("agent", "stop", "coder", "--session", term.session, "--json")
    assert cleaned.rc == 0, cleaned
    facts = cleaned.json()
    assert facts["running"] is False and facts["pid"] == pid, facts
    assert any(str(view) in line for line in facts["cleaned"]), facts
    host.started.remove(term.session)
    assert left_of(term, pid) == {}
    assert not os.path.lexists(alias)


# ====================================================================== §7 tsh and ctx tool

TSH_REFUSALS = [
    ("which needs names: a usage error, exit 2", ["which"], b"", 2,
     "tsh: which: a tool name is needed (which NAME...)"),
    ("exit N takes N modulo 256 however many digits it has", ["exit", "9" * 40], b"",
     int("9" * 40) % 256, None),
    ("anything but a tool on CTX_PATH is refused: 127", ["ls"], b"", 127,
     "tsh: ls: not a tool on CTX_PATH"),
    ("a standalone tsh cannot execute tools as an agent: EACCES 126",
     ["fs.read", '{"path": "x"}'], b"", 126, "tsh: fs.read: EACCES: "),
    ("a line over 1 MiB from a pipe is E2BIG, status 2, nothing run", [],
     b"x" * 1048577 + b"\n", 2, "tsh: E2BIG: "),
    ("a line of exactly 1 MiB is read whole; a word is cut past 256 characters", [],
     b"x" * 1048576 + b"\n", 127, "x" * 256 + "… (1048576 characters)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "stdin", "status", "said"),
    [pytest.param(*case[1:], id=case[0]) for case in TSH_REFUSALS],
)
def test_standalone_tsh_refusals(template: Path, argv, stdin, status, said) -> None:
    """docs/tools.md *The agent terminal* (H-1, H-2): a built-in used wrongly is a usage
    error, exit 2, naming its form (``which`` needs names); ``exit N`` takes N modulo 256
    however many digits it has; a command line that is not a tool on ``CTX_PATH`` is refused;
    a standalone human tsh cannot execute tools (H-2); a line longer than 1 MiB read from a
    pipe is E2BIG, status 2, nothing run, and a message naming a word typed cuts it past 256
    characters, saying how long it was."""
    env = clean_env(CTX_PATH=str(template / "tool"), CTX_STORAGE=str(template))
    done = subprocess.run([str(template / "bin" / "tsh"), *argv], input=stdin,
                          capture_output=True, env=env, timeout=60)  # fmt: skip
    err = done.stderr.decode("utf-8", "replace")
    assert done.returncode == status, err[-600:]
    if said is None:
        assert err == ""
    else:
        assert said in err, err[-600:]
    assert "x" * 257 not in err
    if stdin and status == 127:
        assert "E2BIG" not in err


@needs_root
def test_tsh_as_a_granted_tool_runs_no_tool(host: CoderHost) -> None:
    """docs/tools.md *The agent terminal*: ``tsh`` is also a tool an agent may be granted;
    run on the host (``ctx run --agent A tsh …``) it lists and resolves through the agent's
    view, and it runs no tool (EACCES, exit 126: run the tool itself)."""
    listed = host.ctx("run", "--agent", "up", "tsh", "tools")
    assert listed.rc == 0 and "fs.read" in listed.lines(), listed
    log = (host.storage / "tool" / "fs.read.d" / "log").read_bytes()
    ran = host.ctx("run", "--agent", "up", "tsh", "fs.read", '{"path": "x"}')
    refused(ran, "EACCES", 126, "tsh: fs.read")
    assert (host.storage / "tool" / "fs.read.d" / "log").read_bytes() == log


def _earlier_on_the_path(w: World, user):
    early = w.top / "early"
    early.mkdir()
    fake = early / "tsh.config"
    fake.write_text(f"#!/bin/sh\ntouch {w.top}/fake-ran\n")
    fake.chmod(0o755)
    run = w.ctx("tool", "tsh.config", env=clean_env(
        CTX_STORAGE=str(w.storage), CTX_PATH=f"{early}:{w.storage / 'tool'}"))  # fmt: skip
    assert not (w.top / "fake-ran").exists()
    return run, "EACCES", 1


def _not_available(w: World, user):
    (w.storage / "tool" / "tsh.config.d" / "status").write_text("disabled\n")
    run = w.ctx("tool", "tsh.config", "max_loaded_tools=9", env=_tool_env(w))
    last = read_jsonl(w.storage / "tool" / "tsh.config.d" / "log")[-1]
    assert (last["errno"], last["exit_status"], last["mode"]) == ("EACCES", None, "host"), last
    return run, "EACCES", 1


def _another_uid_with_the_file_writable(w: World, user):
    (w.storage / "tool" / "tsh.d").chmod(0o777)
    (w.storage / "tool" / "tsh.d" / "config").chmod(0o666)
    env = clean_env(HOME="/nonexistent", CTX_STORAGE=str(w.storage),
                    CTX_PATH=str(w.storage / "tool"))  # fmt: skip
    run = as_user(user, [*CTX_ARGV, "tool", "tsh.config", "max_loaded_tools=9"], env=env)
    assert ".install-lock" in run.err, run
    return run, "EACCES", 1


def _tool_env(w: World) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(w.storage), CTX_PATH=str(w.storage / "tool"))


def _ctx_tool(*args: str, errno_name: str, status: int):
    def provoke(w: World, user):
        return w.ctx("tool", *args, env=_tool_env(w)), errno_name, status

    return provoke


CTX_TOOL_REFUSALS = [
    ("a name not on CTX_PATH is ENOENT, exit 1", _ctx_tool("nosuch", errno_name="ENOENT",
                                                            status=1)),
    ("fs.write acts with an agent's permissions: EACCES",
     _ctx_tool("fs.write", '{"path": "x", "content": "y"}', errno_name="EACCES", status=1)),
    ("a tool of that name earlier on the path is EACCES", _earlier_on_the_path),
    ("a status that is not available is EACCES, logged with exit_status null", _not_available),
    ("tsh.config: a setting over 65536 is EINVAL, exit 2, not one setting changes",
     _ctx_tool("tsh.config", "cache_capacity=64", "max_loaded_tools=65537",
               errno_name="EINVAL", status=2)),
    ("tsh.config: another uid is EACCES naming the install lock, file writable or not",
     _another_uid_with_the_file_writable),
]  # fmt: skip


@needs_root
@pytest.mark.parametrize("provoke", [pytest.param(p, id=i) for i, p in CTX_TOOL_REFUSALS])
def test_ctx_tool_refusals_change_no_setting(
    world: World, unprivileged_user, provoke: Callable
) -> None:
    """docs/tools.md *ctx tool* (H-3) and *The core tools* (H-4): ``ctx tool`` runs only the
    safe core CLIs; a name not on ``CTX_PATH`` is ENOENT (exit 1); a tool of that name earlier
    on the path, the core tools acting with an agent's permissions and a tool whose status is
    not ``available`` are EACCES (the refused call logged with ``exit_status`` null); an
    update of ``tsh.config`` is validated whole (known keys, each once, ``≤ 65536``: else
    EINVAL, exit 2, and not one setting changes); another uid gets EACCES naming the lock
    file, even where the file was made writable to it."""
    config = world.storage / "tool" / "tsh.d" / "config"
    before = config.read_bytes()
    run, errno_name, status = provoke(world, unprivileged_user)
    refused(run, errno_name, status)
    assert config.read_bytes() == before


# ====================================================================== §8 agent.update, A-4


UPDATE = "agent.update"
CREATE = "agent.create"
CAPABILITY_REFUSALS = [
    ("agent.update: any other control is EINVAL, exit 2", UPDATE,
     {"control": "policy", "content": "allow up_t tool:fs.write execute\n"}, "EINVAL", 2),
    ("agent.update: 8192 characters or fewer, over 8 KiB in UTF-8, is EFBIG", UPDATE,
     {"control": "system.md", "content": "é" * 4097}, "EFBIG", 1),
    ("agent.update: run outside the runner it has no capability: EPERM", UPDATE,
     {"control": "system.md", "content": "x"}, "EPERM", 1),
    ("agent.create: another existing agent's label is EACCES", CREATE,
     {"name": "kid", "label": "coder_t"}, "EACCES", 1),
    ("agent.create: a system directory as mount target is EINVAL, exit 2", CREATE,
     {"name": "kid", "label": "kid_t", "mount": [["/tmp", "/etc/x", "ro"]]}, "EINVAL", 2),
    ("agent.create: where an earlier agent's sessions remain it is EEXIST", CREATE,
     {"name": "kid2", "label": "kid2_t"}, "EEXIST", 1),
]  # fmt: skip


@needs_root
@pytest.mark.parametrize(
    ("tool", "payload", "errno_name", "status"),
    [pytest.param(*case[1:], id=case[0]) for case in CAPABILITY_REFUSALS],
)
def test_agent_update_and_agent_create_refusals_change_no_control(
    host: CoderHost, request, tool: str, payload: dict, errno_name: str, status: int
) -> None:
    """SPEC A-4, A-5 and docs/tools.md *The core tools*: ``agent.update`` replaces only
    ``system.md`` or ``prompt.template.md`` (any other control EINVAL), at most 8 KiB of
    UTF-8 (EFBIG above, also for 8192 characters or fewer); run outside the runner it has
    no capability (EPERM).  ``agent.create`` never gives a child another existing agent's
    label (EACCES), refuses a system directory as mount target (EINVAL) and a name whose
    earlier sessions remain (EEXIST); a request that is not valid exits 2, a refusal 1.
    No agent is made and no control changes; only the call's own session records it."""
    before = snapshot(host.storage)
    agents = sorted(os.listdir(host.storage / "agent"))
    text = json.dumps(payload)
    if "outside the runner" in request.node.callspec.id:
        done = subprocess.run([str(host.storage / "tool" / tool), text], input=b"",
                              capture_output=True, env=host.env, timeout=60)  # fmt: skip
        run = Run([tool, text], done.returncode, done.stdout.decode(), done.stderr.decode())
    else:
        run = host.ctx("run", "--agent", "up", tool, text)
    refused(run, errno_name, status, tool)
    now = snapshot(host.storage)
    recorded = (f"home/{host.uid}/agent/up", f"home/{host.uid}/agent/coder")  # the call's session
    changed = {
        k
        for k in set(before) | set(now)
        if before.get(k) != now.get(k) and not k.startswith(recorded) and not k.endswith("/log")
    }
    assert changed == set(), changed
    assert sorted(os.listdir(host.storage / "agent")) == agents


# ====================================================================== §9 shared spaces


def _nothing(w: World, user) -> None:
    return None


def _shared(*args: str, errno_name: str, status: int = 2):
    def act(w: World, user):
        return w.ctx(*args), errno_name, status

    return act


def _space_with_a_directory_of_another_uid(w: World, user) -> None:
    assert w.ctx("shared", "create", "sp").rc == 0
    data = w.storage / "shared" / "sp" / "data"
    os.chown(data, user.uid, -1)
    data.chmod(0o700)


def _regroup_it(w: World, user):
    return w.ctx("shared", "create", "sp", "--group", "0", "--json"), "EPERM", 1


def _root_of_the_user(w: World, user) -> None:
    for dirpath, dirnames, filenames in os.walk(w.storage):
        for name in [".", *dirnames, *filenames]:
            os.lchown(Path(dirpath, name), user.uid, user.gid)


def _group_not_held(w: World, user):
    run = ctx_as(user, "shared", "create", "sp2", "--group", "0", "--json", storage=w.storage)
    return run, "EPERM", 1


SHARED_REFUSALS = [
    ("cortexfs-docs (the manual bundle) is a usage error: EINVAL exit 2", _nothing,
     _shared("shared", "create", "cortexfs-docs", "--json", errno_name="EINVAL")),
    ("a NAME ending in .d is EINVAL exit 2", _nothing,
     _shared("shared", "create", "space.d", "--json", errno_name="EINVAL")),
    ("ctx queue init refuses the bundle too: EINVAL exit 2", _nothing,
     _shared("queue", "init", "--project", "cortexfs-docs", errno_name="EINVAL")),
    ("--group repairs no directory of another uid: EPERM, nothing changed",
     _space_with_a_directory_of_another_uid, _regroup_it),
    ("anyone but root gives a space only a group of their own: EPERM", _root_of_the_user,
     _group_not_held),
]  # fmt: skip


@needs_root
@pytest.mark.parametrize(
    ("prepare", "act"), [pytest.param(p, a, id=i) for i, p, a in SHARED_REFUSALS]
)
def test_ctx_shared_create_refusals_make_and_change_nothing(
    world: World, unprivileged_user, prepare: Callable, act: Callable
) -> None:
    """docs/sessions.md *Shared spaces* and ``ctx shared create --help`` (X-1, X-2): a NAME
    that is not an object name, or ``cortexfs-docs``, is a usage error (EINVAL, exit 2,
    nothing made; ``ctx queue init`` refuses the bundle too); a directory of the space that
    belongs to another uid than the space's owner is not repaired but refused (EPERM,
    nothing changed); anyone but root regroups only into their own groups (EPERM)."""
    prepare(world, unprivileged_user)
    shared = world.storage / "shared"
    before_files, before_modes = snapshot(shared), modes(shared)
    run, errno_name, status = act(world, unprivileged_user)
    refused(run, errno_name, status)
    if "--json" in run.argv:
        assert run.json()["error"] == errno_name, run
    assert snapshot(shared) == before_files
    assert modes(shared) == before_modes


# ====================================================================== §10 ctxmcp


@pytest.fixture(scope="module")
def mcp(template: Path) -> Iterator[World]:
    with new_world(template) as world:
        mcp_setup(world.top / "mcp")
        yield world


def _project(w: World, *args, out: Path | None = None, runtime: str = "/mcp/mcp.json"):
    target = out if out is not None else w.top / f"out-{uuid.uuid4().hex[:8]}"
    base = ("project", "--config", w.top / "mcp" / "mcp.json", "--runtime-config", runtime)
    return ctxmcp(*base, "--out", target, *args), target


def _mcp_list(server: str, *extra):
    def provoke(w: World, user):
        return ctxmcp("list", "--config", w.top / "mcp" / "mcp.json", "--server", server,
                      "--json", *extra), None  # fmt: skip

    return provoke


def _fifo_config(w: World, user):
    fifo = w.top / f"fifo-{uuid.uuid4().hex[:8]}"
    os.mkfifo(fifo)
    return ctxmcp("list", "--config", fifo, "--server", "demo", timeout=15), None


def _runtime(value: str):
    def provoke(w: World, user):
        return _project(w, "--server", "demo", runtime=value)

    return provoke


def _out_in_the_root_not_yet_made(w: World, user):
    out = w.storage / "made-by-nobody" / "candidates"
    return _project(w, "--server", "demo", "--storage", w.storage, out=out)


def _out_a_dangling_link(w: World, user):
    link = w.top / f"link-{uuid.uuid4().hex[:8]}"
    link.symlink_to(w.top / "nowhere")
    run, _ = _project(w, "--server", "demo", out=link)
    assert not (w.top / "nowhere").exists()
    return run, None


def _out_not_writable(w: World, user):
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another uid")
    closed = w.top / f"closed-{uuid.uuid4().hex[:8]}"
    closed.mkdir(mode=0o755)
    closed.chmod(0o755)
    config = w.top / "mcp" / "mcp.json"
    argv = [*CTXMCP, "project", "--config", config, "--runtime-config", "/mcp/mcp.json",
            "--server", "demo", "--out", closed / "out"]  # fmt: skip
    return as_user(user, argv), closed / "out"


def _draft_version(w: World, user):
    return _project(w, "--server", "draft")


def _server_exits(w: World, user):
    run, out = _project(w, "--server", "exits")
    assert "exited (status 3)" in run.err, run
    return run, out


MCP_USAGE = [
    ("a server name holding a dot is EINVAL before the server starts",
     _mcp_list("a.b"), "EINVAL", 2),
    ("an env value holding NUL is refused, never shown", _mcp_list("nulenv"), "EINVAL", 2),
    ("--timeout must be in 0<x<=31622400", _mcp_list("demo", "--timeout", "0"), "EINVAL", 2),
    ("a configuration that is a FIFO is EINVAL, never opened", _fifo_config, "EINVAL", 2),
    ("a --runtime-config with a .. component is refused", _runtime("/mcp/../mcp.json"),
     "EINVAL", 2),
    ("--out inside the storage root, not made yet, is EINVAL", _out_in_the_root_not_yet_made,
     "EINVAL", 2),
    ("--out a symbolic link to nothing is ENOENT", _out_a_dangling_link, "ENOENT", 2),
    ("--out whose nearest directory the caller may not write is EACCES", _out_not_writable,
     "EACCES", 2),
    ("a negotiated draft version is EPROTO, exit 1, nothing written", _draft_version,
     "EPROTO", 1),
    ("a server that exits is EIO with its status, exit 1", _server_exits, "EIO", 1),
]  # fmt: skip


@pytest.mark.parametrize(
    ("provoke", "errno_name", "status"),
    [pytest.param(*case[1:], id=case[0]) for case in MCP_USAGE],
)
def test_ctxmcp_refusals_start_no_server_and_write_nothing(
    mcp: World, unprivileged_user, provoke: Callable, errno_name: str, status: int
) -> None:
    """docs/tools.md *MCP servers as tool sources* and ``ctxmcp --help`` (M-1 to M-4): exit 2
    for a configuration or server name that cannot be used (a ``.`` in the server's name, a
    NUL in an ``env`` value, never echoing the value; a FIFO as configuration, never
    opened), a ``--timeout`` outside its range, a ``--runtime-config`` holding ``..``, or
    an ``--out`` ctxmcp may not write into (inside the storage root though it does not exist
    yet, a link to nothing ENOENT, below a directory the caller may not write EACCES), each
    said before the server starts; exit 1 for a refused version (EPROTO) or a server that
    exited (EIO, with its status), with nothing written."""
    marker = mcp.top / "mcp" / "started"
    with contextlib.suppress(FileNotFoundError):
        marker.unlink()
    before = mcp.everything()
    run, out = provoke(mcp, unprivileged_user)
    refused(run, errno_name, status, "ctxmcp")
    if "--json" in run.argv:
        assert run.json()["error"] == errno_name, run
    assert "topsecret" not in run.err + run.out
    assert marker.exists() == (status == 1), "the server started, or did not"
    if out is not None:
        assert not os.path.lexists(out), out
    assert mcp.everything() == before


@needs_root
def test_ctxmcp_earlier_candidates_and_unwritable_output(mcp: World) -> None:
    """docs/tools.md *Earlier candidates* and *Exit statuses*: a candidate already in OUT is
    never overwritten silently: without ``--replace`` ``project`` refuses with EEXIST (exit 1)
    naming it, before anything is written, other files left alone; output that cannot be
    written is exit 74 (``ctxmcp: ENOSPC: cannot write standard output``)."""
    out = mcp.top / f"earlier-{uuid.uuid4().hex[:8]}"
    out.mkdir()
    candidate = out / "demo.echo.manifest.json"
    candidate.write_text("an earlier candidate\n")
    (out / "notes.txt").write_text("kept\n")
    run, _ = _project(mcp, "--server", "demo", "--json", out=out)
    refused(run, "EEXIST", 1, "ctxmcp")
    assert run.json()["error"] == "EEXIST" and str(candidate.name) in run.err, run
    assert candidate.read_text() == "an earlier candidate\n"
    assert sorted(os.listdir(out)) == ["demo.echo.manifest.json", "notes.txt"]
    with open("/dev/full", "wb") as full:
        listed = ctxmcp("list", "--config", mcp.top / "mcp" / "mcp.json", "--server", "demo",
                        stdout=full)  # fmt: skip
    assert listed.rc == 74, listed
    assert "ctxmcp: ENOSPC: cannot write standard output" in listed.err, listed


# ====================================================================== §12 the manual bundle


def _man(*args: str, errno_name: str = "ENOENT"):
    def provoke(w: World):
        return w.ctx("man", *args), errno_name, 1

    return provoke


def _source_lacking_a_page(w: World):
    source = w.top / "source"
    (source / "docs" / "spec").mkdir(parents=True)
    for page in (REPO / "docs" / "spec").glob("*.md"):
        if page.name != "ctx.model.md":
            shutil.copy(page, source / "docs" / "spec" / page.name)
    target = w.top / "new-root"
    run = ctx_run("bootstrap", "--storage", target, source, "--json")
    assert run.json()["error"] == "EINVAL", run
    assert not os.path.lexists(target)
    return run, "EINVAL", 2


MAN_REFUSALS = [
    ("an unknown topic is ENOENT, exit 1", _man("nosuch")),
    ("an unknown topic in --json too", _man("nosuch", "--json")),
    ("a path is no topic: ENOENT", _man("../README")),
    ("a SOURCE that lacks any page is EINVAL, exit 2, nothing made", _source_lacking_a_page),
]


@pytest.mark.parametrize("provoke", [pytest.param(p, id=i) for i, p in MAN_REFUSALS])
def test_manual_refusals(world: World, provoke: Callable) -> None:
    """docs/tools.md *ctx bootstrap* (D-1) and ``ctx man --help``: an unknown topic is ENOENT
    (exit 1); a SOURCE that lacks any page is refused with EINVAL (exit 2) before anything is
    made; the storage root is unchanged."""
    before = world.everything()
    run, errno_name, status = provoke(world)
    refused(run, errno_name, status)
    if "--json" in run.argv and run.argv[0] == "man":
        assert run.json()["error"] == errno_name, run
    assert world.everything() == before


def test_an_installed_page_that_is_a_link_is_never_followed(world: World) -> None:
    """docs/tools.md *ctx bootstrap* (D-1): ``ctx man`` reads the installed page, never
    through a symlink; for a link it falls back to the built-in copy, saying so on stderr,
    and the link's target is not shown."""
    page = world.storage / "shared" / "cortexfs-docs" / "man" / "ctx.tool.md"
    page.unlink()
    secret = world.top / "secret.md"
    secret.write_text("TOP-SECRET-PAGE\n")
    page.symlink_to(secret)
    shown = world.ctx("man", "tool")
    assert shown.rc == 0, shown
    assert "TOP-SECRET-PAGE" not in shown.out
    assert shown.out == (REPO / "docs" / "spec" / "ctx.tool.md").read_text()
    assert "symbolic link" in shown.err and "built into ctx" in shown.err, shown


# ====================================================================== sessions of agents


SESSION_REFUSALS = [
    ("--uid and --project at once are EINVAL, exit 2",
     ("show", "coder", "--uid", "65534", "--project", "proj"), "EINVAL", 2, None),
    ("a session that does not exist is ENOENT, naming ctx session list",
     ("show", "coder", "nosuch"), "ENOENT", 1, "ctx session list coder"),
    ("a shared space that does not exist is ENOENT",
     ("list", "coder", "--project", "nospace"), "ENOENT", 1, None),
]  # fmt: skip


@needs_root
@pytest.mark.parametrize(
    ("args", "errno_name", "status", "named"),
    [pytest.param(*case[1:], id=case[0]) for case in SESSION_REFUSALS],
)
def test_session_command_refusals(
    host: CoderHost, args: tuple, errno_name: str, status: int, named: str | None
) -> None:
    """docs/sessions.md *Commands*: ``--uid`` and ``--project`` at once are EINVAL, exit 2;
    a session or a shared space that does not exist is ENOENT (exit 1), the message
    naming the ``ctx session list`` command."""
    before = snapshot(host.storage)
    run = host.ctx("session", *args)
    refused(run, errno_name, status)
    if named:
        assert named in run.err, run
    assert snapshot(host.storage) == before
