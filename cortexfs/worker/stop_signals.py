"""The signals that stop a worker, taken from the first step of its command (SPEC W-4).

SIGTERM and SIGHUP (and a first SIGINT) stop a worker: it claims no more jobs, lets the
running ones finish, and exits 0 (docs/workers.md).  At their default action they end a
process at once and without a word (exit 143, 129), and the worker's own handlers
(:meth:`~cortexfs.worker.loop.Worker.install_signal_handlers`) can only be set once the
worker is made, after its modules are imported, its queue opened and its session created:
some 100 ms in which a supervisor's SIGTERM would make a starting worker vanish with no word.
So the command takes these signals as its first step with an :class:`EarlyStop`, which only
notes the signal (whatever startup is doing finishes: no session left half made), and stops
before it claims anything.

This module imports nothing of the worker: taking the signals must not wait for the imports.
"""

from __future__ import annotations

import signal
from types import FrameType

# SIGHUP too, as for 'ctx mount': a terminal or ssh session that closes is no reason to kill
# a job midway and leave it claimed.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class EarlyStop:
    """Notes a stop signal that arrives while the worker starts, until the worker takes the
    signals over (:attr:`stopped_by`: the first one's name, or None)."""

    def __init__(self) -> None:
        self.stopped_by: str | None = None

    @classmethod
    def catch(cls) -> EarlyStop:
        """Take :data:`STOP_SIGNALS` from now on, and SIGINT, whose first arrival stops a
        worker as they do (a KeyboardInterrupt midway through making the worker's session
        would leave it half made)."""
        early = cls()
        for signum in (*STOP_SIGNALS, signal.SIGINT):
            signal.signal(signum, early._note)
        return early

    def _note(self, signum: int, frame: FrameType | None) -> None:
        if self.stopped_by is None:
            self.stopped_by = signal.Signals(signum).name
