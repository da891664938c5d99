"""The error branches of a lease and its holder, each reached from outside (SPEC §2.1, §2.4,
Q-3, Q-4, Q-5, Q-6, Q-8, I-4; docs/queue.md "The steps" (**lease**, how a lease is read, the
lock a finish or renew takes), "What a crash leaves", "Liveness (Q-5)", "A queue shared by a
group", "What is not a job (Q-8)", "Command line"; ``ctx queue renew --help``).

The angle: what ``ctx queue renew`` (and ``claim --pid``, ``finish``, ``status``, ``show``,
``recover``) say and do when the lease file, its directory or the machine around them is not
what a lease needs — ``lease/J/worker`` a FIFO, a directory or a socket, a JSON document that
is no object, a pid no process can have; a lease a member may not read; ``lease/J``,
``lease/J/worker`` or ``inbox/`` pinned by ``chattr``; a full filesystem, a read-only bind
mount, ``lease/J`` a mount point of another filesystem; ``claimed/J`` held locked by another
process, or requeued and claimed anew while a renewal waits for it; renewals of a job left
pending, half-claimed, finished with a leftover lease, or claimed without a lease directory;
and the liveness judgement of Q-5 for holders the pid alone does not describe: a process whose
first thread has exited while its others work on, a wall clock stepped since the claim, a
host whose boot id cannot be read.  Each check reads the exit status of §2.4, the errno word
of the ``ctx: ERRNO: sentence`` line and the same error as the one ``--json`` object, that
the message names the file, directory or job at fault and what to do where the documents
promise it, that nothing was half-done (the queue byte for byte as it was, no temp file in
``inbox/``, no lease followed through a link, no job requeued under a live holder), and,
where the message names a repair, that the repair works."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    SUFFIX,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    request,
    rfc3339,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.support.scratch_mounts import ScratchMounts
from tests.support.storage import attribute
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
DEAD_PID = 4_000_000  # above pid_max (at most 4194304), so never a live process here
HOST = os.uname().nodename
AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="needs root: chattr, mount, unshare")
needs_unshare = pytest.mark.skipif(
    not AS_ROOT or shutil.which("unshare") is None, reason="needs root and unshare(1)"
)


# ---------------------------------------------------------------------- fixtures and checks


@pytest.fixture
def holder() -> Iterator[subprocess.Popen]:
    """A live process of this test's own, standing in as a lease holder."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def mounts() -> Iterator[ScratchMounts]:
    """Filesystems this test mounts, unmounted (and their scratch removed) at the end."""
    made = ScratchMounts(new_scratch_dir(SCRATCH, "mnt-"))
    try:
        yield made
    finally:
        made.close()


def job(name: str) -> str:
    return name + SUFFIX


def no_traceback(*runs: Run) -> None:
    for r in runs:
        assert "Traceback" not in r.out + r.err, r


def refused(r: Run, name: str, status: int = 1) -> str:
    """``r``, run with ``--json``, exited ``status`` with one error object on stdout whose
    errno is ``name``, and the same error as the last line of stderr; its message."""
    no_traceback(r)
    assert r.rc == status, r
    lines = r.out.splitlines()
    assert len(lines) == 1, r
    obj = json.loads(lines[0])
    assert (obj["error"], obj["errno"]) == (name, getattr(errno, name)), r
    assert r.err.rstrip("\n").splitlines()[-1] == f"ctx: {name}: {obj['message']}", r
    return obj["message"]


def report(queue: QueueCLI, *args: str, status: int) -> dict:
    """``ctx queue recover --json ARGS``, which must exit ``status``: its report."""
    r = queue.run("recover", "--json", *args)
    no_traceback(r)
    assert r.rc == status, r
    return r.json()


def jobs_in(found: dict, key: str) -> list[str]:
    return sorted(entry["job"] for entry in found[key])


def claimed_for(queue: QueueCLI, name: str, pid: int, *options: str) -> str:
    """Publish ``name`` and claim it (the only pending job) for process ``pid``."""
    published = queue.publish(request(tag=name), name=name)
    r = queue.run("claim", "--pid", str(pid), *options)
    assert (r.rc, r.out.strip()) == (0, published), r
    return published


def lease_path(queue: QueueCLI, j: str) -> Path:
    return queue.dir / "lease" / j / "worker"


