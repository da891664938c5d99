"""The error branches of the agent terminal, reached from outside through the installed
commands: ``ctx agent start|stop|watch|show``, ``bin/ctxterm`` (the same terminal in the
foreground), a live terminal's sockets, and the run capability a core tool is handed.

Sources: SPEC A-1, A-2, A-5, H-1, R-5, P-5; docs/tools.md ("The agent terminal", "A terminal
that was killed", "The core tools", the run capability of ``agent.update``), docs/sessions.md
(an agent's log), and the help of ``ctx agent start|stop|watch|show`` and ``bin/ctxterm``.

The angle: each refusal the terminal's code can give is provoked as a user or an operator
provokes it — a start from a directory removed under the shell, a ``bin/tsh`` removed, left
without its execute bits or replaced by a directory, a directory where the terminal keeps a
socket, a level of its runtime directory that is a link or a file, a file where the session's
``terminal/`` goes, a policy whose ``CTX_PATH`` no program can be given, an agent log that is no
regular file, a socket closed to the agent's uid, a watcher that stops reading, a storage root
moved while its terminal runs, a pid file others may write, a terminal killed before its
agent's uid was changed, a capability descriptor that is no socket or answers what no host
says — and what is checked is the documented exit status, the errno word of the
``ctx: ERRNO: …`` line (and of the ``--json`` error object, or the tool's native one), that
the message names the thing at fault and the way out, that no Python traceback leaks, and that
nothing is left half-done: no runtime directory, mount, process, session or log record of a
start that failed, and the terminal that runs left as it was by a refusal."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    alive,
    clean_env,
    ctx_run,
    new_scratch_dir,
    processes_of,
    read_jsonl,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, CoderHost, Raw, Term, coder_host
from tests.support.storage import copy_of_root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="an agent terminal is started by root")
needs_terminal = pytest.mark.skipif(
    shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs bubblewrap and /dev/fuse",
)

TOP = scratch_top(__file__)
RUN_BASE = Path("/run/cortexfs/terminal")  # docs/tools.md "the terminal socket"
MAX_VARIABLE = 131072  # the bytes the kernel passes a program in one variable
GONE_WORKSPACE = (
    "the current directory, the terminal's default /workspace, no longer exists: change to "
    "another, or give --workspace DIR or --no-workspace"
)


# ================================================================================ helpers


TOOLS = ("fs.read", "shell.exec")


@pytest.fixture(scope="session")
def coder_template(_template: Path) -> Iterator[CoderHost]:
    """Per test process: agent ``coder`` (uid ``nobody``) made once, allowed ``fs.read`` and
    ``shell.exec`` in both layers of P-6; each test works on a copy of its root."""
    with coder_host(_template, TOP, list(TOOLS), {}) as made:
        for tool in TOOLS:
            made.grant_in_tool(tool)
        yield made


@pytest.fixture
def host(coder_template: CoderHost) -> Iterator[CoderHost]:
    """A copy of the template's root, the agent's entry and mount control pointed at the copy
    (as for a root copied elsewhere), and a workspace of the agent's holding ``a.txt``.  The
    terminals it started are stopped at the end."""
    top = new_scratch_dir(TOP)
    storage = copy_of_root(coder_template.storage, top / "storage")
    for control in (storage / "agent" / "coder", storage / "agent" / "coder.d" / "mount"):
        control.write_text(control.read_text().replace(str(coder_template.storage), str(storage)))
    uid, gid = coder_template.uid, coder_template.gid
    ws = top / "ws"
    ws.mkdir(mode=0o755)
    (ws / "a.txt").write_text("data\n")
    (ws / "a.txt").chmod(0o644)
    os.chown(ws, uid, gid)
    made = CoderHost(top, storage, ws, uid, gid)
    try:
        yield made
    finally:
        for session in made.started:
            if made.ctx("agent", "stop", "coder", "--session", session).rc != 0:
                with contextlib.suppress(OSError, ValueError):
                    rundir = runtime_of(storage) / str(uid) / "coder" / session
                    os.kill(int((rundir / "pid").read_text()), signal.SIGTERM)
        shutil.rmtree(top, ignore_errors=True)


def new_session() -> str:
    return f"s{uuid.uuid4().hex[:10]}"


def root_key(storage: Path) -> str:
    """docs/tools.md: the first 16 hex digits of the SHA-256 of the root's real path."""
    return hashlib.sha256(os.fsencode(os.path.realpath(storage))).hexdigest()[:16]


def runtime_of(storage: Path) -> Path:
    """Where the terminals of ``storage`` keep their runtime directories."""
    return RUN_BASE / root_key(storage)


def alias_of(host: CoderHost, session: str) -> Path:
    """A-2's root-less place of the terminal socket of ``coder`` in ``session``."""
    return RUN_BASE / str(host.uid) / "coder" / session / "main.sock"


def mounts_under(top: Path) -> list[str]:
    with open("/proc/self/mountinfo") as table:
        return [line.split()[4] for line in table if line.split()[4].startswith(f"{top}/")]


