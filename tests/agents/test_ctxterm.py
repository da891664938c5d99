"""``bin/ctxterm``: an agent terminal served in the foreground (SPEC H-1, A-1, A-2).

The same real sandbox, FUSE view, PTY and second uid as ``ctx agent start``
(tests/agents/test_terminal.py); here the terminal lives in the ctxterm process itself, which
returns tsh's exit status when the terminal ends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.agents.test_terminal import Client, fresh_session, lifecycle, pytestmark
from tests.support.cli import ctx
from tests.tools.support import World

__all__ = ["pytestmark"]


def start_ctxterm(world: World, session: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
    """``bin/ctxterm coder --session SESSION --json`` in the foreground, and what it printed."""
    env = {key: value for key, value in os.environ.items() if key != "CTX_STORAGE"}
    process = subprocess.Popen(
        [world.root / "bin/ctxterm", "coder", "--session", session, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=world.workspace,
        env=env,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, process.communicate(timeout=30)
    return process, json.loads(line)


def test_ctxterm_serves_the_terminal_in_the_foreground_until_tsh_exits(world: World) -> None:
    world.agent("coder", tools=["fs.stat"])
    world.allow_tool("fs.stat")
    session = fresh_session()

    process, facts = start_ctxterm(world, session)
    try:
        assert facts["pid"] == process.pid, "the terminal is served by ctxterm itself"
        assert Path(f"/proc/{process.pid}/comm").read_text() == "ctxterm\n"
        client = Client(str(facts["listening_at"]), "attach")
        client.expect(r"coder\$ ")
        client.type("fs.stat /workspace")
        client.expect(r"type: directory[\s\S]*coder\$ ")
        assert process.poll() is None, "ctxterm stays in the foreground while tsh runs"
        client.type("exit 3")

        assert process.wait(timeout=30) == 3
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not Path(str(facts["listening_at"])).exists()
    assert str(Path(str(facts["listening_at"])).parent) not in Path("/proc/self/mounts").read_text()
    started, stopped = lifecycle(world, session)
    assert (started["type"], started["pid"]) == ("terminal.started", process.pid)
    assert (stopped["reason"], stopped["exit_status"]) == ("exit", 3)
    calls = [e for e in world.events("coder", session) if e["type"] == "tool_call"]
    assert [e["argv"] for e in calls] == [["/workspace"]]


def test_ctx_agent_stop_and_ctrl_c_end_a_foreground_ctxterm(world: World) -> None:
    world.agent("coder", tools=[])
    for stop in ("ctx agent stop", "SIGINT"):
        session = fresh_session()
        process, facts = start_ctxterm(world, session)
        try:
            Client(str(facts["listening_at"]), "watch").expect(r"coder\$ ")
            if stop == "SIGINT":
                process.send_signal(signal.SIGINT)
            else:
                stopped = ctx(world.root, "agent", "stop", "coder", "--session", session)
                assert stopped.returncode == 0, stopped.stderr
            # The stop kills tsh: its status as a shell reports it, 128 + SIGKILL, not the
            # low byte of a negative return code (247).
            assert process.wait(timeout=30) == 128 + signal.SIGKILL, stop
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        deadline = time.monotonic() + 10
        while Path(str(facts["listening_at"])).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(str(facts["listening_at"])).exists(), stop
        assert lifecycle(world, session)[-1]["reason"] == "stop", stop


def test_ctxterm_refuses_what_ctx_agent_start_refuses(world: World) -> None:
    world.agent("coder", tools=[])
    session = fresh_session()
    process, _ = start_ctxterm(world, session)
    try:
        twice = subprocess.run(
            [world.root / "bin/ctxterm", "coder", "--session", session],
            capture_output=True,
            text=True,
            cwd=world.workspace,
        )
        unknown = subprocess.run(
            [world.root / "bin/ctxterm", "nobody"], capture_output=True, text=True, cwd="/"
        )
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)

    assert twice.returncode == 1 and twice.stderr.startswith("ctxterm: EEXIST: ")
    assert unknown.returncode == 1 and unknown.stderr.startswith("ctxterm: ENOENT: ")


def test_ctxterm_command_line_reads_as_ctxs_does(world: World) -> None:
    """-h is help as for ctx and ctxmcp; a malformed command line is EINVAL, exit 2."""

    def ctxterm(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [world.root / "bin/ctxterm", *args], capture_output=True, text=True, cwd="/"
        )

    short_help = ctxterm("-h")
    assert short_help.returncode == 0, short_help.stderr
    assert short_help.stdout.startswith("Usage: ctxterm [OPTIONS] AGENT")
    assert ctxterm("--version").returncode == 0
    for args, message in (
        ((), "Missing argument 'AGENT'."),
        (("coder", "--bogus"), "No such option '--bogus'."),
    ):
        refused = ctxterm(*args)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.endswith(f"ctxterm: EINVAL: {message}\n"), refused.stderr


def test_the_process_takes_the_name_ctxterm_whatever_prctl_was_set_up_for_before() -> None:
    """cortexfs.libc's shared prctl gives the C library's prctl integer argument types;
    naming the process must not depend on who called prctl first."""
    script = (
        "from cortexfs.libc import prctl; prctl()\n"
        "from cortexfs.agents.ctxterm import take_the_name; take_the_name()\n"
        "print(open('/proc/self/comm').read(), end='')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "ctxterm\n"), done.stderr
