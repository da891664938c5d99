"""The queue's readers — ``ctx queue status``, ``list`` and ``show`` — over queues holding every
state at once (SPEC §2.1 durable states, §2.4 queue CLI and exit statuses, Q-3 lease fields,
Q-5 liveness, Q-6 incomplete pairs and conflicts, Q-8 what is not a job, Q-9 claim order, R-3
names; docs/queue.md "What is not a job (Q-8)", the CLI section on ``status --json`` and
``show --json``, and "Liveness (Q-5)").

One queue holds pending jobs (published, and dropped by hand with names at R-3's length limit
and with every punctuation R-3 allows), claims whose holder is alive, dead, leased until year
9999 or since year 1, finished and failed jobs, incomplete pairs of every kind the Q-6 table
names, conflicts (one job pending and done, a request without its result, both terminal
states, a lease that does not parse, a lease expiring past year 9999), ignored entries (a
dot-file, an illegal name, a FIFO, a symlink, a directory in ``inbox/``) and stray temps (a
regular file, a symlink at a staging name, a README).  On it:

* ``status --json`` has exactly the documented keys and types, its counts add up to the jobs
  ``list`` gives and to the lengths of its lists, in the documented orders; the text form has
  its count column aligned and one line per incomplete pair, conflict, ignored entry and temp;
* ``list`` and ``list --state S`` for every state agree with ``status``, ``--state pending``
  lists in claim order (publish time, then name) and claims follow that order;
* ``show J`` for each kind of job gives the documented keys and types, the state ``list``
  gives, the repair ``status`` gives, a holder judged as Q-5 says, an aligned evidence table,
  and exit 1 exactly for a conflict;
* none of them changes a byte, a mode, an mtime or an inode of the queue, as root or as a
  member of the queue's group;
* thousands of jobs, a result at ``max_result_bytes`` exactly, names of 64 bytes, and evidence
  whose mtime lies outside years 1-9999 (a tmpfs keeps such times) are read and shown whole.

Lease holders are real processes; the tmpfs is mounted below /tmp/<this file's stem>-<uid>/
and unmounted after the test."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    clean_env,
    new_scratch_dir,
    request,
    result,
    scratch_top,
)
from tests.support.scratch_mounts import ScratchMounts
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
PROJECT = "proj"
DEAD_PID = 4_000_000  # below PID_MAX_LIMIT, above any pid this machine hands out
TRACEBACK = "Traceback (most recent call last)"
STATES = ("pending", "claimed", "done", "failed", "incomplete", "conflict")
COUNT_KEYS = (*STATES, "ignored")
STATUS_KEYS = {
    "queue",
    "pending",
    "claimed",
    "done",
    "failed",
    "conflict",
    "counts",
    "ignored",
    "incomplete",
    "conflicts",
    "temps",
    "owned_by_others",
    "group_not_inherited",
}
SHOW_KEYS = {"name", "state", "detail", "repair", "evidence", "temps"}
EVIDENCE_KEYS = {"path", "kind", "size", "mtime", "inode"}
# The order status lists ignored entries in: the way a job moves, staging last.
SCAN_ORDER = ("pending", "claimed", "lease", "done", "failed", "inbox")
# R-3 at its limit: 55 bytes before the suffix, 64 with it.
LONGEST = "L" + "o" * 53 + "g"
ODD_BUT_LEGAL = ("0", "A-_.b", "x.req.json.y", "a.d.x", "Z9-", "q..q")
YEAR_9999 = "9999-12-31T23:59:59Z"
YEAR_1 = "0001-01-01T00:00:00Z"


def j(stem: str) -> str:
    return f"{stem}.req.json"


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def world(_template: Path) -> Iterator[Path]:
    """A bootstrapped storage root holding project ``proj``'s queue, in a scratch directory
    every uid may search (the test user reads it too)."""
    top = new_scratch_dir(SCRATCH, "w")
    root = copy_of_root(_template, top / "storage")
    yield root
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def queue(world: Path) -> QueueCLI:
    return QueueCLI(world, PROJECT)


@pytest.fixture
def live() -> Iterator[subprocess.Popen]:
    """A live process to stand in as a lease holder; killed and reaped at teardown."""
    proc = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def ok(r: Run, *codes: int) -> Run:
    """``r``, after checking it exited with one of ``codes`` and printed no traceback."""
    assert TRACEBACK not in r.out + r.err, r
    assert r.rc in codes, r
    return r


def published_and_claimed(q: QueueCLI, stem: str, *claim_args: str) -> str:
    """J published into an empty pending/ and claimed at once (so it is the job claimed)."""
    job = q.publish(request(tag=stem), name=stem)
    r = ok(q.run("claim", *claim_args), 0)
    assert r.out == f"{job}\n", r
    return job


def edit_lease(q: QueueCLI, job: str, **changes) -> None:
    lease = q.lease(job)
    lease.update(changes)
    q.write_lease(job, lease)


def set_mtime(path: Path, seconds: float) -> None:
    os.utime(path, (seconds, seconds), follow_symlinks=False)


@dataclass
class Everything:
    """What :func:`build_everything` made: each job's expected state, and the repair of each
    incomplete pair."""

    states: dict[str, str]
    repairs: dict[str, str]
    holders: dict[str, str]  # job -> expected holder state
    ignored: list[str]
    temps: list[str]

    def of(self, state: str) -> list[str]:
        return sorted(job for job, s in self.states.items() if s == state)


def build_everything(q: QueueCLI, live_pid: int) -> Everything:
    """One queue with every state at once (see the module docstring)."""
    d = q.dir
    states: dict[str, str] = {}
    repairs: dict[str, str] = {}
    holders: dict[str, str] = {}

    # Claimed: alive, dead, leased until year 9999, leased since year 1 (expired).
    job = published_and_claimed(q, "live", "--pid", str(live_pid), "--worker", "wörker ✓ 1")
    states[job], holders[job] = "claimed", "alive"
    job = published_and_claimed(q, "dead", "--pid", str(DEAD_PID))
    states[job], holders[job] = "claimed", "gone"
    job = published_and_claimed(q, "future", "--pid", str(live_pid))
    edit_lease(q, job, expires_at=YEAR_9999)
    states[job], holders[job] = "claimed", "alive"
    job = published_and_claimed(q, "past", "--pid", str(live_pid))
    edit_lease(q, job, claimed_at=YEAR_1, expires_at=YEAR_1)
    states[job], holders[job] = "claimed", "gone"

    # Finished and failed through the CLI.
    job = published_and_claimed(q, "ok", "--pid", str(live_pid))
    ok(q.run("finish", job, "--ok", "-", input=json.dumps({"answer": [1, "二", None]})), 0)
    states[job] = "done"
    job = published_and_claimed(q, "bad", "--pid", str(live_pid))
    ok(q.run("finish", job, "--error", "-", input="it broke\n\tbadly\n"), 0)
    states[job] = "failed"

    # Incomplete pairs of each kind Q-6 names.
    job = published_and_claimed(q, "rollfwd", "--pid", str(DEAD_PID))
    (d / "done" / f"{job}.result").write_text(json.dumps(result("done")))
    states[job], repairs[job], holders[job] = "incomplete", "roll-forward", "gone"
    job = j("nolease")
    (d / "claimed" / job).mkdir()
    (d / "claimed" / job / job).write_text(json.dumps(request(tag="nolease")))
    states[job], repairs[job] = "incomplete", "requeue-unleased"
    job = j("emptyclaim")
    (d / "claimed" / job).mkdir()
    states[job], repairs[job] = "incomplete", "remove-orphans"
    job = published_and_claimed(q, "orphan", "--pid", str(DEAD_PID))
    (d / "claimed" / job / job).unlink()  # its request gone by hand: the lease is an orphan
    (d / "claimed" / job).rmdir()
    states[job], repairs[job], holders[job] = "incomplete", "remove-orphans", "gone"

    # Conflicts.
    job = q.terminal("twice", "done")
    (d / "pending" / job).write_text(json.dumps(request(tag="twice")))
    states[job] = "conflict"
    job = j("noresult")
    (d / "done" / job).write_text(json.dumps(request(tag="noresult")))
    states[job] = "conflict"
    job = q.terminal("both", "done")
    q.terminal("both", "failed")
    states[job] = "conflict"
    job = published_and_claimed(q, "badlease", "--pid", str(live_pid))
    (d / "lease" / job / "worker").write_text("{}")
    states[job], holders[job] = "conflict", "unreadable"
    job = published_and_claimed(q, "y10k", "--pid", str(live_pid))
    edit_lease(q, job, expires_at="+10000-01-01T00:00:00Z")
    states[job], holders[job] = "conflict", "unreadable"

    # Pending last (claims above took from an empty pending/ each time): published, and
    # dropped by hand with names at the limit and odd but legal characters.
    states[q.publish(request(tag="p1"), name="p1")] = "pending"
    for stem in (LONGEST, *ODD_BUT_LEGAL):
        states[q.drop(stem, request(tag=stem))] = "pending"

    # Ignored entries and stray temps.
    (d / "pending" / ".hidden.req.json").write_text("{}")
    (d / "pending" / "bad name!.req.json").write_text("{}")
    os.mkfifo(d / "pending" / "fifo.req.json")
    (d / "pending" / "link.req.json").symlink_to("/etc/passwd")
    (d / "inbox" / "dir").mkdir()
    ignored = [
        "pending/.hidden.req.json",
        "pending/bad name!.req.json",
        "pending/fifo.req.json",
        "pending/link.req.json",
        "inbox/dir",
    ]
    (d / "inbox" / "t.req.json.publish.tmp").write_text('{"half": ')
    (d / "inbox" / "s.req.json.publish.tmp").symlink_to("/nowhere")
    (d / "inbox" / "README").write_text("not a temp of any job\n")
    temps = ["inbox/README", "inbox/s.req.json.publish.tmp", "inbox/t.req.json.publish.tmp"]
    return Everything(states, repairs, holders, sorted(ignored), temps)


@pytest.fixture(scope="module")
def _built(_template: Path) -> Iterator[tuple[Path, Everything]]:
    """:func:`build_everything` made once per test process, its lease holder alive for as
    long; each test works on a copy (:func:`full`)."""
    holder = subprocess.Popen(["sleep", "3600"], stdout=subprocess.DEVNULL)
    top = new_scratch_dir(SCRATCH, "b")
    try:
        root = copy_of_root(_template, top / "storage")
        made = build_everything(QueueCLI(root, PROJECT), holder.pid)
        yield root, made
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def full(_built: tuple[Path, Everything]) -> Iterator[tuple[QueueCLI, Everything]]:
    """A copy of the queue holding everything (``cp -a``: FIFOs, links, modes and times
    kept), in a scratch directory every uid may search."""
    built, made = _built
    top = new_scratch_dir(SCRATCH, "f")
    copied = subprocess.run(["cp", "-a", str(built), str(top / "storage")], capture_output=True)
    assert copied.returncode == 0, copied.stderr
    yield QueueCLI(top / "storage", PROJECT), made
    shutil.rmtree(top, ignore_errors=True)


def tree_state(top: Path) -> dict[str, tuple]:
    """Every entry below ``top`` (links never followed, FIFOs never opened): type, mode,
    owner, size, mtime, ctime, inode, link count, and a regular file's bytes."""
    found: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in [".", *dirnames, *filenames]:
            p = Path(dirpath, name)
            st = os.lstat(p)
            key = str(p.relative_to(top))
            data = p.read_bytes() if stat.S_ISREG(st.st_mode) else None
            link = os.readlink(p) if stat.S_ISLNK(st.st_mode) else None
            found[key] = (
                st.st_mode,
                st.st_uid,
                st.st_gid,
                st.st_size,
                st.st_mtime_ns,
                st.st_ctime_ns,
                st.st_ino,
                st.st_nlink,
                data,
                link,
            )
    return found


