"""``ctx bootstrap`` and a space's tier whose lock another uid holds (T-8, R-5).

A member of a space whose ``tool/`` is group-writable (02770, as older versions made it) may
put a lock file of its own at ``.install-lock`` and hold it for ever.  Bootstrap repairs the
system tier and its core tools first, reports such a lock file as in the way without waiting
for it, and goes on with the other tiers; a lock file of root's that others may open (made so
by hand) is waited for a bounded time and reported with the holder's pid."""

from __future__ import annotations

import errno
import json
import time
from pathlib import Path

import pytest

from cortexfs.errors import CtxError
from cortexfs.locks import LOCK_FILE
from cortexfs.tools.install import TOOL_KIND
from cortexfs.tools.pairs import repair_staged
from tests.support.users import UnprivilegedUser, run_as
from tests.tools.held_locks import ctx, held_by
from tests.tools.support import World

LEFTOVER = ".probe~0123456789ab~entry"  # what an interrupted install leaves (pairs.py)


def legacy_space(world: World, name: str) -> Path:
    """The ``tool/`` of space ``name``, group-writable by the test user's group as an older
    version made it, its lock file made by bootstrap (root's, 0600)."""
    created = ctx(world.root, "shared", "create", name, "--group", str(world.user.gid))
    assert created.returncode == 0, created.stderr
    tier = world.root / "shared" / name / "tool"
    tier.chmod(0o2770)
    bootstrapped = ctx(world.root, "bootstrap")
    assert bootstrapped.returncode == 0, bootstrapped.stdout + bootstrapped.stderr
    assert (tier / LOCK_FILE).is_file()
    return tier


def test_a_member_holding_a_spaces_lock_keeps_bootstrap_from_nothing_else(world: World) -> None:
    held = legacy_space(world, "proj")
    later = world.root / "shared/team/tool"
    created = ctx(world.root, "shared", "create", "team", "--group", str(world.user.gid))
    assert created.returncode == 0, created.stderr
    (later / LEFTOVER).write_text("#!/bin/sh\n")
    tsh = world.root / "tool/tsh"
    tsh.write_bytes(tsh.read_bytes() + b"\n# changed\n")  # bootstrap reinstalls tsh
    # The member may not open root's lock file, but may remove it and hold one of its own.
    removed = run_as(world.user, ["rm", "-f", str(held / LOCK_FILE)])
    assert removed.returncode == 0, removed.stderr

    with held_by(world.user, held / LOCK_FILE):
        started = time.monotonic()
        bootstrapped = ctx(world.root, "bootstrap")
        took = time.monotonic() - started

    output = bootstrapped.stdout + bootstrapped.stderr
    assert took < 8, took  # nothing waited for: the member's lock file is refused at once
    assert bootstrapped.returncode != 0, output
    assert "repaired  tool/tsh" in bootstrapped.stdout, output
    planted = f"{held / LOCK_FILE} belongs to uid {world.user.uid}, not to uid 0, the owner of"
    assert planted in output
    assert f"('rm {held / LOCK_FILE}')" in output
    assert f"{later}/probe: removed what an interrupted install left behind" in output
    assert not (later / LEFTOVER).exists()


def test_a_bounded_repair_of_a_held_directory_says_who_holds_it_and_changes_nothing(
    world: World, traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    tier = traversable_tmp / "tier"
    tier.mkdir()
    (tier / LEFTOVER).write_text("#!/bin/sh\n")
    (tier / LOCK_FILE).touch()
    (tier / LOCK_FILE).chmod(0o666)  # anybody's to lock, as a planted one may be

    with held_by(unprivileged_user, tier / LOCK_FILE) as (holder,):
        started = time.monotonic()
        with pytest.raises(CtxError) as refused:
            repair_staged(tier, TOOL_KIND, wait=0.3)
        took = time.monotonic() - started

    assert refused.value.errno == errno.EAGAIN
    assert f"{tier / LOCK_FILE} is locked by another process (pid {holder})" in (
        refused.value.message
    )
    assert 0.3 <= took < 5, took
    assert sorted(p.name for p in tier.iterdir()) == sorted([LOCK_FILE, LEFTOVER])


def test_the_report_of_a_held_space_is_in_the_json_problems_too(world: World) -> None:
    held = legacy_space(world, "proj")
    removed = run_as(world.user, ["rm", "-f", str(held / LOCK_FILE)])
    assert removed.returncode == 0, removed.stderr

    with held_by(world.user, held / LOCK_FILE):
        bootstrapped = ctx(world.root, "bootstrap", "--json")

    problems = json.loads(bootstrapped.stdout)["problems"]
    assert any("belongs to uid" in str(problem) for problem in problems), problems
