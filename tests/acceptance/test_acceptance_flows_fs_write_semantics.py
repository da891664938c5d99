"""T-2, T-3, T-5, R-5 and docs/tools.md ("The core tools": the input/output table, "Paths are
confined", the paragraph on how ``fs.write`` writes): what ``fs.write`` promises and what is on
disk afterwards, with ``fs.read``, ``fs.list`` and ``fs.stat`` to look at it.

Every documented input of ``fs.write`` (``path``, ``content``, ``encoding`` utf-8/base64,
``overwrite``) and its shorthand ``fs.write PATH < FILE``, at their limits: empty content,
16 MiB, bytes that are not UTF-8, names at NAME_MAX; over targets that are no regular file
(a directory, a link, a FIFO, a socket, a device), read-only mounts, filesystems and
directories, full filesystems (bytes and inodes); concurrent writers and readers of one file;
the documented order of writes, fsyncs and the rename.  ``fs.read``'s ``offset`` and
``length``, ``fs.list`` of a large directory of long and odd names.

Real ``ctx run --agent`` calls (native and terminal) of agent ``scribe``, which runs as the
real unprivileged user ``ctxtest``, over a real workspace and real tmpfs mounts made here."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, OnStorage, new_scratch_dir, scratch_top
from tests.support.scratch_mounts import ScratchMounts
from tests.support.storage import copy_of_root
from tests.support.strace import can_inject, trace_lines
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as other uids: needs root")

SCRATCH = scratch_top(__file__)
TOOLS = ["fs.read", "fs.write", "fs.list", "fs.stat"]
MiB = 1024 * 1024
needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")


# --------------------------------------------------------------------------------- helpers


@dataclass
class World(OnStorage):
    top: Path
    storage: Path
    user: UnprivilegedUser
    ws: Path  # /workspace, the agent's own directory
    tiny: Path  # /tiny, a 64 KiB tmpfs of the agent's
    inodes: Path  # /inodes, a tmpfs with room for one file only
    rofs: Path  # /rofs, a tmpfs mounted read-only, given to the agent read-write
    shown: Path  # /shown, given to the agent read-only

    def argv(self, tool: str, *args: str, native: bool = False) -> list[str]:
        mode = ["--native"] if native else []
        return [*CTX_ARGV, "run", "--agent", "scribe", *mode, tool, *args]

    def call(self, tool: str, value: dict) -> tuple[int, dict]:
        """``ctx run --agent scribe --native TOOL`` of ``value``: exit status, result frame."""
        done = subprocess.run(self.argv(tool, native=True), env=self.env,
                              input=json.dumps(value).encode(), capture_output=True,
                              timeout=120)  # fmt: skip
        return done.returncode, last_frame(done.stdout, done.stderr)

    def plain(
        self, tool: str, *args: str, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess:
        """``ctx run --agent scribe TOOL ARGS`` (terminal mode), ``stdin`` piped in."""
        return subprocess.run(self.argv(tool, *args), env=self.env, input=stdin or b"",
                              capture_output=True, timeout=120)  # fmt: skip

    def own(self, path: Path) -> Path:
        os.chown(path, self.user.uid, self.user.gid, follow_symlinks=False)
        return path

    def fresh(self, name: str) -> Path:
        """A new directory ``name`` in the workspace, owned by the agent's uid."""
        d = self.ws / name
        d.mkdir(mode=0o755)
        return self.own(d)


def last_frame(stdout: bytes, stderr: bytes) -> dict:
    lines = stdout.decode().splitlines()
    return json.loads(lines[-1]) if lines else {"stderr": stderr.decode()}


def error_of(frame: dict) -> tuple[str | None, str | None]:
    """The result frame's errno name and stage."""
    error = frame.get("error") or {}
    return error.get("error"), error.get("stage")


