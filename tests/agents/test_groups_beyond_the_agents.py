"""A storage owner who is not root holds groups an agent of theirs is not given: only root can
drop groups, so its tools are refused rather than run with them (P-5 step 1, T-5), and a
worker for that agent claims nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.storage import traversable_tmp as traversable_tmp

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs ctx under other ids")

UID = GID = 47_910  # ids in no user or group database
GIVEN, WITHHELD = 47_911, 47_912
CTX = str(Path(sys.executable).with_name("ctx"))


def _as_owner(home: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    ids = [f"--reuid={UID}", f"--regid={GID}", f"--groups={GIVEN},{WITHHELD}"]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}
    return subprocess.run(
        ["setpriv", *ids, CTX, *args], input=stdin, capture_output=True, text=True, env=env
    )


@pytest.fixture
def home(traversable_tmp: Path) -> Path:
    home = traversable_tmp / "home"
    home.mkdir()
    os.chown(home, UID, GID)
    assert _as_owner(home, "bootstrap").returncode == 0
    request = json.dumps({"name": "sub", "label": "sub_t", "tools": ["shell.exec"]})
    made = _as_owner(home, "agent", "create", "-", "--groups", str(GIVEN), stdin=request)
    assert made.returncode == 0, made.stderr
    policy = home / ".local/share/cortexfs/storage/current/tool/shell.exec.d/policy"
    with policy.open("a") as rules:
        rules.write("allow sub_t tool:shell.exec execute\n")
    return home


def test_a_call_is_refused_at_step_1_naming_the_group_the_agent_is_not_given(home: Path) -> None:
    call = _as_owner(
        home, "run", "--native", "--agent", "sub", "shell.exec", stdin='{"cmd": "id -G"}'
    )

    assert call.returncode == 1, call.stderr
    (frame,) = [json.loads(line) for line in call.stdout.splitlines()]
    error = frame["error"]
    assert (error["error"], error["stage"], error["step"]) == ("EACCES", "caller", 1), frame
    assert error["message"].startswith(
        f"this process holds group {WITHHELD}, which agent 'sub' is not given (gid {GID}, "
        f"groups {GIVEN}): only root can start its tools without it"
    ), error


def test_a_worker_for_that_agent_claims_nothing(home: Path) -> None:
    job = '{"tool": "shell.exec", "input": {"cmd": "id -G"}}'
    assert _as_owner(home, "queue", "init", "--project", "p").returncode == 0
    assert _as_owner(home, "queue", "publish", "--project", "p", "-", stdin=job).returncode == 0

    worked = _as_owner(home, "queue", "work", "--project", "p", "--agent", "sub", "--drain")

    assert worked.returncode == 1, worked.stderr
    assert f"holds group {WITHHELD}, which agent 'sub' is not given" in worked.stderr
    assert "no job was claimed" in worked.stderr
    status = _as_owner(home, "queue", "status", "--project", "p", "--json")
    assert json.loads(status.stdout)["counts"]["pending"] == 1, status.stdout
