"""The error branches of the queue and its workers, each reached from outside (SPEC R-2, §2.1,
Q-1 … Q-8, I-5, §2.4, W-1; docs/queue.md "A queue shared by a group", "The steps",
"What a crash leaves, and what recover does with it", "What is not a job", "Configuration",
"Command line"; docs/workers.md).

The angle: every refusal ``ctx queue publish``, ``claim``, ``renew``, ``finish``, ``status``,
``list``, ``show``, ``recover``, ``init`` and ``work`` may give, provoked as a user or an
operator provokes it — odd arguments, a state directory or a job directory that is not what
the protocol made (a symbolic link, a file, missing, pinned by ``chattr +i`` or ``+a``), a
config with a value past its bound, a lease naming another job, a result that proves
nothing, evidence planted beside a name, a result file that cannot be read.  Each check
reads the exit status of §2.4, the errno word of the ``ctx: ERRNO: sentence`` line and the
same error as the one ``--json`` object, that the message names the file or job at fault and
what to do where the documents promise it, and that nothing was half-done: the queue
directories byte for byte as they were, no job lost, duplicated or moved, no temp file left
where the step could remove it.  Where the refusal is followed by the repair it names, the
repair is run and the queue checked again."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    SUFFIX,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    request,
    result,
    snapshot,
)
from tests.acceptance.workercli import allow_in_tool_policy, make_agent, shell_job
from tests.support.storage import attribute

GOOD = json.dumps(request())
AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="chattr needs root")


# ----------------------------------------------------------------------------------- helpers


def refused(r: Run, name: str, status: int = 1) -> str:
    """``r``, run with ``--json``, exited ``status`` with one error object on stdout whose
    errno is ``name``, and the same error as the last line of stderr; its message."""
    assert "Traceback" not in r.err, r
    assert r.rc == status, r
    lines = r.out.splitlines()
    assert len(lines) == 1, r
    obj = json.loads(lines[0])
    assert (obj["error"], obj["errno"]) == (name, getattr(errno, name)), r
    assert r.err.rstrip("\n").splitlines()[-1] == f"ctx: {name}: {obj['message']}", r
    return obj["message"]


def job(name: str) -> str:
    return name + SUFFIX


def claimed_for(queue: QueueCLI, name: str, holder: int) -> str:
    """Publish ``name`` and claim it (the only pending job) for process ``holder``."""
    published = queue.publish(name=name)
    assert queue.claim("--pid", str(holder)) == published
    return published


def except_inbox(top: Path) -> dict[str, tuple]:
    """:func:`snapshot` of a queue without ``inbox/``, where a refused step may have left the
    staging file it could not remove."""
    return {k: v for k, v in snapshot(top).items() if not k.startswith("inbox")}


@pytest.fixture
def holder() -> Iterator[subprocess.Popen]:
    """A live process of this test's own, standing in as a lease holder."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


# --------------------------------------------- append-only directories: what os.access misses

INBOX_STEPS = [
    pytest.param(
        ("publish", "--name", "fresh", "-"),
        GOOD,
        "nothing was published",
        id="publish",
    ),
    pytest.param(
        ("publish", "--batch", "-"),
        f"{GOOD}\n{GOOD}\n",
        "nothing was published",
        id="batch",
    ),
    pytest.param(
        ("claim", "--pid", "{holder}"),
        "",
        "nothing was claimed",
        id="claim",
    ),
    pytest.param(
        ("finish", "{held}", "--ok", "-"),
        '"out"',
        "no result of it was written",
        id="finish",
    ),
    pytest.param(
        ("renew", "{held}", "--pid", "{holder}"),
        "",
        "unchanged",
        id="renew",
    ),
]


@needs_root
@pytest.mark.parametrize(("argv", "given", "outcome"), INBOX_STEPS)
def test_a_step_refused_by_an_append_only_inbox_names_the_attribute(
    queue: QueueCLI, holder, argv: tuple, given: str, outcome: str
) -> None:
    """docs/queue.md "A queue shared by a group": a write refused by a directory's
    immutable or append-only attribute (``chattr +i``, ``+a``: no mode explains it, and it
    refuses root too) is EPERM naming the attribute and the ``chattr -a DIR`` that removes
    it, and ``publish`` says "nothing was published", ``claim`` "nothing was claimed (job J
    stays pending)", ``renew`` that the lease is unchanged, ``finish`` that the job stays
    claimed with no result written.  An append-only ``inbox/`` lets a step create its staging
    file there but not move it out: every step that stages a file meets it (exit 1), and
    nothing outside ``inbox/`` changes."""
    held = claimed_for(queue, "held", holder.pid)
    queue.publish(name="waiting")
    words = [w.format(held=held, holder=holder.pid) for w in argv]
    inbox = queue.dir / "inbox"
    before = except_inbox(queue.dir)
    with attribute(inbox, "a"):
        r = queue.run(words[0], *words[1:], "--json", input=given)
    assert except_inbox(queue.dir) == before, r
    assert queue.state(held) == "claimed" and queue.state(job("waiting")) == "pending"
    said = refused(r, "EPERM")
    for words_said in ("append-only", f"chattr -a {inbox}", outcome):
        assert words_said in said, (words_said, said)


