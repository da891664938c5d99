"""The micro-operations a journal records, and what each one does to an image when it
reaches the disk whole.

Filesystem operations name directories and files by node id (:mod:`tests.crash.fsimage`), so
they stay meaningful whatever subset of them a crash keeps.  Markers change nothing on disk:
they say where the protocol was (``Step``), what the workload was attempting (``Attempt``),
that the call came back (``Returned``), what it had been told (``Ack``) and what it had done
outside the queue (``Executed``) — the oracle's view of the world, as ALICE uses a program's
output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.crash.fsimage import Image, Node


@dataclass(frozen=True)
class Create:
    """``open(O_CREAT|O_EXCL)``: a new empty file named ``parent/name``."""

    parent: int
    name: str
    node: int


@dataclass(frozen=True)
class MakeDir:
    parent: int
    name: str
    node: int


@dataclass(frozen=True)
class RemoveDir:
    parent: int
    name: str
    node: int


@dataclass(frozen=True)
class Unlink:
    parent: int
    name: str
    node: int


@dataclass(frozen=True)
class Link:
    """A second name ``parent/name`` for the file ``src_parent/src_name``."""

    src_parent: int
    src_name: str
    parent: int
    name: str
    node: int


@dataclass(frozen=True)
class Rename:
    """``src_parent/src_name`` becomes ``parent/name``; ``replaced`` is the node it displaced."""

    src_parent: int
    src_name: str
    parent: int
    name: str
    node: int
    replaced: int | None


@dataclass(frozen=True)
class Write:
    node: int
    offset: int
    data: bytes


@dataclass(frozen=True)
class Truncate:
    node: int
    size: int


@dataclass(frozen=True)
class Chmod:
    """``fchmod(2)``: the node's permission bits.  Names and contents, which are all the crash
    model reasons about, stay as they were; recorded so that the journal and strace agree."""

    node: int
    mode: int


@dataclass(frozen=True)
class Fsync:
    node: int
    directory: bool


@dataclass(frozen=True)
class SyncFs:
    """``syncfs(2)``: everything written to the filesystem so far."""


@dataclass(frozen=True)
class Step:
    name: str


@dataclass(frozen=True)
class Attempt:
    """The workload is about to call ``what`` on ``job`` ("*" when the protocol picks)."""

    what: str
    job: str


@dataclass(frozen=True)
class Returned:
    """The call the actor last attempted returned, with success or with a refusal."""


@dataclass(frozen=True)
class Ack:
    """A protocol call returned success: ``what`` (publish, claim, renew, finish) of ``job``."""

    what: str
    job: str
    detail: Any = None


@dataclass(frozen=True)
class Executed:
    """The workload started running ``job`` (a side effect outside the queue)."""

    job: str


EntryOp = Create | MakeDir | RemoveDir | Unlink | Link | Rename
DataOp = Write | Truncate
ModeOp = Chmod
SyncOp = Fsync | SyncFs
Marker = Step | Attempt | Returned | Ack | Executed
Op = EntryOp | DataOp | ModeOp | SyncOp | Marker


@dataclass(frozen=True)
class Record:
    """One journal line: who did it, and what."""

    actor: str
    op: Op


def write_into(node: Node, offset: int, data: bytes) -> None:
    """Put ``data`` at ``offset``; a gap before it reads as zeros (a sparse hole)."""
    head = node.data[:offset].ljust(offset, b"\0")
    node.data = head + data + node.data[offset + len(data) :]


def apply(image: Image, op: Op) -> None:
    """What ``op`` does when it reaches the disk whole (markers and syncs do nothing)."""
    match op:
        case Create(parent, name, node):
            image.file(node)
            image.directory(parent).entries[name] = node
        case MakeDir(parent, name, node):
            image.directory(node)
            image.directory(parent).entries[name] = node
        case RemoveDir(parent, name, node) | Unlink(parent, name, node):
            remove_entry(image, parent, name, node)
        case Link(_, _, parent, name, node):
            image.file(node)
            image.directory(parent).entries[name] = node
        case Rename(src_parent, src_name, parent, name, node, _):
            remove_entry(image, src_parent, src_name, node)
            image.directory(parent).entries[name] = node
        case Write(node, offset, data):
            write_into(image.file(node), offset, data)
        case Truncate(node, size):
            target = image.file(node)
            target.data = target.data[:size].ljust(size, b"\0")
        case _:
            pass


def remove_entry(image: Image, parent: int, name: str, node: int) -> None:
    """Remove ``parent/name`` if it still names ``node`` (a crash may have kept another)."""
    entries = image.directory(parent).entries
    if entries.get(name) == node:
        del entries[name]
