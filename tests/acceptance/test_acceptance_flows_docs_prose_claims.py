"""The prose of docs/queue.md, docs/workers.md, docs/sessions.md and README.md taken at its
word: the numbers, exit statuses, errnos, message fragments, modes, ``--json`` fields and
what is left on disk that those pages state in sentences (their code examples are the
subject of the ``doc_examples`` flows).  Each test quotes the sentence it checks and runs the
real ``ctx`` on a storage root of its own.

SPEC ids covered: R-3, Q-1, Q-2, Q-3, Q-4, Q-5, Q-6, Q-8, Q-9, Q-10, §2.1 (request and
result shape, size limit), §2.4 (exit statuses, ``--json``), W-1, W-2, S-1, S-5, X-1."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    wait_for,
)
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
SIMPLE = '{"tool": "x", "input": {}}'
ONE_YEAR_AND_A_DAY = 31_622_400

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acts as other uids: needs root")


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def queue(storage: Path) -> QueueCLI:
    """Project ``proj``'s queue in a fresh bootstrapped root (conftest)."""
    return QueueCLI(storage, "proj")


@pytest.fixture
def scratch() -> Iterator[Path]:
    made = new_scratch_dir(SCRATCH)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def holder() -> Iterator[subprocess.Popen]:
    """A live process that a lease may name (``--pid``)."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


def sized_request(size: int) -> str:
    """A request object of exactly ``size`` bytes."""
    head, tail = '{"tool": "x", "input": {"p": "', '"}}'
    text = head + "y" * (size - len(head) - len(tail)) + tail
    assert len(text) == size
    return text


def publish_text(queue: QueueCLI, text: str, name: str):
    return queue.run("publish", "--name", name, "-", input=text)


def config_line(queue: QueueCLI, line: str) -> None:
    with (queue.dir / "config").open("a") as config:
        config.write(line + "\n")


def hand_claim(queue: QueueCLI, job: str, lease: dict) -> None:
    """A claimed job as another tool would leave it: ``claimed/J/J`` and ``lease/J/worker``."""
    (queue.dir / "claimed" / job).mkdir()
    (queue.dir / "claimed" / job / job).write_text(SIMPLE)
    (queue.dir / "lease" / job).mkdir()
    (queue.dir / "lease" / job / "worker").write_text(json.dumps(lease))


def mode(path: Path) -> int:
    return os.lstat(path).st_mode & 0o7777


def when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


# ----------------------------------------------------------- docs/queue.md: the request


def test_a_request_may_nest_128_levels_and_hold_integers_of_4300_digits(queue: QueueCLI):
    """docs/queue.md: "So is one nested more than 128 arrays or objects deep, or holding an
    integer of more than 4 300 digits" (refused with ``EINVAL``); just within both limits
    is published.  "NaN, Infinity and -Infinity … are refused with EINVAL …, and so is a
    number beyond the largest float (1e999)", and a name given twice in one object."""

    def nested(levels: int) -> str:  # the request object itself is level 1
        inner = '{"a": ' * (levels - 1) + "1" + "}" * (levels - 1)
        return '{"tool": "x", "input": ' + inner + "}"

    def digits(n: int) -> str:
        return '{"tool": "x", "input": {"n": ' + "9" * n + "}}"

    for text, name in ((nested(128), "deep"), (digits(4300), "long")):
        r = publish_text(queue, text, name)
        assert (r.rc, r.out) == (0, f"{name}.req.json\n"), r
    refused = {
        "deeper": (nested(129), "nested deeper than 128 levels"),
        "longer": (digits(4301), "more than 4300 digits"),
        "nan": ('{"tool": "x", "input": {"n": NaN}}', "NaN"),
        "inf": ('{"tool": "x", "input": {"n": -Infinity}}', "Infinity"),
        "huge": ('{"tool": "x", "input": {"n": 1e999}}', "1e999"),
        "twice": ('{"tool": "a", "input": {}, "tool": "b"}', "'tool' twice"),
    }
    for name, (text, said) in refused.items():
        r = publish_text(queue, text, name)
        assert r.rc == 1 and r.out == "", r
        assert r.err.startswith("ctx: EINVAL: ") and said in r.err, r
    assert queue.entries("pending") == {"deep.req.json", "long.req.json"}
    assert queue.entries("inbox") == set()


def test_the_stored_request_is_the_given_bytes_with_from_and_created_put_first(
    queue: QueueCLI,
):
    """docs/queue.md: "What is stored is that same request: the given bytes as they are
    (surrounding whitespace trimmed, and one newline after them), with only the from and
    created the publisher left out put in front as the object's first members"; "a created
    given must be an RFC 3339 timestamp with a zone, kept as written"."""
    given = '{"tool":"x",  "input":{"k":[1,2]}}'
    r = publish_text(queue, f"  \n\t{given}  \n\n", "plain")
    assert r.rc == 0, r
    stored = (queue.dir / "pending" / "plain.req.json").read_text()
    front = json.loads(stored)
    assert list(front)[:2] == ["from", "created"] and front["from"] == "root", front
    put_first = f'{{"from":"root","created":"{front["created"]}",'
    assert stored == put_first + given[1:] + "\n", stored
    when(front["created"])

    written = '{"created": "2026-01-01t00:00:00.5+02:00", "tool": "x", "input": {}}'
    r = publish_text(queue, written, "dated")
    assert r.rc == 0, r
    stored = (queue.dir / "pending" / "dated.req.json").read_text()
    assert stored == '{"from":"root",' + written[1:] + "\n", stored

    r = publish_text(queue, '{"created": "2026-01-01T00:00:00", "tool": "x", "input": {}}', "nz")
    assert r.rc == 1 and "EINVAL" in r.err and "time zone" in r.err, r
    assert queue.entries("pending") == {"plain.req.json", "dated.req.json"}


