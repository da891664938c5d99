"""The core tool ``tsh.config`` (SPEC H-4, R-5) and ``ctx tool`` (H-3), through real processes."""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cortexfs import storage
from cortexfs.tools.core import tsh_config
from tests.support.cli import ctx
from tests.support.storage import copy_of_root
from tests.tools.support import World

CONFIG = Path("tool") / "tsh.d" / "config"


@pytest.fixture
def root(bootstrapped_by_ctx: Path, tmp_path: Path) -> Path:
    """A root ``ctx bootstrap`` made, this test's own."""
    return copy_of_root(bootstrapped_by_ctx, tmp_path / "storage")


def test_bootstrap_installs_tsh_config_as_a_core_tool(root: Path) -> None:
    tool = root / "tool" / "tsh.config"
    assert os.access(tool, os.X_OK)
    assert (root / "tool" / "tsh.config.d" / "schema").is_file()
    assert (root / CONFIG).read_text() == tsh_config.DEFAULT_TEXT


def test_ctx_tool_shows_the_configuration(root: Path) -> None:
    shown = ctx(root, "tool", "tsh.config")

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == "max_loaded_tools=64\ncache_capacity=32\nwindow_percent=1\n"
    as_json = json.loads(ctx(root, "tool", "--json", "tsh.config").stdout)
    assert as_json == {
        "path": str(root / CONFIG),
        "config": tsh_config.DEFAULTS,
        "changed": [],
        "warnings": [],
    }


def test_an_update_keeps_comments_and_order_and_replaces_the_file_whole(root: Path) -> None:
    config = root / CONFIG
    config.write_text("# ours\nwindow_percent=2\n\n# more\nmax_loaded_tools=10\n")
    config.chmod(0o640)
    with open(config) as old:  # a reader of the old file keeps the old text: a replacement
        done = ctx(root, "tool", "tsh.config", "max_loaded_tools=20")
        assert old.read() == "# ours\nwindow_percent=2\n\n# more\nmax_loaded_tools=10\n"
    again = ctx(root, "tool", "--json", "tsh.config", '{"set": {"cache_capacity": 8}}')

    assert done.returncode == 0 and again.returncode == 0, done.stderr + again.stderr
    assert config.read_text() == (
        "# ours\nwindow_percent=2\n\n# more\nmax_loaded_tools=20\ncache_capacity=8\n"
    )
    assert stat.S_IMODE(config.stat().st_mode) == 0o640
    assert json.loads(again.stdout)["changed"] == ["cache_capacity"]
    # tsh.d/ is also tool/tsh's control directory (H-1); no temporary is left beside them
    assert not [p.name for p in config.parent.iterdir() if p.name.startswith(".")]


def test_changed_names_only_the_keys_an_update_changed(root: Path) -> None:
    """``changed`` is what the update changed, not what it was given: a key set to the value
    it has is no change, and an update that changes nothing leaves the file as it was."""
    config = root / CONFIG
    config.write_text("# ours\nwindow_percent=2\n")

    same = ctx(root, "tool", "--json", "tsh.config", '{"set": {"window_percent": 2}}')
    mixed = ctx(root, "tool", "--json", "tsh.config", "window_percent=2", "cache_capacity=8")
    default = ctx(root, "tool", "--json", "tsh.config", "max_loaded_tools=64")  # its default

    assert [r.returncode for r in (same, mixed, default)] == [0, 0, 0], mixed.stderr
    assert json.loads(same.stdout)["changed"] == []
    assert json.loads(mixed.stdout)["changed"] == ["cache_capacity"]
    assert json.loads(default.stdout)["changed"] == []  # now written, the same in effect
    assert config.read_text() == "# ours\nwindow_percent=2\ncache_capacity=8\nmax_loaded_tools=64\n"


def test_an_update_that_changes_nothing_leaves_the_file_alone(root: Path) -> None:
    config = root / CONFIG
    config.write_text("window_percent=2\n")
    before = config.stat()

    same = ctx(root, "tool", "tsh.config", "window_percent=2")

    assert same.returncode == 0, same.stderr
    after = config.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.parametrize(
    "argument",
    [
        "max_loaded_tools=0",
        "max_loaded_tools=99999999999999999999999",
        "window_percent=101",
        "cache_capacity=many",
        "colour=red",
        "plain",
    ],
)
def test_a_bad_setting_is_a_usage_error_and_changes_nothing(root: Path, argument: str) -> None:
    refused = ctx(root, "tool", "tsh.config", argument)
    direct = subprocess.run(
        [str(root / "tool" / "tsh.config"), argument], capture_output=True, text=True, timeout=60
    )

    assert refused.returncode == 2 and direct.returncode == 2
    # inside ctx, the error reads as every ctx error does; the tool's own names itself
    assert refused.stderr.startswith("ctx: EINVAL: tsh.config: ")
    assert direct.stderr.startswith("tsh.config: EINVAL: ")
    assert (root / CONFIG).read_text() == tsh_config.DEFAULT_TEXT


