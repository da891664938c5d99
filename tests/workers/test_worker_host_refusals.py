"""What the host refuses a running worker is never a job's failure, nor a job taken away:
a lease it cannot renew, a queue directory whose mode leaves it out, a session or a tool's
log it cannot write.  Real ``ctx queue work`` processes on real filesystems: a small tmpfs
filled up, ``chattr +i`` (EPERM even for root) and a directory's mode (needs root)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cortexfs.timefmt import parse_rfc3339
from tests.support.storage import small_tmpfs
from tests.workers.conftest import AGENT, PROJECT, REPO, Farm, make_farm

WORK = (sys.executable, "-m", "cortexfs", "queue", "work")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (tmpfs, chattr, setuid)")


def wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def fill_up(disk: Path) -> Path:
    """A file that takes every free block of ``disk``."""
    fill = disk / "fill"
    with open(fill, "wb") as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * (1 << 20))
            out.flush()
    return fill


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    """``path`` with the immutable attribute for the block (EPERM for every writer)."""
    made = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"chattr +i is not available here: {made.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False)


def test_a_lease_the_disk_will_not_renew_has_its_job_killed_before_it_lapses(
    traversable_tmp: Path, unprivileged_user
) -> None:
    """A full disk refuses every renewal: the worker says so at once, claims nothing more,
    and kills the job's tool before its lease expires, so that a recover (which takes an
    expired lease as proof that its holder is gone) can never start a second run beside it.
    The job stays claimed; freed space and recover bring it back."""
    with small_tmpfs(traversable_tmp / "disk", "24m") as disk:
        os.chmod(disk, 0o1777)
        farm = make_farm(disk, unprivileged_user)
        started = farm.scratch / "logs" / "started"
        job = farm.publish("shell.exec", {"cmd": f"echo $$ > {started}; sleep 60"})
        second = farm.publish("shell.exec", {"cmd": "true"})
        worker = farm.worker("--ttl", "3")
        wait_for(started)
        tool = int(started.read_text())
        fill = fill_up(disk)
        lease = json.loads((farm.queue / "lease" / job / "worker").read_text())

        while alive(tool) and time.time() < parse_rfc3339(lease["expires_at"]) + 5:
            time.sleep(0.02)
        killed_at = time.time()
        out, err = worker.communicate(timeout=30)

        assert killed_at < parse_rfc3339(lease["expires_at"]), "the tool outlived its lease"
        assert worker.returncode == 1, err
        events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        refused = [e for e in events if e.get("event") == "renew_failed"]
        assert refused and refused[0]["job"] == job and refused[0]["error"] == "ENOSPC"
        assert f"{farm.queue}/inbox refused: No space left on device" in refused[0]["reason"]
        assert "Traceback" not in err
        assert err.startswith(f"ctx: ENOSPC: the worker stopped: job {job} was given up"), err
        assert "its tool's process group was killed" in err and "ctx queue recover" in err
        assert (farm.queue / "claimed" / job / job).is_file()
        assert (farm.queue / "pending" / second).is_file()  # claimed nothing more

        fill.unlink()
        recovered = farm.ctx("queue", "recover", "--project", PROJECT)
        assert recovered.returncode == 0 and f"requeue  {job}" in recovered.stdout


def owners_farm(scratch: Path, user) -> Farm:
    """A root the test user owns (a host administrator, who may start a worker) and its
    agent, running as that user, that may write only ``logs/`` (an agent that could change
    the root would be refused at step 4)."""
    farm = Farm(scratch / "storage", scratch, user)
    assert farm.ctx("bootstrap").returncode == 0
    logs = scratch / "logs"
    logs.mkdir()
    logs.chmod(0o777)
    request = scratch / "agent.json"
    request.write_text(
        json.dumps(
            {
                "name": AGENT,
                "label": "runner_t",
                "tools": ["shell.exec"],
                "shared": {PROJECT: ["read", "write"]},
                "mount": [[str(logs), str(logs), "rw"]],
            }
        )
    )
    created = farm.ctx("agent", "create", "--user", user.name, str(request))
    assert created.returncode == 0, created.stderr
    with open(farm.root / "tool" / "shell.exec.d" / "policy", "a") as policy:
        policy.write("allow runner_t tool:shell.exec execute\n")
    assert farm.ctx("queue", "init", "--project", PROJECT).returncode == 0
    # A worker root started made the agent's session; the storage owner then starts one.
    assert (
        farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain").returncode == 0
    )
    for directory, _subdirectories, files in os.walk(farm.root / "shared"):
        os.chmod(directory, 0o777)
        for name in files:
            os.chmod(Path(directory) / name, 0o666)
    os.chown(farm.root, user.uid, user.gid)
    os.chmod(farm.root / "tool" / "shell.exec.d" / "log", 0o666)
    return farm


def test_a_done_directory_the_worker_may_not_write_stops_it_instead_of_losing_every_job(
    traversable_tmp: Path, unprivileged_user
) -> None:
    """EACCES from a directory's mode is the host's refusal, not another holder's lease: the
    first job stays claimed for recover and the worker stops (exit 1) instead of claiming,
    running and losing every job of the queue."""
    farm = owners_farm(traversable_tmp, unprivileged_user)
    started = farm.scratch / "logs" / "started"
    first = farm.publish("shell.exec", {"cmd": f"echo 1 > {started}; sleep 1"})
    others = {farm.publish("shell.exec", {"cmd": "true"}) for _ in range(3)}
    worker = subprocess.Popen(
        [*WORK, "--project", PROJECT, "--agent", AGENT, "--drain"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        user=farm.user.uid,
        group=farm.user.gid,
        extra_groups=[],
        env={**os.environ, "CTX_STORAGE": str(farm.root), "PYTHONDONTWRITEBYTECODE": "1"},
        cwd=REPO,
    )
    try:
        wait_for(started, 20)
    except AssertionError:
        worker.kill()
        raise AssertionError(worker.communicate()) from None
    for state in ("done", "failed"):
        os.chmod(farm.queue / state, 0o555)

    _, err = worker.communicate(timeout=60)

    assert worker.returncode == 1, err
    last = err.splitlines()[-1]
    assert last.startswith(f"ctx: EACCES: the worker stopped: job {first} ran, but could not")
    assert f"{farm.queue}/done" in err
    assert os.listdir(farm.queue / "claimed") == [first]
    assert set(os.listdir(farm.queue / "pending")) == others


def work_while_the_session_is_immutable(farm: Farm, ending: str) -> tuple[str, str, Path, int]:
    """A worker draining one shell.exec job whose command ends with ``ending``, its session's
    events.jsonl made immutable while the job runs: the job, the worker's stderr, the events
    file and the worker's exit status."""
    started = farm.scratch / "logs" / "started"
    job = farm.publish("shell.exec", {"cmd": f"echo 1 > {started}; sleep 1; {ending}"})
    worker = farm.worker("--drain")
    wait_for(started)
    events = farm.root / "home" / str(farm.user.uid) / "agent" / AGENT / "session"
    events = events / "worker" / "events.jsonl"
    with immutable(events):
        _, err = worker.communicate(timeout=60)
    return job, err, events, worker.returncode