def leftovers(directory: Path) -> list[str]:
    """Hidden names in ``directory``: what a write staged there and did not clean up."""
    return sorted(n for n in os.listdir(directory) if n.startswith("."))


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH)
    mounts = ScratchMounts(top)
    try:
        storage = copy_of_root(_template, top / "storage")
        ws = top / "ws"
        ws.mkdir(mode=0o755)
        os.chown(ws, user.uid, user.gid)
        ids = f"mode=0755,uid={user.uid},gid={user.gid}"
        tiny = mounts.tmpfs("tiny", f"size=64k,{ids}")
        inodes = mounts.tmpfs("inodes", f"size=1m,nr_inodes=2,{ids}")
        rofs = mounts.tmpfs("rofs", f"size=64k,{ids}")
        (rofs / "keep.txt").write_text("frozen\n")
        os.chown(rofs / "keep.txt", user.uid, user.gid)
        mounts.remount(rofs, "ro")
        shown = top / "shown"
        shown.mkdir(mode=0o755)
        os.chown(shown, user.uid, user.gid)
        w = World(top, storage, user, ws, tiny, inodes, rofs, shown)
        mount = [[str(ws), "/workspace", "rw"], [str(tiny), "/tiny", "rw"],
                 [str(inodes), "/inodes", "rw"], [str(rofs), "/rofs", "rw"],
                 [str(shown), "/shown", "ro"]]  # fmt: skip
        w.create_agent({"name": "scribe", "label": "scribe_t", "tools": TOOLS, "mount": mount},
                       "--user", user.name)  # fmt: skip
        w.allow_tool("scribe_t", *TOOLS)
        yield w
    finally:
        mounts.close()
        shutil.rmtree(top, ignore_errors=True)


# ----------------------------------------------------------------- the documented options


def test_each_option_of_fs_write_and_what_it_leaves_on_disk(world: World):
    """docs/tools.md (the table): ``created`` is true for a new file and false for a
    replacement; ``overwrite`` defaults to true, ``overwrite: false`` never replaces
    (``EEXIST``, the file untouched) but does create; ``content: ""`` makes an empty file;
    base64 content lands as its bytes and fs.read gives them back as base64; fs.stat shows the
    size and the agent's uid.  No temporary file is left in the directory."""
    d = world.fresh("options")
    rc, frame = world.call("fs.write", {"path": "options/a.txt", "content": "one\n"})
    assert (rc, frame["output"]) == (
        0, {"path": "/workspace/options/a.txt", "bytes": 4, "created": True}), frame  # fmt: skip
    rc, frame = world.call("fs.write", {"path": "options/a.txt", "content": "two!\n"})
    assert (rc, frame["output"]["created"], frame["output"]["bytes"]) == (0, False, 5), frame
    assert (d / "a.txt").read_text() == "two!\n"

    rc, frame = world.call(
        "fs.write", {"path": "options/a.txt", "content": "3", "overwrite": False}
    )
    assert (rc, frame["status"]) == (1, "error"), frame
    assert error_of(frame) == ("EEXIST", "exit"), frame
    assert (d / "a.txt").read_text() == "two!\n"
    rc, frame = world.call(
        "fs.write", {"path": "options/b.txt", "content": "b", "overwrite": False}
    )
    assert (rc, frame["output"]["created"]) == (0, True), frame

    rc, frame = world.call("fs.write", {"path": "options/empty", "content": ""})
    assert (rc, frame["output"]["bytes"]) == (0, 0), frame
    assert (d / "empty").read_bytes() == b""

    raw = bytes(range(256)) * 3 + b"\xff\xfe\x00"
    encoded = base64.b64encode(raw).decode()
    rc, frame = world.call("fs.write", {"path": "options/raw.bin", "content": encoded,
                                        "encoding": "base64"})  # fmt: skip
    assert (rc, frame["output"]["bytes"]) == (0, len(raw)), frame
    assert (d / "raw.bin").read_bytes() == raw
    rc, frame = world.call("fs.read", {"path": "options/raw.bin"})
    assert rc == 0 and frame["output"]["encoding"] == "base64", frame
    assert base64.b64decode(frame["output"]["content"]) == raw
    done = world.plain("fs.read", "options/raw.bin")  # terminal mode: the bytes themselves
    assert (done.returncode, done.stdout) == (0, raw), done.stderr

    rc, frame = world.call("fs.stat", {"path": "options/raw.bin"})
    out = frame["output"]
    assert (rc, out["type"], out["size"], out["uid"]) == (0, "file", len(raw), world.user.uid)
    assert sorted(os.listdir(d)) == ["a.txt", "b.txt", "empty", "raw.bin"]
    assert all(os.stat(d / n).st_uid == world.user.uid for n in os.listdir(d))


