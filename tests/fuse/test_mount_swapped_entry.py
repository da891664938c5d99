"""A name the kernel still holds an entry for, swapped on the storage root by a uid who may
write its directory, never stalls the daemon nor makes it act on the file now there (SPEC F-1;
docs/mount.md, *Names*).

The kernel keeps a name's entry for half a second (``ENTRY_TIMEOUT``) and, within that time,
opens the file it knows by its node without looking the name up again.  The daemon serves
every uid from one thread: had it opened the name as it now is, a FIFO put there would keep it
waiting for a writer, and every caller of the mount (and ``ctx umount``) waiting behind it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cortexfs.fuse.mount import ENTRY_TIMEOUT
from cortexfs.fuse.mounts import mounted_type
from tests.fuse.support import NEEDS_A_MOUNT, mounted
from tests.support.users import UnprivilegedUser
from tests.tools.support import World

pytestmark = NEEDS_A_MOUNT

ANSWER_SECONDS = 5  # a daemon that answers at all answers a stat in far less

# Run as the agent's uid: the file made on the storage root and read through the mount, so
# that the kernel holds its entry; then swapped there, and opened through the mount again
# within the entry's time.  The seconds between the read and the swap are printed first.
SWAP_THEN_OPEN = """
import os, sys, time
direct, through, swap, flags = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
with open(direct, "w") as file:
    file.write("the agent's file\\n")
with open(through) as file:
    file.read()
read_at = time.monotonic()
if swap == "fifo":
    os.unlink(direct)
    os.mkfifo(direct)
else:
    os.rename(swap, direct)
print(f"{time.monotonic() - read_at:.3f}", flush=True)
try:
    os.close(os.open(through, flags))
    print("opened", flush=True)
except OSError as exc:
    print(exc.errno, flush=True)
"""


def swapping(
    user: UnprivilegedUser, direct: Path, through: Path, swap: str, flags: int
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups",
         sys.executable, "-c", SWAP_THEN_OPEN, str(direct), str(through), swap, str(flags)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def line_within(process: subprocess.Popen[str], seconds: float) -> str | None:
    """The next line ``process`` prints, or None when none comes within ``seconds``."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], seconds)
    return process.stdout.readline().strip() if ready else None


def rest_of(process: subprocess.Popen[str]) -> str:
    """What ``process`` prints after the line :func:`line_within` read, once it has ended.
    Read through the same file object: its buffer may hold that line already, which
    ``communicate`` (reading the descriptor) would never see."""
    assert process.stdout is not None
    process.wait(timeout=30)
    return process.stdout.read()


def answers(path: Path) -> bool:
    """Whether the mount answers a stat of ``path`` within :data:`ANSWER_SECONDS`, asked by
    another process: one stuck on the mount could not be given up on in this one."""
    try:
        subprocess.run(["stat", str(path)], capture_output=True, timeout=ANSWER_SECONDS)
    except subprocess.TimeoutExpired:
        return False
    return True


@contextlib.contextmanager
def ended_whatever_happens(
    daemon: subprocess.Popen[str], mountpoint: Path, swapper: subprocess.Popen[str]
) -> Iterator[None]:
    """A daemon still stuck at the end is killed and its mount removed, so that a failure
    leaves no mount behind (the agent's process, waiting on the daemon, ends with it)."""
    try:
        yield
    except BaseException:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGKILL)
            daemon.wait(timeout=30)
        if mounted_type(Path(os.path.abspath(mountpoint))):
            subprocess.run(["umount", "--lazy", str(mountpoint)], check=False)
        raise
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            swapper.kill()
            swapper.wait(timeout=10)


@pytest.fixture
def agents_home(world: World) -> Path:
    home = world.root / "home" / str(world.user.uid)
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, world.user.uid, world.user.gid)
    return home


