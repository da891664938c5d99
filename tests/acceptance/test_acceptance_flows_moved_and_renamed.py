"""Storage roots, projects and spaces moved, renamed and copied with the operator's own tools
(``mv``, ``cp -a``, renames of ``shared/<name>``, a ``storage/current`` link moved), checked
against SPEC R-1, R-2, R-5, X-1, Q-1..Q-10, S-1, T-4, A-3 and docs/ (queue.md: the claim-order
hints keyed by the queue's real path; policy.md: a moved root's ``/ctx`` mount; workers.md;
tools.md: agent terminals).  Every command runs as a real process on real directories; what
a move leaves behind must be said as it is, and no job may be lost, run twice, or taken from
or run against another root than its own."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    request,
    scratch_top,
    snapshot,
    tool_manifest,
    wait_for,
)
from tests.support.storage import copy_of_root

SCRATCH = scratch_top(__file__)
PROJECT = "proj"  # the template root holds this project's queue
NOBODY = 65534  # root's default uid for agents, and nogroup

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid")
needs_terminal = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/fuse") or shutil.which("bwrap") is None,
    reason="an agent terminal needs root, /dev/fuse and bubblewrap",
)


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def place() -> Iterator[Path]:
    """A scratch directory every uid may search, removed at the end."""
    path = new_scratch_dir(SCRATCH)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def outbox(place: Path) -> Path:
    """A directory every uid may write: where the agents' jobs leave their traces."""
    path = place / "outbox"
    path.mkdir()
    path.chmod(0o1777)
    return path


def on(root: Path, *args, **kw) -> Run:
    """``ctx --storage ROOT ARGS`` with no CTX_ setting in the environment."""
    return ctx_run("--storage", root, *args, **kw)


def fresh_root(template: Path, where: Path) -> Path:
    """A bootstrapped root holding the queue of ``proj`` (a copy of the session's template)."""
    return copy_of_root(template, where)


def make_agent(root: Path, tools: list[str], name: str = "ci", **fields) -> None:
    """``ctx agent create`` of agent ``name`` (uid nobody, label ``<name>_t``) with ``tools``,
    each also granted on the tool's side (P-6)."""
    req = {"name": name, "label": f"{name}_t", "tools": tools, **fields}
    made = on(root, "agent", "create", "-", input=json.dumps(req))
    assert made.rc == 0, made
    for tool in tools:
        with (root / "tool" / f"{tool}.d" / "policy").open("a") as policy:
            policy.write(f"allow {name}_t tool:{tool} execute\n")


def point_ctx_mount_at(root: Path, agent: str = "ci") -> None:
    """The repair docs/policy.md names for a moved or copied root: the source of the agent's
    mount at /ctx edited to this root's real path."""
    control = root / "agent" / f"{agent}.d" / "mount"
    table = json.loads(control.read_text())
    fixed = [[os.path.realpath(root), t, m] if t == "/ctx" else [s, t, m] for s, t, m in table]
    control.write_text(json.dumps(fixed))


def publish(root: Path, name: str, req: dict | None = None, project: str = PROJECT) -> str:
    body = json.dumps(req or request("fs.stat", input={"path": "/ctx/tool"}, tag=name))
    r = on(root, "queue", "publish", "--project", project, "--name", name, "-", input=body)
    assert r.rc == 0, r
    return r.out.strip()


def claim(root: Path, pid: int, project: str = PROJECT) -> Run:
    return on(root, "queue", "claim", "--project", project, "--pid", str(pid))


def shell_job(cmd: str) -> dict:
    req = request("shell.exec")
    req["input"] = {"cmd": cmd}
    return req


def queue_dir(root: Path, project: str = PROJECT) -> Path:
    return root / "shared" / project / "queue"


def names_in(root: Path, state: str, project: str = PROJECT) -> set[str]:
    return {n for n in os.listdir(queue_dir(root, project) / state) if not n.endswith(".result")}


def result_of(root: Path, job: str, state: str = "done", project: str = PROJECT) -> dict:
    return json.loads((queue_dir(root, project) / state / f"{job}.result").read_text())


