"""Lease holders and workers in unusual process states (SPEC Q-3, Q-5, Q-6, §2.4, §3 W-1 to
W-4, I-3, I-4; docs/queue.md "Liveness", docs/workers.md "A lease taken away"): holders
stopped by SIGSTOP or SIGTSTP, held in a ptrace stop, frozen by the cgroup v2 freezer; holders
that have exited but are not reaped (zombies, for which ``kill(pid, 0)`` still succeeds); a pid
reused inside a pid namespace (``ns_last_pid``); a shell claim whose shell stops itself and
then exits unreaped; a claim orphaned before it ran, adopted by a subreaper; a claim stopped
under a tracer between its move and its lease; ``claim --pid`` and ``renew --pid`` naming a
zombie; a worker killed and left unreaped while its tool runs; a worker frozen past its lease
and thawed while another worker holds its job; a worker stopped with SIGTSTP past its lease
and continued before anyone recovered.  A non-root member's view of another user's stopped
and unreaped holders is covered too."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    QueueCLI,
    clean_env,
    new_scratch_dir,
    rfc3339,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.workercli import AGENT, shell_job
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage
from tests.support.users import run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
WAIT = 20.0

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="stops, traces and freezes other processes: needs root"
)

# ------------------------------------------------------------------------------ helpers


def now() -> datetime:
    return datetime.now(UTC)


def state_of(pid: int) -> str | None:
    """The one-letter state /proc gives process ``pid`` (``T`` stopped, ``t`` traced, ``Z``
    zombie, ...), or None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def is_zombie(pid: int) -> bool:
    return state_of(pid) == "Z"


def jobs_in(report: dict, key: str) -> list[str]:
    return sorted(entry["job"] for entry in report[key])


def until_past(stamp: str) -> None:
    expiry = rfc3339(stamp)
    assert wait_for(lambda: now() > expiry + timedelta(seconds=0.05), WAIT), stamp


def user_env(queue: QueueCLI, **extra: str) -> dict[str, str]:
    """A user's shell: the storage root, and the venv's ``ctx`` first on PATH."""
    path = f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return clean_env(CTX_STORAGE=str(queue.storage), PATH=path, **extra)


def holder_of(queue: QueueCLI, job: str) -> dict:
    """``show --json``'s verdict on J's lease holder (Q-5)."""
    shown = queue.run("show", job, "--json")
    assert shown.rc == 0, shown
    return shown.json()["holder"]


def exited_unreaped() -> subprocess.Popen:
    """A child that has exited and that nobody reaps yet: a zombie."""
    proc = subprocess.Popen(["sh", "-c", "exit 0"])
    assert wait_for(lambda: is_zombie(proc.pid), WAIT), state_of(proc.pid)
    return proc


@contextlib.contextmanager
def killed_at_end(*procs: subprocess.Popen) -> Iterator[None]:
    """Every process given is continued, killed and reaped on the way out."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
            with contextlib.suppress(Exception):
                proc.communicate(timeout=10)


@contextlib.contextmanager
def removed_at_end(path: Path) -> Iterator[None]:
    try:
        yield
    finally:
        shutil.rmtree(path, ignore_errors=True)


TRACER = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
pid = int(sys.argv[1])
if libc.ptrace(16, pid, None, None) != 0:  # PTRACE_ATTACH
    print("error", ctypes.get_errno(), flush=True)
    sys.exit(1)
os.waitpid(pid, 0x40000000)  # __WALL: the attach stop
print("attached", flush=True)
time.sleep(600)
"""


def ptrace_stopped(pid: int) -> subprocess.Popen:
    """A tracer holding ``pid`` in its attach stop (state ``t``) until the tracer ends."""
    tracer = subprocess.Popen(
        [sys.executable, "-c", TRACER, str(pid)], stdout=subprocess.PIPE, text=True
    )
    said = tracer.stdout.readline().strip()
    if said != "attached":
        tracer.kill()
        tracer.wait()
        pytest.skip(f"cannot ptrace here: {said}")
    assert wait_for(lambda: state_of(pid) == "t", WAIT), state_of(pid)
    return tracer


def cgroup2_root() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted, if anywhere."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        rest = fields[fields.index("-") + 1 :]
        if rest and rest[0] == "cgroup2":
            return Path(fields[4])
    return None


