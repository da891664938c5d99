"""A directory moved without replacing, where renameat2 cannot be used (the link strategy of
filesystems without atomic renames, a kernel or seccomp filter without renameat2): link(2)
gives a directory no second name, so it is renamed once nothing is at the destination."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from cortexfs import durable
from cortexfs.durable import MOVE_LINK, MOVE_RENAME, FsOps


class WithoutRenameat2(FsOps):
    def rename_noreplace(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))


@pytest.fixture(params=["link strategy", "renameat2 refused"])
def ops(request: pytest.FixtureRequest) -> FsOps:
    if request.param == "link strategy":
        return FsOps(move_strategy=MOVE_LINK)
    return WithoutRenameat2(move_strategy=MOVE_RENAME)


@pytest.fixture
def directory(tmp_path: Path) -> Iterator[int]:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def test_a_directory_is_moved_whole_and_a_file_beside_it_by_link(
    ops: FsOps, directory: int, tmp_path: Path
) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "inside").write_text("kept")
    (tmp_path / "f").write_text("file")

    outcomes = durable.move_noreplace_batch(
        ops,
        [
            durable.Move(directory, "d", directory, "d2"),
            durable.Move(directory, "f", directory, "f2"),
        ],
    )

    assert outcomes == [None, None]
    assert sorted(os.listdir(tmp_path)) == ["d2", "f2"]
    assert (tmp_path / "d2" / "inside").read_text() == "kept"


@pytest.mark.parametrize("there", ["empty directory", "file"])
def test_a_directory_never_replaces_what_is_at_its_destination(
    ops: FsOps, directory: int, tmp_path: Path, there: str
) -> None:
    (tmp_path / "d").mkdir()
    if there == "file":
        (tmp_path / "d2").write_text("theirs")
    else:
        (tmp_path / "d2").mkdir()

    with pytest.raises(FileExistsError):
        durable.move_noreplace(ops, directory, "d", directory, "d2")

    assert (tmp_path / "d").is_dir()
    assert (tmp_path / "d2").is_dir() == (there == "empty directory")
