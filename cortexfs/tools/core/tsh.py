"""``tsh``: the agent's terminal shell, which runs CortexFS tools and nothing else (SPEC H-1, T-3).

tsh is not a host shell.  A command line is a tool name and its arguments (split like a POSIX
shell's words, without expansions); the name must be an executable on ``CTX_PATH``, the path
the runtime injected from the agent's policy, mounts and uid (T-4).  tsh does not start the
tool itself: it hands the command line, with its own stdin, stdout and stderr, to the host
over the run socket (``CTX_RUN_SOCKET``), which runs it as this agent through the whole
authority chain, its hooks and its records, exactly as ``ctx run`` does, and answers with the
exit status.  So the agent's terminal can do what its tools can, and no more.

``tsh`` reads command lines from its stdin, with a prompt when stdin is a terminal;
``tsh NAME [ARG...]`` runs that one command line, its arguments kept exactly as given (T-3),
and exits with its status.

Built-ins: ``exit [N]``, ``help``, ``which NAME...``, ``tools``, and for the context of loaded
tool metadata and the tool-path cache of H-4 (:mod:`cortexfs.tools.core.tsh_context`, sized
by ``tool/tsh.d/config``): ``load NAME...``, ``describe NAME...``, ``pin NAME...``,
``unpin NAME...``, ``unload NAME...``, ``loaded``, ``rehash``.  An empty argument list is
passed to the tool as it is (T-3).

The same program is also a tool an agent may be granted (``tool/tsh``): run by ``ctx run``,
a worker, or ``tsh`` typed in the agent's terminal, it is a process the host starts outside
any sandbox, with the agent's view in ``CTX_MOUNTS`` as every tool gets it (T-5).  There
``/ctx`` is not the agent's view but the raw storage root (or nothing), so tsh looks up,
lists and describes tools only through that view, as the ``fs.*`` tools reach paths
(:class:`AgentToolContext`), takes ``CTX_PATH`` from the runner alone, never from a
``.tshrc`` the agent could write, and cannot run tools (only a terminal's tsh can).
"""

from __future__ import annotations

import array
import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import stat
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cortexfs.errors import CtxError
from cortexfs.names import is_decimal, is_object_name
from cortexfs.printable import printable, printable_text, shortened
from cortexfs.regular_file import read_regular_file
from cortexfs.tools.core import confine
from cortexfs.tools.core.toolio import ToolFailure
from cortexfs.tools.core.tsh_config import DEFAULTS, MAX_CONFIG_BYTES
from cortexfs.tools.core.tsh_context import (
    ToolInfo,
    TshContext,
    json_or_none,
    read_settings,
    settings_of,
    unreadable_settings,
)
from cortexfs.tools.core.tsh_line import (
    MAX_LINE_BYTES,
    LineTooLong,
    read_terminal_line,
    split_words,
)

HELP = """tsh runs CortexFS tools: NAME [ARG...], NAME found on CTX_PATH.  There are no host
commands here.  Built-ins:
  exit [N]          leave tsh
  help              this text
  which NAME...     where CTX_PATH resolves NAME
  tools             the tools on CTX_PATH
  load NAME...      load tools' metadata into this tsh's context (running a tool loads it too)
  describe NAME...  load tools and show their description, input schema and cap
  pin NAME...       load and keep: exempt from unload and from the path cache's eviction
  unpin NAME...     make pinned tools ordinary again
  unload NAME...    drop tools' metadata from the context
  loaded            the context: pinned tools, then the rest, most recently used first
  rehash            forget the cached paths of unpinned tools
The context holds max_loaded_tools unpinned tools, the path cache cache_capacity names
(tool/tsh.d/config, 'tsh.config' shows and changes them).
Only an agent terminal ('ctx agent start AGENT') runs tools, and there CTX_PATH is the one
the terminal gives.  Elsewhere tsh lists, finds and describes tools but runs none (EACCES,
exit 126); its CTX_PATH comes from $CTX_HOME/.tshrc, else the environment, else
/ctx/tool:/ctx/home/<uid>/tool.  Exit status: the tool's (for lines read, the last one's),
127 when NAME is no tool on CTX_PATH, 126 when it cannot be run.
"""
NOT_FOUND = 127
NOT_ON_PATH = "not a tool on CTX_PATH"
CANNOT_RUN = 126
# What ctx answers when its output cannot be written (cortexfs.cli.exits), tsh answers too: a
# reader that left (`tsh tools | head -1`) ends it quietly, a full disk or /dev/full is said.
READER_GONE = 141
OUTPUT_FAILED = 74

