"""Agents that run as one uid share its home, not each other's sessions (SPEC S-1, S-6, T-5).

``home/<uid>/agent/<a>/session/<n>/`` of another agent of the same uid shows only with
``session:<n> read`` and is changed only with ``session:<n> write``, as a session of another
agent in a shared space is: through the tools' ``CTX_MOUNTS`` and through ``ctx mount --as``
alike.  The uid's Linux permissions are the same for both agents, so the view is what keeps
them apart for the ``fs.*`` tools.  Real roots, real sessions recorded by the runner, real
tool processes, a real FUSE mount.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path, PurePosixPath

import pytest

from cortexfs.agents.projection import ViewRules
from cortexfs.agents.view import AgentView
from cortexfs.shared.sessions import SessionRef
from cortexfs.tools.core import confine
from cortexfs.tools.runner import run_native
from tests.fuse.support import NEEDS_A_MOUNT, as_user, mounted
from tests.tools.support import World, reaches, storage_paths

FS_TOOLS = ["fs.read", "fs.list", "fs.stat", "fs.write"]


@pytest.fixture
def home(world: World) -> World:
    """Agents ``oth`` and ``fso`` run as the same uid; ``oth`` has recorded sessions
    ``private1`` and ``open1`` in their home, ``fso`` a session ``mine``; ``fso`` holds no
    session rule."""
    for name in ("oth", "fso"):
        world.agent(name, tools=FS_TOOLS)
        for tool in FS_TOOLS:
            world.allow_tool(tool, f"{name}_t")
    for agent, session in (("oth", "private1"), ("oth", "open1"), ("fso", "mine")):
        where = SessionRef.home(world.root, world.user.uid, agent, session)
        done = run_native(world.root, agent, "fs.list", {"path": "/workspace"}, session=where)
        assert done.ok, done.error
    return world


def sessions(world: World, agent: str = "oth") -> str:
    return f"/ctx/home/{world.user.uid}/agent/{agent}/session"


def events_of(world: World, session: str) -> Path:
    home = world.root / "home" / str(world.user.uid)
    return home / "agent" / "oth" / "session" / session / "events.jsonl"


def grant(world: World, agent: str, *rules: str) -> None:
    with open(world.root / "agent" / f"{agent}.d" / "policy", "a") as policy:
        policy.writelines(f"allow {agent}_t {rule}\n" for rule in rules)


def refused(world: World, tool: str, request: dict[str, object]) -> int:
    result = world.run(tool, request, agent="fso")
    assert result.status == "error" and result.error.stage == "exit", result
    return result.error.errno


def listing(world: World, path: str) -> list[str]:
    result = world.run("fs.list", {"path": path}, agent="fso")
    assert result.status == "ok", result
    return [entry["name"] for entry in result.output["entries"]]


def test_a_session_of_another_agent_of_the_uid_is_refused_without_a_rule(home: World) -> None:
    private = f"{sessions(home)}/private1/events.jsonl"
    before = events_of(home, "private1").read_bytes()

    assert refused(home, "fs.read", {"path": private}) == errno.EACCES
    forged = {"path": private, "content": "{}\n"}
    assert refused(home, "fs.write", forged) in (errno.EACCES, errno.EROFS)
    assert refused(home, "fs.write", {**forged, "path": f"{sessions(home)}/new/x"}) in (
        errno.EACCES,
        errno.EROFS,
    )

    assert events_of(home, "private1").read_bytes() == before
    assert listing(home, sessions(home)) == []
    assert listing(home, f"/ctx/home/{home.user.uid}/agent") == ["fso", "oth"]
    assert "mine" in listing(home, sessions(home, "fso"))  # its own, with its calls


def test_session_rules_open_that_session_only(home: World) -> None:
    private = f"{sessions(home)}/private1/events.jsonl"
    grant(home, "fso", "session:private1 read")
    before = events_of(home, "private1").read_bytes()

    read = home.run("fs.read", {"path": private}, agent="fso")
    assert read.ok and read.output["content"] == before.decode(), read
    assert listing(home, sessions(home)) == ["private1"]
    forged = {"path": private, "content": "{}\n"}
    assert refused(home, "fs.write", forged) == errno.EROFS

    grant(home, "fso", "session:private1 write")
    assert home.run("fs.write", forged, agent="fso").ok
    assert events_of(home, "private1").read_text() == "{}\n"
    open1 = f"{sessions(home)}/open1/events.jsonl"
    assert refused(home, "fs.read", {"path": open1}) == errno.EACCES


def test_what_a_tool_may_reach_in_the_home_is_what_the_rules_decide(home: World) -> None:
    grant(home, "fso", "session:open1 read", "session:open1 write", "session:private1 read")
    view = AgentView.load(home.root, "fso")
    rules = ViewRules(view)
    environment = view.tool_environment(tool="fs.read", session="s", call="c", mode="n")
    tools = confine.View.from_environment(environment)
    checked = 0
    for parts in storage_paths(home.root, depth=8, top=("home", str(home.user.uid))):
        path = str(PurePosixPath("/ctx", *parts))
        assert reaches(tools, path) == rules.visible(parts), path
        assert reaches(tools, path, write=True) == rules.writable(parts), path
        checked += 1
    assert checked > 10


def test_the_mount_shows_the_same(home: World) -> None:
    mountpoint = home.scratch / "ctx"
    shown = mountpoint / "home" / str(home.user.uid) / "agent" / "oth" / "session"
    private = shown / "private1" / "events.jsonl"
    with mounted(home.root, mountpoint, "--as", "fso"):
        assert sorted(os.listdir(shown)) == []
        hidden = as_user(home.user, f"cat {private}")
        assert hidden.returncode != 0 and "No such file" in hidden.stderr, hidden
        grant(home, "fso", "session:private1 read")
        time.sleep(1.2)  # the kernel and the view keep an answer for a second
        assert sorted(os.listdir(shown)) == ["private1"]
        forged = as_user(home.user, f"echo forged > {private}")
        assert forged.returncode != 0 and "Permission denied" in forged.stderr, forged


for _mark in NEEDS_A_MOUNT:
    test_the_mount_shows_the_same = _mark(test_the_mount_shows_the_same)
