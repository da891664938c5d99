"""SPEC §1 and §2 sentence by sentence: the storage root and names (R-1, R-3), the evidence
table of §2.1, the steps of publish / claim / lease / finish / recover (Q-1..Q-8), the
invariants I-3 and I-5 and the queue command line of §2.4, each read as literally as a reader
holding only SPEC.md would read it.

Each test drives the installed ``ctx`` in real processes on its own copy of a storage root
made by ``ctx bootstrap`` and ``ctx queue init --project proj`` (the ``queue`` fixture); lease
holders are real processes, killed where a test needs a holder that is gone.  One test runs
as the unprivileged test user to check the default root and the lease holder of a non-root
shell.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psutil
import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    SUFFIX,
    QueueCLI,
    age,
    clean_env,
    ctx_run,
    new_scratch_dir,
    request,
    result,
    rfc3339,
    scratch_top,
    snapshot,
)
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

TOP = scratch_top(__file__)
DAY = 86400
MIB = 1024 * 1024
BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
PID_NS = os.stat("/proc/self/ns/pid").st_ino


# --- helpers ------------------------------------------------------------------------------------


def files_of(queue: QueueCLI) -> set[str]:
    """Every path below the queue directory, relative to it, directories ending in ``/``
    (``config``, the queue's data file, left out)."""
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(queue.dir):
        rel = Path(dirpath).relative_to(queue.dir)
        for name in dirnames:
            found.add(f"{rel / name}/")
        for name in filenames:
            found.add(str(rel / name))
    found -= {f"{sub}/" for sub in QUEUE_SUBDIRS}
    found.discard("config")
    return found


def holder() -> subprocess.Popen:
    """A live process to stand in as a lease holder."""
    return subprocess.Popen(["sleep", "600"])


def gone(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


@pytest.fixture
def live() -> Iterator[subprocess.Popen]:
    proc = holder()
    yield proc
    gone(proc)


def claimed_by_gone_holder(queue: QueueCLI, name: str) -> str:
    """Publish ``name``, claim it for a process that then dies (a real lease, an unexpired
    one, naming a dead pid of this boot and pid namespace); returns J."""
    job = queue.publish(request(tag=name), name=name)
    proc = holder()
    try:
        assert queue.claim("--pid", str(proc.pid)) == job
    finally:
        gone(proc)
    return job


def recover(queue: QueueCLI, *args: str):
    return queue.run("recover", "--json", *args)


# --- §2.1: durable states and their evidence ----------------------------------------------------


@pytest.mark.parametrize(("flag", "terminal"), [("--ok", "done"), ("--error", "failed")])
def test_s21_each_state_is_exactly_the_evidence_the_table_names(queue, flag, terminal):
    """§2.1: pending is ``pending/J``; claimed is ``claimed/J/J`` and ``lease/J/worker``;
    done (failed) is ``done/J`` and ``done/J.result`` (``failed/...``) — and after each step of
    the command line nothing else names J anywhere in the queue (Q-4 removes lease/J and
    claimed/J; the staging directory is left empty)."""
    job = queue.publish(request(), name="table")
    assert job == "table" + SUFFIX
    assert files_of(queue) == {f"pending/{job}"}

    assert queue.claim() == job
    assert files_of(queue) == {
        f"claimed/{job}/",
        f"claimed/{job}/{job}",
        f"lease/{job}/",
        f"lease/{job}/worker",
    }

    finished = queue.run("finish", job, flag, "-", input=json.dumps({"n": 1}))
    assert finished.rc == 0, finished
    assert files_of(queue) == {f"{terminal}/{job}", f"{terminal}/{job}.result"}


@pytest.mark.parametrize(("flag", "status"), [("--ok", "ok"), ("--error", "error")])
def test_s21_a_result_file_is_one_object_with_the_five_named_fields(queue, flag, status):
    """§2.1: "A result file is one JSON object: {"status": "ok"|"error", "output": ...,
    "worker": {...}, "started": ..., "finished": ...}" — ``output`` is what finish was given,
    ``worker`` an object, ``started`` and ``finished`` times with started not after
    finished."""
    job = queue.publish()
    queue.claim()
    output = {"answer": [1, "two", None], "ünïcode": "✓"}
    r = queue.run("finish", job, flag, "-", input=json.dumps(output))
    assert r.rc == 0, r
    state = "done" if flag == "--ok" else "failed"
    document = json.loads((queue.dir / state / f"{job}.result").read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    assert {"status", "output", "worker", "started", "finished"} <= set(document)
    assert document["status"] == status
    assert document["output"] == output
    assert isinstance(document["worker"], dict)
    assert rfc3339(document["started"]) <= rfc3339(document["finished"])


BAD_BODIES = {
    "array": b"[1, 2]",
    "string": b'"a string"',
    "number": b"42",
    "null": b"null",
    "empty": b"",
    "truncated": b'{"tool": "fs.read", "input": {}',
    "two-objects": b'{"tool": "fs.read", "input": {}} {"tool": "fs.read", "input": {}}',
    "not-utf8": b'{"tool": "fs.read", "input": {"x": "\xff\xfe"}}',
}


def test_s21_a_request_that_is_not_one_utf8_json_object_is_refused_leaving_no_file(queue):
    """§2.1: "A request file is a regular file holding one JSON object (UTF-8)": anything
    else is refused (exit 1, §2.4) and neither a pending job nor a staging temp remains
    (I-2: nothing partial under a final name)."""
    for kind, body in BAD_BODIES.items():
        r = queue.run("publish", "--name", kind, "-", input=body)
        assert r.rc == 1, (kind, r)
        assert r.out == "", (kind, r)
        assert r.err.strip(), (kind, r)
    assert files_of(queue) == set()


def test_s21_the_default_size_limit_is_exactly_one_mebibyte(queue, tmp_path):
    """§2.1: "size limit 1 MiB ... larger requests are refused with a clear error": a request
    of exactly 1 048 576 bytes is published, one of 1 048 577 is refused (exit 1, a message
    naming the limit) and leaves nothing in pending/ or inbox/."""
    base = json.dumps(request(input={"pad": ""}))
    for size, name in ((MIB, "exact"), (MIB + 1, "over")):
        body = json.dumps(request(input={"pad": "x" * (size - len(base))}))
        assert len(body.encode()) == size
        (tmp_path / f"{name}.json").write_text(body)

    fits = queue.run("publish", "--name", "exact", tmp_path / "exact.json")
    assert fits.rc == 0, fits
    assert fits.out == "exact" + SUFFIX + "\n"

    over = queue.run("publish", "--name", "over", tmp_path / "over.json")
    assert over.rc == 1, over
    assert over.out == ""
    assert "1048576" in over.err or "1 MiB" in over.err, over
    assert files_of(queue) == {"pending/exact" + SUFFIX}


# --- publish never replaces any evidence ---------------------------------------------------


def _evidence(queue: QueueCLI, kind: str, job: str) -> None:
    d = queue.dir
    body = json.dumps(request(tag="evidence"))
    if kind == "done-result-only":
        (d / "done" / f"{job}.result").write_text(json.dumps(result("done")))
    elif kind == "failed-result-only":
        (d / "failed" / f"{job}.result").write_text(json.dumps(result("failed")))
    elif kind == "failed-request-only":
        (d / "failed" / job).write_text(body)
    elif kind == "empty-claim-dir":
        (d / "claimed" / job).mkdir()
    elif kind == "lease-dir-only":
        (d / "lease" / job).mkdir()
    elif kind == "claimed-request-only":
        (d / "claimed" / job).mkdir()
        (d / "claimed" / job / job).write_text(body)
    else:
        raise AssertionError(kind)


EVIDENCE_KINDS = (
    "done-result-only",
    "failed-result-only",
    "failed-request-only",
    "empty-claim-dir",
    "lease-dir-only",
    "claimed-request-only",
)


def test_q1_half_of_any_evidence_makes_publish_eexist_and_changes_nothing(queue):
    """Q-1: "Publishing a name that already has evidence anywhere (pending, claimed, lease,
    done, failed) is refused (EEXIST), never overwritten" — one half of a pair is evidence
    too. Exit 1 (§2.4: operation refused), nothing printed on stdout, the queue as it was."""
    for kind in EVIDENCE_KINDS:
        _evidence(queue, kind, kind + SUFFIX)
    before = snapshot(queue.dir)
    for kind in EVIDENCE_KINDS:
        r = queue.run("publish", "--name", kind, "-", input=json.dumps(request(tag="new")))
        assert r.rc == 1, (kind, r)
        assert r.out == "", (kind, r)
        assert "EEXIST" in r.err, (kind, r)
    assert snapshot(queue.dir) == before


# --- claim ---------------------------------------------------------------------------------


def test_q2_an_existing_claim_directory_loses_the_claim_without_an_error(queue):
    """Q-2: "mkdir claimed/J is the single exclusive arbitration point (EEXIST = lost)";
    "Losing is not an error": with ``claimed/J`` already there, claim does not take J — exit
    3 when nothing else is pending (§2.4), not 1 — and leaves pending/J where it is; another
    pending job is claimed instead."""
    job = queue.publish(name="contested")
    (queue.dir / "claimed" / job).mkdir()
    before = snapshot(queue.dir)
    r = queue.run("claim")
    assert r.rc == 3, r
    assert r.out == ""
    assert snapshot(queue.dir) == before

    other = queue.publish(name="free")
    assert queue.claim() == other
    assert (queue.dir / "pending" / job).is_file()
    assert os.listdir(queue.dir / "claimed" / job) == []


def test_q2_i3_a_pending_copy_of_a_finished_job_is_never_claimed(queue):
    """I-3: "After finish returned success, J is never executed again": a request copied back
    into pending/ beside J's terminal pair (a conflict, Q-6) is not handed out by claim; the
    pair and the copy stay as they were."""
    job = queue.publish(name="finished")
    queue.claim()
    queue.finish(job)
    (queue.dir / "pending" / job).write_text((queue.dir / "done" / job).read_text())
    before = snapshot(queue.dir)
    r = queue.run("claim")
    assert r.rc == 3, r
    assert r.out == ""
    assert snapshot(queue.dir) == before


# --- the lease -----------------------------------------------------------------------------


def test_q3_the_lease_identifies_the_holder_and_ttl_sets_expires_at(queue, live):
    """Q-3 [decision]: ``lease/J/worker`` is one JSON object with the ``worker`` id, the
    ``host`` name, ``boot_id`` (this boot), ``pid_ns`` (the inode of /proc/self/ns/pid),
    ``pid``, the process start time (psutil create_time), ``claimed_at`` and ``expires_at``;
    §2.4: ``--ttl SECONDS`` sets ``expires_at`` (that long after the claim) and ``--worker``
    names the worker."""
    job = queue.publish()
    assert queue.claim("--worker", "w-7", "--pid", str(live.pid), "--ttl", "123") == job
    lease = queue.lease(job)
    assert lease["worker"] == "w-7"
    assert lease["host"] == socket.gethostname()
    assert lease["boot_id"] == BOOT_ID
    assert lease["pid_ns"] == PID_NS
    assert lease["pid"] == live.pid
    started = psutil.Process(live.pid).create_time()
    assert any(
        isinstance(v, int | float) and not isinstance(v, bool) and abs(v - started) < 0.05
        for k, v in lease.items()
        if k not in ("pid", "pid_ns")
    ), lease
    spent = rfc3339(lease["expires_at"]) - rfc3339(lease["claimed_at"])
    assert abs(spent - timedelta(seconds=123)) < timedelta(seconds=1), lease


def test_q3_no_other_process_renews_or_rewrites_a_lease(queue, live):
    """Q-3: "A worker MAY renew its own lease ...; no other process renews leases": status,
    list, show, plain recover and ``recover --reconcile`` leave ``lease/J/worker`` byte for
    byte and inode for inode as claim wrote it, and ``renew`` from a process that is not the
    holder is refused (exit 1) without touching it."""
    job = queue.publish()
    queue.claim("--pid", str(live.pid), "--ttl", "600")
    path = queue.dir / "lease" / job / "worker"
    before = (path.read_bytes(), path.stat().st_ino, path.stat().st_mtime_ns)
    for command, *args in (
        ("status",),
        ("status", "--json"),
        ("list",),
        ("show", job),
        ("recover",),
        ("recover", "--reconcile"),
    ):
        r = queue.run(command, *args)
        assert r.rc == 0, r
    r = queue.run("renew", job, "--ttl", "900")
    assert r.rc == 1, r
    assert (path.read_bytes(), path.stat().st_ino, path.stat().st_mtime_ns) == before


def test_s24_renew_ttl_extends_the_callers_own_lease(queue):
    """§2.4: "ctx queue renew --project P J extends the caller's own lease": claimed from this
    process (the parent of both commands), ``renew --ttl S`` moves ``expires_at`` to about S
    seconds from now, keeps the holder's fields, and the job stays claimed."""
    job = queue.publish()
    queue.claim("--ttl", "5")
    first = queue.lease(job)
    r = queue.run("renew", job, "--ttl", "3600")
    assert r.rc == 0, r
    renewed = queue.lease(job)
    for key in ("worker", "host", "boot_id", "pid_ns", "pid", "claimed_at"):
        assert renewed[key] == first[key], key
    assert rfc3339(renewed["expires_at"]) - rfc3339(first["expires_at"]) > timedelta(seconds=3000)
    assert queue.state(job) == "claimed"


# --- finish --------------------------------------------------------------------------------


def test_q4_i3_finish_of_a_job_not_claimed_and_a_second_finish_are_refused(queue):
    """Q-4, I-3: finish of a pending job is refused (exit 1) and leaves it pending with no
    result anywhere; after a successful finish a second finish (either way) is refused and
    changes nothing: J never returns to pending and its result is never replaced."""
    waiting = queue.publish(name="waiting")
    before = snapshot(queue.dir)
    r = queue.run("finish", waiting, "--ok", "-", input="{}")
    assert r.rc == 1, r
    assert snapshot(queue.dir) == before

    job = queue.publish(name="once")
    assert queue.claim() in (job, waiting)
    claimed = job if queue.state(job) == "claimed" else waiting
    queue.finish(claimed, output={"first": True})
    after = snapshot(queue.dir)
    for flag in ("--ok", "--error"):
        again = queue.run("finish", claimed, flag, "-", input=json.dumps({"second": True}))
        assert again.rc == 1, again
    assert snapshot(queue.dir) == after
    assert not (queue.dir / "pending" / claimed).exists()


@pytest.mark.parametrize(("flag", "terminal"), [("--ok", "done"), ("--error", "failed")])
def test_q4_finish_moves_its_result_without_replacing_one_already_there(queue, flag, terminal):
    """Q-4, Q-6: the result is moved "without replacing" to ``done/J.result`` (or
    ``failed/J.result``): when a file already holds that name, finish is refused (exit 1),
    that file keeps its bytes, and J stays claimed with its lease."""
    job = queue.publish()
    queue.claim()
    stray = queue.dir / terminal / f"{job}.result"
    stray.write_text('{"status": "ok", "output": "somebody else"}')
    r = queue.run("finish", job, flag, "-", input=json.dumps({"mine": 1}))
    assert r.rc == 1, r
    assert stray.read_text() == '{"status": "ok", "output": "somebody else"}'
    assert queue.state(job) == "claimed"
    assert not (queue.dir / terminal / job).exists()


# --- recover --------------------------------------------------------------------------


def test_q5_a_gone_holders_claim_beside_a_pending_copy_is_not_requeued(queue):
    """Q-5: requeue "only when ... there is no pending or terminal evidence for J": a dead
    holder's claim with a copy of J in pending/ is a conflict — neither recover nor
    ``--reconcile`` moves anything, both exit 1."""
    job = claimed_by_gone_holder(queue, "twice")
    (queue.dir / "pending" / job).write_text(json.dumps(request(tag="copy")))
    before = snapshot(queue.dir)
    for args in ((), ("--reconcile",)):
        r = recover(queue, *args)
        assert r.rc == 1, r
        assert r.json()["requeued"] == [], r
        assert snapshot(queue.dir) == before


def test_q5_a_gone_holders_claim_is_requeued_with_its_request_unchanged(queue):
    """Q-5: a claim whose holder is provably gone (same boot and pid namespace, dead pid) goes
    back to pending/ with the very bytes it was published with; the claim and the lease are
    gone; exit 0; a second run changes nothing (I-5)."""
    job = claimed_by_gone_holder(queue, "orphaned")
    body = (queue.dir / "claimed" / job / job).read_bytes()
    r = recover(queue)
    assert r.rc == 0, r
    assert job in json.dumps(r.json()["requeued"]), r
    assert files_of(queue) == {f"pending/{job}"}
    assert (queue.dir / "pending" / job).read_bytes() == body
    before = snapshot(queue.dir)
    again = recover(queue)
    assert again.rc == 0 and again.json()["requeued"] == [], again
    assert snapshot(queue.dir) == before


def test_q5_the_same_host_after_another_boot_is_proof_even_for_a_live_pid(queue, live):
    """Q-5: "the same host with another boot" proves the holder gone — whatever the pid
    names in this boot (here a live process)."""
    job = queue.publish(name="reboot")
    queue.claim("--pid", str(live.pid), "--ttl", "3600")
    lease = queue.lease(job)
    lease["boot_id"] = str(uuid.uuid4())
    queue.write_lease(job, lease)
    r = recover(queue)
    assert r.rc == 0, r
    assert queue.state(job) == "pending"


def test_q6_a_live_holders_job_is_never_touched_even_beside_its_result(queue, live):
    """Q-6: "Neither recover nor recover --reconcile ever touches a job whose lease holder is
    alive": a live holder's claim beside ``done/J.result`` (finish cut between its steps) and
    a live holder's leftover claim and lease beside J's terminal pair both stay as they are;
    the runs exit 1 (an incomplete pair remains)."""
    mid = queue.publish(name="mid-finish")
    queue.claim("--pid", str(live.pid), "--ttl", "3600")
    (queue.dir / "done" / f"{mid}.result").write_text(json.dumps(result("done")))

    late = queue.publish(name="late-cleanup")
    queue.claim("--pid", str(live.pid), "--ttl", "3600")
    os.rename(queue.dir / "claimed" / late / late, queue.dir / "done" / late)
    (queue.dir / "done" / f"{late}.result").write_text(json.dumps(result("done")))

    before = snapshot(queue.dir)
    for args in ((), ("--reconcile",)):
        r = recover(queue, *args)
        assert r.rc == 1, r
        assert r.json()["requeued"] == [] and r.json()["repaired"] == [], r
        assert snapshot(queue.dir) == before


def test_q6_two_results_are_a_conflict_shown_with_every_piece_of_evidence(queue):
    """Q-6: "Anything else (e.g. ... two results) is a conflict: reported with every piece of
    evidence, never resolved automatically": a gone holder's claim with both ``done/J.result``
    and ``failed/J.result`` — reconcile exits 1 and changes nothing; ``show`` names the
    claim, the lease and both results."""
    job = claimed_by_gone_holder(queue, "split")
    (queue.dir / "done" / f"{job}.result").write_text(json.dumps(result("done")))
    (queue.dir / "failed" / f"{job}.result").write_text(json.dumps(result("failed")))
    before = snapshot(queue.dir)
    r = recover(queue, "--reconcile")
    assert r.rc == 1, r
    assert job in json.dumps(r.json()["conflicts"]), r
    assert snapshot(queue.dir) == before
    shown = queue.run("show", job)
    for piece in (f"claimed/{job}/{job}", f"lease/{job}/worker", f"done/{job}.result"):
        assert piece in shown.out, shown
    assert f"failed/{job}.result" in shown.out, shown


def test_q6_exit_status_follows_the_queue_after_the_run(queue):
    """Q-6: "Exit status: 0 when the queue is consistent after the run; 1 when incomplete
    pairs (plain recover) or conflicts remain": a claim without a lease — plain recover exits
    1 and changes nothing; ``--reconcile`` puts J back in pending/ and exits 0; both then
    exit 0."""
    job = queue.publish(name="no-lease")
    (queue.dir / "claimed" / job).mkdir()
    os.rename(queue.dir / "pending" / job, queue.dir / "claimed" / job / job)
    for path in (queue.dir / "claimed" / job, queue.dir / "claimed" / job / job):
        age(path, DAY)
    before = snapshot(queue.dir)
    plain = recover(queue)
    assert plain.rc == 1, plain
    assert plain.json()["consistent"] is False
    assert snapshot(queue.dir) == before

    fixed = recover(queue, "--reconcile")
    assert fixed.rc == 0, fixed
    assert fixed.json()["consistent"] is True
    assert files_of(queue) == {f"pending/{job}"}
    for args in ((), ("--reconcile",)):
        assert recover(queue, *args).rc == 0


def test_i5_reconcile_of_every_repairable_leftover_converges_in_one_run(queue):
    """Q-6, I-5: the transitions --reconcile may apply — a claim without a lease (back to
    pending), a result beside its claim from a gone holder (rolled forward), an empty claim
    directory and an orphan lease (removed), a stray temp older than the grace (removed) —
    all in one queue: one run leaves it consistent (exit 0), the second run changes nothing
    (exit 0), and no request was lost or duplicated."""
    d = queue.dir
    unleased = queue.publish(name="unleased")
    (d / "claimed" / unleased).mkdir()
    os.rename(d / "pending" / unleased, d / "claimed" / unleased / unleased)

    ran = claimed_by_gone_holder(queue, "ran")
    (d / "done" / f"{ran}.result").write_text(json.dumps(result("done")))

    (d / "claimed" / ("empty" + SUFFIX)).mkdir()
    (d / "lease" / ("orphan" + SUFFIX)).mkdir()
    (d / "lease" / ("orphan" + SUFFIX) / "worker").write_text("{}")
    (d / "inbox" / "stray.tmp").write_text("partial")
    for path in d.rglob("*"):
        age(path, DAY)

    first = recover(queue, "--reconcile")
    assert first.rc == 0, first
    assert files_of(queue) == {f"pending/{unleased}", f"done/{ran}", f"done/{ran}.result"}
    before = snapshot(d)
    second = recover(queue, "--reconcile")
    assert second.rc == 0, second
    assert second.json()["requeued"] == [] and second.json()["repaired"] == [], second
    assert snapshot(d) == before


# --- what is not a job ---------------------------------------------------------------------


def test_q8_what_is_not_a_job_is_never_claimed_and_status_lists_it_ignored(queue, tmp_path):
    """Q-8: illegal names, dot-files, symlinks and non-regular request files in pending/ are
    not jobs: claim finds nothing (exit 3), nothing is moved or followed, and ``status``
    lists each as ``ignored`` with a reason."""
    pending = queue.dir / "pending"
    body = json.dumps(request())
    outside = tmp_path / "outside.json"
    outside.write_text(body)
    odd = {
        ".dot" + SUFFIX: lambda p: p.write_text(body),
        "_under" + SUFFIX: lambda p: p.write_text(body),
        "sp ace" + SUFFIX: lambda p: p.write_text(body),
        "x" * 56 + SUFFIX: lambda p: p.write_text(body),
        "no-suffix.json": lambda p: p.write_text(body),
        "ctl.d": lambda p: p.write_text(body),
        "link" + SUFFIX: lambda p: p.symlink_to(outside),
        "fifo" + SUFFIX: lambda p: os.mkfifo(p),
        "dir" + SUFFIX: lambda p: p.mkdir(),
    }
    for name, make in odd.items():
        make(pending / name)
    before = snapshot(queue.dir)
    claimed = queue.run("claim", timeout=30)
    assert claimed.rc == 3, claimed
    assert claimed.out == ""
    status = queue.run("status", "--json", timeout=30)
    assert status.rc == 0, status
    ignored = status.json()["ignored"]
    for name in odd:
        entries = [e for e in ignored if json.dumps(name)[1:-1] in json.dumps(e)]
        assert len(entries) == 1, (name, ignored)
        # the entry names the path and gives a reason: a second, non-empty text
        texts = [v for v in entries[0].values() if isinstance(v, str) and v.strip()]
        assert len(texts) >= 2, entries
    assert snapshot(queue.dir) == before
    assert outside.read_text() == body


def test_q8_a_lease_that_is_a_symlink_is_never_followed(queue, tmp_path):
    """Q-8: a lease file that is a symlink is not a lease: recover does not read a dead
    holder out of what it points to, so the claim is not requeued; the target is untouched."""
    job = claimed_by_gone_holder(queue, "linked")
    lease_file = queue.dir / "lease" / job / "worker"
    target = tmp_path / "lease-elsewhere.json"
    target.write_bytes(lease_file.read_bytes())
    lease_file.unlink()
    lease_file.symlink_to(target)
    for args in ((), ("--reconcile",)):
        r = recover(queue, *args)
        assert r.rc == 1, r
        assert r.json()["requeued"] == [], r
        assert (queue.dir / "claimed" / job / job).is_file()
        assert lease_file.is_symlink()
    assert not (queue.dir / "pending" / job).exists()
    assert json.loads(target.read_text())["pid"] > 0


# --- §2.4: the command line ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "job"),
    [
        ("plain", "plain" + SUFFIX),
        ("suffixed" + SUFFIX, "suffixed" + SUFFIX),
        ("x.d", "x.d" + SUFFIX),
    ],
)
def test_s24_publish_and_claim_print_j_alone_on_its_own_line(queue, given, job):
    """§2.4: "In text mode publish and claim print the job name J alone on its own line (and
    nothing else on stdout)"; "--name J may be given without the .req.json suffix, which is
    then added" (and not added twice when given)."""
    pub = queue.run("publish", "--name", given, "-", input=json.dumps(request()))
    assert pub.rc == 0, pub
    assert pub.out == job + "\n"
    claim = queue.run("claim")
    assert claim.rc == 0, claim
    assert claim.out == job + "\n"


def test_s24_batch_prints_each_j_on_its_own_line_in_order(queue):
    """§2.4: ``publish --batch (JSONL_FILE | -)``: "one request per line ... prints each J" —
    one line per request, each a pending job holding that line's request."""
    lines = [request(tag=f"n{i}") for i in range(5)]
    r = queue.run("publish", "--batch", "-", input="".join(json.dumps(x) + "\n" for x in lines))
    assert r.rc == 0, r
    names = r.out.splitlines()
    assert len(names) == 5 and len(set(names)) == 5, r
    assert r.out == "".join(n + "\n" for n in names)
    for name, req in zip(names, lines, strict=True):
        stored = json.loads((queue.dir / "pending" / name).read_text())
        assert stored["tag"] == req["tag"]


def test_s24_claim_json_is_one_object_with_name_and_the_published_request(queue):
    """§2.4: "with --json, claim prints one object with at least name and request": stdout is
    exactly one JSON object, ``name`` is J and ``request`` the request as published."""
    sent = request(tag="json-claim", extra={"nested": [1, 2]})
    job = queue.publish(sent, name="by-json")
    r = queue.run("claim", "--json")
    assert r.rc == 0, r
    document = json.loads(r.out)
    assert isinstance(document, dict)
    assert document["name"] == job
    stored = json.loads((queue.dir / "claimed" / job / job).read_text())
    assert document["request"] == stored
    for key, value in sent.items():
        assert document["request"][key] == value


USAGE_ERRORS = (
    ("claim", "--ttl", "soon"),
    ("claim", "--pid", "me"),
    ("claim", "--bogus"),
    ("finish", "J"),
    ("finish", "J", "--ok", "--error"),
    ("renew",),
    ("show",),
    ("list", "--state", "everything"),
    ("recover", "--grace", "a-while"),
    ("publish",),
    ("work", "--max-jobs", "many"),
)


def test_s24_usage_errors_exit_2_and_touch_nothing(queue, live):
    """§2.4: "Exit status ... 2 usage error": each malformed command line exits 2, prints
    nothing on stdout and leaves a queue holding a pending and a claimed job as it was."""
    queue.publish(name="one")
    queue.publish(name="two")
    queue.claim("--pid", str(live.pid))
    before = snapshot(queue.dir)
    for args in USAGE_ERRORS:
        r = queue.run(*args)
        assert r.rc == 2, r
        assert r.out == "", r
    assert snapshot(queue.dir) == before


def test_s24_project_and_queue_path_address_the_same_queue(queue):
    """§2.4: "--project NAME (or a queue path)": a job published with ``--project proj`` is
    claimed through the queue's path, absolute or relative to the working directory."""
    job = queue.publish(name="by-path")
    env = clean_env()
    r = ctx_run("queue", "claim", "--project", str(queue.dir), env=env)
    assert r.rc == 0 and r.out == job + "\n", r
    other = queue.publish(name="by-relative")
    rel = ctx_run("queue", "claim", "--project", "./queue", env=env, cwd=queue.dir.parent)
    assert rel.rc == 0 and rel.out == other + "\n", rel


# --- names ---------------------------------------------------------------------------------


SPACE_NAMES = {
    "p" * 64: True,
    "p" * 65: False,
    "9lives": True,
    "a.b_c-d": True,
    "space.d": False,
    "-dash": False,
    ".hidden": False,
    "..": False,
    "é": False,
}


def test_r3_shared_space_names_at_init(storage):
    """R-3: a space name is 1 to 64 bytes of [A-Za-z0-9._-], first byte alphanumeric, not
    ending in ``.d``; anything else "is rejected with EINVAL" and nothing is made under
    ``shared/``."""
    env = clean_env(CTX_STORAGE=str(storage))
    for name, legal in SPACE_NAMES.items():
        before = set(os.listdir(storage / "shared"))
        r = ctx_run("queue", "init", "--project", name, env=env)
        if legal:
            assert r.rc == 0, r
            made = {p.name for p in (storage / "shared" / name / "queue").iterdir()}
            assert made >= QUEUE_SUBDIRS, (name, made)
        else:
            assert r.rc in (1, 2), r
            assert "EINVAL" in r.err, r
            assert set(os.listdir(storage / "shared")) == before, name


# --- R-1 and §2.4 as a non-root user ------------------------------------------------------------


def test_r1_s24_a_non_root_users_default_root_and_the_holder_of_its_shell(
    unprivileged_user: UnprivilegedUser,
):
    """R-1: a non-root user with no configuration and no XDG_DATA_HOME gets
    ``~/.local/share/cortexfs/storage/current``; §2.4: ``ctx queue claim`` run from that
    user's shell leases for the shell (the parent process), under the user's own uid."""
    home = new_scratch_dir(TOP, "home")
    try:
        os.chown(home, unprivileged_user.uid, unprivileged_user.gid)
        env = {
            "HOME": str(home),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
        }
        ctx = " ".join(CTX_ARGV)
        script = (
            f"{ctx} bootstrap >/dev/null && {ctx} queue init --project mine >/dev/null && "
            f"echo '{json.dumps(request())}' | {ctx} queue publish --project mine - >/dev/null "
            f"&& {ctx} queue claim --project mine && echo shell=$$"
        )
        done = run_as(unprivileged_user, ["/bin/sh", "-c", script], env=env, cwd=home)
        assert done.returncode == 0, done
        job, shell = done.stdout.splitlines()
        root = home / ".local" / "share" / "cortexfs" / "storage" / "current"
        assert {p.name for p in root.iterdir()} >= {"bin", "tool", "shared", "home"}
        lease_file = root / "shared" / "mine" / "queue" / "lease" / job / "worker"
        lease = json.loads(lease_file.read_text())
        assert lease["pid"] == int(shell.removeprefix("shell="))
        assert lease_file.stat().st_uid == unprivileged_user.uid
    finally:
        shutil.rmtree(home, ignore_errors=True)
