"""``fs.read``: the contents of a file inside the agent's visible mounts (SPEC R-5, T-2).

Input ``{"path": str, "offset": int = 0, "length": int = 1 MiB}``.  Native output
``{"path", "size", "offset", "content", "encoding", "truncated"}`` — ``encoding`` is ``utf-8``,
or ``base64`` when the bytes are not UTF-8.  Terminal output: the bytes themselves.
"""

from __future__ import annotations

import base64
import errno
import os

from cortexfs.tools.core import confine
from cortexfs.tools.core.toolio import Reply, ToolFailure, core_main, main_parameter, require

MAX_LENGTH = 1024 * 1024
MAX_OFFSET = (1 << 63) - 1  # the largest file offset the kernel takes (off_t)


def read(request: dict[str, object], native: bool) -> Reply:
    place = confine.View.from_environment(os.environ).locate(require(request, "path", str))
    offset = require(request, "offset", int, 0)
    length = require(request, "length", int, MAX_LENGTH)
    if not 0 <= offset <= MAX_OFFSET or not 0 <= length <= MAX_LENGTH:
        raise ToolFailure(
            errno.EINVAL,
            f"offset must be from 0 to {MAX_OFFSET} and length from 0 to {MAX_LENGTH}",
            usage=True,
        )
    fd, status = confine.open_regular_file(place)
    try:
        # A byte past what is asked says whether the file goes on, which its size does not
        # (0 for a file of /proc, a page for one of /sys, another for a file that grows); the
        # range never passes the largest offset, which the kernel refuses whole (EINVAL).
        wanted = min(length + 1, MAX_OFFSET - offset)
        with confine.reporting(place):  # a read the kernel fails (EIO) names the file too
            data = os.pread(fd, wanted, offset) if wanted > 0 else b""
    finally:
        os.close(fd)
    truncated = len(data) > length
    data = data[:length]
    try:
        content, encoding = data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        content, encoding = base64.b64encode(data).decode("ascii"), "base64"
    return Reply(
        {
            "path": str(place.view),
            "size": status.st_size,
            "offset": offset,
            "content": content,
            "encoding": encoding,
            "truncated": truncated,
        },
        text=data,
    )


def run() -> int:
    return core_main("fs.read", main_parameter("path"), read)
