"""End-to-end flows of ``ctx`` commands whose system calls fail, or whose process dies, at a
chosen step (SPEC §2 Q-1 … Q-9, I-1 … I-5, R-5, T-8, A-3, X-1, S-5): each command is first
traced once with strace, then run again from the same starting state with strace's fault
injection making the N-th ``renameat2``/``renameat``/``unlinkat``/``mkdirat``/``fsync``/
``syncfs``/``write``/``openat`` fail with ENOSPC, EIO, EDQUOT, EMFILE or EINTR, or SIGKILLing
the command right there.  The user then looks with the ordinary commands: an injected error is
one ``ctx: ERRNO: …`` line saying what was and was not done and what to do, with a non-zero
exit and no Python traceback; the queue is left as before or as after, or in a state the error
names and ``ctx queue recover --reconcile`` completes (nothing lost, no job in two states, no
result without its request); ``ctx queue status --json`` reports what is on disk; and a second
recover has nothing left to do.  Installs, agents, spaces and bootstrap are whole, or
finished by the same command or by ``ctx bootstrap``; a session log keeps whole lines
only."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    clean_env,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
)
from tests.support.storage import copy_of_root
from tests.support.strace import Step, can_inject, first_process_steps, pick

pytestmark = pytest.mark.skipif(not can_inject(), reason="needs strace fault injection")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root")

TOP = scratch_top(__file__)
PROJECT = "p"
JOB = "j.req.json"
AGENT, LABEL = "ci", "ci_t"
REQUEST = json.dumps({"tool": "fs.stat", "input": {"path": "/ctx"}})
OUTPUT = {"answer": 42}
BATCH = "".join(
    json.dumps({"tool": "fs.stat", "input": {"path": f"/line{n}"}}) + "\n" for n in range(1, 5)
)
TRACED = (
    "fsync,fdatasync,syncfs,rename,renameat,renameat2,link,linkat,unlink,unlinkat,"
    "mkdir,mkdirat,rmdir,openat,write"
)
TRACEBACK = "Traceback (most recent call last)"
STATE_DIRS = ("inbox", "pending", "lease", "claimed", "done", "failed")


# ------------------------------------------------------------------------------ tracing


# ------------------------------------------------------------------------------ worlds


class World:
    """A storage root, a cache directory for the claim-order hints, and a saved copy of the
    root to start every run from."""

    def __init__(self, top: Path) -> None:
        self.top = top
        self.root = top / "st"
        self.cache = top / "cache"
        self.saved = top / "saved"
        self.cache.mkdir(exist_ok=True)

    @property
    def env(self) -> dict[str, str]:
        return clean_env(
            CTX_STORAGE=str(self.root), XDG_CACHE_HOME=str(self.cache), PYTHONDONTWRITEBYTECODE="1"
        )

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.root, PROJECT)

    def run(self, argv: list[str], input: str | bytes = b"") -> Run:
        data = input.encode() if isinstance(input, str) else input
        proc = subprocess.run(argv, input=data, capture_output=True, env=self.env, timeout=120)
        return Run(
            argv[len(CTX_ARGV) :] if argv[: len(CTX_ARGV)] == CTX_ARGV else argv,
            proc.returncode,
            proc.stdout.decode("utf-8", "replace"),
            proc.stderr.decode("utf-8", "replace"),
        )

    def ctx(self, *args, input: str | bytes = b"") -> Run:
        return self.run([*CTX_ARGV, *map(str, args)], input)

    def q(self, verb: str, *args, input: str | bytes = b"") -> Run:
        return self.ctx("queue", verb, "--project", PROJECT, *args, input=input)

    def keep(self) -> None:
        """The root as it is now is where every later run starts from."""
        shutil.rmtree(self.saved, ignore_errors=True)
        if self.root.exists():
            shutil.copytree(self.root, self.saved, symlinks=True)

    def reset(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        if self.saved.exists():
            shutil.copytree(self.saved, self.root, symlinks=True)
        shutil.rmtree(self.cache, ignore_errors=True)
        self.cache.mkdir()

    def traced(self, args, fault: str | None = None, input: str | bytes = b"",
               calls: str = TRACED) -> Run:  # fmt: skip
        trace = self.top / "trace"
        argv = ["strace", "-f", "-qq", "-o", str(trace), "-e", f"trace={calls}"]
        if fault is not None:
            argv += ["-e", f"inject={fault}"]
        return self.run([*argv, *CTX_ARGV, *map(str, args)], input)

    def steps(self, args, input: str | bytes = b"") -> list[Step]:
        """The calls ``ctx ARGS`` makes from the saved state (which it is reset to after)."""
        self.reset()
        done = self.traced(args, input=input)
        assert done.rc == 0, done
        steps = first_process_steps(self.top / "trace")
        self.reset()
        return steps

    def inject(self, args, step: Step, code: str | None, input: str | bytes = b"",
               persist: bool = False) -> Run | None:  # fmt: skip
        """``ctx ARGS`` from the saved state with ``step`` failing with errno ``code`` (with
        ``persist``, every later call of that system call too), or, when ``code`` is None,
        SIGKILLed on entering ``step`` (which is not made).  None when the call the fault
        met is not ``step``: the command took another path than the traced one."""
        self.reset()
        if code is None:
            fault = f"{step.call}:signal=KILL:when={step.nth}"
        else:
            fault = f"{step.call}:error={code}:when={step.nth}{'+' if persist else ''}"
        run = self.traced(args, fault, input, step.call)
        made = first_process_steps(self.top / "trace")
        if code is None:
            assert run.rc == -9, (str(step), run)  # strace dies of its tracee's signal
            met = made[-1:]
        else:
            met = [s for s in made if "(INJECTED)" in s.text][:1]
        return run if met and met[0].signature == step.signature else None


_TEMPLATES: dict[str, Path] = {}
_STEPS: dict[tuple, list[Step]] = {}


def _template(kind: str, build: Callable[[World], None]) -> Path:
    """One root per test process and ``kind``, built once by ``build``."""
    if kind not in _TEMPLATES:
        top = new_scratch_dir(TOP, f"tpl-{kind}-")
        atexit.register(shutil.rmtree, top, True)
        build(World(top))
        _TEMPLATES[kind] = top / "st"
    return _TEMPLATES[kind]


def steps_of(world: World, kind: str | None, args, input: str | bytes = b"",
             key: tuple = (), fresh: bool = False) -> list[Step]:  # fmt: skip
    """:meth:`World.steps`, traced once per test process for each kind of world and command
    (the calls a command makes do not depend on where its root lies); every time when
    ``kind`` is None or ``fresh``."""
    cache_key = (kind, key or tuple(map(str, args)), input)
    if kind is None or fresh or cache_key not in _STEPS:
        _STEPS[cache_key] = world.steps(args, input)
    return _STEPS[cache_key]


def inject_at(world: World, kind: str | None, args, locate: Callable[[list[Step]], Step],
              code: str | None, input: str | bytes = b"", persist: bool = False,
              key: tuple = ()) -> tuple[Step, Run]:  # fmt: skip
    """:meth:`World.inject` at the step ``locate`` finds in the command's trace, traced anew
    once when the run took another path (the interpreter found a source file changed since
    the trace, say).  A command that fails with a traceback fails the test."""
    for fresh in (False, True):
        step = locate(steps_of(world, kind, args, input, key, fresh))
        run = world.inject(args, step, code, input, persist)
        if run is not None:
            assert TRACEBACK not in run.err, (str(step), run)
            return step, run
    pytest.fail(f"the fault at {step} met another call than the traced run made")


def bare_root(world: World) -> None:
    """A storage root holding the six root entries (R-2) and nothing else."""
    for entry in ("bin", "tool", "agent", "model", "home", "shared"):
        (world.root / entry).mkdir(parents=True, mode=0o755)


def dead_holder_claim(world: World) -> Run:
    """``ctx queue claim`` leasing for its own process, which has exited when it returns: a
    lease holder that is provably gone (Q-5)."""
    script = 'exec "$@" --pid $$'
    return world.run(["sh", "-c", script, "sh", *CTX_ARGV, "queue", "claim", "--project", PROJECT])


def build_queue(world: World, jobs: tuple[str, ...] = ()) -> None:
    bare_root(world)
    assert world.q("init").rc == 0
    for name in jobs:
        assert world.q("publish", "--name", name, "-", input=REQUEST).rc == 0


def build_claimed(world: World) -> None:
    """J claimed by a holder that has exited."""
    build_queue(world, ("j",))
    claimed = dead_holder_claim(world)
    assert claimed.rc == 0 and claimed.out.strip() == JOB, claimed


def build_leftovers(world: World) -> None:
    """a: claimed and leased by a holder that has exited (recover requeues it); b: its finish
    killed after its result moved into done/ (recover --reconcile rolls it forward); c:
    pending."""
    build_queue(world, ("a", "b", "c"))
    for job in ("a.req.json", "b.req.json"):
        claimed = dead_holder_claim(world)
        assert claimed.out.strip() == job, claimed
    finish = ["queue", "finish", "--project", PROJECT, "b", "--ok", "-"]
    killed = world.traced(finish, "renameat2:signal=KILL:when=2", input=json.dumps(OUTPUT))
    assert killed.rc == -9, killed
    q = world.queue.dir
    assert (q / "done" / "b.req.json.result").is_file() and (q / "claimed" / "b.req.json").is_dir()


SETUPS: dict[str, Callable[[World], None]] = {
    "empty": build_queue,
    "one-pending": lambda world: build_queue(world, ("j",)),
    "claimed": build_claimed,
    "leftovers": build_leftovers,
    "bare": bare_root,
}


@pytest.fixture
def make_world() -> Iterator[Callable[[str], World]]:
    made: list[World] = []

    def make(kind: str) -> World:
        world = World(new_scratch_dir(TOP, "t-"))
        template = _template(kind, SETUPS[kind])
        shutil.copytree(template, world.root, symlinks=True)
        world.keep()
        made.append(world)
        return world

    yield make
    for world in made:
        shutil.rmtree(world.top, ignore_errors=True)


# ------------------------------------------------------------------------------ checks


def error_line(run: Run, code: str) -> str:
    """The ``ctx: CODE: …`` line of a refused command: exit 1, no traceback."""
    assert run.rc == 1, run
    assert TRACEBACK not in run.err, run
    lines = [line for line in run.err.splitlines() if line.startswith(f"ctx: {code}: ")]
    assert lines, run
    return lines[0]


def assert_not_bare(line: str, *names: str) -> None:
    """An error that names where it happened and what to do, not just the errno's text."""
    for name in names:
        assert name in line, (name, line)
    assert "again" in line or "'ctx " in line, line


