"""Installing tools: complete pairs, atomic replacement, crash points, local state kept (T-8)."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import multiprocessing
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cortexfs import durable, storage
from cortexfs.errors import CtxError
from cortexfs.locks import LOCK_FILE
from cortexfs.policy import Policy
from cortexfs.tools.commit_marker import commit_in_progress
from cortexfs.tools.controls import REQUIRED_FILES, ToolObject, layout_problems
from cortexfs.tools.install import Tier, install_tool, list_tools, parse_tier, repair_tier
from cortexfs.tools.manifest import Manifest, parse_manifest

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]


def version(scratch: Path, number: int, *, program: bool = False) -> tuple[Manifest, bytes]:
    """Version ``number`` of tool ``probe``: its program and schema both name the version."""
    document = probe_manifest(scratch, number)
    if program:
        document["program"] = {"type": "object"}
    manifest = parse_manifest(document, source=scratch / f"probe-v{number}.json")
    return manifest, Path(document["exec"]).read_bytes()


def probe_manifest(scratch: Path, number: int) -> dict[str, Any]:
    source = scratch / f"probe-v{number}"
    source.write_text(f"#!/bin/sh\necho v{number}\n")
    return {
        "manifest": 2,
        "kind": "tool",
        "name": "probe",
        "description": f"probe version {number}",
        "schema": {"type": "object", "title": f"v{number}"},
        "cap": {"side_effects": False, "network": False},
        "exec": str(source),
    }


def installed_version(tool: ToolObject) -> str:
    """The version of a complete pair; fails when the entry and the controls disagree."""
    program = tool.executable.read_text().split()[-1]
    schema = json.loads(tool.control("schema").read_text())["title"]
    assert program == schema, f"entry {program} with controls {schema}"
    return program


@pytest.fixture
def tier(tmp_path: Path) -> Tier:
    root = tmp_path / "storage"
    storage.ensure_root_abi(root)
    return parse_tier(root, "system")


def test_install_makes_a_complete_pair_that_grants_nothing(tier: Tier, tmp_path: Path) -> None:
    manifest, program = version(tmp_path, 1)

    installed = install_tool(tier, manifest, program)

    tool = tier.tool("probe")
    assert not installed.replaced and installed.path == tool.executable
    assert layout_problems(tool) == []
    assert os.stat(tool.executable).st_mode & 0o777 == 0o755
    assert len(Policy.from_bytes(tool.control("policy").read_bytes())) == 0
    assert tool.control("status").read_text() == "available\n"
    assert json.loads(tool.control("origin").read_text())["manifest"].endswith("probe-v1.json")
    assert sorted(os.listdir(tier.directory)) == [LOCK_FILE, "probe", "probe.d"]


def test_an_install_unless_current_asks_under_the_tier_s_lock_and_changes_nothing_if_so(
    tier: Tier, tmp_path: Path
) -> None:
    """What a bootstrap racing another needs: the question "is it installed already?" is asked
    with the tier's lock held (the other's install is then whole or not begun), and an answer
    of yes installs nothing."""
    install_tool(tier, *version(tmp_path, 1))
    before = {path.name: path.stat().st_ino for path in tier.directory.iterdir()}
    lock = tier.directory / LOCK_FILE

    def held() -> bool:
        fd = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True  # the install holds it while it asks
        finally:
            os.close(fd)
        return False

    asked: list[bool] = []
    skipped = install_tool(
        tier, *version(tmp_path, 2), unless_current=lambda: asked.append(held()) or True
    )

    assert skipped is None and asked == [True]
    assert installed_version(tier.tool("probe")) == "v1"
    assert {path.name: path.stat().st_ino for path in tier.directory.iterdir()} == before
    installed = install_tool(tier, *version(tmp_path, 2), unless_current=lambda: False)
    assert installed is not None and installed.replaced
    assert installed_version(tier.tool("probe")) == "v2"


def test_reinstall_replaces_the_version_and_keeps_local_state(tier: Tier, tmp_path: Path) -> None:
    install_tool(tier, *version(tmp_path, 1, program=True))
    tool = tier.tool("probe")
    tool.control("policy").write_text("allow coder_t tool:probe execute\n")
    tool.control("status").write_text("disabled\n")
    tool.control("log").write_text('{"ts":"then"}\n')
    (tool.control("hooks/pre.d") / "10-guard").write_text("#!/bin/sh\nexit 0\n")
    (tool.control("notes")).write_text("the administrator's own file\n")

    replaced = install_tool(tier, *version(tmp_path, 2))

    assert replaced.replaced and installed_version(tool) == "v2"
    assert tool.control("policy").read_text() == "allow coder_t tool:probe execute\n"
    assert tool.control("status").read_text() == "disabled\n"
    assert tool.control("log").read_text() == '{"ts":"then"}\n'
    assert (tool.control("hooks/pre.d") / "10-guard").exists()
    assert tool.control("notes").exists()
    assert not tool.control("program").exists(), "v2 has no program control; v1's must go"
    assert sorted(os.listdir(tier.directory)) == [LOCK_FILE, "probe", "probe.d"]


def test_a_reader_never_sees_an_entry_without_its_complete_controls(
    tier: Tier, tmp_path: Path
) -> None:
    """While another process reinstalls, the entry and its control directory are always there,
    and controls read as the runner reads them are the entry's own version."""
    versions = [version(tmp_path, 1), version(tmp_path, 2)]
    install_tool(tier, *versions[0])
    stop = multiprocessing.Event()
    violations = multiprocessing.Queue()
    reader = multiprocessing.Process(
        target=_read_until_stopped, args=(tier.tool("probe"), stop, violations)
    )
    reader.start()
    try:
        for round_number in range(60):
            install_tool(tier, *versions[round_number % 2])
    finally:
        stop.set()
        reader.join(30)
    checked = violations.get(timeout=5)
    assert checked == "ok", checked


