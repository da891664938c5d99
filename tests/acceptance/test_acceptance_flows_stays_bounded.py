"""Long-running processes stay bounded (SPEC §3 W-1, W-2, W-4, §2 Q-3, Q-6, Q-10, §4 S-5, §8
A-1, A-2, §10 M-4, §13 F-1): the processes that run for a long time are sampled from outside,
through ``/proc`` (their descriptors, threads, resident memory and children), after a warm-up
round of work and again after several more rounds of the same work, and what they keep on disk
(``inbox/`` temp files, the per-user claim-order hint cache, session files) is listed each
time.  Nothing may grow per round: the descriptor set is the same, the thread count is the
same, no child is left over and no zombie waits, and resident memory stays within a generous
margin.

* ``ctx queue work`` (``--concurrency 1`` and ``4``, ``--ttl 1`` so that its lease keeper
  renews while the longer jobs run) drains batches published with ``--batch``: jobs that
  succeed, fail, time out (``--timeout``), are refused by policy, leave a background process
  in their group, and call a projected MCP tool (the bridge and its server, one of which hangs
  past the timeout), each worker recording in a session of its own that a ``ctx session tail
  --follow`` follows; between batches it waits idle on its inotify watch;
* ``ctx mount`` serves rounds of creates, writes, reads, stats, renames, unlinks and listings of
  the storage root, a queue published to and drained through the mount, and short-lived
  clients killed while they hold files open and read;
* an agent terminal (``ctx agent start``) serves rounds of tool calls typed through its run
  socket, raw ``watch``/``attach`` clients that connect and drop, and ``ctx agent watch`` and
  ``attach`` clients killed while connected; ``ctx agent stop`` then leaves nothing behind: no
  process, no mount, no socket, nothing of the terminal in ``/run/cortexfs``;
* one ``ctxmcp list`` session asks a server for page after page of its listing, through
  notifications and stderr chatter.

Black-box: the installed ``ctx`` and ``ctxmcp``, real processes, FUSE mounts, sockets and uids.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    OnStorage,
    QueueCLI,
    clean_env,
    mounted_at,
    new_scratch_dir,
    scratch_top,
    serving,
    wait_for,
)
from tests.acceptance.terminalcli import CoderHost, Raw, coder_host, tsh_of
from tests.support.mcp_wire import WIRE
from tests.support.storage import copy_of_root, small_tmpfs

SCRATCH = scratch_top(__file__)
CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
RUN_BASE = Path("/run/cortexfs/terminal")
PROMPT = "coder$ "
RSS_MARGIN_KB = 8 * 1024  # memory moves (allocator, caches); tens of KiB lost per job show

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid")
needs_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or os.geteuid() != 0, reason="needs /dev/fuse and root"
)
needs_terminal = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)


# ------------------------------------------------------------------------- seen from /proc


def descriptor_kinds(pid: int) -> tuple[str, ...]:
    """What process ``pid`` holds open, one entry per descriptor, with the inode numbers of
    pipes, sockets and the like left out (``pipe:[]``): the same work may open new ones."""
    found = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            found.append(re.sub(r"\[\d+\]$", "[]", os.readlink(f"/proc/{pid}/fd/{name}")))
    return tuple(sorted(found))


def status_of(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


def state_of(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def children_of(pid: int) -> list[int]:
    """The direct children of ``pid``, from every one of its threads."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                found += map(int, Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    return found


