"""Clocks, time zones and timestamps (SPEC Q-3, Q-5, Q-6, Q-9, §2.1, §2.4, S-2, N-1;
docs/queue.md "Liveness (Q-5)", "Configuration", docs/multi-host.md "Who is alive: the lease",
docs/workers.md, docs/sessions.md "Events (S-2)").

Every timestamp ctx writes — a request's ``created``, a lease's ``claimed_at``/``expires_at``,
a result's ``started``/``finished``, an event's ``ts``, an auto-generated job name — is UTC
whatever ``TZ`` and ``LC_TIME`` the writer ran under, and a lease written under one time zone
is judged the same under another.  Hand-edited leases are judged as docs/queue.md reads them
(RFC 3339 with or without a zone, none meaning UTC, or epoch seconds); one that cannot be read
is a conflict, never a requeue.  ``--ttl``, ``--grace``, ``lease_ttl`` and ``grace`` hold their
documented bounds.  A holder running in another time namespace (``unshare --time``, other
boot and monotonic clocks) is still identified by its start time.  File mtimes in the far past
or future order claims (Q-9) and age inbox temps as documented."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    clean_env,
    new_scratch_dir,
    request,
    scratch_top,
    wait_for,
)
from tests.acceptance.workercli import AGENT, shell_job
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="a worker runs its jobs as an agent's uid: needs root"
)

# RFC 3339 in UTC as ctx writes it: a four-digit year, optional fraction, ``Z``.
UTC_STAMP = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z")
TIME_NAMESPACE_OFFSET = 1_000_000  # seconds added to the boot and monotonic clocks
NAIVE = "%Y-%m-%dT%H:%M:%S"
KATHMANDU = timezone(timedelta(hours=5, minutes=45))
ST_JOHNS = timezone(-timedelta(hours=3, minutes=30))


# ------------------------------------------------------------------------------ helpers


def now() -> datetime:
    return datetime.now(UTC)


def when(stamp: str) -> datetime:
    """An aware datetime of an RFC 3339 stamp ctx wrote (which must carry ``Z``)."""
    assert UTC_STAMP.fullmatch(stamp), f"{stamp!r} is not RFC 3339 UTC"
    return datetime.fromisoformat(stamp)


def env_of(queue: QueueCLI, **extra: str) -> dict[str, str]:
    base = clean_env(CTX_STORAGE=str(queue.storage))
    base.pop("TZ", None)
    base.pop("LC_TIME", None)
    return {**base, **extra}


def start_time(pid: int) -> float:
    """A process's start time seen from this (the initial) time namespace, as psutil's
    ``create_time`` computes it: boot time plus the start in clock ticks."""
    ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    booted = next(
        float(line.split()[1])
        for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime ")
    )
    return booted + ticks / os.sysconf("SC_CLK_TCK")


def jobs_in(report: dict, key: str) -> list[str]:
    return sorted(entry["job"] for entry in report[key])


def no_traceback(run) -> None:
    assert "Traceback" not in run.err, run
    assert run.rc in (0, 1), run
    for line in run.err.splitlines():
        assert line.startswith("ctx: ") or line.startswith("  "), run


def replace_lease(queue: QueueCLI, job: str, lease: dict | str) -> None:
    """Rewrite ``lease/J/worker`` as a member's editor does: a new file renamed into place."""
    path = queue.dir / "lease" / job / "worker"
    text = lease if isinstance(lease, str) else json.dumps(lease)
    temp = path.with_name("worker.edit")
    temp.write_text(text)
    os.rename(temp, path)


def holder_lease(pid: int, ttl: float = 600) -> dict:
    """A lease naming process ``pid`` of this host, boot and pid namespace with every field
    Q-3 lists, as another tool writes one."""
    claimed = time.time()
    machine = Path("/etc/machine-id")
    return {
        "worker": f"desk:{pid}",
        "host": os.uname().nodename,
        "machine_id": machine.read_text().strip() if machine.exists() else None,
        "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "pid_ns": os.stat("/proc/self/ns/pid").st_ino,
        "pid": pid,
        "create_time": start_time(pid) if Path(f"/proc/{pid}").exists() else None,
        "claimed_at": claimed,
        "expires_at": claimed + ttl,
    }


def hand_claim(queue: QueueCLI, name: str, lease: dict | str) -> str:
    """J claimed and leased as the evidence of §2.1 says, written straight to disk (the
    request in ``claimed/J/J``, the lease in ``lease/J/worker``); returns J."""
    job = f"{name}.req.json"
    (queue.dir / "claimed" / job).mkdir()
    (queue.dir / "claimed" / job / job).write_text(json.dumps(request(tag=name)))
    (queue.dir / "lease" / job).mkdir()
    replace_lease(queue, job, lease)
    return job


