"""The persistence model: which on-disk states a crash may leave (docs/crash-model.md §2).

A journal is turned into *units*, the smallest pieces that can reach the disk on their own.
At every crash point (after each journal record) the units split into the *durable* ones — a
completed sync covered them, or something durable depends on them — and the *volatile* rest.
A crash state is the durable state of the base image plus any dependency-closed subset of
the volatile units, applied in the order they were issued.  The rules:

* every mutating operation is volatile until a sync covers it;
* ``fsync(file)`` covers that file's earlier data writes and truncations, not its names;
* ``fsync(dir)`` covers the earlier entry operations *in* that directory, not the
  directory's own entry in its parent;
* ``syncfs`` covers everything issued before it (the group-commit barrier of batch publish:
  Linux writes back every dirty inode and the journal of that filesystem);
* a completed sync is a barrier: a crash point after it keeps all it covered, so nothing
  issued later can be durable while that is not;
* dependencies: an operation on a directory entry needs the earlier operations on that entry
  (a name cannot be removed before it was created), ``rmdir`` needs everything done inside the
  directory (it was empty), and a new name for a file (link, the destination half of a
  rename) needs the name it was made from.  Nothing else: in particular what happens inside a
  new directory may reach the disk while the directory's own entry does not (the contents are
  then unreachable) — which is why a directory just made must have its parent synced;
* data writes carry no dependency and may *tear*: a write that reaches the disk may do so in
  block-aligned pieces, the pieces that did not arrive reading as zeros or as garbage, and a
  write that extended the file may show its new size with none of its bytes;
* renames, in two modes: ``atomic`` (ext4, xfs, btrfs — one unit, covered by a sync of either
  directory) and ``pessimistic`` (ALICE's split: dropping a displaced destination, adding the
  new name and removing the old name are three units, ordered only by their dependencies, so
  a state with neither name is reachable);
* ``process`` mode is a kill -9: the kernel keeps everything it accepted, so the crash states
  are exactly the prefixes of the journal.

Subsets are enumerated exhaustively; at a crash point with more than ``limit`` of them the
model draws ``limit`` random ones from a seeded generator instead.  Tears are explored one
write at a time: a state has at most one torn write (ALICE explores them the same way).
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

from tests.crash.fsimage import Image
from tests.crash.microops import (
    DataOp,
    EntryOp,
    Fsync,
    Link,
    Record,
    RemoveDir,
    Rename,
    SyncFs,
    Truncate,
    Write,
    apply,
    remove_entry,
    write_into,
)

BLOCK = 512  # the sector: the unit a disk writes atomically
FILLS = (b"\0", b"\xa5")  # what the missing pieces of a torn write read as: zeros, garbage

EntryKey = tuple[int, str]


class Mode(StrEnum):
    ATOMIC = "atomic"
    PESSIMISTIC = "pessimistic"
    PROCESS = "process"


@dataclass(frozen=True)
class Unit:
    """A piece of one journalled operation that can reach the disk on its own."""

    seq: int  # issue order among units
    index: int  # position of the operation in the journal
    op: EntryOp | DataOp
    part: str = "whole"  # a split rename: "drop-old", "add" or "remove"

    @property
    def changes(self) -> tuple[EntryKey, ...]:
        """The directory entries whose binding this unit changes."""
        op = self.op
        if isinstance(op, Rename):
            source, target = (op.src_parent, op.src_name), (op.parent, op.name)
            return {"whole": (source, target), "remove": (source,)}.get(self.part, (target,))
        if isinstance(op, Write | Truncate):
            return ()
        return ((op.parent, op.name),)

    @property
    def needs(self) -> tuple[EntryKey, ...]:
        """Entries that must already be bound: the name a new name is made from."""
        op = self.op
        if isinstance(op, Link) or (isinstance(op, Rename) and self.part == "add"):
            return ((op.src_parent, op.src_name),)
        return ()

    @property
    def dirs(self) -> frozenset[int]:
        """The directories whose fsync covers this unit."""
        return frozenset(parent for parent, _ in self.changes)

    @property
    def data_node(self) -> int | None:
        return self.op.node if isinstance(self.op, Write | Truncate) else None

    def apply(self, image: Image, tear: Tear | None = None) -> None:
        op = self.op
        if tear is not None:
            assert isinstance(op, Write) and tear.unit == self
            write_into(image.file(op.node), op.offset, tear.data())
        elif self.part == "drop-old":
            assert isinstance(op, Rename) and op.replaced is not None
            remove_entry(image, op.parent, op.name, op.replaced)
        elif self.part == "add":
            assert isinstance(op, Rename)
            image.file(op.node)
            image.directory(op.parent).entries[op.name] = op.node
        elif self.part == "remove":
            assert isinstance(op, Rename)
            remove_entry(image, op.src_parent, op.src_name, op.node)
        else:
            apply(image, op)

    def describe(self) -> str:
        name = type(self.op).__name__
        return f"#{self.index} {name}" + ("" if self.part == "whole" else f"[{self.part}]")


@dataclass(frozen=True)
class Tear:
    """How one write reached the disk in pieces: which pieces arrived, what the rest read as."""

    unit: Unit
    kept: frozenset[int]
    fill: bytes

    def data(self) -> bytes:
        op = self.unit.op
        assert isinstance(op, Write)
        return b"".join(
            piece if i in self.kept else self.fill * len(piece)
            for i, piece in enumerate(pieces(op))
        )

    def describe(self) -> str:
        fill = "zeros" if self.fill == b"\0" else "garbage"
        return f"{self.unit.describe()} torn: pieces {sorted(self.kept)} kept, rest {fill}"


def pieces(write: Write) -> list[bytes]:
    """The data of a write cut at block boundaries of the file."""
    cuts = [write.offset]
    cuts += range((write.offset // BLOCK + 1) * BLOCK, write.offset + len(write.data), BLOCK)
    cuts.append(write.offset + len(write.data))
    return [write.data[a - write.offset : b - write.offset] for a, b in itertools.pairwise(cuts)]


def tears(unit: Unit) -> Iterator[Tear]:
    """Every way ``unit`` (a write) can arrive torn: each proper subset of its pieces kept
    (prefixes and single pieces only, beyond four pieces), the rest zeros or garbage."""
    assert isinstance(unit.op, Write)
    count = len(pieces(unit.op))
    if count <= 4:
        kept_sets: Iterable[Iterable[int]] = itertools.chain.from_iterable(
            itertools.combinations(range(count), size) for size in range(count)
        )
    else:
        kept_sets = [*(range(n) for n in range(count)), *((n,) for n in range(1, count))]
    for kept in kept_sets:
        for fill in FILLS:
            yield Tear(unit, frozenset(kept), fill)


def split(records: Sequence[Record], start: int, mode: Mode) -> list[Unit]:
    """The units of the journal's filesystem operations, in issue order."""
    units: list[Unit] = []
    for index in range(start, len(records)):
        op = records[index].op
        if not isinstance(op, EntryOp | DataOp):
            continue
        if isinstance(op, Rename) and mode is Mode.PESSIMISTIC:
            parts = (["drop-old"] if op.replaced is not None else []) + ["add", "remove"]
        else:
            parts = ["whole"]
        units += [Unit(len(units) + i, index, op, part) for i, part in enumerate(parts)]
    return units


