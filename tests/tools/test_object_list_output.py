"""``ctx object list`` shows what manifests say, but never a control character raw: a
manifest's description is text its author controls, and the terminal is the operator's."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tools.test_install import CTX, _run, probe_manifest


def test_a_description_holding_an_escape_sequence_is_listed_escaped(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    assert _run([*CTX, "--storage", str(root), "bootstrap"]).returncode == 0
    manifest = {**probe_manifest(tmp_path, 1), "description": "probes\u001b]0;PWNED\u0007 it"}
    manifest_path = tmp_path / "probe.json"
    manifest_path.write_text(json.dumps(manifest))
    install = [*CTX, "--storage", str(root), "object", "install", str(manifest_path)]
    assert _run([*install, "--tier", "system"]).returncode == 0

    listed = _run([*CTX, "--storage", str(root), "object", "list"])
    as_json = _run([*CTX, "--storage", str(root), "object", "list", "--json"])

    assert listed.returncode == 0, listed.stderr
    line = next(line for line in listed.stdout.splitlines() if line.startswith("probe "))
    assert "\x1b" not in listed.stdout and line.endswith("probes\\x1b]0;PWNED\\x07 it")
    described = {entry["name"]: entry["description"] for entry in json.loads(as_json.stdout)}
    assert described["probe"] == manifest["description"]  # JSON escapes it by itself
