"""The error branches of how a worker executes a job and keeps its lease, each reached from
outside through ``ctx queue work`` and the ready program ``workers/shell_worker.py`` (SPEC §3
W-1, W-2, W-4, W-5; Q-3, Q-4, Q-5, Q-7, I-4, S-2, S-4; docs/workers.md "One job", "A failed
job's error and reason", "A renewal the host refuses", "A lease taken away", "Waiting for
work", "Signals", "Output"; docs/queue.md; ``ctx queue work --help``; workers/README.md).

The angle: what a worker meets around one job rather than in the loop that claims it — a
tool that is killed by a signal, kills its own process group, stops itself, floods its
standard error, never reads a large input; a stored request no executor may run; a worker
with no agent; a lease the host will not renew (its directory immutable or append-only, an
``inbox/`` that cannot be renamed out of, a queue filesystem out of bytes or inodes), a
lease rewritten to name another live holder, a lease whose job another process keeps
locked; stop signals at each phase (while starting, twice while a job runs, a first and a
second ^C after SIGHUP, a second ^C while standard output is stalled); an inotify watch the
kernel refuses (``max_inotify_watches`` or ``max_inotify_instances`` set to 0 in a user
namespace of the worker's own), and a worker started with more than a thousand inherited
descriptors.

Each check reads the exit status, the errno word of the ``ctx: ERRNO: sentence`` line (and
of the ``--json`` error object after the ``stop`` summary), that the message names the job,
the directory or the signal at fault and the remedy the documents promise, and that nothing
is half-done: no temp file left in ``inbox/``, a lease not ours left byte for byte, a tool
killed before its lease lapses, no job both requeued and still running.  Where the message
names a repair (``chattr -i``, freeing space, ``ctx queue recover``), the repair is run and
the job is seen finished exactly once."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
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

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the worker's agent runs as another uid, and chattr: needs root"
)

SCRATCH = scratch_top(__file__)
DEADLINE = 30.0
TRACEBACK = "Traceback"
PYTHON = str(REPO / ".venv" / "bin" / "python")
SHELL_WORKER = str(REPO / "workers" / "shell_worker.py")
F_SETPIPE_SZ = 1031  # fcntl(2): the capacity of a pipe


# ---------------------------------------------------------------------------------- helpers


class Worker:
    """A worker process whose stdout and stderr are read line by line as they come (or whose
    stdout is left to the caller: ``stdout``)."""

    def __init__(self, argv: list[str], env: dict[str, str], stdout=subprocess.PIPE, **kw):
        self.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE, **kw
        )
        self.out: list[str] = []
        self.err: list[str] = []
        pipes = [(self.proc.stderr, self.err)]
        if stdout is subprocess.PIPE:
            pipes.append((self.proc.stdout, self.out))
        self._readers = [
            threading.Thread(target=self._drain, args=pipe, daemon=True) for pipe in pipes
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _drain(pipe, into: list[str]) -> None:
        for line in pipe:
            into.append(line.decode("utf-8", "replace"))

    def events(self) -> list[dict]:
        return [json.loads(line) for line in list(self.out) if line.startswith('{"event"')]

    def until(self, kind: str, job: str | None = None) -> dict:
        def seen() -> list[dict]:
            return [
                e
                for e in self.events()
                if e["event"] == kind and (job is None or e.get("job") == job)
            ]

        assert wait_for(lambda: bool(seen()), DEADLINE), (self.out, self.err)
        return seen()[0]

    def end(self, timeout: float = DEADLINE) -> tuple[int, list[str], str]:
        rc = self.proc.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(DEADLINE)
        return rc, [line.rstrip("\n") for line in self.out], "".join(self.err)

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    """The workers a test started; any still running at its end is killed."""
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.kill()


@pytest.fixture
def helpers() -> Iterator[list[subprocess.Popen]]:
    """Other processes a test started (a lock holder, a stand-in lease holder); killed at
    its end."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def work_argv(queue: QueueCLI, *args: str, program: str = "ctx") -> list[str]:
    if program == "ctx":
        argv = [*CTX_ARGV, "queue", "work"]
    else:
        argv = [PYTHON, str(REPO / "workers" / program)]
    return [*argv, "--project", queue.project, "--agent", AGENT, *args]


def start(workers: list[Worker], queue: QueueCLI, *args: str, program: str = "ctx", **kw):
    """``ctx queue work --agent ci ARGS`` (or the ready program ``program``) on ``queue``."""
    worker = Worker(
        work_argv(queue, *args, program=program), clean_env(CTX_STORAGE=str(queue.storage)), **kw
    )
    workers.append(worker)
    return worker


def drain(queue: QueueCLI, *args: str) -> subprocess.CompletedProcess:
    """A worker draining the queue, to the end."""
    return subprocess.run(
        work_argv(queue, "--drain", "--json", *args),
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        capture_output=True,
        text=True,
        timeout=DEADLINE * 2,
    )


def objects(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def gated(outbox: Path, tag: str, then: str = "true") -> dict:
    """A shell job that says it started (its pid in ``tag.started``), waits for ``tag.go``,
    notes that it ran to its end (``tag.ran``, one line a run), then runs ``then``."""
    return shell_job(
        f"echo $$ > {outbox}/{tag}.pid; mv {outbox}/{tag}.pid {outbox}/{tag}.started; "
        f"while [ ! -e {outbox}/{tag}.go ]; do sleep 0.02; done; "
        f"echo ran >> {outbox}/{tag}.ran; {then}"
    )


def runs(outbox: Path, tag: str) -> int:
    path = outbox / f"{tag}.ran"
    return len(path.read_text().splitlines()) if path.exists() else 0


def started_job(outbox: Path, tag: str) -> bool:
    return (outbox / f"{tag}.started").exists()


def pid_of(outbox: Path, tag: str) -> int:
    return int((outbox / f"{tag}.started").read_text())


def release(outbox: Path, tag: str) -> None:
    (outbox / f"{tag}.go").touch()


def restart(outbox: Path, tag: str) -> None:
    """Forget a gated job's first start, so that its next run is seen starting."""
    (outbox / f"{tag}.started").unlink()


def session_file(storage: Path) -> Path:
    (path,) = storage.glob(f"home/*/agent/{AGENT}/session/worker")
    return path / "events.jsonl"


def session_events(storage: Path) -> list[dict]:
    return read_jsonl(session_file(storage))


def error_object(line: str, name: str) -> dict:
    obj = json.loads(line)
    assert set(obj) == {"error", "errno", "message"}, obj
    assert (obj["error"], obj["errno"]) == (name, getattr(errno, name)), obj
    return obj


def stopped_on(rc: int, lines: list[str], err: str, name: str) -> dict:
    """A ``--json`` worker that an error stopped: exit 1, its ``stop`` event then the error
    object ``name`` as the last lines of stdout, the same error last on stderr; the ``stop``
    event, with the error object under ``error``."""
    assert TRACEBACK not in err, err
    assert rc == 1, (lines, err)
    error = error_object(lines[-1], name)
    stop = json.loads(lines[-2])
    assert stop["event"] == "stop" and stop["stopped_by"] == "failure", stop
    assert err.rstrip("\n").splitlines()[-1] == f"ctx: {name}: {error['message']}", err
    return {**stop, "error": error}


def chattr(flag: str, path: Path) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True)


