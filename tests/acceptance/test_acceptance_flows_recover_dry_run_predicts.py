"""``ctx queue recover --dry-run`` held to the run it predicts (SPEC §2.4, Q-5, Q-6, I-5;
docs/queue.md "What a crash leaves, and what recover does with it").

Each test builds a damaged queue by hand, as a crash leaves it: the incomplete pairs and
conflicts Q-6 lists, stray temp files in ``inbox/`` older and younger than the grace period,
and the leftovers of jobs held by lease holders of every kind Q-5 tells apart.  Then, for
plain ``recover`` and ``recover --reconcile``:

* the ``--dry-run --json`` report changes nothing on disk (every entry's mode, inode, link
  count, size, mtime, ctime and content) nor in the claim-order cache;
* the real run that follows reports the same findings, job by job, with ``applied`` true
  where the dry run said false, removes exactly the temps the dry run called stale (with
  ``--reconcile``), and the disk shows exactly those transitions — checked against what Q-5
  and Q-6 say of each leftover, not against the report;
* exit statuses are Q-6's: 0 when the queue is consistent after the run, 1 while incomplete
  pairs (plain) or conflicts remain; a dry run exits as the queue it leaves stands;
* a second real run changes nothing (I-5);
* the text form of a dry run says, line for line, what the real run then says it did.

Lease holders are real processes: a ``sleep`` that runs for the whole module, and one killed
and reaped.  Their real leases (taken by ``ctx queue claim --pid``) are rewritten to name what
a shared queue meets: another boot of this machine, another machine with this host name,
another host, another pid namespace, a renamed host, a reused pid, a lease with no start time,
an expired one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import stat
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    SUFFIX,
    QueueCLI,
    Run,
    age,
    clean_env,
    new_scratch_dir,
    request,
    result,
    scratch_top,
)
from tests.support.storage import attribute, copy_of_root
from tests.support.users import process_of, run_as, users_named

DAY = 86400
TARGET = "/etc/hostname"  # what a symlink at a staging name points to: never followed
PAST = "2000-01-01T00:00:00Z"
FINDINGS = ("requeued", "repaired", "untouched", "incomplete", "conflicts", "errors")
STATES = ("pending", "claimed", "lease", "done", "failed")


# --- helpers ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Base:
    """Real leases of this host, written by ``ctx queue claim --pid``: ``live`` names a
    process that runs for the whole module (lease valid for two hours), ``dead`` one that
    was killed and reaped before any test reads it."""

    live: dict
    dead: dict


@pytest.fixture(scope="module")
def holder() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "900"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def base(_template: Path, tmp_path_factory: pytest.TempPathFactory, holder) -> Base:
    root = copy_of_root(_template, tmp_path_factory.mktemp("base") / "storage")
    q = QueueCLI(root, "proj")
    q.drop("live")
    assert q.claim("--pid", str(holder.pid), "--ttl", "7200") == "live" + SUFFIX
    gone = subprocess.Popen(["sleep", "900"])
    q.drop("dead")
    assert q.claim("--pid", str(gone.pid)) == "dead" + SUFFIX
    gone.kill()
    gone.wait()
    return Base(q.lease("live" + SUFFIX), q.lease("dead" + SUFFIX))


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """This test's own ``$XDG_CACHE_HOME``, where the claim-order hint of its queue lives."""
    made = tmp_path / "cache"
    made.mkdir()
    return made


def recover(q: QueueCLI, cache: Path, *args: str) -> Run:
    env = clean_env(CTX_STORAGE=str(q.storage), XDG_CACHE_HOME=str(cache))
    return q.run("recover", *args, env=env)


def tree(top: Path) -> dict[str, tuple]:
    """Every entry under ``top`` (links not followed): mode, inode, link count, size, mtime
    and ctime in nanoseconds, and a file's content or a link's target."""
    found: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = os.lstat(path)
            body: object = None
            if stat.S_ISLNK(st.st_mode):
                body = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                body = path.read_bytes()
            found[str(path.relative_to(top))] = (
                st.st_mode,
                st.st_ino,
                st.st_nlink,
                st.st_size,
                st.st_mtime_ns,
                st.st_ctime_ns,
                body,
            )
    return found


def entries_of(snap: dict[str, tuple], j: str) -> dict[str, tuple]:
    """The entries of J in a :func:`tree` of the queue: ``STATE/J``, ``STATE/J.result``,
    ``claimed/J`` and ``lease/J`` with what they hold."""
    return {
        p: v
        for p, v in snap.items()
        if p.split("/")[0] in STATES and p.split("/")[1:2] in ([j], [f"{j}.result"])
    }


