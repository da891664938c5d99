"""``ctx agent show --json``: the mounts an agent's tools get, /ctx as its view (T-5, F-1)."""

from __future__ import annotations

import json
import os

import pytest

from cortexfs.agents.view import AgentView
from cortexfs.shared.spaces import create_shared_space
from tests.support.cli import ctx
from tests.tools.support import World


@pytest.fixture
def coder(world: World) -> World:
    """Agent coder reads and writes space ``open``; space ``secret`` is not its to see."""
    world.agent("coder", tools=["fs.read"], shared={"open": ["read", "write"]})
    world.allow_tool("fs.read")
    for space in ("open", "secret"):
        create_shared_space(world.root, space, gid=world.user.gid)
    home = world.root / "home" / str(world.user.uid)
    home.mkdir(mode=0o700)
    os.chown(home, world.user.uid, world.user.gid)
    return world


def test_show_keeps_the_mounts_and_adds_what_the_tools_get(coder: World) -> None:
    root = os.path.realpath(coder.root)

    shown = ctx(coder.root, "agent", "show", "coder", "--json")

    assert shown.returncode == 0, shown.stderr
    facts = json.loads(shown.stdout)
    assert facts["mounts"] == [[str(coder.workspace), "/workspace", "rw"], [root, "/ctx", "ro"]]
    view = AgentView.load(coder.root, "coder")
    assert facts["tool_mounts"] == [mount.to_json() for mount in view.tool_mounts()]
    assert [root, "/ctx", "ro", ["agent", "bin", "home", "model", "shared", "tool"]] in (
        facts["tool_mounts"]
    )
    assert "secret" not in shown.stdout


def test_show_names_the_mounts_of_the_control_that_are_never_used(coder: World) -> None:
    """A hand-edited control's mount on a system directory is withheld from tools and the
    sandbox; show says which, and why, instead of leaving it to vanish."""
    control = coder.root / "agent" / "coder.d" / "mount"
    table = json.loads(control.read_text())
    control.write_text(json.dumps([*table, [str(coder.workspace), "/etc", "ro"]]))

    shown = ctx(coder.root, "agent", "show", "coder", "--json")
    text = ctx(coder.root, "agent", "show", "coder")

    assert shown.returncode == 0 and text.returncode == 0, (shown.stderr, text.stderr)
    facts = json.loads(shown.stdout)
    (withheld,) = facts["withheld_mounts"]
    assert withheld["mount"] == [str(coder.workspace), "/etc", "ro"]
    assert "/etc belongs to the system" in withheld["reason"]
    assert [str(coder.workspace), "/etc", "ro"] not in facts["mounts"]
    assert f"withheld mount: {coder.workspace} at /etc: " in text.stdout


def test_a_hand_edited_mount_of_the_whole_root_elsewhere_than_ctx_is_withheld(
    coder: World,
) -> None:
    """The storage root mounted raw at another target would show every space and every
    agent's controls past the view (and a terminal's sandbox binds a mount as it is): the
    reader of the control withholds it, with the reason agent create gives for one asked."""
    root = os.path.realpath(coder.root)
    control = coder.root / "agent" / "coder.d" / "mount"
    table = json.loads(control.read_text())
    control.write_text(json.dumps([*table, [root, "/raw", "rw"]]))

    shown = ctx(coder.root, "agent", "show", "coder", "--json")

    assert shown.returncode == 0, shown.stderr
    facts = json.loads(shown.stdout)
    (withheld,) = facts["withheld_mounts"]
    assert withheld["mount"] == [root, "/raw", "rw"]
    assert withheld["reason"].startswith(f"mount source {root}: it is the storage root, which")
    assert [root, "/raw", "rw"] not in facts["mounts"]
    view = AgentView.load(coder.root, "coder")
    assert "/raw" not in [str(mount.target) for mount in view.visible_mounts()]


