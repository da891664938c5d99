"""CortexFS under the limits of a control group of its own (SPEC §2 Q-1, Q-5, Q-6, I-1, I-2,
I-4, I-5, §2.4, §3 W-1 … W-4, §4 S-2, S-5, §6 T-3, T-6, T-7, §8 A-1, §10 M-1): real ``ctx``,
``ctxmcp`` and worker processes started inside a new child cgroup under ``/sys/fs/cgroup``
whose ``memory`` or ``pids`` limit, or whose freezer, the kernel applies to them and to
everything they start.  Unlike the per-process rlimits of the tight-limits file, a cgroup
limit binds root as well, counts every thread and process of the whole tree, and ends a
process with the OOM killer's SIGKILL rather than with ``ENOMEM``.

* memory: a tool the OOM killer ends fails its call (``exit_status`` 137, stage ``exit``) and
  its job once, and the worker goes on; a worker the OOM killer chooses mid-job leaves the job
  claimed, none of its tool runs on, and ``ctx queue recover`` requeues it (Q-5); a
  ``publish --batch`` killed at any memory level, ``ctx`` unable even to start included,
  leaves only whole requests (I-2) and what ``recover --reconcile`` settles.
* pids: a tool that forks until ``pids.max`` fails its own job only; a tool or a pre-hook the
  host cannot start (``EAGAIN``) is a host shortage, not a job's failure; a worker whose slot
  thread cannot start still ends its ``--json`` output with its summary; ``ctx agent start``
  and ``ctxmcp`` refuse with ``EAGAIN`` and leave nothing running.
* freezer: a worker frozen (``cgroup.freeze``, v1 ``freezer.state``), as a starved process is,
  until its lease lapses has the job requeued by ``recover``; it reports the job ``lost`` and
  it is finished once.

Each test makes its own cgroups and removes them (killing, by pid, whatever of its own is
still in them).  cgroup v2 is used where the unified hierarchy holds the controllers (they
are enabled in ``cgroup.subtree_control`` when missing); on a hybrid host whose controllers
are bound to v1 hierarchies, the v1 files of the same limits are used.  Where neither can be
made the tests are skipped."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    clean_env,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.workercli import AGENT, allow_in_tool_policy, make_agent, shell_job
from tests.support.locks import lock_is_free

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="making cgroups needs root")

CGROUP = Path("/sys/fs/cgroup")
SCRATCH = scratch_top(__file__)
CTXMCP = str(Path(CTX_ARGV[0]).with_name("ctxmcp"))
PYTHON3 = "/usr/bin/python3"  # on the tools' PATH (/usr/local/bin:/usr/bin:/bin)
TRACEBACK = "Traceback (most recent call last)"
MIB = 1 << 20
WAIT = 20.0
_numbers = itertools.count()

needs_python3 = pytest.mark.skipif(
    not os.access(PYTHON3, os.X_OK), reason=f"the tools here need {PYTHON3}"
)

# ------------------------------------------------------------------------------ cgroups


def _write(path: Path, value: str | int) -> None:
    with open(path, "w") as f:
        f.write(f"{value}\n")


@dataclass
class Cgroup:
    """A child cgroup of this test's: one directory holding every controller (v2), or one
    directory per controller hierarchy (v1)."""

    v2: bool
    dirs: dict[str, Path]

    def _dir(self, controller: str) -> Path:
        return self.dirs[controller]

    def limit_memory(self, nbytes: int) -> None:
        """``memory.max`` (v1 ``memory.limit_in_bytes``), swap included where there is swap."""
        d = self._dir("memory")
        if self.v2:
            _write(d / "memory.max", nbytes)
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", 0)
        else:
            _write(d / "memory.limit_in_bytes", nbytes)
            if (d / "memory.memsw.limit_in_bytes").exists():
                _write(d / "memory.memsw.limit_in_bytes", nbytes)

    def limit_pids(self, n: int) -> None:
        _write(self._dir("pids") / "pids.max", n)

    def freeze(self, frozen: bool) -> None:
        """Freeze or thaw every process of the group, and wait until the kernel says it is
        done (v2 ``cgroup.events`` ``frozen``, v1 ``freezer.state``)."""
        d = self._dir("freezer")
        if self.v2:
            _write(d / "cgroup.freeze", int(frozen))
            state, want = d / "cgroup.events", f"frozen {int(frozen)}"
        else:
            want = "FROZEN" if frozen else "THAWED"
            _write(d / "freezer.state", want)
            state = d / "freezer.state"
        assert wait_for(lambda: want in state.read_text().splitlines(), WAIT), f"{d}: not {want}"

    def pids_current(self) -> int:
        return int((self._dir("pids") / "pids.current").read_text())

    def oom_kills(self) -> int:
        """How many processes of the group the OOM killer ended."""
        d = self._dir("memory")
        text = (d / ("memory.events" if self.v2 else "memory.oom_control")).read_text()
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        raise AssertionError(f"no oom_kill count in {d}")

    def procs(self) -> set[int]:
        found: set[int] = set()
        for d in set(self.dirs.values()):
            with contextlib.suppress(FileNotFoundError):
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return found

    def join(self) -> None:
        """For ``preexec_fn``: move the calling (child) process into the group."""
        for d in set(self.dirs.values()):
            _write(d / "cgroup.procs", os.getpid())

    def remove(self) -> None:
        """SIGKILL, by pid, what is still in the group (what this test started there), then
        remove its directories."""
        if "freezer" in self.dirs:  # a frozen process dies only once thawed
            with contextlib.suppress(OSError, AssertionError):
                self.freeze(False)
        deadline = time.monotonic() + WAIT
        for d in set(self.dirs.values()):
            while d.exists():
                members = []
                with contextlib.suppress(FileNotFoundError):
                    members = (d / "cgroup.procs").read_text().split()
                for pid in members:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                if not members:
                    with contextlib.suppress(OSError):
                        d.rmdir()
                if time.monotonic() > deadline:
                    raise AssertionError(f"cgroup {d} could not be removed: {members}")
                time.sleep(0.02)


LIMIT_FILES = {
    True: {"memory": "memory.max", "pids": "pids.max", "freezer": "cgroup.freeze"},
    False: {"memory": "memory.limit_in_bytes", "pids": "pids.max", "freezer": "freezer.state"},
}
# In v2 every child group can be frozen: freezing is no controller to enable.
BUILT_IN_V2 = frozenset({"freezer"})


def new_cgroup(controllers: tuple[str, ...]) -> Cgroup:
    """A new child cgroup with ``controllers`` usable, or the test is skipped saying why."""
    name = f"ctx-cgroup-limits-{os.getpid()}-{next(_numbers)}"
    if (CGROUP / "cgroup.controllers").is_file():
        available = (CGROUP / "cgroup.controllers").read_text().split()
        missing = [c for c in controllers if c not in available and c not in BUILT_IN_V2]
        if missing:
            pytest.skip(f"cgroup v2 at {CGROUP} lacks the controllers {missing}")
        enabled = (CGROUP / "cgroup.subtree_control").read_text().split()
        for c in controllers:
            if c not in enabled and c not in BUILT_IN_V2:
                try:
                    _write(CGROUP / "cgroup.subtree_control", f"+{c}")
                except OSError as exc:
                    pytest.skip(f"cannot enable the {c} controller under {CGROUP}: {exc}")
        path = CGROUP / name
        try:
            path.mkdir()
        except OSError as exc:
            pytest.skip(f"cannot make a cgroup under {CGROUP}: {exc}")
        group = Cgroup(True, dict.fromkeys(controllers, path))
    else:
        dirs = {}
        group = Cgroup(False, dirs)
        for c in controllers:
            base = CGROUP / c
            if not (base / "cgroup.procs").is_file():
                group.remove()
                pytest.skip(f"no cgroup v2 controllers and no v1 hierarchy {base}")
            try:
                (base / name).mkdir()
            except OSError as exc:
                group.remove()
                pytest.skip(f"cannot make a cgroup under {base}: {exc}")
            dirs[c] = base / name
    for c in controllers:
        if not (group.dirs[c] / LIMIT_FILES[group.v2][c]).exists():
            group.remove()
            pytest.skip(f"{group.dirs[c]} has no {LIMIT_FILES[group.v2][c]}")
    return group


@pytest.fixture
def cgroups() -> Iterator[Callable[..., Cgroup]]:
    """Make cgroups with ``cgroups("memory", "pids")``; all removed at the end."""
    made: list[Cgroup] = []

    def make(*controllers: str) -> Cgroup:
        group = new_cgroup(controllers)
        made.append(group)
        return group

    yield make
    for group in reversed(made):
        group.remove()


# ------------------------------------------------------------------------------ processes

# Runs ARGV as its child and reaps every orphan of its tree (PR_SET_CHILD_SUBREAPER), as an
# init does: the processes of a killed tool then leave the cgroup instead of staying zombies
# on a host whose pid 1 reaps nothing.  ADJ (may be empty) is written to the child's
# oom_score_adj before the exec.  Exits with the child's status, 128 + N after signal N.
REAPER = r"""
import ctypes, os, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
adj, argv = sys.argv[1], sys.argv[2:]
child = os.fork()
if child == 0:
    if adj:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(adj)
    os.execv(argv[0], argv)
