"""find_program answers what shutil.which answers for a bare program name, on real PATHs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from cortexfs.tools.host_programs import find_program


@pytest.fixture
def bins(tmp_path: Path) -> dict[str, Path]:
    """Directories holding ``prog`` as: an executable, a file without x bits, a directory."""
    made = {}
    for name, kind in (("exec", "exec"), ("plain", "plain"), ("dir", "dir"), ("other", "exec")):
        directory = tmp_path / name
        directory.mkdir()
        made[name] = directory
        program = directory / "prog"
        if kind == "dir":
            program.mkdir(mode=0o755)
        else:
            program.write_text("#!/bin/sh\n")
            program.chmod(0o755 if kind == "exec" else 0o644)
    return made


@pytest.mark.parametrize(
    "entries",
    [
        ["exec"],
        ["plain", "exec"],
        ["dir", "plain"],
        ["dir", "other", "exec"],
        ["plain", "plain", "other"],
        ["", "exec"],
        [],
    ],
)
def test_the_first_executable_file_on_path_as_shutil_finds_it(
    bins: dict[str, Path], monkeypatch: pytest.MonkeyPatch, entries: list[str]
) -> None:
    monkeypatch.setenv("PATH", os.pathsep.join(str(bins[e]) if e else "" for e in entries))

    assert find_program("prog") == shutil.which("prog")


def test_an_empty_path_finds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")

    assert find_program("sh") is None


def test_an_unset_path_searches_the_system_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PATH", raising=False)

    assert find_program("sh") == shutil.which("sh") is not None
