"""The main job (scripts/demo.py) run by an ordinary user, as the README's quickstart says."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

DEMO = Path(__file__).resolve().parent.parent / "scripts" / "demo.py"


def run_demo(home: Path, uid: int, gid: int) -> subprocess.CompletedProcess[str]:
    """The demo as ``uid``:``gid``, its home, storage root and TMPDIR all below ``home``."""
    scratch = home / "tmp"
    scratch.mkdir()
    os.chown(home, uid, gid)
    os.chown(scratch, uid, gid)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "TMPDIR": str(scratch),
        "CTX_STORAGE": str(home / "storage"),
    }
    return subprocess.run(
        [sys.executable, str(DEMO)],
        user=uid,
        group=gid,
        extra_groups=[],
        env=env,
        cwd=home,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def uid_without_user_entry() -> int:
    """A uid the user database does not know, as a container runtime or setpriv may give."""
    for uid in range(64999, 60000, -1):
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
    pytest.skip("every uid from 60001 to 64999 has a user database entry")


@pytest.mark.slow
def test_the_demo_passes_for_a_user_whose_storage_root_is_under_tmp(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """The demo agent runs as the user, who owns the storage root: were the agent's mount all
    of /tmp, it could rewrite its own controls there, and step 4 of the chain would refuse every
    job it runs."""
    demo = run_demo(traversable_tmp, unprivileged_user.uid, unprivileged_user.gid)

    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "every published job finished exactly once" in demo.stdout


@pytest.mark.slow
def test_the_demo_passes_for_a_uid_the_user_database_does_not_know(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """Its agent runs as the uid itself, which needs no name: the demo leaves the choice to
    ctx agent create, where it once looked the uid's name up and died with a KeyError."""
    demo = run_demo(traversable_tmp, uid_without_user_entry(), unprivileged_user.gid)

    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "every published job finished exactly once" in demo.stdout
