"""Flows of an operator who edits a project queue's ``queue/config`` by hand (SPEC §2.1, Q-1 …
Q-5, Q-8, §2.4; docs/queue.md "Configuration", "Command line", docs/workers.md "The queue's
config while a worker runs"): every documented key (``max_request_bytes``,
``max_result_bytes``, ``lease_ttl``, ``grace``, ``move``) at its limits, zero, negative,
huge, as a float, as a word, with a trailing comment; unknown and repeated keys; blank
lines, comments holding odd bytes, tabs, CRLF line ends, a file of exactly 64 KiB; the
config made a socket or a character device, unreadable to a member of the queue's group,
and changed while ``publish``, ``publish --batch`` and ``ctx queue work`` run.

What must hold for each command (publish, publish --batch, claim, status, recover, init,
work): the value is honoured, or the command refuses with one ``ctx: ERRNO: …`` line naming
the config (and the line and key where there is one), ``--json`` giving the same message,
never a traceback, never a half-done publish or claim, and the queue left as it was."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    clean_env,
    ctx_run,
    new_scratch_dir,
    rfc3339,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.workercli import (
    allow_in_tool_policy,
    make_agent,
    running_worker,
    shell_job,
)
from tests.support.users import find_or_create_user, run_as

TOP = scratch_top(__file__)
REQ = {"tool": "fs.read", "input": {}}
REQ_TEXT = json.dumps(REQ, separators=(",", ":"))  # 29 bytes
BATCH_TEXT = REQ_TEXT + "\n" + REQ_TEXT + "\n"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acts as a second uid: needs root")


# ---------------------------------------------------------------------------------- helpers


def write_config(queue: QueueCLI, data: bytes) -> Path:
    """Replace ``queue/config`` with ``data``, as an editor that writes in place does."""
    config = queue.dir / "config"
    config.write_bytes(data)
    return config


def lease_period(queue: QueueCLI, job: str) -> float:
    lease = queue.lease(job)
    return (rfc3339(lease["expires_at"]) - rfc3339(lease["claimed_at"])).total_seconds()


def counts(queue: QueueCLI) -> dict:
    r = queue.run("status", "--json")
    assert r.rc == 0, r
    return r.json()["counts"]


def refused_alike(queue: QueueCLI, args: tuple[str, ...], prefix: str, stdin: str) -> str:
    """``ctx queue ARGS`` refuses with ``prefix`` on stderr, nothing on stdout and no traceback,
    and ``--json`` refuses with one error object carrying the same message; the message."""
    text = queue.run(*args, input=stdin)
    assert text.rc == 1 and text.out == "", (args, text)
    assert "Traceback" not in text.err and text.err.startswith(prefix), (args, text)
    assert text.err.count("\n") == 1, (args, text)
    as_json = queue.run(*args, "--json", input=stdin)
    assert as_json.rc == 1, (args, as_json)
    error = as_json.json()
    assert f"ctx: {error['error']}: {error['message']}\n" == text.err, (args, as_json, text)
    return text.err


@pytest.fixture
def scratch():
    """A directory below ``/tmp/<file stem>-<uid>/`` every uid may search, removed after."""
    made = new_scratch_dir(TOP)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@contextlib.contextmanager
def sleeper():
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


# ------------------------------------------------------ spellings an editor leaves: honoured


def test_odd_but_legal_spellings_are_honoured_by_publish_claim_and_recover(queue, child):
    """docs/queue.md "Configuration": blank lines, ``#`` comments (holding a NUL, a byte that is
    not UTF-8, an ``=``), tabs and blanks around keys and values, CRLF line ends, leading
    zeros, a lease lifetime in exponent form and a key given again (the later one counts) are
    all read as the operator meant: the request limit of ``000030`` takes a request of 30
    bytes and refuses 31 (EFBIG naming the key), a claim without ``--ttl`` leases for
    ``1e2`` seconds, and ``grace`` of ``.5`` makes a stray temp a second old stale."""
    config = write_config(
        queue,
        b"# limits for the nightly builds \xe9\x00 (max_request_bytes=5 was too small)\r\n"
        b"\r\n"
        b"\t max_request_bytes \t=\t 1 \r\n"
        b"   \t\r\n"
        b"max_request_bytes = 000030\r\n"
        b"lease_ttl=1e2\r\n"
        b"grace\t=.5\r\n"
        b"move=rename\r\n",
    )
    at_limit = '{"tool":"fs.read","input":{} }'
    assert len(at_limit) == 30
    job = queue.run("publish", "--name", "at-limit", "-", input=at_limit)
    assert job.rc == 0 and job.out == "at-limit.req.json\n", job
    over = queue.run("publish", "--name", "over", "-", input=at_limit + " ")
    assert over.rc == 1 and over.err.startswith("ctx: EFBIG: "), over
    assert "max_request_bytes" in over.err and "30" in over.err, over
    batch = queue.run("publish", "--batch", "-", input=at_limit + "\n" + at_limit + " x\n")
    assert batch.rc == 1 and "line 2" in batch.err and batch.out == "", batch

    assert queue.claim("--pid", str(child.pid)) == "at-limit.req.json"
    assert lease_period(queue, "at-limit.req.json") == pytest.approx(100, abs=0.01)

    temp = queue.dir / "inbox" / "gone.req.json.publish.tmp"
    temp.write_text("{")
    os.utime(temp, (temp.stat().st_atime - 1, temp.stat().st_mtime - 1))
    recovered = queue.run("recover", "--reconcile")
    assert recovered.rc == 0, recovered
    assert not temp.exists()
    assert queue.state("at-limit.req.json") == "claimed"
    assert config.read_bytes().startswith(b"# limits")  # nothing rewrote the operator's file
    assert counts(queue)["claimed"] == 1 and counts(queue)["pending"] == 0


def test_a_config_of_exactly_64_kib_is_read_and_one_byte_more_is_refused(queue):
    """docs/queue.md "Configuration": the file may be at most 64 KiB.  A config padded with
    comments to exactly 65 536 bytes, whose last line sets the request limit, is honoured;
    one byte more is EFBIG naming the file, its size and the limit, by every command."""
    setting = b"max_request_bytes=29\n"
    pad = 65536 - len(setting)
    config = write_config(queue, b"#" + b"-" * (pad - 2) + b"\n" + setting)
    assert config.stat().st_size == 65536
    assert queue.run("publish", "-", input=REQ_TEXT).rc == 0
    too_big = queue.run("publish", "-", input=REQ_TEXT + " ")
    assert too_big.rc == 1 and too_big.err.startswith("ctx: EFBIG: "), too_big

    write_config(queue, b"#" + b"-" * (pad - 1) + b"\n" + setting)
    before = snapshot(queue.dir)
    prefix = f"ctx: EFBIG: {config} is 65537 bytes; the limit is 65536"
    for args in (("publish", "-"), ("publish", "--batch", "-"), ("claim",), ("status",)):
        refused_alike(queue, args, prefix, BATCH_TEXT)
    assert snapshot(queue.dir) == before


def test_huge_limits_are_honoured_by_every_command(queue, child):
    """docs/queue.md "Configuration": a positive integer limit far beyond any file (10**30
    and a number of 4 299 digits, as an operator meaning "no limit" may write) is taken:
    publish, batch, claim, finish, show, status and recover all work as with the defaults,
    with no overflow in any read."""
    write_config(
        queue,
        f"max_request_bytes={10**30}\nmax_result_bytes={10**4298}\n".encode(),
    )
    first = queue.publish(REQ, name="first")
    batch = queue.run("publish", "--batch", "-", input=BATCH_TEXT)
    assert batch.rc == 0 and len(batch.lines()) == 2, batch
    assert queue.claim("--pid", str(child.pid)) == first
    finished = queue.run("finish", first, "--ok", "-", input='{"answer": ' + "7" * 4000 + "}")
    assert finished.rc == 0, finished
    shown = queue.run("show", first, "--json")
    assert shown.rc == 0 and shown.json()["state"] == "done", shown
    assert queue.run("recover", "--reconcile").rc == 0
    c = counts(queue)
    assert (c["pending"], c["done"], c["claimed"]) == (2, 1, 0), c


# --------------------------------------------------- values that are refused: every command alike

BAD_VALUES = [
    ("lease_ttl=600 # ten minutes", "lease_ttl"),
    ("lease_ttl=", "lease_ttl"),
    ("lease_ttl=0", "lease_ttl"),
    ("lease_ttl=-5", "lease_ttl"),
    ("lease_ttl=31622400.5", "lease_ttl"),
    ("lease_ttl=inf", "lease_ttl"),
    ("lease_ttl=1_000", "lease_ttl"),
    ("lease_ttl=5s", "lease_ttl"),
    ("lease_ttl=1" + "0" * 400, "lease_ttl"),
    ("grace=-1", "grace"),
    ("grace=31622401", "grace"),
    ("grace=1e999", "grace"),
    ("max_request_bytes=1e6", "max_request_bytes"),
    ("max_request_bytes=-1", "max_request_bytes"),
    ("max_request_bytes=1.5", "max_request_bytes"),
    ("max_request_bytes=" + "9" * 5000, "max_request_bytes"),
    ("max_result_bytes=0", "max_result_bytes"),
    ("move=RENAME", "move"),
    ("move=rename=link", "move"),
    ("LEASE_TTL=5", "LEASE_TTL"),
    ("lease_ttl", "lease_ttl"),
    ("=5", "=5"),
    ("lease_ttl=600\rgrace=5", "lease_ttl"),  # old Mac line ends: one line
]

COMMANDS = [
    ("publish", "-"),
    ("publish", "--batch", "-"),
    ("claim", "--pid", "1"),
    ("status",),
    ("recover", "--reconcile", "--grace", "0"),
    ("list",),
    ("init",),
]


# Three tests of every third value: each meets all the kinds of mistake, and all commands.
GROUPS = {f"every-third-from-{k}": range(k, len(BAD_VALUES), 3) for k in range(3)}


@pytest.mark.parametrize("group", list(GROUPS))
def test_a_bad_value_is_refused_alike_by_every_command_naming_file_line_and_key(queue, group):
    """docs/queue.md "Configuration" and §2.4 (errors are ``ctx: ERRNO: sentence``, the same
    object with ``--json``): a value out of range or not a number (a trailing comment, an
    empty value, zero, a sign, an underscore, a unit, 400 digits), an unknown or misspelt
    key, or a line that is not ``key=value`` stops each command before it does anything:
    EINVAL naming ``config:LINE`` and the key, in one line of bounded length (a value of
    thousands of digits is not reprinted), exit 1, and the queue unchanged."""
    waiting = queue.publish(REQ, name="waiting")
    config = queue.dir / "config"
    good = config.read_text()
    number = len(good.splitlines()) + 2
    for at in GROUPS[group]:
        line, key = BAD_VALUES[at]
        config.write_text(good + "\n" + line + "\n")
        before = snapshot(queue.dir)
        # Each value meets one command, in turn: every command meets three bad values.
        args = COMMANDS[at % len(COMMANDS)]
        said = refused_alike(queue, args, f"ctx: EINVAL: {config}:{number}: ", BATCH_TEXT)
        assert key in said and len(said) < 600, (line, args, said)
        assert snapshot(queue.dir) == before, line
    assert queue.state(waiting) == "pending"


# --------------------------------------------------------- a lease lifetime shorter than a claim


def test_a_config_lease_ttl_shorter_than_a_claim_is_etimedout_and_recover_requeues(queue, child):
    """docs/queue.md "Command line": a claim whose lease expires before it returns names no
    job: it fails with ETIMEDOUT (exit 1), telling the caller not to run it, and ``recover``
    returns it to pending.  The lifetime here comes from ``lease_ttl=0.000001`` in the config
    (legal: above 0), not from ``--ttl``."""
    job = queue.publish(REQ, name="short")
    write_config(queue, b"lease_ttl=0.000001\n")
    claimed = queue.run("claim", "--pid", str(child.pid))
    assert "Traceback" not in claimed.err, claimed
    assert claimed.rc == 1 and claimed.out == "", claimed
    assert claimed.err.startswith("ctx: ETIMEDOUT: "), claimed
    recovered = queue.run("recover")
    assert recovered.rc == 0, recovered
    assert queue.state(job) == "pending"


# ------------------------------------------------------------- what the config is on disk


def test_a_config_that_is_a_socket_is_named_as_one_by_every_command_and_init(queue, scratch):
    """docs/queue.md ``init`` ("a config that is a FIFO, a socket or a link … is refused with
    its full path (``ctx: EINVAL: …/config is a FIFO, not a regular file; move it aside, and
    'ctx queue init' writes the default config in its place``)") and Q-8: a socket left at
    ``queue/config`` is refused as such by publish, claim, status, recover and init, and the
    remedy is the one that works."""
    config = queue.dir / "config"
    config.unlink()
    with socket.socket(socket.AF_UNIX) as listener:
        short = scratch / "s"
        listener.bind(str(short))
        os.rename(short, config)
        before = snapshot(queue.dir)
        prefix = (
            f"ctx: EINVAL: {config} is a socket, not a regular file; move it aside, and "
            "'ctx queue init --project proj' writes the default config in its place"
        )
        for args in COMMANDS[::2]:
            refused_alike(queue, args, prefix, BATCH_TEXT)
        assert snapshot(queue.dir) == before


@needs_root
def test_a_config_that_is_a_character_device_is_refused_and_never_read(queue):
    """Q-8 and docs/queue.md "Configuration": a device node at ``queue/config`` (``/dev/zero``'s
    numbers: reading it would give endless NULs) is EINVAL "is a character device, not a
    regular file" with the remedy, by every command, ``init`` included; moved aside, ``init``
    writes the default config and publish works again."""
    config = queue.dir / "config"
    config.unlink()
    os.mknod(config, 0o644 | stat.S_IFCHR, os.makedev(1, 5))
    before = snapshot(queue.dir)
    prefix = f"ctx: EINVAL: {config} is a character device, not a regular file; move it aside"
    for args in COMMANDS[1::2]:
        refused_alike(queue, args, prefix, BATCH_TEXT)
    assert snapshot(queue.dir) == before
    config.unlink()
    init = queue.run("init")
    assert init.rc == 0 and "max_request_bytes=1048576\n" in config.read_text(), init
    assert queue.run("publish", "-", input=REQ_TEXT).rc == 0


def test_a_refusal_quoting_a_huge_line_stays_a_message_of_a_few_lines(queue):
    """docs/queue.md ("a binary file … is refused at once, in a message of a few lines", for a
    batch; values of thousands of digits are named, not reprinted): a config whose line is
    60 000 bytes of one key, or of text without ``=``, is refused (EINVAL naming
    ``config:1``) in a message that quotes only the start of it."""
    config = queue.dir / "config"
    for content in ("k" * 60000 + "=1\n", "y" * 60000 + "\n", "move=" + "r" * 60000 + "\n"):
        write_config(queue, content.encode())
        r = queue.run("status")
        assert r.rc == 1 and r.err.startswith(f"ctx: EINVAL: {config}:1: "), r.err[:200]
        assert len(r.err) < 2000, (content[:10], len(r.err))


def test_a_config_init_cannot_accept_stops_init_before_it_makes_anything(queue):
    """docs/queue.md ``init``: on an existing queue whose config names an unknown key, ``init``
    refuses with that error (exit 1) before anything is made: the missing ``done/`` stays
    missing, and the config is not rewritten; once the line is gone, ``init`` makes ``done/``."""
    config = write_config(queue, b"grace=5\nretries=3\n")
    (queue.dir / "done").rmdir()
    refused = queue.run("init")
    assert refused.rc == 1 and refused.out == "", refused
    assert refused.err.startswith(f"ctx: EINVAL: {config}:2: unknown key 'retries'"), refused
    assert not (queue.dir / "done").exists()
    assert config.read_bytes() == b"grace=5\nretries=3\n"
    write_config(queue, b"grace=5\n")
    ready = queue.run("init")
    assert ready.rc == 0 and (queue.dir / "done").is_dir(), ready
    assert config.read_bytes() == b"grace=5\n"


# --------------------------------------------------------------- a member of the queue's group


def _group_queue(user, scratch: Path) -> Path:
    """A queue made with ``init --queue`` and given to ``user``'s group, as a shared queue is:
    state directories ``02770`` of that group, ``queue/`` group-writable."""
    made = scratch / "q"
    r = ctx_run("queue", "init", "--queue", made)
    assert r.rc == 0, r
    for entry in [made, *made.iterdir()]:
        os.chown(entry, 0, user.gid)
        if entry.is_dir():
            entry.chmod(0o2770 if entry != made else 0o775)
    return made


def _as_member(user, queue: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    argv = [*CTX_ARGV, "queue", args[0], "--queue", str(queue), *args[1:]]
    return run_as(user, argv, env=clean_env(), stdin=stdin)


@needs_root
def test_a_member_who_may_not_read_the_config_is_refused_and_never_given_defaults(scratch):
    """docs/queue.md "A queue shared by a group": a ``queue/config`` a member may not read
    (mode 0600, the owner's) refuses that member's publish, batch, claim, status and recover
    with EACCES naming the file, its owner, group and mode, ``--json`` the same, and nothing
    is published with the default limits instead; made readable, the owner's limit holds
    for the member (a request over it is EFBIG)."""
    user = find_or_create_user()
    queue = _group_queue(user, scratch)
    config = queue / "config"
    config.write_text("max_request_bytes=29\n")
    config.chmod(0o600)
    before = snapshot(queue)
    for args in (("publish", "-"), ("publish", "--batch", "-"), ("claim", "--pid", "1")):
        for extra in ((), ("--json",)):
            done = _as_member(user, queue, *args, *extra, stdin=BATCH_TEXT + " ")
            assert done.returncode == 1 and "Traceback" not in done.stderr, done
            assert done.stderr.startswith("ctx: EACCES: "), done
            assert f"may not read {config} (owner uid 0, group {user.gid}, mode 0600)" in (
                done.stderr
            ), done
            if extra:
                assert json.loads(done.stdout)["error"] == "EACCES", done
    for args in (("status",), ("recover",)):
        done = _as_member(user, queue, *args)
        assert done.returncode == 1 and str(config) in done.stderr, done
    assert snapshot(queue) == before

    config.chmod(0o644)
    over = _as_member(user, queue, "publish", "-", stdin=REQ_TEXT + " ")
    assert over.returncode == 1 and over.stderr.startswith("ctx: EFBIG: "), over
    ok = _as_member(user, queue, "publish", "-", stdin=REQ_TEXT)
    assert ok.returncode == 0, ok


@needs_root
def test_move_link_in_the_config_is_honoured_for_a_member_who_may_not_link_a_request(scratch):
    """docs/queue.md "Durability primitives" (``move=rename|link`` forces the strategy) and the
    claim's notes: with ``move=link``, a request root wrote into ``pending/`` by hand (not
    writable by the group) is one the kernel will not let a member link
    (``fs.protected_hardlinks``): the member's claim exits 3 with a note naming it and
    ``move=link``; the config switched to ``move=rename``, the same member claims it."""
    if Path("/proc/sys/fs/protected_hardlinks").read_text().strip() != "1":
        pytest.skip("needs fs.protected_hardlinks=1")
    user = find_or_create_user()
    queue = _group_queue(user, scratch)
    with (queue / "config").open("a") as f:
        f.write("move=link\n")
    hand = queue / "pending" / "hand.req.json"
    hand.write_text(REQ_TEXT)
    hand.chmod(0o644)
    with sleeper() as holder:
        left = _as_member(user, queue, "claim", "--pid", str(holder.pid))
        assert left.returncode == 3 and left.stdout == "", left
        assert "move=link" in left.stderr and "hand.req.json" in left.stderr, left
        assert hand.exists() and os.listdir(queue / "claimed") == []
        with (queue / "config").open("a") as f:
            f.write("move=rename\n")
        taken = _as_member(user, queue, "claim", "--pid", str(holder.pid))
        assert taken.returncode == 0 and taken.stdout == "hand.req.json\n", taken
        assert (queue / "claimed" / "hand.req.json" / "hand.req.json").is_file()


# -------------------------------------------------------- the config changed while commands run


def _publisher(queue: QueueCLI, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*CTX_ARGV, "queue", "publish", "--project", queue.project, *args, "-"],
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_a_publish_reading_its_input_keeps_the_config_it_opened_the_queue_with(queue):
    """docs/queue.md "Configuration" (the file is read whole by every command that opens the
    queue): a ``publish --batch`` still reading stdin when the config is moved aside and a
    directory put in its place, and a ``publish`` whose limit is lowered below its request
    mid-read, complete with the config they read: every name printed is pending, nothing
    stays in ``inbox/``.  The next command meets the new config."""
    line = json.dumps({"tool": "fs.read", "input": {"pad": "x" * 60}}).encode() + b"\n"
    config = queue.dir / "config"
    batch = _publisher(queue, "--batch")
    batch.stdin.write(line)
    batch.stdin.flush()
    # The batch opens the queue, config included, before it reads its first line.
    assert wait_for(lambda: _reads_stdin(batch.pid))
    config.rename(queue.dir / "config.aside")
    config.mkdir()
    out, err = batch.communicate(line, timeout=30)
    assert batch.returncode == 0, err
    names = out.decode().split()
    assert len(names) == 2 and all(queue.state(n) == "pending" for n in names), (out, err)
    blocked = queue.run("publish", "-", input=REQ_TEXT)
    assert blocked.rc == 1 and "is a directory" in blocked.err, blocked
    config.rmdir()
    (queue.dir / "config.aside").rename(config)

    single = _publisher(queue)
    single.stdin.write(line[:20])
    single.stdin.flush()
    assert wait_for(lambda: _reads_stdin(single.pid))
    with config.open("a") as f:
        f.write("max_request_bytes=10\n")
    out, err = single.communicate(line[20:], timeout=30)
    assert single.returncode == 0, err
    assert queue.state(out.decode().strip()) == "pending"
    over = queue.run("publish", "-", input=line.decode())
    assert over.rc == 1 and over.err.startswith("ctx: EFBIG: "), over
    assert os.listdir(queue.dir / "inbox") == []
    assert counts(queue)["pending"] == 3


def _reads_stdin(pid: int) -> bool:
    """Whether process ``pid`` is blocked in a read (its wait channel says a pipe)."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state == "S" and "pipe" in wchan


@needs_root
def test_a_running_worker_keeps_its_lease_ttl_and_stops_at_an_unknown_key(searchable_storage):
    """docs/workers.md "The queue's config while a worker runs": a ``lease_ttl`` below a
    second in the config stops a worker before its first claim (exit 1, naming the config
    and both remedies); a worker started on ``lease_ttl=30`` keeps that lifetime when the
    config later says ``0.5`` (legal for a claim, not for a worker); an unknown key appended
    while it waits stops it at its next claim, exit 1 naming ``config:LINE``, and the job
    that woke it stays pending."""
    storage = searchable_storage
    make_agent(storage, ["shell.exec"])
    allow_in_tool_policy(storage, "shell.exec")
    queue = QueueCLI(storage, "proj")
    config = write_config(queue, b"lease_ttl=0.5\n")
    with running_worker(queue, "--drain") as refused:
        _, err = refused.communicate(timeout=30)
    assert refused.returncode == 1 and "Traceback" not in err, err
    assert err.startswith("ctx: EINVAL: ") and f"lease_ttl of {config}" in err, err
    assert "--ttl" in err

    write_config(queue, b"lease_ttl=30\n")
    with running_worker(queue, "--json") as worker:
        first = queue.publish(shell_job("sleep 1"), name="first")
        assert wait_for(lambda: queue.state(first) == "claimed")
        write_config(queue, b"lease_ttl=0.5\n")
        assert lease_period(queue, first) == pytest.approx(30, abs=0.01)
        assert wait_for(lambda: queue.state(first) == "done")
        second = queue.publish(shell_job("true"), name="second")
        assert wait_for(lambda: queue.state(second) == "done")
        with config.open("a") as f:
            f.write("# retries were asked for\nretries=3\n")
        third = queue.drop("third", shell_job("true"))
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 1 and "Traceback" not in err, err
    assert f"{config}:3: unknown key 'retries'" in err, err
    assert queue.state(third) == "pending"
    assert os.listdir(queue.dir / "claimed") == [] and os.listdir(queue.dir / "inbox") == []
