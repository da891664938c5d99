"""End-to-end flows of ``ctx queue publish --batch`` fed odd JSON Lines (SPEC Q-1, Q-9, §2.1,
§2.4; docs/queue.md "publish", "Configuration", "Command line"): blank and whitespace-only
lines, CRLF and a lone CR, a last line without its newline, a byte order mark, NUL bytes,
lines that are JSON but no request, one bad line (or several) among good ones, fields that
look like job names, ``--name`` with ``--batch``, the ``--json`` answer, lines exactly at and
one byte over ``max_request_bytes`` with their line end across a read boundary, a binary file
given by mistake, 10 000 lines, a FIFO as JSONL_FILE (its writer slow, gone mid-line, or never
there), Ctrl-C, SIGTERM and SIGKILL in the middle of a large batch, the order claims then take
the batch's jobs, and a group member publishing under umask 077 for another member to claim.

After every refusal nothing is half-done (no job, no temp in ``inbox/``); after every
success each printed name is one pending job holding its line's request."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import subprocess
import termios
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    SUFFIX,
    QueueCLI,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.support.users import members_of, run_as

TRACEBACK = "Traceback (most recent call last)"
FROM, CREATED = "tester", "2026-06-22T12:00:00Z"
SCRATCH = scratch_top(__file__)
GROUP, MEMBER_A, MEMBER_B = "ctxpbx-g", "ctxpbx-a", "ctxpbx-b"


# ----------------------------------------------------------------------------------- helpers


def line(n: int, **extra) -> bytes:
    """One request as a JSON line (no line end), told apart by ``n``; ``from`` and ``created``
    given, so that what is stored is exactly the line, trimmed."""
    req = {"tool": "fs.stat", "input": {"path": "/", "n": n}, "from": FROM, "created": CREATED}
    req.update(extra)
    return json.dumps(req).encode()


def sized_line(size: int, n: int) -> bytes:
    """A valid request line of exactly ``size`` bytes."""
    body = {"tool": "fs.stat", "input": {"n": n}, "from": FROM, "created": CREATED, "pad": ""}
    body["pad"] = "p" * (size - len(json.dumps(body, separators=(",", ":"))))
    data = json.dumps(body, separators=(",", ":")).encode()
    assert len(data) == size
    return data


def batch(queue: QueueCLI, data: bytes, *flags: str):
    """``ctx queue publish --batch FLAGS -`` with ``data`` on stdin."""
    return queue.run("publish", "--batch", *flags, "-", input=data)


def stored(queue: QueueCLI, job: str) -> bytes:
    return (queue.dir / "pending" / job).read_bytes()


def n_of(queue: QueueCLI, job: str) -> int:
    return json.loads(stored(queue, job))["input"]["n"]


def no_traceback(run) -> None:
    assert TRACEBACK not in run.err and TRACEBACK not in run.out, run


def refused_whole(queue: QueueCLI, run, before: dict, *lines: int) -> None:
    """``run`` was refused with EINVAL, exit 1, naming each of ``lines``; the queue is as it
    was: nothing pending, no temp left in ``inbox/``."""
    no_traceback(run)
    assert run.rc == 1 and run.out == "", run
    assert run.err.startswith("ctx: EINVAL: batch refused, nothing published: "), run
    for number in lines:
        assert f"line {number} " in run.err or f"line {number}:" in run.err, (number, run)
    assert snapshot(queue.dir) == before


def set_config(queue: QueueCLI, text: str) -> None:
    config = queue.dir / "config"
    config.write_text(config.read_text() + text + "\n")


def wchan(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return ""


def unread_bytes(fd: int) -> int:
    """How many bytes written into a pipe or FIFO its reader has not read yet."""
    buf = bytearray(4)
    fcntl.ioctl(fd, termios.FIONREAD, buf)
    return int.from_bytes(buf, "little")


def open_writer(fifo: Path, proc: subprocess.Popen) -> int:
    """The write end of ``fifo``, once ``proc`` opened its read end (never blocking on a
    reader that already failed)."""
    fds: list[int] = []

    def opened() -> bool:
        try:
            fds.append(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            return proc.poll() is not None
        return True

    assert wait_for(opened, seconds=20, step=0.01) and fds, proc.poll()
    os.set_blocking(fds[0], True)
    return fds[0]


def started(queue: QueueCLI, *args: str) -> subprocess.Popen:
    argv = [*CTX_ARGV, "queue", "publish", "--project", queue.project, *args]
    return subprocess.Popen(
        argv,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def big_source(tmp_path: Path, count: int) -> Path:
    source = tmp_path / "big.jsonl"
    source.write_bytes(b"".join(line(n) + b"\n" for n in range(count)))
    return source


# ------------------------------------------------------------------ line ends and blank lines


def test_blank_lines_crlf_a_lone_cr_and_a_last_line_without_newline_each_give_one_job(queue):
    """§2.4 (one request per line; prints each J), §2.1 (stored as given, surrounding
    whitespace trimmed, one newline after): blank lines, lines of spaces and tabs, CRLF line
    ends, a lone CR as a line end, padding around a request and a last line without its
    newline give exactly one job per request, printed in line order and nothing else on
    stdout; each stored request is its line trimmed, without a CR, ending in one newline."""
    data = (
        line(0) + b"\r\n"
        + b"\r\n"
        + b"   \t  \n"
        + b"  " + line(1) + b" \t\r\n"
        + b"\n\n"
        + line(2) + b"\r"
        + b"\t" + line(3) + b"\n"
        + b" \r\n"
        + line(4)
    )  # fmt: skip
    done = batch(queue, data)
    no_traceback(done)
    assert done.rc == 0 and done.err == "", done
    names = done.lines()
    assert len(names) == len(set(names)) == 5 and all(n.endswith(SUFFIX) for n in names), done
    assert queue.entries("pending") == set(names) and queue.entries("inbox") == set()
    for n, job in enumerate(names):
        assert stored(queue, job) == line(n) + b"\n", job


def test_a_bad_line_is_named_by_its_number_counting_blank_lines_and_crlf(queue):
    """Q-1, §2.4 (one bad request refuses the whole batch before anything is written): with
    blank lines and CRLF line ends before it, the bad line is named by the number an editor
    shows it at, in the text error and in the ``--json`` error object (``error``, ``errno``,
    ``message``; no ``published`` list, since nothing was); nothing reaches ``pending/`` and
    no temp stays in ``inbox/``."""
    queue.publish(name="earlier")
    before = snapshot(queue.dir)
    data = line(0) + b"\r\n\r\n" + line(1) + b"\r\n   \r\n" + b'{"tool": "fs.stat", "input": \r\n'
    data += line(2) + b"\r\n"
    refused = batch(queue, data)
    refused_whole(queue, refused, before, 5)
    assert refused.err.startswith("ctx: EINVAL: batch refused, nothing published: line 5 is no")
    assert ";" not in refused.err, refused  # the one bad line, no other

    as_json = batch(queue, data, "--json")
    assert as_json.rc == 1 and as_json.err.startswith("ctx: EINVAL: "), as_json
    doc = as_json.json()
    assert doc["error"] == "EINVAL" and doc["errno"] == 22, doc
    assert "line 5 is not JSON" in doc["message"], doc
    assert not {"published", "not_published", "not_published_lines"} & set(doc), doc
    assert snapshot(queue.dir) == before


def test_lines_that_are_json_but_no_request_are_each_named(queue):
    """Q-1, §2.1 (a request is one JSON object with a ``tool`` string and an ``input``
    object; NaN, a name given twice, nesting deeper than 128 are EINVAL): a batch whose
    bad lines are all JSON names every one of them in one refusal, among good lines, and
    publishes none of the good ones."""
    before = snapshot(queue.dir)
    lines = [
        line(0),
        b"[1, 2]",
        b'"just a string"',
        line(3),
        b'{"tool": "fs.stat", "input": {"x": NaN}}',
        b'{"tool": "fs.stat", "input": {}, "tool": "shell.exec"}',
        b'{"tool": "fs.stat", "input": ' + b"[" * 200 + b"]" * 200 + b"}",
        line(7),
    ]
    refused = batch(queue, b"\n".join(lines) + b"\n")
    refused_whole(queue, refused, before, 2, 3, 5, 6, 7)
    assert "line 2 must be one JSON object, not an array" in refused.err, refused

    not_requests = [line(0), b'{"tool": "fs.stat"}', line(2), b'{"tool": "../x", "input": {}}']
    refused = batch(queue, b"\n".join(not_requests) + b"\n")
    refused_whole(queue, refused, before, 2, 4)
    assert "line 2: invalid request: field 'input'" in refused.err, refused


def test_a_byte_order_mark_or_nul_bytes_refuse_the_batch_naming_the_line(queue):
    """§2.1 (a request is JSON in UTF-8; a byte order mark is no part of JSON), Q-1: a batch
    saved with a BOM is refused naming line 1 and saying how to save it; a BOM starting a
    later line names that line; a line of NUL bytes, or a raw NUL inside a string, refuses
    the batch naming its line; a NUL written as the JSON escape ``\\u0000`` is a request like
    any other, stored as given."""
    before = snapshot(queue.dir)
    bom = b"\xef\xbb\xbf"
    refused = batch(queue, bom + line(0) + b"\n" + line(1) + b"\n")
    refused_whole(queue, refused, before, 1)
    assert "byte order mark" in refused.err and "without one" in refused.err, refused

    refused = batch(queue, line(0) + b"\n" + line(1) + b"\n" + bom + line(2) + b"\n")
    refused_whole(queue, refused, before, 3)
    assert "line 1" not in refused.err, refused

    refused = batch(queue, line(0) + b"\n\x00\x00\x00\n" + line(2) + b"\n")
    refused_whole(queue, refused, before, 2)

    raw_nul = line(1, note="a").replace(b'"a"', b'"a\x00b"')
    refused = batch(queue, line(0) + b"\n" + raw_nul + b"\n")
    refused_whole(queue, refused, before, 2)

    escaped = line(1, note="a").replace(b'"a"', b'"a\\u0000b"')
    done = batch(queue, line(0) + b"\n" + escaped + b"\n")
    assert done.rc == 0, done
    _, second = done.lines()
    assert stored(queue, second) == escaped + b"\n"
    assert json.loads(stored(queue, second))["note"] == "a\x00b"


def test_a_binary_file_given_by_mistake_is_refused_without_publishing_anything(queue, tmp_path):
    """Q-1, §2.4: ``--batch`` given a binary file (a gzip header, then 4 MB of random bytes)
    is refused with EINVAL naming its first line, exit 1, nothing published, no traceback.
    The header makes line 1 a line of bytes that are no UTF-8: random bytes alone begin with
    a line break about once in a hundred runs, and a blank line is skipped, not refused."""
    junk = tmp_path / "archive.bin"
    junk.write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(4 << 20))
    before = snapshot(queue.dir)
    refused = queue.run("publish", "--batch", junk)
    refused_whole(queue, refused, before, 1)


def test_the_refusal_of_a_binary_batch_stays_a_readable_message(queue, tmp_path):
    """§2.4 (errors go to stderr as ``ctx: ERRNO: sentence``; with ``--json`` the same error
    is one object on stdout): a user who gives a binary file to ``--batch`` by mistake
    reads a refusal naming the first bad lines, and how many more, as ``claim``'s notes name
    the first five jobs and how many more; not a message of megabytes, on stderr or in the
    ``--json`` object."""
    junk = tmp_path / "archive.bin"
    junk.write_bytes(os.urandom(4 << 20))
    refused = queue.run("publish", "--batch", "--json", junk)
    assert refused.rc == 1 and refused.json()["error"] == "EINVAL", refused.err[:300]
    assert len(refused.err) < 64 * 1024, f"{len(refused.err)} bytes of stderr"
    assert len(refused.out) < 64 * 1024, f"{len(refused.out)} bytes of stdout"


def test_an_empty_batch_a_directory_and_a_missing_file_publish_nothing(queue, tmp_path):
    """§2.4, Q-1: a batch with no request (no bytes, only blank lines, ``/dev/null``) is
    refused with EINVAL saying it holds no requests; a directory and a missing file are
    refused with EISDIR and ENOENT naming them; exit 1 each, nothing published."""
    before = snapshot(queue.dir)
    for data in (b"", b"\n\n", b" \t\r\n\r\n  "):
        empty = batch(queue, data)
        no_traceback(empty)
        assert empty.rc == 1 and empty.out == "", empty
        assert empty.err == "ctx: EINVAL: the batch holds no requests\n", empty
    devnull = queue.run("publish", "--batch", "/dev/null")
    assert devnull.rc == 1 and "holds no requests" in devnull.err, devnull
    folder = queue.run("publish", "--batch", tmp_path)
    assert folder.rc == 1 and folder.err.startswith("ctx: EISDIR: "), folder
    assert str(tmp_path) in folder.err
    missing = queue.run("publish", "--batch", tmp_path / "nope.jsonl")
    assert missing.rc == 1 and missing.err.startswith("ctx: ENOENT: "), missing
    assert snapshot(queue.dir) == before


# ------------------------------------------------------------------------------- job names


def test_a_request_cannot_choose_its_job_name_nor_collide_with_an_existing_job(queue):
    """§2.4 (``--name J`` belongs to a single publish; a batch prints each J), Q-1 (a name
    with evidence anywhere is never overwritten), §2.1 (every other field is kept): request
    fields that look like names (``name``, ``job``, one naming an existing job, one naming
    a path) are kept as fields, and every line gets a fresh job name of its own, identical
    lines included; the existing job is untouched.  ``--name`` with ``--batch`` is a usage
    error (exit 2; with ``--json`` an error object on stdout), and nothing is published."""
    existing = queue.publish(name="mine")
    kept = stored(queue, existing)
    lines = [
        line(0, name="mine"),
        line(1, name="mine.req.json", job="mine.req.json"),
        line(2, name="../../etc/passwd"),
        line(3),
        line(3),
    ]
    done = batch(queue, b"\n".join(lines) + b"\n", "--json")
    assert done.rc == 0 and done.err == "", done
    names = done.json()["names"]
    assert len(set(names)) == 5 and existing not in names, names
    assert all(n.startswith("job-") and n.endswith(SUFFIX) for n in names), names
    assert stored(queue, existing) == kept
    for job, given in zip(names, lines, strict=True):
        assert stored(queue, job) == given + b"\n"
    assert queue.entries("pending") == {existing, *names}

    before = snapshot(queue.dir)
    for flags in (("--name", "x"), ("--name", "x", "--json")):
        usage = batch(queue, line(9) + b"\n", *flags)
        no_traceback(usage)
        assert usage.rc == 2 and "--name cannot be used with --batch" in usage.err, usage
        if "--json" in flags:
            assert usage.json() == {
                "error": "EINVAL",
                "errno": 22,
                "message": "--name cannot be used with --batch",
            }, usage
        else:
            assert usage.out == "", usage
    assert snapshot(queue.dir) == before


def test_the_json_answer_of_a_batch_is_one_object_listing_names_in_line_order(queue):
    """§2.4 (``--json`` gives machine-readable output on stdout): a batch published with
    ``--json`` prints exactly one object, ``{"names": [...]}``, the names in line order,
    each pending with its line's request; stderr stays empty."""
    data = b"".join(line(n) + b"\r\n" for n in range(4))
    done = batch(queue, data, "--json")
    assert done.rc == 0 and done.err == "", done
    doc = done.json()
    assert list(doc) == ["names"] and len(done.out.splitlines()) == 1, done
    assert [n_of(queue, job) for job in doc["names"]] == [0, 1, 2, 3]