def where(q: QueueCLI, j: str) -> str:
    """J's §2.1 state with nothing of J elsewhere, "gone" when no entry of J is left, else a
    description of the pieces left."""
    d = q.dir
    pieces = sorted(
        f"{s}/{n}" for s in STATES for n in (j, f"{j}.result") if os.path.lexists(d / s / n)
    )
    complete = {
        "pending": [f"pending/{j}"],
        "claimed": [f"claimed/{j}", f"lease/{j}"],
        "done": [f"done/{j}", f"done/{j}.result"],
        "failed": [f"failed/{j}", f"failed/{j}.result"],
    }
    for state, wanted in complete.items():
        if pieces == wanted and q.state(j) == state:
            return state
    return "gone" if not pieces else f"pieces {pieces}"


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj))


def job(name: str) -> str:
    return name + SUFFIX


def claim_of(q: QueueCLI, j: str) -> None:
    (q.dir / "claimed" / j).mkdir()
    write_json(q.dir / "claimed" / j / j, request(tag=j))


def lease_of(q: QueueCLI, j: str, lease: dict) -> None:
    (q.dir / "lease" / j).mkdir()
    write_json(q.dir / "lease" / j / "worker", dict(lease, job=j))


def age_state_dirs(q: QueueCLI) -> None:
    """Every entry of the five state directories a day old, as a crash long ago left it."""
    for sub in STATES:
        for path in (q.dir / sub).rglob("*"):
            age(path, DAY)


def temp(q: QueueCLI, name: str, seconds: float) -> str:
    """A temp file ``inbox/NAME`` (half a JSON object) ``seconds`` old; its report path."""
    path = q.dir / "inbox" / name
    path.write_text('{"tool": "fs.re')
    age(path, seconds)
    return f"inbox/{name}"


def assert_predicted(dry: Run, real: Run, reconcile: bool) -> None:
    """``real`` did what ``dry`` said it would (§2.4, docs/queue.md): the same findings job by
    job, ``applied`` false then true, the temps called stale then removed (--reconcile)."""
    d, r = dry.json(), real.json()
    assert (d["dry_run"], r["dry_run"]) == (True, False), (dry, real)
    assert d["reconcile"] is r["reconcile"] is reconcile
    for key in ("requeued", "repaired"):
        assert all(f["applied"] is False for f in d[key]), (key, dry)
        assert [dict(f, applied=True) for f in d[key]] == r[key], (key, dry, real)
    for key in ("untouched", "incomplete", "conflicts", "ignored", "errors"):
        assert d[key] == r[key], (key, dry, real)
    if reconcile:
        assert (r["removed_temps"], r["stale_temps"]) == (d["stale_temps"], []), (dry, real)
    else:
        assert (r["removed_temps"], r["stale_temps"]) == ([], d["stale_temps"]), (dry, real)
    assert d["removed_temps"] == [], dry
    for run in (dry, real):
        assert run.json()["consistent"] is (run.rc == 0), run


def buckets(run: Run) -> dict[str, str]:
    """J -> the list of the report that names it; every job at most once."""
    found: dict[str, str] = {}
    for key in FINDINGS:
        for f in run.json()[key]:
            assert f["job"] not in found, (f["job"], found[f["job"]], key, run)
            found[f["job"]] = key
    return found


def dry_then_real(q: QueueCLI, cache: Path, *args: str) -> tuple[Run, Run]:
    """The dry run of ``args`` (which must change nothing, queue or cache), then the run."""
    before, cached = tree(q.dir), tree(cache)
    dry = recover(q, cache, *args, "--dry-run", "--json")
    assert tree(q.dir) == before, dry
    assert tree(cache) == cached, dry
    real = recover(q, cache, *args, "--json")
    assert_predicted(dry, real, "--reconcile" in args)
    return dry, real


def assert_no_op(q: QueueCLI, cache: Path, last: Run, *args: str) -> None:
    """I-5: the same run again changes nothing and finds what ``last`` left."""
    settled = tree(q.dir)
    again = recover(q, cache, *args, "--json")
    a, prev = again.json(), last.json()
    assert a["requeued"] == a["repaired"] == a["removed_temps"] == [], again
    for key in ("untouched", "incomplete", "conflicts", "errors", "ignored"):
        assert a[key] == prev[key], (key, again, last)
    assert again.rc == last.rc, (again, last)
    assert tree(q.dir) == settled, again


# --- the lease holders Q-5 tells apart ----------------------------------------------------------
#
# Each returns a lease (before ``job`` is set) and whether Q-5 proves its holder gone.

OTHER_BOOT = str(uuid.UUID(int=0x5EED))
OTHER_MACHINE = "0123456789abcdef0123456789abcdef"


