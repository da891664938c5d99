"""A lease naming a pid no process can have (Q-3, Q-5, Q-6, I-5): an unreadable lease, a
conflict left to a human, while recover goes on with every other job and converges."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cortexfs.errors import CtxError
from cortexfs.queue import Holder, Queue, claim, publish
from cortexfs.queue.evidence import assess, evidence_of
from cortexfs.queue.holder import PID_MAX_LIMIT, Lease
from tests.queue.helpers import PROJECT, dead_pid, request
from tests.support.cli import ctx

IMPOSSIBLE_PIDS = [-1, 0, True, PID_MAX_LIMIT + 1, 2**31, 2**63, 1.5, "42"]


def claimed(queue: Queue, holder: Holder, name: str) -> str:
    job = publish(queue, request(), name=name)
    won = claim(queue, holder, ttl=600)
    assert won is not None and won.job == job
    return job


def with_pid(queue_dir: Path, job: str, pid: object) -> None:
    """The lease of ``job`` rewritten as a member of the space's group may: only its pid."""
    lease = queue_dir / "lease" / job / "worker"
    fields = json.loads(lease.read_text())
    fields["pid"] = pid
    lease.write_text(json.dumps(fields))


@pytest.mark.parametrize("pid", IMPOSSIBLE_PIDS)
def test_a_lease_whose_pid_no_process_can_have_cannot_be_read(me: Holder, pid: object) -> None:
    fields = Lease.new("j.req.json", me, 600).to_json()
    fields["pid"] = pid
    with pytest.raises(CtxError) as refused:
        Lease.decode(json.dumps(fields).encode(), "j.req.json")
    assert "EINVAL" in str(refused.value) and "'pid'" in refused.value.message


@pytest.mark.parametrize("pid", [1, PID_MAX_LIMIT])
def test_the_first_and_the_last_pid_linux_can_give_are_read(me: Holder, pid: int) -> None:
    fields = Lease.new("j.req.json", me, 600).to_json()
    fields["pid"] = pid
    assert Lease.decode(json.dumps(fields).encode(), "j.req.json").holder.pid == pid


@pytest.mark.parametrize("pid", [-1, 0, PID_MAX_LIMIT + 1, 2**63])
def test_recover_reports_the_lease_as_a_conflict_and_recovers_every_other_job(
    queue: Queue, queue_dir: Path, root: Path, me: Holder, pid: int
) -> None:
    gone = dataclasses.replace(me, pid=dead_pid(), start_time=None)
    before = [claimed(queue, gone, f"a{n}") for n in range(3)]
    forged = claimed(queue, gone, "m-forged")
    after = [claimed(queue, gone, f"z{n}") for n in range(3)]
    alive = claimed(queue, me, "z-alive")
    with_pid(queue_dir, forged, pid)

    dry = ctx(root, "queue", "recover", "--project", PROJECT, "--dry-run", "--json")
    assert dry.returncode == 1 and "Traceback" not in dry.stderr, dry.stderr
    assert [c["job"] for c in json.loads(dry.stdout)["conflicts"]] == [forged]

    first = ctx(root, "queue", "recover", "--project", PROJECT)

    assert first.returncode == 1 and "Traceback" not in first.stderr, first.stderr
    assert "cannot be read" in first.stdout and "'pid'" in first.stdout
    assert "NOT consistent" in first.stdout
    for job in (*before, *after):
        assert f"requeue  {job}" in first.stdout
        assert assess(evidence_of(queue, job)).state == "pending"
    for job in (forged, alive):  # never acted on: nobody knows the first one's holder
        assert assess(evidence_of(queue, job)).state == "claimed"

    # I-5: a second run, and a reconcile, find nothing more to do and report the same.
    for args in ((), ("--reconcile",)):
        again = ctx(root, "queue", "recover", "--project", PROJECT, "--json", *args)
        assert again.returncode == 1 and "Traceback" not in again.stderr, again.stderr
        report = json.loads(again.stdout)
        assert report["requeued"] == []
        assert [c["job"] for c in report["conflicts"]] == [forged]
    assert (queue_dir / "lease" / forged / "worker").exists()  # left for a human to repair


def test_renew_and_finish_name_the_forged_lease_and_say_to_repair_it_not_remove_it(
    queue: Queue, queue_dir: Path, root: Path, me: Holder
) -> None:
    """Removing the lease, as finish once advised, makes J a claim that never ran: finish
    then refuses it as such and recover --reconcile requeues it, when it may well have run.
    Repaired, the lease lets J be finished once."""
    job = claimed(queue, me, "forged")
    with_pid(queue_dir, job, 0)
    lease = f"lease/{job}/worker"
    not_a_lease = f"ctx: EINVAL: job {job}'s {lease} is not a lease (lease has no valid field 'pid'"

    renewed = ctx(root, "queue", "renew", "--project", PROJECT, job, "--pid", str(me.pid))
    finished = ctx(root, "queue", "finish", "--project", PROJECT, job, "--ok", "-", stdin="{}")

    for verb, refused in (("renew", renewed), ("finish", finished)):
        assert refused.returncode == 1, refused
        assert refused.stderr.startswith(not_a_lease), refused.stderr
        assert f"a conflict that {verb} never resolves; nothing was changed." in refused.stderr
        assert "Repair it by hand, and do not remove it" in refused.stderr
        recover = f"'ctx queue recover --reconcile --project {PROJECT}'"
        assert f"then {verb} again; until then {recover} reports" in refused.stderr
    assert (queue_dir / lease).is_file() and (queue_dir / "claimed" / job / job).is_file()

    # As told: the lease names its holder again; J is then finished, and nothing requeues it.
    with_pid(queue_dir, job, me.pid)
    again = ctx(root, "queue", "finish", "--project", PROJECT, job, "--ok", "-", stdin="{}")
    assert again.returncode == 0, again
    assert assess(evidence_of(queue, job)).state == "done"
    settled = ctx(root, "queue", "recover", "--project", PROJECT, "--reconcile", "--json")
    assert settled.returncode == 0 and json.loads(settled.stdout)["requeued"] == [], settled


def test_renew_and_finish_of_a_claim_without_a_lease_say_it_never_ran(
    queue: Queue, queue_dir: Path, root: Path, me: Holder
) -> None:
    """Claimed, with no lease file or no lease directory: the claim never completed (Q-3);
    never 'not claimed', and never plain recover, which leaves such a pair alone."""
    job = claimed(queue, me, "unleased")
    lease_dir = queue_dir / "lease" / job
    said = (
        f"ctx: ENOENT: job {job} has no lease/{job}/worker: its claim never completed, so it "
        f"never ran; 'ctx queue recover --reconcile --project {PROJECT}' returns it to pending\n"
    )
    (lease_dir / "worker").unlink()
    for remove_the_directory_too in (False, True):
        if remove_the_directory_too:
            lease_dir.rmdir()
        renewed = ctx(root, "queue", "renew", "--project", PROJECT, job, "--pid", str(me.pid))
        finished = ctx(root, "queue", "finish", "--project", PROJECT, job, "--ok", "-", stdin="{}")
        for refused in (renewed, finished):
            assert (refused.returncode, refused.stderr) == (1, said), refused
    assert (queue_dir / "claimed" / job / job).is_file()