Builtin = Callable[[TshContext, list[str]], int]


def search_path() -> list[str]:
    """The directories tsh looks in, in order (T-4).

    In an agent terminal (ctxterm gave it ``CTX_RUN_SOCKET``) and in an agent's tool process
    the runtime-injected ``CTX_PATH`` is authoritative (the latter's entries are paths of the
    agent's view, :class:`AgentToolContext` reads them).  A standalone human tsh takes
    ``CTX_PATH=`` from ``$CTX_HOME/.tshrc``, else the process ``CTX_PATH``, else
    ``/ctx/tool:/ctx/home/<uid>/tool``, with ``/ctx/…`` read in the storage root this tsh
    belongs to when ``/ctx`` is not mounted.
    """
    if _in_agent_terminal() or _as_agent_tool():
        entries = os.environ.get("CTX_PATH", "").split(":")
        return [entry for entry in entries if entry.startswith("/")]
    from cortexfs.tools.ctxpath import human_search_path

    root, uid = _own_storage_root(), os.getuid()
    try:
        found = human_search_path(root, uid=uid, environ=os.environ, warn=_warn_on_stderr)
    except CtxError as exc:
        # A shell still starts with an unusable rc file, as sh does: said (once), and the
        # next source of the path taken.
        _warn_on_stderr(f"{exc.code_name}: {exc.message}; CTX_PATH or the default used instead")
        found = human_search_path(root, uid=uid, environ=os.environ, tshrc=False)
    return [str(directory) for directory in found.directories]


_warned: set[str] = set()