def test_several_settings_in_one_call_are_written_together(root: Path) -> None:
    """`ctx tool tsh.config cache_capacity=64 window_percent=2` was refused (EINVAL): only one
    key=value per call worked."""
    config = root / CONFIG
    config.write_text("# ours\nwindow_percent=1\n")

    done = ctx(root, "tool", "tsh.config", "cache_capacity=64", "window_percent=2")
    direct = subprocess.run(
        [str(root / "tool" / "tsh.config"), "max_loaded_tools=9", "cache_capacity=65"],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout == "max_loaded_tools=64\ncache_capacity=64\nwindow_percent=2\n"
    assert direct.returncode == 0, direct.stderr
    assert config.read_text() == (
        "# ours\nwindow_percent=2\ncache_capacity=65\nmax_loaded_tools=9\n"
    )
    assert not [p.name for p in config.parent.iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize(
    "arguments",
    [
        ["cache_capacity=64", "window_percent=101"],
        ["window_percent=101", "cache_capacity=64"],
        ["cache_capacity=64", "colour=red"],
        ["cache_capacity=64", "plain"],
        ["cache_capacity=64", "cache_capacity=65"],
    ],
)
def test_one_bad_setting_among_several_changes_nothing(root: Path, arguments: list[str]) -> None:
    config = root / CONFIG
    before = config.stat()

    refused = ctx(root, "tool", "tsh.config", *arguments)

    assert refused.returncode == 2 and refused.stderr.startswith("ctx: EINVAL: tsh.config: ")
    assert config.read_text() == tsh_config.DEFAULT_TEXT
    after = config.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_a_config_with_a_bad_line_is_read_but_not_rewritten(root: Path) -> None:
    (root / CONFIG).write_text("max_loaded_tools=12\nrm -rf /\n")

    shown = ctx(root, "tool", "tsh.config")
    refused = ctx(root, "tool", "tsh.config", "cache_capacity=5")

    assert shown.stdout.startswith("max_loaded_tools=12\n")
    assert refused.returncode == 1 and "fixed by hand" in refused.stderr
    assert (root / CONFIG).read_text() == "max_loaded_tools=12\nrm -rf /\n"
    assert storage.bootstrap(root).problems == [
        "tool/tsh.d/config:2: expected one of max_loaded_tools, cache_capacity, "
        "window_percent as key=value"
    ]


def test_a_key_given_twice_in_the_file_is_a_problem_and_its_default_applies(
    root: Path,
) -> None:
    """Which of two lines holds is anybody's guess: said, and neither is taken."""
    (root / CONFIG).write_text("max_loaded_tools=2\nmax_loaded_tools=5\n")

    shown = ctx(root, "tool", "tsh.config")

    assert shown.returncode == 0
    assert shown.stdout.startswith("max_loaded_tools=64\n")
    assert "tsh.d/config:2: max_loaded_tools is given again (first on line 1)" in shown.stderr
    assert "(ignored; the default applies)" in shown.stderr


def test_json_reads_carry_the_warnings_of_the_file(root: Path) -> None:
    (root / CONFIG).write_text("max_loaded_tools=2\nmax_loaded_tools=5\nfoo=1\n")

    shown = ctx(root, "tool", "--json", "tsh.config")

    assert shown.returncode == 0, shown.stderr
    warnings = json.loads(shown.stdout)["warnings"]
    assert len(warnings) == 2 and "foo" not in warnings[0] and "given again" in warnings[0]
    assert "tsh.d/config:3: expected one of" in warnings[1]


def test_a_missing_config_reads_as_the_defaults_and_an_update_creates_it(root: Path) -> None:
    """tsh runs on the defaults of H-4 without the file; so does tsh.config, and says so."""
    (root / CONFIG).unlink()

    shown = ctx(root, "tool", "tsh.config")
    as_json = json.loads(ctx(root, "tool", "--json", "tsh.config").stdout)
    changed = ctx(root, "tool", "tsh.config", "window_percent=5")

    assert shown.returncode == 0 and shown.stdout == "max_loaded_tools=64\ncache_capacity=32\n" + (
        "window_percent=1\n"
    )
    assert "does not exist: every default applies" in shown.stderr
    assert as_json["config"] == tsh_config.DEFAULTS and len(as_json["warnings"]) == 1
    assert changed.returncode == 0, changed.stderr
    assert (root / CONFIG).read_text() == tsh_config.DEFAULT_TEXT.replace(
        "window_percent=1", "window_percent=5"
    )
    assert stat.S_IMODE((root / CONFIG).stat().st_mode) == tsh_config.CONFIG_MODE


@pytest.mark.parametrize("name", ["fs.write", "shell.exec", "fs.read"])
def test_ctx_tool_refuses_the_core_tools_that_act_with_permissions(root: Path, name: str) -> None:
    target = root.parent / "written"

    refused = ctx(root, "tool", name, json.dumps({"path": str(target), "content": "x"}))

    assert refused.returncode == 1
    assert "EACCES" in refused.stderr and f"ctx run --agent AGENT {name}" in refused.stderr
    assert not target.exists()


def test_ctx_tool_honours_the_tools_status_and_controls_and_logs_each_call(root: Path) -> None:
    """T-1, T-7: a disabled or damaged tsh.config is refused through ctx tool too, and each
    call is a line of its log, with the caller's uid and no agent."""
    controls = root / "tool" / "tsh.config.d"
    before = (root / CONFIG).read_bytes()

    done = ctx(root, "tool", "tsh.config", "cache_capacity=40")
    (controls / "status").write_text("disabled\n")
    disabled = ctx(root, "tool", "tsh.config", "cache_capacity=41")
    (controls / "status").write_text("available\n")
    (controls / "policy").rename(controls / "policy.kept")
    without_policy = ctx(root, "tool", "tsh.config", "cache_capacity=43")
    (controls / "policy.kept").rename(controls / "policy")
    (controls / "description").unlink()
    damaged = ctx(root, "tool", "tsh.config", "cache_capacity=42")

    assert done.returncode == 0, done.stderr
    assert disabled.returncode == 1 and disabled.stderr.startswith("ctx: EACCES: "), disabled.stderr
    assert "disabled" in disabled.stderr
    assert damaged.returncode == 1 and damaged.stderr.startswith("ctx: ENOEXEC: "), damaged.stderr
    # No chain runs here to refuse a tool without a policy of its own: it is damaged (T-1).
    assert without_policy.returncode == 1, without_policy.stderr
    assert "tsh.config.d/policy is missing" in without_policy.stderr
    assert (root / CONFIG).read_bytes() == before.replace(
        b"cache_capacity=32", b"cache_capacity=40"
    )
    logged = [json.loads(line) for line in (controls / "log").read_text().splitlines()]
    assert [(e["type"], e["object"], e["status"], e["agent"]) for e in logged] == [
        ("tool_result", "tool/tsh.config", "ok", ""),
        *[("tool_result", "tool/tsh.config", "error", "")] * 3,
    ]
    assert [(e["argv"], e["uid"], e["exit_status"], e.get("errno")) for e in logged] == [
        (["cache_capacity=40"], os.getuid(), 0, None),
        (["cache_capacity=41"], os.getuid(), None, "EACCES"),
        (["cache_capacity=43"], os.getuid(), None, "ENOEXEC"),
        (["cache_capacity=42"], os.getuid(), None, "ENOEXEC"),
    ]
    assert "disabled" in logged[1]["message"]


def test_ctx_tool_refuses_an_ordinary_tool_and_a_name_not_on_ctx_path(
    root: Path, tmp_path: Path
) -> None:
    own = tmp_path / "mine"
    own.mkdir()
    tool = own / "tsh.config"
    tool.write_text("#!/bin/sh\necho not the core tool\n")
    tool.chmod(0o755)

    shadowed = ctx(root, "tool", "tsh.config", env={"CTX_PATH": f"{own}:/ctx/tool"})
    missing = ctx(root, "tool", "tsh.config", env={"CTX_PATH": str(tmp_path / "empty")})

    assert shadowed.returncode == 1 and "not the core tool" in shadowed.stderr
    assert "not the core tool" not in shadowed.stdout
    assert missing.returncode == 1 and "ENOENT" in missing.stderr


def test_an_agent_reads_the_configuration_but_the_kernel_keeps_it_from_writing(
    world: World,
) -> None:
    world.agent("coder", tools=["tsh.config"])
    world.allow_tool("tsh.config")

    shown = world.run("tsh.config", {})
    refused = world.run("tsh.config", {"set": {"cache_capacity": 1}})

    assert shown.ok, shown.error
    assert shown.output["config"] == tsh_config.DEFAULTS
    assert not refused.ok
    assert refused.output["error"] == "EACCES", refused.output
    assert (world.root / CONFIG).read_text() == tsh_config.DEFAULT_TEXT


@pytest.mark.parametrize("make", [os.mkfifo, os.mkdir], ids=["fifo", "directory"])
def test_a_config_that_is_not_a_regular_file_is_refused_without_waiting(
    root: Path, make: Callable[[Path], None]
) -> None:
    (root / CONFIG).unlink()
    make(root / CONFIG)

    refused = ctx(root, "tool", "tsh.config")

    assert refused.returncode == 1
    assert refused.stderr == f"ctx: EINVAL: tsh.config: {root / CONFIG} is not a regular file\n"


ROUNDS = 15


def test_concurrent_updates_of_different_keys_are_never_lost(root: Path) -> None:
    """Each round, one process per key sets it at the same moment; all three updates stay."""
    config = root / CONFIG
    start = multiprocessing.Barrier(len(tsh_config.DEFAULTS))
    updaters = [
        multiprocessing.Process(target=_set_every_round, args=(config, key, start))
        for key in tsh_config.DEFAULTS
    ]
    for updater in updaters:
        updater.start()
    try:
        for updater in updaters:
            updater.join(60)
    finally:
        ended(updaters)
    assert [updater.exitcode for updater in updaters] == [0] * len(updaters)
    final = {key: ROUNDS for key in tsh_config.DEFAULTS}
    assert tsh_config.effective(config.read_text()) == final
    assert not [p.name for p in config.parent.iterdir() if p.name.startswith(".")]


def ended(processes: list[multiprocessing.Process]) -> None:
    """Kill what is still running after its join timed out: a hung helper fails the test, it
    does not outlive it."""
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(10)


def _set_every_round(config: Path, key: str, start: Any) -> None:
    for value in range(1, ROUNDS + 1):
        start.wait(10)
        tsh_config.configure(config, {"set": {key: value}}, native=True)
        start.wait(10)
        if tsh_config.effective(config.read_text())[key] != value:
            start.abort()  # the others stop at once instead of waiting out the barrier
            raise SystemExit(f"{key}={value} was lost")


def test_an_update_during_a_reinstall_of_tsh_is_not_left_in_the_retired_directory(
    root: Path, tmp_path: Path
) -> None:
    """tsh.d/ is also tool/tsh's control directory: a reinstall of tsh swaps in a new one,
    carrying config over.  An update made meanwhile must land in the directory in place."""
    stop = multiprocessing.Event()
    installer = multiprocessing.Process(target=_reinstall_tsh_until_stopped, args=(root, stop))
    installer.start()
    try:
        for value in range(1, 120):
            tsh_config.configure(root / CONFIG, {"set": {"cache_capacity": value}}, native=True)
            settings = tsh_config.effective((root / CONFIG).read_text())
            assert settings["cache_capacity"] == value, f"cache_capacity={value} was lost"
    finally:
        stop.set()
        installer.join(60)
        ended([installer])
    assert installer.exitcode == 0


def _reinstall_tsh_until_stopped(root: Path, stop: Any) -> None:
    from cortexfs.tools.core.bootstrap import core_manifest
    from cortexfs.tools.install import install_tool, parse_tier

    program = root / "tool" / "tsh"
    manifest = core_manifest("tsh", program)
    launcher = program.read_bytes()
    rounds = 0
    while not stop.is_set() or rounds == 0:
        install_tool(parse_tier(root, "system"), manifest, launcher + b"#" * (rounds % 2))
        rounds += 1


def test_a_json_value_of_the_wrong_kind_is_spelt_as_json_spells_it() -> None:
    from cortexfs.tools.core.tsh_config import value_problem

    assert value_problem("cache_capacity", True) == (
        "cache_capacity must be a positive integer, not true"
    )
    assert value_problem("cache_capacity", 2.5).endswith("not 2.5")
    assert value_problem("cache_capacity", "abc").endswith("not 'abc'")
