"""Shared spaces: group-owned setgid directories; visibility by Linux bits plus policy (X-1)."""

from __future__ import annotations

import errno
import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs import durable, storage
from cortexfs.errors import CtxError
from cortexfs.queue.layout import STATE_DIRS, init_queue, queue_path
from cortexfs.shared.spaces import SPACE_DIRS, create_shared_space
from tests.support.users import run_as
from tests.tools.support import World, effective_user

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]
SPACE_GROUP = 4343


def test_create_makes_the_four_directories_group_owned_and_setgid(world: World) -> None:
    report = create_shared_space(world.root, "proj", gid=SPACE_GROUP)

    space = world.root / "shared/proj"
    directories = [space, *(space / name for name in (*SPACE_DIRS, "queue"))]
    directories += [space / "queue" / state for state in STATE_DIRS]
    modes = {space: 0o3770, space / "agent": 0o3770, space / "queue": 0o3770}
    modes[space / "tool"] = 0o2750
    for directory in directories:
        status = os.stat(directory)
        assert status.st_gid == SPACE_GROUP, directory
        assert stat.S_IMODE(status.st_mode) == modes.get(directory, 0o2770), directory
    assert sorted(os.listdir(space)) == ["agent", "data", "queue", "tool"]
    (space / "data" / "notes.txt").write_text("x")
    assert os.stat(space / "data" / "notes.txt").st_gid == SPACE_GROUP, "setgid inheritance"
    assert str(space) in report.created and report.gid == SPACE_GROUP


def test_a_creator_s_umask_077_leaves_the_queue_config_readable_by_the_group(
    world: World,
) -> None:
    """Every member opens the queue through queue/config: a 0600 config locked the group out
    of a space made by a user with umask 077 ('EACCES: config: Permission denied')."""
    previous = os.umask(0o077)
    try:
        create_shared_space(world.root, "private", gid=SPACE_GROUP)
    finally:
        os.umask(previous)

    config = os.stat(world.root / "shared/private/queue/config")
    assert stat.S_IMODE(config.st_mode) == 0o644, oct(config.st_mode)
    assert config.st_gid == SPACE_GROUP


def test_create_is_idempotent_and_completes_a_space_whose_queue_came_first(world: World) -> None:
    storage.ensure_root_abi(world.root)  # the layout older versions' queue init left
    init_queue(queue_path(world.root, "early"))
    (world.root / "shared/early").chmod(0o755)

    os.chown(world.root / "shared/early", -1, SPACE_GROUP)

    first = create_shared_space(world.root, "early")
    second = create_shared_space(world.root, "early")
    space = world.root / "shared/early"

    assert sorted(os.listdir(space)) == ["agent", "data", "queue", "tool"]
    assert {os.path.basename(path) for path in first.created} == {"tool", "data", "agent"}
    assert second.created == [] and second.repaired == []
    assert stat.S_IMODE(os.stat(space).st_mode) == 0o755, "left as it was without --group"
    for name in ("tool", "data", "agent"):
        assert os.stat(space / name).st_gid == SPACE_GROUP, "the space's group, not the caller's"


def test_a_group_given_repairs_the_group_and_mode_of_the_spaces_own_directories(
    world: World,
) -> None:
    """docs/sessions.md (X-1): the space and agent/ 03770, tool/ 02750, data/, queue/ and its
    six directories 02770, all of the space's group; --group G puts back what differs."""
    storage.ensure_root_abi(world.root)  # the layout older versions' queue init left
    init_queue(queue_path(world.root, "early"))
    space = world.root / "shared/early"
    os.chown(space, -1, SPACE_GROUP)
    create_shared_space(world.root, "early")
    lease = space / "queue/lease"
    os.chown(lease, -1, 0)
    os.chmod(space / "data", 0o755)

    report = create_shared_space(world.root, "early", gid=SPACE_GROUP)
    again = create_shared_space(world.root, "early", gid=SPACE_GROUP)

    modes = {space: 0o3770, space / "agent": 0o3770, space / "queue": 0o3770}
    modes[space / "tool"] = 0o2750
    for directory in (space, *(space / name for name in (*SPACE_DIRS, "queue"))):
        assert os.stat(directory).st_gid == SPACE_GROUP, directory
        assert stat.S_IMODE(os.stat(directory).st_mode) == modes.get(directory, 0o2770), directory
    for state in STATE_DIRS:
        assert os.stat(space / "queue" / state).st_gid == SPACE_GROUP, state
        assert stat.S_IMODE(os.stat(space / "queue" / state).st_mode) == 0o2770, state
    assert str(lease) in report.repaired and str(space / "data") in report.repaired
    assert report.regrouped_from is None and again.repaired == []


