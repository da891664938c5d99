"""recover and recover --reconcile: liveness (Q-5), incomplete pairs and conflicts (Q-6), I-5."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from cortexfs.durable import FsOps
from cortexfs.queue import Holder, Queue, claim, finish, publish, recover
from cortexfs.queue.evidence import assess, evidence_of
from cortexfs.queue.holder import GONE, UNKNOWN, Lease, LocalSystem, judge, process_exists
from tests.queue.helpers import PROJECT, dead_pid, request
from tests.support.cli import ctx
from tests.support.locks import wait_for_lock
from tests.support.waiting import wait_until


def state_of(queue: Queue, job: str) -> str:
    return assess(evidence_of(queue, job)).state


def claimed_by(queue: Queue, holder: Holder, name: str = "j", ttl: float = 300) -> str:
    job = publish(queue, request(), name=name)
    won = claim(queue, holder, ttl=ttl)
    assert won is not None and won.job == job
    return job


def test_a_job_whose_holder_died_goes_back_to_pending(queue: Queue, me: Holder) -> None:
    gone = dataclasses.replace(me, pid=dead_pid())
    job = claimed_by(queue, gone)
    report = recover(queue)
    assert [f.job for f in report.requeued] == [job] and report.consistent
    assert "exited" in report.requeued[0].detail
    assert state_of(queue, job) == "pending"
    assert recover(queue).requeued == []  # converges (I-5)


def test_a_reused_pid_with_another_start_time_counts_as_gone(queue: Queue, me: Holder) -> None:
    impostor = dataclasses.replace(me, start_time=me.start_time - 1000)
    job = claimed_by(queue, impostor)
    report = recover(queue)
    assert [f.job for f in report.requeued] == [job]
    assert "another process" in report.requeued[0].detail


def test_a_live_holder_is_never_touched(queue: Queue, me: Holder) -> None:
    job = claimed_by(queue, me, ttl=300)
    for reconcile in (False, True):
        report = recover(queue, reconcile=reconcile)
        assert report.requeued == [] and report.consistent
        assert [f.job for f in report.untouched] == [job]
    assert state_of(queue, job) == "claimed"


def test_an_expired_lease_is_proof_even_of_a_live_local_holder(
    queue: Queue, me: Holder, root: Path
) -> None:
    """Q-5 lists "or the lease expired" as proof, wherever the holder runs: to keep a job,
    a holder renews its lease."""
    job = claimed_by(queue, me, ttl=0.2)
    assert recover(queue).requeued == []
    time.sleep(0.3)
    done = ctx(root, "queue", "recover", "--project", PROJECT)
    assert done.returncode == 0 and f"requeue  {job}" in done.stdout and "expired" in done.stdout
    assert state_of(queue, job) == "pending"


def test_claim_ttl_then_recover_from_a_shell_requeues(root: Path, queue_dir: Path) -> None:
    """The command line of §2.4: claim with a 1 s lease, let it lapse, recover."""
    (queue_dir.parent / "req.json").write_text(json.dumps(request()))
    script = (
        f'ctx() {{ {sys.executable} -m cortexfs "$@"; }}; '
        f"ctx queue publish --project {PROJECT} --name t {queue_dir.parent / 'req.json'} && "
        f"ctx queue claim --project {PROJECT} --ttl 1 && sleep 2 && "
        f"ctx queue recover --project {PROJECT}"
    )
    done = subprocess.run(
        ["sh", "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "CTX_STORAGE": str(root)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "requeue  t.req.json" in done.stdout
    assert os.listdir(queue_dir / "pending") == ["t.req.json"]


def test_a_holder_in_another_pid_namespace_is_judged_by_expiry(queue: Queue, me: Holder) -> None:
    # Same pid number as a dead local process: a pid alone must not prove anything.
    elsewhere = dataclasses.replace(me, pid=dead_pid(), pid_ns=me.pid_ns + 1)
    job = claimed_by(queue, elsewhere, ttl=0.5)
    report = recover(queue)
    assert report.requeued == [] and "namespace" in report.untouched[0].detail
    time.sleep(0.6)
    report = recover(queue)
    assert [f.job for f in report.requeued] == [job] and "expired" in report.requeued[0].detail


def test_where_proc_is_another_namespaces_a_pid_is_asked_of_the_kernel_alone(me: Holder) -> None:
    """Q-5 from a pid namespace that sees its parent's /proc (``unshare --pid`` without
    ``--mount-proc``), where /proc names other processes under this namespace's numbers: a
    holder's pid that the kernel knows is never proof of anything (unknown, kept, whatever
    its start time), and one it does not know has exited."""
    elsewhere_proc = dataclasses.replace(LocalSystem.current(), own_proc=False)
    running = Lease.new("j", dataclasses.replace(me, start_time=me.start_time - 1000), 300)
    gone = Lease.new("j", dataclasses.replace(me, pid=dead_pid()), 300)

    assert judge(running, elsewhere_proc).state == UNKNOWN
    assert "another pid namespace" in judge(running, elsewhere_proc).reason
    assert judge(gone, elsewhere_proc).state == GONE
    # with a /proc of its own, the same start time tells the reused pid
    assert judge(running).state == GONE


def test_a_holder_that_does_not_run_is_alive_and_said_to_be_stopped(tmp_path: Path) -> None:
    """Q-5: a stopped or frozen holder is alive (its job is kept), and the verdict says it
    does not run, so a user waiting on its job is not told it is "running"."""
    sleeper = subprocess.Popen(["sleep", "600"], process_group=0)
    try:
        lease = Lease.new("j", Holder.for_process(sleeper.pid), 300)
        assert judge(lease).reason.endswith("is running")
        os.kill(sleeper.pid, signal.SIGSTOP)
        assert wait_until(lambda: psutil.Process(sleeper.pid).status() == psutil.STATUS_STOPPED)
        stopped = judge(lease)
        assert stopped.state == "alive", stopped
        assert f"pid {sleeper.pid} on " in stopped.reason, stopped
        assert "is stopped (SIGSTOP or job control); it keeps its job until it goes on" in (
            stopped.reason
        )
        os.kill(sleeper.pid, signal.SIGCONT)
        frozen = _frozen_in_a_cgroup(sleeper.pid)
        if frozen is not None:
            with frozen:
                verdict = judge(lease)
                assert verdict.state == "alive", verdict
                assert "is frozen (cgroup /sys/fs/cgroup/" in verdict.reason, verdict
        assert judge(lease).reason.endswith("is running")
    finally:
        sleeper.kill()
        sleeper.wait()


def _frozen_in_a_cgroup(pid: int):
    """A context in which ``pid`` sits in a frozen cgroup of its own (v2 ``cgroup.freeze``
    where the v2 tree has it, else the v1 freezer), or None where neither can be made."""
    import contextlib

    top = Path("/sys/fs/cgroup")
    for root, freeze, thaw, done in (
        (top, "cgroup.freeze", ("1", "0"), ("cgroup.events", "frozen 1")),
        (top / "unified", "cgroup.freeze", ("1", "0"), ("cgroup.events", "frozen 1")),
        (top / "freezer", "freezer.state", ("FROZEN", "THAWED"), ("freezer.state", "FROZEN")),
    ):
        group = root / f"ctx-test-frozen-{os.getpid()}"
        try:
            group.mkdir()
        except OSError:
            continue
        if not (group / freeze).exists():
            group.rmdir()
            continue

        @contextlib.contextmanager
        def frozen(group=group, root=root, freeze=freeze, thaw=thaw, done=done):
            (group / "cgroup.procs").write_text(f"{pid}\n")
            (group / freeze).write_text(thaw[0])
            try:
                assert wait_until(lambda: done[1] in (group / done[0]).read_text().split("\n"))
                yield
            finally:
                (group / freeze).write_text(thaw[1])
                (root / "cgroup.procs").write_text(f"{pid}\n")
                group.rmdir()

        return frozen()
    return None


def test_this_process_sees_a_proc_of_its_own(me: Holder) -> None:
    assert LocalSystem.current().own_proc and process_exists(os.getpid())
    assert not process_exists(dead_pid())


def test_another_host_is_judged_by_expiry(queue: Queue, me: Holder) -> None:
    remote = dataclasses.replace(
        me,
        host="elsewhere",
        machine_id="0" * 32,
        boot_id="5e1f0d0a-7c2b-4c1e-9a59-0b8e3c1d2f40",
        pid=dead_pid(),
    )
    job = claimed_by(queue, remote, ttl=300)
    assert recover(queue).requeued == []
    assert state_of(queue, job) == "claimed"


def test_the_same_host_after_a_reboot_counts_as_gone(queue: Queue, me: Holder) -> None:
    before_reboot = dataclasses.replace(me, boot_id="0b7d4b4e-2f3a-4d6c-8e1f-5a9c7b3d2e10")
    job = claimed_by(queue, before_reboot, ttl=300)
    report = recover(queue)
    assert [f.job for f in report.requeued] == [job] and "rebooted" in report.requeued[0].detail


def test_a_lease_of_an_unknown_boot_here_is_left_saying_the_boot_is_unknown(
    queue: Queue, me: Holder
) -> None:
    """Q-5: ``unknown`` proves no reboot, so a dead pid of such a lease of this host and pid
    namespace is no proof either; the reason says the boot is what is not known, never that
    the holder runs on another host or pid namespace, which the lease does not say."""
    job = claimed_by(queue, dataclasses.replace(me, boot_id="unknown", pid=dead_pid()))
    report = recover(queue)
    assert report.requeued == [] and state_of(queue, job) == "claimed"
    [left] = report.untouched
    assert "the lease's boot id is unknown" in left.detail, left.detail
    assert "outside this pid namespace or host" not in left.detail


@pytest.mark.parametrize(
    "spelt", [str.upper, lambda boot: boot + "\n", lambda boot: boot.replace("-", "")]
)
def test_this_boot_spelt_another_way_is_no_reboot(queue: Queue, me: Holder, spelt) -> None:
    """Q-3's boot id is the content of the holder's boot_id file: with that file's newline,
    in capitals or without dashes it names this boot, and its live holder keeps the job."""
    job = claimed_by(queue, dataclasses.replace(me, boot_id=spelt(me.boot_id)))
    assert recover(queue).requeued == []
    assert state_of(queue, job) == "claimed"


def test_a_lease_naming_no_boot_is_a_conflict_never_requeued(queue: Queue, me: Holder) -> None:
    job = claimed_by(queue, dataclasses.replace(me, boot_id=" ", pid=dead_pid()))
    report = recover(queue, reconcile=True)
    assert report.requeued == [] and [c.job for c in report.conflicts] == [job]
    assert "'boot_id'" in report.conflicts[0].detail
    assert state_of(queue, job) == "claimed"


@pytest.mark.parametrize(
    "misspelt",
    ["unknown.", "unkown", "\uff55nknown", "{boot}.", "{boot}x", "\uff10{boot}"],
)
def test_a_boot_id_that_is_no_uuid_nor_unknown_is_a_conflict_never_a_reboot(
    queue: Queue, me: Holder, misspelt: str
) -> None:
    """Q-5: a boot id that is not this boot nor another UUID, nor ``unknown``, names no boot:
    read as another boot it would requeue the job of a live holder, which would run twice."""
    job = claimed_by(queue, dataclasses.replace(me, boot_id=misspelt.format(boot=me.boot_id)))
    report = recover(queue, reconcile=True)
    assert report.requeued == [] and [c.job for c in report.conflicts] == [job]
    assert "'boot_id'" in report.conflicts[0].detail
    assert state_of(queue, job) == "claimed"


def test_a_boot_that_could_not_be_read_is_no_proof_of_a_reboot(queue: Queue, me: Holder) -> None:
    """A holder that could not read its boot id wrote ``unknown``: on its own host, with its
    pid gone, that is a pid alone, never proof (Q-5); its lease's expiry decides."""
    unread = dataclasses.replace(me, boot_id="unknown", pid_ns=me.pid_ns + 1, pid=dead_pid())
    job = claimed_by(queue, unread, ttl=300)
    assert recover(queue).requeued == []
    assert state_of(queue, job) == "claimed"


