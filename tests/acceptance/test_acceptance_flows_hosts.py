"""SPEC §14 (N-1) with Q-3, Q-5 and Q-6: one queue shared by workers that share neither a host
name, nor a pid namespace, nor (as their leases say) a boot.  Other "hosts" are real Linux
namespaces made with ``unshare`` as root: a UTS namespace with a host name of its own and a
pid namespace whose pids mean nothing on the host.  Everything goes through ``ctx``."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, QueueCLI, alive, clean_env, request, rfc3339, wait_for
from tests.acceptance.workercli import AGENT, result_of, shell_job
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage

CTX = shlex.quote(CTX_ARGV[0])
TTL = 6  # seconds: a lease outlives a few ctx commands on a loaded 2-core host
HOST_PID_NS = os.stat("/proc/self/ns/pid").st_ino
BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _namespaces_work() -> str | None:
    """Why this file cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root to create UTS and pid namespaces"
    if shutil.which("unshare") is None:
        return "needs unshare(1)"
    probe = ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "sh", "-c", "hostname x"]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"unshare --uts --pid fails here: {done.stderr.strip()}"
    return None


_WHY_NOT = _namespaces_work()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")


# ------------------------------------------------------------------------------ helpers


class Namespace:
    """``sh -c SCRIPT`` as the init of fresh pid (and, given a host name, UTS) namespaces.
    ``unshare --kill-child``: killing the unshare process kills the namespace's init, and
    with it every process of the namespace."""

    def __init__(self, script: str, env: dict[str, str], host: str | None = None) -> None:
        flags = ["--pid", "--fork", "--mount-proc", "--kill-child"]
        if host is not None:
            flags.append("--uts")
            script = f"hostname {shlex.quote(host)} || exit 99\n{script}"
        self.proc = subprocess.Popen(
            ["unshare", *flags, "sh", "-c", script],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def kill(self) -> None:
        """Kill the whole namespace (its init dies, the kernel kills the rest)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=30)

    def wait(self, seconds: float = 30) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=seconds)
        return self.proc.returncode, out, err


@pytest.fixture
def spaces() -> Iterator[list[Namespace]]:
    """Namespaces a test starts; every one still running is killed at teardown."""
    started: list[Namespace] = []
    yield started
    for ns in started:
        ns.kill()


def start(spaces: list[Namespace], queue: QueueCLI, script: str, host: str | None = None):
    ns = Namespace(script, clean_env(CTX_STORAGE=str(queue.storage)), host)
    spaces.append(ns)
    return ns


def wait_file(path: Path, ns: Namespace, seconds: float = 30) -> str:
    """The content of ``path`` once the namespace wrote it (fails early if it died)."""
    ok = wait_for(lambda: path.exists() or ns.proc.poll() is not None, seconds)
    if not path.exists():
        rc, out, err = ns.wait() if ns.proc.poll() is not None else (None, "", "")
        pytest.fail(f"{path.name} never written (ok={ok}, namespace exit {rc}): {out} {err}")
    return path.read_text().strip()


def free_host_pid() -> int:
    """A pid number no process has on the host right now (from the top of pid_max)."""
    top = int(Path("/proc/sys/kernel/pid_max").read_text())
    for pid in range(min(top, 4_194_304) - 7, 1000, -1):
        if not os.path.exists(f"/proc/{pid}"):
            return pid
    pytest.skip("no free pid number on this host")


def claim_inside(scratch: Path, holder_pid: int | None = None, ttl: float = 3, extra: str = "",
                 then: str = "sleep 30") -> str:  # fmt: skip
    """Shell text for a namespace: its process ``holder_pid`` (the next fork gets that pid
    number, through ns_last_pid) claims one job with ``--ttl``, records what it saw in
    ``scratch`` (job, pid, pid_ns inode, host name), then runs ``then``."""
    s = shlex.quote(str(scratch))
    inner = (
        f"echo $$ > {s}/pid; stat -L -c %i /proc/self/ns/pid > {s}/ns; hostname > {s}/host; "
        f"{CTX} queue claim --project proj --ttl {ttl} {extra} > {s}/job.tmp; "
        f"echo $? > {s}/claim.rc; mv {s}/job.tmp {s}/job; {then}"
    )
    prefix = ""
    if holder_pid is not None:
        prefix = f"echo {holder_pid - 1} > /proc/sys/kernel/ns_last_pid || exit 98\n"
    return f"{prefix}sh -c {shlex.quote(inner)}"


def recover(queue: QueueCLI, *args: str) -> tuple[int, dict]:
    r = queue.run("recover", *args, "--json")
    assert r.rc in (0, 1), r
    return r.rc, r.json()


def jobs_in(report: dict, key: str) -> list[str]:
    return [entry["job"] for entry in report[key]]


def until_expired(stamp: str, margin: float = 0.3) -> None:
    """Sleep until the RFC 3339 ``stamp`` is ``margin`` seconds in the past."""
    left = (rfc3339(stamp) - datetime.now(UTC)).total_seconds() + margin
    if left > 0:
        time.sleep(left)


def seconds_left(stamp: str) -> float:
    return (rfc3339(stamp) - datetime.now(UTC)).total_seconds()


def in_time(lease: dict) -> bool:
    """Whether ``lease`` is still valid now, so that what ran before judged it valid."""
    return seconds_left(lease["expires_at"]) > 0


# ------------------------------------------------------------------------------


def test_n1_claim_in_another_host_and_pid_namespace_outlives_a_colliding_live_host_pid(
    queue, spaces, tmp_path
):
    """Q-3, Q-5, N-1: a claim made on "otherhost" inside another pid namespace, whose holder
    pid is the number of a live local process (of another start time), is left alone by `recover`
    (plain, --reconcile, --grace 0) until its lease expires, and requeued once it has, even
    while that local pid is still alive; `show --json` gives the namespace's holder fields."""
    job = queue.publish(request(tag="far"), name="far")
    local = subprocess.Popen(["sleep", "120"])  # the local process the remote pid collides with
    try:
        script = claim_inside(tmp_path, holder_pid=local.pid, ttl=TTL)
        ns = start(spaces, queue, script, host="otherhost")
        assert wait_file(tmp_path / "job", ns) == job
        assert (tmp_path / "claim.rc").read_text().strip() == "0"
        inner_pid = int((tmp_path / "pid").read_text())
        inner_ns = int((tmp_path / "ns").read_text())
        assert inner_pid == local.pid and inner_ns != HOST_PID_NS
        assert (tmp_path / "host").read_text().strip() == "otherhost"

        shown = queue.run("show", job, "--json")
        assert shown.rc == 0, shown
        doc = shown.json()
        assert doc["state"] == "claimed", doc
        lease = doc["lease"]
        assert lease["host"] == "otherhost", lease
        assert lease["boot_id"] == BOOT_ID  # namespaces share the kernel, hence the boot
        assert int(lease["pid_ns"]) == inner_ns and lease["pid"] == inner_pid, lease
        start_time = lease.get("create_time", lease.get("start_time"))
        assert isinstance(start_time, (int, float)), lease
        assert abs(start_time - time.time()) < 60, lease
        claimed, expires = rfc3339(lease["claimed_at"]), rfc3339(lease["expires_at"])
        assert abs((expires - claimed).total_seconds() - TTL) < 0.5, lease
        assert lease == queue.lease(job)  # show reports the file as it is

        # The same pid number is alive here, with another start time than the remote holder's:
        # were that pid judged locally it would read as "reused", proof of a dead holder.
        assert alive(local.pid)
        for args in ((), ("--reconcile",), ("--reconcile", "--grace", "0"), ("--dry-run",)):
            rc, report = recover(queue, *args)
            assert in_time(lease), "the lease expired before the checks ran: too slow a host"
            assert rc == 0 and report["consistent"] is True, (args, report)
            assert report["requeued"] == [] and jobs_in(report, "untouched") == [job], report
        assert queue.state(job) == "claimed"
        assert queue.run("claim").rc == 3  # held elsewhere: nothing to claim here
        status = queue.run("status", "--json")
        assert status.rc == 0, status
        counts = status.json()
        assert (counts["claimed"], counts["pending"], counts["incomplete"]) == (1, 0, []), counts

        ns.kill()  # the remote host vanishes; nothing here can see that
        if seconds_left(lease["expires_at"]) > 0.5:
            rc, report = recover(queue)
            assert rc == 0 and report["requeued"] == [], report
            assert queue.state(job) == "claimed"

        until_expired(lease["expires_at"])
        rc, plan = recover(queue, "--dry-run")
        assert rc == 0 and jobs_in(plan, "requeued") == [job], plan
        assert plan["requeued"][0]["applied"] is False
        assert queue.state(job) == "claimed"
        rc, report = recover(queue)
        assert rc == 0 and report["consistent"] is True, report
        assert jobs_in(report, "requeued") == [job] and report["requeued"][0]["applied"] is True
        assert "expired" in report["requeued"][0]["detail"], report
        assert alive(local.pid), "the local process of the same pid number was touched"
        assert queue.state(job) == "pending"
        assert queue.entries("claimed") == set() and queue.entries("lease") == set()
        rc, again = recover(queue)  # I-5: a second run changes nothing
        assert rc == 0 and again["requeued"] == [] and again["untouched"] == [], again
        assert queue.claim() == job  # the requeued job is claimable here now
    finally:
        local.kill()
        local.wait()


def test_n1_lease_of_another_boot_is_judged_by_host_and_machine_not_by_boot_alone(
    queue, spaces, tmp_path
):
    """Q-5, N-1: a live namespace claim whose lease says another boot_id is requeued at once
    only when it names this machine (host name and machine id); under another host name, or
    this host name with another machine id, only its expiry counts."""
    job = queue.publish(request(tag="boot"), name="boot")
    ns = start(spaces, queue, claim_inside(tmp_path, ttl=60), host="otherhost")
    assert wait_file(tmp_path / "job", ns) == job
    real = queue.lease(job)
    assert real["host"] == "otherhost" and real["boot_id"] == BOOT_ID, real

    here = os.uname().nodename
    other_machine = uuid.uuid4().hex
    for host, machine in (("otherhost", None), (here, other_machine)):
        lease = dict(real, boot_id=str(uuid.uuid4()), host=host)
        if machine is not None:
            lease["machine_id"] = machine
        queue.write_lease(job, lease)
        for args in ((), ("--reconcile",)):
            rc, report = recover(queue, *args)
            assert rc == 0 and report["requeued"] == [], (host, machine, args, report)
            assert jobs_in(report, "untouched") == [job], report
        assert queue.state(job) == "claimed"

    # This host's name and machine id, another boot: the machine rebooted since the claim.
    queue.write_lease(job, dict(real, boot_id=str(uuid.uuid4()), host=here))
    rc, report = recover(queue)
    assert rc == 0 and jobs_in(report, "requeued") == [job], report
    assert queue.state(job) == "pending"
    assert seconds_left(real["expires_at"]) > 30  # requeued long before it would expire


def test_q3_renew_inside_the_namespace_extends_the_lease_and_the_holder_finishes(
    queue, spaces, tmp_path
):
    """Q-3, §2.4, N-1: only the holder renews: `renew` on the host is refused (EACCES, exit 1,
    lease unchanged); `renew` inside the namespace extends expires_at with the holder fields
    kept, so recover leaves the job alone past its first expiry; the holder then finishes it
    and the result names the namespace's holder."""
    job = queue.publish(request(tag="renewed"), name="renewed")
    s = shlex.quote(str(tmp_path))
    then = (
        f"while [ ! -e {s}/go ]; do sleep 0.05; done; J=$(cat {s}/job); "
        f"{CTX} queue renew --project proj $J --ttl 30 --json > {s}/renew.json; "
        f"echo $? > {s}/renew.rc; "
        f"while [ ! -e {s}/fin ]; do sleep 0.05; done; "
        f"echo '{{\"answer\": 7}}' | {CTX} queue finish --project proj $J --ok - > {s}/fin.out; "
        f"echo $? > {s}/fin.rc; sleep 30"
    )
    ns = start(
        spaces,
        queue,
        claim_inside(tmp_path, ttl=3, extra="--worker node-b", then=then),
        host="node-b",
    )
    assert wait_file(tmp_path / "job", ns) == job
    first = queue.lease(job)
    assert first["worker"] == "node-b" and first["host"] == "node-b", first
    path = queue.dir / "lease" / job / "worker"
    before = path.read_bytes()

    stolen = queue.run("renew", job, "--ttl", "30")
    assert stolen.rc == 1 and "EACCES" in stolen.err, stolen
    stolen = queue.run("renew", job, "--ttl", "30", "--pid", "1")  # pid 1 here is not pid 1 there
    assert stolen.rc == 1 and "EACCES" in stolen.err, stolen
    assert path.read_bytes() == before

    (tmp_path / "go").touch()
    assert wait_file(tmp_path / "renew.rc", ns) == "0", (tmp_path / "renew.json").read_text()
    renewed = queue.lease(job)
    kept = ("worker", "host", "boot_id", "pid_ns", "pid", "create_time", "claimed_at")
    assert {k: renewed.get(k) for k in kept} == {k: first.get(k) for k in kept}, renewed
    assert renewed.get("renewed_at"), renewed
    gained = (rfc3339(renewed["expires_at"]) - rfc3339(first["expires_at"])).total_seconds()
    assert gained > 25, (first, renewed)

    until_expired(first["expires_at"])  # the lease as first taken would be over now
    rc, report = recover(queue, "--reconcile")
    assert rc == 0 and report["requeued"] == [] and jobs_in(report, "untouched") == [job]
    assert queue.state(job) == "claimed"

    (tmp_path / "fin").touch()
    assert wait_file(tmp_path / "fin.rc", ns) == "0", (tmp_path / "fin.out").read_text()
    assert queue.state(job) == "done"
    res = json.loads((queue.dir / "done" / f"{job}.result").read_text())
    assert res["status"] == "ok" and res["output"] == {"answer": 7}, res
    holder = res["worker"]  # the holder the lease named, not this host nor this finisher
    assert (holder["host"], holder["pid"]) == ("node-b", first["pid"]), res
    assert int(holder["pid_ns"]) == int(first["pid_ns"]) != HOST_PID_NS, res
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()


def test_n1_recover_on_another_host_leaves_this_hosts_live_claim_until_it_expires(
    queue, spaces, tmp_path
):
    """Q-5, N-1, §2.4: seen from "node-r" (another host name and pid namespace, where this
    host's holder pid does not exist) a valid lease is left alone (recover exit 0, claim exit
    3); once expired, node-r requeues and takes the job, and the old holder here can no
    longer renew it (EACCES, exit 1)."""
    job = queue.publish(request(tag="mine"), name="mine")
    holder = subprocess.Popen(["sleep", "120"])
    try:
        assert queue.claim("--pid", str(holder.pid), "--ttl", str(TTL)) == job
        mine = queue.lease(job)
        assert mine["pid"] == holder.pid and int(mine["pid_ns"]) == HOST_PID_NS, mine
        s = shlex.quote(str(tmp_path))
        script = (
            f"[ -e /proc/{holder.pid} ] && touch {s}/seen\n"
            f"{CTX} queue recover --project proj --json > {s}/r1; echo $? > {s}/r1.rc\n"
            f"{CTX} queue claim --project proj > {s}/c1; echo $? > {s}/c1.rc\n"
            f"while [ ! -e {s}/go ]; do sleep 0.05; done\n"
            f"{CTX} queue recover --project proj --json > {s}/r2; echo $? > {s}/r2.rc\n"
            f"{CTX} queue claim --project proj --ttl 30 --worker node-r > {s}/c2; "
            f"echo $? > {s}/c2.rc\nsleep 30"
        )
        ns = start(spaces, queue, script, host="node-r")
        assert wait_file(tmp_path / "c1.rc", ns) == "3", (tmp_path / "c1").read_text()
        assert in_time(mine), "the lease expired before node-r looked: too slow a host"
        assert not (tmp_path / "seen").exists()  # the holder's pid does not exist over there
        assert (tmp_path / "r1.rc").read_text().strip() == "0"
        first = json.loads((tmp_path / "r1").read_text())
        assert first["requeued"] == [] and jobs_in(first, "untouched") == [job], first
        assert queue.lease(job) == mine and queue.state(job) == "claimed"

        until_expired(mine["expires_at"])
        (tmp_path / "go").touch()
        assert wait_file(tmp_path / "c2.rc", ns) == "0", (tmp_path / "c2").read_text()
        assert (tmp_path / "r2.rc").read_text().strip() == "0"
        second = json.loads((tmp_path / "r2").read_text())
        assert jobs_in(second, "requeued") == [job], second
        assert (tmp_path / "c2").read_text().strip() == job
        theirs = queue.lease(job)
        assert (theirs["host"], theirs["worker"]) == ("node-r", "node-r"), theirs
        assert int(theirs["pid_ns"]) != HOST_PID_NS

        assert alive(holder.pid)  # the old holder still runs, but its lease is gone
        lost = queue.run("renew", job, "--pid", str(holder.pid))
        assert lost.rc == 1 and "EACCES" in lost.err, lost
        assert queue.lease(job) == theirs
        rc, report = recover(queue)  # node-r's fresh lease: left alone here
        assert rc == 0 and report["requeued"] == [] and queue.state(job) == "claimed", report
    finally:
        holder.kill()
        holder.wait()


def test_q6_interrupted_finish_of_an_unseen_holder_waits_for_expiry_then_rolls_forward(
    queue, spaces, tmp_path
):
    """Q-5, Q-6, N-1: a namespace's claim (holder pid absent from this host's table, the
    namespace gone) whose finish stopped after its result was stored: plain recover reports it
    (exit 1) and never requeues it, even expired; --reconcile leaves it (exit 1) while the
    lease runs, and rolls it forward to done once it has expired (exit 0)."""
    job = queue.publish(request(tag="half"), name="half")
    pid = free_host_pid()
    ns = start(spaces, queue, claim_inside(tmp_path, holder_pid=pid, ttl=TTL, then="true"))
    rc, _out, err = ns.wait()
    assert rc == 0, err
    assert (tmp_path / "job").read_text().strip() == job
    lease = queue.lease(job)
    assert lease["pid"] == pid and int(lease["pid_ns"]) != HOST_PID_NS, lease
    assert not alive(pid)  # the number is free here, which proves nothing about the holder

    outcome = {"status": "ok", "output": {"answer": 1}, "worker": {"worker": lease["worker"]},
               "started": lease["claimed_at"], "finished": lease["claimed_at"]}  # fmt: skip
    stored = json.dumps(outcome).encode()
    (queue.dir / "done" / f"{job}.result").write_bytes(stored)

    for args in ((), ("--reconcile",)):
        rc, report = recover(queue, *args)
        assert in_time(lease), "the lease expired before the checks ran: too slow a host"
        assert rc == 1 and report["consistent"] is False, (args, report)
        assert jobs_in(report, "incomplete") == [job], report
        assert report["requeued"] == [] and report["repaired"] == [], report
    assert (queue.dir / "claimed" / job / job).is_file()
    assert not (queue.dir / "done" / job).exists()

    until_expired(lease["expires_at"])
    rc, report = recover(queue)  # expired, but the result proves it ran: never back to pending
    assert rc == 1 and report["requeued"] == [] and jobs_in(report, "incomplete") == [job]
    assert not (queue.dir / "pending" / job).exists()

    rc, report = recover(queue, "--reconcile")
    assert rc == 0 and report["consistent"] is True, report
    assert jobs_in(report, "repaired") == [job], report
    assert queue.state(job) == "done"
    assert (queue.dir / "done" / f"{job}.result").read_bytes() == stored
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()
    assert queue.entries("pending") == set()
    rc, report = recover(queue, "--reconcile")
    assert rc == 0 and report["repaired"] == [] and report["requeued"] == [], report


# ------------------------------------------------------------------------------ workers, W-3


def worker_script(queue: QueueCLI, *args: str) -> str:
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT, *args]
    return "exec " + " ".join(shlex.quote(a) for a in argv)


