"""A storage root whose ``agent/`` is a symbolic link (SPEC R-2, A-3): never followed, by
``ctx agent list`` and ``show`` as by ``ctx agent create``, and each says so."""

from __future__ import annotations

import json
import os

import pytest

from tests.support.cli import ctx
from tests.tools.support import World


@pytest.fixture
def linked(world: World) -> World:
    """Agent coder made, then ``agent/`` moved away and a link to it put in its place."""
    world.agent("coder")
    elsewhere = world.scratch / "agents"
    os.rename(world.root / "agent", elsewhere)
    (world.root / "agent").symlink_to(elsewhere)
    return world


def said_about_the_link(world: World) -> str:
    return f"{world.root}/agent is a symbolic link, never followed"


def test_list_refuses_the_link_as_create_does(linked: World) -> None:
    """Not an empty list with exit 0, nor the agents of the tree the link leads to."""
    there = sorted(os.listdir(linked.scratch / "agents"))

    listed = ctx(linked.root, "agent", "list", "--json")
    made = ctx(linked.root, "agent", "create", "-", "--json", stdin='{"name": "b", "label": "b_t"}')

    for refused in (listed, made):
        assert refused.returncode == 1, refused
        error = json.loads(refused.stdout)
        assert error["error"] == "ELOOP", error
        assert said_about_the_link(linked) in error["message"], error
        assert "put the directory the link leads to in its place" in error["message"], error
    assert sorted(os.listdir(linked.scratch / "agents")) == there


def test_show_says_the_agent_is_none_of_this_root_naming_the_link(linked: World) -> None:
    """ENOENT, as for an entry that is a link: never "agent/coder does not exist", which it
    does, through the link."""
    shown = ctx(linked.root, "agent", "show", "coder", "--json")

    assert shown.returncode == 1, shown
    error = json.loads(shown.stdout)
    assert error["error"] == "ENOENT", error
    assert error["message"].startswith(f"there is no agent 'coder' in {linked.root}: "), error
    assert said_about_the_link(linked) in error["message"], error
    assert "does not exist" not in error["message"], error
