"""docs/mount.md, docs/multi-host.md and docs/crash-model.md taken literally, as a new user
copies them (SPEC §2, §13 F-1, §14 N-1): the three ``ctx mount``/``ctx umount`` lines typed in
a shell with ``&``, the signals the page says end a mount, the refusals and the remedies they
print, run as printed, the six root entries, the view's table for models; the lease fields and
liveness rules of multi-host.md written into leases as another host would, ``lease_ttl`` and
``--ttl``, the NFS caveat of an empty ``claimed/J`` and ``move=link`` (link, fsync of the
destination, then unlink); and crash-model.md's counts of fsyncs, the single ``syncfs`` of a
batch, the replacing rename of ``renew``, the shared staging name of publishers and the
conflict recover never resolves.  Everything goes through the installed ``ctx`` on a scratch
storage root, with real FUSE mounts and ``strace`` where the pages name system calls."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MOUNT_WAIT,
    REPO,
    ROOT_ENTRIES,
    Mount,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    needs_fuse_as_root,
    new_scratch_dir,
    rfc3339,
    scratch_top,
    serving,
    snapshot,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
PROJECT = "proj"  # the queue the acceptance template holds
REQUEST = {"tool": "fs.stat", "input": {"path": "/"}}  # the README's request
needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
needs_unshare = pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare")


@dataclass
class World:
    """A scratch directory (mode 0755) holding a bootstrapped storage root ``storage``."""

    top: Path

    @property
    def root(self) -> Path:
        return self.top / "storage"

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.root))

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def queue(self, project: str = PROJECT) -> QueueCLI:
        return QueueCLI(self.root, project)

    def set_config(self, project: str, key: str, value: str) -> None:
        """``KEY=VALUE`` as the one ``KEY`` line of ``shared/PROJECT/queue/config``."""
        config = self.root / "shared" / project / "queue" / "config"
        kept = [line for line in config.read_text().splitlines() if not line.startswith(key)]
        config.write_text("\n".join([*kept, f"{key}={value}"]) + "\n")

    def create_coder(self, **fields) -> None:
        """``ctx agent create`` of coder (as root: uid nobody, the root's default)."""
        request = {"name": "coder", "label": "coder_t", "tools": ["fs.stat"], **fields}
        made = self.ctx("agent", "create", "-", input=json.dumps(request))
        assert made.rc == 0, made


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "w")
    try:
        copy_of_root(_template, top / "storage")
        yield World(top)
    finally:
        for where in mount_points():
            if where.startswith(str(top)):  # a mount a failed assertion left behind
                subprocess.run(["umount", "-l", where], check=False)
        shutil.rmtree(top, ignore_errors=True)


