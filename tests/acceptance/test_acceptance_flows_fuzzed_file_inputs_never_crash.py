"""Every file a user or an agent hands to CortexFS, generated near-valid: a valid document
mutated (a field dropped, retyped or added; numbers past a float, NaN and the infinities; a
name given twice; a byte order mark, NUL bytes, invalid UTF-8; nesting past 128 levels;
long strings; trailing garbage; a truncated tail).  The files: queue requests (``ctx queue
publish``, ``--batch``), requests dropped into ``pending/`` by hand, ``queue/config``, lease
files written by hand, ``finish`` result files, policy files (``ctx policy check`` and
``query``), v2 manifests (``ctx object check`` and ``install``), agent requests (``ctx agent
create``) and an agent's ``identity`` and ``mount`` controls, a tool's ``schema``, ``cap``,
``program``, ``status`` and ``origin`` controls and its hooks, ``--native`` input on stdin,
``.tshrc``, ``tool/tsh.d/config``, an MCP client configuration and an MCP server's tool
listing (``ctxmcp``), and session ``events.jsonl`` lines read by ``ctx session show``,
``tail`` and ``repair``.

Angle: fuzzed file inputs never crash.  Each input is either accepted with the behaviour
SPEC.md and the docs give it, or refused with a clear ``ctx: ERRNO: …`` error and the
documented exit status: never a Python traceback, never a half-made object left behind.
Where the specification gives a verdict (strict JSON, P-1..P-4, the config keys, the
``.tshrc`` lines), the test computes it itself and compares."""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    is_object_name,
    new_scratch_dir,
    scratch_top,
    snapshot,
)
from tests.support.mcp_wire import WIRE

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="creates agents and runs their tools")

SCRATCH = scratch_top(__file__)
SERIAL = itertools.count()
CTXMCP = str(Path(CTX_ARGV[0]).with_name("ctxmcp"))


def fuzz(examples: int = 20):
    """Small, reproducible hypothesis runs; the fixtures' roots are shared by the examples
    of one test, so each example judges only what it changed."""
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
    )


# ====================================================================== near-valid documents

WEIRD = [
    None,
    True,
    False,
    0,
    -1,
    1.5,
    2**64,
    -(2**63),
    "",
    "x" * 300,
    "a\x00b",
    "é",
    [],
    {},
    [[[]]],
    {"k": {}},
    "../x",
    "/abs",
    "NaN",
]


@dataclass(frozen=True)
class Garble:
    """One way of spoiling a document's bytes; ``json`` tells whether what comes out is
    still strict JSON (None: readers may differ, as with a byte order mark)."""

    name: str
    apply: Callable[[bytes], bytes]
    json: bool | None


def _middle(data: bytes, insert: bytes) -> bytes:
    cut = len(data) // 2
    return data[:cut] + insert + data[cut:]


