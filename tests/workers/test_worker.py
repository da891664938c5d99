"""ctx queue work end to end: real tools as a real agent user, failures, timeouts, signals."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from cortexfs.queue.claim_order import HintFile, hint_path
from tests.support.strace import trace_lines
from tests.workers.conftest import AGENT, PROJECT, Farm


def events_of(farm: Farm, session: str = "worker") -> list[dict[str, object]]:
    path = farm.root / "home" / str(farm.user.uid) / "agent" / AGENT / "session" / session
    return [json.loads(line) for line in (path / "events.jsonl").read_text().splitlines()]


def lines_of(stdout: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_a_worker_runs_each_jobs_tool_as_the_agent(farm: Farm) -> None:
    stat_job = farm.publish("fs.stat", {"path": str(farm.scratch)})
    shell_job = farm.publish("shell.exec", {"cmd": "id -u; echo hello"})
    done = farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")
    assert done.returncode == 0, done.stderr
    state, result = farm.result(stat_job)
    assert state == "done" and result["status"] == "ok"
    assert result["output"]["type"] == "directory"
    state, result = farm.result(shell_job)
    assert state == "done"
    assert f"{farm.user.uid}\nhello" in json.dumps(result["output"]).replace("\\n", "\n")
    assert result["worker"]["pid"] > 0 and result["started"] and result["finished"]
    assert result["exit_status"] == 0 and result["timings_ms"]["run"] > 0
    for leftover in ("pending", "claimed", "lease", "inbox"):
        assert os.listdir(farm.queue / leftover) == []


def test_the_synopsis_of_section_2_4_works_with_the_agent_in_ctx_agent(farm: Farm) -> None:
    job = farm.publish("fs.stat", {"path": str(farm.scratch)})
    done = farm.ctx("queue", "work", "--project", PROJECT, "--drain", env={"CTX_AGENT": AGENT})
    assert done.returncode == 0, done.stderr
    assert farm.result(job)[0] == "done"


def test_the_synopsis_of_section_2_4_drains_an_empty_queue_without_an_agent(farm: Farm) -> None:
    done = farm.ctx("queue", "work", "--project", PROJECT, "--drain", env={"CTX_AGENT": ""})
    assert done.returncode == 0, done.stderr
    warnings = done.stderr.splitlines()
    assert len(warnings) == 1 and "warning" in warnings[0] and "--agent" in warnings[0]


def test_a_worker_without_an_agent_fails_every_job_with_eacces(farm: Farm) -> None:
    """W-1: the tool runs as the worker's agent; with none, the authority chain refuses
    ("authorization denied"): each job is finished in failed/ with the reason, none runs."""
    marker = farm.scratch / "logs" / "ran"
    jobs = [farm.publish("shell.exec", {"cmd": f"touch {marker}"}) for _ in range(2)]

    done = farm.ctx("queue", "work", "--project", PROJECT, "--drain", env={"CTX_AGENT": ""})

    assert done.returncode == 0, done.stderr
    assert done.stderr.count("warning") == 1 and "Traceback" not in done.stderr
    for job in jobs:
        state, result = farm.result(job)
        assert state == "failed" and result["status"] == "error"
        assert result["error"]["error"] == "EACCES" and result["reason"].startswith("EACCES")
        assert "--agent" in result["reason"] and "CTX_AGENT" in result["reason"]
    assert not marker.exists()
    assert "0 done, 2 failed" in done.stdout


def test_the_worker_session_records_claim_start_finish_and_the_tool_calls(farm: Farm) -> None:
    job = farm.publish("fs.stat", {"path": str(farm.scratch)})
    farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")
    kinds = [(e["type"], e["object"]) for e in events_of(farm)]
    queue_events = [k for k, o in kinds if o == f"queue/{job}"]
    assert queue_events == ["queue.claim", "queue.start", "queue.finish"]
    assert ("tool_call", "tool/fs.stat") in kinds and ("tool_result", "tool/fs.stat") in kinds
    claim_at = kinds.index(("queue.claim", f"queue/{job}"))
    assert kinds.index(("tool_call", "tool/fs.stat")) > claim_at


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_the_claim_is_durable_in_the_session_before_it_is_reported_or_run(farm: Farm) -> None:
    """S-5: queue transitions are fsynced before they are reported (or acted on)."""
    job = farm.publish("shell.exec", {"cmd": "true"})
    trace = farm.scratch / "worker.strace"
    command = [sys.executable, "-m", "cortexfs", "queue", "work", "--project", PROJECT]
    command += ["--agent", AGENT, "--drain", "--json"]
    done = subprocess.run(
        [
            "strace",
            "-f",
            "-qq",
            "-y",
            "-s",
            "200",
            "-e",
            "trace=write,fsync,execve",
            "-o",
            str(trace),
            *command,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CTX_STORAGE": str(farm.root)},
    )
    assert done.returncode == 0, done.stderr
    calls = trace_lines(trace)

    def first(predicate: Callable[[str], bool], after: int = 0) -> int:
        return next(n for n, line in enumerate(calls) if n >= after and predicate(line))

    recorded = first(lambda line: "events.jsonl>" in line and "queue.claim" in line)
    synced = first(lambda line: "fsync(" in line and "events.jsonl>" in line, recorded)
    announced = first(lambda line: "write(1" in line and '\\"claim\\"' in line)
    started = first(lambda line: "execve(" in line and "shell.exec" in line, recorded)
    assert recorded < synced < min(announced, started), calls[recorded : announced + 1]
    assert farm.result(job)[0] == "done"


def test_a_denied_tool_fails_with_eacces_and_the_denying_step(farm: Farm) -> None:
    job = farm.publish("fs.write", {"path": str(farm.scratch / "x"), "content": "no"})
    farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")
    state, result = farm.result(job)
    assert state == "failed" and result["status"] == "error"
    assert result["error"]["error"] == "EACCES" and result["error"]["step"] == 5
    assert result["error"]["step_name"] == "object policy"
    assert "EACCES" in result["reason"] and not (farm.scratch / "x").exists()


def test_a_tool_the_agent_may_not_reach_in_its_own_policy_fails_at_step_6(farm: Farm) -> None:
    policy = farm.root / "tool" / "fs.stat.d" / "policy"
    policy.write_text("")
    job = farm.publish("fs.stat", {"path": str(farm.scratch)})
    farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")
    state, result = farm.result(job)
    assert state == "failed" and result["error"]["step"] == 6


def test_a_schema_error_fails_the_job_with_einval(farm: Farm) -> None:
    job = farm.publish("fs.stat", {"no_path": 1})
    farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")
    state, result = farm.result(job)
    assert state == "failed" and result["error"]["error"] == "EINVAL"
    assert result["error"]["stage"] == "schema"


def test_a_non_zero_exit_fails_the_job(farm: Farm) -> None:
    job = farm.publish("shell.exec", {"cmd": "echo broken >&2; exit 3"})
    farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")
    state, result = farm.result(job)
    assert state == "failed" and result["exit_status"] == 3
    assert "broken" in result["stderr"]


def test_a_job_past_its_timeout_is_killed_with_its_process_group(farm: Farm) -> None:
    pid_file = farm.scratch / "logs" / "child.pid"
    job = farm.publish("shell.exec", {"cmd": f"sleep 60 & echo $! > {pid_file}; wait"})
    started = time.monotonic()
    done = farm.ctx(
        "queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain", "--timeout", "1"
    )
    assert done.returncode == 0 and time.monotonic() - started < 30
    state, result = farm.result(job)
    assert state == "failed" and result["error"]["error"] == "ETIMEDOUT"
    child = int(pid_file.read_text())
    for _ in range(100):
        if not Path(f"/proc/{child}").exists():
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists(), "the tool's background child survived"


def test_a_malformed_request_in_pending_fails_with_the_reason(farm: Farm) -> None:
    (farm.queue / "pending" / "junk.req.json").write_text("{not json")
    farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")
    state, result = farm.result("junk.req.json")
    assert state == "failed" and "EINVAL" in result["reason"]


def test_sigterm_lets_the_running_job_finish_and_claims_no_more(farm: Farm) -> None:
    jobs = [farm.publish("shell.exec", {"cmd": "sleep 1; echo slow"}) for _ in range(3)]
    worker = farm.worker()
    assert worker.stdout is not None
    for line in worker.stdout:
        if json.loads(line)["event"] == "claim":
            break
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    finished = [e for e in lines_of(out) if e["event"] == "finish"]
    assert len(finished) == 1 and finished[0]["state"] == "done"
    states = [farm.result(j)[0] if (farm.queue / "done" / j).exists() else "pending" for j in jobs]
    assert sorted(states) == ["done", "pending", "pending"]
    stop = next(e for e in lines_of(out) if e["event"] == "stop")
    assert stop["stopped_by"] == "SIGTERM"


def test_sigint_twice_aborts_and_recover_requeues(farm: Farm) -> None:
    """W-4 (docs/workers.md "Signals"): a second ^C kills the running tool and leaves its job
    claimed, named in the summary and on stderr with the recover that requeues it."""
    aborted = farm.abort_with_two_ctrl_c()
    job, tool_pid = aborted.job, aborted.tool_pid
    assert aborted.stop["aborted"] is True and aborted.stop["left_claimed"] == [job]
    assert f"left claimed, as the worker was aborted before their tools ended: {job}" in (
        aborted.stderr
    )
    assert f"'ctx queue recover --project {PROJECT}' requeues them" in aborted.stderr
    for _ in range(100):
        if not Path(f"/proc/{tool_pid}").exists():
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{tool_pid}").exists()
    assert (farm.queue / "claimed" / job / job).exists()
    recovered = farm.ctx("queue", "recover", "--project", PROJECT, "--json")
    assert json.loads(recovered.stdout)["requeued"][0]["job"] == job
    assert (farm.queue / "pending" / job).exists()


def test_max_jobs_and_concurrency(farm: Farm) -> None:
    log = farm.scratch / "logs" / "spans.log"
    cmd = f"echo start $(date +%s.%N) >> {log}; sleep 0.6; echo end $(date +%s.%N) >> {log}"
    jobs = [farm.publish("shell.exec", {"cmd": cmd}) for _ in range(6)]
    done = farm.ctx(
        "queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain",
        "--concurrency", "3", "--max-jobs", "4",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    finished = [j for j in jobs if (farm.queue / "done" / j).exists()]
    assert len(finished) == 4 and len(os.listdir(farm.queue / "pending")) == 2
    events = [line.split() for line in log.read_text().splitlines()]
    running, peak = 0, 0
    for kind, _ in sorted(events, key=lambda e: float(e[1])):
        running += 1 if kind == "start" else -1
        peak = max(peak, running)
    assert peak >= 2, "no two jobs ever ran at the same time"


def test_a_waiting_worker_wakes_up_for_new_jobs(farm: Farm) -> None:
    worker = farm.worker("--max-jobs", "1")
    assert worker.stdout is not None
    first = json.loads(worker.stdout.readline())
    assert first["event"] == "start" and first["wait"] == "inotify"
    time.sleep(0.5)
    job = farm.publish("fs.stat", {"path": str(farm.scratch)})
    worker.communicate(timeout=60)
    assert worker.returncode == 0 and farm.result(job)[0] == "done"


def test_work_needs_an_existing_agent(farm: Farm) -> None:
    done = farm.ctx("queue", "work", "--project", PROJECT, "--agent", "ghost", "--drain")
    assert done.returncode == 1 and "ENOENT" in done.stderr


def test_a_killed_workers_tool_does_not_run_on(farm: Farm) -> None:
    """The job will run again elsewhere: the first execution must not go on beside it."""
    pid_file = farm.scratch / "logs" / "sh.pid"
    farm.publish("shell.exec", {"cmd": f"echo $$ > {pid_file}; sleep 60; echo too late"})
    worker = farm.worker()
    while not pid_file.exists() or not pid_file.read_text().strip():
        time.sleep(0.05)
    worker.kill()
    worker.communicate()
    shell = int(pid_file.read_text())
    for _ in range(100):
        if not Path(f"/proc/{shell}").exists():
            break
        time.sleep(0.05)
    assert not Path(f"/proc/{shell}").exists(), "the tool outlived its killed worker"


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _cmdline(process: psutil.Process) -> list[str]:
    """A child's command line; none for one that ended meanwhile (a zombie, or reaped)."""
    try:
        return process.cmdline()
    except psutil.NoSuchProcess:  # ZombieProcess too
        return []


