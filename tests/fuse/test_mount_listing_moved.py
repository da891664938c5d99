"""A directory moved or replaced on the storage root while it is listed through the mount
(SPEC F-1; docs/mount.md, *Listings*): the listing goes on to its end, or fails with ESTALE,
never ends short as if complete (glibc's readdir reads ENOENT as the end), nor lists another
directory's entries under its names."""

from __future__ import annotations

import errno
import os
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


@pytest.mark.parametrize("replaced", [False, True], ids=["moved-away", "replaced"])
def test_a_directory_moved_while_listed_is_estale_never_a_short_listing(
    world: World, replaced: bool
) -> None:
    listed = world.root / "home" / "L"
    names = many_entries(listed)
    with mounted(world.root, world.scratch / "ctx"):
        seen = []
        with os.scandir(world.scratch / "ctx" / "home" / "L") as listing:
            seen.append(next(listing).name)
            listed.rename(listed.with_name("L.aside"))
            if replaced:
                listed.mkdir()
                for name in names:
                    (listed / name).mkdir()
            with pytest.raises(OSError) as stopped:
                seen += [entry.name for entry in listing]
    assert stopped.value.errno == errno.ESTALE
    assert len(seen) < ENTRIES and set(seen) <= set(names)
