"""One project queue (SPEC §2) used at the same time through a ``ctx mount`` of its storage root
(§13 F-1, docs/mount.md) and directly on the storage root: claimers and finishers on both
sides, ``recover`` on one side while the other holds live leases, batches published on one
side while the other claims and lists, a lease taken on one side and renewed and finished on
the other, ``show --json`` read through both, no-replace moves and ``mkdir`` raced between the
two, ``ctx umount`` while claimers work through the mount, and a plain shell user reading the
queue through the mount while it changes underneath.

docs/mount.md says a queue is to be used "either all through one mount or all directly on the
storage root, never both at once", because ``flock`` through the mount does not see a lock
taken on the storage root: a ``recover --reconcile`` on one side may then take a claim in
progress on the other for a crash's leftover.  The flows here keep to what that leaves
promised across the two sides: ``mkdir`` and no-replace moves arbitrate on the disk itself,
and a job whose lease holder is alive is never touched (Q-5, Q-6)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Mount,
    Run,
    clean_env,
    ctx_run,
    needs_fuse_as_root,
    new_scratch_dir,
    requests_by_state,
    rfc3339,
    scratch_top,
    serving,
    wait_for,
)
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = needs_fuse_as_root

SCRATCH = scratch_top(__file__)
PROJECT = "proj"  # the queue the acceptance template holds
CTX = shlex.quote(CTX_ARGV[0])
BOUND = 40.0  # seconds: a generous bound for processes to end, never a timing assertion
EMPTY = ("pending", "claimed", "lease", "inbox")


# ------------------------------------------------------------------------------ helpers


@dataclass
class Sides:
    """A storage root, a ``ctx mount`` of it, and the queue's arguments on either side."""

    storage: Path
    mount: Mount
    scratch: Path

    @property
    def disk(self) -> Path:
        return self.storage / "shared" / PROJECT / "queue"

    @property
    def view(self) -> Path:
        return self.mount.where / "shared" / PROJECT / "queue"

    def direct(self, style: int = 0) -> list[str]:
        """The queue on the storage root: ``--storage/--project`` or ``--queue``."""
        if style:
            return ["--queue", str(self.disk)]
        return ["--storage", str(self.storage), "--project", PROJECT]

    def through(self, style: int = 0) -> list[str]:
        """The same queue through the mount: ``--queue`` or ``--storage/--project``."""
        if style:
            return ["--storage", str(self.mount.where), "--project", PROJECT]
        return ["--queue", str(self.view)]

    def ctx(self, command: str, side: list[str], *args: str, **kw) -> Run:
        kw.setdefault("env", clean_env())
        return ctx_run("queue", command, *side, *args, **kw)


@pytest.fixture
def sides(storage: Path) -> Iterator[Sides]:
    """The acceptance storage root with queue ``proj``, mounted (host's view) at a scratch
    directory every uid may reach."""
    scratch = new_scratch_dir(SCRATCH)
    where = scratch / "ctx"
    where.mkdir()
    try:
        with serving(storage, where) as mount:
            yield Sides(storage, mount, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextlib.contextmanager
def processes() -> Iterator[list[subprocess.Popen]]:
    """The processes the block starts (each leading its own session), killed with their
    process groups on the way out, whatever happened."""
    started: list[subprocess.Popen] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=BOUND)


def spawn(started: list, argv: list[str], **kw) -> subprocess.Popen:
    kw.setdefault("env", clean_env(CTX=CTX_ARGV[0]))
    proc = subprocess.Popen(
        argv,
        stdin=kw.pop("stdin", subprocess.DEVNULL),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kw,
    )
    started.append(proc)
    return proc


def ended(proc: subprocess.Popen) -> tuple[str, str]:
    """What ``proc`` wrote, once it has ended (within :data:`BOUND`)."""
    out, err = proc.communicate(timeout=BOUND)
    return out, err


def batch(label: str, count: int) -> list[dict]:
    return [{"tool": "fs.stat", "input": {"path": "/"}, "n": f"{label}-{i}"} for i in range(count)]


def publish_batch(sides: Sides, side: list[str], requests: list[dict]) -> list[str]:
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    done = sides.ctx("publish", side, "--batch", "-", input=lines)
    assert done.rc == 0, done
    names = done.lines()
    assert len(names) == len(requests) == len(set(names)), done
    return names


def result_of(queue: Path, job: str) -> dict:
    return json.loads((queue / "done" / f"{job}.result").read_text())


def tree(queue: Path) -> dict[str, bytes | None]:
    """Every entry of the queue on disk: a file's bytes, None for a directory."""
    found: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(queue):
        for name in dirnames:
            found[str(Path(dirpath, name).relative_to(queue))] = None
        for name in filenames:
            found[str(Path(dirpath, name).relative_to(queue))] = Path(dirpath, name).read_bytes()
    return found


def recovered(sides: Sides, side: list[str], *args: str) -> dict:
    done = sides.ctx("recover", side, "--json", *args)
    assert done.rc in (0, 1), done
    return done.json()


