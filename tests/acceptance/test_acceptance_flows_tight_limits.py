"""CortexFS commands run under tight per-process resource limits (SPEC §2 Q-1 … Q-6, I-1 …
I-5, §2.4, §3 W-1 … W-4, §4 S-5, §6 T-6, T-8, R-5): ``RLIMIT_FSIZE`` below what a step writes
(with ``SIGXFSZ`` left at its default and ignored), ``RLIMIT_NOFILE`` at 5 … 24, ``RLIMIT_NPROC``
of 1 for the second real uid, ``RLIMIT_AS``/``RLIMIT_DATA`` below a big request or result, and
``RLIMIT_CPU`` that kills a worker in the middle of a drain.  The limits are set in the child
only (``preexec_fn``), for the one command.  A command that cannot finish says so with an
errno-style line and an honest exit status, or dies of the limit's signal; in every case the
queue loses and duplicates nothing, a temp file stays only in ``inbox/`` for ``recover
--reconcile``, sessions keep whole lines (a torn last line at most, which repair cuts), and a
bootstrap or install cut short is completed by running it again without the limit."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    limited,
    new_scratch_dir,
    request,
    result,
    scratch_top,
    tool_manifest,
)
from tests.acceptance.workercli import AGENT, allow_in_tool_policy, make_agent, shell_job
from tests.support.users import unprivileged_user as unprivileged_user

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="runs agents and the second test user: needs root"
)

TRACEBACK = "Traceback (most recent call last)"
STATES = ("pending", "claimed", "done", "failed")
STAT_JOB = {"tool": "fs.stat", "input": {"path": "/ctx"}}
MIB = 1 << 20
WORK = ("queue", "work", "--project", "proj", "--agent", AGENT, "--drain")
PUBLISH = ("queue", "publish", "--project", "proj")
PAGE = 4096

# ------------------------------------------------------------------------------ helpers


def refused(run: Run, code: str) -> None:
    """``run`` stopped with ``ctx: CODE: …`` (its last line: a worker names the jobs it left
    before it), exit 1, no traceback."""
    assert TRACEBACK not in run.err, run
    assert run.rc == 1 and last_line(run.err).startswith(f"ctx: {code}: "), run


def last_line(text: str) -> str:
    lines = text.splitlines()
    return lines[-1] if lines else ""


def env_for(storage: Path, cache: Path, **extra: str) -> dict[str, str]:
    """The environment of commands on ``storage``, with claim-order hints kept in ``cache``
    (a directory of the test's, removed with it)."""
    return clean_env(CTX_STORAGE=str(storage), XDG_CACHE_HOME=str(cache), **extra)


def assert_consistent(queue: QueueCLI, env: dict[str, str], expected: dict[str, str]) -> None:
    """Exactly the jobs of ``expected`` are on disk, each in its one state; ``inbox/`` is
    empty; ``status`` counts them so and a second ``recover --reconcile`` has nothing to do."""
    assert queue.requests() == {job: [state] for job, state in expected.items()}
    for job, state in expected.items():
        assert queue.state(job) == state, (job, state)
    assert queue.entries("inbox") == set()
    status = queue.run("status", "--json", env=env)
    assert status.rc == 0, status
    report = status.json()
    for state in STATES:
        wanted = sum(1 for s in expected.values() if s == state)
        assert report["counts"][state] == wanted, (state, report)
    assert (report["counts"]["incomplete"], report["counts"]["conflict"]) == (0, 0), report
    assert report["temps"] == [], report
    again = queue.run("recover", "--reconcile", "--json", env=env)
    assert again.rc == 0 and again.json()["consistent"] is True, again
    assert (again.json()["requeued"], again.json()["repaired"]) == ([], []), again


def whole_lines(path: Path) -> list[dict]:
    """The events of ``path``: every line a whole JSON object ended by a newline."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-300:]
    return [json.loads(line) for line in data.decode().splitlines()]


def publish(queue: QueueCLI, env: dict[str, str], req: dict, name: str) -> str:
    """``ctx queue publish --name NAME -`` of ``req``; the job name printed."""
    done = queue.run("publish", "--name", name, "-", input=json.dumps(req), env=env)
    assert done.rc == 0, done
    return done.out.strip()


def claim(queue: QueueCLI, env: dict[str, str], pid: int) -> str:
    """``ctx queue claim --pid PID``; the job name printed."""
    done = queue.run("claim", "--pid", str(pid), env=env)
    assert done.rc == 0, done
    return done.out.strip()


def frames(run: Run) -> list[dict]:
    return [json.loads(line) for line in run.out.splitlines() if line.strip()]


def events_path(storage: Path, uid: int, session: str) -> Path:
    return storage / "home" / str(uid) / "agent" / AGENT / "session" / session / "events.jsonl"


def leftovers(queue: QueueCLI, env: dict[str, str]) -> dict[str, str]:
    """A queue holding one of each thing a crash leaves (docs/queue.md, "What a crash
    leaves"): p1, p5 claimed by a holder that exited; p2 claimed without a lease; p3's
    finish cut after its result; p4's before its cleanup; p6 pending; an orphan lease p7;
    p8 pending beside an empty claim; a stray publish temp two hours old.  The states
    ``recover --reconcile`` brings them to."""
    queue.drop("p1", request("fs.stat"))
    holder = subprocess.Popen(["sleep", "60"])
    try:
        claimed = queue.run("claim", "--pid", str(holder.pid), env=env)
        assert claimed.rc == 0 and claimed.out == "p1.req.json\n", claimed
    finally:
        holder.kill()
        holder.wait()
    d = queue.dir
    lease = json.loads((d / "lease" / "p1.req.json" / "worker").read_text())
    for n in range(2, 9):
        if n != 7:
            queue.drop(f"p{n}", request("fs.stat"))
    for job in ("p2", "p3", "p4", "p5"):
        j = f"{job}.req.json"
        (d / "claimed" / j).mkdir()
        os.rename(d / "pending" / j, d / "claimed" / j / j)
        if job != "p2":
            (d / "lease" / j).mkdir()
            (d / "lease" / j / "worker").write_text(json.dumps({**lease, "job": j}))
    (d / "done" / "p3.req.json.result").write_text(json.dumps(result()))
    (d / "done" / "p4.req.json.result").write_text(json.dumps(result()))
    os.rename(d / "claimed" / "p4.req.json" / "p4.req.json", d / "done" / "p4.req.json")
    (d / "lease" / "p7.req.json").mkdir()
    (d / "lease" / "p7.req.json" / "worker").write_text("{}")
    (d / "claimed" / "p8.req.json").mkdir()
    stray = d / "inbox" / "p9.req.json.publish.tmp"
    stray.write_text('{"tool": "fs.st')
    then = time.time() - 7200
    os.utime(stray, (then, then))
    states = {f"p{n}.req.json": "pending" for n in (1, 2, 5, 6, 8)}
    states.update({"p3.req.json": "done", "p4.req.json": "done"})
    return states


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A fresh directory every uid may search, removed afterwards."""
    where = new_scratch_dir(scratch_top(__file__))
    yield where
    shutil.rmtree(where, ignore_errors=True)


@pytest.fixture
def world(searchable_storage: Path, scratch: Path, outbox: Path) -> dict:
    """The bootstrapped root (queue ``proj``), agent ``ci`` (uid nobody) allowed ``shell.exec``
    by both policies (P-6), its environment and a directory the agent's tools may write."""
    make_agent(searchable_storage, ["shell.exec"])
    allow_in_tool_policy(searchable_storage, "shell.exec")
    cache = scratch / "cache"
    cache.mkdir()
    return {
        "root": searchable_storage,
        "env": env_for(searchable_storage, cache),
        "queue": QueueCLI(searchable_storage, "proj"),
        "out": outbox,
    }


# ------------------------------------------------------------------------------ RLIMIT_FSIZE


def test_a_file_size_limit_refuses_each_queue_step_whole(storage, tmp_path, child):
    """Q-1 … Q-6, I-1, I-2, §2.4: with ``RLIMIT_FSIZE`` below what a step writes, and
    ``SIGXFSZ`` at its default or ignored in the parent (in turn), ``publish``, ``publish --batch``,
    ``claim``, ``renew`` and ``finish`` are refused with ``EFBIG`` (exit 1, never a death by
    SIGXFSZ), print nothing, say what was not done, and leave no temp file; ``recover
    --reconcile`` under the same limit finds the queue consistent; without the limit the same
    finish completes the job, once."""
    queue = QueueCLI(storage, "proj")
    env = env_for(storage, tmp_path / "cache")
    big = {**STAT_JOB, "pad": "p" * 5000}

    dispositions = iter([signal.SIG_DFL, signal.SIG_IGN] * 3)

    def under(limit: int, *args, input: str = "") -> Run:
        sigxfsz = next(dispositions)
        return limited(
            env, "queue", *args, "--project", "proj", input=input, fsize=limit, sigxfsz=sigxfsz
        )

    single = under(1024, "publish", "--name", "big", "-", input=json.dumps(big))
    refused(single, "EFBIG")
    assert "File too large" in single.err and "nothing was published" in single.err, single
    lines = "".join(json.dumps(r) + "\n" for r in (STAT_JOB, STAT_JOB, big, STAT_JOB))
    batch = under(1024, "publish", "--batch", "-", input=lines)
    refused(batch, "EFBIG")
    assert "nothing was published" in batch.err and batch.out == "", batch
    assert queue.requests() == {} and queue.entries("inbox") == set()

    first, second = publish(queue, env, STAT_JOB, "first"), publish(queue, env, STAT_JOB, "second")
    refused_claim = under(64, "claim", "--pid", str(child.pid))
    refused(refused_claim, "EFBIG")
    assert f"nothing was claimed (job {first} stays pending)" in refused_claim.err, refused_claim
    assert refused_claim.out == ""
    assert queue.requests() == {first: ["pending"], second: ["pending"]}
    assert queue.entries("claimed") == queue.entries("lease") == queue.entries("inbox") == set()

    job = claim(queue, env, child.pid)
    assert job == first
    lease = (queue.dir / "lease" / job / "worker").read_bytes()
    renew = under(64, "renew", job, "--pid", str(child.pid))
    refused(renew, "EFBIG")
    assert f"the lease on {job} is unchanged" in renew.err, renew
    assert (queue.dir / "lease" / job / "worker").read_bytes() == lease

    output = {"answer": "a" * 20000}
    finish = under(8192, "finish", job, "--ok", "-", input=json.dumps(output))
    refused(finish, "EFBIG")
    assert f"job {job} stays claimed and no result of it was written" in finish.err, finish
    assert queue.state(job) == "claimed" and queue.entries("inbox") == set()
    assert queue.entries("done") == queue.entries("failed") == set()

    recover = under(64, "recover", "--reconcile")
    assert recover.rc == 0 and TRACEBACK not in recover.err, recover
    assert "queue consistent" in recover.out, recover

    done = queue.run("finish", job, "--ok", "-", input=json.dumps(output), env=env)
    assert done.rc == 0, done
    assert json.loads((queue.dir / "done" / f"{job}.result").read_text())["output"] == output
    assert_consistent(queue, env, {first: "done", second: "pending"})


@needs_root
def test_a_worker_under_a_file_size_limit_ends_every_job_once(world):
    """W-1, W-4, Q-4, I-1, I-3: ``ctx queue work --drain`` under ``RLIMIT_FSIZE`` of 64 KiB
    drains a job whose tool writes a file past the limit (the tool meets the limit, not the
    worker), one whose result is past it, and a small one; the worker exits 0 or stops with
    ``EFBIG``, every job is finished, left claimed, or still pending when the worker stopped,
    nothing stays in ``inbox/``, and after
    ``recover --reconcile`` and a drain without the limit every job is in exactly one
    terminal state and the queue is consistent."""
    queue, env, out = world["queue"], world["env"], world["out"]
    limit = 64 * 1024
    jobs = {
        publish(queue, env, shell_job(f"head -c 300000 /dev/zero > {out}/big"), "writes"): "w",
        publish(queue, env, shell_job("head -c 200000 /dev/zero | tr '\\0' x"), "prints"): "p",
        publish(queue, env, shell_job(f"echo ran >> {out}/small"), "small"): "s",
    }
    work = limited(env, *WORK, fsize=limit)
    assert TRACEBACK not in work.err, work
    assert work.rc in (0, 1), work
    if work.rc == 1:
        assert last_line(work.err).startswith("ctx: EFBIG: "), work
    # The tool's own write is cut at the limit by the kernel.
    assert (out / "big").stat().st_size == limit
    states = {job: queue.state(job) for job in jobs}
    assert set(states.values()) <= {"done", "failed", "claimed", "pending"}, states
    assert work.rc == 1 or "pending" not in states.values(), (work, states)
    assert queue.entries("inbox") == set()

    recovered = queue.run("recover", "--reconcile", env=env)
    assert recovered.rc == 0, recovered
    drained = queue.run("work", "--agent", AGENT, "--drain", env=env)
    assert drained.rc == 0 and TRACEBACK not in drained.err, drained
    final = {job: queue.state(job) for job in jobs}
    assert final["small.req.json"] == "done" and set(final.values()) <= {"done", "failed"}
    assert_consistent(queue, env, final)
    assert (out / "small").read_text() == "ran\n"


@needs_root
def test_a_result_refused_by_the_file_size_limit_is_not_recorded_as_still_claimed(world):
    """W-1, Q-4, docs/workers.md ("A host that runs short", "A result too large"): when the
    worker's result file meets ``RLIMIT_FSIZE``, whatever becomes of the job, what is recorded
    must be true: a job in ``failed/`` is not "stays claimed and no result of it was written",
    and its reason never asks for a ``finish`` by hand ("then finish it again"), which the
    worker's reasons leave out."""
    queue, env = world["queue"], world["env"]
    job = publish(queue, env, shell_job("head -c 200000 /dev/zero | tr '\\0' x"), "prints")
    work = limited(env, *WORK, fsize=64 * 1024)
    assert TRACEBACK not in work.err, work
    state = queue.state(job)
    if state == "claimed":
        refused(work, "EFBIG")
        return
    record = json.loads((queue.dir / state / f"{job}.result").read_text())
    said = f"{record.get('reason')} {work.out} {work.err}"
    assert "stays claimed" not in said and "no result of it was written" not in said, record
    assert "finish it again" not in said, record


@needs_root
def test_a_session_line_torn_by_the_file_size_limit_is_cut_and_never_glued(world):
    """S-5, S-2, T-7, §6 ``ctx run --native``: a call whose ``tool_call`` meets the file-size
    limit does not run the tool and says so (``EFBIG``, stage ``session``); one whose
    ``tool_result`` meets it ran, and says its result could not be recorded.  Each leaves at
    most a torn last line, which ``session show`` skips and ``session repair`` cuts even under
    a zero limit (a truncation needs no room); the next call's first append cuts it too, so no
    fragment is ever glued to a whole event."""
    root, env, out = world["root"], world["env"], world["out"]
    log = events_path(root, pwd.getpwnam("nobody").pw_uid, "s1")
    call = ("run", "--native", "--agent", AGENT, "--session", "s1", "shell.exec")
    marker = out / "ran"
    given = json.dumps({"cmd": f"echo ran >> {marker}"})
    first = ctx_run(*call, input=given, env=env)
    assert first.rc == 0, first
    marker.unlink()
    pair = log.read_bytes().splitlines(keepends=True)[-2:]

    size = log.stat().st_size
    cut = limited(env, *call, input=given, fsize=size + 60)
    assert cut.rc == 1 and TRACEBACK not in cut.err, cut
    error = frames(cut)[-1]["error"]
    assert (error["error"], error["stage"]) == ("EFBIG", "session"), cut
    assert "the tool did not run" in error["message"] and not marker.exists(), cut
    torn = log.read_bytes()
    assert len(torn) == size + 60 and not torn.endswith(b"\n")
    shown = limited(env, "session", "show", AGENT, "s1", "--json", fsize=size + 60)
    assert shown.rc == 0 and "ends with a torn line" in shown.err, shown
    repaired = limited(env, "session", "repair", AGENT, "s1", fsize=0)
    assert repaired.rc == 0 and "truncated a torn last line of 60 bytes" in repaired.out, repaired
    assert log.read_bytes() == torn[:size]

    room = len(pair[0]) + len(pair[1]) // 2
    half = limited(env, *call, input=given, fsize=size + room)
    assert half.rc == 1 and TRACEBACK not in half.err, half
    error = frames(half)[-1]["error"]
    assert (error["error"], error["stage"]) == ("EFBIG", "record"), half
    assert marker.read_text() == "ran\n", "the tool ran: its call was recorded whole"
    assert not log.read_bytes().endswith(b"\n")

    again = ctx_run(*call, input=given, env=env)
    assert again.rc == 0, again
    events = whole_lines(log)
    assert [e["type"] for e in events[-2:]] == ["tool_call", "tool_result"], events
    assert all(set(e) >= {"ts", "type"} for e in events)
    calls = [e["call"] for e in events if e["type"] == "tool_call"]
    results = [e["call"] for e in events if e["type"] == "tool_result"]
    # The first call and the last are whole pairs; the one whose result was torn keeps its
    # tool_call; the one that never ran left nothing once its torn tool_call was cut.
    assert len(calls) == len(set(calls)) == 3 and len(results) == 2, events
    assert set(results) < set(calls)
    nothing = ctx_run("session", "repair", AGENT, "s1", env=env)
    assert nothing.rc == 0 and "nothing to do" in nothing.out, nothing


@needs_root
def test_a_bootstrap_and_an_install_cut_by_the_file_size_limit_complete_when_run_again(
    world, scratch
):
    """R-5, T-8: ``ctx bootstrap`` of a new root under a 64 KiB file-size limit stops with
    ``EFBIG`` naming what it left (exit 1, no traceback); run again without the limit it
    completes the root: every entry a bootstrap makes is there.  A reinstall whose executable is
    past the limit is refused saying the previous version is still in place, which it is,
    whole, with no staging name left; without the limit it installs the new version whole."""
    fresh = scratch / "fresh"
    env = clean_env(XDG_CACHE_HOME=str(scratch / "cache"))
    cut = limited(env, "bootstrap", "--storage", fresh, fsize=64 * 1024)
    refused(cut, "EFBIG")
    assert f"bootstrap of {fresh} left " in cut.err
    assert f"run 'ctx bootstrap --storage {fresh}' again" in cut.err, cut
    completed = ctx_run("bootstrap", "--storage", fresh, env=env)
    assert completed.rc == 0 and "problem" not in completed.out, completed
    reference = world["root"]
    for tier in ("tool", "bin"):
        made = {p.name for p in (fresh / tier).iterdir()}
        wanted = {p.name for p in (reference / tier).iterdir() if p.name != "demo"}
        assert made == wanted, tier
        for p in (fresh / tier).iterdir():
            assert p.name.startswith(".") or p.is_dir() or p.stat().st_size > 0, p

    root, env = world["root"], world["env"]
    source = scratch / "src"
    versions = {}
    for version, pages in ((1, 2), (2, 60)):
        padding = "".join(f"# v {version} {'x' * 60}\n" for _ in range(pages * PAGE // 70))
        program = f"#!/bin/sh\n{padding}echo version {version}\n"
        versions[version] = program.encode()
        tool_manifest(
            source / str(version),
            "demo",
            program,
            description=f"Version {version} of the test tool.",
        )
    install = ("object", "install", "--tier", "system")
    assert ctx_run(*install, source / "1" / "demo.json", env=env).rc == 0
    bigger = limited(env, *install, source / "2" / "demo.json", fsize=64 * 1024)
    refused(bigger, "EFBIG")
    assert "the previous version is still in place" in bigger.err, bigger
    assert (root / "tool" / "demo").read_bytes() == versions[1]
    assert (root / "tool" / "demo.d" / "description").read_text().startswith("Version 1")
    staged = {n for n in os.listdir(root / "tool") if n.startswith(".")}
    assert staged <= {".install-lock"}, staged
    assert ctx_run(*install, source / "2" / "demo.json", env=env).rc == 0
    assert (root / "tool" / "demo").read_bytes() == versions[2]
    assert (root / "tool" / "demo.d" / "description").read_text().startswith("Version 2")


# ------------------------------------------------------------------------------ RLIMIT_NOFILE


def test_recover_reconcile_with_few_descriptors_repairs_only_whole_steps(storage, tmp_path):
    """Q-5, Q-6, I-1, I-5, §2.4: with every crash leftover of docs/queue.md in the queue,
    ``recover --reconcile`` run with 5 … 16 descriptors either finishes (exit 0, consistent)
    or stops with ``EMFILE`` (exit 1, no traceback); between two runs every request is in
    exactly one place, none lost; once descriptors are back one run completes every repair,
    and a second one changes nothing."""
    queue = QueueCLI(storage, "proj")
    env = env_for(storage, tmp_path / "cache")
    expected = leftovers(queue, env)
    names = set(expected)
    for n in (5, 8, 11, 12, 13, 14, 16):
        run = limited(env, "queue", "recover", "--project", "proj", "--reconcile", nofile=n)
        assert TRACEBACK not in run.err, run
        if run.rc == 0:
            assert "queue consistent" in run.out, run
        else:
            assert run.rc == 1 and ("EMFILE" in run.err or "EMFILE" in run.out), run
        places = queue.requests()
        assert set(places) == names, (n, places)
        assert all(len(where) == 1 for where in places.values()), (n, places)
    final = queue.run("recover", "--reconcile", env=env)
    assert final.rc == 0, final
    assert_consistent(queue, env, expected)


def test_an_emfile_line_of_recover_names_the_remedy(storage, tmp_path):
    """Q-5, docs/queue.md ("A step refused for want of a resource … is never bare", recover's
    ``error`` lines): when descriptors run out while recover handles a job, its ``error``
    line names what ran short and the remedy (``raise the limit of open files ('ulimit
    -n')``), as every other EMFILE refusal of the queue does."""
    queue = QueueCLI(storage, "proj")
    env = env_for(storage, tmp_path / "cache")
    leftovers(queue, env)
    bare = []
    for n in range(11, 21):
        run = limited(env, "queue", "recover", "--project", "proj", "--reconcile", nofile=n)
        assert TRACEBACK not in run.err, run
        said = [line for line in (run.out + run.err).splitlines() if "EMFILE" in line]
        bare += [line for line in said if "ulimit -n" not in line]
        if run.rc == 0:
            break
    assert bare == []


@needs_root
def test_a_pre_hook_short_of_descriptors_does_not_fail_the_job_for_good(world):
    """T-6, W-1, docs/tools.md ("A stage that cannot judge because the host is short of …
    descriptors … refuses with that errno rather than with a verdict … ``ctx queue work``
    leaves such a job claimed and stops"): a worker run with 21 … 24 descriptors, its tool
    guarded by a pre-hook that always allows, stops with ``EMFILE`` or runs the job; once
    descriptors are back, ``recover`` and a drain run every job, each ends in ``done/`` once,
    and none was ever failed for a veto the hook never gave."""
    root, queue, env, out = world["root"], world["queue"], world["env"], world["out"]
    hook = root / "tool" / "shell.exec.d" / "hooks" / "pre.d" / "10-allow"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    jobs = []
    for n in range(21, 25):
        job = publish(queue, env, shell_job(f"echo run >> {out}/h{n}"), f"h{n}")
        jobs.append(job)
        work = limited(env, *WORK, nofile=n)
        assert TRACEBACK not in work.err, work
        assert work.rc == 0 or work.err.startswith("ctx: EMFILE: "), work
    assert queue.run("recover", env=env).rc == 0
    drained = queue.run("work", "--agent", AGENT, "--drain", env=env)
    assert drained.rc == 0, drained
    assert_consistent(queue, env, {job: queue.state(job) for job in jobs})
    vetoed = {
        job: json.loads((queue.dir / "failed" / f"{job}.result").read_text())["reason"]
        for job in jobs
        if queue.state(job) == "failed"
    }
    assert vetoed == {}


# ------------------------------------------------------------------------------ RLIMIT_NPROC


@pytest.fixture
def user_world(unprivileged_user, searchable_storage, scratch) -> dict:
    """The bootstrapped root (queue ``proj``) given to the second real uid, who then owns it
    (the host administrator of its own root), and agent ``ci`` it created (running as that
    uid) allowed ``shell.exec`` by both policies."""
    user = unprivileged_user
    home = scratch / "home"
    home.mkdir()
    storage = searchable_storage
    for path in (home, storage, *storage.rglob("*")):
        os.chown(path, user.uid, user.gid, follow_symlinks=False)
    env = clean_env(CTX_STORAGE=str(storage), HOME=str(home), XDG_CACHE_HOME=str(home / "cache"))
    env.pop("XDG_DATA_HOME", None)
    env.pop("XDG_RUNTIME_DIR", None)
    agent = {"name": AGENT, "label": "ci_t", "tools": ["shell.exec"]}
    made = limited(env, "agent", "create", "-", input=json.dumps(agent), user=user, cwd=home)
    assert made.rc == 0, made
    with open(storage / "tool" / "shell.exec.d" / "policy", "a") as policy:
        policy.write("allow ci_t tool:shell.exec execute\n")
    return {"user": user, "home": home, "env": env, "queue": QueueCLI(storage, "proj")}


@needs_root
def test_one_process_for_the_user_refuses_what_forks_and_keeps_the_rest(user_world):
    """T-3, S-5, W-1, Q-1 … Q-5: for a non-root uid at ``RLIMIT_NPROC`` 1, ``ctx run`` (either
    mode) cannot start the tool: ``EAGAIN``, exit 126 (terminal) or 1 with a result frame of
    stage ``run`` (native), and the tool did not run; the session holds whole lines, one
    ``tool_result`` per ``tool_call``.  The queue commands, which start no process, work: a
    publish, a claim, a finish, ``recover --reconcile`` and ``session repair``; and ``ctx queue
    work`` loses no job: what it could not run stays pending or claimed for ``recover``."""
    user, home, env, queue = (user_world[k] for k in ("user", "home", "env", "queue"))

    def as_user(*args, input: str = "", nproc: int | None = 1) -> Run:
        return limited(env, *args, input=input, user=user, cwd=home, nproc=nproc)

    marker = home / "ran"
    given = json.dumps({"cmd": f"echo ran >> {marker}"})
    terminal = as_user("run", "--agent", AGENT, "shell.exec", given)
    assert terminal.rc == 126 and terminal.err.startswith("ctx: EAGAIN: "), terminal
    native = as_user("run", "--native", "--agent", AGENT, "shell.exec", input=given)
    assert native.rc == 1 and TRACEBACK not in native.err, native
    error = frames(native)[-1]["error"]
    assert (error["error"], error["stage"]) == ("EAGAIN", "run"), native
    assert not marker.exists()
    events = whole_lines(events_path(queue.storage, user.uid, "default"))
    calls = [e["call"] for e in events if e["type"] == "tool_call"]
    assert sorted(calls) == sorted(e["call"] for e in events if e["type"] == "tool_result")
    assert len(calls) == 2, events
    assert all(e["status"] == "error" for e in events if e["type"] == "tool_result"), events

    published = as_user(*PUBLISH, "-", input=json.dumps(STAT_JOB))
    assert published.rc == 0, published
    job = published.out.strip()
    holder = subprocess.Popen(["sleep", "60"], user=user.uid, group=user.gid, extra_groups=[])
    try:
        claimed = as_user("queue", "claim", "--project", "proj", "--pid", holder.pid)
        assert claimed.out.strip() == job, claimed
        finished = as_user("queue", "finish", "--project", "proj", job, "--ok", "-", input="{}")
        assert finished.rc == 0, finished
    finally:
        holder.kill()
        holder.wait()
    recovered = as_user("queue", "recover", "--project", "proj", "--reconcile")
    assert recovered.rc == 0 and "queue consistent" in recovered.out, recovered
    repaired = as_user("session", "repair", AGENT, "default")
    assert repaired.rc == 0, repaired

    second = as_user(*PUBLISH, "-", input=json.dumps(STAT_JOB))
    assert second.rc == 0, second
    work = as_user(*WORK)
    assert work.rc != 0, work
    left = second.out.strip()
    assert queue.state(left) in ("pending", "claimed"), work
    assert queue.entries("inbox") == set()
    recover = as_user("queue", "recover", "--project", "proj", "--reconcile", nproc=None)
    assert recover.rc == 0, recover
    assert queue.requests() == {job: ["done"], left: ["pending"]}


@needs_root
def test_a_worker_that_cannot_start_a_thread_says_eagain(user_world):
    """§2.4, W-2, CONVENTIONS (errors carry an errno): ``ctx queue work --drain`` for a uid
    at ``RLIMIT_NPROC`` 1 cannot start its lease keeper or any tool; it says so as every ctx
    error is said, ``ctx: EAGAIN: …`` naming what ran short, exit 1, and claims nothing."""
    user, home, env, queue = (user_world[k] for k in ("user", "home", "env", "queue"))
    published = limited(env, *PUBLISH, "-", input=json.dumps(STAT_JOB), user=user, cwd=home)
    assert published.rc == 0, published
    job = published.out.strip()
    work = limited(env, *WORK, user=user, cwd=home, nproc=1)
    assert queue.state(job) == "pending"
    assert TRACEBACK not in work.err, work
    refused(work, "EAGAIN")


# ------------------------------------------------------------------------------ RLIMIT_AS/DATA


@needs_root
def test_a_command_short_of_memory_says_enomem_and_changes_nothing(world, child):
    """§2.4, Q-1, Q-4, T-3, docs/tools.md (memory is a host shortage, ``ENOMEM``): under an
    address-space or data limit too small for what they are given, ``publish --batch`` of 32
    requests of 1 MiB, ``finish`` of a 15 MB result and ``ctx run --native`` of a 15 MB input
    either succeed or stop with ``ctx: ENOMEM: …`` (exit 1, never a traceback); nothing is
    published, the job stays claimed, no tool runs."""
    queue, env, out = world["queue"], world["env"], world["out"]
    wrong = []

    def said_enomem(run: Run) -> bool:
        if TRACEBACK in run.err or run.rc != 1:
            return False
        if run.err.startswith("ctx: ENOMEM: "):
            return True
        last = frames(run)[-1:] if run.out.startswith("{") else []
        return bool(last) and (last[0].get("error") or {}).get("error") == "ENOMEM"

    pad = "x" * (MIB - 100)
    lines = "".join(json.dumps({**STAT_JOB, "n": n, "pad": pad}) + "\n" for n in range(32))
    batch = limited(env, *PUBLISH, "--batch", "-", input=lines, address_space=64 * MIB)
    if batch.rc == 0:
        assert len(queue.requests()) == 32, batch
        shutil.rmtree(queue.dir / "pending")
        (queue.dir / "pending").mkdir()
    else:
        assert batch.out == "" and queue.requests() == {}, batch
        assert queue.entries("inbox") == set()
        if not said_enomem(batch):
            wrong.append(batch)

    job = publish(queue, env, STAT_JOB, "big-result")
    assert claim(queue, env, child.pid) == job
    big = json.dumps({"data": "y" * 15_000_000})
    finish_it = ("queue", "finish", "--project", "proj", job, "--ok", "-")
    finish = limited(env, *finish_it, input=big, address_space=48 * MIB)
    if finish.rc == 0:
        assert queue.state(job) == "done"
    else:
        assert queue.state(job) == "claimed" and queue.entries("inbox") == set()
        assert queue.entries("done") == set()
        if not said_enomem(finish):
            wrong.append(finish)

    given = json.dumps({"cmd": f"echo ran >> {out}/native", "stdin": "z" * 15_000_000})
    call = ("run", "--native", "--agent", AGENT, "--session", "mem", "shell.exec")
    native = limited(env, *call, input=given, data=48 * MIB)
    if native.rc != 0:
        assert not (out / "native").exists()
        if not said_enomem(native):
            wrong.append(native)
    assert wrong == [], wrong


@needs_root
def test_a_worker_short_of_memory_does_not_fail_the_job_for_good(world):
    """W-1, W-4, docs/workers.md ("A host that runs short": memory, ``ENOMEM``, the job stays
    claimed and the worker stops), docs/tools.md: a worker under a 64 MiB address-space limit
    given a job that prints 12 MB (under the runner's output limit) does not record the
    host's shortage as the job's failure; once memory is back, ``recover`` and a drain finish
    it in ``done/``."""
    queue, env = world["queue"], world["env"]
    job = publish(queue, env, shell_job("head -c 12000000 /dev/zero | tr '\\0' x"), "wide")
    work = limited(env, *WORK, address_space=64 * MIB)
    assert TRACEBACK not in work.err, work
    assert queue.entries("inbox") == set()
    state = queue.state(job)
    assert state in ("done", "failed", "claimed"), state
    failed_for = ""
    if state == "failed":
        failed_for = json.loads((queue.dir / "failed" / f"{job}.result").read_text())["reason"]
    assert state != "failed", failed_for
    if work.rc != 0:
        refused(work, "ENOMEM")
    assert queue.run("recover", env=env).rc == 0
    assert queue.run("work", "--agent", AGENT, "--drain", env=env).rc == 0
    assert queue.state(job) == "done"


# ------------------------------------------------------------------------------ RLIMIT_CPU


JOBS_UNDER_CPU_LIMIT = 80  # each costs the worker a few ms of CPU: more than it is left


@needs_root
def test_a_worker_killed_by_its_cpu_limit_mid_drain_loses_and_repeats_nothing(world):
    """W-1, W-3, Q-5, Q-6, I-1, I-3, I-4, I-5: a worker whose ``RLIMIT_CPU`` runs out while it
    drains 80 jobs (each printing 200 kB: together more than the 0.15 s of CPU the worker
    is left once started, on a fast machine too) dies of ``SIGXCPU`` (or ``SIGKILL`` at the
    hard limit) wherever it is; ``recover --reconcile`` then requeues or completes what it held and
    removes its temp file, a drain without the limit finishes the rest, every job is in
    ``done/`` once, and only the job the killed worker held may have run twice."""
    queue, env, out = world["queue"], world["env"], world["out"]
    lines = "".join(
        json.dumps(shell_job(f"head -c 200000 /dev/zero | tr '\\0' x; echo run >> {out}/c{n}"))
        + "\n"
        for n in range(JOBS_UNDER_CPU_LIMIT)
    )
    published = queue.run("publish", "--batch", "-", input=lines, env=env)
    assert published.rc == 0, published
    jobs = published.lines()
    work = limited(env, *WORK, cpu=1, cpu_spent=0.85)
    assert work.rc in (-signal.SIGXCPU, -signal.SIGKILL), work
    assert queue.entries("claimed") <= set(jobs)

    recovered = queue.run("recover", "--reconcile", "--grace", "0", env=env)
    assert recovered.rc == 0 and TRACEBACK not in recovered.err, recovered
    assert queue.entries("inbox") == set()
    drained = queue.run("work", "--agent", AGENT, "--drain", env=env)
    assert drained.rc == 0, drained
    assert_consistent(queue, env, dict.fromkeys(jobs, "done"))
    runs = [(out / f"c{n}").read_text().count("run") for n in range(JOBS_UNDER_CPU_LIMIT)]
    assert min(runs) == 1 and sum(runs) - len(runs) <= 1, runs
