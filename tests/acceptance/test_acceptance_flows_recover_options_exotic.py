"""``ctx queue recover --project P [--reconcile] [--dry-run] [--grace SECONDS] [--json]``
(SPEC §2.4) with its options at their edges and in every combination, against every kind of
incomplete pair and conflict of Q-6, the dead and live holders of Q-5, Q-8's ignored entries
and inbox temp files just younger and older than the grace period.

Covered: Q-5 (only a provably gone holder's claim is requeued), Q-6 (each reconcile
transition, conflicts left alone, exit 0/1), Q-8 (ignored entries never moved), I-5 (a second
run changes nothing), §2.4 (the option forms, exit 2 for a malformed ``--grace``, ``--json``,
a queue named by path).  ``--dry-run`` is held to what the real run then does: the two
``--json`` reports are compared entry by entry, and the queue's tree (with inode numbers and
mtimes) and the claim-order cache are compared before and after the dry run.

The queue is built on disk as a crash leaves it: requests, leases, results and links written
by hand beside real claims.  Lease holders are real processes: a ``sleep`` that runs for the
whole module (alive), and one killed and reaped before its lease is read (gone).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    SUFFIX,
    QueueCLI,
    Run,
    age,
    clean_env,
    ctx_run,
    is_object_name,
    new_scratch_dir,
    request,
    result,
    scratch_top,
)
from tests.support.storage import attribute, copy_of_root
from tests.support.users import run_as, users_named

DAY = 86400
MAX_GRACE = 31622400  # 366 days, the largest --grace (docs/queue.md, config table)
PAST = "2000-01-01T00:00:00Z"
REPORT_KEYS = {
    "reconcile",
    "dry_run",
    "consistent",
    "requeued",
    "repaired",
    "untouched",
    "incomplete",
    "conflicts",
    "removed_temps",
    "stale_temps",
    "ignored",
    "errors",
}
FINDING_LISTS = ("requeued", "repaired", "untouched", "incomplete", "conflicts", "errors")
FINDING_KEYS = {"job", "state", "detail", "action", "applied", "evidence"}
REPAIRS = {"requeue-unleased", "roll-forward", "drop-claim-copy", "remove-orphans"}


# --- helpers ------------------------------------------------------------------------------------


@dataclass
class Leases:
    """Two real leases of this host, taken by ``ctx queue claim --pid``: one whose holder
    runs for the whole module, one whose holder was killed and reaped."""

    live: dict
    dead: dict
    live_pid: int


@pytest.fixture(scope="module")
def holder() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "900"])
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def leases(_template: Path, tmp_path_factory: pytest.TempPathFactory, holder) -> Leases:
    root = copy_of_root(_template, tmp_path_factory.mktemp("leases") / "storage")
    q = QueueCLI(root, "proj")
    q.drop("tpl-live")
    assert q.claim("--pid", str(holder.pid), "--ttl", "7200") == "tpl-live" + SUFFIX
    gone = subprocess.Popen(["sleep", "900"])
    q.drop("tpl-dead")
    assert q.claim("--pid", str(gone.pid)) == "tpl-dead" + SUFFIX
    gone.kill()
    gone.wait()
    return Leases(q.lease("tpl-live" + SUFFIX), q.lease("tpl-dead" + SUFFIX), holder.pid)


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """This test's own ``$XDG_CACHE_HOME``: where the claim-order hint of its queue goes."""
    made = tmp_path / "cache"
    made.mkdir()
    return made


def recover(q: QueueCLI, cache: Path, *args: str, **kw) -> Run:
    env = clean_env(CTX_STORAGE=str(q.storage), XDG_CACHE_HOME=str(cache))
    return q.run("recover", *args, env=env, **kw)


def tree(top: Path) -> dict[str, tuple]:
    """Every entry under ``top`` (links not followed): mode, inode, link count, size, mtime
    and ctime in nanoseconds, and the content of a file or the target of a link."""
    found: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                body: object = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                body = path.read_bytes()
            else:
                body = None
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


def job(name: str) -> str:
    return name + SUFFIX


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj))


def claimed_by(q: QueueCLI, name: str, lease: dict | None) -> str:
    """``claimed/J/J`` and, unless ``lease`` is None, ``lease/J/worker`` naming J."""
    j = job(name)
    (q.dir / "claimed" / j).mkdir()
    write_json(q.dir / "claimed" / j / j, request(tag=name))
    if lease is not None:
        leased_to(q, j, lease)
    return j


def leased_to(q: QueueCLI, j: str, lease: dict) -> None:
    (q.dir / "lease" / j).mkdir()
    write_json(q.dir / "lease" / j / "worker", dict(lease, job=j))


def findings(report: dict, key: str) -> dict[str, dict]:
    return {f["job"]: f for f in report[key]}


# --- the kinds of trouble, one builder each -----------------------------------------------------
#
# Each builder puts one job's leftovers on disk and returns J.  EXPECTED gives, for each kind,
# the exit status of (plain --dry-run, --reconcile --dry-run, plain, --reconcile) run in that
# order on one queue, and where J stands after the last one (a §2.1 state, "gone" when none of
# its evidence is left, "as-is" when every entry is byte for byte as built).


def _dead_holder(q: QueueCLI, L: Leases) -> str:
    return claimed_by(q, "dead-holder", L.dead)


def _live_holder(q: QueueCLI, L: Leases) -> str:
    return claimed_by(q, "live-holder", L.live)


def _expired_lease_of_live_pid(q: QueueCLI, L: Leases) -> str:
    return claimed_by(q, "expired", dict(L.live, expires_at=PAST))


def _unleased(q: QueueCLI, L: Leases) -> str:
    return claimed_by(q, "unleased", None)


def _orphan_lease_dead(q: QueueCLI, L: Leases) -> str:
    j = job("orphan-dead")
    leased_to(q, j, L.dead)
    return j


def _orphan_lease_unreadable(q: QueueCLI, L: Leases) -> str:
    j = job("orphan-unreadable")
    (q.dir / "lease" / j).mkdir()
    (q.dir / "lease" / j / "worker").write_text("{}")
    return j


