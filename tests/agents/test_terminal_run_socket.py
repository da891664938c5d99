"""Who the terminal's run socket serves: tsh in the sandbox, and no other process of the
agent's uid (SPEC A-5, H-2).

Real ``ctx agent start`` runs (bubblewrap, a FUSE view, a PTY); the outsider is a real process
of the agent's uid on the host — what another agent's ``shell.exec`` is — speaking the run
socket's protocol as tsh does: one JSON message with three descriptors (``SCM_RIGHTS``).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cortexfs.agents.terminal_runtime import run_directory
from tests.agents.test_terminal import Client, fresh_session, pytestmark, tsh_process
from tests.support.cli import ctx
from tests.support.users import run_as
from tests.tools.support import World

__all__ = ["pytestmark"]  # the terminal tests' conditions: root, bubblewrap, FUSE

# For each path: how connecting went (an errno's name, or "connected") and the answer.
_OUTSIDER = """
import array, errno, json, os, socket, sys
message = sys.argv[1].encode() + b"\\n"
for path in sys.argv[2:]:
    seen = {"path": path}
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(path)
    except OSError as exc:
        seen["connect"] = errno.errorcode[exc.errno]
    else:
        seen["connect"] = "connected"
        empty, writer = os.pipe()
        os.close(writer)
        descriptors = array.array("i", [empty, 1, 2])
        connection.sendmsg([message], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, descriptors)])
        connection.settimeout(30)
        seen["answer"] = connection.makefile("rb").readline().decode()
    connection.close()
    print(json.dumps(seen), flush=True)
"""
_HIJACK = {"tool": "agent.update", "argv": ['{"control": "system.md", "content": "Hijacked\\n"}']}


def system_md(world: World) -> str:
    return (world.root / "agent" / "vic.d" / "system.md").read_text()


@pytest.fixture
def vic(world: World) -> Iterator[dict[str, str]]:
    """A running terminal of agent vic, which may rewrite its own system.md."""
    world.agent("vic", tools=["agent.update"])
    world.allow_tool("agent.update", label="vic_t")
    session = fresh_session()
    started = ctx(world.root, "agent", "start", "vic", "--session", session, "--json")
    assert started.returncode == 0, started.stderr
    try:
        yield json.loads(started.stdout)
    finally:
        stopped = ctx(world.root, "agent", "stop", "vic", "--session", session)
        assert stopped.returncode == 0, stopped.stderr


def outsider(world: World, message: dict[str, object], *paths: str) -> list[dict[str, str]]:
    """What a process of the agent's uid, outside the sandbox, got from each of ``paths``."""
    done = run_as(world.user, [sys.executable, "-c", _OUTSIDER, json.dumps(message), *paths])
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_a_process_of_the_agents_uid_outside_the_sandbox_runs_nothing(
    world: World, vic: dict[str, str]
) -> None:
    session = vic["session"]
    before = system_md(world)
    run_dir = run_directory(world.root, world.user.uid, "vic", session)
    on_host = run_dir / "private" / "run.sock"
    # tsh runs as the same uid: its root, and so the sandbox's bind of the socket, is reachable
    # through /proc as far as the kernel lets one process of a uid look into another's.
    through_tsh = f"/proc/{tsh_process(session)}/root/run/ctx/run.sock"

    hijack, through = outsider(world, _HIJACK, str(on_host), through_tsh)
    (interrupt,) = outsider(world, {"interrupt": True}, through_tsh)

    assert stat.S_IMODE(on_host.parent.stat().st_mode) == 0o700
    assert not (run_dir / "run.sock").exists(), "nothing beside main.sock but the terminal's own"
    assert hijack["connect"] == "EACCES", hijack
    for refused in (through, interrupt):
        if refused["connect"] == "connected":  # the terminal itself refuses it
            answer = json.loads(refused["answer"])
            assert answer["exit_status"] == 126, answer
            assert answer["error"].startswith("EACCES: process "), answer
            assert "not in the sandbox of agent vic's terminal" in answer["error"], answer
        else:
            assert refused["connect"] == "EACCES", refused
    assert system_md(world) == before == system_md(world)
    assert [e for e in world.events("vic", session) if e["type"] == "tool_call"] == []


def test_tsh_in_the_sandbox_is_still_served(world: World, vic: dict[str, str]) -> None:
    client = Client(vic["listening_at"], "attach")
    client.expect(r"vic\$ ")

    client.type("""agent.update '{"control": "system.md", "content": "Mine\\n"}'""")

    client.expect(r"system.md of agent vic updated\r?\n[\s\S]*vic\$ ")
    client.close()
    assert system_md(world) == "Mine\n"
    events = world.events("vic", vic["session"])
    assert [e["type"] for e in events][-2:] == ["tool_call", "tool_result"]


def test_the_run_socket_is_bound_into_the_sandbox_only(world: World, vic: dict[str, str]) -> None:
    """Beside the view's mount point, in the directory only root reaches on the host."""
    run_dir = run_directory(world.root, world.user.uid, "vic", vic["session"])
    socket_path = Path(run_dir, "private", "run.sock")

    assert stat.S_ISSOCK(socket_path.stat().st_mode)
    assert sorted(os.listdir(run_dir)) == ["main.sock", "pid", "private"]
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o711


def test_tsh_cannot_be_traced_by_another_process_of_its_uid(
    world: World, vic: dict[str, str]
) -> None:
    """tsh is the one process the run socket serves, so it is not dumpable: another process
    of the agent's uid can neither ptrace it nor reach the sandbox through /proc/<pid>/root
    (the entries in its /proc directory belong to root)."""
    tsh = tsh_process(vic["session"])

    assert os.stat(f"/proc/{tsh}/status").st_uid == 0  # the agent's uid's, were it dumpable
    (through,) = outsider(world, {"interrupt": True}, f"/proc/{tsh}/root/run/ctx/run.sock")
    assert through["connect"] == "EACCES", through