def dead_pid() -> int:
    """The pid of a process that has exited (and was reaped)."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


@contextlib.contextmanager
def reaped(*procs: subprocess.Popen) -> Iterator[None]:
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.kill()
            with contextlib.suppress(Exception):
                proc.communicate(timeout=10)


@pytest.fixture
def scratch() -> Iterator[Path]:
    made = new_scratch_dir(scratch_top(__file__))
    made.chmod(0o1777)  # the agent's uid writes its traces here
    yield made
    shutil.rmtree(made, ignore_errors=True)


def _time_namespaces() -> str | None:
    """Why a time namespace cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root for unshare --time"
    if shutil.which("unshare") is None:
        return "needs unshare(1)"
    offset = str(TIME_NAMESPACE_OFFSET)
    probe = ["unshare", "--time", "--fork", "--boottime", offset, "--monotonic", offset]
    done = subprocess.run([*probe, "cat", "/proc/uptime"], capture_output=True, text=True)
    if done.returncode != 0:
        return f"unshare --time fails here: {done.stderr.strip()}"
    if float(done.stdout.split()[0]) < TIME_NAMESPACE_OFFSET:
        return "the boot clock offset of a time namespace does not show in /proc/uptime"
    return None


_NO_TIME_NS = _time_namespaces()
needs_time_ns = pytest.mark.skipif(_NO_TIME_NS is not None, reason=_NO_TIME_NS or "")