def test_dry_run_changes_nothing(queue: Queue, me: Holder, queue_dir: Path) -> None:
    job = claimed_by(queue, dataclasses.replace(me, pid=dead_pid()))
    report = recover(queue, dry_run=True)
    assert [(f.job, f.applied) for f in report.requeued] == [(job, False)]
    assert state_of(queue, job) == "claimed"


# ---------------------------------------------------------------- incomplete pairs


def crash_after_claim_before_lease(queue_dir: Path, job: str) -> None:
    os.mkdir(queue_dir / "claimed" / job)
    os.rename(queue_dir / "pending" / job, queue_dir / "claimed" / job / job)


def test_a_claim_without_lease_is_reported_then_requeued(
    queue: Queue, me: Holder, queue_dir: Path
) -> None:
    job = publish(queue, request(), name="nolease")
    crash_after_claim_before_lease(queue_dir, job)
    plain = recover(queue)
    assert not plain.consistent and [f.job for f in plain.incomplete] == [job]
    assert state_of(queue, job) == "incomplete"
    fixed = recover(queue, reconcile=True)
    assert fixed.consistent and [f.action for f in fixed.repaired] == ["requeue-unleased"]
    assert state_of(queue, job) == "pending"
    assert os.listdir(queue_dir / "claimed") == []
    assert recover(queue, reconcile=True).repaired == []


