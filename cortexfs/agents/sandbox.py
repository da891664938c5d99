"""The sandbox an agent terminal's shell runs in (SPEC A-1, P-4, T-5).

bubblewrap, then setpriv, then ``/ctx/bin/tsh``.  The sandbox sees:

* ``/ctx``: the agent's view of the storage root (``ctx mount --as AGENT``, the projection of
  T-5), mounted by the terminal and bound here;
* the agent's visible mounts at their targets, read-write or read-only as the mount control
  says — ``/workspace`` among them (A-1) — but never one at, under or above a directory of the
  system the sandbox is made of, nor one whose source now runs through a symbolic link
  (:func:`cortexfs.policy.mounts.mount_problem`): bubblewrap and setpriv run as root until
  setpriv has dropped the privileges, and they load programs, libraries and ``/etc`` files
  from the sandbox.  Each source is opened here, walked from ``/`` one component at a time
  without following a link (:func:`open_mount_sources`), and bubblewrap binds the directory
  open (``--bind-fd``), never a path, which it would resolve itself and so follow a link put
  on the way since the check;
* the system's ``/usr`` and ``/etc`` read-only, a private ``/proc``, ``/dev``, ``/tmp`` and
  ``/run``, and nothing else of the host;
* ``/run/ctx/run.sock``: the terminal's run socket, through which tsh hands each command line
  to the host (tools run there, through the whole authority chain);
* no network, unless the agent's policy allows ``network:default connect`` (P-4).

tsh runs as the agent's uid, gid and exactly its groups, with no capabilities and
``no_new_privs``, in pid, IPC and UTS namespaces of its own.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from cortexfs.agents.view import WORKSPACE, AgentView, terminal_type
from cortexfs.errors import CtxError
from cortexfs.policy.mounts import CTX_TARGET, Mount, mount_problem
from cortexfs.tools.spawn import children_of, session_processes

SANDBOX_RUN_SOCKET = "/run/ctx/run.sock"
SANDBOX_TSH = "/ctx/bin/tsh"
_SANDBOX_PROGRAMS = (b"bwrap", b"setpriv")  # what runs before tsh in the sandbox
_SYSTEM_DIRS = ("/usr", "/etc")
_WALKED = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class BoundSource(NamedTuple):
    """A mount of the agent's, its source open (``O_PATH``) for bubblewrap to bind."""

    mount: Mount
    descriptor: int


def has_workspace(view: AgentView) -> bool:
    return any(m.target == WORKSPACE for m in view.visible_mounts())


def shell_environment(view: AgentView, session: str) -> dict[str, str]:
    """tsh's whole environment: nothing of the host's but ``TERM``; E2BIG, naming what to
    shrink, when the kernel would not start tsh with it (:meth:`AgentView.too_big_to_start`)."""
    environment = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(WORKSPACE) if has_workspace(view) else "/",
        "TERM": terminal_type(),
        "LANG": "C.UTF-8",
        "CTX_AGENT": view.name,
        "CTX_SESSION": session,
        "CTX_PATH": view.ctx_path(),
        "CTX_RUN_SOCKET": SANDBOX_RUN_SOCKET,
    }
    too_big = view.too_big_to_start(environment)
    if too_big is not None:
        raise too_big
    return environment


def shell_command(
    bwrap: str,
    view: AgentView,
    view_dir: Path,
    run_socket: Path,
    sources: Sequence[BoundSource],
) -> list[str]:
    """The command line that starts tsh in the sandbox, by bubblewrap at ``bwrap``:
    ``view_dir`` is where the agent's view is mounted on the host, ``run_socket`` the
    terminal's run socket, ``sources`` the agent's mounts (:func:`open_mount_sources`),
    whose descriptors bubblewrap must inherit."""
    identity = view.identity
    groups = ",".join(str(g) for g in sorted(identity.groups))
    return [
        bwrap, "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
        *_network_isolation(view),
        "--hostname", view.name, "--proc", "/proc", "--dev", "/dev",
        "--tmpfs", "/tmp", "--tmpfs", "/run",
        *_system_binds(),
        "--bind", str(view_dir), "/ctx",
        "--perms", "0755", "--dir", os.path.dirname(SANDBOX_RUN_SOCKET),
        "--bind", str(run_socket), SANDBOX_RUN_SOCKET,
        *_mount_binds(sources),
        "--chdir", str(WORKSPACE) if has_workspace(view) else "/",
        "setpriv", f"--reuid={identity.uid}", f"--regid={identity.gid}",
        f"--groups={groups}" if groups else "--clear-groups",
        "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs",
        "--", SANDBOX_TSH,
    ]  # fmt: skip


