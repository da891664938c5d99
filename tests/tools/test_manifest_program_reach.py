"""A program another uid's manifest names must be one that uid could reach, not only read by
the file's own mode bits (SPEC T-8): root installing it must not hand every agent a file in a
directory that uid may not pass.

The manifests are written by a real second uid, in a shared directory it may write (mode 1777,
as /tmp is); the kernel, asked as that uid, confirms what it may read before ``ctx`` judges.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.users import UnprivilegedUser, access_as, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root installs another uid's manifest")

CTX = [sys.executable, "-m", "cortexfs"]
PRIVATE = b"#!/bin/sh\necho private-key-material\n"


def ctx(*arguments: object) -> subprocess.CompletedProcess[str]:
    command = [*CTX, *map(str, arguments)]
    env = {"PATH": "/usr/bin:/bin"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="cortexfs-test-", dir="/tmp"))
    try:
        storage = directory / "storage"
        done = ctx("bootstrap", "--storage", storage)
        assert done.returncode == 0, done.stderr
        yield storage
    finally:
        shutil.rmtree(directory)


@pytest.fixture
def shared(traversable_tmp: Path) -> Path:
    """A directory every uid may write, as /tmp or a team's drop directory is."""
    path = traversable_tmp / "shared"
    path.mkdir()
    path.chmod(0o1777)
    return path


def manifest_text(exec_value: str, name: str = "lint") -> str:
    return json.dumps(
        {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": "Lints the workspace.",
            "schema": {"type": "object"},
            "cap": {"side_effects": False, "network": False},
            "exec": exec_value,
        }
    )


def written_by(user: UnprivilegedUser, manifest: Path, exec_value: str, name: str = "lint") -> Path:
    text = manifest_text(exec_value, name)
    done = run_as(user, ["/bin/sh", "-c", 'cat > "$1"', "sh", str(manifest)], stdin=text)
    assert done.returncode == 0, done.stderr
    assert manifest.stat().st_uid == user.uid
    return manifest


def private_program(directory: Path, mode: int) -> Path:
    """A program of root's, readable by all by its own bits (umask 022), in ``directory``
    of mode ``mode``."""
    directory.mkdir(mode=mode)
    directory.chmod(mode)
    program = directory / "key"
    program.write_bytes(PRIVATE)
    program.chmod(0o755)
    return program


def test_a_program_in_a_directory_its_author_may_not_pass_is_refused(
    shared: Path, root: Path, unprivileged_user: UnprivilegedUser
) -> None:
    program = private_program(shared / "private", 0o700)
    manifest = written_by(unprivileged_user, shared / "m.json", "private/key")
    assert access_as(unprivileged_user, [(str(program), "r")]) == [False]

    checked = ctx("object", "check", manifest)
    installed = ctx("object", "install", "--source", root, "--tier", "system", manifest)

    uid = unprivileged_user.uid
    closed = f"may not pass {shared / 'private'} (uid 0, gid 0, mode 0700)"
    assert checked.returncode == 1
    assert checked.stderr.startswith(f"{manifest}: EACCES: exec: {program}: uid {uid}, "), checked
    assert closed in checked.stderr
    assert installed.returncode == 1
    assert installed.stderr.startswith(f"ctx: EACCES: {manifest}: exec: {program}: "), installed
    assert f"uid {uid}, who owns the manifest {manifest}, {closed}" in installed.stderr
    assert not os.path.lexists(root / "tool" / "lint")


def test_a_directory_above_the_manifests_own_counts_too(
    traversable_tmp: Path, root: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """A drop directory the uid may write, inside a home of mode 0700 it may not pass."""
    home = traversable_tmp / "home"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    drop = home / "drop"
    drop.mkdir()
    drop.chmod(0o1777)
    program = drop / "key"
    program.write_bytes(PRIVATE)
    program.chmod(0o755)
    manifest = drop / "m.json"
    manifest.write_text(manifest_text("key"))
    os.chown(manifest, unprivileged_user.uid, unprivileged_user.gid)
    assert access_as(unprivileged_user, [(str(program), "r")]) == [False]

    installed = ctx("object", "install", "--source", root, "--tier", "system", manifest)

    assert installed.returncode == 1
    assert f"may not pass {home} (uid 0, gid 0, mode 0700)" in installed.stderr
    assert not os.path.lexists(root / "tool" / "lint")


def test_a_program_its_author_may_reach_through_a_directory_it_may_not_list_is_installed(
    shared: Path, root: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """Search (x) is what passing a directory takes: 0711 lets the uid reach the file."""
    program = private_program(shared / "bin", 0o711)
    manifest = written_by(unprivileged_user, shared / "m.json", "bin/key", name="reachable")
    assert access_as(unprivileged_user, [(str(program), "r")]) == [True]

    installed = ctx("object", "install", "--source", root, "--tier", "system", manifest)

    assert installed.returncode == 0, installed.stderr
    assert (root / "tool" / "reachable").read_bytes() == PRIVATE
