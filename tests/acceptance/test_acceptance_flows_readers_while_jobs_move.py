"""Readers of a busy queue (SPEC §2.1, §2.4, Q-2..Q-6, Q-8, I-1, I-3, I-5; docs/queue.md
"Command line": "status, list and show read the queue without its locks ... never a claim
without its lease", and the exit statuses of status, list, show and recover --dry-run).

Real processes move the jobs of ``shared/<project>/queue`` for a few seconds: a shell that
claims, renews and finishes (``--ok`` and ``--error``), ``ctx queue work`` workers, holders
SIGKILLed while they hold a job, ``ctx queue recover`` and ``recover --reconcile`` run by
others, and ``publish --batch``.  Meanwhile other processes read the queue again and again:
``ctx queue status``, ``list`` (with and without ``--state``), ``show J`` and ``recover
--dry-run``, each in text and with ``--json``; as root and as a member of the queue's group
who is not root.

Every reading must be one state each job really was in (§2.1): never a mix, never a job
twice, never a claimed job without its lease in ``show``, never "incomplete" or "conflict"
for a job only a live process is moving (status, list, show); counts add up to the jobs
published; exit statuses are those of §2.4; no traceback; no job is seen going backwards
(done or failed, then anything else: I-3); once all settles nothing is left behind (I-5); and
the readers change nothing on disk."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    age,
    new_scratch_dir,
    request,
    scratch_top,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, members_of

SCRATCH = scratch_top(__file__)
TRACEBACK = "Traceback (most recent call last)"
STATES = ("pending", "claimed", "done", "failed")
TERMINAL = ("done", "failed")
ERROR_LINE = re.compile(r"ctx: (?:[A-Z][A-Z0-9]+|note|warning): \S")
CHURN = 2.0  # seconds the movers run at least, while the readers read
MEMBER, GROUP = "ctxrwjm-r", "ctxrwjm-g"

# ------------------------------------------------------------------------------ helpers


@dataclass(repr=False)
class Done:
    """What one ``ctx`` command did, and when (monotonic clock, before start and after exit)."""

    argv: list[str]
    rc: int
    out: str
    err: str
    start: float = 0.0
    end: float = 0.0

    def __repr__(self) -> str:
        command = " ".join(self.argv)
        return f"$ {command}\nexit {self.rc}\nstdout: {self.out[:3000]!r}\nstderr: {self.err!r}"

    def json(self):
        return json.loads(self.out)


@dataclass
class World:
    """A storage root under this file's scratch directory, and the project whose queue the
    tests work."""

    top: Path
    storage: Path
    project: str
    member: UnprivilegedUser | None = None

    @property
    def queue(self) -> Path:
        return self.storage / "shared" / self.project / "queue"

    def env(self, who: UnprivilegedUser | None = None) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("CTX_", "XDG_")) and k != "HOME"
        }
        name = "root" if who is None else who.name
        env.update(
            CTX_STORAGE=str(self.storage),
            HOME="/nonexistent",
            XDG_CACHE_HOME=str(self.top / f"cache-{name}"),
        )
        return env

    def popen_args(self, who: UnprivilegedUser | None) -> dict:
        if who is None:
            return {}
        return {"user": who.uid, "group": who.gid, "extra_groups": who.groups}

    def ctx(self, verb: str, *args: str, who: UnprivilegedUser | None = None, stdin: str = "",
            timeout: float = 60) -> Done:  # fmt: skip
        """``ctx queue VERB --project P ARGS`` as ``who`` (None: root)."""
        argv = [*CTX_ARGV, "queue", verb, "--project", self.project, *args]
        start = time.monotonic()
        ids = self.popen_args(who)
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, cwd="/",
                              env=self.env(who), timeout=timeout, **ids)  # fmt: skip
        end = time.monotonic()
        return Done(["ctx", *argv[len(CTX_ARGV) :]], proc.returncode, proc.stdout, proc.stderr,
                    start, end)  # fmt: skip

    def publish(self, name: str | None = None, **extra) -> str:
        args = ("--name", name) if name else ()
        done = self.ctx("publish", *args, "-", stdin=json.dumps(request(**extra)))
        assert done.rc == 0, done
        return done.out.strip()

    def publish_batch(self, count: int, **extra) -> list[str]:
        lines = "".join(json.dumps(request(line=n, **extra)) + "\n" for n in range(count))
        done = self.ctx("publish", "--batch", "-", stdin=lines)
        names = done.out.split()
        assert done.rc == 0 and len(set(names)) == count, done
        return names

    def jobs_on_disk(self) -> dict[str, list[str]]:
        """Every job name with the states its request is in (``claimed`` for ``claimed/J/J``)."""
        seen: dict[str, list[str]] = {}
        for state in ("pending", *TERMINAL):
            for name in os.listdir(self.queue / state):
                if not name.endswith(".result"):
                    seen.setdefault(name, []).append(state)
        for name in os.listdir(self.queue / "claimed"):
            if (self.queue / "claimed" / name / name).is_file():
                seen.setdefault(name, []).append("claimed")
        return seen


def make_world(template: Path, project: str = "proj", group: str | None = None) -> World:
    """A copy of the bootstrapped root under the scratch directory (every uid may reach it);
    with ``group``, the space ``project`` made by ``ctx shared create --group``."""
    top = new_scratch_dir(SCRATCH)
    storage = copy_of_root(template, top / "storage")
    for entry in (storage, *storage.iterdir()):
        entry.chmod(0o755)
    world = World(top, storage, project)
    (top / "cache-root").mkdir(mode=0o700)
    if group is not None:
        made = subprocess.run([*CTX_ARGV, "shared", "create", project, "--group", group],
                              capture_output=True, text=True, env=world.env(), cwd="/",
                              timeout=60)  # fmt: skip
        assert made.returncode == 0, made
    return world


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    """The queue of project ``proj`` (made by ``ctx queue init``), root's to work."""
    w = make_world(_template)
    yield w
    shutil.rmtree(w.top, ignore_errors=True)


