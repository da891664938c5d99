"""SPEC §3 (workers: W-1, W-3, W-4) and §4 (sessions, logs and events: S-1 … S-6) read
sentence by sentence, with the command lines, exit statuses and paths SPEC writes:

* S-1, S-2: the example event of S-2, stored at either literal session layout, is read back as
  it is by ``ctx session show``/``tail``/``list``; every event a worker records starts with the
  six keys of S-2 in that order, with a UTC ``ts``, whatever the worker's time zone;
* W-1, §2.4: ``ctx queue work`` finds its queue by ``--storage DIR``, by a queue path given
  to ``--project``, by ``--queue`` and by ``CTX_PROJECT``; a missing queue is refused (exit 1)
  and a malformed command line is a usage error (exit 2), nothing claimed either way;
* W-3, S-5: two workers with two slots each, recording into one session file, run every job
  once and leave only whole lines, each call with its ``tool_call`` and ``tool_result``;
* W-4: SIGTERM to the worker's whole process group (what a service manager sends) lets the
  running job finish, then the worker exits 0;
* S-3, S-4: the tool's log names the worker's session; a secret in the last stderr line of a
  failing job reaches no log; no ``audit/`` appears anywhere in the root;
* S-5: ``ctx session repair --json`` of a worker session with a torn tail, and again;
* S-6: a hand-made ``agent/<name>.d/shared`` grants no shared space.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    ROOT_ENTRIES,
    QueueCLI,
    clean_env,
    ctx_run,
    rfc3339,
    wait_for,
)
from tests.acceptance.workercli import AGENT, result_of, shell_job
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage

S2_ORDER = ["ts", "type", "agent", "session", "object", "status"]
# S-2, character for character.
S2_EXAMPLE = (
    '{"ts":"2026-06-22T12:00:00Z","type":"tool.call","agent":"coder","session":"default",'
    '"object":"tool/fs.read","status":"ok"}'
)
DEADLINE = 30

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root")


# ------------------------------------------------------------------------------ helpers


def agent_uid(storage: Path, name: str = AGENT) -> int:
    shown = ctx_run("agent", "show", name, "--json", env=clean_env(CTX_STORAGE=str(storage)))
    assert shown.rc == 0, shown
    return shown.json()["identity"]["uid"]


def worker_session(storage: Path, session: str) -> Path:
    """S-1: ``home/<uid>/agent/<agent>/session/<session>/events.jsonl``, the agent's uid."""
    return (
        storage
        / "home"
        / str(agent_uid(storage))
        / "agent"
        / AGENT
        / "session"
        / session
        / "events.jsonl"
    )