def every_reading(q: QueueCLI, jobs: list[str], shown_as_text: list[str]) -> list[Run]:
    """Every reader, text and --json, every --state, ``show --json`` of each of ``jobs`` and
    ``show`` in text of each of ``shown_as_text``."""
    runs = []
    for fmt in ((), ("--json",)):
        runs.append(q.run("status", *fmt))
        runs.append(q.run("list", *fmt))
        for state in STATES:
            runs.append(q.run("list", "--state", state, *fmt))
    runs.extend(q.run("show", job, "--json") for job in jobs)
    runs.extend(q.run("show", job) for job in shown_as_text)
    return runs


# ------------------------------------------------------------------------------ status


def test_status_json_has_the_documented_keys_types_and_counts_that_add_up(full):
    """§2.4, docs/queue.md: ``status --json`` is one object with exactly the documented keys;
    each state's count at the top level and all of them in ``counts``; the counts are the
    lengths of the lists; each job sits in the state its evidence means (§2.1, Q-6);
    incomplete pairs name the Q-6 repair; ignored entries come state by state, then by
    path; temps by name, with their job and kind; exit 1 since conflicts are found."""
    queue, made = full
    r = ok(queue.run("status", "--json"), 1)
    report = r.json()
    assert set(report) == STATUS_KEYS, report.keys()
    assert report["queue"] == str(queue.dir)
    counts = report["counts"]
    assert list(counts) == list(COUNT_KEYS), counts
    assert all(type(n) is int and n >= 0 for n in counts.values()), counts
    for state in ("pending", "claimed", "done", "failed", "conflict"):
        assert report[state] == counts[state], (state, report)
    for state in ("pending", "claimed", "done", "failed"):
        assert counts[state] == len(made.of(state)), (state, counts, made.of(state))
    assert counts["incomplete"] == len(report["incomplete"]) == len(made.of("incomplete"))
    assert counts["conflict"] == len(report["conflicts"]) == len(made.of("conflict"))
    assert counts["ignored"] == len(report["ignored"]) == len(made.ignored)

    incomplete = report["incomplete"]
    assert [item["job"] for item in incomplete] == made.of("incomplete"), incomplete
    for item in incomplete:
        assert set(item) == {"job", "state", "detail", "repair", "evidence"}, item
        assert item["state"] == "incomplete" and item["repair"] == made.repairs[item["job"]]
        assert isinstance(item["detail"], str) and item["detail"], item
        assert item["evidence"] and all(isinstance(p, str) for p in item["evidence"]), item
    conflicts = report["conflicts"]
    assert [item["job"] for item in conflicts] == made.of("conflict"), conflicts
    for item in conflicts:
        assert set(item) == {"job", "state", "detail", "repair", "evidence"}, item
        assert item["state"] == "conflict" and item["repair"] is None, item
        assert item["evidence"], item
    # Every piece of evidence of a conflict is named.
    by_job = {item["job"]: set(item["evidence"]) for item in conflicts}
    assert by_job[j("both")] == {
        f"done/{j('both')}",
        f"done/{j('both')}.result",
        f"failed/{j('both')}",
        f"failed/{j('both')}.result",
    }
    assert by_job[j("twice")] == {
        f"pending/{j('twice')}",
        f"done/{j('twice')}",
        f"done/{j('twice')}.result",
    }

    ignored = report["ignored"]
    assert all(set(i) == {"path", "reason"} and i["reason"] for i in ignored), ignored
    paths = [i["path"] for i in ignored]
    assert sorted(paths) == made.ignored, paths
    assert paths == sorted(paths, key=lambda p: (SCAN_ORDER.index(p.split("/")[0]), p))
    reasons = {i["path"]: i["reason"] for i in ignored}
    assert "dot-file" in reasons["pending/.hidden.req.json"]
    assert "FIFO" in reasons["pending/fifo.req.json"]
    assert "symlink" in reasons["pending/link.req.json"]
    assert "illegal" in reasons["pending/bad name!.req.json"]

    temps = report["temps"]
    assert [t["path"] for t in temps] == made.temps, temps
    for t in temps:
        assert set(t) == {"path", "age_seconds", "job", "kind"}, t
        assert isinstance(t["age_seconds"], int | float) and t["age_seconds"] >= 0, t
    assert {t["path"]: (t["job"], t["kind"]) for t in temps} == {
        "inbox/README": (None, "regular file"),
        "inbox/s.req.json.publish.tmp": (j("s"), "symlink"),
        "inbox/t.req.json.publish.tmp": (j("t"), "regular file"),
    }
    assert report["owned_by_others"] == [] and report["group_not_inherited"] == []


