"""A worker started on a root whose core tools an older bootstrap copied (an upgrade without
'ctx bootstrap'): it refuses to start, naming the remedy, and claims nothing, rather than
fail every job for good; after 'ctx bootstrap' it runs them."""

from __future__ import annotations

import subprocess
import sys

from tests.support.core_names import install_core_tool_of_another_version
from tests.workers.conftest import AGENT, PROJECT, REPO, Farm

# A command given --storage suggests the bootstrap of that root; one that took it from
# $CTX_STORAGE, the plain command.
REFUSAL = (
    "EINVAL: the core tools in {root} were installed by another version of ctx; run "
    "'ctx {storage}bootstrap'"
)


def test_workers_refuse_to_start_until_bootstrap_runs(farm: Farm) -> None:
    ready_options = ("--agent", AGENT, "--drain", "--storage", str(farm.root))
    install_core_tool_of_another_version(farm.root, "fs.stat", farm.scratch)
    job = farm.publish("fs.stat", {"path": str(farm.scratch)})

    work = farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")
    ready = subprocess.run(
        [
            sys.executable,
            str(REPO / "workers/tool_worker.py"),
            "--project",
            PROJECT,
            *ready_options,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )

    for done, program, storage in ((work, "ctx", ""), (ready, "tool_worker.py", "--storage ")):
        assert done.returncode == 1, done.stdout
        said = REFUSAL.format(root=farm.root, storage=storage and f"{storage}{farm.root} ")
        assert done.stderr.startswith(f"{program}: {said}"), done.stderr
    assert (farm.queue / "pending" / job).exists()
    assert sorted(p.name for p in (farm.queue / "claimed").iterdir()) == []

    assert farm.ctx("bootstrap").returncode == 0
    drained = farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")
    assert drained.returncode == 0, drained.stderr
    assert farm.result(job)[0] == "done"


def test_a_shell_worker_refuses_too(farm: Farm) -> None:
    install_core_tool_of_another_version(farm.root, "shell.exec", farm.scratch)
    job = farm.publish("shell.exec", {"cmd": "true"})

    done = farm.ctx(
        "queue", "work", "--project", PROJECT, "--agent", AGENT, "--kind", "shell", "--drain"
    )

    assert done.returncode == 1
    assert REFUSAL.format(root=farm.root, storage="") in done.stderr
    assert (farm.queue / "pending" / job).exists()
