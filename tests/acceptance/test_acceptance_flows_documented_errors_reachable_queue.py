"""Every refusal the documents promise for the queue and its workers is reachable, with the
documented errno, exit status and nothing half-done (SPEC R-3, §2.1, Q-1 … Q-8, I-5, §2.4,
W-1, W-4; docs/queue.md "Layout and states", "A queue shared by a group" (EACCES, EROFS,
EPERM, ENOSPC), "The steps" (publish, claim, lease, finish), "What a crash leaves",
"Liveness", "What is not a job", "Configuration", "Command line"; docs/workers.md "Who may
start one", "After an upgrade", "One job", "A failed job's error and reason", "A result too
large"; docs/crash-model.md (the incomplete pairs recover reports); ``ctx queue … --help``
and ``ctx bootstrap --help``).

The angle: each sentence that says an input or a situation is refused, is an error, or
gives an errno or an exit status — the ones in the middle of long paragraphs, the option
values at their limits, the ``queue/config`` keys, ``--grace``, ``--ttl``, ``--pid``,
``--worker``, ``--batch`` contents, recover's refusals, the worker's options — is provoked
as a user would provoke it.  Each check reads the errno word on the ``ctx: ERRNO: sentence``
line, the same error as the one ``--json`` object (``error``, ``errno``, ``message``), the
documented exit status, and that the storage root (or the queue) is byte-for-byte what it
was before the refused command.  Limits are taken at their edges: the value just past a
documented bound is refused and the bound itself is accepted."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    rfc3339,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.workercli import allow_in_tool_policy, make_agent
from tests.support.storage import copy_of_root
from tests.support.users import find_or_create_user, run_as

TOP = scratch_top(__file__)
PROJECT = "proj"
GOOD = '{"tool":"fs.read","input":{"path":"README.md"}}'
AS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not AS_ROOT, reason="mounts, chattr or a second uid")


# ----------------------------------------------------------------------------------- world


class World(OnStorage):
    """A copy of the bootstrapped root (queue of project ``proj`` made) in a scratch
    directory every uid may search."""

    def __init__(self, top: Path, storage: Path) -> None:
        self.top = top
        self.storage = storage
        self.queue = QueueCLI(storage, PROJECT)
        self.dropped = 0

    @property
    def qdir(self) -> Path:
        return self.queue.dir

    def q(self, verb: str, *args, **kw) -> Run:
        return self.ctx("queue", verb, "--project", PROJECT, *args, **kw)

    def drop(self, name: str, text: str = GOOD) -> str:
        """Put a request straight into ``pending/`` (its only evidence, §2.1), each one
        dated a second after the one before, so that claims take them in this order."""
        job = f"{name}.req.json"
        path = self.qdir / "pending" / job
        path.write_text(text)
        self.dropped += 1
        then = time.time() - 3600 + self.dropped
        os.utime(path, (then, then))
        return job

    def publish(self, name: str, text: str = GOOD) -> str:
        r = self.q("publish", "--name", name, "-", input=text)
        assert r.rc == 0, r
        return r.out.strip()

    def claim(self, holder: int) -> str:
        r = self.q("claim", "--pid", str(holder))
        assert r.rc == 0, r
        return r.out.strip()


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(TOP, "w")
    try:
        yield World(top, copy_of_root(_template, top / "storage"))
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def holder() -> Iterator[subprocess.Popen]:
    """A live process of this test's own, standing in as a lease holder."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def dead_pid() -> int:
    """The pid of a process of ours that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def with_json(argv: tuple | list) -> list:
    """``argv`` with ``--json`` right after the (sub)command's name."""
    argv = [str(a) for a in argv]
    at = 2 if argv[0] == "queue" else 1
    return [*argv[:at], "--json", *argv[at:]]


def q_argv(verb: str, *args) -> list:
    return ["queue", verb, "--project", PROJECT, *map(str, args)]


def last_error(r: Run, errno_name: str) -> str:
    """The ``ctx: ERRNO: sentence`` line ``r`` ended with (usage text may come before it)."""
    assert "Traceback" not in r.err, r
    lines = r.err.rstrip("\n").splitlines()
    assert lines, r
    assert lines[-1].startswith(f"ctx: {errno_name}: "), r
    return lines[-1]


def refused(
    w: World,
    argv: tuple | list,
    status: int,
    errno_name: str,
    *,
    input: str | bytes = b"",
    env: dict | None = None,
    cwd: Path | None = None,
    watch: Path | None = None,
    mode: str = "json",
) -> str:
    """``ctx ARGV`` exits ``status`` and ``watch`` (default: the storage root) is unchanged.
    ``mode`` ``json``: run with ``--json``; the last stderr line is ``ctx: ERRNO: message``
    and stdout the one error object with the same ``error``, ``errno`` and ``message``.
    ``text``: run as given; the same stderr line and nothing on stdout.  ``both``: each of
    them.  The error line."""
    watch = watch or w.storage
    before = snapshot(watch)
    kw = {"input": input, "cwd": cwd, "env": env if env is not None else w.env}
    line = ""
    if mode in ("text", "both"):
        text = ctx_run(*argv, **kw)
        assert text.rc == status, text
        assert text.out == "", text
        line = last_error(text, errno_name)
        assert snapshot(watch) == before, text
    if mode in ("json", "both"):
        as_json = ctx_run(*with_json(argv), **kw)
        assert as_json.rc == status, as_json
        lines = as_json.out.splitlines()
        assert len(lines) == 1, as_json
        obj = json.loads(lines[0])
        assert obj["error"] == errno_name, as_json
        assert obj["errno"] == getattr(errno, errno_name), as_json
        json_line = last_error(as_json, errno_name)
        assert json_line == f"ctx: {errno_name}: {obj['message']}", as_json
        assert line in ("", json_line), (line, json_line)
        line = json_line
        assert snapshot(watch) == before, as_json
    return line


# ------------------------------------------------------------- names on the command line

ILLEGAL_JOB_NAMES = [
    pytest.param("bad/name", "show", id="R-3-no-slash"),
    pytest.param(".hidden", "finish", id="R-3-first-byte-a-letter-or-digit"),
    pytest.param("caf\u00e9", "renew", id="R-3-ascii-only"),
    pytest.param("", "show", id="R-3-at-least-one-byte"),
    pytest.param("a" * 56, "finish", id="R-3-at-most-64-bytes-with-the-suffix"),
]


@pytest.mark.parametrize(("name", "other"), ILLEGAL_JOB_NAMES)
def test_an_illegal_job_name_is_a_usage_error_of_every_command_that_takes_one(
    world: World, name: str, other: str
) -> None:
    """R-3, §2.4: a job name is an object name ending in ``.req.json`` (the suffix added to
    ``--name`` when missing); anything else is ``EINVAL``, and a malformed name on the
    command line is a usage error (exit 2) of publish, show, finish and renew alike."""
    line = refused(world, q_argv("publish", "--name", name, "-"), 2, "EINVAL", input=GOOD)
    assert "illegal job name" in line, line
    words = {"show": (name,), "finish": (name, "--ok", "-"), "renew": (name,)}[other]
    line = refused(world, q_argv(other, *words), 2, "EINVAL", input="{}", mode="text")
    assert "illegal job name" in line, line


# ------------------------------------------------------------------- EEXIST on publish


def _evidence(*entries: str) -> Callable[[Path], None]:
    """Entries to plant for job ``dup.req.json``: ``D/`` a directory, else a file."""

    def plant(q: Path) -> None:
        for entry in entries:
            path = q / entry.format(J="dup.req.json")
            if entry.endswith("/"):
                path.mkdir()
            else:
                path.write_text(GOOD)

    return plant