@pytest.fixture(scope="module")
def member() -> UnprivilegedUser:
    (user,), _gid = members_of(GROUP, MEMBER)
    return user


@pytest.fixture
def team(_template: Path, member: UnprivilegedUser) -> Iterator[World]:
    """The queue of space ``team`` made by ``ctx shared create --group G``, whose member
    ``member`` is not root; root works it too."""
    w = make_world(_template, "team", GROUP)
    w.member = member
    cache = w.top / f"cache-{member.name}"
    cache.mkdir(mode=0o700)
    os.chown(cache, member.uid, member.gid)
    yield w
    shutil.rmtree(w.top, ignore_errors=True)


def said_properly(run: Done, allowed: Sequence[int]) -> list[str]:
    """§2.4: an exit status of ``allowed``, no traceback, every line on stderr a ``ctx:``
    line.  The problems found (none when all is well)."""
    problems = []
    if TRACEBACK in run.err or TRACEBACK in run.out:
        problems.append(f"traceback: {run!r}")
    if run.rc not in allowed:
        problems.append(f"exit {run.rc}, not one of {list(allowed)}: {run!r}")
    if not all(ERROR_LINE.match(line) for line in run.err.splitlines()):
        problems.append(f"stderr not made of ctx: lines: {run!r}")
    return problems


# ------------------------------------------------------------------------------ movers

# Shell loops run until the file $STOP exists; whatever goes against the protocol's promises
# is written as a FAIL line on stderr.  $CTX is the ctx command, $P the project.
CLAIM_AND_FINISH = r"""
i=0
while [ ! -e "$STOP" ]; do
    j=$("$CTX" queue claim --project "$P" --ttl 120 --worker finisher); rc=$?
    if [ $rc -eq 3 ]; then sleep 0.05; continue; fi
    if [ $rc -ne 0 ]; then echo "FAIL claim exit $rc" >&2; sleep 0.05; continue; fi
    "$CTX" queue renew --project "$P" "$j" --ttl 120 >/dev/null || echo "FAIL renew $j" >&2
    sleep 0.05
    i=$((i + 1))
    if [ $((i % 2)) -eq 0 ]; then flag=--ok; else flag=--error; fi
    echo '{"round": '$i'}' | "$CTX" queue finish --project "$P" "$j" $flag - >/dev/null \
        || echo "FAIL finish $j $flag" >&2
    sleep 0.1
done
"""

# A holder that takes a job and is SIGKILLed while it holds it (the claim names it with
# --pid); the job stays claimed under a dead holder until someone's recover requeues it.
KILLED_HOLDER = r"""
while [ ! -e "$STOP" ]; do
    sleep 300 & h=$!
    j=$("$CTX" queue claim --project "$P" --pid $h --ttl 120 --worker doomed); rc=$?
    [ $rc -eq 0 ] && sleep 0.1
    kill -9 $h; wait $h 2>/dev/null
    case $rc in 0) ;; 3) sleep 0.05 ;; *) echo "FAIL doomed claim exit $rc" >&2 ;; esac
done
"""

