"""The host's view of ``ctx mount`` (SPEC §13 F-1, docs/mount.md) looked at with ordinary file
calls while the state under it changes on the storage root itself: queue jobs published,
claimed, finished and recovered (§2, I-2), a tool installed again and again (T-8, the atomic
install of docs/tools.md), agents created, removed and made again (A-3), session events
appended (S-1, S-5), spaces created (X-1), modes and owners changed; and the other way round,
what is made through the mount seen by ``ctx`` on the storage root at once.

What is checked: a listing names only entries whose ``stat`` succeeds or says ``ENOENT``
(gone meanwhile), never ``EIO`` or another error; what a reader gets is a whole version of a
file — a request or result under its final name is a whole JSON object, a file replaced by a
rename reads as the old bytes or the new, never a mix — and as many bytes as ``fstat`` on the
same descriptor says; once the caching period docs/mount.md names (half a second for the
kernel's entries) has passed, no old contents, names or modes are served; another uid meets
the modes the storage root has now; and the mount survives all of it and unmounts cleanly
(``ctx umount`` exit 0, the mount process exit 0)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MOUNT_WAIT,
    Mount,
    OnStorage,
    QueueCLI,
    clean_env,
    ctx_run,
    mounted_at,
    needs_fuse,
    needs_fuse_as_root,
    new_scratch_dir,
    request,
    scratch_top,
    serving,
    tool_manifest,
    wait_for,
)
from tests.support.users import find_or_create_user, run_as

SCRATCH = scratch_top(__file__)
PROJECT = "proj"
TOOL = "echo.t"
# docs/mount.md: the kernel keeps an entry and its attributes for half a second (and an agent
# view's answers another half).  Conditions that must hold "once the caching period passed"
# are waited for with this much room, never timed.
SETTLE = 8.0

pytestmark = [needs_fuse_as_root, needs_fuse]  # a mount serving other uids needs root


# ------------------------------------------------------------------------------ helpers


@dataclass
class World(OnStorage):
    """A storage root (a copy of the bootstrapped one, with queue ``proj``), mounted."""

    storage: Path
    top: Path
    mount: Mount

    @property
    def view(self) -> Path:
        return self.mount.where

    def unmount_cleanly(self) -> None:
        """``ctx umount`` succeeds, the mount process ends with 0 and said no traceback."""
        done = ctx_run("umount", self.view, timeout=MOUNT_WAIT)
        assert done.rc == 0, done
        assert self.mount.proc.wait(timeout=MOUNT_WAIT) == 0, self.mount.said()
        assert not mounted_at(self.view)
        assert "Traceback" not in self.mount.said(), self.mount.said()


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH)
    storage = top / "storage"
    shutil.copytree(_template, storage, symlinks=True)
    where = top / "view"
    where.mkdir()
    try:
        with serving(storage, where) as mount:
            yield World(storage, top, mount)
    finally:
        shutil.rmtree(top, ignore_errors=True)


def start_shell(script: str, env: dict[str, str], *args: str) -> subprocess.Popen:
    """``bash -c SCRIPT ARGS`` in the background, in a session of its own."""
    return subprocess.Popen(
        ["bash", "-c", script, "sh", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def start_python(script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@contextlib.contextmanager
def running(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """``proc`` killed (its whole session) if it is still running when the block ends."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
        proc.communicate()


