"""``shell.exec``: run one ``/bin/sh -c`` command as the agent (SPEC R-5, T-2).

Input ``{"cmd": str, "cwd": str = CTX_CWD, "stdin": str}``.  ``cwd`` is a directory inside the
agent's visible mounts, resolved like every ``fs.*`` path.  The tool then *becomes* the shell:
the command's stdout is the call's output (its JSON value when it prints one), its stderr the
call's stderr, its exit status the call's; the runner's timeout and output bound apply to it and
everything it starts, all in the call's process group.  ``stdin`` is fed to the command when
given; otherwise the command reads nothing (native mode) or the caller's terminal (terminal
CLI mode).

The command runs with the agent's uid, gid and groups and the tool's environment, so the
kernel's mode bits bound what it can touch; it is not confined to the mounts (only a sandbox,
SPEC A-1, can do that), which is why ``shell.exec`` is a permission-bearing tool (H-3).

A host without a shell the agent may run at ``/bin/sh`` fails the call with the kernel's errno
(ENOENT when it is missing) and a sentence naming ``/bin/sh``; a ``cmd`` longer than the kernel
passes to a program as one argument fails with E2BIG, naming its size and that bound.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable
from typing import NoReturn

from cortexfs.tools.core import confine
from cortexfs.tools.core.toolio import ToolFailure, core_main, main_parameter, require

SHELL = "/bin/sh"


def execute(request: dict[str, object], native: bool) -> NoReturn:
    command = _shell_text(require(request, "cmd", str), "cmd")
    view = confine.View.from_environment(os.environ)
    place = view.locate(require(request, "cwd", str, str(view.cwd)))
    directory = confine.open_directory(place)
    try:
        # Within the reporting: the directory opens without search permission (O_PATH), and
        # the kernel refuses only here, which must name the directory as fs.list names it.
        with confine.reporting(place):
            os.fchdir(directory)
    finally:
        os.close(directory)
    if "stdin" in request:
        _feed_stdin(_utf8(require(request, "stdin", str), "stdin"))
    elif native:
        _feed_stdin(b"")
    # Python ignores SIGPIPE and SIGXFSZ, and an ignored signal stays ignored across exec:
    # the command gets them back as every program expects them (``yes | head -1`` ends with
    # 141, a write past ``ulimit -f`` with 153), as subprocess gives them to a manifest tool.
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_DFL)
    try:
        os.execv(SHELL, [SHELL, "-c", command])
    except OSError as exc:
        if exc.errno == errno.E2BIG:
            # Too long for any program, not the shell at fault; and the kernel's bare "Argument
            # list too long" names neither the input nor the bound it passed.
            raise ToolFailure(errno.E2BIG, _too_long(command)) from None
        # The kernel names no path: alone, "ENOENT: No such file or directory" does not say
        # that it is the shell the host lacks.
        raise ToolFailure(
            exc.errno,
            f"cannot run {SHELL}: {exc.strerror}; shell.exec needs a POSIX shell at {SHELL}",
        ) from None


def _too_long(command: bytes) -> str:
    """Why the kernel refused to start ``command`` (E2BIG): longer than one argument may be
    (``MAX_ARG_STRLEN`` of linux/binfmts.h, 32 pages, its final NUL included), or, short of
    that, more than the arguments and environment of a program may hold together."""
    limit = 32 * os.sysconf("SC_PAGE_SIZE")
    if len(command) >= limit:
        return (
            f"cmd is {len(command)} bytes, more than the kernel passes to a program as one "
            f"argument ({limit} bytes, its final NUL included); nothing was run"
        )
    return (
        f"cmd ({len(command)} bytes) and the environment together are more than the kernel "
        "passes to a program; nothing was run"
    )


def _shell_text(text: str, key: str) -> bytes:
    """``text`` as the bytes of a command line, as the kernel takes an argument (a byte that
    is not UTF-8 given as its surrogate escape); a NUL, which no argument can hold, or a lone
    surrogate of no byte is a bad input (EINVAL)."""
    if "\0" in text:
        raise ToolFailure(errno.EINVAL, f"{key} must not contain NUL", usage=True)
    return _utf8(text, key, os.fsencode)


def _utf8(text: str, key: str, encode: Callable[[str], bytes] = str.encode) -> bytes:
    try:
        return encode(text)
    except UnicodeEncodeError as exc:
        raise ToolFailure(
            errno.EINVAL,
            f"{key} holds {text[exc.start]!r} at character {exc.start}, a lone surrogate, "
            "which is no text",
            usage=True,
        ) from None


def _feed_stdin(data: bytes) -> None:
    """Make ``data`` the command's whole stdin (an anonymous in-memory file, any size)."""
    memory = os.memfd_create("shell.exec-stdin")
    view = memoryview(data)
    while view:
        view = view[os.write(memory, view) :]
    os.lseek(memory, 0, os.SEEK_SET)
    os.dup2(memory, 0)
    os.close(memory)


def run() -> int:
    return core_main("shell.exec", main_parameter("cmd"), execute)
