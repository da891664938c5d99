"""The persistence model's rules, one by one (docs/crash-model.md §2).

Each test makes a few real system calls through the recorder in a real directory, then asks
the model which states a crash may leave: what must be reachable and what must not.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.crash.fsimage import FILE, snapshot
from tests.crash.persistence import BLOCK, CrashState, Explorer, Mode
from tests.crash.recorder import Journal, RecordingOps

DATA = bytes(range(256)) * 5  # 1280 bytes: three pieces of BLOCK bytes


class Tree:
    """A recorded directory: ``d/`` exists (durably) from the start."""

    def __init__(self, root: Path) -> None:
        (root / "d").mkdir(parents=True)
        self.journal = Journal(root)
        self.journal.begin()
        self.ops = RecordingOps(self.journal, "test")
        self.top = self.ops.open_dir(str(root))
        self.d = self.ops.open_dir("d", self.top)

    def create(self, dir_fd: int, name: str, data: bytes = b"", sync: bool = False) -> None:
        fd = self.ops.create_file(name, dir_fd)
        if data:
            self.ops.write(fd, data)
        if sync:
            self.ops.fsync(fd)
        self.ops.close(fd)

    def final_states(self, mode: Mode, **options: object) -> list[dict[str, bytes | None]]:
        return [seen(s) for s in self.states(mode, **options) if s.point == self.end]

    def states(self, mode: Mode, **options: object) -> Iterator[CrashState]:
        j = self.journal
        return Explorer(j.base, j.records, j.start, mode, **options).states()  # type: ignore[arg-type]

    @property
    def end(self) -> int:
        return len(self.journal.records)


def seen(state: CrashState) -> dict[str, bytes | None]:
    """Path → file content (None for a directory), as a reader after the crash sees it."""
    image = state.image
    return {
        path: image.nodes[node].data if image.nodes[node].kind == FILE else None
        for path, node in image.walk()
    }


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    return Tree(tmp_path / "fs")


def test_fsync_of_a_file_makes_its_data_durable_not_its_name(tree):
    tree.create(tree.d, "f", DATA, sync=True)
    finals = tree.final_states(Mode.ATOMIC)
    assert any("d/f" not in s for s in finals), "the name must not be durable"
    assert all(s["d/f"] == DATA for s in finals if "d/f" in s), "the data must be"


def test_fsync_of_a_directory_makes_its_entries_durable_not_its_own_entry(tree):
    tree.ops.mkdir("n", tree.top)
    n = tree.ops.open_dir("n", tree.top)
    tree.create(n, "f", DATA, sync=True)
    tree.ops.fsync(n)
    finals = tree.final_states(Mode.ATOMIC)
    assert any("n" not in s for s in finals), "n's own entry must not be durable"
    assert all(s.get("n/f") == DATA for s in finals if "n" in s)


def test_a_completed_sync_is_a_barrier(tree):
    tree.create(tree.d, "a")
    tree.ops.fsync(tree.d)
    tree.create(tree.d, "b")
    finals = tree.final_states(Mode.ATOMIC)
    assert all("d/a" in s for s in finals)
    assert {("d/b" in s) for s in finals} == {True, False}


def test_syncfs_covers_everything_issued_before_it(tree):
    tree.create(tree.d, "a", DATA)
    tree.create(tree.top, "b", b"b")
    tree.ops.syncfs(tree.d)
    assert tree.final_states(Mode.ATOMIC) == [{"b": b"b", "d": None, "d/a": DATA}]


def test_a_new_name_needs_the_name_it_was_made_from(tree):
    tree.create(tree.top, "t", b"x", sync=True)
    tree.ops.link("t", tree.top, "x", tree.d)
    tree.ops.fsync(tree.d)
    assert all("t" in s and "d/x" in s for s in tree.final_states(Mode.ATOMIC))


def renamed(tree: Tree, replacing: bool = False) -> Tree:
    """A durable file ``t`` renamed to ``d/x``, nothing synced after the rename."""
    tree.create(tree.top, "t", b"x", sync=True)
    tree.ops.fsync(tree.top)
    rename = tree.ops.rename if replacing else tree.ops.rename_noreplace
    rename("t", tree.top, "x", tree.d)
    return tree


def test_an_atomic_rename_leaves_exactly_one_name(tree):
    finals = renamed(tree).final_states(Mode.ATOMIC)
    assert {("t" in s, "d/x" in s) for s in finals} == {(True, False), (False, True)}


def test_a_pessimistic_rename_may_leave_neither_name_or_both(tree):
    finals = renamed(tree).final_states(Mode.PESSIMISTIC)
    assert {("t" in s, "d/x" in s) for s in finals} == {
        (True, False),
        (False, True),
        (False, False),
        (True, True),
    }


def test_a_replacing_rename_may_lose_the_destination_when_not_atomic(tree):
    tree.create(tree.d, "x", b"old", sync=True)
    tree.ops.fsync(tree.d)
    renamed(tree, replacing=True)
    atomic = {s.get("d/x") for s in tree.final_states(Mode.ATOMIC)}
    assert atomic == {b"old", b"x"}
    assert None in {s.get("d/x") for s in tree.final_states(Mode.PESSIMISTIC)}


def test_unsynced_writes_tear_into_blocks_of_zeros_or_garbage(tree):
    tree.create(tree.d, "f")
    tree.ops.fsync(tree.d)
    fd = tree.ops.open_append("f", tree.d)
    tree.ops.write(fd, DATA)
    tree.ops.close(fd)
    contents = {s["d/f"] for s in tree.final_states(Mode.ATOMIC)}
    pieces = [DATA[i : i + BLOCK] for i in range(0, len(DATA), BLOCK)]
    assert b"" in contents and DATA in contents
    assert pieces[0] + b"\0" * (len(DATA) - BLOCK) in contents
    assert b"\xa5" * BLOCK + pieces[1] + b"\xa5" * len(pieces[2]) in contents
    assert b"\0" * len(DATA) in contents, "an append may show its size and no bytes"
    assert len(contents) == 2 + (2**3 - 1) * 2  # none, all, each proper subset x two fills


def test_a_killed_process_loses_nothing_the_kernel_accepted(tree):
    tree.create(tree.d, "a", DATA)
    tree.ops.mkdir("n", tree.top)
    states = list(tree.states(Mode.PROCESS))
    assert [s.point for s in states] == list(range(tree.journal.start, tree.end + 1))
    real = snapshot(tree.journal.root, iter(range(10**6, 10**7)).__next__)
    assert states[-1].image.canonical() == real.canonical()


def test_crowded_crash_points_are_sampled_from_the_seed(tree):
    for n in range(12):
        tree.create(tree.d, f"f{n}")

    def sample(seed: int) -> tuple[list[object], int]:
        explorer = Explorer(
            tree.journal.base,
            tree.journal.records,
            tree.journal.start,
            Mode.ATOMIC,
            limit=64,
            rng=random.Random(seed),
        )
        states = [s.image.canonical() for s in explorer.states()]
        return states, explorer.sampled_points

    first, sampled = sample(7)
    assert sampled > 0
    assert sample(7)[0] == first
    assert sample(8)[0] != first
