"""The ready programs of workers/ take the command line of ``ctx queue work``: the same option
values are refused the same way (EINVAL, exit 2) before any job is claimed, and every refusal
is one ``PROG: ERRNO: sentence`` line with the exit status ``ctx queue work`` gives, never a
traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.workers.conftest import AGENT, PROJECT, REPO, Farm

PROGRAMS = ("tool_worker.py", "shell_worker.py")


def ready(farm: Farm, program: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "workers" / program), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CTX_STORAGE": str(farm.root)},
    )


def last_line(stderr: str) -> str:
    return stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "bad",
    [
        ("--timeout", "0"),
        ("--timeout", "-5"),
        ("--timeout", "nan"),
        ("--concurrency", "0"),
        ("--concurrency", "-3"),
        ("--concurrency", "1025"),
        ("--max-jobs", "0"),
        ("--max-jobs", "-1"),
    ],
)
def test_a_value_ctx_queue_work_refuses_is_refused_by_the_ready_programs_too(
    farm: Farm, bad: tuple[str, str]
) -> None:
    job = farm.publish("shell.exec", {"cmd": "true"})
    args = ("--project", PROJECT, "--agent", AGENT, "--drain", *bad)

    work = farm.ctx("queue", "work", *args)
    assert work.returncode == 2, work.stderr
    assert last_line(work.stderr).startswith("ctx: EINVAL: ")
    for program in PROGRAMS:
        done = ready(farm, program, *args)
        assert done.returncode == 2, done.stderr
        assert last_line(done.stderr) == last_line(work.stderr).replace("ctx:", f"{program}:", 1)
        assert "Traceback" not in done.stderr
    assert (farm.queue / "pending" / job).is_file(), "nothing was claimed"


@pytest.mark.parametrize(
    ("project", "status", "errno_name"),
    [("nope", 1, "ENOENT"), ("a/b", 2, "EINVAL"), ("", 2, "EINVAL")],
)
def test_a_missing_queue_or_an_illegal_project_is_one_error_line(
    farm: Farm, project: str, status: int, errno_name: str
) -> None:
    args = ("--project", project, "--agent", AGENT, "--drain")

    work = farm.ctx("queue", "work", *args)
    assert work.returncode == status, work.stderr
    for program in PROGRAMS:
        done = ready(farm, program, *args)
        assert done.returncode == status, done.stderr
        assert done.stderr.startswith(f"{program}: {errno_name}: "), done.stderr
        assert last_line(done.stderr) == last_line(work.stderr).replace("ctx:", f"{program}:", 1)
        assert "Traceback" not in done.stderr


def test_the_ready_programs_still_print_each_finished_job_as_a_json_line(farm: Farm) -> None:
    job = farm.publish("shell.exec", {"cmd": "true"})

    done = ready(farm, "shell_worker.py", "--project", PROJECT, "--agent", AGENT, "--drain")

    assert done.returncode == 0, done.stderr
    assert [line.split('"')[3] for line in done.stdout.splitlines()] == ["finish", "stop"]
    assert farm.result(job)[0] == "done"
