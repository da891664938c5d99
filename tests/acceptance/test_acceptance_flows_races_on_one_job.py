"""Queue commands racing on one job (SPEC Q-1..Q-6, I-1..I-5, §2.4; docs/queue.md): real
``ctx queue ...`` processes held at one FIFO barrier and released together, round after round,
every command of a round aimed at the same job J.  Pairs and triples: two finishes (same
outcome and output, same outcome with other outputs, other outcomes), finish against
``recover --reconcile`` (holder dead, lease expired, holder alive), renew against recover and
against finish, claims against the recover that requeues the job they want, a publish of the
name J against finish and recover, two reconciles at once, and ``show``/``status``/``list``
reading J while those run.

After each round J's evidence is checked against §2.1 and §2.3: J in exactly one state (I-1),
never both done and failed, never pending after a finish that succeeded (I-3), claimed only by
the one claim that said so (I-4), no piece of J left over and nothing for a later ``recover``
to do (I-5); exit statuses are those of §2.4 (0, 1, 3), and whatever a command says on stderr
is a ``ctx: ERRNO: ...`` (or ``ctx: note:``) line, never a traceback."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    alive,
    rfc3339,
    scratch_top,
    wait_for,
)

SCRATCH = scratch_top(__file__)
TRACEBACK = "Traceback (most recent call last)"
# Each racer opens the FIFO (blocking until the test opens its other end), then blocks in
# ``read`` until the test closes it: every racer is released by one close.
BARRIER = 'read _ < "$0"; exec "$@"'
ERROR_LINE = re.compile(r"ctx: (?:[A-Z][A-Z0-9]+|note|warning): \S")
TERMINAL = ("done", "failed")

# ------------------------------------------------------------------------------ helpers


@dataclass
class Done:
    """What one racing command did."""

    argv: list[str]
    rc: int
    out: str
    err: str

    def __repr__(self) -> str:
        command = " ".join(self.argv)
        return f"$ {command}\nexit {self.rc}\nstdout: {self.out!r}\nstderr: {self.err!r}"

    def json(self):
        return json.loads(self.out)


def holding(pid: int, fifo: Path) -> bool:
    """Whether process ``pid`` has ``fifo`` open."""
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == str(fifo):
                    return True
    return False


def race(
    queue: QueueCLI, commands: Sequence[Sequence[str]], inputs: Sequence[str] | None = None
) -> list[Done]:
    """Every ``ctx queue COMMAND --project P ARGS`` of ``commands`` (each given as ``(COMMAND,
    *ARGS)``) started, held at a FIFO until all of them wait there, released together, and
    waited for."""
    SCRATCH.mkdir(mode=0o755, exist_ok=True)
    where = Path(tempfile.mkdtemp(dir=SCRATCH))
    fifo = where / "go"
    os.mkfifo(fifo)
    inputs = inputs or [""] * len(commands)
    procs: list[subprocess.Popen] = []
    argvs = [["queue", c[0], "--project", queue.project, *c[1:]] for c in commands]
    writer = None
    try:
        for argv, text in zip(argvs, inputs, strict=True):
            proc = subprocess.Popen(
                ["sh", "-c", BARRIER, str(fifo), *CTX_ARGV, *argv],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=queue_env(queue),
                text=True,
                start_new_session=True,
            )
            procs.append(proc)
            proc.stdin.write(text or "")
            proc.stdin.close()
            proc.stdin = None  # given whole before the barrier opens
        deadline = time.monotonic() + 20
        while writer is None:
            try:
                writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no racer has opened it yet
                assert time.monotonic() < deadline, "no racer reached the barrier"
                time.sleep(0.002)
        assert wait_for(lambda: all(holding(p.pid, fifo) for p in procs), 20, 0.002)
        os.close(writer)
        writer = None
        done = []
        for argv, proc in zip(argvs, procs, strict=True):
            out, err = proc.communicate(timeout=60)
            done.append(Done(["ctx", *argv], proc.returncode, out, err))
        for run in done:
            said_properly(run)
        return done
    finally:
        if writer is not None:
            os.close(writer)
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(where, ignore_errors=True)


def queue_env(queue: QueueCLI) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CTX_")}
    env["CTX_STORAGE"] = str(queue.storage)
    return env


def said_properly(run: Done) -> None:
    """§2.4: exit 0, 1 or 3 (claim), never a traceback; every line on stderr a ``ctx:`` line,
    and a failure's first one ``ctx: ERRNO: ...``."""
    assert TRACEBACK not in run.err and TRACEBACK not in run.out, run
    assert run.rc in (0, 1, 3), run
    lines = run.err.splitlines()
    assert all(ERROR_LINE.match(line) for line in lines), run
    if run.rc == 1 and run.argv[2] not in ("recover", "status", "list"):
        # (their exit 1 says what they found: an incomplete pair, a conflict)
        assert any(re.match(r"ctx: [A-Z][A-Z0-9]+: ", line) for line in lines), run


