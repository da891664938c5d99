"""``ctx session repair`` refuses an events file with another name, as appending does: a hard
link put at the name would have the torn line's cut land in the other file."""

from __future__ import annotations

import subprocess
import sys

from cortexfs.shared.sessions import SessionRef
from tests.tools.support import World

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]
NOT_AN_EVENT_LOG = b"line one\nline two without its newline"


def test_repair_refuses_an_events_file_with_another_name(world: World) -> None:
    world.agent("coder", tools=["fs.stat"])
    world.allow_tool("fs.stat")
    assert world.run("fs.stat", {"path": "/workspace"}).ok
    events = SessionRef.home(world.root, world.user.uid, "coder").events_path
    elsewhere = world.scratch / "notes.txt"  # someone's file, whose last line is no event's
    elsewhere.write_bytes(NOT_AN_EVENT_LOG)
    events.unlink()
    events.hardlink_to(elsewhere)

    done = subprocess.run(
        [*CTX, "--storage", str(world.root), "session", "repair", "coder", "default"],
        capture_output=True,
        text=True,
    )

    assert done.returncode != 0, done.stdout
    assert "EINVAL" in done.stderr
    assert f"{events} is a file with 2 names (hard links); refusing to repair it" in done.stderr
    assert elsewhere.read_bytes() == NOT_AN_EVENT_LOG
