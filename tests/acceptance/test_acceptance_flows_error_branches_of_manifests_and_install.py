"""The error branches of manifests and of ``ctx object install`` (with ``check`` and ``list``
around them), each reached from outside through the installed commands.

Sources: SPEC R-1, R-4, R-5, T-1, T-8, T-8a, X-1, M-3, M-4, C-2; docs/tools.md ("A tool on
disk", "Manifests, version 2", "How the manifest and its program are read", "How an install
stays atomic", "Listing and resolving"); the help of ``ctx object``, ``ctx object install``
and ``ctx object list``.

The angle: what the code of the manifest reader, of the install and of the listing can
refuse, provoked as an administrator or a second, real user provokes it — a tier that is a
symbolic link, missing, a file, read-only, immutable or locked by another process; a control
directory holding something an install did not write; a lock file that is not one; a
program named by an absolute path, through a link, or that its installer may not read; a
schema whose pattern no regular expression engine can compile; a reinstall whose carry-over
of the previous version's local state the kernel refuses; a version that swaps ``exec`` for
``mcp`` and back; an install interrupted between its two swaps; a listing by a user who may
not see every space.  Each check reads the documented exit status, the errno word of the
``ctx: ERRNO: …`` line (and of the ``--json`` error object, or of ``check``'s per-problem
``codes``), that the message names the thing at fault and what to do where the documents
promise it, and that nothing was half-done: no tool installed by a refused install, no
hidden staging left behind, the previous version still whole, nothing written through a
link."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    age,
    clean_env,
    new_scratch_dir,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="tiers of other uids, attributes and mounts: needs root"
)

TOP = scratch_top(__file__)
SPACE = "proj"  # the space the conftest's storage root holds (ctx queue init --project proj)
V1 = "#!/bin/sh\necho version-1\n"
V2 = "#!/bin/sh\necho version-2\n"
TOKEN = "0123456789ab"  # docs/tools.md: a staged name carries a token


# ------------------------------------------------------------------------ what flows share


def refused(run: Run, name: str, status: int) -> str:
    """``run`` exited ``status`` with nothing on stdout, its last line on stderr
    ``ctx: NAME: …`` and no traceback; that line's sentence."""
    assert "Traceback" not in run.err, run
    assert (run.rc, run.out) == (status, ""), run
    last = run.err.rstrip("\n").splitlines()[-1] if run.err.strip() else ""
    assert last.startswith(f"ctx: {name}: "), run
    return last[len(f"ctx: {name}: ") :]


def refused_json(run: Run, name: str, status: int) -> dict:
    """As :func:`refused` for a ``--json`` run: stdout is the one error object, saying what
    stderr says."""
    assert "Traceback" not in run.err, run
    assert run.rc == status, run
    lines = run.out.splitlines()
    assert len(lines) == 1, run
    error = json.loads(lines[0])
    assert (error["error"], error["errno"]) == (name, getattr(errno, name)), run
    assert f"ctx: {name}: {error['message']}" in run.err, run
    return error


def hidden(directory: Path) -> list[str]:
    """The dot-names of a tier but its lock file: what an install stages under and must not
    leave behind."""
    return sorted(n for n in os.listdir(directory) if n.startswith(".") and n != ".install-lock")


def document(name: str, **fields) -> dict:
    """A v2 manifest (T-8) of tool ``name`` running ``NAME.sh``; a field given None is left
    out."""
    made = {
        "manifest": 2,
        "kind": "tool",
        "name": name,
        "description": f"The {name} tool.",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": f"{name}.sh",
    }
    made.update(fields)
    return {k: v for k, v in made.items() if v is not None}


def chattr(flag: str, path: Path) -> None:
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"chattr {flag} does not work here: {done.stderr.strip()}")


@dataclass(repr=False)
class World(OnStorage):
    """A bootstrapped root holding the space ``proj`` (``storage``), and ``src``, a directory
    every uid may read, for manifests and programs."""

    storage: Path
    src: Path
    pinned: list[Path] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage), CTX_PATH=str(self.storage / "tool"))

    def tier(self, tier: str = f"shared:{SPACE}") -> Path:
        if tier == "system":
            return self.storage / "tool"
        return self.storage / "shared" / tier.split(":", 1)[1] / "tool"

    def manifest(self, name: str, text: str = V1, *, at: str | None = None, **fields) -> Path:
        """``src/AT.json`` (``AT`` defaults to ``name``) for tool ``name``, its program
        ``src/AT.sh`` holding ``text`` (unless ``exec`` is given)."""
        stem = at or name
        (self.src / f"{stem}.sh").write_text(text)
        (self.src / f"{stem}.sh").chmod(0o755)
        fields.setdefault("exec", f"{stem}.sh")
        path = self.src / f"{stem}.json"
        path.write_text(json.dumps(document(name, **fields)))
        path.chmod(0o644)
        return path

    def install(self, path: Path, tier: str = f"shared:{SPACE}", *more: str) -> Run:
        return self.ctx("object", "install", path, "--tier", tier, *more)

    def installed(self, name: str, program: str = V1, tier: str = f"shared:{SPACE}") -> Path:
        """``name`` installed into ``tier``, which must succeed; its executable."""
        done = self.install(self.manifest(name, program), tier)
        assert done.rc == 0, done
        return self.tier(tier) / name

    def pin(self, flag: str, path: Path) -> None:
        chattr(flag, path)
        self.pinned.append(path)


@pytest.fixture
def world(storage: Path) -> Iterator[World]:
    src = new_scratch_dir(TOP, "src-")
    made = World(storage, src)
    try:
        yield made
    finally:
        for path in made.pinned:
            subprocess.run(["chattr", "-i", "-a", str(path)], capture_output=True)
        shutil.rmtree(src, ignore_errors=True)