GARBLES = [
    Garble("none", lambda d: d, True),
    Garble("bom", lambda d: b"\xef\xbb\xbf" + d, None),
    Garble("trailing", lambda d: d + b" trailing", False),
    Garble("nul", lambda d: _middle(d, b"\x00"), False),
    Garble("utf8", lambda d: _middle(d, b"\xff\xfe"), False),
    Garble("cut", lambda d: d[: len(d) // 2], False),
    Garble("twice", lambda d: d.replace(b"{", b'{"dup": 1, "dup": 2, ', 1), False),
    Garble("nan", lambda d: d.replace(b"{", b'{"n": NaN, ', 1), False),
    Garble("inf", lambda d: d.replace(b"{", b'{"n": -Infinity, ', 1), False),
    Garble("huge", lambda d: d.replace(b"{", b'{"n": 1e999, ', 1), False),
    Garble("digits", lambda d: d.replace(b"{", b'{"n": ' + b"7" * 4301 + b", ", 1), False),
    Garble(
        "deep", lambda d: d.replace(b"{", b'{"n": ' + b"[" * 200 + b"]" * 200 + b", ", 1), False
    ),
    Garble("quotes", lambda d: d.replace(b'"', b"'"), False),
    Garble("two", lambda d: d + b"\n" + d, False),
]
NOT_JSON = [g for g in GARBLES if g.json is False]


@st.composite
def mutated(draw, valid: dict, keys: list[str] | None = None) -> dict:
    """``valid`` with 0 to 3 of its fields dropped, retyped or added."""
    doc = copy.deepcopy(valid)
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(keys or sorted(valid)))
        action = draw(st.sampled_from(["drop", "retype", "add"]))
        if action == "drop":
            doc.pop(key, None)
        elif action == "retype":
            doc[key] = draw(st.sampled_from(WEIRD))
        else:
            doc[f"extra_{draw(st.integers(0, 3))}"] = draw(st.sampled_from(WEIRD))
    return doc


def encode(doc, ascii_only: bool) -> bytes:
    return json.dumps(doc, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


@st.composite
def near_valid(draw, valid: dict, garbles=GARBLES) -> tuple[dict, Garble, bytes]:
    """A mutated document, one garble, and the bytes they make (a garble that changes
    nothing counts as none)."""
    doc = draw(mutated(valid))
    garble = draw(st.sampled_from(garbles))
    clean = encode(doc, draw(st.booleans()))
    data = garble.apply(clean)
    return doc, (garble if data != clean else GARBLES[0]), data


class NotStrict(ValueError):
    pass


def _refuse(token):
    raise NotStrict(token)


def _unique(pairs):
    names = [name for name, _ in pairs]
    if len(names) != len(set(names)):
        raise NotStrict(f"a name twice: {names}")
    return dict(pairs)


def strict(text: str | bytes):
    """JSON as RFC 8259 has it: no NaN or infinities, no name twice in one object."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    return json.loads(text, parse_constant=_refuse, object_pairs_hook=_unique)


def no_traceback(r: Run) -> None:
    assert "Traceback" not in r.err and "Traceback" not in r.out, r


ERROR_LINE = re.compile(r"^(ctx|ctxmcp): (E[A-Z0-9]+): \S")


def one_error(r: Run, codes: tuple[int, ...] = (1,), errnos: tuple[str, ...] = ("EINVAL",)) -> str:
    """``r`` refused with the exit status of ``codes`` and exactly one ``ctx: ERRNO: …`` line
    (notes and warnings aside) whose errno is one of ``errnos``; the line."""
    no_traceback(r)
    assert r.rc in codes, r
    errors = [line for line in r.err.splitlines() if ERROR_LINE.match(line)]
    assert len(errors) == 1, r
    assert ERROR_LINE.match(errors[0]).group(2) in errnos, r
    return errors[0]


def rfc3339_with_zone(value) -> bool:
    if not isinstance(value, str):
        return False
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).tzinfo is not None
    except ValueError:
        return False


# ============================================================================ the echo tool

ECHO_SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}}
ECHO_CAP = {"side_effects": False, "network": False}


@dataclass
class EchoWorld(OnStorage):
    """A searchable root holding tool ``fz.echo`` (prints its input back) and agent ``fz``
    (label ``fz_t``) allowed to run it in both layers of P-6."""

    storage: Path
    scratch: Path

    @property
    def manifest(self) -> Path:
        return self.scratch / "fz.echo.json"

    @property
    def controls(self) -> Path:
        return self.storage / "tool" / "fz.echo.d"

    def reinstall(self) -> None:
        r = self.ctx("object", "install", "--tier", "system", self.manifest)
        assert r.rc == 0, r

    def native(
        self, data: bytes | str, tool: str = "fz.echo", agent: str = "fz"
    ) -> tuple[Run, dict]:
        """``ctx run --native``: the run and its last frame, every frame strict JSON."""
        r = self.ctx("run", "--agent", agent, "--native", tool, input=data)
        no_traceback(r)
        frames = [strict(line) for line in r.out.splitlines()]
        assert frames and frames[-1]["type"] == "result", r
        assert all(f["type"] != "result" for f in frames[:-1]), r
        return r, frames[-1]

    def listed(self, name: str = "fz.echo") -> dict:
        r = self.ctx("object", "list", "--tier", "system", "--json")
        no_traceback(r)
        assert r.rc == 0, r
        found = [t for t in strict(r.out) if t["name"] == name]
        assert len(found) == 1, r
        return found[0]


@pytest.fixture
def echo(searchable_storage: Path) -> Iterator[EchoWorld]:
    scratch = new_scratch_dir(SCRATCH, "echo")
    (scratch / "echo.sh").write_text("#!/bin/sh\ncat\n")
    world = EchoWorld(searchable_storage, scratch)
    world.manifest.write_text(
        json.dumps(
            {
                "manifest": 2,
                "kind": "tool",
                "name": "fz.echo",
                "description": "Prints its input back.",
                "schema": ECHO_SCHEMA,
                "cap": ECHO_CAP,
                "exec": "echo.sh",
                "program": {"type": "object"},
            }
        )
    )
    world.reinstall()
    world.create_agent({"name": "fz", "label": "fz_t", "tools": ["fz.echo"]})
    world.allow_tool("fz_t", "fz.echo")
    yield world
    shutil.rmtree(scratch, ignore_errors=True)


# ============================================================================ queue requests

REQUEST = {
    "tool": "fs.read",
    "input": {"path": "README.md"},
    "from": "tester",
    "created": "2026-06-22T12:00:00Z",
}


def request_valid(doc) -> bool:
    """§2.1 and docs/queue.md: an object with a ``tool`` that is an object name and an
    ``input`` object; ``from`` a string and ``created`` an RFC 3339 time with a zone when
    given; any other field kept."""
    if not isinstance(doc, dict):
        return False
    if not (isinstance(doc.get("tool"), str) and is_object_name(doc["tool"])):
        return False
    if not isinstance(doc.get("input"), dict):
        return False
    if "from" in doc and not isinstance(doc["from"], str):
        return False
    return "created" not in doc or rfc3339_with_zone(doc["created"])


def settled_queue(queue: QueueCLI) -> tuple[set, set]:
    return queue.entries("pending"), queue.entries("inbox")


@fuzz(30)
@given(case=near_valid(REQUEST))
def test_publish_of_a_near_valid_request_is_published_or_refused_whole(queue: QueueCLI, case):
    doc, garble, data = case
    before = settled_queue(queue)
    r = queue.run("publish", "-", input=data)
    no_traceback(r)
    if garble.json is False or (garble.json and not request_valid(doc)):
        one_error(r, (1,), ("EINVAL",))
        assert r.out == ""
        assert settled_queue(queue) == before, "a refused publish left something behind"
        return
    if garble.json:
        assert r.rc == 0, r
    if r.rc == 0:
        job = r.out.strip()
        assert r.lines() == [job] and queue.entries("pending") == before[0] | {job}
        stored = strict((queue.dir / "pending" / job).read_bytes())
        assert request_valid(stored), stored
        assert queue.entries("inbox") == before[1]
    else:
        one_error(r, (1,), ("EINVAL",))
        assert settled_queue(queue) == before


@fuzz(15)
@given(case=near_valid(REQUEST, NOT_JSON))
def test_publish_json_mode_refusal_is_one_error_object(queue: QueueCLI, case):
    _, _, data = case
    r = queue.run("publish", "--json", "-", input=data)
    line = one_error(r, (1,), ("EINVAL",))
    answer = strict(r.out)
    assert set(answer) >= {"error", "errno", "message"}, r
    assert answer["error"] == "EINVAL" and answer["errno"] == 22, r
    assert answer["message"] in line, r


@fuzz(20)
@given(
    good=st.integers(1, 4),
    bad_at=st.integers(0, 4),
    bad=near_valid(REQUEST, NOT_JSON),
)
def test_batch_with_one_spoiled_line_publishes_nothing(queue: QueueCLI, good, bad_at, bad):
    _, _, spoiled = bad
    spoiled = spoiled.replace(b"\n", b" ")  # one line
    lines = [json.dumps(REQUEST).encode()] * good
    bad_at = min(bad_at, good)
    lines.insert(bad_at, spoiled)
    before = settled_queue(queue)
    r = queue.run("publish", "--batch", "-", input=b"\n".join(lines) + b"\n")
    line = one_error(r, (1,), ("EINVAL",))
    assert f"line {bad_at + 1}" in line, r
    assert r.out == ""
    assert settled_queue(queue) == before


@pytest.mark.parametrize(
    "text",
    [
        '{"tool": "fs.read", "input": {"n": NaN}}',
        '{"tool": "fs.read", "input": {"n": Infinity}}',
        '{"tool": "fs.read", "input": {"n": 1e999}}',
        '{"tool": "fs.read", "input": {}, "tool": "shell.exec"}',
        '{"tool": "fs.read", "input": {"n": ' + "[" * 129 + "]" * 129 + "}}",
        '{"tool": "fs.read", "input": {"n": ' + "9" * 4301 + "}}",
    ],
    ids=["nan", "infinity", "1e999", "name-twice", "129-deep", "4301-digits"],
)
def test_documented_unreadable_requests_are_refused_in_both_publish_forms(queue, text):
    before = settled_queue(queue)
    one_error(queue.run("publish", "-", input=text), (1,), ("EINVAL",))
    one_error(queue.run("publish", "--batch", "-", input=text + "\n"), (1,), ("EINVAL",))
    assert settled_queue(queue) == before


@fuzz(20)
@given(case=near_valid(REQUEST))
def test_claim_of_a_request_dropped_by_hand(queue: QueueCLI, case):
    """docs/queue.md: one put in pending/ by hand is claimed as a malformed request, given as
    ``{"tool": null, "input": {}, "invalid": REASON}`` with a note, and finished ``--error``."""
    doc, garble, data = case
    job = f"hand-{next(SERIAL)}.req.json"
    (queue.dir / "pending" / job).write_bytes(data)
    r = queue.run("claim", "--json", "--pid", str(os.getpid()))
    no_traceback(r)
    assert r.rc == 0, r
    claimed = strict(r.out)
    assert claimed["name"] == job, r
    req = claimed["request"]
    if garble.json is False or (garble.json and not request_valid(doc)):
        assert req["tool"] is None and req["input"] == {}, r
        assert isinstance(req["invalid"], str) and req["invalid"], r
        assert f"the request of {job} is not valid" in r.err, r
    elif garble.json:
        assert "invalid" not in req and req["tool"] == doc["tool"], r
    finished = queue.run("finish", job, "--error", "-", input="{}")
    assert finished.rc == 0, finished
    assert queue.state(job) == "failed"


# ============================================================================ queue config

CONFIG_LINES = {
    # line: whether docs/queue.md "Configuration" takes it
    "lease_ttl=300": True,
    "lease_ttl=0.5": True,
    "lease_ttl=31622400": True,
    "lease_ttl=0": False,
    "lease_ttl=-1": False,
    "lease_ttl=nan": False,
    "lease_ttl=inf": False,
    "lease_ttl=31622401": False,
    "lease_ttl=\u0663": False,
    "lease_ttl=": False,
    "grace=0": True,
    "grace=31622400": True,
    "grace=31622401": False,
    "grace=-1": False,
    "max_request_bytes=1024": True,
    "max_request_bytes=0": False,
    "max_request_bytes=1.5": False,
    "max_request_bytes=-1": False,
    "max_result_bytes=4096": True,
    "max_result_bytes=\uff11": False,
    "move=rename": True,
    "move=copy": False,
    "bogus=1": False,
    "lease_ttl": False,
    "# a comment \u00e9": True,
    "": True,
}


@fuzz(25)
@given(lines=st.lists(st.sampled_from(sorted(CONFIG_LINES)), min_size=1, max_size=4))
def test_config_lines_are_taken_or_refused_naming_the_first_bad_line(queue: QueueCLI, lines):
    default = (queue.dir / "config").read_text()
    before_count = len(default.splitlines())
    (queue.dir / "config").write_text(default + "\n".join(lines) + "\n")
    before = snapshot(queue.dir)
    r = queue.run("status")
    bad = [n for n, line in enumerate(lines) if not CONFIG_LINES[line]]
    if not bad:
        assert r.rc == 0, r
    else:
        line = one_error(r, (1,), ("EINVAL",))
        assert f"config:{before_count + bad[0] + 1}:" in line, (r, lines)
    assert snapshot(queue.dir) == before
    (queue.dir / "config").write_text(default)


def test_config_past_64_kib_is_efbig_and_nothing_moves(queue: QueueCLI):
    default = (queue.dir / "config").read_text()
    (queue.dir / "config").write_text(default + "#" * 70000 + "\n")
    before = settled_queue(queue)
    line = one_error(queue.run("publish", "-", input=json.dumps(REQUEST)), (1,), ("EFBIG",))
    assert "config" in line
    assert settled_queue(queue) == before


# ============================================================================ lease files

LEASE_VALUES = [None, True, 0, -1, 1.5, 2**70, "", "x" * 300, "\x00", [], {}, "1", "garbage"]
LEASE_TIMES = ["2000-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "2026-06-22T12:00:00"]


@pytest.fixture
def claimed_job(queue: QueueCLI) -> tuple[QueueCLI, str, dict]:
    """A job claimed for a process that has exited, and its lease."""
    queue.publish()
    gone = subprocess.Popen(["true"])
    gone.wait()
    job = queue.claim("--pid", str(gone.pid))
    return queue, job, queue.lease(job)


@fuzz(20)
@given(
    changes=st.dictionaries(
        st.sampled_from(
            ["pid", "boot_id", "pid_ns", "host", "expires_at", "create_time", "worker"]
        ),
        st.sampled_from(LEASE_VALUES + LEASE_TIMES + ["<drop>"]),
        min_size=1,
        max_size=3,
    ),
    garble=st.sampled_from(GARBLES),
)
def test_a_lease_written_by_hand_is_judged_alike_by_show_and_recover(claimed_job, changes, garble):
    queue, job, lease = claimed_job
    lease = dict(lease)
    for key, value in changes.items():
        if value == "<drop>":
            lease.pop(key, None)
        else:
            lease[key] = value
    (queue.dir / "lease" / job / "worker").write_bytes(garble.apply(encode(lease, True)))
    before = snapshot(queue.dir)
    shown = queue.run("show", job, "--json")
    no_traceback(shown)
    assert shown.rc in (0, 1), shown
    holder = strict(shown.out)["holder"]
    assert holder["state"] in {"alive", "gone", "unknown", "unreadable"}, shown
    dry = queue.run("recover", "--dry-run", "--json")
    no_traceback(dry)
    assert dry.rc in (0, 1), dry
    requeued = [e["job"] if isinstance(e, dict) else e for e in strict(dry.out)["requeued"]]
    assert (holder["state"] == "gone") == (job in requeued), (holder, dry)
    for args in (("status", "--json"),):
        r = queue.run(*args)
        no_traceback(r)
        assert r.rc in (0, 1), r
    assert snapshot(queue.dir) == before, "a reader or a dry run changed the queue"


@fuzz(12)
@given(garble=st.sampled_from(NOT_JSON))
def test_finish_and_renew_refuse_a_lease_that_is_not_json(claimed_job, garble):
    """docs/queue.md: a claim whose lease is a file that does not parse is a conflict: finish
    and renew refuse it with the lease's own error, naming lease/J/worker, changing nothing."""
    queue, job, lease = claimed_job
    (queue.dir / "lease" / job / "worker").write_bytes(garble.apply(encode(lease, True)))
    if garble.name in ("twice",):  # a name twice is read as the last: still a lease
        return
    before = snapshot(queue.dir)
    for args in (("finish", job, "--ok", "-"), ("renew", job, "--pid", str(os.getpid()))):
        r = queue.run(*args, input="{}")
        line = one_error(r, (1, 2), ("EINVAL",))
        assert f"lease/{job}/worker" in line, r
    assert snapshot(queue.dir) == before


# ============================================================================ finish results


@fuzz(20)
@given(case=near_valid({"status": "ok", "output": {"answer": 42}}))
def test_finish_result_file_is_stored_as_json_or_refused(queue: QueueCLI, case):
    doc, garble, data = case
    queue.publish()
    job = queue.claim("--pid", str(os.getpid()))
    r = queue.run("finish", job, "--ok", "-", input=data)
    no_traceback(r)
    if garble.name in ("nan", "inf", "huge"):
        one_error(r, (1, 2), ("EINVAL",))
    if r.rc != 0:
        one_error(r, (1, 2), ("EINVAL",))
        assert queue.state(job) == "claimed", "a refused finish moved the job"
        r = queue.run("finish", job, "--ok", "-", input="{}")
        assert r.rc == 0, r
        return
    state, _result = queue.only_result(job)
    stored = strict((queue.dir / "done" / f"{job}.result").read_bytes())
    assert state == "done" and stored["status"] == "ok"
    if garble.json and isinstance(doc, dict) and set(doc) == {"status", "output"}:
        assert stored["output"] == doc["output"]


# ============================================================================ sessions

EVENT = {
    "ts": "2026-11-30T09:01:11.022996Z",
    "type": "tool_call",
    "agent": "fz",
    "session": "s1",
    "object": "tool/fs.read",
    "status": "ok",
}
EVENT_LINE = json.dumps(EVENT, separators=(",", ":")).encode()
# Lines whose fate docs/sessions.md settles: an event (a JSON object), or a damaged line.
DAMAGED_LINES = [
    b"x",
    b"1",
    b"[]",
    b"null",
    b'"text"',
    EVENT_LINE[:30],
    EVENT_LINE + b" trailing",
    EVENT_LINE.replace(b"{", b'{"n":NaN,', 1),
    EVENT_LINE.replace(b"{", b'{"n":1e999,', 1),
    _middle(EVENT_LINE, b"\x00"),
    _middle(EVENT_LINE, b"\xff"),
]
EVENT_LINES = [
    EVENT_LINE,
    json.dumps(dict(EVENT, type="note", text="\x1b[2J\r\x07 bell")).encode(),
    json.dumps(dict(EVENT, extra={"deep": [[[1]]]}, n=2**70)).encode(),
    json.dumps(dict(EVENT, text="\u00e9\u202e"), ensure_ascii=False).encode(),
]


def session_file(storage: Path, session: str) -> Path:
    """``events.jsonl`` of ``session`` of agent fz in root's home (a session outlives its
    agent, docs/sessions.md: the caller's own home is read)."""
    directory = storage / "home" / "0" / "agent" / "fz" / "session" / session
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    return directory / "events.jsonl"


@fuzz(25)
@given(
    picks=st.lists(
        st.tuples(st.booleans(), st.integers(0, 10)),
        min_size=1,
        max_size=8,
    )
)
def test_session_readers_keep_the_events_and_name_each_damaged_line(storage, picks):
    lines, damaged = [], []
    for number, (is_event, index) in enumerate(picks, start=1):
        if is_event:
            lines.append(EVENT_LINES[index % len(EVENT_LINES)])
        else:
            lines.append(DAMAGED_LINES[index % len(DAMAGED_LINES)])
            damaged.append(number)
    path = session_file(storage, "s1")
    path.write_bytes(b"\n".join(lines) + b"\n")
    env = clean_env(CTX_STORAGE=str(storage))
    kept = len(picks) - len(damaged)
    for args in (("show", "fz", "s1", "--json"), ("tail", "fz", "s1", "-n", "3", "--json")):
        r = ctx_run("session", *args, env=env)
        no_traceback(r)
        assert r.rc == 0, r
        printed = [strict(line) for line in r.out.splitlines()]
        assert all(isinstance(event, dict) for event in printed), r
        assert len(printed) == (kept if args[0] == "show" else min(3, kept)), r
        if damaged:
            note = ", ".join(map(str, damaged))
            assert f"ctx: note: skipped damaged lines {note} of {path}" in r.err, r
        else:
            assert r.err == "", r
    text = ctx_run("session", "show", "fz", "s1", env=env)
    assert text.rc == 0 and len(text.lines()) == kept, text
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", text.out), text


@fuzz(15)
@given(
    whole=st.integers(0, 3),
    torn=st.binary(min_size=1, max_size=200).filter(lambda b: b"\n" not in b),
)
def test_repair_cuts_exactly_the_torn_tail(storage, whole, torn):
    path = session_file(storage, "s2")
    body = b"".join(EVENT_LINES[i % len(EVENT_LINES)] + b"\n" for i in range(whole))
    path.write_bytes(body + torn)
    env = clean_env(CTX_STORAGE=str(storage))
    r = ctx_run("session", "repair", "fz", "s2", "--json", env=env)
    no_traceback(r)
    assert r.rc == 0, r
    assert strict(r.out)["truncated_bytes"] == len(torn), r
    assert path.read_bytes() == body
    again = ctx_run("session", "repair", "fz", "s2", "--json", env=env)
    assert again.rc == 0 and strict(again.out)["truncated_bytes"] == 0, again


# ============================================================================ policy files

POLICY_LINES = {
    # line: its P-1..P-4 verdict (True valid, None ignored, False EINVAL)
    b"allow coder_t tool:fs.read execute": True,
    b"allow coder_t model:prov/m1 use": True,
    b"allow coder_t shared:proj read": True,
    b"allow coder_t session:s1 resume": True,
    b"allow coder_t agent:review-1 create": True,
    b"allow coder_t network:default connect": True,
    b"  allow\tcoder_t   tool:fs.list  execute ": True,
    b"": None,
    b"# a comment \xff\xfe": None,
    b"   # indented": None,
    b"allow coder_t agent:* create": False,
    b"deny coder_t tool:fs.read execute": False,
    b"allow coder_t tool:fs.read": False,
    b"allow coder_t tool:fs.read use": False,
    b"allow coder_t widget:x read": False,
    b"allow coder_t network:other connect": False,
    b"allow coder_t tool:fs.read execute extra": False,
    b"allow coder_t tool:../x execute": False,
    b"allow coder_t model:m1 use": False,
    b"ALLOW coder_t tool:fs.read execute": False,
    b"\xff\xfe": False,
    b"allow coder_t tool:fs.read execute\x00": False,
    b"allow coder_t tool:fs.read\xc2\xa0execute": False,
    b"allow coder_t tool:fs.read.d execute": False,
}


@fuzz(20)
@given(lines=st.lists(st.sampled_from(sorted(POLICY_LINES)), min_size=1, max_size=6))
def test_policy_check_names_exactly_the_bad_lines(tmp_path: Path, lines):
    path = tmp_path / "policy"
    path.write_bytes(b"\n".join(lines) + b"\n")
    r = ctx_run("policy", "check", path)
    no_traceback(r)
    bad = [n for n, line in enumerate(lines, start=1) if POLICY_LINES[line] is False]
    if not bad:
        assert r.rc == 0, r
        return
    assert r.rc == 1, r
    named = [
        int(m.group(1))
        for m in re.finditer(rf"^{re.escape(str(path))}:(\d+): EINVAL: ", r.err, re.M)
    ]
    assert named == bad, r
    query = ctx_run("policy", "query", "--policy", path, "coder_t", "tool:fs.read", "execute")
    no_traceback(query)
    assert query.rc == 2 and "EINVAL" in query.err, query


@fuzz(20)
@given(
    lines=st.lists(
        st.sampled_from([k for k, v in POLICY_LINES.items() if v is not False]), max_size=6
    )
)
def test_policy_query_on_a_valid_fuzzed_policy_allows_exactly_what_it_lists(tmp_path: Path, lines):
    path = tmp_path / "policy"
    path.write_bytes(b"\n".join(lines) + b"\n")
    r = ctx_run("policy", "query", "--policy", path, "coder_t", "tool:fs.read", "execute")
    no_traceback(r)
    listed = any(
        POLICY_LINES[line] and line.split() == [b"allow", b"coder_t", b"tool:fs.read", b"execute"]
        for line in lines
    )
    assert (r.rc, r.out.strip()) == ((0, "allow") if listed else (1, "deny")), r


# ============================================================================ manifests

MANIFEST = {
    "manifest": 2,
    "kind": "tool",
    "name": "fz.tool",
    "description": "A tool.",
    "schema": {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}}},
    "cap": {"side_effects": False, "network": False},
    "exec": "prog.sh",
    "program": {"type": "object"},
}


