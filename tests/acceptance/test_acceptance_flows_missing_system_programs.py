"""A host that lacks a system program or facility CortexFS relies on (SPEC R-1, R-5, P-4,
I-4, §7 H-1, §8 A-1/A-2, §10 M-1/M-4, §13 F-1; README quickstart and "as another user";
scripts/install's package list; docs/tools.md, docs/mount.md, workers/README.md).

Each command runs with a ``PATH`` of links to every system program but one (setpriv, setsid,
unshare, bubblewrap, fusermount3, umount, strace, script, the C compiler, the shells,
python3, make), or in a private mount namespace where the program is gone from ``/usr/bin``
itself (an overlay whiteout), where ``/dev`` has no ``fuse``, or where ``/run`` or
``/run/cortexfs`` cannot be written; as an unprivileged user without access to ``/dev/fuse``
or with ``HOME``/``XDG_*`` unset or pointing at missing, read-only or non-directory places;
with ``TMPDIR`` missing or useless; with a locale that does not exist or ``LANG=C``; with the
FUSE extra not importable; with a tool's interpreter or an MCP server's program not
installed.  A command that needs the missing thing must fail with one ``ctx: ERRNO: …`` line
that names it (and what to install or set), a non-zero exit, no traceback, and nothing half
made: no session, runtime directory, mount, socket or process left; every command that does
not need it must do its work as usual."""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MOUNT_WAIT,
    REPO,
    QueueCLI,
    Run,
    alive,
    ctx_run,
    mounted_at,
    new_scratch_dir,
    processes_of,
    read_jsonl,
    request,
    scratch_top,
    serving,
    tool_manifest,
    wait_for,
)
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: agents run as nobody, a second user is switched to"
)

CTX = CTX_ARGV[0]
CTXMCP = str(Path(CTX).with_name("ctxmcp"))
SCRATCH = scratch_top(__file__)
SYSTEM_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
NOBODY = 65534
RUNTIME = Path("/run/cortexfs/terminal")
ERROR_LINE = re.compile(r"^(ctx|ctxmcp|[A-Za-z0-9._-]+): (E[A-Z0-9]+): \S")
# What the tests set up namespaces with: always by absolute path, whatever PATH the command
# under test is given.
UNSHARE, MOUNT, MKNOD, MKDIR, TOUCH, LN = (
    shutil.which(name) for name in ("unshare", "mount", "mknod", "mkdir", "touch", "ln")
)
SHELLS = ("sh", "bash", "dash", "rbash", "zsh*", "ksh*", "mksh*", "*csh", "busybox")


# ---------------------------------------------------------------- helpers


def env_of(path: str = PATH, **extra: str | None) -> dict[str, str]:
    """A small login-like environment: PATH, HOME=/root and a UTF-8 locale, plus ``extra``
    (a None value leaves that variable out)."""
    env = {"PATH": path, "HOME": "/root", "LANG": "C.UTF-8"}
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def the_error(run: Run, word: str, status: int = 1, program: str = "ctx") -> str:
    """The one ``PROGRAM: WORD: …`` line of ``run``'s stderr, which ended with ``status`` and
    printed no traceback."""
    assert run.rc == status, run
    assert "Traceback" not in run.err and "Traceback" not in run.out, run
    errors = [line for line in run.err.splitlines() if ERROR_LINE.match(line)]
    assert len(errors) == 1, run
    assert errors[0].startswith(f"{program}: {word}: "), run
    return errors[0]


def root_key(storage: Path) -> str:
    """docs/tools.md: the storage root's key in /run/cortexfs/terminal."""
    return hashlib.sha256(os.path.realpath(storage).encode()).hexdigest()[:16]


class Paths:
    """PATH values made of links to every program of the system directories but some."""

    def __init__(self, top: Path) -> None:
        self.top = top
        self.made: dict[tuple[str, ...], str] = {}

    def without(self, *patterns: str) -> str:
        """A PATH of one directory holding a link to each program of :data:`SYSTEM_DIRS`
        whose name matches none of ``patterns`` (fnmatch)."""
        key = tuple(sorted(patterns))
        if key not in self.made:
            directory = new_scratch_dir(self.top, "path-") / "bin"
            directory.mkdir(mode=0o755)
            directory.chmod(0o755)
            for system in SYSTEM_DIRS:
                with contextlib.suppress(FileNotFoundError):
                    for entry in os.scandir(system):
                        link = directory / entry.name
                        if any(fnmatch.fnmatch(entry.name, p) for p in patterns):
                            continue
                        if not os.path.lexists(link):
                            os.symlink(os.path.join(system, entry.name), link)
            self.made[key] = str(directory)
        return self.made[key]


@pytest.fixture(scope="module")
def paths() -> Iterator[Paths]:
    top = new_scratch_dir(SCRATCH, "paths-")
    yield Paths(top)
    shutil.rmtree(top, ignore_errors=True)