def _orphan_lease_live(q: QueueCLI, L: Leases) -> str:
    j = job("orphan-live")
    leased_to(q, j, L.live)
    return j


def _empty_claim_of_pending(q: QueueCLI, L: Leases) -> str:
    j = q.drop("empty-claim-pending")
    (q.dir / "claimed" / j).mkdir()
    return j


def _empty_claim_alone(q: QueueCLI, L: Leases) -> str:
    j = job("empty-claim")
    (q.dir / "claimed" / j).mkdir()
    return j


def _claim_link_of_pending(q: QueueCLI, L: Leases) -> str:
    j = claimed_by(q, "link-pending", L.dead)
    os.link(q.dir / "claimed" / j / j, q.dir / "pending" / j)
    return j


def _claim_link_of_done(q: QueueCLI, L: Leases) -> str:
    j = claimed_by(q, "link-done", L.dead)
    os.link(q.dir / "claimed" / j / j, q.dir / "done" / j)
    write_json(q.dir / "done" / f"{j}.result", result("done"))
    return j


def _result_beside_dead_claim(q: QueueCLI, L: Leases) -> str:
    j = claimed_by(q, "roll-done", L.dead)
    write_json(q.dir / "done" / f"{j}.result", result("done"))
    return j


def _failed_result_beside_unleased_claim(q: QueueCLI, L: Leases) -> str:
    j = claimed_by(q, "roll-failed", None)
    write_json(q.dir / "failed" / f"{j}.result", result("failed"))
    return j


def _result_beside_live_claim(q: QueueCLI, L: Leases) -> str:
    j = claimed_by(q, "roll-live", L.live)
    write_json(q.dir / "done" / f"{j}.result", result("done"))
    return j


def _terminal_with_leftovers(q: QueueCLI, L: Leases) -> str:
    j = q.terminal("leftovers")
    (q.dir / "claimed" / j).mkdir()
    leased_to(q, j, L.dead)
    return j


def _pending_and_done(q: QueueCLI, L: Leases) -> str:
    q.drop("pending-done")
    return q.terminal("pending-done")


def _done_and_failed(q: QueueCLI, L: Leases) -> str:
    q.terminal("done-failed", "failed")
    return q.terminal("done-failed")


def _request_without_result(q: QueueCLI, L: Leases) -> str:
    j = job("no-result")
    write_json(q.dir / "done" / j, request())
    return j


def _result_alone(q: QueueCLI, L: Leases) -> str:
    j = job("result-alone")
    write_json(q.dir / "failed" / f"{j}.result", result("failed"))
    return j


def _claim_with_unreadable_lease(q: QueueCLI, L: Leases) -> str:
    j = claimed_by(q, "bad-lease", None)
    (q.dir / "lease" / j).mkdir()
    (q.dir / "lease" / j / "worker").write_text("{}")
    return j


def _claim_with_symlink_lease(q: QueueCLI, L: Leases) -> str:
    j = claimed_by(q, "link-lease", None)
    (q.dir / "lease" / j).mkdir()
    os.symlink("/etc/hostname", q.dir / "lease" / j / "worker")
    return j


def _result_of_the_wrong_status(q: QueueCLI, L: Leases) -> str:
    j = claimed_by(q, "wrong-status", L.dead)
    write_json(q.dir / "done" / f"{j}.result", result("failed"))  # status "error" in done/
    return j


def _pending_and_claimed_apart(q: QueueCLI, L: Leases) -> str:
    j = claimed_by(q, "twice", L.dead)
    write_json(q.dir / "pending" / j, request(tag="another copy"))
    return j


KINDS: dict[str, tuple[Callable[[QueueCLI, Leases], str], tuple[int, int, int, int], str]] = {
    # claimed and leased
    "dead-holder": (_dead_holder, (0, 0, 0, 0), "pending"),
    "live-holder": (_live_holder, (0, 0, 0, 0), "as-is"),
    "expired-lease-live-pid": (_expired_lease_of_live_pid, (0, 0, 0, 0), "pending"),
    # incomplete pairs
    "unleased": (_unleased, (1, 1, 1, 0), "pending"),
    "orphan-lease-dead": (_orphan_lease_dead, (1, 1, 1, 0), "gone"),
    "orphan-lease-unreadable": (_orphan_lease_unreadable, (1, 1, 1, 0), "gone"),
    "orphan-lease-live": (_orphan_lease_live, (1, 1, 1, 1), "as-is"),
    "empty-claim-of-pending": (_empty_claim_of_pending, (1, 1, 1, 0), "pending"),
    "empty-claim-alone": (_empty_claim_alone, (1, 1, 1, 0), "gone"),
    "claim-link-of-pending": (_claim_link_of_pending, (1, 1, 1, 0), "pending"),
    "claim-link-of-done": (_claim_link_of_done, (1, 1, 1, 0), "done"),
    "result-beside-dead-claim": (_result_beside_dead_claim, (1, 1, 1, 0), "done"),
    "failed-result-beside-unleased": (_failed_result_beside_unleased_claim, (1, 1, 1, 0), "failed"),
    "result-beside-live-claim": (_result_beside_live_claim, (1, 1, 1, 1), "as-is"),
    "terminal-with-leftovers": (_terminal_with_leftovers, (1, 1, 1, 0), "done"),
    # conflicts
    "pending-and-done": (_pending_and_done, (1, 1, 1, 1), "as-is"),
    "done-and-failed": (_done_and_failed, (1, 1, 1, 1), "as-is"),
    "request-without-result": (_request_without_result, (1, 1, 1, 1), "as-is"),
    "result-alone": (_result_alone, (1, 1, 1, 1), "as-is"),
    "claim-with-unreadable-lease": (_claim_with_unreadable_lease, (1, 1, 1, 1), "as-is"),
    "claim-with-symlink-lease": (_claim_with_symlink_lease, (1, 1, 1, 1), "as-is"),
    "result-of-the-wrong-status": (_result_of_the_wrong_status, (1, 1, 1, 1), "as-is"),
    "pending-and-claimed-apart": (_pending_and_claimed_apart, (1, 1, 1, 1), "as-is"),
}


