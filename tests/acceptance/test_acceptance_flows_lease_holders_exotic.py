"""Unusual lease holders and lifetimes (SPEC Q-3, Q-5, §2.4 ``ctx queue claim --pid PID --ttl
S``, ``renew``, ``finish``; docs/queue.md "lease", "Liveness", "Command line").

The holder named by ``--pid``: pid 1, a pid beyond every process (the kernel's largest),
numbers no process can have (0, negative, past 2**22, hexadecimal, exponent, empty), the
claiming command's own process (``exec ctx queue claim --pid $$``), and a thread id that is
not a process id.  ``--ttl`` at its edges: zero, negative, an underflow to zero, a lifetime
shorter than the claim itself, a fraction, a year and a day (366 days, the largest) and a
hair past it.  ``renew`` tried by the holder's child, pipeline, background job and
``sh -c exec``, by its parent and a sibling, and after a sibling finished the job; a member of
a group queue and root renewing each other's leases.  A holder that ``exec``s another program
keeps its job (same pid, same start time), while a process that took its pid afterwards,
running the very same program, does not (a pid namespace with ``ns_last_pid``).  In each case
the lease file carries Q-3's fields: ``worker``, ``host``, ``boot_id``, ``pid_ns``, ``pid``,
the start time (``create_time``), ``claimed_at``, ``expires_at``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    QueueCLI,
    clean_env,
    ctx_run,
    new_scratch_dir,
    rfc3339,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.support.users import members_of

SCRATCH = scratch_top(__file__)
WAIT = 20.0
YEAR_AND_A_DAY = 366 * 24 * 3600  # the longest lease §2.4's --ttl takes (docs/queue.md)
PID_MAX_LIMIT = 2**22  # no Linux pid is larger, whatever kernel.pid_max says

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acts as other users: needs root")

# ------------------------------------------------------------------------------ helpers


def now() -> datetime:
    return datetime.now(UTC)


def start_time(pid: int) -> float:
    """A process's start time in seconds since the epoch (as psutil's ``create_time``)."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    booted = next(
        float(line.split()[1])
        for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime ")
    )
    return booted + ticks / os.sysconf("SC_CLK_TCK")


def period(lease: dict) -> float:
    """How long the lease was taken, or last renewed, for."""
    since = lease.get("renewed_at") or lease["claimed_at"]
    return (rfc3339(lease["expires_at"]) - rfc3339(since)).total_seconds()


def assert_q3_lease(
    lease: dict,
    job: str,
    pid: int,
    ttl: float,
    *,
    worker: str | None = None,
    pid_ns: int | None = None,
    started: float | str | None = "auto",
) -> None:
    """``lease`` names its holder as Q-3 lists it: ``worker`` (default ``HOST:PID``), this
    host, this boot, ``pid_ns`` (default: this process's), ``pid``, its start time (default:
    read from /proc; ``"any"``: some number; None for a pid no process has), ``claimed_at``
    and ``expires_at`` exactly ``ttl`` apart (from ``renewed_at`` after a renewal)."""
    q3 = {"worker", "host", "boot_id", "pid_ns", "pid", "create_time", "claimed_at", "expires_at"}
    assert q3 <= set(lease), (q3 - set(lease), lease)
    assert set(lease) - q3 <= {"job", "machine_id", "boot_time", "renewed_at"}, lease
    assert lease.get("job", job) == job, lease
    host = socket.gethostname()
    assert lease["host"] == host, lease
    assert lease["worker"] == (worker or f"{host}:{pid}"), lease
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert lease["boot_id"] == boot, lease
    want_ns = os.stat("/proc/self/ns/pid").st_ino if pid_ns is None else pid_ns
    assert lease["pid_ns"] == want_ns and isinstance(lease["pid_ns"], int), lease
    assert lease["pid"] == pid and isinstance(lease["pid"], int), lease
    if started == "auto":
        started = start_time(pid)
    if started is None:
        assert lease["create_time"] is None, lease
    elif started == "any":
        assert isinstance(lease["create_time"], float), lease
    else:
        assert lease["create_time"] == pytest.approx(started, abs=0.05), lease
    claimed = rfc3339(lease["claimed_at"])
    assert claimed <= now() + timedelta(seconds=1), lease
    assert period(lease) == pytest.approx(ttl, abs=1e-3), lease


