"""``shell.exec`` and the shell it becomes, ``/bin/sh`` (SPEC R-5, T-2): a host without one is
refused naming it, never with the kernel's bare ``No such file or directory``."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys

import pytest

from tests.tools.support import World

UNSHARE, MOUNT = shutil.which("unshare"), shutil.which("mount")


@pytest.fixture
def agent(world: World) -> World:
    world.agent("coder", tools=["shell.exec"])
    world.allow_tool("shell.exec")
    return world


def without_bin_sh(world: World, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` run in a private mount namespace whose ``/usr/bin`` (so ``/bin`` on a merged
    /usr) lacks ``sh``: an overlay whose upper layer holds a whiteout of it."""
    if os.geteuid() != 0 or None in (UNSHARE, MOUNT):
        pytest.skip("needs root, unshare and mount")
    if os.path.realpath("/bin") != "/usr/bin" or not os.path.lexists("/usr/bin/sh"):
        pytest.skip("needs a merged /usr with /usr/bin/sh")
    whiteouts = world.scratch / "whiteouts"
    whiteouts.mkdir()
    os.mknod(whiteouts / "sh", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    hide = f"{MOUNT} -t overlay cortexfs-test-hide -o lowerdir={whiteouts}:/usr/bin /usr/bin"
    # The shell that mounts the overlay is already running, and then becomes argv.
    script = f'set -e\n{hide}\ntest ! -e /bin/sh\nexec "$@"'
    namespace = [UNSHARE, "-m", "--propagation", "private", "/bin/sh", "-c", script, "sh"]
    done = subprocess.run(
        [*namespace, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "CTX_STORAGE": str(world.root)},
        cwd=world.workspace,
        timeout=60,
    )
    if "cortexfs-test-hide" in done.stderr or "mount:" in done.stderr:
        pytest.skip(f"cannot hide /bin/sh here: {done.stderr.strip()}")
    return done


def test_a_host_without_bin_sh_is_refused_naming_the_shell(agent: World) -> None:
    """The kernel's ENOENT names no path: the sentence names /bin/sh and what is missing."""
    done = without_bin_sh(agent, sys.executable, "-m", "cortexfs", "run", "--agent", "coder",
                          "shell.exec", "true")  # fmt: skip
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [
        "shell.exec: ENOENT: cannot run /bin/sh: No such file or directory; shell.exec needs a "
        "POSIX shell at /bin/sh"
    ], done


def test_a_command_too_long_for_the_kernel_is_e2big_not_a_missing_shell(agent: World) -> None:
    """The shell is there: a command line over the kernel's bound of one argument (128 KiB)
    is refused as too long, and the sentence does not send the caller looking for a shell: it
    names cmd, its size and the bound."""
    refused = agent.run("shell.exec", {"cmd": "true #" + "x" * 200_000})
    assert refused.error is not None and refused.error.errno == errno.E2BIG, refused
    assert "/bin/sh" not in refused.error.message, refused
    limit = 32 * os.sysconf("SC_PAGE_SIZE")
    assert refused.output["message"] == (
        f"cmd is 200006 bytes, more than the kernel passes to a program as one argument "
        f"({limit} bytes, its final NUL included); nothing was run"
    ), refused
