"""docs/multi-host.md taken at its word (SPEC §14 N-1, with §2 Q-2, Q-3, Q-5, Q-6 and §3 W-3):
several hosts sharing one queue directory, each claim of the page checked as a user sharing a
queue between machines would rely on it.

A "host" is a set of Linux namespaces made with ``unshare`` as root: a UTS namespace with a
host name of its own, a pid namespace with its own /proc (pids there mean nothing here) and a
mount namespace, where a host may be given an ``/etc/machine-id`` of its own (or an empty one)
by a bind mount.  Commands run on a host through ``nsenter``; a host vanishes when its
namespace is killed and freezes when every process in it is stopped.  What cannot be made on
one machine (another ``boot_id``, another clock) is written into a lease by hand, as another
host would have written it; what NFS refuses (``flock`` on a directory, ``renameat2`` with
``RENAME_NOREPLACE``) is refused by ``strace`` fault injection.

Checked: the filesystem needs of the table (``mkdir`` arbitration between hosts, no move that
replaces evidence, the ``link`` strategy on a filesystem without atomic renames and with
``move=link``), the NFS caveats (a stale listing, an empty ``claimed/J`` left by a
retransmitted ``mkdir`` until ``recover --reconcile``, a waiting worker that inotify never
wakes, the ``flock`` recover takes), the lease as the page shows it, the three liveness rules
seen from where ``recover`` runs (including the hazards of shared host names and machine-ids
the page warns about, and the remedy it gives), renewal by a worker on another host, the
lease lifetime as the bound on a dead host's jobs, clocks, and ``recover`` with and without
``--grace``, ``--reconcile`` and ``--dry-run`` run from another host.  Everything goes
through the installed ``ctx``."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    age,
    alive,
    clean_env,
    new_scratch_dir,
    rfc3339,
    scratch_top,
    serving,
    snapshot,
    wait_for,
)
from tests.acceptance.workercli import AGENT, shell_job
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage
from tests.support.strace import can_inject

SCRATCH = scratch_top(__file__)
CTX = shlex.quote(CTX_ARGV[0])
HERE = os.uname().nodename
HOST_PID_NS = os.stat("/proc/self/ns/pid").st_ino
BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
_MACHINE_FILE = Path("/etc/machine-id")
MACHINE_ID = _MACHINE_FILE.read_text().strip() if _MACHINE_FILE.is_file() else ""
LEASE_FIELDS = {"job", "worker", "host", "machine_id", "boot_id", "pid_ns", "pid",
                "create_time", "boot_time", "claimed_at", "expires_at"}  # fmt: skip
WAIT = 30.0
INDIA = timezone(timedelta(hours=5, minutes=30))


def _why_not() -> str | None:
    """Why hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root to make UTS, pid and mount namespaces"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"needs {tool}(1)"
    probe = ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "sh", "-c", "hostname x"]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"unshare fails here: {done.stderr.strip()}"
    return None


_WHY_NOT = _why_not()
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=_WHY_NOT or "")
needs_machine_id = pytest.mark.skipif(not MACHINE_ID, reason="this host has no /etc/machine-id")
needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace(1)")


# ------------------------------------------------------------------------------ hosts


def q(value: object) -> str:
    return shlex.quote(str(value))


def queue_line(queue: QueueCLI, command: str, *args: str) -> str:
    """Shell text of ``ctx queue COMMAND --project P ARGS``."""
    return " ".join([CTX, "queue", command, "--project", q(queue.project), *map(q, args)])


