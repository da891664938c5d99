"""The error branches of the storage root a command is given and of ``ctx bootstrap``'s repairs,
each reached from outside through the installed commands, and judged by SPEC, the docs and the
help texts.

The angle: a storage root in an odd state, met by ``ctx bootstrap`` (and by ``ctx man`` and the
commands that first resolve the root).  The root named through a link to nothing; a user's
default root below a home that does not exist; a root to be made on a read-only filesystem;
a filesystem that runs out of inodes while the root's own directories are made; a root named
through a link another uid made; ``tool/tsh.d`` a regular file; ``bin/`` immutable; ``tool/``
append-only; a commit marker of an install that is a directory or a FIFO; a space's install
lock held by another process; a root root bootstrapped for a user, repaired by that user; the
manual bundle given to a third uid, its ``man/`` a file or a link, a page made immutable, or
the disk too full (or the file-size limit too low) for its pages; SOURCE trees of another
version; an agent entry of ``ctx agent create``'s shape whose root literal is no string.

Each flow checks the documented exit status, the errno word of the ``ctx: ERRNO: …`` line
(and of the ``--json`` error or report), that the message names what is at fault and what to
do where the docs promise it, and that nothing is left half-done: nothing made that is not
reported, no staging or temporary name left, what is in the way kept byte for byte, and a
later run (once the cause is gone) completing the root.

SPEC ids: §1 R-1 (the storage root chosen), R-2 (the six entries), R-5 (``ctx bootstrap
[SOURCE]`` creates or repairs, idempotent, never destroys data), §6 T-1/T-8 (tool pairs and
their installs), §7 H-1/H-4 (``bin/tsh``, ``tool/tsh.d/config``), §8 A-3 (agent entries),
§12 D-1 (the manual bundle and SOURCE).  Docs: README (*The queue in five commands*: exit
statuses, ``ctx: ERRNO: what to do``, the ``--json`` error object; *Upgrading*), the manual
page ``ctx.root-abi``, and the ``--help`` texts of ``ctx bootstrap`` and ``ctx man``."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MAN_PAGES,
    ROOT_ENTRIES,
    Run,
    clean_env,
    ctx_run,
    limited,
    new_scratch_dir,
    scratch_top,
    snapshot,
)
from tests.support.scratch_mounts import ScratchMounts
from tests.support.storage import attribute, copy_of_root
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

TOP = scratch_top(__file__)
BUNDLE = Path("shared") / "cortexfs-docs"
COMPLETE = "nothing to do: the storage root is complete"
NOBODY = 65534
LOCK = ".install-lock"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (other uids, mounts)")


# ======================================================================= common steps


def on(root: Path, **extra: str) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(root), **extra)


def boot(root: Path, *args: str | os.PathLike) -> Run:
    return ctx_run("bootstrap", "--storage", root, *args)


def refused(run: Run, errno_name: str, status: int = 1) -> str:
    """``run`` ended with ``status`` and one ``ctx: ERRNO: …`` line on standard error, without
    a traceback; the text of that line after ``ctx: ERRNO: ``."""
    assert run.rc == status, run
    assert "Traceback" not in run.err, run
    lines = [line for line in run.err.splitlines() if line.startswith("ctx: ")]
    assert len(lines) == 1 and lines[0].startswith(f"ctx: {errno_name}: "), run
    return lines[0][len(f"ctx: {errno_name}: ") :]


def json_error(run: Run, errno_name: str) -> dict:
    """The ``--json`` answer of ``run``: the error's word and number beside whatever else."""
    answer = run.json()
    assert answer["error"] == errno_name, run
    assert answer["errno"] == getattr(errno, errno_name), run
    assert answer["message"] in run.err, run
    return answer


def problems(run: Run) -> list[str]:
    """The ``problem`` lines of a text-mode bootstrap, without the word ``problem``."""
    return [line.split(None, 1)[1] for line in run.lines() if line.startswith("problem ")]


def hidden(directory: Path) -> set[str]:
    """The dot-names of ``directory`` other than its install lock: what an install stages."""
    return {name for name in os.listdir(directory) if name.startswith(".") and name != LOCK}