def _read_until_stopped(tool: ToolObject, stop: Any, violations: Any) -> None:
    """Read as the runner does: controls between two looks at the same entry, while no commit
    is between its two swaps."""
    consistent_reads = 0
    while not stop.is_set() or consistent_reads == 0:
        before = _identity(tool.executable)
        swapping = commit_in_progress(tool.directory, tool.name)
        if before is None or not tool.control_dir.is_dir():
            violations.put("the entry or its control directory was missing")
            return
        problems = layout_problems(tool)
        try:
            program = tool.executable.read_text().split()[-1]
            schema = json.loads(tool.control("schema").read_text())["title"]
        except (OSError, ValueError) as exc:
            violations.put(f"a reader failed: {exc!r}")
            return
        swapping = swapping or commit_in_progress(tool.directory, tool.name)
        if not swapping and before == _identity(tool.executable):
            consistent_reads += 1
            if problems or program != schema:
                violations.put(f"entry {program} with controls {schema}: {problems}")
                return
    violations.put("ok")


def test_a_listing_during_reinstalls_shows_one_whole_available_version(
    tier: Tier, tmp_path: Path
) -> None:
    """T-8: ``ctx object list`` taken while another process reinstalls waits out the moment
    between the two swaps, as a call does, instead of listing the tool unavailable."""
    versions = [version(tmp_path, 1), version(tmp_path, 2)]
    install_tool(tier, *versions[0])
    stop = multiprocessing.Event()
    listings = multiprocessing.Queue()
    lister = multiprocessing.Process(target=_list_until_stopped, args=(tier, stop, listings))
    lister.start()
    try:
        for round_number in range(60):
            install_tool(tier, *versions[round_number % 2])
    finally:
        stop.set()
        lister.join(30)
    seen = listings.get(timeout=5)
    assert seen and all(
        status == "available" and description in ("probe version 1", "probe version 2")
        for status, description in seen
    ), sorted(set(seen))


def _list_until_stopped(tier: Tier, stop: Any, listings: Any) -> None:
    seen = []
    while not stop.is_set() or not seen:
        seen.extend((listing.status, listing.description) for listing in list_tools([tier]))
    listings.put(seen)


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return None
    return status.st_dev, status.st_ino, status.st_ctime_ns