def status(world: World) -> dict:
    shown = world.q("status", "--json")
    assert shown.rc in (0, 1) and TRACEBACK not in shown.err, shown
    return shown.json()


def on_disk(world: World) -> dict[str, list[str]]:
    """Every job name with each state its evidence puts it in: ``pending``, ``claimed`` (the
    request in ``claimed/J/``), ``done``/``failed`` (the request there), and ``result`` for
    each result file, wherever it lies."""
    q = world.queue.dir
    seen: dict[str, list[str]] = {}
    for name, states in world.queue.requests().items():
        seen.setdefault(name, []).extend(states)
    for terminal in ("done", "failed"):
        for name in os.listdir(q / terminal):
            if name.endswith(".result"):
                seen.setdefault(name.removesuffix(".result"), []).append("result")
    return seen


def assert_status_agrees(world: World) -> dict:
    """``ctx queue status --json`` counts what is on disk: each job whose evidence is one
    whole state in that state, and every other job among the incomplete or the conflicts."""
    shown = status(world)
    q = world.queue.dir
    flagged = {i["job"] for i in shown["incomplete"] + shown["conflicts"]}
    whole: dict[str, list[str]] = {"pending": [], "claimed": [], "done": [], "failed": []}
    for job, states in on_disk(world).items():
        leased = (q / "lease" / job / "worker").is_file()
        kind = sorted(states)
        if kind == ["pending"] and not (q / "claimed" / job).exists() and not leased:
            whole["pending"].append(job)
        elif kind == ["claimed"] and leased:
            whole["claimed"].append(job)
        elif (
            kind in (["done", "result"], ["failed", "result"])
            and not leased
            and not (q / "claimed" / job).exists()
        ):
            whole[kind[0]].append(job)
        else:
            assert job in flagged, (job, states, shown)
    for state, jobs in whole.items():
        assert shown[state] == len(jobs) and not flagged & set(jobs), (state, jobs, shown)
    return shown


