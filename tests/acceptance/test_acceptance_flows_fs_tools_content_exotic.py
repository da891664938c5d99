"""R-5, T-2, T-3, T-7, S-4, W-1 and docs/tools.md ("The core tools": the input/output table),
with the installed manual ``ctx.coreutils`` (``truncated`` "is true when the file goes on after
what was read"; fs.list's terminal output is "one name per line"): the core tools ``fs.read``,
``fs.write``, ``fs.list``, ``fs.stat`` and ``shell.exec`` over exotic *content*.

Every byte value, NUL bytes, bytes that are not UTF-8 (a lone Latin-1 byte, UTF-16 with its
BOM, an encoded surrogate, an overlong form), a UTF-8 BOM, CRLF line ends, a line of a MiB
with no line end, empty files, files of exactly the 1 MiB a read returns and one byte more, a
sparse file of 8 GiB, ``/proc`` and ``/sys`` files whose size says nothing of their content, a
file rewritten and cut while it is read, offsets and lengths at and past their ends (2⁶³ − 1,
10³⁰, ``1.0``), the two documented encodings and what is not one of them, fs.write's
replacement by rename (an old descriptor, a hard link) and ``overwrite: false``, a listing of
names holding a line break, a listing past the runner's 16 MiB output bound — in native and
terminal mode and through a queue worker, with the records (session events, tool logs) held to
the S-4 summary.

Real ``ctx run --agent`` calls and a real ``ctx queue work`` of agent ``lumen``, which runs as
the real unprivileged user ``ctxtest``, over a real tmpfs workspace mounted here."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    QueueCLI,
    find_values,
    new_scratch_dir,
    read_jsonl,
    request,
    scratch_top,
)
from tests.support.scratch_mounts import ScratchMounts
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as other uids: needs root")

SCRATCH = scratch_top(__file__)
AGENT = "lumen"
TOOLS = ["fs.read", "fs.write", "fs.list", "fs.stat", "shell.exec"]
MiB = 1024 * 1024
OUTPUT_LIMIT = 16 * MiB  # the runner's bound on a tool's captured output
MAX_OFFSET = 2**63 - 1  # docs/tools.md: fs.read's offset (≤ 2⁶³ − 1)
# S-4 (docs/sessions.md): a string keeps 200 characters, a summary past 8 KiB is a note.
RECORD_LINE_BOUND = 32 * 1024
RECORDED_STRING_BOUND = 300
# /sys/kernel files whose size (a page) says nothing of their few bytes of content.
SYS_CANDIDATES = ("cpu_byteorder", "address_bits", "fscaps", "profiling",
                  "mm/transparent_hugepage/enabled")  # fmt: skip


# --------------------------------------------------------------------------------- helpers


@dataclass
class World(OnStorage):
    top: Path
    storage: Path
    user: UnprivilegedUser
    ws: Path  # /workspace: a tmpfs of the agent's uid
    sys_name: str | None  # a file below /sysk (/sys/kernel) reporting more than it holds

    def argv(self, tool: str, *args: str, native: bool = False) -> list[str]:
        mode = ["--native"] if native else []
        return [*CTX_ARGV, "run", "--agent", AGENT, *mode, tool, *args]

    def call(self, tool: str, value: dict) -> tuple[int, dict]:
        """``ctx run --agent lumen --native TOOL`` of ``value``: exit status, result frame."""
        done = subprocess.run(self.argv(tool, native=True), env=self.env,
                              input=json.dumps(value).encode(), capture_output=True,
                              timeout=120)  # fmt: skip
        lines = done.stdout.decode().splitlines()
        frame = json.loads(lines[-1]) if lines else {"stderr": done.stderr.decode()}
        return done.returncode, frame

    def plain(self, tool: str, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
        """``ctx run --agent lumen TOOL ARGS`` (terminal mode), ``stdin`` piped in; bytes."""
        return subprocess.run(self.argv(tool, *args), env=self.env, input=stdin,
                              capture_output=True, timeout=120)  # fmt: skip

    def fresh(self, name: str) -> Path:
        """A new directory ``name`` in the workspace, owned by the agent's uid."""
        d = self.ws / name
        d.mkdir(mode=0o755)
        os.chown(d, self.user.uid, self.user.gid)
        return d

    def put(self, path: Path, data: bytes) -> Path:
        path.write_bytes(data)
        os.chown(path, self.user.uid, self.user.gid)
        return path

    def sessions(self) -> Path:
        return self.storage / "home" / str(self.user.uid) / "agent" / AGENT / "session"


