"""``ctx bootstrap`` for tools: core tools, tsh config, repairs that keep user data (SPEC R-5)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipimport
from pathlib import Path

import pytest

import cortexfs.manual  # noqa: F401  (registers the manual bundle's bootstrap step)
from cortexfs import storage
from cortexfs.locks import LOCK_FILE
from cortexfs.policy import Policy
from cortexfs.tools.controls import ToolObject, layout_problems
from cortexfs.tools.core import CORE_TOOLS, tsh_config
from tests.support.storage import copy_of_root

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]


@pytest.fixture
def root(bootstrapped_by_ctx: Path, tmp_path: Path) -> Path:
    return copy_of_root(bootstrapped_by_ctx, tmp_path / "storage")


def test_bootstrap_installs_every_core_tool_complete_and_the_tsh_config(root: Path) -> None:
    for name in CORE_TOOLS:
        tool = ToolObject(name, root / "tool")
        assert layout_problems(tool) == [], name
        assert tool.control("policy").read_text().startswith("#"), "installing granted nothing"
    assert (root / "tool/tsh.d/config").read_text() == tsh_config.DEFAULT_TEXT
    assert tsh_config.problems(tsh_config.DEFAULT_TEXT) == []
    assert sorted(os.listdir(root)) == sorted(storage.ROOT_ENTRIES)


def test_core_tools_carry_bytecode_their_interpreter_loads(root: Path) -> None:
    """Each module comes from its bundled .pyc, not compiled again from source on each call:
    bytecode keeps the name it was compiled under, source compiled by zipimport the archive's.
    """
    shebang = (root / "tool/fs.stat").read_bytes().split(b"\n", 1)[0].decode()
    assert shebang.endswith(" -IS")
    if os.path.realpath(shebang[2:].split()[0]) != os.path.realpath(sys.executable):
        pytest.skip("the core tools run on another interpreter, which gets source only")
    for module in ("cortexfs.durable", "cortexfs.tools.core.fs_stat"):
        package, _, name = module.rpartition(".")
        importer = zipimport.zipimporter(str(root / "tool/fs.stat" / package.replace(".", "/")))
        assert importer.get_code(name).co_filename == module.replace(".", "/") + ".py"


def test_bootstrap_is_idempotent(root: Path) -> None:
    before = {path: path.stat().st_mtime_ns for path in root.rglob("*")}

    report = storage.bootstrap(root)

    assert (report.created, report.repaired, report.problems) == ([], [], [])
    assert {path: path.stat().st_mtime_ns for path in root.rglob("*")} == before


def test_bootstrap_repairs_damaged_core_tools_and_keeps_local_state(root: Path) -> None:
    read = ToolObject("fs.read", root / "tool")
    read.control("policy").write_text("allow coder_t tool:fs.read execute\n")
    read.control("log").write_text('{"ts":"kept"}\n')
    read.control("schema").write_text("{ not json")
    (root / "tool/fs.stat.d/description").unlink()
    (root / "tool/fs.list").chmod(0o644)
    (root / "tool/shell.exec").unlink()
    (root / "tool/tsh.d/config").write_text("max_loaded_tools=8\n")

    report = storage.bootstrap(root)

    assert sorted(report.repaired) == ["tool/fs.list", "tool/fs.read", "tool/fs.stat"]
    assert report.created == ["tool/shell.exec"]
    for name in CORE_TOOLS:
        assert layout_problems(ToolObject(name, root / "tool")) == [], name
    assert read.control("policy").read_text() == "allow coder_t tool:fs.read execute\n"
    assert read.control("log").read_text() == '{"ts":"kept"}\n'
    assert (root / "tool/tsh.d/config").read_text() == "max_loaded_tools=8\n"


def test_bootstrap_finishes_an_interrupted_install(root: Path) -> None:
    # What a crash between steps 2 and 4 of a reinstall leaves: the entry moved aside, the
    # new one staged, the old controls still in place.
    entry = root / "tool/fs.read"
    os.rename(entry, root / "tool/.fs.read~0123456789ab~old-entry")
    (root / "tool/.fs.read~0123456789ab~entry").write_text("#!/bin/sh\necho new\n")
    (root / "tool/.fs.read~0123456789ab~entry").chmod(0o755)
    staged = root / "tool/.fs.read~0123456789ab~controls"
    staged.mkdir()
    for control in ("name", "description", "schema", "cap"):
        (staged / control).write_bytes((root / "tool/fs.read.d" / control).read_bytes())

    report = storage.bootstrap(root)

    assert f"{root}/tool/fs.read: finished an interrupted install" in report.repaired
    assert [name for name in os.listdir(root / "tool") if name.startswith(".")] == [LOCK_FILE]
    assert layout_problems(ToolObject("fs.read", root / "tool")) == []


def test_bootstrap_reports_a_bad_tsh_config_and_leaves_it(root: Path) -> None:
    (root / "tool/tsh.d/config").write_text("max_loaded_tools=-1\nrm -rf /\n")

    report = storage.bootstrap(root)

    assert report.problems == [
        "tool/tsh.d/config:1: max_loaded_tools must be a positive integer, not '-1'",
        "tool/tsh.d/config:2: expected one of max_loaded_tools, cache_capacity, "
        "window_percent as key=value",
    ]
    assert (root / "tool/tsh.d/config").read_text() == "max_loaded_tools=-1\nrm -rf /\n"


def test_ctx_bootstrap_json(tmp_path: Path) -> None:
    root = tmp_path / "fresh"

    completed = subprocess.run(
        [*CTX, "bootstrap", "--storage", str(root), "--json"], capture_output=True, text=True
    )

    report = json.loads(completed.stdout)
    assert completed.returncode == 0
    assert {f"tool/{name}" for name in CORE_TOOLS} <= set(report["created"])
    assert "tool/tsh.d/config" in report["created"]


def test_bootstrap_leaves_a_users_directory_at_a_core_tools_path(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    storage.bootstrap(root)
    (root / "tool/fs.list").unlink()
    (root / "tool/fs.list").mkdir()
    (root / "tool/fs.list/data").write_text("precious\n")

    completed = subprocess.run(
        [*CTX, "--storage", str(root), "bootstrap"], capture_output=True, text=True
    )

    assert completed.returncode == 1, completed.stdout
    assert "repaired  tool/fs.list" not in completed.stdout
    assert "problem   tool/fs.list is a directory" in completed.stdout
    assert "left untouched" in completed.stdout
    assert (root / "tool/fs.list/data").read_text() == "precious\n"
    assert layout_problems(ToolObject("fs.read", root / "tool")) == []


@pytest.mark.parametrize("control_path", ["fs.stat.d", "fs.read.d/hooks"])
def test_bootstrap_reports_a_file_in_a_control_directorys_place_and_runs_every_other_step(
    root: Path, control_path: str
) -> None:
    shutil.rmtree(root / "tool" / control_path)
    (root / "tool" / control_path).write_text("x\n")
    shutil.rmtree(root / "tool/tsh.d")
    (root / "tool/fs.list").unlink()
    (root / "bin/tsh").unlink()

    completed = subprocess.run(
        [*CTX, "--storage", str(root), "bootstrap"], capture_output=True, text=True
    )

    assert completed.returncode == 1, completed.stderr
    # One line, the refusal of every ctx command: the problem's errno (in the way: EEXIST).
    assert completed.stderr.startswith(f"ctx: EEXIST: bootstrap of {root} left 1 problem ")
    assert completed.stderr.count("\n") == 1, completed.stderr
    problems = [line for line in completed.stdout.splitlines() if line.startswith("problem")]
    assert problems == [
        f"problem   tool/{control_path} is a file, not a "
        f"{'control directory' if control_path.endswith('.d') else 'directory'}"
        "; left untouched"
    ]
    assert (root / "tool" / control_path).read_text() == "x\n"
    for later in ("tool/fs.list", "tool/tsh.d/config", "bin/tsh"):
        assert f"created   {later}" in completed.stdout
        assert (root / later).is_file()
    listed = subprocess.run(
        [*CTX, "--storage", str(root), "object", "list", "--json"], capture_output=True, text=True
    )
    damaged = {row["name"]: row["problems"] for row in json.loads(listed.stdout)}
    assert listed.returncode == 0 and damaged[control_path.split(".d")[0]]


def test_a_carried_over_control_in_the_way_is_a_problem_every_run_not_a_repair(
    root: Path,
) -> None:
    """A policy that is a directory would be carried over by a reinstall as it is: reporting
    it repaired would repeat on every run while the tool stays damaged."""
    (root / "tool" / "fs.read.d" / "policy").unlink()
    (root / "tool" / "fs.read.d" / "policy").mkdir()

    runs = [
        subprocess.run([*CTX, "--storage", str(root), "bootstrap"], capture_output=True, text=True)
        for _ in range(2)
    ]

    for run in runs:
        assert run.returncode == 1, run.stdout
        assert "problem   tool/fs.read.d/policy is a directory" in run.stdout
        assert "repaired  tool/fs.read" not in run.stdout
    assert (root / "tool" / "fs.read.d" / "policy").is_dir()  # never destroys user data


@pytest.mark.parametrize("entry", ["tool", "bin", "shared"])
def test_bootstrap_goes_on_past_a_file_at_a_root_entry(tmp_path: Path, entry: str) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    (root / entry).write_text("mine\n")

    report = storage.bootstrap(root)

    assert report.problems == [f"{entry}: exists but is not a directory; left untouched"]
    assert (root / entry).read_text() == "mine\n"
    if entry != "tool":
        assert layout_problems(ToolObject("fs.read", root / "tool")) == []
    if entry != "shared":
        assert (root / "shared/cortexfs-docs/README.md").is_file()


@pytest.mark.parametrize("status", ["unavailable\n", "unavailable: maintenance\n", "disabled\n"])
def test_a_status_the_administrator_set_is_not_damage(root: Path, status: str) -> None:
    (root / "tool/fs.stat.d/status").write_text(status)

    first = subprocess.run(
        [*CTX, "--storage", str(root), "bootstrap"], capture_output=True, text=True
    )
    second = storage.bootstrap(root)

    assert first.returncode == 0
    assert first.stdout.splitlines()[1:] == ["nothing to do: the storage root is complete"]
    assert (second.created, second.repaired, second.problems) == ([], [], [])
    assert (root / "tool/fs.stat.d/status").read_text() == status


# Run in a process of its own: a process that interned every one-character string (as
# importing json or click does for some) compiles a bundled module to other bytecode than a
# fresh ctx bootstrap, marshal marking such a string interned (CPython issue gh-98819).
_BOOTSTRAP_IN_ANOTHER_STATE = """
import sys
kept = [sys.intern(chr(code)) for code in range(256)]
from pathlib import Path
from cortexfs import bootstrap_steps, storage
report = storage.bootstrap(Path(sys.argv[1]))
print(report.created, report.repaired, report.problems)
"""


def test_a_process_in_another_state_finds_the_core_tools_ctx_bootstrap_made_current(
    bootstrapped_by_ctx: Path, tmp_path: Path
) -> None:
    """R-5: a core tool is reinstalled only when this version would install something else;
    the bytecode one process bundles for the same sources may differ from another's in
    marshal's flags alone, and neither is then damage.  Both ways round: a longer-lived
    process's install is current for a later ctx bootstrap."""
    root = copy_of_root(bootstrapped_by_ctx, tmp_path / "storage")
    launcher = (root / "tool/fs.read").read_bytes()

    in_another_state = subprocess.run(
        [sys.executable, "-c", _BOOTSTRAP_IN_ANOTHER_STATE, str(root)],
        capture_output=True,
        text=True,
    )
    assert in_another_state.returncode == 0, in_another_state.stderr
    assert in_another_state.stdout == "[] [] []\n"
    assert (root / "tool/fs.read").read_bytes() == launcher

    (root / "tool/fs.read").unlink()  # so the next install is that process's own
    subprocess.run([sys.executable, "-c", _BOOTSTRAP_IN_ANOTHER_STATE, str(root)], check=True)
    assert (root / "tool/fs.read").read_bytes() != launcher  # its bytecode is another's

    by_ctx = subprocess.run(
        [*CTX, "--storage", str(root), "bootstrap"], capture_output=True, text=True
    )
    assert by_ctx.returncode == 0, by_ctx.stdout + by_ctx.stderr
    assert by_ctx.stdout.splitlines()[1:] == ["nothing to do: the storage root is complete"]


