"""``ctx mount`` and ``ctx umount`` on a real FUSE mount (SPEC F-1, T-5, R-2).

Needs root (the mount serves other uids), /dev/fuse and pyfuse3 (the 'fuse' extra); the
suite says which is missing when it skips.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fuse.support import NEEDS_A_MOUNT, as_user, mounted
from tests.support.users import users_named
from tests.tools.support import World

pytestmark = NEEDS_A_MOUNT

ROOT_ABI = ["agent", "bin", "home", "model", "shared", "tool"]
DOCS = "cortexfs-docs"  # the manual bundle: every agent sees it


def tree(root: Path) -> dict[str, int]:
    return {str(p): p.lstat().st_mtime_ns for p in root.rglob("*")}


# ------------------------------------------------------------------------- the host view


def test_the_host_view_is_the_root_abi_and_passes_writes_through(world: World) -> None:
    mountpoint = world.scratch / "ctx"
    home = world.root / "home" / "0"
    home.mkdir(exist_ok=True)
    with mounted(world.root, mountpoint) as process:
        assert sorted(os.listdir(mountpoint)) == ROOT_ABI
        assert (mountpoint / "tool" / "tsh.d" / "config").read_text().startswith("# tsh")
        target = mountpoint / "home" / "0" / "notes.txt"
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        os.write(fd, b"through the mount\n")
        os.fsync(fd)  # durable behind the mount once this returns (F-1)
        os.fdatasync(fd)
        os.close(fd)
        directory = os.open(mountpoint / "home" / "0", os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory)  # the new name, durable behind the mount
        finally:
            os.close(directory)
        assert (home / "notes.txt").read_text() == "through the mount\n"
        os.rename(target, mountpoint / "home" / "0" / "renamed.txt")
        (mountpoint / "home" / "0" / "dir").mkdir()
        (mountpoint / "home" / "0" / "dir").rmdir()
        assert sorted(os.listdir(home)) == ["renamed.txt"]
        (mountpoint / "home" / "0" / "renamed.txt").unlink()
        assert os.listdir(home) == []
    assert process.returncode == 0, process.stderr


def test_what_is_made_in_a_setgid_space_through_the_mount_keeps_the_spaces_group(
    world: World,
) -> None:
    """X-1 through F-1: a shared space is setgid so that its group can work what any member
    made; a file or directory made through the mount must keep that group, as it does when
    made directly, and a directory its setgid bit."""
    space = world.root / "shared" / "team"
    space.mkdir()
    os.chown(space, 0, 65534)
    space.chmod(0o2770)
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint):
        (mountpoint / "shared" / "team" / "made.txt").write_text("x\n")
        (mountpoint / "shared" / "team" / "sub").mkdir()
    assert (space / "made.txt").stat().st_gid == 65534
    assert (space / "sub").stat().st_gid == 65534
    assert (space / "sub").stat().st_mode & 0o2000
    assert (space / "made.txt").stat().st_uid == 0  # still the caller's


def test_what_is_made_through_the_mount_gets_the_callers_umask(world: World) -> None:
    """As on the storage root: mode & ~umask of the caller, not of the mount's process."""
    space = world.root / "shared" / "team"
    space.mkdir(mode=0o777)
    space.chmod(0o777)
    here = world.scratch / "ctx" / "shared" / "team"
    with mounted(world.root, world.scratch / "ctx"):
        made = as_user(
            world.user,
            f"umask 002 && echo x > {here}/f && mkdir {here}/d && "
            f"umask 077 && echo x > {here}/g && mkdir {here}/e",
        )
        assert made.returncode == 0, made.stderr
    modes = {name: stat.S_IMODE((space / name).stat().st_mode) for name in "fdge"}
    assert modes == {"f": 0o664, "d": 0o775, "g": 0o600, "e": 0o700}


