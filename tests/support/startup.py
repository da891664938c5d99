"""Which modules a ``ctx`` command loads: its start-up is paid on every call or queue step."""

from __future__ import annotations

import os
import subprocess
import sys

# ``ctx ARGS…`` as the console script runs it, then the watched modules it loaded, last on
# stderr.
_CTX_THEN_REPORT = """
import sys
from cortexfs.cli import main
watched = sys.argv[1].split(",")
try:
    main(sys.argv[2:])
except SystemExit:
    pass
print(" ".join(sorted(name for name in watched if name in sys.modules)), file=sys.stderr)
"""


def run_ctx_watching(
    watched: tuple[str, ...], argv: list[str], stdin: str = "", env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``ctx ARGV`` in a fresh interpreter; its result and which of ``watched`` it loaded."""
    call = subprocess.run(
        [sys.executable, "-c", _CTX_THEN_REPORT, ",".join(watched), *argv],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        check=True,
    )
    return call, call.stderr.splitlines()[-1].split()
