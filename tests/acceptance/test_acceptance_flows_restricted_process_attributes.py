"""CortexFS commands started with process attributes that services and CI runners give the
programs they start and a login shell does not (SPEC Q-1 … Q-7, I-1, I-5, W-1, W-2, W-4, T-3,
T-5, T-8, P-4, P-5, A-1, A-2, A-3, R-5, F-1, M-1):

* ``no_new_privs`` (``setpriv --no-new-privs``, systemd's ``NoNewPrivileges=yes``), for root
  and for an ordinary user;
* a seccomp filter, assembled here as a classic BPF program and installed with
  ``prctl(PR_SET_SECCOMP)`` by a wrapper process just before it execs ``ctx``, that refuses
  exactly the system calls it names with an errno: ``renameat2``, ``syncfs``, ``pidfd_open``
  and ``inotify_init1`` with ``ENOSYS`` (older kernels, some container runtimes), ``unshare``,
  ``setns`` and ``clone`` with a namespace flag with ``EPERM`` and ``clone3`` with ``ENOSYS``
  (Docker's default profile, systemd's ``RestrictNamespaces=yes``), ``clone3`` with ``EPERM``
  (older Docker profiles); every test shows with a probe under the same filter that it is
  active and refuses nothing else;
* securebits (``noroot``, ``no_setuid_fixup``) with ambient capabilities, a bounding set
  without ``CAP_SYS_PTRACE``, and an ordinary user given ambient capabilities;
* inherited signal dispositions and mask (``SIGCHLD`` or ``SIGPIPE`` ignored, ``SIGTERM``
  blocked), and a parent that is a child subreaper and not dumpable.

Each command must either do what it does without the restriction, or refuse with
``ctx: ERRNO: …`` naming the cause, with nothing lost, run twice or left half-done.
(A root lacking capabilities in its effective set is
test_acceptance_flows_root_with_fewer_capabilities.py; signals sent to running commands are
test_acceptance_flows_signals.py.)"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    kill_processes_of,
    mounted_at,
    new_scratch_dir,
    processes_of,
    read_jsonl,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.acceptance.terminalcli import Raw
from tests.acceptance.workercli import AGENT, allow_in_tool_policy, make_agent, shell_job
from tests.support.users import UnprivilegedUser, find_or_create_user

SCRATCH = scratch_top(__file__)
TRACEBACK = "Traceback (most recent call last)"
RUNTIME = Path("/run/cortexfs/terminal")
PROMPT = f"{AGENT}$ "
NOBODY_UID = 65534

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None or os.uname().machine != "x86_64",
    reason="needs root, setpriv(1) and x86_64 (the seccomp filter names x86_64 system calls)",
)

# ------------------------------------------------------------------------------ wrappers

# Installs a seccomp filter refusing the named system calls, then execs the rest of argv.
# argv: RULES -- PROGRAM ARGS…; RULES is NAME=ERRNO[,NAME=ERRNO…]; the name clone-ns means
# clone(2) with any namespace flag, as Docker's profile refuses it.  Not root: no_new_privs
# first, which the kernel requires of a process installing a filter without CAP_SYS_ADMIN.
SECCOMP_EXEC = r"""
import ctypes, errno, os, struct, sys
NR = {"renameat2": 316, "unshare": 272, "clone3": 435, "setns": 308, "syncfs": 306,
      "inotify_init1": 294, "inotify_init": 253, "pidfd_open": 434, "clone": 56}
LD, JEQ, JSET, RET = 0x20, 0x15, 0x45, 0x06
ALLOW, ERRNO, KILL = 0x7FFF0000, 0x00050000, 0x80000000
def ins(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)
rules, sep, *argv = sys.argv[1:]
assert sep == "--", sys.argv
prog = [ins(LD, 0, 0, 4), ins(JEQ, 1, 0, 0xC000003E), ins(RET, 0, 0, KILL), ins(LD, 0, 0, 0)]
for rule in rules.split(","):
    name, code = rule.split("=")
    code = getattr(errno, code)
    if name == "clone-ns":
        prog += [ins(JEQ, 0, 4, NR["clone"]), ins(LD, 0, 0, 16), ins(JSET, 0, 1, 0x7E020000),
                 ins(RET, 0, 0, ERRNO | code), ins(LD, 0, 0, 0)]
    else:
        prog += [ins(JEQ, 0, 1, NR[name]), ins(RET, 0, 0, ERRNO | code)]
prog.append(ins(RET, 0, 0, ALLOW))
code = b"".join(prog)
buf = ctypes.create_string_buffer(code)
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Fprog(len(code) // 8, ctypes.addressof(buf))
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                       ctypes.c_ulong]
if os.geteuid() != 0 and libc.prctl(38, 1, None, 0, 0) != 0:
    sys.exit("prctl(PR_SET_NO_NEW_PRIVS): " + os.strerror(ctypes.get_errno()))
if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:
    sys.exit("prctl(PR_SET_SECCOMP): " + os.strerror(ctypes.get_errno()))
os.execvp(argv[0], argv)
"""

# Makes each call a filter may name, raw (no C library wrapper to translate an errno), and the
# close relatives no filter names, and prints {call: errno or 0} and the Seccomp mode.
PROBE = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    words = [a if isinstance(a, bytes) else ctypes.c_long(a) for a in args]
    result = libc.syscall(ctypes.c_long(nr), *words)
    return ctypes.get_errno() if result == -1 else 0
root = os.open("/", os.O_RDONLY)
seen = {
    "renameat2": call(316, -100, b"/nonexistent-a", -100, b"/nonexistent-b", 1),
    "renameat": call(264, -100, b"/nonexistent-a", -100, b"/nonexistent-b"),
    "syncfs": call(306, root),
    "fsync": call(74, root),
    "pidfd_open": call(434, os.getpid(), 0),
    "inotify_init1": call(294, 0),
    "unshare": call(272, 0),
    "setns": call(308, -1, 0),
    "clone3": call(435, 0, 0),
    "getpid": call(39),
}
child = libc.syscall(ctypes.c_long(56), ctypes.c_long(0x04000000 | 17), ctypes.c_long(0),
                     ctypes.c_long(0), ctypes.c_long(0), ctypes.c_long(0))
if child == 0:
    os._exit(0)
seen["clone-ns"] = ctypes.get_errno() if child == -1 else 0
if child > 0:
    os.waitpid(child, 0)
status = open("/proc/self/status").read()
seen["Seccomp"] = int(status.split("Seccomp:")[1].split()[0])
print(json.dumps(seen))
"""

# Sets dispositions and the mask, then execs: ign=SIG,… block=SIG,… -- PROGRAM ARGS…
SIGNALS_EXEC = r"""
import os, signal, sys
args = sys.argv[1:]
at = args.index("--")
for option in args[:at]:
    kind, names = option.split("=")
    numbers = [getattr(signal, name) for name in names.split(",")]
    if kind == "ign":
        for number in numbers:
            signal.signal(number, signal.SIG_IGN)
    else:
        signal.pthread_sigmask(signal.SIG_BLOCK, numbers)
os.execvp(args[at + 1], args[at + 1:])
"""

