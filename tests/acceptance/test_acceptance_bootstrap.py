"""§1 storage root: where it is (R-1), what its root holds (R-2), and ``ctx bootstrap`` (R-5)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    ROOT_ENTRIES,
    QueueCLI,
    clean_env,
    ctx_run,
    request,
    snapshot,
)

NOBODY = 65534


def root_entries(root: Path) -> set[str]:
    return set(os.listdir(root))


def test_bootstrap_creates_exactly_the_six_root_directories(tmp_path):
    """R-2, R-5: the root ABI is bin/ tool/ agent/ model/ home/ shared/ and nothing else."""
    root = tmp_path / "fresh"
    r = ctx_run("bootstrap", "--storage", root)
    assert r.rc == 0, r
    assert root_entries(root) == ROOT_ENTRIES
    for name in ROOT_ENTRIES:
        assert (root / name).is_dir() and not (root / name).is_symlink(), name


def test_bootstrap_honours_ctx_storage(tmp_path):
    """R-1: CTX_STORAGE names the storage root when --storage is absent."""
    root = tmp_path / "from-env"
    r = ctx_run("bootstrap", env=clean_env(CTX_STORAGE=str(root)))
    assert r.rc == 0, r
    assert root_entries(root) == ROOT_ENTRIES


def test_storage_option_wins_over_ctx_storage(tmp_path):
    """R-1: --storage DIR overrides the storage root.

    # reading: an explicit --storage beats CTX_STORAGE when both are given (the usual
    # command-line-over-environment rule; SPEC names both as overrides of the default).
    """
    from_env, from_opt = tmp_path / "env", tmp_path / "opt"
    r = ctx_run("bootstrap", "--storage", from_opt, env=clean_env(CTX_STORAGE=str(from_env)))
    assert r.rc == 0, r
    assert root_entries(from_opt) == ROOT_ENTRIES
    assert not from_env.exists()


@pytest.fixture
def nobody_home() -> Iterator[Path]:
    """A home directory owned by ``nobody``, reachable by that user."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run ctx as another user")
    home = Path(tempfile.mkdtemp(prefix="ctx-nobody-"))
    home.chmod(0o755)
    os.chown(home, NOBODY, NOBODY)
    yield home
    shutil.rmtree(home)


@pytest.mark.parametrize("xdg", [True, False], ids=["XDG_DATA_HOME", "HOME-local-share"])
def test_non_root_default_root_is_under_the_users_data_home(nobody_home, xdg):
    """R-1: with no configuration a non-root user's root is
    $XDG_DATA_HOME/cortexfs/storage/current, i.e. ~/.local/share/... when XDG_DATA_HOME is unset.
    """
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(nobody_home)}
    if xdg:
        env["XDG_DATA_HOME"] = str(nobody_home / "xdg")
        expected = nobody_home / "xdg" / "cortexfs" / "storage" / "current"
    else:
        expected = nobody_home / ".local" / "share" / "cortexfs" / "storage" / "current"
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    proc = subprocess.run(
        [*as_nobody, *CTX_ARGV, "bootstrap"],
        capture_output=True,
        env=env,
        cwd=nobody_home,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert root_entries(expected) == ROOT_ENTRIES


def test_bootstrap_twice_changes_nothing(tmp_path):
    """R-5: bootstrap is idempotent: a second run succeeds and leaves the same tree."""
    root = tmp_path / "root"
    first = ctx_run("bootstrap", "--storage", root)
    assert first.rc == 0, first
    before = snapshot(root)
    second = ctx_run("bootstrap", "--storage", root)
    assert second.rc == 0, second
    assert snapshot(root) == before
    assert root_entries(root) == ROOT_ENTRIES


def test_bootstrap_repairs_a_missing_root_directory_and_keeps_user_data(storage):
    """R-5: bootstrap repairs a damaged root and never destroys user data."""
    user_files = {
        storage / "home" / "1000" / "notes.txt": b"mine\n",
        storage / "shared" / "project-a" / "data" / "input.csv": b"a,b\n1,2\n",
        storage / "tool" / "my.tool": b"#!/bin/sh\necho hi\n",
    }
    for path, data in user_files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (storage / "model").rmdir()
    (storage / "agent").rmdir()

    r = ctx_run("bootstrap", "--storage", storage)

    assert r.rc == 0, r
    assert root_entries(storage) == ROOT_ENTRIES
    assert (storage / "model").is_dir() and (storage / "agent").is_dir()
    for path, data in user_files.items():
        assert path.read_bytes() == data, path


def test_a_new_project_queue_adds_nothing_at_the_root(storage):
    """R-2: making and using a queue creates nothing at the root: no queue/, audit/, mcp/ or
    registry; the queue lives under shared/<project>/."""
    q = QueueCLI(storage, "newproj")
    assert q.run("init").rc == 0
    q.publish(request())
    assert q.run("recover", "--reconcile").rc == 0
    assert root_entries(storage) == ROOT_ENTRIES
    assert (storage / "shared" / "newproj" / "queue").is_dir()
    assert not (storage / "mcp").exists() and not (storage / "audit").exists()
