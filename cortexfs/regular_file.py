"""Reading a small regular file the way CortexFS reads controls and settings, and any input
within a limit.

:func:`read_regular_file`: never waiting on a FIFO put in the file's place (``O_NONBLOCK``),
never following a final symbolic link unless asked, never reading past a limit, and the type
checked on the descriptor itself: a file object made from a descriptor of a directory refuses
it with a bare ``EISDIR`` naming nothing, before any check of ours could run.

:func:`read_up_to`: at most one byte past a limit from any descriptor — a pipe, standard
input, ``/dev/zero`` given as a file — so that a source that never ends is refused once it
passed the limit instead of filling memory.

The limits of the host-owned files every authority decision reads, so that a file grown
sparse to gigabytes (anyone who may write one control could do it) costs a few milliseconds
and is refused with EFBIG, not read whole into memory:

* :data:`MAX_POLICY_BYTES` (16 MiB) — a policy: an agent's, a tool's or a model's own, or a
  FILE given to ``ctx policy check``/``query``.  ``ctx agent create`` writes one rule per
  grant, and a 256 KiB request of short tool names makes a few MiB of rules;
* :data:`MAX_CONTROL_BYTES` (1 MiB) — any other control: an agent's identity, label and
  mount table (written from a request of at most 256 KiB), a tool's name, description,
  schema, cap, status, program, mcp and origin (written from a manifest of at most 1 MiB;
  ``ctx object install`` refuses a manifest whose controls would come out larger).
"""

from __future__ import annotations

import errno
import os
import stat

from cortexfs.readiness import readable

MAX_POLICY_BYTES = 16 * 1024 * 1024
MAX_CONTROL_BYTES = 1024 * 1024


def read_regular_file(
    path: str | os.PathLike[str],
    limit: int,
    *,
    follow_link: bool = False,
    owner: int | None = None,
    dir_fd: int | None = None,
) -> bytes:
    """The contents of the regular file at ``path`` (relative to ``dir_fd`` when given), at
    most ``limit`` bytes, of which no more than one byte past is ever read.

    OSError as ``open`` raises it (ENOENT, EACCES; ELOOP for a symbolic link unless
    ``follow_link``); EINVAL when it is not a regular file; EPERM when ``owner`` is given and
    the file (a link's target, when followed) belongs to another uid; EFBIG when it holds
    more than ``limit`` bytes.  Callers turn these into their own sentences.
    """
    data, _ = read_regular_file_and_status(
        path, limit, follow_link=follow_link, owner=owner, dir_fd=dir_fd
    )
    return data


def read_regular_file_and_status(
    path: str | os.PathLike[str],
    limit: int,
    *,
    follow_link: bool = False,
    owner: int | None = None,
    dir_fd: int | None = None,
) -> tuple[bytes, os.stat_result]:
    """:func:`read_regular_file`, with the ``fstat`` of the descriptor the bytes were read
    from: whose file they are and who else may read it, judged on that very file rather than
    on whatever the name holds a moment later."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_link else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno != errno.ENXIO:
            raise
        # What open refuses so is a socket (or a device without its driver): no regular file
        # either, said as for a directory or a FIFO rather than as "No such device".
        raise OSError(errno.EINVAL, "not a regular file", os.fspath(path)) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
        if owner is not None and st.st_uid != owner:
            raise OSError(errno.EPERM, f"owned by uid {st.st_uid}", os.fspath(path))
        data = read_up_to(fd, limit)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
    return data, st


def read_up_to(fd: int, limit: int) -> bytes:
    """What descriptor ``fd`` holds from where it is, but never more than ``limit + 1`` bytes:
    a result longer than ``limit`` tells the caller the source is over its limit without the
    rest of it ever being read.  OSError as ``os.read`` raises it (EISDIR for a directory)."""
    chunks, remaining = [], limit + 1
    while remaining > 0:
        try:
            chunk = os.read(fd, min(remaining, _CHUNK))
        except BlockingIOError:  # a non-blocking pipe, empty for now: not its end
            readable([fd], None)
            continue
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


_CHUNK = 1 << 20  # no buffer of a whole limit for an input that may hold a few bytes