def test_a_request_of_exactly_the_limit_is_taken_and_one_byte_more_is_efbig(queue: QueueCLI):
    """docs/queue.md: "A request of exactly the limit is accepted.  Nothing past the limit is
    read: a source that does not end … is refused with EFBIG (a batch: EINVAL naming the
    line)"; "A key given again counts from there on, so a line appended to the config init
    wrote … overrides it"."""
    config_line(queue, "max_request_bytes=100")
    assert publish_text(queue, sized_request(100), "at").rc == 0
    r = publish_text(queue, sized_request(101), "over")
    assert r.rc == 1 and r.err.startswith("ctx: EFBIG: "), r
    assert "more than 100 bytes" in r.err and "at most 100" in r.err, r
    batch = SIMPLE + "\n" + sized_request(101) + "\n"
    r = queue.run("publish", "--batch", "-", input=batch)
    assert r.rc == 1 and r.out == "" and r.err.startswith("ctx: EINVAL: "), r
    assert "line 2" in r.err and "nothing published" in r.err, r
    r = queue.run("publish", "-", input=b"\0" * 200_000)
    assert r.rc == 1 and r.err.startswith("ctx: EFBIG: "), r
    assert queue.entries("pending") == {"at.req.json"} and queue.entries("inbox") == set()


def test_readers_allow_a_stored_request_up_to_the_limit_plus_64_kib(queue: QueueCLI):
    """docs/queue.md: "Readers allow a stored request up to the limit plus 64 KiB, room for
    those two fields"; one put in pending/ by hand beyond it is claimed as a malformed
    request with the note "the request of J is not valid (REASON): finish it with --error,
    as a worker does"."""
    config_line(queue, "max_request_bytes=100")
    (queue.dir / "pending" / "fits.req.json").write_text(sized_request(100 + 65536))
    (queue.dir / "pending" / "over.req.json").write_text(sized_request(100 + 65537))
    os.utime(queue.dir / "pending" / "fits.req.json", (1e9, 1e9))
    os.utime(queue.dir / "pending" / "over.req.json", (1e9 + 1, 1e9 + 1))
    r = queue.run("claim", "--json", "--pid", "1")
    assert r.rc == 0 and r.err == "", r
    assert r.json()["name"] == "fits.req.json" and r.json()["request"]["tool"] == "x", r
    r = queue.run("claim", "--json", "--pid", "1")
    assert r.rc == 0 and r.json()["name"] == "over.req.json", r
    got = r.json()["request"]
    assert (got["tool"], got["input"]) == (None, {}) and "size limit" in got["invalid"], got
    assert r.err.startswith("ctx: note: the request of over.req.json is not valid ("), r
    assert r.err.rstrip().endswith("finish it with --error, as a worker does"), r


def test_a_field_of_its_own_named_invalid_makes_no_malformed_job(queue: QueueCLI):
    """docs/queue.md: "A request published with a field of its own named invalid is no such
    job: claim --json gives it as stored, claim adds no note"; a hand-placed request that is
    not JSON is given as ``{"tool": null, "input": {}, "invalid": "<the reason>"}``."""
    (queue.dir / "pending" / "broken.req.json").write_text("not json")
    os.utime(queue.dir / "pending" / "broken.req.json", (1e9, 1e9))
    queue.publish({"tool": "x", "input": {}, "invalid": "mine"}, name="own")
    r = queue.run("claim", "--json", "--pid", "1")
    assert r.rc == 0 and r.json()["name"] == "broken.req.json", r
    assert set(r.json()["request"]) == {"tool", "input", "invalid"}, r
    assert r.json()["request"]["tool"] is None and "not valid" in r.err, r
    r = queue.run("claim", "--json", "--pid", "1")
    assert r.rc == 0 and r.err == "", r
    assert r.json()["request"]["invalid"] == "mine" and r.json()["request"]["tool"] == "x", r


# ------------------------------------------------------------ docs/queue.md: the config


def test_the_config_is_at_most_64_kib_and_an_unknown_key_is_named_with_its_line(
    queue: QueueCLI,
):
    """docs/queue.md: "it may be at most 64 KiB: a larger one is refused with EFBIG (its size
    and the limit named)"; "unknown keys are refused with EINVAL and the line number"; and
    "a config that cannot be read is never replaced by the defaults"."""
    config = queue.dir / "config"
    original = config.read_text()
    config.write_text(original + "#" * (65536 - len(original) - 1) + "\n")
    assert config.stat().st_size == 65536
    assert queue.run("status").rc == 0
    config.write_text(original + "#" * (65536 - len(original)) + "\n")
    r = queue.run("status")
    assert r.rc == 1 and r.err.startswith(f"ctx: EFBIG: {config} is 65537 bytes"), r
    assert "65536" in r.err.split("bytes", 1)[1], r
    assert config.stat().st_size == 65537  # not replaced by the defaults

    lines = original.splitlines()
    config.write_text(original + "bogus=1\n")
    r = queue.run("status")
    assert r.rc == 1 and r.err.startswith(f"ctx: EINVAL: {config}:{len(lines) + 1}: "), r
    assert "'bogus'" in r.err, r