def errno_of(run: Done) -> str:
    found = re.search(r"ctx: ([A-Z][A-Z0-9]+): ", run.err)
    assert found, run
    return found.group(1)


def where(queue: QueueCLI, job: str) -> str:
    """The one state J is in, every piece of its evidence complete and nothing else of it left
    (I-1, Q-6): ``pending``, ``claimed``, ``done`` or ``failed``."""
    d = queue.dir
    requests = [s for s in ("pending", *TERMINAL) if (d / s / job).is_file()]
    if (d / "claimed" / job / job).is_file():
        requests.append("claimed")
    results = [s for s in TERMINAL if (d / s / f"{job}.result").exists()]
    assert len(requests) == 1, (job, requests, results, evidence(queue, job))
    state = requests[0]
    if state in TERMINAL:
        assert results == [state], (job, state, results)
        assert not (d / "claimed" / job).exists(), evidence(queue, job)
        assert not (d / "lease" / job).exists(), evidence(queue, job)
    else:
        assert results == [], (job, state, results)
    if state == "claimed":
        assert (d / "lease" / job / "worker").is_file(), evidence(queue, job)
        assert os.listdir(d / "claimed" / job) == [job], evidence(queue, job)
        assert os.listdir(d / "lease" / job) == ["worker"], evidence(queue, job)
    if state == "pending":
        assert not (d / "claimed" / job).exists(), evidence(queue, job)
        assert not (d / "lease" / job).exists(), evidence(queue, job)
    temps = [n for n in os.listdir(d / "inbox") if n.startswith(job)]
    assert temps == [], (job, temps)
    return state


def evidence(queue: QueueCLI, job: str) -> list[str]:
    """Every entry of J's in the queue (for a failure's message)."""
    found = []
    for top, dirs, files in os.walk(queue.dir):
        for name in dirs + files:
            rel = str(Path(top, name).relative_to(queue.dir))
            if job in rel:
                found.append(rel)
    return sorted(found)


def result_of(queue: QueueCLI, job: str, state: str) -> dict:
    return json.loads((queue.dir / state / f"{job}.result").read_text())


def batch(queue: QueueCLI, count: int) -> set[str]:
    """``count`` jobs published in one ``publish --batch``; their names."""
    lines = "".join(
        json.dumps({"tool": "fs.read", "input": {"path": "README.md"}, "n": i}) + "\n"
        for i in range(count)
    )
    r = queue.run("publish", "--batch", "-", input=lines)
    assert r.rc == 0 and len(r.lines()) == count, r
    return set(r.lines())


def claim_for(queue: QueueCLI, pid: int, *args: str) -> str:
    """The job ``ctx queue claim --pid PID ARGS`` claims (there must be one)."""
    r = queue.run("claim", "--pid", str(pid), *args)
    assert r.rc == 0 and r.out.strip(), r
    return r.out.strip()


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert not alive(proc.pid)
    return proc.pid


def expired(queue: QueueCLI, job: str) -> None:
    """Wait until J's lease has expired."""
    until = rfc3339(queue.lease(job)["expires_at"])
    assert wait_for(lambda: datetime.now(UTC) > until, 15), until


@contextlib.contextmanager
def live_holder() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def settled(queue: QueueCLI) -> None:
    """Nothing half-done anywhere: plain and reconciling recover both call the queue
    consistent and do nothing (I-5)."""
    for args in ((), ("--reconcile",)):
        r = queue.run("recover", "--json", *args)
        assert r.rc == 0 and r.json()["consistent"] is True, r
        assert r.json()["repaired"] == [] and r.json()["errors"] == [], r


ROUNDS = 4


def requeued_by(runs: Sequence[Done], job: str) -> int:
    """How many of the ``recover --json`` runs say they requeued J."""
    return sum(
        1
        for run in runs
        for entry in run.json()["requeued"]
        if entry["job"] == job and entry["applied"]
    )