def cp_a(source: Path, target: Path) -> None:
    done = subprocess.run(["cp", "-a", str(source), str(target)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def start_worker(storage: str | Path, *args: str) -> subprocess.Popen:
    """``ctx queue work --json`` on ``storage`` (given as CTX_STORAGE, as a service would),
    once its ``start`` event is out."""
    argv = [*CTX_ARGV, "queue", "work", "--project", PROJECT, "--json", *args]
    proc = subprocess.Popen(
        argv,
        env=clean_env(CTX_STORAGE=str(storage)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = proc.stdout.readline() if proc.stdout else ""
    assert first and json.loads(first)["event"] == "start", (first, proc.poll())
    return proc


@contextlib.contextmanager
def worker(storage: str | Path, *args: str) -> Iterator[subprocess.Popen]:
    proc = start_worker(storage, *args)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@contextlib.contextmanager
def live_process() -> Iterator[subprocess.Popen]:
    """A process that stands in as a live lease holder."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def dead_pid() -> int:
    """The pid of a process that has ended (and was reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def recover(root: Path, *args: str, project: str = PROJECT) -> dict:
    r = on(root, "queue", "recover", "--project", project, "--json", *args)
    assert "Traceback" not in r.err, r
    return r.json()


def jobs(report: dict, key: str) -> list[str]:
    return sorted(entry["job"] for entry in report[key])


def listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def error_lines(run: Run) -> list[str]:
    return [
        line
        for line in run.err.splitlines()
        if line.startswith("ctx: ") and not line.startswith(("ctx: warning:", "ctx: note:"))
    ]


# ------------------------------------------------------------------------------ whole roots


@needs_root
def test_a_root_moved_below_spaces_and_non_ascii_is_repaired_by_bootstrap_and_the_mount_edit(
    _template: Path, place: Path
) -> None:
    """R-1, R-5, A-3, S-1, T-8a with docs/policy.md: a root moved by ``mv`` to a path holding
    spaces and non-ASCII keeps every job, claim and session; ``ctx bootstrap`` rewrites the
    agent entry and ``bin/ctxterm`` for the new path (and a second run finds nothing to do);
    the agent's /ctx mount, which names the old path, is withheld with the documented reason
    until its source is edited, and then the agent, a worker and its sessions work there."""
    old = fresh_root(_template, place / "old")
    make_agent(old, ["fs.stat"])
    first = on(old, "run", "--agent", "ci", "fs.stat", "/ctx/tool")
    assert first.rc == 0, first
    with live_process() as holder:
        done_job = publish(old, "done-1")
        assert claim(old, holder.pid).out.strip() == done_job
        fin = on(old, "queue", "finish", "--project", PROJECT, done_job, "--ok", "-", input="{}")
        assert fin.rc == 0, fin
        held = publish(old, "held-1")
        assert claim(old, holder.pid).out.strip() == held
        waiting = [publish(old, f"wait-{n}") for n in range(3)]

        new = place / "moved root é"
        os.rename(old, new)
        status = on(new, "queue", "status", "--project", PROJECT, "--json")
        assert status.rc == 0, status
        counts = status.json()["counts"]
        assert (counts["pending"], counts["claimed"], counts["done"]) == (3, 1, 1), counts
        kept = recover(new)
        assert jobs(kept, "untouched") == [held] and kept["requeued"] == [], kept

        refused = on(new, "run", "--agent", "ci", "fs.stat", "/ctx/tool")
        assert refused.rc == 126 and "Traceback" not in refused.err, refused
        for text in ("agent/ci.d/mount", str(old), str(new)):
            assert text in refused.err, (text, refused)

        boot = on(new, "bootstrap", "--json")
        assert boot.rc == 0 and boot.json()["problems"] == [], boot
        assert {"agent/ci", "bin/ctxterm"} <= set(boot.json()["repaired"]), boot
        assert repr(str(new)) in (new / "agent" / "ci").read_text()
        assert repr(str(new)) in (new / "bin" / "ctxterm").read_text()
        again = on(new, "bootstrap", "--json")
        assert again.rc == 0 and again.json()["repaired"] == [], again
        which = on(new, "object", "which", "fs.stat")
        assert which.out.strip() == str(new / "tool" / "fs.stat"), which

        shown = on(new, "agent", "show", "ci", "--json")
        withheld = shown.json()["withheld_mounts"]
        assert [w["mount"] for w in withheld] == [[str(old), "/ctx", "ro"]], shown
        point_ctx_mount_at(new)
        ran = on(new, "run", "--agent", "ci", "fs.stat", "/ctx/tool")
        assert ran.rc == 0, ran
        session = new / "home" / str(NOBODY) / "agent/ci/session/default/events.jsonl"
        results = [e["status"] for e in read_jsonl(session) if e["type"] == "tool_result"]
        assert results[0] == results[-1] == "ok" and len(results) == 3, results
        assert on(new, "session", "list", "ci").out.split() == ["default"]

        # The claim of the live holder stays its own; the rest run on the moved root.
        with worker(new, "--agent", "ci", "--drain") as proc:
            out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, err)
        assert names_in(new, "done") == {done_job, *waiting}, err
        assert all(result_of(new, j)["status"] == "ok" for j in waiting)
        assert names_in(new, "pending") == set()
        shown = on(new, "queue", "show", "--project", PROJECT, held, "--json")
        assert shown.json()["state"] == "claimed", shown
    assert recover(new)["requeued"][0]["job"] == held
    assert not old.exists()


@needs_root
def test_a_copy_made_beside_the_original_is_bootstrapped_for_itself_and_both_work_apart(
    _template: Path, place: Path
) -> None:
    """R-1, R-5, A-3, W-1, Q-9: ``cp -a`` of a root beside the original, both then used.
    Bootstrap of the copy rewrites the copy's own agent entry and ``bin/ctxterm`` and leaves
    the original as it was; the copy's agent is withheld the original's /ctx (it never sees
    the other root) until its mount is pointed at the copy; workers on each root drain only
    that root's queue, each job once, the jobs published before the copy once in each."""
    a = fresh_root(_template, place / "a")
    make_agent(a, ["fs.stat"])
    shared_jobs = {publish(a, f"both-{n}") for n in range(3)}
    b = place / "b"
    cp_a(a, b)
    before = snapshot(a)
    boot = on(b, "bootstrap", "--json")
    assert boot.rc == 0 and {"agent/ci", "bin/ctxterm"} <= set(boot.json()["repaired"]), boot
    assert snapshot(a) == before
    assert repr(str(a)) in (a / "agent" / "ci").read_text()
    assert repr(str(b)) in (b / "agent" / "ci").read_text()

    seen_from_b = on(b, "run", "--agent", "ci", "--native", "fs.stat", input='{"path": "/ctx"}')
    assert seen_from_b.rc == 1 and "another storage root" in seen_from_b.out, seen_from_b
    assert "withheld mount" in on(b, "agent", "show", "ci").out
    point_ctx_mount_at(b)
    only_a = publish(a, "only-a")
    only_b = publish(b, "only-b")
    for root in (a, b):
        with worker(root, "--agent", "ci", "--drain") as proc:
            out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, err)
    assert names_in(a, "done") == shared_jobs | {only_a}
    assert names_in(b, "done") == shared_jobs | {only_b}
    for root in (a, b):
        assert names_in(root, "failed") == set()
        assert names_in(root, "pending") == set()
        worker_events = read_jsonl(
            root / "home" / str(NOBODY) / "agent/ci/session/worker/events.jsonl"
        )
        started = [e for e in worker_events if e["type"] == "queue.start"]
        assert len(started) == 4, started


def test_claim_order_hints_of_copies_and_of_swapped_paths_hand_out_each_queues_own_jobs_once(
    _template: Path, place: Path
) -> None:
    """Q-2, Q-9, Q-10 with docs/queue.md (the per-user hint kept by the queue's real path, a
    hint not evidence): claims alternate between a queue and its ``cp -a`` copy, jobs are
    published to one of them only, then the two roots swap paths by ``mv``: every claim hands
    out a job pending in the queue it was run on, each job of each queue exactly once, and
    nothing stays pending."""
    a = fresh_root(_template, place / "a")
    original = [publish(a, f"j{n}") for n in range(6)]
    with live_process() as holder:
        first = claim(a, holder.pid)
        assert first.out.strip() == original[0], first
        b = place / "b"
        cp_a(a, b)
        ids = {a: os.stat(a).st_ino, b: os.stat(b).st_ino}
        # The copy holds the claim of j0 too, as it was when copied.
        claimed: dict[int, list[str]] = {ids[a]: [original[0]], ids[b]: [original[0]]}
        pending = {ids[a]: set(original[1:]), ids[b]: set(original[1:])}

        def take(root: Path) -> bool:
            pending_now = names_in(root, "pending")
            got = claim(root, holder.pid)
            if got.rc == 3:
                assert pending_now == set(), (root, pending_now, got)
                return False
            assert got.rc == 0, got
            job = got.out.strip()
            assert job in pending_now, (root, job, pending_now)
            claimed[os.stat(root).st_ino].append(job)
            return True

        for _ in range(2):
            take(b)
            take(a)
        extra_a, extra_b = publish(a, "late-a"), publish(b, "late-b")
        pending[ids[a]].add(extra_a)
        pending[ids[b]].add(extra_b)
        take(a)
        take(b)
        # The two roots swap their paths; each path's hint now describes the other queue.
        os.rename(a, place / "swap")
        os.rename(b, a)
        os.rename(place / "swap", b)
        while take(a) | take(b):
            pass
    for names in claimed.values():
        assert len(names) == len(set(names)), names
    for ino in ids.values():
        assert set(claimed[ino]) == pending[ino] | {original[0]}
    for root in (a, b):
        assert names_in(root, "pending") == set()
        in_claimed = set(os.listdir(queue_dir(root) / "claimed"))
        assert in_claimed == set(claimed[os.stat(root).st_ino]), root


# ------------------------------------------------------------------------------ projects, spaces


@needs_root
def test_a_project_renamed_with_jobs_pending_claimed_by_live_and_dead_holders_and_done(
    _template: Path, place: Path, outbox: Path
) -> None:
    """X-1, Q-2..Q-5, I-3, I-4: ``mv shared/proj shared/renamed`` while a worker runs a job of
    it, another claim's holder is dead, one job is pending and one done.  The renamed queue
    reads the same; recover requeues only the dead holder's job; the running worker finishes
    its job in the renamed queue (it ran once); the old name has no queue until it is made
    anew, and a queue made anew under the old name hands out only its own job."""
    root = fresh_root(_template, place / "root")
    make_agent(root, ["shell.exec"])
    flag = outbox / "go"
    runs = outbox / "runs"
    slow = publish(
        root,
        "slow",
        shell_job(f"while [ ! -e {flag} ]; do sleep 0.05; done; echo slow >> {runs}"),
    )
    with worker(root, "--agent", "ci", "--max-jobs", "1") as proc:
        q = queue_dir(root)
        assert wait_for(lambda: (q / "lease" / slow / "worker").is_file(), 30)
        finished = publish(root, "finished")
        got = claim(root, os.getpid())
        assert got.out.strip() == finished, got
        fin = on(root, "queue", "finish", "--project", PROJECT, finished, "--ok", "-", input="{}")
        assert fin.rc == 0, fin
        orphan = publish(root, "orphan")
        assert claim(root, dead_pid()).out.strip() == orphan
        waiting = publish(root, "waiting")

        os.rename(root / "shared" / PROJECT, root / "shared" / "renamed")
        status = on(root, "queue", "status", "--project", "renamed", "--json")
        assert status.rc == 0, status
        counts = status.json()["counts"]
        assert (counts["pending"], counts["claimed"], counts["done"]) == (1, 2, 1), counts
        gone = on(root, "queue", "status", "--project", PROJECT)
        assert gone.rc == 1 and gone.err.startswith("ctx: ENOENT: "), gone
        report = recover(root, project="renamed")
        assert jobs(report, "requeued") == [orphan], report
        assert jobs(report, "untouched") == [slow], report

        flag.write_text("")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, err)
    assert runs.read_text() == "slow\n"
    assert result_of(root, slow, project="renamed")["status"] == "ok"
    assert names_in(root, "pending", "renamed") == {orphan, waiting}

    assert on(root, "queue", "init", "--project", PROJECT).rc == 0
    anew = publish(root, "anew")
    assert claim(root, os.getpid()).out.strip() == anew
    assert claim(root, os.getpid()).rc == 3
    me = os.getpid()
    order = [claim(root, me, "renamed").out.strip() for _ in range(3)]
    assert order[:2] == [orphan, waiting] and order[2] == "", order
    assert names_in(root, "done", "renamed") == {finished, slow}


@needs_root
def test_a_space_renamed_while_the_agents_policy_names_the_old_one(
    _template: Path, place: Path
) -> None:
    """X-1, S-1, S-6, P-7: a space renamed by ``mv`` keeps the agent's shared session, which
    ``ctx session`` shows under the new name; the agent's grant names the old name only, so
    a call recording in the renamed space is refused with the step and the rule it lacks, and
    one naming the old space says it does not exist and how to make it, nothing recorded in
    either; a space made anew under the old name starts with no session of the old one."""
    root = fresh_root(_template, place / "root")
    made = on(root, "shared", "create", "team", "--group", str(NOBODY))
    assert made.rc == 0, made
    make_agent(root, ["fs.stat"], shared={"team": ["read", "write"]})
    ran = on(root, "run", "--agent", "ci", "--project", "team", "fs.stat", "/ctx/shared/team")
    assert ran.rc == 0, ran
    os.rename(root / "shared" / "team", root / "shared" / "crew")
    listed = on(root, "session", "list", "ci", "--project", "crew")
    assert listed.rc == 0 and listed.out.split() == ["default"], listed
    events = root / "shared/crew/agent/ci/session/default/events.jsonl"
    before = events.read_bytes()

    new_name = on(root, "run", "--agent", "ci", "--project", "crew", "fs.stat", "/ctx/shared/crew")
    assert new_name.rc == 126 and "Traceback" not in new_name.err, new_name
    assert "shared:crew" in new_name.err and "EACCES" in new_name.err, new_name
    old_name = on(root, "run", "--agent", "ci", "--project", "team", "fs.stat", "/ctx/shared/crew")
    assert old_name.rc == 126 and "ENOENT" in old_name.err, old_name
    assert "ctx shared create team" in old_name.err, old_name
    assert events.read_bytes() == before
    assert not (root / "shared" / "team").exists()

    assert on(root, "shared", "create", "team", "--group", str(NOBODY)).rc == 0
    fresh = on(root, "session", "list", "ci", "--project", "team")
    assert "default" not in fresh.out.split(), fresh
    again = on(root, "run", "--agent", "ci", "--project", "team", "fs.stat", "/ctx/shared/team")
    assert again.rc == 0, again
    assert events.read_bytes() == before


# ------------------------------------------------------------------------------ live copies


@needs_root
def test_a_queue_copied_while_its_worker_runs_leaves_the_copys_claim_to_q5(
    _template: Path, place: Path, outbox: Path
) -> None:
    """Q-5, Q-6, I-3, I-4, W-3: a root copied with ``cp -a`` while its worker runs a job (a
    backup taken live).  The copy's claim names the worker, which is alive: recover on the
    copy (plain and --reconcile) leaves it alone, as on the original; the worker finishes the
    job in the original only, where it ran once; once the worker has ended, recover on the
    copy requeues it there, and a worker on the copy runs it once more, in the copy."""
    a = fresh_root(_template, place / "a")
    make_agent(a, ["shell.exec"])
    flag = outbox / "go"
    runs = outbox / "runs"
    job = publish(
        a, "backup", shell_job(f"while [ ! -e {flag} ]; do sleep 0.05; done; echo x >> {runs}")
    )
    with worker(a, "--agent", "ci") as proc:
        assert wait_for(lambda: (queue_dir(a) / "lease" / job / "worker").is_file(), 30)
        b = place / "b"
        cp_a(a, b)
        for root in (b, a):
            for args in ((), ("--reconcile",)):
                report = recover(root, *args)
                assert jobs(report, "untouched") == [job] and report["requeued"] == [], report
        shown = on(b, "queue", "show", "--project", PROJECT, job, "--json").json()
        assert shown["state"] == "claimed" and shown["holder"]["state"] == "alive", shown
        flag.write_text("")
        assert wait_for(lambda: (queue_dir(a) / "done" / f"{job}.result").is_file(), 30)
        assert runs.read_text() == "x\n"
        assert (queue_dir(b) / "claimed" / job / job).is_file()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, err)
    assert result_of(a, job)["status"] == "ok"
    report = recover(b)
    assert jobs(report, "requeued") == [job], report
    point_ctx_mount_at(b)
    assert on(b, "bootstrap").rc == 0
    with worker(b, "--agent", "ci", "--drain") as proc:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, err)
    assert runs.read_text() == "x\nx\n"
    assert result_of(b, job)["status"] == "ok"
    assert names_in(a, "done") == {job} and names_in(a, "pending") == set()
    for root in (a, b):
        assert os.listdir(queue_dir(root) / "claimed") == []