def _staged(kind: str) -> Callable[[Path], None]:
    def plant(q: Path) -> None:
        path = q / "inbox" / "dup.req.json.publish.tmp"
        if kind == "file":
            path.write_text("{")
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "symlink":
            path.symlink_to("/etc/passwd")
        else:
            path.mkdir()

    return plant


HELD_NAMES = [
    pytest.param(_evidence("pending/{J}"), "already pending", id="Q-1-in-pending"),
    pytest.param(
        _evidence("claimed/{J}/", "claimed/{J}/{J}", "lease/{J}/", "lease/{J}/worker"),
        "dup.req.json",
        id="Q-1-claimed-and-leased",
    ),
    pytest.param(_evidence("claimed/{J}/"), "empty claimed/", id="Q-1-an-empty-claimed-dir"),
    pytest.param(_evidence("lease/{J}/"), "already leased", id="Q-1-in-lease"),
    pytest.param(_evidence("done/{J}.result"), "already done", id="Q-1-a-result-alone-in-done"),
    pytest.param(_evidence("failed/{J}"), "already failed", id="Q-1-a-request-alone-in-failed"),
    pytest.param(_staged("file"), "being published by another process", id="step2-publisher"),
    pytest.param(_staged("fifo"), "is a FIFO", id="step2-a-FIFO-at-the-staging-name"),
    pytest.param(_staged("symlink"), "is a symlink", id="step2-a-symlink-at-the-staging-name"),
    pytest.param(_staged("dir"), "remove it by hand", id="step2-a-directory-is-never-removed"),
]


@pytest.mark.parametrize(("plant", "said"), HELD_NAMES)
def test_publish_refuses_a_name_held_anywhere_or_being_staged(
    world: World, plant: Callable[[Path], None], said: str
) -> None:
    """Q-1: publishing a name that already has evidence anywhere (pending, claimed, lease,
    done, failed) is refused with EEXIST, never overwritten; docs/queue.md publish step 2:
    ``inbox/J.publish.tmp`` is made with ``O_EXCL``, a second publisher is refused (EEXIST,
    "being published by another process"), so is a symlink or FIFO planted there (the
    refusal names what is there), and a directory there is never removed: the refusal says
    to remove it by hand.  Exit 1, nothing moved or followed."""
    plant(world.qdir)
    line = refused(world, q_argv("publish", "--name", "dup", "-"), 1, "EEXIST", input=GOOD)
    assert "dup.req.json" in line and said in line, line


# ----------------------------------------------------------- §2.1: what a request may hold

NEST_129 = '{"tool":"fs.read","input":{"a":' + "[" * 127 + "]" * 127 + "}}"
DIGITS_4301 = '{"tool":"fs.read","input":{"a":' + "9" * 4301 + "}}"
BAD_REQUESTS = [
    pytest.param('{"tool":"fs.read","input":{"n":NaN}}', "NaN", id="NaN"),
    pytest.param('{"tool":"fs.read","input":{"n":1e999}}', "1e999", id="beyond-largest-float"),
    pytest.param('{"tool":"a","input":{},"tool":"b"}', "twice", id="a-name-given-twice"),
    pytest.param(NEST_129, "128", id="nested-more-than-128-deep"),
    pytest.param(DIGITS_4301, "4300", id="integer-of-more-than-4300-digits"),
    pytest.param(
        '{"tool":"fs.read","input":{},"created":"2026-06-22T12:00:00"}',
        "time zone",
        id="created-without-a-zone",
    ),
    pytest.param('{"tool":"../../bin/sh","input":{}}', "tool", id="tool-not-an-object-name"),
    pytest.param(b'{"tool":"fs.read","input":{"s":"\xe9"}}', "UTF-8", id="not-UTF-8"),
]


@pytest.mark.parametrize(("text", "said"), BAD_REQUESTS)
def test_a_request_json_readers_disagree_on_is_einval(
    world: World, text: str | bytes, said: str
) -> None:
    """docs/queue.md "Layout and states": NaN and a number beyond the largest float
    (``1e999``) are refused with EINVAL in ``publish``; so is a name given twice in one
    object, nesting deeper than 128, an integer of more than 4 300 digits, a ``created``
    that is not RFC 3339 with a zone; §2.1: a request is one JSON object (UTF-8) with a
    ``tool`` (a tool name, R-3).  Exit 1, nothing published."""
    line = refused(world, q_argv("publish", "--name", "bad", "-"), 1, "EINVAL", input=text)
    assert said in line, line


def as_bytes(text: str | bytes) -> bytes:
    return text if isinstance(text, bytes) else text.encode()


def test_a_batch_with_bad_lines_is_refused_whole_naming_them_up_to_the_twentieth(world: World):
    """docs/queue.md: one bad request refuses the whole batch before anything is written
    (EINVAL, nothing published), naming each bad line up to the twentieth; its reading ends
    there ("and more from line N on, not read")."""
    fields = [BAD_REQUESTS[5].values[0], BAD_REQUESTS[6].values[0]]  # valid JSON, bad fields
    batch = "\n".join([GOOD, *fields, GOOD]) + "\n"
    line = refused(world, q_argv("publish", "--batch", "-"), 1, "EINVAL", input=batch)
    assert "nothing published" in line and "line 2: " in line and "line 3: " in line, line

    lines = [GOOD, GOOD, *(f"bad{i}" for i in range(25)), GOOD]
    batch = "\n".join(lines) + "\n"
    line = refused(world, q_argv("publish", "--batch", "-"), 1, "EINVAL", input=batch, mode="text")
    for number in range(3, 23):
        assert f"line {number} is" in line, (number, line)
    assert "line 2 is" not in line and "line 23 is" not in line, line
    assert line.endswith("; and more from line 23 on, not read"), line
    assert os.listdir(world.qdir / "pending") == []


def test_a_batch_names_its_bad_lines_of_both_kinds_together(world: World) -> None:
    """docs/queue.md "Configuration": "A batch with bad lines is refused whole (EINVAL,
    nothing published), naming each bad line up to the twentieth" — every one of the eight
    refusals of :data:`BAD_REQUESTS`, one a line after a good one, is named."""
    batch = b"\n".join([GOOD.encode(), *(as_bytes(p.values[0]) for p in BAD_REQUESTS)])
    line = refused(world, q_argv("publish", "--batch", "-"), 1, "EINVAL", input=batch + b"\n")
    assert "nothing published" in line and "line 1 is" not in line, line
    named = [
        n for n in range(2, 2 + len(BAD_REQUESTS)) if f"line {n} " in line or f"line {n}:" in line
    ]
    assert named == list(range(2, 2 + len(BAD_REQUESTS))), line


NOT_RFC3339 = [
    pytest.param("20260622T120000Z", id="ISO-8601-basic-format"),
    pytest.param("2026-W25-1T12:00:00Z", id="ISO-8601-week-date"),
    pytest.param("2026-06-22T12:00Z", id="no-seconds"),
    pytest.param("2026-06-22T12:00:00+0000", id="offset-without-colon"),
    pytest.param("2026-06-22T12Z", id="hours-alone"),
    pytest.param("2026-06-22T12:00:00,5Z", id="decimal-comma"),
    pytest.param("2026-06-22T12:00:00 Z", id="blank-before-zone"),
]