def in_namespace(
    setup: str,
    argv: list[str],
    env: dict[str, str],
    cwd: Path | None = None,
    input: str = "",
    timeout: float = 60,
) -> Run:
    """``argv`` run in a private mount namespace after the shell lines ``setup`` (absolute
    program paths only): what the test changes there is seen by nobody else."""
    if None in (UNSHARE, MOUNT, MKNOD):
        pytest.skip("needs unshare, mount and mknod")
    script = f'set -e\n{setup}\nexec "$@"'
    argv = [UNSHARE, "-m", "--propagation", "private", "/bin/sh", "-c", script, "sh", *argv]
    done = subprocess.run(
        argv, input=input.encode(), capture_output=True, env=env, cwd=cwd, timeout=timeout
    )
    return Run(
        argv[8:],
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


def hiding(top: Path, *names: str) -> str:
    """The setup line that makes each of ``names`` absent from ``/usr/bin`` (and so from
    ``/bin``, its link on a merged-/usr system): a read-only overlay whose upper layer holds a
    whiteout for each.  Skips where that cannot hide them."""
    if os.path.realpath("/bin") != "/usr/bin":
        pytest.skip("needs a merged /usr (/bin a link to /usr/bin)")
    for name in names:
        if not os.path.lexists(f"/usr/bin/{name}"):
            pytest.skip(f"/usr/bin/{name} is not installed here")
    whiteouts = new_scratch_dir(top, "whiteouts-")
    for name in names:
        os.mknod(whiteouts / name, stat.S_IFCHR | 0o600, os.makedev(0, 0))
    setup = f"{MOUNT} -t overlay cortexfs-test-hide -o lowerdir={whiteouts}:/usr/bin /usr/bin"
    probe_namespace(setup)
    return setup


def probe_namespace(setup: str) -> None:
    """Skip unless ``setup`` works in a private mount namespace here."""
    tried = in_namespace(setup, ["/bin/true"], env_of())
    if tried.rc != 0:
        pytest.skip(f"cannot set up the namespace here: {tried.err.strip()}")


@dataclass
class Host:
    """A bootstrapped storage root every uid may search, with agent ``coder`` (label
    ``coder_t``, uid nobody) granted fs.stat, fs.read and shell.exec and a workspace mounted
    read-write; root's ``ctx`` aimed at it."""

    storage: Path
    top: Path
    workspace: Path
    sessions: list[str] = field(default_factory=list)

    def env(self, path: str = PATH, **extra: str | None) -> dict[str, str]:
        return env_of(path, CTX_STORAGE=str(self.storage), **extra)

    def ctx(self, *args, path: str = PATH, cwd: Path | None = None, input: str = "", **extra):
        return ctx_run(*args, env=self.env(path, **extra), cwd=cwd or self.workspace, input=input)

    def session(self) -> str:
        name = f"s{uuid.uuid4().hex[:10]}"
        self.sessions.append(name)
        return name

    def session_dir(self, session: str, agent: str = "coder") -> Path:
        return self.storage / f"home/{NOBODY}/agent/{agent}/session/{session}"

    def runtime(self, session: str, agent: str = "coder") -> list[Path]:
        """The runtime places a terminal of ``agent`` in ``session`` of this root would use."""
        return [
            RUNTIME / root_key(self.storage) / str(NOBODY) / agent / session,
            RUNTIME / str(NOBODY) / agent / session,
        ]

    def started(self, session: str, agent: str = "coder") -> list[dict]:
        log = self.storage / "agent" / f"{agent}.d" / "log"
        return [
            e
            for e in read_jsonl(log)
            if e.get("type") == "terminal.started" and e.get("session") == session
        ]

    def assert_nothing_left(self, session: str) -> None:
        """No trace of a terminal of ``coder`` in ``session``: no session directory, no
        runtime directory, no terminal.started, no process naming the session."""
        assert not os.path.lexists(self.session_dir(session)), session
        for place in self.runtime(session):
            assert not os.path.lexists(place), place
        assert self.started(session) == []
        assert processes_of(Path(session)) == []

    def install(self, name: str, program: str, *agents: str) -> None:
        """A system-tier tool ``name`` running the text ``program``, granted to ``coder_t``
        in both policies (P-6)."""
        manifest = tool_manifest(self.top / "src", name, program)
        installed = self.ctx("object", "install", manifest, "--tier", "system")
        assert installed.rc == 0, installed
        self.allow("coder", "coder_t", name)

    def allow(self, agent: str, label: str, tool: str) -> None:
        line = f"allow {label} tool:{tool} execute\n"
        for policy in (
            self.storage / "tool" / f"{tool}.d" / "policy",
            self.storage / "agent" / f"{agent}.d" / "policy",
        ):
            if line not in policy.read_text():
                with policy.open("a") as held:
                    held.write(line)


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    """One per test process: what the tests add to it (jobs, tools, agents, sessions) has
    names of its own."""
    top = new_scratch_dir(SCRATCH, "host-")
    workspace = top / "ws"
    workspace.mkdir(mode=0o755)
    made = Host(top / "storage", top, workspace)
    for args in (("bootstrap",), ("queue", "init", "--project", "proj")):
        done = made.ctx(*args)
        assert done.rc == 0, done
    req = {
        "name": "coder",
        "label": "coder_t",
        "tools": ["fs.stat", "fs.read", "shell.exec"],
        "mount": [[str(workspace), "/workspace", "rw"]],
    }
    created = made.ctx("agent", "create", "-", "--json", input=json.dumps(req))
    assert created.rc == 0, created
    for tool in ("fs.stat", "fs.read", "shell.exec"):
        made.allow("coder", "coder_t", tool)
    try:
        yield made
    finally:
        for session in made.sessions:
            if processes_of(Path(session)):
                made.ctx("agent", "stop", "coder", "--session", session)
            for pid in processes_of(Path(session)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def here(host: Host) -> Path:
    """A directory of the test's own in the host's scratch directory."""
    return new_scratch_dir(host.top, "t-")


@pytest.fixture
def outbox() -> Iterator[Path]:
    """A directory every uid may write (a tool of nobody's leaves its pid there)."""
    path = new_scratch_dir(SCRATCH, "outbox-")
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass
class Desk:
    """The unprivileged test user with a storage root of their own (bootstrapped by them),
    agent ``coder`` that runs as them, and the queue of project ``proj``."""

    user: UnprivilegedUser
    top: Path
    home: Path
    storage: Path

    def env(self, path: str = PATH, **extra: str | None) -> dict[str, str]:
        return env_of(path, HOME=str(self.home), CTX_STORAGE=str(self.storage), **extra)

    def run(self, argv: list[str], env: dict[str, str], input: str = "", cwd=None) -> Run:
        done = subprocess.run(
            argv,
            input=input.encode(),
            capture_output=True,
            env=env,
            cwd=cwd or self.home,
            user=self.user.uid,
            group=self.user.gid,
            extra_groups=[],
            timeout=60,
        )
        return Run(
            argv[1:],
            done.returncode,
            done.stdout.decode("utf-8", "replace"),
            done.stderr.decode("utf-8", "replace"),
        )

    def ctx(self, *args, env: dict[str, str] | None = None, input: str = "", cwd=None) -> Run:
        return self.run([CTX, *map(str, args)], env or self.env(), input, cwd)

    def mine(self, path: Path, mode: int = 0o755) -> Path:
        path.mkdir(mode=mode, parents=True, exist_ok=True)
        path.chmod(mode)
        os.chown(path, self.user.uid, self.user.gid)
        return path


@pytest.fixture(scope="module")
def desk() -> Iterator[Desk]:
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH, "desk-")
    home = top / "home"
    made = Desk(user, top, home, home / "storage")
    made.mine(home, 0o700)
    made.mine(home / "ws")
    for args in (("bootstrap",), ("queue", "init", "--project", "proj")):
        done = made.ctx(*args)
        assert done.rc == 0, done
    req = {"name": "coder", "label": "coder_t", "tools": ["fs.stat"],
           "mount": [[str(home / "ws"), "/workspace", "rw"]]}  # fmt: skip
    created = made.ctx("agent", "create", "-", input=json.dumps(req))
    assert created.rc == 0, created
    with (made.storage / "tool" / "fs.stat.d" / "policy").open("a") as policy:
        policy.write("allow coder_t tool:fs.stat execute\n")
    yield made
    shutil.rmtree(top, ignore_errors=True)


# ---------------------------------------------------------------- one program missing from PATH

KEEP_WORKING = {
    "setpriv": ("setpriv",),
    "setsid": ("setsid",),
    "bubblewrap": ("bwrap",),
    "fusermount3": ("fusermount3", "fusermount"),
    "umount": ("umount", "mount"),
    "strace": ("strace",),
    "script": ("script", "scriptreplay", "scriptlive"),
    "cc": ("cc", "c89", "c99", "*gcc*", "*g++*", "c++", "cpp*", "clang*"),
    "shells": SHELLS,
    "python3": ("python*",),
    "make": ("make", "*make"),
}


@pytest.mark.parametrize("missing", sorted(KEEP_WORKING))
def test_commands_that_need_no_such_program_keep_working(
    host: Host, paths: Paths, missing: str
) -> None:
    """R-5, W-1, §2.4: with a program the queue, the worker and a tool call never need missing
    from PATH, each does its work as with the full system: a published shell.exec job runs as
    the agent (uid nobody) and is done, a terminal call of fs.stat prints its answer."""
    path = paths.without(*KEEP_WORKING[missing])
    queue = QueueCLI(host.storage, "proj")
    job = request("shell.exec", input={"cmd": "echo uid=$(id -u)"})
    published = host.ctx("queue", "publish", "--project", "proj", "-", path=path,
                         input=json.dumps(job))  # fmt: skip
    assert published.rc == 0, published
    name = published.out.strip()
    worked = host.ctx("queue", "work", "--project", "proj", "--agent", "coder", "--drain",
                      path=path)  # fmt: skip
    assert worked.rc == 0, worked
    state, result = queue.only_result(name)
    assert (state, result["output"]) == ("done", f"uid={NOBODY}\n"), result
    stat_call = host.ctx("run", "--agent", "coder", "fs.stat", "/workspace", path=path)
    assert stat_call.rc == 0 and "type: directory" in stat_call.out, stat_call


# ---------------------------------------------------------------- setpriv and setsid


def test_without_setpriv_a_tool_runs_as_the_agent_with_no_capability_and_no_network(
    host: Host, paths: Paths
) -> None:
    """docs/tools.md *Running a tool*: where setpriv is missing, the call still switches to
    the agent's uid, gid and groups, passes on no capability (inheritable, ambient,
    effective all empty) and, without network:default connect, runs in a network namespace
    holding only the loopback (P-4)."""
    path = paths.without("setpriv", "setsid")
    script = "id -u; id -g; id -G; grep -E '^Cap(Inh|Eff|Amb)' /proc/self/status; " \
             "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"  # fmt: skip
    ran = host.ctx("run", "--agent", "coder", "shell.exec", script, path=path)
    assert ran.rc == 0, ran
    lines = ran.out.splitlines()
    assert lines[:3] == [str(NOBODY), str(NOBODY), str(NOBODY)], ran
    capabilities = {line.split(":")[0]: line.split()[1] for line in lines[3:6]}
    assert capabilities == {"CapInh": "0" * 16, "CapEff": "0" * 16, "CapAmb": "0" * 16}, ran
    assert lines[6:] == ["lo"], ran


def test_without_setpriv_a_tool_dies_with_its_killed_caller(
    host: Host, paths: Paths, outbox: Path
) -> None:
    """I-4, docs/tools.md: no process of a call outlives the process that started it; where
    setpriv is missing the child sets the parent-death signal itself.  ``ctx run`` killed
    with SIGKILL while its tool sleeps: the tool (uid nobody) is gone soon after."""
    pid_file = outbox / "tool.pid"
    command = f"echo $$ > {pid_file}; exec sleep 60"
    proc = subprocess.Popen(
        [CTX, "run", "--agent", "coder", "shell.exec", command],
        env=host.env(paths.without("setpriv", "setsid")), cwd=host.workspace,
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 15)
        tool = int(pid_file.read_text())
        assert alive(tool) and os.stat(f"/proc/{tool}").st_uid == NOBODY
    finally:
        proc.kill()
        proc.wait()
    assert wait_for(lambda: not alive(tool), 5), f"tool {tool} outlived its caller"


def test_a_terminal_without_setpriv_on_the_system_fails_naming_it_and_leaves_nothing(
    host: Host,
) -> None:
    """A-1, H-1: the sandbox starts tsh through setpriv.  With setpriv gone from the system,
    ``ctx agent start`` fails with one ENOENT line naming setpriv, exit 1, and leaves no
    session, runtime directory, terminal.started or process; a tool call, which does without
    setpriv, still runs as the agent."""
    setup = hiding(host.top, "setpriv")
    session = host.session()
    start = in_namespace(setup, [CTX, "agent", "start", "coder", "--session", session],
                         host.env(), cwd=host.workspace)  # fmt: skip
    assert "setpriv" in the_error(start, "ENOENT"), start
    host.assert_nothing_left(session)
    call = in_namespace(setup, [CTX, "run", "--agent", "coder", "shell.exec", "id -u"],
                        host.env(), cwd=host.workspace)  # fmt: skip
    assert (call.rc, call.out) == (0, f"{NOBODY}\n"), call


# ---------------------------------------------------------------- bubblewrap


@pytest.mark.parametrize("where", ["path", "system"])
def test_a_terminal_without_bubblewrap_says_so_and_leaves_nothing(
    host: Host, paths: Paths, where: str
) -> None:
    """README ("ctx agent start needs root: the terminal's sandbox (bubblewrap)"), A-1:
    without bwrap (missing from PATH, or from the system) ``ctx agent start`` fails at once
    with one line naming bubblewrap, exit 1, and with ``--json`` the same error as an object;
    no session, runtime directory, terminal.started or process is left."""
    session = host.session()
    argv = [CTX, "agent", "start", "coder", "--session", session]
    if where == "path":
        env = host.env(paths.without("bwrap"))

        def start(*more: str) -> Run:
            return ctx_run(*argv[1:], *more, env=env, cwd=host.workspace)
    else:
        setup = hiding(host.top, "bwrap")

        def start(*more: str) -> Run:
            return in_namespace(setup, [*argv, *more], host.env(), cwd=host.workspace)

    line = the_error(start(), "EINVAL")
    assert "bubblewrap" in line and "bwrap" in line, line
    as_json = start("--json")
    the_error(as_json, "EINVAL")
    assert as_json.json()["error"] == "EINVAL" and "bubblewrap" in as_json.json()["message"]
    host.assert_nothing_left(session)


def test_a_terminal_starts_with_the_bwrap_found_on_path_outside_the_system_directories(
    host: Host, here: Path
) -> None:
    """A-1, docs/tools.md (root's launchers are looked for on PATH's absolute directories of
    root's): with bubblewrap gone from /usr/bin but installed in another directory of root's
    on PATH (/usr/local/bin, say), ``ctx agent start`` runs that one, where it had checked
    PATH but run ``bwrap`` from /usr/bin:/bin; the terminal then stops cleanly."""
    setup = hiding(host.top, "bwrap")
    local = new_scratch_dir(here, "local-") / "bin"
    local.mkdir(mode=0o755)
    local.chmod(0o755)
    shutil.copy2("/usr/bin/bwrap", local / "bwrap")
    env = host.env()
    env["PATH"] = f"{local}:{env['PATH']}"
    session = host.session()
    start = in_namespace(setup, [CTX, "agent", "start", "coder", "--session", session, "--json"],
                         env, cwd=host.workspace)  # fmt: skip
    try:
        assert start.rc == 0, start
    finally:
        stop = host.ctx("agent", "stop", "coder", "--session", session)
    assert stop.rc == 0, stop
    assert wait_for(lambda: processes_of(Path(session)) == [], 5)


# ---------------------------------------------------------------- FUSE


def test_mount_and_sigterm_need_neither_fusermount3_nor_umount_as_root(
    host: Host, here: Path, paths: Paths
) -> None:
    """F-1: root's ``ctx mount`` mounts the storage root and SIGTERM unmounts it cleanly
    (exit 0) with neither fusermount3 nor umount on PATH."""
    where = here / "mnt"
    where.mkdir()
    proc = subprocess.Popen(
        [CTX, "mount", str(where)], env=host.env(paths.without("fusermount*", "umount")),
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert wait_for(lambda: mounted_at(where) or proc.poll() is not None, MOUNT_WAIT)
        assert mounted_at(where), proc.communicate()[1]
        assert sorted(os.listdir(where)) == sorted(os.listdir(host.storage))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=MOUNT_WAIT) == 0
        assert not mounted_at(where)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if mounted_at(where):
            ctx_run("umount", where)


def test_umount_without_fusermount3_falls_back_to_umount(
    host: Host, here: Path, paths: Paths
) -> None:
    """F-1, docs/mount.md: ``ctx umount MOUNTPOINT`` with fusermount3 missing from PATH still
    unmounts (exit 0), and the mount process ends."""
    where = here / "mnt"
    where.mkdir()
    with serving(host.storage, where) as mount:
        done = ctx_run("umount", where, env=env_of(paths.without("fusermount*")))
        assert done.rc == 0, done
        assert not mounted_at(where)
        assert mount.proc.wait(timeout=MOUNT_WAIT) == 0


def test_umount_with_neither_fusermount3_nor_umount_says_so_and_keeps_the_mount(
    host: Host, here: Path, paths: Paths
) -> None:
    """F-1: with neither unmounting program on PATH, ``ctx umount`` cannot unmount: one
    ``ctx: ENOENT`` line naming umount, exit 1, no traceback; the mount still serves, and a
    ``ctx umount`` with them on PATH then unmounts it."""
    where = here / "mnt"
    where.mkdir()
    with serving(host.storage, where) as mount:
        refused = ctx_run("umount", where, env=env_of(paths.without("fusermount*", "umount")))
        assert "umount" in the_error(refused, "ENOENT"), refused
        assert mounted_at(where) and mount.proc.poll() is None
        assert "tool" in os.listdir(where)
        done = ctx_run("umount", where, env=env_of())
        assert done.rc == 0 and not mounted_at(where), done


def test_umount_without_fusermount3_never_runs_an_umount_from_the_current_directory(
    host: Host, here: Path, paths: Paths, outbox: Path
) -> None:
    """F-1 (``ctx umount`` unmounts cleanly), docs/tools.md (programs run as root before the
    switch of ids come only from absolute PATH entries of root's): an administrator whose PATH
    starts with ``.`` runs ``ctx umount`` from a directory where uid nobody left an executable
    ``umount``; fusermount3 is not installed.  That file must never run as root, and the
    mount must be unmounted."""
    planted_dir = here / "agent-dir"
    planted_dir.mkdir(mode=0o755)
    mark = outbox / "planted-umount-ran"
    planted = planted_dir / "umount"
    planted.write_text(f"#!/bin/sh\nid -u > {mark}\nexit 1\n")
    planted.chmod(0o755)
    os.chown(planted, NOBODY, NOBODY)
    os.chown(planted_dir, NOBODY, NOBODY)
    where = here / "mnt"
    where.mkdir()
    with serving(host.storage, where):
        done = ctx_run("umount", where, env=env_of(".:" + paths.without("fusermount*")),
                       cwd=planted_dir)  # fmt: skip
        ran_as = mark.read_text().strip() if mark.exists() else None
        unmounted = not mounted_at(where)
    assert ran_as is None, f"the planted umount ran as uid {ran_as}"
    assert done.rc == 0 and unmounted, done


def test_a_terminal_starts_and_stops_without_fusermount3_or_umount(
    host: Host, paths: Paths
) -> None:
    """A-1, A-2: root's terminal mounts its view and unmounts it at ``ctx agent stop`` with
    neither fusermount3 nor umount on PATH; the stop leaves no runtime directory and no
    process of the terminal."""
    path = paths.without("fusermount*", "umount")
    session = host.session()
    start = host.ctx("agent", "start", "coder", "--session", session, "--json", path=path)
    assert start.rc == 0, start
    assert start.json()["listening_at"].startswith(f"{RUNTIME}/{root_key(host.storage)}/")
    stop = host.ctx("agent", "stop", "coder", "--session", session, path=path)
    assert stop.rc == 0 and stop.out.startswith(f"stopped coder, session {session}"), stop
    assert wait_for(lambda: processes_of(Path(session)) == [], 5)
    for place in host.runtime(session):
        assert not os.path.lexists(place), place
    assert len(host.started(session)) == 1


DEV_WITHOUT_FUSE = "\n".join(
    [
        f"{MOUNT} -t tmpfs -o mode=755 cortexfs-test-dev /dev",
        f"{MKNOD} -m 666 /dev/null c 1 3",
        f"{MKNOD} -m 666 /dev/urandom c 1 9",
        f"{LN} -s /proc/self/fd /dev/fd",
    ]
)


def test_without_dev_fuse_mount_and_terminal_fail_with_enodev_and_leave_nothing(
    host: Host,
    here: Path,
) -> None:
    """docs/mount.md ("ENODEV for a missing /dev/fuse … with nothing mounted"), A-1: on a host
    whose /dev has no fuse, root's ``ctx mount`` and ``ctx agent start`` each fail with one
    ENODEV line, exit 1; the mount point stays an empty directory, the start leaves nothing;
    a tool call, which needs no FUSE, still works."""
    probe_namespace(DEV_WITHOUT_FUSE)
    where = here / "mnt"
    where.mkdir()
    mounted = in_namespace(DEV_WITHOUT_FUSE, [CTX, "mount", str(where)], host.env())
    assert "fuse" in the_error(mounted, "ENODEV"), mounted
    assert os.listdir(where) == [] and not mounted_at(where)
    session = host.session()
    start = in_namespace(DEV_WITHOUT_FUSE, [CTX, "agent", "start", "coder", "--session", session],
                         host.env(), cwd=host.workspace)  # fmt: skip
    the_error(start, "ENODEV")
    host.assert_nothing_left(session)
    call = in_namespace(DEV_WITHOUT_FUSE, [CTX, "run", "--agent", "coder", "fs.stat", "/workspace"],
                        host.env(), cwd=host.workspace)  # fmt: skip
    assert call.rc == 0 and "type: directory" in call.out, call


def test_without_the_fuse_extra_mount_and_terminal_say_enosys_and_leave_nothing(
    host: Host,
    here: Path,
) -> None:
    """README/scripts/install (the 'fuse' extra may be left out), docs/tools.md ("ctx agent
    start (root only; bubblewrap and the fuse extra)"): where pyfuse3 cannot be imported,
    ``ctx mount`` and ``ctx agent start`` fail with one ENOSYS line naming the 'fuse' extra,
    exit 1, leaving nothing; the queue and tool calls do not need it."""
    shadow = here / "no-fuse"
    shadow.mkdir()
    (shadow / "pyfuse3.py").write_text("raise ImportError(\"No module named 'pyfuse3'\")\n")
    where = here / "mnt"
    where.mkdir()
    mounted = host.ctx("mount", where, PYTHONPATH=str(shadow))
    assert "'fuse' extra" in the_error(mounted, "ENOSYS"), mounted
    assert os.listdir(where) == [] and not mounted_at(where)
    session = host.session()
    start = host.ctx("agent", "start", "coder", "--session", session, PYTHONPATH=str(shadow))
    assert "'fuse' extra" in the_error(start, "ENOSYS"), start
    host.assert_nothing_left(session)
    call = host.ctx("run", "--agent", "coder", "fs.stat", "/workspace", PYTHONPATH=str(shadow))
    assert call.rc == 0, call
    status = host.ctx("queue", "status", "--project", "proj", PYTHONPATH=str(shadow))
    assert status.rc == 0, status


@pytest.fixture
def dev_fuse_closed() -> None:
    try:
        mode = os.stat("/dev/fuse").st_mode
    except FileNotFoundError:
        pytest.skip("no /dev/fuse")
    if mode & 0o006:
        pytest.skip("/dev/fuse is open to every user here")


@pytest.mark.usefixtures("dev_fuse_closed")
def test_a_user_without_dev_fuse_access_is_told_what_to_do_and_nothing_is_mounted(
    desk: Desk, paths: Paths
) -> None:
    """README ("ctx mount needs root, or a /dev/fuse the user may open … with a setuid
    fusermount3; each says so, and what to do"): as the user, ``ctx mount`` and ``ctx mount
    --as coder`` fail with one EACCES line naming /dev/fuse and what to ask an administrator
    for; with fusermount3 missing from PATH too the line says to install fuse3.  Nothing is
    mounted, no daemon stays, and ``ctx umount`` finds nothing to unmount."""
    where = desk.mine(desk.home / f"mnt-{uuid.uuid4().hex[:8]}")
    for extra in ((), ("--as", "coder")):
        refused = desk.ctx("mount", *extra, where)
        line = the_error(refused, "EACCES")
        assert "/dev/fuse" in line and "fusermount3" in line and "root" in line, line
    no_helper = desk.ctx("mount", where, env=desk.env(paths.without("fusermount*")))
    line = the_error(no_helper, "EACCES")
    assert "fusermount3 is not installed" in line and "fuse3" in line, line
    assert os.listdir(where) == [] and not mounted_at(where)
    assert processes_of(where) == []
    the_error(desk.ctx("umount"), "ENOENT")


def test_a_user_is_told_that_a_terminal_needs_root_and_nothing_is_made(desk: Desk) -> None:
    """README ("ctx agent start needs root"), docs/tools.md: as the user, ``ctx agent start``
    is EPERM naming root and what to run instead, exit 1; no session, runtime directory or
    terminal.started is made."""
    session = f"s{uuid.uuid4().hex[:10]}"
    refused = desk.ctx("agent", "start", "coder", "--session", session)
    line = the_error(refused, "EPERM")
    assert "root" in line and "ctx run --agent coder" in line, line
    uid = str(desk.user.uid)
    assert not (desk.storage / f"home/{uid}/agent/coder/session/{session}").exists()
    assert not (RUNTIME / root_key(desk.storage)).exists()
    assert not (RUNTIME / uid / "coder" / session).exists()


# ---------------------------------------------------------------- unshare (a user host)


def test_a_users_call_without_unshare_is_refused_at_stage_run_naming_util_linux(
    desk: Desk, paths: Paths
) -> None:
    """docs/tools.md *Network*: a host that is not root starts an offline call under
    ``unshare``; where there is none (no util-linux unshare) the call is refused at stage
    ``run`` with EACCES instead of running with the network: terminal mode exit 126 and one
    line naming unshare and util-linux; native mode a result frame with that error and no
    exit status; the session records the refusal."""
    env = desk.env(paths.without("unshare"))
    terminal = desk.ctx("run", "--agent", "coder", "fs.stat", "/workspace", env=env)
    line = the_error(terminal, "EACCES", status=126)
    assert "unshare" in line and "util-linux" in line, line
    assert terminal.out == ""
    native = desk.ctx("run", "--agent", "coder", "--native", "fs.stat", env=env,
                      input='{"path": "/workspace"}')  # fmt: skip
    frame = json.loads(native.out.splitlines()[-1])
    assert frame["type"] == "result" and frame["status"] == "error", native
    assert (frame["error"]["error"], frame["error"]["stage"]) == ("EACCES", "run"), frame
    assert frame["exit_status"] is None, frame
    events = read_jsonl(
        desk.storage / f"home/{desk.user.uid}/agent/coder/session/default/events.jsonl"
    )
    assert events[-1]["type"] == "tool_result" and events[-1]["errno"] == "EACCES", events[-1]


def test_a_users_worker_without_unshare_claims_nothing(desk: Desk, paths: Paths) -> None:
    """docs/tools.md *Network*, W-1: a worker that could not start its offline tools refuses
    before it claims (EACCES naming unshare, exit 1), so the job stays pending rather than
    failing for the host's sake; with unshare back the same job is done."""
    project = f"p{uuid.uuid4().hex[:8]}"
    assert desk.ctx("queue", "init", "--project", project).rc == 0
    job = request("fs.stat", input={"path": "/workspace"})
    published = desk.ctx("queue", "publish", "--project", project, "-", input=json.dumps(job))
    assert published.rc == 0, published
    worker = ["queue", "work", "--project", project, "--agent", "coder", "--drain"]
    refused = desk.ctx(*worker, env=desk.env(paths.without("unshare")))
    line = the_error(refused, "EACCES")
    assert "unshare" in line and "no job was claimed" in line, line
    queue = desk.storage / "shared" / project / "queue"
    assert os.listdir(queue / "pending") == [published.out.strip()]
    assert os.listdir(queue / "claimed") == [] and os.listdir(queue / "lease") == []
    worked = desk.ctx(*worker)
    assert worked.rc == 0, worked
    assert sorted(os.listdir(queue / "done")) == sorted(
        [published.out.strip(), published.out.strip() + ".result"]
    )


def test_a_users_agent_allowed_the_network_needs_no_unshare(desk: Desk, paths: Paths) -> None:
    """P-4, docs/tools.md: only an offline call needs a namespace; an agent whose policy
    holds ``network:default connect`` runs its tools without unshare."""
    name = f"net{uuid.uuid4().hex[:8]}"
    req = {"name": name, "label": f"{name}_t", "tools": ["fs.stat"],
           "mount": [[str(desk.home / "ws"), "/workspace", "rw"]]}  # fmt: skip
    assert desk.ctx("agent", "create", "-", input=json.dumps(req)).rc == 0
    with (desk.storage / "agent" / f"{name}.d" / "policy").open("a") as policy:
        policy.write(f"allow {name}_t network:default connect\n")
    with (desk.storage / "tool" / "fs.stat.d" / "policy").open("a") as policy:
        policy.write(f"allow {name}_t tool:fs.stat execute\n")
    ran = desk.ctx("run", "--agent", name, "fs.stat", "/workspace",
                   env=desk.env(paths.without("unshare")))  # fmt: skip
    assert ran.rc == 0 and f"uid: {desk.user.uid}" in ran.out, ran


# ---------------------------------------------------------------- shells and interpreters


def test_tools_run_through_env_find_their_interpreter_without_the_callers_path(
    host: Host, paths: Paths
) -> None:
    """docs/tools.md *Environment* (PATH is /usr/local/bin:/usr/bin:/bin, nothing from the
    host's): with no shell and no python3 on the caller's PATH, tools written as
    ``#!/usr/bin/env sh`` and ``#!/usr/bin/env python3``, and shell.exec, still run."""
    host.install("demo.envsh", "#!/usr/bin/env sh\necho sh-ran $(id -u)\n")
    host.install("demo.envpy", "#!/usr/bin/env python3\nimport os\nprint('py-ran', os.getuid())\n")
    path = paths.without(*SHELLS, "python*")
    for tool, said in (("demo.envsh", "sh-ran"), ("demo.envpy", "py-ran")):
        ran = host.ctx("run", "--agent", "coder", tool, "{}", path=path)
        assert (ran.rc, ran.out) == (0, f"{said} {NOBODY}\n"), ran
    shell = host.ctx("run", "--agent", "coder", "shell.exec", "echo $0", path=path)
    assert (shell.rc, shell.out) == (0, "/bin/sh\n"), shell


def test_without_bin_sh_other_tools_and_workers_still_run(host: Host) -> None:
    """R-5: with /bin/sh gone from the system, fs.stat and a worker running fs.stat jobs do
    their work; shell.exec, which is ``/bin/sh -c``, fails (exit 1, ENOENT, no traceback)."""
    setup = hiding(host.top, "sh")
    call = in_namespace(setup, [CTX, "run", "--agent", "coder", "fs.stat", "/workspace"],
                        host.env(), cwd=host.workspace)  # fmt: skip
    assert call.rc == 0 and "type: directory" in call.out, call
    queue = QueueCLI(host.storage, "proj")
    job = queue.publish(request("fs.stat", input={"path": "/workspace"}))
    worked = in_namespace(setup, [CTX, "queue", "work", "--project", "proj", "--agent", "coder",
                                  "--drain"], host.env(), cwd=host.workspace)  # fmt: skip
    assert worked.rc == 0, worked
    assert queue.only_result(job)[0] == "done"
    shell = in_namespace(setup, [CTX, "run", "--agent", "coder", "shell.exec", "true"],
                         host.env(), cwd=host.workspace)  # fmt: skip
    the_error(shell, "ENOENT", program="shell.exec")


def test_shell_exec_without_bin_sh_names_the_missing_shell(host: Host) -> None:
    """R-5 (shell.exec runs ``/bin/sh -c``), docs/tools.md (a failure prints ``<tool>: <ERRNO>:
    <sentence>``): on a host without /bin/sh the sentence must say what is missing."""
    setup = hiding(host.top, "sh")
    shell = in_namespace(setup, [CTX, "run", "--agent", "coder", "shell.exec", "true"],
                         host.env(), cwd=host.workspace)  # fmt: skip
    line = the_error(shell, "ENOENT", program="shell.exec")
    assert "/bin/sh" in line, line


MISSING_INTERPRETER = "/usr/bin/python3.99"


def test_a_tool_whose_interpreter_is_not_installed_names_the_interpreter(host: Host) -> None:
    """docs/tools.md stage ``run``: ``ENOENT`` for a program or interpreter that is not
    there, said so.  A tool written for an interpreter the host lacks: the refusal (exit
    126, stage run, no exit status) must name that interpreter."""
    if os.path.exists(MISSING_INTERPRETER):
        pytest.skip(f"{MISSING_INTERPRETER} is installed here")
    host.install("demo.py399", f"#!{MISSING_INTERPRETER}\nprint('never')\n")
    terminal = host.ctx("run", "--agent", "coder", "demo.py399", "{}")
    line = the_error(terminal, "ENOENT", status=126)
    assert MISSING_INTERPRETER in line, line


def test_a_tool_run_through_env_with_a_missing_interpreter_keeps_envs_words(host: Host) -> None:
    """docs/tools.md *The result*: a tool started through ``/usr/bin/env`` whose interpreter
    is not installed is a tool that exited 127: the call fails at stage exit with that
    status, and its stderr, kept in the result, names the interpreter."""
    host.install("demo.envmissing", "#!/usr/bin/env python3.99\nprint('never')\n")
    native = host.ctx("run", "--agent", "coder", "--native", "demo.envmissing", input="{}")
    assert native.rc == 1, native
    frame = json.loads(native.out.splitlines()[-1])
    assert (frame["status"], frame["exit_status"]) == ("error", 127), frame
    assert frame["error"]["stage"] == "exit" and "python3.99" in frame["stderr"], frame


def test_a_worker_program_started_with_a_python3_lacking_cortexfs_runs_again_under_the_venv(
    host: Host, paths: Paths
) -> None:
    """workers/README.md: started as ``workers/tool_worker.py`` (``#!/usr/bin/env python3``)
    with the system's python3 first on PATH, which cannot import CortexFS, the worker runs
    again under the checkout's .venv/bin/python and does its work."""
    path = paths.without()
    python3 = shutil.which("python3", path=path)
    if python3 is None:
        pytest.skip("no python3 on the system PATH")
    probe = subprocess.run(
        [python3, "-c", "import cortexfs"], capture_output=True, env=env_of(), cwd="/"
    )
    if probe.returncode == 0:
        pytest.skip(f"{python3} can import cortexfs itself")
    queue = QueueCLI(host.storage, "proj")
    job = queue.publish(request("fs.stat", input={"path": "/workspace"}))
    done = subprocess.run(
        [str(REPO / "workers" / "tool_worker.py"), "--project", "proj", "--agent", "coder",
         "--drain"],
        capture_output=True, text=True, env=host.env(path), cwd=host.workspace, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert queue.only_result(job)[0] == "done"


# ---------------------------------------------------------------- HOME, XDG, TMPDIR, /run


@pytest.fixture
def locked(desk: Desk) -> Iterator[Path]:
    """A directory of root's (0755) in the desk: the user may not make anything in it."""
    path = new_scratch_dir(desk.top, "locked-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("home", ["unset", "missing", "read-only"])
def test_a_users_default_root_under_an_unusable_home_is_refused_naming_what_to_do(
    desk: Desk, locked: Path, home: str
) -> None:
    """R-1 (a user's default root is ``$XDG_DATA_HOME/cortexfs/storage/current``, under
    ``~/.local/share``): with HOME unset (the password database's home, not there and not
    makeable), missing below a directory the user may not write, or read-only, ``ctx
    bootstrap`` without a storage root fails with one EACCES line naming the directory it
    cannot create and ``--storage``/``CTX_STORAGE``, exit 1, and makes nothing."""
    if home == "unset":
        place = Path(os.path.expanduser(f"~{desk.user.name}"))
        if os.path.lexists(place):
            pytest.skip(f"{desk.user.name}'s home {place} exists here")
        env = env_of(HOME=None)
    elif home == "missing":
        place = locked / "home"
        env = env_of(HOME=str(place))
    else:
        place = locked
        env = env_of(HOME=str(place))
    before = sorted(os.listdir(locked))
    refused = desk.ctx("bootstrap", env=env)
    line = the_error(refused, "EACCES")
    assert "cannot create" in line and "--storage" in line and "CTX_STORAGE" in line, line
    assert str(place) in line, line
    assert sorted(os.listdir(locked)) == before
    if home != "read-only":
        assert not os.path.lexists(place), place


def test_a_users_default_root_under_a_missing_home_is_made_private(desk: Desk) -> None:
    """R-1, docs (the XDG directories a user's root lies in are made mode 0700 when they do not
    exist): with HOME naming a directory that is not there but may be made, ``ctx bootstrap``
    makes it and the root below it, the home and the XDG data directories 0700."""
    parent = desk.mine(desk.top / f"fresh-{uuid.uuid4().hex[:8]}")
    home = parent / "home"
    made = desk.ctx("bootstrap", env=env_of(HOME=str(home)))
    assert made.rc == 0, made
    root = home / ".local/share/cortexfs/storage/current"
    assert {entry.name for entry in root.iterdir()} >= {"bin", "tool", "agent", "home"}
    for directory in (home, home / ".local", home / ".local/share"):
        status = directory.stat()
        assert (stat.S_IMODE(status.st_mode), status.st_uid) == (0o700, desk.user.uid), directory


@pytest.mark.parametrize("variant", ["home-unset", "home-root", "home-missing", "cache-a-file"])
def test_a_users_queue_works_whatever_home_and_cache_directories_are(
    desk: Desk, locked: Path, variant: str
) -> None:
    """§2.4, Q-9 (claim order is best effort): with HOME unset, ``/``, missing below a
    directory the user may not write, or XDG_CACHE_HOME naming a file, publish, claim and
    finish work on a given storage root, and nothing is made where HOME or the cache
    points."""
    home = {"home-unset": None, "home-root": "/", "home-missing": str(locked / "home"),
            "cache-a-file": str(locked / "home")}[variant]  # fmt: skip
    extra: dict[str, str | None] = {"HOME": home}
    if variant == "cache-a-file":
        cache = locked / "cache"
        cache.write_text("not a directory\n")
        extra["XDG_CACHE_HOME"] = str(cache)
    env = env_of(CTX_STORAGE=str(desk.storage), **extra)
    before_root = sorted(os.listdir("/"))
    password_home = Path(os.path.expanduser(f"~{desk.user.name}"))
    had_password_home = os.path.lexists(password_home)
    job = json.dumps(request("fs.stat", input={"path": "/"}))
    published = desk.ctx("queue", "publish", "--project", "proj", "-", env=env, input=job)
    assert published.rc == 0, published
    claimed = desk.ctx("queue", "claim", "--project", "proj", env=env)
    assert claimed.rc == 0 and claimed.out.strip(), claimed
    finished = desk.ctx("queue", "finish", "--project", "proj", claimed.out.strip(), "--ok",
                        "-", env=env, input='{"fine": true}')  # fmt: skip
    assert finished.rc == 0, finished
    done = desk.storage / "shared/proj/queue/done" / claimed.out.strip()
    assert done.is_file() and done.with_name(done.name + ".result").is_file()
    assert not (locked / "home").exists()
    assert sorted(os.listdir("/")) == before_root
    assert os.path.lexists(password_home) == had_password_home
    if variant == "cache-a-file":
        assert cache.read_text() == "not a directory\n"


def test_xdg_data_home_naming_a_file_is_enotdir_and_nothing_is_made(
    desk: Desk, locked: Path
) -> None:
    """R-1: a user's XDG_DATA_HOME that names a file cannot hold the default root: ``ctx
    bootstrap`` fails with one ENOTDIR line naming it and the way out, exit 1; the file is
    unchanged."""
    data = locked / "data"
    data.write_text("a file\n")
    refused = desk.ctx("bootstrap", env=env_of(HOME=str(locked), XDG_DATA_HOME=str(data)))
    line = the_error(refused, "ENOTDIR")
    assert str(data) in line and "--storage" in line, line
    assert data.read_text() == "a file\n"
    assert sorted(os.listdir(locked)) == ["data"]


@pytest.mark.parametrize("runtime_dir", ["missing", "a-file"])
def test_a_terminal_needs_no_xdg_runtime_dir_and_no_home(
    host: Host, here: Path, runtime_dir: str
) -> None:
    """A-2: the terminal socket's link leads to /run/user/<uid>/cortexfs/… or
    /run/cortexfs/terminal/…; root's terminal starts and stops with XDG_RUNTIME_DIR missing
    or a file and HOME unset, and makes nothing where XDG_RUNTIME_DIR points."""
    place = here / "xdg-runtime"
    extra: dict[str, str | None] = {"HOME": None, "XDG_RUNTIME_DIR": str(place)}
    if runtime_dir == "a-file":
        place.write_text("x\n")
    session = host.session()
    start = host.ctx("agent", "start", "coder", "--session", session, "--json", **extra)
    assert start.rc == 0, start
    link = os.readlink(host.session_dir(session) / "terminal" / "main.sock")
    allowed = (f"{RUNTIME}/", f"/run/user/{NOBODY}/cortexfs/terminal/")
    assert link.startswith(allowed), link
    stop = host.ctx("agent", "stop", "coder", "--session", session, **extra)
    assert stop.rc == 0, stop
    if runtime_dir == "a-file":
        assert place.read_text() == "x\n"
    else:
        assert not place.exists()


# The setup, the start's errno, and the errnos of stop and watch (no terminal to find).
RUN_PROBLEMS = {
    "run-read-only": (
        f"{MOUNT} -t tmpfs -o ro,mode=755 cortexfs-test-run /run",
        "EROFS",
        ("ENOENT", "ENOENT"),
    ),
    "run-cortexfs-read-only": (
        f"{MOUNT} -t tmpfs -o mode=755 cortexfs-test-run /run\n{MKDIR} /run/cortexfs\n"
        f"{MOUNT} -t tmpfs -o ro,mode=755 cortexfs-test-rc /run/cortexfs",
        "EROFS",
        ("ENOENT", "ENOENT"),
    ),
    "run-cortexfs-a-file": (
        f"{MOUNT} -t tmpfs -o mode=755 cortexfs-test-run /run\n{TOUCH} /run/cortexfs",
        "ENOTDIR",
        ("ENOTDIR", "ENOENT"),
    ),
}


@pytest.mark.parametrize("problem", sorted(RUN_PROBLEMS))
def test_a_terminal_where_run_cortexfs_cannot_be_written_fails_cleanly(
    host: Host, problem: str
) -> None:
    """A-2 (the terminal's places under /run), docs/tools.md: when /run or /run/cortexfs
    cannot be written (read-only, or /run/cortexfs a file), ``ctx agent start`` fails with
    one line naming /run/cortexfs, exit 1, and ``--json`` gives the same error as an object;
    no session, terminal.started or process is left; stop and watch find no terminal (ENOENT,
    or the ENOTDIR that keeps them from looking)."""
    setup, word, no_terminal = RUN_PROBLEMS[problem]
    probe_namespace(setup)
    session = host.session()
    argv = [CTX, "agent", "start", "coder", "--session", session]
    start = in_namespace(setup, argv, host.env(), cwd=host.workspace)
    assert "/run/cortexfs" in the_error(start, word), start
    as_json = in_namespace(setup, [*argv, "--json"], host.env(), cwd=host.workspace)
    the_error(as_json, word)
    assert as_json.json()["error"] == word, as_json
    host.assert_nothing_left(session)
    for verb, no_terminal_word in zip(("stop", "watch"), no_terminal, strict=True):
        other = in_namespace(setup, [CTX, "agent", verb, "coder", "--session", session],
                             host.env(), cwd=host.workspace)  # fmt: skip
        the_error(other, no_terminal_word)


@pytest.mark.parametrize("tmpdir", ["missing", "a-file"])
def test_a_missing_or_useless_tmpdir_changes_nothing(host: Host, here: Path, tmpdir: str) -> None:
    """R-5, A-1: ``ctx bootstrap`` of a new root and a terminal's start and stop (which keep
    scratch files while they work) do their work with TMPDIR missing or naming a file, and
    make nothing there."""
    place = here / ("no-tmp" if tmpdir == "missing" else "tmp-file")
    if tmpdir == "a-file":
        place.write_text("x\n")
    root = here / "fresh-root"
    made = ctx_run("bootstrap", "--storage", root, env=env_of(TMPDIR=str(place)))
    assert made.rc == 0, made
    assert {entry.name for entry in root.iterdir()} == {
        "bin", "tool", "agent", "model", "home", "shared"
    }  # fmt: skip
    session = host.session()
    start = host.ctx("agent", "start", "coder", "--session", session, TMPDIR=str(place))
    assert start.rc == 0, start
    stop = host.ctx("agent", "stop", "coder", "--session", session, TMPDIR=str(place))
    assert stop.rc == 0, stop
    if tmpdir == "missing":
        assert not place.exists()
    else:
        assert place.read_text() == "x\n"


# ---------------------------------------------------------------- locales


LOCALES = {
    "LANG=C": {"LANG": "C"},
    "not-installed": {"LANG": "xx_YY.UTF-8", "LC_ALL": "xx_YY.UTF-8"},
    "latin1-not-installed": {"LANG": "de_DE.ISO-8859-1", "LC_ALL": None},
}


@pytest.mark.parametrize("locale", sorted(LOCALES))
def test_a_c_or_missing_locale_keeps_text_intact(host: Host, here: Path, locale: str) -> None:
    """§2.4, D-1: under LANG=C or a locale that is not installed, a request holding non-ASCII
    text is published and shown back intact, an error naming a non-ASCII file is one ``ctx:
    ENOENT`` line holding the name, and the manual prints; no warning about the locale is
    printed."""
    env = host.env(**{"LANG": None, **LOCALES[locale]})
    project = f"loc{uuid.uuid4().hex[:8]}"
    assert ctx_run("queue", "init", "--project", project, env=env).rc == 0
    note = "héllo ✓ 日本"
    job = json.dumps(request("fs.stat", input={"path": "/"}, note=note))
    published = ctx_run("queue", "publish", "--project", project, "-", env=env, input=job)
    assert published.rc == 0 and published.err == "", published
    name = published.out.strip()
    shown = ctx_run("queue", "show", "--project", project, name, "--json", env=env)
    assert shown.rc == 0 and note in json.dumps(shown.json(), ensure_ascii=False), shown
    missing = here / "nöte-✓.json"
    refused = ctx_run("queue", "publish", "--project", project, missing, env=env)
    assert str(missing) in the_error(refused, "ENOENT"), refused
    manual = ctx_run("man", "tool", env=env)
    assert manual.rc == 0 and manual.err == "" and "—" in manual.out, manual


def test_a_tool_never_inherits_the_callers_missing_locale(host: Host) -> None:
    """docs/tools.md *Environment* (the tool gets LANG=C.UTF-8 and nothing of the host's): a
    caller whose LC_ALL names a locale that is not installed gives the tool none of it, so
    programs the tool runs print no locale warning."""
    env_extra = {"LC_ALL": "xx_YY.UTF-8", "LANG": "xx_YY.UTF-8", "LC_MESSAGES": "zz_ZZ"}
    command = 'env | grep -E "^(LANG|LC_)" | sort; bash -c "echo bash-ok" 2>&1'
    ran = host.ctx("run", "--agent", "coder", "shell.exec", command, **env_extra)
    assert (ran.rc, ran.out, ran.err) == (0, "LANG=C.UTF-8\nbash-ok\n", ""), ran


# ---------------------------------------------------------------- MCP servers


MISSING_SERVER = "cortexfs-test-no-such-mcp-server"


def mcp_config(directory: Path) -> Path:
    directory.mkdir(mode=0o755, exist_ok=True)
    config = directory / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"gone": {"command": MISSING_SERVER}}}))
    config.chmod(0o644)
    return config