@needs_root
def test_a_worker_whose_claim_an_append_only_inbox_refuses_names_the_attribute(
    searchable_storage: Path,
) -> None:
    """docs/workers.md "A host that runs short": a claim the host refuses midway is undone,
    the job back in ``pending/``, and the worker stops with that errno (exit 1, the error
    object last on stdout with ``--json``); docs/queue.md: the refusal of an append-only
    directory names the attribute and the ``chattr -a DIR`` that removes it."""
    storage = searchable_storage
    make_agent(storage, ["shell.exec"])
    allow_in_tool_policy(storage, "shell.exec")
    queue = QueueCLI(storage, "proj")
    published = queue.publish(shell_job("echo hi"), name="echo")
    inbox = queue.dir / "inbox"
    with attribute(inbox, "a"):
        r = queue.run("work", "--agent", "ci", "--drain", "--json", timeout=60)
    assert "Traceback" not in r.err, r
    assert r.rc == 1, r
    last = json.loads(r.out.splitlines()[-1])
    assert last["error"] == "EPERM" and r.err.rstrip().endswith(last["message"]), r
    assert queue.state(published) == "pending"
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()
    assert "append-only" in last["message"] and f"chattr -a {inbox}" in last["message"], r


FINISH_PINS = ["claimed/{J}", "lease/{J}", "claimed", "lease"]


@needs_root
@pytest.mark.parametrize("pinned", FINISH_PINS)
def test_finish_refused_by_an_append_only_directory_moves_nothing(
    queue: QueueCLI, holder, pinned: str
) -> None:
    """docs/queue.md "A queue shared by a group": "``finish`` cannot undo a result once it is
    in ``done/``, so it checks first that it may write every directory it changes (``inbox/``,
    ``done/`` or ``failed/``, ``claimed/``, ``lease/`` and the job's own ``claimed/J`` and
    ``lease/J``), and nothing has moved when it refuses"; an append-only attribute refuses
    the removal (or the move out) finish needs there, to root too, and the refusal is EPERM
    naming it and the ``chattr -a DIR`` that lifts it."""
    held = claimed_for(queue, "held", holder.pid)
    target = queue.dir / pinned.format(J=held)
    before = snapshot(queue.dir)
    with attribute(target, "a"):
        r = queue.run("finish", held, "--ok", "-", "--json", input='"out"')
        after = snapshot(queue.dir)
    assert "Traceback" not in r.err, r
    assert r.rc == 1 and r.json()["error"] == "EPERM", r
    assert after == before, r
    assert queue.state(held) == "claimed"
    said = r.json()["message"]
    assert "append-only" in said and f"chattr -a {target}" in said, said


@needs_root
def test_renew_refused_by_an_append_only_lease_directory_names_it_and_keeps_the_lease(
    queue: QueueCLI, holder
) -> None:
    """The step that gets it right: ``renew`` replaces ``lease/J/worker``, which an
    append-only ``lease/J`` refuses; the refusal (exit 1) is EPERM naming the attribute, the
    directory and its ``chattr -a``, says the lease is unchanged and when it expires, and
    leaves the lease as it was and no temp file in ``inbox/``."""
    held = claimed_for(queue, "held", holder.pid)
    lease_dir = queue.dir / "lease" / held
    expires = queue.lease(held)["expires_at"]
    before = snapshot(queue.dir)
    with attribute(lease_dir, "a"):
        r = queue.run("renew", held, "--pid", str(holder.pid), "--json")
    said = refused(r, "EPERM")
    assert snapshot(queue.dir) == before
    for words in ("append-only", f"chattr -a {lease_dir}", f"unchanged (it expires at {expires})"):
        assert words in said, (words, said)


# ------------------------------------------------------- state directories and the config


