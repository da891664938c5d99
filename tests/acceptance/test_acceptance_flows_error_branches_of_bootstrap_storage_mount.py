"""The error branches of ``ctx bootstrap``, of the choice of a storage root and of ``ctx mount``
/ ``ctx umount``, each reached from outside as a user reaches it, and judged by SPEC, the
docs and the help texts.

The angle: every refusal these commands can give a user who names an odd or damaged storage
root (a loop of links, a regular file on the way, a link to nothing on the way, a root its
owner narrowed to ``0300``, a root below a directory the user may not search, a ``bin/`` of
another uid or open to everyone, a ``tool/`` that is a file), odd command lines (a SOURCE
that is a file or missing, ``--as`` values that are no agent name, ``--storage`` given twice
for two roots, paths longer than PATH_MAX), odd mount points (a link to an empty directory, a
link to nothing, a path through a loop of links, a directory inside a live mount or below a
dead one, an agent view that shows nothing, a tmpfs mounted over a live mount), and the
operations a real FUSE mount refuses (making a name at the root, exchanging a root entry,
extended attributes, ``mknod``).  Each refusal is checked for the documented exit status,
the errno word of the ``ctx: ERRNO: …`` line (and of the ``--json`` error object where the
command has one), the errno a syscall through the mount gets, that the message names what is
at fault and what to do where the docs say so, and that nothing is left half-done: no root
entry, no directory where a link leads, no mount left behind, no ``ctx mount`` process left
running.

SPEC ids: §1 R-1 (``--storage``, ``CTX_STORAGE``, ``XDG_DATA_HOME``), R-2, R-5 (``ctx
bootstrap [SOURCE]``), §12 D-1 (SOURCE), §13 F-1 (``ctx mount``, ``ctx umount``).  Docs:
README (*The queue in five commands*: exit statuses, ``ctx: ERRNO: what to do``, the
``--json`` error object), docs/mount.md, docs/queue.md (a storage root reached through a
link) and the ``--help`` texts of ``ctx``, ``ctx bootstrap``, ``ctx mount`` and ``ctx
umount``."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MOUNT_WAIT,
    ROOT_ENTRIES,
    Run,
    clean_env,
    ctx_run,
    kill_processes_of,
    needs_fuse,
    new_scratch_dir,
    processes_of,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

TOP = scratch_top(__file__)
PYTHON = sys.executable
NOBODY = 65534
PATH_MAX = 4096


# ---------------------------------------------------------------------- common steps


def refused(run: Run, errno_name: str, status: int) -> None:
    """``run`` ended with ``status``, said ``ctx: ERRNO: …`` on standard error, and printed no
    traceback."""
    assert run.rc == status, run
    assert f"ctx: {errno_name}: " in run.err, run
    assert "Traceback" not in run.err, run


def refused_json(run: Run, errno_name: str, status: int) -> dict:
    """As :func:`refused`, for a ``--json`` run: stdout is the error object alone, saying
    what stderr says."""
    refused(run, errno_name, status)
    error = run.json()
    assert error["error"] == errno_name, run
    assert error["errno"] == getattr(errno, errno_name), run
    assert error["message"] in run.err, run
    return error


def as_user(user: UnprivilegedUser, *args, env: dict[str, str] | None = None) -> Run:
    """``ctx ARGS`` as ``user`` (its own group only), in ``/``, in ``env`` (default: no
    CortexFS setting, HOME a directory that does not exist)."""
    done = subprocess.run(
        [*CTX_ARGV, *map(str, args)],
        input=b"",
        capture_output=True,
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        env=env if env is not None else clean_env(HOME="/nonexistent"),
        cwd="/",
        timeout=60,
    )
    return Run(
        [str(a) for a in args],
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


def give(path: Path, user: UnprivilegedUser) -> None:
    """``chown -R`` of ``path`` to ``user``, links not followed."""
    os.chown(path, user.uid, user.gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(Path(dirpath, name), user.uid, user.gid, follow_symlinks=False)


def mounts_at(path: Path) -> int:
    """How many mounts the mount table shows at ``path`` (one over another counts twice)."""
    target = str(path)
    with open("/proc/self/mountinfo") as table:
        return sum(1 for line in table if line.split()[4] == target)


def unmount_everything_at(path: Path) -> None:
    """Every mount at ``path`` (all below this file's scratch directory, all made here)
    removed: ``ctx umount`` first, else lazily with umount(8)."""
    for _ in range(6):
        count = mounts_at(path)
        if count == 0:
            return
        ctx_run("umount", path, timeout=30)
        if mounts_at(path) == count:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def ended(proc: subprocess.Popen) -> int:
    """The exit status of ``proc``, killed if it does not end in time."""
    try:
        return proc.wait(timeout=MOUNT_WAIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


@contextlib.contextmanager
def mounting(
    storage: Path, where: Path, *args: str, shown_at: Path | None = None
) -> Iterator[subprocess.Popen]:
    """``ctx mount --storage STORAGE ARGS WHERE`` in the background until the block ends
    (``shown_at``: where the mount table shows it, when ``where`` is a link); then every
    mount there is removed and the process ended."""
    shown = shown_at or where
    log = shown.with_name(shown.name + ".stderr")
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [*CTX_ARGV, "mount", "--storage", str(storage), *args, str(where)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            env=clean_env(), start_new_session=True,
        )  # fmt: skip
    try:
        up = wait_for(lambda: mounts_at(shown) > 0 or proc.poll() is not None, MOUNT_WAIT)
        assert up and proc.poll() is None, f"ctx mount did not mount: {log.read_text()}"
        yield proc
    finally:
        unmount_everything_at(shown)
        ended(proc)


def mounted_below(top: Path) -> list[Path]:
    """Every mount point below ``top``, deepest first."""
    with open("/proc/self/mountinfo") as table:
        found = {line.split()[4] for line in table}
    return sorted((Path(p) for p in found if p.startswith(f"{top}/")), key=str, reverse=True)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory of this test below the file's scratch directory, every uid may search it;
    at the end nothing is mounted below it, no process of it runs, and it is removed."""
    top = new_scratch_dir(TOP)
    try:
        yield top
    finally:
        for point in mounted_below(top):
            unmount_everything_at(point)
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def root(_template: Path, scratch: Path) -> Path:
    """A bootstrapped storage root (holding project ``proj``'s queue) in :func:`scratch`."""
    return copy_of_root(_template, scratch / "storage")


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as the test user")


# ====================================================== the storage root a command is given


def own_root(scratch: Path, user: UnprivilegedUser, *projects: str) -> Path:
    """A storage root the user bootstrapped as themselves in ``scratch/mine/storage``, with
    the queues of ``projects`` they made there."""
    mine = scratch / "mine"
    mine.mkdir()
    os.chown(mine, user.uid, user.gid)
    storage = mine / "storage"
    made = as_user(user, "bootstrap", "--storage", storage)
    assert made.rc == 0, made
    for project in projects:
        made = as_user(user, "queue", "init", "--project", project, "--storage", storage)
        assert made.rc == 0, made
    return storage


def names_alone(text: str, path: Path) -> bool:
    """Whether ``text`` names ``path`` itself, not only as the start of a longer path."""
    return re.search(rf"{re.escape(str(path))}(?![^\s:;,)'])", text) is not None


@needs_root
def test_bootstrap_of_a_root_its_owner_may_not_list_says_what_to_do(
    scratch: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """R-5, README (errors read ``ctx: ERRNO: what to do``; the error object with
    ``--json``): the user narrowed their own root to 0300 (write and search, no read), so
    bootstrap cannot list it.  EACCES, exit 1, naming the root, nothing changed, and the
    way out: the ``chmod`` that gives its owner read again."""
    storage = own_root(scratch, unprivileged_user)
    storage.chmod(0o300)
    before = snapshot(storage)
    run = as_user(unprivileged_user, "bootstrap", "--storage", storage, "--json")
    error = refused_json(run, "EACCES", 1)
    assert names_alone(error["message"], storage), run
    assert snapshot(storage) == before
    assert "chmod" in error["message"], run


@needs_root
@pytest.mark.parametrize("project", ["proj", "absent"], ids=["its project", "no such project"])
def test_queue_commands_on_a_root_its_owner_may_not_list_name_the_root(
    scratch: Path, unprivileged_user: UnprivilegedUser, project: str
) -> None:
    """R-1 (the storage root a command is given), README (``ctx: ERRNO: what to do``):
    the user's own root, holding the queue of ``proj``, narrowed to 0300.  ``ctx queue
    status`` of ``proj`` (its queue is 3770, the user's) or of a project that is not there
    is refused EACCES, exit 1, with nothing changed; the message must name the root, the
    directory that refuses, and must not give the text of another errno."""
    storage = own_root(scratch, unprivileged_user, "proj")
    storage.chmod(0o300)
    before = snapshot(storage)
    run = as_user(unprivileged_user, "queue", "status", "--project", project, "--storage", storage)
    refused(run, "EACCES", 1)
    assert snapshot(storage) == before
    assert os.strerror(errno.ENOENT) not in run.err, run
    assert names_alone(run.err, storage), run


@needs_root
@pytest.mark.parametrize("named_by", ["--storage", "XDG_DATA_HOME"])
def test_bootstrap_below_a_directory_the_user_may_not_search_names_that_directory(
    _template: Path, scratch: Path, unprivileged_user: UnprivilegedUser, named_by: str
) -> None:
    """R-1, R-5, ``ctx bootstrap --help`` (every problem names its path), README (errors say
    what to do): the user's own root lies in ``locked/own/`` where ``locked`` is root's and
    0700.  Bootstrap, given the root by ``--storage`` or as the user's default root under
    ``XDG_DATA_HOME``, cannot reach it: EACCES, exit 1, nothing changed.  It must not tell
    the user to create ``locked/own``, which exists, nor say it cannot create it."""
    locked = scratch / "locked"
    locked.mkdir(mode=0o700)
    locked.chmod(0o700)
    own = locked / "own"
    own.mkdir()
    env = clean_env(HOME="/nonexistent")
    if named_by == "--storage":
        storage = own / "storage"
        args: list = ["bootstrap", "--storage", storage]
    else:
        storage = own / "xdg" / "cortexfs" / "storage" / "current"
        storage.parent.mkdir(parents=True)
        env["XDG_DATA_HOME"] = str(own / "xdg")
        args = ["bootstrap"]
    copy_of_root(_template, storage)
    give(own, unprivileged_user)
    before = snapshot(locked)
    run = as_user(unprivileged_user, *args, env=env)
    refused(run, "EACCES", 1)
    assert snapshot(locked) == before
    assert f"cannot create {own} " not in run.err, run


@needs_root
@pytest.mark.parametrize(
    ("owner", "mode"), [(0, 0o777), (NOBODY, 0o755)], ids=["root's, mode 0777", "nobody's"]
)
def test_a_users_bootstrap_cannot_give_bin_back_says_root_must_and_root_then_does(
    scratch: Path, unprivileged_user: UnprivilegedUser, owner: int, mode: int
) -> None:
    """R-5, ``ctx bootstrap --help`` (a problem left alone is a line naming its path and a
    ``ctx: E<NAME>`` line, exit 1; a run after the cause is removed repairs the rest): the
    user's own root, whose ``bin/`` is root's and open to everyone, or nobody's.  Only root
    can give it back: the user's bootstrap says EPERM naming ``bin`` and that root must run
    it, exit 1, in text and in ``--json`` (the report, its one problem), and changes nothing,
    run after run.  Root's bootstrap then gives it back (0755, the owner's unless root's),
    and the user's next bootstrap has nothing to do."""
    storage = own_root(scratch, unprivileged_user)
    bin_dir = storage / "bin"
    os.chown(bin_dir, owner, -1)
    bin_dir.chmod(mode)
    before = snapshot(storage)

    for _ in range(2):
        run = as_user(unprivileged_user, "bootstrap", "--storage", storage)
        refused(run, "EPERM", 1)
        problems = [line for line in run.lines() if line.startswith("problem")]
        assert len(problems) == 1 and problems[0].split()[1:3] == ["bin:", "EPERM:"], run
        assert "as root" in problems[0], run
        assert snapshot(storage) == before
        assert (bin_dir.stat().st_uid, bin_dir.stat().st_mode & 0o7777) == (owner, mode)
    as_json = as_user(unprivileged_user, "bootstrap", "--storage", storage, "--json")
    assert as_json.rc == 1 and "ctx: EPERM: " in as_json.err, as_json
    report = as_json.json()
    assert [p.split(":")[0] for p in report["problems"]] == ["bin"], report
    assert report["created"] == [] and report["repaired"] == [], report
    assert snapshot(storage) == before

    repaired = ctx_run("bootstrap", "--storage", storage)
    assert repaired.rc == 0, repaired
    assert any(line.startswith("repaired  bin (") for line in repaired.lines()), repaired
    wanted_owner = 0 if owner == 0 else unprivileged_user.uid
    assert (bin_dir.stat().st_uid, bin_dir.stat().st_mode & 0o7777) == (wanted_owner, 0o755)
    again = as_user(unprivileged_user, "bootstrap", "--storage", storage)
    assert again.rc == 0 and "nothing to do" in again.out, again


def test_bootstrap_of_a_root_below_a_regular_file_is_enotdir_and_makes_nothing(
    scratch: Path,
) -> None:
    """R-5, README (``ctx: ERRNO: what to do``; the error object with ``--json``): a root
    whose path runs through a regular file cannot be made.  ENOTDIR, exit 1, naming a path
    through that file and the way out (another root: ``--storage DIR`` or
    ``CTX_STORAGE``); the file and the directory holding it are as they were."""
    notes = scratch / "notes.txt"
    notes.write_text("not a directory\n")
    storage = notes / "sub" / "storage"
    before = snapshot(scratch)
    for args in ((), ("--json",)):
        run = ctx_run("bootstrap", "--storage", storage, *args)
        if args:
            refused_json(run, "ENOTDIR", 1)
        else:
            refused(run, "ENOTDIR", 1)
            assert run.out == "", run
        assert f"{notes}/" in run.err and "--storage DIR or CTX_STORAGE" in run.err, run
        assert snapshot(scratch) == before


def test_bootstrap_through_a_link_to_nothing_on_the_way_makes_nothing_where_it_leads(
    scratch: Path,
) -> None:
    """R-5 (never destroys data, makes only the root), docs/queue.md (a link that leads
    nowhere is ENOENT naming the link, and bootstrap makes no empty root there): the root's
    path runs through ``srv -> gone/data``, and ``gone`` does not exist.  Bootstrap is
    ENOENT, exit 1, naming the root, and makes nothing: no ``gone/``, the link unchanged."""
    link = scratch / "srv"
    link.symlink_to(scratch / "gone" / "data")
    storage = link / "storage"
    before = snapshot(scratch)
    run = ctx_run("bootstrap", "--storage", storage, "--json")
    error = refused_json(run, "ENOENT", 1)
    assert str(storage) in error["message"], run
    assert snapshot(scratch) == before
    assert not (scratch / "gone").exists()


def test_a_file_named_as_the_root_is_a_usage_error_as_an_option_and_enotdir_in_ctx_storage(
    scratch: Path,
) -> None:
    """R-1, §2.4 exit statuses (doubtful: the two channels differ): a regular file named as
    the storage root.  As ``--storage`` the command line itself is refused (EINVAL, exit 2,
    the error object with ``--json``); from ``CTX_STORAGE`` it is ENOTDIR, exit 1, saying to
    move it aside or name a directory.  Either way the file is left as it was and nothing is
    made beside it."""
    notes = scratch / "notes.txt"
    notes.write_text("keep me\n")
    before = snapshot(scratch)
    option = ctx_run("bootstrap", "--storage", notes, "--json")
    refused_json(option, "EINVAL", 2)
    assert "--storage" in option.err, option
    from_env = ctx_run("bootstrap", "--json", env=clean_env(CTX_STORAGE=str(notes)))
    error = refused_json(from_env, "ENOTDIR", 1)
    assert str(notes) in error["message"] and "move it aside" in error["message"], from_env
    assert snapshot(scratch) == before


@needs_fuse
def test_a_root_named_through_a_loop_of_links_is_eloop_for_every_command(scratch: Path) -> None:
    """R-1, docs/queue.md (only the storage root may be reached through a link its
    administrator made), README (``ctx: ERRNO: what to do``): ``CTX_STORAGE`` or
    ``--storage`` naming ``a -> b -> a``.  Bootstrap, queue init, shared create, agent and
    object listings, the manual and ``ctx mount`` are each refused ELOOP, exit 1, naming the
    link and the loop; nothing is made, nothing mounted, no process left."""
    loop = scratch / "a"
    loop.symlink_to("b")
    (scratch / "b").symlink_to("a")
    point = scratch / "mp"
    point.mkdir()
    before = snapshot(scratch)
    commands = [
        ["bootstrap"],
        ["queue", "init", "--project", "proj"],
        ["shared", "create", "team"],
        ["agent", "list"],
        ["object", "list"],
        ["man", "agent"],
        ["mount", point],
    ]
    for command in commands:
        for run in (
            ctx_run(*command, env=clean_env(CTX_STORAGE=str(loop)), timeout=30),
            ctx_run(*command, "--storage", loop, timeout=30),
        ):
            refused(run, "ELOOP", 1)
            assert str(loop) in run.err and "loop" in run.err, run
    booted = ctx_run("bootstrap", "--storage", loop, "--json")
    refused_json(booted, "ELOOP", 1)
    assert snapshot(scratch) == before
    assert mounts_at(point) == 0 and processes_of(scratch) == []


@pytest.mark.parametrize("source", ["a regular file", "missing"])
def test_a_source_the_command_line_refuses_makes_no_root(scratch: Path, source: str) -> None:
    """R-5, D-1, ``ctx bootstrap --help`` (a SOURCE without the pages is refused, exit 2,
    before anything is changed), README (usage errors get the error object with ``--json``
    too): a SOURCE that is a regular file, or that does not exist, is refused on the command
    line (EINVAL, exit 2) and the root it would have made is not made."""
    given = scratch / "source-tree"
    if source == "a regular file":
        given.write_text("[project]\n")
    storage = scratch / "storage"
    for args in ((), ("--json",)):
        run = ctx_run("bootstrap", "--storage", storage, given, *args)
        if args:
            refused_json(run, "EINVAL", 2)
        else:
            refused(run, "EINVAL", 2)
        assert "SOURCE" in run.err, run
        assert not storage.exists()


# ===================================================================== ctx mount, ctx umount


@needs_fuse
def test_a_mount_point_showing_an_empty_agent_view_is_still_a_cortexfs_mount(
    root: Path, scratch: Path
) -> None:
    """F-1, ``ctx mount --help`` (MOUNTPOINT must not be already a CortexFS mount: EBUSY),
    docs/mount.md (an agent's view whose entry cannot be read is empty and stays mounted):
    agent coder's view is mounted, then its entry is renamed away, so the view lists
    nothing.  ``ctx mount`` there is still refused EBUSY, exit 1, and nothing more is
    mounted."""
    made = ctx_run(
        "agent", "create", "-", "--storage", root,
        input=json.dumps({"name": "coder", "label": "coder_t"}),
    )  # fmt: skip
    assert made.rc == 0, made
    view = scratch / "view"
    view.mkdir()
    with mounting(root, view, "--as", "coder"):
        assert set(os.listdir(view)) == ROOT_ENTRIES
        (root / "agent" / "coder").rename(root / "agent" / "coder.away")
        assert wait_for(lambda: os.listdir(view) == [], 10), os.listdir(view)
        second = subprocess.Popen(
            [*CTX_ARGV, "mount", "--storage", str(root), str(view)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=clean_env(), start_new_session=True,
        )  # fmt: skip
        try:
            wait_for(lambda: second.poll() is not None or mounts_at(view) > 1, MOUNT_WAIT)
            stacked = mounts_at(view)
        finally:
            if second.poll() is None:
                ctx_run("umount", view, timeout=30)
            status = ended(second)
        said = second.stderr.read().decode() if second.stderr else ""
        assert stacked == 1, f"a second mount at {view}"
        assert status == 1 and "ctx: EBUSY: " in said, said


@needs_fuse
def test_a_mount_point_that_is_a_link_to_nothing_is_answered_with_what_makes_it(
    root: Path, scratch: Path
) -> None:
    """F-1, docs/mount.md (a missing mount point is answered with the ``mkdir`` that makes
    it): the mount point is ``view -> nowhere``, a link to a directory that does not exist
    (the kernel would mount on ``nowhere``).  ENOENT, exit 1, nothing mounted or made; the
    answer names ``nowhere`` and the mkdir that makes it, not a mkdir of the link."""
    link = scratch / "view"
    link.symlink_to("nowhere")
    before = snapshot(scratch)
    run = ctx_run("mount", "--storage", root, link, timeout=30)
    refused(run, "ENOENT", 1)
    assert snapshot(scratch) == before and processes_of(scratch) == []
    assert "mkdir" in run.err and "nowhere" in run.err, run


@needs_fuse
def test_umount_of_a_path_through_a_loop_of_links_is_an_error_line_not_a_traceback(
    root: Path, scratch: Path
) -> None:
    """F-1, README (errors read ``ctx: ERRNO: what to do``), ``ctx umount --help`` (anything
    at MOUNTPOINT that ``ctx mount`` did not make is refused): ``a -> b -> a``, and the path
    ``a/ctx``.  ``ctx mount`` there is ELOOP, exit 1; ``ctx umount`` there is refused too,
    exit 1, with one ``ctx: ERRNO: …`` line naming the path and no traceback; nothing is
    mounted or changed."""
    (scratch / "a").symlink_to("b")
    (scratch / "b").symlink_to("a")
    point = scratch / "a" / "ctx"
    before = snapshot(scratch)
    mounted = ctx_run("mount", "--storage", root, point, timeout=30)
    refused(mounted, "ELOOP", 1)
    run = ctx_run("umount", point, timeout=30)
    assert snapshot(scratch) == before and mounted_below(scratch) == []
    assert run.rc == 1 and "Traceback" not in run.err, run
    assert run.err.startswith("ctx: E") and str(point) in run.err, run


@needs_fuse
def test_the_umount_suggested_for_a_dead_mount_above_the_mount_point_removes_it(
    root: Path, scratch: Path
) -> None:
    """F-1, docs/mount.md (``ENOTCONN``: a mount whose process died is still there, ``ctx
    umount`` removes it): the mount at ``dead`` lost its process (SIGKILL); ``ctx mount`` on
    ``dead/home`` is refused ENOTCONN, exit 1, naming the ``ctx umount`` to run.  That
    command, run as written, removes the dead mount."""
    dead = scratch / "dead"
    dead.mkdir()
    proc = subprocess.Popen(
        [*CTX_ARGV, "mount", "--storage", str(root), str(dead)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=clean_env(), start_new_session=True,
    )  # fmt: skip
    try:
        assert wait_for(lambda: mounts_at(dead) > 0 or proc.poll() is not None, MOUNT_WAIT)
        assert mounts_at(dead) == 1, "ctx mount did not mount"
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(OSError) as gone:
        os.listdir(dead)
    assert gone.value.errno == errno.ENOTCONN
    run = ctx_run("mount", "--storage", root, dead / "home", timeout=30)
    refused(run, "ENOTCONN", 1)
    suggested = re.search(r"'(ctx umount [^']+)'", run.err)
    assert suggested is not None, run
    followed = ctx_run(*shlex.split(suggested[1])[1:], timeout=30)
    assert followed.rc == 0, followed
    assert mounts_at(dead) == 0


@needs_fuse
def test_a_mount_point_reached_through_a_link_is_unmounted_by_a_relative_name(
    root: Path, scratch: Path
) -> None:
    """F-1, docs/mount.md (``ctx umount MOUNTPOINT`` finds the mount in the mount table):
    ``ctx mount`` on ``ctx -> real`` mounts at ``real``, the root's six entries shown through
    both names; ``ctx umount ctx/``, relative to the current directory with a trailing
    slash, unmounts it, and ``ctx mount`` then exits 0."""
    real = scratch / "real"
    real.mkdir()
    link = scratch / "ctx"
    link.symlink_to("real")
    with mounting(root, link, shown_at=real) as proc:
        assert set(os.listdir(real)) == ROOT_ENTRIES == set(os.listdir(link))
        gone = ctx_run("umount", "ctx/", cwd=scratch, timeout=30)
        assert gone.rc == 0, gone
        assert ended(proc) == 0
        assert mounts_at(real) == 0 and os.listdir(real) == []
    assert link.is_symlink() and os.readlink(link) == "real"


@needs_fuse
def test_a_root_whose_tool_is_a_file_is_mounted_once_the_advice_is_followed(
    root: Path, scratch: Path
) -> None:
    """F-1, R-2, R-5, docs/mount.md (a directory that is no storage root is EINVAL): the
    root's ``tool`` is a regular file.  ``ctx mount`` is EINVAL, exit 1, naming ``ctx
    bootstrap``; bootstrap then reports ``tool`` in the way (ENOTDIR, exit 1) and leaves the
    file; moved aside, bootstrap makes the root whole (exit 0) and the mount shows the six."""
    shutil.rmtree(root / "tool")
    (root / "tool").write_text("someone's notes\n")
    point = scratch / "mp"
    point.mkdir()
    mounted = ctx_run("mount", "--storage", root, point, timeout=30)
    refused(mounted, "EINVAL", 1)
    assert "ctx bootstrap" in mounted.err, mounted
    assert mounts_at(point) == 0 and processes_of(scratch) == []
    booted = ctx_run("bootstrap", "--storage", root)
    refused(booted, "ENOTDIR", 1)
    assert any(line.startswith("problem   tool: ") for line in booted.lines()), booted
    assert (root / "tool").read_text() == "someone's notes\n"
    (root / "tool").rename(scratch / "tool.aside")
    assert ctx_run("bootstrap", "--storage", root).rc == 0
    with mounting(root, point):
        assert set(os.listdir(point)) == ROOT_ENTRIES
        assert (point / "tool" / "fs.read").is_file()


@needs_fuse
@pytest.mark.parametrize(
    "words",
    [
        pytest.param(["--as", "../x"], id="an --as that is no object name"),
        pytest.param(["--as", ""], id="an empty --as"),
        pytest.param(["--storage", "{other}"], id="--storage before and after for two roots"),
    ],
)
def test_mount_command_lines_that_are_malformed_are_exit_2_and_mount_nothing(
    root: Path, scratch: Path, words: list[str]
) -> None:
    """F-1, §2.4 (2 usage error), ``ctx --help`` (``--storage`` given before and after the
    command must name the same root, else EINVAL, exit 2), R-3 (an illegal name is
    EINVAL): each malformed ``ctx mount`` is EINVAL, exit 2, and nothing is mounted."""
    point = scratch / "mp"
    point.mkdir()
    other = scratch / "other"
    other.mkdir()
    before = snapshot(scratch)
    args = [word.format(other=other) for word in words]
    run = ctx_run("--storage", root, "mount", *args, point, timeout=30)
    refused(run, "EINVAL", 2)
    assert mounts_at(point) == 0 and processes_of(scratch) == []
    assert snapshot(scratch) == before


@needs_fuse
def test_umount_refuses_a_tmpfs_over_a_live_mount_and_unmounts_it_once_uncovered(
    root: Path, scratch: Path
) -> None:
    """F-1, docs/mount.md (``ctx umount`` unmounts only what ``ctx mount`` made; anything
    else is EINVAL): a tmpfs mounted over a live mount is what the path shows, so ``ctx
    umount`` refuses it (EINVAL, exit 1, naming tmpfs and umount(8)) and both stay; once the
    tmpfs is unmounted by hand, ``ctx umount`` removes the CortexFS mount and ``ctx mount``
    exits 0."""
    point = scratch / "mp"
    point.mkdir()
    with mounting(root, point) as proc:
        covered = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(point)], capture_output=True
        )
        if covered.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {covered.stderr.decode().strip()}")
        run = ctx_run("umount", point, timeout=30)
        refused(run, "EINVAL", 1)
        assert "tmpfs" in run.err and "umount(8)" in run.err, run
        assert mounts_at(point) == 2 and proc.poll() is None
        subprocess.run(["umount", str(point)], check=True)
        assert set(os.listdir(point)) == ROOT_ENTRIES
        gone = ctx_run("umount", point, timeout=30)
        assert gone.rc == 0, gone
        assert ended(proc) == 0 and mounts_at(point) == 0


@needs_fuse
def test_paths_longer_than_path_max_are_enametoolong_for_mount(root: Path, scratch: Path) -> None:
    """F-1, R-1 (a root path the kernel refuses in every call: nothing made), README (errors
    say what to do): a mount point, and a storage root, whose path is longer than PATH_MAX.
    Each is ENAMETOOLONG, exit 1; nothing is mounted and nothing is made."""
    point = scratch / "mp"
    point.mkdir()
    too_long = scratch / "/".join(["d" * 200] * 21)
    assert len(os.fsencode(too_long)) > PATH_MAX
    before = snapshot(scratch)
    far_point = ctx_run("mount", "--storage", root, too_long, timeout=30)
    refused(far_point, "ENAMETOOLONG", 1)
    assert "mount point" in far_point.err, far_point
    far_root = ctx_run("mount", "--storage", too_long, point, timeout=30)
    refused(far_root, "ENAMETOOLONG", 1)
    assert "--storage DIR or CTX_STORAGE" in far_root.err, far_root
    assert snapshot(scratch) == before
    assert mounts_at(point) == 0 and processes_of(scratch) == []


# ============================================================= through a live mount, refused


class Served:
    """One storage root of this module mounted (the host's view) while the module runs, with
    ``home/f`` (a file) and ``home/d`` (a directory) made on the root beforehand."""

    def __init__(self, storage: Path, point: Path, proc: subprocess.Popen) -> None:
        self.storage, self.point, self.proc = storage, point, proc

    def served(self) -> bool:
        return mounts_at(self.point) == 1 and self.proc.poll() is None


@pytest.fixture(scope="module")
def served(_template: Path) -> Iterator[Served]:
    if not os.path.exists("/dev/fuse"):
        pytest.skip("needs /dev/fuse")
    top = new_scratch_dir(TOP, "served-")
    try:
        storage = copy_of_root(_template, top / "storage")
        (storage / "home" / "f").write_text("kept\n")
        (storage / "home" / "d").mkdir()
        point = top / "host"
        point.mkdir()
        with mounting(storage, point) as proc:
            yield Served(storage, point, proc)
    finally:
        for left in mounted_below(top):
            unmount_everything_at(left)
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


ATTEMPT = r"""
import ctypes, errno, os, stat, sys
root = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
def renameat2(old, new, flags):
    if libc.renameat2(-100, old.encode(), -100, new.encode(), flags) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))
try:
    {body}
    print("ok")
except OSError as failed:
    print(failed.errno)
"""

REFUSED_THROUGH_THE_MOUNT = [
    ("a file created at the root is EACCES", errno.EACCES,
     "os.close(os.open(root + '/extra', os.O_CREAT | os.O_WRONLY, 0o644))"),
    ("a second name made at the root is EACCES", errno.EACCES,
     "os.link(root + '/home/f', root + '/extra')"),
    ("a file renamed to the root is EACCES", errno.EACCES,
     "os.rename(root + '/home/f', root + '/extra')"),
    ("a directory exchanged with a root entry is EPERM", errno.EPERM,
     "renameat2(root + '/home/d', root + '/model', 2)"),
    ("two root entries exchanged is EPERM", errno.EPERM,
     "renameat2(root + '/home', root + '/model', 2)"),
    ("an extended attribute set is EOPNOTSUPP", errno.EOPNOTSUPP,
     "os.setxattr(root + '/home/f', 'user.note', b'1')"),
    ("extended attributes listed is EOPNOTSUPP", errno.EOPNOTSUPP,
     "os.listxattr(root + '/home/f')"),
    ("a regular file made by mknod is ENOSYS", errno.ENOSYS,
     "os.mknod(root + '/home/n', stat.S_IFREG | 0o644)"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("wanted", "body"), [pytest.param(w, b, id=i) for i, w, b in REFUSED_THROUGH_THE_MOUNT]
)
def test_a_change_the_mount_refuses_changes_nothing_and_the_mount_serves_on(
    served: Served, wanted: int, body: str
) -> None:
    """R-2, F-1, docs/mount.md (*What each view shows*: nothing else is made at the root,
    EACCES; none of the six is removed, renamed away or replaced, EPERM; *Not provided*:
    symbolic links and device nodes, ENOSYS, nor extended attributes): each of these
    syscalls through the host's view gets its errno (extended attributes: the kernel's
    EOPNOTSUPP for an operation the daemon does not provide), the storage root is exactly
    as it was, and the mount still serves the six entries."""
    before = snapshot(served.storage)
    done = subprocess.run(
        [PYTHON, "-c", ATTEMPT.format(body=body), str(served.point)],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == str(wanted), done
    assert snapshot(served.storage) == before
    assert served.served() and set(os.listdir(served.point)) == ROOT_ENTRIES


def test_umount_of_a_name_inside_a_live_mount_is_einval_and_leaves_it_served(
    served: Served,
) -> None:
    """F-1, ``ctx umount --help`` (anything at MOUNTPOINT that ``ctx mount`` did not make is
    refused, EINVAL): a directory and a file inside the live mount are no mount point.
    Each is EINVAL, exit 1, naming it; the mount is still served, the root unchanged."""
    before = snapshot(served.storage)
    for inside in (served.point / "tool", served.point / "home" / "f"):
        run = ctx_run("umount", inside, timeout=30)
        refused(run, "EINVAL", 1)
        assert str(inside) in run.err, run
        assert served.served()
    assert snapshot(served.storage) == before


@needs_root
def test_umount_without_a_mountpoint_as_a_user_leaves_roots_mount_alone(
    served: Served, unprivileged_user: UnprivilegedUser
) -> None:
    """F-1, docs/mount.md (``ctx umount`` without MOUNTPOINT unmounts the one storage root
    mounted by the caller; none is ENOENT, exit 1): root's mount is live, the user has
    none, so the user's ``ctx umount`` is ENOENT and root's mount is still served."""
    run = as_user(unprivileged_user, "umount")
    refused(run, "ENOENT", 1)
    assert served.served()