def repaired_by(runs: Sequence[Done], job: str) -> int:
    return sum(
        1
        for run in runs
        for entry in run.json()["repaired"]
        if entry["job"] == job and entry["applied"]
    )


def recovers_consistent(runs: Sequence[Done]) -> None:
    """docs/queue.md: a busy queue's recover exits 0, and lists no error or conflict."""
    for run in runs:
        assert run.rc == 0, run
        report = run.json()
        assert report["consistent"] is True, run
        assert report["errors"] == [] and report["conflicts"] == [], run
        assert report["incomplete"] == [], run


# ------------------------------------------------------------------------------ finish, finish

FINISHES = {
    "same outcome and output": [("--ok", '{"v": 1}')] * 3,
    "same outcome, other outputs": [("--ok", '{"v": 1}'), ("--ok", '{"v": 2}'), ("--ok", "3")],
    "other outcomes": [("--ok", '{"v": 1}'), ("--error", '{"v": 2}'), ("--error", '{"v": 3}')],
}


@pytest.mark.parametrize("flavour", FINISHES)
def test_finishes_of_one_job_at_once_leave_the_one_winners_pair(queue, flavour):
    """Q-4, Q-6, I-1, I-3, §2.4: three ``finish`` of one claimed job released together: one
    exits 0 and prints J, the others exit 1 with ``EEXIST`` (J is finished already); J ends
    in the winner's terminal state with the winner's output, its claim and lease gone, and
    nothing else of it anywhere -- whether the finishes agree or not."""
    finishes = FINISHES[flavour]
    batch(queue, ROUNDS)
    for round_ in range(ROUNDS):
        job = claim_for(queue, os.getpid())
        runs = race(
            queue,
            [("finish", job, flag, "-") for flag, _ in finishes],
            [text for _, text in finishes],
        )
        winners = [i for i, run in enumerate(runs) if run.rc == 0]
        assert len(winners) == 1, (round_, runs)
        (won,) = winners
        assert runs[won].out.strip() == job, runs[won]
        for i, run in enumerate(runs):
            if i != won:
                assert run.rc == 1 and errno_of(run) == "EEXIST", (round_, run)
        flag, text = finishes[won]
        state = where(queue, job)
        assert state == ("done" if flag == "--ok" else "failed"), (round_, runs)
        assert result_of(queue, job, state)["output"] == json.loads(text), (round_, runs)
    settled(queue)


# ------------------------------------------------------------------------------ finish, recover

HOLDERS = ("dead", "expired", "alive")


@pytest.mark.parametrize("holder", HOLDERS)
def test_finishes_against_recovers_finish_or_requeue_never_both(queue, holder):
    """Q-4, Q-5, Q-6, I-1, I-3: ``finish --ok`` and ``finish --error`` of one claimed job
    released together with a ``recover --reconcile`` and a plain ``recover``.  Its holder
    dead, or alive with its lease expired (Q-5: the expiry is proof), the job either ends
    finished by one finish (exit 0, J in its state with its output, the other finish refused
    with ``EEXIST`` or ``ENOENT``, and no recover says it requeued J) or pending (one recover
    requeued it, both finishes exit 1 with ``ENOENT``); never both, never neither.  Its
    holder alive with a valid lease, recover never touches it (Q-6) and a finish always
    wins.  Either way the recovers exit 0 (a busy queue is consistent) and report no error,
    conflict or incomplete pair."""
    batch(queue, ROUNDS)
    flags = ("--ok", "--error")
    with live_holder() as proc:
        for round_ in range(ROUNDS):
            if holder == "dead":
                job = claim_for(queue, dead_pid())
            elif holder == "expired":
                job = claim_for(queue, proc.pid, "--ttl", "0.2")
                expired(queue, job)
            else:
                job = claim_for(queue, proc.pid, "--ttl", "600")
            runs = race(
                queue,
                [
                    ("finish", job, "--ok", "-"),
                    ("recover", "--reconcile", "--json"),
                    ("finish", job, "--error", "-"),
                    ("recover", "--json"),
                ],
                [json.dumps({"ok": round_}), "", json.dumps({"error": round_}), ""],
            )
            finishes, recovers = runs[0::2], runs[1::2]
            recovers_consistent(recovers)
            state = where(queue, job)
            won = [i for i, run in enumerate(finishes) if run.rc == 0]
            assert len(won) <= 1, (round_, runs)
            if won:
                flag = flags[won[0]]
                assert state == ("done" if flag == "--ok" else "failed"), (round_, runs)
                assert requeued_by(recovers, job) == 0, (round_, runs)
                output = result_of(queue, job, state)["output"]
                assert output == {flag[2:]: round_}, (round_, runs)
                lost = finishes[1 - won[0]]
                assert errno_of(lost) in ("EEXIST", "ENOENT"), (round_, runs)
            else:
                for run in finishes:
                    assert errno_of(run) == "ENOENT" and "pending" in run.err, runs
                assert state == "pending", (round_, runs)
                assert requeued_by(recovers, job) == 1, (round_, runs)
                assert holder != "alive", (round_, runs)
                # Back to pending: claimed once more, by someone alive, and finished.
                assert claim_for(queue, os.getpid()) == job
                queue.finish(job)
    settled(queue)


