"""The second day: an operator maintains a CortexFS storage root that has been used.

A root with history is built once per run (a second test process takes a copy, moved to a
place of its own as docs/policy.md says a root is moved) and kept as a tar archive: ``ctx
bootstrap``, the space ``ops`` (``ctx shared create --group``), agents ``alpha`` (uid
``nobody``, in the space's group) and ``beta`` (the test user), the tool ``ops.echo``
installed, called in a session and installed again, fifty ``shell.exec`` jobs published in one
batch and worked by ``ctx queue work`` (ten of them fail), a call recorded in a shared session,
and a terminal started and stopped.  Each test gets that root back, restored in place, and
does what an operator does the day after, as the docs describe it: read what happened
(``queue status/list/show``, ``session list/show``, tool and agent logs), archive finished
jobs by moving whole pairs, run ``ctx queue recover`` on the idle queue, run ``ctx bootstrap``
again, remove a tool (docs/tools.md "Removing a projected tool": executable first, then its
control directory), an agent and a space by hand, revoke grants, rotate or truncate a tool's
``log`` and a session's ``events.jsonl``, back up and restore a space with ``tar`` while it
is idle, and copy the whole root to a new place (docs/policy.md, "Mounts (step 3)").  After
each step the rest must keep working (a new job published and run, a new session recorded,
``ctx policy explain`` right) and nothing of what was removed may still act: no tool of a
removed agent runs (``ctx run``, a worker, a running terminal, its ``ctx mount --as`` view),
a removed space is no queue and no tier.

SPEC ids: R-2, R-5, Q-1, Q-5, Q-6, Q-8, I-5, §2.4, W-1, W-2, S-1, S-2, S-3, S-5, P-5, P-6,
P-8, T-1, T-4, T-7, T-8, T-8a, A-2, A-3, X-1, F-1.  Docs: queue.md (Layout and states, What a
crash leaves, Command line), workers.md (One job, A host that runs short), sessions.md (Where
sessions live, Appending, Reading, Commands, An agent's log, Shared spaces), tools.md (A tool
on disk, Listing and resolving, CTX_PATH, Agents host side, The agent terminal, Running a tool,
Removing a projected tool, ctx bootstrap), policy.md (Mounts, Commands, Errors you will see),
mount.md (a view whose agent is removed), README (Upgrading), ``ctx bootstrap --help``."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    serving,
    snapshot,
    wait_for,
)
from tests.acceptance.terminalcli import Raw
from tests.support.users import find_or_create_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="agents of other uids, a terminal and a FUSE view need root, bwrap and /dev/fuse",
)

SCRATCH = scratch_top(__file__)
SPACE = "ops"
TOOL = "ops.echo"
JOBS = 50
S2_KEYS = ["ts", "type", "agent", "session", "object", "status"]  # S-2, in this order
NOTHING_TO_DO = "nothing to do: the storage root is complete"
PER_JOB = ["queue.claim", "queue.start", "tool_call", "tool_result", "queue.finish"]

# ops.echo: its input (native: stdin; terminal: the one argument) back, with its version.
ECHO = """#!/bin/sh
if [ $# -gt 0 ]; then in=$1; else in=$(cat); fi
printf '{"v": @V@, "in": %s}\\n' "$in"
"""


def job_request(n: int) -> dict:
    """Job ``n`` of the first day: every fifth one fails (exit 3, a line on stderr)."""
    cmd = f"echo bad{n} >&2; exit 3" if n % 5 == 0 else f"echo job{n}"
    return {"tool": "shell.exec", "input": {"cmd": cmd}, "n": n}


def must(r: Run, rc: int = 0) -> Run:
    assert r.rc == rc, r
    return r


def write_manifest(directory: Path, version: int) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "echo.sh").write_text(ECHO.replace("@V@", str(version)))
    manifest = directory / f"{TOOL}.json"
    manifest.write_text(
        json.dumps(
            {
                "manifest": 2,
                "kind": "tool",
                "name": TOOL,
                "description": f"Echo, version {version}.",
                "schema": {"type": "object"},
                "cap": {"side_effects": False, "network": False},
                "exec": "echo.sh",
            }
        )
    )
    return manifest


def rewrite_without(path: Path, line: str) -> None:
    """``path`` written anew (root's, 0644, renamed into place) without the line ``line``."""
    kept = [x for x in path.read_text().splitlines() if x.strip() != line]
    assert len(kept) < len(path.read_text().splitlines()), (path, line)
    temp = path.with_name(path.name + ".edit")
    temp.write_text("".join(x + "\n" for x in kept))
    temp.chmod(0o644)
    os.replace(temp, path)


def sh(*argv: str | os.PathLike) -> None:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (argv, done.stdout, done.stderr)


# ------------------------------------------------------------------------ the first day


@dataclass
class History:
    """What the first day left: the root (kept as ``archive``) and what was done to it."""

    top: Path
    storage: Path
    archive: Path
    manifests: dict[int, Path]
    alpha_uid: int
    gid: int
    beta_uid: int
    jobs: dict[str, int]  # job name -> n
    beta_calls: list[str]  # call ids of beta's session s1, in order
    removals: list[subprocess.Popen] = field(default_factory=list)  # of used roots


def build_first_day(top: Path) -> dict:
    """The first day, lived in ``top/storage``; the facts the tests check against."""
    beta_user = find_or_create_user()
    nobody = pwd.getpwnam("nobody")
    storage = top / "storage"
    env = clean_env(CTX_STORAGE=str(storage))

    def ctx(*args, **kw) -> Run:
        return must(ctx_run(*args, env=env, **kw))

    ctx("bootstrap")
    manifests = {v: write_manifest(top / f"manifest-v{v}", v) for v in (1, 2)}
    alpha = {"name": "alpha", "label": "alpha_t", "tools": ["shell.exec", "fs.read", TOOL],
             "shared": {SPACE: ["read", "write"]}}  # fmt: skip
    beta = {"name": "beta", "label": "beta_t", "tools": [TOOL], "shared": {SPACE: ["read"]}}
    with ThreadPoolExecutor(3) as pool:  # three tiers, three locks: at once
        space = pool.submit(ctx, "shared", "create", SPACE, "--group", str(nobody.pw_gid))
        tool = pool.submit(ctx, "object", "install", manifests[1], "--tier", "system")
        made = ctx("agent", "create", "-", "--json", input=json.dumps(alpha)).json()
        ctx("agent", "create", "-", "--user", str(beta_user.uid), input=json.dumps(beta))
        space.result(), tool.result()
    assert made["identity"]["uid"] == nobody.pw_uid, made
    with open(storage / "tool" / f"{TOOL}.d" / "policy", "a") as rules:
        rules.write(f"allow alpha_t tool:{TOOL} execute\nallow beta_t tool:{TOOL} execute\n")
    with open(storage / "tool" / "shell.exec.d" / "policy", "a") as rules:
        rules.write("allow alpha_t tool:shell.exec execute\n")
    batch = "".join(json.dumps(job_request(n)) + "\n" for n in range(JOBS))
    names = ctx("queue", "publish", "--project", SPACE, "--batch", "-", input=batch).lines()
    assert len(set(names)) == JOBS, names
    worker = subprocess.Popen(
        [*CTX_ARGV, "queue", "work", "--project", SPACE, "--agent", "alpha", "--drain",
         "--concurrency", "8", "--json"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    try:  # while the worker drains the queue: calls in sessions, a reinstall, a terminal
        calls = []
        for x in (1, 2, 3):
            if x == 3:
                ctx("object", "install", manifests[2], "--tier", "system")
            r = ctx("run", "--agent", "beta", "--session", "s1", "--native", TOOL,
                    input=json.dumps({"x": x}))  # fmt: skip
            calls.append(json.loads(r.lines()[-1])["call"])
        ctx("run", "--agent", "alpha", "--project", SPACE, "--session", "sp1", "--native",
            "shell.exec", input='{"cmd": "echo in-space"}')  # fmt: skip
        try:
            ctx("agent", "start", "alpha", "--session", "t1", "--no-workspace", "--json")
        finally:
            ctx("agent", "stop", "alpha", "--session", "t1", "--json")
        out, err = worker.communicate(timeout=120)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, err
    stop = json.loads(out.splitlines()[-1])
    assert (stop["event"], stop["done"], stop["failed"], stop["lost"]) == ("stop", 40, 10, 0)
    return {"root": str(storage), "alpha_uid": nobody.pw_uid, "gid": nobody.pw_gid,
            "beta_uid": beta_user.uid, "jobs": {name: n for n, name in enumerate(names)},
            "beta_calls": calls}  # fmt: skip


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="module")
def history() -> Iterator[History]:
    """The first day, lived once per run by the first test process that needs it (the other
    waits on a lock, then takes a copy of it, moved to a directory of its own the way
    docs/policy.md says a root is moved: ``ctx bootstrap``, and the ``/ctx`` mount controls
    pointed at the new place)."""
    SCRATCH.mkdir(mode=0o755, exist_ok=True)
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
    shared_top = SCRATCH / f"first-day-{run}"
    with locked(SCRATCH / f"first-day-{run}.lock"):
        if (shared_top / "facts.json").is_file():
            top = new_scratch_dir(SCRATCH, "day2-")
            sh("tar", "-C", top, "-xpf", shared_top / "first-day.tar")
            for v in (1, 2):
                shutil.copytree(shared_top / f"manifest-v{v}", top / f"manifest-v{v}")
            facts = json.loads((shared_top / "facts.json").read_text())
            storage = top / "storage"
            # The files that name the root, as 'ctx bootstrap' rewrites the first three on a
            # moved root and docs/policy.md says to point the mount controls (the test of a
            # copied root checks that bootstrap does so; the test of bootstrap, that it finds
            # nothing left to do here).
            for name in ("agent/alpha", "agent/beta", "bin/ctxterm", "agent/alpha.d/mount",
                         "agent/beta.d/mount"):  # fmt: skip
                text = (storage / name).read_text()
                assert facts["root"] in text, name
                (storage / name).write_text(text.replace(facts["root"], str(storage)))
            owner = False
        else:
            for stale in SCRATCH.glob("first-day-*"):  # what an interrupted run left
                if time.time() - stale.lstat().st_mtime > 3600:
                    subprocess.run(["rm", "-rf", str(stale)], check=False)
            top = shared_top
            subprocess.run(["rm", "-rf", str(top)], check=False)  # a build that failed
            top.mkdir()
            top.chmod(0o755)
            facts = build_first_day(top)
            sh("tar", "-C", top, "--format=posix", "-cpf", top / "first-day.tar", "storage")
            (top / "facts.json").write_text(json.dumps(facts))
            storage, owner = top / "storage", True
    archive = top / "pristine.tar"
    sh("tar", "-C", top, "--format=posix", "-cpf", archive, "storage")
    made = History(top, storage, archive,
                   {v: top / f"manifest-v{v}" / f"{TOOL}.json" for v in (1, 2)},
                   facts["alpha_uid"], facts["gid"], facts["beta_uid"], facts["jobs"],
                   facts["beta_calls"])  # fmt: skip
    try:
        yield made
    finally:
        env = clean_env(CTX_STORAGE=str(storage))
        for session in ("t1", "t2"):  # a terminal a failed test left
            ctx_run("agent", "stop", "alpha", "--session", session, env=env)
        for removal in made.removals:
            removal.wait()
        if owner:
            with locked(SCRATCH / f"first-day-{run}.lock"):
                shutil.rmtree(top, ignore_errors=True)
            (SCRATCH / f"first-day-{run}.lock").unlink(missing_ok=True)
        else:
            shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------------ the second day


@dataclass
class Day(OnStorage):
    """The first day's root, restored in place for one test."""

    h: History
    storage: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    terminals: list[str] = field(default_factory=list)

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.storage, SPACE)

    @property
    def qdir(self) -> Path:
        return self.storage / "shared" / SPACE / "queue"

    def tool_dir(self, tool: str = TOOL) -> Path:
        return self.storage / "tool" / f"{tool}.d"

    def session_dir(self, agent: str, session: str) -> Path:
        uid = self.h.alpha_uid if agent == "alpha" else self.h.beta_uid
        return self.storage / "home" / str(uid) / "agent" / agent / "session" / session

    def status(self) -> dict:
        return must(self.queue.run("status", "--json")).json()

    def publish(self, req: dict) -> str:
        return must(self.queue.run("publish", "-", input=json.dumps(req))).out.strip()

    def drain(self, agent: str = "alpha", rc: int = 0) -> list[dict]:
        """``ctx queue work --drain --json`` as ``agent``: its events."""
        r = self.ctx("queue", "work", "--project", SPACE, "--agent", agent, "--drain", "--json")
        assert r.rc == rc, r
        return [json.loads(line) for line in r.lines()]

    def result(self, job: str) -> tuple[str, dict]:
        shown = must(self.queue.run("show", job, "--json")).json()
        return shown["state"], shown["result"]

    def a_new_job_runs(self, tag: str) -> None:
        """What must keep working after each step: a job published, run by alpha, done."""
        job = self.publish({"tool": "shell.exec", "input": {"cmd": f"echo {tag}"}})
        stop = self.drain()[-1]
        assert (stop["done"], stop["failed"], stop["lost"]) == (1, 0, 0), stop
        assert self.queue.state(job) == "done"  # done/J and done/J.result (SPEC 2.1)
        result = json.loads((self.qdir / "done" / f"{job}.result").read_text())
        assert (result["status"], result["output"]) == ("ok", f"{tag}\n"), result

    def explain(self, agent: str, obj: str, perm: str) -> dict:
        r = self.ctx("policy", "explain", agent, obj, perm, "--json")
        assert r.rc in (0, 1), r
        decision = r.json()
        assert decision["allowed"] is (r.rc == 0), r
        return decision

    def worker(self, agent: str, name: str) -> tuple[subprocess.Popen, Path]:
        """``ctx queue work --json`` as ``agent`` in the background, its stdout in a file."""
        out = self.h.top / f"{name}.out"
        with open(out, "wb") as sink:
            proc = subprocess.Popen(
                [*CTX_ARGV, "queue", "work", "--project", SPACE, "--agent", agent, "--json"],
                stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.PIPE, env=self.env,
            )  # fmt: skip
        self.procs.append(proc)
        assert wait_for(lambda: out.read_text().startswith('{"event": "start"'), 20), proc
        return proc, out


@pytest.fixture
def day(history: History) -> Iterator[Day]:
    used = history.top / f"used-{len(history.removals)}"
    os.rename(history.storage, used)  # the last test's root, removed while this one runs
    history.removals.append(subprocess.Popen(["rm", "-rf", "--one-file-system", str(used)]))
    sh("tar", "-C", history.top, "-xpf", history.archive)
    today = Day(history, history.storage)
    try:
        yield today
    finally:
        for proc in today.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        for session in today.terminals:
            today.ctx("agent", "stop", "alpha", "--session", session)


def events(path: Path) -> list[dict]:
    return read_jsonl(path)


PROMPT = "alpha$ "  # tsh's prompt in the terminal of agent alpha


def typed(client: Raw, line: str) -> str:
    """``line`` typed at tsh's prompt: what tsh printed before its next prompt."""
    prompts = client.count(PROMPT)
    client.type(line)
    assert client.shows(PROMPT, prompts + 1, 20), client.text()[-800:]
    echoed = client.text().split(PROMPT)[prompts]
    assert echoed.startswith(line + "\n"), (line, echoed)
    return echoed.removeprefix(line + "\n")


def without_inodes(document):
    if isinstance(document, dict):
        return {k: without_inodes(v) for k, v in document.items() if k != "inode"}
    if isinstance(document, list):
        return [without_inodes(v) for v in document]
    return document


# ------------------------------------------------------------------- reading the history


def test_status_list_and_show_read_back_the_fifty_jobs_of_the_first_day(day: Day) -> None:
    report = day.status()
    counts = {"pending": 0, "claimed": 0, "done": 40, "failed": 10, "conflict": 0}
    assert {k: report[k] for k in counts} == counts, report
    assert report["counts"] == {**counts, "incomplete": 0, "ignored": 0}, report
    for key in ("ignored", "incomplete", "conflicts", "temps", "owned_by_others",
                "group_not_inherited"):  # fmt: skip
        assert report[key] == [], (key, report)
    assert report["queue"] == str(day.qdir)

    failed = {name for name, n in day.h.jobs.items() if n % 5 == 0}
    listed = must(day.queue.run("list", "--state", "failed"))
    assert sorted(listed.lines()) == sorted(failed), listed
    every = must(day.queue.run("list"))  # 'STATE NAME' lines
    assert sorted(tuple(line.split()) for line in every.lines()) == sorted(
        ("failed" if name in failed else "done", name) for name in day.h.jobs
    ), every
    as_json = must(day.queue.run("list", "--json")).json()
    assert sorted((e["name"], e["state"]) for e in as_json) == sorted(
        (name, "failed" if name in failed else "done") for name in day.h.jobs
    )

    by_n = {n: name for name, n in day.h.jobs.items()}
    for n in (4, 5, 10, 11):
        state, result = day.result(by_n[n])
        assert result["worker"]["id"], result
        if n % 5 == 0:
            assert (state, result["status"]) == ("failed", "error"), result
            assert result["reason"] == f"shell.exec exited with status 3: bad{n} [exit]", result
            assert (result["error"]["stage"], result["error"]["errno"]) == ("exit", None)
            assert result["exit_status"] == 3, result
        else:
            assert (state, result["status"], result["output"]) == ("done", "ok", f"job{n}\n")
    shown = must(day.queue.run("show", next(iter(failed)), "--json")).json()
    assert [e["path"] for e in shown["evidence"]] == [
        f"failed/{shown['name']}",
        f"failed/{shown['name']}.result",
    ], shown
    assert shown["request"]["input"] == job_request(day.h.jobs[shown["name"]])["input"]


def test_the_worker_session_and_the_tool_log_hold_each_job_once_in_order(day: Day) -> None:
    r = must(day.ctx("session", "show", "alpha", "worker", "--json"))
    timeline = [json.loads(line) for line in r.lines()]
    assert timeline == events(day.session_dir("alpha", "worker") / "events.jsonl")
    assert all(list(e)[:6] == S2_KEYS for e in timeline), timeline[0]
    per_job: dict[str, list[dict]] = {}
    calls: dict[str, str] = {}
    for e in timeline:
        if e["type"].startswith("queue."):
            assert e["queue"] == f"shared/{SPACE}/queue", e
            per_job.setdefault(e["object"].removeprefix("queue/"), []).append(e)
        elif e["type"] == "tool_call":
            per_job.setdefault(e["job"], []).append(e)
            calls[e["call"]] = e["job"]
        else:
            assert e["type"] == "tool_result", e
            per_job[calls[e["call"]]].append(e)
    assert set(per_job) == set(day.h.jobs)
    for job, seen in per_job.items():
        assert [e["type"] for e in seen] == PER_JOB, (job, seen)
        want = "error" if day.h.jobs[job] % 5 == 0 else "ok"
        assert seen[3]["status"] == want, seen

    log = [e for e in events(day.tool_dir("shell.exec") / "log") if e["session"] == "worker"]
    assert len(log) == JOBS, log[:2]
    assert {e["call"]: e["job"] for e in log} == calls
    assert {(e["session"], e["session_dir"], e["type"]) for e in log} == {
        ("worker", f"home/{day.h.alpha_uid}/agent/alpha/session/worker", "tool_result")
    }
    listed = must(day.ctx("session", "list", "alpha", "--json")).json()
    assert sorted(s["name"] for s in listed) == ["t1", "worker"], listed
    in_space = must(day.ctx("session", "list", "alpha", "--project", SPACE))
    assert in_space.lines() == ["sp1"], in_space


def test_the_reinstalled_tool_kept_its_policy_and_its_log_of_both_versions(day: Day) -> None:
    log = events(day.tool_dir() / "log")
    assert [e["call"] for e in log] == day.h.beta_calls, log
    assert [e["output"]["v"] for e in log] == [1, 1, 2], log
    assert [e["input"] for e in log] == [{"x": 1}, {"x": 2}, {"x": 3}], log
    timeline = events(day.session_dir("beta", "s1") / "events.jsonl")
    assert [(e["type"], e["call"]) for e in timeline] == [
        (kind, call) for call in day.h.beta_calls for kind in ("tool_call", "tool_result")
    ]
    policy = (day.tool_dir() / "policy").read_text().splitlines()
    assert {f"allow alpha_t tool:{TOOL} execute", f"allow beta_t tool:{TOOL} execute"} <= set(
        policy
    )
    listed = must(day.ctx("object", "list", "--tier", "system", "--json")).json()
    (entry,) = [e for e in listed if e["name"] == TOOL]
    assert (entry["status"], entry["description"], entry["problems"]) == (
        "available",
        "Echo, version 2.",
        [],
    ), entry


def test_the_agent_logs_record_creation_and_the_terminal_that_ran(day: Day) -> None:
    alpha = events(day.storage / "agent" / "alpha.d" / "log")
    assert [e["type"] for e in alpha] == ["agent.created", "terminal.started", "terminal.stopped"]
    assert all(list(e)[:6] == S2_KEYS for e in alpha), alpha
    created, started, stopped = alpha
    assert (created["session"], created["uid"], created["label"]) == (
        "",
        day.h.alpha_uid,
        "alpha_t",
    )
    assert (started["session"], started["workspace"]) == ("t1", None), started
    assert (stopped["session"], stopped["reason"]) == ("t1", "stop"), stopped
    beta = events(day.storage / "agent" / "beta.d" / "log")
    assert [(e["type"], e["uid"]) for e in beta] == [("agent.created", day.h.beta_uid)], beta
    shown = must(day.ctx("agent", "show", "alpha", "--json")).json()
    assert (shown["terminals"], shown["problems"]) == ([], []), shown
    assert not (day.session_dir("alpha", "t1") / "terminal").exists()


# -------------------------------------------------------------- checks that change nothing


def test_bootstrap_again_on_the_used_root_has_nothing_to_do_and_changes_nothing(
    day: Day,
) -> None:
    def kept() -> dict:
        # A tier's hidden .install-lock is made by the first install or bootstrap, and kept.
        return {k: v for k, v in snapshot(day.storage).items() if ".install-lock" not in k}

    before = kept()
    text = must(day.ctx("bootstrap"))
    assert text.lines() == [f"storage root: {day.storage}", NOTHING_TO_DO], text
    after_first = snapshot(day.storage)
    report = must(day.ctx("bootstrap", "--json")).json()
    assert report == {"root": str(day.storage), "created": [], "repaired": [], "problems": [],
                      "warnings": []}  # fmt: skip
    assert snapshot(day.storage) == after_first  # run twice, the second run changes nothing
    assert kept() == before


def test_recover_on_the_idle_queue_is_consistent_and_moves_nothing(
    day: Day,
) -> None:
    before = snapshot(day.qdir)
    for args, reconcile, dry in (((), False, False), (("--reconcile",), True, False),
                                 (("--reconcile", "--dry-run"), True, True)):  # fmt: skip
        report = must(day.queue.run("recover", "--json", *args)).json()
        assert (report["reconcile"], report["dry_run"], report["consistent"]) == (
            reconcile, dry, True,
        ), report  # fmt: skip
        for key in ("requeued", "repaired", "untouched", "incomplete", "conflicts",
                    "removed_temps", "stale_temps", "ignored", "errors"):  # fmt: skip
            assert report[key] == [], (key, report)
        assert snapshot(day.qdir) == before


# ---------------------------------------------------------------- archiving finished jobs


def test_whole_finished_pairs_archived_by_hand_leave_a_consistent_queue(day: Day) -> None:
    archive = day.h.top / "archive"
    archive.mkdir()
    moved = {}
    for state in ("done", "failed"):
        names = sorted(n for n in os.listdir(day.qdir / state) if not n.endswith(".result"))
        for name in names[: 10 if state == "done" else None]:
            for piece in (name, f"{name}.result"):
                moved[piece] = (day.qdir / state / piece).read_bytes()
                shutil.move(day.qdir / state / piece, archive / piece)
    assert len(moved) == 40
    report = day.status()
    assert (report["done"], report["failed"], report["conflict"]) == (30, 0, 0), report
    assert must(day.queue.run("list", "--state", "failed")).out == ""
    recovered = must(day.queue.run("recover", "--reconcile", "--json")).json()
    assert recovered["consistent"] is True and recovered["repaired"] == [], recovered
    gone = sorted(moved)[0]
    shown = day.queue.run("show", gone, "--json")
    assert shown.rc == 1 and (shown.json()["error"], shown.json()["errno"]) == ("ENOENT", 2)
    assert shown.err.startswith(f"ctx: ENOENT: job {gone} has no evidence in {day.qdir}"), shown
    assert {p: (archive / p).read_bytes() for p in moved} == moved
    # once no evidence of the name is left in the queue, it is a name like any other.
    again = must(day.queue.run("publish", "--name", gone, "-", input='{"tool": "shell.exec", '
                               '"input": {"cmd": "echo reused"}}'))  # fmt: skip
    assert again.lines() == [gone], again
    assert day.drain()[-1]["done"] == 1
    state, result = day.result(gone)
    assert (state, result["output"]) == ("done", "reused\n"), result


def test_half_an_archived_pair_is_a_conflict_that_recover_never_resolves(day: Day) -> None:
    job = sorted(n for n, i in day.h.jobs.items() if i % 5)[0]
    aside = day.h.top / "aside"
    aside.mkdir()
    shutil.move(day.qdir / "done" / f"{job}.result", aside)
    r = day.queue.run("status", "--json")
    assert r.rc == 1, r
    (conflict,) = r.json()["conflicts"]
    assert conflict["job"] == job and f"done/{job}" in conflict["evidence"], conflict
    assert r.json()["done"] == 39 and r.json()["conflict"] == 1, r.json()
    listed = day.queue.run("list", "--state", "conflict")
    assert (listed.rc, listed.lines()) == (1, [job]), listed
    for args in ((), ("--reconcile",)):
        recovered = day.queue.run("recover", "--json", *args)
        assert recovered.rc == 1 and recovered.json()["consistent"] is False, recovered
        assert [c["job"] for c in recovered.json()["conflicts"]] == [job], recovered
    assert (day.qdir / "done" / job).is_file()  # never resolved automatically
    shutil.move(day.qdir / "done" / job, aside)
    assert day.status()["conflict"] == 0
    day.a_new_job_runs("after-conflict")


# ------------------------------------------------------------------------ removing a tool


def test_a_removed_tool_is_found_nowhere_and_a_job_of_it_fails_at_resolve(day: Day) -> None:
    (day.storage / "tool" / TOOL).unlink()  # the executable first, then its controls
    shutil.rmtree(day.tool_dir())
    which = day.ctx("object", "which", TOOL)
    assert which.rc == 1 and which.err.startswith(f"ctx: ENOENT: {TOOL} is not on CTX_PATH")
    listed = must(day.ctx("object", "list", "--json")).json()
    assert TOOL not in {e["name"] for e in listed}, listed
    ran = day.ctx("run", "--agent", "beta", "--session", "s1", TOOL, '{"x": 4}')
    assert ran.rc == 127, ran
    decision = day.explain("alpha", f"tool:{TOOL}", "execute")
    assert (decision["step"], decision["errno"]) == (2, "ENOENT"), decision
    assert decision["reason"] == f"step 2 (mode bits): tool/{TOOL} does not exist"
    job = day.publish({"tool": TOOL, "input": {"x": 5}})
    assert day.drain()[-1]["failed"] == 1
    state, result = day.result(job)
    assert (state, result["error"]["error"], result["error"]["stage"]) == (
        "failed", "ENOENT", "resolve"
    ), result  # fmt: skip
    # The agents' rules stay until the operator removes them (docs/tools.md).
    assert (
        f"allow alpha_t tool:{TOOL} execute"
        in (day.storage / "agent" / "alpha.d" / "policy").read_text().splitlines()
    )
    assert not (day.storage / "tool" / TOOL).exists()
    day.a_new_job_runs("after-tool-removal")
    # A later tool of that name comes with a policy that grants nothing (P-6, T-8).
    must(day.ctx("object", "install", day.h.manifests[2], "--tier", "system"))
    decision = day.explain("alpha", f"tool:{TOOL}", "execute")
    assert (decision["step"], decision["errno"]) == (6, "EACCES"), decision


# ---------------------------------------------------------------------- removing an agent


def test_a_removed_agent_runs_nothing_and_its_sessions_stay_readable(day: Day) -> None:
    s1 = day.session_dir("beta", "s1") / "events.jsonl"
    before = s1.read_bytes()
    (day.storage / "agent" / "beta").unlink()
    shutil.rmtree(day.storage / "agent" / "beta.d")
    agents = must(day.ctx("agent", "list", "--json")).json()
    assert [a["name"] for a in agents] == ["alpha"], agents
    shown = day.ctx("agent", "show", "beta")
    assert shown.rc == 1 and shown.err.startswith("ctx: ENOENT: there is no agent 'beta'"), shown
    ran = day.ctx("run", "--agent", "beta", "--session", "s1", TOOL, '{"x": 4}')
    assert ran.rc == 126, ran
    assert ran.err.startswith("ctx: ENOENT: there is no agent 'beta'"), ran
    assert "'ctx agent list'" in ran.err and "'ctx agent create REQUEST.json'" in ran.err, ran
    decision = day.explain("beta", f"tool:{TOOL}", "execute")
    assert (decision["step"], decision["errno"]) == (1, "ENOENT"), decision
    job = day.publish({"tool": TOOL, "input": {"x": 6}})
    refused = day.ctx("queue", "work", "--project", SPACE, "--agent", "beta", "--drain", "--json")
    assert refused.rc == 1 and refused.json()["error"] == "ENOENT", refused
    assert day.queue.state(job) == "pending"
    assert s1.read_bytes() == before  # nothing recorded for a call that never ran
    assert must(day.ctx("session", "list", "beta")).lines() == ["s1"]
    shown = must(day.ctx("session", "show", "beta", "s1", "--json"))
    assert [json.loads(x)["call"] for x in shown.lines()][::2] == day.h.beta_calls
    assert day.drain()[-1]["done"] == 1  # alpha may run ops.echo: the job is not lost
    assert day.result(job)[1]["output"] == {"v": 2, "in": {"x": 6}}
    assert day.explain("alpha", f"tool:{TOOL}", "execute")["allowed"] is True


def test_a_worker_whose_agent_is_removed_stops_and_recover_hands_its_job_on(day: Day) -> None:
    proc, out = day.worker("beta", "beta-worker")
    (day.storage / "agent" / "beta").unlink()
    shutil.rmtree(day.storage / "agent" / "beta.d")
    job = day.publish({"tool": TOOL, "input": {"x": 7}})
    assert proc.wait(timeout=20) == 1
    said = [json.loads(line) for line in out.read_text().splitlines()]
    stop, error = said[-2], said[-1]
    assert (stop["event"], stop["done"], stop["failed"], stop["left_claimed"]) == (
        "stop", 0, 0, [job],
    ), stop  # fmt: skip
    assert error["error"] == "ENOENT" and "there is no agent 'beta'" in error["message"], error
    assert day.queue.state(job) == "claimed"
    shown = must(day.queue.run("show", job, "--json")).json()
    assert shown["holder"]["state"] == "gone", shown
    recovered = must(day.queue.run("recover", "--json")).json()
    assert [r["job"] for r in recovered["requeued"]] == [job], recovered
    assert day.drain()[-1]["done"] == 1
    state, result = day.result(job)
    assert (state, result["output"], result["agent"]) == ("done", {"v": 2, "in": {"x": 7}}, "alpha")
    beta_worker = events(day.session_dir("beta", "worker") / "events.jsonl")
    assert [e["type"] for e in beta_worker if e["type"].startswith("tool_")] == [], beta_worker


def test_a_terminal_of_a_removed_agent_runs_no_more_tools_and_still_stops(day: Day) -> None:
    controls = day.storage / "agent" / "alpha.d"
    rotated = (controls / "log").read_bytes()
    os.rename(controls / "log", controls / "log.1")  # the agent's log rotated first
    started = must(day.ctx("agent", "start", "alpha", "--session", "t2", "--no-workspace",
                           "--json"))  # fmt: skip
    day.terminals.append("t2")
    (fact,) = events(controls / "log")
    assert (fact["type"], fact["session"], fact["workspace"]) == ("terminal.started", "t2", None)
    made = os.stat(controls / "log")
    assert (made.st_uid, stat.S_IMODE(made.st_mode)) == (0, 0o640)  # the host's, as before
    assert (controls / "log.1").read_bytes() == rotated
    client = Raw(Path(started.json()["listening_at"]), b"attach\n")
    try:
        assert client.shows(PROMPT), client.text()
        assert typed(client, f"{TOOL} '{{\"a\": 1}}'") == '{"v": 2, "in": {"a": 1}}\n'
        (day.storage / "agent" / "alpha").unlink()
        shutil.rmtree(day.storage / "agent" / "alpha.d")
        time.sleep(1.1)  # what the view keeps, half a second, and the kernel as long
        said = typed(client, f"{TOOL} '{{\"a\": 2}}'")
        assert said.startswith(f"tsh: {TOOL}: not a tool on CTX_PATH"), said
    finally:
        client.close()
    calls = events(day.session_dir("alpha", "t2") / "events.jsonl")
    assert [(e["type"], e["status"]) for e in calls] == [("tool_call", "ok"), ("tool_result", "ok")]
    stopped = must(day.ctx("agent", "stop", "alpha", "--session", "t2", "--json")).json()
    day.terminals.remove("t2")
    assert stopped == {"agent": "alpha", "session": "t2", "pid": fact["pid"]}, stopped
    assert not (day.session_dir("alpha", "t2") / "terminal").exists()
    assert not Path(started.json()["listening_at"]).parent.exists()


@pytest.mark.skipif(shutil.which("fusermount3") is None, reason="ctx mount needs fusermount3")
def test_the_mount_view_of_an_agent_loses_each_object_removed_and_empties_with_the_agent(
    day: Day,
) -> None:
    where = day.h.top / "view"
    where.mkdir()
    with serving(day.storage, where, "--as", "alpha") as mount:
        assert sorted(os.listdir(where)) == ["agent", "bin", "home", "model", "shared", "tool"]
        assert TOOL in os.listdir(where / "tool") and SPACE in os.listdir(where / "shared")
        (day.storage / "tool" / TOOL).unlink()
        shutil.rmtree(day.tool_dir())
        shutil.rmtree(day.storage / "shared" / SPACE)
        assert wait_for(lambda: not (where / "tool" / TOOL).exists(), 5)
        assert wait_for(lambda: os.listdir(where / "shared") == ["cortexfs-docs"], 5)
        (day.storage / "agent" / "alpha").unlink()
        shutil.rmtree(day.storage / "agent" / "alpha.d")
        assert wait_for(lambda: os.listdir(where) == [], 5)
        assert wait_for(lambda: not (where / "tool").exists(), 5)
        assert wait_for(lambda: "view is empty until it is repaired" in mount.said(), 5)
        assert "ctx mount: warning: agent alpha's view is empty until it is repaired: ENOENT: " in (
            mount.said()
        )


# ------------------------------------------------------------------------ removing a space


def test_a_removed_space_is_no_queue_and_its_worker_stops(day: Day) -> None:
    proc, out = day.worker("alpha", "space-worker")
    shutil.rmtree(day.storage / "shared" / SPACE)
    status = day.queue.run("status")
    assert status.rc == 1 and status.err.startswith(
        f"ctx: ENOENT: no queue at {day.qdir}; create it with 'ctx queue init --project {SPACE}'"
    ), status
    listed = day.ctx("session", "list", "alpha", "--project", SPACE)
    assert listed.rc == 1 and listed.err.startswith("ctx: ENOENT: "), listed
    decision = day.explain("alpha", f"shared:{SPACE}", "read")
    assert (decision["step"], decision["errno"], decision["reason"]) == (
        2, "ENOENT", f"step 2 (mode bits): shared/{SPACE} does not exist",
    ), decision  # fmt: skip
    recorded = day.ctx("run", "--agent", "alpha", "--project", SPACE, "--session", "sp1",
                       "--native", "shell.exec", input='{"cmd": "echo x"}')  # fmt: skip
    assert recorded.rc == 1, recorded
    assert json.loads(recorded.lines()[-1])["error"]["error"] == "ENOENT", recorded
    assert proc.wait(timeout=20) == 1  # before its next claim (docs/workers.md)
    error = json.loads(out.read_text().splitlines()[-1])
    assert error["error"] == "ENOENT" and "no longer exists" in error["message"], error
    assert not (day.storage / "shared" / SPACE).exists()  # nothing made it again
    # Made again, the space is a new, empty one, and work goes on there.
    must(day.ctx("shared", "create", SPACE, "--group", str(day.h.gid)))
    assert day.status()["done"] == 0
    day.a_new_job_runs("in-the-new-space")


def test_bootstrap_after_a_tool_an_agent_and_a_space_were_removed_brings_none_back(
    day: Day,
) -> None:
    (day.storage / "tool" / TOOL).unlink()
    shutil.rmtree(day.tool_dir())
    shutil.rmtree(day.storage / "shared" / SPACE)
    (day.storage / "agent" / "beta").unlink()  # half of the agent removed: its entry
    report = must(day.ctx("bootstrap", "--json")).json()
    assert (report["created"], report["repaired"], report["problems"]) == ([], [], []), report
    assert report["warnings"] == [
        "agent/beta.d is left without agent/beta, so there is no agent beta; move agent/beta.d "
        "away, then 'ctx agent create' makes the agent again"
    ], report
    assert [a["name"] for a in must(day.ctx("agent", "list", "--json")).json()] == ["alpha"]
    shutil.rmtree(day.storage / "agent" / "beta.d")  # and the other half
    text = must(day.ctx("bootstrap"))
    assert text.lines() == [f"storage root: {day.storage}", NOTHING_TO_DO], text
    for gone in (f"tool/{TOOL}", f"tool/{TOOL}.d", "agent/beta", "agent/beta.d",
                 f"shared/{SPACE}"):  # fmt: skip
        assert not (day.storage / gone).exists(), gone
    assert sorted(os.listdir(day.storage)) == ["agent", "bin", "home", "model", "shared", "tool"]
    assert os.listdir(day.storage / "shared") == ["cortexfs-docs"]
    # What the removed agent recorded stays in its home (sessions outlive their agent).
    assert (day.session_dir("beta", "s1") / "events.jsonl").is_file()
    r = must(
        day.ctx("run", "--agent", "alpha", "--native", "shell.exec", input='{"cmd": "echo ok"}')
    )
    assert json.loads(r.lines()[-1])["output"] == "ok\n", r


def test_a_removed_space_stays_on_the_path_found_empty_and_its_tools_are_gone(day: Day) -> None:
    """T-4, docs/tools.md (CTX_PATH): a granted space that is not there (any more) stays on
    the agent's path, found empty, as one not made yet does until ``ctx shared create``
    makes it: none of its tools is found, and the chain says the space does not exist."""
    entry = f"/ctx/shared/{SPACE}/tool"
    shown = must(day.ctx("agent", "show", "alpha", "--json")).json()
    assert shown["ctx_path"].split(":") == ["/ctx/tool", f"/ctx/home/{day.h.alpha_uid}/tool",
                                            entry]  # fmt: skip
    shutil.rmtree(day.storage / "shared" / SPACE)
    shown = must(day.ctx("agent", "show", "alpha", "--json")).json()
    assert shown["ctx_path"].split(":")[-1] == entry, shown["ctx_path"]
    r = must(day.ctx("run", "--agent", "alpha", "--native", "shell.exec",
                     input='{"cmd": "printf %s \\"$CTX_PATH\\""}'))  # fmt: skip
    assert json.loads(r.lines()[-1])["output"].split(":")[-1] == entry, r
    explained = day.explain("alpha", f"shared:{SPACE}", "read")
    assert (explained["step"], explained["errno"]) == (2, "ENOENT"), explained


# ------------------------------------------------------------------------- revoking grants


def test_revoked_grants_deny_at_the_step_that_lost_the_rule(day: Day) -> None:
    rewrite_without(day.storage / "agent" / "alpha.d" / "policy",
                    "allow alpha_t tool:shell.exec execute")  # fmt: skip
    rewrite_without(day.tool_dir() / "policy", f"allow beta_t tool:{TOOL} execute")
    must(day.ctx("policy", "check", day.storage / "agent" / "alpha.d" / "policy",
                 day.tool_dir() / "policy"))  # fmt: skip
    shell = day.explain("alpha", "tool:shell.exec", "execute")
    reason = ("step 5 (object policy): agent/alpha.d/policy has no rule "
              "'allow alpha_t tool:shell.exec execute'")  # fmt: skip
    assert (shell["step"], shell["errno"], shell["reason"]) == (5, "EACCES", reason), shell
    echo = day.explain("beta", f"tool:{TOOL}", "execute")
    assert (echo["step"], echo["errno"], echo["reason"]) == (
        6, "EACCES",
        f"step 6 (tool/model policy): tool/{TOOL}.d/policy has no rule "
        f"'allow beta_t tool:{TOOL} execute'",
    ), echo  # fmt: skip
    assert day.explain("alpha", f"tool:{TOOL}", "execute")["allowed"] is True
    job = day.publish({"tool": "shell.exec", "input": {"cmd": "echo revoked"}})
    assert day.drain()[-1]["failed"] == 1
    state, result = day.result(job)
    assert (state, result["reason"]) == ("failed", f"EACCES: {reason} [authorize]"), result
    assert (result["error"]["stage"], result["error"]["step"]) == ("authorize", 5), result
    assert day.ctx("run", "--agent", "alpha", "shell.exec", "echo hi").rc == 126
    assert day.ctx("run", "--agent", "beta", TOOL, '{"x": 8}').rc == 126
    r = must(day.ctx("run", "--agent", "alpha", "--native", TOOL, input='{"x": 9}'))
    assert json.loads(r.lines()[-1])["output"] == {"v": 2, "in": {"x": 9}}
    # Taking shared:ops read away takes the space off the path and out of its sessions.
    rewrite_without(day.storage / "agent" / "alpha.d" / "policy",
                    f"allow alpha_t shared:{SPACE} read")  # fmt: skip
    shown = must(day.ctx("agent", "show", "alpha", "--json")).json()
    assert shown["ctx_path"] == f"/ctx/tool:/ctx/home/{day.h.alpha_uid}/tool", shown
    space = day.explain("alpha", f"shared:{SPACE}", "read")
    assert (space["step"], space["errno"]) == (5, "EACCES"), space
    refused = day.ctx("run", "--agent", "alpha", "--project", SPACE, "--session", "sp1",
                      "--native", TOOL, input="{}")  # fmt: skip
    assert refused.rc == 1 and json.loads(refused.lines()[-1])["error"]["stage"] == "session"


# ---------------------------------------------------------------- rotating logs and events


def test_a_tool_log_truncated_in_place_goes_on_from_its_first_line(day: Day) -> None:
    log = day.tool_dir() / "log"
    before = os.stat(log)
    os.truncate(log, 0)
    r = must(day.ctx("run", "--agent", "beta", "--session", "s1", "--native", TOOL,
                     input='{"x": 10}'))  # fmt: skip
    call = json.loads(r.lines()[-1])["call"]
    (line,) = events(log)
    assert (line["call"], line["output"], line["status"]) == (call, {"v": 2, "in": {"x": 10}}, "ok")
    after = os.stat(log)
    assert (after.st_ino, after.st_uid, stat.S_IMODE(after.st_mode)) == (
        before.st_ino, before.st_uid, stat.S_IMODE(before.st_mode),
    )  # fmt: skip


def test_tool_logs_rotated_by_rename_are_repaired_by_bootstrap_or_a_reinstall(day: Day) -> None:
    core, ours = day.tool_dir("shell.exec"), day.tool_dir()
    old_core, old_ours = (core / "log").read_bytes(), (ours / "log").read_bytes()
    os.rename(core / "log", core / "log.1")
    os.rename(ours / "log", ours / "log.1")
    listed = {e["name"]: e for e in must(day.ctx("object", "list", "--json")).json()}
    for name in ("shell.exec", TOOL):
        assert listed[name]["status"] == "damaged", listed[name]
        assert listed[name]["problems"] == [f"{name}.d/log is missing or not a regular file"]
    report = must(day.ctx("bootstrap", "--json")).json()
    assert report["repaired"] == ["tool/shell.exec"], report
    assert report["problems"] == [], report
    assert report["warnings"] == [
        f"tool/{TOOL} is damaged ({TOOL}.d/log is missing or not a regular file); reinstall it "
        "with 'ctx object install MANIFEST --tier system' ('ctx bootstrap' repairs only the "
        "core tools)"
    ], report
    assert (core / "log").read_bytes() == b"" and (core / "log.1").read_bytes() == old_core
    assert "allow alpha_t tool:shell.exec execute" in (core / "policy").read_text()
    day.a_new_job_runs("after-rotation")
    assert len(events(core / "log")) == 1
    must(day.ctx("object", "install", day.h.manifests[2], "--tier", "system"))
    must(day.ctx("run", "--agent", "beta", "--native", TOOL, input='{"x": 11}'))
    (line,) = events(ours / "log")
    assert line["output"] == {"v": 2, "in": {"x": 11}}, line
    assert (ours / "log.1").read_bytes() == old_ours


def test_an_events_file_rotated_or_truncated_between_calls_starts_afresh(day: Day) -> None:
    where = day.session_dir("beta", "s1")
    old = (where / "events.jsonl").read_bytes()
    followed = day.h.top / "follow.out"
    with open(followed, "wb") as sink:
        follower = subprocess.Popen(
            [*CTX_ARGV, "session", "tail", "beta", "s1", "--follow", "--json"],
            stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.PIPE, env=day.env,
        )  # fmt: skip
    day.procs.append(follower)
    assert wait_for(lambda: len(followed.read_bytes().splitlines()) == 6, 20), follower
    os.rename(where / "events.jsonl", where / "events.jsonl.1")
    r = must(day.ctx("run", "--agent", "beta", "--session", "s1", "--native", TOOL,
                     input='{"x": 12}'))  # fmt: skip
    call = json.loads(r.lines()[-1])["call"]
    # tail --follow, as tail -F: the renamed file read to its end, then the new one.
    assert wait_for(lambda: len(followed.read_bytes().splitlines()) == 8, 20), followed.read_text()
    follower.send_signal(signal.SIGINT)
    assert follower.wait(timeout=20) == 0
    lines = [json.loads(x) for x in followed.read_text().splitlines()]
    assert [e["call"] for e in lines] == [c for c in day.h.beta_calls for _ in (0, 1)] + [call] * 2
    notes = follower.stderr.read().decode().splitlines()
    assert notes[-1].startswith(f"ctx: note: {where / 'events.jsonl'} "), notes
    assert notes[-1].endswith(": following it again from its start"), notes
    made = os.stat(where / "events.jsonl")
    assert (made.st_uid, stat.S_IMODE(made.st_mode)) == (day.h.beta_uid, 0o600)
    shown = must(day.ctx("session", "show", "beta", "s1", "--json"))
    assert [(json.loads(x)["type"], json.loads(x)["call"]) for x in shown.lines()] == [
        ("tool_call", call), ("tool_result", call),
    ]  # fmt: skip
    assert (where / "events.jsonl.1").read_bytes() == old
    repaired = must(day.ctx("session", "repair", "beta", "s1", "--json")).json()
    assert repaired == {"session": f"home/{day.h.beta_uid}/agent/beta/session/s1",
                        "truncated_bytes": 0, "tightened": [], "left": []}  # fmt: skip
    os.truncate(where / "events.jsonl", 0)
    assert must(day.ctx("session", "show", "beta", "s1")).out == ""
    must(day.ctx("run", "--agent", "beta", "--session", "s1", "--native", TOOL, input="{}"))
    assert len(must(day.ctx("session", "show", "beta", "s1", "--json")).lines()) == 2
    assert must(day.ctx("session", "list", "beta")).lines() == ["s1"]


def worker_job_events(day: Day, out: Path, tag: str) -> str:
    """Publish a job for the running worker of ``out`` and wait for it to be finished."""
    job = day.publish({"tool": "shell.exec", "input": {"cmd": f"echo {tag}"}})
    assert wait_for(lambda: f'"finish", "job": "{job}"' in out.read_text(), 20), out.read_text()
    return job


def test_a_running_workers_session_truncated_in_place_keeps_each_job_whole(day: Day) -> None:
    proc, out = day.worker("alpha", "truncated-worker")
    log = day.session_dir("alpha", "worker") / "events.jsonl"
    os.truncate(log, 0)
    job = worker_job_events(day, out, "after-truncation")
    timeline = events(log)
    assert [e["type"] for e in timeline] == PER_JOB, timeline
    assert timeline[0]["object"] == f"queue/{job}" and timeline[2]["job"] == job
    proc.terminate()
    assert proc.wait(timeout=20) == 0


def test_a_running_workers_session_rotated_by_rename_keeps_each_job_whole(day: Day) -> None:
    proc, out = day.worker("alpha", "rotated-worker")
    log = day.session_dir("alpha", "worker") / "events.jsonl"
    os.rename(log, log.with_name("events.jsonl.1"))
    rotated = log.with_name("events.jsonl.1").read_bytes()
    job = worker_job_events(day, out, "after-rotation")
    timeline = events(log)
    assert log.with_name("events.jsonl.1").read_bytes() == rotated
    assert [e["type"] for e in timeline] == PER_JOB, timeline
    assert timeline[0]["object"] == f"queue/{job}"
    proc.terminate()
    assert proc.wait(timeout=20) == 0


# ------------------------------------------------------------------ backing up and restoring


def test_a_space_backed_up_with_tar_while_idle_comes_back_as_it_was(day: Day) -> None:
    shared = day.storage / "shared"
    backup = day.h.top / "ops.tar"
    sh("tar", "-C", shared, "--format=posix", "-cpf", backup, SPACE)
    views = {
        args: without_inodes(must(day.queue.run(*args, "--json")).json())
        for args in (("status",), ("list",))
    }
    modes = {p: (stat.S_IMODE(os.lstat(p).st_mode), os.lstat(p).st_gid)
             for p in [shared / SPACE, *sorted((shared / SPACE).rglob("*"))]}  # fmt: skip
    later = day.publish({"tool": "shell.exec", "input": {"cmd": "echo later"}})
    assert day.drain()[-1]["done"] == 1
    must(day.ctx("run", "--agent", "alpha", "--project", SPACE, "--session", "sp2", "--native",
                 "shell.exec", input='{"cmd": "echo sp2"}'))  # fmt: skip

    shutil.rmtree(shared / SPACE)
    sh("tar", "-C", shared, "-xpf", backup)
    for args, seen in views.items():  # the same, but for the inode numbers of the copy
        assert without_inodes(must(day.queue.run(*args, "--json")).json()) == seen, args
    assert {p: (stat.S_IMODE(os.lstat(p).st_mode), os.lstat(p).st_gid) for p in modes} == modes
    assert stat.S_IMODE(os.lstat(day.qdir).st_mode) == 0o3770
    assert day.queue.state(later) is None
    assert must(day.ctx("session", "list", "alpha", "--project", SPACE)).lines() == ["sp1"]
    made = must(day.ctx("shared", "create", SPACE, "--json")).json()
    assert (made["created"], made["repaired"], made["regrouped"]) == ([], [], 0), made
    day.a_new_job_runs("after-restore")
    r = must(day.ctx("run", "--agent", "alpha", "--project", SPACE, "--session", "sp1",
                     "--native", "shell.exec", input='{"cmd": "echo again"}'))  # fmt: skip
    assert json.loads(r.lines()[-1])["session"] == f"shared/{SPACE}/agent/alpha/session/sp1"
    assert [
        e["type"]
        for e in events(shared / SPACE / "agent" / "alpha" / "session" / "sp1" / "events.jsonl")
    ] == ["tool_call", "tool_result"] * 2


def test_a_root_copied_to_a_new_place_works_once_bootstrapped_and_its_mounts_edited(
    day: Day,
) -> None:
    copy = day.h.top / "copy"
    sh("cp", "-a", day.storage, copy)
    env = clean_env(CTX_STORAGE=str(copy))
    original = snapshot(day.storage)
    r = ctx_run("policy", "explain", "alpha", "tool:shell.exec", "execute", "--json", env=env)
    assert r.rc == 1 and (r.json()["step"], r.json()["errno"]) == (3, "EACCES"), r
    assert (f"the mount at /ctx names another storage root ({day.storage}, not this root "
            f"{copy})") in r.json()["reason"], r  # fmt: skip
    report = must(ctx_run("bootstrap", "--json", env=env)).json()
    assert report["repaired"] == ["agent/alpha", "agent/beta", "bin/ctxterm"], report
    assert (report["created"], report["problems"], report["warnings"]) == ([], [], []), report
    for agent in ("alpha", "beta"):
        control = copy / "agent" / f"{agent}.d" / "mount"
        table = [[str(copy) if m[0] == str(day.storage) else m[0], *m[1:]]
                 for m in json.loads(control.read_text())]  # fmt: skip
        control.write_text(json.dumps(table))
    r = ctx_run("policy", "explain", "alpha", "tool:shell.exec", "execute", env=env)
    assert r.rc == 0 and r.lines()[-1] == "allow", r
    queue = QueueCLI(copy, SPACE)
    job = queue.publish({"tool": "shell.exec", "input": {"cmd": "echo on-the-copy"}})
    work = ctx_run("queue", "work", "--project", SPACE, "--agent", "alpha", "--drain",
                   "--json", env=env)  # fmt: skip
    assert must(work) and json.loads(work.lines()[-1])["done"] == 1
    assert queue.state(job) == "done"
    assert snapshot(day.storage) == original  # the copy acted on nothing of the original
    shutil.rmtree(copy)