status = 0
while True:
    try:
        pid, st = os.wait()
    except ChildProcessError:
        break
    if pid == child:
        status = os.waitstatus_to_exitcode(st)
os._exit(status if status >= 0 else 128 - status)
"""

# Charges memory to its cgroup, 1 MiB at a time, until process PID has ended, never more than
# CAP MiB: alone it fits the limit, beside that process it does not.  Exit 0 once PID has
# ended, 3 if it is still there after 10 s.
HOG = r"""
import sys, time
pid, cap = int(sys.argv[1]), int(sys.argv[2])
def ended():
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
held = []
deadline = time.monotonic() + 10
while not ended() and time.monotonic() < deadline:
    if len(held) < cap:
        held.append(bytearray(1 << 20))
    else:
        time.sleep(0.01)
sys.exit(0 if ended() else 3)
"""

# A stdio MCP server with one tool, "t".
MCP_SERVER = r"""
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    if message["method"] == "initialize":
        answer = {"protocolVersion": message["params"]["protocolVersion"],
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "s", "version": "1"}}
    elif message["method"] == "tools/list":
        answer = {"tools": [{"name": "t", "description": "A tool.",
                             "inputSchema": {"type": "object"}}]}
    else:
        answer = {}
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": answer}), flush=True)
"""


def run_in(group: Cgroup | None, argv: list[str], env: dict, **kw) -> Run:
    """``argv`` run to its end inside ``group``."""
    kw.setdefault("timeout", 60)
    given = kw.pop("input", b"")
    proc = subprocess.run(
        argv,
        input=given.encode() if isinstance(given, str) else given,
        capture_output=True,
        env=env,
        preexec_fn=group.join if group else None,
        **kw,
    )
    return Run(
        [str(a) for a in argv[1:]],
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )


def ctx_in(group: Cgroup | None, env: dict, *args, **kw) -> Run:
    return run_in(group, [*CTX_ARGV, *map(str, args)], env, **kw)


@dataclass
class Background:
    """A worker started in the background, its output going to files."""

    proc: subprocess.Popen
    out: Path
    err: Path

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]

    def event(self, kind: str) -> dict | None:
        return next((e for e in self.events() if e.get("event") == kind), None)

    def end(self, timeout: float = WAIT) -> int:
        return self.proc.wait(timeout=timeout)


def start_worker(
    group: Cgroup, env: dict, where: Path, *args: str, reaper_adj: str | None = None
) -> Background:
    """``ctx queue work --project proj --agent ci --json ARGS`` in ``group``; under
    :data:`REAPER` when ``reaper_adj`` is given (``""``: no oom_score_adj)."""
    argv = [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", AGENT, "--json", *args]
    if reaper_adj is not None:
        argv = [sys.executable, "-c", REAPER, reaper_adj, *argv]
    n = next(_numbers)
    out, err = where / f"worker-{n}.out", where / f"worker-{n}.err"
    with open(out, "wb") as o, open(err, "wb") as e:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=o, stderr=e, env=env,
                                preexec_fn=group.join)  # fmt: skip
    return Background(proc, out, err)


@contextlib.contextmanager
def thawed_at_end(group: Cgroup) -> Iterator[None]:
    try:
        yield
    finally:
        group.freeze(False)


@contextlib.contextmanager
def stopped_at_end(*workers: Background) -> Iterator[None]:
    try:
        yield
    finally:
        for worker in workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
            worker.proc.wait()


def frames(run: Run) -> list[dict]:
    return [json.loads(line) for line in run.out.splitlines() if line.strip()]


def lines_of(path: Path) -> list[dict]:
    """Every line of ``path`` a whole JSON object ended by a newline (S-5)."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), data[-200:]
    return [json.loads(line) for line in data.decode().splitlines()]


