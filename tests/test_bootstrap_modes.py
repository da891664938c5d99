"""``ctx bootstrap`` makes the modes agents need whatever the umask, and says so when an
existing root's ABI directories are closed to them (SPEC R-2, R-5, P-5 step 2, D-1).

Real ``ctx`` processes with their own umask; a real agent of a real second uid.
"""

from __future__ import annotations

import json
import os
import shlex
import stat
import subprocess
import sys
from pathlib import Path

from cortexfs import durable
from cortexfs.storage import ROOT_ENTRIES, ensure_root_abi
from tests.support.cli import ctx
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

CTX = [sys.executable, "-m", "cortexfs"]


def modes(root: Path) -> dict[str, int]:
    """Every entry of the tree under ``root``, relative, with its mode bits."""
    found = {".": stat.S_IMODE(root.lstat().st_mode)}
    for directory, names, files in os.walk(root):
        for name in names + files:
            path = Path(directory, name)
            found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def bootstrap(root: Path, umask: int = 0o022, *args: str) -> subprocess.CompletedProcess[str]:
    done = ctx(root, "bootstrap", *args, umask=umask)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_a_bootstrap_under_umask_077_makes_what_a_default_umask_makes(
    traversable_tmp: Path,
) -> None:
    strict, default = traversable_tmp / "strict" / "storage", traversable_tmp / "default"

    bootstrap(strict, 0o077)
    bootstrap(default, 0o022)

    made = modes(strict)
    assert made == modes(default)
    for entry in (".", *ROOT_ENTRIES):
        assert made[entry] == 0o755, f"{entry}: {made[entry]:04o}"
    assert stat.S_IMODE((traversable_tmp / "strict").stat().st_mode) == 0o755, "made above it"
    assert made["shared/cortexfs-docs/README.md"] == 0o444, "D-1: readable whatever the umask"
    assert made["tool/tsh.d/config"] == 0o644, "tsh reads it as the agent"


