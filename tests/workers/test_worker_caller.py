"""Who may start a worker: only the host administrator may run tools as an agent, and that
depends on nobody but the process that started the worker — so a worker anyone else starts
refuses at once (EACCES, exit 1) and claims nothing, instead of claiming every job only for
each call to be refused."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support.users import run_as
from tests.workers.conftest import AGENT, PROJECT, REPO, Farm

COMMANDS = {
    "ctx queue work": (sys.executable, "-m", "cortexfs", "queue", "work"),
    "tool_worker.py": (sys.executable, str(REPO / "workers" / "tool_worker.py")),
}


def open_the_queue_to_everyone(farm: Farm) -> None:
    """So that only the question of who may run tools as the agent stands in the way."""
    for directory, _subdirectories, files in os.walk(farm.root / "shared"):
        os.chmod(directory, 0o777)
        for name in files:
            os.chmod(Path(directory) / name, 0o666)


def started_by_the_user(farm: Farm, command: str):
    argv = [*COMMANDS[command], "--project", PROJECT, "--agent", AGENT, "--drain"]
    env = {**os.environ, "CTX_STORAGE": str(farm.root), "PYTHONDONTWRITEBYTECODE": "1"}
    return run_as(farm.user, argv, env=env, cwd=REPO)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_worker_started_by_someone_else_refuses_before_claiming_anything(
    farm: Farm, command: str
) -> None:
    # A worker root started once made the agent's home and session: nothing else is missing.
    assert (
        farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain").returncode == 0
    )
    jobs = {farm.publish("shell.exec", {"cmd": "true"}) for _ in range(3)}
    open_the_queue_to_everyone(farm)

    done = started_by_the_user(farm, command)

    assert done.returncode == 1, done.stderr
    program = command.split()[0]
    assert done.stderr.startswith(f"{program}: EACCES: only the host administrator"), done.stderr
    assert "start a worker that runs jobs' tools as an agent" in done.stderr
    assert set(os.listdir(farm.queue / "pending")) == jobs
    assert os.listdir(farm.queue / "claimed") == [] and os.listdir(farm.queue / "failed") == []


def test_a_home_the_worker_cannot_create_is_named_with_what_to_do(farm: Farm) -> None:
    """The owner of the storage root is a host administrator, yet may be unable to create the
    agent's home under a root-owned home/: the refusal names the home, not a bare uid."""
    job = farm.publish("shell.exec", {"cmd": "true"})
    open_the_queue_to_everyone(farm)
    os.chown(farm.root, farm.user.uid, farm.user.gid)
    home = farm.root / "home" / str(farm.user.uid)
    assert not home.exists()

    done = started_by_the_user(farm, "ctx queue work")

    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("ctx: EACCES: cannot open the worker's session "), done.stderr
    assert f"create {home} owned by uid {farm.user.uid}" in done.stderr
    assert (farm.queue / "pending" / job).is_file()
