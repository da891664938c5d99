"""Names changed through a real mount: rename (with its flags), link, unlink, rmdir (SPEC F-1),
and the queue, whose no-replace move is a link, used through the mount (Q-1, N-1).

The kernel goes on using an inode it knows under a new name without looking the name up
again, so each test uses the new name at once, in the same process that changed it.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.fuse.support import NEEDS_A_MOUNT, as_user, mounted
from tests.support.cli import ctx
from tests.tools.support import World

pytestmark = NEEDS_A_MOUNT

RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_WHITEOUT = 1, 2, 4


def renameat2(old: Path, new: Path, flags: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    at_cwd = -100
    if libc.renameat2(at_cwd, bytes(old), at_cwd, bytes(new), flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(old))


@pytest.fixture
def data(world: World) -> Path:
    """``shared/x/data`` in the storage root, the host's to write."""
    directory = world.root / "shared" / "x" / "data"
    directory.mkdir(parents=True)
    return directory


def test_a_renamed_file_is_reached_by_its_new_name_at_once(world: World, data: Path) -> None:
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint):
        here = mountpoint / "shared" / "x" / "data"
        (here / "t1").write_text("a\n")
        os.rename(here / "t1", here / "t2")

        assert (here / "t2").read_text() == "a\n"
        assert os.listdir(here) == ["t2"]
        (here / "t2").unlink()
        assert os.listdir(data) == []


def test_a_renamed_directory_carries_what_it_holds(world: World, data: Path) -> None:
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint):
        here = mountpoint / "shared" / "x" / "data"
        (here / "d1" / "sub").mkdir(parents=True)
        (here / "d1" / "sub" / "f").write_text("deep\n")
        assert (here / "d1" / "sub" / "f").read_text() == "deep\n"  # known by its old path

        os.rename(here / "d1", here / "d2")

        assert os.listdir(here / "d2") == ["sub"]
        assert (here / "d2" / "sub" / "f").read_text() == "deep\n"
        (here / "d2" / "sub" / "f").write_text("changed\n")
        assert (data / "d2" / "sub" / "f").read_text() == "changed\n"
        os.rename(here / "d2" / "sub", here / "moved")
        assert (here / "moved" / "f").read_text() == "changed\n"
        (here / "moved" / "f").unlink()
        (here / "moved").rmdir()
        (here / "d2").rmdir()
        assert os.listdir(data) == []


def test_a_rename_over_an_existing_file_replaces_it(world: World, data: Path) -> None:
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint):
        here = mountpoint / "shared" / "x" / "data"
        (here / "new").write_text("new\n")
        (here / "old").write_text("old\n")
        assert (here / "old").read_text() == "old\n"

        os.rename(here / "new", here / "old")

        assert (here / "old").read_text() == "new\n"
        assert os.listdir(here) == ["old"]


def test_rename_noreplace_and_exchange_are_atomic_and_keep_the_names(
    world: World, data: Path
) -> None:
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint):
        here = mountpoint / "shared" / "x" / "data"
        (here / "a").write_text("A\n")
        (here / "b").write_text("B\n")
        (here / "dir").mkdir()
        (here / "dir" / "inside").write_text("I\n")

        with pytest.raises(OSError) as refused:
            renameat2(here / "a", here / "b", RENAME_NOREPLACE)
        assert refused.value.errno == errno.EEXIST
        renameat2(here / "a", here / "c", RENAME_NOREPLACE)
        assert (here / "c").read_text() == "A\n"

        renameat2(here / "c", here / "b", RENAME_EXCHANGE)
        assert ((here / "b").read_text(), (here / "c").read_text()) == ("A\n", "B\n")
        renameat2(here / "dir", here / "b", RENAME_EXCHANGE)
        assert (here / "dir").read_text() == "A\n"
        assert (here / "b" / "inside").read_text() == "I\n"
    assert (data / "b" / "inside").read_text() == "I\n"


def test_rename_whiteout_is_refused_rather_than_done_as_a_plain_rename(
    world: World, data: Path
) -> None:
    """A whiteout is a device node, which the mount never makes (mknod is ENOSYS)."""
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint):
        here = mountpoint / "shared" / "x" / "data"
        (here / "a").write_text("A\n")

        with pytest.raises(OSError) as refused:
            renameat2(here / "a", here / "b", RENAME_WHITEOUT)

        assert refused.value.errno == errno.EINVAL
        assert os.listdir(here) == ["a"] and (here / "a").read_text() == "A\n"
        renameat2(here / "a", here / "b", RENAME_NOREPLACE)  # the flags it passes still pass
        assert os.listdir(data) == ["b"]


def test_link_makes_a_second_name_and_unlink_keeps_the_other(world: World, data: Path) -> None:
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint):
        here = mountpoint / "shared" / "x" / "data"
        (here / "first").write_text("one file\n")

        os.link(here / "first", here / "second")
        assert (here / "second").stat().st_nlink == 2
        os.unlink(here / "first")

        assert (here / "second").read_text() == "one file\n"
        assert (here / "second").stat().st_nlink == 1
        with pytest.raises(FileExistsError):
            os.link(here / "second", here / "second")
    assert os.listdir(data) == ["second"]