class _CrashAt(durable.FsOps):
    """Real operations that kill the process just before the ``crash_at``-th mutation."""

    MUTATIONS = ("mkdir", "rmdir", "unlink", "create_file", "write", "fsync", "link", "rename")

    def __init__(self, crash_at: int) -> None:
        super().__init__()
        self.crash_at, self.count = crash_at, 0
        for name in (*self.MUTATIONS, "rename_noreplace", "rename_exchange"):
            setattr(self, name, self._counted(getattr(super(), name)))

    def _counted(self, operation: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            self.count += 1
            if self.count == self.crash_at:
                os._exit(0)
            return operation(*args, **kwargs)

        return run


def _mutations_of_an_install(tier: Tier, tmp_path: Path) -> int:
    counter = _CrashAt(crash_at=0)
    install_tool(tier, *version(tmp_path, 1))
    install_tool(tier, *version(tmp_path, 2), ops=counter)
    return counter.count


def test_a_crash_at_any_point_of_a_reinstall_is_repaired_to_one_whole_version(
    tmp_path: Path,
) -> None:
    first = parse_tier(_fresh_root(tmp_path, 0), "system")
    crash_points = _mutations_of_an_install(first, tmp_path)
    assert crash_points > 20
    seen = set()
    for crash_at in range(1, crash_points + 1):
        tier = parse_tier(_fresh_root(tmp_path, crash_at), "system")
        install_tool(tier, *version(tmp_path, 1))
        tool = tier.tool("probe")
        tool.control("policy").write_text("allow coder_t tool:probe execute\n")
        tool.control("log").write_text("line\n")

        pid = os.fork()
        if pid == 0:  # the installer, killed in the middle
            install_tool(tier, *version(tmp_path, 2), ops=_CrashAt(crash_at))
            os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, f"no crash at point {crash_at}"
        assert tool.executable.exists(), f"no version visible after a crash at {crash_at}"
        if not commit_in_progress(tier.directory, "probe"):
            installed_version(tool)  # what a reader may take is one whole version

        repair_tier(tier)

        seen.add(installed_version(tool))
        assert layout_problems(tool) == [], crash_at
        assert tool.control("policy").read_text() == "allow coder_t tool:probe execute\n"
        assert tool.control("log").read_text() == "line\n"
        assert sorted(os.listdir(tier.directory)) == [LOCK_FILE, "probe", "probe.d"], crash_at
    assert seen == {"v1", "v2"}


def _fresh_root(tmp_path: Path, number: int) -> Path:
    root = tmp_path / f"root-{number}"
    storage.ensure_root_abi(root)
    return root


def test_ctx_object_install_list_and_tiers(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    storage.ensure_root_abi(root)
    manifest_path = tmp_path / "probe.json"
    manifest_path.write_text(json.dumps(probe_manifest(tmp_path, 1)))
    install = [*CTX, "object", "install", str(manifest_path), "--tier"]

    system = _run([*install, "system", "--source", str(root)])
    user = _run([*install, "user", "--storage", str(root)])
    shared = _run([*install, "shared:nope", "--storage", str(root)])
    bad_tier = _run([*install, "moon", "--storage", str(root)])
    listed = _run([*CTX, "object", "list", "--storage", str(root), "--json"])

    assert system.returncode == 0 and "installed probe in tier system" in system.stdout
    assert user.returncode == 0 and (root / f"home/{os.getuid()}/tool/probe.d/schema").exists()
    assert shared.returncode == 1 and "ENOENT" in shared.stderr
    assert "ctx shared create" in shared.stderr
    assert bad_tier.returncode == 2 and "EINVAL: unknown tier" in bad_tier.stderr
    rows = json.loads(listed.stdout)
    assert [(row["name"], row["tier"], row["status"]) for row in rows] == [
        ("probe", "system", "available"),
        ("probe", "user", "available"),
    ]
    assert [listing.name for listing in list_tools([parse_tier(root, "system")])] == ["probe"]
    assert set(REQUIRED_FILES) <= set(os.listdir(root / "tool/probe.d"))


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True)


@pytest.mark.parametrize(
    ("place", "errno_name"),
    [("probe", "EISDIR"), ("probe.d/schema", "EISDIR"), ("probe.d/hooks", "ENOTDIR")],
)
def test_install_refuses_to_replace_what_an_install_did_not_write(
    tier: Tier, tmp_path: Path, place: str, errno_name: str
) -> None:
    install_tool(tier, *version(tmp_path, 1))
    in_the_way = tier.directory / place
    if in_the_way.is_dir():
        shutil.rmtree(in_the_way)
        in_the_way.write_text("the user's file\n")
    else:
        in_the_way.unlink()
        in_the_way.mkdir()
        (in_the_way / "data").write_text("precious\n")
    before = _tree(tier.directory)
    manifest_path = tmp_path / "probe.json"
    manifest_path.write_text(json.dumps(probe_manifest(tmp_path, 2)))

    install = [*CTX, "object", "install", str(manifest_path), "--tier", "system"]

    completed = _run([*install, "--storage", str(tier.root)])

    assert completed.returncode == 1
    assert completed.stderr.startswith(f"ctx: {errno_name}: {in_the_way} is a ")
    assert "nothing was changed" in completed.stderr
    assert _tree(tier.directory) == before


def _tree(directory: Path) -> dict[str, bytes | None]:
    return {
        str(path.relative_to(directory)): None if path.is_dir() else path.read_bytes()
        for path in sorted(directory.rglob("*"))
    }


@pytest.mark.parametrize(
    "program",
    [
        "{ not json",
        "[1, 2]",
        '{"type": 5}',
        # Not JSON as object check reads a manifest: on disk no more valid than there.
        '{"type": "object", "minimum": NaN}',
        '{"type": "object", "type": "string"}',
    ],
)
def test_a_malformed_program_makes_the_tool_unavailable_in_list_and_bootstrap(
    tmp_path: Path, program: str
) -> None:
    root = tmp_path / "storage"
    assert _run([*CTX, "--storage", str(root), "bootstrap"]).returncode == 0
    manifest_path = tmp_path / "probe.json"
    manifest_path.write_text(json.dumps(probe_manifest(tmp_path, 1)))
    install = [*CTX, "--storage", str(root), "object", "install", str(manifest_path)]
    assert _run([*install, "--tier", "system"]).returncode == 0
    (root / "tool/probe.d/program").write_text(program)

    as_json = _run([*CTX, "--storage", str(root), "object", "list", "--json"])
    as_text = _run([*CTX, "--storage", str(root), "object", "list"])
    bootstrapped = _run([*CTX, "--storage", str(root), "bootstrap"])

    (row,) = [row for row in json.loads(as_json.stdout) if row["name"] == "probe"]
    assert row["status"] == "unavailable" and row["reason"].endswith("(C-2)")
    assert row["problems"] == [f"probe.d/program: {row['reason']}"]
    (line,) = [line for line in as_text.stdout.splitlines() if line.startswith("probe ")]
    assert line.split()[2] == "unavailable" and line.endswith(f"({row['reason']})")
    assert bootstrapped.returncode == 1
    assert (
        f"problem   tool/probe: unavailable: {row['reason']}; left untouched"
        in bootstrapped.stdout.splitlines()
    )
    assert (root / "tool/probe.d/program").read_text() == program


def test_list_tells_damaged_from_disabled_and_unavailable(tier: Tier, tmp_path: Path) -> None:
    for number, status in enumerate(["disabled\n", "unavailable: maintenance\n", None], 1):
        manifest, program = version(tmp_path, number)
        manifest = dataclasses.replace(manifest, name=f"probe{number}")
        install_tool(tier, manifest, program)
        if status is None:
            (tier.directory / f"probe{number}.d/schema").write_text("{ not json")
        else:
            (tier.directory / f"probe{number}.d/status").write_text(status)

    rows = [(row.name, row.status, row.reason, bool(row.problems)) for row in list_tools([tier])]

    assert rows == [
        ("probe1", "disabled", "", False),
        ("probe2", "unavailable", "maintenance", False),
        ("probe3", "damaged", "", True),
    ]


@pytest.mark.parametrize("tier_text", ["bogus", "shared:.bad", "shared:", "shared:cortexfs-docs"])
@pytest.mark.parametrize("command", ["install", "list"])
def test_a_malformed_tier_is_a_usage_error(tmp_path: Path, tier_text: str, command: str) -> None:
    root = tmp_path / "storage"
    storage.ensure_root_abi(root)
    manifest_path = tmp_path / "probe.json"
    manifest_path.write_text(json.dumps(probe_manifest(tmp_path, 1)))
    arguments = [str(manifest_path)] if command == "install" else []

    completed = _run(
        [*CTX, "--storage", str(root), "object", command, *arguments, "--tier", tier_text]
    )

    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.startswith("ctx: EINVAL: ")
    assert os.listdir(root / "tool") == []


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "storage root"),
        (["--tier", "system"], "storage root"),
        (["--tier", "shared:nosuch"], "ctx shared create nosuch"),
    ],
)
def test_listing_what_does_not_exist_is_enoent(
    tmp_path: Path, arguments: list[str], message: str
) -> None:
    root = tmp_path / "storage"
    if "shared:nosuch" in arguments:
        storage.ensure_root_abi(root)

    completed = _run([*CTX, "--storage", str(root), "object", "list", *arguments])

    assert completed.returncode == 1
    assert completed.stdout == ""
    assert completed.stderr.startswith("ctx: ENOENT: ") and message in completed.stderr


