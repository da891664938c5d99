"""``ctx agent create`` warns of a read-write mount through which the agent could change its
own controls: step 4 of the authority chain then refuses every call of the agent.

The usual way in: a user whose storage root is the default one under their home mounts the
home read-write as the agent's workspace.  The agent runs as that user, owns the root, and
sees it through the mount."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.support.cli import ctx
from tests.support.users import UnprivilegedUser, run_as
from tests.tools.support import World

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]
WARNING = "every call of the agent will be denied at step 4 of the authority chain"


def home_with_root(top: Path, user: UnprivilegedUser) -> tuple[Path, Path]:
    """``user``'s home under ``top`` and their own bootstrapped storage root inside it."""
    home = top / "home"
    home.mkdir()
    os.chown(home, user.uid, user.gid)
    root = home / "storage"
    made = run_as(user, [*CTX, "--storage", str(root), "bootstrap"], env=os.environ)
    assert made.returncode == 0, made.stderr
    return home, root


def create_as(
    user: UnprivilegedUser, root: Path, request: dict[str, object], *options: str
) -> tuple[int, str, str]:
    done = run_as(
        user,
        [*CTX, "--storage", str(root), "agent", "create", "-", *options],
        stdin=json.dumps(request),
    )
    return done.returncode, done.stdout, done.stderr


def run_tool_as(user: UnprivilegedUser, root: Path, agent: str) -> tuple[int, str]:
    done = run_as(
        user,
        [*CTX, "--storage", str(root), "run", "--agent", agent, "fs.stat", "/workspace"],
    )
    return done.returncode, done.stderr


def grant_fs_stat(root: Path, label: str) -> None:
    with open(root / "tool" / "fs.stat.d" / "policy", "a") as policy:
        policy.write(f"allow {label} tool:fs.stat execute\n")


def test_a_home_mounted_read_write_over_the_owners_root_is_warned_of_and_then_denied(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    home, root = home_with_root(traversable_tmp, unprivileged_user)
    request = {"name": "w", "label": "w_t", "tools": ["fs.stat"]}
    request["mount"] = [[str(home), "/workspace", "rw"]]

    status, _, stderr = create_as(unprivileged_user, root, request)
    json_status, stdout, _ = create_as(
        unprivileged_user, root, {**request, "name": "v", "label": "v_t"}, "--json"
    )
    grant_fs_stat(root, "w_t")
    call_status, call_stderr = run_tool_as(unprivileged_user, root, "w")

    assert status == 0, stderr
    assert (root / "agent" / "w").exists()
    [warning] = [line for line in stderr.splitlines() if line.startswith("ctx: warning:")]
    assert warning == (
        f"ctx: warning: {WARNING}: through its read-write mount {home} -> /workspace (rw) it "
        f"sees the storage root at /workspace/storage, which uid {unprivileged_user.uid} may "
        "change, so it could rewrite its own controls (agent/w.d); mount a directory that does "
        f"not hold the storage root {root} instead, or make this mount 'ro'"
    )
    assert json_status == 0
    [json_warning] = json.loads(stdout)["warnings"]
    assert json_warning.startswith(WARNING) and "(agent/v.d)" in json_warning
    # What the warning foretold.
    assert call_status == 126, call_stderr  # refused: the tool never ran
    assert "EACCES: step 4 (agent label)" in call_stderr, call_stderr


def test_the_same_home_mounted_read_only_is_not_warned_of_and_runs(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    home, root = home_with_root(traversable_tmp, unprivileged_user)
    request = {"name": "r", "label": "r_t", "tools": ["fs.stat"]}
    request["mount"] = [[str(home), "/workspace", "ro"]]

    status, _, stderr = create_as(unprivileged_user, root, request)
    grant_fs_stat(root, "r_t")
    call_status, call_stderr = run_tool_as(unprivileged_user, root, "r")

    assert status == 0 and "warning" not in stderr, stderr
    assert call_status == 0, call_stderr


@pytest.mark.parametrize("mode", ["rw", "ro"])
def test_a_mount_holding_a_root_the_agent_may_not_change_is_not_warned_of(
    world: World, mode: str
) -> None:
    """Root's storage root is root's: an agent of another uid that sees it through a
    read-write mount still cannot change its controls, and step 4 lets it pass."""
    above = world.root.parent
    request = {"name": "q", "label": "q_t", "mount": [[str(above), "/workspace", mode]]}

    created = ctx(
        world.root, "agent", "create", "-", "--user", world.user.name, stdin=json.dumps(request)
    )

    assert created.returncode == 0, created.stderr
    assert "warning" not in created.stderr, created.stderr
