"""The error branches of the worker loop, each reached from outside through ``ctx queue work``
and the ready program ``workers/shell_worker.py`` (SPEC §2.4, Q-3, Q-4, Q-5, Q-6, I-4, S-5,
W-1, W-2, W-4, W-5; docs/workers.md "Who may start one", "One job", "A renewal the host
refuses", "A host that runs short", "A lease taken away", "The queue's config while a worker
runs", "Many jobs", "Output"; docs/queue.md "A queue shared by a group"; docs/sessions.md;
``ctx queue work --help``; workers/README.md).

The angle: every way a running worker meets something that is not its job's failure, made by
an operator or a neighbour while it runs — a queue directory made immutable or append-only
before it starts, before a claim or while a job runs; a queue made read-only (a read-only
bind mount) or full (a small tmpfs) under it; the worker's session log made immutable,
rotated into an immutable directory, or replaced by a symbolic or hard link; a result
planted beside the running job; the queue or the whole storage root moved or removed under
a waiting worker; a lease the host will not renew until it lapses; two slots of which one
fails; a queue config whose ``lease_ttl`` no worker may keep.  And, beside them, the job
failures that must *not* stop a worker: a tool that names a host errno (ENOSPC, EMFILE…) on
its own output, a missing tool, bad input, a denial.

Each check reads the exit status, the errno word of the ``ctx: ERRNO: sentence`` line (and
of the ``--json`` error object, the last line after the ``stop`` summary), that the message
names the file, directory or job at fault and the remedy the documents promise, and that
nothing is half-done: the queue byte for byte as the refusal left it, no temp file in
``inbox/``, no job both claimed and finished, no event written through a link, the job's
tool not run (or not run again) where it must not be.  Where the message names a repair
(``chattr -i``, ``ctx queue recover``, ``--ttl``, starting the worker again), the repair is
run and the job is seen finished exactly once."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    QueueCLI,
    alive,
    clean_env,
    new_scratch_dir,
    read_jsonl,
    rfc3339,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.workercli import AGENT, shell_job
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage
from tests.support.scratch_mounts import ScratchMounts
from tests.support.storage import attribute

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the worker's agent runs as another uid, and chattr: needs root"
)

SCRATCH = scratch_top(__file__)
DEADLINE = 30.0
TRACEBACK = "Traceback"
PYTHON = str(REPO / ".venv" / "bin" / "python")
SHELL_WORKER = str(REPO / "workers" / "shell_worker.py")
WORDS = {"i": "immutable", "a": "append-only"}


# ---------------------------------------------------------------------------------- helpers


class Worker:
    """A worker process (``ctx queue work`` or a ready program) whose stdout and stderr are
    read line by line as they come."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [
            threading.Thread(target=self._drain, args=(self.proc.stdout, self.out), daemon=True),
            threading.Thread(target=self._drain, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _drain(pipe, into: list[str]) -> None:
        for line in pipe:
            into.append(line.decode("utf-8", "replace"))

    def events(self) -> list[dict]:
        return [json.loads(line) for line in list(self.out) if line.startswith('{"event"')]

    def until(self, kind: str) -> dict:
        def seen() -> list[dict]:
            return [e for e in self.events() if e["event"] == kind]

        assert wait_for(lambda: bool(seen()), DEADLINE), (self.out, self.err)
        return seen()[0]

    def until_err(self, start: str) -> str:
        def seen() -> list[str]:
            return [line for line in list(self.err) if line.startswith(start)]

        assert wait_for(lambda: bool(seen()), DEADLINE), (self.out, self.err)
        return seen()[0]

    def end(self) -> tuple[int, list[str], str]:
        rc = self.proc.wait(timeout=DEADLINE)
        for reader in self._readers:
            reader.join(DEADLINE)
        return rc, [line.rstrip("\n") for line in self.out], "".join(self.err)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    """The workers a test started; any still running at its end is killed."""
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.kill()


def start(workers: list[Worker], queue: QueueCLI, *args: str, program: str = "ctx") -> Worker:
    """``ctx queue work --agent ci ARGS`` (or the ready program ``program``) on ``queue``."""
    if program == "ctx":
        argv = [*CTX_ARGV, "queue", "work"]
    else:
        argv = [PYTHON, str(REPO / "workers" / program)]
    argv += ["--project", queue.project, "--agent", AGENT, *args]
    worker = Worker(argv, clean_env(CTX_STORAGE=str(queue.storage)))
    workers.append(worker)
    return worker


def drain(queue: QueueCLI, *args: str) -> subprocess.CompletedProcess:
    """A worker draining the queue, to the end."""
    return subprocess.run(
        [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT, "--drain",
         "--json", *args],
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        capture_output=True,
        text=True,
        timeout=DEADLINE * 2,
    )  # fmt: skip


def gated(outbox: Path, tag: str, then: str = "true") -> dict:
    """A shell job that says it started (its pid in ``tag.started``), waits for ``tag.go``,
    notes that it ran to its end (``tag.ran``, one line a run), then runs ``then``."""
    return shell_job(
        f"echo $$ > {outbox}/{tag}.pid; mv {outbox}/{tag}.pid {outbox}/{tag}.started; "
        f"while [ ! -e {outbox}/{tag}.go ]; do sleep 0.02; done; "
        f"echo ran >> {outbox}/{tag}.ran; {then}"
    )


def marked(outbox: Path, tag: str) -> dict:
    """A shell job that notes each run in ``tag.ran``."""
    return shell_job(f"echo ran >> {outbox}/{tag}.ran; echo {tag}")


def runs(outbox: Path, tag: str) -> int:
    path = outbox / f"{tag}.ran"
    return len(path.read_text().splitlines()) if path.exists() else 0


def started_job(outbox: Path, tag: str) -> bool:
    return (outbox / f"{tag}.started").exists()


def pid_of(outbox: Path, tag: str) -> int:
    return int((outbox / f"{tag}.started").read_text())


def release(outbox: Path, tag: str) -> None:
    (outbox / f"{tag}.go").touch()


def events_file(storage: Path) -> Path:
    (path,) = storage.glob(f"home/*/agent/{AGENT}/session/worker")
    return path / "events.jsonl"


def queue_events(storage: Path, job: str) -> list[str]:
    """The ``queue.*`` event types of ``job`` in the worker's session."""
    return [
        e["type"]
        for e in read_jsonl(events_file(storage))
        if e["type"].startswith("queue.") and e.get("object") == f"queue/{job}"
    ]


def error_object(line: str, name: str) -> dict:
    obj = json.loads(line)
    assert set(obj) == {"error", "errno", "message"}, obj
    assert (obj["error"], obj["errno"]) == (name, getattr(errno, name)), obj
    return obj


def stopped_on(rc: int, lines: list[str], err: str, name: str, program: str = "ctx") -> dict:
    """A ``--json`` worker that a slot's error stopped: exit 1, its ``stop`` event and then
    the error object ``name`` as the last two lines of stdout, the same error as the last
    line of stderr; returns the ``stop`` event, with the error object under ``error``."""
    assert TRACEBACK not in err, err
    assert rc == 1, (lines, err)
    error = error_object(lines[-1], name)
    stop = json.loads(lines[-2])
    assert stop["event"] == "stop" and stop["stopped_by"] == "failure", stop
    assert err.rstrip("\n").splitlines()[-1] == f"{program}: {name}: {error['message']}", err
    # The error is the failure the summary names, in the command's form.
    assert stop["failure"].startswith(f"{name}: "), stop
    assert error["message"] == "the worker stopped: " + stop["failure"].partition(": ")[2]
    return {**stop, "error": error}


def refused_at_start(done: subprocess.CompletedProcess, name: str, program: str = "ctx") -> str:
    """A ``--json`` worker refused before it started: exit 1, the error object alone on
    stdout (no ``start``, no ``stop``), the same error on stderr; its message."""
    assert TRACEBACK not in done.stderr, done
    assert done.returncode == 1, done
    (line,) = done.stdout.splitlines()
    error = error_object(line, name)
    last = done.stderr.rstrip("\n").splitlines()[-1]
    assert last == f"{program}: {name}: {error['message']}", done
    return error["message"]


def chattr(flag: str, path: Path) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True)