def command_of(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def inotify_watches(pid: int) -> int:
    """How many inotify watches the descriptors of ``pid`` hold (``/proc/PID/fdinfo``)."""
    count = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{name}") == "anon_inode:inotify":
                info = Path(f"/proc/{pid}/fdinfo/{name}").read_text()
                count += sum(line.startswith("inotify wd:") for line in info.splitlines())
    return count


@dataclass(frozen=True)
class Sample:
    """One look at a process from outside."""

    fds: tuple[str, ...]
    threads: int
    rss_kb: int
    children: tuple[str, ...]  # command lines of its direct children
    zombies: tuple[int, ...]

    def same_shape(self, other: Sample) -> bool:
        return (self.fds, self.threads, self.children, self.zombies) == (
            other.fds,
            other.threads,
            other.children,
            other.zombies,
        )


def sample(pid: int) -> Sample:
    status = status_of(pid)
    kids = children_of(pid)
    return Sample(
        fds=descriptor_kinds(pid),
        threads=int(status["Threads"]),
        rss_kb=int(status["VmRSS"].split()[0]),
        children=tuple(sorted(command_of(kid) for kid in kids)),
        zombies=tuple(kid for kid in kids if state_of(kid) == "Z"),
    )


def steady_sample(pid: int, children: int) -> Sample:
    """A sample of ``pid`` once it has no more than ``children`` children and two looks in a
    row agree on its descriptors and threads (a process that just finished some work may
    still be closing or reaping)."""
    assert wait_for(lambda: len(children_of(pid)) <= children, 30), [
        command_of(kid) for kid in children_of(pid)
    ]
    previous = sample(pid)
    for _ in range(250):
        time.sleep(0.02)
        current = sample(pid)
        if current.same_shape(previous):
            return current
        previous = current
    return previous


def assert_bounded(name: str, first: Sample, later: list[Sample]) -> None:
    """Each later sample of process ``name`` has the descriptors, threads and children the
    first had, no zombie, and resident memory within :data:`RSS_MARGIN_KB` of it."""
    for n, each in enumerate(later, 1):
        assert each.fds == first.fds, (name, n, first.fds, each.fds)
        assert each.threads == first.threads, (name, n, first.threads, each.threads)
        assert each.children == first.children, (name, n, first.children, each.children)
        assert each.zombies == (), (name, n, each.zombies)
        assert each.rss_kb - first.rss_kb <= RSS_MARGIN_KB, (name, n, first.rss_kb, each.rss_kb)


def processes_naming(text: str) -> list[str]:
    """Live processes (not zombies) whose command line holds ``text``, this one left out."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            command = command_of(int(entry))
            if text in command and state_of(int(entry)) not in (None, "Z"):
                found.append(f"{entry}: {command}")
    return found


def tree_of(pid: int) -> list[int]:
    """``pid`` and every descendant of it."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children_of(current)
    return found


# ---------------------------------------------------------------------------- the worker

# A stdio MCP server: tools ``echo`` (answers with its arguments) and ``hang`` (never answers).
MINI_SERVER = (
    WIRE
    + r"""
TOOLS = [
    {"name": "echo", "description": "Answers with its arguments.",
     "inputSchema": {"type": "object"}},
    {"name": "hang", "description": "Never answers.", "inputSchema": {"type": "object"}},
]
while True:
    message = receive()
    if "id" not in message:
        continue
    method, ident = message.get("method"), message["id"]
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "mini", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        if message["params"]["name"] == "hang":
            time.sleep(3600)
        text = json.dumps(message["params"].get("arguments", {}))
        send({"jsonrpc": "2.0", "id": ident,
              "result": {"content": [{"type": "text", "text": text}], "isError": False}})
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
"""
)

WORKER_TOOLS = ["fs.stat", "shell.exec", "mini.echo", "mini.hang"]
TIMEOUT = "1"  # seconds per job: past a third of --ttl 1, so the lease keeper renews first


@dataclass
class WorkerWorld(OnStorage):
    """A storage root on a tmpfs of its own (thousands of fsyncs cost nothing there), agent
    ``w`` (label ``w_t``, uid nobody) allowed :data:`WORKER_TOOLS` in both policies, the
    MCP server ``mini`` projected and installed, and a claim-order cache of this test's."""

    top: Path
    storage: Path
    mcp: Path
    cache: Path
    marker: int  # in the command line of every sleep a job starts: none may outlive its job
    uid: int = -1  # agent w's

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage), XDG_CACHE_HOME=str(self.cache))


@pytest.fixture
def worker_world(_template: Path) -> Iterator[WorkerWorld]:
    top = new_scratch_dir(SCRATCH, "w-")
    marker = 600000 + uuid.uuid4().int % 300000
    try:
        with small_tmpfs(top / "disk", "256m", 0o755) as disk:
            storage = copy_of_root(_template, disk / "storage")
            mcp = top / "mcp"
            mcp.mkdir(mode=0o755)
            (mcp / "mini.py").write_text(MINI_SERVER)
            (mcp / "mini.py").chmod(0o644)
            config = mcp / "mcp.json"
            entry = {"command": "/usr/bin/python3", "args": ["-I", str(mcp / "mini.py")]}
            config.write_text(json.dumps({"mcpServers": {"mini": entry}}))
            config.chmod(0o644)
            cache = top / "cache"
            cache.mkdir(mode=0o700)
            world = WorkerWorld(top, storage, mcp, cache, marker)
            out = top / "candidates"
            projected = subprocess.run(
                [str(CTXMCP), "project", "--config", str(config), "--runtime-config",
                 str(config), "--server", "mini", "--out", str(out)],
                capture_output=True, text=True, env=world.env, timeout=60,
            )  # fmt: skip
            assert projected.returncode == 0, projected
            for manifest in sorted(out.iterdir()):
                installed = world.ctx("object", "install", manifest, "--tier", "system")
                assert installed.rc == 0, installed
            made = world.create_agent(
                {
                    "name": "w",
                    "label": "w_t",
                    "tools": WORKER_TOOLS,
                    "mount": [[str(mcp), str(mcp), "ro"]],
                }
            )
            world.uid = made["identity"]["uid"]
            world.allow_tool("w_t", *WORKER_TOOLS)
            yield world
    finally:
        for text in (str(top), f"sleep {marker}", f"sleep {marker + 1}"):
            for line in processes_naming(text):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(line.split(":")[0]), signal.SIGKILL)
        shutil.rmtree(top, ignore_errors=True)


