"""End-to-end flows of the shared queue (SPEC §1, §2, §3): the command lines of §2.4 as
printed there, the evidence of §2.1 on disk after every step, a queue named by a name, by
``--storage``/``CTX_STORAGE`` and by its path, projects whose queue was never initialised or
lost a state directory, repeated operations, non-jobs beside real jobs, and
``ctx queue work --drain`` beside claims made by hand."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    SUFFIX,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    is_object_name,
    request,
    rfc3339,
    snapshot,
)
from tests.acceptance.workercli import allow_in_tool_policy, make_agent, shell_job
from tests.support.storage import copy_of_root

BOOT_ID = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
PID_NS = os.stat("/proc/self/ns/pid").st_ino

# Every command of §2.4's block, as printed there (J given without its suffix).
EVERY_COMMAND = [
    ("publish", "--name", "j", "-"),
    ("publish", "--batch", "-"),
    ("claim",),
    ("claim", "--json"),
    ("renew", "j"),
    ("finish", "j", "--ok", "-"),
    ("status",),
    ("status", "--json"),
    ("list", "--state", "pending", "--json"),
    ("show", "j"),
    ("recover", "--dry-run"),
    ("recover", "--reconcile", "--grace", "0", "--json"),
    ("work", "--drain"),
]


def layout(qdir: Path) -> set[str]:
    """Every path under the queue directory except its config file, relative to it."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(qdir):
        for name in dirnames + filenames:
            found.add(str(Path(dirpath, name).relative_to(qdir)))
    found.discard("config")
    return found


def claimed(job: str) -> set[str]:
    """§2.1: the claimed state of J is ``claimed/J/J`` and ``lease/J/worker``."""
    return {f"claimed/{job}", f"claimed/{job}/{job}", f"lease/{job}", f"lease/{job}/worker"}


def terminal(job: str, state: str) -> set[str]:
    return {f"{state}/{job}", f"{state}/{job}.result"}


def json_lines(r: Run) -> list[dict]:
    return [json.loads(line) for line in r.lines() if line.strip()]


def close_to(value, expected: float) -> bool:
    return isinstance(value, (int, float)) and abs(value - expected) < 0.05


# ------------------------------------------------------------------ a queue never initialised


@pytest.mark.parametrize("how", ["no-space", "bare-space", "queue-path", "no-storage-root"])
def test_every_command_on_a_queue_never_initialised_is_refused_until_init(storage, tmp_path, how):
    """§2.4 exit statuses and R-1: on a project whose queue nobody ran ``ctx queue init`` for
    (no space, a bare ``shared/P/``, an absolute queue path, a storage root that does not
    exist), every command of §2.4 is refused with exit 1 (never 3, "nothing to claim"),
    points at ``ctx queue init`` and creates nothing; with ``--json`` the refusal is JSON.
    After ``init`` the same queue takes a job."""
    root = storage
    if how == "no-space":
        where = ["--project", "never"]
    elif how == "bare-space":
        (storage / "shared" / "bare").mkdir()
        where = ["--project", "bare"]
    elif how == "queue-path":
        where = ["--project", str(tmp_path / "elsewhere" / "queue")]
    else:
        root = tmp_path / "no-root-yet"
        where = ["--project", "never"]
    env = clean_env(CTX_STORAGE=str(root))
    before = snapshot(storage)
    # every command once on a missing space and on a queue path; a sample on the others
    commands = EVERY_COMMAND if how in ("no-space", "queue-path") else EVERY_COMMAND[::3]

    for command in commands:
        r = ctx_run("queue", command[0], *where, *command[1:], env=env,
                    input=json.dumps(request()) + "\n")  # fmt: skip
        assert r.rc == 1, r
        assert "ctx: ENOENT: " in r.err and "ctx queue init" in r.err, r
        if "--json" in command:
            assert r.json()["error"] == "ENOENT", r
        else:
            assert r.out == "", r
    assert snapshot(storage) == before
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "no-root-yet").exists()

    assert ctx_run("queue", "init", *where, env=env).rc == 0
    r = ctx_run("queue", "publish", *where, "--name", "j", "-", env=env,
                input=json.dumps(request()))  # fmt: skip
    assert (r.rc, r.out) == (0, "j.req.json\n"), r
    r = ctx_run("queue", "claim", *where, env=env)
    assert (r.rc, r.out) == (0, "j.req.json\n"), r


