"""The command line of the ready worker programs in workers/: options, signals, JSON lines."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cortexfs.errors import CtxError
from cortexfs.queue import queue_path
from cortexfs.storage import resolve_root
from cortexfs.worker.executors import executor_for
from cortexfs.worker.loop import EXIT_ABORTED, Worker, WorkerOptions


def _print_event(event: str, fields: dict[str, Any]) -> None:
    if event in ("finish", "lost", "stop"):
        print(json.dumps({"event": event, **fields}), flush=True)


def run_worker(kind: str, description: str) -> int:
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--project", required=True, help="the queue is shared/PROJECT/queue")
    parser.add_argument("--agent", required=True, help="run every tool as this agent")
    parser.add_argument("--storage", type=Path, help="storage root (default: $CTX_STORAGE, …)")
    parser.add_argument("--session", default="worker", help="session recording the jobs")
    parser.add_argument("--drain", action="store_true", help="exit when the queue is empty")
    parser.add_argument("--max-jobs", type=int, help="exit after claiming N jobs")
    parser.add_argument("--concurrency", type=int, default=1, help="jobs at once")
    parser.add_argument("--timeout", type=float, default=300.0, help="per-job timeout (s)")
    args = parser.parse_args()
    try:
        root = resolve_root(args.storage)
        executor = executor_for(kind, root, args.agent, args.session)
    except CtxError as exc:
        print(f"{Path(sys.argv[0]).name}: {exc}", file=sys.stderr)
        return 1
    options = WorkerOptions(
        drain=args.drain,
        max_jobs=args.max_jobs,
        concurrency=args.concurrency,
        job_timeout=args.timeout,
    )
    worker = Worker(queue_path(root, args.project), executor, options, _print_event)
    worker.install_signal_handlers()
    try:
        summary = worker.run()
    finally:
        executor.close()
    return EXIT_ABORTED if summary.aborted else 0
