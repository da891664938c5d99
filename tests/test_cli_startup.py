"""What the click commands load: a shell worker starts ``ctx queue`` once or twice per job.

jsonschema (about 100 ms) is for manifests and agent requests, psutil (about 40 ms) for the
commands that judge or name a lease holder, secrets never (it loads OpenSSL for a token that
``os.urandom`` gives).  ``bench/cli_startup.py`` has the figures.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.startup import run_ctx_watching

WATCHED = ("jsonschema", "psutil", "secrets")
REQUEST = '{"tool": "fs.stat", "input": {"path": "/"}}'


@pytest.fixture
def storage(tmp_path: Path) -> dict[str, str]:
    env = {"CTX_STORAGE": str(tmp_path / "storage")}
    run_ctx_watching(WATCHED, ["queue", "init", "--project", "p"], env=env)
    return env


def test_the_command_list_loads_no_command_library(storage: dict[str, str]) -> None:
    call, loaded = run_ctx_watching(WATCHED, ["--help"], env=storage)

    assert "queue" in call.stdout and "object" in call.stdout
    assert loaded == []


@pytest.mark.parametrize(
    "argv",
    [
        ["queue", "publish", "--project", "p", "-"],
        ["queue", "status", "--project", "p"],
        ["queue", "list", "--project", "p"],
    ],
)
def test_publish_and_reading_an_unleased_queue_load_no_heavy_module(
    storage: dict[str, str], argv: list[str]
) -> None:
    _, loaded = run_ctx_watching(WATCHED, argv, stdin=REQUEST, env=storage)

    assert loaded == []


@pytest.mark.parametrize("command", ["status", "list"])
def test_reading_a_queue_loads_no_hashing_and_no_fuzzy_matching(
    storage: dict[str, str], command: str
) -> None:
    # hashlib names the claim-order hint of a queue (publish and claim use one); difflib
    # suggests a command for a typo.  click asks difflib itself for every short option.
    argv = ["queue", command, "--project", "p"]
    _, loaded = run_ctx_watching(("hashlib", "difflib"), argv, env=storage)

    assert loaded == []


def test_claim_loads_psutil_for_the_holder_and_nothing_else_heavy(storage: dict[str, str]) -> None:
    run_ctx_watching(WATCHED, ["queue", "publish", "--project", "p", "-"], REQUEST, storage)

    call, loaded = run_ctx_watching(WATCHED, ["queue", "claim", "--project", "p"], env=storage)

    assert call.stdout.strip().endswith(".req.json")
    assert loaded == ["psutil"]


def test_finish_names_its_worker_without_psutil(storage: dict[str, str]) -> None:
    run_ctx_watching(WATCHED, ["queue", "publish", "--project", "p", "-"], REQUEST, storage)
    claim, _ = run_ctx_watching(WATCHED, ["queue", "claim", "--project", "p"], env=storage)
    job = claim.stdout.strip()

    finish = ["queue", "finish", "--project", "p", job, "--ok", "-", "--json"]
    _, loaded = run_ctx_watching(WATCHED, finish, stdin='{"answer": 42}', env=storage)

    assert loaded == []
    result = Path(storage["CTX_STORAGE"], "shared", "p", "queue", "done", f"{job}.result")
    assert '"pid_ns"' in result.read_text(), "the result still names the finishing worker"


# ``ctx ARGS...`` as the console script runs it; an exit hook registered before it, and so run
# after its own, reports how many objects the collector would still walk at the teardown.
_LEFT_TO_COLLECT_AT_TEARDOWN = """
import atexit, gc, sys
atexit.register(lambda: print(len(gc.get_objects()), file=sys.stderr))
from cortexfs.cli import main
main(sys.argv[1:])
"""


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"]])
def test_the_teardown_leaves_every_object_to_the_kernel(argv: list[str]) -> None:
    """Walking and freeing the objects of every loaded module one by one at exit costs about
    10 ms of every command, in a process about to end."""
    assert _help_then_last_error_line(_LEFT_TO_COLLECT_AT_TEARDOWN, argv) == "0"


# ``ctx ARGS...`` as the console script runs it, reporting, once it has run (and before the
# exit hooks), how many objects the collector was told to leave alone.
_FROZEN_ONCE_RUN = """
import gc, sys
from cortexfs.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    print(gc.get_freeze_count(), file=sys.stderr)
"""


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"]])
def test_the_objects_of_the_loaded_modules_are_never_collected(argv: list[str]) -> None:
    """Modules make thousands of objects as they load, none of them garbage: walking them
    while they load, and at each full collection after, costs about 4 ms of every command."""
    assert int(_help_then_last_error_line(_FROZEN_ONCE_RUN, argv)) > 1000


def _help_then_last_error_line(script: str, argv: list[str]) -> str:
    """Run ``script`` (ctx's main, and a report on stderr) for a help ``argv``; the help must
    be printed, and the report is the last line of stderr."""
    call = subprocess.run(
        [sys.executable, "-c", script, *argv], capture_output=True, text=True, check=True
    )
    assert "usage:" in call.stdout.lower()
    return call.stderr.splitlines()[-1]
