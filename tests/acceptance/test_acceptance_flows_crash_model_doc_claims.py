"""The crash model's claims taken literally (docs/crash-model.md; docs/queue.md "What a crash
leaves, and what recover does with it", "The steps, and why each sync is there"; SPEC Q-1 …
Q-7, I-1 … I-5, S-5, T-8, A-3, R-5), from the point of view of a user whose ``ctx`` process
died: for each crash point the documents list — every step of ``publish``, ``publish
--batch``, ``claim``, the lease, ``renew``, ``finish`` and ``recover`` itself, and the other
durable writes (session events, tool installs, agent creation, bootstrap, ``queue init``) —
the exact state that crash leaves is made on disk, by SIGKILLing a real ``ctx`` as it enters
the system call of that step (strace fault injection) or, for what only a power loss leaves,
by hand.  Then the documented readers and repairs run (``ctx queue status``/``show``/
``list``, ``recover`` with and without ``--reconcile`` and ``--dry-run``, the same command
again, ``ctx session show``/``repair``, ``ctx bootstrap``, the next install) and must report
the category the table names, exit as documented, and leave exactly the documented files:
no request lost, no finished job run again, nothing left behind, a second repair with
nothing to do."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    QueueCLI,
    Run,
    age,
    alive,
    clean_env,
    ctx_run,
    kill,
    request,
    result,
    snapshot,
    tool_manifest,
    wait_for,
)
from tests.acceptance.workercli import allow_in_tool_policy, make_agent, shell_job
from tests.support.strace import can_inject

needs_strace = pytest.mark.skipif(not can_inject(), reason="needs strace fault injection")

J = "a.req.json"
STAGED = f"{J}.publish.tmp"


class Queue(QueueCLI):
    """Project ``proj``'s queue, with a claim-order cache of the test's own."""

    def __init__(self, storage: Path, cache: Path) -> None:
        super().__init__(storage, "proj")
        self.env = clean_env(CTX_STORAGE=str(storage), XDG_CACHE_HOME=str(cache))

    def run(self, command: str, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return super().run(command, *args, **kw)

    def json_of(self, command: str, *args, **kw) -> tuple[int, dict]:
        r = self.run(command, *args, "--json", **kw)
        assert "Traceback" not in r.err, r
        return r.rc, json.loads(r.out)

    def killed(self, path: Path, call: str, *args: str, when: int = 1, input: str = "") -> Run:
        """``ctx queue ARGS`` SIGKILLed as it enters its ``when``-th ``call`` on ``path``."""
        return killed_at(self.env, path, call, ["queue", *args], when=when, input=input)

    def request_file(self, req: dict) -> str:
        """``req`` written to a file of the test's own; its path."""
        path = Path(self.env["XDG_CACHE_HOME"]).parent / f"request-{len(req)}-{id(req)}.json"
        path.write_text(json.dumps(req))
        return str(path)

    def publish_a(self, **extra) -> bytes:
        """Publish J (``a``); the bytes stored in ``pending/``."""
        assert self.publish(request(**extra), name="a") == J
        return (self.dir / "pending" / J).read_bytes()


def killed_at(env: dict, path: Path, call: str, args: list[str], when: int = 1,
              input: str = "") -> Run:  # fmt: skip
    """``ctx ARGS`` run under strace and SIGKILLed on entering its ``when``-th ``call`` that
    names ``path`` (``-P``): the call is not made, nothing after it happens."""
    trace = Path(env["XDG_CACHE_HOME"]).parent / f"kill-{os.getpid()}-{call}-{when}.trace"
    argv = ["strace", "-f", "-qq", "-o", str(trace), "-P", str(path), "-e", f"trace={call}",
            "-e", f"inject={call}:signal=KILL:when={when}", *CTX_ARGV, *args]  # fmt: skip
    proc = subprocess.run(argv, input=input.encode(), capture_output=True, env=env, timeout=60)
    run = Run(args, proc.returncode, proc.stdout.decode(), proc.stderr.decode())
    text = trace.read_text()
    assert proc.returncode == -signal.SIGKILL, (run, text)
    assert f"{call}(" in text and "killed by SIGKILL" in text, (run, text)
    return run


def held_at(env: dict, path: Path, call: str, seconds: float, args: list[str]) -> subprocess.Popen:
    """``ctx ARGS`` started under strace, held ``seconds`` as it enters its first ``call``
    naming ``path`` (as a process stopped or stalled there), then let go."""
    hold = f"inject={call}:delay_enter={int(seconds * 1e6)}:when=1"
    argv = ["strace", "-f", "-qq", "-o", "/dev/null", "-P", str(path), "-e", f"trace={call}",
            "-e", hold, *CTX_ARGV, *args]  # fmt: skip
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)  # fmt: skip


def dead_pid() -> int:
    """The pid of a process that has exited (and was reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@pytest.fixture
def q(storage: Path, tmp_path: Path) -> Queue:
    return Queue(storage, tmp_path / "cache")


def incomplete(q: Queue) -> dict[str, str]:
    """``ctx queue status --json``'s incomplete jobs, each with the repair it names."""
    rc, status = q.json_of("status")
    assert rc == 0 and status["conflicts"] == [], status
    return {e["job"]: e["repair"] for e in status["incomplete"]}


def assert_only_pending(q: Queue, job: str, stored: bytes) -> None:
    """J is pending with the very bytes it was published with, and nothing else of it (nor
    any temp file) is left anywhere."""
    assert (q.dir / "pending" / job).read_bytes() == stored
    assert os.stat(q.dir / "pending" / job).st_nlink == 1
    for sub in ("inbox", "claimed", "lease", "done", "failed"):
        assert q.entries(sub) == set(), (sub, q.entries(sub))


def assert_converged(q: Queue) -> None:
    """I-5: a further ``recover --reconcile`` (and a plain one) calls the queue consistent and
    changes nothing."""
    before = snapshot(q.dir)
    for args in (("--reconcile", "--grace", "0"), ()):
        rc, report = q.json_of("recover", *args)
        assert rc == 0 and report["consistent"] is True, report
        assert report["requeued"] == report["repaired"] == report["removed_temps"] == []
    assert snapshot(q.dir) == before


# ---------------------------------------------------------------- publish (Q-1, I-1, I-2)


@needs_strace
def test_publish_killed_before_its_move_leaves_its_whole_staging_file_which_holds_the_name(q):
    """Row "publish, before the move": a temp file in ``inbox/``, never acknowledged; it holds
    J's staging name, so a second publish of J is refused (EEXIST) and changes nothing."""
    body = json.dumps(request(tag="first"))
    run = q.killed(q.dir / "pending", "renameat2", "publish", "--project", "proj", "--name",
                   "a", "-", input=body)  # fmt: skip
    assert run.out == ""
    assert q.entries("pending") == set()
    assert q.entries("inbox") == {STAGED}
    staged = json.loads((q.dir / "inbox" / STAGED).read_text())  # I-2: whole, fsynced first
    assert staged["tag"] == "first" and staged["tool"] == "fs.read"
    rc, status = q.json_of("status")
    assert rc == 0 and status["pending"] == 0 and status["incomplete"] == []
    assert [(t["path"], t["job"]) for t in status["temps"]] == [(f"inbox/{STAGED}", J)]
    before = snapshot(q.dir)
    again = q.run("publish", "--name", "a", "-", input=json.dumps(request(tag="second")))
    assert again.rc == 1 and again.out == "", again
    assert "EEXIST" in again.err and f"inbox/{STAGED}" in again.err, again
    assert "recover --reconcile" in again.err, again
    assert snapshot(q.dir) == before


