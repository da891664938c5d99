"""``ctx queue work --json`` read as a program reads it: a stream of JSON Lines on stdout.

SPEC §2.4 (``--json`` gives machine-readable output on stdout), §3 (W-1 claim, run, finish in
``done/`` or ``failed/`` with the reason; W-2 ``--drain``; W-4 timeout, SIGTERM) and
docs/workers.md ("Output": one JSON object per event, ``start``, ``claim``, ``finish``,
``lost``, ``renew_failed``, ``interrupt``, ``stop``, the ``stop`` event the summary, and after
it the error object of a worker that stops on an error; "Signals"; "A renewal the host
refuses"; "A lease taken away"; output that cannot be written).

What the stream is held to here:

* every line is one JSON object ending in a newline, whole even when several job slots
  report at once (``--concurrency N``); each event kind has its keys, with their types;
* the order of events: ``start`` first, ``stop`` last (or just before the error object),
  each job's ``claim`` before its ``finish``, never more jobs in flight than slots;
* what it says agrees with the disk (``done/``, ``failed/``, their results), with the
  worker's session (``queue.claim`` / ``queue.start`` / ``queue.finish``) and with the
  ``stop`` summary's counts and lists (``left_claimed``: jobs the worker left claimed);
* a second ^C with two slots, a renewal the host refuses and then accepts, a lease taken
  away, standard output that fills up midway or a reader that leaves, a session the host
  refuses (the error object alone, with the advice that fits).

Real processes, a real agent uid (``nobody``), ``chattr`` and a real tmpfs; nothing of the
product is imported."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
from collections import Counter
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    clean_env,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    wait_for,
)
from tests.acceptance.workercli import AGENT, shell_job
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage
from tests.support.scratch_mounts import ScratchMounts

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the worker's agent runs as another uid: needs root"
)

SCRATCH = scratch_top(__file__)
DEADLINE = 30.0
TRACEBACK = "Traceback (most recent call last)"
NUMBER = (int, float)

# docs/workers.md "Output": the event kinds, each with the keys it carries.
EVENT_KEYS = {
    "start": {"event", "worker", "pid", "wait"},
    "claim": {"event", "job", "tool"},
    "finish": {"event", "job", "state", "reason", "seconds", "tool"},
    "lost": {"event", "job", "state", "reason", "seconds", "tool"},
    "renew_failed": {"event", "job", "error", "errno", "reason"},
    "interrupt": {"event", "message"},
    "stop": {
        "event", "done", "failed", "lost", "seconds", "rate", "aborted", "stopped_by",
        "failure", "left_pending", "left_claimed",
    },
}  # fmt: skip
ERROR_KEYS = {"error", "errno", "message"}


# ---------------------------------------------------------------------------------- helpers


def needs_chattr(path: Path) -> None:
    if shutil.which("chattr") is None:
        pytest.skip("needs chattr")
    probe = path / ".probe"
    probe.write_text("")
    try:
        if subprocess.run(["chattr", "+i", str(probe)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i is not available on this filesystem")
        subprocess.run(["chattr", "-i", str(probe)], check=True)
    finally:
        probe.unlink()


def chattr(flag: str, path: Path) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True)


class Stream:
    """A ``ctx queue work --json`` process whose stdout is read line by line as it comes,
    as a program piping it would, and whose stderr is drained beside it."""

    def __init__(self, queue: QueueCLI, *args: str) -> None:
        argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT]
        self.proc = subprocess.Popen(
            [*argv, "--json", *args],
            env=clean_env(CTX_STORAGE=str(queue.storage)),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.raw: list[bytes] = []
        self.err: list[bytes] = []
        self._readers = [
            threading.Thread(target=self._drain, args=(self.proc.stdout, self.raw), daemon=True),
            threading.Thread(target=self._drain, args=(self.proc.stderr, self.err), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _drain(pipe, into: list[bytes]) -> None:
        for line in pipe:
            into.append(line)

    def objects(self) -> list[dict]:
        """Every line read so far, each of which must be one whole JSON object."""
        seen = []
        for line in list(self.raw):
            assert line.endswith(b"\n"), line
            obj = json.loads(line)
            assert isinstance(obj, dict), line
            seen.append(obj)
        return seen

    def kinds(self) -> list[str]:
        return [o.get("event") for o in self.objects()]

    def saw(self, kind: str, count: int = 1) -> bool:
        return self.kinds().count(kind) >= count

    def until(self, kind: str, count: int = 1) -> dict:
        assert wait_for(lambda: self.saw(kind, count), DEADLINE), (self.raw, self.err)
        return [o for o in self.objects() if o.get("event") == kind][count - 1]

    def end(self) -> tuple[int, list[dict], str]:
        rc = self.proc.wait(timeout=DEADLINE)
        for reader in self._readers:
            reader.join(DEADLINE)
        return rc, self.objects(), b"".join(self.err).decode("utf-8", "replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def streams() -> list[Stream]:
    """Workers started by a test; any still running at its end is killed."""
    started: list[Stream] = []
    yield started
    for stream in started:
        stream.kill()


def gated(outbox: Path, tag: str) -> dict:
    """A shell job that says it started, then waits for ``tag.go`` in ``outbox``."""
    return shell_job(
        f"touch {outbox}/{tag}.started; "
        f"while [ ! -e {outbox}/{tag}.go ]; do sleep 0.02; done; echo {tag}"
    )


def started(outbox: Path, tag: str) -> bool:
    return (outbox / f"{tag}.started").exists()


def release(outbox: Path, *tags: str) -> None:
    for tag in tags:
        (outbox / f"{tag}.go").touch()


def session_events(storage: Path) -> list[dict]:
    (path,) = storage.glob(f"home/*/agent/{AGENT}/session/worker/events.jsonl")
    return read_jsonl(path)


def queue_events_of(storage: Path, job: str) -> list[dict]:
    return [
        e
        for e in session_events(storage)
        if e["type"].startswith("queue.") and e["object"] == f"queue/{job}"
    ]


def result_of(queue: QueueCLI, job: str) -> tuple[str, dict]:
    return queue.only_result(job)


def check_shapes(objects: list[dict]) -> None:
    """Every event has exactly its kind's keys, with the documented types."""
    for obj in objects:
        kind = obj.get("event")
        assert kind in EVENT_KEYS, obj
        assert set(obj) == EVENT_KEYS[kind], obj
        if kind == "start":
            assert isinstance(obj["worker"], str) and obj["worker"], obj
            assert isinstance(obj["pid"], int) and isinstance(obj["wait"], str), obj
        elif kind == "claim":
            assert isinstance(obj["job"], str), obj
            assert obj["tool"] is None or isinstance(obj["tool"], str), obj
        elif kind in ("finish", "lost"):
            assert isinstance(obj["job"], str), obj
            assert obj["state"] in (("done", "failed") if kind == "finish" else ("lost",)), obj
            assert isinstance(obj["seconds"], NUMBER) and obj["seconds"] >= 0, obj
            if obj["state"] == "done":
                assert obj["reason"] is None, obj
            else:
                assert isinstance(obj["reason"], str) and obj["reason"], obj
        elif kind == "renew_failed":
            assert isinstance(obj["error"], str) and isinstance(obj["errno"], int), obj
            assert isinstance(obj["reason"], str) and isinstance(obj["job"], str), obj
        elif kind == "interrupt":
            assert isinstance(obj["message"], str) and obj["message"], obj
        else:
            for count in ("done", "failed", "lost"):
                assert isinstance(obj[count], int) and obj[count] >= 0, obj
            assert isinstance(obj["seconds"], NUMBER) and isinstance(obj["rate"], NUMBER)
            assert isinstance(obj["aborted"], bool), obj
            assert obj["stopped_by"] is None or isinstance(obj["stopped_by"], str), obj
            assert obj["failure"] is None or isinstance(obj["failure"], str), obj
            assert isinstance(obj["left_pending"], dict), obj
            assert isinstance(obj["left_claimed"], list), obj


