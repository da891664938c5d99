"""Reading an errno back out of another program's error message."""

from __future__ import annotations

import errno

import pytest

from cortexfs.errors import errno_named_in


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