def error_of(frame: dict) -> tuple[str | None, str | None]:
    """The result frame's errno name and stage."""
    error = frame.get("error") or {}
    return error.get("error"), error.get("stage")


def data_of(output: dict) -> bytes:
    """The bytes an fs.read output stands for, whichever encoding it chose."""
    if output["encoding"] == "base64":
        return base64.b64decode(output["content"], validate=True)
    assert output["encoding"] == "utf-8", output["encoding"]
    return output["content"].encode()


def records_of(world: World, call: str) -> list[tuple[Path, str]]:
    """Every line of the agent's session events and of the core tools' logs that names
    ``call``, with the file it is in."""
    files = [*world.sessions().glob("*/events.jsonl")]
    files += [world.storage / "tool" / f"{tool}.d" / "log" for tool in TOOLS]
    found = []
    for path in files:
        if path.exists():
            found += [(path, line) for line in path.read_text().splitlines() if call in line]
    return found


def assert_recorded_small(world: World, call: str) -> None:
    """S-4: the call is recorded (its tool_result in the session and one line in the tool's
    log), each line a small summary, never the content itself."""
    found = records_of(world, call)
    kinds = sorted(json.loads(line)["type"] for path, line in found)
    assert kinds.count("tool_result") == 2 and "tool_call" in kinds, found
    for path, line in found:
        assert len(line.encode()) <= RECORD_LINE_BOUND, (path, len(line))
        for key in ("content", "output"):
            for value in find_values(json.loads(line), key):
                if isinstance(value, str):
                    assert len(value) <= RECORDED_STRING_BOUND, (path, key, len(value))


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH)
    mounts = ScratchMounts(top)
    try:
        storage = copy_of_root(_template, top / "storage")
        ws = mounts.tmpfs("ws", f"size=160m,mode=0755,uid={user.uid},gid={user.gid}")
        sys_name = None
        for name in SYS_CANDIDATES:
            path = Path("/sys/kernel") / name
            try:
                if path.stat().st_mode & 0o004 and 0 < len(path.read_bytes()) < path.stat().st_size:
                    sys_name = name
                    break
            except OSError:
                continue
        w = World(top, storage, user, ws, sys_name)
        mount = [[str(ws), "/workspace", "rw"], ["/proc/sys/kernel", "/kern", "ro"],
                 ["/sys/kernel", "/sysk", "ro"]]  # fmt: skip
        w.create_agent({"name": AGENT, "label": f"{AGENT}_t", "tools": TOOLS, "mount": mount},
                       "--user", user.name)  # fmt: skip
        w.allow_tool(f"{AGENT}_t", *TOOLS)
        yield w
    finally:
        mounts.close()
        shutil.rmtree(top, ignore_errors=True)


# ----------------------------------------------------------- bytes in, the same bytes out


def test_every_byte_value_round_trips_through_base64(world: World):
    """docs/tools.md (fs.write ``encoding`` base64; fs.read ``encoding`` base64 "for other
    bytes"): the 256 byte values and a run of NULs are written exactly, read back as base64
    of exactly those bytes, and fs.stat and fs.list give their size."""
    d = world.fresh("allbytes")
    data = bytes(range(256)) * 2 + b"\0" * 10
    rc, frame = world.call("fs.write", {"path": "allbytes/b.bin", "encoding": "base64",
                                        "content": base64.b64encode(data).decode()})  # fmt: skip
    assert (rc, frame["output"]) == (0, {"path": "/workspace/allbytes/b.bin",
                                         "bytes": len(data), "created": True}), frame  # fmt: skip
    assert (d / "b.bin").read_bytes() == data
    rc, frame = world.call("fs.read", {"path": "allbytes/b.bin"})
    out = frame["output"]
    assert (rc, out["encoding"], out["size"], out["truncated"]) == (0, "base64", len(data), False)
    assert data_of(out) == data
    rc, frame = world.call("fs.stat", {"path": "allbytes/b.bin"})
    assert (rc, frame["output"]["type"], frame["output"]["size"]) == (0, "file", len(data))
    rc, frame = world.call("fs.list", {"path": "allbytes"})
    assert frame["output"]["entries"] == [{"name": "b.bin", "type": "file", "size": len(data)}]