def tree(top: Path) -> list[str]:
    """Every path below ``top`` (links not followed), ``top`` missing: none."""
    if not os.path.lexists(top):
        return []
    return sorted(str(p.relative_to(top)) for p in top.rglob("*"))


def shallow(rundir: Path) -> dict[str, list[str]]:
    """What a runtime directory and its ``private/`` hold (the view mounted there not read)."""
    return {name: sorted(os.listdir(rundir / name)) for name in (".", "private")}


def nothing_left(host: CoderHost, session: str, runtime_before: list[str] | None = None) -> None:
    """No runtime directory (or only what was there before), no mount, no process of the root's
    and no record of ``session`` in the agent's log."""
    runtime = runtime_of(host.storage)
    assert tree(runtime) == (runtime_before or []), tree(runtime)
    assert mounts_under(runtime) == []
    assert not os.path.lexists(alias_of(host, session).parent)
    assert processes_of(host.storage) == []
    assert host.lifecycle(session) == [], host.lifecycle(session)


def refused(run: Run, word: str, status: int = 1, prog: str = "ctx") -> str:
    """The message of the one ``PROG: WORD: …`` line of a refusal, checked for the status and
    the absence of a traceback."""
    assert run.rc == status, run
    assert "Traceback" not in run.err, run
    said = [line for line in run.err.splitlines() if line.startswith(f"{prog}: {word}: ")]
    assert len(said) == 1, run
    return said[0].removeprefix(f"{prog}: {word}: ")


def refused_json(run: Run, word: str, status: int = 1, prog: str = "ctx") -> str:
    """As :func:`refused`, with ``--json``: the error object on stdout says the same."""
    message = refused(run, word, status, prog)
    assert run.json() == {"error": word, "errno": getattr(errno, word), "message": message}, run
    return message


def ctxterm(host: CoderHost, *args: str, timeout: float = 60) -> Run:
    """``bin/ctxterm ARGS`` of the host's root, run in its workspace."""
    program = str(host.storage / "bin" / "ctxterm")
    done = subprocess.run([program, *args], capture_output=True, env=host.env, cwd=host.ws,
                          timeout=timeout)  # fmt: skip
    return Run(["ctxterm", *args], done.returncode, done.stdout.decode("utf-8", "replace"),
               done.stderr.decode("utf-8", "replace"))  # fmt: skip


def start_with(front: str, host: CoderHost, session: str) -> tuple[Run, str, str]:
    """A start by ``front`` (``ctx``: ``ctx agent start --json``, ``ctxterm``: ``bin/ctxterm
    --json``): the run, the program that speaks and the prefix of a failure of the started
    terminal (``ctx agent start`` hears it from the daemon it forked)."""
    if front == "ctx":
        run = host.ctx("agent", "start", "coder", "--session", session, "--json", cwd=host.ws)
        return run, "ctx", "the terminal did not start: "
    return ctxterm(host, "coder", "--session", session, "--json"), "ctxterm", ""


def ctxterm_pid(term: Term) -> int:
    return int((term.rundir / "pid").read_text())


def as_agent(host: CoderHost, *args: str, timeout: float = 30) -> Run:
    """``ctx ARGS`` run as the agent's uid and gid, no other group."""
    done = subprocess.run([*CTX_ARGV, *args], capture_output=True, env=host.env, cwd="/",
                          user=host.uid, group=host.gid, extra_groups=[],
                          timeout=timeout)  # fmt: skip
    return Run(list(args), done.returncode, done.stdout.decode("utf-8", "replace"),
               done.stderr.decode("utf-8", "replace"))  # fmt: skip


# ============================================================ starts refused before they run


@pytest.mark.parametrize(
    ("program", "mode"),
    [
        pytest.param("ctx", "--json", id="ctx-agent-start-json"),
        pytest.param("ctx", None, id="ctx-agent-start-text"),
        pytest.param("ctxterm", "--json", id="bin-ctxterm-json"),
    ],
)
def test_a_start_from_a_directory_removed_under_the_shell_is_enoent_and_makes_nothing(
    host, program, mode
):
    """A-1 (the caller's current directory is mounted at ``/workspace`` by default): a start
    run from a directory that was removed under the shell has no default workspace —
    ``ENOENT``, exit 1, saying the current directory no longer exists and naming
    ``--workspace DIR`` and ``--no-workspace`` as the ways out; ``bin/ctxterm`` refuses in its
    own name.  Nothing is made: no session, no runtime directory, no log record."""
    session = new_session()
    gone = host.top / "gone"
    gone.mkdir()
    if program == "ctx":
        argv = [*CTX_ARGV, "agent", "start", "coder", "--session", session]
    else:
        argv = [str(host.storage / "bin" / "ctxterm"), "coder", "--session", session]
    argv += [mode] if mode else []
    before = snapshot(host.storage)
    done = subprocess.run(
        ["/bin/sh", "-c", 'cd "$1" && rmdir "$1" && shift && exec "$@"', "sh", str(gone), *argv],
        capture_output=True, env=host.env, timeout=60,
    )  # fmt: skip
    run = Run(argv, done.returncode, done.stdout.decode(), done.stderr.decode())
    assert not gone.exists()
    if mode:
        assert refused_json(run, "ENOENT", 1, program) == GONE_WORKSPACE
    else:
        assert refused(run, "ENOENT", 1, program) == GONE_WORKSPACE and run.out == "", run
    assert snapshot(host.storage) == before
    nothing_left(host, session)