def session_file(root: Path, session: str) -> Path:
    return root / "home" / "65534" / "agent" / AGENT / "session" / session / "events.jsonl"


def waiting_on_inotify(pid: int) -> bool:
    """Whether process ``pid`` holds an inotify watch: a worker waiting for work (W-2)."""
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fdinfo"):
            with contextlib.suppress(OSError):
                if "inotify wd:" in Path(f"/proc/{pid}/fdinfo/{fd}").read_text():
                    return True
    return False


def expired(stamp: str) -> bool:
    return datetime.fromisoformat(stamp).timestamp() < time.time()


# ------------------------------------------------------------------------------ worlds


@dataclass
class World:
    root: Path
    env: dict
    queue: QueueCLI
    out: Path
    scratch: Path


@pytest.fixture
def world(searchable_storage: Path, outbox: Path) -> Iterator[World]:
    """The bootstrapped root (queue ``proj``), agent ``ci`` (uid nobody) allowed
    ``shell.exec`` by both policies (P-6), a directory every uid may write, and a scratch
    directory for the test's own files."""
    make_agent(searchable_storage, ["shell.exec"])
    allow_in_tool_policy(searchable_storage, "shell.exec")
    scratch = new_scratch_dir(SCRATCH)
    env = clean_env(CTX_STORAGE=str(searchable_storage), XDG_CACHE_HOME=str(scratch / "cache"))
    try:
        yield World(searchable_storage, env, QueueCLI(searchable_storage, "proj"), outbox,
                    scratch)  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def publish(world: World, req: dict, name: str | None = None) -> str:
    args = ("--name", name) if name else ()
    done = world.queue.run("publish", *args, "-", input=json.dumps(req), env=world.env)
    assert done.rc == 0, done
    return done.out.strip()