def test_w3_workers_on_two_hosts_drain_one_queue_each_job_once(queue, agent, outbox, spaces):
    """W-3, I-4, N-1: `ctx queue work` on "node-a" and "node-b" (two UTS and pid namespaces)
    drains one queue: every job runs exactly once, every result names the node that ran it,
    and nothing is left claimed or leased."""
    runs = outbox / "runs"
    jobs = [
        queue.publish(shell_job(f"echo {n} >> {runs}; sleep 0.2"), name=f"j{n:02d}")
        for n in range(12)
    ]
    nodes = [
        start(spaces, queue, worker_script(queue, "--drain", "--ttl", "3"), host=node)
        for node in ("node-a", "node-b")
    ]
    for node in nodes:
        rc, _out, err = node.wait(60)
        assert rc == 0, err
    assert [queue.state(j) for j in jobs] == ["done"] * 12
    assert sorted(runs.read_text().split(), key=int) == [str(n) for n in range(12)]
    for j in jobs:
        res = result_of(queue, j)
        assert res["status"] == "ok", res
        assert res["worker"]["host"] in ("node-a", "node-b"), res
        assert int(res["worker"]["pid_ns"]) != HOST_PID_NS, res
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()
    status = queue.run("status", "--json")
    assert status.rc == 0, status
    counts = status.json()
    assert (counts["done"], counts["pending"], counts["claimed"]) == (12, 0, 0), counts