class Host:
    """Another machine, as far as one kernel allows: a UTS namespace named ``name``, a pid
    namespace with a /proc of its own and a mount namespace (``machine``: a file bind-mounted
    on ``/etc/machine-id``), kept up by an init that sleeps.  Commands run in it through
    ``nsenter``; :meth:`kill` makes the whole host vanish at once."""

    def __init__(self, name: str, env: dict[str, str], machine: Path | None = None) -> None:
        self.name = name
        self.env = env
        script = f"hostname {q(name)} || exit 99\n"
        if machine is not None:
            script += f"mount --bind {q(machine)} /etc/machine-id || exit 98\n"
        script += "exec sleep 600"
        self.proc = subprocess.Popen(
            ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c",
             script],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        self.spawned: list[subprocess.Popen] = []
        self.init = 0
        assert wait_for(self._ready, WAIT) and self.init, f"host {name} is not up: {self._why()}"
        self.pid_ns = os.stat(f"/proc/{self.init}/ns/pid").st_ino

    def _children(self, pid: int) -> list[int]:
        with contextlib.suppress(OSError):
            return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        return []

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            return True
        for child in self._children(self.proc.pid):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{child}/comm").read_text().strip() == "sleep":
                    self.init = child
                    return True
        return False

    def _why(self) -> str:
        if self.proc.poll() is not None:
            return f"exit {self.proc.returncode}: {self.proc.stderr.read().decode()}"
        return "no init"

    def argv(self, *command: str) -> list[str]:
        assert self.init and self.proc.poll() is None, f"host {self.name} is gone"
        return ["nsenter", "-t", str(self.init), "-p", "-m", "-u", "--", *command]

    def sh(self, script: str, timeout: float = 60) -> Run:
        """``sh -c SCRIPT`` on this host, waited for."""
        done = subprocess.run(self.argv("sh", "-c", script), env=self.env, capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=timeout)  # fmt: skip
        return Run(["sh", "-c", script], done.returncode, done.stdout.decode(),
                   done.stderr.decode())  # fmt: skip

    def ctx(self, queue: QueueCLI, command: str, *args: str, input: str | None = None) -> Run:
        """``ctx queue COMMAND --project P ARGS`` on this host."""
        argv = [*CTX_ARGV, "queue", command, "--project", queue.project, *args]
        done = subprocess.run(self.argv(*argv), env=self.env, capture_output=True,
                              input=(input or "").encode(), timeout=60)  # fmt: skip
        return Run(argv[1:], done.returncode, done.stdout.decode(), done.stderr.decode())

    def recover(self, queue: QueueCLI, *args: str) -> tuple[int, dict]:
        r = self.ctx(queue, "recover", "--json", *args)
        assert r.rc in (0, 1), r
        return r.rc, r.json()

    def spawn(self, script: str) -> subprocess.Popen:
        """``sh -c SCRIPT`` on this host, in the background."""
        proc = subprocess.Popen(self.argv("sh", "-c", script), env=self.env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.spawned.append(proc)
        return proc

    def claim(self, queue: QueueCLI, box: Path, *args: str, stay: bool = True) -> tuple[str, int]:
        """A shell on this host claims one job (the shell holds the lease); with ``stay`` it
        then lives on (``exec sleep``), else it exits.  The job and the shell's pid here."""
        tag = uuid.uuid4().hex[:8]
        out, rc, pid = box / f"{tag}.job", box / f"{tag}.rc", box / f"{tag}.pid"
        then = "exec sleep 600" if stay else "exit 0"
        script = (f"echo $$ > {q(pid)}; {queue_line(queue, 'claim', *args)} > {q(out)}; "
                  f"echo $? > {q(rc)}.tmp; mv {q(rc)}.tmp {q(rc)}; {then}")  # fmt: skip
        proc = self.spawn(script)
        assert wait_for(lambda: rc.exists() or proc.poll() is not None, WAIT), self.name
        assert rc.exists(), proc.communicate()
        assert rc.read_text().strip() == "0", (out.read_text(), proc.stderr)
        return out.read_text().strip(), int(pid.read_text())

    def processes(self) -> list[int]:
        """Every process of this host's pid namespace, as this host's pids."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(entry / "ns" / "pid").st_ino == self.pid_ns:
                        found.append(int(entry.name))
        return found

    def freeze(self) -> list[int]:
        frozen = self.processes()
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return frozen

    def thaw(self, frozen: list[int]) -> None:
        """Continue ``frozen``, and the ``unshare`` and ``nsenter`` processes outside that
        stopped themselves when their child in the host stopped (as util-linux's do)."""
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for proc in [self.proc, *self.spawned]:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """The host vanishes: its init is killed, and the kernel kills everything in it."""
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{self.init}/ns/pid").st_ino == self.pid_ns:
                os.kill(self.init, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for proc in self.spawned:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(Exception):
                proc.communicate(timeout=30)


@pytest.fixture
def hosts(queue: QueueCLI) -> Iterator:
    """``hosts(name, machine=None)`` makes a host sharing ``queue``; all are killed after."""
    made: list[Host] = []

    def make(name: str, machine: Path | None = None) -> Host:
        host = Host(name, clean_env(CTX_STORAGE=str(queue.storage)), machine)
        made.append(host)
        return host

    yield make
    for host in made:
        with contextlib.suppress(Exception):
            host.thaw(host.processes())
        host.kill()


@pytest.fixture
def box() -> Iterator[Path]:
    """A scratch directory every host can reach (they share this machine's /tmp)."""
    made = new_scratch_dir(SCRATCH, "mh")
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def child() -> Iterator[subprocess.Popen]:
    """A live process of this host, to stand as a lease holder."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


# ------------------------------------------------------------------------------ leases and times


def now() -> datetime:
    return datetime.now(UTC)


def stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def jobs_in(report: dict, key: str) -> list[str]:
    return sorted(entry["job"] for entry in report[key])


def until_past(stamp_text: str, margin: float = 0.1) -> None:
    expiry = rfc3339(stamp_text) + timedelta(seconds=margin)
    assert wait_for(lambda: now() > expiry, WAIT), stamp_text


def recover_here(queue: QueueCLI, *args: str) -> tuple[int, dict]:
    r = queue.run("recover", "--json", *args)
    assert r.rc in (0, 1), r
    return r.rc, r.json()


def claimed_by(queue: QueueCLI, child: subprocess.Popen, *args: str) -> str:
    """A job published, then claimed here for ``child`` (``--pid``): its name."""
    job = queue.publish()
    assert queue.claim("--pid", str(child.pid), *args) == job
    return job


def remote_lease(queue: QueueCLI, job: str, **fields) -> dict:
    """J's lease rewritten as another host would have written it: another host name,
    machine-id, boot and pid namespace, its own pid 4121 (a number that means nothing here),
    valid a minute; then
    ``fields`` on top (None: the field left out)."""
    lease = dict(queue.lease(job))
    lease.update(host="node-far", worker="node-far:4121", machine_id=uuid.uuid4().hex,
                 boot_id=str(uuid.uuid4()), pid_ns=HOST_PID_NS + 7, pid=4121,
                 create_time=time.time() - 5, claimed_at=stamp(now()),
                 expires_at=stamp(now() + timedelta(seconds=60)))  # fmt: skip
    for key, value in fields.items():
        if value is None:
            lease.pop(key, None)
        else:
            lease[key] = value
    queue.write_lease(job, lease)
    return lease


# ============================================================== the lease, as the page shows it


def test_a_claim_on_another_host_writes_every_field_of_the_example_lease(queue, hosts, box):
    """N-1, Q-3 (multi-host.md, *Who is alive: the lease*): a claim made on "node-a" records
    ``job``, ``worker`` as ``node-a:PID`` (PID the holder's pid there), ``host``, this
    machine's ``machine_id``, the shared ``boot_id``, the integer inode of node-a's pid
    namespace, ``pid``, a ``create_time`` and ``claimed_at``/``expires_at`` in UTC."""
    job = queue.publish(name="build-42")
    node = hosts("node-a")
    got, pid = node.claim(queue, box, "--ttl", "40")
    assert got == job == "build-42.req.json"
    lease = queue.lease(job)
    assert set(lease) == LEASE_FIELDS, lease
    assert lease["job"] == job and lease["host"] == "node-a", lease
    assert lease["pid"] == pid and lease["worker"] == f"node-a:{pid}", lease
    assert lease["machine_id"] == (MACHINE_ID or None), lease
    assert lease["boot_id"] == BOOT_ID, lease
    assert isinstance(lease["pid_ns"], int) and lease["pid_ns"] == node.pid_ns != HOST_PID_NS
    assert isinstance(lease["create_time"], float), lease
    assert abs(lease["create_time"] - time.time()) < 60, lease
    for key in ("claimed_at", "expires_at"):
        assert lease[key].endswith("Z"), lease
    lifetime = rfc3339(lease["expires_at"]) - rfc3339(lease["claimed_at"])
    assert abs(lifetime.total_seconds() - 40) < 0.01, lease


# ============================================================== what the protocol needs


def test_mkdir_arbitrates_claims_racing_from_two_hosts_each_job_once(queue, hosts, box):
    """Q-2, W-3, N-1 (multi-host.md: "``mkdir claimed/J`` is the single arbitration point
    between competing workers"): shells on two hosts claim in a loop from one queue at once;
    every job is claimed exactly once, its lease names the host that printed it, and both end
    with exit 3 (nothing left)."""
    jobs = {queue.publish(name=f"race{n:02d}") for n in range(10)}
    go = box / "go"
    nodes = {name: hosts(name) for name in ("node-a", "node-b")}
    procs = {}
    for name, node in nodes.items():
        out = box / name
        claim = queue_line(queue, "claim", "--ttl", "60")
        procs[name] = node.spawn(
            f"while [ ! -e {q(go)} ]; do sleep 0.01; done; "
            f"while :; do {claim} >> {q(out)}; r=$?; [ $r = 0 ] || break; done; "
            f"echo $r > {q(out)}.tmp; mv {q(out)}.tmp {q(out)}.rc; exec sleep 600"
        )
    go.touch()
    for name in nodes:
        rc = box / f"{name}.rc"
        assert wait_for(rc.exists, 60), procs[name].poll()
        assert rc.read_text().strip() == "3", name
    taken = {name: (box / name).read_text().split() for name in nodes}
    every = taken["node-a"] + taken["node-b"]
    assert sorted(every) == sorted(jobs), taken  # each once, none lost
    for name, names in taken.items():
        for job in names:
            assert queue.lease(job)["host"] == name, (job, queue.lease(job))
    assert queue.entries("pending") == set()


def test_a_claim_losing_mkdir_to_another_host_takes_the_next_job_and_removes_nothing(
    queue, hosts, box
):
    """Q-2, N-1 (multi-host.md: a claim of a job another host took "fails cleanly"; queue.md:
    "Losing is not an error"): with ``claimed/J1`` made by another host's claimer, a claim on
    node-b takes J2 (exit 0), and leaves J1 pending and the other host's ``claimed/J1`` as it
    was."""
    first = queue.publish(name="first")
    second = queue.publish(name="second")
    theirs = queue.dir / "claimed" / first
    theirs.mkdir()
    before = os.stat(theirs).st_ino
    got, _pid = hosts("node-b").claim(queue, box, "--ttl", "30")
    assert got == second
    assert (queue.dir / "pending" / first).is_file() and theirs.is_dir()
    assert os.stat(theirs).st_ino == before and os.listdir(theirs) == []
    assert queue.state(second) == "claimed"


def test_a_stale_listing_offers_jobs_other_hosts_took_and_the_claim_goes_on_cleanly(
    queue, child, tmp_path
):
    """Q-2, Q-9, N-1 (multi-host.md, *Close-to-open caching*: "A worker may therefore see a
    stale pending/ listing: it tries a job another host already took, and the claim fails
    cleanly"): host A's claim order (its own cache) still lists s2 and s3, and ``pending/``
    shows it the mtime it recorded, while host B has claimed s2 and claimed and finished s3;
    A's ``list --state pending`` names s4 alone, A's next claim gives s4 (exit 0), and
    nothing of B's is touched or left behind."""
    names = [queue.publish(name=f"s{n}") for n in range(1, 5)]
    host_a = clean_env(CTX_STORAGE=str(queue.storage), XDG_CACHE_HOME=str(tmp_path / "a"))
    host_b = clean_env(CTX_STORAGE=str(queue.storage), XDG_CACHE_HOME=str(tmp_path / "b"))
    pid = str(child.pid)
    first = queue.run("claim", "--pid", pid, "--ttl", "60", env=host_a)
    assert first.rc == 0 and first.out.strip() == names[0], first
    pending = queue.dir / "pending"
    seen = os.stat(pending).st_mtime_ns
    for _ in range(2):
        r = queue.run("claim", "--pid", pid, "--ttl", "60", env=host_b)
        assert r.rc == 0, r
    assert queue.run("finish", names[2], "--ok", "-", input="{}", env=host_b).rc == 0
    theirs = queue.lease(names[1])
    before = snapshot(queue.dir)
    os.utime(pending, ns=(seen, seen))  # what an NFS client's attribute cache shows host A
    listed = queue.run("list", "--state", "pending", "--json", env=host_a)
    assert listed.rc == 0 and listed.json() == [{"name": names[3], "state": "pending"}], listed
    os.utime(pending, ns=(seen, seen))
    r = queue.run("claim", "--pid", pid, "--ttl", "60", env=host_a)
    assert r.rc == 0 and r.out.strip() == names[3], r
    assert queue.entries("claimed") == {names[0], names[1], names[3]}
    assert queue.lease(names[1]) == theirs
    assert queue.state(names[2]) == "done"
    after = snapshot(queue.dir)
    for path in before:
        if names[3] not in path:
            assert after.get(path) == before[path], path


def test_no_move_of_a_remote_recover_replaces_pending_evidence(queue, hosts, child):
    """Q-5, Q-6, N-1 (multi-host.md: "no move may ever replace evidence"): J claimed on
    another host with an expired lease, and J pending again (a copy put back by hand): recover
    from node-b, plain and ``--reconcile``, exits 1 calling J a conflict, and both requests
    stay byte for byte."""
    job = claimed_by(queue, child, "--ttl", "60")
    remote_lease(queue, job, expires_at=stamp(now() - timedelta(seconds=5)))
    (queue.dir / "pending" / job).write_text('{"tool": "fs.read", "input": {"copy": true}}\n')
    before = snapshot(queue.dir)
    node = hosts("node-b")
    for args in ((), ("--reconcile",)):
        rc, report = node.recover(queue, *args)
        assert rc == 1 and report["consistent"] is False, report
        assert jobs_in(report, "conflicts") == [job] and report["requeued"] == [], report
    assert snapshot(queue.dir) == before


def test_publishing_a_name_another_host_holds_is_eexist_and_leaves_no_temp(queue, hosts, box):
    """Q-1, N-1 (multi-host.md: "``link`` fails with ``EEXIST`` when the name exists ... no
    move may ever replace evidence"): J claimed on node-a; publishing J from node-b is refused
    (exit 1, EEXIST), the claimed request and lease are unchanged and ``inbox/`` stays
    empty."""
    job = queue.publish(name="held")
    got, _pid = hosts("node-a").claim(queue, box, "--ttl", "30")
    assert got == job
    before = snapshot(queue.dir)
    again = hosts("node-b").ctx(queue, "publish", "--name", "held", "-",
                                input='{"tool": "fs.read", "input": {}}')  # fmt: skip
    assert again.rc == 1 and "EEXIST" in again.err, again
    assert again.out == "", again
    assert snapshot(queue.dir) == before
    assert queue.entries("inbox") == set()


@needs_strace
def test_a_filesystem_without_atomic_renames_gets_link_and_ext4_gets_renameat2(queue, box, child):
    """N-1 (multi-host.md: "the queue detects the filesystem (``statfs``) and moves names with
    ``link``, fsync of the destination directory, then ``unlink``"; queue.md: "Elsewhere (NFS,
    unknown filesystems) the queue moves a name with link"): on a ramfs queue publish, claim
    and finish move every name with ``linkat`` and never rename; on the ext4 storage root
    they use ``renameat2(RENAME_NOREPLACE)`` and never link, until ``move=link`` is set in
    ``queue/config`` ("Set ``move=link`` in ``queue/config`` to force it")."""
    fstype = subprocess.run(["stat", "-f", "-c", "%T", str(queue.dir)], capture_output=True,
                            text=True).stdout.strip()  # fmt: skip
    if fstype != "ext2/ext3":
        pytest.skip(f"the storage root is on {fstype}, not ext4, here")
    req = box / "req.json"
    req.write_text('{"tool": "fs.read", "input": {}}')
    calls = "linkat,link,renameat2,renameat,rename"
    ram = box / "ram"
    ram.mkdir()
    script = (
        f"mount -t ramfs none {q(ram)} || exit 97\n"
        f"{CTX} queue init --queue {q(ram)}/q > /dev/null || exit 96\n"
        f'S() {{ strace -f -qq -e trace={calls} -o {q(box)}/ram-$1.log {CTX} queue "$@"; }}\n'
        f"S publish --queue {q(ram)}/q {q(req)} > {q(box)}/j || exit 95\n"
        f"S claim --queue {q(ram)}/q --pid {child.pid} > /dev/null || exit 94\n"
        f"S finish --queue {q(ram)}/q $(cat {q(box)}/j) --ok {q(req)} > /dev/null || exit 93\n"
        f"ls {q(ram)}/q/done\n"
    )
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True,
                          text=True, env=clean_env(), timeout=120)  # fmt: skip
    assert done.returncode == 0, done
    job = (box / "j").read_text().strip()
    assert done.stdout.split()[-2:] == [job, f"{job}.result"], done
    for step in ("publish", "claim", "finish"):
        log = [line for line in (box / f"ram-{step}.log").read_text().splitlines()
               if str(ram) in line or job in line]  # fmt: skip
        moves = [line for line in log if "link" in line.split("(")[0].split()[-1]]
        assert any(f'"{job}' in line for line in moves), (step, log)
        assert not [line for line in log if "rename" in line.split("(")[0]], (step, log)

    log = box / "ext4.log"
    traced = subprocess.run(
        [
            "strace",
            "-f",
            "-qq",
            "-e",
            f"trace={calls}",
            "-o",
            str(log),
            *CTX_ARGV,
            "queue",
            "publish",
            "--project",
            queue.project,
            str(req),
        ],
        capture_output=True,
        text=True,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
    )
    assert traced.returncode == 0, traced
    mine = [line for line in log.read_text().splitlines() if traced.stdout.strip() in line]
    assert any("renameat2(" in line and "RENAME_NOREPLACE" in line for line in mine), mine
    assert not [line for line in mine if "link" in line.split("(")[0]], mine

    with (queue.dir / "config").open("a") as config:  # "Set move=link ... to force it"
        config.write("move=link\n")
    forced = subprocess.run(
        ["strace", "-f", "-qq", "-e", f"trace={calls}", "-o", str(log), *CTX_ARGV, "queue",
         "publish", "--project", queue.project, str(req)],
        capture_output=True, text=True, env=clean_env(CTX_STORAGE=str(queue.storage)),
    )  # fmt: skip
    assert forced.returncode == 0, forced
    mine = [line for line in log.read_text().splitlines() if forced.stdout.strip() in line]
    assert any(line.split()[1].startswith("linkat(") for line in mine), mine
    assert not [line for line in mine if "rename" in line.split("(")[0]], mine


def test_a_claim_link_left_by_the_link_strategy_is_dropped_by_reconcile_from_another_host(
    queue, hosts, child
):
    """Q-6, N-1 (multi-host.md: "Set ``move=link`` in ``queue/config`` to force it"; queue.md:
    a crash of a claim under the link strategy leaves ``claimed/J/J`` a second link of
    ``pending/J``: plain recover "reports it", ``--reconcile`` "drops the claim link"): plain
    recover exits 1 and changes nothing; ``--reconcile`` from node-b leaves J pending with one
    link and no claim, and J is claimed normally next."""
    with (queue.dir / "config").open("a") as config:
        config.write("move=link\n")
    job = queue.publish(name="linked")
    (queue.dir / "claimed" / job).mkdir()
    os.link(queue.dir / "pending" / job, queue.dir / "claimed" / job / job)
    body = (queue.dir / "pending" / job).read_bytes()
    before = snapshot(queue.dir)
    node = hosts("node-b")
    rc, report = node.recover(queue)
    assert rc == 1 and jobs_in(report, "incomplete") == [job], report
    assert snapshot(queue.dir) == before
    rc, report = node.recover(queue, "--reconcile")
    assert rc == 0 and report["consistent"] is True, report
    assert jobs_in(report, "repaired") == [job], report
    kept = queue.dir / "pending" / job
    assert kept.read_bytes() == body and os.stat(kept).st_nlink == 1
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()
    assert queue.claim("--pid", str(child.pid)) == job


# ============================================================== the NFS caveats


def test_an_empty_claim_of_a_retransmitted_mkdir_holds_the_job_until_a_remote_reconcile(
    queue, hosts, box
):
    """Q-2, Q-6, N-1 (multi-host.md, *Non-idempotent retransmitted mkdir*: "``claimed/J``
    exists and is empty, J is still in ``pending/``, and no other worker can claim J. ``ctx
    queue recover --reconcile`` removes such an empty ``claimed/J``, after which J is
    claimable again"): a claim on node-b exits 3 naming J and the reconcile, and a draining
    worker there exits 0 leaving J pending (``left_pending``); plain recover and
    ``--reconcile --dry-run`` from node-c exit 1 and change nothing; ``--reconcile`` from
    node-c removes it (exit 0); node-b then claims J."""
    job = queue.publish(name="retried")
    (queue.dir / "claimed" / job).mkdir()
    node_b, node_c = hosts("node-b"), hosts("node-c")
    none = node_b.sh(queue_line(queue, "claim", "--ttl", "30"))
    assert none.rc == 3 and none.out == "", none
    assert job in none.err and "recover --reconcile" in none.err, none
    drained = node_b.sh(queue_line(queue, "work", "--drain", "--json"))
    assert drained.rc == 0, drained
    stop = [json.loads(line) for line in drained.out.splitlines() if '"stop"' in line]
    assert stop and stop[-1]["left_pending"] == {job: "claimed"}, drained
    assert job in drained.err, drained
    before = snapshot(queue.dir)
    for args in ((), ("--reconcile", "--dry-run")):
        rc, report = node_c.recover(queue, *args)
        assert rc == 1 and report["consistent"] is False, (args, report)
        assert job in json.dumps(report["incomplete"] + report["repaired"]), report
        assert snapshot(queue.dir) == before
    rc, report = node_c.recover(queue, "--reconcile")
    assert rc == 0 and jobs_in(report, "repaired") == [job], report
    assert queue.entries("claimed") == set() and queue.state(job) == "pending"
    got, _pid = node_b.claim(queue, box, "--ttl", "30")
    assert got == job


def test_a_waiting_worker_runs_the_job_a_remote_reconcile_freed_exactly_once(
    queue, agent, hosts, outbox
):
    """Q-6, W-2, N-1 (multi-host.md: J "is delayed until the next reconcile", "no job is lost
    or run twice"; workers.md: every wait is bounded, 2 s): a worker waiting on node-w cannot
    take J while an empty ``claimed/J`` stands; a reconcile on node-r removes it without
    touching ``pending/``, and the waiting worker runs J within the bound, once."""
    runs = outbox / "runs"
    job = queue.publish(shell_job(f"echo ran >> {runs}"), name="delayed")
    (queue.dir / "claimed" / job).mkdir()
    worker = hosts("node-w")
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT, "--json"]
    proc = worker.spawn("exec " + " ".join(map(q, argv)))
    lines: list[tuple[float, dict]] = []

    def read() -> None:
        for line in proc.stdout:
            with contextlib.suppress(ValueError):
                lines.append((time.monotonic(), json.loads(line)))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert wait_for(lambda: any(e.get("event") == "start" for _t, e in lines), WAIT), proc.poll()
    time.sleep(0.5)
    assert queue.state(job) == "pending" and not runs.exists()
    rc, report = hosts("node-r").recover(queue, "--reconcile")
    assert rc == 0 and jobs_in(report, "repaired") == [job], report
    freed = time.monotonic()
    assert wait_for(lambda: queue.state(job) == "done", 10), (lines, queue.state(job))
    claims = [t for t, e in lines if e.get("event") == "claim" and e.get("job") == job]
    assert claims and claims[0] - freed < 2.0 + 1.5, (claims, freed)
    assert runs.read_text().split() == ["ran"]
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=WAIT)


def test_a_job_published_where_inotify_cannot_see_it_is_found_within_the_bound(queue, hosts, box):
    """W-2, N-1 (multi-host.md, *inotify sees only local changes*: "Jobs published by another
    host do not wake a waiting worker through inotify; the bounded wait covers them"): a
    worker here waits on the queue through a ``ctx mount`` (FUSE: the backing directory's
    changes raise no inotify event on it, as another host's do not over NFS); a job node-p
    publishes straight into the backing directory is claimed within the 2 s bound."""
    if not (os.path.exists("/dev/fuse") and shutil.which("fusermount3")):
        pytest.skip("needs /dev/fuse and fusermount3")
    far = hosts("node-p")  # made first: a mount namespace made later would keep a copy of the mount
    where = box / "mnt"
    where.mkdir()
    with serving(queue.storage, where) as _mount:
        through = where / "shared" / queue.project / "queue"
        assert (through / "pending").is_dir()
        argv = [*CTX_ARGV, "queue", "work", "--queue", str(through), "--json"]
        env = clean_env(CTX_STORAGE=str(queue.storage))
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)  # fmt: skip
        lines: list[tuple[float, dict]] = []

        def read() -> None:
            for line in proc.stdout:
                with contextlib.suppress(ValueError):
                    lines.append((time.monotonic(), json.loads(line)))

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            assert wait_for(lambda: any(e.get("event") == "start" for _t, e in lines), WAIT)
            start = next(e for _t, e in lines if e.get("event") == "start")
            assert "wait" in start, start
            time.sleep(0.7)  # the worker is waiting now
            published = far.ctx(queue, "publish", "--name", "far", "-",
                                             input='{"tool": "fs.read", "input": {}}')  # fmt: skip
            assert published.rc == 0, published
            at = time.monotonic()
            job = published.out.strip()
            assert wait_for(
                lambda: any(e.get("job") == job for _t, e in lines if e.get("event") == "claim"),
                10,
            ), (lines, proc.poll())
            claimed = next(t for t, e in lines if e.get("event") == "claim")
            assert claimed - at < 2.0 + 1.5, (claimed - at, lines)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_recover_from_another_host_leaves_a_job_whose_claim_dir_is_flocked(queue, hosts, child):
    """Q-5, N-1 (multi-host.md, *flock*: "Recover and finish lock ``claimed/J`` with
    ``flock``"): with J's lease expired but ``claimed/J`` locked (a transition in progress),
    recover from node-b leaves J claimed, "untouched" (exit 0); once the lock is released the
    same command requeues J."""
    job = claimed_by(queue, child, "--ttl", "60")
    remote_lease(queue, job, expires_at=stamp(now() - timedelta(seconds=5)))
    node = hosts("node-b")
    fd = os.open(queue.dir / "claimed" / job, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        rc, report = node.recover(queue, "--reconcile")
        assert rc == 0 and report["requeued"] == [], report
        assert jobs_in(report, "untouched") == [job], report
        assert "another process" in report["untouched"][0]["detail"], report
        assert queue.state(job) == "claimed"
    finally:
        os.close(fd)
    rc, report = node.recover(queue)
    assert rc == 0 and jobs_in(report, "requeued") == [job], report
    assert queue.state(job) == "pending"


# ============================================================== rule 1: same boot, same pid ns


def test_rule1_a_dead_holder_of_this_pid_namespace_is_gone_whatever_its_host_name(queue, box):
    """Q-5 rule 1 (multi-host.md: "Same boot and same pid namespace ... the pid is
    meaningful here. The holder is gone if the pid does not exist"): a shell in a UTS
    namespace named node-u (this pid namespace) claims; while it lives recover here leaves J
    alone; once it has exited, recover requeues J at once, long before its lease expires."""
    job = queue.publish(name="uts")
    go, out = box / "go", box / "job"
    script = (f"hostname node-u || exit 99; {queue_line(queue, 'claim', '--ttl', '120')} > "
              f"{q(out)}; while [ ! -e {q(go)} ]; do sleep 0.02; done; exit 0")  # fmt: skip
    proc = subprocess.Popen(["unshare", "--uts", "sh", "-c", script],
                            env=clean_env(CTX_STORAGE=str(queue.storage)))  # fmt: skip
    try:
        assert wait_for(lambda: out.exists() and out.read_text().strip() == job, WAIT)
        lease = queue.lease(job)
        assert (lease["host"], lease["pid"], lease["pid_ns"]) == ("node-u", proc.pid,
                                                                 HOST_PID_NS)  # fmt: skip
        rc, report = recover_here(queue)
        assert rc == 0 and jobs_in(report, "untouched") == [job], report
    finally:
        go.touch()
        proc.wait(timeout=WAIT)
    rc, report = recover_here(queue)
    assert rc == 0 and jobs_in(report, "requeued") == [job], report
    assert "exited" in report["requeued"][0]["detail"], report
    assert rfc3339(lease["expires_at"]) - now() > timedelta(seconds=60)


def test_rule1_a_zombie_holder_is_gone(queue):
    """Q-5 rule 1 (multi-host.md: "The holder is gone if the pid ... is a zombie"): J held by
    a child of this process that has exited but is not reaped is requeued at once."""
    holder = subprocess.Popen(["sleep", "600"])
    try:
        job = claimed_by(queue, holder, "--ttl", "120")
        rc, report = recover_here(queue)
        assert rc == 0 and jobs_in(report, "untouched") == [job], report
        os.kill(holder.pid, signal.SIGKILL)
        assert wait_for(lambda: not alive(holder.pid), WAIT)
        assert os.path.exists(f"/proc/{holder.pid}")  # a zombie: not reaped yet
        rc, report = recover_here(queue)
        assert rc == 0 and jobs_in(report, "requeued") == [job], report
        assert "zombie" in report["requeued"][0]["detail"], report
    finally:
        holder.kill()
        holder.wait()


def test_rule1_a_live_pid_with_another_start_time_is_a_reused_pid(queue, child):
    """Q-5 rule 1 (multi-host.md: the holder is gone if the pid "belongs to a process with
    another start time (the pid was reused). If it is alive, the job is left alone until its
    lease expires"): J's holder alive with its start time is left alone; the same lease with a
    start time ten seconds earlier is requeued at once, the process untouched."""
    job = claimed_by(queue, child, "--ttl", "120")
    rc, report = recover_here(queue, "--reconcile", "--grace", "0")
    assert rc == 0 and jobs_in(report, "untouched") == [job], report
    lease = queue.lease(job)
    queue.write_lease(job, {**lease, "create_time": lease["create_time"] - 10})
    rc, report = recover_here(queue)
    assert rc == 0 and jobs_in(report, "requeued") == [job], report
    assert "another process" in report["requeued"][0]["detail"], report
    assert alive(child.pid)


def test_rule1_is_judged_from_where_recover_runs(queue, hosts, box):
    """Q-5 (multi-host.md: "``recover`` decides, from where it runs, whether the holder is
    provably gone"): a shell on node-n claims J and exits while node-n lives on; recover here
    (another pid namespace) leaves J alone until its lease expires, while recover on node-n
    itself finds the pid gone and requeues J at once."""
    node = hosts("node-n")
    job = queue.publish(name="inside")
    got, pid = node.claim(queue, box, "--ttl", "120", stay=False)
    assert got == job
    assert wait_for(lambda: node.sh(f"kill -0 {pid} 2>/dev/null").rc != 0, WAIT)
    rc, report = recover_here(queue, "--reconcile")
    assert rc == 0 and jobs_in(report, "untouched") == [job], report
    assert queue.state(job) == "claimed"
    rc, report = node.recover(queue)
    assert rc == 0 and jobs_in(report, "requeued") == [job], report
    assert queue.state(job) == "pending"


# ============================================================== rule 2: same machine, another boot

RULE2 = [
    pytest.param({"host": HERE, "machine_id": MACHINE_ID}, "pending",
                 id="same-host-same-machine-id", marks=needs_machine_id),
    pytest.param({"host": HERE, "machine_id": None}, "pending", id="same-host-no-machine-id"),
    pytest.param({"host": HERE, "machine_id": "00" * 16}, "claimed",
                 id="same-host-other-machine-id", marks=needs_machine_id),
    pytest.param({"host": "node-x", "machine_id": MACHINE_ID}, "claimed",
                 id="other-host-same-machine-id", marks=needs_machine_id),
]  # fmt: skip


@pytest.mark.parametrize(("fields", "expected"), RULE2)
def test_rule2_another_boot_counts_as_a_reboot_only_for_this_host_name_and_machine(
    queue, child, fields, expected
):
    """Q-5 rule 2 (multi-host.md: "Same machine, another boot (``host`` equal, ``machine_id``
    equal or not recorded on one side, ``boot_id`` different): ... the holder is gone";
    anything else is rule 3): a lease of a live holder here, rewritten with another
    ``boot_id``, is requeued at once only for this host name with this machine-id or none
    recorded; otherwise it is left alone."""
    job = claimed_by(queue, child, "--ttl", "120")
    lease = queue.lease(job)
    written = {**lease, "boot_id": str(uuid.uuid4()), "host": fields["host"]}
    if fields["machine_id"] is None:
        written.pop("machine_id", None)
    else:
        written["machine_id"] = fields["machine_id"]
    queue.write_lease(job, written)
    rc, report = recover_here(queue)
    assert rc == 0, report
    assert queue.state(job) == expected, report
    if expected == "pending":
        assert "rebooted" in report["requeued"][0]["detail"], report
        assert alive(child.pid)  # the hazard the page warns of: a live holder taken for gone
    else:
        assert jobs_in(report, "untouched") == [job], report


@needs_machine_id
def test_rule2_a_recover_side_without_a_machine_id_takes_this_host_name_for_this_machine(
    queue, child, box
):
    """Q-5 rule 2 (multi-host.md: a lease "counts as written before a reboot here when both
    sides record the same ``/etc/machine-id``, *or when either records none*"): a lease of
    this host name, another machine-id and another boot is left alone by recover here; run
    where ``/etc/machine-id`` is empty (a mount namespace), recover requeues it."""
    job = claimed_by(queue, child, "--ttl", "120")
    lease = queue.lease(job)
    queue.write_lease(job, {**lease, "boot_id": str(uuid.uuid4()), "machine_id": "00" * 16})
    rc, report = recover_here(queue)
    assert rc == 0 and jobs_in(report, "untouched") == [job], report
    empty = box / "machine-id"
    empty.write_text("")
    script = (f"mount --bind {q(empty)} /etc/machine-id || exit 98; "
              f"exec {queue_line(queue, 'recover', '--json')}")  # fmt: skip
    done = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True,
                          text=True, env=clean_env(CTX_STORAGE=str(queue.storage)))  # fmt: skip
    assert done.returncode == 0, done
    assert jobs_in(json.loads(done.stdout), "requeued") == [job], done.stdout
    assert queue.state(job) == "pending"


@needs_machine_id
def test_a_host_given_its_own_machine_id_is_never_taken_for_this_machine_rebooted(
    queue, hosts, box
):
    """Q-5, N-1 (multi-host.md: "give a container its own [machine-id] by mounting or writing
    one at its start"): a container started with this host's name and its own
    ``/etc/machine-id`` records that machine-id in its lease; with another boot written in,
    recover here still leaves J alone (rule 3)."""
    mine = box / "machine-id"
    own = uuid.uuid4().hex
    mine.write_text(own + "\n")
    node = hosts(HERE, machine=mine)
    job = queue.publish(name="own-id")
    got, _pid = node.claim(queue, box, "--ttl", "120")
    assert got == job
    lease = queue.lease(job)
    assert (lease["host"], lease["machine_id"]) == (HERE, own), lease
    queue.write_lease(job, {**lease, "boot_id": str(uuid.uuid4())})
    for args in ((), ("--reconcile", "--grace", "0")):
        rc, report = recover_here(queue, *args)
        assert rc == 0 and jobs_in(report, "untouched") == [job], report
    assert queue.state(job) == "claimed"


@needs_machine_id
def test_a_host_without_a_machine_id_and_this_host_name_is_taken_for_this_machine(
    queue, hosts, box
):
    """Q-5, N-1 (multi-host.md: "Two machines with the same host name and the same
    machine-id, or without one, therefore take each other's live holders for rebooted ones,
    and ``recover`` on either requeues the other's running jobs"): a container started with
    this host's name and no machine-id records none; its live claim, with another boot
    written in, is requeued by recover here while its holder still runs."""
    empty = box / "machine-id"
    empty.write_text("")
    node = hosts(HERE, machine=empty)
    job = queue.publish(name="no-id")
    got, pid = node.claim(queue, box, "--ttl", "120")
    assert got == job
    lease = queue.lease(job)
    assert lease["host"] == HERE and not lease.get("machine_id"), lease
    queue.write_lease(job, {**lease, "boot_id": str(uuid.uuid4())})
    rc, report = recover_here(queue)
    assert rc == 0 and jobs_in(report, "requeued") == [job], report
    assert node.sh(f"kill -0 {pid}").rc == 0  # the holder was alive all along


# ============================================================== rule 3: anything else


def test_rule3_containers_on_one_machine_are_kept_apart_by_their_pid_namespaces(queue, hosts, box):
    """Q-5 rule 3 (multi-host.md: "Containers on one machine share its ``boot_id``, so rule 2
    never applies between them: their pid namespaces keep them apart"): container A (this
    host name, this machine-id, its own pid namespace) claims; recover here and in container
    B leave J alone while the lease runs, also after A has vanished; once the lease expired
    B requeues J."""
    a, b = hosts(HERE), hosts(HERE)
    job = queue.publish(name="contained")
    got, _pid = a.claim(queue, box, "--ttl", "2")
    assert got == job
    lease = queue.lease(job)
    assert (lease["host"], lease["boot_id"], lease["pid_ns"]) == (HERE, BOOT_ID, a.pid_ns)
    for where in (None, b):
        rc, report = where.recover(queue) if where else recover_here(queue)
        assert rc == 0 and jobs_in(report, "untouched") == [job], report
    a.kill()
    if rfc3339(lease["expires_at"]) - now() > timedelta(seconds=0.8):
        rc, report = b.recover(queue, "--reconcile", "--grace", "0")
        assert rc == 0 and jobs_in(report, "untouched") == [job], report
        assert queue.state(job) == "claimed"
    until_past(lease["expires_at"])
    rc, report = b.recover(queue)
    assert rc == 0 and jobs_in(report, "requeued") == [job], report
    assert "expired" in report["requeued"][0]["detail"], report


def test_rule3_a_pid_of_another_host_means_nothing_here(queue, child):
    """Q-5 rule 3, N-1 (multi-host.md: "another host: the pid means nothing from here. Only
    the lease's expiry proves the holder gone. Until ``expires_at``, the job is left alone"):
    a lease of node-far naming a pid that is alive here, or one that no process has here, is
    left alone by recover, plain, ``--reconcile --grace 0`` and ``--dry-run``, and ``show``
    calls its holder unknown."""
    dead = 4_194_000
    assert not os.path.exists(f"/proc/{dead}")
    for pid in (child.pid, dead):
        job = claimed_by(queue, child, "--ttl", "120")
        remote_lease(queue, job, pid=pid, worker=f"node-far:{pid}")
        for args in ((), ("--reconcile", "--grace", "0"), ("--dry-run",)):
            rc, report = recover_here(queue, *args)
            assert rc == 0 and job in jobs_in(report, "untouched"), (pid, args, report)
            assert report["requeued"] == [], report
        shown = queue.run("show", job, "--json")
        assert shown.rc == 0 and shown.json()["holder"]["state"] == "unknown", shown
        assert queue.state(job) == "claimed"


def test_an_expired_lease_is_proof_even_when_its_pid_is_alive_here(queue, child):
    """Q-5 (multi-host.md: "Wherever the holder runs, an expired lease is proof that it is
    gone, even when its pid is alive on this host"): a claim for a live process here with a
    one-second lease is left alone while it runs and requeued once it expired, the process
    still alive."""
    job = claimed_by(queue, child, "--ttl", "1")
    lease = queue.lease(job)
    until_past(lease["expires_at"])
    rc, report = recover_here(queue)
    assert rc == 0 and jobs_in(report, "requeued") == [job], report
    assert "expired" in report["requeued"][0]["detail"], report
    assert alive(child.pid)


# ============================================================== workers, renewals, lifetimes


def test_a_worker_on_another_host_renews_every_third_and_is_never_requeued(
    queue, agent, hosts, outbox
):
    """W-3, Q-3, N-1 (multi-host.md: "A worker renews its leases every third of their lifetime
    while the job runs, so a live worker on another host never lets its lease expire"): a
    worker on node-r (``--ttl 3``) runs a 2.5 s job; its lease names ``node-r:PID``, is
    renewed at least twice, each time for the whole lifetime and before a third of it has
    passed, is never seen expired, and recover here never requeues the job, which runs
    once."""
    runs = outbox / "runs"
    job = queue.publish(shell_job(f"echo ran >> {runs}; sleep 2.5; echo fine"), name="long")
    node = hosts("node-r")
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT,
            "--drain", "--ttl", "3", "--json"]  # fmt: skip
    proc = node.spawn("exec " + " ".join(map(q, argv)))
    path = queue.dir / "lease" / job / "worker"
    assert wait_for(path.exists, WAIT), proc.poll()
    seen: dict[str, dict] = {}
    recovered = 0.0
    while proc.poll() is None and queue.state(job) != "done":
        with contextlib.suppress(OSError, ValueError):
            lease = json.loads(path.read_text())
            assert rfc3339(lease["expires_at"]) > now(), lease
            seen[lease.get("renewed_at") or lease["claimed_at"]] = lease
        if time.monotonic() - recovered > 0.5:
            _rc, report = recover_here(queue)
            assert report["requeued"] == [], report
            recovered = time.monotonic()
        time.sleep(0.03)
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    assert queue.state(job) == "done" and runs.read_text().split() == ["ran"]
    leases = [seen[k] for k in sorted(seen, key=lambda k: rfc3339(k))]
    assert len(leases) >= 3, leases  # the claim and at least two renewals
    start = next(json.loads(line) for line in out.splitlines() if '"start"' in line)
    first = leases[0]
    assert first["host"] == "node-r" and first["worker"] == start["worker"], (first, start)
    assert start["worker"] == f"node-r:{first['pid']}", start
    previous = rfc3339(first["claimed_at"])
    for lease in leases[1:]:
        renewed = rfc3339(lease["renewed_at"])
        assert (renewed - previous).total_seconds() < 1.0 + 0.75, leases
        span = rfc3339(lease["expires_at"]) - renewed
        assert abs(span.total_seconds() - 3) < 0.01, lease
        previous = renewed
    result = json.loads((queue.dir / "done" / f"{job}.result").read_text())
    assert result["worker"]["host"] == "node-r", result


def test_lease_ttl_bounds_how_long_a_vanished_hosts_job_waits(queue, agent, hosts, box, outbox):
    """Q-3, Q-5, N-1 (multi-host.md: "The lease lifetime (``lease_ttl`` in ``queue/config``,
    ``--ttl`` on ``claim``) is therefore the bound on how long a dead remote worker's job
    waits"): with ``lease_ttl=2`` a worker on node-d leases for 2 s; node-d vanishes mid-job;
    recover from node-e leaves the job alone before the last lease expires and requeues it no
    later than 2 s (plus a margin) after the host vanished; a claim with ``--ttl 7`` still
    leases for 7 s."""
    with (queue.dir / "config").open("a") as config:
        config.write("lease_ttl=2\n")
    flag = outbox / "flag"
    job = queue.publish(shell_job(f"touch {flag}; sleep 60"), name="orphan")
    other = queue.publish(name="other")
    node, watcher = hosts("node-d"), hosts("node-e")
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT,
            "--max-jobs", "1"]  # fmt: skip
    node.spawn("exec " + " ".join(map(q, argv)))
    assert wait_for(flag.exists, WAIT)
    lease = queue.lease(job)
    since = lease.get("renewed_at") or lease["claimed_at"]
    assert abs((rfc3339(lease["expires_at"]) - rfc3339(since)).total_seconds() - 2) < 0.01
    node.kill()
    vanished = time.monotonic()
    last = queue.lease(job)
    if rfc3339(last["expires_at"]) - now() > timedelta(seconds=0.5):
        rc, report = watcher.recover(queue)
        assert rc == 0 and report["requeued"] == [], report
    requeued_at = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        rc, report = watcher.recover(queue)
        if report["requeued"]:
            requeued_at = time.monotonic()
            assert now() > rfc3339(last["expires_at"]), report
            break
        time.sleep(0.1)
    assert requeued_at is not None and jobs_in(report, "requeued") == [job], report
    assert requeued_at - vanished < 2 + 1.5, requeued_at - vanished
    assert queue.state(job) == "pending"
    got, _pid = watcher.claim(queue, box, "--ttl", "7")
    assert got in (job, other)
    taken = queue.lease(got)
    assert abs((rfc3339(taken["expires_at"]) - rfc3339(taken["claimed_at"])).total_seconds()
               - 7) < 0.01, taken  # fmt: skip