def test_status_text_aligns_its_counts_and_agrees_with_the_json(full):
    """§2.4: the text form of ``status`` gives the queue, then one line per count — the label
    padded to one width, the number right-aligned in one column — then a line per
    incomplete pair, conflict, ignored entry and temp, each label in the same column as the
    counts' labels; numbers and names as ``--json`` gives them; the same exit status."""
    queue, _ = full
    report = ok(queue.run("status", "--json"), 1).json()
    r = ok(queue.run("status"), 1)
    lines = r.lines()
    assert lines[0] == f"queue: {queue.dir}", r
    count_lines = lines[1 : 1 + len(COUNT_KEYS)]
    assert len({len(line) for line in count_lines}) == 1, count_lines
    for key, line in zip(COUNT_KEYS, count_lines, strict=True):
        label, number = line.split()
        assert label == key and int(number) == report["counts"][key], line
        assert line.startswith(f"{key:<11}") and line.endswith(str(report["counts"][key]))
    rest = lines[1 + len(COUNT_KEYS) :]
    kinds = [line[:11].rstrip() for line in rest]
    assert all(line[11] != " " for line in rest), rest
    expected = (
        ["incomplete"] * len(report["incomplete"])
        + ["conflict"] * len(report["conflicts"])
        + ["ignored"] * len(report["ignored"])
        + ["temp"] * len(report["temps"])
    )
    assert kinds == expected, rest
    named = [line[11:] for line in rest]
    jobs = [i["job"] for i in report["incomplete"]] + [c["job"] for c in report["conflicts"]]
    for name, job in zip(named, jobs, strict=False):
        assert name.startswith(f"{job}: "), (name, job)
    for item in report["incomplete"]:
        assert any(f"recover --reconcile: {item['repair']}" in line for line in rest), item
    tail = named[len(jobs) :]
    shown = [i["path"] for i in report["ignored"]] + [t["path"] for t in report["temps"]]
    for name, path in zip(tail, shown, strict=True):
        assert name.startswith(path), (name, path)
    assert "symlink, " in rest[-2] and "s.req.json.publish.tmp" in rest[-2], rest