def assert_settled(world: World, expected: dict[str, str], twice: bool = False) -> None:
    """``recover --reconcile`` (grace 0) leaves a consistent queue holding exactly
    ``expected`` (job -> pending | claimed | done), each job once, no temp file; status says
    so; with ``twice``, a second run changes nothing (I-5)."""
    first = world.q("recover", "--reconcile", "--grace", "0")
    assert first.rc == 0 and TRACEBACK not in first.err, first
    if twice:
        second = world.q("recover", "--reconcile", "--grace", "0")
        assert second.rc == 0 and "0 requeued, 0 repaired" in second.out, second
    states = {
        job: sorted(s for s in found if s != "result") for job, found in on_disk(world).items()
    }
    assert states == {job: [state] for job, state in expected.items()}, (states, expected)
    for job, state in expected.items():
        results = on_disk(world)[job].count("result")
        assert results == (1 if state == "done" else 0), (job, on_disk(world))
    assert os.listdir(world.queue.dir / "inbox") == [], os.listdir(world.queue.dir / "inbox")
    shown = assert_status_agrees(world)
    assert shown["incomplete"] == [] and shown["conflicts"] == [] and shown["temps"] == [], shown


def stored_result(world: World, job: str = JOB) -> dict:
    return json.loads((world.queue.dir / "done" / f"{job}.result").read_text())


def lines_published(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.endswith(".req.json")]


# ------------------------------------------------------------------------------ publish


@dataclass(frozen=True)
class Point:
    """Where a command fails: how to find the step in its trace, the errno, whether every
    later call of that system call fails too, and what the command is left having done."""

    name: str
    locate: Callable[[list[Step]], Step]
    code: str
    outcome: str
    persist: bool = False

    def __str__(self) -> str:
        return self.name


def _temp_open(s: list[Step]) -> Step:
    return pick(s, "openat", ".publish.tmp")


def _publish_move(s: list[Step]) -> Step:
    return pick(s, "renameat2", ".publish.tmp")


PUBLISH_POINTS = [
    Point("open-temp-EMFILE", _temp_open, "EMFILE", "nothing"),
    Point("move-EDQUOT", _publish_move, "EDQUOT", "nothing"),
    Point("sync-pending-EIO", lambda s: pick(s, "fsync", after=_publish_move(s)), "EIO", "moved"),
]  # fmt: skip


@pytest.mark.parametrize("point", PUBLISH_POINTS, ids=str)
def test_a_publish_refused_at_each_step_publishes_once_or_not_at_all_and_says_which(
    point, make_world
):
    """Q-1, I-1, I-2, Q-7: ``ctx queue publish`` refused at one of its steps exits 1 with the
    injected errno.  Before the no-replace move nothing is published ("nothing was
    published"), nothing is printed and no temp file stays in ``inbox/``; once the move is
    done and only a sync failed, the job is pending, its name is printed as a successful
    publish prints it and the error says not to publish it again.  Publishing the same name
    again is then refused with EEXIST (or, when nothing was published, succeeds), and the
    queue settles with the job pending once."""
    world = make_world("empty")
    args = ["queue", "publish", "--project", PROJECT, "--name", "j", "-"]
    step, run = inject_at(world, "empty", args, point.locate, point.code, REQUEST)
    line = error_line(run, point.code)
    pending = os.listdir(world.queue.dir / "pending")
    if point.outcome == "nothing":
        assert "nothing was published" in line and run.out == "", (str(step), run)
        assert pending == [] and os.listdir(world.queue.dir / "inbox") == [], str(step)
        assert_status_agrees(world)
        again = world.q("publish", "--name", "j", "-", input=REQUEST)
        assert again.rc == 0 and again.out == f"{JOB}\n", again
    else:
        assert run.out == f"{JOB}\n" and "do not publish it again" in line, (str(step), run)
        assert pending == [JOB], str(step)
        stored = (world.queue.dir / "pending" / JOB).read_bytes()
        again = world.q("publish", "--name", "j", "-", input=REQUEST)
        assert again.rc == 1 and "EEXIST" in again.err, again
        assert (world.queue.dir / "pending" / JOB).read_bytes() == stored
    assert_settled(world, {JOB: "pending"})


def test_an_interrupted_system_call_in_a_publish_publishes_once_or_not_at_all(make_world):
    """Q-1, I-1: a publish whose fsync of its temp file, or whose no-replace move, returns
    EINTR (no signal behind it) either completes (the job pending, its name printed) or exits
    1 with ``ctx: EINTR:`` saying nothing was published (no job, no temp file); never a
    traceback, never both."""
    world = make_world("empty")
    args = ["queue", "publish", "--project", PROJECT, "--name", "j", "-"]

    def temp_sync(steps: list[Step]) -> Step:
        return pick(steps, "fsync", after=_temp_open(steps))

    for locate in (temp_sync, _publish_move):
        step, run = inject_at(world, "empty", args, locate, "EINTR", REQUEST)
        pending = os.listdir(world.queue.dir / "pending")
        if run.rc == 0:
            assert run.out == f"{JOB}\n" and pending == [JOB], (str(step), run)
        else:
            line = error_line(run, "EINTR")
            assert "nothing was published" in line and pending == [] and run.out == "", run
        assert os.listdir(world.queue.dir / "inbox") == [], str(step)
        assert_settled(world, {JOB: "pending"} if run.rc == 0 else {})


# ------------------------------------------------------------------------------ publish --batch


