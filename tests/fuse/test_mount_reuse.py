"""A node of the mount stands for one file only, even once the storage filesystem has given
that file's inode number to another (SPEC F-1; docs/mount.md, *Names*).

ext4 gives a new directory the number of one just removed; the kernel may still hold the
removed one's node (a descriptor, a working directory).  Each test tries until the number
is given again, which on ext4 is at once.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.fuse.support import NEEDS_A_MOUNT, mounted
from tests.tools.support import World

pytestmark = NEEDS_A_MOUNT

TRIES = 50


@pytest.fixture
def data(world: World) -> Path:
    directory = world.root / "shared" / "x" / "data"
    directory.mkdir(parents=True)
    return directory


@contextmanager
def held_then_replaced(here: Path, data: Path, *, directly: bool) -> Iterator[tuple[int, str]]:
    """A directory made through the mount and held open there (its descriptor), removed,
    and a new one made with its inode number — both directly on the storage root
    (``directly``) or both through the mount; yields the descriptor and the new name."""
    where = data if directly else here
    for attempt in range(TRIES):
        old, new = f"old{attempt}", f"new{attempt}"
        (here / old).mkdir()
        held = os.open(here / old, os.O_RDONLY | os.O_DIRECTORY)
        number = (data / old).stat().st_ino
        (where / old).rmdir()
        (where / new).mkdir()
        if (data / new).stat().st_ino == number:
            break
        os.close(held)
        (where / new).rmdir()
    else:
        pytest.skip("the storage filesystem gave no removed inode number again")
    try:
        yield held, new
    finally:
        os.close(held)


def test_a_file_made_in_a_directory_removed_outside_the_mount_is_not_put_in_another(
    world: World, data: Path
) -> None:
    """Creating in a removed directory is ENOENT on any local filesystem; the mount must
    not take the new directory that got its inode number for it."""
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint):
        here = mountpoint / "shared" / "x" / "data"
        with held_then_replaced(here, data, directly=True) as (held, new):
            assert (here / new).is_dir()  # the kernel is told of the new directory
            with pytest.raises(OSError) as refused:
                os.open("written-in-old", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=held)
            assert refused.value.errno in (errno.ENOENT, errno.ESTALE)
            assert os.listdir(data / new) == []
            (here / new / "mine").write_text("in the new directory\n")
            assert os.listdir(here / new) == ["mine"]


def test_a_directory_made_through_the_mount_with_a_removed_ones_number_is_a_new_one(
    world: World, data: Path
) -> None:
    """The kernel still holds the removed directory (a descriptor of it is open): had the
    new one its node, the new directory would be the removed one, dead (ENOENT inside), or
    mkdir would fail with ESTALE or EEXIST."""
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint):
        here = mountpoint / "shared" / "x" / "data"
        with held_then_replaced(here, data, directly=False) as (held, new):
            (here / new / "mine").write_text("in the new directory\n")
            assert os.listdir(here / new) == ["mine"]
            assert (data / new / "mine").read_text() == "in the new directory\n"
            with pytest.raises(OSError) as refused:
                os.open("written-in-old", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=held)
            assert refused.value.errno in (errno.ENOENT, errno.ESTALE)
            (here / new / "mine").unlink()
            (here / new).rmdir()


CHURN = """
import errno, os, sys
base, rounds = sys.argv[1], int(sys.argv[2])
os.mkdir(base)
failed = []
for i in range(rounds):
    step, d = "mkdir", f"{base}/d{i}"
    try:
        os.mkdir(d); step = "create"
        with open(f"{d}/f", "w") as f:
            f.write("x")
        step = "rename"; os.rename(f"{d}/f", f"{d}/g")
        step = "list"; assert os.listdir(d) == ["g"], os.listdir(d)
        step = "unlink"; os.unlink(f"{d}/g")
        step = "rmdir"; os.rmdir(d)
    except OSError as e:
        failed.append(f"{d} {step}: {errno.errorcode[e.errno]}")
print("\\n".join(failed))
"""


def churning(base: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHURN, str(base), "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_directories_made_and_removed_by_many_processes_at_once_never_fail(
    world: World, data: Path
) -> None:
    """Each process works only in its own directory, as it would on the storage root: the
    numbers the filesystem gives again and again must never make mkdir EEXIST or ESTALE."""
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint):
        here = mountpoint / "shared" / "x" / "data"
        workers = [churning(here / f"w{number}") for number in range(12)]
        said = [worker.communicate(timeout=120) for worker in workers]
    assert [worker.returncode for worker in workers] == [0] * len(workers), said
    assert [out.strip() for out, _ in said if out.strip()] == []
    assert all(os.listdir(data / f"w{number}") == [] for number in range(12))
