"""What crosses a process boundary with ``ctx`` (SPEC §2.4, Q-1, Q-2, Q-5, W-1, W-4, S-5, T-3,
T-5, T-6, A-1, M-1; docs/tools.md *Process group and bounds*, docs/workers.md, docs/queue.md
*Command line*): open descriptors, locks and pipes.

A caller hands ``ctx`` more than its three standard streams: a ``flock(1)`` lock (``flock
LOCK ctx …`` keeps the lock's descriptor open in the command), the write end of a pipe whose
reader waits for end-of-file, a read-only file or a closed pipe as standard output, a
write-only file as standard input.  The programs ``ctx`` starts — a tool of
``ctx run`` (terminal and native mode), a worker's job and its hooks, the terminal daemon of
``ctx agent start`` and the tools tsh runs, an MCP server ``ctxmcp`` talks to — and the
daemons those leave behind in sessions of their own must hold none of the caller's
descriptors nor any of the host's (the session's ``events.jsonl``, the queue's directories, a
claim's lock): the caller's lock is free and the reader of its pipe sees end-of-file once the
command it started has ended, and a worker killed mid-job leaves no lock that would keep
``recover`` from requeueing the job.  A claim whose name its reader never took, or could not
be written, names the job, its lease holder and the way on (§2.4 exit statuses 141 and 74)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    QueueCLI,
    alive,
    clean_env,
    closing_all,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, Raw, coder_host, tsh_of
from tests.acceptance.workercli import AGENT, LABEL
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage
from tests.support.mcp_wire import WIRE
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
BIN = REPO / ".venv" / "bin"
CTX = str(BIN / "ctx")
CTXMCP = BIN / "ctxmcp"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
STANDARD = {"0", "1", "2"}

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid, and /proc of others is read: needs root"
)
pytestmark = needs_root

# Lists the descriptors open in the process that runs it, without opening one itself (fstat
# and readlink of /proc/self/fd/N), as JSON on stdout and, given a path, in that file too.
PROBE_PY = r"""
import json, os, sys
fds = {}
for fd in range(1024):
    try:
        os.fstat(fd)
    except OSError:
        continue
    try:
        fds[str(fd)] = os.readlink("/proc/self/fd/%d" % fd)
    except OSError:
        fds[str(fd)] = "?"