# Recover and recover --reconcile by someone else: on a queue where only live processes move
# jobs, and dead holders' jobs wait to be requeued, each exits 0 (docs/queue.md: "a busy
# queue's recover exits 0, with or without --reconcile").
RECOVERER = r"""
while [ ! -e "$STOP" ]; do
    for how in "" --reconcile; do
        out=$("$CTX" queue recover --project "$P" $how 2>&1); rc=$?
        [ $rc -eq 0 ] || printf 'FAIL recover %s exit %s: %s\n' "$how" $rc "$out" >&2
    done
    sleep 0.15
done
"""

# `ctx queue work` started again and again for one job at a time: without an agent identity
# every job it claims is finished in failed/ (EACCES), a real claim, lease and finish.
WORKER_ONE_AT_A_TIME = r"""
while [ ! -e "$STOP" ]; do
    out=$("$CTX" queue work --project "$P" --drain --max-jobs 1 --ttl 120 2>&1); rc=$?
    [ $rc -eq 0 ] || printf 'FAIL work exit %s: %s\n' $rc "$out" >&2
    sleep 0.2
done
"""


@dataclass
class Mover:
    name: str
    proc: subprocess.Popen
    log: Path

    def said(self) -> str:
        return self.log.read_text()


@contextlib.contextmanager
def movers(
    world: World, scripts: Sequence[tuple[str, str, UnprivilegedUser | None]]
) -> Iterator[Callable[[], list[Mover]]]:
    """Each ``(name, script, who)`` run by bash as ``who`` until the block ends (or the
    function it yields is called): the stop file is made and each loop ends its round.
    What the function returns: the movers, all exited."""
    stop = world.top / f"stop-{time.monotonic_ns()}"
    started: list[Mover] = []
    finished: list[Mover] = []

    def end() -> list[Mover]:
        if not finished:
            stop.touch()
            for mover in started:
                try:
                    mover.proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(mover.proc.pid, signal.SIGKILL)
                    mover.proc.wait()
            finished.extend(started)
        return finished

    try:
        for name, script, who in scripts:
            log = world.top / f"{name}-{len(started)}.log"
            env = world.env(who)
            env.update(STOP=str(stop), CTX=CTX_ARGV[0], P=world.project)
            with open(log, "wb") as err:
                proc = subprocess.Popen(["bash", "-c", script], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=err, env=env,
                                        cwd="/", start_new_session=True,
                                        **world.popen_args(who))  # fmt: skip
            started.append(Mover(name, proc, log))
        yield end
    finally:
        end()


def movers_behaved(done: list[Mover]) -> None:
    for mover in done:
        assert mover.proc.returncode == 0, (mover.name, mover.proc.returncode, mover.said())
        fails = [line for line in mover.said().splitlines() if "FAIL" in line or TRACEBACK in line]
        assert fails == [], (mover.name, mover.said()[-6000:])


# ------------------------------------------------------------------------------ readers


@dataclass
class Seen:
    """One reader's view of one job: in ``state``, by a reading between ``start`` and
    ``end``."""

    job: str
    state: str
    start: float
    end: float
    how: str


@dataclass
class Readings:
    """What the readers saw, and every problem with it."""

    bounds: Callable[[float, float], tuple[int, int]]
    problems: list[str] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    count: dict[str, int] = field(default_factory=dict)
    dry_run_incomplete: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, problems: list[str], seen: list[Seen], how: str) -> None:
        with self.lock:
            self.problems.extend(problems)
            self.seen.extend(seen)
            self.count[how] = self.count.get(how, 0) + 1


STATUS_LINE = re.compile(r"^(pending|claimed|done|failed|incomplete|conflict|ignored)\s+(\d+)$")
LIST_LINE = re.compile(r"^(\S+)\s+(\S+\.req\.json)$")
NAME_LINE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\.req\.json$")
SHOW_STATE = re.compile(r"^state:\s+(\S+)(?: \((.*)\))?$")


def check_total(readings: Readings, run: Done, total: int) -> list[str]:
    low, high = readings.bounds(run.start, run.end)
    if not low <= total <= high:
        return [f"{total} jobs counted, published: between {low} and {high}: {run!r}"]
    return []


