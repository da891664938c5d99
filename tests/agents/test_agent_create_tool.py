"""``agent.create`` over the run capability: a child agent, attenuated (SPEC A-4)."""

from __future__ import annotations

import errno
import json
from typing import Any

import pytest

from cortexfs.shared.spaces import create_shared_space
from tests.support.cli import ctx
from tests.tools.support import World


@pytest.fixture
def lead(world: World) -> World:
    """Agent ``lead`` may run fs.stat and agent.create, and create exactly ``helper``."""
    world.agent("lead", tools=["fs.stat", "agent.create"])
    for tool in ("fs.stat", "agent.create"):
        world.allow_tool(tool, label="lead_t")
    with open(world.root / "agent" / "lead.d" / "policy", "a") as policy:
        policy.write("allow lead_t agent:helper create\n")  # per child name (P-7)
    return world


def create(world: World, request: dict[str, Any]) -> Any:
    return world.run("agent.create", request, agent="lead")


def helper(world: World, **fields: Any) -> dict[str, Any]:
    return {"name": "helper", "label": "helper_t", **fields}


def test_a_child_gets_what_the_parent_holds_and_its_identity(lead: World) -> None:
    mount = [str(lead.workspace), "/workspace", "ro"]

    result = create(lead, helper(lead, tools=["fs.stat"], mount=[mount]))

    assert result.ok, result.error
    assert result.output["agent"] == "helper" and result.output["uid"] == lead.user.uid
    controls = lead.root / "agent" / "helper.d"
    assert "allow helper_t tool:fs.stat execute" in (controls / "policy").read_text()
    assert json.loads((controls / "identity").read_text())["uid"] == lead.user.uid


def test_without_agent_child_create_nothing_is_made(lead: World) -> None:
    result = create(lead, {"name": "other", "label": "other_t"})

    assert not result.ok and result.output["error"] == "EACCES"
    assert "agent:other create" in result.output["message"]
    assert not (lead.root / "agent" / "other").exists()


@pytest.mark.parametrize(
    ("fields", "missing"),
    [
        ({"tools": ["shell.exec"]}, "tool:shell.exec execute"),
        ({"model": ["openai/gpt-5.6"]}, "model:openai/gpt-5.6 use"),
        ({"shared": {"team": ["read"]}}, "shared:team read"),
        ({"mount": [["/etc", "/host-etc", "ro"]]}, "the mount at /host-etc (ro)"),
    ],
)
def test_a_child_never_gets_more_than_its_parent(
    lead: World, fields: dict[str, Any], missing: str
) -> None:
    result = create(lead, helper(lead, **fields))

    assert not result.ok and result.output["error"] == "EACCES", result.output
    assert missing in result.output["message"]
    assert not (lead.root / "agent" / "helper").exists()


def test_a_child_mount_is_writable_only_where_the_parents_is(lead: World) -> None:
    # lead's workspace is rw in its mount table, but its policy grants only mount:workspace read
    policy = lead.root / "agent" / "lead.d" / "policy"
    policy.write_text(policy.read_text().replace("allow lead_t mount:workspace write\n", ""))

    result = create(lead, helper(lead, mount=[[str(lead.workspace), "/workspace", "rw"]]))

    assert not result.ok and "(rw)" in result.output["message"]


def test_a_malformed_request_is_einval(lead: World) -> None:
    result = create(lead, {"name": "bad name", "label": "helper_t"})

    assert not result.ok and result.error is not None
    assert result.error.errno == errno.EINVAL


@pytest.mark.parametrize(
    "fields",
    [
        {"bogus": 1},  # the tool's own schema check finds this one
        {"name": "helper.d"},  # the host's validation finds the rest
        {"tools": ["fs.stat", "fs.stat"]},
        {"mount": [["/workspace/../etc", "/w", "ro"]]},
        {"mount": [["/tmp", "/etc", "ro"]]},
    ],
)
def test_bad_input_exits_2_whichever_side_finds_it(lead: World, fields: dict[str, Any]) -> None:
    request = json.dumps({**helper(lead), **fields})

    ran = ctx(lead.root, "run", "--agent", "lead", "agent.create", request)

    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.startswith("agent.create: EINVAL: "), ran.stderr
    assert not (lead.root / "agent" / "helper").exists()


