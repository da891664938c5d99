"""Starting a terminal that cannot run, who may use a running one, what its end leaves (SPEC
A-1, A-2).

Real ``ctx agent start`` runs (bubblewrap, a FUSE view, a PTY); watchers are real processes
of other uids.
"""

from __future__ import annotations

import json
import os
import pwd
import select
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cortexfs.agents.terminal_runtime import run_directory
from tests.agents.test_terminal import fresh_session, lifecycle, pytestmark
from tests.support.cli import ctx
from tests.support.users import run_as
from tests.tools.support import World

__all__ = ["pytestmark"]  # the terminal tests' conditions: root, bubblewrap, FUSE


def fresh_agent() -> str:
    """An agent name no other test uses: its run directory is this test's alone."""
    return f"a{uuid.uuid4().hex[:10]}"


def nothing_left(world: World, agent: str, session: str) -> None:
    run_dir = run_directory(world.root, world.user.uid, agent, session)
    assert not run_dir.parent.exists(), f"{run_dir.parent} was left behind"
    assert str(run_dir) not in Path("/proc/self/mounts").read_text(), "the view is mounted"
    assert not [e for e in lifecycle(world, session, agent) if e["type"] == "terminal.started"]
    made = world.root / "home" / str(world.user.uid) / "agent" / agent / "session" / session
    assert not made.exists(), "a start that failed leaves no session of its own behind"


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
    """bubblewrap cannot make a mount target inside a read-only mount: the sandbox ends
    before tsh runs."""
    agent, session = fresh_agent(), fresh_session()
    mounts = [[str(world.workspace), "/outer", "ro"], [str(world.scratch), "/outer/cannot", "ro"]]
    world.agent(agent, mounts=mounts)

    refused = ctx(world.root, "agent", "start", agent, "--session", session, "--no-workspace")

    assert refused.returncode == 1, refused.stdout
    assert refused.stderr.startswith("ctx: EROFS: "), refused.stderr
    assert "bwrap" in refused.stderr and "/outer/cannot" in refused.stderr, refused.stderr
    assert "started" not in refused.stdout
    nothing_left(world, agent, session)
    stopped = [e for e in lifecycle(world, session, agent) if e["type"] == "terminal.stopped"]
    assert stopped == [], "a terminal that never started does not stop"


# ------------------------------------------------------------------------- who may use it


def watch_as(world: World, uid: int, gid: int, agent: str, session: str, mode: str) -> str:
    """``ctx agent watch|attach`` as ``uid``: what it printed until the prompt (or its end)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "cortexfs", "--storage", str(world.root), "agent", mode, agent,
         "--session", session],
        # a pipe left open: attach ends at the end of its input
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        user=uid, group=gid, extra_groups=[],
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    seen = b""
    deadline = time.monotonic() + 30
    try:
        while f"{agent}$ ".encode() not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([process.stdout], [], [], 0.5)
            if ready:
                chunk = os.read(process.stdout.fileno(), 4096)
                if not chunk:
                    break
                seen += chunk
    finally:
        process.kill()
        _, stderr = process.communicate(timeout=30)
    return seen.decode(errors="replace") + stderr.decode(errors="replace")


@pytest.fixture
def running(world: World) -> Iterator[tuple[str, str]]:
    """A terminal root started for an agent that runs as the test user."""
    agent, session = fresh_agent(), fresh_session()
    world.agent(agent)
    started = ctx(world.root, "agent", "start", agent, "--session", session, "--json")
    assert started.returncode == 0, started.stderr
    yield agent, session
    ctx(world.root, "agent", "stop", agent, "--session", session)


def test_the_agents_own_uid_may_watch_but_not_attach(
    world: World, running: tuple[str, str]
) -> None:
    agent, session = running
    user = world.user

    watched = watch_as(world, user.uid, user.gid, agent, session, "watch")
    attached = watch_as(world, user.uid, user.gid, agent, session, "attach")

    assert f"{agent}$ " in watched
    assert attached.startswith("ctx: EACCES: ") and "attach" in attached, attached


def test_another_uid_is_refused_with_eacces_never_enoent(
    world: World, running: tuple[str, str]
) -> None:
    agent, session = running
    nobody = pwd.getpwnam("nobody")

    refused = watch_as(world, nobody.pw_uid, nobody.pw_gid, agent, session, "watch")

    assert refused.startswith("ctx: EACCES: "), refused
    assert "ENOENT" not in refused


def test_the_terminal_itself_refuses_a_peer_it_does_not_serve(
    world: World, running: tuple[str, str]
) -> None:
    """The socket is open to every uid (0666 in 0711 directories); the terminal decides by the
    peer's uid, so a client that skips ctx's own check is refused all the same."""
    agent, session = running
    path = run_directory(world.root, world.user.uid, agent, session) / "main.sock"
    script = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.connect({str(path)!r})\n"
        "s.sendall(b'attach\\n')\n"
        "data = b''\n"
        "while chunk := s.recv(4096):\n"
        "    data += chunk\n"
        "sys.stdout.write(data.decode())\n"
    )

    refused = run_as(world.user, [sys.executable, "-c", script])

    assert refused.returncode == 0, refused.stderr
    assert refused.stdout.startswith("ctxterm: EACCES: "), refused.stdout
    assert f"{agent}$" not in refused.stdout, "no scrollback before the check"


def test_the_owner_of_the_storage_root_may_watch_and_attach_what_root_started(
    world: World,
) -> None:
    """A-2: root starts the terminal of an agent that runs as the uid owning the storage
    root; that uid watches it."""
    os.chown(world.root, world.user.uid, world.user.gid)
    agent, session = fresh_agent(), fresh_session()
    world.agent(agent)
    started = ctx(world.root, "agent", "start", agent, "--session", session, "--json")
    assert started.returncode == 0, started.stderr
    try:
        user = world.user
        assert f"{agent}$ " in watch_as(world, user.uid, user.gid, agent, session, "watch")
        assert f"{agent}$ " in watch_as(world, user.uid, user.gid, agent, session, "attach")
        socket_link = Path(json.loads(started.stdout)["socket"])
        probe = socket.socket(socket.AF_UNIX)
        probe.connect(str(socket_link))  # the ABI path of A-2 leads to it
        probe.close()
    finally:
        stopped = ctx(world.root, "agent", "stop", agent, "--session", session)
    assert stopped.returncode == 0, stopped.stderr


# ----------------------------------------------------------------------------- its end


def test_stop_removes_the_directories_its_start_made(
    world: World, running: tuple[str, str]
) -> None:
    agent, session = running
    agent_dir = run_directory(world.root, world.user.uid, agent, session).parent
    assert (agent_dir / session / "main.sock").exists()

    stopped = ctx(world.root, "agent", "stop", agent, "--session", session)

    assert stopped.returncode == 0, stopped.stderr
    assert not agent_dir.exists(), os.listdir(agent_dir)