def plant_ignored(q: QueueCLI) -> list[str]:
    """Q-8: entries that are not jobs, beside the jobs; their paths in the queue."""
    d = q.dir
    (d / "pending" / ".hidden.req.json").write_text("{}")
    (d / "pending" / "bad name.req.json").write_text("{}")
    os.symlink("/etc/hostname", d / "pending" / "sym.req.json")
    (d / "pending" / "dir.req.json").mkdir()
    os.mkfifo(d / "pending" / "fifo.req.json")
    (d / "inbox" / "subdir").mkdir()
    return [
        "pending/.hidden.req.json",
        "pending/bad name.req.json",
        "pending/sym.req.json",
        "pending/dir.req.json",
        "pending/fifo.req.json",
        "inbox/subdir",
    ]


def plant_temps(q: QueueCLI) -> dict[str, float]:
    """Inbox temp files of several ages (seconds); the ages."""
    ages = {"old.publish.tmp": 2 * 3600.0, "README": 3 * 3600.0, ".dot": 2 * 3600.0}
    for name, seconds in ages.items():
        (q.dir / "inbox" / name).write_text("partial")
        age(q.dir / "inbox" / name, seconds)
    (q.dir / "inbox" / "young.publish.tmp").write_text("partial")
    ages["young.publish.tmp"] = 0.0
    return ages


def age_state_dirs(q: QueueCLI) -> None:
    """Every entry of the five state directories a day old, as a crash long ago left it."""
    for sub in ("pending", "claimed", "lease", "done", "failed"):
        for path in (q.dir / sub).rglob("*"):
            if not path.is_symlink():
                age(path, DAY)


def build_zoo(q: QueueCLI, L: Leases, kinds=KINDS) -> dict[str, str]:
    """Every kind of trouble side by side, plus a job merely pending and one finished,
    ignored entries and temps; kind -> J."""
    built = {kind: make(q, L) for kind, (make, _, _) in kinds.items()}
    built["pending"] = q.drop("plain")
    built["finished"] = q.terminal("finished")
    plant_ignored(q)
    plant_temps(q)
    age_state_dirs(q)
    return built


def state_of(q: QueueCLI, j: str) -> str:
    """J's §2.1 state, or "gone" when no entry of J is left anywhere in the queue."""
    found = q.state(j)
    if found is not None:
        return found
    names = {j, f"{j}.result"}
    left = [sub for sub in QUEUE_SUBDIRS - {"inbox"} if names & q.entries(sub)]
    return "gone" if not left else f"incomplete in {sorted(left)}"


def entries_of(snapshot: dict[str, tuple], j: str) -> dict[str, tuple]:
    """The entries of J: ``STATE/J``, ``STATE/J.result``, ``claimed/J/…``, ``lease/J/…``."""
    return {p: v for p, v in snapshot.items() if p.split("/")[1:2] in ([j], [f"{j}.result"])}


# --- --grace: what it takes and what it refuses -------------------------------------------------


ACCEPTED_GRACE = ["0", "-0", "0.5", "5.", "1E2", str(MAX_GRACE)]
REFUSED_GRACE = [
    "-1",
    "-1e-3",
    str(MAX_GRACE + 1),
    "1e309",
    "-inf",
    "inf",
    "nan",
    "",
    " 5",
    "5s",
    "0x10",
    "1_000",
    "+5",
    "\u0663",  # ARABIC-INDIC DIGIT THREE
    "1e",
    "5\n",
]
# The other options a malformed --grace comes with: every combination of the three, in turn.
OTHER_OPTIONS = [
    [flag for flag, on in zip(("--reconcile", "--dry-run", "--json"), bits, strict=True) if on]
    for bits in itertools.product([False, True], repeat=3)
]


@pytest.mark.parametrize("value", ACCEPTED_GRACE)
def test_grace_values_a_person_writes_are_taken(queue, cache, value):
    """§2.4: ``--grace`` takes a number of seconds from 0 to 366 days in ASCII decimal
    (``-0`` is 0); a temp older than it is stray, one younger is not reported."""
    (queue.dir / "inbox" / "x.publish.tmp").write_text("partial")
    age(queue.dir / "inbox" / "x.publish.tmp", 2 * 3600)
    r = recover(queue, cache, "--dry-run", "--reconcile", "--grace", value, "--json")
    assert r.rc == 0, r
    report = r.json()
    assert set(report) == REPORT_KEYS, report
    expected = [] if float(value) > 2 * 3600 else ["inbox/x.publish.tmp"]
    assert report["stale_temps"] == expected, r
    assert (queue.dir / "inbox" / "x.publish.tmp").exists()


@pytest.mark.parametrize("value", REFUSED_GRACE, ids=repr)
def test_a_malformed_grace_is_a_usage_error_before_anything_is_done(queue, cache, leases, value):
    """§2.4: a malformed or out-of-range number is a usage error (exit 2, EINVAL naming
    ``--grace``), whatever the other options (each combination of --reconcile, --dry-run and
    --json comes with some value): nothing is requeued, repaired or removed, not even the
    claim-order hint is written, and with ``--json`` stdout holds one error object.

    # reading: SECONDS are decimal ASCII, as the queue's config reads them (docs/queue.md);
    # an infinity, NaN, a unit, hex, digit separators or padding are not a duration.
    """
    options = OTHER_OPTIONS[REFUSED_GRACE.index(value) % len(OTHER_OPTIONS)]
    dead = claimed_by(queue, "dead", leases.dead)
    unleased = claimed_by(queue, "unleased", None)
    (queue.dir / "inbox" / "old.publish.tmp").write_text("partial")
    age(queue.dir / "inbox" / "old.publish.tmp", 2 * DAY)
    before = tree(queue.dir)
    r = recover(queue, cache, *options, "--grace", value)
    assert r.rc == 2, r
    assert "EINVAL" in r.err and "--grace" in r.err, r
    if "--json" in options:
        error = r.json()
        assert error["error"] == "EINVAL" and "--grace" in error["message"], r
    else:
        assert r.out == "", r
    assert tree(queue.dir) == before
    assert queue.state(dead) == "claimed" and queue.state(unleased) is None
    assert os.listdir(cache) == []


