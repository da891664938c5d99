"""A tool call is refused at each step of the authority chain, and says which (SPEC P-5, P-6)."""

from __future__ import annotations

import errno
import json
from collections.abc import Callable

import pytest

from cortexfs.shared.events import read_events
from tests.tools.support import World

ECHO = "#!/bin/sh\ncat\n"


def _identity_is_root(world: World) -> None:
    (world.root / "agent/coder.d/identity").write_text('{"uid": 0, "gid": 0, "groups": []}')


def _tier_not_searchable(world: World) -> None:
    (world.root / "tool").chmod(0o700)


def _no_mount_shows_the_tool(world: World) -> None:
    mounts = [[str(world.workspace), "/workspace", "rw"]]
    (world.root / "agent/coder.d/mount").write_text(json.dumps(mounts))


def _label_is_malformed(world: World) -> None:
    (world.root / "agent/coder.d/label").write_text("not a label\n")


def _agent_policy_lacks_the_rule(world: World) -> None:
    policy = world.root / "agent/coder.d/policy"
    policy.write_text(policy.read_text().replace("tool:echo execute", "tool:other execute"))


def _tool_policy_lacks_the_rule(world: World) -> None:
    (world.root / "tool/echo.d/policy").write_text("")


STEPS: list[tuple[int, str, Callable[[World], None]]] = [
    (1, "peer credentials", _identity_is_root),
    (2, "mode bits", _tier_not_searchable),
    (3, "mount visibility", _no_mount_shows_the_tool),
    (4, "agent label", _label_is_malformed),
    (5, "object policy", _agent_policy_lacks_the_rule),
    (6, "tool/model policy", _tool_policy_lacks_the_rule),
]


@pytest.fixture
def allowed(world: World) -> World:
    """Agent coder may run ``echo``: every step passes."""
    world.agent("coder", tools=["echo"])
    world.install("echo", ECHO)
    world.allow_tool("echo")
    return world


def test_every_step_passes_when_everything_allows(allowed: World) -> None:
    result = allowed.run("echo", {"hello": 1})

    assert result.ok, result.error
    assert result.output == {"hello": 1}


@pytest.mark.parametrize(("step", "title", "break_step"), STEPS, ids=[s[1] for s in STEPS])
def test_each_step_denies_with_eacces_and_names_itself(
    allowed: World, step: int, title: str, break_step: Callable[[World], None]
) -> None:
    break_step(allowed)

    result = allowed.run("echo", {"hello": 1})

    assert result.status == "error" and result.exit_status is None
    assert result.error.errno == errno.EACCES
    assert (result.error.stage, result.error.step, result.error.step_name) == (
        "authorize",
        step,
        title,
    )
    assert result.error.message.startswith(f"step {step} ({title})")
    recorded = read_events(allowed.root / result.session / "events.jsonl").events[-1]
    assert (recorded["type"], recorded["errno"], recorded["step"]) == (
        "tool_result",
        "EACCES",
        step,
    )
