"""No tool types into its caller's terminal (SPEC T-3, T-5).

A tool run in terminal CLI mode is a job of its caller's terminal: it shares the caller's
session, so that Ctrl-C, Ctrl-Z and ``fg`` reach it as they reach any job.  The kernel lets
any process push bytes into the input of its controlling terminal with ``ioctl(TIOCSTI)``
(where ``dev.tty.legacy_tiocsti`` is on, the default of most kernels), whatever its uid: an
agent's tool run by root on root's terminal could type a command that root's shell runs as
root once the call ends.  ``TIOCLINUX`` can do the same on a virtual console.

So a tool started under an agent's identity by root gets a seccomp filter that answers both
``EPERM``, as a kernel without legacy TIOCSTI does, and lets every other system call through.
The filter is set in the child before the exec of setpriv (root needs no ``no_new_privs``
for it), and it is kept across that exec, the switch of ids and the tool's own exec, by
whatever the tool starts.  The BPF program checks the architecture first: a system call of
an architecture it was not written for (a 32-bit program on a 64-bit kernel) would carry
other numbers, and is looked at with that architecture's own.

On an architecture this module has no numbers for, no filter is set (:func:`refuse_typing`
is None), as on a kernel without seccomp.  ctypes is loaded on first use only: ``ctx run``
starts without it (tests/tools/test_startup.py).
"""

from __future__ import annotations

import errno
import functools
import os
import platform
import struct
from collections.abc import Callable
from typing import Any

from cortexfs.libc import prctl as libc_prctl

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_SECCOMP_RET_ALLOW = 0x7FFF0000
_SECCOMP_RET_ERRNO = 0x00050000
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C
_X32_SYSCALL_BIT = 0x40000000

# seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little endian:
# the low 32 bits of args[1], the ioctl's request, are at offset 24).
_NR, _ARCH, _ARG1_LOW = 0, 4, 24
# BPF: ld|w|abs, jmp|jeq|k, ret|k
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06

# The ioctl system call's numbers, by audit architecture, for each kernel this may run on.
_IOCTL = {
    "x86_64": {0xC000003E: (16, _X32_SYSCALL_BIT | 514), 0x40000003: (54,)},
    "aarch64": {0xC00000B7: (29,), 0x40000028: (54,)},
}


def _program(ioctls: dict[int, tuple[int, ...]]) -> list[tuple[int, int, int, int]]:
    """The BPF instructions: for each architecture, its ioctl numbers, then the two
    requests refused; everything else allowed."""
    deny = (_RET_K, 0, 0, _SECCOMP_RET_ERRNO | errno.EPERM)
    allow = (_RET_K, 0, 0, _SECCOMP_RET_ALLOW)
    requests = [
        (_LD_W_ABS, 0, 0, _ARG1_LOW),
        (_JEQ_K, 2, 0, _TIOCSTI),  # to deny
        (_JEQ_K, 1, 0, _TIOCLINUX),  # to deny
        allow,
        deny,
    ]
    program: list[tuple[int, int, int, int]] = []
    for arch, numbers in ioctls.items():
        # [ld arch; jeq arch else next arch; ld nr; jeq n1 → requests; …; allow; requests…]
        block: list[tuple[int, int, int, int]] = [(_LD_W_ABS, 0, 0, _NR)]
        for i, number in enumerate(numbers):
            to_requests = len(numbers) - i  # past the rest of the checks and the allow
            block.append((_JEQ_K, to_requests, 0, number))
        block.append(allow)
        block += requests
        program += [(_LD_W_ABS, 0, 0, _ARCH), (_JEQ_K, 0, len(block), arch), *block]
    program.append(allow)  # an architecture of none of these: not an ioctl of ours to judge
    return program


@functools.cache
def _filter() -> tuple[Any, Any] | None:
    """The program's code and the ``sock_fprog`` naming it, made once: the child between
    fork and exec may not allocate.  None where this machine has no filter."""
    ioctls = _IOCTL.get(platform.machine())
    if ioctls is None or not _kernel_has_seccomp():
        return None
    import ctypes

    instructions = _program(ioctls)
    code = ctypes.create_string_buffer(
        b"".join(struct.pack("=HBBI", op, jt, jf, k) for op, jt, jf, k in instructions)
    )

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    return code, SockFprog(len(instructions), ctypes.addressof(code))


def _kernel_has_seccomp() -> bool:
    """Whether this kernel has seccomp: its processes' status then names their mode."""
    try:
        with open("/proc/self/status", "rb") as status:
            return any(line.startswith(b"Seccomp:") for line in status)
    except OSError:
        return True  # no /proc to ask: try, and fail closed (refuse_typing)


@functools.cache
def refuse_typing() -> Callable[[], None] | None:
    """What the child runs between fork and exec to set the filter; None where there is no
    filter for this machine.  A few system calls, through objects made before the fork: it
    runs in a child forked from a process that may have threads."""
    made = _filter()
    if made is None:
        return None
    import ctypes

    prctl = libc_prctl()
    pointer = ctypes.addressof(made[1])

    def in_child() -> None:
        if prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, pointer, 0, 0) == 0:
            return
        # Without CAP_SYS_ADMIN (a root of fewer capabilities, or after subprocess switched
        # the ids) the kernel takes a filter only under no_new_privs: the tool then gains
        # nothing through a set-user-ID program either, which an agent's tool has no need of.
        prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, pointer, 0, 0) != 0:
            os._exit(_NOT_STARTED)  # fail closed: a tool that could type there never runs

    return in_child


_NOT_STARTED = 126  # as a shell reports a command found but not run