def test_a_file_unlinked_while_open_stays_usable_until_closed(world: World, data: Path) -> None:
    """The temporary-file idiom (open, unlink, go on using the descriptor) through the mount."""
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint):
        name = mountpoint / "shared" / "x" / "data" / "scratch"
        fd = os.open(name, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            os.write(fd, b"hello")
            os.unlink(name)

            assert (os.fstat(fd).st_size, os.fstat(fd).st_nlink) == (5, 0)
            os.ftruncate(fd, 2)
            os.fchmod(fd, 0o600)
            assert os.fstat(fd).st_mode & 0o777 == 0o600
            assert os.pread(fd, 10, 0) == b"he"
            with open(f"/proc/self/fd/{fd}", "rb") as again:
                assert again.read() == b"he"
        finally:
            os.close(fd)
        assert os.listdir(name.parent) == []
    assert os.listdir(data) == []


def test_a_listing_holds_dot_and_dot_dot_as_on_any_posix_directory(
    world: World, data: Path
) -> None:
    def listed(directory: Path) -> list[str]:
        environment = {"LC_ALL": "C", "PATH": "/usr/bin:/bin"}
        shown = subprocess.run(
            ["ls", "-a", str(directory)],
            capture_output=True,
            text=True,
            check=True,
            env=environment,
        )
        return shown.stdout.split()

    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint):
        (mountpoint / "shared" / "x" / "data" / "f").write_text("f\n")

        assert listed(mountpoint) == [".", "..", "agent", "bin", "home", "model", "shared", "tool"]
        assert listed(mountpoint / "shared" / "x" / "data") == [".", "..", "f"]
        assert os.listdir(mountpoint / "shared" / "x" / "data") == ["f"]


def test_names_still_work_after_the_kernel_forgets_its_inodes(world: World, data: Path) -> None:
    """Dropping the kernel's dentry and inode caches makes it ``forget`` what it held; the
    daemon forgets too, and every name is found again by the next lookup."""
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint):
        here = mountpoint / "shared" / "x" / "data"
        (here / "d" / "sub").mkdir(parents=True)
        for number in range(200):
            (here / "d" / "sub" / f"f{number}").write_text(f"{number}\n")

        Path("/proc/sys/vm/drop_caches").write_text("2\n")

        assert len(os.listdir(here / "d" / "sub")) == 200
        os.rename(here / "d", here / "e")
        assert (here / "e" / "sub" / "f7").read_text() == "7\n"
        os.rename(here / "e" / "sub" / "f7", here / "e" / "f7")
        assert (here / "e" / "f7").read_text() == "7\n"
    assert (data / "e" / "f7").read_text() == "7\n"
    assert len(os.listdir(data / "e" / "sub")) == 199


def test_the_queue_works_through_the_mount(world: World) -> None:
    """init, publish, claim, finish and recover, with the storage root's path being the
    mount: the queue's no-replace move is link + unlink on a filesystem it does not know."""
    mountpoint = world.scratch / "ctx"
    request = json.dumps({"tool": "fs.stat", "input": {"path": "/"}})
    with mounted(world.root, mountpoint):
        queue = ["--project", "qp"]
        done = ctx(mountpoint, "queue", "init", *queue)
        assert done.returncode == 0, done.stderr
        published = ctx(
            mountpoint, "queue", "publish", *queue, "--name", "job-1", "-", stdin=request
        )
        assert published.returncode == 0, published.stderr
        job = published.stdout.strip()
        claimed = ctx(mountpoint, "queue", "claim", *queue)
        assert (claimed.returncode, claimed.stdout.strip()) == (0, job), claimed.stderr
        finished = ctx(mountpoint, "queue", "finish", *queue, job, "--ok", "-", stdin="{}")
        assert finished.returncode == 0, finished.stderr
        recovered = ctx(mountpoint, "queue", "recover", *queue, "--json")
        assert recovered.returncode == 0, recovered.stderr
        status = ctx(mountpoint, "queue", "status", *queue, "--json")
        assert status.returncode == 0, status.stderr
    behind = world.root / "shared" / "qp" / "queue"
    assert os.listdir(behind / "done") and job in os.listdir(behind / "done")
    for state in ("inbox", "pending", "claimed", "lease"):
        assert os.listdir(behind / state) == [], f"{state} left {os.listdir(behind / state)}"
    assert not [name for name in os.listdir(behind) if name.endswith(".tmp")]


@pytest.fixture
def team(world: World) -> World:
    """Agent ``coder`` may write ``shared/team`` and only read ``shared/audit``."""
    world.agent("coder", shared={"team": ["read", "write"], "audit": ["read"]})
    for space in ("team", "audit"):
        (world.root / "shared" / space).mkdir(mode=0o777)
        (world.root / "shared" / space).chmod(0o777)
    (world.root / "shared" / "audit" / "report").write_text("the auditors'\n")
    (world.root / "shared" / "audit" / "report").chmod(0o666)
    return world


def test_an_agent_links_only_where_it_may_write(team: World) -> None:
    mountpoint = team.scratch / "ctx"
    shared = mountpoint / "shared"
    with mounted(team.root, mountpoint, "--as", "coder"):
        made = as_user(
            team.user,
            f"echo mine > {shared}/team/a && ln {shared}/team/a {shared}/team/b && "
            f"rm {shared}/team/a && cat {shared}/team/b",
        )
        assert made.returncode == 0 and made.stdout == "mine\n", made.stderr
        # A name in a writable place must not open a read-only space's file to writes.
        refused = as_user(team.user, f"ln {shared}/audit/report {shared}/team/report")
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused.stderr
        refused = as_user(team.user, f"ln {shared}/team/b {shared}/audit/b")
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused.stderr
    assert sorted(os.listdir(team.root / "shared" / "team")) == ["b"]
    assert os.listdir(team.root / "shared" / "audit") == ["report"]
