"""A call's result is synced in the session and in the tool's log at once (SPEC S-5, T-7)."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from cortexfs.tools.record import _sync_at_once


def test_the_files_are_synced_at_the_same_time(tmp_path: Path) -> None:
    both_syncing = threading.Barrier(2, timeout=10)  # broken unless the two meet
    synced = []

    def sync(name: str) -> None:
        both_syncing.wait()
        fd = os.open(tmp_path / name, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        synced.append(name)

    _sync_at_once([lambda: sync("events.jsonl"), lambda: sync("log")])

    assert sorted(synced) == ["events.jsonl", "log"]


def test_every_file_is_synced_and_the_first_failure_in_order_is_raised() -> None:
    ran = []

    def failing(code: int) -> None:
        ran.append(code)
        raise OSError(code, os.strerror(code))

    with pytest.raises(OSError) as raised:
        _sync_at_once([lambda: failing(errno.EIO), lambda: failing(errno.ENOSPC)])

    assert raised.value.errno == errno.EIO and sorted(ran) == sorted([errno.EIO, errno.ENOSPC])


def test_a_failure_of_the_second_is_raised_once_the_first_is_synced() -> None:
    first_done = threading.Event()

    def second() -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    with pytest.raises(OSError) as raised:
        _sync_at_once([first_done.set, second])

    assert raised.value.errno == errno.EROFS and first_done.is_set()