def test_lease_ttl_and_grace_stop_at_366_days(queue: QueueCLI):
    """docs/queue.md's table: ``lease_ttl`` "above 0, at most 366 days"; ``grace`` "at most
    31 622 400, 366 days, as for recover --grace"."""
    config = queue.dir / "config"
    original = config.read_text()
    for line, good in (
        ("lease_ttl=0", False),
        (f"lease_ttl={ONE_YEAR_AND_A_DAY}", True),
        (f"lease_ttl={ONE_YEAR_AND_A_DAY + 1}", False),
        ("grace=0", True),
        (f"grace={ONE_YEAR_AND_A_DAY}", True),
        (f"grace={ONE_YEAR_AND_A_DAY + 1}", False),
    ):
        config.write_text(original + line + "\n")
        r = queue.run("status")
        assert r.rc == (0 if good else 1), (line, r)
        if not good:
            assert r.err.startswith("ctx: EINVAL: ") and line.split("=")[0] in r.err, r
    config.write_text(original)
    assert queue.run("recover", "--grace", str(ONE_YEAR_AND_A_DAY)).rc == 0
    r = queue.run("recover", "--grace", str(ONE_YEAR_AND_A_DAY + 1))
    assert r.rc == 2 and "EINVAL" in r.err, r


# ------------------------------------------------------------- docs/queue.md: claiming


def test_an_unclaimable_queue_names_the_first_five_jobs_and_how_many_more(queue: QueueCLI):
    """docs/queue.md: "When jobs are pending but none could be claimed, the exit 3 comes with
    a ctx: note: on stderr for each reason, naming the jobs (the first five, and how many
    more)"; "A ctx queue … command that a … note … suggests names the queue as the command
    was told it, --storage, --project or --queue … What $CTX_STORAGE and $CTX_PROJECT said
    is left out."""
    for n in range(1, 8):
        job = queue.publish(json.loads(SIMPLE), name=f"j{n}")
        (queue.dir / "claimed" / job).mkdir()
    queue.publish(json.loads(SIMPLE), name="l1")
    (queue.dir / "lease" / "l1.req.json").mkdir()

    r = ctx_run("queue", "claim", "--storage", queue.storage, "--project", "proj", env=clean_env())
    assert (r.rc, r.out) == (3, ""), r
    notes = r.err.splitlines()
    assert len(notes) == 2 and all(n.startswith("ctx: note: ") for n in notes), r
    first = next(n for n in notes if "claimed/J there already" in n)
    named = ", ".join(f"j{n}.req.json" for n in range(1, 6))
    assert f"{named} and 2 more" in first and "j6.req.json" not in first, first
    assert f"'ctx queue recover --reconcile --storage {queue.storage} --project proj'" in first
    assert "l1.req.json" in next(n for n in notes if "lease/J and no claim" in n)

    r = ctx_run("queue", "claim", "--json", env=clean_env(CTX_STORAGE=str(queue.storage),
                                                         CTX_PROJECT="proj"))  # fmt: skip
    assert (r.rc, r.out) == (3, ""), r
    assert "'ctx queue recover --reconcile'" in r.err and "--storage" not in r.err, r
    assert queue.entries("pending") == {f"j{n}.req.json" for n in range(1, 8)} | {"l1.req.json"}


def test_a_claim_whose_reader_left_names_the_holder_and_exits_141(queue: QueueCLI):
    """docs/queue.md: "A closed output pipe … ends the command quietly, with exit 141 …; only
    claim says a word first, on stderr, since its job stays leased to a process that never
    learnt its name: ctx: note: the reader of standard output left before it read the job's
    name: job J is claimed and leased to pid P (…)"."""
    job = queue.publish(json.loads(SIMPLE), name="orphan")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [*CTX_ARGV, "queue", "claim", "--project", "proj", "--pid", "1"],
            stdin=subprocess.DEVNULL, stdout=write_end, stderr=subprocess.PIPE,
            env=clean_env(CTX_STORAGE=str(queue.storage)), timeout=60,
        )  # fmt: skip
    finally:
        os.close(write_end)
    err = done.stderr.decode()
    assert done.returncode == 141, err
    assert err.startswith(
        "ctx: note: the reader of standard output left before it read the job's name: "
        f"job {job} is claimed and leased to pid 1 ("
    ), err
    assert queue.state(job) == "claimed"


@needs_root
def test_a_ctx_entered_into_a_pid_namespace_is_asked_for_pid(queue: QueueCLI):
    """docs/queue.md: "A ctx entered into a container's pid namespace (nsenter, docker exec)
    has a parent outside it, which no lease can name: claim and renew then ask for --pid
    (exit 2)"; nothing is claimed."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        pytest.skip("needs unshare and nsenter")
    job = queue.publish(json.loads(SIMPLE), name="inside")
    outer = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sleep", "600"]
    )
    inner = None
    try:
        children = Path(f"/proc/{outer.pid}/task/{outer.pid}/children")
        if not wait_for(lambda: children.exists() and children.read_text().strip(), 10):
            pytest.skip("unshare --pid could not start a namespace here")
        inner = int(children.read_text().split()[0])
        for verb in (["claim"], ["renew", job]):
            done = subprocess.run(
                ["nsenter", "-t", str(inner), "--pid", "--mount", *CTX_ARGV, "queue", *verb,
                 "--project", "proj"],
                env=clean_env(CTX_STORAGE=str(queue.storage)), capture_output=True, text=True,
                timeout=60,
            )  # fmt: skip
            assert done.returncode == 2, done
            assert "--pid" in done.stderr and "pid namespace" in done.stderr, done
        assert queue.state(job) == "pending" and queue.entries("claimed") == set()
    finally:
        if inner is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(inner, signal.SIGKILL)
        outer.kill()
        outer.wait()


def test_renew_defaults_to_the_claims_own_lifetime_and_only_for_its_holder(
    queue: QueueCLI, holder: subprocess.Popen
):
    """docs/queue.md: "renew extends the caller's own lease: to --ttl S seconds from now, by
    default for as long again as it was taken or last renewed for (claim --ttl 1000, then
    renew: 1000 s more, never the shorter lease_ttl)"; the lease names its holder with
    ``worker, host, machine_id, boot_id, pid_ns, pid, create_time, boot_time, claimed_at,
    expires_at``
    (and ``job``, and ``renewed_at`` after a renewal); "renew rewrites it … only for the
    process that holds it"."""
    job = queue.publish(json.loads(SIMPLE), name="long")
    pid = str(holder.pid)
    assert queue.run("claim", "--pid", pid, "--ttl", "1000").rc == 0
    lease = queue.lease(job)
    assert set(lease) == {"job", "worker", "host", "machine_id", "boot_id", "pid_ns", "pid",
                          "create_time", "boot_time", "claimed_at",
                          "expires_at"}, lease  # fmt: skip
    assert (when(lease["expires_at"]) - when(lease["claimed_at"])).total_seconds() == 1000

    r = queue.run("renew", job)  # from this process, which does not hold it
    assert r.rc == 1 and r.err.startswith("ctx: EACCES: ") and pid in r.err, r
    assert queue.lease(job) == lease

    assert queue.run("renew", job, "--pid", pid, "--ttl", "5").rc == 0
    assert queue.run("renew", job, "--pid", pid).rc == 0
    renewed = queue.lease(job)
    span = when(renewed["expires_at"]) - when(renewed["renewed_at"])
    assert span.total_seconds() == 5, renewed  # as long again as last renewed for
    assert renewed["claimed_at"] == lease["claimed_at"]


