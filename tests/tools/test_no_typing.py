"""No agent's tool types into its caller's terminal (T-3, T-5): the seccomp filter a tool run on
root's terminal under an agent's identity gets refuses ``TIOCSTI`` and ``TIOCLINUX``, and
nothing else.

The filter is checked twice: its BPF program is run here, by a small interpreter of the four
instructions it uses, for every architecture it has numbers for (a program that allowed the
wrong call, or refused the wrong one, fails here on any machine); and a real tool run by
``run_attached`` on a real pseudo-terminal, as the unprivileged test user, is refused the
keystroke (where the kernel's legacy TIOCSTI would take it) while it may still ask the
terminal its size."""

from __future__ import annotations

import errno
import os
import pty
import select
import struct
import sys
import time

import pytest

from cortexfs.tools import no_typing
from tests.support.users import UnprivilegedUser

ALLOW = 0x7FFF0000
REFUSE = 0x00050000 | errno.EPERM


def run_bpf(code: list[tuple[int, int, int, int]], arch: int, nr: int, request: int) -> int:
    """What the program returns for a system call ``nr`` of ``arch`` whose second argument
    is ``request``: ld|w|abs, jeq|k and ret|k, as the kernel reads them."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, 3, request | (0xDEAD << 32), 0, 0, 0, 0)
    accumulator, pc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == 0x20:
            (accumulator,) = struct.unpack_from("<I", data, k)
            pc += 1
        elif op == 0x15:
            pc += 1 + (jt if accumulator == k else jf)
        elif op == 0x06:
            return k
        else:
            raise AssertionError(f"instruction {op:#x} at {pc} is not one of the filter's")


@pytest.mark.parametrize("machine", sorted(no_typing._IOCTL))
def test_the_program_refuses_the_two_requests_of_ioctl_and_allows_everything_else(machine):
    table = no_typing._IOCTL[machine]
    code = no_typing._program(table)
    for arch, numbers in table.items():
        for nr in numbers:
            assert run_bpf(code, arch, nr, 0x5412) == REFUSE  # TIOCSTI
            assert run_bpf(code, arch, nr, 0x541C) == REFUSE  # TIOCLINUX
            assert run_bpf(code, arch, nr, 0x5413) == ALLOW  # TIOCGWINSZ
            assert run_bpf(code, arch, nr, 0) == ALLOW
        for other in (0, 1, 59, 62, 0x5412, max(numbers) + 1):
            if other not in numbers:
                assert run_bpf(code, arch, other, 0x5412) == ALLOW
    # Another architecture's ioctl number is not this one's ioctl.
    for nr in (16, 29, 54):
        assert run_bpf(code, 0x12345678, nr, 0x5412) == ALLOW


TOOL = r"""
import errno, fcntl, termios
asked = (("sti", termios.TIOCSTI, b"x"), ("size", termios.TIOCGWINSZ, b"\0" * 8))
for name, request, argument in asked:
    try:
        fcntl.ioctl(0, request, argument)
        print(name, "ok", flush=True)
    except OSError as exc:
        print(name, errno.errorcode[exc.errno], flush=True)
"""

RUNNER = """
import os, sys
from cortexfs.policy import Identity
from cortexfs.tools import spawn
tool = [sys.executable, "-I", "-c", sys.argv[1]]
identity = Identity(int(sys.argv[2]), int(sys.argv[3]))
spec = spawn.ProcessSpec(tool, {"PATH": "/usr/bin:/bin"}, "/", identity, 60, network=True)
print("status=%d" % spawn.run_attached(spec).exit_status, flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="an agent's identity is switched to by root")
@pytest.mark.skipif(no_typing.refuse_typing() is None, reason="no filter for this machine")
def test_a_tool_on_roots_terminal_as_an_agent_cannot_type_into_it(
    unprivileged_user: UnprivilegedUser,
) -> None:
    user = unprivileged_user
    pid, master = pty.fork()
    if pid == 0:  # the runner, on the terminal as root's shell would run it
        argv = [sys.executable, "-c", RUNNER, TOOL, str(user.uid), str(user.gid)]
        os.execv(sys.executable, argv)
    screen = b""
    deadline = time.monotonic() + 60
    try:
        while b"status=" not in screen:
            assert time.monotonic() < deadline, screen
            if select.select([master], [], [], 1)[0]:
                try:
                    screen += os.read(master, 4096)
                except OSError:
                    break
    finally:
        os.waitpid(pid, 0)
        os.close(master)
    assert b"sti EPERM" in screen, screen
    assert b"size ok" in screen, screen
    assert b"status=0" in screen, screen