def test_a_queue_that_lost_a_state_directory_is_refused_until_init_puts_back_only_it(queue, child):
    """§2 ("exactly these subdirectories"), Q-4, Q-6: with ``failed/`` removed under a claimed
    job, every command is refused (exit 1) naming ``failed/`` and ``ctx queue init``, and the
    claim and its lease stay byte for byte; ``init`` makes only the missing directory, after
    which ``finish --error`` makes the failed pair."""
    done = queue.publish(request(), name="first")
    assert queue.claim() == done
    queue.finish(done)
    job = queue.publish(request(n=2), name="second")
    assert queue.claim("--pid", str(child.pid)) == job
    (queue.dir / "failed").rmdir()
    before = snapshot(queue.storage)

    for args in (
        ("status",),
        ("list",),
        ("publish", "--name", "third", "-"),
        ("claim",),
        ("renew", job),
        ("finish", job, "--error", "-"),
        ("finish", job, "--ok", "-"),
        ("recover", "--reconcile"),
    ):
        r = queue.run(*args, input='"boom"')
        assert r.rc == 1, r
        assert "failed/" in r.err and "ctx queue init" in r.err, r
    assert snapshot(queue.storage) == before

    r = queue.run("init")
    assert r.rc == 0, r
    after = snapshot(queue.storage)
    added = set(after) - set(before)
    assert added == {"shared/proj/queue/failed"}, added
    assert {k: v for k, v in after.items() if k not in added} == before

    r = queue.run("finish", job, "--error", "-", input='"boom"')
    assert r.rc == 0, r
    assert layout(queue.dir) == QUEUE_SUBDIRS | terminal(done, "done") | terminal(job, "failed")
    assert json.loads((queue.dir / "failed" / f"{job}.result").read_text())["output"] == "boom"


# ------------------------------------------------------------------ one job life, step by step