def tier_entries(storage: Path) -> set[str]:
    tier = storage / "home" / "0" / "tool"
    return set(os.listdir(tier)) - {".install-lock"} if tier.is_dir() else set()


@fuzz(20)
@given(case=near_valid(MANIFEST), name=st.integers(0, 10**6))
def test_manifest_check_and_install_agree_and_a_refusal_leaves_nothing(
    storage, tmp_path, case, name
):
    _doc, garble, data = case
    data = data.replace(b"fz.tool", f"fz.t{name}".encode())
    (tmp_path / "prog.sh").write_text("#!/bin/sh\ncat\n")
    manifest = tmp_path / "m.json"
    manifest.write_bytes(data)
    env = clean_env(CTX_STORAGE=str(storage))
    check = ctx_run("object", "check", "--json", manifest, env=env)
    no_traceback(check)
    assert check.rc in (0, 1), check
    [entry] = strict(check.out)
    assert set(entry) == {"manifest", "valid", "name", "problems", "codes", "error"}, check
    assert entry["valid"] == (check.rc == 0), check
    if garble.json is False:
        assert not entry["valid"], check
    before = tier_entries(storage)
    install = ctx_run("object", "install", "--tier", "user", manifest, env=env)
    no_traceback(install)
    assert (install.rc == 0) == entry["valid"], (check, install)
    if install.rc != 0:
        assert install.rc == 1 and re.search(r"^ctx: E[A-Z]+: ", install.err, re.M), install
        assert tier_entries(storage) == before, "a refused install left something"
        return
    made = tier_entries(storage) - before
    assert made <= {entry["name"], entry["name"] + ".d"} and not any(
        n.startswith(".") for n in made
    )
    listed = ctx_run("object", "list", "--tier", "user", "--json", env=env)
    assert listed.rc == 0, listed
    [tool] = [t for t in strict(listed.out) if t["name"] == entry["name"]]
    assert tool["status"] == "available", tool