def test_status_exits_0_for_incomplete_pairs_and_1_for_a_single_conflict(queue, live):
    """§2.4: ``status`` exits 1 when it finds a conflict, else 0; an incomplete pair, a stray
    temp, an ignored entry, a claim whose holder is gone are no conflict."""
    published_and_claimed(queue, "dead", "--pid", str(DEAD_PID))
    job = j("nolease")
    (queue.dir / "claimed" / job).mkdir()
    (queue.dir / "claimed" / job / job).write_text(json.dumps(request()))
    (queue.dir / "inbox" / "x.req.json.publish.tmp").write_text("{")
    os.mkfifo(queue.dir / "pending" / "fifo.req.json")
    for fmt in ((), ("--json",)):
        ok(queue.run("status", *fmt), 0)
        ok(queue.run("list", *fmt), 0)
        ok(queue.run("list", "--state", "incomplete", *fmt), 0)
        ok(queue.run("show", "nolease", *fmt), 0)
    queue.terminal("twice", "done")
    (queue.dir / "failed" / f"{j('twice')}.result").write_text(json.dumps(result("failed")))
    for fmt in ((), ("--json",)):
        ok(queue.run("status", *fmt), 1)
        ok(queue.run("list", *fmt), 1)
        ok(queue.run("list", "--state", "conflict", *fmt), 1)
        # Listing only other states lists no conflict.
        ok(queue.run("list", "--state", "claimed", *fmt), 0)
        ok(queue.run("show", "twice", *fmt), 1)
        ok(queue.run("show", "dead", *fmt), 0)


