"""A core tool whose launcher's bundled bytecode was changed by one byte may crash the interpreter
(SIGSEGV, SIGBUS…) before the launcher's own check can name the damage: the runner then compares
the archive with its stamp's digest and reports ENOEXEC naming ``ctx bootstrap`` (SPEC R-5), in
``ctx run`` of both modes and in a worker's job.  A tool that ends by such a signal with its
launcher intact, or a tool that is not a core tool, is reported as the signal it ended by.

Which byte crashes depends on the build (the interpreter, the sources): the test flips bytes of
a module fs.stat imports in turn, skipping those that zlib or marshal refuse (which the
launcher's own check names), until one run of the flipped launcher ends by such a signal."""

from __future__ import annotations

import errno
import io
import json
import marshal
import signal
import subprocess
import zipfile
import zlib
from pathlib import Path

import pytest

from cortexfs import storage
from cortexfs.queue import Queue, publish, queue_path
from cortexfs.shared.spaces import create_shared_space
from cortexfs.tools.core import launcher
from tests.support.cli import ctx
from tests.tools.support import World
from tests.tools.test_damaged_core_tool import DIRECT_ENV, REMEDY, flip_byte, member_data_offset

SIGNALS_OF_DAMAGE = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT)
# fs.stat imports it before it reads its input; its bytecode, not its source, is what is loaded.
CRASHING_MEMBER = "cortexfs/tools/core/confine.pyc"
# Runs of flipped launchers tried at most.  On the interpreters tested about half of the first
# few flips that still decompress and unmarshal crash it.
MOST_RUNS = 60


def crashing_flip(tool: Path, scratch: Path) -> tuple[int, int]:
    """An offset of ``tool`` whose byte, flipped, makes the launcher die by one of
    :data:`SIGNALS_OF_DAMAGE`, and that signal."""
    if not launcher.carries_bytecode(launcher.core_interpreter()[0]):
        pytest.skip("the core tools run on another interpreter, which gets source only")
    program = tool.read_bytes()
    info = zipfile.ZipFile(io.BytesIO(program)).getinfo(CRASHING_MEMBER)
    start = member_data_offset(program, info)
    compressed = program[start : start + info.compress_size]
    intact = zlib.decompress(compressed, -15)
    flipped = scratch / "fs.stat.flipped"
    runs = 0
    for index in range(len(compressed)):
        changed = bytearray(compressed)
        changed[index] ^= 0xFF
        try:
            bytecode = zlib.decompress(bytes(changed), -15)
            marshal.loads(bytecode[16:])  # after the .pyc header
        except Exception:
            continue  # the import fails with an exception: the launcher names that itself
        if bytecode == intact:
            continue
        damaged = bytearray(program)
        damaged[start + index] ^= 0xFF
        flipped.write_bytes(damaged)
        flipped.chmod(0o755)
        ran = subprocess.run(
            [str(flipped), '{"path": "/"}'], capture_output=True, env=DIRECT_ENV, check=False
        )
        if -ran.returncode in SIGNALS_OF_DAMAGE:
            return start + index, -ran.returncode
        runs += 1
        if runs == MOST_RUNS:
            break
    pytest.skip(f"no flipped byte of {CRASHING_MEMBER} in {runs} runs crashed this interpreter")


@pytest.fixture
def crashed_fs_stat(world: World) -> tuple[Path, int]:
    """fs.stat of ``world``, damaged so that it dies by a signal; the signal."""
    world.agent("coder", tools=["fs.stat"])
    world.allow_tool("fs.stat")
    tool = world.root / "tool" / "fs.stat"
    offset, signal_number = crashing_flip(tool, world.scratch)
    flip_byte(tool, offset)
    return tool, signal_number