def every_command(holder: int) -> list[tuple[tuple, str]]:
    """Each queue command once, with what it reads on stdin."""
    pid = str(holder)
    return [
        (("init",), ""),
        (("publish", "--name", "n", "-"), GOOD),
        (("publish", "--batch", "-"), f"{GOOD}\n"),
        (("claim", "--pid", pid), ""),
        (("renew", "x", "--pid", pid), ""),
        (("finish", "x", "--ok", "-"), '"out"'),
        (("status",), ""),
        (("list",), ""),
        (("show", "x"), ""),
        (("recover", "--reconcile"), ""),
        (("work", "--drain"), ""),
    ]


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_a_state_directory_that_is_no_real_directory_is_refused_by_every_command(
    queue: QueueCLI, holder, tmp_path: Path, kind: str
) -> None:
    """Q-8, docs/queue.md "Command line" (init): a state directory that is not a real one is
    refused with its full path before anything is made; a link is never followed.  Every
    command, ``init`` and ``work`` included, exits 1 with ENOTDIR "Q/pending is not a real
    directory; refusing to use it" for a file, ELOOP "Q/pending is a symlink, not a real
    directory; refusing to follow it" for a link (as a link anywhere on a queue's path), and
    neither the queue nor what the link leads to changes."""
    pending = queue.dir / "pending"
    pending.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / job("bait")).write_text(GOOD)
    if kind == "symlink":
        pending.symlink_to(elsewhere)
    else:
        pending.write_text(GOOD)
    before, outside = snapshot(queue.dir), snapshot(elsewhere)
    for argv, given in every_command(holder.pid):
        r = queue.run(argv[0], *argv[1:], "--json", input=given)
        if kind == "symlink":
            said = refused(r, "ELOOP")
            expected = f"{pending} is a symlink, not a real directory; refusing to follow it"
        else:
            said = refused(r, "ENOTDIR")
            expected = f"{pending} is not a real directory; refusing to use it"
        assert said == expected, (argv, r)
        assert snapshot(queue.dir) == before and snapshot(elsewhere) == outside, argv


def test_a_missing_state_directory_is_named_with_the_init_that_repairs_it(
    queue: QueueCLI, holder
) -> None:
    """docs/queue.md: "The only repair ``init`` makes is what is missing"; a queue without
    one of its six directories is refused by every other command (ENOENT, exit 1) naming the
    directory and ``ctx queue init`` for this queue.  That init makes the directory (and only
    it, mode 02770 as in a space), keeps the pending job, and the claim then works."""
    waiting = queue.publish(name="waiting")
    (queue.dir / "lease").rmdir()
    before = snapshot(queue.dir)
    for argv in (("claim", "--pid", str(holder.pid)), ("status",), ("recover", "--reconcile")):
        said = refused(queue.run(argv[0], *argv[1:], "--json"), "ENOENT")
        assert said == (
            f"queue {queue.dir} has no lease/ directory; repair it with 'ctx queue init "
            "--project proj'"
        ), said
        assert snapshot(queue.dir) == before
    made = queue.run("init", "--json")
    assert made.rc == 0 and made.json()["created"] == [str(queue.dir / "lease")], made
    assert oct((queue.dir / "lease").stat().st_mode & 0o7777) == oct(0o2770)
    assert queue.claim("--pid", str(holder.pid)) == waiting


def test_status_says_when_the_config_is_missing_and_writes_none(queue: QueueCLI) -> None:
    """docs/queue.md "Configuration": every limit is the config's; ``status`` of a queue whose
    ``config`` is missing says so on stderr (a ``ctx: note:`` naming it, and the ``ctx queue
    init`` for this queue that writes the default), exits 0 and writes nothing (stdout stays
    the one JSON object with ``--json``)."""
    config = queue.dir / "config"
    config.unlink()
    before = snapshot(queue.dir)
    for args in ((), ("--json",)):
        r = queue.run("status", *args)
        assert r.rc == 0 and "Traceback" not in r.err, r
        note = (
            f"ctx: note: {config} is missing, so every limit is the default; 'ctx queue init "
            "--project proj' writes the default config in its place"
        )
        assert r.err.splitlines() == [note], r
        if args:
            assert r.json()["pending"] == 0, r
        assert snapshot(queue.dir) == before
    assert queue.run("init").rc == 0
    assert config.is_file()


def test_a_config_grace_past_366_days_is_refused_naming_its_line(queue: QueueCLI) -> None:
    """docs/queue.md "Configuration": ``grace`` is at most 31 622 400 seconds (366 days), as
    for ``recover --grace``; a config past it is refused by every command that opens the
    queue, ``init`` included (EINVAL, exit 1, the file and line named), and nothing is
    published or changed."""
    config = queue.dir / "config"
    lines = config.read_text().splitlines()
    config.write_text("\n".join([*lines, "grace=31622401"]) + "\n")
    where = f"{config}:{len(lines) + 1}"
    before = snapshot(queue.dir)
    for argv, given in (
        (("publish", "--name", "n", "-"), GOOD),
        (("recover", "--reconcile"), ""),
        (("init",), ""),
    ):
        said = refused(queue.run(argv[0], *argv[1:], "--json", input=given), "EINVAL")
        assert said == (
            f"{where}: grace must be at most 31622400 seconds (366 days), not '31622401'"
        ), said
        assert snapshot(queue.dir) == before


