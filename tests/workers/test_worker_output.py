"""A worker whose standard output cannot be written (docs/workers.md, Output): it stops
claiming, finishes what it runs, and ends as every command whose output failed: exit 74 and
``ENOSPC: cannot write standard output (…)`` naming the jobs it finished without showing them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support.unwritable import to_full_disk, with_room_for
from tests.workers.conftest import AGENT, PROJECT, REPO, Farm
from tests.workers.test_worker import events_of

WORK = [sys.executable, "-m", "cortexfs", "queue", "work", "--project", PROJECT, "--agent", AGENT]
LOST = "cannot write standard output"


def _env(farm: Farm) -> dict[str, str]:
    # PYTHONPATH: the ready programs import this checkout's cortexfs, as `-m cortexfs` does.
    return {**os.environ, "CTX_STORAGE": str(farm.root), "PYTHONPATH": str(REPO)}


def test_a_worker_on_a_full_disk_claims_nothing_and_exits_74(farm: Farm) -> None:
    job = farm.publish("shell.exec", {"cmd": "echo hi"})

    lost = to_full_disk([*WORK, "--drain"], env=_env(farm), cwd=REPO)

    assert (lost.returncode, lost.stderr) == (
        74,
        f"ctx: ENOSPC: {LOST} (No space left on device); the worker stopped claiming jobs; "
        "it finished no job\n",
    )
    assert (farm.queue / "pending" / job).exists()
    kinds = [e["type"] for e in events_of(farm)]
    assert not [kind for kind in kinds if kind.startswith(("queue.", "tool_"))], kinds


def test_a_worker_names_the_jobs_it_finished_and_could_not_show(farm: Farm, tmp_path: Path) -> None:
    """Room for its start line only: the first job runs and is finished in done/, its line
    is lost, the worker claims no more, and says which job it finished."""
    started = subprocess.run(
        [*WORK, "--drain", "--worker", "w1"],
        capture_output=True,
        text=True,
        env=_env(farm),
        cwd=REPO,
        timeout=120,
    )
    first, second = (farm.publish("shell.exec", {"cmd": "echo hi"}) for _ in range(2))
    room = len(started.stdout.splitlines(keepends=True)[0].encode()) + 5

    lost, written = with_room_for(
        [*WORK, "--drain", "--worker", "w1"], room, tmp_path / "out", env=_env(farm), cwd=REPO
    )

    assert written.decode().startswith("worker w1 started"), written
    assert (lost.returncode, lost.stderr) == (
        74,
        f"ctx: EFBIG: {LOST} (File too large); the worker stopped claiming jobs; it finished "
        f"1 job; not shown: {first} in done/\n",
    )
    assert farm.result(first)[0] == "done"
    assert (farm.queue / "pending" / second).exists()
    events = events_of(farm)
    finished = [e for e in events if e["type"] == "queue.finish"]
    results = [e for e in events if e["type"] == "tool_result"]
    assert [e["object"] for e in finished] == [f"queue/{first}"], finished
    assert [(e["status"], e["exit_status"]) for e in results] == [("ok", 0)], results


def test_a_ready_worker_on_a_full_disk_says_which_job_it_finished(farm: Farm) -> None:
    """A ready program shows only finished jobs: its first line lost is a finished job's."""
    first, second = (farm.publish("shell.exec", {"cmd": "echo hi"}) for _ in range(2))
    program = [sys.executable, str(REPO / "workers" / "tool_worker.py")]

    lost = to_full_disk(
        [*program, "--project", PROJECT, "--agent", AGENT, "--drain"], env=_env(farm)
    )

    assert (lost.returncode, lost.stderr) == (
        74,
        f"tool_worker.py: ENOSPC: {LOST} (No space left on device); the worker stopped "
        f"claiming jobs; it finished 1 job; not shown: {first} in done/\n",
    )
    assert farm.result(first)[0] == "done"
    assert (farm.queue / "pending" / second).exists()