@needs_terminal
@pytest.mark.parametrize("damage", ["removed", "mode-0644"])
def test_a_bin_tsh_that_cannot_be_executed_is_named_with_ctx_bootstrap_as_the_way_out(host, damage):
    """R-5 (``ctx bootstrap`` repairs a root), A-1, H-1 (``ctxterm`` starts ``/ctx/bin/tsh``):
    a root whose ``bin/tsh`` was removed, or lost its execute bits, cannot start a terminal —
    ``ctx agent start`` and ``bin/ctxterm`` refuse before anything runs, exit 1, naming
    ``bin/tsh`` and ``ctx bootstrap``; nothing is made.  The way out works: after ``ctx
    bootstrap`` the start of the root whose ``bin/tsh`` was removed succeeds."""
    tsh = host.storage / "bin" / "tsh"
    if damage == "removed":
        tsh.unlink()
    else:
        tsh.chmod(0o644)
    session = new_session()
    before = snapshot(host.storage)
    for front in ("ctx", "ctxterm"):
        run, prog, _ = start_with(front, host, session)
        message = refused_json(run, "EINVAL", 1, prog)
        assert message.startswith(f"{tsh} ") and message.endswith("; run 'ctx bootstrap'"), run
        shape = "is missing" if damage == "removed" else "is not executable"
        assert message == f"{tsh} {shape}; run 'ctx bootstrap'", run
    assert snapshot(host.storage) == before
    nothing_left(host, session)
    if damage != "removed":
        return
    repaired = host.ctx("bootstrap")
    assert repaired.rc == 0, repaired
    assert os.access(tsh, os.X_OK) and tsh.is_file()
    host.stop(host.start(session).session)


@needs_terminal
def test_a_directory_at_bin_tsh_fails_the_start_with_what_the_sandbox_said(host):
    """docs/tools.md "The agent terminal" (a sandbox that ends before tsh runs fails the start
    with what it said and its errno, exit 1, with nothing left running or mounted and no
    ``terminal.started`` logged): a directory at ``bin/tsh`` passes for executable to root,
    but the sandbox cannot run it — ``EACCES``, naming ``/ctx/bin/tsh``; no session, runtime
    directory, mount or process is left."""
    tsh = host.storage / "bin" / "tsh"
    tsh.unlink()
    tsh.mkdir()
    session = new_session()
    homes = snapshot(host.storage / "home")
    run = host.ctx("agent", "start", "coder", "--session", session, "--json", cwd=host.ws)
    message = refused_json(run, "EACCES")
    assert message.startswith(
        "the terminal did not start: the sandbox of coder ended before tsh ran (exit "
    ), run
    assert "/ctx/bin/tsh" in message, run
    assert snapshot(host.storage / "home") == homes
    nothing_left(host, session)


def plant_runtime(host: CoderHost, *parts: str) -> Path:
    """``RUN_BASE/<root key>/PARTS``, each level made here a 0711 directory of root's, as a
    terminal's start makes them."""
    RUN_BASE.mkdir(mode=0o711, parents=True, exist_ok=True)
    level = runtime_of(host.storage)
    level.mkdir(mode=0o711, exist_ok=True)
    level.chmod(0o711)
    for part in parts:
        level = level / part
        level.mkdir(mode=0o711, exist_ok=True)
        level.chmod(0o711)
    return level


@contextlib.contextmanager
def planted_runtime(host: CoderHost) -> Iterator[None]:
    """The runtime directories of the host's root are removed at the end (nothing mounted in
    them: checked first)."""
    try:
        yield
    finally:
        runtime = runtime_of(host.storage)
        assert mounts_under(runtime) == []
        shutil.rmtree(runtime, ignore_errors=True)


