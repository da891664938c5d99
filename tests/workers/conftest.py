"""A real farm for worker tests: a bootstrapped root, an agent running as a real unprivileged
user, tool policies that let it run fs.stat and shell.exec, and a project queue — all made
through the ``ctx`` command line."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.storage import copy_of_root
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

PROJECT = "proj"
AGENT = "runner"
LABEL = "runner_t"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Farm:
    root: Path
    scratch: Path
    user: UnprivilegedUser

    @property
    def queue(self) -> Path:
        return self.root / "shared" / PROJECT / "queue"

    def ctx(
        self,
        *args: str,
        stdin: str | None = None,
        timeout: float = 120,
        env: dict[str, str] | None = None,
    ):
        return subprocess.run(
            [sys.executable, "-m", "cortexfs", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "CTX_STORAGE": str(self.root), **(env or {})},
            cwd=REPO,
        )

    def publish(self, tool: str, tool_input: dict[str, object], name: str | None = None) -> str:
        args = ["queue", "publish", "--project", PROJECT, "-"]
        if name:
            args += ["--name", name]
        done = self.ctx(*args, stdin=json.dumps({"tool": tool, "input": tool_input}))
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def worker(self, *extra: str, output: Path | None = None) -> subprocess.Popen[str]:
        """A ``ctx queue work`` process with JSON-lines output (piped, or appended to a file)."""
        sink = open(output, "a") if output is not None else subprocess.PIPE  # noqa: SIM115
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "cortexfs",
                "queue",
                "work",
                "--project",
                PROJECT,
                "--agent",
                AGENT,
                "--json",
                *extra,
            ],
            stdout=sink,
            stderr=sink,
            text=True,
            env={**os.environ, "CTX_STORAGE": str(self.root)},
            cwd=REPO,
        )

    def abort_with_two_ctrl_c(self) -> Aborted:
        """A worker killed by a second ^C while its one job's tool runs (exit 130): the job,
        left claimed for recover, the pid the tool had, the worker's summary and stderr."""
        pid_file = self.scratch / "logs" / "tool.pid"
        job = self.publish("shell.exec", {"cmd": f"echo $$ > {pid_file}; sleep 60"})
        worker = self.worker()
        assert worker.stdout is not None
        for line in worker.stdout:
            if json.loads(line)["event"] == "claim":
                break
        while not pid_file.exists() or not pid_file.read_text().strip():
            time.sleep(0.05)
        worker.send_signal(signal.SIGINT)
        time.sleep(0.2)
        worker.send_signal(signal.SIGINT)
        out, err = worker.communicate(timeout=60)
        assert worker.returncode == 130, err
        stop = json.loads(out.splitlines()[-1])
        return Aborted(job, int(pid_file.read_text()), stop, err)

    def result(self, job: str) -> tuple[str, dict[str, object]]:
        for state in ("done", "failed"):
            path = self.queue / state / f"{job}.result"
            if path.exists():
                assert (self.queue / state / job).exists()
                return state, json.loads(path.read_text())
        raise AssertionError(f"{job} has no terminal pair")


@dataclass(frozen=True)
class Aborted:
    job: str
    tool_pid: int
    stop: dict[str, object]  # the worker's last event
    stderr: str


_template: list[Path] = []  # the root one farm's ctx bootstrap made, copied for the others


def make_farm(scratch: Path, user: UnprivilegedUser) -> Farm:
    farm = Farm(scratch / "storage", scratch, user)
    if not _template:
        made = Farm(Path(tempfile.mkdtemp(prefix="cortexfs-farm-")) / "storage", scratch, user)
        assert made.ctx("bootstrap").returncode == 0
        atexit.register(shutil.rmtree, made.root.parent, True)
        _template.append(made.root)
    copy_of_root(_template[0], farm.root)
    request = scratch / "agent.json"
    request.write_text(
        json.dumps(
            {
                "name": AGENT,
                "label": LABEL,
                "tools": ["fs.stat", "shell.exec"],
                "shared": {PROJECT: ["read", "write"]},
                "mount": [[str(scratch), str(scratch), "rw"]],
            }
        )
    )
    created = farm.ctx("agent", "create", "--user", user.name, str(request))
    assert created.returncode == 0, created.stderr
    for tool in ("fs.stat", "shell.exec"):
        with open(farm.root / "tool" / f"{tool}.d" / "policy", "a") as policy:
            policy.write(f"allow {LABEL} tool:{tool} execute\n")
    assert farm.ctx("queue", "init", "--project", PROJECT).returncode == 0
    logs = scratch / "logs"
    logs.mkdir(mode=0o777)
    logs.chmod(0o777)
    return farm


@pytest.fixture
def farm(traversable_tmp: Path, unprivileged_user: UnprivilegedUser) -> Farm:
    return make_farm(traversable_tmp, unprivileged_user)