def test_ctx_umount_ends_the_mount_cleanly(world: World) -> None:
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint) as process:
        done = subprocess.run(
            [sys.executable, "-m", "cortexfs", "umount", str(mountpoint)],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        process.wait(timeout=30)
        assert process.returncode == 0, process.stderr


def ctx_umount(mountpoint: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cortexfs", "umount", str(mountpoint)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


def in_mount_table(mountpoint: Path) -> bool:
    """Whether ``mountpoint`` is mounted, dead or not (``os.path.ismount`` cannot stat a mount
    whose daemon is gone, and says no)."""
    with open("/proc/self/mounts") as table:
        return any(line.split()[1] == str(mountpoint) for line in table)


def test_ctx_umount_removes_a_mount_whose_process_was_killed(world: World) -> None:
    mountpoint = world.scratch / "ctx"
    try:
        with mounted(world.root, mountpoint) as process:
            process.kill()
            process.wait(timeout=30)
            with pytest.raises(OSError) as dead:
                os.listdir(mountpoint)
            assert dead.value.errno == errno.ENOTCONN

            again = ctx_mount(world.root, mountpoint)
            assert again.returncode == 1
            assert again.stderr.startswith("ctx: ENOTCONN: "), again.stderr
            assert "ctx umount" in again.stderr, again.stderr

            done = ctx_umount(mountpoint)
            assert done.returncode == 0, done.stderr
            assert not in_mount_table(mountpoint) and os.listdir(mountpoint) == []
    finally:
        if in_mount_table(mountpoint):  # the dead mount would outlive the test
            subprocess.run(["umount", "--lazy", str(mountpoint)], check=False)


def test_ctx_umount_of_another_uids_mount_is_eperm_and_leaves_it(world: World) -> None:
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint):
        refused = as_user(world.user, f"{sys.executable} -m cortexfs umount {mountpoint}")
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.startswith("ctx: EPERM: "), refused.stderr
        assert "mounted by uid 0" in refused.stderr, refused.stderr
        assert os.path.ismount(mountpoint)


def test_ctx_umount_refuses_what_ctx_mount_did_not_make(world: World) -> None:
    other = world.scratch / "tmpfs"
    other.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "none", str(other)], check=True)
    try:
        refused = ctx_umount(other)
        assert refused.returncode == 1
        assert refused.stderr.startswith("ctx: EINVAL:") and "tmpfs" in refused.stderr
        assert os.path.ismount(other)
    finally:
        subprocess.run(["umount", str(other)], check=True)

    for path, code in ((other, "EINVAL"), (world.scratch / "missing", "ENOENT")):
        refused = ctx_umount(path)
        assert refused.returncode == 1 and refused.stderr.startswith(f"ctx: {code}:"), (
            refused.stderr
        )