def _live(b: Base) -> dict:
    return dict(b.live)


def _foreign(b: Base, **changes) -> dict:
    far = dict(b.live, host="far-away-host", machine_id=OTHER_MACHINE, boot_id=OTHER_BOOT)
    far.update(pid_ns=b.live["pid_ns"] + 1, worker="far-away-host:4242", pid=4242)
    far.update(changes)
    return far


HOLDERS: dict[str, tuple[Callable[[Base], dict], bool]] = {
    # this boot, this pid namespace: the pid and its start time decide
    "live": (_live, False),
    "dead": (lambda b: dict(b.dead), True),
    "live-expired": (lambda b: dict(b.live, expires_at=PAST), True),
    "pid-reused": (lambda b: dict(b.live, create_time=b.live["create_time"] - 3600), True),
    "no-start-time": (lambda b: {k: v for k, v in b.live.items() if k != "create_time"}, False),
    # the host renamed since the claim: same boot and pid namespace, the pid decides
    "renamed-host": (lambda b: dict(b.dead, host="old-name", worker="old-name:1"), True),
    # the pid namespace as readlink shows it, and a lifetime in epoch seconds
    "ns-link-text": (lambda b: dict(b.live, pid_ns=f"pid:[{b.live['pid_ns']}]"), False),
    "epoch-expired": (lambda b: dict(b.live, expires_at=946684800), True),
    # this machine (host name and machine id) in another boot: gone, whatever the pid
    "other-boot": (lambda b: dict(b.live, boot_id=OTHER_BOOT), True),
    "other-boot-no-mid": (
        lambda b: {k: v for k, v in dict(b.live, boot_id=OTHER_BOOT).items() if k != "machine_id"},
        True,
    ),
    # another machine with this host name, another host, another pid namespace: a pid alone
    # is never proof; only the expiry is
    "same-name-other-mid": (
        lambda b: dict(b.dead, machine_id=OTHER_MACHINE, boot_id=OTHER_BOOT),
        False,
    ),
    "far-valid": (_foreign, False),
    "far-expired": (lambda b: _foreign(b, expires_at=PAST), True),
    "other-ns-valid": (lambda b: dict(b.dead, pid_ns=b.dead["pid_ns"] + 1), False),
    "other-ns-expired": (
        lambda b: dict(b.dead, pid_ns=b.dead["pid_ns"] + 1, expires_at=PAST),
        True,
    ),
}


# --- the leftovers whose fate depends on the holder ---------------------------------------------
#
# Each builds J's leftovers with ``lease`` as its lease file; PAIRS gives where J ends once the
# holder is gone and --reconcile has run (the claim alone: once any run has).


def _claimed(q: QueueCLI, j: str, lease: dict) -> None:
    claim_of(q, j)
    lease_of(q, j, lease)


def _orphan_lease(q: QueueCLI, j: str, lease: dict) -> None:
    lease_of(q, j, lease)


def _done_result(q: QueueCLI, j: str, lease: dict) -> None:
    _claimed(q, j, lease)
    write_json(q.dir / "done" / f"{j}.result", result("done"))


def _failed_result(q: QueueCLI, j: str, lease: dict) -> None:
    _claimed(q, j, lease)
    write_json(q.dir / "failed" / f"{j}.result", result("failed"))


def _finished_leftovers(q: QueueCLI, j: str, lease: dict) -> None:
    write_json(q.dir / "done" / j, request(tag=j))
    write_json(q.dir / "done" / f"{j}.result", result("done"))
    (q.dir / "claimed" / j).mkdir()
    lease_of(q, j, lease)


def _pending_link(q: QueueCLI, j: str, lease: dict) -> None:
    _claimed(q, j, lease)
    os.link(q.dir / "claimed" / j / j, q.dir / "pending" / j)


PAIRS: dict[str, tuple[Callable[[QueueCLI, str, dict], None], str]] = {
    "claim": (_claimed, "pending"),
    "orphan": (_orphan_lease, "gone"),  # a lease with no request in claimed/
    "done-res": (_done_result, "done"),  # roll forward
    "fail-res": (_failed_result, "failed"),
    "leftover": (_finished_leftovers, "done"),  # finish cut short before its cleanup
    "plink": (_pending_link, "pending"),  # claim's move by link, cut short
}


def expected_bucket(pair: str, gone: bool, reconcile: bool) -> str:
    """Where Q-5 and Q-6 put a leased leftover in the report."""
    if pair == "claim":
        return "requeued" if gone else "untouched"
    return "repaired" if reconcile and gone else "incomplete"