text = json.dumps({"pid": os.getpid(), "fds": fds})
if len(sys.argv) > 1:
    with open(sys.argv[1] + ".tmp", "w") as out:
        out.write(text)
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
print(text)
"""
PROBE = f'#!/bin/sh\nexec python3 -c {shlex.quote(PROBE_PY)} "$@"\n'


def daemon_program(box: Path, *, then: str = "echo '{\"daemon\": true}'") -> str:
    """A tool that leaves a daemon behind: ``setsid`` (a session of its own, outside the
    call's process group), its standard streams on /dev/null as a daemon puts them, its pid
    in ``BOX/daemon.CALL``; the tool waits until the daemon is there, then runs ``then``."""
    pidfile = f"{box}/daemon.$CTX_CALL"
    return (
        "#!/bin/sh\n"
        "cat > /dev/null\n"
        f"setsid sh -c 'echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 300' "
        "</dev/null >/dev/null 2>&1 &\n"
        f'while [ ! -e "{pidfile}" ]; do sleep 0.02; done\n'
        f"{then}\n"
    )


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def scratch() -> Iterator[Path]:
    top = new_scratch_dir(SCRATCH, "d")
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def box(outbox: Path) -> Iterator[Path]:
    """Where the daemons the tools leave write their pids; each is killed at the end."""
    try:
        yield outbox
    finally:
        for pidfile in outbox.glob("daemon.*"):
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


@dataclass
class Handed:
    """What a caller hands a command beyond its standard streams: the write end of a pipe
    whose reader (this test) waits for end-of-file, and an exclusive ``flock`` on a file.
    The caller's own copies are closed once the command is started (:meth:`let_go`)."""

    read_end: int
    write_end: int
    lock_path: Path
    lock_fd: int

    @property
    def fds(self) -> tuple[int, int]:
        return (self.write_end, self.lock_fd)

    def let_go(self) -> None:
        for fd in (self.write_end, self.lock_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.write_end = self.lock_fd = -1

    def lock_free(self) -> bool:
        """Whether the lock can be taken now (no other open file still holds it)."""
        probe = os.open(self.lock_path, os.O_RDWR)
        try:
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(probe)
        return True

    def at_eof(self) -> bool:
        """Whether the pipe's reader sees end-of-file: no process holds its write end."""
        readable, _, _ = select.select([self.read_end], [], [], 0)
        return bool(readable) and os.read(self.read_end, 1) == b""


@contextlib.contextmanager
def handed(directory: Path) -> Iterator[Handed]:
    read_end, write_end = os.pipe()
    lock_path = directory / "caller.lock"
    lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    given = Handed(read_end, write_end, lock_path, lock_fd)
    try:
        yield given
    finally:
        given.let_go()
        os.close(read_end)


def install(storage: Path, scratch: Path, name: str, program: str) -> None:
    """Tool ``name`` (shell text ``program``) in the system tier, allowed to agent ``ci`` in
    both layers of P-6."""
    manifest = tool_manifest(scratch / "src", name, program)
    done = subprocess.run([CTX, "object", "install", "--storage", str(storage), str(manifest),
                           "--tier", "system"], capture_output=True, text=True,
                          env=clean_env())  # fmt: skip
    assert done.returncode == 0, done
    rule = f"allow {LABEL} tool:{name} execute\n"
    for policy in (storage / "tool" / f"{name}.d" / "policy", storage / f"agent/{AGENT}.d/policy"):
        with open(policy, "a") as out:
            out.write(rule)


def fds_of(pid: int) -> dict[str, str]:
    found = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            found[name] = os.readlink(f"/proc/{pid}/fd/{name}")
    return found


def daemon_pid(box: Path, call: str) -> int:
    return int((box / f"daemon.{call}").read_text())


def no_traceback(text: str) -> None:
    assert "Traceback" not in text and "Fatal Python error" not in text, text


# ------------------------------------------------------------------------------ ctx run


def test_ctx_run_passes_a_tool_only_its_standard_streams_and_its_daemon_keeps_nothing(
    queue: QueueCLI, agent: str, scratch: Path, box: Path
) -> None:
    """T-3 ("stdin, stdout and stderr are the caller's"), T-5, docs/tools.md *Process group
    and bounds* (a process that calls setsid(2) outlives a native call; ``ctx run`` in
    terminal mode kills it as it returns): started with a pipe's write end and a flocked file
    beside its standard streams, ``ctx run`` gives the tool descriptors 0, 1 and 2 only, in
    terminal and native mode; a tool that leaves a daemon in a session of its own ends the
    call at once, and once ``ctx run`` has exited the caller's lock is free and its pipe at
    end-of-file, the daemon of a native call, alive, holding /dev/null only, and that of a
    terminal-mode call gone."""
    install(queue.storage, scratch, "fd.probe", PROBE)
    install(queue.storage, scratch, "fd.daemon", daemon_program(box))
    env = clean_env(CTX_STORAGE=str(queue.storage))
    for mode in ((), ("--native",)):
        with handed(scratch) as given:
            ran = subprocess.run([CTX, "run", "--agent", AGENT, *mode, "fd.probe"],
                                 input=b"{}" if mode else None,
                                 stdin=None if mode else subprocess.DEVNULL,
                                 capture_output=True, env=env, timeout=60,
                                 pass_fds=given.fds)  # fmt: skip
            given.let_go()
            assert ran.returncode == 0, ran
            if mode:
                probe = json.loads(ran.stdout.decode().splitlines()[-1])["output"]
            else:
                probe = json.loads(ran.stdout)
            assert set(probe["fds"]) == STANDARD, (mode, probe)
            assert given.lock_free() and wait_for(given.at_eof, 10)

    for mode in (("--native",), ()):
        with handed(scratch) as given:
            ran = subprocess.run([CTX, "run", "--agent", AGENT, *mode, "fd.daemon"],
                                 input=b"{}", capture_output=True, env=env, timeout=60,
                                 pass_fds=given.fds)  # fmt: skip
            given.let_go()
            assert ran.returncode == 0, ran
            said = json.loads(ran.stdout.decode().splitlines()[-1])
            assert (said["output"] if mode else said) == {"daemon": True}, ran
            events = read_jsonl(session_log(queue.storage, "default"))
            results = [e for e in events if e["type"] == "tool_result"]
            result = [e for e in results if e["object"] == "tool/fd.daemon"][-1]
            daemon = daemon_pid(box, result["call"])
            assert given.lock_free(), fds_of(daemon)
            assert wait_for(given.at_eof, 10), fds_of(daemon)
            if mode:
                assert alive(daemon)
                assert fds_of(daemon) == {fd: "/dev/null" for fd in STANDARD}
                os.kill(daemon, signal.SIGKILL)
            else:
                assert not alive(daemon), "ctx run in terminal mode returned before its end"


def session_log(storage: Path, session: str) -> Path:
    """The session of agent ``ci`` (uid nobody, root's default for agents)."""
    homes = list((storage / "home").glob(f"*/agent/{AGENT}/session/{session}/events.jsonl"))
    assert len(homes) == 1, homes
    return homes[0]


NONROOT_RUN = r"""
set -u
ctx bootstrap > /dev/null
printf '%s' '{"name": "solo", "label": "solo_t", "tools": ["fd.daemon"]}' \
    | ctx agent create - > /dev/null
ctx object install "$MANIFEST" --tier system > /dev/null
echo "allow solo_t tool:fd.daemon execute" >> "$CTX_STORAGE/tool/fd.daemon.d/policy"
: > "$LOCK"
# The pipe's only writer is descriptor 7 of the command: cat ends when no process holds it.
{ flock "$LOCK" ctx run --agent solo fd.daemon 7>&1 > /dev/null < /dev/null; echo "run=$?" >&2; } \
    | timeout 20 cat > /dev/null
echo "reader=${PIPESTATUS[1]}"
flock -n "$LOCK" true && echo "lock=free"
"""


def test_a_users_own_agent_run_under_flock_leaves_the_lock_and_the_pipe_to_the_user(
    scratch: Path, box: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """T-3, T-5 as a non-root owner of a storage root (the tool runs under ``unshare``, with
    the user's own uid): ``flock LOCK ctx run …`` whose tool leaves a setsid daemon, with a
    pipe's write end on descriptor 7, ends; the reader of the pipe sees end-of-file (it does
    not wait for its ``timeout``) and the lock is free again, the daemon gone (ctx run in
    terminal mode kills what its call left running outside its group as it returns)."""
    user = unprivileged_user
    home = scratch / "user"
    home.mkdir()
    os.chown(home, user.uid, user.gid)
    manifest = tool_manifest(home / "src", "fd.daemon", daemon_program(box))
    for path in (home / "src", manifest, manifest.with_suffix(".sh")):
        os.chown(path, user.uid, user.gid)
    env = clean_env(PATH=f"{BIN}:{SYSTEM_PATH}", HOME=str(home),
                    CTX_STORAGE=str(home / "storage"), MANIFEST=str(manifest),
                    LOCK=str(home / "deploy.lock"))  # fmt: skip
    ran = run_as(user, ["bash", "-c", NONROOT_RUN], env=env, cwd=home)
    no_traceback(ran.stderr)
    assert "run=0" in ran.stderr, ran
    assert ran.stdout.splitlines() == ["reader=0", "lock=free"], ran
    daemons = list(box.glob("daemon.*"))
    # Terminal mode: the daemon left its call's session, and ctx run killed it as it returned.
    assert len(daemons) == 1 and not alive(int(daemons[0].read_text())), daemons


# ------------------------------------------------------------------------------ workers


def test_a_worker_passes_none_of_its_descriptors_to_jobs_hooks_or_their_daemons(
    queue: QueueCLI, agent: str, scratch: Path, box: Path
) -> None:
    """W-1, T-5, T-6, S-5: a worker holds its session's ``events.jsonl`` (O_APPEND), the
    queue's directories and its caller's descriptors; the job's tool and its pre-hook get
    descriptors 0, 1 and 2 only, and a daemon a job leaves behind holds none of them: once
    the drained worker has exited, the caller's lock is free and its pipe at end-of-file."""
    install(queue.storage, scratch, "fd.probe", PROBE)
    install(queue.storage, scratch, "fd.daemon", daemon_program(box))
    hook = queue.storage / "tool/fd.probe.d/hooks/pre.d/10-probe"
    hook.write_text(
        f"#!/bin/sh\ncat > /dev/null\nexec python3 -c {shlex.quote(PROBE_PY)} {box}/hook.json\n"
    )
    hook.chmod(0o755)
    probe_job = queue.publish({"tool": "fd.probe", "input": {}}, name="probe")
    daemon_job = queue.publish({"tool": "fd.daemon", "input": {}}, name="daemon")
    with handed(scratch) as given:
        worker = subprocess.run(
            [CTX, "queue", "work", "--project", queue.project, "--agent", AGENT, "--drain"],
            stdin=subprocess.DEVNULL, capture_output=True, timeout=120, pass_fds=given.fds,
            env=clean_env(CTX_STORAGE=str(queue.storage)),
        )  # fmt: skip
        given.let_go()
        assert worker.returncode == 0, worker
        no_traceback(worker.stderr.decode())
        state, probed = queue.only_result(probe_job)
        assert state == "done" and set(probed["output"]["fds"]) == STANDARD, probed
        hooked = json.loads((box / "hook.json").read_text())
        assert set(hooked["fds"]) == STANDARD, hooked
        state, left = queue.only_result(daemon_job)
        assert state == "done" and left["output"] == {"daemon": True}, left
        daemon = daemon_pid(box, left["call"])
        assert alive(daemon)
        assert fds_of(daemon) == {fd: "/dev/null" for fd in STANDARD}
        assert given.lock_free()
        assert wait_for(given.at_eof, 10)
    queue.assert_settled()


def test_a_worker_killed_mid_job_leaves_no_lock_and_its_tools_daemon_holds_no_claim(
    queue: QueueCLI, agent: str, scratch: Path, box: Path
) -> None:
    """Q-5, W-4, I-4 (docs/tools.md: a process that leaves the call's group outlives it): a
    worker SIGKILLed while its job's tool runs, the tool having left a setsid daemon that is
    still alive, leaves nothing the daemon could hold — no descriptor under the storage root,
    no flock on the queue's files — so ``ctx queue recover`` requeues the job at once
    (exit 0) and a drain runs it again to ``done/``."""
    hold = f"[ -e {box}/release ] || exec sleep 300\necho '{{}}'"
    install(queue.storage, scratch, "fd.hold", daemon_program(box, then=hold))
    job = queue.publish({"tool": "fd.hold", "input": {}}, name="held")
    worker = subprocess.Popen(
        [CTX, "queue", "work", "--project", queue.project, "--agent", AGENT, "--drain"],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
    )  # fmt: skip
    try:
        assert wait_for(lambda: any(box.glob("daemon.*")), 30), "the job's tool never started"
    finally:
        worker.kill()
        worker.wait()
    daemon = int(next(box.glob("daemon.*")).read_text())
    assert alive(daemon)
    held = [t for t in fds_of(daemon).values() if str(queue.storage) in t]
    assert held == [], held
    assert queue.state(job) == "claimed"
    assert flocked_in(queue.dir) == [], "a lock on the queue outlives the worker"

    recovered = queue.run("recover", "--json")
    assert recovered.rc == 0, recovered
    assert [r["job"] for r in recovered.json()["requeued"]] == [job], recovered
    assert queue.state(job) == "pending" and alive(daemon)
    (box / "release").touch()
    again = queue.run("work", "--agent", AGENT, "--drain", timeout=60)
    assert again.rc == 0, again
    assert queue.only_result(job)[0] == "done"


def flocked_in(top: Path) -> list[str]:
    """The entries under ``top`` (itself included) that ``/proc/locks`` shows an flock on."""
    under = {}
    for where, dirs, files in os.walk(top):
        for name in [".", *dirs, *files]:
            path = os.path.join(where, name)
            found = os.lstat(path)
            dev = f"{os.major(found.st_dev):02x}:{os.minor(found.st_dev):02x}:{found.st_ino}"
            under[dev] = path
    with open("/proc/locks") as locks:
        entries = [line.split() for line in locks]
    return [under[e[5]] for e in entries if len(e) > 5 and e[1] == "FLOCK" and e[5] in under]


# ------------------------------------------------------------------------------ terminal


@pytest.fixture
def coder(_template: Path, scratch: Path):
    with coder_host(_template, scratch, ["fd.probe"], {}) as host:
        host.install("fd.probe", PROBE)
        host.grant_in_tool("fd.probe")
        yield host


def test_tsh_and_the_tools_it_runs_hold_the_terminal_and_nothing_of_the_host(coder) -> None:
    """A-1, H-1, T-3, T-5: in an agent's terminal, tsh and a tool run from its prompt hold
    descriptors 0, 1 and 2, all three the terminal's PTY: no socket, directory, log or
    session file of the host's that ctxterm keeps open."""
    term = coder.start()
    with closing_all() as opened:
        operator = Raw(term.listening_at, b"attach\n")
        opened.append(operator)
        assert operator.shows(AGENT_PROMPT), operator.text()
        operator.answer("fd.probe probe.json")
    probe = json.loads((coder.ws / "probe.json").read_text())
    assert set(probe["fds"]) == STANDARD, probe
    assert len(set(probe["fds"].values())) == 1 and "/dev/pts/" in probe["fds"]["0"], probe
    tsh = fds_of(tsh_of(term.session))
    assert set(tsh) == STANDARD and len(set(tsh.values())) == 1, tsh


def test_a_terminal_started_under_flock_keeps_neither_the_lock_nor_the_callers_pipe(
    coder, scratch: Path
) -> None:
    """A-1, docs/tools.md (``ctx agent start`` returns once the terminal listens, which then
    runs on its own): ``flock LOCK ctx agent start coder`` — the lock's descriptor is open in
    the command, as flock(1) runs it — with a pipe's write end on a descriptor of its own.
    The daemon that stays is no part of the caller's command: once ``ctx agent start`` has
    returned, the lock can be taken again and the pipe's reader sees end-of-file, as after
    any daemon that closes what it inherited."""
    lock = scratch / "deploy.lock"
    lock.touch()
    read_end, write_end = os.pipe()
    session = "held"
    try:
        started = subprocess.run(
            ["flock", str(lock), CTX, "agent", "start", "coder", "--session", session],
            cwd=coder.ws, stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
            env=coder.env, pass_fds=(write_end,),
        )  # fmt: skip
        coder.started.append(session)
        os.close(write_end)
        write_end = -1
        assert started.returncode == 0, started
        free = subprocess.run(["flock", "-n", str(lock), "true"], timeout=10)
        assert free.returncode == 0, "the lock is still held once ctx agent start returned"

        def at_eof() -> bool:
            readable, _, _ = select.select([read_end], [], [], 0)
            return bool(readable) and os.read(read_end, 1) == b""

        assert wait_for(at_eof, 10), "the caller's pipe is still held open"
    finally:
        for fd in (read_end, write_end):
            with contextlib.suppress(OSError):
                os.close(fd)


# ------------------------------------------------------------------------------ ctxmcp

FD_SERVER = (
    WIRE
    + f"PROBE = {PROBE_PY!r}\n"
    + r"""
import subprocess
while True:
    message = receive()
    if "id" not in message:
        continue
    method, ident = message.get("method"), message["id"]
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "fds", "version": "0"}}})
    elif method == "tools/list":
        subprocess.run([sys.executable, "-c", PROBE, sys.argv[1]], stdout=subprocess.DEVNULL,
                       close_fds=False)
        # A daemon of the server's, in a session of its own, its pid beside the listing.
        if os.fork() == 0:
            os.setsid()
            with open(sys.argv[1] + ".daemon.tmp", "w") as out:
                out.write(str(os.getpid()))
            os.rename(sys.argv[1] + ".daemon.tmp", sys.argv[1] + ".daemon")
            time.sleep(300)
            os._exit(0)
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": [
            {"name": "t", "description": "Lists.", "inputSchema": {"type": "object"}}]}})
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
"""
)


def test_an_mcp_server_started_by_ctxmcp_gets_only_its_pipes(scratch: Path) -> None:
    """M-1: ``ctxmcp list`` run with a pipe's write end and a flocked file beside its
    standard streams starts the server with its three pipes only (what the server starts
    inherits the same, here with close_fds off), and once ctxmcp has exited the lock is free
    and the pipe at end-of-file, though a daemon of the server's still runs."""
    server = scratch / "server.py"
    server.write_text(FD_SERVER)
    listing = scratch / "server-fds.json"
    config = scratch / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"fds": {
        "command": str(BIN / "python"), "args": [str(server), str(listing)]}}}))  # fmt: skip
    daemon = None
    try:
        with handed(scratch) as given:
            listed = subprocess.run(
                [str(CTXMCP), "list", "--config", str(config), "--server", "fds"],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
                env=clean_env(), pass_fds=given.fds,
            )  # fmt: skip
            given.let_go()
            assert listed.returncode == 0 and listed.stdout.startswith("fds.t\t"), listed
            daemon = int(Path(f"{listing}.daemon").read_text())
            probe = json.loads(listing.read_text())
            assert set(probe["fds"]) == STANDARD, probe
            assert given.lock_free(), fds_of(daemon)
            assert wait_for(given.at_eof, 10), fds_of(daemon)
    finally:
        if daemon is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(daemon, signal.SIGKILL)


