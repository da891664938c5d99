"""Leases over time (SPEC Q-3, Q-4, Q-5, Q-6, §2.4, §3; docs/queue.md, docs/workers.md): a
worker whose job outlives its lease many times over while a user watches it with ``show``,
``list`` and ``recover``; a shell script that claims with ``--ttl`` and renews its own lease
before and after it expires; a worker frozen with SIGSTOP past its expiry whose jobs are
handed on and whose late outcomes are discarded; a shell's late ``finish`` after its job was
claimed again; leases edited by hand; and ``claim --pid`` naming a process that then exits."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    QueueCLI,
    alive,
    clean_env,
    rfc3339,
    snapshot,
    wait_for,
)
from tests.acceptance.workercli import AGENT, shell_job
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="a worker runs its jobs as an agent's uid: needs root"
)

# ------------------------------------------------------------------------------ helpers


def now() -> datetime:
    return datetime.now(UTC)


def env_for(queue: QueueCLI, **extra: str) -> dict[str, str]:
    """A user's shell: the storage root, and the venv's ``ctx`` first on PATH."""
    path = f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return clean_env(CTX_STORAGE=str(queue.storage), PATH=path, **extra)


def worker(queue: QueueCLI, wid: str, *args: str) -> subprocess.Popen:
    """``ctx queue work --json`` as agent ``ci`` with worker id ``wid``."""
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT]
    return subprocess.Popen(
        [*argv, "--json", "--worker", wid, *args],
        env=env_for(queue),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextlib.contextmanager
def reaped(*procs: subprocess.Popen):
    """Every process given is resumed and killed on the way out if it still runs."""
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            with contextlib.suppress(Exception):
                proc.communicate(timeout=10)


def events(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def lines_of(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def gated_job(outbox: Path, tag: str) -> dict:
    """A job that notes each of its runs in ``runs-TAG`` and, run k, waits for ``go-TAG-k``
    before it prints ``TAG-k``."""
    runs = outbox / f"runs-{tag}"
    return shell_job(
        f"echo run >> {runs}; k=$(wc -l < {runs}); "
        f"until [ -e {outbox}/go-{tag}-$k ]; do sleep 0.05; done; echo {tag}-$k"
    )


def jobs_in(report: dict, key: str) -> list[str]:
    return sorted(entry["job"] for entry in report[key])


def until_past(stamp: str) -> None:
    expiry = rfc3339(stamp)
    assert wait_for(lambda: now() > expiry + timedelta(seconds=0.05), 15), stamp


def start_time(pid: int) -> float:
    """A process's start time in seconds since the epoch (as psutil's ``create_time``)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    booted = next(
        float(line.split()[1])
        for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime ")
    )
    return booted + ticks / os.sysconf("SC_CLK_TCK")


# ------------------------------------------------------------------------------ flows


