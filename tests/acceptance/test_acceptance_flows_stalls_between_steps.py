"""End-to-end flows of a ``ctx queue`` command frozen between two steps of its protocol for
longer than a lease's ttl while other commands work the queue, then resumed (SPEC §2.2 Q-1 …
Q-6, §2.3 I-1 … I-5, §2.4 exit statuses; docs/queue.md "claim", "finish", "Liveness",
"`status`, `list` and `show` read the queue without its locks").

A command is frozen for real: run under ``strace``, it is sent SIGSTOP as one chosen system
call of one step returns (``-e inject=CALL:signal=SIGSTOP:when=N``, ``-P`` naming the
directory or file of that step), or held on entering one (``delay_enter``), and continued with
SIGCONT once the other commands are done.  Meanwhile ``status``, ``show``, ``list``,
``recover``, ``recover --reconcile``, ``claim`` and ``publish`` run as a user runs them.

What a user expects: every published job ends exactly once in ``done/`` or ``failed/``, or
stays visibly in one documented state; a claim in progress is never requeued from under its
claimer; a finish in progress never leaves a conflict or a lost job; a renewal that comes too
late never extends a lease someone else holds; a publish in flight confuses nobody; the
readers exit as §2.4 says (0, or 1 only for a real conflict)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, QueueCLI, Run, clean_env, request, wait_for
from tests.support.strace import can_inject

pytestmark = pytest.mark.skipif(not can_inject(), reason="needs strace fault injection")

TRACEBACK = "Traceback (most recent call last)"
TTL = "0.5"  # seconds: every stall below outlasts the lease


# ------------------------------------------------------------------------------ helpers


class Frozen:
    """``ctx queue VERB …`` run under strace and frozen at one call until :meth:`resume`."""

    def __init__(self, queue: QueueCLI, trace: Path, argv: list[str], data: bytes) -> None:
        self.queue = queue
        self.trace = trace
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=clean_env(CTX_STORAGE=str(queue.storage)),
        )
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.close()
        self.proc.stdin = None
        self.argv = argv

    def lines(self) -> list[str]:
        return self.trace.read_text().splitlines() if self.trace.exists() else []

    def wait_stopped(self) -> None:
        stopped = wait_for(lambda: any("--- stopped by SIGSTOP" in s for s in self.lines()), 30)
        assert stopped, (self.argv, self.lines()[-5:], self.proc.poll())

    @property
    def pid(self) -> int:
        """The traced ``ctx`` process (the first pid of the trace)."""
        return int(self.lines()[0].split()[0])

    def resume(self) -> Run:
        os.kill(self.pid, signal.SIGCONT)
        return self.finish()

    def finish(self) -> Run:
        out, err = self.proc.communicate(timeout=60)
        return Run(self.argv[-6:], self.proc.returncode, out.decode(), err.decode())


@contextlib.contextmanager
def frozen(queue: QueueCLI, tmp: Path, verb: str, *args: str, call: str, nth: int = 1,
           path: Path, delay_us: int = 0, data: bytes = b"") -> Iterator[Frozen]:  # fmt: skip
    """``ctx queue VERB ARGS`` frozen as its ``nth`` ``call`` on ``path`` returns (SIGSTOP),
    or, with ``delay_us``, held that long as it enters that call."""
    trace = tmp / f"{verb}-{call}-{nth}.trace"
    action = f"delay_enter={delay_us}" if delay_us else "signal=SIGSTOP"
    argv = ["strace", "-f", "-qq", "-o", str(trace), "-P", str(path), "-e", f"trace={call}",
            "-e", f"inject={call}:{action}:when={nth}",
            *CTX_ARGV, "queue", verb, "--project", queue.project, *args]  # fmt: skip
    run = Frozen(queue, trace, argv, data)
    if not delay_us:
        run.wait_stopped()
    try:
        yield run
    finally:
        if run.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, IndexError, ValueError):
                os.kill(run.pid, signal.SIGKILL)
            run.proc.kill()
            run.proc.wait()


def expiry(lease: dict) -> datetime:
    return datetime.fromisoformat(lease["expires_at"].replace("Z", "+00:00"))


def now() -> datetime:
    return datetime.now(UTC)


def outlive(queue: QueueCLI, job: str) -> None:
    """Wait (with a deadline) until J's lease has expired."""
    lease = queue.lease(job)
    assert wait_for(lambda: now() > expiry(lease), 10), lease


