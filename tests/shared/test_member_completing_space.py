"""A member of a space's group who completes it never makes its ``tool/`` or ``agent/``: made
by the member, either would be the member's, who could then put code in ``tool/`` or rename
another agent's sessions out of the sticky ``agent/`` (SPEC X-1).  Run as other uids: needs
root."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.users import UnprivilegedUser, run_as
from tests.tools.support import World

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs ctx as other uids: needs root")

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]


def ctx(
    world: World, *arguments: str, user: UnprivilegedUser | None = None
) -> subprocess.CompletedProcess[str]:
    argv = [*CTX, "--storage", str(world.root), *arguments]
    if user is None:
        return subprocess.run(argv, capture_output=True, text=True)
    return run_as(user, argv)


def tree(top: Path) -> dict[str, tuple[int, int, int]]:
    """Every entry below ``top`` (and ``top``): mode, uid and gid, links not followed."""
    found = {}
    for entry in (top, *top.rglob("*")):
        status = os.lstat(entry)
        found[str(entry)] = (stat.S_IMODE(status.st_mode), status.st_uid, status.st_gid)
    return found


@pytest.fixture
def space(world: World) -> Path:
    """Space ``team`` made by root with the test user's group."""
    made = ctx(world, "shared", "create", "team", "--group", str(world.user.gid))
    assert made.returncode == 0, made.stderr
    return world.root / "shared" / "team"


@pytest.mark.parametrize("missing", ["agent", "tool"])
@pytest.mark.parametrize("options", [[], ["--group", "GID"]])
def test_a_member_is_refused_the_owners_missing_directory_and_nothing_is_made(
    world: World, space: Path, missing: str, options: list[str]
) -> None:
    shutil.rmtree(space / missing)
    shutil.rmtree(space / "data")  # a member may make it: it must not be made either
    before = tree(space)
    options = [str(world.user.gid) if option == "GID" else option for option in options]

    refused = ctx(world, "shared", "create", "team", *options, user=world.user)

    assert refused.returncode == 1, refused
    assert refused.stderr.startswith(
        f"ctx: EPERM: {space / missing} is missing, and only root may make it: made by uid "
        f"{world.user.uid} it would be theirs, who could then "
    ), refused.stderr
    assert "nothing was made (have root run 'ctx shared create team" in refused.stderr
    assert tree(space) == before

    completed = ctx(world, "shared", "create", "team")
    assert completed.returncode == 0, completed.stderr
    status = os.lstat(space / missing)
    assert status.st_uid == 0 and status.st_gid == world.user.gid


def test_the_agents_sessions_stay_out_of_a_members_reach_after_the_space_is_completed(
    world: World, space: Path
) -> None:
    """The member can no longer rename a session directory another agent recorded in (the
    sticky agent/ spares only its owner's hand), since it is not the member's agent/."""
    (space / "agent").rmdir()
    assert ctx(world, "shared", "create", "team", user=world.user).returncode == 1
    assert ctx(world, "shared", "create", "team").returncode == 0
    other = space / "agent" / "other"
    other.mkdir()
    os.chown(other, world.user.uid + 1000, world.user.gid)

    moved = run_as(world.user, ["/bin/mv", str(other), str(space / "agent" / "mine")])

    assert moved.returncode != 0 and other.is_dir(), moved


def test_the_spaces_owner_completes_it_and_another_member_is_told_who_may(
    world: World, space: Path
) -> None:
    os.chown(space, world.user.uid, world.user.gid)  # a space this uid owns
    (space / "agent").rmdir()
    member = UnprivilegedUser("member", world.user.uid + 1000, world.user.gid)

    refused = ctx(world, "shared", "create", "team", user=member)
    by_owner = ctx(world, "shared", "create", "team", user=world.user)

    assert refused.returncode == 1, refused
    assert refused.stderr.startswith(
        f"ctx: EPERM: {space / 'agent'} is missing, and only the space's owner "
        f"(uid {world.user.uid}) or root may make it"
    ), refused.stderr
    assert by_owner.returncode == 0, by_owner.stderr
    assert f"created   {space / 'agent'}" in by_owner.stdout
    status = os.lstat(space / "agent")
    assert (stat.S_IMODE(status.st_mode), status.st_uid) == (0o3770, world.user.uid)


@pytest.mark.parametrize("options", [[], ["--group", "GID"]])
def test_a_member_over_a_complete_space_has_nothing_to_do(
    world: World, space: Path, options: list[str]
) -> None:
    options = [str(world.user.gid) if option == "GID" else option for option in options]

    done = ctx(world, "shared", "create", "team", *options, user=world.user)

    assert (done.returncode, done.stdout) == (0, f"nothing to do: {space} is complete\n"), done
