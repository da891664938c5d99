"""Where ``ctx mount`` mounts, and how its process ends without leaving a dead mount (F-1).

A mount point inside the storage root would make the daemon wait on its own answers, whether
it is inside by path or through a bind mount, and so would a storage root that is itself a
CortexFS mount (two daemons waiting on each other); a mount point that is already a CortexFS
mount is busy, not merely "not empty"; a missing storage root is ENOENT as for every command
that needs one.  Whatever stops the process — SIGTERM, SIGINT, SIGHUP of a closed terminal,
even at the instant the mount appears — unmounts it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

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


@contextlib.contextmanager
def bind_mounted(source: Path, target: Path) -> Iterator[Path]:
    """``source`` bind-mounted at ``target`` for the block; private, so that a mount a test
    makes below it (when the refusal it expects does not come) shows nowhere else."""
    target.mkdir()
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True)
    try:
        subprocess.run(["mount", "--make-private", str(target)], check=True)
        yield target
    finally:
        subprocess.run(["umount", "--lazy", str(target)], check=True)


def refused_mount(root: Path, mountpoint: Path) -> subprocess.CompletedProcess[str]:
    """``ctx mount`` expected to refuse; should it mount instead, it is ended and unmounted,
    and the test fails, rather than left waiting in the foreground."""
    process = subprocess.Popen(
        [sys.executable, "-m", "cortexfs", "--storage", str(root), "mount", str(mountpoint)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out, err = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)
        pytest.fail(f"ctx mount --storage {root} {mountpoint} mounted instead of refusing")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_a_mount_point_in_the_storage_root_under_another_name_is_refused(world: World) -> None:
    """A bind mount of the root (or of a directory above it) is the root under another path:
    what is mounted below it is inside the root the daemon walks.  With shared propagation
    (systemd's default) the mount would even appear at the root's own path."""
    inside = world.root / "home" / "0" / "ctx"
    inside.mkdir(parents=True)
    with (
        bind_mounted(world.root, world.scratch / "root-alias") as root_alias,
        bind_mounted(world.root.parent, world.scratch / "above-alias") as above_alias,
    ):
        for mountpoint in (
            root_alias / "home" / "0" / "ctx",
            above_alias / world.root.name / "home" / "0" / "ctx",
        ):
            refused = refused_mount(world.root, mountpoint)

            assert refused.returncode == 1, refused.stderr
            assert refused.stderr.startswith("ctx: EINVAL: "), refused.stderr
            assert "inside the storage root" in refused.stderr
            assert "nothing was mounted" in refused.stderr
            assert not in_mount_table(mountpoint)


def test_a_storage_root_on_a_cortexfs_mount_is_refused(world: World) -> None:
    """Served again through FUSE, the storage root's answers come from another daemon, which
    may in turn walk the new mount (a mount point in its own root): each waits on the other."""
    served = world.scratch / "served"
    elsewhere = world.scratch / "elsewhere"
    elsewhere.mkdir()
    with mounted(world.root, served):
        for root in (served, served / "."):
            refused = refused_mount(root, elsewhere)

            assert refused.returncode == 1, refused.stderr
            assert refused.stderr.startswith("ctx: EINVAL: "), refused.stderr
            assert f"lies on the CortexFS mount {served}" in refused.stderr
            assert not in_mount_table(elsewhere)


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
