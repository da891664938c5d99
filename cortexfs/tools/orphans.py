"""No process of a tool call outlives the process that started it (SPEC I-4, W-3, W-4).

When a queue worker is SIGKILLed, recover hands its job to another worker; the first run must
not go on beside the second.  Two mechanisms, because one is not enough:

* the **parent-death signal**: the tool's first process gets SIGKILL when the thread that
  started it ends.  It is set after the switch to the agent's uid, gid and groups, since a
  credential change clears it: by ``setpriv --pdeathsig`` where there is setpriv (see
  :mod:`cortexfs.tools.spawn`), else in the child by :func:`die_with_parent`.  It follows the
  *thread*, not the process: every caller starts a tool from a thread that then waits for it
  to end (the runner's caller, a worker's job slot, the child a terminal forks for each
  call).  Never start a tool from a thread that may end before it.
* the **orphan guard** (:class:`OrphanGuard`): what the first process started (a shell forks
  its commands) would be reparented to init and run on; the guard kills the call's whole
  process group once the caller is gone, and the whole session of a call that leads one (a
  tool typed at tsh, whose shell may put its jobs in groups of their own).

A process that left its call's group and session (``setsid``, a daemon's double fork) is out
of reach of both.  A command that makes calls and then ends (``ctx run``) takes it in as
:func:`adopting` says: the kernel reparents such a process to the command rather than to init,
and the command kills it as it ends.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterator

from cortexfs.libc import prctl as libc_prctl

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_ORPHANED = 127  # the exit status of a child whose parent died before it could be told
# How many times the processes below an adopting command are killed, at most, and the pause
# between two rounds: a kill orphans what the killed process had started, which is reparented
# to the command for the next round; one that does not die (stuck in the kernel, on a hung
# FUSE mount say) is given up after a second rather than hold the command's exit.
_ADOPTED_ROUNDS = 100
_ADOPTED_PAUSE = 0.01


def die_with_parent(parent: int) -> Callable[[], None]:
    """What the child runs between fork and exec, once subprocess has switched its uid, gid and
    groups: the parent-death signal, then a check that the parent is still there — if it died
    before the signal was set, the child is an orphan already and no signal will ever come.

    It runs in a child forked from a process that may have threads, so it does nothing but
    three system calls through a function looked up before the fork.
    """
    prctl = libc_prctl()

    def in_child() -> None:
        # No ambient capability of the caller's passes to the tool across the exec (T-5: its
        # permission is its ids'); a kernel without ambient capabilities refuses, having none.
        prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(_ORPHANED)  # fail closed: a tool that could outlive its caller never runs
        if os.getppid() != parent:
            os._exit(_ORPHANED)

    return in_child


@contextlib.contextmanager
def adopting() -> Iterator[None]:
    """While the block runs, this process is where the kernel reparents the orphans of the
    calls it makes (a child subreaper), not init; as the block ends, every process still
    below it but the orphan guard is killed.  For a command that makes its calls and ends
    (``ctx run``), not for one whose other calls go on meanwhile: nothing a call started, in
    its group or not, outlives the command — no daemon that left with ``setsid`` keeping the
    terminal the tool was lent, to read what is typed there once the command has returned.

    A kernel that refuses (older than 3.4) leaves orphans to init, as before."""
    adopted = libc_prctl()(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield
    finally:
        if adopted:
            _end_adopted(sparing=GUARD.pids())
            libc_prctl()(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def _end_adopted(sparing: Collection[int]) -> None:
    """SIGKILL to every process below this one but ``sparing`` and theirs, round after round
    until none is left (each kill orphans its children, which come to this process), the
    children of this process that died reaped."""
    for _ in range(_ADOPTED_ROUNDS):
        below = _below(os.getpid(), sparing)
        if not below:
            return
        for pid in below:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(_ADOPTED_PAUSE)
        for pid in below:
            with contextlib.suppress(ChildProcessError):  # not ours, or reaped already
                os.waitpid(pid, os.WNOHANG)


def _below(ancestor: int, sparing: Collection[int]) -> list[int]:
    """The processes below ``ancestor`` as ``/proc`` shows them now, but ``sparing`` and
    what is below them."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):  # gone meanwhile
                with open(f"/proc/{entry}/stat", "rb") as stat_file:
                    parent = int(stat_file.read().rsplit(b")", 1)[1].split()[1])
                parents.setdefault(parent, []).append(int(entry))
    found: list[int] = []
    pending = [ancestor]
    while pending:
        for child in parents.get(pending.pop(), []):
            if child not in sparing:
                found.append(child)
                pending.append(child)
    return found


