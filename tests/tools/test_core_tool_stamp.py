"""The stamp a core tool's launcher carries on its second line, by which each ``ctx run`` of a
core tool tells this version's install from another's without opening the archive (SPEC R-5):
a launcher as every earlier version wrote it (no stamp), one of another interpreter, module or
bundled file, or one cut short is another version's; bootstrap replaces each; the stamped
launcher still runs under ``python -IS``; and a call of a core tool imports no zip or
compression module to judge it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from collections.abc import Callable
from hashlib import blake2b
from pathlib import Path

import pytest

from cortexfs import storage
from cortexfs.tools.core import launcher
from cortexfs.tools.core.bootstrap import core_manifest
from cortexfs.tools.core.installed import tools_of_another_version
from cortexfs.tools.install import install_tool, parse_tier
from tests.support.startup import run_ctx_watching
from tests.tools.support import World

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]
# What judging a launcher by its archive imported at each ctx run of a core tool.
ARCHIVE_MODULES = ("zipfile", "shutil", "bz2", "lzma")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "storage"
    storage.bootstrap(path)
    return path


def this_versions_modules() -> tuple[str, list[tuple[str, bytes]]]:
    interpreter, _ = launcher.core_interpreter()
    return interpreter, launcher.bundled_modules(interpreter, launcher.package_parent())


def install_program(root: Path, name: str, program: bytes, scratch: Path) -> None:
    """``program`` installed at core tool ``name`` from its core manifest, as bootstrap does."""
    exec_path = scratch / f"{name}.program"
    exec_path.write_bytes(program)
    install_tool(parse_tier(root, "system"), core_manifest(name, exec_path), program)


def without_stamp(program: bytes) -> bytes:
    """The launcher as every version before the stamp wrote it: interpreter line, archive."""
    interpreter_line, stamp_line, archive = program.split(b"\n", 2)
    assert stamp_line.startswith(b"#cortexfs-bundle ")
    return interpreter_line + b"\n" + archive


def test_this_versions_launcher_carries_its_stamp_and_is_the_same_bytes_each_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    interpreter, modules = this_versions_modules()

    program = launcher.render_launcher(interpreter, modules, "fs_stat")

    assert program == launcher.render_launcher(interpreter, modules, "fs_stat")
    # The same bytes from the modules archived afresh, not only from the archive kept.
    monkeypatch.setattr(launcher, "_archived", (b"", b""))
    assert program == launcher.render_launcher(interpreter, modules, "fs_stat")
    first, second, archive = program.split(b"\n", 2)
    mark, digest, size, archive_digest = second.split(b" ")
    assert (mark, int(size)) == (b"#cortexfs-bundle", len(archive))
    assert archive_digest.decode() == blake2b(archive, digest_size=32).hexdigest()
    sources = launcher.sources_digest(launcher.bundled_sources(launcher.package_parent()))
    with_bytecode = launcher.carries_bytecode(interpreter)
    assert digest.decode() == launcher.stamp(interpreter, "fs_stat", sources, with_bytecode)
    assert first + b"\n" == launcher.interpreter_line(interpreter)


def with_a_three_field_stamp(program: bytes) -> bytes:
    """The launcher as the versions before the archive's digest stamped it."""
    interpreter_line, stamp_line, archive = program.split(b"\n", 2)
    return b"\n".join([interpreter_line, stamp_line.rsplit(b" ", 1)[0], archive])


@pytest.mark.parametrize("as_written_before", [without_stamp, with_a_three_field_stamp])
def test_a_launcher_without_a_stamp_is_another_versions(
    root: Path, tmp_path: Path, as_written_before: Callable[[bytes], bytes]
) -> None:
    interpreter, modules = this_versions_modules()
    earlier = as_written_before(launcher.render_launcher(interpreter, modules, "fs_stat"))
    install_program(root, "fs.stat", earlier, tmp_path)

    assert tools_of_another_version(root) == ["fs.stat"]

    report = storage.bootstrap(root)  # compares every byte, and so replaces it
    assert "tool/fs.stat" in report.repaired
    assert tools_of_another_version(root) == []


def test_each_launcher_carries_the_modules_it_was_rendered_from() -> None:
    """The archive of modules kept between renders is never another module list's."""
    interpreter, modules = this_versions_modules()
    changed = "cortexfs/tools/core/toolio.py"
    other = [(name, data + b"# changed\n" if name == changed else data) for name, data in modules]

    renders = [launcher.render_launcher(interpreter, each, "fs_stat") for each in (modules, other)]
    renders.append(launcher.render_launcher(interpreter, modules, "fs_stat"))

    carried = [
        zipfile.ZipFile(io.BytesIO(program.split(b"\n", 2)[2])).read(changed) for program in renders
    ]
    assert carried == [dict(modules)[changed], dict(other)[changed], dict(modules)[changed]]
    assert renders[0] == renders[2]


@pytest.mark.parametrize(
    "changed",
    ["cortexfs/tools/core/toolio.py", "cortexfs/tools/core/manifests/fs.stat.json"],
)
def test_a_launcher_bundling_another_file_is_another_versions(
    root: Path, tmp_path: Path, changed: str
) -> None:
    interpreter, modules = this_versions_modules()
    other = [(name, data + b"\n" if name == changed else data) for name, data in modules]
    install_program(
        root, "fs.stat", launcher.render_launcher(interpreter, other, "fs_stat"), tmp_path
    )

    assert tools_of_another_version(root) == ["fs.stat"]