def settled(world: World) -> None:
    """Nothing in flight; recover, plain and --reconcile, finds the queue consistent and
    changes nothing (I-5)."""
    queue = world.queue
    for sub in ("pending", "claimed", "lease", "inbox"):
        assert queue.entries(sub) == set(), (sub, queue.entries(sub))
    before = snapshot(queue.dir)
    for args in ((), ("--reconcile",)):
        again = queue.run("recover", "--json", *args, env=world.env)
        assert again.rc == 0 and again.json()["consistent"] is True, again
        assert (again.json()["requeued"], again.json()["repaired"]) == ([], []), again
    assert snapshot(queue.dir) == before


def gated(world: World, tag: str, busy: bool = False) -> tuple[dict, Path, Path]:
    """A job that notes ``start`` in OUT, waits until RELEASE exists (sleeping, or spinning
    when ``busy``), then notes ``end``: the job, OUT and RELEASE."""
    out, release = world.out / f"{tag}.out", world.out / f"{tag}.release"
    wait = ":" if busy else "sleep 0.05"
    cmd = f"echo start >> {out}; while [ ! -e {release} ]; do {wait}; done; echo end >> {out}"
    return shell_job(cmd), out, release


def text_of(path: Path) -> str:
    return path.read_text() if path.exists() else ""


# ------------------------------------------------------------------------------ memory


def allocate(mib: int) -> str:
    """A shell command whose process allocates and touches ``mib`` MiB."""
    return f'exec {PYTHON3} -c "bytearray({mib} << 20)"'


@needs_python3
def test_a_tool_the_oom_killer_ends_fails_its_call_and_its_job_once(world, cgroups):
    """T-3, T-7, S-2, W-1, W-4, docs/tools.md ("The result": ``exit_status`` 128 + N after
    signal N; a tool that ends by a signal is reported at stage ``exit``): in a cgroup of
    128 MiB, a tool that allocates 512 MiB is ended by the OOM killer.  ``ctx run --native``
    exits 1 with a ``result`` frame ``error``, ``exit_status`` 137, stage ``exit``, the
    session and the tool's log recording that call; terminal mode exits 137.  A worker in the
    same cgroup finishes that job in ``failed/`` once with that reason, is not the one the
    kernel kills, runs the next job, and leaves a consistent queue."""
    group = cgroups("memory")
    group.limit_memory(128 * MIB)
    hog = json.dumps({"cmd": allocate(512)})

    native = ctx_in(group, world.env, "run", "--native", "--agent", AGENT, "--session", "oom",
                    "shell.exec", input=hog)  # fmt: skip
    assert native.rc == 1 and TRACEBACK not in native.err, native
    result = frames(native)[-1]
    assert (result["type"], result["status"], result["exit_status"]) == ("result", "error", 137)
    assert result["error"]["stage"] == "exit" and result["error"]["error"] is None, result
    assert "exited with status 137" in result["error"]["message"], result
    events = lines_of(session_file(world.root, "oom"))
    pair = [e for e in events if e.get("call") == result["call"]]
    assert [e["type"] for e in pair] == ["tool_call", "tool_result"], events
    assert all({"ts", "type", "agent", "session", "object", "status"} <= set(e) for e in pair)
    assert (pair[1]["status"], pair[1]["exit_status"]) == ("error", 137), pair
    logged = [e for e in read_jsonl(world.root / "tool" / "shell.exec.d" / "log")
              if e.get("call") == result["call"]]  # fmt: skip
    assert [e["exit_status"] for e in logged] == [137], logged

    terminal = ctx_in(group, world.env, "run", "--agent", AGENT, "--session", "oom",
                      "shell.exec", allocate(512))  # fmt: skip
    assert terminal.rc == 137 and TRACEBACK not in terminal.err, terminal

    killed = publish(world, shell_job(allocate(512)), "killed")
    fine = publish(world, shell_job("echo fine"), "fine")
    work = ctx_in(group, world.env, "queue", "work", "--project", "proj", "--agent", AGENT,
                  "--drain", "--json")  # fmt: skip
    assert work.rc == 0 and TRACEBACK not in work.err, work
    stop = [e for e in frames(work) if e.get("event") == "stop"]
    assert [(s["done"], s["failed"], s["lost"]) for s in stop] == [(1, 1, 0)], work
    state, record = world.queue.only_result(killed)
    assert state == "failed" and record["exit_status"] == 137, record
    assert record["reason"].endswith("[exit]") and "status 137" in record["reason"], record
    assert world.queue.only_result(fine)[0] == "done"
    assert group.oom_kills() >= 3
    settled(world)


