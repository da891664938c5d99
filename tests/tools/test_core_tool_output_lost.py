"""A core tool whose output cannot be written ends as ``ctx`` does (SPEC T-3, docs/tools.md):
a reader that left (``fs.read F | head -c 10``) with 141, quietly, as a shell reports a
command SIGPIPE ended; an output that cannot be written (``> /dev/full``) with one line on
stderr naming the errno, and 74.  Never a traceback, in either mode.  Every program here is
the one a freshly bootstrapped storage root holds, run as a user would run it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cortexfs import storage

MODES = ["terminal", "native"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("core-output") / "storage"
    report = storage.bootstrap(root)
    assert not report.problems, report.problems
    return root


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file far larger than a pipe holds, so that the tool is still writing when its
    reader leaves."""
    path = tmp_path_factory.mktemp("core-output-data") / "big.txt"
    path.write_text("0123456789abcdef\n" * 200_000)
    return path


def _env(mode: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", **({"CTX_MODE": "native"} if mode == "native" else {})}


@pytest.mark.parametrize("mode", MODES)
def test_a_reader_that_left_ends_the_tool_with_141_quietly(
    root: Path, big: Path, mode: str
) -> None:
    tool = subprocess.Popen(
        [str(root / "tool" / "fs.read"), str(big)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(mode),
    )
    assert tool.stdout is not None and tool.stderr is not None
    assert tool.stdout.read(10)
    tool.stdout.close()  # the reader leaves, as head does
    stderr = tool.stderr.read().decode()
    assert tool.wait(timeout=60) == 141, stderr
    assert stderr == ""


@pytest.mark.parametrize(
    ("mode", "readable"),
    [("terminal", True), ("native", True), ("native", False)],
    ids=["terminal-answer", "native-answer", "native-failure"],
)
def test_an_output_that_cannot_be_written_is_said_and_exits_74(
    root: Path, big: Path, mode: str, readable: bool
) -> None:
    """The answer, and in native mode the error object of a failure (in terminal mode a
    failure writes nothing on stdout), go to a full disk."""
    path = big if readable else big.with_name("missing.txt")
    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            [str(root / "tool" / "fs.read"), str(path)],
            stdin=subprocess.DEVNULL,
            stdout=full,
            stderr=subprocess.PIPE,
            env=_env(mode),
            timeout=60,
        )
    stderr = done.stderr.decode()
    assert done.returncode == 74, stderr
    assert stderr.endswith(
        "fs.read: ENOSPC: cannot write standard output (No space left on device)\n"
    ), stderr
    assert "Traceback" not in stderr
