"""tsh run as an agent's tool sees the agent's view, never the storage root (SPEC T-4, T-5).

``ctx run --agent A tsh …``, a worker, and ``tsh …`` typed in A's terminal all have the host
start ``tool/tsh`` outside any sandbox, as A's uid: there ``/ctx`` is not A's view, so tsh
must read it through ``CTX_MOUNTS`` as the ``fs.*`` tools do, and take ``CTX_PATH`` from the
runner, not from a ``.tshrc`` A can write in its own home.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.cli import ctx
from tests.tools.support import World

GRANTED = ("fs.list", "fs.write", "tsh")


@pytest.fixture
def viewer(world: World) -> World:
    """Agent ``viewer`` may run exactly tsh, fs.list and fs.write; agent ``other`` exists."""
    world.agent("viewer", tools=GRANTED)
    world.agent("other")
    for tool in GRANTED:
        world.allow_tool(tool, label="viewer_t")
    return world


def tsh(world: World, *argv: str) -> subprocess.CompletedProcess[str]:
    return ctx(world.root, "run", "--agent", "viewer", "tsh", *argv)


def listed_tools(world: World) -> list[str]:
    """The tools ``fs.list /ctx/tool`` shows the agent: its view's own answer."""
    listing = world.run("fs.list", {"path": "/ctx/tool"}, agent="viewer")
    assert listing.ok, listing.error
    return [e["name"] for e in listing.output["entries"] if not e["name"].endswith(".d")]


def test_tools_lists_what_the_view_shows_and_nothing_it_hides(viewer: World) -> None:
    ran = tsh(viewer, "tools")

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == listed_tools(viewer) == sorted(GRANTED)


def test_a_hidden_tool_is_not_found_nor_described_and_no_host_path_shows(viewer: World) -> None:
    which = tsh(viewer, "which", "shell.exec", "fs.list")
    described = tsh(viewer, "describe", "agent.update")

    assert which.returncode == 1 and which.stdout == "/ctx/tool/fs.list\n"
    assert "shell.exec: not on CTX_PATH" in which.stderr
    assert described.returncode == 1 and described.stdout == ""
    for ran in (which, described, tsh(viewer, "describe", "fs.list")):
        assert str(viewer.root) not in ran.stdout + ran.stderr


def test_a_tshrc_the_agent_wrote_is_ignored(viewer: World) -> None:
    home = f"/ctx/home/{viewer.user.uid}"
    wrote = viewer.run(
        "fs.write",
        {"path": f"{home}/.tshrc", "content": "CTX_PATH=/ctx/agent:/ctx/tool\n"},
        agent="viewer",
    )
    assert wrote.ok, wrote.error

    ran = tsh(viewer, "tools")

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == sorted(GRANTED)  # not "other", not "viewer"


def test_a_link_in_the_agents_home_is_never_followed(viewer: World) -> None:
    home = viewer.root / "home" / str(viewer.user.uid)
    home.mkdir(exist_ok=True)
    # What the agent could make of its own tier: a link to the system tier, raw.
    os.symlink(viewer.root / "tool", home / "tool")
    os.lchown(home / "tool", viewer.user.uid, viewer.user.gid)

    tools, which = tsh(viewer, "tools"), tsh(viewer, "which", "shell.exec")

    assert tools.stdout.split() == sorted(GRANTED)
    assert which.returncode == 1 and which.stdout == ""


def test_it_refuses_to_run_a_tool_and_says_how(viewer: World) -> None:
    ran = tsh(viewer, "fs.list", "/ctx")

    assert ran.returncode == 126
    assert "EACCES" in ran.stderr and "run fs.list as a tool of its own" in ran.stderr
