"""Every call and every job leaves records in several places, and they must tell one story.

A tool call is recorded in the session's ``events.jsonl`` (``tool_call`` then ``tool_result``,
S-2, S-5) and in ``<tier>/<name>.d/log`` (T-7, S-3); ``ctx run --native`` also answers with
JSONL frames.  A job of the queue adds its result file (``done/J.result``, ``failed/J.result``,
§2.1), the worker's ``queue.claim`` / ``queue.start`` / ``queue.refuse`` / ``queue.finish`` /
``queue.lost`` events in its session (docs/workers.md), the worker's ``--json`` events and
``stop`` summary (or its text lines), and what ``ctx session show``, ``ctx queue show`` and
``ctx queue status`` print.

Real work is driven here (``ctx run`` in both modes, ``ctx queue work`` draining jobs that
succeed, fail, time out, are refused at each stage, a worker SIGKILLed, one interrupted twice,
one stopped past its lease, one whose tool log refuses the record, then ``ctx queue recover``
and another worker), and the records are cross-checked:

* S-2, S-5, T-7: each call appears once as ``tool_call`` and once as ``tool_result`` in its
  session and once in its tool's log, with the same call id, tool, status, errno, stage,
  step, exit status, message and input everywhere; no record of a call that never happened;
* §2.1, W-1, Q-4: each result file names a call its session and its tool's log hold, with
  the same exit status, errno and stage; each job has exactly one ``queue.claim`` and one
  ``queue.finish`` per run, whose state is the directory holding its result;
* §2.4, docs/workers.md (Output): the worker's events and summary, ``ctx queue status`` and
  ``ctx queue show`` count and say what is on disk;
* S-4: a secret is redacted the same way in the session and in the tool's log, and appears
  in neither;
* Q-5, docs/workers.md (Signals): a job that runs again after ``recover`` shows both runs,
  each with its own call id; the run that was cut short has no result of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    clean_env,
    ctx_run,
    read_jsonl,
    wait_for,
)
from tests.acceptance.workercli import AGENT, shell_job
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid than the host: needs root"
)

SECRET = "Zq7sesame8841"  # appears in inputs, stderr and hook messages; never in a log
REDACTED = "[redacted]"
TRACEBACK = "Traceback (most recent call last)"
TERMINAL_STATES = ("done", "failed")
# Keys only the tool's log line has: the rest of its facts are the session's tool_result's.
LOG_ONLY = {"session_dir", "mode", "input", "argv", "job"}

# ------------------------------------------------------------------------------ helpers


def env_of(storage: Path) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(storage))


def events(storage: Path, session_dir: str) -> list[dict]:
    return read_jsonl(storage / session_dir / "events.jsonl")


def log_of(storage: Path, obj: str) -> Path:
    """``tool/NAME`` (or ``home/U/tool/NAME``…) -> its control directory's ``log``."""
    return storage / f"{obj}.d" / "log"


def check_calls(
    storage: Path, session_dir: str, *, unlogged: frozenset[str] = frozenset()
) -> dict[str, dict]:
    """Cross-check every tool call of the session at ``session_dir`` against its tool's log;
    returns call id -> the session's ``tool_result`` (with the ``tool_call``'s input or argv
    merged in).  ``unlogged``: calls whose log refused the record (their line is missing)."""
    evs = events(storage, session_dir)
    name = Path(session_dir).name
    calls = [e for e in evs if e["type"] == "tool_call"]
    results = [e for e in evs if e["type"] == "tool_result"]
    call_ids = [e["call"] for e in calls]
    result_ids = [e["call"] for e in results]
    assert len(call_ids) == len(set(call_ids)), Counter(call_ids).most_common(3)
    assert len(result_ids) == len(set(result_ids)), Counter(result_ids).most_common(3)
    # No tool_result of a call that was never received.
    assert set(result_ids) <= set(call_ids), set(result_ids) - set(call_ids)
    by_call: dict[str, dict] = {}
    for res in results:
        (req,) = [c for c in calls if c["call"] == res["call"]]
        assert req["object"] == res["object"], (req, res)
        assert req["agent"] == res["agent"] == AGENT
        assert req["session"] == res["session"] == name
        assert req["status"] == "ok"
        assert req["ts"] <= res["ts"]
        log = log_of(storage, res["object"])
        lines = [line for line in read_jsonl(log) if line.get("call") == res["call"]]
        if res["call"] in unlogged or not log.parent.is_dir():
            assert lines == [], lines  # a tool that is not there has no log to go to
        else:
            assert len(lines) == 1, (res["call"], lines)
            (line,) = lines
            assert set(line) - LOG_ONLY == set(res), (line, res)
            for key in set(res) - {"ts"}:
                assert line[key] == res[key], (key, line, res)
            assert line["ts"] >= res["ts"]  # the session's line is written first
            assert line["session_dir"] == session_dir
            assert line["mode"] == req["mode"]
            assert line.get("input") == req.get("input")
            assert line.get("argv") == req.get("argv")
            assert line.get("job") == req.get("job")  # a worker's call names its job in both
        by_call[res["call"]] = {**res, "mode": req["mode"], "called_with": req.get("input")}
    return by_call