# ------------------------------------------------------------------------------ list


def test_list_and_every_state_filter_agree_with_status(full):
    """§2.4: ``list`` gives every job once with the state ``status`` counts it in, sorted by
    name, ignored entries left out (Q-8); ``list --state S`` gives exactly the jobs of S
    (pending ones in claim order) as bare names in text and ``{"name", "state"}`` objects
    in JSON; text and JSON name the same jobs; exit 1 exactly when a conflict is listed."""
    queue, made = full
    counts = ok(queue.run("status", "--json"), 1).json()["counts"]
    listed = ok(queue.run("list", "--json"), 1).json()
    assert all(set(item) == {"name", "state"} for item in listed), listed
    names = [item["name"] for item in listed]
    assert names == sorted(names) and len(set(names)) == len(names), names
    assert {item["name"]: item["state"] for item in listed} == made.states
    assert len(listed) == sum(counts[s] for s in STATES), (len(listed), counts)
    text = ok(queue.run("list"), 1)
    assert text.lines() == [f"{item['state']:<11}{item['name']}" for item in listed], text
    for line in text.lines():
        assert line[:11].rstrip() in STATES and line[11] != " ", line
    for state in STATES:
        expected_rc = 1 if state == "conflict" else 0
        as_json = ok(queue.run("list", "--state", state, "--json"), expected_rc).json()
        assert all(item["state"] == state for item in as_json), as_json
        got = [item["name"] for item in as_json]
        assert sorted(got) == made.of(state), (state, got)
        assert len(got) == counts[state], (state, got, counts)
        if state != "pending":
            assert got == sorted(got), (state, got)
        as_text = ok(queue.run("list", "--state", state), expected_rc)
        assert as_text.lines() == got, as_text


def test_list_pending_is_the_claim_order_and_claims_follow_it(queue):
    """Q-9, §2.4 (``--state pending``: "pending ones in claim order"): oldest publish time
    first, name as the tie-break — names of 64 bytes and with every punctuation R-3 allows,
    upper case before lower case as bytes sort; a claim takes the first job listed, then the
    next, until ``list --state pending`` is empty and a claim exits 3."""
    stems = [LONGEST, *ODD_BUT_LEGAL, "B", "b", "a", "A", "9"]
    older, newer = 1_600_000_000, 1_700_000_000
    for n, stem in enumerate(stems):
        job = queue.drop(stem, request(tag=stem))
        set_mtime(queue.dir / "pending" / job, newer if n % 2 else older)
    stamped = sorted(((newer if n % 2 else older), j(stem)) for n, stem in enumerate(stems))
    expected = [name for _, name in stamped]
    first = ok(queue.run("list", "--state", "pending"), 0).lines()
    assert first == expected, first
    assert [i["name"] for i in ok(queue.run("list", "--state", "pending", "--json"), 0).json()] == (
        expected
    )
    taken = []
    while True:
        listed = ok(queue.run("list", "--state", "pending"), 0).lines()
        r = ok(queue.run("claim", "--pid", str(os.getpid())), 0, 3)
        if r.rc == 3:
            assert listed == [] and r.out == "", r
            break
        assert listed and r.out == f"{listed[0]}\n", (listed, r)
        taken.append(listed[0])
    assert taken == expected
    assert ok(queue.run("list", "--state", "claimed"), 0).lines() == sorted(expected)


# ------------------------------------------------------------------------------ show