def test_a_vanished_hosts_claim_waits_for_expiry_under_every_recover_option(queue, hosts, box):
    """Q-5, Q-6, N-1 (multi-host.md: "a worker whose host vanished stops renewing, and its jobs
    become recoverable once ``expires_at`` has passed"): node-v claims J and vanishes; from
    node-w, plain recover, ``--reconcile``, ``--reconcile --grace 0`` and ``--dry-run`` all
    leave J alone (exit 0) while the lease runs; once it expired ``--dry-run`` reports the
    requeue (``applied`` false) and changes nothing, and plain recover requeues J (exit 0)."""
    node, watcher = hosts("node-v"), hosts("node-w")
    job = queue.publish(name="vanished")
    got, _pid = node.claim(queue, box, "--ttl", "2")
    assert got == job
    lease = queue.lease(job)
    node.kill()
    for args in ((), ("--reconcile",), ("--reconcile", "--grace", "0"), ("--dry-run",)):
        if rfc3339(lease["expires_at"]) - now() < timedelta(seconds=0.4):
            break
        rc, report = watcher.recover(queue, *args)
        assert rc == 0 and report["requeued"] == [], (args, report)
        assert jobs_in(report, "untouched") == [job], (args, report)
    until_past(lease["expires_at"])
    before = snapshot(queue.dir)
    rc, plan = watcher.recover(queue, "--dry-run")
    assert rc == 0 and jobs_in(plan, "requeued") == [job], plan
    assert plan["requeued"][0]["applied"] is False, plan
    assert snapshot(queue.dir) == before
    rc, report = watcher.recover(queue)
    assert rc == 0 and jobs_in(report, "requeued") == [job], report
    assert report["requeued"][0]["applied"] is True and report["consistent"] is True
    assert queue.state(job) == "pending"
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()
    rc, again = watcher.recover(queue, "--reconcile")  # I-5: nothing left to do
    assert rc == 0 and again["requeued"] == [] and again["repaired"] == [], again


