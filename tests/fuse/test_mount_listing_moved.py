"""A directory moved, replaced or removed on the storage root while it is listed through the
mount (SPEC F-1; docs/mount.md, *Listings*): moved away or replaced, the listing goes on in the
directory it began in, every entry once and none of another directory's; removed, it ends
there, as on a local disk."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from tests.fuse.support import NEEDS_A_MOUNT, mounted
from tests.tools.support import World

pytestmark = NEEDS_A_MOUNT

ENTRIES = 2000  # more than one reply of the daemon holds


def many_entries(directory: Path) -> list[str]:
    directory.mkdir()
    names = [f"e{n:05d}" for n in range(ENTRIES)]
    for name in names:
        (directory / name).touch()
    return names


def test_a_directory_replaced_while_listed_lists_its_own_entries_never_the_others(
    world: World,
) -> None:
    listed = world.root / "home" / "L"
    names = many_entries(listed)
    view = world.scratch / "ctx"
    with mounted(world.root, view), os.scandir(view / "home" / "L") as listing:
        seen = [next(listing)]
        listed.rename(listed.with_name("L.aside"))
        listed.mkdir()
        for name in names:
            (listed / name).mkdir()
        seen += list(listing)
    assert sorted(entry.name for entry in seen) == names
    assert not any(entry.is_dir(follow_symlinks=False) for entry in seen)


def test_a_directory_moved_away_while_listed_lists_every_entry_once(world: World) -> None:
    listed = world.root / "home" / "L"
    names = many_entries(listed)
    view = world.scratch / "ctx"
    with mounted(world.root, view), os.scandir(view / "home" / "L") as listing:
        seen = [next(listing).name]
        listed.rename(world.root / "L.elsewhere")
        seen += [entry.name for entry in listing]
    assert sorted(seen) == names
    assert sorted(os.listdir(world.root / "L.elsewhere")) == names


def test_a_listing_rewound_after_its_directory_moved_away_is_enoent(world: World) -> None:
    listed = world.root / "home" / "L"
    many_entries(listed)
    with mounted(world.root, world.scratch / "ctx"):
        fd = os.open(world.scratch / "ctx" / "home" / "L", os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert len(os.listdir(fd)) == ENTRIES
            listed.rename(world.root / "L.elsewhere")
            with pytest.raises(OSError) as gone:
                os.listdir(fd)
        finally:
            os.close(fd)
    assert gone.value.errno == errno.ENOENT


def test_a_directory_removed_while_listed_ends_its_listing(world: World) -> None:
    listed = world.root / "home" / "L"
    many_entries(listed)
    view = world.scratch / "ctx"
    with mounted(world.root, view), os.scandir(view / "home" / "L") as listing:
        first = next(listing).name
        shutil.rmtree(listed)
        rest = [entry.name for entry in listing]  # no error: the end, as on a local disk
    assert first not in rest and len(rest) < ENTRIES