@needs_python3
def test_a_worker_the_oom_killer_ends_mid_job_leaves_it_to_recover_and_nothing_runs_on(
    world, cgroups
):
    """W-4, Q-5, I-1, I-4, S-5, docs/workers.md (SIGKILL "or any death the worker cannot
    handle"; the orphan guard): a worker whose cgroup runs out of memory while its job's
    tool runs is the process the OOM killer ends (``oom_score_adj`` 1000).  Nothing of the
    job's tool runs on in the cgroup; the job is claimed, its session keeps whole lines with
    its ``tool_call`` and no result; ``ctx queue recover`` requeues it (exit 0) because its
    holder has exited; a new worker runs it to ``done/`` once; recover then changes
    nothing."""
    group = cgroups("memory")
    limit_mib = 256
    group.limit_memory(limit_mib * MIB)
    req, out, release = gated(world, "oom")
    job = publish(world, req, "held")
    worker = start_worker(group, world.env, world.scratch, reaper_adj="1000")
    with stopped_at_end(worker):
        assert wait_for(lambda: "start" in text_of(out), WAIT), worker.err.read_text()
        start = worker.event("start")
        assert start is not None, worker.out.read_text()
        hog = run_in(group, [sys.executable, "-c", HOG, str(start["pid"]), str(limit_mib - 12)],
                     world.env)  # fmt: skip
        assert hog.rc == 0, hog
        assert worker.end() == 128 + signal.SIGKILL, worker.err.read_text()
    assert group.oom_kills() >= 1
    assert wait_for(lambda: not group.procs(), WAIT), group.procs()
    release.touch()
    assert out.read_text() == "start\n"

    assert world.queue.state(job) == "claimed"
    status = world.queue.run("status", "--json", env=world.env)
    assert status.rc == 0 and status.json()["counts"]["claimed"] == 1, status
    events = lines_of(session_file(world.root, "worker"))
    calls = [e for e in events if e["type"] == "tool_call"]
    assert len(calls) == 1 and not [e for e in events if e["type"] == "tool_result"], events
    recovered = world.queue.run("recover", "--json", env=world.env)
    assert recovered.rc == 0 and recovered.json()["consistent"] is True, recovered
    assert [r["job"] for r in recovered.json()["requeued"]] == [job], recovered

    drained = world.queue.run("work", "--agent", AGENT, "--drain", env=world.env)
    assert drained.rc == 0, drained
    assert world.queue.only_result(job)[0] == "done"
    assert out.read_text() == "start\nstart\nend\n"
    settled(world)


def test_a_batch_the_oom_killer_ends_at_any_memory_level_leaves_whole_requests(world, cgroups):
    """Q-1, Q-6, I-1, I-2, I-5, docs/queue.md ("A crash during a batch may publish part of
    it"): ``publish --batch`` of 100 requests of 100 kB, run in cgroups of 12 … 48 MiB, is
    killed by the OOM killer at least at the lowest level (where ``ctx`` cannot even start)
    or completes.  Whatever the level: every name it printed is pending, every pending
    request is one of the batch's lines whole, none twice; temp files are only in
    ``inbox/``; ``recover --reconcile --grace 0`` removes them and finds the queue
    consistent, and a second run changes nothing."""
    queue = world.queue
    killed = 0
    wanted: dict[tuple[int, int], dict] = {}
    for level in (12, 24, 36, 48):
        group = cgroups("memory")
        group.limit_memory(level * MIB)
        batch = [
            {**shell_job("true"), "level": level, "n": n, "pad": "p" * 100_000} for n in range(100)
        ]
        wanted.update({(r["level"], r["n"]): r for r in batch})
        lines = "".join(json.dumps(r) + "\n" for r in batch)
        run = ctx_in(group, world.env, "queue", "publish", "--project", "proj", "--batch", "-",
                     input=lines)  # fmt: skip
        assert run.rc in (0, -signal.SIGKILL), run
        assert TRACEBACK not in run.err, run
        killed += run.rc == -signal.SIGKILL
        pending = queue.entries("pending")
        assert set(run.lines()) <= pending, (level, run)
        if run.rc == 0:
            assert len(run.lines()) == 100, run
        seen: set[tuple[int, int]] = set()
        for name in pending:
            stored = json.loads((queue.dir / "pending" / name).read_text())
            key = (stored["level"], stored["n"])
            assert key not in seen and stored == wanted[key], name
            seen.add(key)
        assert all(".tmp" in n or n.startswith(".") for n in queue.entries("inbox")), level
        for _ in range(2):
            recovered = queue.run("recover", "--reconcile", "--grace", "0", "--json",
                                  env=world.env)  # fmt: skip
            assert recovered.rc == 0 and recovered.json()["consistent"] is True, recovered
        assert queue.entries("inbox") == set() and queue.entries("pending") == pending
    assert killed >= 1


# ------------------------------------------------------------------------------ pids

