"""Another agent's session in a shared space shows only as its policy says (SPEC S-1, S-6, T-5).

The space's grant (``shared:<s> read|write``) reaches the space; a session of another agent
in it needs ``session:<name> read`` to be seen and ``session:<name> write`` (with the space's
write) to be changed, through the tools' ``CTX_MOUNTS`` and through ``ctx mount --as`` alike.
The agent's own sessions in the space are kept by the same rules: a shared session is the
chain's object ``session:<name>`` whoever records in it (F-1: the view decides as the chain
does), and the runner records there whatever the agent may do with it.  Real roots, real
sessions recorded by the runner, real tool processes, a real FUSE mount.
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
from cortexfs.shared.spaces import create_shared_space
from cortexfs.tools.core import confine
from cortexfs.tools.runner import run_native
from tests.fuse.support import NEEDS_A_MOUNT, as_user, mounted
from tests.tools.support import World, reaches, storage_paths

FS_TOOLS = ["fs.read", "fs.list", "fs.stat", "fs.write"]
SESSIONS = "/ctx/shared/rw/agent/oth/session"
PRIVATE = f"{SESSIONS}/private1/events.jsonl"


@pytest.fixture
def space(world: World) -> World:
    """Space ``rw``.  Agent ``oth`` has recorded sessions ``private1`` and ``open1`` in it
    through the runner; agent ``fso`` may read and write the space and holds no session rule;
    agent ``reader`` may only read it (and so records no session there); ``fso`` has recorded
    a session ``mine`` of its own."""
    create_shared_space(world.root, "rw", gid=world.user.gid)
    for name, permissions in (("oth", ["read", "write"]), ("fso", ["read", "write"])):
        member(world, name, permissions)
    member(world, "reader", ["read"])
    for session in ("private1", "open1"):
        recorded(world, "oth", session)
    recorded(world, "fso", "mine")
    notes = world.root / "shared" / "rw" / "agent" / "oth" / "notes.txt"
    notes.write_text("oth's notes\n")
    os.chown(notes, world.user.uid, world.user.gid)
    notes.chmod(0o660)
    return world


def member(world: World, name: str, permissions: list[str]) -> None:
    mounts = [
        [str(world.workspace), "/workspace", "rw"],
        [str(world.root / "shared" / "rw"), "/shared/rw", "rw"],
    ]
    world.agent(name, tools=FS_TOOLS, shared={"rw": permissions}, mounts=mounts)
    for tool in FS_TOOLS:
        world.allow_tool(tool, f"{name}_t")


def recorded(world: World, agent: str, session: str) -> None:
    where = SessionRef.shared(world.root, "rw", agent, session)
    result = run_native(world.root, agent, "fs.list", {"path": "/workspace"}, session=where)
    assert result.ok, result.error


def grant(world: World, agent: str, *rules: str) -> None:
    with open(world.root / "agent" / f"{agent}.d" / "policy", "a") as policy:
        policy.writelines(f"allow {agent}_t {rule}\n" for rule in rules)


def refused(world: World, tool: str, request: dict[str, object], agent: str = "fso") -> int:
    result = world.run(tool, request, agent=agent)
    assert result.status == "error" and result.error.stage == "exit", result
    return result.error.errno


def listing(world: World, path: str, agent: str = "fso") -> list[str]:
    result = world.run("fs.list", {"path": path}, agent=agent)
    assert result.status == "ok", result
    return [entry["name"] for entry in result.output["entries"]]


def events_of(world: World, session: str) -> Path:
    return world.root / "shared" / "rw" / "agent" / "oth" / "session" / session / "events.jsonl"


# ----------------------------------------------------------------------- through the tools


def test_another_agents_session_is_refused_without_a_session_rule(space: World) -> None:
    before = events_of(space, "private1").read_bytes()

    assert refused(space, "fs.read", {"path": PRIVATE}) == errno.EACCES
    assert refused(space, "fs.stat", {"path": PRIVATE}) == errno.EACCES
    forged = {"path": PRIVATE, "content": '{"forged":true}\n'}
    assert refused(space, "fs.write", forged) in (errno.EACCES, errno.EROFS)
    assert refused(space, "fs.write", {**forged, "path": f"{SESSIONS}/new/x"}) == errno.EACCES

    assert events_of(space, "private1").read_bytes() == before
    assert listing(space, SESSIONS) == []
    assert listing(space, "/ctx/shared/rw/agent") == ["fso", "oth"]
    assert listing(space, "/ctx/shared/rw/agent/oth") == ["notes.txt", "session"]


def test_session_read_shows_that_session_only_and_read_only(space: World) -> None:
    grant(space, "fso", "session:private1 read")
    before = events_of(space, "private1").read_bytes()

    read = space.run("fs.read", {"path": PRIVATE}, agent="fso")

    assert read.ok and read.output["content"] == before.decode(), read
    assert listing(space, SESSIONS) == ["private1"]
    assert refused(space, "fs.read", {"path": f"{SESSIONS}/open1/events.jsonl"}) == errno.EACCES
    forged = {"path": PRIVATE, "content": '{"forged":true}\n'}
    assert refused(space, "fs.write", forged) == errno.EROFS
    assert events_of(space, "private1").read_bytes() == before


def test_session_write_with_the_spaces_write_makes_it_writable(space: World) -> None:
    grant(space, "fso", "session:private1 read", "session:private1 write")
    grant(space, "reader", "session:private1 read", "session:private1 write")
    forged = {"path": PRIVATE, "content": '{"forged":true}\n'}

    assert refused(space, "fs.write", forged, agent="reader") == errno.EROFS
    written = space.run("fs.write", forged, agent="fso")

    assert written.ok, written
    assert events_of(space, "private1").read_text() == '{"forged":true}\n'


def test_the_agents_own_sessions_in_the_space_are_kept_by_the_session_rules(space: World) -> None:
    mine = "/ctx/shared/rw/agent/fso/session/mine"
    events = space.root / "shared" / "rw" / "agent" / "fso" / "session" / "mine" / "events.jsonl"
    note = {"path": f"{mine}/note.txt", "content": "n\n"}

    assert listing(space, "/ctx/shared/rw/agent/fso/session") == []
    assert refused(space, "fs.read", {"path": f"{mine}/events.jsonl"}) == errno.EACCES
    assert refused(space, "fs.write", note) == errno.EACCES
    assert listing(space, "/ctx/shared/rw/agent/fso") == ["session"]  # its directory shows
    recorded(space, "fso", "mine")  # the runner records there all the same

    grant(space, "fso", "session:mine read")
    assert listing(space, "/ctx/shared/rw/agent/fso/session") == ["mine"]
    assert space.run("fs.read", {"path": f"{mine}/events.jsonl"}, agent="fso").ok
    assert refused(space, "fs.write", note) == errno.EROFS
    forged = {"path": f"{mine}/events.jsonl", "content": '{"forged":true}\n'}
    assert refused(space, "fs.write", forged) == errno.EROFS
    assert b"forged" not in events.read_bytes()

    grant(space, "fso", "session:mine write")
    assert space.run("fs.write", note, agent="fso").ok
    assert listing(space, "/ctx/shared/rw/agent/fso/session", agent="reader") == []
    assert refused(space, "fs.read", {"path": f"{mine}/events.jsonl"}, agent="reader") == (
        errno.EACCES
    )


def test_what_a_tool_may_reach_in_the_space_is_what_the_rules_decide(space: World) -> None:
    grant(space, "fso", "session:open1 read", "session:open1 write", "session:private1 read")
    for agent in ("fso", "reader"):
        view = AgentView.load(space.root, agent)
        rules = ViewRules(view)
        environment = view.tool_environment(tool="fs.read", session="s", call="c", mode="n")
        tools = confine.View.from_environment(environment)
        checked = 0
        for parts in storage_paths(space.root, depth=8, top=("shared", "rw")):
            path = str(PurePosixPath("/ctx", *parts))
            assert reaches(tools, path) == rules.visible(parts), (agent, path)
            assert reaches(tools, path, write=True) == rules.writable(parts), (agent, path)
            checked += 1
        assert checked > 20


# ------------------------------------------------------------------------- through FUSE


def test_the_mount_shows_the_same(space: World) -> None:
    mountpoint = space.scratch / "ctx"
    sessions = mountpoint / "shared" / "rw" / "agent" / "oth" / "session"
    private = sessions / "private1" / "events.jsonl"
    before = events_of(space, "private1").read_bytes()
    with mounted(space.root, mountpoint, "--as", "fso"):
        assert sorted(os.listdir(sessions)) == []
        hidden = as_user(space.user, f"cat {private}")
        assert hidden.returncode != 0 and "No such file" in hidden.stderr, hidden
        moved = as_user(space.user, f"mv {sessions.parent} {mountpoint}/shared/rw/data/oth")
        assert moved.returncode != 0 and "Permission denied" in moved.stderr, moved
        own = mountpoint / "shared" / "rw" / "agent" / "fso" / "session" / "mine"
        unseen = as_user(space.user, f"echo n > {own}/note.txt")
        assert unseen.returncode != 0 and "nonexistent" in unseen.stderr, unseen  # dash's ENOENT

        grant(space, "fso", "session:private1 read")
        time.sleep(1.2)  # the kernel and the view keep an answer for a second
        assert sorted(os.listdir(sessions)) == ["private1"]
        assert as_user(space.user, f"cat {private}").stdout.encode() == before
        forged = as_user(space.user, f"echo forged > {private}")
        assert forged.returncode != 0 and "Permission denied" in forged.stderr, forged

        grant(space, "fso", "session:private1 write")
        time.sleep(1.2)
        assert as_user(space.user, f"echo forged > {private}").returncode == 0
        renamed = as_user(space.user, f"mv {sessions}/private1 {sessions}/p2")
        assert renamed.returncode != 0 and "Permission denied" in renamed.stderr, renamed
    assert events_of(space, "private1").read_text() == "forged\n"


for _mark in NEEDS_A_MOUNT:
    test_the_mount_shows_the_same = _mark(test_the_mount_shows_the_same)
