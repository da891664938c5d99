"""End-to-end flows of a user whose interrupt lands at one exact moment of a ``ctx`` command
(SPEC §2.2 Q-1 … Q-7, §2.3 I-1 … I-5, §2.4, W-2, W-4, R-5, T-8, A-3, X-1, S-5; README "exit
statuses"; docs/queue.md "Ctrl-C (SIGINT) never stops a transition halfway"; docs/workers.md
"Signals").  Each command is traced once with strace, then run again from the same state with
strace's fault injection delivering SIGINT (Ctrl-C), SIGTERM, SIGHUP or SIGPIPE as it enters
one chosen system call (``renameat2``, ``renameat``, ``linkat``, ``mkdirat``, ``unlinkat``,
``fsync``, ``syncfs``, ``ftruncate``, ``openat`` with ``-P`` naming the directory).  A worker,
whose jobs run in a thread of their own, is held at the chosen call (``delay_enter``) and
signalled as a terminal or ``kill`` signals a process.

After each interrupt the user looks with the ordinary commands: Ctrl-C ends a command with
``ctx: EINTR: …`` and exit 130 once what was under way is complete and printed; SIGTERM and
SIGHUP end a command that does not take them as a shell reports that signal; a stray SIGPIPE
changes nothing; never a Python traceback; a job is in exactly one state, or in one that
``ctx queue recover --reconcile`` (or the same command run again) settles; a job is never
lost and never run twice; what a command leaves in a temp file is removed or reported; an
install, an agent, a space or a root is whole, or finished by ``ctx bootstrap``."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    clean_env,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.acceptance.workercli import allow_in_tool_policy, make_agent, shell_job
from tests.support.storage import copy_of_root
from tests.support.strace import (
    CALL_LINE,
    Step,
    can_inject,
    first_process_steps,
    pick,
    trace_lines,
)

pytestmark = pytest.mark.skipif(not can_inject(), reason="needs strace fault injection")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root")

TOP = scratch_top(__file__)
PROJECT = "proj"  # the queue the acceptance template holds
AGENT, LABEL = "ci", "ci_t"
REQUEST = json.dumps({"tool": "fs.stat", "input": {"path": "/ctx"}})
OUTPUT = json.dumps({"answer": 42})
TRACEBACK = "Traceback (most recent call last)"
# The calls a protocol step makes: an interrupt is delivered as one of them is entered.
STEP_CALLS = "renameat2,renameat,linkat,mkdirat,unlinkat,fsync,fchmod,ftruncate,syncfs"
# docs/queue.md: each state directory of a space's queue 02770, queue/ 03770; X-1's space.
SPACE_MODES = {
    "": 0o3770,
    "tool": 0o2750,
    "data": 0o2770,
    "agent": 0o3770,
    "queue": 0o3770,
    **{f"queue/{d}": 0o2770 for d in ("inbox", "pending", "lease", "claimed", "done", "failed")},
}


def as_in_a_terminal() -> None:
    """SIGINT's default disposition, as a shell gives the command it runs in the foreground
    (a test runner started in the background may have it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def killed_by(returncode: int, signum: int) -> bool:
    """What a shell reports as 128 + N: the process died of signal N, or exited 128 + N (strace
    ends itself with the signal its tracee died of)."""
    return returncode in (-signum, 128 + signum)


def assert_interrupted(run: Run) -> None:
    """Ctrl-C's end of a command: ``ctx: EINTR: …`` (after the line ^C leaves), exit 130."""
    assert run.rc == 130, run
    assert run.err.lstrip("\n").startswith("ctx: EINTR: interrupted (SIGINT)"), run
    assert TRACEBACK not in run.err, run


def assert_ended_by(run: Run, signum: int) -> None:
    if signum == signal.SIGINT:
        assert_interrupted(run)
    else:
        assert killed_by(run.rc, signum), run
        assert TRACEBACK not in run.err, run


# ------------------------------------------------------------------------------ tracing


class World:
    """A storage root, its cache directory and a saved copy to start every run from (the
    root keeps its path: ``bin/ctxterm`` names it)."""

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

    @property
    def qdir(self) -> Path:
        return self.queue.dir

    def run(self, argv: list[str], input: str | bytes = b"") -> Run:
        data = input.encode() if isinstance(input, str) else input
        proc = subprocess.run(argv, input=data, capture_output=True, env=self.env, timeout=120,
                              preexec_fn=as_in_a_terminal)  # fmt: skip
        shown = argv[len(CTX_ARGV) :] if argv[: len(CTX_ARGV)] == CTX_ARGV else argv
        return Run(shown, proc.returncode, proc.stdout.decode("utf-8", "replace"),
                   proc.stderr.decode("utf-8", "replace"))  # fmt: skip

    def ctx(self, *args, input: str | bytes = b"") -> Run:
        return self.run([*CTX_ARGV, *map(str, args)], input)

    def q(self, verb: str, *args, input: str | bytes = b"") -> Run:
        return self.ctx("queue", verb, "--project", PROJECT, *args, input=input)

    def keep(self) -> None:
        """The root (and cache) as they are now are where every later run starts from."""
        shutil.rmtree(self.saved, ignore_errors=True)
        self.saved.mkdir()
        for part in ("st", "cache"):
            if (self.top / part).exists():
                shutil.copytree(self.top / part, self.saved / part, symlinks=True)

    def reset(self) -> None:
        for part in ("st", "cache"):
            shutil.rmtree(self.top / part, ignore_errors=True)
            if (self.saved / part).exists():
                shutil.copytree(self.saved / part, self.top / part, symlinks=True)
        self.cache.mkdir(exist_ok=True)

    def steps(self, args, input: str | bytes = b"", calls: str = STEP_CALLS) -> list[Step]:
        """The ``calls`` ``ctx ARGS`` makes from the saved state (restored after), leaving out
        those outside the storage root (the claim-order hints in the cache)."""
        self.reset()
        trace = self.top / "reference.trace"
        done = self.run(["strace", "-f", "-qq", "-o", str(trace), "-e", f"trace={calls}",
                         *CTX_ARGV, *map(str, args)], input)  # fmt: skip
        assert done.rc == 0, done
        self.reset()
        return [s for s in first_process_steps(trace) if str(self.cache) not in s.text]

    def interrupt(self, args, step: Step, signum: int, input: str | bytes = b"",
                  path: Path | None = None, expect: str = "") -> Run:  # fmt: skip
        """``ctx ARGS`` from the saved state, sent ``signum`` as it enters ``step`` (the call
        is then made, and the signal acted on as it returns); ``path``: count only the calls
        on that path (strace ``-P``).  The trace must show the signal right after that very
        call (a traced one; one named only by its number must hold ``expect``)."""
        self.reset()
        trace = self.top / "interrupted.trace"
        name = signal.Signals(signum).name
        argv = ["strace", "-f", "-qq", "-o", str(trace)]
        if path is not None:
            argv += ["-P", str(path)]
        argv += [
            "-e",
            f"trace={step.call}",
            "-e",
            f"inject={step.call}:signal={name}:when={step.nth}",
        ]
        run = self.run([*argv, *CTX_ARGV, *map(str, args)], input)
        if signum != signal.SIGPIPE:  # ignored by the command: the kernel shows nothing of it
            lines = trace_lines(trace)
            hit = next((i for i, line in enumerate(lines) if f"--- {name} " in line), None)
            assert hit is not None and hit > 0, (str(step), lines[-5:], run)
            met = CALL_LINE.match(lines[hit - 1])
            assert met is not None, lines[hit - 1]
            seen = Step(met[2], step.nth, f"{met[2]}({met[3]}")
            assert seen.call == step.call and expect in seen.text, (str(step), str(seen))
            if step.text:
                assert seen.signature == step.signature, (str(step), str(seen))
        return run


_TEMPLATES: dict[str, Path] = {}


def template(kind: str, build: Callable[[World], None]) -> World:
    """A world of ``kind`` built once per test process by ``build``; a fresh copy each call."""
    if kind not in _TEMPLATES:
        top = new_scratch_dir(TOP, f"tpl-{kind}-")
        atexit.register(shutil.rmtree, top, True)
        world = World(top)
        build(world)
        world.keep()
        _TEMPLATES[kind] = top
    return World(_TEMPLATES[kind])


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    """A copy of the acceptance template (a bootstrapped root holding queue ``proj``), where
    every uid may search it."""
    top = new_scratch_dir(TOP, "w-")
    made = World(top)
    copy_of_root(_template, made.root)
    yield made
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def holder() -> Iterator[subprocess.Popen]:
    """A live process standing in for the shell that claims jobs; killed at teardown."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped): a lease holder that is gone."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def requests_once(queue: QueueCLI) -> dict[str, str]:
    """Every job with its one state; a job in two states (or none) fails the caller."""
    seen = queue.requests()
    assert all(len(states) == 1 for states in seen.values()), seen
    return {job: states[0] for job, states in seen.items()}


# ------------------------------------------------------------------------------ Ctrl-C, queue


def _transition(world: World, command: str, holder: subprocess.Popen) -> tuple[list, str]:
    """The command line and standard input of ``command`` on ``world``'s queue, set up so
    that it is the next thing to happen; the state kept."""
    if command in ("claim", "finish"):
        assert world.q("publish", "--name", "j1", "-", input=REQUEST).rc == 0
    if command == "finish":
        assert world.q("claim", "--pid", str(holder.pid)).rc == 0
    world.keep()
    return {
        "publish": (["queue", "publish", "--project", PROJECT, "--name", "j1", "-"], REQUEST),
        "batch": (["queue", "publish", "--project", PROJECT, "--batch", "-"],
                  (REQUEST + "\n") * 3),
        "claim": (["queue", "claim", "--project", PROJECT, "--pid", str(holder.pid)], ""),
        "finish": (["queue", "finish", "--project", PROJECT, "j1", "--ok", "-"], OUTPUT),
    }[command]  # fmt: skip


@pytest.mark.parametrize("command", ["batch", "claim", "finish"])
def test_ctrl_c_at_a_step_of_a_queue_transition_completes_it_prints_it_and_exits_130(
    command, world, holder
):
    """Q-1, Q-2, Q-3, Q-4, Q-7, I-1, I-2, §2.4 (docs/queue.md: "Ctrl-C (SIGINT) never stops a
    transition halfway: a claim, publish, finish … under way completes and prints what it
    did, and then the command ends with ``ctx: EINTR: …`` and exit 130"; a batch interrupted
    while its requests are written publishes nothing, once one moves all of them): SIGINT
    delivered as the command enters one of its system calls — a batch's syncfs (before any
    move) and its second move; a claim's move of the request (its lease not yet written)
    and the mkdir of its lease directory; a finish's move of the result (the request still
    claimed) and the removal of its lease — ends it with EINTR and 130, never a traceback,
    after the transition is whole and printed: no temp left in ``inbox/``, each job in
    exactly one state, a claim leased to its holder, a finish in ``done/``."""
    args, stdin = _transition(world, command, holder)
    # Two steps each, between the ones test_acceptance_interrupts takes (the protocol's named
    # steps, a single publish's among them).
    steps = world.steps(args, stdin)
    steps = {
        "batch": lambda: [pick(steps, "syncfs"), pick(steps, "renameat2", skip=1)],
        "claim": lambda: [pick(steps, "renameat2"), pick(steps, "mkdirat", skip=1)],
        "finish": lambda: [pick(steps, "renameat2"), pick(steps, "unlinkat", '"worker"')],
    }[command]()
    queue = world.queue
    for step in steps:
        where = str(step)
        run = world.interrupt(args, step, signal.SIGINT, stdin)
        assert_interrupted(run)
        states = requests_once(queue)
        assert queue.entries("inbox") == set(), where
        printed = run.lines()
        if command == "batch":
            # All three published and named, or none (before the first move) and no name.
            assert set(printed) == set(states) and len(states) in (0, 3), (where, run, states)
            assert all(s == "pending" for s in states.values()), (where, states)
            continue
        assert printed == ["j1.req.json"], (where, run)
        expected = {"claim": "claimed", "finish": "done"}[command]
        assert states == {"j1.req.json": expected}, (where, states)
        assert queue.state("j1.req.json") == expected, where
        if command == "claim":
            assert queue.lease("j1.req.json")["pid"] == holder.pid, where
        else:
            assert queue.entries("lease") == set() and queue.entries("claimed") == set(), where


def test_ctrl_c_during_a_renewal_prints_the_renewal_it_made(world, holder):
    """Q-3, §2.4 (docs/queue.md: "a claim, publish, finish, renewal or requeue under way
    completes and prints what it did, and then the command ends with ``ctx: EINTR: …``;
    what it printed is done"): SIGINT as ``ctx queue renew`` replaces the lease renews the
    lease — its ``expires_at`` moves on — and the command says so, ``J leased until T``,
    before its EINTR, leaving no temp in ``inbox/``."""
    assert world.q("publish", "--name", "j1", "-", input=REQUEST).rc == 0
    assert world.q("claim", "--pid", str(holder.pid), "--ttl", "60").rc == 0
    world.keep()
    before = world.queue.lease("j1.req.json")["expires_at"]
    args = ["queue", "renew", "--project", PROJECT, "j1", "--pid", str(holder.pid), "--ttl", "900"]
    # The renewal's one rename: its new lease over the old (no-replace would refuse).
    run = world.interrupt(args, Step("renameat", 1, ""), signal.SIGINT, expect='"worker"')
    assert_interrupted(run)
    lease = world.queue.lease("j1.req.json")
    assert lease["expires_at"] != before and world.queue.entries("inbox") == set()
    assert run.lines() == [f"j1.req.json leased until {lease['expires_at']}"], run


# ------------------------------------------------------------------------------ recover


def _leftovers(world: World, source: Path) -> None:
    """Four jobs to settle: a1, a2 claimed by a holder that has exited (requeued); b1
    claimed without a lease (back to pending); c1 whose finish died after its result moved
    (rolled forward to done); an orphan lease zz; a stale temp in ``inbox/``."""
    copy_of_root(source, world.root)
    for name in ("a1", "a2", "b1", "c1"):
        assert world.q("publish", "--name", name, "-", input=REQUEST).rc == 0
    gone = str(dead_pid())
    for name in ("a1", "a2", "b1", "c1"):
        claimed = world.q("claim", "--pid", gone)
        assert claimed.out.strip() == f"{name}.req.json", claimed
    q = world.qdir
    (q / "lease" / "b1.req.json" / "worker").unlink()
    (q / "lease" / "b1.req.json").rmdir()
    finish = [*CTX_ARGV, "queue", "finish", "--project", PROJECT, "c1", "--ok", "-"]
    killed = world.run(["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=renameat2",
                        "-e", "inject=renameat2:signal=KILL:when=2", *finish], OUTPUT)  # fmt: skip
    assert killed.rc == -9, killed
    assert (q / "done" / "c1.req.json.result").is_file() and (
        q / "claimed" / "c1.req.json"
    ).is_dir()
    (q / "lease" / "zz.req.json").mkdir()
    stale = q / "inbox" / "zz.req.json.publish.tmp"
    stale.write_text("{")
    os.utime(stale, (time.time() - 3600,) * 2)


@pytest.fixture
def leftovers(_template: Path) -> World:
    return template("leftovers", lambda world: _leftovers(world, _template))


RECONCILE = ["queue", "recover", "--project", PROJECT, "--reconcile"]
SETTLED = {
    **{f"a{n}.req.json": "pending" for n in (1, 2)},
    "b1.req.json": "pending",
    "c1.req.json": "done",
}


def moved_and_said(world: World, run: Run) -> tuple[set[str], set[str]]:
    """The jobs an interrupted reconcile has moved out of ``claimed/`` (every job is in one
    state), and those its ``requeue J`` and ``repair J`` lines name (the orphan lease ``zz``,
    which holds no job, left out)."""
    states = requests_once(world.queue)
    assert set(states) == set(SETTLED), states
    moved = {job for job, state in states.items() if state != "claimed"}
    said = {line.split()[1].rstrip(":") for line in run.lines() if line.split()[:1] in (
        ["requeue"], ["repair"])}  # fmt: skip
    return moved, said - {"zz.req.json"}


def test_ctrl_c_between_the_jobs_a_reconcile_repairs_names_those_moved_and_loses_none(
    leftovers,
):
    """Q-5, Q-6, I-1, I-5, §2.4 (docs/queue.md: "a … requeue under way completes and prints
    what it did, and then the command ends with ``ctx: EINTR: …`` and exit 130 …; what it
    printed is done"): ``ctx queue recover --reconcile`` with four jobs to settle,
    interrupted as it moves the second one back to pending and as it rolls the finished one
    forward, exits 130 with EINTR and no traceback, after naming each job it had moved (its
    ``requeue J`` and ``repair J`` lines); every job is then in exactly one state, none is
    lost; the next ``recover --reconcile`` settles the rest (exit 0, queue consistent), and
    the one after finds nothing to do."""
    world = leftovers
    # Jobs are settled in name order, one no-replace rename each: a1, a2, b1, c1.
    for step, job in ((Step("renameat2", 2, ""), "a2"), (Step("renameat2", 4, ""), "c1")):
        where = f"{step} ({job})"
        run = world.interrupt(RECONCILE, step, signal.SIGINT, expect=f'"{job}.req.json"')
        assert_interrupted(run)
        moved, said = moved_and_said(world, run)
        assert {"a1.req.json", "a2.req.json"} <= moved and said == moved, (where, run, moved)
        again = world.ctx(*RECONCILE)
        assert again.rc == 0 and "queue consistent" in again.out, (where, again)
        assert requests_once(world.queue) == SETTLED, where
        for sub in ("inbox", "claimed", "lease"):
            assert world.queue.entries(sub) == set(), (where, sub)
    last = world.ctx(*RECONCILE)
    assert last.lines()[-1].startswith("0 requeued, 0 repaired, 0 incomplete"), last


def test_a_reconcile_stopped_by_ctrl_c_at_its_temp_sweep_names_the_jobs_it_moved(leftovers):
    """Q-5, Q-6, §2.4 (docs/queue.md: "… requeue under way completes and prints what it did,
    and then the command ends with ``ctx: EINTR: …`` …; what it printed is done"): Ctrl-C as
    ``recover --reconcile`` removes the stale temp in ``inbox/`` — every one of its four jobs
    already requeued or rolled forward — ends it with EINTR and 130; its output must name
    those four jobs, or a user who reads "what it printed is done" takes the queue as
    untouched and the job it rolled forward as still claimed."""
    world = leftovers
    inbox = world.qdir / "inbox"
    sweep = Step("unlinkat", 1, "")
    run = world.interrupt(RECONCILE, sweep, signal.SIGINT, path=inbox, expect="publish.tmp")
    assert_interrupted(run)
    moved, said = moved_and_said(world, run)
    assert moved == set(SETTLED) and world.queue.entries("inbox") == set(), moved
    assert said == moved, run


# ------------------------------------------------------------------------------ SIGTERM, SIGHUP


@pytest.mark.parametrize(
    ("signum", "command"),
    [(signal.SIGHUP, "publish"), (signal.SIGTERM, "claim"), (signal.SIGHUP, "finish")],
    ids=["hup-publish", "term-claim", "hup-finish"],
)
def test_sigterm_or_sighup_at_a_queue_step_is_settled_by_recover_or_the_same_command(
    signum, command, world, holder
):
    """Q-1, Q-4, Q-5, Q-6, I-1, I-2, I-3 (README gives Ctrl-C its 130; SIGTERM and SIGHUP, from
    ``timeout`` or a closed terminal, end a queue command as a shell reports that signal;
    docs/queue.md "finish" step 1: a finish cut short after its result moved, asked for
    again with the same output, is completed): a ``publish`` stopped right after its temp
    file was synced leaves that temp, which ``ctx queue status`` lists, a second publish of
    the name refuses naming it and the ``recover --reconcile`` that removes it, and once it
    is removed the name publishes; a
    ``claim`` stopped as it moves the request leaves a claim without a lease, which plain
    ``recover`` reports (exit 1) and ``--reconcile`` puts back in pending; a ``finish``
    stopped as its result moves into ``done/`` is completed by the same ``finish`` run
    again.  No traceback, nothing printed, each job in one state at the end, run once."""
    args, stdin = _transition(world, command, holder)
    queue = world.queue
    step, expect = {
        "publish": (Step("fsync", 1, ""), ""),  # the temp file's data
        "claim": (Step("renameat2", 1, ""), '"j1.req.json"'),  # pending/J -> claimed/J/J
        "finish": (Step("renameat2", 1, ""), ".result"),  # the result into done/
    }[command]
    run = world.interrupt(args, step, signum, stdin, expect=expect)
    assert_ended_by(run, signum)
    assert run.out == "", run
    if command == "publish":
        temp = "inbox/j1.req.json.publish.tmp"
        assert queue.entries("inbox") == {"j1.req.json.publish.tmp"} and requests_once(queue) == {}
        temps = world.q("status", "--json").json()["temps"]
        assert [t["path"] for t in temps] == [temp], temps
        early = world.q("publish", "--name", "j1", "-", input=REQUEST)
        assert early.rc == 1 and "EEXIST" in early.err and temp in early.err, early
        assert "ctx queue recover --reconcile" in early.err, early
        swept = world.q("recover", "--reconcile", "--grace", "0")
        assert swept.rc == 0 and f"remove   {temp}" in swept.out, swept
        again = world.q("publish", "--name", "j1", "-", input=REQUEST)
        assert again.rc == 0, again
        assert requests_once(queue) == {"j1.req.json": "pending"}
    elif command == "claim":
        plain = world.q("recover")
        assert plain.rc == 1 and "incomplete j1.req.json" in plain.out, plain
        fixed = world.q("recover", "--reconcile")
        assert fixed.rc == 0, fixed
        assert requests_once(queue) == {"j1.req.json": "pending"}
        assert queue.entries("claimed") == set() and queue.entries("lease") == set()
    else:
        again = world.q("finish", "j1", "--ok", "-", input=OUTPUT)
        assert again.rc == 0 and again.out.strip() == "j1.req.json", again
        assert requests_once(queue) == {"j1.req.json": "done"}
        assert queue.entries("claimed") == set() and queue.entries("lease") == set()
        result = json.loads((queue.dir / "done" / "j1.req.json.result").read_text())
        assert result["output"] == json.loads(OUTPUT), result
    assert world.q("recover", "--dry-run").rc == 0


def test_a_stray_sigpipe_at_a_step_changes_nothing(world, holder):
    """Q-1, Q-2, Q-4, §2.4 (README: 141 only "when the reader of the output left"): a SIGPIPE
    that is no closed output — sent by another program, or the kernel's for a pipe of the
    command's own — entering a ``publish``, ``claim`` or ``finish`` at its first no-replace
    rename leaves each to complete as usual, exit 0 with its usual output."""
    world.keep()
    queue = world.queue
    publish = ["queue", "publish", "--project", PROJECT, "--name", "j1", "-"]
    claim = ["queue", "claim", "--project", PROJECT, "--pid", str(holder.pid)]
    finish = ["queue", "finish", "--project", PROJECT, "j1", "--ok", "-"]
    first_rename = Step("renameat2", 1, "")
    for args, stdin in ((publish, REQUEST), (claim, ""), (finish, OUTPUT)):
        run = world.interrupt(args, first_rename, signal.SIGPIPE, stdin)
        assert run.rc == 0 and run.lines() == ["j1.req.json"] and run.err == "", run
        world.keep()  # the next command starts from what this one did
    assert requests_once(queue) == {"j1.req.json": "done"}
    assert queue.entries("inbox") == queue.entries("claimed") == queue.entries("lease") == set()


# ------------------------------------------------------------------------------ spaces


@pytest.mark.parametrize(
    ("args", "made"),
    [
        (["queue", "init", "--project", "fresh"], "queue/inbox"),  # first made in queue/
        (["shared", "create", "fresh"], "data"),  # second made in the space, after tool/
    ],
    ids=["queue-init", "shared-create"],
)
def test_a_space_interrupted_between_mkdir_and_chmod_gets_its_modes_when_run_again(
    args, made, world
):
    """X-1, Q-1, §2.4 (docs/queue.md: a missing directory of a space is made "with the group
    the space has … and mode 02770 (``queue/`` 03770)"; the EINTR line: "check the rest and
    run it again if it is still wanted"): Ctrl-C just after ``ctx queue init --project
    fresh`` (or ``ctx shared create fresh``) made one of the new space's directories, before
    it set its mode, ends with EINTR and 130; the same command run again, as that line says,
    must leave every directory of the space with its mode — a ``queue/inbox`` of 2750 keeps
    every member of the group from publishing, a ``data/`` of 2750 from writing."""
    world.keep()
    space = world.root / "shared" / "fresh"
    where = space / made
    step = Step("mkdirat", 1 if made == "queue/inbox" else 2, "")
    run = world.interrupt(args, step, signal.SIGINT, path=where.parent, expect=f'"{where.name}"')
    assert_interrupted(run)
    again = world.ctx(*args)
    assert again.rc == 0 and TRACEBACK not in again.err, again
    modes = {rel: stat.S_IMODE((space / rel).lstat().st_mode) for rel in SPACE_MODES}
    wrong = {rel: oct(mode) for rel, mode in modes.items() if mode != SPACE_MODES[rel]}
    assert not wrong, (wrong, again)


# ------------------------------------------------------------------------------ tools, agents


def hidden(directory: Path) -> list[str]:
    """The hidden names an install leaves in a tier (its lock file aside)."""
    return sorted(n for n in os.listdir(directory) if n.startswith(".") and n != ".install-lock")


def assert_bootstrap_settles(world: World, where: str, always: bool = False) -> bool:
    """``ctx bootstrap`` has nothing to do, or names an interrupted install it finishes or
    discards; the next one has nothing to do.  Asked only when the interrupt left a hidden
    entry in a tier (a staging, a commit marker), unless ``always``; whether it was asked."""
    tiers = (world.root / "tool", world.root / "agent")
    if not always and not any(hidden(tier) for tier in tiers):
        return False
    first = world.ctx("bootstrap")
    assert first.rc == 0 and TRACEBACK not in first.err, (where, first)
    if "nothing to do" not in first.out:
        repaired = [line for line in first.lines()[1:] if line.strip()]
        assert repaired and all("interrupted" in line for line in repaired), (where, first)
        second = world.ctx("bootstrap")
        assert second.rc == 0 and "nothing to do" in second.out, (where, second)
    return True


INSTALL_STEPS = {
    # (call, a piece of its arguments, signal): the staging, the commit, the swap.  A signal
    # that kills the command comes while it stages: a commit marker left behind would make
    # every reader wait for it, 2 s (docs/tools.md).
    "install": [
        ("mkdirat", "~controls", signal.SIGINT),
        ("renameat2", "demo.d", signal.SIGINT),
    ],
    "reinstall": [
        ("linkat", '"policy"', signal.SIGTERM),
        ("renameat2", "RENAME_EXCHANGE", signal.SIGINT),
    ],
}


@pytest.mark.parametrize("kind", ["install", "reinstall"])
def test_an_install_interrupted_at_a_step_shows_one_whole_version_and_bootstrap_settles(
    kind, world, tmp_path
):
    """T-8, T-8a, R-5 (docs/tools.md: an install is whole or absent, a reinstall between its
    swaps is finished by ``ctx bootstrap``): ``ctx object install`` of a first version,
    interrupted by Ctrl-C as it stages its controls and as it commits them, and of a changed
    version over it, stopped by SIGTERM as it stages and by Ctrl-C as it swaps the new
    controls in, ends as that signal says without a traceback; ``ctx object list`` then
    shows ``demo`` absent or whole and available in one version, with its administrator's
    policy kept; ``ctx bootstrap`` has nothing to do or names the interrupted install it
    settles; the same install run again completes."""
    v1 = tool_manifest(tmp_path / "v1", "demo", "#!/bin/sh\necho one\n", description="one")
    v2 = tool_manifest(tmp_path / "v2", "demo", "#!/bin/sh\necho two\n", description="two")
    manifest = v1
    if kind == "reinstall":
        assert world.ctx("object", "install", v1, "--tier", "system").rc == 0
        with open(world.root / "tool" / "demo.d" / "policy", "a") as policy:
            policy.write(f"allow {LABEL} tool:demo execute\n")
        manifest = v2
    world.keep()
    args = ["object", "install", manifest, "--tier", "system"]
    steps = world.steps(args, calls="mkdirat,renameat2,renameat,linkat")
    tier = world.root / "tool"
    asked = False  # bootstrap is asked at least once, at the last step if not before
    for number, (call, contains, signum) in enumerate(INSTALL_STEPS[kind]):
        step = pick(steps, call, contains)
        where = str(step)
        run = world.interrupt(args, step, signum)
        assert_ended_by(run, signum)
        listed = {o["name"]: o for o in world.ctx("object", "list", "--json").json()}
        if kind == "install" and "demo" not in listed:
            assert not (tier / "demo").exists(), where
        else:
            demo = listed["demo"]
            assert demo["description"] in ("one", "two") and not demo["problems"], (where, demo)
            if not (tier / ".demo~commit").exists():
                assert demo["status"] == "available", (where, demo)
        if kind == "reinstall":
            policy = (tier / "demo.d" / "policy").read_text()
            assert f"allow {LABEL} tool:demo execute" in policy, where
        assert all(n.startswith(".demo~") for n in hidden(tier)), (where, hidden(tier))
        last = number == len(INSTALL_STEPS[kind]) - 1
        asked = assert_bootstrap_settles(world, where, always=last and not asked) or asked
        again = world.ctx(*args)
        assert again.rc == 0, (where, again)
        listed = {o["name"]: o for o in world.ctx("object", "list", "--json").json()}
        wanted = "one" if kind == "install" else "two"
        assert (listed["demo"]["status"], listed["demo"]["description"]) == ("available", wanted)
        assert hidden(tier) == [], where


@needs_root
def test_an_agent_create_stopped_as_it_commits_is_whole_finished_by_bootstrap_and_made_once(
    world,
):
    """A-3, R-5, S-3 (an agent is made as a tool is installed, staged and then committed
    under the ``agent/`` tier's install lock, docs/tools.md): ``ctx agent create`` stopped
    by SIGHUP (a closed terminal) as it renames its entry into place, its controls already
    committed, ends as a shell reports SIGHUP, without a traceback; ``ctx agent list`` shows
    ``ci`` whole; ``ctx bootstrap`` finishes the interrupted commit and says so, the next
    has nothing to do; the same command run again refuses with EEXIST and overwrites
    nothing; the agent's log holds one ``agent.created``."""
    world.keep()
    request = json.dumps({"name": AGENT, "label": LABEL, "tools": ["fs.stat"]})
    args = ["agent", "create", "-"]
    entry = Step("renameat", 1, "")  # the entry into place, the controls committed before
    run = world.interrupt(args, entry, signal.SIGHUP, request, expect=f'"{AGENT}"')
    assert_ended_by(run, signal.SIGHUP)
    listed = world.ctx("agent", "list", "--json").json()
    assert [a["name"] for a in listed] == [AGENT] and not listed[0]["problems"], listed
    agents = world.root / "agent"
    assert_bootstrap_settles(world, str(entry), always=True)
    assert hidden(agents) == [] and (agents / AGENT).exists()
    again = world.ctx(*args, input=request)
    assert again.rc == 1 and "EEXIST" in again.err, again
    log = (agents / f"{AGENT}.d" / "log").read_text()
    assert log.count('"agent.created"') == 1, log


@needs_root
def test_a_session_repair_interrupted_at_its_cut_leaves_whole_lines(world):
    """S-5, S-2 (docs/sessions.md: ``ctx session repair`` truncates a torn last line): Ctrl-C
    as ``ctx session repair`` syncs the file it has just cut, and SIGHUP as it cuts, leave
    ``events.jsonl`` as it was or with exactly the torn line cut, readable by ``ctx session
    show``; the repair run again leaves the whole lines."""
    request = json.dumps({"name": AGENT, "label": LABEL, "tools": ["fs.stat"]})
    made = world.ctx("agent", "create", "-", input=request)
    assert made.rc == 0, made
    allow_in_tool_policy(world.root, "fs.stat")
    call = world.ctx("run", "--agent", AGENT, "--session", "s1", "fs.stat", "/ctx")
    assert call.rc == 0, call
    uid = pwd.getpwnam("nobody").pw_uid
    events = world.root / "home" / str(uid) / "agent" / AGENT / "session" / "s1" / "events.jsonl"
    whole = events.read_bytes()
    torn = b'{"ts":"2026-12-01T00:00:00Z","type":"tool_call","agent":"ci","sess'
    with events.open("ab") as log:
        log.write(torn)
    world.keep()
    args = ["session", "repair", AGENT, "s1"]
    cut, synced = Step("ftruncate", 1, ""), Step("fsync", 1, "")  # on events.jsonl
    for step, signum in ((synced, signal.SIGINT), (cut, signal.SIGHUP)):
        where = f"{step} {signal.Signals(signum).name}"
        run = world.interrupt(args, step, signum, path=events)
        assert_ended_by(run, signum)
        assert events.read_bytes() in (whole, whole + torn), where
        shown = world.ctx("session", "show", AGENT, "s1", "--json")
        assert shown.rc == 0 and len(shown.lines()) == 2, (where, shown)  # call and result
        again = world.ctx(*args)
        assert again.rc == 0 and events.read_bytes() == whole, (where, again)


def test_a_new_root_whose_bootstrap_is_interrupted_is_completed_by_the_next():
    """R-5, D-1 (docs/tools.md: bootstrap finishes what an interrupted one left; a temp file of
    a write perhaps still in progress is named, and removed once old): ``ctx bootstrap`` of a
    new root interrupted by Ctrl-C just after it created the temp file of a manual page ends
    with EINTR and 130, without a traceback; the next bootstrap completes the root (every
    core tool listed available, the seven manual pages in place) and names the temp file
    still there, as the one after does, which has nothing else to do."""
    top = new_scratch_dir(TOP, "boot-")
    try:
        world = World(top)
        man = world.root / "shared" / "cortexfs-docs" / "man"
        third_page = Step("openat", 3, "")  # the third temp file made in man/
        run = world.interrupt(["bootstrap"], third_page, signal.SIGINT, path=man, expect=".tmp")
        assert_interrupted(run)
        rerun = world.ctx("bootstrap")
        assert rerun.rc == 0 and TRACEBACK not in rerun.err, rerun
        listed = world.ctx("object", "list", "--json").json()
        assert listed and all(o["status"] == "available" for o in listed), listed
        pages = sorted(p.name for p in man.iterdir() if not p.name.startswith("."))
        assert len(pages) == 7, pages
        left = [p.name for p in man.iterdir() if p.name.startswith(".")]
        last = world.ctx("bootstrap")
        assert last.rc == 0, last
        for name in left:  # named until a bootstrap removes it
            assert name in rerun.out and name in last.out, (name, rerun, last)
        others = [line for line in last.lines()[1:] if not any(n in line for n in left)]
        assert others == ([] if left else ["nothing to do: the storage root is complete"]), last
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------------------ the worker


def _worker_world(world: World, source: Path) -> None:
    copy_of_root(source, world.root)
    make_agent(world.root, ["shell.exec"])
    allow_in_tool_policy(world.root, "shell.exec")
    runs = world.top / "out"
    runs.mkdir(mode=0o777)
    runs.chmod(0o1777)
    for n in (1, 2, 3):
        job = json.dumps(shell_job(f"echo run{n} >> {runs}/runs"))
        assert world.q("publish", "--name", f"j{n}", "-", input=job).rc == 0


@pytest.fixture
def workshop(_template: Path) -> World:
    """Agent ``ci`` allowed ``shell.exec``; jobs j1, j2, j3 pending, each appending its name
    to ``out/runs`` (every uid may write there)."""
    made = template("workshop", lambda world: _worker_world(world, _template))
    made.reset()
    (made.top / "out" / "runs").unlink(missing_ok=True)
    return made


def runs_of(world: World) -> list[str]:
    runs = world.top / "out" / "runs"
    return runs.read_text().split() if runs.exists() else []


@dataclass
class Stopped:
    rc: int
    out: str
    err: str
    in_time: bool  # the step was still held when the last signal was sent

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.out.splitlines()]


HOLD = 800_000  # microseconds the job's thread is held at the chosen call


def the_worker(strace: subprocess.Popen) -> psutil.Process:
    """The ``ctx queue work`` process ``strace`` runs (not a helper strace forks to probe the
    kernel first)."""
    found: list[psutil.Process] = []

    def look() -> bool:
        for child in psutil.Process(strace.pid).children():
            with contextlib.suppress(psutil.Error):
                command = child.cmdline()  # strace's own until the exec
                if command and command[0] != "strace" and CTX_ARGV[0] in command:
                    found.append(child)
        return bool(found) or strace.poll() is not None

    assert wait_for(look, 30) and found, strace.poll()
    return found[0]


def held_worker(world: World, inject: str, ready: Callable[[], bool], *signals: int,
                path: Path | None = None, json_out: bool = True) -> Stopped:  # fmt: skip
    """``ctx queue work --drain`` whose job thread is held on entering the call ``inject``
    (``CALL:when=N``) names; once ``ready()`` says it is there, each of ``signals`` is sent to
    the worker's process, as a terminal's ^C or ``kill`` sends it."""
    call, when = inject.split(":")
    argv = ["strace", "-f", "-qq", "-o", "/dev/null"]
    argv += ["-P", str(path)] if path is not None else ["--seccomp-bpf"]
    argv += ["-e", f"trace={call}", "-e", f"inject={call}:delay_enter={HOLD}:{when}"]
    argv += [*CTX_ARGV, "queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain"]
    argv += ["--json"] if json_out else []
    proc = subprocess.Popen(argv, env=world.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=as_in_a_terminal)  # fmt: skip
    try:
        worker = the_worker(proc)
        if not wait_for(lambda: ready() or proc.poll() is not None, 30, 0.005) or not ready():
            out, err = proc.communicate(timeout=60)
            pytest.fail(
                f"the worker never reached the held step: exit {proc.returncode}\n{out}{err}"
            )
        for n, signum in enumerate(signals):
            if n:
                time.sleep(0.3)
            worker.send_signal(signum)
        in_time = ready()
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return Stopped(proc.returncode, out, err, in_time)


def _in_claim(world: World) -> bool:  # claimed/j1 made, the request not yet moved in
    return (world.qdir / "claimed" / "j1.req.json").is_dir() and (
        world.qdir / "pending" / "j1.req.json"
    ).exists()


def _in_request(world: World) -> bool:  # the result in done/, the request not yet
    q = world.qdir
    return (q / "done" / "j1.req.json.result").exists() and not (
        q / "done" / "j1.req.json"
    ).exists()


MOMENTS = {
    "claim": ("renameat2:when=1", _in_claim),  # pending/J -> claimed/J/J
    "request": ("renameat2:when=4", _in_request),  # the request into done/ (Q-4 step 3)
}


@needs_root
@pytest.mark.parametrize(
    ("moment", "signum"),
    [("claim", signal.SIGINT), ("request", signal.SIGHUP)],
    ids=["int-at-claim", "hup-at-request"],
)
def test_a_worker_signalled_at_a_step_of_its_job_finishes_that_job_once_and_claims_no_more(
    moment, signum, workshop
):
    """W-2, W-4, I-3, I-4, Q-2, Q-4 (docs/workers.md "Signals": "SIGTERM, SIGHUP … or a first
    ^C: stop claiming; running jobs finish (or time out); exit 0. The stop event's
    stopped_by names the signal"): a ``ctx queue work --drain`` with three jobs, stopped
    while its job thread is at the claim's move of the first or at its request's move into
    ``done/``, finishes that job in ``done/`` (its tool run once), claims no other, exits 0
    with a ``stop`` event naming the signal (and an ``interrupt`` event for ^C), no
    traceback; the other two stay pending and nothing is left to recover."""
    world = workshop
    inject, ready = MOMENTS[moment]
    stopped = held_worker(world, inject, lambda: ready(world), signum)
    assert stopped.in_time, "the signal came after the held step"
    assert stopped.rc == 0 and TRACEBACK not in stopped.err, stopped
    events = stopped.events()
    stop = events[-1]
    assert stop["event"] == "stop" and stop["stopped_by"] == signal.Signals(signum).name, events
    assert (stop["done"], stop["failed"], stop["lost"], stop["aborted"]) == (1, 0, 0, False)
    assert [e["job"] for e in events if e["event"] == "claim"] == ["j1.req.json"], events
    if signum == signal.SIGINT:
        assert any(e["event"] == "interrupt" for e in events), events
    assert runs_of(world) == ["run1"]
    assert requests_once(world.queue) == {
        "j1.req.json": "done",
        "j2.req.json": "pending",
        "j3.req.json": "pending",
    }
    for sub in ("inbox", "claimed", "lease"):
        assert world.queue.entries(sub) == set(), sub
    dry = world.q("recover", "--dry-run")
    assert dry.rc == 0 and "queue consistent" in dry.out, dry


@needs_root
@pytest.mark.parametrize("moment", ["claim", "request"])
def test_ctrl_c_twice_inside_a_workers_claim_or_finish_leaves_no_transition_halfway(
    moment, workshop
):
    """Q-2, Q-4, Q-6, W-4 (docs/queue.md: "Ctrl-C (SIGINT) never stops a transition halfway:
    a claim, publish, finish … under way completes"; docs/workers.md: a second ^C aborts, "the
    worker exits 130 without finishing their jobs. Their leases name a process that no
    longer exists, so ``ctx queue recover`` puts them back in pending/"): two ^C while the
    worker's job thread is inside the claim of the first job (``claimed/J`` made, the
    request not yet moved into it) or inside its finish (the result in ``done/``, the
    request not yet): the worker exits 130 without a traceback, and the transition it was
    making is whole — ``ctx queue status`` finds no incomplete pair and plain ``ctx queue
    recover`` exits 0, each job in one state."""
    world = workshop
    inject, ready = MOMENTS[moment]
    stopped = held_worker(world, inject, lambda: ready(world), signal.SIGINT, signal.SIGINT)
    assert stopped.in_time, "the signals came after the held step"
    assert stopped.rc == 130 and TRACEBACK not in stopped.err, stopped
    states = requests_once(world.queue)
    assert states["j2.req.json"] == states["j3.req.json"] == "pending", states
    incomplete = world.q("status", "--json").json()["incomplete"]
    plain = world.q("recover")
    assert incomplete == [] and plain.rc == 0, (incomplete, plain)


@needs_root
def test_ctrl_c_twice_after_a_jobs_tool_ended_finishes_the_job_or_names_what_is_left(workshop):
    """W-4, I-3, S-2 (docs/workers.md: a second ^C aborts, "running tools are killed, the worker
    exits 130 without finishing their jobs. Their leases name a process that no longer
    exists, so ``ctx queue recover`` puts them back in pending/"; the worker's error stops
    that leave a job claimed name it and that recover): two ^C that land after the first job's
    tool exited 0 — its ``tool_result`` ok in the session — and before its finish began kill
    no running tool; the worker exits 130, but the job must either be finished (its outcome
    is known) or be named as left claimed with the ``ctx queue recover`` that settles it.
    Left silently, the operator reads ``0 done, 0 failed … (aborted)``, other workers pass
    the job over until someone runs recover, and recover then runs it a second time."""
    world = workshop
    uid = pwd.getpwnam("nobody").pw_uid
    events = (
        world.root / "home" / str(uid) / "agent" / AGENT / "session" / "worker" / "events.jsonl"
    )

    def between_call_and_finish() -> bool:
        finishing = (world.qdir / "done" / "j1.req.json.result").exists() or any(
            n.startswith("j1.req.json.result.") for n in os.listdir(world.qdir / "inbox")
        )
        return events.exists() and '"tool_result"' in events.read_text() and not finishing

    # The job thread's fsyncs of its session: the claim's record, then the call's result.
    stopped = held_worker(world, "fsync:when=2", between_call_and_finish, signal.SIGINT,
                          signal.SIGINT, path=events, json_out=False)  # fmt: skip
    assert stopped.in_time, "the signals came after the held step"
    assert stopped.rc == 130 and TRACEBACK not in stopped.err, stopped
    assert runs_of(world) == ["run1"]
    said = stopped.out + stopped.err
    named = "j1.req.json" in said and "ctx queue recover" in said
    left = requests_once(world.queue)
    assert left["j1.req.json"] == "done" or named, (stopped, left)


@needs_root
@pytest.mark.parametrize(
    "signum",
    [signal.SIGTERM, signal.SIGINT],
    ids=["term", "int"],
)
def test_a_worker_stopped_while_it_makes_its_session_starts_nothing_and_leaves_it_whole(
    signum, workshop
):
    """W-4, S-1, S-5 (docs/workers.md "Signals": SIGTERM, SIGHUP or a first ^C stop a worker,
    exit 0; "While it starts the same holds … A worker stopped then does not start: it
    claims nothing, says ``ctx: stopped by SIGTERM while starting; no job was claimed`` …
    and exits 0. What startup was doing when the signal came is finished first (a session is
    never left half made)"): the signal delivered as ``ctx queue work`` makes its session's
    directory: exit 0, that line, nothing claimed; ``ctx session show`` reads the session (or
    there is none)."""
    world = workshop
    uid = pwd.getpwnam("nobody").pw_uid
    sessions = world.root / "home" / str(uid) / "agent" / AGENT / "session"
    args = ["queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain"]
    run = world.interrupt(args, Step("mkdirat", 1, ""), signum, path=sessions,
                          expect='"worker"')  # fmt: skip
    assert TRACEBACK not in run.err, run
    assert requests_once(world.queue) == {f"j{n}.req.json": "pending" for n in (1, 2, 3)}
    assert runs_of(world) == []
    assert run.rc == 0, run
    name = signal.Signals(signum).name
    assert f"stopped by {name} while starting; no job was claimed" in run.err, run
    if (sessions / "worker").exists():
        shown = world.ctx("session", "show", AGENT, "worker")
        assert shown.rc == 0, shown