# A claimer as a script runs one: claim, finish with an output naming its side and pid, again,
# until the queue is empty (exit 3).  Each step it takes is one line of its log.  The lease
# holder is this shell: a plain J=$(ctx …), with no redirection inside, runs ctx as the shell's
# child (§2.4, docs/queue.md).
CLAIMER = r"""
side=$1; log=$2; shift 2
exec 2>>"$log.err"
while :; do
  J=$("$CTX" queue claim "$@"); rc=$?
  if [ $rc -eq 3 ]; then echo "empty" >>"$log"; exit 0; fi
  if [ $rc -ne 0 ]; then echo "claimfail $rc" >>"$log"; exit 0; fi
  echo "claim $J" >>"$log"
  if printf '{"by":"%s","pid":%d}' "$side" $$ | "$CTX" queue finish "$@" "$J" --ok - \
       >/dev/null; then
    echo "finish $J" >>"$log"
  else
    echo "finishfail $J" >>"$log"; exit 0
  fi
done
"""


def start_claimer(started: list, side: str, log: Path, queue_args: list[str]) -> subprocess.Popen:
    return spawn(started, ["bash", "-c", CLAIMER, "claimer", side, str(log), *queue_args])


def log_lines(log: Path) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines()] if log.exists() else []


def steps(logs: list[Path], step: str) -> list[str]:
    return [words[1] for log in logs for words in log_lines(log) if words[0] == step]


def counts(sides: Sides, side: list[str]) -> dict:
    done = sides.ctx("status", side, "--json")
    assert done.rc in (0, 1), done
    return done.json()["counts"]


def settled(sides: Sides, **expected: int) -> bool:
    """Whether both sides count the jobs as ``expected`` (docs/mount.md: a name changed on
    the storage root is found again through the mount at its next lookup, which the kernel
    may put off for half a second)."""
    return all(
        all(counts(sides, side)[state] == n for state, n in expected.items())
        for side in (sides.through(), sides.direct())
    )


# ------------------------------------------------------------- claim and finish, both sides


def test_claimers_on_both_sides_take_and_finish_every_job_exactly_once(sides: Sides):
    """Q-2, Q-4, I-4 and W-3 with F-1: two claimers through the mount and two on the storage
    root work one queue (published half through each side) while plain ``recover`` runs over
    and over on both sides.  ``mkdir claimed/J`` arbitrates on the disk whichever side asks,
    so every job is claimed once and finished once, by the claimer that claimed it; nothing is
    lost, left claimed or leased; plain recover, every holder being alive, never requeues or
    changes anything (Q-5, Q-6); both sides then read the same consistent queue."""
    jobs = publish_batch(sides, sides.through(), batch("m", 6))
    jobs += publish_batch(sides, sides.direct(1), batch("d", 6))
    stop = sides.scratch / "stop"
    recover_loop = (
        'while [ ! -e "$STOP" ]; do "$CTX" queue recover "$@" --json; echo; sleep 0.2; done'
    )
    logs = [sides.scratch / f"claimer-{i}" for i in range(4)]
    with processes() as started:
        recovers = [
            spawn(
                started,
                ["bash", "-c", recover_loop, "recover", *side],
                env=clean_env(CTX=CTX_ARGV[0], STOP=str(stop)),
            )
            for side in (sides.through(1), sides.direct())
        ]
        claimers = [
            start_claimer(started, "mount", logs[0], sides.through()),
            start_claimer(started, "disk", logs[1], sides.direct()),
            start_claimer(started, "mount", logs[2], sides.through(1)),
            start_claimer(started, "disk", logs[3], sides.direct(1)),
        ]
        for proc in claimers:
            ended(proc)
        stop.touch()
        said = "".join(ended(proc)[0] for proc in recovers)
    reports = [json.loads(line) for line in said.splitlines() if line.strip()]
    errors = {log.name: Path(f"{log}.err").read_text() for log in logs}
    assert [log_lines(log)[-1] for log in logs] == [["empty"]] * 4, errors
    claimed, finished = steps(logs, "claim"), steps(logs, "finish")
    assert sorted(claimed) == sorted(jobs), errors
    assert sorted(finished) == sorted(jobs), errors
    assert requests_by_state(sides.disk) == {job: ["done"] for job in jobs}
    for log, side in zip(logs, ("mount", "disk", "mount", "disk"), strict=True):
        for job in steps([log], "finish"):
            assert result_of(sides.disk, job)["output"]["by"] == side, job
    for sub in EMPTY:
        assert os.listdir(sides.disk / sub) == [], sub
    assert reports, "recover never ran"
    assert [r["requeued"] for r in reports if r["requeued"]] == []
    assert [r["repaired"] for r in reports if r["repaired"]] == []
    assert wait_for(lambda: settled(sides, done=len(jobs), pending=0, claimed=0), BOUND)
    for side in (sides.through(), sides.direct()):
        after = recovered(sides, side, "--reconcile")
        assert after["consistent"] and after["requeued"] == after["repaired"] == [], after
    status = [sides.ctx("status", side, "--json") for side in (sides.through(), sides.direct())]
    assert [s.rc for s in status] == [0, 0], status
    views = [{k: v for k, v in s.json().items() if k != "queue"} for s in status]
    assert views[0] == views[1]


# ------------------------------------------------------------------ recover and live holders