def test_inputs_fs_write_refuses_leave_the_file_untouched(world: World):
    """T-2, docs/tools.md: an ``encoding`` other than utf-8/base64, a string ``overwrite``
    and a missing ``content`` are refused by the schema (stage ``schema``, exit 2, the tool
    not started); content that is not base64 (wrapped lines included) is refused by the tool
    itself with ``EINVAL`` and its exit status 2 (``ctx run --native`` then exits 1); the file
    keeps its bytes, no temporary is left."""
    d = world.fresh("refused")
    (d / "f.txt").write_text("keep\n")
    world.own(d / "f.txt")
    rc, frame = world.call("fs.write", {"path": "refused/f.txt", "content": "x",
                                        "encoding": "latin-1"})  # fmt: skip
    assert (rc, error_of(frame)) == (2, ("EINVAL", "schema")), frame
    for bad in ({"content": "x", "overwrite": "false"}, {}):
        rc, frame = world.call("fs.write", {"path": "refused/f.txt", **bad})
        assert (rc, error_of(frame)) == (2, ("EINVAL", "schema")), (bad, frame)
    for content in ("no base64!", "aGVs\nbG8="):
        value = {"path": "refused/f.txt", "content": content, "encoding": "base64"}
        rc, frame = world.call("fs.write", value)
        assert (rc, error_of(frame), frame["exit_status"]) == (1, ("EINVAL", "exit"), 2), frame
        done = world.plain("fs.write", json.dumps(value))
        assert done.returncode == 2, done.stderr
        assert done.stderr.startswith(b"fs.write: EINVAL: content is not base64"), done.stderr
    assert (d / "f.txt").read_text() == "keep\n"
    assert os.listdir(d) == ["f.txt"]


def test_a_replacement_keeps_permission_bits_but_never_setuid(world: World):
    """fs.write (docs/tools.md: a temporary file renamed into place): a replaced file keeps
    its permission bits (0600 stays 0600, 0750 stays 0750) and loses setuid/setgid/sticky
    bits, as content the agent wrote must never carry them; a new file is 0644."""
    d = world.fresh("modes")
    for name, mode in (("private", 0o600), ("script", 0o750), ("suid", 0o4755), ("sgid", 0o2770)):
        (d / name).write_text("old\n")
        world.own(d / name)
        (d / name).chmod(mode)
        rc, frame = world.call("fs.write", {"path": f"modes/{name}", "content": "new\n"})
        assert rc == 0, frame
        assert stat.S_IMODE((d / name).stat().st_mode) == mode & 0o777, name
        assert (d / name).read_text() == "new\n"
    rc, frame = world.call("fs.write", {"path": "modes/fresh", "content": "x"})
    assert rc == 0, frame
    rc, frame = world.call("fs.stat", {"path": "modes/fresh"})
    assert (rc, frame["output"]["mode"]) == (0, "0644"), frame
    assert leftovers(d) == []


# ------------------------------------------------------------------------------- limits