def test_a_core_tool_crashed_by_its_damage_is_named_damaged_in_native_mode(
    world: World, crashed_fs_stat: tuple[Path, int]
) -> None:
    tool, signal_number = crashed_fs_stat
    name = signal.Signals(signal_number).name

    done = ctx(
        world.root, "run", "--agent", "coder", "--native", "fs.stat", stdin='{"path": "/workspace"}'
    )

    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["exit_status"] == 128 + signal_number
    error = result["error"]
    assert (error["error"], error["errno"], error["stage"]) == ("ENOEXEC", errno.ENOEXEC, "run")
    assert error["message"] == (
        f"fs.stat was killed by {name} (exit status {128 + signal_number}): {tool} is damaged "
        f"(its archive is not the bytes its stamp's digest gives); {REMEDY}"
    )
    logged = world.tool_log("fs.stat")[-1]
    assert logged["status"] == "error" and logged["exit_status"] == 128 + signal_number, logged

    assert "tool/fs.stat" in storage.bootstrap(world.root).repaired
    done = ctx(
        world.root, "run", "--agent", "coder", "--native", "fs.stat", stdin='{"path": "/workspace"}'
    )
    assert done.returncode == 0, done.stdout
    assert json.loads(done.stdout.splitlines()[-1])["status"] == "ok"


def test_a_core_tool_crashed_by_its_damage_is_named_damaged_in_terminal_mode(
    world: World, crashed_fs_stat: tuple[Path, int]
) -> None:
    tool, signal_number = crashed_fs_stat

    done = ctx(world.root, "run", "--agent", "coder", "fs.stat", '{"path": "/workspace"}')

    assert done.returncode == 128 + signal_number  # the tool's exit status, as always
    (line,) = done.stderr.splitlines()
    assert line.startswith("ctx: ENOEXEC: fs.stat was killed by SIG"), done.stderr
    assert line.endswith(
        f"{tool} is damaged (its archive is not the bytes its stamp's digest gives); {REMEDY}"
    )


def test_a_worker_fails_the_job_of_a_crashed_core_tool_naming_the_damage(
    world: World, crashed_fs_stat: tuple[Path, int]
) -> None:
    create_shared_space(world.root, "proj")
    with Queue.open(queue_path(world.root, "proj")) as queue:
        publish(queue, {"tool": "fs.stat", "input": {"path": "/workspace"}}, "j0")

    worked = ctx(world.root, "queue", "work", "--project", "proj", "--agent", "coder", "--drain")

    assert worked.returncode == 0, worked.stderr
    stored = queue_path(world.root, "proj") / "failed" / "j0.req.json.result"
    reason = json.loads(stored.read_text())["reason"]
    assert reason.startswith("ENOEXEC: fs.stat was killed by SIG"), reason
    assert reason.endswith(f"; {REMEDY} [run]"), reason


SELF_KILLING = "#!/bin/sh\nkill -SEGV $$\n"


def test_a_tool_that_is_not_core_and_dies_by_sigsegv_is_reported_as_the_signal(
    world: World,
) -> None:
    world.install("sh.segv", SELF_KILLING)
    world.agent("coder", tools=["sh.segv"])
    world.allow_tool("sh.segv")

    result = world.run("sh.segv")

    assert result.exit_status == 128 + signal.SIGSEGV
    assert result.error is not None
    assert (result.error.errno, result.error.stage) == (0, "exit")
    assert result.error.message == f"sh.segv exited with status {128 + signal.SIGSEGV}"


def test_an_intact_core_tool_that_dies_by_sigsegv_is_reported_as_the_signal(
    world: World,
) -> None:
    """shell.exec's command (the shell it becomes, by exec) kills the tool's process with
    SIGSEGV: the launcher's archive is its stamp's, so the signal is the tool's, not damage."""
    world.agent("coder", tools=["shell.exec"])
    world.allow_tool("shell.exec")
    program = (world.root / "tool" / "shell.exec").read_bytes()

    result = world.run("shell.exec", {"cmd": "kill -SEGV $$"})

    assert not launcher.damaged_archive(program)
    assert result.exit_status == 128 + signal.SIGSEGV, result
    assert result.error is not None
    assert result.error.errno != errno.ENOEXEC, result.error
    assert result.error.message.startswith(f"shell.exec exited with status {128 + signal.SIGSEGV}")
    assert "damaged" not in result.error.message
