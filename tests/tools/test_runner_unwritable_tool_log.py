"""A tool's log that refuses a call's line, its session having taken it (SPEC T-7, S-2, S-5;
docs/tools.md stage ``record``): the call is an error, and what is said of it names what
lacks the call, the tool's log, and what holds it, the session, never the other way round."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest

from cortexfs.errors import CtxError
from cortexfs.shared.sessions import SessionRef
from cortexfs.tools.record import _open_tool_log
from tests.support.storage import attribute
from tests.support.users import UnprivilegedUser
from tests.tools.support import World, effective_user

CTX = str(Path(sys.executable).with_name("ctx"))

SAY = """#!/bin/sh
echo said
"""


@pytest.fixture
def coder(world: World) -> World:
    world.install("say", SAY)
    world.agent("coder", tools=["say"])
    world.allow_tool("say")
    return world


def _session_name(world: World, session: str) -> str:
    return str(SessionRef.home(world.root, world.user.uid, "coder", session))


def test_a_result_its_session_holds_is_recorded_and_only_the_log_is_missing(
    coder: World,
) -> None:
    log = coder.root / "tool" / "say.d" / "log"
    with attribute(log, "i"):
        result = coder.run("say", session="imm")

    assert (result.status, result.exit_status, result.output) == ("error", 0, "said\n")
    assert result.recorded, result
    assert result.record_error is not None and result.record_error.errno == errno.EPERM
    assert result.record_error.message == (
        f"cannot open the tool's log {log}: Operation not permitted"
    )
    assert result.error is not None and result.error.stage == "record", result.error
    assert result.error.message.endswith(f"; session {_session_name(coder, 'imm')} holds it")
    ended = [e for e in coder.events(session="imm") if e["call"] == result.call]
    assert [e["type"] for e in ended] == ["tool_call", "tool_result"], ended
    assert all(line["call"] != result.call for line in coder.tool_log("say"))


def test_frames_lost_then_say_the_session_holds_the_call_and_the_log_does_not(
    coder: World,
) -> None:
    log = coder.root / "tool" / "say.d" / "log"
    with attribute(log, "i"), open("/dev/full", "wb") as full:
        done = subprocess.run(
            [CTX, "run", "--native", "--agent", "coder", "--session", "imm", "say"],
            input=b"{}",
            stdout=full,
            stderr=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "CTX_STORAGE": str(coder.root)},
            timeout=60,
        )

    assert done.returncode == 74, done.stderr
    assert done.stderr.decode() == (
        "ctx: ENOSPC: cannot write standard output (No space left on device); say was killed "
        "before it was given its input (its process had started); the call is recorded in "
        f"session {_session_name(coder, 'imm')}, but not in the tool's log (EPERM: cannot "
        f"open the tool's log {log}: Operation not permitted)\n"
    )
    (result,) = [e for e in coder.events(session="imm") if e["type"] == "tool_result"]
    assert (result["errno"], result["stage"]) == ("ENOSPC", "output"), result


def test_a_control_directory_the_host_may_not_open_is_a_refusal_naming_it(
    coder: World, unprivileged_user: UnprivilegedUser
) -> None:
    """A tool whose control directory the recording process may not enter has a log all the
    same: the kernel's refusal is named (the call cannot be logged, T-7), never read as a
    tool without a log, whose calls would go unlogged without a word."""
    (coder.root / "tool" / "say.d").chmod(0o700)
    with effective_user(unprivileged_user), pytest.raises(CtxError) as refused:
        _open_tool_log(coder.root, PurePosixPath("tool/say.d/log"))
    assert refused.value.errno == errno.EACCES, refused.value
    assert "say.d" in refused.value.message, refused.value