def read_status(readings: Readings, run: Done, as_json: bool) -> tuple[list[str], list[Seen]]:
    problems = said_properly(run, (0,))
    if problems:
        return problems, []
    if as_json:
        doc = run.json()
        counts = doc["counts"]
        for key in (*STATES, "conflict"):
            if doc[key] != counts[key]:
                problems.append(f"{key}: {doc[key]} at the top, {counts[key]} in counts: {run!r}")
        for key in ("incomplete", "conflicts", "ignored"):
            if doc[key]:
                problems.append(f"{key} listed on a queue only live processes move: {run!r}")
    else:
        counts = {}
        for line in run.out.splitlines():
            found = STATUS_LINE.match(line)
            if found:
                counts[found.group(1)] = int(found.group(2))
        if set(counts) != {*STATES, "incomplete", "conflict", "ignored"}:
            return [f"status text without its counts: {run!r}"], []
    for key in ("incomplete", "conflict", "ignored"):
        if counts[key]:
            problems.append(f"{key} counted on a queue only live processes move: {run!r}")
    problems += check_total(readings, run, sum(counts[s] for s in STATES))
    return problems, []


def read_list(
    readings: Readings, run: Done, as_json: bool, only: str | None
) -> tuple[list[str], list[Seen]]:
    problems = said_properly(run, (0,))
    if problems:
        return problems, []
    if as_json:
        pairs = [(entry["state"], entry["name"]) for entry in run.json()]
    else:
        pairs = []
        for line in run.out.splitlines():
            if only is not None:  # the names alone
                if not NAME_LINE.match(line):
                    return [f"list --state line not a job name: {line!r} in {run!r}"], []
                pairs.append((only, line))
                continue
            found = LIST_LINE.match(line)
            if not found:
                return [f"list line not 'STATE J': {line!r} in {run!r}"], []
            pairs.append((found.group(1), found.group(2)))
    names = [name for _, name in pairs]
    if len(set(names)) != len(names):
        problems.append(f"a job listed twice: {run!r}")
    for state, name in pairs:
        if state not in STATES:
            problems.append(f"{name} listed as {state!r}, not one of the states of §2.1: {run!r}")
        if only is not None and state != only:
            problems.append(f"{name} listed as {state} by list --state {only}: {run!r}")
    if only is None:
        problems += check_total(readings, run, len(pairs))
    seen = [Seen(name, state, run.start, run.end, " ".join(run.argv[1:4])) for state, name in pairs]
    return problems, seen


def moving(detail: str) -> bool:
    """docs/queue.md: a job whose ``claimed/J`` a transition holds locked is reported where
    the transition takes it, claimed while "a claim, finish or recover is moving it" (its
    lease may not be written yet)."""
    return detail.startswith("a claim, finish or recover is moving it (claimed/")


def read_show(run: Done, job: str, as_json: bool) -> tuple[list[str], list[Seen]]:
    problems = said_properly(run, (0,))
    if problems:
        return problems, []
    if as_json:
        doc = run.json()
        state = doc["state"]
        paths = {piece["path"] for piece in doc["evidence"]}
        if state == "claimed" and not moving(doc["detail"]):
            lease = doc.get("lease")
            if not isinstance(lease, dict) or "unreadable" in lease or "pid" not in lease:
                problems.append(f"claimed {job} shown without its lease: {run!r}")
            if f"lease/{job}/worker" not in paths or f"claimed/{job}/{job}" not in paths:
                problems.append(f"claimed {job} shown without both pieces of evidence: {run!r}")
            if not isinstance(doc.get("holder"), dict):
                problems.append(f"claimed {job} shown without its holder: {run!r}")
        if state in TERMINAL:
            result = doc.get("result")
            status = "ok" if state == "done" else "error"
            if not isinstance(result, dict) or result.get("status") != status:
                problems.append(f"{state} {job} shown without its result: {run!r}")
            if f"{state}/{job}.result" not in paths:
                problems.append(f"{state} {job} shown without its result file: {run!r}")
        if state == "pending" and f"pending/{job}" not in paths:
            problems.append(f"pending {job} shown without pending/J: {run!r}")
        for key in ("request", "lease", "result"):
            if isinstance(doc.get(key), dict) and "unreadable" in doc[key]:
                problems.append(f"{key} of {job} shown unreadable: {run!r}")
    else:
        lines = run.out.splitlines()
        found = [m for m in map(SHOW_STATE.match, lines) if m]
        if len(found) != 1:
            return [f"show text without one state line: {run!r}"], []
        state = found[0].group(1)
        leased = any(line.startswith("lease: {") for line in lines) and any(
            line.startswith("holder: ") for line in lines
        )
        if state == "claimed" and not moving(found[0].group(2) or "") and not leased:
            problems.append(f"claimed {job} shown without its lease and holder: {run!r}")
        if state in TERMINAL and not any(line.startswith("result: {") for line in lines):
            problems.append(f"{state} {job} shown without its result: {run!r}")
    if state not in STATES:
        problems.append(f"{job} shown as {state!r} while only live processes move it: {run!r}")
    return problems, [Seen(job, state, run.start, run.end, " ".join(run.argv[1:3]))]