def test_sixteen_mib_through_the_shorthand_and_one_byte_more(world: World):
    """docs/tools.md (``fs.write PATH < FILE``: other bytes as base64): 16 MiB of bytes that
    are not UTF-8 on stdin are written exactly; one byte more is ``EFBIG`` (exit 1), the file
    written before keeps every byte and no temporary is left."""
    d = world.fresh("big")
    data = (bytes(range(256)) * (16 * MiB // 256))[: 16 * MiB - 1] + b"\xff"
    assert len(data) == 16 * MiB
    done = world.plain("fs.write", "big/blob.bin", stdin=data)
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode() == f"wrote {16 * MiB} bytes to /workspace/big/blob.bin\n"
    assert (d / "blob.bin").read_bytes() == data
    done = world.plain("fs.write", "big/blob.bin", stdin=data + b"x")
    assert done.returncode == 1 and b"EFBIG" in done.stderr, done.stderr
    assert (d / "blob.bin").read_bytes() == data
    assert os.listdir(d) == ["blob.bin"]


def test_native_input_just_under_sixteen_mib_is_written_and_over_it_nothing_runs(world: World):
    """``ctx run --native`` takes at most 16 MiB of input: a content that keeps the JSON under
    it is written whole; one that takes it over is ``EFBIG`` (exit 1) before the tool runs,
    and the file keeps its bytes."""
    d = world.fresh("near")
    head = json.dumps({"path": "near/n.txt", "content": ""})
    fill = 16 * MiB - len(head) - 1  # the line break ends the input
    rc, frame = world.call("fs.write", {"path": "near/n.txt", "content": "n" * fill})
    assert (rc, frame["output"]["bytes"]) == (0, fill), frame.get("error")
    assert (d / "n.txt").stat().st_size == fill
    rc, frame = world.call("fs.write", {"path": "near/n.txt", "content": "m" * (16 * MiB)})
    assert rc == 1 and "type" not in frame, frame  # no frame: nothing was run
    assert frame["stderr"].startswith("ctx: EFBIG: "), frame
    assert (d / "n.txt").stat().st_size == fill and (d / "n.txt").read_bytes()[:1] == b"n"
    assert os.listdir(d) == ["n.txt"]


def test_nothing_on_stdin_never_empties_a_file(world: World):
    """docs/tools.md: ``fs.write PATH`` with nothing on stdin is ``EINVAL``, exit 2, the file
    untouched; ``{"path": PATH, "content": ""}`` is how a file is emptied."""
    d = world.fresh("stdin")
    (d / "f.txt").write_text("precious\n")
    world.own(d / "f.txt")
    done = world.plain("fs.write", "stdin/f.txt", stdin=b"")
    assert done.returncode == 2 and done.stderr.startswith(b"fs.write: EINVAL: "), done.stderr
    assert (d / "f.txt").read_text() == "precious\n"
    done = world.plain("fs.write", json.dumps({"path": "stdin/f.txt", "content": ""}))
    assert done.returncode == 0, done.stderr
    assert (d / "f.txt").read_bytes() == b""
    assert os.listdir(d) == ["f.txt"]


def test_names_longer_than_name_max_are_refused_and_leave_nothing(world: World):
    """A component of 256 bytes is ``ENAMETOOLONG`` (exit 1) and leaves nothing behind; one
    of 200 bytes is written and listed as it is."""
    d = world.fresh("longer")
    rc, frame = world.call("fs.write", {"path": "longer/" + "x" * 256, "content": "x"})
    assert (rc, error_of(frame)) == (1, ("ENAMETOOLONG", "exit")), frame
    assert os.listdir(d) == []
    rc, frame = world.call("fs.write", {"path": "longer/" + "y" * 200, "content": "y"})
    assert rc == 0, frame
    assert os.listdir(d) == ["y" * 200]


def test_a_name_of_name_max_bytes_is_written_and_replaced(world: World):
    """A name of 255 bytes (NAME_MAX) is a legal file name: fs.write creates it, and replaces
    a file of that name that is already there, as it does any other."""
    d = world.fresh("namemax")
    name = "n" * 255
    rc, frame = world.call("fs.write", {"path": f"namemax/{name}", "content": "new\n"})
    assert (rc, frame.get("status")) == (0, "ok"), frame.get("error")
    (d / ("m" * 255)).write_text("old\n")
    world.own(d / ("m" * 255))
    rc, frame = world.call("fs.write", {"path": "namemax/" + "m" * 255, "content": "new\n"})
    assert (rc, frame.get("status")) == (0, "ok"), frame
    assert (d / ("m" * 255)).read_text() == "new\n"


# ------------------------------------------------------------ targets that are no file


def test_targets_that_are_directories_links_or_missing(world: World):
    """docs/tools.md ("Paths are confined"): fs.write of a directory is ``EISDIR`` and of
    ``new/`` too, making nothing; of a symbolic link ``ELOOP`` (the link and the file it
    points at unchanged); under a missing directory ``ENOENT`` (no parents are made); under
    a file ``ENOTDIR``.  Each exits 1 at stage ``exit``, leaving no temporary."""
    d = world.fresh("targets")
    (d / "sub").mkdir()
    world.own(d / "sub")
    (d / "real.txt").write_text("real\n")
    (d / "link").symlink_to("real.txt")
    cases = [("targets/sub", "EISDIR"), ("targets/new/", "EISDIR"), ("targets/link", "ELOOP"),
             ("targets/no/such/f", "ENOENT"), ("targets/real.txt/f", "ENOTDIR")]  # fmt: skip
    for path, code in cases:
        rc, frame = world.call("fs.write", {"path": path, "content": "x"})
        assert (rc, error_of(frame)) == (1, (code, "exit")), (path, frame)
    assert sorted(os.listdir(d)) == ["link", "real.txt", "sub"]
    assert os.readlink(d / "link") == "real.txt" and (d / "real.txt").read_text() == "real\n"
    assert os.listdir(d / "sub") == []


def test_special_files_are_refused_with_the_errno_fs_read_gives(world: World):
    """T-2, docs/tools.md: a FIFO, a Unix socket and a character device are not regular
    files: fs.write refuses each without writing into it or replacing it, with the errno
    fs.read gives for such a node (``EINVAL``, "not a regular file"), not ``EISDIR``."""
    d = world.fresh("special")
    os.mkfifo(d / "fifo")
    os.mknod(d / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(d / "sock"))
    codes = {}
    try:
        for name in ("fifo", "sock", "null"):
            world.own(d / name)
            rc, frame = world.call("fs.write", {"path": f"special/{name}", "content": "x"})
            assert (rc, frame.get("status")) == (1, "error"), (name, frame)
            codes[name] = error_of(frame)[0]
    finally:
        listener.close()
    assert stat.S_ISFIFO(os.lstat(d / "fifo").st_mode) and stat.S_ISSOCK(
        os.lstat(d / "sock").st_mode
    )
    assert stat.S_ISCHR(os.lstat(d / "null").st_mode)
    assert sorted(os.listdir(d)) == ["fifo", "null", "sock"]
    rc, frame = world.call("fs.read", {"path": "special/fifo"})
    assert error_of(frame)[0] == "EINVAL", frame
    assert codes == {"fifo": "EINVAL", "sock": "EINVAL", "null": "EINVAL"}, codes


# ------------------------------------------------------------- read-only, full, denied


def test_read_only_mounts_filesystems_and_directories(world: World):
    """docs/tools.md: a read-only mount of the agent's is ``EROFS`` before anything is
    touched; a read-only filesystem behind a read-write mount is the kernel's ``EROFS``; a
    directory of the agent's mode 0555 is the kernel's ``EACCES``.  Each file keeps its
    bytes and no temporary is left."""
    (world.shown / "s.txt").write_text("shown\n")
    rc, frame = world.call("fs.write", {"path": "/shown/s.txt", "content": "x"})
    assert (rc, error_of(frame)) == (1, ("EROFS", "exit")), frame
    rc, frame = world.call("fs.write", {"path": "/rofs/keep.txt", "content": "x"})
    assert (rc, error_of(frame)) == (1, ("EROFS", "exit")), frame
    d = world.fresh("locked")
    (d / "l.txt").write_text("locked\n")
    world.own(d / "l.txt")
    d.chmod(0o555)
    try:
        for path in ("locked/l.txt", "locked/new.txt"):
            rc, frame = world.call("fs.write", {"path": path, "content": "x"})
            assert (rc, error_of(frame)) == (1, ("EACCES", "exit")), (path, frame)
    finally:
        d.chmod(0o755)
    assert (world.shown / "s.txt").read_text() == "shown\n"
    assert (world.rofs / "keep.txt").read_text() == "frozen\n"
    assert (d / "l.txt").read_text() == "locked\n"
    assert os.listdir(d) == ["l.txt"] and sorted(os.listdir(world.shown)) == ["s.txt"]


def test_a_filesystem_out_of_inodes_or_bytes_keeps_old_files_and_leaves_no_partial_one(
    world: World,
):
    """docs/tools.md (a temporary file, fsynced, renamed into place): on a tmpfs without a
    free inode, replacing its one file and creating another are ``ENOSPC``, the file
    unchanged; on a 64 KiB tmpfs a new file of 200 KiB is ``ENOSPC`` and no part of it,
    under its name or a temporary one, is left."""
    (world.inodes / "only.txt").write_text("only\n")
    world.own(world.inodes / "only.txt")
    for path in ("/inodes/only.txt", "/inodes/second.txt"):
        rc, frame = world.call("fs.write", {"path": path, "content": "more\n"})
        assert (rc, error_of(frame)) == (1, ("ENOSPC", "exit")), (path, frame)
    assert os.listdir(world.inodes) == ["only.txt"]
    assert (world.inodes / "only.txt").read_text() == "only\n"
    rc, frame = world.call("fs.write", {"path": "/tiny/huge.txt", "content": "h" * 200 * 1024})
    assert (rc, error_of(frame)) == (1, ("ENOSPC", "exit")), frame
    assert os.listdir(world.tiny) == []
    rc, frame = world.call("fs.write", {"path": "/tiny/fits.txt", "content": "f" * 1024})
    assert rc == 0, frame  # the space the failed write took was given back


# ------------------------------------------------------------------------- concurrency


def spawn_write(world: World) -> subprocess.Popen:
    return subprocess.Popen(world.argv("fs.write", native=True), env=world.env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip


def finish(proc: subprocess.Popen, value: dict) -> tuple[int, dict]:
    out, err = proc.communicate(json.dumps(value).encode(), timeout=120)
    return proc.returncode, last_frame(out, err)


def test_concurrent_writers_leave_one_whole_version(world: World):
    """docs/tools.md (fs.write renames a complete, fsynced file into place): six writers of
    one existing file at once all succeed; the file then holds exactly one writer's bytes,
    whole, and no temporary file of any of them is left."""
    d = world.fresh("many-writers")
    (d / "shared.txt").write_text("start\n")
    world.own(d / "shared.txt")
    values = [{"path": "many-writers/shared.txt", "content": f"{i}" * (256 * 1024 + i)}
              for i in range(6)]  # fmt: skip
    procs = [spawn_write(world) for _ in values]
    results = [finish(p, v) for p, v in zip(procs, values, strict=True)]
    assert all(rc == 0 and frame["output"]["created"] is False for rc, frame in results), results
    assert (d / "shared.txt").read_text() in {v["content"] for v in values}
    assert os.listdir(d) == ["shared.txt"]


def test_concurrent_creators_without_overwrite_have_exactly_one_winner(world: World):
    """docs/tools.md (``overwrite: false`` never replaces): six calls creating one new name
    at once with ``overwrite: false``: exactly one succeeds (``created``), the others are
    ``EEXIST``, and the file holds the winner's bytes."""
    d = world.fresh("creators")
    values = [{"path": "creators/once.txt", "content": f"creator {i}\n", "overwrite": False}
              for i in range(6)]  # fmt: skip
    procs = [spawn_write(world) for _ in values]
    results = [finish(p, v) for p, v in zip(procs, values, strict=True)]
    won = [i for i, (rc, frame) in enumerate(results) if rc == 0]
    assert len(won) == 1, results
    assert results[won[0]][1]["output"]["created"] is True
    lost = [error_of(frame)[0] for rc, frame in results if rc != 0]
    assert lost == ["EEXIST"] * 5, results
    assert (d / "once.txt").read_text() == f"creator {won[0]}\n"
    assert os.listdir(d) == ["once.txt"]


def test_a_reader_sees_the_old_file_or_the_new_never_a_mix(world: World):
    """docs/tools.md (renamed into place): while fs.write replaces a file again and again
    with 1 MiB of ``a`` or 2 MiB of ``b``, a reader opening it over and over reads one
    whole version each time, never a file cut short or of mixed bytes."""
    d = world.fresh("readers")
    target = d / "doc.txt"
    target.write_text("a" * MiB)
    world.own(target)
    wholes = {b"a" * MiB, b"b" * 2 * MiB}
    seen: list[bytes] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            data = target.read_bytes()
            if data not in wholes:
                seen.append(data[:64] + b"..." + str(len(data)).encode())

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for turn in range(4):
            content = "b" * 2 * MiB if turn % 2 == 0 else "a" * MiB
            rc, frame = world.call("fs.write", {"path": "readers/doc.txt", "content": content})
            assert rc == 0, frame
    finally:
        stop.set()
        reader.join()
    assert seen == []
    assert target.read_bytes() == b"a" * MiB and os.listdir(d) == ["doc.txt"]


@needs_strace
def test_overwrite_true_replaces_a_file_that_appears_while_it_writes(world: World):
    """docs/tools.md (``overwrite`` default true): a file that another writer creates while
    fs.write is writing its new file (its rename held back 2 s by strace) is replaced all
    the same: the call succeeds and the file holds the call's bytes."""
    if not can_inject():
        pytest.skip("strace cannot inject here")
    d = world.fresh("appears")
    argv = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=rename,renameat,renameat2",
            "-e", "inject=rename,renameat,renameat2:delay_enter=2000000",
            *world.argv("fs.write", native=True)]  # fmt: skip
    proc = subprocess.Popen(argv, env=world.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"path": "appears/f.txt", "content": "mine\n"}).encode())
    proc.stdin.close()
    deadline = time.monotonic() + 60
    while not any(n.startswith(".f.txt.") for n in os.listdir(d)):
        assert time.monotonic() < deadline and proc.poll() is None, "no temporary file appeared"
        time.sleep(0.005)
    (d / "f.txt").write_text("theirs\n")
    world.own(d / "f.txt")
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.wait(timeout=120)
    frame = last_frame(out, err)
    assert frame.get("status") == "ok", frame.get("error")
    assert (d / "f.txt").read_text() == "mine\n"
    assert os.listdir(d) == ["f.txt"]