def test_a_sigkilled_workers_tool_processes_are_gone_within_a_second(farm: Farm) -> None:
    """I-4, W-3: after a worker is SIGKILLed, recover may run the job again; nothing of the
    first run may still be running then, not even what the tool started (dash forks
    ``sleep``)."""
    farm.publish("shell.exec", {"cmd": "sleep 30"})
    worker = farm.worker()
    deadline = time.monotonic() + 30
    tool_processes: list[psutil.Process] = []
    while not any(_cmdline(p) == ["sleep", "30"] for p in tool_processes):
        assert time.monotonic() < deadline, "the tool never started"
        time.sleep(0.05)
        with contextlib.suppress(psutil.NoSuchProcess):
            tool_processes = psutil.Process(worker.pid).children(recursive=True)

    worker.kill()
    worker.communicate()
    killed_at = time.monotonic()
    while time.monotonic() - killed_at < 1 and not all(_dead(p.pid) for p in tool_processes):
        time.sleep(0.02)

    running = [_cmdline(p) for p in tool_processes if not _dead(p.pid)]
    assert not running, f"still running a second after the worker was killed: {running}"


def test_a_vanished_working_directory_is_named_in_the_failure(farm: Farm) -> None:
    workspace = farm.scratch / "workspace"
    workspace.mkdir()
    request = farm.scratch / "drifter.json"
    request.write_text(
        json.dumps(
            {"name": "drifter", "label": "drifter_t", "tools": ["shell.exec"],
             "mount": [[str(workspace), str(workspace), "rw"]]}
        )
    )  # fmt: skip
    created = farm.ctx("agent", "create", "--user", farm.user.name, str(request))
    assert created.returncode == 0, created.stderr
    with open(farm.root / "tool" / "shell.exec.d" / "policy", "a") as policy:
        policy.write("allow drifter_t tool:shell.exec execute\n")
    workspace.rmdir()
    job = farm.publish("shell.exec", {"cmd": "true"})
    farm.ctx("queue", "work", "--project", PROJECT, "--agent", "drifter", "--drain")
    state, result = farm.result(job)
    assert state == "failed" and result["error"]["error"] == "ENOENT"
    assert "working directory" in result["reason"]