def test_recover_on_either_side_leaves_live_holders_alone_and_requeues_only_the_dead(
    sides: Sides,
):
    """Q-5 and Q-6 with F-1: three jobs claimed on the storage root and three through the
    mount, each set leased to a live process of its own.  ``recover`` — plain and
    ``--reconcile --grace 0``, through the mount and on the storage root, with both
    spellings of the queue — touches none of them and says the queue is
    consistent; nothing on disk changes.  Once the holder of the mount's claims has gone, a
    recover on the storage root requeues exactly those three, the others' leases byte for
    byte as they were; once the other holder has gone, a recover through the mount requeues
    the rest.  Every job is then pending, once."""
    jobs = publish_batch(sides, sides.direct(), batch("r", 6))
    with processes() as started:
        disk_holder = spawn(started, ["sleep", "300"])
        mount_holder = spawn(started, ["sleep", "300"])
        held: dict[str, list[str]] = {"disk": [], "mount": []}
        for label, side, holder in (
            ("disk", sides.direct(), disk_holder),
            ("mount", sides.through(), mount_holder),
        ):
            for _ in range(3):
                claim = sides.ctx("claim", side, "--pid", str(holder.pid), "--ttl", "600")
                assert claim.rc == 0, claim
                held[label].append(claim.out.strip())
        assert sorted(held["disk"] + held["mount"]) == sorted(jobs)
        assert wait_for(lambda: settled(sides, claimed=6, pending=0), BOUND)
        before = tree(sides.disk)
        runs = (
            (sides.through(), []),
            (sides.direct(), ["--reconcile", "--grace", "0"]),
            (sides.through(1), ["--reconcile", "--grace", "0"]),
            (sides.direct(1), []),
        )
        for side, extra in runs:
            done = sides.ctx("recover", side, "--json", *extra)
            assert done.rc == 0, done
            report = done.json()
            assert report["consistent"], report
            assert report["requeued"] == report["repaired"] == report["conflicts"] == []
            assert sorted(f["job"] for f in report["untouched"]) == sorted(jobs), report
        assert tree(sides.disk) == before

        mount_holder.kill()
        mount_holder.wait()
        report = recovered(sides, sides.direct())
        assert sorted(f["job"] for f in report["requeued"]) == sorted(held["mount"]), report
        for job in held["disk"]:
            lease = f"lease/{job}/worker"
            assert (sides.disk / lease).read_bytes() == before[lease], job
        assert wait_for(lambda: settled(sides, claimed=3, pending=3), BOUND)

        disk_holder.kill()
        disk_holder.wait()
        report = recovered(sides, sides.through())
        assert sorted(f["job"] for f in report["requeued"]) == sorted(held["disk"]), report
    assert requests_by_state(sides.disk) == {job: ["pending"] for job in jobs}
    for sub in ("claimed", "lease", "inbox"):
        assert os.listdir(sides.disk / sub) == [], sub


# ------------------------------------------------ a batch on one side, claims on the other

# Claims (and lists) until the queue is empty once $STOP exists; each claim's --json answer
# and each listing on a line of its own.  The lease holder is this shell.
CLAIM_AND_LIST = r"""
log=$1; shift
exec 2>>"$log.err"
while :; do
  stopping=0; [ -e "$STOP" ] && stopping=1
  "$CTX" queue claim "$@" --json >>"$log"; rc=$?
  echo >>"$log"
  "$CTX" queue list "$@" --state pending --json >>"$log.list" || echo "listfail" >>"$log.err"
  echo >>"$log.list"
  if [ $rc -eq 3 ] && [ $stopping -eq 1 ]; then exit 0; fi
  if [ $rc -ne 0 ] && [ $rc -ne 3 ]; then echo "claimfail $rc" >>"$log.err"; exit 0; fi
done
"""


@pytest.mark.parametrize("publisher", ["mount", "disk"])
def test_a_batch_published_on_one_side_is_claimed_whole_and_once_on_the_other(
    sides: Sides, publisher: str
):
    """Q-1, Q-2, I-2 and §2.4 (``publish --batch``) with F-1: while a batch is published on
    one side (through the mount, where each request is synced as it is written, or on the
    storage root, one ``syncfs``), a claimer and ``ctx queue list`` run on the other.  Every
    name listed as pending is one the batch printed; every claim's request is the whole
    request of one line of the batch; each job is claimed once and every one is claimed."""
    publish_side, claim_side = (
        (sides.through(), sides.direct(1))
        if publisher == "mount"
        else (sides.direct(), sides.through(1))
    )
    stop = sides.scratch / "stop"
    log = sides.scratch / "claims"
    requests = batch(publisher, 6)
    with processes() as started:
        claimer = spawn(
            started,
            ["bash", "-c", CLAIM_AND_LIST, "claimer", str(log), *claim_side],
            env=clean_env(CTX=CTX_ARGV[0], STOP=str(stop)),
        )
        assert wait_for(lambda: log.exists(), BOUND)
        names = publish_batch(sides, publish_side, requests)
        stop.touch()
        ended(claimer)
    errors = Path(f"{log}.err").read_text()
    assert errors == "", errors
    claims = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert sorted(c["name"] for c in claims) == sorted(names)
    by_name = dict(zip(names, requests, strict=True))
    for c in claims:
        sent = by_name[c["name"]]
        assert {k: c["request"][k] for k in sent} == sent, c
        assert set(c["request"]) == {*sent, "from", "created"}, c
    listings = [
        json.loads(line) for line in Path(f"{log}.list").read_text().splitlines() if line.strip()
    ]
    listed = {entry["name"] for listing in listings for entry in listing}
    assert listed <= set(names), listed - set(names)
    assert requests_by_state(sides.disk) == {name: ["claimed"] for name in names}
    for name in names:
        lease = json.loads((sides.disk / "lease" / name / "worker").read_text())
        assert lease["job"] == name and lease["pid"] == claimer.pid, lease


