"""The root-less place A-2 names for the terminal socket: the session's ``terminal/main.sock``
leads to ``/run/cortexfs/terminal/<uid>/<agent>/<session>/main.sock``, an alias of the socket,
while no other root's terminal of that agent, uid and session holds it (SPEC A-2).

Real ``ctx agent start`` runs, a real ``kill -9`` of ctxterm, and a real socket client through
the link.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from cortexfs.agents.terminal_runtime import alias_directory
from tests.agents.test_terminal import Client, fresh_session, pytestmark
from tests.agents.test_terminal_killed import fresh_agent, kill_terminal, start
from tests.agents.test_terminal_roots import other as other
from tests.support.cli import ctx
from tests.tools.support import World

__all__ = ["pytestmark"]  # the terminal tests' conditions: root, bubblewrap, FUSE


def alias_of(world: World, agent: str, session: str) -> Path:
    return alias_directory(world.user.uid, agent, session) / "main.sock"


def test_the_link_leads_through_the_alias_and_both_go_with_the_terminal(world: World) -> None:
    agent, session = fresh_agent(world), fresh_session()
    alias = alias_of(world, agent, session)
    facts = start(world, agent, session)
    try:
        assert os.readlink(str(facts["socket"])) == str(alias)
        assert os.readlink(alias) == facts["listening_at"]
        for level in (alias.parent, alias.parent.parent, alias.parent.parent.parent):
            status = level.stat()
            assert (status.st_uid, status.st_mode & 0o7777) == (0, 0o711), level
        watcher = Client(str(facts["socket"]), "watch")  # the kernel follows both links
        watcher.expect(r"\$ ")
        watcher.socket.close()
    finally:
        stopped = ctx(world.root, "agent", "stop", agent, "--session", session)

    assert stopped.returncode == 0, stopped.stderr
    assert not os.path.lexists(alias)
    assert not alias.parent.parent.exists(), "the agent's alias directory went with its last"


def test_a_stale_alias_is_taken_over(world: World) -> None:
    """An alias leading to a socket that is gone (its terminal's directory was removed by
    hand) is no one's: the next terminal of the session takes it."""
    agent, session = fresh_agent(world), fresh_session()
    alias = alias_of(world, agent, session)
    alias.parent.mkdir(mode=0o711, parents=True)
    alias.symlink_to("/run/cortexfs/terminal/0123456789abcdef/0/gone/gone/main.sock")
    try:
        facts = start(world, agent, session)
        assert os.readlink(alias) == facts["listening_at"]
        assert os.readlink(str(facts["socket"])) == str(alias)
    finally:
        ctx(world.root, "agent", "stop", agent, "--session", session)
    assert not os.path.lexists(alias)


def test_what_is_not_an_alias_is_left_alone(world: World) -> None:
    """A socket where the alias belongs (a terminal of a ctx that kept its sockets there) is
    neither removed nor followed: the link leads to this terminal's own socket."""
    agent, session = fresh_agent(world), fresh_session()
    alias = alias_of(world, agent, session)
    alias.parent.mkdir(mode=0o711, parents=True)
    foreign = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    foreign.bind(str(alias))
    try:
        facts = start(world, agent, session)
        assert os.readlink(str(facts["socket"])) == facts["listening_at"]
        stopped = ctx(world.root, "agent", "stop", agent, "--session", session)
        assert stopped.returncode == 0, stopped.stderr
        assert not os.path.islink(alias) and os.path.exists(alias), "the socket is untouched"
    finally:
        ctx(world.root, "agent", "stop", agent, "--session", session)
        foreign.close()
        alias.unlink()
        for level in (alias.parent, alias.parent.parent):
            level.rmdir()


def test_a_killed_terminals_alias_is_cleaned_up_and_said(world: World) -> None:
    agent, session = fresh_agent(world), fresh_session()
    alias = alias_of(world, agent, session)
    facts = start(world, agent, session)
    try:
        kill_terminal(str(facts["listening_at"]))
        assert os.readlink(alias) == facts["listening_at"], "killed, it left its alias"

        stopped = ctx(world.root, "agent", "stop", agent, "--session", session, "--json")

        assert stopped.returncode == 0, stopped.stderr
        assert f"removed the link {alias}" in json.loads(stopped.stdout)["cleaned"]
        assert not os.path.lexists(alias)
    finally:
        ctx(world.root, "agent", "stop", agent, "--session", session)


def test_the_alias_is_the_first_roots_and_freed_by_its_stop_only(
    world: World, other: World
) -> None:
    agent, session = fresh_agent(world), fresh_session()
    other.agent(agent, tools=["fs.stat"])
    alias = alias_of(world, agent, session)
    first = start(world, agent, session)
    try:
        second = start(other, agent, session)
        assert os.readlink(str(second["socket"])) == second["listening_at"]

        assert ctx(other.root, "agent", "stop", agent, "--session", session).returncode == 0
        assert os.readlink(alias) == first["listening_at"], "not the second's to remove"

        assert ctx(world.root, "agent", "stop", agent, "--session", session).returncode == 0
        assert not os.path.lexists(alias)
        third = start(other, agent, session)
        assert os.readlink(str(third["socket"])) == str(alias), "free again, the next takes it"
        assert os.readlink(alias) == third["listening_at"]
    finally:
        ctx(world.root, "agent", "stop", agent, "--session", session)
        ctx(other.root, "agent", "stop", agent, "--session", session)
    assert not os.path.lexists(alias)
