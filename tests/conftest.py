"""Suite-wide setup: keep the claim-order hints of the tests' throwaway queues out of the
machine's cache directory (``ctx queue claim`` keeps one per queue, see docs/queue.md)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest


def pytest_configure(config: pytest.Config) -> None:
    cache = tempfile.mkdtemp(prefix="cortexfs-test-cache-")
    os.chmod(cache, 0o1777)  # processes of the test users keep their hints here too
    config.stash[_CACHE] = cache
    os.environ["XDG_CACHE_HOME"] = cache


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(config.stash.get(_CACHE, ""), ignore_errors=True)


_CACHE = pytest.StashKey[str]()
