"""A storage root moved or copied elsewhere: its agents' mount tables still name the old root at
/ctx (agent create recorded it; nothing rewrites a mount table).  The call's step 3 and
``ctx agent show`` say that the mount at /ctx names another storage root, and what to do."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.support.cli import ctx
from tests.tools.support import World


def moved(world: World) -> tuple[Path, Path]:
    """Agent coder, granted fs.stat, made in ``world``'s root; then the root copied with
    ``cp -a`` to another place.  The old root's real path and the copy's."""
    world.agent("coder", tools=["fs.stat"])
    world.allow_tool("fs.stat")
    copy = world.root.parent / "moved"
    subprocess.run(["cp", "-a", str(world.root), str(copy)], check=True)
    return Path(os.path.realpath(world.root)), Path(os.path.realpath(copy))


def test_a_call_in_a_moved_root_says_the_mount_names_another_root(world: World) -> None:
    old, new = moved(world)

    done = ctx(new, "run", "--agent", "coder", "--native", "fs.stat", stdin='{"path": "/ctx"}')

    assert done.returncode == 1, done.stderr
    error = json.loads(done.stdout.splitlines()[-1])["error"]
    assert error["step"] == 3 and "is under none of the mounts" in error["message"]
    assert f"names another storage root ({old}, not this root {new})" in error["message"]
    message = error["message"]
    assert "edit its source in agent/coder.d/mount, or create the agent again" in message
    assert "mount elsewhere" not in error["message"]


def test_agent_show_in_a_moved_root_says_the_mount_names_another_root(world: World) -> None:
    old, new = moved(world)

    shown = ctx(new, "agent", "show", "coder")

    assert shown.returncode == 0, shown.stderr
    (line,) = [line for line in shown.stdout.splitlines() if line.startswith("withheld mount:")]
    assert line.startswith(f"withheld mount: {old} at /ctx: the mount at /ctx names another")
    assert f"({old}, not this root {new})" in line
    assert "the agent was made for another root" in line
    assert "mount elsewhere" not in line
