"""Help texts and manual pages that state what a program does, checked against the program:
the exit statuses the queue commands and ctxmcp end with, what tsh does outside an agent
terminal, the signals that end ctxterm, and which session events are fsynced."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs.manual import BUILT_IN
from cortexfs.worker.executors import DURABLE_TRANSITIONS
from tests.support.cli import ctx

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
CTXMCP = [sys.executable, "-c", "from cortexfs.cli.ctxmcp import main; main()"]


def one_line(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = tmp_path_factory.mktemp("help") / "root"
    done = ctx(made, "bootstrap")
    assert done.returncode == 0, done.stderr
    return made


def written_to_dev_full(root: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    with open("/dev/full", "w") as full:
        return subprocess.run(
            argv,
            env={**os.environ, "CTX_STORAGE": str(root)},
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )


def test_the_queue_help_names_the_exit_statuses_a_queue_command_ends_with(root: Path) -> None:
    helped = one_line(ctx(root, "queue", "--help").stdout)
    assert ctx(root, "queue", "init", "--project", "p").returncode == 0

    unwritable = written_to_dev_full(
        root, [sys.executable, "-m", "cortexfs", "queue", "status", "--project", "p"]
    )

    assert unwritable.returncode == 74, unwritable.stderr
    assert "3 nothing to claim; 130 after Ctrl-C, 141 when the reader of the output left" in helped
    assert "74 when the output cannot be written" in helped


@pytest.mark.skipif(
    not (VENV_BIN / "mcp-server-time").exists(),
    reason=f"{VENV_BIN} has no mcp-server-time (the install provides it)",
)
def test_ctxmcp_help_names_exit_74_which_it_ends_with_on_a_full_output(root: Path) -> None:
    helped = one_line(subprocess.run([*CTXMCP, "--help"], capture_output=True, text=True).stdout)
    config = root.parent / "mcp.json"
    server = VENV_BIN / "mcp-server-time"
    config.write_text(f'{{"mcpServers": {{"time": {{"command": "{server}"}}}}}}')

    listed = written_to_dev_full(
        root, [*CTXMCP, "list", "--config", str(config), "--server", "time"]
    )

    assert listed.returncode == 74, listed.stderr
    assert "ctxmcp: ENOSPC: cannot write standard output" in listed.stderr
    assert "74 the output could not be written" in helped


def test_tsh_help_says_that_outside_an_agent_terminal_it_runs_no_tool(root: Path) -> None:
    tsh = str(root / "bin" / "tsh")
    environment = {**os.environ, "CTX_STORAGE": str(root)}
    environment.pop("CTX_RUN_SOCKET", None)
    helped = one_line(subprocess.run([tsh, "--help"], capture_output=True, text=True).stdout)
    listed = subprocess.run([tsh, "tools"], capture_output=True, text=True, env=environment)
    ran = subprocess.run([tsh, "fs.stat", "/"], capture_output=True, text=True, env=environment)
    missing = subprocess.run([tsh, "no.such"], capture_output=True, text=True, env=environment)

    assert listed.returncode == 0 and "fs.stat" in listed.stdout, listed.stderr
    assert ran.returncode == 126 and "EACCES: this tsh is not an agent terminal" in ran.stderr
    assert missing.returncode == 127, missing.stderr
    assert "Elsewhere tsh lists, finds and describes tools but runs none (EACCES, exit 126)" in (
        helped
    )
    assert "127 when NAME is no tool on CTX_PATH, 126 when it cannot be run" in helped


def test_ctxterm_help_names_the_signals_that_end_it(root: Path) -> None:
    """SIGHUP's effect is tested in tests/agents/test_ctxterm_hangup.py."""
    helped = one_line(
        subprocess.run([root / "bin/ctxterm", "--help"], capture_output=True, text=True).stdout
    )

    assert "'ctx agent stop', SIGTERM, SIGHUP or Ctrl-C here" in helped


def test_the_session_page_names_the_fsynced_queue_events_and_every_one_the_worker_writes() -> None:
    page = one_line((BUILT_IN / "ctx.session.md").read_text())
    written = set()
    for module in (REPO / "cortexfs" / "worker").glob("*.py"):
        written |= set(re.findall(r'record\(\s*"(queue\.[a-z]+)"', module.read_text()))

    durable = re.search(r"Tool results, (.*?) are fsynced before", page)
    assert durable is not None
    assert set(re.findall(r"`(queue\.[a-z]+)`", durable.group(1))) == set(DURABLE_TRANSITIONS)
    not_durable = re.search(r"`tool_call` and (.*?) are not fsynced on their own", page)
    assert not_durable is not None
    assert not set(re.findall(r"`(queue\.[a-z]+)`", not_durable.group(1))) & DURABLE_TRANSITIONS
    assert written, "the worker's event types were found"
    for event in written:
        assert f"| `{event}`" in page, event