# ------------------------------------------------------------- one lease, both sides

# Claims on one side, renews on the other, waits for $GO, renews again, finishes through the
# mount.  It is the lease holder all along (J=$(ctx …) runs ctx as its child).
HOLDER = r"""
J=$("$CTX" queue claim $DIRECT --ttl 100) || exit 10
echo "$J" >"$OUT/job"
"$CTX" queue renew $THROUGH "$J" --ttl 900 >"$OUT/renew1" 2>&1 || exit 11
touch "$OUT/renewed"
while [ ! -e "$GO" ]; do sleep 0.05; done
"$CTX" queue renew $DIRECT "$J" >"$OUT/renew2" 2>&1 || exit 12
printf '{"via": "mount"}' | "$CTX" queue finish $THROUGH "$J" --ok - >"$OUT/finish" 2>&1 || exit 13
"""


def shown(sides: Sides, job: str) -> list[dict]:
    answers = [sides.ctx("show", side, job, "--json") for side in (sides.through(), sides.direct())]
    assert [a.rc for a in answers] == [0, 0], answers
    return [a.json() for a in answers]


def agree(sides: Sides, job: str) -> bool:
    through, direct = shown(sides, job)
    return through == direct


def test_a_lease_taken_on_the_root_is_renewed_and_finished_through_the_mount(sides: Sides):
    """Q-3 (``renew``: the holder rewrites its own lease atomically; nobody else does), Q-4 and
    §2.4 (``show --json``: every piece of evidence) with F-1: a shell claims a job on the storage
    root and renews it through the mount; the lease on disk is the renewed one, for the ttl
    asked.  A renewal through the mount by a process that does not hold the lease is refused
    (``EACCES``) and changes nothing.  The shell renews again on the storage root and
    finishes through the mount; the result names the shell as the worker.
    ``show --json`` through the mount and on the storage root give the same evidence, claimed
    and done."""
    publish_batch(sides, sides.direct(), batch("lease", 1))
    out = sides.scratch
    go = out / "go"
    env = clean_env(
        CTX=CTX_ARGV[0],
        DIRECT=" ".join(sides.direct()),
        THROUGH=" ".join(sides.through()),
        OUT=str(out),
        GO=str(go),
    )
    with processes() as started:
        holder = spawn(started, ["bash", "-c", HOLDER], env=env)
        assert wait_for(lambda: (out / "renewed").exists() or holder.poll() is not None, BOUND)
        assert holder.poll() is None, (holder.returncode, ended(holder))
        job = (out / "job").read_text().strip()
        lease_file = sides.disk / "lease" / job / "worker"
        lease = json.loads(lease_file.read_text())
        assert lease["pid"] == holder.pid and "renewed_at" in lease, lease
        period = rfc3339(lease["expires_at"]) - rfc3339(lease["renewed_at"])
        assert abs(period.total_seconds() - 900) < 1, lease

        kept = lease_file.read_bytes()
        other = sides.ctx("renew", sides.through(), job, "--ttl", "5")
        assert other.rc == 1 and "EACCES" in other.err, other
        assert lease_file.read_bytes() == kept
        assert wait_for(lambda: agree(sides, job), BOUND), shown(sides, job)
        assert shown(sides, job)[0]["state"] == "claimed"

        go.touch()
        _, err = ended(holder)
        assert holder.returncode == 0, (holder.returncode, err, sorted(out.iterdir()))
    result = result_of(sides.disk, job)
    assert result["status"] == "ok" and result["output"] == {"via": "mount"}, result
    assert result["worker"]["pid"] == holder.pid, result
    assert requests_by_state(sides.disk) == {job: ["done"]}
    assert wait_for(lambda: agree(sides, job), BOUND), shown(sides, job)
    assert shown(sides, job)[1]["state"] == "done"


# ------------------------------------------------------------- races between the two sides

# Runs through its list of rounds in an order of its own once $GO exists; for each round one
# step, its errno (0: done) printed as JSON at the end.  Round i % 4: 0 renameat2(SIDE-i,
# t-i, RENAME_NOREPLACE); 1 link(SIDE-i, t-i); 2 mkdir(t-i); 3 renameat2(s-i, SIDE-t-i,
# RENAME_NOREPLACE): both sides move one source.
RACER = r"""
import ctypes, json, os, random, sys, time
libc = ctypes.CDLL(None, use_errno=True)
def renameat2(src, dst):
    if libc.renameat2(-100, src.encode(), -100, dst.encode(), 1) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
base, side, count, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rounds = list(range(count))
random.shuffle(rounds)
while not os.path.exists(go):
    time.sleep(0.001)
outcome = {}
for i in rounds:
    try:
        kind = i % 4
        if kind == 0:
            renameat2(f"{base}/{side}-{i}", f"{base}/t-{i}")
        elif kind == 1:
            os.link(f"{base}/{side}-{i}", f"{base}/t-{i}")
        elif kind == 2:
            os.mkdir(f"{base}/t-{i}")
        else:
            renameat2(f"{base}/s-{i}", f"{base}/{side}-t-{i}")
        outcome[i] = 0
    except OSError as exc:
        outcome[i] = exc.errno
print(json.dumps(outcome))
"""


