"""``ctx mount`` and ``ctx umount``: the storage root at a mount point, with FUSE (SPEC F-1)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import click

from cortexfs.cli.common import (
    handles_errors,
    object_name_argument,
    resolve_storage,
    storage_option,
)
from cortexfs.cli.exits import usage_problem
from cortexfs.cli.params import NonEmptyPath
from cortexfs.errors import CtxError
from cortexfs.printable import shell_word, shell_words


@click.command("mount")
@click.argument("mountpoint", type=NonEmptyPath(path_type=Path))
@click.option(
    "--as", "agent", metavar="AGENT", help="Show the view of AGENT (T-5), not the host's."
)
@storage_option
@handles_errors
def mount(mountpoint: Path, agent: str | None, storage_dir: Path | None) -> None:
    """Mount the storage root at MOUNTPOINT (an empty directory) as the root ABI.

    Runs in the foreground until SIGTERM, SIGINT or SIGHUP ('ctx mount /ctx &' to go on),
    or until 'ctx umount MOUNTPOINT'; either way it unmounts cleanly.  MOUNTPOINT must be
    outside the storage root, and not already a CortexFS mount (EBUSY).  Without --as it shows the
    storage root as it is.  With --as AGENT it shows what AGENT's effective authority lets
    it see: only the tools the whole chain lets it execute, its own agent entry and home,
    the shared spaces its policy lets it read and its uid may enter (and the manual
    bundle), the models it may use, and nothing but bin/ and tool/tsh.d/ when its policy
    grants no mount of the storage root (mount:ctx read); writes only in its home and in
    spaces it may write; it serves AGENT's uid and whoever mounted it, and refuses every
    other uid (EACCES).  The kernel applies the mode bits to each calling process on top.
    fsync through the mount is fsync of the file behind it.  Needs the 'fuse' extra
    (pyfuse3) and /dev/fuse.
    """
    from cortexfs.fuse.mounts import check_mount_point
    from cortexfs.fuse.projection import AgentProjection, Projection

    # A malformed name is a usage error whatever the mount point: it comes first, and the
    # advice for a missing mount point never repeats it.
    name = None if agent is None else object_name_argument(agent, "agent")
    root = resolve_storage(storage_dir)
    try:
        check_mount_point(root, mountpoint)
    except CtxError as error:
        if error.errno == errno.ENOENT and root.is_dir() and not os.path.exists(mountpoint):
            options = [] if agent is None else ["--as", agent]
            given = storage_dir or (click.get_current_context().find_root().obj or {}).get(
                "storage"
            )
            if given is not None:  # the root given on this command line, given again
                options += ["--storage", str(given)]
            raise CtxError(errno.ENOENT, _missing_mount_point(mountpoint, options)) from None
        raise
    projection = Projection() if name is None else AgentProjection(root, name)
    try:
        from cortexfs.fuse.daemon import serve
    except ImportError as exc:
        reason = f"FUSE support is not installed (the 'fuse' extra): {exc}"
        raise CtxError(errno.ENOSYS, reason) from None
    as_agent = [] if agent is None else ["--as", agent]
    again = ["ctx", "mount", str(mountpoint.absolute()), *as_agent]
    serve(root, mountpoint, projection, allow_other=os.geteuid() == 0, command=shell_words(again))


def _missing_mount_point(mountpoint: Path, options: list[str]) -> str:
    """What to do about a mount point that does not exist: make it (with its missing parents,
    ``mkdir -p``), and, for a user who is not root, mount on a directory of their own instead
    (``/ctx`` is a directory only root can make), with the same ``options``.  A symbolic link
    to nothing is no missing name (a mkdir of it fails with EEXIST): the kernel would mount
    where it leads, so that directory is the one to make, or the link the one to remove."""
    made, shown = mountpoint.absolute(), mountpoint  # shown: as the mkdir names it
    reason = f"the mount point {mountpoint} does not exist; create an empty directory there"
    instead = ""
    if os.path.islink(made):
        reason = (
            f"the mount point {mountpoint} is a symbolic link to {os.readlink(made)}, which "
            "does not exist; create the empty directory it leads to"
        )
        instead = ", or remove the link and create an empty directory in its place"
        made = shown = Path(os.path.realpath(made))
    nearest = _nearest_existing(made.parent)
    mkdir = "mkdir" if nearest == made.parent else "mkdir -p"
    make = f"'{mkdir} {shell_word(str(shown))}'"
    if os.geteuid() == 0:
        return f"{reason} ({make}){instead}"
    if not os.access(nearest, os.W_OK | os.X_OK):
        make += f" as root: you may not create entries in {nearest}"
    again = shell_words(["ctx", "mount", *options])
    return (
        f"{reason} ({make}){instead}, or mount on a directory of your own: "
        f"'mkdir -p ~/ctx && {again} ~/ctx'"
    )


def _nearest_existing(directory: Path) -> Path:
    """``directory``, or the nearest of its ancestors that exists: where a ``mkdir -p`` of a
    path under it makes its first entry."""
    while not os.path.lexists(directory) and directory != directory.parent:
        directory = directory.parent
    return directory


@click.command("umount")
@click.argument("mountpoint", type=NonEmptyPath(path_type=Path), required=False)
@handles_errors
def umount(mountpoint: Path | None) -> None:
    """Unmount a storage root mounted with 'ctx mount'; its process then exits.

    Also removes a mount whose process was killed ('Transport endpoint is not connected').
    Anything at MOUNTPOINT that 'ctx mount' did not make is refused (EINVAL).  Without
    MOUNTPOINT, the one storage root mounted with 'ctx mount' by you (by anyone, for root)
    is unmounted: none is ENOENT, several EINVAL (exit 2), naming them.
    """
    from cortexfs.fuse.mounts import the_only_mount, unmount

    if mountpoint is None:
        try:
            mountpoint = the_only_mount()
        except CtxError as exc:
            if exc.errno == errno.EINVAL:
                raise usage_problem(exc) from None
            raise
    unmount(mountpoint)
