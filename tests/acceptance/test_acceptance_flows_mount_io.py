"""End-to-end flows of ``ctx mount`` (SPEC §13 F-1, T-5) used as an ordinary filesystem by
ordinary programs: ``git``, ``tar``, ``cp -a``, SQLite in WAL mode, concurrent ``O_APPEND``
writers, big directories and odd names, a mount process killed after ``fsync`` — through the
host's view and through an agent's view (``--as``), where the same programs work in the
agent's home and writable spaces and are refused, with nothing left behind, everywhere else.
What docs/mount.md says is not provided (symbolic links: ``ENOSYS``; extended attributes) is
checked as the refusal a program meets."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    ROOT_ENTRIES,
    ctx_mount,
    ctx_run,
    mounted_at,
    needs_fuse,
    needs_fuse_as_root,
    new_scratch_dir,
    scratch_top,
)
from tests.support.users import UnprivilegedUser, find_or_create_user

SCRATCH = scratch_top(__file__)
SPACE, READ_ONLY, HIDDEN = "team", "audit", "secret"
AGENT = "coder"

pytestmark = [needs_fuse_as_root, needs_fuse]  # a mount serving other uids needs root
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
needs_tar = pytest.mark.skipif(shutil.which("tar") is None, reason="tar is not installed")


# ------------------------------------------------------------------------------ helpers


def program_env(home: Path) -> dict[str, str]:
    """A clean environment for git and friends: no system git configuration, a global one
    written in ``home`` that trusts any repository's owner (a space's repository belongs to
    whoever made it; git drops ``-c`` settings when it runs ``upload-pack`` for a local
    clone), fixed author and dates, so a commit's hash depends only on what it holds."""
    config = home / "gitconfig"
    if not config.exists():
        config.write_text(
            "[safe]\n\tdirectory = *\n[init]\n\tdefaultBranch = main\n[gc]\n\tauto = 0\n"
        )
        config.chmod(0o644)
    stamp = "2026-06-22T12:00:00Z"
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(home),
        "LC_ALL": "C",
        "TZ": "UTC",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": str(config),
        "GIT_AUTHOR_NAME": "Tester",
        "GIT_AUTHOR_EMAIL": "tester@example.org",
        "GIT_COMMITTER_NAME": "Tester",
        "GIT_COMMITTER_EMAIL": "tester@example.org",
        "GIT_AUTHOR_DATE": stamp,
        "GIT_COMMITTER_DATE": stamp,
    }


