"""Workers and ``ctx queue recover`` at the same time (SPEC §2 Q-5, Q-6, I-1, I-3, I-4, I-5,
and §3 W-1, W-3): real ``ctx queue work`` processes with different ``--ttl`` and
``--concurrency`` drain a real queue while ``recover``, ``recover --reconcile``,
``recover --dry-run`` and ``--grace`` run again and again beside them.  Workers are killed with
SIGKILL (or stopped with SIGSTOP) at moments picked by watching the queue's directories: while
their tools run, between a claim and its lease, between a result and its request's move; and
restarted.  What is checked:

* every published job finishes exactly once, in ``done/`` or ``failed/`` with its result, and
  the final ``status`` counts add up to the jobs published;
* a job runs a second time only when its first holder was killed before its result landed;
* ``recover`` in any mode never requeues or repairs the job of a live holder (running,
  renewing a short lease, or stopped with a valid lease), and requeues each dead holder's job
  once, however many recovers run at once;
* the exit status of ``recover`` is 0 exactly when its report calls the queue consistent, and
  plain ``recover`` (and a ``--dry-run``) exits 1 on an incomplete pair it leaves, which
  ``--reconcile`` completes (Q-6).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    alive,
    clean_env,
    kill_processes_of,
    snapshot,
    wait_for,
)
from tests.acceptance.workercli import AGENT, shell_job
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid than the workers: needs root"
)

TRACEBACK = "Traceback (most recent call last)"
# Every way of running recover the tests cycle through beside live workers.
MODES: tuple[tuple[str, ...], ...] = (
    (),
    ("--reconcile",),
    ("--dry-run",),
    ("--dry-run", "--reconcile"),
    ("--grace", "0"),
    ("--reconcile", "--grace", "30"),
)

# ------------------------------------------------------------------------------ helpers


def job_cmd(tag: str, out: Path, nap: float = 0.05, *, fail: bool = False, hold: bool = False):
    """A ``shell.exec`` command that notes its run (``runs``: tag and pid), naps (held while
    ``out/hold`` exists, when ``hold``), notes its end and answers ``{"tag": TAG}``."""
    gate = ""
    if hold:
        gate = f"n=0; while [ -e {out}/hold ] && [ $n -lt 400 ]; do sleep 0.05; n=$((n+1)); done; "
    cmd = (
        f"echo {tag} $$ >> {out}/runs; {gate}sleep {nap}; echo {tag} >> {out}/ends; "
        f'echo \'{{"tag": "{tag}"}}\''
    )
    return cmd + ("; exit 3" if fail else "")


def publish(queue: QueueCLI, commands: dict[str, str]) -> dict[str, str]:
    """Publish one ``shell.exec`` job per tag in one batch; tag -> job name."""
    lines = "".join(json.dumps(shell_job(cmd, tag=tag)) + "\n" for tag, cmd in commands.items())
    r = queue.run("publish", "--batch", "-", input=lines)
    assert r.rc == 0, r
    names = r.lines()
    assert len(names) == len(commands), r
    return dict(zip(commands, names, strict=True))


def runs(out: Path) -> Counter:
    """How many times each tag's tool started."""
    path = out / "runs"
    if not path.exists():
        return Counter()
    return Counter(line.split()[0] for line in path.read_text().split("\n")[:-1] if line)


def run_pids(out: Path) -> list[int]:
    path = out / "runs"
    if not path.exists():
        return []
    return [int(line.split()[1]) for line in path.read_text().split("\n")[:-1] if line]