def test_each_step_of_a_job_life_leaves_exactly_the_evidence_of_section_2_1(queue, child, tmp_path):
    """§2.1, Q-1…Q-4, Q-3's holder fields, Q-9, §2.4: publish (``--name`` with and without
    the suffix, from FILE, ``-`` and ``--batch -``), claim (text and ``--json``), renew and
    finish (``--ok RESULT_FILE``, ``--error -``) each leave exactly the files of §2.1, stdout
    of publish and claim is J alone, and the lease names its holder."""
    base = set(QUEUE_SUBDIRS)
    assert layout(queue.dir) == base
    src = tmp_path / "alpha.json"
    src.write_text(json.dumps(request("fs.read", mark="alpha")))

    r = queue.run("publish", "--name", "alpha", src)
    assert (r.rc, r.out) == (0, "alpha.req.json\n"), r
    assert layout(queue.dir) == base | {"pending/alpha.req.json"}
    r = queue.run("publish", "--name", "beta.req.json", "-",
                  input=json.dumps(request("fs.stat", mark="beta")))  # fmt: skip
    assert (r.rc, r.out) == (0, "beta.req.json\n"), r
    lines = [request("fs.list", mark=f"line{n}") for n in (1, 2)]
    r = queue.run("publish", "--batch", "-", input="".join(json.dumps(x) + "\n" for x in lines))
    assert r.rc == 0, r
    batch = r.lines()
    assert len(batch) == 2 and all(is_object_name(j) and j.endswith(SUFFIX) for j in batch), r
    pending = {"alpha.req.json", "beta.req.json", *batch}
    assert layout(queue.dir) == base | {f"pending/{j}" for j in pending}
    listed = queue.run("list", "--state", "pending", "--json")
    assert {x["name"] for x in listed.json()} == pending, listed

    # the oldest first; the holder is the process that ran ctx (this test)
    r = queue.run("claim", "--ttl", "120")
    assert (r.rc, r.out) == (0, "alpha.req.json\n"), r
    pending.discard("alpha.req.json")
    assert layout(queue.dir) == base | {f"pending/{j}" for j in pending} | claimed("alpha.req.json")
    lease = queue.lease("alpha.req.json")
    assert lease["pid"] == os.getpid() and lease["host"] == socket.gethostname()
    assert (lease["boot_id"], lease["pid_ns"]) == (BOOT_ID, PID_NS)
    assert isinstance(lease["worker"], str) and lease["worker"]
    assert any(close_to(v, psutil.Process().create_time()) for v in lease.values()), lease
    span = rfc3339(lease["expires_at"]) - rfc3339(lease["claimed_at"])
    assert 115 <= span.total_seconds() <= 125, lease

    r = queue.run("claim", "--json", "--pid", str(child.pid), "--worker", "w-2", "--ttl", "90")
    assert r.rc == 0, r
    got = r.json()
    assert got["name"] == "beta.req.json", got
    on_disk = json.loads((queue.dir / "claimed/beta.req.json/beta.req.json").read_text())
    assert got["request"] == on_disk and on_disk["mark"] == "beta"
    assert {"tool", "input", "from", "created"} <= set(on_disk)
    held = queue.lease("beta.req.json")
    assert (held["pid"], held["worker"]) == (child.pid, "w-2")
    assert any(close_to(v, psutil.Process(child.pid).create_time()) for v in held.values())

    r = queue.run("renew", "alpha", "--ttl", "600")
    assert r.rc == 0, r
    renewed = queue.lease("alpha.req.json")
    assert rfc3339(renewed["expires_at"]) > rfc3339(lease["expires_at"])
    assert renewed["pid"] == os.getpid()

    out = tmp_path / "out.json"
    out.write_text(json.dumps({"answer": 42}))
    r = queue.run("finish", "alpha", "--ok", out)
    assert r.rc == 0, r
    r = queue.run("finish", "beta.req.json", "--error", "-", input="boom")
    assert r.rc == 0, r
    final = base | {f"pending/{j}" for j in batch}
    final |= terminal("alpha.req.json", "done") | terminal("beta.req.json", "failed")
    assert layout(queue.dir) == final
    for job, state, status, output in (
        ("alpha.req.json", "done", "ok", {"answer": 42}),
        ("beta.req.json", "failed", "error", "boom"),
    ):
        res = json.loads((queue.dir / state / f"{job}.result").read_text())
        assert (res["status"], res["output"]) == (status, output), res
        assert isinstance(res["worker"], dict), res
        assert rfc3339(res["finished"]) >= rfc3339(res["started"])
    assert json.loads((queue.dir / "done/alpha.req.json").read_text())["mark"] == "alpha"

    status = queue.run("status", "--json")
    assert status.rc == 0, status
    counts = status.json()["counts"]
    assert [counts[s] for s in ("pending", "claimed", "done", "failed")] == [2, 0, 1, 1]
    r = queue.run("recover")
    assert r.rc == 0, r
    assert layout(queue.dir) == final


# ------------------------------------------------------------------ repeated operations


