"""Lease renewal at its edges (SPEC Q-3, Q-4, Q-5, Q-6, I-4, §2.4 ``ctx queue renew``, §3
W-1..W-4; docs/queue.md "lease", "Liveness", "Command line"; docs/workers.md "A lease taken
away", "A renewal the host refuses").

A claim renewed by its holder before and after its lease expired, after ``recover`` requeued
it, after another holder claimed it and after it was finished; ``--ttl`` of ``renew`` and of
``ctx queue work`` at and past its bounds; ``renew`` and ``recover`` racing on an expired
lease; a member of the space who is not the holder; a worker frozen with SIGSTOP past its
lease while ``recover`` runs, then continued; a worker whose lease file is edited by hand
under it (expired, garbage, removed); and a hand-set lease far in the future renewed with the
default lifetime.  In every case a job is finished once, by one holder, and is never lost;
a holder that lost its job is refused with an errno and exit 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    alive,
    clean_env,
    ctx_run,
    new_scratch_dir,
    rfc3339,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.workercli import AGENT, shell_job
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage
from tests.support.users import members_of

SCRATCH = scratch_top(__file__)
WAIT = 20.0
MAX_TTL = 366 * 24 * 3600  # the longest lease --ttl takes (docs/queue.md, lease_ttl)

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="a worker runs its jobs as an agent's uid: needs root"
)

# ------------------------------------------------------------------------------ helpers


def now() -> datetime:
    return datetime.now(UTC)


def until_past(stamp: str) -> None:
    """Wait until the instant ``stamp`` (RFC 3339) is behind us."""
    expiry = rfc3339(stamp)
    assert wait_for(lambda: now() > expiry + timedelta(seconds=0.05), WAIT), stamp


def holder_state(queue: QueueCLI, job: str) -> str:
    shown = queue.run("show", job, "--json")
    return shown.json()["holder"]["state"]


def refused(run, errno_name: str, rc: int = 1) -> dict:
    """``run`` (a ``--json`` command) failed with ``errno_name`` and exit ``rc``, no traceback."""
    assert run.rc == rc, run
    assert "Traceback" not in run.err, run
    error = run.json()
    assert error["error"] == errno_name, run
    assert f"ctx: {errno_name}:" in run.err, run
    return error


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    box = new_scratch_dir(SCRATCH, prefix)
    try:
        yield box
    finally:
        shutil.rmtree(box, ignore_errors=True)


@contextlib.contextmanager
def sleeper(**kw) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "600"], **kw)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def start_worker(queue: QueueCLI, *args: str) -> subprocess.Popen:
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT]
    return subprocess.Popen(
        [*argv, "--json", *args],
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextlib.contextmanager
def reaped(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    """``proc`` continued and killed on the way out if it still runs."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        with contextlib.suppress(Exception):
            proc.communicate(timeout=10)