def in_time_namespace(script: str, env: dict[str, str]) -> subprocess.Popen:
    """``sh -c SCRIPT`` in a new time namespace whose boot and monotonic clocks run
    :data:`TIME_NAMESPACE_OFFSET` seconds ahead; its stdin is a pipe the test holds."""
    offset = str(TIME_NAMESPACE_OFFSET)
    return subprocess.Popen(
        ["unshare", "--time", "--fork", "--boottime", offset, "--monotonic", offset,
         "sh", "-c", script],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip


# ------------------------------------------------------------------------------ time zones

# Each step of one job's life runs under another TZ (and LC_TIME): offsets of +05:45 and
# -03:30, the zone file named by path, a zone that does not exist, TZ set but empty, and a
# POSIX TZ string.
STEP_ZONES = {
    "publish": ("Asia/Kathmandu", "fr_FR.UTF-8"),
    "claim": ("America/St_Johns", "C"),
    "show": (":/etc/localtime", "de_DE.UTF-8"),
    "recover": ("Nowhere/No_Such_Zone", "POSIX"),
    "renew": ("", "ne_NP"),
    "finish": ("<+0545>-5:45", "C.UTF-8"),
}


def test_every_time_written_under_one_zone_is_utc_and_judged_alike_under_another(queue, child):
    """Q-3, Q-5, §2.1, §2.4 (docs/queue.md: ``created`` is RFC 3339; docs/multi-host.md: the
    lease's times end in ``Z``), each step under another ``TZ`` and ``LC_TIME``
    (:data:`STEP_ZONES`): ``publish`` without ``--name`` names the job with the UTC time and
    stores a UTC ``created``; ``claim --ttl 600`` writes ``claimed_at``/``expires_at`` in UTC
    exactly 600 s apart; the holder is alive for ``show`` (evidence mtimes in UTC) and
    ``recover`` (nothing requeued); ``renew --ttl 900`` prints a UTC expiry that extends the
    lease; ``finish`` records ``started`` as the lease's ``claimed_at`` and a UTC
    ``finished``."""
    env = {step: env_of(queue, TZ=tz, LC_TIME=lc) for step, (tz, lc) in STEP_ZONES.items()}
    before = now()
    bare = {"tool": "fs.read", "input": {"path": "README.md"}}  # publish fills in `created`
    published = queue.run("publish", "-", input=json.dumps(bare), env=env["publish"])
    assert published.rc == 0, published
    job = published.out.strip()
    stamp = re.fullmatch(r"job-(\d{8}T\d{6})-[0-9a-f]+\.req\.json", job)
    assert stamp, job
    named = datetime.strptime(stamp.group(1), "%Y%m%dT%H%M%S").replace(tzinfo=UTC)
    assert before.replace(microsecond=0) <= named <= now(), (job, before)
    stored = json.loads((queue.dir / "pending" / job).read_text())
    assert before <= when(stored["created"]) <= now(), stored

    pid = str(child.pid)
    took = queue.run("claim", "--pid", pid, "--ttl", "600", "--json", env=env["claim"])
    assert took.rc == 0 and took.json()["name"] == job, took
    lease = queue.lease(job)
    claimed, expires = when(lease["claimed_at"]), when(lease["expires_at"])
    assert before <= claimed <= now(), lease
    assert (expires - claimed).total_seconds() == pytest.approx(600, abs=1e-3), lease

    shown = queue.run("show", job, "--json", env=env["show"])
    assert shown.rc == 0 and shown.json()["holder"]["state"] == "alive", shown
    assert all(UTC_STAMP.fullmatch(e["mtime"]) for e in shown.json()["evidence"]), shown
    recovered = queue.run("recover", "--json", env=env["recover"])
    assert recovered.rc == 0 and recovered.json()["requeued"] == [], recovered
    assert job in jobs_in(recovered.json(), "untouched"), recovered

    renewed = queue.run("renew", job, "--pid", pid, "--ttl", "900", env=env["renew"])
    assert renewed.rc == 0, renewed
    said = re.fullmatch(rf"{re.escape(job)} leased until (\S+)", renewed.out.strip())
    assert said and when(said.group(1)) > expires, renewed
    assert queue.lease(job)["expires_at"] == said.group(1)

    finished = queue.run("finish", job, "--ok", "-", input="{}", env=env["finish"])
    assert finished.rc == 0, finished
    result = json.loads((queue.dir / "done" / f"{job}.result").read_text())
    assert result["started"] == lease["claimed_at"], result
    assert claimed <= when(result["finished"]) <= now(), result


def test_hand_written_expiries_are_instants_whatever_the_readers_zone(queue, child):
    """Q-5, docs/queue.md (lease times are "RFC 3339 with or without a zone (none means
    UTC), or seconds since the epoch"): with the holder alive, leases whose ``expires_at``
    was written an hour ahead or behind — zoneless, with ``+05:45`` or ``-03:30``, with nine
    fractional digits, as epoch seconds — are judged by the instant they name.  ``recover
    --dry-run`` under ``TZ=Asia/Kathmandu`` and ``TZ=America/St_Johns`` (where a zoneless
    time read as local would flip) plans to requeue exactly the expired ones, naming each
    expiry in UTC; ``show`` agrees, and ``recover`` requeues them."""
    ahead, behind = now() + timedelta(hours=1), now() - timedelta(hours=1)
    forms = {
        "naive-ahead": (ahead.strftime(NAIVE), ahead, "alive"),
        "naive-behind": (behind.strftime(NAIVE), behind, "gone"),
        "kathmandu-ahead": (ahead.astimezone(KATHMANDU).isoformat(), ahead, "alive"),
        "kathmandu-behind": (behind.astimezone(KATHMANDU).isoformat(), behind, "gone"),
        "stjohns-ahead": (ahead.astimezone(ST_JOHNS).isoformat(), ahead, "alive"),
        "nanos-ahead": (ahead.strftime(NAIVE) + ".123456789Z", ahead, "alive"),
        "epoch-behind": (behind.timestamp(), behind, "gone"),
        "epoch-ahead": (ahead.timestamp(), ahead, "alive"),
    }
    lease = holder_lease(child.pid)
    jobs = {name: hand_claim(queue, name, {**lease, "expires_at": value})
            for name, (value, _, _) in forms.items()}  # fmt: skip
    gone = sorted(jobs[n] for n, (_, _, verdict) in forms.items() if verdict == "gone")

    for tz in ("Asia/Kathmandu", "America/St_Johns"):
        planned = queue.run("recover", "--dry-run", "--json", env=env_of(queue, TZ=tz))
        assert planned.rc == 0, (tz, planned)
        assert jobs_in(planned.json(), "requeued") == gone, (tz, planned)
        assert sorted(jobs.values()) == sorted(gone + jobs_in(planned.json(), "untouched"))
        for entry in planned.json()["requeued"]:
            name = entry["job"].removesuffix(".req.json")
            at = re.search(r"expired at (\S+)", entry["detail"])
            assert at and abs((when(at.group(1)) - forms[name][1]).total_seconds()) < 1, entry
    for name in ("naive-ahead", "naive-behind"):
        shown = queue.run("show", jobs[name], "--json", env=env_of(queue, TZ="Asia/Kathmandu"))
        assert shown.json()["holder"]["state"] == forms[name][2], shown

    recovered = queue.run("recover", "--json", env=env_of(queue, TZ="America/St_Johns"))
    assert recovered.rc == 0, recovered
    assert jobs_in(recovered.json(), "requeued") == gone, recovered
    for name, (_, _, verdict) in forms.items():
        assert queue.state(jobs[name]) == ("pending" if verdict == "gone" else "claimed"), name
    assert child.poll() is None


def test_renew_of_a_lease_written_in_other_offsets_never_shortens_it(queue, child):
    """§2.4, docs/queue.md (``renew`` without ``--ttl`` renews "for as long again as it was
    taken or last renewed for"): a hand-written lease whose ``claimed_at`` is in ``+05:45``
    and whose ``expires_at`` is two hours later, zoneless (UTC), has a two-hour period;
    ``renew`` under ``TZ=America/St_Johns`` extends it by that, never to the queue's
    300-second ``lease_ttl``, and writes every time back in UTC.  ``finish`` then records
    ``started`` as that same instant, in UTC."""
    claimed = now() - timedelta(seconds=5)
    expires = claimed + timedelta(hours=2)
    lease = holder_lease(child.pid)
    lease.update(claimed_at=claimed.astimezone(KATHMANDU).isoformat(),
                 expires_at=expires.strftime(NAIVE + ".%f"))  # fmt: skip
    job = hand_claim(queue, "offsets", lease)
    renewed = queue.run("renew", job, "--pid", str(child.pid), "--json",
                        env=env_of(queue, TZ="America/St_Johns"))  # fmt: skip
    assert renewed.rc == 0, renewed
    after = queue.lease(job)
    for key in ("claimed_at", "expires_at", "renewed_at"):
        assert UTC_STAMP.fullmatch(after[key]), after
    assert when(after["expires_at"]) >= expires, (lease, after)
    period = when(after["expires_at"]) - when(after["renewed_at"])
    assert period.total_seconds() == pytest.approx(7200, abs=1), after
    assert abs((when(after["claimed_at"]) - claimed).total_seconds()) < 1e-3, after
    assert queue.finish(job).rc == 0
    result = json.loads((queue.dir / "done" / f"{job}.result").read_text())
    assert abs((when(result["started"]) - claimed).total_seconds()) < 1e-3, result


UNREADABLE_EXPIRIES = {
    "words": "tomorrow",
    "empty": "",
    "null": None,
    "true": True,
    "list": [2026, 6, 22],
    "object": {"at": "2026-06-22T12:00:00Z"},
    "month-13": "2026-13-01T00:00:00Z",
}


def test_an_unreadable_expiry_is_a_conflict_never_a_requeue_even_with_the_holder_gone(queue):
    """Q-5, Q-6, docs/queue.md ("A claimed job whose lease cannot be read at all … is never
    requeued, and it is reported as a conflict"): the holder has exited, but ``expires_at``
    is words, empty, null, a boolean, a list, an object or month 13.  ``status``, ``show``,
    plain ``recover`` and ``recover --reconcile`` report each as a conflict (exit 1) and
    requeue none; the lease files stay byte for byte."""
    lease = holder_lease(dead_pid())
    jobs = {name: hand_claim(queue, name, {**lease, "expires_at": value})
            for name, value in UNREADABLE_EXPIRIES.items()}  # fmt: skip
    leases = {job: (queue.dir / "lease" / job / "worker").read_bytes() for job in jobs.values()}
    every = sorted(jobs.values())

    status = queue.run("status", "--json")
    assert status.rc == 1 and jobs_in(status.json(), "conflicts") == every, status
    for job in every[::3]:
        shown = queue.run("show", job, "--json")
        assert shown.rc == 1 and shown.json()["state"] == "conflict", shown
        assert shown.json()["holder"]["state"] == "unreadable", shown
    for args in ((), ("--reconcile",)):
        recovered = queue.run("recover", "--json", *args)
        assert recovered.rc == 1 and recovered.json()["requeued"] == [], recovered
        assert jobs_in(recovered.json(), "conflicts") == every, recovered
    for job, data in leases.items():
        assert queue.state(job) == "claimed", job
        assert (queue.dir / "lease" / job / "worker").read_bytes() == data


# Lease times that name an instant no UTC date of years 1 to 9999 can spell.
OUT_OF_RANGE = {
    "epoch-milliseconds-outside-this-pid-namespace": ("expires_at", "ms", 7),
    "year-0-once-in-utc": ("expires_at", "0001-01-01T00:00:00+05:45", 0),
    "integer-of-400-digits": ("expires_at", 10**400, 0),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_lease_times_beyond_any_date_are_judged_or_refused_never_a_traceback(queue, child, case):
    """Q-5, Q-6, docs/queue.md ("`recover` never stops at one job"; lease times may be epoch
    seconds): one lease's ``expires_at`` is edited to an instant outside what a date can
    spell — epoch milliseconds (a common slip), an offset that carries 0001-01-01 into year
    0, an integer of 400 digits — beside a job whose lease plainly expired.  ``status``,
    ``show`` and ``recover`` answer without a traceback (exit 0 or 1, errors as ``ctx: …``);
    ``recover`` still requeues the expired job, and leaves the odd one claimed (a conflict,
    or a holder judged) or requeues it."""
    field, value, pid_ns_shift = OUT_OF_RANGE[case]
    if value == "ms":
        value = int(time.time() * 1000) + 3_600_000
    lease = holder_lease(child.pid)
    odd = hand_claim(
        queue, "odd", {**lease, field: value, "pid_ns": lease["pid_ns"] + pid_ns_shift}
    )
    plain = hand_claim(queue, "plain", {**lease, "expires_at": time.time() - 60})

    for argv in (("status",), ("show", odd)):
        no_traceback(queue.run(*argv))
    recovered = queue.run("recover", "--json")
    no_traceback(recovered)
    assert plain in jobs_in(recovered.json(), "requeued"), recovered
    assert queue.state(plain) == "pending"
    assert queue.state(odd) in ("claimed", "pending"), odd


def test_renew_and_finish_of_a_lease_dated_in_epoch_milliseconds(queue, child):
    """Q-3, Q-4, §2.4, docs/queue.md (lease times may be epoch seconds; ``finish`` and
    ``renew`` of a lease that is not a lease are refused with the lease's error): the
    holder's lease gives ``expires_at`` (one job) or ``claimed_at`` (another) in epoch
    milliseconds.  ``renew`` and ``finish`` either do their work, writing RFC 3339 UTC, or
    refuse with a ``ctx:`` error (exit 1) naming the lease; never a traceback."""
    milliseconds = int(time.time() * 1000)
    jobs = {}
    for field in ("expires_at", "claimed_at"):
        name = f"ms-{field.replace('_', '-')}"
        jobs[field] = hand_claim(queue, name, {**holder_lease(child.pid), field: milliseconds})
    for job in jobs.values():
        renewed = queue.run("renew", job, "--pid", str(child.pid))
        no_traceback(renewed)
        if renewed.rc == 0:
            lease = queue.lease(job)
            assert UTC_STAMP.fullmatch(lease["expires_at"]), lease
        finished = queue.run("finish", job, "--ok", "-", input="{}")
        no_traceback(finished)
        if finished.rc == 0:
            result = json.loads((queue.dir / "done" / f"{job}.result").read_text())
            assert UTC_STAMP.fullmatch(result["started"]), result
        else:
            assert f"lease/{job}/worker" in finished.err, finished


def test_a_lease_claimed_before_year_1000_stays_readable_after_renew(queue, child):
    """Q-3, Q-6, §2.1 (``started`` is RFC 3339), docs/queue.md (lease times are RFC 3339):
    a hand-written lease whose ``claimed_at`` is ``0999-06-01T00:00:00Z`` — a valid RFC 3339
    time, read by every command — is renewed by its holder: the lease it writes back must
    still be readable (``status`` exit 0, the job claimed, its ``claimed_at`` a four-digit
    year).  Another such lease finished directly records ``started`` as RFC 3339."""
    lease = {**holder_lease(child.pid), "claimed_at": "0999-06-01T00:00:00Z"}
    renewed_job = hand_claim(queue, "renewed", lease)
    finished_job = hand_claim(queue, "finished", lease)
    assert queue.run("status").rc == 0

    finished = queue.run("finish", finished_job, "--ok", "-", input="{}")
    assert finished.rc == 0, finished
    result = json.loads((queue.dir / "done" / f"{finished_job}.result").read_text())
    assert UTC_STAMP.fullmatch(result["started"]), result

    renewed = queue.run("renew", renewed_job, "--pid", str(child.pid))
    assert renewed.rc == 0, renewed
    assert UTC_STAMP.fullmatch(queue.lease(renewed_job)["claimed_at"]), queue.lease(renewed_job)
    status = queue.run("status", "--json")
    assert status.rc == 0 and status.json()["conflicts"] == [], status
    assert queue.state(renewed_job) == "claimed"


def test_publish_keeps_a_created_time_in_any_rfc3339_spelling(queue):
    """§2.1 (``created`` is RFC 3339), docs/queue.md (``publish`` "keeps every other field"):
    a request whose ``created`` is RFC 3339 in another offset (``+05:45``), with a lower-case
    ``t`` and ``z`` (RFC 3339 §5.6 allows them) or on a leap second (``23:59:60Z``, §5.7) is
    published and stored with that ``created`` as given.  A ``created`` without a zone is
    refused (``EINVAL``), since RFC 3339 requires one."""
    refused = queue.run("publish", "-", input=json.dumps(request(created="2026-06-22T12:00:00")))
    assert refused.rc == 1 and "EINVAL" in refused.err, refused
    for name, created in (
        ("offset", "2026-06-22T12:00:00+05:45"),
        ("lower-case", "2026-06-22t12:00:00z"),
        ("leap-second", "2016-12-31T23:59:60Z"),
    ):
        published = queue.run(
            "publish", "--name", name, "-", input=json.dumps(request(created=created))
        )
        assert published.rc == 0, published
        stored = json.loads((queue.dir / "pending" / f"{name}.req.json").read_text())
        assert stored["created"] == created, stored


# ------------------------------------------------------------------------------ bounds


def test_ttl_and_grace_hold_their_documented_bounds_on_the_command_line_and_in_config(queue, child):
    """§2.4, docs/queue.md "Configuration" (``lease_ttl`` above 0, at most 366 days;
    ``grace`` and ``--grace`` at most 31 622 400 s): ``claim --ttl`` of 31 622 400 and
    ``renew --ttl`` of 0.25 give leases exactly that long; -1, 31 622 400.5, ``nan`` and
    ``1e309`` (``claim``), 0 and ``inf`` (``renew``) are usage errors (exit 2, ``EINVAL``)
    that claim nothing and leave the lease as it was; so is ``--grace 31622400.5``.
    ``lease_ttl=31622400`` in ``queue/config`` gives a 366-day lease; ``lease_ttl`` of 0 or
    ``1e309`` and ``grace`` of 31 622 401 refuse the command (exit 1, ``EINVAL`` naming the
    config line)."""
    pid = str(child.pid)
    first = queue.publish(name="first")
    second = queue.publish(name="second")

    def length(lease: dict) -> float:
        start = lease.get("renewed_at") or lease["claimed_at"]
        return (when(lease["expires_at"]) - when(start)).total_seconds()

    for bad in ("-1", "31622400.5", "nan", "1e309"):
        refused = queue.run("claim", "--pid", pid, "--ttl", bad, "--json")
        assert refused.rc == 2 and refused.json()["error"] == "EINVAL", (bad, refused)
    assert queue.entries("pending") == {first, second}
    assert queue.entries("claimed") == queue.entries("inbox") == set()

    took = queue.run("claim", "--pid", pid, "--ttl", "31622400")
    assert took.rc == 0 and took.out.strip() == first, took
    assert length(queue.lease(first)) == pytest.approx(31622400, abs=1e-3)
    kept = (queue.dir / "lease" / first / "worker").read_bytes()
    for bad in ("0", "inf"):
        refused = queue.run("renew", first, "--pid", pid, "--ttl", bad, "--json")
        assert refused.rc == 2 and refused.json()["error"] == "EINVAL", (bad, refused)
        assert (queue.dir / "lease" / first / "worker").read_bytes() == kept
    renewed = queue.run("renew", first, "--pid", pid, "--ttl", "0.25")
    assert renewed.rc == 0, renewed
    assert length(queue.lease(first)) == pytest.approx(0.25, abs=1e-3)

    config = queue.dir / "config"
    written = config.read_text()
    for line in ("lease_ttl=0", "lease_ttl=1e309"):
        config.write_text(written + line + "\n")
        refused = queue.run("claim", "--pid", pid, "--json")
        assert refused.rc == 1 and refused.json()["error"] == "EINVAL", (line, refused)
        assert "config:" in refused.err, refused
    for line in ("grace=31622401",):
        config.write_text(written + line + "\n")
        refused = queue.run("recover", "--json")
        assert refused.rc == 1 and refused.json()["error"] == "EINVAL", (line, refused)
    assert queue.entries("pending") == {second}
    for bad in ("31622400.5",):
        refused = queue.run("recover", "--grace", bad, "--json")
        assert refused.rc == 2 and refused.json()["error"] == "EINVAL", (bad, refused)

    config.write_text(written + "lease_ttl=31622400\ngrace=31622400\n")
    took = queue.run("claim", "--pid", pid)
    assert took.rc == 0 and took.out.strip() == second, took
    assert length(queue.lease(second)) == pytest.approx(31622400, abs=1e-3)
    assert queue.run("recover", "--grace", "31622400").rc == 0


# ------------------------------------------------------------------------------ mtimes


def test_far_past_and_future_mtimes_order_claims_and_age_temps_as_documented(queue, child):
    """Q-9 (oldest first by publish time, the request's mtime), Q-6 and docs/queue.md
    "Configuration" (a temp's age "runs from its mtime, or from its ctime when the mtime is
    later"): requests put in ``pending/`` dated 2400, now and 1902 are claimed 1902 first,
    2400 last, and ``show`` gives the 1902 date in UTC.  In ``inbox/`` a temp dated 1902 is
    removed by ``recover --reconcile`` under the default grace, one dated 2400 is not (its
    ctime is now) until ``--grace 0``; plain ``recover`` removes neither."""
    dated = {
        "a-future": datetime(2400, 1, 1, tzinfo=UTC),
        "b-now": None,
        "c-past": datetime(1902, 1, 1, tzinfo=UTC),
    }
    jobs = {}
    for name, moment in dated.items():
        jobs[name] = queue.drop(name, request(tag=name))
        if moment is not None:
            os.utime(queue.dir / "pending" / jobs[name], (moment.timestamp(),) * 2)
    for name in ("c-past",):
        shown = queue.run("show", jobs[name], "--json")
        assert shown.rc == 0, shown
        mtimes = [e["mtime"] for e in shown.json()["evidence"]]
        assert [when(m) for m in mtimes] == [dated[name]], shown
    order = [queue.claim("--pid", str(child.pid), "--ttl", "600") for _ in dated]
    assert order == [jobs["c-past"], jobs["b-now"], jobs["a-future"]]

    temps = {"future": datetime(2400, 1, 1, tzinfo=UTC), "past": datetime(1902, 1, 1, tzinfo=UTC)}
    names = {}
    for which, moment in temps.items():
        names[which] = f"t-{which}.req.json.publish.tmp"
        path = queue.dir / "inbox" / names[which]
        path.write_text("{}")
        os.utime(path, (moment.timestamp(),) * 2)
    status = queue.run("status", "--json")
    assert status.rc == 0, status
    ages = {t["path"]: t["age_seconds"] for t in status.json()["temps"]}
    assert 0 <= ages[f"inbox/{names['future']}"] < 60, ages
    assert ages[f"inbox/{names['past']}"] > 100 * 365 * 86400, ages

    plain = queue.run("recover", "--json")
    assert plain.json()["removed_temps"] == [], plain
    assert queue.entries("inbox") == set(names.values())
    reconciled = queue.run("recover", "--reconcile", "--json")
    assert reconciled.rc == 0, reconciled
    assert queue.entries("inbox") == {names["future"]}, reconciled
    zero = queue.run("recover", "--reconcile", "--grace", "0", "--json")
    assert zero.rc == 0 and queue.entries("inbox") == set(), zero


# ------------------------------------------------------------------------------ time namespaces


@needs_time_ns
def test_a_claim_made_in_another_time_namespace_is_its_holders_until_it_exits(queue, scratch):
    """Q-3, Q-5 (a pid alone is never proof: the start time identifies the holder): a shell
    whose boot and monotonic clocks run 1 000 000 s ahead (``unshare --time``) claims a job
    and later renews it.  Seen from outside, the lease's start time is the shell's own
    (within 0.05 s), ``show`` calls the holder alive and ``recover`` leaves the job; the
    renewal keeps the holder.  Once the shell has exited, ``recover`` requeues the job."""
    job = queue.publish(name="timens")
    s = shlex.quote(str(scratch))
    ctx = f"{shlex.quote(CTX_ARGV[0])} queue"
    script = (
        f"echo $$ > {s}/pid; cat /proc/uptime > {s}/uptime; "
        f"{ctx} claim --project proj --ttl 600 > {s}/job.tmp && mv {s}/job.tmp {s}/job; "
        f"read line; {ctx} renew --project proj {job} --ttl 900 > {s}/renew.tmp; "
        f"echo $? > {s}/renew.rc.tmp; mv {s}/renew.tmp {s}/renew; mv {s}/renew.rc.tmp "
        f"{s}/renew.rc; read line || exit 0"
    )
    ns = in_time_namespace(script, clean_env(CTX_STORAGE=str(queue.storage)))
    with reaped(ns):
        assert wait_for(lambda: (scratch / "job").exists() or ns.poll() is not None, 30)
        assert (scratch / "job").read_text().strip() == job, ns.communicate(timeout=10)
        assert float((scratch / "uptime").read_text().split()[0]) > TIME_NAMESPACE_OFFSET
        shell = int((scratch / "pid").read_text())
        lease = queue.lease(job)
        assert lease["pid"] == shell, lease
        assert lease["create_time"] == pytest.approx(start_time(shell), abs=0.05), lease
        shown = queue.run("show", job, "--json")
        assert shown.rc == 0 and shown.json()["holder"]["state"] == "alive", shown
        kept = queue.run("recover", "--json")
        assert kept.rc == 0 and job in jobs_in(kept.json(), "untouched"), kept

        ns.stdin.write("renew\n")
        ns.stdin.flush()
        assert wait_for(lambda: (scratch / "renew.rc").exists() or ns.poll() is not None, 30)
        assert (scratch / "renew.rc").read_text().strip() == "0", (scratch / "renew").read_text()
        renewed = queue.lease(job)
        assert (renewed["pid"], renewed["create_time"]) == (shell, lease["create_time"])
        assert when(renewed["expires_at"]) > when(lease["expires_at"]), renewed
        assert queue.run("recover", "--json").json()["requeued"] == []

        ns.stdin.close()
        assert ns.wait(timeout=30) == 0
    requeued = queue.run("recover", "--json")
    assert requeued.rc == 0 and jobs_in(requeued.json(), "requeued") == [job], requeued
    assert "exited" in requeued.json()["requeued"][0]["detail"], requeued
    assert queue.state(job) == "pending"


def gated(scratch: Path, tag: str) -> dict:
    """A shell.exec job that notes each run in ``runs-TAG`` and waits for ``go-TAG``."""
    runs, go = scratch / f"runs-{tag}", scratch / f"go-{tag}"
    return shell_job(f"echo run >> {runs}; until [ -e {go} ]; do sleep 0.05; done; echo {tag}")


def runs_of(scratch: Path, tag: str) -> int:
    path = scratch / f"runs-{tag}"
    return len(path.read_text().split()) if path.exists() else 0


@needs_root
@needs_time_ns
def test_a_worker_in_another_time_namespace_and_zone_keeps_its_job(queue, agent, scratch):
    """W-1, Q-3, Q-5, S-2, §2.1: ``ctx queue work --ttl 3`` runs under ``TZ=America/St_Johns``
    in a time namespace whose boot and monotonic clocks run 1 000 000 s ahead.  While its
    job runs, its lease names the worker's own process with its start time as seen from
    outside, it renews the lease, and ``recover`` from outside leaves the job.  The job runs
    once; the result's ``started``/``finished`` and every event the worker records in its
    session carry UTC times."""
    job = queue.publish(gated(scratch, "ns"), name="ns")
    before = now()
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT]
    script = " ".join(map(shlex.quote, [*argv, "--ttl", "3", "--drain", "--json"]))
    env = clean_env(CTX_STORAGE=str(queue.storage), TZ="America/St_Johns", LC_TIME="fr_FR")
    worker = in_time_namespace(script, env)
    with reaped(worker):
        assert wait_for(lambda: runs_of(scratch, "ns") == 1 or worker.poll() is not None, 30)
        assert runs_of(scratch, "ns") == 1, worker.communicate(timeout=10)
        first = queue.lease(job)
        holder = first["pid"]
        assert b"work" in Path(f"/proc/{holder}/cmdline").read_bytes(), first
        assert first["create_time"] == pytest.approx(start_time(holder), abs=0.05), first
        assert UTC_STAMP.fullmatch(first["expires_at"]), first

        def renewed() -> bool:
            with contextlib.suppress(FileNotFoundError, ValueError):
                return queue.lease(job)["expires_at"] != first["expires_at"]
            return False

        assert wait_for(lambda: renewed() or worker.poll() is not None, 30), first
        assert renewed(), worker.communicate(timeout=10)
        kept = queue.run("recover", "--json")
        assert kept.rc == 0 and kept.json()["requeued"] == [], kept
        (scratch / "go-ns").touch()
        out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, (out, err)
    assert runs_of(scratch, "ns") == 1
    assert queue.state(job) == "done"
    result = json.loads((queue.dir / "done" / f"{job}.result").read_text())
    assert before <= when(result["started"]) <= when(result["finished"]) <= now(), result
    assert result["worker"]["pid"] == holder, result
    logs = list(queue.storage.glob("home/*/agent/ci/session/*/events.jsonl"))
    assert logs, "the worker recorded no session"
    events = [json.loads(line) for log in logs for line in log.read_text().splitlines()]
    assert {"queue.claim", "tool_call", "tool_result", "queue.finish"} <= {
        e["type"] for e in events
    }, events
    for event in events:
        assert before <= when(event["ts"]) <= now(), event


@needs_root
def test_a_worker_whose_lease_a_member_dated_in_milliseconds_keeps_renewing(queue, agent, scratch):
    """Q-3, Q-5, I-4, docs/workers.md (the worker renews every third of the lifetime, or
    gives the job up before its lease lapses; lease times may be epoch seconds): while the
    worker's job runs, a member of the queue's group rewrites its lease with ``claimed_at``
    in epoch milliseconds.  The worker goes on: it renews the lease (or reports the refusal
    and gives the job up), with no traceback; the job runs once."""
    job = queue.publish(gated(scratch, "ms"), name="ms")
    err_path = scratch / "worker.err"
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT]
    with open(err_path, "w") as err:
        worker = subprocess.Popen(
            [*argv, "--ttl", "3", "--drain", "--json"],
            env=clean_env(CTX_STORAGE=str(queue.storage)), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True,
        )  # fmt: skip
    with reaped(worker):
        assert wait_for(lambda: runs_of(scratch, "ms") == 1 or worker.poll() is not None, 30)
        assert runs_of(scratch, "ms") == 1, err_path.read_text()
        edited = {**queue.lease(job), "claimed_at": int(time.time() * 1000)}
        replace_lease(queue, job, edited)

        def answered() -> bool:
            with contextlib.suppress(FileNotFoundError, ValueError):
                if queue.lease(job)["expires_at"] != edited["expires_at"]:
                    return True
            said = err_path.read_text()
            return "Traceback" in said or job in said or worker.poll() is not None

        assert wait_for(answered, 30)
        assert "Traceback" not in err_path.read_text(), err_path.read_text()
        recovered = queue.run("recover", "--json")
        assert recovered.json()["requeued"] == [], recovered
        (scratch / "go-ms").touch()
        worker.communicate(timeout=60)
    assert runs_of(scratch, "ms") == 1