def test_show_keeps_the_label_and_names_an_invalid_policy(coder: World) -> None:
    """An invalid policy grants nothing; show says so instead of showing no label at all."""
    with open(coder.root / "agent" / "coder.d" / "policy", "a") as policy:
        policy.write("allow coder_t agent:* create\n")

    shown = ctx(coder.root, "agent", "show", "coder", "--json")
    text = ctx(coder.root, "agent", "show", "coder")

    assert shown.returncode == 0 and text.returncode == 0, shown.stderr
    facts = json.loads(shown.stdout)
    assert facts["label"] == "coder_t"
    (problem,) = facts["problems"]
    assert problem.startswith("agent/coder.d/policy:") and "globs are not supported" in problem
    assert "label: coder_t" in text.stdout
    assert f"problem: {problem}" in text.stdout


def test_every_unusable_control_is_a_problem_at_once(coder: World) -> None:
    """A label that names no subject type does not hide a policy the agent could rewrite:
    step 4 judges the controls themselves without the label."""
    controls = coder.root / "agent" / "coder.d"
    (controls / "label").write_text("coder t\n")
    (controls / "policy").chmod(0o666)

    problems = AgentView.load(coder.root, "coder").control_problems()

    label, policy = problems
    assert label.startswith("agent/coder.d/label is invalid"), problems
    assert policy.startswith("agent/coder.d/policy is not host-owned"), problems


def test_show_of_a_sound_agent_lists_no_problem(coder: World) -> None:
    shown = ctx(coder.root, "agent", "show", "coder", "--json")

    assert json.loads(shown.stdout)["problems"] == []
    assert "problem:" not in ctx(coder.root, "agent", "show", "coder").stdout


def test_agent_list_names_every_agent_and_what_is_wrong_with_one(coder: World) -> None:
    coder.agent("broken")
    (coder.root / "agent" / "broken.d" / "identity").unlink()
    (coder.root / "agent" / "stray.d").mkdir()  # controls without an agent: not an agent
    (coder.root / "agent" / ".hidden").write_text("")

    listed = ctx(coder.root, "agent", "list", "--json")
    text = ctx(coder.root, "agent", "list")

    assert listed.returncode == 0 and text.returncode == 0, listed.stderr + text.stderr
    agents = json.loads(listed.stdout)
    assert [facts["name"] for facts in agents] == ["broken", "coder"]
    broken, sound = agents
    assert broken["identity"] is None and "no identity" in broken["problems"][0]
    assert broken["label"] == "broken_t"  # its label control is whole
    assert sound == {
        "name": "coder",
        "label": "coder_t",
        "identity": {"uid": coder.user.uid, "gid": coder.user.gid, "groups": []},
        "problems": [],
    }
    lines = text.stdout.splitlines()
    assert lines[1] == f"coder  coder_t  uid {coder.user.uid}, gid {coder.user.gid}"
    assert lines[0].startswith("broken  broken_t  uid ?, gid ?  (1 problem(s): ")


def test_show_names_two_mounts_of_one_name_as_withheld(coder: World) -> None:
    """Two mounts whose targets end in the same name are neither used (a rule mount:NAME could
    not say which it grants); show lists both as withheld, saying so, instead of dropping them
    without a word."""
    control = coder.root / "agent" / "coder.d" / "mount"
    table = json.loads(control.read_text())
    other = coder.workspace.parent / "other"
    other.mkdir()
    control.write_text(json.dumps([*table, [str(other), "/srv/workspace", "ro"]]))

    facts = json.loads(ctx(coder.root, "agent", "show", "coder", "--json").stdout)

    withheld = {tuple(entry["mount"]): entry["reason"] for entry in facts["withheld_mounts"]}
    assert set(withheld) == {
        (str(coder.workspace), "/workspace", "rw"),
        (str(other), "/srv/workspace", "ro"),
    }
    assert all(reason.startswith("2 mounts are named 'workspace'") for reason in withheld.values())
    assert [m for m in facts["mounts"] if m[1] in ("/workspace", "/srv/workspace")] == []
