"""`ctx queue status` names a state directory that would not give the queue's group to what
members make in it (X-1, §2.4): lost setgid bit, or another group.  Reported, not refused."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.queue.helpers import PROJECT
from tests.support.cli import ctx

P = ("--project", PROJECT)


def _status(root: Path) -> tuple[int, dict, str]:
    as_json = ctx(root, "queue", "status", *P, "--json")
    text = ctx(root, "queue", "status", *P)
    assert as_json.returncode == text.returncode
    return as_json.returncode, json.loads(as_json.stdout), text.stdout


def test_a_group_shared_queue_as_made_reports_nothing(root: Path) -> None:
    assert ctx(root, "queue", "init", *P).returncode == 0
    rc, report, text = _status(root)
    assert (rc, report["group_not_inherited"]) == (0, [])
    assert "\ngroup " not in text


def test_a_state_directory_that_lost_its_setgid_bit_is_named_with_the_chmod(root: Path) -> None:
    assert ctx(root, "queue", "init", *P).returncode == 0
    pending = root / "shared" / PROJECT / "queue" / "pending"
    os.chmod(pending, 0o770)  # as a copy that did not keep the bit leaves it
    rc, report, text = _status(root)
    assert rc == 0  # nothing is refused yet: a report, not a conflict
    [entry] = report["group_not_inherited"]
    assert (entry["path"], entry["setgid"]) == ("pending", False)
    assert entry["remedy"].endswith(f"chmod g+s {pending}")
    assert "group      pending/: is not setgid" in text
    subprocess.run(entry["remedy"].partition(": ")[2], shell=True, check=True)
    assert _status(root)[1]["group_not_inherited"] == []


def test_a_state_directory_of_another_group_is_named_with_the_chgrp(root: Path) -> None:
    assert ctx(root, "queue", "init", *P).returncode == 0
    queue = root / "shared" / PROJECT / "queue"
    other = os.stat(queue).st_gid + 1
    os.chown(queue / "lease", -1, other)
    [entry] = _status(root)[1]["group_not_inherited"]
    assert (entry["path"], entry["gid"], entry["queue_gid"]) == ("lease", other, other - 1)
    assert f"belongs to gid {other}" in entry["reason"]
    subprocess.run(entry["remedy"].partition(": ")[2], shell=True, check=True)
    assert _status(root)[1]["group_not_inherited"] == []


def test_a_queue_of_one_user_has_no_group_to_give(tmp_path: Path, root: Path) -> None:
    queue = tmp_path / "private"
    assert ctx(root, "queue", "init", "--queue", str(queue)).returncode == 0
    os.chmod(queue, 0o700)
    for state in ("pending", "claimed"):
        os.chmod(queue / state, 0o700)
    done = ctx(root, "queue", "status", "--queue", str(queue), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["group_not_inherited"] == []


def test_init_over_a_queue_that_lost_a_setgid_bit_warns_with_the_chmod(root: Path) -> None:
    """Init changes nothing that exists, so it names what it keeps, as status does."""
    assert ctx(root, "queue", "init", *P).returncode == 0
    pending = root / "shared" / PROJECT / "queue" / "pending"
    os.chmod(pending, 0o770)
    again = ctx(root, "queue", "init", *P)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().endswith("ready")
    assert "ctx: warning: pending/ is not setgid" in again.stderr
    assert again.stderr.rstrip().endswith(f"chmod g+s {pending}")
    assert os.stat(pending).st_mode & 0o7777 == 0o770  # reported, not repaired