def test_repeating_each_operation_never_duplicates_or_overwrites_a_job(queue, tmp_path):
    """Q-1, Q-2, Q-4, Q-6, I-3, I-5, §2.4: one FILE published twice is two jobs; a name given
    with or without ``.req.json`` is one job and cannot be published twice, before or after it
    is finished; a batch with a bad line publishes nothing; claims stop at exit 3 after each job
    was taken once; a second finish, a renew after finish, a second init and a second recover
    change nothing."""
    src = tmp_path / "same.json"
    src.write_text(json.dumps(request(mark="same")))
    first = queue.run("publish", src)
    second = queue.run("publish", src)
    assert first.rc == second.rc == 0, (first, second)
    made = [first.out.strip(), second.out.strip()]
    assert made[0] != made[1] and all(is_object_name(j) for j in made), made
    assert first.lines() == [made[0]] and second.lines() == [made[1]]

    assert queue.run("publish", "--name", "dup", "-", input=json.dumps(request(n=1))).rc == 0
    again = queue.run("publish", "--name", "dup.req.json", "-", input=json.dumps(request(n=2)))
    assert again.rc == 1 and "EEXIST" in again.err and again.out == "", again
    assert json.loads((queue.dir / "pending/dup.req.json").read_text())["n"] == 1

    before = layout(queue.dir)
    good = json.dumps(request(n=3))
    bad = queue.run("publish", "--batch", "-", input=f"{good}\n{{not json\n{good}\n")
    assert bad.rc == 1 and bad.out == "", bad
    assert layout(queue.dir) == before and queue.entries("inbox") == set()

    taken = []
    for _ in range(3):
        r = queue.run("claim")
        assert r.rc == 0 and len(r.lines()) == 1, r
        taken.append(r.out.strip())
    assert sorted(taken) == sorted([*made, "dup.req.json"])
    empty = queue.run("claim")
    assert (empty.rc, empty.out) == (3, ""), empty

    queue.finish("dup")
    result = (queue.dir / "done/dup.req.json.result").read_bytes()
    twice = queue.run("finish", "dup", "--error", "-", input='"late"')
    assert twice.rc == 1, twice
    assert queue.run("renew", "dup").rc == 1
    republish = queue.run("publish", "--name", "dup", "-", input=json.dumps(request(n=4)))
    assert republish.rc == 1 and "EEXIST" in republish.err, republish
    assert (queue.dir / "done/dup.req.json.result").read_bytes() == result
    assert not (queue.dir / "pending/dup.req.json").exists()

    settled = snapshot(queue.dir)
    for args in (("init",), ("recover",), ("recover",), ("recover", "--reconcile")):
        r = queue.run(*args)
        assert r.rc == 0, r
        assert snapshot(queue.dir) == settled, args


# ------------------------------------------------------------------ one queue, many addresses


def test_one_queue_named_by_project_storage_env_and_path_is_one_queue(_template, tmp_path):
    """§2.4 ("--storage DIR (or CTX_STORAGE) and --project NAME (or a queue path)"), R-1: a
    job published by each way of naming the queue — name with CTX_STORAGE, ``--storage``
    beating another CTX_STORAGE, an absolute queue path (CTX_STORAGE naming nothing), and the
    relative paths ``./queue`` and ``queue/`` — lands in the one queue every way lists; the
    other root is not touched and the missing one not made."""
    root, other = tmp_path / "root", tmp_path / "other"
    copy_of_root(_template, root)
    copy_of_root(_template, other)
    space = root / "shared" / "proj"
    qdir = space / "queue"
    ways = {
        "env": (["--project", "proj"], {"CTX_STORAGE": str(root)}, None),
        "option": (["--storage", root, "--project", "proj"], {"CTX_STORAGE": str(other)}, None),
        "abspath": (["--project", qdir], {"CTX_STORAGE": str(tmp_path / "nothing")}, None),
        "dotslash": (["--project", "./queue"], {"CTX_STORAGE": str(root)}, space),
        "slash": (["--project", "queue/"], {"CTX_STORAGE": str(root)}, space),
    }
    untouched = snapshot(other)

    def run(way: str, command: str, *args, **kw) -> Run:
        where, env, cwd = ways[way]
        return ctx_run("queue", command, *where, *args, env=clean_env(**env), cwd=cwd, **kw)

    for way in ways:
        r = run(way, "publish", "--name", way, "-", input=json.dumps(request(way=way)))
        assert (r.rc, r.out) == (0, f"{way}{SUFFIX}\n"), r
    names = {f"{way}{SUFFIX}" for way in ways}
    assert {p.name for p in (qdir / "pending").iterdir()} == names
    for way in ways:
        r = run(way, "list", "--json")
        assert r.rc == 0, r
        assert {x["name"] for x in r.json()} == names, (way, r)
    # claimed by path, finished by name, shown from the space's directory
    r = run("abspath", "claim")
    assert (r.rc, r.out) == (0, f"env{SUFFIX}\n"), r
    assert run("option", "finish", "env", "--ok", "-", input="{}").rc == 0
    shown = run("dotslash", "show", "env", "--json")
    assert shown.rc == 0 and shown.json()["state"] == "done", shown
    assert snapshot(other) == untouched
    assert not (tmp_path / "nothing").exists()