def traced(
    world: World, calls: str, *args: str, under: Path | None = None
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``ctx ARGS`` under ``strace -f -y -e trace=CALLS``: the run and the calls it made that
    name a path below ``under`` (default: the storage root), without their pids."""
    log = world.top / f"strace-{uuid.uuid4().hex}.log"
    run = subprocess.run(
        ["strace", "-f", "-qq", "-y", "-e", f"trace={calls}", "-o", str(log), *CTX_ARGV, *args],
        env=world.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    lines = [re.sub(r"^\d+\s+", "", line) for line in log.read_text().splitlines()]
    log.unlink()
    where = str(under or world.root)
    return run, [line for line in lines if where in line and "resumed>" not in line]


def remedy(said: str, before: str, after: str) -> str:
    """The command a message quotes between ``before`` and ``after``."""
    found = re.search(re.escape(before) + r"(.*?)" + re.escape(after), said)
    assert found, said
    return found.group(1)


def sh(command: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``command`` pasted into sh, with the venv's ``ctx`` first on PATH."""
    path = f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run(["sh", "-c", command], env={**env, "PATH": path},
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def in_mount_table(point: Path) -> bool:
    """Whether something is mounted at ``point``, whose name may hold a space (mountinfo
    writes space, tab, newline and backslash as octal escapes)."""
    return str(point) in mount_points()


def mount_points() -> list[str]:
    unescape = lambda field: re.sub(r"\\([0-7]{3})", lambda o: chr(int(o[1], 8)), field)  # noqa: E731
    table = Path("/proc/self/mountinfo").read_text().splitlines()
    return [unescape(line.split()[4]) for line in table]


@contextlib.contextmanager
def background(world: World, given: Path, mounted_on: Path, *options: str) -> Iterator[Mount]:
    """``ctx mount OPTIONS GIVEN &`` until the block ends, mounted on ``mounted_on``; then
    unmounted if still there, and its process ended."""
    log = world.top / f"mount-{uuid.uuid4().hex}.err"
    with open(log, "wb") as err:
        proc = subprocess.Popen([*CTX_ARGV, "mount", *options, str(given)], env=world.env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                start_new_session=True)  # fmt: skip
    mount = Mount(proc, mounted_on, log)
    try:
        assert wait_for(lambda: in_mount_table(mounted_on) or proc.poll() is not None,
                        MOUNT_WAIT), mount.said()  # fmt: skip
        assert proc.poll() is None, mount.said()
        yield mount
    finally:
        unmount_all(mounted_on)
        try:
            proc.wait(timeout=MOUNT_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def unmount_all(*points: Path) -> None:
    for point in points:
        if in_mount_table(point):
            ctx_run("umount", point, timeout=30)
        if in_mount_table(point):
            subprocess.run(["umount", "-l", str(point)], check=False)


# ================================================================ what the pages name


def test_every_option_command_and_file_the_three_pages_name_exists(world: World) -> None:
    """F-1, §2.4, N-1: each ``ctx`` option docs/mount.md, docs/multi-host.md and
    docs/crash-model.md name is in that command's ``--help``; the ``queue/config`` keys
    multi-host.md names (``lease_ttl``, ``move=link``) are those ``ctx queue init`` writes;
    the worker's wait of "at least every 2 s" is what ``ctx queue work --help`` says;
    ``make crash`` runs ``tests/crash`` and ``./scripts/test`` exists; every file and name of
    the harness crash-model.md points a reader to is there, and ``CTX_CRASH_SEED`` defaults to
    the printed seed."""
    named = {
        ("mount",): ["--as", "--storage"],
        ("umount",): [],
        ("queue", "recover"): ["--reconcile", "--dry-run", "--grace"],
        ("queue", "claim"): ["--ttl", "--pid"],
        ("queue", "publish"): ["--batch", "--name"],
        ("queue", "work"): ["--drain", "--ttl"],
        ("run",): ["--agent"],
    }
    for command, options in named.items():
        helped = world.ctx(*command, "--help")
        assert helped.rc == 0 and helped.out.startswith(f"Usage: ctx {' '.join(command)} ")
        for option in options:
            assert re.search(rf"(^|\s){re.escape(option)}[\s,]", helped.out), (option, helped)
    work = " ".join(world.ctx("queue", "work", "--help").out.split())
    assert "at least every 2 s" in work, work

    made = world.ctx("queue", "init", "--project", "hosts")
    assert made.rc == 0, made
    config = (world.root / "shared" / "hosts" / "queue" / "config").read_text()
    assert re.search(r"^lease_ttl=\d+", config, re.M) and "move=link" in config, config

    dry = subprocess.run(["make", "-n", "crash"], cwd=REPO, capture_output=True, text=True,
                         timeout=60, check=False)  # fmt: skip
    assert dry.returncode == 0 and "pytest tests/crash" in dry.stdout, dry
    assert os.access(REPO / "scripts" / "test", os.X_OK)
    crash = REPO / "tests" / "crash"
    names = {
        "recorder.py": ["class RecordingOps", "def verify_live"],
        "persistence.py": [],
        "oracle.py": [],
        "expectations.py": [],
        "kill_runner.py": ["class DyingOps"],
        "kill_check.py": [],
        "test_kill.py": [],
        "test_model.py": [],
        "test_recorder.py": [],
        "test_mutations.py": [],
        "mutants.py": [],
    }
    for name, inside in names.items():
        text = (crash / name).read_text()
        assert all(words in text for words in inside), (name, inside)
    seeded = "".join(p.read_text() for p in crash.glob("*.py"))
    assert re.search(r"CTX_CRASH_SEED[\"'], [\"']20260622", seeded)
    durable = (REPO / "cortexfs" / "durable.py").read_text()
    for words in ("class FsOps", "def default_move_strategy", "def move_noreplace"):
        assert words in durable, words
    steps = "".join(p.read_text() for p in (REPO / "cortexfs" / "queue").glob("*.py"))
    assert "ops.step(" in steps


# ============================================================== crash-model.md, counted


@needs_strace
def test_a_lifecycle_is_18_fsyncs_a_batch_one_syncfs_and_renew_a_replacing_rename(
    world: World,
) -> None:
    """Q-1..Q-4, Q-7 (docs/crash-model.md §2 rule 4, §8 fifth change, §9): with the rename
    strategy a publish, claim and finish of one job cost 3 + 7 + 8 = 18 fsyncs ("a lifecycle
    18 instead of 16"); ``publish --batch`` writes every temp file, makes one ``syncfs`` and
    only then moves the names, with no fsync of a temp file ("N temp files written, one
    syncfs, then the names"); ``renew`` replaces ``lease/J/worker`` with a rename."""
    queue = world.queue()
    world.set_config(PROJECT, "move", "rename")
    request = world.top / "request.json"
    request.write_text(json.dumps(REQUEST))
    result = world.top / "result.json"
    result.write_text('{"size": 4096}\n')
    syncs = "fsync,fdatasync,syncfs,sync,sync_file_range"
    pid = str(os.getpid())

    ran, published = traced(world, syncs, "queue", "publish", "--project", PROJECT, str(request))
    assert ran.returncode == 0, ran
    job = ran.stdout.strip()
    ran, claimed = traced(world, syncs, "queue", "claim", "--project", PROJECT, "--pid", pid)
    assert ran.returncode == 0 and ran.stdout.strip() == job, ran
    ran, renewed = traced(world, "renameat2,renameat,rename,linkat,fsync", "queue", "renew",
                          "--project", PROJECT, "--pid", pid, job)  # fmt: skip
    assert ran.returncode == 0, ran
    ran, finished = traced(world, syncs, "queue", "finish", "--project", PROJECT, job, "--ok",
                           str(result))  # fmt: skip
    assert ran.returncode == 0 and queue.state(job) == "done", ran
    counts = [len(published), len(claimed), len(finished)]
    assert counts == [3, 7, 8] and sum(counts) == 18, (published, claimed, finished)
    assert all(line.startswith("fsync(") for line in published + claimed + finished)

    moves = [line for line in renewed if not line.startswith("fsync(")]
    assert len(moves) == 1 and moves[0].startswith(("renameat(", "renameat2(")), renewed
    assert f'/lease/{job}>, "worker"' in moves[0] and "NOREPLACE" not in moves[0], moves

    batch = world.top / "batch.jsonl"
    batch.write_text("".join(json.dumps({**REQUEST, "n": n}) + "\n" for n in range(4)))
    watched = "openat,write,fsync,fdatasync,syncfs,renameat2,renameat,linkat"
    ran, calls = traced(world, watched, "queue", "publish", "--project", PROJECT, "--batch",
                        str(batch))  # fmt: skip
    assert ran.returncode == 0 and len(ran.stdout.split()) == 4, ran
    kinds = [line.split("(", 1)[0] for line in calls]
    assert kinds.count("syncfs") == 1, calls
    barrier = kinds.index("syncfs")
    temp_writes = [i for i, line in enumerate(calls) if line.startswith("write(") and
                   ".publish.tmp>" in line]  # fmt: skip
    names = [i for i, kind in enumerate(kinds) if kind in ("renameat2", "renameat", "linkat")]
    assert len(temp_writes) == 4 and max(temp_writes) < barrier, calls
    assert len(names) == 4 and min(names) > barrier, calls
    assert not [line for line in calls if line.startswith("fsync(") and ".publish.tmp" in line]


@needs_strace
def test_move_link_links_syncs_the_destination_then_unlinks_at_every_step(
    world: World,
) -> None:
    """N-1, Q-1..Q-4, Q-7 (docs/multi-host.md: "moves names with link, fsync of the
    destination directory, then unlink ... Set move=link in queue/config to force it"): with
    ``move=link`` no step renames; every ``link`` of publish, claim and finish is followed by
    an fsync of its destination directory before the source name is unlinked, and that
    unlink by an fsync of the source directory."""
    world.set_config(PROJECT, "move", "link")
    request = world.top / "request.json"
    request.write_text(json.dumps(REQUEST))
    calls = "linkat,link,unlinkat,unlink,renameat2,renameat,rename,fsync"
    ran, published = traced(world, calls, "queue", "publish", "--project", PROJECT, str(request))
    job = ran.stdout.strip()
    ran, claimed = traced(world, calls, "queue", "claim", "--project", PROJECT, "--pid",
                          str(os.getpid()))  # fmt: skip
    assert ran.stdout.strip() == job, ran
    result = world.top / "result.json"
    result.write_text('{"exit": 1}\n')
    ran, finished = traced(world, calls, "queue", "finish", "--project", PROJECT, job, "--error",
                           str(result))  # fmt: skip
    assert ran.returncode == 0 and world.queue().state(job) == "failed", ran
    link = re.compile(r'linkat\(\d+<(?P<src>[^>]*)>, "(?P<name>[^"]*)", \d+<(?P<dst>[^>]*)>, ')
    for step in (published, claimed, finished):
        assert not [line for line in step if line.startswith("rename")], step
        links = [(i, link.match(line)) for i, line in enumerate(step) if link.match(line)]
        assert links, step
        for i, moved in links:
            src, name, dst = moved["src"], moved["name"], moved["dst"]
            unlink = next(j for j in range(i + 1, len(step)) if unlinks(step[j], src, name))
            assert step[i + 1].startswith("fsync(") and f"<{dst}>" in step[i + 1], (step[i:], dst)
            assert i + 1 < unlink, step
            assert step[unlink + 1].startswith("fsync(") and f"<{src}>" in step[unlink + 1]


def unlinks(call: str, directory: str, name: str) -> bool:
    """Whether the strace line ``call`` is the unlink of ``name`` in ``directory``."""
    return bool(re.match(rf'unlinkat\(\d+<{re.escape(directory)}>, "{re.escape(name)}"', call))


# ============================================================ multi-host.md, the lease


def test_lease_lifetime_and_the_three_liveness_rules_as_multi_host_md_lists_them(
    world: World,
) -> None:
    """N-1, Q-3, Q-5 (docs/multi-host.md, *Who is alive: the lease*): the lease lifetime is
    ``lease_ttl`` of ``queue/config`` unless ``claim --ttl`` gives one; rule 1: this boot and
    pid namespace with a live pid (this process) is left alone, but once ``expires_at`` has
    passed it is requeued "even when its pid is alive on this host"; rule 2: this host name
    with another boot is requeued at once when the machine-id is the same or not recorded, and
    left until expiry under another machine-id; rule 3: another pid namespace of this boot,
    its pid dead here, is left until expiry."""
    queue = world.queue()
    world.set_config(PROJECT, "lease_ttl", "1000")
    pid = str(os.getpid())

    def claimed(*ttl: str) -> tuple[str, dict]:
        job = queue.publish()
        assert queue.claim("--pid", pid, *ttl) == job
        lease = queue.lease(job)
        lifetime = rfc3339(lease["expires_at"]) - rfc3339(lease["claimed_at"])
        return job, {**lease, "lifetime": lifetime.total_seconds()}

    job, lease = claimed()
    assert abs(lease["lifetime"] - 1000) < 2, lease
    other, short = claimed("--ttl", "50")
    assert abs(short["lifetime"] - 50) < 2, short
    del lease["lifetime"], short["lifetime"]

    def recover() -> Run:
        return world.ctx("queue", "recover", "--project", PROJECT)

    kept = recover()
    assert kept.rc == 0 and {queue.state(job), queue.state(other)} == {"claimed"}, kept

    past = (datetime.now(UTC) - timedelta(seconds=5)).isoformat().replace("+00:00", "Z")
    queue.write_lease(job, {**lease, "expires_at": past})
    expired = recover()
    assert expired.rc == 0 and queue.state(job) == "pending", expired
    assert queue.state(other) == "claimed", expired
    assert queue.claim("--pid", pid) == job
    queue.finish(job)

    machine_file = Path("/etc/machine-id")
    machine = machine_file.read_text().strip() if machine_file.exists() else None
    another_boot = {**short, "boot_id": str(uuid.uuid4())}
    no_machine = {k: v for k, v in another_boot.items() if k != "machine_id"}
    cases = [
        ({**another_boot, "machine_id": uuid.uuid4().hex}, "claimed"),  # rule 3: other machine
        ({**short, "pid_ns": short["pid_ns"] + 1, "pid": 4194303}, "claimed"),  # rule 3
        (no_machine, "pending"),  # rule 2, not recorded on one side
    ]
    if machine is not None:
        cases.append(({**another_boot, "machine_id": machine}, "pending"))  # rule 2
    for written, state in cases:
        if queue.state(other) != "claimed":
            assert queue.claim("--pid", pid) == other
        queue.write_lease(other, written)
        judged = recover()
        assert judged.rc == 0 and queue.state(other) == state, (written, judged)


def test_an_empty_claim_left_by_a_retransmitted_mkdir_waits_for_reconcile(world: World) -> None:
    """Q-2, Q-6, N-1 (docs/multi-host.md, *Non-idempotent retransmitted mkdir*; crash-model.md
    §8 third change): an empty ``claimed/J`` beside a pending J lets no worker claim J (exit
    3), plain ``recover`` reports it (exit 1) and changes nothing, ``recover --reconcile``
    leaves it while a claimer holds its lock (a claim between its ``mkdir`` and its move),
    removes it once free, and J is claimable again: "no job is lost or run twice"."""
    queue = world.queue()
    job = queue.publish()
    empty = queue.dir / "claimed" / job
    empty.mkdir()
    pid = str(os.getpid())
    none = queue.run("claim", "--pid", pid)
    assert none.rc == 3 and none.out == "" and queue.state(job) == "pending", none
    status = queue.run("status")
    assert status.rc == 0 and f"incomplete {job}" in status.out, status
    before = snapshot(queue.dir)
    plain = queue.run("recover")
    assert plain.rc == 1 and "--reconcile" in plain.out and snapshot(queue.dir) == before, plain

    fd = os.open(empty, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        busy = queue.run("recover", "--reconcile")
        assert busy.rc == 0 and f"untouched {job}" in busy.out and empty.is_dir(), busy
    finally:
        os.close(fd)
    repaired = queue.run("recover", "--reconcile")
    assert repaired.rc == 0 and f"repair   {job}" in repaired.out, repaired
    assert not empty.exists() and queue.claim("--pid", pid) == job
    assert queue.requests() == {job: ["claimed"]}


# ============================================================= crash-model.md, §8 and §9


def test_two_results_are_a_conflict_recover_reports_and_never_resolves(world: World) -> None:
    """Q-6, I-5 (docs/crash-model.md §9, *Two finishers with different outcomes*): a job with
    ``done/J.result`` and the ``failed/`` pair "becomes a conflict ... that recover reports
    and never resolves": ``status``, ``show``, plain ``recover``, ``--reconcile`` and its
    ``--dry-run`` all exit 1 naming every piece of evidence, and the queue is byte for byte as
    it was."""
    queue = world.queue()
    job = queue.terminal("twice", "failed")
    ok = {"status": "ok", "output": {"by": "other holder"}, "worker": {"worker": "b"},
          "started": "2026-06-22T12:00:00Z", "finished": "2026-06-22T12:00:01Z"}  # fmt: skip
    (queue.dir / "done" / f"{job}.result").write_text(json.dumps(ok))
    before = snapshot(queue.dir)
    evidence = [f"done/{job}.result", f"failed/{job}", f"failed/{job}.result"]
    for args in ((), ("--reconcile",), ("--reconcile", "--dry-run"), ("--reconcile",)):
        run = queue.run("recover", *args)
        assert run.rc == 1 and f"conflict {job}" in run.out, run
        assert all(piece in run.out for piece in evidence), run
        assert "queue NOT consistent" in run.out, run
    for command in (("status",), ("show", job)):
        run = queue.run(*command)
        assert run.rc == 1 and "conflict" in run.out, run
    assert snapshot(queue.dir) == before


def test_a_publishers_staging_name_holds_its_job_name_until_reconcile_after_grace(
    world: World,
) -> None:
    """Q-1, Q-6 (docs/crash-model.md §9: publishers of J "share one staging name,
    inbox/J.publish.tmp, created with O_EXCL"): a staging file a dead publisher left refuses
    ``publish --name J`` with EEXIST (exit 1, the reconcile command named, nothing pending);
    ``recover --reconcile`` keeps it while it is younger than the grace period and removes it
    with ``--grace 0``; J is then published."""
    queue = world.queue()
    staging = queue.dir / "inbox" / "stale.req.json.publish.tmp"
    staging.write_text(json.dumps(REQUEST))
    refused = queue.run("publish", "--name", "stale", "-", input=json.dumps(REQUEST))
    assert refused.rc == 1 and refused.err.startswith("ctx: EEXIST: "), refused
    assert queue.entries("pending") == set() and staging.exists()
    command = remedy(refused.err, "; '", "' removes it once the grace period has passed")
    assert command.startswith("ctx queue recover ") and "--reconcile" in command, refused
    young = sh(command, world.env)
    assert young.returncode == 0 and staging.exists(), young
    removed = sh(f"{command} --grace 0", world.env)
    assert removed.returncode == 0 and not staging.exists(), removed
    assert "inbox/stale.req.json.publish.tmp" in removed.stdout, removed
    assert queue.publish(name="stale") == "stale.req.json"
    assert queue.entries("inbox") == set()


# ===================================================================== docs/mount.md


SIX_ENTRIES = """
import ctypes, errno, json, os, sys
m, spare = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
def tried(call):
    try:
        call()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
def exchange(a, b):
    r = libc.renameat2(-100, a.encode(), -100, b.encode(), 2)
    return "ok" if r == 0 else errno.errorcode[ctypes.get_errno()]
os.mkdir(f"{spare}/empty")
open(f"{spare}/file", "w").close()
print(json.dumps({
    "replace_model": tried(lambda: os.rename(f"{spare}/empty", f"{m}/model")),
    "exchange_bin": exchange(f"{spare}/empty", f"{m}/bin"),
    "move_into_root": tried(lambda: os.rename(f"{spare}/file", f"{m}/extra")),
    "link_into_root": tried(lambda: os.link(f"{spare}/file", f"{m}/extra")),
    "mkdir_root": tried(lambda: os.mkdir(f"{m}/extra")),
    "rmdir_model": tried(lambda: os.rmdir(f"{m}/model")),
    "listing": sorted(os.listdir(m)),
}))
"""


@needs_fuse_as_root
def test_the_pages_three_lines_mount_both_views_and_every_ending_exits_0(world: World) -> None:
    """F-1, R-2, T-5 (docs/mount.md, the first block and *What each view shows*): ``ctx mount
    HOST &`` and ``ctx mount --as coder VIEW &`` typed in sh; both views hold exactly the six
    root entries; through the host's view none of the six is replaced (an empty directory
    renamed over ``model/``, ``RENAME_EXCHANGE`` with ``bin/``: EPERM) or removed, and
    nothing is made at the root by rename, link or mkdir (EACCES); the queue's moves through
    the mount are ``link`` + ``unlink`` (*Durability*); ``ctx umount HOST`` exits 0 and so
    does its ``ctx mount``; SIGHUP, SIGTERM and a SIGINT in quick succession (a closing
    terminal, a service manager, a second ^C) end the view's with 0 and nothing mounted."""
    world.create_coder()
    host, view = world.top / "ctx", world.top / "coder-ctx"
    host.mkdir()
    view.mkdir()
    out = world.top / "out"
    out.mkdir()
    script = (
        f"ctx mount {host} 2>{out}/host.err & h=$!\n"
        f"ctx mount --as coder {view} 2>{out}/view.err & v=$!\n"
        f'echo "$h $v" > {out}/pids\n'
        f"wait $h; echo $? > {out}/host.rc\n"
        f"wait $v; echo $? > {out}/view.rc\n"
    )
    path = f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    shell = subprocess.Popen(["sh", "-c", script], env={**world.env, "PATH": path},
                             start_new_session=True)  # fmt: skip
    try:
        assert wait_for(lambda: in_mount_table(host) and in_mount_table(view), MOUNT_WAIT), (
            (out / "host.err").read_text() if (out / "host.err").exists() else "",
            (out / "view.err").read_text() if (out / "view.err").exists() else "",
        )
        view_pid = int((out / "pids").read_text().split()[1])
        assert sorted(os.listdir(host)) == sorted(os.listdir(view)) == sorted(ROOT_ENTRIES)
        spare = world.root / "home" / "0"
        spare.mkdir(exist_ok=True)
        probe = subprocess.run(
            [sys.executable, "-c", SIX_ENTRIES, str(host), str(host / "home" / "0")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert probe.returncode == 0, probe
        seen = json.loads(probe.stdout)
        assert (seen["replace_model"], seen["exchange_bin"], seen["rmdir_model"]) == (
            "EPERM", "EPERM", "EPERM"), seen  # fmt: skip
        assert (seen["move_into_root"], seen["link_into_root"], seen["mkdir_root"]) == (
            "EACCES", "EACCES", "EACCES"), seen  # fmt: skip
        assert seen["listing"] == sorted(ROOT_ENTRIES), seen
        assert sorted(os.listdir(world.root)) == sorted(ROOT_ENTRIES)
        assert (world.root / "bin" / "tsh").exists() and os.listdir(world.root / "model") == []

        if shutil.which("strace"):  # the queue's moves through the mount: link, not rename
            (world.top / "request.json").write_text(json.dumps(REQUEST))
            through = host / "shared" / PROJECT / "queue"
            ran, moves = traced(world, "linkat,renameat2,renameat", "queue", "publish",
                                "--queue", str(through), str(world.top / "request.json"),
                                under=host)  # fmt: skip
            assert ran.returncode == 0, ran
            assert moves and all(line.startswith("linkat(") for line in moves), moves
        done = world.ctx("umount", host, timeout=30)
        assert done.rc == 0 and done.out == "", done
        assert wait_for(lambda: (out / "host.rc").exists(), MOUNT_WAIT)
        assert (out / "host.rc").read_text() == "0\n", (out / "host.err").read_text()
        for stop in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            try:
                os.kill(view_pid, stop)
            except ProcessLookupError:
                break
        assert wait_for(lambda: (out / "view.rc").exists(), MOUNT_WAIT)
        assert (out / "view.rc").read_text() == "0\n", (out / "view.err").read_text()
        assert not in_mount_table(view) and not in_mount_table(host)
        assert "Traceback" not in (out / "view.err").read_text()
    finally:
        unmount_all(host, view)
        try:
            shell.wait(timeout=MOUNT_WAIT)
        except subprocess.TimeoutExpired:
            os.killpg(shell.pid, signal.SIGKILL)
            shell.wait()


@needs_fuse_as_root
@needs_unshare
def test_a_missing_mount_point_and_a_missing_dev_fuse_are_answered_as_the_page_says(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """F-1 (docs/mount.md): a missing mount point is ENOENT, exit 1, "answered with the mkdir
    that makes it" — run as printed it makes it, and the mount then serves there; for a user
    who is not root, with the remedy ``mkdir -p ~/ctx && ctx mount --as coder ~/ctx`` (the
    same options given again); a missing ``/dev/fuse`` is ENODEV naming libfuse's reason,
    exit 1, nothing mounted."""
    missing = world.top / "ctx"
    refused = world.ctx("mount", missing, timeout=30)
    assert refused.rc == 1 and refused.err.startswith("ctx: ENOENT: "), refused
    make = remedy(refused.err, "('", "')")
    assert make.startswith("mkdir "), refused
    made = sh(make, world.env)
    assert made.returncode == 0 and missing.is_dir(), made
    with serving(world.root, missing) as mount:
        assert sorted(os.listdir(missing)) == sorted(ROOT_ENTRIES), mount.said()

    theirs = run_as(unprivileged_user, [*CTX_ARGV, "mount", "--as", "coder", str(missing / "x")],
                    env={**world.env, "HOME": str(world.top)})  # fmt: skip
    assert theirs.returncode == 1 and theirs.stderr.startswith("ctx: ENOENT: "), theirs
    assert "'mkdir -p ~/ctx && ctx mount --as coder ~/ctx'" in theirs.stderr, theirs
    assert f"you may not create entries in {missing}" in theirs.stderr, theirs

    point = world.top / "nodev"
    point.mkdir()
    no_fuse = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c",
         "mount -t tmpfs none /dev && mknod -m 666 /dev/null c 1 3 && "
         "mknod -m 666 /dev/urandom c 1 9 && \"$@\"; rc=$?; "
         f"grep -c ' {point} ' /proc/self/mountinfo; exit $rc", "sh",
         *CTX_ARGV, "mount", str(point)],
        env=world.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert no_fuse.returncode == 1, no_fuse
    assert no_fuse.stderr.startswith("ctx: ENODEV: "), no_fuse
    assert "fuse" in no_fuse.stderr and "Traceback" not in no_fuse.stderr, no_fuse
    assert no_fuse.stdout.strip() == "0" and not in_mount_table(point), no_fuse


@needs_fuse_as_root
def test_the_mkdir_remedy_makes_a_mount_point_whose_parent_is_missing_too(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """F-1 (docs/mount.md: "A missing mount point is answered with the mkdir that makes it"):
    for ``ctx mount DIR/srv/ctx`` where ``DIR/srv`` does not exist either, the printed
    command, run as printed, makes the mount point; for a user who may make ``DIR/srv`` in a
    directory of their own, the message does not say they may not create entries there."""
    mine = world.top / "mine"
    mine.mkdir()
    os.chown(mine, unprivileged_user.uid, unprivileged_user.gid)
    theirs = run_as(unprivileged_user, [*CTX_ARGV, "mount", str(mine / "srv" / "ctx")],
                    env={**world.env, "HOME": str(mine)})  # fmt: skip

    deep = world.top / "srv" / "ctx"
    refused = world.ctx("mount", deep, timeout=30)
    assert refused.rc == 1 and refused.err.startswith("ctx: ENOENT: "), refused
    made = sh(remedy(refused.err, "('", "')"), world.env)
    assert made.returncode == 0 and deep.is_dir(), (refused, made)

    assert theirs.returncode == 1 and theirs.stderr.startswith("ctx: ENOENT: "), theirs
    assert "you may not create entries" not in theirs.stderr, theirs


@needs_fuse_as_root
def test_the_ebusy_remedy_unmounts_a_mount_point_whose_name_holds_a_space(world: World) -> None:
    """F-1 (docs/mount.md: EBUSY "it is already a CortexFS mount: ``ctx umount`` it first"):
    ``ctx mount`` on a mount point already served is EBUSY, exit 1, and the ``ctx umount``
    command it prints, run as printed, unmounts it — also where the path holds a space, as
    the ``mkdir`` remedy of the same command line quotes it."""
    point = world.top / "my ctx"
    point.mkdir()
    with background(world, point, point) as mount:
        busy = world.ctx("mount", point, timeout=30)
        assert busy.rc == 1 and busy.err.startswith("ctx: EBUSY: "), busy
        command = remedy(busy.err, "unmount it with '", "' first")
        ran = sh(command, world.env)
        assert ran.returncode == 0, (command, ran.stderr)
        assert not in_mount_table(point) and mount.proc.wait(timeout=MOUNT_WAIT) == 0


@needs_fuse_as_root
def test_umount_of_the_path_given_to_mount_when_it_is_a_symbolic_link(world: World) -> None:
    """F-1 (docs/mount.md: ``ctx mount /ctx &`` then ``ctx umount /ctx``; "``ctx umount
    MOUNTPOINT`` finds the mount in the mount table"): where ``/ctx`` is a symbolic link to a
    directory (``/ctx -> /srv/ctx``), ``ctx mount`` mounts on the directory it leads to; the
    page's ``ctx umount`` of the same path must unmount it (exit 0, ``ctx mount`` exit 0), and
    a second ``ctx mount`` there is EBUSY as for any served mount point."""
    real = world.top / "srv-ctx"
    real.mkdir()
    link = world.top / "ctx"
    link.symlink_to(real)
    with background(world, link, real) as mount:
        assert sorted(os.listdir(link)) == sorted(ROOT_ENTRIES)
        again = world.ctx("mount", link, timeout=30)
        done = world.ctx("umount", link, timeout=30)
        assert done.rc == 0, done
        assert mount.proc.wait(timeout=MOUNT_WAIT) == 0, mount.said()
        assert not in_mount_table(real)
        assert again.rc == 1 and again.err.startswith("ctx: EBUSY: "), again


@needs_fuse_as_root
def test_an_agents_view_lists_a_model_only_when_the_chain_lets_it_use_it(world: World) -> None:
    """F-1, T-5, P-5 step 6 (docs/mount.md, *What each view shows*: ``model/<p>/<m>``,
    "models its policy lets it use"; SPEC F-1: "only objects that pass the effective
    authority check are listed"): coder's policy grants ``model:openai/gpt-5.6 use`` and
    ``model:openai/ok use``; only ``ok``'s own policy holds the rule.  ``ctx policy explain``
    allows ``ok`` and denies ``gpt-5.6`` at step 6; the view lists ``ok`` and a provider with
    none of its models usable not at all, as it leaves out ``fs.stat`` whose own policy lacks
    coder's rule — and must leave out ``gpt-5.6`` alike."""
    world.create_coder(model=["openai/gpt-5.6", "openai/ok"])
    for name, rule in (("gpt-5.6", ""), ("ok", "allow coder_t model:openai/ok use\n"),
                       ("hidden", "allow coder_t model:openai/hidden use\n")):  # fmt: skip
        control = world.root / "model" / "openai" / f"{name}.d"
        control.mkdir(parents=True)
        (world.root / "model" / "openai" / name).write_text("{}\n")
        (control / "policy").write_text(rule)
    (world.root / "model" / "other" / "m.d").mkdir(parents=True)
    (world.root / "model" / "other" / "m").write_text("{}\n")

    explain = {m: world.ctx("policy", "explain", "coder", f"model:openai/{m}", "use").rc
               for m in ("gpt-5.6", "ok", "hidden")}  # fmt: skip
    assert explain == {"gpt-5.6": 1, "ok": 0, "hidden": 1}, explain
    tool = world.ctx("policy", "explain", "coder", "tool:fs.stat", "execute")
    assert tool.rc == 1 and "step 6" in tool.out, tool

    view = world.top / "view"
    view.mkdir()
    with serving(world.root, view, "--as", "coder") as mount:
        assert os.listdir(view / "tool") == ["tsh.d"], mount.said()
        assert os.listdir(view / "model") == ["openai"]
        models = sorted(os.listdir(view / "model" / "openai"))
        assert "ok" in models and "hidden" not in models, models
        with pytest.raises(FileNotFoundError):
            (view / "model" / "other").stat()
        assert models == ["ok", "ok.d"], models
        with pytest.raises(OSError) as hidden:
            (view / "model" / "openai" / "gpt-5.6").stat()
        assert hidden.value.errno == errno.ENOENT
