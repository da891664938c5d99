"""``ctx run`` starts once per tool call, so what it imports is part of every call's cost.

Neither its import nor a whole native call may load click (the one command started per call
parses with argparse), jsonschema (common schemas are checked without it), dataclasses and
the inspect module it imports (records on this path are NamedTuples), shutil and the
compression modules it loads (setpriv and unshare are found by cortexfs/tools/host_programs.py,
and ctx run's parser asks for the terminal's width only to print help), or ctypes (loaded
only by the queue calls that need it, and by a root host starting a tool without network on a
Python without ``os.setns``: see cortexfs/tools/offline.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cortexfs import storage
from tests.support.startup import run_ctx_watching
from tests.tools.support import World

HEAVY_MODULES = ("click", "jsonschema", "dataclasses", "inspect", "shutil", "ctypes")

_LOADED = f"sorted(name for name in {HEAVY_MODULES!r} if name in sys.modules)"


def test_importing_ctx_run_loads_no_heavy_module() -> None:
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys, cortexfs.cli.run; print(' '.join({_LOADED}))"],
        capture_output=True,
        text=True,
        check=True,
    )

    assert loaded.stdout.split() == []


def test_a_native_call_loads_no_heavy_module(world: World) -> None:
    world.install("sh.cat", "#!/bin/sh\ncat\n")
    world.agent("coder", tools=["sh.cat"])
    world.allow_tool("sh.cat")
    command = ["run", "--storage", str(world.root), "--agent", "coder", "--native", "sh.cat"]

    call, loaded = run_ctx_watching(HEAVY_MODULES, command, stdin='{"n": 1}\n')

    result = json.loads(call.stdout.splitlines()[-1])
    assert result["type"] == "result" and result["status"] == "ok", result
    assert result["output"] == {"n": 1}
    offline_by_ctypes = os.geteuid() == 0 and not hasattr(os, "setns")  # the agent has no network
    assert loaded == (["ctypes"] if offline_by_ctypes else [])


def test_a_core_tool_loads_no_heavy_module(tmp_path: Path) -> None:
    """Every call of a core tool is a process of its own, started from its zip application."""
    root = tmp_path / "storage"
    storage.bootstrap(root)
    tool = root / "tool" / "fs.stat"
    interpreter = tool.read_bytes().split(b"\n", 1)[0][2:].decode().split()[0]

    call = subprocess.run(
        [interpreter, "-IS", "-X", "importtime", str(tool), json.dumps({"path": str(tmp_path)})],
        capture_output=True,
        text=True,
        env={"CTX_MODE": "native", "CTX_MOUNTS": json.dumps([["/", "/", "ro"]]), "CTX_CWD": "/"},
        check=True,
    )

    assert json.loads(call.stdout)["type"] == "directory"
    imported = {line.rsplit("|", 1)[-1].strip() for line in call.stderr.splitlines()}
    assert imported.isdisjoint(HEAVY_MODULES), sorted(imported & set(HEAVY_MODULES))