def needs_chattr(path: Path) -> None:
    if shutil.which("chattr") is None:
        pytest.skip("needs chattr")
    made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is not available here: {made.stderr.strip()}")
    chattr("-i", path)


def recovered(queue: QueueCLI, job: str) -> None:
    """Plain ``ctx queue recover`` requeues ``job``, whose worker has exited."""
    done = queue.run("recover", "--json")
    assert done.rc == 0, done
    assert [r["job"] for r in done.json()["requeued"]] == [job], done
    assert queue.state(job) == "pending"


def finished_once(queue: QueueCLI, job: str, state: str = "done") -> dict:
    got, result = queue.only_result(job)
    assert got == state, (job, got, result)
    return result


def lease_expiry(queue: QueueCLI, job: str) -> float:
    return rfc3339(queue.lease(job)["expires_at"]).timestamp()


def no_temp_files(queue: QueueCLI) -> None:
    assert queue.entries("inbox") == set(), queue.entries("inbox")


# ------------------------------------------------------------------ how a job's tool ends


ENDINGS = [
    pytest.param("kill -SEGV $$", 139, id="killed-by-sigsegv"),
    pytest.param("kill -TERM 0; sleep 5", 143, id="kills-its-own-group"),
    pytest.param("kill -PIPE $$", 141, id="killed-by-sigpipe"),
]


@pytest.mark.parametrize(("cmd", "status"), ENDINGS)
def test_a_tool_ended_by_a_signal_fails_its_job_alone_and_the_worker_goes_on(
    queue: QueueCLI, agent: str, cmd: str, status: int
) -> None:
    """W-1 (a non-zero exit fails the job, the reason in its result), docs/workers.md "A
    failed job's error and reason" (a tool that exits non-zero without naming an errno: stage
    ``exit``, ``error`` and ``errno`` null, ``reason`` ``shell.exec exited with status N``):
    a tool killed by a signal — its own, or one it sent its whole process group, the
    worker's side of it excluded — fails only its own job; the job after it is done; the
    worker exits 0 and its session records both calls."""
    bad = queue.publish(shell_job(cmd), name="a-bad")
    good = queue.publish(shell_job("echo fine"), name="b-good")
    done = drain(queue)
    assert done.returncode == 0 and TRACEBACK not in done.stderr, done
    stop = objects(done.stdout)[-1]
    assert (stop["event"], stop["done"], stop["failed"], stop["failure"]) == (
        "stop", 1, 1, None,
    ), stop  # fmt: skip
    result = finished_once(queue, bad, "failed")
    assert result["exit_status"] == status, result
    assert result["reason"].startswith(f"shell.exec exited with status {status}"), result
    assert result["reason"].endswith("[exit]"), result
    assert (result["error"]["error"], result["error"]["stage"]) == (None, "exit"), result
    assert finished_once(queue, good)["output"] == "fine\n"
    results = [e for e in session_events(queue.storage) if e["type"] == "tool_result"]
    assert len(results) == 2, results
    queue.assert_settled()


def test_a_tool_that_stops_itself_is_killed_at_the_timeout_and_leaves_nothing_stopped(
    queue: QueueCLI, agent: str, outbox: Path
) -> None:
    """W-4 (a job past its timeout is killed, its process group, and finished as failed):
    a tool that sends itself SIGSTOP would never exit; at ``--timeout`` it is killed —
    ETIMEDOUT at stage ``run``, its process gone rather than left stopped — and the worker
    runs the next job."""
    stuck = queue.publish(
        shell_job(f"echo $$ > {outbox}/stopped.pid; kill -STOP $$; echo woke"), name="a-stop"
    )
    after = queue.publish(shell_job("echo after"), name="b-after")
    began = time.monotonic()
    done = drain(queue, "--timeout", "2")
    assert done.returncode == 0 and TRACEBACK not in done.stderr, done
    assert time.monotonic() - began < DEADLINE
    result = finished_once(queue, stuck, "failed")
    assert result["error"]["error"] == "ETIMEDOUT" and result["error"]["stage"] == "run"
    assert result["reason"].startswith("ETIMEDOUT: timed out after 2s"), result
    assert "woke" not in json.dumps(result.get("output"))
    assert not alive(int((outbox / "stopped.pid").read_text()))
    assert finished_once(queue, after)["output"] == "after\n"


def test_a_tool_flooding_its_standard_error_leaves_only_the_tail_in_the_result(
    queue: QueueCLI, agent: str
) -> None:
    """docs/workers.md "One job" (the result holds the tail of ``stderr``), S-4: a tool that
    writes two mebibytes to its standard error and then one last line, exiting 3: the job
    fails in ``failed/`` with a ``stderr`` of at most 4 096 characters ending with that last
    line, and a reason quoting it; nothing of the flood is in the worker's session."""
    flood = (
        "i=0; while [ $i -lt 2048 ]; do head -c 1023 /dev/zero | tr '\\0' x >&2; "
        "echo >&2; i=$((i+1)); done; echo 'the very last line' >&2; exit 3"
    )
    job = queue.publish(shell_job(flood), name="flood")
    done = drain(queue)
    assert done.returncode == 0 and TRACEBACK not in done.stderr, done
    result = finished_once(queue, job, "failed")
    assert len(result["stderr"]) <= 4096, len(result["stderr"])
    assert result["stderr"].endswith("the very last line\n"), result["stderr"][-100:]
    assert "the very last line" in result["reason"], result["reason"]
    assert result["exit_status"] == 3
    assert max(len(line) for line in session_file(queue.storage).read_text().splitlines()) < (
        64 * 1024
    )