class OrphanGuard:
    """Kills the process groups of this process's running calls once this process is gone.

    The parent-death signal reaches a call's first process only; what that process started (a
    shell forks its commands) would be reparented and run on.  The guard is a small shell,
    started on first use and left in a session of its own (so that no terminal signal and no
    kill of our group reaches it), that reads ``+PGID`` and ``-PGID`` lines from a pipe only
    this process holds.  When this process ends, however it ends, the kernel closes the pipe,
    the guard reads end-of-file and SIGKILLs every group still registered, then exits.

    A registration is sent right after the call's process starts (its pid is its group's id);
    the first process cannot have started anything of its own before its parent-death signal
    was set.  Writes never block: a guard that is gone is started again with every group
    still running, and a line the pipe has no room for (a guard stopped for a long while)
    waits for the next one, in order — a lost ``-PGID`` would have the guard kill, one day,
    whatever group has that number then.  A call that ends before its ``+PGID`` was sent
    cancels it instead.
    """

    # A session is registered as ``+sSID``: a call that leads one (a tool typed at tsh) may
    # leave processes there in groups of its own (a shell's jobs), found by /proc's stat.
    _SCRIPT = """
trap '' HUP INT QUIT TERM PIPE
groups=' '
while read -r line; do
    case $line in
    +*) groups="$groups${line#+} " ;;
    -*) group=${line#-}
        case $groups in *" $group "*) groups="${groups%% $group *} ${groups#* $group }" ;; esac ;;
    esac
done
for group in $groups; do
    case $group in
    s*) for process in /proc/[0-9]*; do
            { read -r stat < "$process/stat"; } 2>/dev/null || continue
            set -- ${stat##*) }
            [ "$4" = "${group#s}" ] && kill -s KILL "${process#/proc/}" 2>/dev/null
        done ;;
    *) kill -s KILL -- "-$group" 2>/dev/null ;;
    esac
done
"""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: set[str] = set()  # process groups' ids, and sessions' as sSID
        self._fd: int | None = None
        self._guard: subprocess.Popen[bytes] | None = None
        self._unsent: list[str] = []  # lines the pipe had no room for yet, oldest first
        os.register_at_fork(after_in_child=self._forget)

    @contextlib.contextmanager
    def watching(self, pgid: int, *, session: bool = False) -> Iterator[None]:
        """Guard ``pgid`` while the block runs: the block ends with the group killed.  With
        ``session``, ``pgid`` leads a session too, whose every process is killed."""
        names = [str(pgid), *([f"s{pgid}"] if session else [])]
        with self._lock:
            for name in names:
                self._groups.add(name)
                self._send(f"+{name}\n")
        try:
            yield
        finally:
            with self._lock:
                for name in names:
                    self._groups.discard(name)
                    self._send(f"-{name}\n")

    def pids(self) -> list[int]:
        """The guard's process id, when it runs."""
        guard = self._guard
        return [] if guard is None else [guard.pid]

    def _send(self, line: str) -> None:
        if self._fd is None:
            self._start()  # it learns every registered group, this one included
            return
        registration = "+" + line[1:]
        if line.startswith("-") and registration in self._unsent:
            self._unsent.remove(registration)  # the guard never heard of this group
        else:
            self._unsent.append(line)
        try:
            while self._unsent:
                os.write(self._fd, self._unsent[0].encode())  # a line: all of it or nothing
                del self._unsent[0]
        except BlockingIOError:
            pass  # the guard is stopped: the rest goes with the next line, never blocking
        except OSError:  # it was killed: a new one, told about every running call
            self._stop()
            self._start()

    def _start(self) -> None:
        self._unsent = []  # the new guard is told the running groups, all at once
        read_end, write_end = os.pipe()
        try:
            self._guard = subprocess.Popen(
                ["/bin/sh", "-c", self._SCRIPT],
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                close_fds=True,
            )
        except OSError:
            os.close(write_end)
            return  # without /bin/sh the parent-death signal is what is left
        finally:
            os.close(read_end)
        os.set_blocking(write_end, False)
        self._fd = write_end
        with contextlib.suppress(OSError):
            os.write(write_end, "".join(f"+{g}\n" for g in sorted(self._groups)).encode())

    def _stop(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None  # forgotten first: an interrupt cannot close it twice
            os.close(fd)
        if self._guard is not None:
            self._guard.poll()  # reap it if it is gone
            self._guard = None

    def _forget(self) -> None:
        """In a forked child: the parent's guard and calls are the parent's, and its lock may
        have been held by another thread at the fork."""
        self._lock = threading.Lock()
        self._groups = set()
        self._unsent = []
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._fd = None
        self._guard = None


GUARD = OrphanGuard()  # one per process: every call this process starts registers with it