# --- leftovers no holder decides, and conflicts -------------------------------------------------


def _unleased(q: QueueCLI, j: str, b: Base) -> None:
    claim_of(q, j)


def _empty_claim(q: QueueCLI, j: str, b: Base) -> None:
    (q.dir / "claimed" / j).mkdir()


def _empty_claim_of_pending(q: QueueCLI, j: str, b: Base) -> None:
    write_json(q.dir / "pending" / j, request(tag=j))
    (q.dir / "claimed" / j).mkdir()


def _done_link_unleased(q: QueueCLI, j: str, b: Base) -> None:
    claim_of(q, j)
    os.link(q.dir / "claimed" / j / j, q.dir / "done" / j)
    write_json(q.dir / "done" / f"{j}.result", result("done"))


def _pending_and_done(q: QueueCLI, j: str, b: Base) -> None:
    write_json(q.dir / "pending" / j, request(tag=j))
    write_json(q.dir / "done" / j, request(tag=j))
    write_json(q.dir / "done" / f"{j}.result", result("done"))


def _two_results(q: QueueCLI, j: str, b: Base) -> None:
    _claimed(q, j, b.dead)
    write_json(q.dir / "done" / f"{j}.result", result("done"))
    write_json(q.dir / "failed" / f"{j}.result", result("failed"))


def _unreadable_lease(q: QueueCLI, j: str, b: Base) -> None:
    claim_of(q, j)
    (q.dir / "lease" / j).mkdir()
    (q.dir / "lease" / j / "worker").write_text("{}")


# name: (builder, list under plain, list under --reconcile, end after --reconcile)
OTHERS: dict[str, tuple[Callable[[QueueCLI, str, Base], None], str, str, str]] = {
    "unleased": (_unleased, "incomplete", "repaired", "pending"),
    "empty-claim": (_empty_claim, "incomplete", "repaired", "gone"),
    "empty-claim-pend": (_empty_claim_of_pending, "incomplete", "repaired", "pending"),
    "done-link": (_done_link_unleased, "incomplete", "repaired", "done"),
    "pend-and-done": (_pending_and_done, "conflicts", "conflicts", "as-built"),
    "two-results": (_two_results, "conflicts", "conflicts", "as-built"),
    "bad-lease": (_unreadable_lease, "conflicts", "conflicts", "as-built"),
}


@dataclass
class Built:
    """A damaged queue: for each J, the report list plain recover and --reconcile put it in
    and where --reconcile leaves it ("as-built": byte for byte as built); the temps."""

    plain: dict[str, str]
    reconcile: dict[str, str]
    end: dict[str, str]
    stale: list[str]  # temps older than the grace period, as the report names them
    young: list[str]  # temps younger than it

    def consistent(self, reconcile: bool) -> bool:
        wanted = self.reconcile if reconcile else self.plain
        return not {"incomplete", "conflicts"} & set(wanted.values())


def build(q: QueueCLI, b: Base, holders: list[str], others: bool = True) -> Built:
    """The leased leftovers of every pair for each of ``holders``, the other leftovers and
    conflicts, job-tagged and untagged temps, every state entry a day old."""
    built = Built({}, {}, {}, [], [])
    for h in holders:
        make_lease, gone = HOLDERS[h]
        for pair, (make, end) in PAIRS.items():
            j = job(f"{h}.{pair}")
            make(q, j, make_lease(b))
            built.plain[j] = expected_bucket(pair, gone, False)
            built.reconcile[j] = expected_bucket(pair, gone, True)
            built.end[j] = end if gone else "as-built"
            if pair == "claim":
                # a renewal temp of this holder's job, from long ago: no renew holds
                # claimed/J's lock, so it is a stray whatever the holder
                built.stale.append(temp(q, f"{j}.renew.{uuid.uuid4().hex[:12]}.tmp", 7200))
    if others:
        for name, (make, plain, reconciled, end) in OTHERS.items():
            j = job(name)
            make(q, j, b)
            built.plain[j], built.reconcile[j], built.end[j] = plain, reconciled, end
        unleased = job("unleased")
        # "lease, before the move": the claim plus the lease's temp file (docs/queue.md table)
        built.stale.append(temp(q, f"{unleased}.lease.0a1b2c3d4e5f.tmp", 3 * 3600))
        built.stale.append(temp(q, "README", 2 * 3600))
        # a symlink and a FIFO at staging names hold them as a dead publisher's temp does
        # (docs/queue.md): strays, unlinked, never followed or opened
        link = q.dir / "inbox" / f"{job('linked')}.publish.tmp"
        os.symlink(TARGET, link)
        age(link, 2 * 3600)
        fifo = q.dir / "inbox" / f"{job('piped')}.finish.0f0f0f0f0f0f.tmp"
        os.mkfifo(fifo)
        age(fifo, 2 * 3600)
        built.stale += [f"inbox/{link.name}", f"inbox/{fifo.name}"]
        built.young.append(temp(q, f"{job('young')}.publish.tmp", 0))
        built.young.append(temp(q, f"{unleased}.finish.00aa11bb22cc.tmp", 1))
    age_state_dirs(q)
    built.stale.sort()
    return built