@pytest.mark.parametrize(
    ("place", "role"),
    [
        pytest.param("main.sock", "socket", id="terminal-socket"),
        pytest.param("private/run.sock", "run socket", id="run-socket"),
    ],
)
def test_a_directory_where_the_terminal_keeps_a_socket_is_eisdir_to_start_and_stop(
    host, place, role
):
    """docs/tools.md "The agent terminal": "A directory where the socket or the pid file
    belongs, which only root can put there, is never removed unseen: ``start`` and ``stop``
    refuse with ``EISDIR``, naming it, until it is removed."  For the terminal socket and the
    run socket alike: exit 1, the path, what it is kept for and ``rmdir`` as the way out; the
    directory and what it holds stay, and nothing is started, made or logged."""
    session = new_session()
    with planted_runtime(host):
        rundir = plant_runtime(host, str(host.uid), "coder", session)
        (rundir / place).mkdir(parents=True)
        (rundir / place / "kept.txt").write_text("root's own\n")
        planted = tree(runtime_of(host.storage))
        homes = snapshot(host.storage / "home")
        said = (
            f"{rundir / place} is a directory, where the terminal of coder in session {session} "
            f"keeps its {role}; no terminal makes one, so look at what it holds, remove it "
            f"(rmdir {rundir / place}) and try again"
        )
        for verb in ("start", "stop"):
            run = host.ctx("agent", verb, "coder", "--session", session, "--json", cwd=host.ws)
            assert refused_json(run, "EISDIR") == said, (verb, run)
            assert tree(runtime_of(host.storage)) == planted, verb
        assert (rundir / place / "kept.txt").read_text() == "root's own\n"
        assert snapshot(host.storage / "home") == homes
        nothing_left(host, session, planted)


@pytest.mark.parametrize("kind", ["symbolic-link", "regular-file"])
def test_a_runtime_level_that_is_a_link_or_a_file_is_eperm_to_start_naming_it(host, kind):
    """docs/tools.md "The agent terminal": a level of the runtime directories that is not
    root's directory ("or a link") "is never used as it is … ``ctx agent start`` refuses with
    ``EPERM`` naming it".  The agent's level made a symbolic link (to an empty directory of
    root's) or a regular file: the start is ``EPERM`` naming the level, what it is and that
    root removes it, exit 1; nothing is made through the link, and nothing is started.  A stop
    finds no terminal there (``ENOENT`` through the link, ``ENOTDIR`` past the file)."""
    session = new_session()
    elsewhere = host.top / "elsewhere"
    elsewhere.mkdir()
    with planted_runtime(host):
        level = plant_runtime(host, str(host.uid)) / "coder"
        if kind == "symbolic-link":
            level.symlink_to(elsewhere)
            what, stop_errno = "a symbolic link", "ENOENT"
        else:
            level.write_text("not a directory\n")
            what, stop_errno = "not a directory", "ENOTDIR"
        planted = tree(runtime_of(host.storage))
        homes = snapshot(host.storage / "home")
        start = host.ctx("agent", "start", "coder", "--session", session, "--json", cwd=host.ws)
        assert refused_json(start, "EPERM") == (
            f"{level} is {what}, not uid 0's directory: whoever owns it could replace the "
            "terminal's pid file and sockets below it; have root remove it, and start the "
            "terminal again"
        ), start
        stop = host.ctx("agent", "stop", "coder", "--session", session, "--json")
        refused_json(stop, stop_errno)
        assert tree(runtime_of(host.storage)) == planted
        assert os.listdir(elsewhere) == []
        assert snapshot(host.storage / "home") == homes
        nothing_left(host, session, planted)


def plant_in_place_of_terminal_directory(host: CoderHost, session: str, kind: str) -> Path:
    """The agent's uid makes ``session`` in its home (each level as a start makes it: its own,
    0755 for the home, 0700 below) and puts a regular file or a FIFO where the session's
    ``terminal/`` goes."""
    path = host.storage / "home"
    for part, mode in ((str(host.uid), 0o755), ("agent", 0o700), ("coder", 0o700),
                       ("session", 0o700), (session, 0o700)):  # fmt: skip
        path = path / part
        if not path.exists():
            path.mkdir(mode=mode)
            path.chmod(mode)
            os.chown(path, host.uid, host.gid)
    place = path / "terminal"
    if kind == "regular-file":
        place.write_text("the agent's own\n")
    else:
        os.mkfifo(place, 0o644)
    os.chown(place, host.uid, host.gid, follow_symlinks=False)
    return place


@needs_terminal
@pytest.mark.parametrize("front", ["ctx", "ctxterm"])
@pytest.mark.parametrize(
    ("kind", "what"),
    [pytest.param("regular-file", "a regular file", id="file"),
     pytest.param("fifo", "a FIFO", id="fifo")],
)  # fmt: skip
def test_a_file_where_the_sessions_terminal_directory_goes_is_enotdir_and_stays(
    host, front, kind, what
):
    """A-2 (the session's ``terminal/main.sock`` is the socket's link), docs/tools.md (the
    session is the agent's uid's; nothing of the terminal is put through what it planted): a
    regular file or a FIFO of the agent's uid where the session's ``terminal/`` directory
    goes fails the start — ``ctx agent start`` and ``bin/ctxterm`` alike — with ``ENOTDIR``,
    exit 1, naming the path, what is there, whose it is and what to do.  The file is left as
    it was, the session holds what it held, and no runtime directory, mount, process or
    ``terminal.started`` is left."""
    session = new_session()
    place = plant_in_place_of_terminal_directory(host, session, kind)
    session_before = snapshot(host.session_dir(session))
    run, prog, prefix = start_with(front, host, session)
    assert refused_json(run, "ENOTDIR", 1, prog) == (
        f"{prefix}{place} is {what} of uid {host.uid}, not the directory that holds the "
        "terminal socket's link: remove it and start the terminal again"
    ), run
    assert snapshot(host.session_dir(session)) == session_before
    nothing_left(host, session)