@pytest.mark.parametrize("other", ["interpreter", "module", "bytecode"])
def test_a_launcher_of_another_interpreter_module_or_bytecode_is_another_versions(
    root: Path, tmp_path: Path, other: str
) -> None:
    interpreter, modules = this_versions_modules()
    sources_only = [(name, data) for name, data in modules if not name.endswith(".pyc")]
    if other == "bytecode" and sources_only == modules:
        pytest.skip("the core tools run on another interpreter, which gets source only")
    program = {
        "interpreter": lambda: launcher.render_launcher("/opt/old/bin/python3", modules, "fs_stat"),
        "module": lambda: launcher.render_launcher(interpreter, modules, "fs_list"),
        "bytecode": lambda: launcher.render_launcher(interpreter, sources_only, "fs_stat"),
    }[other]()
    install_program(root, "fs.stat", program, tmp_path)

    assert tools_of_another_version(root) == ["fs.stat"]


@pytest.mark.parametrize("change", ["cut short", "appended to"])
def test_a_launcher_not_the_size_its_stamp_gives_is_another_versions(
    root: Path, tmp_path: Path, change: str
) -> None:
    program = (root / "tool" / "fs.stat").read_bytes()
    damaged = program[:-1] if change == "cut short" else program + b"\0"
    install_program(root, "fs.stat", damaged, tmp_path)

    assert tools_of_another_version(root) == ["fs.stat"]


def test_a_stamped_launcher_runs_under_python_is(root: Path, tmp_path: Path) -> None:
    tool = root / "tool" / "fs.stat"
    assert tool.read_bytes().split(b"\n", 2)[1].startswith(b"#cortexfs-bundle ")

    call = subprocess.run(
        [str(tool), json.dumps({"path": str(tmp_path)})],
        capture_output=True,
        text=True,
        env={"CTX_MODE": "native", "CTX_MOUNTS": json.dumps([["/", "/", "ro"]]), "CTX_CWD": "/"},
        check=False,
    )

    assert call.returncode == 0, call.stderr
    assert json.loads(call.stdout)["type"] == "directory"


def test_ctx_run_of_a_core_tool_judges_it_without_the_archive_modules(world: World) -> None:
    world.agent("coder", tools=["fs.stat"])
    world.allow_tool("fs.stat")
    command = ["run", "--storage", str(world.root), "--agent", "coder", "--native", "fs.stat"]

    call, loaded = run_ctx_watching(ARCHIVE_MODULES, command, stdin='{"path": "/workspace"}')

    result = json.loads(call.stdout.splitlines()[-1])
    assert result["type"] == "result" and result["status"] == "ok", result
    assert loaded == []


@pytest.mark.parametrize("as_written_before", [without_stamp, with_a_three_field_stamp])
def test_ctx_run_refuses_a_core_tool_without_a_stamp(
    world: World, as_written_before: Callable[[bytes], bytes]
) -> None:
    world.agent("coder", tools=["fs.stat"])
    world.allow_tool("fs.stat")
    earlier = as_written_before((world.root / "tool" / "fs.stat").read_bytes())
    install_program(world.root, "fs.stat", earlier, world.scratch)
    command = [*CTX, "--storage", str(world.root), "run", "--agent", "coder", "--native"]

    done = subprocess.run(
        [*command, "fs.stat"], input='{"path": "/workspace"}', capture_output=True, text=True
    )

    assert done.returncode == 1, done.stderr
    (frame,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert frame["error"]["message"].endswith(
        "were installed by another version of ctx; run 'ctx bootstrap' (the tool did not run)"
    )


@pytest.mark.parametrize("resize", [lambda b: b[:-100], lambda b: b + b"appended"])
def test_ctx_run_names_a_core_tool_cut_short_or_appended_to_as_damaged(
    world: World, resize: Callable[[bytes], bytes]
) -> None:
    """A launcher of this version whose size no longer matches its stamp is damaged, not
    another version's: the refusal says so, and bootstrap's reinstall makes it run again."""
    world.agent("coder", tools=["fs.stat"])
    world.allow_tool("fs.stat")
    executable = world.root / "tool" / "fs.stat"
    executable.write_bytes(resize(executable.read_bytes()))
    command = [*CTX, "--storage", str(world.root), "run", "--agent", "coder", "--native"]

    def call() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, "fs.stat"], input='{"path": "/workspace"}', capture_output=True, text=True
        )

    refused = call()
    assert refused.returncode == 1, refused.stderr
    (frame,) = [json.loads(line) for line in refused.stdout.splitlines()]
    assert frame["error"]["error"] == "EINVAL", frame
    assert frame["error"]["message"] == (
        f"core tool fs.stat in {world.root} is damaged: not the size bootstrap wrote (cut short, "
        "or appended to), and bootstrap reinstalls it: run 'ctx bootstrap' (the tool did not run)"
    )
    storage.bootstrap(world.root)
    assert call().returncode == 0