# ------------------------------------------------------------------ publish: a name held


def test_publish_over_an_empty_claim_directory_names_it_until_reconcile_removes_it(
    queue: QueueCLI,
) -> None:
    """Q-1: a name with evidence anywhere is refused (EEXIST); docs/queue.md: an empty
    ``claimed/J`` is a claim in progress or one cut short, which ``recover --reconcile``
    removes.  The refusal (exit 1) says which and names that recover; once it ran (exit 0,
    ``remove-orphans``), the same publish succeeds."""
    j = job("held")
    (queue.dir / "claimed" / j).mkdir()
    before = snapshot(queue.dir)
    said = refused(queue.run("publish", "--name", "held", "-", "--json", input=GOOD), "EEXIST")
    assert snapshot(queue.dir) == before
    assert f"job {j} has an empty claimed/{j}" in said, said
    assert "'ctx queue recover --reconcile --project proj' removes it" in said, said
    fixed = queue.run("recover", "--reconcile", "--json")
    assert fixed.rc == 0, fixed
    assert [(f["job"], f["action"]) for f in fixed.json()["repaired"]] == [(j, "remove-orphans")]
    assert queue.publish(name="held") == j and queue.state(j) == "pending"


def test_publish_over_a_finished_job_with_a_leftover_lease_says_so_and_stays_refused(
    queue: QueueCLI,
) -> None:
    """Q-1, docs/queue.md: a job done, with a ``lease/J`` its finish left (cut short in its
    clean-up), is refused as already done, naming the leftover and the ``recover
    --reconcile`` that removes it; after that recover the name is still refused (done), now
    without the leftover, and the job stays done."""
    j = queue.terminal("old")
    (queue.dir / "lease" / j).mkdir()
    before = snapshot(queue.dir)
    said = refused(queue.run("publish", "--name", "old", "-", "--json", input=GOOD), "EEXIST")
    assert snapshot(queue.dir) == before
    assert f"job {j} is already done, with a leftover claimed/{j} or lease/{j}" in said, said
    assert "'ctx queue recover --reconcile --project proj' removes" in said, said
    assert queue.run("recover", "--reconcile").rc == 0
    said = refused(queue.run("publish", "--name", "old", "-", "--json", input=GOOD), "EEXIST")
    assert said == f"job {j} is already done; publish under another name", said
    assert queue.state(j) == "done" and queue.entries("lease") == set()


# -------------------------------------------------------------- leases that are not leases