def lease_pid(queue: QueueCLI, job: str) -> int | None:
    try:
        return int(json.loads((queue.dir / "lease" / job / "worker").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


class Fleet:
    """The workers of one test, each writing its JSON lines and stderr to files."""

    def __init__(self, queue: QueueCLI, logs: Path) -> None:
        self.queue, self.logs = queue, logs
        self.procs: dict[str, subprocess.Popen] = {}
        self.killed: set[int] = set()

    def start(self, wid: str, ttl: float, concurrency: int, *extra: str) -> subprocess.Popen:
        argv = [*CTX_ARGV, "queue", "work", "--project", self.queue.project, "--agent", AGENT]
        argv += ["--ttl", str(ttl), "--concurrency", str(concurrency), "--json"]
        argv += ["--worker", wid, "--session", wid, *extra]
        env = clean_env(CTX_STORAGE=str(self.queue.storage))
        with open(self.logs / f"{wid}.out", "w") as o, open(self.logs / f"{wid}.err", "w") as e:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=o, stderr=e)
        self.procs[wid] = proc
        return proc

    def kill(self, wid: str) -> None:
        proc = self.procs[wid]
        self.killed.add(proc.pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=20)

    def live(self) -> list[subprocess.Popen]:
        return [p for p in self.procs.values() if p.poll() is None]

    def wait_all(self, seconds: float = 30) -> None:
        assert wait_for(lambda: not self.live(), seconds), self.said()

    def events(self, wid: str) -> list[dict]:
        lines = (self.logs / f"{wid}.out").read_text().splitlines()
        return [json.loads(x) for x in lines if x.strip().endswith("}")]

    def summary(self, wid: str) -> dict:
        stops = [e for e in self.events(wid) if e.get("event") == "stop"]
        assert len(stops) == 1, (wid, self.said())
        return stops[0]

    def err(self, wid: str) -> str:
        return (self.logs / f"{wid}.err").read_text()

    def said(self) -> str:
        return "\n".join(
            f"{wid}: rc={p.poll()} {(self.logs / f'{wid}.out').read_text()[-800:]}"
            f" {self.err(wid)[-800:]}"
            for wid, p in self.procs.items()
        )

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
                    proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=20)


@pytest.fixture
def outbox_dir(outbox: Path) -> Path:
    """Where the tools (run as the agent's uid) note their runs."""
    return outbox


@pytest.fixture
def fleet(storage: Path, agent: str, outbox_dir: Path, tmp_path: Path) -> Iterator[Fleet]:
    logs = tmp_path / "logs"
    logs.mkdir()
    crew = Fleet(QueueCLI(storage, "proj"), logs)
    try:
        yield crew
    finally:
        crew.stop_all()
        kill_processes_of(outbox_dir)  # a tool a killed worker's guard failed to end


def recover(queue: QueueCLI, *args: str) -> tuple[int, dict]:
    """``ctx queue recover --json ARGS``: its exit status and report, which must agree (Q-6:
    0 exactly when the queue is consistent after the run)."""
    r = queue.run("recover", "--json", *args)
    assert TRACEBACK not in r.err, r
    report = r.json()
    assert r.rc == (0 if report["consistent"] else 1), r
    assert report["conflicts"] == [] and report["errors"] == [], r
    return r.rc, report


def start_recover(queue: QueueCLI, logs: Path, n: int, *args: str) -> subprocess.Popen:
    argv = [*CTX_ARGV, "queue", "recover", "--project", queue.project, "--json", *args]
    env = clean_env(CTX_STORAGE=str(queue.storage))
    with open(logs / f"recover{n}.out", "w") as o, open(logs / f"recover{n}.err", "w") as e:
        return subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=o, stderr=e)


def finished_recover(proc: subprocess.Popen, logs: Path, n: int) -> dict:
    proc.wait(timeout=60)
    err = (logs / f"recover{n}.err").read_text()
    assert TRACEBACK not in err, err
    report = json.loads((logs / f"recover{n}.out").read_text())
    assert proc.returncode == (0 if report["consistent"] else 1), (proc.returncode, report)
    return report


PID = re.compile(r"pid (\d+)")