def test_a_worker_id_is_counted_in_bytes_and_refused_before_a_claim(queue: QueueCLI):
    """docs/queue.md: "--worker ID (of claim and ctx queue work) is the id the lease and the
    result record: one line of printable UTF-8 text, 1 to 255 bytes, no control characters;
    anything else is EINVAL (exit 2) before a job is claimed"."""
    job = queue.publish(json.loads(SIMPLE), name="who")
    for bad in ("", "\u00e9" * 128, "a\tb", "\u2028", "x" * 256):
        r = queue.run("claim", "--pid", "1", "--worker", bad)
        assert r.rc == 2 and "EINVAL" in r.err, (bad, r)
        assert queue.state(job) == "pending" and queue.entries("claimed") == set()
    fits = "\u00e9" * 127  # 254 bytes
    assert queue.run("claim", "--pid", "1", "--worker", fits).rc == 0
    assert queue.lease(job)["worker"] == fits


# ------------------------------------------------------------- docs/queue.md: finishing


def test_a_whole_result_object_gives_its_output_and_the_queue_records_the_rest(
    queue: QueueCLI, holder: subprocess.Popen
):
    """docs/queue.md: "A whole result object in the shape of SPEC §2.1 … gives its output,
    and its status must agree with --ok/--error (else EINVAL, exit 2); what the result
    records besides is the queue's own: worker is the lease's holder (the claim's --worker
    id, host, pid), started the lease's claimed_at, finished the time of the finish"."""
    job = queue.publish(json.loads(SIMPLE), name="whole")
    assert queue.run("claim", "--pid", str(holder.pid), "--worker", "builder-7").rc == 0
    lease = queue.lease(job)
    theirs = {"status": "error", "output": 1}
    r = queue.run("finish", job, "--ok", "-", input=json.dumps(theirs))
    assert r.rc == 2 and r.err.startswith("ctx: EINVAL: "), r
    assert queue.state(job) == "claimed"
    given = {"status": "ok", "output": [7], "worker": "me", "started": "then", "finished": "x"}
    r = queue.run("finish", job, "--ok", "-", input=json.dumps(given))
    assert r.rc == 0, r
    state, stored = queue.only_result(job)
    assert state == "done" and stored["output"] == [7], stored
    worker = stored["worker"]
    assert (worker["id"], worker["host"], worker["pid"]) == ("builder-7", lease["host"],
                                                             holder.pid), stored  # fmt: skip
    assert stored["started"] == lease["claimed_at"] and stored["finished"] != "x", stored


def test_a_finish_cut_short_after_its_result_completes_with_the_same_outcome_only(
    queue: QueueCLI, holder: subprocess.Popen
):
    """docs/queue.md, finish step 1: "a finish of this claim cut short after step 2 …, asked
    for again with the same outcome and output, is completed instead …  A result is this
    claim's when it names the lease's holder as its worker …  Another outcome or output is
    refused, and the refusal says that finishing again with the outcome in place completes
    it"; it also says when recover would: "once its lease holder (pid N on H) has exited or
    its lease has expired (at T)"."""
    job = queue.publish(json.loads(SIMPLE), name="cut")
    assert queue.run("claim", "--pid", str(holder.pid)).rc == 0
    lease = queue.lease(job)
    worker = {"id": lease["worker"], "host": lease["host"], "pid": lease["pid"],
              "boot_id": lease["boot_id"], "pid_ns": lease["pid_ns"]}  # fmt: skip
    recorded = {"status": "ok", "output": 1, "worker": worker, "started": lease["claimed_at"],
                "finished": "2026-01-01T00:00:00Z"}  # fmt: skip
    (queue.dir / "done" / f"{job}.result").write_text(json.dumps(recorded))
    for flag, output in (("--error", "1"), ("--ok", "2")):
        r = queue.run("finish", job, flag, "-", input=output)
        assert r.rc == 1 and r.err.startswith("ctx: EEXIST: "), r
        assert "finishing it again in done/ with the output recorded there completes it" in r.err
        holder_is = f"once its lease holder (pid {holder.pid} on {lease['host']}) has exited"
        assert holder_is in r.err and f"(at {lease['expires_at']})" in r.err, r
        assert queue.entries("claimed") == {job} and not (queue.dir / "done" / job).exists()
    r = queue.run("finish", job, "--ok", "-", input="1")
    assert r.rc == 0, r
    assert queue.only_result(job) == ("done", recorded)