def test_no_replace_moves_links_and_mkdir_raced_between_the_mount_and_the_root(sides: Sides):
    """Q-1, Q-2, Q-6 and N-1 (the protocol relies on ``mkdir`` exclusivity and a no-replace
    ``link``/``rename``) with docs/mount.md (``RENAME_NOREPLACE`` passed through; a name
    changed outside the mount is ``ENOENT`` or ``ESTALE`` through it): a process through the
    mount and one on the storage root race, round by round, to put a file at one name with
    ``renameat2(RENAME_NOREPLACE)`` or ``link``, to ``mkdir`` one name, and to move one
    source away.  In every round exactly one wins; the other gets ``EEXIST`` (a taken name)
    or ``ENOENT``/``ESTALE`` (a source already moved), never a silent replace: the name holds
    the winner's bytes and the loser's source is intact."""
    rounds = 240
    disk = sides.storage / "shared" / PROJECT / "data" / "race"
    disk.mkdir()
    view = sides.mount.where / "shared" / PROJECT / "data" / "race"
    for i in range(rounds):
        for name in (f"m-{i}", f"d-{i}", f"s-{i}"):
            (disk / name).write_text(name)
    go = sides.scratch / "go"
    with processes() as started:
        racers = [
            spawn(started, [sys.executable, "-c", RACER, str(base), side, str(rounds), str(go)])
            for base, side in ((view, "m"), (disk, "d"))
        ]
        assert wait_for(lambda: all(p.poll() is None for p in racers), BOUND)
        go.touch()
        outcomes = []
        for proc in racers:
            out, err = ended(proc)
            assert proc.returncode == 0, err
            outcomes.append({int(k): v for k, v in json.loads(out).items()})
    through, direct = outcomes
    lost = {
        0: {errno.EEXIST},
        1: {errno.EEXIST},
        2: {errno.EEXIST},
        3: {errno.ENOENT, errno.ESTALE},
    }
    for i in range(rounds):
        pair = (through[i], direct[i])
        won, refused = sorted(pair)  # errnos are positive: 0 sorts first
        assert won == 0 and refused in lost[i % 4], (i, pair)
        winner = "m" if through[i] == 0 else "d"
        loser = "d" if winner == "m" else "m"
        kind = i % 4
        if kind in (0, 1):
            assert (disk / f"t-{i}").read_text() == f"{winner}-{i}", i
            assert (disk / f"{loser}-{i}").read_text() == f"{loser}-{i}", i
            assert (disk / f"{winner}-{i}").exists() == (kind == 1), i
        elif kind == 2:
            assert (disk / f"t-{i}").is_dir(), i
        else:
            assert (disk / f"{winner}-t-{i}").read_text() == f"s-{i}", i
            assert not (disk / f"{loser}-t-{i}").exists() and not (disk / f"s-{i}").exists(), i


# Publishes --name same-0 … same-(N-1) once $GO exists; "NAME RC" per line, stderr kept.
PUBLISHER = r"""
side=$1; count=$2; log=$3; shift 3
exec 2>>"$log.err"
while [ ! -e "$GO" ]; do sleep 0.01; done
for i in $(seq 0 $((count - 1))); do
  printf '{"tool": "fs.stat", "input": {"path": "/"}, "by": "%s"}' "$side" |
    "$CTX" queue publish "$@" --name "same-$i" - >/dev/null
  echo "same-$i.req.json $?" >>"$log"
done
"""


def test_one_name_published_from_both_sides_at_once_is_published_once(sides: Sides):
    """Q-1 and Q-6 with F-1: a publisher through the mount and one on the storage root publish
    the same names at the same moment.  For every name exactly one is acknowledged (exit 0);
    the other is refused with ``EEXIST`` (exit 1), never acknowledged beside it, and
    ``pending/J`` holds the acknowledged request."""
    count = 8
    go = sides.scratch / "go"
    logs = {side: sides.scratch / f"publish-{side}" for side in ("mount", "disk")}
    with processes() as started:
        publishers = [
            spawn(
                started,
                ["bash", "-c", PUBLISHER, "publisher", side, str(count), str(logs[side]), *args],
                env=clean_env(CTX=CTX_ARGV[0], GO=str(go)),
            )
            for side, args in (("mount", sides.through()), ("disk", sides.direct()))
        ]
        go.touch()
        for proc in publishers:
            ended(proc)
    said = {
        side: dict(line.split() for line in logs[side].read_text().splitlines()) for side in logs
    }
    errors = {side: Path(f"{logs[side]}.err").read_text() for side in logs}
    names = [f"same-{i}.req.json" for i in range(count)]
    assert sorted(said["mount"]) == sorted(said["disk"]) == sorted(names), errors
    for name in names:
        codes = sorted((said["mount"][name], said["disk"][name]))
        assert codes == ["0", "1"], (name, codes, errors)
        winner = "mount" if said["mount"][name] == "0" else "disk"
        stored = json.loads((sides.disk / "pending" / name).read_text())
        assert stored["by"] == winner, (name, stored)
    refusals = [line for text in errors.values() for line in text.splitlines() if line]
    assert len(refusals) == count and all("EEXIST" in line for line in refusals), refusals
    assert os.listdir(sides.disk / "inbox") == []


# ------------------------------------------------------------- the mount ends under its users

needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")


@dataclass
class CutOff:
    """A ``ctx queue`` command through the mount whose mount ended under it: what it said,
    and the job it was working on."""

    run: subprocess.CompletedProcess
    job: str


def stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (under strace: a tracing stop)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state in ("t", "T")


def cut_off(sides: Sides, command: list[str], call: str, nth: int, landed: Path) -> CutOff:
    """Run ``ctx queue COMMAND`` through the mount under strace, which stops it (SIGSTOP) at
    its ``nth`` call of ``call`` once ``landed`` exists on the storage root (a directory: once
    something is in it); end the mount
    with SIGTERM (docs/mount.md: a mount still in use is unmounted lazily, and its users get
    ``ENOTCONN``), then let the command go on."""
    argv = [
        "strace", "-f", "-qq", "-o", "/dev/null", "-e", f"trace={call}",
        "-e", f"inject={call}:signal=SIGSTOP:when={nth}",
        *CTX_ARGV, "queue", *command,
    ]  # fmt: skip
    with processes() as started:
        tracer = spawn(started, argv, env=clean_env())
        children = Path(f"/proc/{tracer.pid}/task/{tracer.pid}/children")

        def at_the_step() -> bool:
            pids = children.read_text().split() if children.exists() else []
            arrived = any(landed.iterdir()) if landed.is_dir() else landed.exists()
            return arrived and any(stopped(int(pid)) for pid in pids)

        assert wait_for(at_the_step, BOUND), (tracer.poll(), tracer.stderr)
        pid = int(children.read_text().split()[0])
        sides.mount.proc.send_signal(signal.SIGTERM)
        sides.mount.proc.wait(timeout=BOUND)
        assert sides.mount.proc.returncode == 0, sides.mount.said()

        def gone() -> bool:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            return tracer.poll() is not None

        assert wait_for(gone, BOUND)
        out, err = ended(tracer)
    job = (min(os.listdir(landed)) if landed.is_dir() else landed.name).removesuffix(".result")
    return CutOff(subprocess.CompletedProcess(argv, tracer.returncode, out, err), job)


def claim_cut_off(sides: Sides, holder: int) -> CutOff:
    """A claim through the mount cut off after its move into ``claimed/``, at the
    ``mkdir lease/J`` of Q-3 (its second ``mkdirat``)."""
    (job,) = publish_batch(sides, sides.direct(), batch("cut", 1))
    landed = sides.disk / "claimed" / job / job
    command = ["claim", *sides.through(), "--pid", str(holder)]
    return cut_off(sides, command, "mkdirat", 2, landed)


def finish_cut_off(sides: Sides, holder: int) -> CutOff:
    """A finish through the mount of a job claimed on the storage root, cut off once its
    result is in ``done/`` (the first ``link`` of its no-replace moves, docs/mount.md)."""
    publish_batch(sides, sides.direct(), batch("cut", 1))
    claim = sides.ctx("claim", sides.direct(), "--pid", str(holder))
    assert claim.rc == 0, claim
    job = claim.out.strip()
    output = sides.scratch / "output.json"
    output.write_text('{"answer": 42}')
    landed = sides.disk / "done" / f"{job}.result"
    command = ["finish", *sides.through(), job, "--ok", str(output)]
    return cut_off(sides, command, "linkat", 1, landed)


def publish_cut_off(sides: Sides, _holder: int) -> CutOff:
    """A publish through the mount cut off once its request is in ``pending/`` (the first
    ``link`` of its no-replace move, docs/mount.md), before its staging name goes."""
    request = sides.scratch / "request.json"
    request.write_text(json.dumps(batch("cut", 1)[0]))
    command = ["publish", *sides.through(), "--name", "cut", str(request)]
    return cut_off(sides, command, "linkat", 1, sides.disk / "pending" / "cut.req.json")


def batch_cut_off(sides: Sides, _holder: int) -> CutOff:
    """A batch of two published through the mount, cut off once the first request is in
    ``pending/`` (the first ``link`` of the batch's moves)."""
    requests = sides.scratch / "requests.jsonl"
    requests.write_text("".join(json.dumps(r) + "\n" for r in batch("cut", 2)))
    command = ["publish", *sides.through(), "--batch", str(requests)]
    return cut_off(sides, command, "linkat", 1, sides.disk / "pending")


@needs_strace
def test_a_claim_cut_off_by_the_end_of_the_mount_is_settled_on_the_root(sides: Sides):
    """Q-3, Q-6 (a claim without a lease never ran: ``recover --reconcile`` returns it to
    pending) and I-1 with F-1: a claim through the mount whose mount ends (SIGTERM) after the
    request moved into ``claimed/`` and before the lease exists fails (exit 1) and leaves no
    lease.  On the storage root plain ``recover`` reports the pair and changes nothing;
    ``recover --reconcile --grace 0`` returns the job to pending and removes the claim's
    leftovers; the queue is then consistent, the job claimable and finishable there."""
    with processes() as started:
        holder = spawn(started, ["sleep", "300"])
        cut = claim_cut_off(sides, holder.pid)
        assert cut.run.returncode == 1, cut.run
        assert not (sides.disk / "lease" / cut.job / "worker").exists()
        before = tree(sides.disk)
        plain = recovered(sides, sides.direct())
        assert [f["job"] for f in plain["incomplete"]] == [cut.job], plain
        assert tree(sides.disk) == before
        report = recovered(sides, sides.direct(), "--reconcile", "--grace", "0")
        assert report["consistent"], report
        assert [f["job"] for f in report["repaired"]] == [cut.job], report
        assert requests_by_state(sides.disk) == {cut.job: ["pending"]}
        for sub in ("claimed", "lease", "inbox"):
            assert os.listdir(sides.disk / sub) == [], sub
        again = sides.ctx("claim", sides.direct(), "--pid", str(holder.pid))
        assert again.rc == 0 and again.out.strip() == cut.job, again
        finished = sides.ctx("finish", sides.direct(), cut.job, "--ok", "-", input="{}")
        assert finished.rc == 0, finished
    assert requests_by_state(sides.disk) == {cut.job: ["done"]}