def sane(run: Run, *codes: int) -> Run:
    assert run.rc in codes, run
    assert TRACEBACK not in run.err, run
    return run


def status(queue: QueueCLI) -> dict:
    return sane(queue.run("status", "--json"), 0).json()


def recover(queue: QueueCLI, *args: str) -> dict:
    return sane(queue.run("recover", "--json", *args), 0).json()


def names(entries: list) -> list[str]:
    """The job names a recover report lists (entries are names or objects naming one)."""
    found = []
    for entry in entries:
        found.append(entry if isinstance(entry, str) else entry.get("job", entry.get("name")))
    return found


@pytest.fixture
def holder() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture
def other_holder() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def finish_ok(queue: QueueCLI, job: str, output: dict) -> Run:
    return sane(queue.run("finish", job, "--ok", "-", input=json.dumps(output)), 0)


# ------------------------------------------------------------------------------ claim


def test_claim_frozen_after_its_move_keeps_the_job_from_recover_and_other_claimers(
    queue: QueueCLI, tmp_path: Path, holder: subprocess.Popen
) -> None:
    """Q-2, Q-3, Q-5: between the claim move and the lease the job is claimed without a lease;
    recover must not requeue it while the claim holds ``claimed/J``, nobody else gets it."""
    job = queue.publish(request(tag="a"), name="a")
    d = queue.dir
    with frozen(queue, tmp_path, "claim", "--ttl", TTL, "--pid", str(holder.pid),
                call="renameat2", path=d / "pending") as claim:  # fmt: skip
        assert (d / "claimed" / job / job).is_file() and not (d / "lease" / job).exists()
        time.sleep(0.7)  # the stall outlasts any lease of this ttl
        st = status(queue)
        assert st["pending"] == 0 and st["claimed"] == 1 and st["conflict"] == 0, st
        shown = sane(queue.run("show", job, "--json"), 0).json()
        assert shown["state"] == "claimed", shown
        for args in ((), ("--reconcile",)):
            report = recover(queue, *args)
            assert report["consistent"] is True and report["requeued"] == [], report
            assert report["repaired"] == [], report
            assert (d / "claimed" / job / job).is_file(), report
        assert not (d / "pending" / job).exists()
        other = sane(queue.run("claim", "--ttl", "60"), 3)
        assert other.out == "", other
        again = sane(queue.run("publish", "--name", "a", "-", input=json.dumps(request())), 1)
        assert "EEXIST" in again.err, again
        run = claim.resume()
    assert sane(run, 0).out.strip() == job
    assert queue.state(job) == "claimed"
    lease = queue.lease(job)
    assert lease["pid"] == holder.pid
    finish_ok(queue, job, {"n": 1})
    state, result = queue.only_result(job)
    assert state == "done" and result["output"] == {"n": 1}
    queue.assert_settled()


def test_claim_frozen_before_its_lease_move_returns_a_lease_still_valid(
    queue: QueueCLI, tmp_path: Path, holder: subprocess.Popen
) -> None:
    """Q-3, Q-5, I-4: a claim that returns J has leased J; the lease it hands over must not be
    one that recover may take away at once (the claimer has not even learnt J's name)."""
    job = queue.publish(request(tag="b"), name="b")
    d = queue.dir
    with frozen(queue, tmp_path, "claim", "--ttl", TTL, "--pid", str(holder.pid),
                call="mkdirat", path=d / "lease") as claim:  # fmt: skip
        assert (d / "lease" / job).is_dir() and not (d / "lease" / job / "worker").exists()
        time.sleep(0.7)
        report = recover(queue, "--reconcile")
        assert report["requeued"] == [] and (d / "claimed" / job / job).is_file(), report
        run = claim.resume()
    returned = now()
    assert sane(run, 0).out.strip() == job
    lease = queue.lease(job)
    report = recover(queue)  # the holder is alive: only an expired lease would make it gone
    assert report["requeued"] == [] and queue.state(job) == "claimed", (report, lease)
    assert expiry(lease) > returned, (lease, returned)