def as_user(user: UnprivilegedUser, *args, env: dict[str, str] | None = None) -> Run:
    """``ctx ARGS`` run as ``user`` (its own group only), in ``/``, with a HOME holding
    nothing of root's."""
    done = subprocess.run(
        [*CTX_ARGV, *map(str, args)],
        input=b"",
        capture_output=True,
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        env=clean_env(HOME="/nonexistent", **(env or {})),
        cwd="/",
        timeout=60,
    )
    return Run(
        [str(a) for a in args],
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


@dataclass(repr=False)
class Shared(OnStorage):
    """A bootstrapped root every uid may search, ``user``'s home made and given to them (as
    an administrator makes it), and ``src``, where the user's manifests are."""

    storage: Path
    src: Path
    user: UnprivilegedUser

    @property
    def user_env(self) -> dict[str, str]:
        return {"CTX_STORAGE": str(self.storage), "CTX_PATH": str(self.storage / "tool")}

    @property
    def user_tier(self) -> Path:
        return self.storage / "home" / str(self.user.uid) / "tool"

    def users_manifest(self, name: str, program: str = V1, **fields) -> Path:
        (self.src / f"{name}.sh").write_text(program)
        (self.src / f"{name}.sh").chmod(0o755)
        path = self.src / f"{name}.json"
        path.write_text(json.dumps(document(name, **fields)))
        for made in (path, self.src / f"{name}.sh"):
            os.chown(made, self.user.uid, self.user.gid)
        return path

    def as_user(self, *args) -> Run:
        return as_user(self.user, *args, env=self.user_env)


@pytest.fixture
def shared(searchable_storage: Path, unprivileged_user: UnprivilegedUser) -> Iterator[Shared]:
    home = searchable_storage / "home" / str(unprivileged_user.uid)
    home.mkdir(mode=0o755)
    os.chown(home, unprivileged_user.uid, unprivileged_user.gid)
    src = new_scratch_dir(TOP, "user-")
    os.chown(src, unprivileged_user.uid, unprivileged_user.gid)
    try:
        yield Shared(searchable_storage, src, unprivileged_user)
    finally:
        shutil.rmtree(src, ignore_errors=True)


# ============================================ tiers that are links, missing, files (T-8, X-1)


@pytest.mark.parametrize("target", ["outside-the-root", "inside-the-space"])
def test_a_space_tier_reached_through_a_link_is_eloop_and_nothing_is_written(
    world: World, tmp_path: Path, target: str
) -> None:
    """T-8, X-1, R-1: ``shared/proj/tool`` made a symbolic link (to a directory outside the
    root, or to another directory of the space).  The install never follows it: ``ELOOP``,
    exit 1, naming the tier and the link's place and saying to make it a directory of the
    root again; ``--json`` gives the same error object; nothing is written on either side."""
    tier = world.tier()
    if target == "outside-the-root":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        shutil.rmtree(tier)
    else:
        elsewhere = tier.with_name("tool.real")
        tier.rename(elsewhere)
    tier.symlink_to(elsewhere)
    manifest = world.manifest("via.link")
    before, there = snapshot(world.storage), snapshot(elsewhere)
    said = refused(world.install(manifest), "ELOOP", 1)
    assert said.startswith(
        f"tier shared:{SPACE} is not reached without a symbolic link from the storage root "
        f"{world.storage} (shared/{SPACE}/tool runs through one"
    ), said
    assert "make it a directory of the root again" in said, said
    error = refused_json(world.install(manifest, f"shared:{SPACE}", "--json"), "ELOOP", 1)
    assert error["message"] == said
    assert snapshot(world.storage) == before
    assert snapshot(elsewhere) == there


def test_a_system_tier_that_is_a_link_is_eloop_naming_the_tier(world: World) -> None:
    """T-8, R-5: ``tool`` made a link to ``tool.real`` (a directory of the root).  The
    system-tier install is ``ELOOP`` naming tier ``system`` and ``tool``; ``tool.real``
    gets no new entry, hidden or not."""
    tier = world.tier("system")
    real = tier.with_name("tool.real")
    tier.rename(real)
    tier.symlink_to("tool.real")
    listed = sorted(os.listdir(real))
    said = refused(world.install(world.manifest("sys.link"), "system"), "ELOOP", 1)
    assert said.startswith(
        f"tier system is not reached without a symbolic link from the storage root "
        f"{world.storage} (tool runs through one"
    ), said
    assert sorted(os.listdir(real)) == listed


def test_a_space_without_its_tool_directory_is_enoent_and_the_advice_mends_it(
    world: World,
) -> None:
    """T-8, T-8a, X-1, docs/tools.md "Listing and resolving": with ``shared/proj/tool``
    removed, ``install --tier shared:proj`` and ``list --tier shared:proj`` are ``ENOENT``,
    exit 1, naming the directory and ``ctx shared create proj``; nothing is made by the
    refusals.  Following the advice makes the tier, and the same install then succeeds."""
    tier = world.tier()
    shutil.rmtree(tier)
    manifest = world.manifest("back.again")
    said = (
        f"tier shared:{SPACE} has no directory {tier}; create it with 'ctx shared create {SPACE}'"
    )
    assert refused(world.install(manifest), "ENOENT", 1) == said
    assert refused(world.ctx("object", "list", "--tier", f"shared:{SPACE}"), "ENOENT", 1) == said
    assert not tier.exists()
    made = world.ctx("shared", "create", SPACE)
    assert made.rc == 0 and tier.is_dir(), made
    again = world.install(manifest)
    assert (
        again.rc == 0
        and again.out == f"installed back.again in tier shared:{SPACE}: {tier}/back.again\n"
    ), again


def test_a_root_without_its_system_tier_is_enoent_naming_bootstrap_which_mends_it(
    world: World,
) -> None:
    """T-8, R-5: with ``tool/`` removed, a system-tier install is ``ENOENT`` (exit 1, and the
    same ``--json`` error object) naming the directory and ``ctx bootstrap``, and makes no
    ``tool/``; after ``ctx bootstrap`` the same install succeeds."""
    tier = world.tier("system")
    shutil.rmtree(tier)
    manifest = world.manifest("after.boot")
    error = refused_json(world.install(manifest, "system", "--json"), "ENOENT", 1)
    assert error["message"] == f"tier system has no directory {tier}; run 'ctx bootstrap'"
    assert not tier.exists()
    booted = world.ctx("bootstrap")
    assert booted.rc == 0, booted
    again = world.install(manifest, "system")
    assert again.rc == 0 and (tier / "after.boot").read_text() == V1, again


def test_a_file_at_a_space_tier_is_enotdir_naming_the_file_in_the_way(world: World) -> None:
    """T-8, X-1, docs/tools.md "How an install stays atomic" (a file where a directory
    belongs is ``ENOTDIR``, naming the path: move it away): a regular file sits at
    ``shared/proj/tool``.  The install is refused, exit 1, the file kept byte for byte; its
    errno is the kernel's for a file where a directory belongs, ``ENOTDIR``, and the message
    names the file, as ``ctx shared create proj`` does — not ``ENOENT`` with the advice to
    run that very command, which then refuses."""
    tier = world.tier()
    shutil.rmtree(tier)
    tier.write_text("notes of the team\n")
    run = world.install(world.manifest("in.the.way"))
    assert run.rc == 1 and "Traceback" not in run.err, run
    assert tier.read_text() == "notes of the team\n"
    said = refused(run, "ENOTDIR", 1)
    assert str(tier) in said, said


# ============================================== what an install did not write (docs/tools.md)

OBSTACLES = {
    # case: (what is replaced in t.d, by what, errno, the sentence's start)
    "policy-a-directory": ("policy", "dir", "EISDIR", "policy is a directory, not a control file"),
    "log-a-symlink": ("log", "link", "EEXIST", "log is a symbolic link, not a control file"),
    "schema-a-fifo": ("schema", "fifo", "EEXIST", "schema is a special file, not a control file"),
    "pre.d-a-file": ("hooks/pre.d", "file", "ENOTDIR", "hooks/pre.d is a file, not a directory"),
    "hooks-a-symlink": ("hooks", "link", "EEXIST", "hooks is a symbolic link, not a directory"),
}


@pytest.mark.parametrize("case", sorted(OBSTACLES))
def test_something_an_install_did_not_write_in_the_control_directory_stops_a_reinstall(
    world: World, tmp_path: Path, case: str
) -> None:
    """docs/tools.md "How an install stays atomic": a reinstall replaces only the controls a
    manifest defines (regular files) and ``hooks/pre.d``, ``hooks/post.d`` (directories);
    anything else there is refused — ``EISDIR`` for a directory, ``ENOTDIR`` for a file, a
    symlink or a special file ``EEXIST`` — naming the path, with nothing changed and nothing
    staged.  Moved away, the same reinstall succeeds and the tool is whole again."""
    where, kind, code, sentence = OBSTACLES[case]
    world.installed("t")
    tier = world.tier()
    place = tier / "t.d" / where
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_text("not the tool's\n")
    if place.is_dir():
        shutil.rmtree(place)
    else:
        place.unlink()
    {
        "dir": lambda: place.mkdir(),
        "file": lambda: place.write_text("a file\n"),
        "fifo": lambda: os.mkfifo(place),
        "link": lambda: place.symlink_to(outside / "kept" if where == "log" else outside),
    }[kind]()
    before = snapshot(tier)
    said = refused(world.install(world.manifest("t", V2)), code, 1)
    assert said == (
        f"{tier}/t.d/{sentence}; it is not ours to replace, so nothing was changed: move it away "
        "and install again"
    ), said
    assert snapshot(tier) == before and hidden(tier) == []
    assert (outside / "kept").read_text() == "not the tool's\n"
    if place.is_dir() and not place.is_symlink():
        place.rmdir()
    else:
        place.unlink()
    again = world.install(world.manifest("t", V2))
    assert again.rc == 0, again
    assert (tier / "t").read_text() == V2
    listed = world.ctx("object", "list", "--tier", f"shared:{SPACE}", "--json")
    assert [(e["name"], e["status"]) for e in listed.json()] == [("t", "available")], listed


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_lock_file_that_is_no_regular_file_is_eexist_and_never_followed_or_waited_on(
    world: World, tmp_path: Path, kind: str
) -> None:
    """docs/tools.md "How an install stays atomic": installs into a tier take turns under
    its regular file ``.install-lock``.  A symbolic link (to a file elsewhere) or a FIFO at
    that name is in the way: ``EEXIST``, exit 1, within seconds, naming it and saying to
    move it away; nothing installed, nothing left, the link's target untouched.  Removed,
    the lock file is made again by the next install, which succeeds."""
    tier = world.tier()
    lock = tier / ".install-lock"
    lock.unlink(missing_ok=True)
    target = tmp_path / "someone-elses"
    target.write_text("keep\n")
    if kind == "symlink":
        lock.symlink_to(target)
        found = "a symbolic link"
    else:
        os.mkfifo(lock)
        found = "a special file"
    manifest = world.manifest("locked.out")
    run = world.ctx("object", "install", manifest, "--tier", f"shared:{SPACE}", timeout=20)
    said = refused(run, "EEXIST", 1)
    assert said == (
        f"cannot install {tier}/locked.out: {lock} is {found}, not the lock file that "
        f"serialises changes to {tier}: move it away; nothing was installed and nothing of "
        "this attempt is left: correct that and run the command again"
    ), said
    assert sorted(os.listdir(tier)) == [".install-lock"]
    assert target.read_text() == "keep\n" and stat.S_IMODE(target.stat().st_mode) == 0o644
    lock.unlink()
    again = world.install(manifest)
    assert again.rc == 0 and lock.is_file() and not lock.is_symlink(), again


# ===================================================== attributes and read-only filesystems

ATTRIBUTES = {
    # case: (flag, what is pinned, the start of the sentence after "ctx: EPERM: ")
    "tier-immutable": ("+i", "", "cannot install into tier shared:proj: {p} is immutable"),
    "log-append-only": ("+a", "t.d/log", "cannot install {tier}/t: {p} is append-only"),
    "pre.d-immutable": ("+i", "t.d/hooks/pre.d", "cannot install {tier}/t: {p} is immutable"),
}


@pytest.mark.parametrize("case", sorted(ATTRIBUTES))
def test_an_attribute_that_pins_the_tier_or_the_previous_version_is_eperm_naming_chattr(
    world: World, case: str
) -> None:
    """docs/tools.md "How an install stays atomic" (nothing half-done): an immutable tier
    directory, an append-only log or an immutable ``hooks/pre.d`` of the previous version
    would stop the commit midway.  The reinstall is ``EPERM`` (exit 1) before anything is
    staged, naming the file, the attribute and the ``chattr -X PATH`` that lifts it; the old
    version stays whole; once lifted, the same reinstall succeeds."""
    flag, pinned, start = ATTRIBUTES[case]
    world.installed("t")
    tier = world.tier()
    path = tier / pinned if pinned else tier
    world.pin(flag, path)
    before = snapshot(tier)
    said = refused(world.install(world.manifest("t", V2)), "EPERM", 1)
    assert said.startswith(start.format(p=path, tier=tier)), said
    assert f"chattr -{flag[1]} {path}" in said, said
    assert snapshot(tier) == before and hidden(tier) == []
    subprocess.run(["chattr", f"-{flag[1]}", str(path)], check=True)
    again = world.install(world.manifest("t", V2))
    assert again.rc == 0 and (tier / "t").read_text() == V2, again


def test_a_read_only_tier_is_erofs_saying_remount_and_nothing_is_made(
    world: World,
) -> None:
    """T-8, docs/tools.md: an install into a tier on a read-only filesystem (a read-only
    bind mount of ``shared/proj/tool``) is ``EROFS``, exit 1, naming the tier and saying to
    remount it read-write; ``--json`` says the same; nothing is made, the tier stays as it
    was once the mount is gone."""
    tier = world.tier()
    world.installed("t")
    before = snapshot(tier)
    if subprocess.run(["mount", "--bind", str(tier), str(tier)]).returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        remount = ["mount", "-o", "remount,bind,ro", str(tier)]
        if subprocess.run(remount).returncode != 0:
            pytest.skip("cannot remount read-only here")
        manifest = world.manifest("ro.tool")
        said = refused(world.install(manifest), "EROFS", 1)
        assert said == (
            f"cannot install into tier shared:{SPACE}: {tier} is on a read-only filesystem; "
            "remount it read-write, or use a storage root on a writable one"
        ), said
        error = refused_json(world.install(manifest, f"shared:{SPACE}", "--json"), "EROFS", 1)
        assert error["message"] == said
        reinstall = world.install(world.manifest("t", V2))
        refused(reinstall, "EROFS", 1)
    finally:
        subprocess.run(["umount", str(tier)], check=False)
    assert snapshot(tier) == before


# ======================================================= lock held by another process (T-8)


def _hold_lock(tier: Path) -> int:
    fd = os.open(tier / ".install-lock", os.O_RDWR | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_an_install_waits_for_the_tiers_lock_says_whose_and_then_completes(
    world: World, tmp_path: Path
) -> None:
    """docs/tools.md "How an install stays atomic" (installs of one tier take turns under
    the ``flock`` of ``.install-lock``): while this process holds it, an install makes
    nothing and, after a moment, says on stderr that it waits for that lock file and which
    pid holds it; released, the install completes (exit 0) with nothing staged left."""
    world.installed("first")
    tier = world.tier()
    manifest = world.manifest("second")
    fd = _hold_lock(tier)
    log = tmp_path / "stderr"
    try:
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [*CTX_ARGV, "object", "install", str(manifest), "--tier", f"shared:{SPACE}"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=world.env,
            )  # fmt: skip
        try:
            assert wait_for(lambda: "waiting for" in log.read_text(), 15), log.read_text()
            assert proc.poll() is None and not (tier / "second").exists()
            notice = log.read_text()
            assert f"{tier}/.install-lock" in notice and str(os.getpid()) in notice, notice
        finally:
            os.close(fd)
            fd = -1
            out, _ = proc.communicate(timeout=30)
    finally:
        if fd >= 0:
            os.close(fd)
    assert proc.returncode == 0, (out, log.read_text())
    assert (tier / "second").read_text() == V1 and hidden(tier) == []


def test_an_install_interrupted_while_it_waits_for_the_lock_makes_nothing(
    world: World, tmp_path: Path
) -> None:
    """docs/tools.md "How an install stays atomic"; the waiting notice ("Ctrl-C stops
    waiting, and makes nothing of this change"): SIGINT to an install waiting for the tier's
    lock ends it with ``EINTR`` (exit 130, the ``--json`` error object on stdout), with no
    tool and nothing staged; the lock is not left held: the next install succeeds."""
    tier = world.tier()
    world.installed("first")
    manifest = world.manifest("never")
    fd = _hold_lock(tier)
    log = tmp_path / "stderr"
    try:
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [*CTX_ARGV, "object", "install", str(manifest), "--tier", f"shared:{SPACE}",
                 "--json"],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=world.env,
            )  # fmt: skip
        try:
            assert wait_for(lambda: "waiting for" in log.read_text(), 15), log.read_text()
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        os.close(fd)
    assert proc.returncode == 130, (out, log.read_text())
    error = json.loads(out)
    assert (error["error"], error["errno"]) == ("EINTR", errno.EINTR), error
    assert "ctx: EINTR: interrupted (SIGINT)" in log.read_text()
    assert not (tier / "never").exists() and not (tier / "never.d").exists()
    assert hidden(tier) == []
    again = world.ctx("object", "install", manifest, "--tier", f"shared:{SPACE}", timeout=20)
    assert again.rc == 0, again


# ========================================================= programs the reader refuses (T-8)


def _exec_cases(src: Path) -> dict[str, tuple[str, str, str]]:
    """case: (exec, errno, the problem) for programs named by odd paths below ``src``."""
    return {
        "absolute-final-link": (
            str(src / "plink.sh"),
            "ELOOP",
            f"exec: {src}/plink.sh: {src}/plink.sh is a symbolic link (to {src}/p.sh), which "
            "is never followed to a program",
        ),
        "the-root-directory": ("/", "EINVAL", "exec: / is not a regular file (a FIFO, device"),
        "absolute-missing-directory": (
            str(src / "gone" / "p.sh"),
            "EINVAL",
            f"exec: {src}/gone/p.sh: No such file or directory",
        ),
        "absolute-file-named-as-a-directory": (
            f"{src}/p.sh/",
            "EINVAL",
            f"exec: {src}/p.sh/: Not a directory",
        ),
        "absolute-directory": (
            f"{src}/sub/",
            "EINVAL",
            f"exec: {src}/sub/ is not a regular file (a FIFO, device or directory)",
        ),
        "relative-linked-directory-as-a-directory": (
            "dirlink/",
            "ELOOP",
            f"exec: {src}/dirlink/: dirlink/ is a symbolic link (to {src}/sub)",
        ),
    }


EXEC_CASES = sorted(_exec_cases(Path("/x")))


@pytest.mark.parametrize("case", EXEC_CASES)
def test_programs_named_by_odd_paths_are_refused_with_their_own_errno(
    world: World, case: str
) -> None:
    """T-8, docs/tools.md "How the manifest and its program are read": an absolute ``exec``
    resolves its directories as usual but never a final link (``ELOOP``); ``/`` and a path
    ending in ``/`` name directories, never a program (``EINVAL``, with the kernel's words
    for a file named as a directory); a relative one never passes a link (``ELOOP``, naming
    it and its target).  ``check --json`` gives that errno in ``codes``, the text line
    ``MANIFEST: ERRNO: problem``, and ``install`` refuses with it, the tier unchanged."""
    src = world.src
    (src / "p.sh").write_text(V1)
    (src / "plink.sh").symlink_to(src / "p.sh")
    (src / "sub").mkdir()
    (src / "dirlink").symlink_to(src / "sub")
    value, code, problem = _exec_cases(src)[case]
    manifest = src / "odd.json"
    manifest.write_text(json.dumps(document("odd.exec", exec=value)))
    checked = world.ctx("object", "check", "--json", manifest)
    assert checked.rc == 1 and "Traceback" not in checked.err, checked
    [entry] = checked.json()
    assert (entry["valid"], entry["codes"], entry["error"]) == (False, [code], None), entry
    assert entry["problems"][0].startswith(problem), entry
    assert checked.err == f"{manifest}: {code}: {entry['problems'][0]}\n", checked
    before = snapshot(world.tier())
    said = refused(world.install(manifest), code, 1)
    assert said == f"{manifest}: {entry['problems'][0]}", said
    assert snapshot(world.tier()) == before


def test_an_absolute_exec_through_a_linked_directory_and_a_dotdot_exec_install_what_was_read(
    world: World,
) -> None:
    """docs/tools.md: an absolute ``exec``, or one with ``..``, is honoured in a manifest of
    the installer's own, its directories resolving as usual: a program reached through a
    linked directory, and one above the manifest's directory, install as the bytes read,
    and ``check`` calls both valid."""
    real = world.src / "real"
    real.mkdir()
    (real / "q.sh").write_text(V2)
    (world.src / "via").symlink_to(real)
    inner = world.src / "m"
    inner.mkdir()
    absolute = inner / "abs.json"
    absolute.write_text(json.dumps(document("abs.exec", exec=str(world.src / "via" / "q.sh"))))
    climbing = inner / "up.json"
    climbing.write_text(json.dumps(document("up.exec", exec="../real/q.sh")))
    checked = world.ctx("object", "check", absolute, climbing)
    assert checked.rc == 0, checked
    assert checked.out == f"{absolute}: valid (abs.exec)\n{climbing}: valid (up.exec)\n"
    for manifest, name in ((absolute, "abs.exec"), (climbing, "up.exec")):
        done = world.install(manifest)
        assert done.rc == 0, done
        executable = world.tier() / name
        assert executable.read_text() == V2 and not executable.is_symlink()
        assert stat.S_IMODE(executable.stat().st_mode) == 0o755


def test_problems_of_several_errnos_are_listed_each_with_its_own_by_check(world: World) -> None:
    """T-8, docs/tools.md (``check`` lists every reason, ``codes`` one per problem; EINVAL
    for what is wrong with the manifest, ELOOP for a program reached through a link): a
    manifest with a blank description and a linked program is two lines, ``EINVAL`` then
    ``ELOOP``; ``install`` of it is ``EINVAL`` (the manifest is invalid), both reasons on
    stderr, the ``--json`` error saying one more; one with only the link is ``ELOOP``."""
    (world.src / "p.sh").write_text(V1)
    (world.src / "plink.sh").symlink_to(world.src / "p.sh")
    both = world.src / "both.json"
    both.write_text(json.dumps(document("two.wrongs", description=" \t", exec="plink.sh")))
    linked = world.src / "linked.json"
    linked.write_text(json.dumps(document("one.wrong", exec="plink.sh")))
    checked = world.ctx("object", "check", "--json", both, linked)
    assert checked.rc == 1, checked
    first, second = checked.json()
    assert first["codes"] == ["EINVAL", "ELOOP"], first
    assert first["problems"][0] == "description: only blanks; say what the tool does", first
    assert first["problems"][1].startswith(f"exec: {world.src}/plink.sh: plink.sh is a symbolic")
    assert second["codes"] == ["ELOOP"], second
    before = snapshot(world.tier())
    run = world.install(both, f"shared:{SPACE}", "--json")
    assert run.rc == 1 and "Traceback" not in run.err, run
    lines = run.err.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"ctx: EINVAL: {both}: description: "), run
    assert "plink.sh is a symbolic link" in lines[1], run
    error = run.json()
    assert error["error"] == "EINVAL" and error["message"].endswith("(and 1 more)"), error
    only = refused_json(world.install(linked, f"shared:{SPACE}", "--json"), "ELOOP", 1)
    assert only["message"].startswith(f"{linked}: exec: {world.src}/plink.sh: "), only
    assert snapshot(world.tier()) == before


