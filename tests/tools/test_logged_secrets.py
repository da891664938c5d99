"""S-4 end to end: a real ``ctx run`` of shell.exec, as an agent, with secrets where the
redaction rule used to miss them — a token as a JSON key, a password whose value is a list —
leaves none of them in the session's events or in the tool's log, while the caller gets the
output as it was."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import ctx
from tests.tools.support import World

TOKEN = "ghp_" + "b" * 35 + "D"
COMMAND = 'echo \'{"token": ["hunter2-C"]}\'; true # {"password": ["hunter2-B"]}'
PRINTED = {"repos": {TOKEN: 1, "db": {"password": ["hunter2-A"], "host": "db.example"}}}


@pytest.fixture
def agent(world: World) -> World:
    world.agent("coder", tools=["shell.exec"])
    world.allow_tool("shell.exec")
    return world


def test_a_secret_in_a_key_or_a_list_reaches_no_log(agent: World) -> None:
    printed = json.dumps(PRINTED)
    native = ctx(
        agent.root,
        *("run", "--agent", "coder", "--session", "red", "--native", "shell.exec"),
        stdin=json.dumps({"cmd": f"printf '%s' '{printed}'"}),
    )
    terminal = ctx(
        agent.root,
        *("run", "--agent", "coder", "--session", "red", "shell.exec"),
        COMMAND,
    )

    assert native.returncode == 0, native.stderr
    assert terminal.returncode == 0, terminal.stderr
    assert json.loads(native.stdout.splitlines()[-1])["output"] == PRINTED, "the caller's"
    assert "hunter2-C" in terminal.stdout, "the caller's"
    events_path = agent.root / f"home/{agent.user.uid}/agent/coder/session/red/events.jsonl"
    log_path = agent.root / "tool/shell.exec.d/log"
    for path in (events_path, log_path):
        text = path.read_text()
        for secret in (TOKEN, "hunter2-A", "hunter2-B", "hunter2-C"):
            assert secret not in text, (path, secret)
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    results = [event for event in events if event["type"] == "tool_result"]
    assert results[0]["output"] == {
        "repos": {"[redacted]": 1, "db": {"password": "[redacted]", "host": "db.example"}}
    }
    assert "output" not in results[1], "a terminal call's output goes to its terminal only"
    calls = [event for event in events if event["type"] == "tool_call"]
    redacted = '{"repos": {"[redacted]": 1, "db": {"password": [redacted], "host": "db.example"}}}'
    assert calls[0]["input"] == {"cmd": f"printf '%s' '{redacted}'"}
    assert calls[1]["argv"] == ['echo \'{"token": [redacted]}\'; true # {"password": [redacted]}']
    logged = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [entry["status"] for entry in logged] == ["ok", "ok"]