def test_grace_without_a_value_and_options_given_twice(queue, cache, leases):
    """§2.4: ``--grace`` at the end with no value is a usage error; the ``--grace=N`` form is
    the same as ``--grace N``; flags given twice mean what they mean once."""
    claimed_by(queue, "dead", leases.dead)
    before = tree(queue.dir)
    bare = recover(queue, cache, "--reconcile", "--grace")
    assert bare.rc == 2 and "--grace" in bare.err, bare
    assert tree(queue.dir) == before
    joined = recover(queue, cache, "--dry-run", "--grace=0", "--json")
    spaced = recover(queue, cache, "--dry-run", "--grace", "0", "--json")
    twice = recover(queue, cache, "--dry-run", "--dry-run", "--json", "--json", "--grace", "0")
    assert joined.rc == spaced.rc == twice.rc == 0, (joined, spaced, twice)
    assert joined.out == spaced.out == twice.out
    assert tree(queue.dir) == before


# --- inbox temps at the edge of the grace period ------------------------------------------------


def test_inbox_temps_just_younger_and_just_older_than_the_grace(queue, cache):
    """Q-6, §2.4: with ``--grace G`` a temp G+60 s old is stray — reported by plain recover
    and a dry run, removed by ``--reconcile`` — and one G-60 s old is left and not reported;
    a second run removes nothing more (I-5); ``--grace 0`` then takes the younger one too."""
    grace = 3600
    inbox = queue.dir / "inbox"
    for name, seconds in (("older.publish.tmp", grace + 60), ("younger.publish.tmp", grace - 60)):
        (inbox / name).write_text("partial")
        age(inbox / name, seconds)
    g = ("--grace", str(grace))
    plain = recover(queue, cache, "--json", *g)
    assert plain.rc == 0, plain
    assert plain.json()["stale_temps"] == ["inbox/older.publish.tmp"], plain
    before = tree(queue.dir)
    dry = recover(queue, cache, "--reconcile", "--dry-run", "--json", *g)
    assert dry.rc == 0 and dry.json()["stale_temps"] == ["inbox/older.publish.tmp"], dry
    assert dry.json()["removed_temps"] == []
    assert tree(queue.dir) == before
    real = recover(queue, cache, "--reconcile", "--json", *g)
    assert real.rc == 0, real
    assert real.json()["removed_temps"] == ["inbox/older.publish.tmp"], real
    assert real.json()["stale_temps"] == []
    assert sorted(os.listdir(inbox)) == ["younger.publish.tmp"]
    settled = tree(queue.dir)
    again = recover(queue, cache, "--reconcile", "--json", *g)
    assert again.rc == 0 and again.json()["removed_temps"] == [], again
    assert tree(queue.dir) == settled
    zero = recover(queue, cache, "--reconcile", "--json", "--grace", "0")
    assert zero.rc == 0 and zero.json()["removed_temps"] == ["inbox/younger.publish.tmp"], zero
    assert os.listdir(inbox) == []


def test_the_queue_config_grace_applies_without_the_option_and_the_option_overrides_it(
    queue, cache
):
    """§2.4, docs/queue.md: without ``--grace`` the queue's ``grace`` decides; ``--grace``
    overrides it either way (shorter and longer)."""
    config = queue.dir / "config"
    config.write_text(config.read_text().replace("grace=60", "grace=7200"))
    inbox = queue.dir / "inbox"
    (inbox / "mid.publish.tmp").write_text("partial")
    age(inbox / "mid.publish.tmp", 3600)
    default = recover(queue, cache, "--reconcile", "--dry-run", "--json")
    assert default.rc == 0 and default.json()["stale_temps"] == [], default
    shorter = recover(queue, cache, "--reconcile", "--dry-run", "--json", "--grace", "1800")
    assert shorter.json()["stale_temps"] == ["inbox/mid.publish.tmp"], shorter
    config.write_text(config.read_text().replace("grace=7200", "grace=0"))
    longer = recover(queue, cache, "--reconcile", "--json", "--grace", "5400")
    assert longer.rc == 0 and longer.json()["removed_temps"] == [], longer
    assert (inbox / "mid.publish.tmp").exists()
    default = recover(queue, cache, "--reconcile", "--json")
    assert default.json()["removed_temps"] == ["inbox/mid.publish.tmp"], default


def test_largest_grace_still_finds_a_temp_older_than_it(queue, cache):
    """§2.4: ``--grace 31622400`` (366 days) is taken, and a temp dated 367 days back is
    stray under it, one dated 365 days back is not."""
    inbox = queue.dir / "inbox"
    for name, days in (("ancient.publish.tmp", 367), ("old.publish.tmp", 365)):
        (inbox / name).write_text("partial")
        age(inbox / name, days * DAY)
    r = recover(queue, cache, "--reconcile", "--json", "--grace", str(MAX_GRACE))
    assert r.rc == 0 and r.json()["removed_temps"] == ["inbox/ancient.publish.tmp"], r
    assert os.listdir(inbox) == ["old.publish.tmp"]


def test_a_temp_dated_in_the_future_ages_from_its_change_time(queue, cache):
    """docs/queue.md (config ``grace``): a temp whose mtime is a year ahead counts its age
    from its ctime (now), so a grace of an hour keeps it and ``--grace 0`` removes it; a
    staging name held by a symlink is removed as a temp, never followed."""
    inbox = queue.dir / "inbox"
    ahead = time.time() + 365 * DAY
    (inbox / "future.publish.tmp").write_text("partial")
    os.utime(inbox / "future.publish.tmp", (ahead, ahead))
    target = queue.storage.parent / "outside"
    target.write_text("kept")
    os.symlink(target, inbox / "held.req.json.publish.tmp")
    kept = recover(queue, cache, "--reconcile", "--json", "--grace", "3600")
    assert kept.rc == 0 and kept.json()["removed_temps"] == [], kept
    assert sorted(os.listdir(inbox)) == ["future.publish.tmp", "held.req.json.publish.tmp"]
    gone = recover(queue, cache, "--reconcile", "--json", "--grace", "0")
    assert gone.rc == 0, gone
    removed = sorted(gone.json()["removed_temps"])
    assert removed == ["inbox/future.publish.tmp", "inbox/held.req.json.publish.tmp"], gone
    assert os.listdir(inbox) == []
    assert target.read_text() == "kept"