# ================================================ patterns no engine compiles (T-1, T-8, C-2)

UNCOMPILABLE = {
    "a-repetition-past-2**32": "a{4294967296}",
    "a-thousand-nested-groups": "(" * 1000 + ")" * 1000,
}


@pytest.mark.parametrize("case", sorted(UNCOMPILABLE))
def test_a_pattern_too_large_to_compile_is_a_reason_not_a_traceback(
    world: World, case: str
) -> None:
    """T-8, docs/tools.md ("A schema is refused at ctx object check and install with every
    reason listed"): a ``pattern`` ECMA-262 spells but Python's engine cannot compile for
    its size — a repetition count past 2**32, a thousand nested groups — is judged like any
    pattern: ``check`` exits 0 (valid) or 1 with an ``EINVAL`` line naming the schema, and
    never with a traceback; ``install`` agrees with ``check`` and a refused one installs
    nothing."""
    schema = {
        "type": "object",
        "properties": {"q": {"type": "string", "pattern": UNCOMPILABLE[case]}},
    }
    manifest = world.manifest("big.pattern", schema=schema)
    checked = world.ctx("object", "check", manifest)
    assert "Traceback" not in checked.err and checked.rc in (0, 1), checked
    before = snapshot(world.tier())
    installed = world.install(manifest)
    assert "Traceback" not in installed.err, installed
    if checked.rc == 1:
        assert checked.err.startswith(f"{manifest}: EINVAL: schema"), checked
        refused(installed, "EINVAL", 1)
        assert snapshot(world.tier()) == before
    else:
        assert installed.rc == 0, installed