# ------------------------------------------------------------------------------ long-lived commands


@needs_root
def test_a_worker_whose_root_is_moved_under_it_fails_no_job_for_the_old_path(
    _template: Path, place: Path
) -> None:
    """W-1, R-1 with docs/workers.md ("an error that is not a job's failure stops the
    worker"): a worker waits on a root that the operator then moves with ``mv`` and repairs
    as the docs say (bootstrap, the /ctx mount edited).  A job published on the moved root is
    either run there or left for another worker; it is never finished in ``failed/`` because
    the worker still runs tools on the path the root left."""
    old = fresh_root(_template, place / "old")
    make_agent(old, ["fs.stat"])
    new = place / "new"
    with worker(old, "--agent", "ci") as proc:
        os.rename(old, new)
        assert on(new, "bootstrap").rc == 0
        point_ctx_mount_at(new)
        job = publish(new, "after-move")
        q = queue_dir(new)
        settled = wait_for(
            lambda: (
                proc.poll() is not None
                or (q / "done" / f"{job}.result").exists()
                or (q / "failed" / f"{job}.result").exists()
            ),
            30,
        )
        assert settled
        failed = q / "failed" / f"{job}.result"
        reason = json.loads(failed.read_text())["reason"] if failed.exists() else None
        assert reason is None, reason