# A parent that is a child subreaper and not dumpable (PR_SET_CHILD_SUBREAPER, then
# PR_SET_DUMPABLE 0); prints its pid and dumpable flag, then runs the commands of the JSON
# list argv[1] one at a time, each when a line comes on stdin, printing [status, out, err];
# it stays until stdin ends.
STEPPER = r"""
import ctypes, json, os, subprocess, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(36, 1, 0, 0, 0) != 0 or libc.prctl(4, 0, 0, 0, 0) != 0:
    sys.exit("prctl: " + os.strerror(ctypes.get_errno()))
print(json.dumps({"pid": os.getpid(), "dumpable": libc.prctl(3, 0, 0, 0, 0)}), flush=True)
for argv in json.loads(sys.argv[1]):
    if not sys.stdin.readline():
        break
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    print(json.dumps([done.returncode, done.stdout, done.stderr]), flush=True)
sys.stdin.read()
"""

DOCKER_LIKE = "unshare=EPERM,setns=EPERM,clone3=ENOSYS,clone-ns=EPERM"
PROBED = ("renameat2", "syncfs", "pidfd_open", "inotify_init1", "unshare", "setns", "clone3",
          "clone-ns")  # fmt: skip
# What each probed call and its unfiltered relatives give without a filter (root): the probe
# fails on bogus paths and descriptors, not on the call.
UNFILTERED = {
    "renameat2": errno.ENOENT,
    "renameat": errno.ENOENT,
    "syncfs": 0,
    "fsync": 0,
    "pidfd_open": 0,
    "inotify_init1": 0,
    "unshare": 0,
    "setns": errno.EBADF,
    "clone3": errno.EINVAL,
    "clone-ns": 0,
    "getpid": 0,
}


def seccomp(rules: str) -> list[str]:
    return [sys.executable, "-c", SECCOMP_EXEC, rules, "--"]


def ignoring(ignore: str = "", block: str = "") -> list[str]:
    options = [f"ign={ignore}"] * bool(ignore) + [f"block={block}"] * bool(block)
    return [sys.executable, "-c", SIGNALS_EXEC, *options, "--"]


NNP = ["setpriv", "--no-new-privs"]


def under(
    prefix: Sequence[str],
    *args: str | os.PathLike,
    env: dict[str, str],
    input: str = "",
    cwd: Path | None = None,
    user: UnprivilegedUser | None = None,
) -> Run:
    """``ctx ARGS`` started through ``prefix`` (which execs it), as ``user`` if given."""
    argv = [*prefix, *CTX_ARGV, *map(str, args)]
    as_user = {} if user is None else {"user": user.uid, "group": user.gid, "extra_groups": []}
    done = subprocess.run(argv, input=input.encode(), capture_output=True, env=env, cwd=cwd,
                          timeout=90, **as_user)  # fmt: skip
    return Run(
        [str(a) for a in args],
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


def filter_is_active(rules: str) -> None:
    """The probe under ``seccomp(rules)``: each named call is refused with its errno, every
    other probed call gives what it gives without a filter, and Seccomp mode 2 is on."""
    probe = subprocess.run([*seccomp(rules), sys.executable, "-c", PROBE], capture_output=True,
                           text=True, timeout=30)  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert seen.pop("Seccomp") == 2, seen
    named = {}
    for rule in rules.split(","):
        name, code = rule.split("=")
        named[name] = getattr(errno, code)
    if "inotify_init" in named:
        named.setdefault("inotify_init1", named.pop("inotify_init"))
    assert seen == {**UNFILTERED, **named}, (rules, seen)


def last_error_line(run: Run) -> str:
    lines = [line for line in run.err.splitlines() if not line.startswith("ctx: warning:")]
    return lines[-1] if lines else ""


def refused_with(run: Run, code: str, rc: int = 1) -> str:
    """``run`` ended with exit ``rc`` and ``ctx: CODE: …`` last on stderr; that line."""
    assert TRACEBACK not in run.err, run
    line = last_error_line(run)
    assert run.rc == rc and line.startswith(f"ctx: {code}: "), run
    return line


def status_field(text: str, field: str) -> str:
    for line in text.splitlines():
        if line.startswith(f"{field}:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {field} in {text!r}")


def root_key(root: Path) -> str:
    """docs/tools.md: the first 16 hex digits of the SHA-256 of the root's real path."""
    return hashlib.sha256(os.path.realpath(root).encode()).hexdigest()[:16]


def half_made(top: Path) -> list[str]:
    """What an install leaves while it is not finished (docs/tools.md): commit markers and the
    staged entries and control directories beside the names they replace."""
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            if name.endswith(("~commit", "~controls", "~entry", "~old-controls")):
                found.append(str(Path(dirpath, name).relative_to(top)))
    return sorted(found)


# ------------------------------------------------------------------------------ worlds


class World:
    """A bootstrapped root every uid may search (queue ``proj``), agent ``ci`` (uid nobody)
    allowed ``shell.exec`` in both layers of P-6, and a directory its tools may write."""

    def __init__(self, storage: Path, top: Path, out: Path) -> None:
        self.storage = storage
        self.top = top
        self.out = out
        cache = top / "cache"
        cache.mkdir()
        self.env = clean_env(CTX_STORAGE=str(storage), XDG_CACHE_HOME=str(cache))
        self.queue = QueueCLI(storage, "proj")
        make_agent(storage, ["shell.exec"])
        allow_in_tool_policy(storage, "shell.exec")

    def ctx(self, *args, input: str = "") -> Run:
        return ctx_run(*args, input=input, env=self.env)

    def under(self, prefix: Sequence[str], *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return under(prefix, *args, **kw)

    def publish(self, cmd: str, name: str | None = None) -> str:
        return self.queue.publish(shell_job(cmd), name=name)

    def events(self, session: str = "default") -> list[dict]:
        home = self.storage / "home" / str(NOBODY_UID) / "agent" / AGENT / "session"
        return read_jsonl(home / session / "events.jsonl")

    def run_dir(self, session: str) -> Path:
        return RUNTIME / root_key(self.storage) / str(NOBODY_UID) / AGENT / session

    def terminal_left(self, session: str) -> list[str]:
        """What a terminal of session has, or left: its runtime directory and session link."""
        link = self.storage / "home" / str(NOBODY_UID) / "agent" / AGENT / "session" / session
        found = [self.run_dir(session), RUNTIME / str(NOBODY_UID) / AGENT / session,
                 link / "terminal"]  # fmt: skip
        return [str(path) for path in found if os.path.lexists(path)]


@pytest.fixture
def scratch() -> Iterator[Path]:
    where = new_scratch_dir(SCRATCH)
    try:
        yield where
    finally:
        kill_processes_of(where)
        shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def world(searchable_storage: Path, scratch: Path, outbox: Path) -> Iterator[World]:
    made = World(searchable_storage, scratch, outbox)
    yield made
    kill_processes_of(searchable_storage)


@contextlib.contextmanager
def terminals(world: World) -> Iterator[list[str]]:
    """Sessions the block starts terminals in (appended to the list), each stopped by a full
    root afterwards, whatever the block did, and every process left on the root killed."""
    sessions: list[str] = []
    try:
        yield sessions
    finally:
        for session in sessions:
            pid_file = world.run_dir(session) / "pid"
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            world.ctx("agent", "stop", AGENT, "--session", session)
            view = world.run_dir(session) / "private" / "ctx"
            if mounted_at(view):
                subprocess.run(["umount", "-l", str(view)], check=False)
        kill_processes_of(world.storage)


def new_session() -> str:
    return f"r{uuid.uuid4().hex[:10]}"


def start_args(world: World, session: str) -> list[str]:
    """``ctx agent start`` of agent ci in ``session`` with no workspace, naming the storage
    root, so that every process it leaves can be found by that path."""
    return ["agent", "start", AGENT, "--session", session, "--no-workspace", "--storage",
            str(world.storage)]  # fmt: skip


def typed_in_terminal(world: World, session: str, line: str, *answers: str) -> str:
    """Type ``line`` at tsh's prompt in the terminal of ``session``; the output once one of
    ``answers`` (or a refusal of tsh) shows after the line's echo."""
    link = world.storage / "home" / str(NOBODY_UID) / "agent" / AGENT / "session" / session
    client = Raw(link / "terminal" / "main.sock", b"attach\n")
    try:
        client.type(line)

        def answered() -> bool:
            after = client.text().split(line, 1)[-1] if line in client.text() else ""
            return any(answer in after for answer in (*answers, "tsh: ")) and PROMPT in after

        wait_for(answered, 30)
        return client.text().split(line, 1)[-1]
    finally:
        client.close()


@dataclass
class UserRoot:
    """The ordinary test user's own storage root, bootstrapped by that user, a directory of the
    user's (``top``, also its HOME) and its agent (the user's uid) allowed ``shell.exec``."""

    user: UnprivilegedUser
    top: Path
    storage: Path
    home: Path
    agent: str = ""

    @property
    def env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "CTX_STORAGE": str(self.storage),
        }

    def ctx(self, prefix: Sequence[str], *args, input: str = "") -> Run:
        return under(prefix, *args, env=self.env, input=input, cwd=self.top, user=self.user)


@pytest.fixture(scope="module")
def user_storage() -> Iterator[tuple[UnprivilegedUser, Path]]:
    """The user's storage root, bootstrapped by the user once for the tests of this process
    (each test then works in a directory of its own, with an agent of its own)."""
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH, "u")
    os.chown(top, user.uid, user.gid)
    try:
        boot = UserRoot(user, top, top / "storage", top).ctx([], "bootstrap")
        assert boot.rc == 0, boot
        yield user, top / "storage"
    finally:
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def user_root(user_storage: tuple[UnprivilegedUser, Path], scratch: Path) -> UserRoot:
    """:func:`user_storage` with a new agent (the user's uid) allowed ``shell.exec`` in both
    layers of P-6, and a directory of the user's for this test."""
    user, storage = user_storage
    top = scratch / "user"
    top.mkdir()
    os.chown(top, user.uid, user.gid)
    agent = f"u{uuid.uuid4().hex[:8]}"
    made = UserRoot(user, top, storage, top, agent)
    request = {"name": agent, "label": f"{agent}_t", "tools": ["shell.exec"]}
    created = made.ctx([], "agent", "create", "-", input=json.dumps(request))
    assert created.rc == 0, created
    with open(storage / "tool" / "shell.exec.d" / "policy", "a") as policy:
        policy.write(f"allow {agent}_t tool:shell.exec execute\n")
    return made


