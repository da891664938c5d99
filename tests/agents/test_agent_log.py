"""``agent/<name>.d/log``: the agent's lifecycle as facts, one event per line (SPEC S-3..S-5).

The terminal's start and end are checked with the terminal itself (test_terminal.py).
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

from cortexfs.shared.events import read_events
from tests.support.cli import ctx
from tests.tools.support import World

SECRET_PROMPT = "Always answer in riddles; the password is hunter2.\n"


def log_of(world: World, agent: str) -> list[dict[str, Any]]:
    path = world.root / "agent" / f"{agent}.d" / "log"
    data = path.read_bytes()
    assert data.endswith(b"\n") and all(line.startswith(b'{"ts":') for line in data.splitlines()), (
        data
    )
    scan = read_events(path)
    assert not scan.damaged and not scan.torn_tail
    return scan.events


def test_ctx_agent_create_records_the_creation(world: World, tmp_path: Path) -> None:
    request = tmp_path / "made.json"
    request.write_text(json.dumps({"name": "made", "label": "made_t", "tools": ["fs.read"]}))

    created = ctx(world.root, "agent", "create", str(request), "--user", world.user.name)

    assert created.returncode == 0, created.stderr
    [event] = log_of(world, "made")
    assert list(event)[:6] == ["ts", "type", "agent", "session", "object", "status"]
    assert event["type"] == "agent.created" and event["status"] == "ok"
    assert (event["agent"], event["object"]) == ("made", "agent/made")
    assert event["by"] == "ctx agent create" and event["label"] == "made_t"
    assert (event["uid"], event["gid"]) == (world.user.uid, world.user.gid)
    status = (world.root / "agent" / "made.d" / "log").stat()
    assert (status.st_uid, stat.S_IMODE(status.st_mode)) == (0, 0o640)


def test_agent_create_records_the_child_in_both_logs(world: World) -> None:
    world.agent("lead", tools=["agent.create"])
    world.allow_tool("agent.create", label="lead_t")
    with open(world.root / "agent" / "lead.d" / "policy", "a") as policy:
        policy.write("allow lead_t agent:helper create\n")
    lead_before = log_of(world, "lead")

    result = world.run(
        "agent.create", {"name": "helper", "label": "helper_t"}, agent="lead", session="s1"
    )

    assert result.ok, result.output
    [child] = log_of(world, "helper")
    assert (child["type"], child["agent"], child["object"]) == (
        "agent.created",
        "helper",
        "agent/helper",
    )
    assert child["by"] == "agent.create" and child["parent"] == "lead"
    assert child["session"] == "s1" and child["uid"] == world.user.uid
    [parent] = log_of(world, "lead")[len(lead_before) :]
    assert (parent["type"], parent["agent"], parent["object"]) == (
        "agent.created",
        "lead",
        "agent/helper",
    )
    assert parent["child"] == "helper" and parent["label"] == "helper_t"


def test_a_refused_agent_create_records_nothing_in_the_parents_log(world: World) -> None:
    world.agent("lead", tools=["agent.create"])
    world.allow_tool("agent.create", label="lead_t")
    before = log_of(world, "lead")

    result = world.run("agent.create", {"name": "other", "label": "other_t"}, agent="lead")

    assert not result.ok
    assert log_of(world, "lead") == before


def test_agent_update_records_the_fact_not_the_content(world: World) -> None:
    world.agent("coder", tools=["agent.update"])
    world.allow_tool("agent.update")

    result = world.run("agent.update", {"control": "system.md", "content": SECRET_PROMPT})

    assert result.ok, result.error
    event = log_of(world, "coder")[-1]
    assert event["type"] == "agent.updated" and event["session"] == "default"
    assert event["control"] == "system.md"
    assert event["bytes"] == len(SECRET_PROMPT.encode())
    raw = (world.root / "agent" / "coder.d" / "log").read_text()
    assert "riddles" not in raw and "hunter2" not in raw
