"""The error branches of how a claim picks its job and how the queue is read, each reached from
outside through ``ctx queue claim``, ``publish``, ``recover``, ``status``, ``list`` and
``show`` (SPEC §2.1, §2.2 Q-2, Q-8, Q-9, Q-10, §2.4; docs/queue.md "What is not a job (Q-8)",
"Scale (Q-9, Q-10)", "Command line").

The angle: the claim order and the readers met with what a demanding user or an operator
leaves lying around.  The claim-order hint in the user's cache (``$XDG_CACHE_HOME/cortexfs/
claim-order/``) truncated, emptied, replaced by a symbolic link, a directory or a FIFO, made
immutable or append-only, taken from another queue, filled with names that are no jobs, twice
the same or long gone, grown to a terabyte (a sparse file), or kept on a cache that is
immutable, read-only or full; pending jobs removed while a claim lists them.  And the readers
over queues holding entries that vanish while they scan, requests and results no claim could
read (not UTF-8, a name given twice, nested too deep, too big, empty, a number JSON has no
spelling for), names in ``done/`` that are no jobs, filters no state answers to, queue paths
that are no queue, and state and job directories their own owner may not read.

docs/queue.md promises of the hint: "a hint, not evidence …, every name it offers is checked
against ``pending/``; losing it costs one listing", "The hints are private and do not pile
up", and that ``list --state pending`` names "the jobs in the order that user's next claims
take them".  Each check reads the exit status of §2.4, the errno word of the ``ctx: ERRNO:
sentence`` line (and of the ``--json`` error object), that the message names what is at fault
and the remedy where the documents promise one, that there is no traceback, and that nothing
is half-done: the queue as it was (or moved by exactly the claim made), nothing written
through a link, no temp file left in the cache, no job lost, claimed twice or left between two
states.  Where a message names a repair (``chmod``), the repair is run and the queue read
again."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    SUFFIX,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    snapshot,
)
from tests.support.scratch_mounts import ScratchMounts
from tests.support.storage import attribute, copy_of_root
from tests.support.users import find_or_create_user

SCRATCH = scratch_top(__file__)
TRACEBACK = "Traceback"
REQUEST = json.dumps({"tool": "fs.stat", "input": {"path": "/"}})
# A hint grown to a terabyte: sparse, so it costs the disk nothing, as a corrupted length or
# a stray ``truncate`` leaves one.
TERABYTE = 1 << 40
# Entries a reader lists and then classifies one by one: enough that entries removed from
# the far end of the listing while it works are ones it listed and has not reached yet.
MANY = 10_000


def j(stem: str) -> str:
    return stem if stem.endswith(SUFFIX) else stem + SUFFIX


def no_traceback(r: Run) -> None:
    assert TRACEBACK not in r.err and TRACEBACK not in r.out, r


def refused(r: Run, word: str, rc: int = 1) -> str:
    """The ``ctx: WORD: sentence`` line of a refusal with exit ``rc``; with ``--json`` the
    same error is the one object on stdout.  Returns the sentence."""
    no_traceback(r)
    assert r.rc == rc, r
    lines = [line for line in r.err.splitlines() if line.startswith("ctx: ")]
    assert lines and lines[-1].startswith(f"ctx: {word}: "), r
    if "--json" in r.argv:
        doc = json.loads(r.out)
        assert doc["error"] == word and doc["errno"] == getattr(errno, word), r
        assert doc["message"] == lines[-1][len(f"ctx: {word}: ") :], r
    return lines[-1][len(f"ctx: {word}: ") :]


# ----------------------------------------------------------------------------------- world


@dataclass
class World:
    """Project ``proj``'s queue in a fresh root, and root's claim-order cache of its own."""

    storage: Path
    cache: Path

    @property
    def dir(self) -> Path:
        return self.storage / "shared" / "proj" / "queue"

    @property
    def hints(self) -> Path:
        return self.cache / "cortexfs" / "claim-order"

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage), XDG_CACHE_HOME=str(self.cache))

    def run(self, command: str, *args: str, input: str = "", timeout: float = 60) -> Run:
        return ctx_run(
            "queue", command, "--project", "proj", *args, input=input, env=self.env,
            timeout=timeout,
        )  # fmt: skip

    def publish(self, stem: str) -> str:
        r = self.run("publish", "--name", stem, "-", input=REQUEST)
        assert r.rc == 0 and r.out == f"{j(stem)}\n", r
        return j(stem)

    def claim(self, holder: int, timeout: float = 60) -> Run:
        r = self.run("claim", "--pid", str(holder), "--ttl", "600", timeout=timeout)
        no_traceback(r)
        return r

    def claimed(self, holder: int) -> str:
        r = self.claim(holder)
        assert r.rc == 0 and r.err == "", r
        return r.out.strip()

    def pending_order(self) -> list[str]:
        """``list --state pending`` in text and ``--json``, which must agree."""
        text = self.run("list", "--state", "pending")
        as_json = self.run("list", "--state", "pending", "--json")
        no_traceback(text)
        no_traceback(as_json)
        assert text.rc == 0 and as_json.rc == 0, (text, as_json)
        assert [o["name"] for o in as_json.json()] == text.lines(), (text, as_json)
        return text.lines()

    def hint(self) -> Path:
        """This user's one hint for the queue: the cache file docs/queue.md places at
        ``claim-order/<hash of the queue path>``."""
        key = hashlib.sha256(os.fsencode(os.path.realpath(self.dir))).hexdigest()[:32]
        return self.hints / key

    def in_claimed(self) -> list[str]:
        return sorted(os.listdir(self.dir / "claimed"))

    def in_pending(self) -> list[str]:
        return sorted(os.listdir(self.dir / "pending"))


@pytest.fixture
def world(storage: Path, tmp_path: Path) -> World:
    """The queue with root's hint started, as for whoever has claimed there before: a claim
    on the empty queue lists ``pending/`` and writes the hint."""
    cache = tmp_path / "cache"
    cache.mkdir()
    made = World(storage, cache)
    r = made.claim(os.getpid())
    assert (r.rc, r.out) == (3, ""), r
    assert made.hint().is_file(), sorted(made.hints.iterdir())
    return made


@pytest.fixture
def three(world: World) -> list[str]:
    """Three jobs published one after the other, under names that sort the other way."""
    return [world.publish(stem) for stem in ("c-first", "b-second", "a-third")]


def take_all(world: World, holder: int, expected: list[str]) -> None:
    """Claims take exactly ``expected``, in that order, then find nothing (exit 3); each
    job is claimed once, and nothing is left pending."""
    taken = [world.claimed(holder) for _ in expected]
    assert taken == expected
    r = world.claim(holder)
    assert (r.rc, r.out) == (3, ""), r
    assert world.in_claimed() == sorted(expected)
    assert world.in_pending() == []


# ------------------------------------------------------------ a hint that is not what it was


@pytest.mark.parametrize("cut", [0, 50], ids=["emptied", "cut-in-its-header"])
def test_a_truncated_hint_costs_one_listing_and_is_written_anew(
    world: World, three: list[str], child, cut: int
) -> None:
    """docs/queue.md "Scale" (a hint found garbled "costs one listing", never a job): the
    hint cut to ``cut`` bytes, as a crash while it was written leaves it.  ``list --state
    pending`` still names the three jobs in publish order, the claims take them in that
    order, and the hint is a whole one again (its header and the queue's path back)."""
    os.truncate(world.hint(), cut)
    assert world.pending_order() == three
    take_all(world, child.pid, three)
    assert world.hint().stat().st_size > 128
    assert os.path.realpath(world.dir).encode() in world.hint().read_bytes()


def test_a_hint_cut_before_its_cursor_lists_again_and_skips_no_job(
    world: World, three: list[str], child
) -> None:
    """A hint whose names end before the place its next name should be (a copy cut short,
    a disk that lost the tail of the file): the next claim lists ``pending/`` again and
    takes the oldest job left, and none is skipped."""
    assert world.claimed(child.pid) == three[0]
    data = world.hint().read_bytes()
    queue_line_end = data.index(b"\n", 128) + 1
    world.hint().write_bytes(data[:queue_line_end])
    take_all_rest = [world.claimed(child.pid) for _ in three[1:]]
    assert take_all_rest == three[1:]
    assert world.in_claimed() == sorted(three)


def test_a_hint_replaced_by_a_symlink_is_never_followed(
    world: World, three: list[str], child, tmp_path: Path
) -> None:
    """docs/queue.md (the hint is private: written "never through a symlink"; a hint is
    "a hint, not evidence"): the hint replaced by a link to a file of the user's elsewhere.
    Claims, publishes and ``list --state pending`` work on (publish order kept), and the
    file the link names is never written, truncated or renamed over: byte for byte and
    inode for inode as it was, the link still a link."""
    target = tmp_path / "precious.txt"
    target.write_bytes(b"never to be touched\n" * 10)
    before = (target.read_bytes(), target.stat().st_ino, target.stat().st_mtime_ns)
    world.hint().unlink()
    world.hint().symlink_to(target)
    assert world.pending_order() == three
    fourth = world.publish("d-fourth")
    take_all(world, child.pid, [*three, fourth])
    assert (target.read_bytes(), target.stat().st_ino, target.stat().st_mtime_ns) == before
    assert world.hint().is_symlink() and os.readlink(world.hint()) == str(target)


@pytest.mark.parametrize("kind", ["directory", "FIFO"])
def test_a_hint_that_is_a_directory_or_a_fifo_never_stops_or_blocks_a_claim(
    world: World, three: list[str], child, kind: str
) -> None:
    """Q-8's spirit for the cache: something that is no file at the hint's name (a
    directory a script made, a FIFO) is not read as a hint.  A claim does not wait on the
    FIFO (it returns well within its timeout), claims take the jobs in publish order, and
    the entry is left as it is."""
    world.hint().unlink()
    if kind == "directory":
        world.hint().mkdir()
        (world.hint() / "keep").write_text("mine\n")
    else:
        os.mkfifo(world.hint())
    assert world.pending_order() == three
    taken = [world.claim(child.pid, timeout=20) for _ in three]
    assert [r.out.strip() for r in taken] == three, taken
    assert all(r.rc == 0 for r in taken), taken
    if kind == "directory":
        assert (world.hint() / "keep").read_text() == "mine\n"
    else:
        assert world.hint().is_fifo()


@pytest.mark.parametrize("letter", ["i", "a"], ids=["immutable", "append-only"])
def test_a_hint_pinned_by_chattr_leaves_claims_in_publish_order_and_is_left_alone(
    world: World, three: list[str], child, letter: str
) -> None:
    """A hint an operator pinned with ``chattr +i`` (or ``+a``) cannot be rewritten: it costs
    listings, never a job.  Publish, ``list --state pending`` and claims work (exit 0, no
    note) in publish order, and the hint is byte for byte what it was."""
    before = world.hint().read_bytes()
    with attribute(world.hint(), letter):
        fourth = world.publish("d-fourth")
        assert world.pending_order() == [*three, fourth]
        take_all(world, child.pid, [*three, fourth])
        assert world.hint().read_bytes() == before


def test_an_immutable_cache_directory_makes_nothing_and_claims_go_on(
    world: World, three: list[str], child
) -> None:
    """docs/queue.md ("losing it costs one listing"): the cache directory made immutable with
    no hint in it, so none can be made.  Claims take the jobs in publish order, and nothing
    appears in the directory (no hint, no temp file)."""
    world.hint().unlink()
    before = sorted(os.listdir(world.hints))
    with attribute(world.hints, "i"):
        take_all(world, child.pid, three)
        assert sorted(os.listdir(world.hints)) == before


def test_a_cache_place_that_is_a_file_never_stops_a_claim(
    storage: Path, tmp_path: Path, child
) -> None:
    """The cache's ``cortexfs/claim-order`` is a regular file of the user's: no hint can be
    kept, and claims go on in publish order; the file is left byte for byte."""
    cache = tmp_path / "cache"
    (cache / "cortexfs").mkdir(parents=True)
    (cache / "cortexfs" / "claim-order").write_text("not a directory\n")
    world = World(storage, cache)
    jobs = [world.publish(stem) for stem in ("z1", "y2", "x3")]
    assert world.pending_order() == jobs
    take_all(world, child.pid, jobs)
    assert (cache / "cortexfs" / "claim-order").read_text() == "not a directory\n"


def test_a_read_only_cache_changes_nothing_and_claims_go_on(
    world: World, three: list[str], child
) -> None:
    """The cache directory on a read-only bind mount (a home mounted read-only): nothing in it
    changes, and claims and ``list --state pending`` work in publish order."""
    mounts = ScratchMounts(new_scratch_dir(SCRATCH, "ro-cache-"))
    try:
        mounts.bind_self(world.cache, "ro")
        before = snapshot(world.cache)
        assert world.pending_order() == three
        take_all(world, child.pid, three)
        assert snapshot(world.cache) == before
    finally:
        for path in reversed(list(mounts.mounted)):
            mounts.unmount(path)
        shutil.rmtree(mounts.top, ignore_errors=True)


def test_a_full_cache_filesystem_leaves_no_temp_file_behind(
    storage: Path, child, tmp_path: Path
) -> None:
    """docs/queue.md ("The hints are private and do not pile up"; losing a hint costs one
    listing): the user's cache on a filesystem that is full.  Claims take the jobs in
    publish order (exit 0, no note), and the cache holds no file the claims left: a claim
    that could not write its hint leaves no half-written temp file for every claim made."""
    mounts = ScratchMounts(new_scratch_dir(SCRATCH, "full-cache-"))
    try:
        cache = mounts.tmpfs("cache", "size=64k,mode=0700")
        fill = os.open(cache / "fill", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fill, b"x" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fill)
        world = World(storage, cache)
        jobs = [world.publish(stem) for stem in ("one", "two", "three")]
        take_all(world, child.pid, jobs)
        left = [
            str(Path(d, f).relative_to(cache))
            for d, _, files in os.walk(cache)
            for f in files
            if f != "fill"
        ]
        assert left == [], left
    finally:
        for path in reversed(list(mounts.mounted)):
            mounts.unmount(path)
        shutil.rmtree(mounts.top, ignore_errors=True)


def test_a_hint_copied_from_another_queue_never_hands_out_its_names(
    world: World, child, tmp_path: Path
) -> None:
    """A hint taken from another queue (a restored cache, a copied home): its names are no
    jobs of this queue.  Claims take only this queue's jobs, in publish order, then find
    nothing (exit 3) though the hint still names the other queue's jobs; the other queue is
    left as it was."""
    other = World(copy_of_root(world.storage, tmp_path / "other"), world.cache)
    r = other.claim(os.getpid())
    assert (r.rc, r.out) == (3, ""), r
    theirs = [other.publish(stem) for stem in ("alpha", "beta", "gamma")]
    other_before = snapshot(other.dir)
    ours = [world.publish(stem) for stem in ("mine-1", "mine-2")]
    shutil.copyfile(other.hint(), world.hint())
    assert world.pending_order() == ours
    take_all(world, child.pid, ours)
    assert snapshot(other.dir) == other_before
    assert sorted(os.listdir(other.dir / "pending")) == sorted(theirs)


def test_a_hint_naming_junk_twice_and_gone_jobs_lists_and_hands_each_job_once(
    world: World, three: list[str], child
) -> None:
    """docs/queue.md: "The hint is a hint: a name in it twice counts once", every name it
    offers is checked against ``pending/``, and ``list --state pending`` names the jobs in
    the order the next claims take them.  The hint's names (it still accounts for
    ``pending/`` as it stands) replaced by a name twice, a path, bytes that are no text, a
    job that is not pending, a name too long, and the others.  ``list --state pending``
    gives each pending job once in the hint's order, the claims take exactly that order,
    and nothing but the three jobs is ever claimed."""
    first, second, third = three
    data = world.hint().read_bytes()
    queue_line_end = data.index(b"\n", 128) + 1
    body = b"".join(
        name + b"\n"
        for name in (
            third.encode(),
            third.encode(),
            b"../../escape.req.json",
            b"\xff\xfe.req.json",
            b"gone.req.json",
            first.encode(),
            b"x" * 200 + b".req.json",
        )
    )
    world.hint().write_bytes(data[:queue_line_end] + body)
    expected = [third, first, second]
    assert world.pending_order() == expected
    taken = []
    for _ in expected:
        taken.append(world.claimed(child.pid))
        assert world.pending_order() == [n for n in expected if n not in taken]
    assert taken == expected
    r = world.claim(child.pid)
    assert (r.rc, r.out) == (3, ""), r
    assert world.in_claimed() == sorted(three)


def test_list_pending_over_a_hint_grown_to_a_terabyte_lists_the_jobs(
    world: World, three: list[str]
) -> None:
    """docs/queue.md: ``list --state pending`` reads this user's hint when it accounts for
    ``pending/`` as it stands; the hint is a hint, and one found garbled costs a listing.
    The hint grown to a terabyte of zeros after its names (sparse): ``list --state
    pending`` still names the three jobs in publish order, exit 0, no ENOMEM."""
    os.truncate(world.hint(), TERABYTE)
    r = world.run("list", "--state", "pending")
    no_traceback(r)
    assert (r.rc, r.lines(), r.err) == (0, three, ""), r


def test_recover_while_the_hint_is_a_terabyte_requeues_the_job_wholly(
    world: World, three: list[str], tmp_path: Path
) -> None:
    """Q-5, Q-7, I-5 (a requeue is whole or not at all) and docs/queue.md (recover puts the
    job it moves back first in line in this user's hint; the hint is never evidence and any
    trouble with it costs a listing): a job claimed by another user of the host (so this
    user's hint has no room before its cursor) for a holder that is gone, and this user's
    hint a sparse terabyte.  ``recover`` requeues it (exit 0): the request in ``pending/``,
    no ``claimed/J``, no ``lease/J``; and the next claim takes it first."""
    someone = World(world.storage, tmp_path / "someone-cache")
    someone.cache.mkdir()
    r = someone.run("claim", "--pid", str(2**22), "--ttl", "600")
    assert r.rc == 0 and r.out == f"{three[0]}\n", r
    os.truncate(world.hint(), TERABYTE)
    r = world.run("recover")
    no_traceback(r)
    assert r.rc == 0 and f"requeue  {three[0]}" in r.out, r
    assert world.in_pending() == sorted(three)
    assert world.in_claimed() == [] and os.listdir(world.dir / "lease") == []


def test_a_claim_whose_pending_jobs_vanish_while_it_lists_claims_one_that_was_there(
    world: World, child
) -> None:
    """Q-2, Q-9, docs/queue.md ("every listing is complete, and every name handed out is
    checked against ``pending/``"): thousands of requests put in ``pending/`` by hand (a
    change the hint was not told of, so the claim lists), then removed by hand, from the far
    end of the listing, while the claim runs.  The claim takes one job that was still there
    (exit 0) or finds nothing (exit 3); never a traceback, never a job claimed that was
    removed, and every job is either removed or claimed or still pending."""
    names = [j(f"bulk{n:05d}") for n in range(2000)]
    for name in names:
        (world.dir / "pending" / name).write_text(REQUEST)
    order = os.listdir(world.dir / "pending")
    removed: list[str] = []
    proc = subprocess.Popen(
        [*CTX_ARGV, "queue", "claim", "--project", "proj", "--pid", str(child.pid)],
        env=world.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    for name in reversed(order):
        try:
            (world.dir / "pending" / name).unlink()
        except FileNotFoundError:
            continue
        removed.append(name)
    out, err = proc.communicate(timeout=60)
    said = Run(["queue", "claim"], proc.returncode, out.decode(), err.decode())
    no_traceback(said)
    assert said.rc in (0, 3), said
    claimed = [n for n in world.in_claimed() if (world.dir / "claimed" / n / n).is_file()]
    if said.rc == 0:
        assert claimed == [said.out.strip()] and claimed[0] not in removed, said
    else:
        assert claimed == [] and said.out == "", said
    assert sorted(removed + claimed + world.in_pending()) == sorted(names)


# ----------------------------------------------------------------- readers while things move


def opened(pid: int, directory: Path) -> bool:
    """Whether process ``pid`` has ``directory`` open."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == str(directory):
                return True
        except OSError:
            continue
    return False


def vanishing_under(world: World, directory: Path, names: list[str], *argv: str) -> Run:
    """``ctx queue ARGV`` run while the entries ``names`` of ``directory`` are removed, from
    the far end of the directory's own order, as the reader works: entries it listed and has
    not looked at yet are gone when it looks."""
    wanted = set(names)
    order = [n for n in os.listdir(directory) if n in wanted]
    proc = subprocess.Popen(
        [*CTX_ARGV, "queue", *argv, "--project", "proj"],
        env=world.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )

    def remove() -> None:
        for name in reversed(order):
            os.unlink(directory / name)

    # Removal starts once the reader has the directory open (it lists it right after).
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline and not opened(proc.pid, directory):
        time.sleep(0.001)
    remover = threading.Thread(target=remove)
    remover.start()
    out, err = proc.communicate(timeout=120)
    remover.join()
    return Run(list(argv), proc.returncode, out.decode(), err.decode())


def test_status_while_entries_of_pending_vanish_still_reports_the_queue(world: World) -> None:
    """docs/queue.md "Command line" (``status``, ``list`` and ``show`` read the queue without
    its locks, so what they find may be at work): FIFOs at job names in ``pending/`` (Q-8:
    listed as ignored) removed while ``status --json`` scans.  ``status`` reports the queue
    (exit 0), counting as ignored at most the FIFOs still there, never failing with ENOENT
    on a bare name."""
    names = [j(f"f{n}") for n in range(MANY)]
    for name in names:
        os.mkfifo(world.dir / "pending" / name)
    keep = world.publish("stays")
    r = vanishing_under(world, world.dir / "pending", names, "status", "--json")
    no_traceback(r)
    assert r.rc == 0, r
    doc = r.json()
    assert doc["pending"] == 1 and doc["counts"]["ignored"] <= MANY, doc
    assert world.in_pending() == [keep]


def test_list_while_staging_entries_vanish_still_lists_the_jobs(world: World) -> None:
    """docs/queue.md "What is not a job" (an entry at a staging name that is no regular file
    is a stray temp ``recover --reconcile`` unlinks) and "Command line" (readers run beside
    the writers): FIFOs at staging names in ``inbox/``, removed while ``list --json`` reads
    the queue, as a ``recover --reconcile`` beside it removes them.  ``list`` lists the one
    pending job (exit 0)."""
    names = [f"t{n}{SUFFIX}.publish.tmp" for n in range(MANY)]
    for name in names:
        os.mkfifo(world.dir / "inbox" / name)
    keep = world.publish("stays")
    r = vanishing_under(world, world.dir / "inbox", names, "list", "--json")
    no_traceback(r)
    assert r.rc == 0, r
    assert r.json() == [{"name": keep, "state": "pending"}], r


# ------------------------------------------------------------- documents no claim could read


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b'{"tool": "fs.stat", "input": {"p": "\xff"}}', "utf-8"),
        (b'{"tool": "a", "tool": "b"}', "gives the name 'tool' twice"),
        (b"[" * 5000 + b"]" * 5000, "nested deeper than"),
        (b" " * (2 * 1024 * 1024) + b"{}", "EFBIG"),
        (b"", "Expecting value"),
    ],
    ids=["not-utf8", "a-name-twice", "nested-deep", "over-the-limit", "empty"],
)
def test_show_of_a_request_no_claim_could_read_says_why_and_changes_nothing(
    world: World, content: bytes, says: str
) -> None:
    """docs/queue.md "Command line" (``show --json`` prints the ``request`` J holds) and
    §2.1 (a request is one JSON object, UTF-8, within the size limit): a request put in
    ``pending/`` by hand that no claim could read.  ``show`` exits 0 with J pending and its
    ``request`` an object ``{"unreadable": WHY}`` that says what is wrong; ``status`` counts
    it pending; nothing in the queue changes."""
    job = j("odd")
    (world.dir / "pending" / job).write_bytes(content)
    before = snapshot(world.dir)
    r = world.run("show", job, "--json")
    no_traceback(r)
    assert r.rc == 0, r
    doc = r.json()
    assert doc["state"] == "pending" and set(doc["request"]) == {"unreadable"}, doc
    assert says in doc["request"]["unreadable"], doc
    text = world.run("show", job)
    assert text.rc == 0 and "request: " in text.out and "unreadable" in text.out, text
    status = world.run("status", "--json")
    assert status.rc == 0 and status.json()["pending"] == 1, status
    assert snapshot(world.dir) == before


@pytest.mark.parametrize("where", ["request", "result"])
def test_show_of_a_document_holding_nan_says_what_the_number_is(world: World, where: str) -> None:
    """docs/queue.md ("Command line": ``show --json`` prints the ``request`` and ``result``
    J holds) and §2.1 (a request and a result are JSON objects): a request in ``pending/``,
    or a finished job's result, put there by hand holding ``NaN`` / ``Infinity``, which no
    JSON reader takes and publish refuses in so many words.  ``show`` calls the document
    unreadable with a sentence that names the number and says JSON has none for it, as
    publish does, not the bare word."""
    job = j("nan")
    if where == "request":
        (world.dir / "pending" / job).write_text('{"tool": "fs.stat", "input": {"n": NaN}}')
        word = "NaN"
    else:
        (world.dir / "done" / job).write_text(REQUEST)
        (world.dir / "done" / f"{job}.result").write_text('{"status": "ok", "output": Infinity}')
        word = "Infinity"
    published = world.run("publish", "-", input='{"tool": "fs.stat", "n": NaN}')
    refused(published, "EINVAL")
    r = world.run("show", job, "--json")
    no_traceback(r)
    assert r.rc == 0, r
    why = r.json()[where]["unreadable"]
    assert word in why and "JSON" in why and why != word, why


# ------------------------------------------------------------------------ names and filters


def test_names_in_done_and_failed_that_are_no_jobs_say_what_is_wrong(world: World) -> None:
    """Q-8 (``status`` lists what is not a job as ``ignored`` with the reason; it is never
    moved): entries of ``done/`` and ``failed/`` whose names are no job's request or result
    — a character a name may not hold, a dot-file, a result of no ``.req.json`` name, a
    result's result.  ``status`` lists each as ignored with the reason that applies to it,
    counts no job, exits 0; ``list`` lists nothing; nothing moves."""
    entries = {
        "done/bad!.req.json": "holds '!'",
        "done/bad!.req.json.result": "holds '!'",
        "done/.hidden.req.json.result": "dot-file",
        "failed/notes.result": "does not end in '.req.json'",
        "failed/x.req.json.result.result": "does not end in '.req.json'",
    }
    for path in entries:
        (world.dir / path).write_text("{}")
    before = snapshot(world.dir)
    r = world.run("status", "--json")
    no_traceback(r)
    assert r.rc == 0, r
    doc = r.json()
    reasons = {i["path"]: i["reason"] for i in doc["ignored"]}
    assert set(reasons) == set(entries), doc
    for path, says in entries.items():
        assert says in reasons[path], (path, reasons[path])
    assert doc["done"] == doc["failed"] == doc["conflict"] == 0, doc
    listed = world.run("list", "--json")
    assert listed.rc == 0 and listed.json() == [], listed
    assert snapshot(world.dir) == before


@pytest.mark.parametrize("value", ["bogus", "PENDING", "", "ignored"])
def test_a_state_filter_no_state_answers_to_is_a_usage_error(world: World, value: str) -> None:
    """§2.4 (exit 2 for a usage error; with ``--json`` the error is also one object on
    stdout, a malformed command line included) and ``ctx queue list --help`` (``--state``
    is one of the six states): ``--state`` given a value that is none of them — an unknown
    word, the right word in capitals, nothing, and ``ignored`` (a status list, not a
    state).  ``list`` exits 2 with EINVAL naming the value and the six states, in text and
    as the ``--json`` error object."""
    for args in (("--state", value), ("--state", value, "--json")):
        r = world.run("list", *args)
        sentence = refused(r, "EINVAL", rc=2)
        assert repr(value) in sentence, r
        for state in ("pending", "claimed", "done", "failed", "incomplete", "conflict"):
            assert state in sentence, r


# ------------------------------------------------------------------ a queue that is not one


@pytest.mark.parametrize("what", ["symlink", "FIFO", "empty directory", "missing"])
def test_readers_given_a_queue_path_that_is_no_queue_say_what_it_is(
    storage: Path, tmp_path: Path, what: str
) -> None:
    """docs/queue.md "What is not a job" (a queue named by a path outside the storage root is
    opened as named, refusing a symlink at its last component) and "Command line": a
    ``--queue`` path that is a link to a real queue (ELOOP), a FIFO (ENOTDIR), an empty
    directory (ENOENT, naming ``inbox/`` and the ``ctx queue init`` that makes it), or
    nothing (ENOENT, naming the init that creates it).  Each reader exits 1 with that errno,
    in text and ``--json``, naming the path; nothing is made, nothing followed."""
    env = clean_env(CTX_STORAGE=str(storage))
    place = tmp_path / "elsewhere"
    place.mkdir()
    real = place / "real"
    made = ctx_run("queue", "init", "--queue", real, env=env)
    assert made.rc == 0, made
    queue = place / "q"
    word = {"symlink": "ELOOP", "FIFO": "ENOTDIR", "empty directory": "ENOENT"}.get(what, "ENOENT")
    if what == "symlink":
        queue.symlink_to(real)
    elif what == "FIFO":
        os.mkfifo(queue)
    elif what == "empty directory":
        queue.mkdir()
    before = snapshot(place)
    for command in (["status"], ["list", "--json"], ["show", "some", "--json"], ["show", "x"]):
        r = ctx_run("queue", command[0], "--queue", queue, *command[1:], env=env)
        sentence = refused(r, word)
        assert str(queue) in sentence, r
        if what in ("empty directory", "missing"):
            assert f"ctx queue init --queue {queue}" in sentence, r
        if what == "empty directory":
            assert "inbox/" in sentence, r
    assert snapshot(place) == before


# ------------------------------------------------------------------- a second uid, its modes


@dataclass
class Owned:
    """A queue outside any storage root made and used by an ordinary user (its owner)."""

    uid: int
    gid: int
    home: Path

    @property
    def dir(self) -> Path:
        return self.home / "q"

    def run(self, command: str, *args: str, input: str = "") -> Run:
        argv = [*CTX_ARGV, "queue", command, "--queue", str(self.dir), *args]
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self.home),
            "XDG_CACHE_HOME": str(self.home / "cache"),
            "CTX_STORAGE": str(self.home / "storage"),
        }
        done = subprocess.run(
            argv,
            input=input.encode(),
            capture_output=True,
            env=env,
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            timeout=60,
        )
        return Run(
            ["queue", command, *args],
            done.returncode,
            done.stdout.decode("utf-8", "replace"),
            done.stderr.decode("utf-8", "replace"),
        )


@pytest.fixture
def owned() -> Iterator[Owned]:
    """The test user's own queue, with two jobs published by that user."""
    user = find_or_create_user()
    home = new_scratch_dir(SCRATCH, "owner-")
    os.chown(home, user.uid, user.gid)
    made = Owned(user.uid, user.gid, home)
    r = made.run("init")
    assert r.rc == 0, r
    for stem in ("first", "second"):
        r = made.run("publish", "--name", stem, "-", input=REQUEST)
        assert r.rc == 0, r
    try:
        yield made
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(home)], check=False)
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize("state", ["pending", "claimed"])
def test_a_state_directory_its_owner_may_not_read_is_named_until_chmod_repairs_it(
    owned: Owned, state: str
) -> None:
    """docs/queue.md "Command line" (errors are ``ctx: ERRNO: sentence``): the queue's owner
    took the read bit off its own ``pending/`` (or ``claimed/``).  ``status``, ``list``,
    ``show`` and ``claim`` refuse with EACCES (exit 1, text and ``--json``), naming the
    directory, its mode and the ``chmod u+r`` that repairs it; nothing is claimed.  After
    that chmod, ``status`` counts the two jobs pending."""
    target = owned.dir / state
    os.chmod(target, 0o330)
    before = snapshot(owned.dir)
    for command in (["status", "--json"], ["list"], ["show", j("first"), "--json"]):
        sentence = refused(owned.run(*command), "EACCES")
        assert str(target) in sentence and "mode 0330" in sentence, sentence
        assert "chmod u+r" in sentence, sentence
    sentence = refused(owned.run("claim", "--pid", "1"), "EACCES")
    assert str(target) in sentence, sentence
    assert snapshot(owned.dir) == before
    subprocess.run(["chmod", "u+r", str(target)], check=True)
    r = owned.run("status", "--json")
    assert r.rc == 0 and r.json()["pending"] == 2, r


