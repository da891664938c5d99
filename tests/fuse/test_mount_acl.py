"""A POSIX ACL on the storage root decides through the mount as it decides there (SPEC F-1,
T-5; docs/mount.md, *Permissions and ACLs*).

The kernel checks a caller of the mount against the mode bits alone, whose group bits are an
ACL's mask: a member of a file's group whom the ACL gives less than the mask would otherwise
be let through, and the daemon, root, would open, make or remove for it what the storage
root refuses.  Each test acts as the unprivileged test user on the storage root and through
a real mount, and compares.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import struct
import sys
from pathlib import Path

import pytest

from tests.fuse.support import NEEDS_A_MOUNT, mounted
from tests.support.users import UnprivilegedUser, run_as
from tests.tools.support import World

pytestmark = NEEDS_A_MOUNT

USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
NO_ID = 0xFFFFFFFF
R, W, X = 4, 2, 1
SOMEONE_ELSE = 65534  # a named user of the ACLs that is not the test user
TEAM = 54327  # a supplementary group the test user is given in some cases


def set_acl(path: Path, *entries: tuple[int, int, int]) -> None:
    """``entries`` (tag, permissions, id) as ``path``'s access ACL, in the kernel's xattr
    form."""
    value = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *entry) for entry in entries)
    try:
        os.setxattr(path, "system.posix_acl_access", value)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
            pytest.skip("the storage filesystem keeps no ACLs")
        raise


def acl(
    owner: int,
    group: int,
    other: int,
    mask: int,
    users: dict[int, int] | None = None,
    groups: dict[int, int] | None = None,
) -> list[tuple[int, int, int]]:
    """An access ACL: the owner's, owning group's and other's permissions, the mask, and
    the named ``users`` and ``groups`` (id: permissions), sorted as the kernel wants."""
    return [
        (USER_OBJ, owner, NO_ID),
        *((USER, permissions, uid) for uid, permissions in sorted((users or {}).items())),
        (GROUP_OBJ, group, NO_ID),
        *((GROUP, permissions, gid) for gid, permissions in sorted((groups or {}).items())),
        (MASK, mask, NO_ID),
        (OTHER, other, NO_ID),
    ]


def on_disk_and_mounted(world: World, label: str) -> tuple[Path, Path]:
    """A directory below ``shared/`` on the storage root, searchable by every uid, and its
    path through the mount at ``world.scratch / "ctx"``."""
    directory = world.root / "shared" / label
    directory.mkdir(mode=0o755)
    directory.chmod(0o755)
    return directory, world.scratch / "ctx" / "shared" / label


def sh_as(user: UnprivilegedUser, script: str) -> str:
    """``script``'s output and then its errors, run by ``user`` in its own group only."""
    done = run_as(user, ["sh", "-c", script], [user.gid])
    return done.stdout + done.stderr.replace("sh: 1: ", "")


# Each path given: "r" when it opens for reading, "w" for appending, "-" where refused.
OPENS = """
import os, sys
for path in sys.argv[1:]:
    answer = ""
    for letter, flags in (("r", os.O_RDONLY), ("w", os.O_WRONLY | os.O_APPEND)):
        try:
            os.close(os.open(path, flags))
            answer += letter
        except PermissionError:
            answer += "-"
    print(answer)
"""


def cases(me: int) -> dict[str, tuple[list[tuple[int, int, int]] | None, bool]]:
    """(access ACL, whether the file's group is the test user's, whose uid is ``me``): where
    an ACL and the mode bits tell different stories, and a file with no ACL."""
    return {
        "the owning group only reads, a named user writes (the mask shows rw)": (
            acl(R | W, R, 0, R | W, users={SOMEONE_ELSE: R | W}),
            True,
        ),
        "the caller, a named user, only reads, though its group writes": (
            acl(R | W, R | W, 0, R | W, users={me: R}),
            True,
        ),
        "the mask takes the named user's write": (
            acl(R | W, R, 0, R, users={me: R | W}),
            True,
        ),
        "a named group writes where the owning group only reads": (
            acl(R | W, R, 0, R | W, groups={TEAM: R | W}),
            True,
        ),
        "groups that match and refuse are no fall back to other": (
            acl(R | W, 0, R | W, R | W, groups={TEAM: 0}),
            True,
        ),
        "an empty mask leaves the mode bits to decide": (
            acl(R | W, R | W, R, 0, users={SOMEONE_ELSE: R | W}),
            True,
        ),
        "a named user granted more than the mode bits show (refused by the kernel)": (
            acl(R | W, 0, 0, R | W, users={me: R | W}),
            False,
        ),
        "no ACL at all": (None, True),
    }