# --------------------------------------------------------------------------- durability

_OPEN_TEMP = re.compile(
    r'^(\d+)\s+openat\((\d+), "(\.[^"]*\.tmp)", O_WRONLY\|O_CREAT\|O_EXCL.*= (\d+)$'
)


@needs_strace
def test_the_documented_order_write_fsync_rename_fsync_directory(world: World):
    """docs/tools.md: "fs.write writes a temporary file in the same directory, fsyncs it and
    renames it into place ..., then syncs the directory" — in the tool's process, the
    temporary is created exclusively in the target's directory, written, fsynced, renamed
    onto the name, and that directory is fsynced, all before the tool prints its answer."""
    d = world.fresh("durable")
    log = world.top / "durable.trace"
    argv = ["strace", "-f", "-qq", "-o", str(log), "-e",
            "trace=openat,write,fsync,fdatasync,rename,renameat,renameat2,close",
            *world.argv("fs.write", native=True)]  # fmt: skip
    done = subprocess.run(
        argv,
        env=world.env,
        capture_output=True,
        timeout=120,
        input=json.dumps({"path": "durable/d.txt", "content": "kept"}).encode(),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (d / "d.txt").read_text() == "kept"
    lines = trace_lines(log)
    opened = [m for m in map(_OPEN_TEMP.match, lines) if m]
    assert len(opened) == 1, [line for line in lines if ".tmp" in line]
    pid, dir_fd, temp, fd = opened[0].groups()
    mine = [line.split(None, 1)[1] for line in lines if line.split(None, 1)[0] == pid]
    start = next(i for i, call in enumerate(mine) if temp in call and call.startswith("openat"))
    after = mine[start:]

    def first(prefix: str, holding: str = "") -> int:
        return next(
            i for i, call in enumerate(after) if call.startswith(prefix) and holding in call
        )

    wrote = first(f"write({fd},", '"kept"')
    synced = first(f"fsync({fd})")
    renamed = first("rename", f'"{temp}", {dir_fd}, "d.txt"')
    dir_synced = next(
        i for i, c in enumerate(after) if i > renamed and c.startswith(f"fsync({dir_fd})")
    )
    answered = first("write(1,")
    assert wrote < synced < renamed < dir_synced < answered, after


# ----------------------------------------------------------------- fs.read and fs.list


def test_fs_read_offsets_and_lengths(world: World):
    """docs/tools.md (fs.read: ``offset``, ``length`` ≤ 1 MiB): a file over 1 MiB is read by
    default as its first MiB, ``truncated``; chunks of ``offset``/``length`` give the whole
    file back; at or past the end the content is empty and not truncated; length 0 is empty;
    length over 1 MiB or a negative offset is ``EINVAL``; a chunk that splits a UTF-8
    character comes back as base64."""
    d = world.fresh("reads")
    text = ("é" * 100 + "line\n") * 10_000  # 1.05 MB, with two-byte characters
    data = text.encode()
    (d / "r.txt").write_bytes(data)
    rc, frame = world.call("fs.read", {"path": "reads/r.txt"})
    out = frame["output"]
    assert (rc, out["size"], out["offset"], out["truncated"]) == (0, len(data), 0, True), out[
        "size"
    ]
    assert len(out["content"].encode()) == MiB or out["encoding"] == "base64"
    got = b""
    while len(got) < len(data):
        rc, frame = world.call("fs.read", {"path": "reads/r.txt", "offset": len(got),
                                           "length": 700_001})  # fmt: skip
        out = frame["output"]
        assert rc == 0 and out["offset"] == len(got), frame.get("error")
        chunk = (
            base64.b64decode(out["content"])
            if out["encoding"] == "base64"
            else out["content"].encode()
        )
        got += chunk
        assert out["truncated"] is (len(got) < len(data))
    assert got == data
    for offset, length in ((len(data), MiB), (len(data) + 10**9, 10), (0, 0)):
        rc, frame = world.call(
            "fs.read", {"path": "reads/r.txt", "offset": offset, "length": length}
        )
        out = frame["output"]
        assert (rc, out["content"], out["truncated"]) == (0, "", offset == 0), (offset, frame)
    rc, frame = world.call("fs.read", {"path": "reads/r.txt", "offset": 1, "length": 1})
    assert (rc, frame["output"]["encoding"], frame["output"]["content"]) == (0, "base64", "qQ==")
    for bad in ({"length": MiB + 1}, {"offset": -1}, {"length": -1}):
        rc, frame = world.call("fs.read", {"path": "reads/r.txt", **bad})
        assert (rc, error_of(frame)) == (2, ("EINVAL", "schema")), (bad, frame)


def test_fs_read_offset_beyond_any_file_offset_is_einval_without_a_traceback(world: World):
    """T-2, docs/tools.md: "a failure prints ``<tool>: <ERRNO>: <sentence>`` on stderr":
    an ``offset`` of 2**63 (past what any file offset can be) is bad input, refused with
    ``EINVAL``, never a traceback."""
    d = world.fresh("offset")
    (d / "o.txt").write_text("o\n")
    done = world.plain("fs.read", json.dumps({"path": "offset/o.txt", "offset": 2**63}))
    assert b"Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(b"fs.read: EINVAL: "), done.stderr
    rc, frame = world.call("fs.read", {"path": "offset/o.txt", "offset": 2**64})
    assert rc != 0 and error_of(frame)[0] == "EINVAL", frame


def test_fs_list_of_a_large_directory_of_long_and_odd_names(world: World):
    """docs/tools.md (fs.list: ``entries`` of ``name``, ``type``, ``size``): 2 000 names of
    255 bytes beside names that begin with ``-`` or a space, end with a space, hold a
    newline or look like fs.write's temporaries are each listed once, in name order, with
    their type and size, and each reads back through fs.stat."""
    d = world.fresh("listing")
    names = [f"{i:04d}".ljust(255, "z") for i in range(2000)]
    odd = ["-n", " lead", "trail ", "new\nline", ".x.tmp", "sp ace", "*"]
    for i, name in enumerate(names + odd):
        (d / name).write_bytes(b"q" * (i % 5))
    (d / "subdir").mkdir()
    rc, frame = world.call("fs.list", {"path": "listing"})
    assert rc == 0, frame.get("error")
    entries = frame["output"]["entries"]
    expected = sorted([*names, *odd, "subdir"])
    assert [e["name"] for e in entries] == expected
    sizes = {name: i % 5 for i, name in enumerate(names + odd)}
    for e in entries:
        if e["name"] == "subdir":
            assert e["type"] == "directory"
        else:
            assert (e["type"], e["size"]) == ("file", sizes[e["name"]]), e
    for name in odd:
        rc, frame = world.call("fs.stat", {"path": f"listing/{name}"})
        assert (rc, frame["output"]["size"]) == (0, sizes[name]), (name, frame)