def assert_reported(run: Run, wanted: dict[str, str], skip: set[str] = frozenset()) -> None:
    got = buckets(run)
    want = {j: key for j, key in wanted.items() if j not in skip}
    assert got == want, {j: (got.get(j), want.get(j)) for j in got.keys() | want.keys()}


def assert_ends(q: QueueCLI, built: Built, before: dict[str, tuple], changed: set[str]) -> None:
    """Each J where Q-5/Q-6 put it; a J no run was to change byte for byte as built."""
    after = tree(q.dir)
    for j, end in built.end.items():
        if end == "as-built" or j not in changed:
            assert entries_of(after, j) == entries_of(before, j), j
        else:
            assert where(q, j) == end, (j, end)
    left = {e for sub in ("claimed", "lease") for e in q.entries(sub)}
    kept = {j for j in built.end if j not in changed or built.end[j] == "as-built"}
    assert left <= kept, left - kept


# --- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("holder_kind", list(HOLDERS))
def test_plain_then_reconcile_each_predicted_by_its_dry_run(queue, cache, base, holder_kind):
    """Q-5, Q-6, I-5, §2.4: for one kind of lease holder, each leased leftover (a claim, an
    orphan lease, a result beside the claim in done/ and in failed/, a finished job's
    leftover claim and lease, a claim's interrupted link) beside the leftovers no holder
    decides, conflicts and temps: plain dry run and plain run agree and requeue only a gone
    holder's claim; then the --reconcile dry run and run agree and apply Q-6's transitions
    to the rest, leaving a kept holder's leftovers and every conflict byte for byte; exit 1
    while incomplete pairs (plain) or conflicts remain; each run again changes nothing."""
    built = build(queue, base, [holder_kind])
    before = tree(queue.dir)
    gone = HOLDERS[holder_kind][1]

    dry, real = dry_then_real(queue, cache)
    assert real.rc == dry.rc == 1, real  # incomplete pairs and conflicts remain
    assert_reported(real, built.plain)
    assert real.json()["stale_temps"] == built.stale, real
    requeued = {j for j, key in built.plain.items() if key == "requeued"}
    assert_ends(queue, built, before, requeued)
    assert_no_op(queue, cache, real)

    dry, real = dry_then_real(queue, cache, "--reconcile")
    assert dry.rc == 1, dry  # the planned repairs leave the pairs as they are
    assert real.rc == 1, real  # the conflicts remain
    assert_reported(real, built.reconcile, skip=requeued)
    assert real.json()["removed_temps"] == built.stale, real
    assert sorted(os.listdir(queue.dir / "inbox")) == sorted(p[6:] for p in built.young)
    changed = requeued | {j for j, key in built.reconcile.items() if key == "repaired"}
    assert_ends(queue, built, before, changed)
    assert (queue.dir / "claimed" / job(f"{holder_kind}.claim")).exists() is not gone
    assert_no_op(queue, cache, real, "--reconcile")
    assert_no_op(queue, cache, recover(queue, cache, "--json"))


STRAIGHT = [
    "live",
    "dead",
    "pid-reused",
    "other-boot",
    "far-valid",
    "far-expired",
    "other-ns-valid",
]


@pytest.mark.parametrize("holder_kind", STRAIGHT)
def test_reconcile_straight_away_predicted_by_its_dry_run(queue, cache, base, holder_kind):
    """Q-5, Q-6, I-5: the leased leftovers of one kind of holder, alone in the queue (no
    conflict), go straight to ``--reconcile``: its dry run plans the requeue and every repair
    a gone holder allows and exits 1 (nothing changed); the run applies exactly them and exits
    0 when the holder is gone, 1 when it keeps its leftovers (Q-6: never a live holder's job,
    and incomplete pairs left stay reported); then a plain run and a --reconcile run are
    no-ops that exit as that one did."""
    built = build(queue, base, [holder_kind], others=False)
    before = tree(queue.dir)
    gone = HOLDERS[holder_kind][1]

    dry, real = dry_then_real(queue, cache, "--reconcile")
    assert dry.rc == 1, dry
    assert real.rc == (0 if gone else 1), real
    assert real.rc == (0 if built.consistent(True) else 1)
    assert_reported(real, built.reconcile)
    assert real.json()["removed_temps"] == built.stale, real
    changed = {j for j, key in built.reconcile.items() if key in ("requeued", "repaired")}
    assert_ends(queue, built, before, changed)
    assert_no_op(queue, cache, real, "--reconcile")
    plain = recover(queue, cache, "--dry-run", "--json")
    assert plain.rc == real.rc, plain
    assert plain.json()["requeued"] == plain.json()["repaired"] == [], plain


