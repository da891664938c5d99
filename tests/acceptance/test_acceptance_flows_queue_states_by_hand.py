"""Queue directories arranged by hand into combinations no crash of the protocol makes, but an
operator, a backup restore or a second tool may (SPEC §2.1 durable states, §2.3 I-1, I-3, I-5,
Q-3 lease fields, Q-5 liveness, Q-6 incomplete pairs and conflicts, Q-8 non-jobs, R-3 names,
§2.4 exit statuses; docs/queue.md "Layout and states", "What a crash leaves, and what recover
does with it", "Liveness (Q-5)", "What is not a job (Q-8)").

Each arrangement is looked at with every reading command (``status``, ``list``, ``show``, all
with ``--json``) and every recover (``--dry-run``, plain, ``--reconcile``, ``--grace``): they
must agree with each other and with the state table, exit as §2.4 says, never print a
traceback, never touch the job of a live holder, never lose or duplicate a request, and a
second recover must change nothing.

The arrangements: one job's evidence in both terminal states; results with no request; a claim
directory holding a stray file or a second request; a lease directory holding a stray file; a
lease that is empty, or valid JSON missing a field Q-3 names, or hand-written without the
fields Q-3 does not name; a lease naming pid 1 (alive, but another process) with and without a
start time; leases expiring at the far ends of the calendar; a claim without a lease dated
decades back or ahead, and one whose ``claimed/J`` someone holds locked; inbox files of every
kind; two thousand incomplete pairs of three kinds; names at R-3's length limit and names
differing only in case; root-owned mode-000 evidence in a queue a non-root user works; a state
directory replaced by a file or a symbolic link.  Lease holders are real processes."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    age,
    clean_env,
    new_scratch_dir,
    request,
    result,
    scratch_top,
    snapshot,
)
from tests.support.users import run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
DEAD_PID = 4_000_000  # below PID_MAX_LIMIT, above any pid this machine hands out
DAY = 86400
YEAR = 365 * DAY
READERS = ("status", "list", "show")

# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def live() -> Iterator[subprocess.Popen]:
    """A live process to stand in as a lease holder; killed and reaped at teardown."""
    proc = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def no_traceback(*runs) -> None:
    for r in runs:
        assert "Traceback" not in r.out + r.err, r


def read_all(queue: QueueCLI, job: str) -> dict:
    """``status``, ``list`` and ``show J``, each with ``--json``: name -> Run."""
    runs = {
        "status": queue.run("status", "--json"),
        "list": queue.run("list", "--json"),
        "show": queue.run("show", job, "--json"),
    }
    no_traceback(*runs.values())
    return runs


def recover(queue: QueueCLI, *args: str):
    r = queue.run("recover", "--json", *args)
    no_traceback(r)
    return r


def jobs_in(report: dict, key: str) -> list[str]:
    return sorted(entry["job"] for entry in report[key])


def claimed_for(queue: QueueCLI, pid: int, name: str = "j", **extra) -> str:
    """J published and claimed by hand for process ``pid`` (``claim --pid``)."""
    job = queue.publish(request(tag=name, **extra), name=name)
    r = queue.run("claim", "--pid", str(pid))
    assert (r.rc, r.out.strip()) == (0, job), r
    return job


def rewrite_lease(queue: QueueCLI, job: str, text: str) -> None:
    (queue.dir / "lease" / job / "worker").write_text(text)


def edit_lease(queue: QueueCLI, job: str, **changes) -> dict:
    """The lease with ``changes`` applied (a value of None drops the field)."""
    lease = queue.lease(job)
    for key, value in changes.items():
        if value is None:
            lease.pop(key, None)
        else:
            lease[key] = value
    rewrite_lease(queue, job, json.dumps(lease))
    return lease


def assert_conflict_everywhere(queue: QueueCLI, job: str) -> None:
    """Every reader calls J a conflict (exit 1); every recover reports it, exits 1 and changes
    nothing, twice over (Q-6, I-5, §2.4)."""
    before = snapshot(queue.dir)
    runs = read_all(queue, job)
    for name in READERS:
        assert runs[name].rc == 1, runs[name]
    status = runs["status"].json()
    assert [c["job"] for c in status["conflicts"]] == [job], status
    assert status["conflict"] == 1 and status["counts"]["conflict"] == 1, status
    assert runs["list"].json() == [{"name": job, "state": "conflict"}], runs["list"]
    assert runs["show"].json()["state"] == "conflict", runs["show"]
    assert runs["show"].json()["repair"] is None, runs["show"]
    for args in (
        ("--dry-run",),
        (),
        ("--reconcile",),
        ("--reconcile",),
        ("--reconcile", "--grace", "0"),
    ):
        r = recover(queue, *args)
        assert r.rc == 1, r
        report = r.json()
        assert report["consistent"] is False, r
        assert jobs_in(report, "conflicts") == [job], r
        assert report["requeued"] == [] and report["repaired"] == [], r
        assert snapshot(queue.dir) == before, r


def requeued_once(queue: QueueCLI, job: str, original: bytes) -> None:
    """J back in pending/ with the bytes it had, nowhere else; a further recover of each kind
    changes nothing and calls the queue consistent (I-1, I-5)."""
    assert (queue.dir / "pending" / job).read_bytes() == original
    assert queue.requests() == {job: ["pending"]}
    assert not (queue.dir / "claimed" / job).exists()
    assert not (queue.dir / "lease" / job).exists()
    after = snapshot(queue.dir)
    for args in ((), ("--reconcile",)):
        r = recover(queue, *args)
        assert r.rc == 0 and r.json()["consistent"] is True, r
        assert r.json()["requeued"] == [] and r.json()["repaired"] == [], r
    assert snapshot(queue.dir) == after


# ------------------------------------------------------------------- terminal evidence twice


@pytest.mark.parametrize("second", ["whole failed pair", "failed result only"])
def test_one_job_in_both_terminal_states_is_a_conflict_nobody_resolves(queue, second):
    """§2.1, Q-6, I-3: ``done/J`` + ``done/J.result`` beside ``failed/J`` + its result (or
    only ``failed/J.result``), as a restore merging two backups leaves it: every reader says
    conflict (exit 1), every recover reports it with every piece of evidence and deletes
    nothing, and J cannot be published again."""
    job = queue.terminal("j", "done")
    if second == "whole failed pair":
        queue.terminal("j", "failed")
    else:
        (queue.dir / "failed" / f"{job}.result").write_text(json.dumps(result("failed")))
    assert_conflict_everywhere(queue, job)
    evidence = recover(queue).json()["conflicts"][0]["evidence"]
    expected = {f"done/{job}", f"done/{job}.result", f"failed/{job}.result"}
    if second == "whole failed pair":
        expected.add(f"failed/{job}")
    assert set(evidence) == expected, evidence
    again = queue.run("publish", "--name", "j", "-", input=json.dumps(request()))
    assert again.rc == 1 and "EEXIST" in again.err, again
    assert queue.entries("pending") == set()


def test_results_without_their_requests_are_conflicts_that_hold_the_name(queue):
    """Q-6 ("a result without its terminal request"), Q-1: ``done/J.result`` and
    ``failed/K.result`` alone are conflicts for every command, never removed by
    ``--reconcile``, and publishing J or K again is refused (``EEXIST``): the result is
    evidence that the job ran."""
    (queue.dir / "done" / "j.req.json.result").write_text(json.dumps(result("done")))
    (queue.dir / "failed" / "k.req.json.result").write_text(json.dumps(result("failed")))
    before = snapshot(queue.dir)
    status = queue.run("status", "--json")
    assert status.rc == 1, status
    assert sorted(c["job"] for c in status.json()["conflicts"]) == ["j.req.json", "k.req.json"]
    listed = queue.run("list", "--json")
    assert listed.rc == 1 and {e["state"] for e in listed.json()} == {"conflict"}, listed
    for job in ("j.req.json", "k.req.json"):
        shown = queue.run("show", job, "--json")
        assert shown.rc == 1 and shown.json()["state"] == "conflict", shown
    for args in (("--dry-run",), (), ("--reconcile",), ("--reconcile",)):
        r = recover(queue, *args)
        assert r.rc == 1, r
        assert jobs_in(r.json(), "conflicts") == ["j.req.json", "k.req.json"], r
    assert snapshot(queue.dir) == before
    for name in ("j", "k"):
        again = queue.run("publish", "--name", name, "-", input=json.dumps(request()))
        assert again.rc == 1 and "EEXIST" in again.err, again
    assert snapshot(queue.dir) == before


# ------------------------------------------------------------- stray files in claim and lease


@pytest.mark.parametrize(
    "stray, holder",
    [
        ("claimed/J/notes.txt", "dead"),
        ("claimed/J/k.req.json", "alive"),
        ("lease/J/notes", "alive"),
        ("lease/J/worker.bak", "dead"),
    ],
)
def test_a_stray_file_beside_the_request_or_the_lease_makes_the_job_a_conflict(
    queue, live, holder, stray
):
    """Q-8, Q-6 (docs/queue.md: "anything in ``claimed/J/`` or ``lease/J/`` besides its one
    file makes the job a conflict"): a claimed job with a note, a second request or a lease
    backup dropped beside its own file is a conflict for every command whether its holder is
    dead or alive; nothing is requeued, moved or removed (the second request stays where it
    is), and the stray file is listed as ignored."""
    pid = DEAD_PID if holder == "dead" else live.pid
    job = claimed_for(queue, pid)
    path = stray.replace("J", job, 1)
    (queue.dir / path).write_text(json.dumps(request(tag="stray")))
    assert_conflict_everywhere(queue, job)
    ignored = queue.run("status", "--json").json()["ignored"]
    assert [entry["path"] for entry in ignored] == [path], ignored
    assert (queue.dir / "claimed" / job / job).is_file()
    assert (queue.dir / path).is_file()


def test_a_claim_directory_holding_only_a_stray_file_is_never_emptied(queue):
    """Q-6 ("an empty ``claimed/J``" is removed), Q-8: ``claimed/J`` holding only a note (no
    request, no lease) is not empty: --reconcile leaves it and its note, and calls it a
    conflict (exit 1)."""
    job = "j.req.json"
    (queue.dir / "claimed" / job).mkdir()
    (queue.dir / "claimed" / job / "notes").write_text("operator was here")
    assert_conflict_everywhere(queue, job)
    assert (queue.dir / "claimed" / job / "notes").read_text() == "operator was here"


# ------------------------------------------------------------------------ malformed leases


@pytest.mark.parametrize(
    "lease",
    [
        "",
        "{}",
        "drop:pid",
        "drop:expires_at",
        "drop:boot_id",
        "pid:0",
        "expires_at:NaN",
        "expires_at:true",
    ],
)
def test_a_lease_that_cannot_be_read_is_a_conflict_never_a_requeue(queue, lease):
    """Q-3, Q-5, Q-6 (docs/queue.md: "A claimed job whose lease cannot be read at all (empty,
    not JSON, a field missing or malformed ...) ... is never requeued, and it is reported as
    a conflict"): the holder's pid is dead, yet the job stays claimed under every recover,
    ``show`` judges the holder ``unreadable``, and the readers agree (exit 1)."""
    job = claimed_for(queue, DEAD_PID)
    if lease.startswith("drop:"):
        edit_lease(queue, job, **{lease[5:]: None})
    elif lease.startswith("pid:"):
        edit_lease(queue, job, pid=int(lease[4:]))
    elif lease == "expires_at:NaN":
        text = json.dumps(queue.lease(job))
        rewrite_lease(queue, job, text.replace(json.dumps(queue.lease(job)["expires_at"]), "NaN"))
    elif lease == "expires_at:true":
        edit_lease(queue, job, expires_at=True)
    else:
        rewrite_lease(queue, job, lease)
    request_bytes = (queue.dir / "claimed" / job / job).read_bytes()
    assert_conflict_everywhere(queue, job)
    assert queue.run("show", job, "--json").json()["holder"]["state"] == "unreadable"
    assert (queue.dir / "claimed" / job / job).read_bytes() == request_bytes


def test_a_hand_written_lease_with_only_the_fields_q3_names_is_judged(queue):
    """Q-3, Q-5 (docs/queue.md: ``job`` may be absent, the start time may be absent, the
    ``pid_ns`` may be written ``pid:[N]``, times may be epoch seconds or RFC 3339 without a
    zone): a lease another tool wrote that way, for a dead pid on this host, is read, its
    holder judged gone, and the job requeued once."""
    job = claimed_for(queue, DEAD_PID)
    lease = queue.lease(job)
    written = {
        "worker": "other-tool",
        "host": lease["host"],
        "boot_id": lease["boot_id"],
        "pid_ns": f"pid:[{lease['pid_ns']}]",
        "pid": DEAD_PID,
        "claimed_at": time.time() - 5,
        "expires_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 3600)),
    }
    rewrite_lease(queue, job, json.dumps(written))
    original = (queue.dir / "claimed" / job / job).read_bytes()
    shown = queue.run("show", job, "--json")
    assert shown.rc == 0 and shown.json()["holder"]["state"] == "gone", shown
    dry = recover(queue, "--dry-run")
    assert jobs_in(dry.json(), "requeued") == [job], dry
    assert dry.json()["requeued"][0]["applied"] is False, dry
    r = recover(queue)
    assert r.rc == 0 and jobs_in(r.json(), "requeued") == [job], r
    requeued_once(queue, job, original)


def test_pid_one_without_a_start_time_keeps_its_job_and_with_a_wrong_one_loses_it(queue, live):
    """Q-5 (docs/queue.md: without a start time "a live pid cannot be proven reused, so its
    holder counts as alive"; with another start time the pid was reused): a lease naming pid
    1 on this host, which is alive but is not the claimer, keeps J through every recover
    (``untouched``, exit 0) while it records no start time; once it records a start time
    pid 1 does not have, J is requeued, exactly once."""
    job = claimed_for(queue, live.pid)
    edit_lease(queue, job, pid=1, create_time=None)
    before = snapshot(queue.dir)
    runs = read_all(queue, job)
    assert [runs[name].rc for name in READERS] == [0, 0, 0], runs
    assert runs["show"].json()["holder"]["state"] == "alive", runs["show"]
    for args in (("--dry-run",), (), ("--reconcile",), ("--reconcile", "--grace", "0")):
        r = recover(queue, *args)
        assert r.rc == 0, r
        assert jobs_in(r.json(), "untouched") == [job], r
        assert r.json()["requeued"] == [], r
    assert snapshot(queue.dir) == before
    original = (queue.dir / "claimed" / job / job).read_bytes()
    edit_lease(queue, job, create_time=1000.0)
    assert queue.run("show", job, "--json").json()["holder"]["state"] == "gone"
    r = recover(queue)
    assert r.rc == 0 and jobs_in(r.json(), "requeued") == [job], r
    requeued_once(queue, job, original)


@pytest.mark.parametrize("expires_at", [0, -1, "1970-01-01T00:00:00Z", 1e-320])
@pytest.mark.parametrize("where", ["this host", "another host"])
def test_a_lease_that_expired_at_the_epoch_or_before_is_proof_even_for_a_live_pid(
    queue, live, expires_at, where
):
    """Q-5 (docs/queue.md: an expired lease is proof "wherever the holder runs, even if its
    pid is still alive on this host"): ``expires_at`` at or before the epoch, as a number or
    RFC 3339, on a lease naming a live process: the holder is judged gone and J requeued."""
    job = claimed_for(queue, live.pid)
    changes: dict = {"expires_at": expires_at}
    if where == "another host":
        changes.update(host="elsewhere.example", boot_id=str(uuid.uuid4()), machine_id="0" * 32)
    edit_lease(queue, job, **changes)
    original = (queue.dir / "claimed" / job / job).read_bytes()
    shown = queue.run("show", job, "--json")
    assert shown.rc == 0 and shown.json()["holder"]["state"] == "gone", shown
    r = recover(queue)
    assert r.rc == 0 and jobs_in(r.json(), "requeued") == [job], r
    requeued_once(queue, job, original)


def test_a_lease_valid_until_2100_on_another_host_is_kept_and_on_this_host_judged_by_pid(queue):
    """Q-5, N-1: a lease valid for seventy years more, of a host we cannot see, keeps J
    (``unknown``, untouched, exit 0, every recover); the same lease on this host, whose pid
    is dead, is proof the holder is gone."""
    far = 4102444800.5  # 2100-01-01T00:00:00.5Z
    job = claimed_for(queue, DEAD_PID)
    ours = queue.lease(job)
    edit_lease(queue, job, expires_at=far, host="elsewhere.example", boot_id=str(uuid.uuid4()))
    before = snapshot(queue.dir)
    assert queue.run("show", job, "--json").json()["holder"]["state"] == "unknown"
    for args in (("--dry-run",), (), ("--reconcile",)):
        r = recover(queue, *args)
        assert r.rc == 0 and jobs_in(r.json(), "untouched") == [job], r
    assert snapshot(queue.dir) == before
    original = (queue.dir / "claimed" / job / job).read_bytes()
    edit_lease(queue, job, host=ours["host"], boot_id=ours["boot_id"])
    assert queue.run("show", job, "--json").json()["holder"]["state"] == "gone"
    r = recover(queue)
    assert r.rc == 0 and jobs_in(r.json(), "requeued") == [job], r
    requeued_once(queue, job, original)


@pytest.mark.parametrize(
    "expires_at, where, verdict",
    [
        ("0001-01-01T00:00:00Z", "this host", "gone"),  # Go's zero time.Time
        ("9999-12-31T23:59:59Z", "another host", "unknown"),  # a "never expires" sentinel
        (253402300799, "another host", "unknown"),  # the same instant in epoch seconds
    ],
)
def test_a_lease_time_at_either_end_of_years_1_to_9999_is_judged(
    queue, live, expires_at, where, verdict
):
    """Q-3, Q-5 (docs/queue.md: ``claimed_at`` and ``expires_at`` "name an instant of the
    years 1 to 9999, else the lease is unreadable"): a lease whose ``expires_at`` is the first
    instant of year 1 (what a Go tool writes for an unset time) has expired, and J goes back
    to pending; one whose ``expires_at`` is the last second of year 9999 is valid, and J is
    kept as a live holder's (exit 0).  Neither is a conflict."""
    job = claimed_for(queue, live.pid)
    changes: dict = {"expires_at": expires_at}
    if where == "another host":
        changes.update(host="elsewhere.example", boot_id=str(uuid.uuid4()))
    edit_lease(queue, job, **changes)
    shown = queue.run("show", job, "--json")
    assert shown.rc == 0 and shown.json()["holder"]["state"] == verdict, shown
    r = recover(queue)
    assert r.rc == 0, r
    key = "requeued" if verdict == "gone" else "untouched"
    assert jobs_in(r.json(), key) == [job], r


# ------------------------------------------------------------------- claims without a lease


@pytest.mark.parametrize("dated", [-50 * YEAR, 30 * YEAR])
def test_a_claim_without_a_lease_dated_decades_back_or_ahead_is_requeued_by_reconcile_only(
    queue, dated
):
    """Q-6 (``claimed/J/J`` without ``lease/J/worker`` -> back to pending), §2.4: whatever the
    mtimes say (fifty years ahead, thirty back), ``status``/``list``/``show`` call J
    incomplete (exit 0), ``--dry-run`` and plain recover report it and exit 1 changing
    nothing, ``--reconcile`` puts the request back in pending byte for byte (exit 0), and a
    second run changes nothing."""
    job = "j.req.json"
    (queue.dir / "claimed" / job).mkdir()
    original = json.dumps(request(tag="by-hand")).encode()
    (queue.dir / "claimed" / job / job).write_bytes(original)
    age(queue.dir / "claimed" / job / job, dated)
    age(queue.dir / "claimed" / job, dated)
    before = snapshot(queue.dir)
    runs = read_all(queue, job)
    assert [runs[name].rc for name in READERS] == [0, 0, 0], runs
    assert [i["job"] for i in runs["status"].json()["incomplete"]] == [job]
    assert runs["list"].json() == [{"name": job, "state": "incomplete"}]
    assert runs["show"].json()["repair"] == "requeue-unleased", runs["show"]
    for args in (("--dry-run",), ()):
        r = recover(queue, *args)
        assert r.rc == 1 and jobs_in(r.json(), "incomplete") == [job], r
        assert snapshot(queue.dir) == before
    r = recover(queue, "--reconcile")
    assert r.rc == 0 and jobs_in(r.json(), "repaired") == [job], r
    requeued_once(queue, job, original)


def test_a_claim_without_a_lease_whose_directory_is_locked_is_left_to_its_claimer(queue):
    """docs/queue.md (a claim in progress holds ``claimed/J`` locked until its lease exists,
    and recover leaves such a pair "untouched" without counting it), Q-6, I-4: while this
    process holds the flock, plain and --reconcile recover leave J alone and exit 0, ``show``
    says a transition is moving it; ``--dry-run``, which takes no lock, lists it incomplete
    (exit 1).  Once the lock is let go --reconcile requeues J."""
    job = "j.req.json"
    (queue.dir / "claimed" / job).mkdir()
    original = json.dumps(request(tag="locked")).encode()
    (queue.dir / "claimed" / job / job).write_bytes(original)
    fd = os.open(queue.dir / "claimed" / job, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        before = snapshot(queue.dir)
        shown = queue.run("show", job, "--json")
        assert shown.rc == 0 and shown.json()["state"] == "claimed", shown
        dry = recover(queue, "--dry-run")
        assert dry.rc == 1 and jobs_in(dry.json(), "incomplete") == [job], dry
        for args in ((), ("--reconcile",)):
            r = recover(queue, *args)
            assert r.rc == 0 and jobs_in(r.json(), "untouched") == [job], r
            assert r.json()["repaired"] == [], r
        assert snapshot(queue.dir) == before
    finally:
        os.close(fd)
    r = recover(queue, "--reconcile")
    assert r.rc == 0 and jobs_in(r.json(), "repaired") == [job], r
    requeued_once(queue, job, original)


# -------------------------------------------------------------------------------- inbox/


def test_inbox_files_of_every_kind_and_the_grace_period(queue):
    """Q-6 (stray temp files older than the grace period are removed by --reconcile), §2.4
    (``--grace``; a usage error is exit 2), docs/queue.md (a temp's age runs from its ctime
    when its mtime is later: one dated in the future is young): temp files old, fresh, empty,
    dated a year ahead, of a job that is pending, a lease and a result temp, a file named
    like a job.  Plain recover removes nothing and exits 0 (temps count as neither incomplete
    nor conflict); --reconcile removes only those past the grace; a bad ``--grace`` is refused
    before anything is looked at; ``--grace 0`` removes the rest; the pending job is never
    touched, and no inbox file is ever taken for a job."""
    inbox = queue.dir / "inbox"
    pending = queue.publish(request(), name="k")
    old = {
        "old.req.json.publish.tmp": json.dumps(request()),
        "empty.req.json.publish.tmp": "",
        "k.req.json.publish.tmp": json.dumps(request()),
        "k.req.json.lease.abcd.tmp": "{}",
        "k.req.json.result.x.tmp": "{}",
        "j.req.json": json.dumps(request()),
    }
    young = {"fresh.req.json.publish.tmp": "{}", "future.req.json.publish.tmp": "{}"}
    for name, text in {**old, **young}.items():
        (inbox / name).write_text(text)
    for name in old:
        age(inbox / name, 3600)
    age(inbox / "future.req.json.publish.tmp", -YEAR)
    pending_bytes = (queue.dir / "pending" / pending).read_bytes()

    status = queue.run("status", "--json")
    assert status.rc == 0, status
    assert {t["path"] for t in status.json()["temps"]} == {f"inbox/{n}" for n in {**old, **young}}
    listed = queue.run("list", "--json")
    assert listed.json() == [{"name": pending, "state": "pending"}], listed
    shown = queue.run("show", "j.req.json", "--json")
    assert shown.rc == 1 and "ENOENT" in shown.err, shown

    before = snapshot(queue.dir)
    for args in (("--dry-run",), ()):
        r = recover(queue, *args)
        assert r.rc == 0 and r.json()["consistent"] is True, r
        assert sorted(r.json()["stale_temps"]) == sorted(f"inbox/{n}" for n in old), r
    for bad in ("-1", "nan", "inf", "abc", "", "31622401"):
        r = queue.run("recover", "--reconcile", "--grace", bad)
        assert r.rc == 2 and "EINVAL" in r.err, r
        no_traceback(r)
    assert snapshot(queue.dir) == before

    r = recover(queue, "--reconcile")
    assert r.rc == 0, r
    assert sorted(r.json()["removed_temps"]) == sorted(f"inbox/{n}" for n in old), r
    assert set(os.listdir(inbox)) == set(young)
    again = recover(queue, "--reconcile")
    assert again.rc == 0 and again.json()["removed_temps"] == [], again

    r = recover(queue, "--reconcile", "--grace", "0")
    assert r.rc == 0, r
    assert sorted(r.json()["removed_temps"]) == sorted(f"inbox/{n}" for n in young), r
    assert os.listdir(inbox) == []
    assert queue.requests() == {pending: ["pending"]}
    assert (queue.dir / "pending" / pending).read_bytes() == pending_bytes


# ------------------------------------------------------------------- thousands of leftovers


def test_two_thousand_incomplete_pairs_of_three_kinds_converge_in_one_reconcile(queue):
    """Q-6, I-1, I-5, §2.4: 700 claims without a lease, 700 pending jobs with an empty
    ``claimed/J`` left beside them, 700 orphan ``lease/J`` holding an empty ``worker`` (a
    restore of a queue taken mid-crash): ``status`` counts 2100 incomplete pairs (exit 0);
    plain recover reports each and changes nothing (exit 1); --reconcile repairs every one
    (exit 0), after which each of the 1400 requests is in pending exactly once, claimed/ and
    lease/ are empty, and a second run changes nothing."""
    n = 700
    body = json.dumps(request()).encode()
    for i in range(n):
        job = f"c{i:04d}.req.json"
        (queue.dir / "claimed" / job).mkdir()
        (queue.dir / "claimed" / job / job).write_bytes(body)
        job = f"p{i:04d}.req.json"
        (queue.dir / "pending" / job).write_bytes(body)
        (queue.dir / "claimed" / job).mkdir()
        job = f"l{i:04d}.req.json"
        (queue.dir / "lease" / job).mkdir()
        (queue.dir / "lease" / job / "worker").write_bytes(b"")
    status = queue.run("status", "--json")
    assert status.rc == 0, status
    counts = status.json()["counts"]
    assert counts["incomplete"] == 3 * n and counts["conflict"] == 0, counts
    before = snapshot(queue.dir)
    plain = recover(queue)
    assert plain.rc == 1 and len(plain.json()["incomplete"]) == 3 * n, plain.err
    assert snapshot(queue.dir) == before
    fixed = recover(queue, "--reconcile")
    assert fixed.rc == 0 and len(fixed.json()["repaired"]) == 3 * n, fixed.err
    assert fixed.json()["consistent"] is True
    seen = queue.requests()
    assert len(seen) == 2 * n and all(states == ["pending"] for states in seen.values())
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()
    after = snapshot(queue.dir)
    again = recover(queue, "--reconcile")
    assert again.rc == 0 and again.json()["repaired"] == [], again.err
    assert snapshot(queue.dir) == after


# --------------------------------------------------------------------------------- names


def test_names_at_the_r3_length_limit_and_names_differing_only_in_case(queue):
    """R-3, Q-8, §2.1: a 64-byte job name claimed without a lease is a job (reconcile
    requeues it); a 65-byte one in ``claimed/`` with a lease is no job: ignored, never moved
    or removed.  ``Job.req.json`` (claimed, holder dead) and ``job.req.json`` (done) are two
    jobs: recover requeues the first and leaves the second's pair; ``show`` of each gives its
    own state; publishing ``JOB`` is allowed and ``job`` refused."""
    longest = "a" * (64 - len(".req.json")) + ".req.json"
    too_long = "b" * (65 - len(".req.json")) + ".req.json"
    (queue.dir / "claimed" / longest).mkdir()
    longest_bytes = json.dumps(request(tag="longest")).encode()
    (queue.dir / "claimed" / longest / longest).write_bytes(longest_bytes)
    (queue.dir / "claimed" / too_long).mkdir()
    (queue.dir / "claimed" / too_long / too_long).write_text(json.dumps(request()))
    (queue.dir / "lease" / too_long).mkdir()
    (queue.dir / "lease" / too_long / "worker").write_text("{}")
    upper = claimed_for(queue, DEAD_PID, name="Job")
    upper_bytes = (queue.dir / "claimed" / upper / upper).read_bytes()
    lower = queue.terminal("job", "done")

    status = queue.run("status", "--json")
    assert status.rc == 0, status
    ignored = {entry["path"] for entry in status.json()["ignored"]}
    assert f"claimed/{too_long}" in ignored and f"lease/{too_long}" in ignored, ignored
    listed = {e["name"]: e["state"] for e in queue.run("list", "--json").json()}
    assert listed == {longest: "incomplete", upper: "claimed", lower: "done"}, listed
    assert queue.run("show", upper, "--json").json()["state"] == "claimed"
    assert queue.run("show", lower, "--json").json()["state"] == "done"
    refused = queue.run("show", too_long, "--json")
    assert refused.rc == 2 and "EINVAL" in refused.err, refused

    r = recover(queue, "--reconcile")
    assert r.rc == 0, r
    assert jobs_in(r.json(), "requeued") == [upper], r
    assert jobs_in(r.json(), "repaired") == [longest], r
    assert (queue.dir / "pending" / upper).read_bytes() == upper_bytes
    assert (queue.dir / "pending" / longest).read_bytes() == longest_bytes
    assert queue.state(lower) == "done"
    assert (queue.dir / "claimed" / too_long / too_long).is_file()
    assert (queue.dir / "lease" / too_long / "worker").read_text() == "{}"
    after = snapshot(queue.dir)
    assert recover(queue, "--reconcile").rc == 0
    assert snapshot(queue.dir) == after
    made = queue.run("publish", "--name", "JOB", "-", input=json.dumps(request()))
    assert (made.rc, made.out) == (0, "JOB.req.json\n"), made
    clash = queue.run("publish", "--name", "job", "-", input=json.dumps(request()))
    assert clash.rc == 1 and "EEXIST" in clash.err, clash


# ---------------------------------------------------------------------- modes and owners


@contextlib.contextmanager
def members_queue(user) -> Iterator[tuple[Path, callable]]:
    """A queue in a directory of ``user``'s (``--queue``), and a ``ctx queue`` runner as
    that user; removed at the end."""
    home = new_scratch_dir(SCRATCH, "member")
    os.chown(home, user.uid, user.gid)
    qdir = home / "q"
    env = clean_env(HOME=str(home), XDG_CACHE_HOME=str(home / "cache"))

    def as_user(*args: str, stdin: str | None = None):
        done = run_as(user, [*CTX_ARGV, "queue", *args, "--queue", str(qdir)], env=env, stdin=stdin)
        assert "Traceback" not in done.stdout + done.stderr, done
        return done

    try:
        yield qdir, as_user
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_root_owned_mode_000_evidence_in_a_members_queue(unprivileged_user):
    """Q-5, Q-6, Q-8, docs/queue.md (a lease a member may not read proves nothing; a request
        the claimer may not read stays pending; recover checks it may write what it changes and
        says ``EACCES`` naming the directory, job left as it is): root has left, in a queue a
        non-root user works, a mode-000 lease of a dead holder (A), a mode-000 pending request
        (B), a claim without a lease in a root-owned ``claimed/C`` (C) and a mode-000 result (D).
        The user's readers and recovers agree: A a conflict never requeued, B pending and not
        claimable by them (exit 3), C incomplete and not repairable by them (an ``EACCES`` error,
        exit 1), D done; nothing is lost.  Root, who may read and write all of it, then requeues A
    (its holder is dead) and C with one ``--reconcile`` (exit 0)."""
    with members_queue(unprivileged_user) as (qdir, as_user):
        assert as_user("init").returncode == 0
        for name in "abcd":
            made = as_user("publish", "--name", name, "-", stdin=json.dumps(request(tag=name)))
            assert made.returncode == 0, made.stderr
        took = as_user("claim", "--pid", str(DEAD_PID))
        assert took.stdout.strip() == "a.req.json", took
        lease = qdir / "lease" / "a.req.json" / "worker"
        os.chown(lease, 0, 0)
        lease.chmod(0)
        os.chown(qdir / "pending" / "b.req.json", 0, 0)
        (qdir / "pending" / "b.req.json").chmod(0)
        (qdir / "claimed" / "c.req.json").mkdir(mode=0o755)
        os.rename(qdir / "pending" / "c.req.json", qdir / "claimed" / "c.req.json" / "c.req.json")
        (qdir / "claimed" / "c.req.json").chmod(0o755)
        os.rename(qdir / "pending" / "d.req.json", qdir / "done" / "d.req.json")
        (qdir / "done" / "d.req.json.result").write_text(json.dumps(result("done")))
        (qdir / "done" / "d.req.json.result").chmod(0)
        before = snapshot(qdir)

        status = as_user("status", "--json")
        assert status.returncode == 1, status.stderr
        report = json.loads(status.stdout)
        assert [c["job"] for c in report["conflicts"]] == ["a.req.json"]
        assert [i["job"] for i in report["incomplete"]] == ["c.req.json"]
        assert (report["pending"], report["done"]) == (1, 1), report
        states = {e["name"]: e["state"] for e in json.loads(as_user("list", "--json").stdout)}
        assert states == {
            "a.req.json": "conflict",
            "b.req.json": "pending",
            "c.req.json": "incomplete",
            "d.req.json": "done",
        }
        shown = json.loads(as_user("show", "a.req.json", "--json").stdout)
        assert shown["holder"]["state"] == "unreadable", shown
        for args in (("--dry-run",), (), ("--reconcile",), ("--reconcile",)):
            done = as_user("recover", "--json", *args)
            assert done.returncode == 1, done.stderr
            got = json.loads(done.stdout)
            assert jobs_in(got, "conflicts") == ["a.req.json"], got
            assert got["requeued"] == [] and got["repaired"] == [], got
            if "--reconcile" in args and "--dry-run" not in args:
                assert [(e["job"], e["error"]) for e in got["errors"]] == [("c.req.json", "EACCES")]
                assert "claimed/c.req.json" in got["errors"][0]["detail"], got
        claim = as_user("claim")
        assert claim.returncode == 3 and "b.req.json" in claim.stderr, claim
        assert snapshot(qdir) == before

        root = subprocess.run(
            [*CTX_ARGV, "queue", "recover", "--reconcile", "--json", "--queue", str(qdir)],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=60,
        )
        assert root.returncode == 0, root.stderr
        repaired = json.loads(root.stdout)
        assert jobs_in(repaired, "requeued") == ["a.req.json"], repaired
        assert jobs_in(repaired, "repaired") == ["c.req.json"], repaired
        assert sorted(os.listdir(qdir / "pending")) == ["a.req.json", "b.req.json", "c.req.json"]
        assert sorted(os.listdir(qdir / "done")) == ["d.req.json", "d.req.json.result"]
        assert os.listdir(qdir / "claimed") == [] and os.listdir(qdir / "lease") == []


# ------------------------------------------------------------- a state directory replaced


@pytest.mark.parametrize("replacement", ["file", "symlink"])
@pytest.mark.parametrize("state", ["pending", "lease", "done"])
def test_a_state_directory_replaced_by_a_file_or_a_symlink_is_refused_by_every_command(
    queue, live, tmp_path, replacement, state
):
    """§2 ("exactly these subdirectories"), Q-8 (never followed): with ``pending/``,
    ``lease/`` or ``done/`` replaced by a regular file or by a symbolic link to a directory
    holding a request, every reader, every recover and ``init`` exit 1 naming the directory,
    with ``--json`` an error object; nothing is written through the link, and the live
    holder's claim stays as it was."""
    job = claimed_for(queue, live.pid)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.req.json").write_text(json.dumps(request()))
    aside = tmp_path / "aside"
    os.rename(queue.dir / state, aside)
    if replacement == "file":
        (queue.dir / state).write_text("not a directory")
    else:
        (queue.dir / state).symlink_to(elsewhere)
    before = snapshot(queue.storage)
    outside = snapshot(elsewhere)
    for args in (
        ("status", "--json"),
        ("list", "--json"),
        ("show", job, "--json"),
        ("recover", "--dry-run", "--json"),
        ("recover", "--json"),
        ("recover", "--reconcile", "--json"),
        ("recover", "--reconcile", "--grace", "0", "--json"),
        ("init",),
    ):
        r = queue.run(*args)
        no_traceback(r)
        assert r.rc == 1, r
        assert f"queue/{state}" in r.err, r
        if "--json" in args:  # a link ELOOP, as anywhere on a queue's path
            assert r.json()["error"] == ("ENOTDIR" if replacement == "file" else "ELOOP"), r
    assert snapshot(queue.storage) == before
    assert snapshot(elsewhere) == outside