def secret(top: Path) -> Path:
    """A file only root may read (0600), which no agent's tool may read."""
    path = top / "secret"
    path.write_text("root's own\n")
    path.chmod(0o600)
    return path


def held_capabilities(output: str) -> dict[str, int]:
    return {f: int(status_field(output, f), 16) for f in ("CapPrm", "CapEff", "CapAmb")}


SHOW_CAPS = "grep -E '^(Cap|NoNewPrivs)' /proc/self/status; id -u; cat {secret} 2>/dev/null"


# ------------------------------------------------------------------------------ seccomp


def test_the_filter_refuses_exactly_the_calls_it_names() -> None:
    """The control for every seccomp case of this file: with all the rules at once, each named
    call is refused with its errno, and ``renameat``, ``fsync``, ``getpid`` and the probed
    calls' plain uses are untouched; with one rule, only that call is refused."""
    filter_is_active(
        "renameat2=ENOSYS,syncfs=ENOSYS,pidfd_open=ENOSYS,inotify_init1=ENOSYS," + DOCKER_LIKE
    )
    filter_is_active("syncfs=ENOSYS")


def test_the_queue_moves_by_link_and_unlink_where_renameat2_is_enosys(world: World) -> None:
    """Q-1, Q-2, Q-4, Q-5, Q-7, I-1, I-5 (SPEC: ``link()``+``unlink()`` or
    ``renameat2(RENAME_NOREPLACE)``): with renameat2 refused (ENOSYS), publish (one and a
    batch), claim, finish (ok and error), recover of an abandoned claim and a worker's drain
    all succeed; every job ends in exactly one state with one name (link count 1), a second
    publish of a name is still EEXIST, and the queue is consistent with nothing left in
    inbox/."""
    rules = "renameat2=ENOSYS"
    filter_is_active(rules)
    q, f = world.queue, seccomp(rules)
    one = world.under(f, "queue", "publish", "--project", "proj", "--name", "one", "-",
                      input=json.dumps(shell_job(f"touch {world.out}/one")))  # fmt: skip
    assert one.rc == 0 and one.out == "one.req.json\n", one
    again = world.under(f, "queue", "publish", "--project", "proj", "--name", "one", "-",
                        input=json.dumps(shell_job("true")))  # fmt: skip
    refused_with(again, "EEXIST")
    lines = "".join(json.dumps(shell_job(f"touch {world.out}/b{n}")) + "\n" for n in range(3))
    batch = world.under(f, "queue", "publish", "--project", "proj", "--batch", "-", input=lines)
    assert batch.rc == 0 and len(batch.lines()) == 3, batch
    names = ["one.req.json", *batch.lines()]
    assert {q.state(name) for name in names} == {"pending"}

    claimed = world.under(f, "queue", "claim", "--project", "proj")
    assert claimed.rc == 0 and claimed.out.strip() == "one.req.json", claimed
    finish = world.under(f, "queue", "finish", "--project", "proj", "one.req.json", "--error",
                         "-", input='{"why": "by hand"}')  # fmt: skip
    assert finish.rc == 0, finish
    gone = subprocess.Popen(["true"])
    gone.wait()
    abandoned = world.under(f, "queue", "claim", "--project", "proj", "--pid", str(gone.pid))
    assert abandoned.rc == 0, abandoned
    recovered = world.under(f, "queue", "recover", "--project", "proj", "--json")
    assert recovered.rc == 0, recovered
    assert [e["job"] for e in recovered.json()["requeued"]] == [abandoned.out.strip()]
    drained = world.under(f, "queue", "work", "--project", "proj", "--agent", AGENT, "--drain")
    assert drained.rc == 0 and TRACEBACK not in drained.err, drained

    assert q.state("one.req.json") == "failed"
    assert {q.state(name) for name in names[1:]} == {"done"}
    assert sorted(os.listdir(world.out)) == ["b0", "b1", "b2"]
    for state in ("done", "failed"):
        for entry in (q.dir / state).iterdir():
            assert entry.stat().st_nlink == 1, entry
    assert q.requests() == {name: ["failed" if name == "one.req.json" else "done"]
                            for name in names}  # fmt: skip
    q.assert_settled()