BATCH_POINTS = [
    Point("syncfs-EIO", lambda s: pick(s, "syncfs"), "EIO", "none"),
    Point("second-move-ENOSPC-once", lambda s: pick(s, "renameat2", ".publish.tmp", skip=1),
          "ENOSPC", "2"),
    Point("third-move-on-ENOSPC", lambda s: pick(s, "renameat2", ".publish.tmp", skip=2),
          "ENOSPC", "3-4", persist=True),
    Point("sync-after-moves-EIO",
          lambda s: pick(s, "fsync", after=pick(s, "renameat2", ".publish.tmp", skip=3)), "EIO",
          "all"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "point"),
    [("json", p) for p in BATCH_POINTS if p.outcome != "3-4"] + [("text", BATCH_POINTS[2])],
    ids=lambda x: str(x),
)
def test_a_batch_refused_midway_names_each_job_published_and_each_line_not(point, mode, make_world):
    """Q-1, I-1, §2.4: ``ctx queue publish --batch`` of four lines refused at one step exits
    1 with the injected errno.  The names it reports as published (on stdout in text mode,
    under ``published`` with ``--json``) are exactly the jobs in ``pending/``; the lines it
    reports as not published are exactly the others; ``inbox/`` keeps no temp file.
    Publishing again only the lines not published leaves each of the four requests pending
    exactly once."""
    world = make_world("empty")
    flags = ["--json"] if mode == "json" else []
    args = ["queue", "publish", "--project", PROJECT, "--batch", *flags, "-"]
    step, run = inject_at(world, "empty", args, point.locate, point.code, BATCH, point.persist)
    line = error_line(run, point.code)
    pending = set(os.listdir(world.queue.dir / "pending"))
    if mode == "json":
        answer = run.json()
        assert answer["error"] == point.code, answer
        published = answer.get("published", [])
        not_lines = answer.get("not_published_lines", [1, 2, 3, 4] if not published else [])
    else:
        published = lines_published(run.out)
    assert set(published) == pending, (str(step), run, pending)
    for job in published:
        assert job in line, (job, line)
    expected_lines = {"none": [1, 2, 3, 4], "2": [2], "3-4": [3, 4], "all": []}[point.outcome]
    if mode == "json":
        assert not_lines == expected_lines, (not_lines, run)
    elif point.outcome in ("2", "3-4"):
        assert f"line {point.outcome}" in line or f"lines {point.outcome}" in line, line
    assert len(pending) == 4 - len(expected_lines), (str(step), pending)
    assert os.listdir(world.queue.dir / "inbox") == [], str(step)
    if not published:
        assert "nothing was published" in line, line
    elif expected_lines:
        assert "do not publish them again" in line, line

    rest = "".join(BATCH.splitlines(keepends=True)[n - 1] for n in expected_lines)
    if rest:
        again = world.q("publish", "--batch", "-", input=rest)
        assert again.rc == 0, again
    paths = sorted(
        json.loads((world.queue.dir / "pending" / name).read_text())["input"]["path"]
        for name in os.listdir(world.queue.dir / "pending")
    )
    assert paths == [f"/line{n}" for n in range(1, 5)], paths
    assert_settled(world, {name: "pending" for name in os.listdir(world.queue.dir / "pending")})


# ------------------------------------------------------------------------------ claim


def _claim_move(s: list[Step]) -> Step:
    return pick(s, "renameat2", f'"{JOB}"')


def _lease_move(s: list[Step]) -> Step:
    return pick(s, "renameat2", '"worker"')


CLAIM_POINTS = [
    Point("mkdir-claim-EIO", lambda s: pick(s, "mkdirat", f'"{JOB}"'), "EIO", "pending"),
    Point("move-ENOSPC", _claim_move, "ENOSPC", "pending"),
    Point("sync-after-move-EIO", lambda s: pick(s, "fsync", after=_claim_move(s)), "EIO",
          "unleased"),
    Point("lease-move-ENOSPC", _lease_move, "ENOSPC", "pending"),
    Point("sync-inbox-EIO", lambda s: pick(s, "fsync", after=_lease_move(s), skip=1), "EIO",
          "pending"),
]  # fmt: skip


@pytest.mark.parametrize("point", CLAIM_POINTS, ids=str)
def test_a_claim_refused_at_each_step_leaves_the_job_pending_or_unleased_as_it_says(
    point, make_world
):
    """Q-2, Q-3, I-4, Q-6: ``ctx queue claim`` refused at one of its steps exits 1 with the
    injected errno and prints no job name (so no caller runs it).  The job is then pending
    ("nothing was claimed (job J stays pending)", no claim directory, lease or lease temp
    left), or, when only a sync after the move failed, claimed without a lease, as the error
    says, for ``recover --reconcile`` to return to pending (plain ``recover`` only reports
    it); never claimed and leased.  The queue then settles with J pending."""
    world = make_world("one-pending")
    args = ["queue", "claim", "--project", PROJECT, "--pid", str(os.getpid())]
    step, run = inject_at(world, "one-pending", args, point.locate, point.code)
    line = error_line(run, point.code)
    assert run.out == "", (str(step), run)
    q = world.queue.dir
    assert os.listdir(q / "inbox") == [] and os.listdir(q / "lease") == [], str(step)
    if point.outcome == "pending":
        assert f"nothing was claimed (job {JOB} stays pending)" in line, line
        assert on_disk(world) == {JOB: ["pending"]} and os.listdir(q / "claimed") == [], step
        assert assert_status_agrees(world)["incomplete"] == []
    else:
        assert "recover --reconcile" in line and "never ran" in line, line
        assert on_disk(world) == {JOB: ["claimed"]}, str(step)
        shown = assert_status_agrees(world)
        assert [i["job"] for i in shown["incomplete"]] == [JOB], shown
        plain = world.q("recover")
        assert plain.rc == 1 and on_disk(world) == {JOB: ["claimed"]}, plain  # reports only
    assert_settled(world, {JOB: "pending"})


UNDO_REFUSED = [
    Point("lease-move-and-its-undo-ENOSPC", _lease_move, "ENOSPC", "unleased", persist=True),
    Point("every-sync-from-the-lease-on-EIO",
          lambda s: pick(s, "fsync", after=pick(s, "openat", ".lease.")), "EIO", "orphan",
          persist=True),
]  # fmt: skip


@pytest.mark.parametrize("point", UNDO_REFUSED, ids=str)
def test_a_claim_whose_undo_is_refused_too_says_where_the_job_stands(point, make_world):
    """Q-3, Q-6, §2.4 (errors read ``ctx: ERRNO: what to do``; docs/queue.md: a step refused
    for want of a resource is never bare, it names the directory, what was and was not done
    and what to do): a claim refused at its lease on a disk that stays full (or failing)
    cannot put the job back either.  The job is left claimed without a lease (or pending
    with a leftover claim directory), which ``recover --reconcile`` settles; the error must
    say so, naming the queue, rather than a bare errno that invites ``claim again``."""
    world = make_world("one-pending")
    args = ["queue", "claim", "--project", PROJECT, "--pid", str(os.getpid())]
    _, run = inject_at(world, "one-pending", args, point.locate, point.code, persist=True)
    line = error_line(run, point.code)
    assert run.out == "", run
    left = on_disk(world)
    assert left in ({JOB: ["claimed"]}, {JOB: ["pending"]}), left
    assert_settled(world, {JOB: "pending"})
    assert_not_bare(line, str(world.queue.dir), JOB)
    assert "recover --reconcile" in line or "stays pending" in line, line