def test_a_result_beside_a_claim_is_judged_against_max_result_bytes_at_least_1_mib(
    queue: QueueCLI,
):
    """docs/queue.md: "a result beside a claimed request that is larger than any finish writes
    (max_result_bytes, at least 1 MiB) … is a conflict"; one within that size is an
    interrupted finish that ``--reconcile`` rolls forward."""
    config_line(queue, "max_result_bytes=100")
    for name, size in (("small", 500), ("mib", 1 << 20), ("over", (1 << 20) + 1)):
        job = f"{name}.req.json"
        (queue.dir / "claimed" / job).mkdir()
        (queue.dir / "claimed" / job / job).write_text(SIMPLE)
        head, tail = '{"status": "ok", "output": "', '"}'
        text = head + "z" * (size - len(head) - len(tail)) + tail
        (queue.dir / "done" / f"{job}.result").write_text(text)
    r = queue.run("recover", "--dry-run", "--json")
    assert r.rc == 1, r
    report = r.json()
    assert {e["job"] for e in report["incomplete"]} == {"small.req.json", "mib.req.json"}, report
    assert [e["job"] for e in report["conflicts"]] == ["over.req.json"], report


# ------------------------------------------------------------ docs/queue.md: liveness


def test_a_lease_written_by_another_tool_is_judged_as_q3_defines_it(
    queue: QueueCLI, holder: subprocess.Popen
):
    """docs/queue.md: "a lease is read as Q-3 defines it, so that one written by another tool
    or by hand is judged": the start time called ``start_time``; times "RFC 3339 with or
    without a zone (…a lower-case t or z, and a leap second …:60, are taken), or seconds
    since the epoch; either names an instant of the years 1 to 9999, else the lease is
    unreadable (a conflict)"; "pid_ns is the inode number, or pid:[N]"; a holder "ran on
    this machine … in an earlier boot" is gone (Q-5: "or the same host with another
    boot")."""
    started = psutil.Process(holder.pid).create_time()
    ns = os.stat("/proc/self/ns/pid").st_ino
    base = {
        "worker": "other-tool",
        "host": socket.gethostname(),
        "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "pid_ns": ns,
        "pid": holder.pid,
        "create_time": started,
        "claimed_at": "2026-01-01T00:00:00Z",
        "expires_at": "2099-01-01T00:00:00Z",
    }
    alive = {
        "nsword": {**base, "pid_ns": f"pid:[{ns}]"},
        "starttime": {k: v for k, v in base.items() if k != "create_time"} | {
            "start_time": started},
        "epoch": {**base, "claimed_at": 1767225600, "expires_at": 4070908800},
        "lower": {**base, "claimed_at": "2026-01-01t00:00:00z",
                  "expires_at": "2099-01-01t00:00:00z"},
        "nozone": {**base, "claimed_at": "2026-01-01T00:00:00",
                   "expires_at": "2099-01-01T00:00:00"},
        "leap": {**base, "claimed_at": "2016-12-31T23:59:60Z"},
        "secondsonly": {**base, "create_time": int(started)},
    }  # fmt: skip
    gone = {
        "rebooted": {**base, "boot_id": "00000000-0000-0000-0000-000000000000"},
        "expired": {**base, "expires_at": "2020-01-01T00:00:00Z"},
    }
    unreadable = {"year10000": {**base, "expires_at": 253402300800 + 86400}}
    for name, lease in {**alive, **gone, **unreadable}.items():
        hand_claim(queue, f"{name}.req.json", lease)
    for group, state, rc in ((alive, "alive", 0), (gone, "gone", 0), (unreadable, "unreadable", 1)):
        for name in group:
            r = queue.run("show", f"{name}.req.json", "--json")
            assert r.rc == rc and r.json()["holder"]["state"] == state, (name, r)
    r = queue.run("recover", "--json")
    assert r.rc == 1, r  # the unreadable lease stays a conflict
    assert sorted(e["job"] for e in r.json()["requeued"]) == sorted(f"{n}.req.json" for n in gone)
    assert [e["job"] for e in r.json()["conflicts"]] == ["year10000.req.json"], r
    for name in alive:
        assert queue.state(f"{name}.req.json") == "claimed", name


def test_a_temp_dated_in_the_future_ages_from_its_ctime(queue: QueueCLI):
    """docs/queue.md's ``grace``: "its age runs from its mtime, or from its ctime when the
    mtime is later: a temp dated in the future holds no name for ever"; an entry at a
    staging name that is a symlink "counts as a stray temp file: status lists it among the
    temps with its kind, and recover --reconcile unlinks it once the grace period has
    passed (the link is never followed)"."""
    inbox = queue.dir / "inbox"
    future = inbox / "fut.req.json.publish.tmp"
    future.write_text("{")
    os.utime(future, (4070908800, 4070908800))
    (inbox / "lnk.req.json.publish.tmp").symlink_to(queue.dir / "config")
    r = queue.run("status", "--json")
    temps = {t["path"]: t for t in r.json()["temps"]}
    assert set(temps) == {"inbox/fut.req.json.publish.tmp", "inbox/lnk.req.json.publish.tmp"}
    assert temps["inbox/lnk.req.json.publish.tmp"]["kind"] == "symlink", temps
    assert 0 <= temps["inbox/fut.req.json.publish.tmp"]["age_seconds"] < 3600, temps
    r = queue.run("recover", "--reconcile", "--grace", "0", "--json")
    assert r.rc == 0 and sorted(r.json()["removed_temps"]) == sorted(temps), r
    assert queue.entries("inbox") == set() and (queue.dir / "config").is_file()