def test_a_claim_directory_its_owner_may_not_read_is_a_conflict_everywhere(
    owned: Owned,
) -> None:
    """Q-6, Q-8 and docs/queue.md "What is not a job" (``claimed/J`` that "cannot be read"
    makes J a conflict for ``status``, ``show`` and ``recover`` alike): J claimed, its
    ``claimed/J`` then closed to its own owner (mode 0300).  ``status`` (exit 1) lists J
    among the conflicts and ``claimed/J`` among the ignored as "cannot be read: EACCES";
    ``list`` and ``show J`` call J a conflict (exit 1); ``recover`` leaves it; nothing moves.
    After ``chmod u+r`` J is claimed again, exit 0."""
    holder = subprocess.Popen(["sleep", "600"], user=owned.uid, group=owned.gid)
    try:
        r = owned.run("claim", "--pid", str(holder.pid), "--ttl", "600")
        assert r.rc == 0, r
        job = r.out.strip()
        claim_dir = owned.dir / "claimed" / job
        os.chmod(claim_dir, 0o300)
        before = snapshot(owned.dir)
        status = owned.run("status", "--json")
        no_traceback(status)
        assert status.rc == 1, status
        doc = status.json()
        assert [c["job"] for c in doc["conflicts"]] == [job], doc
        ignored = {i["path"]: i["reason"] for i in doc["ignored"]}
        assert "EACCES" in ignored.get(f"claimed/{job}", ""), doc
        listed = owned.run("list", "--json")
        assert listed.rc == 1 and {"name": job, "state": "conflict"} in listed.json(), listed
        shown = owned.run("show", job, "--json")
        assert shown.rc == 1 and shown.json()["state"] == "conflict", shown
        recover = owned.run("recover", "--reconcile", "--json")
        no_traceback(recover)
        assert recover.rc == 1 and recover.json()["requeued"] == [], recover
        assert snapshot(owned.dir) == before
        subprocess.run(["chmod", "u+r", str(claim_dir)], check=True)
        shown = owned.run("show", job, "--json")
        assert shown.rc == 0 and shown.json()["state"] == "claimed", shown
    finally:
        holder.kill()
        holder.wait()