# ============================================================================ agent requests

AGENT_REQUEST = {
    "name": "ag",
    "label": "ag_t",
    "model": ["prov/m1"],
    "tools": ["fs.read"],
    "shared": {"proj": ["read"]},
    "mount": [["/tmp", "/work1", "ro"]],
}


@fuzz(20)
@given(case=near_valid(AGENT_REQUEST), serial=st.integers(0, 10**6))
def test_agent_create_makes_the_whole_pair_or_nothing(storage, case, serial):
    _doc, garble, data = case
    data = data.replace(b'"ag"', f'"ag{serial}"'.encode())
    agents = storage / "agent"
    (agents / ".install-lock").touch()  # made by the first create (docs/tools.md), kept
    before = set(os.listdir(agents))
    env = clean_env(CTX_STORAGE=str(storage))
    r = ctx_run("agent", "create", "-", "--json", input=data, env=env)
    no_traceback(r)
    made = set(os.listdir(agents)) - before
    if garble.json is False:
        assert r.rc != 0, r
    if r.rc != 0:
        assert r.rc in (1, 2), r
        errors = [line for line in r.err.splitlines() if ERROR_LINE.match(line)]
        assert errors and all(": EINVAL: " in e or ": EEXIST: " in e for e in errors), r
        assert made == set(), "a refused create left something"
        return
    answer = strict(r.out)
    assert made == {answer["name"], answer["name"] + ".d"}, made
    shown = ctx_run("agent", "show", answer["name"], "--json", env=env)
    no_traceback(shown)
    assert shown.rc == 0 and strict(shown.out)["name"] == answer["name"], shown


