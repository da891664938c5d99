"""§2 Q-5, W-3 and X-1: a project queue in a shared space (a setgid, group-writable directory)
is worked by every member of the space's group.  An entry one member's claim, lease or finish
creates must stay usable by the others, whatever that member's umask: otherwise a claim left by
a member whose shell exited can be neither recovered nor finished by anyone else."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, clean_env, ctx_run, request
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

GROUP = 65534  # nogroup: the space's group; uid 65534 (nobody) is a member by its own gid
NOBODY = 65534

# Giving a space a group one is not a member of, and acting as its members, takes root.
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as other users")


def ctx_as(
    uid: int,
    gid: int,
    groups: list[int],
    storage: Path,
    *args: str,
    via_shell: bool = False,
    stdin: str = "",
) -> subprocess.CompletedProcess[str]:
    """``ctx ARGS`` as another user with umask 022; ``via_shell``: from a shell that exits
    right after it (the lease holder of a shell ``claim``)."""
    argv = [*CTX_ARGV, *args]
    if via_shell:
        argv = ["/bin/sh", "-c", '"$@"; true', "sh", *argv]
    env = clean_env(CTX_STORAGE=str(storage), HOME="/nonexistent")
    env.pop("XDG_CACHE_HOME", None)
    return subprocess.run(
        argv,
        input=stdin,
        user=uid,
        group=gid,
        extra_groups=groups,
        umask=0o022,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def shared_queue(traversable_tmp: Path) -> tuple[Path, Path]:
    storage = traversable_tmp / "storage"
    assert ctx_run("bootstrap", "--storage", storage).rc == 0
    env = clean_env(CTX_STORAGE=str(storage))
    assert ctx_run("shared", "create", "--group", str(GROUP), "mp", env=env).rc == 0
    assert ctx_run("queue", "init", "-p", "mp", env=env).rc == 0
    return storage, storage / "shared" / "mp" / "queue"


def group_bits(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode) & 0o070


def test_another_member_recovers_and_finishes_a_claim_left_by_an_exited_shell(
    shared_queue: tuple[Path, Path],
    unprivileged_user: UnprivilegedUser,
) -> None:
    storage, queue = shared_queue
    member = (unprivileged_user.uid, unprivileged_user.gid, [GROUP])
    publish = [*CTX_ARGV, "queue", "publish", "-p", "mp"]
    jobs = []
    for name in ("left", "finished"):
        done = subprocess.run(
            [*publish, "--name", name, "-"],
            input=json.dumps(request()),
            env=clean_env(CTX_STORAGE=str(storage)),
            capture_output=True,
            text=True,
            check=True,
        )
        jobs.append(done.stdout.strip())
    for _ in jobs:
        claimed = ctx_as(NOBODY, NOBODY, [], storage, "queue", "claim", "-p", "mp", via_shell=True)
        assert claimed.returncode == 0, claimed.stderr
    left, finished = jobs
    for job in jobs:
        # The umask took the group's write bit; the protocol gives it back.
        assert group_bits(queue / "claimed" / job) == 0o070
        assert group_bits(queue / "lease" / job) == 0o070
        assert group_bits(queue / "lease" / job / "worker") & 0o060 == 0o060
        assert group_bits(queue / "claimed" / job / job) & 0o060 == 0o060

    done = ctx_as(*member, storage, "queue", "finish", "-p", "mp", finished, "--ok")
    assert done.returncode == 0, done.stderr
    recovered = ctx_as(*member, storage, "queue", "recover", "-p", "mp")
    assert recovered.returncode == 0, (recovered.stdout, recovered.stderr)

    assert (queue / "pending" / left).is_file()
    assert (queue / "done" / finished).is_file()
    assert (queue / "done" / f"{finished}.result").is_file()
    assert group_bits(queue / "done" / f"{finished}.result") & 0o060 == 0o060
    for state in ("claimed", "lease", "inbox"):
        assert os.listdir(queue / state) == []


def plant_dead_claim(queue: Path, job: str, mode: int) -> None:
    """``claimed/J/J`` and ``lease/J/worker`` of a holder that has exited, made by uid 65534
    with directories of ``mode`` (0o755: what its umask gave before the fix)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    now = time.time()
    lease = {
        "worker": "gone", "host": os.uname().nodename, "pid": proc.pid, "start_time": now - 9,
        "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "pid_ns": os.stat("/proc/self/ns/pid").st_ino,
        "claimed_at": now - 9, "expires_at": now + 600,
    }  # fmt: skip
    claim, lease_dir = queue / "claimed" / job, queue / "lease" / job
    for directory in (claim, lease_dir):
        directory.mkdir()
    (claim / job).write_text(json.dumps(request()))
    (lease_dir / "worker").write_text(json.dumps(lease))
    for path in (claim, lease_dir, claim / job, lease_dir / "worker"):
        os.chown(path, NOBODY, GROUP)
    for directory in (claim, lease_dir):
        directory.chmod(mode)


def test_recover_reports_a_job_it_may_not_move_and_carries_on(
    shared_queue: tuple[Path, Path],
    unprivileged_user: UnprivilegedUser,
) -> None:
    """Q-5, Q-6: EACCES on one job is reported with its errno and costs the others nothing."""
    storage, queue = shared_queue
    plant_dead_claim(queue, "a-locked.req.json", 0o2755)
    plant_dead_claim(queue, "b-open.req.json", 0o2775)
    member = (unprivileged_user.uid, unprivileged_user.gid, [GROUP])

    text = ctx_as(*member, storage, "queue", "recover", "-p", "mp")
    assert text.returncode == 1, (text.stdout, text.stderr)
    assert "error    a-locked.req.json: EACCES" in text.stdout, text.stdout
    assert "Traceback" not in text.stderr
    assert (queue / "pending" / "b-open.req.json").is_file()
    assert (queue / "claimed" / "a-locked.req.json" / "a-locked.req.json").is_file()

    report = json.loads(ctx_as(*member, storage, "queue", "recover", "-p", "mp", "--json").stdout)
    assert [(e["job"], e["error"]) for e in report["errors"]] == [("a-locked.req.json", "EACCES")]
    assert report["consistent"] is False


def test_jobs_other_members_published_first_are_claimed_first(
    shared_queue: tuple[Path, Path], traversable_tmp: Path
) -> None:
    """Q-9: uid 65534 publishes n1 and n2, then root publishes r1; root's claims take n1, n2,
    r1, although root's claim-order hint saw only its own publish."""
    storage, _queue = shared_queue
    env = clean_env(CTX_STORAGE=str(storage), XDG_CACHE_HOME=str(traversable_tmp / "cache"))

    def root(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        argv = [*CTX_ARGV, "queue", *args, "-p", "mp"]
        return subprocess.run(argv, input=stdin, env=env, capture_output=True, text=True)

    assert root("claim").returncode == 3  # root's order of this queue: nothing pending
    for name in ("n1", "n2"):
        published = ctx_as(
            NOBODY, NOBODY, [], storage, "queue", "publish", "-p", "mp", "--name", name,
            "-", stdin=json.dumps(request()),
        )  # fmt: skip
        assert published.returncode == 0, published.stderr
    assert root("publish", "--name", "r1", "-", stdin=json.dumps(request())).returncode == 0
    claims = [root("claim").stdout.strip() for _ in range(3)]
    assert claims == ["n1.req.json", "n2.req.json", "r1.req.json"]
