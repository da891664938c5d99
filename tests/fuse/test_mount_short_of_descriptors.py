"""A daemon short of file descriptors answers EMFILE, as any process short of them does,
never a bug's EIO and never a quieter answer (SPEC F-1; docs/mount.md, *Errors of its own*).

The daemon opens a descriptor or more for nearly every request (it walks each path itself),
so a ``ulimit -n`` that lets it mount may leave it none for a request: the caller then gets
EMFILE and may try again; the mount goes on serving.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from tests.fuse.support import NEEDS_A_MOUNT, mounted
from tests.tools.support import World

pytestmark = NEEDS_A_MOUNT

TEAM_GID = 4322  # the group of the setgid directory, one the caller is in
MOST_SPARE = 30  # far more than any request needs

# Each request of the daemon's, made with SPARE descriptors left to it for SPARE = 0, 1…
# until all are answered: the answer ("ok" or the errno's name) of each, by SPARE, as JSON on
# standard output.  The requests go to the view of agent sys.argv[3], or the host's ("").
STARVED = r"""
import errno, json, os, resource, sys, time
import pyfuse3, trio
from pathlib import Path
from cortexfs.agents.projection import FRESH_SECONDS
from cortexfs.fuse.mount import StorageFS
from cortexfs.fuse.projection import AgentProjection, Projection

root, home, agent = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
most, team_gid, caller_uid = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
os.setgroups([team_gid])  # the caller below is this process, in the space's group

class Caller:  # an agent's view serves its agent's uid (P-5 step 1)
    uid, gid, pid, umask = caller_uid, 4321, os.getpid(), 0o022

class Mode:
    update_mode = True
    update_size = update_uid = update_gid = update_atime = update_mtime = False

async def main():
    storage = StorageFS(root, AgentProjection(root, agent) if agent else Projection())
    async def node(*names):
        inode = pyfuse3.ROOT_INODE
        for name in names:
            inode = (await storage.lookup(inode, name.encode())).st_ino
        return inode
    home_node = await node("home", home)
    team = await node("home", home, "team")
    file = await node("home", home, "file")
    link = await node("home", home, "link")
    chmod = pyfuse3.EntryAttributes()
    chmod.st_mode = 0o100640
    answers = {}
    for spare in range(most + 1):
        requests = {
            "lookup": lambda: storage.lookup(home_node, b"file"),
            "getattr": lambda: storage.getattr(file),
            "readlink": lambda: storage.readlink(link, Caller()),
            "open": lambda: storage.open(file, os.O_RDONLY, Caller()),
            "opendir": lambda: storage.opendir(home_node, Caller()),
            "setattr": lambda: storage.setattr(file, chmod, Mode(), None, Caller()),
            "create": lambda: storage.create(team, f"c{spare}".encode(), 0o2755, os.O_WRONLY,
                                             Caller()),
            "mkdir": lambda: storage.mkdir(team, f"d{spare}".encode(), 0o755, Caller()),
        }
        time.sleep(FRESH_SECONDS)  # an agent's controls are read again, short of descriptors
        fillers = []
        try:
            while True:
                fillers.append(os.open("/dev/null", os.O_RDONLY))
        except OSError as exc:
            assert exc.errno == errno.EMFILE, exc
        for _ in range(spare):
            os.close(fillers.pop())
        got = {}
        try:
            for name, request in requests.items():
                try:
                    done = await request()
                except pyfuse3.FUSEError as refused:
                    got[name] = errno.errorcode[refused.errno]
                else:
                    got[name] = "ok"
                    if name in ("create", "open"):
                        await storage.release((done[0] if name == "create" else done).fh)
        finally:
            for fd in fillers:
                os.close(fd)
        answers[spare] = got
        if set(got.values()) == {"ok"}:
            break
    print(json.dumps(answers))

