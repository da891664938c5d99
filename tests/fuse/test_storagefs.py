"""The mount's operations called directly, on a real directory tree (no kernel mount needed).

What the kernel's caches make hard to reach through a mount: a directory swapped for a
symbolic link between two requests must not lead the daemon, which runs as root for every
viewer, out of the storage root.
"""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

pyfuse3 = pytest.importorskip("pyfuse3", reason="pyfuse3 (the 'fuse' extra) is not installed")
trio = pytest.importorskip("trio")

from cortexfs.fuse.mount import StorageFS  # noqa: E402
from cortexfs.fuse.projection import Projection  # noqa: E402


def run(coroutine_function, *args):  # type: ignore[no-untyped-def]
    return trio.run(coroutine_function, *args)


def looked_up(storage: StorageFS, *names: str) -> int:
    """The inode of ``names`` below the root, looked up one by one as the kernel does."""
    inode = pyfuse3.ROOT_INODE
    for name in names:
        inode = run(storage.lookup, inode, name.encode()).st_ino
    return inode


@pytest.fixture
def fs(tmp_path: Path) -> tuple[StorageFS, Path]:
    root = tmp_path / "storage"
    (root / "home" / "0" / "d").mkdir(parents=True)
    (root / "home" / "0" / "d" / "mine").write_text("inside\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("outside the root\n")
    return StorageFS(root, Projection()), tmp_path


def test_a_directory_swapped_for_a_link_does_not_redirect_the_daemon(
    fs: tuple[StorageFS, Path],
) -> None:
    storage, tmp_path = fs
    d = looked_up(storage, "home", "0", "d")
    assert run(storage.lookup, d, b"mine").st_size == len("inside\n")

    swapped = tmp_path / "storage" / "home" / "0" / "d"
    (swapped / "mine").unlink()
    swapped.rmdir()
    swapped.symlink_to(tmp_path / "outside")

    with pytest.raises(pyfuse3.FUSEError) as refused:
        run(storage.lookup, d, b"secret")
    # ESTALE: the name no longer leads to d's inode; ELOOP/ENOTDIR: the link took d's inode
    # number, and the walk refuses it.
    assert refused.value.errno in (errno.ESTALE, errno.ELOOP, errno.ENOTDIR)
    with pytest.raises(pyfuse3.FUSEError):
        run(storage.opendir, d, None)


def test_a_link_is_described_never_followed(fs: tuple[StorageFS, Path]) -> None:
    storage, tmp_path = fs
    link = tmp_path / "storage" / "home" / "0" / "link"
    link.symlink_to(tmp_path / "outside" / "secret")
    zero = looked_up(storage, "home", "0")

    attributes = run(storage.lookup, zero, b"link")

    assert (attributes.st_mode & 0o170000) == 0o120000  # a symbolic link, as lstat sees it
    with pytest.raises(pyfuse3.FUSEError) as refused:
        run(storage.open, attributes.st_ino, os.O_RDONLY, None)
    assert refused.value.errno == errno.ELOOP


class Caller:
    """The part of a request's context the daemon reads: who asks."""

    uid, gid, pid, umask = os.getuid(), os.getgid(), os.getpid(), 0o022


class Fields:
    """Which attributes a ``setattr`` changes (the kernel's ``SetattrFields`` cannot be made)."""

    def __init__(self, **changed: bool) -> None:
        for field in ("size", "mode", "uid", "gid", "atime", "mtime", "ctime"):
            setattr(self, f"update_{field}", changed.get(f"update_{field}", False))


def test_a_file_unlinked_while_open_is_still_reached_through_its_descriptor(
    fs: tuple[StorageFS, Path],
) -> None:
    storage, _ = fs
    zero = looked_up(storage, "home", "0")
    opened, attributes = run(storage.create, zero, b"scratch", 0o644, os.O_RDWR, Caller())
    run(storage.write, opened.fh, 0, b"hello")
    run(storage.unlink, zero, b"scratch", Caller())

    assert run(storage.getattr, attributes.st_ino).st_size == len("hello")
    fields = Fields(update_size=True, update_mode=True)
    wanted = pyfuse3.EntryAttributes()
    wanted.st_size, wanted.st_mode = 2, 0o100600
    changed = run(storage.setattr, attributes.st_ino, wanted, fields, None, Caller())
    assert (changed.st_size, changed.st_mode & 0o777) == (2, 0o600)
    assert run(storage.read, opened.fh, 0, 10) == b"he"

    run(storage.release, opened.fh)
    with pytest.raises(pyfuse3.FUSEError) as stale:
        run(storage.getattr, attributes.st_ino)
    assert stale.value.errno == errno.ESTALE


def test_an_inode_the_kernel_forgets_is_forgotten(fs: tuple[StorageFS, Path]) -> None:
    storage, _ = fs
    zero = looked_up(storage, "home", "0")
    d = run(storage.lookup, zero, b"d").st_ino
    run(storage.lookup, zero, b"d")  # the kernel now holds two entries for it

    run(storage.forget, [(d, 1)])
    assert run(storage.getattr, d).st_ino == d  # one entry is still held
    run(storage.forget, [(d, 1)])
    with pytest.raises(pyfuse3.FUSEError) as stale:
        run(storage.getattr, d)
    assert stale.value.errno == errno.ESTALE
    assert run(storage.lookup, zero, b"d").st_ino == d  # a new lookup finds it again


def test_a_file_renamed_onto_a_known_name_is_not_acted_on_for_its_old_inode(
    fs: tuple[StorageFS, Path],
) -> None:
    """The kernel keeps an inode it looked up; a file renamed onto that name outside the
    mount (by anyone who may write the directory) is another file, which the daemon — root
    for every viewer — must neither read, write, chmod nor list for the old inode."""
    storage, tmp_path = fs
    d = tmp_path / "storage" / "home" / "0" / "d"
    mine = looked_up(storage, "home", "0", "d", "mine")
    theirs = d / "theirs"
    theirs.write_text("somebody else's\n")
    theirs.chmod(0o600)
    os.rename(theirs, d / "mine")  # outside the mount: the daemon's name now leads elsewhere
    (d / "sub").mkdir()
    sub = looked_up(storage, "home", "0", "d", "sub")
    (d / "other").mkdir()
    (d / "other" / "private-name").write_text("")
    (d / "sub").rmdir()
    os.rename(d / "other", d / "sub")

    wanted = pyfuse3.EntryAttributes()
    wanted.st_mode = 0o100666
    calls = [
        lambda: run(storage.open, mine, os.O_RDONLY, Caller()),
        lambda: run(storage.setattr, mine, wanted, Fields(update_mode=True), None, Caller()),
        lambda: run(storage.lookup, sub, b"private-name"),
        lambda: run(storage.opendir, sub, Caller()),
        lambda: run(storage.unlink, sub, b"private-name", Caller()),
    ]
    for call in calls:
        with pytest.raises(pyfuse3.FUSEError) as stale:
            call()
        assert stale.value.errno == errno.ESTALE
    assert (d / "mine").stat().st_mode & 0o777 == 0o600
    assert (d / "sub" / "private-name").exists()


def test_an_error_of_the_daemons_own_is_eio_said_on_stderr_and_the_mount_goes_on(
    fs: tuple[StorageFS, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A request that meets a bug of the daemon (here a file handle of the wrong type, which
    no kernel sends) is answered EIO with the traceback on stderr, not raised out of
    pyfuse3's main loop, which would end the mount for every process using it."""
    storage, _ = fs
    with pytest.raises(pyfuse3.FUSEError) as refused:
        run(storage.read, "not a handle", 0, 1)
    assert refused.value.errno == errno.EIO
    said = capsys.readouterr().err
    assert "ctx mount: read answered EIO for an error of its own:" in said, said
    assert "Traceback" in said, said
    assert run(storage.getattr, pyfuse3.ROOT_INODE).st_ino == pyfuse3.ROOT_INODE


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chattr +a; the daemon's chmod)")
def test_an_append_clears_the_set_user_id_bit_or_is_refused_with_nothing_written(
    fs: tuple[StorageFS, Path],
) -> None:
    """docs/mount.md, *Appends*: an append through the mount clears a file's set-user-ID
    bit, whoever writes.  An append-only file's bit cannot be cleared (``chattr +a``): the
    append is EPERM with nothing written, as the storage root refuses it, never bytes added
    to a file still set-user-ID."""
    storage, tmp_path = fs
    zero = tmp_path / "storage" / "home" / "0"
    for name in ("plain", "append-only"):
        (zero / name).write_text("one\n")
        os.chown(zero / name, 4321, 4322)  # another owner's, as the daemon is root
        (zero / name).chmod(0o4777)
    chattr = subprocess.run(["chattr", "+a", str(zero / "append-only")], capture_output=True)
    if chattr.returncode != 0:
        pytest.skip(f"chattr +a does not work here: {chattr.stderr.decode().strip()}")
    try:
        answers = {}
        for name in ("plain", "append-only"):
            node = looked_up(storage, "home", "0", name)
            opened = run(storage.open, node, os.O_WRONLY | os.O_APPEND, Caller())
            try:
                run(storage.write, opened.fh, 0, b"two\n")
                answers[name] = "ok"
            except pyfuse3.FUSEError as refused:
                answers[name] = errno.errorcode[refused.errno]
            finally:
                run(storage.release, opened.fh)
        mode = {name: oct((zero / name).stat().st_mode & 0o7777) for name in answers}
        content = {name: (zero / name).read_text() for name in answers}
    finally:
        subprocess.run(["chattr", "-a", str(zero / "append-only")], capture_output=True)
    assert answers == {"plain": "ok", "append-only": "EPERM"}
    assert mode == {"plain": "0o777", "append-only": "0o4777"}
    assert content == {"plain": "one\ntwo\n", "append-only": "one\n"}