# -------------------------------------------------------------------------- the size limit


def test_lines_at_the_limit_pass_and_one_byte_over_refuses_across_a_read_boundary(queue):
    """§2.1 (size limit, configurable in ``queue/config``), docs/queue.md
    (``max_request_bytes`` limits each line of a batch; exactly the limit is accepted; a
    batch over it is EINVAL naming the line): with the limit at 65 535 bytes, lines of
    exactly the limit ending in CRLF, whose CR and LF fall in different 64 KiB reads, and a
    last line of exactly the limit without its newline, are published whole; a line one
    byte over, first or last, with or without a line end, and a padded line whose padding
    makes it one byte over, refuse the batch naming that line."""
    limit = 65535
    set_config(queue, f"max_request_bytes={limit}")
    exact = [sized_line(limit, n) for n in range(3)]
    done = batch(queue, exact[0] + b"\r\n" + exact[1] + b"\r\n" + exact[2])
    assert done.rc == 0, done
    for n, job in enumerate(done.lines()):
        assert stored(queue, job) == exact[n] + b"\n"

    before = snapshot(queue.dir)
    over = sized_line(limit + 1, 9)
    for data, number in (
        (over + b"\r\n" + exact[0] + b"\r\n", 1),
        (exact[0] + b"\r\n" + over + b"\r\n", 2),
        (exact[0] + b"\r\n" + over, 2),
        (exact[0] + b"\n\n" + b" " + exact[1] + b"\n", 3),
    ):
        refused = batch(queue, data)
        refused_whole(queue, refused, before, number)
        assert f"at most {limit} (max_request_bytes in queue/config)" in refused.err, refused