def test_a_lease_naming_another_job_is_a_conflict_every_command_leaves_alone(
    queue: QueueCLI, holder
) -> None:
    """docs/queue.md "The steps": a lease's ``job``, when present, must be J; a claimed job
    whose lease cannot be read is a conflict for ``status``, ``list``, ``show`` and
    ``recover`` alike (exit 1), and ``finish`` and ``renew`` refuse it with the lease's own
    error (EINVAL), naming the job and ``lease/J/worker``, changing nothing."""
    held = claimed_for(queue, "held", holder.pid)
    lease = queue.lease(held)
    lease["job"] = job("other")
    queue.write_lease(held, lease)
    why = f"lease names job '{job('other')}', not {held}"
    before = snapshot(queue.dir)
    status = queue.run("status", "--json")
    assert status.rc == 1, status
    (conflict,) = status.json()["conflicts"]
    assert conflict["job"] == held and why in conflict["detail"], status
    show = queue.run("show", held, "--json")
    assert show.rc == 1 and show.json()["state"] == "conflict", show
    assert show.json()["holder"]["state"] == "unreadable", show
    listed = queue.run("list", "--state", "conflict")
    assert (listed.rc, listed.out) == (1, f"{held}\n"), listed
    for argv, given in (
        (("finish", held, "--ok", "-"), '"out"'),
        (("renew", held, "--pid", str(holder.pid)), ""),
    ):
        said = refused(queue.run(argv[0], *argv[1:], "--json", input=given), "EINVAL")
        assert f"job {held}'s lease/{held}/worker is not a lease ({why})" in said, said
    recovered = queue.run("recover", "--reconcile", "--json")
    assert recovered.rc == 1, recovered
    assert [c["job"] for c in recovered.json()["conflicts"]] == [held], recovered
    assert snapshot(queue.dir) == before


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_finish_and_renew_refuse_a_claim_directory_that_is_no_directory(
    queue: QueueCLI, holder, tmp_path: Path, kind: str
) -> None:
    """Q-8, docs/queue.md "What is not a job": ``claimed/J`` that is a symlink or a file is
    evidence of the wrong kind, never followed: ``finish`` and ``renew`` refuse it (ENOTDIR
    for a file, ELOOP for a link, exit 1) naming it as a conflict and ``ctx queue show J``
    for this queue, and nothing changes, where the link leads included."""
    held = claimed_for(queue, "held", holder.pid)
    claim_dir = queue.dir / "claimed" / held
    aside = tmp_path / "aside"
    shutil.move(claim_dir, aside)
    if kind == "symlink":
        claim_dir.symlink_to(aside)
    else:
        claim_dir.write_text(GOOD)
    code, what = ("ELOOP", "symlink") if kind == "symlink" else ("ENOTDIR", "regular file")
    before, outside = snapshot(queue.dir), snapshot(aside)
    for argv, given in (
        (("finish", held, "--ok", "-"), '"out"'),
        (("renew", held, "--pid", str(holder.pid)), ""),
    ):
        said = refused(queue.run(argv[0], *argv[1:], "--json", input=given), code)
        assert said.startswith(
            f"job {held}'s claimed/{held} is a {what}, not a directory: a conflict"
        ), said
        assert f"'ctx queue show {held} --project proj'" in said, said
        assert snapshot(queue.dir) == before and snapshot(aside) == outside


# ------------------------------------------------------------- recover refused by attributes


def _orphans(queue: QueueCLI, j: str) -> Path:
    (queue.dir / "claimed" / j).mkdir()
    (queue.dir / "lease" / j).mkdir()
    return queue.dir / "claimed"


def _interrupted_finish(queue: QueueCLI, j: str) -> Path:
    (queue.dir / "claimed" / j).mkdir()
    (queue.dir / "claimed" / j / j).write_text(GOOD)
    (queue.dir / "done" / f"{j}.result").write_text(json.dumps(result()))
    return queue.dir / "done"


def _second_link(queue: QueueCLI, j: str) -> Path:
    (queue.dir / "pending" / j).write_text(GOOD)
    (queue.dir / "claimed" / j).mkdir()
    os.link(queue.dir / "pending" / j, queue.dir / "claimed" / j / j)
    return queue.dir / "claimed" / j


def _unleased(queue: QueueCLI, j: str) -> Path:
    (queue.dir / "claimed" / j).mkdir()
    (queue.dir / "claimed" / j / j).write_text(GOOD)
    return queue.dir / "pending"


REPAIRS = [
    pytest.param(_orphans, "remove-orphans", "remove the orphan claim and lease directories of",
                 "absent", id="remove-orphans"),
    pytest.param(_interrupted_finish, "roll-forward", "complete the interrupted finish of",
                 "done", id="roll-forward"),
    pytest.param(_second_link, "drop-claim-copy", "drop the claim's second link of", "pending",
                 id="drop-claim-copy"),
    pytest.param(_unleased, "requeue-unleased", "requeue", "pending", id="requeue-unleased"),
]  # fmt: skip


@needs_root
@pytest.mark.parametrize(("arrange", "repair", "verb", "then"), REPAIRS)
def test_a_repair_refused_by_an_immutable_directory_is_an_error_naming_it(
    queue: QueueCLI, arrange, repair: str, verb: str, then: str
) -> None:
    """Q-6, I-5, docs/queue.md "What a crash leaves": before a transition recover checks it
    may write every directory it changes; one made immutable refuses it, and the job is an
    ``error`` (exit 1) saying ``cannot <what the repair does> J in queue Q``, the attribute,
    its ``chattr -i`` and ``left as it is``, with ``error`` EPERM under ``errors`` in
    ``--json``; ``--dry-run`` reports the same error.  Nothing moves.  Lifted, ``recover
    --reconcile`` applies the repair (exit 0) and a second run changes nothing."""
    j = job("j")
    pinned = arrange(queue, j)
    before = snapshot(queue.dir)
    with attribute(pinned, "i"):
        runs = [queue.run("recover", "--reconcile", *dry, "--json") for dry in (("--dry-run",), ())]
        text = queue.run("recover", "--reconcile")
    assert snapshot(queue.dir) == before
    for r in runs:
        assert r.rc == 1 and "Traceback" not in r.err, r
        (error,) = r.json()["errors"]
        assert (error["job"], error["error"]) == (j, "EPERM"), r
        detail = error["detail"]
        assert detail.startswith(f"EPERM: cannot {verb} {j} in queue {queue.dir}: "), detail
        assert f"{pinned} is immutable" in detail and f"chattr -i {pinned}" in detail, detail
        assert detail.endswith("; left as it is"), detail
        assert r.json()["repaired"] == [] and r.json()["consistent"] is False, r
    assert text.rc == 1 and f"error    {j}: EPERM: cannot {verb} {j}" in text.out, text
    fixed = queue.run("recover", "--reconcile", "--json")
    assert fixed.rc == 0, fixed
    assert [(f["job"], f["action"]) for f in fixed.json()["repaired"]] == [(j, repair)], fixed
    assert queue.state(j) == (None if then == "absent" else then)
    settled = snapshot(queue.dir)
    again = queue.run("recover", "--reconcile", "--json")
    assert again.rc == 0 and again.json()["repaired"] == [] and again.json()["errors"] == []
    assert snapshot(queue.dir) == settled


