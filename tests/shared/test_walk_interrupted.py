"""A Ctrl-C at any moment of a walk down a tree by descriptors ends it with the interrupt,
each descriptor it opened closed once: ``ctx session tail --follow`` stopped with Ctrl-C just
after a level's close exited 1 with ``EBADF`` (the cleanup closed that level again, and its
error took the interrupt's place)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cortexfs import durable
from cortexfs.shared.tree import open_beneath


class _CtrlCAfterClose(durable.FsOps):
    """Operations whose ``close`` number ``at`` closes, then raises ``KeyboardInterrupt``, as
    a Ctrl-C arriving just after that close returns."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at
        self.closes = 0

    def close(self, fd: int) -> None:
        super().close(fd)  # a second close of fd is EBADF here, as it is in a real run
        self.closes += 1
        if self.closes == self.at:
            raise KeyboardInterrupt


def _open_descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("at", [1, 2, 3])
def test_open_beneath_interrupted_after_a_close_raises_the_interrupt(
    tmp_path: Path, at: int
) -> None:
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    ops = _CtrlCAfterClose(at)
    before = _open_descriptors()

    with pytest.raises(KeyboardInterrupt):
        open_beneath(ops, tmp_path, ["a", "b", "c"])

    assert _open_descriptors() == before  # the level reached last is closed too
