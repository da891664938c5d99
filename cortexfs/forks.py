"""What a child forked from a process with threads finds of them.

``fork`` copies the calling thread alone.  A lock another thread held at that moment stays
held in the child, for good: the thread that would let it go is not there.  The tool runner
is called from threads and from children forked while other threads call it (T-3), so the
state it keeps across calls is guarded by a :class:`ProcessLock`, which a child gets unheld.

An import under way in another thread at the fork is such a lock too: the interpreter keeps
one per module being imported, and a child's first import of that module waits for it
forever.  CortexFS imports much on first use, to keep ``ctx``'s start short (``jsonschema``,
``ctypes``, ``psutil``), so a call's first steps in another thread are imports: before a
fork, the forking thread lets the imports under way finish (:func:`_finish_imports_under_way`),
for :data:`IMPORT_WAIT_SECONDS` at most.  ``os.fork`` runs these hooks, and so does a
``subprocess`` given a ``preexec_fn`` (the runner starts its tools so); the wait costs a look
at ``threading.active_count()`` in a process with one thread.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
import weakref
from types import TracebackType


class ProcessLock:
    """A ``threading.Lock`` for state a process keeps across calls, held by nobody in a child
    forked while another thread held it (and still by the forking thread, should it hold it
    itself).  What it guards must be whole between any two statements of its holders (a
    dict replaced at once, a count): the child goes on with it as the fork found it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: int | None = None
        _KEPT.add(self)

    def __enter__(self) -> None:
        self._lock.acquire()
        self._holder = threading.get_ident()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._holder = None
        self._lock.release()

    def _renew(self) -> None:
        """In a child: the lock anew, held only if the thread that forked held it."""
        self._lock = threading.Lock()
        if self._holder == threading.get_ident():
            self._lock.acquire()
        else:
            self._holder = None


_KEPT: weakref.WeakSet[ProcessLock] = weakref.WeakSet()

# How long a fork waits for the imports other threads have under way.  One of them may wait
# for a lock the forking thread holds (a library's own fork hook takes its lock before ours
# runs): past this wait the fork goes on, and a child that imports that module may wait, as
# it would have without the hook.
IMPORT_WAIT_SECONDS = 2.0

_interrupted_while_waiting = False


def _finish_imports_under_way() -> None:
    """Let the imports other threads have under way end: a thread of its own imports each
    module ``sys.modules`` shows initializing, which waits on that module's lock until its
    import ends, and the forking thread waits for that thread.  The forking thread's own
    imports under way (a module that forks as it is imported) are left out: it holds their
    locks.  A module still being found, not yet in ``sys.modules``, is not seen."""
    global _interrupted_while_waiting
    if threading.active_count() == 1:
        return  # no other thread to have an import under way
    own = _imports_of_this_thread()
    under_way = [
        name
        for name, module in list(sys.modules.items())
        if getattr(getattr(module, "__spec__", None), "_initializing", False) and name not in own
    ]
    if not under_way:
        return
    waiter = threading.Thread(
        target=_import_each, args=(under_way,), name="imports-before-fork", daemon=True
    )
    waiter.start()
    try:
        waiter.join(IMPORT_WAIT_SECONDS)
    except KeyboardInterrupt:
        # A hook's exception is only printed: the interrupt is raised again after the fork.
        _interrupted_while_waiting = True


def _imports_of_this_thread() -> set[str]:
    """The modules whose code the calling thread is running as it imports them."""
    names = set()
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            names.add(frame.f_globals.get("__name__", ""))
        frame = frame.f_back
    return names


def _import_each(names: list[str]) -> None:
    for name in names:
        # Its failure is the importing thread's to report, not the fork's.
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _interrupt_again_in_the_parent() -> None:
    global _interrupted_while_waiting
    if _interrupted_while_waiting:
        _interrupted_while_waiting = False
        signal.raise_signal(signal.SIGINT)


def _renewed_in_a_child() -> None:
    global _interrupted_while_waiting
    _interrupted_while_waiting = False  # the parent's to raise
    for lock in list(_KEPT):
        lock._renew()


os.register_at_fork(
    before=_finish_imports_under_way,
    after_in_parent=_interrupt_again_in_the_parent,
    after_in_child=_renewed_in_a_child,
)