def test_an_illegal_space_name_is_refused(world: World) -> None:
    with pytest.raises(CtxError) as refused:
        create_shared_space(world.root, "../escape")

    assert refused.value.errno == errno.EINVAL


@pytest.fixture
def space_tool(world: World) -> World:
    """Tool ``proj.echo`` in shared space ``proj`` (group = the test user's group)."""
    create_shared_space(world.root, "proj", gid=world.user.gid)
    world.install("proj.echo", "#!/bin/sh\ncat\n", tier="shared:proj")
    return world


@pytest.mark.parametrize("obstacle", ["queue", "data"])
def test_something_in_the_way_refuses_the_space_before_anything_is_made(
    world: World, obstacle: str
) -> None:
    """A file where a directory of the space belongs is ENOTDIR, and the refusal leaves the
    space as it found it: not the other directories made first."""
    space = world.root / "shared" / "partial"
    space.mkdir()
    (space / obstacle).write_text("in the way")

    with pytest.raises(CtxError) as refused:
        create_shared_space(world.root, "partial")

    assert refused.value.errno == errno.ENOTDIR
    assert os.listdir(space) == [obstacle]


def test_a_member_with_shared_read_may_run_the_spaces_tools(space_tool: World) -> None:
    space_tool.agent("member", tools=["proj.echo"], shared={"proj": ["read"]})
    space_tool.allow_tool("proj.echo", "member_t", location="shared/proj/tool")

    result = space_tool.run("proj.echo", {"hi": 1}, agent="member")

    assert result.ok, result.error
    call, outcome = space_tool.events("member")[-2:]
    assert (call["type"], outcome["type"]) == ("tool_call", "tool_result")
    # Both events of the call name the same object: the tool where CTX_PATH found it.
    assert call["object"] == outcome["object"] == "shared/proj/tool/proj.echo"


def test_without_shared_read_the_spaces_tools_are_not_on_ctx_path(space_tool: World) -> None:
    space_tool.agent("stranger", tools=["proj.echo"])
    space_tool.allow_tool("proj.echo", "stranger_t", location="shared/proj/tool")

    result = space_tool.run("proj.echo", {}, agent="stranger")

    assert (result.error.errno, result.error.stage) == (errno.ENOENT, "resolve")


def test_linux_permissions_keep_a_non_member_out(space_tool: World) -> None:
    os.chown(space_tool.root / "shared/proj", -1, SPACE_GROUP)
    space_tool.agent("outsider", tools=["proj.echo"], shared={"proj": ["read"]})
    space_tool.allow_tool("proj.echo", "outsider_t", location="shared/proj/tool")

    result = space_tool.run("proj.echo", {}, agent="outsider")

    assert (result.error.errno, result.error.step) == (errno.EACCES, 2)


