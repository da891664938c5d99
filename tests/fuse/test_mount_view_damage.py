"""An agent's view while its entry or identity cannot be read (SPEC F-1, T-5): empty, and
served on; back within a second of the repair.  A hand edit of ``identity`` caught half-way,
or the agent's directory renamed for a moment, must not end the mount (nor every terminal's
``/ctx``, which is such a mount)."""

from __future__ import annotations

import errno
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fuse.support import NEEDS_A_MOUNT, as_user, mounted
from tests.tools.support import World

pytestmark = NEEDS_A_MOUNT

ROOT_ABI = ["agent", "bin", "home", "model", "shared", "tool"]
SETTLED = 1.5  # the daemon's half second of the controls' answers, the kernel's, and slack

Restore = Callable[[], None]


def emptied(controls: Path) -> Restore:
    """What an editor that truncates before it writes leaves for a moment."""
    identity = controls / "identity"
    kept = identity.read_bytes()
    identity.write_bytes(b"")
    return lambda: identity.write_bytes(kept)


def not_json(controls: Path) -> Restore:
    identity = controls / "identity"
    kept = identity.read_bytes()
    identity.write_text("garbage\n")
    return lambda: identity.write_bytes(kept)


def removed(controls: Path) -> Restore:
    identity = controls / "identity"
    away = controls.parent / "identity.away"
    identity.rename(away)
    return lambda: away.rename(identity)


def directory_renamed(controls: Path) -> Restore:
    away = controls.with_name("coder.d.away")
    controls.rename(away)
    return lambda: away.rename(controls)


def entry_removed(controls: Path) -> Restore:
    entry = controls.with_name("coder")
    kept = controls.parent / "coder.kept"
    shutil.copy2(entry, kept)
    entry.unlink()
    return lambda: kept.rename(entry)


@pytest.fixture
def coder(world: World) -> World:
    world.agent("coder", tools=["fs.stat"], shared={"team": ["read", "write"]})
    world.allow_tool("fs.stat")
    (world.root / "shared" / "team").mkdir(mode=0o777, exist_ok=True)
    (world.root / "shared" / "team").chmod(0o777)
    return world


@pytest.mark.parametrize("damage", [emptied, not_json, removed, directory_renamed, entry_removed])
def test_a_view_whose_agent_cannot_be_read_is_empty_until_repaired(
    coder: World, damage: Callable[[Path], Restore]
) -> None:
    mountpoint = coder.scratch / "ctx"
    team = mountpoint / "shared" / "team"
    with mounted(coder.root, mountpoint, "--as", "coder") as daemon:
        os.set_blocking(daemon.stderr.fileno(), False)  # type: ignore[union-attr]
        assert "team" in os.listdir(mountpoint / "shared")

        repair = damage(coder.root / "agent" / "coder.d")
        time.sleep(SETTLED)

        assert daemon.poll() is None, "the daemon must go on serving"
        assert os.listdir(mountpoint) == []
        with pytest.raises(OSError) as hidden:
            (mountpoint / "shared").stat()
        assert hidden.value.errno == errno.ENOENT
        refused = as_user(coder.user, f"echo x > {team}/made-while-empty")
        assert refused.returncode != 0
        assert not (coder.root / "shared" / "team" / "made-while-empty").exists()
        said = os.read(daemon.stderr.fileno(), 65536).decode()  # type: ignore[union-attr]
        assert "agent coder's view is empty until it is repaired: E" in said, said

        repair()
        time.sleep(SETTLED)

        assert sorted(os.listdir(mountpoint)) == ROOT_ABI
        wrote = as_user(coder.user, f"echo back > {team}/made-after")
        assert wrote.returncode == 0, wrote.stderr
        said = os.read(daemon.stderr.fileno(), 65536).decode()  # type: ignore[union-attr]
        assert "agent coder's view shows its entries again" in said, said
    assert daemon.returncode == 0, "ended by its SIGTERM, not by a crash"
    assert (coder.root / "shared" / "team" / "made-after").read_text() == "back\n"


def test_a_view_mounted_with_a_malformed_policy_says_so_when_it_starts(coder: World) -> None:
    """F-1, P-8: a policy control that does not parse counts as empty, so the view shows only
    what an empty policy grants; the mount says so on its standard error as it starts,
    naming the control, instead of serving a nearly empty view without a word."""
    policy = coder.root / "agent" / "coder.d" / "policy"
    policy.write_text(policy.read_text() + "allow coder_t shared:team sing\n")
    mountpoint = coder.scratch / "ctx"
    with mounted(coder.root, mountpoint, "--as", "coder") as daemon:
        assert "team" not in os.listdir(mountpoint / "shared")  # as an empty policy grants
        os.set_blocking(daemon.stderr.fileno(), False)  # type: ignore[union-attr]
        said = os.read(daemon.stderr.fileno(), 65536).decode()  # type: ignore[union-attr]
    assert "warning: agent coder's view grants as if this control were empty" in said, said
    assert "policy" in said, said