def test_utf8_text_with_nul_bom_crlf_and_astral_characters_is_kept_as_it_is(world: World):
    """docs/tools.md (fs.write ``content`` in utf-8, fs.read "UTF-8 text"): a BOM is not
    stripped, CRLF is not turned into LF, NUL and U+2028 and a character beyond the first
    plane go to disk as their UTF-8 bytes and come back as the same text, not as base64."""
    d = world.fresh("text")
    text = "\ufeffline one\r\nnul:\0:end\u2028sep \U0001f600 caf\u00e9\r\n\r\n"
    rc, frame = world.call("fs.write", {"path": "text/t.txt", "content": text})
    assert (rc, frame["output"]["bytes"]) == (0, len(text.encode())), frame
    assert (d / "t.txt").read_bytes() == text.encode()
    rc, frame = world.call("fs.read", {"path": "text/t.txt"})
    out = frame["output"]
    assert (rc, out["encoding"], out["content"]) == (0, "utf-8", text), out


def test_bytes_that_are_not_utf8_come_back_as_base64_of_exactly_those_bytes(world: World):
    """docs/tools.md: ``base64`` "when the bytes read are not valid UTF-8" — a Latin-1 byte,
    UTF-16 with its BOM, a surrogate encoded in UTF-8 (CESU-8) and an overlong ``/`` are not
    UTF-8: each comes back as base64 of its exact bytes, never with U+FFFD for a byte."""
    d = world.fresh("notutf8")
    samples = {
        "latin1": b"caf\xe9\n",
        "utf16": "hi\r\n".encode("utf-16"),
        "cesu": b"a\xed\xa0\x80b",
        "overlong": b"\xc0\xaf",
    }
    for name, data in samples.items():
        world.put(d / name, data)
    for name, data in samples.items():
        rc, frame = world.call("fs.read", {"path": f"notutf8/{name}"})
        out = frame["output"]
        assert (rc, out["encoding"], out["size"]) == (0, "base64", len(data)), (name, out)
        assert data_of(out) == data, name


def test_terminal_mode_passes_raw_bytes_both_ways(world: World):
    """T-3, docs/tools.md (terminal fs.read prints "the bytes themselves"; ``fs.write PATH <
    FILE`` takes "UTF-8 text as it is, other bytes as base64"): binary bytes piped into the
    shorthand land on disk exactly and come back out on stdout exactly; a UTF-8 file with a
    BOM and CRLF is not altered on either way."""
    d = world.fresh("raw")
    for name, data in (
        ("bin", b"\0\xff\xfe\r\n\x1b[0m\0tail"),
        ("bom", "\ufeffa\r\nb\r\n".encode()),
    ):
        done = world.plain("fs.write", f"raw/{name}", stdin=data)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"wrote {len(data)} bytes to /workspace/raw/{name}\n".encode()
        assert (d / name).read_bytes() == data
        done = world.plain("fs.read", f"raw/{name}")
        assert (done.returncode, done.stdout, done.stderr) == (0, data, b""), name


def test_empty_files_and_empty_contents(world: World):
    """docs/tools.md, ctx.coreutils ("write an empty file with ``{"content": ""}``"): empty
    content, in either encoding, makes an empty file; an empty file reads as empty UTF-8
    text, not truncated, at offset 0 and past its end, and as no bytes in terminal mode."""
    d = world.fresh("empty")
    rc, frame = world.call("fs.write", {"path": "empty/e", "content": ""})
    assert (rc, frame["output"]["bytes"], frame["output"]["created"]) == (0, 0, True), frame
    rc, frame = world.call("fs.write", {"path": "empty/e", "content": "", "encoding": "base64"})
    assert (rc, frame["output"]["bytes"], frame["output"]["created"]) == (0, 0, False), frame
    assert (d / "e").read_bytes() == b""
    for offset in (0, 5):
        rc, frame = world.call("fs.read", {"path": "empty/e", "offset": offset})
        assert rc == 0, frame
        assert frame["output"] == {
            "path": "/workspace/empty/e",
            "size": 0,
            "offset": offset,
            "content": "",
            "encoding": "utf-8",
            "truncated": False,
        }
    done = world.plain("fs.read", "empty/e")
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")