def test_a_claim_in_progress_is_left_alone(queue: Queue, queue_dir: Path) -> None:
    """A claimer holds claimed/J's lock until its lease is durable: reconcile must wait."""
    job = publish(queue, request(), name="inflight")
    crash_after_claim_before_lease(queue_dir, job)
    locker = subprocess.Popen(
        ["flock", str(queue_dir / "claimed" / job), "sleep", "30"], start_new_session=True
    )
    try:
        wait_for_lock(queue_dir / "claimed" / job, held=True)
        report = recover(queue, reconcile=True)
        assert [f.job for f in report.untouched] == [job]
        assert "another process" in report.untouched[0].detail
        assert state_of(queue, job) == "incomplete"
    finally:
        os.killpg(locker.pid, signal.SIGKILL)  # flock's child holds the lock too
        locker.wait()
    wait_for_lock(queue_dir / "claimed" / job, held=False)
    assert recover(queue, reconcile=True).consistent
    assert state_of(queue, job) == "pending"


def test_a_reader_looking_at_a_claim_holds_up_recover_only_for_its_look(
    queue: Queue, queue_dir: Path
) -> None:
    """Q-6: status, list and show look at an incomplete job again under claimed/J's shared
    lock; recover, meeting it, waits for the look to end rather than take the job for one a
    transition moves and call the queue consistent with the pair still incomplete."""
    job = publish(queue, request(), name="looked-at")
    crash_after_claim_before_lease(queue_dir, job)
    reader = subprocess.Popen(
        ["flock", "--shared", str(queue_dir / "claimed" / job), "sleep", "1"],
        start_new_session=True,
    )
    try:
        wait_for_lock(queue_dir / "claimed" / job, held=True)
        started = time.monotonic()
        report = recover(queue, reconcile=True)
        assert time.monotonic() - started >= 0.5  # it waited for the reader
        assert [f.job for f in report.repaired] == [job] and report.consistent, report
        assert state_of(queue, job) == "pending"
    finally:
        os.killpg(reader.pid, signal.SIGKILL)
        reader.wait()