def _warn_on_stderr(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        # It quotes paths and lines that the environment and the user's .tshrc gave.
        print(f"tsh: warning: {printable(message)}", file=sys.stderr)


def _in_agent_terminal() -> bool:
    return "CTX_RUN_SOCKET" in os.environ


def _as_agent_tool() -> bool:
    """Whether the host runs this tsh as an agent's tool: the runner gives every tool
    ``CTX_AGENT`` and the agent's view, ``CTX_MOUNTS``."""
    return not _in_agent_terminal() and ("CTX_AGENT" in os.environ or "CTX_MOUNTS" in os.environ)


def _own_storage_root() -> Path:
    """The storage root holding this program (``bin/tsh`` or ``tool/tsh``)."""
    return Path(os.path.realpath(sys.argv[0])).parent.parent


def config_path() -> str:
    """``tool/tsh.d/config`` of this tsh's storage root (H-4): in an agent terminal the root
    is the agent's view of ``/ctx``, where ``tool/tsh.d/`` is always visible."""
    return str(_own_storage_root() / "tool" / "tsh.d" / "config")


def new_context() -> TshContext:
    """The context of this tsh; ToolFailure when it runs as an agent's tool and the view the
    runner gave it is malformed."""
    if _as_agent_tool():
        # Without CTX_MOUNTS the agent sees nothing: never the host's filesystem, which is
        # what a tool without it gets (a person running it directly).
        view = confine.View.from_environment({"CTX_MOUNTS": "[]", **os.environ})
        settings, unusable = AgentToolContext.read_settings(view)
        context: TshContext = AgentToolContext(settings, view)
    else:
        settings, unusable = read_settings(config_path())
        context = TshContext(settings, search_path)
    for problem in unusable:
        print(f"tsh: {problem} (ignored; the default applies)", file=sys.stderr)
    return context


class AgentToolContext(TshContext):
    """The context of a tsh run as an agent's tool: tools found, listed and described only in
    the agent's view (``CTX_MOUNTS``, T-5), by the rules of :mod:`cortexfs.tools.core.confine`.

    A name a filtered mount does not list is not there (``/ctx/tool`` lists only the tools the
    agent may run, ``/ctx/agent`` only itself), a path outside every mount is not there, and
    no symbolic link is followed, on the way or at the end: the agent writes its own home,
    ``home/<uid>/tool`` included, and a link there must not lead past its view.  Paths are
    the view's (``/ctx/tool/fs.read``), never the host's.  Names are looked up afresh each
    time: a one-shot tool has no use for the path cache, whose checks stat host directories.
    """

    CONFIG = "/ctx/tool/tsh.d/config"

    def __init__(self, settings: dict[str, int], view: confine.View) -> None:
        super().__init__(settings, search_path)
        self.view = view

    @classmethod
    def read_settings(cls, view: confine.View) -> tuple[dict[str, int], list[str]]:
        """H-4's settings from ``tool/tsh.d/config`` in the view (always visible there), and
        what is wrong with it: a config that cannot be used (a link, a FIFO, too large) is
        said as the terminal's tsh says it, naming the view path."""
        try:
            place = view.locate(cls.CONFIG)
        except ToolFailure:
            return dict(DEFAULTS), []  # a view without /ctx holds no config: the defaults
        try:
            data = _bytes_in_view(place, MAX_CONFIG_BYTES)
        except ToolFailure as failure:  # the walk to it: tsh.d missing, a link…
            return unreadable_settings(cls.CONFIG, OSError(failure.errno, failure.message))
        except OSError as exc:
            return unreadable_settings(cls.CONFIG, exc)
        return settings_of(data)

    def which(self, name: str) -> str | None:
        if not is_object_name(name):
            return None
        for directory in search_path():
            path = f"{directory.rstrip('/')}/{name}"
            if self._is_executable_file(path):
                return path
        return None

    def unreachable(self) -> tuple[str, OSError] | None:
        """None: the CTX_PATH entries here are view paths, looked in through the mounts'
        sources, so the host's own ``/ctx/tool`` (whatever is there, or nothing) says nothing
        of them, and no terminal's view is there to have ended."""
        return None

    def names_in(self, directory: str) -> list[str]:
        """The names a listing of ``directory`` shows in the view; none when it cannot be
        listed."""
        try:
            place = self.view.locate(directory)
            fd = confine.open_directory(place, listable=True)
        except (ToolFailure, OSError):
            return []
        try:
            return confine.listed(place, os.listdir(fd))
        except OSError:
            return []
        finally:
            os.close(fd)

    def _is_executable_file(self, path: str) -> bool:
        """T-4's hit, in the view: a regular file with an execute bit, not a link."""
        try:
            place = self.view.locate(path)
            parent = confine.open_parent(place)
        except (ToolFailure, OSError):
            return False
        try:
            status = confine.lstat_at(parent, place.name)
        except OSError:
            return False
        finally:
            os.close(parent)
        return status is not None and stat.S_ISREG(status.st_mode) and bool(status.st_mode & 0o111)

    def _read(self, name: str) -> ToolInfo:
        path = self.which(name)
        if path is None:
            raise LookupError(name)

        def control(control: str) -> str | None:
            return _read_in_view(self.view, f"{path}.d/{control}", _MAX_CONTROL_BYTES)

        return ToolInfo(
            name=name,
            path=path,
            description=control("description") or "",
            schema=json_or_none(control("schema")),
            cap=json_or_none(control("cap")),
        )


_MAX_CONTROL_BYTES = 64 * 1024  # as a human tsh: a larger description or schema is not shown


def _read_in_view(view: confine.View, path: str, limit: int) -> str | None:
    """The text of the regular file at view path ``path``; None when the view does not show
    it, it is not a regular file (a link, a FIFO), cannot be read or is over ``limit``."""
    try:
        return _bytes_in_view(view.locate(path), limit).decode("utf-8", "replace")
    except (ToolFailure, OSError):
        return None


def _bytes_in_view(place: confine.Place, limit: int) -> bytes:
    """The bytes of the regular file at ``place``, at most ``limit``: ToolFailure when the
    walk to its directory is refused, OSError as :func:`read_regular_file` raises it."""
    parent = confine.open_parent(place)
    try:
        return read_regular_file(place.name, limit, dir_fd=parent)
    finally:
        os.close(parent)


def tools(context: TshContext) -> list[str]:
    found: dict[str, None] = {}
    for directory in search_path():
        if isinstance(context, AgentToolContext):
            names = context.names_in(directory)
        else:
            try:
                names = sorted(os.listdir(directory))
            except OSError:
                continue
        for name in names:
            if not name.endswith(".d") and context.which(name) is not None:
                found.setdefault(name)
    return list(found)


def call(name: str, argv: list[str]) -> int:
    """Have the host run ``name`` with ``argv`` on this terminal; its exit status.

    The tool leads the terminal while it runs (the host starts it in a session of its own
    with the PTY as its controlling terminal), so Ctrl-C, Ctrl-Z and ``/dev/tty`` reach it as
    they reach a shell's job.  Where tsh leads no terminal, Ctrl-C reaches tsh, which asks
    the host to interrupt the running call, then waits for its status as usual."""
    if _as_agent_tool():
        print(
            f"tsh: {name}: EACCES: this tsh runs as a tool of agent "
            f"{os.environ.get('CTX_AGENT', '?')}, not in its terminal, so it cannot run tools "
            f"(H-2); run {name} as a tool of its own",
            file=sys.stderr,
        )
        return CANNOT_RUN
    if "CTX_RUN_SOCKET" not in os.environ:
        # H-2: a standalone tsh may find tools and read their metadata, never run one as an
        # agent; only ctxterm, which runs the call under the agent's identity, can.
        print(
            f"tsh: {name}: EACCES: this tsh is not an agent terminal, so it cannot run tools "
            "(H-2); start one with 'ctx agent start AGENT', or run a safe core CLI with "
            "'ctx tool NAME'",
            file=sys.stderr,
        )
        return CANNOT_RUN
    # The tool leads the terminal while it runs, as a shell's job does (H-5): tsh lets go of
    # it and takes it back once the host has answered.
    let_go = _let_go_of_terminal()
    message = {"tool": name, "argv": argv, **({"terminal": True} if let_go else {})}
    request = json.dumps(message).encode() + b"\n"
    descriptors = array.array("i", [0, 1, 2])
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.connect(os.environ["CTX_RUN_SOCKET"])
            connection.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, descriptors)])
            answers = connection.makefile("rb")
            while True:
                try:
                    answer = answers.readline()
                    break
                except KeyboardInterrupt:
                    _interrupt()
        outcome = _host_outcome(answer)
        if outcome.get("error"):  # refused by the host before anything ran
            print(f"tsh: {name}: {printable(str(outcome['error']))}", file=sys.stderr)
        return _exit_status(outcome["exit_status"])
    except OSError as exc:
        code = errno.errorcode.get(exc.errno or errno.EIO, "EIO")
        where = printable(os.environ["CTX_RUN_SOCKET"])
        print(
            f"tsh: {name}: {code}: the host did not run it: its run socket {where}: "
            f"{exc.strerror or exc}",
            file=sys.stderr,
        )
        return CANNOT_RUN
    except ValueError as exc:  # an answer that is no JSON, or holds no exit status
        print(f"tsh: {name}: EPROTO: the host did not run it: {exc}", file=sys.stderr)
        return CANNOT_RUN
    finally:
        if let_go:
            _take_terminal_back()