def test_a_dead_publishers_temp_is_reported_after_the_grace_and_removed_only_by_reconcile(q):
    """Plain recover "reports it after grace", ``--reconcile`` "removes it after the grace
    period" (the ``grace`` of queue/config), ``--dry-run`` only says it would; then J may be
    published again."""
    with (q.dir / "config").open("a") as config:
        config.write("grace=30\n")
    temp = q.dir / "inbox" / STAGED
    temp.write_text(json.dumps(request(tag="lost")))
    for args in ((), ("--reconcile",)):  # young: neither reported nor removed
        rc, report = q.json_of("recover", *args)
        assert rc == 0 and report["stale_temps"] == report["removed_temps"] == [], report
        assert temp.exists()
    age(temp, 45)
    plain = q.run("recover")
    assert plain.rc == 0 and f"stale    inbox/{STAGED}" in plain.out, plain
    assert temp.exists()
    rc, dry = q.json_of("recover", "--reconcile", "--dry-run")
    assert rc == 0 and dry["stale_temps"] == [f"inbox/{STAGED}"] and dry["removed_temps"] == []
    assert temp.exists()
    rc, done = q.json_of("recover", "--reconcile")
    assert rc == 0 and done["removed_temps"] == [f"inbox/{STAGED}"] and done["consistent"]
    assert q.entries("inbox") == set()
    assert q.publish(request(tag="again"), name="a") == J
    assert json.loads((q.dir / "pending" / J).read_text())["tag"] == "again"
    assert_converged(q)


@needs_strace
def test_a_publisher_stalled_past_the_grace_finds_its_staging_gone_and_publishes_nothing(q):
    """Step 2 of publish: one "stopped for longer than that" finds its staging file removed
    by ``recover --reconcile``, says so (ENOENT, naming the file) and publishes nothing."""
    body = q.request_file(request())
    publisher = held_at(q.env, q.dir / "pending", "renameat2", 1.5,
                        ["queue", "publish", "--project", "proj", "--name", "a", body])  # fmt: skip
    try:
        assert wait_for(lambda: (q.dir / "inbox" / STAGED).exists(), 10)
        rc, report = q.json_of("recover", "--reconcile", "--grace", "0")
        assert rc == 0 and report["removed_temps"] == [f"inbox/{STAGED}"], report
        out, err = publisher.communicate(timeout=30)
    finally:
        if publisher.poll() is None:
            kill(publisher)
    assert publisher.returncode == 1 and out == "", (out, err)
    assert "ENOENT" in err and f"inbox/{STAGED}" in err and "nothing was published" in err
    assert q.entries("pending") == q.entries("inbox") == set()


@needs_strace
def test_two_publishers_of_one_name_one_held_at_its_move_publish_it_once(q):
    """crash-model §9: publishers of J share the staging name ``inbox/J.publish.tmp`` (O_EXCL):
    the second is refused (EEXIST, "being published by another process"), the first's
    request is the one pending, once."""
    body = q.request_file(request(tag="first"))
    first = held_at(q.env, q.dir / "pending", "renameat2", 1.0,
                    ["queue", "publish", "--project", "proj", "--name", "a", body])  # fmt: skip
    try:
        assert wait_for(lambda: (q.dir / "inbox" / STAGED).exists(), 10)
        second = q.run("publish", "--name", "a", "-", input=json.dumps(request(tag="second")))
        out, err = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            kill(first)
    assert second.rc == 1 and "EEXIST" in second.err, second
    assert "being published by another process" in second.err, second
    assert first.returncode == 0 and out == f"{J}\n", (out, err)
    assert q.entries("pending") == {J} and q.entries("inbox") == set()
    assert json.loads((q.dir / "pending" / J).read_text())["tag"] == "first"


@needs_strace
def test_publish_by_link_killed_between_link_and_unlink_leaves_two_names_never_neither(q):
    """Durability primitives: where the queue moves by link, "a crash can leave both names
    (two links to one file) but never neither"; the job is pending, the staging name a temp
    that ``--reconcile`` removes, leaving J's one link."""
    with (q.dir / "config").open("a") as config:
        config.write("move=link\n")
    body = json.dumps(request(tag="linked"))
    q.killed(q.dir / "inbox", "unlinkat", "publish", "--project", "proj", "--name", "a", "-",
             input=body)  # fmt: skip
    pending, staged = q.dir / "pending" / J, q.dir / "inbox" / STAGED
    assert os.stat(pending).st_ino == os.stat(staged).st_ino and os.stat(pending).st_nlink == 2
    rc, status = q.json_of("status")
    assert rc == 0 and status["pending"] == 1 and status["incomplete"] == []
    assert [t["path"] for t in status["temps"]] == [f"inbox/{STAGED}"]
    stored = pending.read_bytes()
    assert json.loads(stored)["tag"] == "linked"
    rc, report = q.json_of("recover", "--reconcile", "--grace", "0")
    assert rc == 0 and report["removed_temps"] == [f"inbox/{STAGED}"], report
    assert_only_pending(q, J, stored)


# ---------------------------------------------------------------- publish --batch


@needs_strace
def test_a_batch_killed_after_its_first_move_published_part_of_it_and_acknowledged_none(q):
    """Batch: "A crash during a batch may publish part of it; nothing of it was acknowledged yet":
    the first line is pending, the others are temp files that ``--reconcile`` removes after
    the grace; no name was printed."""
    lines = "".join(json.dumps(request(tag=f"line{n}")) + "\n" for n in (1, 2, 3))
    run = q.killed(q.dir / "pending", "renameat2", "publish", "--project", "proj", "--batch",
                   "-", when=2, input=lines)  # fmt: skip
    assert run.out == ""
    (published,) = q.entries("pending")
    assert json.loads((q.dir / "pending" / published).read_text())["tag"] == "line1"
    temps = q.entries("inbox")
    assert len(temps) == 2 and all(t.endswith(".req.json.publish.tmp") for t in temps), temps
    assert {json.loads((q.dir / "inbox" / t).read_text())["tag"] for t in temps} == {
        "line2",
        "line3",
    }
    rc, report = q.json_of("recover", "--reconcile", "--grace", "0")
    assert rc == 0 and sorted(report["removed_temps"]) == sorted(f"inbox/{t}" for t in temps)
    assert q.entries("inbox") == set() and q.entries("pending") == {published}
    assert q.claim("--pid", str(os.getpid())) == published


