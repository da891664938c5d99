"""A claim that finds nothing while jobs are pending says why (§2.4, Q-2, Q-6).

`ctx queue claim` exits 3 with nothing on stdout when no job can be claimed.  When the queue
is not empty — jobs held up by a crash's leftovers or by a conflict — a note on stderr names
them and what settles them, so that an exit 3 over a non-empty `status` is not a mystery.
"""

from __future__ import annotations

import json
from pathlib import Path

from cortexfs import durable
from cortexfs.queue import Holder, Queue, protocol
from tests.queue.helpers import PROJECT, request, write_json
from tests.support.cli import ctx

P = ("--project", PROJECT)


def _queue(root: Path) -> Path:
    assert ctx(root, "queue", "init", *P).returncode == 0
    return root / "shared" / PROJECT / "queue"


def _publish(root: Path, tmp_path: Path, name: str) -> None:
    req = write_json(tmp_path / f"{name}.json", request(1))
    assert ctx(root, "queue", "publish", *P, "--name", name, str(req)).returncode == 0


def test_an_empty_queue_exits_3_without_a_note(root: Path) -> None:
    _queue(root)
    done = ctx(root, "queue", "claim", *P)
    assert (done.returncode, done.stdout, done.stderr) == (3, "", "")


def test_a_job_held_by_an_empty_claim_directory_is_named_with_its_remedy(
    root: Path, tmp_path: Path
) -> None:
    qdir = _queue(root)
    _publish(root, tmp_path, "held")
    (qdir / "claimed" / "held.req.json").mkdir()  # a claim cut short after its mkdir
    done = ctx(root, "queue", "claim", *P)
    assert (done.returncode, done.stdout) == (3, "")
    assert "left pending, with claimed/J there already: held.req.json" in done.stderr
    assert "ctx queue recover --reconcile" in done.stderr
    assert (qdir / "pending" / "held.req.json").is_file()  # nothing was changed
    assert ctx(root, "queue", "recover", *P, "--reconcile").returncode == 0
    claimed = ctx(root, "queue", "claim", *P)
    assert (claimed.returncode, claimed.stdout) == (0, "held.req.json\n")


def test_a_job_held_by_an_orphan_lease_is_named(root: Path, tmp_path: Path) -> None:
    qdir = _queue(root)
    _publish(root, tmp_path, "leased")
    (qdir / "lease" / "leased.req.json").mkdir()  # a requeue cut short before its cleanup
    done = ctx(root, "queue", "claim", *P)
    assert (done.returncode, done.stdout) == (3, "")
    assert "left pending, with a lease/J and no claim: leased.req.json" in done.stderr
    assert not (qdir / "claimed" / "leased.req.json").exists()  # the claim was undone


def test_a_job_both_pending_and_finished_is_named_as_a_conflict(root: Path, tmp_path: Path) -> None:
    qdir = _queue(root)
    _publish(root, tmp_path, "twice")
    write_json(qdir / "done" / "twice.req.json", request(1))
    done = ctx(root, "queue", "claim", *P, "--json")
    assert (done.returncode, done.stdout) == (3, "")
    assert "done/ or failed/ too, a conflict: twice.req.json" in done.stderr
    assert "'ctx queue show twice.req.json --project" in done.stderr


def test_several_conflicts_are_given_the_command_for_each(root: Path, tmp_path: Path) -> None:
    qdir = _queue(root)
    for name in ("one", "two"):
        _publish(root, tmp_path, name)
        write_json(qdir / "failed" / f"{name}.req.json", request(1))
    done = ctx(root, "queue", "claim", *P)
    assert (done.returncode, done.stdout) == (3, "")
    assert "a conflict: one.req.json, two.req.json; 'ctx queue show J --project" in done.stderr
    assert "' of each lists its evidence" in done.stderr