@needs_root
def test_a_worker_started_through_a_current_link_runs_each_job_with_its_own_roots_tool(
    _template: Path, place: Path
) -> None:
    """R-1, T-4, W-1 with docs/queue.md ("only the storage root may be reached through a link
    its administrator made") and docs/mount.md (a view whose root path now names another
    directory shows nothing): a worker started with ``CTX_STORAGE=.../current`` while the
    link names release 1; the administrator moves the link to release 2.  A job of release
    1's queue that the worker takes is run with release 1's tool, policy and log, never with
    release 2's."""
    releases = {}
    for name in ("rel-1", "rel-2"):
        root = fresh_root(_template, place / name)
        manifest = tool_manifest(
            place / f"m-{name}", "where.am", f'#!/bin/sh\necho \'{{"root": "{name}"}}\'\n'
        )
        assert on(root, "object", "install", manifest, "--tier", "system").rc == 0
        make_agent(root, ["where.am"])
        releases[name] = root
    current = place / "current"
    current.symlink_to("rel-1")
    log_2 = releases["rel-2"] / "tool" / "where.am.d" / "log"
    log_before = log_2.read_bytes() if log_2.exists() else b""
    with worker(current, "--agent", "ci") as proc:
        (place / "next").symlink_to("rel-2")
        os.replace(place / "next", current)
        job = publish(releases["rel-1"], "which-root", request("where.am", input={}))
        q = queue_dir(releases["rel-1"])
        settled = wait_for(
            lambda: (
                proc.poll() is not None
                or any((q / s / f"{job}.result").exists() for s in ("done", "failed"))
            ),
            30,
        )
        assert settled
    for state in ("done", "failed"):
        outcome = q / state / f"{job}.result"
        if outcome.exists():
            assert json.loads(outcome.read_text())["output"] == {"root": "rel-1"}
    assert (log_2.read_bytes() if log_2.exists() else b"") == log_before


