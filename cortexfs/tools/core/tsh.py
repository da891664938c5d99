"""``tsh``: the agent's terminal shell, which runs CortexFS tools and nothing else (SPEC H-1, T-3).

tsh is not a host shell.  A command line is a tool name and its arguments (split like a POSIX
shell's words, without expansions); the name must be an executable on ``CTX_PATH``, the path
the runtime injected from the agent's policy, mounts and uid (T-4).  tsh does not start the
tool itself: it hands the command line, with its own stdin, stdout and stderr, to the host
over the run socket (``CTX_RUN_SOCKET``), which runs it as this agent through the whole
authority chain, its hooks and its records, exactly as ``ctx run`` does, and answers with the
exit status.  So the agent's terminal can do what its tools can, and no more.

Built-ins: ``exit [N]``, ``help``, ``which NAME``, ``tools``.  An empty argument list is passed
to the tool as it is (T-3).
"""

from __future__ import annotations

import array
import json
import os
import shlex
import signal
import socket
import stat
import sys
from pathlib import Path

HELP = """tsh runs CortexFS tools: NAME [ARG...], NAME found on CTX_PATH.
Built-ins: exit [N], help, which NAME, tools.  There are no host commands here.
"""
NOT_FOUND = 127
CANNOT_RUN = 126


def search_path() -> list[str]:
    """The directories tsh looks in, in order (T-4).

    In an agent terminal (ctxterm gave it ``CTX_RUN_SOCKET``) the runtime-injected
    ``CTX_PATH`` is authoritative.  A standalone human tsh takes ``CTX_PATH=`` from
    ``$CTX_HOME/.tshrc``, else the process ``CTX_PATH``, else ``/ctx/tool:/ctx/home/<uid>/tool``,
    with ``/ctx/…`` read in the storage root this tsh belongs to when ``/ctx`` is not mounted.
    """
    if _in_agent_terminal():
        entries = os.environ.get("CTX_PATH", "").split(":")
        return [entry for entry in entries if entry.startswith("/")]
    from cortexfs.tools.ctxpath import human_search_path

    found = human_search_path(_own_storage_root(), uid=os.getuid(), environ=os.environ)
    return [str(directory) for directory in found.directories]


def _in_agent_terminal() -> bool:
    return "CTX_RUN_SOCKET" in os.environ


def _own_storage_root() -> Path:
    """The storage root holding this program (``bin/tsh`` or ``tool/tsh``)."""
    return Path(os.path.realpath(sys.argv[0])).parent.parent


def which(name: str) -> str | None:
    """The first executable regular file ``name`` on CTX_PATH (T-4)."""
    if "/" in name or name in ("", ".", ".."):
        return None
    for directory in search_path():
        candidate = os.path.join(directory, name)
        try:
            status = os.stat(candidate, follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(status.st_mode) and os.access(candidate, os.X_OK):
            return candidate
    return None


def tools() -> list[str]:
    found: dict[str, None] = {}
    for directory in search_path():
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in names:
            if not name.endswith(".d") and which(name) is not None:
                found.setdefault(name)
    return list(found)


def call(name: str, argv: list[str]) -> int:
    """Have the host run ``name`` with ``argv`` on this terminal; its exit status.

    Ctrl-C reaches tsh, not the tool (which the host runs): tsh asks the host to interrupt
    the running call, then waits for its status as usual."""
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
    request = json.dumps({"tool": name, "argv": argv}).encode() + b"\n"
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
        return int(json.loads(answer)["exit_status"])
    except (OSError, KeyError, ValueError) as exc:
        print(f"tsh: {name}: the host did not run it: {exc}", file=sys.stderr)
        return CANNOT_RUN


def _interrupt() -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(os.environ["CTX_RUN_SOCKET"])
        connection.sendall(b'{"interrupt": true}\n')


def execute(line: str, status: int) -> tuple[int, bool]:
    """Run one command line; the new ``$?`` and whether tsh should exit."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        print(f"tsh: {exc}", file=sys.stderr)
        return 2, False
    if not words:
        return status, False
    name, argv = words[0], words[1:]
    if name == "exit":
        return (int(argv[0]) if argv and argv[0].isdigit() else status), True
    if name == "help":
        sys.stdout.write(HELP)
        return 0, False
    if name == "which":
        found = [which(word) for word in argv]
        for word, path in zip(argv, found, strict=True):
            print(path or f"tsh: {word}: not on CTX_PATH", file=sys.stdout if path else sys.stderr)
        return (0 if all(found) else 1), False
    if name == "tools":
        print("\n".join(tools()))
        return 0, False
    if which(name) is None:
        print(
            f"tsh: {name}: not a tool on CTX_PATH (tsh runs CortexFS tools only)", file=sys.stderr
        )
        return NOT_FOUND, False
    sys.stdout.flush()
    return call(name, argv), False


def run() -> int:
    # Started with SIGINT ignored (so that Ctrl-C spares the sandbox around it): take it back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    prompt = f"{os.environ.get('CTX_AGENT', 'agent')}$ " if _in_agent_terminal() else "tsh$ "
    status = 0
    while True:
        try:
            line = input(prompt)
        except EOFError:
            print()
            return status
        except KeyboardInterrupt:
            print()
            continue
        status, done = execute(line, status)
        if done:
            return status
