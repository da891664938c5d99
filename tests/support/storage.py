"""Real storage roots laid out the way the authority chain reads them (SPEC A-3, T-1, P-5).

Everything is an ordinary file or directory with an explicit mode, written as the host
(root) would write it: the controls an agent must not change are root-owned and ``0644``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from cortexfs.storage import ensure_root_abi
from cortexfs.tools.core.launcher import render_ctxterm

EXECUTABLE = 0o755
CONTROL = 0o644
AGENT_ENTRY = "#!/bin/sh\nexit 0\n"


@pytest.fixture
def traversable_tmp() -> Iterator[Path]:
    """A temporary directory every user may search (``tmp_path`` is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="cortexfs-test-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


@contextlib.contextmanager
def small_tmpfs(mountpoint: Path, size: str, mode: int | None = None) -> Iterator[Path]:
    """A tmpfs of ``size`` (``1m``, ``8m``…; its top directory ``mode``, else 1777) mounted at
    ``mountpoint``, which is made here, for the block: a disk to fill, or to remount
    read-only, or one where what a test makes by the thousand neither waits on nor slows the
    disk of others.  The test is skipped where no tmpfs can be mounted (not root, a container
    without the right)."""
    mountpoint.mkdir()
    options = f"size={size}" + ("" if mode is None else f",mode={mode:04o}")
    mount = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mountpoint)]
    if subprocess.run(mount).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", "-l", str(mountpoint)], check=False)


def copy_of_root(template: Path, root: Path) -> Path:
    """``root``, a copy of the bootstrapped root ``template`` as bootstrap would have made it
    there: a bootstrap costs about ten times what a copy of its root costs, and most tests
    need a fresh root, not a bootstrap.  A bootstrapped root holds no hard link, special file
    or extended attribute, and names itself in one place only: ``bin/ctxterm``'s default
    storage root, written again for the copy."""
    shutil.copytree(template, root, symlinks=True)
    ctxterm = root / "bin" / "ctxterm"
    if ctxterm.is_file():
        ctxterm.write_bytes(render_ctxterm(root))
    return root


def make_root(parent: Path) -> Path:
    """A storage root with the six root entries (R-2), each ``0755``."""
    root = parent / "storage"
    ensure_root_abi(root)
    for entry in (root, *root.iterdir()):
        entry.chmod(0o755)
    return root


def write(path: Path, text: str, mode: int = CONTROL) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


def add_agent(
    root: Path,
    name: str,
    *,
    uid: int,
    gid: int,
    groups: Sequence[int] = (),
    label: str | None = None,
    policy: str = "",
    mounts: Sequence[Sequence[str]] | None = None,
) -> Path:
    """``agent/<name>`` and its controls; returns the control directory ``agent/<name>.d``.

    The label defaults to ``<name>_t`` and the mounts to the whole storage root, read-only,
    at ``/ctx``.
    """
    write(root / "agent" / name, AGENT_ENTRY, EXECUTABLE)
    controls = root / "agent" / f"{name}.d"
    controls.mkdir(mode=EXECUTABLE)
    controls.chmod(EXECUTABLE)
    identity = {"uid": uid, "gid": gid, "groups": list(groups)}
    write(controls / "identity", json.dumps(identity))
    write(controls / "label", f"{label or name + '_t'}\n")
    write(controls / "policy", policy)
    table = [[str(root), "/ctx", "ro"]] if mounts is None else [list(m) for m in mounts]
    write(controls / "mount", json.dumps(table))
    return controls


def add_tool(
    root: Path, name: str, *, policy: str, location: str = "tool", mode: int = EXECUTABLE
) -> Path:
    """``<location>/<name>`` (a shell script printing its input) and its ``.d/policy``."""
    directory = root / location
    tool = write(directory / name, "#!/bin/sh\ncat\n", mode)
    write(directory / f"{name}.d" / "policy", policy)
    for parent in (directory, *directory.parents):
        if parent == root:
            break
        parent.chmod(EXECUTABLE)
    (directory / f"{name}.d").chmod(EXECUTABLE)
    return tool


@contextlib.contextmanager
def attribute(path: Path, letter: str) -> Iterator[None]:
    """``path`` with the attribute ``letter`` (``i`` immutable, ``a`` append-only) for the
    block; the test is skipped where chattr does not work (needs root and a filesystem that
    keeps attributes)."""
    made = subprocess.run(["chattr", f"+{letter}", str(path)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +{letter} is not available here: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", f"-{letter}", str(path)], check=False)
