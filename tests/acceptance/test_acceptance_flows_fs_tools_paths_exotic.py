"""T-1, T-2, T-5 and docs/tools.md ("Paths are confined", the core tool table): the fs.*
core tools (fs.read, fs.write, fs.list, fs.stat) over exotic objects inside an agent's
visible mounts — a FIFO, a socket, a device node, ``/proc`` files that report size 0, a file
growing while it is read, names holding control characters or bytes that are not UTF-8, a path
of PATH_MAX, a directory of 10 000 entries, a read-only file, a full filesystem — and each
tool's exit status and error object.  Real ``ctx run`` calls by agent ``diver`` (uid nobody)
over a real workspace, a real tmpfs and a real bind of ``/proc/sys/kernel``."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, OnStorage, new_scratch_dir, scratch_top
from tests.support.scratch_mounts import ScratchMounts
from tests.support.storage import copy_of_root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as other uids: needs root")

SCRATCH = scratch_top(__file__)
TOOLS = ["fs.read", "fs.write", "fs.list", "fs.stat"]
NOBODY = 65534


@dataclass
class World(OnStorage):
    top: Path
    storage: Path
    ws: Path  # /workspace, owned by nobody
    full: Path  # /full, a 64 KiB tmpfs owned by nobody

    def call(self, tool: str, value: dict) -> tuple[int, dict]:
        """``ctx run --agent diver --native TOOL`` of ``value``: exit status, result frame."""
        argv = [*CTX_ARGV, "run", "--agent", "diver", "--native", tool]
        done = subprocess.run(argv, env=self.env, input=json.dumps(value).encode(),
                              capture_output=True, timeout=60)  # fmt: skip
        lines = done.stdout.decode().splitlines()
        frame = json.loads(lines[-1]) if lines else {"stderr": done.stderr.decode()}
        return done.returncode, frame

    def plain(self, tool: str, *args: str) -> subprocess.CompletedProcess:
        argv = [*CTX_ARGV, "run", "--agent", "diver", tool, *args]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)


def errno_of(frame: dict) -> str | None:
    return (frame.get("error") or {}).get("error")


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH)
    mounts = ScratchMounts(top)
    try:
        storage = copy_of_root(_template, top / "storage")
        ws = top / "ws"
        ws.mkdir(mode=0o755)
        os.chown(ws, NOBODY, NOBODY)
        full = mounts.tmpfs("full", f"size=64k,mode=0755,uid={NOBODY},gid={NOBODY}")
        kern = mounts.bind(Path("/proc/sys/kernel"), "kern")
        w = World(top, storage, ws, full)
        w.create_agent({"name": "diver", "label": "diver_t", "tools": TOOLS,
                        "mount": [[str(ws), "/workspace", "rw"], [str(full), "/full", "rw"],
                                  [str(kern), "/kern", "ro"]]})  # fmt: skip
        w.allow_tool("diver_t", *TOOLS)
        yield w
    finally:
        mounts.close()
        shutil.rmtree(top, ignore_errors=True)


def fresh(world: World, name: str) -> Path:
    """A new directory ``name`` in the workspace, owned by the agent's uid."""
    d = world.ws / name
    d.mkdir(mode=0o755)
    os.chown(d, NOBODY, NOBODY)
    return d


def test_a_fifo_is_refused_by_fs_read_without_waiting_for_a_writer(world: World):
    """T-2, T-5: fs.read of a FIFO with no writer ends with an error (never blocks until the
    call times out); fs.stat and fs.list name it ``other``; fs.write replaces nothing through
    it: either an error or a regular file in its place, never a write into the pipe."""
    d = fresh(world, "fifo")
    os.mkfifo(d / "p")
    rc, frame = world.call("fs.read", {"path": "fifo/p"})
    assert (rc, frame.get("status")) == (1, "error"), frame
    assert errno_of(frame) == "EINVAL" and "not a regular file" in frame["error"]["message"], frame
    rc, frame = world.call("fs.write", {"path": "fifo/p", "content": "x"})
    assert (rc, frame.get("status")) == (1, "error"), frame
    assert stat.S_ISFIFO(os.lstat(d / "p").st_mode) and os.listdir(d) == ["p"]
    rc, frame = world.call("fs.stat", {"path": "fifo/p"})
    assert (rc, frame["output"]["type"]) == (0, "other"), frame
    rc, frame = world.call("fs.list", {"path": "fifo"})
    assert rc == 0 and frame["output"]["entries"][0]["type"] == "other", frame