def test_a_tool_that_never_reads_a_large_input_is_still_finished(
    queue: QueueCLI, agent: str
) -> None:
    """W-1 (the tool runs with the request's input): a request near the 1 MiB limit whose
    tool exits at once without reading its standard input is finished with the tool's own
    outcome — the worker's write to a pipe nobody reads is no failure of its own."""
    job = queue.publish(shell_job("exec 0<&-; echo ignored", padding="p" * 900_000), name="big")
    done = drain(queue)
    assert done.returncode == 0 and TRACEBACK not in done.stderr, done
    assert finished_once(queue, job)["output"] == "ignored\n"


# ------------------------------------------------------- requests no executor may run as is


@pytest.mark.parametrize("program", ["ctx", "shell_worker.py"])
def test_a_shell_worker_fails_malformed_requests_and_leaves_other_tools_pending(
    queue: QueueCLI, agent: str, program: str
) -> None:
    """docs/workers.md stage table (``request``, EINVAL: a stored request that is malformed)
    and "A ``--kind shell`` worker claims ``shell.exec`` jobs only … stays pending for a
    tool worker, and ``--drain`` does not count it among the jobs it left": a shell worker
    (``--kind shell``, or the ready program) fails each request put in ``pending/`` by hand
    that is no valid request — not JSON, an array, a tool that is a number, an input that
    is a string — at stage ``request``, each recorded as ``queue.refuse`` in its session;
    the valid ``fs.read`` job stays pending, outside ``left_pending``; exit 0."""
    pending = queue.dir / "pending"
    broken = {
        "garbage.req.json": b"not json at all",
        "array.req.json": b"[1, 2]",
        "number.req.json": b'{"tool": 5, "input": {}}',
        "string.req.json": json.dumps(
            {"tool": "shell.exec", "input": "echo hi", "from": "t", "created": "2026-01-01T00:00Z"}
        ).encode(),
    }
    for name, data in broken.items():
        (pending / name).write_bytes(data)
    other = queue.publish(name="other")  # an fs.read job, for a tool worker
    args = ["--drain", "--json"] if program != "ctx" else ["--kind", "shell", "--drain", "--json"]
    done = subprocess.run(
        work_argv(queue, *args, program=program),
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 0 and TRACEBACK not in done.stderr, done
    stop = objects(done.stdout)[-1]
    assert stop["event"] == "stop" and stop["failed"] == len(broken), stop
    assert stop["left_pending"] == {}, stop
    for name in broken:
        result = finished_once(queue, name, "failed")
        assert (result["error"]["error"], result["error"]["stage"]) == ("EINVAL", "request")
        assert result["reason"].startswith("EINVAL: stored request ") and result["reason"].endswith(
            "[request]"
        ), result
    assert queue.state(other) == "pending"
    refused = sorted(
        e["object"] for e in session_events(queue.storage) if e["type"] == "queue.refuse"
    )
    assert refused == sorted(f"queue/{name}" for name in broken), refused


def test_a_refused_requests_hostile_tool_name_is_summarised_in_the_session(
    queue: QueueCLI, agent: str
) -> None:
    """S-4 (logs record facts and errors, not whole payloads), docs/workers.md stage table:
    a request dropped in ``pending/`` whose ``tool`` is 60 000 characters of no legal name
    fails at stage ``request``; its ``queue.refuse`` event names the job and keeps the tool
    and the reason short (they quote what anyone may write), one line of the session far
    below the size of the request."""
    tool = "no/such tool " * 5000
    (queue.dir / "pending" / "hostile.req.json").write_text(
        json.dumps({"tool": tool, "input": {}, "from": "t", "created": "2026-01-01T00:00:00Z"})
    )
    done = drain(queue)
    assert done.returncode == 0 and TRACEBACK not in done.stderr, done
    result = finished_once(queue, "hostile.req.json", "failed")
    assert result["error"]["stage"] == "request", result
    (refused,) = [e for e in session_events(queue.storage) if e["type"] == "queue.refuse"]
    assert refused["object"] == "queue/hostile.req.json" and refused["status"] == "error"
    assert len(json.dumps(refused)) < 8192, len(json.dumps(refused))
    assert len(str(refused["tool"])) < 2048 and len(str(refused["reason"])) < 4096, refused


def test_a_worker_with_no_agent_fails_every_job_of_every_slot_and_makes_no_session(
    queue: QueueCLI, agent: str, outbox: Path
) -> None:
    """W-1, docs/workers.md (a worker started without an agent warns once on stderr, claims
    jobs and finishes each in ``failed/`` — ``EACCES: this worker was started without
    --agent …``, stage ``authorize`` — without running anything): with ``--concurrency 3``
    and five jobs, one warning line, five failures, no tool run, no agent session made."""
    jobs = [queue.publish(shell_job(f"echo {n} >> {outbox}/ran"), name=f"n{n}") for n in range(5)]
    homes = snapshot(queue.storage / "home")
    done = subprocess.run(
        [*CTX_ARGV, "queue", "work", "--project", queue.project, "--drain", "--json",
         "--concurrency", "3"],
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )  # fmt: skip
    assert done.returncode == 0 and TRACEBACK not in done.stderr, done
    warnings = [line for line in done.stderr.splitlines() if line.startswith("ctx: warning: ")]
    assert len(warnings) == 1 and "--agent" in warnings[0], done.stderr
    for job in jobs:
        result = finished_once(queue, job, "failed")
        assert (result["error"]["error"], result["error"]["stage"]) == ("EACCES", "authorize")
        assert result["reason"].startswith("EACCES: this worker was started without --agent")
    assert not (outbox / "ran").exists()
    assert snapshot(queue.storage / "home") == homes


def test_an_append_only_session_log_still_takes_every_event(queue: QueueCLI, agent: str) -> None:
    """S-5 (one event, one ``write`` on an ``O_APPEND`` descriptor), docs/workers.md (the
    session's refusals that stop a worker are ENOSPC, EDQUOT, EROFS, EPERM, EACCES, EIO):
    an ``events.jsonl`` an operator made append-only (``chattr +a``, as for an audit log) is
    no refusal: a worker appends ``queue.claim``, ``queue.start``, the call and
    ``queue.finish`` to it and finishes the job."""
    first = drain(queue)
    assert first.returncode == 0, first
    log = session_file(queue.storage)
    needs_chattr(log)
    before = log.read_bytes()
    job = queue.publish(shell_job("echo kept"), name="kept")
    chattr("+a", log)
    try:
        done = drain(queue)
    finally:
        chattr("-a", log)
    assert done.returncode == 0 and TRACEBACK not in done.stderr, done
    assert finished_once(queue, job)["output"] == "kept\n"
    after = log.read_bytes()
    assert after.startswith(before)
    added = [json.loads(line)["type"] for line in after[len(before) :].decode().splitlines()]
    for kind in ("queue.claim", "queue.start", "tool_call", "tool_result", "queue.finish"):
        assert kind in added, added


# ------------------------------------------------------------- a lease the host will not renew


RENEWAL_PINS = [
    pytest.param("lease/{J}", "i", id="lease-dir-immutable"),
    pytest.param("lease/{J}", "a", id="lease-dir-append-only"),
    pytest.param("inbox", "a", id="inbox-append-only"),
]


@pytest.mark.parametrize(("place", "letter"), RENEWAL_PINS)
def test_a_renewal_a_pinned_directory_refuses_gives_the_job_up_before_its_lease_lapses(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker], place: str, letter: str
) -> None:
    """docs/workers.md "A renewal the host refuses" (an immutable or append-only directory:
    EPERM; said at once as ``renew_failed``; the worker claims no more jobs; the job's tool
    process group is killed before the lease expires; the job stays claimed with no result,
    reported ``lost``; exit 1 with ``EPERM: the worker stopped: job J was given up: …``,
    the remedy of the attribute and ``ctx queue recover``): the lease's directory (or the
    ``inbox/`` its new version is written in) pinned while the job runs.  The tool is dead
    before the lease's last expiry, nothing is left in ``inbox/``, the lease on disk is the
    last one written; unpinned, recover requeues the job and it runs once."""
    job = queue.publish(gated(outbox, "pin"), name="pin")
    target = queue.dir / place.format(J=job)
    needs_chattr(queue.dir / "inbox")
    worker = start(workers, queue, "--json", "--drain", "--ttl", "3")
    worker.until("claim")
    assert wait_for(lambda: started_job(outbox, "pin"), DEADLINE)
    tool = pid_of(outbox, "pin")
    other = queue.publish(shell_job("echo later"), name="later")
    chattr(f"+{letter}", target)
    try:
        refused = worker.until("renew_failed")
        assert (refused["job"], refused["error"], refused["errno"]) == (job, "EPERM", 1)
        expiry = lease_expiry(queue, job)
        assert wait_for(lambda: not alive(tool), DEADLINE)
        died = time.time()
        rc, lines, err = worker.end()
        kept = queue.lease(job)
    finally:
        chattr(f"-{letter}", target)
    assert died < expiry, (died, expiry)
    stop = stopped_on(rc, lines, err, "EPERM")
    message = stop["error"]["message"]
    assert message.startswith(f"the worker stopped: job {job} was given up: "), message
    assert "chattr -i -a" in message and "ctx queue recover --project proj" in message, message
    (lost,) = [e for e in worker.events() if e["event"] == "lost"]
    assert lost["job"] == job and lost["reason"].startswith("given up: "), lost
    assert stop["left_claimed"] == [job], stop
    assert rfc3339(kept["expires_at"]).timestamp() == expiry
    no_temp_files(queue)
    assert queue.state(job) == "claimed" and queue.state(other) == "pending"
    assert runs(outbox, "pin") == 0
    recovered(queue, job)
    restart(outbox, "pin")
    release(outbox, "pin")
    again = drain(queue)
    assert again.returncode == 0, again
    finished_once(queue, job)
    finished_once(queue, other)
    assert runs(outbox, "pin") == 1


