"""Fixtures for the acceptance tests: a bootstrapped storage root and an initialised project
queue in a temp dir, made once per test process with ``ctx`` itself and copied per test."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import QueueCLI, clean_env, ctx_run
from tests.support.storage import copy_of_root


@pytest.fixture(scope="session")
def _template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("template") / "storage"
    r = ctx_run("bootstrap", "--storage", root)
    assert r.rc == 0, r
    r = ctx_run("queue", "init", "--project", "proj", env=clean_env(CTX_STORAGE=str(root)))
    assert r.rc == 0, r
    return root


@pytest.fixture
def storage(_template: Path, tmp_path: Path) -> Path:
    """A storage root made by ``ctx bootstrap``, holding the queue of project ``proj``."""
    return copy_of_root(_template, tmp_path / "storage")


@pytest.fixture
def searchable_storage(_template: Path) -> Iterator[Path]:
    """The bootstrapped root, copied where an agent's uid may search it (step 2 of P-5 denies
    a tool whose storage root lies below a directory its uid cannot search)."""
    parent = Path(tempfile.mkdtemp(prefix="ctx-acceptance-root-", dir="/tmp"))
    parent.chmod(0o755)
    root = copy_of_root(_template, parent / "storage")
    yield root
    shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def traversable() -> Iterator[Path]:
    """A directory every uid may search (an agent's uid must reach a storage root in it)."""
    path = Path(tempfile.mkdtemp(prefix="ctx-acceptance-traversable-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def outbox() -> Iterator[Path]:
    """A directory every uid may write, where the tools of agents leave their traces."""
    path = Path(tempfile.mkdtemp(prefix="ctx-acceptance-outbox-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def queue(storage: Path) -> QueueCLI:
    """The queue ``shared/proj/queue`` made by ``ctx queue init --project proj``."""
    return QueueCLI(storage, "proj")


@pytest.fixture
def child() -> Iterator[subprocess.Popen]:
    """A live process that can stand in as a lease holder; killed at teardown."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()