def test_ctx_shared_create_gives_an_existing_space_the_group_asked_for(
    world: World, tmp_path: Path
) -> None:
    """The space's entries of its old group change group, setgid directories stay setgid;
    an entry given another group on purpose keeps it, and neither a link nor a file with
    another name (a hard link) gives the group what they lead to outside the space."""
    base = [*CTX, "--storage", str(world.root), "shared", "create", "team"]
    subprocess.run([*base, "--group", str(SPACE_GROUP)], check=True, capture_output=True)
    space = world.root / "shared" / "team"
    (space / "data" / "notes.txt").write_text("shared notes\n")
    kept = space / "data" / "kept.txt"
    kept.write_text("another group on purpose\n")
    os.chown(kept, -1, SPACE_GROUP + 7)
    outside = tmp_path / "outside.txt"
    outside.write_text("not the space's\n")
    os.chown(outside, -1, SPACE_GROUP)
    os.symlink(outside, space / "data" / "link")
    linked = tmp_path / "linked.txt"  # a second name outside the space
    linked.write_text("also elsewhere\n")
    os.chown(linked, -1, SPACE_GROUP)
    os.link(linked, space / "data" / "hard")
    os.mkfifo(space / "data" / "fifo")
    other = SPACE_GROUP + 1

    moved = subprocess.run([*base, "--group", str(other)], capture_output=True, text=True)
    again = subprocess.run([*base, "--group", str(other), "--json"], capture_output=True, text=True)

    assert moved.returncode == 0 and moved.stderr == "", moved
    assert moved.stdout.startswith(f"regrouped {space}: group {SPACE_GROUP} -> {other} ("), moved
    unchanged = {kept: SPACE_GROUP + 7, space / "data" / "hard": SPACE_GROUP}
    for entry in (space, *space.rglob("*")):
        if entry.is_symlink():
            continue  # a link's group grants nothing; it is left as it is
        assert os.lstat(entry).st_gid == unchanged.get(entry, other), entry
        if entry.is_dir():
            assert os.lstat(entry).st_mode & stat.S_ISGID, entry
    assert os.stat(outside).st_gid == SPACE_GROUP and os.stat(linked).st_gid == SPACE_GROUP
    assert f"kept      {space}/data/hard: group {SPACE_GROUP}, since it has other names" in (
        moved.stdout
    )
    report = json.loads(again.stdout)
    assert again.returncode == 0 and report["regrouped_from"] is None, report


def test_a_space_ctx_queue_init_made_becomes_the_groups_with_ctx_shared_create(
    world: World,
) -> None:
    ctx = [*CTX, "--storage", str(world.root)]
    subprocess.run([*ctx, "queue", "init", "--project", "late"], check=True, capture_output=True)
    published = subprocess.run(
        [*ctx, "queue", "publish", "--project", "late", "-"],
        input='{"tool": "fs.stat", "input": {}}',
        capture_output=True,
        text=True,
        check=True,
    )

    made = subprocess.run(
        [*ctx, "shared", "create", "late", "--group", str(SPACE_GROUP), "--json"],
        capture_output=True,
        text=True,
    )

    assert made.returncode == 0, made
    space = world.root / "shared" / "late"
    job = space / "queue" / "pending" / published.stdout.strip()
    for entry in (space, space / "queue", space / "queue" / "pending", job, space / "data"):
        assert os.stat(entry).st_gid == SPACE_GROUP, entry
    assert json.loads(made.stdout)["regrouped"] >= 10


def test_only_root_regroups_entries_it_does_not_own(world: World) -> None:
    create_shared_space(world.root, "team", gid=SPACE_GROUP)
    space = world.root / "shared" / "team"
    before = {entry: os.lstat(entry).st_gid for entry in (space, *space.rglob("*"))}

    groups = os.getgroups()
    os.setgroups([SPACE_GROUP])  # a member of the space's group: it sees in
    try:
        with effective_user(world.user), pytest.raises(CtxError) as refused:
            create_shared_space(world.root, "team", gid=world.user.gid)
    finally:
        os.setgroups(groups)

    assert refused.value.errno == errno.EPERM and "nothing was changed" in str(refused.value)
    assert {entry: os.lstat(entry).st_gid for entry in before} == before


def test_ctx_shared_create(world: World) -> None:
    base = [*CTX, "--storage", str(world.root), "shared", "create"]

    made = subprocess.run(
        [*base, "team", "--group", str(SPACE_GROUP), "--json"], capture_output=True, text=True
    )
    again = subprocess.run([*base, "team"], capture_output=True, text=True)
    no_group = subprocess.run(
        [*base, "other", "--group", "no-such-group-xyz"], capture_output=True, text=True
    )

    assert made.returncode == 0 and json.loads(made.stdout)["gid"] == SPACE_GROUP
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert no_group.returncode == 2 and "no such group" in no_group.stderr


@pytest.mark.parametrize("name", ["cortexfs-docs", ".hidden", "x.d", "a/b"])
def test_ctx_shared_create_refuses_a_reserved_or_illegal_name_as_a_usage_error(
    world: World, name: str
) -> None:
    completed = subprocess.run(
        [*CTX, "--storage", str(world.root), "shared", "create", name],
        capture_output=True,
        text=True,
    )

    assert completed.returncode == 2, completed.stderr
    assert completed.stderr.startswith("ctx: EINVAL: ")
    assert not (world.root / "shared" / name / "queue").exists(), "nothing is made"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as the test user")
