"""Reading an errno back out of another program's error message."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from cortexfs.errors import (
    HostTrouble,
    errno_named_in,
    explain_host_trouble,
    remedy_for_host_trouble,
)
from tests.support.exhaustion import empty, fill_to, inode_limited_tmpfs


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("bwrap: Can't find source path /x: No such file or directory", errno.ENOENT),
        ("fuse: failed to open /dev/fuse: Permission denied", errno.EACCES),
        ("fusermount3: mount failed: Operation not permitted", errno.EPERM),
        ("bwrap: Can't mkdir /a/b: Read-only file system", errno.EROFS),
        # Two named: the refusal is what the user must act on.
        ("No such file or directory, then Permission denied", errno.EACCES),
        ("bwrap: something else went wrong", errno.EIO),
    ],
)
def test_the_errno_a_message_names(message: str, code: int) -> None:
    assert errno_named_in(message) == code


def test_each_host_trouble_has_a_remedy_and_any_other_errno_none() -> None:
    assert remedy_for_host_trouble(errno.ENOSPC) == "free space or inodes on that filesystem"
    assert remedy_for_host_trouble(errno.ENFILE) == (
        "end processes that hold many files open, or raise the system's limit "
        "('sysctl fs.file-max')"
    )
    assert remedy_for_host_trouble(errno.EDQUOT, uid=1234) == (
        "free space within the disk quota of uid 1234"
    )
    assert explain_host_trouble(errno.EMFILE) == HostTrouble(
        "this process has no file descriptor left", "raise the limit of open files ('ulimit -n')"
    )
    for other in (errno.EIO, errno.EACCES, None):
        assert remedy_for_host_trouble(other, uid=1234) is None
        assert explain_host_trouble(other) is None


def test_a_full_filesystem_is_told_whether_inodes_or_space_ran_out(tmp_path: Path) -> None:
    """Told to free space, a user deletes big files, which frees no inode: on a real tmpfs
    whose inodes are used up, the remedy says to free inodes."""
    with inode_limited_tmpfs(tmp_path / "disk", inodes=50) as disk:
        fd = os.open(disk, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with_room = explain_host_trouble(errno.ENOSPC, filesystem=fd)
            assert with_room is not None and with_room.remedy == "free space on that filesystem"
            fill = fill_to(disk, 0)
            out_of_inodes = explain_host_trouble(errno.ENOSPC, filesystem=fd)
            empty(fill)
        finally:
            os.close(fd)
    assert out_of_inodes is not None
    assert out_of_inodes.ran_short.startswith("its filesystem has ")
    assert out_of_inodes.ran_short.endswith(" bytes and 0 inodes free")
    assert out_of_inodes.remedy == (
        "free inodes on that filesystem (remove files there: bytes are left)"
    )
    assert remedy_for_host_trouble(errno.ENOSPC, filesystem=-1) == (
        "free space or inodes on that filesystem"  # the kernel does not say: both
    )


def test_an_oserror_no_command_explained_still_says_what_mends_a_host_trouble() -> None:
    """The command line's last resort (cli.common.unexpected_error) keeps the errno and the
    path, and for what the host ran short of adds what ran short and the remedy; any other
    errno is told as it is."""
    from cortexfs.cli.common import unexpected_error

    emfile = unexpected_error(OSError(errno.EMFILE, os.strerror(errno.EMFILE), "/q/pending"))
    assert (emfile.errno, emfile.message) == (
        errno.EMFILE,
        "/q/pending: Too many open files (this process has no file descriptor left): raise "
        "the limit of open files ('ulimit -n'), then run the command again",
    )
    nameless = unexpected_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)))
    assert nameless.message == (
        "No space left on device: free space or inodes on that filesystem, then run the "
        "command again"
    )
    other = unexpected_error(OSError(errno.EIO, os.strerror(errno.EIO), "/q/done"))
    assert other.message == "/q/done: Input/output error"