# --- every kind of trouble, one at a time: exit statuses and end states -------------------------


# One of each behaviour; the queue holding all of KINDS at once is below.
ONE_AT_A_TIME = [
    "dead-holder",
    "live-holder",
    "expired-lease-live-pid",
    "unleased",
    "orphan-lease-dead",
    "orphan-lease-unreadable",
    "orphan-lease-live",
    "empty-claim-of-pending",
    "claim-link-of-pending",
    "claim-link-of-done",
    "result-beside-dead-claim",
    "failed-result-beside-unleased",
    "result-beside-live-claim",
    "terminal-with-leftovers",
    "pending-and-done",
    "claim-with-unreadable-lease",
    "result-of-the-wrong-status",
]


@pytest.mark.parametrize("kind", ONE_AT_A_TIME)
def test_exit_status_of_each_mode_against_each_kind_of_trouble(queue, cache, leases, kind):
    """Q-5, Q-6, §2.4: plain --dry-run, --reconcile --dry-run, plain and --reconcile, in
    that order, exit 0 or 1 as the queue stands after each, each naming J once; the dry
    runs change nothing, plain recover nothing but a gone holder's claim, and J ends where
    Q-6 puts it (a conflict and a live holder's job byte for byte as they were)."""
    make, statuses, end = KINDS[kind]
    j = make(queue, leases)
    age_state_dirs(queue)
    built = tree(queue.dir)
    modes = (("--dry-run",), ("--reconcile", "--dry-run"), (), ("--reconcile",))
    for args, status in zip(modes, statuses, strict=True):
        before = tree(queue.dir)
        r = recover(queue, cache, *args, "--json")
        assert r.rc == status, (args, r)
        report = r.json()
        assert report["consistent"] is (status == 0), r
        named = {f["job"] for key in FINDING_LISTS for f in report[key]}
        requeued_before = args == ("--reconcile",) and statuses[2] == 0 and end == "pending"
        assert named == (set() if requeued_before else {j}), (args, r)
        if "--dry-run" in args or (not args and kind != "dead-holder" and "expired" not in kind):
            assert tree(queue.dir) == before, (args, r)
    if end == "as-is":
        assert tree(queue.dir) == built
    else:
        assert state_of(queue, j) == end
        for sub in ("claimed", "lease"):
            assert queue.entries(sub) == set(), (sub, queue.entries(sub))


# --- many kinds at once ----------------------------------------------------------------------


@pytest.mark.parametrize("reconcile", [False, True], ids=["plain", "reconcile"])
def test_dry_run_reports_exactly_what_the_real_run_then_does(queue, cache, leases, reconcile):
    """§2.4, Q-6: on a queue holding every kind of trouble at once, ``--dry-run --json``
    changes nothing at all (the tree with inodes and mtimes, and the claim-order cache) and
    reports the same findings, job by job, as the real run that follows: ``applied`` false
    then true, the temps it would remove then removed.  The disk then shows each reported
    transition applied, and nothing else changed."""
    zoo = build_zoo(queue, leases)
    args = ("--reconcile",) if reconcile else ()
    before, cached = tree(queue.dir), tree(cache)
    dry = recover(queue, cache, *args, "--dry-run", "--json")
    assert dry.rc == 1, dry
    assert tree(queue.dir) == before
    assert tree(cache) == cached
    real = recover(queue, cache, *args, "--json")
    assert real.rc == 1, real  # conflicts remain
    d, r = dry.json(), real.json()
    assert (d["dry_run"], r["dry_run"]) == (True, False)
    assert d["reconcile"] is r["reconcile"] is reconcile
    for key in ("requeued", "repaired"):
        assert [f["applied"] for f in d[key]] == [False] * len(d[key]), d
        assert [f["applied"] for f in r[key]] == [True] * len(r[key]), r
        assert [dict(f, applied=True) for f in d[key]] == r[key], key
    for key in ("untouched", "incomplete", "conflicts", "ignored", "errors"):
        assert d[key] == r[key], key
    if reconcile:
        assert r["removed_temps"] == d["stale_temps"] and r["stale_temps"] == [], (d, r)
    else:
        assert r["stale_temps"] == d["stale_temps"] and r["removed_temps"] == [], (d, r)
    assert sorted(d["stale_temps"]) == ["inbox/.dot", "inbox/README", "inbox/old.publish.tmp"]

    after = tree(queue.dir)
    changed = {f["job"] for key in ("requeued", "repaired") for f in r[key]}
    for kind, j in zoo.items():
        if j not in changed:
            assert entries_of(after, j) == entries_of(before, j), kind
    ends = {kind: end for kind, (_, _, end) in KINDS.items()}
    for f in r["requeued"]:
        assert state_of(queue, f["job"]) == "pending", f
    for f in r["repaired"]:
        kind = next(k for k, v in zoo.items() if v == f["job"])
        assert state_of(queue, f["job"]) == ends[kind], (kind, f)
    for rel in (
        "pending/.hidden.req.json",
        "pending/bad name.req.json",
        "pending/sym.req.json",
        "pending/dir.req.json",
        "pending/fifo.req.json",
        "inbox/subdir",
    ):
        assert after[rel] == before[rel], rel

    settled = tree(queue.dir)
    second = recover(queue, cache, *args, "--json")
    assert second.rc == 1, second
    s = second.json()
    assert s["requeued"] == s["repaired"] == s["removed_temps"] == [], second
    assert s["conflicts"] == r["conflicts"]
    assert s["untouched"] == r["untouched"]
    assert tree(queue.dir) == settled


