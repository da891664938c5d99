"""§2 Q-5, Q-6, I-1, I-3, I-5: ``ctx queue recover`` on the leftovers a crash can leave, made by
hand on disk the way §2.1/§2.2 describe them.  Lease holders are real processes: a live
``sleep`` child, killed when the test needs a crashed worker."""

from __future__ import annotations

import json
import os
import subprocess
import uuid

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    age,
    clean_env,
    find_values,
    kill,
    result,
    snapshot,
)

DAY = 86400
PAST = "2000-01-01T00:00:00Z"  # reading: lease times are RFC 3339, like every other timestamp


def held(queue: QueueCLI, holder: subprocess.Popen, name: str = "job") -> str:
    """A job claimed on behalf of ``holder`` (Q-2, Q-3); returns J."""
    job = queue.drop(name)
    assert queue.claim("--pid", str(holder.pid)) == job
    return job


def left_by_a_crash_long_ago(queue: QueueCLI) -> None:
    """Make every entry of the queue's state directories a day old.

    # reading: Q-6 names the leftovers without an age, but an implementation may spare very
    # young ones, since a live claimer or finisher can be between two of its steps; a day-old
    # leftover is one under every reading.
    """
    for sub in ("pending", "claimed", "lease", "done", "failed"):
        for path in (queue.dir / sub).rglob("*"):
            age(path, DAY)


def said(r) -> str:
    return r.out + r.err


def assert_requeued(queue: QueueCLI, job: str, before_request: bytes) -> None:
    assert queue.state(job) == "pending"
    assert (queue.dir / "pending" / job).read_bytes() == before_request
    assert not (queue.dir / "claimed" / job).exists()
    assert not (queue.dir / "lease" / job).exists()


def claimed_request(queue: QueueCLI, job: str) -> bytes:
    return (queue.dir / "claimed" / job / job).read_bytes()


# --- when is a lease holder provably gone? -------------------------------------------------


def test_recover_requeues_a_claim_whose_holder_died_and_converges(queue, child):
    """Q-5, I-5, §2.4: holder on this host and boot, its pid dead: --dry-run reports the job and
    changes nothing; recover puts it back in ``pending/J``; a second run changes nothing.

    # reading: the exit status of --dry-run is not pinned down (the queue is not consistent
    # afterwards), so 0 or 1 is accepted.
    """
    job = held(queue, child)
    request = claimed_request(queue, job)
    kill(child)
    before = snapshot(queue.dir)
    dry = queue.run("recover", "--dry-run")
    assert dry.rc in (0, 1), dry
    assert job in said(dry)
    assert snapshot(queue.dir) == before
    first = queue.run("recover")
    assert first.rc == 0, first
    assert job in said(first)
    assert_requeued(queue, job, request)
    after = snapshot(queue.dir)
    second = queue.run("recover", "--reconcile")
    assert second.rc == 0, second
    assert snapshot(queue.dir) == after


def test_recover_never_touches_a_claim_whose_holder_is_alive(queue, child):
    """Q-5, Q-6, I-4: a live holder's job stays claimed under recover and --reconcile."""
    job = held(queue, child)
    before = snapshot(queue.dir)
    for args in ((), ("--reconcile",)):
        r = queue.run("recover", *args)
        assert r.rc == 0, r
        assert snapshot(queue.dir) == before
    assert queue.state(job) == "claimed"


def test_a_shell_that_claimed_and_exited_is_a_dead_holder(queue):
    """§2.4, Q-5: the holder of a claim made from a shell is that shell; once it has exited,
    recover requeues the job, while a claim held by this live test process stays."""
    gone = queue.drop("from-shell")
    script = f'"$0" queue claim --project {queue.project} >/dev/null; exit 0'
    env = clean_env(CTX_STORAGE=str(queue.storage))
    subprocess.run(["sh", "-c", script, *CTX_ARGV], env=env, check=True, timeout=60)
    mine = queue.drop("from-me")
    assert queue.claim() == mine
    request = claimed_request(queue, gone)
    r = queue.run("recover")
    assert r.rc == 0, r
    assert_requeued(queue, gone, request)
    assert queue.state(mine) == "claimed"


def test_recover_requeues_a_lease_taken_before_the_host_rebooted(queue, child):
    """Q-5: same host with another boot id is proof the holder is gone, even though a process
    with the recorded pid is running now."""
    job = held(queue, child)
    request = claimed_request(queue, job)
    lease = queue.lease(job)
    lease["boot_id"] = str(uuid.uuid4())
    queue.write_lease(job, lease)
    r = queue.run("recover")
    assert r.rc == 0, r
    assert_requeued(queue, job, request)