@needs_strace
def test_a_finish_cut_off_by_the_end_of_the_mount_is_completed_on_the_root(sides: Sides):
    """Q-4, Q-6 and I-3 with F-1 and docs/queue.md (a finish cut short after its result is in
    ``done/`` is completed by the same finish again, with the same outcome and output): a
    finish through the mount whose mount ends once the result is in ``done/`` fails (exit 1).
    The lease holder still runs, so ``recover --reconcile`` on the storage root leaves the
    pair alone; the same finish run again on the storage root completes it, keeping the
    result as recorded; recover then removes the stale temp file and finds the queue
    consistent."""
    with processes() as started:
        holder = spawn(started, ["sleep", "300"])
        cut = finish_cut_off(sides, holder.pid)
        assert cut.run.returncode == 1, cut.run
        result = sides.disk / "done" / f"{cut.job}.result"
        recorded = result.read_bytes()
        assert (sides.disk / "claimed" / cut.job / cut.job).is_file()
        held = recovered(sides, sides.direct(), "--reconcile", "--grace", "0")
        assert [f["job"] for f in held["incomplete"]] == [cut.job], held
        assert (sides.disk / "claimed" / cut.job / cut.job).is_file()
        output = sides.scratch / "output.json"
        again = sides.ctx("finish", sides.direct(), cut.job, "--ok", str(output))
        assert again.rc == 0, again
        assert result.read_bytes() == recorded
    report = recovered(sides, sides.direct(), "--reconcile", "--grace", "0")
    assert report["consistent"] and report["repaired"] == report["requeued"] == [], report
    assert requests_by_state(sides.disk) == {cut.job: ["done"]}
    for sub in ("claimed", "lease", "inbox"):
        assert os.listdir(sides.disk / sub) == [], sub


WHERE_IT_STANDS = {
    "claim": (claim_cut_off, "{job}", "claimed/", "recover --reconcile"),
    "finish": (finish_cut_off, "{job}", "done/", "again"),
    "publish": (publish_cut_off, "{job}", "pending/", "do not publish it again"),
    "batch": (batch_cut_off, "lines 1-2", "pending/", "do not publish them again"),
}


@needs_strace
@pytest.mark.parametrize("command", sorted(WHERE_IT_STANDS))
def test_a_command_cut_off_by_the_end_of_the_mount_says_where_its_job_stands(
    sides: Sides, command: str
):
    """docs/queue.md ("A failure after a step that cannot be undone … is not reported as a
    bare EIO, which would invite a retry that runs the job twice.  The error says where the
    job stands and what to do": a claim that J was moved to ``claimed/`` without a lease and
    never ran, so ``recover --reconcile`` returns it to pending; a finish, once the result is
    in ``done/``, which incomplete pair is left and what completes it; a publish, that the
    job may be pending and must not be published again) and README ("Errors read ``ctx:
    ERRNO: what to do``"), with F-1: a publish, batch publish, claim or finish through the
    mount whose mount ends after its move says so, naming the job (a batch: its lines), where
    it may be and what settles it, though nothing can be read back to tell."""
    with processes() as started:
        holder = spawn(started, ["sleep", "300"])
        cut_off_at_its_move, *wanted = WHERE_IT_STANDS[command]
        cut = cut_off_at_its_move(sides, holder.pid)
    assert cut.run.returncode == 1, cut.run
    message = cut.run.stderr
    assert message.startswith("ctx: ENOTCONN: ") and "Traceback" not in message, message
    for words in wanted:
        assert words.format(job=cut.job) in message, (words, message)