# -------------------------------------------------------------------------- a large batch


def test_ten_thousand_lines_give_ten_thousand_jobs_each_holding_its_line(queue, tmp_path):
    """Q-1, Q-9, Q-10, §2.4: a batch of 10 000 lines prints 10 000 distinct names in line
    order; name i holds line i, byte for byte; ``status`` counts them; claims take the first
    lines first; no temp stays in ``inbox/``."""
    count = 10_000
    source = big_source(tmp_path, count)
    done = queue.run("publish", "--batch", source)
    assert done.rc == 0 and done.err == "", (done.rc, done.err)
    names = done.lines()
    assert len(names) == len(set(names)) == count
    assert queue.entries("pending") == set(names) and queue.entries("inbox") == set()
    for n, job in enumerate(names):
        assert stored(queue, job) == line(n) + b"\n", job
    status = queue.run("status", "--json")
    assert status.rc == 0 and status.json()["pending"] == count, status
    holder = str(os.getpid())
    assert [queue.claim("--pid", holder) for _ in range(3)] == names[:3]


# ------------------------------------------------------------------------------- claim order


def test_claims_take_a_batch_in_line_order_between_the_jobs_around_it(queue):
    """Q-9 (claims take the oldest pending job first, by publish time): a batch, a single
    publish, then a second batch are claimed in exactly that order, line by line, also after
    a change to ``pending/`` made behind the queue's back (an entry made and removed there),
    which makes the next claim list the directory again; then the queue is empty (exit 3)."""
    first = batch(queue, b"".join(line(n) + b"\n" for n in range(5)))
    single = queue.publish()
    second = batch(queue, b"".join(line(n) + b"\n" for n in range(5, 10)))
    assert first.rc == second.rc == 0, (first, second)
    order = [*first.lines(), single, *second.lines()]
    holder = str(os.getpid())
    claimed = []
    for turn in range(len(order)):
        if turn == 3:
            poke = queue.dir / "pending" / ".poke"
            poke.write_bytes(b"")
            poke.unlink()
        claimed.append(queue.claim("--pid", holder))
    assert claimed == order
    empty = queue.run("claim", "--pid", holder)
    assert (empty.rc, empty.out) == (3, ""), empty