def test_every_holder_and_every_leftover_in_one_queue(queue, cache, base):
    """Q-5, Q-6, I-5, §2.4: all fifteen kinds of holder times six leased leftovers, the other
    leftovers, conflicts and temps, in one queue: the dry runs (plain, --reconcile, and with
    a --grace that spares every temp) predict the runs that follow job for job; the disk
    ends as Q-5/Q-6 say for each; then every run again changes nothing."""
    built = build(queue, base, list(HOLDERS))
    before = tree(queue.dir)

    spared = ("--grace", str(4 * 3600))  # older than every temp
    dry, real = dry_then_real(queue, cache, "--reconcile", *spared)
    assert real.json()["removed_temps"] == [] == dry.json()["stale_temps"], real
    assert dry.rc == real.rc == 1, real
    assert_reported(real, built.reconcile)
    changed = {j for j, key in built.reconcile.items() if key in ("requeued", "repaired")}
    assert_ends(queue, built, before, changed)
    assert len(os.listdir(queue.dir / "inbox")) == len(built.stale) + len(built.young)

    dry, real = dry_then_real(queue, cache)
    assert real.json()["requeued"] == real.json()["repaired"] == [], real
    assert real.json()["stale_temps"] == built.stale
    assert_no_op(queue, cache, real)

    dry, real = dry_then_real(queue, cache, "--reconcile", "--grace", "0")
    assert sorted(real.json()["removed_temps"]) == sorted(built.stale + built.young), real
    assert real.json()["requeued"] == real.json()["repaired"] == [], real
    assert os.listdir(queue.dir / "inbox") == []
    assert_no_op(queue, cache, real, "--reconcile", "--grace", "0")


def test_text_dry_run_says_line_for_line_what_the_run_then_says(queue, cache, base):
    """§2.4, docs/queue.md: the text form of ``--reconcile --dry-run`` says ``would requeue``,
    ``would repair``, ``would remove`` where the run that follows says ``requeue``,
    ``repair``, ``remove``, every other line (untouched, incomplete, conflict) the same, and
    its closing count the same numbers; the plain dry run likewise for plain recover."""
    build(queue, base, ["dead", "far-valid", "far-expired", "live"])
    for args in ((), ("--reconcile",)):
        before = tree(queue.dir)
        dry = recover(queue, cache, *args, "--dry-run")
        assert tree(queue.dir) == before, dry
        real = recover(queue, cache, *args)
        assert dry.rc == 1 and real.rc == 1, (dry, real)
        said = []
        for line in dry.lines()[:-1]:
            if line.startswith("would remove "):
                line = "remove   " + line[len("would remove ") :]
            elif line.startswith("would "):
                line = line[len("would ") :]
            said.append(line)
        assert said == real.lines()[:-1], (dry, real)
        counts = dry.lines()[-1].replace(" (nothing changed: dry run)", "")
        counts = counts.replace("would requeue", "requeued").replace("would repair", "repaired")
        if args:  # the temps it would remove are removed, and counted apart
            stale = re.search(r"(\d+) stale temps", counts)
            assert stale and int(stale.group(1)) > 0, dry
            counts = counts.replace(
                stale.group(0), f"0 stale temps, {stale.group(1)} temps removed"
            )
        assert real.lines()[-1] == counts, (dry, real)