def test_a_frozen_host_keeps_its_job_until_expiry_then_its_shell_finds_it_pending(
    queue, hosts, box
):
    """Q-5, N-1 (multi-host.md: only the lease's expiry proves another host's holder gone;
    queue.md: a stopped holder "keeps its job like any live holder", and ``show`` says it is
    stopped): node-f claims J and is frozen (every process stopped); ``show`` on node-f says
    its holder is stopped, ``show`` here calls it unknown, recover from node-g leaves J alone
    until the lease expires and then requeues it; thawed, node-f's shell is refused ``renew``
    and ``finish`` (exit 1, J pending), and nothing is written."""
    node, other = hosts("node-f"), hosts("node-g")
    job = queue.publish(name="frozen")
    go, rcs = box / "go", box / "rcs"
    project = f"--project {q(queue.project)}"
    script = (
        f"{CTX} queue claim {project} --ttl 2 > {q(box)}/j.tmp && mv {q(box)}/j.tmp {q(box)}/j\n"
        f"while [ ! -e {q(go)} ]; do sleep 0.02; done; J=$(cat {q(box)}/j)\n"
        f'{CTX} queue renew {project} "$J" 2> {q(box)}/renew.err; echo $? > {q(rcs)}.tmp\n'
        f"echo '{{}}' | {CTX} queue finish {project} \"$J\" --ok - 2> {q(box)}/finish.err\n"
        f"echo $? >> {q(rcs)}.tmp; mv {q(rcs)}.tmp {q(rcs)}; exec sleep 600"
    )
    node.spawn(script)
    assert wait_for((box / "j").exists, WAIT)
    assert (box / "j").read_text().strip() == job
    lease = queue.lease(job)
    frozen = node.freeze()
    try:
        inside = node.ctx(queue, "show", job, "--json")
        assert inside.rc == 0, inside
        holder = inside.json()["holder"]
        assert holder["state"] == "alive" and "stopped" in holder["reason"], holder
        outside = queue.run("show", job, "--json")
        assert outside.rc == 0 and outside.json()["holder"]["state"] == "unknown", outside
        if rfc3339(lease["expires_at"]) - now() > timedelta(seconds=0.4):
            rc, report = other.recover(queue)
            assert rc == 0 and report["requeued"] == [], report
        until_past(lease["expires_at"])
        rc, report = other.recover(queue)
        assert rc == 0 and jobs_in(report, "requeued") == [job], report
    finally:
        node.thaw(frozen)
    before = snapshot(queue.dir)
    go.touch()
    assert wait_for(rcs.exists, WAIT)
    assert rcs.read_text().split() == ["1", "1"], rcs.read_text()
    for step in ("renew", "finish"):
        said = (box / f"{step}.err").read_text()
        assert "pending" in said and "ENOENT" in said, (step, said)
    assert snapshot(queue.dir) == before
    assert queue.state(job) == "pending"