# ------------------------------------------------------------------------------ finish


def test_finish_frozen_between_result_and_request_move_is_left_alone_then_completes(
    queue: QueueCLI, tmp_path: Path, holder: subprocess.Popen
) -> None:
    """Q-4, Q-5, Q-6, I-3: the result is in ``done/``, the request still in ``claimed/J/``, the
    lease expired and its holder dead; recover must neither requeue nor roll it forward under
    the finisher, status/show say it is being moved (exit 0), and the finish then completes."""
    job = queue.publish(request(tag="c"), name="c")
    assert queue.claim("--ttl", TTL, "--pid", str(holder.pid)) == job
    d = queue.dir
    with frozen(queue, tmp_path, "finish", job, "--ok", "-", call="renameat2",
                path=d / "done", data=b'{"v": 3}') as fin:  # fmt: skip
        assert (d / "done" / f"{job}.result").is_file() and (d / "claimed" / job / job).is_file()
        outlive(queue, job)
        holder.kill()
        holder.wait()
        st = status(queue)
        assert st["conflict"] == 0 and st["done"] + st["claimed"] == 1, st
        shown = sane(queue.run("show", job), 0)
        assert job in shown.out, shown
        for args in ((), ("--reconcile",)):
            report = recover(queue, *args)
            assert report["requeued"] == [] and report["repaired"] == [], report
        assert not (d / "pending" / job).exists()
        assert (d / "claimed" / job / job).is_file() and not (d / "done" / job).exists()
        assert sane(queue.run("claim", "--ttl", "60"), 3).out == ""
        run = fin.resume()
    assert sane(run, 0).rc == 0
    state, result = queue.only_result(job)
    assert state == "done" and result["output"] == {"v": 3}
    queue.assert_settled()


def test_finish_frozen_before_its_lock_finds_the_job_requeued_and_refuses(
    queue: QueueCLI, tmp_path: Path, holder: subprocess.Popen, other_holder: subprocess.Popen
) -> None:
    """Q-4, Q-5, Q-6, I-4: a finish frozen before it locks ``claimed/J`` while the lease expires,
    recover requeues J and another claimer takes it: the late finish must not leave two
    outcomes; J ends once, with the result of whoever finished it."""
    job = queue.publish(request(tag="d"), name="d")
    assert queue.claim("--ttl", TTL, "--pid", str(holder.pid)) == job
    d = queue.dir
    with frozen(queue, tmp_path, "finish", job, "--ok", "-", call="openat",
                path=d / "claimed", data=b'{"late": true}') as fin:  # fmt: skip
        outlive(queue, job)
        report = recover(queue)
        assert names(report["requeued"]) == [job], report
        assert queue.claim("--ttl", "60", "--pid", str(other_holder.pid)) == job
        run = fin.resume()
    sane(run, 1)
    assert queue.state(job) == "claimed" and queue.lease(job)["pid"] == other_holder.pid
    assert queue.entries("done") == set() and queue.entries("inbox") == set()
    finish_ok(queue, job, {"new": 1})
    assert queue.only_result(job)[0] == "done"
    queue.assert_settled()