# ------------------------------------------------------------------------------ sessions

ODD_TS = [
    "2026-06-22T12:00:00+05:45",
    "2026-06-22T12:00:00",
    "2016-12-31T23:59:60Z",
    "9999-12-31T23:59:59.999999-12:00",
    "0000-01-01T00:00:00Z",
    253402300800.5,
]


@needs_root
def test_events_are_stamped_in_utc_under_any_zone_and_odd_stamps_are_shown_as_stored(queue, agent):
    """S-2, docs/sessions.md ("``ts`` (RFC 3339, UTC)"; ``show`` prints a timeline, ``--json``
    the events as stored): a tool call made with ``ctx run`` under ``TZ=Asia/Kathmandu``
    records ``tool_call`` and ``tool_result`` stamped in UTC with the time of the call.
    Events appended with odd stamps — another offset, none, a leap second, year 9999 at
    ``-12:00``, year 0, a number past year 9999 — are shown under ``TZ=America/St_Johns`` in
    file order, each stamp as stored, with no traceback, and ``tail --json`` gives them back
    as they are."""
    before = now()
    made = subprocess.run(
        [*CTX_ARGV, "run", "--agent", AGENT, "--session", "clocks", "--native", "shell.exec"],
        input=json.dumps({"cmd": "true"}), capture_output=True, text=True,
        env=env_of(queue, TZ="Asia/Kathmandu", LC_TIME="ne_NP"),
    )  # fmt: skip
    assert made.returncode == 0 and "Traceback" not in made.stderr, made
    logs = list(queue.storage.glob("home/*/agent/ci/session/clocks/events.jsonl"))
    assert len(logs) == 1, logs
    recorded = [json.loads(line) for line in logs[0].read_text().splitlines()]
    assert [e["type"] for e in recorded][-2:] == ["tool_call", "tool_result"], recorded
    for event in recorded:
        assert before <= when(event["ts"]) <= now(), event

    odd = [{"ts": ts, "type": "note", "agent": AGENT, "session": "clocks", "n": n}
           for n, ts in enumerate(ODD_TS)]  # fmt: skip
    with logs[0].open("a") as log:
        log.write("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in odd))
    reader = env_of(queue, TZ="America/St_Johns", LC_TIME="fr_FR.UTF-8")
    shown = subprocess.run([*CTX_ARGV, "session", "show", AGENT, "clocks"],
                           capture_output=True, text=True, env=reader)  # fmt: skip
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown
    lines = shown.stdout.splitlines()[-len(ODD_TS) :]
    for text, ts in zip(lines, ODD_TS, strict=True):
        assert text.split()[0] == str(ts), (text, ts)
    tail = subprocess.run([*CTX_ARGV, "session", "tail", AGENT, "clocks", "-n", str(len(odd)),
                           "--json"], capture_output=True, text=True, env=reader)  # fmt: skip
    assert tail.returncode == 0 and "Traceback" not in tail.stderr, tail
    assert [json.loads(line) for line in tail.stdout.splitlines()] == odd
