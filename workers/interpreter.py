"""Find the Python that has CortexFS, for a worker program started as ``workers/NAME.py``.

The workers' shebang is ``/usr/bin/env python3``: the first ``python3`` on PATH, which on a
fresh machine is the system's, without the package the quickstart installed into the
checkout's ``.venv``.  Rather than fail with ModuleNotFoundError, a worker started that way
runs again under ``.venv/bin/python`` when there is one, and otherwise says what to do.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path


def ensure_cortexfs() -> None:
    """Return when ``cortexfs`` can be imported; else re-execute under the checkout's venv, or
    exit 1 with the reason."""
    if importlib.util.find_spec("cortexfs") is not None:
        return
    venv = Path(__file__).resolve().parent.parent / ".venv"
    venv_python = venv / "bin" / "python"
    # A venv's python is a link to the base interpreter: the prefix tells them apart.
    if venv_python.is_file() and Path(sys.prefix).resolve() != venv.resolve():
        os.execv(venv_python, [str(venv_python), *sys.argv])
    program = os.path.basename(sys.argv[0])
    sys.exit(
        f"{program}: ENOENT: {sys.executable} cannot import cortexfs; run this worker with the "
        "Python that ctx was installed with (the quickstart's .venv/bin/python)"
    )