def test_late_finish_says_where_the_job_is_not_that_there_is_no_such_job(
    queue: QueueCLI, tmp_path: Path, holder: subprocess.Popen, other_holder: subprocess.Popen
) -> None:
    """§2.4, Q-4: ``finish`` of a job it does not hold says where J is instead; J is claimed
    (by another holder), which ``ctx queue show J`` says, so "no such job" misleads."""
    job = queue.publish(request(tag="m"), name="m")
    assert queue.claim("--ttl", TTL, "--pid", str(holder.pid)) == job
    d = queue.dir
    with frozen(queue, tmp_path, "finish", job, "--ok", "-", call="openat",
                path=d / "claimed", data=b'{"late": true}') as fin:  # fmt: skip
        outlive(queue, job)
        assert names(recover(queue)["requeued"]) == [job]
        assert queue.claim("--ttl", "60", "--pid", str(other_holder.pid)) == job
        run = fin.resume()
    assert sane(run, 1).rc == 1
    assert sane(queue.run("show", job, "--json"), 0).json()["state"] == "claimed"
    assert "no such job" not in run.err and "not claimed" not in run.err, run
    assert "EACCES" in run.err and "was claimed again, by another claim" in run.err, run


# ------------------------------------------------------------------------------ renew


def test_renew_frozen_past_expiry_does_not_extend_the_lease_someone_else_took(
    queue: QueueCLI, tmp_path: Path, holder: subprocess.Popen, other_holder: subprocess.Popen
) -> None:
    """Q-3, Q-5, I-4: a renewal that comes after recover requeued J and another claimed it is
    refused (the lease names another holder) and leaves the new lease as it was."""
    job = queue.publish(request(tag="e"), name="e")
    assert queue.claim("--ttl", TTL, "--pid", str(holder.pid)) == job
    d = queue.dir
    with frozen(queue, tmp_path, "renew", job, "--pid", str(holder.pid), "--ttl", "3600",
                call="openat", path=d / "claimed") as ren:  # fmt: skip
        outlive(queue, job)
        report = recover(queue)
        assert names(report["requeued"]) == [job], report
        assert queue.claim("--ttl", "60", "--pid", str(other_holder.pid)) == job
        taken = queue.lease(job)
        run = ren.resume()
    sane(run, 1)
    assert queue.lease(job) == taken
    finish_ok(queue, job, {"once": True})
    assert queue.only_result(job)[0] == "done"
    queue.assert_settled()


def test_renew_held_before_its_lock_after_expiry_is_refused_once_requeued(
    queue: QueueCLI, tmp_path: Path, holder: subprocess.Popen
) -> None:
    """Q-3, Q-5: a renewal held on entering its lock while recover requeues the expired job
    finds J pending: refused with exit 1 saying so; J stays pending, not leased."""
    job = queue.publish(request(tag="f"), name="f")
    assert queue.claim("--ttl", TTL, "--pid", str(holder.pid)) == job
    d = queue.dir
    outlive(queue, job)
    with frozen(queue, tmp_path, "renew", job, "--pid", str(holder.pid), call="flock",
                path=d / "claimed" / job, delay_us=2_500_000) as ren:  # fmt: skip
        assert wait_for(lambda: "flock(" in "".join(ren.lines()), 20), ren.lines()
        report = recover(queue)
        assert names(report["requeued"]) == [job], report
        run = ren.finish()
    sane(run, 1)
    assert "pending" in run.err, run
    assert queue.state(job) == "pending" and queue.entries("lease") == set()
    assert queue.claim("--ttl", "60") == job
    finish_ok(queue, job, {})
    queue.assert_settled()


# ------------------------------------------------------------------------------ publish


def test_publish_frozen_in_inbox_confuses_no_reader_and_no_second_publisher(
    queue: QueueCLI, tmp_path: Path
) -> None:
    """Q-1, Q-6, I-1: a request written to ``inbox/J.publish.tmp`` but not yet moved is a temp
    file, not a job: status/list/recover exit 0, a second publisher of J is refused, a claim
    finds nothing; resumed, the publish succeeds and J is pending once."""
    d = queue.dir
    temp = d / "inbox" / "g.req.json.publish.tmp"
    with frozen(queue, tmp_path, "publish", "--name", "g", "-", call="fsync", path=temp,
                data=json.dumps(request(tag="g")).encode()) as pub:  # fmt: skip
        assert temp.is_file() and queue.entries("pending") == set()
        st = status(queue)
        assert st["pending"] == 0 and st["conflict"] == 0 and st["incomplete"] == [], st
        listed = sane(queue.run("list", "--json"), 0)
        assert 'g.req.json"' not in listed.out.replace(".publish.tmp", ""), listed
        for args in ((), ("--reconcile",)):
            report = recover(queue, *args)
            assert report["consistent"] is True and temp.is_file(), report
        assert sane(queue.run("claim"), 3).out == ""
        second = sane(queue.run("publish", "--name", "g", "-", input=json.dumps(request())), 1)
        assert "EEXIST" in second.err, second
        run = pub.resume()
    assert sane(run, 0).out.strip() == "g.req.json"
    assert queue.requests() == {"g.req.json": ["pending"]}
    assert json.loads((d / "pending" / "g.req.json").read_text())["tag"] == "g"
    assert queue.entries("inbox") == set()


