"""Black-box helpers: run the installed ``ctx`` command in a subprocess and look at the files
it leaves behind.  Nothing here imports the product."""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.users import UnprivilegedUser

REPO = Path(__file__).resolve().parents[2]
CTX_ARGV = [str(REPO / ".venv" / "bin" / "ctx")]

ROOT_ENTRIES = {"bin", "tool", "agent", "model", "home", "shared"}
QUEUE_SUBDIRS = {"inbox", "pending", "lease", "claimed", "done", "failed"}
# D-1: the manual's topics and the pages of the bundle's man/ that hold them.
MAN_PAGES = {
    "agent": "ctx.agent.md",
    "tool": "ctx.tool.md",
    "model": "ctx.model.md",
    "coreutils": "ctx.coreutils.md",
    "root-abi": "ctx.root-abi.md",
    "session": "ctx.session.md",
    "provider": "ctx.provider.md",
}
SUFFIX = ".req.json"

# A mount needs the kernel's FUSE device and, as any user but root, fusermount3.
needs_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3",
)
needs_fuse_as_root = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or os.geteuid() != 0, reason="needs /dev/fuse and root"
)
OBJECT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def scratch_top(test_file: str) -> Path:
    """``/tmp/<stem of test_file>-<uid>``: where a flow file keeps its scratch directories.
    One per uid, so that a user running the suite after root is not refused root's."""
    return Path("/tmp") / f"{Path(test_file).stem}-{os.geteuid()}"


def new_scratch_dir(top: Path, prefix: str = "t") -> Path:
    """A new directory below ``top`` (a :func:`scratch_top`, made if need be), both mode 0755
    whatever the umask, so that agents and the second test users can reach what a flow keeps
    there."""
    top.mkdir(mode=0o755, exist_ok=True)
    top.chmod(0o755)
    made = Path(tempfile.mkdtemp(prefix=prefix, dir=top))
    made.chmod(0o755)
    return made


def read_jsonl(path: Path) -> list[dict]:
    """The objects of a JSON-lines file, blank lines left out; none when there is no file."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def clean_env(**extra: str) -> dict[str, str]:
    """The caller's environment without any CortexFS setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    env.update(extra)
    return env


@dataclass(repr=False)
class Run:
    """What one ``ctx`` command did: argv after ``ctx``, exit status, stdout, stderr."""

    argv: list[str]
    rc: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)

    def lines(self) -> list[str]:
        return self.out.splitlines()

    def __repr__(self) -> str:  # shown by pytest when an assertion on a Run fails
        command = " ".join(self.argv)
        return f"$ ctx {command}\nexit {self.rc}\nstdout: {self.out!r}\nstderr: {self.err!r}"


def ctx_run(
    *args: str | os.PathLike,
    input: str | bytes | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
) -> Run:
    """Run ``ctx ARGS...`` directly (no shell): its parent process is this test process."""
    argv = [*CTX_ARGV, *map(str, args)]
    if isinstance(input, str):
        input = input.encode()
    proc = subprocess.run(
        argv,
        input=input if input is not None else b"",
        capture_output=True,
        env=env if env is not None else clean_env(),
        cwd=cwd,
        timeout=timeout,
    )
    return Run(
        argv[len(CTX_ARGV) :],
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )


class OnStorage:
    """For a test's world holding a ``storage`` root: ``env`` and ``ctx`` aimed at it."""

    storage: Path

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def create_agent(self, request: dict, *options: str) -> dict:
        """``ctx agent create -`` of ``request`` (with ``options``), which must succeed: its
        ``--json`` answer."""
        made = self.ctx("agent", "create", "-", "--json", *options, input=json.dumps(request))
        assert made.rc == 0, made
        return made.json()

    def allow_tool(self, label: str, *tools: str) -> None:
        """The tool layer of P-6, the host's to give: ``allow LABEL tool:T execute`` in each
        ``tool/T.d/policy``."""
        for tool in tools:
            with (self.storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
                policy.write(f"allow {label} tool:{tool} execute\n")


def write_durably(directory: Path, name: str, data: bytes) -> None:
    """``directory/name`` written as an application that wants it on disk does: a temp file
    written and fsynced, renamed into place, the directory fsynced."""
    temp = directory / f"{name}.part"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(temp, directory / name)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def request(tool: str = "fs.read", **extra) -> dict:
    """A request object with the §2.1 fields."""
    req = {
        "tool": tool,
        "input": {"path": "README.md"},
        "from": "tester",
        "created": "2026-06-22T12:00:00Z",
    }
    req.update(extra)
    return req


def result(state: str = "done", output=None) -> dict:
    """A result object with the §2.1 fields."""
    return {
        "status": "ok" if state == "done" else "error",
        "output": output if output is not None else {"answer": 42},
        "worker": {"worker": "tester"},
        "started": "2026-06-22T12:00:00Z",
        "finished": "2026-06-22T12:00:01Z",
    }


def snapshot(top: Path) -> dict[str, tuple]:
    """Every entry under ``top`` (never following links): kind plus content or target."""
    tree: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            rel = str(p.relative_to(top))
            if p.is_symlink():
                tree[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                tree[rel] = ("dir",)
            elif p.is_file():
                tree[rel] = ("file", p.read_bytes())
            else:
                tree[rel] = ("other",)
    return tree


def find_values(obj, key: str) -> list:
    """Every value stored under ``key`` anywhere in a parsed JSON document."""
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                found.append(v)
            found.extend(find_values(v, key))
    elif isinstance(obj, list):
        for v in obj:
            found.extend(find_values(v, key))
    return found


class QueueCLI:
    """One project queue, driven only through ``ctx queue ...``."""

    def __init__(self, storage: Path, project: str) -> None:
        self.storage = storage
        self.project = project
        self.dir = storage / "shared" / project / "queue"

    def run(self, command: str, *args, **kw) -> Run:
        kw.setdefault("env", clean_env(CTX_STORAGE=str(self.storage)))
        return ctx_run("queue", command, "--project", self.project, *args, **kw)

    def publish(self, req: dict | None = None, name: str | None = None) -> str:
        args = ["--name", name] if name else []
        r = self.run("publish", *args, "-", input=json.dumps(req or request()))
        assert r.rc == 0, r
        return r.out.strip()

    def drop(self, name: str, req: dict | None = None) -> str:
        """Put a request straight into ``pending/`` (its only evidence, §2.1); returns J."""
        job = name if name.endswith(SUFFIX) else name + SUFFIX
        (self.dir / "pending" / job).write_text(json.dumps(req or request(tag=name)))
        return job

    def terminal(self, name: str, state: str = "done") -> str:
        """Write a finished job's pair ``STATE/J`` and ``STATE/J.result`` straight to disk."""
        job = name if name.endswith(SUFFIX) else name + SUFFIX
        (self.dir / state / job).write_text(json.dumps(request(tag=name)))
        (self.dir / state / f"{job}.result").write_text(json.dumps(result(state)))
        return job

    def claim(self, *args) -> str:
        r = self.run("claim", *args)
        assert r.rc == 0, r
        return r.out.strip()

    def finish(self, job: str, flag: str = "--ok", output: dict | None = None) -> Run:
        r = self.run("finish", job, flag, "-", input=json.dumps(output or {"answer": 42}))
        assert r.rc == 0, r
        return r

    def lease(self, job: str) -> dict:
        return json.loads((self.dir / "lease" / job / "worker").read_text())

    def write_lease(self, job: str, lease: dict) -> None:
        (self.dir / "lease" / job / "worker").write_text(json.dumps(lease))

    def state(self, job: str) -> str | None:
        """The §2.1 state whose complete evidence is on disk, else None."""
        d = self.dir
        if (d / "pending" / job).is_file():
            return "pending"
        if (d / "claimed" / job / job).is_file() and (d / "lease" / job / "worker").is_file():
            return "claimed"
        for terminal in ("done", "failed"):
            if (d / terminal / job).is_file() and (d / terminal / f"{job}.result").is_file():
                return terminal
        return None

    def entries(self, sub: str) -> set[str]:
        return set(os.listdir(self.dir / sub))

    def only_result(self, job: str) -> tuple[str, dict]:
        """The one terminal state holding J's pair, J nowhere else (I-1, Q-6), and its result."""
        d = self.dir
        states = [s for s in ("done", "failed") if (d / s / job).is_file()]
        results = [s for s in ("done", "failed") if (d / s / f"{job}.result").is_file()]
        assert states == results and len(states) == 1, (job, states, results)

        def left_elsewhere() -> list[str]:
            return [s for s in ("pending", "claimed", "lease") if (d / s / job).exists()]

        # The pair in place is done, but the finish that put it there may still be
        # removing claimed/J and lease/J: a finish's last step, not a leftover, for a moment.
        wait_for(lambda: not left_elsewhere(), 10)
        assert not left_elsewhere(), (job, left_elsewhere())
        return states[0], json.loads((d / states[0] / f"{job}.result").read_text())

    def assert_settled(self) -> None:
        """Nothing in flight, and recover (plain, then --reconcile) calls the queue consistent
        and changes nothing (I-5)."""
        for sub in ("pending", "claimed", "lease", "inbox"):
            assert self.entries(sub) == set(), (sub, self.entries(sub))
        before = snapshot(self.dir)
        for args in ((), ("--reconcile",)):
            r = self.run("recover", "--json", *args)
            assert r.rc == 0 and r.json()["consistent"] is True, r
            assert r.json()["requeued"] == [] and r.json()["repaired"] == [], r
        assert snapshot(self.dir) == before

    def requests(self) -> dict[str, list[str]]:
        """Every job name with the states its request is in (``claimed`` for
        ``claimed/J/J``): one state each, when nothing was lost or duplicated."""
        seen: dict[str, list[str]] = {}
        for state in ("pending", "done", "failed"):
            for name in os.listdir(self.dir / state):
                if not name.endswith(".result"):
                    seen.setdefault(name, []).append(state)
        for name in os.listdir(self.dir / "claimed"):
            if (self.dir / "claimed" / name / name).is_file():
                seen.setdefault(name, []).append("claimed")
        return seen


def kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def is_object_name(name: str) -> bool:
    """R-3: 1..64 bytes of [A-Za-z0-9._-], first byte alphanumeric, not ending in ``.d``."""
    return bool(OBJECT_NAME.fullmatch(name)) and not name.endswith(".d")


def rfc3339(stamp: str) -> datetime:
    """Parse an RFC 3339 timestamp (with ``Z`` or an offset) to an aware datetime."""
    parsed = datetime.fromisoformat(stamp)
    assert parsed.tzinfo is not None, f"{stamp!r} has no time zone"
    return parsed


def age(path: Path, seconds: float) -> None:
    """Make ``path`` look ``seconds`` old."""
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def tool_manifest(
    directory: Path,
    name: str,
    program: str,
    *,
    side_effects: bool = False,
    description: str | None = None,
) -> Path:
    """A v2 manifest (T-8) of tool ``name`` whose executable is the shell text ``program``,
    taking any JSON object as input, written in ``directory`` (made when missing)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.sh").write_text(program)
    path = directory / f"{name}.json"
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": name,
        "description": description or f"The {name} test tool.",
        "schema": {"type": "object"},
        "cap": {"side_effects": side_effects, "network": False},
        "exec": f"{name}.sh",
    }
    path.write_text(json.dumps(document))
    return path


@contextlib.contextmanager
def closing_all() -> Iterator[list]:
    """What the block puts in the list (sockets, clients), closed in reverse order on the way
    out, whatever happened in the block."""
    opened: list = []
    try:
        yield opened
    finally:
        for thing in reversed(opened):
            thing.close()


def requests_by_state(queue: Path) -> dict[str, list[str]]:
    """Every job of ``queue`` with the states its request is in (``claimed`` for
    ``claimed/J/J``): one state each, unless the queue lost or doubled a job."""
    seen: dict[str, list[str]] = {}
    for state in ("pending", "done", "failed"):
        for name in os.listdir(queue / state):
            if not name.endswith(".result"):
                seen.setdefault(name, []).append(state)
    for name in os.listdir(queue / "claimed"):
        if (queue / "claimed" / name / name).is_file():
            seen.setdefault(name, []).append("claimed")
    return seen


def wait_for(predicate, seconds: float = 20, step: float = 0.05) -> bool:
    """Whether ``predicate()`` holds within ``seconds``, asked every ``step``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone before, or between open and read
        return False
    return state != "Z"


def processes_of(top: Path) -> list[int]:
    """Live processes (not this one) whose command line names something under ``top``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if str(top).encode() in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                found.append(int(entry.name))
    return found


def kill_processes_of(top: Path) -> None:
    """SIGKILL every process of :func:`processes_of` ``top``: what a test started under it and
    left running (servers, their daemons)."""
    for pid in processes_of(top):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


MOUNT_WAIT = 15.0  # seconds for `ctx mount` to mount, and to end after `ctx umount`


def mounted_at(mountpoint: Path) -> bool:
    target = str(mountpoint)
    with open("/proc/self/mountinfo") as table:
        return any(line.split()[4] == target for line in table)


@contextlib.contextmanager
def ctx_mount(storage: Path, mountpoint: Path, *args: str) -> Iterator[subprocess.Popen]:
    """``ctx mount MOUNTPOINT ARGS`` running in the background until the block ends."""
    mountpoint.mkdir(exist_ok=True)
    argv = [*CTX_ARGV, "mount", "--storage", str(storage), *args, str(mountpoint)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env())  # fmt: skip
    try:
        deadline = time.monotonic() + MOUNT_WAIT
        while not mounted_at(mountpoint):
            if proc.poll() is not None:
                out, err = proc.communicate()
                pytest.fail(f"ctx mount exited {proc.returncode}: {err.decode()}{out.decode()}")
            assert time.monotonic() < deadline, "ctx mount did not mount in time"
            time.sleep(0.05)
        yield proc
    finally:
        if mounted_at(mountpoint):
            ctx_run("umount", mountpoint)
        if mounted_at(mountpoint):
            subprocess.run(["umount", "-l", str(mountpoint)], check=False)
        try:
            proc.wait(timeout=MOUNT_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Mount:
    """One ``ctx mount`` process and where its standard error goes."""

    proc: subprocess.Popen
    where: Path
    log: Path

    def said(self) -> str:
        return self.log.read_text()


@contextlib.contextmanager
def serving(storage: Path, where: Path, *args: str, nofile: int | None = None) -> Iterator[Mount]:
    """``ctx mount --storage STORAGE ARGS WHERE`` in the background until the block ends;
    then unmounted (``ctx umount``, else lazily) and its process ended.  ``nofile``: the
    daemon's descriptor limit (an operator's shell commonly has 1024), else this process's."""
    log = where.with_name(where.name + ".stderr")

    def limited() -> None:
        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [*CTX_ARGV, "mount", "--storage", str(storage), *args, str(where)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            env=clean_env(), start_new_session=True,
            preexec_fn=None if nofile is None else limited,
        )  # fmt: skip
    mount = Mount(proc, where, log)
    try:
        deadline = time.monotonic() + MOUNT_WAIT
        while not mounted_at(where):
            assert proc.poll() is None, f"ctx mount exited {proc.returncode}: {mount.said()}"
            assert time.monotonic() < deadline, "ctx mount did not mount in time"
            time.sleep(0.05)
        yield mount
    finally:
        if mounted_at(where):
            ctx_run("umount", where, timeout=30)
        if mounted_at(where):
            subprocess.run(["umount", "-l", str(where)], check=False)
        try:
            proc.wait(timeout=MOUNT_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def limited(
    env: dict[str, str],
    *args,
    input: str | bytes = b"",
    fsize: int | None = None,
    nofile: int | None = None,
    nproc: int | None = None,
    address_space: int | None = None,
    data: int | None = None,
    cpu: int | None = None,
    cpu_spent: float = 0.0,
    sigxfsz=signal.SIG_DFL,
    user: UnprivilegedUser | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
) -> Run:
    """``ctx ARGS…`` in a child whose limits (soft and hard, as ``prlimit`` sets them) are
    the ones given, with ``SIGXFSZ`` set to ``sigxfsz`` before the exec; ``cpu_spent``
    seconds of CPU are used up in the child first (CPU time survives the exec); ``user``:
    run as that uid, the limits set after the switch; ``timeout``: one only a hang reaches."""
    limits = [
        (resource.RLIMIT_FSIZE, fsize),
        (resource.RLIMIT_NOFILE, nofile),
        (resource.RLIMIT_NPROC, nproc),
        (resource.RLIMIT_AS, address_space),
        (resource.RLIMIT_DATA, data),
    ]

    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, sigxfsz)
        # Ignored by whatever started the suite (a CI runner may), SIGXCPU would be ignored
        # by the command too, which then runs on to the hard limit.
        signal.signal(signal.SIGXCPU, signal.SIG_DFL)
        started = time.process_time()
        while time.process_time() - started < cpu_spent:
            pass
        if cpu is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 2))
        for which, value in limits:
            if value is not None:
                resource.setrlimit(which, (value, value))

    as_user = {}
    if user is not None:
        as_user = {"user": user.uid, "group": user.gid, "extra_groups": []}
    proc = subprocess.run(
        [*CTX_ARGV, *map(str, args)],
        input=input.encode() if isinstance(input, str) else input,
        capture_output=True,
        env=env,
        cwd=cwd,
        preexec_fn=preexec,
        timeout=timeout,
        **as_user,
    )
    return Run(
        [str(a) for a in args],
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )
