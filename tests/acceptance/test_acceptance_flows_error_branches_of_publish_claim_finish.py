"""The error branches of ``ctx queue publish``, ``claim``, ``renew`` and ``finish``, each
reached from outside (SPEC R-3, §2.1, Q-1 … Q-4, Q-8, §2.4; docs/queue.md "Layout and
states", "A queue shared by a group", "The steps", "What is not a job (Q-8)",
"Configuration", "Command line").

The angle: every refusal, and every failure turned into an answer (a note, a job passed
over), that these four commands and the readers they send a user to can give, provoked as a
user provokes it — a command line without its source or with two that exclude each other,
a source that cannot be read, a request made too big by what publish adds, documents that are
no object, names one byte past R-3 and exactly at it, ``--pid``, ``--ttl`` and ``--worker``
values at and past their bounds, a config line no rule takes, an entry of the wrong kind at a
job's name, a whole result that contradicts the finish, a result too big once recorded, a
claim or renew whose lease names the command's own process or a process that is gone, a
second real user of the space whose steps a state directory refuses, and a queue changed
while the command reads its input.  Each check reads the exit status of §2.4, the errno word
of the ``ctx: ERRNO: sentence`` line and the same error as the one ``--json`` object, that
the message names the thing at fault and what to do where the documents promise it, that
what a message sends the user to (a reader, a repair) says and does what the message says,
and that nothing was half-done: the queue byte for byte as it was, no job lost, doubled or
moved, no staging file left in ``inbox/``."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    SUFFIX,
    QueueCLI,
    Run,
    alive,
    clean_env,
    ctx_run,
    request,
    rfc3339,
    snapshot,
    wait_for,
)
from tests.support.users import UnprivilegedUser, members_of

CTX = CTX_ARGV[0]
GOOD = json.dumps(request())
HOST = os.uname().nodename
# The highest pid Linux can give (PID_MAX_LIMIT): taken by --pid, never a live process on a
# host whose pid_max is lower.
TOP_PID = 4_194_304
LONGEST_TTL = 31_622_400  # 366 days, the longest lease a claim or renewal may take
AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="needs root to act as a second user")


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


def notes(r: Run) -> list[str]:
    return [line for line in r.err.splitlines() if line.startswith("ctx: note: ")]


def claimed_for(queue: QueueCLI, name: str, pid: int) -> str:
    """Publish ``name`` and claim it (the oldest pending job) for process ``pid``."""
    published = queue.publish(name=name)
    assert queue.claim("--pid", str(pid)) == published
    return published


def add_config(queue: QueueCLI, line: str) -> int:
    """Append ``line`` to the queue's config (a key given again counts from there on); its
    line number."""
    config = queue.dir / "config"
    text = config.read_text()
    config.write_text(text + line + "\n")
    return len((text + line).splitlines())


def sh(queue: QueueCLI, shell: str, script: str) -> Run:
    """``SHELL -c SCRIPT`` with the queue's storage in the environment."""
    found = shutil.which(shell)
    if found is None:
        pytest.skip(f"{shell} is not installed")
    proc = subprocess.run(
        [found, "-c", script],
        capture_output=True,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        timeout=60,
    )
    return Run([shell, "-c", script], proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def has_open(pid: int, directory: Path) -> bool:
    """Whether process ``pid`` holds ``directory`` open (a queue command holds one descriptor
    per state directory from the moment it opened the queue)."""
    fds = Path(f"/proc/{pid}/fd")
    try:
        links = [os.readlink(fd) for fd in fds.iterdir()]
    except OSError:
        return False
    return str(directory) in links


def empty_inbox(queue: QueueCLI) -> None:
    assert queue.entries("inbox") == set(), queue.entries("inbox")


# ------------------------------------------------- publish: its command line and its sources


@pytest.mark.parametrize(
    "argv",
    [("publish", "--batch"), ("publish", "--name", "given")],
    ids=["batch", "named"],
)
def test_publish_without_a_source_is_a_usage_error_and_publishes_nothing(
    queue: QueueCLI, argv: tuple[str, ...]
) -> None:
    """§2.4 ``publish --project P [--name J] (FILE | -)``: the source is required; without it
    the command is a usage error (exit 2, EINVAL, the JSON object too) saying to give FILE or
    ``-``, even with a request waiting on stdin, and nothing is published."""
    before = snapshot(queue.dir)
    r = queue.run(argv[0], *argv[1:], "--json", input=GOOD)
    said = refused(r, "EINVAL", 2)
    assert said == "give a request FILE, or - to read it from stdin", said
    assert "Usage: ctx queue publish" in r.err, r
    assert snapshot(queue.dir) == before


def test_publish_name_with_batch_is_a_usage_error_and_publishes_nothing(queue: QueueCLI) -> None:
    """§2.4: ``--name J`` names one job, ``--batch`` publishes one per line; together they are
    a usage error (exit 2, EINVAL) naming both, and not one line of a good batch is
    published."""
    before = snapshot(queue.dir)
    r = queue.run("publish", "--batch", "--name", "one", "--json", "-", input=f"{GOOD}\n{GOOD}\n")
    assert refused(r, "EINVAL", 2) == "--name cannot be used with --batch"
    assert snapshot(queue.dir) == before


def test_a_request_source_that_cannot_be_read_is_named_and_nothing_is_published(
    queue: QueueCLI, tmp_path: Path
) -> None:
    """§2.4 publish (FILE | -): a FILE that cannot be read is refused with the kernel's errno
    naming the file (exit 1) — a missing one for a single request, a directory for a batch —
    and nothing reaches ``pending/`` or ``inbox/``."""
    missing, directory = tmp_path / "missing.json", tmp_path / "requests"
    directory.mkdir()
    before = snapshot(queue.dir)
    for argv, source, code in (
        (("--name", "wanted"), missing, "ENOENT"),
        (("--batch",), directory, "EISDIR"),
    ):
        said = refused(queue.run("publish", *argv, "--json", str(source)), code)
        assert said.startswith(f"cannot read {source}: "), said
        assert snapshot(queue.dir) == before


def test_a_request_made_too_big_by_the_from_publish_adds_is_refused_whole(
    queue: QueueCLI,
) -> None:
    """§2.1 (size limit, "larger requests are refused with a clear error"), docs/queue.md
    "Configuration": publish fills in ``from`` (``$CTX_AGENT``) when the request has none,
    and readers allow a stored request the limit plus 64 KiB.  With ``max_request_bytes=100``
    and a 70 000-byte ``$CTX_AGENT``, a small request would be stored larger than that: EFBIG
    naming its stored size, the bound and the fields added (exit 1); a batch of two such
    lines is refused whole naming both lines (EINVAL); nothing is left in ``inbox/`` or
    ``pending/``.  The same request carrying its own ``from`` is published."""
    add_config(queue, "max_request_bytes=100")
    env = clean_env(CTX_STORAGE=str(queue.storage), CTX_AGENT="a" * 70_000)
    small = json.dumps({"tool": "fs.read", "input": {}})
    before = snapshot(queue.dir)
    single = refused(queue.run("publish", "--json", "-", input=small, env=env), "EFBIG")
    assert "once stored ('from' and 'created' added)" in single, single
    assert "this queue stores at most 65636" in single, single
    batch = refused(queue.run("publish", "--batch", "--json", "-", input=f"{small}\n{small}\n",
                              env=env), "EINVAL")  # fmt: skip
    assert batch.startswith("batch refused, nothing published: line 1: request is "), batch
    assert "; line 2: request is " in batch, batch
    assert snapshot(queue.dir) == before
    own = json.dumps({"tool": "fs.read", "input": {}, "from": "me"})
    published = queue.run("publish", "-", input=own, env=env)
    assert published.rc == 0 and queue.state(published.out.strip()) == "pending", published


@pytest.mark.parametrize("document", ["null", "5"])
def test_a_document_that_is_no_object_is_refused_as_a_request(
    queue: QueueCLI, document: str
) -> None:
    """§2.1: a request is one JSON object.  Valid JSON of another kind is refused with
    EINVAL (exit 1) saying it must be one object — given alone, and as a line of a batch,
    which names the line — and nothing is published."""
    before = snapshot(queue.dir)
    alone = refused(queue.run("publish", "--json", "-", input=document), "EINVAL")
    assert alone.startswith("request must be one JSON object, not "), alone
    line = refused(
        queue.run("publish", "--batch", "--json", "-", input=f"{GOOD}\n{document}\n"), "EINVAL"
    )
    assert "line 2 must be one JSON object, not " in line, line
    assert snapshot(queue.dir) == before


# ------------------------------------------------- names whose only entries are not jobs


@pytest.mark.parametrize(("place", "kind"), [("pending", "directory"), ("lease", "FIFO")])
def test_publish_over_an_entry_that_is_no_job_says_what_stands_there(
    queue: QueueCLI, place: str, kind: str
) -> None:
    """Q-1, Q-8, docs/queue.md "What is not a job": a directory where a request belongs, a
    FIFO where a lease directory belongs are not jobs; a name whose only entries are of the
    wrong kind "is not a job at all and is only listed as ignored".  Publishing that name is
    refused (EEXIST, nothing replaced), and the refusal names the entry and what it is, as
    the refusal of a wrong kind at the staging name does, rather than calling it a job."""
    entry = queue.dir / place / job("odd")
    if kind == "directory":
        entry.mkdir()
    else:
        os.mkfifo(entry)
    shown = queue.run("show", "odd", "--json")
    assert shown.rc == 0 and shown.json()["state"] == "ignored", shown
    before = snapshot(queue.dir)
    said = refused(queue.run("publish", "--name", "odd", "--json", "-", input=GOOD), "EEXIST")
    assert snapshot(queue.dir) == before
    assert f"{place}/{job('odd')}" in said and kind in said, said


def test_finish_and_renew_of_a_lone_file_at_a_lease_name_send_to_a_repair_that_works(
    queue: QueueCLI,
) -> None:
    """docs/queue.md "What is not a job" ("a name whose only entries are of the wrong kind is
    not a job at all and is only listed as ignored") and "Command line" (finish and renew of
    a job not claimed say where it is, "only its lease left, an incomplete job: that lease,
    with the recover --reconcile that removes it").  A regular file at ``lease/J`` is no
    lease directory: when finish and renew send the user to ``recover --reconcile`` to remove
    it, that run (once no holder can be alive: the file names none) removes it."""
    lease = queue.dir / "lease" / job("lone")
    lease.write_text("not a lease directory\n")
    finished = refused(queue.run("finish", "lone", "--ok", "--json"), "ENOENT")
    renewed = refused(queue.run("renew", "lone", "--pid", str(os.getpid()), "--json"), "ENOENT")
    assert os.path.lexists(lease)
    reconciled = queue.run("recover", "--reconcile", "--grace", "0", "--json")
    assert reconciled.rc == 0, reconciled
    for said in (finished, renewed):
        if "recover --reconcile" in said and "removes that lease" in said:
            assert not os.path.lexists(lease), (said, reconciled)


@pytest.mark.parametrize(
    "entry", ["done/{J}.result", "claimed/{J}"], ids=["fifo-result", "file-claim"]
)
def test_finish_of_a_name_status_calls_ignored_does_not_call_it_a_conflict(
    queue: QueueCLI, entry: str
) -> None:
    """docs/queue.md "What is not a job": evidence of the wrong type beside real evidence
    makes a job a conflict, but "a name whose only entries are of the wrong kind is not a job
    at all and is only listed as ignored" — by status, show and list alike.  finish and renew
    of such a name are refused (nothing changes), and what they say agrees with status: no
    conflict that status would report: J is not claimed (ENOENT), and no job."""
    path = queue.dir / entry.format(J=job("odd"))
    if entry.startswith("done"):
        os.mkfifo(path)
    else:
        path.write_text("{}\n")
    status = queue.run("status", "--json")
    assert status.rc == 0 and status.json()["conflict"] == 0, status
    ignored = [item["path"] for item in status.json()["ignored"]]
    assert str(path.relative_to(queue.dir)) in ignored, ignored
    before = snapshot(queue.dir)
    said = [refused(queue.run("finish", "odd", "--ok", "--json"), "ENOENT")]
    renewed = queue.run("renew", "odd", "--pid", str(os.getpid()), "--json")
    said.append(refused(renewed, "ENOENT"))
    assert snapshot(queue.dir) == before
    for message in said:
        assert "conflict" not in message, message
        assert f"{job('odd')} is no job" in message, message


def test_finish_of_a_directory_at_a_pending_name_does_not_send_to_a_claim(
    queue: QueueCLI, child
) -> None:
    """docs/queue.md "Command line": finish of a job that is not claimed says where it is
    (pending: claim it first).  A directory at ``pending/J`` is no request (Q-8): when finish
    calls J pending and says to claim it, ``list --state pending`` lists it and a claim
    takes it."""
    (queue.dir / "pending" / job("odd")).mkdir()
    said = refused(queue.run("finish", "odd", "--ok", "--json"), "ENOENT")
    nothing = queue.run("claim", "--pid", str(child.pid))
    assert (nothing.rc, nothing.out) == (3, ""), nothing
    pending = queue.run("list", "--state", "pending")
    assert pending.rc == 0, pending
    if "is pending" in said:
        assert job("odd") in pending.lines(), (said, pending)


# ---------------------------------------------------------------- finish: what it is given


@pytest.mark.parametrize("flags", [(), ("--ok", "--error")], ids=["neither", "both"])
def test_finish_needs_exactly_one_outcome(queue: QueueCLI, child, flags: tuple) -> None:
    """§2.4 ``finish J (--ok | --error)``: neither or both is a usage error (exit 2, EINVAL)
    saying to give exactly one; the job stays claimed, its lease byte for byte."""
    held = claimed_for(queue, "held", child.pid)
    before = snapshot(queue.dir)
    r = queue.run("finish", held, *flags, "--json", "-", input='"out"')
    said = refused(r, "EINVAL", 2)
    assert said == "say how the job ended: exactly one of --ok or --error", said
    assert snapshot(queue.dir) == before and queue.state(held) == "claimed"


@pytest.mark.parametrize(
    ("flag", "document", "said"),
    [
        ("--ok", {"status": "error", "output": 1}, "says status 'error', but the job is "
         "finished with --ok"),
        ("--error", {"status": "ok", "output": 1}, "says status 'ok', but the job is "
         "finished with --error"),
        ("--ok", '{"status": "ok", "output": 1, "status": "ok"}', "names 'status' more than "
         "once in its top object; give each once (nothing was finished)"),
    ],
    ids=["error-as-ok", "ok-as-error", "status-twice"],
)  # fmt: skip
def test_a_whole_result_that_contradicts_the_finish_is_a_usage_error(
    queue: QueueCLI, child, flag: str, document, said: str
) -> None:
    """docs/queue.md "Command line": a whole result object of SPEC §2.1's shape gives its
    output, and its status must agree with --ok/--error (else EINVAL, exit 2); one naming its
    status twice, which readers would take as one or the other, is refused as well.  The job
    stays claimed, nothing in ``done/``, ``failed/`` or ``inbox/``."""
    held = claimed_for(queue, "held", child.pid)
    text = document if isinstance(document, str) else json.dumps(document)
    before = snapshot(queue.dir)
    message = refused(queue.run("finish", held, flag, "--json", "-", input=text), "EINVAL", 2)
    assert message.startswith("the result file ") and said in message, message
    assert snapshot(queue.dir) == before and queue.state(held) == "claimed"


def test_a_result_over_max_result_bytes_once_recorded_is_refused_before_any_step(
    queue: QueueCLI, child, tmp_path: Path
) -> None:
    """§2.1 (result shape), docs/queue.md "Configuration" (``max_result_bytes``: larger
    results are refused with EFBIG; a result file over it too, nothing past it read): with
    ``max_result_bytes=1000`` a result file of 1009 bytes is refused as the result file, one
    of 989 bytes as the result it makes once the queue's own fields are added, each EFBIG
    naming the setting; the job stays claimed with nothing written, and a small output then
    finishes it."""
    held = claimed_for(queue, "held", child.pid)
    add_config(queue, "max_result_bytes=1000")
    before = snapshot(queue.dir)
    over = tmp_path / "over.json"
    over.write_text(json.dumps({"a": "x" * 1000}))
    under = tmp_path / "under.json"
    under.write_text(json.dumps({"a": "x" * 980}))
    assert (over.stat().st_size, under.stat().st_size) == (1009, 989)
    file_said = refused(queue.run("finish", held, "--ok", str(over), "--json"), "EFBIG")
    assert file_said == (
        "the result file is 1009 bytes; this queue accepts at most 1000 (max_result_bytes in "
        "queue/config)"
    ), file_said
    result_said = refused(queue.run("finish", held, "--ok", str(under), "--json"), "EFBIG")
    assert result_said.startswith("result is "), result_said
    assert result_said.endswith(
        " bytes; this queue accepts at most 1000 (max_result_bytes in queue/config)"
    ), result_said
    assert snapshot(queue.dir) == before and queue.state(held) == "claimed"
    assert queue.run("finish", held, "--ok", "-", input='"small"').rc == 0
    assert queue.only_result(held)[1]["output"] == "small"


def test_a_result_file_that_is_not_utf8_is_kept_as_text_with_replacements(
    queue: QueueCLI, child
) -> None:
    """§2.4 finish help ("parsed as JSON when it is JSON, kept as text otherwise"): bytes that
    are not UTF-8 are kept as text, each undecodable byte as U+FFFD; the job is done."""
    held = claimed_for(queue, "held", child.pid)
    r = queue.run("finish", held, "--ok", "-", input=b"\xff\xfeok")
    assert (r.rc, r.out) == (0, held + "\n"), r
    state, recorded = queue.only_result(held)
    assert (state, recorded["output"]) == ("done", "\ufffd\ufffdok")


def test_an_output_naming_a_member_twice_keeps_the_last(queue: QueueCLI, child) -> None:
    """§2.4 finish help: a result file that is JSON is stored as JSON.  An output (not a
    whole result) naming a member twice is taken as a JSON reader that keeps the last one
    takes it: the job is done with that one value."""
    held = claimed_for(queue, "held", child.pid)
    r = queue.run("finish", held, "--ok", "-", input='{"a": 1, "a": 2}')
    assert r.rc == 0, r
    assert queue.only_result(held)[1]["output"] == {"a": 2}


# -------------------------------------------------------------------- claim: its options


def test_claim_pids_no_linux_process_can_have_are_usage_errors(queue: QueueCLI) -> None:
    """§2.4 ``claim --pid PID`` and docs/queue.md: a pid is 1 to 4194304 in decimal digits;
    0, one past the kernel's limit, a hexadecimal, signed or fractional spelling are usage
    errors (exit 2, EINVAL naming --pid) before anything is claimed."""
    queue.publish(name="waiting")
    before = snapshot(queue.dir)
    for pid in ("0", str(TOP_PID + 1), "0x10", "+5", "1.0"):
        said = refused(queue.run("claim", "--pid", pid, "--json"), "EINVAL", 2)
        assert said.startswith("Invalid value for '--pid': "), said
        assert snapshot(queue.dir) == before, pid


def test_claim_and_renew_for_the_highest_pid_are_made_and_said_gone(queue: QueueCLI) -> None:
    """docs/queue.md: ``--pid`` may name a process that does not exist — here 4194304, the
    highest pid Linux gives, beyond this host's pid_max: the lease names it with no start
    time and a note says its holder has exited, so recover requeues the job.  A renew naming
    the same pid is made, with the same note; recover then requeues the job."""
    if os.path.exists(f"/proc/{TOP_PID}"):
        pytest.skip(f"pid {TOP_PID} is live here")
    published = queue.publish(name="gone")
    claimed = queue.run("claim", "--pid", str(TOP_PID))
    assert (claimed.rc, claimed.out) == (0, published + "\n"), claimed
    gone = f"pid {TOP_PID} on {HOST} has exited, so its lease is already gone"
    assert [n for n in notes(claimed) if gone in n], claimed
    assert queue.lease(published)["pid"] == TOP_PID
    renewed = queue.run("renew", published, "--pid", str(TOP_PID))
    assert renewed.rc == 0 and renewed.out.startswith(f"{published} leased until "), renewed
    assert [n for n in notes(renewed) if gone in n], renewed
    assert "renewed_at" in queue.lease(published)
    recovered = queue.run("recover", "--json")
    assert [r["job"] for r in recovered.json()["requeued"]] == [published], recovered
    assert queue.state(published) == "pending"


def ttl_refusals(queue: QueueCLI, argv: tuple[str, ...]) -> None:
    """Each lease lifetime outside (0, 366 days] is a usage error (exit 2) naming --ttl, and
    the queue is as it was."""
    before = snapshot(queue.dir)
    for ttl in ("0", "-1", "nan", "inf", "1e400", f"{LONGEST_TTL}.5"):
        said = refused(queue.run(*argv, "--ttl", ttl, "--json"), "EINVAL", 2)
        assert said.startswith("Invalid value for '--ttl': "), (ttl, said)
        assert snapshot(queue.dir) == before, ttl


def lease_period(lease: dict) -> float:
    start = lease.get("renewed_at", lease["claimed_at"])
    return (rfc3339(lease["expires_at"]) - rfc3339(start)).total_seconds()


def test_claim_ttl_past_its_bounds_is_refused_and_the_longest_is_taken(
    queue: QueueCLI, child
) -> None:
    """§2.4 ``claim --ttl S``, docs/queue.md "Configuration" (a lease lasts above 0 and at
    most 366 days): 0, a negative, NaN, an infinity, 1e400 and half a second past 366 days
    are usage errors before anything is claimed; exactly 366 days is a lease of 31 622 400 s."""
    published = queue.publish(name="long")
    ttl_refusals(queue, ("claim", "--pid", str(child.pid)))
    assert queue.claim("--pid", str(child.pid), "--ttl", str(LONGEST_TTL)) == published
    assert abs(lease_period(queue.lease(published)) - LONGEST_TTL) < 0.001


def test_renew_ttl_past_its_bounds_is_refused_and_the_longest_is_taken(
    queue: QueueCLI, child
) -> None:
    """§2.4 ``renew J [--ttl S]``: the same bounds as claim; every value outside them leaves
    the lease byte for byte, and 366 days is taken."""
    held = claimed_for(queue, "held", child.pid)
    ttl_refusals(queue, ("renew", held, "--pid", str(child.pid)))
    renewed = queue.run("renew", held, "--pid", str(child.pid), "--ttl", str(LONGEST_TTL))
    assert renewed.rc == 0, renewed
    assert abs(lease_period(queue.lease(held)) - LONGEST_TTL) < 0.001


def test_a_lease_that_expires_before_the_claim_returns_names_no_job(queue: QueueCLI, child) -> None:
    """docs/queue.md "Command line": a claim whose lease expires before it returns names no
    job: ETIMEDOUT (exit 1), saying not to run it and that recover returns it to pending.
    ``--ttl 1e-300`` is above 0, so no usage error, and far shorter than any claim; plain
    recover then requeues the job (its expired lease proves its holder gone, Q-5)."""
    published = queue.publish(name="brief")
    r = queue.run("claim", "--pid", str(child.pid), "--ttl", "1e-300", "--json")
    said = refused(r, "ETIMEDOUT")
    assert said.startswith(f"job {published} was claimed, but its lease of "), said
    assert "do not run it; 'ctx queue recover --project proj' returns it to pending" in said
    assert queue.state(published) == "claimed"
    recovered = queue.run("recover", "--json")
    assert [f["job"] for f in recovered.json()["requeued"]] == [published], recovered
    assert queue.state(published) == "pending"
    empty_inbox(queue)


@pytest.mark.parametrize(
    ("worker", "said"),
    [
        ("\udcff", "a worker id must be UTF-8 text"),
        ("a\u202eb", "is not one line of printable text"),
        ("é" * 128, "is 256 bytes long; at most 255 are allowed"),
    ],
    ids=["not-utf8", "bidi-override", "256-bytes"],
)
def test_claim_worker_ids_no_lease_may_record_are_usage_errors(
    queue: QueueCLI, child, worker: str, said: str
) -> None:
    """docs/queue.md "Command line": ``--worker ID`` is one line of printable UTF-8 text, 1 to
    255 bytes; anything else — a byte that is not UTF-8 in the argument, a bidirectional
    override, 256 bytes — is EINVAL (exit 2) before a job is claimed."""
    queue.publish(name="waiting")
    before = snapshot(queue.dir)
    r = queue.run("claim", "--pid", str(child.pid), "--worker", worker, "--json")
    message = refused(r, "EINVAL", 2)
    assert message.startswith("Invalid value for '--worker': ") and said in message, message
    assert snapshot(queue.dir) == before


def test_a_claim_execd_in_its_shells_place_leases_to_itself_and_says_so(
    queue: QueueCLI,
) -> None:
    """docs/queue.md "Command line": a claim whose holder is the command's own process
    (``exec ctx queue claim --pid $$``) is made and printed, and a note says that process
    ends now and that recover will requeue the job; recover does."""
    published = queue.publish(name="own")
    r = sh(queue, "sh", f"exec {CTX} queue claim --project proj --pid $$")
    assert (r.rc, r.out) == (0, published + "\n"), r
    pid = queue.lease(published)["pid"]
    expected = (
        f"ctx: note: the lease holder is this command's own process (pid {pid}: the shell ran "
        f"it in its place), which ends now: 'ctx queue recover --project proj' will requeue "
        f"{published}; claim from a shell that goes on working on the job"
    )
    assert notes(r) == [expected], r
    assert wait_for(lambda: not alive(pid), 5)
    recovered = queue.run("recover", "--json")
    assert [f["job"] for f in recovered.json()["requeued"]] == [published], recovered


def test_a_renew_execd_by_the_claiming_shell_says_the_holder_ends_with_it(
    queue: QueueCLI,
) -> None:
    """docs/queue.md: renew extends the lease of the process that holds it, the renew itself
    when the shell ran it in its own process (``bash -c 'claim --pid $$ && exec renew'``);
    renewed, it is noted that the holder ends now, and recover then requeues the job."""
    published = queue.publish(name="own")
    script = (
        f"J=$({CTX} queue claim --project proj --pid $$) && "
        f'exec {CTX} queue renew --project proj "$J"'
    )
    r = sh(queue, "bash", script)
    assert r.rc == 0 and r.out.startswith(f"{published} leased until "), r
    lease = queue.lease(published)
    assert "renewed_at" in lease, lease
    expected = (
        f"ctx: note: the lease holder is this command's own process (pid {lease['pid']}: the "
        f"shell ran it in its place), which ends now: 'ctx queue recover --project proj' will "
        f"requeue {published}; renew from a shell that goes on working on the job"
    )
    assert notes(r) == [expected], r
    assert wait_for(lambda: not alive(lease["pid"]), 5)
    recovered = queue.run("recover", "--json")
    assert [f["job"] for f in recovered.json()["requeued"]] == [published], recovered


def test_a_claim_over_seven_finished_jobs_names_five_and_counts_the_rest(
    queue: QueueCLI, child
) -> None:
    """Q-6 and docs/queue.md "Command line": a job both pending and finished is a conflict,
    never run again; when it is all there is, claim exits 3 with nothing on stdout and one
    note naming the first five such jobs and how many more, and the ``ctx queue show`` that
    lays out each.  Nothing is moved."""
    names = [f"f{i}" for i in range(1, 8)]
    for name in names:
        queue.drop(name)
        queue.terminal(name)
    before = snapshot(queue.dir)
    r = queue.run("claim", "--pid", str(child.pid))
    assert (r.rc, r.out) == (3, ""), r
    first = ", ".join(job(name) for name in names[:5])
    assert notes(r) == [
        f"ctx: note: left pending, as J is in done/ or failed/ too, a conflict: {first} and 2 "
        "more; 'ctx queue show J --project proj' of each lists its evidence; a conflict is "
        "never resolved for you"
    ], r
    assert snapshot(queue.dir) == before


def test_a_claim_over_entries_that_are_no_jobs_finds_nothing_and_moves_nothing(
    queue: QueueCLI, child
) -> None:
    """Q-8: a directory, a symlink, a dot-file and an illegal name in ``pending/`` are not
    jobs: never followed or moved.  A claim finds nothing (exit 3, nothing on stdout, no note
    about jobs passed over) and the queue is as it was."""
    pending = queue.dir / "pending"
    (pending / job("dir")).mkdir()
    (pending / job("link")).symlink_to("/etc/passwd")
    (pending / ".hidden.req.json").write_text(GOOD)
    (pending / "no-suffix").write_text(GOOD)
    before = snapshot(queue.dir)
    r = queue.run("claim", "--pid", str(child.pid), "--json")
    assert (r.rc, r.out, notes(r)) == (3, "", []), r
    assert snapshot(queue.dir) == before


# ------------------------------------------------------------------------------ renew


def test_renew_by_another_process_is_refused_and_says_how_to_name_the_holder(
    queue: QueueCLI, child
) -> None:
    """§2.4 ``renew`` extends the caller's own lease (EACCES when another process holds it):
    refused, it names the holder; without ``--pid`` it adds how a subshell names the claiming
    shell (``--pid $$``), with ``--pid`` it does not.  The lease is byte for byte as it was."""
    held = claimed_for(queue, "held", child.pid)
    lease = queue.dir / "lease" / held / "worker"
    before = lease.read_bytes()
    plain = refused(queue.run("renew", held, "--json"), "EACCES")
    assert plain.startswith(f"job {held} is leased to pid {child.pid} on {HOST} "), plain
    assert "only the holder renews its lease" in plain, plain
    assert plain.endswith("name the holder with --pid (in the claiming shell: --pid $$)"), plain
    named = refused(queue.run("renew", held, "--pid", "1", "--json"), "EACCES")
    assert named.endswith("not to pid 1; only the holder renews its lease"), named
    assert lease.read_bytes() == before


# ----------------------------------------------------------------------- names and R-3


def test_job_names_one_byte_past_r3_are_usage_errors_for_every_command(
    queue: QueueCLI, child
) -> None:
    """R-3 (1 to 64 bytes) and §2.4 (``--name J`` may be given without the suffix, which is
    then added): a name of 56 bytes is 65 with ``.req.json``, and so is the same name given
    with its suffix; ``publish --name``, ``show``, ``renew`` and ``finish`` refuse both as a
    usage error (exit 2, EINVAL) saying how long it is, and nothing changes."""
    claimed_for(queue, "held", child.pid)
    before = snapshot(queue.dir)
    for name, size in (("x" * 56, "is 56 bytes long, 65 with the '.req.json' suffix added"),
                       ("x" * 56 + SUFFIX, "is 65 bytes long")):  # fmt: skip
        for argv in (
            ("publish", "--name", name, "-"),
            ("show", name),
            ("renew", name, "--pid", str(child.pid)),
            ("finish", name, "--ok", "-"),
        ):
            said = refused(queue.run(*argv, "--json", input=GOOD), "EINVAL", 2)
            assert said.startswith("illegal job name: ") and size in said, (argv, said)
    assert snapshot(queue.dir) == before


def test_the_longest_job_name_lives_its_whole_life(queue: QueueCLI, child) -> None:
    """R-3: a base name of 55 bytes makes a job name of exactly 64 with ``.req.json``; it is
    published (its staging name is longer still), claimed, renewed, shown and finished, and
    its terminal pair is ``done/J`` and ``done/J.result``."""
    name = "y" * 55
    published = queue.publish(name=name)
    assert published == name + SUFFIX and len(published) == 64
    assert queue.claim("--pid", str(child.pid)) == published
    assert queue.run("renew", name, "--pid", str(child.pid)).rc == 0
    shown = queue.run("show", published, "--json")
    assert shown.rc == 0 and shown.json()["state"] == "claimed", shown
    queue.finish(published)
    assert queue.only_result(published)[0] == "done"
    queue.assert_settled()


# ---------------------------------------------------------------------------- the config


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("max_request_bytes=100 # a note", "max_request_bytes must be a positive integer"),
        ("MAX_REQUEST_BYTES=100", "unknown key 'MAX_REQUEST_BYTES'"),
        ("lease_ttl=1e999", "lease_ttl must be a number of seconds above 0"),
    ],
    ids=["comment-after-value", "key-in-capitals", "ttl-infinite"],
)
def test_a_config_line_no_rule_takes_stops_publish_claim_and_finish(
    queue: QueueCLI, child, line: str, said: str
) -> None:
    """docs/queue.md "Configuration": ``queue/config`` is ``key=value`` lines, ``#`` comments
    on lines of their own; an unknown key or a value its rule refuses is EINVAL naming the
    file and line.  Every command that opens the queue refuses it (exit 1) before it changes
    anything: publish, claim and finish alike."""
    held = claimed_for(queue, "held", child.pid)
    queue.publish(name="waiting")
    number = add_config(queue, line)
    before = snapshot(queue.dir)
    for argv in (
        ("publish", "--name", "more", "-"),
        ("claim", "--pid", str(child.pid)),
        ("finish", held, "--ok", "-"),
    ):
        message = refused(queue.run(*argv, "--json", input=GOOD), "EINVAL")
        assert message.startswith(f"{queue.dir}/config:{number}: ") and said in message, message
    assert snapshot(queue.dir) == before


# -------------------------------------------------------- a second real user of the space

SPACE = "space"
MEMBER, GROUP = "ctxpcf-m", "ctxpcf-g"


@dataclass
class Space:
    """A project space made by root for group GROUP, its queue, and MEMBER, a real user of
    that group."""

    queue: QueueCLI
    member: UnprivilegedUser

    def as_member(self, *args: str, stdin: str = "") -> Run:
        argv = [CTX, "queue", args[0], "--project", SPACE, *args[1:]]
        env = clean_env(CTX_STORAGE=str(self.queue.storage), HOME="/nonexistent")
        proc = subprocess.run(
            argv,
            input=stdin.encode(),
            capture_output=True,
            env=env,
            cwd="/",
            user=self.member.uid,
            group=self.member.gid,
            extra_groups=self.member.groups,
            timeout=60,
        )
        return Run(argv[1:], proc.returncode, proc.stdout.decode(), proc.stderr.decode())


@pytest.fixture
def space(searchable_storage: Path) -> Iterator[Space]:
    if not AS_ROOT:
        pytest.skip("needs root to act as a second user")
    (member,), _ = members_of(GROUP, MEMBER)
    made = ctx_run("shared", "create", SPACE, "--group", GROUP, "--storage", searchable_storage)
    assert made.rc == 0, made
    queue = QueueCLI(searchable_storage, SPACE)
    assert (queue.dir / "pending").is_dir()
    yield Space(queue, member)
    for state in ("inbox", "pending", "lease", "claimed", "done", "failed"):
        (queue.dir / state).chmod(0o2770)


@needs_root
def test_a_members_publish_refused_by_pending_leaves_no_staging_file(space: Space) -> None:
    """docs/queue.md "A queue shared by a group": a user who may write only part of a queue is
    refused with EACCES naming the directory that refused, its owner, group and mode (exit 1),
    and nothing is left half-done: ``publish`` undoes what it did, no temp file stays in
    ``inbox/``, and it says "nothing was published" — for one request and for a batch."""
    q, pending = space.queue, space.queue.dir / "pending"
    pending.chmod(0o2750)
    before = snapshot(q.dir)
    attempts = [
        (("publish", "--name", "mine"), GOOD),
        (("publish", "--batch"), f"{GOOD}\n{GOOD}\n"),
    ]
    for argv, given in attempts:
        said = refused(space.as_member(*argv, "--json", "-", stdin=given), "EACCES")
        assert f"uid {space.member.uid} may not write in {pending} (owner uid 0, " in said, said
        assert "mode 2750" in said and said.endswith("; nothing was published"), said
        assert snapshot(q.dir) == before


@needs_root
def test_a_members_claim_refused_at_its_lease_puts_the_job_back_first(space: Space, child) -> None:
    """docs/queue.md "A queue shared by a group": a claim refused after its move (no right to
    write ``lease/``) puts the job back in ``pending/``, first in line, says "nothing was
    claimed (job J stays pending)", and leaves no claim directory, lease or temp file; the
    next claim takes that job."""
    q = space.queue
    first, second = q.publish(name="a"), q.publish(name="b")
    lease = q.dir / "lease"
    lease.chmod(0o2750)
    before = snapshot(q.dir)
    said = refused(space.as_member("claim", "--pid", str(child.pid), "--json"), "EACCES")
    assert f"may not write in {lease} (owner uid 0, " in said, said
    assert said.endswith(f"; nothing was claimed (job {first} stays pending)"), said
    assert snapshot(q.dir) == before
    assert q.entries("claimed") == q.entries("lease") == q.entries("inbox") == set()
    lease.chmod(0o2770)
    assert q.claim("--pid", str(child.pid)) == first
    assert q.state(second) == "pending"


@needs_root
def test_a_members_finish_refused_by_done_writes_nothing_then_finishes(space: Space, child) -> None:
    """docs/queue.md "A queue shared by a group": finish cannot undo a result once in place,
    so it checks every directory it changes first: a ``done/`` the member may not write is
    EACCES naming it, "job J stays claimed and no result of it was written", nothing moved.
    Once ``done/`` is the group's again the member finishes it, and the result records the
    claim's holder."""
    q = space.queue
    published = q.publish(name="job")
    claimed = space.as_member("claim", "--pid", str(child.pid), "--worker", "member-shell")
    assert (claimed.rc, claimed.out) == (0, published + "\n"), claimed
    done = q.dir / "done"
    done.chmod(0o2750)
    before = snapshot(q.dir)
    said = refused(space.as_member("finish", published, "--ok", "--json", "-", stdin='"x"'),
                   "EACCES")  # fmt: skip
    assert f"may not write in {done} (owner uid 0, " in said, said
    assert said.endswith(f"; job {published} stays claimed and no result of it was written")
    assert snapshot(q.dir) == before
    done.chmod(0o2770)
    finished = space.as_member("finish", published, "--ok", "-", stdin='"x"')
    assert (finished.rc, finished.out) == (0, published + "\n"), finished
    state, recorded = q.only_result(published)
    assert (state, recorded["worker"]["id"], recorded["output"]) == ("done", "member-shell", "x")