@pytest.mark.parametrize("stamp", NOT_RFC3339)
def test_a_created_that_is_iso_8601_but_not_rfc_3339_is_refused(world: World, stamp: str):
    """§2.1 ``"created": "<RFC 3339>"``; docs/queue.md: "a ``created`` given must be an
    RFC 3339 timestamp with a zone, kept as written".  RFC 3339 §5.6 ``date-time`` is
    ``YYYY-MM-DDThh:mm:ss[.frac](Z|±hh:mm)``: none of these is one (a ``created`` without a
    zone is refused with EINVAL, above)."""
    text = json.dumps({"tool": "fs.read", "input": {}, "created": stamp})
    line = refused(world, q_argv("publish", "--name", "odd", "-"), 1, "EINVAL", input=text)
    assert "created" in line, line


def test_the_documented_limits_themselves_are_accepted(world: World, holder) -> None:
    """The edges of the refusals: a name of 64 bytes with its suffix, nesting of exactly
    128, an integer of exactly 4 300 digits, RFC 3339's lower-case ``t``/``z`` and leap
    second (kept as written), a ``--worker`` of exactly 255 bytes (85 three-byte
    characters), a claim ``--ttl`` and a ``recover --grace`` of exactly 31 622 400 s,
    ``lease_ttl`` and ``grace`` of 366 days and a ``queue/config`` of exactly 64 KiB."""
    name55 = "n" * 55
    assert world.publish(name55) == name55 + ".req.json"
    nest128 = '{"tool":"fs.read","input":{"a":' + "[" * 126 + "]" * 126 + "}}"
    assert world.publish("nest128", nest128) == "nest128.req.json"
    digits = '{"tool":"fs.read","input":{"a":' + "9" * 4300 + "}}"
    assert world.publish("digits", digits) == "digits.req.json"
    lower = '{"tool":"fs.read","input":{},"created":"2026-06-30t23:59:60.5z"}'
    assert world.publish("lower", lower) == "lower.req.json"
    stored = json.loads((world.qdir / "pending" / "lower.req.json").read_text())
    assert stored["created"] == "2026-06-30t23:59:60.5z"

    worker = "\u20ac" * 85
    assert len(worker.encode()) == 255
    r = world.q("claim", "--pid", holder.pid, "--worker", worker, "--ttl", "31622400")
    assert r.rc == 0, r
    lease = world.queue.lease(r.out.strip())
    assert lease["worker"] == worker
    lifetime = rfc3339(lease["expires_at"]) - rfc3339(lease["claimed_at"])
    assert lifetime.total_seconds() == pytest.approx(31622400, abs=0.01)

    config = world.qdir / "config"
    body = config.read_bytes() + b"lease_ttl=31622400\ngrace=31622400\n"
    config.write_bytes(body + b"#" * (65536 - len(body) - 1) + b"\n")
    assert config.stat().st_size == 65536
    r = world.q("recover", "--grace", "31622400")
    assert r.rc == 0, r


# ------------------------------------------------------------------- size limits (EFBIG)


def run_stdin_from(w: World, argv: list, source: str) -> Run:
    with open(source, "rb") as stdin:
        done = subprocess.run(
            [*CTX_ARGV, *argv], stdin=stdin, capture_output=True, env=w.env, timeout=60
        )
    return Run(argv, done.returncode, done.stdout.decode(), done.stderr.decode())


def test_request_and_result_limits_refuse_one_byte_over(world: World, holder) -> None:
    """docs/queue.md "Configuration": ``max_request_bytes`` limits the request as given (the
    file's bytes for ``publish``, each line's for ``--batch``); a request of exactly the limit
    is accepted, one byte more is ``EFBIG`` (a batch: ``EINVAL`` naming the line, nothing
    published); nothing past the limit is read, so an endless source (``/dev/zero``) is
    refused too; a ``finish`` result file over ``max_result_bytes`` is ``EFBIG`` and the job
    stays claimed."""
    with (world.qdir / "config").open("a") as config:
        config.write("max_request_bytes=40\nmax_result_bytes=100\n")
    at_limit = '{"tool":"fs.read","input":{"p":"aaaa"}}\n'
    assert len(at_limit) == 40
    assert world.publish("edge", at_limit) == "edge.req.json"
    over = at_limit.replace("aaaa", "aaaaa")
    line = refused(world, q_argv("publish", "--name", "over", "-"), 1, "EFBIG", input=over)
    assert "at most 40" in line and "max_request_bytes" in line, line
    line_41 = '{"tool":"fs.read","input":{"p":"aaaaaa"}}'
    assert len(line_41) == 41
    batch = at_limit + line_41 + "\n"
    line = refused(world, q_argv("publish", "--batch", "-"), 1, "EINVAL", input=batch)
    assert "line 2" in line and "nothing published" in line, line

    before = snapshot(world.storage)
    endless = run_stdin_from(world, q_argv("publish", "-"), "/dev/zero")
    assert endless.rc == 1 and endless.out == "", endless
    last_error(endless, "EFBIG")
    assert snapshot(world.storage) == before

    job = world.claim(holder.pid)
    result = world.top / "result.txt"
    result.write_text("r" * 101)
    line = refused(world, q_argv("finish", job, "--ok", result), 1, "EFBIG")
    assert "101" in line and "max_result_bytes" in line, line
    assert world.queue.state(job) == "claimed"


# ------------------------------------------------------------------------ queue/config

CONFIG_LINES = [
    pytest.param("colour=blue", "unknown key 'colour'", id="unknown-key-with-its-line"),
    pytest.param("lease_ttl=0", "lease_ttl", id="lease_ttl-above-0"),
    pytest.param("lease_ttl=31622401", "lease_ttl", id="lease_ttl-at-most-366-days"),
    pytest.param("grace=31622401", "grace", id="grace-at-most-31622400"),
    pytest.param("move=copy", "move", id="move-rename-or-link"),
    pytest.param("just words", "key=value", id="a-line-that-is-no-key=value"),
]


@pytest.mark.parametrize(("extra", "said"), CONFIG_LINES)
def test_a_bad_config_line_refuses_every_command_with_its_line_number(
    world: World, extra: str, said: str
) -> None:
    """docs/queue.md "Configuration": unknown keys are refused with EINVAL and the line
    number; the value ranges of the table hold (``lease_ttl`` above 0 and at most 366 days,
    ``grace`` at most 31 622 400, ``move`` ``rename`` or ``link``); every command that opens
    the queue refuses (exit 1, SPEC §2.4), and the job pending stays pending."""
    world.drop("waiting")
    config = world.qdir / "config"
    number = len(config.read_text().splitlines()) + 1
    with config.open("a") as f:
        f.write(extra + "\n")
    prefix = f"ctx: EINVAL: {config}:{number}: "
    for argv, mode in ((q_argv("status"), "json"), (q_argv("claim"), "text")):
        line = refused(world, argv, 1, "EINVAL", mode=mode)
        assert line.startswith(prefix) and said in line, line


def _planted(kind: str) -> Callable[[Path], Path]:
    """Plant ``kind`` in the queue ``q``; the path the refusal must name."""

    def make(q: Path) -> Path:
        config = q / "config"
        if kind.startswith("done-"):
            done = q / "done"
            done.rmdir()
            if kind == "done-symlink":
                done.symlink_to(q.parent)
            else:
                done.write_text("")
            return done
        if kind == "too-big":
            with config.open("a") as f:
                f.write("#" * (65537 - config.stat().st_size - 1) + "\n")
            return config
        if kind == "unknown-key":
            with config.open("a") as f:
                f.write("colour=blue\n")
            return config
        config.rename(q / "config.real")
        if kind == "fifo":
            os.mkfifo(config)
        elif kind == "symlink":
            config.symlink_to("config.real")
        else:
            config.mkdir()
        return config

    return make