def test_a_schema_control_holding_an_uncompilable_pattern_is_listed_damaged(
    world: World,
) -> None:
    """T-1, T-8a, docs/tools.md "A tool on disk" (a malformed control makes the tool damaged;
    ``ctx object list`` says so in ``status`` and ``problems``): a tool's ``schema`` control
    edited by hand to hold a pattern no engine compiles is listed ``damaged`` with its
    problem; the listing of the other tools goes on (exit 0)."""
    world.installed("t")
    world.installed("u")
    schema = {"type": "object", "properties": {"q": {"pattern": "a{4294967296}"}}}
    (world.tier() / "t.d" / "schema").write_text(json.dumps(schema) + "\n")
    listed = world.ctx("object", "list", "--tier", f"shared:{SPACE}", "--json")
    assert "Traceback" not in listed.err and listed.rc == 0, listed
    statuses = {e["name"]: (e["status"], bool(e["problems"])) for e in listed.json()}
    assert statuses == {"t": ("damaged", True), "u": ("available", False)}, statuses


# ======================================================= versions and interrupted installs


def test_a_version_that_swaps_exec_for_mcp_and_back_brings_only_its_own_controls(
    world: World,
) -> None:
    """T-1, T-8, M-4, C-2, docs/tools.md "How an install stays atomic": a reinstall brings
    the controls its manifest defines and drops the previous version's others.  ``exec``
    with a ``program`` control, then ``mcp`` (the bridge as executable, an ``mcp`` control,
    no ``program``), then ``exec`` again: each time only that version's controls are there,
    the policy is the very same file, and ``--json`` says ``replaced``."""
    config = world.src / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"srv": {"command": "/bin/true"}}}))
    locator = {"transport": "stdio", "config": str(config), "server": "srv", "tool": "t"}
    with_program = world.manifest("srv.t", V1, at="v1", program={"type": "object"})
    bridged = world.manifest("srv.t", at="v2", exec=None, mcp=locator)
    plain = world.manifest("srv.t", V2, at="v3")
    controls = world.tier() / "srv.t.d"
    executable = world.tier() / "srv.t"
    assert world.install(with_program).rc == 0
    policy = (controls / "policy").stat().st_ino
    expected = {"v2": ({"mcp"}, None), "v3": (set(), V2), "v1": ({"program"}, V1)}
    for manifest in (bridged, plain, with_program):
        done = world.install(manifest, f"shared:{SPACE}", "--json")
        assert done.rc == 0 and done.json()["replaced"] is True, done
        optional, program = expected[manifest.stem]
        assert {"mcp", "program"} & set(os.listdir(controls)) == optional, manifest
        assert (controls / "policy").stat().st_ino == policy
        if program is None:  # the bridge built into ctx, not a program of the manifest's
            assert not executable.read_bytes().startswith(b"#!/bin/sh"), manifest
            assert json.loads((controls / "mcp").read_text()) == locator
        else:
            assert executable.read_text() == program, manifest
    assert json.loads((controls / "program").read_text()) == {"type": "object"}


