"""``agent.update`` whose record the agent's log cannot take (SPEC A-5, S-3): refused with
nothing changed, as the host's refusal (exit 1), never as the caller's bad input."""

from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path

import pytest

from tests.support.storage import attribute
from tests.tools.support import World

UPDATE = {"control": "system.md", "content": "second\n"}


@pytest.fixture
def updater(world: World) -> World:
    """Agent coder may run agent.update, and has updated its system.md once."""
    world.agent("coder", tools=["agent.update"])
    world.allow_tool("agent.update")
    first = world.run("agent.update", {"control": "system.md", "content": "first\n"})
    assert first.ok, first.error
    return world


def controls(world: World) -> Path:
    return world.root / "agent" / "coder.d"


def refused_unchanged(world: World, code: int) -> str:
    """Run the update; check it was refused with ``code`` (exit 1) and changed nothing, and
    return the host's message."""
    result = world.run("agent.update", UPDATE)
    assert not result.ok and result.error is not None, result.output
    assert result.output["error"] == errno.errorcode[code], result.output
    assert result.exit_status == 1, result
    assert (controls(world) / "system.md").read_text() == "first\n"
    assert not [name for name in os.listdir(controls(world)) if name.endswith(".tmp")]
    message = result.output["message"]
    assert message.startswith(
        "system.md was left unchanged, for its update could not be recorded: "
    )
    return message


def test_a_directory_at_the_logs_name_refuses_the_update_with_eisdir(updater: World) -> None:
    log = controls(updater) / "log"
    log.unlink()
    log.mkdir()

    message = refused_unchanged(updater, errno.EISDIR)

    assert f"{log} is not a regular file; refusing to append to it; have the host" in message
    assert "move it aside" in message


@pytest.mark.parametrize("kind", ["symbolic-link", "fifo", "socket", "hard-link"])
def test_anything_else_that_is_no_log_of_its_own_refuses_it_unmade(
    updater: World, kind: str
) -> None:
    """A link is never followed (ELOOP); a FIFO, a socket or a file with a second name is in
    the way (EEXIST): the host's tree, not the caller's input (which EINVAL would say)."""
    log = controls(updater) / "log"
    elsewhere = updater.scratch / "elsewhere.log"
    elsewhere.write_text("")
    log.unlink()
    if kind == "symbolic-link":
        log.symlink_to(elsewhere)
    elif kind == "fifo":
        os.mkfifo(log, 0o640)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as bound:
            bound.bind(str(log))
    else:
        os.link(elsewhere, log)

    code = errno.ELOOP if kind == "symbolic-link" else errno.EEXIST
    message = refused_unchanged(updater, code)

    assert str(log) in message
    assert elsewhere.read_text() == ""


def test_an_immutable_log_refuses_it_naming_the_attribute(updater: World) -> None:
    """The kernel's bare EPERM would leave the reader to guess: the answer names the log, its
    attribute and the chattr that lifts it, and the host answers (no lost answer, EIO)."""
    log = controls(updater) / "log"
    recorded = log.read_bytes()

    with attribute(log, "i"):
        message = refused_unchanged(updater, errno.EPERM)

    assert f"{log} is immutable (attribute 'i', which 'lsattr' shows)" in message
    assert f"'chattr -i {log}'" in message
    assert log.read_bytes() == recorded


def test_an_append_only_log_takes_the_update_and_its_record(updater: World) -> None:
    """Append-only is what a log needs: the update is made and recorded."""
    log = controls(updater) / "log"

    with attribute(log, "a"):
        result = updater.run("agent.update", UPDATE)

    assert result.ok, result.error
    assert (controls(updater) / "system.md").read_text() == "second\n"
    assert log.read_text().splitlines()[-1].startswith('{"ts":')
    assert '"control":"system.md"' in log.read_text().splitlines()[-1]
    assert stat.S_ISREG(log.lstat().st_mode)
