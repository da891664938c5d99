"""An ordinary user and a storage root they may read but not write (the system's, made by
root): every command that would write there is refused before anything is made, with EACCES
naming the directory, its owner and mode, and what to do — not the first temporary file or
entry the kernel refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import ctx
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

MANIFEST = {
    "manifest": 2,
    "kind": "tool",
    "name": "hello.say",
    "description": "say hello",
    "schema": {"type": "object"},
    "cap": {"side_effects": False, "network": False},
    "exec": "/bin/echo",
}


def tree(root: Path) -> list[str]:
    return sorted(str(Path(d, n)) for d, ds, fs in os.walk(root) for n in (*ds, *fs))


@pytest.fixture
def system_root(traversable_tmp: Path) -> Path:
    """A bootstrapped storage root of root's, with a queue the user may read, one job pending."""
    root = traversable_tmp / "system"
    assert ctx(root, "bootstrap").returncode == 0
    assert ctx(root, "queue", "init", "--project", "p").returncode == 0
    for directory, _, _ in os.walk(root / "shared" / "p"):
        os.chmod(directory, 0o2755)
    job = '{"tool": "fs.stat", "input": {}}'
    assert ctx(root, "queue", "publish", "--project", "p", "-", stdin=job).returncode == 0
    return root


def as_user(
    user: UnprivilegedUser, root: Path, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return run_as(
        user,
        [sys.executable, "-m", "cortexfs", "--storage", str(root), *args],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(root.parent)},
        cwd=root.parent,
        stdin=stdin,
    )


def assert_refused(done: subprocess.CompletedProcess[str], directory: Path, action: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    errors = [line for line in done.stderr.splitlines() if not line.startswith("ctx: warning:")]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith(f"ctx: EACCES: cannot {action}"), errors[0]
    assert f"may not write in {directory} (owner uid 0" in errors[0], errors[0]
    assert "run it as root" in errors[0] or "ask an administrator" in errors[0], errors[0]


@pytest.mark.parametrize(
    ("args", "where", "action"),
    [
        (["bootstrap"], ".", "bootstrap the storage root"),
        (["object", "install", "{manifest}", "--tier", "system"], "tool", "install"),
        (["object", "install", "{manifest}", "--tier", "user"], "home", "install"),
        (["object", "install", "{manifest}", "--tier", "shared:p"], "shared/p/tool", "install"),
        (["shared", "create", "mine"], "shared", "create shared space mine"),
        (["queue", "init", "--project", "mine"], "shared", "create shared space mine"),
        (["queue", "publish", "--project", "p", "-"], "shared/p/queue/inbox", "publish"),
        (["queue", "publish", "--project", "p", "--batch", "-"], "shared/p/queue/inbox", "publish"),
        (["queue", "claim", "--project", "p"], "shared/p/queue/claimed", "claim"),
        (["queue", "work", "--project", "p", "--drain"], "shared/p/queue/inbox", "work"),
    ],
)
def test_a_write_where_the_user_may_not_is_refused_saying_what_to_do(
    system_root: Path,
    unprivileged_user: UnprivilegedUser,
    args: list[str],
    where: str,
    action: str,
) -> None:
    manifest = system_root.parent / "hello.manifest.json"
    manifest.write_text(json.dumps(MANIFEST))
    manifest.chmod(0o644)
    before = tree(system_root)

    done = as_user(
        unprivileged_user,
        system_root,
        *(a.format(manifest=manifest) for a in args),
        stdin='{"tool": "fs.stat", "input": {}}\n',
    )

    directory = system_root if where == "." else system_root / where
    assert_refused(done, directory, action)
    assert tree(system_root) == before


def test_a_storage_root_that_cannot_be_made_names_what_and_why(tmp_path: Path) -> None:
    """Not only the last component the kernel refused ('ENOTDIR: x')."""
    (tmp_path / "file").write_text("")
    root = tmp_path / "file" / "x" / "storage"

    done = ctx(root, "bootstrap")

    assert done.returncode == 1, done.stdout
    assert done.stderr.startswith(
        f"ctx: ENOTDIR: cannot create {tmp_path / 'file' / 'x'} for the storage root {root}: "
    ), done.stderr
    assert "--storage DIR or CTX_STORAGE" in done.stderr


def test_the_owner_of_a_directory_it_may_not_write_is_told_to_change_its_mode(
    system_root: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """'run it as that owner' helps nobody who is that owner: the mode is what is missing."""
    queue = system_root / "shared" / "p" / "queue"
    for directory, _, _ in os.walk(system_root / "shared" / "p"):
        os.chown(directory, unprivileged_user.uid, unprivileged_user.gid)
    os.chmod(queue / "pending", 0o2555)  # the user's own directory, its write bit taken away

    refused = as_user(unprivileged_user, system_root, "queue", "work", "--project", "p")

    assert refused.returncode == 1, refused.stderr
    assert f"owner uid {unprivileged_user.uid}" in refused.stderr
    assert "you own it, but its mode leaves you out: 'chmod u+w' it" in refused.stderr
    assert "as that owner" not in refused.stderr
    assert "use a storage root of your own" in refused.stderr  # not their default root
