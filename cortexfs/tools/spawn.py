"""Starting tool and hook processes under an agent's identity, and bounding them (T-3, T-5).

* **Identity.**  When the host runs as root, the process runs with the agent's uid, gid and
  exactly its supplementary groups, so the kernel enforces Linux mode bits on everything the
  tool touches.  Otherwise it runs as the host user, which the authority chain has already
  checked is the agent's identity (P-5 step 1).
* **Process group.**  Every call gets a process group of its own; a timeout kills the whole
  group with SIGKILL, and so does the end of a call: a tool's stragglers get
  :data:`STRAGGLER_GRACE` seconds after the tool exits (less when the timeout comes first),
  then the group is killed, so no process of a call outlives it.  The tool's own exit decides
  how the call ended: a straggler never makes a tool that exited in time a timeout.
* **Bounds.**  Captured output is limited (:data:`MAX_OUTPUT_BYTES`); a tool that writes more
  is killed.  The environment is exactly the one given: nothing leaks in from the host's.
* **No orphans.**  A call's processes die with the process that started them, even when it is
  SIGKILLed (a worker whose job recover will hand to another worker, I-4): the tool's first
  process by its parent-death signal, everything it started by the orphan guard, which kills
  the call's whole process group (see :mod:`cortexfs.tools.orphans`).

Captured calls (native mode, hooks) detach from the terminal (a new session).  Attached calls
(terminal CLI mode) inherit stdin, stdout and stderr and, on a terminal, become its foreground
process group, as a shell's job would, so Ctrl-C and job control reach the tool.  A tool typed
at tsh, whose terminal tsh has let go of, leads a session of its own with that terminal as its
controlling terminal (``leads_terminal``); every process left in that session is the call's.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import selectors
import signal
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import IO, Any, NamedTuple

from cortexfs.errors import CtxError
from cortexfs.exit_watch import POLL_SECONDS, ExitWatch
from cortexfs.policy import Identity
from cortexfs.tools import no_typing, offline, orphans
from cortexfs.tools.host_programs import find_program, setpriv_id_options
from cortexfs.tools.startable import require_startable

MAX_OUTPUT_BYTES = 16 * 1024 * 1024
# Linux's MAX_ARG_STRLEN: the most one argument or environment variable (``NAME=value`` and
# its NUL) of an exec may hold; over it the exec fails with E2BIG.
MAX_ARG_STRLEN = 32 * 4096
MAX_STDERR_TAIL = 64 * 1024
STRAGGLER_GRACE = 1.0
# How long a tool run on the caller's terminal has to end once a termination signal sent to
# its caller was passed on to it (a service manager's SIGTERM to ctx run, a hangup), when the
# caller asks for it (ProcessSpec.signalled_grace): a tool that ignores the signal is then
# killed, as the signal asked of the command (T-3).
SIGNALLED_GRACE = 2.0
_LOOK_AGAIN_SECONDS = 0.1
LONGEST_WAIT = 86_400.0  # seconds the pump sleeps at most before it looks at the deadline again
_CHUNK = 64 * 1024
_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class ProcessSpec(NamedTuple):
    """What to run: ``argv[0]`` is the executable's path; ``identity`` None means the host's."""

    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: str
    identity: Identity | None
    timeout: float | None
    pass_fds: tuple[int, ...] = ()  # descriptors the process inherits (a capability channel)
    network: bool = False  # may it reach the network (P-4)? see cortexfs.tools.offline
    # run_attached only: the tool leads a session of its own whose controlling terminal is
    # its stdin, which its caller has let go of (a command line typed at tsh, H-5)
    leads_terminal: bool = False
    # run_attached only: seconds the tool's group has to end once a signal sent to its
    # caller was passed on to it, then killed; None leaves the end to the caller (a
    # terminal's call, whose Ctrl-C an interactive tool may take and go on)
    signalled_grace: float | None = None


class Finished(NamedTuple):
    """How a process ended.  ``exit_status`` follows the shell: 128 + N after signal N."""

    pid: int
    exit_status: int
    stdout: bytes
    stderr_tail: bytes
    timed_out: bool
    output_overflow: bool
    seconds: float
    # The signal the caller received and passed on to the tool's group while it ran
    # (run_attached: SIGTERM from ``timeout``, a service manager's stop); None when none came.
    passed_on: int | None = None


def _keeping_exit_statuses(run: Callable[..., Finished]) -> Callable[..., Finished]:
    """``run`` with SIGCHLD at its default while the process runs.  A program that ignores
    SIGCHLD has the kernel reap its children as they end, and their exit statuses with them:
    ``subprocess`` then reads ECHILD as exit 0, and a failed tool would be reported a
    success; the tool, inheriting that disposition, could not wait for its own children
    either.  Only the main thread may change it: from another, the call is refused first."""

    @functools.wraps(run)
    def keeping(*args: Any, **options: Any) -> Finished:
        if signal.getsignal(signal.SIGCHLD) != signal.SIG_IGN:
            return run(*args, **options)
        if threading.current_thread() is not threading.main_thread():
            raise CtxError(
                errno.EINVAL,
                "this program ignores SIGCHLD, so the kernel reaps a tool as it ends and its "
                "exit status is lost; set SIGCHLD back to its default (signal.signal("
                "signal.SIGCHLD, signal.SIG_DFL)) before running tools from a thread",
            )
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        try:
            return run(*args, **options)
        finally:
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)

    return keeping


@_keeping_exit_statuses
def run_captured(
    spec: ProcessSpec,
    stdin_data: bytes,
    *,
    max_output: int | None = MAX_OUTPUT_BYTES,
    on_start: Callable[[int], None] | None = None,
    on_stderr_line: Callable[[str], None] | None = None,
    on_cut_short: Callable[[int], None] | None = None,
) -> Finished:
    """Run with pipes: feed ``stdin_data``, capture stdout (bounded) and stderr (its tail).

    ``max_output`` None: stdout is read and dropped (a hook's, which nobody reads), so that
    however much the process writes there it neither blocks nor is stopped for it.
    ``on_cut_short`` is given how a process ended that this call killed because an exception
    (an interruption, a failing ``on_start``) cut it short, with what it had written by then,
    before that goes on: a tool that ran keeps its output."""
    started = time.monotonic()
    deadline = None if spec.timeout is None else started + spec.timeout
    _require_startable(spec)
    argv, options, network_namespace = _launch(spec._replace(leads_terminal=False))
    # The pipes are made before the offline namespace is first entered, which keeps a
    # descriptor for the process's later calls: a start refused for want of descriptors must
    # leave none behind, so that the call can still be recorded.
    theirs, ours = _pipes_for_a_process()
    try:
        with network_namespace:
            process = subprocess.Popen(
                argv,
                stdin=theirs[0],
                stdout=theirs[1],
                stderr=theirs[2],
                env=dict(spec.env),
                cwd=spec.cwd,
                start_new_session=True,
                close_fds=True,
                pass_fds=spec.pass_fds,
                **options,
            )
    except BaseException:
        _close_each(ours)
        raise
    finally:
        _close_each(theirs)  # the process has them as its 0, 1 and 2, if it started
    # As subprocess would have kept them: the pump, or the process's end, closes them.
    process.stdin = os.fdopen(ours[0], "wb", buffering=0)
    process.stdout = os.fdopen(ours[1], "rb", buffering=0)
    process.stderr = os.fdopen(ours[2], "rb", buffering=0)
    with orphans.GUARD.watching(process.pid):
        pump: _Pump | None = None
        try:
            if on_start:
                on_start(process.pid)
            pump = _Pump(process, stdin_data, max_output, on_stderr_line)
            timed_out = pump.run(deadline)
        except BaseException:
            # The caller's on_start or the pump failed: no process of a call outlives it.
            _kill_group(process.pid)
            with process:  # closes the pipes the pump may never have taken, and reaps
                pass
            if on_cut_short is not None:
                on_cut_short(_captured(process, pump, shell_status(process.returncode), started))
            raise
        if timed_out or pump.overflow or pump.exited_at is None:  # a timeout, too much output
            _kill_group(process.pid)
            exit_status = shell_status(process.wait())
        else:
            # Reaped first: the tool, a zombie until then, would count as a straggler.
            exit_status = shell_status(process.wait())
            _end_stragglers(process.pid, _stragglers_end(pump.exited_at, deadline))
    finished = _captured(process, pump, exit_status, started, timed_out=timed_out)
    launchers = argv[: len(argv) - len(spec.argv)]
    if launchers:
        launcher = "setpriv" if _SETPRIV in launchers else os.path.basename(launchers[0])
        _raise_launchers_exec_failure(launcher, spec.argv[0], exit_status, finished.stderr_tail)
    return finished


def _pipes_for_a_process() -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """Three new pipes: the ends a process is given as its stdin, stdout and stderr, and the
    ends the caller keeps.  None is left open when one cannot be made (EMFILE): subprocess,
    making them itself, leaves those it made before the one that failed (CPython 3.11), and
    a call refused because its hook or tool could not start still needs descriptors to
    record that it was."""
    made: list[int] = []
    try:
        for _ in range(3):
            made.extend(os.pipe())
    except BaseException:
        _close_each(made)
        raise
    stdin_read, stdin_write, stdout_read, stdout_write, stderr_read, stderr_write = made
    return (stdin_read, stdout_write, stderr_write), (stdin_write, stdout_read, stderr_read)


def _close_each(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)


def _captured(
    process: subprocess.Popen[bytes],
    pump: _Pump | None,
    exit_status: int,
    started: float,
    *,
    timed_out: bool = False,
) -> Finished:
    """How ``process`` ended, with what ``pump`` took of its output (nothing when the pump
    never started: a call cut short before it)."""
    return Finished(
        process.pid,
        exit_status,
        b"" if pump is None else bytes(pump.stdout),
        b"" if pump is None else _utf8_tail(pump.stderr, MAX_STDERR_TAIL),
        timed_out,
        pump is not None and pump.overflow,
        time.monotonic() - started,
    )


def _raise_launchers_exec_failure(
    launcher: str, program: str, exit_status: int, stderr: bytes
) -> None:
    """Raise, as the OSError subprocess raises when it cannot exec ``program`` itself, the
    exec of ``program`` that the ``launcher`` (setpriv or unshare, see :func:`_launch`)
    could not make.

    The launcher says so in one line of stderr, ``setpriv: failed to execute PROGRAM:
    REASON``, and exits 126, or 127 when nothing is at the path, as a shell does.  Without
    this, a tool the kernel refuses to start (its interpreter on a filesystem mounted
    noexec, or gone) would read as a tool that ran and exited 126 or 127.  The
    line's wording follows the tool's locale, so only its shape is relied on, and the reason
    read back when it is the C locale's (else 126 is EACCES, 127 ENOENT).  A tool that
    prints such a line and exits so is taken at its word that it did not start."""
    if exit_status not in (126, 127):
        return
    lines = stderr.decode("utf-8", "replace").splitlines()
    if len(lines) != 1 or not lines[0].startswith(f"{launcher}: ") or program not in lines[0]:
        return
    reason = lines[0].rpartition(": ")[2]
    code = _ERRNO_OF_REASON.get(reason, errno.ENOENT if exit_status == 127 else errno.EACCES)
    raise OSError(code, os.strerror(code), program)


_ERRNO_OF_REASON = {os.strerror(code): code for code in sorted(errno.errorcode, reverse=True)}


def _require_startable(spec: ProcessSpec) -> None:
    """Refuse, as the kernel would, a program that could not start (see
    :func:`~cortexfs.tools.startable.require_startable`), judged for the identity
    :func:`_launch` starts it as: the agent's when this process is root, else its own."""
    require_startable(spec.argv[0], spec.cwd, spec.identity if os.geteuid() == 0 else None)


@_keeping_exit_statuses
def run_attached(spec: ProcessSpec, *, on_start: Callable[[int], None] | None = None) -> Finished:
    """Run with the caller's stdin, stdout and stderr (terminal CLI mode, T-3); leading the
    terminal on stdin when ``spec.leads_terminal`` says to and setsid(1) is there."""
    started = time.monotonic()
    deadline = None if spec.timeout is None else started + spec.timeout
    _require_startable(spec)
    spec = spec._replace(leads_terminal=spec.leads_terminal and _SETSID is not None)
    argv, options, network_namespace = _launch(spec)
    options = _typing_refused(options, spec)
    passed_on: list[int] = []
    leads = spec.leads_terminal
    # Forwarding from before the start: a signal that comes while the tool starts (the guard
    # told of it, the terminal handed over) reaches the tool, as one a moment later does.
    with _forwarding_signals(passed_on) as pass_on_to:
        with network_namespace:
            process = subprocess.Popen(
                argv,
                env=dict(spec.env),
                cwd=spec.cwd,
                # Leading a terminal, the tool's own session (setsid(1) makes it, and would
                # fork if the process led a group already) is its process group too.
                process_group=None if spec.leads_terminal else 0,
                close_fds=True,
                pass_fds=spec.pass_fds,
                **options,
            )
        pass_on_to(process.pid)
        with orphans.GUARD.watching(process.pid, session=leads):
            foreground = contextlib.nullcontext() if leads else _foreground(process.pid)
            with foreground as terminal:
                if on_start:
                    on_start(process.pid)
                signalled = passed_on if spec.signalled_grace is not None else ()
                killed = not _exits_within(
                    process.pid, deadline, terminal, signalled, spec.signalled_grace or 0.0
                )
                if killed:
                    _kill_call(process.pid, session=leads)
                exit_status = shell_status(process.wait())
                if terminal is not None and exit_status > 128:
                    terminal.restore_modes()  # killed: what it set of the terminal is undone
            if killed:
                _kill_call(process.pid, session=leads)  # killed: no grace left for any
            else:
                until = _stragglers_end(time.monotonic(), deadline)
                _end_stragglers(process.pid, until, session=leads)
    timed_out = killed and not passed_on
    return Finished(
        process.pid,
        exit_status,
        b"",
        b"",
        timed_out,
        False,
        time.monotonic() - started,
        passed_on[0] if passed_on else None,
    )


def _stragglers_end(exited_at: float, deadline: float | None) -> float:
    """When what a tool that exited at ``exited_at`` left running in its group is killed:
    :data:`STRAGGLER_GRACE` seconds later, or at the call's ``deadline`` when that comes
    first.  The tool's own exit decides how the call ended (W-4 times out a tool, not what it
    left behind), so a straggler never turns a tool that exited in time into a timeout, nor
    outlives the call's timeout."""
    grace_ends = exited_at + STRAGGLER_GRACE
    return grace_ends if deadline is None else min(grace_ends, deadline)


def _end_stragglers(pgid: int, until: float, *, session: bool = False) -> None:
    """Let what the tool left running in its group go on until ``until`` (see
    :func:`_stragglers_end`), then kill the group: no process of a call outlives it.  With
    ``session``, the tool led a session of its own (and ``pgid`` is its id): the groups an
    interactive shell made there for its jobs are the call's too."""
    while time.monotonic() < until:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            if not (session and any(session_processes(pgid))):
                return  # the call's processes are gone
        except PermissionError:
            break  # members we may not signal: the kill below says the same
        time.sleep(0.02)
    _kill_call(pgid, session=session)


def children_of(parents: Collection[int]) -> Iterator[int]:
    """The pids of the children of ``parents``, as ``/proc`` lists them now; one gone
    meanwhile is left out."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):  # gone meanwhile
                with open(f"/proc/{entry}/stat", "rb") as stat_file:
                    fields = stat_file.read().rsplit(b")", 1)[1].split()
                if int(fields[1]) in parents:  # state, then the parent's pid
                    yield int(entry)


def session_processes(session_id: int) -> Iterator[int]:
    """The pids of the processes in the session ``session_id``, as ``/proc`` lists them now;
    one gone meanwhile is left out."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):  # gone meanwhile
            if os.getsid(int(entry)) == session_id:
                yield int(entry)


class _Pump:
    """Moves bytes between the call and its pipes without blocking on any one of them."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        stdin_data: bytes,
        max_output: int | None,
        on_stderr_line: Callable[[str], None] | None,
    ) -> None:
        assert process.stdin and process.stdout and process.stderr
        self.stdin, self.stdout_fd, self.stderr_fd = (
            process.stdin.fileno(),
            process.stdout.fileno(),
            process.stderr.fileno(),
        )
        self.pipes: dict[int, IO[bytes]] = {
            self.stdin: process.stdin,
            self.stdout_fd: process.stdout,
            self.stderr_fd: process.stderr,
        }
        self.process = process
        self.pending = memoryview(stdin_data)
        self.max_output = max_output
        self.on_stderr_line = on_stderr_line
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.partial_line = b""
        self.overflow = False
        self.exited_at: float | None = None  # when the tool was seen to exit (monotonic)
        self.selector = selectors.DefaultSelector()
        for fd in self.pipes:
            os.set_blocking(fd, False)
        if stdin_data:
            self.selector.register(self.stdin, selectors.EVENT_WRITE)
        else:
            self.pipes.pop(self.stdin).close()
        self.selector.register(self.stdout_fd, selectors.EVENT_READ)
        self.selector.register(self.stderr_fd, selectors.EVENT_READ)
        # Readable once the process has exited; it is not reaped until waited.
        self.exit = ExitWatch(process.pid)
        if self.exit.fd is not None:
            self.selector.register(self.exit.fd, selectors.EVENT_READ)

    def run(self, deadline: float | None) -> bool:
        """Pump until the tool has exited and closed its output, or its stragglers' time is up
        (:func:`_stragglers_end`); True if the deadline came before the tool exited.

        The tool's exit is watched through a pidfd, so nothing polls: the pump sleeps until a
        pipe has bytes, the tool exits, a straggler's grace ends or the deadline passes.
        Without a pidfd (:mod:`cortexfs.exit_watch`) it also wakes to ask whether the tool
        has exited.
        """
        exited_at: float | None = None
        try:
            while not self.overflow:
                now = time.monotonic()
                if exited_at is not None and (
                    not self.pipes or now >= _stragglers_end(exited_at, deadline)
                ):
                    return False  # the tool exited in time: its stragglers make no timeout
                if deadline is not None and now >= deadline:
                    return True
                # epoll takes milliseconds in a C int: a longer wait is taken in turns.
                limits = [] if deadline is None else [min(deadline - now, LONGEST_WAIT)]
                if exited_at is not None:
                    limits.append(exited_at + STRAGGLER_GRACE - now)
                elif self.exit.fd is None:
                    limits.append(POLL_SECONDS)
                for key, _ in self.selector.select(min(limits) if limits else None):
                    if key.fd == self.exit.fd:
                        exited_at = time.monotonic()
                        self.selector.unregister(self.exit.fd)
                    else:
                        self._serve(key.fd)
                if exited_at is None and self.exit.fd is None and self.exit.exited():
                    exited_at = time.monotonic()
            return False
        finally:
            self.exited_at = exited_at
            self._flush_partial_line()
            for fd in list(self.pipes):
                self._close(fd)
            self.selector.close()
            self.exit.close()

    def _serve(self, fd: int) -> None:
        if fd == self.stdin:
            try:
                with _sigpipe_held():
                    written = os.write(fd, self.pending[:_CHUNK])
            except BrokenPipeError:
                written = len(self.pending)  # the tool stopped reading; that is its business
            self.pending = self.pending[written:]
            if not self.pending:
                self._close(fd)
            return
        data = os.read(fd, _CHUNK)
        if not data:
            self._close(fd)
        elif fd == self.stdout_fd:
            if self.max_output is None:
                return
            self.stdout += data
            if len(self.stdout) > self.max_output:
                self.overflow = True
                del self.stdout[self.max_output :]  # what was captured is the limit, no more
        else:
            self.stderr += data
            del self.stderr[: -2 * MAX_STDERR_TAIL]
            self._emit_lines(data)

    def _emit_lines(self, data: bytes) -> None:
        if self.on_stderr_line is None:
            return
        *ended, unended = (self.partial_line + data).split(b"\n")
        # A line longer than MAX_STDERR_TAIL bytes, ended or not yet (a tool writing stderr
        # with no newline), is passed on in pieces of at most that many rather than whole:
        # its caller's memory is not the tool's.  The last piece of the unended line waits for
        # the rest of it.
        pieces = [piece for line in ended for piece in _utf8_pieces(line, MAX_STDERR_TAIL)]
        *unended_pieces, self.partial_line = _utf8_pieces(unended, MAX_STDERR_TAIL)
        for piece in pieces + unended_pieces:
            self.on_stderr_line(piece.decode("utf-8", "replace"))

    def _flush_partial_line(self) -> None:
        if self.on_stderr_line and self.partial_line:
            self.on_stderr_line(self.partial_line.decode("utf-8", "replace"))
            self.partial_line = b""

    def _close(self, fd: int) -> None:
        self.selector.unregister(fd)
        self.pipes.pop(fd).close()


def _utf8_pieces(line: bytes, limit: int) -> list[bytes]:
    """``line`` cut into pieces of at most ``limit`` bytes, each cut before a UTF-8 character
    rather than inside one (:func:`_utf8_boundary`); ``[line]`` when it is short enough,
    even empty."""
    pieces = []
    while len(line) > limit:
        cut = _utf8_boundary(line, limit)
        pieces.append(line[:cut])
        line = line[cut:]
    return [*pieces, line]


def _utf8_tail(data: bytes, limit: int) -> bytes:
    """The last ``limit`` bytes of ``data`` or fewer, starting at a UTF-8 character rather
    than inside one: at most three continuation bytes more are left out (none when the bytes
    are no UTF-8 there), so the tail decodes to text the tool wrote, with no U+FFFD of a
    character cut in two at its start."""
    start = max(len(data) - limit, 0)
    for _ in range(3):
        if start == 0 or start >= len(data) or not 0x80 <= data[start] < 0xC0:
            break
        start += 1
    return bytes(data[start:])


def _utf8_boundary(data: bytes, limit: int) -> int:
    """Where to cut ``data`` (longer than ``limit``) at ``limit`` or up to three bytes before
    it, so that no UTF-8 character is split in two: before the first byte that is not a
    continuation byte.  ``limit`` itself when there is none (the bytes are no UTF-8)."""
    for cut in range(limit, limit - 4, -1):
        if not 0x80 <= data[cut] < 0xC0:
            return cut
    return limit


def _exits_within(
    pid: int,
    deadline: float | None,
    terminal: _Terminal | None = None,
    passed_on: Sequence[int] = (),
    grace: float = SIGNALLED_GRACE,
) -> bool:
    """Wait for ``pid`` to exit (without reaping it); False when ``deadline`` (a
    :func:`time.monotonic` time) passes first, or ``grace`` seconds after a signal was first
    noted in ``passed_on`` (it grows while we wait: see :func:`_forwarding_signals`).  With
    ``terminal`` (a tool run on the caller's terminal), a tool that stops (Ctrl-Z, or
    reading the terminal from the background) stops this command's job too, as a shell's job
    stops, and goes on when the job is continued (:meth:`_Terminal.follow_stop`)."""
    watch = ExitWatch(pid)
    signalled = False
    try:
        while True:
            if passed_on and not signalled:
                signalled = True
                given_up = time.monotonic() + grace
                deadline = given_up if deadline is None else min(deadline, given_up)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            # A signal's handler runs within the wait, which then goes on where it was:
            # the wait is cut in steps so that what the handler noted is looked at.
            step = POLL_SECONDS if terminal is not None else _LOOK_AGAIN_SECONDS
            if watch.wait(step if left is None else min(left, step)):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            if terminal is not None:
                terminal.follow_stop(pid)
    finally:
        watch.close()


# How a tool process starts (T-5, I-4).  Two things must hold before the tool's first
# instruction: it runs under the agent's uid, gid and groups (when the host is root), and it
# dies if the process that started it dies — when a worker is killed, recover puts the job
# back and another worker runs it, and the first execution must not go on beside the second.
# setpriv(1) does both and then execs the tool: it switches the credentials and sets the
# parent-death signal after them (a credential change would clear it).  Leaving both to setpriv
# lets Python start the child with vfork: with credentials or a preexec_fn to apply it must
# fork, copying the page tables of the whole caller, which in a worker or a terminal costs more
# than setpriv's exec (bench/tools.py).  Without setpriv, or where setpriv would read one of
# the agent's ids as another's (setpriv_id_options), subprocess switches the credentials
# and orphans.die_with_parent sets the signal.  Either way, what the tool starts in turn is
# killed by the orphan guard (:mod:`cortexfs.tools.orphans`) once the caller is gone.
_SETPRIV = find_program("setpriv")
# setsid(1) --ctty: a tool that leads the terminal its caller let go of (tsh's, H-5) starts a
# session of its own and takes that terminal as its controlling terminal, then execs the tool.
# Without it the tool runs as any attached call, on the terminal but not leading it.
_SETSID = find_program("setsid")
# What the tool could inherit of its caller's capabilities across the exec: an ambient set,
# which a parent may give even a user, and an inheritable set (a root started with securebits
# that keep capabilities across the switch of ids).  The tool's permission is its uid's,
# gid's and groups' (T-5), never what the process that started ctx was given.
_NO_CAPABILITIES_PASSED_ON = ["--inh-caps=-all", "--ambient-caps=-all"]


def _launch(
    spec: ProcessSpec,
) -> tuple[list[str], dict[str, Any], contextlib.AbstractContextManager[None]]:
    """The argv to start, the keyword arguments for :class:`subprocess.Popen`, and what to
    start it in: without network, a root host's thread joins the offline namespace for the
    start, and anyone else puts a user and network namespace of the tool's own in its argv
    (see :mod:`cortexfs.tools.offline`)."""
    as_root = os.geteuid() == 0
    identity = spec.identity if as_root else None
    isolation: list[str] = []
    network_namespace: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if not spec.network:
        if as_root:
            network_namespace = offline.this_thread()
        else:
            # unshare(1) execs what follows in place, in a user namespace of its own with the
            # same uid mapped, which keeps the parent-death signal set after it.
            isolation = offline.argv_prefix()
    id_options = [] if identity is None else setpriv_id_options(identity)
    # After the switch of ids, so that taking the terminal can never be a privileged steal of
    # one its caller still holds: it succeeds only on a terminal no session has.
    leading = [_SETSID, "--ctty"] if spec.leads_terminal else []
    if _SETPRIV is None or id_options is None:
        options: dict[str, Any] = {"preexec_fn": orphans.die_with_parent(os.getpid())}
        if identity is not None:
            groups = sorted(identity.groups)
            options.update(user=identity.uid, group=identity.gid, extra_groups=groups)
        return [*isolation, *leading, *spec.argv], options, network_namespace
    prefix = [_SETPRIV, *id_options, *_NO_CAPABILITIES_PASSED_ON, "--pdeathsig=KILL", "--"]
    return [*isolation, *prefix, *leading, *spec.argv], {}, network_namespace


def _typing_refused(options: dict[str, Any], spec: ProcessSpec) -> dict[str, Any]:
    """``options`` with :mod:`cortexfs.tools.no_typing`'s filter set in the child, for a
    tool on its caller's terminal under another identity than the caller's: root's terminal
    is lent to the agent's tool for its input and output, never for typing into it.  The
    filter makes Python fork, where setpriv alone would let it vfork: a terminal-mode call
    pays that, native calls and workers (no terminal) do not."""
    if spec.identity is None or os.geteuid() != 0:
        return options
    refuse = no_typing.refuse_typing()
    if refuse is None:
        return options
    then = options.get("preexec_fn")
    if then is None:
        return {**options, "preexec_fn": refuse}

    def both() -> None:
        refuse()
        then()

    return {**options, "preexec_fn": both}


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _kill_call(pgid: int, *, session: bool) -> None:
    """SIGKILL to the call's group and, when the tool led a session of its own, to every
    process of that session."""
    _kill_group(pgid)
    if session:
        for pid in session_processes(pgid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def shell_status(returncode: int) -> int:
    """A process's end as a shell reports it: 128 + N after signal N (subprocess's -N), which
    reaching a caller as a status byte would read as 256 - N."""
    return 128 - returncode if returncode < 0 else returncode


class _Terminal:
    """The caller's terminal while a tool runs on it, handed over as a shell hands it to a
    job: the tool's group is its foreground group, and gives it back when it stops."""

    def __init__(self, fd: int, pgid: int) -> None:
        self.fd, self.pgid, self.own = fd, pgid, os.getpgrp()
        self.modes = self._modes_now()
        self.given = False  # the tool's group was made the foreground group, and not taken back

    def give(self) -> None:
        """The terminal to the tool's group, when this command's job has it (not when run in
        the background).  The group is not continued here: a Ctrl-Z typed the moment it has
        the terminal must stop it, and a tool stopped by touching the terminal before it had
        it is continued by :meth:`follow_stop`, which sees why it stopped."""
        if self._in_foreground():
            with contextlib.suppress(OSError):
                os.tcsetpgrp(self.fd, self.pgid)
                self.given = True

    def _continue_tool(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pgid, signal.SIGCONT)

    def take_back(self) -> None:
        """The terminal back to this command's job, from whichever group the tool left it to
        (a shell run as the tool gives it to its own jobs), when it was given; nothing when
        the terminal is gone (hung up)."""
        if self.given:
            self.given = False
            with contextlib.suppress(OSError):
                os.tcsetpgrp(self.fd, self.own)

    def restore_modes(self) -> None:
        """The terminal's modes as they were before the tool ran (echo, canonical input),
        after a tool that changed them and was killed or stopped, as a shell restores them."""
        if self.modes is not None:
            with contextlib.suppress(termios.error, OSError):
                termios.tcsetattr(self.fd, termios.TCSADRAIN, self.modes)

    def follow_stop(self, pid: int) -> None:
        """When the tool has stopped (SIGTSTP, SIGTTIN, SIGTTOU, SIGSTOP), take the terminal
        back and stop this command's job with the same signal, so that the shell that started
        it gets its prompt back (``jobs``, ``fg``, ``bg``); continued, hand the terminal to
        the tool again if the job is in the foreground, and continue the tool."""
        try:
            stopped = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG)
        except ChildProcessError:
            return
        if stopped is None:
            return
        wanted_terminal = stopped.si_status in (signal.SIGTTIN, signal.SIGTTOU)
        if wanted_terminal and (self._in_foreground() or self._tools()):
            # Stopped for want of the terminal, which this command's job has by now (``fg``
            # came before this look), or the tool has (it touched the terminal before it was
            # handed over): the tool gets it, and goes on.  Looked at first: this command
            # may lead the terminal's session itself (under sshd), with no shell above.
            self.give()
            self._continue_tool()
            return
        if os.getpgrp() == os.getsid(0):
            # No shell with job control above (``sh -c`` as the session's leader): nobody
            # would continue this command, so it waits on, as such a shell waits.
            return
        self.take_back()
        tools_modes = self._modes_now()
        self.restore_modes()
        # SIGSTOP is not a job's own stop, and SIGTTOU is blocked in this thread while it runs a
        # tool (see _foreground): it would stay pending, not stop the job.  Both become SIGTSTP.
        signum = signal.SIGTTIN if stopped.si_status == signal.SIGTTIN else signal.SIGTSTP
        os.killpg(self.own, signum)  # the shell sees this job stopped; here we wait for SIGCONT
        if tools_modes is not None:  # continued: the modes the tool had set, as a shell's fg
            with contextlib.suppress(termios.error, OSError):
                termios.tcsetattr(self.fd, termios.TCSADRAIN, tools_modes)
        self.give()
        self._continue_tool()

    def _in_foreground(self) -> bool:
        return self._foreground_group() == self.own

    def _tools(self) -> bool:
        """Whether the terminal's foreground group is the tool's."""
        return self._foreground_group() == self.pgid

    def _foreground_group(self) -> int | None:
        try:
            return os.tcgetpgrp(self.fd)
        except OSError:
            return None

    def _modes_now(self) -> list[Any] | None:
        try:
            return termios.tcgetattr(self.fd)
        except termios.error:
            return None