def ctx_mount(root: Path, mountpoint: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``ctx mount`` expected to refuse (it would otherwise stay in the foreground)."""
    return subprocess.run(
        [sys.executable, "-m", "cortexfs", "--storage", str(root), "mount", *args,
         str(mountpoint)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("kind", "code"),
    [("missing", "ENOENT"), ("not empty", "ENOTEMPTY"), ("a file", "ENOTDIR")],
)
def test_an_unusable_mount_point_is_refused_with_its_errno(
    world: World, kind: str, code: str
) -> None:
    mountpoint = world.scratch / "mountpoint"
    if kind == "not empty":
        mountpoint.mkdir()
        (mountpoint / "file").write_text("x")
    elif kind == "a file":
        mountpoint.write_text("x")

    refused = ctx_mount(world.root, mountpoint)

    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith(f"ctx: {code}: "), refused.stderr
    assert str(mountpoint) in refused.stderr
    assert not os.path.ismount(mountpoint)


def test_a_mount_the_kernel_refuses_is_an_errno_not_a_traceback(world: World) -> None:
    """libfuse cannot open /dev/fuse for an ordinary uid when only root may (mode 0600)."""
    if os.stat("/dev/fuse").st_mode & 0o006:
        pytest.skip("/dev/fuse is open to every user on this machine")
    mountpoint = world.scratch / "mine"
    mountpoint.mkdir()
    os.chown(mountpoint, world.user.uid, world.user.gid)

    refused = as_user(
        world.user, f"{sys.executable} -m cortexfs --storage {world.root} mount {mountpoint}"
    )

    assert refused.returncode == 1, refused.stderr
    assert refused.stderr.startswith("ctx: EACCES: "), refused.stderr
    assert "/dev/fuse" in refused.stderr and "Traceback" not in refused.stderr
    assert len(refused.stderr.splitlines()) == 1, refused.stderr
    # What the user lacks and what to do, not only what libfuse met.
    assert "/dev/fuse is mode 0600" in refused.stderr, refused.stderr
    # The command to run as root names the mount point and the root, as given.
    assert f"run 'ctx mount {mountpoint} --storage {world.root}' as root, or ask an " in (
        refused.stderr
    )
    assert not os.path.ismount(mountpoint)


# ------------------------------------------------------------------------ an agent's view


@pytest.fixture
def coder(world: World) -> World:
    world.agent("coder", tools=["fs.stat"], shared={"team": ["read", "write"], "audit": ["read"]})
    world.allow_tool("fs.stat")
    # (the bundle exists already when this process has registered its bootstrap step)
    for space, mode in (("team", 0o777), ("audit", 0o777), ("secret", 0o777), (DOCS, 0o755)):
        (world.root / "shared" / space).mkdir(mode=mode, exist_ok=True)
        (world.root / "shared" / space).chmod(mode)
    (world.root / "home" / str(world.user.uid)).mkdir(mode=0o700)
    os.chown(world.root / "home" / str(world.user.uid), world.user.uid, world.user.gid)
    return world


def test_an_agent_sees_only_what_its_authority_lets_it(coder: World) -> None:
    mountpoint = coder.scratch / "ctx"
    before = tree(coder.root)
    with mounted(coder.root, mountpoint, "--as", "coder"):
        assert sorted(os.listdir(mountpoint)) == ROOT_ABI
        assert sorted(os.listdir(mountpoint / "tool")) == ["fs.stat", "fs.stat.d", "tsh.d"]
        assert sorted(os.listdir(mountpoint / "agent")) == ["coder", "coder.d"]
        assert os.listdir(mountpoint / "home") == [str(coder.user.uid)]
        assert sorted(os.listdir(mountpoint / "shared")) == ["audit", "cortexfs-docs", "team"]
        with pytest.raises(FileNotFoundError):
            (mountpoint / "tool" / "shell.exec").stat()
        with pytest.raises(FileNotFoundError):
            (mountpoint / "shared" / "secret").stat()
    assert tree(coder.root) == before, "authorisation wrote nothing (T-5)"


def test_an_agents_directory_link_counts_do_not_count_what_it_may_not_see(coder: World) -> None:
    """T-5: tool/ holds a .d directory for every tool on disk; a count of them would tell
    how many are hidden.  A directory of an agent's view counts 1 ("not counted")."""
    mountpoint = coder.scratch / "ctx"
    with mounted(coder.root, mountpoint, "--as", "coder"):
        for directory in ("", "tool", "shared", "agent", "tool/fs.stat.d"):
            assert (mountpoint / directory).stat().st_nlink == 1, directory
    with mounted(coder.root, mountpoint):  # the host's view counts as the disk does
        tool = coder.root / "tool"
        assert (mountpoint / "tool").stat().st_nlink == tool.stat().st_nlink > 2


def test_an_agent_writes_only_where_its_policy_and_the_modes_allow(coder: World) -> None:
    mountpoint = coder.scratch / "ctx"
    uid = coder.user.uid
    with mounted(coder.root, mountpoint, "--as", "coder"):
        wrote = as_user(
            coder.user,
            f"echo mine > {mountpoint}/home/{uid}/a && echo ours > {mountpoint}/shared/team/b",
        )
        assert wrote.returncode == 0, wrote.stderr
        for forbidden in ("shared/audit/c", "tool/new-tool", "agent/coder.d/policy"):
            refused = as_user(coder.user, f"echo x >> {mountpoint}/{forbidden}")
            assert refused.returncode != 0, forbidden
            assert "Permission denied" in refused.stderr, refused.stderr
    created = coder.root / "home" / str(uid) / "a"
    assert created.read_text() == "mine\n"
    assert (created.stat().st_uid, created.stat().st_gid) == (uid, coder.user.gid)
    assert (coder.root / "shared" / "team" / "b").read_text() == "ours\n"
    assert not (coder.root / "shared" / "audit" / "c").exists()
    assert not (coder.root / "tool" / "new-tool").exists()


def test_an_agents_view_serves_the_agent_and_whoever_mounted_it_and_no_other_uid(
    coder: World,
) -> None:
    """P-5 step 1, peer credentials (F-1: the view's reads, writes and executes are checked
    with the chain): the view decides for its agent, so a process of another uid, which the
    root's mount lets in (allow_other), would be granted what the agent was.  Refused with
    EACCES before any name is looked at; the agent and root, who mounted it, are served."""
    [outsider] = users_named("ctxview-o")
    mountpoint = coder.scratch / "ctx"
    drop = coder.root / "shared" / "team" / "from-outsider"
    with mounted(coder.root, mountpoint, "--as", "coder"):
        # What reaches the daemon whatever the kernel keeps: a listing, a create, an exec.
        for script in (
            f"ls {mountpoint}/tool",
            f"echo x > {mountpoint}/shared/team/from-outsider",
            f"{mountpoint}/tool/fs.stat /",
            f"ls {mountpoint}/shared/team",
        ):
            refused = as_user(outsider, script)
            assert refused.returncode != 0, script
            assert "Permission denied" in refused.stderr, (script, refused.stderr)
        listed = as_user(
            coder.user, f"ls {mountpoint}/tool && echo mine > {mountpoint}/shared/team/a"
        )
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.split() == ["fs.stat", "fs.stat.d", "tsh.d"]
        assert sorted(os.listdir(mountpoint / "tool")) == ["fs.stat", "fs.stat.d", "tsh.d"]
    assert not drop.exists()
    assert (coder.root / "shared" / "team" / "a").read_text() == "mine\n"


def test_the_host_view_serves_every_uid_by_its_mode_bits(coder: World) -> None:
    """The host's view is the storage root as it is: a uid its mode bits let in is served."""
    [outsider] = users_named("ctxview-o")
    mountpoint = coder.scratch / "ctx"
    with mounted(coder.root, mountpoint):
        listed = as_user(outsider, f"ls {mountpoint}/shared")
        assert listed.returncode == 0, listed.stderr
        assert {"team", "audit", "secret"} <= set(listed.stdout.split())


def test_an_unavailable_tool_is_not_listed(coder: World) -> None:
    """C-2: a malformed program control makes the tool unavailable; the runner refuses it,
    and the view lists only what passes the same test (T-5)."""
    (coder.root / "tool" / "fs.stat.d" / "program").write_text("{not json")
    refused = subprocess.run(
        [sys.executable, "-m", "cortexfs", "--storage", str(coder.root), "run",
         "--agent", "coder", "fs.stat", "/"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 126 and "not available" in refused.stderr, refused.stderr
    mountpoint = coder.scratch / "ctx"
    with mounted(coder.root, mountpoint, "--as", "coder"):
        assert sorted(os.listdir(mountpoint / "tool")) == ["tsh.d"]
        for name in ("fs.stat", "fs.stat.d", "fs.stat.d/program"):
            with pytest.raises(FileNotFoundError):
                (mountpoint / "tool" / name).stat()


def test_a_revoked_tool_disappears_from_the_view(coder: World) -> None:
    mountpoint = coder.scratch / "ctx"
    policy = coder.root / "tool" / "fs.stat.d" / "policy"
    with mounted(coder.root, mountpoint, "--as", "coder"):
        assert "fs.stat" in os.listdir(mountpoint / "tool")
        policy.write_text("")  # the tool's own half of P-6 is gone
        time.sleep(1.5)  # the kernel keeps an answer for a second at most
        assert "fs.stat" not in os.listdir(mountpoint / "tool")
        with pytest.raises(OSError) as gone:
            (mountpoint / "tool" / "fs.stat").stat()
        assert gone.value.errno == errno.ENOENT


def test_a_space_dropped_from_the_agents_policy_disappears_from_the_view(coder: World) -> None:
    mountpoint = coder.scratch / "ctx"
    policy = coder.root / "agent" / "coder.d" / "policy"
    with mounted(coder.root, mountpoint, "--as", "coder"):
        assert "audit" in os.listdir(mountpoint / "shared")
        kept = [line for line in policy.read_text().splitlines() if "shared:audit" not in line]
        policy.write_text("\n".join(kept) + "\n")
        time.sleep(1.5)  # the agent's controls are read again once a second old
        assert sorted(os.listdir(mountpoint / "shared")) == ["cortexfs-docs", "team"]


def test_a_link_held_by_an_o_path_descriptor_reads_nothing_once_its_space_is_hidden(
    coder: World,
) -> None:
    """docs/mount.md, *Open files*: what opens nothing by itself is no way around a
    revocation.  An ``O_PATH`` descriptor of a symbolic link in a space dropped from the
    agent's policy since reads no target through ``readlinkat(fd, "")``: ENOENT, as its
    name is."""
    mountpoint = coder.scratch / "ctx"
    (coder.root / "shared" / "audit" / "ln").symlink_to("the-target")
    policy = coder.root / "agent" / "coder.d" / "policy"
    with mounted(coder.root, mountpoint, "--as", "coder"):
        link = os.open(mountpoint / "shared" / "audit" / "ln", os.O_PATH | os.O_NOFOLLOW)
        try:
            assert os.readlink("", dir_fd=link) == "the-target"
            kept = [line for line in policy.read_text().splitlines() if "shared:audit" not in line]
            policy.write_text("\n".join(kept) + "\n")
            time.sleep(1.5)  # the agent's controls are read again once a second old
            with pytest.raises(OSError) as hidden:
                os.readlink("", dir_fd=link)
            assert hidden.value.errno == errno.ENOENT
        finally:
            os.close(link)


def test_an_unknown_agent_is_refused_before_anything_is_mounted(world: World) -> None:
    mountpoint = world.scratch / "ctx"
    mountpoint.mkdir()

    refused = subprocess.run(
        [sys.executable, "-m", "cortexfs", "--storage", str(world.root), "mount",
         "--as", "ghost", str(mountpoint)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip

    assert refused.returncode == 1 and "ENOENT" in refused.stderr
    assert not os.path.ismount(mountpoint)
