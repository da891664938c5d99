"""A directory replaced or removed on the storage root while it is listed through the mount
(SPEC F-1; docs/mount.md, *Listings*): replaced, the listing fails with ESTALE, never lists
the other directory's entries under its names; removed, it ends there, as on a local disk."""

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


def test_a_directory_replaced_while_listed_is_estale_never_the_others_entries(
    world: World,
) -> None:
    listed = world.root / "home" / "L"
    names = many_entries(listed)
    with mounted(world.root, world.scratch / "ctx"):
        seen = []
        with os.scandir(world.scratch / "ctx" / "home" / "L") as listing:
            seen.append(next(listing).name)
            listed.rename(listed.with_name("L.aside"))
            listed.mkdir()
            for name in names:
                (listed / name).mkdir()
            with pytest.raises(OSError) as stopped:
                seen += [entry.name for entry in listing if not entry.is_dir()]
    assert stopped.value.errno == errno.ESTALE
    assert len(seen) < ENTRIES


def test_a_directory_removed_while_listed_ends_its_listing(world: World) -> None:
    listed = world.root / "home" / "L"
    many_entries(listed)
    view = world.scratch / "ctx"
    with mounted(world.root, view), os.scandir(view / "home" / "L") as listing:
        first = next(listing).name
        shutil.rmtree(listed)
        rest = [entry.name for entry in listing]  # no error: the end, as on a local disk
    assert first not in rest and len(rest) < ENTRIES