def test_the_worker_takes_the_claim_order_this_user_shares_on_this_host(
    farm: Farm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hint is only a hint, but the worker consults it: given one that puts the newer job
    first, the worker claims that one, where a listing of pending/ would give the older."""
    older = farm.publish("fs.stat", {"path": str(farm.scratch)})
    newer = farm.publish("fs.stat", {"path": str(farm.scratch)})
    os.utime(farm.queue / "pending" / older, (1_000_000_000, 1_000_000_000))
    monkeypatch.setenv("XDG_CACHE_HOME", str(farm.scratch / "cache"))  # ctx inherits it
    HintFile(hint_path(farm.queue)).reset([newer, older])

    done = farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--max-jobs", "1")

    assert done.returncode == 0, done.stderr
    assert farm.result(newer)[0] == "done"
    assert (farm.queue / "pending" / older).exists()


@pytest.mark.parametrize(
    ("limit", "tool", "tool_input"),
    [
        (100, "fs.stat", {"path": "."}),  # even the failure record is bigger than this
        (65536, "shell.exec", {"cmd": "head -c 300000 /dev/zero | tr '\\0' x"}),
    ],
)
def test_a_result_over_the_queue_limit_fails_the_job_with_efbig(
    farm: Farm, limit: int, tool: str, tool_input: dict[str, object]
) -> None:
    """Never a traceback, never a job left claimed to run again after recover."""
    config = farm.queue / "config"
    config.write_text(config.read_text() + f"max_result_bytes={limit}\n")
    if tool == "fs.stat":
        tool_input = {"path": str(farm.scratch)}
    job = farm.publish(tool, tool_input)

    done = farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain", "--json")

    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    state, result = farm.result(job)
    assert state == "failed" and result["status"] == "error"
    assert result["reason"].startswith("EFBIG") and result["error"]["error"] == "EFBIG"
    assert result["output"] is None and result["output_omitted"] is True
    stop = lines_of(done.stdout)[-1]
    assert (stop["event"], stop["done"], stop["failed"]) == ("stop", 0, 1)
    for leftover in ("pending", "claimed", "lease"):
        assert os.listdir(farm.queue / leftover) == []