# ------------------------------------------------------------------------------ claim output


def claim_into(queue: QueueCLI, stdout: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CTX_ARGV, "queue", "claim", "--project", queue.project, *args],
        stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE, text=True,
        env=clean_env(CTX_STORAGE=str(queue.storage)), timeout=60,
    )  # fmt: skip


def test_a_claim_whose_reader_left_or_whose_output_is_read_only_names_the_job_it_leased(
    queue: QueueCLI, scratch: Path
) -> None:
    """§2.4, Q-2, Q-3, docs/queue.md: ``ctx queue claim`` whose standard output is a pipe
    with no reader (text and ``--json``) ends with 141 and one note naming the job and its
    lease holder — this process, the claim's parent — so the job can still be finished by
    that name; a claim whose standard output is a file opened read-only (``1<FILE``) ends
    with 74 and ``EBADF: cannot write standard output``, naming the job it leased too."""
    jobs = [queue.publish(name=f"j{n}") for n in range(3)]
    for args in ((), ("--json",)):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            claimed = claim_into(queue, write_end, *args)
        finally:
            os.close(write_end)
        assert claimed.returncode == 141, claimed
        [note] = claimed.stderr.splitlines()
        job = next(j for j in jobs if f"job {j} " in note)
        assert note.startswith("ctx: note: the reader of standard output left"), note
        assert f"leased to pid {os.getpid()} " in note and "--project proj" in note, note
        assert queue.state(job) == "claimed" and queue.lease(job)["pid"] == os.getpid()
        queue.finish(job)
        assert queue.only_result(job)[0] == "done"

    read_only = scratch / "read-only"
    read_only.touch()
    with open(read_only, "rb") as out:
        claimed = claim_into(queue, out.fileno())
    assert claimed.returncode == 74, claimed
    assert claimed.stderr.startswith("ctx: EBADF: cannot write standard output"), claimed
    [job] = [j for j in jobs if f"job {j} is claimed and leased to pid {os.getpid()}" in
             claimed.stderr]  # fmt: skip
    assert queue.state(job) == "claimed"
    assert read_only.read_bytes() == b""
    queue.finish(job)
    queue.assert_settled()