def test_a_group_the_creator_is_not_in_is_refused_before_anything_is_made(world: World) -> None:
    name = pwd.getpwuid(world.user.uid).pw_name
    if SPACE_GROUP in os.getgrouplist(name, world.user.gid):
        pytest.skip(f"the test user is in group {SPACE_GROUP}")
    os.chown(world.root / "shared", world.user.uid, world.user.gid)

    with effective_user(world.user), pytest.raises(CtxError) as refused:
        create_shared_space(world.root, "theirs", gid=SPACE_GROUP)
    with effective_user(world.user):
        own = create_shared_space(world.root, "mine", gid=world.user.gid)

    assert refused.value.errno == errno.EPERM and "not a member" in refused.value.message
    assert not (world.root / "shared" / "theirs").exists(), "nothing half-made"
    assert own.gid == world.user.gid


@pytest.mark.parametrize("made_for_it", [False, True], ids=["missing", "empty"])
def test_a_space_asked_for_in_a_new_root_comes_with_the_whole_root(
    tmp_path: Path, made_for_it: bool
) -> None:
    """Never half a root: the core tools, tsh's config and the manual come with it (R-2),
    where the root does not exist and where it is an empty directory made for it."""
    missing = tmp_path / "no-root"
    if made_for_it:
        missing.mkdir()

    command = [*CTX, "--storage", str(missing), "shared", "create", "proj"]
    made = subprocess.run(command, capture_output=True, text=True)

    assert made.returncode == 0, made.stderr
    assert sorted(os.listdir(missing)) == ["agent", "bin", "home", "model", "shared", "tool"]
    for entry in ("tool/fs.read", "tool/tsh.d/config", "bin/tsh", "shared/cortexfs-docs"):
        assert (missing / entry).exists(), entry
    assert sorted(os.listdir(missing / "shared" / "proj")) == ["agent", "data", "queue", "tool"]


def test_a_tree_deeper_than_a_regroup_walks_is_kept_and_the_rest_regrouped(world: World) -> None:
    """A member's tree of any depth neither stops the regroup halfway nor exhausts its
    descriptors: what lies too deep keeps its group and is listed."""
    create_shared_space(world.root, "team", gid=SPACE_GROUP)
    space = world.root / "shared" / "team"
    fd = os.open(space / "data", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(1100):  # deeper than a path may be named: walked by descriptor
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)

    report = create_shared_space(world.root, "team", gid=SPACE_GROUP + 1)

    assert report.regrouped_from == SPACE_GROUP and report.gid == SPACE_GROUP + 1
    (kept,) = report.kept
    assert kept["path"].startswith(f"{space}/data/d/d/") and "deeper than 256" in kept["reason"]
    for name in ("queue", "tool", "agent", "data", "queue/pending"):
        assert os.stat(space / name).st_gid == SPACE_GROUP + 1, name
    again = create_shared_space(world.root, "team", gid=SPACE_GROUP + 1)
    assert again.regrouped_from is None
    remove_deep_tree(space / "data")