def read_dry_run(readings: Readings, run: Done, as_json: bool) -> tuple[list[str], list[Seen]]:
    """docs/queue.md: ``--dry-run`` changes nothing and takes no lock, so it may list a job a
    claim or finish is moving as incomplete (and then exits 1); never a conflict or an error
    on a queue only live processes move, and nothing applied."""
    problems = said_properly(run, (0, 1))
    if problems:
        return problems, []
    if as_json:
        doc = run.json()
        if doc["dry_run"] is not True or doc["errors"] or doc["conflicts"]:
            problems.append(f"dry run with errors or conflicts: {run!r}")
        if doc["removed_temps"] or any(e["applied"] for e in doc["requeued"] + doc["repaired"]):
            problems.append(f"dry run says it applied something: {run!r}")
        if run.rc != (1 if doc["incomplete"] else 0):
            problems.append(f"dry run exit {run.rc} with {len(doc['incomplete'])} incomplete")
        if doc["incomplete"]:
            with readings.lock:
                readings.dry_run_incomplete += 1
    else:
        last = run.out.splitlines()[-1] if run.out else ""
        if "nothing changed: dry run" not in last or " 0 conflicts" not in last:
            problems.append(f"dry run summary: {run!r}")
        if re.search(r"^(?:conflict|error)\b", run.out, re.M):
            problems.append(f"dry run lists a conflict or an error: {run!r}")
    return problems, []


READS = (
    ("status", "--json"),
    ("list", "--json"),
    ("show", "--json"),
    ("list",),
    ("status",),
    ("show",),
    ("list", "--state", "claimed", "--json"),
    ("recover", "--dry-run", "--json"),
    ("list", "--state", "done"),
    ("show", "--json"),
    ("list", "--state", "pending", "--json"),
    ("recover", "--dry-run"),
    ("list", "--state", "failed"),
)


def reader(
    world: World,
    readings: Readings,
    jobs: Callable[[], list[str]],
    until: float,
    who: UnprivilegedUser | None,
    offset: int,
) -> None:
    """Every read of READS in turn (from ``offset``) as ``who``: each of them once at least,
    and on until ``until``."""
    i = offset
    while i < offset + len(READS) or time.monotonic() < until:
        command = READS[i % len(READS)]
        i += 1
        verb, *args = command
        as_json = "--json" in args
        how = " ".join(command)
        try:
            if verb == "show":
                names = jobs()
                if not names:
                    continue
                job = names[i % len(names)]
                run = world.ctx("show", job, *args, who=who)
                readings.add(*read_show(run, job, as_json), how)
            elif verb == "status":
                readings.add(*read_status(readings, world.ctx(verb, *args, who=who), as_json), how)
            elif verb == "list":
                only = args[args.index("--state") + 1] if "--state" in args else None
                run = world.ctx(verb, *args, who=who)
                readings.add(*read_list(readings, run, as_json, only), how)
            else:
                run = world.ctx(verb, *args, who=who)
                readings.add(*read_dry_run(readings, run, as_json), how)
        except (ValueError, KeyError, TypeError, IndexError) as error:  # output not as documented
            readings.add([f"{how}: {error!r}"], [], how)


def read_while(
    world: World,
    readings: Readings,
    jobs: Callable[[], list[str]],
    seconds: float,
    who: Sequence[UnprivilegedUser | None] = (None, None),
) -> None:
    """One reader thread for each of ``who``, reading for ``seconds``."""
    until = time.monotonic() + seconds
    threads = [
        threading.Thread(target=reader, args=(world, readings, jobs, until, w, 5 * n))
        for n, w in enumerate(who)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)


def never_backwards(readings: Readings) -> list[str]:
    """I-3, §2.1: once a reading that ended at T saw J done (or failed), no reading that
    started after T sees J in another state."""
    problems = []
    finished: dict[str, Seen] = {}
    for seen in sorted(readings.seen, key=lambda s: s.end):
        if seen.state in TERMINAL and seen.job not in finished:
            finished[seen.job] = seen
    for seen in readings.seen:
        first = finished.get(seen.job)
        if first is not None and seen.start > first.end and seen.state != first.state:
            problems.append(f"{seen.job}: {first.state} by {first.how}, then {seen.state} by "
                            f"{seen.how}")  # fmt: skip
    return problems