# ----------------------------------------------------------------- conflicts planted by hand


def test_a_request_both_pending_and_claimed_as_two_files_is_left_to_a_person(
    queue: QueueCLI, holder
) -> None:
    """Q-6: "Anything else ... is a conflict: reported with every piece of evidence, never
    resolved automatically".  A claimed, leased job beside another request at ``pending/J``:
    ``status`` and ``recover --reconcile`` report it (exit 1) with its five pieces of
    evidence and change nothing; ``publish`` of the name is EEXIST; ``claim`` takes nothing
    (exit 3, stdout empty) and says why on stderr, leaving no claim directory behind."""
    held = claimed_for(queue, "held", holder.pid)
    (queue.dir / "pending" / held).write_text(json.dumps(request(tag="planted")))
    evidence = [
        f"pending/{held}",
        f"claimed/{held}/",
        f"claimed/{held}/{held}",
        f"lease/{held}/",
        f"lease/{held}/worker",
    ]
    before = snapshot(queue.dir)
    status = queue.run("status", "--json")
    assert status.rc == 1, status
    (conflict,) = status.json()["conflicts"]
    assert conflict["detail"] == "both pending and claimed, as different files", status
    assert conflict["evidence"] == evidence, status
    recovered = queue.run("recover", "--reconcile", "--json")
    assert recovered.rc == 1 and recovered.json()["conflicts"][0]["evidence"] == evidence
    said = refused(queue.run("publish", "--name", "held", "-", "--json", input=GOOD), "EEXIST")
    assert said == f"job {held} is already pending; publish under another name", said
    claim = queue.run("claim", "--pid", str(holder.pid))
    assert (claim.rc, claim.out) == (3, ""), claim
    assert f"left pending, with claimed/J there already: {held}" in claim.err, claim
    assert snapshot(queue.dir) == before


def test_a_pending_job_already_finished_is_never_claimed_and_is_named(queue: QueueCLI) -> None:
    """docs/queue.md "The steps" (claim, step 3) and "Command line": J pending and in
    ``done/`` too is a conflict: it is left pending and never run again; ``claim`` exits 3
    with nothing on stdout (``--json`` too) and a ``ctx: note:`` naming J and the conflict;
    a drained worker exits 0 and lists it under ``left_pending`` as ``finished``.  Nothing
    moves, no ``claimed/J`` is left."""
    j = queue.terminal("twice")
    (queue.dir / "pending" / j).write_text(GOOD)
    before = snapshot(queue.dir)
    for args in ((), ("--json",)):
        r = queue.run("claim", "--pid", "1", *args)
        assert (r.rc, r.out) == (3, ""), r
        assert f"ctx: note: left pending, as J is in done/ or failed/ too, a conflict: {j};" in (
            r.err
        ), r
        assert snapshot(queue.dir) == before
    worked = queue.run("work", "--drain", "--json", timeout=60)
    assert worked.rc == 0, worked
    stop = [json.loads(line) for line in worked.out.splitlines()][-1]
    assert stop["event"] == "stop" and stop["left_pending"] == {j: "finished"}, worked
    assert stop["done"] == stop["failed"] == 0, worked
    assert snapshot(queue.dir) == before


HALF_PAIRS = [
    pytest.param("failed", "{J}", "{J}.result", id="a-request-without-its-result"),
    pytest.param("done", "{J}.result", "{J}", id="a-result-without-its-request"),
]