def batch_of(world: WorkerWorld, round_number: int, refused: int) -> list[tuple[dict, str]]:
    """One batch: each request with the outcome it must have (``done``, ``exit``,
    ``timeout``, ``refused``).  Its one job that runs past the timeout is a shell in even
    rounds and a call of the MCP server's ``hang`` in odd ones."""
    shell = "shell.exec"
    background = f"sleep {world.marker} >/dev/null 2>&1 & echo started"
    hanging = (
        {"tool": shell, "input": {"cmd": f"sleep {world.marker + 1}"}}
        if round_number % 2 == 0
        else {"tool": "mini.hang", "input": {}}
    )
    work = [
        ({"tool": "fs.stat", "input": {"path": "/ctx/tool"}}, "done"),
        ({"tool": shell, "input": {"cmd": background}}, "done"),
        ({"tool": shell, "input": {"cmd": "echo failing >&2; exit 3"}}, "exit"),
        ({"tool": "mini.echo", "input": {"round": round_number}}, "done"),
        (hanging, "timeout"),
    ]
    work += [({"tool": "fs.read", "input": {"path": "/ctx/tool"}}, "refused")] * refused
    return work


def outcome_of(state: str, result: dict) -> str:
    if state == "done":
        return "done"
    error = result["error"]
    if error["error"] == "ETIMEDOUT":
        return "timeout"
    if error["stage"] == "authorize" and error["error"] == "EACCES":
        return "refused"
    if error["stage"] == "exit" and result["exit_status"] == 3:
        return "exit"
    return f"unexpected: {result['reason']}"


def files_under(top: Path) -> dict[str, int]:
    """Every file below ``top`` (links not followed) and its size."""
    found = {}
    for path in top.rglob("*"):
        if path.is_file() and not path.is_symlink():
            found[str(path.relative_to(top))] = path.stat().st_size
    return found


