"""Names changed through a real mount: rename (with its flags), unlink, rmdir (SPEC F-1).

The kernel goes on using an inode it knows under a new name without looking the name up
again, so each test uses the new name at once, in the same process that changed it.
"""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import pytest

from tests.fuse.support import NEEDS_A_MOUNT, mounted
from tests.tools.support import World

pytestmark = NEEDS_A_MOUNT

RENAME_NOREPLACE, RENAME_EXCHANGE = 1, 2


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
