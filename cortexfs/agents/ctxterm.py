"""``ctxterm`` in the foreground: one agent terminal, served by the calling process (SPEC H-1,
A-1).

``ctx agent start`` leaves the terminal running in a daemon of its own; ``bin/ctxterm`` (written
by ``ctx bootstrap``) is the same terminal for a host that wants it in the foreground — under a
service manager, in a host terminal — and ends when the terminal ends.  Everything the terminal
does is :class:`~cortexfs.agents.terminal.Terminal`'s; this module only runs it here instead of
in a forked daemon.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from cortexfs.agents.host import require_host_administrator
from cortexfs.agents.terminal import Terminal
from cortexfs.libc import libc

PROCESS_NAME = b"ctxterm"
_PR_SET_NAME = 15


def take_the_name() -> None:
    """Call this process ``ctxterm`` (its ``comm``, what ps, top and ``pgrep -x`` show): the
    process that owns an agent's PTY is ctxterm (A-1), whether ``ctx agent start`` forked it
    or ``bin/ctxterm`` runs it in the foreground."""
    import ctypes

    # A function object of its own (indexing makes a new one): prctl's shared one may carry
    # the argument types another caller gave it (cortexfs.tools.orphans).
    prctl = libc()["prctl"]
    prctl.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl(_PR_SET_NAME, PROCESS_NAME, 0, 0, 0)


def start_terminal(root: Path, agent: str, session: str, workspace: Path | None) -> Terminal:
    """The checks and the start of ``ctx agent start``, in this process: a terminal that
    listens and runs tsh, with its pid recorded for ``ctx agent stop``."""
    require_host_administrator(root, "start an agent")
    take_the_name()
    terminal = Terminal(root, agent, session, workspace)
    terminal.prepare()
    try:
        terminal.start()
        terminal.runtime.record_pid(os.getpid())
    except BaseException:
        terminal.close()
        raise
    return terminal


def serve_in_foreground(terminal: Terminal) -> int:
    """Serve ``terminal`` until tsh exits or it is stopped (``ctx agent stop``, SIGTERM, or
    Ctrl-C in the host's terminal, which stops it the same way); tsh's exit status."""
    signal.signal(signal.SIGINT, lambda *_: os.kill(os.getpid(), signal.SIGTERM))
    return terminal.serve()
