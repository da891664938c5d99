"""How a manifest and its program are read (SPEC T-8): root installing another uid's manifest
must not become a reader for them.

The program is read once, with the manifest, from below the manifest's directory and never
through a symbolic link; a FIFO is never waited on; a program the manifest's owner could not
read by its mode bits is refused.  Every case runs the real ``ctx`` as root over files that
belong to a real second uid.
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
from typing import Any

import pytest

from cortexfs.tools.install import install_manifest, parse_tier
from cortexfs.tools.manifest import load_manifest
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="root installs another uid's manifest")

CTX = [sys.executable, "-m", "cortexfs"]
PROGRAM = b"#!/bin/sh\necho mine\n"
SECRET = b"root:secret-hash:20228::::::\n"


def ctx(*arguments: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    command = [*CTX, *map(str, arguments)]
    env = {"PATH": "/usr/bin:/bin"}
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)


def document(exec_value: str, name: str = "lint") -> dict[str, Any]:
    return {
        "manifest": 2,
        "kind": "tool",
        "name": name,
        "description": "Lints the workspace.",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": exec_value,
    }


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    """A bootstrapped storage root of root's, shared by the tests that install."""
    directory = Path(tempfile.mkdtemp(prefix="cortexfs-test-", dir="/tmp"))
    try:
        storage = directory / "storage"
        done = ctx("bootstrap", "--storage", storage, timeout=120)
        assert done.returncode == 0, done.stderr
        yield storage
    finally:
        shutil.rmtree(directory)


@pytest.fixture
def secret(traversable_tmp: Path) -> Path:
    """A file of root's that the second uid may not read, as /etc/shadow is."""
    path = traversable_tmp / "secret"
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


@pytest.fixture
def workspace(traversable_tmp: Path, unprivileged_user: UnprivilegedUser) -> Path:
    """A directory of the second uid's, as an agent's workspace is."""
    path = traversable_tmp / "ws"
    path.mkdir()
    path.chmod(0o755)
    os.chown(path, unprivileged_user.uid, unprivileged_user.gid)
    return path


def theirs(path: Path, user: UnprivilegedUser) -> Path:
    os.lchown(path, user.uid, user.gid)
    return path


def their_manifest(workspace: Path, user: UnprivilegedUser, exec_value: str) -> Path:
    path = workspace / "m.json"
    path.write_text(json.dumps(document(exec_value)))
    return theirs(path, user)


def test_an_exec_link_to_a_file_of_roots_is_refused_by_check_and_install(
    workspace: Path, secret: Path, root: Path, unprivileged_user: UnprivilegedUser
) -> None:
    (workspace / "prog").symlink_to(secret)
    theirs(workspace / "prog", unprivileged_user)
    manifest = their_manifest(workspace, unprivileged_user, "prog")

    checked = ctx("object", "check", manifest)
    installed = ctx("object", "install", "--source", root, "--tier", "system", manifest)

    assert checked.returncode == 1
    assert f"{manifest}: ELOOP: exec: {workspace}/prog: prog is a symbolic link (to {secret})" in (
        checked.stderr
    ), checked.stderr
    assert installed.returncode == 1
    assert installed.stderr.startswith(f"ctx: ELOOP: {manifest}: exec: "), installed.stderr
    assert not os.path.lexists(root / "tool" / "lint")


def test_a_linked_directory_on_the_way_is_named_and_not_followed(
    workspace: Path, secret: Path, unprivileged_user: UnprivilegedUser
) -> None:
    (workspace / "bin").symlink_to(secret.parent)
    theirs(workspace / "bin", unprivileged_user)
    manifest = their_manifest(workspace, unprivileged_user, "bin/secret")

    checked = ctx("object", "check", "--json", manifest)

    assert checked.returncode == 1
    [report] = json.loads(checked.stdout)
    assert report["codes"] == ["ELOOP"]
    assert f"bin is a symbolic link (to {secret.parent})" in report["problems"][0]


