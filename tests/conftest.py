"""Suite-wide setup: keep the claim-order hints of the tests' throwaway queues out of the
machine's cache directory (``ctx queue claim`` keeps one per queue, see docs/queue.md), run
every command with the standard streams a user's shell gives it, and give Hypothesis no
deadline (the suite runs on loaded CI machines; speed is measured in bench/, not here); one
root ``ctx bootstrap`` made, for the tests that each need a fresh copy of one; and the slice
of the acceptance flows the default suite runs.

**The acceptance flows** (``tests/acceptance/test_acceptance_flows_*.py``) are whole
scenarios, each a user's or an adversary's, of real processes, uids, mounts and namespaces:
more than half of the suite's time.  A run that names no test (``./scripts/test``, CI) takes
a twentieth of their files, a different twentieth at each commit (by the number of commits, so
one commit always runs the same tests), so that the default suite stays within about a quarter
of an hour on two cores; ``--flows=all`` or ``make flows`` runs every one, as does naming their
files.  ``--flows=K/N`` picks slice K of N.  The files left out are not even imported: each
test process would otherwise rewrite their 30 000 asserts (pytest's assertion rewriting) at
every start, a minute and more, with no bytecode cache where ``PYTHONDONTWRITEBYTECODE`` is
set."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

FLOWS_PREFIX = "test_acceptance_flows_"
FLOW_SLICES = 20


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--flows",
        metavar="all|K/N",
        help="which acceptance flow files to run: all, or slice K of N (default, when no test "
        f"is named: a slice of {FLOW_SLICES} that turns with each commit)",
    )


def pytest_report_header(config: pytest.Config) -> str:
    chosen = _flow_slice(config)
    if chosen is None:
        return "acceptance flows: all"
    return f"acceptance flows: slice {chosen[0]} of {chosen[1]} (--flows=all runs every one)"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """True for a flow file outside the slice this run takes; None leaves it to pytest."""
    if not collection_path.name.startswith(FLOWS_PREFIX) or collection_path.suffix != ".py":
        return None
    chosen = _flow_slice(config)
    if chosen is None:
        return None
    number, slices = chosen
    return None if zlib.crc32(collection_path.name.encode()) % slices == number - 1 else True


def _flow_slice(config: pytest.Config) -> tuple[int, int] | None:
    """(K, N) for slice K of N of the acceptance flow files; None for all of them."""
    if _SLICE not in config.stash:
        config.stash[_SLICE] = _chosen_slice(config)
    return config.stash[_SLICE]


def _chosen_slice(config: pytest.Config) -> tuple[int, int] | None:
    chosen = config.getoption("--flows")
    if chosen == "all" or (chosen is None and config.option.file_or_dir):
        return None
    if chosen is None:
        return _commits() % FLOW_SLICES + 1, FLOW_SLICES
    number, _, slices = chosen.partition("/")
    if not (number.isdigit() and slices.isdigit() and 1 <= int(number) <= int(slices)):
        raise pytest.UsageError(f"--flows={chosen}: give 'all' or K/N with 1 <= K <= N")
    return int(number), int(slices)


def _commits() -> int:
    """How many commits lead to this checkout's HEAD; 0 outside a git checkout."""
    counted = subprocess.run(
        ["git", "rev-list", "--count", "HEAD"],
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        check=False,
    )
    return int(counted.stdout) if counted.returncode == 0 and counted.stdout.strip() else 0


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
_SLICE = pytest.StashKey["tuple[int, int] | None"]()


@pytest.fixture(scope="session")
def bootstrapped_by_ctx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A storage root ``ctx bootstrap`` made, once per test process: copy it with
    :func:`tests.support.storage.copy_of_root`, never change it."""
    from tests.support.cli import ctx

    root = tmp_path_factory.mktemp("bootstrapped") / "storage"
    done = ctx(root, "bootstrap")
    assert done.returncode == 0, done.stderr
    return root
