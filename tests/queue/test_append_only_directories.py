"""Steps refused by an append-only directory before they write anything (Q-1, Q-3, Q-4).

``access(2)`` refuses a write to an immutable directory but not to an append-only one, which
lets an entry in and never out: a publish, claim, renew or finish staging its file in such an
``inbox/`` could make the file and neither move it on nor remove it again, and a finish whose
``claimed/`` or ``lease/`` is append-only would move its result in and then stop with an
incomplete pair.  Each is refused first, with EPERM naming the directory, the attribute and
the ``chattr`` that lifts it, and what the step did (nothing).  Needs root (chattr).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cortexfs import storage
from cortexfs.errors import CtxError
from cortexfs.queue import (
    Holder,
    Queue,
    claim,
    claim_job,
    finish,
    publish,
    publish_batch,
    queue_path,
    renew,
)
from cortexfs.shared.spaces import create_shared_space
from tests.queue.helpers import PROJECT, request
from tests.support.storage import attribute

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chattr)")


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[Queue]:
    root = tmp_path / "storage"
    storage.ensure_root_abi(root)
    create_shared_space(root, PROJECT)
    with Queue.open(queue_path(root, PROJECT)) as opened:
        yield opened


def tree(queue: Queue) -> list[str]:
    return sorted(str(p.relative_to(queue.path)) for p in queue.path.rglob("*"))


def refused_by_append_only(step: Callable[[], object], directory: Path, done: str) -> None:
    with pytest.raises(CtxError) as refused:
        step()
    assert refused.value.errno == errno.EPERM
    message = refused.value.message
    assert f"{directory} is append-only" in message and f"'chattr -a {directory}'" in message
    assert message.split("; ")[-1].startswith(done), message


def test_nothing_is_staged_in_an_append_only_inbox(queue: Queue) -> None:
    holder = Holder.for_process(worker="w")
    waiting = publish(queue, request(0), name="waiting")
    held = publish(queue, request(1), name="held")
    assert claim_job(queue, held, holder) is not None
    before = tree(queue)
    inbox = queue.path / "inbox"

    with attribute(inbox, "a"):
        refused_by_append_only(
            lambda: publish(queue, request(2), name="fresh"), inbox, "nothing was published"
        )
        refused_by_append_only(
            lambda: publish_batch(queue, [request(3), request(4)]), inbox, "nothing was published"
        )
        refused_by_append_only(
            lambda: claim(queue, holder),
            inbox,
            f"nothing was claimed (job {waiting} stays pending)",
        )
        refused_by_append_only(
            lambda: renew(queue, held, [holder]), inbox, f"the lease on {held} is unchanged"
        )
        refused_by_append_only(
            lambda: finish(queue, held, True, "out"), inbox, f"job {held} stays claimed"
        )
        assert tree(queue) == before

    assert claim(queue, holder) is not None  # the attribute gone, every step works again
    assert finish(queue, held, True, "out")["status"] == "ok"


@pytest.mark.parametrize("place", ["claimed", "lease", "claimed/{job}", "lease/{job}"])
def test_a_finish_refused_by_an_append_only_directory_has_moved_nothing(
    queue: Queue, place: str
) -> None:
    holder = Holder.for_process(worker="w")
    job = publish(queue, request(0), name="job")
    assert claim(queue, holder) is not None
    before = tree(queue)
    directory = queue.path / place.format(job=job)

    with attribute(directory, "a"):
        refused_by_append_only(
            lambda: finish(queue, job, True, "out"), directory, f"job {job} stays claimed"
        )
        assert tree(queue) == before

    assert finish(queue, job, True, "out")["status"] == "ok"