@fuzz(20)
@given(
    control=st.sampled_from(["identity", "mount"]),
    garble=st.sampled_from(GARBLES),
    retype=st.sampled_from([None, *WEIRD[:8]]),
)
def test_hand_edited_identity_or_mount_never_breaks_show_list_or_a_call(
    echo, control, garble, retype
):
    path = echo.storage / "agent" / "fz.d" / control
    original = path.read_bytes()
    doc = strict(original)
    if retype is not None:
        if isinstance(doc, dict):
            doc["uid"] = retype
        else:
            doc.append(retype)
    path.write_bytes(garble.apply(encode(doc, True)))
    try:
        for args in (("agent", "show", "fz", "--json"), ("agent", "list", "--json")):
            r = echo.ctx(*args)
            no_traceback(r)
            assert r.rc in (0, 1), r
            if r.rc == 0:
                strict(r.out)
        r, result = echo.native('{"a": "x"}')
        assert r.rc in (0, 1), r
        if control == "identity" and retype is not None:  # no uid of the password database
            assert result["status"] == "error", result
        if result["status"] == "ok":
            assert result["output"] == {"a": "x"}
        else:
            assert result["error"]["error"] in {"EINVAL", "EACCES", "ENOENT", "ENOEXEC"}, result
            assert result["error"]["message"], result
    finally:
        path.write_bytes(original)