def test_recover_requeues_when_the_recorded_pid_now_belongs_to_another_process(queue, child):
    """Q-5: same boot and pid namespace, the pid alive but with another start time (reused):
    the holder is gone."""
    job = held(queue, child)
    request = claimed_request(queue, job)
    kill(child)
    lease = queue.lease(job)
    lease["pid"] = os.getpid()  # alive, but started at another time than the recorded holder
    queue.write_lease(job, lease)
    r = queue.run("recover")
    assert r.rc == 0, r
    assert_requeued(queue, job, request)


@pytest.mark.parametrize(
    "elsewhere",
    ["other-pid-namespace", "other-host"],
)
def test_a_dead_pid_is_no_proof_across_pid_namespaces_or_hosts(queue, child, elsewhere):
    """Q-5, N-1: a pid alone is never proof across hosts or pid namespaces: with an unexpired
    lease the job stays claimed even though no process with that pid runs here."""
    job = held(queue, child)
    kill(child)
    lease = queue.lease(job)
    if elsewhere == "other-pid-namespace":
        lease["pid_ns"] = lease["pid_ns"] + 1
    else:
        lease["host"] = "elsewhere.example"
        lease["boot_id"] = str(uuid.uuid4())
        lease["pid_ns"] = lease["pid_ns"] + 1
    queue.write_lease(job, lease)
    before = snapshot(queue.dir)
    r = queue.run("recover", "--reconcile")
    assert snapshot(queue.dir) == before, r
    assert queue.state(job) == "claimed"


def test_recover_requeues_an_expired_lease_from_another_host(queue, child):
    """Q-5, N-1: across hosts the lease's expiry is the proof that its holder is gone."""
    job = held(queue, child)
    request = claimed_request(queue, job)
    lease = queue.lease(job)
    lease.update(host="elsewhere.example", boot_id=str(uuid.uuid4()), expires_at=PAST)
    queue.write_lease(job, lease)
    r = queue.run("recover")
    assert r.rc == 0, r
    assert_requeued(queue, job, request)


def test_recover_does_not_requeue_over_pending_evidence(queue, child):
    """Q-5, Q-6: a dead holder's claim is not requeued when ``pending/J`` exists too: that is a
    conflict, reported even by --reconcile (exit 1), and the pending request is not
    overwritten."""
    job = held(queue, child)
    kill(child)
    (queue.dir / "pending" / job).write_text(json.dumps({"other": "copy"}))
    left_by_a_crash_long_ago(queue)
    before = snapshot(queue.dir)
    r = queue.run("recover", "--reconcile")
    assert r.rc == 1, r
    assert job in said(r)
    assert snapshot(queue.dir) == before


# --- incomplete pairs ------------------------------------------------------------------------


def test_claim_without_lease_is_reported_then_reconciled_back_to_pending(queue):
    """Q-6, §2.4: ``claimed/J/J`` without ``lease/J/worker`` (a crash between Q-2 and Q-3):
    status lists it among the incomplete pairs; plain recover reports it and changes nothing
    (exit 1); --dry-run changes nothing; --reconcile puts it back in pending (exit 0); a
    second run changes nothing (I-5).

    # reading: in ``status --json`` the job is named inside a value under ``incomplete``.
    """
    job = "half-claimed.req.json"
    (queue.dir / "claimed" / job).mkdir()
    request = json.dumps({"tool": "fs.read", "input": {}, "from": "t", "created": PAST})
    (queue.dir / "claimed" / job / job).write_text(request)
    left_by_a_crash_long_ago(queue)
    before = snapshot(queue.dir)

    status = queue.run("status", "--json")
    assert job in json.dumps(find_values(status.json(), "incomplete")), status

    plain = queue.run("recover")
    assert plain.rc == 1, plain
    assert job in said(plain)
    assert snapshot(queue.dir) == before

    dry = queue.run("recover", "--reconcile", "--dry-run", "--json")
    json.loads(dry.out)
    assert snapshot(queue.dir) == before

    fixed = queue.run("recover", "--reconcile")
    assert fixed.rc == 0, fixed
    assert_requeued(queue, job, request.encode())
    after = snapshot(queue.dir)
    again = queue.run("recover", "--reconcile")
    assert again.rc == 0, again
    assert snapshot(queue.dir) == after


