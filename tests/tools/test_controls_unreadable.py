"""A tool control the reading process may not read (SPEC T-8a, H-3, T-1): that refusal is
the reader's own, not damage of the tool.  Root reads the control, its calls run the tool and
bootstrap finds nothing to mend; another uid's listing says it cannot tell what a call meets,
and its ``ctx tool`` is refused EACCES naming the control and who may read it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs.tools.controls import ToolObject, layout_problems
from cortexfs.tools.install import list_tools, parse_tier
from tests.support.users import UnprivilegedUser
from tests.tools.support import World, effective_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")

CTX = str(Path(sys.executable).with_name("ctx"))


def _listed(world: World, tool: str) -> dict[str, object]:
    (listing,) = [
        entry.to_json()
        for entry in list_tools([parse_tier(world.root, "system")], [])
        if entry.name == tool
    ]
    return listing


@pytest.mark.parametrize(
    ("private", "control", "what"),
    [
        ("fs.read.d/schema", "schema", "read"),  # a control of mode 0600
        ("fs.read.d", "name", "enter"),  # the control directory, 0700: the first one looked at
    ],
)
def test_a_listing_by_a_uid_that_may_not_read_a_control_is_unknown_not_damaged(
    world: World, unprivileged_user: UnprivilegedUser, private: str, control: str, what: str
) -> None:
    tier = world.root / "tool"
    (tier / private).chmod(0o700 if what == "enter" else 0o600)
    as_root = _listed(world, "fs.read")
    assert (as_root["status"], as_root["problems"]) == ("available", []), as_root

    with effective_user(unprivileged_user):
        listed = _listed(world, "fs.read")

    assert (listed["status"], listed["problems"]) == ("unknown", []), listed
    assert str(listed["reason"]).startswith(
        f"cannot read the {control} control of tool fs.read: uid {unprivileged_user.uid} may "
        f"not {what} {tier / private} (owner uid 0, group 0, mode "
    ), listed


def test_layout_problems_still_count_a_control_that_cannot_be_read(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """Bootstrap's question, whether the tool can be judged complete: not when a control
    cannot be read (the storage root's owner then puts a core tool back)."""
    (world.root / "tool" / "fs.read.d" / "schema").chmod(0o600)
    with effective_user(unprivileged_user):
        problems = layout_problems(ToolObject("fs.read", world.root / "tool"))
    assert len(problems) == 1 and "may not read" in problems[0], problems


def test_ctx_tool_by_a_uid_that_may_not_read_the_status_is_eacces_not_damage(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    status = world.root / "tool" / "tsh.config.d" / "status"
    status.chmod(0o600)
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/",
        "LANG": "C.UTF-8",
        "CTX_STORAGE": str(world.root),
        "CTX_PATH": str(world.root / "tool"),
    }

    def ctx_tool(**user: int) -> subprocess.CompletedProcess[str]:
        argv = [CTX, "tool", "tsh.config"]
        return subprocess.run(argv, env=env, capture_output=True, text=True, **user)

    as_root = ctx_tool()
    assert as_root.returncode == 0 and "cache_capacity=" in as_root.stdout, as_root
    done = ctx_tool(user=unprivileged_user.uid, group=unprivileged_user.gid, extra_groups=[])
    assert (done.returncode, done.stdout) == (1, ""), done
    assert done.stderr.startswith(
        f"ctx: EACCES: cannot read the status control of tool tsh.config: uid "
        f"{unprivileged_user.uid} may not read {status} (owner uid 0, group 0, mode 0600); "
        "run it as root or as that owner"
    ), done.stderr
    assert "damaged" not in done.stderr and "bootstrap" not in done.stderr, done.stderr