# ============================================================== clocks

CLOCKS = [
    pytest.param(3600, 3600 + 60, "claimed", id="remote-clock-an-hour-ahead"),
    pytest.param(-3600, -3600 + 300, "pending", id="remote-clock-an-hour-behind"),
    pytest.param(-70, -10, "pending", id="clocks-agree-lease-over"),
]


@pytest.mark.parametrize(("claimed", "expires", "expected"), CLOCKS)
def test_a_remote_lease_is_judged_by_its_expires_at_on_this_hosts_clock(
    queue, child, claimed, expires, expected
):
    """Q-5, N-1 (multi-host.md: another host's holder is gone only once ``expires_at`` has
    passed; "Clocks must agree to well within that lifetime"): a lease node-far wrote with its
    own clock is judged by its ``expires_at`` against this host's clock alone: one written an
    hour ahead is left alone, one an hour behind is requeued at once, whatever its
    ``claimed_at``."""
    job = claimed_by(queue, child, "--ttl", "120")
    remote_lease(queue, job, claimed_at=stamp(now() + timedelta(seconds=claimed)),
                 expires_at=stamp(now() + timedelta(seconds=expires)))  # fmt: skip
    rc, report = recover_here(queue)
    assert rc == 0 and queue.state(job) == expected, report
    key = "requeued" if expected == "pending" else "untouched"
    assert jobs_in(report, key) == [job], report