def test_a_session_that_cannot_be_written_leaves_a_job_that_ran_claimed(farm: Farm) -> None:
    """The tool succeeded, but its call could not be recorded in the worker's session: that
    is the host's refusal, not the job's failure, so the job is not finished in failed/ for
    good; it stays claimed, and the stop message names the session file, the job and what
    to do."""
    job, err, events, returncode = work_while_the_session_is_immutable(farm, "echo out")

    assert returncode == 1, err
    assert err.startswith(f"ctx: EPERM: the worker stopped: job {job} was left claimed: "), err
    assert f"in its session {events} " in err and "ctx queue recover" in err
    assert "chattr -i" in err
    assert os.listdir(farm.queue / "failed") == os.listdir(farm.queue / "done") == []
    assert (farm.queue / "claimed" / job / job).is_file()


def test_a_failed_call_whose_record_is_refused_leaves_its_job_claimed(farm: Farm) -> None:
    """A call that failed and whose result the host then refused to record is no more the
    job's failure than a good call's: the job is not finished in failed/ for good."""
    job, err, _, returncode = work_while_the_session_is_immutable(farm, "exit 3")

    assert returncode == 1, err
    assert err.startswith(f"ctx: EPERM: the worker stopped: job {job} was left claimed: "), err
    assert "exited with status 3" in err and "could not be recorded" in err, err
    assert os.listdir(farm.queue / "failed") == os.listdir(farm.queue / "done") == []
    assert (farm.queue / "claimed" / job / job).is_file()


def test_a_tool_log_that_cannot_be_opened_is_no_silent_gap(farm: Farm) -> None:
    """T-7: every call is in its tool's log.  An immutable log (EPERM) makes the call an
    error at stage record, which a worker treats as the host's refusal: the job stays
    claimed, nothing is finished in done/ without its line in the log."""
    started = farm.scratch / "logs" / "started"
    job = farm.publish("shell.exec", {"cmd": f"echo 1 > {started}; sleep 1; echo out"})
    worker = farm.worker("--drain")
    wait_for(started)
    log = farm.root / "tool" / "shell.exec.d" / "log"
    with immutable(log):
        out, err = worker.communicate(timeout=60)

    assert worker.returncode == 1, err
    assert f"cannot open the tool's log {log}: Operation not permitted" in err, err
    assert f"job {job} was left claimed" in err
    stop = [event for event in map(json.loads, out.splitlines()) if event.get("event") == "stop"]
    assert len(stop) == 1 and stop[0]["left_claimed"] == [job], out
    stop = stop[0]
    assert stop["stopped_by"] == "failure" and not stop["aborted"], stop
    # The stop event suggests what the error after it does, naming this worker's queue.
    suggested = re.findall(r"'ctx queue [^']*'", stop["failure"])
    assert suggested and all(command in err for command in suggested), (stop, err)
    assert all(" --" in command for command in suggested), suggested
    assert os.listdir(farm.queue / "done") == []
    assert (farm.queue / "claimed" / job / job).is_file()


def test_sighup_lets_the_running_job_finish_as_sigterm_does(farm: Farm) -> None:
    """A terminal or ssh session that closes sends SIGHUP: the running job finishes, the
    worker exits 0, nothing is left claimed."""
    started = farm.scratch / "logs" / "started"
    job = farm.publish("shell.exec", {"cmd": f"echo 1 > {started}; sleep 1; echo out"})
    worker = farm.worker()
    wait_for(started)
    worker.send_signal(signal.SIGHUP)
    out, err = worker.communicate(timeout=60)

    assert worker.returncode == 0, err
    assert farm.result(job)[0] == "done"
    assert json.loads(out.splitlines()[-1])["stopped_by"] == "SIGHUP"


def test_a_result_too_large_keeps_the_reason_the_call_had_already(farm: Farm) -> None:
    (farm.queue / "config").write_text("max_result_bytes=2000\n")
    job = farm.publish("shell.exec", {"cmd": "head -c 10000 /dev/zero | tr '\\0' x; exit 3"})
    worked = farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")

    assert worked.returncode == 0, worked.stderr
    state, result = farm.result(job)
    assert state == "failed" and result["output_omitted"] is True
    assert result["reason"].startswith("EFBIG: "), result["reason"]
    assert "the call had failed already: shell.exec exited with status 3" in result["reason"]