def test_a_socket_and_a_device_node_are_not_read_as_files(world: World):
    """T-5: a listening Unix socket and a character device (``/dev/zero``'s numbers) inside
    the mount are not regular files: fs.read refuses each with an error (never connects, never
    hands out a MiB of a device's bytes), fs.stat calls them ``other``."""
    d = fresh(world, "special")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(d / "sock"))
    listener.listen(1)
    listener.settimeout(0.1)
    os.mknod(d / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    try:
        for name in ("sock", "zero"):
            rc, frame = world.call("fs.read", {"path": f"special/{name}"})
            # docs/tools.md: "of a FIFO, a socket or a device, EINVAL (neither opens one)"
            assert (rc, errno_of(frame)) == (1, "EINVAL"), frame
            rc, frame = world.call("fs.stat", {"path": f"special/{name}"})
            assert (rc, frame["output"]["type"]) == (0, "other"), (name, frame)
        with pytest.raises(TimeoutError):
            listener.accept()  # nobody connected
    finally:
        listener.close()


def test_proc_files_reporting_size_zero_are_read_whole(world: World):
    """T-5, docs/tools.md (fs.read's ``size``, ``content``): a ``/proc/sys`` file whose stat
    says size 0 is read by its content, as ``cat`` would, not as an empty file."""
    expected = Path("/proc/sys/kernel/ostype").read_text()
    assert os.stat("/proc/sys/kernel/ostype").st_size == 0
    rc, frame = world.call("fs.read", {"path": "/kern/ostype"})
    assert rc == 0, frame
    assert frame["output"]["content"] == expected, frame
    assert frame["output"]["truncated"] is False, frame
    rc, frame = world.call("fs.read", {"path": "/kern/ostype", "offset": 1, "length": 3})
    assert (rc, frame["output"]["content"]) == (0, expected[1:4]), frame


def test_a_file_growing_while_read_gives_a_consistent_prefix(world: World):
    """docs/tools.md (fs.read): a file appended to while fs.read runs gives a prefix of what
    the file holds after, and ``size`` is at least the bytes returned; no error."""
    d = fresh(world, "grow")
    target = d / "log.txt"
    target.write_text("".join(f"line {i:07d}\n" for i in range(20000)))
    stop = threading.Event()

    def append() -> None:
        with target.open("a") as f:
            while not stop.is_set():
                f.write("more more more\n")
                f.flush()

    writer = threading.Thread(target=append)
    writer.start()
    try:
        rc, frame = world.call("fs.read", {"path": "grow/log.txt"})
    finally:
        stop.set()
        writer.join()
    assert rc == 0, frame
    out = frame["output"]
    assert target.read_text().startswith(out["content"]), out["size"]
    assert out["size"] >= len(out["content"].encode()), out["size"]


def test_names_of_control_characters_and_non_utf8_bytes_round_trip(world: World):
    """docs/tools.md: a name that is not UTF-8 leaves fs.list with each odd byte as its
    surrogate escape and comes back into fs.read, fs.stat and fs.write as the same name; a
    name of control characters (ESC, BEL, TAB) is listed and read alike."""
    d = fresh(world, "names")
    raw = [b"caf\xe9", b"a\x1b[31mred\x07\ttab", b"\xff\xfe"]
    for i, name in enumerate(raw):
        (d / os.fsdecode(name)).write_text(f"content {i}\n")
    rc, frame = world.call("fs.list", {"path": "names"})
    assert rc == 0, frame
    listed = sorted(e["name"] for e in frame["output"]["entries"])
    assert listed == sorted(os.fsdecode(n) for n in raw), listed
    for i, name in enumerate(raw):
        path = "names/" + os.fsdecode(name)
        rc, frame = world.call("fs.read", {"path": path})
        assert (rc, frame["output"]["content"]) == (0, f"content {i}\n"), (name, frame)
        rc, frame = world.call("fs.write", {"path": path, "content": "new\n"})
        assert rc == 0, (name, frame)
        assert (d / os.fsdecode(name)).read_text() == "new\n"
    assert sorted(os.listdir(os.fsencode(d))) == sorted(raw)


def test_a_path_of_path_max_is_refused_and_one_below_works(world: World):
    """T-5: a view path of 4095 bytes (PATH_MAX less its NUL) reaches its file, walked one
    component at a time though the host path is longer than PATH_MAX; one of 4096 bytes
    naming nothing is an error (exit 1), never a traceback."""
    d = fresh(world, "deep")
    prefix = "/workspace/deep"
    comp = "d" * 200
    parts: list[str] = []
    while len(prefix) + sum(len(p) + 1 for p in parts) + 1 + 200 < 4095 - 20:
        parts.append(comp)
    base = prefix + "".join("/" + p for p in parts) + "/"
    name = "f" * (4095 - len(base))
    view = base + name
    assert len(view) == 4095
    fd = os.open(d, os.O_DIRECTORY)
    try:
        for p in parts:  # the host path is longer than PATH_MAX: made one step at a time
            os.mkdir(p, dir_fd=fd)
            os.chown(p, NOBODY, NOBODY, dir_fd=fd)
            inner = os.open(p, os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    rc, frame = world.call("fs.stat", {"path": view})
    assert (rc, frame["output"]["type"]) == (0, "file"), frame
    rc, frame = world.call("fs.stat", {"path": view + "g"})
    assert (rc, frame.get("status")) == (1, "error"), frame
    assert errno_of(frame) in ("ENAMETOOLONG", "ENOENT"), frame


def test_a_directory_of_ten_thousand_entries_is_listed_whole(world: World):
    """docs/tools.md (fs.list): every entry of a directory of 10 000 files is listed, each
    once, with its type and size."""
    d = fresh(world, "many")
    for i in range(10000):
        (d / f"n{i:05d}").write_bytes(b"x" * (i % 7))
    rc, frame = world.call("fs.list", {"path": "many"})
    assert rc == 0, frame.get("error")
    entries = frame["output"]["entries"]
    assert len(entries) == 10000
    assert {e["name"] for e in entries} == {f"n{i:05d}" for i in range(10000)}
    assert all(e["type"] == "file" and e["size"] == int(e["name"][1:]) % 7 for e in entries)


def test_fs_write_over_a_read_only_file_follows_the_rename_rule(world: World):
    """docs/tools.md (fs.write): the rename asks write on the directory, not on the file: in
    a plain directory of the agent a root-owned 0444 file is replaced by the agent's own; in
    a sticky directory the kernel refuses (``EACCES`` or ``EPERM``) and the file stays."""
    d = fresh(world, "ro")
    (d / "locked.txt").write_text("root\n")
    (d / "locked.txt").chmod(0o444)
    rc, frame = world.call("fs.write", {"path": "ro/locked.txt", "content": "agent\n"})
    assert rc == 0, frame
    assert (d / "locked.txt").read_text() == "agent\n"
    assert (d / "locked.txt").stat().st_uid == NOBODY
    sticky = world.ws / "sticky"  # root's, like /tmp: its owner could replace anything
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "locked.txt").write_text("root\n")
    (sticky / "locked.txt").chmod(0o444)
    rc, frame = world.call("fs.write", {"path": "sticky/locked.txt", "content": "agent\n"})
    assert (rc, frame.get("status")) == (1, "error"), frame
    assert errno_of(frame) in ("EACCES", "EPERM"), frame
    assert (sticky / "locked.txt").read_text() == "root\n"
    assert os.listdir(sticky) == ["locked.txt"]  # no temporary file left behind


def test_a_full_filesystem_is_enospc_and_leaves_the_old_file_and_no_temporary(world: World):
    """docs/tools.md (fs.write writes a temporary file and renames it): on a full tmpfs the
    write fails ``ENOSPC`` (exit 1), the file it would have replaced keeps its bytes and no
    temporary file is left to fill the filesystem further."""
    (world.full / "keep.txt").write_text("old\n")
    os.chown(world.full / "keep.txt", NOBODY, NOBODY)
    big = "z" * (200 * 1024)
    rc, frame = world.call("fs.write", {"path": "/full/keep.txt", "content": big})
    assert (rc, frame.get("status"), errno_of(frame)) == (1, "error", "ENOSPC"), frame
    assert (world.full / "keep.txt").read_text() == "old\n"
    assert os.listdir(world.full) == ["keep.txt"]


def test_each_tool_exits_1_on_failure_and_2_on_bad_input_with_its_errno_line(world: World):
    """T-2, docs/tools.md: a failure prints ``<tool>: <ERRNO>: <sentence>`` on stderr and
    exits 1; bad input (a lone surrogate, a key the schema lacks) is ``EINVAL``, exit 2."""
    for tool in ("fs.read", "fs.stat", "fs.list"):
        done = world.plain(tool, "/workspace/no-such")
        assert done.returncode == 1, (tool, done)
        assert done.stderr.startswith(f"{tool}: ENOENT: "), (tool, done.stderr)
    done = world.plain("fs.write", json.dumps({"path": "/workspace/x", "content": "y", "pth": 1}))
    assert done.returncode == 2, done
    assert done.stderr.startswith("fs.write: EINVAL: "), done.stderr
    done = world.plain("fs.read", json.dumps({"path": "\ud800"}))
    assert done.returncode == 2 and "EINVAL" in done.stderr, done