def _host_outcome(answer: bytes) -> dict[str, Any]:
    """The host's answer to a command line: one JSON object holding its exit status;
    ValueError saying what it was instead."""
    if not answer:
        raise ValueError("it closed its run socket without an answer")
    try:
        outcome = json.loads(answer)
    except ValueError:  # no JSON, or no UTF-8
        text = answer.decode("utf-8", "backslashreplace").rstrip("\n")
        raise ValueError(f"its answer is no JSON: {shortened(printable(text))}") from None
    if not isinstance(outcome, dict) or "exit_status" not in outcome:
        shown = shortened(printable(json.dumps(outcome)))
        raise ValueError(f"its answer is no JSON object with an exit_status: {shown}")
    return outcome


def _exit_status(value: object) -> int:
    """The exit status the host answered; ValueError for anything else (``null``, an object,
    ``1e400``, which ``int()`` refuses with a TypeError or an OverflowError): the host did
    not run the tool, as for an answer that is not an object."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 255:
        return value
    shown = shortened(json.dumps(value))
    raise ValueError(f"its answer's exit_status is {shown}, which is no exit status (0 to 255)")


# How long tsh tries to take its terminal back after a call: the tool's session lets go of it
# as its leader exits, which comes before the host's answer; a straggler of the call that led
# a session of its own holds it until the host has killed it.
TAKE_BACK_SECONDS = 2.0


def _lead_terminal() -> None:
    """In an agent terminal: lead a session of tsh's own whose controlling terminal is the
    PTY on stdin, so that tsh can let go of it for each tool it runs (:func:`call`).  Where
    it cannot, tsh runs on as it was started, and its tools run on the PTY without leading it."""
    with contextlib.suppress(OSError):
        if os.getsid(0) != os.getpid():
            os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _let_go_of_terminal() -> bool:
    """Let go of the controlling terminal tsh leads, for the next tool to lead it; False when
    tsh leads none.  The kernel hangs up the terminal's foreground group as it lets go, which
    is tsh's own: ignored for that moment."""
    try:
        if os.getsid(0) != os.getpid() or os.tcgetpgrp(0) != os.getpgrp():
            return False
    except OSError:
        return False
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        fcntl.ioctl(0, termios.TIOCNOTTY)
    except OSError:
        return False
    finally:
        signal.signal(signal.SIGHUP, previous)
    return True