@pytest.mark.parametrize("ok", [True, False])
def test_a_result_with_its_request_still_claimed_rolls_forward(
    queue: Queue, me: Holder, queue_dir: Path, ok: bool
) -> None:
    gone = dataclasses.replace(me, pid=dead_pid())
    job = claimed_by(queue, gone)
    state = "done" if ok else "failed"
    result = {"status": "ok" if ok else "error", "output": None}  # as a finish writes it
    (queue_dir / state / f"{job}.result").write_text(json.dumps(result))
    assert not recover(queue).consistent
    fixed = recover(queue, reconcile=True)
    assert [f.action for f in fixed.repaired] == ["roll-forward"]
    assert state_of(queue, job) == state
    assert os.listdir(queue_dir / "lease") == [] and os.listdir(queue_dir / "claimed") == []


def test_roll_forward_waits_for_a_live_finisher(queue: Queue, me: Holder, queue_dir: Path) -> None:
    job = claimed_by(queue, me)
    (queue_dir / "done" / f"{job}.result").write_text('{"status": "ok", "output": 1}')
    report = recover(queue, reconcile=True)
    assert report.repaired == [] and "alive" in report.incomplete[0].detail
    assert not report.consistent  # the pair is still incomplete: never "consistent"
    assert state_of(queue, job) == "incomplete"


def test_orphans_are_removed(queue: Queue, queue_dir: Path) -> None:
    os.mkdir(queue_dir / "claimed" / "empty.req.json")
    os.mkdir(queue_dir / "lease" / "lonely.req.json")
    pending_job = publish(queue, request(), name="p")
    os.mkdir(queue_dir / "claimed" / pending_job)
    report = recover(queue, reconcile=True)
    assert sorted(f.job for f in report.repaired) == sorted(
        ["empty.req.json", "lonely.req.json", pending_job]
    )
    assert os.listdir(queue_dir / "claimed") == [] and os.listdir(queue_dir / "lease") == []
    assert state_of(queue, pending_job) == "pending"