@pytest.mark.parametrize(
    "written",
    [
        pytest.param(lambda t: t.astimezone(INDIA).isoformat(), id="offset-plus-0530"),
        pytest.param(lambda t: t.astimezone(UTC).replace(tzinfo=None).isoformat(), id="no-zone"),
    ],
)  # fmt: skip
def test_a_remote_lease_written_in_another_time_zone_names_the_same_instant(queue, child, written):
    """Q-3, Q-5, N-1 (multi-host.md: hosts' clocks must agree, which says nothing of their
    time zones; queue.md: lease times are "RFC 3339 with or without a zone (none means
    UTC)"): node-far writes ``expires_at`` ten seconds ago in its
    own notation, and recover requeues J; a minute ahead in the same notation, J is left
    alone."""
    job = claimed_by(queue, child, "--ttl", "120")
    remote_lease(queue, job, expires_at=written(now() + timedelta(seconds=60)))
    rc, report = recover_here(queue)
    assert rc == 0 and jobs_in(report, "untouched") == [job], report
    remote_lease(queue, job, expires_at=written(now() - timedelta(seconds=10)))
    rc, report = recover_here(queue)
    assert rc == 0 and jobs_in(report, "requeued") == [job], report


def test_a_lease_another_hosts_tool_wrote_in_its_own_spelling_is_judged_not_refused(
    queue, hosts, box
):
    """Q-3, Q-5, N-1 (queue.md: "a lease is read as Q-3 defines it, so that one written by
    another tool or by hand is judged rather than taken for unreadable": ``job`` may be
    absent, the start time may be ``start_time``, ``pid_ns`` may be ``pid:[N]``): node-t's
    lease rewritten so, with fields of its own besides, is judged by the rules: recover on
    node-t keeps it while its holder lives and requeues it once the holder has exited, and
    nowhere is it called a conflict."""
    node = hosts("node-t")
    job = queue.publish(name="spelled")
    got, pid = node.claim(queue, box, "--ttl", "120")
    assert got == job
    lease = queue.lease(job)
    spelled = {k: v for k, v in lease.items() if k not in ("job", "create_time")}
    spelled.update(start_time=lease["create_time"], pid_ns=f"pid:[{lease['pid_ns']}]",
                   agent_version="9.9", labels={"rack": "r7"})  # fmt: skip
    queue.write_lease(job, spelled)
    status = queue.run("status", "--json")
    assert status.rc == 0 and status.json()["conflicts"] == [], status
    rc, report = node.recover(queue, "--reconcile")
    assert rc == 0 and jobs_in(report, "untouched") == [job], report
    assert "alive" in report["untouched"][0]["detail"], report
    assert node.sh(f"kill {pid}").rc == 0
    assert wait_for(lambda: node.sh(f"kill -0 {pid} 2>/dev/null").rc != 0, WAIT)
    rc, report = node.recover(queue)
    assert rc == 0 and jobs_in(report, "requeued") == [job], report
    assert queue.state(job) == "pending"


