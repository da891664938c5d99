"""What ``ctx bootstrap`` prints names paths its users chose (sessions in homes, spaces): a
control character in one reaches the administrator's terminal escaped, never raw."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.cli import ctx

PLANTED = "s\x1b]0;owned\x07"


def test_a_session_name_with_an_escape_sequence_is_printed_escaped(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    assert ctx(root, "bootstrap").returncode == 0
    session = root / "home/995/agent/alice/session" / PLANTED
    session.mkdir(parents=True)
    session.chmod(0o750)  # as an older version left home sessions: bootstrap tightens it

    shown = ctx(root, "bootstrap")

    assert shown.returncode == 0, shown.stderr
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    assert "repaired  home/995/agent/alice/session/s\\x1b]0;owned\\x07" in shown.stdout


def test_json_output_keeps_the_name_as_it_is(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    assert ctx(root, "bootstrap").returncode == 0
    session = root / "home/995/agent/alice/session" / PLANTED
    session.mkdir(parents=True)
    session.chmod(0o750)

    report = json.loads(ctx(root, "bootstrap", "--json").stdout)

    assert any(PLANTED in line for line in report["repaired"])


def test_json_output_of_a_run_with_problems_holds_its_error_as_every_json_error_does(
    tmp_path: Path,
) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    (root / "tool").write_text("someone's notes\n")  # in the way of tool/

    run = ctx(root, "bootstrap", "--json")

    assert run.returncode == 1, run.stderr
    report = json.loads(run.stdout)
    assert report["problems"] == ["tool: exists but is not a directory; left untouched"]
    assert (report["error"], report["errno"]) == ("ENOTDIR", 20)
    assert run.stderr == f"ctx: ENOTDIR: {report['message']}\n"
    clean = json.loads(ctx(root.parent / "other", "bootstrap", "--json").stdout)
    assert set(clean) == {"root", "created", "repaired", "problems", "warnings"}
