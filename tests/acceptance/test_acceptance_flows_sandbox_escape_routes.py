"""Routes out of an agent's confinement, tried by its own tool (SPEC §5 P-1..P-5, §6 T-3, T-5,
§7 H-1..H-4, §8 A-1..A-4, §13 F-1; docs/tools.md "The agent terminal", "Running a tool",
"Identity", "Network", "Process group and bounds", "Hooks"; docs/sessions.md "Appending,
crash-safely"; docs/policy.md "Host-owned controls").

Agent ``coder`` (uid ``nobody``) is granted one probe tool.  Run through ``ctx run`` in terminal
and native mode, by a worker (``ctx queue work``) and typed at tsh in the agent's terminal, the
probe tries every known way out: the storage root's controls, logs and other homes read or
written directly, through ``/proc/self/fd``, ``/proc/<pid>/cwd`` and ``root`` and
``/proc/1/root``; ptrace, ``pidfd_getfd``, ``/proc`` and signals against the runner, the
worker, the call guard, the terminal server, its sandbox and its view's mount process;
the terminal's watch and run sockets and the host's abstract UNIX sockets; keystrokes pushed
into a terminal (TIOCSTI) and a terminal kept after the call; descriptors inherited from the
caller; setuid programs against a view's mount; processes that outlive the call; and links
planted (and swapped while calls run) where the host writes the agent's records or reads a
tool's controls.  Each attempt must be refused by the kernel or by the product (``EACCES``,
``EPERM``, ``ELOOP``…), nothing outside the agent's rights may change, and every call still
ends with one recorded result."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import select
import shlex
import shutil
import signal
import socket
import subprocess
import termios
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    alive,
    mounted_at,
    needs_fuse_as_root,
    read_jsonl,
    scratch_top,
    serving,
    snapshot,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, CoderHost, Raw, Term, coder_host, tsh_of
from tests.support.users import users_named

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="agent terminals need bubblewrap"),
    needs_fuse_as_root,
]

SCRATCH = scratch_top(__file__)
CTX = CTX_ARGV[0]
TOOLS = ["probe", "held.back", "ut"]  # the agent's request: held.back and ut are not runnable
PROBE_CONTEXTS = ["run", "native", "worker", "tsh"]
REFUSED_PROC = {
    "signal": "EPERM",
    "ptrace": "EPERM",
    "pidfd_getfd": "EPERM",
    "environ": "EACCES",
    "mem": "EACCES",
    "cwd": "EACCES",
    "root": "EACCES",
    "fd": "EACCES",
}


# The probe: one action per call, its answer one JSON object on stdout, which also names the
# call (CTX_CALL) and session (CTX_SESSION) it ran in.  Run as the agent's uid.
PROBE = r'''
import ctypes, errno, json, os, signal, socket, sys, time

libc = ctypes.CDLL(None, use_errno=True)
PTRACE_SEIZE, SYS_PIDFD_OPEN, SYS_PIDFD_GETFD = 0x4206, 434, 438
AT_FDCWD, RENAME_EXCHANGE = -100, 2


def name(e):
    return errno.errorcode.get(e.errno, str(e.errno))


def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return name(e)


def checked(result):
    if result < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return result


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def children_of(pid):
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if parent_of(int(entry)) == pid:
                    found.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return found


def seize(pid):
    checked(libc.ptrace(PTRACE_SEIZE, pid, 0, 0))


def steal(pid):
    pidfd = checked(libc.syscall(SYS_PIDFD_OPEN, pid, 0))
    try:
        checked(libc.syscall(SYS_PIDFD_GETFD, pidfd, 0, 0))
    finally:
        os.close(pidfd)


def routes(pid):
    p = f"/proc/{pid}"
    return {
        "signal": attempt(lambda: os.kill(pid, 0)),
        "ptrace": attempt(lambda: seize(pid)),
        "pidfd_getfd": attempt(lambda: steal(pid)),
        "environ": attempt(lambda: open(p + "/environ", "rb").read(1)),
        "mem": attempt(lambda: open(p + "/mem", "rb").close()),
        "cwd": attempt(lambda: os.listdir(p + "/cwd")),
        "root": attempt(lambda: os.listdir(p + "/root")),
        "fd": attempt(lambda: os.listdir(p + "/fd")),
    }


def do_fds(args):
    fds = {}
    for entry in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:
            continue
        if not (target.startswith("/proc/") and target.endswith("/fd")):
            fds[entry] = target
    beyond = []
    for fd in range(3, 1024):
        try:
            os.fstat(fd)
            beyond.append(fd)
        except OSError:
            pass
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapAmb"):
                status[key] = value.split()
    return {"fds": fds, "beyond": beyond, "status": status}


def do_procs(args):
    me, parent = os.getpid(), os.getppid()
    targets = {"parent": parent, "grandparent": parent_of(parent), "init": 1}
    for pid in children_of(parent):
        if pid != me:
            targets[f"sibling-{pid}"] = pid
    for arg in args:
        label, _, pid = arg.partition("=")
        targets[label] = int(pid)
    out = {}
    for label, pid in targets.items():
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        out[label] = {"pid": pid, "uid": uid, **routes(pid)}
    return {"procs": out}


def do_signal(args):
    sig = getattr(signal, args[0])
    return {"signal": {a: attempt(lambda a=a: os.kill(os.getppid() if a == "parent" else int(a),
                                                       sig)) for a in args[1:]}}


def do_tiocsti(args):
    import fcntl, termios
    text = " ".join(args) + "\n"
    out = {}
    for how in ("fd0", "devtty"):
        try:
            fd = 0 if how == "fd0" else os.open("/dev/tty", os.O_RDWR)
        except OSError as e:
            out[how] = name(e)
            continue
        try:
            for ch in text:
                fcntl.ioctl(fd, termios.TIOCSTI, ch.encode())
            out[how] = "ok"
            break
        except OSError as e:
            out[how] = name(e)
    return {"tiocsti": out}


def connect(sock, path):
    if path.startswith("@"):
        sock.connect("\0" + path[1:])
    elif len(os.fsencode(path)) > 107:
        d = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
        try:
            sock.connect(f"/proc/self/fd/{d}/{os.path.basename(path)}")
        finally:
            os.close(d)
    else:
        sock.connect(path)


def do_connect(args):
    typed, out = args[0], {}
    for spec in args[1:]:
        mode, _, path = spec.partition("=")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            connect(s, path)
        except OSError as e:
            out[spec] = name(e)
            continue
        data = b""
        try:
            s.sendall(mode.encode() + b"\n" + typed.encode() + b"\r")
            while len(data) < 65536:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        s.close()
        out[spec] = "connected: " + data.decode("utf-8", "replace")
    return {"connect": out}


def do_files(args):
    out = {}
    for arg in args:
        how, _, path = arg.partition(":")
        if how == "r":
            fn = lambda: os.listdir(path) if os.path.isdir(path) else open(path, "rb").read(1)
        elif how == "w":
            fn = lambda: os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        elif how == "c":
            fn = lambda: os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
        else:  # "fdw": through a descriptor of its directory, /proc/self/fd/N/NAME
            def fn():
                d = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY)
                try:
                    where = f"/proc/self/fd/{d}/{os.path.basename(path)}"
                    os.close(os.open(where, os.O_WRONLY | os.O_APPEND))
                finally:
                    os.close(d)
        out[arg] = attempt(fn)
    return {"files": out}


def daemon(body, setsid=True, pgid=False):
    """Run body() in a grandchild (its own session with setsid; its own group with pgid)."""
    if os.fork() == 0:
        if setsid:
            os.setsid()
        elif pgid:
            os.setpgid(0, 0)
        if os.fork() == 0:
            try:
                body()
            finally:
                os._exit(0)
        os._exit(0)
    os.wait()


def write_pid(path):
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)


def quiet():
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def do_spawn(args):
    mode, pidfile = args

    def body():
        quiet()
        write_pid(pidfile)
        time.sleep(60)

    daemon(body, setsid=mode == "setsid", pgid=mode == "setpgid")
    return {"spawn": mode}


def do_keep(args):
    out_path, delay = args[0], float(args[1])

    def body():
        write_pid(out_path + ".pid")
        null = os.open("/dev/null", os.O_RDWR)
        os.dup2(null, 1)
        os.dup2(null, 2)
        time.sleep(delay)
        try:
            got = os.read(0, 256).decode("utf-8", "replace")
        except OSError as e:
            got = "error:" + name(e)
        with open(out_path, "w") as f:
            f.write(got)

    daemon(body)
    return {"keep": "started"}


def do_link(args):
    target, path = args
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, path)
    return {"link": os.readlink(path)}


def do_relink(args):
    path, target = args
    os.rename(path, path + ".moved")
    os.symlink(target, path)
    return {"relink": os.readlink(path)}


def do_swap(args):
    path, target, seconds, report = args[0], args[1], float(args[2]), args[3]

    def body():
        quiet()
        write_pid(report + ".pid")
        other = path + ".other"
        os.symlink(target, other)
        flips, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            checked(libc.renameat2(AT_FDCWD, path.encode(), AT_FDCWD, other.encode(),
                                   RENAME_EXCHANGE))
            flips += 1
            time.sleep(0.0005)
        if flips % 2:
            checked(libc.renameat2(AT_FDCWD, path.encode(), AT_FDCWD, other.encode(),
                                   RENAME_EXCHANGE))
        with open(report, "w") as f:
            f.write(str(flips))

    daemon(body)
    return {"swap": "started"}


def do_append(args):
    path, line = args
    return {"append": attempt(lambda: os.write(os.open(path, os.O_WRONLY | os.O_APPEND),
                                               line.encode() + b"\n"))}


def do_setuid(args):
    import subprocess
    view = args[0]
    out = {}
    for label, argv in (("su", ["su", "-c", "id -u", "root"]),
                        ("mount", ["mount", "--bind", "/tmp", view]),
                        ("umount", ["umount", "-l", view]),
                        ("fusermount3", ["fusermount3", "-u", "-z", view])):
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=20)
            out[label] = [done.returncode, done.stdout.decode("utf-8", "replace").strip()]
        except (OSError, subprocess.TimeoutExpired) as e:
            out[label] = [None, str(e)]
    return {"setuid": out, "euid": os.geteuid()}


ACTIONS = {"fds": do_fds, "procs": do_procs, "signal": do_signal, "tiocsti": do_tiocsti,
           "connect": do_connect, "files": do_files, "spawn": do_spawn, "keep": do_keep,
           "link": do_link, "relink": do_relink, "swap": do_swap, "append": do_append,
           "setuid": do_setuid}

argv = sys.argv[1:] or json.loads(sys.stdin.read() or "{}").get("argv", [])
answer = ACTIONS[argv[0]](argv[1:])
answer["ctx"] = {"call": os.environ.get("CTX_CALL"), "session": os.environ.get("CTX_SESSION")}
print(json.dumps(answer, sort_keys=True), flush=True)
'''


@dataclass
class Called:
    """One call of the probe: what it answered, the exit status of ``ctx`` (None in tsh), the
    call id and the session it ran in."""

    out: dict
    rc: int | None
    call: str
    session: str


@dataclass
class World:
    host: CoderHost
    term: Term  # the terminal the tests type into one after the other
    typist: Raw
    box: Path  # every uid may write here: pid files and markers of the probe's daemons
    victim_home: Path  # another agent's home (another uid)
    project: str

    @property
    def storage(self) -> Path:
        return self.host.storage

    def session_dir(self, session: str) -> Path:
        return self.host.session_dir(session)

    def call(self, context: str, *args: str, extra_fds: tuple[int, ...] = ()) -> Called:
        """The probe with ``args``, run in ``context``."""
        session = f"s{uuid.uuid4().hex[:10]}"
        if context == "tsh":
            shown = self.typist.answer("probe " + shlex.join(args), 30)
            out = json.loads([line for line in shown.splitlines() if line.startswith("{")][-1])
            return Called(out, None, out["ctx"]["call"], out["ctx"]["session"])
        if context == "worker":
            return self.by_worker(session, list(args), extra_fds)
        native = ["--native"] if context == "native" else []
        argv = [CTX, "run", "--agent", "coder", "--session", session, "--timeout", "60",
                *native, "probe", *([] if native else args)]  # fmt: skip
        stdin = json.dumps({"argv": list(args)}).encode() if native else b""
        done = subprocess.run(argv, input=stdin, capture_output=True, env=self.host.env,
                              pass_fds=extra_fds, timeout=90)  # fmt: skip
        lines = done.stdout.decode().splitlines()
        assert lines, (done.returncode, done.stderr)
        if native:
            frame = json.loads(lines[-1])
            assert frame["type"] == "result" and frame["status"] == "ok", frame
            out = frame["output"]
        else:
            out = json.loads(lines[-1])
        return Called(out, done.returncode, out["ctx"]["call"], session)

    def by_worker(self, session: str, args: list[str], extra_fds=(), job: str = "") -> Called:
        job = self.publish(args, job)
        self.work(session, extra_fds)
        result = self.result_of(job)
        assert result["status"] == "ok", result
        return Called(result["output"], 0, result["call"], session)

    def publish(self, args: list[str], job: str = "") -> str:
        request = {"tool": "probe", "input": {"argv": args}, "from": "tester",
                   "created": "2026-06-22T12:00:00Z"}  # fmt: skip
        named = ["--name", job] if job else []
        r = self.host.ctx("queue", "publish", "--project", self.project, *named, "-",
                          input=json.dumps(request))  # fmt: skip
        assert r.rc == 0, r
        return r.out.strip()

    def work(self, session: str, extra_fds=()) -> subprocess.CompletedProcess:
        argv = [CTX, "queue", "work", "--project", self.project, "--agent", "coder",
                "--session", session, "--drain"]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, env=self.host.env,
                              pass_fds=extra_fds, timeout=90)  # fmt: skip
        return done

    @property
    def queue(self) -> Path:
        return self.storage / "shared" / self.project / "queue"

    def result_of(self, job: str) -> dict:
        for state in ("done", "failed"):
            path = self.queue / state / f"{job}.result"
            if path.exists():
                return json.loads(path.read_text())
        raise AssertionError(f"{job} has no result: {sorted(os.listdir(self.queue / 'pending'))}")

    def recorded_once(self, called: Called, tool: str = "probe") -> dict:
        """The call's ``tool_call`` and ``tool_result`` in its session, one each, and its one
        line in the tool's log (S-2, T-7); the session's ``tool_result``."""
        events = self.session_dir(called.session) / "events.jsonl"

        def mine() -> list[dict]:
            return [e for e in read_jsonl(events) if e.get("call") == called.call]

        wait_for(lambda: len(mine()) >= 2, 10)
        assert [e["type"] for e in mine()] == ["tool_call", "tool_result"], mine()
        log = self.storage / "tool" / f"{tool}.d" / "log"
        logged = [e for e in read_jsonl(log) if e.get("call") == called.call]
        assert [e["type"] for e in logged] == ["tool_result"], logged
        return mine()[-1]

    def pids_of(self, term: Term) -> dict[str, int]:
        """The host processes of ``term``: ctxterm (its pid file), what it started (the view's
        mount process, bubblewrap) and tsh."""
        server = int((term.rundir / "pid").read_text())
        found = {"ctxterm": server, "tsh": tsh_of(term.session)}
        for entry in filter(str.isdigit, os.listdir("/proc")):
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == server:
                    command = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                    found[f"child-{os.path.basename(command[0].decode())}-{entry}"] = int(entry)
        return found

    def controls(self) -> dict:
        """The agent's and the tools' controls, logs aside (calls append to those)."""
        tree = {}
        for top in ("agent", "tool"):
            for rel, entry in snapshot(self.storage / top).items():
                if not rel.endswith("/log") and rel != "log":
                    tree[f"{top}/{rel}"] = entry
        return tree


def kill_daemons(box: Path) -> None:
    """End what the probe left running (the pid files it wrote in ``box``): a pid is signalled
    only while it is still the probe's process, never another that took its number."""
    for pidfile in [*box.glob("**/*.pid"), *box.glob("**/pid-*")]:
        with contextlib.suppress(ValueError, OSError):
            pid = int(pidfile.read_text())
            if b"probe.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    """Agent ``coder`` (uid nobody) granted ``probe`` in both layers of P-6 (``held.back`` and
    ``ut`` only in its own policy), queue ``esc``, agent ``victim`` of another uid with one
    call in its home, and one running terminal of coder with an attached client."""
    with coder_host(_template, SCRATCH, TOOLS, {"notes.txt": "data\n"}) as host:
        box = host.top / "box"
        box.mkdir()
        box.chmod(0o1777)
        probe = host.top / "probe.py"
        probe.write_text(PROBE)
        probe.chmod(0o644)
        host.install("probe", f'#!/bin/sh\nexec python3 {probe} "$@"\n')
        host.install("held.back", f"#!/bin/sh\ntouch {box}/held-back-ran\n")
        host.grant_in_tool("probe")
        made = host.ctx("queue", "init", "--project", "esc")
        assert made.rc == 0, made
        (victim,) = users_named("ctxtest")
        request = {"name": "victim", "label": "victim_t", "tools": ["held.back"]}
        made = host.ctx("agent", "create", "-", "--user", victim.name, input=json.dumps(request))
        assert made.rc == 0, made
        seen = host.ctx("run", "--agent", "victim", "held.back")  # refused, still recorded
        assert seen.rc == 126, seen
        victim_home = host.storage / "home" / str(victim.uid)
        term = host.start()
        typist = Raw(term.listening_at, b"attach\n")
        try:
            assert typist.shows(AGENT_PROMPT), typist.text()
            yield World(host, term, typist, box, victim_home, "esc")
        finally:
            typist.close()
            kill_daemons(box)


@pytest.fixture
def box(world: World) -> Iterator[Path]:
    """A directory of this test's own in the box; the probe's daemons in it ended afterwards."""
    mine = world.box / uuid.uuid4().hex[:8]
    mine.mkdir()
    mine.chmod(0o1777)
    try:
        yield mine
    finally:
        kill_daemons(mine)


@contextlib.contextmanager
def own_terminal(world: World) -> Iterator[tuple[Term, Raw]]:
    """A terminal of coder for one test (which may break it), with an attached client;
    stopped (if still running) at the end."""
    term = world.host.start()
    typist = Raw(term.listening_at, b"attach\n")
    try:
        assert typist.shows(AGENT_PROMPT), typist.text()
        yield term, typist
    finally:
        typist.close()
        if term.session in world.host.started:
            stopped = world.host.ctx("agent", "stop", "coder", "--session", term.session)
            if stopped.rc == 0:  # else the host's own end stops it
                world.host.started.remove(term.session)


def run_on_a_terminal(
    script: str, env: dict[str, str], typed: bytes, after: bytes, seconds: float = 30
) -> str:
    """``sh -c SCRIPT`` leading a session of its own on a new pseudo-terminal (its controlling
    terminal), as a shell an administrator types in; ``typed`` is typed on that terminal once
    the output shows ``after``.  Everything the terminal showed."""
    master, slave = os.openpty()

    def controlling_terminal() -> None:
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(["/bin/sh", "-c", script], stdin=slave, stdout=slave, stderr=slave,
                            env=env, start_new_session=True,
                            preexec_fn=controlling_terminal)  # fmt: skip
    os.close(slave)
    shown, sent = b"", False
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the shell and all it started let go of the terminal
                    break
                if not chunk:
                    break
                shown += chunk
            if not sent and after in shown:
                time.sleep(0.3)
                os.write(master, typed)
                sent = True
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        os.close(master)
    return shown.decode("utf-8", "replace").replace("\r\n", "\n")


def proc_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


# ----------------------------------------------------------- descriptors and credentials


@pytest.mark.parametrize("context", PROBE_CONTEXTS)
def test_a_tool_holds_only_its_three_streams_and_the_agents_bare_credentials(
    world: World, context: str, tmp_path: Path
) -> None:
    """T-3, T-5, docs/tools.md "Identity" and "Process group and bounds": whatever its caller
    holds open (here a pipe's write end and an O_APPEND file handed to ``ctx run`` and to the
    worker), the tool has descriptors 0, 1 and 2 only — in tsh the PTY — every other number up
    to 1023 is EBADF; it runs as the agent's uid, gid and groups with no capability in any
    set; and the call is recorded once."""
    reader, writer = os.pipe()
    kept = os.open(tmp_path / "kept", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        called = world.call(context, "fds", extra_fds=(writer, kept))
    finally:
        for fd in (reader, writer, kept):
            os.close(fd)
    out = called.out
    assert sorted(out["fds"], key=int) == ["0", "1", "2"], out
    assert out["beyond"] == [], out
    if context == "tsh":
        assert {target.startswith("/dev/pts/") for target in out["fds"].values()} == {True}, out
    assert str(tmp_path) not in json.dumps(out["fds"]), out
    identity = json.loads((world.storage / "agent" / "coder.d" / "identity").read_text())
    status = out["status"]
    assert (
        status["Uid"] == [str(identity["uid"])] * 4 and status["Gid"] == [str(identity["gid"])] * 4
    ), status
    assert sorted(map(int, status["Groups"])) == sorted(identity["groups"]), status
    for caps in ("CapInh", "CapPrm", "CapEff", "CapAmb"):
        assert int(status[caps][0], 16) == 0, (caps, status)
    world.recorded_once(called)


# ------------------------------------------------------------------- the host's processes


@pytest.mark.parametrize("context", PROBE_CONTEXTS)
def test_the_runner_worker_guard_and_terminal_processes_are_out_of_reach(
    world: World, context: str
) -> None:
    """P-5 step 1, T-5, docs/tools.md "Identity" and "the run socket" (tsh is undumpable):
    from its tool the agent's uid may not signal (kill -0), ptrace (PTRACE_SEIZE), take a
    descriptor of (pidfd_getfd), or open ``environ``, ``mem``, ``cwd``, ``root`` or ``fd``
    of the process that runs it (``ctx run``, the worker, the terminal's runner), its parent,
    the call's guard beside it, pid 1 and, in a terminal, ctxterm, the view's mount process,
    bubblewrap; of its own tsh, whose uid it shares, it may read nothing in ``/proc`` and
    may not trace it.  The terminal's processes are all still running afterwards."""
    given = world.pids_of(world.term) if context == "tsh" else {}
    called = world.call(context, "procs", *(f"{k}={v}" for k, v in given.items()))
    procs = called.out["procs"]
    assert {"parent", "grandparent", "init"} <= set(procs), procs
    assert any(label.startswith("sibling-") for label in procs), procs  # the call's guard
    for label, seen in procs.items():
        routes = {k: seen[k] for k in REFUSED_PROC}
        if label == "tsh":
            routes.pop("signal")  # its own uid: the kernel lets it signal (see the flows below)
            assert seen["uid"] == world.host.uid, seen
        else:
            assert seen["uid"] == 0, (label, seen)
        assert routes == {k: REFUSED_PROC[k] for k in routes}, (label, seen)
    if context == "tsh":
        assert set(given) <= set(procs), (given, procs)
        assert all(alive(pid) for pid in given.values()), given
    world.recorded_once(called)


@pytest.mark.parametrize("context", ["native", "worker", "tsh"])
def test_sigcont_to_the_process_that_runs_the_tool_is_refused(world: World, context: str):
    """P-5 step 1, T-5: SIGCONT, which the kernel lets any process of one session send to
    another, is refused too: the tool is in a session of its own, not its runner's."""
    called = world.call(context, "signal", "SIGCONT", "parent")
    assert called.out["signal"] == {"parent": "EPERM"}, called.out
    world.recorded_once(called)


@pytest.mark.xfail(
    strict=True,
    reason="T-5: a terminal-mode `ctx run` tool stays in its caller's session, so the agent's "
    "uid may SIGCONT root's runner and a job root stopped in that session (it runs again)",
)
def test_a_terminal_mode_tool_cannot_continue_a_job_root_stopped_in_its_callers_session(
    world: World, box: Path
) -> None:
    """T-5, P-5 step 1, docs/tools.md "Identity" (the tool's permission is its uid's, gid's and
    groups'): an administrator's shell holds a job it stopped (``kill -STOP``), then runs a
    tool of the agent in terminal mode.  The tool sends SIGCONT to that job and to ``ctx run``
    itself: both must be refused (EPERM), and the job must still be stopped afterwards."""
    pidfile, out = box / "stopped-job", box / "probe.out"
    script = (
        f"sleep 60 & echo $! > {pidfile}; kill -STOP $!; "
        f"{CTX} run --agent coder probe signal SIGCONT $(cat {pidfile}) parent > {out} 2>&1"
    )
    subprocess.run(["/bin/sh", "-c", script], env=world.host.env, start_new_session=True,
                   timeout=60)  # fmt: skip
    job = int(pidfile.read_text())
    try:
        state = proc_state(job)
        answer = json.loads(out.read_text().splitlines()[-1])
        assert answer["signal"] == {str(job): "EPERM", "parent": "EPERM"}, answer
        assert state == "T", f"the job root stopped is in state {state} after the tool's call"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(job, signal.SIGKILL)


# ------------------------------------------------------------ the storage root and /proc


@pytest.mark.parametrize("context", PROBE_CONTEXTS)
def test_controls_logs_and_other_homes_are_refused_directly_and_through_proc(
    world: World, context: str
) -> None:
    """T-1, T-7, S-3, S-6, P-5 step 2, docs/policy.md "Host-owned controls": the tool reads
    neither the tool's nor the agent's log, the install lock, another agent's home, nor the
    agent's policy through ``/proc/1/root``; it writes none of the agent's controls, the
    tool's policy, log, executable or hooks, tsh's config, nor a new entry in ``agent/``,
    ``tool/`` or ``home/``, whether by path or through ``/proc/self/fd/N`` of the directory
    it opened: every attempt is EACCES, the controls are byte for byte what they were, and the
    call is recorded once."""
    s = world.storage
    reads = [s / "tool/probe.d/log", s / "agent/coder.d/log", s / "tool/.install-lock"]
    reads += [world.victim_home / "agent", Path(f"/proc/1/root{s}/agent/coder.d/policy")]
    writes = [s / f"agent/coder.d/{name}" for name in ("policy", "identity", "mount", "label")]
    writes += [s / "tool/probe.d/policy", s / "tool/probe.d/log", s / "tool/probe",
               s / "tool/tsh.d/config"]  # fmt: skip
    creates = [s / "tool/probe.d/hooks/pre.d/00-mine", s / "agent/coder.d/extra",
               s / "tool/mine", s / "home/mine"]  # fmt: skip
    through_fd = [s / "agent/coder.d/policy", s / "tool/probe.d/policy"]
    args = [f"r:{p}" for p in reads] + [f"w:{p}" for p in writes]
    args += [f"c:{p}" for p in creates] + [f"fdw:{p}" for p in through_fd]
    before = world.controls()
    called = world.call(context, "files", *args)
    assert called.out["files"] == {arg: "EACCES" for arg in args}, called.out
    assert world.controls() == before
    for made in creates:
        assert not made.exists(), made
    world.recorded_once(called)


@pytest.mark.parametrize("context", ["native", "worker", "tsh"])
def test_the_hosts_abstract_unix_sockets_are_unreachable_without_network(
    world: World, context: str
) -> None:
    """P-4, docs/tools.md "Network": without ``network:default connect`` the tool runs in a
    network namespace of its own, so an abstract UNIX socket the host listens on (a desktop
    bus, a container runtime's) is not there for it: ECONNREFUSED, and the listener accepts
    nothing."""
    name = f"ctx-escape-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(8)
    listener.setblocking(False)
    try:
        called = world.call(context, "connect", "hello", f"hello=@{name}")
        assert called.out["connect"] == {f"hello=@{name}": "ECONNREFUSED"}, called.out
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    world.recorded_once(called)


@pytest.mark.parametrize("context", ["run", "worker", "tsh"])
def test_the_terminals_sockets_refuse_the_agents_uid_anything_but_watching(
    world: World, box: Path, context: str
) -> None:
    """A-2, H-2, docs/tools.md "the terminal socket" and "the run socket": the agent's own uid
    may watch its terminal but not attach — ``attach`` with a command line after it gets
    ``ctxterm: EACCES`` and nothing is typed (the granted tool on that line never runs, no
    call of it is recorded); the
    run socket is out of reach on the host (its 0700 directory) and through tsh's
    ``/proc/PID/root`` (tsh is undumpable): EACCES, nothing run."""
    term = world.term
    private = term.rundir / "private" / "run.sock"
    via_tsh = f"/proc/{tsh_of(term.session)}/root/run/ctx/run.sock"
    marker = box / "typed-through-the-socket"
    specs = [f"attach={term.listening_at}", f"attach={term.link}", f"run={private}",
             f"run={via_tsh}"]  # fmt: skip
    called = world.call(context, "connect", f"probe files c:{marker}", *specs)
    got = called.out["connect"]
    for spec in specs[:2]:
        assert got[spec].startswith("connected: ctxterm: EACCES: "), got
        assert "may not attach" in got[spec], got
    assert got[specs[2]] == "EACCES" and got[specs[3]] == "EACCES", got
    time.sleep(0.5)
    assert not marker.exists()
    typed = [e for e in world.host.calls(term.session, "probe")
             if str(marker) in json.dumps(e) and e["call"] != called.call]  # fmt: skip
    assert typed == [], typed
    world.recorded_once(called)


# ------------------------------------------------------------------ keystrokes (TIOCSTI)


@pytest.mark.parametrize("context", ["native", "worker"])
def test_a_tool_without_a_terminal_has_none_to_push_keystrokes_into(world: World, context):
    """T-3 (native mode and workers: input and output are pipes), T-5: TIOCSTI on standard
    input is ENOTTY, and there is no controlling terminal to open (``/dev/tty``: ENXIO)."""
    called = world.call(context, "tiocsti", "echo", "pushed")
    assert called.out["tiocsti"] == {"fd0": "ENOTTY", "devtty": "ENXIO"}, called.out
    world.recorded_once(called)


def test_a_tool_cannot_type_into_the_administrators_shell(world: World, box: Path) -> None:
    """T-5, T-3, docs/tools.md "Identity": an administrator types ``ctx run --agent coder
    probe`` at a root shell; the tool (uid nobody) pushes ``echo pwned`` into that terminal
    with TIOCSTI.  What the shell reads next must be what the administrator types, not the
    tool's line — which a root shell would run as root."""
    out = box / "probe.out"
    token = f"pwned-{uuid.uuid4().hex[:8]}"
    script = (
        f"{CTX} run --agent coder probe tiocsti echo {token} > {out} 2>&1; echo RC=$?; "
        'read -r line; echo "GOT:[$line]"'
    )
    shown = run_on_a_terminal(script, world.host.env, b"typed-by-root\n", b"RC=")
    got = re.findall(r"GOT:\[(.*)\]", shown)
    assert got == ["typed-by-root"], (shown, out.read_text() if out.exists() else None)


def test_a_tools_daemon_cannot_read_what_the_administrator_types_after_the_call(
    world: World, box: Path
) -> None:
    """T-5, T-3 (standard streams are lent for the call), docs/tools.md "Process group and
    bounds": a tool run from a root shell's terminal starts a daemon (setsid) that keeps its
    standard input and reads it a moment later, once ``ctx run`` has returned and the
    administrator types at the shell again.  The daemon must not get what root types."""
    stolen = box / "stolen"
    secret = f"root-secret-{uuid.uuid4().hex[:8]}"
    script = (
        f"{CTX} run --agent coder probe keep {stolen} 0.2 >/dev/null 2>&1; echo RC=$?; sleep 1.5"
    )
    run_on_a_terminal(script, world.host.env, secret.encode() + b"\n", b"RC=", seconds=10)
    wait_for(stolen.exists, 3)
    got = stolen.read_text() if stolen.exists() else ""
    assert secret not in got, got


def test_a_tool_typed_at_tsh_cannot_push_a_line_into_the_agents_terminal(world: World):
    """H-1, T-5, P-6, docs/tools.md "Identity": in the agent's own terminal a tool tries to
    push a line into its PTY (TIOCSTI), for tsh to read as if typed: the filter every tool
    under an agent's identity gets on a terminal refuses it (``EPERM``, on its standard input
    and on ``/dev/tty`` alike); nothing is read as typed, and ``held.back`` is neither run
    nor recorded."""
    with own_terminal(world) as (term, typist):
        said = json.loads(typist.answer("probe tiocsti held.back").strip().splitlines()[-1])
        assert said["tiocsti"] == {"fd0": "EPERM", "devtty": "EPERM"}, said
        prompts = typist.count(AGENT_PROMPT)
        assert not typist.shows(AGENT_PROMPT, prompts + 1, seconds=1), typist.text()[-800:]
        assert "held.back" not in typist.text().split(AGENT_PROMPT)[-1]
        probe = world.host.calls(term.session, "probe")
        assert [e["type"] for e in probe] == ["tool_call", "tool_result"], probe
        assert world.host.calls(term.session, "held.back") == []
        assert not (world.box / "held-back-ran").exists()


# -------------------------------------------------------------- setuid programs and mounts


def test_setuid_programs_neither_make_root_nor_touch_a_view_mount(world: World) -> None:
    """F-1, T-5, docs/tools.md "Identity" (no capability passed on): typed at tsh (the tools of
    a terminal run on the host, where setuid programs are not disarmed), the tool runs ``su``,
    ``mount``, ``umount`` and ``fusermount3`` (setuid root) against a ``ctx mount --as coder``
    view in a directory every uid may search: each fails, no uid 0 appears, and the view is
    still mounted and served afterwards."""
    where = world.host.top / f"view-{uuid.uuid4().hex[:6]}"
    where.mkdir(mode=0o755)
    with serving(world.storage, where, "--as", "coder") as mount:
        called = world.call("tsh", "setuid", str(where))
        results = called.out["setuid"]
        assert set(results) == {"su", "mount", "umount", "fusermount3"}, results
        for label, (code, said) in results.items():
            assert code not in (0, None), (label, code, said)
            assert said != "0", (label, said)
        assert called.out["euid"] == world.host.uid
        assert mounted_at(where) and mount.proc.poll() is None
        assert sorted(os.listdir(where)) == ["agent", "bin", "home", "model", "shared", "tool"]
    world.recorded_once(called)


# ----------------------------------------------------------------- outliving the call


@pytest.mark.parametrize(
    ("context", "mode"),
    [("run", "fork"), ("native", "fork"), ("worker", "fork"), ("tsh", "setpgid")],
)
def test_a_double_forked_orphan_dies_with_its_call(
    world: World, box: Path, context: str, mode: str
) -> None:
    """I-4, W-4, docs/tools.md "Process group and bounds" (what the tool left in its group is
    killed after a one-second grace) and "The agent terminal" (in a terminal, every process
    left in the tool's session, whatever its group): a grandchild orphaned by a double fork
    (in tsh one that also moved to a group of its own) is gone soon after the call ends."""
    pidfile = box / f"pid-{mode}"
    called = world.call(context, "spawn", mode, str(pidfile))
    assert called.out["spawn"] == mode
    assert wait_for(pidfile.exists, 5), "the orphan never started"
    orphan = int(pidfile.read_text())
    assert wait_for(lambda: not alive(orphan), 6), f"pid {orphan} outlived its call"
    world.recorded_once(called)


@pytest.mark.parametrize("context", ["native", "tsh"])
def test_a_setsid_daemon_outlives_its_call_with_nothing_of_the_host(
    world: World, box: Path, context: str
) -> None:
    """docs/tools.md "Process group and bounds" ("except one that leaves the group itself
    (setsid(2)…)"), T-5: a daemon the tool starts in a session of its own does outlive the
    call, which ends without waiting for it, recorded once; but it is the agent's uid and
    group with no capability, and holds no descriptor but the three it pointed at /dev/null."""
    pidfile = box / "pid-setsid"
    started = time.monotonic()
    called = world.call(context, "spawn", "setsid", str(pidfile))
    assert time.monotonic() - started < 20
    assert wait_for(pidfile.exists, 5)
    daemon = int(pidfile.read_text())
    world.recorded_once(called)
    time.sleep(1.2)  # past the one-second grace of the call's group
    assert alive(daemon), "documented: a process in a session of its own outlives the call"
    status = dict(
        line.split(":", 1) for line in Path(f"/proc/{daemon}/status").read_text().splitlines()
    )
    assert status["Uid"].split() == [str(world.host.uid)] * 4, status["Uid"]
    assert status["Groups"].split() == [str(world.host.gid)], status["Groups"]
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
    fds = {os.readlink(f"/proc/{daemon}/fd/{fd}") for fd in os.listdir(f"/proc/{daemon}/fd")}
    assert fds == {"/dev/null"}, fds


# ----------------------------------------------------- links where the host writes or reads


def test_a_link_planted_as_a_session_is_never_written_through(world: World) -> None:
    """S-1, S-5, docs/sessions.md ("the host … never writes through one"), docs/workers.md: the
    agent makes ``session/S`` of its home a symbolic link to its own control directory
    ``agent/coder.d``; ``ctx run`` (terminal and native) and a worker asked to record in S
    refuse with ENOTDIR (exit 126, 1, 1), run nothing, claim nothing, and create nothing in
    the control directory."""
    session = f"l{uuid.uuid4().hex[:8]}"
    link = world.session_dir(session)
    target = world.storage / "agent" / "coder.d"
    planted = world.call("native", "link", str(target), str(link))
    assert planted.out["link"] == str(target) and link.is_symlink()
    assert os.lstat(link).st_uid == world.host.uid
    before = world.controls()
    entries = sorted(os.listdir(target))
    base = ["run", "--agent", "coder", "--session", session]
    refused = world.host.ctx(*base, "probe", "fds")
    assert refused.rc == 126 and "ENOTDIR" in refused.err, refused
    native = world.host.ctx(*base, "--native", "probe", input='{"argv": ["fds"]}')
    assert native.rc == 1, native
    frame = json.loads(native.out.splitlines()[-1])
    assert frame["error"]["error"] == "ENOTDIR" and frame["error"]["stage"] == "session", frame
    assert frame["exit_status"] is None, frame
    job = world.publish(["fds"])
    worked = world.work(session)
    assert worked.returncode == 1 and "ENOTDIR" in worked.stderr, worked
    assert "no job was claimed" in worked.stderr, worked
    assert (world.queue / "pending" / job).is_file()
    world.work(f"w{uuid.uuid4().hex[:8]}")  # the queue left as it was found: drained
    assert sorted(os.listdir(target)) == entries and world.controls() == before
    assert os.readlink(link) == str(target)


@pytest.mark.parametrize("context", ["run", "tsh"])
def test_a_session_file_swapped_for_a_link_to_a_control_mid_call_changes_no_control(
    world: World, context: str
) -> None:
    """S-5, T-7, docs/sessions.md ("the host … never writes through one"): the tool replaces its
    own session's ``events.jsonl`` with a link to ``agent/coder.d/system.md``.  Its result
    goes to the file the runner had opened (renamed by the tool), the tool's log has it once,
    and the next call into that session is refused (EINVAL: not a regular file) with nothing
    run and nothing written through the link: no control changes."""
    system = world.storage / "agent" / "coder.d" / "system.md"
    before = world.controls()
    with contextlib.ExitStack() as stack:
        if context == "tsh":
            term, typist = stack.enter_context(own_terminal(world))
            session = term.session

            def probe(*args: str) -> str:
                return typist.answer("probe " + shlex.join(args))
        else:
            session = f"e{uuid.uuid4().hex[:8]}"

            def probe(*args: str) -> str:
                r = world.host.ctx("run", "--agent", "coder", "--session", session, "probe", *args)
                return f"exit {r.rc}\n{r.out}{r.err}"

            assert probe("fds").startswith("exit 0\n")
        events = world.session_dir(session) / "events.jsonl"
        said = probe("relink", str(events), str(system))
        call = json.loads([line for line in said.splitlines() if line.startswith("{")][-1])
        call = call["ctx"]["call"]
        moved = read_jsonl(events.with_name("events.jsonl.moved"))
        assert [e["type"] for e in moved if e.get("call") == call] == ["tool_call", "tool_result"]
        logged = read_jsonl(world.storage / "tool" / "probe.d" / "log")
        assert [e["type"] for e in logged if e.get("call") == call] == ["tool_result"]
        said = probe("fds")
        assert "EINVAL" in said and "not a regular file" in said, said
        assert '"fds"' not in said, said
        if context == "run":
            assert said.startswith("exit 126\n"), said
        assert events.is_symlink() and os.readlink(events) == str(system)
        assert world.controls() == before


def test_a_worker_whose_session_file_becomes_a_link_stops_and_changes_no_control(
    world: World,
) -> None:
    """S-5, W-1, Q-4, docs/workers.md: a job's tool swaps the worker's session
    ``events.jsonl`` for a link to the agent's ``system.md``.  The job is finished once in
    done/ with the tool's result (nothing left claimed or leased); the worker then refuses to
    append through the link (EINVAL, naming it), stops with exit 1 and claims no further job;
    no control changes."""
    session = f"w{uuid.uuid4().hex[:8]}"
    warm = world.by_worker(session, ["fds"])  # the session exists, events.jsonl in it
    world.recorded_once(warm)
    events = world.session_dir(session) / "events.jsonl"
    system = world.storage / "agent" / "coder.d" / "system.md"
    before = world.controls()
    first = world.publish(["relink", str(events), str(system)])
    second = world.publish(["fds"])
    worked = world.work(session)
    assert worked.returncode == 1, worked
    assert "EINVAL" in worked.stderr and "not a regular file" in worked.stderr, worked
    assert (world.queue / "done" / first).is_file(), worked
    assert world.result_of(first)["status"] == "ok"
    assert (world.queue / "pending" / second).is_file(), worked
    for sub in ("claimed", "lease"):
        assert os.listdir(world.queue / sub) == [], sub
    assert world.controls() == before and events.is_symlink()
    world.work(f"w{uuid.uuid4().hex[:8]}")  # drain what is left, in a session of its own
    assert world.result_of(second)["status"] == "ok"


def test_a_terminal_directory_planted_as_a_link_is_refused_before_the_terminal_starts(
    world: World,
) -> None:
    """A-2, docs/tools.md "the terminal socket": the agent plants ``session/S/terminal`` as a
    link to its own control directory before the administrator starts a terminal in S.  The
    start refuses (ELOOP, exit 1) without starting anything, and no socket link appears in
    the control directory; no ``terminal.started`` is logged for S."""
    session = f"t{uuid.uuid4().hex[:8]}"
    sdir = world.session_dir(session)
    target = world.storage / "agent" / "coder.d"
    planted = world.call("native", "link", str(target), str(sdir / "terminal"))
    assert planted.out["link"] == str(target)
    assert os.lstat(sdir / "terminal").st_uid == world.host.uid
    entries = sorted(os.listdir(target))
    started = world.host.ctx("agent", "start", "coder", "--session", session, "--json",
                             cwd=world.host.ws)  # fmt: skip
    assert started.rc == 1, started
    assert started.json()["error"] == "ELOOP", started
    assert sorted(os.listdir(target)) == entries
    assert not (world.term.rundir.parent / session).exists()
    assert world.host.lifecycle(session) == []


def test_a_terminal_directory_swapped_for_a_link_mid_terminal_leaves_its_target_alone(
    world: World,
) -> None:
    """A-2, docs/tools.md (on stop the terminal removes its link "only one that leads to this
    terminal's socket", and the directories it made): from a tool typed at tsh the agent
    renames its session's ``terminal/`` away and puts a link to the root's empty ``model/`` in
    its place.  ``ctx agent stop`` still stops the terminal (exit 0) and cleans its runtime
    directory, and ``model/`` is still there, root's and empty."""
    model = world.storage / "model"
    assert os.listdir(model) == []
    with own_terminal(world) as (term, typist):
        place = world.session_dir(term.session) / "terminal"
        answer = typist.answer("probe " + shlex.join(["relink", str(place), str(model)]))
        assert str(model) in answer, answer
        stopped = world.host.ctx("agent", "stop", "coder", "--session", term.session)
        world.host.started.remove(term.session)
        assert stopped.rc == 0 and "stopped coder" in stopped.out, stopped
        assert typist.eof.wait(10)
    assert model.is_dir() and not model.is_symlink() and os.listdir(model) == []
    assert os.stat(model).st_uid == 0
    assert not term.rundir.exists()
    assert [e["type"] for e in world.host.lifecycle(term.session)][-1] == "terminal.stopped"


def test_a_tool_dir_swapped_between_its_own_and_a_hosts_while_calls_run_never_runs(
    world: World, box: Path
) -> None:
    """P-5 steps 2 and 6, T-4, docs/policy.md "Host-owned controls": in its home tier the agent
    keeps a tool ``ut`` (granted in its own policy) whose ``ut.d`` a daemon of its swaps, as
    fast as it can, between its own copy of the controls and a link to a root-owned control
    directory that allows ``ut``.  Every call of ``ut`` meanwhile is refused (exit 126:
    step 6, the controls are the agent's; or ENOEXEC, the control directory is a link),
    ``ut`` never runs, and nothing is written in the root-owned directory, its log included."""
    decoy = world.host.top / f"decoy-{uuid.uuid4().hex[:6]}.d"
    shutil.copytree(world.storage / "tool" / "probe.d", decoy)
    (decoy / "policy").write_text("allow coder_t tool:ut execute\n")
    (decoy / "name").write_text("ut\n")
    for hook in decoy.glob("hooks/*/*"):
        hook.unlink()
    (decoy / "log").write_bytes(b"")
    decoy_before = snapshot(decoy)
    tier = world.storage / "home" / str(world.host.uid) / "tool"
    ran = box / "ut-ran"
    own = box / "ut.d"
    shutil.copytree(decoy, own)
    tier.mkdir(exist_ok=True)
    (tier / "ut").write_text(f"#!/bin/sh\ntouch {ran}\n")
    (tier / "ut").chmod(0o755)
    shutil.move(own, tier / "ut.d")
    for path in [tier, tier / "ut", *(tier / "ut.d").rglob("*"), tier / "ut.d"]:
        os.lchown(path, world.host.uid, world.host.gid)
    report = box / "flips"
    world.call("native", "swap", str(tier / "ut.d"), str(decoy), "2", str(report))
    codes = set()
    deadline = time.monotonic() + 1.5
    calls = 0
    while time.monotonic() < deadline or calls < 8:
        r = world.host.ctx("run", "--agent", "coder", "ut")
        codes.add(r.rc)
        assert r.rc == 126 and ("EACCES" in r.err or "ENOEXEC" in r.err), r
        calls += 1
    assert wait_for(report.exists, 10)
    assert int(report.read_text()) > 100, report.read_text()
    assert codes == {126}
    assert not ran.exists()
    assert snapshot(decoy) == decoy_before


# ----------------------------------------------------------------- its own terminal


def test_a_tool_that_kills_its_tsh_ends_the_terminal_cleanly_with_its_call_recorded(
    world: World,
) -> None:
    """A-1, A-2, S-2, docs/tools.md ("When tsh exits … ctxterm first ends the tool calls still
    running"): tsh runs as the agent's uid, so a tool may SIGKILL it; the terminal then ends
    as if tsh had exited — the call that killed it has its tool_call and one tool_result,
    ``terminal.stopped`` is logged, ctxterm, its sandbox and view's mount process are gone, the
    view unmounted and the runtime directory removed; no root process was signalled."""
    with own_terminal(world) as (term, typist):
        pids = world.pids_of(term)
        view = term.rundir / "private" / "ctx"
        typist.type(f"probe signal SIGKILL {pids['tsh']}")
        assert typist.eof.wait(20), typist.text()[-800:]
        assert wait_for(lambda: not any(alive(pid) for pid in pids.values()), 15), pids
        world.host.started.remove(term.session)
    probe = world.host.calls(term.session, "probe")
    assert [e["type"] for e in probe] == ["tool_call", "tool_result"], probe
    assert probe[0]["argv"] == ["signal", "SIGKILL", str(pids["tsh"])]
    assert [e["type"] for e in world.host.lifecycle(term.session)] == [
        "terminal.started",
        "terminal.stopped",
    ]
    assert not mounted_at(view) and not term.rundir.exists()
    again = world.host.ctx("agent", "stop", "coder", "--session", term.session)
    assert again.rc == 1 and "ENOENT" in again.err, again


def test_a_tool_that_stops_its_tsh_cannot_keep_the_administrator_from_stopping_it(
    world: World,
) -> None:
    """A-2 (``ctx agent stop``), docs/tools.md: a tool sends SIGSTOP to its own tsh and exits;
    the terminal then answers nobody, but ``ctx agent stop`` still ends it promptly (exit 0),
    with tsh, ctxterm and the view's mount process gone and the runtime directory removed."""
    with own_terminal(world) as (term, typist):
        pids = world.pids_of(term)
        typist.type(f"probe signal SIGSTOP {pids['tsh']}")
        assert typist.shows('"signal": {"' + str(pids["tsh"]) + '": "ok"}'), typist.text()
        assert wait_for(lambda: proc_state(pids["tsh"]) == "T", 5)
        started = time.monotonic()
        stopped = world.host.ctx("agent", "stop", "coder", "--session", term.session)
        world.host.started.remove(term.session)
        assert stopped.rc == 0 and "stopped coder" in stopped.out, stopped
        assert time.monotonic() - started < 15
    assert wait_for(lambda: not any(alive(pid) for pid in pids.values()), 10), pids
    assert not term.rundir.exists()


# --------------------------------------------------------------------- queue and records


def test_a_job_cannot_forge_its_own_queue_evidence_and_ends_once(world: World) -> None:
    """Q-3, Q-4, Q-6, W-1, I-4: the job's tool, running as the agent, tries to rewrite its own
    lease, its claimed request, and to put a result or a new request into done/ and pending/:
    every attempt is EACCES; the worker finishes the job once, in done/, with the tool's own
    answer, and the queue is consistent afterwards."""
    q = world.queue
    name = f"forge-{uuid.uuid4().hex[:6]}"
    job = f"{name}.req.json"
    args = ["files", f"w:{q}/lease/{job}/worker", f"w:{q}/claimed/{job}/{job}",
            f"c:{q}/done/{job}.result", f"c:{q}/pending/planted.req.json",
            f"c:{q}/lease/{job}/mine", f"fdw:{q}/lease/{job}/worker"]  # fmt: skip
    published = world.publish(args, name)
    assert published == job
    session = f"w{uuid.uuid4().hex[:8]}"
    worked = world.work(session)
    assert worked.returncode == 0, worked
    result = world.result_of(job)
    assert result["status"] == "ok", result
    assert result["output"]["files"] == {a: "EACCES" for a in args[1:]}, result["output"]
    assert sorted(os.listdir(q / "done")).count(job) == 1
    assert not (q / "failed" / job).exists() and not (q / "pending" / "planted.req.json").exists()
    for sub in ("pending", "claimed", "lease"):
        assert os.listdir(q / sub) == [], sub
    recovered = world.host.ctx("queue", "recover", "--project", world.project, "--json")
    assert recovered.rc == 0 and recovered.json()["consistent"] is True, recovered
    world.recorded_once(Called(result["output"], 0, result["call"], session))
