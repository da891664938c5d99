"""Tool processes without network access, unless the agent's policy grants it (P-4).

``allow <label> network:default connect`` is the only way to the network.  Without it a tool
(and its hooks) runs in a network namespace of its own that holds nothing but a loopback device
that is down: every ``connect``, even to ``127.0.0.1`` of the host, fails with ``ENETUNREACH``.

How the namespace is entered depends on who the host is:

* **root** — the process keeps one such namespace for all its calls (created on the first
  one, kept alive by a descriptor).  The calling thread joins it with ``setns`` just while it
  starts the tool, which inherits it, and returns at once.  A worker pays for the namespace
  once instead of once per job, and nothing extra is executed.
* **anyone else** — ``unshare --user --map-current-user --net`` is put in front of the tool:
  an unprivileged process may make a network namespace only inside a user namespace of its
  own, and cannot come back out of one, so the new namespaces belong to the tool alone.  The
  tool keeps its uid (mapped onto itself), its groups and its pid.

When a namespace cannot be made (no ``CAP_SYS_ADMIN``, user namespaces switched off) the call
is refused with ``EACCES`` rather than run with the network: default deny (P-2).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import subprocess
import threading
from collections.abc import Callable, Iterator

from cortexfs.errors import CtxError
from cortexfs.forks import ProcessLock
from cortexfs.libc import check, libc
from cortexfs.tools.host_programs import find_program

_CLONE_NEWNET = 0x40000000
_OWN_NAMESPACE = "/proc/thread-self/ns/net"
_UNSHARE = find_program("unshare")

_offline_namespace: int | None = None
# A child forked while another thread made the namespace gets it unheld; the namespace, if
# made, is inherited with its descriptor.
_creating = ProcessLock()


def argv_prefix() -> list[str]:
    """What a non-root host puts in front of a tool's argv to start it offline."""
    if _UNSHARE is None:
        raise _cannot_isolate("unshare(1) from util-linux is not installed")
    prefix = [_UNSHARE, "--user", "--map-current-user", "--net", "--"]
    _require_working(tuple(prefix))
    return prefix


@functools.cache
def _require_working(prefix: tuple[str, ...]) -> None:
    """Try the prefix once per process, so that a host without user namespaces refuses the
    call with a reason instead of reporting unshare's failure as the tool's."""
    probe = subprocess.run(
        [*prefix, "true"], stdin=subprocess.DEVNULL, capture_output=True, text=True
    )
    if probe.returncode != 0:
        message = probe.stderr.strip().splitlines()[-1:] or [f"exit {probe.returncode}"]
        raise _cannot_isolate(message[0])


def require_possible() -> None:
    """EACCES, as a call would be refused, when this host cannot start a process offline:
    asked once by a worker before it claims a job that would meet it (a seccomp filter may
    refuse namespaces to a root that holds every capability, as container runtimes do)."""
    if os.geteuid() == 0:
        _offline()
    else:
        argv_prefix()


@contextlib.contextmanager
def this_thread() -> Iterator[None]:
    """Run the block with the calling thread in the offline namespace (root only): processes
    started inside it stay there; the thread itself is back in its own namespace afterwards."""
    offline = _offline()
    own = os.open(_OWN_NAMESPACE, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _setns(offline)
        try:
            yield
        finally:
            _setns(own)  # namespaces are per thread: only this thread ever moved
    finally:
        os.close(own)


def _offline() -> int:
    """The descriptor of this process's offline namespace, made on first use."""
    global _offline_namespace
    with _creating:
        if _offline_namespace is None:
            _offline_namespace = _in_a_thread_of_its_own(_new_offline_namespace)
        return _offline_namespace


def _new_offline_namespace() -> int:
    """A new network namespace, made by the calling thread, which then goes back to its own:
    proof that a thread can go there and return (a root of a user namespace can leave the
    network namespace of its parent, but not come back to it)."""
    own = os.open(_OWN_NAMESPACE, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _unshare_network()
        offline = os.open(_OWN_NAMESPACE, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(own)
        except OSError as exc:
            os.close(offline)
            raise _cannot_isolate(
                f"setns(CLONE_NEWNET) back from it: {exc.strerror} (a user namespace's root "
                "cannot return to its parent's network)"
            ) from None
        return offline
    finally:
        os.close(own)


def _in_a_thread_of_its_own(action: Callable[[], int]) -> int:
    """``action()`` run by a thread that ends with it: a thread left in another namespace by
    a failure halfway is gone with it, never one of the caller's."""
    outcome: list[int | BaseException] = []

    def run() -> None:
        try:
            outcome.append(action())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, name="offline-namespace")
    try:
        thread.start()
    except RuntimeError:  # no thread to spare (what the caller meets next says why)
        run()
    else:
        thread.join()
    (result,) = outcome
    if isinstance(result, BaseException):
        raise result
    return result


def _unshare_network() -> None:
    try:
        if hasattr(os, "unshare"):  # Python 3.12+
            os.unshare(_CLONE_NEWNET)
        else:
            check(libc().unshare(_CLONE_NEWNET), "unshare(CLONE_NEWNET)")
    except OSError as error:
        if error.errno in (errno.EMFILE, errno.ENFILE):
            raise  # a shortage (loading libc takes a descriptor), which is no verdict
        raise _cannot_isolate(f"unshare(CLONE_NEWNET): {error.strerror}") from None


def _setns(descriptor: int) -> None:
    if hasattr(os, "setns"):  # Python 3.12+
        os.setns(descriptor, _CLONE_NEWNET)
    else:
        check(libc().setns(descriptor, _CLONE_NEWNET), "setns(CLONE_NEWNET)")


def _cannot_isolate(reason: str) -> CtxError:
    return CtxError(
        errno.EACCES,
        f"the agent may not use the network (no 'network:default connect' in its policy, "
        f"SPEC P-4) and this host cannot start a process without it: {reason}",
    )
