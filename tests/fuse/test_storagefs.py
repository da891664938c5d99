"""The mount's operations called directly, on a real directory tree (no kernel mount needed).

What the kernel's caches make hard to reach through a mount: a directory swapped for a
symbolic link between two requests must not lead the daemon, which runs as root for every
viewer, out of the storage root.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

pyfuse3 = pytest.importorskip("pyfuse3", reason="pyfuse3 (the 'fuse' extra) is not installed")
trio = pytest.importorskip("trio")

from cortexfs.fuse.mount import StorageFS  # noqa: E402
from cortexfs.fuse.projection import Projection  # noqa: E402


def run(coroutine_function, *args):  # type: ignore[no-untyped-def]
    return trio.run(coroutine_function, *args)


@pytest.fixture
def fs(tmp_path: Path) -> tuple[StorageFS, Path]:
    root = tmp_path / "storage"
    (root / "home" / "0" / "d").mkdir(parents=True)
    (root / "home" / "0" / "d" / "mine").write_text("inside\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("outside the root\n")
    return StorageFS(root, Projection()), tmp_path


def test_a_directory_swapped_for_a_link_does_not_redirect_the_daemon(
    fs: tuple[StorageFS, Path],
) -> None:
    storage, tmp_path = fs
    home = run(storage.lookup, pyfuse3.ROOT_INODE, b"home").st_ino
    zero = run(storage.lookup, home, b"0").st_ino
    d = run(storage.lookup, zero, b"d").st_ino
    assert run(storage.lookup, d, b"mine").st_size == len("inside\n")

    swapped = tmp_path / "storage" / "home" / "0" / "d"
    (swapped / "mine").unlink()
    swapped.rmdir()
    swapped.symlink_to(tmp_path / "outside")

    with pytest.raises(pyfuse3.FUSEError) as refused:
        run(storage.lookup, d, b"secret")
    assert refused.value.errno in (errno.ELOOP, errno.ENOTDIR)
    with pytest.raises(pyfuse3.FUSEError):
        run(storage.opendir, d, None)


def test_a_link_is_described_never_followed(fs: tuple[StorageFS, Path]) -> None:
    storage, tmp_path = fs
    link = tmp_path / "storage" / "home" / "0" / "link"
    link.symlink_to(tmp_path / "outside" / "secret")
    home = run(storage.lookup, pyfuse3.ROOT_INODE, b"home").st_ino
    zero = run(storage.lookup, home, b"0").st_ino

    attributes = run(storage.lookup, zero, b"link")

    assert (attributes.st_mode & 0o170000) == 0o120000  # a symbolic link, as lstat sees it
    with pytest.raises(pyfuse3.FUSEError) as refused:
        run(storage.open, attributes.st_ino, os.O_RDONLY, None)
    assert refused.value.errno == errno.ELOOP
