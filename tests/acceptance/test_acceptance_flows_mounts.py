"""End-to-end flows of ``ctx mount`` (SPEC §13 F-1) used together with the queue (§2) and
the workers (§3), and of the ready worker programs of ``workers/`` (W-5) as a user starts
them: a queue published and watched through a mount while a worker runs, mounts ended under
load, two mounts of one root, and the ready programs stopped mid-job."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MOUNT_WAIT,
    REPO,
    ROOT_ENTRIES,
    QueueCLI,
    clean_env,
    ctx_mount,
    ctx_run,
    mounted_at,
    needs_fuse_as_root,
    wait_for,
)
from tests.acceptance.workercli import (
    AGENT,
    allow_in_tool_policy,
    make_agent,
    result_of,
    shell_job,
)
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root")

# ------------------------------------------------------------------------------ helpers


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_by_hand(queue_dir: Path, name: str, req: dict) -> str:
    """Q-1 as SPEC and docs/queue.md spell it, done with plain file calls: the request written
    to ``inbox/J.publish.tmp`` and fsynced, moved to ``pending/J`` without replacing
    (``link`` + ``unlink``), then ``pending/`` and ``inbox/`` fsynced."""
    job = f"{name}.req.json"
    temp = queue_dir / "inbox" / f"{job}.publish.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, json.dumps(req).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.link(temp, queue_dir / "pending" / job)
    os.unlink(temp)
    fsync_dir(queue_dir / "pending")
    fsync_dir(queue_dir / "inbox")
    return job


def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        argv,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def work_argv(queue: QueueCLI, *args: str) -> list[str]:
    return [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT, *args]


def session_events(storage: Path, session: str = "worker") -> list[dict]:
    """S-1: ``home/<uid>/agent/<agent>/session/<session>/events.jsonl``, one event a line."""
    found = list(storage.glob(f"home/*/agent/{AGENT}/session/{session}/events.jsonl"))
    assert len(found) == 1, found
    return [json.loads(line) for line in found[0].read_text().splitlines() if line.strip()]


def events_of(events: list[dict], job: str) -> list[str]:
    return [e["type"] for e in events if job in json.dumps(e)]


# ------------------------------------------------------------------- F-1 with §2 and §3


@needs_fuse_as_root
@needs_root
def test_flow_a_queue_published_and_watched_through_the_mount_while_a_worker_drains_it(
    storage, queue, agent, outbox, tmp_path
):
    """F-1 with Q-1..Q-3 and W-1/W-2: requests published by hand through the host view (temp
    in ``inbox/``, fsync, no-replace link into ``pending/``) are run by a ``--drain`` worker on
    the storage root; the claim, the lease naming that worker and the results are readable
    through the mount while it runs, byte for byte what lies on disk."""
    view = tmp_path / "ctx"
    with ctx_mount(storage, view):
        mq = view / "shared" / queue.project / "queue"
        assert set(os.listdir(mq)) >= {"inbox", "pending", "lease", "claimed", "done", "failed"}
        first = publish_by_hand(
            mq, "slow", shell_job(f"touch {outbox}/started; sleep 1.5; echo first")
        )
        # the name is taken; a second no-replace move of it is refused, never overwrites.
        with pytest.raises(FileExistsError):
            os.link(mq / "pending" / first, mq / "pending" / first)
        assert os.listdir(mq / "inbox") == []
        assert (queue.dir / "pending" / first).is_file()  # on disk, not only in the view

        proc = start(work_argv(queue, "--drain", "--json"), clean_env(CTX_STORAGE=str(storage)))
        try:
            assert wait_for(lambda: (outbox / "started").exists(), 20), proc.poll()
            # seen through the mount: claimed/J/J and lease/J/worker, the lease naming
            # the worker process that runs it.
            assert wait_for(lambda: os.listdir(mq / "claimed") == [first], 5)
            assert os.listdir(mq / "pending") == []
            assert os.listdir(mq / "claimed" / first) == [first]
            lease = json.loads((mq / "lease" / first / "worker").read_text())
            assert lease["pid"] == proc.pid, lease
            st = os.stat(mq / "lease" / first / "worker")
            assert st.st_size == (queue.dir / "lease" / first / "worker").stat().st_size
            # Published through the mount while the first job runs: the drain takes it too.
            second = publish_by_hand(mq, "quick", shell_job("printf '{\"n\": 2}'"))
            out, err = proc.communicate(timeout=60)
        finally:
            stop(proc)
        assert proc.returncode == 0, err
        finishes = [json.loads(line) for line in out.splitlines()]
        assert sorted(e["job"] for e in finishes if e.get("event") == "finish") == sorted(
            [first, second]
        )
        # Results readable through the mount, the same bytes as on the storage root.
        for job in (first, second):
            assert sorted(os.listdir(mq / "done")) == sorted(
                [first, f"{first}.result", second, f"{second}.result"]
            )
            seen = (mq / "done" / f"{job}.result").read_bytes()
            assert seen == (queue.dir / "done" / f"{job}.result").read_bytes()
        assert json.loads((mq / "done" / f"{first}.result").read_bytes())["status"] == "ok"
        assert result_of(queue, second)["output"] == {"n": 2}
        for sub in ("pending", "claimed", "lease", "inbox"):
            assert os.listdir(mq / sub) == [], sub


@needs_fuse_as_root
@needs_root
def test_flow_a_worker_working_through_the_mount_keeps_it_busy_until_it_exits(
    storage, queue, agent, outbox, tmp_path
):
    """F-1 and docs/mount.md: a queue may be worked all through one mount (``ctx queue work
    --queue MNT/shared/P/queue``); while the worker runs a job there, ``ctx umount`` is
    ``EBUSY`` and leaves the mount and the job alone; once the worker has drained the queue
    and exited, ``ctx umount`` succeeds and ``ctx mount`` exits 0."""
    view = tmp_path / "ctx"
    with ctx_mount(storage, view) as mount:
        mq = view / "shared" / queue.project / "queue"
        job = publish_by_hand(mq, "held", shell_job(f"touch {outbox}/started; sleep 2; echo ok"))
        # The queue through the mount (--queue); the agent's tools from the storage root its
        # mount file names (--storage).
        argv = [*CTX_ARGV, "queue", "work", "--queue", str(mq), "--storage", str(storage)]
        proc = start([*argv, "--agent", AGENT, "--drain"], clean_env())
        try:
            assert wait_for(lambda: (outbox / "started").exists(), 20), proc.poll()
            busy = ctx_run("umount", view)
            assert busy.rc == 1 and "EBUSY" in busy.err, busy
            assert mounted_at(view) and set(os.listdir(view)) == ROOT_ENTRIES
            out, err = proc.communicate(timeout=60)
        finally:
            stop(proc)
        assert proc.returncode == 0, err
        assert queue.state(job) == "done", (out, err)
        done = ctx_run("umount", view)
        assert done.rc == 0, done
        mount.wait(timeout=MOUNT_WAIT)
        assert mount.returncode == 0
        assert not mounted_at(view) and os.listdir(view) == []


@needs_fuse_as_root
@needs_root
def test_flow_sigterm_to_the_mount_while_a_worker_runs_on_the_root(
    storage, queue, agent, outbox, tmp_path
):
    """F-1: SIGTERM to ``ctx mount`` unmounts cleanly (exit 0, nothing left mounted, no
    ``ENOTCONN``) even while a reader watches the queue and a worker on the storage root runs
    a job; the worker is not disturbed, and a new mount shows its result."""
    view = tmp_path / "ctx"
    job = queue.publish(shell_job(f"touch {outbox}/started; sleep 1; echo survived"))
    proc = start(work_argv(queue, "--drain"), clean_env(CTX_STORAGE=str(storage)))
    try:
        with ctx_mount(storage, view) as mount:
            mq = view / "shared" / queue.project / "queue"
            assert wait_for(lambda: (outbox / "started").exists(), 20), proc.poll()
            assert os.listdir(mq / "claimed") == [job]
            mount.send_signal(signal.SIGTERM)
            mount.wait(timeout=MOUNT_WAIT)
            assert mount.returncode == 0, mount.stderr.read()
            assert not mounted_at(view)
            assert os.listdir(view) == []  # the bare directory, no dead endpoint
        _out, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 0, err
    assert queue.state(job) == "done"
    with ctx_mount(storage, view):
        mq = view / "shared" / queue.project / "queue"
        res = json.loads((mq / "done" / f"{job}.result").read_text())
        assert res["status"] == "ok" and "survived" in json.dumps(res["output"]), res


@needs_fuse_as_root
def test_flow_two_mounts_of_one_root_see_each_others_changes_but_not_locks(
    storage, queue, tmp_path
):
    """F-1 with docs/mount.md: two mounts of one storage root serve at once; a request
    published through one appears in the other within a second, a finish made on the root
    shows in both, ``flock`` excludes only within one mount (as documented), and ending one
    mount leaves the other serving."""
    a, b = tmp_path / "a", tmp_path / "b"
    with ctx_mount(storage, a), ctx_mount(storage, b) as mount_b:
        qa = a / "shared" / queue.project / "queue"
        qb = b / "shared" / queue.project / "queue"
        job = publish_by_hand(qa, "both", shell_job("echo hi"))
        assert wait_for(lambda: os.listdir(qb / "pending") == [job], 2)
        assert (qb / "pending" / job).read_bytes() == (qa / "pending" / job).read_bytes()
        # The job name is taken for every publisher: ctx queue publish on the root says EEXIST.
        again = queue.run("publish", "--name", "both", "-", input=json.dumps(shell_job("x")))
        assert again.rc == 1 and "EEXIST" in again.err, again

        claimed = queue.claim()
        assert claimed == job
        queue.finish(job, output={"via": "root"})
        for q in (qa, qb):
            assert wait_for(lambda q=q: (q / "done" / f"{job}.result").is_file(), 2)
            assert json.loads((q / "done" / f"{job}.result").read_text())["output"] == {
                "via": "root"
            }
            assert os.listdir(q / "pending") == []

        # Locks: one mount's flock excludes another holder through the same mount only.
        target = qa / "config"
        with open(target) as one, open(target) as two, open(qb / "config") as other:
            fcntl.flock(one, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with pytest.raises(BlockingIOError):
                fcntl.flock(two, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another mount: not seen

        mount_b.send_signal(signal.SIGTERM)
        mount_b.wait(timeout=MOUNT_WAIT)
        assert mount_b.returncode == 0
        assert not mounted_at(b) and mounted_at(a)
        assert set(os.listdir(a)) == ROOT_ENTRIES


# ------------------------------------------------------------------------------ W-5


def ready_argv(program: str, queue: QueueCLI, *args: str) -> list[str]:
    """Started as docs/workers.md and workers/README.md show: the program itself, with
    ``--project`` and ``--agent`` and the storage root in ``$CTX_STORAGE``."""
    return [str(REPO / "workers" / program), "--project", queue.project, "--agent", AGENT, *args]


@needs_root
@pytest.mark.parametrize(
    ("program", "signum"),
    [
        ("shell_worker.py", signal.SIGTERM),
        ("tool_worker.py", signal.SIGTERM),
        ("shell_worker.py", signal.SIGHUP),
    ],
)
def test_flow_a_ready_worker_stopped_by_sigterm_mid_job_finishes_it_and_claims_no_more(
    storage, queue, agent, outbox, program, signum
):
    """W-5 with W-4 and S-5: a ready program, stopped by SIGTERM (or SIGHUP) while a job
    runs, lets that job finish in ``done/``, claims nothing more, exits 0 with a ``stop``
    event naming the signal, and its session holds the claim, start and finish of the job
    around its call, as for ``ctx queue work``."""
    running = queue.publish(
        shell_job(f"touch {outbox}/started; sleep 1.5; printf '{{\"finished\": true}}'"),
        name="a-running",
    )
    later = queue.publish(shell_job(f"touch {outbox}/later"), name="b-later")
    env = clean_env(CTX_STORAGE=str(queue.storage))
    proc = start(ready_argv(program, queue, "--json"), env)
    try:
        assert wait_for(lambda: (outbox / "started").exists(), 20), proc.poll()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        stop(proc)
    assert proc.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert events[-1]["event"] == "stop", events
    assert events[-1]["stopped_by"] == signal.Signals(signum).name, events
    assert [e["job"] for e in events if e.get("event") == "finish"] == [running], events
    assert queue.state(running) == "done"
    res = result_of(queue, running)
    assert res["status"] == "ok" and res["output"] == {"finished": True}, res
    assert res["exit_status"] == 0, res
    assert queue.state(later) == "pending" and not (outbox / "later").exists()
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()

    kinds = events_of(session_events(queue.storage), running)
    assert {"queue.claim", "queue.start", "queue.finish"} <= set(kinds), kinds
    assert kinds.index("queue.claim") < kinds.index("queue.finish")
    types = [e["type"] for e in session_events(queue.storage)]
    assert "tool_call" in types and "tool_result" in types, types

    # Started again with --drain, it takes what was left and exits 0.
    drained = subprocess.run(
        ready_argv(program, queue, "--drain"), env=env, capture_output=True, text=True, timeout=60
    )
    assert drained.returncode == 0, drained.stderr
    assert queue.state(later) == "done" and (outbox / "later").exists()
    lines = [json.loads(line) for line in drained.stdout.splitlines()]
    assert [e["job"] for e in lines if e.get("event") == "finish"] == [later], lines


@needs_root
def test_flow_shell_and_tool_workers_share_one_queue_each_job_once(storage, queue, outbox):
    """W-5 with W-3: a shell-command worker and a tool-call worker drain one project queue
    side by side; every job runs exactly once, the shell worker never takes (nor fails) a job
    of another tool, and a failing command ends in ``failed/`` with its exit status."""
    make_agent(storage, ["shell.exec", "fs.stat"])
    allow_in_tool_policy(storage, "shell.exec")
    allow_in_tool_policy(storage, "fs.stat")
    log = outbox / "runs"
    shells = [
        queue.publish(shell_job(f"echo {n} >> {log}; sleep 0.1"), name=f"s{n:02d}")
        for n in range(8)
    ]
    stats = [
        queue.publish({"tool": "fs.stat", "input": {"path": "/ctx/bin"}}, name=f"t{n}")
        for n in range(3)
    ]
    failing = queue.publish(shell_job("echo doomed >&2; exit 3"), name="x-fail")
    env = clean_env(CTX_STORAGE=str(queue.storage))
    shell = start(ready_argv("shell_worker.py", queue, "--drain", "--concurrency", "2"), env)
    tool = start(ready_argv("tool_worker.py", queue, "--drain"), env)
    try:
        s_out, s_err = shell.communicate(timeout=90)
        t_out, t_err = tool.communicate(timeout=90)
    finally:
        stop(shell)
        stop(tool)
    assert shell.returncode == 0, s_err
    assert tool.returncode == 0, t_err
    by_shell = {json.loads(x)["job"] for x in s_out.splitlines() if '"finish"' in x}
    by_tool = {json.loads(x)["job"] for x in t_out.splitlines() if '"finish"' in x}
    assert not by_shell & by_tool
    assert by_shell | by_tool == {*shells, *stats, failing}
    assert not by_shell & set(stats), by_shell
    assert sorted(log.read_text().split(), key=int) == [str(n) for n in range(8)]
    assert [queue.state(j) for j in shells] == ["done"] * 8
    for job in stats:
        assert queue.state(job) == "done", result_of(queue, job)
    assert queue.state(failing) == "failed"
    res = result_of(queue, failing)
    assert res["exit_status"] == 3 and "doomed" in json.dumps(res), res
    assert queue.entries("pending") == set() and queue.entries("claimed") == set()


@needs_root
def test_flow_a_ready_worker_aborted_by_two_interrupts_leaves_its_job_to_recover(
    storage, queue, agent, outbox
):
    """W-5 with W-4, Q-5 and S-5: ^C twice aborts a ready program: exit 130, the running
    tool killed, its job left claimed with no result; the session's ``tool_result`` says
    ``EINTR`` at stage ``run``; ``ctx queue recover`` requeues it and the other ready
    program runs it exactly once."""
    again = outbox / "again"
    cmd = f"echo run >> {outbox}/runs; [ -e {again} ] && exit 0; touch {outbox}/started; sleep 30"
    job = queue.publish(shell_job(cmd), name="long")
    env = clean_env(CTX_STORAGE=str(queue.storage))
    proc = start(ready_argv("shell_worker.py", queue, "--json"), env)
    try:
        assert wait_for(lambda: (outbox / "started").exists(), 20), proc.poll()
        proc.send_signal(signal.SIGINT)
        seen = [json.loads(proc.stdout.readline()) for _ in range(3)]  # start, claim, ...
        assert seen[-1]["event"] == "interrupt", seen
        time.sleep(0.2)  # a person's second ^C
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        stop(proc)
    assert proc.returncode == 130, err
    stopped = json.loads(out.splitlines()[-1])
    assert stopped["event"] == "stop" and stopped["aborted"] is True, stopped
    assert queue.state(job) == "claimed"
    assert not (queue.dir / "done" / f"{job}.result").exists()
    results = [e for e in session_events(queue.storage) if e["type"] == "tool_result"]
    assert results, results
    killed = results[-1]
    assert (killed["errno"], killed["stage"], killed["exit_status"]) == ("EINTR", "run", 137)

    recovered = queue.run("recover")
    assert recovered.rc == 0, recovered
    assert queue.state(job) == "pending"
    again.touch()
    drained = subprocess.run(
        ready_argv("tool_worker.py", queue, "--drain"),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert drained.returncode == 0, drained.stderr
    assert queue.state(job) == "done"
    assert (outbox / "runs").read_text().split() == ["run", "run"]