FORKER = (
    f"exec {PYTHON3} -c '"
    "import os, time\n"
    "n = 0\n"
    "try:\n"
    "    while True:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(120)\n"
    "            os._exit(0)\n"
    "        n += 1\n"
    "except OSError as e:\n"
    "    print(n, e.errno)\n"
    "    raise SystemExit(3)'"
)


@needs_python3
def test_a_tool_that_forks_until_pids_max_fails_its_own_job_and_the_next_one_runs(world, cgroups):
    """W-1, W-4, docs/tools.md ("no process of a call outlives it"): a worker in a cgroup of
    64 tasks runs a tool that forks until ``fork`` fails with ``EAGAIN``; the job is finished
    in ``failed/`` with the tool's own exit status 3; the worker lives on, every process the
    tool left in its group is killed (the cgroup falls back to the worker's own tasks), and
    the next job, published then, is ``done``; SIGTERM ends the worker with exit 0 and a
    summary of one done and one failed."""
    group = cgroups("pids")
    group.limit_pids(64)
    worker = start_worker(group, world.env, world.scratch, reaper_adj="")
    with stopped_at_end(worker):
        assert wait_for(lambda: worker.event("start") is not None, WAIT), worker.err.read_text()
        pid = worker.event("start")["pid"]
        assert wait_for(lambda: waiting_on_inotify(pid), WAIT)
        bomb = publish(world, shell_job(FORKER), "forks")
        assert wait_for(lambda: world.queue.state(bomb) in ("done", "failed"), WAIT)
        state, record = world.queue.only_result(bomb)
        assert (state, record["exit_status"]) == ("failed", 3), record
        assert record["output"].split()[1] == "11", record  # EAGAIN: the cgroup was full
        assert worker.proc.poll() is None, worker.err.read_text()

        def forkers() -> list[int]:
            found = []
            for p in group.procs():
                with contextlib.suppress(OSError):
                    if b"time.sleep(120)" in Path(f"/proc/{p}/cmdline").read_bytes():
                        found.append(p)
            return found

        assert wait_for(lambda: forkers() == [], WAIT), forkers()
        after = publish(world, shell_job("echo next"), "next")
        # Finished once claimed/J is gone too: the request reaches done/ before the claim's
        # cleanup.
        claimed = world.queue.dir / "claimed" / after
        assert wait_for(
            lambda: world.queue.state(after) in ("done", "failed") and not claimed.exists(), WAIT
        )
        assert world.queue.only_result(after)[0] == "done", world.queue.only_result(after)
        os.kill(pid, signal.SIGTERM)
        assert worker.end() == 0, worker.err.read_text()
    stop = worker.event("stop")
    assert stop is not None and (stop["done"], stop["failed"]) == (1, 1), stop
    settled(world)


def no_room_to_fork(world: World, group: Cgroup) -> tuple[Background, str]:
    """A waiting worker in ``group``, whose ``pids.max`` is then set to the tasks it has: a
    job published then is claimed, but nothing can be forked for it.  The worker and J."""
    group.limit_pids(1000)
    worker = start_worker(group, world.env, world.scratch, "--concurrency", "1")
    assert wait_for(lambda: worker.event("start") is not None, WAIT), worker.err.read_text()
    assert wait_for(lambda: waiting_on_inotify(worker.event("start")["pid"]), WAIT)
    group.limit_pids(group.pids_current())
    job = publish(world, shell_job("echo ran"), "starved")
    return worker, job


def outcome(world: World, worker: Background, job: str) -> str | None:
    """J's state once it is finished or the worker has stopped."""
    wait_for(
        lambda: world.queue.state(job) in ("done", "failed") or worker.proc.poll() is not None,
        WAIT,
    )
    return world.queue.state(job)


def test_a_tool_that_cannot_be_forked_is_a_host_shortage_not_the_jobs_failure(world, cgroups):
    """W-1 (failed is for the tool's failure: non-zero exit, timeout, denial),
    docs/workers.md ("A host that runs short": a tool that could not start for want of what
    the host has is not the job's failure, and every job after it would meet the same),
    §2.4: a waiting worker whose cgroup leaves it no room to fork claims a job; its tool
    cannot start (``EAGAIN``).  The job must not end in ``failed/``: it stays claimed (or
    pending) and the worker stops with ``ctx: EAGAIN: …``, exit 1, so that once the host
    has room ``recover`` and a drain run it."""
    group = cgroups("pids")
    worker, job = no_room_to_fork(world, group)
    with stopped_at_end(worker):
        state = outcome(world, worker, job)
        failed_for = ""
        if state == "failed":
            failed_for = json.loads((world.queue.dir / "failed" / f"{job}.result").read_text())
        assert state in ("claimed", "pending"), (state, failed_for)
        assert worker.end() == 1
        assert worker.err.read_text().splitlines()[-1].startswith("ctx: EAGAIN: ")