# ------------------------------------------------------------------------------ a FIFO source


def test_a_fifo_batch_publishes_only_once_its_writer_closes_and_in_line_order(queue, tmp_path):
    """§2.4 (JSONL_FILE), Q-1: a FIFO given as JSONL_FILE is read to its end before anything
    is published: while its writer has written lines but not closed it, nothing is pending
    and no temp is in ``inbox/``; once it closes, every line is published and named in
    order."""
    fifo = tmp_path / "requests.fifo"
    os.mkfifo(fifo)
    proc = started(queue, "--batch", str(fifo))
    fd = open_writer(fifo, proc)
    try:
        os.write(fd, line(0) + b"\n" + line(1) + b"\n")
        assert wait_for(lambda: unread_bytes(fd) == 0, seconds=20, step=0.01)
        assert proc.poll() is None
        assert queue.entries("pending") == set() and queue.entries("inbox") == set()
        os.write(fd, line(2) + b"\n" + line(3))
    finally:
        os.close(fd)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and err == b"", err
    names = out.decode().split()
    assert [n_of(queue, job) for job in names] == [0, 1, 2, 3]


def test_a_fifo_writer_gone_mid_line_refuses_the_whole_batch(queue, tmp_path):
    """Q-1, I-2: a writer that dies in the middle of its last line leaves a batch whose
    last line is not JSON: the whole batch is refused, naming that line, and the complete
    lines before it are not published either."""
    fifo = tmp_path / "requests.fifo"
    os.mkfifo(fifo)
    before = snapshot(queue.dir)
    proc = started(queue, "--batch", str(fifo))
    fd = open_writer(fifo, proc)
    os.write(fd, line(0) + b"\n" + line(1) + b"\n" + line(2)[:25])
    os.close(fd)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and out == b"", err
    assert err.decode().startswith("ctx: EINVAL: batch refused, nothing published: line 3 ")
    assert snapshot(queue.dir) == before