# ------------------------------------------------------------------------------ renew


RENEW_POINTS = [
    Point("replace-ENOSPC", lambda s: pick(s, "renameat", '"worker"'), "ENOSPC", "unchanged"),
    Point("sync-lease-dir-EIO",
          lambda s: pick(s, "fsync", after=pick(s, "renameat", '"worker"')), "EIO", "renewed"),
]  # fmt: skip


@pytest.mark.parametrize("point", RENEW_POINTS, ids=str)
def test_a_renew_refused_keeps_one_whole_lease_and_says_which(point, make_world):
    """Q-3: ``ctx queue renew`` refused at one of its steps exits 1 with the injected errno;
    ``lease/J/worker`` is one whole lease, either the old one byte for byte (the error says
    it is unchanged and when it expires) or the new one (the error says until when it was
    renewed); no temp file stays, and the job stays claimed by the same holder."""
    world = make_world("one-pending")
    holder = str(os.getpid())
    claimed = world.q("claim", "--pid", holder, "--ttl", "300")
    assert claimed.rc == 0, claimed
    world.keep()
    lease = world.queue.dir / "lease" / JOB / "worker"
    before = lease.read_bytes()
    args = ["queue", "renew", "--project", PROJECT, JOB, "--pid", holder, "--ttl", "900"]
    step, run = inject_at(world, None, args, point.locate, point.code)
    line = error_line(run, point.code)
    now = json.loads(lease.read_text())
    if point.outcome == "unchanged":
        assert lease.read_bytes() == before, str(step)
        assert "unchanged" in line and json.loads(before)["expires_at"] in line, line
    else:
        assert lease.read_bytes() != before and f"renewed until {now['expires_at']}" in line, line
    assert now["pid"] == os.getpid(), now
    assert os.listdir(world.queue.dir / "inbox") == []
    shown = assert_status_agrees(world)
    assert shown["claimed"] == 1 and shown["incomplete"] == [], shown


# ------------------------------------------------------------------------------ finish


def _result_move(s: list[Step]) -> Step:
    return pick(s, "renameat2", ".result")


def _request_move(s: list[Step]) -> Step:
    return pick(s, "renameat2", after=_result_move(s))


FINISH_POINTS = [
    Point("write-result-ENOSPC", lambda s: pick(s, "write", after=pick(s, "openat", ".result.")),
          "ENOSPC", "claimed"),
    Point("sync-after-result-EIO", lambda s: pick(s, "fsync", after=_result_move(s)), "EIO",
          "result"),
    Point("request-move-EIO", _request_move, "EIO", "result"),
    Point("unlink-lease-EIO", lambda s: pick(s, "unlinkat", '"worker"'), "EIO", "leftover"),
    Point("last-sync-EIO", lambda s: [c for c in s if c.call == "fsync"][-1], "EIO", "done"),
]  # fmt: skip


@pytest.mark.parametrize("point", FINISH_POINTS, ids=str)
def test_a_finish_refused_at_each_step_is_completed_once_and_never_runs_again(point, make_world):
    """Q-4, Q-6, I-1, I-3, Q-7: ``ctx queue finish --ok`` refused at one of its steps exits 1
    with the injected errno.  Before the result is in ``done/`` the job stays claimed with no
    result anywhere and finishing it again completes it; after, the error names the
    incomplete pair and what completes it (finishing again with the same outcome, or
    ``recover --reconcile`` once the holder is gone).  Either way the job ends done with the
    one result the finish wrote, the queue is consistent, and nothing claims it again."""
    world = make_world("claimed")
    args = ["queue", "finish", "--project", PROJECT, "j", "--ok", "-"]
    body = json.dumps(OUTPUT)
    step, run = inject_at(world, "claimed", args, point.locate, point.code, body)
    line = error_line(run, point.code)
    found = on_disk(world)
    q = world.queue.dir
    assert os.listdir(q / "inbox") == [] and os.listdir(q / "failed") == [], str(step)
    if point.outcome == "claimed":
        assert found == {JOB: ["claimed"]} and run.out == "", (str(step), found, run)
        assert "stays claimed and no result of it was written" in line, line
        again = world.q("finish", "j", "--ok", "-", input=body)
        assert again.rc == 0, again
    elif point.outcome == "result":
        assert sorted(found[JOB]) == ["claimed", "result"], (str(step), found)
        assert "finishing it again with the same outcome completes it" in line, line
        assert [i["repair"] for i in assert_status_agrees(world)["incomplete"]] == ["roll-forward"]
        again = world.q("finish", "j", "--ok", "-", input=body)
        assert again.rc == 0, again
    elif point.outcome == "leftover":
        assert sorted(found[JOB]) == ["done", "result"], (str(step), found)
        assert "recover --reconcile" in line, line
        shown = assert_status_agrees(world)
        assert shown["done"] == 0 and [i["job"] for i in shown["incomplete"]] == [JOB], shown
    else:
        assert sorted(found[JOB]) == ["done", "result"] and "is done" in line, (str(step), line)
    assert_settled(world, {JOB: "done"})
    assert stored_result(world)["status"] == "ok" and stored_result(world)["output"] == OUTPUT
    assert world.q("claim").rc == 3


# ------------------------------------------------------------------------------ recover


def _requeue(s: list[Step]) -> Step:
    return pick(s, "renameat2", '"a.req.json"')


def _roll_forward(s: list[Step]) -> Step:
    return pick(s, "renameat2", '"b.req.json"')


RECOVER_POINTS = [
    Point("requeue-move-EIO", _requeue, "EIO", "a.req.json:left"),
    Point("requeue-cleanup-EIO", lambda s: pick(s, "unlinkat", '"worker"'), "EIO",
          "a.req.json:part"),
    Point("roll-forward-move-ENOSPC", _roll_forward, "ENOSPC", "b.req.json:left"),
]  # fmt: skip


