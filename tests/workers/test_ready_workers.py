"""The ready programs of workers/ (W-5): the shell worker runs shell.exec jobs only, and leaves
the others pending."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.workers.conftest import AGENT, PROJECT, REPO, Farm


def run_program(farm: Farm, program: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(REPO / "workers" / program),
            "--project",
            PROJECT,
            "--agent",
            AGENT,
            "--drain",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CTX_STORAGE": str(farm.root)},
    )


def test_the_shell_worker_runs_shell_jobs_and_leaves_other_tools_to_other_workers(
    farm: Farm,
) -> None:
    """A project's queue is shared: a job of another tool is not the shell worker's to fail.
    It stays pending, and the tool worker runs it."""
    other = farm.publish("fs.stat", {"path": str(farm.scratch)})
    shell = farm.publish("shell.exec", {"cmd": "printf '{\"answer\": 42}'"})
    done = run_program(farm, "shell_worker.py")
    assert done.returncode == 0, done.stderr
    assert farm.result(shell) == ("done", farm.result(shell)[1])
    assert farm.result(shell)[1]["output"] == {"answer": 42}
    assert (farm.queue / "pending" / other).is_file()
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["event"] for e in lines].count("finish") == 1 and lines[-1]["event"] == "stop"

    assert run_program(farm, "tool_worker.py").returncode == 0
    assert farm.result(other)[0] == "done"


def test_the_tool_worker_runs_any_allowed_tool(farm: Farm) -> None:
    job = farm.publish("fs.stat", {"path": str(farm.scratch)})
    done = run_program(farm, "tool_worker.py")
    assert done.returncode == 0, done.stderr
    assert farm.result(job)[0] == "done"


def test_a_ready_worker_explains_a_missing_agent(farm: Farm) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "workers" / "tool_worker.py"),
            "--project",
            PROJECT,
            "--agent",
            "ghost",
            "--drain",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "CTX_STORAGE": str(farm.root)},
    )
    assert done.returncode == 1 and "ENOENT" in done.stderr
