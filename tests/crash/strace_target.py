"""Each protocol verb once, under the recorder, for the strace comparison (test_recorder.py).

    python -m tests.crash.strace_target QUEUE OUT STRATEGY [--bypass]

Before each verb its name is written to OUT.marks (outside the queue), so the strace output
can be cut per verb; the journal's system calls, per verb, go to OUT as JSON.  ``--bypass``
makes one verb also change the queue behind ``FsOps``' back, to show the check notices.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from cortexfs.queue import Holder, Queue, claim_job, finish, publish, publish_batch, recover
from cortexfs.queue import renew as renew_lease
from tests.crash.fsimage import Image
from tests.crash.microops import (
    Chmod,
    Create,
    Fsync,
    Link,
    MakeDir,
    Op,
    RemoveDir,
    Rename,
    SyncFs,
    Truncate,
    Unlink,
    Write,
    apply,
)
from tests.crash.recorder import Journal, RecordingOps

Call = list[str | int]


class Interrupted(BaseException):
    """The publisher dies at publish.move: its temp file stays behind for recover."""


def exited_holder() -> Holder:
    child = subprocess.Popen(["sleep", "60"])
    holder = Holder.for_process(child.pid, worker="exited")
    child.kill()
    child.wait()
    return holder


def verbs(queue: Queue, journal: Journal, bypass: bool) -> list[tuple[str, Callable[[], object]]]:
    me, gone = Holder.for_process(worker="traced"), exited_holder()
    doc = {"tool": "fs.stat", "input": {}}

    def interrupted_publish() -> None:
        def die(actor: str, step: str) -> None:
            if step == "publish.move":
                raise Interrupted

        journal.on_step = die
        try:
            publish(queue, doc, "t")
        except Interrupted:
            pass
        finally:
            journal.on_step = None

    def publish_with_bypass() -> None:
        publish(queue, doc, "a")
        if bypass:
            (queue.path / "inbox" / "behind-the-back").write_bytes(b"x")

    return [
        ("publish", publish_with_bypass),
        ("publish --batch", lambda: publish_batch(queue, [doc, doc], ["b", "c"])),
        ("claim", lambda: claim_job(queue, "a.req.json", me)),
        ("renew", lambda: renew_lease(queue, "a.req.json", [me])),
        ("finish --ok", lambda: finish(queue, "a.req.json", True, "out")),
        ("claim (exited holder)", lambda: claim_job(queue, "b.req.json", gone)),
        ("recover", lambda: recover(queue, grace=0)),
        ("claim again", lambda: claim_job(queue, "b.req.json", me)),
        ("finish --error", lambda: finish(queue, "b.req.json", False, "err")),
        ("publish, interrupted", interrupted_publish),
        ("recover --reconcile", lambda: recover(queue, reconcile=True, grace=0)),
    ]


def calls(journal: Journal, start: int, end: int, image: Image) -> list[Call]:
    """The journal's operations in ``[start, end)`` as (call, path...) lists, as strace would
    show them; ``image`` is the tree before ``start`` and is brought up to ``end``."""

    def at(parent: int, name: str) -> str:
        return f"{image.path_of(parent)}/{name}".lstrip("/")

    found: list[Call] = []
    for line in journal.records[start:end]:
        if isinstance(line.op, _FS_OPS):
            found.append(call(line.op, at, image))  # paths as they were before the call
        apply(image, line.op)
    return found


_FS_OPS = (Create, MakeDir, RemoveDir, Unlink, Link, Rename, Write, Truncate, Chmod, Fsync, SyncFs)


def call(op: Op, at: Callable[[int, str], str], image: Image) -> Call:
    match op:
        case Create(parent, name, _):
            return ["create", at(parent, name)]
        case MakeDir(parent, name, _):
            return ["mkdir", at(parent, name)]
        case RemoveDir(parent, name, _):
            return ["rmdir", at(parent, name)]
        case Unlink(parent, name, _):
            return ["unlink", at(parent, name)]
        case Link(src_parent, src_name, parent, name, _):
            return ["link", at(src_parent, src_name), at(parent, name)]
        case Rename(src_parent, src_name, parent, name, _, _):
            return ["rename", at(src_parent, src_name), at(parent, name)]
        case Write(node, _, data):
            return ["write", image.path_of(node) or "?", len(data)]
        case Truncate(node, _):
            return ["truncate", image.path_of(node) or "?"]
        case Chmod(node, _):
            return ["fchmod", image.path_of(node) or "?"]
        case Fsync(node, _):
            return ["fsync", image.path_of(node) or "?"]
        case _:
            return ["syncfs"]


def main(queue_dir: Path, out: Path, strategy: str, bypass: bool) -> None:
    journal = Journal(queue_dir)
    journal.begin()
    marks = os.open(out.with_suffix(".marks"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    image = journal.base.copy()
    per_verb: list[tuple[str, list[Call]]] = []
    with Queue.open(queue_dir, ops=RecordingOps(journal, "traced", strategy)) as queue:
        for name, verb in verbs(queue, journal, bypass):
            os.write(marks, f"{name}\n".encode())
            start = len(journal.records)
            verb()
            per_verb.append((name, calls(journal, start, len(journal.records), image)))
    out.write_text(json.dumps(per_verb))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], "--bypass" in sys.argv[4:])