def jobs_in(report: dict, key: str) -> list[str]:
    return sorted(entry["job"] for entry in report[key])


def holder_of(queue: QueueCLI, job: str) -> dict:
    shown = queue.run("show", job, "--json")
    assert shown.rc == 0, shown
    return shown.json()["holder"]


def until_past(stamp: str) -> None:
    expiry = rfc3339(stamp)
    assert wait_for(lambda: now() > expiry + timedelta(seconds=0.05), WAIT), stamp


def user_env(queue: QueueCLI, **extra: str) -> dict[str, str]:
    """A user's shell: the storage root, and the venv's ``ctx`` first on PATH."""
    path = f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return clean_env(CTX_STORAGE=str(queue.storage), PATH=path, **extra)


def refused_as_usage(run, option: str) -> None:
    """§2.4: exit 2, EINVAL naming the option, no traceback, nothing but the error on stdout."""
    assert run.rc == 2, run
    assert "EINVAL" in run.err and option in run.err, run
    assert "Traceback" not in run.err, run
    assert run.out == "" or run.json()["error"] == "EINVAL", run


@contextlib.contextmanager
def ended(*procs: subprocess.Popen) -> Iterator[None]:
    """Every process given is continued, killed and reaped on the way out."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            with contextlib.suppress(Exception):
                proc.communicate(timeout=10)


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    box = new_scratch_dir(SCRATCH, prefix)
    try:
        yield box
    finally:
        shutil.rmtree(box, ignore_errors=True)


# ------------------------------------------------------------------------------ --pid values

NOT_PIDS = ["0", "-1", str(PID_MAX_LIMIT + 1), str(2**63)]
NOT_DECIMAL = ["0x10", "1e3", ""]


def test_pids_no_process_can_have_are_usage_errors_for_claim_and_renew(queue, child):
    """§2.4 ``--pid``: 0, a negative number, 2**22 + 1 and 2**63 (no Linux pid is larger than
    2**22), and spellings that are not decimal digits (hexadecimal, an exponent, empty) are
    usage errors of ``claim`` and ``renew`` alike: exit 2, EINVAL naming ``--pid``, before
    anything moves; the claimed job keeps its lease byte for byte and the pending one stays
    first in line."""
    held = queue.publish(name="held")
    assert queue.claim("--pid", str(child.pid), "--ttl", "600") == held
    waiting = queue.publish(name="waiting")
    before = snapshot(queue.dir)
    for value in [*NOT_PIDS, *NOT_DECIMAL]:
        refused_as_usage(queue.run("claim", "--pid", value, "--json"), "--pid")
        refused_as_usage(queue.run("renew", held, "--pid", value, "--ttl", "900"), "--pid")
        assert snapshot(queue.dir) == before, value
    assert queue.run("list", "--state", "pending").lines() == [waiting]


def test_the_largest_pid_linux_can_give_names_a_holder_that_is_gone(queue):
    """§2.4 ``--pid``, Q-3, Q-5, docs/queue.md ("``--pid`` may name a process that does not
    exist"): 2**22 is a pid Linux can give, and no process has it here (pid_max is lower, or
    it is simply free).  The claim takes it as named: exit 0, J on stdout, a note naming the
    pid on stderr; the lease carries every Q-3 field with no start time.  ``show`` calls the
    holder gone and plain ``recover`` requeues J at once, first in line again."""
    if os.path.exists(f"/proc/{PID_MAX_LIMIT}"):
        pytest.skip(f"pid {PID_MAX_LIMIT} runs here")
    job = queue.publish(name="beyond")
    later = queue.publish(name="later")
    took = queue.run("claim", "--pid", str(PID_MAX_LIMIT), "--ttl", "600")
    assert took.rc == 0 and took.lines() == [job], took
    assert "note" in took.err and str(PID_MAX_LIMIT) in took.err, took
    assert_q3_lease(queue.lease(job), job, PID_MAX_LIMIT, 600, started=None)
    verdict = holder_of(queue, job)
    assert verdict["state"] == "gone" and str(PID_MAX_LIMIT) in verdict["reason"], verdict
    requeued = queue.run("recover", "--json")
    assert requeued.rc == 0 and jobs_in(requeued.json(), "requeued") == [job], requeued
    assert queue.run("list", "--state", "pending").lines() == [job, later]


def test_pid_1_holds_a_lease_until_it_expires_and_is_renewed_by_name(queue):
    """§2.4, Q-3, Q-5, docs/queue.md ("Pid 1 is not refused"): ``claim --pid 1`` leases to
    init, which never exits.  The lease names pid 1 with its start time and every Q-3 field;
    ``show`` calls it alive and ``recover`` leaves the job alone while the lease lasts.
    ``renew --pid 1`` extends it, keeping holder and ``claimed_at``.  A second claim for pid 1
    with ``--ttl 1`` is requeued once it expired, though pid 1 runs on: expiry is proof."""
    kept = queue.publish(name="init-kept")
    lapsing = queue.publish(name="init-lapsing")
    took = queue.run("claim", "--pid", "1", "--ttl", "600", "--json")
    assert took.rc == 0 and took.json()["name"] == kept and took.err == "", took
    lease = queue.lease(kept)
    assert took.json()["lease"] == lease
    assert_q3_lease(lease, kept, 1, 600)
    assert holder_of(queue, kept)["state"] == "alive"
    assert queue.claim("--pid", "1", "--ttl", "1", "--worker", "init-short") == lapsing
    assert_q3_lease(queue.lease(lapsing), lapsing, 1, 1, worker="init-short")

    renewed = queue.run("renew", kept, "--pid", "1", "--ttl", "900", "--json")
    assert renewed.rc == 0 and renewed.err == "", renewed
    after = queue.lease(kept)
    assert renewed.json() == after
    assert_q3_lease(after, kept, 1, 900)
    same = ("worker", "host", "boot_id", "pid_ns", "pid", "create_time", "claimed_at")
    assert {k: after[k] for k in same} == {k: lease[k] for k in same}, (lease, after)

    until_past(queue.lease(lapsing)["expires_at"])
    verdict = holder_of(queue, lapsing)
    assert verdict["state"] == "gone" and "expired" in verdict["reason"], verdict
    report = queue.run("recover", "--json")
    assert report.rc == 0, report
    assert jobs_in(report.json(), "requeued") == [lapsing], report
    assert kept in jobs_in(report.json(), "untouched"), report
    assert queue.state(kept) == "claimed" and queue.state(lapsing) == "pending"
    assert queue.finish(kept).rc == 0
    assert queue.only_result(kept)[1]["worker"]["pid"] == 1


def test_a_claim_naming_its_own_process_is_told_its_holder_ends_with_it(queue, tmp_path):
    """§2.4 ``--pid``, Q-5, docs/queue.md: a script told both "pass ``--pid $$``" and "or run
    ``exec ctx queue claim …``" may do both.  The lease then names the claim's own process,
    which has exited once the job's name is printed: ``recover`` requeues the job while the
    script starts on it.  ``renew`` warns in that very case ("the lease holder is this
    command's own process"), and a claim for a pid that has exited says so in a note; a
    claim for its own pid is owed the same warning (or a refusal)."""
    job = queue.publish(name="self")
    pid_file = tmp_path / "pid"
    done = subprocess.run(
        [
            "sh",
            "-c",
            'echo $$ > "$1"; exec ctx queue claim --project proj --pid $$',
            "sh",
            pid_file,
        ],
        env=user_env(queue),
        capture_output=True,
        text=True,
        timeout=60,
    )
    own = int(pid_file.read_text())
    assert done.returncode == 0 and done.stdout.strip() == job, done
    lease = queue.lease(job)
    assert lease["pid"] == own, lease
    assert holder_of(queue, job)["state"] == "gone"  # the claim has exited
    assert done.returncode == 1 or ("note" in done.stderr and str(own) in done.stderr), done


THREADED = """
import os, sys, threading
ready, tids = threading.Event(), []
def run():
    tids.append(threading.get_native_id())
    ready.set()
    sys.stdin.readline()
side = threading.Thread(target=run)
side.start()
ready.wait()
print(os.getpid(), tids[0], flush=True)
side.join()
print("joined", flush=True)
sys.stdin.readline()
"""


def test_a_thread_id_is_not_taken_for_a_process_id(queue):
    """Q-3 (the lease names the holder's *pid*), Q-5, §2.4 ``--pid``: a thread's id answers
    ``kill(tid, 0)`` and has a /proc entry, but it is no process id.  ``claim --pid TID`` is
    owed a refusal (exit 2, as for any number no process has) or a lease naming the process
    the thread belongs to; what it must never do is hand the job to recover when that one
    thread ends while the process goes on working."""
    job = queue.publish(name="threaded")
    proc = subprocess.Popen(
        [sys.executable, "-c", THREADED],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    with ended(proc):
        pid, tid = map(int, proc.stdout.readline().split())
        assert pid != tid and Path(f"/proc/{pid}/task/{tid}").is_dir()
        took = queue.run("claim", "--pid", str(tid), "--ttl", "600")
        if took.rc == 2:  # refused: nothing moved
            assert queue.state(job) == "pending", took
            return
        assert took.rc == 0 and took.lines() == [job], took
        assert queue.lease(job)["pid"] == pid, queue.lease(job)
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "joined"
        assert proc.poll() is None
        report = queue.run("recover", "--json")
        assert report.rc == 0 and report.json()["requeued"] == [], report
        assert queue.state(job) == "claimed"


# ------------------------------------------------------------------------------ --ttl edges

NOT_LIFETIMES = ["0e0", "-0.5", "1e-400", str(YEAR_AND_A_DAY + 0.001)]


def test_ttl_edges_of_claim_and_renew(queue, child):
    """§2.4 ``--ttl``, Q-3, docs/queue.md (``lease_ttl``: above 0, at most 366 days): zero
    spelled with an exponent, a negative fraction, a number that underflows to zero (1e-400)
    and a millisecond past 366 days are usage errors of ``claim`` and ``renew`` (exit 2, EINVAL
    naming ``--ttl``) that move nothing.  A fraction (0.25 s) and a year and a day (366 days
    to the second) are taken exactly; ``renew`` without ``--ttl`` renews the year and a day
    for as long again, and with ``--ttl 0.5`` shortens it, as asked."""
    pid = str(child.pid)
    held = queue.publish(name="held")
    assert queue.claim("--pid", pid, "--ttl", "600") == held
    queue.publish(name="waiting")
    before = snapshot(queue.dir)
    for value in NOT_LIFETIMES:
        refused_as_usage(queue.run("claim", "--pid", pid, "--ttl", value), "--ttl")
        refused_as_usage(queue.run("renew", held, "--pid", pid, "--ttl", value), "--ttl")
        assert snapshot(queue.dir) == before, value

    queue.publish(name="later")  # the two claims below take "waiting", then "later"
    long = queue.run("claim", "--pid", pid, "--ttl", str(YEAR_AND_A_DAY), "--json")
    assert long.rc == 0 and long.err == "", long
    long_job = long.json()["name"]
    assert_q3_lease(queue.lease(long_job), long_job, child.pid, YEAR_AND_A_DAY)
    expires = rfc3339(queue.lease(long_job)["expires_at"])
    assert expires - now() > timedelta(days=365, hours=23), expires
    short = queue.run("claim", "--pid", pid, "--ttl", "0.25", "--json")
    assert short.rc == 0, short
    short_job = short.json()["name"]
    assert_q3_lease(queue.lease(short_job), short_job, child.pid, 0.25)

    again = queue.run("renew", long_job, "--pid", pid, "--json")
    assert again.rc == 0, again
    assert_q3_lease(again.json(), long_job, child.pid, YEAR_AND_A_DAY)
    shorter = queue.run("renew", long_job, "--pid", pid, "--ttl", "0.5", "--json")
    assert shorter.rc == 0, shorter
    assert_q3_lease(queue.lease(long_job), long_job, child.pid, 0.5)
    until_past(queue.lease(long_job)["expires_at"])
    until_past(queue.lease(short_job)["expires_at"])
    report = queue.run("recover", "--json")
    assert report.rc == 0, report
    assert jobs_in(report.json(), "requeued") == sorted([long_job, short_job]), report
    assert queue.state(held) == "claimed"


def test_a_lease_shorter_than_the_claim_itself_is_never_handed_out(queue, child):
    """Q-3, Q-5, docs/queue.md claim step 6: "a lease already expired when the claim returns
    is proof of its holder's death (Q-5), and the next recover would requeue the job just
    given, to run twice … Refused, the claim fails saying not to run J".  ``--ttl 0.000001``
    is above 0, yet no claim completes within a microsecond: the claim is owed a refusal of
    that lifetime (exit 2) or a failure (exit 1) that leaves J to recover, never exit 0 with
    J on stdout for a script to run."""
    job = queue.publish(name="instant")
    took = queue.run("claim", "--pid", str(child.pid), "--ttl", "0.000001")
    assert took.rc in (1, 2), took
    assert took.out == "", took
    assert queue.state(job) in ("pending", "claimed"), took


RENEW_TO_NOW = r"""
J=$(ctx queue claim --project proj --ttl 600)
echo "$J" > "$OUT/job"
ctx queue renew --project proj "$J" --ttl 0.000001 > "$OUT/renew.out" 2> "$OUT/renew.err"
echo $? > "$OUT/renew.rc"
"""


def test_a_renewal_that_ends_the_lease_is_not_a_silent_success(queue, tmp_path):
    """§2.4 ``renew``, Q-5: a shell claims (``--ttl 600``) and renews its own lease with
    ``--ttl 0.000001``.  The lease it leaves is already expired: the next ``recover``
    requeues the job the shell works on.  ``renew --pid`` in that case adds a note that the
    lease is already gone; the same renewal from the holder's own shell is owed the same
    note (or a refusal), not a bare ``J leased until T`` and exit 0."""
    queue.publish(name="renewed-to-now")
    subprocess.run(
        ["bash", "-c", RENEW_TO_NOW],
        env=user_env(queue, OUT=str(tmp_path)),
        check=True,
        timeout=60,
    )
    job = (tmp_path / "job").read_text().strip()
    assert holder_of(queue, job)["state"] == "gone"
    rc = int((tmp_path / "renew.rc").read_text())
    err = (tmp_path / "renew.err").read_text()
    assert rc != 0 or "note" in err, (rc, (tmp_path / "renew.out").read_text(), err)


# ------------------------------------------------------------------------------ renew by kin

FAMILY = r"""
lease() { cat "$Q/lease/$J/worker"; }
J=$(ctx queue claim --project proj --ttl 60 --worker kin)
echo "$J" > "$OUT/job"; echo $$ > "$OUT/holder"
lease > "$OUT/lease0"
( ctx queue renew --project proj "$J" --ttl 70 --json; echo "rc=$?" ) > "$OUT/subshell" 2>&1
{ ctx queue renew --project proj "$J" --ttl 71 --json 2>&1; } | cat > "$OUT/pipeline"
sh -c "ctx queue renew --project proj $J --ttl 72; echo rc=\$?" > "$OUT/sh-child" 2>&1
lease > "$OUT/lease1"
ctx queue renew --project proj "$J" --ttl 73 --json > "$OUT/background" 2>&1 &
wait $!; echo "rc=$?" >> "$OUT/background"
sh -c "exec ctx queue renew --project proj $J --ttl 74 --json" > "$OUT/sh-exec" 2>&1
echo "rc=$?" >> "$OUT/sh-exec"
touch "$OUT/ready"
until [ -e "$OUT/go" ]; do sleep 0.02; done
ctx queue renew --project proj "$J" --json > "$OUT/late.out" 2> "$OUT/late.err"
echo $? > "$OUT/late.rc"
"""

SIBLING_RENEW = 'ctx queue renew --project proj "$1" --ttl 76; echo "rc=$?"'
SIBLING_FINISH = """echo '{"by": "sibling"}' | ctx queue finish --project proj "$1" --ok -"""


def test_only_the_holder_renews_whether_its_child_parent_or_sibling_asks(queue, tmp_path):
    """§2.4 (``renew`` extends the caller's own lease), Q-3 ("no other process renews
    leases"), docs/queue.md "renew": a bash script claims (the lease names the script's shell).
    Its subshell, a pipeline element inside a ``{ }`` group and a child ``sh`` that runs
    renew as a child are other processes: EACCES (exit 1) naming the holder and the hint to
    pass ``--pid $$``, the lease unchanged byte for byte.  A background job and ``sh -c
    "exec …"`` run renew as the shell's own child: renewed, to the lifetime asked, holder and
    ``claimed_at`` kept.  The script's parent and a sibling process are refused too.  After a
    sibling finishes the job (a shell's finish does not check the holder) the holder's renew
    says the job is already done (exit 1) and the one result stands."""
    queue.publish(name="kin")
    script = subprocess.Popen(
        ["bash", "-c", FAMILY],
        env=user_env(queue, OUT=str(tmp_path), Q=str(queue.dir)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    with ended(script):
        assert wait_for(lambda: (tmp_path / "ready").exists(), WAIT), script.poll()
        job = (tmp_path / "job").read_text().strip()
        holder = int((tmp_path / "holder").read_text())
        assert holder == script.pid
        first = json.loads((tmp_path / "lease0").read_text())
        assert_q3_lease(first, job, holder, 60, worker="kin")
        assert (tmp_path / "lease1").read_text() == (tmp_path / "lease0").read_text()
        for name in ("subshell", "pipeline", "sh-child"):
            said = (tmp_path / name).read_text()
            assert "EACCES" in said and f"pid {holder}" in said, (name, said)
            assert "--pid $$" in said, (name, said)
        for name, ttl in (("background", 73), ("sh-exec", 74)):
            said = (tmp_path / name).read_text()
            assert said.rstrip().endswith("rc=0"), (name, said)
            assert_q3_lease(json.loads(said.splitlines()[0]), job, holder, ttl, worker="kin")
        lease = queue.lease(job)
        assert_q3_lease(lease, job, holder, 74, worker="kin")
        assert lease["claimed_at"] == first["claimed_at"]
        path = queue.dir / "lease" / job / "worker"
        kept = path.read_bytes()

        parent = queue.run("renew", job, "--ttl", "75", "--json")  # the script's parent
        assert parent.rc == 1 and parent.json()["error"] == "EACCES", parent
        sibling = subprocess.run(
            ["bash", "-c", SIBLING_RENEW, "sh", job],
            env=user_env(queue),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert sibling.stdout.strip() == "rc=1" and "EACCES" in sibling.stderr, sibling
        assert path.read_bytes() == kept

        finished = subprocess.run(
            ["bash", "-c", SIBLING_FINISH, "sh", job],
            env=user_env(queue),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert finished.returncode == 0, finished
        (tmp_path / "go").touch()
        _, err = script.communicate(timeout=60)
    assert script.returncode == 0, err
    assert (tmp_path / "late.rc").read_text().strip() == "1"
    late = (tmp_path / "late.err").read_text()
    assert "done" in late and "Traceback" not in late, late
    assert json.loads((tmp_path / "late.out").read_text())["errno"] in (2, 17)
    state, res = queue.only_result(job)
    assert state == "done" and res["output"] == {"by": "sibling"}, res
    assert (res["worker"]["id"], res["worker"]["pid"]) == ("kin", holder), res
    queue.assert_settled()


# ------------------------------------------------------------------------------ exec and reuse

EXECS = r"""
J=$(ctx queue claim --project proj --ttl 600 --worker execer)
echo "$J" > "$OUT/job"
exec sleep 600
"""


def test_a_holder_that_execs_another_program_keeps_its_job(queue, tmp_path):
    """Q-3, Q-5 (a live pid with the lease's start time is the holder), §2.4: a bash script
    claims (the lease names it) and then ``exec``s ``sleep``: the same pid, the same start
    time, another program.  ``show`` calls it alive and running, ``recover`` (plain and
    ``--reconcile``) leaves the job alone, ``renew --pid`` of that pid is the holder's own
    renewal.  Once that process is killed, ``recover`` requeues the job at once."""
    job = queue.publish(name="execs")
    proc = subprocess.Popen(["bash", "-c", EXECS], env=user_env(queue, OUT=str(tmp_path)))
    with ended(proc):
        comm = Path(f"/proc/{proc.pid}/comm")
        assert wait_for(lambda: comm.read_text().strip() == "sleep", WAIT), comm.read_text()
        assert (tmp_path / "job").read_text().strip() == job
        lease = queue.lease(job)
        assert_q3_lease(lease, job, proc.pid, 600, worker="execer")
        verdict = holder_of(queue, job)
        assert verdict["state"] == "alive" and "is running" in verdict["reason"], verdict
        for args in ((), ("--reconcile",)):
            report = queue.run("recover", "--json", *args)
            assert report.rc == 0 and report.json()["requeued"] == [], report
            assert job in jobs_in(report.json(), "untouched"), report
        renewed = queue.run("renew", job, "--pid", str(proc.pid), "--ttl", "900", "--json")
        assert renewed.rc == 0 and renewed.err == "", renewed
        assert_q3_lease(queue.lease(job), job, proc.pid, 900, worker="execer")
        assert queue.lease(job)["create_time"] == lease["create_time"]
        proc.kill()
        proc.wait()
    report = queue.run("recover", "--json")
    assert report.rc == 0 and jobs_in(report.json(), "requeued") == [job], report
    assert "exited" in report.json()["requeued"][0]["detail"], report


IN_NAMESPACE = r"""
B=$1
stat -L -c %i /proc/self/ns/pid > "$B/ns"
sh -c 'J=$(ctx queue claim --project proj --ttl 600 --worker first)
  echo "$J" > "$1/job"; echo $$ > "$1/pid"; exec sleep 600' sh "$B" &
H=$!
until [ -s "$B/pid" ] && [ "$(cat /proc/$H/comm 2>/dev/null)" = sleep ]; do sleep 0.02; done
J=$(cat "$B/job")
ctx queue show --project proj "$J" --json > "$B/show-exec.json"
ctx queue recover --project proj --json > "$B/recover-exec.json"; echo $? > "$B/recover-exec.rc"
touch "$B/execd"
until [ -e "$B/go" ]; do sleep 0.02; done
kill $H; wait $H
echo $((H - 1)) > /proc/sys/kernel/ns_last_pid || exit 98
sleep 600 &
R=$!
echo $R > "$B/pid2"
ctx queue show --project proj "$J" --json > "$B/show-reused.json"
ctx queue renew --project proj "$J" --pid $R --ttl 900 --json > "$B/renew.json"
echo $? > "$B/renew.rc"
ctx queue recover --project proj --json > "$B/recover-reused.json"; echo $? > "$B/recover-reused.rc"
kill $R
"""


@needs_root
def test_in_a_pid_namespace_exec_keeps_the_job_and_a_reused_pid_does_not(queue):
    """Q-3, Q-5 (same boot and pid namespace: a pid with another start time is proof; a pid
    alone is never proof across namespaces): in a new pid namespace a shell claims and
    ``exec``s ``sleep 600``.  Inside, ``show`` calls it alive and ``recover`` leaves the job;
    from the host the lease (``pid_ns`` the namespace's inode, ``pid`` its number there) is a
    holder beyond sight.  The holder is killed and the next process forked there, the very
    same ``sleep 600``, is given its pid (``ns_last_pid``): ``show`` says the pid now belongs
    to another process, ``renew --pid`` of it is EACCES, and ``recover`` requeues the job."""
    prefix = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a pid namespace here: {probe.stderr.strip()}")
    job = queue.publish(name="exec-then-reuse")
    with scratch("ns") as box:
        inner = subprocess.Popen(
            [*prefix, "sh", "-c", IN_NAMESPACE, "sh", str(box)],
            env=user_env(queue),
            stderr=subprocess.PIPE,
            text=True,
        )
        with ended(inner):
            assert wait_for(lambda: (box / "execd").exists(), WAIT), inner.poll()
            first = int((box / "pid").read_text())
            ns = int((box / "ns").read_text())
            lease = queue.lease(job)
            assert lease["pid"] == first and lease["pid_ns"] == ns, lease
            assert_q3_lease(lease, job, first, 600, worker="first", pid_ns=ns, started="any")
            outside = holder_of(queue, job)
            assert outside["state"] == "unknown", outside
            shown = json.loads((box / "show-exec.json").read_text())
            assert shown["holder"]["state"] == "alive", shown
            assert (box / "recover-exec.rc").read_text().strip() == "0"
            report = json.loads((box / "recover-exec.json").read_text())
            assert report["requeued"] == [] and jobs_in(report, "untouched") == [job], report
            (box / "go").touch()
            _, err = inner.communicate(timeout=60)
        assert inner.returncode == 0, (inner.returncode, err)
        second = int((box / "pid2").read_text())
        if second != first:
            pytest.skip(f"pid {first} was not handed out again (got {second})")
        shown = json.loads((box / "show-reused.json").read_text())
        assert shown["holder"]["state"] == "gone", shown
        assert "another process" in shown["holder"]["reason"], shown
        assert (box / "renew.rc").read_text().strip() == "1"
        assert json.loads((box / "renew.json").read_text())["error"] == "EACCES"
        assert (box / "recover-reused.rc").read_text().strip() == "0"
        report = json.loads((box / "recover-reused.json").read_text())
        assert jobs_in(report, "requeued") == [job], report
    assert queue.state(job) == "pending"


# ------------------------------------------------------------------------------ uids

SPACE, GROUP, MEMBER = "lhx", "ctxlhx-g", "ctxlhx-m"


@needs_root
def test_root_and_a_member_renew_only_by_naming_the_holder(searchable_storage):
    """Q-3, Q-5, §2.4, docs/queue.md "A queue shared by a group": in a space of group G, a
    non-root member claims for a process of its own (``--pid``); the lease is Q-3's, readable
    by the group.  Root's ``renew`` without ``--pid`` is not the holder's (EACCES, unchanged);
    with ``--pid`` of the member's process it renews, and the member renews again after it
    and finishes the job: root's renewal leaves the member nothing it may not read or
    replace.  A claim root made for a process of its own is not the member's to renew
    without naming it (EACCES); ``recover`` by the member leaves root's live holder alone."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed")
    (member,), gid = members_of(GROUP, MEMBER)
    storage = searchable_storage
    env = clean_env(CTX_STORAGE=str(storage))
    made = ctx_run("shared", "create", SPACE, "--group", GROUP, env=env)
    assert made.rc == 0, made
    queue = QueueCLI(storage, SPACE)
    with scratch("cache") as cache:
        os.chown(cache, member.uid, member.gid)
        member_env = {**env, "HOME": "/nonexistent", "XDG_CACHE_HOME": str(cache)}
        drop = ["setpriv", f"--reuid={member.uid}", f"--regid={member.gid}", f"--groups={gid}"]

        def as_member(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
            argv = [*drop, "--", *CTX_ARGV, "queue", *args, "--project", SPACE]
            return subprocess.run(
                argv, input=stdin, env=member_env, capture_output=True, text=True, cwd="/"
            )

        mine = queue.publish(name="members")
        roots = queue.publish(name="roots")
        worker = subprocess.Popen([*drop, "--", "sleep", "600"])
        sleeper = subprocess.Popen(["sleep", "600"])
        with ended(worker, sleeper):
            assert wait_for(lambda: Path(f"/proc/{worker.pid}/comm").read_text() == "sleep\n")
            took = as_member("claim", "--pid", str(worker.pid), "--ttl", "60", "--json")
            assert took.returncode == 0, took.stderr
            assert json.loads(took.stdout)["name"] == mine
            assert_q3_lease(queue.lease(mine), mine, worker.pid, 60)
            path = queue.dir / "lease" / mine / "worker"
            before = path.read_bytes()
            refused = queue.run("renew", mine, "--ttl", "600", "--json")
            assert refused.rc == 1 and refused.json()["error"] == "EACCES", refused
            assert path.read_bytes() == before
            by_root = queue.run("renew", mine, "--pid", str(worker.pid), "--ttl", "600")
            assert by_root.rc == 0, by_root
            assert_q3_lease(queue.lease(mine), mine, worker.pid, 600)
            again = as_member("renew", mine, "--pid", str(worker.pid), "--ttl", "90", "--json")
            assert again.returncode == 0, again.stderr
            assert_q3_lease(queue.lease(mine), mine, worker.pid, 90)

            assert queue.claim("--pid", str(sleeper.pid), "--ttl", "600") == roots
            held = (queue.dir / "lease" / roots / "worker").read_bytes()
            foreign = as_member("renew", roots, "--ttl", "900", "--json")
            assert foreign.returncode == 1, foreign
            assert json.loads(foreign.stdout)["error"] == "EACCES", foreign.stdout
            assert (queue.dir / "lease" / roots / "worker").read_bytes() == held
            looked = as_member("recover", "--json")
            assert looked.returncode == 0, looked.stderr
            assert json.loads(looked.stdout)["requeued"] == [], looked.stdout
            assert queue.state(roots) == "claimed"

            done = as_member("finish", mine, "--ok", "-", stdin='{"by": "member"}')
            assert done.returncode == 0, done.stderr
        state, res = queue.only_result(mine)
        assert state == "done" and res["worker"]["pid"] == worker.pid, res
        assert res["output"] == {"by": "member"}, res
