"""The walk of a session's levels (cortexfs.shared.level_walk): only the levels named, never
through a link, and one descriptor per level however many entries a level has."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from cortexfs.shared.level_walk import SESSION_LEVELS, walk_levels


def open_below(path: Path) -> int:
    """How many descriptors this process holds on ``path`` or below it."""
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):
            held += os.readlink(f"/proc/self/fd/{fd}").startswith(str(path))
    return held


def test_the_walk_visits_the_session_levels_only_one_directory_open_per_level(
    tmp_path: Path,
) -> None:
    for session in range(300):
        (tmp_path / f"agent/alice/session/s{session}").mkdir(parents=True)
    (tmp_path / "agent/alice/pub/x").mkdir(parents=True)
    (tmp_path / "outside/session/s").mkdir(parents=True)
    (tmp_path / "agent/bob").symlink_to(tmp_path / "outside")
    (tmp_path / "agent/carol").write_text("not a directory\n")
    top = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    most = 0
    try:
        visited = []
        for fd, names in walk_levels(top, SESSION_LEVELS):
            os.fstat(fd)
            visited.append("/".join(names))
            most = max(most, open_below(tmp_path) - 1)  # beyond top
    finally:
        os.close(top)

    assert visited[:4] == [
        "agent",
        "agent/alice",
        "agent/alice/session",
        "agent/alice/session/s0",
    ]
    assert len(visited) == 3 + 300
    assert not [path for path in visited if "pub" in path or "bob" in path or "carol" in path]
    assert most == len(SESSION_LEVELS)
    assert open_below(tmp_path) == 0


def test_a_walk_left_early_closes_what_it_opened(tmp_path: Path) -> None:
    (tmp_path / "agent/alice/session/s1").mkdir(parents=True)
    top = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        walk = walk_levels(top, SESSION_LEVELS)
        for _, names in walk:
            if len(names) == len(SESSION_LEVELS):
                break
        walk.close()
        assert open_below(tmp_path) == 1  # top alone
    finally:
        os.close(top)