class Freezer:
    """A cgroup v2 group of its own whose members can be frozen (``cgroup.freeze``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def set(self, frozen: bool) -> None:
        (self.path / "cgroup.freeze").write_text("1\n" if frozen else "0\n")
        want = f"frozen {int(frozen)}"
        assert wait_for(lambda: want in (self.path / "cgroup.events").read_text(), WAIT)

    def procs(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]


@contextlib.contextmanager
def freezer() -> Iterator[Freezer | None]:
    """A new cgroup v2 group that supports freezing, or None where the machine allows none;
    on the way out its members are killed (``cgroup.kill``) and the group removed."""
    root = cgroup2_root()
    path = None if root is None else root / f"ctx-stopped-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()  # type: ignore[union-attr]
        if not (path / "cgroup.freeze").exists():
            raise OSError("no cgroup.freeze")
    except (OSError, AttributeError):
        if path is not None:
            with contextlib.suppress(OSError):
                path.rmdir()
        yield None
        return
    group = Freezer(path)
    try:
        yield group
    finally:
        with contextlib.suppress(OSError):
            group.set(False)
        with contextlib.suppress(OSError):
            (path / "cgroup.kill").write_text("1\n")
        wait_for(lambda: not group.procs(), WAIT)
        with contextlib.suppress(OSError):
            path.rmdir()


def gated_job(outbox: Path, tag: str) -> dict:
    """A job that notes each run in ``runs-TAG`` and its shell's pid in ``pid-TAG-k``, waits
    for ``go-TAG-k`` (run k), notes ``end-TAG-k`` and prints ``TAG-k``."""
    runs = outbox / f"runs-{tag}"
    return shell_job(
        f"echo run >> {runs}; k=$(wc -l < {runs}); echo $$ > {outbox}/pid-{tag}-$k; "
        f"until [ -e {outbox}/go-{tag}-$k ]; do sleep 0.05; done; "
        f"touch {outbox}/end-{tag}-$k; echo {tag}-$k"
    )


def runs_of(outbox: Path, tag: str) -> int:
    path = outbox / f"runs-{tag}"
    return len(path.read_text().split()) if path.exists() else 0


def start_worker(queue: QueueCLI, wid: str, *args: str, preexec=None) -> subprocess.Popen:
    """``ctx queue work --json --drain`` as agent ``ci`` with worker id ``wid``."""
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT]
    return subprocess.Popen(
        [*argv, "--json", "--drain", "--worker", wid, *args],
        env=user_env(queue),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec,
        # A group of its own beside the test's: a group whose members' parents are all
        # outside its session (the test's own, when its starter has exited) is orphaned, and
        # the kernel discards SIGTSTP sent to an orphaned group instead of stopping it.
        process_group=0,
    )


def events(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


# ------------------------------------------------------------------------------ holders


@needs_root
def test_stopped_traced_and_frozen_holders_are_alive_until_their_leases_expire(queue):
    """Q-5, Q-6, §2.4: four holders that exist but do not run — stopped by SIGSTOP, stopped
    by SIGTSTP, held in a ptrace stop, frozen by the cgroup v2 freezer (where the machine has
    one) — each hold a claim made with ``--pid`` and ``--ttl 3``.  While the leases run,
    ``show --json`` calls each holder alive, plain ``recover`` and ``recover --reconcile
    --grace 0`` leave every job untouched (exit 0, consistent), and ``claim`` finds nothing
    (exit 3, empty stdout).  Once the leases expired, with every holder still stopped, traced
    or frozen, ``show`` calls them gone (expired), ``--dry-run`` plans the requeues and changes
    nothing, and plain ``recover`` requeues every job (exit 0).  While alive, each holder's
    reason says that it does not run (stopped, stopped by its tracer, frozen) rather than
    "running"."""
    holders = {  # groups of their own: not orphaned, so SIGTSTP stops them (see start_worker)
        kind: subprocess.Popen(["sleep", "600"], process_group=0)
        for kind in ("stop", "tstp", "trace")
    }
    with freezer() as group, killed_at_end(*holders.values()):
        if group is not None:
            holders["frozen"] = subprocess.Popen(["sleep", "600"])
            group.add(holders["frozen"].pid)
            group.set(True)
        os.kill(holders["stop"].pid, signal.SIGSTOP)
        os.kill(holders["tstp"].pid, signal.SIGTSTP)
        tracer = ptrace_stopped(holders["trace"].pid)
        with killed_at_end(tracer):
            for kind in ("stop", "tstp"):
                assert wait_for(lambda k=kind: state_of(holders[k].pid) == "T", WAIT), kind
            states = {kind: state_of(proc.pid) for kind, proc in holders.items()}

            jobs: dict[str, str] = {}
            for kind, proc in holders.items():
                queue.publish(name=kind)
                took = queue.run(
                    "claim", "--pid", str(proc.pid), "--ttl", "3", "--worker", kind, "--json"
                )
                assert took.rc == 0 and took.err == "", took
                lease = took.json()["lease"]
                assert (lease["pid"], lease["worker"]) == (proc.pid, kind), lease
                assert lease["create_time"], lease  # a stopped process has its start time
                jobs[kind] = took.json()["name"]
            everything = sorted(jobs.values())

            for args in ((), ("--reconcile", "--grace", "0")):
                kept = queue.run("recover", "--json", *args)
                assert kept.rc == 0 and kept.json()["consistent"] is True, kept
                assert kept.json()["requeued"] == [], kept
                assert jobs_in(kept.json(), "untouched") == everything, kept
            # alive, and said not to run: a user waiting on the job learns why it does not move
            why = {
                "stop": "is stopped (SIGSTOP or job control)",
                "tstp": "is stopped (SIGSTOP or job control)",
                "trace": "is stopped by its tracer",
                "frozen": "is frozen (cgroup ",
            }
            for kind, job in jobs.items():
                verdict = holder_of(queue, job)
                assert verdict["state"] == "alive", (kind, verdict)
                assert f"pid {holders[kind].pid} on " in verdict["reason"], (kind, verdict)
                assert why[kind] in verdict["reason"], (kind, verdict)
                assert "or its lease expires at " in verdict["reason"], (kind, verdict)
            nothing = queue.run("claim", "--pid", str(os.getpid()))
            assert (nothing.rc, nothing.out) == (3, ""), nothing
            assert {kind: queue.state(job) for kind, job in jobs.items()} == dict.fromkeys(
                jobs, "claimed"
            )

            for job in jobs.values():
                until_past(queue.lease(job)["expires_at"])
            for kind, job in jobs.items():
                verdict = holder_of(queue, job)
                assert verdict["state"] == "gone", (kind, verdict)
                assert "expired" in verdict["reason"], (kind, verdict)
            before = snapshot(queue.dir)
            planned = queue.run("recover", "--dry-run", "--json")
            assert planned.rc == 0 and jobs_in(planned.json(), "requeued") == everything
            assert {e["applied"] for e in planned.json()["requeued"]} == {False}, planned
            assert snapshot(queue.dir) == before
            taken = queue.run("recover", "--json")
            assert taken.rc == 0 and taken.json()["consistent"] is True, taken
            assert jobs_in(taken.json(), "requeued") == everything, taken
            for entry in taken.json()["requeued"]:
                assert entry["applied"] is True and "expired" in entry["detail"], entry
            # the expiry, not the process, was the proof: every holder is as it was
            assert {kind: state_of(proc.pid) for kind, proc in holders.items()} == states
    assert {queue.state(job) for job in jobs.values()} == {"pending"}


def test_a_zombie_holder_is_gone_and_an_interrupted_finish_waits_for_it_to_die(queue):
    """Q-5 ("the pid is dead"), Q-6, I-5: a holder that has exited but is not reaped still
    answers ``kill(pid, 0)``.  Its claim (``--ttl 3600``) is judged gone (``show``: zombie) and
    plain ``recover`` requeues it at once, while it is still a zombie.  A finish cut short
    after its result (``done/J.result`` beside ``claimed/J/J``) whose holder is stopped is left
    by ``recover --reconcile`` (exit 1, incomplete, saying when it completes); once that holder
    is killed and left unreaped, ``--reconcile`` rolls the job forward (exit 0), and a second
    run changes nothing."""
    zombie_job = queue.publish(name="zombie")
    halted_job = queue.publish(name="halted")
    zombie = exited_unreaped()
    halted = subprocess.Popen(["sleep", "600"])
    with killed_at_end(zombie, halted):
        took = queue.run("claim", "--pid", str(zombie.pid), "--ttl", "3600", "--json")
        assert took.rc == 0 and took.json()["name"] == zombie_job, took
        assert queue.claim("--pid", str(halted.pid), "--ttl", "3600") == halted_job
        os.kill(halted.pid, signal.SIGSTOP)
        assert wait_for(lambda: state_of(halted.pid) == "T", WAIT)
        assert took.json()["lease"]["create_time"], took  # a zombie still has a start time
        verdict = holder_of(queue, zombie_job)
        assert verdict["state"] == "gone" and "zombie" in verdict["reason"], verdict
        requeued = queue.run("recover", "--json")
        assert requeued.rc == 0 and requeued.json()["consistent"] is True, requeued
        assert jobs_in(requeued.json(), "requeued") == [zombie_job], requeued
        assert jobs_in(requeued.json(), "untouched") == [halted_job], requeued
        assert "zombie" in requeued.json()["requeued"][0]["detail"], requeued
        assert is_zombie(zombie.pid)  # judged while unreaped
        assert queue.state(zombie_job) == "pending"
        assert queue.state(halted_job) == "claimed"

        outcome = {
            "status": "ok",
            "output": {"by": "halted"},
            "worker": {"id": "halted"},
            "started": "2026-06-22T12:00:00Z",
            "finished": "2026-06-22T12:00:01Z",
        }
        (queue.dir / "done" / f"{halted_job}.result").write_text(json.dumps(outcome))
        left = queue.run("recover", "--reconcile", "--json")
        assert left.rc == 1 and left.json()["consistent"] is False, left
        assert jobs_in(left.json(), "incomplete") == [halted_job], left
        detail = left.json()["incomplete"][0]["detail"]
        assert f"pid {halted.pid}" in detail and "expired" in detail, detail
        assert (queue.dir / "claimed" / halted_job / halted_job).is_file()

        os.kill(halted.pid, signal.SIGKILL)
        assert wait_for(lambda: is_zombie(halted.pid), WAIT)
        rolled = queue.run("recover", "--reconcile", "--json")
        assert rolled.rc == 0 and rolled.json()["consistent"] is True, rolled
        assert jobs_in(rolled.json(), "repaired") == [halted_job], rolled
        assert is_zombie(halted.pid)
        again = queue.run("recover", "--reconcile", "--json")
        assert again.rc == 0 and again.json()["repaired"] == [], again
    state, res = queue.only_result(halted_job)
    assert state == "done" and res["output"] == {"by": "halted"}, res
    assert queue.run("list", "--state", "pending").lines() == [zombie_job]


def test_claim_pid_of_a_zombie_says_its_lease_is_already_gone(queue):
    """§2.4 ``--pid``, Q-5: ``claim --pid`` of a pid that is not running notes on stderr that
    its lease is already gone and recover requeues the job (docs/queue.md).  A zombie has
    exited as much as a reaped process has (recover calls it gone at once), so a claim naming
    one is owed the same note."""
    job = queue.publish(name="to-a-zombie")
    zombie = exited_unreaped()
    with killed_at_end(zombie):
        took = queue.run("claim", "--pid", str(zombie.pid), "--ttl", "600")
        assert took.rc == 0 and took.lines() == [job], took
        assert holder_of(queue, job)["state"] == "gone"
        assert "note" in took.err and str(zombie.pid) in took.err, took


def test_renew_for_a_zombie_holder_is_not_a_silent_success(queue):
    """§2.4 ``renew``, Q-3, Q-5: a claim made for a live process, which then exits and is left
    unreaped.  ``renew --pid`` naming it extends a lease whose holder recover already calls
    gone: the next ``recover`` requeues the job regardless.  A user who renews is owed a
    refusal (exit 1) or at least a note, not a bare ``J leased until T`` and exit 0."""
    job = queue.publish(name="renewed-for-the-dead")
    holder = subprocess.Popen(["sh", "-c", "read line"], stdin=subprocess.PIPE)
    with killed_at_end(holder):
        assert queue.claim("--pid", str(holder.pid), "--ttl", "600") == job
        holder.stdin.close()
        assert wait_for(lambda: is_zombie(holder.pid), WAIT)
        renewed = queue.run("renew", job, "--pid", str(holder.pid), "--ttl", "900")
        gone = holder_of(queue, job)
        assert gone["state"] == "gone" and "zombie" in gone["reason"], gone
        assert renewed.rc == 1 or ("note" in renewed.err and str(holder.pid) in renewed.err), (
            renewed
        )


# ------------------------------------------------------------------------------ pid namespaces


def unshare_pid_ns() -> list[str]:
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot make a pid namespace here: {probe.stderr.strip()}")
    return ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]


REUSE = r"""
B=$1
sh -c 'ctx queue claim --project proj --ttl 600 --worker first > "$1/job"; echo $$ > "$1/pid"' \
    sh "$B"