def check_order(events: list[dict], slots: int) -> None:
    """``start`` first, ``stop`` last, one of each; each job's claim before its outcome, and
    never more jobs in flight than slots."""
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "stop", kinds
    assert kinds.count("start") == 1 and kinds.count("stop") == 1, kinds
    in_flight: Counter[str] = Counter()
    for event in events:
        if event["event"] == "claim":
            in_flight[event["job"]] += 1
            assert sum(in_flight.values()) <= slots, events
        elif event["event"] in ("finish", "lost"):
            assert in_flight[event["job"]] > 0, ("an outcome before its claim", event)
            in_flight[event["job"]] -= 1


# ------------------------------------------------------------------------------------ tests


def test_each_outcome_is_one_typed_line_that_agrees_with_the_disk_and_the_session(
    storage: Path, agent: str, queue: QueueCLI, streams: list[Stream]
) -> None:
    """W-1, W-4, §2.4: a success, a tool failure, a timeout, a refusal by the chain, a tool
    that does not exist and two requests that are no tool call (not JSON; a JSON array),
    drained by three slots.  Every line is one object of a documented kind with its keys;
    each job is claimed once and finished once, in the state and with the reason of its
    result on disk; the claim names the request's tool; the start names this process and the
    worker id its results carry; the session records each job's transitions in order; the
    summary counts what the disk holds."""
    jobs = {
        "ok": shell_job("echo fine"),
        "exits": shell_job("echo out; echo 'gave up here' >&2; exit 3"),
        "slow": shell_job("sleep 30.31"),
        "denied": {"tool": "fs.stat", "input": {"path": "/"}},
        "missing": {"tool": "no.such.tool", "input": {}},
    }
    for name, req in jobs.items():
        queue.publish(req, name=name)
    (queue.dir / "pending" / "broken.req.json").write_text('{"tool": "shell.exec", "inp')
    (queue.dir / "pending" / "array.req.json").write_text('[{"tool": "shell.exec"}]')
    expected = {
        "ok.req.json": ("done", "shell.exec", None),
        "exits.req.json": ("failed", "shell.exec", "exit"),
        "slow.req.json": ("failed", "shell.exec", "run"),
        "denied.req.json": ("failed", "fs.stat", "authorize"),
        "missing.req.json": ("failed", "no.such.tool", "resolve"),
        "broken.req.json": ("failed", None, "request"),
        "array.req.json": ("failed", None, "request"),
    }

    stream = Stream(queue, "--drain", "--concurrency", "3", "--timeout", "1")
    streams.append(stream)
    rc, objects, err = stream.end()
    assert rc == 0 and TRACEBACK not in err, (objects, err)
    check_shapes(objects)
    check_order(objects, slots=3)

    start, stop = objects[0], objects[-1]
    assert start["pid"] == stream.proc.pid, start
    assert start["worker"] == f"{socket.gethostname()}:{stream.proc.pid}", start
    claims = [o for o in objects if o["event"] == "claim"]
    finishes = {o["job"]: o for o in objects if o["event"] == "finish"}
    assert sorted(c["job"] for c in claims) == sorted(expected), claims
    assert set(finishes) == set(expected), finishes
    for claim in claims:
        assert claim["tool"] == expected[claim["job"]][1], claim
    for job, (state, tool, stage) in expected.items():
        on_disk, res = result_of(queue, job)
        assert on_disk == state, (job, res)
        assert finishes[job]["state"] == state and finishes[job]["tool"] == tool, finishes[job]
        assert finishes[job]["reason"] == res.get("reason"), (finishes[job], res)
        assert res["worker"]["id"] == start["worker"], res["worker"]
        if stage is not None:
            assert res["error"]["stage"] == stage, (job, res["error"])
            assert finishes[job]["reason"].endswith(f" [{stage}]"), finishes[job]
    assert finishes["slow.req.json"]["reason"].startswith("ETIMEDOUT: "), finishes
    assert finishes["exits.req.json"]["reason"].startswith("shell.exec exited with status 3")

    done = sum(1 for s, _, _ in expected.values() if s == "done")
    assert (stop["done"], stop["failed"], stop["lost"]) == (done, len(expected) - done, 0)
    assert (stop["aborted"], stop["stopped_by"], stop["failure"]) == (False, None, None), stop
    assert stop["left_pending"] == {} and stop["left_claimed"] == [], stop
    queue.assert_settled()

    for job, (state, _, stage) in expected.items():
        recorded = queue_events_of(storage, job)
        middle = "queue.refuse" if stage == "request" else "queue.start"
        assert [e["type"] for e in recorded] == ["queue.claim", middle, "queue.finish"], job
        assert recorded[-1]["state"] == state, recorded[-1]
        assert recorded[0]["lease"]["worker"] == start["worker"], recorded[0]


