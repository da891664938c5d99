"""End-to-end flows of a project lead tuning a busy queue through its own ``queue/config``
(SPEC §2.1, Q-1 … Q-9, §2.4; docs/queue.md "Configuration"): the request and result size
limits edited between and during publishes, claims, finishes and a running worker; requests
exactly at, one byte over and far over the limit given as a file, on stdin and as one line
of a batch; the config removed, made a directory, a symlink, a FIFO or too big, and swapped
while publishers and claimers race; ``--ttl`` and ``--grace`` (and ``lease_ttl``/``grace``
in the config) at and past their bounds.  After every refusal nothing is half-done, and
``status``, ``list`` and ``show`` tell the truth about each job."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    SUFFIX,
    QueueCLI,
    age,
    rfc3339,
    snapshot,
    wait_for,
)
from tests.acceptance.workercli import (
    allow_in_tool_policy,
    make_agent,
    result_of,
    running_worker,
    shell_job,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root")

DAYS_366 = 366 * 24 * 3600  # the longest lease lifetime (docs/queue.md "Configuration")


def sized_request(size: int, **extra) -> bytes:
    """A valid request of exactly ``size`` bytes (no trailing newline)."""
    empty = json.dumps({"tool": "fs.read", "input": {"pad": ""}, **extra}).encode()
    assert size >= len(empty), size
    data = json.dumps(
        {"tool": "fs.read", "input": {"pad": "x" * (size - len(empty))}, **extra}
    ).encode()
    assert len(data) == size
    return data


def set_config(queue: QueueCLI, *lines: str) -> None:
    """Append ``lines`` to the config ``init`` wrote: a key given again counts from there."""
    config = queue.dir / "config"
    config.write_text(config.read_text() + "".join(f"{line}\n" for line in lines))


def config_line(queue: QueueCLI) -> int:
    """The number the next appended line of the config will have."""
    return len((queue.dir / "config").read_text().splitlines()) + 1


def counts(queue: QueueCLI) -> dict:
    r = queue.run("status", "--json")
    assert r.rc == 0, r
    return r.json()["counts"]


# ------------------------------------------------------------------ the request size limit


def test_a_lead_tightens_the_request_limit_and_every_way_in_meets_it_exactly(queue, tmp_path):
    """§2.1 and docs/queue.md "Configuration": ``max_request_bytes`` edited in ``queue/config``
    takes effect at the next command; a request of exactly the limit is accepted by
    ``publish FILE``, ``publish -`` and ``publish --batch``; one byte over and far over are
    refused (EFBIG; a batch EINVAL naming the line, all-or-nothing) with nothing left in any
    state or in ``inbox/``, the refused ``--name`` stays free, and ``status``/``list`` count
    only what was published.  Q-9: the batch is claimed in line order."""
    queue.publish(name="before")  # published under the default limit
    limit = 300
    set_config(queue, f"max_request_bytes={limit}")

    exact = tmp_path / "exact.json"
    exact.write_bytes(sized_request(limit))
    over = tmp_path / "over.json"
    over.write_bytes(sized_request(limit + 1))
    far = tmp_path / "far.json"
    far.write_bytes(sized_request(limit * 1000))
    clean = snapshot(queue.dir)

    refusals = [
        (queue.run("publish", "--name", "one-over", over), limit + 1),
        (queue.run("publish", "--name", "one-over", "-", input=over.read_bytes()), None),
        (queue.run("publish", "--name", "far-over", far), limit * 1000),
        (queue.run("publish", "--name", "far-over", "-", input=far.read_bytes()), None),
    ]
    for refused, size in refusals:
        assert refused.rc == 1 and refused.out == "", refused
        assert refused.err.startswith("ctx: EFBIG: request is "), refused
        assert f"this queue accepts at most {limit} (max_request_bytes in queue/config)" in (
            refused.err
        ), refused
        # A file gives its size; a stream is read no further than one byte past the limit.
        said = f"request is {size} bytes" if size else f"request is more than {limit} bytes"
        assert refused.err.startswith(f"ctx: EFBIG: {said}; "), refused
    as_json = queue.run("publish", "--name", "one-over", "--json", over)
    assert as_json.rc == 1 and as_json.json()["error"] == "EFBIG", as_json
    assert "published" not in as_json.json(), as_json

    # One bad line among many: the whole batch is refused, and its line is named.
    lines = [sized_request(limit, n=i) for i in range(4)]
    for bad, line_no in ((sized_request(limit + 1, n=9), 3), (far.read_bytes(), 4)):
        batch = tmp_path / f"batch-{line_no}.jsonl"
        mixed = lines[:]
        mixed[line_no - 1] = bad
        batch.write_bytes(b"\n".join(mixed) + b"\n")
        source, data = (batch, None) if line_no == 3 else ("-", batch.read_bytes())
        refused = queue.run("publish", "--batch", source, input=data)
        assert refused.rc == 1 and refused.out == "", refused
        assert refused.err.startswith(
            f"ctx: EINVAL: batch refused, nothing published: line {line_no} is "
        ), refused
    refused = queue.run("publish", "--batch", "--json", batch)
    doc = refused.json()
    assert refused.rc == 1 and doc["error"] == "EINVAL" and "line 4 is" in doc["message"], doc
    assert "published" not in doc and "not_published_lines" not in doc, refused
    assert snapshot(queue.dir) == clean  # nothing half-done, not even a temp file
    assert counts(queue)["pending"] == 1
    assert queue.run("show", "one-over").rc == 1

    # Exactly the limit: accepted every way, and the refused name is still free.
    assert queue.run("publish", "--name", "one-over", exact).out == "one-over" + SUFFIX + "\n"
    stdin = queue.run("publish", "--name", "by-stdin", "-", input=exact.read_bytes())
    assert stdin.rc == 0 and stdin.out == "by-stdin" + SUFFIX + "\n", stdin
    good = tmp_path / "good.jsonl"
    good.write_bytes(b"\n".join(lines) + b"\n")
    batch = queue.run("publish", "--batch", good)
    assert batch.rc == 0, batch
    names = batch.lines()
    assert len(names) == 4 and all(n.endswith(SUFFIX) for n in names), batch

    # Loosened again: the request refused far over the old limit is accepted under its name.
    set_config(queue, "max_request_bytes=1048576")
    assert queue.run("publish", "--name", "far-over", far).rc == 0

    order = ["before" + SUFFIX, "one-over" + SUFFIX, "by-stdin" + SUFFIX, *names]
    order.append("far-over" + SUFFIX)
    listed = queue.run("list", "--state", "pending")
    assert listed.rc == 0 and listed.lines() == order, listed
    assert counts(queue)["pending"] == len(order)
    claimed = [queue.claim("--pid", str(os.getpid())) for _ in order]
    assert claimed == order  # oldest first, a batch in its line order
    for job in claimed[3:7]:
        stored = json.loads((queue.dir / "claimed" / job / job).read_text())
        assert stored["input"]["pad"] and stored["from"]
    assert queue.entries("inbox") == set()


def test_lowering_the_limit_below_a_pending_job_flags_it_at_claim_and_it_fails_cleanly(queue):
    """docs/queue.md "Configuration": readers allow a stored request up to the limit plus
    64 KiB.  A job accepted under a 1 MiB limit and still pending when the lead lowers the
    limit far below it stays pending (status, list) and the next claim hands it out as an
    invalid request whose reason names ``max_request_bytes``, with the note telling to finish
    it with ``--error``; the smaller jobs behind it are claimed normally."""
    big = queue.run("publish", "--name", "big", "-", input=sized_request(200_000))
    assert big.rc == 0, big
    small = queue.publish(name="small")
    set_config(queue, "max_request_bytes=1000")

    status = queue.run("status", "--json")
    assert status.rc == 0 and status.json()["counts"]["pending"] == 2, status
    assert queue.run("list", "--state", "pending").lines() == ["big" + SUFFIX, small]

    flagged = queue.run("claim", "--pid", str(os.getpid()), "--json")
    assert flagged.rc == 0, flagged
    doc = flagged.json()
    assert doc["name"] == "big" + SUFFIX
    assert doc["request"]["tool"] is None and doc["request"]["input"] == {}, doc["request"]
    reason = doc["request"]["invalid"]
    assert "over the size limit" in reason and "max_request_bytes=1000" in reason, reason
    assert f"ctx: note: the request of big{SUFFIX} is not valid (" in flagged.err, flagged
    assert "finish it with --error" in flagged.err, flagged

    failed = queue.run("finish", "big", "--error", "-", input=json.dumps({"reason": reason}))
    assert failed.rc == 0, failed
    assert queue.state("big" + SUFFIX) == "failed"
    assert queue.claim("--pid", str(os.getpid())) == small
    queue.finish(small)
    c = counts(queue)
    assert (c["done"], c["failed"], c["pending"], c["claimed"]) == (1, 1, 0, 0), c


def test_show_reads_a_request_and_a_lease_larger_than_the_result_limit(queue):
    """docs/queue.md "Configuration": ``max_result_bytes`` limits results; requests are read
    up to ``max_request_bytes`` plus 64 KiB.  A lead who caps results at 1 000 bytes while
    requests carry 5 000 still sees, in ``show``, every request (pending, claimed, done) and
    the lease, as ``claim`` and ``status`` read them."""
    set_config(queue, "max_result_bytes=1000")
    r = queue.run("publish", "--name", "wide", "-", input=sized_request(5000))
    assert r.rc == 0, r
    job = "wide" + SUFFIX

    def shown() -> dict:
        s = queue.run("show", job, "--json")
        assert s.rc == 0, s
        return s.json()

    assert "unreadable" not in shown()["request"], shown()
    claimed = queue.run("claim", "--pid", str(os.getpid()), "--json")
    assert claimed.rc == 0 and len(claimed.json()["request"]["input"]["pad"]) > 4000, claimed
    assert "unreadable" not in shown()["request"], shown()
    assert "unreadable" not in shown()["lease"], shown()
    queue.finish(job)
    assert shown()["state"] == "done"
    assert "unreadable" not in shown()["request"], shown()


def test_a_config_value_with_a_superscript_digit_is_refused_with_its_line(queue):
    """docs/queue.md "Configuration" and §2.4 (errors are ``ctx: ERRNO: sentence``): a value
    a lead mistypes with a character that looks like a digit is refused as every other bad
    value is, EINVAL naming the file and line, never a Python traceback."""
    line = config_line(queue)
    set_config(queue, "max_request_bytes=2²")
    before = snapshot(queue.dir)
    for args in (("status",), ("publish", "-"), ("claim",)):
        refused = queue.run(*args, input=json.dumps({"tool": "fs.read", "input": {}}))
        assert refused.rc == 1, refused
        assert "Traceback" not in refused.err, refused
        assert refused.err.startswith(
            f"ctx: EINVAL: {queue.dir / 'config'}:{line}: max_request_bytes must be a positive"
        ), refused
    assert snapshot(queue.dir) == before


# ------------------------------------------------------------------- the result size limit


def test_the_result_limit_is_met_at_finish_and_a_refused_finish_leaves_the_claim_whole(
    queue, tmp_path, child
):
    """docs/queue.md "Configuration": results larger than ``max_result_bytes`` are refused
    with EFBIG.  The stored result (output plus worker, started, finished) is what is
    measured: a result file of exactly the limit, one whose result would be larger, and one
    far over (file and stdin) are each refused with the sizes named; the job stays claimed
    with its lease byte for byte, ``show`` and ``status`` say claimed, no temp is left; a
    smaller output then finishes, its stored result within the limit; ``--error`` is held to
    the same limit."""
    limit = 600
    set_config(queue, f"max_result_bytes={limit}")
    ok_job = queue.publish(name="ok")
    err_job = queue.publish(name="err")
    assert queue.claim("--pid", str(child.pid)) == ok_job
    assert queue.claim("--pid", str(child.pid)) == err_job
    lease = (queue.dir / "lease" / ok_job / "worker").read_bytes()
    held = snapshot(queue.dir)

    at_limit = tmp_path / "at-limit.json"
    at_limit.write_text(json.dumps({"text": "y" * (limit - 12)}))
    assert at_limit.stat().st_size == limit
    far = json.dumps({"text": "y" * (limit * 100)})
    for job, flag in ((ok_job, "--ok"), (err_job, "--error")):
        for source, data in ((at_limit, None), ("-", at_limit.read_bytes()), ("-", far)):
            refused = queue.run("finish", job, flag, source, input=data)
            assert refused.rc == 1 and refused.out == "", refused
            assert refused.err.startswith("ctx: EFBIG: "), refused
            assert f"at most {limit}" in refused.err or f"more than {limit}" in refused.err, refused
    assert snapshot(queue.dir) == held
    assert (queue.dir / "lease" / ok_job / "worker").read_bytes() == lease
    shown = queue.run("show", ok_job, "--json")
    assert shown.rc == 0 and shown.json()["state"] == "claimed", shown
    assert counts(queue)["claimed"] == 2

    queue.finish(ok_job, output={"text": "short"})
    failed = queue.run("finish", err_job, "--error", "-", input='{"why": "short"}')
    assert failed.rc == 0, failed
    for job, state in ((ok_job, "done"), (err_job, "failed")):
        stored = queue.dir / state / f"{job}.result"
        assert stored.stat().st_size <= limit
        assert queue.state(job) == state
    assert queue.entries("inbox") == queue.entries("claimed") == queue.entries("lease") == set()
    c = counts(queue)
    assert (c["done"], c["failed"], c["claimed"]) == (1, 1, 0), c


@needs_root
def test_a_running_worker_is_held_to_a_result_limit_lowered_while_it_runs(searchable_storage):
    """docs/workers.md "A result too large" and docs/queue.md "Configuration": a result larger
    than the queue's ``max_result_bytes`` is refused, and the worker finishes that job in
    ``failed/`` with ``EFBIG … [finish]``.  The queue's limit is what ``queue/config`` says:
    a lead who lowers it on a busy queue expects the worker already running to honour it for
    the next job, as every command started after the edit does."""
    storage = searchable_storage
    make_agent(storage, ["shell.exec"])
    allow_in_tool_policy(storage, "shell.exec")
    queue = QueueCLI(storage, "proj")
    with running_worker(queue, "--json") as worker:
        first = queue.publish(shell_job("echo first"), name="first")
        assert wait_for(lambda: queue.state(first) in ("done", "failed"))
        assert result_of(queue, first)["status"] == "ok"
        set_config(queue, "max_result_bytes=100")
        second = queue.publish(shell_job("echo second"), name="second")
        assert wait_for(lambda: queue.state(second) in ("done", "failed"))
        worker.terminate()
        worker.communicate(timeout=30)
    assert queue.state(second) == "failed"
    record = result_of(queue, second)
    assert record["output"] is None and record["output_omitted"] is True, record
    assert record["reason"].startswith("EFBIG") and record["reason"].endswith("[finish]"), record


@needs_root
def test_a_running_worker_stops_at_a_config_it_can_no_longer_read(searchable_storage):
    """docs/workers.md "The queue's config while a worker runs": a config replaced by a
    directory stops a running worker as it stops every command: it claims nothing more and
    exits 1 naming the config; the job published meanwhile stays pending for a worker started
    once the config is repaired."""
    storage = searchable_storage
    make_agent(storage, ["shell.exec"])
    allow_in_tool_policy(storage, "shell.exec")
    queue = QueueCLI(storage, "proj")
    config = queue.dir / "config"
    with running_worker(queue, "--json") as worker:
        first = queue.publish(shell_job("sleep 1.5; echo first"), name="first")
        assert wait_for(lambda: queue.state(first) == "claimed")
        second = queue.publish(shell_job("echo second"), name="second")
        config.rename(queue.dir / "config.kept")
        config.mkdir()
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 1, err
    assert "the queue's config can no longer be read" in err, err
    assert f"{queue.dir}/config" in err, err
    assert (queue.state(first), queue.state(second)) == ("done", "pending")


# ------------------------------------------------------------------------ a damaged config


def _as_directory(config: Path, tmp_path: Path) -> str:
    config.unlink()
    config.mkdir()
    return f"EINVAL: {config} is a directory, not a regular file"


def _as_symlink(config: Path, tmp_path: Path) -> str:
    target = tmp_path / "elsewhere.cfg"
    target.write_text("max_request_bytes=10\nlease_ttl=1\n")
    config.unlink()
    config.symlink_to(target)
    return f"ELOOP: {config} is a symlink; it is never followed"


def _as_fifo(config: Path, tmp_path: Path) -> str:
    config.unlink()
    os.mkfifo(config)
    return f"EINVAL: {config} is a FIFO, not a regular file"


def _too_big(config: Path, tmp_path: Path) -> str:
    text = config.read_text()
    config.write_text("# " + "notes " * 12_000 + "\n" + text)
    return f"EFBIG: {config} is {config.stat().st_size} bytes"


DAMAGE = {
    "directory": _as_directory,
    "symlink": _as_symlink,
    "fifo": _as_fifo,
    "too-big": _too_big,
}


def test_a_damaged_config_stops_every_command_and_is_never_replaced_by_defaults(
    queue, tmp_path, child
):
    """docs/queue.md "Configuration", Q-8, ``init``: a ``queue/config`` made a directory, a
    symlink, a FIFO, or grown past what a config may be, is refused by every command
    (publish, batch, claim, renew, finish, status, list, show, recover, init) with its path,
    what it is and the remedy, exit 1 (``--json`` too); nothing moves, nothing is read
    through the link, and ``init`` replaces nothing.  Each time it is moved aside, ``init``
    writes the default config and the queue works on: the claimed job is renewed and
    finished, the pending one claimed."""
    config = queue.dir / "config"
    req = json.dumps({"tool": "fs.read", "input": {}})
    held = queue.publish(name="held")
    waiting = queue.publish(name="waiting")
    assert queue.claim("--pid", str(child.pid), "--ttl", "600") == held
    commands = [
        ("publish", "-"),
        ("publish", "--batch", "-"),
        ("claim", "--pid", str(child.pid)),
        ("renew", held, "--pid", str(child.pid)),
        ("finish", held, "--ok", "-"),
        ("status",),
        ("list",),
        ("show", waiting),
        ("recover", "--reconcile", "--grace", "0"),
        ("init",),
    ]
    for round_no, damage in enumerate(DAMAGE.values()):
        said = damage(config, tmp_path)
        before = snapshot(queue.dir)
        # Every command meets one of the damages or more; each round, a share of them.
        for args in commands[round_no :: len(DAMAGE)]:
            refused = queue.run(*args, input=req)
            assert refused.rc == 1 and refused.out == "", (args, refused)
            assert refused.err.startswith(f"ctx: {said}"), (args, refused)
            assert (
                "'ctx queue init --project proj' writes the default config in its place"
                in refused.err
            )
        with_json = queue.run(*commands[round_no + 5], "--json", input=req)
        assert with_json.rc == 1 and with_json.json()["message"] in with_json.err, with_json
        assert snapshot(queue.dir) == before
        if config.is_symlink():
            assert (tmp_path / "elsewhere.cfg").read_text().startswith("max_request_bytes=10\n")

        # The remedy the message gives.
        os.rename(config, tmp_path / f"aside{round_no}")
        ready = queue.run("init")
        assert ready.rc == 0 and "(1 entry created)" in ready.out, ready
        assert "max_request_bytes=1048576\n" in config.read_text()
        assert queue.state(held) == "claimed" and queue.state(waiting) == "pending"

    assert queue.run("renew", held, "--pid", str(child.pid)).rc == 0
    queue.finish(held)
    assert queue.claim("--pid", str(child.pid)) == waiting
    assert queue.state(held) == "done" and queue.state(waiting) == "claimed"


def test_a_removed_config_means_the_defaults_and_init_writes_it_back(queue, tmp_path, child):
    """docs/queue.md "Configuration" and ``init`` ("the only repair init makes is what is
    missing"): with ``queue/config`` removed mid-flight, a request over the old custom limit
    but within the default 1 MiB is published, the claimed job finishes; ``init`` then writes
    the default config, and an edit appended to it takes effect again."""
    set_config(queue, "max_request_bytes=500")
    held = queue.publish(name="held")
    assert queue.claim("--pid", str(child.pid)) == held
    big = sized_request(5000)
    assert queue.run("publish", "--name", "big", "-", input=big).rc == 1

    (queue.dir / "config").unlink()
    status = queue.run("status")
    assert status.rc == 0, status
    assert queue.run("publish", "--name", "big", "-", input=big).rc == 0
    queue.finish(held)
    assert queue.run("publish", "--name", "huge", "-", input=sized_request(1 << 20)).rc == 0
    assert queue.run("publish", "--name", "over", "-", input=sized_request((1 << 20) + 1)).rc == 1

    init = queue.run("init")
    assert init.rc == 0 and "(1 entry created)" in init.out, init
    written = (queue.dir / "config").read_text()
    assert "max_request_bytes=1048576\n" in written and "lease_ttl=300\n" in written
    set_config(queue, "max_request_bytes=500")
    refused = queue.run("publish", "--name", "again", "-", input=big)
    assert refused.rc == 1 and "at most 500" in refused.err, refused
    listed = queue.run("list", "--json")
    assert listed.rc == 0, listed
    assert counts(queue)["pending"] == 2 and counts(queue)["done"] == 1


# ---------------------------------------------------------- a config swapped under a race


def test_a_config_swapped_while_publishers_and_claimers_race_never_half_publishes(queue, tmp_path):
    """Q-1, Q-2, I-1, I-4 with docs/queue.md "Configuration": while the lead swaps
    ``queue/config`` (atomically, by rename) between a tight and a loose request limit, two
    publishers send single and batch requests sized between the two and two claimers claim.
    Every publish either prints its names and its jobs exist, or is refused with EFBIG /
    EINVAL and none of its jobs exists; no job is claimed twice; ``inbox/`` ends empty and
    ``status`` accounts for every acknowledged job."""
    tight = (queue.dir / "config").read_text() + "max_request_bytes=200\n"
    loose = (queue.dir / "config").read_text() + "max_request_bytes=4000\n"
    stop = threading.Event()
    swaps = [0]

    def swap() -> None:
        while not stop.is_set():
            for text in (tight, loose):
                tmp = queue.dir / ".config.swap"
                tmp.write_text(text)
                os.rename(tmp, queue.dir / "config")
                swaps[0] += 1
                time.sleep(0.01)

    published: list[str] = []
    refused: list[str] = []
    problems: list = []
    lock = threading.Lock()

    def publish(who: int) -> None:
        for i in range(8):
            if i % 3 == 2:
                lines = b"\n".join(sized_request(1000, who=who, i=i, k=k) for k in range(3))
                r = queue.run("publish", "--batch", "-", input=lines + b"\n")
                expect = "EINVAL: batch refused, nothing published: line 1 is 1000 bytes"
            else:
                r = queue.run("publish", "-", input=sized_request(1000, who=who, i=i))
                expect = "EFBIG: request is more than 200 bytes"
            with lock:
                if r.rc == 0:
                    published.extend(r.lines())
                elif r.err.startswith(f"ctx: {expect}") and r.out == "":
                    refused.append(r.err)
                else:
                    problems.append(r)

    claims: list[str] = []

    def claim() -> None:
        for _ in range(10):
            r = queue.run("claim", "--pid", str(os.getpid()))
            with lock:
                if r.rc == 0:
                    claims.append(r.out.strip())
                elif r.rc != 3:
                    problems.append(r)

    swapper = threading.Thread(target=swap)
    swapper.start()
    workers = [threading.Thread(target=publish, args=(w,)) for w in range(2)]
    workers += [threading.Thread(target=claim) for _ in range(2)]
    try:
        for t in workers:
            t.start()
        for t in workers:
            t.join(timeout=120)
    finally:
        stop.set()
        swapper.join(timeout=30)
    assert problems == []
    assert swaps[0] > 2 and published and refused, (swaps, published, refused)

    assert len(claims) == len(set(claims))  # I-4
    assert set(claims) <= set(published)
    on_disk = queue.entries("pending") | queue.entries("claimed")
    assert on_disk == set(published), on_disk ^ set(published)
    assert queue.entries("inbox") == set()
    for job in claims:
        assert queue.state(job) == "claimed"
    c = counts(queue)
    assert (c["pending"], c["claimed"]) == (len(published) - len(claims), len(claims)), c
    assert c["incomplete"] == c["conflict"] == c["ignored"] == 0, c


# ------------------------------------------------------------ --ttl, --grace and the config


def _lease_period(queue: QueueCLI, job: str) -> float:
    lease = queue.lease(job)
    start = lease.get("renewed_at") or lease["claimed_at"]
    return (rfc3339(lease["expires_at"]) - rfc3339(start)).total_seconds()


def test_lease_lifetimes_at_and_past_their_bounds_through_claim_renew_and_recover(queue, child):
    """§2.4 ``--ttl`` and docs/queue.md (``lease_ttl``: above 0, at most 366 days; Q-5 an
    expired lease is proof the holder is gone): ``claim --ttl`` and ``renew --ttl`` of 0, -0,
    nan, inf, 1e999, a word or 366 days plus a second are usage errors (exit 2) that move
    nothing and leave the lease byte for byte; 366 days exactly is taken and ``show`` gives
    that ``expires_at``; ``renew`` without ``--ttl`` renews for the period last taken; a
    lease renewed to a millisecond is requeued by plain ``recover`` though its holder lives,
    and the job is the first claimed again."""
    first = queue.publish(name="first")
    second = queue.publish(name="second")
    pristine = snapshot(queue.dir)
    bad = ("0", "-0", "nan", "inf", "1e999", "soon", str(DAYS_366 + 1))
    for ttl in bad:
        refused = queue.run("claim", "--pid", str(child.pid), "--ttl", ttl)
        assert refused.rc == 2 and refused.out == "", (ttl, refused)
        assert "Invalid value for '--ttl'" in refused.err, (ttl, refused)
    assert snapshot(queue.dir) == pristine

    took = queue.run("claim", "--pid", str(child.pid), "--ttl", str(DAYS_366), "--json")
    assert took.rc == 0 and took.json()["name"] == first, took
    assert _lease_period(queue, first) == pytest.approx(DAYS_366, abs=0.01)
    shown = queue.run("show", first, "--json")
    assert shown.rc == 0 and shown.json()["state"] == "claimed", shown
    expires = rfc3339(shown.json()["lease"]["expires_at"])
    now = datetime.now(expires.tzinfo)
    assert timedelta(days=365, hours=23) < expires - now <= timedelta(days=366), expires

    lease = (queue.dir / "lease" / first / "worker").read_bytes()
    for ttl in bad:
        refused = queue.run("renew", first, "--pid", str(child.pid), "--ttl", ttl)
        assert refused.rc == 2, (ttl, refused)
    assert (queue.dir / "lease" / first / "worker").read_bytes() == lease

    assert queue.run("renew", first, "--pid", str(child.pid), "--ttl", "90").rc == 0
    assert _lease_period(queue, first) == pytest.approx(90, abs=0.01)
    assert queue.run("renew", first, "--pid", str(child.pid)).rc == 0  # as long again
    assert _lease_period(queue, first) == pytest.approx(90, abs=0.01)
    assert queue.run("recover").rc == 0 and queue.state(first) == "claimed"

    assert queue.run("renew", first, "--pid", str(child.pid), "--ttl", "0.001").rc == 0
    time.sleep(0.05)
    assert child.poll() is None  # the holder still runs: only the expiry proves it gone
    recovered = queue.run("recover", "--json")
    assert recovered.rc == 0, recovered
    assert first in json.dumps(recovered.json()["requeued"]), recovered
    assert queue.state(first) == "pending"
    assert queue.run("list", "--state", "pending").lines() == [first, second]
    renew_gone = queue.run("renew", first, "--pid", str(child.pid))
    assert renew_gone.rc == 1 and "pending" in renew_gone.err, renew_gone
    assert queue.claim("--pid", str(child.pid)) == first


CONFIG_BOUNDS = [
    (f"lease_ttl={DAYS_366}", True),
    ("grace=0", True),
    (f"lease_ttl={DAYS_366 + 1}", False),
    ("lease_ttl=0", False),
    ("lease_ttl=-1", False),
    ("lease_ttl=1e999", False),
    ("grace=nan", False),
    ("grace=inf", False),
    ("grace=-0.5", False),
]


def test_config_lease_ttl_and_grace_at_their_bounds(queue, child):
    """docs/queue.md "Configuration": ``lease_ttl`` is above 0 and at most 366 days, ``grace``
    a non-negative number of seconds.  At the bound a claim without ``--ttl`` takes that
    lifetime and ``grace=0`` makes a seconds-old stray temp stale; past it, commands refuse
    with EINVAL naming ``config:LINE`` and nothing moves.  §2.4 ``recover --grace``: 0 and
    366 days are taken (a day-old temp removed by the one, kept by the other); more, nan,
    inf or nothing is a usage error (exit 2) that removes nothing."""
    config = queue.dir / "config"
    good = config.read_text()
    temp = queue.dir / "inbox" / f"gone{SUFFIX}.publish.tmp"
    temp.write_text("{")
    age(temp, 5)
    probes = [("status",), ("claim", "--pid", str(child.pid)), ("recover",)]
    for n, (line, ok) in enumerate(CONFIG_BOUNDS):
        config.write_text(good)
        where = f"{config}:{config_line(queue)}"
        set_config(queue, line)
        before = snapshot(queue.dir)
        if not ok:
            refused = queue.run(*probes[n % len(probes)])
            assert refused.rc == 1, (line, refused)
            assert refused.err.startswith(f"ctx: EINVAL: {where}: "), (line, refused)
            assert snapshot(queue.dir) == before
            continue
        job = queue.publish(name=f"j{n}")
        dry = queue.run("recover", "--reconcile", "--dry-run", "--json")
        assert dry.rc == 0, dry
        stale = f"inbox/{temp.name}" in dry.json()["stale_temps"]
        assert stale == line.startswith("grace="), (line, dry)
        assert queue.claim("--pid", str(child.pid)) == job
        expected = DAYS_366 if line.startswith("lease_ttl") else 300
        assert _lease_period(queue, job) == pytest.approx(expected, abs=0.01)

    config.write_text(good)
    age(temp, 24 * 3600)
    for grace in (str(DAYS_366 + 1), "nan", "inf", ""):
        r = queue.run("recover", "--reconcile", "--grace", grace)
        assert r.rc == 2 and "Invalid value for '--grace'" in r.err, r
    assert queue.run("recover", "--reconcile", "--grace", str(DAYS_366)).rc == 0
    assert temp.exists()
    assert queue.run("recover", "--reconcile", "--grace", "0").rc == 0
    assert not temp.exists()