J=$(cat "$B/job"); H=$(cat "$B/pid")
echo $((H - 1)) > /proc/sys/kernel/ns_last_pid || exit 98
sh -c '
  echo $$ > "$1/pid2"
  ctx queue show --project proj "$2" --json > "$1/show.json"
  ctx queue renew --project proj "$2" --ttl 900 --json > "$1/renew.out" 2> "$1/renew.err"
  echo $? > "$1/renew.rc"
  ctx queue recover --project proj --json > "$1/recover.json"; echo $? > "$1/recover.rc"
  ctx queue claim --project proj --ttl 600 --worker second --json > "$1/claim.json"
  echo "{\"by\": \"second\"}" | ctx queue finish --project proj "$2" --ok - > /dev/null
  echo $? > "$1/finish.rc"
' sh "$B" "$J"
"""


@needs_root
def test_a_pid_reused_inside_its_pid_namespace_is_not_the_holder(queue):
    """Q-3, Q-5 (same boot and pid namespace: a pid with another start time is proof), §2.4
    ``renew``: in a new pid namespace a shell claims (``--ttl 600``) and exits; the next process
    forked there is given the same pid (``ns_last_pid``).  That process is not the holder:
    ``show`` calls the holder gone (the pid now belongs to another process), its ``renew``
    from its own shell is refused with EACCES (exit 1, ``--json`` error object saying it is
    another process of that number), and ``recover`` there requeues the job (exit 0).  It
    then claims the job for itself, under a lease with its own start time, and finishes it
    once."""
    prefix = unshare_pid_ns()
    job = queue.publish(name="reused")
    box = new_scratch_dir(SCRATCH, "reuse")
    with removed_at_end(box):
        done = subprocess.run(
            [*prefix, "sh", "-c", REUSE, "sh", str(box)],
            env=user_env(queue),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (done.returncode, done.stderr)
        first, second = (int((box / name).read_text()) for name in ("pid", "pid2"))
        if first != second:
            pytest.skip(f"pid {first} was not handed out again (got {second})")
        shown = json.loads((box / "show.json").read_text())
        assert shown["lease"]["pid"] == first and shown["lease"]["worker"] == "first", shown
        assert shown["holder"]["state"] == "gone", shown
        assert "another process" in shown["holder"]["reason"], shown
        assert (box / "renew.rc").read_text().strip() == "1"
        refusal = json.loads((box / "renew.out").read_text())
        assert (refusal["error"], refusal["errno"]) == ("EACCES", 13), refusal
        assert "another process" in refusal["message"], refusal
        assert (box / "recover.rc").read_text().strip() == "0"
        report = json.loads((box / "recover.json").read_text())
        assert jobs_in(report, "requeued") == [job], report
        retaken = json.loads((box / "claim.json").read_text())
        assert retaken["name"] == job and retaken["lease"]["pid"] == first, retaken
        assert retaken["lease"]["worker"] == "second", retaken
        assert retaken["lease"]["create_time"] != shown["lease"]["create_time"], retaken
        assert (box / "finish.rc").read_text().strip() == "0"
    state, res = queue.only_result(job)
    assert state == "done" and res["output"] == {"by": "second"}, res
    assert res["worker"]["id"] == "second", res
    queue.assert_settled()


# ------------------------------------------------------------------------------ shell claims

STOPPING_SHELL = r"""
ctx queue claim --project proj --ttl 600 --worker sh > "$OUT/job"
kill -TSTP $$
ctx queue renew --project proj "$(cat "$OUT/job")" --json > "$OUT/renew.json"
echo $? > "$OUT/renew.rc"
"""


def test_a_shell_claim_lives_through_sigtstp_and_goes_with_the_shell_unreaped(queue, tmp_path):
    """§2.4 (a shell claim is leased to the shell), Q-5: a bash script claims (``--ttl 600``)
    and stops itself with SIGTSTP, as ^Z would.  Stopped, it is its lease's live holder:
    ``show`` calls it alive and ``recover`` leaves the job.  Continued, it renews its own lease
    (exit 0) and exits without finishing; not yet reaped, it is a zombie, and ``recover``
    requeues the job at once (exit 0) rather than waiting ten minutes for the expiry."""
    job = queue.publish(name="tstp")
    out = tmp_path / "out"
    out.mkdir()
    shell = subprocess.Popen(
        ["bash", "-c", STOPPING_SHELL],
        env=user_env(queue, OUT=str(out)),
        stdin=subprocess.DEVNULL,
        process_group=0,  # not orphaned, whoever started the test (see start_worker)
    )
    with killed_at_end(shell):
        assert wait_for(lambda: state_of(shell.pid) == "T", WAIT), state_of(shell.pid)
        assert (out / "job").read_text().strip() == job
        lease = queue.lease(job)
        assert (lease["pid"], lease["worker"]) == (shell.pid, "sh"), lease
        assert holder_of(queue, job)["state"] == "alive"
        kept = queue.run("recover", "--json")
        assert kept.rc == 0 and jobs_in(kept.json(), "untouched") == [job], kept

        os.kill(shell.pid, signal.SIGCONT)
        assert wait_for(lambda: is_zombie(shell.pid), WAIT), state_of(shell.pid)
        assert (out / "renew.rc").read_text().strip() == "0"
        renewed = json.loads((out / "renew.json").read_text())
        assert renewed["pid"] == shell.pid and renewed["renewed_at"], renewed
        assert rfc3339(renewed["expires_at"]) > now() + timedelta(minutes=5), renewed
        verdict = holder_of(queue, job)
        assert verdict["state"] == "gone" and "zombie" in verdict["reason"], verdict
        requeued = queue.run("recover", "--json")
        assert requeued.rc == 0 and jobs_in(requeued.json(), "requeued") == [job], requeued
    assert queue.state(job) == "pending"


SUBREAPER = r"""
import ctypes, os, subprocess, sys
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.exit(97)
out = sys.argv[1]
# The background subshell waits until the shell that started it is gone, then runs the claim:
# by then the subshell has been adopted by this subreaper.
starter = subprocess.Popen(["bash", "-c",
    '(while kill -0 $$ 2>/dev/null; do sleep 0.02; done; '
    'exec ctx queue claim --project proj --ttl 600 --json > "$1/claim.json" 2> "$1/claim.err") '
    '& exit 0', "bash", out])