@pytest.mark.parametrize("writer", ["absent", "silent"])
def test_ctrl_c_while_a_fifo_batch_waits_for_input_publishes_nothing(queue, tmp_path, writer):
    """docs/queue.md (Ctrl-C: a batch interrupted while its requests are written publishes
    nothing; ``ctx: EINTR: …`` and exit 130): Ctrl-C while the batch waits for a FIFO's
    writer to open it, or for more lines from a writer that sent two and went quiet, ends
    it with EINTR and 130, nothing published and no temp left; a SIGKILL there leaves the
    queue as untouched."""
    fifo = tmp_path / "requests.fifo"
    os.mkfifo(fifo)
    before = snapshot(queue.dir)
    for sig in (signal.SIGINT, signal.SIGKILL):
        proc = started(queue, "--batch", str(fifo))
        fd = None
        if writer == "absent":
            waiting = wait_for(lambda p=proc: wchan(p.pid) == "wait_for_partner", 20, 0.01)
            assert waiting, wchan(proc.pid)
        else:
            fd = open_writer(fifo, proc)
            os.write(fd, line(0) + b"\n" + line(1) + b"\n")
            assert wait_for(lambda f=fd: unread_bytes(f) == 0, seconds=20, step=0.01)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        if fd is not None:
            os.close(fd)
        assert out == b"" and TRACEBACK.encode() not in err, err
        if sig == signal.SIGINT:
            assert proc.returncode == 130, err
            assert err.decode().strip().startswith("ctx: EINTR: "), err
        else:
            assert proc.returncode == -signal.SIGKILL
        assert snapshot(queue.dir) == before


