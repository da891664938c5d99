"""A tool call is refused at each step of the authority chain, and says which (SPEC P-5, P-6)."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable

import pytest

from cortexfs.shared.events import read_events
from tests.support.cli import ctx
from tests.tools.support import World

ECHO = "#!/bin/sh\ncat\n"


def _identity_is_root(world: World) -> None:
    (world.root / "agent/coder.d/identity").write_text('{"uid": 0, "gid": 0, "groups": []}')


def _tier_not_searchable(world: World) -> None:
    (world.root / "tool").chmod(0o700)


def _tool_not_executable_by_the_agent(world: World) -> None:
    # Execute bits, but not the agent's: still the CTX_PATH hit (T-4), refused at step 2.
    (world.root / "tool/echo").chmod(0o750)


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
    (2, "mode bits", _tool_not_executable_by_the_agent),
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


@pytest.mark.parametrize(
    ("step", "title", "break_step"), STEPS, ids=[s[2].__name__.strip("_") for s in STEPS]
)
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


def test_a_tool_whose_execute_bits_are_not_the_agents_is_refused_at_step_2_everywhere(
    world: World,
) -> None:
    """``ctx run``, ``ctx policy explain`` and ``ctx object which`` agree on a root-only tool
    (T-4, P-5 step 2): it is found, and the chain refuses it with EACCES."""
    world.agent("coder", tools=["fs.read"])
    world.allow_tool("fs.read")
    (world.workspace / "a.txt").write_text("data\n")
    tool = world.root / "tool/fs.read"
    tool.chmod(0o750)  # root:root; the agent's uid is neither

    run = ctx(world.root, "run", "--agent", "coder", "fs.read", "a.txt")
    native = ctx(
        world.root, "run", "--agent", "coder", "--native", "fs.read", stdin='{"path": "a.txt"}'
    )
    explain = ctx(world.root, "policy", "explain", "coder", "tool:fs.read", "execute", "--json")
    which = ctx(world.root, "object", "which", "fs.read", env={"CTX_PATH": str(tool.parent)})

    assert run.returncode == 126, run.stderr
    assert run.stderr.startswith("ctx: EACCES: step 2 (mode bits): tool/fs.read needs --x")
    result = json.loads(native.stdout.splitlines()[-1])
    assert native.returncode == 1
    assert (result["error"]["error"], result["error"]["stage"], result["error"]["step"]) == (
        "EACCES",
        "authorize",
        2,
    )
    decision = json.loads(explain.stdout)
    assert (explain.returncode, decision["step"], decision["errno"]) == (1, 2, "EACCES")
    assert (which.returncode, which.stdout) == (0, f"{tool}\n")
    recorded = world.events()[-1]
    assert (recorded["type"], recorded["errno"], recorded["step"]) == ("tool_result", "EACCES", 2)


@pytest.mark.parametrize("control", ["policy", "label"])
@pytest.mark.parametrize("loosen", ["chmod 0666", "chown to the agent"])
def test_controls_the_agent_could_rewrite_are_refused_at_step_4(
    allowed: World, control: str, loosen: str
) -> None:
    """ "The agent cannot rewrite its own controls" holds: ctx run and ctx policy explain refuse
    a label or policy the agent could write, naming the step and the file."""
    path = allowed.root / "agent/coder.d" / control
    if loosen == "chmod 0666":
        path.chmod(0o666)
    else:
        os.chown(path, allowed.user.uid, allowed.user.gid)

    run = ctx(allowed.root, "run", "--agent", "coder", "echo")
    explain = ctx(allowed.root, "policy", "explain", "coder", "tool:echo", "execute")

    assert run.returncode == 126
    assert run.stderr.startswith(f"ctx: EACCES: step 4 (agent label): agent/coder.d/{control} ")
    assert explain.returncode == 1
    assert f"deny: EACCES: step 4 (agent label): agent/coder.d/{control} is not host-owned" in (
        explain.stdout
    )
