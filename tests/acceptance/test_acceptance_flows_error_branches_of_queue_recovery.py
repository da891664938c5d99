"""The error branches of queue recovery, each reached from outside (SPEC §2.1, Q-3, Q-5, Q-6,
Q-8, Q-9, I-5, §2.4; docs/queue.md "The steps", "What a crash leaves, and what recover does
with it", "Liveness", "Configuration", "Command line").

The angle: what ``ctx queue recover`` (with ``--reconcile``, ``--dry-run``, ``--json``),
``status``, ``list``, ``show`` and ``renew`` say and do when the queue is damaged in the ways
the recovery code has a branch for — a lease with one field wrong or too big to be one, a
lease naming a holder of another pid namespace, boot or start time, a boot it could not read,
a lease period that is no lifetime, an empty lease directory, an orphan lease, a lease file
pinned by ``chattr``, a state or lease directory that is a mount point of another filesystem,
a config value past its rule or a config that is a socket, results that are no JSON or too
big, and a garbled claim-order hint in the user's cache.  Each check reads the exit status of
§2.4, the errno word of the ``ctx: ERRNO: sentence`` line and the same error as the one
``--json`` object (or the ``errors`` entry of recover's report), that the message names the
file or job at fault and what to do where the documents promise it, and that nothing was
half-done: the queue byte for byte as it was where a refusal changes nothing, no job lost or
doubled, no temp file left; where the message names a repair, the repair is run and the queue
checked again."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    SUFFIX,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    request,
    result,
    rfc3339,
    scratch_top,
    snapshot,
)
from tests.support.scratch_mounts import ScratchMounts
from tests.support.storage import attribute

SCRATCH = scratch_top(__file__)
DEAD_PID = 4_000_000  # above pid_max (at most 4194304), so never a live process here
HOST = os.uname().nodename
AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="needs root: chattr, mount")


# ---------------------------------------------------------------------- fixtures and checks


@pytest.fixture
def holder() -> Iterator[subprocess.Popen]:
    """A live process of this test's own, standing in as a lease holder."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def mounts() -> Iterator[ScratchMounts]:
    """Bind mounts this test makes, unmounted (and their sources removed) at the end."""
    made = ScratchMounts(new_scratch_dir(SCRATCH, "mnt-"))
    try:
        yield made
    finally:
        made.close()


def job(name: str) -> str:
    return name + SUFFIX


def no_traceback(*runs: Run) -> None:
    for r in runs:
        assert "Traceback" not in r.out + r.err, r


def refused(r: Run, name: str, status: int = 1) -> str:
    """``r``, run with ``--json``, exited ``status`` with one error object on stdout whose
    errno is ``name``, and the same error as the last line of stderr; its message."""
    no_traceback(r)
    assert r.rc == status, r
    lines = r.out.splitlines()
    assert len(lines) == 1, r
    obj = json.loads(lines[0])
    assert (obj["error"], obj["errno"]) == (name, getattr(errno, name)), r
    assert r.err.rstrip("\n").splitlines()[-1] == f"ctx: {name}: {obj['message']}", r
    return obj["message"]


def report(queue: QueueCLI, *args: str, status: int) -> dict:
    """``ctx queue recover --json ARGS``, which must exit ``status``: its report."""
    r = queue.run("recover", "--json", *args)
    no_traceback(r)
    assert r.rc == status, r
    return r.json()


def jobs_in(found: dict, key: str) -> list[str]:
    return sorted(entry["job"] for entry in found[key])


def claimed_for(queue: QueueCLI, name: str, pid: int) -> str:
    """Publish ``name`` and claim it (the only pending job) for process ``pid``."""
    published = queue.publish(request(tag=name), name=name)
    r = queue.run("claim", "--pid", str(pid))
    assert (r.rc, r.out.strip()) == (0, published), r
    return published


def lease_path(queue: QueueCLI, j: str) -> Path:
    return queue.dir / "lease" / j / "worker"


def edit_lease(queue: QueueCLI, j: str, **changes) -> dict:
    """J's lease with ``changes`` written back (a value of ``...`` drops the field)."""
    lease = queue.lease(j)
    for key, value in changes.items():
        if value is ...:
            lease.pop(key, None)
        else:
            lease[key] = value
    lease_path(queue, j).write_text(json.dumps(lease))
    return lease


def as_seconds(stamp: str) -> float:
    return rfc3339(stamp).timestamp()


