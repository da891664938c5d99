"""The worker's agent name (R-3, W-1): ``--agent ''`` — an unset ``"$AGENT"`` in a script — is
an illegal name, refused like ``--agent 'a/b'`` before anything is claimed; an empty
``CTX_AGENT`` is unset, as shells commonly mean it, and leaves the documented no-agent mode."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.workers.conftest import PROJECT, REPO, Farm


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )


def without_ctx_agent(farm: Farm) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "CTX_AGENT"}
    return {**env, "CTX_STORAGE": str(farm.root)}


@pytest.mark.parametrize("name", ["", "a/b"])
@pytest.mark.parametrize("program", ["ctx", "tool_worker.py", "shell_worker.py"])
def test_an_illegal_agent_name_is_a_usage_error_and_nothing_is_claimed(
    farm: Farm, program: str, name: str
) -> None:
    job = farm.publish("shell.exec", {"cmd": "true"})
    args = ["--project", PROJECT, "--agent", name, "--drain"]

    command = ["-m", "cortexfs", "queue", "work"]
    if program != "ctx":
        command = [str(REPO / "workers" / program)]
    done = run([*command, *args], without_ctx_agent(farm))

    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"{program}: EINVAL: illegal agent name: "), done.stderr
    assert (farm.queue / "pending" / job).is_file()
    assert os.listdir(farm.queue / "failed") == []


def test_an_illegal_ctx_agent_is_a_usage_error_too(farm: Farm) -> None:
    job = farm.publish("shell.exec", {"cmd": "true"})

    done = farm.ctx("queue", "work", "--project", PROJECT, "--drain", env={"CTX_AGENT": "a/b"})

    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("ctx: EINVAL: illegal agent name: 'a/b'"), done.stderr
    assert (farm.queue / "pending" / job).is_file()


@pytest.mark.parametrize("environment", [{"CTX_AGENT": ""}, {}])
def test_an_empty_ctx_agent_is_unset_the_no_agent_mode(
    farm: Farm, environment: dict[str, str]
) -> None:
    job = farm.publish("shell.exec", {"cmd": "true"})
    argv = ["-m", "cortexfs", "queue", "work", "--project", PROJECT, "--drain"]

    done = run(argv, {**without_ctx_agent(farm), **environment})

    assert done.returncode == 0, done.stderr
    assert done.stderr.count("warning") == 1
    state, result = farm.result(job)
    assert state == "failed" and result["reason"].startswith("EACCES: this worker was started")