@dataclass
class Drainer:
    """One ``ctx queue work`` on project ``project``, recording in session ``session`` of
    agent ``w``, and a ``ctx session tail --follow`` of that session; what was seen of them
    after each round."""

    world: WorkerWorld
    project: str
    concurrency: int
    worker: subprocess.Popen | None = None
    follower: subprocess.Popen | None = None
    samples: list[Sample] = field(default_factory=list)
    following: list[Sample] = field(default_factory=list)
    sessions: list[set[str]] = field(default_factory=list)
    leases: dict[str, set[str]] = field(default_factory=dict)
    jobs: list[str] = field(default_factory=list)
    work: list[tuple[dict, str]] = field(default_factory=list)

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.world.storage, self.project)

    @property
    def name(self) -> str:
        return f"c{self.concurrency}"

    @property
    def session(self) -> Path:
        home = self.world.storage / "home" / str(self.world.uid)
        return home / "agent" / "w" / "session" / self.name

    @property
    def log(self) -> Path:
        return self.world.top / f"{self.name}.worker.jsonl"

    @property
    def followed(self) -> Path:
        return self.world.top / f"{self.name}.follower.jsonl"

    def start(self) -> None:
        argv = [*CTX_ARGV, "queue", "work", "--project", self.project, "--agent", "w",
                "--session", self.name, "--json", "--concurrency", str(self.concurrency),
                "--timeout", TIMEOUT, "--ttl", "1"]  # fmt: skip
        with open(self.log, "wb") as out:
            self.worker = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                env=self.world.env, start_new_session=True,
            )  # fmt: skip
        assert wait_for(lambda: b'"event": "start"' in self.log.read_bytes(), 30), self.said()
        tail = [*CTX_ARGV, "session", "tail", "w", self.name, "--follow", "--json", "-n", "0"]
        with open(self.followed, "wb") as shown:
            self.follower = subprocess.Popen(
                tail, stdin=subprocess.DEVNULL, stdout=shown, stderr=subprocess.STDOUT,
                env=self.world.env, start_new_session=True,
            )  # fmt: skip

    def said(self) -> str:
        return self.log.read_text()[-3000:]

    def publish(self, round_number: int) -> None:
        self.work = batch_of(self.world, round_number, refused=60)
        lines = "".join(json.dumps(req) + "\n" for req, _ in self.work)
        published = self.queue.run("publish", "--batch", "-", input=lines, env=self.world.env)
        assert published.rc == 0, published
        self.jobs = published.lines()
        assert len(self.jobs) == len(self.work), published

    def settled(self) -> bool:
        """Whether every job of the batch has its terminal pair and nothing is in flight;
        meanwhile each ``expires_at`` seen in a job's lease is noted."""
        queue = self.queue
        for job in queue.entries("lease"):
            with contextlib.suppress(OSError, ValueError):
                self.leases.setdefault(job, set()).add(queue.lease(job)["expires_at"])
        if queue.entries("pending") or queue.entries("claimed") or queue.entries("lease"):
            return False
        done, failed = queue.entries("done"), queue.entries("failed")
        return all(job in done or job in failed for job in self.jobs)

    def look(self) -> None:
        """Check the batch's outcomes and take a sample of both processes."""
        assert self.worker is not None and self.follower is not None
        for job, (_, wanted) in zip(self.jobs, self.work, strict=True):
            state, result = self.queue.only_result(job)
            assert outcome_of(state, result) == wanted, (self.name, job, wanted, result)
        self.samples.append(steady_sample(self.worker.pid, children=1))
        self.following.append(steady_sample(self.follower.pid, children=0))
        assert self.queue.entries("inbox") == set()
        self.sessions.append(set(os.listdir(self.session)))
        assert self.worker.poll() is None, self.said()
        assert inotify_watches(self.worker.pid) == 1, self.samples[-1].fds

    def stop(self) -> None:
        for process, stop_signal in ((self.worker, signal.SIGTERM), (self.follower, signal.SIGINT)):
            if process is None:
                continue
            if process.poll() is None:
                process.send_signal(stop_signal)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def stored_events(self) -> list[str]:
        return (self.session / "events.jsonl").read_text().splitlines()

    def assert_followed(self) -> None:
        """The follower printed every event of the session, once and in order."""
        stored = self.stored_events()
        if not wait_for(lambda: len(self.followed.read_text().splitlines()) >= len(stored), 30):
            shown = self.followed.read_text().splitlines()
            missing = [(n, line) for n, line in enumerate(stored) if line not in set(shown)]
            raise AssertionError((self.name, len(stored), len(shown), missing[:3]))
        assert self.followed.read_text().splitlines() == stored, self.name