# ============================================================================ tool controls

CONTROLS = {"schema": ECHO_SCHEMA, "cap": ECHO_CAP, "program": {"type": "object"}}


@fuzz(20)
@given(
    pick=st.sampled_from(sorted(CONTROLS)).flatmap(
        lambda c: st.tuples(st.just(c), near_valid(CONTROLS[c]))
    )
)
def test_hand_edited_controls_list_and_call_say_the_same(echo, pick):
    """docs/tools.md: a malformed schema or cap makes the tool damaged (ENOEXEC at stage
    resolve), a program failing C-2 makes it unavailable (EACCES at resolve); what
    ``ctx object list`` says is what a call meets."""
    control, (_, garble, data) = pick
    original = (echo.controls / control).read_bytes()
    (echo.controls / control).write_bytes(data)
    try:
        listed = echo.listed()
        _r, result = echo.native('{"a": "x"}')
        error = result["error"] or {}
        if listed["status"] == "available":
            assert error.get("stage") != "resolve", (listed, result)
            assert result["status"] == "ok" or error.get("stage") == "schema", result
        elif listed["status"] == "damaged":
            assert control in ("schema", "cap") and listed["problems"], listed
            assert (error.get("error"), error.get("stage")) == ("ENOEXEC", "resolve"), result
        else:
            assert listed["status"] == "unavailable" and control == "program", listed
            assert (error.get("error"), error.get("stage")) == ("EACCES", "resolve"), result
        if garble.json is False:
            assert listed["status"] != "available", (control, garble.name, listed)
    finally:
        (echo.controls / control).write_bytes(original)


@pytest.mark.parametrize(
    "text, runs",
    [
        (b"available\n", True),
        (b"  available \r\n", True),
        (b"Available\n", False),
        (b"", False),
        (b"\xef\xbb\xbfavailable\n", False),
        (b"disabled\x00\n", False),
        (b"available\nextra\n", False),
        (b"unavailable: \xff\xfe\n", False),
    ],
    ids=["plain", "blanks", "capital", "empty", "bom", "nul", "two-lines", "bad-utf8"],
)
def test_status_control_variants(echo, text, runs):
    """docs/tools.md: a call is refused (EACCES) unless status reads available; a status
    that says none of the three settings refuses calls too."""
    (echo.controls / "status").write_bytes(text)
    listed = echo.listed()
    r, result = echo.native('{"a": "x"}')
    if runs:
        assert listed["status"] == "available" and result["status"] == "ok", (listed, result)
        return
    assert listed["status"] == "unavailable" and listed["reason"], listed
    assert (result["error"]["error"], result["error"]["stage"]) == ("EACCES", "resolve"), result
    assert r.rc == 1


def origin_of(storage: Path, tool: str) -> Path:
    return storage / "tool" / f"{tool}.d" / "origin"


def test_bootstrap_repairs_an_origin_that_is_not_json(storage: Path):
    """docs/tools.md "ctx bootstrap": a control its manifest defines (origin among them) is
    bootstrap's to write back; a broken origin is damage bootstrap repairs."""
    origin_of(storage, "fs.read").write_text("this is not JSON\n")
    r = ctx_run("bootstrap", "--storage", storage)
    no_traceback(r)
    assert r.rc == 0, r
    assert strict(origin_of(storage, "fs.read").read_text())["manifest"].endswith("fs.read.json")


def test_bootstrap_repairs_an_origin_nested_past_the_interpreter(storage: Path):
    origin_of(storage, "fs.read").write_bytes(b"[" * 5000 + b"]" * 5000)
    r = ctx_run("bootstrap", "--storage", storage)
    no_traceback(r)
    assert r.rc == 0, r
    assert strict(origin_of(storage, "fs.read").read_text())["manifest"].endswith("fs.read.json")


def test_a_deeply_nested_origin_changes_a_call_no_more_than_a_broken_one(echo):
    echo.allow_tool("fz_t", "fs.list")
    with (echo.storage / "agent" / "fz.d" / "policy").open("a") as policy:
        policy.write("allow fz_t tool:fs.list execute\n")
    origin = origin_of(echo.storage, "fs.list")
    origin.write_text("not JSON at all\n")
    _, broken = echo.native('{"path": "/ctx"}', tool="fs.list")
    origin.write_bytes(b"[" * 5000 + b"]" * 5000)
    _, deep = echo.native('{"path": "/ctx"}', tool="fs.list")
    assert deep["status"] == broken["status"], (broken, deep)
    assert deep["error"] == broken["error"], (broken, deep)