def needs_chattr(path: Path) -> None:
    if shutil.which("chattr") is None:
        pytest.skip("needs chattr")
    made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is not available here: {made.stderr.strip()}")
    chattr("-i", path)


def idle(worker: Worker) -> None:
    """Wait until the worker has started, then freeze it (SIGSTOP): what is done meanwhile
    meets its next claim, as it wakes."""
    worker.until("start")
    os.kill(worker.proc.pid, signal.SIGSTOP)


def wake(worker: Worker) -> None:
    os.kill(worker.proc.pid, signal.SIGCONT)


def recovered(queue: QueueCLI, job: str) -> None:
    """``ctx queue recover`` (plain) requeues ``job``, whose worker has exited, exit 0."""
    done = queue.run("recover", "--json")
    assert done.rc == 0, done
    assert [r["job"] for r in done.json()["requeued"]] == [job], done
    assert queue.state(job) == "pending"


def finished_once(queue: QueueCLI, job: str, state: str = "done") -> dict:
    got, result = queue.only_result(job)
    assert got == state, (job, got, result)
    return result


# ------------------------------------------ a queue directory pinned before the worker starts

START_PINS = [
    pytest.param("inbox", "i", id="inbox-immutable"),
    pytest.param("pending", "a", id="pending-append-only"),
    pytest.param("lease", "a", id="lease-append-only"),
    pytest.param("done", "i", id="done-immutable"),
]


@pytest.mark.parametrize(("place", "letter"), START_PINS)
def test_a_worker_started_on_a_pinned_state_directory_claims_nothing(
    queue: QueueCLI, agent: str, outbox: Path, place: str, letter: str
) -> None:
    """docs/queue.md "A queue shared by a group" (a directory's immutable or append-only
    attribute refuses root too, and the refusal is EPERM naming the attribute and the
    ``chattr`` that lifts it), docs/workers.md ("A job slot that meets an error …", the
    worker's start): a worker needs every state directory; one pinned refuses it before its
    first claim, exit 1, ``cannot work in queue Q``, the directory, the attribute and
    ``chattr -X DIR``; no ``start`` event, the queue byte for byte as it was, the job's tool
    not run.  Lifted as said, the next worker runs the job once."""
    job = queue.publish(marked(outbox, "pinned"), name="pinned")
    target = queue.dir / place
    before = snapshot(queue.dir)
    with attribute(target, letter):
        done = drain(queue)
        after = snapshot(queue.dir)
    message = refused_at_start(done, "EPERM")
    assert after == before
    assert message.startswith(f"cannot work in queue {queue.dir}: {target} is "), message
    assert WORDS[letter] in message and f"chattr -{letter} {target}" in message, message
    assert runs(outbox, "pinned") == 0
    again = drain(queue)
    assert again.returncode == 0, again
    finished_once(queue, job)
    assert runs(outbox, "pinned") == 1


def test_a_ready_program_started_on_a_pinned_queue_says_so_under_its_own_name(
    queue: QueueCLI, agent: str, outbox: Path
) -> None:
    """W-5, workers/README.md ("Errors are one line on stderr, ``PROGRAM: ERRNO: sentence``,
    with the exit statuses of ``ctx queue work``"): ``shell_worker.py`` on a queue whose
    ``done/`` is immutable exits 1 with ``shell_worker.py: EPERM: cannot work in queue …``
    and the ``chattr -i`` that lifts it, prints nothing on stdout and claims nothing."""
    job = queue.publish(marked(outbox, "ready"), name="ready")
    target = queue.dir / "done"
    with attribute(target, "i"):
        done = subprocess.run(
            [PYTHON, SHELL_WORKER, "--project", queue.project, "--agent", AGENT, "--drain"],
            env=clean_env(CTX_STORAGE=str(queue.storage)),
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
    assert TRACEBACK not in done.stderr and done.returncode == 1, done
    assert done.stdout == "", done
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"shell_worker.py: EPERM: cannot work in queue {queue.dir}: "), line
    assert f"chattr -i {target}" in line, line
    assert queue.state(job) == "pending" and runs(outbox, "ready") == 0


# -------------------------------------------------- a claim refused under a waiting worker

CLAIM_PINS = [
    pytest.param("pending", "a", id="pending-append-only"),
    pytest.param("claimed", "i", id="claimed-immutable"),
    pytest.param("lease", "i", id="lease-immutable"),
    pytest.param("inbox", "a", id="inbox-append-only"),
]


@pytest.mark.parametrize(("place", "letter"), CLAIM_PINS)
def test_a_claim_refused_under_a_waiting_worker_is_undone_and_stops_it(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker], place: str, letter: str
) -> None:
    """docs/workers.md "A host that runs short": "A claim the host refuses midway … is
    undone, the job back in ``pending/``, and the worker stops with that errno, saying ``a
    claim failed (…); a claim refused midway is undone, and 'ctx queue recover --reconcile'
    settles whatever could not be undone``".  A waiting worker; a job is published and a
    state directory the claim changes is pinned before the worker looks again: exit 1,
    EPERM naming the directory and its ``chattr``, no ``claim`` event, the queue byte for byte
    as it was (no ``claimed/J``, no lease, no temp file), nothing in the session about the
    job, its tool not run.  Lifted, a worker started again runs the job once."""
    worker = start(workers, queue, "--json")
    idle(worker)
    job = queue.publish(marked(outbox, "late"), name="late")
    target = queue.dir / place
    before = snapshot(queue.dir)
    with attribute(target, letter):
        wake(worker)
        rc, lines, err = worker.end()
        after = snapshot(queue.dir)
    stop = stopped_on(rc, lines, err, "EPERM")
    assert after == before
    assert "claim" not in [e["event"] for e in worker.events()], lines
    failure = stop["failure"]
    assert failure.startswith("EPERM: a claim failed (EPERM: "), failure
    assert f"chattr -{letter} {target}" in failure and WORDS[letter] in failure, failure
    assert failure.endswith(
        "); a claim refused midway is undone, and 'ctx queue recover --reconcile --project "
        "proj' settles whatever could not be undone"
    ), failure
    assert (stop["done"], stop["failed"], stop["lost"], stop["left_claimed"]) == (0, 0, 0, [])
    assert queue_events(queue.storage, job) == []
    assert runs(outbox, "late") == 0
    again = drain(queue)
    assert again.returncode == 0, again
    finished_once(queue, job)
    assert runs(outbox, "late") == 1


