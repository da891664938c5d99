"""``ctx bootstrap`` tightens the home sessions an older version made readable by the agent's
group (0750 directories, 0640 events.jsonl) to the modes new ones get (SPEC S-1, R-5)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import cortexfs.shared.home_sessions  # noqa: F401  (registers its bootstrap step)
from cortexfs import storage
from cortexfs.shared.sessions import SessionRef, open_session
from cortexfs.shared.tree import Ownership
from tests.support.users import UnprivilegedUser, access_as

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]
OLD_DIRECTORY_MODE, OLD_EVENTS_MODE = 0o750, 0o640  # what versions before them made
LEVELS = ("agent", "agent/alice", "agent/alice/session", "agent/alice/session/s1")


def old_home_session(root: Path, user: UnprivilegedUser) -> Path:
    """A home session of agent alice (the test user's uid and group) with one event, given
    the modes an older version made it with; its home."""
    ref = SessionRef.home(root, user.uid, "alice", "s1")
    with open_session(ref, owner=Ownership(user.uid, user.gid)) as session:
        session.record("tool_result", object="tool/fs.stat", status="ok", output="secret")
    home = root / "home" / str(user.uid)
    for level in LEVELS:
        (home / level).chmod(OLD_DIRECTORY_MODE)
    (home / LEVELS[-1] / "events.jsonl").chmod(OLD_EVENTS_MODE)
    return home


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_bootstrap_tightens_an_old_home_session_so_the_group_reads_none_of_it(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root = traversable_tmp / "storage"
    storage.bootstrap(root)
    home = old_home_session(root, unprivileged_user)
    events = home / LEVELS[-1] / "events.jsonl"
    # Another agent's uid sharing alice's group.
    neighbour = UnprivilegedUser("neighbour", unprivileged_user.uid + 1000, unprivileged_user.gid)
    assert access_as(neighbour, [(str(events), "r")]) == [True]

    done = subprocess.run(
        [*CTX, "--storage", str(root), "bootstrap"], capture_output=True, text=True
    )

    assert done.returncode == 0, done.stdout + done.stderr
    shown = f"home/{unprivileged_user.uid}"
    for level in LEVELS:
        assert mode(home / level) == 0o700, level
        assert f"repaired  {shown}/{level} (mode 0750 -> 0700)" in done.stdout
    assert mode(events) == 0o600
    assert f"repaired  {shown}/{LEVELS[-1]}/events.jsonl (mode 0640 -> 0600)" in done.stdout
    assert access_as(neighbour, [(str(events), "r")]) == [False]
    assert os.stat(events).st_uid == unprivileged_user.uid  # only the mode changed

    again = storage.bootstrap(root)
    assert [line for line in again.repaired if line.startswith("home/")] == []


def test_links_are_not_followed_and_narrower_modes_are_kept(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root = traversable_tmp / "storage"
    storage.bootstrap(root)
    home = old_home_session(root, unprivileged_user)
    outside = traversable_tmp / "outside"
    outside.mkdir(mode=0o755)
    (outside / "events.jsonl").write_text("not a session's\n")
    os.chmod(outside / "events.jsonl", 0o644)
    sessions = home / "agent/alice/session"
    (sessions / "linked").symlink_to(outside)
    (sessions / "s2").mkdir()
    (sessions / "s2").chmod(0o500)
    (sessions / "s2/events.jsonl").symlink_to(outside / "events.jsonl")

    report = storage.bootstrap(root)

    assert report.problems == []
    assert mode(outside) == 0o755 and mode(outside / "events.jsonl") == 0o644
    assert mode(sessions / "s2") == 0o500
    assert not [line for line in report.repaired if "linked" in line or "/s2" in line]
    assert mode(sessions / "s1/events.jsonl") == 0o600


def test_session_repair_tightens_the_session_it_repairs(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root = traversable_tmp / "storage"
    storage.bootstrap(root)
    home = old_home_session(root, unprivileged_user)
    session = home / LEVELS[-1]
    repair = [*CTX, "--storage", str(root), "session", "repair", "alice", "--session", "s1"]
    uid = ["--uid", str(unprivileged_user.uid), "--json"]

    done = subprocess.run([*repair, *uid], capture_output=True, text=True)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tightened"] == [
        f"{session} (mode 0750 -> 0700)",
        f"{session}/events.jsonl (mode 0640 -> 0600)",
    ]
    assert (mode(session), mode(session / "events.jsonl")) == (0o700, 0o600)
