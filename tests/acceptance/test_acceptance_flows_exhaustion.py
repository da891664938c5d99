"""End-to-end flows of a machine that runs out of resources while CortexFS is in use (SPEC §2
Q-1 … Q-6, I-1 … I-5, §3 W-4, §4 S-5, §6 T-8, R-5, X-1): ``ctx`` run with too few file
descriptors at every limit in a range (EMFILE), a storage root on a tmpfs filled to each number
of free pages in a range, a session log that a full disk tears and a read-only remount keeps
torn, and a worker whose disk fills while its job runs.  Every refusal names its errno and
never shows a Python traceback; nothing acknowledged is lost, nothing refused appears, an
install is one whole version, and once the resource is back the queue is consistent."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import resource
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    tool_manifest,
    wait_for,
)
from tests.acceptance.workercli import AGENT, allow_in_tool_policy, make_agent, shell_job

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="mounts a tmpfs and runs agents as another uid: needs root"
)

STATES = ("inbox", "pending", "claimed", "lease", "done", "failed")
STAT_JOB = {"tool": "fs.stat", "input": {"path": "/ctx"}}
PAGE = 4096
TRACEBACK = "Traceback (most recent call last)"
# Below this many descriptors the interpreter itself cannot start (no ctx code runs).
LOWEST = 5

# ------------------------------------------------------------------------------ helpers


@contextlib.contextmanager
def tmpfs(mountpoint: Path, options: str) -> Iterator[Path]:
    """A tmpfs (``size=…``) at ``mountpoint`` (0755) for the block, unmounted lazily after."""
    mountpoint.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mountpoint)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        mountpoint.chmod(0o755)
        yield mountpoint
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(mountpoint)], capture_output=True)
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def ctx(root: Path, *args, input: str | bytes | None = None, timeout: float = 60) -> Run:
    return ctx_run(*args, input=input, env=clean_env(CTX_STORAGE=str(root)), timeout=timeout)


def limited(root: Path, descriptors: int, *args, input: str = "") -> Run:
    """``ctx ARGS…`` on ``root`` in a process allowed ``descriptors`` open files (soft and hard
    limit, as ``ulimit -n`` sets them)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (descriptors, descriptors))

    proc = subprocess.run(
        [*CTX_ARGV, *map(str, args)],
        input=input.encode(),
        capture_output=True,
        env=clean_env(CTX_STORAGE=str(root)),
        preexec_fn=limit,
        timeout=60,
    )
    return Run(
        [f"(ulimit -n {descriptors})", *map(str, args)],
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )


def refused_for(run: Run, code: str) -> bool:
    """Whether ``run`` failed with a ctx error naming ``code`` and no traceback; a run that
    succeeded gives False; anything else fails the test."""
    assert TRACEBACK not in run.err, run
    if run.rc == 0:
        return False
    assert run.err.startswith(f"ctx: {code}: "), run
    return True


def fill(disk: Path) -> Path:
    """Append whole pages to ``disk/fill`` until the filesystem has no page left."""
    path = disk / "fill"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * (16 * PAGE)):
                pass
        with contextlib.suppress(OSError):
            while os.write(fd, b"\0" * PAGE):
                pass
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0
    return path


def leave_pages(disk: Path, pages: int) -> None:
    """Fill ``disk`` and give back exactly ``pages`` pages."""
    path = fill(disk)
    os.truncate(path, path.stat().st_size - pages * PAGE)
    assert os.statvfs(disk).f_bavail == pages


def make_world(top: Path, tool: str = "fs.stat") -> Path:
    """A bootstrapped root ``top/st``, agent ``ci`` (uid nobody) allowed ``tool`` by both
    policies (P-6), and the queue of project ``proj``."""
    root = top / "st"
    assert ctx(root, "bootstrap").rc == 0
    make_agent(root, [tool])
    allow_in_tool_policy(root, tool)
    assert ctx(root, "queue", "init", "--project", "proj").rc == 0
    return root


def jobs_on_disk(queue: QueueCLI) -> dict[str, list[str]]:
    """Every job name with the states it has evidence in (results and lease dirs aside)."""
    seen: dict[str, list[str]] = {}
    for state in ("pending", "claimed", "done", "failed"):
        for name in os.listdir(queue.dir / state):
            if not name.endswith(".result"):
                seen.setdefault(name, []).append(state)
    return seen


