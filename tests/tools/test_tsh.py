"""tsh outside an agent terminal: it finds tools and reads their metadata, never runs one as an
agent (SPEC H-1, H-2)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from cortexfs import storage


def test_a_standalone_tsh_finds_tools_but_refuses_to_run_them(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    storage.bootstrap(root)
    marker = tmp_path / "ran"

    session = subprocess.run(
        [str(root / "bin" / "tsh")],
        input=f"which fs.stat\nfs.stat /\nshell.exec 'touch {marker}'\n",
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "CTX_PATH": str(root / "tool")},
        timeout=60,
    )

    assert str(root / "tool" / "fs.stat") in session.stdout
    refusals = [line for line in session.stderr.splitlines() if "EACCES" in line]
    assert [line.split(":")[1].strip() for line in refusals] == ["fs.stat", "shell.exec"]
    assert "not an agent terminal" in refusals[0] and "H-2" in refusals[0]
    assert session.returncode == 126  # the status of the last refusal
    assert not marker.exists()
