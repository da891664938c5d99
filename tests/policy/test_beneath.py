"""Walks from the top down, never through a link (SPEC P-5): several files judged on one walk."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest

from cortexfs.beneath import walk, walk_to_each, walk_to_listings, walk_with_listing

NAMES = ("identity", "mount", "label")
CASES = [
    "files",
    "no directory",
    "a file for the directory",
    "a link for the directory",
    "a link above",
]


def _layout(top: Path, case: str) -> PurePosixPath:
    agent = top / "agent"
    agent.mkdir()
    directory = agent / "coder.d"
    if case == "files":
        directory.mkdir()
        (directory / "identity").write_text("{}")
        (directory / "label").symlink_to("/etc/passwd")  # a link is reported, not followed
    elif case == "no directory":
        pass
    elif case == "a file for the directory":
        directory.write_text("")
    elif case == "a link for the directory":
        other = top / "elsewhere"
        other.mkdir()
        (other / "identity").write_text("{}")
        directory.symlink_to(other)
    elif case == "a link above":
        os.rename(agent, top / "real-agent")
        agent.symlink_to(top / "real-agent")
    return PurePosixPath("agent/coder.d")


@pytest.mark.parametrize("case", CASES)
def test_walk_to_each_is_the_walk_to_each_file(tmp_path: Path, case: str) -> None:
    directory = _layout(tmp_path, case)
    expected = [(directory / name, walk(tmp_path, directory / name)) for name in NAMES]
    assert walk_to_each(tmp_path, directory, NAMES) == expected


@pytest.mark.parametrize("case", CASES)
def test_walk_with_listing_is_the_walk_to_the_directory_and_to_each_entry(
    tmp_path: Path, case: str
) -> None:
    directory = _layout(tmp_path, case)
    if case == "files":
        os.listdir(tmp_path / directory)  # its atime moves now (relatime), not between walks
    entries, listed = walk_with_listing(tmp_path, directory)
    assert entries == walk(tmp_path, directory)
    if case != "files":
        assert listed is None  # reached no directory: nothing is listed through a link
        return
    assert listed is not None and sorted(listed) == sorted(os.listdir(tmp_path / directory))
    for name, entry in listed.items():
        assert [*entries, entry] == walk(tmp_path, directory / name)


@pytest.mark.parametrize("case", CASES)
def test_walk_to_listings_is_the_walk_with_listing_of_each_directory(
    tmp_path: Path, case: str
) -> None:
    directory = _layout(tmp_path, case)
    if case == "files":
        (tmp_path / directory / "hooks").mkdir()
        (tmp_path / directory / "hooks" / "10-guard").write_text("")
        os.listdir(tmp_path / directory / "hooks")  # its atime moves now, not between walks
        (tmp_path / directory / "linked").symlink_to(tmp_path / directory / "hooks")
    names = ("hooks", "identity", "linked", "missing")
    expected = [walk_with_listing(tmp_path, directory / name) for name in names]
    assert walk_to_listings(tmp_path, directory, names) == expected