def test_an_orphan_lease_of_a_dead_holder_is_removed(
    queue: Queue, me: Holder, queue_dir: Path
) -> None:
    job = claimed_by(queue, dataclasses.replace(me, pid=dead_pid()))
    shutil.rmtree(queue_dir / "claimed" / job)
    assert recover(queue, reconcile=True).consistent
    assert os.listdir(queue_dir / "lease") == []


def test_an_interrupted_link_move_is_completed(queue: Queue, queue_dir: Path) -> None:
    job = publish(queue, request(), name="linked")
    os.mkdir(queue_dir / "claimed" / job)
    os.link(queue_dir / "pending" / job, queue_dir / "claimed" / job / job)
    assert state_of(queue, job) == "incomplete"
    fixed = recover(queue, reconcile=True)
    assert [f.action for f in fixed.repaired] == ["drop-claim-copy"]
    assert state_of(queue, job) == "pending" and os.listdir(queue_dir / "claimed") == []


def test_stale_temp_files_are_removed_after_the_grace_period(queue: Queue, queue_dir: Path) -> None:
    stale = queue_dir / "inbox" / "x.req.json.publish.abc.tmp"
    stale.write_text("{")
    assert recover(queue, reconcile=True).removed_temps == []  # younger than the default grace
    old = time.time() - 3600
    os.utime(stale, (old, old))
    plain = recover(queue)
    # Reported, but a stray temp is neither an incomplete pair nor a conflict.
    assert plain.consistent and plain.stale_temps == [f"inbox/{stale.name}"]
    assert recover(queue, reconcile=True, grace=10).removed_temps == [f"inbox/{stale.name}"]
    assert not stale.exists()


# ------------------------------------------------------------------------ conflicts


@pytest.mark.parametrize(
    "make",
    [
        "pending+done",
        "done+failed",
        "result-without-request",
        "done-without-result",
        "pending+claimed-different",
    ],
)
def test_conflicts_are_reported_with_evidence_and_never_resolved(
    queue: Queue, me: Holder, queue_dir: Path, make: str
) -> None:
    job = "k.req.json"
    body = json.dumps(request())
    paths = {
        "pending+done": ["pending/k.req.json", "done/k.req.json", "done/k.req.json.result"],
        "done+failed": ["done/k.req.json", "done/k.req.json.result", "failed/k.req.json.result"],
        "result-without-request": ["done/k.req.json.result"],
        "done-without-result": ["failed/k.req.json"],
        "pending+claimed-different": ["pending/k.req.json", "claimed/k.req.json/k.req.json"],
    }[make]
    for rel in paths:
        (queue_dir / rel).parent.mkdir(exist_ok=True)
        (queue_dir / rel).write_text(body)
    before = sorted(str(p) for p in queue_dir.rglob("*"))
    for reconcile in (False, True):
        report = recover(queue, reconcile=reconcile)
        assert not report.consistent and [f.job for f in report.conflicts] == [job]
        assert set(paths) <= set(report.conflicts[0].evidence)
    assert sorted(str(p) for p in queue_dir.rglob("*")) == before


@pytest.mark.parametrize("extra", ["claimed/j.req.json/notes", "lease/j.req.json/notes"])
def test_a_claim_status_calls_a_conflict_is_never_requeued(
    queue: Queue, me: Holder, queue_dir: Path, root: Path, extra: str
) -> None:
    """One more file in ``claimed/J/`` or ``lease/J/`` makes J a conflict for ``status``,
    ``show`` and ``recover`` alike, whether its holder is alive or not: recover neither moves
    its request nor removes its lease (Q-6, I-5)."""
    job = claimed_by(queue, dataclasses.replace(me, pid=dead_pid()))
    (queue_dir / extra).write_text("a note\n")
    before = sorted(str(p) for p in queue_dir.rglob("*"))

    for reconcile in (False, True):
        report = recover(queue, reconcile=reconcile)
        assert [f.job for f in report.conflicts] == [job] and report.requeued == []
        assert report.errors == [] and extra in report.conflicts[0].evidence

    assert sorted(str(p) for p in queue_dir.rglob("*")) == before
    status = ctx(root, "queue", "status", "--project", PROJECT, "--json")
    shown = ctx(root, "queue", "show", "--project", PROJECT, "--json", job)
    for answer in (status, shown):
        assert answer.returncode == 1, answer.stdout + answer.stderr
        assert '"conflict"' in answer.stdout and extra in answer.stdout