def test_one_slots_lease_given_up_leaves_the_other_slots_job_to_finish(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """docs/workers.md "A renewal the host refuses" (the job given up, the worker claims no
    more jobs) and "Many jobs" (a slot's error stops the worker as SIGTERM does: the running
    jobs finish): two slots; only the first job's lease directory is made immutable.  That
    job is given up (its tool killed, ``lost``, left claimed); the second job's tool runs to
    its end and it is finished done; a third job stays pending; exit 1 EPERM naming the
    first job only."""
    pinned = queue.publish(gated(outbox, "pinned"), name="a-pinned")
    free = queue.publish(gated(outbox, "free"), name="b-free")
    worker = start(workers, queue, "--json", "--concurrency", "2", "--ttl", "3")
    assert wait_for(lambda: started_job(outbox, "pinned") and started_job(outbox, "free"), DEADLINE)
    tool = pid_of(outbox, "pinned")
    third = queue.publish(shell_job("echo third"), name="c-third")
    target = queue.dir / "lease" / pinned
    needs_chattr(target)
    chattr("+i", target)
    try:
        assert worker.until("renew_failed")["job"] == pinned
        assert wait_for(lambda: not alive(tool), DEADLINE)
        assert alive(pid_of(outbox, "free"))
        release(outbox, "free")
        rc, lines, err = worker.end()
    finally:
        chattr("-i", target)
    stop = stopped_on(rc, lines, err, "EPERM")
    assert f"job {pinned} was given up" in stop["error"]["message"], stop
    assert free not in stop["error"]["message"], stop
    assert (stop["done"], stop["lost"], stop["left_claimed"]) == (1, 1, [pinned]), stop
    finished_once(queue, free)
    assert runs(outbox, "free") == 1 and runs(outbox, "pinned") == 0
    assert queue.state(pinned) == "claimed" and queue.state(third) == "pending"
    no_temp_files(queue)


@pytest.mark.parametrize("short_of", ["bytes", "inodes"])
def test_a_renewal_on_a_full_queue_filesystem_gives_the_job_up_and_frees_nothing_wrongly(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker], short_of: str
) -> None:
    """docs/workers.md "A renewal the host refuses" (a full disk, ENOSPC: ``renew_failed``,
    the tool killed before the lease expires, exit 1 ``ENOSPC: the worker stopped: job J was
    given up: …; free space or inodes on that filesystem, then run 'ctx queue recover'``):
    the queue on a small tmpfs that runs out of bytes, or of inodes, while the job runs.
    No temp file of the renewal is left behind; space freed, recover requeues the job and it
    runs once."""
    scratch = ScratchMounts(new_scratch_dir(SCRATCH, "full"))
    try:
        scratch.tmpfs(queue.dir, "size=1m,nr_inodes=64,mode=3770")
        made = queue.run("init")
        assert made.rc == 0, made
        job = queue.publish(gated(outbox, "full"), name="full")
        worker = start(workers, queue, "--json", "--drain", "--ttl", "3")
        worker.until("claim")
        assert wait_for(lambda: started_job(outbox, "full"), DEADLINE)
        tool = pid_of(outbox, "full")
        fill = queue.dir / "fill"
        fill.mkdir()
        if short_of == "bytes":
            with open(fill / "zeros", "wb", buffering=0) as sink, pytest.raises(OSError) as full:
                while True:
                    sink.write(b"\0" * 65536)
        else:
            with pytest.raises(OSError) as full:
                for n in range(100_000):
                    (fill / str(n)).touch()
        assert full.value.errno == errno.ENOSPC
        refused = worker.until("renew_failed")
        assert (refused["job"], refused["error"]) == (job, "ENOSPC"), refused
        expiry = lease_expiry(queue, job)
        assert wait_for(lambda: not alive(tool), DEADLINE)
        assert time.time() < expiry
        rc, lines, err = worker.end()
        stop = stopped_on(rc, lines, err, "ENOSPC")
        message = stop["error"]["message"]
        assert message.startswith(f"the worker stopped: job {job} was given up: "), message
        assert "free space or inodes on that filesystem" in message, message
        assert stop["left_claimed"] == [job], stop
        no_temp_files(queue)
        assert queue.state(job) == "claimed"
        shutil.rmtree(fill)
        recovered(queue, job)
        restart(outbox, "full")
        release(outbox, "full")
        again = drain(queue)
        assert again.returncode == 0, again
        finished_once(queue, job)
    finally:
        scratch.close()
    assert runs(outbox, "full") == 1


