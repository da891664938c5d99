"""Hooks: pre.d runs in name order and may veto; post.d sees the result (SPEC T-6)."""

from __future__ import annotations

import errno
import json
import os

import pytest

from tests.tools.support import World

TRACE = """#!/bin/sh
# Appends its name, its uid and its phase to a trace; exits with its configured status.
echo "$(basename "$0") $(id -u) $CTX_HOOK" >> {trace}
cat > {trace}.$(basename "$0").json
echo "hook $(basename "$0") says no" >&2
exit {status}
"""


@pytest.fixture
def hooked(world: World) -> World:
    world.install("echo", "#!/bin/sh\ncat\n")
    world.agent("coder", tools=["echo"])
    world.allow_tool("echo")
    trace = world.workspace / "trace"
    trace.touch()
    os.chown(trace, world.user.uid, world.user.gid)
    return world


def add_hook(world: World, phase: str, name: str, status: int = 0, mode: int = 0o755) -> None:
    path = world.root / "tool/echo.d/hooks" / f"{phase}.d" / name
    path.write_text(TRACE.format(trace=world.workspace / "trace", status=status))
    path.chmod(mode)


def trace(world: World) -> list[str]:
    return (world.workspace / "trace").read_text().splitlines()


def test_pre_hooks_run_in_name_order_as_the_agent_then_the_tool(hooked: World) -> None:
    for name in ("20-second", "10-first", ".hidden-ignored"):
        add_hook(hooked, "pre", name)

    result = hooked.run("echo", {"x": 1})

    assert result.ok and result.output == {"x": 1}
    uid = hooked.user.uid
    assert trace(hooked) == [f"10-first {uid} pre", f"20-second {uid} pre"]
    seen = json.loads((hooked.workspace / "trace.10-first.json").read_text())
    assert (seen["hook"], seen["tool"], seen["input"]) == ("pre", "echo", {"x": 1})


def test_a_failing_pre_hook_vetoes_the_call_and_stops_the_others(hooked: World) -> None:
    add_hook(hooked, "pre", "10-guard", status=3)
    add_hook(hooked, "pre", "20-never")
    add_hook(hooked, "post", "10-never-either")

    result = hooked.run("echo", {"x": 1})

    assert result.status == "error" and result.exit_status is None
    assert (result.error.errno, result.error.stage) == (errno.EACCES, "hook")
    assert "hooks/pre.d/10-guard vetoed the call (exit 3): hook 10-guard says no" in str(
        result.error
    )
    assert trace(hooked) == [f"10-guard {hooked.user.uid} pre"]
    assert hooked.events()[-1]["stage"] == "hook"


def test_a_pre_hook_that_cannot_run_vetoes(hooked: World) -> None:
    add_hook(hooked, "pre", "10-not-executable", mode=0o644)

    result = hooked.run("echo", {})

    assert result.error.stage == "hook" and "is not executable" in result.error.message


def test_post_hooks_see_the_result_and_cannot_change_it(hooked: World) -> None:
    add_hook(hooked, "post", "10-audit")
    add_hook(hooked, "post", "20-grumpy", status=1)

    result = hooked.run("echo", {"y": 2})

    assert result.ok and result.output == {"y": 2}
    seen = json.loads((hooked.workspace / "trace.10-audit.json").read_text())
    assert seen["hook"] == "post" and seen["result"]["output"] == {"y": 2}
    assert result.post_hooks == [
        {"hook": "hooks/post.d/20-grumpy", "exit_status": 1, "message": "hook 20-grumpy says no"}
    ]
    assert hooked.events()[-1]["post_hooks"][0]["hook"] == "hooks/post.d/20-grumpy"
