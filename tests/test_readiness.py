"""Waits on descriptors through poll(2) (cortexfs.readiness)."""

from __future__ import annotations

import fcntl
import os

import pytest

from cortexfs.readiness import readable, readable_or_writable, writable

F_SETPIPE_SZ = 1031


def test_a_descriptor_numbered_past_select_s_bound_is_waited_for() -> None:
    read_end, write_end = os.pipe()
    high = os.dup2(write_end, 1500)
    try:
        assert writable([high], 0) == [high]
        assert readable([read_end], 0) == []
    finally:
        for fd in (read_end, write_end, high):
            os.close(fd)


def test_a_wait_to_write_returns_when_the_other_side_has_written() -> None:
    """Two pipes, as a client and its server hold them: ours to write is full, and the
    wait for room ends as soon as the other side writes to us."""
    ours_in, theirs_out = os.pipe()  # what the server writes, we read
    theirs_in, ours_out = os.pipe()  # what we write, the server reads
    try:
        fcntl.fcntl(ours_out, F_SETPIPE_SZ, 4096)
        os.set_blocking(ours_out, False)
        with pytest.raises(BlockingIOError):
            while True:
                os.write(ours_out, b"x" * 4096)
        assert readable_or_writable(ours_in, ours_out, 0.05) == (False, False)
        os.write(theirs_out, b"note\n")
        assert readable_or_writable(ours_in, ours_out, 5) == (True, False)
        os.read(ours_in, 100)
        os.read(theirs_in, 8192)
        assert readable_or_writable(ours_in, ours_out, 5) == (False, True)
    finally:
        for fd in (ours_in, theirs_out, theirs_in, ours_out):
            os.close(fd)


def test_one_descriptor_is_not_waited_for_twice() -> None:
    read_end, write_end = os.pipe()
    try:
        with pytest.raises(ValueError):
            readable_or_writable(read_end, read_end, 0)
    finally:
        os.close(read_end)
        os.close(write_end)