def test_slots_reporting_at_once_never_split_a_line_and_the_stream_shows_the_slots(
    storage: Path, agent: str, queue: QueueCLI, outbox: Path, streams: list[Stream]
) -> None:
    """§2.4, docs/workers.md "Many jobs": four slots hold four gated jobs at once (four
    claims and no fifth in the stream), then, released together, twelve more jobs with
    reasons longer than a pipe's atomic write run through them.  Every line is one whole
    object, never more than four jobs in flight, each claim followed by its own finish, and
    the finishes are the disk's."""
    tags = [f"g{n}" for n in range(4)]
    for tag in tags:
        queue.publish(gated(outbox, tag), name=tag)
    long_line = "x" * 6000
    for n in range(12):
        queue.publish(shell_job(f"echo {long_line}{n} >&2; exit {1 + n % 2}"), name=f"f{n:02d}")

    stream = Stream(queue, "--drain", "--concurrency", "4")
    streams.append(stream)
    assert wait_for(lambda: all(started(outbox, t) for t in tags), DEADLINE), stream.raw
    stream.until("claim", 4)
    assert stream.kinds().count("claim") == 4 and not stream.saw("finish"), stream.kinds()
    release(outbox, *tags)
    rc, objects, err = stream.end()
    assert rc == 0 and TRACEBACK not in err, err
    check_shapes(objects)
    check_order(objects, slots=4)
    finishes = [o for o in objects if o["event"] == "finish"]
    assert len(finishes) == 16 and len({f["job"] for f in finishes}) == 16
    for finish in finishes:
        state, res = result_of(queue, finish["job"])
        assert finish["state"] == state and finish["reason"] == res.get("reason"), finish
    assert any(len(line) > 4096 for line in stream.raw), "no line longer than PIPE_BUF"
    assert (objects[-1]["done"], objects[-1]["failed"]) == (4, 12), objects[-1]