def test_a_requeue_stopped_part_way_says_where_the_job_stands(queue_dir: Path, me: Holder) -> None:
    """A transition that fails after its first move is reported with the state it left (the
    next reconcile completes it), never as a job left as it was."""

    class LeaseStaysOps(FsOps):
        def unlink(self, name: str, dir_fd: int) -> None:
            if name == "worker":
                raise OSError(errno.EIO, "Input/output error")
            super().unlink(name, dir_fd)

    with Queue.open(queue_dir) as plain:
        job = claimed_by(plain, dataclasses.replace(me, pid=dead_pid()))
    with Queue.open(queue_dir, LeaseStaysOps()) as failing:
        report = recover(failing)
    [failure] = report.errors
    assert failure.error == "EIO" and "left as it is" not in failure.detail
    assert "stopped part-way: it is now incomplete" in failure.detail, failure.detail
    assert f"pending/{job}" in failure.evidence
    with Queue.open(queue_dir) as plain:
        assert recover(plain, reconcile=True).consistent
        assert state_of(plain, job) == "pending"


def test_recover_after_finish_changes_nothing(queue: Queue, me: Holder, queue_dir: Path) -> None:
    job = claimed_by(queue, me)
    finish(queue, job, True)
    before = sorted(str(p) for p in queue_dir.rglob("*"))
    report = recover(queue, reconcile=True)
    assert report.consistent and not (report.requeued or report.repaired)
    assert sorted(str(p) for p in queue_dir.rglob("*")) == before


# ---------------------------------------------------- leases written by hand or by other tools


def q3_lease(pid: int, **fields: object) -> dict[str, object]:
    """A lease with only the fields Q-3 lists, as psutil and a human would name them."""
    here = LocalSystem.current()
    return {
        "worker": "by-hand",
        "host": here.host,
        "boot_id": here.boot_id,
        "pid_ns": here.pid_ns,
        "pid": pid,
        "create_time": 1_700_000_000.5,
        "claimed_at": "2026-01-01T00:00:00",  # no zone: UTC
        "expires_at": "2999-01-01T00:00:00",
        **fields,
    }


def hand_claimed(queue: Queue, queue_dir: Path, name: str, lease: object) -> str:
    """J claimed and leased by hand: claimed/J/J and lease/J/worker written directly."""
    job = publish(queue, request(), name=name)
    crash_after_claim_before_lease(queue_dir, job)
    os.mkdir(queue_dir / "lease" / job)
    body = lease if isinstance(lease, str) else json.dumps(lease)
    (queue_dir / "lease" / job / "worker").write_text(body)
    return job