def test_ctx_umount_while_claimers_work_through_the_mount_leaves_a_recoverable_queue(
    sides: Sides,
):
    """F-1 (``ctx umount`` unmounts cleanly; a mount still in use is ``EBUSY``), Q-5, Q-6,
    I-1 and I-3: three claimers work through the mount and one on the storage root while
    ``ctx umount`` is asked, again and again, to end the mount.  Each answer is either a
    clean unmount (exit 0; ``ctx mount`` then exits 0) or ``EBUSY`` (exit 1) with the mount
    left serving.  Once it is gone the claimers through it stop; the one on the root drains
    what it can.  ``recover --reconcile`` on the storage root then leaves a consistent queue
    in which no job is lost or doubled, every finish that was acknowledged stands with its
    own output, and a last drain on the root finishes the rest."""
    jobs = publish_batch(sides, sides.direct(), batch("u", 12))
    logs = [sides.scratch / f"claimer-{i}" for i in range(4)]
    answers: list[Run] = []
    with processes() as started:
        claimers = [
            start_claimer(started, "mount", logs[0], sides.through()),
            start_claimer(started, "mount", logs[1], sides.through(1)),
            start_claimer(started, "mount", logs[2], sides.through()),
            start_claimer(started, "disk", logs[3], sides.direct()),
        ]
        assert wait_for(lambda: len(steps(logs[:3], "finish")) >= 2, BOUND)

        def unmounted() -> bool:
            answers.append(ctx_run("umount", sides.mount.where, timeout=BOUND))
            return answers[-1].rc == 0

        assert wait_for(unmounted, BOUND, step=0.02), answers[-3:]
        sides.mount.proc.wait(timeout=BOUND)
        for proc in claimers:
            ended(proc)
    assert sides.mount.proc.returncode == 0, sides.mount.said()
    for answer in answers[:-1]:
        assert answer.rc == 1 and "EBUSY" in answer.err, answer
    report = recovered(sides, sides.direct(), "--reconcile", "--grace", "0")
    assert report["consistent"] and report["conflicts"] == [], report
    state = requests_by_state(sides.disk)
    assert sorted(state) == sorted(jobs) and all(len(s) == 1 for s in state.values()), state
    acknowledged = steps(logs, "finish")
    assert len(acknowledged) == len(set(acknowledged))
    for log, side in zip(logs, ("mount", "mount", "mount", "disk"), strict=True):
        for job in steps([log], "finish"):
            assert state[job] == ["done"], job
            assert result_of(sides.disk, job)["output"]["by"] == side, job
    last = sides.scratch / "claimer-last"
    with processes() as started:
        ended(start_claimer(started, "disk", last, sides.direct()))
    assert log_lines(last)[-1] == ["empty"], Path(f"{last}.err").read_text()
    assert sorted(steps([*logs, last], "finish")) == sorted(jobs)
    assert requests_by_state(sides.disk) == {job: ["done"] for job in jobs}


# ------------------------------------------------------------- a shell user looking on

# What a member of the space's group types: every request, result and lease file of the queue
# through the mount, with cat, over and over until $STOP exists.  Each file is framed by
# "=== PATH" and "=== rc N" lines; cat's complaints go to stderr.
LOOKER = r"""
cd "$1" || exit 9
while [ ! -e "$STOP" ]; do
  for f in pending/* claimed/*/* lease/*/worker done/*; do
    [ -e "$f" ] || continue
    printf '=== %s\n' "$f"; cat -- "$f"; printf '\n=== rc %s\n' "$?"
  done
  sleep 0.05
done
"""

# On the storage root: renews its lease on one job over and over, and claims and finishes
# the others one by one, until the queue is empty.
CHURN = r"""
J=$("$CTX" queue claim $DIRECT --ttl 100) || exit 10
for i in $(seq 1 7); do
  "$CTX" queue renew $DIRECT "$J" --ttl $((100 + i)) >/dev/null || exit 11
  K=$("$CTX" queue claim $DIRECT); rc=$?
  [ $rc -eq 3 ] && continue
  [ $rc -eq 0 ] || exit 12
  printf '{"n": %d}' "$i" | "$CTX" queue finish $DIRECT "$K" --ok - >/dev/null || exit 13
done
"""


def test_a_shell_user_reading_through_the_mount_sees_whole_files_while_the_queue_moves(
    sides: Sides, unprivileged_user: UnprivilegedUser
):
    """F-1 and docs/mount.md (a name changed outside the mount is found again at its next
    lookup, meanwhile ``ENOENT`` or ``ESTALE``; the kernel's open of a name it knows is checked
    against the file behind it) with I-2 (no partially written request, result or lease is
    visible under its final name) and Q-3 (a renewal replaces the lease atomically): a member
    of the space's group (another uid) reads every request, result and lease through the
    mount with ``cat`` while, on the storage root, jobs are claimed and finished and a lease
    is renewed over and over.  A listing may be stale, but every file ``cat`` reads is a whole
    JSON object of its kind; a name gone meanwhile is ``No such file`` or ``Stale file
    handle``, nothing else."""
    publish_batch(sides, sides.direct(), batch("look", 6))
    stop = sides.scratch / "stop"
    env = clean_env(CTX=CTX_ARGV[0], DIRECT=" ".join(sides.direct()), STOP=str(stop))
    with processes() as started:
        looker = spawn(
            started,
            ["bash", "-c", LOOKER, "looker", str(sides.view)],
            env=env,
            user=unprivileged_user.uid,
            group=unprivileged_user.gid,
            extra_groups=[sides.disk.stat().st_gid],
        )
        churn = spawn(started, ["bash", "-c", CHURN], env=env)
        _, err = ended(churn)
        assert churn.returncode == 0, (churn.returncode, err)
        stop.touch()
        seen, complaints = ended(looker)
    assert looker.returncode == 0, complaints
    frames = re.findall(r"=== (\S+)\n(.*?)\n=== rc (\d+)\n", seen, re.S)
    assert len(frames) > 20, seen[-2000:]
    whole = 0
    for path, body, rc in frames:
        if rc != "0":
            continue
        document = json.loads(body)
        if path.startswith("lease/"):
            assert document["job"] == path.split("/")[1] and "expires_at" in document, path
        elif path.endswith(".result"):
            assert document["status"] == "ok" and "output" in document, path
        else:
            assert document["tool"] == "fs.stat" and document["n"].startswith("look-"), path
        whole += 1
    assert whole > 20
    for line in complaints.splitlines():
        assert line.endswith(("No such file or directory", "Stale file handle")), line