@pytest.mark.parametrize("command", ["bootstrap", "agent-create", "object-install"])
def test_installs_where_renameat2_is_enosys_finish_or_leave_nothing_half_made(
    world: World, command: str
) -> None:
    """R-5, A-3, T-8 (docs/tools.md "How an install stays atomic": where the control
    directories cannot be exchanged in one step, the old one is moved aside first): with
    renameat2 refused (ENOSYS, a kernel or container runtime without it; the queue itself
    falls back to link+unlink), ``ctx bootstrap`` of a new root, ``ctx agent create`` and
    ``ctx object install`` of a new tool either succeed, or refuse with the cause named
    (renameat2) and leave no half-committed entry (``…~commit``, ``…~controls``,
    ``…~entry``) behind."""
    rules = "renameat2=ENOSYS"
    filter_is_active(rules)
    f = seccomp(rules)
    if command == "bootstrap":
        root = world.top / "fresh"
        run = world.under(f, "bootstrap", "--storage", root)
        made = run.rc == 0 and (root / "tool" / "fs.read").is_file()
    elif command == "agent-create":
        root = world.storage
        request = {"name": "second", "label": "second_t", "tools": ["fs.stat"]}
        run = world.under(f, "agent", "create", "-", input=json.dumps(request))
        made = run.rc == 0 and (root / "agent" / "second.d" / "policy").is_file()
    else:
        root = world.storage
        manifest = tool_manifest(world.top / "src", "probe.one", "#!/bin/sh\necho one\n")
        run = world.under(f, "object", "install", manifest, "--tier", "system")
        made = run.rc == 0 and (root / "tool" / "probe.one.d" / "description").is_file()
    assert TRACEBACK not in run.err, run
    assert half_made(root) == [], run
    assert made or "renameat2" in run.err, run


def test_a_batch_publish_without_syncfs_publishes_or_names_syncfs(world: World) -> None:
    """Q-1, Q-7 (one group commit per batch, docs/queue.md), CONVENTIONS (an errno and a
    sentence a user can act on): with syncfs(2) refused (ENOSYS), a single publish works (it
    fsyncs its file); a batch either publishes every request durably or refuses naming the
    call it lacks, with nothing published and nothing left in inbox/."""
    rules = "syncfs=ENOSYS"
    filter_is_active(rules)
    f, q = seccomp(rules), world.queue
    single = world.under(f, "queue", "publish", "--project", "proj", "-",
                         input=json.dumps(shell_job("true")))  # fmt: skip
    assert single.rc == 0 and q.state(single.out.strip()) == "pending", single
    lines = "".join(json.dumps(shell_job(f"echo {n}")) + "\n" for n in range(4))
    batch = world.under(f, "queue", "publish", "--project", "proj", "--batch", "-", input=lines)
    assert TRACEBACK not in batch.err and q.entries("inbox") == set(), batch
    if batch.rc == 0:
        assert {q.state(name) for name in batch.lines()} == {"pending"}, batch
        assert len(q.entries("pending")) == 5
    else:
        refused_with(batch, "ENOSYS")
        assert q.entries("pending") == {single.out.strip()}, batch
        assert "syncfs" in batch.err, batch


def test_a_waiting_worker_without_inotify_backs_off_and_runs_a_later_job(world: World) -> None:
    """W-2 (docs/workers.md "Fallback": where inotify is unavailable the worker waits with a
    bounded back-off, and its start event says so), W-1, W-4: with inotify_init1 refused
    (ENOSYS), an idle worker names the back-off in its start event, runs a job published
    while it waits, and stops on SIGTERM with exit 0 and nothing claimed."""
    rules = "inotify_init1=ENOSYS,inotify_init=ENOSYS"
    filter_is_active(rules)
    log = world.top / "worker.jsonl"
    with open(log, "wb") as out:
        argv = [*seccomp(rules), *CTX_ARGV, "queue", "work", "--project", "proj", "--agent",
                AGENT, "--json"]  # fmt: skip
        worker = subprocess.Popen(argv, env=world.env, stdout=out, stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        assert wait_for(lambda: '"start"' in log.read_text(), 30), log.read_text()
        job = world.publish(f"touch {world.out}/later")
        assert wait_for(lambda: world.queue.state(job) == "done", 30), log.read_text()
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    events = read_jsonl(log)
    assert worker.returncode == 0 and TRACEBACK not in err.decode(), err
    assert events[0]["event"] == "start" and "back-off" in events[0]["wait"], events[0]
    assert "inotify" in events[0]["wait"], events[0]
    assert events[-1]["event"] == "stop" and events[-1]["done"] == 1, events[-1]
    assert os.listdir(world.out) == ["later"]
    world.queue.assert_settled()


def test_ctx_run_without_pidfd_open_runs_the_tool_or_names_the_missing_call(
    world: World,
) -> None:
    """T-3, S-2 (the result frame: the tool's exit status, or an errno and a reason a user can
    act on): with pidfd_open refused (ENOSYS: a kernel before 5.3, some sandboxes), a native
    call of a tool that exits 3 either reports exit_status 3 having run it, or is refused
    naming pidfd_open; either way the session records the call and its result."""
    rules = "pidfd_open=ENOSYS"
    filter_is_active(rules)
    run = world.under(seccomp(rules), "run", "--native", "--agent", AGENT, "shell.exec",
                      input=json.dumps({"cmd": f"touch {world.out}/ran; exit 3"}))  # fmt: skip
    assert run.rc == 1 and TRACEBACK not in run.err, run
    frames = [json.loads(line) for line in run.lines()]
    result = frames[-1]
    assert result["type"] == "result", frames
    assert [e["type"] for e in world.events()] == ["tool_call", "tool_result"]
    if result["exit_status"] is not None:
        assert result["exit_status"] == 3 and os.listdir(world.out) == ["ran"], result
    else:
        assert result["error"]["error"] == "ENOSYS", result
        assert "pidfd_open" in result["error"]["message"], result


def test_a_worker_without_pidfd_open_fails_no_job_for_the_hosts_sake(world: World) -> None:
    """W-1 (failed/ is a tool's failure: non-zero exit, timeout, denial), docs/workers.md ("A
    root that may not become the agent", "A host that runs short": what every job would meet
    is not the job's failure): with pidfd_open refused (ENOSYS), a draining worker either runs
    the jobs (done/) or stops before its first claim with the errno, every job left pending;
    no job is moved to failed/ for what the host lacks."""
    rules = "pidfd_open=ENOSYS"
    filter_is_active(rules)
    jobs = [world.publish(f"touch {world.out}/p{n}") for n in range(2)]
    run = world.under(seccomp(rules), "queue", "work", "--project", "proj", "--agent", AGENT,
                      "--drain")  # fmt: skip
    assert TRACEBACK not in run.err, run
    states = {world.queue.state(job) for job in jobs}
    assert world.queue.entries("failed") == set(), run
    if states == {"done"}:
        assert sorted(os.listdir(world.out)) == ["p0", "p1"] and run.rc == 0, run
    else:
        assert states == {"pending"} and os.listdir(world.out) == [], run
        refused_with(run, "ENOSYS")


def test_namespaces_refused_as_docker_does_refuse_a_call_and_a_terminal_with_the_cause(
    world: World,
) -> None:
    """P-4 (no network without ``network:default connect``: docs/tools.md, "where no namespace
    can be made … the call is refused at stage run with EACCES instead of running with the
    network"), A-1, A-2: with unshare, setns and namespace clones refused (EPERM) and clone3
    ENOSYS, as Docker's default profile and systemd's RestrictNamespaces= do, ``ctx run`` is
    EACCES (exit 126) naming unshare(CLONE_NEWNET), runs nothing and records the refusal;
    ``ctx agent start`` is EPERM naming the namespace it could not make, with no process,
    runtime directory or session link left."""
    filter_is_active(DOCKER_LIKE)
    f = seccomp(DOCKER_LIKE)
    run = world.under(f, "run", "--agent", AGENT, "shell.exec", input=json.dumps(
        {"cmd": f"touch {world.out}/ran"}))  # fmt: skip
    line = refused_with(run, "EACCES", rc=126)
    assert "unshare(CLONE_NEWNET)" in line and os.listdir(world.out) == [], run
    result = world.events()[-1]
    assert (result["type"], result["errno"], result["stage"]) == ("tool_result", "EACCES", "run")

    session = new_session()
    with terminals(world) as sessions:
        sessions.append(session)
        started = world.under(f, *start_args(world, session))
        # Which refusal comes first is a race: tsh's sandbox found without a pid namespace of
        # its own (EPERM), or bwrap's own failure to make one (EIO, in bwrap's words).
        assert "namespace" in last_error_line(started), started
        line = refused_with(started, "EPERM" if "EPERM" in started.err else "EIO")
        assert "namespace" in line, started
        assert wait_for(lambda: processes_of(world.storage) == [], 30)
        assert world.terminal_left(session) == []


def test_a_worker_whose_namespaces_are_refused_claims_no_job(world: World) -> None:
    """W-1, P-4, docs/workers.md ("A root that may not become the agent": a worker that could
    start no tool of an agent without network:default refuses before its first claim, every
    job left pending): the same host condition reached by a seccomp filter rather than a
    missing CAP_SYS_ADMIN must leave every job pending, none failed, none run."""
    filter_is_active(DOCKER_LIKE)
    jobs = [world.publish(f"touch {world.out}/n{n}") for n in range(2)]
    run = world.under(seccomp(DOCKER_LIKE), "queue", "work", "--project", "proj", "--agent",
                      AGENT, "--drain")  # fmt: skip
    assert TRACEBACK not in run.err and os.listdir(world.out) == [], run
    assert world.queue.entries("failed") == set(), run
    assert {world.queue.state(job) for job in jobs} == {"pending"}, run
    refused_with(run, "EACCES")  # what each call would meet (docs/workers.md)
    assert "unshare(CLONE_NEWNET)" in run.err and "no job was claimed" in run.err, run


def test_a_worker_that_cannot_start_threads_says_why_without_inventing_a_limit(
    world: World,
) -> None:
    """W-2, docs/workers.md ("A worker that cannot start its threads … stops with EAGAIN before
    it claims anything"), CONVENTIONS (a sentence a user can act on): with clone3 refused
    (EPERM, as Docker profiles before glibc's fallback was allowed for did), the worker claims
    nothing and exits 1 with an errno; under no process limit at all its message does not
    tell the user that the limit of processes is reached."""
    rules = "clone3=EPERM"
    filter_is_active(rules)
    job = world.publish(f"touch {world.out}/c")
    run = world.under(seccomp(rules), "queue", "work", "--project", "proj", "--agent", AGENT,
                      "--drain")  # fmt: skip
    assert run.rc == 1 and TRACEBACK not in run.err, run
    assert world.queue.state(job) == "pending" and os.listdir(world.out) == [], run
    assert "limit of processes" not in run.err and "is reached" not in run.err, run


def test_ctxmcp_projects_the_same_candidates_under_every_restriction_at_once(
    scratch: Path,
) -> None:
    """M-1, M-3, M-4: ``ctxmcp project`` of a real stdio server (mcp-server-time) run under
    no_new_privs, with SIGCHLD ignored, and behind a filter refusing pidfd_open and
    inotify_init1 (ENOSYS) and namespaces as Docker does, writes exactly the candidates an
    unrestricted run writes, byte for byte, and installs nothing."""
    server = Path(CTX_ARGV[0]).with_name("mcp-server-time")
    if not server.is_file():
        pytest.skip("mcp-server-time is not installed in the virtual environment")
    rules = "pidfd_open=ENOSYS,inotify_init1=ENOSYS," + DOCKER_LIKE
    filter_is_active(rules)
    config = scratch / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"time": {"command": str(server)}}}))
    ctxmcp = str(Path(CTX_ARGV[0]).with_name("ctxmcp"))
    written = {}
    for name, prefix in (("plain", []), ("restricted", [*NNP, *ignoring("SIGCHLD"),
                                                        *seccomp(rules)])):  # fmt: skip
        out = scratch / name
        argv = [*prefix, ctxmcp, "project", "--config", str(config), "--runtime-config",
                "/mcp/mcp.json", "--server", "time", "--out", str(out)]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, env=clean_env(),
                              timeout=90)  # fmt: skip
        assert done.returncode == 0 and TRACEBACK not in done.stderr, (name, done.stderr)
        written[name] = {path.name: path.read_bytes() for path in out.iterdir()}
    assert written["restricted"] == written["plain"]
    assert "time.get_current_time.manifest.json" in written["plain"], written["plain"]