def test_show_of_every_kind_of_job_gives_the_documented_shape_and_exit(full):
    """§2.4, docs/queue.md (``show --json``: state, detail, repair, each piece of evidence
    with path, kind, size, mtime, inode, its inbox temps, the request, lease and result it
    holds, and a holder when it has a lease): for every job of the queue, the state ``list``
    gives, the repair ``status`` gives, the holder judged by Q-5 (alive, gone by a dead pid
    or an expired lease, unreadable for a lease that is none), exit 1 exactly for a
    conflict; the text form says the same."""
    queue, made = full
    listed = ok(queue.run("status", "--json"), 1).json()
    for job, state in made.states.items():
        r = ok(queue.run("show", job, "--json"), 1 if state == "conflict" else 0)
        shown = r.json()
        assert SHOW_KEYS <= set(shown) <= SHOW_KEYS | {"request", "lease", "result", "holder"}
        assert shown["name"] == job and shown["state"] == state, r
        assert isinstance(shown["detail"], str) and shown["detail"], r
        assert shown["repair"] == made.repairs.get(job), r
        assert shown["evidence"], r
        for item in shown["evidence"]:
            assert set(item) == EVIDENCE_KEYS, item
            assert type(item["size"]) is int and type(item["inode"]) is int, item
            assert item["mtime"].endswith("Z"), item
        paths = [item["path"] for item in shown["evidence"]]
        if state in ("incomplete", "conflict"):
            key = "incomplete" if state == "incomplete" else "conflicts"
            (entry,) = [e for e in listed[key] if e["job"] == job]
            assert set(paths) == set(entry["evidence"]), (paths, entry)
        if job in made.holders:
            assert shown["holder"]["state"] == made.holders[job], r
            assert isinstance(shown["holder"]["reason"], str), r
        else:
            assert "holder" not in shown, r
        if state == "pending":
            assert shown["request"]["tool"] == "fs.read" and "lease" not in shown, r
        if state in ("done", "failed"):
            assert shown["result"]["status"] == ("ok" if state == "done" else "error"), r
    past = ok(queue.run("show", "past", "--json"), 0).json()["holder"]
    assert "expired at 0001-01-01T00:00:00" in past["reason"], past
    dead = ok(queue.run("show", "dead", "--json"), 0).json()["holder"]
    assert f"pid {DEAD_PID}" in dead["reason"], dead
    finished = ok(queue.run("show", "ok", "--json"), 0).json()
    assert finished["result"]["output"] == {"answer": [1, "二", None]}, finished
    failed = ok(queue.run("show", "bad", "--json"), 0).json()
    assert failed["result"]["output"] == "it broke\n\tbadly\n", failed
    worker = ok(queue.run("show", "live", "--json"), 0).json()["lease"]["worker"]
    assert worker == "wörker ✓ 1"


def test_show_text_aligns_its_evidence_table_and_ends_with_the_holder(full):
    """§2.4: ``show J`` in text: ``job:`` and ``state:`` first (``repair:`` for an
    incomplete pair), then the evidence and temps in a table whose second column starts in
    one column, the documents, and last the ``holder:`` line of a job with a lease."""
    queue, made = full
    (queue.dir / "inbox" / f"{j('live')}.lease.abc.tmp").write_text("{")
    for job in (j("live"), j("rollfwd"), j("both"), j("p1"), j(LONGEST), j("twice")):
        shown = ok(queue.run("show", job, "--json"), 0, 1).json()
        r = ok(queue.run("show", job), 0, 1)
        lines = r.lines()
        assert lines[0] == f"job:    {job}", r
        assert lines[1] == f"state:  {shown['state']} ({shown['detail']})", r
        at = 2
        if shown["repair"]:
            assert lines[2] == f"repair: recover --reconcile would apply {shown['repair']}"
            at = 3
        rows = [*shown["evidence"], *shown["temps"]]
        table = lines[at : at + len(rows)]
        width = max(len(row["path"]) for row in rows)
        for line, row in zip(table, rows, strict=True):
            assert line.startswith("  " + row["path"].ljust(width) + " "), (line, row)
            second = line[2 + width + 1 :]
            assert second and second[0] != " ", line
            if "size" in row:
                assert second.startswith(row["kind"]), (line, row)
                assert f"{row['size']} bytes, {row['mtime']}" in second, line
            else:
                assert second.endswith("s old"), line
        docs = lines[at + len(rows) :]
        for key in ("request", "lease", "result"):
            assert (key in shown) == any(line.startswith(f"{key}: ") for line in docs), r
        if "holder" in shown:
            h = shown["holder"]
            assert docs[-1] == f"holder: {h['state']} ({h['reason']})", r
    assert made.states[j("live")] == "claimed"


def test_show_refuses_bad_names_and_unknown_jobs_with_the_documented_exits(queue):
    """§2.4, R-3: ``show`` takes J with or without the suffix, up to 64 bytes with it; a
    longer one, an empty one, one with a ``/`` are usage errors (exit 2, ``EINVAL``), a
    legal name with no evidence is ``ENOENT`` (exit 1); with ``--json`` each error is also
    one object on stdout; a malformed ``--state`` is exit 2 too."""
    job = queue.drop(LONGEST)
    for given in (LONGEST, job):
        assert ok(queue.run("show", given, "--json"), 0).json()["name"] == job
    for given in (LONGEST + "x", "", "a/b", "-x", "..", "a b"):
        r = ok(queue.run("show", "--json", "--", given), 2)
        assert "EINVAL" in r.err, r
        assert r.json()["error"] == "EINVAL" and r.json()["errno"] == 22, r
    r = ok(queue.run("show", "nobody", "--json"), 1)
    assert r.json()["error"] == "ENOENT" and "nobody.req.json" in r.json()["message"], r
    r = ok(queue.run("list", "--state", "Pending", "--json"), 2)
    assert r.json()["error"] == "EINVAL", r


