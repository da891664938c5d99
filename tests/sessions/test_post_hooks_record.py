"""A call's record lists its failed post-hooks within a bound, so that however many fail its
tool_result is still one event a session and the tool's log take (SPEC S-2, S-5, T-6, T-7)."""

from __future__ import annotations

import os

import pytest

from cortexfs.shared.events import MAX_EVENT_BYTES, encode_event
from cortexfs.tools.record import LOGGED_POST_HOOKS, LOGGED_POST_HOOKS_BYTES
from tests.tools.support import World

FAILING = 220


@pytest.fixture
def hooked(world: World) -> World:
    world.install("echo", "#!/bin/sh\ncat\n")
    world.agent("coder", tools=["echo"])
    world.allow_tool("echo")
    return world


def failing_post_hooks(world: World, names: list[bytes]) -> None:
    """Post-hooks of ``echo`` named ``names``, each a link to nothing: a hook that fails."""
    post = os.fsencode(world.root / "tool/echo.d/hooks/post.d")
    for name in names:
        os.symlink(b"/nonexistent", os.path.join(post, name))


def test_many_failed_post_hooks_leave_a_result_listing_the_first_and_counting_the_rest(
    hooked: World,
) -> None:
    failing_post_hooks(hooked, [b"h%03d" % number + b"x" * 236 for number in range(FAILING)])

    result = hooked.run("echo", {"y": 2})

    assert result.ok and len(result.post_hooks) == FAILING  # the caller is told of all
    (call, recorded) = [e for e in hooked.events() if e.get("call") == result.call]
    (logged,) = [e for e in hooked.tool_log("echo") if e.get("call") == result.call]
    assert (call["type"], recorded["type"]) == ("tool_call", "tool_result")
    for record in (recorded, logged):
        assert [(h["hook"], h["exit_status"]) for h in record["post_hooks"]] == [
            (h["hook"], h["exit_status"]) for h in result.post_hooks[:LOGGED_POST_HOOKS]
        ]
        assert record["post_hooks_unlisted"] == FAILING - LOGGED_POST_HOOKS


def test_the_failed_post_hooks_listed_take_a_bounded_number_of_bytes(hooked: World) -> None:
    """Names of 255 bytes that are not UTF-8, each written as the four characters \\xNN:
    fewer of them are listed, and the record stays far from the longest event."""
    failing_post_hooks(hooked, [bytes([number]) + b"\xff" * 254 for number in range(65, 95)])

    result = hooked.run("echo", {"y": 2})

    assert result.ok and len(result.post_hooks) == 30
    (recorded,) = [e for e in hooked.events() if e["type"] == "tool_result"]
    listed = recorded["post_hooks"]
    assert 1 <= len(listed) < LOGGED_POST_HOOKS
    assert recorded["post_hooks_unlisted"] == 30 - len(listed)
    assert len(encode_event({"ts": "", "post_hooks": listed})) <= LOGGED_POST_HOOKS_BYTES + 64
    assert len(encode_event(recorded)) < MAX_EVENT_BYTES // 2