def assert_read_well(readings: Readings, *, expect_motion: bool = True) -> None:
    problems = readings.problems + never_backwards(readings)
    assert problems == [], "\n\n".join(problems[:8])
    assert set(readings.count) == {" ".join(command) for command in READS}, readings.count
    if expect_motion:
        # The readers saw jobs on their way and jobs that arrived (which of pending and
        # claimed a fast worker leaves to be seen depends on the machine's load).
        states = {seen.state for seen in readings.seen}
        assert states & {"pending", "claimed"} and states & set(TERMINAL), states


# ------------------------------------------------------------------------------ settling


def drain_and_settle(world: World, published: set[str]) -> None:
    """Dead holders' jobs requeued, every pending job worked to failed/ by ``ctx queue work
    --drain``; then every job published is in exactly one terminal state with its pair, and
    nothing else is left: no pending, claimed or lease entry, no temp in ``inbox/``, and
    recover (plain, then ``--reconcile``) calls the queue consistent and changes nothing."""
    requeue = world.ctx("recover", "--json")
    assert requeue.rc == 0 and requeue.json()["consistent"], requeue
    work = world.ctx("work", "--drain", "--ttl", "120")
    assert work.rc == 0, work
    on_disk = world.jobs_on_disk()
    assert set(on_disk) == published, (sorted(set(on_disk) ^ published), on_disk)
    for job, states in on_disk.items():
        assert len(states) == 1 and states[0] in TERMINAL, (job, states)
        assert (world.queue / states[0] / f"{job}.result").is_file(), job
    for sub in ("pending", "claimed", "lease", "inbox"):
        assert os.listdir(world.queue / sub) == [], (sub, os.listdir(world.queue / sub))
    results = {n[: -len(".result")] for s in TERMINAL for n in os.listdir(world.queue / s)
               if n.endswith(".result")}  # fmt: skip
    assert results == published
    before = tree(world.queue)
    for args in ((), ("--reconcile",)):
        run = world.ctx("recover", "--json", *args)
        assert run.rc == 0 and run.json()["consistent"] is True, run
        assert run.json()["requeued"] == [] and run.json()["repaired"] == [], run
    assert tree(world.queue) == before


def tree(top: Path) -> dict[str, tuple]:
    """Every entry under ``top`` (never following links) with its type, mode, owner, group,
    size, inode, mtime and content (or link target): what a reader must leave as it was."""
    found: dict[str, tuple] = {".": stat_of(top)}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath, name)
            rel = str(path.relative_to(top))
            info = stat_of(path)
            if stat.S_ISLNK(info[0]):
                found[rel] = (*info, os.readlink(path))
            elif stat.S_ISREG(info[0]):
                found[rel] = (*info, path.read_bytes())
            else:
                found[rel] = info
    return found


def stat_of(path: Path) -> tuple:
    s = os.lstat(path)
    return (s.st_mode, s.st_uid, s.st_gid, s.st_size, s.st_ino, s.st_mtime_ns, s.st_nlink)


def fixed(total: int) -> Callable[[float, float], tuple[int, int]]:
    return lambda start, end: (total, total)


# ------------------------------------------------------------------------------ tests


def test_readers_see_only_real_states_while_claimers_workers_killers_and_recovers_move_jobs(
    world,
):
    """§2.1, §2.4, Q-5, Q-6, I-1, I-3: thirty jobs; for a few seconds a shell claims, renews
    and finishes (--ok and --error in turn), ``ctx queue work`` takes one job at a time,
    holders are SIGKILLed while they hold a job, and someone else runs ``recover`` and
    ``recover --reconcile`` over and over, which requeue the dead holders' jobs.  Two readers
    run status, list (all, --state), show and recover --dry-run, text and --json, all along.
    Each reading exits 0 (dry run: 0, or 1 with what it lists as incomplete), counts thirty
    jobs, lists each once in one of the four states, never calls one incomplete or a
    conflict, shows a claimed job with its lease and holder and a finished one with its
    result, and no job is seen leaving done or failed.  The movers meet no refusal they
    should not; once they stop and the rest is drained, every job is in one terminal state
    and nothing is left behind."""
    published = set(world.publish_batch(30))
    names = sorted(published)
    readings = Readings(fixed(len(published)))
    scripts = [
        ("finisher", CLAIM_AND_FINISH, None),
        ("doomed", KILLED_HOLDER, None),
        ("recoverer", RECOVERER, None),
        ("worker", WORKER_ONE_AT_A_TIME, None),
    ]
    with movers(world, scripts) as stop:
        read_while(world, readings, lambda: names, CHURN)
        done = stop()
    movers_behaved(done)
    assert_read_well(readings)
    drain_and_settle(world, published)