# ------------------------------------------------------------------------------ no_new_privs


def test_root_under_no_new_privs_runs_tools_and_drains_a_queue_as_the_agent(
    world: World,
) -> None:
    """T-5, P-5 step 1, W-1, S-2: under no_new_privs (NoNewPrivileges=yes) root still runs a
    tool as the agent's uid (``ctx run``), and a worker drains the queue, each job's tool as
    the agent, every job done once, the queue consistent."""
    run = world.under(NNP, "run", "--agent", AGENT, "shell.exec", input=json.dumps(
        {"cmd": "id -u; grep NoNewPrivs /proc/self/status"}))  # fmt: skip
    assert run.rc == 0, run
    assert run.out.split() == [str(NOBODY_UID), "NoNewPrivs:", "1"], run
    jobs = [world.publish(f"id -u > {world.out}/w{n}") for n in range(3)]
    drained = world.under(NNP, "queue", "work", "--project", "proj", "--agent", AGENT, "--drain")
    assert drained.rc == 0, drained
    assert {world.queue.state(job) for job in jobs} == {"done"}
    assert {(world.out / f"w{n}").read_text() for n in range(3)} == {f"{NOBODY_UID}\n"}
    assert {owner.stat().st_uid for owner in world.out.iterdir()} == {NOBODY_UID}
    world.queue.assert_settled()


def test_root_under_no_new_privs_starts_a_terminal_whose_tools_run_as_the_agent(
    world: World,
) -> None:
    """A-1, A-2, H-1, T-3 (docs/tools.md: tsh runs with no capabilities and no_new_privs): a
    terminal started under no_new_privs serves tsh, a tool typed there runs as the agent's
    uid, and a full root's ``ctx agent stop`` ends it with nothing left."""
    session = new_session()
    with terminals(world) as sessions:
        sessions.append(session)
        started = world.under(NNP, *start_args(world, session))
        assert started.rc == 0, started
        said = typed_in_terminal(world, session, "shell.exec 'echo ran-as-$(id -u)'",
                                 f"ran-as-{NOBODY_UID}")  # fmt: skip
        assert f"ran-as-{NOBODY_UID}" in said, said
        stopped = world.ctx("agent", "stop", AGENT, "--session", session)
        assert stopped.rc == 0, stopped
        assert wait_for(lambda: processes_of(world.storage) == [], 30)
        assert world.terminal_left(session) == []


def test_a_user_under_no_new_privs_runs_their_agents_tool(user_root: UserRoot) -> None:
    """T-5, P-4, P-5 step 1 (a non-root host runs its own agents as its own uid, offline in a
    user and network namespace of the tool's own): under no_new_privs the user's ``ctx run``
    still runs the tool, as the user, with no network device up."""
    run = user_root.ctx(NNP, "run", "--agent", user_root.agent, "shell.exec", input=json.dumps(
        {"cmd": "id -u; grep NoNewPrivs /proc/self/status"}))  # fmt: skip
    assert run.rc == 0 and TRACEBACK not in run.err, run
    assert run.out.split() == [str(user_root.user.uid), "NoNewPrivs:", "1"], run