# ============================================================== recover from another host


def test_grace_decides_only_a_dead_remote_publishers_temp_not_a_lease(queue, hosts, child):
    """Q-6, N-1 (queue.md: a publisher that died leaves ``inbox/J.publish.tmp`` "until
    ``recover --reconcile`` removes it after the grace period"): from node-b, plain recover
    lists a 30 s old staging file but keeps it; ``--reconcile --grace 3600`` keeps it;
    ``--reconcile --grace 0 --dry-run`` keeps it; ``--reconcile --grace 10`` removes it and
    lists it as removed; a valid remote lease beside it is never touched by any of them; J can
    be published afterwards."""
    held = claimed_by(queue, child, "--ttl", "120")
    remote_lease(queue, held)
    temp = queue.dir / "inbox" / "dead.req.json.publish.tmp"
    temp.write_text('{"tool": "fs.read", "input": {}}')
    age(temp, 30)
    node = hosts("node-b")
    for args in ((), ("--reconcile", "--grace", "3600"), ("--reconcile", "--grace", "0",
                                                           "--dry-run")):  # fmt: skip
        rc, report = node.recover(queue, *args)
        assert rc == 0 and temp.exists(), (args, report)
        assert report["removed_temps"] == [], (args, report)
        assert jobs_in(report, "untouched") == [held], report
    rc, report = node.recover(queue, "--reconcile", "--grace", "10")
    assert rc == 0 and not temp.exists(), report
    assert any("dead.req.json.publish.tmp" in json.dumps(t) for t in report["removed_temps"])
    assert jobs_in(report, "untouched") == [held] and queue.state(held) == "claimed"
    again = node.ctx(queue, "publish", "--name", "dead", "-", input='{"tool": "t", "input": {}}')
    assert again.rc == 0 and again.out.strip() == "dead.req.json", again


def test_two_hosts_recovering_the_same_expired_jobs_at_once_requeue_each_once(
    queue, hosts, child, box
):
    """Q-5, I-5, N-1 (multi-host.md: every move is no-replace; queue.md: two recovers at once
    each handle a job or find it handled): eight jobs of a vanished host with expired leases,
    recovered by node-a and node-b at the same moment: each job is requeued by exactly one of
    them, both exit 0, and every job is pending once with nothing left claimed or leased."""
    jobs = []
    for _ in range(8):
        jobs.append(claimed_by(queue, child, "--ttl", "120"))
        remote_lease(queue, jobs[-1], expires_at=stamp(now() - timedelta(seconds=5)))
    go = box / "go"
    nodes = {name: hosts(name) for name in ("node-a", "node-b")}
    for name, node in nodes.items():
        out = box / name
        node.spawn(f"while [ ! -e {q(go)} ]; do sleep 0.005; done; "
                   f"{queue_line(queue, 'recover', '--json')} > {q(out)}.tmp; echo $? > "
                   f"{q(out)}.rc; mv {q(out)}.tmp {q(out)}")  # fmt: skip
    go.touch()
    reports = {}
    for name in nodes:
        assert wait_for((box / name).exists, WAIT), name
        assert (box / f"{name}.rc").read_text().strip() == "0", name
        reports[name] = json.loads((box / name).read_text())
    requeued = jobs_in(reports["node-a"], "requeued") + jobs_in(reports["node-b"], "requeued")
    assert sorted(requeued) == sorted(jobs), reports
    assert queue.entries("pending") == set(jobs)
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()
    for job in jobs:
        assert queue.state(job) == "pending"


def test_recover_dry_run_on_another_host_predicts_what_reconcile_there_does(queue, hosts, child):
    """Q-5, Q-6, N-1 (queue.md: "``--dry-run`` changes nothing and reports what it would
    do"): seen from node-b, a queue holding a remote job whose lease expired, a remote job whose
    lease runs, a job held by a live process of this host (another pid namespace from there),
    an empty ``claimed/J`` and a dead publisher's old temp: ``--reconcile --dry-run --grace 0``
    plans exactly the requeue, the repair and the temp removal that ``--reconcile --grace 0``
    then applies, and leaves the same jobs untouched."""
    expired = claimed_by(queue, child, "--ttl", "120")
    remote_lease(queue, expired, expires_at=stamp(now() - timedelta(seconds=3)))
    running = claimed_by(queue, child, "--ttl", "120")
    remote_lease(queue, running)
    local = claimed_by(queue, child, "--ttl", "120")
    empty = queue.publish(name="empty")
    (queue.dir / "claimed" / empty).mkdir()
    temp = queue.dir / "inbox" / "gone.req.json.publish.tmp"
    temp.write_text("{")
    age(temp, 5)
    node = hosts("node-b")
    before = snapshot(queue.dir)
    rc, plan = node.recover(queue, "--reconcile", "--dry-run", "--grace", "0")
    assert rc == 1 and plan["dry_run"] is True, plan  # a planned repair leaves J incomplete
    assert snapshot(queue.dir) == before
    assert jobs_in(plan, "requeued") == [expired] and jobs_in(plan, "repaired") == [empty]
    assert jobs_in(plan, "untouched") == sorted([running, local]), plan
    assert all(e["applied"] is False for e in plan["requeued"] + plan["repaired"]), plan
    assert "gone.req.json.publish.tmp" in json.dumps(plan["stale_temps"]), plan
    rc, done = node.recover(queue, "--reconcile", "--grace", "0")
    assert rc == 0 and done["consistent"] is True, done
    for key in ("requeued", "repaired", "untouched"):
        assert jobs_in(done, key) == jobs_in(plan, key), (key, plan, done)
    assert all(e["applied"] is True for e in done["requeued"] + done["repaired"]), done
    assert "gone.req.json.publish.tmp" in json.dumps(done["removed_temps"]) and not temp.exists()
    assert queue.state(expired) == "pending" and queue.state(empty) == "pending"
    assert queue.state(running) == "claimed" and queue.state(local) == "claimed"


def test_a_host_without_a_proc_of_its_own_keeps_a_live_holder_and_requeues_a_dead_one(queue, box):
    """Q-5 (queue.md: "In a pid namespace entered without a /proc of its own (``unshare
    --pid`` without ``--mount-proc``) ... a claim records no start time, and a holder of the
    namespace whose pid the kernel still knows is kept as ``unknown``"): on such a "host" a
    claim's lease has ``create_time`` null; recover there leaves the job of a live holder
    alone and requeues that of a holder that has exited."""
    first = queue.publish(name="np-a")
    second = queue.publish(name="np-b")
    s = q(box)
    script = (
        "hostname node-np || exit 99\n"
        f"sh -c '{queue_line(queue, 'claim', '--ttl', '120')} > {s}/first'\n"
        f"{queue_line(queue, 'recover', '--json')} > {s}/r1\n"
        f"sh -c '{queue_line(queue, 'claim', '--ttl', '120')} > {s}/second; exec sleep 30' &\n"
        f"while [ ! -s {s}/second ]; do sleep 0.02; done\n"
        f"{queue_line(queue, 'recover', '--json')} > {s}/r2\n"
        "kill $!\n"
    )
    done = subprocess.run(["unshare", "--uts", "--pid", "--fork", "sh", "-c", script],
                          capture_output=True, text=True, timeout=120,
                          env=clean_env(CTX_STORAGE=str(queue.storage)))  # fmt: skip
    assert done.returncode == 0, done
    assert (box / "first").read_text().strip() == first
    assert jobs_in(json.loads((box / "r1").read_text()), "requeued") == [first]
    again = (box / "second").read_text().strip()  # a requeued job comes first in line
    assert again == first, again
    r2 = json.loads((box / "r2").read_text())
    assert jobs_in(r2, "untouched") == [first] and r2["requeued"] == [], r2
    assert "unknown" in r2["untouched"][0]["detail"], r2
    lease = queue.lease(first)
    assert lease["host"] == "node-np" and lease["create_time"] is None, lease
    assert queue.state(first) == "claimed" and queue.state(second) == "pending"