PLANTED = [
    pytest.param("fifo", "EINVAL", "is a FIFO, not a regular file", id="config-a-FIFO"),
    pytest.param("symlink", "ELOOP", "is a symlink", id="config-a-symlink"),
    pytest.param("dir", "EINVAL", "is a directory", id="config-a-directory"),
    pytest.param("unknown-key", "EINVAL", "unknown key", id="config-naming-an-unknown-key"),
    pytest.param("too-big", "EFBIG", "65537 bytes; the limit is 65536", id="config-over-64KiB"),
    pytest.param(
        "done-symlink", "ELOOP", "is a symlink, not a real directory", id="state-dir-a-symlink"
    ),
    pytest.param("done-file", "ENOTDIR", "not a real directory", id="state-dir-a-file"),
]


@pytest.mark.parametrize(("kind", "errno_name", "said"), PLANTED)
def test_init_refuses_what_no_command_opens_before_it_makes_anything(
    world: World, kind: str, errno_name: str, said: str
) -> None:
    """docs/queue.md: neither ``init`` nor another command calls a queue ready when its
    ``config`` is a FIFO or a link (refused with its full path before anything is made),
    names an unknown key, is over 64 KiB (``EFBIG``, its size and the limit named), or a
    state directory is a symlink or a file (exit 1); the only repair ``init`` makes is what
    is missing, and here it makes nothing: the missing ``pending/`` stays missing."""
    pending = world.qdir / "pending"
    pending.rmdir()
    named = _planted(kind)(world.qdir)
    line = refused(world, q_argv("init"), 1, errno_name)
    assert str(named) in line and said in line, line
    assert not pending.exists()
    pending.mkdir()
    line = refused(world, q_argv("status"), 1, errno_name, mode="text")
    assert str(named) in line and said in line, line


# --------------------------------------------------- option values at and past their limits

USAGE = [
    pytest.param(("claim", "--ttl", "0"), id="claim--ttl-above-0"),
    pytest.param(("claim", "--ttl", "31622400.5"), id="claim--ttl-at-most-31622400"),
    pytest.param(("claim", "--pid", "0"), id="claim--pid-at-least-1"),
    pytest.param(("claim", "--pid", "4194305"), id="claim--pid-at-most-4194304"),
    pytest.param(("claim", "--worker", ""), id="worker-id-at-least-1-byte"),
    pytest.param(("claim", "--worker", "\u00e9" * 128), id="worker-id-at-most-255-bytes"),
    pytest.param(("claim", "--worker", "a\u0085b"), id="worker-id-no-control-character"),
    pytest.param(("claim", "--worker", "a\u2028b"), id="worker-id-one-line"),
    pytest.param(("renew", "job.req.json", "--ttl", "0"), id="renew--ttl-above-0"),
    pytest.param(("recover", "--grace", "31622401"), id="recover--grace-at-most-366-days"),
    pytest.param(("work", "--ttl", "0.999"), id="work--ttl-at-least-1s"),
    pytest.param(("work", "--concurrency", "1025"), id="work--concurrency-at-most-1024"),
    pytest.param(("work", "--timeout", "31622401"), id="work--timeout-a-year-and-a-day"),
    pytest.param(("work", "--max-jobs", "0"), id="work--max-jobs-at-least-1"),
    pytest.param(("work", "--session", "a/b"), id="work--session-an-object-name"),
    pytest.param(("work", "--agent", ""), id="work--agent-empty-is-an-illegal-name"),
]


@pytest.mark.parametrize("words", USAGE)
def test_an_option_value_past_its_documented_range_is_exit_2_before_anything(
    world: World, words: tuple
) -> None:
    """§2.4 and docs/queue.md "Command line": a malformed number or name on the command line
    is a usage error, ``EINVAL``, exit 2; the help texts give the ranges (``--pid``
    1..4194304, ``--ttl`` 0<x<=31622400, ``--grace`` 0..31622400; ``work --ttl`` at least 1,
    ``--concurrency`` 1..1024, ``--timeout`` up to a year and a day, ``--max-jobs`` at least
    1); ``--worker`` is 1 to 255 bytes of one line of printable text, else ``EINVAL`` (exit
    2) "before a job is claimed"; docs/workers.md: an empty ``--agent ''`` is an illegal name
    (R-3): EINVAL, exit 2, nothing claimed.  A pending job is there, and stays pending."""
    world.drop("job")
    verb, *rest = words
    argv = q_argv(verb, *rest)
    if verb == "work":  # agent ci does not exist here: a worker would stop with exit 1
        argv += ["--drain"] if "--agent" in rest else ["--agent", "ci", "--drain"]
    refused(world, argv, 2, "EINVAL")
    assert world.queue.state("job.req.json") == "pending"


# ------------------------------------------------------------- leases that cannot be taken


def test_a_lease_shorter_than_the_claim_is_etimedout_and_recover_requeues_it(
    world: World, holder
) -> None:
    """docs/queue.md: a ``claim`` whose lease expires before it returns (``--ttl 0.000001``)
    names no job: it fails (ETIMEDOUT, exit 1), tells you not to run it, and ``recover``
    returns it to pending."""
    world.drop("brief")
    for as_json in (False, True):
        argv = q_argv("claim", "--pid", holder.pid, "--ttl", "0.000001")
        r = world.ctx(*(with_json(argv) if as_json else argv))
        assert r.rc == 1, r
        line = last_error(r, "ETIMEDOUT")
        assert "brief.req.json" in line and "do not run it" in line, r
        if as_json:
            assert json.loads(r.out)["error"] == "ETIMEDOUT", r
        else:
            assert r.out == "", r
        assert (world.qdir / "claimed" / "brief.req.json" / "brief.req.json").is_file()
        back = world.q("recover", "--json")
        assert back.rc == 0, back
        assert [e["job"] for e in back.json()["requeued"]] == ["brief.req.json"], back
        assert world.queue.state("brief.req.json") == "pending"


@contextlib.contextmanager
def process_with_a_thread() -> Iterator[tuple[int, int]]:
    code = "import threading,time\nthreading.Thread(target=time.sleep,args=(60,)).start()\n"
    proc = subprocess.Popen([sys.executable, "-c", code + "time.sleep(60)"])
    try:
        task = Path(f"/proc/{proc.pid}/task")
        assert wait_for(lambda: len(os.listdir(task)) >= 2, 10)
        tid = next(int(t) for t in os.listdir(task) if int(t) != proc.pid)
        yield proc.pid, tid
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def pid_namespace() -> Iterator[int | None]:
    """A new pid namespace (with its own /proc) of ours: the pid of its first process, or
    None where none can be made."""
    box = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "sleep", "60"],
        stderr=subprocess.DEVNULL,
    )
    try:
        children = Path(f"/proc/{box.pid}/task/{box.pid}/children")
        wait_for(lambda: box.poll() is not None or children.read_text().split() != [], 5)
        yield None if box.poll() is not None else int(children.read_text().split()[0])
    finally:
        box.kill()
        box.wait()