@pytest.mark.parametrize("point", RECOVER_POINTS, ids=str)
def test_a_recover_refused_for_one_job_handles_the_others_and_the_next_run_completes(
    point, make_world
):
    """Q-5, Q-6, I-5: ``ctx queue recover --reconcile`` refused while it requeues one job or
    rolls another forward prints an ``error`` line for that job (its errno, and whether it
    was left as it is or stopped part-way), still handles the other job, says the queue is
    not consistent and exits 1; ``--json`` lists the error with its errno.  The next run
    completes it: a pending, b done with its one result, c pending."""
    world = make_world("leftovers")
    args = ["queue", "recover", "--project", PROJECT, "--reconcile", "--json"]
    _, run = inject_at(world, "leftovers", args, point.locate, point.code)
    assert run.rc == 1 and TRACEBACK not in run.err, run
    report = run.json()
    job, how = point.outcome.split(":")
    errors = report["errors"]
    assert [(e["job"], e["error"]) for e in errors] == [(job, point.code)], errors
    said = "left as it is" if how == "left" else "stopped part-way"
    assert said in errors[0]["detail"], errors
    assert report["consistent"] is False, report
    other = "b.req.json" if job == "a.req.json" else "a.req.json"
    handled = [e["job"] for e in report["requeued"] + report["repaired"]]
    assert other in handled, report
    settled = {"a.req.json": "pending", "b.req.json": "done", "c.req.json": "pending"}
    assert_settled(world, settled, twice=True)
    assert stored_result(world, "b.req.json")["output"] == OUTPUT


# ------------------------------------------------------------------------------ SIGKILL


@dataclass(frozen=True)
class Kill:
    name: str
    setup: str
    args: tuple[str, ...]
    locate: Callable[[list[Step]], Step]
    input: str = ""

    def __str__(self) -> str:
        return self.name


_PUBLISH = ("queue", "publish", "--project", PROJECT, "--name", "j", "-")
_FINISH = ("queue", "finish", "--project", PROJECT, "j", "--ok", "-")
_DEAD = "dead-pid"  # replaced by a pid that has exited
KILLS = [
    Kill("publish-before-move", "empty", _PUBLISH, _publish_move, REQUEST),
    Kill("batch-before-third-move", "empty", ("queue", "publish", "--project", PROJECT, "--batch",
         "-"), lambda s: pick(s, "renameat2", ".publish.tmp", skip=2), BATCH),
    Kill("claim-before-lease-move", "one-pending",
         ("queue", "claim", "--project", PROJECT, "--pid", _DEAD), _lease_move),
    Kill("finish-before-request-move", "claimed", _FINISH, _request_move, json.dumps(OUTPUT)),
    Kill("recover-mid-requeue", "leftovers",
         ("queue", "recover", "--project", PROJECT, "--reconcile"),
         lambda s: pick(s, "unlinkat", '"worker"')),
]  # fmt: skip


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("kill", KILLS, ids=str)
def test_a_queue_command_killed_at_a_step_leaves_what_recover_settles_with_nothing_lost(
    kill, make_world
):
    """I-1, I-2, I-3, Q-5, Q-6: a queue command SIGKILLed on entering one of its steps
    printed nothing (acknowledged nothing).  What it leaves is one of the documented crash
    leftovers, which ``ctx queue status --json`` shows (a temp file among ``temps``, an
    incomplete pair among ``incomplete``); plain ``recover`` changes nothing and reports the
    incomplete pair (exit 1); ``recover --reconcile`` then settles it with every job that
    reached ``pending/`` still there or done, each once, a result only beside its request,
    no temp file, and a second run has nothing to do.  A name held by a dead publisher's
    temp file is refused (EEXIST) until then, and free after."""
    world = make_world(kill.setup)
    args = [str(dead_pid()) if a == _DEAD else a for a in kill.args]
    _, run = inject_at(world, kill.setup, args, kill.locate, None, kill.input, key=kill.args)
    assert run.out == "", run
    before = on_disk(world)
    shown = assert_status_agrees(world)
    plain = world.q("recover")
    assert TRACEBACK not in plain.err, plain
    after_plain = on_disk(world)
    if shown["incomplete"]:
        assert plain.rc == 1 and "incomplete" in plain.out, plain
    assert after_plain == before, (plain, before, after_plain)
    expected = {
        "publish-before-move": {},
        "batch-before-third-move": {n: "pending" for n in before},
        "claim-before-lease-move": {JOB: "pending"},
        "finish-before-request-move": {JOB: "done"},
        "recover-mid-requeue": {
            "a.req.json": "pending", "b.req.json": "done", "c.req.json": "pending"},
    }[kill.name]  # fmt: skip
    if kill.name == "batch-before-third-move":
        assert len(before) == 2, before  # two moves made, nothing printed
    if kill.name == "publish-before-move":  # the staging name holds J until recover
        assert [t["job"] for t in shown["temps"]] == [JOB], shown
        blocked = world.q("publish", "--name", "j", "-", input=REQUEST)
        assert blocked.rc == 1 and "EEXIST" in blocked.err and "--reconcile" in blocked.err, blocked
    assert_settled(world, expected, twice=True)
    if kill.name == "publish-before-move":
        again = world.q("publish", "--name", "j", "-", input=REQUEST)
        assert again.rc == 0 and again.out == f"{JOB}\n", again
    if kill.setup == "claimed":
        assert stored_result(world)["output"] == OUTPUT


# ------------------------------------------------------------------------------ queue init


def _queue_dir_made(s: list[Step]) -> Step:
    return pick(s, "mkdirat", '"queue"')


@pytest.mark.parametrize(
    "point",
    [
        Point("mkdir-inbox-EDQUOT", lambda s: pick(s, "mkdirat", '"inbox"'), "EDQUOT", ""),
        Point("config-move-ENOSPC", lambda s: pick(s, "renameat2", "config"), "ENOSPC", ""),
    ],
    ids=str,
)
def test_a_queue_init_refused_says_what_it_made_and_the_same_command_completes(point, make_world):
    """X-1, Q-1, R-5: ``ctx queue init`` refused while it makes the space and its queue exits
    1 with the injected errno, naming the space, what it made (kept) and that running the
    command again completes it; queue commands meanwhile refuse with a remedy rather than
    work a half-made queue; the same init then completes and the queue works."""
    world = make_world("bare")
    args = ["queue", "init", "--project", "q"]
    _, run = inject_at(world, "bare", args, point.locate, point.code)
    line = error_line(run, point.code)
    assert_not_bare(line, str(world.root / "shared" / "q"))
    assert "could not be completed" in line and "again" in line, line
    looked = world.ctx("queue", "status", "--project", "q", "--json")
    assert looked.rc == 0 or ("ctx queue init" in looked.err and TRACEBACK not in looked.err)
    again = world.ctx("queue", "init", "--project", "q")
    assert again.rc == 0 and "ready" in again.out, again
    published = world.ctx("queue", "publish", "--project", "q", "-", input=REQUEST)
    assert published.rc == 0, published
    shown = world.ctx("queue", "status", "--project", "q", "--json")
    assert shown.rc == 0 and shown.json()["pending"] == 1, shown