def test_publish_frozen_past_the_grace_period_is_not_lost_silently(
    queue: QueueCLI, tmp_path: Path
) -> None:
    """Q-1, Q-6, I-1: a publisher frozen longer than the grace period while ``recover
    --reconcile`` runs: either its temp stays (a live publisher holds it) and the publish
    succeeds, or the publish fails saying nothing was published; never success without J."""
    d = queue.dir
    temp = d / "inbox" / "h.req.json.publish.tmp"
    with frozen(queue, tmp_path, "publish", "--name", "h", "-", call="fsync", path=temp,
                data=json.dumps(request(tag="h")).encode()) as pub:  # fmt: skip
        old = time.time() - 3600
        os.utime(temp, (old, old))
        recover(queue, "--reconcile")
        run = pub.resume()
    sane(run, 0, 1)
    if run.rc == 0:
        assert queue.requests() == {"h.req.json": ["pending"]}, (run, queue.requests())
    else:
        assert "nothing was published" in run.err, run
        assert queue.requests() == {}
    assert temp.exists() is False


def test_publish_whose_temp_was_removed_names_the_temp_not_pending(
    queue: QueueCLI, tmp_path: Path
) -> None:
    """Q-1, docs/queue.md (a refusal names the directory that refused and what to do): the
    message of a publish whose staging file vanished names that file (or ``inbox/``)."""
    d = queue.dir
    temp = d / "inbox" / "n.req.json.publish.tmp"
    with frozen(queue, tmp_path, "publish", "--name", "n", "-", call="fsync", path=temp,
                data=json.dumps(request(tag="n")).encode()) as pub:  # fmt: skip
        old = time.time() - 3600
        os.utime(temp, (old, old))
        recover(queue, "--reconcile")
        run = pub.resume()
    assert sane(run, 1).rc == 1 and "nothing was published" in run.err, run
    assert (d / "pending").is_dir()
    assert "pending refused" not in run.err and "inbox" in run.err, run


def test_publish_batch_frozen_between_moves_is_published_whole_and_each_job_runs_once(
    queue: QueueCLI, tmp_path: Path
) -> None:
    """Q-1, I-1: a batch frozen after its first move: the moved job is pending and may be
    claimed and finished meanwhile; resumed, the batch prints every name and each job ends
    once."""
    d = queue.dir
    lines = "".join(json.dumps(request(tag=str(i))) + "\n" for i in range(3)).encode()
    with frozen(queue, tmp_path, "publish", "--batch", "-", call="renameat2",
                path=d / "pending", data=lines) as batch:  # fmt: skip
        first = sorted(queue.entries("pending"))
        assert len(first) == 1, first
        st = status(queue)
        assert st["pending"] == 1 and st["conflict"] == 0, st
        assert queue.claim("--ttl", "60") == first[0]
        finish_ok(queue, first[0], {"early": True})
        recover(queue, "--reconcile")
        run = batch.resume()
    published = sane(run, 0).lines()
    assert len(published) == 3 and published[0] == first[0], run
    while sane(claim := queue.run("claim", "--ttl", "60"), 0, 3).rc == 0:
        finish_ok(queue, claim.out.strip(), {})
    assert queue.requests() == {name: ["done"] for name in published}
    queue.assert_settled()


