"""Every benchmark runs, in a small slice, and reports the figures it promises.

The benchmarks are not timed tests: their figures are read by people (``make bench``), so
nothing here judges a ratio against a target.  What is checked is what would make a figure
meaningless — a script that no longer runs, or a count that no longer matches the protocol.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def run_bench(script: str, *args: str, cwd: Path) -> Any:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args, "--json"],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_queue_lifecycle_counts_the_protocols_fsyncs(tmp_path: Path) -> None:
    figures = run_bench(
        "queue_lifecycle.py",
        *("--jobs", "20", "--rounds", "2", "--big", "2000", "--claims", "50"),
        *("--dir", str(tmp_path)),
        cwd=tmp_path,
    )

    # step for step: docs/queue.md lists these eighteen barriers.
    assert figures["fsyncs_per_job"] == {"file_fsync": 3, "dir_fsync": 15}
    assert len(figures["barriers_us"]) == 18
    # the entries the protocol creates a job (counted through durable.FsOps)
    assert figures["creates_per_job"] == 5 and figures["file_create_us"] > 0
    # of which the two directories of a claim, claimed/J and lease/J
    assert figures["directories_per_job"] == 2 and figures["directory_made_and_removed_us"] > 0
    for rate in ("lifecycle", "persist_queue", "litequeue", "dirq"):
        assert figures[f"{rate}_jobs_per_s"] > 0
    assert set(figures["claim_ms"]["durable"]) == {"1000", "2000"}
    assert list(tmp_path.iterdir()) == [], "the benchmark leaves nothing behind"


def test_barrier_overlap_measures_both_ways(tmp_path: Path) -> None:
    figures = run_bench(
        "barrier_overlap.py",
        *("--pairs", "10", "--jobs", "3", "--rounds", "2", "--dir", str(tmp_path)),
        cwd=tmp_path,
    )

    for figure in ("pair_in_turn_us", "pair_at_once_us", "lifecycle_us"):
        assert figures[figure] > 0
    assert figures["lifecycle_teardown_off_path_us"] > 0
    assert list(tmp_path.iterdir()) == [], "the benchmark leaves nothing behind"


def test_policy_benchmark(tmp_path: Path) -> None:
    figures = run_bench(
        "policy.py", "--rules", "1000", "--decisions", "10000", "--repeat", "1", cwd=tmp_path
    )

    assert figures["rules"] == 1000 and figures["decisions_per_s"] > 0


def test_workers_benchmark(tmp_path: Path) -> None:
    figures = run_bench("workers.py", "--jobs", "10", cwd=tmp_path)

    assert set(figures["jobs_per_s"]) == {"1", "2", "4"}


@pytest.mark.skipif(os.geteuid() != 0, reason="the tools run under another uid: needs root")
def test_tools_benchmark(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline"
    shutil.copytree(BENCH.parent / "cortexfs", baseline / "cortexfs", ignore=_NO_BYTECODE)

    figures = run_bench(
        "tools.py",
        *("--calls", "3", "--cli-calls", "2", "--events", "100", "--baseline", str(baseline)),
        cwd=tmp_path,
    )

    for tool in ("sh.cat", "fs.stat"):
        assert figures[tool]["run_native_ratio"] > 0
        assert figures[tool]["baseline_ctx_run_native_ratio"] > 0
    assert figures["events"]["ratio"] > 0
    assert list((baseline / "cortexfs").glob("__pycache__/*.pyc")), "compiled like the checkout"


_NO_BYTECODE = shutil.ignore_patterns("__pycache__")


def test_cli_startup_benchmark(tmp_path: Path) -> None:
    figures = run_bench("cli_startup.py", "--runs", "1", "--dir", str(tmp_path), cwd=tmp_path)

    assert "ctx queue finish" in figures and figures["click floor"]["over_click"] == 1.0
