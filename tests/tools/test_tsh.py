"""tsh outside an agent terminal: it finds tools and reads their metadata, never runs one as an
agent (SPEC H-1, H-2)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from cortexfs import storage
from cortexfs.tools.core.tsh_context import TshContext


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
        return done.stdout.split("\n")[0], done.stderr

    by_default, _ = which({})
    by_environment, _ = which({"CTX_PATH": str(elsewhere)})
    (home / ".tshrc").write_text("# data, never run\nexport X=1\nCTX_PATH=/ctx/tool\n")
    by_tshrc, warned = which({"CTX_PATH": str(elsewhere)})

    assert by_default == str(root / "tool" / "fs.stat")  # /ctx/tool, in this tsh's root
    assert by_environment == str(elsewhere / "fs.stat")
    assert by_tshrc == str(root / "tool" / "fs.stat")  # .tshrc beats the process CTX_PATH
    assert ".tshrc:2: ignored" in warned and "tsh: warning: " in warned


def run_tsh(
    root: Path, *argv: str, script: str = "", **environ: str
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(root / "bin" / "tsh"), *argv],
        input=script,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "CTX_PATH": str(root / "tool"), **environ},
        timeout=60,
    )


def test_a_line_starting_with_a_hash_is_a_comment_and_keeps_the_last_status(
    tmp_path: Path,
) -> None:
    """A script piped to tsh may comment its lines, as a shell script does: a comment runs
    nothing and leaves ``$?`` as the line before set it; a quoted ``#`` is a word."""
    root = tmp_path / "storage"
    storage.bootstrap(root)
    script = "which nosuch\n  # which fs.stat, or 'an unclosed quote\n#\n"

    commented = run_tsh(root, script=script)
    quoted = run_tsh(root, script="'#not' a comment\n")

    assert commented.returncode == 1, commented  # which's status, not the comments'
    assert commented.stdout == "" and "nosuch" in commented.stderr
    assert "No closing quotation" not in commented.stderr
    assert quoted.returncode == 127 and "#not: not a tool" in quoted.stderr, quoted


def test_tsh_with_arguments_runs_that_one_command_line(tmp_path: Path) -> None:
    """T-3's ``tsh TOOL ARG...``: one command, its words as given, tsh's status is its status;
    standalone, running a tool is still refused (H-2) and a host command is not a tool."""
    root = tmp_path / "storage"
    storage.bootstrap(root)

    refused = run_tsh(root, "fs.read", '{"path": "x"}')
    not_a_tool = run_tsh(root, "ls", "-l")
    builtin = run_tsh(root, "which", "fs.read")

    assert refused.returncode == 126
    assert "fs.read: EACCES" in refused.stderr and "tsh$" not in refused.stdout
    assert not_a_tool.returncode == 127 and "ls: not a tool" in not_a_tool.stderr
    assert builtin.returncode == 0 and builtin.stdout == f"{root / 'tool' / 'fs.read'}\n"


def test_the_context_holds_max_loaded_tools_unpinned_tools(tmp_path: Path) -> None:
    """H-4: loading past ``max_loaded_tools`` unloads the least recently used unpinned tool;
    a pinned tool stays and does not count."""
    root = tmp_path / "storage"
    storage.bootstrap(root)
    config = root / "tool" / "tsh.d" / "config"
    config.write_text(config.read_text().replace("max_loaded_tools=64", "max_loaded_tools=2"))

    session = run_tsh(
        root,
        script="pin tsh.config\nload fs.read fs.stat\nload fs.read\nload fs.list\nloaded\n"
        "unload tsh.config\nunpin fs.read\nunload nope\n",
    )

    listed = session.stdout.splitlines()[5:]  # after the lines of pin (1) and load (2, 1, 1)
    assert [line.split(":")[0] for line in listed] == [
        "tsh.config",
        "fs.list",
        "fs.read",
    ]
    assert "(pinned)" in listed[0]
    assert "tsh: unloaded fs.stat (max_loaded_tools reached)" in session.stderr
    assert "unload: tsh.config: pinned; 'unpin tsh.config' first" in session.stderr
    assert "unpin: fs.read: not pinned" in session.stderr
    assert "unload: nope: not loaded" in session.stderr


def test_describe_shows_the_metadata_of_the_directory_that_held_the_tool(tmp_path: Path) -> None:
    """A standalone human may read a tool's metadata (H-2), from its own ``.d/`` (T-4)."""
    root = tmp_path / "storage"
    storage.bootstrap(root)

    shown = run_tsh(root, "describe", "fs.stat")
    missing = run_tsh(root, "describe", "nope")

    info = json.loads(shown.stdout)
    assert info["name"] == "fs.stat" and info["path"] == str(root / "tool" / "fs.stat")
    assert info["schema"]["required"] == ["path"]
    assert info["cap"] == {"network": False, "side_effects": False}
    assert missing.returncode == 1 and "describe: nope: not a tool on CTX_PATH" in missing.stderr


def test_describe_leaves_out_a_control_that_is_a_directory(tmp_path: Path) -> None:
    """A control that is not a regular file (here a directory) is not metadata: left out,
    not a traceback."""
    root = tmp_path / "storage"
    storage.bootstrap(root)
    description = root / "tool" / "fs.stat.d" / "description"
    description.unlink()
    description.mkdir()

    shown = run_tsh(root, "describe", "fs.stat")

    assert shown.returncode == 0, shown.stderr
    info = json.loads(shown.stdout)
    assert info["description"] == "" and info["schema"]["required"] == ["path"]


def test_a_bad_config_line_is_reported_and_the_default_applies(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    storage.bootstrap(root)
    (root / "tool" / "tsh.d" / "config").write_text("max_loaded_tools=0\nrm -rf /\n")

    session = run_tsh(root, "loaded")

    assert session.returncode == 0
    assert "tsh.d/config:1: max_loaded_tools must be a positive integer" in session.stderr
    assert "tsh.d/config:2" in session.stderr


def test_the_path_cache_is_bounded_and_never_changes_what_ctx_path_resolves(
    tmp_path: Path,
) -> None:
    """H-4's ``cache_capacity`` bounds the unpinned paths; a cached path is checked, so a tool
    installed later in an earlier directory wins at once (T-4), and a removed one is gone."""
    early, late = tmp_path / "early", tmp_path / "late"
    early.mkdir()
    late.mkdir()
    for n in range(10):
        (late / f"t{n}").write_text("#!/bin/sh\n")
        (late / f"t{n}").chmod(0o755)
    settings = {"max_loaded_tools": 4, "cache_capacity": 3, "window_percent": 34}
    context = TshContext(settings, lambda: [str(early), str(late)])

    for n in range(10):
        assert context.which(f"t{n}") == str(late / f"t{n}")
        assert len(context.paths) <= 3
    context.pin("t0")
    assert context.which("t0") == str(late / "t0")
    (early / "t0").write_text("#!/bin/sh\n")
    (early / "t0").chmod(0o755)
    assert context.which("t0") == str(early / "t0")  # a cached, pinned name included
    (early / "t0").chmod(0o644)  # not executable: not a hit (T-4)
    assert context.which("t0") == str(late / "t0")
    (late / "t9").unlink()
    assert context.which("t9") is None
    assert context.paths.is_pinned("t0") and len(context.paths) <= 3


def test_help_names_every_built_in() -> None:
    """tsh's help is the only list of its built-ins an agent sees: none may be missing."""
    from cortexfs.tools.core.tsh import BUILTINS, HELP

    listed = {line.split()[0] for line in HELP.splitlines() if line.startswith("  ")}
    assert set(BUILTINS) | {"exit"} <= listed