@needs_root
@pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed in the venv")
def test_workers_draining_batch_after_batch_keep_the_same_descriptors_threads_and_children(
    worker_world: WorkerWorld,
) -> None:
    """W-1, W-2, W-4, Q-3, Q-6, Q-10, S-5, M-4: two ``ctx queue work --timeout 1 --ttl 1``,
    one with ``--concurrency 1`` and one with ``--concurrency 4``, each on a queue of its own
    and each followed by a ``ctx session tail --follow`` of its session, drain four batches
    published with ``--batch``.  Each batch holds jobs that succeed, fail, time out (a shell
    or an MCP server that hangs), are refused by policy, start a background process, and
    call the MCP bridge; every job ends with the outcome it must have, and the lease keeper
    renews the leases of the jobs that run past a third of their lifetime.  After the
    warm-up batch, after each later batch, and (the second) after an idle stretch on its
    inotify watch,
    each worker holds the same descriptors (one inotify watch, the same ones on its
    session's ``events.jsonl``), the same threads, only its orphan guard as child and no
    zombie, and about the same resident memory, and so does each follower; no tool, sleep or
    MCP server outlives its job; ``inbox/`` is empty, the claim-order cache and the session
    directories hold the same files.  Stopped, the workers end their guards and say nothing
    amiss, the followers have shown every event once and in order, the queues are settled."""
    world = worker_world
    made = world.ctx("queue", "init", "--project", "four", env=world.env)
    assert made.rc == 0, made
    drainers = [Drainer(world, "proj", 1), Drainer(world, "four", 4)]
    caches: list[dict[str, int]] = []
    guards: list[int] = []
    try:
        for drainer in drainers:
            drainer.start()
        one, four = drainers
        for round_number in range(4):
            one.publish(round_number)
            if round_number == 1:
                # While the first works, the second idles past one bounded inotify wait
                # (2 s) and is back on it.
                time.sleep(2.2)
                four.look()
            four.publish(round_number)
            assert wait_for(lambda: all([d.settled() for d in drainers]), 60, step=0.02)
            for drainer in drainers:
                drainer.look()
            caches.append(files_under(world.cache))

        for drainer in drainers:
            first, later = drainer.samples[0], drainer.samples[1:]
            assert len(first.children) == 1, first.children
            assert "kill -s KILL" in first.children[0], first.children
            assert first.fds.count("anon_inode:inotify") == 1, first.fds
            assert 1 <= first.fds.count(str(drainer.session / "events.jsonl")) <= 2, first.fds
            assert_bounded(f"ctx queue work ({drainer.name})", first, later)
            following = drainer.following
            assert_bounded(f"ctx session tail ({drainer.name})", following[0], following[1:])
            assert drainer.sessions == [drainer.sessions[0]] * len(drainer.sessions)
            renewed = [job for job, expiries in drainer.leases.items() if len(expiries) > 1]
            assert renewed, drainer.leases  # the lease keeper renewed while a job ran long
            drainer.assert_followed()
            assert drainer.worker is not None
            guards += children_of(drainer.worker.pid)
        assert processes_naming(str(world.marker)) == []  # no sleep outlived its job
        assert processes_naming(str(world.mcp)) == []  # no MCP server outlived its call
        assert [set(each) for each in caches] == [set(caches[0])] * len(caches), caches
        assert all(size < 1 << 20 for each in caches for size in each.values()), caches
    finally:
        for drainer in drainers:
            drainer.stop()
    assert wait_for(lambda: all(state_of(guard) in (None, "Z") for guard in guards)), guards
    for drainer in drainers:
        assert drainer.follower is not None and drainer.follower.returncode == 0
        assert drainer.followed.read_text().splitlines() == drainer.stored_events()
        text = drainer.log.read_text()
        stop = json.loads(text.splitlines()[-1])
        assert drainer.worker is not None and drainer.worker.returncode == 0, text[-2000:]
        assert stop["event"] == "stop" and stop["stopped_by"] == "SIGTERM", stop
        assert (stop["done"], stop["failed"], stop["lost"]) == (12, 248, 0), stop
        assert "Traceback" not in text, text[-2000:]
        drainer.queue.assert_settled()


# ------------------------------------------------------------------------ an MCP session

# A stdio MCP server whose listing runs over PAGES pages.  Before each answer it sends NOTES
# notifications of 1 KB, then, STEPS times, writes STDERR bytes of debug lines to its stderr,
# creates ``sent<page>-<step>`` in FLAGS and waits for ``go<page>-<step>`` there: the client is
# then waiting for that one answer, mid-session, and can be looked at.
PAGED_SERVER = (
    WIRE
    + r"""
flags = sys.argv[1]
pages, steps, stderr_bytes, notes = (int(value) for value in sys.argv[2:6])

line = b"debug: " + b"d" * 1016 + b"\n"
page = 0
while True:
    message = receive()
    if "id" not in message:
        continue
    method, ident = message.get("method"), message["id"]
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "paged", "version": "0"}}})
    elif method == "tools/list":
        for n in range(notes):
            send({"jsonrpc": "2.0", "method": "notifications/message",
                  "params": {"level": "debug", "data": "x" * 1000 + str(n)}})
        for step in range(steps):
            for _ in range(stderr_bytes // len(line)):
                os.write(2, line)
            open(os.path.join(flags, f"sent{page}-{step}"), "w").close()
            while not os.path.exists(os.path.join(flags, f"go{page}-{step}")):
                time.sleep(0.01)
        page += 1
        result = {"tools": [{"name": f"t{page}", "description": "A tool.",
                             "inputSchema": {"type": "object"}}]}
        if page < pages:
            result["nextCursor"] = f"page-{page}"
        send({"jsonrpc": "2.0", "id": ident, "result": result})
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
"""
)
PAGES = 6


def unlinked_bytes(pid: int) -> int:
    """How many bytes the removed files that process ``pid`` holds open take."""
    total = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{name}").endswith(" (deleted)"):
                total += os.stat(f"/proc/{pid}/fd/{name}").st_size
    return total


@dataclass
class PagedSession:
    samples: list[Sample]  # ctxmcp, at each step of each page, while it waits for the answer
    unlinked: list[int]  # the bytes of the removed files it holds then
    rc: int
    out: str
    err: str


