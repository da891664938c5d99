"""README.md taken literally by a new user: the main job of the quickstart (``./scripts/demo``
runs ``scripts/demo.py`` with the venv's python once the install is done), its summary held
against the queue it leaves, the queue in five commands as printed, what the README says about
errors, ``--json`` and exit statuses, and the development commands it names.

Only the place differs from the README: every storage root, HOME, TMPDIR and cache lies in a
scratch directory of this file (``CTX_STORAGE``, or HOME for the embedded default of an
ordinary user), so nothing outside it is touched.  The main job takes about twelve seconds as
written (twenty jobs of 0.4 s, most of them drained by one worker); it runs to its end once as
written.  One other run goes to its end with, once the demo has killed its worker, a few more
``ctx queue work --drain`` workers of the same agent on the same queue (SPEC W-3: several
workers may share a queue), stopped with SIGTERM (W-4) while the demo's own worker still has
jobs to run, so that it takes a few seconds and the demo's own steps and summary are unchanged.
The runs that show a defect are interrupted, as Ctrl-C does, once what they show is on disk."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    clean_env,
    new_scratch_dir,
    scratch_top,
    wait_for,
)
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the main job's agent runs as nobody or as the test user: root"
)

SCRATCH = scratch_top(__file__)
VENV = REPO / ".venv"
DEMO = REPO / "scripts" / "demo.py"
PROJECT = "demo"
AGENT = "demo-runner"
LABEL = "demo_runner_t"
DEMO_BOUND = 120.0  # seconds after which a hung demo is killed: only a hang reaches it
HEALTHY = "every published job finished exactly once"
HELPERS = 4
HELPERS_STOP_AT = 1  # pending jobs left to the demo's own worker when the extra ones stop


# ------------------------------------------------------------------------------ the demo


@dataclass
class DemoRun:
    """What one run of the main job printed, and where its queue is."""

    rc: int
    out: str
    err: str
    queue_dir: Path

    def __repr__(self) -> str:
        return f"demo exit {self.rc}\nstdout:\n{self.out}\nstderr:\n{self.err}"

    def summary(self) -> dict[str, int]:
        """The summary table: the first word of each row's label and its number."""
        block = self.out.split("\nsummary\n", 1)[1]
        rows = re.findall(r"^  (\S.*?)\s{2,}(\d+)$", block, flags=re.MULTILINE)
        return {label.split()[0]: int(value) for label, value in rows}

    def run_dir(self) -> str:
        """The directory this run kept its batch and its start log in (its publish line)."""
        match = re.search(r"--batch (.+)/jobs\.jsonl$", self.out, flags=re.MULTILINE)
        assert match, self
        return match.group(1)

    def requeued(self) -> list[str]:
        return re.findall(r"^  requeue\s+(\S+): ", self.out, flags=re.MULTILINE)

    def killed_pid(self) -> int:
        match = re.search(r"killed worker (\d+) during", self.out)
        assert match, self
        return int(match.group(1))


def pending_count(queue_dir: Path) -> int:
    try:
        return sum(1 for name in os.listdir(queue_dir / "pending") if not name.startswith("."))
    except FileNotFoundError:
        return 0


def hurry(env: dict[str, str], identity: dict, queue_dir: Path) -> None:
    """More workers of the demo's agent on its queue, stopped (SIGTERM lets each finish the
    job it runs, W-4) once only a few pending jobs are left to the demo's own worker."""
    argv = [*CTX_ARGV, "queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain"]
    helpers = [
        subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            **identity,
        )
        for _ in range(HELPERS)
    ]
    try:
        wait_for(
            lambda: (
                pending_count(queue_dir) <= HELPERS_STOP_AT
                or all(h.poll() is not None for h in helpers)
            ),
            seconds=60,
        )
        for helper in helpers:
            if helper.poll() is None:
                helper.send_signal(signal.SIGTERM)
        for helper in helpers:
            helper.wait(timeout=60)
    finally:
        for helper in helpers:
            if helper.poll() is None:
                helper.kill()
                helper.wait()


