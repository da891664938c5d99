"""Process-tree hygiene (SPEC I-4, W-2, W-4, T-3, T-6, A-1, A-2, M-1, M-4, F-1; docs/tools.md
"Process group and bounds", "Agent native mode and its frames", "The agent terminal", "A
terminal that was killed", "How an input is checked", "MCP servers as tool sources";
docs/workers.md "One job", "Signals"; docs/mount.md; ``ctx run --help``): after a command
ends — successfully, refused, timed out, interrupted by SIGINT, SIGTERM or SIGHUP, or
SIGKILLed — the user looks at the process table, ``/proc``, the mount table and the storage
root, and finds nothing left of it:

* ``ctx run`` in terminal and native mode, with a tool that forks background children (some
  of them ignoring SIGTERM and SIGHUP, one orphaned by a double fork), with pre- and
  post-hooks that do the same, with a tool that ignores every stop signal, at its timeout, and
  while a schema pattern that may backtrack is judged in a helper process;
* ``ctx queue work``: jobs run several at once, a job past its timeout, a worker stopped,
  aborted by a second Ctrl-C, SIGKILLed, and one whose orphan guard was killed;
* agent terminals (``ctx agent start`` / ``stop``, ``exit`` in tsh, a ctxterm or its view's
  mount process killed, a start interrupted by Ctrl-C): the terminal server, its sandbox,
  tsh, the view's mount process, the tools tsh ran and their children, the view's mount,
  the runtime directories and sockets;
* MCP: a stubborn server (it ignores SIGTERM, SIGHUP and the end of its input, and starts a
  child) behind an installed MCP-backed tool and behind ``ctxmcp list``;
* ``ctx mount``: stopped by SIGHUP, SIGKILLed then ``ctx umount``, and serving without
  leaving children.

Each check is concrete: the pids of what was started (found through process groups,
sessions, parents and ``/proc``) are dead and no zombie is left under a long-lived parent;
a tool, a hook and an MCP server hold only descriptors 0, 1 and 2 (read from their own
``/proc/self/fd``); no socket, FIFO, pid, lock or temp file is left in the storage root; no
mount is left; and a tool runs in its caller's cgroup, none being made for it.  Only the
processes, mounts and directories of the storage roots and scratch directories these tests
make, and of the ``sleep`` markers they start, are looked at or ended."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    QueueCLI,
    Run,
    alive,
    clean_env,
    ctx_run,
    mounted_at,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, Raw, Term, coder_host
from tests.support.mcp_wire import WIRE
from tests.support.storage import copy_of_root

TOP = scratch_top(__file__)
WAIT = 10.0
PYTHON = REPO / ".venv" / "bin" / "python"
CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
GUARD_MARK = b"kill -s KILL"  # the call-group guard's shell text (docs/tools.md)
JUDGE_MARK = b"cortexfs.tools.schema_patterns"  # the helper that judges a risky pattern
AGENT, LABEL = "ci", "ci_t"
STANDARD = {"0", "1", "2"}
RUNTIME = Path("/run/cortexfs/terminal")

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid and /proc of others is read: needs root"
)
needs_fuse = pytest.mark.skipif(not os.path.exists("/dev/fuse"), reason="needs /dev/fuse")
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
pytestmark = needs_root

# Lists the descriptors open in the process that runs it, without opening one itself while
# it looks (fstat, then readlink of /proc/self/fd/N), then its cgroup; as JSON on stdout and,
# given a path, in that file too.
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
with open("/proc/self/cgroup") as table:
    cgroup = table.read()
text = json.dumps({"pid": os.getpid(), "fds": fds, "cgroup": cgroup})
if len(sys.argv) > 1:
    with open(sys.argv[1] + ".tmp", "w") as out:
        out.write(text)
    os.rename(sys.argv[1] + ".tmp", sys.argv[1])
print(text)
"""

# A stdio MCP server that does not go quietly: it ignores SIGTERM and SIGHUP, starts a child
# (``sleep MARK``, which inherits both ignored) as it is initialised, reports its pid, the
# child's and its own descriptors in REPORT, and stays when its input ends.  Tool ``go``
# answers; tool ``hang`` never does.
STUBBORN_SERVER = (
    WIRE
    + r"""
import signal, subprocess
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
mark, report = sys.argv[1], sys.argv[2]

def stay():
    while True:
        time.sleep(1000)

def descriptors():
    found = []
    for fd in range(1024):
        try:
            os.fstat(fd)
        except OSError:
            continue
        found.append(str(fd))
    return found

fds = descriptors()
while True:
    try:
        message = receive()
    except SystemExit:
        stay()
    method, ident = message.get("method"), message.get("id")
    if method == "initialize":
        child = subprocess.Popen(["sleep", mark], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(report + ".tmp", "w") as out:
            json.dump({"pid": os.getpid(), "child": child.pid, "fds": fds}, out)
        os.rename(report + ".tmp", report)
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "st", "version": "1"}}})
    elif method == "tools/list":
        schema = {"type": "object"}
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": [
            {"name": "go", "description": "Answers.", "inputSchema": schema},
            {"name": "hang", "description": "Never answers.", "inputSchema": schema}]}})
    elif method == "tools/call":
        if message["params"]["name"] == "hang":
            stay()
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "content": [{"type": "text", "text": "went"}], "isError": False}})
"""
)


# ------------------------------------------------------------------------------ helpers


def dfl_sigint() -> None:
    """SIGINT at its default, as a shell gives the command it runs in the foreground."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def marker() -> str:
    """A number of seconds no other process sleeps: it names the processes a test starts."""
    return f"{5000 + int.from_bytes(os.urandom(2)) % 1000}.{int.from_bytes(os.urandom(3)):06d}"


def sleepers(mark: str) -> list[int]:
    """Live (not zombie) ``sleep MARK`` processes."""
    wanted = b"sleep\0" + mark.encode() + b"\0"
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{entry}/cmdline").read_bytes() == wanted and alive(int(entry)):
                found.append(int(entry))
    return found


def processes_naming(text: bytes) -> list[int]:
    """Live processes (not zombies, not this one) whose command line holds ``text``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        if int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if text in Path(f"/proc/{entry}/cmdline").read_bytes() and alive(int(entry)):
                found.append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    return []


def children(pid: int) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return [p.pid for p in psutil.Process(pid).children()]
    return []


def zombies_under(pid: int) -> list[int]:
    """The children of ``pid`` that ended and were not reaped."""
    return [c for c in children(pid) if os.path.exists(f"/proc/{c}") and not alive(c)]


def cmdline(pid: int) -> bytes:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    return b""


def guards_of(pid: int) -> list[int]:
    """The live call-group guards among the children of ``pid``."""
    return [c for c in children(pid) if GUARD_MARK in cmdline(c) and alive(c)]


def judges_of(pid: int) -> list[int]:
    """The live schema-judging helpers among the descendants of ``pid``."""
    return [c for c in descendants(pid) if JUDGE_MARK in cmdline(c) and alive(c)]