def test_a_long_list_of_held_jobs_is_cut_with_a_count(root: Path, tmp_path: Path) -> None:
    qdir = _queue(root)
    lines = "".join(json.dumps(request(n)) + "\n" for n in range(8))
    published = ctx(root, "queue", "publish", *P, "--batch", "-", stdin=lines)
    assert published.returncode == 0, published.stderr
    for job in published.stdout.split():
        (qdir / "claimed" / job).mkdir()
    done = ctx(root, "queue", "claim", *P)
    assert done.returncode == 3
    notes = [line for line in done.stderr.splitlines() if "left pending" in line]
    assert len(notes) == 1 and notes[0].count(".req.json") == 5
    assert "and 3 more" in notes[0]


class _WinnerMovesOn(durable.FsOps):
    """The claimer that won J (its mkdir came first) moves J out of pending/ the moment ours
    is refused: by the end of our claim, J is no longer pending."""

    def __init__(self, pending: Path, elsewhere: Path) -> None:
        super().__init__()
        self.pending, self.elsewhere = pending, elsewhere

    def mkdir(self, name: str, dir_fd: int, mode: int = 0o777) -> None:
        try:
            super().mkdir(name, dir_fd, mode)
        except FileExistsError:
            (self.pending / name).rename(self.elsewhere / name)
            raise


def test_a_race_settled_by_the_end_of_the_claim_is_no_reason_given(
    root: Path, tmp_path: Path, me: Holder
) -> None:
    qdir = _queue(root)
    _publish(root, tmp_path, "raced")
    (qdir / "claimed" / "raced.req.json").mkdir()
    left: dict[str, str] = {}
    with Queue.open(qdir, ops=_WinnerMovesOn(qdir / "pending", tmp_path)) as q:
        assert protocol.claim(q, me, left_pending=left) is None
    assert left == {}
    (qdir / "claimed" / "raced.req.json").rmdir()
    (tmp_path / "raced.req.json").rename(qdir / "pending" / "raced.req.json")
    with Queue.open(qdir) as q:
        (qdir / "claimed" / "raced.req.json").mkdir()
        assert protocol.claim(q, me, left_pending=left) is None
    assert left == {"raced.req.json": protocol.CLAIM_LEFT}  # the same, unsettled, is kept


class _RecoverTakesTheFreshClaim(durable.FsOps):
    """A ``recover --reconcile`` running meanwhile removes our empty ``claimed/J`` right
    after its ``mkdir``, as the orphan a crash leaves looks, the first ``times`` claims."""

    def __init__(self, claimed: Path, times: int) -> None:
        super().__init__()
        self.claimed, self.times = claimed, times

    def mkdir(self, name: str, dir_fd: int, mode: int = 0o777) -> None:
        super().mkdir(name, dir_fd, mode)
        if self.times > 0 and Path(f"/proc/self/fd/{dir_fd}").resolve() == self.claimed:
            self.times -= 1
            (self.claimed / name).rmdir()


def test_a_claim_recover_took_back_is_claimed_again_as_nobody_won_it(
    root: Path, tmp_path: Path, me: Holder
) -> None:
    qdir = _queue(root)
    _publish(root, tmp_path, "taken")
    left: dict[str, str] = {}
    with Queue.open(qdir, ops=_RecoverTakesTheFreshClaim(qdir / "claimed", times=1)) as q:
        won = protocol.claim(q, me, left_pending=left)
    assert won is not None and won.job == "taken.req.json", left
    assert (qdir / "claimed" / "taken.req.json" / "taken.req.json").is_file()


def test_a_claim_recover_keeps_taking_back_is_passed_over_saying_so(
    root: Path, tmp_path: Path, me: Holder
) -> None:
    qdir = _queue(root)
    _publish(root, tmp_path, "taken")
    left: dict[str, str] = {}
    with Queue.open(qdir, ops=_RecoverTakesTheFreshClaim(qdir / "claimed", times=100)) as q:
        assert protocol.claim(q, me, left_pending=left) is None
    assert left == {"taken.req.json": protocol.RECOVERED}
    assert (qdir / "pending" / "taken.req.json").is_file()
    assert list((qdir / "claimed").iterdir()) == []
