"""Command-line start-up: what each ``ctx`` command costs a shell script, against the floors.

A shell worker runs ``ctx queue claim`` and ``ctx queue finish`` once per job, and a publisher
``ctx queue publish`` once per request, so a command's start-up is paid per job.  Each command
is timed whole (process start to exit) on a bootstrapped root with one project queue, against
two floors measured in the same run, in turns with them:

* **interpreter floor** — the console script's interpreter starting and exiting
  (``python -c pass`` with its site-packages): what any Python command line costs;
* **click floor** — the same interpreter importing click and nothing else: what any command
  built on click costs before it does its own work.

The ratio to the click floor is the figure to watch: 1.0 would be a command that costs nothing
but its framework.  No target; the figures show where a queue step's time goes.

Usage: python bench/cli_startup.py [--runs N] [--dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CTX = str(Path(sys.executable).with_name("ctx"))  # the console script users run
REQUEST = b'{"tool": "fs.stat", "input": {"path": "/"}}\n'


def timed(argv: list[str], env: dict[str, str], stdin: bytes = b"") -> float:
    started = time.perf_counter()
    subprocess.run(argv, input=stdin, env=env, capture_output=True, check=False)
    return time.perf_counter() - started


def commands(project: str) -> dict[str, tuple[list[str], bytes]]:
    """Each command as a user types it; publish and claim add one job each run, finish needs
    a claimed job and so is timed in ``measure`` with the claim it finishes."""
    queue = [CTX, "queue"]
    return {
        "ctx --help": ([CTX, "--help"], b""),
        "ctx queue status": ([*queue, "status", "--project", project], b""),
        "ctx queue list": ([*queue, "list", "--project", project], b""),
        "ctx queue publish": ([*queue, "publish", "--project", project, "-"], REQUEST),
        "ctx queue claim": ([*queue, "claim", "--project", project], b""),
        "ctx queue recover --dry-run": (
            [*queue, "recover", "--project", project, "--dry-run"],
            b"",
        ),
    }


def measure(runs: int, workdir: Path) -> dict[str, dict[str, float]]:
    root = workdir / "storage"
    env = {**os.environ, "CTX_STORAGE": str(root)}
    subprocess.run([CTX, "bootstrap"], env=env, capture_output=True, check=True)
    project = "bench"
    subprocess.run(
        [CTX, "queue", "init", "--project", project], env=env, capture_output=True, check=True
    )
    floors = {
        "interpreter floor": [sys.executable, "-c", "pass"],
        "click floor": [sys.executable, "-c", "import click"],
    }
    samples: dict[str, list[float]] = {name: [] for name in [*floors, *commands(project)]}
    samples["ctx queue finish"] = []
    for _ in range(runs):
        for name, argv in floors.items():
            samples[name].append(timed(argv, env))
        for name, (argv, stdin) in commands(project).items():
            samples[name].append(timed(argv, env, stdin))
        # A job to finish, published and claimed outside the timing (the timed claim above
        # took the timed publish's job).
        subprocess.run(
            [CTX, "queue", "publish", "--project", project, "-"],
            input=REQUEST,
            env=env,
            capture_output=True,
            check=True,
        )
        job = (
            subprocess.run(
                [CTX, "queue", "claim", "--project", project, "--pid", str(os.getpid())],
                env=env,
                capture_output=True,
                check=True,
            )
            .stdout.decode()
            .strip()
        )
        finish = [CTX, "queue", "finish", "--project", project, job, "--ok", "-"]
        samples["ctx queue finish"].append(timed(finish, env, b'{"status": "ok"}'))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    interpreter, click = medians["interpreter floor"], medians["click floor"]
    return {
        name: {
            "ms": seconds * 1000,
            "over_interpreter": seconds / interpreter,
            "over_click": seconds / click,
        }
        for name, seconds in medians.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each command")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    options = parser.parse_args()
    if not options.json:  # the JSON output is one object, for programs to read
        print("command:", " ".join([sys.executable, *sys.argv]), flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="cortexfs-bench-", dir=options.dir))
    try:
        figures = measure(options.runs, workdir)
    finally:
        shutil.rmtree(workdir)
    if options.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"{'command':30} {'median':>10} {'/ interpreter':>14} {'/ click':>8}")
    for name, row in figures.items():
        print(
            f"{name:30} {row['ms']:7.1f} ms {row['over_interpreter']:13.2f}x "
            f"{row['over_click']:7.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