def test_listing_a_user_tier_nobody_installed_into_is_empty(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    storage.ensure_root_abi(root)

    completed = _run([*CTX, "--storage", str(root), "object", "list", "--tier", "user", "--json"])

    assert (completed.returncode, json.loads(completed.stdout)) == (0, [])


@pytest.mark.parametrize("odd", ["directory", "fifo"])
def test_what_is_no_file_at_a_commit_markers_name_is_named_and_never_waited_on(
    tier: Tier, tmp_path: Path, odd: str
) -> None:
    """R-5, T-8: a directory or a FIFO someone made at ``.t~commit`` is no marker of an
    interrupted install: install and repair refuse naming it, at once (a FIFO is never
    opened to wait for a writer), and leave it as it is."""
    marker = tier.directory / ".t~commit"
    if odd == "directory":
        marker.mkdir()
    else:
        os.mkfifo(marker)

    for attempt in (lambda: install_tool(tier, *version(tmp_path, 1)), lambda: repair_tier(tier)):
        with pytest.raises((OSError, CtxError)) as refused:
            attempt()
        assert ".t~commit" in str(refused.value), refused.value
    assert marker.is_dir() if odd == "directory" else stat.S_ISFIFO(marker.lstat().st_mode)
    assert not tier.tool("probe").executable.exists()