@needs_root
def test_a_current_link_left_dangling_by_the_move_is_named_as_such(
    _template: Path, place: Path
) -> None:
    """R-1, R-5 with the README ("Errors read ctx: ERRNO: what to do"): ``storage/current``
    names a release the operator then moved elsewhere.  Every command on the link says that
    the link leads to a directory that does not exist (ENOENT, naming it or the link), never
    that it is not a directory to move aside or a root without a queue or tools; bootstrap
    and queue init say what to do; once the release is back where the link leads, its jobs
    are all there."""
    release = fresh_root(_template, place / "release-1")
    current = place / "current"
    current.symlink_to("release-1")
    job = publish(current, "kept")
    os.rename(release, place / "release-1.moved")
    env = clean_env(CTX_STORAGE=str(current))
    problems = []
    for args in (
        ["object", "list"],
        ["agent", "list"],
        ["object", "which", "fs.stat"],
        ["queue", "status", "--project", PROJECT],
        ["queue", "claim", "--project", PROJECT, "--pid", str(os.getpid())],
    ):
        r = ctx_run(*args, env=env)
        lines = error_lines(r)
        if r.rc == 0 or "Traceback" in r.err or len(lines) != 1:
            problems.append(r)
            continue
        said = lines[0]
        if not said.startswith("ctx: ENOENT: ") or not ("link" in said or str(release) in said):
            problems.append(f"{' '.join(args)}: {said}")
    for args in (["bootstrap"], ["queue", "init", "--project", PROJECT]):
        r = ctx_run(*args, env=env)
        lines = error_lines(r)
        if "Traceback" in r.err or (r.rc != 0 and not (lines and ";" in lines[-1])):
            problems.append(f"{' '.join(args)}: {r.err.strip()}")
    if os.path.lexists(release):  # made anew through the link: set aside, never judged here
        os.rename(release, place / "release-1.made")
    os.rename(place / "release-1.moved", release)
    listed = ctx_run("queue", "list", "--project", PROJECT, "--state", "pending", env=env)
    assert listed.out.split() == [job], listed
    assert problems == []