def test_a_refusal_of_the_attenuation_exits_1(lead: World) -> None:
    request = json.dumps(helper(lead, tools=["shell.exec"]))

    ran = ctx(lead.root, "run", "--agent", "lead", "agent.create", request)

    assert ran.returncode == 1 and "EACCES" in ran.stderr, ran.stderr


@pytest.fixture
def borrowed(world: World) -> World:
    """``lead`` names fs.stat in its own policy, but fs.stat's policy grants only ``rev3_t``,
    the label of agent ``rev3``: lead cannot run fs.stat (step 6 of the chain)."""
    world.agent("lead", tools=["fs.stat", "agent.create"])
    world.allow_tool("agent.create", label="lead_t")
    world.agent("rev3", tools=["fs.stat"])
    world.allow_tool("fs.stat", label="rev3_t")
    with open(world.root / "agent" / "lead.d" / "policy", "a") as policy:
        policy.write("allow lead_t agent:kid2 create\n")
    return world


def test_a_child_cannot_take_another_agents_label(borrowed: World) -> None:
    assert not borrowed.run("fs.stat", {"path": "/workspace"}, agent="lead").ok

    result = create(borrowed, {"name": "kid2", "label": "rev3_t", "tools": ["fs.stat"]})

    assert not result.ok and result.output["error"] == "EACCES", result.output
    assert "label rev3_t is agent rev3's" in result.output["message"]
    assert not (borrowed.root / "agent" / "kid2").exists()
    assert borrowed.run("fs.stat", {"path": "/workspace"}, agent="kid2").error.errno == (
        errno.ENOENT
    )


def test_a_child_gets_no_tool_its_parent_is_denied_by_the_tools_own_policy(
    borrowed: World,
) -> None:
    result = create(borrowed, {"name": "kid2", "label": "kid2_t", "tools": ["fs.stat"]})

    assert not result.ok and result.output["error"] == "EACCES", result.output
    message = result.output["message"]
    assert "tool:fs.stat execute" in message and "step 6 (tool/model policy)" in message
    assert not (borrowed.root / "agent" / "kid2").exists()


def test_a_child_may_share_its_parents_label_and_run_what_the_parent_runs(lead: World) -> None:
    result = create(lead, helper(lead, label="lead_t", tools=["fs.stat"]))

    assert result.ok, result.output
    ran = lead.run("fs.stat", {"path": "/ctx/tool"}, agent="helper")
    assert ran.ok, ran.error
    denied = lead.run("agent.create", {"name": "x", "label": "x_t"}, agent="helper")
    assert denied.error.stage == "authorize" and denied.error.step == 5  # not in its policy


def test_a_child_gets_no_model_its_parent_may_not_use(lead: World) -> None:
    models = lead.root / "model" / "openai"
    models.mkdir(mode=0o755)
    (models / "gpt-5.6").write_text("")
    (models / "gpt-5.6").chmod(0o644)
    (models / "gpt-5.6.d").mkdir(mode=0o755)
    own_policy = models / "gpt-5.6.d" / "policy"
    own_policy.write_text("allow other_t model:openai/gpt-5.6 use\n")
    own_policy.chmod(0o644)
    with open(lead.root / "agent" / "lead.d" / "policy", "a") as policy:
        policy.write("allow lead_t model:openai/gpt-5.6 use\n")

    refused = create(lead, helper(lead, model=["openai/gpt-5.6"]))
    with open(own_policy, "a") as policy:
        policy.write("allow lead_t model:openai/gpt-5.6 use\n")
    granted = create(lead, helper(lead, model=["openai/gpt-5.6"]))

    assert not refused.ok and "model:openai/gpt-5.6 use (step 6" in refused.output["message"]
    assert granted.ok, granted.output
    assert (lead.root / "agent" / "helper.d" / "model").read_text() == "openai/gpt-5.6\n"