@needs_root
def test_a_worker_renews_a_short_lease_through_a_long_job_while_a_user_watches(
    queue, agent, outbox
):
    """Q-3, Q-5, I-4, docs/workers.md: a worker with ``--ttl 1.2`` runs a 3.5 s job.  Every
    ``show --json`` meanwhile finds the job claimed under an unexpired lease naming the worker
    (pid, id), renewed again and again to a full lifetime past each ``renewed_at`` with the
    same ``claimed_at``; ``list`` and ``status`` say claimed, and a ``recover`` in the middle
    leaves the live holder alone (exit 0).  The job runs and ends exactly once.  A worker
    lease under one second (``--ttl 0.5``: exit 2; ``lease_ttl=0.5``: exit 1) claims nothing."""
    runs = outbox / "runs"
    job = queue.publish(shell_job(f"echo run >> {runs}; sleep 3.5; echo long-done"), name="long")
    renewals: dict[str, str] = {}
    claimed_at = set()
    with reaped(worker(queue, "slow", "--ttl", "1.2", "--drain")) as (proc,):
        assert wait_for(lambda: runs.exists(), 20), proc.poll()
        middle = None
        while proc.poll() is None and queue.state(job) == "claimed":
            asked = now()
            shown = queue.run("show", job, "--json")
            if shown.json().get("state") != "claimed":
                break  # finished between the two looks
            assert shown.rc == 0, shown
            lease = shown.json()["lease"]
            assert (lease["pid"], lease["worker"]) == (proc.pid, "slow"), lease
            assert rfc3339(lease["expires_at"]) > asked, (asked, lease)  # never seen lapsed
            claimed_at.add(lease["claimed_at"])
            if "renewed_at" in lease:
                renewals[lease["renewed_at"]] = lease["expires_at"]
            if middle is None and len(renewals) >= 2:
                listed = queue.run("list", "--state", "claimed", "--json")
                assert listed.rc == 0 and listed.json() == [{"name": job, "state": "claimed"}]
                status = queue.run("status", "--json")
                assert status.rc == 0 and status.json()["claimed"] == 1, status
                middle = queue.run("recover", "--json")
                assert middle.rc == 0, middle
                assert middle.json()["requeued"] == [], middle
                assert job in jobs_in(middle.json(), "untouched"), middle
                assert queue.state(job) == "claimed"
            time.sleep(0.1)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert middle is not None, (renewals, out)
    assert len(claimed_at) == 1, claimed_at  # renewals keep the claim's time
    assert len(renewals) >= 3, renewals  # 3.5 s under a 1.2 s lease
    for renewed, expires in renewals.items():
        period = (rfc3339(expires) - rfc3339(renewed)).total_seconds()
        assert period == pytest.approx(1.2, abs=0.01), (renewed, expires)
    assert runs.read_text() == "run\n"
    state, res = queue.only_result(job)
    assert state == "done" and res["status"] == "ok" and "long-done" in json.dumps(res)
    assert res["worker"]["id"] == "slow", res
    summary = events(out)[-1]
    assert summary["event"] == "stop" and summary.get("lost", 0) == 0, summary
    queue.assert_settled()


SHELL_CLAIMER = r"""
step() { name=$1; shift; "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"; echo $? > "$OUT/$name.rc"; }
J=$(ctx queue claim -p "$P" --worker shell-1 --ttl 2)
echo "$J" > "$OUT/job"
step renew-default ctx queue renew -p "$P" "$J" --json
step renew-own-pid ctx queue renew -p "$P" "$J" --pid $$ --ttl 5 --json
step renew-other-pid ctx queue renew -p "$P" "$J" --pid "$OTHER" --ttl 60 --json
step renew-ttl-zero ctx queue renew -p "$P" "$J" --ttl 0
step renew-ttl-huge ctx queue renew -p "$P" "$J" --ttl 31622401
step renew-short ctx queue renew -p "$P" "$J" --ttl 1 --json
touch "$OUT/short"
until [ -e "$OUT/go" ]; do sleep 0.05; done
step renew-late ctx queue renew -p "$P" "$J" --ttl 30 --json
touch "$OUT/late"
until [ -e "$OUT/go2" ]; do sleep 0.05; done
printf '{"by": "shell"}' > "$OUT/result.json"
step finish ctx queue finish -p "$P" "$J" --ok "$OUT/result.json" --json
step finish-again ctx queue finish -p "$P" "$J" --ok "$OUT/result.json" --json
"""