def sh(
    argv: list[str],
    cwd: Path | None = None,
    user: UnprivilegedUser | None = None,
    input: bytes | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """``argv`` as root, or as ``user`` with its own group only (the agent's identity)."""
    ids = {}
    if user is not None:
        ids = {"user": user.uid, "group": user.gid, "extra_groups": [user.gid]}
    return subprocess.run(
        argv,
        cwd=cwd,
        input=input if input is not None else b"",
        capture_output=True,
        env=env or {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"},
        timeout=60,
        **ids,
    )


def ok(done: subprocess.CompletedProcess[bytes]) -> str:
    assert done.returncode == 0, (done.args, done.returncode, done.stderr.decode())
    return done.stdout.decode()


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def facts(top: Path) -> dict[bytes, tuple]:
    """Each entry under ``top`` (never following links): kind, mode, owner, mtime, content
    digest; and, for a file with several names, the sorted names of its inode (hard links)."""
    seen: dict[bytes, tuple] = {}
    by_inode: dict[int, list[bytes]] = {}
    root = os.fsencode(top)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                kind = "file"
                by_inode.setdefault(st.st_ino, []).append(rel)
            elif stat.S_ISLNK(st.st_mode):
                kind, digest = "link", os.readlink(path)
            else:
                kind, digest = "dir" if stat.S_ISDIR(st.st_mode) else "other", ""
            seen[rel] = (
                kind,
                stat.S_IMODE(st.st_mode),
                st.st_uid,
                st.st_gid,
                st.st_mtime_ns,
                digest,
            )
    for names in by_inode.values():
        for rel in names:
            seen[rel] = (*seen[rel], tuple(sorted(names)))
    return seen


def whole_seconds(seen: dict[bytes, tuple]) -> dict[bytes, tuple]:
    """:func:`facts` with mtimes cut to the second, as an archive in tar's format keeps them."""
    return {k: (*v[:4], v[4] // 10**9 * 10**9, *v[5:]) for k, v in seen.items()}


def tree_of(top: Path) -> dict[str, tuple]:
    """Kind and content of each entry under ``top``: what a side effect would change."""
    shown = {}
    for path in sorted(top.rglob("*")):
        st = path.lstat()
        content = path.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        shown[str(path.relative_to(top))] = (stat.S_IFMT(st.st_mode), st.st_mode, content)
    return shown


def make_source_tree(top: Path, *, symlink: bool, owner: tuple[int, int] | None) -> Path:
    """A project tree a user would archive: nested and empty directories, modes from 0600 to
    0755, a 1 MiB binary file, hard links, fixed mtimes, optionally a symbolic link and files
    of another owner."""
    src = top / "src"
    for d in range(6):
        for f in range(8):
            path = src / f"dir{d}" / f"sub{f % 2}" / f"file{f}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"dir {d} file {f}\n" * (f + 1))
            path.chmod((0o600, 0o640, 0o644, 0o755)[f % 4])
    (src / "empty" / "deeper").mkdir(parents=True)
    (src / "blob.bin").write_bytes(os.urandom(1 << 20))
    os.link(src / "dir0" / "sub0" / "file0.txt", src / "dir1" / "hard-link.txt")
    os.link(src / "dir0" / "sub0" / "file0.txt", src / "hard-link-2.txt")
    if symlink:
        os.symlink("dir0/sub0/file0.txt", src / "shortcut")
    if owner is not None:
        for path in (src / "dir2").rglob("*"):
            os.chown(path, *owner)
    then = 1_750_000_000
    for path in [*sorted(src.rglob("*"), reverse=True), src]:
        os.utime(
            path,
            ns=(then * 10**9, (then + len(path.parts)) * 10**9 + 123456789),
            follow_symlinks=False,
        )
    return src


def tar_create(directory: Path, archive: Path, user: UnprivilegedUser | None = None) -> bytes:
    ok(
        sh(
            [
                "tar",
                "--sort=name",
                "--numeric-owner",
                "-C",
                str(directory),
                "-cf",
                str(archive),
                ".",
            ],
            user=user,
        )
    )
    return archive.read_bytes()


def owners_left_out(directory: Path) -> list[str]:
    """``tar -c`` of ``directory`` to standard output in name order, every owner 0: two trees
    of the same content give the same bytes whoever extracted them."""
    return ["tar", "--sort=name", "--numeric-owner", "--owner=0", "--group=0", "-cf", "-",
            "-C", str(directory), "."]  # fmt: skip


@dataclass
class Team:
    """A storage root with spaces ``team`` (the agent may write) and ``audit`` (it may only
    read), a space ``secret`` it may not see, agent ``coder`` running as the unprivileged test
    user, and that user's home; the mount point lies where that user may search."""

    storage: Path
    view: Path
    user: UnprivilegedUser

    @property
    def home(self) -> Path:
        return self.storage / "home" / str(self.user.uid)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory of this file's own below /tmp, searchable by every uid."""
    path = new_scratch_dir(SCRATCH)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def host(searchable_storage: Path) -> tuple[Path, Path]:
    """(storage root with space ``team`` made by ``ctx shared create``, a mount point)."""
    r = ctx_run("shared", "create", SPACE, "--storage", searchable_storage)
    assert r.rc == 0, r
    return searchable_storage, searchable_storage.parent / "ctx"


@pytest.fixture
def team(searchable_storage: Path) -> Team:
    user = find_or_create_user()
    storage = searchable_storage
    for space in (SPACE, READ_ONLY, HIDDEN):
        r = ctx_run("shared", "create", space, "--group", str(user.gid), "--storage", storage)
        assert r.rc == 0, r
    req = {
        "name": AGENT,
        "label": f"{AGENT}_t",
        "tools": [],
        "shared": {SPACE: ["read", "write"], READ_ONLY: ["read"]},
    }
    r = ctx_run(
        "agent", "create", "--storage", storage, "--user", user.name, "-", input=json.dumps(req)
    )
    assert r.rc == 0, r
    home = storage / "home" / str(user.uid)  # R-4, made by the host as docs/sessions.md says
    home.mkdir(mode=0o755)
    os.chown(home, user.uid, user.gid)
    return Team(storage, storage.parent / "ctx", user)


# ------------------------------------------------------------------------- the host view


@needs_git
def test_git_init_add_commit_gc_through_the_host_view_is_a_sound_repository_on_disk(host, scratch):
    """F-1: a repository made and worked with plain ``git`` (init, add, commit, ``git mv`` of
    a directory, gc, fsck) in a space's ``data/`` through the mount is the repository a local
    disk gives: the same commit hashes, and a clean ``git fsck`` on the storage root itself."""
    storage, view = host
    env = program_env(scratch)

    def work(repo: Path) -> list[str]:
        ok(sh(["git", "init", "-q", str(repo)], env=env))
        for d in range(4):
            for f in range(10):
                path = repo / f"pkg{d}" / f"mod{f}.py"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(f"VALUE = {d * 10 + f}\n")
        (repo / "run.sh").write_text("#!/bin/sh\necho run\n")
        (repo / "run.sh").chmod(0o755)
        ok(sh(["git", "add", "-A"], cwd=repo, env=env))
        ok(sh(["git", "commit", "-q", "-m", "first"], cwd=repo, env=env))
        ok(sh(["git", "mv", "pkg0", "renamed"], cwd=repo, env=env))
        (repo / "pkg1" / "mod3.py").write_text("VALUE = 'changed'\n")
        ok(sh(["git", "commit", "-q", "-a", "-m", "second"], cwd=repo, env=env))
        ok(sh(["git", "gc", "-q", "--prune=now"], cwd=repo, env=env))
        ok(sh(["git", "fsck", "--full", "--strict", "--no-dangling"], cwd=repo, env=env))
        assert ok(sh(["git", "status", "--porcelain"], cwd=repo, env=env)) == ""
        return ok(sh(["git", "log", "--format=%H %s", "--name-status"], cwd=repo, env=env))

    local = work(scratch / "local-repo")
    with ctx_mount(storage, view):
        through = work(view / "shared" / SPACE / "data" / "repo")
        listed = ok(
            sh(["git", "ls-files", "-s"], cwd=view / "shared" / SPACE / "data" / "repo", env=env)
        )
    assert through == local
    assert "R100\tpkg0/mod0.py\trenamed/mod0.py" in through, through
    on_disk = storage / "shared" / SPACE / "data" / "repo"
    assert ok(sh(["git", "fsck", "--full", "--strict"], cwd=on_disk, env=env)) == ""
    assert ok(sh(["git", "log", "--format=%H %s", "--name-status"], cwd=on_disk, env=env)) == local
    assert ok(sh(["git", "ls-files", "-s"], cwd=on_disk, env=env)) == listed
    assert "100755" in listed and (on_disk / "run.sh").stat().st_mode & 0o111
    assert (on_disk / "renamed" / "mod9.py").read_text() == "VALUE = 9\n"
    assert not (on_disk / "pkg0").exists()
    assert list((on_disk / ".git" / "objects" / "pack").glob("*.pack"))


@needs_tar
def test_tar_extracts_into_the_host_view_and_archives_back_the_same_bytes(host, scratch):
    """F-1 and docs/mount.md: ``tar -x`` as root into the mount restores files, directories,
    owners, modes, mtimes and hard links as on a local disk; the one member it cannot make
    there, a symbolic link, fails with ENOSYS (``Function not implemented``) and nothing
    else; ``tar -c`` of the extracted tree gives back the very bytes of the archive."""
    storage, view = host
    plain = make_source_tree(scratch / "plain", symlink=False, owner=(4321, 4322))
    original = tar_create(plain, scratch / "plain.tar")
    linked = make_source_tree(scratch / "linked", symlink=True, owner=None)
    with_link = scratch / "linked.tar"
    tar_create(linked, with_link)
    data = view / "shared" / SPACE / "data"
    with ctx_mount(storage, view):
        (data / "x").mkdir()
        ok(sh(["tar", "-C", str(data / "x"), "-xf", str(scratch / "plain.tar")]))
        assert facts(data / "x") == whole_seconds(facts(plain))
        again = tar_create(data / "x", scratch / "again.tar")

        (data / "y").mkdir()
        refused = sh(["tar", "-C", str(data / "y"), "-xf", str(with_link)])
        assert refused.returncode == 2, refused
        complaints = refused.stderr.decode().strip().splitlines()
        assert "shortcut: Cannot create symlink" in complaints[0], complaints
        assert "Function not implemented" in complaints[0], complaints
        assert complaints[1:] == ["tar: Exiting with failure status due to previous errors"]
        expected = whole_seconds(facts(linked))
        del expected[b"shortcut"]
        assert facts(data / "y") == expected
    assert again == original
    assert facts(storage / "shared" / SPACE / "data" / "x") == whole_seconds(facts(plain))
    assert not (storage / "shared" / SPACE / "data" / "y" / "shortcut").exists()


def test_cp_a_in_and_out_of_the_host_view_keeps_every_attribute(host, scratch):
    """F-1: ``cp -a`` of a tree into the mount and back out keeps content, modes, owners,
    nanosecond mtimes and hard links; extended attributes, which docs/mount.md says the mount
    does not provide, are refused with EOPNOTSUPP, which ``cp -a`` tolerates."""
    storage, view = host
    src = make_source_tree(scratch, symlink=False, owner=(4321, 4322))
    data = view / "shared" / SPACE / "data"
    back = scratch / "back"
    with ctx_mount(storage, view):
        ok(sh(["cp", "-a", str(src), str(data / "copy")]))
        ok(sh(["cp", "-a", str(data / "copy"), str(back)]))
        through = facts(data / "copy")
        probe = data / "copy" / "blob.bin"
        with pytest.raises(OSError) as refused:
            os.setxattr(probe, "user.note", b"x")
        assert refused.value.errno == errno.EOPNOTSUPP
        with pytest.raises(OSError) as refused:
            os.listxattr(probe)
        assert refused.value.errno == errno.EOPNOTSUPP
        # statfs answers as the storage filesystem would: names of 255 bytes, real sizes.
        seen, behind = os.statvfs(view), os.statvfs(storage)
        assert seen.f_namemax == behind.f_namemax == 255
        assert (seen.f_bsize, seen.f_blocks) == (behind.f_bsize, behind.f_blocks)
        ok(sh(["rm", "-r", str(data / "copy" / "dir5")]))
    expected = facts(src)
    assert through == expected
    assert facts(back) == expected
    on_disk = facts(storage / "shared" / SPACE / "data" / "copy")
    assert on_disk == {k: v for k, v in expected.items() if not k.startswith(b"dir5")}


APPENDER = textwrap.dedent(
    """
    import os, sys
    path, tag, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    for i in range(count):
        os.write(fd, f"{tag} {i:06d} {tag * 150}\\n".encode())
    os.close(fd)
    """
)

SQL_WRITER = textwrap.dedent(
    """
    import sqlite3, sys
    db = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
    assert db.execute("pragma journal_mode=wal").fetchone()[0] == "wal"
    for i in range(int(sys.argv[3])):
        db.execute("begin immediate")
        n = db.execute("select count(*) from t").fetchone()[0]
        db.execute("insert into t values (?, ?, ?)", (sys.argv[2], i, n))
        db.execute("commit")
    db.close()
    """
)


def test_sqlite_wal_and_concurrent_appenders_through_the_host_view(host):
    """F-1 with S-5's appending rule: two processes doing SQLite transactions on one WAL
    database through the mount lose none, the database checks sound and reads the same from
    the storage root; two processes appending lines with ``O_APPEND`` at once lose no line
    and tear none."""
    storage, view = host
    data = view / "shared" / SPACE / "data"
    disk = storage / "shared" / SPACE / "data"
    with ctx_mount(storage, view):
        db_path = data / "app.db"
        with contextlib.closing(sqlite3.connect(db_path)) as db, db:
            db.execute("pragma journal_mode=wal")
            db.execute("create table t (who text, i integer, seen integer)")
        writers = [
            subprocess.Popen(
                [sys.executable, "-c", SQL_WRITER, str(db_path), who, "150"], stderr=subprocess.PIPE
            )
            for who in ("a", "b")
        ]
        log = data / "events.log"
        appenders = [
            subprocess.Popen(
                [sys.executable, "-c", APPENDER, str(log), tag, "3000"], stderr=subprocess.PIPE
            )
            for tag in ("A", "B")
        ]
        for proc in writers + appenders:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err.decode()
        with contextlib.closing(sqlite3.connect(db_path)) as db:
            assert db.execute("pragma integrity_check").fetchone() == ("ok",)
            rows = db.execute("select who, i, seen from t order by seen").fetchall()
        assert sorted(os.listdir(data)) == ["app.db", "events.log"]  # the WAL checkpointed
        lines = log.read_bytes().split(b"\n")
    # Each transaction saw every one committed before it: the counts run 0..299 once each.
    assert [seen for _, _, seen in rows] == list(range(300))
    for who in ("a", "b"):
        assert [i for w, i, _ in rows if w == who] == list(range(150))
    with contextlib.closing(sqlite3.connect(f"file:{disk / 'app.db'}?mode=ro", uri=True)) as db:
        assert db.execute("select count(*) from t").fetchone() == (300,)
    assert lines.pop() == b""
    assert len(lines) == 6000
    for tag in ("A", "B"):
        mine = [line for line in lines if line.startswith(tag.encode())]
        assert mine == [f"{tag} {i:06d} {tag * 150}".encode() for i in range(3000)]
    assert (disk / "events.log").stat().st_size == 6000 * (len("A 000000 ") + 151)


def test_bytes_fsynced_through_the_mount_survive_its_process_being_killed(host):
    """F-1 and docs/mount.md *Durability*: once ``fsync`` through the mount returns, the
    write is on the storage root: after the FUSE process is SIGKILLed (the mount then
    ``ENOTCONN`` until ``fusermount3 -u -z``), a file written and fsynced, and a file put in
    place by write, fsync, rename and directory fsync, hold every byte on disk."""
    storage, view = host
    payload = os.urandom(3 << 20) + b"THE END\n"
    small = b"committed by rename\n"
    with ctx_mount(storage, view) as mount:
        data = view / "shared" / SPACE / "data"
        fd = os.open(data / "big.bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
        for start in range(0, len(payload), 1 << 16):
            os.write(fd, payload[start : start + (1 << 16)])
        os.fsync(fd)
        temp = data / "state.json.tmp"
        fd2 = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd2, small)
        os.fsync(fd2)
        os.close(fd2)
        os.rename(temp, data / "state.json")
        fsync_path(data)

        mount.send_signal(signal.SIGKILL)  # the descriptor still open, no release sent
        mount.wait(timeout=10)
        with pytest.raises(OSError) as dead:
            os.listdir(view)
        assert dead.value.errno == errno.ENOTCONN
        with contextlib.suppress(OSError):
            os.close(fd)  # the mount is gone: nothing left to release
        lazy = subprocess.run(["fusermount3", "-u", "-z", str(view)], capture_output=True)
        assert lazy.returncode == 0, lazy.stderr
        assert not mounted_at(view)
    disk = storage / "shared" / SPACE / "data"
    assert sorted(os.listdir(disk)) == ["big.bin", "state.json"]
    assert (disk / "big.bin").read_bytes() == payload
    assert stat.S_IMODE((disk / "big.bin").stat().st_mode) == 0o640 & ~current_umask()
    assert (disk / "state.json").read_bytes() == small
    # A new mount of the same root serves it again, the same bytes.
    with ctx_mount(storage, view):
        assert (view / "shared" / SPACE / "data" / "state.json").read_bytes() == small


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# ------------------------------------------------------------------ readdir and names


def test_a_directory_of_5000_entries_with_long_and_non_utf8_names_lists_completely(team):
    """F-1, T-5: a directory of 5 000 entries — some with names of 255 bytes, some not UTF-8
    — is listed whole, each name once, by ``os.scandir``, ``ls -f`` and ``find`` through
    the host's view and through the view of an agent that may read the space; a name of 255
    bytes and a name that is not UTF-8 are made through the mount byte for byte, one of 256
    bytes is ``ENAMETOOLONG``."""
    storage, view = team.storage, team.view
    many = storage / "shared" / READ_ONLY / "data" / "many"
    many.mkdir()
    names = {f"entry-{i:05d}".encode() for i in range(4960)}
    names |= {f"{i:02d}".encode() + b"L" * 253 for i in range(20)}
    names |= {b"caf\xe9-" + bytes([0x80 + i]) + b"\xff.txt" for i in range(20)}
    assert len(names) == 5000
    for name in names:
        os.close(os.open(os.path.join(os.fsencode(many), name), os.O_CREAT | os.O_WRONLY, 0o644))

    def listings(directory: Path, user: UnprivilegedUser | None) -> list[list[bytes]]:
        shown = []
        code = (
            "import os, sys\nfor e in os.scandir(os.fsencode(sys.argv[1])):\n"
            "    sys.stdout.buffer.write(e.name + b'\\0')"
        )
        for argv in (
            [sys.executable, "-c", code, str(directory)],
            ["ls", "-f", "-A", "--zero", str(directory)],
            ["find", str(directory), "-mindepth", "1", "-maxdepth", "1", "-printf", "%f\\0"],
        ):
            done = sh(argv, user=user)
            assert done.returncode == 0, (argv, done.stderr)
            shown.append(done.stdout.split(b"\0")[:-1])
        return shown

    rel = Path("shared") / READ_ONLY / "data" / "many"
    with ctx_mount(storage, view):
        for listed in listings(view / rel, None):
            assert len(listed) == 5000 and set(listed) == names
        data = os.fsencode(view / "shared" / SPACE / "data")
        longest = b"Z" * 255
        odd = b"r\xe9sum\xe9-\xfe.txt"
        for name in (longest, odd):
            with open(os.path.join(data, name), "wb") as f:
                f.write(name)
        with pytest.raises(OSError) as refused:
            os.open(os.path.join(data, b"Z" * 256), os.O_CREAT | os.O_WRONLY, 0o644)
        assert refused.value.errno == errno.ENAMETOOLONG
        assert sorted(os.listdir(data)) == sorted([longest, odd])
    disk = os.fsencode(storage / "shared" / SPACE / "data")
    assert sorted(os.listdir(disk)) == sorted([longest, odd])
    for name in (longest, odd):
        with open(os.path.join(disk, name), "rb") as f:
            assert f.read() == name
    with ctx_mount(storage, view, "--as", AGENT):
        for listed in listings(view / rel, team.user):
            assert len(listed) == 5000 and set(listed) == names


@needs_git
def test_programs_that_delete_what_they_list_empty_a_big_directory_through_the_mount(host):
    """F-1: a mount used "as the storage root" must let the ordinary idiom of reading a
    directory while removing its entries (``git clean -fdx``, a ``scandir`` + ``unlink``
    loop) remove them all, as on a local disk: POSIX leaves unspecified only the entries
    added or removed meanwhile, never the ones still to be read."""
    storage, view = host
    disk = storage / "shared" / SPACE / "data"
    env = program_env(disk.parent)
    ok(sh(["git", "init", "-q", str(disk / "repo")], env=env))
    for directory in (disk / "repo" / "build", disk / "spool"):
        directory.mkdir()
        for i in range(3000):
            os.close(os.open(directory / f"o-{i:05d}", os.O_CREAT | os.O_WRONLY, 0o644))
    with ctx_mount(storage, view):
        data = view / "shared" / SPACE / "data"
        cleaned = sh(["git", "clean", "-fdxq"], cwd=data / "repo", env=env)
        removed = 0
        for entry in os.scandir(data / "spool"):
            os.unlink(entry.path)
            removed += 1
    assert (removed, os.listdir(disk / "spool")) == (3000, [])
    assert cleaned.returncode == 0, cleaned.stderr
    assert not (disk / "repo" / "build").exists()


def test_a_listing_shows_each_untouched_entry_once_while_others_come_and_go(host):
    """F-1: while one process reads a directory through the mount, another removes some of
    its entries and adds others (a queue's ``pending/`` as workers claim and publish, a
    spool): each entry that stays there the whole time is listed exactly once, as on the
    storage root itself."""
    storage, view = host
    disk = storage / "shared" / SPACE / "data" / "spool"
    disk.mkdir()
    stable = {f"m-stable-{i:05d}" for i in range(2000)}
    for name in stable | {f"a-gone-{i:05d}" for i in range(1000)}:
        os.close(os.open(disk / name, os.O_CREAT | os.O_WRONLY, 0o644))

    def listed_while_changing(directory: Path) -> list[str]:
        seen = []
        with os.scandir(directory) as entries:
            for n, entry in enumerate(entries):
                seen.append(entry.name)
                if n == 10:  # the others, removed and added once the listing has begun
                    for i in range(1000):
                        os.unlink(disk / f"a-gone-{i:05d}")
                        os.close(os.open(disk / f"z-new-{i:05d}", os.O_CREAT | os.O_WRONLY))
        return [name for name in seen if name.startswith("m-stable-")]

    local = listed_while_changing(disk)  # the storage root itself: the reference
    assert sorted(local) == sorted(stable)
    for name in os.listdir(disk):  # back to the state the listing began with
        if name.startswith("z-new-"):
            os.rename(disk / name, disk / name.replace("z-new-", "a-gone-"))
    with ctx_mount(storage, view):
        through = listed_while_changing(view / "shared" / SPACE / "data" / "spool")
    assert len(through) == len(set(through)) == 2000, (len(through), len(set(through)))
    assert set(through) == stable


# ------------------------------------------------------------------------ an agent's view

AGENT_SCRIPT = textwrap.dedent(
    """
    import errno, json, os, sqlite3, sys
    view, uid = sys.argv[1], sys.argv[2]
    home = f"{view}/home/{uid}"
    ro = f"{view}/shared/audit/data"
    out = {}

    def code(action):
        try:
            action()
        except OSError as e:
            return errno.errorcode[e.errno]
        return "ok"

    # SQLite with WAL in its home: transactions, then read back.
    db = sqlite3.connect(f"{home}/notes.db", isolation_level=None)
    out["journal"] = db.execute("pragma journal_mode=wal").fetchone()[0]
    db.execute("create table n (k integer primary key, v text)")
    for i in range(50):
        db.execute("begin")
        db.execute("insert into n (v) values (?)", (f"note {i}",))
        db.execute("commit")
    out["rows"] = db.execute("select count(*) from n").fetchone()[0]
    out["integrity"] = db.execute("pragma integrity_check").fetchone()[0]
    db.close()

    # An editor's save: a reader holds the old file while the new one is renamed over it.
    with open(f"{home}/doc.txt", "w") as f:
        f.write("version 1\\n")
    reader = open(f"{home}/doc.txt")
    with open(f"{home}/doc.txt.tmp", "w") as f:
        f.write("version 2\\n")
        f.flush()
        os.fsync(f.fileno())
    os.rename(f"{home}/doc.txt.tmp", f"{home}/doc.txt")
    out["old_reader"] = reader.read()
    reader.close()
    out["new_reader"] = open(f"{home}/doc.txt").read()
    os.makedirs(f"{home}/a/inner")
    os.mkdir(f"{home}/b")
    os.rename(f"{home}/a", f"{home}/b")  # a directory over an empty one
    os.mkdir(f"{home}/c")
    open(f"{home}/c/keep", "w").close()
    out["over_full_dir"] = code(lambda: os.rename(f"{home}/b", f"{home}/c"))
    out["symlink_home"] = code(lambda: os.symlink("doc.txt", f"{home}/link"))
    out["hard_link_home"] = code(lambda: os.link(f"{home}/doc.txt", f"{home}/doc.bak"))

    # Where it may read but not write; where it may not see; the root and tool/.
    out["ro_create"] = code(lambda: os.close(os.open(f"{ro}/new", os.O_CREAT | os.O_WRONLY)))
    # "mine" is the agent's own file, mode 0644: the mode bits let it change it, the view not.
    out["ro_write"] = code(lambda: os.close(os.open(f"{ro}/mine", os.O_WRONLY)))
    out["ro_append"] = code(lambda: os.close(os.open(f"{ro}/mine", os.O_WRONLY | os.O_APPEND)))
    out["ro_truncate"] = code(lambda: os.truncate(f"{ro}/mine", 0))
    out["ro_mkdir"] = code(lambda: os.mkdir(f"{ro}/d"))
    out["ro_rename_over"] = code(lambda: os.rename(f"{home}/doc.txt", f"{ro}/report"))
    out["ro_rename_out"] = code(lambda: os.rename(f"{ro}/mine", f"{home}/mine"))
    out["ro_unlink"] = code(lambda: os.unlink(f"{ro}/mine"))
    out["ro_chmod"] = code(lambda: os.chmod(f"{ro}/mine", 0o666))
    out["ro_utime"] = code(lambda: os.utime(f"{ro}/mine", (1, 1)))
    out["ro_link_in"] = code(lambda: os.link(f"{home}/doc.txt", f"{ro}/doc"))
    out["ro_read"] = open(f"{ro}/report").read()
    out["hidden"] = code(lambda: os.stat(f"{view}/shared/secret"))
    out["hidden_create"] = code(lambda: open(f"{view}/shared/secret/data/x", "w"))
    out["tool_create"] = code(lambda: open(f"{view}/tool/mine", "w"))
    out["root_create"] = code(lambda: os.mkdir(f"{view}/audit"))
    out["sqlite_ro"] = "ok"
    try:
        sqlite3.connect(f"{ro}/new.db").execute("create table t (x)")
    except sqlite3.OperationalError as e:
        out["sqlite_ro"] = str(e)
    print(json.dumps(out))
    """
)


@needs_git
@needs_tar
def test_an_agent_uses_git_tar_and_sqlite_where_it_may_write_and_is_refused_elsewhere(
    team, scratch
):
    """F-1, T-5 and docs/mount.md: through ``ctx mount --as coder``, the agent's own uid runs
    git (init, commit, clone of a repository in a space it may only read), ``tar -x``/``-c``,
    SQLite in WAL mode, an editor's rename-over save and directory renames in its home and
    in the space it may write, as on a local disk; in the read-only space every change is
    EACCES (git, tar, mv, sqlite fail), the hidden space is ENOENT, the root and ``tool/``
    take nothing, a symbolic link is ENOSYS; and nothing changes on the storage root but what
    the agent wrote where it may."""
    storage, view, user = team.storage, team.view, team.user
    env = program_env(scratch)
    upstream = storage / "shared" / READ_ONLY / "data" / "upstream"
    ok(sh(["git", "init", "-q", str(upstream)], env=env))
    (upstream / "README").write_text("from the auditors\n")
    ok(sh(["git", "add", "README"], cwd=upstream, env=env))
    ok(sh(["git", "commit", "-q", "-m", "audit baseline"], cwd=upstream, env=env))
    head = ok(sh(["git", "rev-parse", "HEAD"], cwd=upstream, env=env)).strip()
    report = storage / "shared" / READ_ONLY / "data" / "report"
    report.write_text("read only\n")
    report.chmod(0o664)  # the mode bits would let the group write: the view must not
    os.chown(report, 0, user.gid)
    mine = report.with_name("mine")  # written by the agent when it could still write there
    mine.write_text("the agent's own\n")
    os.chown(mine, user.uid, user.gid)
    src = make_source_tree(scratch / "t", symlink=False, owner=None)
    archive = scratch / "project.tar"
    original = tar_create(src, archive)
    protected = [storage / p for p in ("agent", "tool", "bin", "model")] + [
        storage / "shared" / name for name in (READ_ONLY, HIDDEN, "cortexfs-docs")
    ]
    before = {str(p): tree_of(p) for p in protected}
    team_before = tree_of(storage / "shared" / SPACE)

    home = view / "home" / str(user.uid)
    space = view / "shared" / SPACE / "data"
    genv = program_env(scratch)
    with ctx_mount(storage, view, "--as", AGENT):
        # git in its home and in the writable space; a clone of the read-only space's repo.
        ok(sh(["git", "init", "-q", str(home / "repo")], user=user, env=genv))
        for argv in (
            ["sh", "-c", "echo x > x.txt"],
            ["git", "add", "x.txt"],
            ["git", "commit", "-q", "-m", "mine"],
        ):
            ok(sh(argv, cwd=home / "repo", user=user, env=genv))
        assert ok(sh(["git", "log", "--format=%s"], cwd=home / "repo", user=user, env=genv)) == (
            "mine\n"
        )
        ro_repo = view / "shared" / READ_ONLY / "data" / "upstream"
        assert ok(sh(["git", "log", "--format=%H"], cwd=ro_repo, user=user, env=genv)).strip() == (
            head
        )
        ok(sh(["git", "clone", "-q", str(ro_repo), str(space / "clone")], user=user, env=genv))
        cloned = ok(sh(["git", "rev-parse", "HEAD"], cwd=space / "clone", user=user, env=genv))
        assert cloned.strip() == head
        ok(sh(["git", "fsck", "--full"], cwd=space / "clone", user=user, env=genv))
        refused = sh(["git", "init", "-q", str(ro_repo.parent / "new-repo")], user=user, env=genv)
        assert refused.returncode != 0 and b"Permission denied" in refused.stderr, refused
        refused = sh(
            ["git", "commit", "--allow-empty", "-q", "-m", "x"], cwd=ro_repo, user=user, env=genv
        )
        assert refused.returncode != 0 and b"Permission denied" in refused.stderr, refused

        # tar in and out of its home, the same bytes; refused in the read-only space.
        ok(sh(["mkdir", str(home / "unpacked")], user=user))
        ok(sh(["tar", "-xpf", str(archive), "-C", str(home / "unpacked")], user=user))
        again = sh(owners_left_out(home / "unpacked"), user=user)
        refused = sh(["tar", "-xf", str(archive), "-C", str(ro_repo.parent)], user=user)
        assert refused.returncode == 2 and b"Permission denied" in refused.stderr, refused
        moved = sh(["mv", str(ro_repo.parent / "report"), str(home / "report")], user=user)
        assert moved.returncode != 0 and b"Permission denied" in moved.stderr, moved
        ok(sh(["mv", str(home / "unpacked" / "dir3"), str(space / "dir3")], user=user))

        script = sh([sys.executable, "-c", AGENT_SCRIPT, str(view), str(user.uid)], user=user)
        out = json.loads(ok(script))
        assert sorted(os.listdir(view)) == sorted(ROOT_ENTRIES)
        shown = sorted(os.listdir(view / "shared" / READ_ONLY / "data"))
        assert shown == ["mine", "report", "upstream"]

    assert again.returncode == 0, again.stderr
    reference = scratch / "reference"
    reference.mkdir()
    os.chown(reference, user.uid, user.gid)
    ok(sh(["tar", "-xpf", str(archive), "-C", str(reference)], user=user))
    local = sh(owners_left_out(reference), user=user)
    assert again.stdout == local.stdout, "the agent's home extracts as a local disk does"
    assert len(original) > 1 << 20

    assert out["journal"] == "wal" and out["rows"] == 50 and out["integrity"] == "ok", out
    assert (out["old_reader"], out["new_reader"]) == ("version 1\n", "version 2\n"), out
    assert out["over_full_dir"] in ("ENOTEMPTY", "EEXIST"), out
    assert out["symlink_home"] == "ENOSYS", out
    assert out["hard_link_home"] == "ok", out
    for key in (
        "ro_create",
        "ro_write",
        "ro_append",
        "ro_truncate",
        "ro_mkdir",
        "ro_rename_over",
        "ro_rename_out",
        "ro_unlink",
        "ro_chmod",
        "ro_utime",
        "ro_link_in",
    ):
        assert out[key] == "EACCES", (key, out)
    assert out["ro_read"] == "read only\n", out
    assert (out["hidden"], out["hidden_create"]) == ("ENOENT", "ENOENT"), out
    assert out["tool_create"] == "EACCES", out
    assert out["root_create"] == "EACCES", out
    assert out["sqlite_ro"] == "unable to open database file", out

    # On the storage root: what it wrote where it may, as its own; nothing anywhere else.
    assert {str(p): tree_of(p) for p in protected} == before
    disk_home = team.home
    assert (disk_home / "doc.txt").read_text() == "version 2\n"
    assert (disk_home / "doc.bak").stat().st_ino == (disk_home / "doc.txt").stat().st_ino
    assert (disk_home / "b" / "inner").is_dir() and not (disk_home / "a").exists()
    assert not (disk_home / "link").exists() and not (disk_home / "report").exists()
    assert (disk_home / "notes.db").stat().st_uid == user.uid
    assert sorted(p.name for p in disk_home.iterdir()) == sorted(
        ["repo", "unpacked", "notes.db", "doc.txt", "doc.bak", "b", "c"]
    )
    disk_space = storage / "shared" / SPACE / "data"
    assert (disk_space / "dir3" / "sub0" / "file0.txt").is_file()
    assert not (disk_home / "unpacked" / "dir3").exists()
    st = (disk_space / "clone").stat()
    assert (st.st_uid, st.st_gid) == (user.uid, user.gid)  # setgid space: its group
    assert st.st_mode & stat.S_ISGID
    team_after = tree_of(storage / "shared" / SPACE)
    changed = {
        k for k in set(team_before) | set(team_after) if team_before.get(k) != team_after.get(k)
    }
    assert changed and all(k == "data" or k.startswith("data/") for k in changed), changed
