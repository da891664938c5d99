"""``ctx run --native`` whose storage root cannot be resolved (SPEC T-3): the ``result`` frame
comes always, last, as for a root that does not exist, with the errno its stderr line says;
terminal mode has no frames, and a malformed command line is still a usage error without
one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CTX = str(Path(sys.executable).with_name("ctx"))


def _run(
    storage: str, *options: str, before: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}
    return subprocess.run(
        [CTX, *before, "run", *options, "--agent", "coder", "fs.read"],
        input="{}",
        env={**env, "CTX_STORAGE": storage},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(params=["a loop of links", "CTX_STORAGE set but empty", "missing"])
def unusable_root(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    """A storage root no call can be made in, and the errno that says why."""
    if request.param == "a loop of links":
        (tmp_path / "a").symlink_to("b")
        (tmp_path / "b").symlink_to("a")
        return str(tmp_path / "a"), "ELOOP"
    if request.param == "missing":
        return str(tmp_path / "missing"), "ENOENT"
    return "", "EINVAL"


def test_native_mode_answers_with_one_result_frame(unusable_root: tuple[str, str]) -> None:
    storage, code = unusable_root
    done = _run(storage, "--native")
    assert done.returncode == 1, done
    (line,) = done.stdout.splitlines()
    frame = json.loads(line)
    assert (frame["type"], frame["status"], frame["exit_status"]) == ("result", "error", None)
    assert (frame["tool"], frame["agent"], frame["session"]) == ("fs.read", "coder", "")
    assert (frame["error"]["error"], frame["error"]["stage"]) == (code, "agent"), frame
    if done.stderr:  # said on stderr too, in the same words
        assert done.stderr == f"ctx: {code}: {frame['error']['message']}\n", done


def test_terminal_mode_gives_no_frame(unusable_root: tuple[str, str]) -> None:
    storage, code = unusable_root
    done = _run(storage)
    assert (done.returncode, done.stdout) == (126, ""), done
    assert done.stderr.startswith(f"ctx: {code}: "), done


def test_a_malformed_command_line_has_no_frame(tmp_path: Path) -> None:
    """Two roots named, before ``run`` and after it: a usage error (exit 2) before any call,
    as the help says, with no frame."""
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    before = ("--storage", str(tmp_path))
    done = _run("", "--native", "--storage", str(tmp_path / "a"), before=before)
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr.startswith("ctx: EINVAL: two storage roots given: "), done


def test_a_frame_that_cannot_be_written_says_the_tool_did_not_run(
    unusable_root: tuple[str, str],
) -> None:
    """The help: when a frame cannot be written (``> /dev/full``), exit 74 and
    ``ctx: ENOSPC: cannot write standard output (…)`` saying whether the tool ran and where
    its result is recorded: here nowhere, as for every call refused before its session."""
    storage, code = unusable_root
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}
    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            [CTX, "run", "--native", "--agent", "coder", "fs.read"],
            input=b"{}",
            stdout=full,
            stderr=subprocess.PIPE,
            env={**env, "CTX_STORAGE": storage},
            timeout=60,
        )
    said = done.stderr.decode().splitlines()[-1]
    assert done.returncode == 74, done.stderr
    assert said.startswith(
        "ctx: ENOSPC: cannot write standard output (No space left on device); fs.read did not "
        f"run ({code}: "
    ), said
    assert said.endswith(" [agent]); nothing was recorded"), said