def spare_the_sandbox() -> None:
    """In the shell's process, before exec: Ctrl-C and Ctrl-\\ never end the sandbox's own
    processes.  The PTY is nobody's controlling terminal yet: tsh leads a session of its own
    and takes it (so that it can let go of it for a tool to lead, H-5), and asks for SIGINT
    back for itself."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


def sandbox_processes(shell_session: int) -> Iterator[int]:
    """The pids of the sandbox's processes, as ``/proc`` lists them now: those of the session
    ``shell_session`` (bubblewrap's, started as a session leader) and their children, among
    them tsh, which leads a session of its own; one gone meanwhile is left out."""
    in_session = set(session_processes(shell_session))
    yield from in_session
    yield from (pid for pid in children_of(in_session) if pid not in in_session)


def tsh_runs(shell_session: int) -> bool:
    """Whether tsh itself (not bubblewrap or setpriv before it) runs in the sandbox started
    as the leader of ``shell_session``."""
    for pid in sandbox_processes(shell_session):
        try:
            argv = Path("/proc", str(pid), "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # gone meanwhile
        if os.path.basename(argv[0]) not in _SANDBOX_PROGRAMS and SANDBOX_TSH.encode() in argv:
            return True
    return False


def _network_isolation(view: AgentView) -> list[str]:
    """No network in the terminal without ``network:default connect`` (P-4).  tsh reaches
    the host through the run socket, a path, which works from any network namespace."""
    return [] if view.allows("network", "default", "connect") else ["--unshare-net"]


def open_mount_sources(view: AgentView) -> list[BoundSource]:
    """The agent's mounts the sandbox binds, in the order it binds them, each source open.

    Not the storage root's mount (the sandbox gets the projection at ``/ctx`` instead), and
    never one on a system directory: the mount control's reader withholds such a mount
    already, and this holds whatever the view was built from — setpriv runs as root through
    the sandbox's ``/usr``, ``/etc`` and ``/lib``, so a mount there would run its writer's
    code as root.  A mount below another's target comes after it, or the outer one would hide
    it.  ENOENT for a source that is missing, ELOOP for one whose path runs through a link
    now; the caller closes the descriptors (:func:`close_sources`) once bubblewrap has them.
    """
    by_depth = sorted(view.visible_mounts(), key=lambda mount: len(mount.target.parts))
    opened: list[BoundSource] = []
    try:
        for mount in by_depth:
            if mount.target == CTX_TARGET or mount_problem(mount, storage_root=PurePosixPath()):
                continue
            opened.append(BoundSource(mount, _open_source(mount)))
    except BaseException:
        close_sources(opened)
        raise
    return opened


def close_sources(sources: Sequence[BoundSource]) -> None:
    for source in sources:
        os.close(source.descriptor)


def _open_source(mount: Mount) -> int:
    """``mount``'s source, walked from ``/`` one component at a time without following a link:
    what bubblewrap binds is the directory (or file) found here, whatever the path names
    later.  (``O_PATH | O_NOFOLLOW`` opens a link itself rather than failing, so each step is
    looked at before the next.)"""
    where = f"the source {mount.source} of the mount at {mount.target}"
    fd = os.open("/", _WALKED)
    try:
        for part in PurePosixPath(mount.source).parts[1:]:
            try:
                inner = os.open(part, _WALKED, dir_fd=fd)
            except OSError as exc:
                raise CtxError(
                    exc.errno or errno.EIO, f"{where} cannot be opened: {exc.strerror}"
                ) from None
            passed, fd = fd, inner  # rebound before the close: the cleanup after a Ctrl-C
            os.close(passed)  # between the two must not close this one again
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise CtxError(
                    errno.ELOOP,
                    f"{where} runs through a symbolic link ({part}) now; links are never "
                    "followed, so it is not bound",
                )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _mount_binds(sources: Sequence[BoundSource]) -> list[str]:
    binds = []
    for mount, descriptor in sources:
        option = "--bind-fd" if mount.writable else "--ro-bind-fd"
        binds += [option, str(descriptor), str(mount.target)]
    return binds


def _system_binds() -> list[str]:
    binds = []
    for directory in _SYSTEM_DIRS:
        binds += ["--ro-bind", directory, directory]
    for link in ("bin", "lib", "lib64", "sbin"):
        target = f"/{link}"
        if os.path.islink(target):
            binds += ["--symlink", os.readlink(target), target]
        elif os.path.isdir(target):
            binds += ["--ro-bind", target, target]
    return binds