def test_bootstrap_removes_a_control_its_manifest_does_not_define(root: Path) -> None:
    (root / "tool/fs.read.d/program").write_text("{ not json")

    report = storage.bootstrap(root)

    assert report.repaired == ["tool/fs.read"]
    assert not (root / "tool/fs.read.d/program").exists()


def test_tsh_is_a_tool_object_with_bin_tsh_and_bin_ctxterm_beside_it(root: Path) -> None:
    """H-1 names /ctx/bin/ctxterm, /ctx/bin/tsh and /ctx/tool/tsh."""
    tsh = ToolObject("tsh", root / "tool")

    assert layout_problems(tsh) == []
    assert tsh.executable.read_bytes() == (root / "bin/tsh").read_bytes()
    assert len(Policy.from_bytes(tsh.control("policy").read_bytes())) == 0
    assert tsh.control("config").read_text() == tsh_config.DEFAULT_TEXT
    ctxterm = root / "bin/ctxterm"
    assert os.access(ctxterm, os.X_OK)
    usage = subprocess.run([ctxterm, "--help"], capture_output=True, text=True, cwd="/")
    assert usage.returncode == 0 and "Usage: ctxterm [OPTIONS] AGENT" in usage.stdout


def test_tool_tsh_joins_an_existing_tsh_d_and_keeps_its_config(root: Path) -> None:
    """A root bootstrapped before tool/tsh existed: tsh.d/ held only config."""
    (root / "tool/tsh").unlink()
    for entry in (root / "tool/tsh.d").iterdir():
        if entry.is_dir():
            shutil.rmtree(entry)
        elif entry.name != "config":
            entry.unlink()
    (root / "tool/tsh.d/config").write_text("# mine\ncache_capacity=8\n")

    first = storage.bootstrap(root)
    second = storage.bootstrap(root)

    assert (first.created, first.repaired, first.problems) == (["tool/tsh"], [], [])
    assert (second.created, second.repaired, second.problems) == ([], [], [])
    assert (root / "tool/tsh.d/config").read_text() == "# mine\ncache_capacity=8\n"
    assert layout_problems(ToolObject("tsh", root / "tool")) == []


def test_a_users_file_at_bin_ctxterm_is_left_alone(root: Path) -> None:
    (root / "bin/ctxterm").unlink()
    (root / "bin/ctxterm").mkdir()

    report = storage.bootstrap(root)

    assert report.problems == ["bin/ctxterm: not a regular file; left untouched"]
    assert (root / "bin/ctxterm").is_dir()
