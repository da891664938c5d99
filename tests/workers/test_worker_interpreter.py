"""A worker program started with a Python that lacks CortexFS (its ``/usr/bin/env python3``
shebang on a fresh machine) runs under the checkout's venv, or says what to do."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workers.conftest import REPO

WORKERS = ("tool_worker.py", "shell_worker.py")


def python_without_cortexfs() -> str:
    for candidate in ("/usr/bin/python3", shutil.which("python3")):
        if candidate and Path(candidate).is_file():
            probe = subprocess.run(
                [candidate, "-S", "-c", "import cortexfs"], capture_output=True, timeout=60, cwd="/"
            )
            if probe.returncode != 0:
                return candidate
    pytest.skip("every python3 here can import cortexfs")


@pytest.mark.parametrize("program", WORKERS)
def test_a_worker_started_without_cortexfs_runs_under_the_checkouts_venv(program: str) -> None:
    venv = REPO / ".venv"
    if Path(sys.prefix).resolve() != venv.resolve():
        pytest.skip("the tests do not run from the checkout's .venv")
    done = subprocess.run(
        [python_without_cortexfs(), "-S", str(REPO / "workers" / program), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"Usage: {program} [OPTIONS]" in done.stdout and "--agent AGENT" in done.stdout


def test_without_a_venv_the_worker_says_which_python_to_use(tmp_path: Path) -> None:
    workers = tmp_path / "workers"  # a copy of workers/ with no .venv beside it
    shutil.copytree(REPO / "workers", workers)
    done = subprocess.run(
        [python_without_cortexfs(), "-S", str(workers / "tool_worker.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "tool_worker.py: ENOENT:" in done.stderr and "cannot import cortexfs" in done.stderr
    assert "Traceback" not in done.stderr
