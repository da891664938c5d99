"""The process of ``ctx mount``: mount :class:`~cortexfs.fuse.mount.StorageFS`, answer the
kernel until told to stop, unmount (SPEC F-1).

libfuse says why a mount fails only in words on standard error; they become a
:class:`~cortexfs.errors.CtxError` with the errno they name, and, when an ordinary user lacks
the privilege to mount, what that user lacks and what to do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import stat
import sys
from pathlib import Path

import pyfuse3

from cortexfs import capabilities
from cortexfs.errors import CtxError, errno_named_in
from cortexfs.fuse.mount import StorageFS
from cortexfs.fuse.projection import Projection


def serve(
    root: Path,
    mountpoint: Path,
    projection: Projection,
    *,
    allow_other: bool,
    command: str = "ctx mount",
) -> None:
    """Mount, answer until SIGTERM, SIGINT, SIGHUP or an unmount, then unmount cleanly.
    ``command`` is the one that makes this mount, for an error to suggest running again
    (as root, say).

    SIGHUP too: a mount started from a terminal ('ctx mount /ctx &') gets it when the terminal
    closes.  The three are held back from the moment the mount exists until they can be
    answered, and again from the first one answered until the unmount is done: dying of one
    in between would leave a dead mount that fails every access with ENOTCONN.  One sent
    again while the mount shuts down (an impatient second ^C) asks for what is under way:
    once the mount is gone they are left held, and this returns for its caller to exit, as
    a mount that ended cleanly (exit 0), not as one killed by the last of them."""
    import trio

    stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    options = set(pyfuse3.default_options) | {"fsname=cortexfs", "subtype=cortexfs"}
    if allow_other:
        options.add("allow_other")
    operations = StorageFS(root, projection)
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    try:
        _mount(operations, mountpoint, options, command)
    except BaseException:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)  # nothing was mounted
        raise

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            async def on_signal() -> None:
                with trio.open_signal_receiver(*stops) as received:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
                    async for _ in received:
                        # Leaving the receiver gives the signals their default action back,
                        # and redelivers any still queued: held, they wait.
                        signal.pthread_sigmask(signal.SIG_BLOCK, stops)
                        pyfuse3.terminate()
                        return

            nursery.start_soon(on_signal)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()
            # Unmounted from outside: held from here on too.
            signal.pthread_sigmask(signal.SIG_BLOCK, stops)

    try:
        trio.run(main)
    finally:
        pyfuse3.close(unmount=True)


def _mount(operations: StorageFS, mountpoint: Path, options: set[str], command: str) -> None:
    """``pyfuse3.init``, whose failure is a :class:`CtxError` with the errno libfuse met.

    libfuse says why on standard error (``fuse: failed to open /dev/fuse: Permission
    denied``) and pyfuse3 only raises ``RuntimeError``: the message is caught on its way out
    and becomes the reason, its errno the one it names.  Nothing is mounted then.
    """
    import tempfile

    with tempfile.TemporaryFile() as said:
        saved = os.dup(2)
        os.dup2(said.fileno(), 2)
        try:
            pyfuse3.init(operations, str(mountpoint), options)
            failure = None
        except RuntimeError as exc:
            failure = exc
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        said.seek(0)
        message = " ".join(said.read().decode(errors="replace").split())
    if failure is None:
        if message:
            print(message, file=sys.stderr)  # a warning of libfuse's, on a mount that works
        return
    with contextlib.suppress(Exception):
        pyfuse3.close(unmount=False)  # the session libfuse made for the mount that failed
    reason = message or str(failure)
    code = _errno_named_in(reason)
    needs = _what_mounting_needs(code, command)
    raise CtxError(code, f"cannot mount {mountpoint}: {reason}{needs}")


def _what_mounting_needs(code: int, command: str) -> str:
    """What to do when the kernel refused the mount for want of privilege ('' otherwise): as
    root libfuse opens /dev/fuse itself; anyone else needs /dev/fuse open to them (mode 0666,
    as most distributions ship it) and the setuid fusermount3 that makes the mount for them."""
    if code not in (errno.EACCES, errno.EPERM) or os.geteuid() == 0:
        return ""
    if capabilities.no_new_privs():
        return (
            "; this process runs with no_new_privs set (systemd's NoNewPrivileges=, 'setpriv "
            "--no-new-privs', a container's default), under which the setuid-root fusermount3 "
            f"runs without its privilege: run '{command}' from a session without it, or as root"
        )
    try:
        device = os.stat("/dev/fuse")
        found = f"/dev/fuse is mode {stat.S_IMODE(device.st_mode):04o}, owner uid {device.st_uid}"
    except OSError as exc:
        found = f"/dev/fuse: {exc.strerror}"
    helper = shutil.which("fusermount3")
    if helper is None:
        found += "; fusermount3 is not installed (package fuse3)"
    elif not os.stat(helper).st_mode & stat.S_ISUID:
        found += f"; {helper} is not setuid root"
    return (
        f"; a user other than root mounts with read-write access to /dev/fuse and a setuid-root "
        f"fusermount3 ({found}): run '{command}' as root, or ask an administrator to make "
        "/dev/fuse mode 0666 and fusermount3 setuid root (apt-get install fuse3)"
    )


def _errno_named_in(message: str) -> int:
    """The errno libfuse's ``message`` names (``Permission denied``); EIO when none."""
    if "device not found" in message:  # libfuse's words for a missing /dev/fuse
        return errno.ENODEV
    return errno_named_in(message)
