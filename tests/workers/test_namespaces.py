"""Workers in other PID and UTS namespaces stand for other hosts sharing the queue (N-1, Q-5).

A pid seen from the recovering namespace proves nothing about a holder in another one: its
job must stay claimed while its lease is valid (the worker renews it), and be requeued once
the "host" vanished and the lease expired.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.workers.conftest import AGENT, PROJECT, REPO, Farm

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root and unshare(1) to create PID and UTS namespaces",
)

TTL = 3.0


def worker_on_another_host(farm: Farm, host: str) -> subprocess.Popen[bytes]:
    """``ctx queue work`` as pid 1's child in fresh PID, UTS and mount namespaces."""
    work = [sys.executable, "-m", "cortexfs", "queue", "work", "--project", PROJECT,
            "--agent", AGENT, "--ttl", str(TTL)]  # fmt: skip
    script = f"hostname {host} && exec {' '.join(work)}"
    return subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--uts",
            "--mount",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "sh",
            "-c",
            script,
        ],
        env={**os.environ, "CTX_STORAGE": str(farm.root)},
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for_lease(farm: Farm, job: str, timeout: float = 60) -> dict[str, object]:
    path = farm.queue / "lease" / job / "worker"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return json.loads(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"no lease for {job} within {timeout} s")


def recover(farm: Farm) -> dict[str, list[dict[str, object]]]:
    done = farm.ctx("queue", "recover", "--project", PROJECT, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_live_worker_in_another_pid_namespace_is_never_requeued(farm: Farm) -> None:
    job = farm.publish("shell.exec", {"cmd": "sleep 30"})
    remote = worker_on_another_host(farm, "node-b")
    try:
        lease = wait_for_lease(farm, job)
        assert lease["host"] == "node-b"
        assert lease["pid_ns"] != os.stat("/proc/self/ns/pid").st_ino
        first = recover(farm)
        assert first["requeued"] == [] and [f["job"] for f in first["untouched"]] == [job]
        time.sleep(TTL * 1.5)  # longer than one lease lifetime: only renewal keeps it valid
        later = recover(farm)
        assert later["requeued"] == [], "a renewed lease of a live remote worker was requeued"
        renewed = json.loads((farm.queue / "lease" / job / "worker").read_text())
        assert renewed.get("renewed_at"), "the worker did not renew its lease"
        assert (farm.queue / "claimed" / job / job).exists()
    finally:
        remote.send_signal(signal.SIGKILL)
        remote.wait()


def test_the_job_of_a_vanished_host_is_requeued_once_its_lease_expires(farm: Farm) -> None:
    job = farm.publish("shell.exec", {"cmd": "sleep 30"})
    remote = worker_on_another_host(farm, "node-c")
    wait_for_lease(farm, job)
    remote.send_signal(signal.SIGKILL)  # --kill-child: the whole namespace dies with it
    remote.wait()
    vanished_at = time.monotonic()
    early = recover(farm)
    if time.monotonic() - vanished_at < TTL * 0.8:
        assert early["requeued"] == [], "requeued before the lease expired"
        assert (farm.queue / "claimed" / job / job).exists()
    time.sleep(TTL + 0.5)
    late = recover(farm)
    assert [f["job"] for f in late["requeued"]] == [job]
    assert "expired" in late["requeued"][0]["detail"]
    assert (farm.queue / "pending" / job).exists()
    finished = farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain",
                        "--timeout", "1")  # fmt: skip
    assert finished.returncode == 0 and farm.result(job)[0] == "failed"  # sleep 30 > 1 s


def test_two_hosts_drain_one_queue_without_double_execution(farm: Farm, tmp_path: Path) -> None:
    log = farm.scratch / "logs" / "runs.log"
    jobs = [
        farm.publish("shell.exec", {"cmd": f"echo {n} $(hostname) >> {log}"}) for n in range(30)
    ]
    hosts = [worker_on_another_host(farm, f"node-{n}") for n in range(2)]
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if all((farm.queue / "done" / j).exists() for j in jobs):
                break
            time.sleep(0.2)
    finally:
        for host in hosts:
            host.send_signal(signal.SIGKILL)
            host.wait()
    runs = [line.split() for line in log.read_text().splitlines()]
    numbers = sorted(int(n) for n, _ in runs)
    assert numbers == list(range(30)), "a job ran twice or not at all"
    assert {h for _, h in runs} <= {"node-0", "node-1"}