def run_demo(
    env: dict[str, str],
    cwd: Path,
    queue_dir: Path,
    user: UnprivilegedUser | None = None,
    helpers: bool = False,
    at_kill: Callable[[DemoRun], None] | None = None,
    interrupt: bool = False,
) -> DemoRun:
    """``scripts/demo.py`` run by the venv's python (what ``./scripts/demo`` execs after the
    install) in ``env`` and ``cwd``, as root or as ``user``.  Once it says it killed its
    worker: ``at_kill`` is given what it printed so far (the queue is as the kill left it: the
    demo waits for its other worker before it recovers), then with ``helpers`` see the module
    docstring, and with ``interrupt`` the run is interrupted as Ctrl-C does (SIGINT to its
    process group: its workers finish their job and stop).  Whatever is left of its process
    group afterwards is killed."""
    identity: dict = {}
    if user is not None:
        identity = {"user": user.uid, "group": user.gid, "extra_groups": []}
    err_path = cwd.parent / f"{cwd.name}.demo-stderr"
    with open(err_path, "w+") as err:
        proc = subprocess.Popen(
            [str(VENV / "bin" / "python"), "-u", str(DEMO)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env, cwd=cwd,
            text=True, start_new_session=True, **identity,
        )  # fmt: skip
        watchdog = threading.Timer(DEMO_BOUND, os.killpg, (proc.pid, signal.SIGKILL))
        watchdog.start()
        lines: list[str] = []
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if not line.startswith("  killed worker "):
                    continue
                if at_kill is not None:
                    at_kill(DemoRun(-1, "".join(lines), "", queue_dir))
                if interrupt:
                    os.killpg(proc.pid, signal.SIGINT)
                elif helpers:
                    hurry(env, identity, queue_dir)
            rc = proc.wait()
        finally:
            watchdog.cancel()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        err.seek(0)
        return DemoRun(rc, "".join(lines), err.read(), queue_dir)


@dataclass
class KilledJob:
    """The job the demo's killed worker held, as the kill left it."""

    name: str
    command: str
    started: bool  # whether its start was in the run's start log when the kill was reported


def killed_job(run: DemoRun) -> KilledJob:
    """The job whose lease names the killed worker, its command, and whether that command had
    recorded its start (its first step: ``echo N $(date …) >> …/starts.log``).  The demo's
    other worker keeps going meanwhile, so a lease directory may not hold its file yet."""
    lease_dir = run.queue_dir / "lease"
    for name in os.listdir(lease_dir):
        try:
            lease = json.loads((lease_dir / name / "worker").read_text())
        except FileNotFoundError:
            continue  # the demo's other worker is between its claim and its lease
        if lease.get("pid") == run.killed_pid():
            request = json.loads((run.queue_dir / "claimed" / name / name).read_text())
            command = request["input"]["cmd"]
            number = re.match(r"echo (\d+) ", command)
            log = Path(run.run_dir()) / "starts.log"
            started = [line.split()[0] for line in log.read_text().splitlines()]
            return KilledJob(name, command, bool(number) and number.group(1) in started)
    raise AssertionError(f"no lease names the killed worker\n{run}")


def jobs_of_run(queue_dir: Path, run_dir: str) -> dict[str, list[str]]:
    """Every job whose request's command names ``run_dir`` (the demo's jobs record their starts
    there), with each §2.1 state it has complete evidence of."""
    found: dict[str, list[str]] = {}

    def note(job: str, request: Path, state: str) -> None:
        cmd = json.loads(request.read_text()).get("input", {}).get("cmd", "")
        if run_dir in cmd:
            found.setdefault(job, []).append(state)

    for state in ("pending", "done", "failed"):
        for name in os.listdir(queue_dir / state):
            if name.endswith(".result") or name.startswith("."):
                continue
            if state == "pending" or (queue_dir / state / f"{name}.result").is_file():
                note(name, queue_dir / state / name, state)
    for name in os.listdir(queue_dir / "claimed"):
        if (queue_dir / "claimed" / name / name).is_file():
            note(name, queue_dir / "claimed" / name / name, "claimed")
    return found


def processes_with(variable: str, value: str) -> list[int]:
    """The pids of processes whose environment holds ``variable=value``."""
    wanted = f"{variable}={value}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in environ:
            pids.append(int(entry))
    return pids


def check_summary_against_the_queue(run: DemoRun, killed: KilledJob) -> None:
    """The summary's published, done, failed and lost against this run's jobs on disk; the one
    job recovery requeued is the killed worker's, done by another worker.  When the killed
    job's tool had started before the kill, it ran again: one re-run, and the demo ends
    healthy with exit 0.  (When it had not, see the test of a tool that starts late.)"""
    rows = run.summary()
    assert set(rows) == {"published", "done", "failed", "re-run", "executed", "lost"}, run
    mine = jobs_of_run(run.queue_dir, run.run_dir())
    assert len(mine) == rows["published"] > 0, (mine, run)
    states = sorted(s for found in mine.values() for s in found)
    assert all(len(found) == 1 for found in mine.values()), mine
    assert states.count("done") == rows["done"], (mine, run)
    assert states.count("failed") == rows["failed"], (mine, run)
    assert rows["lost"] == len(mine) - rows["done"] - rows["failed"] == 0, run
    assert rows["executed"] == 0, run
    assert run.requeued() == [killed.name], run
    assert mine.get(killed.name) == ["done"], (killed, mine)
    result = json.loads((run.queue_dir / "done" / f"{killed.name}.result").read_text())
    assert result["worker"]["pid"] != run.killed_pid(), result
    healthy = rows["re-run"] == 1
    if killed.started:
        assert healthy, run
    assert run.rc == (0 if healthy else 1), run
    assert run.out.rstrip().endswith(HEALTHY if healthy else "FAILED"), run


@pytest.fixture
def place() -> Iterator[Path]:
    """A scratch directory every uid may search, removed with all it holds afterwards."""
    made = new_scratch_dir(SCRATCH)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def roots_env(place: Path, storage: Path, tmpdir: Path) -> dict[str, str]:
    """Root's environment aimed at scratch: HOME, TMPDIR, the claim-order cache, the root."""
    for directory in (place / "home", place / "cache", tmpdir):
        directory.mkdir(parents=True, exist_ok=True)
    return clean_env(
        HOME=str(place / "home"),
        TMPDIR=str(tmpdir),
        XDG_CACHE_HOME=str(place / "cache"),
        CTX_STORAGE=str(storage),
    )


def ctx_as(env: dict[str, str], *args: str, input: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CTX_ARGV, *args], input=input, capture_output=True, text=True, env=env, timeout=60
    )


