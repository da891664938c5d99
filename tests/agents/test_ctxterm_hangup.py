"""A foreground ``ctxterm`` ends on SIGHUP, as its --help says: the controlling terminal of a
foreground ctxterm went away, and the agent's terminal goes with it."""

from __future__ import annotations

import signal

from tests.agents.test_ctxterm import start_ctxterm
from tests.agents.test_terminal import Client, fresh_session, lifecycle, pytestmark
from tests.tools.support import World

__all__ = ["pytestmark"]


def test_sighup_ends_a_foreground_ctxterm(world: World) -> None:
    world.agent("coder", tools=[])
    session = fresh_session()
    process, facts = start_ctxterm(world, session)
    try:
        Client(str(facts["listening_at"]), "watch").expect(r"coder\$ ")

        process.send_signal(signal.SIGHUP)

        assert process.wait(timeout=30) == 128 + signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert lifecycle(world, session)[-1]["type"] == "terminal.stopped", lifecycle(world, session)