# ------------------------------------------------------------------------------ renew


def test_renewals_against_recovers_after_expiry_keep_or_lose_the_job_never_both(queue):
    """Q-3, Q-5, I-4, docs/queue.md ("a renewal either lands before recover judges the lease
    or finds the job no longer claimed"): a live holder's lease has just expired, and two
    ``renew --pid`` of it are released together with a plain ``recover`` and a ``recover
    --reconcile``.  The renewals agree: both exit 0, J then claimed by that holder with a
    lease in the future, and no recover requeued it; or both, too late, exit 1 with
    ``ENOENT``, and J is pending, requeued by exactly one recover."""
    batch(queue, ROUNDS)
    with live_holder() as proc:
        for round_ in range(ROUNDS):
            job = claim_for(queue, proc.pid, "--ttl", "0.2")
            expired(queue, job)
            renew = ("renew", job, "--pid", str(proc.pid), "--ttl", "600")
            runs = race(
                queue, [renew, ("recover", "--json"), renew, ("recover", "--reconcile", "--json")]
            )
            renewals, recovers = runs[0::2], runs[1::2]
            recovers_consistent(recovers)
            state = where(queue, job)
            assert renewals[0].rc == renewals[1].rc, (round_, runs)
            if renewals[0].rc == 0:
                assert state == "claimed", (round_, runs)
                assert requeued_by(recovers, job) == 0, (round_, runs)
                lease = queue.lease(job)
                assert lease["pid"] == proc.pid, lease
                assert rfc3339(lease["expires_at"]) > datetime.now(UTC), lease
            else:
                assert {errno_of(run) for run in renewals} == {"ENOENT"}, (round_, runs)
                assert state == "pending", (round_, runs)
                assert requeued_by(recovers, job) == 1, (round_, runs)
                assert claim_for(queue, os.getpid()) == job
            queue.finish(job)
    settled(queue)


def test_renewals_against_a_finish_never_bring_a_lease_back(queue):
    """Q-3, Q-4, I-3: two ``renew`` by the holder released together with its ``finish
    --error``: the finish exits 0 and J ends failed with nothing else of it left -- no lease
    written back by a renewal that came second, no renewal's temp file in ``inbox/``; a
    renewal exits 0 (it came first) or 1 saying there is no lease to renew."""
    batch(queue, ROUNDS)
    with live_holder() as proc:
        for round_ in range(ROUNDS):
            job = claim_for(queue, proc.pid, "--ttl", "600")
            renew = ("renew", job, "--pid", str(proc.pid))
            runs = race(queue, [renew, ("finish", job, "--error", "-"), renew], ["", "{}", ""])
            assert runs[1].rc == 0, (round_, runs)
            for run in (runs[0], runs[2]):
                if run.rc != 0:
                    assert errno_of(run) in ("ENOENT", "EEXIST"), (round_, run)
            assert where(queue, job) == "failed", (round_, runs)
            assert os.listdir(queue.dir / "inbox") == [], round_
    settled(queue)


# ------------------------------------------------------------------------------ claim, recover


