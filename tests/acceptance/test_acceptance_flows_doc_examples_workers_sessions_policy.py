"""docs/workers.md, docs/sessions.md and docs/policy.md taken literally, as a new user copies
them (SPEC §3 workers, §4 sessions, §5 policy, §9 shared spaces): each command the pages show,
each output printed beside a command, each table of errors, exit statuses, keys, events and
event types, and each promise stated in prose, run through the installed ``ctx`` (and the
ready programs of ``workers/``) on a storage root of its own, and held to what it prints, its
exit status and what it leaves on disk.  Only paths and names are adapted to the scratch root.

What docs/queue.md's flow file already runs from these pages (the coder/reviewer explain
output, the "Errors you will see" table's check lines, the worker's ``[exit]`` reason and
session commands, a damaged identity) is not repeated here.

Black-box: real processes, real uids (``nobody``, 1001, 1002, the ``ctxtest`` user), real
signals, ``chattr`` and FIFOs.  Nothing of the product is imported here; the Python snippets
the pages print run in a subprocess of the install's interpreter, as a reader would run them."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    wait_for,
)
from tests.acceptance.workercli import allow_in_tool_policy, make_agent
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the pages' agents run as other uids, which only root can make"
)

SCRATCH = scratch_top(__file__)
CTX = CTX_ARGV[0]
PYTHON = str(Path(CTX).parent / "python")
REPO = Path(CTX).parents[2]
NOBODY = 65534
R = "[redacted]"
# docs/workers.md "Output": the event types of `ctx queue work --json`.
WORKER_EVENTS = {"start", "claim", "finish", "lost", "renew_failed", "interrupt", "stop"}
STOP_KEYS = {
    "done", "failed", "lost", "seconds", "rate", "aborted", "stopped_by", "failure",
    "left_pending", "left_claimed",
}  # fmt: skip

needs_chattr = pytest.mark.skipif(shutil.which("chattr") is None, reason="needs chattr")
needs_terminal = pytest.mark.skipif(
    shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs bubblewrap and /dev/fuse",
)


# ---------------------------------------------------------------------------------- helpers


@dataclass
class World:
    """A bootstrapped storage root holding the queue of project ``proj``, and a scratch
    directory every uid may search."""

    root: Path
    scratch: Path

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.root))

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.root, "proj")

    def publish(self, name: str, cmd: str, tool: str = "shell.exec") -> str:
        req = {"tool": tool, "input": {"cmd": cmd} if tool == "shell.exec" else {"path": "/"}}
        r = self.queue.run("publish", "--name", name, "-", input=json.dumps(req))
        assert r.rc == 0, r
        return r.out.strip()

    def work(self, *args: str, **kw) -> Run:
        """``ctx queue work --project proj --agent ci ARGS``."""
        return self.ctx("queue", "work", "--project", "proj", "--agent", "ci", *args, **kw)

    def events_of(self, session_dir: str) -> list[dict]:
        return read_jsonl(self.root / session_dir / "events.jsonl")


CI_SESSION = f"home/{NOBODY}/agent/ci/session/worker"


def agent_request(name: str, tools: list[str], shared: dict | None = None) -> str:
    req: dict = {"name": name, "label": f"{name}_t", "tools": tools}
    if shared is not None:
        req["shared"] = shared
    return json.dumps(req)


def relocate(template: Path, root: Path) -> Path:
    """``root``, a copy of the storage root ``template`` as its commands would have made it
    there: the files that name the root where they were written (``bin/ctxterm``, each agent's
    entry and mount control) name ``root``."""
    # cp -a, not shutil.copytree: the owners and groups (a space's group) are kept too.
    subprocess.run(["cp", "-a", str(template), str(root)], check=True)
    named = [root / "bin/ctxterm"]
    for entry in (root / "agent").iterdir():
        named.append(entry / "mount" if entry.name.endswith(".d") else entry)
    for path in named:
        if path.is_file():
            path.write_bytes(path.read_bytes().replace(bytes(template), bytes(root)))
    return root


@pytest.fixture(scope="session")
def _agents_template(_template: Path) -> Iterator[Path]:
    """The bootstrapped root of conftest, with what these flows share, made once: the space
    ``project-a`` of group 2000 (docs/policy.md's worked example), agent ``ci`` (uid nobody,
    root's default) allowed ``shell.exec``, ``coder`` (uid 1001, groups 2000, reads and writes
    the space) and ``reviewer`` (uid 1002, groups 2000, reads it), both allowed ``fs.stat`` in
    both layers of P-6."""
    parent = new_scratch_dir(SCRATCH, "template")
    root = relocate(_template, parent / "storage")
    env = clean_env(CTX_STORAGE=str(root))
    assert ctx_run("shared", "create", "project-a", "--group", "2000", env=env).rc == 0
    make_agent(root, ["shell.exec"])
    allow_in_tool_policy(root, "shell.exec")
    for name, uid, rights in (("coder", 1001, ["read", "write"]), ("reviewer", 1002, ["read"])):
        r = ctx_run(
            "agent", "create", "--user", str(uid), "--gid", str(uid), "--groups", "2000", "-",
            input=agent_request(name, ["fs.stat"], {"project-a": rights}), env=env,
        )  # fmt: skip
        assert r.rc == 0, r
        allow_in_tool_policy(root, "fs.stat", f"{name}_t")
    yield root
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def world(_agents_template: Path) -> Iterator[World]:
    """A fresh copy of the agents' template, in a scratch directory every uid may search."""
    parent = new_scratch_dir(SCRATCH, "w")
    scratch = parent / "scratch"
    scratch.mkdir(mode=0o755)
    yield World(relocate(_agents_template, parent / "storage"), scratch)
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def ci(world: World) -> World:
    """The world, for a flow of agent ``ci``'s worker."""
    return world


@pytest.fixture
def team(world: World) -> World:
    """The world, for a flow of ``coder`` and ``reviewer`` in ``project-a``."""
    return world