NAMESPACE_DEV = """
set -e
dev=$1; shift
if [ -n "$dev" ]; then
    mount -t tmpfs -o size=16k,mode=0755 cortexfs-test-dev "$dev"
    mknod -m 0666 "$dev/fuse" c 10 229
    mount --bind "$dev/fuse" /dev/fuse
fi
exec "$@"
"""

USER_MOUNT = """
ctx=$1; where=$2
mkdir "$where"
"$ctx" mount "$where" > "$where.out" 2> "$where.err" &
pid=$!
for i in $(seq 300); do
    grep -q " $where " /proc/self/mountinfo && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.05
done
grep -c " $where " /proc/self/mountinfo > "$where.mounted"
ls "$where" > "$where.root" 2>&1
"$ctx" umount "$where" > /dev/null 2>&1
wait $pid; echo $? > "$where.status"
"""


def test_a_users_mount_under_no_new_privs_names_what_stops_fusermount3(
    user_root: UserRoot,
) -> None:
    """F-1, docs/mount.md (a failure to mount is an error naming libfuse's reason, nothing
    mounted), CONVENTIONS: with /dev/fuse 0666 and a setuid-root fusermount3 the user mounts
    their root (the control), but under no_new_privs the kernel ignores fusermount3's setuid
    bit; ``ctx mount`` must then exit 1 with an errno naming that cause (no_new_privs), not
    send the user to do what is already done, and nothing stays mounted."""
    fusermount = shutil.which("fusermount3")
    if fusermount is None or not os.stat(fusermount).st_mode & stat.S_ISUID:
        pytest.skip("needs a setuid-root fusermount3")
    if not os.path.exists("/dev/fuse") or shutil.which("unshare") is None:
        pytest.skip("needs /dev/fuse and util-linux unshare")
    top, user = user_root.top, user_root.user
    dev = ""
    if os.stat("/dev/fuse").st_mode & 0o006 != 0o006:
        dev = str(top.parent / "dev")
        Path(dev).mkdir(mode=0o755)
    results = {}
    for name, extra in (("plain", []), ("nnp", ["--no-new-privs"])):
        where = top / name
        env = [f"{k}={v}" for k, v in user_root.env.items()]
        as_user = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups",
                   *extra, "env", "-i", *env, "/bin/sh", "-c", USER_MOUNT, "sh", CTX_ARGV[0],
                   str(where)]  # fmt: skip
        argv = ["unshare", "-m", "--propagation", "private", "/bin/sh", "-c", NAMESPACE_DEV,
                "sh", dev, *as_user]  # fmt: skip
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if dev and done.returncode != 0 and "mknod" in done.stderr:
            pytest.skip(f"cannot give /dev/fuse mode 0666 here: {done.stderr.strip()}")
        assert done.returncode == 0, done.stderr
        results[name] = {part: Path(f"{where}.{part}").read_text()
                         for part in ("mounted", "root", "status", "err")}  # fmt: skip
        assert not mounted_at(where)
    plain, nnp = results["plain"], results["nnp"]
    assert (plain["mounted"], plain["status"]) == ("1\n", "0\n"), plain
    assert sorted(plain["root"].split()) == ["agent", "bin", "home", "model", "shared", "tool"]
    assert (nnp["mounted"], nnp["status"]) == ("0\n", "1\n"), nnp
    assert TRACEBACK not in nnp["err"], nnp
    line = nnp["err"].strip().splitlines()[-1]
    assert line.startswith("ctx: EPERM: "), nnp
    assert "no_new_privs" in line or "no new privileges" in line.lower(), line


# ------------------------------------------------------------------------------ capabilities

# What root's ctx uses of its capabilities to run tools as an agent (T-5, P-4, S-1).
AMBIENT = ("setuid", "setgid", "sys_admin", "dac_override", "dac_read_search", "chown", "fowner",
           "kill")  # fmt: skip
CAP_NUMBERS = {"chown": 0, "dac_override": 1, "dac_read_search": 2, "fowner": 3, "kill": 5,
               "setgid": 6, "setuid": 7, "sys_admin": 21, "sys_ptrace": 19}  # fmt: skip


def needs_capabilities(*names: str) -> None:
    own = int(status_field(Path("/proc/self/status").read_text(), "CapEff"), 16)
    missing = [name for name in names if not own >> CAP_NUMBERS[name] & 1]
    if missing:
        pytest.skip(f"this root lacks {', '.join(missing)}")


def ambient_root(*securebits: str) -> list[str]:
    """setpriv's argv for uid 0 holding :data:`AMBIENT` as ambient (and inheritable)
    capabilities under ``securebits``."""
    caps = ",".join(f"+{name}" for name in AMBIENT)
    return ["setpriv", f"--inh-caps={caps}", f"--ambient-caps={caps}",
            f"--securebits={','.join(securebits)}"]  # fmt: skip


def test_a_root_without_root_privileges_but_with_ambient_capabilities_runs_tools_bare(
    world: World,
) -> None:
    """T-5, P-5 steps 1 and 2, W-1: uid 0 under securebits ``noroot`` (exec gives root no
    capabilities of its own) holding what it needs as ambient capabilities, as a hardened
    unit may run it: ``ctx run`` and a worker run the tool as the agent's uid with no
    permitted, effective or ambient capability, so the kernel's mode bits bind it (a file only
    root may read stays unreadable)."""
    needs_capabilities(*AMBIENT)
    hidden = secret(world.top)
    prefix = ambient_root("+noroot")
    probe = SHOW_CAPS.format(secret=hidden)
    run = world.under(prefix, "run", "--agent", AGENT, "shell.exec",
                      input=json.dumps({"cmd": probe}))  # fmt: skip
    assert run.rc == 1 and TRACEBACK not in run.err, run  # cat's exit status: refused
    assert held_capabilities(run.out) == {"CapPrm": 0, "CapEff": 0, "CapAmb": 0}, run
    assert str(NOBODY_UID) in run.out.split() and "root's own" not in run.out, run
    job = world.publish(f"{{ {probe}; }} > {world.out}/w; true")
    drained = world.under(prefix, "queue", "work", "--project", "proj", "--agent", AGENT,
                          "--drain")  # fmt: skip
    assert drained.rc == 0 and world.queue.state(job) == "done", drained
    seen = (world.out / "w").read_text()
    assert held_capabilities(seen) == {"CapPrm": 0, "CapEff": 0, "CapAmb": 0}, seen
    assert "root's own" not in seen, seen


def test_no_setuid_fixup_never_lets_an_agents_tool_keep_roots_capabilities(
    world: World,
) -> None:
    """T-5 (permission comes from the agent's uid, gid, groups, mounts and policy), P-5 step 2
    (Linux mode bits), docs/tools.md *Identity* ("the kernel enforces Linux mode bits on
    everything the tool touches"): with securebits ``noroot,no_setuid_fixup`` (SecureBits= of
    a unit) and ambient capabilities, the switch to the agent's uid no longer clears them;
    the tool must still hold none (or the call be refused), and a root-only file stays
    unreadable to it."""
    needs_capabilities(*AMBIENT)
    hidden = secret(world.top)
    run = world.under(ambient_root("+noroot", "+no_setuid_fixup"), "run", "--agent", AGENT,
                      "shell.exec", input=json.dumps(
                          {"cmd": SHOW_CAPS.format(secret=hidden)}))  # fmt: skip
    assert TRACEBACK not in run.err, run
    assert "root's own" not in run.out, run
    if run.rc in (0, 1):
        assert held_capabilities(run.out) == {"CapPrm": 0, "CapEff": 0, "CapAmb": 0}, run
    else:
        refused_with(run, "EPERM", rc=126)