def test_claims_against_the_recover_that_requeues_their_job(queue):
    """Q-2, Q-5, I-4: J, the queue's only job, is claimed for a process that has exited;
    two ``claim --pid`` of live processes are released together with the ``recover`` that
    requeues it.  At most one claim exits 0, printing J, and J then ends claimed by that
    claimer (recover never takes a live claim back); the other exits 3 (nothing to claim).
    J is never left in two states, nor without its lease, nor lost."""
    with live_holder() as one, live_holder() as two:
        claimers = {0: one.pid, 2: two.pid}
        for round_ in range(ROUNDS):
            queue.publish(name=f"only{round_}")
            job = claim_for(queue, dead_pid())
            runs = race(
                queue,
                [
                    ("claim", "--pid", str(one.pid)),
                    ("recover", "--json"),
                    ("claim", "--pid", str(two.pid)),
                ],
            )
            recovers_consistent([runs[1]])
            assert requeued_by([runs[1]], job) == 1, (round_, runs)
            won = [i for i in claimers if runs[i].rc == 0]
            assert len(won) <= 1, (round_, runs)
            for i in claimers:
                assert runs[i].rc in (0, 3), runs[i]
            state = where(queue, job)
            if won:
                assert runs[won[0]].out.strip() == job, runs
                assert state == "claimed", (round_, runs)
                assert queue.lease(job)["pid"] == claimers[won[0]], (round_, runs)
            else:
                assert state == "pending", (round_, runs)
                assert claim_for(queue, os.getpid()) == job
            queue.finish(job)
    settled(queue)


def test_a_claim_for_a_dead_pid_an_immediate_recover_and_a_second_claim(queue):
    """Q-2, Q-3, Q-5, I-4, §2.4 ``--pid``: J pending alone; ``claim --pid`` of a process that
    has exited, ``recover --reconcile`` and a ``claim --pid`` of a live process, released
    together.  Whatever the order, J ends in one state: claimed by the live claimer (which
    then printed J), claimed by the dead pid (only if the live claim did not get J: it
    exits 3), or pending (the dead pid's claim requeued, or no claim got J).  The live
    claimer is never told J while J ends leased to someone else; the recover exits 0."""
    with live_holder() as proc:
        for round_ in range(ROUNDS):
            job = queue.publish(name=f"solo{round_}")
            dead = dead_pid()
            runs = race(
                queue,
                [
                    ("claim", "--pid", str(dead)),
                    ("recover", "--reconcile", "--json"),
                    ("claim", "--pid", str(proc.pid)),
                ],
            )
            first, recover, second = runs
            recovers_consistent([recover])
            assert first.rc in (0, 3) and second.rc in (0, 3), runs
            state = where(queue, job)
            if second.rc == 0:
                assert second.out.strip() == job, runs
                assert state == "claimed" and queue.lease(job)["pid"] == proc.pid, runs
            elif state == "claimed":
                assert first.rc == 0 and first.out.strip() == job, runs
                assert queue.lease(job)["pid"] == dead, runs
            else:
                # The dead pid's claim requeued; or (docs/queue.md, claim step 3) a claim
                # whose fresh, still empty claimed/J the reconcile removed, which lost.
                assert state == "pending", runs
                assert first.rc == 3 or requeued_by([recover], job) == 1, runs
            if first.rc == 0:
                assert "note" in first.err and str(dead) in first.err, first
            if state != "pending":
                again = queue.run("recover", "--json")
                assert again.rc == 0, again
            if where(queue, job) == "pending":
                assert claim_for(queue, os.getpid()) == job
            queue.finish(job)
    settled(queue)


# ------------------------------------------------------------------------------ publish


def test_publish_of_the_name_against_its_finish_and_recover(queue):
    """Q-1, Q-4, Q-5, Q-6, I-1: J is claimed; ``publish --name J``, ``finish J --ok`` and
    ``recover --reconcile`` released together.  J has evidence all along (claimed, then done
    or back in pending), so the publish is refused with ``EEXIST`` every time and never
    stored; J ends done (finish exit 0) or, its holder having exited, pending with the
    request it was first published with (finish exit 1, ``ENOENT``)."""
    for round_ in range(ROUNDS):
        name = f"named{round_}"
        original = {"tool": "fs.read", "input": {"path": "README.md"}, "first": round_}
        job = queue.publish(original, name=name)
        assert claim_for(queue, dead_pid()) == job
        second = {"tool": "fs.read", "input": {"path": "README.md"}, "second": round_}
        runs = race(
            queue,
            [
                ("publish", "--name", name, "-"),
                ("finish", job, "--ok", "-"),
                ("recover", "--reconcile", "--json"),
            ],
            [json.dumps(second), '"fin"', ""],
        )
        publish, finish, recover = runs
        recovers_consistent([recover])
        assert publish.rc == 1 and errno_of(publish) == "EEXIST", (round_, runs)
        assert publish.out == "", publish
        state = where(queue, job)
        if finish.rc == 0:
            assert state == "done", (round_, runs)
            stored = json.loads((queue.dir / "done" / job).read_text())
        else:
            assert errno_of(finish) == "ENOENT", (round_, runs)
            assert state == "pending", (round_, runs)
            stored = json.loads((queue.dir / "pending" / job).read_text())
            assert claim_for(queue, os.getpid()) == job
            queue.finish(job)
        assert {k: v for k, v in stored.items() if k in original} == original, stored
        assert "second" not in stored, stored
    settled(queue)