def read_whole(path: Path) -> tuple[bytes, int]:
    """The bytes ``path`` holds, read to the end on one descriptor, and the size ``fstat``
    gave on that descriptor before the read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks), size
    finally:
        os.close(fd)


def names_below(top: Path) -> dict[str, set[str]]:
    """Each directory below ``top`` (relative) and the names it lists."""
    tree = {}
    for dirpath, dirnames, filenames in os.walk(top):
        tree[os.path.relpath(dirpath, top)] = set(dirnames) | set(filenames)
    return tree


def walk_error(problems: Counter):
    """An ``os.walk`` error handler counting every failure to list a directory but ``ENOENT``
    (a directory listed by its parent and gone since)."""

    def record(exc: OSError) -> None:
        if exc.errno != errno.ENOENT:
            problems[f"list {exc.filename}: {errno.errorcode[exc.errno]}"] += 1

    return record


def a_fresh_read(path: Path) -> bytes | None:
    """What a new process reading ``path`` gets (``cat``), None when it fails."""
    done = subprocess.run(["cat", str(path)], capture_output=True, timeout=30)
    return done.stdout if done.returncode == 0 else None


# ------------------------------------------------------------------- the queue (§2)


CHURN = r"""
set -u
ctx="$1"
for round in 1 2; do
  printf '%s\n' "$REQ" "$REQ" "$REQ" "$REQ" | "$ctx" queue publish --project proj --batch - \
    >/dev/null || exit 11
  j=$("$ctx" queue claim --project proj --ttl 60) || exit 12
  printf '{"n": %d}' "$round" | "$ctx" queue finish --project proj "$j" --ok - || exit 13
  j=$("$ctx" queue claim --project proj --ttl 60) || exit 14
  printf '{"n": %d}' "$round" | "$ctx" queue finish --project proj "$j" --error - || exit 15
  sh -c 'exit 0' & dead=$!; wait "$dead"
  "$ctx" queue claim --project proj --pid "$dead" --ttl 600 >/dev/null 2>&1 || exit 16
  "$ctx" queue recover --project proj >/dev/null || exit 17