starter.wait()
print(os.getpid(), flush=True)
sys.stdin.readline()
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        break
"""


def test_a_claim_orphaned_before_it_ran_leases_to_the_subreaper_that_adopted_it(queue, tmp_path):
    """§2.4, Q-5, docs/queue.md (``calling_process``: a command whose caller ended before it ran
    starts from the process that adopted it, a subreaper, and leases to it): a shell starts a
    claim in the background and exits first; the claim, adopted by a subreaper, leases to the
    subreaper (exit 0, no traceback).  ``recover`` leaves the job while the subreaper lives,
    and requeues it once the subreaper has exited and been reaped."""
    job = queue.publish(name="orphaned")
    reaper = subprocess.Popen(
        [sys.executable, "-c", SUBREAPER, str(tmp_path)],
        env=user_env(queue),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    with killed_at_end(reaper):
        line = reaper.stdout.readline().strip()
        assert line.isdigit(), (line, reaper.poll())
        assert wait_for(lambda: queue.state(job) == "claimed", WAIT)
        claim = tmp_path / "claim.json"
        assert wait_for(lambda: claim.exists() and claim.read_text().strip(), WAIT)
        took = json.loads(claim.read_text())
        assert took["name"] == job and took["lease"]["pid"] == reaper.pid, took
        assert "Traceback" not in (tmp_path / "claim.err").read_text()
        kept = queue.run("recover", "--json")
        assert kept.rc == 0 and jobs_in(kept.json(), "untouched") == [job], kept
        reaper.stdin.close()
        assert reaper.wait(timeout=WAIT) == 0
    requeued = queue.run("recover", "--json")
    assert requeued.rc == 0 and jobs_in(requeued.json(), "requeued") == [job], requeued


@needs_root
def test_a_claim_stopped_under_a_tracer_between_its_move_and_its_lease(queue, child):
    """Q-2, Q-3, Q-6, I-4, docs/queue.md (a claim holds ``claimed/J``'s lock until its lease
    exists): ``strace`` stops a claim with SIGSTOP right after its move to ``claimed/J/J``,
    before any lease.  Stopped and traced, it still holds the lock: plain ``recover`` and
    ``recover --reconcile --grace 0`` leave the job untouched (exit 0, consistent, nothing
    changed), and another claim finds nothing (exit 3, a note naming J).  Continued, the claim
    completes: it prints J alone, and the lease names the ``--pid`` holder.  A second claim
    stopped the same way and then killed leaves the claim without a lease, which plain
    ``recover`` reports (exit 1) and ``--reconcile`` returns to pending (exit 0)."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace")
    first = queue.publish(name="stopped-claim")
    second = queue.publish(name="killed-claim")

    def stopped_claim() -> subprocess.Popen:
        argv = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=renameat2"]
        argv += ["-e", "inject=renameat2:signal=SIGSTOP:when=1"]
        argv += [*CTX_ARGV, "queue", "claim", "--project", queue.project]
        proc = subprocess.Popen(
            [*argv, "--pid", str(child.pid), "--ttl", "600"],
            env=clean_env(CTX_STORAGE=str(queue.storage)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        return proc

    def claiming_pid(tracer: subprocess.Popen, job: str) -> int:
        """The claim's pid, once it is stopped with ``claimed/J/J`` made and no lease yet.
        A traced process shows ``t`` at every system call too, so the stop is the one that
        lasts: an unstopped claim makes its lease within milliseconds of its move."""
        found: list[int] = []

        def stopped_after_move() -> bool:
            kids = Path(f"/proc/{tracer.pid}/task/{tracer.pid}/children")
            found[:] = [int(p) for p in kids.read_text().split()] if kids.exists() else []
            return (
                bool(found)
                and state_of(found[0]) in ("t", "T")
                and (queue.dir / "claimed" / job / job).is_file()
            )

        assert wait_for(stopped_after_move, WAIT), (found, tracer.poll())
        time.sleep(0.5)
        assert state_of(found[0]) in ("t", "T")
        assert not (queue.dir / "lease" / job).exists()
        return found[0]

    tracer = stopped_claim()
    with killed_at_end(tracer):
        claimer = claiming_pid(tracer, first)
        before = snapshot(queue.dir)
        for args in ((), ("--reconcile", "--grace", "0")):
            left = queue.run("recover", "--json", *args)
            assert left.rc == 0 and left.json()["consistent"] is True, left
            assert jobs_in(left.json(), "untouched") == [first], left
            assert left.json()["requeued"] == left.json()["repaired"] == [], left
            assert "another process" in left.json()["untouched"][0]["detail"], left
        assert snapshot(queue.dir) == before
        queue.run("recover", "--reconcile", "--json")  # `second` stays pending: no change
        os.kill(claimer, signal.SIGCONT)
        out, err = tracer.communicate(timeout=WAIT)
    assert tracer.returncode == 0, err
    assert out == f"{first}\n", out
    assert queue.state(first) == "claimed"
    assert queue.lease(first)["pid"] == child.pid

    tracer = stopped_claim()
    with killed_at_end(tracer):
        claimer = claiming_pid(tracer, second)
        os.kill(claimer, signal.SIGKILL)
        tracer.communicate(timeout=WAIT)
    assert (queue.dir / "claimed" / second / second).is_file()
    assert not (queue.dir / "lease" / second).exists()
    plain = queue.run("recover", "--json")
    assert plain.rc == 1 and jobs_in(plain.json(), "incomplete") == [second], plain
    fixed = queue.run("recover", "--reconcile", "--json")
    assert fixed.rc == 0 and jobs_in(fixed.json(), "repaired") == [second], fixed
    assert queue.state(second) == "pending" and queue.state(first) == "claimed"


# ------------------------------------------------------------------------------ non-root member


def test_a_member_judges_another_users_stopped_and_unreaped_holders(unprivileged_user):
    """Q-5 ("dead" is the kernel's word: ``kill(pid, 0)`` answers EPERM for another user's
    process), Q-6: a queue a non-root user may work (its own directory, ``--queue``) holds two
    claims made for root's processes: one stopped, one exited and unreaped.  The user's
    ``recover`` keeps the stopped one (``kill`` says EPERM: it exists) and requeues the zombie
    (exit 0); the user's ``show`` agrees."""
    user = unprivileged_user
    home = new_scratch_dir(SCRATCH, "member")
    os.chown(home, user.uid, user.gid)
    qdir = home / "q"
    env = clean_env(HOME=str(home), XDG_CACHE_HOME=str(home / "cache"))

    def as_user(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return run_as(user, [*CTX_ARGV, "queue", *args, "--queue", str(qdir)], env=env, stdin=stdin)

    made = as_user("init")
    assert made.returncode == 0, made.stderr
    stopped = subprocess.Popen(["sleep", "600"])
    zombie = exited_unreaped()
    with killed_at_end(stopped, zombie), removed_at_end(home):
        os.kill(stopped.pid, signal.SIGSTOP)
        assert wait_for(lambda: state_of(stopped.pid) == "T", WAIT)
        jobs = {}
        for tag, proc in (("stopped", stopped), ("zombie", zombie)):
            put = as_user("publish", "--name", tag, "-", stdin='{"tool": "fs.read", "input": {}}')
            assert put.returncode == 0, put.stderr
            took = as_user("claim", "--pid", str(proc.pid), "--ttl", "600")
            assert took.returncode == 0, took.stderr
            jobs[tag] = took.stdout.strip()
        shown = {
            tag: json.loads(as_user("show", job, "--json").stdout) for tag, job in jobs.items()
        }
        assert shown["stopped"]["holder"]["state"] == "alive", shown
        assert shown["zombie"]["holder"]["state"] == "gone", shown
        done = as_user("recover", "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert jobs_in(report, "requeued") == [jobs["zombie"]], report
        assert jobs_in(report, "untouched") == [jobs["stopped"]], report
        assert (qdir / "pending" / jobs["zombie"]).is_file()
        assert (qdir / "claimed" / jobs["stopped"] / jobs["stopped"]).is_file()


# ------------------------------------------------------------------------------ workers


@needs_root
def test_a_worker_killed_and_left_unreaped_takes_its_tool_with_it_and_its_job_runs_again(
    queue, agent, outbox
):
    """W-1, W-3, Q-5, I-4, docs/workers.md (orphan guard): worker A (``--ttl 600``) runs a job
    that waits; A is SIGKILLed and its parent does not reap it.  A's tool is killed with it
    (the job's first run never ends), though A is a zombie that ``kill(pid, 0)`` still finds.
    ``show`` calls A gone (zombie) and plain ``recover`` requeues the job at once, ten minutes
    before the lease would expire.  Worker B runs it again and finishes it: one result, B's."""
    job = queue.publish(gated_job(outbox, "z"), name="z")
    a = start_worker(queue, "A", "--ttl", "600")
    b = None
    with killed_at_end(a):
        assert wait_for(lambda: (outbox / "pid-z-1").exists(), WAIT), a.poll()
        tool = int((outbox / "pid-z-1").read_text())
        assert queue.lease(job)["pid"] == a.pid
        os.kill(a.pid, signal.SIGKILL)
        assert wait_for(lambda: is_zombie(a.pid), WAIT)
        assert wait_for(lambda: state_of(tool) in (None, "Z"), WAIT), state_of(tool)
        verdict = holder_of(queue, job)
        assert verdict["state"] == "gone" and "zombie" in verdict["reason"], verdict
        requeued = queue.run("recover", "--json")
        assert requeued.rc == 0 and jobs_in(requeued.json(), "requeued") == [job], requeued
        assert is_zombie(a.pid)

        (outbox / "go-z-1").touch()  # the first run, were it alive, could end now
        (outbox / "go-z-2").touch()
        b = start_worker(queue, "B", "--ttl", "30")
        with killed_at_end(b):
            b_out, b_err = b.communicate(timeout=60)
    assert b.returncode == 0, b_err
    assert not (outbox / "end-z-1").exists()
    assert runs_of(outbox, "z") == 2
    state, res = queue.only_result(job)
    assert state == "done" and res["worker"]["id"] == "B", res
    assert "z-2" in json.dumps(res["output"]) and "z-1" not in json.dumps(res["output"]), res
    assert [e["job"] for e in events(b_out) if e.get("event") == "finish"] == [job]
    queue.assert_settled()


@needs_root
def test_a_frozen_worker_thawed_while_another_holds_its_job_never_touches_that_lease(
    queue, agent, outbox
):
    """Q-3 ("no other process renews leases"), Q-5, I-4, docs/workers.md: worker A (``--ttl
    1``) and its tool are frozen by the cgroup v2 freezer past A's lease; ``recover
    --reconcile`` requeues the job; worker B claims it and runs it again.  A is thawed while
    both runs still wait: over several of A's renewal rounds, B's lease stays byte for byte
    B's.  A's run then ends first: its finish is refused (the job is leased to B), A reports
    the job ``lost`` and exits 0, and the job keeps B's one result."""
    with freezer() as group:
        if group is None:
            pytest.skip("no cgroup v2 freezer here")
        job = queue.publish(gated_job(outbox, "f"), name="f")
        a = start_worker(queue, "A", "--ttl", "1", preexec=lambda: group.add(os.getpid()))
        with killed_at_end(a):
            assert wait_for(lambda: (outbox / "pid-f-1").exists(), WAIT), a.poll()
            group.set(True)
            until_past(queue.lease(job)["expires_at"])
            taken = queue.run("recover", "--reconcile", "--json")
            assert taken.rc == 0 and jobs_in(taken.json(), "requeued") == [job], taken

            b = start_worker(queue, "B", "--ttl", "30")
            with killed_at_end(b):
                assert wait_for(lambda: (outbox / "pid-f-2").exists(), WAIT), b.poll()
                held = (queue.dir / "lease" / job / "worker").read_bytes()
                assert json.loads(held)["worker"] == "B"
                group.set(False)
                deadline = time.monotonic() + 1.5  # over four of A's renewal rounds
                while time.monotonic() < deadline:
                    assert (queue.dir / "lease" / job / "worker").read_bytes() == held
                    time.sleep(0.05)
                assert holder_of(queue, job)["state"] == "alive"
                (outbox / "go-f-1").touch()
                a_out, a_err = a.communicate(timeout=60)
                assert (queue.dir / "lease" / job / "worker").read_bytes() == held
                assert queue.state(job) == "claimed"
                (outbox / "go-f-2").touch()
                b_out, b_err = b.communicate(timeout=60)
    assert a.returncode == 0, a_err
    assert b.returncode == 0, b_err
    assert [e["job"] for e in events(b_out) if e.get("event") == "finish"] == [job], b_out
    lost = [e for e in events(a_out) if e.get("event") == "lost"]
    assert [e["job"] for e in lost] == [job] and "EACCES" in json.dumps(lost[0]), a_out
    summary = events(a_out)[-1]
    assert summary["event"] == "stop" and summary["lost"] == 1, summary
    assert summary.get("done", 0) == 0, summary
    state, res = queue.only_result(job)
    assert state == "done" and res["worker"]["id"] == "B", res
    assert "f-2" in json.dumps(res["output"]) and "f-1" not in json.dumps(res), res
    queue.assert_settled()


@needs_root
def test_a_worker_stopped_by_sigtstp_past_its_lease_and_continued_before_recover_finishes(
    queue, agent, outbox
):
    """Q-3, Q-5, W-1, I-3: worker A (``--ttl 1``) is stopped with SIGTSTP (a terminal's ^Z)
    while its job waits.  Its lease lapses: ``show`` calls the holder gone (expired), but
    nobody recovers.  Continued, A renews its own lease (``show``: alive again, ``renewed_at``
    after the expiry), the job ends and A finishes it: done, run once, A's result, nothing
    lost."""
    job = queue.publish(gated_job(outbox, "t"), name="t")
    a = start_worker(queue, "A", "--ttl", "1")
    with killed_at_end(a):
        assert wait_for(lambda: (outbox / "pid-t-1").exists(), WAIT), a.poll()
        os.kill(a.pid, signal.SIGTSTP)
        assert wait_for(lambda: state_of(a.pid) == "T", WAIT), state_of(a.pid)
        lapsed = queue.lease(job)["expires_at"]
        until_past(lapsed)
        verdict = holder_of(queue, job)
        assert verdict["state"] == "gone" and "expired" in verdict["reason"], verdict
        os.kill(a.pid, signal.SIGCONT)

        def renewed() -> bool:
            lease = queue.lease(job)
            return rfc3339(lease.get("renewed_at", lapsed)) > rfc3339(lapsed)

        assert wait_for(renewed, WAIT), queue.lease(job)
        assert holder_of(queue, job)["state"] == "alive"
        (outbox / "go-t-1").touch()
        out, err = a.communicate(timeout=60)
    assert a.returncode == 0, err
    summary = events(out)[-1]
    assert summary["event"] == "stop" and summary.get("lost", 0) == 0, summary
    assert summary["done"] == 1, summary
    assert runs_of(outbox, "t") == 1
    state, res = queue.only_result(job)
    assert state == "done" and res["worker"]["id"] == "A" and "t-1" in json.dumps(res), res
    queue.assert_settled()
