"""Worker benchmark: jobs/s with 1, 2 and 4 worker processes, and the worker's overhead.

All in one run, on one storage root, with a trivial tool (a shell script printing ``{}``):

* throughput of ``ctx queue work --drain`` with 1, 2 and 4 worker processes on the same
  number of jobs (ratios against one worker);
* per job, one worker's time against its baseline: the bare queue lifecycle of the same jobs
  (claim + finish, library API, no tool) plus one direct exec of the same tool program.

Usage (as root: the agent runs as 'nobody'):
    python bench/workers.py [--jobs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cortexfs.queue import Holder, Queue, claim, finish, publish_batch, queue_path

PROJECT = "bench"
AGENT = "bencher"
TOOL = "bench.noop"
REQUEST = {"tool": TOOL, "input": {}}
CTX = [sys.executable, "-m", "cortexfs"]


def ctx(root: Path, *args: str) -> str:
    done = subprocess.run(
        [*CTX, *args], capture_output=True, text=True, env={**os.environ, "CTX_STORAGE": str(root)}
    )
    if done.returncode != 0:
        raise SystemExit(f"ctx {' '.join(args)} failed: {done.stderr}")
    return done.stdout


def prepare(base: Path) -> tuple[Path, Path]:
    root = base / "storage"
    ctx(root, "bootstrap")
    program = base / "noop.sh"
    program.write_text("#!/bin/sh\nprintf '{}'\n")
    program.chmod(0o755)
    manifest = base / "noop.json"
    manifest.write_text(
        json.dumps(
            {
                "manifest": 2,
                "kind": "tool",
                "name": TOOL,
                "description": "does nothing, quickly",
                "schema": {"type": "object"},
                "cap": {"side_effects": False, "network": False},
                "exec": str(program),
            }
        )
    )
    ctx(root, "object", "install", "--tier", "system", str(manifest))
    request = base / "agent.json"
    request.write_text(json.dumps({"name": AGENT, "label": "bencher_t", "tools": [TOOL]}))
    user = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    ctx(root, "agent", "create", "--user", user, str(request))
    with open(root / "tool" / f"{TOOL}.d" / "policy", "a") as policy:
        policy.write(f"allow bencher_t tool:{TOOL} execute\n")
    return root, root / "tool" / TOOL


def fresh_queue(root: Path, jobs: int) -> Path:
    path = queue_path(root, PROJECT)
    shutil.rmtree(path, ignore_errors=True)
    ctx(root, "queue", "init", "--project", PROJECT)
    with Queue.open(path) as q:
        publish_batch(q, [REQUEST] * jobs)
    return path


def workers_throughput(root: Path, jobs: int, processes: int) -> float:
    fresh_queue(root, jobs)
    env = {**os.environ, "CTX_STORAGE": str(root)}
    command = [*CTX, "queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain"]
    start = time.perf_counter()
    pool = [subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL) for _ in range(processes)]
    if any(p.wait() != 0 for p in pool):
        raise SystemExit("a worker failed")
    elapsed = time.perf_counter() - start
    done = len([n for n in os.listdir(queue_path(root, PROJECT) / "done") if n.endswith(".result")])
    if done != jobs:
        raise SystemExit(f"only {done} of {jobs} jobs are done")
    return jobs / elapsed


def worker_startup(root: Path) -> float:
    """Seconds a worker takes to start and find an empty queue (subtracted from per-job time)."""
    fresh_queue(root, 0)
    env = {**os.environ, "CTX_STORAGE": str(root)}
    command = [*CTX, "queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain"]
    start = time.perf_counter()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def bare_lifecycle(root: Path, jobs: int) -> float:
    """Seconds per job of claim + finish through the library, no tool."""
    path = fresh_queue(root, jobs)
    holder = Holder.for_process(worker="bench")
    with Queue.open(path) as q:
        start = time.perf_counter()
        while (won := claim(q, holder)) is not None:
            finish(q, won.job, True, {})
        return (time.perf_counter() - start) / jobs


def direct_exec(program: Path, runs: int) -> float:
    start = time.perf_counter()
    for _ in range(runs):
        subprocess.run([str(program)], input=b"{}", capture_output=True, check=True)
    return (time.perf_counter() - start) / runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=400, help="jobs per throughput run")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="cortexfs-bench-workers-", dir="/tmp"))
    base.chmod(0o755)
    try:
        root, program = prepare(base)
        rates = {n: workers_throughput(root, args.jobs, n) for n in (1, 2, 4)}
        startup = worker_startup(root)
        lifecycle = bare_lifecycle(root, args.jobs)
        exec_once = direct_exec(program, 100)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    per_job = (args.jobs / rates[1] - startup) / args.jobs
    baseline = lifecycle + exec_once
    figures = {
        "jobs": args.jobs,
        "jobs_per_s": rates,
        "scaling_2_vs_1": rates[2] / rates[1],
        "scaling_4_vs_1": rates[4] / rates[1],
        "worker_ms_per_job": per_job * 1e3,
        "bare_lifecycle_ms": lifecycle * 1e3,
        "direct_exec_ms": exec_once * 1e3,
        "overhead_vs_baseline": per_job / baseline,
        "worker_startup_s": startup,
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    print(f"worker benchmark, {args.jobs} jobs of a trivial tool, {os.cpu_count()} CPUs")
    for n, rate in rates.items():
        print(f"  {n} worker process{'es' if n > 1 else '  '}  {rate:8.1f} jobs/s   "
              f"{rate / rates[1]:.2f} x one worker")  # fmt: skip
    print(f"  one worker, per job:            {per_job * 1e3:8.2f} ms "
          f"(startup {startup:.2f} s excluded)")  # fmt: skip
    print(f"  baseline: bare lifecycle {lifecycle * 1e3:.2f} ms + direct exec "
          f"{exec_once * 1e3:.2f} ms = {baseline * 1e3:.2f} ms")  # fmt: skip
    print(f"  worker overhead: {per_job / baseline:.2f} x the baseline")
    print(f"  command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