def stamp_at(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def the_error(found: dict, j: str) -> dict:
    """The one entry of ``errors`` in recover's report, which must be J's."""
    assert [e["job"] for e in found["errors"]] == [j], found
    (entry,) = found["errors"]
    assert entry["state"] == "error" and entry["applied"] is False, entry
    return entry


# ------------------------------------------------------ renew: a holder the pid alone cannot tell


APART = [
    pytest.param("pid_ns", "of pid namespace", id="another-pid-namespace"),
    pytest.param("boot_id", "of another boot", id="another-boot"),
    pytest.param("create_time", "another process of that number", id="another-start-time"),
]


@pytest.mark.parametrize(("field", "said"), APART)
def test_renew_by_the_same_pid_of_another_namespace_boot_or_start_is_refused(
    queue: QueueCLI, holder, field: str, said: str
) -> None:
    """Q-3 ("no other process renews leases"), Q-5 ("a pid alone is never proof across hosts
    or pid namespaces"): a lease naming the caller's pid but another pid namespace, another
    boot or another start time names another process.  ``renew --pid PID`` is refused
    (EACCES, exit 1), the message names the lease's holder (pid, host, worker id) and what
    sets the caller apart, and the lease stays byte for byte with no temp file left."""
    j = claimed_for(queue, "apart", holder.pid)
    lease = queue.lease(j)
    other = {
        "pid_ns": lease["pid_ns"] + 1,
        "boot_id": str(uuid.uuid4()),
        "create_time": lease["create_time"] - 100,
    }[field]
    edit_lease(queue, j, **{field: other})
    before = snapshot(queue.dir)
    said_all = refused(queue.run("renew", j, "--pid", str(holder.pid), "--json"), "EACCES")
    head = f"job {j} is leased to pid {holder.pid} on {HOST} (worker {lease['worker']}), "
    assert said_all.startswith(head + f"not to pid {holder.pid}"), said_all
    assert said in said_all and "only the holder renews its lease" in said_all, said_all
    if field != "create_time":
        assert str(other) in said_all, said_all
    assert snapshot(queue.dir) == before
    assert queue.entries("inbox") == set()


# ----------------------------------------------------------- leases with one field wrong


def _set(field, value):
    def make(queue: QueueCLI, j: str) -> None:
        edit_lease(queue, j, **{field: value})

    return make


def _text(data: bytes = b"", pad: int = 0):
    def make(queue: QueueCLI, j: str) -> None:
        path = lease_path(queue, j)
        path.write_bytes(data + json.dumps(queue.lease(j)).encode() + b" " * pad)

    return make


BAD_LEASES = [
    pytest.param(_set("worker", 5), "EINVAL", "'worker'", id="worker-not-text"),
    pytest.param(_set("host", ...), "EINVAL", "'host'", id="host-missing"),
    pytest.param(_set("pid_ns", "abc"), "EINVAL", "'pid_ns'", id="pid_ns-not-an-inode"),
    pytest.param(_set("claimed_at", "yesterday"), "EINVAL", "'claimed_at' is not a time",
                 id="claimed_at-not-a-time"),
    pytest.param(_set("create_time", "soon"), "EINVAL", "'create_time' is not a time",
                 id="create_time-not-a-time"),
    pytest.param(_set("boot_id", "not-a-uuid"), "EINVAL", "'boot_id'", id="boot_id-no-uuid"),
    pytest.param(_set("job", 5), "EINVAL", "names job 5", id="job-not-text"),
    pytest.param(_text(data=b"\xff\xfe"), "EINVAL", "not a JSON object", id="not-utf-8"),
    pytest.param(_text(pad=70 * 1024), "EFBIG", "the limit is 65536", id="over-64-KiB"),
]  # fmt: skip


@pytest.mark.parametrize(("spoil", "code", "words"), BAD_LEASES)
def test_a_lease_with_one_field_wrong_is_a_conflict_named_by_that_field(
    queue: QueueCLI, spoil, code: str, words: str
) -> None:
    """docs/queue.md "The steps" (how a lease is read) and "What a crash leaves": a claimed
    job whose lease cannot be read proves nothing about its holder — never requeued (its pid
    is dead all the same), a conflict for ``status``, ``show`` and ``recover --reconcile``
    (exit 1), each naming ``lease/J/worker`` and what is wrong in it; ``renew`` and ``finish``
    refuse it with the lease's own errno (exit 1), saying to repair it, never remove it.
    Nothing moves and no temp file is left."""
    j = claimed_for(queue, "spoilt", DEAD_PID)
    spoil(queue, j)
    before = snapshot(queue.dir)
    why = f"lease/{j}/worker cannot be read ({code}: "

    status = queue.run("status", "--json")
    no_traceback(status)
    assert status.rc == 1, status
    (conflict,) = status.json()["conflicts"]
    assert conflict["job"] == j and why in conflict["detail"], conflict
    assert words in conflict["detail"], conflict
    assert "never remove it" in conflict["detail"], conflict

    shown = queue.run("show", j, "--json")
    no_traceback(shown)
    assert shown.rc == 1 and shown.json()["state"] == "conflict", shown
    holder = shown.json()["holder"]
    assert holder["state"] == "unreadable" and words in holder["reason"], holder

    found = report(queue, "--reconcile", status=1)
    assert jobs_in(found, "conflicts") == [j], found
    assert found["requeued"] == found["repaired"] == found["errors"] == [], found
    assert words in found["conflicts"][0]["detail"], found

    for argv, verb in (
        (("renew", j, "--pid", str(DEAD_PID), "--json"), "renew"),
        (("finish", j, "--ok", "-", "--json"), "finish"),
    ):
        said = refused(queue.run(*argv, input='"out"'), code)
        assert said.startswith(f"job {j}'s lease/{j}/worker is not a lease ("), said
        assert words in said and f"a conflict that {verb} never resolves" in said, said
        assert "do not remove it" in said, said
    assert snapshot(queue.dir) == before


# ------------------------------------------------------------------ an empty lease directory


def test_a_claim_whose_lease_directory_is_empty_never_ran_and_is_requeued_by_reconcile(
    queue: QueueCLI, holder
) -> None:
    """Q-3, Q-6 ("``claimed/J/J`` without ``lease/J/worker`` → back to pending"): with
    ``lease/J/`` there but empty, J's claim never completed.  ``renew`` and ``finish`` refuse
    it (ENOENT, exit 1) naming ``lease/J/worker`` and the ``recover --reconcile`` that
    returns J to pending; ``show`` names that repair; plain ``recover`` reports it (exit 1)
    and changes nothing; ``--reconcile`` requeues J and removes both directories, and a
    second run finds the queue consistent."""
    j = claimed_for(queue, "unleased", holder.pid)
    original = (queue.dir / "claimed" / j / j).read_bytes()
    lease_path(queue, j).unlink()
    before = snapshot(queue.dir)
    for argv in (("renew", j, "--pid", str(holder.pid)), ("finish", j, "--ok", "-")):
        said = refused(queue.run(*argv, "--json", input='"out"'), "ENOENT")
        assert f"has no lease/{j}/worker" in said and "never ran" in said, said
        assert "'ctx queue recover --reconcile --project proj'" in said, said
    shown = queue.run("show", j, "--json")
    assert shown.rc == 0, shown
    assert (shown.json()["state"], shown.json()["repair"]) == ("incomplete", "requeue-unleased")
    assert "holder" not in shown.json(), shown
    plain = report(queue, status=1)
    assert jobs_in(plain, "incomplete") == [j] and plain["requeued"] == [], plain
    assert snapshot(queue.dir) == before

    fixed = report(queue, "--reconcile", status=0)
    assert jobs_in(fixed, "repaired") == [j] and fixed["repaired"][0]["applied"] is True, fixed
    assert (queue.dir / "pending" / j).read_bytes() == original
    assert queue.requests() == {j: ["pending"]}
    assert queue.entries("claimed") == queue.entries("lease") == set()
    again = report(queue, "--reconcile", status=0)
    assert again["consistent"] is True and again["repaired"] == [], again


# ------------------------------------------------------------------ an orphan lease of one's own


def test_renew_and_finish_of_a_job_left_as_an_orphan_lease_say_where_it_is(
    queue: QueueCLI, holder
) -> None:
    """Q-6 (an orphan ``lease/J`` with no request in ``claimed/``), docs/queue.md "Command
    line" (``finish`` and ``renew`` of a job that is not claimed say where it is instead, or
    that the queue has no such job and ``ctx queue list`` lists those it has): J's request
    and claim directory are gone, its lease (naming the caller, alive) is left.  ``list`` and
    ``show`` give J as incomplete; ``renew`` and ``finish`` refuse (ENOENT, exit 1) and change
    nothing, but must not say that there is no lease or no such job."""
    j = claimed_for(queue, "orphan", holder.pid)
    (queue.dir / "claimed" / j / j).unlink()
    (queue.dir / "claimed" / j).rmdir()
    listed = queue.run("list", "--json")
    assert listed.rc == 0 and listed.json() == [{"name": j, "state": "incomplete"}], listed
    before = snapshot(queue.dir)
    for argv in (("renew", j, "--pid", str(holder.pid)), ("finish", j, "--ok", "-")):
        said = refused(queue.run(*argv, "--json", input='"out"'), "ENOENT")
        assert snapshot(queue.dir) == before
        assert "no lease to renew" not in said and "has no such job" not in said, said
        assert f"lease/{j}" in said, said


# ------------------------------------------------------------------ renew of a hand-made period


def test_renew_of_a_lease_whose_period_is_no_lifetime_uses_lease_ttl_and_never_shortens(
    queue: QueueCLI, holder
) -> None:
    """docs/queue.md: ``renew`` without ``--ttl`` renews "for as long again as it was taken or
    last renewed for", never for less; a lease written by hand whose ``claimed_at`` lies after
    its ``expires_at`` has no such period.  Renewed then for the queue's ``lease_ttl`` (600 s
    here, twice the default): expiring in 10 s, it is renewed to about 600 s from now (exit
    0, ``renewed_at`` set); expiring in two years, a renewal would shorten it, so it is left
    byte for byte as it was (exit 0, the answer giving the same expiry)."""
    config = queue.dir / "config"
    config.write_text(config.read_text() + "lease_ttl=600\n")
    j = claimed_for(queue, "odd", holder.pid)
    now = time.time()
    edit_lease(queue, j, claimed_at=stamp_at(now + 100), expires_at=stamp_at(now + 10))
    r = queue.run("renew", j, "--pid", str(holder.pid), "--json")
    no_traceback(r)
    assert r.rc == 0, r
    lease = queue.lease(j)
    assert r.json()["expires_at"] == lease["expires_at"], r
    left = as_seconds(lease["expires_at"]) - time.time()
    assert 300 < left <= 601, lease
    assert "renewed_at" in lease and queue.entries("inbox") == set(), lease

    far = now + 2 * 365 * 86400
    edit_lease(queue, j, claimed_at=stamp_at(far + 100), expires_at=stamp_at(far))
    written = lease_path(queue, j).read_bytes()
    r = queue.run("renew", j, "--pid", str(holder.pid), "--json")
    no_traceback(r)
    assert r.rc == 0, r
    assert abs(as_seconds(r.json()["expires_at"]) - far) < 0.001, r
    assert lease_path(queue, j).read_bytes() == written
    assert queue.entries("inbox") == set()


# -------------------------------------------------------------------- a boot the holder lacked


def test_a_lease_whose_holder_could_not_read_its_boot_is_kept_until_it_expires(
    queue: QueueCLI,
) -> None:
    """docs/queue.md "Liveness" and how a lease is read: ``boot_id`` ``unknown`` (a holder
    that could not read its boot id) proves no reboot, and without the same boot a dead pid
    proves nothing (Q-5): J, leased to a dead pid of this host and pid namespace, is
    ``unknown`` for ``show`` and left untouched by plain and --reconcile recover (exit 0,
    nothing moves) until its lease expires; then recover requeues it, once."""
    j = claimed_for(queue, "unbooted", DEAD_PID)
    edit_lease(queue, j, boot_id="unknown")
    before = snapshot(queue.dir)
    shown = queue.run("show", j, "--json")
    assert shown.rc == 0 and shown.json()["holder"]["state"] == "unknown", shown
    for args in ((), ("--reconcile",)):
        found = report(queue, *args, status=0)
        assert jobs_in(found, "untouched") == [j] and found["requeued"] == [], found
    assert snapshot(queue.dir) == before
    edit_lease(queue, j, expires_at=stamp_at(time.time() - 1))
    found = report(queue, status=0)
    assert jobs_in(found, "requeued") == [j], found
    assert queue.requests() == {j: ["pending"]}
    assert report(queue, status=0)["requeued"] == []


def test_the_verdict_on_a_holder_of_unknown_boot_says_the_boot_is_unknown(
    queue: QueueCLI,
) -> None:
    """Q-5, docs/queue.md "Liveness": the reason given for an ``unknown`` verdict on a lease
    of this host and pid namespace whose boot is ``unknown`` names that boot as the reason,
    never another pid namespace or host, which the lease does not name."""
    j = claimed_for(queue, "unbooted", DEAD_PID)
    edit_lease(queue, j, boot_id="unknown")
    reason = queue.run("show", j, "--json").json()["holder"]["reason"]
    assert reason.startswith(f"pid {DEAD_PID} on {HOST} "), reason
    assert "outside this pid namespace or host" not in reason, reason
    assert "boot" in reason, reason


# ------------------------------------------------------- a lease file pinned by its attribute


@needs_root
@pytest.mark.parametrize(("letter", "word"), [("i", "immutable"), ("a", "append-only")])
def test_a_requeue_refused_by_an_attribute_of_the_lease_file_names_it(
    queue: QueueCLI, letter: str, word: str
) -> None:
    """docs/queue.md "Command line" (``finish`` and ``recover`` look at the request and lease
    files they will move or remove before their first step) and "What a crash leaves" (an
    ``error`` line: EPERM naming the attribute and the ``chattr`` that removes it, and where
    the job stands): a dead holder's claim whose ``lease/J/worker`` is immutable or
    append-only is not requeued: ``--dry-run`` and the run report the same error (exit 1,
    ``action`` requeue, not applied), "left as it is", and nothing moves.  Once the attribute
    is removed, plain recover requeues J."""
    j = claimed_for(queue, "pinned", DEAD_PID)
    pinned = lease_path(queue, j)
    before = snapshot(queue.dir)
    with attribute(pinned, letter):
        planned = the_error(report(queue, "--dry-run", status=1), j)
        ran = report(queue, status=1)
        text = queue.run("recover")
    entry = the_error(ran, j)
    assert ran["requeued"] == [] and snapshot(queue.dir) == before
    assert (entry["error"], entry["action"]) == ("EPERM", "requeue"), entry
    assert entry["detail"] == planned["detail"], (entry, planned)
    detail = entry["detail"]
    assert detail.startswith(f"EPERM: cannot requeue {j} in queue {queue.dir}: "), detail
    for words in (f"{pinned} is {word}", f"chattr -{letter} {pinned}", "left as it is"):
        assert words in detail, (words, detail)
    assert text.rc == 1 and f"error    {j}: {detail}" in text.out, text
    found = report(queue, status=0)
    assert jobs_in(found, "requeued") == [j] and queue.requests() == {j: ["pending"]}, found


@needs_root
def test_an_orphan_lease_file_made_immutable_is_named_and_removed_once_freed(
    queue: QueueCLI,
) -> None:
    """Q-6 (an orphan ``lease/J`` with no request anywhere in ``claimed/`` is removed by
    ``--reconcile``), docs/queue.md (an ``error`` entry names the transition it stopped):
    a dead holder's orphan lease whose file is immutable is reported (EPERM, exit 1,
    ``action`` remove-orphans) naming the file and its ``chattr -i``, left as it is; once
    the attribute is gone, the repair removes ``lease/J`` and the queue is consistent."""
    j = claimed_for(queue, "orphan", DEAD_PID)
    (queue.dir / "claimed" / j / j).unlink()
    (queue.dir / "claimed" / j).rmdir()
    pinned = lease_path(queue, j)
    before = snapshot(queue.dir)
    with attribute(pinned, "i"):
        entry = the_error(report(queue, "--reconcile", status=1), j)
    assert snapshot(queue.dir) == before
    assert (entry["error"], entry["action"]) == ("EPERM", "remove-orphans"), entry
    assert f"chattr -i {pinned}" in entry["detail"], entry
    assert entry["detail"].endswith("left as it is"), entry
    fixed = report(queue, "--reconcile", status=0)
    assert jobs_in(fixed, "repaired") == [j] and queue.entries("lease") == set(), fixed


# ----------------------------------------------------- state directories on another filesystem


@needs_root
def test_a_requeue_into_a_pending_dir_on_another_filesystem_leaves_the_job_as_it_is(
    queue: QueueCLI, mounts: ScratchMounts
) -> None:
    """Q-5, Q-7, docs/queue.md (recover's ``error`` line says where the job stands: "left as
    it is" — a move is one rename, the job claimed and leased as before): with ``pending/``
    a mount of another filesystem, a rename into it is refused (EXDEV).  The requeue of a
    dead holder's job is an error (exit 1, ``EXDEV``, ``action`` requeue), J stays claimed
    and leased byte for byte, nothing reaches ``pending/`` or stays in ``inbox/``; on one
    filesystem again, plain recover requeues J once."""
    j = claimed_for(queue, "crossing", DEAD_PID)
    elsewhere = new_scratch_dir(mounts.top, "pending-")
    before = snapshot(queue.dir)
    covered = mounts.bind(elsewhere, queue.dir / "pending")
    found = report(queue, status=1)
    entry = the_error(found, j)
    assert (entry["error"], entry["action"]) == ("EXDEV", "requeue"), entry
    assert "; left as it is: put the queue's directories on one filesystem" in entry["detail"]
    assert found["requeued"] == [] and os.listdir(elsewhere) == [], found
    mounts.unmount(covered)
    assert snapshot(queue.dir) == before
    assert jobs_in(report(queue, status=0), "requeued") == [j]
    assert queue.requests() == {j: ["pending"]}


def _crossing_pending(queue: QueueCLI, mounts: ScratchMounts) -> tuple[str, Path, tuple]:
    j = claimed_for(queue, "crossing", DEAD_PID)
    target = queue.dir / "pending"
    mounts.bind(new_scratch_dir(mounts.top, "pending-"), target)
    return j, target, ()


def _crossing_done(queue: QueueCLI, mounts: ScratchMounts) -> tuple[str, Path, tuple]:
    j = claimed_for(queue, "crossing", DEAD_PID)
    target = queue.dir / "done"
    mounts.bind(new_scratch_dir(mounts.top, "done-"), target)
    (target / f"{j}.result").write_text(json.dumps(result("done")))
    return j, target, ("--reconcile",)


@needs_root
@pytest.mark.parametrize("setup", [_crossing_pending, _crossing_done], ids=["requeue", "roll"])
def test_a_recover_refused_across_filesystems_names_the_directory_and_the_remedy(
    queue: QueueCLI, mounts: ScratchMounts, setup
) -> None:
    """docs/queue.md "What a crash leaves": "the kernel may still refuse the move … The
    ``error`` line … names the directory that refused and why, as ``finish`` would", and
    ``finish`` refused with EXDEV names the directory and says to put the queue's directories
    on one filesystem.  recover's line for the same refusal says as much."""
    j, target, args = setup(queue, mounts)
    entry = the_error(report(queue, *args, status=1), j)
    assert entry["error"] == "EXDEV", entry
    assert str(target) in entry["detail"], entry
    assert "filesystem" in entry["detail"], entry


@needs_root
def test_a_requeue_stopped_by_a_busy_lease_directory_says_it_stopped_part_way(
    queue: QueueCLI, mounts: ScratchMounts
) -> None:
    """docs/queue.md "What a crash leaves": a transition whose cleanup the kernel refuses
    after the request moved is an ``error`` saying "stopped part-way: it is now incomplete
    (…), for 'ctx queue recover --reconcile' to complete", and every other job is still
    handled.  ``lease/J`` a mount point (EBUSY for its removal): J's request reaches
    ``pending/`` once, the error (exit 1, ``EBUSY``, ``action`` requeue) says where J stands
    and names the command for this queue, another dead holder's job is requeued in the same
    run; a --reconcile meanwhile loses nothing; unmounted, the suggested command completes
    J and the queue settles."""
    j = claimed_for(queue, "busy", DEAD_PID)
    original = (queue.dir / "claimed" / j / j).read_bytes()
    source = new_scratch_dir(mounts.top, "lease-")
    shutil.copy2(lease_path(queue, j), source / "worker")
    lease_path(queue, j).unlink()
    covered = mounts.bind(source, queue.dir / "lease" / j)
    other = claimed_for(queue, "other", DEAD_PID)

    found = report(queue, status=1)
    assert jobs_in(found, "requeued") == [other], found
    entry = the_error(found, j)
    assert (entry["error"], entry["action"]) == ("EBUSY", "requeue"), entry
    said = "stopped part-way: it is now incomplete (pending, with a leftover claim or lease)"
    assert said in entry["detail"], entry
    suggested = "ctx queue recover --reconcile --project proj"
    assert f"for '{suggested}' to complete" in entry["detail"], entry
    assert (queue.dir / "pending" / j).read_bytes() == original
    assert queue.requests() == {j: ["pending"], other: ["pending"]}
    status = queue.run("status", "--json")
    assert [i["job"] for i in status.json()["incomplete"]] == [j], status

    again = report(queue, "--reconcile", status=1)
    assert the_error(again, j)["error"] == "EBUSY", again
    assert queue.requests() == {j: ["pending"], other: ["pending"]}
    mounts.unmount(covered)
    fixed = ctx_run(*suggested.split()[1:], "--json", env=clean_env(CTX_STORAGE=str(queue.storage)))
    assert fixed.rc == 0 and jobs_in(fixed.json(), "repaired") == [j], fixed
    assert queue.requests() == {j: ["pending"], other: ["pending"]}
    assert queue.entries("claimed") == queue.entries("lease") == set()
    assert report(queue, "--reconcile", status=0)["repaired"] == []


# --------------------------------------------------------------------------- the queue config


BAD_CONFIG = [
    pytest.param("grace=-1", "grace must be a non-negative number of seconds, not '-1'",
                 id="grace-negative"),
    pytest.param("grace=soon", "grace must be a non-negative number of seconds, not 'soon'",
                 id="grace-no-number"),
    pytest.param("max_result_bytes=0", "max_result_bytes must be a positive integer, not '0'",
                 id="max_result_bytes-zero"),
    pytest.param("max_request_bytes=1.5",
                 "max_request_bytes must be a positive integer, not '1.5'",
                 id="max_request_bytes-fraction"),
    pytest.param("lease_ttl=nan", "lease_ttl must be a number of seconds above 0",
                 id="lease_ttl-nan"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "said"), BAD_CONFIG)
def test_recover_refuses_a_config_value_past_its_rule_before_touching_anything(
    queue: QueueCLI, line: str, said: str
) -> None:
    """docs/queue.md "Configuration" (the value rules of the table; a config that cannot be
    read is never replaced by the defaults), §2.4 (exit 1, refused): a line of
    ``queue/config`` past its rule makes ``recover --reconcile`` refuse (EINVAL, naming the
    file, the line number, the key and the value) before it looks at a job: a dead holder's
    claim stays claimed and an old stray temp file stays in ``inbox/``."""
    j = claimed_for(queue, "waiting", DEAD_PID)
    stray = queue.dir / "inbox" / "lost.req.json.publish.tmp"
    stray.write_text("{}")
    then = time.time() - 86400
    os.utime(stray, (then, then))
    config = queue.dir / "config"
    number = len(config.read_text().splitlines()) + 1
    config.write_text(config.read_text() + line + "\n")
    before = snapshot(queue.dir)
    for args in (("--reconcile",), ("--dry-run",), ()):
        message = refused(queue.run("recover", "--json", *args), "EINVAL")
        assert message.startswith(f"{config}:{number}: {said}"), message
    assert snapshot(queue.dir) == before and queue.state(j) == "claimed"


def test_a_config_that_is_a_socket_is_refused_until_moved_aside_as_told(
    queue: QueueCLI,
) -> None:
    """docs/queue.md "Command line": a ``config`` that is a FIFO, a socket or a link is
    refused with its full path and the repair (``move it aside, and 'ctx queue init' writes
    the default config in its place``), before anything is done.  ``recover``, ``status``
    and ``init`` refuse a socket there (EINVAL, exit 1) and a dead holder's claim stays; done
    as told, ``init`` writes a default config and ``recover`` requeues the job."""
    j = claimed_for(queue, "waiting", DEAD_PID)
    config = queue.dir / "config"
    config.unlink()
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(str(config))
        before = snapshot(queue.dir)
        for argv in (("recover", "--reconcile"), ("status",), ("init",)):
            said = refused(queue.run(*argv, "--json"), "EINVAL")
            assert said.startswith(f"{config} is a socket, not a regular file; "), said
            assert "move it aside, and 'ctx queue init --project proj' writes" in said, said
        assert snapshot(queue.dir) == before and queue.state(j) == "claimed"
    finally:
        listener.close()
    config.rename(queue.dir.parent / "config.socket")
    made = queue.run("init")
    assert made.rc == 0 and config.is_file(), made
    assert jobs_in(report(queue, status=0), "requeued") == [j]


# ------------------------------------------------------------- results that cannot be read


def test_a_finished_pair_whose_result_cannot_be_read_is_shown_unreadable(
    queue: QueueCLI,
) -> None:
    """docs/queue.md "Command line" (``show --json`` gives the ``result`` J holds), §2.1: a
    ``done/`` pair whose result is no JSON, not UTF-8, or larger than any result the queue
    stores is still ``done`` for ``status``, ``list`` and ``show`` (exit 0), ``show`` giving
    ``{"unreadable": why}`` (for the large one: EFBIG, its size and the limit); recover
    leaves all three as they are and calls the queue consistent."""
    config = queue.dir / "config"
    config.write_text(config.read_text() + "max_result_bytes=100\n")
    contents = {
        "garbled": (b"not json at all", "Expecting value"),
        "binary": (b"\xff\xfe\x00", "utf-8"),
        "huge": (b'{"status": "ok", "output": "' + b"x" * (2 << 20) + b'"}', "EFBIG"),
    }
    for name, (data, _) in contents.items():
        (queue.dir / "done" / job(name)).write_text(json.dumps(request(tag=name)))
        (queue.dir / "done" / f"{job(name)}.result").write_bytes(data)
    before = snapshot(queue.dir)
    status = queue.run("status", "--json")
    assert status.rc == 0 and status.json()["counts"]["done"] == 3, status
    listed = queue.run("list", "--json")
    assert listed.rc == 0 and {e["state"] for e in listed.json()} == {"done"}, listed
    for name, (_, why) in contents.items():
        shown = queue.run("show", job(name), "--json")
        no_traceback(shown)
        assert shown.rc == 0 and shown.json()["state"] == "done", shown
        unreadable = shown.json()["result"]["unreadable"]
        assert why in unreadable, unreadable
    huge = queue.run("show", job("huge"), "--json").json()["result"]["unreadable"]
    size = (queue.dir / "done" / f"{job('huge')}.result").stat().st_size
    assert str(size) in huge and "the limit is" in huge, huge
    found = report(queue, "--reconcile", status=0)
    assert found["consistent"] is True and found["conflicts"] == [], found
    assert snapshot(queue.dir) == before


# ------------------------------------------------------------ a garbled claim-order hint


def test_a_garbled_file_in_the_claim_order_cache_never_stops_a_claim(queue: QueueCLI) -> None:
    """Q-9, Q-10, docs/queue.md "Scale" (the claim order is a per-user cache file, a hint
    and never evidence; losing it costs one listing; now and then the cache directory is
    cleaned of hints of queues that are gone and of files that are no hint): a file in
    ``$XDG_CACHE_HOME/cortexfs/claim-order/`` whose header reads as a hint's but whose queue
    line is nested thousands deep is one a clean-up must survive.  ``ctx queue claim`` then
    claims the pending job (exit 0, its name alone on stdout), with no traceback."""
    cache = new_scratch_dir(SCRATCH, "cache-")
    try:
        hints = cache / "cortexfs" / "claim-order"
        hints.mkdir(parents=True, mode=0o700)
        line = b"[" * 5000 + b"\n"
        start = 128 + len(line)
        header = f"{start:020d} {0:020d} {0:020d} {start:020d} -".ljust(127).encode() + b"\n"
        (hints / "0123456789abcdef0123456789abcdef").write_bytes(header + line)
        env = clean_env(CTX_STORAGE=str(queue.storage), XDG_CACHE_HOME=str(cache))
        j = queue.publish(name="next")
        r = queue.run("claim", "--pid", str(DEAD_PID), env=env)
        no_traceback(r)
        assert r.rc == 0 and r.out == f"{j}\n", r
    finally:
        shutil.rmtree(cache, ignore_errors=True)


# ------------------------------------------------------- the expiry an epoch number may give


def test_lease_times_given_as_epoch_numbers_out_of_range_are_conflicts(
    queue: QueueCLI,
) -> None:
    """docs/queue.md (how a lease is read: times are RFC 3339 or seconds since the epoch,
    "either names an instant of the years 1 to 9999, else the lease is unreadable (a
    conflict, never a requeue)"): an ``expires_at`` of 1e300 seconds, an integer of 400
    digits, and the first second of the year 10000 given as a number, each make the lease
    unreadable: ``status`` names the field (exit 1) and a dead holder's job is never
    requeued; the last second of 9999 is a time, and the dead holder's job is requeued."""
    j = claimed_for(queue, "epoch", DEAD_PID)
    end_of_9999 = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
    for value in (1e300, 10**400, end_of_9999 + 1):
        edit_lease(queue, j, expires_at=value)
        before = snapshot(queue.dir)
        status = queue.run("status", "--json")
        assert status.rc == 1, status
        (conflict,) = status.json()["conflicts"]
        assert "'expires_at' is not a time" in conflict["detail"], conflict
        found = report(queue, status=1)
        assert found["requeued"] == [] and jobs_in(found, "conflicts") == [j], found
        assert snapshot(queue.dir) == before
    edit_lease(queue, j, expires_at=end_of_9999)
    shown = queue.run("show", j, "--json")
    assert shown.rc == 0 and shown.json()["holder"]["state"] == "gone", shown
    assert jobs_in(report(queue, status=0), "requeued") == [j]


# ------------------------------------------------- a stale claim copy beside a finished pair


def test_a_claim_link_of_a_failed_request_is_dropped_and_nothing_else(queue: QueueCLI) -> None:
    """Q-6 (a finish cut short leaves the terminal pair plus the claim; ``--reconcile``
    completes it), docs/queue.md ("claimed/J/J a second link of done|failed/J": the claim
    link is dropped): J failed, its request still linked at ``claimed/J/J`` and its dead
    holder's lease left.  Plain recover reports it incomplete (exit 1) and changes nothing;
    ``--reconcile`` drops the claim link and the lease, keeps the failed pair byte for byte,
    and J is never pending again."""
    j = claimed_for(queue, "linked", DEAD_PID)
    claim = queue.dir / "claimed" / j / j
    os.link(claim, queue.dir / "failed" / j)
    (queue.dir / "failed" / f"{j}.result").write_text(json.dumps(result("failed")))
    pair = {p: (queue.dir / "failed" / p).read_bytes() for p in (j, f"{j}.result")}
    before = snapshot(queue.dir)
    plain = report(queue, status=1)
    assert jobs_in(plain, "incomplete") == [j] and plain["requeued"] == [], plain
    assert "second link of failed/J" in plain["incomplete"][0]["detail"], plain
    assert snapshot(queue.dir) == before
    fixed = report(queue, "--reconcile", status=0)
    assert jobs_in(fixed, "repaired") == [j], fixed
    assert fixed["repaired"][0]["action"] == "drop-claim-copy", fixed
    assert {p: (queue.dir / "failed" / p).read_bytes() for p in pair} == pair
    assert queue.requests() == {j: ["failed"]}
    assert queue.entries("claimed") == queue.entries("lease") == set()
    assert os.stat(queue.dir / "failed" / j).st_nlink == 1


# ------------------------------------------------------------ evidence in two states at once


def test_a_result_with_no_request_anywhere_is_a_conflict_that_holds_the_name(
    queue: QueueCLI,
) -> None:
    """Q-6 ("a result without its terminal request" is an incomplete pair no transition can
    complete without losing or duplicating work: a conflict), §2.4: ``failed/J.result``
    alone, its request nowhere.  ``status`` and ``show`` call it a conflict saying the request
    is nowhere (exit 1); every recover reports it and changes nothing (exit 1); publishing J
    again is refused (EEXIST), so the result is never orphaned by a new J."""
    j = job("gone")
    (queue.dir / "failed" / f"{j}.result").write_text(json.dumps(result("failed")))
    before = snapshot(queue.dir)
    status = queue.run("status", "--json")
    assert status.rc == 1, status
    (conflict,) = status.json()["conflicts"]
    assert conflict["job"] == j and "request is nowhere" in conflict["detail"], conflict
    shown = queue.run("show", j, "--json")
    assert shown.rc == 1 and shown.json()["repair"] is None, shown
    for args in (("--dry-run",), (), ("--reconcile",)):
        found = report(queue, *args, status=1)
        assert jobs_in(found, "conflicts") == [j], found
        assert found["conflicts"][0]["evidence"] == [f"failed/{j}.result"], found
    again = queue.run("publish", "--name", "gone", "-", "--json", input=json.dumps(request()))
    refused(again, "EEXIST")
    assert snapshot(queue.dir) == before


# ------------------------------------------------------------------- recover's own options


@needs_root
def test_a_dry_run_of_a_requeue_the_run_is_refused_by_an_attribute_changes_nothing(
    queue: QueueCLI,
) -> None:
    """docs/queue.md (``--dry-run`` "changes nothing and reports what it would do", exit
    status that of the queue as it leaves it, and a move the run would be refused is an
    ``error`` of the dry run too): a dead holder's job whose ``claimed/J`` is immutable and a
    second dead holder's job that can move: the dry run plans the one requeue
    (``applied`` false), reports the other as the error the run then gives, exits 1 and
    moves nothing; the run requeues the second job only."""
    j = claimed_for(queue, "stuck", DEAD_PID)
    k = claimed_for(queue, "free", DEAD_PID)
    before = snapshot(queue.dir)
    with attribute(queue.dir / "claimed" / j, "i"):
        planned = report(queue, "--dry-run", status=1)
        assert snapshot(queue.dir) == before
        ran = report(queue, status=1)
    assert jobs_in(planned, "requeued") == [k] and planned["requeued"][0]["applied"] is False
    assert jobs_in(ran, "requeued") == [k] and ran["requeued"][0]["applied"] is True, ran
    assert the_error(planned, j)["detail"] == the_error(ran, j)["detail"], (planned, ran)
    assert "immutable" in the_error(ran, j)["detail"], ran
    assert queue.requests() == {j: ["claimed"], k: ["pending"]}


def test_recover_text_and_json_name_the_same_findings_for_a_damaged_queue(
    queue: QueueCLI,
) -> None:
    """§2.4 (``--json`` gives machine-readable output; human text otherwise), docs/queue.md
    (the lines recover prints): a queue holding a lease that cannot be read, a claim without
    a lease and an old stray temp file.  A plain ``--dry-run`` in text names each with its
    own line (``conflict``, ``incomplete`` with the repair to run, ``stale``) and a summary
    line counting them, as the ``--json`` report of the same run lists them; both exit 1."""
    bad = claimed_for(queue, "bad", DEAD_PID)
    lease_path(queue, bad).write_text("{}")
    unleased = claimed_for(queue, "unleased", DEAD_PID)
    shutil.rmtree(queue.dir / "lease" / unleased)
    stray = queue.dir / "inbox" / "x.req.json.publish.tmp"
    stray.write_text("{}")
    then = time.time() - 86400
    os.utime(stray, (then, then))
    before = snapshot(queue.dir)
    found = report(queue, "--dry-run", status=1)
    text = queue.run("recover", "--dry-run")
    assert text.rc == 1, text
    assert jobs_in(found, "conflicts") == [bad] and jobs_in(found, "incomplete") == [unleased]
    assert found["stale_temps"] == ["inbox/x.req.json.publish.tmp"], found
    lines = text.lines()
    assert f"conflict {bad}: {found['conflicts'][0]['detail']}; evidence: " in text.out, text
    assert (
        f"incomplete {unleased}: {found['incomplete'][0]['detail']} "
        "(run with --reconcile: requeue-unleased)" in lines
    ), text
    assert "stale    inbox/x.req.json.publish.tmp (run with --reconcile to remove)" in lines
    assert lines[-1].startswith("0 would requeue, 0 would repair, 1 incomplete, 1 conflicts, "
                                "1 stale temps: queue NOT consistent"), text  # fmt: skip
    assert snapshot(queue.dir) == before