@needs_root
def test_a_members_claim_passes_over_a_request_it_may_not_read(space: Space, child) -> None:
    """docs/queue.md "A queue shared by a group": a pending request the claimer may not read
    stays in ``pending/`` for one who may, and when none is left the claim exits 3 with a
    note naming the jobs it may not read; the request is back byte for byte, and root claims
    it."""
    q = space.queue
    published = q.publish(name="private")
    (q.dir / "pending" / published).chmod(0o600)
    before = snapshot(q.dir)
    r = space.as_member("claim", "--pid", str(child.pid))
    assert (r.rc, r.out) == (3, ""), r
    assert notes(r) == [
        f"ctx: note: left pending, since uid {space.member.uid} may not read their request: "
        f"{published}; a member who may read them claims them"
    ], r
    assert snapshot(q.dir) == before
    assert q.claim("--pid", str(child.pid)) == published


# -------------------------------------------------- the queue changed while a command reads


def started_reading(queue: QueueCLI, argv: list[str]) -> subprocess.Popen:
    """``ctx queue ARGV`` reading its input from a pipe, once it holds the queue open."""
    proc = subprocess.Popen(
        [CTX, "queue", argv[0], "--project", queue.project, *argv[1:]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
    )
    # failed/ is the last state directory opening the queue opens.
    if not wait_for(lambda: has_open(proc.pid, queue.dir / "failed"), 20):
        proc.kill()
        proc.communicate()
        pytest.fail(f"ctx queue {argv[0]} never opened the queue")
    return proc


def ended(proc: subprocess.Popen, rest: bytes) -> Run:
    out, err = proc.communicate(rest, timeout=60)
    return Run([str(a) for a in proc.args][1:], proc.returncode, out.decode(), err.decode())


def test_a_publish_whose_queue_is_made_anew_while_it_reads_publishes_nothing(
    queue: QueueCLI,
) -> None:
    """§2.4 and docs/queue.md "A queue shared by a group" (a refused step names the directory
    that refused, says what was not done and what to do): a publish that opened the queue and
    is still reading its request when the queue is removed and made again by ``ctx queue
    init`` stages nothing in either: ENOENT naming ``inbox/``, "nothing was published" (exit
    1); the new queue holds nothing of it, and the same publish run again is published
    there."""
    proc = started_reading(queue, ["publish", "--name", "late", "--json", "-"])
    try:
        shutil.rmtree(queue.dir)
        assert queue.run("init").rc == 0
    finally:
        r = ended(proc, GOOD.encode())
    said = refused(r, "ENOENT")
    assert said.startswith(f"cannot publish in queue {queue.dir}: {queue.dir}/inbox refused: ")
    assert "; nothing was published: " in said and said.endswith("then publish again"), said
    for state in ("inbox", "pending", "claimed", "lease", "done", "failed"):
        assert queue.entries(state) == set(), state
    assert queue.publish(name="late") == job("late")


def test_a_finish_whose_job_is_requeued_while_it_reads_writes_nothing(queue: QueueCLI) -> None:
    """docs/queue.md "Command line": finish of a job that is not claimed says where it is
    (pending: claim it first, and why it may be pending again: recover requeued it once its
    holder was gone).  A finish still reading its result when its holder dies and recover
    requeues the job is refused so (ENOENT, exit 1): no result anywhere, nothing in
    ``inbox/``, the job pending once."""
    holder = subprocess.Popen(["sleep", "600"])
    try:
        held = claimed_for(queue, "held", holder.pid)
        proc = started_reading(queue, ["finish", held, "--ok", "--json", "-"])
    finally:
        holder.kill()
        holder.wait()
    try:
        recovered = queue.run("recover", "--json")
    finally:
        r = ended(proc, b'{"late": true}')
    assert [f["job"] for f in recovered.json()["requeued"]] == [held], recovered
    said = refused(r, "ENOENT")
    assert said.startswith(f"job {held} is pending, not claimed: "), said
    assert "'ctx queue recover --project proj' returned it to pending" in said, said
    assert "claim it before finishing it" in said, said
    assert queue.state(held) == "pending"
    assert queue.entries("done") == queue.entries("failed") == set()
    empty_inbox(queue)