done
"""

# Where a file under its final name is a whole JSON object (I-2): requests and results, and
# the lease (written temp + fsync + rename, Q-3).
WHOLE_JSON = ("pending", "done", "failed", "claimed", "lease")


def test_queue_work_on_the_root_reads_through_the_mount_as_whole_jobs_and_settles_equal(
    world: World,
):
    """§2 on the storage root (publish in batches, claim, finish ok and error, a claim whose
    holder is dead, recover) while the queue is walked through the mount: every listed file
    reads whole (I-2, Q-3: a request, result or lease under its final name is one JSON
    object), with as many bytes as ``fstat`` says, and nothing fails but with ``ENOENT``.
    Settled, the view lists what the root holds and ``ctx queue status`` agrees on both."""
    queue = world.view / "shared" / PROJECT / "queue"
    env = clean_env(CTX_STORAGE=str(world.storage), REQ=json.dumps(request()))
    problems: Counter = Counter()
    looked = 0
    with running(start_shell(CHURN, env, CTX_ARGV[0])) as churn:
        while churn.poll() is None or looked == 0:
            for dirpath, _, filenames in os.walk(queue, onerror=walk_error(problems)):
                state = Path(dirpath).relative_to(queue).parts[:1]
                for name in filenames:
                    path = Path(dirpath, name)
                    try:
                        os.lstat(path)
                        data, size = read_whole(path)
                    except FileNotFoundError:
                        continue  # moved on since it was listed
                    except OSError as exc:
                        problems[f"{path.relative_to(queue)}: {errno.errorcode[exc.errno]}"] += 1
                        continue
                    looked += 1
                    if len(data) != size:
                        problems[f"{path.relative_to(queue)}: read {len(data)} of {size}"] += 1
                    if state and state[0] in WHOLE_JSON:
                        try:
                            whole = isinstance(json.loads(data), dict)
                        except ValueError:
                            whole = False
                        if not whole:
                            problems[f"{path.relative_to(queue)}: not a whole object"] += 1
        _, err = churn.communicate()
    assert churn.returncode == 0, (churn.returncode, err)
    assert not problems, problems
    assert looked > 0

    # Settled: the view lists what the root holds, and ctx through either says the same.
    assert names_below(queue) == names_below(world.storage / "shared" / PROJECT / "queue")
    counts = {}
    for where in (world.storage, world.view):
        done = world.ctx("queue", "status", "--project", PROJECT, "--json", "--storage", where)
        assert done.rc == 0, done
        counts[where] = done.json()["counts"]
    assert counts[world.storage] == counts[world.view]
    assert counts[world.view] == {
        "pending": 4,
        "claimed": 0,
        "done": 2,
        "failed": 2,
        "incomplete": 0,
        "conflict": 0,
        "ignored": 0,
    }
    world.unmount_cleanly()


def test_a_space_made_on_the_root_and_jobs_moved_through_either_side_are_seen_at_once(
    world: World,
):
    """X-1 and the queue's command line on both sides: a space created on the root is listed
    by the view at once (a name the view has not seen is looked up anew, never answered from
    a cached "no such name"); a job published through the mount is on the root when
    ``publish`` returns, and one finished on the root reads as done through the mount."""
    made = world.ctx("shared", "create", "team")
    assert made.rc == 0, made
    assert "team" in os.listdir(world.view / "shared")
    assert {"tool", "data", "queue", "agent"} <= set(os.listdir(world.view / "shared" / "team"))

    through = QueueCLI(world.view, "team")
    on_root = QueueCLI(world.storage, "team")
    job = through.publish(request(tag="via-view"))
    listed = on_root.run("list", "--state", "pending", "--json")
    assert listed.rc == 0, listed
    assert job in json.dumps(listed.json())
    assert on_root.state(job) == "pending"

    # Changed on the root: the view says so once the kernel's cached entries have expired
    # (within that half second a name it looked up before may still show).
    def shown(job: str) -> str | None:
        done = through.run("show", job, "--json")
        return done.json()["state"] if done.rc == 0 else None

    assert on_root.claim() == job
    assert wait_for(lambda: shown(job) == "claimed", SETTLE), through.run("show", job)
    on_root.finish(job, output={"answer": "root"})
    assert wait_for(lambda: shown(job) == "done", SETTLE), through.run("show", job)
    assert wait_for(lambda: through.state(job) == "done", SETTLE)
    assert json.loads((through.dir / "done" / f"{job}.result").read_text())["output"] == {
        "answer": "root"
    }

    # A file written through the mount is the caller's and on the root as written, at once.
    notes = world.view / "shared" / "team" / "data" / "notes.txt"
    notes.write_bytes(b"written through the view\n")
    behind = world.storage / "shared" / "team" / "data" / "notes.txt"
    assert behind.read_bytes() == b"written through the view\n"
    assert behind.stat().st_uid == 0
    world.unmount_cleanly()


# ------------------------------------------------------------------ tools (T-8)


def test_a_tool_installed_again_and_again_on_the_root_is_always_found_whole_in_the_view(
    world: World,
):
    """docs/tools.md, "How an install stays atomic": the executable and a complete control
    directory are there at every moment.  Through the mount too: every read of the
    executable and of a control gives one version or the other, whole, and ``tool/`` lists
    both names throughout; once the installs end, the view serves the last version."""
    versions = []
    for n in (1, 2):
        manifest = tool_manifest(
            world.top / f"v{n}",
            TOOL,
            f"#!/bin/sh\necho version {n}\n" + "#" * (300 * n) + "\n",
            description=f"Version {n} of the echo test tool. " + "v" * (40 * n),
        )
        done = world.ctx("object", "install", manifest, "--tier", "system")
        assert done.rc == 0, done
        tool = world.storage / "tool"
        versions.append(
            {
                "entry": (tool / TOOL).read_bytes(),
                "description": (tool / f"{TOOL}.d" / "description").read_bytes(),
                "manifest": manifest,
            }
        )
    entries = {v["entry"] for v in versions}
    descriptions = {v["description"] for v in versions}
    assert len(entries) == len(descriptions) == 2

    installs = " ".join(
        f"'{versions[i % 2]['manifest']}'" for i in range(4)
    )  # v1 v2 v1 v2: the last is v2
    script = (
        f'for m in {installs}; do "$1" object install "$m" --tier system >/dev/null || exit 9; done'
    )
    env = clean_env(CTX_STORAGE=str(world.storage))
    problems: Counter = Counter()
    seen: Counter = Counter()
    view_tool = world.view / "tool"
    with running(start_shell(script, env, CTX_ARGV[0])) as installer:
        while installer.poll() is None or not seen:
            names = set(os.listdir(view_tool))
            if not {TOOL, f"{TOOL}.d"} <= names:
                problems["tool/ listed without the tool or its controls"] += 1
            for name in names:
                try:
                    os.lstat(view_tool / name)
                except FileNotFoundError:
                    pass  # a staging name, gone since
                except OSError as exc:
                    problems[f"lstat {name}: {errno.errorcode[exc.errno]}"] += 1
            for path, allowed in (
                (view_tool / TOOL, entries),
                (view_tool / f"{TOOL}.d" / "description", descriptions),
            ):
                try:
                    data, size = read_whole(path)
                except OSError as exc:
                    problems[f"{path.name}: {errno.errorcode[exc.errno]}"] += 1
                    continue
                seen[path.name] += 1
                if data not in allowed or len(data) != size:
                    problems[f"{path.name}: {len(data)} bytes of {size}, not one version"] += 1
        _, err = installer.communicate()
    assert installer.returncode == 0, err
    assert not problems, problems

    last = versions[1]
    assert wait_for(lambda: a_fresh_read(view_tool / TOOL) == last["entry"], SETTLE)
    assert wait_for(
        lambda: a_fresh_read(view_tool / f"{TOOL}.d" / "description") == last["description"],
        SETTLE,
    )
    which = world.ctx("object", "which", TOOL)
    assert which.rc == 0 and which.out.strip() == str(world.storage / "tool" / TOOL), which
    world.unmount_cleanly()


# ------------------------------------------------------------ files replaced, rewritten


REPLACER = r"""
import os, sys, time
directory, count, size, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
for version in range(1, count + 1):
    temp = os.path.join(directory, ".big.tmp")
    with open(temp, "wb") as f:
        f.write(bytes([65 + version % 26]) * size)
    os.rename(temp, os.path.join(directory, "big"))
    if pause:
        time.sleep(pause)