@needs_terminal
@pytest.mark.parametrize("front", ["ctx", "ctxterm"])
def test_a_ctx_path_no_program_can_be_given_is_e2big_naming_the_policy(host, front):
    """H-1, T-4 (tsh gets the runtime's ``CTX_PATH``, derived from the policy): a policy that
    lets the agent read 2000 spaces of long names makes a ``CTX_PATH`` over the 131072 bytes
    the kernel passes a program in one variable.  The start fails with ``E2BIG``, exit 1,
    giving its size (the ``ctx_path`` ``ctx agent show`` derives), the limit, the count of
    spaces and the file to remove grants from; nothing is left."""
    with (host.storage / "agent" / "coder.d" / "policy").open("a") as policy:
        for number in range(2000):
            policy.write(f"allow coder_t shared:s{number:04d}{'x' * 59} read\n")
    shown = host.ctx("agent", "show", "coder", "--json")
    assert shown.rc == 0, shown
    size = len(os.fsencode("CTX_PATH=" + shown.json()["ctx_path"]))
    assert size > MAX_VARIABLE
    session = new_session()
    homes = snapshot(host.storage / "home")
    run, prog, prefix = start_with(front, host, session)
    assert refused_json(run, "E2BIG", 1, prog) == (
        f"{prefix}agent coder's CTX_PATH is {size} bytes, more than the {MAX_VARIABLE} the kernel "
        "passes a program in one variable; it lists /ctx/shared/<space>/tool for each of the "
        "2000 spaces its policy lets it read (shared:<space> read, 2000 of them spaces that do "
        "not exist): remove from agent/coder.d/policy the grants it does not need"
    ), run
    assert snapshot(host.storage / "home") == homes
    nothing_left(host, session)


@needs_terminal
@pytest.mark.parametrize("kind", ["directory", "fifo", "symbolic-link"])
def test_an_agent_log_that_is_no_regular_file_fails_the_start_and_leaves_nothing(host, kind):
    """S-3, S-5 (the agent's log is appended to as an events file is; a start is recorded
    there as ``terminal.started``): a log that is a directory, a FIFO or a symbolic link (to a
    file elsewhere) cannot be appended to, and the start fails with ``EINVAL`` naming it,
    exit 1 — never a start left unrecorded, never a write through the link.  Nothing is left:
    no session, runtime directory, mount or process."""
    log = host.storage / "agent" / "coder.d" / "log"
    log.unlink()
    target = host.top / "elsewhere.log"
    if kind == "directory":
        log.mkdir(mode=0o750)
    elif kind == "fifo":
        os.mkfifo(log, 0o640)
    else:
        target.write_text("")
        log.symlink_to(target)
    session = new_session()
    homes = snapshot(host.storage / "home")
    run = host.ctx("agent", "start", "coder", "--session", session, "--json", cwd=host.ws)
    assert refused_json(run, "EINVAL") == (
        f"the terminal did not start: {log} is not a regular file; refusing to append to it"
    ), run
    assert snapshot(host.storage / "home") == homes
    assert not target.exists() or target.read_text() == ""
    runtime = runtime_of(host.storage)
    assert tree(runtime) == [] and mounts_under(runtime) == []
    assert processes_of(host.storage) == []


# ======================================================================== a running terminal


@needs_terminal
def test_a_log_that_cannot_be_written_does_not_keep_the_terminal_from_stopping(host):
    """docs/tools.md "The agent terminal" (on ``ctx agent stop`` the terminal records
    ``terminal.stopped``, then unmounts its view and removes its sockets), and the terminal's
    rule that a log it cannot write does not keep it from ending: the agent's log replaced
    by a directory while the terminal runs, ``ctx agent stop`` still ends it, exit 0, with
    the usual line, and nothing of it is left."""
    term = host.start()
    pid = ctxterm_pid(term)
    log = host.storage / "agent" / "coder.d" / "log"
    log.unlink()
    log.mkdir(mode=0o750)
    stopped = host.ctx("agent", "stop", "coder", "--session", term.session)
    host.started.remove(term.session)
    assert (stopped.rc, stopped.out) == (0, f"stopped coder, session {term.session} (pid {pid})\n")
    assert wait_for(lambda: not alive(pid), 10)
    assert not term.rundir.exists() and not os.path.lexists(term.link)
    assert mounts_under(runtime_of(host.storage)) == []
    assert os.listdir(log) == []


