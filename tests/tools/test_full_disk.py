"""A full disk after a tool ran (T-7, W-1): its call cannot be recorded, and a worker cannot
finish its job.  The storage root lives on a small tmpfs that the tool itself fills, so the
tool runs and then its result meets ENOSPC.  Needs root (mount, and a second uid)."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cortexfs.queue import Queue, publish, queue_path
from cortexfs.shared.spaces import create_shared_space
from tests.support.cli import ctx
from tests.support.storage import small_tmpfs
from tests.support.users import UnprivilegedUser
from tests.tools.support import World, bootstrapped_root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")

# Fills its working directory (/workspace, on the same tmpfs), then prints 16 KiB of output:
# the result event needs
# pages the disk no longer has.
FILL = (
    "#!/bin/sh\n"
    "head -c 64000000 /dev/zero > fill 2>/dev/null\n"
    'printf \'{"text": "%s"}\' "$(head -c 16000 /dev/zero | tr \'\\0\' a)"\n'
)


@pytest.fixture
def small_world(traversable_tmp: Path, unprivileged_user: UnprivilegedUser) -> Iterator[World]:
    with small_tmpfs(traversable_tmp / "disk", "8m") as disk:
        disk.chmod(0o755)
        workspace = disk / "work"
        workspace.mkdir()
        os.chown(workspace, unprivileged_user.uid, unprivileged_user.gid)
        world = World(bootstrapped_root(disk / "storage"), unprivileged_user, workspace, disk)
        world.install("sh.fill", FILL)
        world.agent("coder", tools=["sh.fill"])
        world.allow_tool("sh.fill")
        yield world


def test_a_call_that_cannot_be_recorded_is_an_error_that_keeps_its_output(
    small_world: World,
) -> None:
    ran = ctx(small_world.root, "run", "--agent", "coder", "--native", "sh.fill", stdin="{}")

    frames = [json.loads(line) for line in ran.stdout.splitlines()]
    result = frames[-1]
    assert ran.returncode == 1, ran.stderr
    assert result["type"] == "result" and result["status"] == "error", result
    assert result["error"]["stage"] == "record" and result["error"]["errno"] == errno.ENOSPC
    assert "the tool exited 0, but its result could not be recorded" in result["error"]["message"]
    assert result["exit_status"] == 0 and len(result["output"]["text"]) == 16000


def test_a_terminal_call_that_cannot_be_recorded_says_so_and_exits_1(small_world: World) -> None:
    ran = ctx(small_world.root, "run", "--agent", "coder", "sh.fill")

    assert ran.returncode == 1
    assert ran.stdout.count("a") >= 16000  # the tool's output reached its caller
    assert ran.stderr.startswith("ctx: ENOSPC: the tool exited 0, but its result could not"), (
        ran.stderr
    )


def test_a_worker_whose_job_cannot_be_finished_stops_and_the_job_is_recovered(
    small_world: World,
) -> None:
    root = small_world.root
    create_shared_space(root, "proj")
    with Queue.open(queue_path(root, "proj")) as queue:
        jobs = [publish(queue, {"tool": "sh.fill", "input": {}}, f"j{n}") for n in range(2)]

    worked = ctx(root, "queue", "work", "--project", "proj", "--agent", "coder", "--drain")

    assert worked.returncode == 1
    assert "ctx: ENOSPC: the worker stopped: job j0.req.json was left claimed" in worked.stderr
    queue_dir = queue_path(root, "proj")
    assert os.listdir(queue_dir / "claimed") == [jobs[0]]  # left for recover
    assert os.listdir(queue_dir / "pending") == [jobs[1]]  # never claimed
    (small_world.workspace / "fill").unlink()
    recovered = ctx(root, "queue", "recover", "--project", "proj")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert sorted(os.listdir(queue_dir / "pending")) == sorted(jobs)
