"""An operator's bad day with a multi-agent project (SPEC §1 R-1 … R-5, §2 Q-1 … Q-10, I-1 …
I-5, §2.4, §3 W-1 … W-4), seen only through what SPEC and docs/queue.md promise: the storage
root's filesystem running out of inodes at every level while claims, finishes, publishes and
recovers go on; the root turned read-only under a worker in the middle of a job; a worker
fleet SIGKILLed again and again while two operators run ``recover`` in loops; ``ctx
bootstrap`` repairing a damaged root while workers drain; a queue copied with ``cp -a`` to a
new root while its workers still run; and a project with 50 000 finished jobs.  Every refusal
is an errno-style line with the exit status of §2.4, nothing acknowledged is lost, nothing
finished runs again, and once the trouble is gone ``recover --reconcile`` finds the queue
consistent."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, QueueCLI, Run, clean_env, ctx_run, wait_for
from tests.acceptance.workercli import (
    AGENT,
    allow_in_tool_policy,
    make_agent,
    shell_job,
    start_worker,
)

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="mounts filesystems and runs agents as another uid: needs root"
)

SCRATCH = Path("/tmp") / Path(__file__).stem
STAT_JOB = {"tool": "fs.stat", "input": {"path": "/ctx"}}
TRACEBACK = "Traceback (most recent call last)"

# ------------------------------------------------------------------------------ helpers


@contextlib.contextmanager
def place() -> Iterator[Path]:
    """A fresh directory below the file's scratch directory, every uid may search it."""
    SCRATCH.mkdir(mode=0o755, exist_ok=True)
    SCRATCH.chmod(0o755)
    where = Path(tempfile.mkdtemp(prefix="t", dir=SCRATCH))
    where.chmod(0o755)
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)