def test_a_second_interrupt_with_two_slots_finishes_what_ended_and_names_what_it_left(
    storage: Path, agent: str, queue: QueueCLI, outbox: Path, streams: list[Stream]
) -> None:
    """docs/workers.md "Signals": two slots run ``a`` and ``b``; a first ^C is an
    ``interrupt`` event and claims stop (a third job stays pending); ``a``, released, is
    finished after it; a second ^C aborts ``b``: the ``stop`` event says aborted, stopped by
    SIGINT, one done, ``left_claimed`` naming ``b`` alone; exit 130, and stderr names ``b``.
    On disk and in the session ``a`` is finished and ``b`` claimed with no finish."""
    a = queue.publish(gated(outbox, "a"), name="a")
    b = queue.publish(gated(outbox, "b"), name="b")
    stream = Stream(queue, "--concurrency", "2")
    streams.append(stream)
    assert wait_for(lambda: started(outbox, "a") and started(outbox, "b"), DEADLINE)
    stream.until("claim", 2)
    c = queue.publish(shell_job("echo late"), name="c")
    stream.proc.send_signal(signal.SIGINT)
    stream.until("interrupt")
    release(outbox, "a")
    stream.until("finish")
    stream.proc.send_signal(signal.SIGINT)
    rc, objects, err = stream.end()
    assert rc == 130, (objects, err)
    check_shapes(objects)
    check_order(objects, slots=2)
    kinds = [o["event"] for o in objects]
    assert kinds == ["start", "claim", "claim", "interrupt", "finish", "stop"], kinds
    finish, stop = objects[-2], objects[-1]
    assert (finish["job"], finish["state"]) == (a, "done"), finish
    assert (stop["aborted"], stop["stopped_by"], stop["done"]) == (True, "SIGINT", 1), stop
    assert stop["left_claimed"] == [b], stop
    assert b in err and "left claimed" in err, err
    assert queue.state(a) == "done" and queue.state(b) == "claimed"
    assert queue.state(c) == "pending"
    assert [e["type"] for e in queue_events_of(storage, a)][-1] == "queue.finish"
    assert [e["type"] for e in queue_events_of(storage, b)] == ["queue.claim", "queue.start"]


