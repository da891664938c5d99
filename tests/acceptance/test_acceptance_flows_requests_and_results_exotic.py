"""Queue requests and results that are valid JSON, but exotic: CRLF line ends, no final
newline, whitespace around the object, ``\\u0000`` and lone-surrogate escapes, an escaped
``\\/``, numbers such as ``-0``, ``1.0`` against ``1``, ``1e-400``, 300-digit and 4 300-digit
integers, nesting at the 128-level limit, extra top-level fields (an empty name, a ``Tool``
beside ``tool``), a ``tool`` spelled with an escape; and the near misses the queue refuses
(a UTF-8 byte-order mark, ``1e400``, a ``tool`` that is empty, holds a space or is no object
name, an ``input`` that is ``[]`` or ``null``, 4 301 digits, 129 levels) given as a file, on
stdin and as a line of ``--batch``.  Also ``max_request_bytes`` in ``queue/config`` with odd
values, and results (``finish``, a worker) holding such values.

What is checked: the request is stored as the publisher gave it (SPEC §2.1, Q-1, docs/queue.md
"Configuration": the given bytes trimmed, ``from`` and ``created`` put in front); every
reader — ``show --json``, ``list --json``, ``status --json``, ``claim --json``, the library
(``cortexfs.queue``), the worker handing ``input`` to its tool, ``recover`` putting a claim
back — reads the values the publisher wrote; every refusal is ``EINVAL`` (or ``EFBIG``)
named on stderr, exit 1, no traceback, nothing left in any state directory or in ``inbox/``.

SPEC ids: §2.1, §2.4, Q-1, Q-2, Q-4, Q-5, Q-6, W-1, T-2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    SUFFIX,
    OnStorage,
    QueueCLI,
    Run,
    new_scratch_dir,
    scratch_top,
    snapshot,
)
from tests.acceptance.workercli import AGENT, allow_in_tool_policy, make_agent
from tests.support.storage import copy_of_root

pytestmark = pytest.mark.timeout(120)

SCRATCH = scratch_top(__file__)
PYTHON = str(Path(CTX_ARGV[0]).parent / "python")
ECHO_TOOL = "echo.back"

# --- helpers ----------------------------------------------------------------------------------


def exact(value: Any) -> str:
    """``value`` spelled so that ``1`` and ``1.0``, ``0.0`` and ``-0.0``, and every string
    (lone surrogates included) differ: two readers agree when these agree."""
    return json.dumps(value, sort_keys=True)


def without_added(stored: dict) -> dict:
    """A stored request without the ``from`` and ``created`` publish put in."""
    return {k: v for k, v in stored.items() if k not in ("from", "created")}


def no_traceback(run: Run) -> None:
    assert "Traceback" not in run.err and "Traceback" not in run.out, run


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def deep_arrays(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def request_text(tool: bytes = b'"fs.read"', input_: bytes = b"{}", extra: bytes = b"") -> bytes:
    return b'{"tool":' + tool + b',"input":' + input_ + extra + b"}"


BIG = b"9" * 300

# Valid JSON, exotic: CRLF inside and around, leading and trailing blanks, no final newline;
# NUL and a lone surrogate as escapes, an escaped solidus, -0, 1.0 against 1, a number below
# the smallest float, a 300-digit integer, a surrogate pair; extra fields named "" and "Tool".
EXOTIC_FILE = (
    b'  \t{"tool":"fs.read",\r\n "input":{"nul":"a\\u0000b","lone":"\\ud800x",'
    b'"slash":"\\/etc","negz":-0,"one":1.0,"int":1,"tiny":1e-400,"big":' + BIG + b","
    b'"pair":"\\ud83d\\ude00","crlf":"l1\\r\\nl2"},\r\n "":{"empty name":true},'
    b'"Tool":"shell.exec","x-extra":[null,-0.0,1E2,0.1e1]}  \r\n'
)
EXOTIC_LINE = EXOTIC_FILE.replace(b"\r\n", b"").strip()  # the same request on one line


class World(OnStorage):
    def __init__(self, top: Path, storage: Path) -> None:
        self.top = top
        self.storage = storage
        self.count = 0

    def queue(self, project: str) -> QueueCLI:
        made = self.ctx("queue", "init", "--project", project)
        assert made.rc == 0, made
        return QueueCLI(self.storage, project)

    def file(self, data: bytes, name: str = "req") -> Path:
        self.count += 1
        path = self.top / f"{name}-{os.getpid()}-{self.count}"
        path.write_bytes(data)
        return path

    def api(self, program: str, *args: str) -> Any:
        """``program`` run by the install's interpreter with the library imported, ``root``
        the storage root; what it prints on its last line, as JSON."""
        prelude = textwrap.dedent(
            """\
            import json, os, sys
            from pathlib import Path
            from cortexfs.errors import CtxError
            from cortexfs.queue import Holder, Queue, claim, publish
            root = Path(sys.argv[1])
            def open_queue(project):
                return Queue.open(root / "shared" / project / "queue")
            """
        )
        done = subprocess.run(
            [PYTHON, "-c", prelude + textwrap.dedent(program), str(self.storage), *args],
            capture_output=True,
            timeout=60,
            env=self.env,
        )
        err = done.stderr.decode("utf-8", "replace")
        assert done.returncode == 0 and "Traceback" not in err, err
        return json.loads(done.stdout.decode().splitlines()[-1])

    def work(self, queue: QueueCLI) -> Run:
        run = self.ctx("queue", "work", "--project", queue.project, "--agent", AGENT, "--drain")
        no_traceback(run)
        return run


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    """A root with the tool ``echo.back`` (its output is its input, as ``cat`` gives it back)
    and the agent ``ci`` (uid nobody) allowed it and ``shell.exec`` in both layers of P-6."""
    top = new_scratch_dir(SCRATCH, "world-")
    try:
        storage = copy_of_root(_template, top / "storage")
        world = World(top, storage)
        src = top / "src"
        src.mkdir(mode=0o755)
        (src / f"{ECHO_TOOL}.sh").write_text("#!/bin/sh\nexec cat\n")
        (src / f"{ECHO_TOOL}.sh").chmod(0o755)
        manifest = {
            "manifest": 2, "kind": "tool", "name": ECHO_TOOL,
            "description": "Says its input back.", "schema": {"type": "object"},
            "cap": {"side_effects": False, "network": False}, "exec": f"{ECHO_TOOL}.sh",
        }  # fmt: skip
        (src / f"{ECHO_TOOL}.json").write_text(json.dumps(manifest))
        installed = world.ctx("object", "install", src / f"{ECHO_TOOL}.json", "--tier", "system")
        assert installed.rc == 0, installed
        make_agent(storage, [ECHO_TOOL, "shell.exec"])
        allow_in_tool_policy(storage, ECHO_TOOL)
        allow_in_tool_policy(storage, "shell.exec")
        yield world
    finally:
        shutil.rmtree(top, ignore_errors=True)


def claim_json(queue: QueueCLI, *args: str) -> dict:
    run = queue.run("claim", "--json", *args)
    no_traceback(run)
    assert run.rc == 0, run
    return run.json()


def show_json(queue: QueueCLI, job: str) -> dict:
    run = queue.run("show", job, "--json")
    no_traceback(run)
    assert run.rc == 0, run
    return run.json()


# --- §2.1, Q-1: stored as given, read alike by every reader ----------------------------------


def test_an_exotic_request_from_a_file_stdin_and_a_batch_is_stored_as_given_and_read_alike(
    world: World,
) -> None:
    """§2.1, Q-1, §2.4: the same exotic request given as a file (CRLF inside, blanks around,
    no final newline), on stdin and as a CRLF-ended line of a batch with blank lines is stored
    as its bytes (trimmed, one newline, ``from`` and ``created`` in front); ``show --json``,
    ``list --json``, ``status --json``, ``claim --json`` and the library's ``claim`` all read
    the values Python's reader takes from the publisher's text — ``1.0`` a float, ``1`` an
    int, NUL, the lone surrogate and the extra fields ``""`` and ``Tool`` kept."""
    queue = world.queue("given")
    expected = json.loads(EXOTIC_FILE)
    assert json.loads(EXOTIC_LINE) == expected
    by_file = queue.run("publish", "--name", "by-file", world.file(EXOTIC_FILE))
    by_stdin = queue.run("publish", "--name", "by-stdin", "-", input=EXOTIC_FILE)
    batch = b"\r\n\r\n" + EXOTIC_LINE + b"\r\n\r\n"
    by_batch = queue.run("publish", "--batch", "--json", "-", input=batch)
    for run in (by_file, by_stdin, by_batch):
        no_traceback(run)
        assert run.rc == 0, run
    assert by_file.out == "by-file" + SUFFIX + "\n" and by_stdin.out == "by-stdin" + SUFFIX + "\n"
    (batched,) = by_batch.json()["names"]
    jobs = {"by-file" + SUFFIX: EXOTIC_FILE, "by-stdin" + SUFFIX: EXOTIC_FILE, batched: EXOTIC_LINE}

    for job, given in jobs.items():
        stored = (queue.dir / "pending" / job).read_bytes()
        assert stored.startswith(b'{"from":"') and b',"created":"' in stored, stored[:80]
        assert stored.endswith(given.strip()[1:] + b"\n"), stored[-120:]
        assert exact(without_added(json.loads(stored))) == exact(expected)
        shown = show_json(queue, job)
        assert shown["state"] == "pending", shown
        assert exact(shown["request"]) == exact(json.loads(stored)), shown
        assert (
            shown["request"]["input"]["one"] == 1.0
            and type(shown["request"]["input"]["one"]) is float
        )
    listed = queue.run("list", "--json")
    assert listed.rc == 0 and {e["name"]: e["state"] for e in listed.json()} == dict.fromkeys(
        jobs, "pending"
    ), listed
    status = queue.run("status", "--json")
    assert status.rc == 0 and status.json()["counts"]["pending"] == 3, status
    assert status.json()["ignored"] == [] and status.json()["conflicts"] == [], status

    first = claim_json(queue)
    assert first["name"] in jobs
    assert exact(without_added(first["request"])) == exact(expected), first
    by_library = world.api(
        """
        job = claim(open_queue(sys.argv[2]), Holder.for_process())
        print(json.dumps({"name": job.job, "request": job.request, "bad": job.invalid_reason}))
        """,
        queue.project,
    )
    assert by_library["bad"] is None, by_library
    assert exact(without_added(by_library["request"])) == exact(expected), by_library
    assert by_library["request"]["Tool"] == "shell.exec" and by_library["request"][""] == {
        "empty name": True
    }


REFUSED = {
    "byte-order-mark": b"\xef\xbb\xbf" + request_text(),
    "1e400": request_text(input_=b'{"x":1e400}'),
    "minus-1e400": request_text(input_=b'{"x":-1e400}'),
    "tool-empty": request_text(tool=b'""'),
    "tool-with-a-space": request_text(tool=b'"fs read"'),
    "tool-leading-space": request_text(tool=b'" fs.read"'),
    "tool-control-dir": request_text(tool=b'"fs.read.d"'),
    "tool-65-bytes": request_text(tool=b'"' + b"a" * 65 + b'"'),
    "tool-a-path": request_text(tool=b'"../fs.read"'),
    "tool-with-nul": request_text(tool=b'"fs.read\\u0000"'),
    "tool-a-number": request_text(tool=b"5"),
    "tool-null": request_text(tool=b"null"),
    "input-array": request_text(input_=b"[]"),
    "input-null": request_text(input_=b"null"),
    "input-string": request_text(input_=b'"{}"'),
    "input-missing": b'{"tool":"fs.read"}',
    "from-a-number": request_text(extra=b',"from":5'),
    "created-not-a-time": request_text(extra=b',"created":"yesterday"'),
    "4301-digits": request_text(input_=b'{"n":' + b"9" * 4301 + b"}"),
    "129-levels": request_text(input_=b'{"a":' + deep_arrays(127) + b"}"),
    "array-of-requests": b"[" + request_text() + b"]",
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_near_miss_is_refused_einval_every_way_in_and_leaves_nothing(
    world: World, case: str
) -> None:
    """§2.1, Q-1, §2.4: each near miss, given as a file, on stdin, as line 2 of a batch and
    with ``--json``, is refused: ``ctx: EINVAL: …`` on stderr (a batch: "nothing
    published"), nothing on stdout, exit 1, no traceback, the queue byte for byte as before."""
    queue = world.queue(f"refused-{case}")
    bad = REFUSED[case]
    before = snapshot(queue.dir)
    good = request_text()
    runs = [
        queue.run("publish", "--name", "near-miss", world.file(bad)),
        queue.run("publish", "--name", "near-miss", "-", input=bad),
        queue.run("publish", "--batch", "-", input=good + b"\n" + bad + b"\n"),
        queue.run("publish", "--batch", world.file(good + b"\r\n" + bad, "batch")),
    ]
    for run in runs:
        no_traceback(run)
        assert run.rc == 1 and run.out == "", run
        assert run.err.startswith("ctx: EINVAL: "), run
    for run in runs[2:]:
        assert "nothing published" in run.err, run
    as_json = queue.run("publish", "--json", "-", input=bad)
    no_traceback(as_json)
    assert as_json.rc == 1 and as_json.json()["error"] == "EINVAL", as_json
    assert snapshot(queue.dir) == before
    assert queue.run("show", "near-miss").rc == 1


def test_requests_at_each_limit_are_accepted_and_read_back_whole(world: World) -> None:
    """§2.1 and docs/queue.md (more than 128 levels, more than 4 300 digits, names of more
    than 64 bytes are refused): a request exactly 128 levels deep, integers of exactly
    4 300 digits either sign, and a ``tool`` of exactly 64 bytes (a legal name no tool has)
    are published, and ``claim --json`` and ``show --json`` give them back unchanged."""
    queue = world.queue("at-limits")
    long_tool = "t" * 64
    digits = b"7" * 4300
    texts = {
        "deep": request_text(input_=b'{"a":' + deep_arrays(126) + b"}"),
        "digits": request_text(input_=b'{"p":' + digits + b',"m":-' + digits + b"}"),
        "long-tool": request_text(tool=b'"' + long_tool.encode() + b'"'),
    }
    for name, text in texts.items():
        run = queue.run("publish", "--name", name, "-", input=text)
        no_traceback(run)
        assert run.rc == 0, run
    for name, text in texts.items():
        job = name + SUFFIX
        assert exact(without_added(show_json(queue, job)["request"])) == exact(json.loads(text))
    claimed = {}
    for _ in texts:
        doc = claim_json(queue, "--pid", str(os.getpid()))
        claimed[doc["name"]] = doc["request"]
    for name, text in texts.items():
        assert exact(without_added(claimed[name + SUFFIX])) == exact(json.loads(text)), name
    assert claimed["digits" + SUFFIX]["input"]["m"] == -int(digits)
    assert claimed["long-tool" + SUFFIX]["tool"] == long_tool


# --- max_request_bytes in queue/config --------------------------------------------------------


def sized(size: int) -> bytes:
    """A valid request of exactly ``size`` bytes (no line end)."""
    empty = request_text(input_=b'{"pad":""}')
    return request_text(input_=b'{"pad":"' + b"x" * (size - len(empty)) + b'"}')


def set_config(queue: QueueCLI, original: str, *lines: str, end: str = "\n") -> int:
    """The config ``init`` wrote with ``lines`` after it; the number of the first line added."""
    (queue.dir / "config").write_text(original + "".join(line + end for line in lines))
    return len(original.splitlines()) + 1


ODD_LIMITS = ["0", "-5", "1e6", "0x10", "1_000", "+300", "300.0", "\u0663\u0660\u0660", "",
              "300 # a comment", "3 00", "9" * 5000]  # fmt: skip


def test_odd_request_limits_in_the_config_are_refused_with_their_line(world: World) -> None:
    """§2.1 and docs/queue.md "Configuration": a ``max_request_bytes`` that is no positive
    decimal integer (zero, negative, exponent, hex, ``_``, ``+``, a fraction, Arabic-Indic
    digits, empty, a trailing comment, 5 000 digits) refuses every publish with EINVAL naming
    the config's line, publishing nothing; spaces around the value and a CRLF line end are
    taken, and the limit holds exactly: 300 bytes in, 301 refused EFBIG (a file counts its
    final newline, a batch line not its CRLF); a 40-digit limit takes any request."""
    queue = world.queue("odd-limits")
    original = (queue.dir / "config").read_text()
    before = snapshot(queue.dir)
    for value in ODD_LIMITS:
        line = set_config(queue, original, f"max_request_bytes={value}")
        run = queue.run("publish", "-", input=request_text())
        no_traceback(run)
        assert run.rc == 1 and run.out == "", (value, run)
        assert run.err.startswith("ctx: EINVAL: ") and f"config:{line}:" in run.err, run
        assert "max_request_bytes must be a positive integer" in run.err, run
        assert len(run.err) < 400, run  # 5 000 digits are named, not reprinted
        assert snapshot(queue.dir) == {
            **before,
            "config": ("file", (queue.dir / "config").read_bytes()),
        }

    set_config(queue, original, "max_request_bytes =  300 ", end="\r\n")
    exact_size, over = sized(300), sized(301)
    accepted = [
        queue.run("publish", "--name", "exact-file", world.file(exact_size)),
        queue.run("publish", "--name", "exact-stdin", "-", input=exact_size),
        queue.run("publish", "--batch", "-", input=exact_size + b"\r\n" + exact_size + b"\r\n"),
    ]
    for run in accepted:
        no_traceback(run)
        assert run.rc == 0, run
    refused = [
        queue.run("publish", "--name", "over", world.file(over)),
        queue.run("publish", "--name", "over", world.file(exact_size + b"\n")),
        queue.run("publish", "--name", "over", "-", input=over),
    ]
    for run in refused:
        no_traceback(run)
        assert run.rc == 1 and run.err.startswith("ctx: EFBIG: request is "), run
        assert "at most 300 (max_request_bytes in queue/config)" in run.err, run
    assert not (queue.dir / "pending" / ("over" + SUFFIX)).exists()
    assert os.listdir(queue.dir / "inbox") == []

    set_config(queue, original, "max_request_bytes=" + "1" + "0" * 39)
    run = queue.run("publish", "--name", "huge-limit", "-", input=sized(5000))
    assert run.rc == 0, run
    status = queue.run("status", "--json")
    assert status.rc == 0 and status.json()["counts"]["pending"] == 5, status


def test_a_config_saved_with_a_byte_order_mark_is_refused_naming_its_first_line(
    world: World,
) -> None:
    """docs/queue.md "Configuration" (unknown keys are EINVAL with the line number): a config
    an editor saved with a UTF-8 byte-order mark is refused at line 1, the mark shown
    (``'\\ufeffmax_request_bytes'``), and nothing is published."""
    queue = world.queue("bom-config")
    (queue.dir / "config").write_bytes(b"\xef\xbb\xbfmax_request_bytes=300\n")
    run = queue.run("publish", "-", input=request_text())
    no_traceback(run)
    assert run.rc == 1 and "EINVAL" in run.err and "config:1:" in run.err, run
    assert "\\ufeff" in run.err, run
    assert os.listdir(queue.dir / "pending") == [] and os.listdir(queue.dir / "inbox") == []


# --- the library -----------------------------------------------------------------------------


def test_the_library_publishes_exotic_values_the_command_line_reads_alike(world: World) -> None:
    """§2.1, Q-1 (docs/queue.md: a library caller's request is measured and stored as compact
    JSON, ``ensure_ascii`` off): NUL, a lone surrogate, -0.0, 1.0, a 300-digit integer and a
    tuple published by the library come back from ``show --json`` and ``claim --json`` as
    those values; a request whose compact JSON is exactly ``max_request_bytes`` (two-byte
    letters counted as two) is published, one byte more is EFBIG with nothing left."""
    queue = world.queue("library")
    original = (queue.dir / "config").read_text()
    sent = world.api(
        """
        q = open_queue(sys.argv[2])
        request = {"tool": "fs.read", "input": {"nul": "a\\x00b", "lone": "\\ud800",
                   "negz": -0.0, "one": 1.0, "int": 1, "big": 10**299, "pair": (1, "\\xe9")}}
        job = publish(q, request, name="exotic")
        request["input"]["pair"] = list(request["input"]["pair"])
        print(json.dumps({"job": job, "request": request}))
        """,
        queue.project,
    )
    assert sent["job"] == "exotic" + SUFFIX
    assert exact(without_added(show_json(queue, sent["job"])["request"])) == exact(sent["request"])
    claimed = claim_json(queue, "--pid", str(os.getpid()))
    assert exact(without_added(claimed["request"])) == exact(sent["request"]), claimed

    accent = {"tool": "fs.read", "input": {"text": "\u00e9" * 40}}
    size = len(json.dumps(accent, separators=(",", ":"), ensure_ascii=False).encode())
    set_config(queue, original, f"max_request_bytes={size}")
    outcome = world.api(
        """
        q = open_queue(sys.argv[2])
        request = json.loads(sys.argv[3])
        done = {"exact": publish(q, request, name="exact")}
        request["input"]["text"] += "x"
        try:
            publish(q, request, name="over")
        except CtxError as exc:
            done["over"] = [exc.errno, exc.message]
        print(json.dumps(done))
        """,
        queue.project,
        json.dumps(accent),
    )
    assert outcome["exact"] == "exact" + SUFFIX, outcome
    assert outcome["over"][0] == 27 and "at most" in outcome["over"][1], outcome  # EFBIG
    assert not (queue.dir / "pending" / ("over" + SUFFIX)).exists()
    assert os.listdir(queue.dir / "inbox") == []


# --- W-1, Q-4: a worker and finish -----------------------------------------------------------


def test_a_worker_hands_exotic_values_to_its_tool_and_every_reader_sees_them_back(
    world: World,
) -> None:
    """W-1, Q-4, §2.1: a job for ``echo\\u002eback`` (the tool's name spelled with an escape)
    whose input holds NUL, a lone surrogate, ``\\/``, ``1.0`` and ``1``, ``-0.0``, a 300-digit
    integer, a surrogate pair and arrays nested to the 128-level limit of its request runs
    ``echo.back``; its result's output, read from ``done/`` and by ``show --json``, is that
    input value for value.  A ``shell.exec`` job fed NUL and CRLF on stdin gets them back as
    its text output."""
    queue = world.queue("worker")
    echo_input = (
        b'{"nul":"a\\u0000b","lone":"\\ud800x","slash":"\\/","one":1.0,"int":1,"negz":-0.0,'
        b'"big":' + BIG + b',"pair":"\\ud83d\\ude00","deep":' + deep_arrays(126) + b"}"
    )
    echo = request_text(tool=b'"echo\\u002eback"', input_=echo_input)
    shell = request_text(
        tool=b'"shell.exec"', input_=b'{"cmd":"cat","stdin":"a\\u0000b\\r\\nc\\ud83d\\ude00"}'
    )
    for name, text in (("echo", echo), ("shell", shell)):
        run = queue.run("publish", "--name", name, "-", input=text)
        assert run.rc == 0, run
    worked = world.work(queue)
    assert worked.rc == 0, worked
    expected_echo = json.loads(echo_input)
    for job, expected in (("echo", expected_echo), ("shell", "a\x00b\r\nc\U0001f600")):
        job += SUFFIX
        assert queue.state(job) == "done", (job, worked)
        result = json.loads((queue.dir / "done" / f"{job}.result").read_text())
        assert result["status"] == "ok" and exact(result["output"]) == exact(expected), result
        shown = show_json(queue, job)
        assert exact(shown["result"]["output"]) == exact(expected), shown["result"]
    assert (
        json.loads((queue.dir / "done" / f"echo{SUFFIX}.result").read_text())["tool"] == ECHO_TOOL
    )
    queue.assert_settled()


FINISHED = {
    # given bytes: what the result's output must be
    "crlf-object": (b'{"a": 1,\r\n "b": [1.0, -0.0, 1e-400]}\r\n', {"a": 1, "b": [1.0, -0.0, 0.0]}),
    "no-final-newline": (b'{"s":"a\\u0000b\\ud800\\/"}', {"s": "a\x00b\ud800/"}),
    "300-digits": (b"[" + BIG + b", -" + BIG + b"]", [int(BIG), -int(BIG)]),
    "whole-result-crlf": (b'{"status": "ok",\r\n"output": {"x": -0}}', {"x": 0}),
    "json-null": (b"null\n", None),
    "text-with-nul": (b"plain\x00text\r\n", "plain\x00text\r\n"),
    # Not JSON to the queue's reader (publish refuses it: EINVAL), so kept as text.
    "byte-order-mark": (b'\xef\xbb\xbf{"a":1}', '\ufeff{"a":1}'),
    # A name given twice: the last one counts, as Python's reader takes it.
    "name-twice": (b'{"a":1,"a":2}', {"a": 2}),
}


def test_finish_stores_exotic_outputs_and_show_reads_them_back(world: World) -> None:
    """Q-4, §2.1, docs/queue.md (``finish`` stores the output as JSON when it parses, as text
    otherwise; NaN and numbers beyond a float are EINVAL): outputs with CRLF, no final
    newline, NUL, a lone surrogate, 300-digit integers, ``-0``, ``null`` and text holding a
    NUL are stored as the values they are, and ``show --json`` gives them back; ``1e400`` is
    refused, EINVAL, and the job stays claimed with no result anywhere."""
    queue = world.queue("finish")
    for case, (given, expected) in FINISHED.items():
        assert queue.run("publish", "--name", case, "-", input=request_text()).rc == 0
        job = queue.claim("--pid", str(os.getpid()))
        assert job == case + SUFFIX
        run = queue.run("finish", job, "--ok", world.file(given, "result"))
        no_traceback(run)
        assert run.rc == 0, (case, run)
        result = json.loads((queue.dir / "done" / f"{job}.result").read_text())
        assert exact(result["output"]) == exact(expected), (case, result)
        assert exact(show_json(queue, job)["result"]["output"]) == exact(expected), case

    assert queue.run("publish", "--name", "too-big", "-", input=request_text()).rc == 0
    job = queue.claim("--pid", str(os.getpid()))
    before = snapshot(queue.dir)
    refused = queue.run("finish", job, "--ok", "-", input=b'{"x": 1e400}')
    no_traceback(refused)
    assert refused.rc == 1 and refused.err.startswith("ctx: EINVAL: "), refused
    assert snapshot(queue.dir) == before
    assert queue.state(job) == "claimed"


# --- recover -------------------------------------------------------------------------------


def test_recover_puts_an_exotic_claim_back_byte_for_byte(world: World) -> None:
    """Q-5, Q-2, §2.1: an exotic request claimed for a holder that has exited keeps its bytes
    through the claim (``claimed/J/J``) and through ``recover``, which puts it back in
    ``pending/``; the next ``claim --json`` reads the same values as the first."""
    queue = world.queue("recover")
    published = queue.run("publish", "--name", "exotic", world.file(EXOTIC_FILE))
    assert published.rc == 0, published
    job = "exotic" + SUFFIX
    stored = (queue.dir / "pending" / job).read_bytes()
    first = claim_json(queue, "--pid", str(dead_pid()))
    assert first["name"] == job
    assert (queue.dir / "claimed" / job / job).read_bytes() == stored
    recovered = queue.run("recover", "--json")
    no_traceback(recovered)
    assert recovered.rc == 0 and job in json.dumps(recovered.json()["requeued"]), recovered
    assert (queue.dir / "pending" / job).read_bytes() == stored
    again = claim_json(queue, "--pid", str(os.getpid()))
    assert again["name"] == job and exact(again["request"]) == exact(first["request"])
    assert exact(without_added(again["request"])) == exact(json.loads(EXOTIC_FILE))


# --- defects ------------------------------------------------------------------------------------


def test_show_reads_back_a_result_whose_output_finish_took_at_the_depth_limit(
    world: World,
) -> None:
    """Q-4, §2.4: ``finish --ok`` of an output nested exactly 128 levels (what the queue's
    reader takes) succeeds; ``show --json`` is to give that output back, not call the result
    the finish itself wrote unreadable."""
    queue = world.queue("deep-result")
    assert queue.run("publish", "--name", "deep", "-", input=request_text()).rc == 0
    job = queue.claim("--pid", str(os.getpid()))
    finished = queue.run("finish", job, "--ok", world.file(deep_arrays(128), "result"))
    assert finished.rc == 0, finished
    shown = show_json(queue, job)["result"]
    assert shown.get("output") == json.loads(deep_arrays(128)), str(shown)[:200]


def test_reconcile_rolls_forward_an_interrupted_finish_whose_output_nests_deep(
    world: World,
) -> None:
    """Q-6 (``done/J.result`` with ``claimed/J/J``: roll forward), Q-4: the state a crash
    leaves between a finish's two moves — the result in ``done/``, the request still in
    ``claimed/``, the holder gone — is rolled forward by ``recover --reconcile`` whatever
    output the result holds; here one that ``finish`` itself wrote for an output 128 deep."""
    queue = world.queue("deep-reconcile")
    for name in ("model", "cut"):
        assert queue.run("publish", "--name", name, "-", input=request_text()).rc == 0
    model = queue.claim("--pid", str(os.getpid()))
    assert queue.run("finish", model, "--ok", world.file(deep_arrays(128), "result")).rc == 0
    cut = queue.claim("--pid", str(dead_pid()))
    assert cut == "cut" + SUFFIX
    result = (queue.dir / "done" / f"{model}.result").read_bytes()
    (queue.dir / "done" / f"{cut}.result").write_bytes(result)  # what the first move left
    run = queue.run("recover", "--reconcile")
    no_traceback(run)
    assert run.rc == 0 and queue.state(cut) == "done", run


def test_the_library_refuses_a_request_whose_keys_become_one_name_twice(world: World) -> None:
    """Q-1, §2.1 (docs/queue.md: a library caller is held to what the command line is; a
    name given twice is EINVAL): an ``input`` whose keys ``1`` and ``"1"`` both become the
    JSON name ``"1"`` is refused by the library as the same text is by ``ctx queue
    publish``, rather than stored as a request the next claim calls malformed."""
    queue = world.queue("library-twice")
    cli = queue.run("publish", "-", input=request_text(input_=b'{"1":"a","1":"b"}'))
    assert cli.rc == 1 and "EINVAL" in cli.err, cli
    outcome = world.api(
        """
        q = open_queue(sys.argv[2])
        try:
            print(json.dumps({"published": publish(q, {"tool": "fs.read",
                                                       "input": {1: "a", "1": "b"}})}))
        except CtxError as exc:
            print(json.dumps({"errno": exc.errno, "message": exc.message}))
        """,
        queue.project,
    )
    claimed = queue.run("claim", "--json", "--pid", str(os.getpid()))
    assert outcome.get("errno") == 22, (outcome, claimed)
    assert os.listdir(queue.dir / "pending") == [] and os.listdir(queue.dir / "inbox") == []


def test_a_batch_refusal_names_the_line_of_an_invalid_request(world: World) -> None:
    """Q-1, §2.4, docs/queue.md (a batch refusal names the line): in a JSON Lines file with
    blank lines, a request on line 5 whose ``tool`` holds a space refuses the batch, nothing
    published, and the message names line 5, as it does for a line that is not JSON."""
    queue = world.queue("batch-lines")
    good = request_text()
    lines = [good, b"", b"", good, request_text(tool=b'"bad name"')]
    syntax = queue.run("publish", "--batch", "-", input=b"\n".join([*lines[:4], good[:-1]]) + b"\n")
    assert syntax.rc == 1 and "line 5 " in syntax.err, syntax
    run = queue.run("publish", "--batch", world.file(b"\n".join(lines) + b"\n", "batch"))
    no_traceback(run)
    assert run.rc == 1 and "nothing published" in run.err, run
    assert os.listdir(queue.dir / "pending") == []
    assert "line 5" in run.err, run


def test_a_shell_job_whose_command_holds_nul_fails_einval_without_a_traceback(
    world: World,
) -> None:
    """T-2, W-1, docs/tools.md (a core tool exits 2 with EINVAL for bad input, as ``fs.read``
    does for a path holding NUL): a queued ``shell.exec`` job whose ``cmd`` spells
    ``\\u0000`` is failed with EINVAL and exit status 2, and no traceback reaches its
    result."""
    queue = world.queue("shell-nul")
    text = request_text(tool=b'"shell.exec"', input_=b'{"cmd":"echo a\\u0000b"}')
    assert queue.run("publish", "--name", "nul", "-", input=text).rc == 0
    worked = world.work(queue)
    job = "nul" + SUFFIX
    assert queue.state(job) == "failed", worked
    result = json.loads((queue.dir / "failed" / f"{job}.result").read_text())
    assert "Traceback" not in result["stderr"], result["stderr"]
    assert result["exit_status"] == 2 and result["error"]["error"] == "EINVAL", result


def test_show_says_a_pending_request_gives_a_name_twice(world: World) -> None:
    """§2.4 (``show``: every piece of evidence for J), docs/queue.md (a request giving a name
    twice is one readers disagree on; one put in ``pending/`` by hand is claimed as malformed):
    ``show`` of such a request says the name is given twice instead of presenting one of the
    two readings as the request."""
    queue = world.queue("show-twice")
    job = "dup" + SUFFIX
    planted = b'{"tool":"fs.read","input":{},"tool":"shell.exec"}\n'
    (queue.dir / "pending" / job).write_bytes(planted)
    shown = queue.run("show", job)
    no_traceback(shown)
    claimed = claim_json(queue, "--pid", str(os.getpid()))
    assert claimed["request"]["tool"] is None and "twice" in claimed["request"]["invalid"]
    assert "twice" in shown.out, shown
