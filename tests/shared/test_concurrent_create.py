"""Two creators of one shared space at once run one after the other (an flock on shared/):
the space never ends up with two groups, a state neither command would leave alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cortexfs import storage
from cortexfs.shared import spaces
from cortexfs.shared.spaces import create_shared_space
from tests.support.locks import wait_for_lock

GROUPS = (4343, 4344)


def ctx_process(root: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "cortexfs", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "CTX_STORAGE": str(root)},
    )


def groups_of_directories(space: Path) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for directory, _, _ in os.walk(space):
        found.setdefault(os.lstat(directory).st_gid, []).append(directory)
    return found


@pytest.fixture
def root(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("gives spaces groups this user is no member of: needs root")
    root = tmp_path / "storage"
    storage.ensure_root_abi(root)  # the root ABI alone: its core tools are not these tests'
    create_shared_space(root, "first")  # the root's shared/ exists, as in a used root
    return root


@pytest.mark.parametrize(
    "second", [["--group", str(GROUPS[1])], []], ids=["another-group", "no-group"]
)
def test_two_creators_at_once_leave_the_space_with_one_group(root: Path, second: list[str]) -> None:
    for round_ in range(12):
        name = f"space{round_}"
        first = ctx_process(root, "shared", "create", name, "--group", str(GROUPS[0]))
        other = ctx_process(root, "shared", "create", name, *second)
        outputs = [process.communicate(timeout=120) for process in (first, other)]
        assert [first.returncode, other.returncode] == [0, 0], outputs
        groups = groups_of_directories(root / "shared" / name)
        assert len(groups) == 1, f"round {round_}: {groups}"


def test_a_creator_waits_for_the_one_that_holds_shared(root: Path) -> None:
    shared = root / "shared"
    holder = subprocess.Popen(["flock", str(shared), "sleep", "30"], start_new_session=True)
    try:
        wait_for_lock(shared, held=True)
        creator = ctx_process(root, "shared", "create", "late", "--group", str(GROUPS[0]))
        time.sleep(1.5)
        assert creator.poll() is None, creator.communicate()
        assert not (shared / "late").exists(), "made while another creator held shared/"
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # flock's child holds the lock too
        holder.wait()
    out, err = creator.communicate(timeout=120)
    assert creator.returncode == 0, out + err
    assert list(groups_of_directories(shared / "late")) == [GROUPS[0]]


def test_a_lock_held_too_long_is_not_waited_for(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever may open shared/ may lock it (an agent's shell.exec too): the host's creation
    waits a while, then goes on without the lock, never fails for it."""
    shared = root / "shared"
    monkeypatch.setattr(spaces, "CREATE_LOCK_WAIT_SECONDS", 0.3)
    holder = subprocess.Popen(["flock", str(shared), "sleep", "30"], start_new_session=True)
    try:
        wait_for_lock(shared, held=True)
        started = time.monotonic()
        create_shared_space(root, "blocked", gid=GROUPS[0])
        waited = time.monotonic() - started
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    assert 0.3 <= waited < 10
    assert list(groups_of_directories(shared / "blocked")) == [GROUPS[0]]