def test_a_renewal_refused_then_accepted_lets_the_job_finish_and_the_worker_exit_1(
    storage: Path, agent: str, queue: QueueCLI, outbox: Path, streams: list[Stream]
) -> None:
    """docs/workers.md "A renewal the host refuses": with ``inbox/`` immutable a renewal
    fails (``renew_failed``, EPERM) and the worker claims no more jobs; made writable
    again, the next renewal succeeds and the job runs on and is finished (``finish``, done),
    not ``lost``; the worker still exits 1, its ``stop`` event (failure set, nothing left
    claimed) followed by the error object as the last line; the other job stays pending."""
    inbox = queue.dir / "inbox"
    needs_chattr(inbox)
    job = queue.publish(gated(outbox, "r"), name="r")
    stream = Stream(queue, "--ttl", "4.5")
    streams.append(stream)
    assert wait_for(lambda: started(outbox, "r"), DEADLINE)
    stream.until("claim")
    other = queue.publish(shell_job("echo next"), name="next")
    first_expiry = queue.lease(job)["expires_at"]
    chattr("+i", inbox)
    try:
        refused = stream.until("renew_failed")
    finally:
        chattr("-i", inbox)
    assert (refused["job"], refused["error"], refused["errno"]) == (job, "EPERM", 1), refused
    # The keeper's next try, before the lease's last round, renews it.
    assert wait_for(lambda: queue.lease(job)["expires_at"] != first_expiry, DEADLINE)
    release(outbox, "r")
    rc, objects, err = stream.end()
    assert rc == 1 and TRACEBACK not in err, (objects, err)
    *events, error = objects
    check_shapes(events)
    check_order(events, slots=1)
    assert set(error) == ERROR_KEYS and error["error"] == "EPERM", error
    kinds = [e["event"] for e in events]
    assert kinds == ["start", "claim", "renew_failed", "finish", "stop"], kinds
    assert (events[-2]["job"], events[-2]["state"]) == (job, "done"), events[-2]
    stop = events[-1]
    assert stop["stopped_by"] == "failure" and stop["failure"], stop
    assert (stop["done"], stop["lost"], stop["left_claimed"]) == (1, 0, []), stop
    assert queue.state(job) == "done" and queue.state(other) == "pending"
    assert "ctx: EPERM: " in err, err


@pytest.mark.parametrize("then", ["requeued", "finished-elsewhere"])
def test_a_job_whose_lease_was_taken_away_is_lost_but_not_left_claimed(
    storage: Path, agent: str, queue: QueueCLI, outbox: Path, streams: list[Stream], then: str
) -> None:
    """docs/workers.md "A lease taken away": the lease of the running job is removed and
    ``recover --reconcile`` puts the job back in pending.  Either this draining worker claims
    it again and finishes it (``requeued``), or another holder claims and finishes it by
    hand first (``finished-elsewhere``).  The first run is reported ``lost`` (a ``lost``
    event, a ``lost`` count) and nothing of it is written.  This worker left no job claimed:
    the job is in ``done/``, so ``stop``'s ``left_claimed`` (the jobs left claimed with no
    result) must not name it."""
    job = queue.publish(gated(outbox, "t"), name="t")
    stream = Stream(queue, "--drain")
    streams.append(stream)
    assert wait_for(lambda: started(outbox, "t"), DEADLINE)
    stream.until("claim")
    shutil.rmtree(queue.dir / "lease" / job)
    fixed = queue.run("recover", "--reconcile")
    assert fixed.rc == 0 and queue.state(job) == "pending", fixed
    if then == "finished-elsewhere":
        assert queue.claim() == job
        queue.finish(job)
    release(outbox, "t")
    rc, objects, err = stream.end()
    assert rc == 0 and TRACEBACK not in err, (objects, err)
    check_shapes(objects)
    check_order(objects, slots=1)
    lost = [o for o in objects if o["event"] == "lost"]
    assert [o["job"] for o in lost] == [job], objects
    stop = objects[-1]
    assert stop["lost"] == 1 and stop["done"] == (1 if then == "requeued" else 0), stop
    assert queue.state(job) == "done"
    assert stop["left_claimed"] == [], stop


