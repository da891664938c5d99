"""Installs that run out of inodes or descriptors (T-8, A-3): a failed ``ctx object install``
or ``ctx agent create`` has installed nothing and left nothing, says where and what to do, and
the same command run again succeeds; an install whose commit was durable is finished and
reported done.

The disks are real tmpfs mounts with few inodes (needs root); descriptors are limited with
RLIMIT_NOFILE in the command's own process."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cortexfs import durable
from cortexfs.errors import CtxError
from cortexfs.locks import LOCK_FILE
from cortexfs.tools.install import TOOL_KIND
from cortexfs.tools.pairs import install_pair, repair_staged
from tests.support.exhaustion import empty, fill_to, inode_limited_tmpfs, run_ctx
from tests.support.users import UnprivilegedUser
from tests.tools.support import bootstrapped_root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")

TOOL = "text.upper"
AGENT = "b1"
TOOL_CONTROLS = {
    "name": f"{TOOL}\n".encode(),
    "description": b"d\n",
    "schema": b'{"type": "object"}\n',
    "cap": b"{}\n",
}


@pytest.fixture
def disk(traversable_tmp: Path) -> Iterator[Path]:
    """A tmpfs of 8 MiB but only 400 inodes, so that a test can leave an install any number of
    inodes to work with."""
    with inode_limited_tmpfs(traversable_tmp / "disk") as mountpoint:
        yield mountpoint


@pytest.fixture
def sources(traversable_tmp: Path) -> Path:
    """A tool manifest with its program, and an agent request, off the small disk."""
    source = traversable_tmp / "src"
    (source / "bin").mkdir(parents=True)
    program = source / "bin/t"
    program.write_text("#!/bin/sh\ncat\n")
    program.chmod(0o755)
    manifest = {
        "manifest": 2,
        "kind": "tool",
        "name": TOOL,
        "description": "d",
        "schema": {"type": "object"},
        "cap": {},
        "exec": "bin/t",
    }
    (source / "m.json").write_text(json.dumps(manifest))
    (source / "agent.json").write_text(
        json.dumps({"name": AGENT, "label": "b1_t", "tools": ["fs.stat"]})
    )
    return source


def hidden(directory: Path) -> list[str]:
    """What an install leaves under hidden names: staging and commit markers (the
    directory's lock file is kept for good)."""
    return sorted(
        name for name in os.listdir(directory) if name.startswith(".") and name != LOCK_FILE
    )


def remove_pair(directory: Path, name: str) -> None:
    subprocess.run(["rm", "-rf", str(directory / name), str(directory / f"{name}.d")], check=True)


def sweep(
    disk: Path,
    attempt: Callable[[], subprocess.CompletedProcess[str]],
    then: Callable[[subprocess.CompletedProcess[str]], None],
    directory: Path,
) -> list[subprocess.CompletedProcess[str]]:
    """``attempt`` with 0, 1, 2… free inodes, up to two attempts past the first that
    succeeds; a failure is checked to have left nothing, then the disk is emptied and ``then``
    looks at the outcome (and removes what was installed)."""
    outcomes = []
    for free in range(64):
        fill = fill_to(disk, free)
        done = attempt()
        empty(fill)
        outcomes.append(done)
        assert hidden(directory) == [], (free, done.stderr)
        if done.returncode != 0:
            assert done.returncode == 1, (free, done.stderr)
            assert done.stderr.startswith("ctx: ENOSPC: cannot install "), (free, done.stderr)
            assert "nothing was installed and nothing of this attempt is left" in done.stderr
            assert "free space or inodes on that filesystem" in done.stderr
        then(done)
        if [done.returncode for done in outcomes].count(0) == 3:
            break
    return outcomes


def test_object_install_out_of_inodes_installs_all_or_nothing(disk: Path, sources: Path) -> None:
    root = bootstrapped_root(disk / "st")
    tier = root / "tool"

    def attempt() -> subprocess.CompletedProcess[str]:
        return run_ctx(root, "object", "install", str(sources / "m.json"), "--tier", "system")

    def then(done: subprocess.CompletedProcess[str]) -> None:
        if done.returncode == 0:
            assert (tier / TOOL).is_file() and (tier / f"{TOOL}.d/policy").is_file()
            assert run_ctx(root, "object", "list", "--json").stdout.count(f'"{TOOL}"') == 1
            remove_pair(tier, TOOL)
        else:
            assert not os.path.lexists(tier / TOOL), done.stderr
            assert not os.path.lexists(tier / f"{TOOL}.d"), done.stderr
            full = f"{tier / TOOL}: No space left on device on the filesystem of {tier}"
            assert full in done.stderr

    outcomes = sweep(disk, attempt, then, tier)

    assert [done.returncode for done in outcomes].count(1) >= 5, outcomes


def test_agent_create_out_of_inodes_creates_all_or_nothing_and_again_succeeds(
    disk: Path, sources: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root = bootstrapped_root(disk / "st")
    agents = root / "agent"
    create = (
        "agent",
        "create",
        "--user",
        str(unprivileged_user.uid),
        "--gid",
        str(unprivileged_user.gid),
        str(sources / "agent.json"),
    )

    def attempt() -> subprocess.CompletedProcess[str]:
        return run_ctx(root, *create)

    def then(done: subprocess.CompletedProcess[str]) -> None:
        if done.returncode != 0:
            assert not os.path.lexists(agents / AGENT), done.stderr
            assert not os.path.lexists(agents / f"{AGENT}.d"), done.stderr
            again = run_ctx(root, *create)  # with space again, the same command succeeds
            assert again.returncode == 0, again.stderr
        log = (agents / f"{AGENT}.d/log").read_text().splitlines()
        assert [json.loads(line)["type"] for line in log] == ["agent.created"], log
        remove_pair(agents, AGENT)

    outcomes = sweep(disk, attempt, then, agents)

    assert [done.returncode for done in outcomes].count(1) >= 5, outcomes


def test_installs_out_of_descriptors_leave_nothing(
    sources: Path, traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root = bootstrapped_root(traversable_tmp / "st")
    user = ("--user", str(unprivileged_user.uid), "--gid", str(unprivileged_user.gid))
    refused = []
    for descriptors in range(5, 16):
        tool = run_ctx(
            root,
            "object",
            "install",
            str(sources / "m.json"),
            "--tier",
            "system",
            descriptors=descriptors,
        )
        agent = run_ctx(
            root, "agent", "create", *user, str(sources / "agent.json"), descriptors=descriptors
        )
        for done, directory, name in ((tool, root / "tool", TOOL), (agent, root / "agent", AGENT)):
            assert hidden(directory) == [], (descriptors, done.stderr)
            if done.returncode == 0:
                remove_pair(directory, name)
                continue
            if "Fatal Python error" in done.stderr:
                continue  # too few for the interpreter itself to start
            refused.append(descriptors)
            # The manifest and its program are read first: with fewer descriptors than that
            # takes, the install refuses before it starts.
            read_first = f"ctx: EMFILE: cannot read {sources}/" if name == TOOL else None
            assert done.stderr.startswith(f"ctx: EMFILE: cannot install {directory / name}: ") or (
                read_first is not None and done.stderr.startswith(read_first)
            ), done.stderr
            assert "raise the limit of open files ('ulimit -n')" in done.stderr, done.stderr
            assert not os.path.lexists(directory / name), done.stderr
            assert not os.path.lexists(directory / f"{name}.d"), done.stderr
    assert len(refused) >= 4, refused


# A failure the disk does not give on demand, made by the operations the install goes through.


class _FailingOps(durable.FsOps):
    """Real operations, except that ``fails`` decides, before each call, to raise instead."""

    def __init__(self, fails: Callable[[str, str], OSError | None]) -> None:
        super().__init__()
        self.fails = fails

    def _check(self, operation: str, name: str) -> None:
        failure = self.fails(operation, name)
        if failure is not None:
            raise failure

    def create_file(self, name: str, dir_fd: int, mode: int = 0o666) -> int:
        self._check("create", name)
        return super().create_file(name, dir_fd, mode)

    def rmdir(self, name: str, dir_fd: int) -> None:
        self._check("rmdir", name)
        super().rmdir(name, dir_fd)

    def rename_noreplace(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
        self._check("rename", dst)
        super().rename_noreplace(src, src_dir_fd, dst, dst_dir_fd)

    def link(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
        self._check("rename", dst)
        super().link(src, src_dir_fd, dst, dst_dir_fd)


def _install(directory: Path, ops: durable.FsOps | None = None) -> bool:
    return install_pair(
        directory,
        TOOL,
        TOOL_KIND,
        entry=b"#!/bin/sh\ncat\n",
        controls=TOOL_CONTROLS,
        replace=True,
        ops=ops,
    )


def test_an_install_that_fails_after_its_commit_is_finished_and_done(tmp_path: Path) -> None:
    calls = []

    def first_swap_fails(operation: str, name: str) -> OSError | None:
        if operation == "rename" and name == f"{TOOL}.d":
            calls.append(name)
            if len(calls) == 1:
                return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)
        return None

    replaced = _install(tmp_path, _FailingOps(first_swap_fails))

    assert replaced is False and len(calls) == 2
    assert (tmp_path / TOOL).is_file() and (tmp_path / f"{TOOL}.d/name").is_file()
    assert hidden(tmp_path) == []


def test_a_clean_up_that_fails_too_names_what_is_left_and_the_next_install_removes_it(
    tmp_path: Path,
) -> None:
    def full_and_stuck(operation: str, name: str) -> OSError | None:
        if operation == "create" and name.endswith("~commit"):
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), name)
        if operation == "rmdir":
            return OSError(errno.EIO, os.strerror(errno.EIO), name)
        return None

    with pytest.raises(CtxError) as failed:
        _install(tmp_path, _FailingOps(full_and_stuck))

    left = hidden(tmp_path)
    assert failed.value.errno == errno.ENOSPC
    assert [name.rsplit("~", 1)[1] for name in left] == ["controls"]
    assert (
        "nothing was installed, but removing what this attempt staged failed too (EIO: "
        in failed.value.message
    )
    assert (
        f"so {tmp_path / left[0]} is left, hidden; running the same command again removes it"
        in failed.value.message
    )
    assert not os.path.lexists(tmp_path / TOOL)
    assert _install(tmp_path) is False
    assert hidden(tmp_path) == []


def test_staging_without_a_commit_marker_is_discarded_not_installed(tmp_path: Path) -> None:
    # What an install of a new tool leaves when it stops before its commit marker: the staged
    # controls and entry, nothing at the tool's name.  Nothing of it was visible.
    staged = tmp_path / f".{TOOL}~0123456789ab~controls"
    staged.mkdir()
    for control, data in TOOL_CONTROLS.items():
        (staged / control).write_bytes(data)
    (tmp_path / f".{TOOL}~0123456789ab~entry").write_text("#!/bin/sh\ncat\n")

    repaired = repair_staged(tmp_path, TOOL_KIND)

    assert repaired == [f"{tmp_path}/{TOOL}: removed what an interrupted install left behind"]
    assert os.listdir(tmp_path) == [LOCK_FILE]


def test_an_older_new_install_whose_controls_were_in_place_is_finished(tmp_path: Path) -> None:
    # What older versions left when a new tool's controls had been moved to <name>.d and its
    # entry not yet to <name>: their commit had begun, so it is finished.
    controls = tmp_path / f"{TOOL}.d"
    controls.mkdir()
    for control, data in TOOL_CONTROLS.items():
        (controls / control).write_bytes(data)
    (tmp_path / f".{TOOL}~0123456789ab~entry").write_text("#!/bin/sh\ncat\n")

    repaired = repair_staged(tmp_path, TOOL_KIND)

    assert repaired == [f"{tmp_path}/{TOOL}: finished an interrupted install"]
    assert (tmp_path / TOOL).read_text() == "#!/bin/sh\ncat\n"
    assert hidden(tmp_path) == []