# ------------------------------------------------------------------------------- sizes


def test_a_file_of_exactly_one_mib_and_a_line_of_one_byte_more(world: World):
    """docs/tools.md (fs.read ``length`` ≤ 1 MiB), ctx.coreutils (``truncated`` "is true when
    the file goes on after what was read"): a file of exactly 1 MiB is read whole, not
    truncated; one line of 1 MiB + 1 bytes with no line end gives its first MiB, truncated,
    and its last byte at offset 1 MiB, not truncated.  In terminal mode the same call
    prints the first MiB."""
    d = world.fresh("mib")
    world.put(d / "exact", b"a" * MiB)
    world.put(d / "over", b"b" * MiB + b"!")
    rc, frame = world.call("fs.read", {"path": "mib/exact"})
    out = frame["output"]
    assert (rc, len(out["content"]), out["size"], out["truncated"]) == (0, MiB, MiB, False)
    rc, frame = world.call("fs.read", {"path": "mib/over"})
    out = frame["output"]
    assert (rc, len(out["content"]), out["size"], out["truncated"]) == (0, MiB, MiB + 1, True)
    rc, frame = world.call("fs.read", {"path": "mib/over", "offset": MiB})
    out = frame["output"]
    assert (rc, out["content"], out["offset"], out["truncated"]) == (0, "!", MiB, False), out
    done = world.plain("fs.read", "mib/over")
    assert (done.returncode, done.stdout) == (0, b"b" * MiB)


def test_a_mib_of_nul_bytes_is_text_and_its_records_stay_small(world: World):
    """docs/tools.md (fs.read), S-4, T-7: a MiB of NUL bytes is valid UTF-8 and comes back as
    text (six times its size as JSON escapes, within the runner's bound); the call's session
    events and tool log line hold a summary of 200 characters, not the MiB."""
    d = world.fresh("nul")
    world.put(d / "zeros", b"\0" * MiB)
    rc, frame = world.call("fs.read", {"path": "nul/zeros"})
    out = frame["output"]
    assert (rc, out["encoding"], out["content"], out["truncated"]) == (0, "utf-8", "\0" * MiB,
                                                                       False)  # fmt: skip
    assert_recorded_small(world, frame["call"])