def test_a_claim_whose_output_is_refused_suggests_recover_on_the_same_queue(
    queue: QueueCLI, scratch: Path
) -> None:
    """docs/queue.md: "A ``ctx queue …`` command that a refusal, a note or a worker's line
    suggests names the queue as the command was told it … so that the suggestion, copied into
    another shell, acts on the same queue".  The 74 line of a claim whose name could not be
    written suggests ``recover``: it must say ``--project proj``, as the 141 note does."""
    queue.publish(name="lost")
    read_only = scratch / "read-only"
    read_only.touch()
    with open(read_only, "rb") as out:
        claimed = claim_into(queue, out.fileno())
    assert claimed.returncode == 74, claimed
    assert "job lost.req.json is claimed" in claimed.stderr, claimed
    assert "'ctx queue recover --project proj'" in claimed.stderr, claimed.stderr


# ------------------------------------------------------------------------------ odd stdin


def test_a_write_only_standard_input_is_named_by_what_cannot_read_it(
    queue: QueueCLI, agent: str, scratch: Path
) -> None:
    """README ("Errors read ``ctx: ERRNO: what to do``"), Q-1, Q-4, T-3: a script that opened
    its standard input for writing (``0>>FILE``) hands ``publish -``, ``finish -`` and
    ``run --native`` nothing to read.  Nothing is published, finished or run, and each says
    ``EBADF`` naming standard input, as a closed one is named (``standard input is closed:
    there is no request to read; …``)."""
    job = queue.publish(name="open")
    assert queue.claim() == job
    env = clean_env(CTX_STORAGE=str(queue.storage))
    written = scratch / "written"
    commands = {
        "publish": ["queue", "publish", "--project", "proj", "--name", "never", "-"],
        "finish": ["queue", "finish", "--project", "proj", job, "--ok", "-"],
        "run": ["run", "--agent", AGENT, "--native", "shell.exec"],
    }
    said = {}
    for name, words in commands.items():
        with open(written, "ab") as stdin:
            ran = subprocess.run([*CTX_ARGV, *words], stdin=stdin, capture_output=True,
                                 text=True, env=env, timeout=60)  # fmt: skip
        no_traceback(ran.stderr)
        assert ran.returncode != 0, ran
        said[name] = ran.stderr
    assert queue.entries("pending") == set() and queue.state(job) == "claimed"
    assert written.read_bytes() == b""
    for name, text in said.items():
        assert text.startswith("ctx: EBADF: ") and "standard input" in text, (name, text)