def terminal_results(queue: QueueCLI) -> dict[str, tuple[str, dict]]:
    """Job -> (state, result) for every job in done/ or failed/, its pair complete."""
    found: dict[str, tuple[str, dict]] = {}
    for state in TERMINAL_STATES:
        for name in os.listdir(queue.dir / state):
            if name.endswith(".result"):
                continue
            assert name not in found, (name, "in two terminal states")
            text = (queue.dir / state / f"{name}.result").read_text()
            found[name] = (state, json.loads(text))
    return found


def check_result_against_call(result: dict, call: dict, session_dir: str) -> None:
    """§2.1 result vs the session's (and so the log's) record of the same call."""
    assert result["call"] == call["call"]
    assert result["session"] == session_dir
    assert f"tool/{result['tool']}" == call["object"]
    assert result["agent"] == AGENT
    assert result["exit_status"] == call["exit_status"]
    error = result["error"]
    if error is not None and error["stage"] == "finish":
        # The call itself went well; the job failed when its result was stored (EFBIG).
        assert call["status"] == "ok" and "errno" not in call
        return
    assert result["status"] == call["status"]
    if error is None:
        assert "errno" not in call and result["reason"] is None
        return
    assert error["error"] == call["errno"]
    assert error["stage"] == call["stage"]
    assert error["step"] == call["step"]
    # The log rule is the only difference between the two messages (S-4).
    assert call["message"] == error["message"].replace(SECRET, REDACTED)
    assert result["reason"] == f"{error['error'] + ': ' if error['error'] else ''}" + (
        f"{error['message']} [{error['stage']}]"
    )


def worker_argv(queue: QueueCLI, *args: str, with_agent: bool = True) -> list[str]:
    who = ["--agent", AGENT] if with_agent else []
    return [*CTX_ARGV, "queue", "work", "--project", queue.project, "--json", *who, *args]


