"""Step 2 agrees with the kernel: mode bits judged for a real non-root uid (SPEC P-5)."""

from __future__ import annotations

import errno
import itertools
import os
from pathlib import Path, PurePosixPath

import pytest

from cortexfs.policy.linux import (
    EXECUTE,
    READ,
    WRITE,
    Identity,
    Kind,
    check_access,
    rwx,
    writable_entries,
)
from tests.support.users import UnprivilegedUser, access_as

# Groups the test user is given for these tests: one supplementary, one it lacks.
SUPPLEMENTARY_GID = 61001
FOREIGN_GID = 61002
FILE_MODES = (0o000, 0o400, 0o040, 0o004, 0o700, 0o070, 0o007, 0o750, 0o705, 0o644, 0o222, 0o111)
DIRECTORY_MODES = (0o700, 0o711, 0o744, 0o755, 0o701, 0o770, 0o707)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set owners and uids")


def identity_of(user: UnprivilegedUser) -> Identity:
    return Identity(user.uid, user.gid, frozenset({SUPPLEMENTARY_GID}))


def kernel_says(user: UnprivilegedUser, questions: list[tuple[str, int]]) -> list[bool]:
    asked = [(path, rwx(access).replace("-", "")) for path, access in questions]
    return access_as(user, asked, [SUPPLEMENTARY_GID])


def test_file_modes_agree_with_the_kernel(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    identity = identity_of(unprivileged_user)
    owners = (unprivileged_user.uid, 0)
    groups = (unprivileged_user.gid, SUPPLEMENTARY_GID, FOREIGN_GID)
    questions, answers = [], []
    for number, (mode, owner, group) in enumerate(itertools.product(FILE_MODES, owners, groups)):
        path = traversable_tmp / f"f{number}"
        path.write_text("#!/bin/sh\n")
        os.chown(path, owner, group)
        path.chmod(mode)
        for access in (READ, WRITE, EXECUTE, READ | WRITE):
            verdict = check_access(
                traversable_tmp, PurePosixPath(path.name), identity, access, Kind.FILE
            )
            questions.append((str(path), access))
            answers.append(verdict.allowed)
    assert answers == kernel_says(unprivileged_user, questions)
    assert True in answers and False in answers


def test_directory_search_and_listing_agree_with_the_kernel(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    identity = identity_of(unprivileged_user)
    questions, answers = [], []
    for number, (mode, group) in enumerate(
        itertools.product(DIRECTORY_MODES, (0, SUPPLEMENTARY_GID))
    ):
        directory = traversable_tmp / f"d{number}"
        (directory / "inner").mkdir(parents=True)
        (directory / "inner" / "file").write_text("data")
        (directory / "inner" / "file").chmod(0o644)
        (directory / "inner").chmod(0o755)
        os.chown(directory, 0, group)
        directory.chmod(mode)
        for relative, access, kind in (
            (f"d{number}/inner/file", READ, Kind.FILE),
            (f"d{number}", READ, Kind.DIRECTORY),
            (f"d{number}", WRITE, Kind.DIRECTORY),
        ):
            verdict = check_access(traversable_tmp, PurePosixPath(relative), identity, access, kind)
            answers.append(verdict.allowed)
            # Listing or changing a directory needs its x as well (check_access adds it).
            kernel_access = access | EXECUTE if kind is Kind.DIRECTORY else access
            questions.append((str(traversable_tmp / relative), kernel_access))
    assert answers == kernel_says(unprivileged_user, questions)


def test_a_refusal_names_what_is_missing(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    identity = identity_of(unprivileged_user)
    (traversable_tmp / "tool").mkdir(mode=0o700)
    (traversable_tmp / "tool").chmod(0o700)
    verdict = check_access(
        traversable_tmp, PurePosixPath("tool/fs.read"), identity, EXECUTE, Kind.FILE
    )
    assert (verdict.allowed, verdict.errno) == (False, errno.EACCES)
    assert verdict.detail == f"search (x) on tool is denied to uid {unprivileged_user.uid}"

    (traversable_tmp / "tool").chmod(0o755)
    verdict = check_access(
        traversable_tmp, PurePosixPath("tool/fs.read"), identity, EXECUTE, Kind.FILE
    )
    assert (verdict.allowed, verdict.errno, verdict.detail) == (
        False,
        errno.ENOENT,
        "tool/fs.read does not exist",
    )

    (traversable_tmp / "tool" / "fs.read").write_text("")
    (traversable_tmp / "tool" / "fs.read").chmod(0o644)
    verdict = check_access(
        traversable_tmp, PurePosixPath("tool/fs.read"), identity, EXECUTE, Kind.FILE
    )
    assert verdict.errno == errno.EACCES
    assert "needs --x but mode 0644, owner 0:0 grants r-- to uid" in verdict.detail


def test_links_are_refused_never_followed(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    identity = identity_of(unprivileged_user)
    (traversable_tmp / "real").mkdir()
    (traversable_tmp / "real" / "fs.read").write_text("")
    (traversable_tmp / "real" / "fs.read").chmod(0o755)
    (traversable_tmp / "tool").symlink_to("real")
    (traversable_tmp / "direct").symlink_to("real/fs.read")
    for relative in ("tool/fs.read", "direct"):
        verdict = check_access(
            traversable_tmp, PurePosixPath(relative), identity, EXECUTE, Kind.ANY
        )
        assert (verdict.allowed, verdict.errno) == (False, errno.EACCES)
        assert "symbolic link" in verdict.detail


def test_the_object_must_be_of_its_kind(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    identity = identity_of(unprivileged_user)
    (traversable_tmp / "fs.read").mkdir(mode=0o755)
    verdict = check_access(traversable_tmp, PurePosixPath("fs.read"), identity, EXECUTE, Kind.FILE)
    assert (verdict.allowed, verdict.detail) == (False, "fs.read is not a regular file")
    (traversable_tmp / "file").write_text("")
    verdict = check_access(traversable_tmp, PurePosixPath("file/below"), identity, READ, Kind.ANY)
    assert (verdict.allowed, verdict.errno) == (False, errno.ENOENT)


def test_writable_entries_are_those_the_agent_could_change(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    identity = identity_of(unprivileged_user)
    controls = traversable_tmp / "agent" / "coder.d"
    controls.mkdir(parents=True)
    policy = PurePosixPath("agent/coder.d/policy")
    (controls / "policy").write_text("")
    (controls / "policy").chmod(0o644)
    assert writable_entries(traversable_tmp, policy, identity) == []
    (controls / "policy").chmod(0o646)
    assert writable_entries(traversable_tmp, policy, identity) == ["agent/coder.d/policy"]
    os.chown(controls, 0, SUPPLEMENTARY_GID)
    controls.chmod(0o775)
    assert writable_entries(traversable_tmp, policy, identity) == [
        "agent/coder.d",
        "agent/coder.d/policy",
    ]