def dependencies(units: Sequence[Unit]) -> dict[Unit, frozenset[Unit]]:
    """The units each unit needs on disk before it can be there itself (rules above)."""
    last_on: dict[EntryKey, Unit] = {}
    inside: defaultdict[int, list[Unit]] = defaultdict(list)
    deps: dict[Unit, frozenset[Unit]] = {}
    for unit in units:
        needed = {last_on[e] for e in (*unit.changes, *unit.needs) if e in last_on}
        if isinstance(unit.op, RemoveDir):
            needed.update(inside[unit.op.node])
        deps[unit] = frozenset(needed)
        for entry in unit.changes:
            last_on[entry] = unit
        for directory in unit.dirs:
            inside[directory].append(unit)
    return deps


def covers(sync: Fsync | SyncFs, unit: Unit) -> bool:
    if isinstance(sync, SyncFs):
        return True
    if sync.directory:
        return sync.node in unit.dirs
    return unit.data_node == sync.node


@dataclass(frozen=True)
class CrashState:
    point: int  # the crash came after this many journal records
    image: Image
    lost: tuple[Unit, ...] = ()  # volatile units that did not reach the disk
    kept: tuple[Unit, ...] = ()  # volatile units that did
    tear: Tear | None = None

    def describe(self) -> str:
        parts = [f"crash after record {self.point}"]
        if self.kept:
            parts.append("kept " + ", ".join(u.describe() for u in self.kept))
        if self.lost:
            parts.append("lost " + ", ".join(u.describe() for u in self.lost))
        if self.tear is not None:
            parts.append(self.tear.describe())
        return "; ".join(parts)


