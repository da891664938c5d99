"""``agent.create`` tells the parent what ``ctx agent create`` would have told a person (A-4).

Both compute their warnings with one function (:func:`cortexfs.agents.create.warnings_for`):
the tool returns them in its output's ``warnings`` (native mode) and prints them on stderr
(terminal mode).  Real roots, a real second uid, real ``ctx run`` processes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import ctx
from tests.support.users import UnprivilegedUser, run_as
from tests.tools.support import World

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]
LINKED = "the way there goes through the symbolic link"
IN_REACH = "every call of the agent will be denied at step 4 of the authority chain"


def result_of(native_stdout: str) -> dict[str, Any]:
    [result] = [
        frame
        for line in native_stdout.splitlines()
        if (frame := json.loads(line))["type"] == "result"
    ]
    return result


@pytest.fixture
def lead(world: World) -> World:
    """Agent ``lead`` (the test user, its workspace read-write) may run agent.create and
    create ``helper``."""
    world.agent("lead", tools=["agent.create"])
    world.allow_tool("agent.create", label="lead_t")
    with open(world.root / "agent" / "lead.d" / "policy", "a") as policy:
        policy.write("allow lead_t agent:helper create\n")
    return world


def linked_source(world: World) -> tuple[Path, Path]:
    """``work/proj``, a link of the test user's to ``work/real``: the way the parent's own
    tools see it, and what it leads to."""
    real = world.workspace / "real"
    real.mkdir()
    link = world.workspace / "proj"
    link.symlink_to(real)
    os.lchown(link, world.user.uid, world.user.gid)
    return link, real


def test_a_source_through_another_uids_link_is_warned_of_in_the_output(lead: World) -> None:
    link, real = linked_source(lead)
    request = {"name": "helper", "label": "helper_t", "mount": [["/workspace/proj", "/p", "ro"]]}

    done = ctx(lead.root, "run", "--agent", "lead", "--native", "agent.create",
               stdin=json.dumps(request))  # fmt: skip

    assert done.returncode == 0, done.stderr
    result = result_of(done.stdout)
    assert result["status"] == "ok", result
    [warning] = result["output"]["warnings"]
    assert warning.startswith(
        f"the source {link} of the mount at /p is recorded as {real}: {LINKED} {link}, which "
        f"uid {lead.user.uid} owns and may point anywhere"
    ), warning
    assert json.loads((lead.root / "agent" / "helper.d" / "mount").read_text())[0] == [
        str(real), "/p", "ro"
    ]  # fmt: skip


def test_terminal_mode_prints_each_warning_on_stderr(lead: World) -> None:
    link, real = linked_source(lead)
    request = {"name": "helper", "label": "helper_t", "mount": [[str(link), "/p", "ro"]]}
    recorded = f"agent.create: warning: the source {link} of the mount at /p is recorded as {real}"

    done = ctx(lead.root, "run", "--agent", "lead", "agent.create", json.dumps(request))

    assert done.returncode == 0, done.stderr
    assert done.stdout == "created agent helper\n"
    assert recorded in done.stderr, done.stderr


def test_a_child_without_anything_to_warn_of_has_an_empty_list(lead: World) -> None:
    request = {"name": "helper", "label": "helper_t", "mount": [["/workspace", "/w", "ro"]]}

    done = ctx(lead.root, "run", "--agent", "lead", "--native", "agent.create",
               stdin=json.dumps(request))  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert result_of(done.stdout)["output"]["warnings"] == []


def test_a_read_write_mount_showing_the_childs_own_controls_is_warned_of(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """On a storage root of the user's own, the child's controls are the user's, so a
    read-write mount that shows them lets the child rewrite its grants: step 4 then denies
    its every call, as ``ctx agent create`` would have warned."""
    os.chown(traversable_tmp, unprivileged_user.uid, unprivileged_user.gid)
    root = traversable_tmp / "storage"
    workspace = traversable_tmp / "work"

    def as_user(*args: str, stdin: str = "") -> Any:
        argv = [*CTX, "--storage", str(root), *args]
        return run_as(unprivileged_user, argv, env=os.environ, stdin=stdin)

    assert as_user("bootstrap").returncode == 0
    workspace.mkdir()
    os.chown(workspace, unprivileged_user.uid, unprivileged_user.gid)
    controls = root / "agent" / "helper.d"
    parent = {
        "name": "lead",
        "label": "lead_t",
        "tools": ["agent.create", "fs.stat"],
        "mount": [[str(workspace), "/workspace", "ro"], [str(controls), "/helper", "rw"]],
    }
    assert as_user("agent", "create", "-", stdin=json.dumps(parent)).returncode == 0
    with open(root / "agent" / "lead.d" / "policy", "a") as policy:
        policy.write("allow lead_t agent:helper create\n")
    grants = [("agent.create", "lead_t"), ("fs.stat", "lead_t"), ("fs.stat", "helper_t")]
    for tool, label in grants:
        with open(root / "tool" / f"{tool}.d" / "policy", "a") as policy:
            policy.write(f"allow {label} tool:{tool} execute\n")
    request = {
        "name": "helper",
        "label": "helper_t",
        "tools": ["fs.stat"],
        "mount": [["/workspace", "/workspace", "ro"], ["/helper", "/helper", "rw"]],
    }

    done = as_user("run", "--agent", "lead", "--native", "agent.create", stdin=json.dumps(request))
    child_call = as_user("run", "--agent", "helper", "fs.stat", "/workspace")

    assert done.returncode == 0, done.stderr
    warnings = result_of(done.stdout)["output"]["warnings"]
    [in_reach] = [warning for warning in warnings if warning.startswith(IN_REACH)]
    assert f"it sees the root's agent/helper.d at /helper, which uid {unprivileged_user.uid}" in (
        in_reach
    )
    assert child_call.returncode == 126, child_call.stderr  # what the warning foretold
    assert "step 4" in child_call.stderr
