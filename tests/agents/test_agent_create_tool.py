"""``agent.create`` over the run capability: a child agent, attenuated (SPEC A-4)."""

from __future__ import annotations

import errno
import json
from typing import Any

import pytest

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
        ({"mount": [["/etc", "/etc", "ro"]]}, "mount /etc (ro)"),
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
