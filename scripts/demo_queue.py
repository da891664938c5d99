"""The main job: a project queue surviving a worker killed in the middle of a job.

On the embedded default storage root (or $CTX_STORAGE): create project ``demo``'s queue,
publish a batch of jobs, run two claim/finish worker processes, SIGKILL one of them while it
executes a job, run ``ctx queue recover``, drain the rest, and print what happened.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cortexfs import storage
from cortexfs.queue import Holder, Queue, claim, finish, queue_path

PROJECT = "demo"
JOBS = 24
FAILING = {5, 17}  # these jobs ask to fail, to show the failed/ path


def ctx(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the real command line, echoing it the way a user would type it."""
    print(f"$ ctx {' '.join(args)}", flush=True)
    done = subprocess.run([sys.executable, "-m", "cortexfs", *args], capture_output=True, text=True)
    for line in (done.stdout + done.stderr).splitlines()[:12]:
        print(f"  {line}")
    if check and done.returncode != 0:
        raise SystemExit(f"demo: ctx {' '.join(args)} failed with exit status {done.returncode}")
    return done


def worker(queue_dir: Path, log: Path) -> None:
    """A claim/finish loop: the job 'runs' by sleeping; its start and ack go to ``log``."""
    holder = Holder.for_process(worker=f"demo-worker-{os.getpid()}")
    with Queue.open(queue_dir) as q:
        while (job := claim(q, holder, ttl=60)) is not None:
            record(log, "start", job.job)
            time.sleep(job.request["input"].get("ms", 100) / 1000)
            ok = not job.request["input"].get("fail", False)
            finish(
                q,
                job.job,
                ok,
                {"slept_ms": job.request["input"].get("ms")},
                worker={"pid": os.getpid()},
            )
            record(log, "ack", job.job)


def record(log: Path, event: str, job: str) -> None:
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"{event} {job} {os.getpid()}\n")


def spawn_worker(queue_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", str(queue_dir), str(log)],
        start_new_session=True,
    )


def read_log(log: Path) -> list[tuple[str, str, int]]:
    if not log.exists():
        return []
    rows = []
    for line in log.read_text().splitlines():
        event, job, pid = line.split()
        rows.append((event, job, int(pid)))
    return rows


def main() -> int:
    root = storage.resolve_root(None)
    print(f"CortexFS demo on storage root {root}\n")
    ctx("bootstrap")
    ctx("queue", "init", "--project", PROJECT)
    queue_dir = queue_path(root, PROJECT)

    with tempfile.TemporaryDirectory(prefix="cortexfs-demo-") as scratch:
        batch = Path(scratch) / "jobs.jsonl"
        log = Path(scratch) / "executions.log"
        with open(batch, "w", encoding="utf-8") as f:
            for n in range(JOBS):
                job_input = {"n": n, "ms": 150 + 40 * (n % 4), "fail": n in FAILING}
                f.write(json.dumps({"tool": "demo.sleep", "input": job_input}) + "\n")
        published = ctx("queue", "publish", "--project", PROJECT, "--batch", str(batch))
        names = published.stdout.split()

        print("\nstarting two workers; one is killed with SIGKILL in the middle of a job")
        victim, survivor = spawn_worker(queue_dir, log), spawn_worker(queue_dir, log)
        while sum(1 for e, _, pid in read_log(log) if e == "start" and pid == victim.pid) < 3:
            time.sleep(0.01)
        time.sleep(0.05)  # well inside the 150 ms+ job it has just started
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        killed_job = next(j for e, j, pid in reversed(read_log(log)) if pid == victim.pid)
        print(f"  killed worker {victim.pid} while it was executing {killed_job}")
        survivor.wait()
        print(f"  worker {survivor.pid} drained what it could and exited\n")

        ctx("queue", "status", "--project", PROJECT)
        ctx("queue", "recover", "--project", PROJECT)
        print("\ndraining the rest with a fresh worker")
        spawn_worker(queue_dir, log).wait()
        ctx("queue", "recover", "--project", PROJECT)

        rows = read_log(log)
    return summarise(queue_dir, names, rows, killed_job)


def summarise(
    queue_dir: Path, names: list[str], rows: list[tuple[str, str, int]], killed: str
) -> int:
    done = {
        n
        for n in names
        if (queue_dir / "done" / n).exists() and (queue_dir / "done" / f"{n}.result").exists()
    }
    failed = {
        n
        for n in names
        if (queue_dir / "failed" / n).exists() and (queue_dir / "failed" / f"{n}.result").exists()
    }
    starts: dict[str, int] = {}
    executed_after_ack = 0
    acked: set[str] = set()
    for event, job, _ in rows:
        if event == "start":
            starts[job] = starts.get(job, 0) + 1
            executed_after_ack += job in acked
        else:
            acked.add(job)
    rerun = sorted(j for j, count in starts.items() if count > 1)
    lost = len(names) - len(done) - len(failed)
    table = [
        ("published", len(names)),
        ("done", len(done)),
        ("failed (asked to fail)", len(failed)),
        ("re-run after recovery", len(rerun)),
        ("executed after their finish was acknowledged", executed_after_ack),
        ("lost", lost),
    ]
    print("\nsummary")
    print("  " + "-" * 56)
    for label, value in table:
        print(f"  {label:<46}{value:>10}")
    print("  " + "-" * 56)
    if rerun:
        print(f"  re-run: {', '.join(rerun)} (the job the killed worker held: {killed})")
    healthy = lost == 0 and executed_after_ack == 0 and done.isdisjoint(failed)
    print("  result: every published job finished exactly once" if healthy else "  result: FAILED")
    return 0 if healthy else 1


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        worker(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(main())
