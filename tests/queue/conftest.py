"""Fixtures for the queue tests: a real storage root in a temp dir, opened queues."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cortexfs.queue import Holder, Queue, queue_path
from cortexfs.shared.spaces import create_shared_space
from tests.queue.helpers import PROJECT


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An empty storage root: a space made in it gets the root ABI only, where a missing root
    would be bootstrapped whole (core tools, manual), which these tests do not need."""
    root = tmp_path / "storage"
    root.mkdir()
    return root


@pytest.fixture
def queue_dir(root: Path) -> Path:
    create_shared_space(root, PROJECT)
    return queue_path(root, PROJECT)


@pytest.fixture
def queue(queue_dir: Path) -> Iterator[Queue]:
    with Queue.open(queue_dir) as q:
        yield q


@pytest.fixture
def me() -> Holder:
    return Holder.for_process(worker="test")
