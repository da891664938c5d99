"""Where ``ctx mount`` mounts, and how its process ends without leaving a dead mount (F-1).

A mount point inside the storage root would make the daemon wait on its own answers; one
that is already a CortexFS mount is busy, not merely "not empty"; a missing storage root is
ENOENT as for every command that needs one.  Whatever stops the process — SIGTERM, SIGINT,
SIGHUP of a closed terminal, even at the instant the mount appears — unmounts it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.fuse.support import NEEDS_A_MOUNT, mounted
from tests.fuse.test_mount import ctx_mount, in_mount_table
from tests.tools.support import World

pytestmark = NEEDS_A_MOUNT


def test_a_mount_point_inside_the_storage_root_is_refused(world: World) -> None:
    inside = world.root / "home" / "0" / "ctx"
    inside.mkdir(parents=True)
    through_a_link = world.scratch / "root-link"
    through_a_link.symlink_to(world.root)

    for mountpoint in (inside, through_a_link / "home" / "0" / "ctx"):
        refused = ctx_mount(world.root, mountpoint)

        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.startswith("ctx: EINVAL: "), refused.stderr
        assert "inside the storage root" in refused.stderr
        assert not in_mount_table(inside)


def test_a_second_mount_on_a_cortexfs_mount_is_busy(world: World) -> None:
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint):
        for view in ((), ("--as", "ghost")):
            refused = ctx_mount(world.root, mountpoint, *view)

            assert refused.returncode == 1, refused.stderr
            assert refused.stderr.startswith("ctx: EBUSY: "), refused.stderr
            assert f"ctx umount {mountpoint}" in refused.stderr


def test_a_missing_storage_root_is_enoent(world: World) -> None:
    mountpoint = world.scratch / "ctx"
    mountpoint.mkdir()

    refused = ctx_mount(world.scratch / "no-root", mountpoint)

    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith("ctx: ENOENT: storage root "), refused.stderr
    assert "ctx bootstrap" in refused.stderr
    assert not in_mount_table(mountpoint)


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_each_stopping_signal_unmounts_cleanly(world: World, stop: signal.Signals) -> None:
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint) as process:
        process.send_signal(stop)
        process.wait(timeout=30)
        assert process.returncode == 0, process.stderr
    assert not in_mount_table(mountpoint)


def test_sigterm_as_the_mount_appears_leaves_no_dead_mount(world: World) -> None:
    mountpoint = world.scratch / "ctx"
    mountpoint.mkdir()
    command = [sys.executable, "-m", "cortexfs", "--storage", str(world.root), "mount"]
    dead = 0
    for _ in range(10):
        process = subprocess.Popen([*command, str(mountpoint)], stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not in_mount_table(mountpoint) and process.poll() is None:
            assert time.monotonic() < deadline, "the mount did not appear"
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
        if in_mount_table(mountpoint):
            dead += 1
            subprocess.run(["umount", "--lazy", str(mountpoint)], check=False)
    assert dead == 0, f"{dead} of 10 mounts were left dead by a SIGTERM"
    assert os.listdir(mountpoint) == []