def test_a_claim_in_motion_is_left_to_its_mover_though_the_dry_run_plans_it(queue, cache, base):
    """docs/queue.md: ``--dry-run`` takes no lock.  A claim without a lease whose
    ``claimed/J`` another process holds locked (a claim in progress, here a real flock held
    by the test), with its lease temp file past the grace period: the --reconcile dry run
    plans the requeue and the temp's removal and exits 1; the real run leaves both alone
    (J untouched, not counted; the temp kept) and exits 0.  Released, the next dry run and run
    agree again and requeue J."""
    j = job("in-motion")
    claim_of(queue, j)
    stray = temp(queue, f"{j}.lease.0123456789ab.tmp", 3600)
    age_state_dirs(queue)
    fd = os.open(queue.dir / "claimed" / j, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        before = tree(queue.dir)
        dry = recover(queue, cache, "--reconcile", "--dry-run", "--json")
        assert tree(queue.dir) == before, dry
        assert dry.rc == 1, dry
        assert [f["job"] for f in dry.json()["repaired"]] == [j], dry
        assert dry.json()["stale_temps"] == [stray], dry
        real = recover(queue, cache, "--reconcile", "--json")
        assert real.rc == 0, real
        assert tree(queue.dir) == before, real
        r = real.json()
        assert [f["job"] for f in r["untouched"]] == [j], real
        assert "another process is moving this job" in r["untouched"][0]["detail"], real
        assert r["repaired"] == r["removed_temps"] == [], real
        plain = recover(queue, cache, "--json")
        assert plain.rc == 0 and [f["job"] for f in plain.json()["untouched"]] == [j], plain
    finally:
        os.close(fd)
    dry, real = dry_then_real(queue, cache, "--reconcile")
    assert real.rc == 0 and [f["job"] for f in real.json()["repaired"]] == [j], real
    assert real.json()["removed_temps"] == [stray], real
    assert where(queue, j) == "pending"
    assert_no_op(queue, cache, real, "--reconcile")


def test_a_member_of_the_queue_group_gets_the_same_prediction(_template, base):
    """Q-5, Q-6, §2.4 as a non-root member of the queue's group: leftovers held by the
    member's own live process, by one of its processes that exited, and by another host;
    the member's dry runs (plain, --reconcile) change nothing and predict the runs that
    follow job for job, which move what they said and exit as Q-6 says."""
    (user,) = users_named("ctxtest")
    top = new_scratch_dir(scratch_top(__file__))
    try:
        with process_of(user) as mine, process_of(user) as gone:
            root = copy_of_root(_template, top / "storage")
            q = QueueCLI(root, "proj")
            cache = top / "member-cache"
            env = clean_env(CTX_STORAGE=str(root), XDG_CACHE_HOME=str(cache), HOME=str(top))
            argv = [*CTX_ARGV, "queue", "recover", "--project", "proj", "--json"]
            cache.mkdir()
            os.chown(cache, user.uid, user.gid)
            q.drop("a")
            claimed = q.claim("--pid", str(mine.pid), "--ttl", "7200")
            own = q.lease(claimed)
            q.drop("b")
            exited = q.claim("--pid", str(gone.pid), "--ttl", "7200")
            gone_lease = q.lease(exited)
            for path in (q.dir / "claimed" / exited, q.dir / "lease" / exited):
                shutil.rmtree(path)
            gone.kill()
            gone.wait()
            leases = {
                "mine": dict(own),
                "exited": gone_lease,
                "far": _foreign(base),
            }
            built = Built({}, {}, {}, [], [])
            for name, lease in leases.items():
                for pair in ("claim", "orphan", "done-res"):
                    j = job(f"{name}.{pair}")
                    PAIRS[pair][0](q, j, lease)
                    is_gone = name == "exited"
                    built.plain[j] = expected_bucket(pair, is_gone, False)
                    built.reconcile[j] = expected_bucket(pair, is_gone, True)
                    built.end[j] = PAIRS[pair][1] if is_gone else "as-built"
            # the claim made through ctx stays the member's own live claim
            built.plain[claimed] = built.reconcile[claimed] = "untouched"
            built.end[claimed] = "as-built"
            age_state_dirs(q)
            space = root / "shared" / "proj"
            subprocess.run(["chgrp", "-R", str(user.gid), str(space)], check=True)
            for path in [space, *space.rglob("*")]:
                if path.is_dir() and not path.is_symlink():
                    path.chmod(0o2770)
                elif path.is_file():
                    path.chmod(0o660)
            for path in (root, root / "shared", top):
                path.chmod(0o755)
            before = tree(q.dir)
            for args, wanted in (((), built.plain), (("--reconcile",), built.reconcile)):
                snap = tree(q.dir)
                dry = run_as(user, [*argv, *args, "--dry-run"], env=env)
                assert tree(q.dir) == snap, dry
                real = run_as(user, [*argv, *args], env=env)
                d = Run(["recover", *args, "--dry-run"], dry.returncode, dry.stdout, dry.stderr)
                rr = Run(["recover", *args], real.returncode, real.stdout, real.stderr)
                assert_predicted(d, rr, bool(args))
                assert rr.rc == 1, rr  # incomplete pairs of kept holders remain
                skip = {j for j, key in built.plain.items() if key == "requeued"} if args else set()
                assert_reported(rr, wanted, skip)
                assert rr.json()["errors"] == [], rr
            changed = {j for j, key in built.reconcile.items() if key in ("requeued", "repaired")}
            assert_ends(q, built, before, changed)
    finally:
        shutil.rmtree(top, ignore_errors=True)


# --- what the run is refused ------------------------------------------------------------------


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` bind-mounted on itself read-only for the block (skipped where it cannot be)."""
    if subprocess.run(["mount", "--bind", str(path), str(path)]).returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        ro = ["mount", "-o", "remount,ro,bind", str(path), str(path)]
        if subprocess.run(ro, capture_output=True).returncode != 0:
            pytest.skip("cannot remount a bind mount read-only here")
        yield
    finally:
        subprocess.run(["umount", str(path)], check=False)


@contextlib.contextmanager
def refusing(kind: str, q: QueueCLI, stray: Path) -> Iterator[None]:
    """The host refusing the removal of ``stray``: its immutable attribute, ``inbox/``'s
    append-only attribute, or a read-only mount of the storage root."""
    if kind == "immutable-temp":
        with attribute(stray, "i"):
            yield
    elif kind == "append-only-inbox":
        with attribute(q.dir / "inbox", "a"):
            yield
    else:
        with read_only(q.storage):
            yield


@pytest.mark.parametrize("kind", ["immutable-temp", "append-only-inbox", "read-only-mount"])
def test_dry_run_promises_no_temp_removal_the_run_is_refused(_template, kind):
    """Q-6, §2.4, docs/queue.md: a dry run "makes the checks the run makes ... (a file's
    immutable or append-only attribute), so a move the run would be refused is an error of
    the dry run too, in the same words", and exits as the queue it leaves stands.  A stray
    temp past the grace period whose removal the host refuses: the run says ``error
    inbox/NAME: ... not removed`` and exits 1; the dry run before it must not say ``would
    remove`` it and ``queue consistent``: it names the same error and exits 1 too."""
    top = new_scratch_dir(scratch_top(__file__))
    try:
        root = copy_of_root(_template, top / "storage")
        q = QueueCLI(root, "proj")
        cache = top / "cache"
        cache.mkdir()
        name = temp(q, f"{job('crashed')}.publish.tmp", 2 * 3600)
        stray = q.dir / name
        with refusing(kind, q, stray):
            before = tree(q.dir)
            dry = recover(q, cache, "--reconcile", "--dry-run", "--json")
            assert tree(q.dir) == before, dry
            real = recover(q, cache, "--reconcile", "--json")
            assert tree(q.dir) == before, real
        assert real.rc == 1, real
        (error,) = real.json()["errors"]
        assert error["job"] == name and "not removed" in error["detail"], real
        assert dry.json()["stale_temps"] == [], dry
        assert dry.json()["errors"] == real.json()["errors"], (dry, real)
        assert dry.rc == 1, dry
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_requeue_an_append_only_lease_directory_is_refused_before_it_moves_anything(
    queue, cache, base
):
    """Q-5, Q-6, I-5, docs/queue.md: a gone holder's claim whose ``lease/J`` is append-only
    (which access(2) does not see, and recover, dry or not, looks at).  The dry
    run changes nothing and predicts the refusal (exit 1: the job would be left as it is,
    with the attribute and the ``chattr -a`` that lifts it); the run, which asks the same
    before it moves anything, is refused alike and leaves the job as it is, exit 1.
    Lifted, the dry run plans the requeue the run then applies, and a second run changes
    nothing."""
    j = job("stuck")
    _claimed(queue, j, base.dead)
    age_state_dirs(queue)
    lease_dir = queue.dir / "lease" / j
    with attribute(lease_dir, "a"):
        before = tree(queue.dir)
        dry = recover(queue, cache, "--dry-run", "--json")
        assert tree(queue.dir) == before, dry
        assert dry.rc == 1 and dry.json()["requeued"] == [], dry
        (predicted,) = dry.json()["errors"]
        assert (predicted["job"], predicted["error"]) == (j, "EPERM"), dry
        for words in ("append-only", f"chattr -a {lease_dir}"):
            assert words in predicted["detail"], (words, predicted)
        real = recover(queue, cache, "--json")
        assert real.rc == 1 and tree(queue.dir) == before, real
        (error,) = real.json()["errors"]
        assert (error["job"], error["error"]) == (j, "EPERM"), real
        for words in ("append-only", f"chattr -a {lease_dir}", "left as it is"):
            assert words in error["detail"], (words, error)
    dry, real = dry_then_real(queue, cache)
    assert real.rc == 0, (dry, real)
    assert [f["job"] for f in real.json()["requeued"]] == [j]
    assert where(queue, j) == "pending"
    assert_no_op(queue, cache, real)
