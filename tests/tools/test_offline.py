"""No network without ``allow <label> network:default connect`` (SPEC P-4).

A real listener on the host's loopback, a real tool (``shell.exec``) trying to reach it under
a real second uid: refused without the grant, connected with it, whether the host runs as root
or as the unprivileged owner of the storage root.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.users import UnprivilegedUser, run_as
from tests.tools.support import World

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for the second uid")

# Print the interfaces the tool sees, then try the listener: "connected" or the errno's name.
PROBE = (
    "cut -d: -f1 /proc/net/dev | tail -n +3 | tr -d ' ' | tr '\\n' ' '; echo; "
    "python3 -c 'import errno, socket, sys\n"
    "try:\n"
    '    socket.create_connection(("127.0.0.1", int(sys.argv[1])), 5); print("connected")\n'
    "except OSError as e:\n"
    "    print(errno.errorcode[e.errno])' {port}"
)


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP listener on the host's 127.0.0.1: its port."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


def granted(root: Path, agent: str) -> None:
    with open(root / "agent" / f"{agent}.d" / "policy", "a") as policy:
        policy.write(f"allow {agent}_t network:default connect\n")


def probe_lines(output: str) -> tuple[set[str], str]:
    interfaces, outcome = output.splitlines()
    return set(interfaces.split()), outcome


def test_a_tool_without_the_grant_has_no_network_even_to_the_hosts_loopback(
    world: World, listener: int
) -> None:
    world.agent("coder", tools=["shell.exec"])
    world.allow_tool("shell.exec")

    offline = world.run("shell.exec", {"cmd": PROBE.format(port=listener)})
    granted(world.root, "coder")
    online = world.run("shell.exec", {"cmd": PROBE.format(port=listener)})

    assert offline.ok, offline
    assert probe_lines(offline.output) == ({"lo"}, "ENETUNREACH")
    assert online.ok, online
    interfaces, outcome = probe_lines(online.output)
    assert outcome == "connected" and interfaces > {"lo"}


def test_the_grant_is_the_agents_own_and_read_at_every_call(world: World, listener: int) -> None:
    world.agent("coder", tools=["shell.exec"])
    world.agent("other", tools=["shell.exec"])
    world.allow_tool("shell.exec", "coder_t")
    world.allow_tool("shell.exec", "other_t")
    granted(world.root, "other")

    calls = [
        world.run("shell.exec", {"cmd": PROBE.format(port=listener)}, agent=agent)
        for agent in ("coder", "other", "coder")
    ]

    assert [probe_lines(call.output)[1] for call in calls] == [
        "ENETUNREACH",
        "connected",
        "ENETUNREACH",
    ]


def test_hooks_run_offline_like_their_tool(world: World, listener: int) -> None:
    world.agent("coder", tools=["shell.exec"])
    world.allow_tool("shell.exec")
    hook = world.root / "tool" / "shell.exec.d" / "hooks" / "pre.d" / "10-phone-home"
    hook.write_text(f"#!/bin/sh\n({PROBE.format(port=listener)}) > {world.workspace}/hook.out\n")
    hook.chmod(0o755)

    result = world.run("shell.exec", {"cmd": "true"})

    assert result.ok, result
    assert probe_lines((world.workspace / "hook.out").read_text()) == ({"lo"}, "ENETUNREACH")


def test_the_runner_keeps_its_own_network(world: World, listener: int) -> None:
    """Only the tool moved: the runner's thread is back in the host's namespace."""
    world.agent("coder", tools=["shell.exec"])
    world.allow_tool("shell.exec")

    before = os.readlink("/proc/thread-self/ns/net")

    world.run("shell.exec", {"cmd": "true"})

    assert os.readlink("/proc/thread-self/ns/net") == before
    socket.create_connection(("127.0.0.1", listener), 5).close()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="util-linux unshare is missing")
def test_an_unprivileged_host_runs_its_tools_offline_too(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser, listener: int
) -> None:
    if run_as(unprivileged_user, [sys.executable, "-c", "pass"]).returncode != 0:
        pytest.skip(f"the test user cannot run {sys.executable}")
    namespaces = run_as(
        unprivileged_user, ["unshare", "--user", "--map-current-user", "--net", "true"]
    )
    if namespaces.returncode != 0:
        pytest.skip(f"no user namespaces for unprivileged users: {namespaces.stderr.strip()}")
    root = traversable_tmp / "storage"
    workspace = traversable_tmp / "work"
    for directory in (root, workspace):
        directory.mkdir()
        os.chown(directory, unprivileged_user.uid, unprivileged_user.gid)
    request = traversable_tmp / "coder.json"
    request.write_text(
        json.dumps(
            {
                "name": "coder",
                "label": "coder_t",
                "tools": ["shell.exec"],
                "mount": [[str(workspace), "/workspace", "rw"]],
            }
        )
    )

    def as_owner(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cortexfs", "--storage", str(root), *args],
            input=stdin,
            capture_output=True,
            text=True,
            user=unprivileged_user.uid,
            group=unprivileged_user.gid,
            extra_groups=[],
            env={"PATH": os.environ["PATH"], "HOME": str(traversable_tmp)},
            timeout=60,
        )

    def probe() -> tuple[set[str], str]:
        ran = as_owner(
            "run", "--native", "--agent", "coder", "shell.exec",
            stdin=json.dumps({"cmd": PROBE.format(port=listener)}),
        )  # fmt: skip
        result = json.loads(ran.stdout.splitlines()[-1])
        assert result["status"] == "ok", ran.stdout + ran.stderr
        return probe_lines(result["output"])

    assert as_owner("bootstrap").returncode == 0
    assert as_owner("agent", "create", str(request)).returncode == 0
    with open(root / "tool" / "shell.exec.d" / "policy", "a") as policy:
        policy.write("allow coder_t tool:shell.exec execute\n")

    offline = probe()
    granted(root, "coder")
    online = probe()

    assert offline == ({"lo"}, "ENETUNREACH")
    assert online[1] == "connected"
