"""Every option of the ``ctx`` command tree does what its ``--help`` text, docs/ and SPEC say
it does, with values at and away from its default, and its default applies when it is left
out (SPEC §2.4 Q-1…Q-6, §3 W-1/W-4, §4 S-1/S-5, §5 P-5/P-6/P-8, §6 T-4/T-8/T-8a, §7 H-3/H-4,
§8 A-1/A-2/A-3, §9 X-1, §12 D-1, §13 F-1).

The angle is the option itself, not only that it is accepted:

* ``--json`` gives one JSON document (JSON Lines where documented) with the documented fields;
* ``--dry-run`` leaves every byte of the queue as it was;
* ``--ttl``, ``--pid``, ``--worker``, ``--grace``, ``--reconcile``, ``--batch``, ``--name``,
  ``--state``, ``--queue``/``--project``/``$CTX_PROJECT`` of ``ctx queue``; ``--max-jobs``,
  ``--drain``, ``--timeout``, ``--kind``, ``--concurrency``, ``--session`` of the worker;
* ``-n``, ``--follow``, ``--session``, ``--project``, ``--uid`` of ``ctx session``;
* ``--policy``, ``--peer``, ``--location`` of ``ctx policy``; ``--tier``, ``--source`` of
  ``ctx object``; ``--user``, ``--gid``, ``--groups``, ``--workspace``, ``--no-workspace``,
  ``--session`` of ``ctx agent``; ``--session``, ``--project``, ``--native``, ``--timeout`` of
  ``ctx run``; ``--group`` of ``ctx shared create``; ``--storage`` of ``ctx man``; ``--as`` of
  ``ctx mount``; ``--version``.

Each is checked by what it leaves: exit status, the errno word of a refusal, files on disk,
lease and result fields, session events.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    REPO,
    QueueCLI,
    age,
    clean_env,
    ctx_mount,
    ctx_run,
    is_object_name,
    needs_fuse_as_root,
    read_jsonl,
    request,
    rfc3339,
    snapshot,
    tool_manifest,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, Raw
from tests.acceptance.workercli import AGENT, allow_in_tool_policy, make_agent
from tests.acceptance.workercli import storage as storage
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root")
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
NOBODY = 65534

# ------------------------------------------------------------------------------ building blocks


def env_of(storage: Path, **extra: str) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(storage), **extra)


def on(storage: Path, *args, **kw):
    """``ctx ARGS`` with ``$CTX_STORAGE`` naming ``storage``."""
    kw.setdefault("env", env_of(storage))
    return ctx_run(*args, **kw)


def lifetime(lease: dict, since: str = "claimed_at") -> float:
    """Seconds from the lease's ``since`` stamp to its ``expires_at``."""
    return (rfc3339(lease["expires_at"]) - rfc3339(lease[since])).total_seconds()


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def event(i: int, agent: str = "ghost", session: str = "s") -> str:
    return json.dumps(
        {
            "ts": f"2026-06-22T12:{i // 60:02d}:{i % 60:02d}Z",
            "type": "note",
            "agent": agent,
            "session": session,
            "object": "tool/fs.read",
            "status": "ok",
            "i": i,
        }
    )