def test_a_lease_holder_no_lease_can_name_is_a_usage_error(world: World, holder) -> None:
    """docs/queue.md: a thread's id is no process id: ``--pid TID`` of a thread other than
    its process's first is EINVAL (exit 2), naming the process to give instead; a ``ctx``
    entered into a container's pid namespace (``nsenter``) has a parent outside it, which no
    lease can name: ``claim`` and ``renew`` then ask for ``--pid`` (exit 2)."""
    world.drop("first")
    world.drop("second")
    job = world.claim(holder.pid)
    with process_with_a_thread() as (pid, tid):
        for argv in (q_argv("claim", "--pid", tid), q_argv("renew", job, "--pid", tid)):
            line = refused(world, argv, 2, "EINVAL")
            assert f"{tid} is a thread of process {pid}" in line, line

    if not (AS_ROOT and shutil.which("unshare") and shutil.which("nsenter")):
        return
    with pid_namespace() as inner:
        if inner is None:
            return
        enter = ["nsenter", "--target", str(inner), "--pid", "--mount", "--"]
        before = snapshot(world.storage)
        for argv in (q_argv("claim"), q_argv("renew", job)):
            done = subprocess.run(
                [*enter, *CTX_ARGV, *argv], capture_output=True, text=True, env=world.env
            )
            r = Run(argv, done.returncode, done.stdout, done.stderr)
            assert r.rc == 2 and r.out == "", r
            assert "pass --pid" in last_error(r, "EINVAL"), r
        assert snapshot(world.storage) == before


# ------------------------------------------------------ finish and renew: evidence to judge


def _lease_edit(**fields) -> Callable[[Path, str], None]:
    def edit(q: Path, job: str) -> None:
        path = q / "lease" / job / "worker"
        lease = json.loads(path.read_text())
        lease.update(fields)
        path.write_text(json.dumps(lease))

    return edit


def _lease_as(kind: str) -> Callable[[Path, str], None]:
    def make(q: Path, job: str) -> None:
        lease = q / "lease" / job / "worker"
        if kind == "gone":
            lease.unlink()
        elif kind == "symlink":
            saved = q.parent / "lease.json"
            lease.rename(saved)
            lease.symlink_to(saved)
        else:
            lease.write_text("garbage")

    return make


def _request_a_fifo(q: Path, job: str) -> None:
    request = q / "claimed" / job / job
    request.rename(q.parent / "request.json")
    os.mkfifo(request)


LEASE = "lease/{J}/worker"
BROKEN_CLAIMS = [
    pytest.param(_lease_as("gone"), "ENOENT", LEASE, id="a-claim-without-a-lease-never-ran"),
    pytest.param(_lease_as("symlink"), "ELOOP", LEASE, id="a-lease-that-is-a-symlink"),
    pytest.param(_lease_as("garbage"), "EINVAL", LEASE, id="a-lease-that-does-not-parse"),
    pytest.param(_lease_edit(pid=99999999), "EINVAL", LEASE, id="a-pid-no-process-can-have"),
    pytest.param(
        _lease_edit(expires_at="10000-01-01T00:00:00Z"),
        "EINVAL",
        LEASE,
        id="a-lease-time-past-year-9999",
    ),
    pytest.param(_request_a_fifo, "EINVAL", "claimed/{J}/{J}", id="a-request-that-is-a-FIFO"),
]


@pytest.mark.parametrize(("breaks", "errno_name", "names"), BROKEN_CLAIMS)
def test_finish_and_renew_refuse_a_claim_whose_evidence_is_not_of_its_kind(
    world: World, holder, breaks: Callable[[Path, str], None], errno_name: str, names: str
) -> None:
    """docs/queue.md (end of "Command line"): a claim without a lease never ran (Q-3):
    ``finish`` refuses it with ENOENT and changes nothing; a lease that is not a lease (a
    symlink, a file that does not parse, a pid no process can have) is a conflict that
    ``finish`` and ``renew`` refuse with the lease's own error (ELOOP, EINVAL), naming the
    job and ``lease/J/worker``; a lease time outside the years 1 to 9999 makes the lease
    unreadable ("Liveness"); a request that is not a regular file is EINVAL naming
    ``claimed/J/J``.  Exit 1, nothing changed."""
    world.drop("j")
    job = world.claim(holder.pid)
    breaks(world.qdir, job)
    line = refused(world, q_argv("finish", job, "--ok", "-"), 1, errno_name, input="42")
    assert names.format(J=job) in line and job in line, line
    argv = q_argv("renew", job, "--pid", holder.pid)
    line = refused(world, argv, 1, errno_name, mode="text")
    assert names.format(J=job) in line, line


def test_finish_and_renew_of_jobs_they_cannot_act_on(world: World, holder) -> None:
    """docs/queue.md "Command line": ``finish`` and ``renew`` of a job that is not claimed
    say where it is instead (pending: claim it first; done: EEXIST from finish, with the
    ``ctx queue show`` that shows its result), or that the queue has no such job (ENOENT,
    ``ctx queue list`` lists those it has); either way exit 1.  ``renew`` by another process
    than the holder is EACCES (help text).  A finish that finds a result already in place
    beside the claimed request (another worker's) is EEXIST and changes nothing.  A result
    object's ``status`` must agree with ``--ok``/``--error`` (else EINVAL, exit 2), exactly
    one of the two is given (exit 2), and NaN in a result file is EINVAL."""
    for name in ("pend", "half", "held", "waiting"):
        world.drop(name)
    assert world.claim(holder.pid) == "pend.req.json"
    world.queue.finish("pend.req.json")
    assert world.claim(holder.pid) == "half.req.json"
    assert world.claim(holder.pid) == "held.req.json"
    cases = [
        (q_argv("finish", "waiting", "--ok", "-"), 1, "ENOENT", "is pending, not claimed"),
        (q_argv("renew", "waiting", "--pid", holder.pid), 1, "ENOENT", "is pending"),
        (q_argv("finish", "nosuch", "--ok", "-"), 1, "ENOENT", "'ctx queue list --project"),
        (q_argv("finish", "pend", "--error", "-"), 1, "EEXIST", "'ctx queue show pend.req"),
        (q_argv("renew", "held", "--pid", dead_pid()), 1, "EACCES", "only the holder renews"),
    ]
    for argv, status, errno_name, said in cases:
        line = refused(world, argv, status, errno_name, input="1")
        assert said in line, (argv, line)
    for flags, text, status in (
        (("--ok",), '{"status":"error","output":1}', 2),
        (("--error",), '{"status":"ok","output":1}', 2),
        ((), "1", 2),
        (("--ok",), '{"n": NaN}', 1),
    ):
        argv = q_argv("finish", "held", *flags, "-")
        refused(world, argv, status, "EINVAL", input=text, mode="text")
    assert world.queue.state("held.req.json") == "claimed"

    other = {"status": "ok", "output": 1, "worker": {"worker": "someone-else"}}
    (world.qdir / "done" / "half.req.json.result").write_text(json.dumps(other))
    line = refused(world, q_argv("finish", "half", "--ok", "-"), 1, "EEXIST", input="1")
    assert "nothing was changed" in line, line


# -------------------------------------------------------------- where the queue is found


