"""A damaged ``agent/<name>.d/identity`` is reported naming the file and what is wrong with it in
plain words, by every command that needs it (SPEC P-5 step 1, A-3)."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import ctx
from tests.tools.support import World

DAMAGE = {
    "a NUL byte": (
        b'{"uid": 1,\0 "gid": 1, "groups": []}\n',
        "it holds a NUL byte (byte 10), so it is not text",
    ),
    "not UTF-8": (b'{"uid": 1, "gid": 1, "groups": ["\xff"]}\n', "byte 33 is not UTF-8 text"),
    "cut short": (b'{"uid": 1, "gid"', "Expecting ':' delimiter at line 1, column 17"),
    "empty": (b"", "it is empty"),
}


@pytest.fixture
def coder(world: World) -> World:
    world.agent("coder", tools=["fs.list"])
    world.allow_tool("fs.list")
    return world


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_call_names_the_identity_and_what_is_wrong_with_it(coder: World, damage: str) -> None:
    data, reason = DAMAGE[damage]
    (coder.root / "agent/coder.d/identity").write_bytes(data)

    native = ctx(coder.root, "run", "--agent", "coder", "--native", "fs.list", stdin="{}")
    show = ctx(coder.root, "agent", "show", "coder")

    said = f"agent/coder.d/identity is invalid: not JSON: {reason}"
    error = json.loads(native.stdout.splitlines()[-1])["error"]
    assert (error["error"], error["message"]) == ("EACCES", said)
    assert show.stderr == f"ctx: EACCES: {said}\n"
    assert "codec" not in native.stdout + show.stderr


@pytest.mark.parametrize("damage", ["a NUL byte", "missing"])
def test_session_show_says_which_file_to_fix(coder: World, damage: str) -> None:
    identity = coder.root / "agent/coder.d/identity"
    if damage == "missing":
        identity.unlink()
        said = "agent 'coder' has no identity (agent/coder.d/identity is missing)"
    else:
        identity.write_bytes(DAMAGE[damage][0])
        said = f"agent/coder.d/identity is invalid: not JSON: {DAMAGE[damage][1]}"

    show = ctx(coder.root, "session", "show", "coder")

    assert show.returncode == 1, show.stderr
    assert show.stderr == (
        f"ctx: EACCES: cannot tell agent 'coder''s uid: {said}; fix "
        "agent/coder.d/identity, or give --uid\n"
    )
