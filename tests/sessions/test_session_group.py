"""A session is given to its agent's group; a creator who is not root and does not hold that
group is told why the call cannot record, not a bare EPERM (S-1, A-3)."""

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

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a second uid needs root")


def as_user(user: UnprivilegedUser, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``ctx`` with the storage root ``home/root``, run by ``user`` from ``home``."""
    return run_as(
        user,
        [sys.executable, "-m", "cortexfs", "--storage", str(home / "root"), *args],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)},
        cwd=home,
    )


def test_an_agent_whose_gid_its_creator_does_not_hold_is_refused_saying_why(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    user = unprivileged_user
    home = traversable_tmp / "home"
    home.mkdir()
    os.chown(home, user.uid, user.gid)
    request = home / "bob.json"
    request.write_text(json.dumps({"name": "bob", "label": "bob_t", "tools": ["fs.stat"]}))
    assert as_user(user, home, "bootstrap").returncode == 0
    assert as_user(user, home, "agent", "create", str(request)).returncode == 0
    root = home / "root"
    with open(root / "tool" / "fs.stat.d" / "policy", "a") as policy:
        policy.write("allow bob_t tool:fs.stat execute\n")
    # An identity made before its creator's groups were checked (or edited by hand).
    (root / "agent" / "bob.d" / "identity").write_text(
        json.dumps({"uid": user.uid, "gid": 0, "groups": []})
    )

    refused = as_user(user, home, "run", "--agent", "bob", "fs.stat", "/")

    assert refused.returncode == 126, refused.stderr
    assert refused.stderr.startswith("ctx: EPERM: cannot give "), refused.stderr
    assert "to group 0" in refused.stderr and "run as root" in refused.stderr