def test_every_combination_of_the_four_options(queue, cache, leases):
    """§2.4, Q-6, I-5: the sixteen combinations of --reconcile, --dry-run, --grace 0 and
    --json on one queue of repairable trouble (no conflict, no live holder's pair).  Every
    dry run changes nothing and exits 1 (incomplete pairs stand); the text and JSON forms
    name the same jobs and temps; --grace 0 makes the just-written temp stray too.  Then
    the real runs: plain exits 1 and requeues only the claims of gone holders, --reconcile
    exits 0, and every later run of any combination exits 0 and changes nothing."""
    repairable = {kind: v for kind, v in KINDS.items() if v[1][3] == 0}
    zoo = build_zoo(queue, leases, repairable)
    before = tree(queue.dir)
    combos = list(itertools.product([False, True], repeat=3))
    for reconcile, grace, as_json in combos:
        args = ["--dry-run"]
        args += ["--reconcile"] if reconcile else []
        args += ["--grace", "0"] if grace else []
        j = recover(queue, cache, *args, "--json")
        assert j.rc == 1, (args, j)
        report = j.json()
        temps = {"inbox/.dot", "inbox/README", "inbox/old.publish.tmp"}
        temps |= {"inbox/young.publish.tmp"} if grace else set()
        assert set(report["stale_temps"]) == temps, (args, j)
        if as_json:
            continue
        t = recover(queue, cache, *args)
        assert t.rc == 1, (args, t)
        assert t.out.rstrip().endswith("(nothing changed: dry run)") or "dry run" in t.out, t
        for key in FINDING_LISTS:
            for f in report[key]:
                assert f["job"] in t.out, (args, f, t)
        for temp in report["stale_temps"]:
            assert temp in t.out, (args, temp, t)
        word = "would remove" if reconcile else "stale"
        said = {line.split()[-1] for line in t.lines() if line.startswith(word)}
        if not reconcile:  # stale    inbox/NAME (run with --reconcile to remove)
            said = {line.split()[1] for line in t.lines() if line.startswith(word)}
        assert said == temps, t
    assert tree(queue.dir) == before

    plain = recover(queue, cache)
    assert plain.rc == 1, plain
    assert f"requeue  {zoo['dead-holder']}" in plain.out, plain
    assert state_of(queue, zoo["dead-holder"]) == "pending"
    assert state_of(queue, zoo["unleased"]) is not None
    assert (queue.dir / "claimed" / zoo["unleased"] / zoo["unleased"]).is_file()
    fixed = recover(queue, cache, "--reconcile", "--grace", "0")
    assert fixed.rc == 0, fixed
    assert os.listdir(queue.dir / "inbox") == ["subdir"]  # a directory there is only ignored
    settled = tree(queue.dir)
    for reconcile, dry, grace, as_json in itertools.product([False, True], repeat=4):
        args = ["--reconcile"] * reconcile + ["--dry-run"] * dry + ["--grace", "0"] * grace
        args += ["--json"] * as_json
        r = recover(queue, cache, *args)
        assert r.rc == 0, (args, r)
        if as_json:
            assert r.json()["requeued"] == r.json()["repaired"] == [], r
        assert tree(queue.dir) == settled, args
    assert state_of(queue, zoo["live-holder"]) == "claimed"


# --- the --json report ------------------------------------------------------------------------


def test_the_json_report_is_complete_and_stable(queue, cache, leases):
    """§2.4, Q-6: ``--json`` names every job that is not simply pending or finished exactly
    once, with J, its state, a detail, its action and every piece of its evidence (paths in
    the queue that exist); each ignored entry with its path and reason; each stray temp as
    ``inbox/NAME``.  Two dry runs print the same bytes, and the text form names the same."""
    zoo = build_zoo(queue, leases)
    first = recover(queue, cache, "--reconcile", "--dry-run", "--json")
    second = recover(queue, cache, "--reconcile", "--dry-run", "--json")
    assert first.out == second.out and first.rc == second.rc == 1, (first, second)
    report = first.json()
    assert set(report) == REPORT_KEYS
    assert isinstance(report["consistent"], bool) and report["consistent"] is False
    seen: dict[str, str] = {}
    for key in FINDING_LISTS:
        for f in report[key]:
            assert FINDING_KEYS <= set(f) <= FINDING_KEYS | {"error"}, f
            assert f["job"] not in seen, (f["job"], seen.get(f["job"]), key)
            seen[f["job"]] = key
            assert f["job"].endswith(SUFFIX) and is_object_name(f["job"]), f
            assert isinstance(f["detail"], str) and f["detail"], f
            assert f["evidence"], f
            for path in f["evidence"]:
                assert f["job"] in path, (f, path)
                assert os.path.lexists(queue.dir / path.rstrip("/")), (f, path)
    for f in report["repaired"] + report["incomplete"]:
        assert f["action"] in REPAIRS, f
    for f in report["requeued"]:
        assert f["action"] == "requeue", f
    for f in report["conflicts"] + report["untouched"]:
        assert f["action"] is None or f["action"] in REPAIRS, f
    troubled = {zoo[k] for k in KINDS}
    assert set(seen) == troubled, set(seen) ^ troubled
    assert zoo["pending"] not in seen and zoo["finished"] not in seen
    wanted = {
        "dead-holder": "requeued",
        "expired-lease-live-pid": "requeued",
        "live-holder": "untouched",
        "orphan-lease-live": "incomplete",
        "result-beside-live-claim": "incomplete",
        "pending-and-done": "conflicts",
        "claim-with-symlink-lease": "conflicts",
        "unleased": "repaired",
        "claim-link-of-done": "repaired",
    }
    for kind, key in wanted.items():
        assert seen[zoo[kind]] == key, (kind, seen[zoo[kind]])
    ignored = {i["path"]: i["reason"] for i in report["ignored"]}
    for rel in ("pending/.hidden.req.json", "pending/sym.req.json", "inbox/subdir"):
        assert ignored.get(rel), (rel, ignored)
    assert all(set(i) == {"path", "reason"} for i in report["ignored"]), report["ignored"]
    assert all(t.startswith("inbox/") for t in report["stale_temps"]), report["stale_temps"]
    text = recover(queue, cache, "--reconcile", "--dry-run")
    assert text.rc == 1, text
    for j in seen:
        assert j in text.out, (j, text)
    for rel in ignored:
        assert rel in text.out, (rel, text)


# --- the queue named another way, or incomplete itself -----------------------------------------


def unselected(out: str) -> str:
    """``out`` with the queue that each suggested ``'ctx queue …'`` command names left out."""
    return re.sub(r"'(ctx queue [^']*?) --(?:queue|project) [^' ]+'", r"'\1'", out)