def paged_session(pages: int, steps: int, stderr_bytes: int, notes: int) -> PagedSession:
    """``ctxmcp list`` of the paged server, looked at at each step of each page."""
    top = new_scratch_dir(SCRATCH, "mcp-")
    try:
        flags = top / "flags"
        flags.mkdir()
        (top / "paged.py").write_text(PAGED_SERVER)
        numbers = [str(n) for n in (pages, steps, stderr_bytes, notes)]
        entry = {"command": "/usr/bin/python3", "args": ["-I", str(top / "paged.py"),
                                                         str(flags), *numbers]}  # fmt: skip
        (top / "mcp.json").write_text(json.dumps({"mcpServers": {"paged": entry}}))
        argv = [str(CTXMCP), "list", "--config", str(top / "mcp.json"), "--server", "paged"]
        client = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=clean_env(), start_new_session=True,
        )  # fmt: skip
        samples, unlinked = [], []
        try:
            for flag in (f"{page}-{step}" for page in range(pages) for step in range(steps)):
                assert wait_for(lambda flag=flag: (flags / f"sent{flag}").exists(), 30), flag
                # Its server, and the orphan guard that ends the server's group should ctxmcp
                # be killed (M-1).
                samples.append(steady_sample(client.pid, children=2))
                unlinked.append(unlinked_bytes(client.pid))
                (flags / f"go{flag}").touch()
            out, err = client.communicate(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(client.pid, signal.SIGKILL)
            client.wait()
        assert processes_naming(str(top)) == []  # the server went with its session
        return PagedSession(samples, unlinked, client.returncode, out.decode(), err.decode())
    finally:
        for line in processes_naming(str(top)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed in the venv")
def test_an_mcp_session_of_many_pages_and_notifications_keeps_its_descriptors_and_memory() -> None:
    """M-1, M-3 (docs/tools.md: a listing of up to 1000 pages; notifications are read and
    dropped): one ``ctxmcp list`` session asks for six pages of a listing, each answer
    preceded by 300 notifications of 1 KB; looked at while it waits for each page, the
    client holds the same descriptors and threads, only its server and its orphan guard as
    children, no zombie, about the same memory; it lists the six tools and ends its server."""
    session = paged_session(PAGES, steps=1, stderr_bytes=1024, notes=300)
    assert session.rc == 0, session.err
    assert [line.split("\t")[0] for line in session.out.splitlines()] == [
        f"paged.t{n}" for n in range(1, PAGES + 1)
    ], session.out
    first, later = session.samples[0], session.samples[1:]
    servers = [child for child in first.children if "paged.py" in child]
    guards = [child for child in first.children if "kill -s KILL" in child]
    assert len(servers) == len(guards) == 1 == len(first.children) - 1, first.children
    assert_bounded("ctxmcp list", first, later)


# --------------------------------------------------------------------------- the terminal

TERMINAL_TOOLS = ["fs.read", "fs.list"]
CALLS = [  # what the operator types each round, and what tsh answers
    ("fs.read a.txt", "alpha of the workspace"),
    ("fs.list", "\na.txt\n"),
    ("fs.read missing.txt", "ENOENT"),
    ("cat a.txt", "cat: not a tool on CTX_PATH"),
]


def root_key(storage: Path) -> str:
    """The storage root's key in ``/run/cortexfs/terminal`` (docs/tools.md)."""
    return hashlib.sha256(os.fsencode(os.path.realpath(storage))).hexdigest()[:16]


def killed_while_connected(host: CoderHost, verb: str, session: str) -> None:
    """``ctx agent VERB`` on pipes, SIGKILLed once tsh's prompt has reached it."""
    client = subprocess.Popen(
        [*CTX_ARGV, "agent", verb, "coder", "--session", session],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        env=host.env, start_new_session=True,
    )  # fmt: skip
    assert client.stdout is not None and client.stdin is not None
    seen = b""
    try:
        deadline = time.monotonic() + 30
        while PROMPT.encode() not in seen and time.monotonic() < deadline:
            chunk = client.stdout.read1(65536)
            if not chunk:
                break
            seen += chunk
        assert PROMPT.encode() in seen, (verb, seen)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(client.pid, signal.SIGKILL)
        client.wait()
        client.stdout.close()
        client.stdin.close()


@needs_terminal
def test_a_terminal_serving_rounds_of_calls_and_clients_is_bounded_and_stop_leaves_nothing(
    _template: Path,
) -> None:
    """A-1, A-2, H-1, H-2, S-2, S-5 (docs/tools.md: the run socket, the terminal socket, "a
    client that closes its connection frees its place at once"): a terminal serves four
    rounds of four calls typed by the operator through its run socket (a read, a listing,
    a read of a missing file, a host command), six raw ``watch`` and
    ``attach`` clients that connect and drop, and a ``ctx agent watch`` and a ``ctx agent
    attach`` killed while connected.  After the warm-up round and after each later one,
    ctxterm, its view's mount process and tsh hold the same descriptors and threads, have the
    same children, no zombie, about the same resident memory.  ``ctx agent stop`` then leaves
    nothing: no process of the terminal, no mount, no socket or link, and nothing of the
    storage root's terminals in ``/run/cortexfs``."""
    files = {"a.txt": "alpha of the workspace\n"}
    with coder_host(_template, SCRATCH, TERMINAL_TOOLS, files) as host:
        for tool in TERMINAL_TOOLS:
            host.grant_in_tool(tool)
        term = host.start()
        ctxterm = int((term.rundir / "pid").read_text())
        views = [kid for kid in children_of(ctxterm) if " mount " in command_of(kid)]
        assert len(views) == 1, [command_of(kid) for kid in children_of(ctxterm)]
        tsh = tsh_of(term.session)
        watched = {"ctxterm": ctxterm, "view": views[0], "tsh": tsh}
        tree = tree_of(ctxterm)
        samples: dict[str, list[Sample]] = {name: [] for name in watched}
        with contextlib.ExitStack() as stack:
            operator = Raw(term.listening_at, b"attach\n")
            stack.callback(operator.close)
            assert operator.shows(PROMPT), operator.text()
            for _ in range(4):
                for line, wanted in CALLS:
                    prompts = operator.count(PROMPT)
                    operator.type(line)
                    assert operator.shows(PROMPT, prompts + 1), operator.text()[-800:]
                    answer = operator.text().split(PROMPT)[-2]
                    assert answer.startswith(line) and wanted in answer, (line, answer)
                for n in range(6):
                    client = Raw(term.listening_at, b"attach\n" if n % 2 else b"watch\n")
                    assert client.shows(PROMPT), client.text()
                    client.close()
                for verb in ("watch", "attach"):
                    killed_while_connected(host, verb, term.session)
                for name, pid in watched.items():
                    samples[name].append(steady_sample(pid, children=len(children_of(pid))))
            assert not operator.eof.is_set()
        for name, taken in samples.items():
            assert_bounded(name, taken[0], taken[1:])
        reads = host.calls(term.session, "fs.read", "tool_result")
        assert [e["status"] for e in reads] == ["ok", "error"] * 4, reads

        stopped = host.ctx("agent", "stop", "coder", "--session", term.session, "--json")
        assert stopped.rc == 0, stopped
        host.started.remove(term.session)
        assert wait_for(lambda: not [pid for pid in tree if state_of(pid) not in (None, "Z")])
        assert [line for line in Path("/proc/self/mounts").read_text().splitlines()
                if str(term.rundir) in line] == []  # fmt: skip
        assert not os.path.lexists(term.link)
        assert not os.path.lexists(term.listening_at)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with probe, pytest.raises((FileNotFoundError, ConnectionRefusedError)):
            probe.connect(str(term.listening_at))
        assert not os.path.lexists(RUN_BASE / str(host.uid) / "coder" / term.session)
        left = RUN_BASE / root_key(host.storage)
        assert not left.exists(), sorted(str(p) for p in left.rglob("*"))


# ------------------------------------------------------------------------------ the mount

# A client of the mount that holds files and a directory open and reads on and on, until it
# is killed: it prints ``ready`` once it holds them all.
READER = r"""
import os, sys
top = sys.argv[1]
held = [os.open(os.path.join(top, name), os.O_RDONLY) for name in sorted(os.listdir(top))]
listing = os.scandir(top)
next(listing)
directory = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
big = os.open(os.path.join(top, "big"), os.O_RDONLY)
os.read(big, 65536)
print("ready", flush=True)
while True:
    if not os.read(big, 65536):
        os.lseek(big, 0, os.SEEK_SET)
"""


def mount_round(view: Path, round_number: int) -> None:
    """One round of ordinary work through the mount: files made, written, read, stat'ed,
    renamed and removed (two of them fsynced on the way), directories listed."""
    work = view / "shared" / "proj" / "work"
    for n in range(25):
        path = work / f"r{round_number}-{n}.txt"
        with open(path, "w") as file:
            file.write(f"round {round_number} file {n}\n" * 20)
            if n % 20 == 0:
                file.flush()
                os.fsync(file.fileno())
        assert os.stat(path).st_size > 0
        assert path.read_text().startswith(f"round {round_number} file {n}\n")
        moved = path.with_suffix(".moved")
        os.rename(path, moved)
        os.listdir(work)
        os.unlink(moved)
    for directory in ("", "tool", "bin", "shared/proj/queue", "shared/proj/queue/done"):
        os.listdir(view / directory)
    for tool in ("fs.read", "fs.stat", "shell.exec"):
        os.stat(view / "tool" / tool)
        (view / "tool" / f"{tool}.d" / "description").read_text()


@needs_fuse
def test_a_mount_serving_rounds_of_work_and_killed_readers_keeps_its_descriptors(
    storage: Path, tmp_path: Path
) -> None:
    """F-1 (docs/mount.md: operations pass through; a file opened through the mount is
    closed when the kernel lets it go), Q-1, Q-2, Q-4 through the mount: one ``ctx mount``
    serves four rounds of files made, written, fsynced, read, stat'ed, renamed and removed,
    listings of the root, the tools and the queue, a batch published to and drained from the
    queue through the mount, and three readers per round killed with SIGKILL while they hold
    a dozen files and a directory open and read.  After the warm-up round and after each
    later one, the daemon holds the same descriptors and threads, has no child, and about the
    same resident memory; ``ctx umount`` then ends it with exit 0 and nothing said amiss."""
    where = tmp_path / "mnt"
    where.mkdir()
    samples: list[Sample] = []
    holding: list[int] = []
    with serving(storage, where) as mount:
        view = where
        (view / "shared" / "proj" / "work").mkdir()
        held = view / "shared" / "proj" / "held"
        held.mkdir()
        for n in range(10):
            (held / f"f{n}").write_text(f"held {n}\n")
        (held / "big").write_bytes(os.urandom(1 << 20))
        through = QueueCLI(view, "proj")
        for round_number in range(4):
            mount_round(view, round_number)
            lines = "".join(
                json.dumps({"tool": "fs.read", "input": {"path": f"{round_number}-{n}"}}) + "\n"
                for n in range(10)
            )
            published = through.run("publish", "--batch", "-", input=lines)
            assert published.rc == 0, published
            drained = through.run("work", "--drain", "--json")
            assert drained.rc == 0, drained
            stop = json.loads(drained.lines()[-1])
            assert (stop["event"], stop["failed"], stop["lost"]) == ("stop", 10, 0), stop
            reader_argv = ["/usr/bin/python3", "-c", READER, str(held)]
            readers = [
                subprocess.Popen(reader_argv, stdout=subprocess.PIPE, text=True) for _ in range(3)
            ]
            for reader in readers:
                assert reader.stdout is not None
                assert reader.stdout.readline() == "ready\n"
            holding.append(len(descriptor_kinds(mount.proc.pid)))
            for reader in readers:
                reader.kill()
            for reader in readers:
                reader.wait()
                assert reader.stdout is not None
                reader.stdout.close()
            samples.append(steady_sample(mount.proc.pid, children=0))
        through.assert_settled()
        assert mount.proc.poll() is None, mount.said()
    assert mount.proc.returncode == 0, mount.said()
    assert not mounted_at(where)
    assert "Traceback" not in mount.said(), mount.said()
    first, later = samples[0], samples[1:]
    assert first.children == () and first.threads >= 1, first
    # The readers' files were the daemon's to hold while they lived (so letting go counts).
    assert min(holding) >= len(first.fds) + 3 * 11, (holding, first.fds)
    assert_bounded("ctx mount", first, later)


# ------------------------------------------------------------- a chatty MCP server's stderr


@pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed in the venv")
def test_an_mcp_session_keeps_no_more_of_a_chatty_servers_stderr_than_its_tail() -> None:
    """M-1, M-4 (cortexfs/mcp/client.py: "its stderr is kept (the tail) for error
    messages"; the same client serves the bridge's one ``tools/call``, which may wait as long
    as the call's timeout allows): a server that writes 3 MiB of debug lines to its stderr
    three times while the ``ctxmcp list`` session waits for each of two pages (18 MiB in
    all) costs the session a bounded amount of storage: the removed temp files the client
    holds never take more than two such writes."""
    session = paged_session(2, steps=3, stderr_bytes=3 << 20, notes=0)
    assert session.rc == 0, session.err
    assert max(session.unlinked) <= 6 << 20, session.unlinked
