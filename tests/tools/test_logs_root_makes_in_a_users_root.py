"""Root installing into a storage root another uid owns: that uid still records its calls (T-7).

The storage root's owner runs calls itself (``ctx run``) and records each in the tool's log.
A log that root makes there — ``ctx object install`` or ``ctx bootstrap`` run as root — is
given to that owner, mode 0640 and group kept; one an older version left root's is given by
``ctx bootstrap`` run as root, which says so.  Real roots, a real second uid, real ``ctx``
processes.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from tests.support.cli import ctx
from tests.support.users import UnprivilegedUser, run_as

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root and a second uid")


def users_root(top: Path, user: UnprivilegedUser) -> Path:
    """A storage root ``user`` bootstrapped as itself under ``top``, with an agent ``a`` of
    ``user``'s that may run ``hello`` and ``fs.stat``, and a workspace it mounts."""
    os.chown(top, user.uid, user.gid)
    root = top / "storage"
    as_user(user, root, "bootstrap")
    workspace = top / "workspace"
    workspace.mkdir()
    os.chown(workspace, user.uid, user.gid)
    request = {
        "name": "a",
        "label": "a_t",
        "tools": ["hello", "fs.stat"],
        "mount": [[str(workspace), "/workspace", "ro"]],
    }
    as_user(user, root, "agent", "create", "-", stdin=json.dumps(request))
    return root


def as_user(user: UnprivilegedUser, root: Path, *args: str, stdin: str = "") -> str:
    done = run_as(user, [*CTX, "--storage", str(root), *args], env=os.environ, stdin=stdin)
    assert done.returncode == 0, done.stderr
    return done.stdout


def call_as(user: UnprivilegedUser, root: Path, tool: str, *args: str) -> tuple[int, str]:
    done = run_as(user, [*CTX, "--storage", str(root), "run", "--agent", "a", tool, *args])
    return done.returncode, done.stderr


def install_as_root(root: Path, top: Path) -> None:
    """``hello``, installed into the system tier by root, its policy letting ``a_t`` run it."""
    program = top / "hello.sh"
    program.write_text("#!/bin/sh\necho hello\n")
    program.chmod(0o755)
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": "hello",
        "description": "Says hello.",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": str(program),
    }
    manifest = top / "hello.json"
    manifest.write_text(json.dumps(document))
    done = ctx(root, "object", "install", str(manifest), "--tier", "system")
    assert done.returncode == 0, done.stderr
    allow(root, "hello")


def allow(root: Path, tool: str) -> None:
    with open(root / "tool" / f"{tool}.d" / "policy", "a") as policy:
        policy.write(f"allow a_t tool:{tool} execute\n")


def logged_calls(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_a_tool_root_installs_in_a_users_root_records_that_users_calls(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root = users_root(traversable_tmp, unprivileged_user)
    install_as_root(root, traversable_tmp)

    status, stderr = call_as(unprivileged_user, root, "hello")

    assert status == 0, stderr
    log = root / "tool" / "hello.d" / "log"
    [line] = logged_calls(log)
    assert (line["agent"], line["object"], line["status"]) == ("a", "tool/hello", "ok")
    held = log.stat()
    assert held.st_uid == unprivileged_user.uid
    assert stat.S_IMODE(held.st_mode) == 0o640  # still nobody else's to read


def test_bootstrap_as_root_gives_the_owner_the_logs_root_has_and_says_so(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root = users_root(traversable_tmp, unprivileged_user)
    allow(root, "fs.stat")
    log = root / "tool" / "fs.stat.d" / "log"
    os.chown(log, 0, 0)  # as an earlier install by root left it
    refused, refusal = call_as(unprivileged_user, root, "fs.stat", "/workspace")
    assert refused != 0 and str(log) in refusal, refusal

    first = ctx(root, "bootstrap")
    second = ctx(root, "bootstrap")
    status, stderr = call_as(unprivileged_user, root, "fs.stat", "/workspace")

    assert first.returncode == 0, first.stderr
    assert (
        f"repaired  {log}: owner uid 0, now uid {unprivileged_user.uid}, the storage root's "
        "owner, who records in it the calls it runs"
    ) in first.stdout.splitlines()
    assert "fs.stat.d/log" not in second.stdout
    assert (log.stat().st_uid, log.stat().st_gid) == (unprivileged_user.uid, 0)
    assert stat.S_IMODE(log.stat().st_mode) == 0o640
    assert status == 0, stderr
    assert [line["status"] for line in logged_calls(log)] == ["ok"]


def test_a_log_of_two_names_is_not_given_away(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """A second name may be a file of root's from elsewhere, linked in: never handed out."""
    root = users_root(traversable_tmp, unprivileged_user)
    log = root / "tool" / "fs.stat.d" / "log"
    log.unlink()
    elsewhere = traversable_tmp / "roots-file"
    elsewhere.write_text("root's\n")
    os.link(elsewhere, log)

    done = ctx(root, "bootstrap")

    assert done.returncode == 0, done.stderr
    assert "fs.stat.d/log" not in done.stdout
    assert elsewhere.stat().st_uid == 0


def test_an_agent_root_creates_in_a_users_root_has_a_log_of_that_users(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root = users_root(traversable_tmp, unprivileged_user)
    request = {"name": "b", "label": "b_t"}

    done = ctx(
        root, "agent", "create", "-", "--user", unprivileged_user.name, stdin=json.dumps(request)
    )

    assert done.returncode == 0, done.stderr
    log = root / "agent" / "b.d" / "log"
    assert log.stat().st_uid == unprivileged_user.uid
    assert stat.S_IMODE(log.stat().st_mode) == 0o640
    assert (root / "agent" / "b.d" / "policy").stat().st_uid == 0  # only what the host writes


def test_bootstrap_as_root_gives_the_owner_an_agents_log_root_has(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root = users_root(traversable_tmp, unprivileged_user)
    log = root / "agent" / "a.d" / "log"
    os.chown(log, 0, 0)  # as ctx agent create run as root by an earlier version left it

    done = ctx(root, "bootstrap")

    assert done.returncode == 0, done.stderr
    assert f"repaired  {log}: owner uid 0, now uid {unprivileged_user.uid}" in done.stdout
    assert (log.stat().st_uid, stat.S_IMODE(log.stat().st_mode)) == (unprivileged_user.uid, 0o640)