@needs_terminal
def test_a_terminal_socket_closed_to_the_agents_uid_is_eacces_for_its_watch(host):
    """docs/tools.md "The terminal socket" (the agent's own uid may watch; a socket ctx
    cannot reach is ``EACCES``): a terminal socket whose mode leaves the agent's uid out (as
    a terminal of an older ctx kept it root's) is refused to ``ctx agent watch`` run as that
    uid with ``EACCES``, exit 1, naming the socket, the session and the uid, and what to do;
    the terminal goes on serving root's clients as before."""
    term = host.start()
    pid = ctxterm_pid(term)
    os.chmod(term.listening_at, 0o600)
    watched = as_agent(host, "agent", "watch", "coder", "--session", term.session)
    assert refused(watched, "EACCES") == (
        f"the terminal socket {term.listening_at} of coder, session {term.session}, is not "
        f"open to uid {host.uid} (Permission denied); a terminal started by an older ctx keeps "
        "it root's: restart it, or watch as root"
    ), watched
    assert watched.out == "", watched
    watcher = Raw(term.listening_at, b"watch\n")
    try:
        assert watcher.shows(AGENT_PROMPT), watcher.text()
    finally:
        watcher.close()
    assert alive(pid)


@needs_terminal
def test_a_watcher_whose_output_is_not_read_is_let_go_with_econnaborted(host):
    """docs/tools.md "The terminal socket": the terminal never waits for a client; one that
    takes none of its output for two seconds, or falls more than 1 MiB behind, is closed while
    the others go on, and "``ctx agent watch`` … so closed says so, ``ECONNABORTED``, exit 1:
    what it showed is cut short".  A ``ctx agent watch`` whose standard output nobody reads
    while 2 MB are printed ends so, with what it showed cut short; the attached client and
    the terminal go on."""
    term = host.start()
    pid = ctxterm_pid(term)
    typist = Raw(term.listening_at, b"attach\n")
    watcher = subprocess.Popen(
        [*CTX_ARGV, "agent", "watch", "coder", "--session", term.session],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=host.env,
    )  # fmt: skip
    try:
        assert typist.shows(AGENT_PROMPT), typist.text()
        seen = b""
        deadline = time.monotonic() + 20
        while AGENT_PROMPT.encode() not in seen and time.monotonic() < deadline:
            if select.select([watcher.stdout], [], [], 0.2)[0]:
                seen += os.read(watcher.stdout.fileno(), 4096)
        assert AGENT_PROMPT.encode() in seen, seen  # it watches, and is read no more
        typist.type("shell.exec 'yes | head -c 2000000'")
        assert typist.shows(AGENT_PROMPT, 2, 60), typist.text()[-300:]
        out, err = watcher.communicate(timeout=30)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
        typist.close()
    assert watcher.returncode == 1, err
    lines = err.decode().strip().splitlines()
    assert lines[-1] == (
        f"ctx: ECONNABORTED: the terminal of coder in session {term.session} still runs, but "
        "let this client go: it took none of the output for 2 s, or fell more than 1 MiB "
        "behind it; what it shows is cut short: watch again"
    ), err
    assert "Traceback" not in err.decode()
    shown = seen + out
    assert 0 < shown.count(b"y\r\n") < 1000000, len(shown)
    assert typist.count("y\r\n") == 1000000
    assert alive(pid) and term.listening_at.exists()


@contextlib.contextmanager
def moved_root(host: CoderHost) -> Iterator[Path]:
    """The host's storage root renamed for the block (its terminal keeps running), and put back
    where it was at the end."""
    moved = host.top / "moved"
    os.rename(host.storage, moved)
    try:
        yield moved
    finally:
        os.rename(moved, host.storage)


@needs_terminal
def test_a_stop_on_the_path_a_root_was_moved_to_is_ebusy_and_leaves_the_terminal(host):
    """docs/tools.md "A terminal that was killed": "A terminal started before its storage root
    was moved … is not this path's: a stop on the new path leaves its link alone and is
    ``EBUSY``, saying it still runs and that it is stopped on the path it was started on."
    The stop names the place it answers at and the way out, exit 1; the terminal runs on, its
    link and its log are as they were; once the root is back, the stop ends it."""
    term = host.start()
    pid = ctxterm_pid(term)
    alias = alias_of(host, term.session)
    with moved_root(host) as moved:
        link = moved / term.link.relative_to(host.storage)
        log = moved / "agent" / "coder.d" / "log"
        log_before = log.read_bytes()
        stop = ctx_run("agent", "stop", "coder", "--session", term.session, "--json",
                       env=clean_env(CTX_STORAGE=str(moved)))  # fmt: skip
        assert refused_json(stop, "EBUSY") == (
            f"the terminal of coder in session {term.session} still runs (it answers at "
            f"{alias}), but it was started when the storage root {moved} was reached by another "
            "path: move the root back to where it was, stop the terminal there, then move the "
            "root again"
        ), stop
        assert alive(pid) and os.readlink(link) == str(alias)
        assert log.read_bytes() == log_before
    host.stop(term.session)
    assert wait_for(lambda: not alive(pid), 10)


