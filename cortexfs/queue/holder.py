"""Who holds a lease, and whether that holder is provably gone (SPEC Q-3, Q-5, N-1).

A lease names its holder precisely enough to survive the ways a bare pid lies: the pid may be
reused (so we keep the process start time), the machine may have rebooted (``boot_id``), the
holder may sit in another pid namespace (``pid_ns``: containers share the host's boot id but not
its pids), or on another host altogether (``host`` and ``machine_id``).  A pid alone is never
proof across any of these.  An expired lease is proof everywhere (Q-5): a holder that wants to
keep its job renews its lease before it expires.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import PurePosixPath
from typing import Any

from cortexfs import jsontext
from cortexfs.cgroups import frozen_cgroup
from cortexfs.errors import CtxError, invalid
from cortexfs.timefmt import EARLIEST, LATEST, parse_time, rfc3339

# psutil derives create_time from boot time + clock ticks; two readings of the same process
# agree to well within this, while a reused pid starts at least a tick later.
_START_TIME_TOLERANCE = 0.05
_WHOLE_SECOND_TOLERANCE = 1.0
# The longest lease a claim or renewal may take: long enough for any job, short enough that
# expires_at stays a date (a float of seconds past year 9999 is not one).
MAX_LEASE_TTL = 366 * 24 * 3600.0
# A lease is a few hundred bytes; a file far larger is damage, never read whole.
MAX_LEASE_BYTES = 64 * 1024
# The shortest lease a worker keeps: it renews every third of the lifetime, and a renewal is
# a write and two fsyncs, which a busy disk can hold up for a good part of a second.  A lease
# that lapses while its holder runs is, for recover, proof that the holder is gone: the
# job would run again beside the first run.
MIN_WORKER_LEASE_TTL = 1.0
# The kernel's PID_MAX_LIMIT: no Linux pid is larger, whatever pid_max says.
PID_MAX_LIMIT = 2**22

ALIVE = "alive"
GONE = "gone"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class LocalSystem:
    """The identity of the machine and pid namespace this process runs in."""

    host: str
    machine_id: str | None
    boot_id: str
    pid_ns: int  # 0: not known, /proc showing no entry for this process
    # Whether /proc is this pid namespace's own, so that a pid of this namespace names the
    # same process there (see :func:`_proc_is_own`).
    own_proc: bool = True

    @classmethod
    @cache
    def current(cls) -> LocalSystem:
        try:
            pid_ns = os.stat("/proc/self/ns/pid").st_ino
        except OSError:
            pid_ns = 0
        return cls(
            host=os.uname().nodename,
            machine_id=_read_first_line("/etc/machine-id"),
            boot_id=_boot_of(_read_first_line("/proc/sys/kernel/random/boot_id")),
            pid_ns=pid_ns,
            own_proc=_proc_is_own(),
        )


def _proc_is_own() -> bool:
    """Whether the /proc mounted here is this pid namespace's: the pid it gives this process
    is ``os.getpid()``.  A pid namespace entered without a proc of its own (``unshare --pid``
    without ``--mount-proc``, ``bwrap --unshare-pid`` without ``--proc``) sees its parent's,
    where a pid of this namespace names another process, or none."""
    try:
        return int(os.readlink("/proc/self")) == os.getpid()
    except (OSError, ValueError):
        return False


def process_exists(pid: int) -> bool:
    """Whether ``pid`` names a process of this pid namespace, asked of the kernel rather than
    of /proc: a /proc mounted ``hidepid=2`` hides other users' processes, and one of another
    namespace shows other processes under the same numbers.  EPERM means it exists (and is
    another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _require_not_a_thread(pid: int) -> None:
    """EINVAL when ``pid`` is the id of a thread other than its process's first: it answers
    ``kill(pid, 0)`` and has a /proc entry as a process does, but a lease naming it would be
    judged gone as soon as that one thread ended, its process still at work on the job."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            lines = status.read(4096).splitlines()
    except OSError:
        return  # no such process (judged gone), or one /proc hides (judged alive)
    for line in lines:
        if line.startswith(b"Tgid:"):
            process = int(line.split()[1])
            if process != pid:
                raise invalid(
                    f"{pid} is a thread of process {process}, not a process id: name the "
                    f"process ({process}), which a lease can follow"
                )
            return


def _default_worker_id(host: str, pid: int) -> str:
    return f"{host}:{pid}"


def _read_first_line(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as f:
            return f.readline().strip() or None
    except OSError:
        return None


@dataclass(frozen=True)
class Holder:
    """A process that holds (or will hold) leases, as seen from its own pid namespace."""

    worker: str
    host: str
    machine_id: str | None
    boot_id: str
    pid_ns: int
    pid: int
    start_time: float | None  # None: not known (a hand-written lease, a pid that had exited)
    # The wall-clock time the boot began, as the start time was read: start_time less the
    # time since boot the kernel counts the start at, which no step of the wall clock moves
    # (see :meth:`started_apart_from`).  None: not known.
    boot_time: float | None = None

    @classmethod
    def for_process(cls, pid: int | None = None, worker: str | None = None) -> Holder:
        """The holder identity of ``pid`` (default: this process) in this pid namespace.

        A pid that names no process (``ctx queue claim --pid``) is taken as it is, with no
        start time: its lease names a holder that :func:`judge` finds gone.  So is one that
        /proc hides (``hidepid=2``, another user's), which :func:`judge` finds alive.  Where
        /proc is another pid namespace's, no start time is read at all: it would be another
        process's, and a lease naming it would be judged gone while its holder runs.
        """
        import psutil  # here: publish, finish and list look at no process, and it costs ~40 ms

        pid = os.getpid() if pid is None else pid
        if not 1 <= pid <= PID_MAX_LIMIT:
            raise invalid(f"{pid} is not a process id (1 to {PID_MAX_LIMIT})")
        if worker is not None:
            check_worker_id(worker)
        here = LocalSystem.current()
        start_time: float | None = None
        boot_time: float | None = None
        if here.own_proc:
            _require_not_a_thread(pid)
            with contextlib.suppress(psutil.Error):
                start_time = psutil.Process(pid).create_time()
                since_boot = started_since_boot(pid)
                boot_time = None if since_boot is None else start_time - since_boot
        return cls(
            worker=worker or _default_worker_id(here.host, pid),
            host=here.host,
            machine_id=here.machine_id,
            boot_id=here.boot_id,
            pid_ns=here.pid_ns,
            pid=pid,
            start_time=start_time,
            boot_time=boot_time,
        )

    def summary(self) -> dict[str, Any]:
        """Who did the work, as a result file records it (SPEC §2.1 ``worker``)."""
        return {
            "id": self.worker,
            "host": self.host,
            "pid": self.pid,
            "boot_id": self.boot_id,
            "pid_ns": self.pid_ns,
        }

    def is_same_process(self, other: Holder) -> bool:
        """Same boot, pid namespace and pid, and the same start where both know it."""
        return (
            self.boot_id == other.boot_id
            and self.pid_ns == other.pid_ns
            and self.pid == other.pid
            and not self.started_apart_from(other.start_time, other.since_boot)
        )

    @property
    def since_boot(self) -> float | None:
        """When the holder started, in seconds after its boot began; None when not known."""
        if self.start_time is None or self.boot_time is None:
            return None
        return self.start_time - self.boot_time

    def started_apart_from(self, start_time: float | None, since_boot: float | None) -> bool:
        """Whether a process of this holder's boot and pid that started at ``start_time``,
        ``since_boot`` seconds after the boot began, is provably another process: the start
        times differ (:func:`_started_apart`), and so do the times since boot where both are
        known.  Either alone moves for the same process: the start time with a step of the
        wall clock (NTP after a resume, ``date -s``: psutil derives it from the boot's
        wall-clock time), which would tell every live holder gone and run its job twice; the
        time since boot between time namespaces (a boot-time offset), where the start time
        stays.  A reused pid moves both."""
        if not _started_apart(self.start_time, start_time):
            return False
        mine = self.since_boot
        if mine is None or since_boot is None:
            return True
        given = (self.start_time, self.boot_time, start_time)
        coarse = any(isinstance(seconds, int) for seconds in given)  # written to the second
        return abs(mine - since_boot) >= (
            _WHOLE_SECOND_TOLERANCE if coarse else _START_TIME_TOLERANCE
        )


def started_since_boot(pid: int) -> float | None:
    """When process ``pid`` started, in seconds after the boot began (field 22 of
    /proc/PID/stat, in clock ticks); None when /proc does not tell.  Read after the command
    name's last ``)``: the name may hold blanks and parentheses."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat_file:
            fields = stat_file.read(4096).rpartition(b")")[2].split()
        return int(fields[19]) / _CLOCK_TICKS
    except (OSError, IndexError, ValueError):
        return None


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def calling_process(argv: Sequence[str]) -> int:
    """The process a command run as ``argv`` from a shell works for (§2.4: its parent, normally
    the shell), past every wrapper program between them that runs exactly that command and
    ends with it: a lease naming one would be found gone as soon as the claim is printed, and
    recover would requeue the job while the shell still works on it.  Those are the programs
    that run one child and wait for it (:data:`WAITING_WRAPPERS`), run with the command line
    they were given (``timeout 60 ctx queue claim …``, ``flock FILE``, ``sudo``), or with
    ``SHELL -c STRING`` (``timeout 60 bash -c "…"``), or, for flock, su and runuser, ``-c
    STRING`` (``flock FILE -c "…"``, ``su USER -c "…"``), which runs ``$SHELL -c STRING``: the
    walk reaches such a wrapper only from its child, so the shell replaced itself with the
    command (bash does, for the last command of its string), whatever STRING held before.

    The walk goes on from each such wrapper to the process that started it.  Any other parent
    is the calling process the specification names: a shell (even one with nothing left to do
    after the command: ``sh -c "ctx queue claim …"``, which dash runs as a child, ends with
    it, and scripts pass ``--pid $$`` there), a script, a program that runs what it was given
    and goes on.  So is a wrapper passed over only for its starter, not for init (pid 1), or
    for a subreaper in another session, which adopted it when its starter died; and a wrapper
    that leads a session of its own (``setsid timeout 60 …``), which the walk cannot tell from
    one a subreaper adopted (:func:`_may_have_started`).  A subreaper in the same session is
    taken for the starter.  Nor can a subshell forked for a pipeline, a ``{ …; }`` group or
    (bash) a redirection inside ``$(…)``, which ends with the command, be told from one
    that goes on working, ``( … ) &``: scripts pass ``--pid $$`` there.

    A command whose caller ended before it ran (``sh -c 'ctx queue claim … &'``, a ``coproc``
    whose shell has exited) starts from the process that adopted it, init (pid 1) or a
    subreaper, and leases to it.  Pid 1 is taken as it is: it may be the caller itself (a
    container's entrypoint, a test harness run as pid 1).  Such a command needs ``--pid``.
    0 when the parent is outside this process's pid namespace (``nsenter``, ``docker
    exec``).  Where /proc is another pid namespace's, the parent itself, never looked up
    there: its number names another process in that /proc."""
    import psutil  # see Holder.for_process

    pid = os.getppid()
    if not LocalSystem.current().own_proc:
        return pid
    command = list(argv)  # the command line of the process ``pid`` started
    try:
        while pid > 1:
            parent = psutil.Process(pid)
            starter = parent.ppid()
            cmdline = parent.cmdline()
            if (
                starter <= 1
                or not _runs_only(parent.name(), cmdline, command)
                or not _may_have_started(starter, pid, cmdline)
            ):
                break
            command = cmdline
            pid = starter
    except (psutil.Error, OSError):
        pass  # gone or not ours to read: what we have reached is the answer
    return pid


# Programs that run the command line they are given as a single child and wait for it, ending
# with it.
WAITING_WRAPPERS = frozenset({"timeout", "flock", "sudo", "doas", "runuser", "su", "time"})
# Those of them that run ``$SHELL -c STRING`` when given ``-c STRING``: util-linux flock(1),
# which takes ``-c`` or ``--command`` only as a word of its own after the lock file, and su(1)
# and runuser(1), which read their options with getopt_long: these are their options, each
# with whether it takes an argument (``--no-pty``/``-T`` since util-linux 2.39; ``--user``/``-u``
# is runuser's, but su's table holds it too, which matters to what a prefix abbreviates).
_FLOCK_COMMAND_OPTIONS = frozenset({"-c", "--command"})
_SU_LONG_OPTIONS = {
    "command": True,
    "session-command": True,
    "fast": False,
    "login": False,
    "preserve-environment": False,
    "pty": False,
    "no-pty": False,
    "shell": True,
    "group": True,
    "supp-group": True,
    "user": True,
    "whitelist-environment": True,
    "help": False,
    "version": False,
}
_SU_COMMAND_OPTIONS = frozenset({"command", "session-command"})
_SU_SHORT_WITH_ARGUMENT = frozenset("cgGsuw")
_SU_SHORT_FLAGS = frozenset("flmpPThV")
# POSIX shells; ``busybox sh`` is one too.
SHELLS = frozenset(
    {"sh", "ash", "dash", "bash", "zsh", "ksh", "ksh93", "mksh", "lksh", "pdksh", "oksh"}
    | {"posh", "yash", "hush"}
)


def _runs_only(name: str, cmdline: Sequence[str], command: Sequence[str]) -> bool:
    """Whether a wrapper called ``name`` with command line ``cmdline`` does nothing but run
    ``command`` (the command line of the child it started) and wait for it."""
    if name not in WAITING_WRAPPERS:
        return False
    return (
        _ends_with(cmdline[1:], command)
        # sudo's monitor, the fork of sudo that holds the command's terminal
        or list(cmdline) == list(command)
        # The shell of ``SHELL -c STRING`` is not our parent, the wrapper is: the shell
        # replaced itself with the command.
        or any(_is_shell_command(cmdline[i:]) for i in range(1, len(cmdline)))
        or (name == "flock" and _flock_has_command_string(cmdline[1:]))
        or (name in ("su", "runuser") and _su_runs_command_string(cmdline[1:]))
    )


def _flock_has_command_string(arguments: Sequence[str]) -> bool:
    """Whether flock's arguments hold ``-c STRING`` or ``--command STRING``, with which it runs
    ``$SHELL -c STRING``."""
    for at, argument in enumerate(arguments):
        if argument == "--":
            return False
        if argument in _FLOCK_COMMAND_OPTIONS and at + 1 < len(arguments):
            return True
    return False


def _su_runs_command_string(arguments: Sequence[str]) -> bool:
    """Whether su or runuser, given ``arguments``, runs the user's shell with ``-c STRING``, as
    their getopt_long reads the words: ``-c STRING``, ``-cSTRING``, ``-c`` ending a group of
    options (``su -lc STRING``), ``--command`` and ``--session-command`` (``=STRING`` or the
    next word), or any prefix that abbreviates one of those alone (``--comm``, ``--sess``);
    options are read before and after the user (getopt permutes them), up to ``--``.  The
    words after the user, which they pass on to the shell, count too: ``su USER -- -c
    STRING`` runs ``$SHELL -c STRING``."""
    operands: list[str] = []
    words = iter(arguments)
    for word in words:
        if word == "--":
            operands += words
            break
        if word.startswith("--"):
            option, equals, _ = word[2:].partition("=")
            name = _su_long_option(option)
            if name is None:
                return False  # su refuses the command line
            if _SU_LONG_OPTIONS[name] and not equals and next(words, None) is None:
                return False
            if name in _SU_COMMAND_OPTIONS:
                return True
        elif word.startswith("-") and word != "-":
            for position, letter in enumerate(word[1:], start=2):
                if letter in _SU_SHORT_WITH_ARGUMENT:
                    if position == len(word) and next(words, None) is None:
                        return False
                    if letter == "c":
                        return True
                    break  # the rest of the group was the argument
                if letter not in _SU_SHORT_FLAGS:
                    return False
        else:
            operands.append(word)
    if operands[:1] == ["-"]:  # 'su - USER': a login shell
        operands = operands[1:]
    additional = operands[1:]  # the shell's, after the user
    return len(additional) >= 2 and additional[0] == "-c"


def _su_long_option(given: str) -> str | None:
    """The long option of su and runuser that ``--given`` names: itself, or the one option
    it is a prefix of; None when it names none, or several (getopt_long refuses both)."""
    if given in _SU_LONG_OPTIONS:
        return given
    matches = [name for name in _SU_LONG_OPTIONS if name.startswith(given)]
    return matches[0] if given and len(matches) == 1 else None


def _is_shell_command(cmdline: Sequence[str]) -> bool:
    """Whether ``cmdline`` is a shell's ``SHELL -c STRING [NAME [ARG…]]`` (``busybox sh -c
    …`` too, and a login shell's ``-bash``), -c being its only option."""
    if cmdline and PurePosixPath(cmdline[0]).name == "busybox":
        cmdline = cmdline[1:]
    return (
        len(cmdline) >= 3
        and cmdline[1] == "-c"
        and PurePosixPath(cmdline[0]).name.removeprefix("-") in SHELLS
    )


def _ends_with(words: Sequence[str], command: Sequence[str]) -> bool:
    """Whether ``words`` end with the command line ``command``: the same arguments after a name
    of the same program (a wrapper names it as it was typed, ``ctx``, where we see a path;
    ``python -m cortexfs`` gives ``cortexfs/__main__.py`` as ours)."""
    if not command or len(words) < len(command):
        return False
    program, arguments = words[-len(command)], words[len(words) - len(command) + 1 :]
    ours = PurePosixPath(command[0])
    names = {ours.name, ours.parent.name} if ours.name == "__main__.py" else {ours.name}
    return PurePosixPath(program).name in names and list(arguments) == list(command[1:])


def _may_have_started(starter: int, pid: int, cmdline: Sequence[str]) -> bool:
    """Whether ``starter``, the parent of process ``pid`` (whose command line is ``cmdline``),
    may be the process that started it rather than a subreaper that adopted it when its
    starter died.

    A child starts in its parent's session and leaves it only by making a session of its
    own, as its leader (setsid).  So a parent in another session than a child that leads none
    cannot have started it: a subreaper such as ``systemd --user``, which runs in a session of
    its own, adopted it.  (A starter that made a session of its own after starting the child
    would be taken for an adopter; shells and wrappers do no such thing.)  A subreaper in the
    child's own session (``tini -s`` run from the same shell script) cannot be told from a
    starter: no mark in /proc says a process reaps orphans.

    A child that leads a session of its own is in none of its parent's, whether the parent
    started it or adopted it (``setsid -f timeout 60 …`` under ``systemd --user``).  Only a
    wrapper that forked itself to lead the session is known to be the starter: ``sudo`` with
    a terminal of its own, whose monitor and the sudo that forked it share one command line.
    Any other session leader is the end of the walk: ``setsid timeout 60 ctx …`` leases to
    timeout."""
    session = os.getsid(pid)
    if session != pid:
        return os.getsid(starter) == session
    import psutil  # see Holder.for_process

    parent = psutil.Process(starter)
    return parent.name() in WAITING_WRAPPERS and parent.cmdline() == list(cmdline)


def _started_apart(one: float | None, other: float | None) -> bool:
    """Whether two start times prove two different processes (unknown proves nothing).

    An int is a start time written to the second (by hand, or from an RFC 3339 time without
    a fraction: :func:`_start_time`): the process started within that second, so only a
    second or more apart proves another process.  A float is psutil's, to the clock tick,
    also when a tick falls on a whole second (one in a hundred do)."""
    if one is None or other is None:
        return False
    coarse = isinstance(one, int) or isinstance(other, int)
    return abs(one - other) >= (_WHOLE_SECOND_TOLERANCE if coarse else _START_TIME_TOLERANCE)


def _start_time(value: object, key: str) -> float:
    """A lease's start time as :func:`_started_apart` judges it: an int when it was written
    to the second (a JSON integer, an RFC 3339 time without a fraction), else a float."""
    seconds = _time(value, key)
    to_the_second = isinstance(value, int) or (isinstance(value, str) and "." not in value)
    return int(seconds) if to_the_second and seconds.is_integer() else seconds


@dataclass(frozen=True)
class Lease:
    """The content of ``lease/J/worker``: a holder, the job, and the lease's lifetime."""

    job: str
    holder: Holder
    claimed_at: float
    expires_at: float
    renewed_at: float | None = None

    @classmethod
    def new(cls, job: str, holder: Holder, ttl: float) -> Lease:
        now = time.time()
        return cls(job=job, holder=holder, claimed_at=now, expires_at=now + ttl)

    @property
    def period(self) -> float:
        """How long the lease was taken, or last renewed, for (seconds)."""
        since = self.claimed_at if self.renewed_at is None else self.renewed_at
        return self.expires_at - since

    def renewed(self, ttl: float) -> Lease:
        now = time.time()
        return replace(self, expires_at=now + ttl, renewed_at=now)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"job": self.job, **vars(self.holder)}  # flat: no asdict copy
        doc["create_time"] = doc.pop("start_time")  # Q-3 names it as psutil does
        doc["boot_time"] = doc.pop("boot_time")  # beside it, for whoever reads the file
        doc["claimed_at"] = rfc3339(self.claimed_at)
        doc["expires_at"] = rfc3339(self.expires_at)
        if self.renewed_at is not None:
            doc["renewed_at"] = rfc3339(self.renewed_at)
        return doc

    def encode(self) -> bytes:
        return (json.dumps(self.to_json()) + "\n").encode()

    @classmethod
    def decode(cls, data: bytes, job: str | None = None) -> Lease:
        """Parse ``lease/J/worker``; EINVAL naming the first missing or malformed field.

        We write every field of :meth:`to_json`, but read what Q-3 asks of a lease and no
        more, so that a lease written by another tool or by hand is judged, not mistaken for
        an unreadable one (which recover must leave alone):

        * ``job`` may be absent (the lease's directory names it); present, it must be ``job``;
        * the start time is ``create_time`` (psutil's name, which we write) or ``start_time``, or
          absent; ``boot_time`` may be absent, and one that is no time is taken as absent;
        * timestamps are RFC 3339, with or without a zone (none means UTC), or epoch seconds.
        """
        try:
            doc = jsontext.loads_strict(data.decode("utf-8"), unique_names=False)
        except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, NotAJsonNumber
            raise invalid(f"lease is not a JSON object: {exc}") from exc
        if not isinstance(doc, dict):
            raise invalid("lease is not a JSON object")
        named = doc.get("job")
        if named is not None and (not isinstance(named, str) or (job and named != job)):
            raise invalid(f"lease names job {named!r}, not {job}")
        if not (named or job):
            raise invalid("lease has no valid field 'job'")
        start_key = "create_time" if "create_time" in doc else "start_time"
        start, boot = doc.get(start_key), doc.get("boot_time")
        machine_id = doc.get("machine_id")
        holder = Holder(
            worker=_field(doc, "worker", str),
            host=_field(doc, "host", str),
            machine_id=machine_id if isinstance(machine_id, str) else None,
            boot_id=_boot_id(doc.get("boot_id")),
            pid_ns=_pid_ns(doc.get("pid_ns")),
            pid=_pid(doc.get("pid")),
            start_time=None if start is None else _start_time(start, start_key),
            boot_time=_boot_time(boot),
        )
        renewed = doc.get("renewed_at")
        return cls(
            job=named or job or "",
            holder=holder,
            claimed_at=_time(doc.get("claimed_at"), "claimed_at"),
            expires_at=_time(doc.get("expires_at"), "expires_at"),
            renewed_at=None if renewed is None else _time(renewed, "renewed_at"),
        )


def _boot_time(value: object) -> float | None:
    """The lease's ``boot_time``, as :func:`_start_time` reads a start time (an int when it
    was written to the second); None when it is absent or is no time: it only refines how a
    start is compared, and a lease is read for what Q-3 asks of it, no more."""
    if value is None:
        return None
    try:
        return _start_time(value, "boot_time")
    except CtxError:
        return None


def _field(doc: dict[str, Any], key: str, kind: type) -> Any:
    value = doc.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise invalid(f"lease has no valid field {key!r}")
    return value


def _pid(value: object) -> int:
    """The holder's pid.  One no process can have makes the lease unreadable, a conflict for a
    human (Q-6), rather than a holder to look for: any member of the space's group may write a
    lease, and psutil refuses a pid below 1 outright, which would stop recover part way."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= PID_MAX_LIMIT:
        raise invalid(f"lease has no valid field 'pid' (a process id, 1 to {PID_MAX_LIMIT})")
    return value


# What a lease says of a boot its holder could not read (no /proc/sys/kernel/random/boot_id):
# no proof of a reboot, whatever boot the reader is in.
UNKNOWN_BOOT = "unknown"


def _boot_of(text: str | None) -> str:
    """This machine's boot id in the one spelling compared, or :data:`UNKNOWN_BOOT`."""
    return _one_spelling(text or "") or UNKNOWN_BOOT


def _boot_id(value: object) -> str:
    """The holder's boot, in the one spelling compared: Q-3's boot id is the content of the
    holder's /proc/sys/kernel/random/boot_id, a UUID, and the same boot written with that
    file's newline, in capitals or without dashes must not read as a reboot, which would
    requeue the job of a live holder (Q-5).  Anything else — empty, a misspelt ``unknown``,
    a UUID with a character more — names no boot anybody can compare, and differing from
    this boot's would read as a reboot: the lease is unreadable, a conflict for a person
    (Q-6)."""
    boot = _one_spelling(value) if isinstance(value, str) and len(value) <= 256 else ""
    if not boot:
        raise invalid("lease has no valid field 'boot_id' (the holder's boot id, a UUID)")
    return boot


def _one_spelling(boot: str) -> str:
    """``boot`` trimmed and in lower case: a UUID in its canonical form, or
    :data:`UNKNOWN_BOOT`; empty for any other text."""
    boot = boot.strip().lower()
    if boot == UNKNOWN_BOOT:
        return boot
    if boot.isascii():  # int(), under uuid.UUID, would take any script's digits
        with contextlib.suppress(ValueError):
            return str(uuid.UUID(boot))
    return ""


def _pid_ns(value: object) -> int:
    """The pid namespace inode: a number, or the ``pid:[N]`` that readlink shows."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    # An inode number: at most 20 ASCII digits (2**64), where \d would take any script's digits
    # and int() refuses thousands of them.
    if isinstance(value, str) and (found := re.fullmatch(r"(?:pid:\[)?([0-9]{1,20})\]?", value)):
        return int(found.group(1))
    raise invalid("lease has no valid field 'pid_ns'")


def _time(value: object, key: str) -> float:
    """Epoch seconds of a lease timestamp: RFC 3339 (no zone: UTC) or a number of seconds,
    naming an instant of years 1 to 9999 (one that can be written back, and judged)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an integer of hundreds of digits
            seconds = math.inf
        if EARLIEST <= seconds <= LATEST:  # NaN is in no range
            return seconds
    elif isinstance(value, str):
        parsed = parse_time(value)  # no zone: UTC
        if parsed is not None:
            return parsed[0]
    raise invalid(
        f"lease field {key!r} is not a time (RFC 3339 or epoch seconds, of years 1 to 9999): "
        f"{value!r}"
    )


@dataclass(frozen=True)
class Verdict:
    """Whether a lease's holder is alive, provably gone, or beyond our sight (treated alive)."""

    state: str
    reason: str

    @property
    def gone(self) -> bool:
        return self.state == GONE


def judge(lease: Lease, here: LocalSystem | None = None, now: float | None = None) -> Verdict:
    """Apply the liveness rules of Q-5 to a lease, from the point of view of ``here``."""
    import psutil  # see Holder.for_process

    here = here or LocalSystem.current()
    now = time.time() if now is None else now
    holder = lease.holder
    where = f"pid {holder.pid} on {holder.host}"
    if now > lease.expires_at:
        # Q-5 lists an expired lease as proof, wherever the holder runs: a holder keeps its
        # job by renewing its lease, as our worker does while a job runs.
        return Verdict(GONE, f"lease of {where} expired at {rfc3339(lease.expires_at)}")
    if holder.boot_id == here.boot_id and holder.pid_ns == here.pid_ns:
        if not here.own_proc:
            if not process_exists(holder.pid):
                return Verdict(GONE, f"{where} has exited")
            return Verdict(
                UNKNOWN,
                f"{where} exists, but /proc here is another pid namespace's, which cannot tell "
                "whether it is the process that took the lease",
            )
        try:
            process = psutil.Process(holder.pid)
            start_time = process.create_time()
            since_boot = started_since_boot(holder.pid)
            status = process.status()
            # A process whose first thread has exited (pthread_exit) shows that thread as a
            # zombie while its other threads work on: it is alive.
            exited = status == psutil.STATUS_ZOMBIE and process.num_threads() <= 1
        except psutil.NoSuchProcess:
            if process_exists(holder.pid):  # hidden from this uid (hidepid=2)
                return Verdict(ALIVE, f"{where} exists but /proc hides it from uid {os.geteuid()}")
            return Verdict(GONE, f"{where} has exited")
        except psutil.Error:
            return Verdict(ALIVE, f"{where} exists but cannot be inspected")
        if holder.started_apart_from(start_time, since_boot):
            return Verdict(GONE, f"{where} has exited; the pid now belongs to another process")
        if exited:
            return Verdict(GONE, f"{where} has exited (zombie)")
        if holder.start_time is None:
            return Verdict(
                ALIVE, f"{where} is running (the lease records no start time to tell a reused pid)"
            )
        return Verdict(ALIVE, f"{where} {_how_it_runs(holder.pid, status, lease.expires_at)}")
    if (
        _same_machine(holder, here)
        and holder.boot_id != here.boot_id
        and UNKNOWN_BOOT not in (holder.boot_id, here.boot_id)
    ):
        return Verdict(GONE, f"{holder.host} rebooted since {where} took the lease")
    if _same_machine(holder, here) and UNKNOWN_BOOT in (holder.boot_id, here.boot_id):
        # Not another host nor pid namespace: a boot id that could not be read proves no
        # reboot, and so nothing of the pid either.
        whose = "the lease's" if holder.boot_id == UNKNOWN_BOOT else "this host's"
        return Verdict(
            UNKNOWN,
            f"{where} cannot be judged: {whose} boot id is unknown, so whether {holder.host} "
            "rebooted since the lease was taken cannot be told; the lease is valid until "
            f"{rfc3339(lease.expires_at)}",
        )
    return Verdict(
        UNKNOWN,
        f"{where} is outside this pid namespace or host; the lease is valid until "
        f"{rfc3339(lease.expires_at)}",
    )


def _how_it_runs(pid: int, status: str, expires_at: float) -> str:
    """``is running``, or why a live holder does not run: a stopped, traced or frozen process
    keeps its job (it is alive, Q-5) and may never go on, and a user waiting on its job should
    be told so rather than see it "running" until its lease expires."""
    import psutil

    if status == psutil.STATUS_STOPPED:
        why = "is stopped (SIGSTOP or job control)"
    elif status == psutil.STATUS_TRACING_STOP:
        why = "is stopped by its tracer"
    elif cgroup := frozen_cgroup(pid):
        why = f"is frozen (cgroup {cgroup})"
    else:
        return "is running"
    until = rfc3339(expires_at)
    return f"{why}; it keeps its job until it goes on, exits, or its lease expires at {until}"


def once_gone(lease: Lease) -> str:
    """When recover may act on a job this lease holds, in the words every message uses that
    sends a user to ``recover --reconcile``: ``once its lease holder (pid N on H) has exited
    or its lease has expired (at T)``.  Until then the job is left alone (Q-5, Q-6), and a
    message that said only "run recover" would send the user round in a circle."""
    holder = lease.holder
    return (
        f"once its lease holder (pid {holder.pid} on {holder.host}) has exited or its lease "
        f"has expired (at {rfc3339(lease.expires_at)})"
    )


def _same_machine(holder: Holder, here: LocalSystem) -> bool:
    if holder.machine_id and here.machine_id:
        return holder.machine_id == here.machine_id and holder.host == here.host
    return holder.host == here.host


# A worker id is written into every lease and result its holder takes, and shown on terminals
# by status, show and the worker: a name, not a document.
MAX_WORKER_ID_BYTES = 255


def check_worker_id(worker: object) -> str:
    """``worker`` if it can name a lease holder, else EINVAL (before any claim): 1 to
    :data:`MAX_WORKER_ID_BYTES` bytes of UTF-8 text, every character printable (no control
    character, line break or bidirectional override), not only blanks."""
    if not isinstance(worker, str):
        raise invalid(f"a worker id is text, not {type(worker).__name__}")
    try:
        size = len(worker.encode("utf-8"))
    except UnicodeEncodeError:
        raise invalid("a worker id must be UTF-8 text") from None
    shown = repr(worker if len(worker) <= 40 else worker[:40] + "...")
    if size > MAX_WORKER_ID_BYTES:
        raise invalid(
            f"worker id {shown} is {size} bytes long; at most {MAX_WORKER_ID_BYTES} are allowed"
        )
    if not worker.strip() or not worker.isprintable():
        raise invalid(
            f"worker id {shown} is not one line of printable text (no control characters)"
        )
    return worker


def check_ttl(ttl: float) -> float:
    """``ttl`` if it is a usable lease lifetime in seconds, else EINVAL (before any claim)."""
    if not (isinstance(ttl, int | float) and math.isfinite(ttl) and 0 < ttl <= MAX_LEASE_TTL):
        raise invalid(
            f"a lease lifetime is a number of seconds above 0 and at most {MAX_LEASE_TTL:.0f} "
            f"(366 days), not {ttl!r}"
        )
    return float(ttl)


def check_worker_ttl(ttl: float) -> float:
    """``ttl`` if a worker can keep a lease of that lifetime renewed, else EINVAL."""
    ttl = check_ttl(ttl)
    if ttl < MIN_WORKER_LEASE_TTL:
        raise invalid(
            f"a worker's lease lifetime is at least {MIN_WORKER_LEASE_TTL:g} second, not {ttl:g}: "
            "it renews every third of it, and a lease that lapses while its job runs lets "
            "recover run the job again"
        )
    return ttl
