"""What a child forked from a process with threads finds of them.

``fork`` copies the calling thread alone.  A lock another thread held at that moment stays
held in the child, for good: the thread that would let it go is not there.  The tool runner
is called from threads and from children forked while other threads call it (T-3), so the
state it keeps across calls is guarded by a :class:`ProcessLock`, which a child gets unheld.

An import under way in another thread at the fork is such a lock too: the interpreter keeps
one per module being imported, and a child's first import of that module waits for it
forever.  CortexFS imports much on first use, to keep ``ctx``'s start short (``jsonschema``,
``ctypes``, ``psutil``), so a call's first steps in another thread are imports: before a
fork, the forking thread lets the imports under way finish (:func:`_finish_imports_under_way`).
Only ``os.fork`` runs these hooks; a ``subprocess`` starts its program without them.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import weakref
from types import TracebackType


class ProcessLock:
    """A ``threading.Lock`` for state a process keeps across calls, held by nobody in a child
    forked while another thread held it.  What it guards must be whole between any two
    statements of its holders (a dict replaced at once, a count): the child goes on with
    it as the fork found it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _KEPT.add(self)

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._lock.release()

    def _renew(self) -> None:
        self._lock = threading.Lock()


_KEPT: weakref.WeakSet[ProcessLock] = weakref.WeakSet()


def _renewed_in_a_child() -> None:
    for lock in list(_KEPT):
        lock._renew()


def _finish_imports_under_way() -> None:
    """Wait for each module another thread is importing: importing it again waits on its
    lock until that import ends (the forking thread's own imports under way are re-entered
    and returned at once).  A module still being found, not yet in ``sys.modules``, is not
    seen; the time an import takes is spent running the module, once it is there."""
    under_way = [
        name
        for name, module in list(sys.modules.items())
        if getattr(getattr(module, "__spec__", None), "_initializing", False)
    ]
    for name in under_way:
        # Its failure is the importing thread's to report, not the fork's.
        with contextlib.suppress(Exception):
            importlib.import_module(name)


os.register_at_fork(before=_finish_imports_under_way, after_in_child=_renewed_in_a_child)
