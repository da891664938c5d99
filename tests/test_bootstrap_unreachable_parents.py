"""``ctx bootstrap`` of a storage root its caller cannot look at (SPEC R-1, R-5): below a
directory the caller may not search, or a root of its own whose mode leaves it out of reading
it.  What the caller cannot look at is not missing: bootstrap names the directory that
refuses, and what to do, rather than offer to create one that exists; and nothing is made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user


def tree(top: Path) -> list[tuple[str, int]]:
    """Every path below ``top`` with its mode: what a refusal must leave as it was."""
    return sorted(
        (str(Path(d, n)), os.lstat(Path(d, n)).st_mode)
        for d, ds, fs in os.walk(top)
        for n in (*ds, *fs)
    )


def bootstrap_as(
    user: UnprivilegedUser, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``ctx bootstrap ARGS`` as ``user``, with no storage setting but ``env``'s."""
    return run_as(
        user,
        [sys.executable, "-m", "cortexfs", "bootstrap", *args],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent"} | (env or {}),
        cwd=Path("/"),
        stdin="",
    )


@pytest.fixture
def own_below_locked(traversable_tmp: Path, unprivileged_user: UnprivilegedUser) -> Path:
    """``locked/own``: ``own`` the user's, ``locked`` root's and 0700, so the user may not
    reach ``own`` although it is theirs."""
    locked = traversable_tmp / "locked"
    locked.mkdir()
    locked.chmod(0o700)
    own = locked / "own"
    own.mkdir()
    os.chown(own, unprivileged_user.uid, unprivileged_user.gid)
    return own


@pytest.mark.parametrize("named_by", ["--storage", "XDG_DATA_HOME"])
@pytest.mark.parametrize("there", [True, False], ids=["root there", "root not made yet"])
def test_a_root_below_a_directory_the_user_may_not_search_names_that_directory(
    own_below_locked: Path, unprivileged_user: UnprivilegedUser, named_by: str, there: bool
) -> None:
    locked = own_below_locked.parent
    if named_by == "--storage":
        root = own_below_locked / "storage"
        args, env = ["--storage", str(root)], {}
    else:
        root = own_below_locked / "xdg" / "cortexfs" / "storage" / "current"
        args, env = [], {"XDG_DATA_HOME": str(own_below_locked / "xdg")}
    if there:
        root.mkdir(parents=True)
        for directory in (root, *root.parents):
            if directory == own_below_locked:
                break
            os.chown(directory, unprivileged_user.uid, unprivileged_user.gid)
    before = tree(locked)

    done = bootstrap_as(unprivileged_user, *args, env=env)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"ctx: EACCES: cannot open the storage root {root}: "), (
        done.stderr
    )
    assert f"may not enter {locked} (owner uid 0, group 0, mode 0700)" in done.stderr
    assert "have that owner grant you search (x) on it" in done.stderr, done.stderr
    assert "cannot create" not in done.stderr, done.stderr
    if named_by == "XDG_DATA_HOME":  # the default root is behind the same directory
        assert f"yours is {root}" not in done.stderr, done.stderr
        assert "use another storage root" in done.stderr, done.stderr
    assert tree(locked) == before


def test_a_root_its_owner_may_not_read_says_chmod_u_r(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    mine = traversable_tmp / "mine"
    mine.mkdir()
    os.chown(mine, unprivileged_user.uid, unprivileged_user.gid)
    root = mine / "storage"
    made = bootstrap_as(unprivileged_user, "--storage", str(root))
    assert made.returncode == 0, made.stderr
    root.chmod(0o300)
    before = tree(mine)

    done = bootstrap_as(unprivileged_user, "--storage", str(root), "--json")

    assert done.returncode == 1, done.stdout + done.stderr
    error = json.loads(done.stdout)
    assert error["error"] == "EACCES", error
    assert error["message"] == (
        f"cannot open the storage root {root}: uid {unprivileged_user.uid} may not read {root} "
        f"(owner uid {unprivileged_user.uid}, group {unprivileged_user.gid}, mode 0300); you "
        "own it, but its mode leaves you out: 'chmod u+r' it, or use a storage root of your "
        "own (--storage DIR or CTX_STORAGE; without them yours is "
        "/nonexistent/.local/share/cortexfs/storage/current)"
    )
    assert done.stderr == f"ctx: EACCES: {error['message']}\n"
    assert tree(mine) == before