def test_w3_a_namespace_killed_mid_job_runs_its_job_again_exactly_once(
    queue, agent, outbox, spaces
):
    """Q-5, I-4, N-1: kill the whole "host" (its pid namespace's init) while its worker runs a
    job: recover on this host leaves the job claimed while the last renewal holds, requeues it
    once the lease expired, and a worker here runs it once more: two runs in all, one result."""
    runs, flag = outbox / "runs", outbox / "flag"
    job = queue.publish(
        shell_job(f"echo run >> {runs}; [ -e {flag} ] || {{ touch {flag}; sleep 40; }}; echo fine"),
        name="killed",
    )
    node = start(spaces, queue, worker_script(queue, "--ttl", "3"), host="node-c")
    assert wait_for(lambda: flag.exists(), 30), node.proc.poll()
    lease = queue.lease(job)
    assert lease["host"] == "node-c" and int(lease["pid_ns"]) != HOST_PID_NS, lease
    node.kill()
    killed_at = time.time()
    last = queue.lease(job)  # the last renewal made before the namespace died
    if seconds_left(last["expires_at"]) > 0.5:
        rc, report = recover(queue)
        assert rc == 0 and report["requeued"] == [], report
        assert jobs_in(report, "untouched") == [job]
        assert queue.state(job) == "claimed"
    until_expired(last["expires_at"])
    assert time.time() - killed_at < 10
    rc, report = recover(queue)
    assert rc == 0 and jobs_in(report, "requeued") == [job], report
    assert queue.state(job) == "pending"

    r = queue.run("work", "--agent", AGENT, "--drain", timeout=60)
    assert r.rc == 0, r
    assert queue.state(job) == "done"
    res = result_of(queue, job)
    assert res["status"] == "ok" and "fine" in json.dumps(res["output"]), res
    assert runs.read_text().split() == ["run", "run"]  # the killed run, then exactly one more
    assert queue.run("work", "--agent", AGENT, "--drain", timeout=60).rc == 0
    rc, report = recover(queue)
    assert rc == 0 and report["requeued"] == [] and report["untouched"] == [], report
    assert runs.read_text().split() == ["run", "run"]
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()