def none_alive(pids: list[int], seconds: float = WAIT) -> bool:
    return wait_for(lambda: not any(alive(p) for p in pids), seconds)


def living(pids: list[int]) -> list[int]:
    return [p for p in pids if alive(p)]


def mounts_under(prefix: str) -> list[str]:
    with open("/proc/self/mountinfo") as table:
        return [ln.split()[4] for ln in table if ln.split()[4].startswith(prefix)]


def debris(top: Path) -> list[str]:
    """What a process leaves when it does not clean up after itself: sockets, FIFOs, pid,
    lock, temp and staging files, and a terminal's socket link (the tiers' persistent
    ``.install-lock`` files excepted)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            kind = path.lstat().st_mode
            odd = not (path.is_symlink() or path.is_dir() or path.is_file())
            named = name.endswith((".lock", ".pid", ".tmp", ".part", ".sock")) or "~" in name
            if odd or (named and name != ".install-lock"):
                found.append(f"{path} ({oct(kind)})")
    return found


def finished_popen(proc: subprocess.Popen, timeout: float = 30) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    return (out or ""), (err or "")


@contextlib.contextmanager
def started(argv: list[str], feed: str | None = None, **kw) -> Iterator[subprocess.Popen]:
    """``argv`` in the background, SIGINT at its default, text pipes out, ``feed`` (else
    nothing) as its standard input; killed at the end if still running."""
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    with tempfile.TemporaryFile() as given:
        given.write((feed or "").encode())
        given.seek(0)
        proc = subprocess.Popen(argv, preexec_fn=dfl_sigint, text=True, stdin=given, **kw)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=15)


@dataclass
class World:
    """A scratch directory below :data:`TOP` holding a bootstrapped storage root (with the
    queue of project ``proj``), agent ``ci`` allowed ``shell.exec`` in both layers of P-6,
    ``out/`` where the agent may write, ``mcp/`` (host-owned, for MCP configurations) and
    ``probe.py``; the ``sleep`` markers a test starts are killed at the end."""

    top: Path
    storage: Path
    out: Path
    mcp: Path
    probe: Path
    marks: list[str] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.storage, "proj")

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def q(self, command: str, *args, **kw) -> Run:
        return self.ctx("queue", command, "--project", "proj", *args, **kw)

    def mark(self) -> str:
        mark = marker()
        self.marks.append(mark)
        return mark

    def argv(self, *args: str) -> list[str]:
        return [*CTX_ARGV, *args]

    def run_argv(self, *args: str) -> list[str]:
        return self.argv("run", "--agent", AGENT, *args)

    def probe_cmd(self, out: Path | None = None) -> str:
        """A shell command that becomes the probe (exec), reporting on stdout (and ``out``)."""
        return f"exec {shlex.quote(str(PYTHON))} {self.probe}" + (f" {out}" if out else "")

    def install(self, name: str, program: str, schema: dict | None = None) -> None:
        """Tool ``name`` (shell text ``program``) in the system tier, allowed to ``ci`` in
        both layers of P-6."""
        manifest = tool_manifest(self.top / "manifests", name, program)
        if schema is not None:
            document = json.loads(manifest.read_text())
            document["schema"] = schema
            manifest.write_text(json.dumps(document))
        done = self.ctx("object", "install", manifest, "--tier", "system")
        assert done.rc == 0, done
        self.allow(name)

    def allow(self, tool: str, label: str = LABEL, agent: str = AGENT) -> None:
        rule = f"allow {label} tool:{tool} execute\n"
        for policy in (self.storage / "tool" / f"{tool}.d" / "policy",
                       self.storage / "agent" / f"{agent}.d" / "policy"):  # fmt: skip
            with policy.open("a") as rules:
                rules.write(rule)

    def hook(self, tool: str, where: str, name: str, text: str) -> None:
        path = self.storage / "tool" / f"{tool}.d" / "hooks" / where / name
        path.write_text(text)
        path.chmod(0o755)


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(TOP, "w")
    storage = copy_of_root(_template, top / "storage")
    out = top / "out"
    out.mkdir()
    out.chmod(0o1777)
    mcp = top / "mcp"
    mcp.mkdir(mode=0o755)
    mcp.chmod(0o755)
    probe = top / "probe.py"
    probe.write_text(PROBE_PY)
    probe.chmod(0o644)
    made = World(top, storage, out, mcp, probe)
    request = {"name": AGENT, "label": LABEL, "tools": ["shell.exec"]}
    created = made.ctx("agent", "create", "-", input=json.dumps(request))
    assert created.rc == 0, created
    with (storage / "tool" / "shell.exec.d" / "policy").open("a") as rules:
        rules.write(f"allow {LABEL} tool:shell.exec execute\n")
    try:
        yield made
    finally:
        for pid in processes_naming(str(top).encode()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for mark in made.marks:
            for pid in sleepers(mark):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for where in mounts_under(str(top)):
            subprocess.run(["umount", "-l", where], check=False)
        shutil.rmtree(top, ignore_errors=True)


def frames(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def shell_job(cmd: str) -> dict:
    return {"tool": "shell.exec", "input": {"cmd": cmd}, "from": "tester",
            "created": "2026-06-22T12:00:00Z"}  # fmt: skip


def worker_argv(*args: str) -> list[str]:
    return [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", AGENT, *args]


def finished_jobs(queue: QueueCLI) -> int:
    return sum(
        1
        for state in ("done", "failed")
        for name in queue.entries(state)
        if not name.endswith(".result")
    )


def leftovers(mark: str) -> str:
    """A shell command that leaves running in its own process group, three ways, a plain
    background child, a child that ignores SIGTERM, SIGHUP and SIGINT, and a grandchild
    whose parent exited at once (a double fork: reparented, but still in the call's group,
    and ignoring SIGTERM and SIGHUP), then prints ``ran``."""
    quiet = ">/dev/null 2>&1 </dev/null"
    return (
        f"sleep {mark} {quiet} & "
        f'(trap "" TERM HUP INT; exec sleep {mark}) {quiet} & '
        f'(trap "" TERM HUP; sleep {mark} {quiet} &) ; echo ran'
    )


IGNORING_ALL = 'trap "" TERM HUP INT; sleep {mark} >/dev/null 2>&1 & sleep {mark}; echo never'


# ------------------------------------------------------------------------------ ctx run


@pytest.mark.parametrize("mode", ["terminal", "native"])
def test_a_call_that_returned_leaves_none_of_what_its_tool_started(world, mode):
    """docs/tools.md "Process group and bounds" (W-4): "whatever it left running in its
    group is killed after a one-second grace, so no process of a call outlives it" — in
    terminal and native mode, for a plain background child, a child ignoring SIGTERM,
    SIGHUP and SIGINT, and a double-forked grandchild; the call itself succeeds."""
    mark = world.mark()
    cmd = leftovers(mark)
    if mode == "terminal":
        ran = world.ctx("run", "--agent", AGENT, "shell.exec", json.dumps({"cmd": cmd}))
        assert ran.rc == 0 and ran.out == "ran\n", ran
    else:
        ran = world.ctx("run", "--agent", AGENT, "--native", "shell.exec",
                        input=json.dumps({"cmd": cmd}))  # fmt: skip
        assert ran.rc == 0, ran
        assert frames(ran.out)[-1]["output"] == "ran\n", ran
    assert wait_for(lambda: sleepers(mark) == [], 2), sleepers(mark)
    assert debris(world.storage) == []


def test_terminal_mode_sigterm_ends_the_tool_and_a_child_that_ignores_it(world):
    """T-3, ``ctx run --help`` ("SIGTERM … stops the tool's process group … exit 128 + the
    signal's number"): SIGTERM to ``ctx run`` whose tool (default dispositions) waits on two
    children, one of which ignores SIGTERM: ``ctx run`` exits 143, and neither child, the
    tool nor the call-group guard is left."""
    mark = world.mark()
    cmd = f'sleep {mark} & (trap "" TERM; exec sleep {mark}) & wait'
    argv = world.run_argv("shell.exec", json.dumps({"cmd": cmd}))
    with started(argv, env=world.env) as proc:
        assert wait_for(lambda: len(sleepers(mark)) == 2, WAIT), proc.poll()
        family = descendants(proc.pid)
        guards = guards_of(proc.pid)
        assert guards, "no call-group guard beside the tool"
        proc.send_signal(signal.SIGTERM)
        _, err = finished_popen(proc)
    assert proc.returncode == 143, (proc.returncode, err)
    assert "Traceback" not in err, err
    assert none_alive(family + guards), living(family + guards)
    assert sleepers(mark) == []


def test_terminal_mode_sigterm_ends_a_tool_that_ignores_it(world):
    """T-3, ``ctx run --help``: "In either mode, Ctrl-C, SIGTERM or SIGHUP to ctx run stops
    the tool's process group and records the call as ended …; exit 128 + the signal's
    number".  A service manager's SIGTERM (``timeout 60 ctx run …``) to ``ctx run`` whose
    tool ignores it must end it (within a few seconds) with 143, leaving no process of the
    call, as ``ctx run --native`` does."""
    mark = world.mark()
    argv = world.run_argv("shell.exec", json.dumps({"cmd": IGNORING_ALL.format(mark=mark)}))
    with started(argv, env=world.env) as proc:
        assert wait_for(lambda: len(sleepers(mark)) == 2, WAIT), proc.poll()
        family = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=4)
        ended = proc.poll()
    assert ended == 143, f"ctx run still running 4 s after SIGTERM: {ended}"
    assert none_alive(family, 3), living(family)


def test_terminal_mode_sigkill_takes_a_tool_that_ignores_every_signal_along(world):
    """I-4, docs/tools.md "Process group and bounds" ("Nor does any outlive the process that
    started the call"): ``ctx run`` SIGKILLed while its tool and the tool's child ignore
    SIGTERM, SIGHUP and SIGINT leaves neither, nor the guard."""
    mark = world.mark()
    argv = world.run_argv("shell.exec", json.dumps({"cmd": IGNORING_ALL.format(mark=mark)}))
    with started(argv, env=world.env) as proc:
        assert wait_for(lambda: len(sleepers(mark)) == 2, WAIT), proc.poll()
        family = descendants(proc.pid)
        proc.kill()
        proc.wait()
    assert none_alive(family), living(family)
    assert sleepers(mark) == []
    assert debris(world.storage) == []


@pytest.mark.parametrize("mode", ["terminal", "native"])
def test_a_timeout_kills_a_tool_that_ignores_every_signal_and_its_child(world, mode):
    """W-4, docs/tools.md ("A timeout … kills the whole group with SIGKILL"; ``ETIMEDOUT:
    timed out after 60s; its process group was killed``): ``--timeout 1`` ends a tool that
    ignores SIGTERM, SIGHUP and SIGINT, and its child, within moments of the timeout; the
    call fails with ``ETIMEDOUT`` and exit status 137 (terminal mode: ctx exits 137; native:
    the result frame says so, ctx exits 1)."""
    mark = world.mark()
    cmd = IGNORING_ALL.format(mark=mark)
    began = time.monotonic()
    if mode == "terminal":
        ran = world.ctx("run", "--agent", AGENT, "--timeout", "1", "shell.exec",
                        json.dumps({"cmd": cmd}))  # fmt: skip
        assert ran.rc == 137 and "ETIMEDOUT" in ran.err, ran
    else:
        ran = world.ctx("run", "--agent", AGENT, "--native", "--timeout", "1", "shell.exec",
                        input=json.dumps({"cmd": cmd}))  # fmt: skip
        result = frames(ran.out)[-1]
        assert ran.rc == 1 and result["exit_status"] == 137, ran
        assert result["error"]["error"] == "ETIMEDOUT" and result["error"]["stage"] == "run"
    assert time.monotonic() - began < 8
    assert wait_for(lambda: sleepers(mark) == [], 2), sleepers(mark)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_native_mode_stop_signal_kills_a_tool_that_ignores_it(world, signum):
    """docs/tools.md "Agent native mode" ("Ctrl-C, SIGTERM or SIGHUP to ``ctx run --native``
    kills the tool's process group and ends the call with a ``result`` frame of ``EINTR`` at
    stage ``run``, exit 128 + the signal's number … (137 when the SIGKILL ended it)"): with a
    tool and a child that ignore all three, nothing of the call is left, guard included."""
    mark = world.mark()
    argv = world.run_argv("--native", "shell.exec")
    with started(argv, json.dumps({"cmd": IGNORING_ALL.format(mark=mark)}), env=world.env) as proc:
        assert wait_for(lambda: len(sleepers(mark)) == 2, WAIT), proc.poll()
        family = descendants(proc.pid)
        guards = guards_of(proc.pid)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 128 + signum, (proc.returncode, err)
    result = frames(out)[-1]
    assert result["type"] == "result" and result["exit_status"] == 137, result
    assert (result["error"]["error"], result["error"]["stage"]) == ("EINTR", "run"), result
    assert none_alive(family + guards), living(family + guards)
    assert sleepers(mark) == []


def test_native_mode_sigkill_leaves_no_tool_child_or_guard(world):
    """I-4, docs/tools.md "Process group and bounds": ``ctx run --native`` SIGKILLed while
    its tool (ignoring every stop signal) waits on a child leaves neither, nor the guard."""
    mark = world.mark()
    argv = world.run_argv("--native", "shell.exec")
    with started(argv, json.dumps({"cmd": IGNORING_ALL.format(mark=mark)}), env=world.env) as proc:
        assert wait_for(lambda: len(sleepers(mark)) == 2, WAIT), proc.poll()
        family = descendants(proc.pid)
        assert guards_of(proc.pid), "no call-group guard beside the tool"
        proc.kill()
        proc.wait()
    assert none_alive(family), living(family)
    assert sleepers(mark) == []


@pytest.mark.parametrize("mode", ["terminal", "native"])
def test_a_tool_and_its_hooks_hold_only_their_standard_streams(world, mode):
    """T-3, T-6, docs/tools.md (the tool "gets exactly this environment", "Each call runs in a
    process group of its own"; a hook "runs as the tool does"): a caller that holds a
    ``flock``-ed file and the write end of a pipe open without close-on-exec hands neither
    to the tool, its pre-hook or its post-hook — each holds descriptors 0, 1 and 2 only."""
    pre, post, tool = world.out / "pre.json", world.out / "post.json", world.out / "tool.json"
    for where, report in (("pre.d", pre), ("post.d", post)):
        text = f"#!/bin/sh\ncat >/dev/null\n{world.probe_cmd(report)} >/dev/null\n"
        world.hook("shell.exec", where, "10-probe", text)
    lock = os.open(world.top / "caller.lock", os.O_RDWR | os.O_CREAT, 0o600)
    read_end, write_end = os.pipe()
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        payload = json.dumps({"cmd": world.probe_cmd(tool)})
        args = ["shell.exec", payload] if mode == "terminal" else ["--native", "shell.exec"]
        proc = subprocess.Popen(
            world.run_argv(*args), env=world.env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(lock, write_end),
        )  # fmt: skip
        out, err = proc.communicate(payload.encode() if mode == "native" else b"", timeout=60)
    finally:
        os.close(lock)
        os.close(write_end)
        os.close(read_end)
    assert proc.returncode == 0, (out, err)
    for report in (pre, post, tool):
        seen = json.loads(report.read_text())
        assert set(seen["fds"]) == STANDARD, (report.name, seen["fds"])


def test_hooks_that_leave_stubborn_children_leave_nothing_once_the_call_returned(world):
    """T-6, docs/tools.md "Process group and bounds" (a hook "runs as the tool does"): a
    pre-hook and a post-hook that each leave a child ignoring SIGTERM and SIGHUP in the
    background, around a tool that does the same: once ``ctx run --native`` returned, none of
    the three children runs."""
    mark = world.mark()
    stay = f"(trap '' TERM HUP; exec sleep {mark}) >/dev/null 2>&1 </dev/null &\n"
    for where in ("pre.d", "post.d"):
        world.hook("shell.exec", where, "20-stay", "#!/bin/sh\ncat >/dev/null\n" + stay)
    cmd = stay.strip() + " echo ran"
    ran = world.ctx("run", "--agent", AGENT, "--native", "shell.exec",
                    input=json.dumps({"cmd": cmd}))  # fmt: skip
    assert ran.rc == 0 and frames(ran.out)[-1]["output"] == "ran\n", ran
    assert wait_for(lambda: sleepers(mark) == [], 2), sleepers(mark)


def test_a_pre_hook_past_the_calls_timeout_is_killed_with_its_children(world):
    """T-6, docs/tools.md Hooks ("a pre-hook still running when it runs out is killed
    (``… vetoed the call (exit 137): ran past the call's timeout``)"): a pre-hook that
    ignores SIGTERM and SIGHUP and waits on a child is killed with it at ``--timeout 1``; the
    call is refused (``EACCES`` at stage ``hook``), the tool never runs, nothing is left."""
    mark = world.mark()
    ran_mark = world.out / "tool-ran"
    slow = f"#!/bin/sh\ncat >/dev/null\ntrap '' TERM HUP\nsleep {mark} & sleep {mark}\n"
    world.hook("shell.exec", "pre.d", "10-slow", slow)
    ran = world.ctx("run", "--agent", AGENT, "--native", "--timeout", "1", "shell.exec",
                    input=json.dumps({"cmd": f"touch {ran_mark}"}))  # fmt: skip
    result = frames(ran.out)[-1]
    assert ran.rc == 1, ran
    assert (result["error"]["error"], result["error"]["stage"]) == ("EACCES", "hook"), result
    assert "ran past the call's timeout" in result["error"]["message"], result
    assert not ran_mark.exists()
    assert wait_for(lambda: sleepers(mark) == [], 2), sleepers(mark)


# A schema whose pattern repeats a repeat: an input that almost matches takes exponential
# time, so with a timeout the input is judged in a helper process (docs/tools.md "How an
# input is checked").
RISKY_SCHEMA = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
RISKY_INPUT = {"s": "a" * 40 + "!"}


def test_a_schema_judge_past_the_calls_timeout_is_killed(world):
    """docs/tools.md "How an input is checked" ("has its input judged in a child process
    within that time (``ETIMEDOUT`` at stage ``schema`` past it)", ``ctx run --native``
    exits 1): after the refusal, the helper that judged is gone."""
    world.install("hyg.risky", "#!/bin/sh\ncat >/dev/null\necho '{}'\n", RISKY_SCHEMA)
    argv = world.run_argv("--native", "--timeout", "1", "hyg.risky")
    with started(argv, json.dumps(RISKY_INPUT), env=world.env) as proc:
        assert wait_for(lambda: judges_of(proc.pid), WAIT), proc.poll()
        judges = judges_of(proc.pid)
        out, _ = proc.communicate(timeout=20)
    result = frames(out)[-1]
    assert proc.returncode == 1, out
    assert (result["error"]["error"], result["error"]["stage"]) == ("ETIMEDOUT", "schema")
    assert none_alive(judges, 3), living(judges)


def test_a_schema_judge_goes_with_a_native_call_stopped_by_sigterm(world):
    """docs/tools.md "Agent native mode" (SIGTERM "ends the call … exit 128 + the signal's
    number"), "Process group and bounds" ("no process of a call outlives it"): SIGTERM while
    the input is judged by the helper ends ``ctx run`` with 143 and the helper with it."""
    world.install("hyg.risky", "#!/bin/sh\ncat >/dev/null\necho '{}'\n", RISKY_SCHEMA)
    argv = world.run_argv("--native", "--timeout", "120", "hyg.risky")
    with started(argv, json.dumps(RISKY_INPUT), env=world.env) as proc:
        assert wait_for(lambda: judges_of(proc.pid), WAIT), proc.poll()
        judges = judges_of(proc.pid)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
    try:
        assert proc.returncode == 143
        assert none_alive(judges, 3), living(judges)
    finally:
        for pid in living(judges):
            os.kill(pid, signal.SIGKILL)


def test_a_schema_judge_goes_with_a_native_call_that_was_sigkilled(world):
    """I-4, docs/tools.md "Process group and bounds" ("Nor does any outlive the process that
    started the call, even a SIGKILLed worker…"): ``ctx run --native`` SIGKILLed while the
    helper judges its input against a pattern that may backtrack leaves no helper behind."""
    world.install("hyg.risky", "#!/bin/sh\ncat >/dev/null\necho '{}'\n", RISKY_SCHEMA)
    argv = world.run_argv("--native", "--timeout", "120", "hyg.risky")
    judges: list[int] = []
    try:
        with started(argv, json.dumps(RISKY_INPUT), env=world.env) as proc:
            assert wait_for(lambda: judges_of(proc.pid), WAIT), proc.poll()
            judges = judges_of(proc.pid)
            proc.kill()
            proc.wait()
        assert none_alive(judges, 1.5), f"judging helper(s) {living(judges)} outlived ctx run"
    finally:
        for pid in living(judges):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("mode", ["native", "worker"])
def test_a_tool_runs_in_its_callers_cgroup_so_none_is_left_for_it(world, mode):
    """T-5, W-1 (a call is a process group under the caller, no cgroup of its own): a tool
    run by ``ctx run --native`` or by a worker is in every hierarchy's cgroup of the process
    that started it, so no cgroup is made for a call and none can be left behind."""
    own = Path("/proc/self/cgroup").read_text()
    report = world.out / "cg.json"
    if mode == "native":
        ran = world.ctx("run", "--agent", AGENT, "--native", "shell.exec",
                        input=json.dumps({"cmd": world.probe_cmd(report)}))  # fmt: skip
        assert ran.rc == 0, ran
    else:
        job = shell_job(world.probe_cmd(report))
        world.q("publish", "--name", "cg", "-", input=json.dumps(job))
        ran = world.q("work", "--agent", AGENT, "--drain")
        assert ran.rc == 0 and world.queue.state("cg.req.json") == "done", ran
    assert json.loads(report.read_text())["cgroup"] == own


# ------------------------------------------------------------------------------ workers


def test_a_worker_running_jobs_at_once_leaves_no_child_zombie_or_extra_guard(world):
    """W-1, W-2, W-4 (docs/workers.md "One job": the orphan guard is "a small shell per
    worker"): a long-running worker with ``--concurrency 3 --timeout 2`` runs six jobs whose
    tools leave children behind in every way (one ignores every signal and times out);
    afterwards none of their processes runs, the worker has no zombie child and exactly one
    guard, and once SIGTERM ends it (exit 0) the guard is gone too."""
    q = world.queue
    mark = world.mark()
    jobs = [leftovers(mark)] * 5 + [IGNORING_ALL.format(mark=mark)]
    with started(worker_argv("--concurrency", "3", "--timeout", "2"), env=world.env) as worker:
        for n, cmd in enumerate(jobs):
            world.q("publish", "--name", f"c{n}", "-", input=json.dumps(shell_job(cmd)))
        assert wait_for(lambda: finished_jobs(q) == len(jobs), 30), worker.poll()
        assert wait_for(lambda: sleepers(mark) == [], 3), sleepers(mark)
        assert q.state("c5.req.json") == "failed"
        assert all(q.state(f"c{n}.req.json") == "done" for n in range(5))
        assert wait_for(lambda: zombies_under(worker.pid) == [], 2), zombies_under(worker.pid)
        guards = guards_of(worker.pid)
        assert len(guards) == 1, guards
        assert set(children(worker.pid)) == set(guards), children(worker.pid)
        worker.send_signal(signal.SIGTERM)
        _, err = finished_popen(worker)
    assert worker.returncode == 0, err
    assert none_alive(guards, 3), living(guards)
    assert debris(world.storage) == []


def test_worker_jobs_run_at_once_hold_only_their_standard_streams(world):
    """W-1, docs/tools.md "Process group and bounds": three jobs run at once by one worker
    (``--concurrency 3``), started while the others' pipes are open in the worker, each hold
    descriptors 0, 1 and 2 and nothing of another job's."""
    cmd = "sleep 0.4; " + world.probe_cmd()
    for n in range(3):
        world.q("publish", "--name", f"f{n}", "-", input=json.dumps(shell_job(cmd)))
    ran = world.q("work", "--agent", AGENT, "--drain", "--concurrency", "3")
    assert ran.rc == 0, ran
    targets = set()
    for n in range(3):
        result = json.loads((world.queue.dir / "done" / f"f{n}.req.json.result").read_text())
        fds = result["output"]["fds"]
        assert set(fds) == STANDARD, fds
        targets |= {fds["1"], fds["2"]}
    assert len(targets) == 6, targets  # each job's own stdout and stderr pipes


def test_a_worker_sigkilled_with_jobs_running_at_once_kills_every_call_group(world):
    """I-4, W-4, docs/workers.md "One job" ("an orphan guard … kills the tool's whole process
    group when the worker is gone"): SIGKILL to a worker running three jobs at once, each
    waiting on a child that ignores every signal, leaves none of the six processes nor the
    guard; ``ctx queue recover`` then requeues exactly the three jobs."""
    mark = world.mark()
    for n in range(3):
        job = shell_job(IGNORING_ALL.format(mark=mark))
        world.q("publish", "--name", f"k{n}", "-", input=json.dumps(job))
    with started(worker_argv("--concurrency", "3"), env=world.env) as worker:
        assert wait_for(lambda: len(sleepers(mark)) == 6, WAIT), worker.poll()
        family = descendants(worker.pid)
        assert len(guards_of(worker.pid)) == 1
        worker.kill()
        worker.wait()
    assert none_alive(family), living(family)
    assert sleepers(mark) == []
    recovered = world.q("recover", "--json")
    assert recovered.rc == 0, recovered
    assert sorted(e["job"] for e in recovered.json()["requeued"]) == [
        f"k{n}.req.json" for n in range(3)
    ], recovered
    assert debris(world.storage) == []


def test_a_worker_aborted_by_a_second_ctrl_c_kills_tools_that_ignore_it(world):
    """docs/workers.md "Signals" ("A second ^C: abort … running tools are killed, the worker
    exits 130"): a tool and its child that ignore SIGINT are gone after the second ^C, the
    guard too, and the job is named in ``left_claimed``."""
    mark = world.mark()
    world.q("publish", "--name", "ab", "-",
            input=json.dumps(shell_job(IGNORING_ALL.format(mark=mark))))  # fmt: skip
    with started(worker_argv("--json"), env=world.env) as worker:
        assert wait_for(lambda: len(sleepers(mark)) == 2, WAIT), worker.poll()
        family = descendants(worker.pid)
        worker.send_signal(signal.SIGINT)
        time.sleep(0.5)  # the first ^C is taken (stop claiming) before the second comes
        worker.send_signal(signal.SIGINT)
        out, err = finished_popen(worker)
    assert worker.returncode == 130, err
    stop = frames(out)[-1]
    assert stop["event"] == "stop" and stop["left_claimed"] == ["ab.req.json"], stop
    assert none_alive(family), living(family)
    assert sleepers(mark) == []


def test_a_workers_guard_that_was_killed_is_reaped_and_replaced(world):
    """docs/workers.md "One job" (an orphan guard per worker kills a call's group when the
    worker is gone), docs/tools.md ("a guard that is gone is started again"): the guard of a
    long-running worker is SIGKILLed between jobs; after the next job the worker has reaped
    it (no zombie child) and holds a new guard, which does its work: SIGKILL to the worker
    during a third job leaves none of that job's processes."""
    q = world.queue
    mark = world.mark()
    with started(worker_argv(), env=world.env) as worker:
        world.q("publish", "--name", "g0", "-", input=json.dumps(shell_job("true")))
        assert wait_for(lambda: q.state("g0.req.json") == "done", WAIT), worker.poll()
        first = guards_of(worker.pid)
        assert len(first) == 1, first
        os.kill(first[0], signal.SIGKILL)
        world.q("publish", "--name", "g1", "-", input=json.dumps(shell_job("true")))
        assert wait_for(lambda: q.state("g1.req.json") == "done", WAIT), worker.poll()
        assert wait_for(lambda: zombies_under(worker.pid) == [], 2), zombies_under(worker.pid)
        second = guards_of(worker.pid)
        assert len(second) == 1 and second != first, (first, second)
        job = shell_job(IGNORING_ALL.format(mark=mark))
        world.q("publish", "--name", "g2", "-", input=json.dumps(job))
        assert wait_for(lambda: len(sleepers(mark)) == 2, WAIT), worker.poll()
        family = descendants(worker.pid)
        worker.kill()
        worker.wait()
    assert none_alive(family), living(family)
    assert sleepers(mark) == []


def test_a_schema_judge_goes_with_a_worker_that_was_sigkilled(world):
    """I-4, docs/workers.md "One job" ("if the worker is killed, so is everything the tool
    started, and the job's re-execution after recover never runs beside a leftover of the
    first one"), docs/tools.md "How an input is checked": a worker SIGKILLed while its job's
    input is judged in the helper leaves no helper."""
    world.install("hyg.risky", "#!/bin/sh\ncat >/dev/null\necho '{}'\n", RISKY_SCHEMA)
    job = {"tool": "hyg.risky", "input": RISKY_INPUT}
    world.q("publish", "--name", "r1", "-", input=json.dumps(job))
    judges: list[int] = []
    try:
        with started(worker_argv("--timeout", "120"), env=world.env) as worker:
            assert wait_for(lambda: judges_of(worker.pid), WAIT), worker.poll()
            judges = judges_of(worker.pid)
            worker.kill()
            worker.wait()
        assert none_alive(judges, 1.5), f"judging helper {living(judges)} outlived the worker"
    finally:
        for pid in living(judges):
            os.kill(pid, signal.SIGKILL)


# ------------------------------------------------------------------------------ terminals


@dataclass
class Family:
    """A running terminal's processes and places."""

    ctxterm: int
    pids: list[int]
    rundir: Path
    alias: Path
    link: Path


def family_of(host, term) -> Family:
    ctxterm = int((term.rundir / "pid").read_text())
    alias = RUNTIME / str(host.uid) / "coder" / term.session
    return Family(ctxterm, [ctxterm, *descendants(ctxterm)], term.rundir, alias, term.link)


def assert_nothing_left_of(host, family: Family) -> None:
    assert none_alive(family.pids), living(family.pids)
    assert mounts_under(str(family.rundir)) == []
    assert not family.rundir.exists()
    assert not os.path.lexists(family.alias)
    assert not os.path.lexists(family.link)
    assert not os.path.lexists(family.link.parent), "the session's terminal/ directory stays"
    assert processes_naming(str(host.storage).encode()) == []
    assert debris(host.storage) == []


@pytest.fixture
def coder(_template: Path):
    with coder_host(_template, TOP, ["shell.exec"], {}) as host:
        host.grant_in_tool("shell.exec")
        yield host


def typed(client: Raw, line: str) -> str:
    """Type ``line`` at tsh's prompt; what it printed before the next prompt."""
    return client.answer(line)


@needs_fuse
@needs_bwrap
def test_a_terminal_started_and_stopped_leaves_no_process_mount_socket_or_directory(coder):
    """A-1, A-2, docs/tools.md "The agent terminal" (on stop ctxterm "unmounts the view and
    removes its sockets, the symlink (and the session's ``terminal/`` directory that held it)
    and the directories its start made under ``/run/cortexfs/terminal``"): after ``ctx agent
    stop`` nothing of ctxterm, its view's mount process, bubblewrap or tsh runs, the view is
    unmounted, and the runtime directory, the A-2 alias, the session link and its directory
    are gone."""
    term = coder.start()
    family = family_of(coder, term)
    assert len(family.pids) >= 4, family  # ctxterm, the view's mount, bubblewrap, tsh
    assert mounts_under(str(family.rundir)), "no view is mounted"
    coder.stop(term.session)
    assert_nothing_left_of(coder, family)


@needs_fuse
@needs_bwrap
def test_tools_typed_at_tsh_leave_no_child_and_no_zombie_under_the_terminal(coder):
    """H-1, H-5, docs/tools.md ("Every process left in the tool's session when it exits … is
    the call's, killed after the same grace as its group's"): two command lines whose tools
    leave children (ignoring SIGTERM/SIGHUP/SIGINT, in a job of their own under ``set -m``)
    each return to the prompt, none of their children runs a moment later, and
    ctxterm keeps the same children (the view's mount process and the sandbox), no zombie."""
    term = coder.start()
    family = family_of(coder, term)
    own_children = sorted(children(family.ctxterm))
    mark = marker()
    try:
        client = Raw(term.listening_at, b"attach\n")
        try:
            assert client.shows(AGENT_PROMPT), client.text()
            quiet = ">/dev/null 2>&1 </dev/null"
            for cmd in (
                f'(trap "" TERM HUP INT; exec sleep {mark}) {quiet} & echo ran',
                f"set -m; sleep {mark} {quiet} & echo ran",
            ):
                line = f"shell.exec '{json.dumps({'cmd': cmd})}'"
                assert "ran" in typed(client, line)
                assert wait_for(lambda: sleepers(mark) == [], 3), (cmd, sleepers(mark))
        finally:
            client.close()
        assert wait_for(lambda: sorted(children(family.ctxterm)) == own_children, 2), (
            own_children,
            children(family.ctxterm),
        )
        assert zombies_under(family.ctxterm) == []
    finally:
        for pid in sleepers(mark):
            os.kill(pid, signal.SIGKILL)


@needs_fuse
@needs_bwrap
def test_stop_ends_a_tsh_tool_that_ignores_int_hup_and_term_with_its_children(coder):
    """A-1, docs/tools.md ("ctxterm first ends the tool calls still running (SIGINT …, SIGHUP
    …, a tool still running two seconds after that … is killed with its group"): ``ctx agent
    stop`` while a tool typed at tsh and its child ignore all three returns 0, and nothing of
    the call or the terminal is left."""
    term = coder.start()
    mark = marker()
    try:
        client = Raw(term.listening_at, b"attach\n")
        try:
            assert client.shows(AGENT_PROMPT), client.text()
            cmd = IGNORING_ALL.format(mark=mark)
            client.type(f"shell.exec '{json.dumps({'cmd': cmd})}'")
            assert wait_for(lambda: len(sleepers(mark)) == 2, WAIT), client.text()
            family = family_of(coder, term)
            stopped = coder.ctx("agent", "stop", "coder", "--session", term.session)
            coder.started.remove(term.session)
        finally:
            client.close()
        assert stopped.rc == 0, stopped
        assert sleepers(mark) == []
        assert_nothing_left_of(coder, family)
    finally:
        for pid in sleepers(mark):
            os.kill(pid, signal.SIGKILL)


@needs_fuse
@needs_bwrap
def test_exit_in_tsh_ends_the_terminal_and_leaves_nothing_of_it(coder):
    """A-1, docs/tools.md "The agent terminal" ("When tsh exits … ctxterm … unmounts the view
    and removes its sockets, the symlink … and the directories its start made"): ``exit 3``
    typed at tsh ends ctxterm with everything it started; ``ctx agent stop`` then finds no
    terminal (``ENOENT``, exit 1)."""
    term = coder.start()
    family = family_of(coder, term)
    client = Raw(term.listening_at, b"attach\n")
    try:
        assert client.shows(AGENT_PROMPT), client.text()
        client.type("exit 3")
        assert client.eof.wait(WAIT), client.text()
    finally:
        client.close()
    assert none_alive([family.ctxterm]), "ctxterm still runs after exit"
    coder.started.remove(term.session)
    assert_nothing_left_of(coder, family)
    again = coder.ctx("agent", "stop", "coder", "--session", term.session)
    assert again.rc == 1 and "ENOENT" in again.err, again


@needs_fuse
@needs_bwrap
def test_a_killed_terminal_is_cleaned_by_the_next_start_which_leaves_one_of_each(coder):
    """docs/tools.md "A terminal that was killed" ("Its next ``ctx agent stop`` or ``ctx
    agent start`` cleans up after it: it ends the view's mount process …, removes the sockets,
    the pid file, the link …, the start with a ``ctx: warning: the terminal of … had ended
    without cleaning up`` line"): after ``kill -9`` of ctxterm, a new start warns, the killed
    terminal's processes (view's mount, sandbox, tsh) are gone and one view is mounted; its
    stop then leaves nothing."""
    term = coder.start()
    first = family_of(coder, term)
    os.kill(first.ctxterm, signal.SIGKILL)
    assert wait_for(lambda: not alive(first.ctxterm), WAIT)
    again = coder.ctx("agent", "start", "coder", "--session", term.session, cwd=coder.ws)
    assert again.rc == 0, again
    assert "had ended without cleaning up" in again.err, again
    assert none_alive(first.pids), living(first.pids)
    assert len(mounts_under(str(first.rundir))) == 1, mounts_under(str(first.rundir))
    second = family_of(coder, term)
    assert second.ctxterm != first.ctxterm
    coder.stop(term.session)
    assert_nothing_left_of(coder, second)


@needs_fuse
@needs_bwrap
def test_a_terminal_whose_view_process_died_is_stopped_with_nothing_left(coder):
    """docs/tools.md "A terminal that was killed" (a stop "ends the view's mount process
    (which unmounts the view; a view whose process is gone is unmounted as ``ctx umount``
    would)"): the view's mount process of a running terminal is SIGKILLed; ``ctx agent stop``
    still returns 0, and leaves no process, no mount and no runtime directory."""
    term = coder.start()
    family = family_of(coder, term)
    views = [c for c in children(family.ctxterm) if b"\0mount\0" in cmdline(c)]
    assert len(views) == 1, [cmdline(c) for c in children(family.ctxterm)]
    os.kill(views[0], signal.SIGKILL)
    assert wait_for(lambda: not alive(views[0]), WAIT)
    coder.stop(term.session)
    assert_nothing_left_of(coder, family)


@needs_fuse
@needs_bwrap
def test_a_start_interrupted_by_ctrl_c_leaves_a_terminal_that_stop_ends_entirely(coder):
    """A-1, docs/tools.md "The agent terminal" (silent on a start that is interrupted; this
    is what it does today): Ctrl-C to ``ctx agent start`` once the terminal's daemon has begun
    (its view is being mounted) ends the command (exit 130, ``EINTR`` on stderr), while the
    terminal, in a session of its own, comes up all the same; ``ctx agent stop`` then ends it
    and nothing of it is left."""
    session = f"i{uuid.uuid4().hex[:10]}"
    argv = [*CTX_ARGV, "agent", "start", "coder", "--session", session]
    where = f"/{session}/".encode()

    def view_being_mounted() -> bool:
        return any(b"--as\0coder" in cmdline(p) for p in processes_naming(where))

    coder.started.append(session)  # stopped at the end, whatever happens here
    with started(argv, env=coder.env, cwd=coder.ws) as proc:
        assert wait_for(view_being_mounted, WAIT), proc.poll()
        proc.send_signal(signal.SIGINT)
        _, err = finished_popen(proc)
    assert proc.returncode in (0, 130), err  # 0: the start had just completed
    if proc.returncode == 130:
        assert "EINTR" in err and "Traceback" not in err, err
    link = coder.session_dir(session) / "terminal" / "main.sock"

    def ready() -> bool:  # its socket linked and its pid recorded
        return os.path.exists(link) and Path(os.path.realpath(link)).with_name("pid").exists()

    assert wait_for(ready, WAIT), "the terminal did not come up"
    term = Term(session, link, Path(os.path.realpath(link)))
    family = family_of(coder, term)
    stopped = coder.ctx("agent", "stop", "coder", "--session", session)
    coder.started.remove(session)
    assert stopped.rc == 0 and "stopped coder" in stopped.out, stopped
    assert_nothing_left_of(coder, family)


# ------------------------------------------------------------------------------ MCP


def stubborn_mcp(world: World, mark: str) -> tuple[Path, Path]:
    """The stubborn server's program and configuration (server ``st``) in ``mcp/``, its
    report in ``out/``; the configuration and the report's path."""
    server = world.mcp / "stubborn.py"
    server.write_text(STUBBORN_SERVER)
    server.chmod(0o644)
    report = world.out / f"server-{mark}.json"
    config = world.mcp / "mcp.json"
    entry = {"command": str(PYTHON), "args": [str(server), mark, str(report)]}
    config.write_text(json.dumps({"mcpServers": {"st": entry}}))
    config.chmod(0o644)
    return config, report


def mcp_agent(world: World, config: Path) -> None:
    """Tools ``st.go`` and ``st.hang`` (MCP-backed, server ``st``) in the system tier, and
    agent ``mc`` that mounts ``mcp/`` read-only and may run both (P-6, M-4)."""
    for tool in ("go", "hang"):
        manifest = world.top / "manifests" / f"st.{tool}.json"
        manifest.parent.mkdir(exist_ok=True)
        document = {
            "manifest": 2, "kind": "tool", "name": f"st.{tool}",
            "description": f"The stubborn server's {tool}.", "schema": {"type": "object"},
            "cap": {"side_effects": True, "network": False},
            "mcp": {"transport": "stdio", "config": str(config), "server": "st", "tool": tool},
        }  # fmt: skip
        manifest.write_text(json.dumps(document))
        installed = world.ctx("object", "install", manifest, "--tier", "system")
        assert installed.rc == 0, installed
    request = {"name": "mc", "label": "mc_t", "tools": ["st.go", "st.hang"],
               "mount": [[str(world.mcp), str(world.mcp), "ro"]]}  # fmt: skip
    made = world.ctx("agent", "create", "-", input=json.dumps(request))
    assert made.rc == 0, made
    for tool in ("st.go", "st.hang"):
        with (world.storage / "tool" / f"{tool}.d" / "policy").open("a") as rules:
            rules.write(f"allow mc_t tool:{tool} execute\n")


def test_a_bridged_call_leaves_no_server_or_server_child_and_hands_it_only_its_pipes(world):
    """M-4, docs/tools.md MCP ("starts that server in the call's own process group (the
    runner's timeout kills both)"), "Process group and bounds": an MCP-backed tool whose
    server ignores SIGTERM, SIGHUP and the end of its input, and has started a child, returns
    its answer; then neither the server nor its child runs, and the server held descriptors
    0, 1 and 2 only."""
    mark = world.mark()
    config, report = stubborn_mcp(world, mark)
    mcp_agent(world, config)
    ran = world.ctx("run", "--agent", "mc", "--native", "st.go", input="{}")
    assert ran.rc == 0 and frames(ran.out)[-1]["output"]["content"][0]["text"] == "went", ran
    seen = json.loads(report.read_text())
    assert set(seen["fds"]) == STANDARD, seen
    assert wait_for(lambda: living([seen["pid"], seen["child"]]) == [], 2), seen
    assert sleepers(mark) == []


def test_a_bridged_call_sigkilled_while_its_server_hangs_leaves_no_server(world):
    """I-4, M-4, docs/tools.md "Process group and bounds": ``ctx run --native`` of an
    MCP-backed tool whose server never answers, SIGKILLed, leaves neither the bridge, the
    server nor the server's child."""
    mark = world.mark()
    config, report = stubborn_mcp(world, mark)
    mcp_agent(world, config)
    argv = [*CTX_ARGV, "run", "--agent", "mc", "--native", "st.hang"]
    with started(argv, "{}", env=world.env) as proc:
        assert wait_for(report.exists, WAIT), proc.poll()
        seen = json.loads(report.read_text())
        assert wait_for(lambda: seen["pid"] in descendants(proc.pid), WAIT)
        family = descendants(proc.pid)
        proc.kill()
        proc.wait()
    assert none_alive([*family, seen["child"]]), living([*family, seen["child"]])
    assert sleepers(mark) == []


def test_ctxmcp_list_leaves_no_stubborn_server_or_its_child(world):
    """M-1, docs/tools.md MCP (ctxmcp "starts one explicitly chosen stdio server … and
    either lists its tools or projects them"): ``ctxmcp list`` of a server that ignores
    SIGTERM, SIGHUP and the end of its input, and started a child, lists its two tools and
    exits 0; then neither the server nor its child runs, and the server held descriptors 0,
    1 and 2 only."""
    mark = world.mark()
    config, report = stubborn_mcp(world, mark)
    listed = subprocess.run([str(CTXMCP), "list", "--config", str(config), "--server", "st",
                             "--json"], capture_output=True, text=True, timeout=60,
                            env=world.env)  # fmt: skip
    assert listed.returncode == 0, listed
    assert {"st.go", "st.hang"} <= set(listed.stdout.replace('"', " ").split()), listed.stdout
    seen = json.loads(report.read_text())
    assert set(seen["fds"]) == STANDARD, seen
    assert wait_for(lambda: living([seen["pid"], seen["child"]]) == [], 2), seen


# ------------------------------------------------------------------------------ mounts


def start_mount(world: World, where: Path, *args: str) -> subprocess.Popen:
    where.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [*CTX_ARGV, "mount", *args, str(where)],
        env=world.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    assert wait_for(lambda: mounted_at(where) or proc.poll() is not None, WAIT)
    assert mounted_at(where), proc.communicate()[1]
    return proc


@needs_fuse
@pytest.mark.parametrize("view", ["host", "agent"])
def test_a_mount_hung_up_unmounts_and_exits_0_leaving_no_process(world, view):
    """F-1, docs/mount.md ("until SIGTERM, SIGINT or SIGHUP (the terminal it was started from
    closed); either way it unmounts cleanly and exits 0"): SIGHUP to ``ctx mount`` of the
    host's view or of ``--as ci`` ends it with exit 0, the mount point empty and unmounted,
    and no process of it left."""
    where = world.top / "mnt"
    args = ("--as", AGENT) if view == "agent" else ()
    mount = start_mount(world, where, *args)
    family = [mount.pid, *descendants(mount.pid)]
    try:
        os.listdir(where / "tool")
        mount.send_signal(signal.SIGHUP)
        _, err = mount.communicate(timeout=30)
    finally:
        if mount.poll() is None:
            mount.kill()
            mount.wait()
    assert mount.returncode == 0, err
    assert not mounted_at(where)
    assert os.listdir(where) == []
    assert none_alive(family, 3)
    assert processes_naming(str(where).encode()) == []


@needs_fuse
def test_an_agent_mount_sigkilled_is_removed_by_umount_with_nothing_left(world):
    """F-1, docs/mount.md (``ctx umount`` "also removes a mount whose process was killed"):
    a ``ctx mount --as ci`` SIGKILLed leaves its mount (``ENOTCONN``), which ``ctx umount``
    removes; then no mount and no process of it is left, and the storage root holds no
    socket, pid or lock file."""
    where = world.top / "mnt"
    mount = start_mount(world, where, "--as", AGENT)
    family = [mount.pid, *descendants(mount.pid)]
    mount.kill()
    mount.wait()
    assert mounted_at(where)
    with pytest.raises(OSError):
        os.listdir(where)
    gone = world.ctx("umount", where)
    assert gone.rc == 0, gone
    assert not mounted_at(where)
    assert none_alive(family, 3)
    assert processes_naming(str(where).encode()) == []
    assert debris(world.storage) == []


@needs_fuse
def test_a_serving_mount_starts_no_process_and_leaves_the_storage_root_as_it_was(world):
    """F-1, docs/mount.md ("nothing is written to build" a view; ``ctx umount``): a mount
    that served reads, refused opens and writes in the agent's home starts no child process
    (so none can be left, nor a zombie), and after ``ctx umount`` ends it (exit 0) the storage
    root holds only what was written through it, no socket, pid, lock or temp file."""
    where = world.top / "mnt"
    before = {str(p.relative_to(world.storage)) for p in world.storage.rglob("*")}
    mount = start_mount(world, where)
    try:
        for _ in range(20):
            os.listdir(where / "tool")
            (where / "tool" / "fs.read.d" / "name").read_text()
            with contextlib.suppress(OSError):
                (where / "tool" / "no-such-tool").read_text()
        note = where / "shared" / "proj" / "note.txt"
        note.write_text("hello\n")
        assert children(mount.pid) == [] and zombies_under(mount.pid) == []
        gone = world.ctx("umount", where)
        assert gone.rc == 0, gone
        mount.wait(timeout=30)
    finally:
        if mount.poll() is None:
            mount.kill()
            mount.wait()
    assert mount.returncode == 0
    after = {str(p.relative_to(world.storage)) for p in world.storage.rglob("*")}
    assert after - before == {"shared/proj/note.txt"}, after - before
    assert debris(world.storage) == []