def test_a_queue_path_going_up_from_the_spaces_data_directory_names_its_queue(storage):
    """§2.4 ("--project NAME (or a queue path)"): a user working in ``shared/P/data`` names the
    queue beside it as ``../queue``, or by an absolute path through ``data/..``; both name
    project P's queue (docs/queue.md: a relative value with a '/' naming an existing queue
    directory is that queue)."""
    queue = QueueCLI(storage, "proj")
    job = queue.publish(request(), name="up")
    data = storage / "shared" / "proj" / "data"
    env = clean_env(CTX_STORAGE=str(storage))
    for where in ("../queue", str(data / ".." / "queue")):
        r = ctx_run("queue", "list", "--project", where, "--json", env=env, cwd=data)
        assert r.rc == 0, r
        assert [x["name"] for x in r.json()] == [job], r


# ------------------------------------------------------------------ Q-8 through a whole life


def test_non_jobs_beside_real_jobs_are_ignored_never_taken_or_replaced(queue, tmp_path):
    """Q-8, Q-1, §2.4: a symlink, a dot-file, a FIFO, a directory and an illegally named file
    in ``pending/`` and a symlink in ``done/`` are listed by ``status`` as ignored with a
    reason before, during and after real jobs run through claim and finish; no claim takes
    one, publish refuses their names (EEXIST) without replacing them, recover leaves them
    and the file a link points at is never touched."""
    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    pending, done = queue.dir / "pending", queue.dir / "done"
    (pending / "link.req.json").symlink_to(outside)
    (pending / ".dot.req.json").write_text(json.dumps(request()))
    os.mkfifo(pending / "fifo.req.json")
    (pending / "dir.req.json").mkdir()
    (pending / "bad name.req.json").write_text(json.dumps(request()))
    (done / "ghost.req.json").symlink_to(outside)
    hostile = {
        "pending/link.req.json",
        "pending/.dot.req.json",
        "pending/fifo.req.json",
        "pending/dir.req.json",
        "pending/bad name.req.json",
        "done/ghost.req.json",
    }
    planted = {k: v for k, v in snapshot(queue.dir).items() if k in hostile}

    def check_ignored(expected_counts: list[int], text: bool = False) -> None:
        r = queue.run("status", "--json")
        assert r.rc == 0, r
        doc = r.json()
        reasons = {x["path"]: x["reason"] for x in doc["ignored"]}
        assert set(reasons) == hostile and all(reasons.values()), doc
        counts = [doc["counts"][s] for s in ("pending", "claimed", "done", "failed")]
        assert counts == expected_counts, doc
        if text:
            said = queue.run("status")
            for path in hostile:
                assert any("ignored" in ln and path in ln for ln in said.lines()), (path, said)

    check_ignored([0, 0, 0, 0], text=True)
    for name in ("link", "fifo", "dir", "ghost"):
        r = queue.run("publish", "--name", name, "-", input=json.dumps(request()))
        assert r.rc == 1 and "EEXIST" in r.err and r.out == "", r
    jobs = [queue.publish(request(n=n), name=f"real{n}") for n in (1, 2)]
    check_ignored([2, 0, 0, 0])
    assert [queue.claim(), queue.claim()] == jobs
    check_ignored([0, 2, 0, 0])
    assert queue.run("claim").rc == 3
    queue.finish(jobs[0])
    queue.finish(jobs[1], "--error")
    check_ignored([0, 0, 1, 1], text=True)
    listed = queue.run("list")
    assert listed.rc == 0 and sorted(listed.out.split()) == sorted(["done", "failed", *jobs])
    r = queue.run("recover", "--reconcile", "--grace", "0")
    assert r.rc == 0, r
    assert {k: v for k, v in snapshot(queue.dir).items() if k in hostile} == planted
    assert outside.read_text() == "keep me"


# ------------------------------------------------------------------ §3 beside hand-made claims


@pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root")
def test_a_worker_drains_a_queue_named_by_path_beside_claims_made_by_hand(
    searchable_storage, traversable, child
):
    """W-1, W-2, Q-3, Q-5, Q-6, §2.4: on a queue outside the storage root, named by its path
    (tools from ``--storage``), ``work --drain`` runs only what is pending — a live process's
    claim and a claim left by an exited shell stay claimed — and exits 0; ``recover`` requeues
    the exited shell's job only (exit 0), a second drain runs it, the live holder's job is
    finished by hand, and then claim exits 3 and recover changes nothing."""
    root = searchable_storage
    make_agent(root, ["shell.exec"])
    allow_in_tool_policy(root, "shell.exec")
    qdir = traversable / "build" / "queue"
    env = clean_env(CTX_STORAGE=str(root))
    shared_before = sorted(os.listdir(root / "shared"))

    def q(command: str, *args, **kw) -> Run:
        kw.setdefault("env", env)
        return ctx_run("queue", command, "--project", qdir, *args, **kw)

    assert q("init").rc == 0
    assert set(os.listdir(qdir)) >= QUEUE_SUBDIRS
    cmds = ["echo a", "echo b", "exit 4", "echo d"]
    r = q("publish", "--batch", "-", input="".join(json.dumps(shell_job(c)) + "\n" for c in cmds))
    assert r.rc == 0, r
    jobs = r.lines()
    cmd_of = {j: json.loads((qdir / "pending" / j).read_text())["input"]["cmd"] for j in jobs}
    assert sorted(cmd_of.values()) == sorted(cmds)

    def expected(job: str) -> tuple[str, str | None]:
        """W-1: done with what ``echo`` printed, or failed on the non-zero exit."""
        cmd = cmd_of[job]
        return ("failed", None) if cmd == "exit 4" else ("done", cmd.split()[1] + "\n")

    def check_result(job: str) -> None:
        state, output = expected(job)
        res = json.loads((qdir / state / f"{job}.result").read_text())
        if state == "done":
            assert (res["status"], res["output"]) == ("ok", output), res
        else:
            assert res["status"] == "error" and "4" in json.dumps(res), res

    r = q("claim", "--pid", str(child.pid))
    assert r.rc == 0 and r.out.strip() in jobs, r
    live = r.out.strip()
    script = f'"$0" queue claim --project {qdir} >/dev/null; exit 0'
    subprocess.run(["sh", "-c", script, *CTX_ARGV], env=env, check=True, timeout=60)
    (dead,) = set(os.listdir(qdir / "claimed")) - {live}
    assert json.loads((qdir / "lease" / dead / "worker").read_text())["pid"] not in (
        os.getpid(),
        child.pid,
    )
    rest = [j for j in jobs if j not in (live, dead)]

    work = ["--storage", root, "--agent", "ci", "--drain", "--json"]
    r = q("work", *work, env=clean_env())
    assert r.rc == 0, r
    finished = {e["job"]: e["state"] for e in json_lines(r) if e.get("event") == "finish"}
    assert finished == {j: expected(j)[0] for j in rest}, r
    for j in rest:
        check_result(j)
    in_flight = QUEUE_SUBDIRS | claimed(live) | claimed(dead)
    assert layout(qdir) == in_flight.union(*(terminal(j, expected(j)[0]) for j in rest))

    r = q("recover")
    assert r.rc == 0, r
    assert dead in r.out and live in r.out, r
    assert (qdir / "pending" / dead).is_file() and not (qdir / "claimed" / dead).exists()
    assert claimed(live) <= layout(qdir)

    r = q("work", *work, env=clean_env())
    assert r.rc == 0, r
    finished = {e["job"]: e["state"] for e in json_lines(r) if e.get("event") == "finish"}
    assert finished == {dead: expected(dead)[0]}, r
    check_result(dead)
    assert q("finish", live, "--ok", "-", input='"by hand"').rc == 0
    states = {j: expected(j)[0] for j in jobs if j != live} | {live: "done"}
    assert layout(qdir) == QUEUE_SUBDIRS.union(*(terminal(j, s) for j, s in states.items()))

    empty = q("claim")
    assert (empty.rc, empty.out) == (3, ""), empty
    counts = q("status", "--json").json()["counts"]
    tally = [list(states.values()).count(x) for x in ("done", "failed")]
    assert [counts[x] for x in ("pending", "claimed", "done", "failed")] == [0, 0, *tally]
    settled = snapshot(qdir)
    for _ in range(2):
        assert q("recover", "--reconcile").rc == 0
        assert snapshot(qdir) == settled
    # the storage root only lent its tools: no queue and no space was made in it
    assert sorted(os.listdir(root / "shared")) == shared_before