def test_a_deeply_nested_origin_does_not_stop_a_worker(echo):
    queue = QueueCLI(echo.storage, "proj")
    job = queue.publish({"tool": "fz.echo", "input": {"a": "x"}})
    origin_of(echo.storage, "fs.list").write_bytes(b"[" * 5000 + b"]" * 5000)
    r = queue.run("work", "--agent", "fz", "--drain", "--json")
    no_traceback(r)
    assert r.rc == 0, r
    state, result = queue.only_result(job)
    assert state == "done" and result["output"] == {"a": "x"}, result


# ============================================================================ hooks


@pytest.mark.parametrize(
    "name",
    [b"\xff\xfe-hook", b"new\nline", b"esc\x1b[2J", b"\xe2\x80\xaertl"],
    ids=["bad-utf8", "newline", "escape", "rtl"],
)
def test_hooks_with_exotic_names_and_messages(echo, name):
    """docs/tools.md "Hooks": a post-hook's non-zero exit is recorded with its message and
    changes nothing; a pre-hook's vetoes the call with EACCES, quoting its last stderr line."""
    hooks = echo.controls / "hooks"
    post = os.path.join(bytes(hooks / "post.d"), name)
    with open(post, "wb") as f:
        f.write(b"#!/bin/sh\ncat >/dev/null\nprintf 'sad \\377 \\033[31m red\\n' >&2\nexit 3\n")
    os.chmod(post, 0o755)
    r, result = echo.native('{"a": "x"}')
    assert r.rc == 0 and result["status"] == "ok", result
    [hook] = result["post_hooks"]
    assert hook["exit_status"] == 3 and "sad" in hook["message"], hook
    os.unlink(post)
    pre = os.path.join(bytes(hooks / "pre.d"), name)
    with open(pre, "wb") as f:
        f.write(b"#!/bin/sh\necho 'no \\033]0;title\\007 way' >&2\nexit 1\n")
    os.chmod(pre, 0o755)
    r, result = echo.native('{"a": "x"}')
    assert r.rc == 1 and (result["error"]["error"], result["error"]["stage"]) == ("EACCES", "hook")
    term = echo.ctx("run", "--agent", "fz", "fz.echo")
    no_traceback(term)
    assert term.rc == 126 and "EACCES" in term.err, term
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", term.err), term
    os.unlink(pre)


# ============================================================================ --native input


def echo_input_valid(doc) -> bool:
    return isinstance(doc, dict) and ("a" not in doc or isinstance(doc["a"], str))


@fuzz(20)
@given(case=near_valid({"a": "x", "b": [1, 2]}, [g for g in GARBLES if g.name != "bom"]))
def test_native_input_is_run_or_refused_at_stage_schema(echo, case):
    doc, garble, data = case
    r, result = echo.native(data)
    valid = garble.json and echo_input_valid(doc)
    if valid:
        assert r.rc == 0 and result["status"] == "ok", result
        assert result["output"] == json.loads(data)
    else:
        assert r.rc == 2, r
        assert (result["error"]["error"], result["error"]["stage"]) == ("EINVAL", "schema"), result
        assert result["exit_status"] is None and result["output"] is None, result
    events = [
        strict(line)
        for line in (echo.storage / result["session"] / "events.jsonl").read_text().splitlines()
    ]
    mine = [e["type"] for e in events if e.get("call") == result["call"]]
    assert mine == ["tool_call", "tool_result"], events[-3:]


# ============================================================================ .tshrc


