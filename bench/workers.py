"""Worker benchmark: jobs/s with 1, 2 and 4 worker processes, and the worker's overhead.

All in one run, on one storage root, with a trivial tool (a shell script printing ``{}``):

* throughput of 1, 2 and 4 running ``ctx queue work`` processes on the same batch of jobs,
  from its publication to its last job done (ratios against one worker);
* per job, one worker's time against its baseline: the bare queue lifecycle of the same jobs
  (claim + finish, library API, no tool) plus one direct exec of the same tool program.

Usage (as root: the agent runs as 'nobody'):
    python bench/workers.py [--jobs N] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
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
    # As root the agent runs as nobody; anyone else's agents run as themselves, the default,
    # which needs no passwd entry for the uid.
    as_user = ["--user", "nobody"] if os.geteuid() == 0 else []
    ctx(root, "agent", "create", *as_user, str(request))
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
    """Jobs/s of ``processes`` running workers, from the publish of a batch to its last job.

    The workers are started (and have reported ``start``) before the batch is published, so
    the figure is their steady throughput, not their start-up (given separately).
    """
    path = fresh_queue(root, 0)
    env = {**os.environ, "CTX_STORAGE": str(root)}
    command = [*CTX, "queue", "work", "--project", PROJECT, "--agent", AGENT, "--json"]
    logs = [root.parent / f"worker-{processes}-{n}.jsonl" for n in range(processes)]
    pool = [
        subprocess.Popen(command, env=env, stdout=open(log, "w"))  # noqa: SIM115
        for log in logs
    ]
    while not all(log.exists() and '"start"' in log.read_text() for log in logs):
        time.sleep(0.01)
    done_dir = path / "done"
    start = time.perf_counter()
    with Queue.open(path) as q:
        publish_batch(q, [REQUEST] * jobs)
    while len(os.listdir(done_dir)) < 2 * jobs:
        time.sleep(0.02)
    elapsed = time.perf_counter() - start
    for worker in pool:
        worker.send_signal(signal.SIGTERM)
    for worker in pool:
        worker.wait()
    return jobs / elapsed


def one_worker_drain(root: Path, jobs: int) -> tuple[float, float]:
    """Seconds per job of one ``ctx queue work --drain`` on a full queue, start-up excluded,
    and the start-up (a worker finding an empty queue)."""
    env = {**os.environ, "CTX_STORAGE": str(root)}
    command = [*CTX, "queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain"]
    fresh_queue(root, 0)
    start = time.perf_counter()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, check=True)
    startup = time.perf_counter() - start
    fresh_queue(root, jobs)
    start = time.perf_counter()
    subprocess.run(command, env=env, stdout=subprocess.DEVNULL, check=True)
    return (time.perf_counter() - start - startup) / jobs, startup


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
        per_job, startup = one_worker_drain(root, args.jobs)
        lifecycle = bare_lifecycle(root, args.jobs)
        exec_once = direct_exec(program, 100)
    finally:
        shutil.rmtree(base, ignore_errors=True)
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