def assert_consistent(queue: QueueCLI, expected: dict[str, str]) -> None:
    """The queue holds exactly the jobs of ``expected``, each in its one state, nothing in
    ``inbox/``, and status and ``recover --reconcile`` agree that it is consistent."""
    assert {job: states for job, states in jobs_on_disk(queue).items()} == {
        job: [state] for job, state in expected.items()
    }
    for job, state in expected.items():
        assert queue.state(job) == state, (job, state)
    assert queue.entries("inbox") == set()
    status = queue.run("status", "--json")
    assert status.rc == 0, status
    report = status.json()
    counts = report["counts"]
    for state in ("pending", "claimed", "done", "failed"):
        assert counts[state] == sum(1 for s in expected.values() if s == state), (state, report)
    assert (counts["incomplete"], counts["conflict"], report["temps"]) == (0, 0, []), report
    recovered = queue.run("recover", "--reconcile", "--json")
    assert recovered.rc == 0 and recovered.json()["consistent"] is True, recovered


def events_file(root: Path, session: str) -> Path:
    uid = pwd.getpwnam("nobody").pw_uid  # root's default uid for agents
    return root / "home" / str(uid) / "agent" / AGENT / "session" / session / "events.jsonl"


def whole_events(path: Path) -> list[dict]:
    """Every line of ``path``, each a whole JSON event ended by a newline (no torn line)."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-200:]
    return [json.loads(line) for line in data.decode().splitlines()]


def tool_version(root: Path, name: str) -> int:
    """Which version of the test tool ``name`` is installed: its executable and its
    description must name the same one."""
    body = (root / "tool" / name).read_text()
    description = (root / "tool" / f"{name}.d" / "description").read_text()
    versions = {int(line.split()[2]) for line in body.splitlines() if line.startswith("# v")}
    assert len(versions) == 1, body[:200]
    (version,) = versions
    assert description.strip() == f"Version {version} of the test tool.", description
    return version


def versioned_manifest(directory: Path, name: str, version: int, pages: int) -> Path:
    """A v2 manifest (T-8) of tool ``name`` whose executable is ``pages`` pages long and says
    ``version``, as its description does."""
    padding = "".join(f"# v {version} {'x' * 60}\n" for _ in range(pages * PAGE // 70))
    program = f"#!/bin/sh\n{padding}echo version {version}\n"
    return tool_manifest(
        directory, name, program, description=f"Version {version} of the test tool."
    )


def hidden_names(directory: Path) -> set[str]:
    """Dot-names an install may stage in a tier, less the lock file installs keep."""
    return {n for n in os.listdir(directory) if n.startswith(".") and n != ".install-lock"}


def jsonl(*requests: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in requests)


# ------------------------------------------------------------------------------ EMFILE


def test_out_of_descriptors_at_any_limit_the_queue_loses_and_invents_no_job(tmp_path, child):
    """Q-1 … Q-6, I-1, I-2: publish (single and ``--batch``), claim, finish and recover, each
    run with every open-file limit from the lowest the interpreter starts with upwards, either
    succeed or stop with EMFILE and no traceback; a refused publish or claim prints nothing, and
    afterwards every acknowledged job is in exactly the state its commands gave it, no refused
    one exists, ``inbox/`` is empty and recover finds the queue consistent."""
    root = tmp_path / "st"
    assert ctx(root, "bootstrap").rc == 0
    assert ctx(root, "queue", "init", "--project", "proj").rc == 0
    queue = QueueCLI(root, "proj")
    expected: dict[str, str] = {}
    refusals: dict[str, int] = {"publish": 0, "batch": 0, "claim": 0, "finish": 0, "recover": 0}
    successes = dict.fromkeys(refusals, 0)

    def tally(what: str, run: Run) -> bool:
        if refused_for(run, "EMFILE"):
            assert "Too many open files" in run.err, run
            refusals[what] += 1
            return False
        successes[what] += 1
        return True

    for n in (LOWEST, LOWEST + 2, LOWEST + 4, 10, 11, 12, 13, 16):
        publish = ("queue", "publish", "--project", "proj")
        single = limited(root, n, *publish, "--name", f"s{n}", "-", input=json.dumps(STAT_JOB))
        if tally("publish", single):
            assert single.out == f"s{n}.req.json\n", single
            expected[f"s{n}.req.json"] = "pending"
        else:
            assert single.out == "", single
        batch = limited(root, n, *publish, "--batch", "-", input=jsonl(STAT_JOB, STAT_JOB))
        if tally("batch", batch):
            assert len(batch.lines()) == 2, batch
            expected.update(dict.fromkeys(batch.lines(), "pending"))
        else:
            assert batch.out == "", batch
        claim = limited(root, n, "queue", "claim", "--project", "proj", "--pid", child.pid)
        if claim.rc != 3 and tally("claim", claim):
            job = claim.out.strip()
            assert expected.get(job) == "pending", (claim, expected)
            expected[job] = "claimed"
        elif claim.rc != 3:
            assert claim.out == "", claim
        held = sorted(job for job, state in expected.items() if state == "claimed")
        if held:
            finish_it = ("queue", "finish", "--project", "proj", held[0], "--ok", "-")
            finish = limited(root, n, *finish_it, input='{"answer": 1}')
            if tally("finish", finish):
                expected[held[0]] = "done"
        tally("recover", limited(root, n, "queue", "recover", "--project", "proj"))
        # Between two limits the queue is as the acknowledged commands left it.
        assert {job: s for job, s in jobs_on_disk(queue).items()} == {
            job: [state] for job, state in expected.items()
        }
        assert queue.entries("inbox") == set()

    for what in refusals:
        assert refusals[what] and successes[what], (what, refusals, successes)
    assert_consistent(queue, expected)


def test_every_emfile_refusal_says_what_was_not_done_and_to_raise_ulimit(tmp_path, child):
    """Q-1, Q-2, Q-5, X-1 and docs/queue.md: a step refused for want of a resource keeps its
    errno and is never bare; it names the queue, what was (not) done and the remedy, for EMFILE
    ``raise the limit of open files ('ulimit -n')``, at whichever step descriptors run out."""
    root = tmp_path / "st"
    assert ctx(root, "bootstrap").rc == 0
    assert ctx(root, "queue", "init", "--project", "proj").rc == 0
    queue = QueueCLI(root, "proj")
    for n in range(8):
        queue.publish(STAT_JOB, name=f"j{n}")
    bare = []
    job = json.dumps(STAT_JOB)
    for n in (LOWEST, 12):  # where descriptors run out opening the queue, and reading a job
        for run in (
            limited(root, n, "queue", "publish", "--project", "proj", "-", input=job),
            limited(root, n, "queue", "claim", "--project", "proj", "--pid", child.pid),
            limited(root, n, "queue", "recover", "--project", "proj"),
            limited(root, n, "shared", "create", f"space{n}"),
        ):
            if refused_for(run, "EMFILE") and "('ulimit -n')" not in run.err:
                bare.append(f"{' '.join(run.argv[:3])}: {run.err.strip()}")
    assert bare == []


@needs_root
def test_out_of_descriptors_an_install_is_whole_and_sessions_bootstrap_and_spaces_recover(
    traversable,
):
    """T-8, S-5, R-5, X-1: a reinstall run at every open-file limit from the lowest upwards
    leaves either the whole old version (saying the previous version is still in place) or the
    whole new one and no staging name; tool calls refused by EMFILE leave a session whose lines
    are all whole events after ``ctx session repair``; a bootstrap and a shared space cut short
    by EMFILE are completed by running them again with descriptors to spare."""
    root = make_world(traversable)
    src = traversable / "src"
    first = versioned_manifest(src / "1", "demo", 1, 2)
    assert ctx(root, "object", "install", first, "--tier", "system").rc == 0
    current, refusals = 1, 0
    for n in (LOWEST, 9, 13, 16, 20, 24):
        manifest = versioned_manifest(src / str(n), "demo", n, 2)
        install = limited(root, n, "object", "install", manifest, "--tier", "system")
        if refused_for(install, "EMFILE"):
            assert f"cannot install {root}/tool/demo" in install.err, install
            assert "; nothing " in install.err, install  # was changed, installed, made…
            assert "('ulimit -n')" in install.err, install
            refusals += 1
        else:
            current = n
        assert tool_version(root, "demo") == current, install
        assert hidden_names(root / "tool") == set(), install
    assert refusals and current > 1, "the limits tried never crossed the install's needs"

    assert ctx(root, "run", "--agent", AGENT, "--session", "s1", "fs.stat", "/ctx").rc == 0
    for n in (LOWEST, LOWEST + 1, LOWEST + 2):
        call = limited(root, n, "run", "--agent", AGENT, "--session", "s1", "fs.stat", "/ctx")
        if refused_for(call, "EMFILE"):
            assert call.rc == 126, call
        repair = limited(root, n, "session", "repair", AGENT, "s1")
        assert repair.rc == 0 or refused_for(repair, "EMFILE"), repair
    assert ctx(root, "session", "repair", AGENT, "s1").rc == 0
    events = whole_events(events_file(root, "s1"))
    results = {e["call"] for e in events if e["type"] == "tool_result"}
    assert {e["call"] for e in events if e["type"] == "tool_call"} <= results, events
    assert any(e.get("errno") == "EMFILE" for e in events), events

    fresh = traversable / "fresh"
    cut = [limited(fresh, n, "bootstrap") for n in (LOWEST, LOWEST + 3)]
    for run in cut:
        assert refused_for(run, "EMFILE"), run
        assert run.err.startswith(f"ctx: EMFILE: bootstrap of {fresh} left "), run
    completed = ctx(fresh, "bootstrap")
    assert completed.rc == 0, completed
    again = ctx(fresh, "bootstrap")
    assert again.rc == 0 and "nothing to do" in again.out, again
    assert sorted(p.name for p in (fresh / "tool").iterdir()) == sorted(
        p.name for p in (root / "tool").iterdir() if not p.name.startswith("demo")
    )
    for n in (LOWEST, LOWEST + 1):
        space = limited(root, n, "shared", "create", "team")
        assert space.rc == 0 or refused_for(space, "EMFILE"), space
    assert ctx(root, "shared", "create", "team").rc == 0
    team = root / "shared" / "team"
    assert {p.name for p in team.iterdir()} >= {"tool", "data", "queue", "agent"}
    assert {p.name for p in (team / "queue").iterdir()} >= set(STATES)


# ------------------------------------------------------------------------------ ENOSPC


@needs_root
def test_at_every_fill_level_a_reinstall_and_a_batch_are_all_or_nothing(traversable):
    """T-8, Q-1, I-2: on a tmpfs left with 0, 1, 2 … free pages, a reinstall of a four-page
    tool and a batch of four one-page requests each either complete or are refused with ENOSPC
    saying nothing was installed (the previous version in place) or published; the tool is
    always one whole version, no staging name stays, and the queue holds exactly the jobs
    printed; with space back, recover finds it consistent."""
    with tmpfs(traversable / "disk", "size=8m") as disk:
        root = make_world(disk)
        queue = QueueCLI(root, "proj")
        src = traversable / "src"
        first = versioned_manifest(src / "0", "big", 0, 4)
        assert ctx(root, "object", "install", first, "--tier", "system").rc == 0
        current, expected = 0, {}
        heavy = {"tool": "fs.stat", "input": {"path": "/ctx", "pad": "p" * 3000}}
        outcomes = set()
        for pages in (0, 2, 4, 6, 9, 12):
            manifest = versioned_manifest(src / str(pages + 1), "big", pages + 1, 4)
            leave_pages(disk, pages)
            install = ctx(root, "object", "install", manifest, "--tier", "system")
            batch = queue.run("publish", "--batch", "-", input=jsonl(*[heavy] * 4))
            os.unlink(disk / "fill")

            if refused_for(install, "ENOSPC"):
                assert install.err.startswith(f"ctx: ENOSPC: cannot install {root}/tool/big"), (
                    install
                )
                assert "the previous version is still in place" in install.err, install
                outcomes.add(("install", "refused"))
            else:
                current = pages + 1
                outcomes.add(("install", "done"))
            assert tool_version(root, "big") == current, (pages, install)
            assert hidden_names(root / "tool") == set(), (pages, install)
            if refused_for(batch, "ENOSPC"):
                assert (batch.out, "nothing was published" in batch.err) == ("", True), batch
                outcomes.add(("batch", "refused"))
            else:
                assert len(batch.lines()) == 4, batch
                expected.update(dict.fromkeys(batch.lines(), "pending"))
                outcomes.add(("batch", "done"))
            assert {j: s for j, s in jobs_on_disk(queue).items()} == {
                j: [s] for j, s in expected.items()
            }, pages
        assert len(outcomes) == 4, outcomes  # each was refused at some level and done at another
        assert_consistent(queue, expected)
        called = ctx(root, "object", "which", "big")
        assert called.out == f"{root}/tool/big\n", called


@needs_root
def test_a_full_disk_tears_a_session_line_that_read_only_keeps_and_repair_then_cuts(
    traversable,
):
    """S-5, S-2, T-7: tool calls into a session on a full tmpfs go on until an event no longer
    fits its last page; that call stops with ENOSPC naming ``events.jsonl`` and leaves a torn
    line readers skip; remounted read-only, ``ctx session repair`` says EROFS and changes
    nothing; read-write with space freed it cuts the line, every line left is a whole event,
    every recorded call has its result, and the next call appends cleanly."""
    with tmpfs(traversable / "disk", "size=4m") as disk:
        root = make_world(disk)
        assert ctx(root, "run", "--agent", AGENT, "--session", "s1", "fs.stat", "/ctx").rc == 0
        log = events_file(root, "s1")
        fill(disk)
        failed = None
        for _ in range(3 * PAGE // 300):
            call = ctx(root, "run", "--agent", AGENT, "--session", "s1", "fs.stat", "/ctx")
            if refused_for(call, "ENOSPC"):
                failed = call
                break
        assert failed is not None, "no call met the end of the last page"
        assert failed.rc == 126 and f"{log}: No space left on device" in failed.err, failed
        torn = log.read_bytes()
        assert not torn.endswith(b"\n"), torn[-200:]
        shown = ctx(root, "session", "show", AGENT, "s1", "--json")
        assert shown.rc == 0 and "ends with a torn line" in shown.err, shown
        assert all(json.loads(line) for line in shown.lines())

        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        frozen = ctx(root, "session", "repair", AGENT, "s1")
        assert frozen.rc == 1 and refused_for(frozen, "EROFS"), frozen
        assert str(log) in frozen.err, frozen
        assert log.read_bytes() == torn
        subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
        (disk / "fill").unlink()

        repaired = ctx(root, "session", "repair", AGENT, "s1")
        assert repaired.rc == 0 and "truncated a torn last line" in repaired.out, repaired
        events = whole_events(log)
        assert torn.startswith(log.read_bytes())
        calls = [e["call"] for e in events if e["type"] == "tool_call"]
        results = [e["call"] for e in events if e["type"] == "tool_result"]
        assert calls == results and len(calls) >= 2, events
        assert ctx(root, "run", "--agent", AGENT, "--session", "s1", "fs.stat", "/ctx").rc == 0
        after = whole_events(log)
        assert after[: len(events)] == events
        assert [e["type"] for e in after[len(events) :]] == ["tool_call", "tool_result"]
        nothing = ctx(root, "session", "repair", AGENT, "s1")
        assert nothing.rc == 0 and "nothing to do" in nothing.out, nothing


@needs_root
def test_a_disk_that_fills_while_a_worker_runs_a_job_loses_no_job(traversable, outbox):
    """W-1, W-4, Q-4, Q-5, I-1, I-3, S-5: the storage root fills while ``ctx queue work
    --drain`` runs a job; the worker stops with ENOSPC naming the job, which stays claimed with
    no result, and claims nothing more; with space freed, recover requeues it (its holder
    exited), a second drain finishes every job, each exactly once in ``done/``, and the
    worker's session holds only whole events."""
    with tmpfs(traversable / "disk", "size=8m") as disk:
        root = make_world(disk, "shell.exec")
        queue = QueueCLI(root, "proj")
        jobs = [
            queue.publish(shell_job(f"echo run >> {outbox}/j0; sleep 1.2"), name="j0"),
            queue.publish(shell_job(f"echo run >> {outbox}/j1"), name="j1"),
            queue.publish(shell_job(f"echo run >> {outbox}/j2"), name="j2"),
        ]
        argv = [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", AGENT, "--drain"]
        env = clean_env(CTX_STORAGE=str(root))
        pipe = subprocess.PIPE
        worker = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe, text=True
        )
        try:
            assert wait_for(lambda: (outbox / "j0").exists(), 20), "j0 never started"
            fill(disk)
            out, err = worker.communicate(timeout=30)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.communicate()
        stopped = Run(argv[1:], worker.returncode, out, err)
        assert stopped.rc == 1 and refused_for(stopped, "ENOSPC"), stopped
        assert f"job {jobs[0]} was" in err and "'ctx queue recover --project proj'" in err, stopped
        assert queue.state(jobs[0]) == "claimed", queue.entries("claimed")
        assert [queue.state(j) for j in jobs[1:]] == ["pending", "pending"]
        assert not (outbox / "j1").exists() and not (outbox / "j2").exists()
        assert queue.entries("done") == queue.entries("failed") == set()

        (disk / "fill").unlink()
        requeued = queue.run("recover")
        assert requeued.rc == 0 and f"requeue  {jobs[0]}" in requeued.out, requeued
        repair = ctx(root, "session", "repair", AGENT, "worker")
        assert repair.rc == 0, repair
        drained = ctx(root, "queue", "work", "--project", "proj", "--agent", AGENT, "--drain")
        assert drained.rc == 0 and TRACEBACK not in drained.err, drained
        assert_consistent(queue, dict.fromkeys(jobs, "done"))
        runs = {j: (outbox / j).read_text().count("run") for j in ("j0", "j1", "j2")}
        assert runs == {"j0": 2, "j1": 1, "j2": 1}, runs
        events = whole_events(events_file(root, "worker"))
        finished = [e for e in events if e["type"] == "queue.finish"]
        assert len(finished) == 3, [e["type"] for e in events]
