"""``ctx bootstrap`` rewrites the agent entries another install of ctx wrote (A-3, R-5).

An entry names the interpreter of the install that wrote it and the root it was written for:
after an upgrade into a new environment, or a root moved elsewhere, it would go on running the
old install on the old path.  Entries of that shape are brought up to date; any other program
an administrator put there is theirs and stays.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs.agents.entries import WrittenEntry, entry_program, written_by_ctx
from tests.support.cli import ctx

REQUEST = {"name": "alice", "label": "alice_t", "tools": ["fs.stat"]}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "storage"
    assert ctx(root, "bootstrap").returncode == 0
    request = tmp_path / "alice.json"
    request.write_text(json.dumps(REQUEST))
    created = ctx(root, "agent", "create", str(request))
    assert created.returncode == 0, created.stderr
    return root


def entry_of_another_install(root: Path, written_for: Path) -> bytes:
    """The entry an install of ctx in /opt/old-venv wrote for a root at ``written_for``."""
    current = entry_program(written_for, "alice")
    _interpreter_line, rest = current.split(b"\n", 1)
    return b"#!/opt/old-venv/bin/python3 -I\n" + rest


def bootstrap_json(root: Path) -> dict[str, list[str]]:
    done = ctx(root, "bootstrap", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def test_an_entry_another_install_wrote_is_rewritten_for_this_one(root: Path) -> None:
    entry = root / "agent/alice"
    entry.write_bytes(entry_of_another_install(root, root))

    report = bootstrap_json(root)

    assert "agent/alice" in report["repaired"]
    assert entry.read_bytes() == entry_program(root, "alice")
    assert entry.stat().st_mode & 0o777 == 0o755
    help_text = subprocess.run([str(entry), "--help"], capture_output=True, text=True)
    assert help_text.returncode == 0 and "agent" in help_text.stdout.lower()


def test_a_root_moved_elsewhere_gets_entries_that_name_its_new_path(root: Path) -> None:
    moved = root.parent / "moved"
    shutil.copytree(root, moved, symlinks=True)
    assert b"'" + str(root).encode() + b"'" in (moved / "agent/alice").read_bytes()

    report = bootstrap_json(moved)

    assert "agent/alice" in report["repaired"]
    assert (moved / "agent/alice").read_bytes() == entry_program(moved, "alice")


def test_the_same_root_through_a_link_keeps_its_entries(root: Path) -> None:
    """``storage/current`` is a link to the root: bootstrap through it and through the real
    path alike leave the entries as they are, never rewriting them from one to the other."""
    current = root.parent / "current"
    current.symlink_to(root.name)
    before = (root / "agent/alice").read_bytes()

    through_link = bootstrap_json(current)
    through_path = bootstrap_json(root)

    assert "agent/alice" not in through_link["repaired"] + through_path["repaired"]
    assert (root / "agent/alice").read_bytes() == before


def test_an_administrators_own_entry_is_left_as_it_is(root: Path) -> None:
    entry = root / "agent/alice"
    own = b"#!/bin/sh\nexec logger 'alice started'\n"
    entry.write_bytes(own)

    report = bootstrap_json(root)

    assert "agent/alice" not in report["repaired"]
    assert entry.read_bytes() == own


def test_an_entry_of_this_install_is_not_touched(root: Path) -> None:
    before = (root / "agent/alice").stat()

    report = bootstrap_json(root)

    assert "agent/alice" not in report["repaired"]
    after = (root / "agent/alice").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_the_shape_is_that_of_the_named_agent_and_nothing_more() -> None:
    root = "/srv/root with 'quote'"
    written = entry_program(Path(root), "alice")
    assert written_by_ctx(written, "alice") == WrittenEntry(sys.executable, root)
    assert not written_by_ctx(written, "bob")
    assert not written_by_ctx(written + b"import os\n", "alice")
    assert not written_by_ctx(written.replace(b"agent', 'start'", b"agent', 'stop'"), "alice")
    assert not written_by_ctx(b"\xff" + written, "alice")


@pytest.mark.parametrize("literal", ["+".join(["1"] * 25_000), "-" * 50_000 + "1"])
def test_a_root_nested_past_the_parsers_limits_is_an_entry_to_rewrite(literal: str) -> None:
    """An entry hand-edited so that its root is an expression nested deep enough to exhaust
    the parser (RecursionError) or its memory runs nothing: one to rewrite, never an error
    out of bootstrap."""
    written = entry_program(Path("/srv/root"), "alice").replace(b"'/srv/root'", literal.encode())
    assert written_by_ctx(written, "alice") == WrittenEntry(sys.executable, "")


def test_bootstrap_warns_of_an_agent_of_which_only_one_half_is_left(root: Path) -> None:
    """An entry without its controls, or controls without their entry (the other removed by
    hand), is no agent and a name ``ctx agent create`` refuses: bootstrap says so, and makes
    nothing up."""
    for name in ("halfa", "halfb"):
        made = ctx(root, "agent", "create", "-", stdin=json.dumps({"name": name, "label": "h_t"}))
        assert made.returncode == 0, made.stderr
    (root / "agent" / "halfa").unlink()
    shutil.rmtree(root / "agent" / "halfb.d")

    booted = ctx(root, "bootstrap", "--json")

    assert booted.returncode == 0, booted.stderr
    assert json.loads(booted.stdout)["warnings"] == [
        "agent/halfa.d is left without agent/halfa, so there is no agent halfa; move "
        "agent/halfa.d away, then 'ctx agent create' makes the agent again",
        "agent/halfb is left without agent/halfb.d, so there is no agent halfb; move "
        "agent/halfb away, then 'ctx agent create' makes the agent again",
    ]
    assert not (root / "agent" / "halfa").exists() and not (root / "agent" / "halfb.d").exists()
