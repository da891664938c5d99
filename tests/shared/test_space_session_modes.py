"""Spaces an older version made, before a space's ``queue/`` and its session directories were
sticky (02770): ``ctx bootstrap`` names them with the repair, and ``ctx shared create NAME
--group G`` gives the session directories their mode too, so a member no longer renames
another agent's sessions (SPEC X-1, S-6)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import cortexfs.shared.space_modes_check  # noqa: F401  (registers its bootstrap step)
from cortexfs import storage
from cortexfs.shared.sessions import SessionRef, open_session
from cortexfs.shared.tree import Ownership
from tests.support.users import UnprivilegedUser, run_as

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]
OLD_MODE = 0o2770  # what versions before the sticky bit made
SESSION_LEVELS = ("agent/alice", "agent/alice/session", "agent/alice/session/ps")


def ctx(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CTX, "--storage", str(root), *args], capture_output=True, text=True)


def old_space(root: Path, user: UnprivilegedUser) -> Path:
    """Space proj of the test user's group with alice's (the test user's) shared session ps,
    its queue/ and session directories given the modes an older version made them with."""
    assert ctx(root, "shared", "create", "proj", "--group", str(user.gid)).returncode == 0
    ref = SessionRef.shared(root, "proj", "alice", "ps")
    with open_session(ref, owner=Ownership(user.uid, user.gid)) as session:
        session.record("tool_result", object="tool/fs.stat", status="ok")
    space = root / "shared/proj"
    for level in ("queue", *SESSION_LEVELS):
        (space / level).chmod(OLD_MODE)
    return space


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_bootstrap_names_the_space_and_shared_create_gives_sessions_their_mode(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root = traversable_tmp / "storage"
    storage.bootstrap(root)
    space = old_space(root, unprivileged_user)
    sessions = space / "agent/alice/session"
    # Another agent's uid, a member of the space's group.
    member = UnprivilegedUser("member", unprivileged_user.uid + 1000, unprivileged_user.gid)
    moved = run_as(member, ["mv", str(sessions / "ps"), str(sessions / "ps.x")])
    assert moved.returncode == 0, moved.stderr
    (sessions / "ps.x").rename(sessions / "ps")

    booted = ctx(root, "bootstrap")

    assert booted.returncode == 0, booted.stderr
    gid = unprivileged_user.gid
    assert (
        f"warning   shared space proj: {space / 'queue'} has mode 2770, not 3770 (and 3 more)"
        in (booted.stdout)
    )
    # The command it suggests names the storage root bootstrap was given.
    assert f"run 'ctx shared create proj --group {gid} --storage {root}'" in booted.stdout
    assert mode(sessions / "ps") == OLD_MODE  # bootstrap changes nothing in a space

    created = ctx(root, "shared", "create", "proj", "--group", str(gid))

    assert created.returncode == 0, created.stderr
    for level in SESSION_LEVELS:
        assert mode(space / level) == 0o3770, level
        assert f"repaired  {space / level} (mode 2770 -> 3770)" in created.stdout
    assert mode(space / "queue") == 0o3770
    assert os.stat(sessions / "ps").st_uid == unprivileged_user.uid  # only the mode changed
    refused = run_as(member, ["mv", str(sessions / "ps"), str(sessions / "ps.x")])
    assert refused.returncode != 0 and (sessions / "ps").is_dir()
    assert "shared space proj" not in ctx(root, "bootstrap").stdout


def test_shared_create_follows_no_link_planted_in_the_space(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root = traversable_tmp / "storage"
    storage.bootstrap(root)
    space = old_space(root, unprivileged_user)
    outside = traversable_tmp / "outside"
    (outside / "session").mkdir(parents=True)
    os.chmod(outside, 0o755)
    os.chmod(outside / "session", 0o755)
    (space / "agent/bob").symlink_to(outside)
    (space / "agent/carol").mkdir()
    (space / "agent/carol/session").symlink_to(outside / "session")

    created = ctx(root, "shared", "create", "proj", "--group", str(unprivileged_user.gid))

    assert created.returncode == 0, created.stderr
    assert mode(outside) == 0o755 and mode(outside / "session") == 0o755
    assert "agent/bob" not in created.stdout
    assert mode(space / "agent/alice/session/ps") == 0o3770


def test_a_session_directory_keeps_the_bits_its_agent_took_away(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root = traversable_tmp / "storage"
    storage.bootstrap(root)
    space = old_space(root, unprivileged_user)
    (space / "agent/alice/session/ps").chmod(0o750)

    created = ctx(root, "shared", "create", "proj", "--group", str(unprivileged_user.gid))

    assert created.returncode == 0, created.stderr
    assert mode(space / "agent/alice/session/ps") == 0o3750
