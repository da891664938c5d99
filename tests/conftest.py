"""Suite-wide setup: keep the claim-order hints of the tests' throwaway queues out of the
machine's cache directory (``ctx queue claim`` keeps one per queue, see docs/queue.md), run
every command with the standard streams a user's shell gives it, and give Hypothesis no
deadline (the suite runs on loaded CI machines; speed is measured in bench/, not here); and
one root ``ctx bootstrap`` made, for the tests that each need a fresh copy of one."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("suite", deadline=None)
settings.load_profile("suite")


def pytest_configure(config: pytest.Config) -> None:
    cache = tempfile.mkdtemp(prefix="cortexfs-test-cache-")
    os.chmod(cache, 0o1777)  # processes of the test users keep their hints here too
    config.stash[_CACHE] = cache
    os.environ["XDG_CACHE_HOME"] = cache
    # Buffered output, as users have it: a command that forgets to flush, or fails at the
    # interpreter's last flush (``> /dev/full``), must not pass because the machine running
    # the tests happens to set PYTHONUNBUFFERED.
    os.environ.pop("PYTHONUNBUFFERED", None)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(config.stash.get(_CACHE, ""), ignore_errors=True)


_CACHE = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def bootstrapped_by_ctx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A storage root ``ctx bootstrap`` made, once per test process: copy it with
    :func:`tests.support.storage.copy_of_root`, never change it."""
    from tests.support.cli import ctx

    root = tmp_path_factory.mktemp("bootstrapped") / "storage"
    done = ctx(root, "bootstrap")
    assert done.returncode == 0, done.stderr
    return root
