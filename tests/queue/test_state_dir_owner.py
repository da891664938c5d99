"""A state directory of a shared queue that belongs to a member, not to the queue's owner.

``queue/`` is sticky (03770) so that no member renames or removes its six directories, but
the sticky bit never stops a directory's own owner: a ``pending/`` a member made (an older
layout, or a queue/ that was not sticky then) is that member's to rename away with the jobs
in it, or to close to everyone else.  ``ctx queue status`` says so, and how to mend it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from cortexfs.queue import Queue, publish, queue_path
from cortexfs.shared.spaces import create_shared_space
from tests.queue.helpers import PROJECT, request
from tests.support.cli import ctx
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser, find_or_create_user, run_as

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]


@pytest.fixture
def member() -> UnprivilegedUser:
    return find_or_create_user()


@pytest.fixture
def space(traversable_tmp: Path, member: UnprivilegedUser) -> Path:
    """A storage root whose space (root's, in the member's group) has one pending job."""
    root = traversable_tmp / "storage"
    root.mkdir(mode=0o755)
    create_shared_space(root, PROJECT, gid=member.gid)
    with Queue.open(queue_path(root, PROJECT)) as queue:
        publish(queue, request(), name="kept")
    return root


def test_a_state_directory_of_the_queue_owner_is_not_reported(space: Path) -> None:
    said = ctx(space, "queue", "status", "--project", PROJECT, "--json")

    assert said.returncode == 0, said.stderr
    assert json.loads(said.stdout)["owned_by_others"] == []
    text = ctx(space, "queue", "status", "--project", PROJECT)
    assert "owner" not in text.stdout


def test_status_names_a_state_directory_a_member_owns_and_how_to_give_it_back(
    space: Path, member: UnprivilegedUser
) -> None:
    queue_dir = queue_path(space, PROJECT)
    pending = queue_dir / "pending"
    os.chown(pending, member.uid, -1)  # as a member's 'ctx queue init' of an older layout made it
    reason = (
        f"owned by uid {member.uid}, not by uid 0 who owns the queue: uid {member.uid} may "
        "change its mode, locking every other user of the queue out of pending/, and, if it "
        "may write in the queue directory, rename pending/ away with the jobs in it (the "
        "sticky bit of the queue directory does not stop a directory's own owner)"
    )
    remedy = f"have root give it to the queue's owner: chown 0 {pending}"

    text = ctx(space, "queue", "status", "--project", PROJECT)
    as_json = ctx(space, "queue", "status", "--project", PROJECT, "--json")
    by_the_member = run_as(
        member, [*CTX, "--storage", str(space), "queue", "status", "-p", PROJECT, "--json"]
    )

    assert text.returncode == 0, text.stderr  # not a conflict (SPEC §2.4)
    assert f"owner      pending/: {reason}; {remedy}" in text.stdout.splitlines()
    expected = [
        {"path": "pending", "uid": member.uid, "queue_owner": 0, "reason": reason, "remedy": remedy}
    ]
    assert as_json.returncode == 0, as_json.stderr
    status = json.loads(as_json.stdout)
    assert status["owned_by_others"] == expected
    assert status["pending"] == 1 and status["counts"]["pending"] == 1
    assert by_the_member.returncode == 0, by_the_member.stderr
    assert json.loads(by_the_member.stdout)["owned_by_others"] == expected

    # What the line warns of: the member renames its own pending/ out of the sticky queue
    # directory (and with it the job), while root's claimed/ stays where it is.
    moved = run_as(member, ["mv", str(pending), str(queue_dir / "taken")])
    kept = run_as(member, ["mv", str(queue_dir / "claimed"), str(queue_dir / "taken2")])
    assert moved.returncode == 0, moved.stderr
    assert kept.returncode != 0 and "Operation not permitted" in kept.stderr
    os.rename(queue_dir / "taken", pending)

    os.chown(pending, 0, -1)  # the remedy the line names
    mended = ctx(space, "queue", "status", "--project", PROJECT, "--json")
    assert json.loads(mended.stdout)["owned_by_others"] == []