def test_a_shell_claimer_renews_its_own_lease_before_and_after_it_expires(queue, tmp_path, child):
    """§2.4, Q-3, Q-5, Q-4, docs/queue.md "renew": a bash script claims with ``--ttl 2``; the
    lease names the script's shell.  ``renew`` without ``--ttl`` renews for as long again,
    ``--pid $$`` names the shell itself, ``--pid`` of another live process is refused with
    EACCES (lease unchanged), ``--ttl 0`` or beyond 366 days is a usage error (exit 2).  A
    lease left to lapse but not yet requeued is renewed by its holder, after which recover
    leaves it alone; the shell then finishes once, and a second finish is EEXIST."""
    out = tmp_path / "out"
    out.mkdir()
    job = queue.publish(name="scripted")
    env = env_for(queue, OUT=str(out), P=queue.project, OTHER=str(child.pid))
    script = subprocess.Popen(
        ["bash", "-c", SHELL_CLAIMER],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def step(name: str) -> tuple[int, str, str]:
        rc = int((out / f"{name}.rc").read_text())
        return rc, (out / f"{name}.out").read_text(), (out / f"{name}.err").read_text()

    with reaped(script):
        assert wait_for(lambda: (out / "short").exists(), 30), script.poll()
        assert (out / "job").read_text().strip() == job
        lease = queue.lease(job)
        assert (lease["pid"], lease["worker"]) == (script.pid, "shell-1"), lease

        rc, said, err = step("renew-default")
        assert rc == 0, err
        renewed = json.loads(said)
        assert renewed["pid"] == script.pid and renewed["job"] == job, renewed
        period = rfc3339(renewed["expires_at"]) - rfc3339(renewed["renewed_at"])
        assert period.total_seconds() == pytest.approx(2, abs=0.01)  # as long again

        rc, said, err = step("renew-own-pid")
        assert rc == 0, err
        renewed = json.loads(said)
        period = rfc3339(renewed["expires_at"]) - rfc3339(renewed["renewed_at"])
        assert period.total_seconds() == pytest.approx(5, abs=0.01)

        rc, said, err = step("renew-other-pid")
        assert rc == 1 and json.loads(said)["error"] == "EACCES", (said, err)
        assert str(script.pid) in err and str(child.pid) in err, err
        for name in ("renew-ttl-zero", "renew-ttl-huge"):
            rc, said, err = step(name)
            assert rc == 2 and said == "", (name, err)

        rc, said, err = step("renew-short")
        assert rc == 0, err
        short = json.loads(said)
        assert short["claimed_at"] == lease["claimed_at"], short
        assert queue.lease(job) == short  # what renew printed is what it wrote
        until_past(short["expires_at"])
        assert alive(script.pid)
        (out / "go").touch()
        assert wait_for(lambda: (out / "late").exists(), 30), script.poll()
        rc, said, err = step("renew-late")
        assert rc == 0, err
        late = json.loads(said)
        assert rfc3339(late["expires_at"]) - now() > timedelta(seconds=20), late
        kept = queue.run("recover", "--json")
        assert kept.rc == 0 and kept.json()["requeued"] == [], kept
        assert queue.state(job) == "claimed"

        (out / "go2").touch()
        _, err = script.communicate(timeout=30)
    assert script.returncode == 0, err
    rc, said, err = step("finish")
    assert rc == 0, err
    state, res = queue.only_result(job)
    assert state == "done" and res["output"] == {"by": "shell"}, res
    assert res["worker"]["id"] == "shell-1" and res["worker"]["pid"] == script.pid, res
    assert res["started"] == lease["claimed_at"], res
    rc, said, err = step("finish-again")
    assert rc == 1 and json.loads(said)["error"] == "EEXIST", (said, err)
    assert queue.only_result(job) == (state, res)
    queue.assert_settled()


@needs_root
def test_a_worker_frozen_past_its_lease_loses_both_jobs_and_writes_nothing(queue, agent, outbox):
    """Q-5, Q-6, I-3, I-4, docs/workers.md "A lease taken away": worker A (``--ttl 1``,
    two jobs at once) is stopped with SIGSTOP.  While its leases run, recover leaves its jobs
    alone; once they expired, ``recover --dry-run`` plans to requeue both and changes nothing,
    and ``recover --reconcile`` requeues both though A's pid is alive.  Worker B runs them
    again and finishes one; resumed, A meets the other leased to B (EACCES) and the first
    finished by B (EEXIST): it reports both ``lost``, exits 0, and each job keeps B's one
    result."""
    jobs = {tag: queue.publish(gated_job(outbox, tag), name=tag) for tag in ("x", "y")}
    runs = {tag: outbox / f"runs-{tag}" for tag in jobs}
    first = worker(queue, "A", "--ttl", "1", "--concurrency", "2", "--drain")
    second = None
    with reaped(first) as (a,):
        assert wait_for(lambda: all(lines_of(r) == ["run"] for r in runs.values()), 30), a.poll()
        leases = {tag: queue.lease(job) for tag, job in jobs.items()}
        assert {lease["worker"] for lease in leases.values()} == {"A"}, leases
        os.kill(a.pid, signal.SIGSTOP)
        stopped = now()
        early = queue.run("recover", "--json")
        assert early.rc == 0 and early.json()["requeued"] == [], early
        assert sorted(jobs.values()) == jobs_in(early.json(), "untouched"), early
        for job in jobs.values():
            until_past(queue.lease(job)["expires_at"])
        assert now() - stopped < timedelta(seconds=5)  # no renewal while stopped
        assert alive(a.pid)

        before = snapshot(queue.dir)
        planned = queue.run("recover", "--dry-run", "--json")
        assert planned.rc == 0, planned
        assert jobs_in(planned.json(), "requeued") == sorted(jobs.values()), planned
        assert {e["applied"] for e in planned.json()["requeued"]} == {False}, planned
        assert snapshot(queue.dir) == before
        taken = queue.run("recover", "--reconcile", "--json")
        assert taken.rc == 0, taken
        assert jobs_in(taken.json(), "requeued") == sorted(jobs.values()), taken
        assert {queue.state(job) for job in jobs.values()} == {"pending"}

        second = worker(queue, "B", "--ttl", "30", "--concurrency", "2", "--drain")
        with reaped(second) as (b,):
            assert wait_for(lambda: all(len(lines_of(r)) == 2 for r in runs.values()), 30)
            assert {queue.lease(job)["worker"] for job in jobs.values()} == {"B"}
            (outbox / "go-y-2").touch()
            assert wait_for(lambda: queue.state(jobs["y"]) == "done", 30), b.poll()
            (outbox / "go-x-1").touch()  # A's first runs end while A is stopped
            (outbox / "go-y-1").touch()
            os.kill(a.pid, signal.SIGCONT)
            a_out, a_err = a.communicate(timeout=30)
            assert queue.state(jobs["x"]) == "claimed"
            assert queue.lease(jobs["x"])["worker"] == "B"
            (outbox / "go-x-2").touch()
            b_out, b_err = b.communicate(timeout=30)
    assert a.returncode == 0, a_err
    assert b.returncode == 0, b_err
    lost = {e["job"]: json.dumps(e) for e in events(a_out) if e.get("event") == "lost"}
    assert sorted(lost) == sorted(jobs.values()), a_out
    assert "EACCES" in lost[jobs["x"]] and "EEXIST" in lost[jobs["y"]], lost
    assert not [e for e in events(a_out) if e.get("event") == "renew_failed"], a_out
    summary = events(a_out)[-1]
    assert summary["event"] == "stop" and summary["lost"] == 2, summary
    assert summary.get("done", 0) == 0 and summary.get("failed", 0) == 0, summary
    finished = [e["job"] for e in events(b_out) if e.get("event") == "finish"]
    assert sorted(finished) == sorted(jobs.values()), b_out
    for tag, job in jobs.items():
        state, res = queue.only_result(job)
        assert state == "done" and res["worker"]["id"] == "B", res
        assert f"{tag}-2" in json.dumps(res["output"]) and f"{tag}-1" not in json.dumps(res)
        assert lines_of(runs[tag]) == ["run", "run"]
    queue.assert_settled()


def test_a_shells_late_finish_after_its_job_was_claimed_again(queue, child):
    """Q-4, Q-5, Q-6, I-3, docs/queue.md: a claim made for one process with ``--ttl 1`` lapses
    and is requeued; another claimer takes it.  The first holder's ``renew`` is now EACCES
    (leased to another).  ``finish`` from a shell does not check the holder, so the first
    shell's finish completes the job, recording the lease's holder as its worker; the second
    claimer's finish is EEXIST (exit 1, ``--json`` error object) and there is one result."""
    first = subprocess.Popen(["sleep", "600"])
    with reaped(first):
        job = queue.publish(name="handed")
        took = queue.run("claim", "--pid", str(first.pid), "--worker", "first", "--ttl", "1")
        assert took.rc == 0 and took.lines() == [job], took
        until_past(queue.lease(job)["expires_at"])
        requeued = queue.run("recover", "--json")
        assert requeued.rc == 0 and jobs_in(requeued.json(), "requeued") == [job], requeued
        gone = queue.run("renew", job, "--pid", str(first.pid), "--json")
        assert gone.rc == 1 and "pending" in gone.err, gone
        again = queue.run(
            "claim", "--pid", str(child.pid), "--worker", "second", "--ttl", "600", "--json"
        )
        assert again.rc == 0 and again.json()["name"] == job, again
        assert again.json()["lease"]["pid"] == child.pid, again
        stolen = queue.run("renew", job, "--pid", str(first.pid), "--ttl", "600", "--json")
        assert stolen.rc == 1 and stolen.json()["error"] == "EACCES", stolen
        assert queue.lease(job)["worker"] == "second"

        late = queue.run("finish", job, "--ok", "-", "--json", input='{"by": "first"}')
        assert late.rc == 0, late
        state, res = queue.only_result(job)
        assert state == "done" and res["output"] == {"by": "first"}, res
        assert (res["worker"]["id"], res["worker"]["pid"]) == ("second", child.pid), res
        kept = (queue.dir / "done" / f"{job}.result").read_bytes()

        refused = queue.run("finish", job, "--error", "-", "--json", input='{"by": "second"}')
        assert refused.rc == 1, refused
        error = refused.json()
        assert (error["error"], error["errno"]) == ("EEXIST", 17), error
        assert "ctx queue show" in refused.err, refused
        assert (queue.dir / "done" / f"{job}.result").read_bytes() == kept
        assert queue.entries("failed") == set()
        shown = queue.run("show", job, "--json")
        assert shown.rc == 0 and shown.json()["state"] == "done", shown
    queue.assert_settled()


def test_leases_edited_by_hand_are_judged_as_q3_defines_them(queue, child):
    """Q-3, Q-5, Q-6, docs/queue.md (a lease "written by another tool or by hand"): with the
    holder alive, a lease whose ``expires_at`` was edited into the past (epoch seconds, or
    RFC 3339 without a zone) is requeued by plain recover; a minimal hand-written lease
    (no ``job``, ``start_time``, ``pid_ns`` as ``pid:[N]``, times without zone) is valid and
    kept.  A garbled lease, or one naming another job, is a conflict in status/list/show
    (exit 1), ``renew``/``finish`` refuse it with EINVAL naming ``lease/J/worker`` and
    recover --reconcile leaves it (exit 1); once repaired by hand the job finishes once."""
    pid = str(child.pid)
    names = ("epoch", "nozone", "minimal", "garbled", "elsewhere")
    jobs = {n: queue.publish(name=n) for n in names}
    for name in names:
        assert queue.claim("--pid", pid, "--ttl", "600", "--worker", "desk") == jobs[name]
    real = queue.lease(jobs["epoch"])
    past = now() - timedelta(minutes=5)
    future = now() + timedelta(hours=1)
    naive = "%Y-%m-%dT%H:%M:%S"
    queue.write_lease(jobs["epoch"], {**real, "job": jobs["epoch"], "expires_at": past.timestamp()})
    nozone = {**queue.lease(jobs["nozone"]), "expires_at": past.strftime(naive)}
    queue.write_lease(jobs["nozone"], nozone)
    minimal = {
        "worker": "by-hand",
        "host": socket.gethostname(),
        "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "pid_ns": os.readlink("/proc/self/ns/pid"),
        "pid": child.pid,
        "start_time": start_time(child.pid),
        "claimed_at": (now() - timedelta(minutes=1)).strftime(naive),
        "expires_at": future.strftime(naive),
    }
    queue.write_lease(jobs["minimal"], minimal)
    garbled_text = json.dumps(queue.lease(jobs["garbled"]))[:40]
    (queue.dir / "lease" / jobs["garbled"] / "worker").write_text(garbled_text)
    queue.write_lease(jobs["elsewhere"], {**queue.lease(jobs["elsewhere"]), "job": jobs["epoch"]})
    bad = sorted([jobs["garbled"], jobs["elsewhere"]])

    status = queue.run("status", "--json")
    assert status.rc == 1, status
    assert jobs_in(status.json(), "conflicts") == bad, status
    assert status.json()["claimed"] == 3, status
    listed = queue.run("list", "--json")
    assert listed.rc == 1, listed
    states = {e["name"]: e["state"] for e in listed.json()}
    assert {n: states[jobs[n]] for n in names} == {
        "epoch": "claimed",
        "nozone": "claimed",
        "minimal": "claimed",
        "garbled": "conflict",
        "elsewhere": "conflict",
    }, listed
    for job in bad:
        shown = queue.run("show", job, "--json")
        assert shown.rc == 1 and shown.json()["state"] == "conflict", shown
        evidence = {(queue.dir / "lease" / job / "worker").read_bytes()}
        for argv in (["renew", job, "--pid", pid, "--json"], ["finish", job, "--ok", "--json"]):
            refused = queue.run(*argv, input="{}")
            assert refused.rc == 1 and refused.json()["error"] == "EINVAL", (argv, refused)
            assert f"lease/{job}/worker" in refused.err, refused
        assert {(queue.dir / "lease" / job / "worker").read_bytes()} == evidence

    recovered = queue.run("recover", "--reconcile", "--json")
    assert recovered.rc == 1, recovered
    report = recovered.json()
    assert jobs_in(report, "requeued") == sorted([jobs["epoch"], jobs["nozone"]]), report
    assert jobs_in(report, "conflicts") == bad, report
    assert jobs["minimal"] in jobs_in(report, "untouched"), report
    assert child.poll() is None  # every holder is alive: only the expiries counted
    assert queue.state(jobs["epoch"]) == queue.state(jobs["nozone"]) == "pending"
    for job in (*bad, jobs["minimal"]):
        assert queue.state(job) == "claimed", job

    renewed = queue.run("renew", jobs["minimal"], "--pid", pid, "--ttl", "60", "--json")
    assert renewed.rc == 0, renewed
    assert renewed.json()["worker"] == "by-hand" and renewed.json()["pid"] == child.pid

    for job in bad:  # a person repairs the lease: the holder named again
        repaired = {**real, "job": job}
        queue.write_lease(job, repaired)
    status = queue.run("status", "--json")
    assert status.rc == 0 and status.json()["conflict"] == 0, status
    for job in (*bad, jobs["minimal"]):
        assert queue.finish(job).rc == 0
    for _ in ("epoch", "nozone"):
        assert queue.claim("--pid", pid) in jobs.values()
    for job in (jobs["epoch"], jobs["nozone"]):
        queue.finish(job, "--error", {"why": "hand"})
    for name, job in jobs.items():
        state, _res = queue.only_result(job)
        assert state == ("failed" if name in ("epoch", "nozone") else "done"), (name, state)
    queue.assert_settled()


def test_claim_pid_of_a_process_that_then_exits(queue):
    """§2.4 ``--pid``, Q-5, docs/queue.md: a claim made with ``--pid`` of a live process and a
    long ``--ttl`` is kept while the process runs; once it has exited (a zombie not yet reaped,
    then reaped) ``recover --dry-run`` plans the requeue and plain recover requeues the job,
    first in line.  ``claim --pid`` of a pid that no longer exists says so on stderr, names it
    with no start time, and the next recover requeues it at once.  The job ends once."""
    job = queue.publish(name="orphaned")
    later = queue.publish(name="later")
    holder = subprocess.Popen(["sh", "-c", "read line"], stdin=subprocess.PIPE)
    with reaped(holder):
        took = queue.run("claim", "--pid", str(holder.pid), "--ttl", "3600", "--json")
        assert took.rc == 0 and took.json()["name"] == job, took
        lease = took.json()["lease"]
        assert lease["pid"] == holder.pid and lease["create_time"], lease
        assert queue.lease(job) == lease
        kept = queue.run("recover", "--json")
        assert kept.rc == 0 and job in jobs_in(kept.json(), "untouched"), kept

        holder.stdin.close()  # it exits; left unreaped it is a zombie
        assert wait_for(lambda: not alive(holder.pid), 10)
        assert Path(f"/proc/{holder.pid}").exists()  # still a zombie
        before = snapshot(queue.dir)
        planned = queue.run("recover", "--dry-run", "--json")
        assert planned.rc == 0 and jobs_in(planned.json(), "requeued") == [job], planned
        assert snapshot(queue.dir) == before
        holder.wait()
    dead = holder.pid
    requeued = queue.run("recover", "--json")
    assert requeued.rc == 0, requeued
    assert jobs_in(requeued.json(), "requeued") == [job], requeued
    assert {e["applied"] for e in requeued.json()["requeued"]} == {True}, requeued
    assert queue.run("list", "--state", "pending").lines() == [job, later]

    if alive(dead):
        pytest.skip(f"pid {dead} was reused meanwhile")
    mistyped = queue.run("claim", "--pid", str(dead), "--json")
    assert mistyped.rc == 0 and mistyped.json()["name"] == job, mistyped  # first in line
    assert "note" in mistyped.err and str(dead) in mistyped.err, mistyped
    lease = queue.lease(job)
    assert lease["pid"] == dead and not lease.get("create_time"), lease
    again = queue.run("recover", "--json")
    assert again.rc == 0 and jobs_in(again.json(), "requeued") == [job], again

    me = queue.run("claim", "--ttl", "600", "--json")
    assert me.rc == 0 and me.json()["name"] == job and me.json()["lease"]["pid"] == os.getpid()
    assert queue.finish(job).rc == 0
    assert queue.claim() == later
    queue.finish(later)
    assert queue.only_result(job)[0] == queue.only_result(later)[0] == "done"
    queue.assert_settled()