def test_show_of_names_that_are_no_jobs_and_of_temps_alone(queue):
    """Q-8: a name whose only entry is of the wrong kind is no job: ``list`` leaves it out,
    ``status`` lists it as ignored, ``show`` calls it ``ignored`` (exit 0); a name with only
    a temp in ``inbox/`` is in no state (``none``) and shows that temp."""
    os.mkfifo(queue.dir / "pending" / "fifo.req.json")
    (queue.dir / "inbox" / "half.req.json.publish.tmp").write_text("{")
    assert ok(queue.run("list", "--json"), 0).json() == []
    shown = ok(queue.run("show", "fifo", "--json"), 0).json()
    assert shown["state"] == "ignored", shown
    assert [e["kind"] for e in shown["evidence"]] == ["FIFO"], shown
    assert "request" not in shown, shown
    shown = ok(queue.run("show", "half", "--json"), 0).json()
    assert shown["state"] == "none" and shown["evidence"] == [], shown
    assert [t["path"] for t in shown["temps"]] == ["inbox/half.req.json.publish.tmp"], shown


# ------------------------------------------------------------------------------ nothing changes


def test_readers_change_nothing_as_root(full):
    """§2.4 (readers), docs/queue.md ("they read the queue without its locks"): every
    ``status``, ``list`` (each ``--state``) and ``show`` of every job, text and JSON, leaves
    every entry of the queue as it was: bytes, mode, owner, size, mtime, ctime, inode."""
    queue, made = full
    before = tree_state(queue.dir)
    jobs = [*made.states, "fifo.req.json", "t.req.json", "nobody.req.json"]
    one_of_each = [made.of(state)[0] for state in STATES]
    for r in every_reading(queue, jobs, [*one_of_each, "fifo.req.json", "t.req.json"]):
        ok(r, 0, 1)
    assert tree_state(queue.dir) == before


def test_readers_change_nothing_and_agree_as_a_member(full, unprivileged_user):
    """§2.4, X-1: a member of the queue's group (the test user given its gid) reads the same
    counts, lists and states as root and changes nothing."""
    user: UnprivilegedUser = unprivileged_user
    queue, made = full
    group = queue.dir.stat().st_gid
    before = tree_state(queue.dir)
    env = clean_env(CTX_STORAGE=str(queue.storage))

    def as_member(*args: str) -> subprocess.CompletedProcess[str]:
        done = run_as(user, [*CTX_ARGV, "queue", *args, "--project", PROJECT], [group], env=env)
        assert TRACEBACK not in done.stdout + done.stderr, done
        return done

    member = as_member("status", "--json")
    mine = ok(queue.run("status", "--json"), 1).json()
    assert member.returncode == 1, member
    assert json.loads(member.stdout)["counts"] == mine["counts"], member
    listed = as_member("list", "--json")
    assert listed.returncode == 1 and json.loads(listed.stdout) == (
        ok(queue.run("list", "--json"), 1).json()
    )
    for job, state in made.states.items():
        shown = as_member("show", job, "--json")
        assert shown.returncode == (1 if state == "conflict" else 0), shown
        assert json.loads(shown.stdout)["state"] == state, shown
    assert tree_state(queue.dir) == before


# ------------------------------------------------------------------------------ scale and limits


def test_thousands_of_jobs_in_every_state_are_counted_exactly(queue):
    """§2.4, Q-10: 3 000 pending, 1 000 done, 1 000 failed, 500 incomplete pairs and 500
    conflicts written by hand: ``status`` counts each exactly, ``list --state S`` lists as
    many, ``list`` all of them once, in name order."""
    d = queue.dir
    body = json.dumps(request())
    ok_result, error_result = json.dumps(result("done")), json.dumps(result("failed"))
    for n in range(3000):
        (d / "pending" / f"p{n:05d}.req.json").write_text(body)
    for n in range(1000):
        (d / "done" / f"d{n:05d}.req.json").write_text(body)
        (d / "done" / f"d{n:05d}.req.json.result").write_text(ok_result)
        (d / "failed" / f"f{n:05d}.req.json").write_text(body)
        (d / "failed" / f"f{n:05d}.req.json.result").write_text(error_result)
    for n in range(500):
        job = f"i{n:05d}.req.json"
        (d / "claimed" / job).mkdir()
        (d / "claimed" / job / job).write_text(body)
        (d / "done" / f"c{n:05d}.req.json").write_text(body)
    wanted = {
        "pending": 3000,
        "claimed": 0,
        "done": 1000,
        "failed": 1000,
        "incomplete": 500,
        "conflict": 500,
        "ignored": 0,
    }
    report = ok(queue.run("status", "--json"), 1).json()
    assert report["counts"] == wanted, report["counts"]
    assert len(report["incomplete"]) == 500 and len(report["conflicts"]) == 500
    for state in STATES:
        got = ok(queue.run("list", "--state", state), 1 if state == "conflict" else 0)
        assert len(got.lines()) == wanted[state], (state, len(got.lines()))
    everything = ok(queue.run("list", "--json"), 1).json()
    assert len(everything) == 6000
    assert [i["name"] for i in everything] == sorted(i["name"] for i in everything)