def test_standard_output_that_fills_up_midway_names_the_jobs_it_could_not_show(
    storage: Path, agent: str, queue: QueueCLI, streams: list[Stream]
) -> None:
    """docs/workers.md "Output": stdout on a filesystem that fills up after the ``start``
    and ``claim`` lines: the worker stops claiming, finishes the jobs it runs (one done, one
    failed), exits 74 and says ``ctx: ENOSPC: cannot write standard output (…); the worker
    stopped claiming jobs; it finished 2 jobs; not shown: …`` naming both jobs in the
    directories that hold them; the third job stays pending."""
    scratch = ScratchMounts(new_scratch_dir(SCRATCH, "full"))
    try:
        small = scratch.tmpfs("out", "size=4k,mode=0755")
        out = small / "stream.jsonl"
        start = '{"event": "start", "worker": "w1", "pid": 1234567, "wait": "inotify"}\n'
        claim = '{"event": "claim", "job": "j7.req.json", "tool": "shell.exec"}\n'
        # Room for the start line and both claims, not for a finish line.
        out.write_text("#" * (4096 - len(start) - 2 * len(claim) - 20) + "\n")
        j7 = queue.publish(shell_job("sleep 0.5; echo ok"), name="j7")
        j8 = queue.publish(shell_job("sleep 0.5; exit 3"), name="j8")
        argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT,
                "--json", "--drain", "--concurrency", "2", "--worker", "w1"]  # fmt: skip
        with out.open("a") as sink:
            done = subprocess.run(
                argv,
                stdout=sink,
                stderr=subprocess.PIPE,
                env=clean_env(CTX_STORAGE=str(queue.storage)),
                timeout=DEADLINE,
            )
        written = out.read_text().splitlines()[1:]
        j9 = queue.publish(shell_job("echo later"), name="j9")
    finally:
        scratch.close()
    err = done.stderr.decode()
    assert done.returncode == 74, (written, err)
    assert [json.loads(line)["event"] for line in written[:3]] == ["start", "claim", "claim"]
    assert err.startswith(
        "ctx: ENOSPC: cannot write standard output (No space left on device); the worker "
        "stopped claiming jobs; it finished 2 jobs; not shown: "
    ), err
    shown = err.rstrip("\n").split("; not shown: ", 1)[1].split(", ")
    assert sorted(shown) == [f"{j7} in done/", f"{j8} in failed/"], err
    assert queue.state(j7) == "done" and queue.state(j8) == "failed"
    assert queue.state(j9) == "pending"


def test_a_reader_that_leaves_lets_both_running_jobs_finish_and_claims_no_more(
    storage: Path, agent: str, queue: QueueCLI, outbox: Path
) -> None:
    """docs/workers.md "Output": a reader that closes the pipe after two ``claim`` lines of a
    two-slot worker: once the next line cannot be written, the worker claims nothing more,
    both running jobs are finished in ``done/`` (whose lines nobody reads), the third stays
    pending, and the worker ends quietly with 141."""
    for tag in ("p", "q"):
        queue.publish(gated(outbox, tag), name=tag)
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT,
            "--json", "--concurrency", "2"]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        lines = [json.loads(proc.stdout.readline())["event"] for _ in range(3)]
        assert lines == ["start", "claim", "claim"], lines
        proc.stdout.close()
        last = queue.publish(shell_job("echo later"), name="r")
        release(outbox, "p", "q")
        rc = proc.wait(timeout=DEADLINE)
        err = proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (rc, err) == (141, ""), err
    assert queue.state("p.req.json") == "done" and queue.state("q.req.json") == "done"
    assert queue.state(last) == "pending"
    # The worker is gone: its session holds every finish it made.
    finished = [e for e in session_events(storage) if e["type"] == "queue.finish"]
    assert sorted(e["object"] for e in finished) == ["queue/p.req.json", "queue/q.req.json"]


def test_a_session_the_host_refuses_is_the_one_error_line_with_the_advice_that_fits(
    storage: Path, agent: str, queue: QueueCLI
) -> None:
    """docs/workers.md "Who may start one": a worker whose session the host refuses exits 1
    with that errno, the session and the entry refused, that no job was claimed, and the
    advice that fits.  Here root's worker meets an immutable ``events.jsonl`` (EPERM): its
    stream is the error object alone, the job stays pending, and the advice is about the
    attribute (as the worker says for a tool's log), not to start it as root, which it is,
    or to create a home that exists."""
    first = subprocess.run(
        [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT, "--drain"],
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        capture_output=True,
        timeout=DEADLINE,
    )
    assert first.returncode == 0, first
    (events,) = storage.glob(f"home/*/agent/{AGENT}/session/worker/events.jsonl")
    needs_chattr(events.parent)
    job = queue.publish(shell_job("echo ok"), name="s")
    chattr("+i", events)
    try:
        done = subprocess.run(
            [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT,
             "--drain", "--json"],
            env=clean_env(CTX_STORAGE=str(queue.storage)),
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )  # fmt: skip
    finally:
        chattr("-i", events)
    assert done.returncode == 1, done
    (line,) = done.stdout.splitlines()
    error = json.loads(line)
    assert set(error) == ERROR_KEYS and (error["error"], error["errno"]) == ("EPERM", 1), error
    assert str(events) in error["message"] and "no job was claimed" in error["message"], error
    assert queue.state(job) == "pending"
    assert "start it as root" not in error["message"], error["message"]