def test_ctxmcp_with_the_servers_program_missing_names_it_and_writes_nothing(
    host: Host,
    here: Path,
) -> None:
    """M-1, docs/tools.md (exit 1 when the server could not start, named with its errno):
    ``ctxmcp list`` and ``ctxmcp project`` of a server whose command is not installed fail
    with one ``ctxmcp: ENOENT`` line naming the server and its command, exit 1 (``--json``:
    the error object), and ``project`` makes no OUT directory."""
    config = mcp_config(here / "mcp")
    env = env_of()
    listed = subprocess.run([CTXMCP, "list", "--config", str(config), "--server", "gone"],
                            capture_output=True, text=True, env=env)  # fmt: skip
    run = Run(["list"], listed.returncode, listed.stdout, listed.stderr)
    line = the_error(run, "ENOENT", program="ctxmcp")
    assert "'gone'" in line and MISSING_SERVER in line, line
    as_json = subprocess.run(
        [CTXMCP, "list", "--config", str(config), "--server", "gone", "--json"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["error"] == "ENOENT"
    out = here / "candidates"
    projected = subprocess.run(
        [CTXMCP, "project", "--config", str(config), "--runtime-config", "/mcp/mcp.json",
         "--server", "gone", "--out", str(out)],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    the_error(Run(["project"], projected.returncode, projected.stdout, projected.stderr),
              "ENOENT", program="ctxmcp")  # fmt: skip
    assert not out.exists()


def test_a_projected_tool_whose_server_program_is_missing_fails_the_call_naming_it(
    host: Host,
    here: Path,
) -> None:
    """M-4, docs/tools.md (step 4 of the bridge; the server runs with the call's PATH): a call
    of an installed MCP-backed tool whose server command is not installed fails with one
    ENOENT line naming the server and its command, exit 1, and the session records the call
    and its failed result."""
    mcp_dir = here / "mcp"
    mcp_config(mcp_dir)
    manifest = here / "gone.now.json"
    manifest.write_text(json.dumps({
        "manifest": 2, "kind": "tool", "name": "gone.now", "description": "Now, from gone.",
        "schema": {"type": "object"}, "cap": {"side_effects": False, "network": False},
        "mcp": {"transport": "stdio", "config": "/mcp/mcp.json", "server": "gone", "tool": "now"},
    }))  # fmt: skip
    installed = host.ctx("object", "install", manifest, "--tier", "system")
    assert installed.rc == 0, installed
    req = {"name": "mcpuser", "label": "mcpuser_t", "tools": ["gone.now"],
           "mount": [[str(mcp_dir), "/mcp", "ro"]]}  # fmt: skip
    created = host.ctx("agent", "create", "-", input=json.dumps(req))
    assert created.rc == 0, created
    host.allow("mcpuser", "mcpuser_t", "gone.now")
    call = host.ctx("run", "--agent", "mcpuser", "gone.now", "{}")
    line = the_error(call, "ENOENT", program="gone.now")
    assert "'gone'" in line and MISSING_SERVER in line, line
    events = read_jsonl(host.session_dir("default", "mcpuser") / "events.jsonl")
    assert [e["type"] for e in events[-2:]] == ["tool_call", "tool_result"], events
    assert events[-1]["status"] == "error" and events[-1]["object"] == "tool/gone.now"