# ------------------------------------------------------- docs/queue.md: modes and hints


def test_entries_get_the_groups_access_whatever_the_umask_and_a_private_queue_none(
    queue: QueueCLI, scratch: Path, holder: subprocess.Popen
):
    """docs/queue.md: "every entry the protocol creates inside a queue gets the access the
    queue directory grants its group, whatever the creating process's umask: claimed/J and
    lease/J get the group's rwx, and the request, lease and result files its rw"; "a private
    queue … (ctx queue init --queue Q under umask 022 makes one)"; "One that ctx queue init
    --queue Q makes group-writable (under umask 002) gets its state directories setgid"."""
    env = clean_env(CTX_STORAGE=str(queue.storage))

    def umasked(mask: str, *args: str) -> subprocess.CompletedProcess:
        script = f'umask {mask}; exec "$@"'
        return subprocess.run(["sh", "-c", script, "sh", *CTX_ARGV, *args], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    job = "tight.req.json"
    r = subprocess.run(["sh", "-c", f'umask 077; printf %s \'{SIMPLE}\' | exec "$@"', "sh",
                        *CTX_ARGV, "queue", "publish", "--project", "proj", "--name", "tight",
                        "-"], env=env, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r
    assert umasked("077", "queue", "claim", "--project", "proj", "--pid",
                   str(holder.pid)).returncode == 0  # fmt: skip
    q = queue.dir
    assert mode(q / "pending") == 0o2770 and mode(q) == 0o3770
    assert mode(q / "claimed" / job) & 0o070 == 0o070
    assert mode(q / "lease" / job) & 0o070 == 0o070
    assert mode(q / "claimed" / job / job) & 0o060 == 0o060
    assert mode(q / "lease" / job / "worker") & 0o060 == 0o060
    done = subprocess.run(["sh", "-c", 'umask 077; echo 1 | exec "$@"', "sh", *CTX_ARGV,
                           "queue", "finish", "--project", "proj", job, "--ok", "-"],
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done
    assert mode(q / "done" / job) & 0o060 == 0o060
    assert mode(q / "done" / f"{job}.result") & 0o060 == 0o060

    private, shared = scratch / "private", scratch / "grouped"
    assert umasked("022", "queue", "init", "--queue", str(private)).returncode == 0
    assert umasked("002", "queue", "init", "--queue", str(shared)).returncode == 0
    for sub in ("inbox", "pending", "lease", "claimed", "done", "failed"):
        assert mode(private / sub) & 0o020 == 0 and not mode(private / sub) & 0o2000, sub
        assert mode(shared / sub) & 0o2070 == 0o2070, sub
    r = ctx_run("queue", "status", "--queue", private, "--json", env=env)
    assert r.rc == 0 and r.json()["group_not_inherited"] == [], r


def test_status_and_init_name_state_directories_that_would_not_give_the_group(
    queue: QueueCLI, unprivileged_user: UnprivilegedUser
):
    """docs/queue.md: status "lists each state directory that belongs neither to the queue
    directory's owner nor to root … on an owner line, with --json under owned_by_others
    ({"path", "uid", "queue_owner", "reason", "remedy"}) … have root give it to the queue's
    owner: chown …"; a state directory without its setgid bit "on a group line, with --json
    under group_not_inherited ({"path", "gid", "setgid", "queue_gid", "reason", "remedy"})
    …: chmod g+s Q/pending"; "A warning too (exit 0)"; "init over an existing queue changes
    nothing that exists: a state directory that would not give members the queue's group
    … is named in a ctx: warning: line with its repair, and init still exits 0"."""
    q = queue.dir
    owner = q.stat().st_uid
    os.chown(q / "done", unprivileged_user.uid, -1)
    os.chmod(q / "pending", 0o770)
    r = queue.run("status")
    assert r.rc == 0, r
    owner_line = next(ln for ln in r.lines() if ln.startswith("owner "))
    assert owner_line.split()[1] == "done/:", owner_line
    assert f"owned by uid {unprivileged_user.uid}, not by uid {owner}" in owner_line
    assert owner_line.endswith(f"chown {owner} {q}/done"), owner_line
    group_line = next(ln for ln in r.lines() if ln.startswith("group "))
    assert group_line.split()[1] == "pending/:" and "is not setgid" in group_line
    assert group_line.endswith(f"chmod g+s {q}/pending"), group_line
    report = queue.run("status", "--json").json()
    (other,) = report["owned_by_others"]
    assert set(other) == {"path", "uid", "queue_owner", "reason", "remedy"}, other
    assert (other["path"], other["uid"], other["queue_owner"]) == (
        "done",
        unprivileged_user.uid,
        owner,
    )
    (lost,) = report["group_not_inherited"]
    assert set(lost) == {"path", "gid", "setgid", "queue_gid", "reason", "remedy"}, lost
    assert (lost["path"], lost["setgid"]) == ("pending", False), lost

    r = ctx_run("queue", "init", "--project", "proj",
                env=clean_env(CTX_STORAGE=str(queue.storage)))  # fmt: skip
    assert r.rc == 0, r
    warning = [ln for ln in r.err.splitlines() if ln.startswith("ctx: warning: pending/")]
    assert len(warning) == 1 and warning[0].endswith(f"chmod g+s {q}/pending"), r
    assert mode(q / "pending") == 0o770  # init repairs only what is missing


def test_claim_order_hints_are_private_and_pruned_as_described(queue: QueueCLI, scratch: Path):
    """docs/queue.md: "every hint is mode 0600 and every directory made for the cache 0700,
    set on the descriptor whatever the umask"; "a hint whose queue no longer exists … is
    removed, so is one unused for 30 days, and any other file … once it is an hour old.  The
    cleaning is done by whoever writes a hint anew after listing pending/ (queue init, a
    claim that lists), at most once an hour (the mtime of claim-order/.pruned)"."""
    cache = scratch / "cache"
    env = clean_env(CTX_STORAGE=str(queue.storage), XDG_CACHE_HOME=str(cache))

    def run(*args: str, mask: str = "022") -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", f'umask {mask}; exec "$@"', "sh", *CTX_ARGV, *args],
                              env=env, capture_output=True, text=True, timeout=60)  # fmt: skip

    for project in ("gone", "stale"):
        assert run("queue", "init", "--project", project).returncode == 0
        r = subprocess.run([*CTX_ARGV, "queue", "publish", "--project", project, "-"],
                           input=SIMPLE, env=env, capture_output=True, text=True)  # fmt: skip
        assert r.returncode == 0, r
        assert run("queue", "claim", "--project", project, "--pid", "1", mask="0").returncode == 0
    hints = cache / "cortexfs" / "claim-order"
    for made in (cache / "cortexfs", hints):
        assert mode(made) == 0o700, made
    kept = {p.name: p for p in hints.iterdir() if not p.name.startswith(".")}
    assert len(kept) == 2 and all(mode(p) == 0o600 for p in kept.values()), kept
    by_queue = {p.read_text().splitlines()[1]: p for p in kept.values()}
    gone_hint = by_queue[json.dumps(str(queue.storage / "shared/gone/queue"))]
    stale_hint = by_queue[json.dumps(str(queue.storage / "shared/stale/queue"))]

    shutil.rmtree(queue.storage / "shared" / "gone")
    old = time.time() - 31 * 86400
    os.utime(stale_hint, (old, old))
    (hints / "junk").write_text("x")
    os.utime(hints / "junk", (time.time() - 7200,) * 2)
    (hints / "young").write_text("x")
    os.utime(hints / ".pruned", (time.time() - 600,) * 2)  # pruned ten minutes ago
    assert run("queue", "init", "--project", "fresh").returncode == 0
    assert gone_hint.exists() and stale_hint.exists() and (hints / "junk").exists()

    os.utime(hints / ".pruned", (time.time() - 7200,) * 2)  # two hours ago: due
    assert run("queue", "init", "--project", "fresher").returncode == 0
    assert not gone_hint.exists() and not stale_hint.exists() and not (hints / "junk").exists()
    assert (hints / "young").exists()


# --------------------------------------------------------------------- docs/workers.md


def test_a_worker_without_an_agent_warns_once_and_fails_jobs_at_authorize(queue: QueueCLI):
    """docs/workers.md: "ctx queue work --project P --drain on an empty queue exits 0"; "An
    empty $CTX_AGENT counts as unset"; "A worker started without an agent … prints one
    warning line on stderr, still claims jobs, and finishes each one in failed/ as refused
    by the authority chain — reason EACCES: this worker was started without --agent or
    CTX_AGENT …, error.stage authorize — without running anything"; "The start event
    (--json) says which one it uses ("wait": "inotify" …)"."""
    env = clean_env(CTX_STORAGE=str(queue.storage), CTX_AGENT="")
    r = ctx_run("queue", "work", "--project", "proj", "--drain", "--json", env=env)
    assert r.rc == 0, r
    events = [json.loads(ln) for ln in r.lines()]
    assert events[0]["event"] == "start" and events[-1]["event"] == "stop", events
    assert events[0]["wait"] == "inotify" or isinstance(events[0]["wait"], str), events

    job = queue.publish({"tool": "shell.exec", "input": {"cmd": "touch /never"}}, name="noone")
    r = ctx_run("queue", "work", "--project", "proj", "--drain", env=env)
    assert r.rc == 0, r
    warnings = r.err.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("ctx: warning: "), r
    state, stored = queue.only_result(job)
    assert state == "failed", stored
    assert stored["reason"].startswith(
        "EACCES: this worker was started without --agent or CTX_AGENT"
    ), stored
    assert stored["error"]["stage"] == "authorize" and stored["error"]["error"] == "EACCES"
    assert "exit_status" not in stored and not Path("/never").exists()


# -------------------------------------------------------------------- docs/sessions.md


def test_session_numbers_outside_their_ranges_and_ambiguous_homes_are_einval_exit_2(
    storage: Path,
):
    """docs/sessions.md: "--uid is a uid, 0 to 4294967294, and tail -n a count, 0 to
    9223372036854775807 (2^63 − 1); any other number is EINVAL, exit 2"; "once
    agent/<name> is gone, the home that still holds agent/<name>/session/ is read — the
    caller's own first, else the only one; when several homes hold some, --uid says which
    (EINVAL, exit 2)"."""
    env = clean_env(CTX_STORAGE=str(storage))
    event = {"ts": "2026-01-01T00:00:00Z", "type": "note", "agent": "ghost", "session": "s",
             "object": "o", "status": "ok"}  # fmt: skip
    for uid in (4242, 4343):
        session = storage / "home" / str(uid) / "agent" / "ghost" / "session" / "s"
        session.mkdir(parents=True)
        (session / "events.jsonl").write_text(json.dumps(event) + "\n")
    for args in (
        ("show", "ghost", "s", "--uid", "4294967295"),
        ("show", "ghost", "s", "--uid", "-1"),
        ("tail", "ghost", "s", "--uid", "4242", "-n", "9223372036854775808"),
        ("tail", "ghost", "s", "--uid", "4242", "-n", "-1"),
        ("show", "ghost", "s"),
        ("list", "ghost"),
    ):
        r = ctx_run("session", *args, env=env)
        assert r.rc == 2 and "EINVAL" in r.err, r
    r = ctx_run("session", "tail", "ghost", "--session", "s", "--uid", "4343", "-n",
                "9223372036854775807", "--json", env=env)  # fmt: skip
    assert r.rc == 0 and [json.loads(ln) for ln in r.lines()] == [event], r
    r = ctx_run("session", "tail", "ghost", "s", "--uid", "4242", "-n", "0", env=env)
    assert (r.rc, r.out) == (0, ""), r

    mine = storage / "home" / "0" / "agent" / "ghost" / "session" / "own"
    if os.geteuid() == 0:
        mine.mkdir(parents=True)
        (mine / "events.jsonl").write_text(json.dumps({**event, "session": "own"}) + "\n")
        r = ctx_run("session", "list", "ghost", env=env)
        assert (r.rc, r.out) == (0, "own\n"), r  # the caller's own home first


def test_a_fifo_at_events_jsonl_is_einval_for_every_reader_and_repair(storage: Path):
    """docs/sessions.md: "A socket, a directory or a FIFO at events.jsonl is EINVAL ("is not a
    regular file") for every reader and repair" — and none of them blocks on it."""
    env = clean_env(CTX_STORAGE=str(storage))
    for name, make in (("fifo", os.mkfifo), ("dir", os.mkdir)):
        session = storage / "home" / "4242" / "agent" / "ghost" / "session" / name
        session.mkdir(parents=True)
        make(session / "events.jsonl")
        for verb in ("show", "tail", "repair"):
            r = ctx_run("session", verb, "ghost", name, "--uid", "4242", env=env, timeout=30)
            assert r.rc == 1, r
            assert r.err.startswith("ctx: EINVAL: ") and "is not a regular file" in r.err, r


@needs_root
def test_repair_by_a_caller_who_may_read_but_not_write(
    searchable_storage: Path, unprivileged_user: UnprivilegedUser
):
    """docs/sessions.md: "run by a caller who may read the file but not write it, ctx session
    repair of a session whose last line is whole says there is nothing to do (exit 0); a
    torn line there cannot be cut: EROFS (or EACCES), exit 1, naming the file and the torn
    bytes, nothing changed"; "repair --json prints {"session", "truncated_bytes",
    "tightened", "left"}"."""
    root = searchable_storage
    user = unprivileged_user
    env = clean_env(CTX_STORAGE=str(root))
    home = root / "home" / str(user.uid)
    session = home / "agent" / "ghost" / "session" / "s"
    session.mkdir(parents=True)
    for level in (
        home,
        home / "agent",
        *[home / "agent" / "ghost" / p for p in ("", "session", "session/s")],
    ):
        os.chown(level, user.uid, user.gid)
        os.chmod(level, 0o755 if level == home else 0o700)
    log = session / "events.jsonl"
    whole = json.dumps({"ts": "2026-01-01T00:00:00Z", "type": "note", "agent": "ghost",
                        "session": "s", "object": "o", "status": "ok"}) + "\n"  # fmt: skip
    log.write_text(whole)
    os.chmod(log, 0o644)  # root's file, which the home's owner may read only

    done = run_as(user, [*CTX_ARGV, "session", "repair", "ghost", "s", "--json"], env=env)
    assert done.returncode == 0, done
    report = json.loads(done.stdout)
    assert set(report) == {"session", "truncated_bytes", "tightened", "left"}, report
    assert report["session"] == f"home/{user.uid}/agent/ghost/session/s", report
    assert report["truncated_bytes"] == 0, report

    log.write_text(whole + '{"ts":"2026')
    before = log.read_bytes()
    done = run_as(user, [*CTX_ARGV, "session", "repair", "ghost", "s"], env=env)
    assert done.returncode == 1, done
    refusal = done.stderr.splitlines()[-1]
    assert refusal.startswith(f"ctx: EACCES: {log} ") and "11 bytes" in refusal, done
    assert log.read_bytes() == before


# ---------------------------------------------------------------------------- README.md


def test_readme_exit_statuses_for_closed_and_full_outputs(queue: QueueCLI):
    """README.md: "74 when the output cannot be written, as with > /dev/full, saying what the
    command had done"; docs/queue.md: "started with standard output closed (ctx queue claim
    >&-), publish and claim, and every command given --json, exit 1 with EBADF on stderr
    before anything is published, claimed …"; "A - (read standard input) given with
    standard input closed … is refused the same way"."""
    env = clean_env(CTX_STORAGE=str(queue.storage))
    job = queue.publish(json.loads(SIMPLE), name="out")

    def shell(script: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sh", "-c", script, "sh", *CTX_ARGV], env=env,
                              capture_output=True, text=True, timeout=60)  # fmt: skip

    for script in ('"$@" queue claim --project proj >&-',
                   '"$@" queue status --project proj --json >&-'):  # fmt: skip
        done = shell(script)
        assert done.returncode == 1 and done.stderr.startswith("ctx: EBADF: "), done
    assert queue.state(job) == "pending"
    assert shell('"$@" queue status --project proj >&-').returncode == 0

    assert queue.run("claim", "--pid", "1").rc == 0
    done = shell(f'"$@" queue finish --project proj {job} --ok - <&-')
    assert done.returncode == 1 and done.stderr.startswith("ctx: EBADF: "), done
    assert queue.state(job) == "claimed"
    done = shell(f'echo 5 | "$@" queue finish --project proj {job} --ok - >/dev/full')
    assert done.returncode == 74, done
    assert done.stderr.startswith("ctx: ENOSPC: cannot write standard output"), done
    assert f"job {job} was finished in done/ (do not finish it again)" in done.stderr, done
    assert queue.only_result(job)[0] == "done"