def by_mode_bits(status: os.stat_result, user: UnprivilegedUser, groups: list[int]) -> str:
    """What the kernel's check of the mode bits alone lets ``user`` open (as :data:`OPENS`)."""
    bits = status.st_mode
    if status.st_uid == user.uid:
        bits >>= 6
    elif status.st_gid in (user.gid, *groups):
        bits >>= 3
    return ("r" if bits & R else "-") + ("w" if bits & W else "-")


@pytest.mark.parametrize("groups", [[], [TEAM]], ids=["own group", "with a named group"])
def test_every_open_through_the_host_view_is_judged_as_on_the_storage_root(
    world: World, groups: list[int]
) -> None:
    """Through the mount a file opens exactly when it opens on the storage root and the mode
    bits the kernel checks let it: never where the storage root refuses (the ACL narrows
    what the mask shows), and refused only where the mode bits alone refuse (a named user
    granted more than they show, docs/mount.md)."""
    directory, through = on_disk_and_mounted(world, "acl-opens")
    named = cases(world.user.uid)
    names = [f"case-{index}" for index in range(len(named))]
    for name, (entries, in_users_group) in zip(names, named.values(), strict=True):
        (directory / name).write_text("original\n")
        os.chown(directory / name, 0, world.user.gid if in_users_group else 0)
        os.chmod(directory / name, 0o640)
        if entries is not None:
            set_acl(directory / name, *entries)
    caller_groups = [world.user.gid, *groups]
    script = [sys.executable, "-c", OPENS]
    on_disk = run_as(world.user, [*script, *(str(directory / n) for n in names)], caller_groups)
    with mounted(world.root, world.scratch / "ctx"):
        mounted_answer = run_as(
            world.user, [*script, *(str(through / n) for n in names)], caller_groups
        )
    assert on_disk.returncode == 0 and mounted_answer.returncode == 0, (on_disk, mounted_answer)
    for case, name, disk, mount in zip(
        named, names, on_disk.stdout.split(), mounted_answer.stdout.split(), strict=True
    ):
        bits = by_mode_bits((directory / name).stat(), world.user, groups)
        expected = "".join(d if b != "-" else "-" for d, b in zip(disk, bits, strict=True))
        assert mount == expected, f"{case}: {mount} through the mount, {disk} on disk"
        assert (directory / name).read_text() == "original\n"


def test_writes_an_acl_refuses_are_refused_in_every_form(world: World) -> None:
    """The owning group (the test user's) only reads, a named user writes, so the group
    bits show ``rw``.  Appending, truncating on open and truncating by name (``truncate``,
    which opens, and ``truncate(2)``, which does not) are refused as on the storage root;
    reading is not."""
    directory, through = on_disk_and_mounted(world, "acl-writes")
    file = directory / "shared.txt"
    file.write_text("original\n")
    os.chown(file, 0, world.user.gid)
    set_acl(file, *acl(R | W, R, 0, R | W, users={SOMEONE_ELSE: R | W}))
    assert stat.S_IMODE(file.stat().st_mode) == 0o660
    script = (
        "cd {} && echo more >> shared.txt; echo append $?; true > shared.txt; echo trunc $?; "
        "truncate -s 0 shared.txt; echo truncate $?; "
        f"{sys.executable} -c 'import os; os.truncate(\"shared.txt\", 0)' 2>/dev/null; "
        "echo by-name $?; cat shared.txt"
    )
    on_disk = sh_as(world.user, script.format(directory))
    with mounted(world.root, world.scratch / "ctx"):
        through_mount = sh_as(world.user, script.format(through))
    assert "append 2" in on_disk and "truncate 1" in on_disk and "by-name 1" in on_disk, on_disk
    assert through_mount == on_disk
    assert file.read_text() == "original\n"