def test_a_hand_written_lease_of_a_dead_holder_is_requeued(
    queue: Queue, queue_dir: Path, root: Path
) -> None:
    job = hand_claimed(queue, queue_dir, "byhand", q3_lease(dead_pid()))
    done = ctx(root, "queue", "recover", "--project", PROJECT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"requeue  {job}" in done.stdout and "has exited" in done.stdout
    assert state_of(queue, job) == "pending"


@pytest.mark.parametrize(
    "times",
    [
        {"claimed_at": 1_767_225_600, "expires_at": 32_503_680_000.0},  # epoch seconds
        {"claimed_at": "2026-01-01T00:00:00+01:00", "expires_at": "2999-01-01T00:00:00Z"},
        {"start_time": 1_700_000_000.5},  # the other name for the start time, beside it
        {"job": "tolerant.req.json"},
        {"pid_ns": f"pid:[{LocalSystem.current().pid_ns}]"},  # as readlink shows it
    ],
)
def test_lease_fields_are_read_in_every_form_q3_allows(
    queue: Queue, queue_dir: Path, times: dict[str, object]
) -> None:
    job = hand_claimed(queue, queue_dir, "tolerant", q3_lease(dead_pid(), **times))
    report = recover(queue)
    assert [f.job for f in report.requeued] == [job] and report.consistent


def test_a_start_time_under_the_older_name_still_tells_a_reused_pid(
    queue: Queue, queue_dir: Path
) -> None:
    """Leases written before the field took psutil's name call it ``start_time``."""
    started = psutil.Process(os.getpid()).create_time()
    older = []
    for name, start in (("same", started), ("reused", started - 1000)):
        lease = q3_lease(os.getpid(), start_time=start)
        del lease["create_time"]
        older.append(hand_claimed(queue, queue_dir, name, lease))

    report = recover(queue)

    assert [f.job for f in report.requeued] == [older[1]]
    assert state_of(queue, older[0]) == "claimed"


def test_a_live_pid_with_no_start_time_is_alive(queue: Queue, queue_dir: Path) -> None:
    lease = q3_lease(os.getpid())
    del lease["create_time"]
    job = hand_claimed(queue, queue_dir, "nostart", lease)
    report = recover(queue)
    assert report.requeued == [] and report.consistent
    assert "no start time" in report.untouched[0].detail
    assert state_of(queue, job) == "claimed"


def test_a_lease_naming_another_job_is_a_conflict(queue: Queue, queue_dir: Path) -> None:
    job = hand_claimed(queue, queue_dir, "mine", q3_lease(dead_pid(), job="theirs.req.json"))
    for reconcile in (False, True):
        report = recover(queue, reconcile=reconcile)
        assert not report.consistent and [f.job for f in report.conflicts] == [job]
        assert "theirs.req.json" in report.conflicts[0].detail
    assert state_of(queue, job) == "claimed"


@pytest.mark.parametrize("body", ["", "{}", "not json", '{"pid": "x"}'])
def test_an_unreadable_lease_on_a_claimed_job_is_never_called_consistent(
    queue: Queue, queue_dir: Path, root: Path, body: str
) -> None:
    job = hand_claimed(queue, queue_dir, "garbled", body)
    for args in ((), ("--reconcile",)):
        done = ctx(root, "queue", "recover", "--project", PROJECT, *args)
        assert done.returncode == 1 and "cannot be read" in done.stdout
        assert "NOT consistent" in done.stdout
    assert state_of(queue, job) == "claimed"  # never acted on: nobody knows its holder


@pytest.mark.parametrize("command", ["status", "list", "show"])
def test_status_list_and_show_call_an_unreadable_lease_a_conflict_as_recover_does(
    queue: Queue, queue_dir: Path, root: Path, command: str
) -> None:
    job = hand_claimed(queue, queue_dir, "garbled", "not json")
    arguments = {"status": (), "list": ("--state", "conflict"), "show": (job,)}[command]

    done = ctx(root, "queue", command, "--project", PROJECT, "--json", *arguments)

    assert done.returncode == 1, "a conflict was found (SPEC §2.4)"
    if command == "list":
        assert json.loads(done.stdout) == [{"name": job, "state": "conflict"}]
    else:
        assert "cannot be read" in done.stdout


def test_a_start_time_written_to_the_second_still_names_the_live_holder(
    queue: Queue, queue_dir: Path
) -> None:
    """psutil's create_time has a fraction; a human or an RFC 3339 time without one does not:
    the process started within that second, which proves no reuse of its pid."""
    import psutil

    started = psutil.Process(os.getpid()).create_time()
    for name, start in (("int", int(started)), ("text", time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(started))
    ))):  # fmt: skip
        job = hand_claimed(queue, queue_dir, name, q3_lease(os.getpid(), create_time=start))
        report = recover(queue)
        assert report.requeued == [], report.requeued[0].detail
        assert state_of(queue, job) == "claimed"
    other = hand_claimed(
        queue, queue_dir, "reused", q3_lease(os.getpid(), create_time=int(started) - 5)
    )
    assert [f.job for f in recover(queue).requeued] == [other], "seconds apart: another process"


@pytest.mark.parametrize("body", ["", "{}", "not json"])
def test_an_orphan_lease_is_removed_whatever_it_holds(
    queue_dir: Path, root: Path, body: str
) -> None:
    """Q-6: a lease/J with no request anywhere in claimed/ names no running job (Q-3 order)."""
    job = "orphan.req.json"
    os.mkdir(queue_dir / "lease" / job)
    (queue_dir / "lease" / job / "worker").write_text(body)
    plain = ctx(root, "queue", "recover", "--project", PROJECT)
    assert plain.returncode == 1 and f"incomplete {job}" in plain.stdout
    assert (queue_dir / "lease" / job / "worker").exists()
    fixed = ctx(root, "queue", "recover", "--project", PROJECT, "--reconcile")
    assert fixed.returncode == 0, fixed.stdout
    assert f"repair   {job}: remove-orphans" in fixed.stdout
    assert os.listdir(queue_dir / "lease") == []