@pytest.mark.parametrize(("state", "present", "missing"), HALF_PAIRS)
def test_half_a_terminal_pair_is_named_by_finish_renew_and_publish(
    queue: QueueCLI, holder, state: str, present: str, missing: str
) -> None:
    """Q-6 (a conflict, never resolved), docs/queue.md "Command line": ``finish`` of a job
    that is not claimed says where it is instead — finished, here half of it: EEXIST naming
    the file there and the one missing, and the ``ctx queue show`` for this queue;
    ``renew`` says there is no lease to renew and why (ENOENT); ``publish`` of the name is
    EEXIST.  Exit 1 each time, nothing written."""
    j = job("half")
    there = queue.dir / state / present.format(J=j)
    there.write_text(GOOD if present == "{J}" else json.dumps(result(state)))
    where = (
        f"job {j} is already {state}, as {state}/{present.format(J=j)} says, but "
        f"{state}/{missing.format(J=j)} is missing: a conflict 'ctx queue status --project "
        f"proj' reports, which no finish settles; 'ctx queue show {j} --project proj' shows "
        "what is left of it"
    )
    before = snapshot(queue.dir)
    flag = "--ok" if state == "done" else "--error"
    said = refused(queue.run("finish", j, flag, "-", "--json", input='"out"'), "EEXIST")
    assert said == where, said
    said = refused(queue.run("renew", j, "--pid", str(holder.pid), "--json"), "ENOENT")
    assert said == f"there is no lease to renew: {where}", said
    said = refused(queue.run("publish", "--name", "half", "-", "--json", input=GOOD), "EEXIST")
    assert said == f"job {j} is already {state}; publish under another name", said
    assert snapshot(queue.dir) == before


def test_a_name_held_only_by_a_dead_publishers_staging_file_until_reconcile(
    queue: QueueCLI,
) -> None:
    """docs/queue.md publish step 2: the staging name ``inbox/J.publish.tmp`` is created with
    ``O_EXCL``; one a publisher that died left holds J (EEXIST, "being published by another
    process, or its publisher died midway", naming the file and the recover that removes
    it); ``show J`` lists it (state ``none``, "only temp files", exit 0).  ``recover
    --reconcile`` past the grace period removes it (listed under ``removed_temps``), after
    which ``show J`` is ENOENT ("no evidence", exit 1) and the publish succeeds."""
    j = job("staged")
    temp = queue.dir / "inbox" / f"{j}.publish.tmp"
    temp.write_text("{")
    before = snapshot(queue.dir)
    said = refused(queue.run("publish", "--name", "staged", "-", "--json", input=GOOD), "EEXIST")
    assert said.startswith(f"job {j} is being published by another process, or its publisher "), (
        said
    )
    assert f"inbox/{temp.name}" in said and "recover --reconcile --project proj" in said, said
    shown = queue.run("show", j, "--json")
    assert shown.rc == 0, shown
    assert (shown.json()["state"], shown.json()["detail"]) == ("none", "only temp files")
    assert [t["path"] for t in shown.json()["temps"]] == [f"inbox/{temp.name}"], shown
    assert snapshot(queue.dir) == before
    swept = queue.run("recover", "--reconcile", "--grace", "0", "--json")
    assert swept.rc == 0 and swept.json()["removed_temps"] == [f"inbox/{temp.name}"], swept
    said = refused(queue.run("show", j, "--json"), "ENOENT")
    assert said == f"job {j} has no evidence in {queue.dir}", said
    assert queue.publish(name="staged") == j and queue.state(j) == "pending"


BOGUS_RESULTS = [
    pytest.param(json.dumps({"status": "error", "output": 1}), "is not a result object with "
                 "status 'ok'", id="status-of-the-other-directory"),
    pytest.param("not json at all", "cannot be read as a result", id="not-JSON"),
    # With max_result_bytes=1000, no finish writes more than 1 MiB (a failure record).
    pytest.param("x" * (1024 * 1024 + 1), "more than any finish writes (1048576",
                 id="larger-than-any"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "why"), BOGUS_RESULTS)