@needs_terminal
def test_a_start_on_the_path_a_root_was_moved_to_leaves_the_running_terminal_alone(host):
    """docs/tools.md: "One terminal per agent and session of a storage root (``EEXIST``)";
    "the cleanup never touches a live terminal's view, process or sockets"; a terminal started
    before its root was moved is stopped on the path it was started on, its link left alone.
    A start on the new path while the first terminal runs must be refused (exit 1), leave the
    session's link leading to the running terminal, and log no end of it."""
    term = host.start()
    pid = ctxterm_pid(term)
    alias = alias_of(host, term.session)
    second: Run | None = None
    with moved_root(host) as moved:
        env = clean_env(CTX_STORAGE=str(moved))
        link = moved / term.link.relative_to(host.storage)
        try:
            second = ctx_run("agent", "start", "coder", "--session", term.session, "--json",
                             env=env, cwd=host.ws)  # fmt: skip
            log = read_jsonl(moved / "agent" / "coder.d" / "log")
            ends = [e for e in log if e.get("session") == term.session
                    and e["type"] == "terminal.stopped"]  # fmt: skip
            assert alive(pid)
            assert second.rc == 1 and second.json()["error"] in ("EEXIST", "EBUSY"), second
            assert os.readlink(link) == str(alias)
            assert ends == [], ends
        finally:
            if second is not None and second.rc == 0:
                ctx_run("agent", "stop", "coder", "--session", term.session, env=env)
    host.stop(term.session)


@needs_terminal
@pytest.mark.parametrize("loosened", ["writable-by-others", "owned-by-the-agent"])
def test_a_pid_file_that_others_may_write_still_lets_show_and_stop_find_the_terminal(
    host, loosened
):
    """docs/tools.md "The terminal socket": "a pid file that others may write (or not root's)
    is never signalled, nor is its pid unless that process holds the terminal's directory
    open"; ``ctx agent show`` lists "the agent's terminals that run".  The pid file of a
    running terminal made writable by others, or given to the agent's uid: ``ctx agent show``
    still lists the terminal (ctxterm holds its directory open) and ``ctx agent stop`` ends
    it promptly, exit 0."""
    term = host.start()
    pid_file = term.rundir / "pid"
    pid = int(pid_file.read_text())
    if loosened == "writable-by-others":
        pid_file.chmod(0o666)
    else:
        os.chown(pid_file, host.uid, host.gid)
    try:
        shown = host.ctx("agent", "show", "coder", "--json")
        assert shown.rc == 0, shown
        assert shown.json()["terminals"] == [
            {"session": term.session, "uid": host.uid, "pid": pid}
        ], shown.json()["terminals"]
        try:
            stopped = host.ctx("agent", "stop", "coder", "--session", term.session, timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("ctx agent stop did not end the terminal within 10 s")
        assert stopped.rc == 0 and f"(pid {pid})" in stopped.out, stopped
        host.started.remove(term.session)
    finally:
        if pid_file.exists():  # a terminal that stopped took its directory with it
            pid_file.chmod(0o644)
            os.chown(pid_file, 0, 0)


@needs_terminal
def test_a_killed_terminal_of_an_agent_given_another_uid_is_eexist_until_stop_cleans_up(host):
    """A-1, A-2, docs/tools.md ("A terminal that was killed": its next ``stop`` cleans up after
    it, saying so, and the agent's log tells that it ended): a terminal killed (``kill -9``)
    before the agent's identity was given another uid leaves its view mounted under the old
    uid.  A start is then ``EEXIST``, exit 1, naming both uids and ``ctx agent stop`` as the
    way out, and makes nothing under the new uid; the stop cleans up after the dead terminal
    (exit 0, ``"running": false``, its pid, its view unmounted) and the log records its end
    as ``lost``."""
    term = host.start()
    pid = ctxterm_pid(term)
    os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not alive(pid), 10)
    view = term.rundir / "private" / "ctx"
    assert str(view) in mounts_under(runtime_of(host.storage))
    identity = host.storage / "agent" / "coder.d" / "identity"
    original = identity.read_text()
    other = host.uid - 1
    identity.write_text(json.dumps({**json.loads(original), "uid": other}))
    try:
        left = shallow(term.rundir)
        start = host.ctx("agent", "start", "coder", "--session", term.session, "--json",
                         cwd=host.ws)  # fmt: skip
        assert refused_json(start, "EEXIST") == (
            f"the terminal of coder in session {term.session} was started as uid {host.uid}, "
            f"before agent/coder.d/identity changed to uid {other}, and was not stopped: end it "
            f"with 'ctx agent stop coder --session {term.session}', then start it again"
        ), start
        assert shallow(term.rundir) == left
        assert not (runtime_of(host.storage) / str(other)).exists()
        assert not (host.storage / "home" / str(other)).exists()
        stop = host.ctx("agent", "stop", "coder", "--session", term.session, "--json")
        assert stop.rc == 0, stop
        facts = stop.json()
        assert (facts["pid"], facts["running"]) == (pid, False), facts
        assert f"unmounted its view at {view}" in facts["cleaned"], facts
        host.started.remove(term.session)
    finally:
        identity.write_text(original)
    assert not term.rundir.exists() and mounts_under(runtime_of(host.storage)) == []
    ends = [e for e in host.lifecycle(term.session) if e["type"] == "terminal.stopped"]
    assert [(e["reason"], e["pid"]) for e in ends] == [("lost", pid)], ends


