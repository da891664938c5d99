#!/usr/bin/env python3
"""A ready worker: runs any requested tool as an agent (SPEC W-1, W-5).

    workers/tool_worker.py --project build --agent runner [--drain] [--concurrency 4]

Every job ``{"tool": NAME, "input": {...}}`` runs through the tool runner: the tool must be on
the agent's CTX_PATH, its input must satisfy the tool's schema, and both the agent's policy and
the tool's own policy must allow it.  The options, their limits and the exit statuses are
those of ``ctx queue work``.  See workers/README.md.
"""

from __future__ import annotations

from interpreter import ensure_cortexfs

if __name__ == "__main__":
    ensure_cortexfs()
    from cortexfs.cli.work import run_ready_worker

    run_ready_worker("tool", __doc__ or "")