def test_an_install_interrupted_between_its_swaps_lists_unavailable_until_bootstrap_ends_it(
    world: World,
) -> None:
    """docs/tools.md "How an install stays atomic" and "Listing and resolving" (a reinstall
    between its two swaps — interrupted — lists ``unavailable``, calls meeting ``EAGAIN``,
    until ``ctx bootstrap`` finishes it): a commit marker and new controls as a killed
    reinstall leaves them, old enough not to be one in progress.  ``list`` says
    ``unavailable`` with the reason naming the install and ``ctx bootstrap``, without
    waiting; bootstrap reports it finished, the new controls in place, nothing hidden left,
    and ``list`` says ``available``."""
    world.installed("t")
    tier = world.tier()
    staged = tier / f".t~{TOKEN}~controls"
    shutil.copytree(tier / "t.d", staged, symlinks=True)
    (staged / "description").write_text("The next version.\n")
    marker = tier / ".t~commit"
    marker.write_text(f"{TOKEN} {staged.stat().st_ino}\n")
    for path in (marker, staged):
        age(path, 3600)
    listed = world.ctx("object", "list", "--tier", f"shared:{SPACE}", "--json", timeout=20)
    assert listed.rc == 0, listed
    [entry] = listed.json()
    assert entry["status"] == "unavailable", entry
    assert entry["reason"] == (
        "t kept changing while it was read: an install of it is in progress; retry, and run "
        "'ctx bootstrap' if an interrupted install left it so"
    ), entry
    booted = world.ctx("bootstrap", "--json")
    assert booted.rc == 0, booted
    assert f"{tier}/t: finished an interrupted install" in booted.json()["repaired"], booted
    assert (tier / "t.d" / "description").read_text() == "The next version.\n"
    assert hidden(tier) == []
    [entry] = world.ctx("object", "list", "--tier", f"shared:{SPACE}", "--json").json()
    assert (entry["status"], entry["description"]) == ("available", "The next version."), entry