def test_a_terminal_of_a_root_without_cap_sys_ptrace_runs_tools_or_is_refused(
    world: World,
) -> None:
    """A-1, A-2, H-1, T-3 (docs/tools.md: the run socket admits tsh in the sandbox's pid
    namespace), CONVENTIONS: root whose bounding set leaves out CAP_SYS_PTRACE (a common
    hardening, CapabilityBoundingSet=~CAP_SYS_PTRACE) cannot look at tsh's namespace (tsh is
    not dumpable).  ``ctx agent start`` must then either give a terminal whose tools run, or
    refuse (EPERM naming CAP_SYS_PTRACE) with nothing left running."""
    needs_capabilities("sys_ptrace")
    prefix = ["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-all", "--ambient-caps=-all"]
    session = new_session()
    with terminals(world) as sessions:
        sessions.append(session)
        started = world.under(prefix, *start_args(world, session))
        assert TRACEBACK not in started.err, started
        if started.rc != 0:
            line = refused_with(started, "EPERM")
            assert "CAP_SYS_PTRACE" in line, started
            assert wait_for(lambda: processes_of(world.storage) == [], 30)
            assert world.terminal_left(session) == []
            return
        said = typed_in_terminal(world, session, "shell.exec 'echo ran-as-$(id -u)'",
                                 f"ran-as-{NOBODY_UID}")  # fmt: skip
        assert f"ran-as-{NOBODY_UID}" in said, said


def test_a_users_ambient_capabilities_never_reach_an_agents_tool(user_root: UserRoot) -> None:
    """T-5, P-5 step 2 (mode bits), P-4: a user whose service manager gave them ambient
    capabilities (AmbientCapabilities=) runs their agent's tool; offline the tool's own user
    namespace leaves it none in the host's namespace, and with ``network:default connect``
    granted (no namespace) it must hold none either: what the agent may touch does not change
    with its network grant, and a file only root may read stays unreadable."""
    needs_capabilities("dac_read_search", "dac_override")
    hidden = secret(user_root.top.parent)  # the test's scratch directory, root's
    probe = json.dumps({"cmd": SHOW_CAPS.format(secret=hidden)})
    user = user_root.user
    caps = "+dac_read_search,+dac_override"
    # The ambient capabilities, raised by root for the user's uid as a service manager does.
    prefix = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups",
              f"--inh-caps={caps}", f"--ambient-caps={caps}"]  # fmt: skip
    env = user_root.env
    offline = under(prefix, "run", "--agent", user_root.agent, "shell.exec", env=env, input=probe,
                    cwd=user_root.top)  # fmt: skip
    assert offline.rc == 1 and "root's own" not in offline.out, offline
    agent = user_root.agent
    with open(user_root.storage / "agent" / f"{agent}.d" / "policy", "a") as policy:
        policy.write(f"allow {agent}_t network:default connect\n")
    online = under(prefix, "run", "--agent", user_root.agent, "shell.exec", env=env, input=probe,
                   cwd=user_root.top)  # fmt: skip
    assert TRACEBACK not in online.err, online
    assert "root's own" not in online.out, online
    assert held_capabilities(online.out) == {"CapPrm": 0, "CapEff": 0, "CapAmb": 0}, online


# ------------------------------------------------------------------------------ signals


def test_ctx_run_started_with_sigchld_ignored_reports_the_tools_exit_status(
    world: World,
) -> None:
    """T-3 (terminal mode: ``ctx run`` exits with the tool's status; native mode: the result's
    ``exit_status``), S-2: a caller that left SIGCHLD ignored (inherited across exec) must not
    change what ``ctx run`` says of a tool that exits 3."""
    prefix = ignoring("SIGCHLD")
    terminal = world.under(prefix, "run", "--agent", AGENT, "shell.exec", "exit 3")
    assert terminal.rc == 3, terminal
    native = world.under(prefix, "run", "--native", "--agent", AGENT, "shell.exec",
                         input=json.dumps({"cmd": "exit 3"}))  # fmt: skip
    result = json.loads(native.lines()[-1])
    assert (native.rc, result["status"], result["exit_status"]) == (1, "error", 3), native


def test_a_worker_started_with_sigchld_ignored_fails_a_failing_job(world: World) -> None:
    """W-1 (done/ on success, failed/ on a non-zero exit), I-3: under an inherited SIGCHLD
    ignored, a job whose tool exits 3 is finished in failed/ with exit status 3, one that
    exits 0 in done/; the queue is consistent."""
    bad = world.publish("exit 3", name="bad")
    good = world.publish("true", name="good")
    run = world.under(ignoring("SIGCHLD"), "queue", "work", "--project", "proj", "--agent",
                      AGENT, "--drain")  # fmt: skip
    assert run.rc == 0 and TRACEBACK not in run.err, run
    assert world.queue.state(good) == "done"
    state, result = world.queue.only_result(bad)
    assert (state, result["status"], result.get("exit_status")) == ("failed", "error", 3), result
    world.queue.assert_settled()


def test_agent_start_with_sigchld_ignored_says_what_it_did(world: World) -> None:
    """A-1, A-2 (docs/tools.md: a start that fails leaves nothing running or mounted), README
    (errors read ``ctx: ERRNO: what to do``): started with SIGCHLD ignored, ``ctx agent
    start`` either starts the terminal and says so (exit 0), or fails with nothing left
    running and no runtime directory; never a failure with the terminal up."""
    session = new_session()
    with terminals(world) as sessions:
        sessions.append(session)
        started = world.under(ignoring("SIGCHLD"), *start_args(world, session))
        assert TRACEBACK not in started.err, started
        if started.rc == 0:
            said = typed_in_terminal(world, session, "shell.exec 'echo ran-as-$(id -u)'",
                                     f"ran-as-{NOBODY_UID}")  # fmt: skip
            assert f"ran-as-{NOBODY_UID}" in said, said
        else:
            # A start that fails has ended what it started before it returns (docs/tools.md).
            assert world.terminal_left(session) == [], started
            assert wait_for(lambda: processes_of(world.storage) == [], 30), started