def test_an_orphan_lease_of_a_live_holder_is_left_but_never_called_consistent(
    queue: Queue, me: Holder, queue_dir: Path
) -> None:
    job = claimed_by(queue, me)
    shutil.rmtree(queue_dir / "claimed" / job)
    report = recover(queue, reconcile=True)
    assert report.repaired == [] and [f.job for f in report.incomplete] == [job]
    assert "alive" in report.incomplete[0].detail and not report.consistent
    assert os.listdir(queue_dir / "lease") == [job]


def test_recover_beside_live_workers_reports_no_conflict_that_never_existed(
    queue: Queue, queue_dir: Path, tmp_path: Path
) -> None:
    """Jobs claimed and finished while recover scans can look both pending and done, or lose
    their lease between the scan and the look at it: recover looks again instead of calling
    them conflicts, and never touches a job of a live worker."""
    jobs = [publish(queue, request(n), name=f"j{n}") for n in range(120)]
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.queue.claim_loop", str(queue_dir), str(log)],
            cwd=Path(__file__).resolve().parents[2],
        )
        for log in (tmp_path / "w0", tmp_path / "w1")
    ]
    reports = []
    deadline = time.monotonic() + 120
    try:
        while any(worker.poll() is None for worker in workers):
            assert time.monotonic() < deadline, "the workers did not drain the queue"
            reports.append(recover(queue, reconcile=True))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
            worker.wait(60)
    assert [worker.returncode for worker in workers] == [0, 0]
    assert [f.detail for report in reports for f in report.conflicts + report.errors] == []
    # (An empty claimed/J a claim has just made may be removed: the claimer then loses, Q-2.)
    assert [f.detail for report in reports for f in report.requeued] == []
    claims = (tmp_path / "w0").read_text().split() + (tmp_path / "w1").read_text().split()
    assert sorted(claims) == sorted(jobs)  # each job ran once: none was requeued
    assert recover(queue, reconcile=True).consistent


def test_leftovers_another_recover_removes_after_the_scan_are_no_conflict_and_not_listed(
    queue: Queue, queue_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two --reconcile runs at once: what one removes between the other's scan and its repair
    (an empty claimed/J, an orphan lease/J, a stray temp file) is left alone by the other, not
    a "no evidence" conflict, and only the run that removed a temp file lists it (Q-6, I-5)."""
    from cortexfs.queue import recovery

    (queue_dir / "claimed" / "empty.req.json").mkdir()
    (queue_dir / "lease" / "orphan.req.json").mkdir()
    temp = queue_dir / "inbox" / ".stray.publish.tmp"
    temp.write_text("{}")
    os.utime(temp, (time.time() - 3600, time.time() - 3600))
    scan = recovery.ev.scan

    def scanned_then_removed_by_another(q: Queue):
        found = scan(q)
        (queue_dir / "claimed" / "empty.req.json").rmdir()
        (queue_dir / "lease" / "orphan.req.json").rmdir()
        temp.unlink()
        return found

    monkeypatch.setattr(recovery.ev, "scan", scanned_then_removed_by_another)
    report = recover(queue, reconcile=True)

    assert report.consistent and report.conflicts == [] and report.errors == []
    assert sorted(f.job for f in report.untouched) == ["empty.req.json", "orphan.req.json"]
    assert all("another process removed it" in f.detail for f in report.untouched)
    assert report.removed_temps == [] and report.repaired == []


@pytest.mark.parametrize(
    ("state", "planted"),
    [
        ("done", "garbage"),
        ("done", '{"status": "error", "output": null}'),
        ("failed", '["status", "error"]'),
        ("failed", '{"status": "ok", "output": null}'),
    ],
)
def test_a_result_no_finish_would_write_beside_a_claim_is_a_conflict_not_a_roll_forward(
    queue: Queue, me: Holder, queue_dir: Path, state: str, planted: str
) -> None:
    """Q-6, §2.1: a roll-forward takes the result as proof that J ran; a file that is not a
    result object with its directory's status (what a group member, or the job itself, may
    put there) proves nothing, and J stays claimed for a person to look at."""
    gone = dataclasses.replace(me, pid=dead_pid())
    job = claimed_by(queue, gone)
    (queue_dir / state / f"{job}.result").write_text(planted)
    report = recover(queue, reconcile=True)
    assert report.repaired == []
    assert [f.state for f in report.conflicts] == ["conflict"], report
    assert "proves nothing" in report.conflicts[0].detail
    assert os.listdir(queue_dir / "claimed") == [job]
