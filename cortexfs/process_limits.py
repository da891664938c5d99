"""Which limit of processes a refused fork met, for the message that says so.

``fork`` (and a thread's ``clone``) answers EAGAIN at a limit of processes, which is one of
two: the user's ``ulimit -u`` (RLIMIT_NPROC, which root is exempt from), or the ``pids.max``
of the cgroup the process runs in (a container's, a systemd unit's ``TasksMax=``), which holds
for root too.  The errno does not say which; :func:`process_limits` names those that apply,
so the message points at the one to raise.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

from cortexfs.cgroups import process_cgroups


def process_limits() -> str:
    """The limits of processes that apply to this process, in a phrase: ``'ulimit -u'
    (4096)``, ``the pids.max of its cgroup (3, /sys/fs/cgroup/pids/job/pids.max)``, both
    joined with "or", or "" when neither is set."""
    found = []
    limit, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if os.geteuid() != 0 and limit != resource.RLIM_INFINITY:
        found.append(f"'ulimit -u' ({limit})")
    cgroup = _tightest_pids_max()
    if cgroup is not None:
        value, path = cgroup
        found.append(f"the pids.max of its cgroup ({value}, {path})")
    return " or ".join(found)


def _tightest_pids_max() -> tuple[int, Path] | None:
    """The smallest ``pids.max`` set on this process's cgroup or one above it, with its file;
    None where none is set or none can be read."""
    tightest: tuple[int, Path] | None = None
    for root, directory in process_cgroups("pids"):
        level = directory
        while True:
            try:
                text = (level / "pids.max").read_text().strip()
            except OSError:
                text = ""
            if text.isdigit() and (tightest is None or int(text) < tightest[0]):
                tightest = (int(text), level / "pids.max")
            if level == root:
                break
            level = level.parent
    return tightest


def no_process_could_be_made() -> str:
    """What a refused fork (EAGAIN) met and what mends it, for an error message: the limits
    that apply, by :func:`process_limits`; the system's own (threads-max) or a seccomp filter
    where none does."""
    limits = process_limits()
    if limits:
        return f"no process could be made under {limits}: end some processes, or raise it"
    return (
        "no process could be made: the system's threads (/proc/sys/kernel/threads-max) ran "
        "out, or a seccomp filter refuses clone3"
    )