def test_a_pre_hook_that_cannot_be_forked_fails_no_job(world, cgroups):
    """T-6, W-1, docs/workers.md ("So does … a pre-hook the host could not start (the
    tool's refusal is that errno, not a veto)": the job stays claimed and the worker stops),
    docs/tools.md (hooks: a hook the host could not start "gave no verdict"): with an
    allowing pre-hook on ``shell.exec`` and no room to fork in the worker's cgroup, the job
    is not failed: it stays claimed (or pending) and the worker stops with ``EAGAIN``."""
    hook = world.root / "tool" / "shell.exec.d" / "hooks" / "pre.d" / "10-allow"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    group = cgroups("pids")
    worker, job = no_room_to_fork(world, group)
    with stopped_at_end(worker):
        state = outcome(world, worker, job)
        failed_for = ""
        if state == "failed":
            failed_for = json.loads((world.queue.dir / "failed" / f"{job}.result").read_text())
        assert state in ("claimed", "pending"), (state, failed_for)
        assert worker.end() == 1


def test_a_worker_whose_slot_thread_cannot_start_still_ends_with_its_summary(world, cgroups):
    """§2.4 (``--json``), docs/workers.md ("Output": the ``stop`` event is the summary; a
    worker that stops on an error prints the error object after it, so the last line is that
    object): ``ctx queue work --drain --concurrency 4 --json`` in cgroups of 2 and 3 tasks
    starts (its ``start`` event) but cannot start every slot's thread; it exits 1 with
    ``EAGAIN``; its output then ends with the ``stop`` event followed by the error object,
    and no job is lost: one a slot claimed but could not start a tool for stays claimed (a
    host shortage, W-1), and ``recover`` requeues it once the worker has exited."""
    wrong = []
    for n in (2, 3):
        publish(world, shell_job("true"))
        group = cgroups("pids")
        group.limit_pids(n)
        run = ctx_in(group, world.env, "queue", "work", "--project", "proj", "--agent", AGENT,
                     "--drain", "--concurrency", "4", "--json")  # fmt: skip
        assert TRACEBACK not in run.err, run
        lines = frames(run)
        if run.rc == 0 or not any(e.get("event") == "start" for e in lines):
            continue
        assert run.rc == 1 and lines[-1].get("error") == "EAGAIN", run
        recovered = world.queue.run("recover", env=world.env)
        assert recovered.rc == 0, recovered
        assert world.queue.entries("claimed") == set(), (run, recovered)
        if len(lines) < 2 or lines[-2].get("event") != "stop":
            wrong.append((n, [e.get("event", e.get("error")) for e in lines]))
    assert wrong == []


# ------------------------------------------------------------------------------ agent start


@pytest.fixture
def terminal_world(world) -> World:
    """``world`` where ``ctx agent start`` works without limits (bubblewrap, FUSE…); the
    test is skipped otherwise."""
    workspace = world.scratch / "ws"
    workspace.mkdir()
    workspace.chmod(0o755)
    started = ctx_in(None, world.env, "agent", "start", AGENT, cwd=workspace)
    if started.rc != 0:
        pytest.skip(f"ctx agent start does not work here: {started.err.strip()}")
    stopped = ctx_in(None, world.env, "agent", "stop", AGENT)
    assert stopped.rc == 0, stopped
    return world


def start_terminal(world: World, n: int, cgroups) -> tuple[Run, bool]:
    """``ctx agent start ci --json`` in a cgroup of ``n`` tasks: what it said, and whether
    a terminal of ci runs afterwards (``ctx agent stop`` finds one: stopped again)."""
    group = cgroups("pids")
    group.limit_pids(n)
    started = ctx_in(group, world.env, "agent", "start", AGENT, "--json",
                     cwd=world.scratch / "ws")  # fmt: skip
    stopped = ctx_in(None, world.env, "agent", "stop", AGENT)
    if stopped.rc != 0:
        assert "no terminal of ci" in stopped.err, stopped
    group.remove()
    return started, stopped.rc == 0


def test_agent_start_that_cannot_fork_its_terminal_never_says_started(terminal_world, cgroups):
    """A-1, docs/tools.md ("The agent terminal": start returns once tsh runs in the
    sandbox; a terminal that did not start fails the start with its errno, exit 1, nothing
    left running): in cgroups of 1 … 3 tasks ``ctx agent start`` either starts a terminal
    that runs, or exits non-zero, never exit 0 and a success object for a terminal that
    ``ctx agent stop`` then does not find."""
    wrong = []
    for n in (1, 2, 3):
        started, running = start_terminal(terminal_world, n, cgroups)
        assert TRACEBACK not in started.err, started
        if (started.rc == 0) != running:
            wrong.append((n, started, running))
    assert wrong == []