def process_tree(pid: int) -> list[int]:
    """``pid`` and every descendant of it, parents first."""
    found = [pid]
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):
            for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
                found += process_tree(int(child))
    return found


def test_i4_a_frozen_host_resumed_after_recovery_has_its_outcome_discarded(
    queue, agent, outbox, spaces
):
    """Q-5, I-4, Q-6, N-1: a "host" frozen mid-job (every process of its namespace stopped,
    as a suspended VM) past its lease is recovered and its job run here; resumed, its worker
    finds the job finished by another holder: it reports the job `lost` and writes nothing,
    so the job keeps the one result of the holder that finished it."""
    runs = outbox / "runs"
    job = queue.publish(shell_job(f"echo run >> {runs}; sleep 1; echo fine"), name="frozen")
    node = start(spaces, queue, worker_script(queue, "--drain", "--ttl", "3", "--json"), "node-d")
    assert wait_for(lambda: runs.exists(), 30), node.proc.poll()
    frozen = process_tree(node.proc.pid)[1:]  # the namespace's init and all below it
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        lease = queue.lease(job)
        assert lease["host"] == "node-d", lease
        until_expired(lease["expires_at"])
        rc, report = recover(queue)
        assert rc == 0 and jobs_in(report, "requeued") == [job], report
        r = queue.run("work", "--agent", AGENT, "--drain", timeout=60)
        assert r.rc == 0, r
        assert queue.state(job) == "done"
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    path = queue.dir / "done" / f"{job}.result"
    kept = path.read_bytes()
    assert json.loads(kept)["worker"]["host"] == os.uname().nodename

    _rc, out, err = node.wait(60)
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    lost = [e for e in events if e.get("event") == "lost"]
    assert [e.get("job") for e in lost] == [job], (events, err)
    summary = [e for e in events if e.get("event") == "stop"]
    assert summary and summary[-1].get("lost") == 1 and summary[-1].get("done") == 0, events
    assert path.read_bytes() == kept  # the late outcome overwrote nothing
    assert queue.entries("done") == {job, f"{job}.result"} and queue.entries("failed") == set()
    assert runs.read_text().split() == ["run", "run"]
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()
    assert queue.entries("pending") == set()