def test_storage_and_queue_paths_the_documents_refuse(world: World) -> None:
    """docs/queue.md "Command line": an empty ``--storage`` (exit 2) or a set but empty
    ``$CTX_STORAGE`` (exit 1) is EINVAL, never the default; inside the storage root a queue
    path must be a project's queue (``--queue ROOT/queue``, ``--project ROOT/tool/q``:
    EINVAL, exit 2, nothing made); a relative ``--project`` with a ``/`` that names no queue
    directory (all six state directories present) is EINVAL (exit 2); an absolute one with
    no queue is ENOENT for every command but init; no project at all is a usage error; a
    storage root link that leads nowhere is ENOENT naming where it leads, and ``ctx
    bootstrap`` makes no root there."""
    root = world.storage
    for state in ("inbox", "pending", "lease", "claimed", "done"):  # failed/ missing
        (world.top / "five" / state).mkdir(parents=True)
    cases = [
        (["queue", "status", "--storage", "", "--project", PROJECT], None, 2, "EINVAL"),
        (["queue", "status", "--project", PROJECT], clean_env(CTX_STORAGE=""), 1, "EINVAL"),
        (["queue", "init", "--queue", root / "queue"], None, 2, "EINVAL"),
        (["queue", "init", "--project", root / "tool" / "q"], None, 2, "EINVAL"),
        (["queue", "init", "--project", "../escape"], None, 2, "EINVAL"),
        (["queue", "status", "--project", "./five"], None, 2, "EINVAL"),
        (["queue", "claim", "--project", world.top / "noq"], None, 1, "ENOENT"),
        (["queue", "claim"], None, 2, "EINVAL"),
    ]
    for argv, env, status, errno_name in cases:
        refused(world, argv, status, errno_name, env=env, cwd=world.top, watch=world.top)
    assert not (root / "queue").exists() and not (root / "tool" / "q").exists()

    link = world.top / "current"
    link.symlink_to(world.top / "release-moved-away")
    env = clean_env(CTX_STORAGE=str(link))
    for argv in (q_argv("init"), ["bootstrap"]):
        line = refused(world, argv, 1, "ENOENT", env=env, watch=world.top)
        assert str(link) in line and "release-moved-away" in line, line
    assert not (world.top / "release-moved-away").exists()


def test_a_space_reached_through_a_symlink_is_eloop_for_every_command(world: World) -> None:
    """docs/queue.md "What is not a job": a project's queue is opened one component at a
    time with ``O_NOFOLLOW``, so a symlink at ``shared/P`` is refused with ELOOP by every
    command, ``init`` and ``work`` included, and nothing is written through it; a queue path
    that reaches P's queue through a link is ELOOP (exit 1) naming ``--project P``."""
    elsewhere = world.top / "elsewhere"
    shutil.copytree(world.storage / "shared" / PROJECT, elsewhere, symlinks=True)
    (world.storage / "shared" / "lk").symlink_to(elsewhere)
    (elsewhere / "queue" / "pending" / "j.req.json").write_text(GOOD)
    for verb, *rest in (("init",), ("publish", "-"), ("claim",), ("work", "--drain")):
        argv = ["queue", verb, "--project", "lk", *rest]
        line = refused(world, argv, 1, "ELOOP", input=GOOD, watch=world.top)
        assert "shared/lk is a symlink" in line, line

    (world.top / "hl").symlink_to(world.storage / "shared" / PROJECT)
    argv = ["queue", "status", "--queue", world.top / "hl" / "queue"]
    line = refused(world, argv, 1, "ELOOP", watch=world.top)
    assert f"use --project {PROJECT}" in line, line


# --------------------------------------------------------------- closed standard streams


def closed(w: World, argv: list, redirect: str, stdin: str = "") -> Run:
    """``ctx ARGV`` started with ``redirect`` (``>&-`` or ``<&-``)."""
    argv = [str(a) for a in argv]
    done = subprocess.run(
        ["/bin/sh", "-c", f'exec "$@" {redirect}', "sh", *CTX_ARGV, *argv],
        input=stdin.encode(),
        capture_output=True,
        env=w.env,
        timeout=60,
    )
    return Run(argv, done.returncode, done.stdout.decode(), done.stderr.decode())


def test_commands_whose_answer_is_their_output_refuse_a_closed_stdout_before_acting(
    world: World, holder
) -> None:
    """docs/queue.md: started with standard output closed, ``publish`` and ``claim``, and
    every command given ``--json``, exit 1 with EBADF before anything is published, claimed,
    finished or recovered; a ``-`` given with standard input closed is refused the same
    way (closed, it would read as empty, an output a result may have)."""
    world.drop("first")
    world.drop("orphan")
    assert world.claim(holder.pid) == "first.req.json"
    assert world.claim(dead_pid()) == "orphan.req.json"  # a recover would requeue it
    world.drop("pending")
    before = snapshot(world.storage)
    cases = [
        (q_argv("claim"), ">&-", ""),
        (q_argv("publish", "-"), ">&-", GOOD),
        (with_json(q_argv("recover")), ">&-", ""),
        (with_json(q_argv("finish", "first", "--ok", "-")), ">&-", "1"),
        (q_argv("finish", "first", "--ok", "-"), "<&-", ""),
        (q_argv("publish", "--batch", "-"), "<&-", ""),
    ]
    for argv, redirect, stdin in cases:
        r = closed(world, argv, redirect, stdin)
        assert r.rc == 1, r
        last_error(r, "EBADF")
        assert snapshot(world.storage) == before, r


# ----------------------------------------------------- host refusals: EPERM, EROFS, ENOSPC


@contextlib.contextmanager
def immutable(path: Path) -> Iterator[None]:
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=False)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    if subprocess.run(["mount", "--bind", str(path), str(path)]).returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
        yield
    finally:
        subprocess.run(["umount", str(path)], check=False)


@needs_root
def test_an_immutable_or_read_only_directory_refuses_with_its_remedy(world: World, holder):
    """docs/queue.md: a write refused by a directory's immutable attribute is EPERM naming the
    attribute and the ``chattr -i DIR`` that removes it; one refused because the filesystem
    is read-only is EROFS saying so (remount it read-write); ``publish`` says "nothing was
    published", ``claim`` "nothing was claimed (job J stays pending)", ``finish`` that the
    job stays claimed; exit 1, nothing half-done."""
    inbox = world.qdir / "inbox"
    with immutable(inbox):
        line = refused(world, q_argv("publish", "--name", "x", "-"), 1, "EPERM", input=GOOD)
        assert f"chattr -i {inbox}" in line and "nothing was published" in line, line

    world.drop("p1")
    world.drop("p2")
    job = world.claim(holder.pid)
    with read_only(world.qdir):
        argv = q_argv("publish", "--name", "x", "-")
        line = refused(world, argv, 1, "EROFS", input=GOOD, mode="text")
        assert "remount it read-write" in line and "nothing was published" in line, line
        line = refused(world, q_argv("claim", "--pid", holder.pid), 1, "EROFS")
        assert "nothing was claimed (job p2.req.json stays pending)" in line, line
        line = refused(world, q_argv("finish", job, "--ok", "-"), 1, "EROFS", mode="text")
        assert f"job {job} stays claimed" in line, line


@contextlib.contextmanager
def tmpfs(mountpoint: Path, options: str) -> Iterator[Path]:
    mountpoint.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mountpoint)]
    if subprocess.run(mount).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=False)


def use_up_inodes(top: Path) -> list[Path]:
    """Files made in ``top`` until its filesystem has no inode left."""
    made: list[Path] = []
    with contextlib.suppress(OSError):
        while True:
            path = top / f"fill{len(made)}"
            path.touch()
            made.append(path)
    return made