def test_a_sparse_file_of_eight_gib(world: World):
    """docs/tools.md (fs.read ``offset``, fs.stat/fs.list ``size``): a sparse file of 8 GiB
    (one byte written at its end) is described by its apparent size; a read in its hole gives
    NULs and says the file goes on; a read of its tail gives the last bytes, not truncated;
    a read at and past its end gives nothing, not truncated."""
    d = world.fresh("sparse")
    size = 8 * 1024 * MiB
    path = d / "s"
    with open(path, "wb") as f:
        f.truncate(size)
        f.seek(size - 1)
        f.write(b"Z")
    os.chown(path, world.user.uid, world.user.gid)
    assert os.stat(path).st_blocks * 512 < MiB  # the hole takes no room
    rc, frame = world.call("fs.stat", {"path": "sparse/s"})
    assert (rc, frame["output"]["size"]) == (0, size), frame
    rc, frame = world.call("fs.list", {"path": "sparse"})
    assert frame["output"]["entries"] == [{"name": "s", "type": "file", "size": size}], frame
    rc, frame = world.call("fs.read", {"path": "sparse/s", "offset": size // 2, "length": 4})
    assert (rc, frame["output"]["content"], frame["output"]["truncated"]) == (0, "\0" * 4, True)
    rc, frame = world.call("fs.read", {"path": "sparse/s", "offset": size - 3})
    assert (rc, frame["output"]["content"], frame["output"]["truncated"]) == (0, "\0\0Z", False)
    for offset in (size, size + 1):
        rc, frame = world.call("fs.read", {"path": "sparse/s", "offset": offset})
        out = frame["output"]
        assert (rc, out["content"], out["truncated"], out["size"]) == (0, "", False, size), out


def test_a_listing_past_the_output_bound_is_efbig_and_terminal_mode_lists_it(world: World):
    """docs/tools.md ("Captured output is limited to 16 MiB", stage ``run``: "wrote too much
    (``EFBIG``)"): 11 200 names of 255 bytes, mostly a control character JSON writes as six
    bytes, make a native listing of some 17 MB: the call ends promptly with ``EFBIG`` at stage
    ``run``, recorded as a small summary; the terminal listing of the same directory (one
    line per name, the bytes as they are) is whole."""
    d = world.fresh("huge")
    count = 11_200
    fd = os.open(d, os.O_DIRECTORY)
    try:
        for i in range(count):
            os.close(os.open(f"{i:05d}" + "\x01" * 250, os.O_CREAT | os.O_WRONLY, 0o644,
                             dir_fd=fd))  # fmt: skip
    finally:
        os.close(fd)
    rc, frame = world.call("fs.list", {"path": "huge"})
    assert (rc, frame["status"], error_of(frame)) == (1, "error", ("EFBIG", "run")), frame["error"]
    assert str(OUTPUT_LIMIT) in frame["error"]["message"]
    assert_recorded_small(world, frame["call"])
    done = world.plain("fs.list", "huge")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split(b"\n")
    assert lines[-1] == b"" and len(lines) == count + 1
    # One name a line, its control characters as ``ls -b`` shows them (\x01).
    assert lines[0] == b"00000" + b"\\x01" * 250


# ---------------------------------------------------------------- numbers at their ends


def test_offsets_and_lengths_at_and_past_their_ends(world: World):
    """docs/tools.md (``offset``, ``length`` ≤ 1 MiB), T-2 ("exits 2 for bad input"): length 0
    gives nothing, the file going on; an offset of 10³⁰ (no file offset: the refusal says the
    bounds) and a boolean offset are ``EINVAL`` with exit 2 from the tool in either mode; a
    length over 1 MiB is refused by the schema in native mode and by the tool in terminal
    mode; never a traceback."""
    d = world.fresh("numbers")
    world.put(d / "n.txt", b"hello")
    rc, frame = world.call("fs.read", {"path": "numbers/n.txt", "length": 0})
    assert (rc, frame["output"]["content"], frame["output"]["truncated"]) == (0, "", True)
    for bad in ({"offset": 10**30}, {"offset": True}, {"length": MiB + 1}):
        value = {"path": "numbers/n.txt", **bad}
        rc, frame = world.call("fs.read", value)
        assert (rc, error_of(frame)[0]) in ((1, "EINVAL"), (2, "EINVAL")), (bad, frame)
        assert frame["exit_status"] in (None, 2), (bad, frame)
        done = world.plain("fs.read", json.dumps(value))
        assert done.returncode == 2, (bad, done)
        assert done.stderr.startswith(b"fs.read: EINVAL: "), (bad, done.stderr)
        assert b"Traceback" not in done.stderr
    done = world.plain("fs.read", json.dumps({"path": "numbers/n.txt", "offset": 10**30}))
    assert f"offset must be from 0 to {MAX_OFFSET}".encode() in done.stderr, done.stderr


def test_the_largest_documented_offset_reads_nothing(world: World):
    """docs/tools.md (fs.read ``offset`` ≤ 2⁶³ − 1): the largest offset the table allows lies
    past the end of every file: the read gives nothing and says the file does not go on,
    whatever ``length`` is, as it does at any offset past the end."""
    d = world.fresh("maxoffset")
    world.put(d / "m.txt", b"hello")
    for value in ({"offset": MAX_OFFSET}, {"offset": MAX_OFFSET - 1, "length": 2}):
        rc, frame = world.call("fs.read", {"path": "maxoffset/m.txt", **value})
        assert rc == 0, (value, frame.get("error"))
        out = frame["output"]
        assert (out["content"], out["truncated"]) == ("", False), out


def test_an_offset_written_with_a_zero_fraction_is_an_integer(world: World):
    """docs/tools.md ("Every core tool checks its input against its own schema"; a refusal is
    for "a value of another JSON type than its property's"): fs.read's schema types
    ``offset`` ``integer``, which ``1.0`` is in JSON Schema (the runner's schema check lets it
    through); the tool reads from byte 1 as for ``1``."""
    d = world.fresh("fraction")
    world.put(d / "f.txt", b"hello")
    rc, frame = world.call("fs.read", {"path": "fraction/f.txt", "offset": 1.0})
    assert (rc, error_of(frame)) == (0, (None, None)), frame.get("error")
    assert frame["output"]["content"] == "ello", frame["output"]


# ------------------------------------------------- files whose size says nothing, or moves


def test_a_proc_file_read_in_part_says_it_goes_on(world: World):
    """ctx.coreutils (``truncated`` "is true when the file goes on after what was read"):
    ``/proc/sys/kernel/ostype`` reports size 0 and holds ``Linux\\n``; a read of its first two
    bytes gives ``Li`` and must say the file goes on, or a caller paging by ``truncated``
    stops at two bytes."""
    expected = Path("/proc/sys/kernel/ostype").read_text()
    assert os.stat("/proc/sys/kernel/ostype").st_size == 0 and len(expected) > 2
    rc, frame = world.call("fs.read", {"path": "/kern/ostype", "length": 2})
    assert (rc, frame["output"]["content"]) == (0, expected[:2]), frame
    assert frame["output"]["truncated"] is True, frame["output"]


def test_a_sys_file_read_whole_is_not_truncated(world: World):
    """ctx.coreutils (``truncated`` "is true when the file goes on after what was read"): a
    ``/sys`` attribute reports a page as its size and holds a few bytes; read whole, it does
    not go on; read at its end it gives nothing and does not go on — a caller that pages
    while ``truncated`` holds must come to an end."""
    if world.sys_name is None:
        pytest.skip("no /sys/kernel attribute of fewer bytes than its size here")
    expected = (Path("/sys/kernel") / world.sys_name).read_text()
    rc, frame = world.call("fs.read", {"path": f"/sysk/{world.sys_name}"})
    assert (rc, frame["output"]["content"]) == (0, expected), frame
    end_truncated = None
    rc, end = world.call("fs.read", {"path": f"/sysk/{world.sys_name}",
                                     "offset": len(expected.encode())})  # fmt: skip
    if rc == 0:
        assert end["output"]["content"] == "", end
        end_truncated = end["output"]["truncated"]
    assert (frame["output"]["truncated"], end_truncated) == (False, False), frame["output"]


def test_a_file_rewritten_and_cut_while_read_gives_a_part_of_one_version(world: World):
    """docs/tools.md (fs.read): a file cut to nothing and written again, over and over, while
    fs.read runs, gives each time a successful read of at most a MiB of its bytes (all ``a``),
    never an error or bytes of no version."""
    d = world.fresh("moving")
    path = world.put(d / "m.txt", b"a" * (MiB + MiB // 2))
    stop = threading.Event()
    rounds = []

    def churn() -> None:
        fd = os.open(path, os.O_WRONLY)
        try:
            while not stop.is_set():
                os.ftruncate(fd, 0)
                os.pwrite(fd, b"a" * (MiB + MiB // 2), 0)
                rounds.append(1)
        finally:
            os.close(fd)

    writer = threading.Thread(target=churn)
    writer.start()
    try:
        results = [world.call("fs.read", {"path": "moving/m.txt"}) for _ in range(3)]
    finally:
        stop.set()
        writer.join()
    assert rounds, "the file was never rewritten"
    for rc, frame in results:
        assert rc == 0, frame.get("error")
        data = data_of(frame["output"])
        assert len(data) <= MiB and data == b"a" * len(data), len(data)


# ----------------------------------------------------------------- fs.write's own modes


def test_fs_write_replaces_by_rename_creates_only_when_told_and_never_appends(world: World):
    """docs/tools.md (fs.write: a temporary file "renamed into place"; ``overwrite: false``
    never replaces: ``EEXIST``): create-only makes a new file; a second create-only is
    ``EEXIST`` with the file untouched; a replacement is a new file under the name — a reader
    holding the old one open and a hard link to it keep the old bytes, nothing is appended;
    an ``append`` or ``mode`` input is no input of fs.write (``EINVAL``, exit 2, untouched)."""
    d = world.fresh("modes")
    rc, frame = world.call("fs.write", {"path": "modes/f", "content": "one\n", "overwrite": False})
    assert (rc, frame["output"]["created"]) == (0, True), frame
    rc, frame = world.call("fs.write", {"path": "modes/f", "content": "two\n", "overwrite": False})
    assert (rc, error_of(frame)[0]) == (1, "EEXIST"), frame
    assert (d / "f").read_bytes() == b"one\n"
    os.link(d / "f", d / "twin")
    before = os.stat(d / "f").st_ino
    with open(d / "f", "rb") as old:
        rc, frame = world.call("fs.write", {"path": "modes/f", "content": "three\n"})
        assert (rc, frame["output"]["created"]) == (0, False), frame
        assert old.read() == b"one\n"
    assert (d / "f").read_bytes() == b"three\n"
    assert (d / "twin").read_bytes() == b"one\n"
    assert os.stat(d / "f").st_ino != before
    for extra in ({"append": True}, {"mode": "a"}):
        value = {"path": "modes/f", "content": "four\n", **extra}
        rc, frame = world.call("fs.write", value)
        assert (rc, error_of(frame)) == (2, ("EINVAL", "schema")), frame
        done = world.plain("fs.write", json.dumps(value))
        assert done.returncode == 2, done
        key = next(iter(extra))
        assert f"'{key}' is not an input of fs.write".encode() in done.stderr, done.stderr
    assert (d / "f").read_bytes() == b"three\n"
    assert sorted(os.listdir(d)) == ["f", "twin"]  # no temporary left behind


def test_only_the_two_documented_encodings_and_strict_base64_are_taken(world: World):
    """docs/tools.md (fs.write ``encoding``: ``utf-8`` or ``base64``; a lone surrogate is bad
    input): another encoding name, base64 that is wrapped in lines, URL-safe or unpadded, and
    UTF-8 content holding a lone surrogate are each ``EINVAL`` with exit 2, the file
    untouched and nothing left beside it."""
    d = world.fresh("enc")
    world.put(d / "f", b"kept\n")
    for encoding in ("UTF-8", "latin-1"):
        value = {"path": "enc/f", "content": "x", "encoding": encoding}
        rc, frame = world.call("fs.write", value)
        assert (rc, error_of(frame)) == (2, ("EINVAL", "schema")), frame
        done = world.plain("fs.write", json.dumps(value))
        assert done.returncode == 2, done
        assert b"encoding must be 'utf-8' or 'base64'" in done.stderr, done.stderr
    for content in ("aGVs\nbG8=", "_-8=", "aGVsbG8"):
        rc, frame = world.call("fs.write", {"path": "enc/f", "content": content,
                                            "encoding": "base64"})  # fmt: skip
        assert (rc, frame["exit_status"], error_of(frame)[0]) == (1, 2, "EINVAL"), content
        assert "content is not base64" in frame["error"]["message"], frame
    rc, frame = world.call("fs.write", {"path": "enc/f", "content": "a\ud800b"})
    assert (rc, frame["exit_status"], error_of(frame)[0]) == (1, 2, "EINVAL"), frame
    assert (d / "f").read_bytes() == b"kept\n"
    assert os.listdir(d) == ["f"]


# --------------------------------------------------------------------------- listings


def test_terminal_fs_list_gives_one_line_per_name(world: World):
    """ctx.coreutils (fs.list: "Terminal output: one name per line"): a directory of ``a``,
    ``b`` and a name holding a line break (``a\\nb``) is listed natively as three entries,
    and in terminal mode as three lines, one per name, so that no two entries read as one
    and no name reads as two."""
    d = world.fresh("linebreaks")
    for name in ("a", "a\nb", "b"):
        world.put(d / name, b"")
    _, frame = world.call("fs.list", {"path": "linebreaks"})
    assert [e["name"] for e in frame["output"]["entries"]] == ["a", "a\nb", "b"], frame
    done = world.plain("fs.list", "linebreaks")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 3, done.stdout


# ------------------------------------------------------------------------ shell.exec


def test_shell_exec_stdin_and_output_of_exotic_bytes(world: World):
    """docs/tools.md (shell.exec: ``stdin`` fed to the command; its stdout the call's output,
    "its JSON value when it prints one"; a NUL in ``cmd`` or a lone surrogate is bad input):
    stdin holding NUL, CRLF and a character beyond the first plane reaches the command whole
    and comes back as text; a BOM before JSON is text, not the JSON value; in terminal mode
    the command's bytes (0xff, NUL) reach the caller's stdout as they are; ``cmd`` holding a
    NUL and ``stdin`` holding a lone surrogate are ``EINVAL``, exit 2."""
    text = "a\0b\r\n\U0001f600\r\n"
    rc, frame = world.call("shell.exec", {"cmd": "cat", "stdin": text})
    assert (rc, frame["output"]) == (0, text), frame
    rc, frame = world.call("shell.exec", {"cmd": "wc -c", "stdin": text})
    assert (rc, str(frame["output"]).strip()) == (0, str(len(text.encode()))), frame
    rc, frame = world.call("shell.exec", {"cmd": r"""printf '\357\273\277{"a": 1}'"""})
    assert (rc, frame["output"]) == (0, '\ufeff{"a": 1}'), frame
    rc, frame = world.call("shell.exec", {"cmd": r"printf '[1, 2]\r\n'"})
    assert (rc, frame["output"]) == (0, [1, 2]), frame
    rc, frame = world.call("shell.exec", {"cmd": r"printf 'x\0y\377z'"})
    assert rc == 0 and isinstance(frame["output"], str), frame
    assert frame["output"].startswith("x\0y") and frame["output"].endswith("z"), frame
    done = world.plain("shell.exec", r"printf 'x\0y\377z\r\n'")
    assert (done.returncode, done.stdout) == (0, b"x\0y\xffz\r\n"), done
    for value in ({"cmd": "echo a\0b"}, {"cmd": "cat", "stdin": "a\ud800"}):
        rc, frame = world.call("shell.exec", value)
        assert (rc, frame["exit_status"], error_of(frame)[0]) == (1, 2, "EINVAL"), frame


# ---------------------------------------------------------------------- through a worker


def test_worker_jobs_over_exotic_content(world: World):
    """W-1, S-4: the same tools run by ``ctx queue work --drain`` as jobs: a binary file read
    comes back as base64 of its bytes in ``done/J.result``, a MiB of NULs as text, bytes
    written from base64 land exactly, a command's NUL output is kept, and a read of a FIFO
    no one writes fails at once (``EINVAL``, the job in ``failed/``), never waiting; each
    call's records stay small."""
    d = world.fresh("jobs")
    binary = bytes(range(256))
    world.put(d / "bin", binary)
    world.put(d / "zeros", b"\0" * MiB)
    os.mkfifo(d / "pipe")
    os.chown(d / "pipe", world.user.uid, world.user.gid)
    written = b"\0\xff\r\n\0"
    jobs = {
        "read-binary": ("fs.read", {"path": "jobs/bin"}),
        "read-zeros": ("fs.read", {"path": "jobs/zeros"}),
        "write-binary": ("fs.write", {"path": "jobs/w", "encoding": "base64",
                                      "content": base64.b64encode(written).decode()}),
        "shell-nul": ("shell.exec", {"cmd": r"printf 'p\0q'"}),
        "read-fifo": ("fs.read", {"path": "jobs/pipe"}),
    }  # fmt: skip
    queue = QueueCLI(world.storage, "proj")
    names = {}
    for name, (tool, value) in jobs.items():
        req = request(tool)
        req["input"] = value
        names[name] = queue.publish(req, name=name)
    worker = subprocess.run([*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", AGENT,
                             "--drain"], env=world.env, capture_output=True, text=True,
                            timeout=120)  # fmt: skip
    assert worker.returncode in (0, 1), worker
    results = {name: queue.only_result(job) for name, job in names.items()}
    states = {name: state for name, (state, _) in results.items()}
    assert states == {**dict.fromkeys(jobs, "done"), "read-fifo": "failed"}, results
    assert data_of(results["read-binary"][1]["output"]) == binary
    assert results["read-zeros"][1]["output"]["content"] == "\0" * MiB
    assert (d / "w").read_bytes() == written
    assert results["shell-nul"][1]["output"] == "p\0q"
    failed = results["read-fifo"][1]
    assert (failed["error"] or {}).get("error") == "EINVAL", failed
    events = read_jsonl(world.sessions() / "worker" / "events.jsonl")
    for name in jobs:
        call = results[name][1]["call"]
        assert any(e.get("call") == call for e in events), name
        assert_recorded_small(world, call)
