#!/usr/bin/env python3
"""A ready worker for shell commands: runs ``shell.exec`` jobs only, as an agent (SPEC W-5).

    workers/shell_worker.py --project ci --agent builder [--drain] [--timeout 600]

A job is ``{"tool": "shell.exec", "input": {"cmd": "make test"}}`` (see workers/README.md for
every input field).  Jobs of any other tool are left pending for the workers that run them:
this worker does not claim them.  The options, their limits and the exit statuses are those
of ``ctx queue work --kind shell``.
"""

from __future__ import annotations

from interpreter import ensure_cortexfs

if __name__ == "__main__":
    ensure_cortexfs()
    from cortexfs.cli.work import run_ready_worker

    run_ready_worker("shell", __doc__ or "")
