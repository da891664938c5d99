"""Terminals of different storage roots (SPEC R-1, A-2): an agent named alike in two roots is
two agents, and each command reaches its own root's terminal only.

Real ``ctx agent start`` runs in two bootstrapped roots, the same agent and session names in
both.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cortexfs.agents.terminal_runtime import alias_directory, root_key, run_directory
from cortexfs.agents.terminal_socket import listening
from tests.agents.test_terminal import fresh_session, lifecycle, pytestmark
from tests.support.cli import ctx
from tests.tools.support import World, bootstrapped_root

__all__ = ["pytestmark"]  # the terminal tests' conditions: root, bubblewrap, FUSE


@pytest.fixture
def other(world: World, traversable_tmp: Path) -> World:
    """A second storage root beside ``world``'s, with the same user and workspace."""
    root = bootstrapped_root(traversable_tmp / "other-storage")
    scratch = traversable_tmp / "other-scratch"
    scratch.mkdir()
    return World(root, world.user, world.workspace, scratch)


@pytest.fixture
def both_running(world: World, other: World) -> Iterator[tuple[str, dict, dict]]:
    """The terminal of ``coder`` in the same session of both roots."""
    session = fresh_session()
    facts = []
    try:
        for each in (world, other):
            each.agent("coder", tools=["fs.stat"])
            started = ctx(each.root, "agent", "start", "coder", "--session", session, "--json")
            assert started.returncode == 0, started.stderr
            facts.append(json.loads(started.stdout))
        yield session, facts[0], facts[1]
    finally:
        for each in (world, other):
            ctx(each.root, "agent", "stop", "coder", "--session", session)


def test_the_same_agent_and_session_run_in_two_roots(
    world: World, other: World, both_running: tuple[str, dict, dict]
) -> None:
    session, first, second = both_running

    assert first["listening_at"] != second["listening_at"]
    for each, facts in ((world, first), (other, second)):
        link = Path(facts["socket"])
        assert link.is_relative_to(each.root), "the A-2 path is in the terminal's own root"
        assert listening(Path(facts["listening_at"]))
    # A-2's root-less place is the first one's; the second's link leads to its own socket.
    alias = alias_directory(world.user.uid, "coder", session) / "main.sock"
    assert os.readlink(first["socket"]) == str(alias)
    assert os.readlink(alias) == first["listening_at"]
    assert os.readlink(second["socket"]) == second["listening_at"]


def test_stop_ends_its_own_roots_terminal_only(
    world: World, other: World, both_running: tuple[str, dict, dict]
) -> None:
    session, first, second = both_running
    (second_started,) = [e for e in lifecycle(other, session) if e["type"] == "terminal.started"]

    stopped = ctx(other.root, "agent", "stop", "coder", "--session", session, "--json")

    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["pid"] == second_started["pid"]
    assert not Path(second["listening_at"]).exists()
    assert listening(Path(first["listening_at"])), "the other root's terminal runs on"
    assert [e["type"] for e in lifecycle(world, session)] == ["terminal.started"]
    again = ctx(other.root, "agent", "stop", "coder", "--session", session)
    assert again.returncode == 1 and "ENOENT" in again.stderr, again.stderr
    first_stopped = ctx(world.root, "agent", "stop", "coder", "--session", session)
    assert first_stopped.returncode == 0, first_stopped.stderr


def test_watch_reaches_no_other_roots_terminal(world: World, other: World) -> None:
    session = fresh_session()
    world.agent("coder", tools=["fs.stat"])
    other.agent("coder", tools=["fs.stat"])
    started = ctx(world.root, "agent", "start", "coder", "--session", session)
    assert started.returncode == 0, started.stderr
    try:
        watched = ctx(other.root, "agent", "watch", "coder", "--session", session, timeout=20)
        attached = ctx(other.root, "agent", "attach", "coder", "--session", session, timeout=20)
    finally:
        stopped = ctx(world.root, "agent", "stop", "coder", "--session", session)

    for refused in (watched, attached):
        assert refused.returncode == 1 and "ENOENT" in refused.stderr, refused.stderr
        assert "coder$" not in refused.stdout
    assert stopped.returncode == 0, stopped.stderr
    assert not run_directory(world.root, world.user.uid, "coder", session).parent.exists()


def test_a_root_reached_through_a_link_is_the_same_root(world: World) -> None:
    link = world.scratch / "current"
    link.symlink_to(world.root)

    assert root_key(link) == root_key(world.root)
    assert run_directory(link, 1000, "coder", "s") == run_directory(world.root, 1000, "coder", "s")
    assert root_key(world.scratch) != root_key(world.root)