def as_user(user: UnprivilegedUser, *args, env: dict[str, str] | None = None) -> Run:
    """``ctx ARGS`` as ``user`` (its own group alone), in ``/``."""
    done = subprocess.run(
        [*CTX_ARGV, *map(str, args)],
        input=b"",
        capture_output=True,
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        env=env if env is not None else clean_env(HOME="/nonexistent"),
        cwd="/",
        timeout=120,
    )
    return Run(
        [str(a) for a in args],
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


def give(path: Path, uid: int, gid: int) -> None:
    """``chown -R`` of ``path``, links not followed."""
    os.chown(path, uid, gid, follow_symlinks=False)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            os.chown(Path(dirpath, name), uid, gid, follow_symlinks=False)


def stale(page: Path, text: str = "# a page of another release\n") -> None:
    """Rewrite an installed (read-only) page with other text."""
    page.chmod(0o644)
    page.write_text(text)
    page.chmod(0o444)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory every uid may search, below this file's scratch directory."""
    top = new_scratch_dir(TOP)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def mounts() -> Iterator[ScratchMounts]:
    """Filesystems a test mounts below a scratch directory of its own (unmounted after)."""
    made = ScratchMounts(new_scratch_dir(TOP, "m"))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def user_root(_template: Path, scratch: Path, unprivileged_user: UnprivilegedUser) -> Path:
    """A copy of the bootstrapped root that the test user owns whole (its own root)."""
    root = copy_of_root(_template, scratch / "storage")
    give(root, unprivileged_user.uid, unprivileged_user.gid)
    return root


# ================================================= the storage root a command is given


def test_a_root_named_through_a_link_to_nothing_is_enoent_and_nothing_is_made_there(
    scratch: Path,
) -> None:
    """R-1, README (``ctx: ERRNO: what to do``, the ``--json`` error object): ``CTX_STORAGE``
    names ``current -> release-2``, and ``release-2`` was moved away.  Bootstrap, queue init,
    shared create and ``ctx man TOPIC`` are each ENOENT, exit 1, naming the link and where it
    leads and saying to point the link at the root; no root is made where it leads.
    (Doubtful: ``ctx man`` refuses rather than show its built-in copy, as it does for a root
    that does not exist.)"""
    link = scratch / "current"
    link.symlink_to(scratch / "release-2")
    before = snapshot(scratch)
    commands = [
        ["bootstrap"],
        ["queue", "init", "--project", "proj"],
        ["shared", "create", "team"],
        ["man", "agent"],
    ]
    for command in commands:
        for args in ((), ("--json",)):
            run = ctx_run(*command, *args, env=on(link))
            said = refused(run, "ENOENT")
            assert said.startswith(f"storage root {link} is a symbolic link to "), run
            assert f"{scratch / 'release-2'}, which does not exist" in said, run
            assert "point the link at the storage root" in said, run
            if args:
                json_error(run, "ENOENT")
            else:
                assert run.out == "", run
    assert snapshot(scratch) == before
    assert not (scratch / "release-2").exists()


@needs_root
def test_a_users_default_root_below_a_home_that_does_not_exist_is_eacces_naming_it(
    unprivileged_user: UnprivilegedUser,
) -> None:
    """R-1 ([decision] a non-root user's default root is ``$XDG_DATA_HOME/cortexfs/storage/
    current``, ``~/.local/share/…`` without it), ctx.root-abi ("Choosing the storage root"):
    the test user, with neither HOME nor XDG_DATA_HOME set, has the home of the password
    database, which does not exist and which they may not make.  Bootstrap is EACCES, exit
    1, naming that default root and the directory it could not make, and makes nothing;
    ``ctx man agent`` still prints the built-in page, its note naming the same root."""
    home = Path(pwd.getpwuid(unprivileged_user.uid).pw_dir)
    if os.path.lexists(home) or home == Path("/"):
        pytest.skip(f"the test user's home {home} exists here")
    default = home / ".local" / "share" / "cortexfs" / "storage" / "current"
    env = {k: v for k, v in clean_env().items() if k not in ("HOME", "XDG_DATA_HOME")}
    for args in ((), ("--json",)):
        run = as_user(unprivileged_user, "bootstrap", *args, env=env)
        said = refused(run, "EACCES")
        assert said.startswith(f"cannot create {home} for the storage root {default}: "), run
        assert "--storage DIR or CTX_STORAGE" in said, run
        if args:
            json_error(run, "EACCES")
        assert not os.path.lexists(home)
    page = as_user(unprivileged_user, "man", "agent", env=env)
    assert page.rc == 0 and page.out.startswith("# ctx.agent"), page
    assert f"no page is installed at {default}/shared/cortexfs-docs/man/ctx.agent.md" in page.err
    assert "this is the copy built into ctx" in page.err, page


@needs_root
@pytest.mark.parametrize("path", ["s", "a/b/s"], ids=["the root itself", "directories above it"])
def test_a_root_to_be_made_on_a_read_only_filesystem_is_erofs_and_makes_nothing(
    mounts: ScratchMounts, path: str
) -> None:
    """R-5, README (``ctx: ERRNO: what to do``): a root whose path (and the directories above
    it) is still to be made on a filesystem mounted read-only.  EROFS, exit 1, naming the
    first directory it could not make and the root, with the way out (another root:
    ``--storage DIR or CTX_STORAGE``); the ``--json`` error says the same; nothing is made.
    (Doubtful: it also says "create it yourself", which nobody can on that filesystem.)"""
    disk = mounts.tmpfs("ro", "ro,size=1m,mode=0755")
    root = disk / path
    first = disk / path.split("/")[0]
    for args in ((), ("--json",)):
        run = boot(root, *args)
        said = refused(run, "EROFS")
        assert said.startswith(f"cannot create {first} for the storage root {root}: "), run
        assert "--storage DIR or CTX_STORAGE" in said, run
        if args:
            json_error(run, "EROFS")
        assert os.listdir(disk) == []


@needs_root
@pytest.mark.parametrize("made_by", ["the directory's owner", "a third uid"])
def test_a_root_named_through_a_link_is_bootstrapped_only_when_its_administrator_made_it(
    scratch: Path, unprivileged_user: UnprivilegedUser, made_by: str
) -> None:
    """R-1, R-5, ``storage/current`` links: root's bootstrap through a link the test user made
    to the user's own directory makes the six entries there, the user's; through a link the
    user made to a directory of nobody's it is EPERM, exit 1, naming the link and both uids
    and saying to name the directory itself, and nothing is made in it (text and
    ``--json``)."""
    target = scratch / "release"
    target.mkdir(mode=0o755)
    owner = unprivileged_user.uid if made_by == "the directory's owner" else NOBODY
    os.chown(target, owner, owner)
    link = scratch / "current"
    link.symlink_to(target)
    os.lchown(link, unprivileged_user.uid, unprivileged_user.gid)
    if owner == NOBODY:
        for args in ((), ("--json",)):
            run = boot(link, *args)
            said = refused(run, "EPERM")
            assert said.startswith(
                f"storage root {link} is a symbolic link of uid {unprivileged_user.uid} to a "
                f"directory of uid {NOBODY}"
            ), run
            assert "name the directory itself" in said, run
            if args:
                json_error(run, "EPERM")
            assert os.listdir(target) == []
        return
    run = boot(link, "--json")
    assert run.rc == 0, run
    assert run.json()["problems"] == [], run
    assert set(os.listdir(target)) == ROOT_ENTRIES
    assert {(target / name).stat().st_uid for name in ROOT_ENTRIES} == {owner}


# ======================================================== the root's own directories


@needs_root
@pytest.mark.parametrize(
    ("inodes", "path"),
    [(6, "s"), (4, "a/b/c/s")],
    ids=["the six entries", "the directories above the root"],
)
def test_running_out_of_inodes_while_making_the_roots_directories_says_what_was_made(
    mounts: ScratchMounts, inodes: int, path: str
) -> None:
    """R-5, ``ctx bootstrap --help`` (prints what was created and every problem it left
    alone — a full disk among them — each naming its path; ends with the ``ctx: E<NAME>``
    line, exit 1): a tmpfs with a handful of inodes, so that some of the root's own
    directories are made and the next is refused ENOSPC.  What was made is named, and the
    error names the storage root (not a bare ``home``)."""
    disk = mounts.tmpfs("few", f"size=4m,nr_inodes={inodes},mode=0755")
    root = disk / path
    run = boot(root)
    said = refused(run, "ENOSPC")
    made = [Path(dirpath, name) for dirpath, dirnames, _ in os.walk(disk) for name in dirnames]
    assert made, "the tmpfs took no directory at all"
    assert str(root) in said, run
    for directory in made:
        inside = directory != root and directory.is_relative_to(root)
        shown = directory.relative_to(root) if inside else directory
        assert f"created   {shown}" in run.lines(), (directory, run)


def test_a_regular_file_at_tool_tsh_d_is_kept_and_named_until_moved_away(
    storage: Path, tmp_path: Path
) -> None:
    """R-5, H-4 (``tool/tsh.d/config`` is made by bootstrap), ``ctx bootstrap --help``:
    ``tool/tsh.d`` is someone's regular file.  Bootstrap keeps it byte for byte and names it
    (problems, EEXIST, exit 1, in text and ``--json``) and leaves ``tool/tsh`` as it is;
    moved away, the next bootstrap makes ``tsh.d/config`` with the H-4 keys.  (Doubtful:
    the one file is two problems, ``is a file, not a control directory`` and ``is not a
    directory``.)"""
    controls = storage / "tool" / "tsh.d"
    shutil.rmtree(controls)
    controls.write_text("a note someone keeps here\n")
    tsh = (storage / "tool" / "tsh").read_bytes()
    run = boot(storage)
    said = refused(run, "EEXIST")
    assert "tool/tsh.d is a file, not a control directory; left untouched" in said, run
    assert problems(run)[0] == "tool/tsh.d is a file, not a control directory; left untouched"
    assert all(p.startswith("tool/tsh.d ") for p in problems(run)), run
    report = boot(storage, "--json")
    assert report.rc == 1 and report.json()["problems"] == problems(run), report
    json_error(report, "EEXIST")
    assert controls.read_text() == "a note someone keeps here\n"
    assert (storage / "tool" / "tsh").read_bytes() == tsh

    controls.rename(tmp_path / "tsh.d-note")
    fixed = boot(storage)
    assert fixed.rc == 0, fixed
    config = (controls / "config").read_text()
    assert {"max_loaded_tools", "cache_capacity", "window_percent"} <= {
        line.split("=")[0] for line in config.splitlines() if "=" in line
    }, config
    assert (tmp_path / "tsh.d-note").read_text() == "a note someone keeps here\n"


@needs_root
def test_an_immutable_bin_is_named_for_each_program_it_keeps_out_then_repaired(
    storage: Path,
) -> None:
    """R-5, H-1 (``bin/tsh``), ``ctx bootstrap --help``: ``bin/tsh`` removed and ``bin/``
    made immutable.  Bootstrap cannot put it back: a problem naming ``bin/tsh``, EPERM,
    exit 1, nothing else put in ``bin/`` and no temporary name left; once the attribute is
    lifted the next bootstrap makes ``bin/tsh`` (created).  (Doubtful: the line names a
    temporary file that no longer exists, not the attribute and the ``chattr -i`` that
    lifts it, as the same refusal in ``tool/`` does.)"""
    bin_dir = storage / "bin"
    (bin_dir / "tsh").unlink()
    before = snapshot(bin_dir)
    with attribute(bin_dir, "i"):
        run = boot(storage)
        refused(run, "EPERM")
        assert [p.split(":")[0] for p in problems(run)] == ["bin/tsh"], run
        assert snapshot(bin_dir) == before
    fixed = boot(storage)
    assert fixed.rc == 0 and "created   bin/tsh" in fixed.lines(), fixed
    assert set(os.listdir(bin_dir)) == {"ctxterm", "tsh"}


# ============================================ core tools and interrupted installs (T-8, R-5)


@needs_root
def test_an_append_only_tool_directory_leaves_named_staging_that_the_next_run_removes(
    storage: Path,
) -> None:
    """R-5, T-8 (an install that fails settles its own attempt; what it cannot remove is
    named with what removes it), ``ctx bootstrap --help``: ``tool/fs.read`` removed and
    ``tool/`` made append-only.  Bootstrap is EPERM, exit 1: the ``tool/fs.read`` problem
    says ``tool/`` is append-only with the ``chattr -a`` that lifts it and names the staged
    names it left; a second run adds no more.  Lifted, the next run removes them (saying
    so), installs ``fs.read``, and leaves no hidden name."""
    tool = storage / "tool"
    (tool / "fs.read").unlink()
    with attribute(tool, "a"):
        first = boot(storage)
        refused(first, "EPERM")
        [line] = [p for p in problems(first) if p.startswith("tool/fs.read:")]
        assert "append-only" in line and f"'chattr -a {tool}'" in line, first
        left = hidden(tool)
        assert left and all(f"{tool}/{name}" in line for name in left), (left, first)
        second = boot(storage)
        refused(second, "EPERM")
        assert hidden(tool) == left
    fixed = boot(storage)
    assert fixed.rc == 0, fixed
    assert "created   tool/fs.read" in fixed.lines(), fixed
    assert "removed what an interrupted install left behind" in fixed.out, fixed
    assert hidden(tool) == set()


@pytest.mark.parametrize("kind", ["directory", "FIFO"])
def test_a_commit_marker_that_is_no_regular_file_is_kept_named_and_blocks_the_tier(
    storage: Path, tmp_path: Path, kind: str
) -> None:
    """T-8 (``.<name>~commit``, the commit marker of an install), R-5: at ``tool/
    .fs.read~commit`` stands a directory holding someone's file, or a FIFO, and
    ``tool/fs.read`` is missing.  Bootstrap keeps it as it is and names it (a ``tool:``
    problem, EISDIR for the directory, EINVAL for the FIFO, exit 1, in text and ``--json``);
    no core tool is installed into ``tool/`` meanwhile (the ``tool/fs.read`` problem says
    why).  Moved away, the next bootstrap installs ``fs.read``.  (Doubtful: a FIFO holds no
    one's data, yet it is not replaced as bootstrap replaces stand-ins elsewhere.)"""
    tool = storage / "tool"
    (tool / "fs.read").unlink()
    marker = tool / ".fs.read~commit"
    if kind == "directory":
        marker.mkdir()
        (marker / "keep.txt").write_text("mine\n")
        word = "EISDIR"
    else:
        os.mkfifo(marker)
        word = "EINVAL"
    run = boot(storage, "--json")
    refused(run, word)
    report = json_error(run, word)
    assert (
        report["problems"][0].startswith("tool: ") and ".fs.read~commit" in report["problems"][0]
    ), report
    assert any(
        p.startswith(f"tool/fs.read: {word}: cannot install {tool}/fs.read")
        for p in report["problems"]
    ), report
    assert not (tool / "fs.read").exists()
    if kind == "directory":
        assert (marker / "keep.txt").read_text() == "mine\n"
    else:
        assert stat.S_ISFIFO(marker.lstat().st_mode)
    marker.rename(tmp_path / "moved")
    fixed = boot(storage)
    assert fixed.rc == 0 and "created   tool/fs.read" in fixed.lines(), fixed


def test_a_spaces_install_lock_held_past_ten_seconds_is_eagain_and_the_rest_is_repaired(
    storage: Path,
) -> None:
    """R-5, ``ctx bootstrap --help`` (a user's or a space's tier is waited for at most 10 s;
    another process holding its ``.install-lock`` longer is a problem naming its pid):
    this test process holds ``shared/team/tool/.install-lock``, and ``tool/fs.read`` is
    missing.  Bootstrap installs ``fs.read`` all the same, then names the space's tier:
    EAGAIN, exit 1, the lock file, this pid and the 10 s.  Let go, the next run is clean."""
    made = ctx_run("shared", "create", "team", env=on(storage))
    assert made.rc == 0, made
    (storage / "tool" / "fs.read").unlink()
    lock = storage / "shared" / "team" / "tool" / LOCK
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        run = boot(storage)
    finally:
        os.close(fd)
    refused(run, "EAGAIN")
    assert "created   tool/fs.read" in run.lines(), run
    [line] = problems(run)
    assert line.startswith("shared/team/tool: EAGAIN: "), run
    assert f"{lock} is locked by another process (pid {os.getpid()}), still after 10 s" in line
    assert (storage / "tool" / "fs.read").is_file()
    assert boot(storage).rc == 0


@needs_root
def test_a_root_root_bootstrapped_for_a_user_is_repaired_by_root_not_by_that_user(
    scratch: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """R-5, README *Upgrading*, ``ctx bootstrap --help``: root bootstraps an empty directory
    the test user owns (the six entries become the user's, the core tools stay root's).
    The user removes ``tool/fs.read`` and runs bootstrap: it cannot carry root's controls
    over into a new version (EPERM, exit 1, the problem naming ``tool/fs.read`` and that
    nothing was installed), leaves no staging, and changes nothing else.  Root's bootstrap
    then installs it, and the user's next bootstrap has nothing to do.  (Doubtful: the
    message says only "(at policy)" and "correct that", not that root must run it.)"""
    root = scratch / "theirs"
    root.mkdir(mode=0o755)
    os.chown(root, unprivileged_user.uid, unprivileged_user.gid)
    assert boot(root).rc == 0
    assert (root / "tool").stat().st_uid == unprivileged_user.uid
    assert (root / "tool" / "fs.read").stat().st_uid == 0
    removed = subprocess.run(
        ["rm", str(root / "tool" / "fs.read")], user=unprivileged_user.uid, capture_output=True
    )
    assert removed.returncode == 0, removed
    before = snapshot(root)
    run = as_user(unprivileged_user, "bootstrap", "--storage", root)
    refused(run, "EPERM")
    [line] = problems(run)
    assert line.startswith(f"tool/fs.read: EPERM: cannot install {root}/tool/fs.read: "), run
    assert "nothing was installed and nothing of this attempt is left" in line, run
    assert hidden(root / "tool") == set()
    assert {k: v for k, v in snapshot(root).items() if LOCK not in k} == {
        k: v for k, v in before.items() if LOCK not in k
    }
    by_root = boot(root)
    assert by_root.rc == 0 and "created   tool/fs.read" in by_root.lines(), by_root
    again = as_user(unprivileged_user, "bootstrap", "--storage", root)
    assert again.rc == 0 and COMPLETE in again.out, again


# ======================================================= the manual bundle (D-1, X-2, R-5)


@needs_root
def test_one_page_bootstrap_cannot_replace_does_not_keep_it_from_the_others(
    storage: Path,
) -> None:
    """R-5 (repairs what it can), D-1 (a stale bundle is rebuilt by bootstrap), the final
    line of a bootstrap with problems ("what it could make is made … run 'ctx bootstrap'
    again, which repairs the rest"): ``ctx.agent.md`` is stale and immutable, and
    ``ctx.provider.md`` was removed.  Bootstrap is EPERM, exit 1, for the first, and puts
    the second back."""
    man = storage / BUNDLE / "man"
    stale(man / MAN_PAGES["agent"])
    (man / MAN_PAGES["provider"]).unlink()
    with attribute(man / MAN_PAGES["agent"], "i"):
        run = boot(storage)
        said = refused(run, "EPERM")
        assert "what it could make is made" in said, run
        assert (man / MAN_PAGES["provider"]).is_file(), run
        assert f"created   {BUNDLE}/man/{MAN_PAGES['provider']}" in run.lines(), run


@pytest.mark.parametrize("cause", ["full disk", "file-size limit", "immutable page"])
def test_a_page_bootstrap_cannot_write_is_a_problem_naming_that_page(
    storage: Path, mounts: ScratchMounts, cause: str
) -> None:
    """R-5, D-1, ``ctx bootstrap --help`` ("every problem it left alone (…, a full disk, …),
    each naming its path"): the manual's pages cannot be written — a tmpfs too small for
    them, a file-size limit of 64 bytes, or the stale ``ctx.agent.md`` made immutable.
    Bootstrap exits 1 with the errno of the first problem, and each problem line begins
    with a path of the root; the page is named."""
    if cause == "full disk":
        if os.geteuid() != 0:
            pytest.skip("needs root to mount a tmpfs")
        root = mounts.tmpfs("small", "size=16k,mode=0755") / "s"
        run = boot(root)
        word = "ENOSPC"
    elif cause == "file-size limit":
        root = storage.parent / "fresh"
        run = limited(clean_env(), "bootstrap", "--storage", root, fsize=64, sigxfsz=signal.SIG_IGN)
        word = "EFBIG"
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root for chattr")
        root = storage
        stale(root / BUNDLE / "man" / MAN_PAGES["agent"])
        with attribute(root / BUNDLE / "man" / MAN_PAGES["agent"], "i"):
            run = boot(root)
        word = "EPERM"
    refused(run, word)
    found = problems(run)
    assert found, run
    assert any(f"{BUNDLE}/" in line for line in found), run
    for line in found:
        assert line.split("/")[0].split(":")[0] in ROOT_ENTRIES, (line, run)


@needs_root
def test_a_users_bootstrap_meeting_a_bundle_of_a_third_uid_says_root_must_and_root_does(
    user_root: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """R-5, X-2 (the bundle is the system's), ``ctx bootstrap --help``: in the test user's
    own root, ``shared/cortexfs-docs`` belongs to nobody.  The user's bootstrap writes no page
    there: EPERM, exit 1, one problem naming the bundle, its owner and that root must run
    bootstrap; the bundle unchanged.  Root's bootstrap gives it back to the root's owner
    (``repaired`` with the owners), and the user's next bootstrap has nothing to do."""
    bundle = user_root / BUNDLE
    os.chown(bundle, NOBODY, NOBODY)
    stale(bundle / "man" / MAN_PAGES["tool"])
    os.chown(bundle / "man" / MAN_PAGES["tool"], unprivileged_user.uid, unprivileged_user.gid)
    before = snapshot(bundle)
    run = as_user(unprivileged_user, "bootstrap", "--storage", user_root)
    said = refused(run, "EPERM")
    [line] = problems(run)
    assert f"EPERM: {BUNDLE} belongs to uid {NOBODY}" in line, run
    assert f"'ctx bootstrap --storage {user_root}' as root" in line, run
    assert "bootstrap of" in said and snapshot(bundle) == before
    by_root = boot(user_root)
    assert by_root.rc == 0, by_root
    assert (
        f"repaired  {BUNDLE} (owner uid {NOBODY}, now uid {unprivileged_user.uid})"
        in by_root.lines()
    ), by_root
    assert f"repaired  {BUNDLE}/man/{MAN_PAGES['tool']}" in by_root.lines(), by_root
    again = as_user(unprivileged_user, "bootstrap", "--storage", user_root)
    assert again.rc == 0 and COMPLETE in again.out, again


def test_a_regular_file_at_the_bundles_man_is_kept_and_ctx_man_says_why_it_is_built_in(
    storage: Path,
) -> None:
    """D-1, R-5, ``ctx man --help`` (an installed page read, else the built-in copy with a
    note on stderr): ``shared/cortexfs-docs/man`` is someone's file and the README was
    removed.  Bootstrap puts the README back, keeps the file byte for byte and names it
    (one problem, EEXIST, exit 1, ``--json`` report and error); ``ctx man tool`` prints the
    built-in page, its note naming the page it could not read."""
    man = storage / BUNDLE / "man"
    shutil.rmtree(man)
    man.write_text("my own notes\n")
    (storage / BUNDLE / "README.md").unlink()
    run = boot(storage, "--json")
    refused(run, "EEXIST")
    report = json_error(run, "EEXIST")
    assert report["problems"] == [f"{BUNDLE}/man: exists but is not a directory; left untouched"]
    assert f"{BUNDLE}/README.md" in report["created"], report
    assert man.read_text() == "my own notes\n"
    page = ctx_run("man", "tool", env=on(storage))
    assert page.rc == 0 and page.out.startswith("# ctx.tool"), page
    assert f"{man}/{MAN_PAGES['tool']} cannot be read" in page.err, page
    assert "this is the copy built into ctx" in page.err, page


def test_a_man_directory_replaced_by_a_link_is_never_followed_and_bootstrap_replaces_it(
    storage: Path, tmp_path: Path
) -> None:
    """D-1 (``ctx man`` reads the installed file, else the built-in copy), R-5: the bundle's
    ``man`` is a link to a directory of pages elsewhere.  ``ctx man tool`` does not follow
    it: the built-in page, a note naming the link and what to do; the listing marks the
    topics built-in.  Bootstrap replaces the link by the directory (``repaired … (it was a
    symbolic link)``), never touching what it led to; then ``ctx man tool`` reads the
    installed page without a note."""
    man = storage / BUNDLE / "man"
    elsewhere = tmp_path / "pages"
    shutil.move(man, elsewhere)
    man.symlink_to(elsewhere)
    before = snapshot(elsewhere)
    page = ctx_run("man", "tool", env=on(storage))
    assert page.rc == 0 and page.out == (elsewhere / MAN_PAGES["tool"]).read_text(), page
    assert f"{man} is a symbolic link, never followed (move it away" in page.err, page
    listed = ctx_run("man", "--json", env=on(storage))
    assert listed.rc == 0, listed
    origins = {entry["topic"]: entry["origin"] for entry in listed.json()}
    assert origins == {"README": "installed", **{topic: "built-in" for topic in MAN_PAGES}}
    run = boot(storage)
    assert run.rc == 0, run
    assert f"repaired  {BUNDLE}/man (it was a symbolic link)" in run.lines(), run
    assert man.is_dir() and not man.is_symlink()
    assert snapshot(elsewhere) == before
    again = ctx_run("man", "tool", env=on(storage))
    assert again.rc == 0 and again.err == "", again


@pytest.mark.parametrize("declared", ["another version", "this version", "a number"])
def test_a_source_tree_is_judged_by_the_version_its_pyproject_declares(
    storage: Path, tmp_path: Path, declared: str
) -> None:
    """D-1 (a stale bundle is rebuilt from the tree of the matching version), ``ctx bootstrap
    --help`` (a tree of another version is refused, EINVAL, exit 2, before anything is
    changed: one that declares another version, or declares this one but holds other pages,
    each named): a SOURCE whose ``ctx.model.md`` differs from this version's.  Declaring
    another version or this one, it is refused naming the version or the page, and the root
    is unchanged.  (Doubtful: a ``version`` that is a number is read as no version at all,
    so the tree is taken as an administrator's own pages and installed.)"""
    version = ctx_run("--version").out.split()[-1]
    pages = tmp_path / "tree" / "docs" / "spec"
    pages.mkdir(parents=True)
    shutil.copy(storage / BUNDLE / "README.md", pages / "README.md")
    for name in MAN_PAGES.values():
        shutil.copy(storage / BUNDLE / "man" / name, pages / name)
    (pages / MAN_PAGES["model"]).write_text("# ctx.model — as another release has it\n")
    value = {"another version": '"0.0.0-old"', "this version": f'"{version}"', "a number": "1"}
    (tmp_path / "tree" / "pyproject.toml").write_text(
        f'[project]\nname = "cortexfs"\nversion = {value[declared]}\n'
    )
    before = snapshot(storage)
    run = boot(storage, tmp_path / "tree", "--json")
    if declared == "a number":
        assert run.rc == 0, run
        assert run.json()["repaired"] == [f"{BUNDLE}/man/{MAN_PAGES['model']}"], run
        noted = ctx_run("man", "model", env=on(storage))
        assert noted.rc == 0 and "is not the page of this version of ctx" in noted.err, noted
        return
    said = refused(run, "EINVAL", 2)
    json_error(run, "EINVAL")
    if declared == "another version":
        assert f"is the source tree of cortexfs 0.0.0-old, but this ctx is {version}" in said
    else:
        assert f"docs/spec/{MAN_PAGES['model']} differs" in said, run
    assert snapshot(storage) == before


# =========================================================== agent entries


def agent_entry(storage: Path, name: str = "coder") -> Path:
    made = ctx_run(
        "agent", "create", "-", input=json.dumps({"name": name, "label": f"{name}_t"}),
        env=on(storage),
    )  # fmt: skip
    assert made.rc == 0, made
    return storage / "agent" / name


def with_root_literal(entry: Path, literal: str) -> None:
    """Put ``literal`` where the entry ``ctx agent create`` wrote names its storage root."""
    text = entry.read_text()
    changed, count = re.subn(
        r"(\['--storage', )('[^']*'|\"[^\"]*\")(, 'agent')",
        lambda m: m[1] + literal + m[3],
        text,
    )
    assert count == 1, text
    entry.write_text(changed)


def test_an_agent_entry_naming_no_root_string_is_rewritten_for_this_root(storage: Path) -> None:
    """A-3 (``agent/<name>`` is an ordinary executable entry), R-5, ``ctx bootstrap --help``
    (an entry ``ctx agent create`` wrote for another root is rewritten to run this install on
    this root): the entry's root literal is ``42``.  Bootstrap rewrites it (``repaired
    agent/coder``), exit 0, and the entry is again the one ``ctx agent create`` wrote."""
    entry = agent_entry(storage)
    written = entry.read_text()
    with_root_literal(entry, "42")
    run = boot(storage)
    assert run.rc == 0 and "repaired  agent/coder" in run.lines(), run
    assert entry.read_text() == written


@pytest.mark.parametrize(
    "literal", ["1" + "+1" * 25000, "-" * 50000 + "1"], ids=["a long sum", "many signs"]
)
def test_an_agent_entry_with_a_deeply_nested_root_literal_is_no_crash(
    storage: Path, literal: str
) -> None:
    """R-5 (bootstrap repairs what it can), A-3, ``ctx bootstrap --help`` (an entry of ``ctx
    agent create``'s shape is rewritten, one of another shape left as it is), README (errors
    read ``ctx: ERRNO: …``): the root literal of ``agent/coder`` is a sum of 25 000 terms, or
    a number behind 50 000 signs (one line of about 50 KiB), and ``tool/fs.read`` is
    missing.  Bootstrap exits 0 without a traceback and puts ``fs.read`` back."""
    entry = agent_entry(storage)
    with_root_literal(entry, literal)
    (storage / "tool" / "fs.read").unlink()
    run = boot(storage)
    assert "Traceback" not in run.err, run.err[-400:]
    assert "ENOMEM" not in run.err, run
    assert run.rc == 0, run
    assert (storage / "tool" / "fs.read").is_file()
