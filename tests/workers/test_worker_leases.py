"""The worker and its leases: renewed in time (Q-3), and a lease taken away (Q-5) makes the
job "lost" for this worker, never finished twice or over another holder's claim."""

from __future__ import annotations

import json
import time
from pathlib import Path

from cortexfs.timefmt import parse_rfc3339
from tests.queue.helpers import dead_pid
from tests.workers.conftest import PROJECT, Farm


def lines_of(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_a_worker_keeps_no_lease_shorter_than_a_second(farm: Farm) -> None:
    """Renewed every third of its lifetime, a 0.1 s lease lapses whenever a renewal waits on
    a busy disk, and recover then runs the job a second time: refused before any claim."""
    job = farm.publish("shell.exec", {"cmd": "echo never"})
    (farm.queue / "config").write_text("lease_ttl=0.5\n")

    flag = farm.ctx("queue", "work", "--project", PROJECT, "--drain", "--ttl", "0.1")
    configured = farm.ctx("queue", "work", "--project", PROJECT, "--drain")

    assert flag.returncode == 2 and "not in the range 1.0<=x" in flag.stderr, flag.stderr
    assert configured.returncode == 1 and "at least 1 second" in configured.stderr
    # Where the short lifetime came from, and the two ways to a longer one.
    said = configured.stderr
    assert f"lease_ttl of {farm.queue}/config" in said and "--ttl" in said, said
    assert (farm.queue / "pending" / job).exists()


def test_a_running_job_keeps_its_lease_well_before_expiry(farm: Farm) -> None:
    """A 1 s lease on a 3 s job: the worker renews it, so recover (which takes an expired
    lease as proof that its holder is gone) never finds it expired."""
    started = farm.scratch / "logs" / "started"
    job = farm.publish("shell.exec", {"cmd": f"echo 1 > {started}; sleep 3; echo slow"})
    worker = farm.worker("--drain", "--ttl", "1")
    wait_for(started)
    recovered = []
    while worker.poll() is None:
        done = farm.ctx("queue", "recover", "--project", PROJECT, "--json")
        recovered += json.loads(done.stdout)["requeued"] if done.stdout else []
        lease = farm.queue / "lease" / job / "worker"
        try:
            expires = json.loads(lease.read_text())["expires_at"]
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        left = parse_rfc3339(expires) - time.time()
        assert left > 0, f"the lease of a running job expired {-left:.1f}s ago"
    out, _ = worker.communicate(timeout=60)
    assert recovered == []
    assert worker.returncode == 0
    assert farm.result(job)[0] == "done"
    assert [e["event"] for e in lines_of(out) if e["event"] in ("finish", "lost")] == ["finish"]


def test_a_worker_whose_lease_was_taken_away_reports_the_job_lost(farm: Farm) -> None:
    """Its lease is replaced by one naming a dead holder (as if it had lapsed); recover
    requeues the job and another holder claims it.  The first worker's finish is refused:
    nothing in done/, the new claim intact, one clear "lost" line, no traceback."""
    started = farm.scratch / "logs" / "started"
    job = farm.publish("shell.exec", {"cmd": f"echo 1 > {started}; sleep 2; echo first"})
    worker = farm.worker("--drain")
    wait_for(started)
    lease = farm.queue / "lease" / job / "worker"
    taken = {**json.loads(lease.read_text()), "pid": dead_pid(), "create_time": None}
    lease.write_text(json.dumps(taken))
    recovered = farm.ctx("queue", "recover", "--project", PROJECT)
    assert recovered.returncode == 0 and f"requeue  {job}" in recovered.stdout
    second = farm.ctx("queue", "claim", "--project", PROJECT, "--pid", "999999")
    assert second.stdout.strip() == job

    out, err = worker.communicate(timeout=60)

    assert worker.returncode == 0 and "Traceback" not in err
    events = lines_of(out)
    lost = [e for e in events if e["event"] == "lost"]
    assert len(lost) == 1 and lost[0]["job"] == job and "EACCES" in lost[0]["reason"]
    assert events[-1]["event"] == "stop" and events[-1]["lost"] == 1
    assert events[-1]["done"] == 0
    assert not (farm.queue / "done" / f"{job}.result").exists()
    assert (farm.queue / "claimed" / job / job).exists()
    assert json.loads(lease.read_text())["pid"] == 999999  # the second claim is untouched