# ------------------------------------------------------------------------------ main job


def test_the_main_job_as_written_for_an_ordinary_user_on_the_default_root_below_a_spaced_home(
    place: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """README quickstart and R-1: for a user other than root with neither CTX_STORAGE nor
    XDG_DATA_HOME, the main job works on ``~/.local/share/cortexfs/storage/current``, here
    below a home whose name holds spaces.  Q-5, I-1, I-3, I-4, W-1: the summary (published,
    done, failed, re-run after recovery, executed after acknowledgement = 0, lost = 0) agrees
    with the queue on disk; the job recovery requeued is the killed worker's and ran again
    under another worker, a re-run the summary shows when its tool had started before the
    kill; the exit status and last line agree with the summary; the run leaves no process and
    no run directory behind, and every file it made in the home is the user's."""
    user = unprivileged_user
    home = place / "home of a user"
    tmpdir = place / "tmp"
    for directory in (home, tmpdir):
        directory.mkdir(mode=0o755)
        os.chown(directory, user.uid, user.gid)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(tmpdir), "LANG": "C.UTF-8"}
    root = home / ".local/share/cortexfs/storage/current"

    killed: list[KilledJob] = []
    queue_dir = root / "shared" / PROJECT / "queue"

    run = run_demo(env, home, queue_dir, user=user, at_kill=lambda so_far: killed.append(
        killed_job(so_far)))  # fmt: skip

    assert run.out.splitlines()[0] == f"CortexFS demo on storage root {root}", run
    check_summary_against_the_queue(run, killed[0])
    status = subprocess.run(
        [*CTX_ARGV, "queue", "status", "--project", PROJECT, "--json"],
        capture_output=True, text=True, env=env, user=user.uid, group=user.gid,
        extra_groups=[], timeout=60,
    )  # fmt: skip
    assert status.returncode == 0, status
    counts = json.loads(status.stdout)["counts"]
    unsettled = ("pending", "claimed", "incomplete", "conflict")
    assert {key: counts[key] for key in unsettled} == dict.fromkeys(unsettled, 0), counts
    assert wait_for(lambda: not processes_with("HOME", str(home)), seconds=30)
    assert os.listdir(tmpdir) == [f"cortexfs-demo-{user.uid}"]
    assert os.listdir(tmpdir / f"cortexfs-demo-{user.uid}") == [], "the run directory stayed"
    assert all(p.owner() == user.name for p in home.rglob("*")), "a file not the user's"


