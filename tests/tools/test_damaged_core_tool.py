"""A core tool's launcher damaged inside its archive, the same size, so that its stamp still
reads as this version's (SPEC R-5): a call ends in one line naming the tool, the damage and
``ctx bootstrap`` (ENOEXEC, exit status 1), never in a traceback; bootstrap then repairs it.
A byte of ``__main__.py`` changes nothing: its bytecode is what runs.  A failure of the tool's
own code in an intact launcher is still the tool's own.

Not covered, and not tested: a byte of ``__main__.pyc``, of its entry in the zip's directory or
of the end record, which the interpreter reads before any code of the launcher runs
(docs/tools.md, "The core tools")."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import pytest

from cortexfs import storage
from cortexfs.tools.core import launcher
from cortexfs.tools.core.bootstrap import core_manifest
from cortexfs.tools.core.launcher import same_program
from cortexfs.tools.install import install_tool, parse_tier
from tests.tools.support import World

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]
DIRECT_ENV = {"CTX_MODE": "native", "CTX_MOUNTS": json.dumps([["/", "/", "ro"]]), "CTX_CWD": "/"}
REMEDY = "run 'ctx bootstrap' to repair it"


def loaded_member(archive: zipfile.ZipFile, module: str) -> zipfile.ZipInfo:
    """The entry the interpreter loads ``module`` from: its bytecode when bundled."""
    names = archive.namelist()
    return archive.getinfo(module + "c" if module + "c" in names else module)


def member_data_offset(program: bytes, info: zipfile.ZipInfo) -> int:
    """Where ``info``'s compressed bytes start in ``program`` (after its local header)."""
    header = info.header_offset  # zipfile gives it from the start of the whole program
    name_length = int.from_bytes(program[header + 26 : header + 28], "little")
    extra_length = int.from_bytes(program[header + 28 : header + 30], "little")
    return header + 30 + name_length + extra_length


def inflate_breaks(program: bytes, info: zipfile.ZipInfo, start: int) -> int:
    """The first byte of ``info``'s compressed data from ``start`` on whose flip zlib refuses.
    Not any byte: zipimport checks no CRC, and a flip that still inflates may land in a string
    constant of the bytecode, leaving a module that loads and runs (damage only bootstrap's
    comparison of every byte finds)."""
    begin = member_data_offset(program, info)
    data = program[begin : begin + info.compress_size]
    for offset in range(start, len(data)):
        damaged = bytearray(data)
        damaged[offset] ^= 0xFF
        try:
            zlib.decompress(bytes(damaged), -zlib.MAX_WBITS)
        except zlib.error:
            return begin + offset
    raise AssertionError(f"no byte of {info.filename} from {start} on breaks its inflation")


def central_entry_offset(program: bytes, name: str) -> int:
    """Where the zip directory's entry of ``name`` starts in ``program``."""
    directory = program.rindex(b"PK\x05\x06")
    entry = program.rindex(b"PK\x01\x02", 0, directory)
    while not program[entry + 46 :].startswith(name.encode()):
        entry = program.rindex(b"PK\x01\x02", 0, entry)
    return entry


def damaged_offset(program: bytes, place: str) -> int:
    """One byte of ``place`` in the launcher ``program``."""
    archive = zipfile.ZipFile(io.BytesIO(program))
    tool_module = loaded_member(archive, "cortexfs/tools/core/fs_stat.py")
    toolio = loaded_member(archive, "cortexfs/tools/core/toolio.py")
    manifest = archive.getinfo("cortexfs/tools/core/manifests/fs.stat.json")
    return {
        # imported first, by the __main__
        "the tool's module, compressed": member_data_offset(program, tool_module) + 1,
        # imported by that module
        "toolio, compressed": inflate_breaks(program, toolio, toolio.compress_size // 2),
        # read by run() once the modules are loaded
        "the manifest, compressed": member_data_offset(program, manifest) + 1,
        # the directory entry's offset of toolio's local header (its low byte)
        "toolio's entry in the zip directory": central_entry_offset(program, toolio.filename) + 42,
        # the directory entry's compressed size of the tool's module: its third byte, so that
        # the size runs past the archive's end whatever the module's size is; a low byte under
        # 0x80 flipped makes it at most 255 bytes larger, and the module still inflates whole
        # (zlib stops at the end of its stream), so that flip would damage nothing
        "the module's size in the zip directory": (
            central_entry_offset(program, tool_module.filename) + 22
        ),
    }[place]


PLACES = (
    "the tool's module, compressed",
    "toolio, compressed",
    "the manifest, compressed",
    "toolio's entry in the zip directory",
    "the module's size in the zip directory",
)


def flip_byte(path: Path, offset: int) -> None:
    """Damage ``path`` in place: one byte changed, the same inode and size."""
    fd = os.open(path, os.O_RDWR)
    try:
        (byte,) = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([byte ^ 0xFF]), offset)
    finally:
        os.close(fd)