@needs_strace
def test_a_batch_whose_syncfs_is_refused_syncs_every_temp_before_any_moves(q, tmp_path):
    """publish --batch: "Where syncfs itself is refused (ENOSYS …), each temp file is synced
    before any is moved"; otherwise one syncfs is the batch's barrier.  Every request is
    published whole either way."""
    lines = "".join(json.dumps(request(tag=f"n{n}")) + "\n" for n in range(3))
    for refused in (False, True):
        trace = tmp_path / f"batch-{refused}.trace"
        argv = ["strace", "-f", "-qq", "-y", "-o", str(trace), "-e",
                "trace=openat,fsync,fdatasync,syncfs,renameat2,linkat"]  # fmt: skip
        if refused:
            argv += ["-e", "inject=syncfs:error=ENOSYS"]
        proc = subprocess.run([*argv, *CTX_ARGV, "queue", "publish", "--project", "proj",
                               "--batch", "-"], input=lines.encode(), capture_output=True,
                              env=q.env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        names = proc.stdout.decode().split()
        assert len(names) == 3
        calls = [line for line in trace.read_text().splitlines() if "/queue/" in line]
        first_move = next(i for i, c in enumerate(calls) if " renameat2(" in c or "linkat(" in c)
        synced = {m for c in calls[:first_move] if " fsync(" in c
                  for m in re.findall(r"inbox/([^>]+\.publish\.tmp)>", c)}  # fmt: skip
        barrier = [c for c in calls[:first_move] if " syncfs(" in c and "= 0" in c]
        if refused:
            assert synced == {f"{n}.publish.tmp" for n in names}, calls
        else:
            assert len(barrier) == 1 and synced == set(), calls
        for name in names:
            assert json.loads((q.dir / "pending" / name).read_text())["tool"] == "fs.read"
    assert q.entries("inbox") == set()


# ---------------------------------------------------------------- claim and lease

# Each step of a claim, the repair status names for the state a kill there leaves, and
# whether a lease temp is left in inbox/.
CLAIM_STEPS = [
    ("claimed/J", "renameat2", "remove-orphans", False),
    ("inbox", "openat", "requeue-unleased", False),
    ("lease", "mkdirat", "requeue-unleased", True),
    ("lease/J", "renameat2", "requeue-unleased", True),
]


@needs_strace
@pytest.mark.parametrize(("where", "call", "repair", "temp"), CLAIM_STEPS)
def test_a_claim_killed_at_each_step_is_reported_as_its_row_and_reconciled_to_pending(
    q, where, call, repair, temp
):
    """Rows "claim, after mkdir" (empty claimed/J), "claim, after the move" (claimed/J/J
    without a lease), "lease, before the move" (the claim plus a temp file): status names
    the repair; plain recover reports it (exit 1) and changes nothing; ``finish`` refuses a
    claim without a lease (ENOENT); ``--reconcile`` puts J back in pending, byte for byte,
    and removes the temp once the grace has passed."""
    stored = q.publish_a()
    path = q.dir / where.replace("J", J)
    q.killed(path, call, "claim", "--project", "proj", "--pid", str(os.getpid()))
    assert q.state(J) == (None if repair == "requeue-unleased" else "pending")
    assert incomplete(q) == {J: repair}
    leftover = {t for t in q.entries("inbox") if t.startswith(f"{J}.lease.")}
    assert len(leftover) == (1 if temp else 0), q.entries("inbox")
    before = snapshot(q.dir)
    plain = q.run("recover")
    assert plain.rc == 1 and f"incomplete {J}" in plain.out and repair in plain.out, plain
    assert snapshot(q.dir) == before
    if repair == "requeue-unleased":
        for verb in (["finish", J, "--ok", "-"], ["renew", J, "--pid", str(os.getpid())]):
            refused = q.run(*verb, input="{}")
            assert refused.rc == 1 and "ENOENT" in refused.err, refused
            assert "never ran" in refused.err and "recover --reconcile" in refused.err, refused
        assert snapshot(q.dir) == before
    rc, report = q.json_of("recover", "--reconcile")  # default grace: the young temp stays
    assert rc == 0 and report["consistent"] is True, report
    assert [e["action"] for e in report["repaired"]] == [repair]
    assert {t for t in q.entries("inbox") if t.startswith(f"{J}.lease.")} == leftover
    rc, report = q.json_of("recover", "--reconcile", "--grace", "0")
    assert rc == 0 and sorted(report["removed_temps"]) == sorted(f"inbox/{t}" for t in leftover)
    assert_only_pending(q, J, stored)
    assert_converged(q)


@needs_strace
def test_a_claim_by_link_killed_before_it_unlinks_pending_leaves_a_second_link_dropped(q):
    """Row "claim, link strategy": ``claimed/J/J`` a second link of ``pending/J``; plain
    recover reports it, ``--reconcile`` "drops the claim link"."""
    with (q.dir / "config").open("a") as config:
        config.write("move=link\n")
    stored = q.publish_a()
    q.killed(q.dir / "pending", "unlinkat", "claim", "--project", "proj", "--pid", "1")
    claimed = q.dir / "claimed" / J / J
    assert os.stat(claimed).st_ino == os.stat(q.dir / "pending" / J).st_ino
    assert incomplete(q) == {J: "drop-claim-copy"}
    plain = q.run("recover")
    assert plain.rc == 1 and "second link" in plain.out, plain
    assert claimed.exists()
    rc, report = q.json_of("recover", "--reconcile")
    assert rc == 0 and [e["action"] for e in report["repaired"]] == ["drop-claim-copy"]
    assert_only_pending(q, J, stored)


@needs_strace
def test_a_claim_killed_before_its_mkdir_loses_its_turn_until_any_recover_gives_it_back(q):
    """Scale: a claim takes a name off the claim order before its ``mkdir``; killed there, J
    stays pending "but out of the hint, behind every job published since", and "every
    recover but a --dry-run" lists pending/ anew, so J is claimed first again."""
    for name in ("a", "b", "c"):
        q.publish(request(tag=name), name=name)
    q.killed(q.dir / "claimed", "mkdirat", "claim", "--project", "proj", "--pid", "1")
    q.publish(request(tag="d"), name="d")
    order = q.run("list", "--state", "pending")
    assert order.rc == 0 and order.lines() == [f"{n}.req.json" for n in "bcda"], order
    rc, report = q.json_of("recover")
    assert rc == 0 and report["requeued"] == report["repaired"] == []
    order = q.run("list", "--state", "pending")
    assert order.lines() == [f"{n}.req.json" for n in "abcd"], order
    assert q.claim("--pid", str(os.getpid())) == J


@needs_strace
def test_a_claimer_whose_fresh_claim_directory_recover_removed_does_not_say_queue_empty(q):
    """crash-model §8, third change: a claimer between its ``mkdir claimed/J`` and its lock
    looks like a crash's empty claim, which ``recover --reconcile`` removes; the claimer
    "treats a vanished directory as a lost race".  But nobody won J: it is pending, so the
    claim must take it (or at least not answer "queue empty" in silence)."""
    q.publish_a()
    args = ["queue", "claim", "--project", "proj", "--pid", str(os.getpid())]
    claimer = held_at(q.env, q.dir / "claimed", "openat", 1.5, args)
    try:  # the setup must hold, or the test fails outright (pytest.fail is no xfail)
        if not wait_for(lambda: (q.dir / "claimed" / J).exists(), 10):
            pytest.fail("the claim never made claimed/J")
        rc, report = q.json_of("recover", "--reconcile")
        if rc != 0 or [e["action"] for e in report["repaired"]] != ["remove-orphans"]:
            pytest.fail(f"recover did not remove the fresh claimed/J: {report}")
        out, err = claimer.communicate(timeout=30)
    finally:
        if claimer.poll() is None:
            kill(claimer)
    if q.state(J) not in ("pending", "claimed"):
        pytest.fail(f"J is neither pending nor claimed: {snapshot(q.dir)}")
    took_it = claimer.returncode == 0 and out == f"{J}\n"
    said_why = claimer.returncode == 3 and "ctx: note:" in err and J in err
    assert took_it or said_why, (claimer.returncode, out, err)


# ---------------------------------------------------------------- execution


def lease_from_elsewhere(q: Queue, **fields) -> None:
    """Rewrite J's lease as one taken by the same holder elsewhere: ``fields`` replaced."""
    lease = q.lease(J)
    lease.update(fields)
    q.write_lease(J, lease)


# How the holder of a claimed job went (or did not), and whether plain recover requeues it.
HOLDERS = {
    "killed, not yet reaped": True,
    "its machine rebooted": True,
    "on another host, lease valid": False,
    "alive, lease expired": True,
}


@pytest.mark.parametrize("how", list(HOLDERS))
def test_a_claimed_job_is_requeued_by_plain_recover_exactly_when_its_holder_is_provably_gone(
    q, how
):
    """Row "execution (holder killed)": plain recover **requeues J**, as its dry run says
    (changing nothing); Q-5 / docs/multi-host.md: gone is a dead or zombie pid in this boot,
    an earlier boot of this machine (a power loss and reboot: the pid may be alive again
    here), an expired lease; a holder on another host with a valid lease is left alone, its
    pid meaning nothing here."""
    stored = q.publish_a()
    holder = subprocess.Popen(["sleep", "600"])
    try:
        assert q.claim("--pid", str(holder.pid)) == J
        if how.startswith("killed"):
            holder.kill()  # a zombie until reaped: gone already
            assert wait_for(lambda: not alive(holder.pid), 10)
        elif how == "its machine rebooted":
            lease_from_elsewhere(q, boot_id="00000000-0000-4000-8000-000000000000")
        elif how == "on another host, lease valid":
            lease_from_elsewhere(q, host="elsewhere", machine_id="0" * 32, pid=dead_pid(),
                                 boot_id="00000000-0000-4000-8000-000000000000")  # fmt: skip
        else:
            lease_from_elsewhere(q, expires_at="2020-01-01T00:00:00Z")
        before = snapshot(q.dir)
        dry = q.run("recover", "--dry-run")
        assert dry.rc == 0 and (f"would requeue  {J}" in dry.out) == HOLDERS[how], dry
        assert snapshot(q.dir) == before
        rc, report = q.json_of("recover")
    finally:
        kill(holder)
    assert rc == 0 and report["consistent"] is True, report
    if HOLDERS[how]:
        assert [(e["job"], e["applied"]) for e in report["requeued"]] == [(J, True)], report
        assert_only_pending(q, J, stored)
        assert_converged(q)
    else:
        assert report["requeued"] == [] and [e["job"] for e in report["untouched"]] == [J]
        assert "unknown" in report["untouched"][0]["detail"], report
        assert snapshot(q.dir) == before


@needs_strace
def test_a_worker_killed_as_it_claims_leaves_a_leftover_its_next_drain_names_not_runs(
    searchable_storage, tmp_path, outbox
):
    """docs/workers.md: a SIGKILLed worker "ends it where it is"; "a drained worker that
    leaves jobs pending — held by a crash's leftover claim … — still exits 0, and names them
    on stderr as ctx queue claim does", ``left_pending`` in its stop event; after ``recover
    --reconcile`` the next drain runs the job, once."""
    storage = searchable_storage
    make_agent(storage, ["shell.exec"])
    allow_in_tool_policy(storage, "shell.exec")
    q = Queue(storage, tmp_path / "cache")
    runs = outbox / "runs"
    assert q.publish(shell_job(f"echo ran >> {runs}"), name="a") == J
    work = ["queue", "work", "--project", "proj", "--agent", "ci", "--drain"]
    killed_at(q.env, q.dir / "claimed" / J, "renameat2", work)
    assert q.state(J) == "pending" and (q.dir / "claimed" / J).is_dir()
    assert q.run("recover").rc == 1
    drained = q.run("work", "--agent", "ci", "--drain", "--json")
    assert drained.rc == 0, drained
    stop = json.loads(drained.lines()[-1])
    assert stop["event"] == "stop" and stop["left_pending"] == {J: "claimed"}, stop
    assert "ctx: note:" in drained.err and J in drained.err, drained
    assert "recover --reconcile" in drained.err, drained
    assert not runs.exists()
    rc, report = q.json_of("recover", "--reconcile")
    assert rc == 0 and [e["action"] for e in report["repaired"]] == ["remove-orphans"]
    drained = q.run("work", "--agent", "ci", "--drain")
    assert drained.rc == 0, drained
    assert runs.read_text() == "ran\n"
    assert q.only_result(J)[0] == "done"
    assert_converged(q)


# ---------------------------------------------------------------- finish (Q-4, I-3)

# Each step of a finish (from a shell), and what a kill there leaves, as status names it:
# the job still claimed (None), or incomplete with the repair --reconcile applies.
FINISH_STEPS = [
    ("--ok", "done", "renameat2", None),
    ("--ok", "claimed/J", "renameat2", "roll-forward"),
    ("--error", "claimed/J", "renameat2", "roll-forward"),
    ("--ok", "lease/J", "unlinkat", "remove-orphans"),
    ("--ok", "claimed", "unlinkat", "remove-orphans"),
]


@needs_strace
@pytest.mark.parametrize(("flag", "where", "call", "repair"), FINISH_STEPS)
def test_a_finish_killed_at_each_step_is_completed_or_left_claimed_never_run_again(
    q, flag, where, call, repair
):
    """Rows "finish, after the result" (``done/J.result`` + ``claimed/J/J``: roll forward) and
    "finish, before cleanup" (terminal pair + leftovers: removed): plain recover reports,
    ``--reconcile`` completes once the worker is gone, with the result the finish wrote; a
    finish killed before its result moved leaves J claimed, and the holder's death then
    requeues it (it never finished)."""
    stored = q.publish_a()
    holder = subprocess.Popen(["sleep", "600"])
    try:
        assert q.claim("--pid", str(holder.pid)) == J
        q.killed(q.dir / where.replace("J", J), call, "finish", "--project", "proj", J, flag,
                 "-", input=json.dumps({"answer": 42}))  # fmt: skip
    finally:
        kill(holder)  # the worker died with its finish
    terminal = "done" if flag == "--ok" else "failed"
    recorded = q.dir / terminal / f"{J}.result"
    if repair is None:
        assert q.state(J) == "claimed" and not recorded.exists()
        rc, report = q.json_of("recover", "--grace", "0")
        assert rc == 0 and [e["job"] for e in report["requeued"]] == [J], report
        rc, report = q.json_of("recover", "--reconcile", "--grace", "0")
        (temp,) = report["removed_temps"]
        assert rc == 0 and temp.startswith(f"inbox/{J}.result."), report
        assert_only_pending(q, J, stored)
        return
    written = recorded.read_bytes()
    assert json.loads(written)["output"] == {"answer": 42}
    assert incomplete(q) == {J: repair}
    before = snapshot(q.dir)
    plain = q.run("recover")
    assert plain.rc == 1 and f"incomplete {J}" in plain.out, plain
    assert snapshot(q.dir) == before
    rc, report = q.json_of("recover", "--reconcile")
    assert rc == 0 and [e["action"] for e in report["repaired"]] == [repair], report
    assert q.only_result(J)[0] == terminal
    assert recorded.read_bytes() == written and (q.dir / terminal / J).read_bytes() == stored
    assert q.entries("claimed") == q.entries("lease") == q.entries("pending") == set()
    assert_converged(q)
    again = q.run("publish", "--name", "a", "-", input=json.dumps(request()))
    assert again.rc == 1 and "EEXIST" in again.err, again  # never pending again (I-3)


@needs_strace
def test_a_finish_cut_after_its_result_with_its_worker_alive_waits_or_completes_by_finishing(
    q, child
):
    """finish step 1: a finish cut short after step 2, asked again with the same outcome and
    output, is completed and the result in place stands; another output is refused (EEXIST)
    saying so; ``--reconcile`` leaves a live holder's pair alone, reports it incomplete
    (exit 1) and says when it will complete it."""
    q.publish_a()
    assert q.claim("--pid", str(child.pid)) == J
    output = json.dumps({"answer": 42})
    q.killed(q.dir / "claimed" / J, "renameat2", "finish", "--project", "proj", J, "--ok", "-",
             input=output)  # fmt: skip
    written = (q.dir / "done" / f"{J}.result").read_bytes()
    before = snapshot(q.dir)
    rec = q.run("recover", "--reconcile")
    assert rec.rc == 1 and f"incomplete {J}" in rec.out, rec
    assert f"pid {child.pid}" in rec.out and "lease holder alive" in rec.out, rec
    assert "once its lease holder" in rec.out and "expired (at " in rec.out, rec
    other = q.run("finish", J, "--ok", "-", input=json.dumps({"answer": 43}))
    assert other.rc == 1 and "EEXIST" in other.err and "completes it" in other.err, other
    flipped = q.run("finish", J, "--error", "-", input=output)
    assert flipped.rc == 1 and "EEXIST" in flipped.err, flipped
    assert snapshot(q.dir) == before
    same = q.run("finish", J, "--ok", "-", input=output)
    assert same.rc == 0 and same.out == f"{J}\n", same
    assert q.only_result(J)[0] == "done"
    assert (q.dir / "done" / f"{J}.result").read_bytes() == written
    assert_converged(q)


@needs_strace
def test_a_finish_by_link_killed_before_unlinking_the_claim_drops_the_second_link(q):
    """Where the queue moves by link, a finish killed between the link of the request into
    ``done/`` and the unlink of ``claimed/J/J`` leaves both names; ``--reconcile`` drops the
    claim's and cleans up: J done once, never pending."""
    with (q.dir / "config").open("a") as config:
        config.write("move=link\n")
    stored = q.publish_a()
    assert q.claim("--pid", str(dead_pid())) == J
    q.killed(q.dir / "claimed" / J, "unlinkat", "finish", "--project", "proj", J, "--ok", "-",
             input="{}")  # fmt: skip
    assert os.stat(q.dir / "done" / J).st_ino == os.stat(q.dir / "claimed" / J / J).st_ino
    assert incomplete(q) == {J: "drop-claim-copy"}
    assert q.run("recover").rc == 1
    rc, report = q.json_of("recover", "--reconcile")
    assert rc == 0 and [e["action"] for e in report["repaired"]] == ["drop-claim-copy"]
    assert q.only_result(J)[0] == "done" and (q.dir / "done" / J).read_bytes() == stored
    assert os.stat(q.dir / "done" / J).st_nlink == 1
    assert_converged(q)


def test_two_results_of_different_outcomes_are_a_conflict_no_recover_resolves(q):
    """crash-model §9: two finishers with different outcomes leave ``done/J.result`` and the
    ``failed/`` pair, "a conflict … that recover reports and never resolves": status, show
    and recover exit 1, ``--reconcile`` changes nothing."""
    q.terminal("a", "failed")
    (q.dir / "done" / f"{J}.result").write_text(json.dumps(result("done")))
    before = snapshot(q.dir)
    rc, status = q.json_of("status")
    assert rc == 1 and status["conflict"] == 1 and status["incomplete"] == [], status
    assert q.run("show", J).rc == 1
    for args in ((), ("--reconcile", "--grace", "0")):
        rc, report = q.json_of("recover", *args)
        assert rc == 1 and [e["job"] for e in report["conflicts"]] == [J], report
        assert report["repaired"] == report["requeued"] == []
    assert snapshot(q.dir) == before


# ---------------------------------------------------------------- renew


@needs_strace
def test_a_renew_killed_before_its_rename_keeps_the_old_lease_and_leaves_a_temp(q, child):
    """``renew`` rewrites the lease temp + fsync + rename: killed before the rename, the lease
    is the one it had, byte for byte; the temp is a stray that ``--reconcile`` removes while
    the live holder's job is left alone (exit 0); renewing again works."""
    q.publish_a()
    assert q.claim("--pid", str(child.pid), "--ttl", "100") == J
    lease = (q.dir / "lease" / J / "worker").read_bytes()
    q.killed(q.dir / "lease" / J, "renameat", "renew", "--project", "proj", J, "--pid",
             str(child.pid), "--ttl", "500")  # fmt: skip
    assert (q.dir / "lease" / J / "worker").read_bytes() == lease
    (temp,) = q.entries("inbox")
    assert temp.startswith(f"{J}.") and temp.endswith(".tmp")
    rc, report = q.json_of("recover", "--reconcile", "--grace", "0")
    assert rc == 0 and report["removed_temps"] == [f"inbox/{temp}"], report
    assert [e["job"] for e in report["untouched"]] == [J] and q.state(J) == "claimed"
    renewed = q.run("renew", J, "--pid", str(child.pid), "--ttl", "500")
    assert renewed.rc == 0, renewed
    assert q.lease(J)["expires_at"] != json.loads(lease)["expires_at"]
    assert q.entries("inbox") == set()


# ---------------------------------------------------------------- recover itself (I-5)

REQUEUE_STEPS = [("lease/J", "unlinkat"), ("lease", "unlinkat"), ("claimed", "unlinkat")]


@needs_strace
@pytest.mark.parametrize(("where", "call"), REQUEUE_STEPS)
def test_a_recover_killed_after_its_requeue_move_leaves_a_pending_job_the_next_one_cleans(
    q, where, call
):
    """Row "recover itself | any of the above | same rules": killed after moving J back to
    pending, it leaves J pending with its old claim or lease; status calls it incomplete, a
    claim leaves it with a note, plain recover reports it, ``--reconcile`` removes them."""
    stored = q.publish_a()
    assert q.claim("--pid", str(dead_pid())) == J
    q.killed(q.dir / where.replace("J", J), call, "recover", "--project", "proj")
    assert (q.dir / "pending" / J).read_bytes() == stored
    assert incomplete(q) == {J: "remove-orphans"}
    r = q.run("claim", "--pid", str(os.getpid()))
    assert r.rc == 3 and "ctx: note:" in r.err and J in r.err, r
    plain = q.run("recover")
    assert plain.rc == 1 and f"incomplete {J}" in plain.out, plain
    rc, report = q.json_of("recover", "--reconcile")
    assert rc == 0 and [e["action"] for e in report["repaired"]] == ["remove-orphans"]
    assert_only_pending(q, J, stored)
    assert q.claim("--pid", str(os.getpid())) == J


@needs_strace
def test_a_reconcile_killed_in_its_roll_forward_is_finished_by_the_next_one(q):
    """I-5: a crash in the middle of ``recover --reconcile`` itself leaves one of the table's
    states; the next run completes it with the recorded result, the one after changes
    nothing."""
    stored = q.publish_a()
    assert q.claim("--pid", str(dead_pid())) == J
    q.killed(q.dir / "claimed" / J, "renameat2", "finish", "--project", "proj", J, "--ok", "-",
             input=json.dumps({"answer": 42}))  # fmt: skip
    written = (q.dir / "done" / f"{J}.result").read_bytes()
    q.killed(q.dir / "lease" / J, "unlinkat", "recover", "--project", "proj", "--reconcile")
    assert (q.dir / "done" / J).read_bytes() == stored and (q.dir / "lease" / J).exists()
    assert incomplete(q) == {J: "remove-orphans"}
    rc, report = q.json_of("recover", "--reconcile")
    assert rc == 0 and [e["action"] for e in report["repaired"]] == ["remove-orphans"]
    assert q.only_result(J)[0] == "done"
    assert (q.dir / "done" / f"{J}.result").read_bytes() == written
    assert_converged(q)


def test_a_lease_temp_is_kept_however_old_while_its_claim_is_locked(q):
    """Recover: "A temp file of J's lease or result in inbox/ is never removed, however old, while
    claimed/J is locked": recover lists the job as untouched (exit 0); once the lock is gone,
    ``--reconcile`` requeues J and removes the temp."""
    stored = q.publish_a()
    (q.dir / "claimed" / J).mkdir()
    os.rename(q.dir / "pending" / J, q.dir / "claimed" / J / J)
    temp = q.dir / "inbox" / f"{J}.lease.0123456789ab.tmp"
    temp.write_text("{}")
    age(temp, 3600)
    fd = os.open(q.dir / "claimed" / J, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        rc, report = q.json_of("recover", "--reconcile", "--grace", "0")
        assert rc == 0 and report["consistent"] is True, report
        assert [e["job"] for e in report["untouched"]] == [J] and report["removed_temps"] == []
        assert temp.exists() and (q.dir / "claimed" / J / J).exists()
    finally:
        os.close(fd)
    rc, report = q.json_of("recover", "--reconcile", "--grace", "0")
    assert rc == 0 and report["removed_temps"] == [f"inbox/{temp.name}"], report
    assert [e["action"] for e in report["repaired"]] == ["requeue-unleased"]
    assert_only_pending(q, J, stored)


# ---------------------------------------------------------------- Q-7 on return

LINE = re.compile(r"^\d+\s+(\w+)\((.*)\)\s+=\s+(-?\d+)")
FDPATH = re.compile(r"\d+<([^>]*)>")


def unsynced(trace: Path, queue: Path) -> list[str]:
    """The entry operations (rename, link, unlink, rmdir, mkdir) on a directory of ``queue``
    that no later fsync of that directory (or syncfs) covered before the command ended."""
    ops: list[tuple[int, str, str]] = []
    syncs: list[tuple[int, str]] = []
    for i, line in enumerate(trace.read_text().splitlines()):
        match = LINE.match(line)
        if not match or int(match.group(3)) < 0:
            continue
        call, paths = match.group(1), FDPATH.findall(match.group(2))
        if call in ("fsync", "fdatasync"):
            syncs.append((i, paths[0]))
        elif call == "syncfs":
            syncs.append((i, "*"))
        else:
            ops += [(i, p, line) for p in paths if p.startswith(str(queue))]
    return [line for i, p, line in ops if not any(j > i and s in (p, "*") for j, s in syncs)]


@needs_strace
@pytest.mark.parametrize("move", ["rename", "link"])
def test_every_entry_a_verb_changes_is_synced_in_its_directory_before_it_returns(
    q, child, tmp_path, move
):
    """crash-model §3 "Q-7 on return" and §8's fifth change: after every rename, link, unlink,
    rmdir or mkdir in the queue, the affected directory is fsynced before the command ends —
    for publish, batch, claim, renew, finish, requeue and every --reconcile repair."""
    with (q.dir / "config").open("a") as config:
        config.write(f"move={move}\n")
    calls = "renameat2,renameat,linkat,unlinkat,mkdirat,fsync,fdatasync,syncfs"

    def traced(*args: str, input: str = "") -> list[str]:
        trace = tmp_path / "q7.trace"
        proc = subprocess.run(["strace", "-f", "-qq", "-y", "-o", str(trace), "-e",
                               f"trace={calls}", *CTX_ARGV, "queue", args[0], "--project",
                               "proj", *args[1:]], input=input.encode(), capture_output=True,
                              env=q.env)  # fmt: skip
        assert proc.returncode == 0, (args, proc.stderr)
        return unsynced(trace, q.dir)

    gaps = traced("publish", "--name", "a", "-", input=json.dumps(request()))
    gaps += traced("publish", "--batch", "-", input=json.dumps(request()) + "\n")
    gaps += traced("claim", "--pid", str(child.pid))
    gaps += traced("renew", J, "--pid", str(child.pid))
    gaps += traced("finish", J, "--ok", "-", input="{}")
    gaps += traced("claim", "--pid", str(dead_pid()))
    gaps += traced("recover")
    for name in ("b", "c", "e"):
        q.publish(request(), name=name)
    (q.dir / "claimed" / "b.req.json").mkdir()
    (q.dir / "claimed" / "c.req.json").mkdir()
    os.rename(q.dir / "pending" / "c.req.json", q.dir / "claimed" / "c.req.json" / "c.req.json")
    (q.dir / "claimed" / "e.req.json").mkdir()
    os.link(q.dir / "pending" / "e.req.json", q.dir / "claimed" / "e.req.json" / "e.req.json")
    (q.dir / "inbox" / "z.req.json.publish.tmp").write_text("{")
    gaps += traced("recover", "--reconcile", "--grace", "0")
    assert gaps == []
    assert q.entries("claimed") == q.entries("lease") == q.entries("inbox") == set()
    assert len(q.entries("pending")) == 4 and q.only_result(J)[0] == "done"


# ---------------------------------------------------------------- queue init


@needs_strace
def test_a_queue_init_killed_before_its_config_rename_is_completed_by_init_again(storage, tmp_path):
    """init is idempotent and its only repair is what is missing: killed before the rename of
    its config, the queue works on the defaults (with a note); init again writes the config;
    the temp it left is removed by a later init once it is a minute old."""
    env = clean_env(CTX_STORAGE=str(storage), XDG_CACHE_HOME=str(tmp_path / "cache"))
    queue = storage / "shared" / "fresh" / "queue"
    killed_at(env, queue, "renameat2", ["queue", "init", "--project", "fresh"])
    (temp,) = [n for n in os.listdir(queue) if n.startswith(".config.")]
    assert not (queue / "config").exists()
    status = ctx_run("queue", "status", "--project", "fresh", env=env)
    assert status.rc == 0 and "config is missing" in status.err, status
    again = ctx_run("queue", "init", "--project", "fresh", env=env)
    assert again.rc == 0 and "ready" in again.out, again
    assert (queue / "config").read_text() == (queue / temp).read_text()
    age(queue / temp, 120)
    assert ctx_run("queue", "init", "--project", "fresh", env=env).rc == 0
    assert set(os.listdir(queue)) == {"config", *QUEUE_SUBDIRS}


# ---------------------------------------------------------------- tool installs (T-8)


def hidden(directory: Path) -> list[str]:
    """What an install stages in a tier under hidden names (its lock file aside)."""
    return sorted(n for n in os.listdir(directory) if n.startswith(".") and n != ".install-lock")


# Where a reinstall (v1 -> v2) is killed, and the version a reader must meet after the repair:
# before the commit marker the staging is discarded, after it the commit is finished.
INSTALL_STEPS = [
    ("renameat2", 1, "v1", "removed what an interrupted install left behind"),
    ("renameat2", 2, "v2", "finished an interrupted install"),
    ("renameat", 1, "v2", "finished an interrupted install"),
]


@needs_strace
@pytest.mark.parametrize(("call", "when", "after", "said"), INSTALL_STEPS)
def test_a_reinstall_killed_at_each_step_shows_one_whole_version_and_bootstrap_settles(
    storage, tmp_path, call, when, after, said
):
    """docs/tools.md, "How an install stays atomic": the tool is always found with a whole
    executable and a complete control directory; "a crash leaves hidden names and possibly
    the marker"; ``ctx bootstrap`` "finishes a commit that has a marker and discards staging
    that has none", the tool's policy kept; a second bootstrap has nothing to do."""
    env = clean_env(CTX_STORAGE=str(storage), XDG_CACHE_HOME=str(tmp_path / "cache"))
    tools = storage / "tool"

    def manifest(version: str) -> Path:
        return tool_manifest(tmp_path / version, "demo", f"#!/bin/sh\necho {version}\n",
                             description=f"demo {version}")  # fmt: skip

    assert ctx_run("object", "install", manifest("v1"), "--tier", "system", env=env).rc == 0
    with (tools / "demo.d" / "policy").open("a") as policy:
        policy.write("allow ci_t tool:demo execute\n")
    kept = (tools / "demo.d" / "policy").read_bytes()
    killed_at(env, tools, call, ["object", "install", str(manifest("v2")), "--tier", "system"],
              when=when)  # fmt: skip
    assert hidden(tools), os.listdir(tools)
    which = ctx_run("object", "which", "demo", env=env)
    assert which.rc == 0 and which.out.strip() == str(tools / "demo"), which
    assert (tools / "demo").read_text() in ("#!/bin/sh\necho v1\n", "#!/bin/sh\necho v2\n")
    assert (tools / "demo.d" / "description").read_text().strip() in ("demo v1", "demo v2")
    if call == "renameat":  # between the two swaps: the versions differ, calls wait
        listed = ctx_run("object", "list", "--json", env=env)
        (demo,) = [o for o in json.loads(listed.out) if o["name"] == "demo"]
        assert demo["status"] == "unavailable" and "ctx bootstrap" in demo["reason"], demo
    fixed = ctx_run("bootstrap", "--json", env=env)
    assert fixed.rc == 0, fixed
    assert [r for r in fixed.json()["repaired"] if "demo" in r] == [f"{tools / 'demo'}: {said}"]
    assert hidden(tools) == []
    assert (tools / "demo").read_text() == f"#!/bin/sh\necho {after}\n"
    assert (tools / "demo.d" / "description").read_text().strip() == f"demo {after}"
    assert (tools / "demo.d" / "policy").read_bytes() == kept
    listed = ctx_run("object", "list", "--json", env=env)
    assert [o["status"] for o in json.loads(listed.out) if o["name"] == "demo"] == ["available"]
    again = ctx_run("bootstrap", env=env)
    assert again.rc == 0 and "nothing to do" in again.out, again


@needs_strace
def test_a_shared_tier_install_killed_before_its_marker_is_discarded_by_the_next_install(
    storage, tmp_path
):
    """An install's staging: "the next install into that tier, or ctx bootstrap, … discards
    staging that has none": a first install into a space's tier killed before its marker
    leaves no tool, and the next install there (of another tool) removes what it staged."""
    env = clean_env(CTX_STORAGE=str(storage), XDG_CACHE_HOME=str(tmp_path / "cache"))
    tier = storage / "shared" / "proj" / "tool"
    first = tool_manifest(tmp_path, "demo", "#!/bin/sh\necho demo\n")
    killed_at(env, tier, "renameat2", ["object", "install", str(first), "--tier", "shared:proj"])
    assert hidden(tier) and not (tier / "demo").exists()
    assert ctx_run("object", "which", "demo", env=env).rc == 1
    other = tool_manifest(tmp_path, "other", "#!/bin/sh\necho other\n")
    r = ctx_run("object", "install", other, "--tier", "shared:proj", env=env)
    assert r.rc == 0, r
    assert hidden(tier) == [] and sorted(os.listdir(tier)) == [".install-lock", "other", "other.d"]
    r = ctx_run("object", "install", first, "--tier", "shared:proj", env=env)
    assert r.rc == 0 and (tier / "demo").read_text() == "#!/bin/sh\necho demo\n", r


# ---------------------------------------------------------------- agent creation


@needs_strace
def test_an_agent_create_killed_between_its_controls_and_its_entry_is_no_agent_until_bootstrap(
    storage, tmp_path
):
    """A-3: "the pair appears atomically, as a tool's does, its log already holding the
    agent.created record": a create killed after its controls are in place but before its
    entry is listed by nobody; bootstrap finishes it (a commit marker is there), with one
    agent.created; creating it again is EEXIST; a second bootstrap has nothing to do."""
    env = clean_env(CTX_STORAGE=str(storage), XDG_CACHE_HOME=str(tmp_path / "cache"))
    agents = storage / "agent"
    req = tmp_path / "bob.json"
    req.write_text(json.dumps({"name": "bob", "label": "bob_t", "tools": ["fs.read"]}))
    killed_at(env, agents, "renameat", ["agent", "create", str(req)])
    assert (agents / "bob.d").is_dir() and not (agents / "bob").exists()
    assert any(n.endswith("~commit") for n in hidden(agents)), hidden(agents)
    listed = ctx_run("agent", "list", "--json", env=env)
    assert listed.rc == 0 and json.loads(listed.out) == [], listed
    fixed = ctx_run("bootstrap", "--json", env=env)
    assert fixed.rc == 0, fixed
    assert fixed.json()["repaired"] == [f"{agents / 'bob'}: finished an interrupted install"]
    assert hidden(agents) == []
    again = ctx_run("agent", "create", req, env=env)
    assert again.rc == 1 and "EEXIST" in again.err, again
    listed = ctx_run("agent", "list", "--json", env=env)
    assert [a["name"] for a in json.loads(listed.out)] == ["bob"], listed
    log = (agents / "bob.d" / "log").read_text().splitlines()
    assert [json.loads(line)["type"] for line in log] == ["agent.created"]
    assert "nothing to do" in ctx_run("bootstrap", env=env).out


# ---------------------------------------------------------------- bootstrap


@needs_strace
def test_a_bootstrap_killed_before_renaming_a_page_is_completed_and_its_temp_removed_later(
    storage, tmp_path
):
    """R-5: a page of the manual bundle is written as ``.NAME.TOKEN.tmp`` and renamed; "a
    write killed before the rename leaves that file, which bootstrap removes … once it is a
    minute old, and names in a warning line before then"; meanwhile ``ctx man`` falls back
    to its built-in copy; run again, bootstrap has nothing to do."""
    env = clean_env(CTX_STORAGE=str(storage), XDG_CACHE_HOME=str(tmp_path / "cache"))
    pages = storage / "shared" / "cortexfs-docs" / "man"
    whole = (pages / "ctx.tool.md").read_bytes()
    (pages / "ctx.tool.md").unlink()
    killed_at(env, pages, "renameat", ["bootstrap"])
    (temp,) = [n for n in os.listdir(pages) if n.startswith(".")]
    assert re.fullmatch(r"\.ctx\.tool\.md\.[0-9a-f]+\.tmp", temp), temp
    page = ctx_run("man", "tool", env=env)
    assert page.rc == 0 and page.out.encode() == whole, page.err
    young = ctx_run("bootstrap", env=env)
    assert young.rc == 0 and "created   shared/cortexfs-docs/man/ctx.tool.md" in young.out, young
    assert f"warning   shared/cortexfs-docs/man/{temp}" in young.out, young
    assert (pages / "ctx.tool.md").read_bytes() == whole and (pages / temp).exists()
    age(pages / temp, 120)
    old = ctx_run("bootstrap", env=env)
    assert old.rc == 0, old
    assert f"repaired  shared/cortexfs-docs/man/{temp} (removed: left by an interrupted write)" in (
        old.out
    )
    assert not (pages / temp).exists()
    again = ctx_run("bootstrap", env=env)
    assert again.rc == 0 and "nothing to do" in again.out, again


# ---------------------------------------------------------------- session events (S-5)


@pytest.fixture
def session(searchable_storage: Path, tmp_path: Path):
    """Agent ``bob`` allowed ``fs.read``, one call recorded in its session ``s1``: the
    storage root's env and the session's events.jsonl."""
    env = clean_env(CTX_STORAGE=str(searchable_storage), XDG_CACHE_HOME=str(tmp_path / "c"))
    req = json.dumps({"name": "bob", "label": "bob_t", "tools": ["fs.read"]})
    assert ctx_run("agent", "create", "-", input=req, env=env).rc == 0
    with (searchable_storage / "tool" / "fs.read.d" / "policy").open("a") as policy:
        policy.write("allow bob_t tool:fs.read execute\n")
    r = ctx_run("run", "--agent", "bob", "--session", "s1", "fs.read", "/nowhere", env=env)
    assert "Traceback" not in r.err, r
    (events,) = searchable_storage.glob("home/*/agent/bob/session/s1/events.jsonl")
    assert [json.loads(x)["type"] for x in events.read_text().splitlines()] == [
        "tool_call",
        "tool_result",
    ]
    return env, events


def test_a_torn_event_that_reached_the_disk_as_zeros_is_skipped_and_cut_by_repair(session):
    """crash-model §2 rule 7 ("a write that extended the file may show the new size with none
    of its bytes") meets S-5: the zeros are a torn last line; ``show`` skips it and says so,
    ``repair`` cuts exactly those bytes and nothing else, a second repair has nothing to do,
    and the next call's events are whole lines after the earlier ones."""
    env, events = session
    whole = events.read_bytes()
    with events.open("ab") as f:
        f.write(b"\0" * 700)
    shown = ctx_run("session", "show", "bob", "s1", "--json", env=env)
    assert shown.rc == 0 and [json.loads(x) for x in shown.lines()] == [
        json.loads(x) for x in whole.splitlines()
    ]
    assert "torn line of 700 bytes" in shown.err and "session repair" in shown.err, shown
    fixed = ctx_run("session", "repair", "bob", "s1", "--json", env=env)
    assert fixed.rc == 0 and fixed.json()["truncated_bytes"] == 700, fixed
    assert events.read_bytes() == whole
    again = ctx_run("session", "repair", "bob", "s1", env=env)
    assert again.rc == 0 and "nothing to do" in again.out, again
    with events.open("ab") as f:
        f.write(b"\0" * 300)
    ctx_run("run", "--agent", "bob", "--session", "s1", "fs.read", "/nowhere", env=env)
    data = events.read_bytes()
    assert data.startswith(whole) and b"\0" not in data and data.endswith(b"\n")
    assert [json.loads(x)["type"] for x in data.splitlines()] == ["tool_call", "tool_result"] * 2


@needs_strace
def test_a_new_sessions_directories_and_its_result_event_are_durable_before_the_call_ends(
    session, tmp_path
):
    """S-5: "Creating events.jsonl also syncs its directory, so the first durable event of a
    new session survives a crash together with its file", and a tool result is fsynced
    before it is reported: every directory made for a new session is synced in its parent,
    the session's own directory after events.jsonl is made, the file after its last write."""
    env, events = session
    trace = tmp_path / "session.trace"
    argv = ["strace", "-f", "-qq", "-y", "-o", str(trace), "-e",
            "trace=mkdirat,openat,write,fsync,fdatasync", *CTX_ARGV, "run", "--agent", "bob",
            "--session", "s2", "fs.read", "/nowhere"]  # fmt: skip
    subprocess.run(argv, capture_output=True, env=env, timeout=60)
    s2 = events.parent.parent / "s2"
    home = str(events.parents[4])  # home/<uid>
    lines = [x for x in trace.read_text().splitlines() if home in x]
    made = [(i, x) for i, x in enumerate(lines) if " mkdirat(" in x and x.endswith(" = 0")]
    assert made and any(f"{s2}>" in x or '"s2"' in x for _, x in made), lines
    for i, line in made:
        parent = FDPATH.findall(line)[0]
        assert any(" fsync(" in x and f"<{parent}>" in x for x in lines[i + 1 :]), (line, lines)
    created = next(i for i, x in enumerate(lines) if "events.jsonl" in x and "O_CREAT" in x)
    assert any(" fsync(" in x and f"<{s2}>" in x for x in lines[created + 1 :]), lines
    writes = [i for i, x in enumerate(lines) if " write(" in x and "events.jsonl" in x]
    assert len(writes) == 2
    assert any(" fsync(" in x and "events.jsonl" in x for x in lines[writes[-1] + 1 :]), lines
