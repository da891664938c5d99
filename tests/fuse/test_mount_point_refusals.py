"""Mount points ``ctx mount`` and ``ctx umount`` refuse, each with what to do (SPEC F-1): a
CortexFS mount that happens to list nothing is still busy, a symbolic link to nothing is
answered with the directory it leads to, a loop of links is ELOOP for ``ctx umount`` as for
``ctx mount``, and a mount point below a dead mount names the dead mount's own mount point."""

from __future__ import annotations

import errno
import os
import re
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from tests.fuse.support import NEEDS_A_MOUNT, mounted
from tests.fuse.test_mount import ctx_mount, ctx_umount, in_mount_table
from tests.fuse.test_mount_points import refused_mount
from tests.tools.support import World

pytestmark = NEEDS_A_MOUNT


def mounts_at(path: Path) -> int:
    """How many mounts the table shows at ``path`` (one over another counts twice)."""
    with open("/proc/self/mounts") as table:
        return sum(1 for line in table if line.split()[1] == str(path))


def test_an_agent_view_that_lists_nothing_is_still_a_busy_cortexfs_mount(world: World) -> None:
    """docs/mount.md: an agent's view whose entry cannot be read is empty and stays mounted;
    the mount table, not the listing, says it is a CortexFS mount."""
    world.agent("coder", tools=[])
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint, "--as", "coder"):
        (world.root / "agent" / "coder").rename(world.root / "agent" / "coder.away")
        deadline = time.monotonic() + 10
        while os.listdir(mountpoint):
            assert time.monotonic() < deadline, os.listdir(mountpoint)
            time.sleep(0.1)

        refused = refused_mount(world.root, mountpoint)

        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.startswith("ctx: EBUSY: "), refused.stderr
        assert f"'ctx umount {mountpoint}'" in refused.stderr, refused.stderr
        assert mounts_at(mountpoint) == 1


@pytest.mark.parametrize("target", ["nowhere", "gone/deeper/view"])
def test_a_mount_point_that_is_a_link_to_nothing_names_the_directory_to_make(
    world: World, target: str
) -> None:
    link = world.scratch / "ctx"
    link.symlink_to(target)

    refused = ctx_mount(world.root, link)

    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith(
        f"ctx: ENOENT: the mount point {link} is a symbolic link to {target}, which does not "
        "exist; create the empty directory it leads to"
    ), refused.stderr
    assert "remove the link" in refused.stderr, refused.stderr
    assert not (world.scratch / target).exists() and not in_mount_table(link)
    make = re.search(r"\('(mkdir [^']+)'\)", refused.stderr)
    assert make is not None, refused.stderr
    subprocess.run(shlex.split(make[1]), check=True, cwd="/")
    assert link.is_dir() and (world.scratch / target).is_dir()


@pytest.mark.parametrize("loop", ["through the parent", "the last name"])
def test_umount_through_a_loop_of_links_is_eloop_as_for_mount(world: World, loop: str) -> None:
    (world.scratch / "a").symlink_to("b")
    (world.scratch / "b").symlink_to("a")
    path = world.scratch / "a" / "ctx" if loop == "through the parent" else world.scratch / "a"

    for refused in (ctx_mount(world.root, path), ctx_umount(path)):
        assert refused.returncode == 1, refused.stderr
        assert "Traceback" not in refused.stderr, refused.stderr
        assert refused.stderr.startswith("ctx: ELOOP: "), refused.stderr
        assert str(path) in refused.stderr, refused.stderr


def test_a_mount_point_below_a_dead_mount_names_the_umount_that_removes_it(
    world: World,
) -> None:
    dead = world.scratch / "dead"
    try:
        with mounted(world.root, dead) as process:
            process.kill()
            process.wait(timeout=30)
            with pytest.raises(OSError) as gone:
                os.listdir(dead)
            assert gone.value.errno == errno.ENOTCONN

            for below in (dead / "home", dead / "home" / "missing"):
                refused = ctx_mount(world.root, below)
                assert refused.returncode == 1, refused.stderr
                assert refused.stderr.startswith("ctx: ENOTCONN: "), refused.stderr
                assert refused.stderr.endswith(
                    f"; remove the dead mount with 'ctx umount {dead}'\n"
                ), refused.stderr

            done = ctx_umount(dead)
            assert done.returncode == 0, done.stderr
            assert not in_mount_table(dead)
    finally:
        if in_mount_table(dead):  # the dead mount would outlive the test
            subprocess.run(["umount", "--lazy", str(dead)], check=False)


def test_a_malformed_agent_name_is_a_usage_error_before_the_mount_point_is_looked_at(
    world: World,
) -> None:
    """A usage error is exit 2 whatever else is wrong: the advice for a missing mount point
    would otherwise repeat ``--as`` with the name it cannot take."""
    missing = world.scratch / "no" / "such"
    refused = ctx_mount(world.root, missing, "--as", "bad name")
    assert refused.returncode == 2, refused
    assert refused.stderr.startswith("ctx: EINVAL: illegal agent name: 'bad name' holds ' '")
    assert not missing.parent.exists()