def test_a_program_its_owner_could_not_read_is_refused_naming_both(
    workspace: Path, root: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """No link at all: a file of root's (mode 0600) put in the workspace."""
    program = workspace / "prog"
    program.write_bytes(SECRET)
    program.chmod(0o600)
    manifest = their_manifest(workspace, unprivileged_user, "prog")

    installed = ctx("object", "install", "--source", root, "--tier", "system", manifest)

    assert installed.returncode == 1
    line = installed.stderr
    assert line.startswith(f"ctx: EACCES: {manifest}: exec: {program} (uid 0, "), line
    assert (
        f"is not readable by uid {unprivileged_user.uid}, who owns the manifest {manifest}" in line
    )
    assert not os.path.lexists(root / "tool" / "lint")


def test_their_own_program_is_installed_with_the_bytes_check_read(
    workspace: Path, root: Path, unprivileged_user: UnprivilegedUser
) -> None:
    program = workspace / "prog"
    program.write_bytes(PROGRAM)
    program.chmod(0o700)
    theirs(program, unprivileged_user)
    manifest = their_manifest(workspace, unprivileged_user, "prog")

    loaded = load_manifest(manifest)
    program.write_bytes(b"#!/bin/sh\necho swapped after the review\n")
    installed = install_manifest(root, loaded, parse_tier(root, "user"))

    assert installed.path.read_bytes() == PROGRAM


@pytest.mark.parametrize("exec_value", ["SECRET", "../SECRET_NAME"])
def test_another_uids_manifest_may_not_name_a_program_outside_its_directory(
    workspace: Path, secret: Path, unprivileged_user: UnprivilegedUser, exec_value: str
) -> None:
    exec_value = exec_value.replace("SECRET_NAME", secret.name).replace("SECRET", str(secret))
    manifest = their_manifest(workspace, unprivileged_user, exec_value)

    checked = ctx("object", "check", manifest)

    assert checked.returncode == 1
    assert f"{manifest}: EACCES: exec: {exec_value} is outside the manifest's directory" in (
        checked.stderr
    ), checked.stderr


def test_an_administrators_own_manifest_keeps_an_absolute_exec_but_not_a_final_link(
    traversable_tmp: Path,
) -> None:
    program = traversable_tmp / "bin" / "lint"
    program.parent.mkdir()
    program.write_bytes(PROGRAM)
    (traversable_tmp / "lint-link").symlink_to(program)
    plain = traversable_tmp / "plain.json"
    plain.write_text(json.dumps(document(str(program))))
    linked = traversable_tmp / "linked.json"
    linked.write_text(json.dumps(document(str(traversable_tmp / "lint-link"))))

    assert load_manifest(plain).read_program() == PROGRAM
    checked = ctx("object", "check", linked)
    assert checked.returncode == 1
    assert "ELOOP" in checked.stderr and f"(to {program})" in checked.stderr


def test_a_fifo_as_manifest_or_program_is_refused_at_once(
    workspace: Path, unprivileged_user: UnprivilegedUser
) -> None:
    fifo_manifest = workspace / "fifo.json"
    os.mkfifo(fifo_manifest)
    os.mkfifo(workspace / "prog")
    manifest = their_manifest(workspace, unprivileged_user, "prog")

    for path, expected in (
        (fifo_manifest, f"{fifo_manifest} is not a regular file (a FIFO, device or directory)"),
        (manifest, f"EINVAL: exec: {workspace}/prog is not a regular file"),
    ):
        checked = ctx("object", "check", path, timeout=20)  # it waited forever on the FIFO
        assert checked.returncode == 1
        assert expected in checked.stderr, checked.stderr


def test_a_huge_program_is_refused_without_being_read_whole(
    workspace: Path, unprivileged_user: UnprivilegedUser
) -> None:
    program = workspace / "prog"
    with open(program, "wb") as sparse:
        sparse.truncate(100 * 1024**3)
    theirs(program, unprivileged_user)
    manifest = their_manifest(workspace, unprivileged_user, "prog")

    checked = ctx("object", "check", manifest, timeout=20)

    assert checked.returncode == 1
    assert f"exec: {program} is larger than " in checked.stderr, checked.stderr