# ============================================================== NFS refusals, made by strace

needs_inject = pytest.mark.skipif(not can_inject(), reason="strace cannot inject faults here")


def traced(queue: QueueCLI, inject: str, command: str, *args: str, input: str = "",
           log: Path | None = None) -> Run:  # fmt: skip
    """``ctx queue COMMAND --project P ARGS`` under ``strace -e inject=INJECT`` (every call of
    that system call refused as the injection says), its calls logged to ``log``."""
    call = inject.split(":", 1)[0]
    argv = ["strace", "-f", "-qq", "-o", str(log or "/dev/null"), "-e",
            f"trace={call},linkat,renameat2", "-e", f"inject={inject}", *CTX_ARGV, "queue",
            command, "--project", queue.project, *args]  # fmt: skip
    done = subprocess.run(argv, input=input.encode(), capture_output=True, timeout=120,
                          env=clean_env(CTX_STORAGE=str(queue.storage)))  # fmt: skip
    return Run([command, *args], done.returncode, done.stdout.decode(), done.stderr.decode())


@needs_inject
@pytest.mark.parametrize("refusal", ["EBADF", "ENOLCK"])
def test_flock_refused_as_over_nfs_every_step_proceeds_on_the_liveness_rules(queue, child, refusal):
    """N-1 (multi-host.md, *flock*: "Over NFS, ``flock`` is emulated with byte-range locks and
    may be refused on a directory; the queue then proceeds without the lock and relies on the
    liveness rules alone"): with every ``flock`` refused (EBADF: a write lock on a directory
    opened read-only, as NFS answers; ENOLCK), publish, claim, finish, a recover that requeues
    an expired remote lease and a reconcile that removes an empty ``claimed/J`` all succeed."""
    inject = f"flock:error={refusal}"
    req = '{"tool": "fs.read", "input": {}}'
    published = traced(queue, inject, "publish", "--name", "nolock", "-", input=req)
    assert published.rc == 0 and published.out.strip() == "nolock.req.json", published
    job = published.out.strip()
    claimed = traced(queue, inject, "claim", "--pid", str(child.pid), "--ttl", "60")
    assert claimed.rc == 0 and claimed.out.strip() == job, claimed
    finished = traced(queue, inject, "finish", job, "--ok", "-", input="{}")
    assert finished.rc == 0 and queue.state(job) == "done", finished
    expired = claimed_by(queue, child, "--ttl", "60")
    remote_lease(queue, expired, expires_at=stamp(now() - timedelta(seconds=3)))
    empty = queue.publish(name="empty")
    (queue.dir / "claimed" / empty).mkdir()
    # Without a lock, a fresh empty claimed/J may be a claim at work: left alone until it is
    # older than a lease lifetime (docs/multi-host.md), as this crash's leftover is.
    fresh = traced(queue, inject, "recover", "--reconcile", "--json")
    assert fresh.rc == 0 and jobs_in(fresh.json(), "repaired") == [], fresh
    assert jobs_in(fresh.json(), "requeued") == [expired], fresh
    assert (queue.dir / "claimed" / empty).is_dir()
    age(queue.dir / "claimed" / empty, 3600)
    r = traced(queue, inject, "recover", "--reconcile", "--json")
    assert r.rc == 0, r
    report = r.json()
    assert jobs_in(report, "requeued") == [] and jobs_in(report, "repaired") == [empty]
    assert queue.state(expired) == "pending" and queue.state(empty) == "pending"
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()


@needs_inject
def test_renameat2_refused_as_on_nfs_every_move_falls_back_to_link(queue, child, box):
    """N-1 (multi-host.md: "On NFS, ``renameat2`` with ``RENAME_NOREPLACE`` is refused
    (``EINVAL``)" and names are moved "with ``link``, fsync of the destination directory, then
    ``unlink``"; queue.md: where ``renameat2`` is refused "moves degrade to link and unlink"):
    with every ``renameat2`` refused EINVAL, publish, claim and finish each move their names by
    ``linkat`` and succeed; the job ends as one done pair with one link per file and nothing
    left in ``inbox/``, ``pending/``, ``claimed/`` or ``lease/``."""
    inject = "renameat2:error=EINVAL"
    logs = {step: box / f"{step}.log" for step in ("publish", "claim", "finish")}
    published = traced(queue, inject, "publish", "-", input='{"tool": "fs.read", "input": {}}',
                       log=logs["publish"])  # fmt: skip
    assert published.rc == 0, published
    job = published.out.strip()
    claimed = traced(queue, inject, "claim", "--pid", str(child.pid), log=logs["claim"])
    assert claimed.rc == 0 and claimed.out.strip() == job, claimed
    finished = traced(queue, inject, "finish", job, "--ok", "-", input="{}", log=logs["finish"])
    assert finished.rc == 0, finished
    for step, log in logs.items():
        calls = [line for line in log.read_text().splitlines() if job in line]
        assert any("linkat(" in line and "= 0" in line for line in calls), (step, calls)
        assert not [c for c in calls if "renameat2(" in c and "INJECTED" not in c], (step, calls)
    assert queue.state(job) == "done"
    for name in (job, f"{job}.result"):
        assert os.stat(queue.dir / "done" / name).st_nlink == 1, name
    for sub in ("inbox", "pending", "claimed", "lease"):
        assert queue.entries(sub) == set(), sub


@needs_inject
def test_a_remote_reconcile_racing_a_claim_that_has_no_flock_loses_no_job(queue, hosts, child):
    """Q-2, Q-6, N-1 (multi-host.md: where ``flock`` is refused the queue "relies on the
    liveness rules alone", and ``recover --reconcile`` removes an empty ``claimed/J``; queue.md
    claim step 3: "if ``recover`` removed the empty directory before we locked it, we lost"):
    a claim whose ``flock`` is refused is held just after its ``mkdir claimed/J``; node-b's
    reconcile removes that empty directory; J is then
    either claimed whole by that claim (exit 0, after it lost its first directory) or pending
    with no claim or lease left (exit 3), claimable next."""
    job = queue.publish(name="raced")
    argv = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=flock,mkdirat", "-e",
            "inject=flock:error=EBADF", "-e", "inject=mkdirat:delay_exit=1500000", *CTX_ARGV,
            "queue", "claim", "--project", queue.project, "--pid", str(child.pid)]  # fmt: skip
    node = hosts("node-b")
    claim = subprocess.Popen(argv, env=clean_env(CTX_STORAGE=str(queue.storage)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert wait_for((queue.dir / "claimed" / job).exists, WAIT), claim.poll()
        rc, report = node.recover(queue, "--reconcile")
        assert rc == 0 and jobs_in(report, "repaired") == [job], report
        out, err = claim.communicate(timeout=WAIT)
    finally:
        if claim.poll() is None:
            claim.kill()
            claim.communicate()
    assert queue.entries("inbox") == set()
    if claim.returncode == 0:  # it lost J, then took J again once free: one whole claim
        assert out.strip() == job, (out, err)
        assert queue.state(job) == "claimed" and queue.entries("pending") == set()
        assert queue.lease(job)["pid"] == child.pid
        assert os.listdir(queue.dir / "claimed" / job) == [job]
        return
    assert claim.returncode == 3 and out == "", (out, err)
    assert queue.entries("pending") == {job}
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()
    assert queue.claim("--pid", str(child.pid)) == job


@needs_inject
def test_a_remote_reconcile_between_a_claims_move_and_its_lease_never_leaves_a_false_claim(
    queue, hosts, child
):
    """Q-3, I-4, N-1 (multi-host.md, *flock*: where ``flock`` is refused "the queue then
    proceeds without the lock and relies on the liveness rules alone"; queue.md claim step 3:
    the lock is there "so recover never mistakes the claim in progress for a crash leftover"):
    a claim with ``flock`` refused is held after moving J into ``claimed/J/`` and before making
    ``lease/J``; node-b's reconcile takes it for a claim that never ran and returns J to
    pending.  The claim must then not hand J out: either it says it claimed nothing and J is
    pending with no lease left, or J is claimed whole (request and lease) by it."""
    job = queue.publish(name="midway")
    argv = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=flock,mkdirat", "-e",
            "inject=flock:error=EBADF", "-e", "inject=mkdirat:delay_enter=2000000:when=2+",
            *CTX_ARGV, "queue", "claim", "--project", queue.project, "--pid",
            str(child.pid)]  # fmt: skip
    node = hosts("node-b")
    claim = subprocess.Popen(argv, env=clean_env(CTX_STORAGE=str(queue.storage)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert wait_for((queue.dir / "claimed" / job / job).exists, WAIT), claim.poll()
        assert not (queue.dir / "lease" / job).exists()
        rc, report = node.recover(queue, "--reconcile")
        assert rc == 0 and jobs_in(report, "repaired") == [job], report
        out, err = claim.communicate(timeout=WAIT)
    finally:
        if claim.poll() is None:
            claim.kill()
            claim.communicate()
    if claim.returncode == 0 and out.strip() == job:
        assert queue.state(job) == "claimed", (err, queue.entries("pending"))
        assert queue.lease(job)["pid"] == child.pid
    else:
        assert claim.returncode != 0 and out == "", (out, err)
        assert queue.entries("pending") == {job}
        assert queue.entries("claimed") == set() and queue.entries("lease") == set()