def events(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def first_run_hangs(outbox: Path, tag: str) -> dict:
    """A job whose run k writes its pid to ``pid-TAG-k``, notes whether an earlier run was
    still alive when it started (``overlap-TAG``), and whose first run hangs (60 s) while the
    later ones end at once, printing ``TAG-k``."""
    base = outbox / tag
    return shell_job(
        f"echo run >> {base}.runs; k=$(wc -l < {base}.runs); echo $$ > {base}.pid-$k; "
        f"for p in {base}.pid-*; do q=$(cat $p); [ $q = $$ ] && continue; "
        f"[ -d /proc/$q ] && ! grep -q ') Z' /proc/$q/stat && echo $q >> {base}.overlap; "
        f"done; [ $k = 1 ] && sleep 60; echo {tag}-$k"
    )


def runs_of(outbox: Path, tag: str) -> int:
    path = outbox / f"{tag}.runs"
    return len(path.read_text().split()) if path.exists() else 0


def edit_lease(queue: QueueCLI, job: str, **fields) -> None:
    """Rewrite ``lease/J/worker`` by hand with ``fields`` changed (a value of None removes)."""
    lease = queue.lease(job)
    for key, value in fields.items():
        if value is None:
            lease.pop(key, None)
        else:
            lease[key] = value
    queue.write_lease(job, lease)


# ------------------------------------------------------------------------------ a shell holder


def test_a_shell_holder_renews_before_and_after_expiry_and_is_told_once_requeued(queue):
    """Q-3, Q-5, §2.4, docs/queue.md "Liveness": a holder renews its 1.5 s lease before it
    expires (same ``claimed_at``, later ``expires_at``, a ``renewed_at``, as long again) and
    once more after it expired but before any ``recover`` (its job is still claimed, so the
    renewal stands and ``recover`` then leaves it alone).  Left to expire again, ``recover``
    requeues it; the holder's ``renew`` and ``finish`` are then refused with ENOENT saying the
    job is pending (exit 1), writing nothing.  Claimed by another holder, the old one's
    ``renew`` is refused with EACCES naming the new holder's pid, its lease untouched.  Once
    the new holder finished it, ``renew`` by either says it is done (exit 1).  One result."""
    job = queue.publish(name="renewed")
    with sleeper() as old, sleeper() as new:
        took = queue.run("claim", "--pid", str(old.pid), "--ttl", "1.5", "--json")
        assert took.rc == 0 and took.json()["name"] == job, took
        first = queue.lease(job)

        before = queue.run("renew", job, "--pid", str(old.pid), "--json")
        assert before.rc == 0, before
        lease = queue.lease(job)
        assert lease == before.json(), (lease, before.json())
        assert lease["claimed_at"] == first["claimed_at"], lease
        assert rfc3339(lease["expires_at"]) > rfc3339(first["expires_at"]), lease
        period = rfc3339(lease["expires_at"]) - rfc3339(lease["renewed_at"])
        assert abs(period.total_seconds() - 1.5) < 0.01, lease  # as long again

        until_past(lease["expires_at"])
        assert holder_state(queue, job) == "gone"
        late = queue.run("renew", job, "--pid", str(old.pid), "--ttl", "600", "--json")
        assert late.rc == 0, late
        assert rfc3339(queue.lease(job)["expires_at"]) > now() + timedelta(seconds=500)
        assert holder_state(queue, job) == "alive"
        kept = queue.run("recover", "--json")
        assert kept.rc == 0 and kept.json()["requeued"] == [], kept
        assert queue.state(job) == "claimed"

        short = queue.run("renew", job, "--pid", str(old.pid), "--ttl", "0.3", "--json")
        assert short.rc == 0, short
        until_past(queue.lease(job)["expires_at"])
        requeued = queue.run("recover", "--json")
        assert requeued.rc == 0, requeued
        assert [r["job"] for r in requeued.json()["requeued"]] == [job], requeued
        assert queue.state(job) == "pending"

        pending = snapshot(queue.dir)
        told = refused(queue.run("renew", job, "--pid", str(old.pid), "--json"), "ENOENT")
        assert "pending" in told["message"], told
        gone = queue.run("finish", job, "--ok", "-", "--json", input='{"by": "old"}')
        assert "pending" in refused(gone, "ENOENT")["message"], gone
        assert snapshot(queue.dir) == pending

        again = queue.run("claim", "--pid", str(new.pid), "--ttl", "600", "--json")
        assert again.rc == 0 and again.json()["name"] == job, again
        held = (queue.dir / "lease" / job / "worker").read_bytes()
        other = refused(queue.run("renew", job, "--pid", str(old.pid), "--json"), "EACCES")
        assert str(new.pid) in other["message"], other
        assert (queue.dir / "lease" / job / "worker").read_bytes() == held

        queue.finish(job, output={"by": "new"})
        for pid in (old.pid, new.pid):
            after = refused(queue.run("renew", job, "--pid", str(pid), "--json"), "ENOENT")
            assert "done" in after["message"], after
    state, result = queue.only_result(job)
    assert state == "done" and result["output"] == {"by": "new"}, result
    assert result["worker"]["pid"] == new.pid, result
    queue.assert_settled()


def test_renew_and_recover_racing_on_an_expired_lease_never_both_win(queue):
    """Q-5, I-4, docs/queue.md ("renew takes claimed/J's lock, as recover does before it
    requeues, so a renewal either lands before recover judges the lease or finds the job no
    longer claimed"): the holder's ``renew`` and a ``recover`` started together on an
    expired lease.  Either the renewal lands (exit 0, the job stays claimed, nothing
    requeued) or recover requeues it (the renewal refused with ENOENT, exit 1): never a
    renewal reported over a job sent back to pending, never both refused."""
    env = clean_env(CTX_STORAGE=str(queue.storage))
    outcomes = set()
    with sleeper() as holder:
        for round_ in range(3):
            job = queue.publish(name=f"race{round_}")
            assert queue.claim("--pid", str(holder.pid), "--ttl", "0.2") == job
            until_past(queue.lease(job)["expires_at"])
            common = ["--project", queue.project, "--json"]
            renew = subprocess.Popen(
                [*CTX_ARGV, "queue", "renew", job, *common, "--pid", str(holder.pid)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            recover = subprocess.Popen(
                [*CTX_ARGV, "queue", "recover", *common],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            renewed_out, renew_err = renew.communicate(timeout=60)
            recovered_out, recover_err = recover.communicate(timeout=60)
            assert "Traceback" not in renew_err + recover_err
            assert recover.returncode == 0, recovered_out
            requeued = [r["job"] for r in json.loads(recovered_out)["requeued"]]
            if renew.returncode == 0:
                assert requeued == [] and queue.state(job) == "claimed", (renew_err, requeued)
                assert json.loads(renewed_out)["job"] == job
                outcomes.add("renewed")
                queue.finish(job)
            else:
                assert renew.returncode == 1, renew_err
                assert json.loads(renewed_out)["error"] == "ENOENT", renewed_out
                assert requeued == [job] and queue.state(job) == "pending", requeued
                outcomes.add("requeued")
                assert queue.claim("--pid", str(holder.pid), "--ttl", "600") == job
                queue.finish(job)
            assert queue.only_result(job)[0] == "done"
    assert outcomes
    queue.assert_settled()


NOT_TTLS = ["0", "-1", "31622400.001", "nan", "inf"]


def test_ttl_at_and_past_its_bounds_for_renew_and_the_worker(queue):
    """§2.4 ``--ttl``, Q-3, docs/queue.md (above 0, at most 366 days) and docs/workers.md (a
    worker's lease at least 1 s): ``renew --ttl`` at 366 days to the second is taken exactly;
    zero, negative, a hair past 366 days, NaN and infinity are usage errors (exit 2, EINVAL
    naming ``--ttl``) that leave the lease byte for byte.  ``ctx queue work --ttl`` 0.999 and
    a hair past 366 days are usage errors that claim nothing; 1 and 366 days are taken."""
    job = queue.publish(name="bounds")
    with sleeper() as holder:
        assert queue.claim("--pid", str(holder.pid), "--ttl", "60") == job
        longest = queue.run("renew", job, "--pid", str(holder.pid), "--ttl", str(MAX_TTL), "--json")
        assert longest.rc == 0, longest
        lease = queue.lease(job)
        period = rfc3339(lease["expires_at"]) - rfc3339(lease["renewed_at"])
        assert abs(period.total_seconds() - MAX_TTL) < 0.01, lease
        before = snapshot(queue.dir)
        for value in NOT_TTLS:
            bad = queue.run("renew", job, "--pid", str(holder.pid), "--ttl", value, "--json")
            assert bad.rc == 2 and "--ttl" in bad.err and "EINVAL" in bad.err, (value, bad)
            assert snapshot(queue.dir) == before, value
        queue.finish(job)

    waiting = queue.publish(name="waiting")
    for value in ("0.999", "31622400.5", "0"):
        bad = queue.run("work", "--drain", "--ttl", value)
        assert bad.rc == 2 and "--ttl" in bad.err, (value, bad)
        assert queue.state(waiting) == "pending", value
    for value in ("1", str(MAX_TTL)):
        empty = queue.run("work", "--drain", "--ttl", value, "--max-jobs", "1")
        assert empty.rc == 0 and "Traceback" not in empty.err, (value, empty)
    # The first of the two drained the waiting job (no agent: failed as refused, W-1).
    state, result = queue.only_result(waiting)
    assert state == "failed" and "EACCES" in result["reason"], result
    queue.assert_settled()


def test_renew_without_ttl_never_shortens_a_lease_set_by_hand(queue):
    """Q-3, §2.4 ("``ctx queue renew --project P J`` extends the caller's own lease"),
    docs/queue.md (the default renewal is "for as long again as it was taken or last renewed
    for … never the shorter ``lease_ttl``"), ``renew --help`` ("so a renewal never shortens
    it"): an operator sets a long job's ``expires_at`` by hand to 400 days from now (a lease
    the queue reads and judges alive).  The holder's plain ``renew`` must not bring the expiry
    closer; a lease cut to five minutes is requeued by ``recover`` while the job still runs."""
    job = queue.publish(name="hand-set")
    with sleeper() as holder:
        assert queue.claim("--pid", str(holder.pid), "--ttl", "600") == job
        far = (now() + timedelta(days=400)).strftime("%Y-%m-%dT%H:%M:%SZ")
        edit_lease(queue, job, expires_at=far)
        assert holder_state(queue, job) == "alive"
        renewed = queue.run("renew", job, "--pid", str(holder.pid), "--json")
        assert renewed.rc == 0, renewed
        assert rfc3339(queue.lease(job)["expires_at"]) >= rfc3339(far), queue.lease(job)


# ------------------------------------------------------------------------------ another user


@needs_root
def test_a_member_who_is_not_the_holder_cannot_renew_and_is_told_where_the_job_went(
    searchable_storage,
):
    """Q-3 ("no other process renews leases"), Q-5, docs/queue.md "A queue shared by a
    group": in a space of group G, root claims for a live process of its own.  A member's
    ``renew`` (without ``--pid``) is refused with EACCES naming the holder, the lease byte for
    byte.  The holder dies; the member's ``recover`` requeues the job and the member claims
    it for a process of its own.  Root's renewal for its old holder is then refused with
    EACCES naming the member's holder; once the member finished, root's ``renew`` says the
    job is done.  One result, the member's."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed")
    (member,), gid = members_of("ctxlre-g", "ctxlre-m")
    storage = searchable_storage
    env = clean_env(CTX_STORAGE=str(storage))
    made = ctx_run("shared", "create", "lre", "--group", "ctxlre-g", env=env)
    assert made.rc == 0, made
    queue = QueueCLI(storage, "lre")
    with scratch("cache") as cache:
        os.chown(cache, member.uid, member.gid)
        member_env = {**env, "HOME": "/nonexistent", "XDG_CACHE_HOME": str(cache)}
        drop = ["setpriv", f"--reuid={member.uid}", f"--regid={member.gid}", f"--groups={gid}"]

        def as_member(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
            argv = [*drop, "--", *CTX_ARGV, "queue", *args, "--project", "lre", "--json"]
            return subprocess.run(
                argv, input=stdin, env=member_env, capture_output=True, text=True, cwd="/"
            )

        job = queue.publish(name="shared-job")
        with sleeper() as roots, sleeper(user=member.uid, group=member.gid) as theirs:
            assert queue.claim("--pid", str(roots.pid), "--ttl", "600") == job
            path = queue.dir / "lease" / job / "worker"
            held = path.read_bytes()
            foreign = as_member("renew", job, "--ttl", "900")
            assert foreign.returncode == 1 and "Traceback" not in foreign.stderr, foreign
            said = json.loads(foreign.stdout)
            assert said["error"] == "EACCES" and str(roots.pid) in said["message"], said
            assert path.read_bytes() == held

            roots.kill()
            roots.wait()
            swept = as_member("recover")
            assert swept.returncode == 0, swept.stderr
            assert [r["job"] for r in json.loads(swept.stdout)["requeued"]] == [job]
            took = as_member("claim", "--pid", str(theirs.pid), "--ttl", "600")
            assert took.returncode == 0 and json.loads(took.stdout)["name"] == job, took
            mine = path.read_bytes()
            stale = refused(queue.run("renew", job, "--pid", str(roots.pid), "--json"), "EACCES")
            assert str(theirs.pid) in stale["message"], stale
            assert path.read_bytes() == mine

            done = as_member("finish", job, "--ok", "-", stdin='{"by": "member"}')
            assert done.returncode == 0, done.stderr
            after = refused(queue.run("renew", job, "--pid", str(theirs.pid), "--json"), "ENOENT")
            assert "done" in after["message"], after
        state, result = queue.only_result(job)
        assert state == "done" and result["output"] == {"by": "member"}, result
        assert result["worker"]["pid"] == theirs.pid, result


# ------------------------------------------------------------------------------ workers


@needs_root
def test_a_worker_stopped_past_its_lease_while_recover_runs_loses_the_job_and_runs_it_again(
    queue, agent, outbox
):
    """Q-5, I-4, W-3, docs/workers.md "A lease taken away": a worker (``--ttl 1.5``,
    ``--concurrency 2``, ``--drain``) is frozen with SIGSTOP while its job's tool runs, past
    its lease's expiry; ``recover`` finds the holder gone (lease expired, though its pid is
    alive) and requeues the job.  Continued, the worker learns at its next renewal that the
    job is no longer its own: the first run's tool is killed (it would have hung 60 s), the
    job is reported ``lost`` once, and run again under a new claim, never beside the first
    run.  One result, from the second run; nothing else left in the queue."""
    job = queue.publish(first_run_hangs(outbox, "frozen"), name="frozen")
    with reaped(start_worker(queue, "--ttl", "1.5", "--concurrency", "2", "--drain")) as proc:
        assert wait_for(lambda: runs_of(outbox, "frozen") == 1, WAIT), proc.poll()
        os.kill(proc.pid, signal.SIGSTOP)
        until_past(queue.lease(job)["expires_at"])
        swept = queue.run("recover", "--json")
        assert swept.rc == 0, swept
        assert [r["job"] for r in swept.json()["requeued"]] == [job], swept
        assert "expired" in swept.json()["requeued"][0]["detail"], swept
        assert queue.state(job) == "pending"
        os.kill(proc.pid, signal.SIGCONT)
        out, err = proc.communicate(timeout=45)  # well before the first run's 60 s
    assert proc.returncode == 0 and "Traceback" not in err, err
    seen = events(out)
    lost = [e for e in seen if e.get("event") == "lost"]
    assert [e["job"] for e in lost] == [job], seen
    assert [e["job"] for e in seen if e.get("event") == "claim"] == [job, job], seen
    assert seen[-1].get("event") == "stop" and (seen[-1]["done"], seen[-1]["lost"]) == (1, 1)
    first_pid = int((outbox / "frozen.pid-1").read_text())
    assert wait_for(lambda: not alive(first_pid), WAIT), "the first run outlived its lease"
    assert not (outbox / "frozen.overlap").exists(), (outbox / "frozen.overlap").read_text()
    assert runs_of(outbox, "frozen") == 2
    state, result = queue.only_result(job)
    assert state == "done" and result["output"] == "frozen-2\n", result
    queue.assert_settled()


@needs_root
def test_a_lease_edited_to_expire_under_a_running_worker_hands_the_job_on_once(
    queue, agent, outbox
):
    """Q-5 (an expired lease is proof, even of a live pid), docs/workers.md "A lease taken
    away": while a worker runs a job, its ``expires_at`` is set by hand to 2001.  ``recover``
    requeues the job; the worker's next renewal finds it pending, kills its tool (60 s run)
    and reports it ``lost``; draining, it claims the job again and finishes the second run.
    One result; the first run never overlaps the second."""
    job = queue.publish(first_run_hangs(outbox, "past"), name="past")
    with reaped(start_worker(queue, "--ttl", "3", "--drain")) as proc:
        assert wait_for(lambda: runs_of(outbox, "past") == 1, WAIT), proc.poll()
        edit_lease(queue, job, expires_at="2001-01-01T00:00:00Z")
        assert holder_state(queue, job) == "gone"
        swept = queue.run("recover", "--json")
        assert swept.rc == 0 and [r["job"] for r in swept.json()["requeued"]] == [job], swept
        out, err = proc.communicate(timeout=45)
    assert proc.returncode == 0 and "Traceback" not in err, err
    seen = events(out)
    assert [e["job"] for e in seen if e.get("event") == "lost"] == [job], seen
    assert not (outbox / "past.overlap").exists()
    state, result = queue.only_result(job)
    assert state == "done" and result["output"] == "past-2\n", result
    queue.assert_settled()


@needs_root
def test_a_lease_edited_into_garbage_under_a_running_worker_is_given_up_not_lost(
    queue, agent, outbox
):
    """Q-6, docs/queue.md (a lease that does not parse is a conflict: ``renew`` refuses it
    with EINVAL naming ``lease/J/worker`` and changes nothing; ``recover`` never resolves it),
    docs/workers.md "A renewal the host refuses": a worker's lease is overwritten with
    garbage while its job runs.  The worker says ``renew_failed`` (EINVAL), kills the job's
    tool before the lease it wrote would expire, stops claiming (a second job stays pending)
    and exits 1 with EINVAL, naming the job among those it left claimed.  The garbage stays;
    ``recover`` reports the conflict (exit 1) and
    moves nothing.  Repaired by hand to name the exited worker, ``recover`` requeues the job,
    and a second worker runs both jobs: nothing lost, nothing run twice at once."""
    job = queue.publish(first_run_hangs(outbox, "junk"), name="junk")
    with reaped(start_worker(queue, "--ttl", "1.5", "--drain")) as proc:
        assert wait_for(lambda: runs_of(outbox, "junk") == 1, WAIT), proc.poll()
        good = queue.lease(job)
        queue.publish(shell_job("echo second"), name="second")
        path = queue.dir / "lease" / job / "worker"
        path.write_text("garbage{\n")
        out, err = proc.communicate(timeout=45)
    assert proc.returncode == 1 and "Traceback" not in err, err
    seen = events(out)
    failed = [e for e in seen if e.get("event") == "renew_failed"]
    assert failed and failed[0]["job"] == job and failed[0]["error"] == "EINVAL", seen
    assert seen[-1]["error"] == "EINVAL" and job in seen[-1]["message"], seen[-1]
    assert [e.get("left_claimed") for e in seen if e.get("event") == "stop"] == [[job]], seen
    assert "ctx: EINVAL:" in err, err
    first_pid = int((outbox / "junk.pid-1").read_text())
    assert wait_for(lambda: not alive(first_pid), WAIT)
    assert path.read_text() == "garbage{\n"
    assert queue.state("second.req.json") == "pending"

    before = snapshot(queue.dir)
    looked = queue.run("recover", "--reconcile", "--json")
    assert looked.rc == 1, looked
    assert [c["job"] for c in looked.json()["conflicts"]] == [job], looked
    assert looked.json()["requeued"] == [] and looked.json()["repaired"] == [], looked
    assert snapshot(queue.dir) == before

    queue.write_lease(job, good)  # repaired: it names the worker again, which has exited
    swept = queue.run("recover", "--json")
    assert swept.rc == 0 and [r["job"] for r in swept.json()["requeued"]] == [job], swept
    with reaped(start_worker(queue, "--ttl", "3", "--drain")) as again:
        out, err = again.communicate(timeout=45)
    assert again.returncode == 0, err
    assert not (outbox / "junk.overlap").exists()
    state, result = queue.only_result(job)
    assert state == "done" and result["output"] == "junk-2\n", result
    assert queue.only_result("second.req.json")[0] == "done"
    queue.assert_settled()


@needs_root
def test_a_lease_removed_under_a_running_worker_stops_its_tool_and_reconcile_requeues(
    queue, agent, outbox
):
    """Q-3, Q-6, docs/workers.md "A lease taken away" ("a lease removed by hand"): the
    worker's next renewal finds no lease, kills the tool and reports the job ``lost``, leaving
    ``claimed/J/J`` alone.  Plain ``recover`` reports the incomplete pair (exit 1, nothing
    moved); ``recover --reconcile`` sends it back to pending, and it runs again once."""
    job = queue.publish(first_run_hangs(outbox, "bare"), name="bare")
    with reaped(start_worker(queue, "--ttl", "1.5", "--drain")) as proc:
        assert wait_for(lambda: runs_of(outbox, "bare") == 1, WAIT), proc.poll()
        (queue.dir / "lease" / job / "worker").unlink()
        out, err = proc.communicate(timeout=45)
    assert proc.returncode == 0 and "Traceback" not in err, err
    assert [e["job"] for e in events(out) if e.get("event") == "lost"] == [job], out
    assert wait_for(lambda: not alive(int((outbox / "bare.pid-1").read_text())), WAIT)
    assert (queue.dir / "claimed" / job / job).is_file()
    assert queue.state(job) is None  # claimed without a lease: not a whole state

    before = snapshot(queue.dir)
    plain = queue.run("recover", "--json")
    assert plain.rc == 1 and [i["job"] for i in plain.json()["incomplete"]] == [job], plain
    assert snapshot(queue.dir) == before
    fixed = queue.run("recover", "--reconcile", "--json")
    assert fixed.rc == 0 and [r["job"] for r in fixed.json()["repaired"]] == [job], fixed
    assert queue.state(job) == "pending"
    with reaped(start_worker(queue, "--ttl", "3", "--drain")) as again:
        again.communicate(timeout=45)
    assert again.returncode == 0
    state, result = queue.only_result(job)
    assert state == "done" and result["output"] == "bare-2\n", result
    assert not (outbox / "bare.overlap").exists()
    queue.assert_settled()
