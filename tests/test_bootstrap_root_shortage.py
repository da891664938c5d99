"""``ctx bootstrap`` on a filesystem that runs out of inodes while the storage root's own
directories are made (SPEC R-5, ``ctx bootstrap --help``): what was made is named, the
shortage is the report's problem naming the directory by its full path, and the run ends with
the ``ctx: ENOSPC: …`` line and exit 1, in text and in ``--json``; given inodes, the next run
completes the root.

A real tmpfs of a few inodes (``nr_inodes``), which needs root to mount.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import cortexfs.bootstrap_steps  # noqa: F401  (every step bootstrap runs)
from cortexfs import storage
from tests.support.cli import ctx
from tests.support.storage import traversable_tmp as traversable_tmp


@pytest.fixture
def few_inodes(traversable_tmp: Path) -> Iterator[Path]:
    """A tmpfs of six inodes (its own top directory among them): room for five directories."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    disk = traversable_tmp / "disk"
    disk.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=6,mode=0755", "tmpfs", str(disk)]
    if subprocess.run(mount).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _lines(stdout: str, kind: str) -> list[str]:
    return [line.split(None, 1)[1] for line in stdout.splitlines() if line.startswith(kind)]


def test_the_entries_made_before_the_inodes_ran_out_are_named_and_the_next_run_completes(
    few_inodes: Path,
) -> None:
    root = few_inodes / "s"

    cut = ctx(root, "bootstrap")
    as_json = ctx(root, "bootstrap", "--json")  # home/ and shared/ still cannot be made
    subprocess.run(["mount", "-o", "remount,nr_inodes=4000", str(few_inodes)], check=True)
    completed = ctx(root, "bootstrap")

    assert cut.returncode == 1, cut
    assert "Traceback" not in cut.stderr, cut.stderr
    assert _lines(cut.stdout, "created") == [str(root), "bin", "tool", "agent", "model"]
    [problem] = _lines(cut.stdout, "problem")
    assert problem.startswith(f"home: ENOSPC: cannot create {root}/home: No space left"), problem
    assert "0 inodes free" in problem and "free inodes on that filesystem" in problem, problem
    assert cut.stderr.startswith(f"ctx: ENOSPC: bootstrap of {root} left 1 problem "), cut.stderr
    report = json.loads(as_json.stdout)
    assert as_json.returncode == 1 and report["error"] == "ENOSPC" and report["errno"] == 28
    assert report["created"] == [] and report["problems"] == [problem], report
    assert report["message"] in as_json.stderr, as_json
    assert completed.returncode == 0, completed
    assert _lines(completed.stdout, "created")[:2] == ["home", "shared"], completed.stdout
    assert sorted(os.listdir(root)) == sorted(storage.ROOT_ENTRIES)


def test_the_directories_above_the_root_made_before_the_inodes_ran_out_are_named(
    few_inodes: Path,
) -> None:
    """Five directories fit: ``a/b/c/d/e`` is made, the root ``s`` below it is not."""
    above = ["a", "b", "c", "d", "e"]
    root = few_inodes.joinpath(*above, "s")

    cut = ctx(root, "bootstrap", "--json")

    assert cut.returncode == 1, cut
    report = json.loads(cut.stdout)
    made = [str(few_inodes.joinpath(*above[:depth])) for depth in range(1, len(above) + 1)]
    assert report["created"] == made, report
    [problem] = report["problems"]
    assert problem.startswith(f"{root}: ENOSPC: cannot create {root}: No space left"), problem
    assert report["error"] == "ENOSPC" and not root.exists()


def test_the_library_caller_is_given_the_shortage_with_what_was_made(few_inodes: Path) -> None:
    """:func:`storage.ensure_root_abi` (``ctx shared create``'s way to the root's entries)
    stops on the shortage as an error naming the full path; :func:`storage.bootstrap`
    returns it as the report's problem, beside what was created."""
    cut = storage.bootstrap(few_inodes / "s")
    with pytest.raises(storage.RootDirectoriesCutShort) as short:
        storage.ensure_root_abi(few_inodes / "s")

    assert cut.created == [str(few_inodes / "s"), "bin", "tool", "agent", "model"]
    assert cut.problems[0].startswith("home: ENOSPC: ") and len(cut.problems) == 1
    assert cut.error() is not None and cut.error().errno == 28
    assert str(short.value).startswith(f"ENOSPC: cannot create {few_inodes}/s/home: ")
    assert short.value.report.created == []