# ------------------------------------------------------------- a lease that is not ours to keep


def test_a_lease_rewritten_to_name_another_live_holder_is_left_to_it(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker], helpers: list
) -> None:
    """Q-3 (no other process renews a lease), Q-6 (nothing overwrites lease evidence),
    docs/workers.md "A lease taken away" (``EACCES`` when the job is now leased to someone
    else; the tool is killed; the job reported ``lost``, ``queue.lost`` recorded, nothing
    written; the worker goes on): while the job runs its lease is rewritten to name another
    live process.  The worker's next renewal kills the tool, the job is ``lost`` naming that
    pid, the lease is left byte for byte, the worker runs the next job and exits 0.  Once that
    holder is gone, recover requeues the job and it runs once."""
    holder = subprocess.Popen(["sleep", "600"])
    helpers.append(holder)
    decoy = queue.publish(shell_job("true"), name="decoy")
    assert queue.claim("--pid", str(holder.pid), "--worker", "desk", "--ttl", "600") == decoy
    theirs = queue.lease(decoy)
    job = queue.publish(gated(outbox, "took"), name="took")
    worker = start(workers, queue, "--json", "--drain", "--ttl", "3")
    worker.until("claim", job)
    assert wait_for(lambda: started_job(outbox, "took"), DEADLINE)
    tool = pid_of(outbox, "took")
    queue.publish(shell_job("echo next"), name="next")
    # Written whole and renamed into place, as another tool replaces a lease: the worker's
    # renewal never reads it half written.
    written = json.dumps({**theirs, "job": job}).encode()
    staged = queue.dir.parent / "lease.new"
    staged.write_bytes(written)
    staged.rename(queue.dir / "lease" / job / "worker")
    lost = worker.until("lost", job)
    assert wait_for(lambda: not alive(tool), DEADLINE)
    rc, lines, err = worker.end()
    assert rc == 0 and TRACEBACK not in err, (lines, err)
    assert lost["reason"].startswith(
        f"not finished by this worker: EACCES: job {job} is leased to pid {holder.pid} "
    ), lost
    assert (queue.dir / "lease" / job / "worker").read_bytes() == written
    assert queue.state(job) == "claimed" and runs(outbox, "took") == 0
    assert finished_once(queue, "next.req.json")["output"] == "next\n"
    stop = json.loads(lines[-1])
    assert (stop["lost"], stop["done"], stop["left_claimed"]) == (1, 1, []), stop
    kinds = [e["type"] for e in session_events(queue.storage) if e.get("object") == f"queue/{job}"]
    assert "queue.lost" in kinds and "queue.finish" not in kinds, kinds

    holder.kill()
    holder.wait()
    swept = queue.run("recover", "--json")
    assert swept.rc == 0, swept
    assert sorted(r["job"] for r in swept.json()["requeued"]) == sorted([job, decoy]), swept
    restart(outbox, "took")
    release(outbox, "took")
    again = drain(queue)
    assert again.returncode == 0, again
    finished_once(queue, job)
    assert runs(outbox, "took") == 1


LOCKER = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('locked', flush=True)\n"
    "time.sleep(600)\n"
)