def run_directly(tool: Path, path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(tool), json.dumps({"path": path})],
        capture_output=True,
        text=True,
        env=DIRECT_ENV,
        check=False,
    )


def ctx_run_fs_stat(world: World) -> subprocess.CompletedProcess[str]:
    command = [*CTX, "--storage", str(world.root), "run", "--agent", "coder", "--native"]
    return subprocess.run(
        [*command, "fs.stat"], input='{"path": "/workspace"}', capture_output=True, text=True
    )


@pytest.mark.parametrize("place", PLACES)
def test_a_launcher_damaged_inside_its_archive_names_ctx_bootstrap(
    world: World, place: str
) -> None:
    world.agent("coder", tools=["fs.stat"])
    world.allow_tool("fs.stat")
    tool = world.root / "tool" / "fs.stat"
    size = tool.stat().st_size
    flip_byte(tool, damaged_offset(tool.read_bytes(), place))
    assert tool.stat().st_size == size

    direct = run_directly(tool, str(world.workspace))

    assert direct.returncode == 1, direct
    assert "Traceback" not in direct.stderr
    (line,) = direct.stderr.splitlines()
    assert line.startswith(f"fs.stat: ENOEXEC: {tool} is damaged (")
    assert line.endswith(f"); {REMEDY}")
    report = json.loads(direct.stdout)
    assert (report["error"], report["errno"]) == ("ENOEXEC", 8)

    done = ctx_run_fs_stat(world)

    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["error"]["errno"] == 8, result
    assert "is damaged (" in result["error"]["message"]
    assert result["error"]["message"].endswith(REMEDY), result

    repaired = storage.bootstrap(world.root)

    assert "tool/fs.stat" in repaired.repaired
    done = ctx_run_fs_stat(world)
    result = json.loads(done.stdout.splitlines()[-1])
    assert done.returncode == 0 and result["status"] == "ok", done.stdout


def test_a_launcher_damaged_in_its_main_source_runs_its_main_bytecode(world: World) -> None:
    if not launcher.carries_bytecode(launcher.core_interpreter()[0]):
        pytest.skip("the core tools run on another interpreter, which gets source only")
    tool = world.root / "tool" / "fs.stat"
    program = tool.read_bytes()
    main = zipfile.ZipFile(io.BytesIO(program)).getinfo("__main__.py")
    flip_byte(tool, member_data_offset(program, main) + 1)

    direct = run_directly(tool, str(world.workspace))

    assert direct.returncode == 0, direct.stderr
    assert json.loads(direct.stdout)["type"] == "directory"
    assert "tool/fs.stat" in storage.bootstrap(world.root).repaired
    assert same_program(tool.read_bytes(), program)


def test_a_failure_of_the_tools_own_code_is_not_damage(world: World) -> None:
    """A bug of the tool in an intact launcher ends as it always did: the tool's traceback."""
    interpreter, _ = launcher.core_interpreter()
    modules = launcher.bundled_modules(interpreter, launcher.package_parent())
    bug = b"\n\ndef stat_entry(request, native):\n    raise RuntimeError('a bug of fs.stat')\n"
    buggy = [
        (name, data + bug if name == "cortexfs/tools/core/fs_stat.py" else data)
        for name, data in modules
        if not name.endswith(".pyc")  # the source is what changed: no stale bytecode
    ]
    program = launcher.render_launcher(interpreter, buggy, "fs_stat")
    exec_path = world.scratch / "fs.stat.program"
    exec_path.write_bytes(program)
    install_tool(parse_tier(world.root, "system"), core_manifest("fs.stat", exec_path), program)
    tool = world.root / "tool" / "fs.stat"

    direct = run_directly(tool, str(world.workspace))

    assert direct.returncode == 1
    assert direct.stderr.splitlines()[0] == "Traceback (most recent call last):"
    assert direct.stderr.splitlines()[-1] == "RuntimeError: a bug of fs.stat"
    assert "damaged" not in direct.stderr + direct.stdout
    # and an input the tool refuses is refused as always
    refused = subprocess.run(
        [str(tool), '{"pth": "/"}'], capture_output=True, text=True, env=DIRECT_ENV, check=False
    )
    assert refused.returncode == 2
    assert refused.stderr.startswith("fs.stat: EINVAL: 'path' is required; 'pth' is not ")