def _take_terminal_back() -> None:
    deadline = time.monotonic() + TAKE_BACK_SECONDS
    while True:
        try:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            return
        except OSError as exc:
            if exc.errno != errno.EPERM or time.monotonic() >= deadline:
                code = errno.errorcode.get(exc.errno or errno.EIO, "EIO")
                print(
                    f"tsh: {code}: cannot take the terminal back ({exc.strerror}): Ctrl-C "
                    "reaches neither tsh nor its tools until the terminal is started again",
                    file=sys.stderr,
                )
                return
        time.sleep(0.01)


PR_SET_DUMPABLE = 4


def _refuse_tracing() -> None:
    """Make this process not dumpable: the run socket serves tsh alone (the process in the
    sandbox's pid namespace), so another process of the agent's uid must not drive it, by
    ptrace or through ``/proc/<pid>/root``; only a tracer with CAP_SYS_PTRACE still can.
    tsh never execs, so the setting holds for its whole life."""
    from cortexfs.libc import check, libc

    check(libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE, 0)")


def _terminal_modes() -> list[Any] | None:
    try:
        return termios.tcgetattr(sys.stdin.fileno())
    except termios.error:
        return None


def _interrupt() -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(os.environ["CTX_RUN_SOCKET"])
        connection.sendall(b'{"interrupt": true}\n')


def _read_line(prompt: str, typing_shown_on: int | None) -> str:
    """The next command line, without its line break, after ``prompt``; EOFError at the end
    of the input, LineTooLong for a line over its bound.  ``typing_shown_on``: at a terminal,
    the descriptor that shows the prompt and the typing (:func:`_where_typing_shows`).

    Not ``input()``: at a terminal that reads through C's ``fgets``, which ends the line at a
    NUL byte and glues what follows to the next line, so a command typed after a line holding
    a NUL would run fused to that line's start; and a terminal's own line editing keeps 4095
    bytes of a line (see :mod:`cortexfs.tools.core.tsh_line`)."""
    # What the last command printed goes out before tsh waits, as input() sends it: a script
    # on a pipe reads the answer before it writes the next line.
    sys.stderr.flush()
    if typing_shown_on is not None:
        sys.stdout.flush()
        typed = read_terminal_line(sys.stdin.fileno(), typing_shown_on, prompt.encode())
        if typed is None:
            raise EOFError
        return typed.decode(sys.stdin.encoding, sys.stdin.errors or "strict")
    sys.stdout.write(prompt)
    sys.stdout.flush()
    # Read by characters, which are never fewer than their bytes; the bound is on bytes,
    # line break apart, as at a terminal.
    line = sys.stdin.readline(MAX_LINE_BYTES + 1)
    if not line:
        raise EOFError
    text = line.removesuffix("\n")
    if len(text) > MAX_LINE_BYTES or _bytes_of(text) > MAX_LINE_BYTES:
        # The rest of it is read and dropped in bounded pieces, never held whole.
        while line and not line.endswith("\n"):
            line = sys.stdin.readline(1 << 16)
        raise LineTooLong
    return text


