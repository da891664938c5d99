"""Recover's move refused by the kernel although the check before it passed.

``recover`` checks that it may write every directory a transition changes before its first
step, but the kernel may still refuse the move: an append-only attribute (which no write check
sees), an immutable attribute or a read-only remount that lands after the check.  The error
line then says which directory refused, why and what to do, never a bare errno, the run exits
1, and the job is where it was (or, stopped part-way, in a state the next run completes).
Needs root (chattr, mount).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from cortexfs import durable, storage
from cortexfs.queue import Holder, Queue, claim, publish, queue_path
from cortexfs.queue.layout import init_queue
from cortexfs.queue.recovery import recover
from cortexfs.shared.spaces import create_shared_space
from tests.queue.helpers import PROJECT, dead_pid, request
from tests.support.cli import ctx
from tests.support.storage import attribute, small_tmpfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chattr, mount)")


def abandoned_jobs(queue_dir: Path, *names: str) -> list[str]:
    """Jobs published and claimed by a holder that has exited: plain recover requeues them."""
    gone = dataclasses.replace(Holder.for_process(worker="w"), pid=dead_pid())
    with Queue.open(queue_dir) as queue:
        jobs = [publish(queue, request(n), name=name) for n, name in enumerate(names)]
        for _ in jobs:
            assert claim(queue, gone) is not None
    return jobs


def tree(queue_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(queue_dir)) for p in queue_dir.rglob("*"))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "storage"
    storage.ensure_root_abi(root)  # the root ABI alone: its core tools are not these tests'
    create_shared_space(root, PROJECT)
    return root


def status(root: Path) -> dict[str, object]:
    said = ctx(root, "queue", "status", "--project", PROJECT, "--json")
    assert said.returncode == 0, said.stderr
    return json.loads(said.stdout)


def test_a_move_the_kernel_refuses_after_the_check_names_the_directory_and_the_remedy(
    root: Path,
) -> None:
    queue_dir = queue_path(root, PROJECT)
    stuck, freed = abandoned_jobs(queue_dir, "stuck", "freed")
    claim_dir = queue_dir / "claimed" / stuck
    refusal = (
        f"EPERM: cannot requeue {stuck} in queue {queue_dir}: {claim_dir} is append-only "
        "(attribute 'a', which 'lsattr -d' shows): entries may be added to it but none moved "
        f"out or removed, by root too; have root remove it with 'chattr -a {claim_dir}'; "
        "left as it is"
    )

    with attribute(claim_dir, "a"):
        # The dry run, which tries nothing, looks at the attribute and predicts the refusal.
        predicted = ctx(root, "queue", "recover", "--project", PROJECT, "--dry-run")
        untouched = tree(queue_dir)
        said = ctx(root, "queue", "recover", "--project", PROJECT)
        after = tree(queue_dir)
        as_json = ctx(root, "queue", "recover", "--project", PROJECT, "--json")
        stands = status(root)

    assert predicted.returncode == 1, predicted.stdout
    assert f"error    {stuck}: {refusal}" in predicted.stdout.splitlines()
    assert "1 would requeue" in predicted.stdout and "1 errors" in predicted.stdout
    assert f"claimed/{freed}/{freed}" in untouched  # the dry run moved nothing
    assert said.returncode == 1, said.stderr  # a job could not be handled (Q-6, §2.4)
    assert f"error    {stuck}: {refusal}" in said.stdout.splitlines()
    assert "1 requeued" in said.stdout and "1 errors: queue NOT consistent" in said.stdout
    assert as_json.returncode == 1, as_json.stderr
    [error] = json.loads(as_json.stdout)["errors"]
    assert error["error"] == "EPERM" and error["detail"] == refusal
    assert (error["action"], error["applied"]) == ("requeue", False)  # what was tried
    # Nothing half-moved: the refused job is claimed and leased as before, the other pending.
    assert f"claimed/{stuck}/{stuck}" in after and f"lease/{stuck}/worker" in after
    assert f"pending/{stuck}" not in after and f"pending/{freed}" in after
    assert stands["counts"] == {
        "pending": 1,
        "claimed": 1,
        "done": 0,
        "failed": 0,
        "incomplete": 0,
        "conflict": 0,
        "ignored": 0,
    }

    mended = ctx(root, "queue", "recover", "--project", PROJECT)
    assert mended.returncode == 0, mended.stdout
    assert sorted(os.listdir(queue_dir / "pending")) == sorted([stuck, freed])


def test_an_immutable_directory_is_named_as_such_not_as_a_mode_to_change(root: Path) -> None:
    queue_dir = queue_path(root, PROJECT)
    [job] = abandoned_jobs(queue_dir, "held")
    pending = queue_dir / "pending"
    before = tree(queue_dir)

    with attribute(pending, "i"):
        said = ctx(root, "queue", "recover", "--project", PROJECT)
        after = tree(queue_dir)

    assert said.returncode == 1, said.stderr
    assert (
        f"error    {job}: EPERM: cannot requeue {job} in queue {queue_dir}: {pending} is "
        "immutable (attribute 'i', which 'lsattr -d' shows): nothing in it may be added, "
        f"moved or removed, by root too; have root remove it with 'chattr -i {pending}'; "
        "left as it is"
    ) in said.stdout.splitlines()
    assert "chmod" not in said.stdout  # its mode (2770) lets its owner write
    assert after == before


class ImmutableAt(durable.FsOps):
    """Real operations; when the protocol reaches step ``at``, ``target`` is made immutable,
    as an administrator's chattr between recover's check and its move would."""

    def __init__(self, at: str, target: Path) -> None:
        super().__init__()
        self.at, self.target, self.made = at, target, False

    def step(self, name: str) -> None:
        if name == self.at and not self.made:
            subprocess.run(["chattr", "+i", str(self.target)], check=True)
            self.made = True


def test_a_cleanup_refused_part_way_says_where_the_job_stands_and_what_completes_it(
    root: Path,
) -> None:
    queue_dir = queue_path(root, PROJECT)
    [job] = abandoned_jobs(queue_dir, "half")
    lease = queue_dir / "lease"
    with attribute(lease, "i"):
        pass  # skips the test where chattr does not work
    try:
        with Queue.open(queue_dir, ImmutableAt("recover.cleanup", lease)) as queue:
            report = recover(queue)
        stands = status(root)
    finally:
        subprocess.run(["chattr", "-i", str(lease)], check=False)

    [error] = report.errors
    assert error.error == "EPERM"
    assert error.detail == (
        f"EPERM: cannot requeue {job} in queue {queue_dir}: {lease} is immutable (attribute "
        "'i', which 'lsattr -d' shows): nothing in it may be added, moved or removed, by root "
        f"too; have root remove it with 'chattr -i {lease}'; stopped part-way: it is now "
        "incomplete (pending, with a leftover claim or lease), for 'ctx queue recover "
        "--reconcile' to complete"
    )
    assert not report.consistent
    assert stands["pending"] == 0 and stands["counts"]["incomplete"] == 1  # type: ignore[index]

    completed = ctx(root, "queue", "recover", "--project", PROJECT, "--reconcile")
    assert completed.returncode == 0, completed.stdout
    assert os.listdir(queue_dir / "pending") == [job]
    assert os.listdir(queue_dir / "lease") == os.listdir(queue_dir / "claimed") == []


class ReadOnlyAt(durable.FsOps):
    """Real operations; when the protocol reaches step ``at``, ``mountpoint`` is remounted
    read-only, as an administrator's remount between recover's check and its move would."""

    def __init__(self, at: str, mountpoint: Path) -> None:
        super().__init__()
        self.at, self.mountpoint = at, mountpoint

    def step(self, name: str) -> None:
        if name == self.at:
            remount = ["mount", "-o", "remount,ro", str(self.mountpoint)]
            subprocess.run(remount, check=True)


def test_a_read_only_remount_after_the_check_says_to_remount_it(tmp_path: Path) -> None:
    with small_tmpfs(tmp_path / "disk", "4m") as disk:
        queue_dir = disk / "queue"
        init_queue(queue_dir)
        [job] = abandoned_jobs(queue_dir, "ro")
        before = tree(queue_dir)
        with Queue.open(queue_dir, ReadOnlyAt("recover.requeue", disk)) as queue:
            report = recover(queue)
        after = tree(queue_dir)
        said = ctx(tmp_path / "elsewhere", "queue", "status", "--queue", str(queue_dir), "--json")

    [error] = report.errors
    assert error.error == "EROFS"
    assert error.detail == (
        f"EROFS: cannot requeue {job} in queue {queue_dir}: {queue_dir}/pending is on a "
        "read-only filesystem; remount it read-write, or use a storage root on a writable "
        "one; left as it is"
    )
    assert not report.consistent
    assert after == before  # nothing half-moved
    assert said.returncode == 0, said.stderr
    assert json.loads(said.stdout)["counts"]["claimed"] == 1


def test_a_stray_temp_file_recover_may_not_remove_names_the_directory(root: Path) -> None:
    queue_dir = queue_path(root, PROJECT)
    temp = queue_dir / "inbox" / "old.req.json.publish.tmp"
    temp.write_text("{}")
    old = time.time() - 3600
    os.utime(temp, (old, old))
    inbox = queue_dir / "inbox"

    with attribute(inbox, "i"):
        said = ctx(root, "queue", "recover", "--project", PROJECT, "--reconcile", "--json")

    [error] = json.loads(said.stdout)["errors"]
    assert error["error"] == "EPERM" and error["action"] is None  # a temp is no job's transition
    assert error["detail"] == (
        f"EPERM: cannot remove the stray temp file inbox/{temp.name} in queue {queue_dir}: "
        f"{inbox} is immutable (attribute 'i', which 'lsattr -d' shows): nothing in it may be "
        f"added, moved or removed, by root too; have root remove it with 'chattr -i {inbox}'; "
        "not removed"
    )
    assert temp.exists()


def test_a_requeue_across_mounts_names_the_directory_on_the_other_mount(
    root: Path, tmp_path: Path
) -> None:
    """A bind mount over pending/ (of the same filesystem: a rename crosses no mount) makes
    the requeue EXDEV; the error names pending/, not a list of every directory the move
    changes, says why and what mends it, and the job is left as it was."""
    queue_dir = queue_path(root, PROJECT)
    [job] = abandoned_jobs(queue_dir, "crossing")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    before = tree(queue_dir)
    subprocess.run(["mount", "--bind", str(elsewhere), str(queue_dir / "pending")], check=True)
    try:
        said = ctx(root, "queue", "recover", "--project", PROJECT, "--json")
    finally:
        subprocess.run(["umount", str(queue_dir / "pending")], check=True)

    assert said.returncode == 1, said.stderr
    [error] = json.loads(said.stdout)["errors"]
    assert (error["error"], error["action"]) == ("EXDEV", "requeue")
    assert error["detail"].startswith(
        f"EXDEV: cannot requeue {job} in queue {queue_dir}: {queue_dir / 'pending'} refused: "
        "Invalid cross-device link (a directory of the queue is on another filesystem than "
        "the rest, and a rename never crosses filesystems); left as it is: put the queue's "
        "directories on one filesystem"
    ), error["detail"]
    assert tree(queue_dir) == before and os.listdir(elsewhere) == []