def spawn(world: World, *args: str) -> subprocess.Popen:
    """``ctx queue work --project proj --agent ci --json ARGS`` in the background."""
    argv = [CTX, "queue", "work", "--project", "proj", "--agent", "ci", "--json", *args]
    return subprocess.Popen(
        argv, env=world.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


class Events:
    """The JSON lines a background process prints on stdout, read from the pipe's descriptor
    as they come (no buffered reader that could hold lines the selector does not see), each
    waited for within a bound."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.fd = proc.stdout.fileno()
        self.pending = b""
        self.ended = False
        self.seen: list[dict] = []
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.fd, selectors.EVENT_READ)

    def _fill(self, seconds: float) -> None:
        if self.selector.select(timeout=seconds):
            chunk = os.read(self.fd, 65536)
            self.pending += chunk
            self.ended = not chunk

    def line(self, seconds: float = 30) -> dict:
        """The next JSON line, waited for at most ``seconds``."""
        deadline = time.monotonic() + seconds
        while b"\n" not in self.pending:
            assert not self.ended, f"the process ended after {self.seen}"
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"nothing printed within {seconds} s after {self.seen}")
            self._fill(left)
        line, self.pending = self.pending.split(b"\n", 1)
        self.seen.append(json.loads(line))
        return self.seen[-1]

    def until(self, kind: str, seconds: float = 30) -> dict:
        deadline = time.monotonic() + seconds
        while True:
            event = self.line(max(deadline - time.monotonic(), 0.1))
            if event.get("event") == kind:
                return event

    def finish(self, seconds: float = 60) -> tuple[int, list[dict], str]:
        """Wait for the process to end: its exit status, every JSON line, its stderr."""
        deadline = time.monotonic() + seconds
        while not self.ended:
            assert time.monotonic() < deadline, f"still running after {self.seen}"
            self._fill(deadline - time.monotonic())
        self.seen += [json.loads(ln) for ln in self.pending.splitlines() if ln.strip()]
        self.pending = b""
        err = self.proc.stderr.read()
        return self.proc.wait(timeout=seconds), self.seen, err

    @property
    def names(self) -> list[str]:
        """The ``event`` of each line that has one (an error object has none)."""
        return [e["event"] for e in self.seen if "event" in e]


@pytest.fixture
def reaper() -> Iterator[list[subprocess.Popen]]:
    """Background processes of a test, killed at the end if still running."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def processes_running(marker: str) -> list[int]:
    """Pids whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline:
                found.append(int(entry.name))
    return found


def chattr(flag: str, path: Path) -> None:
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"chattr {flag} is not supported here: {done.stderr.strip()}")


def mode(path: Path) -> int:
    return os.lstat(path).st_mode & 0o7777


# ----------------------------------------------------------------------- docs/workers.md


def test_worker_options_and_names_outside_their_limits_claim_nothing(ci: World) -> None:
    """W-1, W-3, R-3 (docs/workers.md): ``--agent 'a/b'``, a ``--worker`` id of 256 bytes or
    with a control byte, ``--ttl`` under a second, ``--concurrency 1025`` and ``--timeout``
    over a year and a day are EINVAL, exit 2; a ``lease_ttl`` under a second in
    ``queue/config`` stops the worker with exit 1 before its first claim."""
    job = ci.publish("j1", "echo hi")
    for args in (
        ("--agent", "a/b"),
        ("--worker", "x" * 256),
        ("--worker", "a\x01b"),
        ("--ttl", "0.5"),
        ("--concurrency", "1025"),
        ("--timeout", "31622401"),
    ):
        r = ci.ctx("queue", "work", "--project", "proj", "--agent", "ci", "--drain", *args)
        assert r.rc == 2 and r.err.splitlines()[-1].startswith("ctx: EINVAL: "), r
        assert ci.queue.entries("pending") == {job} and ci.queue.entries("claimed") == set()
    r = ci.work("--drain", "--worker", "w" * 255, "--timeout", "31622400")
    assert r.rc == 0 and ci.queue.state(job) == "done", r  # the limits themselves are fine

    job = ci.publish("j2", "echo hi")
    config = ci.queue.dir / "config"
    config.write_text(config.read_text().replace("lease_ttl=300", "lease_ttl=0.5"))
    r = ci.work("--drain")
    assert (r.rc, r.out) == (1, ""), r
    assert r.err.startswith("ctx: EINVAL: a worker's lease lifetime is at least 1 second"), r
    assert ci.queue.state(job) == "pending"


def test_the_ready_programs_are_the_command_with_their_kind_fixed(ci: World) -> None:
    """W-5 (docs/workers.md, workers/README.md): ``workers/tool_worker.py`` says the same
    errors under its own name (``tool_worker.py: ENOENT: no queue at …``, exit 1),
    ``shell_worker.py`` requires ``--agent`` (exit 2), and each prints the jobs it finished
    as JSON lines."""
    tool_worker, shell_worker = REPO / "workers/tool_worker.py", REPO / "workers/shell_worker.py"
    done = subprocess.run(
        [str(tool_worker), "--project", "nosuch", "--agent", "ci", "--drain"],
        env=ci.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done
    assert done.stderr.startswith(
        f"tool_worker.py: ENOENT: no queue at {ci.root}/shared/nosuch/queue"
    ), done.stderr
    done = subprocess.run(
        [str(shell_worker), "--project", "proj", "--drain"],
        env=ci.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "shell_worker.py: EINVAL: " in done.stderr, done

    job = ci.publish("ready", "echo ok")
    done = subprocess.run(
        [str(shell_worker), "--project", "proj", "--agent", "ci", "--drain"],
        env=ci.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done
    lines = [json.loads(ln) for ln in done.stdout.splitlines()]
    assert [(e["event"], e.get("job")) for e in lines] == [("finish", job), ("stop", None)]
    assert lines[0]["state"] == "done" and set(lines[1]) == {"event", *STOP_KEYS}


def test_only_the_host_administrator_may_start_a_worker_with_an_agent(
    ci: World, unprivileged_user: UnprivilegedUser
) -> None:
    """W-1, P-5 step 1 (docs/workers.md "Who may start one"): a member of the project's
    group, not the storage root's owner, is refused with the printed EACCES (exit 1) and
    claims nothing; the owner of a storage root whose ``home/`` is root's is refused naming
    the session and the home, with "start it as root, or create that home first"."""
    user = unprivileged_user
    assert ci.ctx("shared", "create", "proj", "--group", str(user.gid)).rc == 0
    job = ci.publish("j", "echo hi")
    done = run_as(user, [CTX, "queue", "work", "--project", "proj", "--agent", "ci", "--drain"],
                  env=ci.env)  # fmt: skip
    assert (done.returncode, done.stdout) == (1, ""), done
    assert done.stderr.startswith(
        f"ctx: EACCES: only the host administrator (root, or uid 0 who owns {ci.root}) may "
        "start a worker that runs jobs' tools as an agent; "
    ), done.stderr
    assert ci.queue.state(job) == "pending"

    # A storage owner's own root, whose home/ root took over.
    own = new_scratch_dir(ci.scratch, "own")
    os.chown(own, user.uid, user.gid)
    store = own / "storage"
    env = clean_env(CTX_STORAGE=str(store), HOME=str(own))
    for argv, stdin in (
        (["bootstrap"], None),
        (["agent", "create", "-"], agent_request("ci", ["shell.exec"])),
        (["queue", "init", "--project", "proj"], None),
        (["queue", "publish", "--project", "proj", "--name", "mine", "-"],
         json.dumps({"tool": "shell.exec", "input": {"cmd": "true"}})),
    ):  # fmt: skip
        done = run_as(user, [CTX, *argv], env=env, stdin=stdin)
        assert done.returncode == 0, done
    with open(store / "tool/shell.exec.d/policy", "a") as policy:
        policy.write("allow ci_t tool:shell.exec execute\n")
    os.chown(store / "home", 0, 0)
    done = run_as(user, [CTX, "queue", "work", "--project", "proj", "--agent", "ci", "--drain"],
                  env=env)  # fmt: skip
    home = f"{store}/home/{user.uid}"
    assert done.returncode == 1, done
    assert done.stderr.startswith(
        f"ctx: EACCES: cannot open the worker's session {home}/agent/ci/session/worker "
    ), done.stderr
    assert "no job was claimed" in done.stderr, done.stderr
    assert f"start it as root, or create {home} owned by uid {user.uid} first" in done.stderr
    assert os.listdir(store / "shared/proj/queue/pending") == ["mine.req.json"]


def test_core_tools_of_another_version_stop_the_worker_before_its_first_claim(
    ci: World,
) -> None:
    """W-1, R-5 (docs/workers.md "After an upgrade of ctx"): a core tool whose stamp (its
    second line) is not this version's, or that carries none, stops a worker with an agent:
    exit 1, the printed EINVAL sentence, the jobs left pending; ``ctx bootstrap`` mends it."""
    job = ci.publish("j", "echo hi")
    tool = ci.root / "tool/fs.stat"
    data = tool.read_bytes()
    at = data.index(b"#cortexfs-bundle ") + len(b"#cortexfs-bundle ")
    other = b"0" if data[at : at + 1] != b"0" else b"1"
    tool.write_bytes(data[:at] + other + data[at + 1 :])
    expected = (
        f"ctx: EINVAL: the core tools in {ci.root} were installed by another version of ctx; "
        "run 'ctx bootstrap' (the worker claimed no job)\n"
    )
    r = ci.work("--drain")
    assert (r.rc, r.out, r.err) == (1, "", expected), r
    lines = (ci.root / "tool/fs.list").read_bytes().split(b"\n")
    (ci.root / "tool/fs.list").write_bytes(b"\n".join(lines[:1] + lines[2:]))  # no stamp
    tool.write_bytes(data)
    r = ci.work("--drain")
    assert (r.rc, r.err) == (1, expected), r
    assert ci.queue.state(job) == "pending"
    assert ci.ctx("bootstrap").rc == 0
    assert ci.work("--drain").rc == 0 and ci.queue.state(job) == "done"


def test_results_over_max_result_bytes_fail_with_efbig_never_left_claimed(ci: World) -> None:
    """W-1, Q-4 (docs/workers.md "A result too large"): a result over ``max_result_bytes`` is
    finished in ``failed/`` with ``EFBIG: … [finish]``, ``error.error`` EFBIG, ``output_omitted``
    and no output; a call that had failed already keeps its reason (``…; the call had failed
    already: … [exit] [finish]``); a limit below the failure record's own size still fails the
    job rather than leave it claimed."""
    big = 'head -c 5000 /dev/zero | tr "\\0" a'
    config = ci.queue.dir / "config"
    config.write_text(
        config.read_text().replace("max_result_bytes=16777216", "max_result_bytes=1000")
    )
    ok_big = ci.publish("big", big)
    bad_big = ci.publish("bad", f"{big}; echo oops >&2; exit 3")
    r = ci.work("--drain")
    assert r.rc == 0, r
    for job in (ok_big, bad_big):
        res = json.loads((ci.queue.dir / f"failed/{job}.result").read_text())
        assert res["output"] is None and res["output_omitted"] is True, res
        assert (res["error"]["error"], res["error"]["stage"]) == ("EFBIG", "finish"), res
        assert res["reason"].startswith("EFBIG: ") and res["reason"].endswith(" [finish]"), res
        assert "max_result_bytes" in res["reason"] and "the output is omitted" in res["reason"]
    reason = json.loads((ci.queue.dir / f"failed/{bad_big}.result").read_text())["reason"]
    assert reason.endswith(
        "; the output is omitted; the call had failed already: shell.exec exited with status 3: "
        "oops [exit] [finish]"
    ), reason

    config.write_text(config.read_text().replace("max_result_bytes=1000", "max_result_bytes=10"))
    tiny = ci.publish("tiny", big)
    assert ci.work("--drain").rc == 0
    assert ci.queue.state(tiny) == "failed" and ci.queue.entries("claimed") == set()


def test_a_running_worker_reads_the_config_before_each_claim_and_stops_on_a_broken_one(
    ci: World, reaper: list
) -> None:
    """W-1, Q-4 (docs/workers.md "The queue's config while a worker runs"): a
    ``max_result_bytes`` lowered while a job runs holds from the next job on; a config
    replaced by a directory while a job runs lets that job finish, then stops the worker: no
    further claim, exit 1 naming the config."""
    q = ci.queue.dir

    def drop(name: str, cmd: str) -> str:
        """A request put in pending/ at once (the worker is running a job meanwhile)."""
        (q / "pending" / f"{name}.req.json").write_text(
            json.dumps({"tool": "shell.exec", "input": {"cmd": cmd}})
        )
        return f"{name}.req.json"

    proc = spawn(ci)
    reaper.append(proc)
    events = Events(proc)
    events.until("start")
    running = drop("a1", "sleep 0.5; echo hello-world")
    assert events.until("claim")["job"] == running
    config = q / "config"
    saved = config.read_text()
    # Written as an administrator edits a live config: whole, then renamed into place.
    (q / "config.new").write_text(saved.replace("max_result_bytes=16777216", "max_result_bytes=10"))
    (q / "config.new").rename(config)
    after = drop("a2", "echo hello-world")
    finished = events.until("finish")
    assert (finished["job"], finished["state"]) == (running, "done"), finished
    finished = events.until("finish")
    assert (finished["job"], finished["state"]) == (after, "failed"), finished
    assert finished["reason"].startswith("EFBIG: "), finished

    (q / "config.new").write_text(saved)
    (q / "config.new").rename(config)
    running = drop("a3", "sleep 1; true")
    assert events.until("claim")["job"] == running
    left = drop("a4", "true")
    config.unlink()
    config.mkdir()
    rc, seen, err = events.finish()
    assert rc == 1, (seen, err)
    assert [e["event"] for e in seen if "event" in e][-2:] == ["finish", "stop"], seen
    assert err.startswith("ctx: EINVAL: the worker stopped: ") and str(config) in err, err
    assert ci.queue.state(running) in ("done", "failed") and ci.queue.state(left) == "pending"


@needs_chattr
def test_a_call_that_cannot_be_recorded_is_never_finished(ci: World) -> None:
    """S-5, W-1 (docs/workers.md, stage ``record``): with the tool's ``log`` immutable the
    worker finishes no job: it stops with EPERM naming the job, its session's file and the
    remedy, and leaves the job claimed without a result; once the log is writable again,
    ``ctx queue recover`` requeues it and it runs."""
    job = ci.publish("rec", "true")
    log = ci.root / "tool/shell.exec.d/log"
    chattr("+i", log)
    try:
        r = ci.work("--drain")
    finally:
        chattr("-i", log)
    assert r.rc == 1, r
    assert r.err.startswith(f"ctx: EPERM: the worker stopped: job {job} was left claimed: "), r
    assert (
        f"this worker records every call in its session {ci.root}/{CI_SESSION}/events.jsonl "
        "and in the tool's log"
    ) in r.err, r
    assert f"no result of {job} was written: make it writable again (" in r.err, r
    assert "then run 'ctx queue recover --project proj' once this worker has exited" in r.err, r
    assert ci.queue.state(job) == "claimed"
    assert not list((ci.queue.dir / "done").glob("rec*"))
    assert ci.queue.run("recover").rc == 0
    assert ci.work("--drain").rc == 0 and ci.queue.state(job) == "done"


@needs_chattr
def test_a_worker_stopped_by_an_error_prints_its_summary_then_the_error(ci: World) -> None:
    """W-1 (docs/workers.md "Output": ``--json``: one JSON object per event …, the ``stop``
    event the summary; a worker that stops on an error prints the error object after it)."""
    ci.publish("rec", "true")
    log = ci.root / "tool/shell.exec.d/log"
    chattr("+i", log)
    try:
        r = ci.work("--drain", "--json")
    finally:
        chattr("-i", log)
    assert r.rc == 1, r
    summary, error = (json.loads(line) for line in r.lines()[-2:])
    assert summary.get("event") == "stop", r.lines()
    assert set(error) == {"error", "errno", "message"} and error["error"] == "EPERM", error


def test_stored_requests_the_worker_cannot_run_fail_at_stage_request(ci: World) -> None:
    """W-1, S-2 (docs/workers.md stage table): a request put in ``pending/`` by hand that is
    not a valid request fails at stage ``request`` (EINVAL, ``… [request]``), recorded as
    ``queue.refuse`` in the session; a valid one with a field of its own named ``invalid``
    runs like any other."""
    (ci.queue.dir / "pending/hand.req.json").write_text('{"tool": 5}')
    r = ci.queue.run(
        "publish", "--name", "inv", "-",
        input=json.dumps({"tool": "shell.exec", "input": {"cmd": "echo ok"}, "invalid": True}),
    )  # fmt: skip
    assert r.rc == 0, r
    r = ci.work("--drain")
    assert r.rc == 0, r
    res = json.loads((ci.queue.dir / "failed/hand.req.json.result").read_text())
    assert (res["error"]["error"], res["error"]["errno"], res["error"]["stage"]) == (
        "EINVAL", 22, "request",
    ), res  # fmt: skip
    assert res["reason"].startswith("EINVAL: stored request is malformed: "), res
    assert res["reason"].endswith(" [request]"), res
    assert ci.queue.state("inv.req.json") == "done"
    refused = [e for e in ci.events_of(CI_SESSION) if e["type"] == "queue.refuse"]
    assert [(e["object"], e["status"]) for e in refused] == [("queue/hand.req.json", "error")]


def test_a_shell_worker_leaves_a_job_of_another_tool_pending(ci: World) -> None:
    """W-1, W-5 (docs/workers.md: "A ``--kind shell`` worker claims ``shell.exec`` jobs only:
    a job of another tool … stays pending for a tool worker", not in ``left_pending``)."""
    job = ci.publish("stat", "", tool="fs.stat")
    r = ci.work("--drain", "--kind", "shell", "--json")
    assert r.rc == 0, r
    assert ci.queue.state(job) == "pending", r
    assert json.loads(r.lines()[-1])["left_pending"] == {}, r


def test_a_drained_worker_names_the_jobs_it_leaves_pending(ci: World) -> None:
    """W-2, Q-3 (docs/workers.md "Many jobs"): jobs held by a leftover claim, a leftover lease
    or a conflict with ``done/`` are left pending, exit 0, named on stderr, and listed in the
    ``stop`` event's ``left_pending`` as ``claimed``, ``leased``, ``finished``."""
    held, leased, conflict = (ci.publish(n, "echo ok") for n in ("held", "leased", "conflict"))
    q = ci.queue.dir
    (q / "claimed" / held).mkdir()
    (q / "lease" / leased).mkdir()
    shutil.copy(q / "pending" / conflict, q / "done" / conflict)
    (q / "done" / f"{conflict}.result").write_text('{"status": "ok", "output": 1}')
    r = ci.work("--drain", "--json")
    assert r.rc == 0, r
    stop = json.loads(r.lines()[-1])
    assert stop["left_pending"] == {held: "claimed", leased: "leased", conflict: "finished"}
    r = ci.work("--drain")
    assert r.rc == 0, r
    notes = [ln for ln in r.err.splitlines() if ln.startswith("ctx: note: left pending")]
    assert len(notes) == 3 and all(any(j in n for n in notes) for j in (held, leased, conflict))
    assert ci.queue.entries("pending") == {held, leased, conflict}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_and_sighup_let_the_running_job_finish_and_exit_0(
    ci: World, reaper: list, sig: signal.Signals
) -> None:
    """W-4 (docs/workers.md "Signals"): SIGTERM or SIGHUP while a job runs: it is finished,
    the worker exits 0, and the ``stop`` event's ``stopped_by`` names the signal."""
    job = ci.publish("slow", "sleep 0.5; echo slept")
    proc = spawn(ci)
    reaper.append(proc)
    events = Events(proc)
    assert events.until("claim")["job"] == job
    proc.send_signal(sig)
    rc, seen, err = events.finish()
    assert rc == 0, (seen, err)
    assert seen[-1]["event"] == "stop" and seen[-1]["stopped_by"] == sig.name, seen
    assert ci.queue.state(job) == "done"


def test_a_second_interrupt_aborts_and_records_eintr(ci: World, reaper: list) -> None:
    """W-4, S-2, Q-5 (docs/workers.md "Signals"): a second ^C kills the running tool and
    exits 130 without finishing the job; the session's ``tool_result`` (and the tool's log)
    say ``EINTR`` at stage ``run`` with exit status 137; ``ctx queue recover`` requeues it."""
    job = ci.publish("long", "sleep 30.17")
    proc = spawn(ci)
    reaper.append(proc)
    events = Events(proc)
    events.until("claim")
    assert wait_for(lambda: processes_running("sleep 30.17"), 30)
    proc.send_signal(signal.SIGINT)
    # The first ^C is taken (the worker says so; see the next test) before the second is sent.
    events.until("interrupt")
    proc.send_signal(signal.SIGINT)
    rc, seen, err = events.finish()
    assert rc == 130, (seen, err)
    stop = seen[-1]
    assert (stop["event"], stop["aborted"], stop["stopped_by"]) == ("stop", True, "SIGINT")
    results = [e for e in ci.events_of(CI_SESSION) if e["type"] == "tool_result"]
    assert (results[-1]["errno"], results[-1]["stage"], results[-1]["exit_status"]) == (
        "EINTR", "run", 137,
    ), results[-1]  # fmt: skip
    logged = read_jsonl(ci.root / "tool/shell.exec.d/log")[-1]
    assert (logged["errno"], logged["stage"]) == ("EINTR", "run"), logged
    assert ci.queue.state(job) == "claimed"
    assert wait_for(lambda: not processes_running("sleep 30.17"), 30)
    r = ci.queue.run("recover")
    assert r.rc == 0 and ci.queue.state(job) == "pending", r


def test_a_workers_json_events_are_of_the_listed_types(ci: World, reaper: list) -> None:
    """W-4 (docs/workers.md "Output": ``--json``: one JSON object per event (``start``,
    ``claim``, ``finish``, ``lost``, ``renew_failed``, ``interrupt``, ``stop``)): a first ^C
    on an idle worker
    stops it (exit 0, ``stopped_by`` SIGINT), and every line it printed is one of those."""
    proc = spawn(ci)
    reaper.append(proc)
    events = Events(proc)
    events.until("start")
    # Past the write of the start line: a ^C inside it drops the notice (the worker's choice).
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    rc, seen, err = events.finish()
    assert rc == 0 and seen[-1]["stopped_by"] == "SIGINT", (seen, err)
    assert {e["event"] for e in seen} <= WORKER_EVENTS, seen


def test_output_that_cannot_be_written_ends_the_worker_as_printed(ci: World) -> None:
    """W-4 (docs/workers.md "Output"): ``> /dev/full`` exits 74 with ``ctx: ENOSPC: cannot
    write standard output (…); the worker stopped claiming jobs; it finished no job``, the
    jobs still pending; a reader that left (``| head -1``) ends it quietly, exit 141."""
    jobs = {ci.publish(n, "echo ok") for n in ("j7", "j8")}
    argv = [CTX, "queue", "work", "--project", "proj", "--agent", "ci", "--drain"]
    with open("/dev/full", "w") as full:
        done = subprocess.run(argv, stdout=full, stderr=subprocess.PIPE, text=True,
                              env=ci.env, timeout=60)  # fmt: skip
    assert done.returncode == 74, done
    assert done.stderr == (
        "ctx: ENOSPC: cannot write standard output (No space left on device); the worker "
        "stopped claiming jobs; it finished no job\n"
    ), done.stderr
    assert ci.queue.entries("pending") == jobs
    done = subprocess.run(
        ["bash", "-c", '"$@" --json | head -1 >/dev/null; exit "${PIPESTATUS[0]}"', "sh", *argv],
        capture_output=True, text=True, env=ci.env, timeout=60,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (141, ""), done


def test_a_lease_taken_away_is_reported_lost_and_the_job_runs_again(
    ci: World, reaper: list
) -> None:
    """Q-5, Q-6, W-3 (docs/workers.md "A lease taken away"): a lease removed by hand and the
    claim returned by ``recover --reconcile``: the worker's finish is refused with ENOENT,
    nothing is written, the job is reported ``lost`` (event, ``queue.lost``, summary count)
    and runs again under a new claim."""
    job = ci.publish("tk", "sleep 1; echo fin")
    proc = spawn(ci, "--drain")
    reaper.append(proc)
    events = Events(proc)
    events.until("claim")
    shutil.rmtree(ci.queue.dir / "lease" / job)
    r = ci.queue.run("recover", "--reconcile")
    assert r.rc == 0 and ci.queue.state(job) == "pending", r
    lost = events.until("lost")
    assert (lost["job"], lost["state"]) == (job, "lost"), lost
    assert "ENOENT: " in lost["reason"] and "pending" in lost["reason"], lost
    rc, seen, err = events.finish()
    assert rc == 0, (seen, err)
    assert (seen[-1]["lost"], seen[-1]["done"]) == (1, 1), seen
    assert ci.queue.state(job) == "done"
    types = [e["type"] for e in ci.events_of(CI_SESSION) if e["object"] == f"queue/{job}"]
    assert types == [
        "queue.claim", "queue.start", "queue.lost", "queue.claim", "queue.start", "queue.finish"
    ], types  # fmt: skip


@needs_chattr
def test_a_renewal_the_host_refuses_gives_the_job_up_before_its_lease_expires(
    ci: World, reaper: list
) -> None:
    """Q-5, W-4 (docs/workers.md "A renewal the host refuses"): with ``inbox/`` immutable the
    renewal fails with EPERM: a ``renew_failed`` event (``job``, ``error``, ``errno``,
    ``reason``), ``queue.renew`` in the session, the tool killed before the lease expires, the
    job left claimed with no result (``lost``) and exit 1 with the printed sentence."""
    job = ci.publish("rn", "sleep 60.71; echo late")
    proc = spawn(ci, "--ttl", "1.5")
    reaper.append(proc)
    events = Events(proc)
    events.until("claim")
    inbox = ci.queue.dir / "inbox"
    chattr("+i", inbox)
    try:
        refused = events.until("renew_failed")
        rc, seen, err = events.finish()
    finally:
        chattr("-i", inbox)
    assert set(refused) == {"event", "job", "error", "errno", "reason"}, refused
    assert (refused["job"], refused["error"], refused["errno"]) == (job, "EPERM", 1), refused
    assert rc == 1, (seen, err)
    assert events.names[-2:] == ["lost", "stop"], seen
    assert err.startswith(
        f"ctx: EPERM: the worker stopped: job {job} was given up: its lease could not be renewed ("
    ), err
    assert (
        "then run 'ctx queue recover --project proj'" in err and "and start the worker again" in err
    ), err
    assert ci.queue.state(job) == "claimed"
    assert wait_for(lambda: not processes_running("sleep 60.71"), 30)
    types = [e["type"] for e in ci.events_of(CI_SESSION) if e["object"] == f"queue/{job}"]
    assert types == ["queue.claim", "queue.start", "queue.renew", "queue.lost"], types


def test_a_timeout_kills_the_tools_group_and_max_jobs_stops_the_worker(ci: World) -> None:
    """W-4 (docs/workers.md "One job", "Many jobs"): ``--timeout`` fails the job with
    ``ETIMEDOUT`` at stage ``run`` and kills the tool's whole process group (a background
    child too); ``--max-jobs 2`` stops after two claims, the rest pending."""
    slow = ci.publish("to", "sleep 93.7 & sleep 94.7")
    rest = [ci.publish(n, "echo ok") for n in ("m1", "m2", "m3")]
    r = ci.work("--drain", "--timeout", "1", "--max-jobs", "2")
    assert r.rc == 0, r
    res = json.loads((ci.queue.dir / f"failed/{slow}.result").read_text())
    assert (res["error"]["error"], res["error"]["stage"], res["exit_status"]) == (
        "ETIMEDOUT", "run", 137,
    ), res  # fmt: skip
    assert res["reason"].startswith("ETIMEDOUT: ") and res["reason"].endswith(" [run]"), res
    assert wait_for(lambda: not processes_running("sleep 93.7"), 30)
    assert ci.queue.state(rest[0]) == "done"
    assert ci.queue.entries("pending") == set(rest[1:])


# ---------------------------------------------------------------------- docs/sessions.md


def test_a_shared_session_is_made_with_the_documented_owners_and_modes(team: World) -> None:
    """S-1, S-6, X-1 (docs/sessions.md "Where sessions live"): a call recorded in a space makes
    ``agent/<agent>/session/<s>/`` 03770 of the agent's uid and the space's group, and
    ``events.jsonl`` 0660; the tool's log names ``session_dir``.  A reader of the space is
    refused with EACCES naming the step, a missing space is ENOENT naming ``ctx shared
    create``, and an ``agent/<agent>/`` another member made is refused naming its owner."""
    root = team.root
    r = team.ctx("run", "--agent", "coder", "--project", "project-a", "--session", "s1",
                 "fs.stat", "/ctx")  # fmt: skip
    assert r.rc == 0, r
    agent_dir = root / "shared/project-a/agent/coder"
    for d in (agent_dir, agent_dir / "session", agent_dir / "session/s1"):
        st = os.lstat(d)
        assert (mode(d), st.st_uid, st.st_gid) == (0o3770, 1001, 2000), d
    st = os.lstat(agent_dir / "session/s1/events.jsonl")
    assert (st.st_mode & 0o7777, st.st_uid, st.st_gid) == (0o660, 1001, 2000)
    logged = read_jsonl(root / "tool/fs.stat.d/log")[-1]
    assert (logged["session"], logged["session_dir"]) == (
        "s1", "shared/project-a/agent/coder/session/s1",
    )  # fmt: skip
    shown = team.ctx("session", "show", "coder", "s1", "--project", "project-a", "--json")
    assert [json.loads(ln)["type"] for ln in shown.lines()] == ["tool_call", "tool_result"]

    r = team.ctx("run", "--agent", "reviewer", "--project", "project-a", "--session", "s1",
                 "fs.stat", "/ctx")  # fmt: skip
    assert r.rc == 126 and r.err.startswith("ctx: EACCES: step 3 (mount visibility): "), r
    assert not (root / "shared/project-a/agent/reviewer").exists()
    r = team.ctx("run", "--agent", "coder", "--project", "nospace", "fs.stat", "/ctx")
    assert r.err.startswith("ctx: ENOENT: ") and "ctx shared create" in r.err, r
    assert not (root / "shared/nospace").exists()

    shutil.rmtree(agent_dir)
    agent_dir.mkdir()
    os.chown(agent_dir, 1002, 2000)
    agent_dir.chmod(0o3770)
    r = team.ctx("run", "--agent", "coder", "--project", "project-a", "--session", "s2",
                 "fs.stat", "/ctx")  # fmt: skip
    assert r.rc != 0 and r.err.startswith("ctx: EACCES: "), r
    assert "belongs to uid 1002" in r.err and "agent 'coder' (uid 1001)" in r.err, r
    assert os.listdir(agent_dir) == []


def test_bootstrap_and_repair_tighten_home_sessions_as_listed(team: World, tmp_path) -> None:
    """S-1, R-5 (docs/sessions.md "Sessions made by older versions"): ``ctx bootstrap`` takes
    a home session's directories to 0700 and ``events.jsonl`` to 0600, each line ``repaired
    home/… (mode 0750 -> 0700)``; an entry of another uid and a hard-linked ``events.jsonl``
    are left and named in ``warning`` lines; ``ctx session repair`` prints ``tightened PATH
    (mode 0750 -> 0700)`` and ``--json`` lists it."""
    root = team.root
    for session in ("default", "hl"):
        assert team.ctx("run", "--agent", "coder", "--session", session, "fs.stat", "/ctx").rc == 0
    base = root / "home/1001/agent/coder"
    for d in (base, base / "session", base / "session/default"):
        d.chmod(0o750)
    (base / "session/default/events.jsonl").chmod(0o640)
    (base / "session/hl/events.jsonl").chmod(0o640)
    os.link(base / "session/hl/events.jsonl", tmp_path / "other-name")
    (base / "session/other").mkdir(mode=0o750)
    os.chown(base / "session/other", 1234, 1234)

    r = team.ctx("bootstrap")
    assert r.rc == 0, r
    rel = "home/1001/agent/coder"
    for line in (
        f"repaired  {rel} (mode 0750 -> 0700)",
        f"repaired  {rel}/session (mode 0750 -> 0700)",
        f"repaired  {rel}/session/default (mode 0750 -> 0700)",
        f"repaired  {rel}/session/default/events.jsonl (mode 0640 -> 0600)",
    ):
        assert line in r.lines(), r
    warnings = [ln for ln in r.lines() if ln.startswith("warning   ")]
    assert any(ln.startswith(f"warning   {rel}/session/other has mode 0750") for ln in warnings)
    assert any(
        ln.startswith(f"warning   {rel}/session/hl/events.jsonl has mode 0640") for ln in warnings
    ), r
    assert (mode(base / "session/other"), mode(base / "session/hl/events.jsonl")) == (0o750, 0o640)
    assert mode(base / "session/default/events.jsonl") == 0o600

    (base / "session/default").chmod(0o750)
    r = team.ctx("session", "repair", "coder")
    assert r.rc == 0, r
    assert r.lines()[0] == f"tightened {root}/{rel}/session/default (mode 0750 -> 0700)", r
    assert r.lines()[1].startswith("nothing to do"), r
    (base / "session/default").chmod(0o750)
    r = team.ctx("session", "repair", "coder", "--json")
    assert r.json() == {
        "session": f"{rel}/session/default",
        "truncated_bytes": 0,
        "tightened": [f"{root}/{rel}/session/default (mode 0750 -> 0700)"],
        "left": [],
    }, r


def test_repair_of_a_hard_linked_log_leaves_it_and_says_what_it_tightened(
    team: World, tmp_path
) -> None:
    """S-5, S-1 (docs/sessions.md "Appending, crash-safely": an ``events.jsonl`` with more than
    one name is neither appended to nor repaired (``… refusing to repair it``, the file
    unchanged); modes tightened before stay so, and the refusal says so)."""
    assert team.ctx("run", "--agent", "coder", "fs.stat", "/ctx").rc == 0
    session = team.root / "home/1001/agent/coder/session/default"
    session.chmod(0o750)
    os.link(session / "events.jsonl", tmp_path / "other-name")
    before = (session / "events.jsonl").read_bytes()
    r = team.ctx("session", "repair", "coder")
    assert r.rc == 1 and "refusing to repair it (before that, it tightened " in r.err, r
    assert r.err.rstrip().endswith(f"{session} (mode 0750 -> 0700))"), r
    assert (session / "events.jsonl").read_bytes() == before
    assert mode(session) == 0o700, "the tightened mode was not kept"


def test_links_fifos_and_hard_links_are_never_written_through(team: World, tmp_path) -> None:
    """S-5 (docs/sessions.md): an ``events.jsonl`` with two names is neither appended to nor
    repaired (the printed EINVAL sentences, its bytes unchanged); one that is a symbolic link
    or a FIFO is refused by the runner and by ``show`` without writing or waiting."""
    root = team.root
    assert team.ctx("run", "--agent", "coder", "fs.stat", "/ctx").rc == 0
    events = root / "home/1001/agent/coder/session/default/events.jsonl"
    os.link(events, tmp_path / "other-name")
    before = events.read_bytes()
    r = team.ctx("run", "--agent", "coder", "fs.stat", "/ctx")
    assert (
        r.rc != 0
        and (f"ctx: EINVAL: {events} is a file with 2 names (hard links); refusing to append to it")
        in r.err
    ), r
    r = team.ctx("session", "repair", "coder")
    assert r.rc == 1 and r.err == (
        f"ctx: EINVAL: {events} is a file with 2 names (hard links); refusing to repair it\n"
    ), r
    assert events.read_bytes() == before

    target = tmp_path / "elsewhere.jsonl"
    target.write_text("")
    linked = root / "home/1001/agent/coder/session/lnk"
    linked.mkdir(mode=0o700)
    os.chown(linked, 1001, 1001)
    (linked / "events.jsonl").symlink_to(target)
    r = team.ctx("run", "--agent", "coder", "--session", "lnk", "fs.stat", "/ctx")
    assert r.rc != 0 and r.err.startswith("ctx: EINVAL: "), r
    r = team.ctx("session", "show", "coder", "lnk")
    assert r.rc == 1 and "is a symbolic link; refusing to read it" in r.err, r
    assert target.read_text() == ""

    fifo = root / "home/1001/agent/coder/session/ff"
    fifo.mkdir(mode=0o700)
    os.chown(fifo, 1001, 1001)
    os.mkfifo(fifo / "events.jsonl")
    r = team.ctx("session", "show", "coder", "ff", timeout=30)
    assert r.rc == 1 and r.err.startswith("ctx: EINVAL: ") and "not a regular file" in r.err, r
    r = team.ctx("run", "--agent", "coder", "--session", "ff", "fs.stat", "/ctx", timeout=30)
    assert r.rc != 0 and "not a regular file; refusing to append to it" in r.err, r


def event_line(kind: str) -> str:
    return json.dumps(
        {"ts": "2026-01-01T00:00:00Z", "type": kind, "agent": "coder", "session": "default",
         "object": "o", "status": "ok"}, separators=(",", ":"),
    )  # fmt: skip


def test_torn_glued_damaged_long_and_sparse_lines_read_as_documented(team: World) -> None:
    """S-5 (docs/sessions.md "Reading, torn lines and repair"): a torn last line is skipped
    and mentioned by ``show``, cut by the next appender and by ``repair`` (which says how many
    bytes); a glued event is still read, a complete line that holds no event (or is over
    64 KiB) is reported damaged and skipped; a file grown sparse to 4 GiB is read and
    repaired."""
    assert team.ctx("run", "--agent", "coder", "fs.stat", "/ctx").rc == 0
    events = team.root / "home/1001/agent/coder/session/default/events.jsonl"
    fragment = '{"ts":"2026-01-01T00:00:00Z","type":"torn'
    with open(events, "a") as f:
        f.write(fragment)
    r = team.ctx("session", "show", "coder", "--json")
    assert r.rc == 0 and [json.loads(ln)["type"] for ln in r.lines()] == [
        "tool_call", "tool_result",
    ], r  # fmt: skip
    assert f"ends with a torn line of {len(fragment)} bytes" in r.err, r
    assert team.ctx("run", "--agent", "coder", "fs.stat", "/ctx").rc == 0
    text = events.read_text()
    assert fragment not in text and [json.loads(ln)["type"] for ln in text.splitlines()] == [
        "tool_call", "tool_result", "tool_call", "tool_result",
    ]  # fmt: skip
    with open(events, "a") as f:
        f.write(fragment)
    r = team.ctx("session", "repair", "coder")
    assert r.out == f"truncated a torn last line of {len(fragment)} bytes from {events}\n", r

    with open(events, "a") as f:
        f.write('{"ts":"2026-01-01T00:00:00Z","type":"cut' + event_line("glued") + "\n")
        f.write("not an event\n")
        f.write("x" * 100_000 + "\n")
        f.write("y" * 100_000 + event_line("after-long") + "\n")
        f.write(event_line("last") + "\n")
    r = team.ctx("session", "show", "coder", "--json")
    kinds = [json.loads(ln)["type"] for ln in r.lines()]
    assert r.rc == 0 and kinds[-3:] == ["glued", "after-long", "last"], r
    assert len(kinds) == 7 and "damaged" in r.err, r

    size = events.stat().st_size
    os.truncate(events, 4 << 30)
    r = team.ctx("session", "show", "coder", "--json")
    assert r.rc == 0 and [json.loads(ln)["type"] for ln in r.lines()][-1] == "last", r
    assert f"ends with a torn line of {(4 << 30) - size} bytes" in r.err, r
    r = team.ctx("session", "repair", "coder")
    assert r.rc == 0 and events.stat().st_size == size, r


def test_tail_follow_reads_a_shrunk_file_again_and_ctrl_c_ends_it_with_0(
    team: World, reaper: list
) -> None:
    """S-5 (docs/sessions.md "Commands"): ``tail --follow`` prints what is appended; a file cut
    below what was read is read again from its start after ``ctx: note: PATH shrank to N
    bytes, from the M read: following it again from its start``; Ctrl-C ends it, exit 0."""
    assert team.ctx("run", "--agent", "coder", "fs.stat", "/ctx").rc == 0
    events = team.root / "home/1001/agent/coder/session/default/events.jsonl"
    err_file = team.scratch / "tail.err"
    with open(err_file, "w") as err:
        proc = subprocess.Popen(
            [CTX, "session", "tail", "coder", "-n", "1", "--follow", "--json"],
            env=team.env, stdout=subprocess.PIPE, stderr=err, text=True,
        )  # fmt: skip
    reaper.append(proc)
    printed = Events(proc)
    assert printed.line()["type"] == "tool_result"
    read = events.stat().st_size
    head = events.read_text().splitlines(keepends=True)[0]
    os.truncate(events, len(head))
    note = (
        f"ctx: note: {events} shrank to {len(head)} bytes, from the {read} read: following it "
        "again from its start"
    )
    assert wait_for(lambda: note in err_file.read_text(), 30), err_file.read_text()
    assert printed.line()["type"] == "tool_call"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0


def test_sessions_outlive_their_agent_and_missing_ones_are_enoent(team: World) -> None:
    """S-1 (docs/sessions.md "Commands"): once ``agent/<name>`` is gone the one home holding
    its sessions is read; with two, ``--uid`` says which (EINVAL, exit 2, otherwise); a
    session that does not exist is ENOENT (exit 1) naming ``ctx session list``."""
    root = team.root
    assert team.ctx("run", "--agent", "coder", "fs.stat", "/ctx").rc == 0
    r = team.ctx("session", "show", "coder", "nosuch")
    assert r.rc == 1 and r.err.startswith("ctx: ENOENT: "), r
    assert "'ctx session list coder' lists the sessions there are" in r.err, r
    r = team.ctx("session", "show", "coder", "nosuch", "--project", "project-a")
    assert r.rc == 1 and "'ctx session list coder --project project-a'" in r.err, r

    shutil.rmtree(root / "agent/coder.d")
    (root / "agent/coder").unlink()
    r = team.ctx("session", "list", "coder")
    assert (r.rc, r.out) == (0, "default\n"), r
    other = root / "home/1234/agent/coder/session/x"
    other.mkdir(parents=True)
    (other / "events.jsonl").write_text(event_line("x") + "\n")
    r = team.ctx("session", "list", "coder")
    assert r.rc == 2 and r.err.startswith("ctx: EINVAL: ") and "--uid" in r.err, r
    r = team.ctx("session", "list", "coder", "--uid", "1234")
    assert (r.rc, r.out) == (0, "x\n"), r
    r = team.ctx("session", "show", "ghost")
    assert r.rc == 1 and r.err.startswith("ctx: ENOENT: there is no agent 'ghost'"), r


ECHO_TOOL = "#!/bin/sh\ncat\n"  # its output is its input: the result keeps what the log redacts

# docs/sessions.md "What logs may say", in JSON: (input, what the log holds).
JSON_SUMMARIES = [
    ({"password": "tiger77"}, {"password": R}),
    ({"password": 5}, {"password": R}),
    ({"password": ["a", "b"]}, {"password": R}),
    ({"api_key": {"x": 1}}, {"api_key": R}),
    ({"tokenizer": "bpe", "secretary": "ana", "passenger": "p", "author": "a"},
     {"tokenizer": "bpe", "secretary": "ana", "passenger": "p", "author": "a"}),
    ({"tokenizer_secret": "x", "token_count": 12}, {"tokenizer_secret": R, "token_count": R}),
    ({"auth": "x", "basic_auth": "x", "X-Auth": "x", "proxyAuth": "x"},
     {"auth": R, "basic_auth": R, "X-Auth": R, "proxyAuth": R}),
    ({"auth_url": "http://h", "oauth": "o"}, {"auth_url": "http://h", "oauth": "o"}),
    ({"h": "Bearer abcdef", "b": "Basic Zm9vOmJhcg=="}, {"h": R, "b": R}),
    ({"ghp_abcdefghijklmnopqrstuvwxyz0123456789": 1,
      "ghp_bbcdefghijklmnopqrstuvwxyz0123456789": 2}, {R: 1, f"{R}#2": 2}),
    ([{"name": "API_TOKEN", "value": "abc"}], [{"name": "API_TOKEN", "value": R}]),
    ({"ParameterKey": "DbPassword", "ParameterValue": "x"},
     {"ParameterKey": "DbPassword", "ParameterValue": R}),
    (["Cookie", "sid=1"], ["Cookie", R]),
    (["db_password", 5], ["db_password", R]),
    ({"argv": ["psql", "--port", 5432, "--password", "tiger77"]},
     {"argv": ["psql", "--port", 5432, "--password", R]}),
]  # fmt: skip
# The same, inside any other text.
TEXT_SUMMARIES = [
    ("password=tiger77", f"password={R}"),
    ("GET /x?api_key=abc123&page=2", f"GET /x?api_key={R}&page=2"),
    ('{:password => "tiger77"}', f'{{:password => "{R}"}}'),
    ('{"password": ["a", "b"]}', f'{{"password": {R}}}'),
    ("password:\n  tiger77\n  more\nuser: ana", f"password:\n  {R}\nuser: ana"),
    ('printf "password:\\n  tiger77\\nuser: ana"', f'printf "password:\\n  {R}\\nuser: ana"'),
    ("if token:\n    go()", "if token:\n    go()"),
    ("Authorization: Bearer xyz", f"Authorization: {R}"),
    ("Cookie: sid=1", f"Cookie: {R}"),
    ("curl -H 'Cookie: theme=dark; sid=abc' https://h", f"curl -H 'Cookie: {R}' https://h"),
    ("request failed with Authorization: token abc123", f"request failed with Authorization: {R}"),
    ("git clone https://ana:pw123@git.example/r", f"git clone https://ana:{R}@git.example/r"),
    ("psql postgres://app:pw123@db/app", f"psql postgres://app:{R}@db/app"),
    ("machine h login ana password pw123", f"machine h login ana password {R}"),
    ("k:\n-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----\nz",
     f"k:\n{R}\nz"),
    ("t ghp_abcdefghijklmnopqrstuvwxyz0123456789 x", f"t {R} x"),
    ("t AKIAIOSFODNN7EXAMPLE x", f"t {R} x"),
    ("t eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl x", f"t {R} x"),
    ("app --password tiger77 --api-key k2 --auth a3",
     f"app --password {R} --api-key {R} --auth {R}"),
    ("curl -u admin:pw123 --user=admin:pw456 https://h",
     f"curl -u admin:{R} --user=admin:{R} https://h"),
    ("mysql -ptiger77 db; mysql -p db", f"mysql -p{R} db; mysql -p db"),
    ("sshpass -p tiger77 ssh h", f"sshpass -p {R} ssh h"),
    ("docker login -u me -p tiger77", f"docker login -u me -p {R}"),
    ("openssl enc -pass pass:tiger77 -in f", f"openssl enc -pass pass:{R} -in f"),
    ("openssl enc -pass env:VAR -in f", "openssl enc -pass env:VAR -in f"),
    ("htpasswd -nbB USER tiger77 > out", f"htpasswd -nbB USER {R} > out"),
    ("mkdir -p d; ssh -p 2222 h; docker run -p 8080:80 -u 1000:1000 img; sort -u f; login -p",
     "mkdir -p d; ssh -p 2222 h; docker run -p 8080:80 -u 1000:1000 img; sort -u f; login -p"),
]  # fmt: skip


def test_logged_summaries_follow_the_pages_rule_and_the_caller_gets_the_output(
    team: World,
) -> None:
    """S-4, S-2, T-7 (docs/sessions.md "What logs may say"): the page's examples, given as a
    tool's input, are logged in the session as the page writes them (JSON values, text,
    command lines, an argv, the 200-character, 20-item and 20-key cuts), while the result the
    caller gets holds the output as it was; stderr is never logged."""
    root = team.root
    src = team.scratch / "echo"
    src.mkdir()
    (src / "echo.sh").write_text(ECHO_TOOL)
    (src / "echo.json").write_text(json.dumps({
        "manifest": 2, "kind": "tool", "name": "echo.any", "description": "Echoes its input.",
        "schema": {"type": "object"}, "cap": {"side_effects": False, "network": False},
        "exec": "echo.sh"}))  # fmt: skip
    assert team.ctx("object", "install", src / "echo.json", "--tier", "system").rc == 0
    for policy in ("agent/coder.d/policy", "tool/echo.any.d/policy"):
        with open(root / policy, "a") as f:
            f.write("allow coder_t tool:echo.any execute\n")

    def logged_input(given: dict) -> tuple[dict, dict]:
        r = team.ctx("run", "--native", "--agent", "coder", "--session", "redact", "echo.any",
                     input=json.dumps(given))  # fmt: skip
        assert r.rc == 0, r
        result = json.loads(r.lines()[-1])
        call = [e for e in team.events_of("home/1001/agent/coder/session/redact")
                if e["type"] == "tool_call"][-1]  # fmt: skip
        return call["input"], result["output"]

    cases = [(v, w) for v, w in JSON_SUMMARIES] + [({"s": v}, {"s": w}) for v, w in TEXT_SUMMARIES]
    wrong = {}
    for start in range(0, len(cases), 20):  # an object keeps its first 20 keys
        chunk = cases[start : start + 20]
        given = {f"k{i:02d}": value for i, (value, _) in enumerate(chunk)}
        logged, output = logged_input(given)
        assert output == given  # the caller's result is not redacted
        for i, (_, expected) in enumerate(chunk):
            if logged[f"k{i:02d}"] != expected:
                wrong[json.dumps(chunk[i][0])] = logged[f"k{i:02d}"]
    assert wrong == {}

    logged, _ = logged_input({
        "long": "a" * 250, "list": list(range(25)),
        "obj": {f"k{i:02d}": i for i in range(25)},
    })  # fmt: skip
    assert logged["long"] == "a" * 200 + "…[+50 chars]", logged["long"]
    assert logged["list"] == [*range(20), "[+5 items]"], logged["list"]
    assert list(logged["obj"].items())[-2:] == [("k19", 19), ("[+5 keys]", None)]

    r = team.ctx("run", "--agent", "coder", "--session", "argv", "echo.any",
                 "TOKEN=abc", "-H", "Authorization:", "token", "abc123", "x", "Bearer", "abc",
                 "Cookie:", "a=1;", "sid=2", "end")  # fmt: skip
    assert r.rc == 0, r
    call = team.events_of("home/1001/agent/coder/session/argv")[0]
    assert call["argv"] == [
        f"TOKEN={R}", "-H", "Authorization:", "token", R, "x", "Bearer", R, "Cookie:", R, R,
        "end",
    ], call  # fmt: skip
    for event in team.events_of("home/1001/agent/coder/session/redact"):
        assert "stderr" not in event, event


@needs_terminal
def test_an_agents_log_holds_the_listed_types_with_their_facts(team: World) -> None:
    """S-3, S-4, A-3 (docs/sessions.md "An agent's log"): ``agent.created`` (``by``,
    ``label``, ``uid``, ``gid``; ``session`` empty for ``ctx agent create``; ``parent`` and
    ``child`` for the ``agent.create`` tool, in both logs), ``agent.updated`` (``control``,
    ``bytes``), ``terminal.started`` (``pid``, ``workspace``) and ``terminal.stopped``
    (``reason`` ``stop``); the log is root's, mode 0640."""
    root = team.root
    log = root / "agent/coder.d/log"
    st = os.lstat(log)
    assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o640)
    created = read_jsonl(log)[0]
    assert list(created)[:6] == ["ts", "type", "agent", "session", "object", "status"]
    assert (created["type"], created["session"], created["object"]) == (
        "agent.created", "", "agent/coder",
    )  # fmt: skip
    assert {k: created[k] for k in ("by", "label", "uid", "gid")} == {
        "by": "ctx agent create", "label": "coder_t", "uid": 1001, "gid": 1001,
    }  # fmt: skip

    rules = (
        "allow coder_t tool:agent.update execute\nallow coder_t tool:agent.create execute\n"
        "allow coder_t agent:helper create\n"
    )
    with open(root / "agent/coder.d/policy", "a") as f:
        f.write(rules)
    for tool in ("agent.update", "agent.create"):
        with open(root / f"tool/{tool}.d/policy", "a") as f:
            f.write(f"allow coder_t tool:{tool} execute\n")
    r = team.ctx(
        "run",
        "--native",
        "--agent",
        "coder",
        "agent.update",
        input='{"control": "system.md", "content": "Answer in one paragraph.\\n"}',
    )
    assert r.rc == 0, r
    updated = read_jsonl(log)[-1]
    assert (updated["type"], updated["control"], updated["bytes"]) == (
        "agent.updated", "system.md", 25,
    ), updated  # fmt: skip
    r = team.ctx("run", "--native", "--agent", "coder", "agent.create",
                 input=agent_request("helper", ["fs.stat"]))  # fmt: skip
    assert r.rc == 0, r
    in_parent = read_jsonl(log)[-1]
    in_child = read_jsonl(root / "agent/helper.d/log")[-1]
    assert (in_parent["type"], in_parent["object"], in_parent["child"]) == (
        "agent.created", "agent/helper", "helper",
    ), in_parent  # fmt: skip
    assert (in_child["agent"], in_child["parent"], in_child["by"]) == (
        "helper", "coder", "agent.create",
    ), in_child  # fmt: skip

    workspace = new_scratch_dir(team.scratch, "ws")
    r = team.ctx("agent", "start", "coder", "--workspace", workspace)
    try:
        assert r.rc == 0, r
    finally:
        stopped = team.ctx("agent", "stop", "coder")
    assert stopped.rc == 0, stopped
    assert wait_for(lambda: read_jsonl(log)[-1]["type"] == "terminal.stopped", 30)
    started, ended = read_jsonl(log)[-2:]
    assert started["type"] == "terminal.started" and started["workspace"] == str(workspace)
    assert isinstance(started["pid"], int) and started["session"] == "default", started
    assert (ended["type"], ended["reason"]) == ("terminal.stopped", "stop"), ended


def test_shared_create_regroups_and_repairs_as_the_page_says(world: World) -> None:
    """X-1, S-6 (docs/sessions.md "Shared spaces"): ``--group G`` on a space of another group
    says ``regrouped <space>: group OLD -> G (N entries)``; without ``--group`` what exists is
    left; with it a directory's mode is repaired, a session directory an older version made
    02770 becomes 03770 (``repaired  PATH (mode 2770 -> 3770)``, bootstrap warning first), one
    of another owner is EPERM with nothing changed, and a NAME that is not an object name is
    EINVAL, exit 2."""
    root, space = world.root, world.root / "shared/proj"
    r = world.ctx("shared", "create", "proj", "--group", "2000")
    assert r.rc == 0, r
    assert r.lines()[0].startswith(f"regrouped {space}: group 0 -> 2000 ("), r
    assert r.lines()[0].endswith(" entries)"), r
    assert os.lstat(space / "queue/pending").st_gid == 2000

    (space / "data").chmod(0o777)
    r = world.ctx("shared", "create", "proj")
    assert r.rc == 0 and mode(space / "data") == 0o777, r
    session = space / "agent/builder/session/s1"
    session.mkdir(parents=True)
    for d in (space / "agent/builder", space / "agent/builder/session", session):
        os.chown(d, 1001, 2000)
        d.chmod(0o2770)
    r = world.ctx("bootstrap")
    assert any(
        ln.startswith("warning   shared space proj: ")
        and "run 'ctx shared create proj --group 2000'" in ln
        for ln in r.lines()
    ), r
    r = world.ctx("shared", "create", "proj", "--group", "2000")
    assert r.rc == 0, r
    assert f"repaired  {session} (mode 2770 -> 3770)" in r.lines(), r
    assert any(ln.startswith(f"repaired  {space}/data") for ln in r.lines()), r
    assert (mode(space / "data"), mode(session)) == (0o2770, 0o3770)

    (space / "data").chmod(0o777)
    os.chown(space / "data", 1001, 2000)
    (space / "tool").chmod(0o2777)
    r = world.ctx("shared", "create", "proj", "--group", "2000")
    assert r.rc == 1 and r.err.startswith(f"ctx: EPERM: {space}/data belongs to uid 1001"), r
    assert (mode(space / "data"), mode(space / "tool")) == (0o777, 0o2777)
    before = sorted(os.listdir(root / "shared"))
    for name in ("a/b", ".x", "x.d"):
        r = world.ctx("shared", "create", name)
        assert r.rc == 2 and r.err.startswith("ctx: EINVAL: illegal shared space name"), r
    assert sorted(os.listdir(root / "shared")) == before


PYTHON_SNIPPETS = """\
import json, sys
from pathlib import Path
from cortexfs.policy import AuthorityRequest, Credentials, check_authority, check_tool_execute
from cortexfs.policy import Policy, tool_execute_allowed
from cortexfs.shared.sessions import SessionRef, open_session
from cortexfs.shared.tree import Ownership
from cortexfs.shared.events import read_events

root = Path(sys.argv[1])
decision = check_tool_execute(root, "coder", "fs.read", Credentials(1001, 1001), location="tool")
out = {"allowed": decision.allowed, "step": int(decision.step), "title": decision.step.title,
       "errno": decision.errno, "reason": decision.reason}
try:
    decision.raise_if_denied()
except Exception as exc:
    out["raised"] = [type(exc).__name__, exc.errno]
d = check_authority(AuthorityRequest(root, "coder", "shared", "project-a", "write",
                                     Credentials(1001, 1001)))
out["shared"] = [d.allowed, d.step, d.errno]
try:
    check_authority(AuthorityRequest(root, "coder", "bogus", "x", "read", Credentials(1, 1)))
except Exception as exc:
    out["malformed"] = exc.errno
p = Policy.from_text("allow coder_t tool:fs.read execute\\n")
out["pure"] = [p.allows("coder_t", "tool", "fs.read", "execute"),
               tool_execute_allowed(p, p, "coder_t", "fs.read"),
               tool_execute_allowed(p, Policy.from_text(""), "coder_t", "fs.read")]
ref = SessionRef.shared(root, "project-a", "builder", "worker")
with open_session(ref, owner=Ownership(1001, 1001)) as session:
    session.record("queue.claim", object="queue/build-7.req.json", status="ok",
                   durable_event=True, worker="w1")
scan = read_events(root / "shared/project-a/agent/builder/session/worker/events.jsonl")
out["events"] = scan.events
print(json.dumps(out))
"""


def test_the_documented_python_interfaces_answer_as_the_pages_print(team: World) -> None:
    """P-5, P-6, S-1, S-5 (docs/policy.md "For the tool runner and other callers",
    docs/sessions.md "For workers and other callers"): the snippets, run by the install's
    interpreter, give a denied ``Decision`` (``step`` an int with ``.title``, ``errno``,
    ``reason`` starting ``step N (…)``, ``raise_if_denied`` raising with that errno), EINVAL for
    a malformed request, the pure ``Policy``/``tool_execute_allowed`` answers, and a shared
    session created with its modes and the recorded event on disk."""
    done = subprocess.run([PYTHON, "-c", PYTHON_SNIPPETS, str(team.root)], capture_output=True,
                          text=True, timeout=60, cwd=team.scratch)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["allowed"], out["step"], out["title"], out["errno"]) == (
        False, 5, "object policy", 13,
    ), out  # fmt: skip
    assert out["reason"].startswith("step 5 (object policy): agent/coder.d/policy has no rule")
    assert out["raised"] == ["CtxError", 13] and out["malformed"] == 22
    assert out["shared"] == [True, None, 0] and out["pure"] == [True, True, False]
    [event] = out["events"]
    assert (event["type"], event["agent"], event["session"], event["worker"]) == (
        "queue.claim", "builder", "worker", "w1",
    )  # fmt: skip
    worker = team.root / "shared/project-a/agent/builder/session/worker"
    assert (mode(worker), os.lstat(worker).st_gid, mode(worker / "events.jsonl")) == (
        0o3770, 2000, 0o660,
    )  # fmt: skip


# ------------------------------------------------------------------------ docs/policy.md

CLASS_NAMES = {
    "tool": "fs.read", "model": "openai/gpt-5.6", "shared": "p", "session": "s", "mount": "m",
    "agent": "a", "network": "default",
}  # fmt: skip
PERMISSIONS = {
    "tool": ["execute"], "model": ["use"], "shared": ["read", "write"],
    "session": ["read", "write", "resume"], "mount": ["read", "write"],
    "agent": ["create", "start", "stop", "read", "write"], "network": ["connect"],
}  # fmt: skip


def test_each_class_takes_exactly_the_permissions_of_the_table(tmp_path) -> None:
    """P-3, P-4, P-8 (docs/policy.md "Classes and permissions"): of every class with every
    permission, ``ctx policy check`` accepts exactly the table's pairs and reports each other
    one as ``EINVAL`` on its own line."""
    every = sorted({p for perms in PERMISSIONS.values() for p in perms})
    lines, valid = [], set()
    for cls, name in CLASS_NAMES.items():
        for perm in every:
            lines.append(f"allow x_t {cls}:{name} {perm}")
            if perm in PERMISSIONS[cls]:
                valid.add(len(lines))
    (tmp_path / "matrix").write_text("".join(f"{ln}\n" for ln in lines))
    r = ctx_run("policy", "check", "--json", "matrix", cwd=tmp_path)
    assert r.rc == 1, r
    [entry] = r.json()["files"]
    bad = {p["line"] for p in entry["problems"]}
    assert bad == set(range(1, len(lines) + 1)) - valid
    assert {p["error"] for p in entry["problems"]} == {"EINVAL"}
    assert len(r.err.splitlines()) == len(bad)


def test_the_language_rules_are_enforced_as_listed(tmp_path) -> None:
    """P-1, P-2, P-7, R-3 (docs/policy.md "The language"): blanks are spaces and tabs, comments
    (indented, in any language) are ignored, a subject type is at most 64 bytes, rules are
    printable ASCII, and there are no priorities, globs, variables, templates, ``.d`` names
    or models without a provider."""
    s64, s65 = "a" * 64, "a" * 65
    lines = {
        f"allow {s64} network:default connect": None,
        f"allow {s65} network:default connect": "is 65 bytes long; at most 64 are allowed",
        "allow\tx_t\ttool:fs.read\texecute": None,
        "  # política: comentario": None,
        "\t": None,
        "allow x_t tool:fs.read execute 10": "unexpected text after the permission",
        "allow x_t model:openai use": "a model name is <provider>/<model>",
        "allow x_t tool:fs.rea? execute": "globs are not supported (P-2)",
        "allow x_t tool:fs.[ab] execute": "globs are not supported (P-2)",
        "allow x_t agent:$X create": "variables are not supported (P-2)",
        "allow x_t agent:%{x} create": "variables are not supported (P-2)",
        "allow x_t agent:{name} create": "templates are not supported (P-2)",
        "allow x_t agent:<child> create": "templates are not supported (P-2)",
        "allow x_t tool:fs.d execute": "ends in '.d'",
        "allow x_t tool:-fs execute": "must start with a letter or digit",
        "allow x_t tool:fs.réad execute": "ASCII",
        "allow x_t tool:fs\x01 execute": "printable ASCII",
        "allow x_t tool:fs.read\x0bexecute": "printable ASCII",
        "allow x_t tool:fs.read execute\r": "carriage return",
        "allow Coder_t tool:fs.read execute": None,
    }
    (tmp_path / "lang").write_bytes("".join(f"{ln}\n" for ln in lines).encode())
    r = ctx_run("policy", "check", "lang", cwd=tmp_path)
    assert r.rc == 1 and r.out == "", r
    got = {int(ln.split(":")[1]): ln for ln in r.err.splitlines()}
    expected = {n: why for n, why in enumerate(lines.values(), 1) if why is not None}
    assert set(got) == set(expected), r.err
    for n, why in expected.items():
        assert got[n].startswith(f"lang:{n}: EINVAL: ") and why in got[n], got[n]
    # Case-sensitive subject types, no ordering: only the exact rule allows.
    (tmp_path / "p").write_text(
        "allow coder_t tool:fs.read execute\nallow coder_t tool:fs.read execute\n"
    )
    r = ctx_run("policy", "query", "--policy", "p", "Coder_t", "tool:fs.read", "execute",
                cwd=tmp_path)  # fmt: skip
    assert (r.rc, r.out) == (1, "deny\n"), r


def test_query_answers_and_refusals_are_those_of_the_commands_table(tmp_path) -> None:
    """P-6, P-8 (docs/policy.md "Commands"): ``query --json`` prints ``decision``, ``rule``,
    ``policies`` (``policy``, ``allows``); every policy must allow; ``-`` reads stdin, and a
    closed stdin is EBADF (check: ``-: EBADF: standard input is closed: …``, exit 1; query:
    exit 2 with the error object under ``--json``); a pipe that never ends is refused at
    once; an answer that cannot be written exits 74."""
    (tmp_path / "a").write_text("allow x_t tool:fs.read execute\n")
    (tmp_path / "e").write_text("# nothing\n")

    def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run([CTX, *argv], capture_output=True, text=True, cwd=tmp_path,
                              env=clean_env(), timeout=60, **kw)  # fmt: skip

    q = ["policy", "query", "--policy", "a"]
    done = run([*q, "--policy", "e", "x_t", "tool:fs.read", "execute", "--json"])
    assert done.returncode == 1 and json.loads(done.stdout) == {
        "decision": "deny", "rule": "allow x_t tool:fs.read execute",
        "policies": [{"policy": "a", "allows": True}, {"policy": "e", "allows": False}],
    }, done  # fmt: skip
    done = run(["policy", "query", "--policy", "-", "x_t", "tool:fs.read", "execute"],
               input="allow x_t tool:fs.read execute\n")  # fmt: skip
    assert (done.returncode, done.stdout) == (0, "allow\n"), done
    done = run(["policy", "check", "-"], stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done  # an empty policy is valid
    closed = {"stdin": None, "close_fds": True, "preexec_fn": lambda: os.close(0)}
    done = run(["policy", "check", "-"], **closed)
    assert done.returncode == 1 and done.stderr.startswith(
        "-: EBADF: standard input is closed: "
    ), done
    done = run(["policy", "query", "--policy", "-", "x_t", "tool:x", "execute", "--json"],
               **closed)  # fmt: skip
    assert done.returncode == 2 and json.loads(done.stdout)["error"] == "EBADF", done
    endless = subprocess.Popen(["yes", "allow a_t tool:x execute"], stdout=subprocess.PIPE)
    try:
        done = run(["policy", "check", "-"], stdin=endless.stdout)
    finally:
        endless.kill()
        endless.wait()
        endless.stdout.close()
    assert (done.returncode, done.stderr) == (
        1, "-: EINVAL: - holds more than 16777216 bytes, more than a policy may\n",
    ), done  # fmt: skip
    for argv in ([*q, "x_t", "tool:fs.read", "execute"], ["policy", "check", "--json", "a"]):
        with open("/dev/full", "w") as full:
            done = subprocess.run([CTX, *argv], stdout=full, stderr=subprocess.PIPE,
                                  text=True, cwd=tmp_path, env=clean_env(), timeout=60)  # fmt: skip
        assert done.returncode == 74, done
        assert done.stderr.startswith("ctx: ENOSPC: cannot write standard output"), done


def test_explain_exits_only_with_the_statuses_of_the_table(team: World) -> None:
    """P-8 (docs/policy.md "Commands": ``ctx policy explain`` | 0 allowed, 1 denied, 2
    malformed request, 74 when the answer cannot be written)."""
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [CTX, "policy", "explain", "coder", "tool:fs.stat", "execute"],
            stdout=full, stderr=subprocess.PIPE, text=True, env=team.env, timeout=60,
        )  # fmt: skip
    assert done.returncode == 74, (done.returncode, done.stderr)
    assert done.stderr.startswith("ctx: ENOSPC: cannot write standard output"), done


def test_explain_refuses_malformed_requests_and_network_has_no_file(team: World) -> None:
    """P-3, P-4, P-5 (docs/policy.md "Commands", step 2 table): an unknown class, a
    permission of another class, an illegal agent name, a session without ``--location``, a
    ``--location`` that is no tool's place and a bad ``--peer`` are EINVAL, exit 2 (the error
    object on stdout with ``--json``); ``network:default connect`` granted passes with steps 2,
    3 and 6 ``n/a``."""
    for args in (
        ("coder", "bogus:x", "read"),
        ("coder", "tool:fs.stat", "read"),
        ("a/b", "tool:fs.stat", "execute"),
        ("coder", "session:s1", "read"),
        ("coder", "tool:fs.stat", "execute", "--location", "/etc"),
        ("coder", "tool:fs.stat", "execute", "--peer", "abc"),
    ):
        r = team.ctx("policy", "explain", *args, "--json")
        assert r.rc == 2 and r.err.startswith("ctx: EINVAL: "), r
        assert r.json()["error"] == "EINVAL" and r.json()["errno"] == 22, r
    with open(team.root / "agent/coder.d/policy", "a") as f:
        f.write("allow coder_t network:default connect\n")
    r = team.ctx("policy", "explain", "coder", "network:default", "connect", "--json")
    report = r.json()
    assert r.rc == 0 and report["allowed"] is True, r
    assert [s["result"] for s in report["steps"]] == ["pass", "n/a", "n/a", "pass", "pass", "n/a"]
    r = team.ctx("policy", "explain", "coder", "session:s1", "read", "--location",
                 "home/1001/agent/coder/session")  # fmt: skip
    assert r.rc == 1 and r.lines()[-1].startswith("deny: ENOENT: step 2 (mode bits): "), r


def test_without_the_network_rule_a_tool_has_only_a_loopback_that_is_down(ci: World) -> None:
    """P-4 (docs/policy.md "Validity and decisions": without ``allow X network:default
    connect`` the agent's tools run in a network namespace of their own with nothing but a
    loopback that is down); with the rule they reach the host's network."""
    probe = (
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; "
        "python3 -c 'import socket; socket.socket().connect((\"127.0.0.1\", 9))' 2>&1 | tail -1"
    )

    def run() -> list[str]:
        r = ci.ctx(
            "run", "--native", "--agent", "ci", "shell.exec", input=json.dumps({"cmd": probe})
        )
        return json.loads(r.lines()[-1])["output"].splitlines()

    alone = run()
    assert alone[:-1] == ["lo"] and "Network is unreachable" in alone[-1], alone
    with open(ci.root / "agent/ci.d/policy", "a") as f:
        f.write("allow ci_t network:default connect\n")
    shared = run()
    assert len(shared) > 2 and "Network is unreachable" not in shared[-1], shared


def test_host_owned_controls_and_hooks_deny_at_the_steps_the_page_names(team: World) -> None:
    """P-5 steps 1, 2, 4, 6, P-6 (docs/policy.md "Host-owned controls", step 2): a tool of mode
    0750 root:root is EACCES at step 2 for ``explain`` and ``ctx run`` (126), never missing; a
    label, tool, tool policy or pre-hook of the agent's uid, a group-writable control or
    post-hook deny with the printed sentences; an agent-owned post-hook and the tool's ``log``
    do not; an agent of uid 0 is refused at step 1; a control that is a FIFO or a link is
    refused at once (EACCES)."""
    root = team.root

    def last(*args: str) -> str:
        r = team.ctx("policy", "explain", "coder", "tool:fs.stat", "execute", *args, timeout=30)
        assert r.rc in (0, 1), r
        return r.lines()[-1]

    tool = root / "tool/fs.stat"
    tool.chmod(0o750)
    assert last() == (
        "deny: EACCES: step 2 (mode bits): tool/fs.stat needs --x but mode 0750, owner 0:0 "
        "grants --- to uid 1001"
    )
    r = team.ctx("run", "--agent", "coder", "fs.stat", "/ctx")
    assert r.rc == 126 and r.err.startswith("ctx: EACCES: step 2 (mode bits): "), r
    tool.chmod(0o755)

    def owned(path: str, step: str) -> str:
        return (
            f"deny: EACCES: step {step}: {path} is not host-owned: {path} belongs to uid 1001, "
            "the agent's own, so the agent could rewrite it (give it to the host "
            "administrator, uid 0)"
        )

    for path, step in (
        ("tool/fs.stat", "6 (tool/model policy)"),
        ("tool/fs.stat.d/policy", "6 (tool/model policy)"),
        ("agent/coder.d/label", "4 (agent label)"),
    ):
        os.chown(root / path, 1001, -1)
        assert last() == owned(path, step)
        os.chown(root / path, 0, -1)
    os.chown(root / "tool/fs.stat.d/log", 1001, -1)
    assert last() == "allow"  # "not its log, a record the host appends to"
    os.chown(root / "tool/fs.stat.d/log", 0, -1)
    (root / "tool/fs.stat.d/schema").chmod(0o664)
    assert last().startswith(
        "deny: EACCES: step 6 (tool/model policy): tool/fs.stat.d/schema is not host-owned: "
        "tool/fs.stat.d/schema is writable by its group or by others (mode 0664); "
    )
    (root / "tool/fs.stat.d/schema").chmod(0o644)
    hook = root / "tool/fs.stat.d/hooks/pre.d/10-check"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    os.chown(hook, 1001, 1001)
    assert last() == owned("tool/fs.stat.d/hooks/pre.d/10-check", "6 (tool/model policy)")
    post = hook.rename(root / "tool/fs.stat.d/hooks/post.d/10-check")
    assert last() == "allow"  # the agent's own uid may own a post-hook
    post.chmod(0o777)
    assert "post.d/10-check is writable by its group or by others (mode 0777)" in last()
    post.unlink()

    identity = root / "agent/coder.d/identity"
    saved = identity.read_text()
    identity.write_text('{"uid": 0, "gid": 0, "groups": []}')
    assert last().startswith("deny: EACCES: step 1 (peer credentials): agent 'coder' has uid 0; ")
    identity.write_text(saved)
    label = root / "agent/coder.d/label"
    label.rename(team.scratch / "label")
    os.mkfifo(label)
    assert last() == (
        "deny: EACCES: step 4 (agent label): agent/coder.d/label cannot be read safely: a link "
        "or not a regular file"
    )
    label.unlink()
    label.symlink_to(team.scratch / "label")
    assert last().startswith("deny: EACCES: step 4 (agent label): agent/coder.d/label ")


def test_a_moved_root_and_an_older_space_are_named_with_their_remedy(team: World) -> None:
    """P-5 steps 3 and 6, X-1 (docs/policy.md "Mounts", "Host-owned controls"): a root copied
    elsewhere withholds the agent's ``/ctx`` mount (``the mount at /ctx names another storage
    root (OLD, not this root NEW)``, ``ctx agent show`` too); a space tool under a space of
    mode 2770 is refused naming ``ctx shared create <space> --group <gid>``."""
    moved = team.scratch / "moved"
    shutil.copytree(team.root, moved, symlinks=True)
    env = clean_env(CTX_STORAGE=str(moved))
    r = ctx_run("policy", "explain", "coder", "tool:fs.stat", "execute", env=env)
    assert r.rc == 1 and r.lines()[-1].startswith(
        "deny: EACCES: step 3 (mount visibility): tool/fs.stat is under none of the mounts of "
        f"agent 'coder': the mount at /ctx names another storage root ({team.root}, not this "
        f"root {moved}): "
    ), r
    assert "edit its source in agent/coder.d/mount, or create the agent again" in r.lines()[-1]
    r = ctx_run("agent", "show", "coder", env=env)
    assert f"withheld mount: {team.root} at /ctx: the mount at /ctx names another" in r.out, r

    src = team.scratch / "px"
    src.mkdir()
    (src / "x.sh").write_text('#!/bin/sh\necho "{}"\n')
    (src / "px.json").write_text(json.dumps({
        "manifest": 2, "kind": "tool", "name": "px", "description": "d",
        "schema": {"type": "object"}, "cap": {"side_effects": False, "network": False},
        "exec": "x.sh"}))  # fmt: skip
    assert team.ctx("object", "install", src / "px.json", "--tier", "shared:project-a").rc == 0
    for policy in ("agent/coder.d/policy", "shared/project-a/tool/px.d/policy"):
        with open(team.root / policy, "a") as f:
            f.write("allow coder_t tool:px execute\n")
    r = team.ctx("policy", "explain", "coder", "tool:px", "execute")
    assert r.rc == 0, r
    (team.root / "shared/project-a").chmod(0o2770)
    r = team.ctx("policy", "explain", "coder", "tool:px", "execute")
    assert r.rc == 1 and r.lines()[-1] == (
        "deny: EACCES: step 6 (tool/model policy): shared/project-a/tool/px.d/policy is not "
        "host-owned: shared/project-a is writable by its group or by others (mode 2770); the "
        "agent's controls, the tools it runs and their directories must be writable by their "
        "owner alone (a space an older ctx made; run 'ctx shared create project-a --group "
        "2000', which gives its directories this version's modes)"
    ), r


def test_controls_over_their_limit_are_refused_with_efbig(team: World) -> None:
    """P-5 (docs/policy.md "What the chain reads"): a policy over 16 MiB denies at step 5 with
    the printed EFBIG sentence and is the agent's problem in ``ctx agent list`` and ``show``;
    an identity over 1 MiB denies at step 1 with EFBIG; a tool's ``schema``, ``cap``,
    ``name`` or ``status`` over 1 MiB lists the tool ``damaged`` with the limit in its
    ``problems``."""
    root = team.root
    policy = root / "agent/coder.d/policy"
    saved = policy.read_bytes()
    os.truncate(policy, 17 << 20)
    sentence = (
        "agent/coder.d/policy holds more than 16777216 bytes, the limit of a policy, so it is "
        "not read; rewrite it"
    )
    r = team.ctx("policy", "explain", "coder", "tool:fs.stat", "execute")
    assert r.rc == 1 and r.lines()[-1] == f"deny: EFBIG: step 5 (object policy): {sentence}", r
    assert sentence in team.ctx("agent", "list").out
    assert f"problem: {sentence}" in team.ctx("agent", "show", "coder").out
    policy.write_bytes(saved)
    identity = root / "agent/coder.d/identity"
    saved = identity.read_bytes()
    os.truncate(identity, 2 << 20)
    r = team.ctx("policy", "explain", "coder", "tool:fs.stat", "execute")
    assert r.lines()[-1].startswith(
        "deny: EFBIG: step 1 (peer credentials): agent/coder.d/identity holds more than "
        "1048576 bytes"
    ), r
    identity.write_bytes(saved)

    for control in ("schema", "cap", "name", "status"):
        path = root / "tool/fs.stat.d" / control
        saved = path.read_bytes()
        os.truncate(path, 2 << 20)
        listing = {e["name"]: e for e in team.ctx("object", "list", "--json").json()}
        entry = listing["fs.stat"]
        assert entry["status"] == "damaged", (control, entry)
        assert any("1048576" in p for p in entry["problems"]), (control, entry)
        path.write_bytes(saved)


@pytest.mark.parametrize("control", ["description", "origin"])
def test_an_oversized_description_or_origin_lists_the_tool_damaged(
    team: World, control: str
) -> None:
    """P-5, T-1 (docs/policy.md "What the chain reads": any other control — a tool's
    ``name``, ``description``, …, ``origin`` — at most 1 MiB; a larger file is refused with
    ``EFBIG`` … ``ctx object list`` shows the tool ``damaged`` (with ``--json``, the same
    sentence in ``problems``))."""
    os.truncate(team.root / "tool/fs.stat.d" / control, 2 << 20)
    listing = {e["name"]: e for e in team.ctx("object", "list", "--json").json()}
    entry = listing["fs.stat"]
    assert entry["status"] == "damaged" and any("1048576" in p for p in entry["problems"]), entry


def test_model_objects_are_judged_at_steps_2_and_6(team: World) -> None:
    """P-3, P-5, P-6 (docs/policy.md step 2 table, "What the chain reads"): ``model:P/M use``
    needs ``model/P/M`` (ENOENT at step 2 without it) readable by the agent (``r``), and the
    model's own ``model/P/M.d/policy`` at step 6."""
    root = team.root
    with open(root / "agent/coder.d/policy", "a") as f:
        f.write("allow coder_t model:openai/gpt-5.6 use\n")

    def last() -> str:
        return team.ctx("policy", "explain", "coder", "model:openai/gpt-5.6", "use").lines()[-1]

    assert last() == (
        "deny: ENOENT: step 2 (mode bits): model/openai/gpt-5.6 does not exist: "
        "model/openai is missing"
    )
    (root / "model/openai/gpt-5.6.d").mkdir(parents=True)
    (root / "model/openai/gpt-5.6").write_text("")
    assert last() == (
        "deny: EACCES: step 6 (tool/model policy): no policy, so nothing is allowed "
        "(model/openai/gpt-5.6.d/policy is missing)"
    )
    (root / "model/openai/gpt-5.6.d/policy").write_text("allow coder_t model:openai/gpt-5.6 use\n")
    assert last() == "allow"
    (root / "model/openai/gpt-5.6").chmod(0o640)
    assert last() == (
        "deny: EACCES: step 2 (mode bits): model/openai/gpt-5.6 needs r-- but mode 0640, owner "
        "0:0 grants --- to uid 1001"
    )