def test_a_child_may_not_mount_over_ctx(lead: World) -> None:
    result = create(lead, helper(lead, mount=[[str(lead.workspace), "/ctx", "ro"]]))

    assert not result.ok and result.error.errno == errno.EINVAL, result.output
    assert "/ctx is the storage root's place" in result.error.message
    assert not (lead.root / "agent" / "helper").exists()


def test_creating_an_existing_child_again_is_eexist_and_changes_nothing(lead: World) -> None:
    assert create(lead, helper(lead, tools=["fs.stat"])).ok
    policy = (lead.root / "agent" / "helper.d" / "policy").read_bytes()

    again = create(lead, helper(lead, tools=["fs.stat"]))

    assert not again.ok and again.output["error"] == "EEXIST", again.output
    assert (lead.root / "agent" / "helper.d" / "policy").read_bytes() == policy


def test_a_child_gets_no_tool_that_is_disabled(lead: World) -> None:
    (lead.root / "tool" / "fs.stat.d" / "status").write_text("disabled\n")

    result = create(lead, helper(lead, tools=["fs.stat"]))

    assert not result.ok and result.output["error"] == "EACCES", result.output
    assert "tool:fs.stat execute" in result.output["message"]
    assert "disabled" in result.output["message"]
    assert not (lead.root / "agent" / "helper").exists()


def test_a_tool_the_parent_cannot_execute_is_refused_by_the_mode_bits_step(lead: World) -> None:
    """T-4 finds a file with any execute bit; P-5's step 2 says the bits are not the parent's
    (not "no such tool", which would hide where the refusal comes from)."""
    (lead.root / "tool" / "fs.stat").chmod(0o750)  # root's, and lead runs as another uid

    result = create(lead, helper(lead, tools=["fs.stat"]))

    assert not result.ok and result.output["error"] == "EACCES", result.output
    assert "tool:fs.stat execute" in result.output["message"]
    assert "no such tool" not in result.output["message"]
    assert "step 2" in result.output["message"], result.output["message"]
    assert not (lead.root / "agent" / "helper").exists()


def test_a_space_the_parent_may_not_read_is_eacces_whatever_it_holds(lead: World) -> None:
    """S-6, A-4: the sessions an earlier agent left in a space are looked for only in the
    spaces the attenuation let through: for one the parent may not read, the answer is the
    EACCES of what it does not hold, the same whether the space holds the child's name or
    not — never an EEXIST naming a directory the parent's uid may not even search."""
    create_shared_space(lead.root, "team", gid=0)  # root's group: closed to lead
    request = helper(lead, shared={"team": ["read"]})

    before = create(lead, request)
    (lead.root / "shared" / "team" / "agent" / "helper" / "session").mkdir(parents=True)
    after = create(lead, request)

    for result in (before, after):
        assert not result.ok and result.output["error"] == "EACCES", result.output
        assert "does not hold shared:team read" in result.output["message"]
    assert after.output["message"] == before.output["message"]
    assert not (lead.root / "agent" / "helper").exists()


def test_sessions_an_earlier_agent_left_in_a_granted_space_refuse_the_child(
    lead: World,
) -> None:
    """A-4: in a space the parent may read, the child's name holding an earlier agent's
    sessions is EEXIST naming them: the child would read them as its own."""
    create_shared_space(lead.root, "team", gid=lead.user.gid)
    with open(lead.root / "agent" / "lead.d" / "policy", "a") as policy:
        policy.write("allow lead_t shared:team read\n")
    (lead.root / "shared" / "team" / "agent" / "helper" / "session" / "old").mkdir(parents=True)

    result = create(lead, helper(lead, shared={"team": ["read"]}))

    assert not result.ok and result.output["error"] == "EEXIST", result.output
    assert (
        "shared/team/agent/helper holds the sessions of an earlier agent"
        in (result.output["message"])
    )
    assert not (lead.root / "agent" / "helper").exists()