def test_a_queue_made_read_only_under_a_waiting_worker_stops_its_next_claim(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """The brief's "a queue made read-only under the worker", docs/workers.md ("a claim the
    host refuses … the worker stops with that errno"), ``ctx queue work --help`` ("exits 1
    naming the error with its errno (ENOSPC, EROFS, …)"): the queue is a bind mount made
    read-only while the worker waits; its next claim is refused EROFS saying which directory
    is on a read-only filesystem and to remount it read-write, the job stays pending, nothing
    changed.  Made writable again, a worker started again runs the job once."""
    scratch = ScratchMounts(new_scratch_dir(SCRATCH, "ro-claim"))
    try:
        scratch.bind_self(queue.dir, "rw")
        worker = start(workers, queue, "--json")
        idle(worker)
        job = queue.publish(marked(outbox, "rofs"), name="rofs")
        before = snapshot(queue.dir)
        assert scratch.remount(queue.dir, "bind,ro", tries=200)
        wake(worker)
        rc, lines, err = worker.end()
        assert snapshot(queue.dir) == before
        stop = stopped_on(rc, lines, err, "EROFS")
        failure = stop["failure"]
        assert failure.startswith("EROFS: a claim failed (EROFS: "), failure
        assert "is on a read-only filesystem" in failure and "read-write" in failure, failure
        assert f"job {job} stays pending" in failure, failure
        assert queue.state(job) == "pending" and runs(outbox, "rofs") == 0
        assert scratch.remount(queue.dir, "bind,rw", tries=200)
        again = drain(queue)
        assert again.returncode == 0, again
        finished_once(queue, job)
    finally:
        scratch.close()
    assert runs(outbox, "rofs") == 1


# -------------------------------------------------- a finish refused while the job runs

FINISH_PINS = [
    pytest.param("done", "i", "true", "done", id="done-immutable"),
    pytest.param("failed", "a", "exit 3", "failed", id="failed-append-only"),
    pytest.param("claimed/{J}", "i", "true", "done", id="claim-immutable"),
    pytest.param("lease/{J}", "a", "true", "done", id="lease-append-only"),
]


@pytest.mark.parametrize(("place", "letter", "then", "state"), FINISH_PINS)
def test_a_finish_refused_while_the_job_ran_leaves_it_claimed_and_stops_the_worker(
    queue: QueueCLI,
    agent: str,
    outbox: Path,
    workers: list[Worker],
    place: str,
    letter: str,
    then: str,
    state: str,
) -> None:
    """docs/workers.md "A host that runs short" (a job whose outcome cannot be finished …
    "is reported ``lost`` with the reason, and the worker claims nothing more"), docs/queue.md
    (finish checks every directory it changes first, "and nothing has moved when it
    refuses"): a directory the finish needs is pinned while the tool runs.  The tool ends; the
    job is ``lost`` with ``ran, but could not be finished: EPERM: …`` naming the directory,
    its ``chattr`` and ``ctx queue recover --reconcile``; ``queue.lost`` is in the session
    and no ``queue.finish``; the worker claims no more (a second job stays pending), names
    the job in ``left_claimed`` and exits 1 EPERM.  The queue is as the claim left it: no
    result, no temp file.  Lifted, ``recover`` requeues the job and it runs again, once."""
    job = queue.publish(gated(outbox, "fin", then), name="fin")
    worker = start(workers, queue, "--json", "--drain")
    worker.until("claim")
    assert wait_for(lambda: started_job(outbox, "fin"), DEADLINE)
    other = queue.publish(marked(outbox, "next"), name="next")
    target = queue.dir / place.format(J=job)
    with attribute(target, letter):
        before = snapshot(queue.dir)
        release(outbox, "fin")
        rc, lines, err = worker.end()
        after = snapshot(queue.dir)
    stop = stopped_on(rc, lines, err, "EPERM")
    assert after == before
    (lost,) = [e for e in worker.events() if e["event"] == "lost"]
    assert lost["job"] == job and lost["state"] == "lost", lost
    reason = lost["reason"]
    assert reason.startswith("ran, but could not be finished: EPERM: cannot finish in queue "), lost
    assert f"chattr -{letter} {target}" in reason, reason
    assert f"job {job} stays claimed and no result of it was written" in reason, reason
    assert "'ctx queue recover --reconcile --project proj'" in reason, reason
    assert "finish it again" not in reason, reason
    assert (stop["done"], stop["failed"], stop["lost"]) == (0, 0, 1), stop
    assert stop["left_claimed"] == [job], stop
    assert stop["failure"] == f"EPERM: job {job} {reason}", stop
    assert queue_events(queue.storage, job) == ["queue.claim", "queue.start", "queue.lost"]
    assert queue.state(job) == "claimed" and queue.state(other) == "pending"
    assert runs(outbox, "fin") == 1 and runs(outbox, "next") == 0

    recovered(queue, job)
    release(outbox, "fin")
    again = drain(queue)
    assert again.returncode == 0, again
    finished_once(queue, job, state)
    finished_once(queue, other)
    assert runs(outbox, "fin") == 2  # "the job runs again"


def test_a_finish_on_a_queue_made_read_only_while_the_job_ran(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """As above, with the queue a bind mount made read-only while the tool runs: the job is
    ``lost`` with ``ran, but could not be finished: EROFS: …`` saying to remount it
    read-write, the worker exits 1 EROFS, the job stays claimed with nothing written, and
    once the queue is writable ``recover`` requeues it and it runs again."""
    scratch = ScratchMounts(new_scratch_dir(SCRATCH, "ro-finish"))
    try:
        scratch.bind_self(queue.dir, "rw")
        job = queue.publish(gated(outbox, "rof"), name="rof")
        worker = start(workers, queue, "--json", "--drain")
        worker.until("claim")
        assert wait_for(lambda: started_job(outbox, "rof"), DEADLINE)
        assert scratch.remount(queue.dir, "bind,ro", tries=200)
        before = snapshot(queue.dir)
        release(outbox, "rof")
        rc, lines, err = worker.end()
        assert snapshot(queue.dir) == before
        stop = stopped_on(rc, lines, err, "EROFS")
        (lost,) = [e for e in worker.events() if e["event"] == "lost"]
        assert lost["reason"].startswith("ran, but could not be finished: EROFS: "), lost
        assert "read-only filesystem" in lost["reason"] and "read-write" in lost["reason"]
        assert stop["left_claimed"] == [job] and stop["lost"] == 1, stop
        assert scratch.remount(queue.dir, "bind,rw", tries=200)
        recovered(queue, job)
        again = drain(queue)
        assert again.returncode == 0, again
        finished_once(queue, job)
    finally:
        scratch.close()
    assert runs(outbox, "rof") == 2


def test_a_finish_on_a_queue_filled_up_while_the_job_ran(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """docs/workers.md "A host that runs short" (ENOSPC among the finishes that cannot be
    written): the queue on a small tmpfs that fills up while the tool runs.  The job is
    ``lost`` with ``ran, but could not be finished: ENOSPC: …`` naming ``inbox/`` and to free
    space; the worker exits 1 ENOSPC; no half-written result or temp file is left, and once
    space is freed ``recover`` requeues the job and it runs again."""
    scratch = ScratchMounts(new_scratch_dir(SCRATCH, "full"))
    try:
        scratch.tmpfs(queue.dir, "size=1m,mode=3770")
        made = queue.run("init")
        assert made.rc == 0, made
        job = queue.publish(gated(outbox, "full"), name="full")
        worker = start(workers, queue, "--json", "--drain")
        worker.until("claim")
        assert wait_for(lambda: started_job(outbox, "full"), DEADLINE)
        filler = queue.dir / "filler"
        with open(filler, "wb", buffering=0) as sink, pytest.raises(OSError) as full:
            while True:
                sink.write(b"\0" * 65536)
        assert full.value.errno == errno.ENOSPC
        before = snapshot(queue.dir)
        release(outbox, "full")
        rc, lines, err = worker.end()
        assert snapshot(queue.dir) == before
        stop = stopped_on(rc, lines, err, "ENOSPC")
        (lost,) = [e for e in worker.events() if e["event"] == "lost"]
        reason = lost["reason"]
        assert reason.startswith("ran, but could not be finished: ENOSPC: "), lost
        assert f"{queue.dir}/inbox" in reason and "free space" in reason, reason
        assert stop["left_claimed"] == [job], stop
        assert queue.entries("inbox") == set()
        filler.unlink()
        recovered(queue, job)
        again = drain(queue)
        assert again.returncode == 0, again
        finished_once(queue, job)
    finally:
        scratch.close()
    assert runs(outbox, "full") == 2


def test_two_slots_one_finish_refused_the_other_job_still_finished(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """docs/workers.md "Many jobs" ("A job slot that meets an error that is not a job's
    failure stops the worker as SIGTERM does"): with ``--concurrency 2`` and ``done/`` made
    immutable while both tools run, the job that succeeded cannot be finished (``lost``, left
    claimed), the one that failed is finished in ``failed/`` all the same, a third job
    published meanwhile is never claimed; exit 1 EPERM, the summary counting one failed, one
    lost."""
    good = queue.publish(gated(outbox, "good"), name="good")
    bad = queue.publish(gated(outbox, "bad", "exit 3"), name="bad")
    worker = start(workers, queue, "--json", "--concurrency", "2")
    assert wait_for(lambda: started_job(outbox, "good") and started_job(outbox, "bad"), DEADLINE)
    third = queue.publish(marked(outbox, "third"), name="third")
    with attribute(queue.dir / "done", "i"):
        release(outbox, "good")
        worker.until("lost")
        release(outbox, "bad")
        rc, lines, err = worker.end()
    stop = stopped_on(rc, lines, err, "EPERM")
    assert good in stop["failure"], stop
    assert (stop["done"], stop["failed"], stop["lost"]) == (0, 1, 1), stop
    assert stop["left_claimed"] == [good], stop
    assert queue.state(good) == "claimed"
    result = finished_once(queue, bad, "failed")
    assert result["exit_status"] == 3, result
    assert queue.state(third) == "pending" and runs(outbox, "third") == 0
    assert sorted(e["job"] for e in worker.events() if e["event"] == "claim") == sorted([bad, good])


def test_a_result_planted_beside_the_running_job_is_never_overwritten(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """Q-4, Q-6 (nothing may overwrite result evidence; a result beside a claim is rolled
    forward by ``recover --reconcile``), docs/workers.md "A lease taken away" (the queue's
    refusal ``EEXIST`` when someone else already finished it: the job is ``lost``, its outcome
    discarded, and the worker goes on): a ``done/J.result`` written by hand while J's tool
    runs.  The worker reports J ``lost`` with ``EEXIST`` naming that file, leaves it byte for
    byte, runs the next job and exits 0; plain ``recover`` reports the incomplete pair (exit
    1) and ``--reconcile`` completes J with the planted result."""
    job = queue.publish(gated(outbox, "plant"), name="plant")
    worker = start(workers, queue, "--json", "--drain")
    worker.until("claim")
    assert wait_for(lambda: started_job(outbox, "plant"), DEADLINE)
    planted = queue.dir / "done" / f"{job}.result"
    planted.write_text('{"status": "ok", "output": "planted"}\n')
    after = queue.publish(marked(outbox, "after"), name="after")
    release(outbox, "plant")
    rc, lines, err = worker.end()
    assert rc == 0 and TRACEBACK not in err, (lines, err)
    (lost,) = [e for e in worker.events() if e["event"] == "lost"]
    assert lost["reason"].startswith(
        f"not finished by this worker: EEXIST: done/{job}.result already exists"
    ), lost
    stop = json.loads(lines[-1])
    assert (stop["event"], stop["lost"], stop["done"], stop["failure"]) == ("stop", 1, 1, None)
    assert planted.read_text() == '{"status": "ok", "output": "planted"}\n'
    assert not (queue.dir / "done" / job).exists()
    finished_once(queue, after)
    plain = queue.run("recover")
    assert plain.rc == 1 and job in plain.out, plain
    settled = queue.run("recover", "--reconcile")
    assert settled.rc == 0, settled
    assert finished_once(queue, job) == {"status": "ok", "output": "planted"}
    assert runs(outbox, "plant") == 1


# ------------------------------------------------- what the worker records, refused under it


# Each makes the worker's log refuse its next event; returns what to ``chattr -i`` after.


def pin_log(session: Path, target: Path) -> Path | None:
    chattr("+i", session / "events.jsonl")
    return session / "events.jsonl"


def rotate_into_pinned_directory(session: Path, target: Path) -> Path | None:
    (session / "events.jsonl").rename(session / "events.jsonl.1")
    chattr("+i", session)
    return session


def rotate_and_link(session: Path, target: Path) -> Path | None:
    (session / "events.jsonl").rename(session / "events.jsonl.1")
    (session / "events.jsonl").symlink_to(target)
    return None


def rotate_and_hard_link(session: Path, target: Path) -> Path | None:
    (session / "events.jsonl").rename(session / "events.jsonl.1")
    os.link(target, session / "events.jsonl")
    return None


LOG_TROUBLES = [
    pytest.param(pin_log, "EPERM", "Operation not permitted", id="log-immutable"),
    pytest.param(
        rotate_into_pinned_directory, "EPERM", "Operation not permitted", id="rotated-pinned-dir"
    ),
    pytest.param(rotate_and_link, "EINVAL", "is not a regular file", id="rotated-symlink"),
    pytest.param(rotate_and_hard_link, "EINVAL", "is a file with 2 names", id="rotated-hardlink"),
]


@pytest.mark.parametrize(("trouble", "name", "said"), LOG_TROUBLES)
def test_a_claim_the_session_refuses_is_left_claimed_and_its_tool_never_runs(
    queue: QueueCLI,
    agent: str,
    outbox: Path,
    workers: list[Worker],
    tmp_path: Path,
    trouble,
    name: str,
    said: str,
) -> None:
    """S-5 (``queue.claim`` is durable in the session before the job is announced or its tool
    started), docs/workers.md ("A ``queue.claim`` the session refuses leaves its job claimed
    before it runs"; the session's ``events.jsonl`` is followed when renamed away),
    docs/sessions.md (the host never writes through a link, nor to a file with two names):
    the worker's log made immutable, or rotated away into an immutable directory, or
    replaced by a symbolic or a hard link to a file elsewhere, while the worker waits.  The
    next claim is made and cannot be recorded: exit 1 with the errno, ``cannot record
    queue.claim in the worker's session PATH``, ``job J is claimed and did not run; it stays
    claimed``, then ``ctx queue recover``; no ``claim`` event; the tool never ran; the file
    the link leads to is untouched.  Put right, ``recover`` requeues the job and it runs
    once."""
    first = drain(queue)
    assert first.returncode == 0, first
    log = events_file(queue.storage)
    session = log.parent
    needs_chattr(session)
    target = tmp_path / "elsewhere"
    target.write_text("keep\n")
    worker = start(workers, queue, "--json")
    idle(worker)
    job = queue.publish(marked(outbox, "rec"), name="rec")
    pinned = trouble(session, target)
    try:
        wake(worker)
        rc, lines, err = worker.end()
    finally:
        if pinned is not None:
            chattr("-i", pinned)
    stop = stopped_on(rc, lines, err, name)
    failure = stop["failure"]
    assert failure.startswith(
        f"{name}: cannot record queue.claim in the worker's session {log} ("
    ), failure
    assert said in failure, failure
    if name == "EPERM":
        assert "chattr -i -a" in failure, failure
    assert f"job {job} is claimed and did not run; it stays claimed: " in failure, failure
    assert failure.endswith(
        "then run 'ctx queue recover --project proj' once this worker has exited (it "
        "requeues the job)"
    ), failure
    assert "claim" not in [e["event"] for e in worker.events()], lines
    assert stop["left_claimed"] == [job], stop
    assert queue.state(job) == "claimed" and runs(outbox, "rec") == 0
    assert target.read_text() == "keep\n"

    if log.is_symlink() or (log.exists() and log.stat().st_nlink > 1):
        log.unlink()
    recovered(queue, job)
    again = drain(queue)
    assert again.returncode == 0, again
    finished_once(queue, job)
    assert runs(outbox, "rec") == 1 and target.read_text() == "keep\n"


# ---------------------------------------- how a stop is shown: text mode and a ready program


def test_a_lost_job_in_text_mode_is_a_lost_line_on_stderr_and_the_error_last(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """docs/workers.md "A lease taken away" / "Output" (``lost`` on stderr in text mode; the
    summary line), ``ctx queue work --help`` (exits 1 naming the error with its errno): a
    text-mode worker whose finish ``done/`` refuses prints ``lost    J: ran, but could not be
    finished: EPERM: …`` on stderr, its summary ``worker stopped: 0 done, 0 failed, 1 lost,
    …`` on stdout, and ends with ``ctx: EPERM: the worker stopped: job J ran, but could not
    be finished…``; no JSON anywhere."""
    job = queue.publish(gated(outbox, "txt"), name="txt")
    worker = start(workers, queue, "--drain")
    assert wait_for(lambda: started_job(outbox, "txt"), DEADLINE)
    with attribute(queue.dir / "done", "i"):
        release(outbox, "txt")
        rc, lines, err = worker.end()
    assert rc == 1 and TRACEBACK not in err, (lines, err)
    assert "{" not in "".join(lines), lines
    assert lines[0].startswith("worker ") and "started (waiting with " in lines[0], lines
    assert lines[-1].startswith("worker stopped: 0 done, 0 failed, 1 lost, "), lines
    err_lines = err.rstrip("\n").splitlines()
    assert err_lines[0].startswith(f"lost    {job}: ran, but could not be finished: EPERM: ")
    assert err_lines[-1].startswith(
        f"ctx: EPERM: the worker stopped: job {job} ran, but could not be finished: EPERM: "
    ), err
    assert len(err_lines) == 2, err
    assert queue.state(job) == "claimed"


def test_a_ready_program_prints_its_lost_job_as_a_line_and_its_error_under_its_name(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """W-5, workers/README.md (each finished job printed as one JSON line; errors one line
    on stderr ``PROGRAM: ERRNO: sentence``): ``shell_worker.py`` whose finish ``done/``
    refuses prints the ``lost`` job and its ``stop`` summary as JSON lines on stdout (no
    ``start`` or ``claim``), and ``shell_worker.py: EPERM: the worker stopped: job J ran, but
    could not be finished …`` alone on stderr, exit 1."""
    job = queue.publish(gated(outbox, "rp"), name="rp")
    worker = start(workers, queue, "--drain", program="shell_worker.py")
    assert wait_for(lambda: started_job(outbox, "rp"), DEADLINE)
    with attribute(queue.dir / "done", "i"):
        release(outbox, "rp")
        rc, lines, err = worker.end()
    assert rc == 1 and TRACEBACK not in err, (lines, err)
    shown = [json.loads(line) for line in lines]
    assert [e["event"] for e in shown] == ["lost", "stop"], lines
    assert shown[0]["job"] == job and shown[1]["left_claimed"] == [job], shown
    (line,) = err.splitlines()
    assert line.startswith(
        f"shell_worker.py: EPERM: the worker stopped: job {job} ran, but could not be finished"
    ), err
    assert queue.state(job) == "claimed"


def test_a_ready_programs_refused_renewal_is_a_renew_line_and_the_job_still_finishes(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """docs/workers.md "A renewal the host refuses" (said at once: ``renew_failed`` with
    ``--json``, "a ``renew`` line on stderr otherwise"; "A renewal that succeeds meanwhile
    lets the job run on and be finished; the worker still exits 1, having stopped
    claiming"), W-5: ``shell_worker.py`` without ``--json`` whose renewal an immutable
    ``inbox/`` refuses says ``renew   J: its lease could not be renewed (EPERM: …`` on
    stderr; lifted before the lease's last round, the job is finished in ``done/`` (its
    ``finish`` line on stdout), a second job stays pending, and the program exits 1 with
    ``shell_worker.py: EPERM: the worker stopped: renewing the lease of job J failed …``."""
    job = queue.publish(gated(outbox, "ren"), name="ren")
    worker = start(workers, queue, "--ttl", "4.5", program="shell_worker.py")
    assert wait_for(lambda: started_job(outbox, "ren"), DEADLINE)
    other = queue.publish(marked(outbox, "other"), name="other")
    inbox = queue.dir / "inbox"
    with attribute(inbox, "i"):
        said = worker.until_err(f"renew   {job}: ")
    assert said.startswith(f"renew   {job}: its lease could not be renewed (EPERM: "), said
    assert f"chattr -i {inbox}" in said and "the worker claims no more jobs" in said, said
    first = queue.lease(job)["expires_at"]
    assert wait_for(lambda: queue.lease(job)["expires_at"] != first, DEADLINE)
    release(outbox, "ren")
    rc, lines, err = worker.end()
    assert rc == 1 and TRACEBACK not in err, (lines, err)
    shown = [json.loads(line) for line in lines]
    assert [e["event"] for e in shown] == ["finish", "stop"], lines
    assert (shown[0]["job"], shown[0]["state"]) == (job, "done"), shown
    assert shown[1]["left_claimed"] == [] and shown[1]["failure"].startswith("EPERM: "), shown
    last = err.rstrip("\n").splitlines()[-1]
    assert last.startswith(
        f"shell_worker.py: EPERM: the worker stopped: renewing the lease of job {job} failed ("
    ), err
    assert last.endswith("then start the worker again"), last
    finished_once(queue, job)
    assert queue.state(other) == "pending" and runs(outbox, "other") == 0


def test_a_lease_a_read_only_queue_will_not_renew_is_given_up_before_it_lapses(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """Q-5, I-4, docs/workers.md "A renewal the host refuses" (a lease still unrenewed with
    less than a round left: "the job's tool process group is killed before the lease
    expires …; the job stays claimed with no result (reported ``lost``), and the worker exits
    1 with the errno"): the queue a bind mount made read-only while a job runs under a 1.5 s
    lease.  ``renew_failed`` (EROFS), then ``lost`` (given up), exit 1 ``EROFS: the worker
    stopped: job J was given up: …``; the tool was killed (it never reached its end), and
    the lease is as the worker last wrote it.  Writable again, ``recover`` requeues
    the job and it runs to its end once."""
    scratch = ScratchMounts(new_scratch_dir(SCRATCH, "lapse"))
    try:
        scratch.bind_self(queue.dir, "rw")
        job = queue.publish(gated(outbox, "lapse"), name="lapse")
        worker = start(workers, queue, "--json", "--ttl", "1.5")
        worker.until("claim")
        assert wait_for(lambda: started_job(outbox, "lapse"), DEADLINE)
        lease_before = queue.lease(job)
        assert scratch.remount(queue.dir, "bind,ro", tries=400)
        refused = worker.until("renew_failed")
        assert (refused["job"], refused["error"], refused["errno"]) == (job, "EROFS", 30)
        rc, lines, err = worker.end()
        lease = queue.lease(job)
        stop = stopped_on(rc, lines, err, "EROFS")
        assert stop["error"]["message"].startswith(
            f"the worker stopped: job {job} was given up: its lease could not be renewed ("
        ), stop
        failure = stop["failure"]
        assert "its tool's process group was killed" in failure, failure
        assert f"and {job} stays claimed with no result written: " in failure, failure
        assert "read-write" in failure, failure
        assert failure.endswith(
            f"then run 'ctx queue recover --project proj' (it requeues {job} once this worker "
            "has exited, and the job runs again) and start the worker again"
        ), failure
        (lost,) = [e for e in worker.events() if e["event"] == "lost"]
        assert lost["job"] == job and lost["reason"].startswith("given up: "), lost
        assert stop["left_claimed"] == [job], stop
        assert not alive(pid_of(outbox, "lapse"))  # killed with its process group
        assert lease["worker"] == lease_before["worker"], lease
        release(outbox, "lapse")
        assert scratch.remount(queue.dir, "bind,rw", tries=200)
        assert queue.state(job) == "claimed" and runs(outbox, "lapse") == 0
        recovered(queue, job)
        again = drain(queue)
        assert again.returncode == 0, again
        finished_once(queue, job)
    finally:
        scratch.close()
    assert runs(outbox, "lapse") == 1


# ------------------------------------------- the queue or the root gone under a waiting worker


def test_a_queue_made_again_under_a_waiting_worker_stops_it_with_estale(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """docs/workers.md "A host that runs short" (a worker whose queue's path names another
    directory — "its project removed, perhaps made again" — "stops before its next claim
    (``ESTALE`` …), the job left pending"): the queue moved aside and ``ctx queue init`` run
    again while a worker waits.  A job written into the old queue wakes it: exit 1 ESTALE
    naming the queue's path and to start it again; neither the old queue's job nor the new
    queue's is claimed.  Started again, the worker runs the new queue's job once."""
    worker = start(workers, queue, "--json")
    worker.until("start")
    old = queue.dir.with_name("queue.old")
    queue.dir.rename(old)
    made = queue.run("init")
    assert made.rc == 0, made
    job = queue.publish(marked(outbox, "new"), name="new")
    (old / "pending" / "stale.req.json").write_text(json.dumps(marked(outbox, "stale")))
    rc, lines, err = worker.end()
    stop = stopped_on(rc, lines, err, "ESTALE")
    assert stop["failure"] == (
        f"ESTALE: the queue {queue.dir} now names another directory than the one this worker "
        "opened (its project was removed, or made again): the worker claims no more jobs from "
        "it; start it again to work the queue at that path"
    ), stop
    assert os.listdir(old / "pending") == ["stale.req.json"]
    assert os.listdir(old / "claimed") == [] and os.listdir(old / "lease") == []
    assert queue.state(job) == "pending" and runs(outbox, "stale") == 0
    shutil.rmtree(old)
    again = drain(queue)
    assert again.returncode == 0, again
    finished_once(queue, job)
    assert runs(outbox, "new") == 1


def test_a_project_removed_under_a_waiting_worker_stops_it_with_enoent(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker], tmp_path: Path
) -> None:
    """As above, with the project moved out of the storage root and nothing made at its
    path; a job written into the moved queue wakes the worker: exit 1 ENOENT, ``the queue Q
    no longer exists``, the job not claimed, a summary of a worker that did nothing."""
    worker = start(workers, queue, "--json")
    worker.until("start")
    gone = tmp_path / "gone"
    queue.dir.parent.rename(gone)
    pending = gone / "queue" / "pending"
    (pending / "woke.req.json").write_text(json.dumps(marked(outbox, "woke")))
    rc, lines, err = worker.end()
    stop = stopped_on(rc, lines, err, "ENOENT")
    assert stop["failure"].startswith(f"ENOENT: the queue {queue.dir} no longer exists ("), stop
    assert (stop["done"], stop["failed"], stop["lost"], stop["left_claimed"]) == (0, 0, 0, [])
    assert os.listdir(pending) == ["woke.req.json"] and runs(outbox, "woke") == 0


def test_a_storage_root_moved_under_a_waiting_worker_stops_it_before_a_claim(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """docs/workers.md ("A worker whose storage root's path names another directory than the
    one it started on (the root moved with ``mv`` …) stops before its next claim (``ESTALE``,
    or ``ENOENT`` when nothing is there), the job left pending"): the root moved away while a
    worker waits; a job written into the moved root's queue wakes it.  Exit 1 ENOENT naming
    the root's path, ``no longer exists``, and to start it again on the root's path; the job
    is not claimed.  Moved back, a worker started again runs it once."""
    worker = start(workers, queue, "--json")
    worker.until("start")
    moved = queue.storage.with_name("moved")
    queue.storage.rename(moved)
    try:
        pending = moved / "shared" / "proj" / "queue" / "pending"
        (pending / "woke.req.json").write_text(json.dumps(marked(outbox, "woke")))
        rc, lines, err = worker.end()
        stop = stopped_on(rc, lines, err, "ENOENT")
        assert stop["failure"].startswith(
            f"ENOENT: the storage root {queue.storage} no longer exists (it was moved, or a "
            "link on its path changed): the worker claims no more jobs"
        ), stop
        assert stop["failure"].endswith("start it again on the root's path"), stop
        assert os.listdir(pending) == ["woke.req.json"]
        assert runs(outbox, "woke") == 0
    finally:
        moved.rename(queue.storage)
    again = drain(queue)
    assert again.returncode == 0, again
    finished_once(queue, "woke.req.json")
    assert runs(outbox, "woke") == 1


# ---------------------------------------------------------------- the config's lease_ttl


def test_a_config_lease_ttl_no_worker_may_keep_is_mended_by_the_ttl_it_names(
    queue: QueueCLI, agent: str, outbox: Path
) -> None:
    """docs/workers.md ("a shorter ``lease_ttl`` in ``queue/config`` stops the worker before
    its first claim, exit 1, naming that file and both remedies"): with ``lease_ttl=0.5`` a
    worker exits 1 EINVAL naming ``Q/config`` and ``--ttl``, claims nothing and changes
    nothing; given ``--ttl 2`` as the message says, it runs the job, and the lease it
    recorded at the claim (``queue.claim`` in its session) lasts 2 s."""
    config = queue.dir / "config"
    config.write_text(config.read_text() + "lease_ttl=0.5\n")
    job = queue.publish(marked(outbox, "ttl"), name="ttl")
    before = snapshot(queue.dir)
    done = drain(queue)
    message = refused_at_start(done, "EINVAL")
    assert snapshot(queue.dir) == before
    assert f"it is the lease_ttl of {config}: set lease_ttl to 1 or more there" in message
    assert message.endswith("or give this worker --ttl; no job was claimed"), message
    again = drain(queue, "--ttl", "2")
    assert again.returncode == 0, again
    finished_once(queue, job)
    (claim,) = [
        e
        for e in read_jsonl(events_file(queue.storage))
        if e["type"] == "queue.claim" and e["object"] == f"queue/{job}"
    ]
    lease = claim["lease"]
    lifetime = rfc3339(lease["expires_at"]) - rfc3339(lease["claimed_at"])
    assert abs(lifetime.total_seconds() - 2.0) < 0.01, lease


# ------------------------------------------- job failures that must not stop the worker


def naming(code: str) -> dict:
    """A shell job whose tool ends naming ``code`` on its output (docs/workers.md: a tool
    that names an errno, ``{"errno": N, "message": …}`` on its stdout)."""
    number = getattr(errno, code)
    return shell_job(f'printf \'{{"errno": {number}, "message": "said {code}"}}\'; exit 1')


HOST_WORDS = ["ENOSPC", "EMFILE", "EAGAIN", "EROFS", "EPERM", "ENOMEM"]


def test_a_tool_that_names_a_host_errno_fails_only_its_own_job(queue: QueueCLI, agent: str) -> None:
    """docs/workers.md "A host that runs short": only a tool that could not *start* for want
    of descriptors, memory or space ("and it has no exit status"), or a call that could not
    be recorded, stops the worker; a tool that ran and names such an errno on its own output
    is the job's failure.  Six jobs whose tools exit 1 naming ENOSPC, EMFILE, EAGAIN, EROFS,
    EPERM, ENOMEM: each finished in ``failed/`` with that errno at stage
    ``exit`` and its exit status, and the draining worker exits 0 having left nothing
    claimed."""
    jobs = {queue.publish(naming(code), name=code.lower()): code for code in HOST_WORDS}
    done = drain(queue)
    assert done.returncode == 0 and TRACEBACK not in done.stderr, done
    stop = json.loads(done.stdout.splitlines()[-1])
    assert (stop["failed"], stop["done"], stop["lost"]) == (len(jobs), 0, 0), stop
    assert stop["failure"] is None and stop["left_claimed"] == [], stop
    for job, code in jobs.items():
        result = finished_once(queue, job, "failed")
        error = result["error"]
        assert (error["error"], error["errno"], error["stage"]) == (
            code,
            getattr(errno, code),
            "exit",
        ), result
        assert result["exit_status"] == 1, result
        assert result["reason"] == f"{code}: shell.exec exited with status 1: said {code} [exit]"


def test_requests_the_worker_cannot_run_fail_naming_what_is_wrong_and_it_goes_on(
    queue: QueueCLI, agent: str
) -> None:
    """W-1 (finished in ``failed/`` on tool failure, "authorization denied", recording the
    reason), docs/workers.md (the failed job's ``error`` and ``reason``; a tool that exits
    non-zero without naming an errno: ``error`` null, stage ``exit``, ``reason`` ``shell.exec
    exited with status 3: <its last stderr line> [exit]``): a missing tool, input the
    schema refuses, a tool the agent's policy does not grant, a request put in ``pending/``
    by hand that is not JSON, and a tool exiting 3: each failed with its errno, stage and
    words; the worker drains them all and exits 0."""
    missing = queue.publish({"tool": "no.such.tool", "input": {}}, name="missing")
    schema = queue.publish({"tool": "shell.exec", "input": {"cmd": 5}}, name="schema")
    denied = queue.publish({"tool": "fs.read", "input": {"path": "x"}}, name="denied")
    status = queue.publish(shell_job("echo first >&2; echo last words >&2; exit 3"), name="st")
    broken = queue.drop("broken")
    (queue.dir / "pending" / broken).write_text('{"tool": "shell.exec", "input": ')
    done = drain(queue)
    assert done.returncode == 0 and TRACEBACK not in done.stderr, done
    expected = {
        missing: ("ENOENT", "resolve", "no tool 'no.such.tool' on the CTX_PATH of agent 'ci'"),
        schema: ("EINVAL", "schema", "input does not match the schema of shell.exec"),
        denied: ("EACCES", "authorize", "agent/ci.d/policy has no rule 'allow ci_t tool:fs.read"),
        status: (None, "exit", "shell.exec exited with status 3: last words"),
        broken: ("EINVAL", "request", "stored request is not JSON"),
    }
    for job, (code, stage, words) in expected.items():
        result = finished_once(queue, job, "failed")
        error = result["error"]
        assert (error["error"], error["stage"]) == (code, stage), (job, result)
        assert words in result["reason"] and result["reason"].endswith(f"[{stage}]"), result
    assert finished_once(queue, status, "failed")["reason"] == (
        "shell.exec exited with status 3: last words [exit]"
    )
    queue.assert_settled()


# ------------------------------------------------ the queue's config damaged while a job runs

DAMAGE = [
    pytest.param("#" * 70000 + "\n", "EFBIG", "is 70", id="over-64KiB"),
    pytest.param("bogus=1\n", "EINVAL", "unknown key 'bogus'", id="unknown-key"),
]


@pytest.mark.parametrize(("added", "name", "said"), DAMAGE)
def test_a_config_damaged_while_a_job_runs_lets_it_finish_and_claims_no_more(
    queue: QueueCLI,
    agent: str,
    outbox: Path,
    workers: list[Worker],
    added: str,
    name: str,
    said: str,
) -> None:
    """docs/workers.md "The queue's config while a worker runs" (read again before each
    claim; "A config it can no longer read (damaged …) stops it as it stops every command: it
    claims nothing more, lets the running jobs finish and exits 1, naming the config"),
    docs/queue.md "Configuration" (at most 64 KiB, ``EFBIG``; an unknown key ``EINVAL`` with
    its line): the running job is finished in ``done/``, the next stays pending, the worker
    exits 1 with that errno naming the config and that it claims no more jobs.  The config
    repaired, a worker started again runs the other job."""
    config = queue.dir / "config"
    kept = config.read_text()
    job = queue.publish(gated(outbox, "cfg"), name="cfg")
    worker = start(workers, queue, "--json")
    assert wait_for(lambda: started_job(outbox, "cfg"), DEADLINE)
    other = queue.publish(marked(outbox, "later"), name="later")
    config.write_text(kept + added)
    release(outbox, "cfg")
    rc, lines, err = worker.end()
    stop = stopped_on(rc, lines, err, name)
    failure = stop["failure"]
    assert failure.startswith(
        f"{name}: the queue's config can no longer be read ({name}: {config}"
    ), failure
    assert said in failure, failure
    assert failure.endswith(
        "the worker claims no more jobs: start it again once the config is repaired"
    ), failure
    assert (stop["done"], stop["failed"], stop["lost"], stop["left_claimed"]) == (1, 0, 0, [])
    finished_once(queue, job)
    assert queue.state(other) == "pending" and runs(outbox, "later") == 0
    config.write_text(kept)
    again = drain(queue)
    assert again.returncode == 0, again
    finished_once(queue, other)


# ------------------------------------------- a claim lost while the pre-hooks ran: ECANCELED


def test_a_claim_lost_while_its_pre_hook_ran_never_starts_the_tool(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """I-4, Q-5, docs/workers.md "A lease taken away" (the worker finds out "just before the
    tool would start (after the pre-hooks, when less than half of the lease is left it renews
    it first …): … one that has not started never starts (``ECANCELED`` at stage ``run``)";
    its finish is refused, the job reported ``lost``, and the worker goes on): a worker with
    a 1 s lease is frozen while its job's pre-hook waits, past the lease; ``recover``
    requeues the job; the worker continued, the first claim's tool never starts (its
    ``tool_result`` in the session says ECANCELED at stage ``run``), the job is ``lost`` once,
    claimed again and run once; exit 0."""
    hook = queue.storage / "tool" / "shell.exec.d" / "hooks" / "pre.d" / "10-gate"
    hook.write_text(
        "#!/bin/sh\n"
        f"touch {outbox}/hook.started\n"
        f"while [ ! -e {outbox}/hook.go ]; do sleep 0.02; done\n"
        "exit 0\n"
    )
    hook.chmod(0o755)
    job = queue.publish(marked(outbox, "hooked"), name="hooked")
    worker = start(workers, queue, "--json", "--drain", "--ttl", "1")
    worker.until("claim")
    assert wait_for(lambda: (outbox / "hook.started").exists(), DEADLINE)
    os.kill(worker.proc.pid, signal.SIGSTOP)
    expires = rfc3339(queue.lease(job)["expires_at"]).timestamp()
    assert wait_for(lambda: time.time() > expires + 0.2, DEADLINE)
    swept = queue.run("recover", "--json")
    assert swept.rc == 0 and [r["job"] for r in swept.json()["requeued"]] == [job], swept
    wake(worker)
    release(outbox, "hook")
    rc, lines, err = worker.end()
    assert rc == 0 and TRACEBACK not in err, (lines, err)
    kinds = [(e["event"], e.get("job")) for e in worker.events()]
    assert kinds.count(("lost", job)) == 1 and kinds.count(("finish", job)) == 1, kinds
    assert kinds.index(("lost", job)) < kinds.index(("finish", job)), kinds
    (lost,) = [e for e in worker.events() if e["event"] == "lost"]
    assert lost["reason"].startswith("not finished by this worker: "), lost
    finished_once(queue, job)
    assert runs(outbox, "hooked") == 1
    results = [e for e in read_jsonl(events_file(queue.storage)) if e["type"] == "tool_result"]
    assert [(e["status"], e.get("errno"), e.get("stage")) for e in results] == [
        ("error", "ECANCELED", "run"),
        ("ok", None, None),
    ], results
    assert results[0]["exit_status"] is None, results  # never started
    assert results[0]["message"].startswith(f"not started: this worker's claim of {job} was lost")