def test_an_agent_can_use_a_root_bootstrapped_under_umask_077(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root = traversable_tmp / "storage"
    bootstrap(root, 0o077)
    request = json.dumps({"name": "reader", "label": "reader_t", "tools": ["fs.stat"]})
    made = ctx(root, "agent", "create", "-", "--user", unprivileged_user.name, stdin=request)
    assert made.returncode == 0, made.stderr
    with open(root / "tool" / "fs.stat.d" / "policy", "a") as policy:
        policy.write("allow reader_t tool:fs.stat execute\n")

    ran = ctx(root, "run", "--agent", "reader", "fs.stat", "/ctx/shared/cortexfs-docs/README.md")

    assert ran.returncode == 0, ran.stderr
    assert "type: file" in ran.stdout


def test_abi_directories_closed_to_agents_are_a_warning_and_keep_their_modes(
    traversable_tmp: Path,
) -> None:
    root = traversable_tmp / "storage"
    bootstrap(root)
    narrowed = {root: 0o700, root / "home": 0o711, root / "tool": 0o750}
    for path, mode in narrowed.items():
        path.chmod(mode)

    again = bootstrap(root)

    (line,) = [line for line in again.stdout.splitlines() if line.startswith("warning ")]
    for path, mode in narrowed.items():
        assert f"{path} ({mode:04o})" in line, line
    assert "nothing to do" not in again.stdout
    assert {path: stat.S_IMODE(path.stat().st_mode) for path in narrowed} == narrowed
    command = line.split("to open them: ", 1)[1]
    assert shlex.split(command)[:2] == ["chmod", "o+rx"]
    assert sorted(shlex.split(command)[2:]) == sorted(str(path) for path in narrowed)
    reported = json.loads(bootstrap(root, 0o022, "--json").stdout)
    assert reported["warnings"] == [line.removeprefix("warning").strip()]

    subprocess.run(shlex.split(command), check=True)

    fixed = bootstrap(root)
    assert "warning" not in fixed.stdout
    assert "nothing to do: the storage root is complete" in fixed.stdout


def test_a_root_others_may_search_and_read_is_no_warning(traversable_tmp: Path) -> None:
    root = traversable_tmp / "storage"
    bootstrap(root)
    (root / "home").chmod(0o705)  # other than bootstrap makes, yet open to others

    again = bootstrap(root, 0o077)

    assert "warning" not in again.stdout
    assert json.loads(bootstrap(root, 0o077, "--json").stdout)["warnings"] == []


def test_entries_outside_the_root_abi_are_a_warning_and_are_kept(traversable_tmp: Path) -> None:
    """R-2: nothing else belongs at the root; bootstrap says so, and removes nothing."""
    root = traversable_tmp / "storage"
    bootstrap(root)
    (root / "audit").mkdir()
    (root / "notes.txt").write_text("mine\n")

    again = bootstrap(root)

    assert again.returncode == 0, again.stderr
    (line,) = [line for line in again.stdout.splitlines() if line.startswith("warning ")]
    assert "audit, notes.txt at the root" in line and "not part of the root ABI (R-2" in line
    assert (root / "audit").is_dir() and (root / "notes.txt").read_text() == "mine\n"
    assert "nothing to do" not in again.stdout


def test_root_bootstrapping_another_uids_root_makes_its_six_directories_that_uids(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """The owner administers the root: with root's six directories it could make no space, no
    home and no tool of its own there."""
    root = traversable_tmp / "storage"
    root.mkdir()
    os.chown(root, unprivileged_user.uid, unprivileged_user.gid)

    bootstrap(root)

    for entry in ROOT_ENTRIES:
        assert (root / entry).stat().st_uid == unprivileged_user.uid, entry
    env = {**os.environ, "CTX_STORAGE": str(root)}
    made = run_as(unprivileged_user, [*CTX, "queue", "init", "--project", "proj"], env=env)
    assert made.returncode == 0, made.stderr
    again = run_as(unprivileged_user, [*CTX, "bootstrap", "--json"], env=env)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["created"] == []


def test_root_gives_away_none_of_the_six_that_already_exist(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """An existing directory holds what was looked up in it while root had it: never given."""
    root = traversable_tmp / "storage"
    root.mkdir()
    (root / "shared").mkdir(mode=0o755)
    os.chown(root, unprivileged_user.uid, unprivileged_user.gid)

    bootstrap(root)

    assert (root / "shared").stat().st_uid == 0
    assert (root / "home").stat().st_uid == unprivileged_user.uid


class SwapsTheDirectoryMade(durable.FsOps):
    """The root's owner at work while root bootstraps its root: in the moment between root's
    mkdir of ``name`` and root opening it, the owner, who may rename in its root, moves the new
    directory aside and a directory of root's that it may move (``replacement``) into its name."""

    def __init__(self, name: str, replacement: Path) -> None:
        super().__init__()
        self.name, self.replacement, self.swapped = name, replacement, False

    def open_dir(self, name: str, dir_fd: int | None = None) -> int:
        if name == self.name and dir_fd is not None and not self.swapped:
            self.swapped = True
            os.rename(name, f"{name}.made", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.rename(self.replacement, name, dst_dir_fd=dir_fd)
        return super().open_dir(name, dir_fd)


def test_root_gives_away_no_directory_swapped_for_the_one_it_made(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """Only a directory bootstrap made, still empty, is given to the root's owner: one of
    root's, with what it holds, swapped into its name keeps its owner and its mode."""
    root = traversable_tmp / "storage"
    root.mkdir()
    os.chown(root, unprivileged_user.uid, unprivileged_user.gid)
    roots = root / "roots"  # root's, in a place the owner may rename from
    roots.mkdir(mode=0o700)
    (roots / "held.txt").write_text("root's\n")

    ensure_root_abi(root, SwapsTheDirectoryMade("home", roots))

    swapped = (root / "home").stat()
    assert (swapped.st_uid, stat.S_IMODE(swapped.st_mode)) == (0, 0o700)
    assert (root / "home" / "held.txt").read_text() == "root's\n"
    assert (root / "shared").stat().st_uid == unprivileged_user.uid