def test_members_read_a_queue_root_and_another_member_work(team):
    """§2.4, X-1 with docs/queue.md ("A queue shared by a group"): the space's group holds a
    member who is not root.  Root claims and finishes, and its holders are SIGKILLed while
    they hold a job; the member runs a ``ctx queue work`` one job at a time and recovers
    (plain and --reconcile), which requeues root's dead holders' jobs.  Two readers run as
    that member (its own groups, umask 022) all along: each reading is as a root reader's
    would be (exit 0, a real state per job, never incomplete, a conflict or a claim without
    its lease, counts that add up), and no job goes backwards."""
    w, member = team, team.member
    published = set(w.publish_batch(24))
    names = sorted(published)
    readings = Readings(fixed(len(published)))
    scripts = [
        ("finisher", CLAIM_AND_FINISH, None),
        ("doomed", KILLED_HOLDER, None),
        ("recoverer", RECOVERER, member),
        ("worker", WORKER_ONE_AT_A_TIME, member),
    ]
    with movers(w, scripts) as stop:
        read_while(w, readings, lambda: names, CHURN, who=(member, member))
        done = stop()
    movers_behaved(done)
    assert_read_well(readings)
    drain_and_settle(w, published)


@dataclass
class Batches:
    """``publish --batch`` of ``size`` requests at a time, each with the times it was started
    and acknowledged, and the names it printed."""

    size: int
    started: list[float] = field(default_factory=list)
    acknowledged: list[float] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bounds(self, start: float, end: float) -> tuple[int, int]:
        """At least the jobs of the batches acknowledged before the reading started, at most
        those of the batches started before it ended."""
        with self.lock:
            low = sum(1 for t in self.acknowledged if t < start) * self.size
            high = sum(1 for t in self.started if t < end) * self.size
        return low, high

    def publish_until(self, world: World, until: float) -> None:
        n = 0
        while time.monotonic() < until:
            lines = "".join(json.dumps(request(batch=n, line=i)) + "\n" for i in range(self.size))
            with self.lock:
                self.started.append(time.monotonic())
            run = world.ctx("publish", "--batch", "-", stdin=lines)
            printed = run.out.split()
            with self.lock:
                self.acknowledged.append(time.monotonic())
                self.names.extend(printed)
                if run.rc != 0 or len(printed) != self.size or TRACEBACK in run.err:
                    self.problems.append(repr(run))
            n += 1
            time.sleep(0.1)


def test_readers_racing_publish_batch_and_a_running_worker(world):
    """Q-1 (``publish --batch`` is one group commit), §2.4, I-1: a publisher sends batches of
    eight requests again and again while a long-running ``ctx queue work`` fails each job it
    claims (no agent) and a shell claims and finishes others.  Readers count at least the
    jobs of every batch acknowledged before they started and at most those of the batches
    started before they ended, list each job once in a state of §2.1, never list an ignored
    entry, an incomplete pair or a conflict for a request on its way from ``inbox/``, and show
    every published job in a real state.  The worker ends 0 on SIGTERM; at the end every job
    published is in one terminal state, nothing else is left."""
    batches = Batches(8)
    readings = Readings(batches.bounds)

    def published_names() -> list[str]:
        with batches.lock:
            return list(batches.names)

    argv = [*CTX_ARGV, "queue", "work", "--project", world.project, "--ttl", "120"]
    worker_log = world.top / "worker.log"
    with open(worker_log, "wb") as log:
        worker = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=log, env=world.env(), cwd="/",
                                  start_new_session=True)  # fmt: skip
    try:
        with movers(world, [("finisher", CLAIM_AND_FINISH, None)]) as stop:
            until = time.monotonic() + CHURN
            publisher = threading.Thread(target=batches.publish_until, args=(world, until))
            publisher.start()
            read_while(world, readings, published_names, CHURN)
            publisher.join(timeout=120)
            done = stop()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, worker_log.read_text()
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    said = worker_log.read_text()
    assert TRACEBACK not in said, said
    movers_behaved(done)
    assert batches.problems == [], batches.problems
    assert_read_well(readings)
    published = set(batches.names)
    assert len(published) == len(batches.names) == batches.size * len(batches.started)
    listed = {seen.job for seen in readings.seen}
    assert listed <= published, sorted(listed - published)
    drain_and_settle(world, published)