# ======================================================= a second, real user (R-4, X-1, T-8a)


def test_a_space_the_user_may_not_list_is_left_out_with_a_note_naming_it(shared: Shared) -> None:
    """T-8a, ``ctx object list --help`` ("a tier you may not list is left out with a note on
    stderr (a space of a group you are not in)"): as a user outside space ``proj``, whose
    tier holds a tool, the listing exits 0 with the system tier's tools and none of
    ``proj``'s, and one note names the tier, its directory and the uid."""
    w, user = shared, shared.user
    (w.src / "hidden.tool.sh").write_text(V1)
    (w.src / "hidden.tool.json").write_text(json.dumps(document("hidden.tool")))
    assert (
        w.ctx("object", "install", w.src / "hidden.tool.json", "--tier", f"shared:{SPACE}").rc == 0
    )
    listed = w.as_user("object", "list", "--json")
    assert listed.rc == 0 and "Traceback" not in listed.err, listed
    entries = listed.json()
    assert {"fs.read", "tsh.config"} <= {e["name"] for e in entries}, entries
    assert {e["tier"] for e in entries} == {"system"}, entries
    tier = w.storage / "shared" / SPACE / "tool"
    assert listed.err == (
        f"ctx: note: tier shared:{SPACE} ({tier}) cannot be listed by uid {user.uid} "
        "(Permission denied): its tools are left out\n"
    ), listed


