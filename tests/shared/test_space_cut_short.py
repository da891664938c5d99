"""``ctx shared create`` cut short by a disk without inodes: it names what it made, which is
kept, and says that running it again completes the space, which it does (X-1).  Needs root."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.support.exhaustion import empty, fill_to, inode_limited_tmpfs, run_ctx
from tests.tools.support import bootstrapped_root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")

SPACE_GROUP = "1001"


def test_a_space_cut_short_says_that_running_again_completes_it(traversable_tmp: Path) -> None:
    with inode_limited_tmpfs(traversable_tmp / "disk") as disk:
        root = bootstrapped_root(disk / "st")
        space = root / "shared/q"
        cut_short = 0
        for free in range(16):
            fill = fill_to(disk, free)
            first = run_ctx(root, "shared", "create", "q", "--group", SPACE_GROUP)
            made_some = os.path.lexists(space)
            empty(fill)
            again = run_ctx(root, "shared", "create", "q", "--group", SPACE_GROUP)
            complete = run_ctx(root, "shared", "create", "q", "--group", SPACE_GROUP)
            shutil.rmtree(space)

            assert again.returncode == 0, (free, again.stderr)
            assert complete.stdout == f"nothing to do: {space} is complete\n", (free, complete)
            if first.returncode == 0:
                continue
            cut_short += 1
            assert first.stderr.startswith(
                f"ctx: ENOSPC: shared space {space} could not be completed: No space left on "
                "device (at "
            ), (free, first.stderr)
            made = f"; made {space}" if made_some else "; nothing was made: "
            assert made in first.stderr, (free, first.stderr)
            assert first.stderr.endswith(
                "free space or inodes on that filesystem, then run 'ctx shared create q "
                f"--storage {root}' again, which completes it\n"
            ), (free, first.stderr)
        assert cut_short >= 5, cut_short