# A claimed job's holder that is alive all along, for the still queue below.
@pytest.fixture
def holder() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def still_queue(w: World, holder: subprocess.Popen) -> dict[str, str]:
    """A queue holding one job of every kind a reader meets (name → what it is): pending;
    claimed by a live holder; claimed by a holder that has exited (recover would requeue it);
    done; failed; a claim without its lease (an incomplete pair); a job both pending and done
    (a conflict); plus a stray publish temp past the grace period, a dot-file and a symlink."""
    jobs = {}
    for name in ("live", "dead", "fine", "bad", "pend", "half", "twice"):
        jobs[w.publish(name=name)] = name
    by_name = {v: k for k, v in jobs.items()}
    order = ["live", "dead", "fine", "bad", "half", "twice"]
    gone = subprocess.Popen(["true"])
    gone.wait()
    for name in order[:4]:
        pid = holder.pid if name != "dead" else gone.pid
        claimed = w.ctx("claim", "--pid", str(pid), "--ttl", "600")
        assert claimed.rc == 0 and claimed.out.strip() == by_name[name], claimed
    for name, flag in (("fine", "--ok"), ("bad", "--error")):
        assert w.ctx("finish", by_name[name], flag, "-", stdin="{}").rc == 0
    q, half, twice = w.queue, by_name["half"], by_name["twice"]
    (q / "claimed" / half).mkdir()
    os.rename(q / "pending" / half, q / "claimed" / half / half)
    (q / "done" / twice).write_text(json.dumps(request()))
    (q / "done" / f"{twice}.result").write_text(
        json.dumps({"status": "ok", "output": {}, "worker": {}, "started": "", "finished": ""})
    )
    temp = q / "inbox" / "stray.req.json.publish.tmp"
    temp.write_text("{}")
    age(temp, 7200)
    (q / "pending" / ".hidden").write_text("{}")
    (q / "pending" / "link.req.json").symlink_to("/etc/hostname")
    return jobs


# What each reader of the still queue exits with (§2.4, docs/queue.md: status, list and show
# exit 1 when they find or list a conflict; recover --dry-run 1 while an incomplete pair or a
# conflict remains).
STILL_READS: list[tuple[tuple[str, ...], int]] = [
    (("status",), 1),
    (("list",), 1),
    (("list", "--state", "pending"), 0),
    (("list", "--state", "claimed"), 0),
    (("list", "--state", "done"), 0),
    (("list", "--state", "failed"), 0),
    (("list", "--state", "incomplete"), 0),
    (("list", "--state", "conflict"), 1),
    (("recover", "--dry-run"), 1),
    (("recover", "--dry-run", "--grace", "1"), 1),
]
STILL_SHOWN = {"pend": 0, "live": 0, "dead": 0, "fine": 0, "bad": 0, "half": 0, "twice": 1}


def test_readers_change_nothing_on_disk_and_exit_as_documented(team, holder):
    """§2.4, Q-5, Q-6, Q-8: on a still queue holding one job of every kind a reader meets
    (pending, claimed by a live holder, claimed by a dead one, done, failed, a claim without
    its lease, a job both pending and done, a stray temp past the grace period, a dot-file,
    a symlink), every reader (status, list and each --state, show of each job, recover
    --dry-run), text and --json, run by root and by a member of the group, exits as
    §2.4 says (1 where it finds or lists the conflict, 0 elsewhere; the dry run 1) with no
    traceback, and leaves the whole storage root as it was: not one entry made, removed,
    moved, rewritten, re-moded or touched; the dead holder's job is not requeued, the
    incomplete claim not repaired, the stray temp not removed."""
    w = team
    jobs = still_queue(w, holder)
    before = tree(w.storage)
    wrong = []
    for who in (None, w.member):
        for args, rc in STILL_READS:
            for mode in ((), ("--json",)):
                run = w.ctx(*args[:1], *args[1:], *mode, who=who)
                wrong += said_properly(run, (rc,))
                if mode:
                    run.json()  # one JSON document
        for job, name in jobs.items():
            for mode in ((), ("--json",)):
                run = w.ctx("show", job, *mode, who=who)
                wrong += said_properly(run, (STILL_SHOWN[name],))
    assert wrong == [], "\n\n".join(wrong[:6])
    assert tree(w.storage) == before
    shown = w.ctx("show", next(j for j, n in jobs.items() if n == "live"), "--json").json()
    assert shown["state"] == "claimed" and shown["holder"]["state"] == "alive", shown
    shown = w.ctx("show", next(j for j, n in jobs.items() if n == "dead"), "--json").json()
    assert shown["state"] == "claimed" and shown["holder"]["state"] == "gone", shown