@needs_terminal
def test_agent_stop_on_a_root_moved_under_a_running_terminal_never_calls_it_ended(
    _template: Path, place: Path
) -> None:
    """A-1, A-2, R-1 with docs/tools.md (``ctx agent stop``): a root is moved by ``mv`` while
    an agent's terminal runs, and bootstrapped on its new path.  ``ctx agent stop`` there
    either ends that terminal or refuses saying it still runs; it never reports as ended,
    and cleans up after, a terminal whose socket still answers."""
    old = fresh_root(_template, place / "old")
    made = on(old, "agent", "create", "-", input=json.dumps({"name": "coder", "label": "c_t"}))
    assert made.rc == 0, made
    ws = place / "ws"
    ws.mkdir()
    os.chown(ws, NOBODY, NOBODY)
    started = on(old, "agent", "start", "coder", "--session", "s1", "--json", cwd=ws)
    assert started.rc == 0, started
    socket_at = Path(started.json()["listening_at"])
    new = place / "new"
    try:
        assert listening(socket_at)
        os.rename(old, new)
        assert on(new, "bootstrap").rc == 0
        stop = on(new, "agent", "stop", "coder", "--session", "s1")
        assert "Traceback" not in stop.err, stop
        if stop.rc == 0:  # stop returns once the terminal has ended (docs/tools.md)
            assert not listening(socket_at), stop
        else:
            assert listening(socket_at) and "ended" not in stop.out + stop.err, stop
    finally:
        if new.exists() and not old.exists():
            os.rename(new, old)
        on(old, "agent", "stop", "coder", "--session", "s1")