def test_recover_of_a_queue_named_by_its_path(queue, cache, leases, tmp_path):
    """§2.4: ``--queue PATH``, a ``--project`` holding a '/' and a relative path from the
    queue's parent all name the same queue and give the same report as ``--project P``; a
    symlink to the queue is refused (ELOOP, exit 1) and both names at once are a usage
    error (exit 2), changing nothing."""
    zoo = build_zoo(queue, leases)
    env = clean_env(CTX_STORAGE=str(queue.storage), XDG_CACHE_HOME=str(cache))
    base = ("queue", "recover", "--reconcile", "--dry-run", "--json")
    by_name = ctx_run(*base, "--project", "proj", env=env)
    before = tree(queue.dir)
    for how, cwd in (
        (("--queue", str(queue.dir)), None),
        (("--project", str(queue.dir)), None),
        (("--project", "./queue"), queue.dir.parent),
        (("--queue", "queue"), queue.dir.parent),
    ):
        r = ctx_run(*base, *how, env=env, cwd=cwd)
        # The same report, but for the commands it suggests, which name the queue as given.
        assert (r.rc, unselected(r.out)) == (by_name.rc, unselected(by_name.out)), (how, r)
        assert re.search(r"'ctx queue recover --reconcile --(queue|project) /", r.out), r
    link = tmp_path / "queue-link"
    link.symlink_to(queue.dir)
    refused = ctx_run("queue", "recover", "--reconcile", "--queue", link, env=env)
    assert refused.rc == 1 and "ELOOP" in refused.err, refused
    both = ctx_run("queue", "recover", "--reconcile", "--project", "proj", "--queue", queue.dir,
                   env=env)  # fmt: skip
    assert both.rc == 2, both
    assert tree(queue.dir) == before
    real = ctx_run("queue", "recover", "--queue", queue.dir, "--json", env=env)
    assert real.rc == 1, real
    assert {f["job"] for f in real.json()["requeued"]} == {
        zoo["dead-holder"],
        zoo["expired-lease-live-pid"],
    }


def test_recover_of_a_queue_outside_the_storage_root(tmp_path, cache, leases):
    """§2.4: a private queue made by ``ctx queue init --queue DIR`` is recovered by path, with
    the same rules: a dead holder's claim back to pending, an unleased claim back with
    ``--reconcile``, a second run changing nothing."""
    qdir = tmp_path / "private-queue"
    env = clean_env(XDG_CACHE_HOME=str(cache), CTX_STORAGE=str(tmp_path / "unused-root"))
    made = ctx_run("queue", "init", "--queue", qdir, env=env)
    assert made.rc == 0, made
    q = QueueCLI(tmp_path, "unused")
    q.dir = qdir
    dead = claimed_by(q, "dead", leases.dead)
    unleased = claimed_by(q, "unleased", None)
    plain = ctx_run("queue", "recover", "--queue", qdir, "--json", env=env)
    assert plain.rc == 1, plain
    assert [f["job"] for f in plain.json()["requeued"]] == [dead]
    assert [f["job"] for f in plain.json()["incomplete"]] == [unleased]
    fixed = ctx_run("queue", "recover", "--queue", qdir, "--reconcile", "--json", env=env)
    assert fixed.rc == 0 and [f["job"] for f in fixed.json()["repaired"]] == [unleased], fixed
    assert sorted(os.listdir(qdir / "pending")) == sorted([dead, unleased])
    settled = tree(qdir)
    again = ctx_run("queue", "recover", "--queue", qdir, "--reconcile", env=env)
    assert again.rc == 0 and tree(qdir) == settled, again


@pytest.mark.parametrize("missing", sorted(QUEUE_SUBDIRS))
def test_a_queue_missing_a_state_directory_is_refused_until_init_repairs_it(
    queue, cache, leases, missing
):
    """§2.4, I-5: a queue without one of its six directories is refused by every mode of
    recover (ENOENT, exit 1, naming the directory and the ``ctx queue init`` that repairs
    it) and nothing is made or changed; the init it names repairs it, and recover then
    works as usual."""
    dead = claimed_by(queue, "dead", leases.dead)
    unleased = claimed_by(queue, "unleased", None)
    (queue.dir / "inbox" / "old.publish.tmp").write_text("partial")
    age(queue.dir / "inbox" / "old.publish.tmp", DAY)
    aside = queue.dir.parent / f"{missing}.aside"
    (queue.dir / missing).rename(aside)
    before = tree(queue.dir)
    modes = [("--reconcile", "--json"), ("--dry-run",), ("--grace", "0"), ("--reconcile",)]
    modes += [("--reconcile", "--dry-run", "--grace", "5", "--json"), ("--json",)]
    args = modes[sorted(QUEUE_SUBDIRS).index(missing)]
    r = recover(queue, cache, *args)
    assert r.rc == 1, (args, r)
    said = r.err + r.out
    assert "ENOENT" in said and f"no {missing}/ directory" in said, (args, r)
    assert "'ctx queue init --project proj'" in said, (args, r)
    if "--json" in args:
        assert r.json()["error"] == "ENOENT", r
    assert tree(queue.dir) == before, args
    init = queue.run("init")
    assert init.rc == 0, init
    assert (queue.dir / missing).is_dir()
    shutil.rmtree(queue.dir / missing)
    aside.rename(queue.dir / missing)
    fixed = recover(queue, cache, "--reconcile", "--json")
    assert fixed.rc == 0, fixed
    assert queue.state(dead) == queue.state(unleased) == "pending"


@pytest.mark.parametrize("planted", ["file", "symlink"])
def test_a_state_directory_that_is_not_one_is_refused(queue, cache, leases, tmp_path, planted):
    """Q-8, §2.4: ``pending/`` replaced by a file or a symlink to a real directory is refused
    by recover and its dry run (exit 1), and nothing is written through it."""
    claimed_by(queue, "dead", leases.dead)
    pending = queue.dir / "pending"
    pending.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if planted == "file":
        pending.write_text("not a directory")
    else:
        pending.symlink_to(elsewhere)
    before = tree(queue.dir)
    for args in (("--dry-run",), ("--json",), ("--reconcile",)):
        r = recover(queue, cache, *args)
        assert r.rc == 1, (args, r)
        assert "pending" in r.err, r
        assert tree(queue.dir) == before
    assert os.listdir(elsewhere) == []