@dataclass
class Explorer:
    """Enumerates the crash states of one journal under one mode."""

    base: Image
    records: Sequence[Record]
    start: int
    mode: Mode
    limit: int = 4096
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    sampled_points: int = 0

    @cached_property
    def units(self) -> list[Unit]:
        return split(self.records, self.start, self.mode)

    def durable(self) -> Iterator[tuple[int, frozenset[Unit]]]:
        """For every crash point, the units no crash there can lose."""
        units, deps = self.units, dependencies(self.units)
        durable: set[Unit] = set()
        for point in range(self.start, len(self.records) + 1):
            if self.mode is Mode.PROCESS:
                durable = {u for u in units if u.index < point}
            elif point > self.start:
                sync = self.records[point - 1].op
                if isinstance(sync, Fsync | SyncFs):
                    covered = [u for u in units if u.index < point - 1 and covers(sync, u)]
                    durable |= closure(covered, deps)
            yield point, frozenset(durable)

    def states(self) -> Iterator[CrashState]:
        units = self.units
        if self.mode is Mode.PROCESS:
            yield from self._prefixes(units)
            return
        deps = dependencies(units)
        for point, durable in self.durable():
            volatile = [u for u in units if u.index < point and u not in durable]
            for subset in self._subsets(volatile, deps, durable):
                yield from self._with_tears(point, units, durable, volatile, subset)

    def _prefixes(self, units: Sequence[Unit]) -> Iterator[CrashState]:
        image = self.base.copy()
        pending = list(units)
        for point in range(self.start, len(self.records) + 1):
            while pending and pending[0].index < point:
                pending.pop(0).apply(image)
            yield CrashState(point, image.copy())

    def _subsets(
        self,
        volatile: Sequence[Unit],
        deps: dict[Unit, frozenset[Unit]],
        durable: frozenset[Unit],
    ) -> Iterator[frozenset[Unit]]:
        if count_downsets(volatile, deps, durable, self.limit) <= self.limit:
            yield from downsets(volatile, deps, durable)
            return
        self.sampled_points += 1
        seen: set[frozenset[Unit]] = set()
        for _ in range(self.limit):
            chosen: set[Unit] = set()
            for unit in volatile:
                if deps[unit] <= durable | chosen and self.rng.random() < 0.5:
                    chosen.add(unit)
            if frozenset(chosen) not in seen:
                seen.add(frozenset(chosen))
                yield frozenset(chosen)

    def _with_tears(
        self,
        point: int,
        units: Sequence[Unit],
        durable: frozenset[Unit],
        volatile: Sequence[Unit],
        subset: frozenset[Unit],
    ) -> Iterator[CrashState]:
        applied = [u for u in units if u in durable or u in subset]
        image = build(self.base, applied)
        kept = tuple(u for u in volatile if u in subset)
        lost = tuple(u for u in volatile if u not in subset)
        yield CrashState(point, image, lost, kept)
        visible = {node for _, node in image.walk()}
        for unit in kept:
            if isinstance(unit.op, Write) and unit.op.node in visible:
                for tear in tears(unit):
                    yield CrashState(point, build(self.base, applied, tear), lost, kept, tear)


def build(base: Image, applied: Iterable[Unit], tear: Tear | None = None) -> Image:
    image = base.copy()
    for unit in applied:
        unit.apply(image, tear if tear is not None and tear.unit == unit else None)
    return image


def closure(units: Iterable[Unit], deps: dict[Unit, frozenset[Unit]]) -> set[Unit]:
    """``units`` and everything they depend on, transitively."""
    result: set[Unit] = set()
    todo = list(units)
    while todo:
        unit = todo.pop()
        if unit not in result:
            result.add(unit)
            todo.extend(deps[unit])
    return result


def downsets(
    volatile: Sequence[Unit], deps: dict[Unit, frozenset[Unit]], durable: frozenset[Unit]
) -> Iterator[frozenset[Unit]]:
    """Every subset of ``volatile`` that holds the dependencies of each of its members."""

    def extend(i: int, chosen: frozenset[Unit]) -> Iterator[frozenset[Unit]]:
        if i == len(volatile):
            yield chosen
            return
        yield from extend(i + 1, chosen)
        unit = volatile[i]
        if all(d in chosen or d in durable for d in deps[unit]):
            yield from extend(i + 1, chosen | {unit})

    yield from extend(0, frozenset())


def count_downsets(
    volatile: Sequence[Unit],
    deps: dict[Unit, frozenset[Unit]],
    durable: frozenset[Unit],
    limit: int,
) -> int:
    """How many :func:`downsets` there are, counting no further than ``limit + 1``."""
    return sum(1 for _ in itertools.islice(downsets(volatile, deps, durable), limit + 1))