# -------------------------------------------------------------------- signals in a big batch


def test_ctrl_c_in_the_middle_of_a_large_batch_publishes_all_or_nothing(queue, tmp_path):
    """docs/queue.md (a ``publish --batch`` interrupted while its requests are written
    publishes nothing; once the first of them moves into ``pending/``, the whole batch is
    published and every name printed), §2.4 (exit 130): Ctrl-C while a batch of 3 000 lines
    writes its temp files, and again once its first job is pending, leaves either nothing
    (no name printed, no temp) or the whole batch, every name printed in line order."""
    count = 3000
    source = big_source(tmp_path, count)
    outcomes = []
    for watched in ("inbox", "pending"):
        for job in queue.entries("pending"):
            (queue.dir / "pending" / job).unlink()
        proc = started(queue, "--batch", str(source))

        def reached(p=proc, d=queue.dir / watched) -> bool:
            with os.scandir(d) as entries:
                return any(True for _ in entries) or p.poll() is not None

        assert wait_for(reached, seconds=30, step=0.001)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        assert TRACEBACK.encode() not in err, err
        names = out.decode().split()
        pending = queue.entries("pending")
        assert queue.entries("inbox") == set(), watched
        if pending:
            assert len(names) == count and set(names) == pending, (watched, len(names))
            assert [n_of(queue, job) for job in names] == list(range(count))
        else:
            assert names == [], watched
        assert proc.returncode in (0, 130), (proc.returncode, err)
        if proc.returncode == 130:
            assert err.decode().strip().startswith("ctx: EINTR: "), err
        outcomes.append((watched, len(pending)))
    assert outcomes[1] == ("pending", count), outcomes