# --- what a dry run cannot know, and refusals -------------------------------------------------


def test_dry_run_plans_no_requeue_that_the_real_run_refuses(queue, cache, leases):
    """§2.4, Q-5: recover looks at the request and lease files it will move before its first
    step (docs/queue.md) and refuses a job whose request is immutable.  A dry run reports
    "what it would do", so it must not promise that requeue: it says the job cannot be
    requeued, as the real run then does."""
    j = claimed_by(queue, "stuck", leases.dead)
    request_file = queue.dir / "claimed" / j / j
    with attribute(request_file, "i"):
        dry = recover(queue, cache, "--dry-run", "--json")
        real = recover(queue, cache, "--json")
    assert real.rc == 1 and [f["job"] for f in real.json()["errors"]] == [j], real
    assert queue.state(j) == "claimed"
    planned = [f["job"] for f in dry.json()["requeued"]]
    assert (planned, dry.rc) == ([], real.rc), dry


def test_an_immutable_stray_temp_is_named_with_its_attribute(queue, cache):
    """Q-6, docs/queue.md: a stray temp recover may not remove is said as the other
    refusals are: what refused (the file's immutable attribute, which no mode of inbox/
    explains and which refuses root too) and the ``chattr -i`` that removes it; the temp is
    left, the run exits 1."""
    temp = queue.dir / "inbox" / "stuck.publish.tmp"
    temp.write_text("partial")
    age(temp, DAY)
    with attribute(temp, "i"):
        r = recover(queue, cache, "--reconcile", "--json")
    assert r.rc == 1, r
    (error,) = r.json()["errors"]
    assert error["error"] == "EPERM" and "not removed" in error["detail"], r
    assert temp.exists()
    assert "immutable" in error["detail"] and f"chattr -i {temp}" in error["detail"], error


def test_the_json_report_suggests_commands_for_the_queue_it_was_given(tmp_path, cache, leases):
    """§2.4, docs/queue.md: a ``ctx queue …`` command a report suggests names the queue as
    the command was told it, so that, copied, it acts on the same queue.  The text report
    does; the ``detail`` of the same finding in ``--json`` (what a script shows its user)
    must too, or the copied command acts on ``$CTX_PROJECT``'s queue or on none."""
    qdir = tmp_path / "private-queue"
    env = clean_env(XDG_CACHE_HOME=str(cache), CTX_STORAGE=str(tmp_path / "unused-root"))
    assert ctx_run("queue", "init", "--queue", qdir, env=env).rc == 0
    q = QueueCLI(tmp_path, "unused")
    q.dir = qdir
    j = _orphan_lease_live(q, leases)
    base = ("queue", "recover", "--queue", qdir, "--reconcile")
    text = ctx_run(*base, env=env)
    assert text.rc == 1, text
    line = next(line for line in text.lines() if j in line)
    assert f"'ctx queue recover --reconcile --queue {qdir}'" in line, text
    as_json = ctx_run(*base, "--json", env=env)
    assert as_json.rc == 1, as_json
    (finding,) = as_json.json()["incomplete"]
    assert "'ctx queue recover --reconcile" in finding["detail"], finding
    assert f"'ctx queue recover --reconcile --queue {qdir}'" in finding["detail"], finding


def test_a_member_refused_a_claim_directory_is_told_and_nothing_moves(_template, leases):
    """Q-5, docs/queue.md: a member of the queue's group meeting a ``claimed/J`` of mode
    2755 owned by root (an older release's) gets an ``error`` line naming the uid, the
    directory's owner, group and mode (exit 1); J stays claimed, and every other job is
    still handled.  The member's dry run changes nothing."""
    (user,) = users_named("ctxtest")
    top = new_scratch_dir(scratch_top(__file__))
    try:
        root = copy_of_root(_template, top / "storage")
        q = QueueCLI(root, "proj")
        space = root / "shared" / "proj"
        subprocess.run(["chgrp", "-R", str(user.gid), str(space)], check=True)
        stuck = claimed_by(q, "stuck", leases.dead)
        other = claimed_by(q, "other", leases.dead)
        for path in (q.dir / "claimed" / other, q.dir / "lease" / other):
            os.chown(path, 0, user.gid)
            path.chmod(0o2770)
        for path in (q.dir / "claimed" / stuck, q.dir / "lease" / stuck):
            os.chown(path, 0, user.gid)
        (q.dir / "claimed" / stuck).chmod(0o2755)
        (q.dir / "lease" / stuck).chmod(0o2770)
        for path in q.dir.rglob("*"):
            if path.is_file():
                os.chown(path, 0, user.gid)
                path.chmod(0o660)
        os.chmod(root, 0o755)
        os.chmod(top, 0o755)
        cache = top / "member-cache"
        env = clean_env(CTX_STORAGE=str(root), XDG_CACHE_HOME=str(cache), HOME=str(top))
        argv = [*CTX_ARGV, "queue", "recover", "--project", "proj", "--json"]
        before = tree(q.dir)
        dry = run_as(user, [*argv, "--dry-run"], env=env)
        assert dry.returncode == 1, dry  # it plans what the run does: the refusal too
        assert tree(q.dir) == before
        real = run_as(user, argv, env=env)
        assert real.returncode == 1, real
        report = json.loads(real.stdout)
        planned = json.loads(dry.stdout)
        assert [f["job"] for f in planned["requeued"]] == [other], planned
        assert [(f["job"], f["error"]) for f in planned["errors"]] == [(stuck, "EACCES")]
        assert [f["job"] for f in report["requeued"]] == [other], report
        (error,) = report["errors"]
        assert error["job"] == stuck and error["error"] == "EACCES", error
        detail = error["detail"]
        assert f"uid {user.uid}" in detail and "2755" in detail and "owner uid 0" in detail, error
        assert "left as it is" in detail, error
        assert q.state(stuck) == "claimed" and q.state(other) == "pending"
    finally:
        shutil.rmtree(top, ignore_errors=True)