@pytest.mark.parametrize("state", ["done", "failed"])
def test_result_beside_a_claimed_request_rolls_forward(queue, child, state):
    """Q-6, I-3: ``STATE/J.result`` with the request still in ``claimed/J/J`` (a crash inside
    Q-4): plain recover reports and changes nothing (exit 1), never requeues; --reconcile
    finishes the rename and removes claim and lease (exit 0)."""
    job = held(queue, child)
    request = claimed_request(queue, job)
    kill(child)
    outcome = json.dumps(result(state)).encode()
    (queue.dir / state / f"{job}.result").write_bytes(outcome)
    left_by_a_crash_long_ago(queue)
    before = snapshot(queue.dir)

    plain = queue.run("recover", "--json")
    assert plain.rc == 1, plain
    assert job in plain.out
    json.loads(plain.out)
    assert snapshot(queue.dir) == before

    fixed = queue.run("recover", "--reconcile")
    assert fixed.rc == 0, fixed
    assert queue.state(job) == state
    assert (queue.dir / state / job).read_bytes() == request
    assert (queue.dir / state / f"{job}.result").read_bytes() == outcome
    assert not (queue.dir / "claimed" / job).exists()
    assert not (queue.dir / "lease" / job).exists()
    assert queue.entries("pending") == set()


def test_reconcile_leaves_a_finish_in_progress_by_a_live_holder_alone(queue, child):
    """Q-6: neither recover nor --reconcile touches a job whose lease holder is alive, even
    with its result already in place."""
    job = held(queue, child)
    (queue.dir / "done" / f"{job}.result").write_text(json.dumps(result("done")))
    before = snapshot(queue.dir)
    queue.run("recover", "--reconcile")
    assert snapshot(queue.dir) == before


def test_empty_claim_directory_is_removed_by_reconcile_only(queue):
    """Q-6: an empty ``claimed/J`` (a crash between ``mkdir`` and the rename of Q-2) is reported
    by plain recover (exit 1) and removed by --reconcile (exit 0); ``pending/J`` is kept."""
    job = queue.drop("mid-claim")
    (queue.dir / "claimed" / job).mkdir()
    request = (queue.dir / "pending" / job).read_bytes()
    left_by_a_crash_long_ago(queue)
    before = snapshot(queue.dir)

    plain = queue.run("recover")
    assert plain.rc == 1, plain
    assert snapshot(queue.dir) == before

    fixed = queue.run("recover", "--reconcile")
    assert fixed.rc == 0, fixed
    assert queue.entries("claimed") == set()
    assert (queue.dir / "pending" / job).read_bytes() == request


def test_lease_left_after_the_terminal_rename_is_removed_by_reconcile(queue, child):
    """Q-6, I-3: a crash in Q-4 after ``done/J`` and ``done/J.result`` were in place but before
    the lease and claim were removed: --reconcile removes the orphan ``lease/J`` and the empty
    ``claimed/J``, keeps the pair, and the job never returns to pending."""
    job = held(queue, child)
    kill(child)
    outcome = json.dumps(result("done")).encode()
    (queue.dir / "done" / f"{job}.result").write_bytes(outcome)
    os.rename(queue.dir / "claimed" / job / job, queue.dir / "done" / job)
    request = (queue.dir / "done" / job).read_bytes()
    left_by_a_crash_long_ago(queue)
    before = snapshot(queue.dir)

    plain = queue.run("recover")
    assert plain.rc == 1, plain
    assert snapshot(queue.dir) == before

    fixed = queue.run("recover", "--reconcile")
    assert fixed.rc == 0, fixed
    assert queue.entries("lease") == set() and queue.entries("claimed") == set()
    assert (queue.dir / "done" / job).read_bytes() == request
    assert (queue.dir / "done" / f"{job}.result").read_bytes() == outcome
    assert queue.entries("pending") == set()


def test_reconcile_removes_stray_temp_files_older_than_the_grace_period(queue):
    """Q-6, §2.4: stray temp files in ``inbox/`` older than --grace SECONDS are removed by
    --reconcile; younger ones, and every one under --dry-run, stay.

    # reading: any regular file left in the staging directory is a temp file.
    """
    inbox = queue.dir / "inbox"
    old, young = inbox / "crashed-publish.tmp", inbox / "in-flight.tmp"
    old.write_text('{"tool": "fs.read", "inp')
    young.write_text('{"tool": "fs.re')
    age(old, 3600)
    age(young, 5)

    queue.run("recover", "--reconcile", "--dry-run", "--grace", "600")
    assert queue.entries("inbox") == {old.name, young.name}
    queue.run("recover", "--reconcile", "--grace", "7200")
    assert queue.entries("inbox") == {old.name, young.name}
    r = queue.run("recover", "--reconcile", "--grace", "600")
    assert r.rc == 0, r
    assert queue.entries("inbox") == {young.name}


