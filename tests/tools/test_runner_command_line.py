"""``ctx run``'s own options given ``--`` as their value (SPEC R-1, R-3, T-3): a value given
is a value.  ``--storage=--`` names the directory ``--``, as ``ctx --storage=-- run`` and
every other command's ``--storage`` take it; a name ``--`` is an illegal name; a timeout
``--`` is no number of seconds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs.cli.run import parse_command_line
from tests.support.users import UnprivilegedUser
from tests.tools.support import World, bootstrapped_root

CTX = str(Path(sys.executable).with_name("ctx"))

SAY = """#!/bin/sh
echo "said $*"
"""


@pytest.mark.parametrize(
    "words",
    [
        ["--storage=--", "--agent", "coder", "say"],
        ["--storage", "--", "--agent", "coder", "say"],
        ["--agent", "coder", "--storage=--", "say"],
    ],
)
def test_a_storage_root_given_as_double_dash_is_the_directory_it_names(words: list[str]) -> None:
    options = parse_command_line(words)

    assert (options.storage, options.tool, options.args) == (Path("--"), "say", [])


def test_a_name_given_as_double_dash_is_still_that_name() -> None:
    assert parse_command_line(["--agent=--", "say"]).agent == "--"


def test_a_timeout_given_as_double_dash_is_still_refused(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as ended:
        parse_command_line(["--agent", "coder", "--timeout=--", "say"])

    assert ended.value.code == 2
    assert capsys.readouterr().err.endswith(
        "ctx: EINVAL: Invalid value for '--timeout': invalid value: '--'\n"
    )


@pytest.fixture
def dashes(traversable_tmp: Path, unprivileged_user: UnprivilegedUser) -> World:
    """A world whose storage root is the directory ``--`` of ``traversable_tmp``."""
    root = bootstrapped_root(traversable_tmp / "--")
    workspace = traversable_tmp / "work"
    workspace.mkdir()
    os.chown(workspace, unprivileged_user.uid, unprivileged_user.gid)
    scratch = traversable_tmp / "scratch"
    scratch.mkdir()
    world = World(root, unprivileged_user, workspace, scratch)
    world.install("say", SAY)
    world.agent("coder", tools=["say"])
    world.allow_tool("say")
    return world


@pytest.mark.parametrize("given", [["--storage=--"], ["--storage", "--"]])
def test_a_call_in_a_root_named_double_dash_runs(dashes: World, given: list[str]) -> None:
    done = subprocess.run(
        [CTX, "run", *given, "--agent", "coder", "say", "x"],
        cwd=dashes.root.parent,
        env={"PATH": "/usr/bin:/bin"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert (done.returncode, done.stdout, done.stderr) == (0, "said x\n", "")
    assert [event["type"] for event in dashes.events()] == ["tool_call", "tool_result"]
