"""A terminal whose ctxterm was killed (SIGKILL): what it left is cleaned up by the next stop or
start of its session, and nothing of a running terminal is touched (SPEC A-1, A-2, F-1).

Real ``ctx agent start`` runs, a real FUSE view, and a real ``kill -9`` of ctxterm, which
leaves the view mounted and its mount process running.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from cortexfs.agents import terminal_socket
from cortexfs.agents.terminal_socket import listening
from cortexfs.agents.view import AgentView
from cortexfs.errors import CtxError
from cortexfs.fuse.mounts import mounted_type
from tests.agents.test_terminal import Client, fresh_session, pytestmark
from tests.agents.test_terminal_roots import other as other
from tests.support.cli import ctx
from tests.tools.support import World, effective_user

__all__ = ["pytestmark"]  # the terminal tests' conditions: root, bubblewrap, FUSE


def fresh_agent(world: World, tools: tuple[str, ...] = ("fs.stat",)) -> str:
    agent = f"k{uuid.uuid4().hex[:10]}"
    world.agent(agent, tools=list(tools))
    return agent


def start(world: World, agent: str, session: str) -> dict[str, object]:
    started = ctx(world.root, "agent", "start", agent, "--session", session, "--json")
    assert started.returncode == 0, started.stderr
    return {**json.loads(started.stdout), "stderr": started.stderr}


def gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaps (ctxterm's parent has exited)."""
    try:
        status = Path("/proc", str(pid), "stat").read_text()
    except OSError:
        return True
    return status.rpartition(")")[2].split()[0] in ("Z", "X")


def kill_terminal(listening_at: str) -> int:
    """SIGKILL to the terminal's ctxterm, as the OOM killer or 'kill -9' would; its pid."""
    pid = int((Path(listening_at).parent / "pid").read_text())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while not gone(pid):
        assert time.monotonic() < deadline, f"ctxterm {pid} did not die"
        time.sleep(0.05)
    return pid


def view_of(listening_at: str) -> Path:
    return Path(listening_at).parent / "private" / "ctx"


