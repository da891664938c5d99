"""Where a process's cgroups are: its cgroup v2 group and its cgroup v1 group of one
controller, under each place such a hierarchy is mounted on the hosts we run on (the v2 tree
at ``/sys/fs/cgroup`` or, on a hybrid host, ``/sys/fs/cgroup/unified``; a v1 controller at
``/sys/fs/cgroup/<controller>``).
"""

from __future__ import annotations

from pathlib import Path

_TOP = Path("/sys/fs/cgroup")


def process_cgroups(controller: str, pid: int | str = "self") -> list[tuple[Path, Path]]:
    """The cgroups of process ``pid`` that may hold ``controller``'s files, as (the
    hierarchy's mount point, the cgroup's directory): its v2 group (``0::/path``) and its v1
    ``controller`` group, wherever such a hierarchy is mounted; [] when /proc cannot tell."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text(errors="replace").splitlines()
    except OSError:
        return []
    relative = [
        path.lstrip("/")
        for controllers, path in (line.split(":", 2)[1:] for line in lines if line.count(":") >= 2)
        if controllers == "" or controller in controllers.split(",")
    ]
    return [
        (root, root / path)
        for root in (_TOP, _TOP / "unified", _TOP / controller)
        for path in relative
        if (root / path / "cgroup.procs").exists()
    ]


def frozen_cgroup(pid: int) -> Path | None:
    """The cgroup that holds process ``pid`` frozen — by the v2 ``cgroup.freeze`` of its group
    or one above it, or the v1 freezer's ``FROZEN`` state — else None."""
    for _, directory in process_cgroups("freezer", pid):
        for name, frozen in (("cgroup.events", "frozen 1"), ("freezer.state", "FROZEN")):
            try:
                text = (directory / name).read_text()
            except OSError:
                continue
            if frozen in text.splitlines():
                return directory
    return None
