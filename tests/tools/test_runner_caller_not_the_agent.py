"""A storage owner who is not root, calling tools of an agent on its own root (SPEC P-5 step 1,
S-1): an agent of another uid is refused at step 1 naming that uid, before its groups and
before anything is made, and a session the owner may not make in the agent's home is refused
saying what to do, as ``ctx queue work`` says it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.storage import traversable_tmp as traversable_tmp

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs ctx under other ids")

OWNER = 47_940  # the owner's uid and gid, in no user or group database
AGENT = 47_941  # porter's uid and gid
CTX = str(Path(sys.executable).with_name("ctx"))
FS_STAT = ["run", "--agent", "porter", "fs.stat", "/ctx"]


def _ctx(root: Path, *args: str, uid: int = 0, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``ctx --storage ROOT ARGS`` as root, or as the owner (uid, gid and group OWNER)."""
    ids = {} if uid == 0 else {"user": uid, "group": uid, "extra_groups": [uid]}
    return subprocess.run(
        [CTX, "--storage", str(root), *args],
        input=stdin,
        env={"PATH": "/usr/bin:/bin", "HOME": str(root.parent), "LANG": "C.UTF-8"},
        capture_output=True,
        text=True,
        check=False,
        **ids,
    )


@pytest.fixture
def root(traversable_tmp: Path) -> Path:
    """The owner's root, bootstrapped by the owner."""
    home = traversable_tmp / "home"
    home.mkdir()
    os.chown(home, OWNER, OWNER)
    root = home / "root"
    booted = _ctx(root, "bootstrap", uid=OWNER)
    assert booted.returncode == 0, booted.stderr
    return root


def _porter(root: Path, groups: list[int]) -> None:
    """Root makes agent porter, of uid AGENT and ``groups``, on the owner's root."""
    request = json.dumps({"name": "porter", "label": "porter_t", "tools": ["fs.stat"]})
    ids = ["--user", str(AGENT), "--gid", str(AGENT), "--groups", ",".join(map(str, groups))]
    made = _ctx(root, "agent", "create", *ids, "-", stdin=request)
    assert made.returncode == 0, made.stderr


def _tree(root: Path) -> list[tuple[str, int, int]]:
    """Each entry of ``root`` with its owner and size: what a session or a log line changes."""
    entries = [(path, os.lstat(path)) for path in [root, *root.rglob("*")]]
    return sorted((str(path), status.st_uid, status.st_size) for path, status in entries)


def test_an_agent_of_another_uid_is_refused_naming_that_uid_before_groups(root: Path) -> None:
    """The owner's process holds its group, which porter lacks: what refuses is the uid, which
    no group could mend, and the refusal says so first."""
    _porter(root, [AGENT])
    ran = _ctx(root, *FS_STAT, uid=OWNER)
    assert (ran.returncode, ran.stdout) == (126, ""), ran
    assert ran.stderr.startswith(
        f"ctx: EACCES: step 1 (peer credentials): the caller is uid {OWNER} gid {OWNER}, but "
        f"agent 'porter' is uid {AGENT} gid {AGENT}; only root may start a process as another "
        f"uid: run it as root, or use an agent whose identity is your own uid ({OWNER})"
    ), ran.stderr
    assert "this process holds group" not in ran.stderr, ran.stderr


def test_a_call_refused_at_step_1_leaves_nothing_behind(root: Path) -> None:
    """Porter is given the owner's group too: step 1 alone refuses the call, in both modes,
    and no home of porter's uid is made by the owner's (nor any session, nor a log line)."""
    _porter(root, [AGENT, OWNER])
    before = _tree(root)
    terminal = _ctx(root, *FS_STAT, uid=OWNER)
    assert terminal.returncode == 126, terminal
    assert terminal.stderr.startswith("ctx: EACCES: step 1 (peer credentials): "), terminal
    native = _ctx(root, "run", "--agent", "porter", "--native", "fs.stat", uid=OWNER, stdin="{}")
    error = json.loads(native.stdout.splitlines()[-1])["error"]
    assert (error["error"], error["stage"], error["step"]) == ("EACCES", "authorize", 1), error
    assert not (root / "home" / str(AGENT)).exists()
    assert _tree(root) == before


def test_a_home_the_owner_may_not_make_is_named_with_what_to_do(root: Path) -> None:
    """No home of the owner's, and ``home/`` given to root: the call says which session,
    which home to create for whom, or to run as root, as the worker does; nothing is made."""
    request = json.dumps({"name": "own", "label": "own_t", "tools": ["fs.stat"]})
    assert _ctx(root, "agent", "create", "-", uid=OWNER, stdin=request).returncode == 0
    assert not (root / "home" / str(OWNER)).exists()  # no call has made it yet
    os.chown(root / "home", 0, 0)
    before = _tree(root)
    ran = _ctx(root, "run", "--agent", "own", "fs.stat", "/ctx", uid=OWNER)
    home = root / "home" / str(OWNER)
    session = home / "agent" / "own" / "session" / "default"
    assert (ran.returncode, ran.stdout) == (126, ""), ran
    assert ran.stderr.startswith(f"ctx: EACCES: cannot open the session {session} ("), ran
    assert ran.stderr.endswith(
        f"; the tool did not run: the call records its events there and creates what is "
        f"missing, from {home} down, for the agent's uid {OWNER}: run it as root, or create "
        f"{home} owned by uid {OWNER} first, then make the call again\n"
    ), ran.stderr
    assert _tree(root) == before