def test_sigterm_in_the_middle_of_the_moves_leaves_a_prefix_that_recover_settles(queue, tmp_path):
    """Q-1 (a crash during a batch may publish part of it), Q-6 and I-5 (stray temps in
    ``inbox/`` removed by ``recover --reconcile`` after the grace period; a second run
    changes nothing): a batch of 3 000 lines ended by SIGTERM (what ``timeout`` sends) once
    its moves began leaves the jobs of its first lines pending, in line order and each once,
    and the temps of all the others in ``inbox/``; ``status`` lists those temps; plain
    ``recover`` leaves them; ``--reconcile --grace 0`` removes them and keeps every pending
    job; publishing the lines not published then gives every line exactly one job."""
    count = 3000
    source = big_source(tmp_path, count)
    proc = started(queue, "--batch", str(source))

    def moving() -> bool:
        with os.scandir(queue.dir / "pending") as entries:
            return any(True for _ in entries) or proc.poll() is not None

    assert wait_for(moving, seconds=30, step=0.001)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert TRACEBACK.encode() not in err, err
    pending = queue.entries("pending")
    done_ns = sorted(n_of(queue, job) for job in pending)
    published = len(done_ns)
    assert done_ns == list(range(published)), "not a prefix of the batch's lines"
    assert set(out.decode().split()) <= pending
    temps = queue.entries("inbox")
    assert len(temps) == count - published and all(t.endswith(".publish.tmp") for t in temps)

    status = queue.run("status", "--json")
    assert status.rc == 0, status
    report = status.json()
    assert report["pending"] == published and len(report["temps"]) == len(temps), report
    plain = queue.run("recover")
    assert plain.rc == 0 and queue.entries("inbox") == temps, plain
    swept = queue.run("recover", "--reconcile", "--grace", "0", "--json")
    assert swept.rc == 0 and swept.json()["consistent"] is True, swept
    assert queue.entries("inbox") == set() and queue.entries("pending") == pending
    again = queue.run("recover", "--reconcile", "--grace", "0", "--json")
    assert again.rc == 0 and again.json()["removed_temps"] == [], again

    rest = tmp_path / "rest.jsonl"
    rest.write_bytes(b"".join(line(n) + b"\n" for n in range(published, count)))
    if published < count:
        assert queue.run("publish", "--batch", rest).rc == 0
    every = sorted(n_of(queue, job) for job in queue.entries("pending"))
    assert every == list(range(count))


# ----------------------------------------------------------------------- two group members


@pytest.mark.skipif(os.geteuid() != 0, reason="the two members are other uids: needs root")
def test_a_members_batch_under_umask_077_is_claimed_in_line_order_by_another_member():
    """X-1 and docs/queue.md "A queue shared by a group" (each request the protocol creates
    gets the group's ``rw`` whatever the umask), Q-9, §2.4: in a shared space of group G,
    member A publishes a batch from a shell with umask 077; each request in ``pending/`` is
    A's, of group G, readable and writable by the group; member B, whose claim order never
    saw the batch, claims the jobs in line order, finishes them, and the queue settles."""
    (a, b), gid = members_of(GROUP, MEMBER_A, MEMBER_B)
    top = new_scratch_dir(SCRATCH, "members-")
    storage = top / "storage"
    try:
        assert ctx_run("bootstrap", "--storage", storage).rc == 0
        env = clean_env(CTX_STORAGE=str(storage), HOME="/nonexistent")
        made = ctx_run("shared", "create", "team", "--group", GROUP, env=env)
        assert made.rc == 0, made
        queue = QueueCLI(storage, "team")
        data = "".join(line(n).decode() + "\n" for n in range(4))
        script = 'umask 077; exec "$@"'
        argv = ["sh", "-c", script, "sh", *CTX_ARGV, "queue", "publish", "-p", "team",
                "--batch", "-"]  # fmt: skip
        done = run_as(a, argv, a.groups, env=env, stdin=data)
        assert done.returncode == 0 and done.stderr == "", done
        names = done.stdout.split()
        assert len(names) == 4
        for job in names:
            st = (queue.dir / "pending" / job).stat()
            assert (st.st_uid, st.st_gid) == (a.uid, gid), job
            assert stat.S_IMODE(st.st_mode) & 0o060 == 0o060, oct(st.st_mode)

        holder = subprocess.Popen(["sleep", "300"], user=b.uid, group=b.gid, extra_groups=b.groups)
        try:
            claimed = []
            for _ in names:
                argv = [*CTX_ARGV, "queue", "claim", "-p", "team", "--pid", str(holder.pid)]
                got = run_as(b, argv, b.groups, env=env)
                assert got.returncode == 0, got
                job = got.stdout.strip()
                claimed.append(job)
                argv = [*CTX_ARGV, "queue", "finish", "-p", "team", job, "--ok", "-"]
                finished = run_as(b, argv, b.groups, env=env, stdin='{"ok": true}')
                assert finished.returncode == 0, finished
        finally:
            holder.kill()
            holder.wait()
        assert claimed == names
        assert all(queue.state(job) == "done" for job in names)
        settled = ctx_run("queue", "recover", "-p", "team", "--reconcile", "--json", env=env)
        assert settled.rc == 0 and settled.json()["consistent"] is True, settled
    finally:
        subprocess.run(["rm", "-rf", str(top)], check=False)
