"""The lock that installs and repairs of a directory take turns under (T-8, A-3, R-5, H-4).

Any uid that may read a directory may ``flock`` it, so a lock taken on a tier directory or a
control directory would let it stall every install, ``ctx bootstrap`` and ``tsh.config`` for
ever.  The lock is a hidden file only those who may install there can open: these tests hold
the directories' locks as a real second uid and check that nothing waits for it."""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from cortexfs import locks
from cortexfs.errors import CtxError
from cortexfs.locks import LOCK_FILE
from cortexfs.tools.core import tsh_config
from cortexfs.tools.install import TOOL_KIND
from cortexfs.tools.pairs import install_pair, repair_staged
from tests.support.users import UnprivilegedUser, access_as
from tests.tools.held_locks import CTX, PATIENCE, ctx, held_by
from tests.tools.support import World, effective_user

CONTROLS = {
    "name": b"probe\n",
    "description": b"d\n",
    "schema": b'{"type": "object"}\n',
    "cap": b"{}\n",
}


def tool_manifest(world: World, name: str) -> Path:
    program = world.scratch / f"{name}.sh"
    program.write_text("#!/bin/sh\ncat\n")
    program.chmod(0o755)
    manifest = world.scratch / f"{name}.json"
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": name,
        "description": "d",
        "schema": {"type": "object"},
        "cap": {},
        "exec": str(program),
    }
    manifest.write_text(json.dumps(document))
    return manifest


def test_another_uid_holding_the_tier_directories_stalls_no_install_nor_bootstrap(
    world: World,
) -> None:
    manifest = tool_manifest(world, "probe")
    request = world.scratch / "agent.json"
    request.write_text(json.dumps({"name": "b1", "label": "b1_t", "tools": []}))
    tsh = world.root / "tool/tsh"
    tsh.write_bytes(tsh.read_bytes() + b"\n# changed\n")  # bootstrap reinstalls tsh

    with held_by(world.user, world.root / "tool", world.root / "agent"):
        installed = ctx(world.root, "object", "install", str(manifest), "--tier", "system")
        bootstrapped = ctx(world.root, "bootstrap")
        created = ctx(
            world.root,
            "agent",
            "create",
            "--user",
            str(world.user.uid),
            "--gid",
            str(world.user.gid),
            str(request),
        )

    assert installed.returncode == 0, installed.stderr
    assert bootstrapped.returncode == 0, bootstrapped.stderr
    assert "repaired  tool/tsh" in bootstrapped.stdout, bootstrapped.stdout
    assert created.returncode == 0, created.stderr
    assert (world.root / "tool/probe").is_file() and (world.root / "agent/b1").is_file()


def test_another_uid_holding_tsh_d_stalls_neither_tsh_config_nor_a_reinstall_of_tsh(
    world: World,
) -> None:
    tsh = world.root / "tool/tsh"
    tsh.write_bytes(tsh.read_bytes() + b"\n# changed\n")

    with held_by(world.user, world.root / "tool/tsh.d"):
        updated = ctx(world.root, "tool", "tsh.config", "cache_capacity=40")
        bootstrapped = ctx(world.root, "bootstrap")

    assert updated.returncode == 0, updated.stderr
    assert bootstrapped.returncode == 0, bootstrapped.stderr
    assert "repaired  tool/tsh" in bootstrapped.stdout, bootstrapped.stdout
    assert "cache_capacity=40\n" in (world.root / "tool/tsh.d/config").read_text()


def test_tsh_config_takes_the_lock_file_installs_take(world: World) -> None:
    """tsh.config runs from a bundle of its own modules, which cortexfs.locks is not part
    of: it names the lock file, and opens it, itself."""
    assert tsh_config.LOCK_FILE == LOCK_FILE
    assert tsh_config._LOCK_FLAGS == locks._OPEN_FLAGS


def test_the_lock_file_is_the_owners_alone_and_no_object(world: World) -> None:
    world.install("probe", "#!/bin/sh\ncat\n")
    lock = world.root / "tool" / LOCK_FILE

    status = lock.lstat()
    listed = ctx(world.root, "object", "list", "--json")

    assert stat.S_ISREG(status.st_mode) and stat.S_IMODE(status.st_mode) == 0o600
    assert status.st_uid == world.root.stat().st_uid
    assert access_as(world.user, [(str(lock), "r")]) == [False]
    assert listed.returncode == 0, listed.stderr
    assert LOCK_FILE not in listed.stdout
    assert not os.path.lexists(world.root / "tool/probe.d" / LOCK_FILE)