def test_names_in_a_directory_whose_acl_refuses_writing_are_neither_made_nor_removed(
    world: World,
) -> None:
    """A directory of the test user's group whose ACL lets the group list and search it but
    not write it (the mask, shown as group bits, says ``rwx``): making, removing, renaming
    and linking names in it are refused as on the storage root, and so is moving a
    directory whose ACL refuses writing into another (its ``..`` changes); listing and
    reading are not."""
    directory, through = on_disk_and_mounted(world, "acl-dirs")
    guarded = directory / "guarded"
    guarded.mkdir()
    (guarded / "old").write_text("kept\n")
    (guarded / "sub").mkdir()
    writable = directory / "writable"
    writable.mkdir(mode=0o777)
    writable.chmod(0o777)
    (writable / "incoming").write_text("x\n")
    # The user's own, which the kernel lets it link (fs.protected_hardlinks) where it may.
    os.chown(writable / "incoming", world.user.uid, world.user.gid)
    stuck = writable / "stuck"  # the user may write its parent, not itself
    stuck.mkdir()
    for path in (guarded, stuck):
        os.chown(path, 0, world.user.gid)
        set_acl(path, *acl(7, R | X, 0, 7, users={SOMEONE_ELSE: 7}))
        assert stat.S_IMODE(path.stat().st_mode) == 0o770
    script = (
        "cd {} && ls guarded && cat guarded/old; touch guarded/new; echo create $?; "
        "mkdir guarded/d; echo mkdir $?; rm guarded/old; echo unlink $?; "
        "rmdir guarded/sub; echo rmdir $?; mv guarded/old guarded/renamed; echo rename $?; "
        "mv writable/incoming guarded/; echo into $?; mv guarded/old writable/; echo out $?; "
        "ln writable/incoming guarded/link; echo link $?; "
        "mkdir writable/elsewhere && mv writable/stuck writable/elsewhere/; echo move $?; "
        "rmdir writable/elsewhere"
    )
    before = sorted(p.name for p in directory.rglob("*"))
    on_disk = sh_as(world.user, script.format(directory))
    assert "create 1" in on_disk and "move 1" in on_disk and "link 1" in on_disk, on_disk
    assert "kept" in on_disk and on_disk.count("Permission denied") == 9, on_disk
    assert sorted(p.name for p in directory.rglob("*")) == before
    with mounted(world.root, world.scratch / "ctx"):
        through_mount = sh_as(world.user, script.format(through))
    assert through_mount.replace(str(through), str(directory)) == on_disk
    assert sorted(p.name for p in directory.rglob("*")) == before


def test_a_directory_acl_that_refuses_listing_is_kept_but_not_searching(world: World) -> None:
    """Opening a directory to list it is judged as on the storage root; a path through it
    is judged by the mode bits (the kernel's own check, docs/mount.md), here the same."""
    directory, through = on_disk_and_mounted(world, "acl-list")
    hidden = directory / "hidden"
    hidden.mkdir()
    (hidden / "known").write_text("found by name\n")
    os.chown(hidden, 0, world.user.gid)
    set_acl(hidden, *acl(7, X, 0, R | X, users={SOMEONE_ELSE: R | X}))
    script = "ls {0}; echo list $?; cat {0}/known"
    on_disk = sh_as(world.user, script.format(hidden))
    with mounted(world.root, world.scratch / "ctx"):
        through_mount = sh_as(world.user, script.format(through / "hidden"))
    assert "list 2" in on_disk and "found by name" in on_disk, on_disk
    assert through_mount.replace(str(through), str(directory)) == on_disk


def test_a_program_is_executed_as_its_acl_says_which_needs_no_read(world: World) -> None:
    """``execve`` asks execution only: a program whose ACL gives the test user's group
    ``--x`` runs and cannot be read; one whose ACL gives ``r--`` (the mask shows ``x``)
    does not run.  Both as on the storage root."""
    directory, through = on_disk_and_mounted(world, "acl-exec")
    for name, group in (("runs", X), ("refused", R)):
        program = directory / name
        shutil.copyfile("/bin/true", program)
        os.chown(program, 0, world.user.gid)
        set_acl(program, *acl(7, group, 0, R | X, users={SOMEONE_ELSE: R | X}))
    script = (
        "cd {} && ./runs; echo runs $?; cat runs > /dev/null; echo read $?; "
        "./refused; echo refused $?"
    )
    on_disk = sh_as(world.user, script.format(directory))
    with mounted(world.root, world.scratch / "ctx"):
        through_mount = sh_as(world.user, script.format(through))
    assert "runs 0" in on_disk and "read 1" in on_disk and "refused 126" in on_disk, on_disk
    assert through_mount == on_disk


def test_an_acl_is_kept_in_an_agents_view_too(world: World) -> None:
    """T-5: a space the agent may write grants nothing the storage root's ACL refuses."""
    world.agent("coder", shared={"team": ["read", "write"]})
    space = world.root / "shared" / "team"
    space.mkdir(mode=0o777, exist_ok=True)
    space.chmod(0o777)
    file = space / "notes.txt"
    file.write_text("original\n")
    os.chown(file, 0, world.user.gid)
    set_acl(file, *acl(R | W, R, 0, R | W, users={SOMEONE_ELSE: R | W}))
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint, "--as", "coder"):
        notes = mountpoint / "shared" / "team" / "notes.txt"
        said = sh_as(world.user, f"cat {notes} && echo more >> {notes}; echo $?")
    assert said.startswith("original\n2\n") and said.endswith("Permission denied\n"), said
    assert file.read_text() == "original\n"