def remove_deep_tree(directory: Path) -> None:
    """Remove ``directory/d/d/…`` one level at a time from the top: the tree is deeper than
    shutil.rmtree (or any path) can reach."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while os.path.isdir(os.path.join(f"/proc/self/fd/{fd}", "d", "d")):
            os.rename("d/d", "up", src_dir_fd=fd, dst_dir_fd=fd)
            os.rmdir("d", dir_fd=fd)
            os.rename("up", "d", src_dir_fd=fd, dst_dir_fd=fd)
        os.rmdir("d", dir_fd=fd)
    finally:
        os.close(fd)


class _SwapAfterMkdir(durable.FsOps):
    """Real operations, but right after the mkdir of ``name`` another user's directory
    ``theirs`` is moved in at that name (ours moved aside), as a member who may write the
    parent can do between root's mkdir and its chmod."""

    def __init__(self, name: str, theirs: Path) -> None:
        super().__init__()
        self.name, self.theirs, self.swapped = name, theirs, False

    def mkdir(self, name: str, dir_fd: int, mode: int = 0o777) -> None:
        super().mkdir(name, dir_fd, mode)
        if name == self.name and not self.swapped:
            self.swapped = True
            os.rename(name, f"{name}.ours", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            os.rename(self.theirs, name, dst_dir_fd=dir_fd)


@pytest.mark.parametrize("state", ["inbox", "lease"])
def test_a_directory_moved_in_after_the_mkdir_of_a_queue_directory_is_refused_untouched(
    world: World, traversable_tmp: Path, state: str
) -> None:
    """Root repairing a space whose queue directories a member removed (queue/ is 02770):
    the directory found at the name after root's mkdir is not root's, so it is neither given
    the space's group nor chmodded: EEXIST names it."""
    create_shared_space(world.root, "team", gid=SPACE_GROUP)
    queue = world.root / "shared/team/queue"
    os.rmdir(queue / state)
    outside = traversable_tmp / "outside"
    outside.mkdir(mode=0o777)
    outside.chmod(0o777)
    made = run_as(world.user, ["/bin/sh", "-c", f"umask 0; mkdir {outside}/theirs"])
    assert made.returncode == 0, made.stderr
    theirs = outside / "theirs"
    before = os.lstat(theirs)

    with pytest.raises(CtxError) as refused:
        create_shared_space(world.root, "team", gid=SPACE_GROUP, ops=_SwapAfterMkdir(state, theirs))

    assert refused.value.errno == errno.EEXIST and str(queue / state) in refused.value.message
    after = os.lstat(queue / state)
    assert (after.st_ino, after.st_uid, after.st_gid, after.st_mode) == (
        before.st_ino,
        world.user.uid,
        before.st_gid,
        before.st_mode,
    )


def _member_ctx(world: World, *arguments: str) -> subprocess.CompletedProcess[str]:
    return run_as(world.user, [*CTX, "--storage", str(world.root), *arguments])


@pytest.mark.parametrize(
    "repair", [["queue", "init", "--project", "team"], ["shared", "create", "team"]]
)
def test_root_repairing_a_space_makes_the_missing_directory_with_the_spaces_group(
    world: World, repair: list[str]
) -> None:
    """The queue's ENOENT says 'repair it with ctx queue init': run by root, that made lease/
    root's group, locking every member out of the queue (X-1: all of the space's group)."""
    made = subprocess.run(
        [
            *CTX,
            "--storage",
            str(world.root),
            "shared",
            "create",
            "team",
            "--group",
            str(world.user.gid),
        ],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    lease = world.root / "shared/team/queue/lease"
    os.rmdir(lease)  # a member may not: queue/ is sticky (see the test below)

    repaired = subprocess.run(
        [*CTX, "--storage", str(world.root), *repair], capture_output=True, text=True
    )
    status = _member_ctx(world, "queue", "status", "--project", "team")

    assert repaired.returncode == 0, repaired.stderr
    assert os.stat(lease).st_gid == world.user.gid
    assert stat.S_IMODE(os.stat(lease).st_mode) == 0o2770
    assert status.returncode == 0, status.stderr


def test_ctx_shared_create_with_the_spaces_group_repairs_a_directory_of_another_group(
    world: World,
) -> None:
    """A lease/ an older repair left root's (group 0) is not 'nothing to do' for --group G."""
    base = [*CTX, "--storage", str(world.root), "shared", "create", "team"]
    group = ["--group", str(world.user.gid)]
    assert subprocess.run([*base, *group], capture_output=True).returncode == 0
    lease = world.root / "shared/team/queue/lease"
    os.chown(lease, 0, 0)
    os.chmod(lease, 0o2755)

    repaired = subprocess.run([*base, *group], capture_output=True, text=True)
    status = _member_ctx(world, "queue", "status", "--project", "team")

    assert repaired.returncode == 0, repaired.stderr
    assert f"repaired  {lease}" in repaired.stdout and "nothing to do" not in repaired.stdout
    assert (os.stat(lease).st_gid, stat.S_IMODE(os.stat(lease).st_mode)) == (
        world.user.gid,
        0o2770,
    )
    assert status.returncode == 0, status.stderr


def test_a_space_directory_of_another_owner_is_refused_not_repaired(world: World) -> None:
    """A queue directory of a member's own (queue/ is group-writable) is kept: --group G
    does not chmod another uid's directory for it; EPERM names it, nothing changes."""
    base = [*CTX, "--storage", str(world.root), "shared", "create", "team"]
    group = ["--group", str(world.user.gid)]
    assert subprocess.run([*base, *group], capture_output=True).returncode == 0
    lease = world.root / "shared/team/queue/lease"
    data = world.root / "shared/team/data"
    os.chmod(data, 0o2750)  # root's own, to be repaired were anything repaired
    os.rmdir(lease)  # as an older release let a member do (queue/ was not sticky)
    made = run_as(world.user, ["/bin/sh", "-c", f"umask 077 && mkdir {lease}"])
    assert made.returncode == 0, made.stderr

    refused = subprocess.run([*base, *group], capture_output=True, text=True)

    assert refused.returncode == 1, refused
    assert refused.stderr.startswith(f"ctx: EPERM: {lease} belongs to uid {world.user.uid}")
    # Moved aside, a state directory would take its jobs with it: it is given back instead.
    assert f"have root give it back, keeping what is in it, with 'chown 0 {lease}'" in (
        refused.stderr
    )
    assert stat.S_IMODE(os.stat(lease).st_mode) == 0o2700  # setgid inherited, mode its own
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o2750, "nothing was changed"


def test_a_member_cannot_remove_or_rename_the_queues_own_directories(world: World) -> None:
    """queue/ is sticky: the six directories and config are the owner's, so a member cannot
    stop the queue by removing one, nor swap one of its own in for a repair to meet."""
    create_shared_space(world.root, "team", gid=world.user.gid)
    queue = world.root / "shared/team/queue"

    removed = run_as(world.user, ["/bin/rmdir", str(queue / "lease")])
    renamed = run_as(world.user, ["/bin/mv", str(queue / "pending"), str(queue / "old")])
    unlinked = run_as(world.user, ["/bin/rm", "-f", str(queue / "config")])

    assert stat.S_IMODE(os.stat(queue).st_mode) == 0o3770
    assert removed.returncode and renamed.returncode and unlinked.returncode
    assert sorted(os.listdir(queue)) == sorted(["config", *STATE_DIRS])


def test_a_member_asking_for_a_repair_of_roots_directory_is_told_who_may(world: World) -> None:
    base = ["shared", "create", "team", "--group", str(world.user.gid)]
    assert subprocess.run([*CTX, "--storage", str(world.root), *base]).returncode == 0
    data = world.root / "shared/team/data"
    os.chmod(data, 0o2750)

    refused = _member_ctx(world, *base)

    assert refused.returncode == 1, refused
    assert refused.stderr.startswith(f"ctx: EPERM: {data}: its group"), refused.stderr
    assert "only root or its owner, uid 0, may change them" in refused.stderr
    assert stat.S_IMODE(os.stat(data).st_mode) == 0o2750


def bind_socket(path: Path) -> None:
    """A UNIX socket bound at ``path`` (bound from its directory: a socket address holds a
    shorter path than a test's directory may have); nobody listens on it."""
    script = "import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])"
    subprocess.run([sys.executable, "-c", script, path.name], cwd=path.parent, check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a device node: needs root")
def test_a_regroup_gives_sockets_and_device_nodes_the_group_but_keeps_a_second_name(
    world: World, tmp_path: Path
) -> None:
    """A socket's or a device node's group bits say who may connect to it or use the device:
    a regroup gives them the new group as every other entry, through a descriptor of the
    entry alone (never connecting to it, never opening the device); one with a second name,
    which may lie outside the space, keeps its group and is listed as kept."""
    create_shared_space(world.root, "team", gid=SPACE_GROUP)
    data = world.root / "shared" / "team" / "data"
    socket_path, device = data / "app.sock", data / "null"
    bind_socket(socket_path)
    os.mknod(device, 0o660 | stat.S_IFCHR, os.makedev(1, 3))
    outside = tmp_path / "outside.sock"
    bind_socket(outside)
    os.link(outside, data / "linked.sock")
    for entry in (socket_path, device, outside):
        os.chown(entry, -1, SPACE_GROUP)

    report = create_shared_space(world.root, "team", gid=SPACE_GROUP + 1)

    assert os.lstat(socket_path).st_gid == SPACE_GROUP + 1
    assert os.lstat(device).st_gid == SPACE_GROUP + 1
    assert os.lstat(outside).st_gid == SPACE_GROUP
    assert report.kept == [
        {
            "path": str(data / "linked.sock"),
            "reason": "it has other names (hard links), which may lie outside the space",
        }
    ]
