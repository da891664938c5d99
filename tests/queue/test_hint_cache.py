"""The claim-order cache: private to its user, and rid of the hints of queues that are gone."""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

import pytest

from cortexfs.queue import Holder, Queue, claim, init_queue, publish
from cortexfs.queue.claim_order import (
    HintedClaimOrder,
    HintFile,
    hint_path,
    pending_in_claim_order,
    pending_stamp,
)
from cortexfs.queue.hint_cache import PRUNE_INTERVAL, PRUNED_MARKER, UNUSED_SECONDS
from cortexfs.queue.inspect import list_jobs
from tests.queue.helpers import PROJECT, request
from tests.support.cli import ctx


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_hints_and_their_directories_are_readable_by_their_owner_only(
    cache: Path, tmp_path: Path, umask: int
) -> None:
    """A hint lists pending job names: a user who may not enter the queue's space must not
    read them from the cache, whatever the umask of whoever wrote it."""
    root = tmp_path / "storage"
    root.mkdir()
    env = {"XDG_CACHE_HOME": str(cache)}

    made = ctx(root, "queue", "init", "--project", PROJECT, env=env, umask=umask)
    assert made.returncode == 0, made.stderr
    hint = hint_path(root / "shared" / PROJECT / "queue")
    hint.unlink()  # a claim writes it anew after its listing
    (root / "shared" / PROJECT / "queue" / "pending" / "j.req.json").write_text('{"tool":"t"}')
    claimed = ctx(root, "queue", "claim", "--project", PROJECT, env=env, umask=umask)

    assert claimed.returncode == 0, claimed.stderr
    assert mode(hint) == 0o600
    assert mode(cache / "cortexfs") == mode(cache / "cortexfs" / "claim-order") == 0o700


def test_a_hint_an_older_version_left_readable_is_made_private_when_used(
    cache: Path, queue_dir: Path, me: Holder
) -> None:
    with Queue.open(queue_dir) as q:
        publish(q, request(), name="a")
        publish(q, request(), name="b")
        q.claim_order = HintedClaimOrder(q.path)
        claim(q, me)
    hint = hint_path(queue_dir)
    os.chmod(hint, 0o644)
    with Queue.open(queue_dir) as q:
        q.claim_order = HintedClaimOrder(q.path)
        won = claim(q, me)
        assert won is not None and won.job == "b.req.json" and q.claim_order.scans == 0
    assert mode(hint) == 0o600


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def test_hints_of_queues_that_are_gone_are_pruned_now_and_then(cache: Path, tmp_path: Path) -> None:
    """Each hint records its queue's real path: once that queue is gone its hint is removed,
    as are hints unused for a month and files that are no hints once an hour old.  The cache
    is looked at no more than once an hour, by whoever writes a hint anew."""
    queues = {name: tmp_path / name / "queue" for name in ("gone", "kept", "unused", "fresh")}
    for queue in queues.values():
        init_queue(queue)
    hints = {name: hint_path(queue) for name, queue in queues.items()}
    directory = hints["gone"].parent
    shutil.rmtree(queues["gone"].parent)
    age(hints["unused"], UNUSED_SECONDS + 60)
    old_format, just_written = directory / ("0" * 32), directory / ".partial.1.2"
    old_format.write_bytes(b"00000000000000000021 - older format\nx.req.json\n")
    age(old_format, PRUNE_INTERVAL + 60)
    just_written.write_bytes(b"")

    init_queue(tmp_path / "new" / "queue")  # pruned less than an hour ago: nothing happens
    assert all(hint.exists() for hint in hints.values()) and old_format.exists()

    age(directory / PRUNED_MARKER, PRUNE_INTERVAL + 1)
    init_queue(tmp_path / "newer" / "queue")

    assert not hints["gone"].exists() and not hints["unused"].exists()
    assert not old_format.exists()
    assert hints["kept"].exists() and hints["fresh"].exists() and just_written.exists()
    assert hint_path(tmp_path / "newer" / "queue").exists()