@contextlib.contextmanager
def _sigpipe_held() -> Iterator[None]:
    """SIGPIPE held off the calling thread, and one that a write raised meanwhile taken back.
    Python ignores SIGPIPE, so a write to a tool that stopped reading its input fails with
    EPIPE; a program that embeds the runner may have it at its default, where that write
    would end the program instead.  A write's SIGPIPE is the writing thread's own."""
    if signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN:
        yield
        return
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPIPE})
    try:
        yield
    finally:
        if signal.SIGPIPE not in previous_mask:  # else it stays the program's, pending
            signal.sigtimedwait({signal.SIGPIPE}, 0)
            signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)


@contextlib.contextmanager
def _foreground(pgid: int) -> Iterator[_Terminal | None]:
    """Make ``pgid`` the terminal's foreground group while it runs, as a shell does; the
    :class:`_Terminal` (None without a terminal).  A command run in the background leaves the
    terminal to whoever has it until it is brought to the foreground."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        yield None
        return
    # Blocked, not ignored: the kernel lets a thread that blocks SIGTTOU change the foreground
    # group as one that ignores it, and a mask is the calling thread's own, where a handler is
    # the process's, which only its main thread may set (a program calling from a pool).
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        terminal = _Terminal(fd, pgid)
        terminal.give()
        try:
            yield terminal
        finally:
            terminal.take_back()  # a terminal hung up meanwhile has no group to give back
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        os.close(fd)


@contextlib.contextmanager
def _forwarding_signals(passed_on: list[int]) -> Iterator[Callable[[int], None]]:
    """Pass termination signals sent to the runner on to the tool's process group, noting
    each in ``passed_on``; what it yields is to be given the group's id as soon as the tool
    is started.  A signal that comes before that is passed on then, so that one sent as the
    tool starts reaches it rather than end this command, the tool killed without it; one
    that comes when no tool was started (its start failed) is the program's again, raised
    once its handlers are back.  Only from the main thread, the one Python lets set
    handlers: a call from another thread leaves the process's signals to its program, as
    they were."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda _pgid: None
        return
    group: list[int] = []  # the tool's process group, once started
    early: list[int] = []  # the signals that came before it was

    def forward(signum: int, _frame: object) -> None:
        passed_on.append(signum)
        if not group:
            early.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group[0], signum)

    def started(pgid: int) -> None:
        # A handler runs between two steps of this function, never within one: once the
        # group is known, forward passes each new signal on itself, and none comes early.
        group.append(pgid)
        while early:
            signum = early.pop(0)
            try:
                os.killpg(pgid, signum)
            except ProcessLookupError:
                # No group yet: setsid(1) has still to make the session of a tool that leads
                # its terminal, and the process that will make it gets the signal.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pgid, signum)

    previous = {signum: signal.signal(signum, forward) for signum in _FORWARDED_SIGNALS}
    try:
        yield started
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if early:
            signal.raise_signal(early[0])
