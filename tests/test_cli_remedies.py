"""A refusal of the command line says what to do next, in one line with its errno: the real
``ctx``, run in a fresh interpreter as a user would run it."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import ctx


def _last_line(stderr: str) -> str:
    return stderr.splitlines()[-1]


def test_a_mistyped_command_is_answered_with_the_one_meant_at_every_level(tmp_path: Path) -> None:
    top = ctx(tmp_path / "root", "qeueu", "status")
    assert top.returncode == 2
    assert _last_line(top.stderr) == "ctx: EINVAL: No such command 'qeueu'. Did you mean 'queue'?"
    below = ctx(tmp_path / "root", "queue", "stauts")
    assert _last_line(below.stderr) == (
        "ctx: EINVAL: No such command 'stauts'. Did you mean 'status'?"
    )
    # A subcommand loaded only when it runs is among those suggested too.
    lazy = ctx(tmp_path / "root", "queue", "wrok")
    assert _last_line(lazy.stderr) == "ctx: EINVAL: No such command 'wrok'. Did you mean 'work'?"
    unlike = ctx(tmp_path / "root", "xyzzy")
    assert (unlike.returncode, _last_line(unlike.stderr)) == (
        2,
        "ctx: EINVAL: No such command 'xyzzy'.",
    )
