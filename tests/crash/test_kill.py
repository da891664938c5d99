"""Real processes, SIGKILLed (docs/crash-model.md §6): at every named step of the protocol, and at
random moments in a fuzz of four workers and a recover loop.  After each run: recover
--reconcile through the real ``ctx`` command, a drain, and the checks of
:mod:`tests.crash.kill_check` — 0 jobs lost, 0 executed after their finish was acknowledged.

These run on the real filesystem under the test's temp directory (ext4 here): a kill -9
loses nothing the kernel accepted, so no persistence model is involved.
"""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import cortexfs.queue
from cortexfs.durable import MOVE_LINK, MOVE_RENAME
from cortexfs.queue import init_queue
from tests.crash.kill_check import check_run

REPO = Path(__file__).resolve().parents[2]


def protocol_steps() -> list[str]:
    """Every ``ops.step("...")`` in the queue package: a new step gets its kill test."""
    steps = set()
    for path in Path(cortexfs.queue.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "step"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                steps.add(node.args[0].value)
    return sorted(steps)


def runner(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tests.crash.kill_runner", *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def ctx_recover(queue: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "cortexfs", "queue", "recover", "--reconcile"]
    command += ["--grace", "0", "--queue", str(queue)]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)


class Run:
    """A queue and its logs in a temp directory, driven by kill_runner processes."""

    def __init__(self, tmp_path: Path, strategy: str) -> None:
        self.queue, self.logs, self.strategy = tmp_path / "queue", tmp_path / "logs", strategy
        init_queue(self.queue)
        self.logs.mkdir()

    def __call__(self, mode: str, *args: str, killed: bool = False) -> None:
        done = runner(mode, str(self.queue), str(self.logs), "--strategy", self.strategy, *args)
        expected = -signal.SIGKILL if killed else 0
        assert done.returncode == expected, f"{mode} {args}: {done.returncode}\n{done.stderr}"

    def recover_and_drain(self, table: Callable[..., None], name: str) -> None:
        recovered = ctx_recover(self.queue)
        assert recovered.returncode == 0, recovered.stdout + recovered.stderr
        self("work")
        run, problems = check_run(self.queue, self.logs)
        table(
            "kills",
            run=name,
            sigkills=run.sigkills,
            published=run.published,
            executions=run.executions,
            reexecutions=run.reexecutions,
            lost=run.lost,
            after_ack=sum("after its finish was acknowledged" in p for p in problems),
        )
        assert not problems, "\n".join(problems)


# What has to be on disk before a process can be killed at a recover step, and how.
RECOVER_LEFTOVERS = {
    "recover.requeue": (["work", "--die-at", "finish.write"], []),
    "recover.cleanup": (["work", "--die-at", "finish.write"], []),
    "recover.roll_forward": (["work", "--die-at", "finish.request"], ["--reconcile"]),
    "recover.orphans": (["work", "--die-at", "finish.cleanup"], ["--reconcile"]),
    # The fourth link of a link-strategy worker is the request's move to done/: dying right
    # after it leaves claimed/J/J as a second link of done/J.
    "recover.drop_copy": (
        ["work", "--strategy", MOVE_LINK, "--die-at", "link", "--occurrence", "4"],
        ["--reconcile"],
    ),
}


@pytest.mark.parametrize("strategy", [MOVE_RENAME, pytest.param(MOVE_LINK, marks=pytest.mark.slow)])
@pytest.mark.parametrize("step", protocol_steps())
def test_a_process_killed_at_each_named_step(tmp_path, step, strategy, table):
    run = Run(tmp_path, strategy)
    verb = step.split(".", 1)[0]
    if verb == "publish":
        run("publish", "k1", "k2", "--die-at", step, killed=True)
    elif verb == "publish_batch":
        run("publish", "k1", "k2", "k3", "--batch", "--die-at", step, killed=True)
    elif verb == "recover":
        run("publish", "k1", "k2")
        leftover, flags = RECOVER_LEFTOVERS[step]
        run(*leftover, killed=True)
        run("recover", *flags, "--die-at", step, killed=True)
    else:
        run("publish", "k1", "k2")
        run("work", "--renew", "--die-at", step, killed=True)
    run.recover_and_drain(table, f"killed once at each named step ({strategy})")


@pytest.mark.parametrize(
    ("kills", "strategy"),
    [
        (60, MOVE_RENAME),
        pytest.param(600, MOVE_RENAME, marks=pytest.mark.slow),
        pytest.param(600, MOVE_LINK, marks=pytest.mark.slow),
    ],
)
def test_random_sigkills_lose_nothing_and_repeat_nothing_acknowledged(
    tmp_path, kills, strategy, table
):
    run = Run(tmp_path, strategy)
    run("fuzz", "--kills", str(kills), "--seed", str(kills))
    run.recover_and_drain(table, f"fuzz: 4 workers + recover, {kills} kills ({strategy})")
    assert check_run(run.queue, run.logs)[0].sigkills >= kills
