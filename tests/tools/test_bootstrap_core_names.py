"""``ctx bootstrap`` on a root where a core tool's name holds something else than its own
install of this version (SPEC R-5): an administrator's tool installed before the name became
core is left as it is and reported; what a crash left of bootstrap's own install is
repaired; core tools of another version are told apart from this version's."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

import cortexfs.manual  # noqa: F401  (registers the manual bundle's bootstrap step)
from cortexfs import storage
from cortexfs.tools.core.installed import tools_of_another_version
from tests.support.core_names import (
    install_administrators_tool,
    install_core_tool_of_another_version,
)
from tests.support.storage import copy_of_root

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]
ADMINS_PROGRAM = b"#!/bin/sh\necho the administrator's own\n"


@pytest.fixture
def root(bootstrapped_by_ctx: Path, tmp_path: Path) -> Path:
    return copy_of_root(bootstrapped_by_ctx, tmp_path / "storage")


def install_as_administrator_before_it_was_core(root: Path, name: str, scratch: Path) -> None:
    """What an older ctx left: no core tool at ``name``, and the administrator's own tool
    installed there with 'ctx object install --tier system', which then allowed it."""
    install_administrators_tool(root, name, scratch, ADMINS_PROGRAM)
    with open(root / "tool" / f"{name}.d" / "policy", "a") as policy:
        policy.write(f"allow notes_t tool:{name} execute\n")


@pytest.mark.parametrize("name", ["agent.update", "tsh"])
def test_an_administrators_tool_at_a_core_name_is_left_and_reported(
    root: Path, tmp_path: Path, name: str
) -> None:
    install_as_administrator_before_it_was_core(root, name, tmp_path)
    controls = root / "tool" / f"{name}.d"
    before = {path.name: path.read_bytes() for path in controls.iterdir() if path.is_file()}
    (root / "tool/fs.stat").write_bytes(b"damaged")  # the rest is still repaired

    done = subprocess.run(
        [*CTX, "--storage", str(root), "bootstrap"], capture_output=True, text=True
    )

    assert done.returncode == 1, done.stdout
    assert f"problem   tool/{name} is an administrator's tool (installed from " in done.stdout
    assert "reinstall it under another name" in done.stdout
    assert "ctx: EEXIST: " in done.stderr
    assert (root / "tool" / name).read_bytes() == ADMINS_PROGRAM
    after = {path.name: path.read_bytes() for path in controls.iterdir() if path.is_file()}
    assert after == before
    assert f"allow notes_t tool:{name} execute" in (controls / "policy").read_text()
    assert "repaired  tool/fs.stat" in done.stdout


def test_the_problem_carries_eexist_and_names_the_remedy(root: Path, tmp_path: Path) -> None:
    install_as_administrator_before_it_was_core(root, "agent.update", tmp_path)

    report = storage.bootstrap(root)

    error = report.error()
    assert error is not None and error.errno == errno.EEXIST
    (problem,) = report.problems
    assert str(tmp_path / "agent.update.json") in problem
    assert "then run 'ctx bootstrap' again" in problem
    assert tools_of_another_version(root) == []  # the administrator's is no core tool


@pytest.mark.parametrize("executable_too", [True, False])
@pytest.mark.parametrize("origin", [None, b"{not json", b'{"uid": 0}'])
def test_a_core_tool_whose_origin_a_crash_lost_or_broke_is_repaired(
    root: Path, origin: bytes | None, executable_too: bool
) -> None:
    control = root / "tool/agent.update.d/origin"
    if origin is None:
        control.unlink()
    else:
        control.write_bytes(origin)
    if executable_too:
        (root / "tool/agent.update").write_bytes(b"cut short")

    report = storage.bootstrap(root)

    assert report.problems == []
    assert "tool/agent.update" in report.repaired
    assert json.loads(control.read_text())["manifest"].endswith(
        "cortexfs/tools/core/manifests/agent.update.json"
    )


def test_core_tools_of_another_version_are_told_apart(root: Path, tmp_path: Path) -> None:
    assert tools_of_another_version(root) == []
    install_core_tool_of_another_version(root, "fs.stat", tmp_path)

    assert tools_of_another_version(root) == ["fs.stat"]
    storage.bootstrap(root)
    assert tools_of_another_version(root) == []
