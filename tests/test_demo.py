"""The main job (scripts/demo.py) run by an ordinary user, as the README's quickstart says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

DEMO = Path(__file__).resolve().parent.parent / "scripts" / "demo.py"


@pytest.mark.slow
def test_the_demo_passes_for_a_user_whose_storage_root_is_under_tmp(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """The demo agent runs as the user, who owns the storage root: were the agent's mount all
    of /tmp, it could rewrite its own controls there, and step 4 of the chain would refuse every
    job it runs."""
    scratch = traversable_tmp / "tmp"
    scratch.mkdir()
    os.chown(traversable_tmp, unprivileged_user.uid, unprivileged_user.gid)
    os.chown(scratch, unprivileged_user.uid, unprivileged_user.gid)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(traversable_tmp),
        "TMPDIR": str(scratch),
        "CTX_STORAGE": str(traversable_tmp / "storage"),
    }

    demo = subprocess.run(
        [sys.executable, str(DEMO)],
        user=unprivileged_user.uid,
        group=unprivileged_user.gid,
        extra_groups=[],
        env=env,
        cwd=traversable_tmp,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "every published job finished exactly once" in demo.stdout