def test_a_lock_held_on_one_job_does_not_let_another_jobs_lease_lapse(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker], helpers: list
) -> None:
    """Q-3, Q-5, I-4, docs/workers.md "One job" ("the worker renews its lease every third of
    the lease lifetime … so the lease always has two thirds of its lifetime left"; "an
    expired lease is proof that its holder is gone"), docs/queue.md (any member of the
    queue's group may lock ``claimed/J``; a transition waits for it): a worker runs two jobs
    at once with ``--ttl 3``; another process keeps ``claimed/`` of the first job locked
    (a ``ctx queue recover`` stopped with ^Z would).  The second job owes nothing to that
    lock: its lease must stay renewed, and ``ctx queue recover`` must leave it to its live
    worker rather than requeue it for a second run beside the first."""
    held = queue.publish(gated(outbox, "held"), name="a-held")
    free = queue.publish(gated(outbox, "free"), name="b-free")
    worker = start(workers, queue, "--json", "--ttl", "3", "--concurrency", "2", "--max-jobs", "2")
    assert wait_for(lambda: started_job(outbox, "held") and started_job(outbox, "free"), DEADLINE)
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(queue.dir / "claimed" / held)],
        stdout=subprocess.PIPE,
        text=True,
    )
    helpers.append(locker)
    assert locker.stdout.readline().strip() == "locked"
    # Two lease lifetimes: long enough for every lease to have been renewed twice.
    time.sleep(6)
    assert alive(pid_of(outbox, "free")), "the free job's tool should still be running"
    try:
        assert lease_expiry(queue, free) > time.time(), queue.lease(free)
        swept = queue.run("recover", "--json")
        assert swept.rc == 0, swept
        assert free not in [r["job"] for r in swept.json()["requeued"]], swept.json()
    finally:
        locker.kill()
        locker.wait()
        release(outbox, "held")
        release(outbox, "free")
        worker.kill()


def test_a_lock_held_on_the_running_jobs_claim_gives_it_up_before_its_lease_lapses(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker], helpers: list
) -> None:
    """docs/workers.md "A renewal the host refuses" ("If the lease could still not be renewed
    when it has less than one round … left, the job's tool process group is killed before
    the lease expires, so that the job never runs beside the copy ``recover`` would
    requeue"), Q-5: another process keeps the running job's ``claimed/J`` locked past its
    ``--ttl 3`` lease.  Once that lease's expiry has passed, its tool must be dead or its
    lease renewed — never a live tool under a lease any ``recover`` may take as proof its
    holder is gone."""
    job = queue.publish(gated(outbox, "self"), name="self")
    worker = start(workers, queue, "--json", "--drain", "--ttl", "3")
    worker.until("claim")
    assert wait_for(lambda: started_job(outbox, "self"), DEADLINE)
    tool = pid_of(outbox, "self")
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(queue.dir / "claimed" / job)],
        stdout=subprocess.PIPE,
        text=True,
    )
    helpers.append(locker)
    assert locker.stdout.readline().strip() == "locked"
    try:
        expiry = lease_expiry(queue, job)
        time.sleep(max(0.0, expiry - time.time()) + 0.5)
        assert not alive(tool) or lease_expiry(queue, job) > time.time(), queue.lease(job)
    finally:
        locker.kill()
        locker.wait()
        release(outbox, "self")
        worker.kill()