def test_a_result_that_proves_nothing_beside_a_claim_is_a_conflict_finish_refuses(
    queue: QueueCLI, holder, text: str, why: str
) -> None:
    """docs/queue.md "What a crash leaves": a result beside a claimed request that is larger
    than any finish writes, or not a result object whose ``status`` is its directory's, is
    something else put there and proves nothing of the job's run: a conflict (``status``
    exit 1, "proves nothing of the run of J"), never rolled forward by ``recover --reconcile``
    (exit 1); ``finish`` refuses it (EEXIST, exit 1) as a conflict a person must repair,
    writing nothing."""
    held = claimed_for(queue, "held", holder.pid)
    config = queue.dir / "config"
    config.write_text(config.read_text() + "max_result_bytes=1000\n")
    (queue.dir / "done" / f"{held}.result").write_text(text)
    before = snapshot(queue.dir)
    status = queue.run("status", "--json")
    assert status.rc == 1, status
    (conflict,) = status.json()["conflicts"]
    assert why in conflict["detail"], conflict
    assert f"proves nothing of the run of {held}" in conflict["detail"], conflict
    recovered = queue.run("recover", "--reconcile", "--json")
    assert recovered.rc == 1 and recovered.json()["repaired"] == [], recovered
    said = refused(queue.run("finish", held, "--ok", "-", "--json", input='"out"'), "EEXIST")
    assert said.startswith(f"done/{held}.result already exists: job {held} is a conflict"), said
    assert "a person must look at it" in said and said.endswith("nothing was changed"), said
    assert snapshot(queue.dir) == before


# ------------------------------------------------------------------- inputs that cannot be read


@pytest.mark.parametrize(("where", "code"), [("missing", "ENOENT"), ("directory", "EISDIR")])
def test_finish_from_a_result_file_it_cannot_read_writes_nothing(
    queue: QueueCLI, holder, tmp_path: Path, where: str, code: str
) -> None:
    """§2.4 ``finish J (--ok | --error) [RESULT_FILE | -]``: a RESULT_FILE that cannot be read
    (missing, a directory) is refused with the kernel's errno naming the file (exit 1), and
    the job stays claimed with no result written."""
    held = claimed_for(queue, "held", holder.pid)
    source = tmp_path / "result.json"
    if where == "directory":
        source.mkdir()
    before = snapshot(queue.dir)
    said = refused(queue.run("finish", held, "--error", str(source), "--json"), code)
    assert said.startswith(f"cannot read {source}: "), said
    assert snapshot(queue.dir) == before and queue.state(held) == "claimed"


def test_a_stored_request_over_the_limit_is_claimed_as_invalid_and_failed(
    queue: QueueCLI,
) -> None:
    """docs/queue.md "Layout and states" and "Configuration": readers allow a stored request
    up to ``max_request_bytes`` plus 64 KiB; one larger (the limit lowered after it was
    published) is claimed as a malformed request: ``claim --json`` gives ``{"tool": null,
    "input": {}, "invalid": …}`` naming the size, the limit and the config key, and a note
    on stderr says to finish it with ``--error``, which works."""
    big = request(pad="x" * 70_000)
    j = queue.publish(big, name="big")
    config = queue.dir / "config"
    config.write_text(config.read_text() + "max_request_bytes=100\n")
    r = queue.run("claim", "--pid", "1", "--json")
    assert r.rc == 0, r
    got = r.json()
    assert got["name"] == j and (got["request"]["tool"], got["request"]["input"]) == (None, {})
    reason = got["request"]["invalid"]
    assert reason.startswith("stored request is over the size limit: "), reason
    assert "max_request_bytes=100" in reason and "65636" in reason, reason
    assert f"ctx: note: the request of {j} is not valid (" in r.err, r
    assert r.err.rstrip().endswith("finish it with --error, as a worker does"), r
    assert queue.run("finish", j, "--error").rc == 0
    assert queue.state(j) == "failed"


# ------------------------------------------------------------------ queue paths on the command


@pytest.mark.parametrize(
    ("place", "said"),
    [
        ("queue", "lies inside the storage root {root} but is not a project's queue"),
        ("shared/cortexfs-docs/queue", "lies in cortexfs-docs, the system-maintained manual"),
    ],
)
def test_a_queue_path_inside_the_root_that_is_no_projects_queue_is_a_usage_error(
    storage: Path, place: str, said: str
) -> None:
    """R-2, X-2, docs/queue.md "Command line": inside the storage root a queue path must be a
    project's queue, and ``shared/cortexfs-docs`` is the manual bundle, never a space:
    ``--queue ROOT/queue`` and ``--queue ROOT/shared/cortexfs-docs/queue`` are EINVAL, exit 2,
    for ``init`` as for ``status``, and nothing is made."""
    path = storage / place
    env = clean_env(CTX_STORAGE=str(storage))
    for verb in ("init", "status"):
        r = ctx_run("queue", verb, "--queue", path, "--json", env=env)
        message = refused(r, "EINVAL", status=2)
        assert message.startswith(f"--queue {path} {said.format(root=storage)}"), message
        assert not path.exists() and not os.path.lexists(path)
    assert sorted(os.listdir(storage)) == sorted(
        ["agent", "bin", "home", "model", "shared", "tool"]
    )