# ------------------------------------------------------------------------------ readers


def test_status_and_list_while_finish_and_recover_race_on_the_job(queue):
    """§2.4, Q-6 with docs/queue.md ("status, list and show read the queue without its locks
    ... a job whose lock stays held is reported claimed"): J claimed by a process that has
    exited; ``finish``, ``recover``, ``status --json`` and two ``list --json`` released
    together.  The readers exit 0 and print one JSON document; ``list`` gives J once, in a
    state it was in during the round (claimed, then done or pending), never incomplete or a
    conflict, and ``status`` counts every job once, none of them incomplete or a conflict.
    (``show`` is the next test's.)"""
    batch(queue, ROUNDS)
    for round_ in range(ROUNDS):
        job = claim_for(queue, dead_pid())
        runs = race(
            queue,
            [
                ("finish", job, "--ok", "-"),
                ("list", "--json"),
                ("recover", "--json"),
                ("status", "--json"),
                ("list", "--json"),
            ],
            ["{}", "", "", "", ""],
        )
        finish, recover, status = runs[0], runs[2], runs[3]
        recovers_consistent([recover])
        final = where(queue, job)
        assert final == ("done" if finish.rc == 0 else "pending"), (round_, runs)
        path = {"claimed", final}
        for reader in runs[1], status, runs[4]:
            assert reader.rc == 0, (round_, reader)
        counts = status.json()["counts"]
        assert counts["conflict"] == 0 and counts["incomplete"] == 0, (round_, status)
        jobs = sum(counts[s] for s in ("pending", "claimed", "done", "failed"))
        assert jobs == ROUNDS, (round_, status)  # the batch: each job once
        for listed in runs[1], runs[4]:
            states = [e["state"] for e in listed.json() if e["name"] == job]
            assert len(states) == 1 and states[0] in path, (round_, listed)
            assert len(listed.json()) == ROUNDS, (round_, listed)
        if final == "pending":
            assert claim_for(queue, os.getpid()) == job
            queue.finish(job)
    settled(queue)


# A request just under the default max_request_bytes (1 MiB) that takes a reader a while to
# parse: a quarter of a million empty objects.
SLOW_REQUEST = {"tool": "fs.read", "input": {"path": "README.md"}, "pad": [{}] * 250_000}


@pytest.mark.parametrize("mover", ("finish", "recover"))
def test_show_of_a_job_with_a_large_request_while_it_moves(queue, mover):
    """§2.4 ``show`` ("every piece of evidence for J"), Q-6 with docs/queue.md (show reads
    the queue without its locks, and a job on its way is reported as such): J, whose request
    is large but within the default limit, is claimed for a process that has exited; two
    ``show J --json`` are released together with its ``finish`` (or the ``recover`` that
    requeues it).  J exists all along, so each show exits 0 and gives J a state it was in
    (claimed, then done or pending), and no document of J as unreadable: a request or lease
    that moved on while it was read is a job in motion, not damage."""
    for round_ in range(3):
        job = queue.publish(SLOW_REQUEST, name=f"large{round_}")
        assert claim_for(queue, dead_pid()) == job
        first = ("finish", job, "--ok", "-") if mover == "finish" else ("recover", "--json")
        show = ("show", job, "--json")
        runs = race(queue, [first, show, show], ["{}", "", ""])
        assert runs[0].rc == 0, runs[0]
        final = where(queue, job)
        assert final == ("done" if mover == "finish" else "pending"), runs
        for run in runs[1:]:
            assert run.rc == 0, (round_, run)
            shown = run.json()
            assert shown["state"] in ("claimed", final), (round_, run)
            for key in ("request", "lease", "result"):
                document = shown.get(key)
                assert not (isinstance(document, dict) and "unreadable" in document), (key, run)
        if final == "pending":
            assert claim_for(queue, os.getpid()) == job
            queue.finish(job)


