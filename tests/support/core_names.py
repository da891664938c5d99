"""Roots as an older ctx left them: a core tool of another version, and an administrator's own
tool under a name that a later version gave a core tool."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from cortexfs.tools.core import CORE_TOOLS, launcher
from cortexfs.tools.core.bootstrap import core_manifest
from cortexfs.tools.install import install_tool, parse_tier
from cortexfs.tools.manifest import parse_manifest


def install_administrators_tool(root: Path, name: str, scratch: Path, program: bytes) -> None:
    """The administrator's own system tool ``name`` (``program``, with its manifest written
    in ``scratch``), installed in place of the core tool, as 'ctx object install --tier
    system' did before the name became core."""
    shutil.rmtree(root / "tool" / f"{name}.d")
    (root / "tool" / name).unlink()
    source = scratch / f"{name}.program"
    source.write_bytes(program)
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": name,
        "description": "the administrator's own tool",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": str(source),
    }
    manifest_path = scratch / f"{name}.json"
    manifest_path.write_text(json.dumps(document))
    manifest = parse_manifest(document, source=manifest_path)
    install_tool(parse_tier(root, "system"), manifest, program)


def install_core_tool_of_another_version(root: Path, name: str, scratch: Path) -> None:
    """What an older bootstrap left at core tool ``name``: its launcher, whose bundled
    modules (here toolio.py) read the runner's context in another shape."""
    interpreter, _ = launcher.core_interpreter()
    modules = [
        (path, data + b"\n# as an older version had it\n" if path.endswith("toolio.py") else data)
        for path, data in launcher.bundled_modules(interpreter, launcher.package_parent())
        if not path.endswith(".pyc")
    ]
    program = launcher.render_launcher(interpreter, modules, CORE_TOOLS[name])
    exec_path = scratch / name
    exec_path.write_bytes(program)
    install_tool(parse_tier(root, "system"), core_manifest(name, exec_path), program)
