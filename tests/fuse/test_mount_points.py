"""How ``ctx mount``'s process ends without leaving a dead mount (F-1).

Whatever stops the process — SIGTERM, SIGINT, SIGHUP of a closed terminal, even at the
instant the mount appears — unmounts it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.fuse.support import NEEDS_A_MOUNT, mounted
from tests.fuse.test_mount import in_mount_table
from tests.tools.support import World

pytestmark = NEEDS_A_MOUNT


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