@contextlib.contextmanager
def demo_running(env: dict[str, str], cwd: Path) -> Iterator[subprocess.Popen]:
    """``scripts/demo.py`` running in the background until the block ends, then interrupted
    as Ctrl-C does (SIGINT to its process group: its workers finish their job and stop), and
    whatever is left of the group killed."""
    proc = subprocess.Popen(
        [str(VENV / "bin" / "python"), "-u", str(DEMO)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=env, cwd=cwd, start_new_session=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_main_job_with_a_space_in_tmpdir_records_its_job_starts(place: Path) -> None:
    """README quickstart: the main job for a user whose TMPDIR holds a space (the demo keeps
    its run directory, with the log where each job records its start, there).  The summary's
    "re-run after recovery" and "executed after acknowledgement" rows come from that log (Q-5,
    I-3): each finished job must have recorded its start there, its command running cleanly.
    The run is stopped, as Ctrl-C does, once its first jobs have finished."""
    storage = place / "storage"
    tmpdir = place / "temporary files"
    env = roots_env(place, storage, tmpdir)
    done = storage / "shared" / PROJECT / "queue" / "done"

    with demo_running(env, place / "home"):
        assert wait_for(lambda: done.is_dir() and any(done.glob("*.result")), seconds=60)
        results = [json.loads(path.read_text()) for path in done.glob("*.result")]
        [run_dir] = (tmpdir / f"cortexfs-demo-{os.geteuid()}").glob("run-*")
        starts = (run_dir / "starts.log").read_text().splitlines()

    assert all(result["stderr"] == "" for result in results), results
    assert len(starts) >= len(results) > 0, (starts, results)


def test_the_main_job_again_as_root_on_a_spaced_root_an_earlier_run_left(place: Path) -> None:
    """README quickstart (``$CTX_STORAGE`` if set), run on a root whose path holds spaces and
    where an earlier run left its agent, the tool policy's grant and a queue ``demo`` holding a
    finished job: the demo reuses the agent and the grant (P-6: the rule once, not twice),
    leaves the earlier job as it was (Q-6), and its summary agrees with the queue."""
    storage = place / "storage root with spaces" / "current"
    tmpdir = place / "tmp"
    env = roots_env(place, storage, tmpdir)
    base = tmpdir / f"cortexfs-demo-{os.geteuid()}"
    base.mkdir(mode=0o755)
    earlier_request = {
        "name": AGENT,
        "label": LABEL,
        "model": [],
        "tools": ["shell.exec"],
        "shared": {PROJECT: ["read", "write"]},
        "mount": [[str(base), str(base), "rw"]],
    }
    assert ctx_as(env, "bootstrap").returncode == 0
    made = ctx_as(env, "agent", "create", "-", input=json.dumps(earlier_request))
    assert made.returncode == 0, made.stderr
    policy = storage / "tool" / "shell.exec.d" / "policy"
    with policy.open("a") as handle:
        handle.write(f"allow {LABEL} tool:shell.exec execute\n")
    assert ctx_as(env, "queue", "init", "--project", PROJECT).returncode == 0
    earlier = json.dumps({"tool": "shell.exec", "input": {"cmd": "echo earlier"}})
    job = ctx_as(env, "queue", "publish", "--project", PROJECT, "-", input=earlier).stdout.strip()
    assert ctx_as(env, "queue", "claim", "--project", PROJECT).stdout.strip() == job
    finished = ctx_as(env, "queue", "finish", "--project", PROJECT, job, "--ok", "-", input="{}")
    assert finished.returncode == 0, finished.stderr
    queue_dir = storage / "shared" / PROJECT / "queue"
    earlier_result = (queue_dir / "done" / f"{job}.result").read_bytes()

    killed: list[KilledJob] = []

    run = run_demo(env, place / "home", queue_dir, helpers=True, at_kill=lambda so_far:
                   killed.append(killed_job(so_far)))  # fmt: skip

    assert run.out.splitlines()[0] == f"CortexFS demo on storage root {storage}", run
    assert "agent create" not in run.out and "rm -r" not in run.out, run
    assert policy.read_text().splitlines().count(f"allow {LABEL} tool:shell.exec execute") == 1
    assert (queue_dir / "done" / f"{job}.result").read_bytes() == earlier_result
    assert (queue_dir / "done" / job).is_file()
    check_summary_against_the_queue(run, killed[0])
    assert os.listdir(base) == [], "the run directory stayed"
    assert wait_for(lambda: not processes_with("HOME", str(place / "home")), seconds=30)


def test_the_main_job_kills_its_worker_while_the_tool_runs_when_the_tool_starts_late(
    place: Path,
) -> None:
    """README quickstart: the main job kills one worker "with SIGKILL while its tool runs",
    which is what makes the killed job's recovery (Q-5) a re-run the summary can show.  Here
    an administrator's pre-hook of shell.exec (T-6) takes 0.3 s before each call, as a busy
    machine may take as long to start the tool: the job the worker held when it was killed
    must have started.  Stopped, as Ctrl-C does, after the kill."""
    storage = place / "storage"
    env = roots_env(place, storage, place / "tmp")
    assert ctx_as(env, "bootstrap").returncode == 0
    pre = storage / "tool" / "shell.exec.d" / "hooks" / "pre.d"
    pre.mkdir(parents=True, exist_ok=True)
    (pre / "10-slow").write_text("#!/bin/sh\ncat >/dev/null\nsleep 0.3\n")
    (pre / "10-slow").chmod(0o755)
    queue_dir = storage / "shared" / PROJECT / "queue"
    killed: list[KilledJob] = []

    run = run_demo(env, place / "home", queue_dir, interrupt=True, at_kill=lambda so_far:
                   killed.append(killed_job(so_far)))  # fmt: skip

    assert killed, run
    assert killed[0].started, (killed[0], run)


def test_the_main_job_after_an_earlier_run_left_jobs_pending_kills_one_of_its_own(
    place: Path,
) -> None:
    """README quickstart: the main job "publishes a batch of shell.exec jobs, runs two real
    workers, kills one with SIGKILL while its tool runs, runs ``ctx queue recover``" and
    reports that job's re-run (Q-5).  A run that was interrupted (Ctrl-C stops the workers
    after their current job) leaves its jobs pending in queue ``demo``; the next run's workers
    take those first (Q-9: oldest first), and the job they hold when one is killed must still
    be one of the batch the summary reports on.  Stopped, as Ctrl-C does, after the kill."""
    storage = place / "storage"
    env = roots_env(place, storage, place / "tmp")
    assert ctx_as(env, "bootstrap").returncode == 0
    assert ctx_as(env, "queue", "init", "--project", PROJECT).returncode == 0
    left = "".join(
        json.dumps({"tool": "shell.exec", "input": {"cmd": f"sleep 0.4; echo left {n}"}}) + "\n"
        for n in range(8)
    )
    published = ctx_as(env, "queue", "publish", "--project", PROJECT, "--batch", "-", input=left)
    assert published.returncode == 0, published.stderr
    queue_dir = storage / "shared" / PROJECT / "queue"
    killed: list[KilledJob] = []

    run = run_demo(env, place / "home", queue_dir, interrupt=True, at_kill=lambda so_far:
                   killed.append(killed_job(so_far)))  # fmt: skip

    assert killed, run
    assert killed[0].name not in published.stdout.split(), (killed[0], run)
    assert run.run_dir() in killed[0].command, (killed[0], run)


# ------------------------------------------------------------------------------ the queue


def test_the_queue_in_five_commands_as_printed(place: Path) -> None:
    """README "The queue in five commands", run by bash as printed, with the README's request
    (§2.4, Q-1..Q-5): publish prints J alone, the claim in ``$(...)`` prints the same J and
    leases it to the shell (its parent), finish makes the terminal pair with result.json as
    output, recover finds the queue consistent, and a claim of the empty queue exits 3 with
    nothing on stdout."""
    storage = place / "storage"
    env = {**roots_env(place, storage, place / "tmp"), "PATH": f"{VENV / 'bin'}:/usr/bin:/bin"}
    (place / "request.json").write_text('{"tool": "fs.stat", "input": {"path": "/"}}\n')
    (place / "result.json").write_text('{"size": 4096}\n')
    script = """
ctx queue init    --project build
echo "init=$?"
ctx queue publish --project build request.json          # prints the job name J
echo "publish=$?"
J=$(ctx queue claim --project build)                    # exit 3 when there is nothing to claim
echo "claim=$? J=$J shell=$$"
cat "$CTX_STORAGE/shared/build/queue/lease/$J/worker"
ctx queue finish  --project build "$J" --ok result.json
echo "finish=$?"
ctx queue recover --project build                       # after a crash: requeue abandoned jobs
echo "recover=$?"
ctx queue claim --project build
echo "empty=$?"
"""
    ran = subprocess.run(
        ["bash", "-c", script], cwd=place, env=env, capture_output=True, text=True, timeout=60
    )

    lines = ran.stdout.splitlines()
    assert lines[1] == "init=0", ran
    job, published = lines[2], lines[3]
    assert published == "publish=0" and job.endswith(".req.json"), ran
    claim = re.fullmatch(r"claim=(\d+) J=(\S*) shell=(\d+)", lines[4])
    assert claim and claim.group(1) == "0" and claim.group(2) == job, ran
    assert json.loads(lines[5])["pid"] == int(claim.group(3)), ran
    assert lines[6:8] == [job, "finish=0"], ran
    assert lines[8].endswith("queue consistent") and lines[9] == "recover=0", ran
    assert lines[10:] == ["empty=3"], ran
    queue_dir = storage / "shared" / "build" / "queue"
    request = json.loads((queue_dir / "done" / job).read_text())
    assert (request["tool"], request["input"]) == ("fs.stat", {"path": "/"})
    assert json.loads((queue_dir / "done" / f"{job}.result").read_text())["output"] == {
        "size": 4096
    }
    assert not os.listdir(queue_dir / "pending") and not os.listdir(queue_dir / "claimed")


def test_errors_json_and_exit_statuses_as_the_readme_describes(place: Path) -> None:
    """README: queue commands take ``--storage DIR`` and ``--json``; errors read
    ``ctx: ERRNO: what to do`` on stderr and, with ``--json``, are also one object
    ``{"error", "errno", "message"}`` on stdout, usage errors included (exit 2), refusals
    exit 1; 74 when the output cannot be written (``> /dev/full``), saying what the command
    had done — the job stays published and pending (Q-1)."""
    storage = place / "storage"
    env = clean_env(HOME=str(place), XDG_CACHE_HOME=str(place))
    made = ctx_as(env, "queue", "init", "--storage", str(storage), "--project", "build")
    assert made.returncode == 0, made.stderr

    usage = ctx_as(env, "queue", "publish", "--storage", str(storage), "--project", "build",
                   "--json")  # fmt: skip
    assert usage.returncode == 2, usage
    error = json.loads(usage.stdout)
    assert (error["error"], error["errno"], type(error["message"])) == ("EINVAL", 22, str)
    assert re.search(r"^ctx: EINVAL: ", usage.stderr, flags=re.MULTILINE), usage.stderr

    refused = ctx_as(env, "queue", "status", "--storage", str(storage), "--project", "nope",
                     "--json")  # fmt: skip
    assert refused.returncode == 1, refused
    error = json.loads(refused.stdout)
    assert re.fullmatch(r"E[A-Z]+", error["error"]) and isinstance(error["errno"], int), error
    assert f"ctx: {error['error']}: " in refused.stderr, refused.stderr

    request = '{"tool": "fs.stat", "input": {"path": "/"}}'
    with open("/dev/full", "w") as full:
        lost = subprocess.run(
            [*CTX_ARGV, "queue", "publish", "--storage", str(storage), "--project", "build", "-"],
            input=request, stdout=full, stderr=subprocess.PIPE, text=True, env=env, timeout=60,
        )  # fmt: skip
    assert lost.returncode == 74, lost.stderr
    pending = os.listdir(storage / "shared" / "build" / "queue" / "pending")
    assert len(pending) == 1 and pending[0] in lost.stderr, (pending, lost.stderr)
    assert lost.stderr.startswith("ctx: ENOSPC: "), lost.stderr


# ------------------------------------------------------------------------------ development


def test_the_development_commands_and_layout_the_readme_names() -> None:
    """README "After an install", "Layout" and "Development": ``. .venv/bin/activate`` puts
    ``ctx`` on PATH, the venv is made from the system's /usr/bin/python3, the layout's
    directories and the linked documents exist, and the make targets run what the README
    says (``make -n`` only: lint is ruff check plus ruff format --check, demo and test are
    the two quickstart scripts, soak is the slow tests, crash tests/crash, bench the
    benchmarks); the CI entry point is the README's test command."""
    activated = subprocess.run(
        ["bash", "-c", ". .venv/bin/activate && command -v ctx ctxmcp"],
        cwd=REPO, capture_output=True, text=True, env=clean_env(), timeout=30,
    )  # fmt: skip
    assert activated.stdout.split() == [str(VENV / "bin/ctx"), str(VENV / "bin/ctxmcp")]
    config = dict(
        line.split(" = ", 1) for line in (VENV / "pyvenv.cfg").read_text().splitlines() if line
    )
    assert os.path.realpath(config["executable"]) == os.path.realpath("/usr/bin/python3")

    for path in ("cortexfs/errors.py", "cortexfs/names.py", "cortexfs/durable.py",
                 "cortexfs/storage.py", "workers/README.md", "tests/crash", "bench",
                 "scripts/install", "scripts/demo", "scripts/test", "docs/spec"):  # fmt: skip
        assert (REPO / path).exists(), path
    for package in ("queue", "worker", "policy", "tools", "shared", "agents", "manual", "mcp",
                    "fuse", "cli"):  # fmt: skip
        assert (REPO / "cortexfs" / package).is_dir(), package
    readme = (REPO / "README.md").read_text()
    for link in re.findall(r"\]\(([^)#]+)\)", readme):
        assert (REPO / link).exists(), link
    for script in ("scripts/demo", "scripts/test", "scripts/install", ".ci/run"):
        assert os.access(REPO / script, os.X_OK), script

    # As a user's shell runs make, not as a make that runs these tests (make flows) would:
    # its MAKELEVEL and MAKEFLAGS make a make below it print the directory it enters.
    outside_make = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS")}

    def planned(target: str) -> list[str]:
        done = subprocess.run(
            ["make", "-n", target], cwd=REPO, capture_output=True, text=True, timeout=30,
            env=outside_make,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    assert planned("lint") == [".venv/bin/ruff check .", ".venv/bin/ruff format --check ."]
    assert planned("demo") == ["./scripts/demo"]
    assert planned("test") == ["./scripts/test"]
    assert any(re.search(r"pytest -m slow\b", line) for line in planned("soak"))
    assert any("pytest tests/crash" in line for line in planned("crash"))
    assert sum(line.startswith(".venv/bin/python bench/") for line in planned("bench")) >= 1
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^exec \./scripts/test$", ci, flags=re.MULTILINE), ci
    demo = (REPO / "scripts" / "demo").read_text()
    assert "./scripts/install" in demo and "scripts/demo.py" in demo, demo