@contextlib.contextmanager
def worker(queue: QueueCLI, out: Path, *args: str) -> Iterator[subprocess.Popen]:
    """``ctx queue work --json --agent ci ARGS`` in the background, its stdout in ``out`` and
    stderr beside it; killed on the way out if the block left it running."""
    with open(out, "wb") as stdout, open(out.with_suffix(".err"), "wb") as stderr:
        proc = subprocess.Popen(
            worker_argv(queue, *args),
            env=env_of(queue.storage),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def drain(queue: QueueCLI, *args: str, with_agent: bool = True) -> tuple[int, list[dict], str]:
    """A worker run to the end with ``--drain``: exit status, its JSON events, its stderr."""
    proc = subprocess.run(
        worker_argv(queue, "--drain", *args, with_agent=with_agent),
        env=env_of(queue.storage),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, [json.loads(x) for x in proc.stdout.splitlines()], proc.stderr


def session_dir_of(storage: Path, session: str = "worker") -> str:
    (found,) = (storage / "home").glob(f"*/agent/{AGENT}/session/{session}")
    return str(found.relative_to(storage))


def queue_events(evs: list[dict], job: str) -> list[dict]:
    return [e for e in evs if e["type"].startswith("queue.") and e["object"] == f"queue/{job}"]


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def seen_in_session(storage: Path, session_dir: str, text: str) -> bool:
    path = storage / session_dir / "events.jsonl"
    return path.exists() and text in path.read_text()


def hook(storage: Path, phase: str, name: str, program: str) -> None:
    """A host-owned hook of ``shell.exec`` (T-6)."""
    path = storage / "tool" / "shell.exec.d" / "hooks" / f"{phase}.d" / name
    path.write_text(program)
    path.chmod(0o755)


def check_status_counts(queue: QueueCLI) -> dict:
    r = queue.run("status", "--json")
    assert r.rc == 0, r
    status = r.json()
    on_disk = {
        "pending": len(queue.entries("pending")),
        "claimed": len([j for j in queue.entries("claimed") if queue.state(j) == "claimed"]),
        "done": len([x for x in queue.entries("done") if not x.endswith(".result")]),
        "failed": len([x for x in queue.entries("failed") if not x.endswith(".result")]),
    }
    for key, count in on_disk.items():
        assert status[key] == status["counts"][key] == count, (key, status, on_disk)
    return status


# ------------------------------------------------------------------------------ ctx run


def test_ctx_run_in_both_modes_records_each_call_once_everywhere(
    storage: Path, agent: str, outbox: Path
) -> None:
    """S-2, S-4, T-3, T-7: native frames, the session and the tool's log agree call by call;
    in terminal mode the exit status of ``ctx run`` is the recorded one; a refused call has
    no exit status; a secret is redacted alike in both records and appears in neither."""
    env = env_of(storage)
    frames: dict[str, dict] = {}

    def native(payload: dict, *args: str) -> tuple[int, dict]:
        r = ctx_run("run", "--agent", AGENT, *args, "--native", "shell.exec",
                    input=json.dumps(payload), env=env)  # fmt: skip
        assert TRACEBACK not in r.err, r
        out = [json.loads(x) for x in r.lines()]
        assert out[-1]["type"] == "result", r
        started = [f for f in out if f["type"] == "call"]
        assert [f["call"] for f in started] in ([], [out[-1]["call"]]), r
        frames[out[-1]["call"]] = out[-1]
        return r.rc, out[-1]

    rc, ok = native({"cmd": "echo fine"})
    assert rc == 0 and ok["status"] == "ok" and ok["exit_status"] == 0
    rc, bad = native({"cmd": f"echo half; echo password={SECRET} >&2; exit 3"})
    assert rc == 1 and bad["exit_status"] == 3 and bad["error"]["stage"] == "exit"
    rc, schema = native({"cmd": 7, "token": SECRET})
    assert rc == 2 and schema["error"]["stage"] == "schema"  # unusable input
    rc, slow = native({"cmd": "sleep 30"}, "--timeout", "1")
    assert rc == 1 and slow["error"]["error"] == "ETIMEDOUT"

    terminal: dict[int, int] = {}  # position in the session -> exit status of ctx run
    for word in ("echo plain", "exit 5", f"curl -u admin:{SECRET} localhost; exit 0"):
        r = ctx_run("run", "--agent", AGENT, "shell.exec", word, env=env)
        assert TRACEBACK not in r.err, r
        terminal[len(terminal)] = r.rc
    refused = ctx_run("run", "--agent", AGENT, "fs.read", '{"path": "x"}', env=env)
    assert refused.rc == 126, refused  # step 5: fs.read is not in its policy
    proc = subprocess.Popen(
        [*CTX_ARGV, "run", "--agent", AGENT, "shell.exec", f"touch {outbox}/up; sleep 30"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    session_dir = ok["session"]
    assert session_dir == session_dir_of(storage, "default")
    assert wait_for(lambda: (outbox / "up").exists(), 15)  # the tool runs
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err

    by_call = check_calls(storage, session_dir)
    assert len(by_call) == 4 + 3 + 1 + 1
    # The native frames and the records: one call each, the same facts.
    for call, frame in frames.items():
        rec = by_call[call]
        assert frame["session"] == session_dir and frame["agent"] == AGENT
        assert rec["mode"] == frame["mode"] == "native"
        assert rec["status"] == frame["status"] and rec["exit_status"] == frame["exit_status"]
        assert rec["duration_ms"] == frame["timings_ms"]["total"]
        if frame["error"] is not None:
            assert rec["errno"] == frame["error"]["error"]
            assert rec["stage"] == frame["error"]["stage"]
            assert rec["message"] == frame["error"]["message"].replace(SECRET, REDACTED)
    # Terminal calls, in the order they were made: ctx's exit status is the recorded one.
    in_terminal = [r for r in by_call.values() if r["mode"] == "terminal"]
    assert len(in_terminal) == 5
    for i, rc in terminal.items():
        assert in_terminal[i]["exit_status"] == rc
    denied, interrupted = in_terminal[3], in_terminal[4]
    assert denied["object"] == "tool/fs.read" and denied["exit_status"] is None
    assert (denied["errno"], denied["stage"], denied["step"]) == ("EACCES", "authorize", 5)
    assert (interrupted["errno"], interrupted["stage"]) == ("EINTR", "run")
    assert interrupted["exit_status"] == 143
    # S-4: the secret is in no record, and the redaction is the same in both (check_calls).
    for path in (storage / session_dir / "events.jsonl", log_of(storage, "tool/shell.exec")):
        assert SECRET not in path.read_text(), path
    assert by_call[bad["call"]]["message"].endswith(f"password={REDACTED}")
    assert by_call[schema["call"]]["called_with"]["token"] == REDACTED
    # ctx session show prints the file, one event per line, in both forms.
    shown = ctx_run("session", "show", AGENT, "--json", env=env)
    assert shown.rc == 0, shown
    assert [json.loads(x) for x in shown.lines()] == events(storage, session_dir)
    text = ctx_run("session", "show", AGENT, env=env)
    assert text.rc == 0 and SECRET not in text.out, text
    assert len([x for x in text.lines() if "tool_result" in x]) == len(by_call)


# ------------------------------------------------------------------------------ workers

VETO = f"""#!/bin/sh
in=$(cat)
case "$in" in *please-veto*) echo "vetoed: api_key={SECRET}" >&2; exit 5;; esac
exit 0
"""
POST_FAILS = """#!/bin/sh
cat > /dev/null
echo "post-hook complains" >&2
exit 7
"""


def test_worker_outcomes_agree_in_results_sessions_logs_and_summaries(
    storage: Path, agent: str, queue: QueueCLI
) -> None:
    """§2.1, W-1, W-4, S-2, T-7, docs/workers.md: jobs that succeed, fail, time out, are
    refused at stage resolve, authorize, schema, hook, request and finish, drained by one
    worker: every record of each job and of its call agrees, and every count is the disk's."""
    hook(storage, "pre", "10-veto", VETO)
    hook(storage, "post", "20-complain", POST_FAILS)
    with (queue.dir / "config").open("a") as config:
        config.write("max_result_bytes=2048\n")
    jobs = {
        "ok": shell_job("echo fine"),
        "exits": shell_job(f"echo out; echo token={SECRET} >&2; exit 4"),
        "slow": shell_job("sleep 30"),
        "denied": {"tool": "fs.read", "input": {"path": "/etc/hostname"}},
        "schema": shell_job("x") | {"input": {"cmd": 5, "password": SECRET}},
        "missing": {"tool": "no.such.tool", "input": {}},
        "vetoed": shell_job("echo please-veto"),
        "too-big": shell_job("head -c 5000 /dev/zero | tr '\\0' a"),
    }
    for name, req in jobs.items():
        queue.publish(req, name=name)
    # A request put in pending/ by hand that is not JSON: refused before any call.
    (queue.dir / "pending" / "broken.req.json").write_text('{"tool": "shell.exec", "inp')
    expected = {
        "ok.req.json": ("done", None, None),
        "exits.req.json": ("failed", None, "exit"),
        "slow.req.json": ("failed", "ETIMEDOUT", "run"),
        "denied.req.json": ("failed", "EACCES", "authorize"),
        "schema.req.json": ("failed", "EINVAL", "schema"),
        "missing.req.json": ("failed", "ENOENT", "resolve"),
        "vetoed.req.json": ("failed", "EACCES", "hook"),
        "too-big.req.json": ("failed", "EFBIG", "finish"),
        "broken.req.json": ("failed", "EINVAL", "request"),
    }

    rc, out, err = drain(queue, "--timeout", "1")
    assert rc == 0 and TRACEBACK not in err, (out, err)
    on_disk = terminal_results(queue)
    assert {j: (s, r["error"] and r["error"]["error"], r["error"] and r["error"]["stage"])
            for j, (s, r) in on_disk.items()} == expected  # fmt: skip
    queue.assert_settled()

    # The worker's --json events: one claim and one finish per job, the summary the disk's.
    assert out[0]["event"] == "start" and out[-1]["event"] == "stop"
    kinds = Counter(e["event"] for e in out)
    assert kinds == {"start": 1, "claim": 9, "finish": 9, "stop": 1}, kinds
    finishes = {e["job"]: e for e in out if e["event"] == "finish"}
    assert set(finishes) == set(on_disk)
    for job, event in finishes.items():
        state, result = on_disk[job]
        assert event["state"] == state and event["reason"] == result["reason"], job
    stop = out[-1]
    states = Counter(state for state, _ in on_disk.values())
    assert (stop["done"], stop["failed"], stop["lost"]) == (states["done"], states["failed"], 0)
    assert stop["left_claimed"] == [] and stop["left_pending"] == {}
    status = check_status_counts(queue)
    assert (status["done"], status["failed"]) == (stop["done"], stop["failed"])

    # The session and the tools' logs, call by call; each result names its call.
    session_dir = session_dir_of(storage)
    by_call = check_calls(storage, session_dir)
    evs = events(storage, session_dir)
    named = [r["call"] for _, r in on_disk.values() if "call" in r]
    assert sorted(named) == sorted(by_call), "a call without a job, or a job without a call"
    for job, (state, result) in on_disk.items():
        qev = queue_events(evs, job)
        kinds_of_job = [e["type"] for e in qev]
        if job == "broken.req.json":
            assert "call" not in result
            assert kinds_of_job == ["queue.claim", "queue.refuse", "queue.finish"]
        else:
            assert kinds_of_job == ["queue.claim", "queue.start", "queue.finish"], job
            check_result_against_call(result, by_call[result["call"]], session_dir)
        claim, finish = qev[0], qev[-1]
        assert claim["lease"]["job"] == job
        assert claim["lease"]["worker"] == result["worker"]["id"]
        assert finish["state"] == state
        assert finish["status"] == result["status"]
        assert claim["ts"] <= finish["ts"]
        shown = queue.run("show", job, "--json")
        assert shown.rc == 0, shown
        assert shown.json()["state"] == state and shown.json()["result"] == result
    # The post-hook's failure is recorded alike (check_calls) with each call it followed.
    ran = [r for r in by_call.values() if r.get("stage") not in ("resolve", "authorize")]
    assert all(r.get("post_hooks") for r in ran if r.get("stage") not in ("schema", "hook"))
    # S-4: the secret reached the results (the caller's) but no record.
    for path in (storage / session_dir / "events.jsonl", log_of(storage, "tool/shell.exec")):
        assert SECRET not in path.read_text(), path
    assert SECRET in on_disk["vetoed.req.json"][1]["reason"]


def test_text_worker_stopped_by_sigterm_reports_what_the_disk_holds(
    storage: Path, agent: str, queue: QueueCLI, outbox: Path
) -> None:
    """W-4, docs/workers.md (Signals, Output): a text-mode worker given SIGTERM while a job
    runs lets it finish; its lines name each finished job once, in the state on disk, and
    its summary counts them."""
    queue.publish(shell_job("exit 9"), name="first")
    queue.publish(shell_job(f"touch {outbox}/started; sleep 1; echo late"), name="second")
    queue.publish(shell_job("echo never"), name="third")
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--agent", AGENT]
    proc = subprocess.Popen(argv, env=env_of(storage), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert wait_for(lambda: (outbox / "started").exists(), 20)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and TRACEBACK not in err, (out, err)
    on_disk = terminal_results(queue)
    assert {j: s for j, (s, _) in on_disk.items()} == {
        "first.req.json": "failed",
        "second.req.json": "done",
    }
    assert queue.entries("pending") == {"third.req.json"}
    lines = out.splitlines()
    finished = [x for x in lines if x.startswith(("done ", "failed "))]
    assert len(finished) == 2, lines
    for line in finished:
        word, job = line.split()[0], line.split()[1].rstrip(":")
        assert on_disk[job][0] == word, line
    assert f"failed  first.req.json: {on_disk['first.req.json'][1]['reason']}" in lines
    assert lines[-1].startswith("worker stopped: 1 done, 1 failed, "), lines
    status = check_status_counts(queue)
    assert status["pending"] == 1
    session_dir = session_dir_of(storage)
    check_calls(storage, session_dir)
    evs = events(storage, session_dir)
    assert queue_events(evs, "third.req.json") == []  # never claimed: nothing recorded


def test_worker_without_an_agent_records_no_call_anywhere(
    storage: Path, agent: str, queue: QueueCLI
) -> None:
    """W-1: a worker with no agent identity fails each job it claims with EACCES, and since
    no call was made, no session or tool log holds one; its summary counts the results."""
    for n in range(3):
        queue.publish(shell_job(f"echo {n}"), name=f"j{n}")
    log = log_of(storage, "tool/shell.exec")
    before = log.read_bytes()
    rc, out, err = drain(queue, with_agent=False)
    assert rc == 0 and TRACEBACK not in err, (out, err)
    on_disk = terminal_results(queue)
    assert {s for s, _ in on_disk.values()} == {"failed"} and len(on_disk) == 3
    for _, result in on_disk.values():
        assert result["error"]["error"] == "EACCES" and "call" not in result
    assert out[-1]["failed"] == 3 and out[-1]["done"] == 0
    assert [e["job"] for e in out if e["event"] == "finish"] == sorted(on_disk)
    assert log.read_bytes() == before
    assert not list((storage / "home").glob("*/agent/*/session/worker"))
    check_status_counts(queue)


# ------------------------------------------------------------------------------ runs again


def test_double_interrupt_then_recover_shows_both_runs(
    storage: Path, agent: str, queue: QueueCLI, tmp_path: Path, outbox: Path
) -> None:
    """docs/workers.md (Signals), Q-5: a second ^C kills the running tool, recorded EINTR at
    stage run (137) in the session and the tool's log, and the job is left claimed (named in
    the stop event); recover requeues it and another worker runs it: the session then holds
    both runs, each with its own call, and the result names the second."""
    flag = outbox / "ran-once"
    cmd = f"if [ -e {flag} ]; then echo again; else touch {flag}; sleep 30; fi"
    job = queue.publish(shell_job(cmd), name="twice")
    out = tmp_path / "w1.jsonl"
    session_dir = None
    with worker(queue, out) as proc:
        assert wait_for(lambda: flag.exists(), 20)
        session_dir = session_dir_of(storage)
        assert wait_for(lambda: seen_in_session(storage, session_dir, '"tool_call"'), 10)
        proc.send_signal(signal.SIGINT)
        assert wait_for(lambda: '"interrupt"' in out.read_text(), 10)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    first = [json.loads(x) for x in lines_of(out)]
    stop = first[-1]
    assert stop["event"] == "stop" and stop["aborted"] is True
    assert stop["left_claimed"] == [job]
    assert (stop["done"], stop["failed"], stop["lost"]) == (0, 0, 0)
    assert queue.state(job) == "claimed" and terminal_results(queue) == {}
    killed = check_calls(storage, session_dir)
    (run1,) = killed.values()
    assert (run1["errno"], run1["stage"], run1["exit_status"]) == ("EINTR", "run", 137)

    r = queue.run("recover", "--json")
    assert r.rc == 0, r
    assert [x["job"] for x in r.json()["requeued"]] == [job]
    rc, second, err = drain(queue)
    assert rc == 0 and TRACEBACK not in err, (second, err)
    state, result = queue.only_result(job)
    assert state == "done" and result["output"] == "again\n"
    assert second[-1]["done"] == 1
    by_call = check_calls(storage, session_dir)
    assert len(by_call) == 2 and result["call"] in by_call and result["call"] != run1["call"]
    check_result_against_call(result, by_call[result["call"]], session_dir)
    kinds = [e["type"] for e in queue_events(events(storage, session_dir), job)]
    assert kinds == ["queue.claim", "queue.start", "queue.claim", "queue.start", "queue.finish"]
    claims = [e for e in queue_events(events(storage, session_dir), job) if "lease" in e]
    assert claims[0]["lease"]["worker"] != claims[1]["lease"]["worker"]
    assert claims[1]["lease"]["worker"] == result["worker"]["id"]
    queue.assert_settled()


def test_sigkilled_worker_leaves_a_call_without_result_and_no_other_record(
    storage: Path, agent: str, queue: QueueCLI, tmp_path: Path, outbox: Path
) -> None:
    """docs/workers.md (SIGKILL), Q-5, I-3: a worker killed mid-job leaves the call received
    but no result of it anywhere (no tool_result, no log line, no result file); status and
    show say claimed with the holder gone; recover requeues it once; the next run is
    recorded and finished once."""
    flag = outbox / "ran-once"
    cmd = f"if [ -e {flag} ]; then echo again; else touch {flag}; sleep 30; fi"
    job = queue.publish(shell_job(cmd), name="killed")
    with worker(queue, tmp_path / "w1.jsonl") as proc:
        assert wait_for(lambda: flag.exists(), 20)
        proc.kill()
        proc.wait()
    session_dir = session_dir_of(storage)
    evs = events(storage, session_dir)
    (call1,) = [e["call"] for e in evs if e["type"] == "tool_call"]
    assert [e for e in evs if e["type"] == "tool_result"] == []
    assert [x for x in read_jsonl(log_of(storage, "tool/shell.exec")) if x["call"] == call1] == []
    status = check_status_counts(queue)
    assert status["claimed"] == 1
    shown = queue.run("show", job, "--json")
    assert shown.rc == 0 and shown.json()["state"] == "claimed", shown
    assert "result" not in shown.json() or shown.json()["result"] is None

    r = queue.run("recover", "--json")
    assert r.rc == 0 and [x["job"] for x in r.json()["requeued"]] == [job], r
    again = queue.run("recover", "--json")
    assert again.rc == 0 and again.json()["requeued"] == [], again
    rc, out, err = drain(queue)
    assert rc == 0 and TRACEBACK not in err, (out, err)
    state, result = queue.only_result(job)
    assert state == "done" and result["call"] != call1
    by_call = check_calls(storage, session_dir)
    assert set(by_call) == {result["call"]}
    check_result_against_call(result, by_call[result["call"]], session_dir)
    kinds = [e["type"] for e in queue_events(events(storage, session_dir), job)]
    assert kinds.count("queue.finish") == 1 and kinds.count("queue.claim") == 2
    queue.assert_settled()


def test_lost_run_is_recorded_as_lost_and_the_other_as_finished(
    storage: Path, agent: str, queue: QueueCLI, tmp_path: Path, outbox: Path
) -> None:
    """docs/workers.md (A lease taken away), Q-5: a worker stopped past its lease while its
    job runs; recover requeues the job and a second worker finishes it; the first, continued,
    reports the job lost (event, summary count, queue.lost) and finishes nothing: one result,
    of the second run's call, and no second queue.finish."""
    flag = outbox / "ran-once"
    cmd = f"if [ -e {flag} ]; then echo second; else touch {flag}; sleep 3; echo first; fi"
    job = queue.publish(shell_job(cmd), name="stale")
    out = tmp_path / "a.jsonl"
    with worker(queue, out, "--ttl", "1", "--worker", "A") as proc:
        assert wait_for(lambda: flag.exists(), 20)
        proc.send_signal(signal.SIGSTOP)
        try:
            requeued = wait_for(
                lambda: queue.run("recover").rc == 0 and queue.state(job) == "pending", 10, 0.2
            )
            assert requeued
            rc, b_out, err = drain(queue, "--worker", "B")
            assert rc == 0 and TRACEBACK not in err, (b_out, err)
        finally:
            proc.send_signal(signal.SIGCONT)
        assert wait_for(lambda: '"lost"' in out.read_text(), 15)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    a_out = [json.loads(x) for x in lines_of(out)]
    lost = [e for e in a_out if e["event"] == "lost"]
    assert [e["job"] for e in lost] == [job]
    assert [e for e in a_out if e["event"] == "finish"] == []
    assert (a_out[-1]["done"], a_out[-1]["failed"], a_out[-1]["lost"]) == (0, 0, 1)
    assert (b_out[-1]["done"], b_out[-1]["failed"], b_out[-1]["lost"]) == (1, 0, 0)
    state, result = queue.only_result(job)
    assert state == "done" and result["output"] == "second\n" and result["worker"]["id"] == "B"
    session_dir = session_dir_of(storage)
    by_call = check_calls(storage, session_dir)
    assert len(by_call) == 2 and result["call"] in by_call
    check_result_against_call(result, by_call[result["call"]], session_dir)
    kinds = Counter(e["type"] for e in queue_events(events(storage, session_dir), job))
    assert kinds == {"queue.claim": 2, "queue.start": 2, "queue.finish": 1, "queue.lost": 1}
    queue.assert_settled()


def test_calls_of_a_killed_concurrent_worker_can_be_told_apart(
    storage: Path, agent: str, queue: QueueCLI, tmp_path: Path, outbox: Path
) -> None:
    """S-2 (history is auditable), docs/workers.md: a worker running two jobs at once is
    SIGKILLed; neither job has a result.  Each received call in its session must still be
    attributable to the job it ran (the job named by the call, or the call by the job's
    events): the two runs are otherwise indistinguishable once the jobs run again."""
    for tag in ("left", "right"):
        queue.publish(shell_job(f"touch {outbox}/{tag}; sleep 30"), name=tag)
    with worker(queue, tmp_path / "w.jsonl", "--concurrency", "2") as proc:
        session_dir = None

        def both_called() -> bool:
            nonlocal session_dir
            if not ((outbox / "left").exists() and (outbox / "right").exists()):
                return False
            session_dir = session_dir_of(storage)
            evs = events(storage, session_dir)
            return len([e for e in evs if e["type"] == "tool_call"]) == 2

        assert wait_for(both_called, 20)
        proc.kill()
        proc.wait()
    evs = events(storage, session_dir)
    calls = {e["call"]: e for e in evs if e["type"] == "tool_call"}
    attributed: dict[str, str] = {}
    for job in ("left.req.json", "right.req.json"):
        for e in queue_events(evs, job):
            if e.get("call") in calls:
                attributed[e["call"]] = job
    for call, e in calls.items():
        named = e.get("job") or (e.get("queue") or {}).get("job")
        if named:
            attributed.setdefault(call, named)
    assert set(attributed) == set(calls), attributed
    assert sorted(attributed.values()) == ["left.req.json", "right.req.json"]


# ------------------------------------------------------------------------------ unrecorded


def test_a_call_its_log_refuses_leaves_its_job_claimed_and_runs_again(
    storage: Path, agent: str, queue: QueueCLI
) -> None:
    """T-7, docs/workers.md (what the worker records): a tool log made immutable refuses the
    call's line (EPERM): the worker stops with exit 1, writes no result, and its last JSON
    line is the error naming the job; the session holds the call, the log does not; after
    recover the job runs again, both calls in the session, the second in the log too."""
    log = log_of(storage, "tool/shell.exec")
    if subprocess.run(["chattr", "+i", str(log)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available on this filesystem")
    try:
        job = queue.publish(shell_job("echo recorded"), name="unlogged")
        queue.publish(shell_job("echo later"), name="after")
        rc, out, err = drain(queue)
    finally:
        subprocess.run(["chattr", "-i", str(log)], check=True)
    assert rc == 1 and TRACEBACK not in err, (out, err)
    assert out[-1]["errno"] == 1 and out[-1]["error"] == "EPERM" and job in out[-1]["message"]
    stop = out[-2]
    assert stop["event"] == "stop" and stop["stopped_by"] == "failure"
    assert (stop["done"], stop["failed"], stop["lost"]) == (0, 0, 0)
    assert job in stop["failure"]
    assert [e["job"] for e in out if e.get("event") == "claim"] == [job]
    assert queue.state(job) == "claimed" and terminal_results(queue) == {}
    assert queue.entries("pending") == {"after.req.json"}
    session_dir = session_dir_of(storage)
    evs = events(storage, session_dir)
    (call1,) = [e["call"] for e in evs if e["type"] == "tool_call"]
    check_calls(storage, session_dir, unlogged=frozenset({call1}))
    assert [e["type"] for e in queue_events(evs, job)] == ["queue.claim", "queue.start"]
    check_status_counts(queue)

    r = queue.run("recover", "--json")
    assert r.rc == 0 and [x["job"] for x in r.json()["requeued"]] == [job], r
    rc, out, err = drain(queue)
    assert rc == 0 and TRACEBACK not in err, (out, err)
    assert out[-1]["done"] == 2
    state, result = queue.only_result(job)
    assert state == "done" and result["call"] != call1
    by_call = check_calls(storage, session_dir, unlogged=frozenset({call1}))
    check_result_against_call(result, by_call[result["call"]], session_dir)
    assert len(by_call) == 3
    queue.assert_settled()
