"""Fixtures for the queue tests: a real storage root in a temp dir, opened queues."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cortexfs import storage
from cortexfs.queue import Holder, Queue, queue_path
from cortexfs.shared.spaces import create_shared_space
from tests.queue.helpers import PROJECT


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A storage root with the root ABI alone: a space made in it adds only itself, where a
    missing root, or an empty directory, would be bootstrapped whole (core tools, manual),
    which these tests do not need and which costs a few hundred fsyncs."""
    root = tmp_path / "storage"
    root.mkdir()
    storage.ensure_root_abi(root)
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