def _blocked_and_pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` waits on process ``pid``, blocked: it is not delivered unless the
    process unblocks it."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    bit = 1 << (signum - 1)
    pending = int(status_field(text, "ShdPnd"), 16) | int(status_field(text, "SigPnd"), 16)
    return bool(int(status_field(text, "SigBlk"), 16) & bit and pending & bit)


def test_a_worker_started_with_sigterm_blocked_still_stops_on_sigterm(world: World) -> None:
    """W-4 (SIGTERM to a worker lets the running job finish, then it exits cleanly),
    docs/workers.md "Signals": a worker whose starter left SIGTERM blocked (the mask is
    inherited across exec) takes SIGTERM like any other: it stops and exits 0."""
    log = world.top / "worker.jsonl"
    with open(log, "wb") as out:
        argv = [*ignoring(block="SIGTERM"), *CTX_ARGV, "queue", "work", "--project", "proj",
                "--agent", AGENT, "--json"]  # fmt: skip
        worker = subprocess.Popen(argv, env=world.env, stdout=out, stderr=subprocess.DEVNULL,
                                  stdin=subprocess.DEVNULL)  # fmt: skip
    try:
        assert wait_for(lambda: '"start"' in log.read_text(), 30), log.read_text()
        worker.send_signal(signal.SIGTERM)
        wait_for(lambda: worker.poll() is not None
                 or _blocked_and_pending(worker.pid, signal.SIGTERM), 30)  # fmt: skip
        assert worker.poll() == 0, "SIGTERM waits on the worker, blocked"
        assert read_jsonl(log)[-1]["stopped_by"] == "SIGTERM"
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_a_terminal_started_with_sigterm_blocked_takes_sigterm(world: World) -> None:
    """A-1, A-2 (docs/tools.md: ``ctx agent stop`` sends the terminal SIGTERM and it ends,
    cleaning up): a terminal whose starter left SIGTERM blocked ends on SIGTERM all the same,
    with its runtime directory removed."""
    session = new_session()
    with terminals(world) as sessions:
        sessions.append(session)
        started = world.under(ignoring(block="SIGTERM"), *start_args(world, session))
        assert started.rc == 0, started
        pid = int((world.run_dir(session) / "pid").read_text())
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}")
                 or _blocked_and_pending(pid, signal.SIGTERM), 30)  # fmt: skip
        assert not os.path.exists(f"/proc/{pid}"), "SIGTERM waits on the terminal, blocked"
        assert wait_for(lambda: processes_of(world.storage) == [], 30), started
        assert world.terminal_left(session) == []


PIPE_BIT = 1 << (signal.SIGPIPE - 1)  # SIGPIPE's bit in /proc/PID/status's signal masks


def test_inherited_dispositions_and_mask_stay_out_of_tools_and_pipes_still_end_141(
    world: World,
) -> None:
    """T-3, W-1, §2.4 (141 when the reader of the output left): with SIGPIPE ignored and
    SIGTERM and SIGUSR1 blocked by the starter, the tool of ``ctx run`` and of a worker's job
    starts with SIGPIPE not ignored and no signal blocked, and ``ctx queue list | head -1``
    still ends 141 (128 + SIGPIPE) without a traceback.  (What the test run itself may have
    ignored before the starter, the tool inherits as any program does.)"""
    prefix = ignoring("SIGPIPE", block="SIGTERM,SIGUSR1")
    probe = "grep -E '^Sig(Blk|Ign)' /proc/self/status"
    run = world.under(prefix, "run", "--agent", AGENT, "shell.exec", input=json.dumps(
        {"cmd": probe}))  # fmt: skip
    assert run.rc == 0, run
    assert int(status_field(run.out, "SigBlk"), 16) == 0, run
    assert not int(status_field(run.out, "SigIgn"), 16) & PIPE_BIT, run
    job = world.publish(f"{probe} > {world.out}/sigs")
    drained = world.under(prefix, "queue", "work", "--project", "proj", "--agent", AGENT,
                          "--drain")  # fmt: skip
    assert drained.rc == 0 and world.queue.state(job) == "done", drained
    seen = (world.out / "sigs").read_text()
    assert int(status_field(seen, "SigBlk"), 16) == 0, seen
    assert not int(status_field(seen, "SigIgn"), 16) & PIPE_BIT, seen

    lines = "".join(json.dumps(shell_job("true")) + "\n" for _ in range(2000))
    assert world.ctx("queue", "publish", "--project", "proj", "--batch", "-", input=lines).rc == 0
    listing = subprocess.Popen([*prefix, *CTX_ARGV, "queue", "list", "--project", "proj"],
                               env=world.env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)  # fmt: skip
    assert listing.stdout is not None
    listing.stdout.readline()
    listing.stdout.close()
    _, err = listing.communicate(timeout=60)
    assert listing.returncode == 141 and TRACEBACK not in err.decode(), err


def test_a_terminal_under_a_subreaper_that_is_not_dumpable_starts_and_stops(
    world: World,
) -> None:
    """A-1, A-2: started by a parent that is a child subreaper and not dumpable (a CI runner,
    a container's init), ``ctx agent start`` leaves its terminal adopted by that parent
    rather than by init; a tool typed there runs as the agent, and ``ctx agent stop`` run by
    the same parent ends it, with nothing left running or under /run."""
    session = new_session()
    start = [*CTX_ARGV, *start_args(world, session)]
    stop = [*CTX_ARGV, "agent", "stop", AGENT, "--session", session]
    with terminals(world) as sessions:
        sessions.append(session)
        stepper = subprocess.Popen([sys.executable, "-c", STEPPER, json.dumps([start, stop])],
                                   env=world.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True)  # fmt: skip
        assert stepper.stdin is not None and stepper.stdout is not None
        try:
            parent = json.loads(stepper.stdout.readline())
            assert parent["dumpable"] == 0, parent
            stepper.stdin.write("\n")
            stepper.stdin.flush()
            status, out, err = json.loads(stepper.stdout.readline())
            assert status == 0, err
            pid = int((world.run_dir(session) / "pid").read_text())
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            assert ppid == parent["pid"], (pid, ppid, parent)
            said = typed_in_terminal(world, session, "shell.exec 'echo ran-as-$(id -u)'",
                                     f"ran-as-{NOBODY_UID}")  # fmt: skip
            assert f"ran-as-{NOBODY_UID}" in said, said
            stepper.stdin.write("\n")
            stepper.stdin.flush()
            status, out, err = json.loads(stepper.stdout.readline())
            assert status == 0 and out.startswith(f"stopped {AGENT}"), (out, err)
        finally:
            stepper.stdin.close()
            stepper.wait(timeout=60)
        assert wait_for(lambda: processes_of(world.storage) == [], 30)
        assert world.terminal_left(session) == []


def test_a_claim_held_by_a_users_non_dumpable_subreaper_parent_is_kept_then_requeued(
    user_root: UserRoot,
) -> None:
    """Q-3, Q-5, §2.4 (``ctx queue claim`` leases on behalf of its parent): an ordinary user's
    claim made from a parent that is a child subreaper and not dumpable names that parent,
    with its start time; ``ctx queue recover`` keeps the claim while the parent lives, even
    though its /proc entries are closed to ptrace-style reads, and requeues it once the
    parent has exited."""
    user, env = user_root.user, user_root.env
    project = user_root.agent  # a queue of this test's own
    made = user_root.ctx([], "queue", "init", "--project", project)
    assert made.rc == 0, made
    published = user_root.ctx([], "queue", "publish", "--project", project, "--name", "held", "-",
                              input=json.dumps(shell_job("true")))  # fmt: skip
    assert published.rc == 0, published
    queue = QueueCLI(user_root.storage, project)
    claim = [*CTX_ARGV, "queue", "claim", "--project", project]
    stepper = subprocess.Popen([sys.executable, "-c", STEPPER, json.dumps([claim])], env=env,
                               cwd=user_root.top, user=user.uid, group=user.gid, extra_groups=[],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True)  # fmt: skip
    assert stepper.stdin is not None and stepper.stdout is not None
    try:
        parent = json.loads(stepper.stdout.readline())
        assert parent["dumpable"] == 0, parent
        stepper.stdin.write("\n")
        stepper.stdin.flush()
        status, out, err = json.loads(stepper.stdout.readline())
        assert (status, out) == (0, "held.req.json\n"), err
        lease = queue.lease("held.req.json")
        assert lease["pid"] == parent["pid"] and lease.get("create_time"), lease
        kept = user_root.ctx([], "queue", "recover", "--project", project, "--json")
        assert kept.rc == 0 and kept.json()["requeued"] == [], kept
        assert queue.state("held.req.json") == "claimed"
    finally:
        stepper.stdin.close()
        stepper.wait(timeout=60)
    requeued = user_root.ctx([], "queue", "recover", "--project", project, "--json")
    assert requeued.rc == 0, requeued
    assert [e["job"] for e in requeued.json()["requeued"]] == ["held.req.json"], requeued
    assert queue.state("held.req.json") == "pending"