@needs_root
def test_a_step_refused_for_want_of_inodes_keeps_its_errno_and_undoes_itself(
    world: World, holder
) -> None:
    """docs/queue.md: a step refused for want of a resource keeps its errno (ENOSPC), names
    the directory that refused and what ran short (``free inodes on that filesystem`` when
    bytes are left), what was and was not done: ``publish`` "nothing was published",
    ``claim`` "nothing was claimed (job J stays pending)" (a claim refused after its move
    puts the job back in ``pending/``), ``renew`` that the lease is unchanged and when it
    expires, ``finish`` that the job stays claimed and no result was written.  Exit 1."""
    with tmpfs(world.top / "fs", "size=4m,nr_inodes=32") as fs:
        qdir = fs / "q"
        env = world.env

        def queue(verb: str, *args) -> list:
            return ["queue", verb, "--queue", qdir, *map(str, args)]

        assert ctx_run(*queue("init"), env=env).rc == 0
        for name in ("a", "b"):
            assert ctx_run(*queue("publish", "--name", name, "-"), input=GOOD, env=env).rc == 0
        assert ctx_run(*queue("claim", "--pid", holder.pid), env=env).out == "a.req.json\n"
        fill = use_up_inodes(fs)
        cases = [
            (queue("publish", "--name", "c", "-"), "nothing was published"),
            (queue("claim", "--pid", holder.pid), "nothing was claimed (job b.req.json stays"),
            (queue("renew", "a", "--pid", holder.pid), "the lease on a.req.json is unchanged"),
            (queue("finish", "a", "--ok", "-"), "job a.req.json stays claimed and no result"),
        ]
        for argv, said in cases:
            line = refused(world, argv, 1, "ENOSPC", input=GOOD, watch=qdir)
            assert said in line and "free inodes on that filesystem" in line, line
            assert "0 inodes free" in line, line
        fill[0].unlink()  # one inode: room for claimed/J, none for the lease after the move
        line = refused(world, queue("claim", "--pid", holder.pid), 1, "ENOSPC", watch=qdir)
        assert "nothing was claimed (job b.req.json stays pending)" in line, line


# ---------------------------------------------------------------- recover and readers


def test_recover_reports_what_it_may_not_resolve_and_changes_nothing(world: World) -> None:
    """Q-6 and docs/queue.md: plain ``recover`` reports an incomplete pair (a claim without
    a lease) and changes nothing, exit 1; ``--dry-run --reconcile`` changes nothing and exits
    as the queue stands (1); a conflict (J both pending and done) is reported by ``status``,
    ``show`` and ``list --state conflict`` (exit 1) and never resolved by ``recover
    --reconcile`` (exit 1).  "What a crash leaves": what recover cannot do for a job is an
    ``error`` line (in ``--json`` an ``errors`` entry with the errno under ``error``) naming
    the attribute and the ``chattr`` that removes it, ending "left as it is"; ``--dry-run``
    makes the same checks and says the same."""
    q = world.qdir
    (q / "claimed" / "half.req.json").mkdir()
    (q / "claimed" / "half.req.json" / "half.req.json").write_text(GOOD)
    world.queue.drop("both")
    world.queue.terminal("both")
    before = snapshot(world.storage)
    for extra in ((), ("--reconcile", "--dry-run")):
        r = world.q("recover", "--json", *extra)
        assert r.rc == 1, r
        report = r.json()
        assert report["consistent"] is False, r
        assert {e["job"] for e in report["conflicts"]} == {"both.req.json"}, r
        planned = report["incomplete"] if not extra else report["repaired"]
        assert [e["job"] for e in planned] == ["half.req.json"], r
        assert snapshot(world.storage) == before, r
    for argv in (q_argv("show", "both"), q_argv("list", "--state", "conflict")):
        r = world.ctx(*argv)
        assert r.rc == 1 and "both.req.json" in r.out, r
    r = world.q("recover", "--reconcile", "--json")
    assert r.rc == 1, r
    assert {e["job"] for e in r.json()["conflicts"]} == {"both.req.json"}, r
    assert world.queue.state("half.req.json") == "pending"  # the incomplete pair, completed
    assert (q / "pending" / "both.req.json").is_file() and (q / "done" / "both.req.json").is_file()

    if not AS_ROOT:
        return
    for entry in ("pending/both.req.json", "pending/half.req.json", "done/both.req.json"):
        (q / entry).unlink()
    (q / "done" / "both.req.json.result").unlink()
    world.drop("stuck")
    world.drop("free")
    assert world.claim(dead_pid()) == "stuck.req.json"
    with immutable(q / "claimed" / "stuck.req.json" / "stuck.req.json"):
        before = snapshot(world.storage)
        for extra in (("--dry-run",), ()):
            r = world.q("recover", "--json", *extra)
            assert r.rc == 1, r
            (error,) = r.json()["errors"]
            assert error["job"] == "stuck.req.json" and error["error"] == "EPERM", r
            assert "chattr -i" in error["detail"] and error["detail"].endswith("left as it is")
            assert snapshot(world.storage) == before, r
        text = world.q("recover")
        assert text.rc == 1, text
        assert f"error    stuck.req.json: {error['detail']}" in text.out, text
    assert world.queue.state("stuck.req.json") == "claimed"
    assert os.listdir(q / "pending") == ["free.req.json"]


def test_what_claim_says_when_it_passes_jobs_over_or_hands_out_a_malformed_one(world: World):
    """§2.4 and docs/queue.md: on an empty queue ``claim`` prints nothing, with or without
    ``--json``, and exits 3; when jobs are pending but none could be claimed, the exit 3
    comes with a ``ctx: note:`` for each reason, naming the jobs (``claimed/J`` there
    already, a ``lease/J`` with no claim, J in ``done/`` too) and nothing changes.  A request
    put in ``pending/`` by hand that is not valid is claimed as malformed: ``claim --json``
    gives ``{"tool": null, "input": {}, "invalid": REASON}`` and stderr says ``ctx: note: the
    request of J is not valid (REASON): finish it with --error, as a worker does``; one
    published with a field of its own named ``invalid`` is given as stored, with no note."""
    for as_json in (False, True):
        argv = q_argv("claim")
        r = world.ctx(*(with_json(argv) if as_json else argv))
        assert (r.rc, r.out, r.err) == (3, "", ""), r
    q = world.qdir
    world.drop("a1")
    (q / "claimed" / "a1.req.json").mkdir()
    world.drop("a2")
    (q / "lease" / "a2.req.json").mkdir()
    world.drop("a3")
    world.queue.terminal("a3")
    before = snapshot(world.storage)
    r = world.ctx(*with_json(q_argv("claim")))
    assert r.rc == 3 and r.out == "", r
    notes = r.err.splitlines()
    assert len(notes) == 3 and all(n.startswith("ctx: note: ") for n in notes), r
    assert "with claimed/J there already: a1.req.json" in notes[0], r
    assert "with a lease/J and no claim: a2.req.json" in notes[1], r
    assert "in done/ or failed/ too, a conflict: a3.req.json" in notes[2], r
    assert snapshot(world.storage) == before, r
    # docs/workers.md "Many jobs": a drained worker that leaves jobs pending still exits 0,
    # names them on stderr as claim does, and lists them in the stop event's left_pending.
    r = world.q("work", "--drain", "--json")
    assert r.rc == 0, r
    stop = json.loads(r.out.splitlines()[-1])
    assert stop["event"] == "stop" and stop["left_pending"] == {
        "a1.req.json": "claimed",
        "a2.req.json": "leased",
        "a3.req.json": "finished",
    }, r
    assert [n for n in r.err.splitlines() if n.startswith("ctx: note: ")] == notes, r
    assert snapshot(world.storage) == before, r

    for job in ("a1", "a2", "a3"):
        (q / "pending" / f"{job}.req.json").unlink()
    world.drop("hand", "[1, 2]")
    r = world.ctx(*with_json(q_argv("claim", "--pid", os.getpid())))
    assert r.rc == 0, r
    req = r.json()["request"]
    assert req["tool"] is None and req["input"] == {} and req["invalid"], r
    note = (
        f"ctx: note: the request of hand.req.json is not valid ({req['invalid']}): "
        "finish it with --error, as a worker does\n"
    )
    assert r.err == note, r
    world.publish("own", '{"tool":"fs.read","input":{},"invalid":"mine"}')
    r = world.ctx(*with_json(q_argv("claim", "--pid", os.getpid())))
    assert r.rc == 0 and r.err == "", r
    assert r.json()["request"]["invalid"] == "mine" and r.json()["request"]["tool"] == "fs.read"


