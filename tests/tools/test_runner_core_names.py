"""What the runner does with a tool at a core tool's name that is not this version's core tool
(SPEC R-5, A-5): a core tool an older bootstrap copied is refused before it runs, naming
'ctx bootstrap'; an administrator's own tool kept under a name that later became core runs
without the run capability only the core tool is served."""

from __future__ import annotations

import errno
import json
import subprocess
import sys

from cortexfs import storage
from tests.support.core_names import (
    install_administrators_tool,
    install_core_tool_of_another_version,
)
from tests.tools.support import World

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]
# Says whether the runner gave it a run capability (the descriptor's number) or not.
TELLS_ITS_CAPABILITY = (
    '#!/bin/sh\nprintf \'{"capability": "%s"}\\n\' "${CTX_RUN_CAPABILITY-none}"\n'
)


def granted(world: World, tool: str) -> World:
    world.agent("coder", tools=[tool])
    world.allow_tool(tool)
    return world


def test_a_core_tool_of_another_version_is_refused_before_it_runs(world: World) -> None:
    granted(world, "fs.stat")
    assert world.run("fs.stat", {"path": "/workspace"}).ok  # this version's: judged and kept
    install_core_tool_of_another_version(world.root, "fs.stat", world.scratch)

    result = world.run("fs.stat", {"path": "/workspace"})

    assert not result.ok and result.error is not None
    assert (result.error.errno, result.error.stage) == (errno.EINVAL, "resolve")
    assert "installed by another version of ctx; run 'ctx bootstrap'" in result.error.message
    assert "the tool did not run" in result.error.message
    assert result.exit_status is None
    assert world.events()[-1]["type"] == "tool_result"

    storage.bootstrap(world.root)
    assert world.run("fs.stat", {"path": "/workspace"}).ok


def test_ctx_run_names_bootstrap_for_a_core_tool_of_another_version(world: World) -> None:
    granted(world, "fs.stat")
    install_core_tool_of_another_version(world.root, "fs.stat", world.scratch)
    command = [*CTX, "--storage", str(world.root), "run", "--agent", "coder", "--native"]

    done = subprocess.run(
        [*command, "fs.stat"], input='{"path": "/workspace"}', capture_output=True, text=True
    )

    assert done.returncode == 1, done.stderr
    frames = [json.loads(line) for line in done.stdout.splitlines()]
    assert [frame["type"] for frame in frames] == ["result"]  # no "call": nothing started
    error = frames[0]["error"]
    assert (error["errno"], error["stage"]) == (errno.EINVAL, "resolve")
    assert "run 'ctx bootstrap' (the tool did not run)" in error["message"]


def test_an_administrators_tool_at_a_core_name_runs_without_the_capability(
    world: World,
) -> None:
    install_administrators_tool(
        world.root, "agent.update", world.scratch, TELLS_ITS_CAPABILITY.encode()
    )
    granted(world, "agent.update")

    result = world.run("agent.update")

    assert result.ok, result.error
    assert result.output == {"capability": "none"}


def test_the_core_tool_at_that_name_is_still_served_the_capability(world: World) -> None:
    granted(world, "agent.update")

    result = world.run("agent.update", {"control": "system.md", "content": "Be brief.\n"})

    assert result.ok, result.error
    assert (world.root / "agent/coder.d/system.md").read_text() == "Be brief.\n"


def test_the_core_tool_is_served_the_capability_without_its_diagnostic_origin(
    world: World,
) -> None:
    """``origin`` is diagnostic, no stable ABI (T-1): without it, the launcher's stamp of
    this version's sources is what proves the tool bootstrap's."""
    granted(world, "agent.update")
    (world.root / "tool/agent.update.d/origin").unlink()

    result = world.run("agent.update", {"control": "system.md", "content": "Be brief.\n"})

    assert result.ok, result.error
    assert (world.root / "agent/coder.d/system.md").read_text() == "Be brief.\n"


def test_a_program_of_its_own_without_origin_at_a_core_name_is_not_served(
    world: World,
) -> None:
    granted(world, "agent.update")
    (world.root / "tool/agent.update.d/origin").unlink()
    (world.root / "tool/agent.update").write_bytes(TELLS_ITS_CAPABILITY.encode())

    result = world.run("agent.update")

    # Not this version's launcher: refused before it runs, and never given the capability.
    assert not result.ok and result.error is not None
    assert result.error.stage == "resolve" and result.exit_status is None
