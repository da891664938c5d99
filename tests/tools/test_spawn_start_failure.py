"""A program the kernel will not start is said as such, however it is launched: subprocess
raises the exec's OSError itself, and when setpriv (the agent's credentials, the parent-death
signal) makes the exec, its one line and exit status 126 or 127 are read back as that
OSError, never as a tool that ran and exited 126 (T-5)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from cortexfs.tools.spawn import ProcessSpec, run_captured

pytestmark = pytest.mark.skipif(
    not any(Path(d, "setpriv").exists() for d in ("/usr/bin", "/bin")),
    reason="setpriv launches the tools",
)


def _spec(argv: list[str]) -> ProcessSpec:
    return ProcessSpec(argv, {"PATH": "/usr/bin:/bin"}, "/", None, timeout=60)


def _program(tmp_path: Path, text: str) -> str:
    program = tmp_path / "tool"
    program.write_text(text)
    program.chmod(0o755)
    return str(program)


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("#!/nonexistent/interpreter\n", errno.ENOENT),
        ("#!/etc/passwd\n", errno.EACCES),  # an interpreter that is no program
        # No '#!' line: the kernel refuses it, where setpriv's execvp would run it with sh
        # (an emptied or truncated guard would then let every call through).
        ("", errno.ENOEXEC),
        ("exit 0\n", errno.ENOEXEC),
        ("#! \t\nexit 0\n", errno.ENOEXEC),  # a '#!' line that names no interpreter
    ],
)
def test_a_program_the_kernel_refuses_raises_the_exec_s_errno(
    tmp_path: Path, text: str, code: int
) -> None:
    program = _program(tmp_path, text)

    with pytest.raises(OSError) as raised:
        run_captured(_spec([program]), b"")

    assert raised.value.errno == code, raised.value
    assert raised.value.strerror == os.strerror(code)


@pytest.mark.parametrize("status", [126, 127])
def test_a_program_that_ran_and_exited_126_or_127_is_its_own_exit_status(
    tmp_path: Path, status: int
) -> None:
    program = _program(tmp_path, f"#!/bin/sh\necho 'sh: 1: thing: not found' >&2\nexit {status}\n")

    finished = run_captured(_spec([program]), b"")

    assert finished.exit_status == status
    assert finished.stderr_tail == b"sh: 1: thing: not found\n"