def test_a_renewal_given_up_in_text_mode_says_renew_lost_and_the_error_last(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """docs/workers.md "A renewal the host refuses" (``a renew line on stderr`` without
    ``--json``) and "Output" (plain lines; the summary when it stops): a text-mode worker
    whose ``inbox/`` is made immutable while its job runs prints ``renew   J: its lease could
    not be renewed (EPERM: …`` and then ``lost    J: given up: …`` on stderr, its summary
    ``worker stopped: 0 done, 0 failed, 1 lost, …`` on stdout, and ends with ``ctx: EPERM:
    the worker stopped: job J was given up: …``; no JSON anywhere."""
    inbox = queue.dir / "inbox"
    needs_chattr(inbox)
    job = queue.publish(gated(outbox, "txt"), name="txt")
    worker = start(workers, queue, "--drain", "--ttl", "3")
    assert wait_for(lambda: started_job(outbox, "txt"), DEADLINE)
    tool = pid_of(outbox, "txt")
    chattr("+i", inbox)
    try:
        rc, lines, err = worker.end()
    finally:
        chattr("-i", inbox)
    assert rc == 1 and TRACEBACK not in err, (lines, err)
    assert not alive(tool)
    said = err.splitlines()
    renew = [x for x in said if x.startswith(f"renew   {job}: its lease could not be renewed (")]
    assert renew and "EPERM: " in renew[0], err
    assert any(x.startswith(f"lost    {job}: given up: ") for x in said), err
    assert said[-1].startswith(f"ctx: EPERM: the worker stopped: job {job} was given up: "), err
    assert lines[-1].startswith("worker stopped: 0 done, 0 failed, 1 lost, "), lines
    assert not any(x.startswith("{") for x in lines + said), (lines, said)
    assert queue.state(job) == "claimed"
    no_temp_files(queue)


def test_a_timeout_of_a_millisecond_fails_each_job_and_the_worker_goes_on(
    queue: QueueCLI, agent: str, outbox: Path
) -> None:
    """W-4, ``ctx queue work --help`` (``--timeout`` any number of seconds above 0): with
    ``--timeout 0.001`` no tool can finish; each job fails with ETIMEDOUT at stage ``run``
    (or before its tool starts), none is left claimed, no tool runs on, and the worker
    drains the queue and exits 0."""
    jobs = [
        queue.publish(shell_job(f"sleep 1; echo {n} >> {outbox}/late"), name=f"t{n}")
        for n in range(3)
    ]
    done = drain(queue, "--timeout", "0.001")
    assert done.returncode == 0 and TRACEBACK not in done.stderr, done
    for job in jobs:
        result = finished_once(queue, job, "failed")
        assert result["error"]["error"] == "ETIMEDOUT", result
    time.sleep(1.5)
    assert not (outbox / "late").exists()
    queue.assert_settled()


# ------------------------------------------------------------------------------------ signals


def test_two_stop_signals_while_starting_name_the_first(queue: QueueCLI, agent: str) -> None:
    """docs/workers.md "Signals" ("While it starts the same holds … says ``ctx: stopped by
    SIGTERM while starting; no job was claimed`` …, shows its summary (``stopped_by`` the
    signal) and exits 0"): SIGHUP then SIGTERM as soon as the command has taken them.  The
    worker exits 0, and the signal named — in the line on stderr, or in the ``stop``
    summary of a worker that got further — is SIGHUP, the first; no job is left claimed."""
    job = queue.publish(shell_job("echo hi"), name="early")
    proc = subprocess.Popen(
        work_argv(queue, "--drain", "--json"),
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        bit = 1 << (signal.SIGHUP - 1)

        def caught() -> bool:
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
            except FileNotFoundError:
                return True
            line = next(x for x in status.splitlines() if x.startswith("SigCgt"))
            return bool(int(line.split()[1], 16) & bit)

        assert wait_for(caught, DEADLINE, step=0.0005)
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGHUP)
            proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and TRACEBACK not in err, (out, err)
    assert "SIGTERM" not in err, err
    stop = objects(out)[-1]
    assert stop["event"] == "stop" and stop["stopped_by"] in ("SIGHUP", None), stop
    if "while starting" in err:
        assert "ctx: stopped by SIGHUP while starting; no job was claimed" in err, err
        assert stop["stopped_by"] == "SIGHUP" and queue.state(job) == "pending"
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()


def test_sighup_twice_while_a_job_runs_lets_it_finish_once(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """W-4, docs/workers.md "Signals" (SIGHUP — the terminal or ssh session that started it
    closed — stops claiming; running jobs finish; exit 0; ``stopped_by`` names it): two
    SIGHUPs while the job runs are one stop: the job finishes done, once; the job published
    meanwhile stays pending."""
    job = queue.publish(gated(outbox, "hup"), name="hup")
    worker = start(workers, queue, "--json")
    worker.until("claim")
    assert wait_for(lambda: started_job(outbox, "hup"), DEADLINE)
    later = queue.publish(shell_job("echo later"), name="later")
    worker.proc.send_signal(signal.SIGHUP)
    time.sleep(0.2)
    worker.proc.send_signal(signal.SIGHUP)
    time.sleep(0.2)
    release(outbox, "hup")
    rc, lines, err = worker.end()
    assert rc == 0 and TRACEBACK not in err, (lines, err)
    stop = json.loads(lines[-1])
    assert (stop["stopped_by"], stop["done"], stop["aborted"]) == ("SIGHUP", 1, False), stop
    finished_once(queue, job)
    assert runs(outbox, "hup") == 1 and queue.state(later) == "pending"


def test_an_interrupt_after_sighup_is_the_first_and_a_second_aborts_naming_the_job(
    queue: QueueCLI, agent: str, outbox: Path, workers: list[Worker]
) -> None:
    """docs/workers.md "Signals" ("a ^C after a SIGTERM, a SIGHUP … is the first one: the
    running jobs still finish"; a second ^C aborts: running tools are killed, exit 130, the
    jobs left claimed named on stderr — ``ctx: note: left claimed, as the worker was aborted
    before their tools ended: J; 'ctx queue recover' requeues them …`` — and in ``stop``'s
    ``left_claimed``; the killed tool's ``tool_result`` says ``EINTR`` at stage ``run`` with
    exit status 137): SIGHUP, ^C, then ^C again while the job's tool runs.  Recover then
    requeues the job and it runs once."""
    job = queue.publish(gated(outbox, "abort"), name="abort")
    worker = start(workers, queue, "--json")
    worker.until("claim")
    assert wait_for(lambda: started_job(outbox, "abort"), DEADLINE)
    tool = pid_of(outbox, "abort")
    worker.proc.send_signal(signal.SIGHUP)
    time.sleep(0.2)
    worker.proc.send_signal(signal.SIGINT)
    worker.until("interrupt")
    assert alive(tool), "a first ^C lets the running job go on"
    worker.proc.send_signal(signal.SIGINT)
    rc, lines, err = worker.end()
    assert rc == 130 and TRACEBACK not in err, (lines, err)
    assert not alive(tool)
    note = (
        f"ctx: note: left claimed, as the worker was aborted before their tools ended: {job}; "
        "'ctx queue recover --project proj' requeues them once this worker has exited, and "
        "they run again"
    )
    assert note in err, err
    stop = json.loads(lines[-1])
    assert (stop["aborted"], stop["left_claimed"], stop["done"]) == (True, [job], 0), stop
    seen = session_events(queue.storage)
    (call,) = [e["call"] for e in seen if e["type"] == "tool_call" and e.get("job") == job]
    (result,) = [e for e in seen if e["type"] == "tool_result" and e["call"] == call]
    assert (result["errno"], result["stage"], result["exit_status"]) == ("EINTR", "run", 137)
    assert queue.state(job) == "claimed" and runs(outbox, "abort") == 0
    recovered(queue, job)
    restart(outbox, "abort")
    release(outbox, "abort")
    again = drain(queue)
    assert again.returncode == 0, again
    finished_once(queue, job)
    assert runs(outbox, "abort") == 1


def test_a_second_interrupt_aborts_even_with_standard_output_stalled(
    queue: QueueCLI, agent: str, workers: list[Worker]
) -> None:
    """docs/workers.md "Signals" (a second ^C aborts: the worker exits 130 without
    finishing the jobs it runs), "Output": ``ctx queue work --json | less`` with a reader
    that stops reading — here a pipe of 4 KiB nobody reads — fills up with events while
    jobs are finished.  ^C twice must still end the worker with 130: an abort does not wait
    for a reader.  No job is left in two states."""
    reqs = "".join(json.dumps(shell_job("true")) + "\n" for _ in range(60))
    published = queue.run("publish", "--batch", "-", input=reqs)
    assert published.rc == 0, published
    read_end, write_end = os.pipe()
    try:
        fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
        worker = start(workers, queue, "--json", stdout=write_end)
        os.close(write_end)
        write_end = -1

        seen: list[tuple[int, float]] = []

        def stalled() -> bool:
            """No job claimed for 3 s while some are left: the worker waits on the pipe."""
            now = len(queue.entries("pending"))
            if not seen or seen[-1][0] != now:
                seen.append((now, time.monotonic()))
            return 0 < now < 60 and time.monotonic() - seen[-1][1] >= 3.0

        assert wait_for(stalled, DEADLINE * 2, step=0.25), seen
        worker.proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        worker.proc.send_signal(signal.SIGINT)
        try:
            rc = worker.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            rc = None
        assert rc == 130, "the worker did not exit after ^C twice"
    finally:
        if write_end >= 0:
            os.close(write_end)
        os.close(read_end)
    for job, states in queue.requests().items():
        assert len(states) == 1, (job, states)


# ---------------------------------------------------------------------------- waiting for work


def in_user_namespace(argv: list[str], env: dict[str, str], limit: str) -> Worker:
    """``argv`` in a user namespace of its own mapping every id to itself, where the inotify
    ``limit`` (``/proc/sys/user/LIMIT``, a per-namespace limit) is set to 0 first."""
    script = (
        'while [ -z "$(cat /proc/self/gid_map)" ]; do sleep 0.01; done; '
        f'sh -c "echo 0 > /proc/sys/user/{limit}" || exit 99; exec "$@"'
    )
    worker = Worker(["unshare", "--user", "sh", "-c", script, "sh", *argv], env)
    ours = os.readlink("/proc/self/ns/user")

    def unshared() -> bool:
        with contextlib.suppress(OSError):
            return os.readlink(f"/proc/{worker.proc.pid}/ns/user") != ours
        return False

    assert wait_for(unshared, DEADLINE, step=0.005), (worker.out, worker.err)
    for name in ("uid_map", "gid_map"):
        Path(f"/proc/{worker.proc.pid}/{name}").write_text("0 0 4294967295\n")
    return worker


REFUSED_WATCHES = [
    pytest.param("max_inotify_watches", "--json", "inotify watch refused (", id="watches-json"),
    pytest.param("max_inotify_instances", None, "inotify unavailable (", id="instances-text"),
]


@pytest.mark.parametrize(("limit", "mode", "said"), REFUSED_WATCHES)
def test_a_worker_whose_inotify_the_kernel_refuses_backs_off_and_still_finds_new_work(
    queue: QueueCLI, agent: str, workers: list[Worker], limit: str, mode: str | None, said: str
) -> None:
    """W-2, docs/workers.md "Waiting for work" ("Where inotify is unavailable (…, the
    per-user watch limit ``fs.inotify.max_user_watches`` reached …), the worker waits with a
    bounded exponential back-off instead: 50 ms, doubling to at most 2 s … The ``start``
    event (``--json``) says which one it uses (``"wait": "inotify"`` or the reason for the
    back-off)"): a worker in a user namespace whose inotify watches (or instances) are
    limited to none.  It says the reason for its back-off — in the ``start`` event, or its
    text line — finds a job published while it waits within the bound, and stops at once on
    SIGTERM, exit 0."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare")
    # Its tools cannot join a network namespace from a user namespace of their own.
    with (queue.storage / "agent" / f"{AGENT}.d" / "policy").open("a") as policy:
        policy.write("allow ci_t network:default connect\n")
    argv = work_argv(queue, *([mode] if mode else []))
    worker = in_user_namespace(argv, clean_env(CTX_STORAGE=str(queue.storage)), limit)
    workers.append(worker)
    if mode == "--json":
        wait = worker.until("start")["wait"]
    else:
        assert wait_for(lambda: any("started (waiting with" in x for x in worker.out), DEADLINE)
        (line,) = [x for x in worker.out if "started (waiting with" in x]
        wait = line.split("(waiting with ", 1)[1].rstrip(")\n")
    assert wait != "inotify" and wait.startswith(said) and wait.endswith("); back-off"), wait
    time.sleep(2.5)  # the back-off has grown to its bound
    job = queue.publish(shell_job("echo found"), name="found")
    published = time.monotonic()
    assert wait_for(lambda: queue.state(job) == "done", DEADLINE)
    assert time.monotonic() - published < 2.0 + 1.5
    worker.proc.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    rc, lines, err = worker.end()
    assert rc == 0 and TRACEBACK not in err, (lines, err)
    assert time.monotonic() - stopped < 1.5
    finished_once(queue, job)
    assert queue.entries("claimed") == set()


INHERITED = 1100
# A supervisor that leaks descriptors: every number from 3 up to INHERITED open on /dev/null
# and inheritable, then the worker exec'd with them.
LEAKING = (
    "import os, resource, sys\n"
    "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))\n"
    "while True:\n"
    "    fd = os.open('/dev/null', os.O_RDONLY)\n"
    "    os.set_inheritable(fd, True)\n"
    "    if fd >= int(sys.argv[1]):\n"
    "        break\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


@pytest.mark.parametrize(
    "waiting",
    [
        pytest.param(False, id="draining"),
        pytest.param(True, id="waiting"),
    ],
)
def test_a_worker_started_with_many_inherited_descriptors_works_and_waits(
    queue: QueueCLI, agent: str, workers: list[Worker], waiting: bool
) -> None:
    """W-2, docs/workers.md "Waiting for work" and "Many jobs" (a slot's error that is no
    job's failure is EIO "for an unexpected one (a defect)"): a worker started by a process
    that passes it 1 100 open descriptors — a supervisor that leaks them — with a descriptor
    limit that allows them.  Draining, it runs the job; waiting, it runs the job there, waits
    for the next one (on inotify, its descriptors numbered past 1 023) and runs it too, then
    stops on SIGTERM with exit 0 and no failure."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < INHERITED + 512:
        pytest.skip(f"the hard limit of open files ({hard}) is too low")
    first = queue.publish(shell_job("echo one"), name="one")
    args = ["--json", "--drain"] if not waiting else ["--json"]
    argv = [sys.executable, "-c", LEAKING, str(INHERITED), *work_argv(queue, *args)]
    worker = Worker(argv, clean_env(CTX_STORAGE=str(queue.storage)))
    workers.append(worker)
    assert wait_for(lambda: queue.state(first) == "done", DEADLINE), (worker.out, worker.err)
    if waiting:
        time.sleep(0.5)  # now waiting for the next job
        second = queue.publish(shell_job("echo two"), name="two")
        assert wait_for(lambda: queue.state(second) == "done", 10.0), (worker.out, worker.err)
        worker.proc.send_signal(signal.SIGTERM)
    rc, lines, err = worker.end()
    assert rc == 0 and TRACEBACK not in err, (lines, err)
    stop = json.loads(lines[-1])
    assert stop["event"] == "stop" and stop["failure"] is None, stop
    assert stop["done"] == (2 if waiting else 1), stop
