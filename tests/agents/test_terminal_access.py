"""Starting a terminal that cannot run (SPEC A-1).

Real ``ctx agent start`` runs (bubblewrap, a FUSE view, a PTY).
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from cortexfs.agents.terminal import RUN_BASE
from tests.agents.test_terminal import fresh_session, lifecycle
from tests.support.cli import ctx
from tests.tools.support import World

try:
    import pyfuse3
except ImportError:  # pragma: no cover - depends on the machine
    pyfuse3 = None

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a sandboxed terminal needs root"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="no /dev/fuse on this machine"),
    pytest.mark.skipif(pyfuse3 is None, reason="pyfuse3 (the 'fuse' extra) is not installed"),
]


def fresh_agent() -> str:
    """An agent name no other test uses: its run directory is this test's alone."""
    return f"a{uuid.uuid4().hex[:10]}"


def nothing_left(world: World, agent: str, session: str) -> None:
    run_dir = RUN_BASE / str(world.user.uid) / agent / session
    assert not run_dir.exists(), f"{run_dir} was left behind"
    assert str(run_dir) not in Path("/proc/self/mounts").read_text(), "the view is mounted"
    assert not [e for e in lifecycle(world, session, agent) if e["type"] == "terminal.started"]


# ------------------------------------------------------------------ a start that cannot run


def test_a_missing_mount_source_is_refused_before_anything_starts(world: World) -> None:
    agent, session = fresh_agent(), fresh_session()
    missing = world.scratch / "nonexist"
    world.agent(agent, mounts=[[str(missing), "/nonexist", "ro"]])

    refused = ctx(world.root, "agent", "start", agent, "--session", session, "--no-workspace")

    assert refused.returncode == 1, refused.stdout
    assert refused.stderr.startswith("ctx: ENOENT: "), refused.stderr
    assert str(missing) in refused.stderr and "started" not in refused.stdout
    nothing_left(world, agent, session)


def test_a_sandbox_that_ends_at_once_fails_the_start_with_its_reason(world: World) -> None:
    """bubblewrap cannot make a mount target inside /proc: the sandbox ends before tsh runs."""
    agent, session = fresh_agent(), fresh_session()
    world.agent(agent, mounts=[[str(world.workspace), "/proc/cannot", "ro"]])

    refused = ctx(world.root, "agent", "start", agent, "--session", session, "--no-workspace")

    assert refused.returncode == 1, refused.stdout
    assert refused.stderr.startswith("ctx: ENOENT: "), refused.stderr
    assert "bwrap" in refused.stderr and "/proc/cannot" in refused.stderr, refused.stderr
    assert "started" not in refused.stdout
    nothing_left(world, agent, session)
    stopped = [e for e in lifecycle(world, session, agent) if e["type"] == "terminal.stopped"]
    assert stopped == [], "a terminal that never started does not stop"
