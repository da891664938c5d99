#!/usr/bin/env python3
"""A ready worker for shell commands: runs ``shell.exec`` jobs only, as an agent (SPEC W-5).

    workers/shell_worker.py --project ci --agent builder [--drain] [--timeout 600]

A job is ``{"tool": "shell.exec", "input": {"cmd": "make test"}}`` (see workers/README.md for
every input field).  Jobs of any other tool are left pending for the workers that run them:
this worker does not claim them.
"""

from __future__ import annotations

import sys

from interpreter import ensure_cortexfs

if __name__ == "__main__":
    ensure_cortexfs()
    from cortexfs.worker.program import run_worker

    sys.exit(run_worker("shell", __doc__ or ""))