# -------------------------------------------------------------------------------- workers


def worker_refused(argv: list, errno_name: str, watch: Path, env: dict, user=None) -> str:
    """``ctx queue work ARGV --json`` (as ``user``) exits 1 with ``errno_name``, its last
    stdout line the error object, and ``watch`` as it was (the pending job still there)."""
    before = snapshot(watch)
    full = [*CTX_ARGV, *map(str, argv), "--json"]
    if user is None:
        done = subprocess.run(full, capture_output=True, text=True, env=env, timeout=60)
    else:
        done = run_as(user, full, env=env)
    r = Run(full, done.returncode, done.stdout, done.stderr)
    assert r.rc == 1, r
    line = last_error(r, errno_name)
    obj = json.loads(r.out.splitlines()[-1])
    assert obj["error"] == errno_name and line == f"ctx: {errno_name}: {obj['message']}", r
    assert snapshot(watch) == before, r
    return line


def test_a_worker_refuses_before_its_first_claim(world: World) -> None:
    """docs/workers.md: a ``lease_ttl`` under one second in ``queue/config`` stops the worker
    before its first claim (exit 1, naming that file and both remedies); a worker for an
    agent that does not exist claims nothing; core tools installed by another version stop
    it with EINVAL ("run 'ctx bootstrap'", the jobs stay pending); "Who may start one": a
    worker with an agent started by anyone but root or the storage root's owner exits 1
    with ``EACCES: only the host administrator …`` and claims nothing."""
    make_agent(world.storage, ["shell.exec"])
    world.drop("job", '{"tool":"shell.exec","input":{"cmd":"true"}}')
    work = q_argv("work", "--agent", "ci", "--drain")
    env = world.env

    config = world.qdir / "config"
    saved = config.read_bytes()
    config.write_bytes(saved + b"lease_ttl=0.5\n")
    line = worker_refused(work, "EINVAL", world.qdir, env)
    assert str(config) in line and "lease_ttl" in line and "--ttl" in line, line
    config.write_bytes(saved)

    line = worker_refused(q_argv("work", "--agent", "nosuch", "--drain"), "ENOENT", world.qdir, env)
    assert "no agent 'nosuch'" in line, line

    core = world.storage / "tool" / "fs.read"
    original = core.read_bytes()
    first, stamp, rest = original.split(b"\n", 2)
    assert stamp.startswith(b"#cortexfs-bundle "), stamp
    at = len(b"#cortexfs-bundle ")
    other = b"0" if stamp[at : at + 1] != b"0" else b"1"
    core.write_bytes(b"\n".join([first, stamp[:at] + other + stamp[at + 1 :], rest]))
    line = worker_refused(work, "EINVAL", world.qdir, env)
    assert "run 'ctx bootstrap'" in line and "claimed no job" in line, line
    core.write_bytes(original)

    if not AS_ROOT:
        return
    user = find_or_create_user()
    theirs = world.top / "theirs"
    theirs.mkdir()
    os.chown(theirs, user.uid, user.gid)
    qdir = theirs / "q"
    made = run_as(user, [*CTX_ARGV, "queue", "init", "--queue", str(qdir)], env=env)
    assert made.returncode == 0, made.stderr
    argv = [*CTX_ARGV, "queue", "publish", "--queue", str(qdir), "--name", "j", "-"]
    made = run_as(user, argv, env=env, stdin=GOOD)
    assert made.returncode == 0, made.stderr
    argv = ["queue", "work", "--queue", qdir, "--agent", "ci", "--drain"]
    line = worker_refused(argv, "EACCES", qdir, env, user=user)
    assert line.startswith("ctx: EACCES: only the host administrator"), line


def test_failed_jobs_carry_the_documented_error_and_reason(world: World) -> None:
    """docs/workers.md "One job" and "A failed job's error and reason": a non-zero exit
    without an errno has ``error``/``errno`` null, stage ``exit``, ``reason`` ``shell.exec
    exited with status 3: <its last stderr line> [exit]``; a schema error is EINVAL (stage
    ``schema``); a tool its own policy does not allow is ``EACCES: step 6 (tool/model
    policy): … [authorize]``; a malformed request put in ``pending/`` by hand is EINVAL at
    stage ``request``; "A result too large": over ``max_result_bytes`` the job fails with
    ``EFBIG: … [finish]`` and ``output_omitted``; a timeout is ETIMEDOUT at stage ``run``.
    A worker started without an agent (an empty ``$CTX_AGENT`` counts as unset) warns once
    and finishes each job in ``failed/`` with ``EACCES: this worker was started without
    --agent …`` at stage ``authorize``."""
    world.drop("anon", '{"tool":"shell.exec","input":{"cmd":"true"}}')
    r = world.q("work", "--drain", env=clean_env(CTX_STORAGE=str(world.storage), CTX_AGENT=""))
    assert r.rc == 0, r
    warnings = [line for line in r.err.splitlines() if line.startswith("ctx: warning: ")]
    assert len(warnings) == 1 and "without --agent or CTX_AGENT" in warnings[0], r

    make_agent(world.storage, ["shell.exec", "fs.read"])
    allow_in_tool_policy(world.storage, "shell.exec")  # fs.read: the agent's layer only
    with (world.qdir / "config").open("a") as config:
        config.write("max_result_bytes=4000\n")
    shell = '{{"tool":"shell.exec","input":{}}}'
    world.drop("exit3", shell.format('{"cmd":"echo first >&2; echo boom >&2; exit 3"}'))
    world.drop("schema", shell.format("{}"))
    world.drop("denied", '{"tool":"fs.read","input":{"path":"README.md"}}')
    world.drop("hand", '{"tool": 5, "input": {}}')
    world.drop("big", shell.format('{"cmd":"printf %06000d 0"}'))  # 6 000 bytes out
    r = world.q("work", "--agent", "ci", "--drain", "--json", timeout=60)
    assert r.rc == 0, r
    assert json.loads(r.out.splitlines()[-1])["failed"] == 5, r
    world.drop("slow", shell.format('{"cmd":"sleep 30"}'))
    r = world.q("work", "--agent", "ci", "--drain", "--timeout", "1", timeout=60)
    assert r.rc == 0, r

    def failure(job: str) -> tuple[str, dict, dict]:
        state, res = world.queue.only_result(f"{job}.req.json")
        assert state == "failed" and res["status"] == "error", (job, res)
        return res["reason"], res["error"], res

    reason, error, _ = failure("exit3")
    assert reason == "shell.exec exited with status 3: boom [exit]", reason
    assert (error["error"], error["errno"], error["stage"]) == (None, None, "exit"), error
    expected = {
        "anon": ("EACCES", "authorize", None, "EACCES: this worker was started without"),
        "schema": ("EINVAL", "schema", None, "EINVAL: "),
        "denied": ("EACCES", "authorize", 6, "EACCES: step 6 (tool/model policy): "),
        "hand": ("EINVAL", "request", None, "EINVAL: "),
        "big": ("EFBIG", "finish", None, "EFBIG: "),
        "slow": ("ETIMEDOUT", "run", None, "ETIMEDOUT: "),
    }
    for job, (name, stage, step, start) in expected.items():
        reason, error, _ = failure(job)
        assert (error["error"], error["errno"]) == (name, getattr(errno, name)), (job, error)
        assert (error["stage"], error["step"]) == (stage, step), (job, error)
        assert reason.startswith(start) and reason.endswith(f" [{stage}]"), (job, reason)
    assert failure("big")[2]["output_omitted"] is True