def whole_events(path: Path) -> list[dict]:
    """Every line of ``path``: each a whole JSON object ending in a newline (S-5)."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-200:]
    events = []
    for line in data.split(b"\n")[:-1]:
        event = json.loads(line)
        assert isinstance(event, dict), line
        events.append(event)
    return events


def pending(queue: QueueCLI) -> set[str]:
    return queue.entries("pending")


# ------------------------------------------------------------------------------ S-1, S-2


@pytest.mark.parametrize("where", ["home", "shared"])
def test_s1_s2_the_example_event_of_spec_is_read_back_as_stored(
    storage: Path, queue: QueueCLI, where: str
) -> None:
    """S-2's example event, in a session at either layout of S-1 (agent ``coder``, which does
    not exist: sessions are ordinary directories), is one event for every reader: ``show
    --json`` and ``tail -n 1 --json`` print it byte for byte, text ``show`` one line naming
    its type, object and status, ``list --json`` the one session ``default``."""
    if where == "home":
        session_dir = storage / "home" / "1234" / "agent" / "coder" / "session" / "default"
        scope: tuple[str, ...] = ()
    else:
        session_dir = storage / "shared" / "proj" / "agent" / "coder" / "session" / "default"
        scope = ("--project", "proj")
    session_dir.mkdir(parents=True)
    (session_dir / "events.jsonl").write_text(S2_EXAMPLE + "\n")
    env = clean_env(CTX_STORAGE=str(storage))

    shown = ctx_run("session", "show", "coder", *scope, "--json", env=env)
    assert shown.rc == 0 and shown.out == S2_EXAMPLE + "\n", shown
    tail = ctx_run("session", "tail", "coder", "default", "-n", "1", *scope, "--json", env=env)
    assert tail.rc == 0 and tail.out == S2_EXAMPLE + "\n", tail
    text = ctx_run("session", "show", "coder", "--session", "default", *scope, env=env)
    assert text.rc == 0 and len(text.lines()) == 1, text
    assert text.lines()[0].split()[:4] == [
        "2026-06-22T12:00:00Z",
        "tool.call",
        "tool/fs.read",
        "ok",
    ]
    listed = ctx_run("session", "list", "coder", *scope, "--json", env=env)
    assert listed.rc == 0, listed
    assert listed.json() == [{"name": "default", "path": str(session_dir)}], listed


@needs_root
def test_w1_s1_s2_worker_events_start_with_the_six_keys_in_order_and_a_utc_ts(
    storage: Path, queue: QueueCLI, agent: str
) -> None:
    """W-1, S-1, S-2: a worker run in another time zone (``TZ=Asia/Tokyo``) records its job in
    ``home/<uid>/agent/ci/session/nightly/events.jsonl`` (``--session nightly``): the queue's
    claim, the tool's ``tool_call`` and ``tool_result`` and the finish, each event starting
    with ``ts`` (RFC 3339, UTC, ``Z``), ``type``, ``agent`` (the worker's agent), ``session``
    (the session's name), ``object`` and ``status``."""
    job = queue.publish(shell_job("echo tz"), name="tz")
    env = clean_env(CTX_STORAGE=str(storage), TZ="Asia/Tokyo")
    r = queue.run("work", "--agent", AGENT, "--drain", "--session", "nightly", env=env)
    assert r.rc == 0, r
    assert queue.state(job) == "done"
    events = whole_events(worker_session(storage, "nightly"))
    types = [e["type"] for e in events]
    assert types.count("tool_call") == types.count("tool_result") == 1, types
    assert types.index("tool_call") < types.index("tool_result"), types
    for event in events:
        assert list(event)[:6] == S2_ORDER, event
        assert event["ts"].endswith("Z"), event
        assert rfc3339(event["ts"].replace("Z", "+00:00")).utcoffset().total_seconds() == 0
        assert (event["agent"], event["session"]) == (AGENT, "nightly"), event
        assert event["status"] in ("ok", "error"), event
    call, res = (next(e for e in events if e["type"] == t) for t in ("tool_call", "tool_result"))
    assert call["object"] == res["object"] == "tool/shell.exec", (call, res)
    assert call["call"] == res["call"] and res["status"] == "ok", (call, res)


# ------------------------------------------------------------------------------ W-1, §2.4


@needs_root
@pytest.mark.parametrize("how", ["storage-option", "project-path", "queue-option", "ctx-project"])
def test_w1_24_work_finds_its_queue_every_way_the_cli_names_one(
    storage: Path, queue: QueueCLI, agent: str, how: str
) -> None:
    """§2.4: all commands take ``--storage DIR`` (or ``CTX_STORAGE``) and ``--project NAME``
    (or a queue path); ``ctx queue work`` runs the job found each way and drains (W-2)."""
    job = queue.publish(shell_job(f"echo {how}"), name=how)
    # A worker needs its storage root besides its queue (the agent, the tools): a queue path
    # comes with CTX_STORAGE, whose place is not inferred from the path.
    root = clean_env(CTX_STORAGE=str(storage))
    args, env = {
        "storage-option": (("--storage", storage, "--project", "proj"), clean_env()),
        "project-path": (("--project", queue.dir), root),
        "queue-option": (("--queue", queue.dir), root),
        "ctx-project": ((), clean_env(CTX_STORAGE=str(storage), CTX_PROJECT="proj")),
    }[how]
    r = ctx_run("queue", "work", *args, "--agent", AGENT, "--drain", env=env, timeout=60)
    assert r.rc == 0, r
    assert queue.state(job) == "done", r
    assert result_of(queue, job)["output"] == f"{how}\n"


def test_24_work_on_a_project_without_a_queue_exits_1_and_creates_nothing(
    storage: Path, queue: QueueCLI
) -> None:
    """§2.4 exit 1 (operation refused): ``ctx queue work --project nosuch --drain`` names the
    missing queue and how to make it; no ``shared/nosuch`` appears and the queue of ``proj``
    is left alone."""
    job = queue.publish(name="stays")
    r = ctx_run(
        "queue", "work", "--project", "nosuch", "--agent", AGENT, "--drain",
        env=clean_env(CTX_STORAGE=str(storage)),
    )  # fmt: skip
    assert r.rc == 1, r
    assert "ENOENT" in r.err and "ctx queue init --project nosuch" in r.err, r
    assert not (storage / "shared" / "nosuch").exists()
    assert pending(queue) == {job}


@pytest.mark.parametrize(
    "args",
    [
        ("--max-jobs", "0"),
        ("--concurrency", "0"),
        ("--concurrency", "1025"),
        ("--session", "a/b"),
        ("--session", "x.d"),
        ("--agent", ""),
        ("--timeout", "0"),
        ("--ttl", "0.5"),
        ("--no-such-option",),
    ],
)
def test_24_malformed_work_command_lines_exit_2_and_claim_nothing(
    storage: Path, queue: QueueCLI, args: tuple[str, ...]
) -> None:
    """§2.4: exit status 2 is a usage error; W-1: a worker refused so claims nothing."""
    job = queue.publish(name="untouched")
    r = queue.run("work", "--drain", *args)
    assert r.rc == 2, r
    assert r.out == "", r
    assert pending(queue) == {job}
    assert queue.entries("claimed") == queue.entries("lease") == set()


# ------------------------------------------------------------------------------ W-3, S-5


@needs_root
def test_w3_s5_two_workers_recording_into_one_session_run_each_job_once_in_whole_lines(
    storage: Path, queue: QueueCLI, agent: str
) -> None:
    """W-3 (several workers at once; none double-executes a job) and S-5 (concurrent appenders
    never interleave inside a line): two workers of two slots each, both recording into
    session ``pool``; every job ends done with its own output, every line of the one
    ``events.jsonl`` is a whole event, each job is claimed and finished once, and each call
    has exactly one ``tool_call`` and one ``tool_result``."""
    jobs = {queue.publish(shell_job(f"echo out-{n}"), name=f"pool{n:02d}"): n for n in range(12)}
    argv = [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", AGENT]
    argv += ["--drain", "--concurrency", "2", "--session", "pool"]
    env = clean_env(CTX_STORAGE=str(storage))
    workers = [
        subprocess.Popen([*argv, "--worker", f"w{i}"], env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]  # fmt: skip
    try:
        outcomes = [w.communicate(timeout=90) for w in workers]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.communicate()
    for w, (_, err) in zip(workers, outcomes, strict=True):
        assert w.returncode == 0, err
    for job, n in jobs.items():
        assert queue.state(job) == "done", job
        assert result_of(queue, job)["output"] == f"out-{n}\n"
    events = whole_events(worker_session(storage, "pool"))
    for step in ("queue.claim", "queue.finish"):
        named = sorted(e["object"] for e in events if e["type"] == step)
        assert named == sorted(f"queue/{j}" for j in jobs), (step, named)
    calls: dict[str, list[str]] = {}
    for event in events:
        if event["type"] in ("tool_call", "tool_result"):
            calls.setdefault(event["call"], []).append(event["type"])
    assert len(calls) == len(jobs), calls
    assert all(kinds == ["tool_call", "tool_result"] for kinds in calls.values()), calls
    ran = sorted(e["job"] for e in events if e["type"] == "tool_call")
    assert ran == sorted(jobs), ran


# ------------------------------------------------------------------------------ W-4


@needs_root
def test_w4_sigterm_to_the_workers_process_group_lets_the_job_finish_then_exit_0(
    storage: Path, queue: QueueCLI, agent: str, outbox: Path
) -> None:
    """W-4: SIGTERM to a worker lets the running job finish, then it exits cleanly; sent to
    the worker's whole process group (``kill -TERM -PGID``, as a service manager stops a
    service) the job's tool, in a process group of its own, is not cut short either."""
    started, go = outbox / "started", outbox / "go"
    cmd = f"touch {started}; until [ -e {go} ]; do sleep 0.05; done; echo finished"
    job = queue.publish(shell_job(cmd), name="grp")
    proc = subprocess.Popen(
        [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", AGENT, "--json"],
        env=clean_env(CTX_STORAGE=str(storage)), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert wait_for(started.exists, DEADLINE)
        os.killpg(proc.pid, signal.SIGTERM)
        # The tool goes on after the signal: it still waits for ``go``, its job unfinished.
        assert not wait_for(lambda: queue.state(job) != "claimed", 1)
        go.touch()
        out, err = proc.communicate(timeout=DEADLINE)
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert queue.state(job) == "done"
    assert result_of(queue, job)["output"] == "finished\n"
    stop = json.loads(out.splitlines()[-1])
    assert stop["event"] == "stop" and stop["stopped_by"] == "SIGTERM", out


# ------------------------------------------------------------------------------ S-3, S-4


@needs_root
def test_s3_s4_logs_live_with_their_object_and_keep_no_secret_from_a_failing_job(
    storage: Path, queue: QueueCLI, agent: str
) -> None:
    """S-3: the tool's ``tool/shell.exec.d/log`` holds the worker's call and names the session
    it was recorded in; the agent's ``agent/ci.d/log`` is there; no ``audit`` entry appears
    anywhere in the root, whose entries stay the six of R-2.  S-4: the last stderr line of a
    failing job (quoted in its error) carries a password and an API key: the session, the
    tool's log and the agent's log hold neither."""
    secrets = ("hunter2-sesame", "sk-abcdefghijklmnopqrstuvwx0123")
    cmd = f"echo password={secrets[0]} >&2; echo api_key={secrets[1]} >&2; exit 3"
    job = queue.publish(shell_job(cmd), name="leaky")
    r = queue.run("work", "--agent", AGENT, "--drain")
    assert r.rc == 0, r
    assert queue.state(job) == "failed"
    assert "exited with status 3" in result_of(queue, job)["reason"]

    uid = agent_uid(storage)
    tool_log = storage / "tool" / "shell.exec.d" / "log"
    lines = whole_events(tool_log)
    mine = [e for e in lines if e.get("job") == job or job in json.dumps(e)]
    assert mine, lines
    assert mine[-1]["session"] == "worker", mine[-1]
    assert mine[-1]["session_dir"] == f"home/{uid}/agent/{AGENT}/session/worker", mine[-1]
    assert (storage / "agent" / f"{AGENT}.d" / "log").is_file()
    assert set(os.listdir(storage)) == ROOT_ENTRIES
    for _dirpath, dirnames, filenames in os.walk(storage):
        assert "audit" not in dirnames + filenames, _dirpath
    for log in (worker_session(storage, "worker"), tool_log, storage / "agent" / "ci.d" / "log"):
        text = log.read_text()
        for secret in secrets:
            assert secret not in text, (log, secret)


# ------------------------------------------------------------------------------ S-5


@needs_root
def test_s5_repair_json_of_a_worker_session_cuts_the_torn_tail_then_has_nothing_to_do(
    storage: Path, queue: QueueCLI, agent: str
) -> None:
    """S-5: readers ignore and ``ctx session repair`` truncates a torn last line.  On the
    worker's own session: ``repair --json`` answers exactly ``session``, ``truncated_bytes``,
    ``tightened`` and ``left``, cuts the torn bytes and only them; run again it cuts nothing
    (text: ``nothing to do``)."""
    queue.publish(shell_job("echo a"), name="a")
    assert queue.run("work", "--agent", AGENT, "--drain").rc == 0
    path = worker_session(storage, "worker")
    whole = path.read_bytes()
    torn = b'{"ts":"2026-06-22T12:00:00Z","type":"tool_res'
    with open(path, "ab") as f:
        f.write(torn)
    env = clean_env(CTX_STORAGE=str(storage))
    shown = ctx_run("session", "show", AGENT, "worker", "--json", env=env)
    assert shown.rc == 0, shown
    assert [json.loads(line) for line in shown.lines()] == [
        json.loads(line) for line in whole.splitlines()
    ]
    r = ctx_run("session", "repair", AGENT, "worker", "--json", env=env)
    assert r.rc == 0, r
    answer = r.json()
    assert set(answer) == {"session", "truncated_bytes", "tightened", "left"}, answer
    uid = agent_uid(storage)
    assert answer["session"] == f"home/{uid}/agent/{AGENT}/session/worker", answer
    assert answer["truncated_bytes"] == len(torn), answer
    assert path.read_bytes() == whole
    again = ctx_run("session", "repair", AGENT, "worker", "--json", env=env)
    assert again.rc == 0 and again.json()["truncated_bytes"] == 0, again
    text = ctx_run("session", "repair", AGENT, "worker", env=env)
    assert text.rc == 0 and "nothing to do" in text.out, text


# ------------------------------------------------------------------------------ S-6


@needs_root
def test_s6_a_hand_made_agent_shared_control_grants_no_shared_space(
    storage: Path, queue: QueueCLI, agent: str
) -> None:
    """S-6: there is no ``agent/<name>.d/shared``: ``ctx agent create`` makes none, and one
    written by hand naming ``proj`` gives the agent nothing: a call recorded in that space's
    session (``ctx run --project proj``) is refused as the Linux permissions and policy v0
    decide (126, EACCES), and nothing is created under ``shared/proj/agent/``."""
    controls = storage / "agent" / f"{AGENT}.d"
    assert not (controls / "shared").exists()
    (controls / "shared").write_text("proj\nwrite\n")
    r = ctx_run(
        "run", "--agent", AGENT, "--project", "proj", "shell.exec", "echo", "hi",
        env=clean_env(CTX_STORAGE=str(storage)),
    )  # fmt: skip
    assert r.rc == 126, r
    assert "EACCES" in r.err, r
    assert "hi" not in r.out, r
    assert os.listdir(storage / "shared" / "proj" / "agent") == []