def test_naming_a_space_the_user_may_not_enter_is_eacces_naming_the_directory(
    shared: Shared,
) -> None:
    """T-8a, X-1: ``ctx object list --tier shared:proj`` as a user outside the space is not
    an empty listing but ``EACCES``, exit 1, naming the space's directory the uid may not
    enter and what to do; ``--json`` gives the same error object."""
    w, user = shared, shared.user
    space = w.storage / "shared" / SPACE
    said = refused(w.as_user("object", "list", "--tier", f"shared:{SPACE}"), "EACCES", 1)
    assert said.startswith(f"cannot reach {space}/tool: uid {user.uid} may not enter {space} ")
    assert "run it as root" in said, said
    error = refused_json(
        w.as_user("object", "list", "--tier", f"shared:{SPACE}", "--json"), "EACCES", 1
    )
    assert error["message"] == said


def test_a_shared_directory_the_user_may_not_list_leaves_the_spaces_out_with_a_note(
    shared: Shared,
) -> None:
    """T-8a, ``ctx object list --help`` (without ``--tier``: the system tier, your user tier
    and every shared space's tier; a tier you may not list is left out with a note on
    stderr): an administrator makes ``shared/`` 0711, so that users may enter the spaces
    they belong to but not list the others.  A user's ``ctx object list`` still lists the
    system tier (exit 0) and says in a note what it had to leave out."""
    w = shared
    (w.storage / "shared").chmod(0o711)
    listed = w.as_user("object", "list", "--json")
    assert "Traceback" not in listed.err, listed
    assert listed.rc == 0, listed
    assert {"fs.read", "tsh.config"} <= {e["name"] for e in listed.json()}, listed
    assert "ctx: note: " in listed.err, listed


