"""What bounds an agent terminal's clients (SPEC A-2): how many connections whatever runs as
the agent may hold, how much typed input the terminal keeps, and what it does when it has no
descriptor left.  Needs root, bubblewrap and FUSE, as the terminal itself does."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.agents.test_terminal import Client, calling_in_terminal, running_terminal
from tests.agents.test_terminal import pytestmark as pytestmark  # root, bubblewrap, FUSE
from tests.tools.support import World

_WATCHERS = (
    "import socket, sys\n"
    "held = []\n"
    "for _ in range(64):\n"
    "    s = socket.socket(socket.AF_UNIX)\n"
    "    s.connect(sys.argv[1])\n"
    "    s.sendall(b'watch\\n')\n"
    "    held.append(s)\n"
    "extra = socket.socket(socket.AF_UNIX)\n"
    "extra.connect(sys.argv[1])\n"
    "extra.settimeout(20)\n"
    "print(extra.recv(4096).decode(), end='', flush=True)\n"
    "sys.stdin.read()\n"
)


def test_whatever_runs_as_the_agent_cannot_keep_its_operator_out(world: World) -> None:
    """The agent's uid may watch, so its processes could hold every connection; they hold
    at most 64, the next one is told EAGAIN, and root still attaches."""
    world.agent("coder", tools=["fs.stat"])
    world.allow_tool("fs.stat")
    with running_terminal(world, "coder") as facts:
        watchers = subprocess.Popen(
            [sys.executable, "-c", _WATCHERS, facts["listening_at"]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            user=world.user.uid,
            group=world.user.gid,
            extra_groups=[],
        )
        try:
            assert watchers.stdout is not None
            refused = watchers.stdout.readline()

            operator = Client(facts["listening_at"], "attach")
            operator.expect(r"coder\$ ")
            operator.close()
        finally:
            watchers.kill()
            watchers.wait()

    assert refused.startswith("ctxterm: EAGAIN: the terminal serves 64 clients"), refused


def _pour(client: socket.socket, sent: list[int]) -> None:
    """Send until the terminal stops reading for five seconds."""
    client.settimeout(5)
    chunk = b"x" * 65536
    with contextlib.suppress(OSError):
        while sent[0] < 64 << 20:
            sent[0] += client.send(chunk)


def _discard_output(client: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while client.recv(1 << 20):
            pass


def test_a_client_attaching_while_input_is_held_waits_too(world: World) -> None:
    """A tool that reads nothing: the PTY fills, the terminal keeps at most 64 KiB of typed
    input, and what any attached client sends beyond it waits in its own connection — a
    client that attached after the holding began included."""
    program = "#!/bin/sh\nstty raw -echo\nsleep 120\n"  # raw: nothing typed is dropped
    with calling_in_terminal(world, "deaf", "sh.deaf", program) as (facts, first):
        time.sleep(2)  # the tool owns the PTY now
        threading.Thread(target=_discard_output, args=(first.socket,), daemon=True).start()
        _pour(first.socket, [0])  # until the terminal holds what attached clients send
        second = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        second.connect(facts["listening_at"])
        second.sendall(b"attach\n")
        threading.Thread(target=_discard_output, args=(second,), daemon=True).start()

        sent = [0]
        _pour(second, sent)

        second.close()
        first.close()
    assert sent[0] < 4 << 20, f"the terminal took {sent[0] >> 20} MiB from the second client"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_out_of_descriptors_the_terminal_rests_then_serves_again(world: World) -> None:
    world.agent("coder", tools=["fs.stat"])
    world.allow_tool("fs.stat")
    with running_terminal(world, "coder") as facts:
        pid = int(Path(facts["listening_at"]).parent.joinpath("pid").read_text())
        in_use = len(os.listdir(f"/proc/{pid}/fd"))
        subprocess.run(["prlimit", f"--pid={pid}", f"--nofile={in_use + 1}:"], check=True)
        waiting = []
        for _ in range(3):  # the first takes the last descriptor, the others stay queued
            client = socket.socket(socket.AF_UNIX)
            client.connect(facts["listening_at"])
            waiting.append(client)
        time.sleep(0.5)
        before = _cpu_seconds(pid)
        time.sleep(3)
        spent = _cpu_seconds(pid) - before
        subprocess.run(["prlimit", f"--pid={pid}", "--nofile=1024:"], check=True)
        for client in waiting:
            client.close()

        late = Client(facts["listening_at"], "attach")
        late.expect(r"coder\$ ")
        late.close()
    assert spent < 0.5, f"the terminal spun: {spent:.2f} s of CPU in 3 s"


def test_a_run_socket_peer_that_sends_nothing_does_not_stall_the_terminal(world: World) -> None:
    world.agent("coder", tools=["fs.stat"])
    world.allow_tool("fs.stat")
    with running_terminal(world, "coder") as facts:
        run_socket = Path(facts["listening_at"]).parent / "private" / "run.sock"
        silent = [socket.socket(socket.AF_UNIX) for _ in range(8)]
        for connection in silent:
            connection.connect(str(run_socket))
        time.sleep(0.5)  # the terminal has taken the connections; their messages never come

        watcher = Client(facts["listening_at"], "watch")
        watcher.expect(r"coder\$ ", timeout=5)  # not after 8 waits of 2 s each

        for connection in silent:
            connection.settimeout(10)
            assert connection.recv(4096) == b"", "a connection that said nothing is dropped"
            connection.close()
        watcher.close()