def test_a_queue_init_whose_sync_fails_with_eio_names_the_space_and_what_to_do(make_world):
    """X-1, R-5, §2.4 (errors read ``ctx: ERRNO: what to do``): ``ctx queue init`` whose
    fsync of the new ``queue/`` directory reports EIO must say, as it does for ENOSPC at the
    same step, which space could not be completed, what was made and that running the
    command again completes it."""
    world = make_world("bare")
    args = ["queue", "init", "--project", "q"]

    def locate(steps: list[Step]) -> Step:
        return pick(steps, "fsync", after=_queue_dir_made(steps))

    _, enospc = inject_at(world, "bare", args, locate, "ENOSPC")
    assert "could not be completed" in error_line(enospc, "ENOSPC"), enospc
    _, run = inject_at(world, "bare", args, locate, "EIO")
    line = error_line(run, "EIO")
    again = world.ctx("queue", "init", "--project", "q")
    assert again.rc == 0, again
    assert_not_bare(line, str(world.root / "shared" / "q"))


def test_a_queue_init_refused_at_its_config_leaves_no_debris_once_it_completes(make_world):
    """X-1, R-5, Q-8: after ``ctx queue init`` is refused at the rename of its config (a
    refusal it handles, not a crash), the same init completes; the queue directory must then
    hold only ``config`` and the six state directories, or the leftover temp file must at
    least be named by ``init``, ``status`` or ``recover --reconcile``."""
    world = make_world("bare")
    args = ["queue", "init", "--project", "q"]
    _, run = inject_at(world, "bare", args, lambda s: pick(s, "renameat2", "config"), "ENOSPC")
    error_line(run, "ENOSPC")
    said = [world.ctx("queue", "init", "--project", "q")]
    said.append(world.ctx("queue", "status", "--project", "q"))
    said.append(world.ctx("queue", "recover", "--project", "q", "--reconcile", "--grace", "0"))
    assert all(r.rc == 0 for r in said), said
    queue = world.root / "shared" / "q" / "queue"
    extra = sorted(set(os.listdir(queue)) - {"config", *STATE_DIRS})
    mentioned = [n for n in extra if any(n in r.out + r.err for r in said)]
    assert extra == mentioned, (extra, said)


# ------------------------------------------------------------------------------ installs


_BOOTSTRAPPED: list[Path] = []


def bootstrap_template() -> Path:
    """A root ``ctx bootstrap`` made, once per test process."""
    if not _BOOTSTRAPPED:
        top = new_scratch_dir(TOP, "bootstrapped-")
        atexit.register(shutil.rmtree, top, True)
        world = World(top)
        done = world.ctx("bootstrap")
        assert done.rc == 0, done
        _BOOTSTRAPPED.append(world.root)
    return _BOOTSTRAPPED[0]


@pytest.fixture
def bootstrapped_world() -> Iterator[World]:
    world = World(new_scratch_dir(TOP, "b-"))
    copy_of_root(bootstrap_template(), world.root)
    world.keep()
    yield world
    shutil.rmtree(world.top, ignore_errors=True)


def hidden(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.startswith(".") and n != ".install-lock")


def listed(world: World, name: str) -> dict | None:
    shown = world.ctx("object", "list", "--json")
    assert shown.rc == 0, shown
    return {o["name"]: o for o in shown.json()}.get(name)


def install_command(world: World, command: str) -> tuple[list, str, str, Path]:
    """argv, standard input, object name and tier directory of a first install of a tool
    (``ctx object install``) or of an agent (``ctx agent create``)."""
    if command == "object-install":
        manifest = tool_manifest(world.top / "m", "demo", "#!/bin/sh\necho two\n")
        args = ["object", "install", manifest, "--tier", "system"]
        return args, "", "demo", world.root / "tool"
    request = json.dumps({"name": "ci2", "label": "ci2_t"})
    return ["agent", "create", "-"], request, "ci2", world.root / "agent"


def installed(world: World, command: str, name: str) -> dict | None:
    """How the listing shows ``name`` (None: not listed)."""
    listing = world.ctx("object" if command == "object-install" else "agent", "list", "--json")
    assert listing.rc == 0, listing
    return {o["name"]: o for o in listing.json()}.get(name)


@pytest.mark.parametrize("command", ["object-install", "agent-create"])
def test_an_install_whose_commit_is_refused_is_finished_by_the_same_command(command, make_world):
    """T-8, T-8a, A-3, R-5: a first ``ctx object install`` (or ``ctx agent create``) refused
    while it commits, on a disk that stays full (every rename from the swap of its controls
    on fails), exits 1 saying the commit was made, what is left and that running the same
    command again finishes it; the listing shows no damaged object meanwhile.  The same
    command then finishes it (an agent's then refuses with EEXIST, saying it finished the
    interrupted one), the object is listed whole and no staging is left."""
    world = make_world("bare")
    args, request, name, tier = install_command(world, command)
    _, run = inject_at(world, "bare", args, lambda s: pick(s, "renameat2", f'"{name}.d"'),
                       "ENOSPC", request, persist=True, key=(command,))  # fmt: skip
    line = error_line(run, "ENOSPC")
    assert "committed" in line and hidden(tier), line
    assert "running the same command again" in line and str(tier) in line, line
    shown = installed(world, command, name)
    assert shown is None or not shown["problems"], shown
    again = world.ctx(*args, input=request)
    if command == "object-install":
        assert again.rc == 0, again
        assert installed(world, command, name)["status"] == "available"
    else:
        assert again.rc == 1 and "EEXIST" in again.err and "finished" in again.err, again
        assert installed(world, command, name)["problems"] == []
    assert hidden(tier) == []


