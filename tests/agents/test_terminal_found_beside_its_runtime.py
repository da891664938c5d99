"""A running terminal is found where its runtime directory alone would not show it, and is
neither doubled nor cleaned up after as if it had died (SPEC A-1, A-2; docs/tools.md "The
terminal socket", "A terminal that was killed").

* A storage root moved while its terminal runs: the terminal's directory is under the root's
  old key, so a start on the new path finds its own lock free.  The session's link still
  leads, through the alias, to the terminal that runs: the start is ``EEXIST`` and touches
  nothing — not the link, not the log, not the terminal.
* A pid file others may write, or not root's, is never believed; the terminal that holds the
  directory open is still found by it, listed by ``ctx agent show`` and ended by ``ctx agent
  stop``.  With no pid file at all, the terminal is still starting: nothing is signalled.

Real ``ctx agent start`` runs, a real ``mv`` of the root, a real terminal's pid file.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cortexfs.agents.terminal_runtime import RunDirectory, alias_directory, run_directory
from cortexfs.agents.terminal_socket import running_terminals
from tests.agents.test_terminal import fresh_session, lifecycle, pytestmark
from tests.agents.test_terminal_killed import fresh_agent, gone, start
from tests.support.cli import ctx
from tests.tools.support import World

__all__ = ["pytestmark"]  # the terminal tests' conditions: root, bubblewrap, FUSE


@contextlib.contextmanager
def moved(world: World) -> Iterator[Path]:
    """The world's storage root renamed for the block, and put back at the end."""
    to = world.root.parent / "moved"
    os.rename(world.root, to)
    try:
        yield to
    finally:
        os.rename(to, world.root)


def test_a_start_on_the_path_the_root_was_moved_to_is_eexist_and_touches_nothing(
    world: World,
) -> None:
    agent, session = fresh_agent(world), fresh_session()
    facts = start(world, agent, session)
    alias = alias_directory(world.user.uid, agent, session) / "main.sock"
    pid = int((Path(str(facts["listening_at"])).parent / "pid").read_text())
    try:
        with moved(world) as root:
            link = root / Path(str(facts["socket"])).relative_to(world.root)
            log = root / "agent" / f"{agent}.d" / "log"
            log_before = log.read_bytes()

            again = ctx(root, "agent", "start", agent, "--session", session, "--json")

            assert again.returncode == 1, again.stdout + again.stderr
            refusal = json.loads(again.stdout)
            assert (refusal["error"], refusal["errno"]) == ("EEXIST", errno.EEXIST), refusal
            assert refusal["message"].startswith(
                f"the terminal of {agent} in session {session} still runs (it answers at "
                f"{alias}), but it was started when the storage root {root} was reached by "
                "another path: "
            ), refusal
            assert "Traceback" not in again.stderr
            assert os.readlink(link) == str(alias)
            assert os.readlink(alias) == facts["listening_at"]
            assert log.read_bytes() == log_before
            assert not os.path.lexists(run_directory(root, world.user.uid, agent, session))
            assert not gone(pid)
    finally:
        stopped = ctx(world.root, "agent", "stop", agent, "--session", session)
    assert stopped.returncode == 0, stopped.stderr
    ends = [e for e in lifecycle(world, session, agent) if e["type"] == "terminal.stopped"]
    assert [e["reason"] for e in ends] == ["stop"], ends


@pytest.mark.parametrize("loosened", ["writable-by-others", "owned-by-the-agent"])
def test_a_pid_file_not_believed_still_finds_the_terminal_holding_its_directory(
    world: World, loosened: str
) -> None:
    agent, session = fresh_agent(world), fresh_session()
    facts = start(world, agent, session)
    run = RunDirectory(world.root, world.user.uid, agent, session)
    pid = int(run.pid_file.read_text())
    if loosened == "writable-by-others":
        run.pid_file.chmod(0o666)
    else:
        os.chown(run.pid_file, world.user.uid, world.user.gid)
    try:
        assert run.recorded_pid() is None  # never signalled for what the file says
        assert run.terminal_pid() == pid
        assert [(t.session, t.pid) for t in running_terminals(world.root, agent)] == [
            (session, pid)
        ]
        shown = ctx(world.root, "agent", "show", agent, "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["terminals"] == [
            {"session": session, "uid": world.user.uid, "pid": pid}
        ]
    finally:
        stopped = ctx(world.root, "agent", "stop", agent, "--session", session, timeout=15)
    assert stopped.returncode == 0, stopped.stderr
    assert f"(pid {pid})" in stopped.stdout, stopped.stdout
    assert gone(pid) and not os.path.lexists(facts["listening_at"])


def test_a_directory_held_without_a_pid_file_is_a_terminal_still_starting(
    world: World,
) -> None:
    """Until ctxterm records its pid, the holder of the lock is not looked for: a stop waits
    for the pid rather than end a start half-way."""
    run = RunDirectory(world.root, world.user.uid, fresh_agent(world), fresh_session())
    run.make_and_lock()  # this process holds it, as a start does before it records its pid
    try:
        assert run.terminal_pid() is None
        run.pid_file.write_text("1")
        run.pid_file.chmod(0o666)  # a pid file not believed: the holder is looked for
        assert run.terminal_pid() == os.getpid()
    finally:
        run.remove()
        run.release()