@contextlib.contextmanager
def tmpfs(options: str) -> Iterator[Path]:
    """A tmpfs mounted with ``options`` (``size=…,nr_inodes=…``) for the block."""
    with place() as where:
        disk = where / "disk"
        disk.mkdir()
        mount = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(disk)]
        if subprocess.run(mount, capture_output=True).returncode != 0:
            pytest.skip("cannot mount a tmpfs here")
        try:
            disk.chmod(0o755)
            yield disk
        finally:
            subprocess.run(["umount", "-l", str(disk)], check=False)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` turned read-only in place (a bind mount on itself, remounted ``ro``), as an
    administrator freezes a filesystem under running processes; made writable again after."""
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def ctx(root: Path, *args, input: str | bytes | None = None, timeout: float = 60) -> Run:
    return ctx_run(*args, input=input, env=clean_env(CTX_STORAGE=str(root)), timeout=timeout)


def make_world(top: Path, tools: list[str]) -> Path:
    """A bootstrapped root ``top/st``: agent ``ci`` (uid nobody) allowed ``tools`` by both
    policies (P-6), and the queue of project ``proj``."""
    root = top / "st"
    assert ctx(root, "bootstrap").rc == 0
    make_agent(root, tools)
    for tool in tools:
        allow_in_tool_policy(root, tool)
    assert ctx(root, "queue", "init", "--project", "proj").rc == 0
    return root


def use_inodes(disk: Path, leave: int) -> Path:
    """Create empty files in ``disk/fill`` until no inode is left, then give ``leave`` back."""
    where = disk / "fill"
    where.mkdir()
    made = 0
    while True:
        try:
            os.close(os.open(where / str(made), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except OSError:
            break
        made += 1
    for n in range(made - leave, made):
        os.unlink(where / str(n))
    assert os.statvfs(disk).f_favail == leave
    return where


def refused(run: Run, errno: str) -> bool:
    """Whether ``run`` was refused with ``ctx: ERRNO: …`` and exit 1 (no traceback, nothing
    on stdout); a success gives False; anything else fails the test."""
    assert TRACEBACK not in run.err, run
    if run.rc == 0:
        return False
    assert (run.rc, run.out) == (1, ""), run
    assert run.err.startswith(f"ctx: {errno}: "), run
    return True


def assert_consistent(queue: QueueCLI, expected: dict[str, str]) -> None:
    """Exactly the jobs of ``expected`` are on disk, each in its one state, ``inbox/`` is
    empty, ``status --json`` counts them so, and ``recover --reconcile`` calls it consistent."""
    assert queue.requests() == {job: [state] for job, state in expected.items()}
    for job, state in expected.items():
        assert queue.state(job) == state, (job, state)
    assert queue.entries("inbox") == set()
    status = queue.run("status", "--json")
    assert status.rc == 0, status
    counts = status.json()["counts"]
    for state in ("pending", "claimed", "done", "failed"):
        assert counts[state] == list(expected.values()).count(state), (state, counts)
    assert (counts["incomplete"], counts["conflict"]) == (0, 0), counts
    recovered = queue.run("recover", "--reconcile", "--json")
    assert recovered.rc == 0 and recovered.json()["consistent"] is True, recovered


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


# ------------------------------------------------------------------------------ inodes


@needs_root
def test_inodes_running_out_at_every_level_refuse_whole_steps_and_lose_nothing(child):
    """Q-1, Q-2, Q-3, Q-4, Q-5, I-1, I-2, §2.4: with 0, 1, 2 and 3 inodes left on the root's
    filesystem (bytes to spare), a claim, the finish of a live holder's job, a publish and a
    ``recover --reconcile`` each either succeed or are refused (exit 1, ENOSPC, nothing on
    stdout) saying what was not done; a refused claim leaves its job pending, a refused finish
    leaves it claimed with no result, recover never fails for want of inodes; with the inodes
    back the queue holds exactly the jobs acknowledged, in the states acknowledged."""
    with tmpfs("size=16m,nr_inodes=1500") as disk:
        root = make_world(disk, ["fs.stat"])
        queue = QueueCLI(root, "proj")
        pid = str(child.pid)
        expected: dict[str, str] = {}
        outcomes: set[tuple[str, bool]] = set()
        for leave in range(4):
            for _ in range(2):
                expected[queue.publish(STAT_JOB)] = "pending"
            held = queue.claim("--pid", pid)
            expected[held] = "claimed"
            fill = use_inodes(disk, leave)
            pending = {j for j, s in expected.items() if s == "pending"}

            claim = queue.run("claim", "--pid", pid)
            finish = queue.run("finish", held, "--ok", "-", input='{"n": 1}')
            publish = queue.run("publish", "-", input=json.dumps(STAT_JOB))
            recover = queue.run("recover", "--reconcile", "--json")
            shutil.rmtree(fill)

            if refused(claim, "ENOSPC"):
                assert "refused: No space left on device" in claim.err, claim
                said = claim.err.split("nothing was claimed (job ")[1].split(" stays pending)")[0]
                assert said in pending, (leave, claim)
            else:
                assert claim.out.strip() in pending, (leave, claim)
                expected[claim.out.strip()] = "claimed"
            outcomes.add(("claim", claim.rc == 0))
            if refused(finish, "ENOSPC"):
                assert f"job {held} stays claimed and no result of it was written" in finish.err
            else:
                expected[held] = "done"
            outcomes.add(("finish", finish.rc == 0))
            if refused(publish, "ENOSPC"):
                assert "nothing was published" in publish.err, publish
            else:
                expected[publish.out.strip()] = "pending"
            outcomes.add(("publish", publish.rc == 0))
            report = recover.json()
            assert recover.rc == 0 and report["consistent"] is True, (leave, recover)
            assert report["errors"] == report["requeued"] == report["repaired"] == [], report
            assert queue.requests() == {j: [s] for j, s in expected.items()}, leave
            assert queue.entries("inbox") == set(), leave
        # Every step was refused at some level and went through at another.
        assert len(outcomes) == 6, outcomes
        assert_consistent(queue, expected)


@needs_root
def test_a_claim_refused_for_want_of_an_inode_for_its_lease_says_to_free_inodes(child):
    """Q-3, docs/queue.md (a full disk): a claim whose ``mkdir lease/J`` finds no inode left
    (bytes to spare) is refused with ENOSPC, its job pending first in line, and, since the
    inodes ran out and bytes are left, tells the operator to free inodes (deleting a big file
    would not help)."""
    with tmpfs("size=16m,nr_inodes=1500") as disk:
        root = make_world(disk, ["fs.stat"])
        queue = QueueCLI(root, "proj")
        job = queue.publish(STAT_JOB, name="j0")
        use_inodes(disk, 2)  # claimed/J and the lease's temp file; none for lease/J
        claim = queue.run("claim", "--pid", str(child.pid))
        assert refused(claim, "ENOSPC"), claim
        assert f"{queue.dir}/lease refused: No space left on device" in claim.err, claim
        assert f"nothing was claimed (job {job} stays pending)" in claim.err, claim
        assert queue.state(job) == "pending"
        assert "free inodes on that filesystem" in claim.err, claim


# ------------------------------------------------------------------------------ read-only


@needs_root
def test_a_root_turned_read_only_under_a_running_worker_loses_and_reruns_nothing_finished(
    outbox,
):
    """W-1, W-4, Q-4, Q-5, I-1, I-3, §2.4: while ``ctx queue work --drain`` runs its second
    job the root is made read-only: the worker stops with EROFS (exit 1, no traceback) naming
    the job, which stays claimed without a result; ``status``, ``list`` and ``show`` still
    answer (``--json`` one document each); ``recover`` says EROFS for it and leaves it as it
    is; writable again, recover requeues it, a second drain finishes the rest, and the job
    finished before the freeze never runs again."""
    with place() as where:
        root = make_world(where, ["shell.exec"])
        queue = QueueCLI(root, "proj")
        names = ("a0", "a1", "a2")
        cmds = {
            "a0": f"echo run >> {outbox}/a0",
            "a1": f"echo run >> {outbox}/a1; touch {outbox}/a1-started; sleep 1.5",
            "a2": f"echo run >> {outbox}/a2",
        }
        jobs = {n: queue.publish(shell_job(cmds[n]), name=n) for n in names}
        proc = start_worker(queue, "--drain")
        try:
            assert wait_for(lambda: (outbox / "a1-started").exists(), 20), "a1 never started"
            with read_only(root):
                out, err = proc.communicate(timeout=30)
                stopped = Run(["queue", "work"], proc.returncode, out, err)
                status = queue.run("status", "--json")
                listed = queue.run("list", "--json")
                shown = queue.run("show", jobs["a1"], "--json")
                recover = queue.run("recover", "--json")
        finally:
            stop(proc)

        assert stopped.rc == 1 and TRACEBACK not in stopped.err, stopped
        assert "ctx: EROFS: " in stopped.err and jobs["a1"] in stopped.err, stopped
        assert f"no result of {jobs['a1']} was written" in stopped.err, stopped
        assert (
            "read-write" in stopped.err and "'ctx queue recover --project proj'" in stopped.err
        ), stopped
        for answered in (status, listed, shown):
            assert answered.rc == 0 and answered.json(), answered
        counts = status.json()["counts"]
        assert (counts["done"], counts["claimed"], counts["pending"]) == (1, 1, 1), counts
        assert shown.json()["state"] == "claimed", shown
        assert shown.json()["holder"]["state"] == "gone", shown
        assert recover.rc == 1, recover
        errors = recover.json()["errors"]
        assert [(e["job"], e["error"]) for e in errors] == [(jobs["a1"], "EROFS")], recover
        assert "left as it is" in errors[0]["detail"], errors
        assert queue.state(jobs["a1"]) == "claimed"
        assert not (queue.dir / "done" / f"{jobs['a1']}.result").exists()

        requeued = queue.run("recover", "--json")
        assert requeued.rc == 0, requeued
        assert [r["job"] for r in requeued.json()["requeued"]] == [jobs["a1"]], requeued
        drained = ctx(root, "queue", "work", "--project", "proj", "--agent", AGENT, "--drain")
        assert drained.rc == 0 and TRACEBACK not in drained.err, drained
        assert_consistent(queue, dict.fromkeys(jobs.values(), "done"))
        runs = {n: (outbox / n).read_text().count("run") for n in names}
        assert runs == {"a0": 1, "a1": 2, "a2": 1}, runs


# ------------------------------------------------------------------------------ kill, recover


def traced_job(outbox: Path, name: str) -> dict:
    """A job that notes the start and the end of each run under a token of its own, and
    answers the token."""
    log = outbox / name
    return shell_job(
        f'T=$$-$(date +%s%N); echo "s $T" >> {log}; sleep 0.25; echo "e $T" >> {log}; echo "$T"'
    )


def lease_pid(queue: QueueCLI, job: str) -> int | None:
    """The pid ``job``'s lease names, or None while it has no readable lease."""
    try:
        return json.loads((queue.dir / "lease" / job / "worker").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def recover_loop(queue: QueueCLI, args: tuple[str, ...], until: threading.Event, runs: list):
    while not until.is_set():
        runs.append(queue.run("recover", *args, "--json"))


@pytest.mark.slow
@needs_root
def test_a_fleet_killed_again_and_again_while_two_operators_recover_in_loops(outbox):
    """W-3, I-3, I-4, I-5, Q-5, Q-6, §2.4: three workers are SIGKILLed one after another and
    restarted for seconds while one operator runs ``recover`` and another ``recover
    --reconcile`` in loops: no recover reports an error or a conflict, each exits 0 or (an
    incomplete pair left by a kill) 1 with the pair listed, and prints one JSON document;
    every job ends in ``done/`` once, its result is that of its last run, which ran to its
    end, and no two runs of one job ever overlap."""
    with place() as where:
        root = make_world(where, ["shell.exec"])
        queue = QueueCLI(root, "proj")
        names = [f"k{n:02d}" for n in range(24)]
        jobs = {queue.publish(traced_job(outbox, n), name=n): n for n in names}
        workers = [start_worker(queue) for _ in range(3)]
        until = threading.Event()
        plain: list[Run] = []
        reconciling: list[Run] = []
        loops = [
            threading.Thread(target=recover_loop, args=(queue, (), until, plain)),
            threading.Thread(
                target=recover_loop, args=(queue, ("--reconcile",), until, reconciling)
            ),
        ]
        for loop in loops:
            loop.start()
        kills = 0
        try:
            chance = random.Random(7)
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                time.sleep(chance.uniform(0.2, 0.45))
                holders = {pid for pid in (lease_pid(queue, j) for j in jobs) if pid}
                busy = [n for n, proc in enumerate(workers) if proc.pid in holders]
                n = chance.choice(busy) if busy else chance.randrange(len(workers))
                workers[n].send_signal(signal.SIGKILL)
                workers[n].communicate()
                kills += 1
                workers[n] = start_worker(queue)
            finished = lambda: all(queue.state(j) == "done" for j in jobs)  # noqa: E731
            assert wait_for(finished, 60), [
                queue.run("show", j).out for j in jobs if queue.state(j) != "done"
            ]
        finally:
            until.set()
            for loop in loops:
                loop.join()
            for proc in workers:
                proc.send_signal(signal.SIGTERM)
            ended = [proc.communicate(timeout=30) for proc in workers]
            for proc in workers:
                stop(proc)

        assert kills >= 8, kills
        assert [proc.returncode for proc in workers] == [0, 0, 0], ended
        assert len(plain) > 3 and len(reconciling) > 3, (len(plain), len(reconciling))
        for run in plain + reconciling:
            assert TRACEBACK not in run.err, run
            report = run.json()
            assert report["errors"] == report["conflicts"] == [], run
            assert run.rc in (0, 1), run
            assert (run.rc == 1) == bool(report["incomplete"]), run
        # A worker killed while it wrote a lease leaves its temp file: stray, removed once the
        # grace is over (here at once, every worker being gone).
        swept = queue.run("recover", "--reconcile", "--grace", "0", "--json")
        assert swept.rc == 0 and swept.json()["consistent"] is True, swept
        for temp in swept.json()["removed_temps"]:
            assert ".lease." in str(temp) or ".result." in str(temp), swept
        assert_consistent(queue, dict.fromkeys(jobs, "done"))
        for job, name in jobs.items():
            lines = (outbox / name).read_text().splitlines()
            token = json.loads((queue.dir / "done" / f"{job}.result").read_text())
            starts = [line[2:] for line in lines if line.startswith("s ")]
            assert starts and starts[-1] in json.dumps(token["output"]), (name, lines, token)
            assert lines[-2:] == [f"s {starts[-1]}", f"e {starts[-1]}"], (name, lines)
            for n, line in enumerate(lines):
                if line.startswith("e "):  # a run that ended: nothing else ran meanwhile
                    assert lines[n - 1] == f"s {line[2:]}", (name, lines)


# ------------------------------------------------------------------------------ bootstrap


@needs_root
def test_bootstrap_repairs_a_damaged_root_under_draining_workers_and_keeps_user_data(outbox):
    """R-2, R-5, W-1, W-3, Q-4, I-3: while two workers drain a project's queue, the operator
    re-runs ``ctx bootstrap`` on a root missing ``model/``, a core tool, a manual and holding
    a truncated core tool: the first run repairs each (exit 0), the next says nothing to do;
    the operator's settings (a tool switched off, policy lines, tsh's config), the project's
    data and the queue are left as they were; every job runs once and ends in ``done/``."""
    with place() as where:
        root = make_world(where, ["shell.exec"])
        queue = QueueCLI(root, "proj")
        tool = root / "tool"
        data = root / "shared" / "proj" / "data" / "notes.txt"
        data.write_text("the project's own notes\n")
        (tool / "fs.read.d" / "status").write_text("disabled\n")
        with open(tool / "fs.read.d" / "policy", "a") as policy:
            policy.write("allow ci_t tool:fs.read execute\n")
        config = tool / "tsh.d" / "config"
        setting = config.read_text().replace("max_loaded_tools=64", "max_loaded_tools=16")
        assert "max_loaded_tools=16" in setting
        config.write_text(setting)
        kept = {
            p: p.read_bytes()
            for p in (
                data,
                config,
                *[tool / t for t in ("fs.read.d/policy", "shell.exec.d/policy")],
            )
        }
        names = [f"b{n:02d}" for n in range(12)]
        go = outbox / "go"
        cmd = f"echo run >> {outbox}/{{}}; until [ -e {go} ]; do sleep 0.05; done"
        jobs = [queue.publish(shell_job(cmd.format(n)), name=n) for n in names]

        workers = [start_worker(queue, "--drain") for _ in range(2)]
        try:
            two = lambda: sum((outbox / n).exists() for n in names) == 2  # noqa: E731
            assert wait_for(two, 20), list(outbox.iterdir())
            # The damage, found while the workers run.
            os.truncate(tool / "fs.read", 3000)
            shutil.rmtree(tool / "fs.list.d")
            (tool / "fs.list").unlink()
            shutil.rmtree(root / "model")
            (root / "shared" / "cortexfs-docs" / "man" / "ctx.tool.md").unlink()
            late = ctx(root, "queue", "work", "--project", "proj", "--agent", AGENT, "--drain")
            repair = ctx(root, "bootstrap")
            again = ctx(root, "bootstrap")
            assert sum(queue.state(j) == "pending" for j in jobs) == 10
            go.touch()
            ended = [proc.communicate(timeout=60) for proc in workers]
        finally:
            go.touch()
            for proc in workers:
                stop(proc)

        assert [proc.returncode for proc in workers] == [0, 0], ended
        assert repair.rc == 0, repair
        for made in ("model", "tool/fs.list", "shared/cortexfs-docs/man/ctx.tool.md"):
            assert f"created   {made}\n" in repair.out, repair
        assert "repaired  tool/fs.read\n" in repair.out, repair
        assert again.rc == 0 and "nothing to do" in again.out, again
        # A worker started on the damaged root claims nothing and names the remedy.
        assert late.rc == 1 and late.err.startswith("ctx: EINVAL: "), late
        assert "run 'ctx bootstrap' (the worker claimed no job)" in late.err, late
        for path, content in kept.items():
            assert path.read_bytes() == content, path
        assert (tool / "fs.read.d" / "status").read_text() == "disabled\n"
        assert sorted(os.listdir(root)) == ["agent", "bin", "home", "model", "shared", "tool"]
        listed = ctx(root, "object", "list", "--json")
        assert listed.rc == 0, listed
        assert_consistent(queue, dict.fromkeys(jobs, "done"))
        runs = {n: (outbox / n).read_text() for n in names}
        assert runs == dict.fromkeys(names, "run\n"), runs


# ------------------------------------------------------------------------------ a copy


@needs_root
def test_a_root_copied_while_its_workers_hold_jobs_leaves_their_claims_until_they_exit(outbox):
    """Q-5, Q-6, I-4, I-5, W-3, R-1, R-5: the operator copies a root with ``cp -a`` to a new
    place while two workers hold a job each, bootstraps the copy and points the agent's mount
    at it; there ``status`` shows the two claims, ``recover --reconcile`` leaves them untouched
    (their holders live, exit 0) and a worker runs only the pending jobs; once the old workers
    have exited, recover in the copy requeues the two claims, and the copy ends with every job
    done once by its own workers."""
    with place() as where:
        root = make_world(where, ["shell.exec"])
        queue = QueueCLI(root, "proj")
        go = outbox / "go"
        names = [f"c{n}" for n in range(6)]
        cmd = (
            f"echo run >> {outbox}/{{0}}; touch {outbox}/{{0}}.started; "
            f"until [ -e {go} ]; do sleep 0.05; done"
        )
        jobs = {queue.publish(shell_job(cmd.format(n)), name=n): n for n in names}
        old = [start_worker(queue, "--drain") for _ in range(2)]
        copy = where / "copy"
        try:
            two = lambda: len(list(outbox.glob("*.started"))) == 2  # noqa: E731
            assert wait_for(two, 20), list(outbox.iterdir())
            time.sleep(0.2)  # both claims durable; nothing moves while the jobs wait for go
            subprocess.run(["cp", "-a", str(root), str(copy)], check=True)
            moved = QueueCLI(copy, "proj")
            # A moved root: bootstrap, and the agent's mount of /ctx pointed at the new place
            # (docs/policy.md: which source an agent sees is the administrator's call).
            assert ctx(copy, "bootstrap").rc == 0
            mount = copy / "agent" / f"{AGENT}.d" / "mount"
            mount.write_text(json.dumps([[str(copy), "/ctx", "ro"]]))
            held = sorted(j for j in jobs if moved.state(j) == "claimed")
            status = moved.run("status", "--json")
            recover = moved.run("recover", "--reconcile", "--json")
            assert len(held) == 2, {j: moved.state(j) for j in jobs}
            # A worker on the copy: the pending jobs run (go is there for them), the claims
            # of the old workers stay theirs.
            go.touch()
            drained = ctx(copy, "queue", "work", "--project", "proj", "--agent", AGENT, "--drain")
            ended = [proc.communicate(timeout=30) for proc in old]
        finally:
            go.touch()
            for proc in old:
                stop(proc)

        assert [proc.returncode for proc in old] == [0, 0], ended
        counts = status.json()["counts"]
        assert (counts["claimed"], counts["pending"], counts["conflict"]) == (2, 4, 0), status
        report = recover.json()
        assert recover.rc == 0 and report["consistent"] is True, recover
        assert sorted(u["job"] for u in report["untouched"]) == held, report
        assert report["requeued"] == report["repaired"] == [], report
        assert drained.rc == 0, drained
        assert [moved.state(j) for j in held] == ["claimed", "claimed"]
        assert all(moved.state(j) == "done" for j in jobs if j not in held), (
            {j: moved.state(j) for j in jobs},
            drained,
        )
        # The old root finished everything with its own workers.
        assert_consistent(queue, dict.fromkeys(jobs, "done"))

        requeued = moved.run("recover", "--json")
        assert requeued.rc == 0, requeued
        assert sorted(r["job"] for r in requeued.json()["requeued"]) == held, requeued
        again = ctx(copy, "queue", "work", "--project", "proj", "--agent", AGENT, "--drain")
        assert again.rc == 0, again
        assert_consistent(moved, dict.fromkeys(jobs, "done"))
        for job in jobs:
            result = json.loads((moved.dir / "done" / f"{job}.result").read_text())
            assert result["worker"]["pid"] not in [proc.pid for proc in old], (job, result)


# ------------------------------------------------------------------------------ 50 000 done


def finished_pairs(queue: QueueCLI, count: int) -> list[str]:
    """``count`` finished jobs as a worker leaves them: ``done/J`` and ``done/J.result``."""
    request = json.dumps({**STAT_JOB, "from": "ops", "created": "2026-06-22T12:00:00Z"})
    outcome = json.dumps(
        {
            "status": "ok",
            "output": {"answer": 42},
            "worker": {"id": "old-worker"},
            "started": "2026-06-22T12:00:00Z",
            "finished": "2026-06-22T12:00:01Z",
        }
    )
    done = queue.dir / "done"
    names = [f"d{n:05d}.req.json" for n in range(count)]
    for name in names:
        (done / name).write_text(request)
        (done / f"{name}.result").write_text(outcome)
    return names


def timed(queue: QueueCLI, *args: str) -> tuple[Run, float]:
    start = time.monotonic()
    run = queue.run(*args)
    return run, time.monotonic() - start


@pytest.mark.slow
@needs_root
def test_fifty_thousand_done_jobs_and_no_inode_left_status_list_show_stay_quick(child):
    """Q-10, §2.4, Q-1, Q-5: a project with 50 000 finished jobs, a few live ones, on a
    filesystem with no inode left: ``status``, ``list`` (all, and by state), ``show`` and
    ``recover`` answer within seconds, each ``--json`` output one document with every job;
    ``list`` piped to ``head`` ends quietly with 141; a publish and a finish are refused with
    ENOSPC telling to free inodes, while recover requeues a dead holder's job without one."""
    with tmpfs("size=512m,nr_inodes=101000") as disk:
        root = make_world(disk, ["fs.stat"])
        queue = QueueCLI(root, "proj")
        done = finished_pairs(queue, 50_000)
        waiting = [queue.publish(STAT_JOB, name=f"p{n}") for n in range(3)]
        held = queue.claim("--pid", str(child.pid))
        dead = queue.claim("--pid", "999999")  # a holder that is not running
        fill = use_inodes(disk, 0)

        status, took = timed(queue, "status", "--json")
        assert status.rc == 0 and took < 5, (took, status)
        counts = status.json()["counts"]
        assert (counts["done"], counts["pending"], counts["claimed"]) == (50_000, 1, 2), counts
        listed, took = timed(queue, "list", "--json")
        assert listed.rc == 0 and took < 5, (took, listed.err)
        states = {entry["name"]: entry["state"] for entry in listed.json()}
        assert len(states) == 50_003 and set(states[j] for j in done) == {"done"}
        (left,) = set(waiting) - {held, dead}
        assert (states[held], states[dead], states[left]) == ("claimed", "claimed", "pending")
        by_state, took = timed(queue, "list", "--state", "done")
        assert by_state.rc == 0 and took < 5 and by_state.lines() == done, took
        shown, took = timed(queue, "show", done[-1].removesuffix(".req.json"), "--json")
        assert shown.rc == 0 and took < 2 and shown.json()["state"] == "done", (took, shown)
        head = subprocess.run(
            "ctx queue list --project proj | head -1; exit ${PIPESTATUS[0]}",
            shell=True,
            executable="/bin/bash",
            capture_output=True,
            text=True,
            env=clean_env(CTX_STORAGE=str(root), PATH=f"{Path(CTX_ARGV[0]).parent}:/usr/bin:/bin"),
        )
        assert (head.returncode, head.stdout, head.stderr) == (141, f"done       {done[0]}\n", "")

        publish = queue.run("publish", "-", input=json.dumps(STAT_JOB))
        assert refused(publish, "ENOSPC") and "free inodes on that filesystem" in publish.err
        finished = queue.run("finish", held, "--ok", "-", input="{}")
        assert refused(finished, "ENOSPC") and "free inodes" in finished.err, finished
        requeued, took = timed(queue, "recover", "--json")
        assert requeued.rc == 0 and took < 5, (took, requeued)
        assert [r["job"] for r in requeued.json()["requeued"]] == [dead], requeued
        shutil.rmtree(fill)
        queue.finish(held)
        assert_consistent(
            queue,
            {**dict.fromkeys(done, "done"), held: "done", dead: "pending", left: "pending"},
        )


# ------------------------------------------------------------------------------ full disk


def fill_slowly(disk: Path, until: threading.Event) -> Path:
    """Grow ``disk/fill`` a little at a time until the filesystem is full, then keep it full
    (taking every page freed) until ``until`` is set."""
    path = disk / "fill"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while not until.is_set():
            try:
                os.write(fd, b"\0" * 65536)
                time.sleep(0.01)
            except OSError:
                with contextlib.suppress(OSError):
                    while os.write(fd, b"\0" * 4096):
                        pass
                time.sleep(0.02)
    finally:
        os.close(fd)
    return path


@needs_root
def test_a_disk_filling_under_publishers_claimers_finishers_and_recovers_loses_nothing(child):
    """Q-1, Q-2, Q-4, Q-6, I-1, I-2, I-3, I-5, §2.4: while batches are published, jobs claimed
    and finished with large results and ``recover --reconcile`` runs in a loop, the root's
    filesystem fills and stays full: each command either succeeds or is refused with ENOSPC
    (exit 1) saying what was not done; with space back, the queue holds exactly the jobs
    acknowledged, every acknowledged finish in ``done/`` with its result, every other job
    pending or claimed by its live holder, nothing in ``inbox/``, and reconcile finds it
    consistent."""
    with tmpfs("size=6m") as disk:
        root = make_world(disk, ["fs.stat"])
        queue = QueueCLI(root, "proj")
        pid = str(child.pid)
        heavy = {"tool": "fs.stat", "input": {"path": "/ctx", "pad": "p" * 3000}}
        big = json.dumps({"log": "r" * 20000})
        runs: dict[str, list[Run]] = {"publish": [], "claim": [], "finish": [], "recover": []}
        published: list[str] = []
        finished: list[str] = []
        until = threading.Event()

        def publisher() -> None:
            while not until.is_set():
                batch = "".join(json.dumps(heavy) + "\n" for _ in range(5))
                run = queue.run("publish", "--batch", "-", input=batch)
                runs["publish"].append(run)
                published.extend(run.lines())

        def worker() -> None:
            while not until.is_set():
                claim = queue.run("claim", "--pid", pid)
                runs["claim"].append(claim)
                if claim.rc != 0:
                    time.sleep(0.02)
                    continue
                finish = queue.run("finish", claim.out.strip(), "--ok", "-", input=big)
                runs["finish"].append(finish)
                if finish.rc == 0:
                    finished.append(claim.out.strip())

        def recoverer() -> None:
            while not until.is_set():
                runs["recover"].append(queue.run("recover", "--reconcile", "--json"))

        filled = threading.Event()
        threads = [threading.Thread(target=t) for t in (publisher, worker, worker, recoverer)]
        filler = threading.Thread(target=fill_slowly, args=(disk, filled))
        for thread in threads:
            thread.start()
        try:
            # The disk fills once each verb has had its way at least once: on a busy machine a
            # claim and its finish can take longer than any fixed head start.
            assert wait_for(lambda: finished and published, 60), runs
            filler.start()
            assert wait_for(lambda: os.statvfs(disk).f_bavail == 0, 20)
            time.sleep(1.5)  # everyone meets the full disk for a while
        finally:
            until.set()
            for thread in threads:
                thread.join()
            filled.set()
            if filler.ident is not None:
                filler.join()
        (disk / "fill").unlink()

        refusals = {what: 0 for what in runs}
        for what, done in runs.items():
            for run in done:
                assert TRACEBACK not in run.err, run
                if what == "claim" and run.rc == 3:
                    assert (run.out, run.err) == ("", ""), run
                    continue
                if what == "recover":
                    assert run.rc in (0, 1) and run.json(), run
                    for error in run.json()["errors"]:
                        assert error["error"] == "ENOSPC", run
                    refusals[what] += bool(run.json()["errors"])
                    continue
                if run.rc != 0:
                    assert run.rc == 1 and run.err.startswith("ctx: ENOSPC: "), run
                    refusals[what] += 1
        assert refusals["publish"] and refusals["claim"] + refusals["finish"], refusals
        for run in runs["claim"]:
            if run.rc == 1:
                assert "nothing was claimed (job " in run.err, run
        for run in runs["finish"]:
            if run.rc:
                assert "stays claimed and no result of it was written" in run.err, run
        for run in runs["publish"]:
            if run.rc:
                assert "nothing was published" in run.err or "published: " in run.err, run

        assert len(published) == len(set(published)) and finished, (published, finished)
        claimed = {j for j, states in queue.requests().items() if states == ["claimed"]}
        recovered = queue.run("recover", "--reconcile", "--json")
        assert recovered.rc == 0 and recovered.json()["consistent"] is True, recovered
        expected = dict.fromkeys(published, "pending")
        expected.update(dict.fromkeys(claimed, "claimed"))
        expected.update(dict.fromkeys(finished, "done"))
        assert_consistent(queue, expected)
        for job in finished:
            result = json.loads((queue.dir / "done" / f"{job}.result").read_text())
            assert result["status"] == "ok" and result["output"] == json.loads(big), job
