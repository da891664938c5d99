"""read_regular_file refuses what is no regular file with one errno, EINVAL, whatever it is:
a directory, a FIFO (without waiting for a writer) and a socket (which open refuses with
ENXIO, "No such device or address", a sentence that names nothing the reader can fix)."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

import pytest

from cortexfs.regular_file import read_regular_file


@pytest.mark.parametrize("kind", ["directory", "fifo", "socket"])
def test_what_is_no_regular_file_is_einval_naming_it(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "config"
    listener = socket.socket(socket.AF_UNIX)
    try:
        if kind == "directory":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        else:
            listener.bind(str(path))
        with pytest.raises(OSError) as refused:
            read_regular_file(path, 1024)
    finally:
        listener.close()
    assert refused.value.errno == errno.EINVAL
    assert (refused.value.strerror, refused.value.filename) == ("not a regular file", str(path))


def test_a_regular_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "config").write_bytes(b"a=1\n")
    assert read_regular_file(tmp_path / "config", 1024) == b"a=1\n"
