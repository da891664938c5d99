"""A call whose caller was asked to stop (SIGTERM, SIGHUP, SIGINT to ``ctx run``) ends as
stopped, whatever the tool then exited with (T-3; docs/tools.md "Agent native mode and its
frames"): in terminal mode the signal is passed on and the tool may handle it, and "either
way" the call is ``EINTR`` at stage ``run`` with the tool's exit status, ``ctx run`` exiting
128 + the signal's number; a tool that cleans up and exits 0 is no exception.  In native mode
the group is killed, to the same end.  A Ctrl-C a terminal's call passes on with no grace
(tsh) stays the interactive tool's to take and go on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tools.support import World

CTX = str(Path(sys.executable).with_name("ctx"))

# Says it is ready on stderr (a frame in native mode, where stdout is captured), then waits;
# a signal it is given makes it clean up and exit 0.
GRACEFUL = """#!/bin/sh
trap 'echo cleaned; exit 0' TERM HUP INT
echo started >&2
sleep 30 &
wait
"""


@pytest.fixture
def graceful(world: World) -> World:
    world.install("graceful", GRACEFUL)
    world.agent("coder", tools=["graceful"])
    world.allow_tool("graceful")
    return world


def _stopped_once_started(world: World, signum: int, *options: str) -> tuple[int, str, str]:
    """``ctx run [OPTIONS] --agent coder --session stop graceful``, sent ``signum`` once the
    tool said it started; its exit status, stdout and the rest of its stderr."""
    native = "--native" in options
    given = world.scratch / "input.json"
    given.write_text("{}")
    with given.open("rb") as stdin:
        proc = subprocess.Popen(
            [CTX, "run", *options, "--agent", "coder", "--session", "stop", "graceful"],
            stdin=stdin if native else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "CTX_STORAGE": str(world.root)},
        )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        if native:
            frames: list[dict] = []
            while not frames or (frames[-1]["type"], frames[-1].get("text")) != (
                "stderr",
                "started",
            ):
                line = proc.stdout.readline()
                assert line, frames
                frames.append(json.loads(line))
            before = "".join(f"{json.dumps(frame)}\n" for frame in frames)
        else:
            assert proc.stderr.readline() == b"started\n"
            before = ""
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, before + out.decode(), err.decode()


def _last_result(world: World) -> dict:
    return [event for event in world.events(session="stop") if event["type"] == "tool_result"][-1]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminal_tool_that_handles_the_signal_and_exits_0_is_still_stopped(
    graceful: World, signum: int
) -> None:
    status, out, err = _stopped_once_started(graceful, signum)

    assert (status, out) == (128 + signum, "cleaned\n"), err
    assert err == (
        f"ctx: EINTR: interrupted: its caller got {signal.Signals(signum).name} and passed it on "
        "to its process group, killed if it still ran 2 s later (exit status 0)\n"
    )
    result = _last_result(graceful)
    assert (result["status"], result["errno"], result["stage"]) == ("error", "EINTR", "run")
    assert result["exit_status"] == 0, result


def test_a_native_tool_stopped_so_is_stopped_too(graceful: World) -> None:
    status, out, err = _stopped_once_started(graceful, signal.SIGTERM, "--native")

    assert status == 128 + signal.SIGTERM, (out, err)
    frame = json.loads(out.splitlines()[-1])
    assert (frame["type"], frame["status"]) == ("result", "error"), frame
    assert (frame["error"]["error"], frame["error"]["stage"]) == ("EINTR", "run"), frame
    result = _last_result(graceful)
    assert (result["errno"], result["stage"]) == ("EINTR", "run"), result
    assert result["call"] == frame["call"], result


# Runs the tool on this process's streams as a terminal's call does (tsh: the signal passed on
# with no grace), sends itself SIGINT once the tool runs, and prints how the call ended.
TERMINALS_CALL = """
import json, os, signal, sys, threading
from cortexfs.tools.runner import run_terminal

threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGINT)).start()
result = run_terminal(sys.argv[1], "coder", "graceful", [], session="stop")
print(json.dumps({"status": result.status, "exit_status": result.exit_status,
                  "error": None if result.error is None else result.error.to_json()}))
"""


def test_a_ctrl_c_a_terminals_call_passes_on_is_the_tools_to_take(graceful: World) -> None:
    done = subprocess.run(
        [sys.executable, "-c", TERMINALS_CALL, str(graceful.root)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "CTX_STORAGE": str(graceful.root)},
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "cleaned", done.stdout
    ended = json.loads(done.stdout.splitlines()[-1])
    assert ended == {"status": "ok", "exit_status": 0, "error": None}, ended