# ------------------------------------------------------------------------------ recover, recover


def test_reconciles_and_a_plain_recover_at_once_on_a_dead_holders_job(queue):
    """Q-5, Q-6, I-5: a job leased to a process that has exited, and a finish cut short with
    its result in place beside the claimed request (its holder gone too): two ``recover
    --reconcile`` and a plain ``recover`` released together.  The reconciles exit 0 calling
    the queue consistent; the plain recover exits 0, or 1 listing the cut-short finish as
    incomplete when it looked before it was completed; the requeue and the roll-forward are
    each applied by exactly one run, never by the plain one for the roll-forward; the first
    job ends pending with its request, the second done with the result that was in place; a
    last recover changes nothing."""
    for round_ in range(3):
        lost = queue.publish(name=f"lost{round_}")
        half = queue.publish(name=f"half{round_}")
        assert claim_for(queue, dead_pid()) == lost
        assert claim_for(queue, dead_pid()) == half
        recorded = cut_short(queue, half, "done", {"kept": round_})
        reconcile = ("recover", "--reconcile", "--json")
        runs = race(queue, [reconcile, ("recover", "--json"), reconcile])
        recovers_consistent(runs[0::2])
        plain = runs[1].json()
        assert plain["errors"] == [] and plain["conflicts"] == [], runs[1]
        # Plain recover reports the cut-short finish and leaves it (Q-6: exit 1), unless it
        # looked once a reconcile had completed it, or while one was completing it.
        assert [e["job"] for e in plain["incomplete"]] in ([], [half]), runs[1]
        assert runs[1].rc == (1 if plain["incomplete"] else 0), runs[1]
        assert requeued_by(runs, lost) == 1, (round_, runs)
        assert repaired_by(runs, half) == 1, (round_, runs)
        assert repaired_by(runs[1:2], half) == 0, runs[1]  # plain recover repairs nothing
        assert where(queue, lost) == "pending"
        assert where(queue, half) == "done"
        assert result_of(queue, half, "done") == recorded
        assert claim_for(queue, os.getpid()) == lost
        queue.finish(lost)
    settled(queue)


def cut_short(queue: QueueCLI, job: str, state: str, output) -> dict:
    """What a ``finish`` of J stopped after its result moved in leaves (docs/queue.md, finish
    step 2): ``STATE/J.result`` recording the lease's holder as its worker, the request still
    in ``claimed/J/``, the lease in place.  The result written."""
    lease = queue.lease(job)
    worker = {k: lease[k] for k in ("host", "pid", "boot_id", "pid_ns")}
    recorded = {
        "status": "ok" if state == "done" else "error",
        "output": output,
        "worker": {"id": lease["worker"], **worker},
        "started": lease["claimed_at"],
        "finished": lease["claimed_at"],
    }
    path = queue.dir / state / f"{job}.result"
    path.write_text(json.dumps(recorded))
    path.chmod(stat.S_IMODE(path.stat().st_mode) | 0o060)
    return recorded


def test_finishes_completing_a_finish_cut_short_against_reconcile(queue):
    """Q-4, Q-6, I-3, docs/queue.md (a finish cut short after its result moved in is
    completed by finishing it again with the same outcome and output, or by ``recover
    --reconcile`` once its holder is gone): the same finish again, a finish with the other
    outcome and ``recover --reconcile`` released together.  J ends done with the result that
    was in place, never failed; the other outcome is refused with ``EEXIST``; the repeat
    exits 0 (it completed J) or 1 with ``EEXIST`` (recover had); recover exits 0."""
    for round_ in range(3):
        job = queue.publish(name=f"cut{round_}")
        assert claim_for(queue, dead_pid()) == job
        recorded = cut_short(queue, job, "done", {"v": round_})
        same = json.dumps({"v": round_})
        runs = race(
            queue,
            [
                ("finish", job, "--ok", "-"),
                ("finish", job, "--error", "-"),
                ("recover", "--reconcile", "--json"),
            ],
            [same, same, ""],
        )
        again, other, recover = runs
        recovers_consistent([recover])
        assert other.rc == 1 and errno_of(other) == "EEXIST", (round_, runs)
        assert again.rc == 0 or errno_of(again) == "EEXIST", (round_, runs)
        assert (again.rc == 0) + repaired_by([recover], job) == 1, (round_, runs)
        assert where(queue, job) == "done", (round_, runs)
        assert result_of(queue, job, "done") == recorded
    settled(queue)