# ------------------------------------------------------------------------------ recover


def test_recover_frozen_mid_requeue_leaves_no_double_claim(
    queue: QueueCLI, tmp_path: Path, holder: subprocess.Popen
) -> None:
    """Q-5, I-4, I-5: recover frozen after moving J back to ``pending/`` but before removing
    the lease and ``claimed/J``: a claimer meanwhile gets nothing or J once; resumed, recover
    exits 0, and J is run exactly once."""
    job = queue.publish(request(tag="i"), name="i")
    assert queue.claim("--ttl", TTL, "--pid", str(holder.pid)) == job
    d = queue.dir
    outlive(queue, job)
    with frozen(queue, tmp_path, "recover", "--json", call="renameat2",
                path=d / "pending") as rec:  # fmt: skip
        assert (d / "pending" / job).is_file() and (d / "claimed" / job).is_dir()
        st = sane(queue.run("status", "--json"), 0).json()
        assert st["conflict"] == 0, st
        sane(queue.run("show", job), 0)
        meanwhile = sane(queue.run("claim", "--ttl", "60"), 0, 3)
        run = rec.resume()
    assert names(sane(run, 0).json()["requeued"]) == [job], run
    if meanwhile.rc == 3:
        assert queue.claim("--ttl", "60") == job
    else:
        assert meanwhile.out.strip() == job and queue.state(job) == "claimed"
    finish_ok(queue, job, {"i": 1})
    assert sane(queue.run("claim"), 3).out == ""
    assert queue.only_result(job)[0] == "done"
    queue.assert_settled()


def test_reconcile_frozen_mid_roll_forward_while_status_and_finish_run(
    queue: QueueCLI, tmp_path: Path, holder: subprocess.Popen
) -> None:
    """Q-6, I-3, I-5: an interrupted finish (result beside the claimed request, holder gone)
    rolled forward by a ``recover --reconcile`` frozen after its move: status and show exit 0,
    a claim finds nothing, and the resumed run completes J once."""
    job = queue.publish(request(tag="k"), name="k")
    assert queue.claim("--ttl", "60", "--pid", str(holder.pid)) == job
    d = queue.dir
    with frozen(queue, tmp_path, "finish", job, "--ok", "-", call="renameat2",
                path=d / "done", data=b'{"k": 1}') as fin:  # fmt: skip
        os.kill(fin.pid, signal.SIGKILL)
        fin.finish()
    holder.kill()
    holder.wait()
    assert (d / "done" / f"{job}.result").is_file() and (d / "claimed" / job / job).is_file()
    with frozen(queue, tmp_path, "recover", "--reconcile", "--json", call="renameat2",
                path=d / "done") as rec:  # fmt: skip
        assert (d / "done" / job).is_file()
        st = sane(queue.run("status", "--json"), 0).json()
        assert st["conflict"] == 0, st
        assert sane(queue.run("show", job, "--json"), 0).json()["state"] in ("claimed", "done")
        assert sane(queue.run("claim", "--ttl", "60"), 3).out == ""
        run = rec.resume()
    sane(run, 0)
    state, result = queue.only_result(job)
    assert state == "done" and result["output"] == {"k": 1}
    queue.assert_settled()


# ------------------------------------------------------------------------------ readers


def test_status_frozen_mid_scan_while_a_job_moves_to_done_counts_it_once(
    queue: QueueCLI, tmp_path: Path
) -> None:
    """§2.4, Q-6: status frozen after it listed ``pending/`` while J is claimed and finished:
    resumed, it reports no conflict (exit 0) and J once."""
    job = queue.publish(request(tag="s"), name="s")
    d = queue.dir
    with frozen(queue, tmp_path, "status", "--json", call="getdents64",
                path=d / "pending") as st:  # fmt: skip
        assert queue.claim("--ttl", "60") == job
        finish_ok(queue, job, {})
        run = st.resume()
    report = sane(run, 0).json()
    assert report["conflict"] == 0, report
    total = sum(report[s] for s in ("pending", "claimed", "done", "failed"))
    assert total == 1, report
