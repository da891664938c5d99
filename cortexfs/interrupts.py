"""Holding Ctrl-C back while a transition runs, so that it completes or never starts; and
SIGTERM or SIGHUP ending a tool call as Ctrl-C does (:func:`stops_raise`).

A crash may stop a queue transition between any two steps, and ``recover`` knows what each
such stop leaves (docs/queue.md).  Ctrl-C is no crash: the process is alive and could finish
what it began.  Stopped halfway by a ``KeyboardInterrupt`` it would instead leave, say, a
claim without a lease — a job nobody runs until someone reconciles the queue — or a job that
was published without its name ever being printed.  :func:`held_interrupts` defers SIGINT
while a block runs: a Ctrl-C in the block takes effect as soon as it ends, with the handler
that was in place (Python's, which raises ``KeyboardInterrupt``, or a worker's own).

Only the main thread runs Python signal handlers, so only there is anything to hold; in
other threads, and where SIGINT is ignored or left to the kernel (the default action kills
the process, which is a crash), the block runs as it is.  Blocks nest.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

_state = threading.local()


@contextlib.contextmanager
def held_interrupts() -> Iterator[None]:
    """Run the block with SIGINT deferred until its end (see the module docstring)."""
    if threading.current_thread() is not threading.main_thread() or getattr(
        _state, "holding", False
    ):
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):
        yield
        return
    caught: list[tuple[int, FrameType | None]] = []

    def defer(signum: int, frame: FrameType | None) -> None:
        caught.append((signum, frame))

    signal.signal(signal.SIGINT, defer)
    _state.holding = True
    try:
        yield
    finally:
        _state.holding = False
        signal.signal(signal.SIGINT, previous)
        if caught:
            previous(*caught[0])


def caused_by_interrupt(error: BaseException) -> bool:
    """Whether ``error`` is a KeyboardInterrupt, or an exception the interpreter raised in
    its place (Python 3.11 turns one raised while a class body's ``__set_name__`` runs, as
    a Ctrl-C during an import may be, into a RuntimeError whose cause it is)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def report_interrupts_later() -> None:
    """Keep a Ctrl-C that lands where Python cannot raise it (a weakref callback of the
    import machinery, the threading module's shutdown) from printing "Exception ignored"
    with a traceback: it is raised again at the next point where it can be, or, while the
    interpreter is already ending, dropped.  Every other such report is printed as before."""
    default = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            default(unraisable)
        elif not sys.is_finalizing():
            signal.raise_signal(signal.SIGINT)

    sys.unraisablehook = hook


def reset_inherited_signal_state() -> None:
    """Undo what a parent may have left set for its children and ctx relies on: a SIGCHLD
    ignored, under which the kernel reaps every child at once and a wait answers ECHILD (a
    tool's exit status would be lost, a failing job finished as done), and signals blocked,
    under which the SIGTERM that stops a worker or a terminal would wait forever.  A service
    manager, a CI runner or a shell script's ``trap '' CHLD`` leaves them so; ctx, like a
    daemon starting, begins with no signal blocked and SIGCHLD at its default (which its
    tools then inherit too).  SIGHUP ignored by ``nohup`` is left as it is."""
    if signal.getsignal(signal.SIGCHLD) == signal.SIG_IGN:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


class Stopped(BaseException):
    """SIGTERM or SIGHUP, raised where :func:`stops_raise` asked for it.  A BaseException, as
    KeyboardInterrupt is: it ends what runs, and only what must record how it ended (a tool
    call's ``tool_result``) looks at it on the way out."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


@contextlib.contextmanager
def stops_raise() -> Iterator[None]:
    """Run the block with SIGTERM and SIGHUP raising :class:`Stopped` in it, where their
    default would end the process on the spot: ``timeout``, a service manager or a closed
    terminal stopping ``ctx run`` then leaves the call recorded as ended, its ``tool_result``
    beside its ``tool_call`` (S-2), as Ctrl-C leaves it.  A signal its caller set to be
    ignored stays ignored; in other threads the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise Stopped(signum)

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) == signal.SIG_DFL:
            previous[signum] = signal.signal(signum, stop)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