def mount_processes(view: Path) -> list[int]:
    """Live processes whose command line ends with the view's mount point."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")[:-1]
        except OSError:
            continue
        if argv[-1:] == [os.fsencode(view)] and not gone(int(entry)):
            found.append(int(entry))
    return found


def nothing_left(facts: dict[str, object]) -> None:
    listening_at = str(facts["listening_at"])
    view = view_of(listening_at)
    assert mounted_type(view) is None, f"{view} is still mounted"
    assert mount_processes(view) == [], "the view's mount process still runs"
    assert not Path(listening_at).parent.exists(), os.listdir(Path(listening_at).parent)
    assert not os.path.lexists(str(facts["socket"])), "the session's link is left"


def test_stop_cleans_up_after_a_killed_terminal(world: World) -> None:
    agent, session = fresh_agent(world), fresh_session()
    facts = start(world, agent, session)
    try:
        pid = kill_terminal(str(facts["listening_at"]))
        view = view_of(str(facts["listening_at"]))
        assert mounted_type(view) == "fuse.cortexfs", "killed, it left its view mounted"
        (mount_pid,) = mount_processes(view)

        stopped = ctx(world.root, "agent", "stop", agent, "--session", session, "--json")

        assert stopped.returncode == 0, stopped.stderr
        report = json.loads(stopped.stdout)
        assert (report["pid"], report["running"]) == (pid, False)
        cleaned = " ".join(report["cleaned"])
        assert f"unmounted its view at {view}" in cleaned, cleaned
        assert f"ended its mount process (pid {mount_pid})" in cleaned, cleaned
        nothing_left(facts)
        again = ctx(world.root, "agent", "stop", agent, "--session", session)
        assert again.returncode == 1 and "ENOENT" in again.stderr, again.stderr

        restarted = start(world, agent, session)
        assert "cleaned" not in restarted and "warning" not in str(restarted["stderr"])
        stopped = ctx(world.root, "agent", "stop", agent, "--session", session, "--json")
        assert stopped.returncode == 0, stopped.stderr
        assert json.loads(stopped.stdout).keys() == {"agent", "session", "pid"}
        nothing_left(restarted)
    finally:
        ctx(world.root, "agent", "stop", agent, "--session", session)


def test_stop_says_what_it_cleaned_up(world: World) -> None:
    agent, session = fresh_agent(world), fresh_session()
    facts = start(world, agent, session)
    try:
        pid = kill_terminal(str(facts["listening_at"]))

        stopped = ctx(world.root, "agent", "stop", agent, "--session", session)

        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.startswith(
            f"cleaned up after {agent}, session {session} (pid {pid}), which had ended without "
            f"cleaning up: unmounted its view at {view_of(str(facts['listening_at']))}; "
        ), stopped.stdout
        assert f"removed the link {facts['socket']}" in stopped.stdout
    finally:
        ctx(world.root, "agent", "stop", agent, "--session", session)


def test_start_cleans_up_after_a_killed_terminal_first(world: World) -> None:
    agent, session = fresh_agent(world), fresh_session()
    facts = start(world, agent, session)
    try:
        pid = kill_terminal(str(facts["listening_at"]))
        view = view_of(str(facts["listening_at"]))

        restarted = start(world, agent, session)

        warning = str(restarted["stderr"])
        assert warning.startswith(
            f"ctx: warning: the terminal of {agent} in session {session} (pid {pid}) had ended "
            f"without cleaning up: unmounted its view at {view}; "
        ), warning
        assert restarted["cleaned"] and "unmounted its view" in restarted["cleaned"][0]
        mounts = Path("/proc/self/mountinfo").read_text().split("\n")
        assert len([line for line in mounts if f" {view} " in line]) == 1, "one view, not two"
        assert listening(Path(str(restarted["listening_at"])))

        stopped = ctx(world.root, "agent", "stop", agent, "--session", session)

        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.startswith(f"stopped {agent}, session {session} (pid "), stopped
        nothing_left(restarted)
    finally:
        ctx(world.root, "agent", "stop", agent, "--session", session)


def test_cleaning_up_touches_no_running_terminal(world: World, other: World) -> None:
    """The killed terminal's session is cleaned up; the same agent's terminal in another
    session, and in another storage root the same session, run on, their views mounted."""
    agent, killed, running = fresh_agent(world), fresh_session(), fresh_session()
    other.agent(agent, tools=["fs.stat"])
    dead = start(world, agent, killed)
    alive = [start(world, agent, running), start(other, agent, killed)]
    try:
        kill_terminal(str(dead["listening_at"]))

        elsewhere = ctx(other.root, "agent", "stop", agent, "--session", running)
        stopped = ctx(world.root, "agent", "stop", agent, "--session", killed)

        assert elsewhere.returncode == 1 and "ENOENT" in elsewhere.stderr, elsewhere.stderr
        assert stopped.returncode == 0 and stopped.stdout.startswith("cleaned up after ")
        nothing_left(dead)
        for facts in alive:
            listening_at = str(facts["listening_at"])
            assert listening(Path(listening_at)), f"{listening_at} was touched"
            assert mounted_type(view_of(listening_at)) == "fuse.cortexfs"
            assert len(mount_processes(view_of(listening_at))) == 1
    finally:
        for each, session in ((world, killed), (world, running), (other, killed)):
            ctx(each.root, "agent", "stop", agent, "--session", session)
    for facts in alive:
        nothing_left(facts)


def test_only_root_cleans_up_after_a_killed_terminal(world: World) -> None:
    """The view is root's mount and the mount process root's: another uid is told who can."""
    agent, session = fresh_agent(world), fresh_session()
    facts = start(world, agent, session)
    try:
        kill_terminal(str(facts["listening_at"]))
        view = AgentView.load(world.root, agent)

        with effective_user(world.user), pytest.raises(CtxError) as refused:
            terminal_socket.stop(terminal_socket.Whose.of(view), session)

        assert refused.value.errno == errno.EPERM
        assert "ended without cleaning up" in refused.value.message
        assert f"root cleans up after it with 'ctx agent stop {agent}" in refused.value.message
        assert mounted_type(view_of(str(facts["listening_at"]))) == "fuse.cortexfs"
    finally:
        stopped = ctx(world.root, "agent", "stop", agent, "--session", session)
    assert stopped.returncode == 0 and stopped.stdout.startswith("cleaned up after ")
    nothing_left(facts)


def test_a_terminal_killed_while_a_tool_runs_is_cleaned_up_at_once(world: World) -> None:
    """The tool call runs in a child of ctxterm, which outlives it: the lock that says a
    terminal runs must not live on in that child."""
    world.install("sh.wait", "#!/bin/sh\nsleep 40\n")
    agent = fresh_agent(world, tools=("sh.wait",))
    world.allow_tool("sh.wait", label=f"{agent}_t")
    session = fresh_session()
    facts = start(world, agent, session)
    try:
        client = Client(str(facts["listening_at"]), "attach")
        client.expect(rf"{agent}\$ ")
        client.type("sh.wait")
        deadline = time.monotonic() + 20
        while not [e for e in world.events(agent, session) if e["type"] == "tool_call"]:
            assert time.monotonic() < deadline, "the tool never started"
            time.sleep(0.1)
        kill_terminal(str(facts["listening_at"]))
        client.close()
        began = time.monotonic()

        stopped = ctx(world.root, "agent", "stop", agent, "--session", session, "--json")

        assert stopped.returncode == 0, stopped.stderr
        assert json.loads(stopped.stdout)["running"] is False
        assert time.monotonic() - began < 15, "stop waited for the tool to end"
        nothing_left(facts)
    finally:
        ctx(world.root, "agent", "stop", agent, "--session", session)
        end_processes_of(session)


def end_processes_of(session: str) -> None:
    """SIGKILL to whatever still runs with the session in its environment (the tool call
    the killed terminal left, and its tool)."""
    marker = f"CTX_SESSION={session}".encode()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path("/proc", entry, "environ").read_bytes().split(b"\0"):
                os.kill(int(entry), signal.SIGKILL)
        except OSError:
            continue
