"""Refusals of the core tools that name what is at fault, never a traceback nor a bare name
(SPEC T-2, T-5; docs/tools.md "The core tools", "Paths are confined").

* A ``CTX_MOUNTS`` whose source is no path — a number, a string holding a NUL or a lone
  surrogate — is ``EINVAL: CTX_MOUNTS is malformed``, as every other malformed table is, from
  a core tool run by hand (exit 1) and from tsh (exit 126).
* Below a directory the agent's uid may not search, every ``fs.*`` tool names the refused
  path as the agent sees it (``/workspace/shut/x``), not by its last component alone.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.tools.support import World

CORE = ["fs.read", "fs.list", "fs.stat", "fs.write"]


def by_hand(program: Path, *argv: str, **environ: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(program), *argv],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **environ},
        timeout=60,
    )


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        pytest.param(1, "1", id="a-number"),
        pytest.param(None, "None", id="null"),
        pytest.param(["/"], "['/']", id="a-list"),
        pytest.param("{src}\u0000x", "'{src}\\x00x'", id="a-NUL"),
        pytest.param("{src}\ud800", "'{src}\\ud800'", id="a-lone-surrogate"),
    ],
)
def test_a_mount_source_that_is_no_path_is_einval_from_a_core_tool_and_from_tsh(
    world: World, source: object, shown: str
) -> None:
    src = world.scratch / "src"
    src.mkdir()
    (src / "x").write_text("x\n")
    value = source.replace("{src}", str(src)) if isinstance(source, str) else source
    table = json.dumps([[value, "/w", "ro"]])
    said = (
        "EINVAL: CTX_MOUNTS is malformed: the source of the mount at '/w' is no path: "
        + shown.replace("{src}", str(src))
        + "\n"
    )

    stat = by_hand(world.root / "tool" / "fs.stat", "/w/x", CTX_MOUNTS=table, CTX_CWD="/w")
    tsh = by_hand(world.root / "bin" / "tsh", "tools", CTX_MOUNTS=table, CTX_PATH="/w/tool")

    assert (stat.returncode, stat.stdout, stat.stderr) == (1, "", f"fs.stat: {said}"), stat
    assert (tsh.returncode, tsh.stdout, tsh.stderr) == (126, "", f"tsh: {said}"), tsh


@pytest.fixture
def shut(world: World) -> World:
    """Agent coder with its workspace at /workspace, holding ``shut/x`` below ``shut``,
    root's and mode 0700: a directory the agent's uid may not search."""
    os.chown(world.workspace, world.user.uid, world.user.gid)
    (world.workspace / "shut").mkdir(mode=0o700)
    (world.workspace / "shut" / "x").write_text("secret\n")
    world.agent("coder", tools=CORE)
    for tool in CORE:
        world.allow_tool(tool)
    return world


@pytest.mark.parametrize("tool", CORE)
def test_below_a_directory_the_agent_may_not_search_each_tool_names_the_view_path(
    shut: World, tool: str
) -> None:
    request: dict[str, object] = {"path": "shut/x"}
    if tool == "fs.write":
        request["content"] = "y"

    result = shut.run(tool, request)

    assert result.error is not None and result.error.stage == "exit", result
    assert result.error.errno == errno.EACCES, result
    said = result.output["message"]
    assert said.startswith("/workspace/shut") and said.endswith(": Permission denied"), said
    assert (shut.workspace / "shut" / "x").read_text() == "secret\n"
