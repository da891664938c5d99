"""The real ``ctx`` command line, run as a user would: a fresh interpreter per command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def ctx(
    root: Path,
    *args: str,
    stdin: str = "",
    env: dict[str, str] | None = None,
    umask: int | None = None,
    timeout: float = 60,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``ctx ARGS…`` against storage root ``root`` (through ``CTX_STORAGE``), text in and out.

    ``stdin`` is all the command reads (never the test runner's own stdin); ``env`` adds to
    this process's environment; ``umask`` is the command's own, ``cwd`` its directory.
    """
    return subprocess.run(
        [sys.executable, "-m", "cortexfs", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, "CTX_STORAGE": str(root), **(env or {})},
        preexec_fn=None if umask is None else (lambda: os.umask(umask)),
        timeout=timeout,
        cwd=cwd,
    )