def stamp_at(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def expires(queue: QueueCLI, j: str) -> float:
    return rfc3339(queue.lease(j)["expires_at"]).timestamp()


def renewed_by(queue: QueueCLI, j: str, pid: int, *argv: str) -> dict:
    """``renew J --pid PID --json`` (in front of ``argv``, an ``unshare`` prefix), which must
    succeed: the lease it printed, also the one on disk."""
    if argv:
        done = subprocess.run(
            [*argv, *CTX_ARGV, "queue", "renew", j, "--project", queue.project, "--pid",
             str(pid), "--json"],
            capture_output=True, text=True, env=clean_env(CTX_STORAGE=str(queue.storage)),
        )  # fmt: skip
        r = Run(["queue", "renew", j], done.returncode, done.stdout, done.stderr)
    else:
        r = queue.run("renew", j, "--pid", str(pid), "--json")
    no_traceback(r)
    assert r.rc == 0, r
    assert r.json() == queue.lease(j), r
    return r.json()


# ------------------------------------------------------- a lease file of the wrong kind


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


def _socket(path: Path) -> None:
    # Bound by its name alone, from its directory: a socket's whole path may not exceed 107
    # bytes.  The name stays once the socket is closed, a socket nobody listens on.
    bind = f"import socket; socket.socket(socket.AF_UNIX).bind({path.name!r})"
    subprocess.run([sys.executable, "-c", bind], cwd=path.parent, check=True)


WRONG_KINDS = [
    pytest.param(_fifo, "FIFO", id="fifo"),
    pytest.param(_directory, "directory", id="directory"),
    pytest.param(_socket, "socket", id="socket"),
]


@pytest.mark.parametrize(("make", "kind"), WRONG_KINDS)
def test_a_lease_file_of_the_wrong_kind_is_a_conflict_until_made_a_lease_again(
    queue: QueueCLI, holder, make: Callable[[Path], None], kind: str
) -> None:
    """Q-8 (non-regular lease files are never followed or opened as leases), docs/queue.md
    "What is not a job": with ``lease/J/worker`` a FIFO, a directory or a socket, ``status``
    calls J a conflict naming that entry and its kind (exit 1); ``renew`` and ``finish``
    return at once (a FIFO is never opened for reading, which would block) with EINVAL
    naming ``lease/J/worker`` and its kind, saying to repair it and not to remove it, and
    change nothing; ``recover --reconcile`` leaves J as it is.  The repair the message names
    — ``lease/J/worker`` a regular file whose JSON names the holder again — makes J claimed
    and renewable again."""
    j = claimed_for(queue, "kinded", holder.pid)
    saved = lease_path(queue, j).read_bytes()
    lease_path(queue, j).unlink()
    make(lease_path(queue, j))
    before = snapshot(queue.dir)

    status = queue.run("status", "--json")
    no_traceback(status)
    assert status.rc == 1, status
    (conflict,) = status.json()["conflicts"]
    assert conflict["job"] == j and f"lease/{j}/worker" in conflict["detail"], conflict
    (ignored,) = status.json()["ignored"]
    assert kind in json.dumps(ignored), ignored

    started = time.monotonic()
    for argv, verb in (
        (("renew", j, "--pid", str(holder.pid), "--json"), "renew"),
        (("finish", j, "--ok", "-", "--json"), "finish"),
    ):
        said = refused(queue.run(*argv, input='"out"', timeout=20), "EINVAL")
        assert said.startswith(f"job {j}'s lease/{j}/worker is not a lease ("), said
        assert f"is a {kind}, not a regular file" in said, said
        assert f"a conflict that {verb} never resolves" in said and "do not remove it" in said
    assert time.monotonic() - started < 15
    found = report(queue, "--reconcile", status=1)
    assert jobs_in(found, "conflicts") == [j] and found["requeued"] == [], found
    assert snapshot(queue.dir) == before

    path = lease_path(queue, j)
    path.rmdir() if path.is_dir() else path.unlink()
    path.write_bytes(saved)
    renewed_by(queue, j, holder.pid)
    assert queue.run("status", "--json").json()["claimed"] == 1
    assert report(queue, status=0)["consistent"] is True


# ------------------------------------------------------------- leases that are no object


@pytest.mark.parametrize("document", ["[]", "null", '"a lease"', "7", '[{"pid": 1}]'])
def test_a_lease_of_json_that_is_no_object_is_unreadable_and_never_requeued(
    queue: QueueCLI, document: str
) -> None:
    """Q-3 (a lease is one JSON object), docs/queue.md "What a crash leaves" (a claimed job
    whose lease cannot be read proves nothing about its holder: never requeued, a conflict):
    a lease holding well-formed JSON that is no object — an array, null, a string, a number —
    is a conflict for ``status``, ``show`` (holder ``unreadable``) and ``recover`` (exit 1),
    each saying it is not a JSON object; the job of a dead pid is never requeued, and
    ``renew`` refuses it with EINVAL; nothing changes."""
    j = claimed_for(queue, "noobject", DEAD_PID)
    lease_path(queue, j).write_text(document)
    before = snapshot(queue.dir)
    shown = queue.run("show", j, "--json")
    no_traceback(shown)
    assert shown.rc == 1 and shown.json()["state"] == "conflict", shown
    assert shown.json()["holder"]["state"] == "unreadable", shown
    assert "not a JSON object" in shown.json()["holder"]["reason"], shown
    found = report(queue, "--reconcile", status=1)
    assert jobs_in(found, "conflicts") == [j] and found["requeued"] == [], found
    said = refused(queue.run("renew", j, "--pid", str(DEAD_PID), "--json"), "EINVAL")
    assert "not a JSON object" in said and f"lease/{j}/worker" in said, said
    assert snapshot(queue.dir) == before


def test_lease_pids_no_process_can_have_make_the_lease_unreadable_never_a_holder(
    queue: QueueCLI,
) -> None:
    """docs/queue.md (how a lease is read) and Q-6: a ``pid`` that no Linux process can have
    — 0, negative, one past 2**22, a float, a string of digits, ``true`` — names no holder
    to look for: the lease is unreadable (``status`` names the field ``pid`` and its range,
    exit 1), never a gone holder whose job recover requeues."""
    j = claimed_for(queue, "pids", DEAD_PID)
    lease = queue.lease(j)
    for pid in (0, -1, 2**22 + 1, 12.0, "4242", True):
        queue.write_lease(j, {**lease, "pid": pid})
        before = snapshot(queue.dir)
        status = queue.run("status", "--json")
        no_traceback(status)
        assert status.rc == 1, (pid, status)
        (conflict,) = status.json()["conflicts"]
        assert "no valid field 'pid' (a process id, 1 to 4194304)" in conflict["detail"], pid
        found = report(queue, status=1)
        assert found["requeued"] == [] and jobs_in(found, "conflicts") == [j], (pid, found)
        assert snapshot(queue.dir) == before
    queue.write_lease(j, lease)
    assert jobs_in(report(queue, status=0), "requeued") == [j]


def test_a_lease_of_exactly_64_kib_is_read_and_one_byte_more_is_efbig(
    queue: QueueCLI, holder
) -> None:
    """docs/queue.md (a lease is a few hundred bytes; one far larger is damage, never read
    whole): a lease padded with blanks to exactly 65536 bytes is still read — J claimed, its
    live holder alive, its renewal made (and written back at its usual size); one byte more
    is EFBIG naming the size and the limit, a conflict for ``status`` that ``renew`` refuses,
    and nothing changes."""
    j = claimed_for(queue, "sized", holder.pid)
    text = lease_path(queue, j).read_bytes().rstrip(b"\n")
    lease_path(queue, j).write_bytes(text + b" " * (65536 - len(text)))
    assert lease_path(queue, j).stat().st_size == 65536
    shown = queue.run("show", j, "--json")
    assert shown.rc == 0 and shown.json()["holder"]["state"] == "alive", shown
    renewed_by(queue, j, holder.pid)
    assert lease_path(queue, j).stat().st_size < 1024

    text = lease_path(queue, j).read_bytes().rstrip(b"\n")
    lease_path(queue, j).write_bytes(text + b" " * (65537 - len(text)))
    before = snapshot(queue.dir)
    status = queue.run("status", "--json")
    assert status.rc == 1, status
    (conflict,) = status.json()["conflicts"]
    assert "(EFBIG: worker is 65537 bytes; the limit is 65536)" in conflict["detail"], conflict
    said = refused(queue.run("renew", j, "--pid", str(holder.pid), "--json"), "EFBIG")
    assert "worker is 65537 bytes; the limit is 65536" in said, said
    assert snapshot(queue.dir) == before


# ----------------------------------------------------- a lease a member may not read


@contextmanager
def members_queue(user: UnprivilegedUser) -> Iterator[tuple[Path, Callable[..., Run]]]:
    """A queue in a directory of ``user``'s (``--queue``), and a ``ctx queue`` runner as
    that user; removed at the end."""
    home = new_scratch_dir(SCRATCH, "member-")
    os.chown(home, user.uid, user.gid)
    qdir = home / "q"
    env = clean_env(HOME=str(home), XDG_CACHE_HOME=str(home / "cache"))

    def as_user(verb: str, *args: str, stdin: str = "") -> Run:
        argv = ["queue", verb, "--queue", str(qdir), *args]
        done = run_as(user, [*CTX_ARGV, *argv], env=env, stdin=stdin)
        return Run(argv, done.returncode, done.stdout, done.stderr)

    try:
        yield qdir, as_user
    finally:
        shutil.rmtree(home, ignore_errors=True)


HIDDEN_LEASES = [
    pytest.param("lease/{j}/worker", 0o000, "renew", id="lease-file-mode-000-renew"),
    pytest.param("lease/{j}/worker", 0o000, "finish", id="lease-file-mode-000-finish"),
    pytest.param("lease/{j}", 0o2700, "renew", id="lease-dir-mode-2700-renew"),
    pytest.param("lease/{j}", 0o2700, "finish", id="lease-dir-mode-2700-finish"),
    pytest.param("claimed/{j}", 0o2700, "renew", id="claim-dir-mode-2700-renew"),
    pytest.param("claimed/{j}", 0o2700, "finish", id="claim-dir-mode-2700-finish"),
]


@needs_root
@pytest.mark.parametrize(("entry", "mode", "verb"), HIDDEN_LEASES)
def test_renew_and_finish_of_a_lease_the_member_may_not_read_name_it(
    unprivileged_user: UnprivilegedUser, holder, entry: str, mode: int, verb: str
) -> None:
    """docs/queue.md "A queue shared by a group": a user who may use only part of a queue is
    refused with EACCES naming what refused, its owner, group and mode, and what to do (exit
    1), nothing half-done; ``finish`` checks ``claimed/J`` and ``lease/J`` among the
    directories it changes before its first step.  In a member's own queue, root has made
    J's ``lease/J/worker`` (mode 000), ``lease/J`` or ``claimed/J`` (mode 2700) root's: the
    member's ``renew`` and ``finish`` of J are refused naming that entry and its mode, and
    nothing moves."""
    with members_queue(unprivileged_user) as (qdir, as_user):
        assert as_user("init").rc == 0
        published = as_user("publish", "--name", "hidden", "-", stdin=json.dumps(request()))
        j = published.out.strip()
        took = as_user("claim", "--pid", str(holder.pid))
        assert (took.rc, took.out.strip()) == (0, j), took
        hidden = qdir / entry.format(j=j)
        os.chown(hidden, 0, 0)
        hidden.chmod(mode)
        before = snapshot(qdir)
        args = ("--pid", str(holder.pid)) if verb == "renew" else ("--ok", "-")
        said = refused(as_user(verb, j, *args, "--json", stdin='"out"'), "EACCES")
        assert snapshot(qdir) == before
        assert entry.format(j=j) in said, said
        assert "mode" in said, said


# ------------------------------------------------------------ renew pinned by attributes


PINS = [
    pytest.param("lease/{j}", "i", "immutable", id="lease-dir-immutable"),
    pytest.param("lease/{j}/worker", "a", "append-only", id="lease-file-append-only"),
    pytest.param("inbox", "i", "immutable", id="inbox-immutable"),
    pytest.param("inbox", "a", "append-only", id="inbox-append-only"),
]


@needs_root
@pytest.mark.parametrize(("where", "letter", "word"), PINS)
def test_a_renewal_refused_by_an_attribute_names_it_and_its_removal_works(
    queue: QueueCLI, holder, where: str, letter: str, word: str
) -> None:
    """docs/queue.md: a write refused by an immutable or append-only attribute (no mode
    explains it, and it refuses root too) is EPERM naming the attribute and the ``chattr
    -i``/``-a`` that removes it; ``renew`` says the lease is unchanged and when it expires.
    ``lease/J`` immutable, ``lease/J/worker`` append-only (a rename over it is refused), and
    ``inbox/`` immutable or append-only (the temp file would be made or moved out there):
    exit 1, the queue as it was, no temp file; once the ``chattr`` it names is run, the
    same renewal succeeds."""
    j = claimed_for(queue, "pinned", holder.pid)
    pinned = queue.dir / where.format(j=j)
    stamp = queue.lease(j)["expires_at"]
    before = snapshot(queue.dir)
    with attribute(pinned, letter):
        said = refused(queue.run("renew", j, "--pid", str(holder.pid), "--json"), "EPERM")
        assert snapshot(queue.dir) == before
    assert said.startswith(f"cannot renew a lease in queue {queue.dir}: "), said
    assert f"{pinned} is {word} (attribute '{letter}'" in said, said
    assert f"'chattr -{letter} {pinned}'" in said, said
    assert f"the lease on {j} is unchanged (it expires at {stamp})" in said, said
    lease = renewed_by(queue, j, holder.pid)
    assert lease["expires_at"] > stamp and queue.entries("inbox") == set()


# ------------------------------------------------- renew where the host runs short


@needs_root
def test_a_renewal_on_a_full_filesystem_says_the_lease_is_unchanged_and_goes_once_freed(
    mounts: ScratchMounts, holder
) -> None:
    """docs/queue.md: a step refused for want of a resource keeps its errno (ENOSPC) and names
    the directory that refused, what ran short (a full disk gives the bytes and inodes left),
    what was and was not done (``renew``: the lease is unchanged, and when it expires) and
    what to do (``free space on that filesystem``).  Once space is freed, the renewal the
    message asks for succeeds and leaves no temp file."""
    fs = mounts.tmpfs("fs", "size=4m,nr_inodes=4096")
    qdir = fs / "q"

    def q(verb: str, *args: str, stdin: str = "") -> Run:
        return ctx_run("queue", verb, "--queue", qdir, *args, input=stdin)

    assert q("init").rc == 0
    j = q("publish", "--name", "full", "-", stdin=json.dumps(request())).out.strip()
    assert q("claim", "--pid", str(holder.pid)).out.strip() == j
    lease = qdir / "lease" / j / "worker"
    stamp = json.loads(lease.read_text())["expires_at"]
    fill = fs / "fill"
    with open(fill, "wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    before = snapshot(qdir)
    said = refused(q("renew", j, "--pid", str(holder.pid), "--json"), "ENOSPC")
    assert snapshot(qdir) == before and os.listdir(qdir / "inbox") == []
    assert f"cannot renew a lease in queue {qdir}: {qdir}/inbox refused" in said, said
    assert "its filesystem has 0 bytes" in said, said
    assert f"the lease on {j} is unchanged (it expires at {stamp})" in said, said
    assert "free space on that filesystem, then renew it again" in said, said
    fill.unlink()
    again = q("renew", j, "--pid", str(holder.pid), "--json")
    assert again.rc == 0 and again.json()["expires_at"] > stamp, again
    assert json.loads(lease.read_text()) == again.json()
    assert os.listdir(qdir / "inbox") == []


@needs_root
def test_a_renewal_into_a_lease_directory_on_another_filesystem_is_exdev_and_nothing_more(
    queue: QueueCLI, holder, mounts: ScratchMounts
) -> None:
    """docs/queue.md "The steps" (``renew`` writes a temp file in ``inbox/`` and renames it
    over ``lease/J/worker``): with ``lease/J`` a mount point of another filesystem, the rename
    cannot cross it.  EXDEV (exit 1) names ``lease/J``, says the lease is unchanged and when
    it expires, and to put the queue's directories on one filesystem; the lease on the other
    filesystem is byte for byte as it was and no temp file is left in ``inbox/``.  Unmounted,
    the same renewal succeeds."""
    j = claimed_for(queue, "crossed", holder.pid)
    saved = lease_path(queue, j).read_bytes()
    stamp = queue.lease(j)["expires_at"]
    mounts.tmpfs(queue.dir / "lease" / j, "size=1m")
    lease_path(queue, j).write_bytes(saved)
    said = refused(queue.run("renew", j, "--pid", str(holder.pid), "--json"), "EXDEV")
    assert lease_path(queue, j).read_bytes() == saved
    assert queue.entries("inbox") == set()
    assert f"{queue.dir}/lease/{j} refused" in said, said
    assert f"the lease on {j} is unchanged (it expires at {stamp})" in said, said
    assert "put the queue's directories on one filesystem" in said, said
    mounts.unmount(queue.dir / "lease" / j)
    assert renewed_by(queue, j, holder.pid)["expires_at"] > stamp


@needs_root
def test_a_renewal_on_a_read_only_mount_is_erofs_and_goes_once_writable(
    queue: QueueCLI, holder, mounts: ScratchMounts
) -> None:
    """docs/queue.md: a write refused because the filesystem is mounted read-only is EROFS
    saying so (remount it read-write); ``renew`` adds that the lease is unchanged and when
    it expires.  Nothing changes; once the mount is gone, the renewal succeeds."""
    j = claimed_for(queue, "frozen", holder.pid)
    stamp = queue.lease(j)["expires_at"]
    before = snapshot(queue.dir)
    mounts.bind_self(queue.dir, "ro")
    said = refused(queue.run("renew", j, "--pid", str(holder.pid), "--json"), "EROFS")
    assert "read-only filesystem" in said and "remount it read-write" in said, said
    assert f"the lease on {j} is unchanged (it expires at {stamp})" in said, said
    mounts.unmount(queue.dir)
    assert snapshot(queue.dir) == before
    assert renewed_by(queue, j, holder.pid)["expires_at"] > stamp


# ------------------------------------------------------------------- the lock of claimed/J


@contextmanager
def locked(path: Path) -> Iterator[int]:
    """``path`` (a directory) opened and flocked exclusively by this test process, as a
    member's stuck program may hold it."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def test_a_renewal_behind_a_lock_held_for_30_seconds_is_eagain_naming_its_holder(
    queue: QueueCLI, holder
) -> None:
    """docs/queue.md "Liveness": a claim, ``finish`` and ``renew`` wait for ``claimed/J``'s
    lock at most 30 seconds, after that they fail with EAGAIN naming the pid that holds it,
    and change nothing.  This test process holds the lock: ``renew`` waits about 30 s, exits
    1 with EAGAIN naming ``claimed/J`` and this pid, and the lease is as it was."""
    j = claimed_for(queue, "stuck", holder.pid)
    before = snapshot(queue.dir)
    with locked(queue.dir / "claimed" / j):
        started = time.monotonic()
        r = queue.run("renew", j, "--pid", str(holder.pid), "--json", timeout=90)
        waited = time.monotonic() - started
    said = refused(r, "EAGAIN")
    assert 29 <= waited < 60, waited
    assert said.startswith(f"claimed/{j} has been locked by another process (pid {os.getpid()})")
    assert "end it, then try again" in said, said
    assert snapshot(queue.dir) == before


def test_a_renewal_that_waited_while_its_job_was_claimed_anew_never_touches_the_new_lease(
    queue: QueueCLI, holder
) -> None:
    """docs/queue.md "The steps" (a finish or renew takes ``claimed/J``'s lock and checks that
    the directory it locked is still ``claimed/J``): a renewal that waited for the lock while
    J was requeued (its claim directory removed) and claimed anew by another process is
    refused with EACCES saying J was claimed again by another claim, whose business renewing
    is, and naming ``ctx queue show J``; the new claim's lease is byte for byte as it was."""
    j = claimed_for(queue, "anew", holder.pid, "--ttl", "60")
    claim_dir = queue.dir / "claimed" / j
    with locked(claim_dir):
        waiting = subprocess.Popen(
            [*CTX_ARGV, "queue", "renew", j, "--project", "proj", "--pid", str(holder.pid),
             "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=clean_env(CTX_STORAGE=str(queue.storage)),
        )  # fmt: skip
        assert wait_for(lambda: holds_open(waiting.pid, claim_dir), 20)
        time.sleep(0.5)  # from its open of claimed/J to its wait for the lock
        # J requeued as recover requeues it, then claimed anew by another process.
        os.rename(claim_dir / j, queue.dir / "pending" / j)
        lease_path(queue, j).unlink()
        (queue.dir / "lease" / j).rmdir()
        claim_dir.rmdir()
        other = subprocess.Popen(["sleep", "600"])
        try:
            assert queue.claim("--pid", str(other.pid)) == j
            taken = lease_path(queue, j).read_bytes()
        except BaseException:
            other.kill()
            raise
    try:
        out, err = waiting.communicate(timeout=60)
        said = refused(Run(["queue", "renew", j], waiting.returncode, out, err), "EACCES")
        assert said.startswith(f"job {j} was claimed again, by another claim, while this"), said
        assert "renewing its lease is that claim's to do" in said, said
        assert f"'ctx queue show {j} --project proj' names its holder" in said, said
        assert lease_path(queue, j).read_bytes() == taken
        assert queue.entries("inbox") == set()
    finally:
        other.kill()
        other.wait()


def holds_open(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open (a renewal about to lock ``claimed/J``)."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(path):
                return True
        except OSError:
            continue
    return False


# ------------------------------------------------------ renewals of jobs that are not claimed


def _half_claimed(queue: QueueCLI, j: str) -> None:
    (queue.dir / "claimed" / j).mkdir()


def _pending_with_a_leftover_lease(queue: QueueCLI, j: str) -> None:
    (queue.dir / "lease" / j).mkdir()
    (queue.dir / "lease" / j / "worker").write_text(json.dumps({"pid": DEAD_PID}))


NOT_CLAIMED = [
    pytest.param(
        _half_claimed,
        f"there is no lease to renew: job {job('idle')} is pending, not claimed",
        "--reconcile",
        id="pending-with-an-empty-claim-directory",
    ),
    pytest.param(
        _pending_with_a_leftover_lease,
        f"there is no claim to renew: job {job('idle')} is pending, not claimed",
        "--reconcile",
        id="pending-with-a-leftover-lease",
    ),
]


@pytest.mark.parametrize(("leave", "head", "repair"), NOT_CLAIMED)
def test_renew_of_a_pending_job_beside_a_leftover_says_it_is_pending_and_changes_nothing(
    queue: QueueCLI, leave, head: str, repair: str
) -> None:
    """docs/queue.md "Command line" (``renew`` of a job that is not claimed says where it is
    instead — pending: claim it first) and Q-6 (an empty ``claimed/J``, an orphan ``lease/J``
    are removed by ``recover --reconcile``): with J pending beside the leftover of a crashed
    claim, ``renew`` is ENOENT (exit 1) saying J is pending and to claim it before renewing
    its lease — "no lease" beside an empty claim directory, "no claim" beside a leftover
    lease — and changes nothing; ``recover --reconcile`` removes the leftover, and J is
    claimed and renewed."""
    j = queue.publish(request(tag="idle"), name="idle")
    leave(queue, j)
    before = snapshot(queue.dir)
    said = refused(queue.run("renew", j, "--pid", str(DEAD_PID), "--json"), "ENOENT")
    assert said.startswith(head), said
    assert "claim it before renewing its lease" in said, said
    assert snapshot(queue.dir) == before
    assert report(queue, repair, status=0)["consistent"] is True
    assert queue.entries("claimed") == queue.entries("lease") == set()
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        assert queue.claim("--pid", str(sleeper.pid)) == j
        renewed_by(queue, j, sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_renew_of_a_finished_job_with_its_lease_left_says_done_then_reconcile_clears_it(
    queue: QueueCLI, holder
) -> None:
    """Q-4 (a finish removes the lease last), Q-6 (a finish interrupted before its cleanup
    leaves the terminal pair with ``lease/J``; ``recover --reconcile`` removes the leftover
    once its holder is gone, here a dead pid), docs/queue.md "Command line": ``renew`` of such
    a job is ENOENT (exit 1) saying there is
    no claim to renew, J is already done, and ``ctx queue show J`` shows its result; nothing
    changes.  After ``recover --reconcile`` (exit 0) the leftover lease is gone and the same
    ``renew`` says there is no lease to renew."""
    j = claimed_for(queue, "finished", DEAD_PID)
    leftover = lease_path(queue, j).read_bytes()
    queue.finish(j)
    (queue.dir / "lease" / j).mkdir()
    lease_path(queue, j).write_bytes(leftover)
    before = snapshot(queue.dir)
    said = refused(queue.run("renew", j, "--pid", str(holder.pid), "--json"), "ENOENT")
    assert said.startswith(f"there is no claim to renew: job {j} is already done; "), said
    assert f"'ctx queue show {j} --project proj' shows its result" in said, said
    assert snapshot(queue.dir) == before
    fixed = report(queue, "--reconcile", status=0)
    assert fixed["consistent"] is True and queue.entries("lease") == set(), fixed
    said = refused(queue.run("renew", j, "--pid", str(holder.pid), "--json"), "ENOENT")
    assert said.startswith(f"there is no lease to renew: job {j} is already done; "), said
    assert queue.only_result(j)[0] == "done"


def test_renew_of_a_claim_without_a_lease_directory_says_it_never_ran_and_reconcile_requeues(
    queue: QueueCLI, holder
) -> None:
    """Q-3 (execution never starts before the lease is durable), Q-6 (``claimed/J/J`` without
    ``lease/J/worker`` → back to pending): with no ``lease/J`` at all (a claim killed between
    its move and its ``mkdir lease/J``), ``renew`` is ENOENT (exit 1) saying J has no
    ``lease/J/worker``, its claim never completed, and ``ctx queue recover --reconcile``
    returns it to pending; nothing changes.  That recover does so, and J is claimed again."""
    j = claimed_for(queue, "unleased", holder.pid)
    shutil.rmtree(queue.dir / "lease" / j)
    before = snapshot(queue.dir)
    said = refused(queue.run("renew", j, "--pid", str(holder.pid), "--json"), "ENOENT")
    assert said.startswith(f"job {j} has no lease/{j}/worker: its claim never completed"), said
    assert "'ctx queue recover --reconcile --project proj' returns it to pending" in said, said
    assert snapshot(queue.dir) == before
    fixed = report(queue, "--reconcile", status=0)
    assert jobs_in(fixed, "repaired") == [j], fixed
    assert queue.requests() == {j: ["pending"]}
    assert queue.claim("--pid", str(holder.pid)) == j


# ------------------------------------------- holders the pid alone does not describe


# A process whose first thread ends (pthread_exit) while another goes on: the kernel keeps
# its thread group, its pid answers kill(pid, 0), and /proc/PID/status says "Z (zombie)"
# for the leader thread alone.  Multi-threaded programs do this; the process works on.
LEADERLESS = """
import ctypes, threading, time
threading.Thread(target=time.sleep, args=(600,)).start()
print("ready", flush=True)
ctypes.CDLL(None).pthread_exit(None)
"""


@pytest.fixture
def leaderless() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", LEADERLESS], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        status = Path(f"/proc/{proc.pid}/status")
        assert wait_for(lambda: "State:\tZ" in status.read_text(), 10), status.read_text()
        assert len(os.listdir(f"/proc/{proc.pid}/task")) == 2
        os.kill(proc.pid, 0)  # the kernel's word: it exists
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_holder_whose_first_thread_has_exited_but_whose_threads_work_on_keeps_its_job(
    queue: QueueCLI, leaderless: subprocess.Popen
) -> None:
    """Q-5 (the holder is gone when "the pid is dead"), docs/queue.md "Liveness" ("dead" is
    the kernel's word: ``kill(pid, 0)`` answers ESRCH), I-4: a process whose main thread
    called ``pthread_exit`` while its other thread runs is alive — only its leader thread
    shows as a zombie.  ``claim --pid`` of it (exit 0) says nothing of a holder gone, ``show``
    judges the holder alive, and ``recover --reconcile`` leaves J claimed."""
    pid = leaderless.pid
    published = queue.publish(request(tag="threads"), name="threads")
    r = queue.run("claim", "--pid", str(pid))
    no_traceback(r)
    assert (r.rc, r.out.strip()) == (0, published), r
    shown = queue.run("show", published, "--json")
    assert shown.rc == 0, shown
    assert shown.json()["holder"]["state"] == "alive", shown.json()["holder"]
    found = report(queue, "--reconcile", status=0)
    assert found["requeued"] == [], found
    assert queue.state(published) == "claimed"
    assert "has exited" not in r.err, r


def stepped_clock(top: Path, seconds: int) -> list[str]:
    """An argv prefix running a command as it runs once the wall clock was stepped by
    ``seconds`` since now (NTP stepping it after a suspend, ``date -s``): the kernel then
    reports the boot time (``btime`` of /proc/stat, the wall-clock time of the boot) that
    much later, while no process's start in ticks since boot changes.  A copy of /proc/stat
    with that ``btime`` is bind-mounted over it in a private mount namespace; the system
    clock itself is left alone."""
    text = Path("/proc/stat").read_text()
    booted = int(re.search(r"^btime (\d+)$", text, re.MULTILINE)[1])
    fake = top / "stat"
    fake.write_text(re.sub(r"^btime \d+$", f"btime {booted + seconds}", text, flags=re.M))
    script = 'mount --bind "$0" /proc/stat || exit 97; exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(fake)]


def run_in(prefix: list[str], queue: QueueCLI, verb: str, *args: str) -> Run:
    argv = ["queue", verb, "--project", queue.project, *args]
    done = subprocess.run(
        [*prefix, *CTX_ARGV, *argv],
        capture_output=True,
        text=True,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        timeout=60,
    )
    if done.returncode == 97:
        pytest.skip(f"cannot bind-mount over a /proc file here: {done.stderr.strip()}")
    return Run(argv, done.returncode, done.stdout, done.stderr)


@needs_unshare
def test_a_live_holder_keeps_its_job_after_the_wall_clock_is_stepped(
    queue: QueueCLI, holder, tmp_path: Path
) -> None:
    """Q-5 (a pid with "another start time" is proof of reuse), docs/queue.md "Liveness" (a
    holder whose lease is still valid and whose process is alive is never touched), I-4:
    the holder's process started once; stepping the wall clock does not make it another
    process.  Seen after a 30 s step, ``show`` judges the live holder of a valid lease alive
    and ``recover`` leaves its job claimed."""
    j = claimed_for(queue, "stepped", holder.pid, "--ttl", "3600")
    prefix = stepped_clock(tmp_path, 30)
    shown = run_in(prefix, queue, "show", j, "--json")
    no_traceback(shown)
    assert shown.rc == 0, shown
    assert shown.json()["holder"]["state"] == "alive", shown.json()["holder"]
    found = run_in(prefix, queue, "recover", "--json")
    no_traceback(found)
    assert found.json()["requeued"] == [], found
    assert queue.state(j) == "claimed"


@needs_unshare
def test_the_holder_renews_its_own_lease_after_the_wall_clock_is_stepped(
    queue: QueueCLI, holder, tmp_path: Path
) -> None:
    """Q-3 (a worker may renew its own lease while it runs): after a 30 s step of the wall
    clock, ``renew --pid`` naming the holder that claimed J is that holder's renewal (exit
    0, the lease extended), not EACCES for "another process of that number"."""
    j = claimed_for(queue, "stepped", holder.pid, "--ttl", "60")
    stamp = queue.lease(j)["expires_at"]
    prefix = stepped_clock(tmp_path, 30)
    r = run_in(prefix, queue, "renew", j, "--pid", str(holder.pid), "--ttl", "600")
    no_traceback(r)
    assert r.rc == 0, r
    assert queue.lease(j)["expires_at"] > stamp


def unreadable_boot_id() -> list[str]:
    """An argv prefix running a command on a host whose boot id cannot be read (an empty
    /proc/sys/kernel/random/boot_id, bind-mounted in a private mount namespace)."""
    script = 'mount --bind /dev/null /proc/sys/kernel/random/boot_id || exit 97; exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


@needs_unshare
def test_a_host_that_cannot_read_its_boot_id_leases_as_unknown_and_judges_no_reboot(
    queue: QueueCLI,
) -> None:
    """docs/queue.md (how a lease is read: ``unknown``, a holder that could not read its boot
    id, proves no reboot) and "Liveness", Q-5: a claim made where the boot id cannot be read
    writes ``boot_id`` ``unknown``; seen from this host, that dead holder's job is ``unknown``
    and left alone (a dead pid proves nothing without the boot), while a dead holder of
    this boot is requeued.  Seen from the host that cannot read its boot id, the reverse:
    the holder of this boot "cannot be judged: this host's boot id is unknown" and is left
    alone, while its own dead holder is gone.  Dry runs change nothing; each side's
    recover requeues only what it may, and both jobs end pending, once each."""
    blind = unreadable_boot_id()
    a = queue.publish(request(tag="a"), name="a")
    b = queue.publish(request(tag="b"), name="b")
    took = run_in(blind, queue, "claim", "--pid", str(DEAD_PID))
    assert (took.rc, took.out.strip()) == (0, a), took
    assert queue.lease(a)["boot_id"] == "unknown"
    assert queue.claim("--pid", str(DEAD_PID)) == b
    assert queue.lease(b)["boot_id"] != "unknown"
    before = snapshot(queue.dir)

    here = report(queue, "--dry-run", status=0)
    assert jobs_in(here, "requeued") == [b] and jobs_in(here, "untouched") == [a], here
    there = run_in(blind, queue, "recover", "--dry-run", "--json")
    no_traceback(there)
    assert there.rc == 0, there
    assert jobs_in(there.json(), "requeued") == [a], there
    (left,) = there.json()["untouched"]
    assert left["job"] == b and "this host's boot id is unknown" in left["detail"], left
    shown = run_in(blind, queue, "show", b, "--json")
    assert shown.json()["holder"]["state"] == "unknown", shown
    assert snapshot(queue.dir) == before

    assert jobs_in(report(queue, status=0), "requeued") == [b]
    assert jobs_in(run_in(blind, queue, "recover", "--json").json(), "requeued") == [a]
    assert queue.requests() == {a: ["pending"], b: ["pending"]}
    assert report(queue, status=0)["requeued"] == []