@pytest.fixture
def paths(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A CTX_HOME, a directory holding the executable zz.t, and one holding nothing."""
    home, has, empty = tmp_path / "home", tmp_path / "has", tmp_path / "empty"
    for d in (home, has, empty):
        d.mkdir()
    (has / "zz.t").write_text("#!/bin/sh\n")
    (has / "zz.t").chmod(0o755)
    return home, has, empty


TSHRC_JUNK = [b"echo hi", b"export CTX_PATH=/x", b"=x", b"\xff\xfe", b"\x1b[31m"]
TSHRC_QUIET = [b"", b"# comment \xff", b"OTHER=1", b"max_loaded_tools=3"]


@fuzz(20)
@given(
    picks=st.lists(
        st.one_of(
            st.sampled_from(["has", "empty", "unset"]).map(lambda k: ("path", k)),
            st.sampled_from(TSHRC_JUNK).map(lambda b: ("junk", b)),
            st.sampled_from(TSHRC_QUIET).map(lambda b: ("quiet", b)),
        ),
        max_size=6,
    )
)
def test_tshrc_lines_last_ctx_path_wins_and_each_junk_line_warns(storage, paths, picks):
    """T-4 and docs/tools.md CTX_PATH: .tshrc is data; a line that is not KEY=VALUE is
    ignored with one warning naming it; the last CTX_PATH line counts, an empty one as not
    set ($CTX_PATH then applies)."""
    home, has, empty = paths
    where = {"has": has, "empty": empty}
    lines, junk, wanted = [], [], None
    for number, (kind, value) in enumerate(picks, start=1):
        if kind == "path":
            lines.append(b"CTX_PATH=" + (b"" if value == "unset" else str(where[value]).encode()))
            wanted = None if value == "unset" else value
        elif kind == "junk":
            lines.append(value)
            junk.append(number)
        else:
            lines.append(value)
    (home / ".tshrc").write_bytes(b"\n".join(lines) + b"\n")
    env = clean_env(CTX_STORAGE=str(storage), CTX_HOME=str(home), CTX_PATH=str(empty))
    r = ctx_run("object", "which", "zz.t", env=env)
    no_traceback(r)
    if wanted == "has":
        assert (r.rc, r.out) == (0, f"{has}/zz.t\n"), r
    else:
        one_error(r, (1,), ("ENOENT",))
    warned = [int(n) for n in re.findall(r"^ctx: warning: .*\.tshrc:(\d+): ignored", r.err, re.M)]
    assert warned == junk, r
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f]", r.err), r


@pytest.mark.parametrize(
    "data, errno",
    [(b"CTX_PATH=/a\x00b\n", "EINVAL"), (b"# pad\n" * 12000, "EINVAL")],
    ids=["nul-in-path", "over-64-kib"],
)
def test_tshrc_that_cannot_be_used_is_refused(storage, paths, data, errno):
    home, _, empty = paths
    (home / ".tshrc").write_bytes(data)
    env = clean_env(CTX_STORAGE=str(storage), CTX_HOME=str(home), CTX_PATH=str(empty))
    line = one_error(ctx_run("object", "which", "zz.t", env=env), (1,), (errno,))
    assert ".tshrc" in line


# ============================================================================ tsh.d/config

TSH_LINES = {
    b"max_loaded_tools=64": True,
    b"cache_capacity=16": True,
    b"window_percent=5": True,
    b"# comment": True,
    b"": True,
    b"max_loaded_tools=0": False,
    b"cache_capacity=-1": False,
    b"window_percent=101": False,
    b"window_percent=1.5": False,
    b"max_loaded_tools=1e3": False,
    b"bogus=1": False,
    b"\xef\xbb\xbfcache_capacity=8": False,
    b"cache_capacity": False,
    b"\xff\xfe": False,
}


@fuzz(20)
@given(
    lines=st.lists(
        st.sampled_from(sorted(TSH_LINES)),
        min_size=1,
        max_size=4,
        unique_by=lambda line: line.split(b"=")[0] if b"=" in line else line,
    )
)
def test_tsh_config_reads_leniently_and_updates_only_a_clean_file(storage, lines):
    """H-4 and docs/tools.md tsh.config: the file is data; a bad line is ignored with a
    warning when read, and an update of a file holding one is refused, leaving it as it was."""
    config = storage / "tool" / "tsh.d" / "config"
    data = b"\n".join(lines) + b"\n"
    config.write_bytes(data)
    env = clean_env(CTX_STORAGE=str(storage), CTX_PATH=str(storage / "tool"))
    r = ctx_run("tool", "tsh.config", env=env)
    no_traceback(r)
    assert r.rc == 0, r
    bad = [n for n, line in enumerate(lines, start=1) if not TSH_LINES[line]]
    warned = [int(n) for n in re.findall(r"tsh\.d/config:(\d+):", r.err)]
    assert warned == bad, r
    update = ctx_run("tool", "tsh.config", "window_percent=2", env=env)
    no_traceback(update)
    if bad:
        one_error(update, (1,), ("EINVAL",))
        assert config.read_bytes() == data
    else:
        assert update.rc == 0, update
        assert b"window_percent=2" in config.read_bytes()


# ============================================================================ MCP


def ctxmcp(*args, env: dict | None = None) -> Run:
    proc = subprocess.run(
        [CTXMCP, *map(str, args)], capture_output=True, env=env or clean_env(), timeout=60
    )
    return Run(
        [str(a) for a in args],
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )


@fuzz(20)
@given(
    case=near_valid(
        {"mcpServers": {"srv": {"command": "MARKER", "args": ["-x"], "env": {"A": "b"}}}}
    )
)
def test_mcp_config_is_refused_before_the_server_starts_or_the_server_is_started(tmp_path, case):
    _doc, garble, data = case
    marker = tmp_path / "started"
    server = tmp_path / "server.sh"
    server.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    server.chmod(0o755)
    config = tmp_path / "mcp.json"
    config.write_bytes(data.replace(b"MARKER", str(server).encode()))
    marker.unlink(missing_ok=True)
    r = ctxmcp("list", "--config", config, "--server", "srv", "--timeout", "10")
    line = one_error(r, (1, 2), ("EINVAL", "ENOENT", "EIO", "EPROTO"))
    if garble.json is False:
        assert r.rc == 2 and ": EINVAL: " in line, r
    if r.rc == 2:
        assert not marker.exists(), "a refused configuration started its server"
    else:
        assert marker.exists() or ": ENOENT: " in line, r


LISTED_TOOL = {
    "name": "echo",
    "description": "Echo.",
    "inputSchema": {"type": "object", "properties": {"a": {"type": "string"}}},
}
LISTING_SERVER = (
    WIRE
    + r"""
listing = open(sys.argv[1], "rb").read()
while True:
    message = receive()
    if "id" not in message:
        continue
    method, ident = message.get("method"), message["id"]
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {"protocolVersion": "2025-06-18",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "s", "version": "0"}}})
    elif method == "tools/list":
        send_bytes(b'{"jsonrpc": "2.0", "id": ' + json.dumps(ident).encode()
                   + b', "result": {"tools": ' + listing + b'}}\n')
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
"""
)


@fuzz(10)
@given(
    tools=st.lists(
        st.tuples(
            st.sampled_from(["echo", "e2", "a.b", "x" * 70, "bad name", "", "t.d", "ok_1"]),
            mutated(LISTED_TOOL, ["description", "inputSchema"]),
        ),
        min_size=1,
        max_size=3,
    )
)
def test_projected_candidates_all_pass_object_check(storage, tmp_path, tools):
    """M-3, M-4: a listed tool whose candidate could not be installed is reported and
    skipped (exit 1); every candidate written passes 'ctx object check'."""
    listing = [dict(tool, name=name) for name, tool in tools]
    (tmp_path / "listing.json").write_text(json.dumps(listing))
    (tmp_path / "server.py").write_text(LISTING_SERVER)
    config = tmp_path / "mcp.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "srv": {
                        "command": sys.executable,
                        "args": [str(tmp_path / "server.py"), str(tmp_path / "listing.json")],
                    }
                }
            }
        )
    )
    out = tmp_path / "out"
    env = clean_env(CTX_STORAGE=str(storage))
    r = ctxmcp(
        "project", "--config", config, "--runtime-config", "/mcp/mcp.json",
        "--server", "srv", "--out", out, env=env,
    )  # fmt: skip
    no_traceback(r)
    assert r.rc in (0, 1), r
    written = sorted(os.listdir(out)) if out.exists() else []
    for name in written:
        check = ctx_run("object", "check", out / name, env=env)
        assert check.rc == 0, (name, check, listing)
    names = [name for name, _ in tools]
    if r.rc == 0:
        assert len(written) == len(names), (r, written)
        assert all(is_object_name(f"srv.{n}") for n in names), r