def write_session(directory: Path, count: int, agent: str = "ghost") -> Path:
    """``directory/events.jsonl`` with ``count`` events numbered 1..count."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "events.jsonl"
    path.write_text("".join(event(i, agent, directory.name) + "\n" for i in range(1, count + 1)))
    return path


def numbers(out: str) -> list[int]:
    return [json.loads(line)["i"] for line in out.splitlines() if line.strip()]


def shell_job(cmd: str) -> dict:
    return {"tool": "shell.exec", "input": {"cmd": cmd}}


@pytest.fixture
def agent(storage: Path) -> str:
    """Agent ``ci`` (uid nobody) allowed ``shell.exec`` in both layers of P-6."""
    make_agent(storage, ["shell.exec"])
    allow_in_tool_policy(storage, "shell.exec")
    return AGENT


def worker(queue: QueueCLI, *args: str, timeout: float = 60):
    return queue.run("work", "--agent", AGENT, *args, timeout=timeout)


def events_of(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


# ------------------------------------------------------------------------------ ctx queue claim


def test_claim_ttl_sets_the_lease_lifetime_and_its_default_is_the_queues_lease_ttl(
    queue: QueueCLI, child: subprocess.Popen
) -> None:
    for name in ("a", "b", "c"):
        queue.publish(name=name)
    queue.claim("--pid", str(child.pid))
    assert lifetime(queue.lease("a.req.json")) == pytest.approx(300, abs=0.01)  # config default

    with (queue.dir / "config").open("a") as config:
        config.write("lease_ttl=120\n")
    queue.claim("--pid", str(child.pid))
    assert lifetime(queue.lease("b.req.json")) == pytest.approx(120, abs=0.01)

    queue.claim("--pid", str(child.pid), "--ttl", "7.5")
    assert lifetime(queue.lease("c.req.json")) == pytest.approx(7.5, abs=0.01)


def test_claim_worker_and_pid_name_the_holder_in_the_lease_and_the_result(
    queue: QueueCLI, child: subprocess.Popen
) -> None:
    first, second = queue.publish(name="first"), queue.publish(name="second")

    assert queue.claim() == first  # no option: the calling process, id HOST:PID
    lease = queue.lease(first)
    assert lease["pid"] == os.getpid(), lease
    assert lease["worker"] == f"{lease['host']}:{os.getpid()}", lease

    assert queue.claim("--worker", "builder 7", "--pid", str(child.pid)) == second
    lease = queue.lease(second)
    assert (lease["worker"], lease["pid"]) == ("builder 7", child.pid), lease
    assert lease["create_time"] is not None

    queue.finish(second)
    _, res = queue.only_result(second)
    assert (res["worker"]["id"], res["worker"]["pid"]) == ("builder 7", child.pid), res
    assert res["started"] == lease["claimed_at"], (res, lease)


def test_claim_prints_the_name_alone_and_with_json_the_name_and_request(
    queue: QueueCLI, child: subprocess.Popen
) -> None:
    req = request(tag="one")
    queue.publish(req, name="one")
    queue.publish(request(tag="two"), name="two")

    text = queue.run("claim", "--pid", str(child.pid))
    assert (text.rc, text.out) == (0, "one.req.json\n"), text

    doc = queue.run("claim", "--pid", str(child.pid), "--json")
    assert doc.rc == 0, doc
    answer = doc.json()
    assert answer["name"] == "two.req.json"
    assert answer["request"]["tool"] == req["tool"] and answer["request"]["tag"] == "two"

    empty = queue.run("claim", "--pid", str(child.pid), "--json")
    assert (empty.rc, empty.out) == (3, ""), empty


def test_claim_pid_of_a_thread_is_refused_and_nothing_is_claimed(queue: QueueCLI) -> None:
    job = queue.publish(name="t")
    tid: list[int] = []
    release = threading.Event()

    def hold() -> None:
        tid.append(threading.get_native_id())
        release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert wait_for(lambda: bool(tid), 5)
        r = queue.run("claim", "--pid", str(tid[0]))
    finally:
        release.set()
        thread.join()
    assert r.rc == 2 and "EINVAL" in r.err and str(os.getpid()) in r.err, r
    assert queue.state(job) == "pending"
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()


# ------------------------------------------------------------------------------ ctx queue renew


def test_renew_ttl_pid_and_the_default_lifetime_of_a_renewal(
    queue: QueueCLI, child: subprocess.Popen
) -> None:
    job = queue.publish(name="long")
    queue.claim("--pid", str(child.pid), "--ttl", "1000")
    with (queue.dir / "config").open("a") as config:
        config.write("lease_ttl=100\n")  # not what the lease was taken for

    r = queue.run("renew", job, "--pid", str(child.pid), "--json")
    assert r.rc == 0, r
    lease = queue.lease(job)
    assert lifetime(lease, "renewed_at") == pytest.approx(1000, abs=0.01), lease
    assert r.json()["expires_at"] == lease["expires_at"]

    r = queue.run("renew", job, "--pid", str(child.pid), "--ttl", "50")
    assert r.rc == 0, r
    assert lifetime(queue.lease(job), "renewed_at") == pytest.approx(50, abs=0.01)

    r = queue.run("renew", job, "--pid", str(child.pid))
    assert r.rc == 0, r
    assert lifetime(queue.lease(job), "renewed_at") == pytest.approx(50, abs=0.01)

    # without --pid the holder is this process, which does not hold the lease
    before = (queue.dir / "lease" / job / "worker").read_bytes()
    r = queue.run("renew", job, "--ttl", "900", "--json")
    assert r.rc == 1 and r.json()["error"] == "EACCES" and "EACCES" in r.err, r
    assert (queue.dir / "lease" / job / "worker").read_bytes() == before


# ------------------------------------------------------------------------------ ctx queue publish


def test_publish_name_adds_the_suffix_once_and_json_gives_the_name(queue: QueueCLI) -> None:
    r = queue.run("publish", "--name", "alpha", "-", input=json.dumps(request()))
    assert (r.rc, r.out) == (0, "alpha.req.json\n"), r
    r = queue.run("publish", "--name", "beta.req.json", "--json", "-", input=json.dumps(request()))
    assert r.rc == 0 and r.json() == {"name": "beta.req.json"}, r
    r = queue.run("publish", "-", input=json.dumps(request()))
    generated = r.out.strip()
    assert r.rc == 0 and generated.endswith(".req.json") and is_object_name(generated), r
    assert queue.entries("pending") == {"alpha.req.json", "beta.req.json", generated}


def test_publish_batch_publishes_every_line_and_one_bad_line_publishes_nothing(
    queue: QueueCLI,
) -> None:
    lines = [json.dumps(request(n=i)) for i in range(3)]
    r = queue.run("publish", "--batch", "-", input="\n".join(lines) + "\n")
    assert r.rc == 0, r
    names = r.lines()
    assert len(names) == 3 and queue.entries("pending") == set(names), r
    stored = [json.loads((queue.dir / "pending" / n).read_text())["n"] for n in names]
    assert stored == [0, 1, 2]

    r = queue.run("publish", "--batch", "--json", "-", input="\n".join(lines[:2]) + "\n")
    assert r.rc == 0 and len(r.json()["names"]) == 2, r

    before = snapshot(queue.dir)
    bad = lines[0] + "\nnot json\n" + lines[1] + "\n"
    r = queue.run("publish", "--batch", "-", input=bad)
    assert r.rc == 1 and "EINVAL" in r.err and "line 2" in r.err, r
    assert snapshot(queue.dir) == before

    r = queue.run("publish", "--batch", "--name", "x", "-", input=lines[0] + "\n")
    assert r.rc == 2 and "EINVAL" in r.err, r
    assert snapshot(queue.dir) == before


# ------------------------------------------------------------------------------ ctx queue finish


def test_finish_ok_and_error_choose_the_terminal_state_and_json_shows_the_result(
    queue: QueueCLI, child: subprocess.Popen, tmp_path: Path
) -> None:
    good, bad = queue.publish(name="good"), queue.publish(name="bad")
    queue.claim("--pid", str(child.pid))
    queue.claim("--pid", str(child.pid))

    output = tmp_path / "out.json"
    output.write_text('{"answer": 42}')
    r = queue.run("finish", good, "--ok", output, "--json")
    assert r.rc == 0, r
    doc = r.json()
    assert (doc["name"], doc["state"], doc["result"]["status"]) == (good, "done", "ok"), doc
    state, res = queue.only_result(good)
    assert (state, res["output"]) == ("done", {"answer": 42}), res

    mismatch = json.dumps({"status": "ok", "output": 1})
    r = queue.run("finish", bad, "--error", "-", input=mismatch)
    assert r.rc == 2 and "EINVAL" in r.err, r
    assert queue.state(bad) == "claimed"

    r = queue.run("finish", bad, "--error", "-", input="it broke\n")
    assert r.rc == 0, r
    state, res = queue.only_result(bad)
    assert (state, res["status"], res["output"]) == ("failed", "error", "it broke\n"), res


# ------------------------------------------------------------------------------ status, list, show


def test_status_json_counts_every_state_and_lists_what_it_found(
    queue: QueueCLI, child: subprocess.Popen
) -> None:
    for name in ("a", "b", "c"):
        queue.publish(name=name)
    queue.claim("--pid", str(child.pid))
    done = queue.claim("--pid", str(child.pid))
    queue.finish(done)
    (queue.dir / "pending" / ".hidden.req.json").write_text("{}")
    (queue.dir / "claimed" / "orphan.req.json").mkdir()

    r = queue.run("status", "--json")
    assert r.rc == 0, r
    doc = r.json()
    assert doc["queue"] == str(queue.dir)
    tops = {k: doc[k] for k in ("pending", "claimed", "done", "failed", "conflict")}
    assert tops == {"pending": 1, "claimed": 1, "done": 1, "failed": 0, "conflict": 0}, doc
    assert doc["counts"] == {**tops, "incomplete": 1, "ignored": 1}, doc
    assert [e["job"] for e in doc["incomplete"]] == ["orphan.req.json"], doc
    assert len(doc["ignored"]) == 1 and ".hidden.req.json" in json.dumps(doc["ignored"]), doc
    for key in ("conflicts", "temps", "owned_by_others", "group_not_inherited"):
        assert doc[key] == [], (key, doc)

    text = queue.run("status")
    assert text.rc == 0 and "incomplete orphan.req.json" in text.out, text


def test_list_state_filters_and_orders_pending_as_claims_take_them(
    queue: QueueCLI, child: subprocess.Popen
) -> None:
    for name in ("zeta", "alpha", "mid", "omega"):
        queue.publish(name=name)
    assert queue.claim("--pid", str(child.pid)) == "zeta.req.json"
    queue.finish("zeta.req.json")
    assert queue.claim("--pid", str(child.pid)) == "alpha.req.json"

    def listed(*args: str) -> list[str]:
        r = queue.run("list", *args)
        assert r.rc == 0, r
        return r.lines()

    assert listed("--state", "pending") == ["mid.req.json", "omega.req.json"]
    assert listed("--state", "claimed") == ["alpha.req.json"]
    assert listed("--state", "done") == ["zeta.req.json"]
    assert listed("--state", "failed") == []
    every = {tuple(line.split()) for line in listed()}
    assert every == {
        ("pending", "mid.req.json"),
        ("pending", "omega.req.json"),
        ("claimed", "alpha.req.json"),
        ("done", "zeta.req.json"),
    }
    doc = queue.run("list", "--state", "pending", "--json")
    assert doc.json() == [
        {"name": "mid.req.json", "state": "pending"},
        {"name": "omega.req.json", "state": "pending"},
    ], doc
    # the order printed is the order claims take
    assert queue.claim("--pid", str(child.pid)) == "mid.req.json"


def test_list_state_incomplete_and_conflict_and_show_of_a_conflict_exit_1(
    queue: QueueCLI,
) -> None:
    (queue.dir / "claimed" / "empty.req.json").mkdir()
    both = queue.drop("both")
    queue.terminal("both")

    r = queue.run("list", "--state", "incomplete", "--json")
    assert r.rc == 0 and r.json() == [{"name": "empty.req.json", "state": "incomplete"}], r
    r = queue.run("list", "--state", "conflict")
    assert (r.rc, r.lines()) == (1, [both]), r
    r = queue.run("list", "--state", "pending")
    assert (r.rc, r.lines()) == (0, []), r

    shown = queue.run("show", both, "--json")
    assert shown.rc == 1 and shown.json()["state"] == "conflict", shown
    paths = {e["path"] for e in shown.json()["evidence"]}
    assert {f"pending/{both}", f"done/{both}", f"done/{both}.result"} <= paths, shown


def test_show_json_lays_out_the_evidence_and_judges_the_holder(queue: QueueCLI) -> None:
    job = queue.publish(request(tag="shown"), name="shown")
    holder = subprocess.Popen(["sleep", "60"])
    try:
        queue.claim("--pid", str(holder.pid))
        r = queue.run("show", "shown", "--json")
        assert r.rc == 0, r
        doc = r.json()
        assert (doc["name"], doc["state"]) == (job, "claimed"), doc
        paths = {e["path"] for e in doc["evidence"]}
        assert {f"claimed/{job}/{job}", f"lease/{job}/worker"} <= paths, doc
        assert doc["request"]["tag"] == "shown" and doc["lease"]["pid"] == holder.pid, doc
        assert doc["holder"]["state"] == "alive", doc
    finally:
        holder.kill()
        holder.wait()
    r = queue.run("show", job, "--json")
    assert r.json()["holder"]["state"] == "gone", r
    text = queue.run("show", job)
    assert text.rc == 0 and text.lines()[-1].startswith("holder:"), text


# ------------------------------------------------------------------------------ ctx queue recover


def crash_leftovers(queue: QueueCLI) -> dict[str, str]:
    """A claim whose holder is gone, a claim without its lease, an empty claim directory and
    an inbox temp file two minutes old."""
    gone = queue.publish(name="gone")
    queue.claim("--pid", str(dead_pid()))
    nolease = "nolease.req.json"
    (queue.dir / "claimed" / nolease).mkdir()
    (queue.dir / "claimed" / nolease / nolease).write_text(json.dumps(request()))
    (queue.dir / "claimed" / "empty.req.json").mkdir()
    temp = queue.dir / "inbox" / "x.publish.tmp"
    temp.write_text("{}")
    age(temp, 120)
    return {"gone": gone, "nolease": nolease, "temp": "inbox/x.publish.tmp"}


def test_recover_dry_run_changes_nothing_and_reports_the_plan(queue: QueueCLI) -> None:
    left = crash_leftovers(queue)
    before = snapshot(queue.dir)

    plain = queue.run("recover", "--dry-run", "--json")
    assert plain.rc == 1, plain
    doc = plain.json()
    assert doc["dry_run"] is True and doc["reconcile"] is False, doc
    assert [(e["job"], e["applied"]) for e in doc["requeued"]] == [(left["gone"], False)], doc
    assert snapshot(queue.dir) == before

    full = queue.run("recover", "--reconcile", "--dry-run", "--json")
    assert full.rc == 1, full
    doc = full.json()
    planned = {e["job"]: e["applied"] for e in doc["repaired"]}
    assert planned == {left["nolease"]: False, "empty.req.json": False}, doc
    assert left["temp"] in json.dumps(doc["stale_temps"]) and doc["removed_temps"] == [], doc
    assert snapshot(queue.dir) == before

    text = queue.run("recover", "--reconcile", "--dry-run")
    assert "would requeue" in text.out and "would remove" in text.out, text
    assert snapshot(queue.dir) == before

    real = queue.run("recover", "--reconcile", "--json")
    assert real.rc == 0 and real.json()["consistent"] is True, real
    assert queue.entries("pending") == {left["gone"], left["nolease"]}
    assert queue.entries("claimed") == set() and queue.entries("inbox") == set()


def test_recover_reconcile_completes_an_incomplete_pair_that_plain_recover_only_reports(
    queue: QueueCLI,
) -> None:
    left = crash_leftovers(queue)
    plain = queue.run("recover", "--json")
    assert plain.rc == 1, plain
    doc = plain.json()
    assert {e["job"] for e in doc["incomplete"]} == {left["nolease"], "empty.req.json"}, doc
    assert all(e["applied"] is False for e in doc["incomplete"]), doc
    assert (queue.dir / "claimed" / left["nolease"] / left["nolease"]).is_file()
    assert queue.state(left["gone"]) == "pending"  # plain recover requeues the gone holder
    assert (queue.dir / left["temp"]).exists()  # and removes no temp file

    full = queue.run("recover", "--reconcile")
    assert full.rc == 0, full
    assert queue.state(left["nolease"]) == "pending"
    assert queue.entries("claimed") == set() and queue.entries("inbox") == set()


def test_recover_grace_option_its_default_of_sixty_and_the_queue_configs(queue: QueueCLI) -> None:
    inbox = queue.dir / "inbox"
    for name, seconds in (("young.tmp", 30), ("old.tmp", 90)):
        (inbox / name).write_text("{}")
        age(inbox / name, seconds)

    r = queue.run("recover", "--reconcile", "--json")
    assert r.rc == 0 and r.json()["removed_temps"] == ["inbox/old.tmp"], r
    assert queue.entries("inbox") == {"young.tmp"}

    r = queue.run("recover", "--reconcile", "--grace", "45")
    assert r.rc == 0 and queue.entries("inbox") == {"young.tmp"}, r
    r = queue.run("recover", "--reconcile", "--grace", "20", "--json")
    assert r.rc == 0 and r.json()["removed_temps"] == ["inbox/young.tmp"], r
    assert queue.entries("inbox") == set()

    # the default is the queue config's grace, which the option beats
    with (queue.dir / "config").open("a") as config:
        config.write("grace=10\n")
    temp = inbox / "t.tmp"
    temp.write_text("{}")
    age(temp, 30)
    r = queue.run("recover", "--reconcile", "--grace", "100")
    assert r.rc == 0 and temp.exists(), r
    r = queue.run("recover", "--reconcile")
    assert r.rc == 0 and not temp.exists(), r


# ------------------------------------------------------------------------------ choosing the queue


def test_queue_project_and_ctx_project_choose_the_queue(storage: Path, tmp_path: Path) -> None:
    where = tmp_path / "elsewhere" / "q"
    r = on(storage, "queue", "init", "--queue", where, "--json")
    assert r.rc == 0, r
    assert {p.name for p in where.iterdir()} == QUEUE_SUBDIRS | {"config"}
    assert str(where / "pending") in r.json()["created"], r

    r = on(storage, "queue", "publish", "--queue", where, "--name", "j", "-",
           input=json.dumps(request()))  # fmt: skip
    assert r.rc == 0 and (where / "pending" / "j.req.json").is_file(), r
    status = on(storage, "queue", "status", "--project", str(where), "--json")
    assert status.rc == 0 and status.json()["queue"] == str(where), status
    assert status.json()["pending"] == 1

    both = on(storage, "queue", "status", "--queue", where, "--project", "proj")
    assert both.rc == 2 and "EINVAL" in both.err, both
    assert not (storage / "shared" / "proj" / "queue" / "pending" / "j.req.json").exists()

    # --project defaults to $CTX_PROJECT, and the option wins over it
    body = json.dumps(request())
    r = on(storage, "queue", "publish", "--name", "env", "-", input=body,
           env=env_of(storage, CTX_PROJECT=str(where)))  # fmt: skip
    assert r.rc == 0 and (where / "pending" / "env.req.json").is_file(), r
    r = on(storage, "queue", "publish", "--project", "proj", "--name", "opt", "-", input=body,
           env=env_of(storage, CTX_PROJECT=str(where)))  # fmt: skip
    assert r.rc == 0, r
    assert (storage / "shared" / "proj" / "queue" / "pending" / "opt.req.json").is_file()
    assert not (where / "pending" / "opt.req.json").exists()


# ------------------------------------------------------------------------------ ctx queue work


@as_root
def test_work_max_jobs_stops_after_n_claims_and_drain_once_the_queue_is_empty(
    queue: QueueCLI, agent: str
) -> None:
    for i in range(3):
        queue.publish(shell_job(f"echo {i}"), name=f"j{i}")

    r = worker(queue, "--max-jobs", "2", "--json")
    assert r.rc == 0, r
    events = events_of(r.out)
    assert [e["event"] for e in events if e["event"] in ("claim", "finish")] == [
        "claim",
        "finish",
        "claim",
        "finish",
    ], events
    assert events[-1]["event"] == "stop" and events[-1]["done"] == 2, events
    assert queue.entries("pending") == {"j2.req.json"}

    r = worker(queue, "--drain")
    assert r.rc == 0, r
    assert [queue.state(f"j{i}.req.json") for i in range(3)] == ["done"] * 3
    assert queue.only_result("j2.req.json")[1]["output"] == 2


@as_root
def test_work_worker_session_and_ttl_reach_the_lease_the_result_and_the_session(
    queue: QueueCLI, agent: str, storage: Path
) -> None:
    job = queue.publish(shell_job("sleep 0.6; echo 1"), name="timed")
    argv = [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", AGENT, "--max-jobs", "1",
            "--worker", "wid-1", "--session", "nightly", "--ttl", "42"]  # fmt: skip
    proc = subprocess.Popen(argv, env=env_of(storage), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        lease_file = queue.dir / "lease" / job / "worker"
        assert wait_for(lease_file.is_file, 20), proc
        lease = json.loads(lease_file.read_text())
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert lease["worker"] == "wid-1" and lifetime(lease) == pytest.approx(42, abs=0.01), lease
    assert queue.only_result(job)[1]["worker"]["id"] == "wid-1"

    sessions = storage / "home" / str(NOBODY) / "agent" / AGENT / "session"
    kinds = [e["type"] for e in read_jsonl(sessions / "nightly" / "events.jsonl")]
    assert {"queue.claim", "queue.finish", "tool_call", "tool_result"} <= set(kinds), kinds
    assert not (sessions / "worker").exists()

    # the defaults: id HOST:PID, the queue's lease_ttl, session "worker"
    with (queue.dir / "config").open("a") as config:
        config.write("lease_ttl=77\n")
    second = queue.publish(shell_job("sleep 0.6; echo 2"), name="plain")
    proc = subprocess.Popen([*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", AGENT,
                             "--max-jobs", "1", "--json"], env=env_of(storage),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        lease_file = queue.dir / "lease" / second / "worker"
        assert wait_for(lease_file.is_file, 20), proc
        lease = json.loads(lease_file.read_text())
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert lease["worker"] == f"{lease['host']}:{proc.pid}", lease
    assert lifetime(lease) == pytest.approx(77, abs=0.01), lease
    assert events_of(out)[0]["worker"] == lease["worker"]
    kinds = [e["type"] for e in read_jsonl(sessions / "worker" / "events.jsonl")]
    assert "queue.finish" in kinds, kinds


@as_root
def test_work_timeout_kills_a_job_that_runs_past_it(queue: QueueCLI, agent: str) -> None:
    job = queue.publish(shell_job("sleep 20; echo late"), name="slow")
    started = time.monotonic()
    r = worker(queue, "--drain", "--timeout", "0.5")
    assert r.rc == 0, r
    assert time.monotonic() - started < 10, "the job ran past --timeout"
    state, res = queue.only_result(job)
    assert state == "failed" and res["error"]["error"] == "ETIMEDOUT", res


@as_root
def test_work_kind_shell_leaves_other_tools_pending(queue: QueueCLI, agent: str) -> None:
    other = queue.publish({"tool": "fs.read", "input": {"path": "x"}}, name="read")
    shell = queue.publish(shell_job("echo ok"), name="shell")
    r = worker(queue, "--kind", "shell", "--drain", "--json")
    assert r.rc == 0, r
    assert queue.state(shell) == "done" and queue.state(other) == "pending"
    assert [e["job"] for e in events_of(r.out) if e["event"] == "claim"] == [shell], r


@as_root
def test_work_concurrency_runs_jobs_side_by_side(queue: QueueCLI, agent: str, outbox: Path) -> None:
    def meet(me: str, peer: str) -> dict:
        return shell_job(
            f"touch {outbox}/{me}; n=0; while [ ! -e {outbox}/{peer} ]; do "
            f"n=$((n+1)); [ $n -gt 150 ] && exit 3; sleep 0.02; done; echo met"
        )

    a = queue.publish(meet("a", "b"), name="a")
    b = queue.publish(meet("b", "a"), name="b")
    r = worker(queue, "--drain", "--concurrency", "2", "--timeout", "20")
    assert r.rc == 0, r
    assert [queue.state(a), queue.state(b)] == ["done", "done"], r


# ------------------------------------------------------------------------------ ctx session


def test_session_tail_n_and_its_default_of_ten(storage: Path) -> None:
    write_session(storage / "home" / "4242" / "agent" / "ghost" / "session" / "s", 15)

    def tail(*args: str) -> list[int]:
        r = on(storage, "session", "tail", "ghost", "s", "--json", *args)
        assert r.rc == 0, r
        return numbers(r.out)

    assert tail() == list(range(6, 16))
    assert tail("-n", "3") == [13, 14, 15]
    assert tail("-n", "0") == []
    assert tail("-n", "100") == list(range(1, 16))
    text = on(storage, "session", "tail", "ghost", "s", "-n", "2")
    assert text.rc == 0 and len(text.lines()) == 2 and "i=15" in text.lines()[-1], text


def test_session_tail_follow_prints_events_appended_and_ctrl_c_ends_it_with_0(
    storage: Path,
) -> None:
    path = write_session(storage / "home" / "4242" / "agent" / "ghost" / "session" / "f", 3)
    proc = subprocess.Popen(
        [*CTX_ARGV, "session", "tail", "ghost", "f", "-n", "1", "--follow", "--json"],
        env=env_of(storage),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert json.loads(proc.stdout.readline())["i"] == 3
        with path.open("a") as events:
            events.write(event(4, "ghost", "f") + "\n")
        assert json.loads(proc.stdout.readline())["i"] == 4
        proc.send_signal(signal.SIGINT)
        rest, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0 and rest == "", (proc.returncode, rest, err)


def test_session_option_positional_default_uid_and_project_choose_the_session(
    storage: Path,
) -> None:
    sessions = storage / "home" / "4242" / "agent" / "ghost" / "session"
    default = write_session(sessions / "default", 2)
    write_session(sessions / "s2", 4)

    r = on(storage, "session", "show", "ghost", "--json")
    assert r.rc == 0 and [json.loads(line) for line in r.lines()] == read_jsonl(default), r
    by_word = on(storage, "session", "show", "ghost", "s2", "--json")
    by_option = on(storage, "session", "show", "ghost", "--session", "s2", "--json")
    assert by_word.rc == by_option.rc == 0 and numbers(by_word.out) == [1, 2, 3, 4]
    assert by_option.out == by_word.out
    clash = on(storage, "session", "show", "ghost", "s2", "--session", "default")
    assert clash.rc == 2 and "EINVAL" in clash.err and clash.out == "", clash

    # --uid picks one of several homes, --project a shared space; not both
    write_session(storage / "home" / "4343" / "agent" / "ghost" / "session" / "h4343", 1)
    write_session(storage / "shared" / "proj" / "agent" / "ghost" / "session" / "p1", 2)
    several = on(storage, "session", "list", "ghost")
    assert several.rc == 2 and "EINVAL" in several.err and "--uid" in several.err, several
    r = on(storage, "session", "list", "ghost", "--uid", "4343", "--json")
    expected = storage / "home" / "4343" / "agent" / "ghost" / "session" / "h4343"
    assert r.rc == 0 and r.json() == [{"name": "h4343", "path": str(expected)}], r
    r = on(storage, "session", "list", "ghost", "--uid", "4242")
    assert (r.rc, r.lines()) == (0, ["default", "s2"]), r
    r = on(storage, "session", "list", "ghost", "--project", "proj")
    assert (r.rc, r.lines()) == (0, ["p1"]), r
    r = on(storage, "session", "show", "ghost", "p1", "--project", "proj", "--json")
    assert r.rc == 0 and numbers(r.out) == [1, 2], r
    both = on(storage, "session", "list", "ghost", "--project", "proj", "--uid", "4242")
    assert both.rc == 2 and "EINVAL" in both.err, both


def test_session_repair_truncates_the_torn_line_only_and_json_says_how_much(
    storage: Path,
) -> None:
    path = write_session(storage / "home" / "4242" / "agent" / "ghost" / "session" / "r", 3)
    whole = path.read_bytes()
    torn = b'{"ts":"2026-06-22T12:00:09Z","type":"no'
    path.write_bytes(whole + torn)

    r = on(storage, "session", "repair", "ghost", "--session", "r", "--json")
    assert r.rc == 0, r
    doc = r.json()
    assert doc["session"] == "home/4242/agent/ghost/session/r", doc
    assert doc["truncated_bytes"] == len(torn), doc
    assert path.read_bytes() == whole
    again = on(storage, "session", "repair", "ghost", "r", "--json")
    assert again.rc == 0 and again.json()["truncated_bytes"] == 0, again


# ------------------------------------------------------------------------------ ctx policy


def test_policy_query_every_policy_given_must_allow_and_check_json(tmp_path: Path) -> None:
    agent_policy = tmp_path / "agent"
    agent_policy.write_text("allow coder_t tool:fs.read execute\n")
    tool_policy = tmp_path / "tool"
    tool_policy.write_text("allow other_t tool:fs.read execute\n")
    query = ("coder_t", "tool:fs.read", "execute")

    one = ctx_run("policy", "query", "--policy", agent_policy, *query)
    assert (one.rc, one.out) == (0, "allow\n"), one
    two = ctx_run("policy", "query", "--policy", agent_policy, "--policy", tool_policy, *query)
    assert (two.rc, two.out) == (1, "deny\n"), two
    doc = ctx_run(
        "policy", "query", "--policy", agent_policy, "--policy", tool_policy, *query, "--json"
    )
    assert doc.rc == 1, doc
    assert doc.json()["decision"] == "deny"
    assert doc.json()["rule"] == "allow coder_t tool:fs.read execute"
    assert [p["allows"] for p in doc.json()["policies"]] == [True, False], doc

    tool_policy.write_text("allow coder_t tool:fs.read execute\n")
    two = ctx_run("policy", "query", "--policy", agent_policy, "--policy", tool_policy, *query)
    assert (two.rc, two.out) == (0, "allow\n"), two

    # check: --json reports each file and each bad line
    good = tmp_path / "good"
    good.write_text("# rules\n\nallow a_t tool:x execute\n")
    bad = tmp_path / "bad"
    bad.write_text("allow a_t tool:x execute\nallow a_t tool:x fly\n")

    r = ctx_run("policy", "check", good, bad, "--json")
    assert r.rc == 1, r
    doc = r.json()
    assert doc["valid"] is False
    files = {f["file"]: f for f in doc["files"]}
    assert files[str(good)]["valid"] is True and files[str(good)]["problems"] == []
    problems = files[str(bad)]["problems"]
    assert [(p["line"], p["error"], p["errno"]) for p in problems] == [(2, "EINVAL", 22)], doc
    assert f"{bad}:2: EINVAL:" in r.err, r

    ok = ctx_run("policy", "check", good, "--json")
    assert ok.rc == 0 and ok.json()["valid"] is True, ok


def test_policy_explain_peer_and_location_change_the_steps_they_judge(
    storage: Path, tmp_path: Path
) -> None:
    make_agent(storage, ["fs.read", "hello"], name="coder")
    allow_in_tool_policy(storage, "fs.read", "coder_t")
    manifest = tool_manifest(tmp_path / "m", "hello", "#!/bin/sh\necho hi\n")
    assert on(storage, "object", "install", manifest, "--tier", "user").rc == 0
    user_tier = f"home/{os.geteuid()}/tool"

    r = on(storage, "policy", "explain", "coder", "tool:fs.read", "execute", "--json")
    assert r.rc == 0 and r.json()["allowed"] is True, r
    assert [s["result"] for s in r.json()["steps"]] == ["pass"] * 6, r

    peer = on(storage, "policy", "explain", "coder", "tool:fs.read", "execute", "--peer", "0:0",
              "--json")  # fmt: skip
    assert peer.rc == 1, peer
    assert (peer.json()["step"], peer.json()["errno"]) == (1, "EACCES"), peer
    own = on(storage, "policy", "explain", "coder", "tool:fs.read", "execute",
             "--peer", f"{NOBODY}:{NOBODY}")  # fmt: skip
    assert own.rc == 0 and own.lines()[-1] == "allow", own

    here = on(storage, "policy", "explain", "coder", "tool:hello", "execute",
              "--location", user_tier, "--json")  # fmt: skip
    assert here.rc == 1, here
    steps = here.json()["steps"]
    assert f"{user_tier}/hello" in steps[1]["detail"] and steps[1]["result"] == "pass", here
    # root's home: the agent's view shows no home but its own (X-1, docs/policy.md)
    assert (here.json()["step"], here.json()["errno"]) == (3, "EACCES"), here
    assert f"shows only its own (home/{NOBODY})" in here.json()["reason"], here

    # without --location: the agent's CTX_PATH (tool, home/65534/tool) finds none: tool/hello
    default = on(storage, "policy", "explain", "coder", "tool:hello", "execute", "--json")
    assert default.rc == 1, default
    assert (default.json()["step"], default.json()["errno"]) == (2, "ENOENT"), default
    assert "tool/hello" in default.json()["steps"][1]["detail"], default

    outside = on(storage, "policy", "explain", "coder", "tool:hello", "execute",
                 "--location", tmp_path)  # fmt: skip
    assert outside.rc == 2 and "EINVAL" in outside.err, outside


# ------------------------------------------------------------------------------ ctx object


def test_object_install_tier_places_the_tool_and_json_says_where(
    storage: Path, tmp_path: Path
) -> None:
    manifest = tool_manifest(tmp_path / "m", "hello", "#!/bin/sh\necho hi\n")
    places = {
        "system": storage / "tool",
        "user": storage / "home" / str(os.geteuid()) / "tool",
        "shared:proj": storage / "shared" / "proj" / "tool",
    }
    for tier, directory in places.items():
        r = on(storage, "object", "install", manifest, "--tier", tier, "--json")
        assert r.rc == 0, r
        assert r.json() == {
            "name": "hello",
            "tier": tier,
            "path": str(directory / "hello"),
            "replaced": False,
            "took_leftover_controls": False,
        }, r
        assert os.access(directory / "hello", os.X_OK) and (directory / "hello.d").is_dir()
    again = on(storage, "object", "install", manifest, "--tier", "user", "--json")
    assert again.rc == 0 and again.json()["replaced"] is True, again

    missing = on(storage, "object", "install", manifest, "--tier", "shared:nosuch")
    assert missing.rc == 1 and "ENOENT" in missing.err, missing
    assert not (storage / "shared" / "nosuch").exists()


def test_object_install_source_names_the_root_over_the_environment(
    storage: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    assert ctx_run("bootstrap", "--storage", other).rc == 0
    manifest = tool_manifest(tmp_path / "m", "hello", "#!/bin/sh\necho hi\n")
    before = snapshot(other)

    r = on(other, "object", "install", "--source", storage, manifest, "--tier", "system")
    assert r.rc == 0, r
    assert (storage / "tool" / "hello").is_file() and snapshot(other) == before

    clash = ctx_run("--storage", other, "object", "install", "--source", storage, manifest,
                    "--tier", "user")  # fmt: skip
    assert clash.rc == 2 and "EINVAL" in clash.err, clash
    assert snapshot(other) == before
    assert not (storage / "home" / str(os.geteuid()) / "tool" / "hello").exists()


def test_object_list_tier_keeps_only_that_tier(storage: Path, tmp_path: Path) -> None:
    manifest = tool_manifest(tmp_path / "m", "hello", "#!/bin/sh\necho hi\n", description="Hi.")
    for tier in ("user", "shared:proj"):
        assert on(storage, "object", "install", manifest, "--tier", tier).rc == 0

    every = on(storage, "object", "list", "--json")
    assert every.rc == 0, every
    tiers = {(t["name"], t["tier"]) for t in every.json()}
    assert {("hello", "user"), ("hello", "shared:proj"), ("fs.read", "system")} <= tiers

    for tier in ("system", "user", "shared:proj"):
        r = on(storage, "object", "list", "--tier", tier, "--json")
        assert r.rc == 0, r
        assert {t["tier"] for t in r.json()} == {tier}, r
    user = on(storage, "object", "list", "--tier", "user", "--json").json()
    assert [(t["name"], t["status"], t["description"]) for t in user] == [
        ("hello", "available", "Hi.")
    ]
    text = on(storage, "object", "list", "--tier", "shared:proj")
    assert text.rc == 0 and text.lines()[0].split()[:3] == ["hello", "shared:proj", "available"]


def test_object_which_follows_ctx_path_and_tshrc_and_json_lists_what_it_skipped(
    storage: Path, tmp_path: Path
) -> None:
    manifest = tool_manifest(tmp_path / "m", "hello", "#!/bin/sh\necho hi\n")
    for tier in ("user", "shared:proj"):
        assert on(storage, "object", "install", manifest, "--tier", tier).rc == 0
    (storage / "tool" / "hello").write_text("not executable")
    user_hello = storage / "home" / str(os.geteuid()) / "tool" / "hello"

    r = on(storage, "object", "which", "hello")
    assert (r.rc, r.out) == (0, f"{user_hello}\n"), r
    doc = on(storage, "object", "which", "hello", "--json").json()
    assert doc["path"] == str(user_hello) and doc["search_path"]["source"] == "default", doc
    assert any(str(storage / "tool" / "hello") in s for s in doc["skipped"]), doc

    space = storage / "shared" / "proj" / "tool" / "hello"
    r = on(storage, "object", "which", "hello",
           env=env_of(storage, CTX_PATH="/ctx/shared/proj/tool"))  # fmt: skip
    assert r.out == f"{space}\n", r
    home = tmp_path / "ctxhome"
    home.mkdir()
    (home / ".tshrc").write_text(f"CTX_PATH=/ctx/home/{os.geteuid()}/tool\n")
    r = on(storage, "object", "which", "hello", "--json",
           env=env_of(storage, CTX_HOME=str(home), CTX_PATH="/ctx/shared/proj/tool"))  # fmt: skip
    assert r.json()["path"] == str(user_hello), r
    assert r.json()["search_path"]["source"] == str(home / ".tshrc"), r

    none = on(storage, "object", "which", "nosuch")
    assert none.rc == 1 and "ENOENT" in none.err and none.out == "", none


def test_object_check_json_gives_each_manifest_its_verdict(tmp_path: Path) -> None:
    good = tool_manifest(tmp_path / "m", "hello", "#!/bin/sh\necho hi\n")
    bad = tmp_path / "m" / "bad.json"
    bad.write_text(json.dumps({**json.loads(good.read_text()), "name": "bad/name"}))

    r = ctx_run("object", "check", good, bad, "--json")
    assert r.rc == 1, r
    verdicts = {d["manifest"]: d for d in r.json()}
    assert verdicts[str(good)]["valid"] is True and verdicts[str(good)]["name"] == "hello"
    assert verdicts[str(bad)]["valid"] is False and verdicts[str(bad)]["problems"], r
    assert f"{bad}: EINVAL:" in r.err, r
    ok = ctx_run("object", "check", good)
    assert ok.rc == 0, ok


# ------------------------------------------------------------------------------ ctx agent


@as_root
def test_agent_create_user_gid_and_groups_set_the_identity(
    storage: Path, unprivileged_user: UnprivilegedUser
) -> None:
    def create(name: str, *options: str):
        req = json.dumps({"name": name, "label": f"{name}_t", "tools": []})
        return on(storage, "agent", "create", "-", "--json", *options, input=req)

    default = create("plain")
    assert default.rc == 0, default
    assert default.json()["identity"] == {"uid": NOBODY, "gid": NOBODY, "groups": [NOBODY]}
    assert default.json()["default_user"] == "nobody"

    user = create("named", "--user", unprivileged_user.name)
    assert user.rc == 0 and user.json()["default_user"] is None, user
    assert user.json()["identity"] == {
        "uid": unprivileged_user.uid,
        "gid": unprivileged_user.gid,
        "groups": unprivileged_user.groups,
    }, user

    explicit = create("numeric", "--user", "4321", "--gid", "777", "--groups", "777,888")
    assert explicit.rc == 0, explicit
    identity = json.loads((storage / "agent" / "numeric.d" / "identity").read_text())
    assert identity == {"uid": 4321, "gid": 777, "groups": [777, 888]}

    refused = create("boss", "--user", "root")
    assert refused.rc == 2 and "EINVAL" in refused.err, refused
    assert not (storage / "agent" / "boss").exists()
    assert not (storage / "agent" / "boss.d").exists()


@as_root
def test_agent_created_by_root_with_a_group_but_no_user_says_it_runs_as_nobody(
    storage: Path,
) -> None:
    req = json.dumps({"name": "grouped", "label": "grouped_t", "tools": []})
    r = on(storage, "agent", "create", "-", "--gid", "777", "--json", input=req)
    assert r.rc == 0, r
    assert r.json()["identity"]["uid"] == NOBODY and r.json()["identity"]["gid"] == 777, r
    req = json.dumps({"name": "grouped2", "label": "grouped2_t", "tools": []})
    text = on(storage, "agent", "create", "-", "--groups", "5", input=req)
    assert text.rc == 0, text
    assert "runs as user nobody" in text.out, text
    assert r.json()["default_user"] == "nobody", r


@as_root
def test_agent_list_and_show_json_give_the_documented_fields(storage: Path) -> None:
    make_agent(storage, ["fs.read"], name="coder")
    listed = on(storage, "agent", "list", "--json")
    assert listed.rc == 0, listed
    assert listed.json() == [
        {
            "name": "coder",
            "label": "coder_t",
            "identity": {"uid": NOBODY, "gid": NOBODY, "groups": [NOBODY]},
            "problems": [],
        }
    ], listed
    text = on(storage, "agent", "list")
    assert text.lines() == [f"coder  coder_t  uid {NOBODY}, gid {NOBODY}"], text

    shown = on(storage, "agent", "show", "coder", "--json")
    assert shown.rc == 0, shown
    doc = shown.json()
    assert doc["name"] == "coder" and doc["label"] == "coder_t", doc
    assert doc["ctx_path"] == f"/ctx/tool:/ctx/home/{NOBODY}/tool", doc
    assert [str(storage), "/ctx", "ro"] in doc["mounts"], doc
    assert doc["terminals"] == [] and doc["problems"] == [], doc
    assert "tool_mounts" in doc and "withheld_mounts" in doc, doc


@as_root
def test_for_a_user_who_is_not_root_the_defaults_are_their_own_identity_and_tier(
    unprivileged_user: UnprivilegedUser, traversable: Path
) -> None:
    """--user/--gid/--groups default to the creating user; --tier user is their home."""
    mine = traversable / "mine"
    mine.mkdir()
    os.chown(mine, unprivileged_user.uid, unprivileged_user.gid)
    root = mine / "storage"
    env = clean_env(CTX_STORAGE=str(root))

    def ctx_as(*args: str, stdin: str | None = None):
        return run_as(unprivileged_user, [*CTX_ARGV, *args], unprivileged_user.groups,
                      env=env, cwd=mine, stdin=stdin)  # fmt: skip

    assert ctx_as("bootstrap").returncode == 0
    made = ctx_as("agent", "create", "-", "--json",
                  stdin=json.dumps({"name": "me", "label": "me_t", "tools": []}))  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["identity"] == {
        "uid": unprivileged_user.uid,
        "gid": unprivileged_user.gid,
        "groups": unprivileged_user.groups,
    }, made.stdout
    assert json.loads(made.stdout)["default_user"] is None
    other = ctx_as("agent", "create", "-", "--user", "4321", "--gid", "4321",
                   stdin=json.dumps({"name": "other", "label": "o_t", "tools": []}))  # fmt: skip
    assert other.returncode == 1 and "EPERM" in other.stderr, other.stderr
    assert not (root / "agent" / "other").exists()

    (mine / "h.sh").write_text("#!/bin/sh\necho hi\n")
    (mine / "h.json").write_text(json.dumps({
        "manifest": 2, "kind": "tool", "name": "hello", "description": "d",
        "schema": {"type": "object"}, "cap": {"side_effects": False, "network": False},
        "exec": "h.sh",
    }))  # fmt: skip
    installed = ctx_as("object", "install", str(mine / "h.json"), "--tier", "user", "--json")
    assert installed.returncode == 0, installed.stderr
    expected = root / "home" / str(unprivileged_user.uid) / "tool" / "hello"
    assert json.loads(installed.stdout)["path"] == str(expected)
    listed = ctx_as("object", "list", "--tier", "user", "--json")
    assert [t["path"] for t in json.loads(listed.stdout)] == [str(expected)], listed.stdout


@contextlib.contextmanager
def terminals(storage: Path, agent: str) -> Iterator[list[str]]:
    """The sessions of ``agent`` a block starts (it appends each), stopped on the way out."""
    started: list[str] = []
    try:
        yield started
    finally:
        for session in started:
            on(storage, "agent", "stop", agent, "--session", session)


def start(storage: Path, started: list[str], session: str, *options: str, cwd: Path) -> dict:
    r = on(storage, "agent", "start", "coder", "--session", session, "--json", *options, cwd=cwd)
    assert r.rc == 0, r
    started.append(session)
    return r.json()


def ask(facts: dict, line: str) -> str:
    """What tsh prints for ``line`` typed in the terminal ``ctx agent start`` described."""
    client = Raw(Path(facts["listening_at"]), b"attach\n")
    try:
        assert client.shows(AGENT_PROMPT), client.text()
        return client.answer(line)
    finally:
        client.close()


def host_with_coder(storage: Path, *mounts: list[str]) -> tuple[Path, Path]:
    """Agent ``coder`` (uid nobody) allowed ``shell.exec``, with ``mounts`` in its request;
    two directories every uid may enter, ``ws`` and ``here``."""
    req = {"name": "coder", "label": "coder_t", "tools": ["shell.exec"], "mount": list(mounts)}
    assert on(storage, "agent", "create", "-", input=json.dumps(req)).rc == 0
    allow_in_tool_policy(storage, "shell.exec", "coder_t")
    made = []
    for name in ("ws", "here"):
        d = storage.parent / name
        d.mkdir(mode=0o755, exist_ok=True)
        d.chmod(0o755)
        made.append(d)
    return made[0], made[1]


ASK_WORKSPACE = "shell.exec 'echo cwd=$CTX_CWD; echo mounts=$CTX_MOUNTS'"


@as_root
@needs_bwrap
def test_agent_start_workspace_no_workspace_session_watch_and_stop_json(storage: Path) -> None:
    ws, here = host_with_coder(storage)
    with terminals(storage, "coder") as started:
        given = start(storage, started, "w1", "--workspace", str(ws), cwd=here)
        assert given["workspace"] == str(ws) and given["session"] == "w1", given
        link = storage / "home" / str(NOBODY) / "agent" / "coder" / "session" / "w1"
        assert given["socket"] == str(link / "terminal" / "main.sock"), given
        said = ask(given, ASK_WORKSPACE)
        assert "cwd=/workspace" in said and f'["{ws}", "/workspace", "rw"]' in said, said

        default = start(storage, started, "w2", cwd=here)
        assert default["workspace"] == str(here), default

        bare = start(storage, started, "w3", "--no-workspace", cwd=here)
        assert bare["workspace"] is None, bare
        said = ask(bare, ASK_WORKSPACE)
        assert "cwd=" in said and "cwd=/workspace" not in said, said
        assert "/workspace" not in said.split("mounts=", 1)[1], said

        terms = on(storage, "agent", "show", "coder", "--json").json()["terminals"]
        assert sorted(t["session"] for t in terms) == ["w1", "w2", "w3"], terms

        watcher = subprocess.Popen(
            [*CTX_ARGV, "agent", "watch", "coder", "--session", "w3"],
            env=env_of(storage),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        seen = bytearray()

        def pump() -> None:
            while chunk := os.read(watcher.stdout.fileno(), 65536):
                seen.extend(chunk)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            for _ in range(20):  # until the watcher, once connected, shows the tool's output
                ask(bare, "shell.exec 'echo seen-$((40+2))'")
                if wait_for(lambda: b"seen-42" in seen, 0.5):
                    break
            assert b"seen-42" in seen, bytes(seen)
            stopped = on(storage, "agent", "stop", "coder", "--session", "w3", "--json")
            started.remove("w3")
            assert stopped.rc == 0, stopped
            assert set(stopped.json()) == {"agent", "session", "pid"}, stopped
            assert stopped.json()["session"] == "w3", stopped
            watcher.wait(timeout=15)
        finally:
            if watcher.poll() is None:
                watcher.kill()
                watcher.wait()
            reader.join(timeout=5)
        assert watcher.returncode == 0, watcher.stderr.read()
    again = on(storage, "agent", "stop", "coder", "--session", "w3")
    assert again.rc == 1 and "ENOENT" in again.err, again
    for verb in ("watch", "attach"):
        other = on(storage, "agent", verb, "coder", "--session", "w3")
        assert other.rc == 1 and "ENOENT" in other.err, other


@as_root
@needs_bwrap
def test_agent_start_json_names_the_agents_own_workspace_whatever_the_options(
    storage: Path,
) -> None:
    own = storage.parent / "own"
    own.mkdir(mode=0o755)
    ws, here = host_with_coder(storage, [str(own), "/workspace", "rw"])
    with terminals(storage, "coder") as started:
        bare = start(storage, started, "n1", "--no-workspace", cwd=here)
        given = start(storage, started, "n2", "--workspace", str(ws), cwd=here)
        said = ask(given, ASK_WORKSPACE)
    assert f'["{own}", "/workspace", "rw"]' in said and str(ws) not in said, said
    log = read_jsonl(storage / "agent" / "coder.d" / "log")
    recorded = {e["session"]: e["workspace"] for e in log if e["type"] == "terminal.started"}
    assert recorded == {"n1": str(own), "n2": str(own)}, log  # the log names it either way
    # docs/tools.md: --json reports the directory at /workspace, the default or the agent's own
    assert (bare["workspace"], given["workspace"]) == (str(own), str(own)), (bare, given)


# ------------------------------------------------------------------------------ ctx run


@as_root
def test_run_session_project_native_and_timeout(
    storage: Path, unprivileged_user: UnprivilegedUser
) -> None:
    assert on(storage, "shared", "create", "team", "--group", str(unprivileged_user.gid)).rc == 0
    req = {
        "name": "sh",
        "label": "sh_t",
        "tools": ["shell.exec"],
        "shared": {"team": ["read", "write"]},
    }
    made = on(storage, "agent", "create", "-", "--user", unprivileged_user.name,
              input=json.dumps(req))  # fmt: skip
    assert made.rc == 0, made
    allow_in_tool_policy(storage, "shell.exec", "sh_t")
    home = storage / "home" / str(unprivileged_user.uid) / "agent" / "sh" / "session"

    plain = on(storage, "run", "--agent", "sh", "shell.exec", "echo plain")
    assert (plain.rc, plain.out) == (0, "plain\n"), plain
    assert [e["type"] for e in read_jsonl(home / "default" / "events.jsonl")] == [
        "tool_call",
        "tool_result",
    ]
    named = on(storage, "run", "--agent", "sh", "--session", "s7", "shell.exec", "echo s7")
    assert named.rc == 0 and len(read_jsonl(home / "s7" / "events.jsonl")) == 2, named
    shared = storage / "shared" / "team" / "agent" / "sh" / "session" / "s8" / "events.jsonl"
    inspace = on(storage, "run", "--agent", "sh", "--project", "team", "--session", "s8",
                 "shell.exec", "echo team")  # fmt: skip
    assert inspace.rc == 0 and len(read_jsonl(shared)) == 2, inspace
    assert not (home / "s8").exists()

    native = on(storage, "run", "--agent", "sh", "--native", "shell.exec",
                input='{"cmd": "echo native"}')  # fmt: skip
    frames = events_of(native.out)
    assert native.rc == 0 and [f["type"] for f in frames] == ["call", "result"], native
    assert frames[-1]["output"] == "native\n", frames

    started = time.monotonic()
    slow = on(storage, "run", "--agent", "sh", "--native", "--timeout", "0.5", "shell.exec",
              input='{"cmd": "sleep 20"}')  # fmt: skip
    assert time.monotonic() - started < 10 and slow.rc == 1, slow
    assert events_of(slow.out)[-1]["error"]["error"] == "ETIMEDOUT", slow
    slow = on(storage, "run", "--agent", "sh", "--timeout", "0.5", "shell.exec", "sleep 20")
    assert slow.rc == 137 and "ETIMEDOUT" in slow.err, slow


# ------------------------------------------------------------------------------ the rest


def test_bootstrap_json_lists_what_it_made_and_a_bad_source_changes_nothing(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    first = ctx_run("bootstrap", "--storage", root, "--json")
    assert first.rc == 0, first
    assert set(first.json()) == {"root", "created", "repaired", "problems", "warnings"}, first
    created = first.json()["created"]
    assert {"bin", "tool", "agent", "model", "home", "shared"} <= set(created), first
    assert "tool/fs.read" in created and first.json()["root"] == str(root), first
    before = snapshot(root)
    empty = tmp_path / "src"
    empty.mkdir()
    bad = ctx_run("bootstrap", empty, "--storage", root)
    assert bad.rc == 2 and "EINVAL" in bad.err, bad
    assert snapshot(root) == before
    fresh = tmp_path / "fresh"
    bad = ctx_run("bootstrap", empty, "--storage", fresh)
    assert bad.rc == 2 and not fresh.exists(), bad

    # a SOURCE tree without a pyproject.toml gives its own pages; without SOURCE, ctx's own
    admin = tmp_path / "admin"
    shutil.copytree(REPO / "docs" / "spec", admin / "docs" / "spec")
    with (admin / "docs" / "spec" / "README.md").open("a") as page:
        page.write("A LINE OF THE ADMINISTRATOR\n")
    readme = root / "shared" / "cortexfs-docs" / "README.md"
    given = ctx_run("bootstrap", admin, "--storage", root, "--json")
    assert given.rc == 0, given
    assert given.json()["repaired"] == ["shared/cortexfs-docs/README.md"], given
    assert readme.read_text().endswith("A LINE OF THE ADMINISTRATOR\n")
    plain = ctx_run("bootstrap", "--storage", root, "--json")
    assert plain.rc == 0 and plain.json()["repaired"] == ["shared/cortexfs-docs/README.md"]
    assert plain.json()["created"] == [], plain
    assert "A LINE OF THE ADMINISTRATOR" not in readme.read_text()


def test_man_reads_the_bundle_of_the_storage_root_it_is_given(
    storage: Path, tmp_path: Path
) -> None:
    page = storage / "shared" / "cortexfs-docs" / "man" / "ctx.agent.md"
    page.write_text(page.read_text() + "\nA LINE ONLY THIS ROOT HAS\n")

    r = on(storage, "man", "agent", "--json")
    assert r.rc == 0, r
    doc = r.json()
    assert (doc["origin"], doc["path"]) == ("installed", str(page)), doc
    assert "A LINE ONLY THIS ROOT HAS" in doc["text"]

    bare = tmp_path / "bare"
    bare.mkdir()
    r = ctx_run("man", "agent", "--storage", bare, "--json")
    assert r.rc == 0 and r.json()["origin"] == "built-in", r
    assert "A LINE ONLY THIS ROOT HAS" not in r.json()["text"] and "built into" in r.err, r
    assert list(bare.iterdir()) == []

    topics = on(storage, "man", "--json")
    assert topics.rc == 0, topics
    assert {t["topic"] for t in topics.json()} >= {"README", "agent", "tool", "session"}


@as_root
def test_shared_create_group_gives_the_space_that_group(
    storage: Path, unprivileged_user: UnprivilegedUser
) -> None:
    r = on(storage, "shared", "create", "team", "--group", unprivileged_user.name, "--json")
    assert r.rc == 0 and r.json()["gid"] == unprivileged_user.gid, r
    space = storage / "shared" / "team"
    modes = {
        space: 0o3770,
        space / "agent": 0o3770,
        space / "queue": 0o3770,
        space / "data": 0o2770,
        space / "tool": 0o2750,
        space / "queue" / "pending": 0o2770,
    }
    for path, mode in modes.items():
        st = path.stat()
        assert (st.st_gid, st.st_mode & 0o7777) == (unprivileged_user.gid, mode), path

    mine = on(storage, "shared", "create", "solo", "--json")
    assert mine.rc == 0 and mine.json()["gid"] == os.getegid(), mine
    assert (storage / "shared" / "solo").stat().st_gid == os.getegid()

    # --group on a space another group made gives it that group, its jobs too
    job = QueueCLI(storage, "solo").publish(name="j")
    regroup = on(storage, "shared", "create", "solo", "--group", unprivileged_user.name, "--json")
    assert regroup.rc == 0 and regroup.json()["regrouped"] > 0, regroup
    pending = storage / "shared" / "solo" / "queue" / "pending" / job
    assert pending.stat().st_gid == unprivileged_user.gid


def test_tool_json_gives_the_configuration_as_one_object_and_updates_it(
    storage: Path,
) -> None:
    config = storage / "tool" / "tsh.d" / "config"
    text = on(storage, "tool", "tsh.config")
    assert text.rc == 0, text
    assert text.lines() == ["max_loaded_tools=64", "cache_capacity=32", "window_percent=1"]

    doc = on(storage, "tool", "--json", "tsh.config", "cache_capacity=40")
    assert doc.rc == 0, doc
    assert doc.json()["config"] == {
        "max_loaded_tools": 64,
        "cache_capacity": 40,
        "window_percent": 1,
    }, doc
    assert doc.json()["changed"] == ["cache_capacity"] and doc.json()["path"] == str(config)
    assert "cache_capacity=40" in config.read_text().splitlines()

    refused = on(storage, "tool", "fs.write")
    assert refused.rc == 1 and "EACCES" in refused.err, refused


@needs_fuse_as_root
def test_mount_as_shows_only_the_agents_view(storage: Path, tmp_path: Path) -> None:
    make_agent(storage, ["fs.read", "fs.list"], name="coder")
    allow_in_tool_policy(storage, "fs.read", "coder_t")  # fs.list: the tool's side denies
    host_view = storage.parent / "host-view"
    agent_view = storage.parent / "agent-view"
    with ctx_mount(storage, host_view), ctx_mount(storage, agent_view, "--as", "coder"):
        host_tools = set(os.listdir(host_view / "tool"))
        agent_tools = set(os.listdir(agent_view / "tool"))
        host_agents = set(os.listdir(host_view / "agent"))
        agent_agents = set(os.listdir(agent_view / "agent"))
    assert {"fs.read", "fs.list", "fs.write", "shell.exec"} <= host_tools
    assert "fs.read" in agent_tools and not {"fs.list", "fs.write", "shell.exec"} & agent_tools
    assert {"coder", "coder.d"} <= host_agents
    assert agent_agents == {"coder", "coder.d"}


def test_version_prints_one_line_with_the_package_version() -> None:
    declared = next(
        line.split("=", 1)[1].strip().strip('"')
        for line in (REPO / "pyproject.toml").read_text().splitlines()
        if line.startswith("version")
    )
    r = ctx_run("--version")
    assert (r.rc, r.out) == (0, f"ctx, version {declared}\n"), r