"""


def test_a_file_replaced_by_rename_on_the_root_reads_whole_old_or_new_through_the_mount(
    world: World,
):
    """A reader through the mount of a file that is replaced (temp file + rename) on the
    storage root every few milliseconds gets one version's bytes, never a mix of two, and
    exactly as many as ``fstat`` on its descriptor said: the descriptor holds the file it
    opened, as on the storage root."""
    directory = world.storage / "shared" / PROJECT / "data"
    size = 192 * 1024
    (directory / "big").write_bytes(b"A" * size)
    problems: Counter = Counter()
    reads = 0
    path = world.view / "shared" / PROJECT / "data" / "big"
    with running(start_python(REPLACER, str(directory), "100", str(size), "0.01")) as writer:
        while writer.poll() is None or reads == 0:
            try:
                data, stated = read_whole(path)
            except OSError as exc:
                # ESTALE on open: test_a_name_replaced_back_to_back_... below.
                if exc.errno != errno.ESTALE:
                    problems[errno.errorcode[exc.errno]] += 1
                continue
            reads += 1
            if len(data) != size or stated != size:
                problems[f"{len(data)} bytes read, fstat said {stated}"] += 1
            elif data.count(data[:1]) != size:
                problems["bytes of two versions in one read"] += 1
        _, err = writer.communicate()
    assert writer.returncode == 0, err
    assert not problems, problems
    final = (directory / "big").read_bytes()
    assert wait_for(lambda: a_fresh_read(path) == final, SETTLE)
    world.unmount_cleanly()


def test_a_name_replaced_back_to_back_on_the_root_opens_or_says_estale_through_the_mount(
    world: World,
):
    """docs/mount.md, *Names*: within the half second the kernel keeps an entry it opens the
    file it knows; the daemon finds another file at the name and answers ``ESTALE``, and the
    kernel looks the name up once more.  A name replaced again in that very instant (here,
    back to back, thousands of times a second) leaves that one open ``ESTALE``, as on NFS:
    no other error, every open that succeeds reads one whole version, and once the name
    holds still an open finds the file there."""
    directory = world.storage / "shared" / PROJECT / "data"
    (directory / "big").write_bytes(b"A" * 100)
    path = world.view / "shared" / PROJECT / "data" / "big"
    failures: Counter = Counter()
    with running(start_python(REPLACER, str(directory), "30000", "100", "0")) as writer:
        deadline = time.monotonic() + 4
        while writer.poll() is None and time.monotonic() < deadline:
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as exc:
                failures[errno.errorcode[exc.errno]] += 1
                continue
            assert len(data) == 100 and data.count(data[:1]) == 100, data
    assert set(failures) <= {"ESTALE"}, dict(failures)
    final = (directory / "big").read_bytes()
    assert wait_for(lambda: a_fresh_read(path) == final, SETTLE)
    world.unmount_cleanly()


def test_a_file_rewritten_in_place_with_size_and_mtime_kept_reads_new_bytes_in_the_view(
    world: World,
):
    """What ``cp -p`` or ``rsync --inplace --times`` leave: the same file (same inode), new
    bytes of the same length, the modification time set back to the one it had.  The host's
    view is the storage root (docs/mount.md); once the kernel's half second has passed a new
    reader must get the bytes the file holds, whatever its times say."""
    behind = world.storage / "shared" / PROJECT / "data" / "settings"
    behind.write_bytes(b"mode=old\n" * 400)
    before = behind.stat()
    path = world.view / "shared" / PROJECT / "data" / "settings"
    assert a_fresh_read(path) == b"mode=old\n" * 400  # read once through the view

    fd = os.open(behind, os.O_WRONLY)
    try:
        os.pwrite(fd, b"mode=new\n" * 400, 0)
    finally:
        os.close(fd)
    os.utime(behind, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert behind.stat().st_ino == before.st_ino

    assert wait_for(lambda: a_fresh_read(path) == b"mode=new\n" * 400, 3.0), a_fresh_read(path)
    world.unmount_cleanly()


def holds_open(pid: int, name: str) -> bool:
    """Whether process ``pid`` has a descriptor open on a file called ``name``."""
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").endswith(f"/{name}"):
                    return True
    return False


def test_appends_and_rewrites_on_the_root_show_in_the_view_and_its_sizes_match_reads(
    world: World,
):
    """S-1, S-5: events appended to a session on the storage root (one ``write`` of one
    line on an ``O_APPEND`` descriptor, as the product appends them) are seen by
    ``ctx session show`` and by ``ctx session tail --follow`` running on the mount; the size
    ``stat`` gives through the view and what ``read`` returns agree once the kernel's half
    second has passed; a file rewritten in place with a new time shows its new bytes."""
    session = world.storage / "home" / "0" / "agent" / "coder" / "session" / "s1"
    session.mkdir(parents=True)
    events = session / "events.jsonl"

    def append(n: int) -> None:
        event = {
            "ts": f"2026-06-22T12:00:{n:02d}Z",
            "type": "note",
            "agent": "coder",
            "session": "s1",
            "object": "agent/coder",
            "status": "ok",
            "n": n,
        }
        fd = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(event) + "\n").encode())
        finally:
            os.close(fd)

    for n in range(1, 4):
        append(n)
    view_args = ("coder", "s1", "--uid", "0", "--json", "--storage", world.view)
    shown = world.ctx("session", "show", *view_args)
    assert shown.rc == 0, shown
    assert [json.loads(line)["n"] for line in shown.lines()] == [1, 2, 3]

    follower = subprocess.Popen(
        [*CTX_ARGV, "session", "tail", *map(str, view_args), "-n", "0", "--follow"],
        env=clean_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    with running(follower):
        # Its first look (``-n 0``: from the end it finds) holds the file open: what is
        # appended before it would not be followed, however loaded the machine.
        assert wait_for(lambda: holds_open(follower.pid, "events.jsonl"), SETTLE)
        for n in range(4, 9):
            append(n)
        # What a follower prints, line by line, until it has printed every appended event.
        followed = []
        deadline = time.monotonic() + SETTLE
        while len(followed) < 5 and time.monotonic() < deadline:
            line = follower.stdout.readline()
            if not line:
                break
            followed.append(json.loads(line)["n"])
        follower.send_signal(2)
        _, err = follower.communicate(timeout=30)
    assert followed == [4, 5, 6, 7, 8], err
    assert follower.returncode == 0, err

    view_events = world.view / "home" / "0" / "agent" / "coder" / "session" / "s1" / "events.jsonl"
    on_disk = events.read_bytes()
    assert wait_for(lambda: os.stat(view_events).st_size == len(on_disk), SETTLE)
    data, size = read_whole(view_events)
    assert data == on_disk and size == len(on_disk)

    # Rewritten in place, with a new time: the new bytes, through a new open.
    fd = os.open(events, os.O_WRONLY)
    try:
        os.pwrite(fd, b"{", 0)  # the same length: only the content and the mtime change
    finally:
        os.close(fd)
    assert wait_for(lambda: a_fresh_read(view_events) == events.read_bytes(), SETTLE)
    world.unmount_cleanly()


# ------------------------------------------------------------------ agents


def test_an_agent_created_removed_and_made_again_on_the_root_as_the_view_shows_it(
    world: World,
):
    """``ctx agent create`` on the root: ``agent/`` lists the new entry and its controls at
    once, and ``ctx agent list`` on the mount names it.  Removed on the root: gone from the
    listing at once, ``ENOENT`` once the kernel's entries have expired, while a descriptor
    opened before keeps reading what it opened.  Made again with another label (the new
    files may get the old ones' inode numbers): the view serves the new label."""
    user = find_or_create_user()
    agents = world.view / "agent"

    def create(label: str) -> None:
        req = {"name": "coder", "label": label, "tools": []}
        done = world.ctx("agent", "create", "-", "--user", user.name, input=json.dumps(req))
        assert done.rc == 0, done

    create("coder_t")
    assert {"coder", "coder.d"} <= set(os.listdir(agents))
    listed = world.ctx("agent", "list", "--storage", world.view)
    assert listed.rc == 0 and listed.out.split()[:2] == ["coder", "coder_t"], listed
    label = agents / "coder.d" / "label"
    assert label.read_text().strip() == "coder_t"

    kept = open(label, "rb")  # noqa: SIM115 - held across the removal
    try:
        shutil.rmtree(world.storage / "agent" / "coder.d")
        (world.storage / "agent" / "coder").unlink()
        assert not {"coder", "coder.d"} & set(os.listdir(agents))
        assert wait_for(lambda: not os.path.lexists(agents / "coder.d"), SETTLE)
        assert wait_for(lambda: not os.path.lexists(agents / "coder"), SETTLE)
        assert kept.read().strip() == b"coder_t"

        create("other_t")
        assert wait_for(lambda: a_fresh_read(label) == b"other_t\n", SETTLE), a_fresh_read(label)
        relisted = world.ctx("agent", "list", "--storage", world.view)
        assert relisted.rc == 0 and relisted.out.split()[:2] == ["coder", "other_t"], relisted
    finally:
        kept.close()
    world.unmount_cleanly()


# ------------------------------------------------------ modes as another uid sees them


def test_modes_and_owners_changed_on_the_root_are_what_another_uid_meets_in_the_view(
    world: World,
):
    """docs/mount.md: run as root the mount serves every uid and the kernel checks each
    caller's mode bits against the file's owner and mode on disk.  Changed on the storage
    root, they bind the second user through the view once the kernel's half second has
    passed; and what that user may not do makes nothing on the root."""
    user = find_or_create_user()
    public = world.storage / "shared" / "pub"
    public.mkdir(mode=0o755)
    public.chmod(0o755)
    note = public / "note"
    note.write_bytes(b"for everyone\n")
    note.chmod(0o644)
    seen = world.view / "shared" / "pub" / "note"

    def cat() -> subprocess.CompletedProcess[str]:
        return run_as(user, ["cat", str(seen)])

    def listing() -> subprocess.CompletedProcess[str]:
        return run_as(user, ["ls", str(seen.parent)])

    first = cat()
    assert first.returncode == 0 and first.stdout == "for everyone\n", first.stderr

    note.chmod(0o600)
    assert wait_for(lambda: cat().returncode != 0, SETTLE)
    assert "Permission denied" in cat().stderr

    os.chown(note, user.uid, user.gid)
    assert wait_for(lambda: cat().returncode == 0, SETTLE)
    assert stat.S_IMODE(os.stat(seen).st_mode) == 0o600 and os.stat(seen).st_uid == user.uid

    made = run_as(user, ["sh", "-c", f"echo x > '{seen.parent}/planted'"])
    assert made.returncode != 0 and "Permission denied" in made.stderr
    assert not (public / "planted").exists()

    public.chmod(0o700)
    assert wait_for(lambda: listing().returncode != 0, SETTLE)
    assert "Permission denied" in listing().stderr
    assert cat().returncode != 0  # the directory may not be passed any more

    public.chmod(0o755)
    assert wait_for(lambda: listing().returncode == 0, SETTLE)
    assert listing().stdout.split() == ["note"]
    world.unmount_cleanly()
