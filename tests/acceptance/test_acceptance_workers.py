"""SPEC §3 (workers, W-1..W-5), the worker's part of S-5 (queue transitions recorded before
they are reported) and the authority chain (§5, §6) as a worker meets it: black-box, through
``ctx queue work``, the programs in ``workers/`` and the files SPEC names."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    QueueCLI,
    alive,
    clean_env,
    find_values,
    request,
    rfc3339,
    wait_for,
)
from tests.acceptance.workercli import (
    AGENT,
    allow_in_tool_policy,
    make_agent,
    result_of,
    running_worker,
    shell_job,
    start_worker,
)
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root")

# ------------------------------------------------------------------------------ helpers


def work(queue: QueueCLI, *args: str, timeout: float = 60, env: dict | None = None):
    return queue.run(
        "work", "--agent", AGENT, *args, timeout=timeout, **({"env": env} if env else {})
    )


def says(res: dict, *words: str) -> bool:
    """Whether the result, as text, mentions any of ``words`` (W-1: "recording the reason")."""
    text = json.dumps(res).lower()
    return any(word.lower() in text for word in words)


def session_events(storage: Path, session: str = "worker") -> list[dict]:
    """S-1: ``home/<uid>/agent/<agent>/session/<session>/events.jsonl``, one event a line."""
    found = list(storage.glob(f"home/*/agent/{AGENT}/session/{session}/events.jsonl"))
    assert len(found) == 1, found
    return [json.loads(line) for line in found[0].read_text().splitlines() if line.strip()]


def nothing_left_in_flight(queue: QueueCLI) -> None:
    assert queue.entries("claimed") == set()
    assert queue.entries("lease") == set()


# ------------------------------------------------------------------------------ W-1


def test_w1_job_runs_its_tool_with_its_input_and_finishes_done(queue, agent, outbox):
    job = queue.publish(shell_job(f"echo hello-from-job > {outbox}/trace; echo printed"))
    r = work(queue, "--drain")
    assert r.rc == 0, r
    assert queue.state(job) == "done"
    assert (outbox / "trace").read_text() == "hello-from-job\n"
    res = result_of(queue, job)
    # §2.1: {"status": "ok"|"error", "output": ..., "worker": {...}, "started", "finished"}
    assert res["status"] == "ok"
    assert "printed" in json.dumps(res["output"])
    assert isinstance(res["worker"], dict) and res["worker"]
    assert rfc3339(res["started"]) <= rfc3339(res["finished"])
    nothing_left_in_flight(queue)
    assert queue.entries("pending") == set()


def test_w1_tool_runs_under_the_agents_identity_not_the_workers(
    storage, queue, outbox, unprivileged_user: UnprivilegedUser
):
    make_agent(storage, ["shell.exec"], "--user", unprivileged_user.name)
    allow_in_tool_policy(storage, "shell.exec")
    job = queue.publish(
        shell_job(f"id -u > {outbox}/uid; id -G > {outbox}/groups; touch {outbox}/made")
    )
    r = work(queue, "--drain")
    assert r.rc == 0, r
    res = result_of(queue, job)
    assert res["status"] == "ok", res
    assert (outbox / "uid").read_text().split() == [str(unprivileged_user.uid)]
    assert (outbox / "made").stat().st_uid == unprivileged_user.uid
    # The worker (root) has its own groups; the tool has the agent's, never root's group 0.
    groups = {int(g) for g in (outbox / "groups").read_text().split()}
    assert unprivileged_user.gid in groups and 0 not in groups


def test_w1_root_default_agent_never_runs_its_tool_as_root(queue, agent, outbox):
    job = queue.publish(shell_job(f"touch {outbox}/made"))
    assert work(queue, "--drain").rc == 0
    assert queue.state(job) == "done"
    assert (outbox / "made").stat().st_uid != 0


def test_w1_nonzero_exit_finishes_failed_with_the_reason(queue, agent):
    job = queue.publish(shell_job("echo about-to-fail >&2; exit 3"))
    r = work(queue, "--drain")
    assert r.rc == 0, r  # a job's failure is not the worker's
    assert queue.state(job) == "failed"
    res = result_of(queue, job)
    assert {"status", "output", "worker", "started", "finished"} <= res.keys()  # §2.1
    assert res["status"] == "error"
    assert 3 in find_values(res, "exit_status") or says(res, "status 3", "exit 3", "exited 3")
    nothing_left_in_flight(queue)


def test_w1_denied_by_the_tool_policy_fails_and_never_runs(storage, queue, outbox):
    make_agent(storage, ["shell.exec"])  # the agent layer allows; the tool's own policy not
    job = queue.publish(shell_job(f"touch {outbox}/ran"))
    assert work(queue, "--drain").rc == 0
    assert queue.state(job) == "failed"
    assert says(result_of(queue, job), "EACCES")  # P-6: "otherwise EACCES"
    assert not (outbox / "ran").exists()


def test_w1_denied_by_the_agent_policy_fails_and_never_runs(storage, queue, outbox):
    make_agent(storage, ["fs.read"])  # shell.exec is not in the agent's policy
    allow_in_tool_policy(storage, "shell.exec")
    job = queue.publish(shell_job(f"touch {outbox}/ran"))
    assert work(queue, "--drain").rc == 0
    assert queue.state(job) == "failed"
    assert says(result_of(queue, job), "EACCES")
    assert not (outbox / "ran").exists()


def test_w1_a_pre_hook_veto_fails_the_job(storage, queue, agent, outbox):
    hook = storage / "tool" / "shell.exec.d" / "hooks" / "pre.d" / "10-veto"
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text("#!/bin/sh\nexit 1\n")
    hook.chmod(0o755)
    job = queue.publish(shell_job(f"touch {outbox}/ran"))
    assert work(queue, "--drain").rc == 0
    assert queue.state(job) == "failed"  # T-6: a pre hook "may veto it (non-zero exit)"
    assert not (outbox / "ran").exists()


def test_w1_a_tool_name_that_is_a_path_runs_nothing(queue, agent, outbox):
    # a tool name is an object name (no "/"); T-4: tools come from CTX_PATH only.
    # publish refuses such names already: these requests are put in pending/ by hand.
    names = ["../tool/shell.exec", "/bin/sh", "shell.exec.d/../shell.exec", "tool/shell.exec"]
    jobs = []
    for n, tool in enumerate(names):
        req = shell_job(f"touch {outbox}/ran{n}")
        req["tool"] = tool
        jobs.append(queue.drop(f"path-tool-{n}", req))
    assert work(queue, "--drain").rc == 0
    assert [queue.state(j) for j in jobs] == ["failed"] * len(names)
    assert list(outbox.iterdir()) == []


def test_w1_a_malformed_request_fails_and_the_drain_ends(queue, agent):
    # §2.1: a request is one JSON object with "tool" and "input" ({...}).
    bodies = [
        b"{not json",
        b"[1, 2]",
        b'{"input": {"cmd": "true"}}',
        b'{"tool": "shell.exec", "input": 7}',
    ]
    for n, body in enumerate(bodies):
        (queue.dir / "pending" / f"bad{n}.req.json").write_bytes(body)
    good = queue.publish(shell_job("echo fine"), name="good")
    r = work(queue, "--drain", timeout=30)
    assert r.rc == 0, r
    for n in range(len(bodies)):
        assert queue.state(f"bad{n}.req.json") == "failed"
        assert result_of(queue, f"bad{n}.req.json")["status"] == "error"
    assert queue.state(good) == "done"
    nothing_left_in_flight(queue)


@pytest.mark.parametrize("program", [None, "shell_worker.py", "tool_worker.py"])
def test_q8_a_worker_never_runs_or_moves_what_is_not_a_job(queue, agent, outbox, program):
    # symlinks, dot-files, illegal names and non-regular request files are not jobs:
    # "never followed, opened through a link, executed or moved".
    bait = outbox / "bait.json"
    bait.write_text(json.dumps(shell_job(f"touch {outbox}/ran")))
    pending = queue.dir / "pending"
    (pending / "link.req.json").symlink_to(bait)
    (pending / ".hidden.req.json").write_text(bait.read_text())
    (pending / "bad name.req.json").write_text(bait.read_text())
    os.mkfifo(pending / "fifo.req.json")
    (pending / "dir.req.json").mkdir()
    before = sorted(os.listdir(pending))
    if program is None:
        r = work(queue, "--drain", timeout=30)
        assert r.rc == 0, r
    else:
        done = ready_worker(program, queue, "--drain")
        assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(pending)) == before
    assert not (outbox / "ran").exists()
    assert queue.entries("done") == queue.entries("failed") == set()
    nothing_left_in_flight(queue)


def test_w1_a_tool_that_does_not_exist_fails_the_job(queue, agent):
    job = queue.publish(request("no.such-tool"))
    assert work(queue, "--drain").rc == 0
    assert queue.state(job) == "failed"
    assert says(result_of(queue, job), "ENOENT", "EACCES")  # P-4: a missing object


def test_w1_claim_and_lease_are_on_disk_before_the_tool_starts(storage, queue, outbox):
    # gid 0 opens the root-owned queue directories to the tool, so it can look for itself.
    make_agent(storage, ["shell.exec"], "--groups", "0")
    allow_in_tool_policy(storage, "shell.exec")
    job = "looks-at-itself.req.json"
    q = queue.dir
    cmd = (
        f"test -f {q}/claimed/{job}/{job} && test ! -e {q}/pending/{job} "
        f"&& cat {q}/lease/{job}/worker > {outbox}/lease"
    )
    queue.publish(shell_job(cmd), name=job)
    proc = start_worker(queue, "--drain", "--worker", "builder-7")
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert result_of(queue, job)["status"] == "ok", result_of(queue, job)
    lease = json.loads((outbox / "lease").read_text())
    # the lease names the holder: the worker process, on this boot and pid namespace.
    assert lease["pid"] == proc.pid
    assert lease["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert lease["pid_ns"] == os.stat("/proc/self/ns/pid").st_ino
    assert lease["host"] == os.uname().nodename
    assert lease["worker"] == "builder-7"
    assert rfc3339(lease["expires_at"]) > rfc3339(lease["claimed_at"])
    nothing_left_in_flight(queue)


def test_w1_lease_names_the_worker_so_recover_requeues_after_it_is_killed(queue, agent, outbox):
    job = queue.publish(shell_job(f"touch {outbox}/started; sleep 30"))
    proc = start_worker(queue, "--timeout", "60")
    try:
        assert wait_for(lambda: (outbox / "started").exists(), 20)
        assert queue.state(job) == "claimed"
        assert queue.lease(job)["pid"] == proc.pid
    finally:
        proc.kill()
        proc.communicate()
    # the holder is provably gone (same boot and pid namespace, pid dead).
    r = queue.run("recover")
    assert r.rc == 0, r
    assert queue.state(job) == "pending"


def test_w1_a_worker_without_an_agent_identity_runs_no_tool(queue, agent, outbox):
    # W-1: the tool runs "under the worker's agent identity"; the synopsis of §2.4 has no
    # agent option, so a worker started without one has no identity to run anything as.
    job = queue.publish(shell_job(f"touch {outbox}/ran"))
    r = queue.run("work", "--drain", timeout=60)
    assert r.rc in (0, 1), r
    assert queue.state(job) in ("pending", "failed"), r
    assert not (outbox / "ran").exists()


def test_w1_another_uid_cannot_run_jobs_as_the_agent(
    storage, queue, agent, outbox, unprivileged_user: UnprivilegedUser
):
    # H-2/P-5 step 1: agent identity cannot be forged.  The queue and homes are opened to
    # every uid, so that only the authority chain stands between this user and agent ci.
    job = queue.publish(shell_job(f"touch {outbox}/ran"))
    for top in (storage / "shared", storage / "home"):
        for path in [top, *top.rglob("*")]:
            path.chmod(0o777 if path.is_dir() else 0o666)
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT, "--drain"]
    r = subprocess.run(
        argv,
        user=unprivileged_user.uid,
        group=unprivileged_user.gid,
        extra_groups=[],
        env=clean_env(CTX_STORAGE=str(storage), HOME="/nonexistent"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert not (outbox / "ran").exists(), r.stderr
    assert queue.state(job) in ("pending", "failed"), r.stderr
    if queue.state(job) == "pending":
        assert r.returncode != 0 and "EACCES" in r.stderr, r.stderr


# ------------------------------------------------------------------------------ S-5, T-7


def test_s5_tool_call_and_queue_transitions_are_recorded_in_the_agents_session(
    storage, queue, agent
):
    job = queue.publish(shell_job("echo hi"))
    assert work(queue, "--drain").rc == 0
    assert queue.state(job) == "done"
    events = session_events(storage)
    for event in events:  # S-2: the minimal shape
        assert {"ts", "type", "agent", "session", "status"} <= event.keys(), event
        assert event["agent"] == AGENT
        rfc3339(event["ts"].replace("Z", "+00:00"))
    types = [e["type"] for e in events]
    assert "tool_call" in types and "tool_result" in types  # S-2
    transitions = [e for e in events if job in json.dumps(e) and not e["type"].startswith("tool")]
    assert transitions, events  # S-5: queue transitions are events of the session
    # The claim is recorded before the call it leads to, the finish after the call's result.
    assert events.index(transitions[0]) < types.index("tool_call")
    assert events.index(transitions[-1]) > types.index("tool_result")
    assert (storage / "tool" / "shell.exec.d" / "log").stat().st_size > 0  # T-7


def test_s5_transitions_are_durable_before_the_worker_reports_them(storage, queue, agent):
    # S-5: "Events that must be durable (tool results, queue transitions) are fsynced before
    # the action is reported done."  Killed the moment it reports, the worker has left both
    # the queue state and the session event on disk.
    job = queue.publish(shell_job("echo hi"))
    proc = start_worker(queue, "--json")
    reported = None
    try:
        for line in proc.stdout:
            event = json.loads(line)
            if event.get("event") == "claim" and reported is None:
                reported = "claim"
            if event.get("event") == "finish":
                proc.send_signal(signal.SIGKILL)
                reported = "finish"
                break
    finally:
        proc.kill()
        proc.communicate()
    assert reported == "finish"
    assert queue.state(job) == "done"
    events = session_events(storage)
    assert any(e["type"] == "tool_result" for e in events), events
    finishes = [e for e in events if job in json.dumps(e) and "finish" in e["type"]]
    assert finishes, events


# ------------------------------------------------------------------------------ W-2


def test_w2_drain_processes_every_job_then_exits(queue, agent):
    jobs = [queue.publish(shell_job(f"echo {n}"), name=f"d{n}") for n in range(5)]
    r = work(queue, "--drain")
    assert r.rc == 0, r
    assert [queue.state(j) for j in jobs] == ["done"] * 5
    assert queue.entries("pending") == set()
    nothing_left_in_flight(queue)


def test_w2_drain_on_an_empty_queue_exits_at_once(queue, agent):
    began = time.monotonic()
    r = work(queue, "--drain", timeout=20)
    assert r.rc == 0, r
    assert time.monotonic() - began < 10


def test_w2_drain_leaves_no_process_behind(queue, agent):
    # "No background watcher and no polling service": nothing started by the worker outlives it.
    marker = f"CTX_WORKERS_TEST_{os.getpid()}_{time.monotonic_ns()}"
    env = clean_env(CTX_STORAGE=str(queue.storage), **{marker: "1"})
    queue.publish(shell_job("echo hi"))
    assert work(queue, "--drain", env=env).rc == 0

    def carriers() -> list[int]:
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    environ = Path(f"/proc/{entry}/environ").read_bytes()
                except OSError:
                    continue
                if marker.encode() in environ and alive(int(entry)):
                    pids.append(int(entry))
        return pids

    assert wait_for(lambda: not carriers(), 5), carriers()


def test_w2_a_waiting_worker_takes_new_work_without_spinning(queue, agent):
    with running_worker(queue) as proc:
        time.sleep(1.5)
        assert proc.poll() is None, proc.communicate()
        stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu_before = int(stat[11]) + int(stat[12])
        time.sleep(2)
        stat = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu_spent = (int(stat[11]) + int(stat[12]) - cpu_before) / os.sysconf("SC_CLK_TCK")
        assert cpu_spent < 0.5, f"an idle worker used {cpu_spent:.2f}s of CPU in 2s"
        job = queue.publish(shell_job("echo late"))
        assert wait_for(lambda: queue.state(job) == "done", 10)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=20)
        assert proc.returncode == 0


def test_w2_max_jobs_stops_after_that_many(queue, agent):
    jobs = [queue.publish(shell_job(f"echo {n}"), name=f"m{n}") for n in range(3)]
    r = work(queue, "--max-jobs", "2")
    assert r.rc == 0, r
    states = sorted(queue.state(j) for j in jobs)
    assert states == ["done", "done", "pending"]
    nothing_left_in_flight(queue)


# ------------------------------------------------------------------------------ W-3


def test_w3_several_workers_never_double_execute(queue, agent, outbox):
    log = outbox / "runs"
    jobs = [queue.publish(shell_job(f"echo {n} >> {log}"), name=f"w{n:02d}") for n in range(24)]
    env = clean_env(CTX_STORAGE=str(queue.storage))
    by_path = [*CTX_ARGV, "queue", "work", "--queue", str(queue.dir), "--agent", AGENT, "--drain"]
    workers = [
        start_worker(queue, "--drain", "--concurrency", "3"),
        start_worker(queue, "--drain", "--concurrency", "2"),
        start_worker(queue, "--drain"),
        subprocess.Popen(by_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE),
    ]
    for proc in workers:
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    assert [queue.state(j) for j in jobs] == ["done"] * len(jobs)
    runs = log.read_text().split()
    assert sorted(runs, key=int) == [str(n) for n in range(24)]  # each exactly once
    nothing_left_in_flight(queue)
    # S-5: "concurrent appenders never interleave inside a line" (four workers, one session).
    events = session_events(queue.storage)
    assert sum(e["type"] == "tool_result" for e in events) == 24


def test_w3_concurrent_slots_of_one_worker_run_each_job_once(queue, agent, outbox):
    jobs = [
        queue.publish(shell_job(f"echo {n} >> {outbox}/runs; sleep 0.3"), name=f"c{n}")
        for n in range(8)
    ]
    r = work(queue, "--drain", "--concurrency", "4")
    assert r.rc == 0, r
    assert [queue.state(j) for j in jobs] == ["done"] * 8
    assert sorted((outbox / "runs").read_text().split(), key=int) == [str(n) for n in range(8)]


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1)")
def test_w3_a_worker_in_another_pid_namespace_shares_the_queue(queue, agent, outbox):
    # W-3 and Q-5: a worker in another pid namespace (a container) takes jobs beside one on
    # the host; its pid means nothing here, so recover on the host leaves its claim alone.
    slow = queue.publish(shell_job(f"touch {outbox}/started; sleep 3; echo slow"), name="a0")
    quick = [queue.publish(shell_job(f"echo {n} >> {outbox}/runs"), name=f"b{n}") for n in range(6)]
    env = clean_env(CTX_STORAGE=str(queue.storage))
    argv = ["unshare", "--pid", "--fork", "--mount-proc", *CTX_ARGV, "queue", "work"]
    argv += ["--project", queue.project, "--agent", AGENT, "--drain", "--max-jobs", "1"]
    contained = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: (outbox / "started").exists(), 20), contained.poll()
        lease = queue.lease(slow)
        assert lease["pid_ns"] != os.stat("/proc/self/ns/pid").st_ino
        r = queue.run("recover")
        assert queue.state(slow) == "claimed", r
        assert work(queue, "--drain").rc == 0
        _out, err = contained.communicate(timeout=30)
        assert contained.returncode == 0, err
    finally:
        if contained.poll() is None:
            contained.kill()
            contained.communicate()
    assert queue.state(slow) == "done"
    assert [queue.state(j) for j in quick] == ["done"] * 6
    assert sorted((outbox / "runs").read_text().split()) == [str(n) for n in range(6)]
    nothing_left_in_flight(queue)


# ------------------------------------------------------------------------------ W-4


def test_w4_timeout_kills_the_process_group_and_fails_the_job(queue, agent, outbox):
    slow = queue.publish(
        shell_job(f"sleep 37 & echo $! > {outbox}/bg; sleep 38; touch {outbox}/survived"),
        name="slow",
    )
    after = queue.publish(shell_job("echo next"), name="after")
    began = time.monotonic()
    r = work(queue, "--drain", "--timeout", "1", timeout=30)
    assert r.rc == 0, r
    assert time.monotonic() - began < 20
    assert queue.state(slow) == "failed"
    assert says(result_of(queue, slow), "ETIMEDOUT", "timeout", "timed out")
    background = int((outbox / "bg").read_text())
    assert wait_for(lambda: not alive(background), 5), "the tool's background child survived"
    assert not (outbox / "survived").exists()
    assert queue.state(after) == "done"
    nothing_left_in_flight(queue)


def test_w4_timeout_kills_a_job_that_ignores_sigterm(queue, agent, outbox):
    job = queue.publish(
        shell_job(f"trap '' TERM; sleep 41 & echo $! > {outbox}/bg; sleep 42; touch {outbox}/no")
    )
    began = time.monotonic()
    r = work(queue, "--drain", "--timeout", "1", timeout=40)
    assert r.rc == 0, r
    assert time.monotonic() - began < 30
    assert queue.state(job) == "failed"
    background = int((outbox / "bg").read_text())
    assert wait_for(lambda: not alive(background), 5)
    assert not (outbox / "no").exists()


def test_w4_timeout_bounds_the_whole_call_pre_hooks_included(storage, queue, agent, outbox):
    # T-6: pre hooks run "before the tool" as part of the call; W-4: "a job that exceeds it
    # is killed ... and finished as failed".
    hook = storage / "tool" / "shell.exec.d" / "hooks" / "pre.d" / "10-slow"
    hook.parent.mkdir(parents=True, exist_ok=True)
    hook.write_text("#!/bin/sh\nsleep 12\n")
    hook.chmod(0o755)
    job = queue.publish(shell_job(f"touch {outbox}/ran"))
    began = time.monotonic()
    r = work(queue, "--drain", "--timeout", "1", timeout=40)
    elapsed = time.monotonic() - began
    assert r.rc == 0, r
    assert queue.state(job) == "failed"
    assert elapsed < 6, f"a job with --timeout 1 took {elapsed:.1f}s"


def test_w4_lease_outlives_a_job_longer_than_its_ttl(queue, agent, outbox):
    # I-4/W-3: recover requeues a claim whose lease expired; a worker that holds a job
    # longer than --ttl must keep its lease (Q-3: "A worker MAY renew its own lease"), or
    # recover hands the running job to a second worker.
    job = queue.publish(shell_job(f"touch {outbox}/started; sleep 4.5; echo once >> {outbox}/runs"))
    with running_worker(queue, "--ttl", "1.5", "--drain") as proc:
        assert wait_for(lambda: (outbox / "started").exists(), 20)
        time.sleep(2.5)
        r = queue.run("recover")
        assert queue.state(job) == "claimed", r
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert queue.state(job) == "done"
    assert (outbox / "runs").read_text() == "once\n"


def test_w4_sigterm_lets_every_running_slot_finish(queue, agent, outbox):
    jobs = [
        queue.publish(shell_job(f"touch {outbox}/s{n}; sleep 1.5; echo {n}"), name=f"p{n}")
        for n in range(2)
    ]
    with running_worker(queue, "--concurrency", "2") as proc:
        assert wait_for(lambda: all((outbox / f"s{n}").exists() for n in range(2)), 20)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert [queue.state(j) for j in jobs] == ["done", "done"]
    nothing_left_in_flight(queue)


def test_w4_sigterm_lets_the_running_job_finish_then_exits_cleanly(queue, agent, outbox):
    running = queue.publish(
        shell_job(f"touch {outbox}/started; sleep 2; echo finished-anyway"), name="a-running"
    )
    waiting = queue.publish(shell_job(f"touch {outbox}/second"), name="b-waiting")
    with running_worker(queue) as proc:
        assert wait_for(lambda: (outbox / "started").exists(), 20)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert queue.state(running) == "done"
    assert "finished-anyway" in json.dumps(result_of(queue, running)["output"])
    assert queue.state(waiting) == "pending"  # it stopped claiming
    assert not (outbox / "second").exists()
    nothing_left_in_flight(queue)


def test_w4_sigterm_during_a_job_that_times_out_fails_it_and_exits(queue, agent, outbox):
    job = queue.publish(shell_job(f"touch {outbox}/started; sleep 60"))
    with running_worker(queue, "--timeout", "2") as proc:
        assert wait_for(lambda: (outbox / "started").exists(), 20)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert queue.state(job) == "failed"
    nothing_left_in_flight(queue)


def test_w4_sigterm_to_an_idle_worker_exits_cleanly(queue, agent):
    with running_worker(queue, "--json") as proc:
        # Once it has started (its first event): a signal while Python itself still loads
        # ends any program, and W-4 speaks of a worker.
        assert json.loads(proc.stdout.readline())["event"] == "start"
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
    assert proc.returncode == 0


# ------------------------------------------------------------------------------ W-5


def ready_worker(program: str, queue: QueueCLI, *args: str) -> subprocess.CompletedProcess:
    # Run as workers/README.md shows them: the program itself, by its #! line.
    argv = [str(REPO / "workers" / program), "--project", queue.project]
    argv += ["--storage", str(queue.storage), "--agent", AGENT, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=clean_env())


def test_w5_workers_directory_holds_a_shell_worker_and_a_tool_worker():
    programs = {p.name for p in (REPO / "workers").iterdir() if p.suffix == ".py"}
    assert {"shell_worker.py", "tool_worker.py"} <= programs


def test_w5_shell_worker_runs_shell_command_jobs(queue, agent, outbox):
    job = queue.publish(shell_job(f"echo shell > {outbox}/shell"))
    r = ready_worker("shell_worker.py", queue, "--drain")
    assert r.returncode == 0, r.stderr
    assert queue.state(job) == "done"
    assert (outbox / "shell").read_text() == "shell\n"


def test_w5_tool_worker_runs_tool_call_jobs(storage, queue, outbox):
    make_agent(storage, ["fs.stat", "shell.exec"])
    allow_in_tool_policy(storage, "fs.stat")
    allow_in_tool_policy(storage, "shell.exec")
    (outbox / "x").write_text("12345")
    stat_job = request("fs.stat")
    stat_job["input"] = {"path": str(outbox / "x")}
    first = queue.publish(stat_job, name="t1")
    second = queue.publish(shell_job(f"echo tool > {outbox}/tool"), name="t2")
    r = ready_worker("tool_worker.py", queue, "--drain")
    assert r.returncode == 0, r.stderr
    assert queue.state(second) == "done"
    assert (outbox / "tool").read_text() == "tool\n"
    assert queue.state(first) in ("done", "failed")  # fs.stat's view of the path is its own
    nothing_left_in_flight(queue)
