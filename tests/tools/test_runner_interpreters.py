"""A tool whose ``#!`` interpreter the kernel refuses to start for the agent never runs, and
says which interpreter and why, in native and terminal mode alike (T-3, T-5; docs/tools.md
stage ``run``): never a tool that ran under ``/bin/sh`` (setpriv's ``execvp`` falls back to it
on ENOEXEC), nor one that exited 126 with setpriv's line on the caller's stderr, nor one whose
interpreter the agent may not execute run anyway because setpriv makes the exec still holding
root's capabilities."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs.tools.runner import run_terminal
from tests.tools.support import World

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent runs as a second uid")

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]


def _interpreter(world: World, name: str, text: str, mode: int) -> Path:
    """An interpreter for the tools to name, where the agent's uid may reach it."""
    path = world.scratch / name
    path.write_text(text)
    path.chmod(mode)
    return path


def _tool(world: World, interpreter: Path) -> Path:
    """Tool ``interpreted`` whose ``#!`` line names ``interpreter``; it leaves a mark if any
    interpreter ever runs it.  The mark it would leave."""
    mark = world.workspace / "ran"
    world.install("interpreted", f"#!{interpreter}\ntouch {mark}\n")
    world.agent("coder", tools=["interpreted"])
    world.allow_tool("interpreted")
    return mark


# (the interpreter's name, its text and mode or None for none there, errno, what is said)
REFUSED = [
    ("missing", None, errno.ENOENT, "is not there"),
    ("plain", ('#!/bin/sh\nexec /bin/sh "$@"\n', 0o644), errno.EACCES, "has no execute bit"),
    # Execute bits for root's own class only: setpriv would let the exec through.
    ("roots", ('#!/bin/sh\nexec /bin/sh "$@"\n', 0o750), errno.EACCES, "has no execute bit"),
    ("empty", ("", 0o755), errno.ENOEXEC, "is no program"),
    ("text", ("echo interpreted\n", 0o755), errno.ENOEXEC, "is no program"),
]


@pytest.mark.parametrize(
    ("name", "interpreter", "code", "said"), REFUSED, ids=[case[0] for case in REFUSED]
)
def test_an_interpreter_the_kernel_refuses_the_agent_fails_the_call_at_stage_run(
    world: World, name: str, interpreter: tuple[str, int] | None, code: int, said: str
) -> None:
    path = world.scratch / name if interpreter is None else _interpreter(world, name, *interpreter)
    mark = _tool(world, path)

    native = world.run("interpreted", {})
    terminal = run_terminal(world.root, "coder", "interpreted", [], timeout=30)

    for result in (native, terminal):
        assert result.error is not None and result.exit_status is None, result
        assert (result.error.errno, result.error.stage) == (code, "run"), result
        assert f"its interpreter {path}, named on its #! line, {said}" in result.error.message
    assert not mark.exists(), "the tool ran under another interpreter"
    results = [e for e in world.events() if e["type"] == "tool_result"]
    assert [(e["errno"], e["stage"], e["exit_status"]) for e in results] == [
        (errno.errorcode[code], "run", None)
    ] * 2, results


def test_an_interpreter_that_is_a_script_is_judged_in_turn(world: World) -> None:
    """The kernel follows an interpreter that is a script to its own interpreter: a missing
    one there is named, with the script whose #! line names it."""
    middle = _interpreter(world, "middle", f"#!{world.scratch / 'gone'}\n", 0o755)
    _tool(world, middle)

    result = world.run("interpreted", {})

    assert result.error is not None and result.error.errno == errno.ENOENT, result
    assert (
        f"its interpreter {world.scratch / 'gone'}, named on the #! line of {middle}, is not "
        "there" in result.error.message
    ), result.error


def test_ctx_run_on_a_terminal_is_126_naming_the_interpreter_and_no_launchers_line(
    world: World,
) -> None:
    interpreter = _interpreter(world, "plain", "#!/bin/sh\n", 0o644)
    mark = _tool(world, interpreter)

    ran = subprocess.run(
        [*CTX, "--storage", str(world.root), "run", "--agent", "coder", "interpreted"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )

    assert ran.returncode == 126, ran
    assert ran.stderr.splitlines() == [
        f"ctx: EACCES: cannot start {world.root / 'tool' / 'interpreted'}: its interpreter "
        f"{interpreter}, named on its #! line, has no execute bit for the tool's uid "
        f"{world.user.uid} gid {world.user.gid} (mode 0644, owner 0:0) (Permission denied)"
    ], ran
    assert not mark.exists()


@pytest.mark.parametrize(
    "program",
    [b"\x00\x01binary\n", Path("/bin/true").read_bytes()[:200]],
    ids=["no-format", "elf-cut-short"],
)
def test_a_binary_the_kernel_will_not_start_is_never_run_as_a_script(
    world: World, program: bytes
) -> None:
    """T-5: a program with a NUL in its first bytes and no format the kernel starts (no
    ELF whole, no binfmt_misc format here) is ENOEXEC at stage run: setpriv's execvp would
    hand it to /bin/sh, which would run its lines as commands."""
    mark = world.workspace / "ran"
    installed = world.install("binary", f"#!/bin/sh\ntouch {mark}\n")
    world.agent("coder", tools=["binary"])
    world.allow_tool("binary")
    installed.path.write_bytes(program + f"\ntouch {mark}\n".encode())

    native = world.run("binary", {})
    terminal = run_terminal(world.root, "coder", "binary", [], timeout=30)

    for result in (native, terminal):
        assert result.error is not None and result.exit_status is None, result
        assert (result.error.errno, result.error.stage) == (errno.ENOEXEC, "run"), result
    assert not mark.exists(), "the program ran as a shell script"
