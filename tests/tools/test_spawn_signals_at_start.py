"""A termination signal that reaches the caller of a tool on its terminal while the tool is
being started is passed on to the tool, as one a moment later is (T-3; docs/tools.md
"Terminal CLI mode"): the caller never ends as if no tool had run while the tool is killed
without the signal.  The signal is sent in the narrowest places, from within the start: just
before the process is made, and as the orphan guard is told of its group.  A start that
fails leaves the signal to the program's own handler."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

# Runs ``sleep 30`` on the caller's streams under ``stops_raise`` (as ``ctx run`` does), and
# sends itself SIGTERM at the place WHERE names; prints how the tool ended, or how the call
# was stopped.
CALLER = """
import contextlib, json, os, signal, subprocess, sys
from cortexfs.interrupts import Stopped, stops_raise
from cortexfs.tools import orphans, spawn

where = sys.argv[1]

def signalled():
    os.kill(os.getpid(), signal.SIGTERM)

if where == "popen" or where == "failed popen":
    real_popen = subprocess.Popen

    def popen(*args, **options):
        signalled()
        if where == "failed popen":
            raise PermissionError(13, "Permission denied")
        return real_popen(*args, **options)

    subprocess.Popen = popen
else:
    real_watching = orphans.GUARD.watching

    @contextlib.contextmanager
    def watching(pgid, **options):
        signalled()
        with real_watching(pgid, **options):
            yield

    orphans.GUARD.watching = watching

spec = spawn.ProcessSpec(["/bin/sleep", "30"], dict(os.environ), "/", None, 60, network=True,
                         signalled_grace=spawn.SIGNALLED_GRACE)
try:
    with stops_raise():
        finished = spawn.run_attached(spec)
except Stopped as stop:
    print(json.dumps({"stopped": stop.signum}))
except OSError as error:
    print(json.dumps({"failed": error.errno}))
else:
    print(json.dumps({"exit_status": finished.exit_status, "passed_on": finished.passed_on,
                      "timed_out": finished.timed_out}))
"""


def _call(where: str) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", CALLER, where],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("where", ["popen", "guard"])
def test_a_signal_that_comes_as_the_tool_starts_is_passed_on_to_it(where: str) -> None:
    ended = _call(where)

    assert ended == {
        "exit_status": 128 + signal.SIGTERM,
        "passed_on": signal.SIGTERM,
        "timed_out": False,
    }, ended


def test_a_signal_that_comes_when_the_start_fails_is_the_programs_own() -> None:
    assert _call("failed popen") == {"stopped": signal.SIGTERM}