def test_a_lock_file_root_makes_is_the_directorys_owners_who_installs_there_after(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    tier = traversable_tmp / "tier"
    tier.mkdir()
    os.chown(tier, unprivileged_user.uid, unprivileged_user.gid)

    install_pair(tier, "probe", TOOL_KIND, entry=b"#!/bin/sh\n", controls=CONTROLS, replace=True)
    with effective_user(unprivileged_user):
        replaced = install_pair(
            tier, "other", TOOL_KIND, entry=b"#!/bin/sh\n", controls=CONTROLS, replace=True
        )

    status = (tier / LOCK_FILE).lstat()
    assert replaced is False
    assert (status.st_uid, stat.S_IMODE(status.st_mode)) == (unprivileged_user.uid, 0o600)


def test_in_a_group_writable_tier_the_lock_file_is_still_the_owners_alone(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """Only a space's owner installs into its tool/ (a tool from a tier its group may write
    runs for nobody): a member can neither install there nor hold the lock."""
    tier = traversable_tmp / "tier"
    tier.mkdir()
    os.chown(tier, 0, unprivileged_user.gid)
    tier.chmod(0o2770)  # a space's tool/ as older versions made it

    install_pair(tier, "probe", TOOL_KIND, entry=b"#!/bin/sh\n", controls=CONTROLS, replace=True)
    with effective_user(unprivileged_user), pytest.raises(CtxError) as refused:
        install_pair(
            tier, "other", TOOL_KIND, entry=b"#!/bin/sh\n", controls=CONTROLS, replace=True
        )

    status = (tier / LOCK_FILE).lstat()
    assert (status.st_gid, stat.S_IMODE(status.st_mode)) == (unprivileged_user.gid, 0o600)
    assert access_as(unprivileged_user, [(str(tier / LOCK_FILE), "r")]) == [False]
    assert refused.value.errno == errno.EACCES
    assert "(it belongs to uid 0, mode 0600)" in refused.value.message
    assert "run the command as the directory's owner" in refused.value.message
    assert sorted(os.listdir(tier)) == [LOCK_FILE, "probe", "probe.d"]


def test_an_install_that_may_not_take_the_lock_says_so_and_changes_nothing(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    tier = traversable_tmp / "tier"
    tier.mkdir()
    install_pair(tier, "probe", TOOL_KIND, entry=b"#!/bin/sh\n", controls=CONTROLS, replace=True)
    tier.chmod(0o777)  # the directory is anybody's to write, its lock file still root's

    with effective_user(unprivileged_user), pytest.raises(CtxError) as refused:
        install_pair(
            tier, "other", TOOL_KIND, entry=b"#!/bin/sh\n", controls=CONTROLS, replace=True
        )

    assert refused.value.errno == errno.EACCES
    assert f"cannot install {tier / 'other'}: {tier / LOCK_FILE} cannot be opened by uid" in (
        refused.value.message
    )
    assert "nothing was installed" in refused.value.message
    assert sorted(os.listdir(tier)) == [LOCK_FILE, "probe", "probe.d"]


def test_a_fifo_at_the_lock_files_name_is_refused_without_waiting(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / LOCK_FILE)

    with pytest.raises(CtxError) as refused:
        install_pair(
            tmp_path, "probe", TOOL_KIND, entry=b"#!/bin/sh\n", controls=CONTROLS, replace=True
        )

    assert refused.value.errno == errno.EEXIST
    assert f"{tmp_path / LOCK_FILE} is a special file, not the lock file" in refused.value.message
    assert sorted(os.listdir(tmp_path)) == [LOCK_FILE]


def test_a_repair_of_a_tier_this_uid_may_only_read_finds_nothing_to_do(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """``ctx bootstrap`` looks at every space's tier, some of them not its to write."""
    tier = traversable_tmp / "tier"
    tier.mkdir()
    tier.chmod(0o755)

    with effective_user(unprivileged_user):
        repaired = repair_staged(tier, TOOL_KIND)
    (tier / ".probe~0123456789ab~entry").write_text("#!/bin/sh\n")
    with effective_user(unprivileged_user), pytest.raises(CtxError) as refused:
        repair_staged(tier, TOOL_KIND)

    assert repaired == []
    assert refused.value.errno == errno.EACCES
    assert os.listdir(tier) == [".probe~0123456789ab~entry"]


def test_a_lock_file_another_uid_put_in_the_tier_is_refused_not_waited_for(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """In a tier its group may write, a member may remove the owner's lock file and put one of
    its own at the name, which it could hold for ever: the owner's install refuses it at once,
    naming whose it is and what removes it, and changes nothing."""
    tier = traversable_tmp / "tier"
    tier.mkdir()
    os.chown(tier, 0, unprivileged_user.gid)
    tier.chmod(0o2770)  # a space's tool/ as older versions made it
    install_pair(tier, "probe", TOOL_KIND, entry=b"#!/bin/sh\n", controls=CONTROLS, replace=True)
    with effective_user(unprivileged_user):
        os.unlink(tier / LOCK_FILE)
        (tier / LOCK_FILE).touch(mode=0o600)

    with held_by(unprivileged_user, tier / LOCK_FILE), pytest.raises(CtxError) as refused:
        install_pair(
            tier, "other", TOOL_KIND, entry=b"#!/bin/sh\n", controls=CONTROLS, replace=True
        )

    assert refused.value.errno == errno.EEXIST
    assert (
        f"{tier / LOCK_FILE} belongs to uid {unprivileged_user.uid}, not to uid 0, the owner of"
        in refused.value.message
    )
    assert f"('rm {tier / LOCK_FILE}')" in refused.value.message
    assert sorted(os.listdir(tier)) == [LOCK_FILE, "probe", "probe.d"]


def test_an_install_waiting_behind_a_held_lock_says_who_holds_it_then_installs(
    world: World,
) -> None:
    """An install waits for the one before it without a time limit; one that is stuck must
    not leave the next command silent: it names the lock file and its holder, then installs
    once the lock is let go."""
    manifest = tool_manifest(world, "probe")
    lock = world.root / "tool" / LOCK_FILE
    assert lock.is_file()  # bootstrap made it
    holder = subprocess.Popen(
        ["flock", "--exclusive", "--close", str(lock), "sh", "-c", "echo held; exec sleep 600"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its sleep, which does not hold the lock, ends with it
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        installing = subprocess.Popen(
            [*CTX, "--storage", str(world.root), "object", "install", str(manifest),
             "--tier", "system"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert installing.stderr is not None
        said_in_time = select.select([installing.stderr], [], [], PATIENCE)[0]
        said = installing.stderr.readline() if said_in_time else "(nothing said)"
        assert installing.poll() is None, said
        assert said == (
            f"ctx: waiting for {lock}, held by pid {holder.pid}: a change to {lock.parent} "
            "waits for the one before it to end (Ctrl-C stops waiting, and makes nothing of "
            "this change)\n"
        )
        assert not (world.root / "tool" / "probe").exists()
    except BaseException:
        installing.kill()
        raise
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
        holder.stdout.close()
    _, err = installing.communicate(timeout=PATIENCE)
    assert installing.returncode == 0, err
    assert (world.root / "tool" / "probe").is_file()


def test_an_install_beneath_a_root_follows_no_link_on_the_way(tmp_path: Path) -> None:
    """A space is its owner's to change: with the root given, a link put at ``shared/<space>``
    (after any check of the tier) is refused at the open, and nothing is written where it
    leads."""
    root = tmp_path / "root"
    (root / "shared").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "tool").mkdir(parents=True)
    (root / "shared" / "sp").symlink_to(elsewhere)

    with pytest.raises((OSError, CtxError)) as refused:
        install_pair(
            root / "shared" / "sp" / "tool", "probe", TOOL_KIND, entry=b"#!/bin/sh\n",
            controls=CONTROLS, replace=True, root=root,
        )  # fmt: skip

    assert refused.value.errno in (errno.ELOOP, errno.ENOTDIR), refused.value
    assert os.listdir(elsewhere / "tool") == []
