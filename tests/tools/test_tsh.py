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


def test_a_standalone_tsh_searches_tshrc_then_ctx_path_then_the_default(tmp_path: Path) -> None:
    """T-4's three sources, in order, with /ctx/… read in this tsh's own storage root."""
    root = tmp_path / "storage"
    storage.bootstrap(root)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "fs.stat").write_text("#!/bin/sh\n")
    (elsewhere / "fs.stat").chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()

    def which(environ: dict[str, str]) -> tuple[str, str]:
        done = subprocess.run(
            [str(root / "bin" / "tsh")],
            input="which fs.stat\n",
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "CTX_HOME": str(home), **environ},
            timeout=60,
        )
        return done.stdout.removeprefix("tsh$ ").split("\n")[0], done.stderr

    by_default, _ = which({})
    by_environment, _ = which({"CTX_PATH": str(elsewhere)})
    (home / ".tshrc").write_text("# data, never run\nexport X=1\nCTX_PATH=/ctx/tool\n")
    by_tshrc, warned = which({"CTX_PATH": str(elsewhere)})

    assert by_default == str(root / "tool" / "fs.stat")  # /ctx/tool, in this tsh's root
    assert by_environment == str(elsewhere / "fs.stat")
    assert by_tshrc == str(root / "tool" / "fs.stat")  # .tshrc beats the process CTX_PATH
    assert ".tshrc:2: ignored" in warned