# --- conflicts ------------------------------------------------------------------------------


def test_pending_and_done_at_once_is_a_conflict_reported_with_every_piece_of_evidence(queue):
    """Q-6: ``J`` both pending and done is a conflict: reported with every piece of evidence,
    exit 1, never resolved, under recover and --reconcile.

    # reading: evidence is named by its path inside the queue directory.
    """
    job = queue.drop("twice-seen")
    queue.terminal("twice-seen", "done")
    left_by_a_crash_long_ago(queue)
    before = snapshot(queue.dir)
    for args in ((), ("--reconcile",)):
        r = queue.run("recover", *args)
        assert r.rc == 1, r
        for piece in (f"pending/{job}", f"done/{job}", f"done/{job}.result"):
            assert piece in said(r), (piece, r)
        assert snapshot(queue.dir) == before


def test_two_results_for_one_claimed_job_are_a_conflict(queue, child):
    """Q-6: a claimed job with both ``done/J.result`` and ``failed/J.result`` is a conflict:
    --reconcile reports it (exit 1) and keeps every file."""
    job = held(queue, child)
    kill(child)
    (queue.dir / "done" / f"{job}.result").write_text(json.dumps(result("done")))
    (queue.dir / "failed" / f"{job}.result").write_text(json.dumps(result("failed")))
    left_by_a_crash_long_ago(queue)
    before = snapshot(queue.dir)
    r = queue.run("recover", "--reconcile")
    assert r.rc == 1, r
    assert job in said(r)
    assert snapshot(queue.dir) == before


def test_recover_never_returns_a_finished_job_to_pending(queue):
    """I-3: after ``finish`` returned, recover --reconcile leaves the terminal pair alone."""
    job = queue.drop("finished")
    assert queue.claim() == job
    queue.finish(job)
    before = snapshot(queue.dir)
    r = queue.run("recover", "--reconcile")
    assert r.rc == 0, r
    assert snapshot(queue.dir) == before
    assert queue.state(job) == "done"


def test_a_dry_run_reports_what_it_would_do_and_exits_as_the_queue_stays(queue):
    """Q-6, §2.4: ``recover --reconcile --dry-run`` changes nothing, so its exit status is that
    of the queue as it leaves it: 1 while an incomplete pair remains.  Its report says what it
    would do (``applied`` false, "would repair"), and removes no temp file, even on paper."""
    job = "half-claimed.req.json"
    (queue.dir / "claimed" / job).mkdir()
    request = json.dumps({"tool": "fs.read", "input": {}, "from": "t", "created": PAST})
    (queue.dir / "claimed" / job / job).write_text(request)
    (queue.dir / "inbox" / "crashed.tmp").write_text('{"tool"')
    left_by_a_crash_long_ago(queue)
    before = snapshot(queue.dir)

    dry = queue.run("recover", "--reconcile", "--dry-run", "--grace", "0", "--json")
    assert dry.rc == 1, dry
    report = dry.json()
    assert [(f["job"], f["applied"]) for f in report["repaired"]] == [(job, False)]
    assert report["removed_temps"] == [] and report["consistent"] is False
    text = queue.run("recover", "--reconcile", "--dry-run", "--grace", "0")
    assert text.rc == 1, text
    assert f"would repair   {job}" in text.out and "would remove inbox/" in text.out, text
    assert "1 would repair" in text.out and "queue NOT consistent" in text.out, text
    assert " 1 repaired" not in text.out and "queue consistent" not in text.out, text
    assert snapshot(queue.dir) == before

    fixed = queue.run("recover", "--reconcile", "--grace", "0", "--json")
    assert fixed.rc == 0 and fixed.json()["repaired"][0]["applied"] is True, fixed
    clean = queue.run("recover", "--reconcile", "--dry-run", "--grace", "0")
    assert clean.rc == 0 and "queue consistent" in clean.out, clean


def test_a_stray_temp_file_alone_leaves_the_queue_consistent(queue):
    """Q-6: exit 1 only while incomplete pairs (plain recover) or conflicts remain; a stray
    temp file in ``inbox/`` is neither: plain recover reports it and exits 0."""
    (queue.dir / "inbox" / "tmpx").write_text("x\n")
    r = queue.run("recover", "--grace", "0")
    assert r.rc == 0, r
    assert "stale    inbox/tmpx" in r.out and "queue consistent" in r.out, r
    assert queue.run("recover", "--grace", "0", "--json").json()["stale_temps"] == ["inbox/tmpx"]