def test_a_claim_served_by_its_hint_never_looks_at_the_cache(
    cache: Path, tmp_path: Path, me: Holder
) -> None:
    """Pruning costs a listing of the cache: only a claim that lists pending/ (or init) may
    pay it, never one that reads its next name from the hint (Q-10)."""
    gone, live = tmp_path / "gone" / "queue", tmp_path / "live" / "queue"
    init_queue(gone)
    init_queue(live)
    with Queue.open(live) as q:
        publish(q, request(1), name="one")
        publish(q, request(2), name="two")
    shutil.rmtree(gone.parent)
    marker = hint_path(live).parent / PRUNED_MARKER
    age(marker, PRUNE_INTERVAL + 1)

    with Queue.open(live) as q:
        q.claim_order = HintedClaimOrder(q.path)
        assert claim(q, me).job == "one.req.json"  # type: ignore[union-attr]
        assert q.claim_order.scans == 0
    assert hint_path(gone).exists()

    hint_path(live).unlink()  # the next claim lists pending/, and may prune
    with Queue.open(live) as q:
        q.claim_order = HintedClaimOrder(q.path)
        assert claim(q, me).job == "two.req.json"  # type: ignore[union-attr]
        assert q.claim_order.scans == 1
    assert not hint_path(gone).exists()


def test_list_follows_the_hint_and_names_every_pending_job_once(
    cache: Path, queue_dir: Path
) -> None:
    """``list --state pending`` takes the order of the caller's hint when it accounts for
    pending/ as it stands, but the hint is only a hint: a name in it twice is listed once,
    and a pending job missing from it (one a killed claim took off) is listed after it."""
    with Queue.open(queue_dir) as q:
        names = [publish(q, request(), name=n) for n in ("a", "b", "c")]
        hint = HintFile.of(q.path)
        hint.reset([names[2], names[0], names[2]], pending_stamp(q.pending))
        assert pending_in_claim_order(q) == [names[2], names[0], names[1]]
        listed = [job["name"] for job in list_jobs(q, "pending")]
    assert listed == [names[2], names[0], names[1]]


def test_a_claim_never_makes_the_directory_its_cache_directory_would_be_in(
    tmp_path: Path,
) -> None:
    """A missing home (``HOME``, or what holds ``XDG_CACHE_HOME``) is not a cache's to make:
    the claim works without its hint, and nothing is created there."""
    root = tmp_path / "storage"
    root.mkdir()
    home = tmp_path / "gone-home"
    env = {"XDG_CACHE_HOME": str(home / ".cache"), "HOME": str(home)}
    assert ctx(root, "queue", "init", "--project", PROJECT, env=env).returncode == 0
    (root / "shared" / PROJECT / "queue" / "pending" / "j.req.json").write_text('{"tool":"t"}')

    claimed = ctx(root, "queue", "claim", "--project", PROJECT, env=env)

    assert claimed.returncode == 0, claimed.stderr
    assert claimed.stdout.split()[0] == "j.req.json", claimed.stdout
    assert not home.exists()


def test_a_garbled_file_nested_deep_is_pruned_as_no_hint(cache: Path, tmp_path: Path) -> None:
    """A crash or another program may leave anything in the cache: a queue line nested
    thousands of arrays deep is no hint (json.loads would raise RecursionError, which no
    pruning expects), removed once an hour old, and the queue's own hint is written anyway."""
    init_queue(tmp_path / "first" / "queue")
    directory = hint_path(tmp_path / "first" / "queue").parent
    line = b"[" * 5000 + b"\n"
    start = 128 + len(line)
    header = f"{start:020d} {0:020d} {0:020d} {start:020d} -".ljust(127).encode() + b"\n"
    garbled = directory / ("0123456789abcdef" * 2)
    garbled.write_bytes(header + line)
    age(garbled, PRUNE_INTERVAL + 60)
    age(directory / PRUNED_MARKER, PRUNE_INTERVAL + 1)

    init_queue(tmp_path / "second" / "queue")

    assert not garbled.exists()
    assert hint_path(tmp_path / "second" / "queue").exists()
