"""A tool typed at tsh leads the agent's PTY while it runs, as a shell's job does (SPEC H-5,
docs/tools.md "tsh"): tsh lets go of its controlling terminal, the tool starts in a session of
its own with the PTY as its controlling terminal, and tsh takes it back when the tool ends.
So ``bash`` typed at tsh has job control, a program opens ``/dev/tty``, and what a shell left
running in its session is killed with the call.

A real sandbox, FUSE view, PTY and second uid, as in test_terminal.
"""

from __future__ import annotations

import os
import re
import time

from tests.agents.test_terminal import Client, pytestmark, running_terminal
from tests.tools.support import World

__all__ = ["pytestmark"]

# An interactive bash with a prompt of its own, which tells whether job control is on ($-
# holds 'm') and starts a background job in a group of its own.
BASH = "#!/bin/sh\nPS1='bash> ' exec /bin/bash --norc --noprofile -i\n"
# Opens the controlling terminal, which only a process that has one can.
OPENS_TTY = "#!/bin/sh\nif exec 3</dev/tty; then echo tty-opened; else echo no-tty; fi\n"
PROMPT = r"coder\$ "


def started_with(world: World, installed: dict[str, str]) -> None:
    """``installed`` in the system tier, each granted to the agent."""
    for name, program in installed.items():
        world.install(name, program)
    world.agent("coder", tools=list(installed))
    for name in installed:
        world.allow_tool(name)


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_bash_typed_at_tsh_has_job_control_and_its_jobs_end_with_it(world: World) -> None:
    started_with(world, {"sh.bash": BASH, "sh.tty": OPENS_TTY})
    with running_terminal(world, "coder") as facts:
        client = Client(facts["listening_at"], "attach")
        client.expect(PROMPT)
        client.type("sh.bash")
        client.expect("bash> ")
        client.type("echo flags=$- ; sleep 300 & echo job=$!")
        seen = client.expect(r"job=(\d+)")
        assert "no job control" not in seen, seen[-800:]
        flags = re.findall(r"flags=([A-Za-z]+)", seen)
        assert flags and "m" in flags[-1], seen[-800:]
        job = int(re.findall(r"job=(\d+)", seen)[-1])
        assert os.getpgid(job) == job, "a background job of a shell with job control"
        client.type("exit")
        client.expect(PROMPT + r"$", timeout=20)
        assert gone_within(job, 10), f"the shell's background job {job} outlived its call"
        # tsh took the PTY back, and hands it to the next tool as well.
        client.type("sh.tty")
        assert "tty-opened" in client.expect(r"tty-opened|no-tty")
        client.close()


def test_after_a_refused_call_tsh_takes_the_terminal_back_for_the_next(world: World) -> None:
    started_with(world, {"sh.tty": OPENS_TTY, "sh.vetoed": OPENS_TTY})
    veto = world.root / "tool" / "sh.vetoed.d" / "hooks" / "pre.d" / "10-veto"
    veto.parent.mkdir(parents=True, exist_ok=True)
    veto.write_text("#!/bin/sh\nexit 1\n")
    veto.chmod(0o755)
    with running_terminal(world, "coder") as facts:
        client = Client(facts["listening_at"], "attach")
        client.expect(PROMPT)
        client.type("sh.vetoed")
        client.expect(r"sh.vetoed: [^\n]*vetoed the call[^\n]*\n")
        client.expect(PROMPT)
        client.type("sh.tty")
        seen = client.expect(r"tty-opened|no-tty")
        assert "tty-opened" in seen, seen[-800:]
        assert "cannot take the terminal back" not in seen, seen[-800:]
        client.close()