def test_show_of_a_request_its_reader_may_not_read_says_eacces(owned: Owned) -> None:
    """docs/queue.md "Command line" (``show`` prints the request J holds): the owner took
    every bit off one pending request.  ``show`` exits 0 with J pending, its evidence
    listed, and ``request`` ``{"unreadable": …}`` naming EACCES; ``status`` still counts
    both jobs pending; nothing changes."""
    job = j("first")
    os.chmod(owned.dir / "pending" / job, 0)
    before = snapshot(owned.dir)
    r = owned.run("show", job, "--json")
    no_traceback(r)
    assert r.rc == 0, r
    doc = r.json()
    assert doc["state"] == "pending" and "EACCES" in doc["request"]["unreadable"], doc
    assert [e["path"] for e in doc["evidence"]] == [f"pending/{job}"], doc
    status = owned.run("status", "--json")
    assert status.rc == 0 and status.json()["pending"] == 2, status
    assert snapshot(owned.dir) == before


def test_the_owner_claims_in_publish_order_with_a_hint_it_may_not_write(owned: Owned) -> None:
    """docs/queue.md "Scale" (a hint lost or unusable costs a listing): the owner's hint made
    read-only to it (mode 0400, as a restore from a backup leaves it).  The owner's claims
    take the two jobs in publish order and then find nothing (exit 3); the hint is left as
    it was."""
    hints = owned.home / "cache" / "cortexfs" / "claim-order"
    found = [p for p in hints.iterdir() if not p.name.startswith(".")]
    assert len(found) == 1, found
    hint = found[0]
    os.chmod(hint, 0o400)
    before = hint.read_bytes()
    holder = subprocess.Popen(["sleep", "600"], user=owned.uid, group=owned.gid)
    try:
        taken = []
        for _ in range(2):
            r = owned.run("claim", "--pid", str(holder.pid), "--ttl", "600")
            no_traceback(r)
            assert r.rc == 0, r
            taken.append(r.out.strip())
        assert taken == [j("first"), j("second")]
        r = owned.run("claim", "--pid", str(holder.pid))
        assert (r.rc, r.out) == (3, ""), r
    finally:
        holder.kill()
        holder.wait()
    assert hint.read_bytes() == before