def only_dead_requeued(report: dict, killed: set[int]) -> list[str]:
    """The jobs the report requeued; each one's holder must be one the test killed."""
    jobs = []
    for entry in report["requeued"]:
        assert entry["detail"].startswith("lease holder gone"), entry
        pid = int(PID.search(entry["detail"]).group(1))
        assert pid in killed, (entry, killed)
        jobs.append(entry["job"])
    return jobs


def transient_only(report: dict) -> None:
    """What a recover beside live workers may find: nothing requeued or repaired but the
    removal of a claim directory a claimer has not locked yet (Q-6's empty ``claimed/J``),
    and, in a dry run, which takes no lock (docs/queue.md), a claim caught before its lease or
    a finish caught between its result and its request's move, planned and never applied."""
    assert report["requeued"] == [], report
    allowed = {"remove-orphans"}
    if report["dry_run"]:
        allowed |= {"requeue-unleased", "roll-forward"}
        assert not any(e["applied"] for e in report["repaired"]), report
    for entry in report["repaired"] + report["incomplete"]:
        assert entry["action"] in allowed, report


def wait_moment(proc: subprocess.Popen, predicate, seconds: float = 20) -> bool:
    """Poll the queue until ``predicate()`` holds, then freeze ``proc`` (SIGSTOP) and ask
    again: True with ``proc`` stopped while it still holds, else keep polling (continuing
    ``proc``) until ``proc`` ends or the deadline passes."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        if predicate():
            proc.send_signal(signal.SIGSTOP)
            if predicate():
                return True
            proc.send_signal(signal.SIGCONT)
    return False


def status_counts(queue: QueueCLI) -> dict:
    r = queue.run("status", "--json")
    assert r.rc == 0, r
    return r.json()


def assert_books(queue: QueueCLI, names: dict[str, str], failing: set[str]) -> None:
    """Every job in one terminal state with its result, the right one; the counts add up."""
    for tag, job in names.items():
        state, result = queue.only_result(job)
        assert state == ("failed" if tag in failing else "done"), (tag, state, result)
        output = result["output"]
        if tag not in failing:
            assert output == {"tag": tag}, (tag, result)
    counts = status_counts(queue)
    assert counts["done"] == len(names) - len(failing), counts
    assert counts["failed"] == len(failing), counts
    assert counts["pending"] == counts["claimed"] == counts["conflict"] == 0, counts
    assert sum(counts[k] for k in ("pending", "claimed", "done", "failed")) == len(names)
    queue.assert_settled()


# ------------------------------------------------------------------------------ the flows


def test_every_recover_mode_beside_three_workers_of_different_leases(
    fleet: Fleet, outbox_dir: Path, tmp_path: Path
) -> None:
    queue = fleet.queue
    failing = {f"f{i}" for i in range(4)}
    commands = {f"j{i}": job_cmd(f"j{i}", outbox_dir, 0.1 + 0.05 * (i % 4)) for i in range(20)}
    commands.update({t: job_cmd(t, outbox_dir, 0.1, fail=True) for t in sorted(failing)})
    names = publish(queue, commands)
    fleet.start("short", 1.5, 2, "--drain")
    fleet.start("mid", 4, 1, "--drain")
    fleet.start("long", 60, 2, "--drain")
    reports = 0
    while fleet.live() or reports < len(MODES):
        _, report = recover(queue, *MODES[reports % len(MODES)])
        transient_only(report)
        reports += 1
    fleet.wait_all()
    for wid in fleet.procs:
        assert fleet.procs[wid].returncode == 0, fleet.said()
        assert TRACEBACK not in fleet.err(wid)
    summaries = [fleet.summary(w) for w in fleet.procs]
    assert sum(s["done"] for s in summaries) == len(names) - len(failing), summaries
    assert sum(s["failed"] for s in summaries) == len(failing), summaries
    assert sum(s["lost"] for s in summaries) == 0, summaries
    assert runs(outbox_dir) == Counter(dict.fromkeys(names, 1))
    assert_books(queue, names, failing)


def test_sigkill_of_one_worker_mid_run_requeues_only_its_jobs(
    fleet: Fleet, outbox_dir: Path, tmp_path: Path
) -> None:
    queue = fleet.queue
    (outbox_dir / "hold").touch()
    commands = {f"h{i}": job_cmd(f"h{i}", outbox_dir, hold=True) for i in range(3)}
    commands.update({f"q{i}": job_cmd(f"q{i}", outbox_dir) for i in range(5)})
    names = publish(queue, commands)
    fleet.start("wa", 30, 2, "--drain")
    fleet.start("wb", 2, 1, "--drain")
    # The moment: three holds running, two of them under wa, one under wb.
    assert wait_for(lambda: len(runs(outbox_dir)) == 3 and len(queue.entries("lease")) == 3)
    wa, wb = fleet.procs["wa"].pid, fleet.procs["wb"].pid
    holders = {job: lease_pid(queue, job) for job in queue.entries("lease")}
    mine = {job for job, pid in holders.items() if pid == wa}
    theirs = {job for job, pid in holders.items() if pid == wb}
    assert len(mine) == 2 and len(theirs) == 1, holders
    tools = run_pids(outbox_dir)
    fleet.kill("wa")
    # docs/workers.md: the orphan guard ends the killed worker's tools.
    assert wait_for(lambda: sum(alive(p) for p in tools) == 1), tools

    def still() -> dict:  # the queue but wb's renewing lease and the staging directory
        (job,) = theirs
        return {
            k: v
            for k, v in snapshot(queue.dir).items()
            if not k.startswith(("inbox/", f"lease/{job}"))
        }

    before = still()
    rc, dry = recover(queue, "--dry-run", "--reconcile")
    assert rc == 0 and still() == before, dry
    assert {e["job"] for e in dry["requeued"]} == mine, dry
    assert not any(e["applied"] for e in dry["requeued"]), dry
    assert {e["job"] for e in dry["untouched"]} == theirs, dry

    # Four recovers at once beside wb: each dead holder's job is requeued by exactly one.
    modes = [(), ("--reconcile",), ("--grace", "0"), ("--reconcile", "--grace", "0")]
    procs = [start_recover(queue, tmp_path / "logs", n, *m) for n, m in enumerate(modes)]
    requeued: list[str] = []
    for n, proc in enumerate(procs):
        report = finished_recover(proc, tmp_path / "logs", n)
        requeued += only_dead_requeued(report, fleet.killed)
        assert report["repaired"] == [], report
        assert not {e["job"] for e in report["requeued"]} & theirs, report
    assert sorted(requeued) == sorted(mine)
    assert {queue.state(j) for j in mine} <= {"pending", "claimed"}
    rc, again = recover(queue)
    assert rc == 0 and again["requeued"] == [], again  # I-5

    (outbox_dir / "hold").unlink()
    fleet.start("wc", 5, 2, "--drain")
    while fleet.live():
        _, report = recover(queue, "--reconcile")
        only_dead_requeued(report, fleet.killed)
        transient_only(report)
    for wid in ("wb", "wc"):
        assert fleet.procs[wid].returncode == 0, fleet.said()
    tags = {job: tag for tag, job in names.items()}
    twice = {tags[j] for j in mine}
    assert runs(outbox_dir) == Counter({t: 2 if t in twice else 1 for t in names})
    done = fleet.summary("wb")["done"] + fleet.summary("wc")["done"]
    assert done == len(names), fleet.said()
    assert_books(queue, names, set())


def test_sigkill_between_claim_and_lease(fleet: Fleet, outbox_dir: Path) -> None:
    queue = fleet.queue
    names = publish(queue, {f"c{i}": job_cmd(f"c{i}", outbox_dir) for i in range(8)})
    proc = fleet.start("w1", 30, 1, "--drain")
    caught: list[str] = []

    def claimed_without_lease() -> bool:
        for name in os.listdir(queue.dir / "inbox"):
            if ".lease." in name:
                job = name.split(".lease.")[0]
                if (queue.dir / "claimed" / job / job).is_file() and not (
                    queue.dir / "lease" / job / "worker"
                ).exists():
                    caught[:] = [job]
                    return True
        return False

    assert wait_moment(proc, claimed_without_lease), fleet.said()
    fleet.kill("w1")
    job = caught[0]
    tag = {j: t for t, j in names.items()}[job]
    assert tag not in runs(outbox_dir)  # never started before its lease

    before = snapshot(queue.dir)
    for args in ((), ("--dry-run",), ("--dry-run", "--reconcile")):
        rc, report = recover(queue, *args)
        assert rc == 1, report  # an incomplete pair left
        assert [e["job"] for e in report["incomplete"] + report["repaired"]] == [job], report
        assert snapshot(queue.dir) == before, args
    rc, report = recover(queue, "--reconcile")
    assert rc == 0 and report["requeued"] + report["repaired"] != [], report
    assert queue.state(job) == "pending"
    rc, report = recover(queue, "--reconcile", "--grace", "0")
    assert rc == 0 and queue.entries("inbox") == set(), report
    fleet.start("w2", 3, 2, "--drain")
    fleet.wait_all()
    assert fleet.procs["w2"].returncode == 0, fleet.said()
    assert runs(outbox_dir) == Counter(dict.fromkeys(names, 1))
    assert_books(queue, names, set())


def test_sigkill_between_result_and_request_move_rolls_forward_never_reruns(
    fleet: Fleet, outbox_dir: Path, tmp_path: Path
) -> None:
    queue = fleet.queue
    failing = {"r1", "r4"}
    names = publish(
        queue, {f"r{i}": job_cmd(f"r{i}", outbox_dir, fail=f"r{i}" in failing) for i in range(8)}
    )
    proc = fleet.start("w1", 30, 1, "--drain")
    caught: list[tuple[str, str]] = []

    def result_beside_claim() -> bool:
        for state in ("done", "failed"):
            for name in os.listdir(queue.dir / state):
                job = name.removesuffix(".result")
                if name.endswith(".result") and (queue.dir / "claimed" / job / job).is_file():
                    caught[:] = [(job, state)]
                    return True
        return False

    assert wait_moment(proc, result_beside_claim), fleet.said()
    fleet.kill("w1")
    job, state = caught[0]
    recorded = (queue.dir / state / f"{job}.result").read_bytes()

    before = snapshot(queue.dir)
    for args in ((), ("--dry-run", "--reconcile")):
        rc, report = recover(queue, *args)
        assert rc == 1, report
        assert [e["job"] for e in report["incomplete"] + report["repaired"]] == [job], report
        assert report["requeued"] == [], report  # the result proves the job ran
        assert snapshot(queue.dir) == before, args

    # A new worker drains the rest while reconcile runs beside it.
    fleet.start("w2", 2, 2, "--drain")
    rc, report = recover(queue, "--reconcile")
    assert [e["job"] for e in report["repaired"] if e["applied"]] == [job], report
    while fleet.live():
        _, report = recover(queue, "--reconcile")
        transient_only(report)
    assert fleet.procs["w2"].returncode == 0, fleet.said()
    assert (queue.dir / state / f"{job}.result").read_bytes() == recorded
    assert runs(outbox_dir) == Counter(dict.fromkeys(names, 1))  # I-3
    assert_books(queue, names, failing)


def test_live_holders_keep_their_jobs_through_every_recover(fleet: Fleet, outbox_dir: Path) -> None:
    queue = fleet.queue
    (outbox_dir / "hold").touch()
    names = publish(
        queue,
        {"held": job_cmd("held", outbox_dir, hold=True), "long": job_cmd("long", outbox_dir, 3)},
    )
    stopped = fleet.start("stopped", 60, 1, "--drain", "--max-jobs", "1")
    assert wait_for(lambda: runs(outbox_dir) == Counter({"held": 1}))
    fleet.start("renewing", 1.5, 1, "--drain")
    assert wait_for(lambda: runs(outbox_dir) == Counter({"held": 1, "long": 1}))
    stopped.send_signal(signal.SIGSTOP)
    seen_stopped = 0
    n = 0
    # Recover in every mode until the short-lease job, renewed by its worker, has finished.
    while not (outbox_dir / "ends").exists() or n < len(MODES):
        _, report = recover(queue, *MODES[n % len(MODES)])
        n += 1
        transient_only(report)
        for entry in report["untouched"]:
            if entry["job"] == names["held"]:
                assert "stopped" in entry["detail"] or "is locked" in entry["detail"], entry
                seen_stopped += "stopped" in entry["detail"]
        if not report["dry_run"]:
            assert queue.state(names["held"]) == "claimed"
    assert seen_stopped >= len(MODES) - 1
    stopped.send_signal(signal.SIGCONT)
    (outbox_dir / "hold").unlink()
    fleet.wait_all()
    for wid in fleet.procs:
        assert fleet.procs[wid].returncode == 0, fleet.said()
        assert fleet.summary(wid)["lost"] == 0
    assert runs(outbox_dir) == Counter({"held": 1, "long": 1})
    assert_books(queue, names, set())


def test_reconcile_leaves_the_result_of_a_live_stopped_holder(
    fleet: Fleet, outbox_dir: Path
) -> None:
    queue = fleet.queue
    names = publish(queue, {f"t{i}": job_cmd(f"t{i}", outbox_dir, 0.2) for i in range(4)})
    proc = fleet.start("w1", 60, 1, "--drain")
    temps: list[str] = []

    def result_temp() -> bool:
        temps[:] = [n for n in os.listdir(queue.dir / "inbox") if ".result." in n]
        return bool(temps)

    assert wait_moment(proc, result_temp), fleet.said()
    job = temps[0].split(".result.")[0]
    assert queue.state(job) == "claimed" and lease_pid(queue, job) == proc.pid
    temp = queue.dir / "inbox" / temps[0]
    assert wait_for(lambda: time.time() - temp.stat().st_mtime > 1.5)
    rc, report = recover(queue, "--reconcile", "--grace", "1")
    assert rc == 0 and [e["job"] for e in report["untouched"]] == [job], report
    proc.send_signal(signal.SIGCONT)
    fleet.wait_all()
    assert proc.returncode == 0, fleet.said()
    assert fleet.summary("w1")["lost"] == 0, fleet.said()
    assert runs(outbox_dir) == Counter(dict.fromkeys(names, 1))
    assert_books(queue, names, set())


def test_reconcile_leaves_the_lease_of_a_claim_in_progress(fleet: Fleet, outbox_dir: Path) -> None:
    queue = fleet.queue
    names = publish(queue, {f"l{i}": job_cmd(f"l{i}", outbox_dir) for i in range(4)})
    proc = fleet.start("w1", 60, 1, "--drain")
    temps: list[str] = []

    def lease_temp() -> bool:
        temps[:] = [n for n in os.listdir(queue.dir / "inbox") if ".lease." in n]
        return bool(temps)

    assert wait_moment(proc, lease_temp), fleet.said()
    temp = queue.dir / "inbox" / temps[0]
    assert wait_for(lambda: time.time() - temp.stat().st_mtime > 1.5)
    rc, report = recover(queue, "--reconcile", "--grace", "1")
    assert rc == 0 and report["requeued"] == [], report
    proc.send_signal(signal.SIGCONT)
    fleet.wait_all()
    assert proc.returncode == 0, fleet.said()
    assert fleet.summary("w1")["done"] == len(names), fleet.said()
    assert runs(outbox_dir) == Counter(dict.fromkeys(names, 1))
    assert_books(queue, names, set())