def test_agent_start_short_of_processes_says_eagain(terminal_world, cgroups):
    """A-1, docs/tools.md (a sandbox that ends before tsh runs fails the start "with what it
    said and its errno"), §2.4 (errors carry their errno): every refusal of ``ctx agent
    start`` in cgroups of 1 … 5 tasks, wherever the fork fails, is ``ctx: EAGAIN: …`` on
    stderr and ``{"error": "EAGAIN", …}`` with ``--json``, never ``EIO`` with Python's
    ``[Errno 11]`` text; nothing is left running."""
    wrong = []
    for n in range(1, 6):
        started, running = start_terminal(terminal_world, n, cgroups)
        if started.rc == 0:
            continue
        assert not running, started
        said = frames(started)[-1] if started.out.strip() else {}
        eagain = started.err.startswith("ctx: EAGAIN: ") and said.get("error") == "EAGAIN"
        if not eagain or "[Errno" in started.err:
            wrong.append((n, started))
    assert wrong == []


# ------------------------------------------------------------------------------ ctxmcp


def test_ctxmcp_short_of_processes_says_eagain_and_leaves_no_server(world, cgroups):
    """M-1, docs/tools.md (a server that could not start is named with its errno), §2.4:
    ``ctxmcp list --json`` of a stdio server, in cgroups of 1 … 3 tasks, lists the tool or
    exits 1 with ``ctxmcp: EAGAIN: …`` and one error object ``EAGAIN``, never a traceback,
    and nothing it started is left in the cgroup."""
    server = world.scratch / "server.py"
    server.write_text(MCP_SERVER)
    config = world.scratch / "mcp.json"
    entry = {"command": sys.executable, "args": [str(server)]}
    config.write_text(json.dumps({"mcpServers": {"s": entry}}))
    wrong = []
    for n in (1, 2, 3):
        group = cgroups("pids")
        group.limit_pids(n)
        listed = run_in(group, [CTXMCP, "list", "--config", str(config), "--server", "s",
                                "--json"], world.env)  # fmt: skip
        assert wait_for(lambda group=group: not group.procs(), WAIT), group.procs()
        if listed.rc == 0:
            assert "s.t" in listed.out, listed
            continue
        said = frames(listed)[-1] if listed.out.strip().startswith("{") else {}
        if (
            TRACEBACK in listed.err
            or listed.rc != 1
            or not listed.err.startswith("ctxmcp: EAGAIN: ")
            or said.get("error") != "EAGAIN"
        ):
            wrong.append((n, listed))
    assert wrong == []


# ------------------------------------------------------------------------------ freezer


def test_a_worker_frozen_past_its_lease_reports_the_job_lost_and_it_ends_once(world, cgroups):
    """Q-3, Q-5, I-3, W-1, docs/workers.md ("A lease taken away"): a worker with a one-second
    lease whose cgroup is frozen, as a process the host starves is, cannot renew in time;
    ``recover`` then requeues the job of the expired lease (exit 0) although the worker
    lives.  Thawed, the worker's tool ends; its finish is refused by the queue and the worker
    reports the job ``lost`` (``--json`` event and summary, ``queue.lost`` in its session)
    instead of writing anything; the job runs again under a new lease and ends in ``done/``
    once.  The worker is frozen between two renewals: one frozen in the middle of a renewal
    keeps ``claimed/J``'s lock, and ``recover`` rightly leaves a locked claim alone."""
    group = cgroups("freezer")
    req, out, release = gated(world, "slow")
    job = publish(world, req, "slow")
    worker = start_worker(group, world.env, world.scratch, "--drain", "--ttl", "1")
    with stopped_at_end(worker), thawed_at_end(group):
        assert wait_for(lambda: "start" in text_of(out), WAIT), worker.err.read_text()
        claimed = world.queue.dir / "claimed" / job

        def frozen_between_renewals() -> bool:
            group.freeze(True)
            if lock_is_free(claimed):
                return True
            group.freeze(False)
            return False

        assert wait_for(frozen_between_renewals, WAIT), "claimed/J's lock was never free"
        lease = world.queue.dir / "lease" / job / "worker"
        assert wait_for(lambda: expired(json.loads(lease.read_text())["expires_at"]), WAIT)
        r = world.queue.run("recover", "--json", env=world.env)
        assert r.rc == 0 and TRACEBACK not in r.err, r
        assert [x["job"] for x in r.json()["requeued"]] == [job], r.out
        group.freeze(False)
        release.touch()
        assert worker.end(60) == 0, worker.err.read_text()
    events = worker.events()
    lost = [e for e in events if e.get("event") == "lost"]
    assert [e["job"] for e in lost] == [job], events
    assert "ENOENT" in lost[0]["reason"], lost
    stop = worker.event("stop")
    assert stop is not None and (stop["done"], stop["lost"], stop["failed"]) == (1, 1, 0), stop
    session = lines_of(session_file(world.root, "worker"))
    assert [e["object"] for e in session if e["type"] == "queue.lost"] == [f"queue/{job}"]
    assert world.queue.only_result(job)[0] == "done"
    assert out.read_text().count("start") == 2
    settled(world)