trio.run(main)
"""


@pytest.mark.parametrize("agent", ["", "coder"], ids=["host view", "agent view"])
def test_each_request_of_a_daemon_out_of_descriptors_is_emfile_with_nothing_left(
    world: World, agent: str
) -> None:
    """With no descriptor left the daemon answers each request EMFILE, with 1, 2… left
    EMFILE or the answer it gives with many; never EIO with a traceback (the walk from the
    root's descriptor once opened its first directory unguarded, and an agent's controls
    are read with descriptors of the policy library's), and never an answer that quietly
    does less: a file made in a setgid directory with the set-group-ID bit keeps it (the
    caller is in the group) or is EMFILE and not left behind, even where the caller's
    groups cannot be read for want of a descriptor."""
    if agent:
        world.agent(agent)
    home = world.root / "home" / str(world.user.uid)
    team = home / "team"
    team.mkdir(parents=True)
    os.chown(team, 0, TEAM_GID)
    team.chmod(0o2777)
    (home / "file").write_text("contents\n")
    (home / "link").symlink_to("file")

    done = subprocess.run(
        [sys.executable, "-c", STARVED, str(world.root), home.name, agent, str(MOST_SPARE),
         str(TEAM_GID), str(world.user.uid if agent else 4321)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert "answered EIO" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    answers = {int(spare): got for spare, got in json.loads(done.stdout).items()}
    assert set(answers[0].values()) == {"EMFILE"}, answers[0]
    assert set(answers[max(answers)].values()) == {"ok"}, answers
    for spare, got in answers.items():
        assert set(got.values()) <= {"ok", "EMFILE"}, (spare, got)
        made, directory = team / f"c{spare}", team / f"d{spare}"
        if got["create"] == "ok":
            assert made.stat().st_mode & 0o7777 == 0o2755, (spare, oct(made.stat().st_mode))
        else:
            assert not made.exists(), spare
        assert directory.is_dir() == (got["mkdir"] == "ok"), spare


def test_a_listing_the_daemon_cannot_go_on_with_is_emfile_never_cut_short(world: World) -> None:
    """A directory listed in several reads, while the daemon's descriptors are all taken by
    files open through the mount: the next read is EMFILE, not the end of the listing (a
    listing cut short reads as complete: ``rm -r`` then meets ENOTEMPTY, a backup misses
    files); once they are closed, the listing is whole.  Every open by name asks the daemon
    for two descriptors at once, and a listing going on for one (its entries are read in
    the directory it holds open): the last one is taken by reopening a file unlinked while
    open, which asks for one alone."""
    many = world.root / "home" / "0" / "many"
    many.mkdir(parents=True, exist_ok=True)
    names = {f"an-entry-with-a-rather-long-name-{i:04d}" for i in range(300)}
    for name in names:
        (many / name).touch()
    held = world.root / "home" / "0" / "held"
    held.mkdir()
    for i in range(200):
        (held / f"f{i}").touch()
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint, open_files=40) as daemon:
        through = mountpoint / "home" / "0"
        listing = os.scandir(through / "many")
        seen = {next(listing).name}
        opened = [os.open(through / "held" / "f0", os.O_RDONLY)]
        os.unlink(through / "held" / "f0")
        try:
            with pytest.raises(OSError) as starved:
                for i in range(1, 200):
                    opened.append(os.open(through / "held" / f"f{i}", os.O_RDONLY))
            assert starved.value.errno == errno.EMFILE
            opened.append(os.open(f"/proc/self/fd/{opened[0]}", os.O_RDONLY))
            with pytest.raises(OSError) as refused:
                seen |= {entry.name for entry in listing}
            assert refused.value.errno == errno.EMFILE, len(seen)
        finally:
            listing.close()
            for fd in opened:
                os.close(fd)
        assert set(os.listdir(through / "many")) == names
        os.set_blocking(daemon.stderr.fileno(), False)  # type: ignore[union-attr]
        try:
            said = os.read(daemon.stderr.fileno(), 65536).decode()  # type: ignore[union-attr]
        except BlockingIOError:
            said = ""  # nothing said at all
    assert "Traceback" not in said, said
    assert daemon.returncode == 0