# ================================================================ the run capability by hand


def run_update(storage: Path, mode: str, capability: int, stdin: int | None = None) -> Run:
    """``tool/agent.update`` of a harmless prompt, run by a person in ``mode`` with
    ``CTX_RUN_CAPABILITY`` naming descriptor ``capability`` (passed down to it)."""
    data = json.dumps({"control": "system.md", "content": "be brief"})
    program = str(storage / "tool" / "agent.update")
    env = clean_env(CTX_MODE=mode, CTX_RUN_CAPABILITY=str(capability))
    done = subprocess.run([program, data], env=env, timeout=30,
                          pass_fds=(capability,) if capability > 2 else (),
                          stdin=subprocess.DEVNULL if stdin is None else stdin,
                          capture_output=True)  # fmt: skip
    return Run([program, data], done.returncode, done.stdout.decode("utf-8", "replace"),
               done.stderr.decode("utf-8", "replace"))  # fmt: skip


def one_line_failure(run: Run, tool: str, word: str, message: str, mode: str) -> None:
    assert run.rc == 1, run
    assert run.err == f"{tool}: {word}: {message}\n", run
    if mode == "native":
        assert json.loads(run.out) == {
            "error": word,
            "errno": getattr(errno, word),
            "message": message,
        }, run
    else:
        assert run.out == "", run


@pytest.mark.parametrize(
    ("capability", "word", "message"),
    [
        pytest.param("devnull", "ENOTSOCK", "Socket operation on non-socket", id="dev-null"),
        pytest.param("pipe", "ENOTSOCK", "Socket operation on non-socket", id="a-pipe"),
        pytest.param("closed-peer", "EIO", "the host gave no answer", id="no-host-at-the-end"),
    ],
)
def test_a_capability_that_is_no_socket_or_has_no_host_fails_in_one_line(
    storage, capability, word, message
):
    """A-5, docs/tools.md (the run capability: a capability that answers nothing fails the
    call with ``EIO``; a failure is ``<tool>: <ERRNO>: <sentence>`` on stderr, and the
    ``{"error", "errno", "message"}`` object on stdout in native mode, exit 1): run by a
    person, ``agent.update`` whose ``CTX_RUN_CAPABILITY`` names a descriptor that is no socket
    (``/dev/null`` on its stdin, a pipe), or a socket whose other end is closed, fails in
    one line with that errno, and the prompt is as it was."""
    prompt = storage / "agent"  # no agent at all: nothing could be written for one
    before = snapshot(prompt)
    for mode in ("terminal", "native"):
        with contextlib.ExitStack() as stack:
            if capability == "devnull":
                run = run_update(storage, mode, 0, stdin=subprocess.DEVNULL)
            elif capability == "pipe":
                reader, writer = os.pipe()
                stack.callback(os.close, reader)
                stack.callback(os.close, writer)
                os.set_inheritable(reader, True)
                run = run_update(storage, mode, reader)
            else:
                ours, theirs = socket.socketpair()
                stack.callback(theirs.close)
                ours.close()
                os.set_inheritable(theirs.fileno(), True)
                run = run_update(storage, mode, theirs.fileno())
        one_line_failure(run, "agent.update", word, message, mode)
    assert snapshot(prompt) == before


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b"not json\n", id="not-JSON"),
        pytest.param(b"[]\n", id="an-array"),
        pytest.param(b'{"ok": false, "errno": 13, "message": ["no"]}\n', id="message-a-list"),
        pytest.param(b'{"ok": true}\n', id="ok-without-its-facts"),
        pytest.param(b'{"ok": false, "errno": "EACCES", "message": "no"}\n', id="errno-a-word"),
    ],
)
def test_a_capability_answering_what_no_host_says_is_one_line_not_a_traceback(storage, answer):
    """docs/tools.md "The core tools" (a failure prints ``<tool>: <ERRNO>: <sentence>`` on
    stderr, and in native mode the error object on stdout, exit 1) and the run capability
    (one request line, one JSON answer line): ``agent.update`` run by a person with a socket
    of their own as its capability, whose other end answers something the host never says,
    fails in one line with a real errno word, in terminal and native modes alike, after
    asking exactly its one request."""
    for mode in ("terminal", "native"):
        ours, theirs = socket.socketpair()
        with ours, theirs:
            os.set_inheritable(theirs.fileno(), True)
            ours.sendall(answer)
            run = run_update(storage, mode, theirs.fileno())
            ours.setblocking(False)
            asked = ours.recv(65536)
        assert json.loads(asked) == {"op": "agent.update", "control": "system.md",
                                     "content": "be brief"}  # fmt: skip
        assert run.rc == 1 and "Traceback" not in run.err, run
        said = re.fullmatch(r"agent\.update: (E[A-Z0-9]+): [^\n]+\n", run.err)
        assert said and said.group(1) in errno.errorcode.values(), run
        if mode == "native":
            assert json.loads(run.out)["error"] == said.group(1), run
        else:
            assert run.out == "", run
