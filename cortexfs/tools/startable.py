"""Whether the kernel will start a tool's program, judged before the start (T-5).

The tool is started through setpriv or unshare, which exec it with ``execvp``: a text with no
``#!`` line, or a binary in no format the kernel starts, would run as a ``/bin/sh`` script
where the kernel refuses it, and a launcher's one-line complaint about an interpreter would
read as the tool's own exit status 126 or 127.
So a script's ``#!`` interpreter, and that interpreter's own, are looked at first, as the
kernel reads them and as the agent's identity would be refused them (setpriv makes the exec
still holding root's capabilities, which pass any execute bit).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import struct
from pathlib import Path

from cortexfs.policy import Identity
from cortexfs.policy.linux import permits
from cortexfs.storage import mounted_noexec


class InterpreterRefused(OSError):
    """The exec of a script refused before the start for the interpreter its ``#!`` line
    names (``filename2``; ``filename`` is the script), as the kernel would refuse it; its
    errno alone would name neither that interpreter nor what is wrong with it, which
    ``reason`` says."""

    def __init__(self, code: int, program: str, interpreter: str, reason: str) -> None:
        super().__init__(code, os.strerror(code), program, None, interpreter)
        self.reason = reason


def require_startable(program: str, cwd: str, identity: Identity | None) -> None:
    """Raise, as the kernel refuses the exec of ``program`` started in ``cwd`` as ``identity``
    (None: as this process), ENOEXEC for a file of text with no ``#!`` line (an empty or
    truncated script), or for a binary in no format the kernel starts (an ELF file cut
    short, no ``binfmt_misc`` format registered): setpriv and unshare start a program with
    ``execvp``,
    which runs such a file with ``/bin/sh`` instead, where Python's own exec (a caller not
    root) is refused — an emptied guard must not let every call through as an empty script.
    And :class:`InterpreterRefused` for a script whose ``#!`` interpreter the kernel would
    refuse: ENOENT for one that is not there (gone, or a ``#!/bin/sh`` saved with CRLF line
    ends, whose name ends in a carriage return); EACCES for one that is no regular file, lies
    on a filesystem mounted noexec, or has no execute bit for the identity the exec is made
    as (the agent's, judged by its mode bits: root's own access() would grant any bit);
    ENOEXEC for one that is itself a text with no ``#!`` line (an empty file): execvp would
    run the script with ``/bin/sh`` then too.  On the caller's terminal the
    launcher's one line goes to the person, not to the runner: looked at before the start,
    such a tool is recorded as one that could not start, never as a tool that exited 126 or
    127.  An interpreter that is a script is judged as the kernel follows it, up to
    :data:`_MOST_INTERPRETERS` deep.  The kernel's reading of the line: the name runs to the
    first blank, line end or NUL, and a relative one is taken from the working directory."""
    if not os.path.isabs(program):
        return  # a name looked for on PATH, or relative to another directory: the start's
    # The file looked at last (the tool, then each interpreter in turn), its first bytes, and
    # the script whose #! line named it.
    script, head, named_by = program, _head_of(program), program
    for _ in range(_MOST_INTERPRETERS):
        named = None if head is None else _interpreter_named(head)
        if named is None:
            break
        interpreter = os.fsdecode(os.path.join(os.fsencode(cwd), named))
        refusal = _interpreter_refusal(interpreter, identity)
        if refusal is not None:
            code, what = refusal
            reason = _its_interpreter(interpreter, script, program, what)
            raise InterpreterRefused(code, program, interpreter, reason)
        script, head, named_by = interpreter, _head_of(interpreter), script
    if head is None:
        return  # no regular file to read: the start says what is wrong with it
    binary = not head.startswith(b"#!") and b"\0" in head
    if binary and _a_binary_the_kernel_may_start(script, head):
        return  # the kernel's to judge further
    if not binary and _interpreter_named(head) is not None:
        return  # deeper than the kernel follows: its ELOOP is the start's to report
    if script == program:
        raise OSError(errno.ENOEXEC, os.strerror(errno.ENOEXEC), program)
    what = (
        "is no program: a file in no format the kernel executes (an ELF file cut short, say)"
        if binary
        else "is no program: a text with no #! line of its own (an empty file, say), which "
        "the kernel does not execute"
    )
    reason = _its_interpreter(script, named_by, program, what)
    raise InterpreterRefused(errno.ENOEXEC, program, script, reason)


_SHEBANG_BYTES = 256  # as much of a script's first line as the kernel reads (BINPRM_BUF_SIZE)
# How many interpreters in turn the kernel follows, a script's interpreter being a script
# itself, before it refuses the exec (ELOOP).
_MOST_INTERPRETERS = 4


# What the kernel reads of an ELF file before it starts it: e_ident's class (32 or 64 bits)
# and byte order, then from offset 16 e_type, e_machine, e_version, e_entry, e_phoff, e_shoff,
# e_flags, e_ehsize, e_phentsize and e_phnum.
_ELF_HEADERS = {1: ("HHIIIIIHHH", 52), 2: ("HHIQQQIHHH", 64)}
_ELF_RUNNABLE_TYPES = (2, 3)  # ET_EXEC, ET_DYN
_BINFMT_MISC = Path("/proc/sys/fs/binfmt_misc")


def _a_binary_the_kernel_may_start(path: str, head: bytes) -> bool:
    """Whether a file that is no script (a NUL in its first bytes, no ``#!``) is in a format
    the kernel may start: an ELF file whose header and program headers it holds whole, or
    anything while a ``binfmt_misc`` format is registered, whose rules are the kernel's.
    What the kernel refuses (ENOEXEC) setpriv's ``execvp`` would hand to ``/bin/sh`` as a
    script: the lines of a binary cut short would run as commands."""
    if head.startswith(b"\x7fELF"):
        return _whole_elf(path, head)
    return _binfmt_misc_formats()


def _whole_elf(path: str, head: bytes) -> bool:
    layout = _ELF_HEADERS.get(head[4]) if len(head) > 5 else None
    if layout is None or head[5] not in (1, 2):
        return False
    fields, size = layout
    if len(head) < size:
        return False  # the file ends inside its own header
    order = "<" if head[5] == 1 else ">"
    unpacked = struct.unpack_from(order + fields, head, 16)
    kind, table, entry_size, entries = unpacked[0], unpacked[4], unpacked[8], unpacked[9]
    try:
        length = os.stat(path).st_size
    except OSError:
        return True  # gone meanwhile: the start says so
    return kind in _ELF_RUNNABLE_TYPES and entries > 0 and table + entry_size * entries <= length


def _binfmt_misc_formats() -> bool:
    """Whether formats are registered with ``binfmt_misc`` (its ``register`` and ``status``
    files aside); none is known where it is not mounted."""
    try:
        return any(name not in ("register", "status") for name in os.listdir(_BINFMT_MISC))
    except OSError:
        return False


def _head_of(path: str) -> bytes | None:
    """The first bytes of the regular file at ``path``, as many as the kernel reads to know
    how to start it; None when it is no regular file or cannot be read (the start then says
    what is wrong with it, with the kernel's errno)."""
    try:
        # Never waited on: a FIFO put at the name since it was resolved is the start's to
        # refuse.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, _SHEBANG_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)


def _interpreter_named(head: bytes) -> bytes | None:
    """The interpreter the ``#!`` line at the start of ``head`` names; None without such a
    line, or when it names none (which the kernel refuses as ENOEXEC, as it refuses a text
    with no ``#!`` line: the caller judges both alike)."""
    if not head.startswith(b"#!"):
        return None
    line = head[2:].split(b"\n", 1)[0].split(b"\0", 1)[0].lstrip(b" \t")
    return re.split(rb"[ \t]", line, maxsplit=1)[0] or None


def _interpreter_refusal(interpreter: str, identity: Identity | None) -> tuple[int, str] | None:
    """The errno the kernel refuses the exec of ``interpreter`` with, as ``identity`` (None:
    this process) would make it, and what is wrong with it; None when it would open it."""
    try:
        status = os.stat(interpreter)
    except OSError as exc:
        code = exc.errno or errno.ENOENT
        reached = "is not there" if code == errno.ENOENT else f"cannot be reached ({exc.strerror})"
        return code, reached
    if not stat.S_ISREG(status.st_mode):
        return errno.EACCES, "is not a regular file, which the kernel does not execute"
    if mounted_noexec(Path(interpreter)):
        return errno.EACCES, "is on a filesystem mounted noexec, where the kernel executes nothing"
    if identity is None:
        if os.access(interpreter, os.X_OK):
            return None
        uid, gid = os.geteuid(), os.getegid()
    else:
        # By the agent's mode bits, as T-5 has it: setpriv makes the exec still holding
        # root's capabilities, which pass any execute bit and search every directory.
        who = f"uid {identity.uid} gid {identity.gid}"
        for directory in reversed(Path(os.path.realpath(interpreter)).parents):
            with contextlib.suppress(OSError):  # gone meanwhile: the start says so
                above = os.stat(directory)
                if not permits(above, identity, os.X_OK):
                    return errno.EACCES, (
                        f"lies below {directory}, which the tool's {who} may not search "
                        f"({_mode_and_owner(above)})"
                    )
        if permits(status, identity, os.X_OK):
            return None
        uid, gid = identity.uid, identity.gid
    return errno.EACCES, (
        f"has no execute bit for the tool's uid {uid} gid {gid} ({_mode_and_owner(status)})"
    )


def _mode_and_owner(status: os.stat_result) -> str:
    return f"mode {stat.S_IMODE(status.st_mode):04o}, owner {status.st_uid}:{status.st_gid}"


def _its_interpreter(interpreter: str, script: str, program: str, what: str) -> str:
    """What :class:`InterpreterRefused` says of ``interpreter``, named on the ``#!`` line of
    ``script`` (``program`` itself, or an interpreter of it that is a script)."""
    where = "its #! line" if script == program else f"the #! line of {script}"
    return f"its interpreter {interpreter}, named on {where}, {what}"