def test_a_file_swapped_for_a_fifo_behind_the_kernels_entry_does_not_stall_the_mount(
    world: World, agents_home: Path
) -> None:
    """Every other request is answered, and ``ctx umount`` unmounts, while the agent's own
    open waits (if at all) on its FIFO, not on the daemon."""
    mountpoint = world.scratch / "ctx"
    through = mountpoint / "home" / str(world.user.uid) / "f"
    with mounted(world.root, mountpoint) as daemon:
        swapper = swapping(world.user, agents_home / "f", through, "fifo", os.O_RDONLY)
        with ended_whatever_happens(daemon, mountpoint, swapper):
            swapped_after = line_within(swapper, 30)
            assert swapped_after is not None, swapper.stderr
            # Within the entry's time: the kernel opens the node it knows, not the FIFO.
            assert float(swapped_after) < ENTRY_TIMEOUT / 2, "too slow to test anything"
            time.sleep(0.5)  # the open has reached the daemon, and the entry has expired
            assert answers(mountpoint / "bin"), "the mount stopped answering"
            assert answers(mountpoint / "home" / str(world.user.uid)), "stopped answering"
            swapper.kill()  # waiting on its own FIFO, if anywhere
            swapper.wait(timeout=ANSWER_SECONDS)
            unmounted = subprocess.run(
                [sys.executable, "-m", "cortexfs", "umount", str(mountpoint)],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert unmounted.returncode == 0, unmounted.stderr
            daemon.wait(timeout=30)
    assert daemon.returncode == 0, daemon.stderr
    assert (agents_home / "f").is_fifo()  # left as the agent made it


def test_a_file_swapped_behind_the_kernels_entry_is_not_truncated_by_an_open_with_o_trunc(
    world: World, agents_home: Path
) -> None:
    """The kernel let the agent truncate the file it knew (the agent's own); the daemon,
    root, must not empty the file that has since taken the name, one the agent may not
    write, before it finds that it is another file."""
    precious = agents_home / "precious"
    precious.write_text("root's, not the agent's to empty\n")
    precious.chmod(0o644)
    mountpoint = world.scratch / "ctx"
    through = mountpoint / "home" / str(world.user.uid) / "f"
    flags = os.O_WRONLY | os.O_TRUNC
    with mounted(world.root, mountpoint) as daemon:
        swapper = swapping(world.user, agents_home / "f", through, str(precious), flags)
        with ended_whatever_happens(daemon, mountpoint, swapper):
            swapped_after = line_within(swapper, 30)
            assert swapped_after is not None, swapper.stderr
            assert float(swapped_after) < ENTRY_TIMEOUT / 2, "too slow to test anything"
            said = rest_of(swapper)
    assert said.strip() == str(errno.EACCES), said
    assert (agents_home / "f").read_text() == "root's, not the agent's to empty\n"
    assert (agents_home / "f").stat().st_uid == 0


# Run as the agent's uid, on its own file on the storage root: a lease it takes, and does not
# give back when told to (SIGIO), as long as the kernel lets it (lease-break-time, 45 s).
HOLD_A_LEASE = """
import fcntl, os, signal, sys, time
signal.signal(signal.SIGIO, signal.SIG_IGN)
fd = os.open(sys.argv[1], os.O_RDONLY)
fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
print("leased", flush=True)
time.sleep(120)
"""

APPEND = "import sys; open(sys.argv[1], 'a').write('root was here\\n')"


def test_an_open_waiting_for_a_lease_on_its_file_to_be_broken_does_not_stall_the_mount(
    world: World, agents_home: Path
) -> None:
    """Whoever owns a file may lease it; an open for writing then waits until the lease is
    given back or broken.  The opener waits, as on the storage root; the daemon goes on
    answering everyone else meanwhile, and the open completes once the lease is gone."""
    leased = agents_home / "leased"
    leased.write_text("the agent's\n")
    os.chown(leased, world.user.uid, world.user.gid)
    mountpoint = world.scratch / "ctx"
    with mounted(world.root, mountpoint) as daemon:
        holder = subprocess.Popen(
            ["setpriv", f"--reuid={world.user.uid}", f"--regid={world.user.gid}",
             "--clear-groups", sys.executable, "-c", HOLD_A_LEASE, str(leased)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        with ended_whatever_happens(daemon, mountpoint, holder):
            assert line_within(holder, 30) == "leased", holder.stderr
            through = mountpoint / "home" / str(world.user.uid) / "leased"
            writer = subprocess.Popen([sys.executable, "-c", APPEND, str(through)])
            try:
                time.sleep(0.5)
                assert writer.poll() is None  # waiting for the lease, as on the storage root
                assert answers(mountpoint / "bin"), "the mount stopped answering"
                holder.kill()  # the lease goes with its holder
                assert writer.wait(timeout=30) == 0
            finally:
                writer.kill()
                writer.wait(timeout=30)
    assert leased.read_text() == "the agent's\nroot was here\n"