CARRY_OVER = {
    # case: (errno, how the administrator changed the previous version)
    "policy-rewritten-by-root": "EPERM",
    "pre.d-made-read-only": "EACCES",
}


@pytest.mark.parametrize("case", sorted(CARRY_OVER))
def test_a_users_reinstall_the_kernel_refuses_to_carry_over_keeps_the_previous_version(
    shared: Shared, case: str
) -> None:
    """T-8, R-4, docs/tools.md "How an install stays atomic" (a reinstall carries the local
    state over as hard links; an install that fails settles its own attempt: "nothing was
    installed, the previous version is still in place, and nothing of this attempt is
    left"): a user's tool in their own tier whose ``policy`` an administrator rewrote as
    root (``fs.protected_hardlinks`` keeps the user from linking it), or whose
    ``hooks/pre.d`` holding a hook the user made read-only.  The user's reinstall fails with
    the kernel's errno, exit 1, saying so; the previous version is whole and runs its old
    program, nothing hidden is left, the policy and the hook as they were."""
    w = shared
    first = w.users_manifest("mine", V1)
    assert w.as_user("object", "install", first, "--tier", "user").rc == 0
    tier = w.user_tier
    policy = tier / "mine.d" / "policy"
    pre = tier / "mine.d" / "hooks" / "pre.d"
    if case == "policy-rewritten-by-root":
        if Path("/proc/sys/fs/protected_hardlinks").read_text().strip() != "1":
            pytest.skip("fs.protected_hardlinks is off: the user may link root's file")
        policy.unlink()
        policy.write_text("allow coder_t tool:mine execute\n")
        policy.chmod(0o644)
    else:
        (pre / "10-ok").write_text("#!/bin/sh\nexit 0\n")
        os.chown(pre / "10-ok", w.user.uid, w.user.gid)
        (pre / "10-ok").chmod(0o755)
        pre.chmod(0o555)
    try:
        before = snapshot(tier)
        second = w.users_manifest("mine", V2)
        said = refused(
            w.as_user("object", "install", second, "--tier", "user"), CARRY_OVER[case], 1
        )
        assert said.startswith(f"cannot install {tier}/mine: "), said
        assert said.endswith(
            "nothing was installed, the previous version is still in place, and nothing of "
            "this attempt is left: correct that and run the command again"
        ), said
        assert snapshot(tier) == before and hidden(tier) == []
        assert (tier / "mine").read_text() == V1
    finally:
        pre.chmod(0o755)


@pytest.mark.parametrize(
    "case", ["a-file-only-root-may-read", "below-a-directory-it-may-not-search"]
)
def test_a_program_the_installer_itself_may_not_read_is_eacces_and_nothing_is_made(
    shared: Shared, case: str
) -> None:
    """T-8, ``ctx object check --help`` (``EACCES``: a program that was not read): a user's
    own manifest naming a program root keeps from them — mode 0600, or below a directory
    of mode 0700 — is one ``EACCES`` problem naming ``exec`` and the program for ``check``
    (text and ``--json``), and ``install --tier user`` refuses it, exit 1, with nothing
    made in the user's home."""
    w = shared
    manifest = w.users_manifest("closed")
    program = w.src / "closed.sh"
    if case == "a-file-only-root-may-read":
        os.chown(program, 0, 0)
        program.chmod(0o600)
    else:
        private = w.src / "private"
        private.mkdir(mode=0o700)
        shutil.move(program, private / "closed.sh")
        program = private / "closed.sh"
        manifest.write_text(json.dumps(document("closed", exec="private/closed.sh")))
    checked = w.as_user("object", "check", "--json", manifest)
    assert checked.rc == 1, checked
    [entry] = checked.json()
    assert entry["codes"] == ["EACCES"], entry
    assert entry["problems"] == [f"exec: {program} is not readable"], entry
    assert checked.err == f"{manifest}: EACCES: exec: {program} is not readable\n", checked
    said = refused(w.as_user("object", "install", manifest, "--tier", "user"), "EACCES", 1)
    assert said == f"{manifest}: exec: {program} is not readable", said
    home = w.user_tier.parent
    assert sorted(os.listdir(home)) == [], sorted(os.listdir(home))


def test_a_manifest_below_a_directory_the_user_may_not_search_is_one_eacces_line(
    shared: Shared,
) -> None:
    """T-8, docs/tools.md ("A manifest that cannot be read at all is one line with its own
    errno"): a manifest in a directory of mode 0700 of root's is, for a user, one
    ``EACCES`` line (``check``), ``error`` ``EACCES`` in ``--json`` with no problems, and an
    ``EACCES`` refusal of ``install`` with nothing made."""
    w = shared
    private = w.src / "locked"
    private.mkdir(mode=0o700)
    manifest = private / "m.json"
    manifest.write_text(json.dumps(document("m", exec="/bin/true")))
    checked = w.as_user("object", "check", manifest)
    assert (checked.rc, checked.out) == (1, ""), checked
    assert checked.err == (
        f"{manifest}: EACCES: cannot read {manifest}: Permission denied; nothing was checked "
        "or installed\n"
    ), checked
    [entry] = w.as_user("object", "check", "--json", manifest).json()
    assert (entry["valid"], entry["problems"], entry["codes"]) == (False, [], []), entry
    assert (entry["error"]["error"], entry["error"]["errno"]) == ("EACCES", errno.EACCES)
    refused(w.as_user("object", "install", manifest, "--tier", "user"), "EACCES", 1)
    assert sorted(os.listdir(w.user_tier.parent)) == []
