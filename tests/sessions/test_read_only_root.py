"""A storage root on a filesystem remounted read-only: ``ctx run`` names the session log it
could not open; ``ctx session repair`` with nothing torn exits 0, and a torn line it cannot
cut is EROFS with nothing changed (S-5).  Needs root (mount)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cli import ctx
from tests.support.exhaustion import empty, fill_to, inode_limited_tmpfs
from tests.support.storage import small_tmpfs
from tests.support.users import UnprivilegedUser, run_as
from tests.tools.support import World, bootstrapped_root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")


@pytest.fixture
def disk_world(traversable_tmp: Path, unprivileged_user: UnprivilegedUser) -> Iterator[World]:
    """Agent coder, allowed fs.stat, with session s1 made by one call, on a tmpfs of its own."""
    with small_tmpfs(traversable_tmp / "disk", "8m") as disk:
        disk.chmod(0o755)
        workspace = disk / "work"
        workspace.mkdir()
        os.chown(workspace, unprivileged_user.uid, unprivileged_user.gid)
        # World.scratch is the disk itself: the tests remount it.
        world = World(bootstrapped_root(disk / "st"), unprivileged_user, workspace, disk)
        world.agent("coder", tools=["fs.stat"])
        world.allow_tool("fs.stat")
        first = ctx(world.root, "run", "--agent", "coder", "--session", "s1", "fs.stat", "/ctx")
        assert first.returncode == 0, first.stderr
        try:
            yield world
        finally:
            remount(disk, "rw")


def remount(disk: Path, how: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{how}", str(disk)], check=True)


def events_path(world: World) -> Path:
    return world.root / f"home/{world.user.uid}/agent/coder/session/s1/events.jsonl"


def test_run_on_a_read_only_root_names_the_session_log(disk_world: World) -> None:
    remount(disk_world.scratch, "ro")

    ran = ctx(disk_world.root, "run", "--agent", "coder", "--session", "s1", "fs.stat", "/ctx")

    assert ran.returncode == 126, ran.stderr
    assert ran.stderr.startswith(f"ctx: EROFS: {events_path(disk_world)}: "), ran.stderr
    assert "the tool did not run: remount that filesystem read-write" in ran.stderr


def test_repair_on_a_read_only_root_with_nothing_torn_is_nothing_to_do(disk_world: World) -> None:
    before = events_path(disk_world).read_bytes()
    remount(disk_world.scratch, "ro")

    repaired = ctx(disk_world.root, "session", "repair", "coder", "s1", "--json")

    assert repaired.returncode == 0, repaired.stderr
    assert '"truncated_bytes": 0' in repaired.stdout
    assert events_path(disk_world).read_bytes() == before


def test_a_torn_line_on_a_read_only_root_is_erofs_and_left(disk_world: World) -> None:
    disk = disk_world.scratch
    with open(events_path(disk_world), "ab") as log:
        log.write(b'{"ts":"torn')
    before = events_path(disk_world).read_bytes()
    remount(disk, "ro")

    refused = ctx(disk_world.root, "session", "repair", "coder", "s1")
    remount(disk, "rw")
    repaired = ctx(disk_world.root, "session", "repair", "coder", "s1")

    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith(
        f"ctx: EROFS: {events_path(disk_world)} ends with a torn line of 11 bytes, which cannot "
        "be cut while its filesystem is read-only; nothing was changed: remount it read-write"
    ), refused.stderr
    assert repaired.returncode == 0, repaired.stderr
    assert "truncated a torn last line of 11 bytes" in repaired.stdout
    assert events_path(disk_world).read_bytes() == before[: -len(b'{"ts":"torn')]


def test_a_new_session_without_room_names_its_whole_path(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    with inode_limited_tmpfs(traversable_tmp / "disk", inodes=600) as disk:
        world = World(bootstrapped_root(disk / "st"), unprivileged_user, disk, disk)
        world.agent("coder", tools=["fs.stat"])
        world.allow_tool("fs.stat")
        fill = fill_to(disk, 0)
        try:
            ran = ctx(world.root, "run", "--agent", "coder", "--session", "s2", "fs.stat", "/ctx")
        finally:
            empty(fill)

    session = world.root / f"home/{unprivileged_user.uid}/agent/coder/session/s2"
    assert ran.returncode == 126, ran.stderr
    assert ran.stderr.startswith(f"ctx: ENOSPC: {session}: "), ran.stderr
    assert "the tool did not run: free space or inodes" in ran.stderr


_REPAIR = (
    "import sys\nfrom pathlib import Path\nfrom cortexfs.errors import CtxError\n"
    "from cortexfs.shared.events import repair\n"
    "try:\n    print(repair(Path(sys.argv[1])))\n"
    "except CtxError as exc:\n    print(exc)\n"
)


def test_repair_by_a_reader_who_may_not_write_is_nothing_to_do_or_says_why(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """S-5: a caller who may read a log but not write it (another agent's, an administrator's
    reading copy) meets nothing to do when no line is torn, and EACCES naming the file and
    the torn bytes when one is: never a bare 'Permission denied'."""
    log = traversable_tmp / "events.jsonl"
    whole = b'{"ts":"2026-06-22T12:00:00Z","type":"a"}\n'
    log.write_bytes(whole)
    log.chmod(0o644)  # root's: the user may read it only
    argv = [sys.executable, "-c", _REPAIR, str(log)]

    nothing = run_as(unprivileged_user, argv)
    log.write_bytes(whole + b'{"ts":"to')
    torn = run_as(unprivileged_user, argv)

    assert (nothing.returncode, nothing.stdout) == (0, "0\n"), nothing.stderr
    assert torn.returncode == 0, torn.stderr
    assert torn.stdout == (
        f"EACCES: {log} ends with a torn line of 9 bytes, which cannot be cut by a caller who "
        "may not write it; nothing was changed: repair it as its owner or as root\n"
    )
    assert log.read_bytes() == whole + b'{"ts":"to'


def test_repair_by_the_owner_its_mode_leaves_out_names_the_chmod(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """S-5: the owner of a log it made read-only (0400) is told the chmod that lets it cut
    the torn line, not to repair it as its owner, which it is."""
    log = traversable_tmp / "events.jsonl"
    whole = b'{"ts":"2026-06-22T12:00:00Z","type":"a"}\n'
    log.write_bytes(whole + b'{"ts":"to')
    os.chown(log, unprivileged_user.uid, unprivileged_user.gid)
    log.chmod(0o400)

    torn = run_as(unprivileged_user, [sys.executable, "-c", _REPAIR, str(log)])

    assert torn.returncode == 0, torn.stderr
    assert torn.stdout == (
        f"EACCES: {log} ends with a torn line of 9 bytes, which cannot be cut by a caller who "
        "may not write it; nothing was changed: you own it, but its mode leaves you out: "
        "'chmod u+w' it and repair again\n"
    )
    assert log.read_bytes() == whole + b'{"ts":"to'