@pytest.mark.parametrize("command", ["object-install", "agent-create"])
def test_an_install_whose_last_sync_fails_does_not_say_nothing_was_installed(command, make_world):
    """T-8, A-3, R-5, §2.4: when only the last fsync of an install fails (after the commit
    marker was removed: the new tool or agent is in place, every earlier step synced), the
    install is complete and is reported so (exit 0), never as "nothing was installed",
    which would have the user create an agent that then exists (EEXIST)."""
    world = make_world("bare")
    args, request, name, _ = install_command(world, command)

    def last_sync(steps: list[Step]) -> Step:  # after the commit marker's removal
        return pick(steps, "fsync", after=pick(steps, "unlinkat", "~commit"))

    _, run = inject_at(world, "bare", args, last_sync, "EIO", request, key=(command,))
    assert run.rc == 0 and TRACEBACK not in run.err, run
    assert "nothing was installed" not in run.err + run.out, run
    made = installed(world, command, name)
    assert made is not None and not made["problems"], (run, made)
    if command == "agent-create":
        again = world.ctx(*args, input=request)
        assert again.rc == 1 and "EEXIST" in again.err, again


def test_a_repairing_bootstrap_whose_sync_fails_names_the_problem_and_the_next_completes_it(
    bootstrapped_world,
):
    """R-5, T-8, H-4: ``ctx bootstrap`` repairing a root that lost a core tool and the tsh
    configuration, whose fsync fails with EIO while it stages the tool, exits 1 naming the
    tool it left as it was (no traceback) and still makes what it could (the
    configuration); no listing shows a damaged tool; the next bootstrap makes the tool and
    says so, the one after has nothing to do, and the root holds what it held before the
    damage."""
    world = bootstrapped_world
    names_before = {str(p.relative_to(world.root)) for p in world.root.rglob("*")}
    shutil.rmtree(world.root / "tool" / "fs.read.d")
    (world.root / "tool" / "fs.read").unlink()
    (world.root / "tool" / "tsh.d" / "config").unlink()
    world.keep()

    def staging(steps: list[Step]) -> Step:
        return pick(steps, "fsync", after=pick(steps, "mkdirat", ".fs.read~"))

    _, run = inject_at(world, None, ["bootstrap"], staging, "EIO")
    line = error_line(run, "EIO")
    assert "tool/fs.read" in line and str(world.root) in line, line
    assert (world.root / "tool" / "tsh.d" / "config").is_file(), run
    shown = listed(world, "fs.read")
    assert shown is None or shown["status"] == "available", shown
    assert hidden(world.root / "tool") == [], hidden(world.root / "tool")
    rerun = world.ctx("bootstrap")
    assert rerun.rc == 0 and "created   tool/fs.read" in rerun.out, rerun
    again = world.ctx("bootstrap")
    assert again.rc == 0 and "nothing to do" in again.out, again
    names_after = {str(p.relative_to(world.root)) for p in world.root.rglob("*")}
    assert names_after == names_before, names_after ^ names_before


# ------------------------------------------------------------------------------ sessions


def _event_writes(steps: list[Step]) -> list[Step]:
    return [s for s in steps if s.call == "write" and s.text.startswith('write(') and
            '{\\"ts\\"' in s.text]  # fmt: skip


@needs_root
@pytest.mark.parametrize("where", ["tool_result-ENOSPC", "sync-EIO"])
def test_a_session_append_refused_keeps_whole_lines_and_says_what_was_not_recorded(
    where, make_world
):
    """S-5, S-2, T-7: ``ctx run`` whose append of the ``tool_result`` event fails with
    ENOSPC, or whose fsync of the session log fails with EIO, reports the call as an error
    naming ``events.jsonl`` (exit non-zero, the tool's output shown).  The log keeps whole
    lines only, ``ctx session show`` reads it, ``ctx session repair`` has nothing to cut,
    and the next call records both of its events."""
    world = make_world("bare")
    manifest = tool_manifest(world.top / "m", "demo", "#!/bin/sh\necho one\n")
    assert world.ctx("object", "install", manifest, "--tier", "system").rc == 0
    request = json.dumps({"name": AGENT, "label": LABEL, "tools": ["demo"]})
    made = world.ctx("agent", "create", "-", input=request)
    assert made.rc == 0, made
    with open(world.root / "tool" / "demo.d" / "policy", "a") as policy:
        policy.write(f"allow {LABEL} tool:demo execute\n")
    assert world.ctx("run", "--agent", AGENT, "demo").out == "one\n"
    world.keep()
    (events,) = world.root.glob(f"home/*/agent/{AGENT}/session/default/events.jsonl")
    before = events.read_bytes()
    args = ["run", "--agent", AGENT, "demo"]
    if where == "tool_result-ENOSPC":
        code = "ENOSPC"

        def locate(steps: list[Step]) -> Step:
            return _event_writes(steps)[1]
    else:
        code = "EIO"

        def locate(steps: list[Step]) -> Step:
            return pick(steps, "fsync", after=_event_writes(steps)[1])

    _, run = inject_at(world, None, args, locate, code)
    assert run.rc != 0 and TRACEBACK not in run.err, run
    line = next(x for x in run.err.splitlines() if x.startswith(f"ctx: {code}: "))
    assert "events.jsonl" in line, line
    data = events.read_bytes()
    assert data.startswith(before) and data.endswith(b"\n"), data[len(before) :]
    added = [json.loads(x) for x in data[len(before) :].splitlines()]
    if where == "tool_result-ENOSPC":
        assert [e["type"] for e in added] == ["tool_call"] and run.out == "one\n", run
    else:
        assert [e["type"] for e in added] == ["tool_call", "tool_result"], added
    shown = world.ctx("session", "show", AGENT, "default", "--json")
    assert shown.rc == 0 and TRACEBACK not in shown.err, shown
    repaired = world.ctx("session", "repair", AGENT, "default", "--json")
    assert repaired.rc == 0 and repaired.json()["truncated_bytes"] == 0, repaired
    call = world.ctx(*args)
    assert call.rc == 0, call
    last = [json.loads(x) for x in events.read_bytes().splitlines()][-2:]
    assert [e["type"] for e in last] == ["tool_call", "tool_result"], last
    assert last[0]["call"] == last[1]["call"], last