def _where_typing_shows() -> int:
    """The descriptor that shows the prompt and what is typed at the terminal on stdin: the
    terminal itself, as a shell shows them whatever its output goes to, so that ``tsh >
    out.txt`` keeps the file for the tools' output and the person sees what they type.
    Standard output or error when either is that terminal, else the terminal opened anew."""
    terminal = os.fstat(sys.stdin.fileno()).st_rdev
    for fd in (sys.stdout.fileno(), sys.stderr.fileno()):
        with contextlib.suppress(OSError):
            if os.isatty(fd) and os.fstat(fd).st_rdev == terminal:
                return fd
    try:
        return os.open("/proc/self/fd/0", os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return sys.stdout.fileno()  # a terminal that cannot be opened again: as before


def _end_prompt_line(typing_shown_on: int) -> None:
    """End the line the prompt and the typing are on, where they are shown."""
    with contextlib.suppress(OSError):  # a terminal gone has no line to end
        os.write(typing_shown_on, b"\n")


def _bytes_of(text: str) -> int:
    """How many bytes of standard input ``text`` was read from."""
    return len(text.encode(sys.stdin.encoding, sys.stdin.errors or "strict"))


def execute(context: TshContext, line: str, status: int) -> tuple[int, bool]:
    """Run one command line; the new ``$?`` and whether tsh should exit.  A line whose first
    word starts with an unquoted ``#`` is a comment, as in a shell script piped in: no tool
    name starts so (R-3), and ``$?`` stays as it was."""
    if line.lstrip(" \t").startswith("#"):
        return status, False
    try:
        words = split_words(line)
    except ValueError as exc:
        print(f"tsh: {exc}", file=sys.stderr)
        return 2, False
    if not words:
        return status, False
    return execute_words(context, words[0], words[1:], status)


def execute_words(context: TshContext, name: str, argv: list[str], status: int) -> tuple[int, bool]:
    """Run built-in or tool ``name`` with ``argv``; the new ``$?`` and whether to exit."""
    if name == "exit":
        return _exit(argv, status)
    builtin = BUILTINS.get(name)
    if builtin is not None:
        return builtin(context, argv), False
    if context.which(name) is None:
        # The name is what was typed, escape sequences included: shown escaped to the
        # terminal and everyone watching it, and cut when it runs to pages.
        print(f"tsh: {_shown(name)}: {_why_not_found(context)}", file=sys.stderr)
        return NOT_FOUND, False
    sys.stdout.flush()
    if _in_agent_terminal():
        _report_unloaded(context.load(name)[1])  # a tool in use is in the context
    return call(name, argv), False


def _why_not_found(context: TshContext) -> str:
    """Why a name typed as a command was not found: no tool has it (tsh runs nothing else),
    or a CTX_PATH directory could not be looked in (:func:`_not_on_path`)."""
    why = _unreachable(context)
    if why is None:
        return f"{NOT_ON_PATH} (tsh runs CortexFS tools only)"
    return f"{NOT_ON_PATH}: {why}"


def _not_on_path(context: TshContext, said: str = NOT_ON_PATH) -> str:
    """``said`` of a name ``which``, ``load``, ``describe`` or ``pin`` did not find, and why
    when a CTX_PATH directory could not be looked in: without it, a terminal whose view has
    ended would read as one that holds no such tool."""
    why = _unreachable(context)
    return said if why is None else f"{said}: {why}"


def _unreachable(context: TshContext) -> str | None:
    """Which CTX_PATH directory could not be looked in, why and what to do; None when each
    could.  ``/ctx`` of a terminal whose view's mount ended answers ``ENOTCONN`` until the
    host stops and starts the terminal again."""
    unreachable = context.unreachable()
    if unreachable is None:
        return None
    directory, exc = unreachable
    code = errno.errorcode.get(exc.errno or errno.EIO, "EIO")
    remedy = (
        "this terminal's view of /ctx has ended: ask the host to stop and start the terminal"
        if exc.errno == errno.ENOTCONN
        else "ask the host to look at its filesystem"
    )
    return (
        f"the CTX_PATH directory {_shown(directory)} cannot be reached "
        f"({code}: {exc.strerror}); {remedy}"
    )


def _shown(word: str) -> str:
    """A word typed, as a message names it: escaped, and cut past a few lines' length (a
    line may hold a mebibyte)."""
    return shortened(printable(word), _SHOWN_WORD)


_SHOWN_WORD = 256  # characters: longer than any tool name or most paths typed


def _exit(argv: list[str], status: int) -> tuple[int, bool]:
    """``exit [N]``, as a POSIX shell reads it: N modulo 256, the last status without N;
    N that is not a decimal number leaves with 2, two or more arguments do not leave."""
    if not argv:
        return status, True
    if len(argv) > 1:
        print("tsh: exit: too many arguments (exit [N])", file=sys.stderr)
        return 1, False
    number = argv[0].removeprefix("-")
    if not is_decimal(number):
        print(
            f"tsh: exit: {_shown(argv[0])}: a decimal number is needed (exit [N])",
            file=sys.stderr,
        )
        return 2, True
    # N modulo 256 is its last eight digits' (10**8 is a multiple of 256), read however long
    # N is: Python reads no int of over 4300 digits.
    modulo = int(number[-8:]) % 256
    return (-modulo if argv[0].startswith("-") else modulo) % 256, True


def _help(context: TshContext, argv: list[str]) -> int:
    sys.stdout.write(HELP)
    return 0


def _which(context: TshContext, argv: list[str]) -> int:
    if not argv:
        return _needs_names("which")
    found = [context.which(word) for word in argv]
    for word, path in zip(argv, found, strict=True):
        if path:  # a path: anyone's, shown whole
            print(printable(path))
        else:
            why = _not_on_path(context, "not on CTX_PATH")
            print(f"tsh: {_shown(word)}: {why}", file=sys.stderr)
    return 0 if all(found) else 1


def _tools(context: TshContext, argv: list[str]) -> int:
    for name in tools(context):
        print(name)
    return 0


def _each_tool(argv: list[str], verb: str, action: Callable[[str], str | None]) -> int:
    """``action`` on each name, which answers what went wrong or None; 1 when something did,
    2 without names."""
    if not argv:
        return _needs_names(verb)
    status = 0
    for name in argv:
        problem = action(name)
        if problem:
            print(f"tsh: {verb}: {_shown(name)}: {printable(problem)}", file=sys.stderr)
            status = 1
    return status


def _needs_names(verb: str) -> int:
    print(f"tsh: {verb}: a tool name is needed ({verb} NAME...)", file=sys.stderr)
    return 2


def _without_arguments(verb: str, builtin: Builtin) -> Builtin:
    """``builtin``, refusing arguments as a usage error (2) rather than ignoring them: a word
    after ``tools`` or ``loaded`` is more likely a mistake than something to drop unread."""

    def checked(context: TshContext, argv: list[str]) -> int:
        if argv:
            print(f"tsh: {verb}: takes no arguments ({verb})", file=sys.stderr)
            return 2
        return builtin(context, argv)

    return checked


def _loading(verb: str, show: Callable[[ToolInfo], str]) -> Builtin:
    """A built-in that loads each named tool into the context and prints ``show(info)``."""

    def builtin(context: TshContext, argv: list[str]) -> int:
        def load(name: str) -> str | None:
            try:
                info, unloaded = context.load(name)
            except LookupError:
                return _not_on_path(context)
            print(printable_text(show(info)))  # a tool's description, its author's words
            _report_unloaded(unloaded)
            return None

        return _each_tool(argv, verb, load)

    return builtin


def _pin(context: TshContext, argv: list[str]) -> int:
    def pin(name: str) -> str | None:
        try:
            print(f"{printable(context.pin(name).summary())}  (pinned)")
        except LookupError:
            return _not_on_path(context)
        return None

    return _each_tool(argv, "pin", pin)


def _unpin(context: TshContext, argv: list[str]) -> int:
    def unpin(name: str) -> str | None:
        try:
            _report_unloaded(context.unpin(name))
        except KeyError:
            return "not pinned"
        return None

    return _each_tool(argv, "unpin", unpin)


def _unload(context: TshContext, argv: list[str]) -> int:
    def unload(name: str) -> str | None:
        try:
            context.unload(name)
        except KeyError:
            return "not loaded"
        except ValueError:
            return f"pinned; 'unpin {name}' first"
        return None

    return _each_tool(argv, "unload", unload)


def _loaded(context: TshContext, argv: list[str]) -> int:
    for info, pinned in context.loaded():
        print(f"{printable(info.summary())}{'  (pinned)' if pinned else ''}")
    return 0


def _rehash(context: TshContext, argv: list[str]) -> int:
    context.rehash()
    return 0


def _report_unloaded(names: list[str]) -> None:
    for name in names:
        print(f"tsh: unloaded {name} (max_loaded_tools reached)", file=sys.stderr)


BUILTINS: dict[str, Builtin] = {
    "help": _without_arguments("help", _help),
    "which": _which,
    "tools": _without_arguments("tools", _tools),
    "load": _loading("load", ToolInfo.summary),
    "describe": _loading("describe", lambda info: json.dumps(info.to_json(), indent=2)),
    "pin": _pin,
    "unpin": _unpin,
    "unload": _unload,
    "loaded": _without_arguments("loaded", _loaded),
    "rehash": _without_arguments("rehash", _rehash),
}


def run() -> int:
    from cortexfs.standard_streams import (
        OutputError,
        discard_output,
        prepare_standard_streams,
        tell_output_errors,
    )

    prepare_standard_streams()  # tsh <&- reads nothing, tsh >&- prints nowhere
    tell_output_errors()
    try:
        status = _run()
        sys.stdout.flush()  # here, not at the interpreter's exit, where a failure is exit 120
    except BrokenPipeError:
        discard_output(sys.stdout)
        return READER_GONE
    except OutputError as exc:
        discard_output(sys.stdout)
        code = errno.errorcode.get(exc.errno or errno.EIO, "EIO")
        print(f"tsh: {code}: cannot write standard output ({exc.strerror})", file=sys.stderr)
        return OUTPUT_FAILED
    return status


def _run() -> int:
    if sys.argv[1:] in (["--help"], ["-h"]):  # never a tool: a name starts with a letter or digit
        sys.stdout.write(f"usage: tsh [NAME [ARG...]]\n{HELP}")
        return 0
    if _in_agent_terminal():
        try:
            _refuse_tracing()
        except OSError as exc:
            print(f"tsh: EPERM: cannot guard this terminal against tracing: {exc}", file=sys.stderr)
            return CANNOT_RUN
    try:
        context = new_context()
    except ToolFailure as exc:
        print(f"tsh: {errno.errorcode.get(exc.errno, 'EIO')}: {exc.message}", file=sys.stderr)
        return CANNOT_RUN
    if len(sys.argv) > 1:  # tsh NAME [ARG...]: one command line, its words as given (T-3)
        status, _ = execute_words(context, sys.argv[1], sys.argv[2:], 0)
        return status
    # Started with SIGINT ignored (so that Ctrl-C spares the sandbox around it): take it back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # As a POSIX shell does, prompt only a person at a terminal: commands piped in from a
    # script answer with their output alone, which the script can read.
    interactive = sys.stdin.isatty()
    if interactive and _in_agent_terminal():
        _lead_terminal()
    prompt = f"{os.environ.get('CTX_AGENT', 'agent')}$ " if _in_agent_terminal() else "tsh$ "
    # The terminal's modes as tsh found them: a tool killed by a signal after it changed
    # them (stty -echo) has them put back, as a shell does, or the next line is typed blind.
    modes = _terminal_modes() if interactive else None
    typing_shown_on = _where_typing_shows() if interactive else None
    status = 0
    while True:
        try:
            line = _read_line(prompt if interactive else "", typing_shown_on)
        except LineTooLong:
            print(
                f"tsh: E2BIG: a command line holds at most {MAX_LINE_BYTES} bytes; "
                "this one was dropped",
                file=sys.stderr,
            )
            status = 2
            continue
        except EOFError:
            if typing_shown_on is not None:
                _end_prompt_line(typing_shown_on)
            return status
        except KeyboardInterrupt:
            if typing_shown_on is not None:
                _end_prompt_line(typing_shown_on)
            else:
                print()
            continue
        status, done = execute(context, line, status)
        if done:
            return status
        if modes is not None and status > 128:
            with contextlib.suppress(termios.error, OSError):
                termios.tcsetattr(sys.stdin.fileno(), termios.TCSADRAIN, modes)