def test_pending_order_of_the_readers_survives_time_going_backwards(world: World, child) -> None:
    """Q-9 (oldest first by publish time, name as tie-break): requests dropped by hand with
    publish times before 1970 and far in the future (a restore, a clock set wrong).
    ``list --state pending`` orders them by that time, and claims take that order."""
    stamps = {"late": 4_000_000_000, "early": -100_000_000, "middle": 1_000_000_000}
    for stem, seconds in stamps.items():
        path = world.dir / "pending" / j(stem)
        path.write_text(REQUEST)
        os.utime(path, (seconds, seconds))
    expected = [j("early"), j("middle"), j("late")]
    assert world.pending_order() == expected
    assert [world.claimed(child.pid) for _ in expected] == expected


def test_status_while_a_claim_takes_from_a_long_queue_counts_every_job_once(
    world: World, child
) -> None:
    """§2.4 (``status`` counts per state) read while claims move jobs (docs/queue.md: the
    readers run without the queue's locks): 200 jobs, a claimer taking them one by one, and
    ``status --json`` run meanwhile.  Every reading adds up to the 200 jobs (pending plus
    claimed), none is counted twice or reported incomplete or a conflict, and every reading
    exits 0."""
    lines = "".join(json.dumps({"tool": "fs.stat", "input": {"n": n}}) + "\n" for n in range(200))
    r = world.run("publish", "--batch", "-", input=lines)
    assert r.rc == 0 and len(r.lines()) == 200, r
    stop = threading.Event()

    def claim_on() -> None:
        while not stop.is_set():
            got = world.claim(child.pid)
            if got.rc != 0:
                break

    claimer = threading.Thread(target=claim_on)
    claimer.start()
    try:
        readings = []
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and claimer.is_alive():
            readings.append(world.run("status", "--json"))
    finally:
        stop.set()
        claimer.join(60)
    assert readings
    for reading in readings:
        no_traceback(reading)
        assert reading.rc == 0, reading
        doc = reading.json()
        assert doc["pending"] + doc["claimed"] == 200, doc
        assert doc["incomplete"] == [] and doc["conflicts"] == [], doc