def test_a_result_of_exactly_max_result_bytes_is_shown_whole(queue, live):
    """§2.1 (results limited by ``max_result_bytes``, 16 MiB by default), §2.4 (``show``: the
    result J holds): a result that ``finish`` stored at the limit to the byte is read by
    ``show`` whole, in text and JSON, and J is done."""
    limit = 16 * 1024 * 1024
    small = published_and_claimed(queue, "small", "--pid", str(live.pid))
    ok(queue.run("finish", small, "--ok", "-", input=json.dumps({"s": ""})), 0)
    overhead = (queue.dir / "done" / f"{small}.result").stat().st_size
    big = published_and_claimed(queue, "big", "--pid", str(live.pid))
    pad = "x" * (limit - overhead)
    ok(queue.run("finish", big, "--ok", "-", input=json.dumps({"s": pad})), 0)
    assert (queue.dir / "done" / f"{big}.result").stat().st_size == limit
    shown = ok(queue.run("show", big, "--json"), 0).json()
    assert shown["state"] == "done", shown["state"]
    assert shown["result"]["output"] == {"s": pad}
    assert [e["size"] for e in shown["evidence"] if e["path"].endswith(".result")] == [limit]
    text = ok(queue.run("show", big), 0)
    (line,) = [line for line in text.lines() if line.startswith("result: ")]
    assert json.loads(line.removeprefix("result: "))["output"] == {"s": pad}


# ---------------------------------------------------------------- times beyond the calendar


@pytest.fixture
def tmpfs_queue(_template: Path) -> Iterator[QueueCLI]:
    """Project ``proj``'s queue in a storage root on a tmpfs of its own, which keeps any
    64-bit file time (ext4 stops at year 2446)."""
    if os.geteuid() != 0:
        pytest.skip("mounts a tmpfs: needs root")
    disks = ScratchMounts(new_scratch_dir(SCRATCH, "m"))
    try:
        disk = disks.tmpfs("disk", "size=32m,mode=0755")
        root = copy_of_root(_template, disk / "storage")
        yield QueueCLI(root, PROJECT)
    finally:
        disks.close()


FAR_FUTURE = 253_402_300_800 + 86400  # 10000-01-02
FAR_PAST = -62_135_596_800 - 86400 * 400  # before 0001-01-01


def far_dated(q: QueueCLI) -> tuple[str, str]:
    """Two pending jobs dated past year 9999 and before year 1, and a temp of each."""
    future = q.publish(request(tag="future"), name="future")
    past = q.publish(request(tag="past"), name="past")
    for job, when in ((future, FAR_FUTURE), (past, FAR_PAST)):
        path = q.dir / "pending" / job
        set_mtime(path, when)
        if os.stat(path).st_mtime != when:
            pytest.skip("this filesystem does not keep such times")
    return future, past


def test_status_and_list_read_evidence_dated_beyond_years_1_to_9999(tmpfs_queue):
    """§2.4, Q-9: mtimes past year 9999 and before year 1, which a tmpfs keeps (``touch -d``,
    a restore): ``status`` counts both jobs pending, ``list --state pending`` puts the one
    from before year 1 first and the other last, as claims take them."""
    q = tmpfs_queue
    future, past = far_dated(q)
    now = q.publish(request(tag="now"), name="now")
    report = ok(q.run("status", "--json"), 0).json()
    assert report["counts"]["pending"] == 3, report
    assert ok(q.run("list", "--state", "pending"), 0).lines() == [past, now, future]
    assert ok(q.run("status"), 0).lines()[1].split() == ["pending", "3"]


def test_show_reads_evidence_dated_beyond_years_1_to_9999(tmpfs_queue):
    """§2.4 (``show``: every piece of evidence for J, with its mtime): a request whose mtime
    lies past year 9999 or before year 1 is shown like any other — its evidence listed,
    its request read, exit 0, in text and JSON — never a traceback."""
    q = tmpfs_queue
    future, past = far_dated(q)
    for job in (future, past):
        for fmt in (("--json",), ()):
            r = q.run("show", job, *fmt)
            assert TRACEBACK not in r.err, r
            assert r.rc == 0, r
        shown = q.run("show", job, "--json").json()
        assert [e["path"] for e in shown["evidence"]] == [f"pending/{job}"], shown
        assert shown["request"]["tag"] in ("future", "past"), shown
