"""Which queue a worker works: its session says it of every job, and a queue removed under
it (its project deleted, perhaps made again) stops it instead of leaving it waiting on a
directory nobody publishes to any more."""

from __future__ import annotations

import os
import shutil

from cortexfs import durable
from cortexfs.queue import init_queue
from tests.workers.conftest import AGENT, PROJECT, Farm
from tests.workers.test_worker import events_of


def test_each_queue_event_names_the_queue_from_the_storage_root(farm: Farm) -> None:
    job = farm.publish("shell.exec", {"cmd": "echo hi"})
    drained = farm.worker("--drain")
    _, err = drained.communicate(timeout=120)
    assert drained.returncode == 0, err

    queue_events = [e for e in events_of(farm) if str(e["type"]).startswith("queue.")]
    assert [e["type"] for e in queue_events] == ["queue.claim", "queue.start", "queue.finish"]
    assert {(e["object"], e["queue"]) for e in queue_events} == {
        (f"queue/{job}", f"shared/{PROJECT}/queue")
    }


def test_a_queue_named_through_a_link_to_the_root_is_named_from_the_root(farm: Farm) -> None:
    """A link to the storage root (``storage/current``) in the queue's path names the same
    queue: its events say ``shared/P/queue``, not the path as given."""
    current = farm.scratch / "current"
    current.symlink_to(farm.root)
    job = farm.publish("shell.exec", {"cmd": "echo hi"})
    drained = farm.worker("--project", f"{current}/shared/{PROJECT}/queue", "--drain")
    _, err = drained.communicate(timeout=120)
    assert drained.returncode == 0, err

    queue_events = [e for e in events_of(farm) if str(e["type"]).startswith("queue.")]
    assert {(e["object"], e["queue"]) for e in queue_events} == {
        (f"queue/{job}", f"shared/{PROJECT}/queue")
    }


def test_a_waiting_worker_whose_queue_is_made_again_stops_naming_it(farm: Farm) -> None:
    waiting = farm.worker()
    assert waiting.stdout is not None
    assert '"event": "start"' in waiting.stdout.readline()  # it has opened the queue
    # Made again in one step (a new queue exchanged in, the old one removed after), so that
    # the worker never looks while nothing is there, which it would call ENOENT.
    again = farm.queue.with_name("queue-again")
    init_queue(again)
    parent = os.open(farm.queue.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        durable.default_ops().rename_exchange(again.name, parent, farm.queue.name, parent)
    finally:
        os.close(parent)
    shutil.rmtree(again)
    job = farm.publish("shell.exec", {"cmd": "echo hi"})
    try:
        _, err = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
    assert waiting.returncode == 1, err
    assert f"the queue {farm.queue} now names another directory" in err, err
    assert (farm.queue / "pending" / job).exists()  # left for a worker of the new queue


def test_a_waiting_worker_whose_pending_directory_is_replaced_stops_naming_it(
    farm: Farm,
) -> None:
    """pending/ moved aside and made again by hand: the worker's watch and descriptor are the
    old directory's, so jobs published into the new one would wait for ever; it stops instead,
    naming it, and the job is left for a worker started anew."""
    waiting = farm.worker()
    assert waiting.stdout is not None
    assert '"event": "start"' in waiting.stdout.readline()
    pending = farm.queue / "pending"
    aside = farm.queue.parent / "pending.old"
    made = farm.queue.parent / "pending.new"
    made.mkdir()
    os.chmod(made, os.stat(pending).st_mode & 0o7777)
    os.rename(pending, aside)
    os.rename(made, pending)
    job = farm.publish("shell.exec", {"cmd": "echo hi"})
    try:
        _, err = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
    assert waiting.returncode == 1, err
    assert f"{pending} now names another directory than the one this worker opened" in err, err
    assert (pending / job).exists()


def test_a_worker_refused_before_its_first_claim_makes_no_session(farm: Farm) -> None:
    """A queue no worker can work (a lease_ttl too short for one to keep renewed) is refused
    before the worker's session is made: nothing of the agent's home is left behind."""
    config = farm.queue / "config"
    config.write_text(config.read_text() + "lease_ttl=0.5\n")
    session = farm.root / "home" / str(farm.user.uid) / "agent" / AGENT / "session" / "worker"

    refused = farm.worker("--drain")
    out, err = refused.communicate(timeout=60)

    assert refused.returncode == 1, err
    assert "it is the lease_ttl of" in err or "it is the lease_ttl of" in out, (out, err)
    assert not session.exists()
