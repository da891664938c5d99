"""Black-box helpers for the acceptance files that run ``ctx queue work``: the agent ``ci`` the
worker runs as, the jobs it is given, the worker process and what it left.  Nothing here
imports the product."""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, QueueCLI, clean_env, ctx_run, request

AGENT = "ci"
LABEL = "ci_t"


def make_agent(storage: Path, tools: list[str], *options: str, name: str = AGENT) -> None:
    """``ctx agent create`` (A-3): its policy grants exactly ``tools`` (the agent layer of P-6)."""
    req = {"name": name, "label": f"{name}_t", "tools": tools}
    r = ctx_run("agent", "create", "--storage", storage, *options, "-", input=json.dumps(req))
    assert r.rc == 0, r


def allow_in_tool_policy(storage: Path, tool: str, label: str = LABEL) -> None:
    """The tool layer of P-6: ``allow <label> tool:<name> execute`` in ``tool/<name>.d/policy``."""
    with open(storage / "tool" / f"{tool}.d" / "policy", "a") as policy:
        policy.write(f"allow {label} tool:{tool} execute\n")


# Fixtures for a file to take by name (``from tests.acceptance.workercli import storage as
# storage``), overriding conftest's ``storage``.


@pytest.fixture
def storage(searchable_storage: Path) -> Path:
    """Agents run as another uid here: the root must be searchable by it (conftest)."""
    return searchable_storage


@pytest.fixture
def agent(storage: Path) -> str:
    """Agent ``ci`` (root's default uid for agents) allowed ``shell.exec`` in both layers of
    P-6."""
    make_agent(storage, ["shell.exec"])
    allow_in_tool_policy(storage, "shell.exec")
    return AGENT


def shell_job(cmd: str, **extra) -> dict:
    req = request("shell.exec", **extra)
    req["input"] = {"cmd": cmd}
    return req


def start_worker(queue: QueueCLI, *args: str, env: dict | None = None) -> subprocess.Popen:
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT, *args]
    return subprocess.Popen(
        argv,
        env=env or clean_env(CTX_STORAGE=str(queue.storage)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextlib.contextmanager
def running_worker(queue: QueueCLI, *args: str) -> Iterator[subprocess.Popen]:
    """:func:`start_worker`, killed on the way out if the block left it running."""
    proc = start_worker(queue, *args)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def result_of(queue: QueueCLI, job: str) -> dict:
    state = queue.state(job)
    assert state in ("done", "failed"), (job, state, queue.entries("claimed"))
    return json.loads((queue.dir / state / f"{job}.result").read_text())
