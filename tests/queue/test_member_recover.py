"""A member's recover meets a claim directory it may not write: named as finish names it.

An older release made ``claimed/J`` and ``lease/J`` with the claimer's umask (``02755`` under
root's), and repairing the space does not widen them: another member of the space's group
may then not move the request out, and recover said only ``EACCES: Permission denied``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cortexfs.queue import Holder, Queue, claim, publish, queue_path
from cortexfs.shared.spaces import create_shared_space
from tests.queue.helpers import PROJECT, dead_pid, request
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser, find_or_create_user, run_as

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]


@pytest.fixture
def member() -> UnprivilegedUser:
    return find_or_create_user()


@pytest.fixture
def old_claim(traversable_tmp: Path, member: UnprivilegedUser) -> Iterator[tuple[Path, str]]:
    """A storage root whose space's group is the member's, holding one job claimed by a
    holder that has exited, its ``claimed/J`` and ``lease/J`` root's and ``02755``."""
    root = traversable_tmp / "storage"
    root.mkdir(mode=0o755)
    create_shared_space(root, PROJECT, gid=member.gid)
    queue_dir = queue_path(root, PROJECT)
    with Queue.open(queue_dir) as queue:
        job = publish(queue, request(), name="old")
        gone = dataclasses.replace(Holder.for_process(worker="w"), pid=dead_pid())
        assert claim(queue, gone) is not None
    for made in (queue_dir / "claimed" / job, queue_dir / "lease" / job):
        os.chmod(made, 0o2755)
    yield root, job


def tree(queue_dir: Path) -> dict[str, list[str]]:
    return {d.name: sorted(os.listdir(d)) for d in sorted(queue_dir.iterdir()) if d.is_dir()}


def test_a_members_recover_names_the_directory_it_may_not_write_and_the_remedy(
    old_claim: tuple[Path, str], member: UnprivilegedUser
) -> None:
    root, job = old_claim
    queue_dir = queue_path(root, PROJECT)
    claim_dir = queue_dir / "claimed" / job
    before = tree(queue_dir)
    argv = [*CTX, "--storage", str(root), "queue", "recover", "--project", PROJECT]

    said = run_as(member, argv)
    as_json = run_as(member, [*argv, "--json"])

    refusal = (
        f"EACCES: cannot requeue {job} in queue {queue_dir}: uid {member.uid} may not write in "
        f"{claim_dir} (owner uid 0, group {member.gid}, mode 2755); run it as root or as that "
        "owner"
    )
    assert said.returncode == 1, said.stderr
    assert f"error    {job}: {refusal}" in said.stdout
    assert said.stdout.splitlines()[0].endswith("; left as it is")
    assert as_json.returncode == 1, as_json.stderr
    [error] = json.loads(as_json.stdout)["errors"]
    assert error["error"] == "EACCES" and error["detail"].startswith(refusal)
    assert (error["action"], error["applied"]) == ("requeue", False)
    assert error["detail"].endswith("; left as it is")
    assert tree(queue_dir) == before
    assert stat.S_IMODE(os.stat(claim_dir).st_mode) == 0o2755

    by_root = subprocess.run(argv, capture_output=True, text=True)
    assert by_root.returncode == 0, by_root.stdout
    assert sorted(os.listdir(queue_dir / "pending")) == [job]


def test_a_lease_a_member_may_not_read_is_a_conflict_in_errno_words_in_every_reader(
    old_claim: tuple[Path, str], member: UnprivilegedUser
) -> None:
    """Q-6: nobody can tell whether the holder of a lease that cannot be read is alive, so the
    job is a conflict: recover's ``--json`` says ``conflict`` as status and show do, and the
    reason is the errno's name, not the language's rendering of the exception."""
    root, job = old_claim
    queue_dir = queue_path(root, PROJECT)
    os.chmod(queue_dir / "lease" / job / "worker", 0o600)
    before = tree(queue_dir)
    argv = [*CTX, "--storage", str(root), "queue"]

    recovered = run_as(member, [*argv, "recover", "--project", PROJECT, "--json"])
    shown = run_as(member, [*argv, "show", "--project", PROJECT, job, "--json"])

    assert recovered.returncode == 1, recovered.stderr
    [conflict] = json.loads(recovered.stdout)["conflicts"]
    assert conflict["job"] == job and conflict["state"] == "conflict", conflict
    reason = f"lease/{job}/worker cannot be read (EACCES: Permission denied: worker)"
    assert reason in conflict["detail"], conflict
    assert shown.returncode == 1, shown.stderr
    holder = json.loads(shown.stdout)["holder"]
    assert holder == {"state": "unreadable", "reason": reason}, holder
    assert "Errno" not in recovered.stdout + shown.stdout
    assert tree(queue_dir) == before
