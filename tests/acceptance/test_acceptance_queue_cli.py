"""§2.4 the ``ctx queue`` commands as a new user meets them: what each prints, what it leaves
on disk (§2.1 states, Q-1..Q-4, Q-9) and its exit status (0 success, 1 refused or conflict,
2 usage error, 3 nothing to claim)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    SUFFIX,
    QueueCLI,
    age,
    clean_env,
    ctx_run,
    find_values,
    is_object_name,
    request,
    rfc3339,
    snapshot,
)

MIB = 1 << 20


# --- init -------------------------------------------------------------------------------------


def test_init_creates_the_queue_with_exactly_the_six_subdirectories(storage):
    """§2: ``shared/<project>/queue/`` has exactly inbox, pending, lease, claimed, done, failed.

    # reading: "exactly these subdirectories" constrains directories; the per-queue
    # ``queue/config`` data file that §2.1 mentions may sit beside them.
    """
    r = ctx_run("queue", "init", "--storage", storage, "--project", "alpha")
    assert r.rc == 0, r
    qdir = storage / "shared" / "alpha" / "queue"
    entries = {e.name: e for e in os.scandir(qdir)}
    assert {n for n, e in entries.items() if e.is_dir(follow_symlinks=False)} == QUEUE_SUBDIRS
    assert {n for n, e in entries.items() if not e.is_dir(follow_symlinks=False)} <= {"config"}
    for sub in QUEUE_SUBDIRS:
        assert os.listdir(qdir / sub) == [], sub


def test_storage_option_and_ctx_storage_address_the_same_queue(storage, tmp_path):
    """§2.4, R-1: every queue command takes --storage DIR or CTX_STORAGE; --storage wins.

    # reading: with both given, the explicit --storage names the root.
    """
    decoy = tmp_path / "decoy"
    publish = ["queue", "publish", "--project", "proj", "--name", "via-env", "-"]
    r = ctx_run(*publish, input=json.dumps(request()), env=clean_env(CTX_STORAGE=str(storage)))
    assert (r.rc, r.out) == (0, "via-env.req.json\n"), r
    listing = ["queue", "list", "--storage", storage, "--project", "proj", "--state", "pending"]
    r = ctx_run(*listing, env=clean_env(CTX_STORAGE=str(decoy)))
    assert r.rc == 0, r
    assert "via-env.req.json" in r.out.split()
    assert not decoy.exists()


@pytest.mark.parametrize("project", ["../escape", ".hidden", "a/b"])
def test_an_illegal_project_name_is_refused_with_einval(storage, project):
    """R-3, §2.4: a shared space name is an object name; anything else is EINVAL and creates
    nothing, inside the storage root or beside it.

    # reading: exit 1 (refused) or 2 (usage error) are both accepted.
    """
    before, beside = snapshot(storage), set(os.listdir(storage.parent))
    r = ctx_run("queue", "init", "--storage", storage, "--project", project)
    assert r.rc in (1, 2), r
    assert "EINVAL" in r.err
    assert snapshot(storage) == before
    assert set(os.listdir(storage.parent)) == beside


# --- publish ----------------------------------------------------------------------------------


def test_publish_prints_only_the_job_name_and_leaves_it_pending(queue):
    """§2.4, Q-1, §2.1: stdout is J alone on its line; the request is ``pending/J``; the
    staging directory holds no leftovers; extra request fields are kept."""
    req = request(priority="high", ticket=1234)
    r = queue.run("publish", "-", input=json.dumps(req))
    assert r.rc == 0, r
    job = r.out.removesuffix("\n")
    assert r.out == job + "\n"
    assert job.endswith(SUFFIX) and is_object_name(job), job
    assert queue.state(job) == "pending"
    assert json.loads((queue.dir / "pending" / job).read_text()) == req
    assert queue.entries("inbox") == set()


def test_publish_reads_the_request_from_a_file_argument(queue, tmp_path):
    """§2.4: ``publish ... FILE`` publishes the request held in FILE."""
    src = tmp_path / "request.json"
    src.write_text(json.dumps(request(tool="shell.exec")))
    r = queue.run("publish", "--name", "from-file", src)
    assert (r.rc, r.out) == (0, "from-file.req.json\n"), r
    assert json.loads((queue.dir / "pending" / "from-file.req.json").read_text())["tool"] == (
        "shell.exec"
    )


@pytest.mark.parametrize(
    ("given", "job"),
    [("report-1", "report-1.req.json"), ("report-2.req.json", "report-2.req.json")],
    ids=["without-suffix", "with-suffix"],
)
def test_publish_name_gets_the_req_json_suffix_only_when_missing(queue, given, job):
    """§2.4: ``--name J`` may omit ``.req.json``, which is then added (never doubled)."""
    r = queue.run("publish", "--name", given, "-", input=json.dumps(request()))
    assert (r.rc, r.out) == (0, job + "\n"), r
    assert queue.entries("pending") == {job}


def test_publish_batch_prints_each_name_and_publishes_every_line(queue, tmp_path):
    """§2.4: ``publish --batch`` takes one request per line and prints each J.

    # reading: the names are printed in the order of the lines.
    """
    lines = [request(n=i) for i in range(4)]
    src = tmp_path / "jobs.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    r = queue.run("publish", "--batch", src)
    assert r.rc == 0, r
    jobs = r.lines()
    assert len(jobs) == len(set(jobs)) == 4, r
    assert queue.entries("pending") == set(jobs)
    published = [json.loads((queue.dir / "pending" / j).read_text()) for j in jobs]
    assert published == lines


EVIDENCE = {
    "pending": ["pending/{J}"],
    "claimed": ["claimed/{J}/{J}"],
    "lease": ["lease/{J}/worker"],
    "done": ["done/{J}", "done/{J}.result"],
    "failed-result-only": ["failed/{J}.result"],
}


@pytest.mark.parametrize("where", list(EVIDENCE))
def test_publish_refuses_a_name_with_evidence_anywhere(queue, where):
    """Q-1, Q-6: a name with evidence in pending, claimed, lease, done or failed is refused
    with EEXIST (exit 1) and nothing is overwritten."""
    job = "taken" + SUFFIX
    for template in EVIDENCE[where]:
        path = queue.dir / template.format(J=job)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"original": where}))
    before = snapshot(queue.dir)
    r = queue.run("publish", "--name", "taken", "-", input=json.dumps(request()))
    assert r.rc == 1, r
    assert "EEXIST" in r.err
    assert r.out == ""
    assert snapshot(queue.dir) == before


@pytest.mark.parametrize(
    "name",
    [".hidden", "a/b", "n" * 56],
    ids=["dot-first", "slash", "65-bytes-with-suffix"],
)
def test_publish_refuses_an_illegal_job_name_with_einval(queue, name):
    """R-3, §2.1: J (suffix included) must be a legal object name of at most 64 bytes.

    # reading: refusing a bad --name may be exit 1 (refused) or 2 (usage error); either way
    # stderr says EINVAL and nothing is published.
    """
    r = queue.run("publish", "--name", name, "-", input=json.dumps(request()))
    assert r.rc in (1, 2), r
    assert "EINVAL" in r.err
    assert queue.entries("pending") == set()


def test_publish_accepts_a_job_name_of_exactly_64_bytes(queue):
    """R-3: 55 bytes plus ``.req.json`` is 64 bytes, the longest legal name."""
    job = queue.publish(request(), name="n" * 55)
    assert job == "n" * 55 + SUFFIX and len(job) == 64
    assert queue.state(job) == "pending"


def test_publish_refuses_a_request_over_1_mib_and_accepts_one_just_under(queue):
    """§2.1: requests are limited to 1 MiB; a larger one is refused with a clear error."""
    big = json.dumps(request(pad="x" * (MIB + 16)))
    r = queue.run("publish", "--name", "big", "-", input=big)
    assert r.rc == 1, r
    assert r.err.strip()
    assert queue.entries("pending") == set()
    assert queue.entries("inbox") == set()  # I-2: no partial request left anywhere

    near = json.dumps(request(pad=""))
    near = json.dumps(request(pad="x" * (MIB - len(near) - 64)))
    assert len(near.encode()) < MIB
    assert queue.publish(json.loads(near), name="near") == "near" + SUFFIX


@pytest.mark.parametrize("body", ["not json at all\n", "[1, 2, 3]\n"], ids=["text", "array"])
def test_publish_refuses_anything_but_one_json_object(queue, body):
    """§2.1: a request is one JSON object; anything else is refused (exit 1)."""
    r = queue.run("publish", "--name", "junk", "-", input=body)
    assert r.rc == 1, r
    assert queue.entries("pending") == set()


# --- claim ------------------------------------------------------------------------------------


def test_claim_prints_only_the_name_and_moves_the_job_to_claimed_with_a_lease(queue):
    """§2.4, Q-2, Q-3, §2.1: claimed = ``claimed/J/J`` and ``lease/J/worker``; pending is empty.
    The request was put in ``pending/`` by hand: ``pending/J`` alone is the pending state."""
    req = request(tool="shell.exec")
    job = queue.drop("by-hand", req)
    r = queue.run("claim")
    assert (r.rc, r.out) == (0, job + "\n"), r
    assert queue.state(job) == "claimed"
    assert queue.entries("pending") == set()
    assert os.listdir(queue.dir / "claimed" / job) == [job]
    assert os.listdir(queue.dir / "lease" / job) == ["worker"]
    assert json.loads((queue.dir / "claimed" / job / job).read_text()) == req
    assert queue.entries("inbox") == set()


def test_claim_leases_on_behalf_of_the_calling_process(queue):
    """Q-3, §2.4: without --pid the lease holder is the process that ran ``ctx`` (here, this
    test process), identified by host, boot id, pid namespace and pid."""
    queue.drop("mine")
    job = queue.claim()
    lease = queue.lease(job)
    assert isinstance(lease, dict)
    assert lease["pid"] == os.getpid()
    assert lease["host"] == socket.gethostname()
    assert lease["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert lease["pid_ns"] == os.stat("/proc/self/ns/pid").st_ino
    assert isinstance(lease["worker"], str) and lease["worker"]
    assert rfc3339(lease["expires_at"]) > rfc3339(lease["claimed_at"])


def test_claim_holder_is_the_parent_of_ctx_when_run_from_a_shell(queue):
    """§2.4: ``ctx queue claim`` run from a shell leases on behalf of that shell."""
    queue.drop("shell")
    script = f'"$0" queue claim --project {queue.project}; echo "shell=$$"'
    proc = subprocess.run(
        ["sh", "-c", script, *CTX_ARGV],
        capture_output=True,
        text=True,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    job, shell = proc.stdout.split()
    assert queue.lease(job)["pid"] == int(shell.removeprefix("shell="))


def test_claim_pid_worker_and_ttl_options_shape_the_lease(queue, child):
    """§2.4, Q-3: --pid names the holder, --worker its id, --ttl sets expires_at."""
    queue.drop("options")
    job = queue.claim("--pid", str(child.pid), "--worker", "builder-7", "--ttl", "600")
    lease = queue.lease(job)
    assert lease["pid"] == child.pid
    assert lease["worker"] == "builder-7"
    ttl = (rfc3339(lease["expires_at"]) - rfc3339(lease["claimed_at"])).total_seconds()
    assert 595 <= ttl <= 605, lease


def test_claim_json_prints_one_object_with_name_and_request(queue):
    """§2.4: ``claim --json`` prints one object with at least ``name`` and ``request``."""
    req = request(tool="fs.stat")
    job = queue.drop("as-json", req)
    r = queue.run("claim", "--json")
    assert r.rc == 0, r
    obj = r.json()
    assert obj["name"] == job
    assert obj["request"] == req


def test_claim_on_an_empty_queue_prints_nothing_and_exits_3(queue):
    """§2.4: nothing to claim is exit 3 with empty stdout; it is not an error (Q-2)."""
    r = queue.run("claim")
    assert (r.rc, r.out) == (3, ""), r
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()


def test_claim_json_on_an_empty_queue_exits_3_without_naming_a_job(queue):
    """§2.4: exit 3 when the queue is empty, with --json too.

    # reading: SPEC says "nothing" for text mode only; with --json either no output or an
    # object whose ``name`` is null/absent is accepted.
    """
    r = queue.run("claim", "--json")
    assert r.rc == 3, r
    if r.out.strip():
        assert r.json().get("name") is None, r


def test_claims_take_the_oldest_pending_job_first(queue):
    """Q-9: claims follow publish order (name order would be alpha, zeta).

    # reading: "best effort" still means a quiet queue fed one publish at a time is
    # claimed oldest first.
    """
    order = [queue.publish(name=n) for n in ("zeta", "alpha")]
    assert [queue.claim() for _ in order] == order


@pytest.fixture
def caches(tmp_path):
    """Two users' cache directories (the claim-order hint lives there): ``mine``, whose
    ``ctx`` claims, and ``theirs``, for what another user does to the same queue."""
    return {who: str(tmp_path / f"cache-{who}") for who in ("mine", "theirs")}


def as_user(queue, caches, who, command, *args, **kw):
    env = clean_env(CTX_STORAGE=str(queue.storage), XDG_CACHE_HOME=caches[who])
    return queue.run(command, *args, env=env, **kw)


def claim_from_a_shell_that_exits(queue, caches):
    """``ctx queue claim`` run by a shell that exits right after: its lease holder is gone."""
    env = clean_env(CTX_STORAGE=str(queue.storage), XDG_CACHE_HOME=caches["mine"])
    argv = [*CTX_ARGV, "queue", "claim", "--project", queue.project]
    done = subprocess.run(["/bin/sh", "-c", '"$@"', "sh", *argv], env=env, capture_output=True)
    assert done.returncode == 0, done
    return done.stdout.decode().strip()


@pytest.mark.parametrize("recovered_by", ["mine", "theirs"])
def test_a_requeued_job_is_claimed_before_younger_ones(queue, caches, recovered_by):
    """Q-9, Q-5: a job recover puts back keeps its publish time, so it is the oldest pending
    job again: the next claim takes it, as ``list --state pending`` (claim order) shows,
    whoever ran recover."""
    jobs = [queue.publish(name=n) for n in ("a", "b", "c")]
    assert claim_from_a_shell_that_exits(queue, caches) == jobs[0]

    recovered = as_user(queue, caches, recovered_by, "recover")
    assert recovered.rc == 0 and jobs[0] in recovered.out, recovered

    listed = as_user(queue, caches, "mine", "list", "--state", "pending").lines()
    assert listed == jobs
    assert [as_user(queue, caches, "mine", "claim").out.strip() for _ in jobs] == jobs


def test_jobs_another_user_published_are_claimed_oldest_first(queue, caches):
    """Q-9: pending jobs published by another user (whose claim-order hint is not ours)
    before ours are claimed before ours."""
    assert as_user(queue, caches, "mine", "claim").rc == 3  # our order: an empty queue
    theirs = [
        as_user(queue, caches, "theirs", "publish", "--name", n, "-", input=json.dumps(request()))
        for n in ("n1", "n2")
    ]
    mine = as_user(
        queue, caches, "mine", "publish", "--name", "r1", "-", input=json.dumps(request())
    )
    order = [r.out.strip() for r in [*theirs, mine]]
    assert [as_user(queue, caches, "mine", "claim").out.strip() for _ in order] == order


def test_a_job_put_in_pending_by_hand_is_claimed_by_its_age(queue, caches):
    """Q-9: a request file placed in ``pending/`` by hand (an older mtime) is claimed before
    the newer jobs published through ``ctx``."""
    assert as_user(queue, caches, "mine", "claim").rc == 3
    published = [
        as_user(
            queue, caches, "mine", "publish", "--name", n, "-", input=json.dumps(request())
        ).out.strip()
        for n in ("p1", "p2")
    ]
    placed = queue.drop("placed")
    age(queue.dir / "pending" / placed, 3600)
    order = [placed, *published]
    assert [as_user(queue, caches, "mine", "claim").out.strip() for _ in order] == order


def test_concurrent_claimers_never_share_a_job(queue):
    """Q-2, I-4: ``mkdir claimed/J`` arbitrates; each job goes to exactly one claimer, the
    losers exit 3, and no empty claim directory is left behind."""
    jobs = [queue.drop(f"j{i}") for i in range(2)]
    env = clean_env(CTX_STORAGE=str(queue.storage))
    argv = [*CTX_ARGV, "queue", "claim", "--project", queue.project]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        for _ in range(5)
    ]
    outcomes = [(p.wait(timeout=60), p.stdout.read().decode().strip()) for p in procs]
    for p in procs:
        p.stdout.close()
        p.stderr.close()
    won = sorted(name for rc, name in outcomes if rc == 0)
    assert won == sorted(jobs), outcomes
    assert sorted(rc for rc, _ in outcomes) == [0] * 2 + [3] * 3, outcomes
    for job in jobs:
        assert queue.state(job) == "claimed"
        assert os.listdir(queue.dir / "claimed" / job) == [job]
    assert queue.entries("claimed") == set(jobs)


# --- renew ------------------------------------------------------------------------------------


def test_renew_extends_the_callers_own_lease(queue):
    """§2.4, Q-3: ``renew J --ttl S`` rewrites the caller's lease with a later expires_at
    (and, with --json, prints JSON)."""
    job = queue.drop("renewed")
    assert queue.claim("--ttl", "60") == job
    before = queue.lease(job)
    r = queue.run("renew", job, "--ttl", "7200", "--json")
    assert r.rc == 0, r
    r.json()
    after = queue.lease(job)
    assert rfc3339(after["expires_at"]) > rfc3339(before["expires_at"])
    assert after["pid"] == before["pid"] == os.getpid()
    assert queue.state(job) == "claimed"


def test_renew_refuses_a_lease_held_by_another_process(queue, child):
    """Q-3: no process but the holder renews a lease: refused (exit 1), lease unchanged."""
    job = queue.drop("held")
    assert queue.claim("--pid", str(child.pid), "--ttl", "60") == job
    before = (queue.dir / "lease" / job / "worker").read_bytes()
    r = queue.run("renew", job, "--ttl", "7200")
    assert r.rc == 1, r
    assert (queue.dir / "lease" / job / "worker").read_bytes() == before


def test_renew_of_a_job_that_is_not_claimed_is_refused(queue):
    """§2.4: there is no lease to extend for a pending job: exit 1, job still pending."""
    job = queue.drop("waiting")
    r = queue.run("renew", job)
    assert r.rc == 1, r
    assert queue.state(job) == "pending"


# --- finish -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "state", "status"), [("--ok", "done", "ok"), ("--error", "failed", "error")]
)
def test_finish_makes_the_terminal_pair_and_clears_claim_and_lease(queue, flag, state, status):
    """Q-4, §2.1: ``finish`` leaves ``STATE/J`` (the request) and ``STATE/J.result`` (one JSON
    object with status, output, worker, started, finished) and removes claim and lease.
    With --json it prints JSON.

    # reading: RESULT_FILE holds the job's output; it is accepted either as the result's
    # ``output`` or merged into the result object.
    """
    req = request()
    job = queue.drop("finished", req)
    assert queue.claim() == job
    output = {"answer": 42, "lines": ["a", "b"]}
    json_flag = ["--json"] if flag == "--error" else []
    r = queue.run("finish", job, flag, *json_flag, "-", input=json.dumps(output))
    assert r.rc == 0, r
    if json_flag:
        r.json()
    assert queue.state(job) == state
    assert json.loads((queue.dir / state / job).read_text()) == req
    result = json.loads((queue.dir / state / f"{job}.result").read_text())
    assert isinstance(result, dict)
    assert result["status"] == status
    assert {"output", "worker", "started", "finished"} <= result.keys(), result
    assert result["output"] == output or output.items() <= result.items(), result
    assert not (queue.dir / "claimed" / job).exists()
    assert not (queue.dir / "lease" / job).exists()
    assert queue.entries("inbox") == set()
    assert queue.entries("pending") == set()


def test_finish_result_names_the_worker_as_an_object(queue):
    """§2.1: a result file is ``{"status", "output", "worker": {...}, "started", "finished"}``."""
    job = queue.drop("worker")
    assert queue.claim("--worker", "builder-7") == job
    queue.finish(job)
    result = json.loads((queue.dir / "done" / f"{job}.result").read_text())
    assert isinstance(result["worker"], dict), result


def test_finish_without_a_result_file_does_not_read_standard_input(queue):
    """§2.4: RESULT_FILE is optional and ``-`` names standard input; without either the job is
    finished with no output and standard input is left alone.

    # reading: the result's ``output`` is then null or absent.
    """
    job = queue.drop("no-output")
    assert queue.claim() == job
    r = queue.run("finish", job, "--ok", input=json.dumps({"from": "stdin"}))
    assert r.rc == 0, r
    result = json.loads((queue.dir / "done" / f"{job}.result").read_text())
    assert result["status"] == "ok"
    assert result.get("output") is None, result
    assert "stdin" not in json.dumps(result)


def test_finish_twice_is_refused_and_keeps_the_first_result(queue):
    """Q-4, Q-6, I-3: a finished job cannot be finished again; its pair is never overwritten."""
    job = queue.drop("twice")
    assert queue.claim() == job
    queue.finish(job, output={"first": True})
    before = snapshot(queue.dir)
    r = queue.run("finish", job, "--error", "-", input=json.dumps({"second": True}))
    assert r.rc == 1, r
    assert snapshot(queue.dir) == before


def test_finish_of_a_pending_job_is_refused(queue):
    """Q-4: only a claimed job can be finished: exit 1, the job stays pending."""
    job = queue.drop("unclaimed")
    r = queue.run("finish", job, "--ok", "-", input="{}")
    assert r.rc == 1, r
    assert queue.state(job) == "pending"
    assert queue.entries("done") == set()


def test_finish_without_ok_or_error_is_a_usage_error(queue):
    """§2.4: ``finish J (--ok | --error)``: neither flag is a usage error (exit 2)."""
    job = queue.drop("no-flag")
    r = queue.run("finish", job, "-", input="{}")
    assert r.rc == 2, r
    assert queue.state(job) == "pending"


def test_finish_with_both_ok_and_error_is_a_usage_error(queue):
    """§2.4: ``(--ok | --error)`` are alternatives; giving both is exit 2 and changes nothing."""
    job = queue.drop("both-flags")
    assert queue.claim() == job
    r = queue.run("finish", job, "--ok", "--error", "-", input="{}")
    assert r.rc == 2, r
    assert queue.state(job) == "claimed"


# --- status, list, show -----------------------------------------------------------------------


@pytest.fixture
def mixed(queue):
    """Two pending, one claimed, three done and four failed jobs (all but the claim made on
    disk, in the §2.1 layout)."""
    claimed = queue.drop("c-claimed")
    assert queue.claim() == claimed
    return {
        "pending": [queue.drop(f"p{i}") for i in range(2)],
        "claimed": [claimed],
        "done": [queue.terminal(f"d{i}", "done") for i in range(3)],
        "failed": [queue.terminal(f"f{i}", "failed") for i in range(4)],
    }


def count_in(value) -> int:
    return value if isinstance(value, int) else len(value)


def test_status_counts_jobs_per_state(queue, mixed):
    """§2.4: ``status`` gives counts per state, in text and with --json.

    # reading: text mode has one line per state holding its name and count; the JSON holds,
    # under each state's name, its count (or the list of its jobs).
    """
    text = queue.run("status")
    assert text.rc == 0, text
    for state, jobs in mixed.items():
        rows = [line.split() for line in text.lines() if state in line.split()]
        assert any(str(len(jobs)) in row for row in rows), (state, text)

    js = queue.run("status", "--json")
    assert js.rc == 0, js
    doc = js.json()
    for state, jobs in mixed.items():
        assert len(jobs) in [count_in(v) for v in find_values(doc, state)], (state, doc)


def test_list_state_shows_exactly_the_jobs_in_that_state(queue, mixed):
    """§2.4: ``list --state S`` lists the jobs in state S and no other.

    # reading: text output names each job as a whitespace-separated word; --json gives a
    # list of names or of objects with a ``name`` (possibly wrapped in one object).
    """
    all_jobs = {j for jobs in mixed.values() for j in jobs}
    for state, jobs in mixed.items():
        r = queue.run("list", "--state", state)
        assert r.rc == 0, r
        assert set(r.out.split()) & all_jobs == set(jobs), (state, r)

    js = queue.run("list", "--state", "pending", "--json")
    assert js.rc == 0, js
    listed = {x if isinstance(x, str) else x["name"] for x in _json_items(js.json())}
    assert listed == set(mixed["pending"]), js


def _json_items(doc):
    if isinstance(doc, list):
        return doc
    lists = [v for v in doc.values() if isinstance(v, list)]
    assert len(lists) == 1, doc
    return lists[0]


def test_show_reports_every_piece_of_evidence_of_a_claimed_job(queue):
    """§2.4: ``show J`` reports every piece of evidence: for a claimed job both
    ``claimed/J/J`` and ``lease/J/worker``, in text and in its --json output.

    # reading: evidence is named by its path inside the queue directory.
    """
    job = queue.drop("shown")
    assert queue.claim() == job
    for args in ((), ("--json",)):
        r = queue.run("show", job, *args)
        assert r.rc == 0, r
        assert f"claimed/{job}/{job}" in r.out, r
        assert f"lease/{job}/worker" in r.out, r
        if args:
            r.json()


def test_show_names_both_halves_of_a_terminal_pair(queue):
    """§2.4, §2.1: ``show`` of a failed job names ``failed/J`` and ``failed/J.result``."""
    job = queue.terminal("broken", "failed")
    r = queue.run("show", job)
    assert r.rc == 0, r
    assert f"failed/{job}" in r.out and f"failed/{job}.result" in r.out, r


def test_init_and_publish_print_json_with_json(queue):
    """§2.4: ``--json`` gives machine-readable output on stdout (the other commands' --json is
    checked beside their text output).

    # reading: one JSON document per command, except that ``publish --batch --json`` may print
    # one JSON value per line.
    """
    init = QueueCLI(queue.storage, "jsonproj").run("init", "--json")
    assert init.rc == 0, init
    init.json()
    one = queue.run("publish", "--json", "--name", "one", "-", input=json.dumps(request()))
    assert one.rc == 0, one
    assert "one.req.json" in json.dumps(one.json())
    batch = queue.run("publish", "--batch", "--json", "-", input=json.dumps(request()) + "\n")
    assert batch.rc == 0, batch
    try:
        json.loads(batch.out)
    except json.JSONDecodeError:
        [json.loads(line) for line in batch.lines()]
    assert len(queue.entries("pending")) == 2


# --- usage errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["queue", "frobnicate", "--project", "proj"],
        ["queue", "status", "--project", "proj", "--no-such-option"],
        ["queue", "status"],
        ["queue", "claim", "--project", "proj", "--ttl", "soon"],
    ],
    ids=["unknown-command", "unknown-option", "no-project", "bad-ttl"],
)
def test_usage_errors_exit_2(storage, args):
    """§2.4: a usage error is exit 2 and touches nothing."""
    before = snapshot(storage)
    r = ctx_run(*args, env=clean_env(CTX_STORAGE=str(storage)))
    assert r.rc == 2, r
    assert snapshot(storage) == before


def test_publish_without_a_source_is_a_usage_error(queue):
    """§2.4: ``publish --project P [--name J] (FILE | -)``: the source is required; omitting it
    is a usage error (exit 2) and publishes nothing."""
    r = queue.run("publish", "--name", "nosource", input=json.dumps(request()))
    assert r.rc == 2, r
    assert queue.entries("pending") == set()
