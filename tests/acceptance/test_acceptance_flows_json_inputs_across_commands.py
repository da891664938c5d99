"""One set of tricky JSON documents fed to every command that takes JSON: a name given twice,
a UTF-8 byte order mark, ``NaN`` and ``-Infinity``, an integer of 5000 digits, ``1e999``,
nesting 10 000 levels deep, a lone surrogate escape (``"\\ud800"``), NUL escaped and raw,
bytes that are not UTF-8, trailing garbage, two documents, an empty input, an array or a
string where an object belongs, CRLF line ends and a string of 100 000 characters.

The commands: ``ctx queue publish`` (FILE) and ``publish --batch`` (§2.1, Q-1, §2.4),
``ctx queue finish J RESULT_FILE`` (Q-4), requests put in ``pending/`` by hand and run by
``ctx queue work`` (§2.1, W-1), ``ctx run --native`` with the document on stdin and
``ctx run TOOL DOCUMENT`` with it as the one argument (T-2, T-3), ``ctx agent create`` (A-3),
``ctx object check`` / ``ctx object install`` (T-8), ``ctxmcp list --config`` (M-1) and
``ctx tool tsh.config`` with the document as argument and on stdin, and its data file
``tool/tsh.d/config`` (H-3, H-4).

Each command either takes the document as the value it spells, or refuses it with
``EINVAL`` (``ERRNO: sentence``), the exit status its docs give, no traceback, and nothing
half-done: no job, temp, agent, tool, control, started server or changed setting.  What
other files already check literally (publish of NaN, ``1e999``, a name twice, 200 levels,
5000 digits, bytes that are not UTF-8, a byte order mark; ``finish`` of a name twice, a
byte order mark, NaN, ``1e400``; an MCP configuration holding NaN, a name twice or a list;
the batch line rules) is not repeated here.

A byte order mark is the one point the documents leave open per command: ``publish`` refuses
it by name, most other JSON readers skip it (``cortexfs/jsontext.py``).  Either is accepted
here, as long as a refusal names the mark in words a user can act on."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    REPO,
    SUFFIX,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    snapshot,
    tool_manifest,
)
from tests.support.mcp_wire import WIRE
from tests.support.storage import copy_of_root

SCRATCH = scratch_top(__file__)
LABEL = "jsonin_t"
CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
PYTHON = REPO / ".venv" / "bin" / "python"

# --- the documents ---------------------------------------------------------------------------

BOM = b"\xef\xbb\xbf"
DEEP = b"[" * 10000 + b"]" * 10000
DIGITS = b"7" * 5000
LONG = b"a" * 100000  # a string of 100 000 characters, within every size limit and argv's


def documents(member: Callable[[bytes], bytes], twice: bytes) -> dict[str, bytes]:
    """The tricky documents around one command's valid document ``member(b'"x"')``:
    ``member(V)`` is that document with the JSON value ``V`` in a place that takes any
    value; ``twice`` is a document giving one of its names twice."""
    valid = member(b'"x"')
    return {
        "name-twice": twice,
        "bom": BOM + valid,
        "nan": member(b"NaN"),
        "infinity": member(b"-Infinity"),
        "5000-digits": member(DIGITS),
        "1e999": member(b"1e999"),
        "10000-deep": member(DEEP),
        "lone-surrogate": member(b'"\\ud800"'),
        "nul-escaped": member(b'"a\\u0000b"'),
        "nul-raw": member(b'"a\x00b"'),
        "not-utf8": member(b'"caf\xe9"'),
        "trailing-garbage": valid + b" xyz",
        "two-documents": valid + b"\n" + valid,
        "empty": b"",
        "array": b"[" + valid + b"]",
        "string": b'"just text"',
        "crlf": b"{\r\n" + valid[1:].replace(b", ", b",\r\n") + b"\r\n",
        "long-string": member(b'"' + LONG + b'"'),
    }


CASES = sorted(documents(lambda v: b'{"a": ' + v + b"}", b"{}"))
# Refused by every strict reader of JSON text, whatever the command.
NOT_JSON = {
    "name-twice", "nan", "infinity", "5000-digits", "1e999", "10000-deep", "nul-raw",
    "not-utf8", "trailing-garbage", "two-documents", "empty",
}  # fmt: skip
NOT_AN_OBJECT = {"array", "string"}


def value_of(document: bytes) -> object:
    """What a document that is accepted means: its JSON, a byte order mark skipped."""
    return json.loads(document.removeprefix(BOM).decode())


def no_traceback(run: Run) -> None:
    assert "Traceback" not in run.err and "Traceback" not in run.out, run


def refused(run: Run, status: int, errno: str = "EINVAL") -> None:
    """``run`` exited ``status`` with an ``ERRNO: sentence`` line on stderr, no traceback."""
    no_traceback(run)
    assert run.rc == status, run
    assert re.search(rf"(^|\n)[^\n]*\b{errno}: \S", run.err), run


def names_the_byte_order_mark(run: Run) -> None:
    """A refusal of a byte order mark says so in a user's words."""
    said = run.err + run.out
    assert "byte order mark" in said or "U+FEFF" in said, run
    assert "utf-8-sig" not in said, run


# --- the world -------------------------------------------------------------------------------

MCP_SERVER = (
    WIRE
    + r"""
open(sys.argv[1], "a").close()  # the marker: this server was started
while True:
    message = receive()
    if "id" not in message:
        continue
    method, ident = message.get("method"), message["id"]
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "s", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": [
            {"name": "ping", "description": "Answers.", "inputSchema": {"type": "object"}}]}})
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
"""
)


class World(OnStorage):
    def __init__(self, top: Path, storage: Path) -> None:
        self.top = top
        self.storage = storage
        self.files = top / "files"
        self.count = 0

    def file(self, data: bytes, suffix: str = ".json") -> Path:
        self.count += 1
        path = self.files / f"f{os.getpid()}-{self.count}{suffix}"
        path.write_bytes(data)
        return path

    def queue(self, project: str) -> QueueCLI:
        made = self.ctx("queue", "init", "--project", project)
        assert made.rc == 0, made
        return QueueCLI(self.storage, project)

    def native(self, tool: str, document: bytes, session: str) -> tuple[Run, list[dict]]:
        run = self.ctx(
            "run", "--agent", "coder", "--session", session, "--native", tool, input=document
        )
        no_traceback(run)
        return run, [json.loads(line) for line in run.out.splitlines()]

    def tsh_config(self, *args: str | bytes, input: bytes = b"") -> Run:
        env = clean_env(CTX_STORAGE=str(self.storage), CTX_PATH=str(self.storage / "tool"))
        return ctx_run("tool", "tsh.config", *map(os.fsdecode, args), input=input, env=env)


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "world-")
    try:
        world = World(top, copy_of_root(_template, top / "storage"))
        world.files.mkdir()
        workspace = top / "workspace"
        workspace.mkdir(mode=0o755)
        (workspace / "a.txt").write_text("hello\n")
        (workspace / "a.txt").chmod(0o644)
        (workspace / "x").write_text("hello\n")
        (workspace / "x").chmod(0o644)
        manifest = tool_manifest(top / "src", "json.echo", "#!/bin/sh\nexec cat\n")
        (top / "src" / "json.echo.sh").chmod(0o755)
        installed = world.ctx("object", "install", manifest, "--tier", "system")
        assert installed.rc == 0, installed
        world.create_agent(
            {
                "name": "coder",
                "label": LABEL,
                "tools": ["json.echo", "fs.read"],
                "mount": [[str(workspace), "/workspace", "ro"]],
            }
        )
        world.allow_tool(LABEL, "json.echo", "fs.read")
        yield world
    finally:
        shutil.rmtree(top, ignore_errors=True)


# --- §2.1, Q-1: publish and publish --batch ----------------------------------------------------


def request_docs() -> dict[str, bytes]:
    return documents(
        lambda v: b'{"tool": "fs.read", "input": {"v": ' + v + b"}}",
        b'{"tool": "fs.read", "input": {}, "tool": "fs.list"}',
    )


PUBLISH_CASES = [
    "10000-deep", "nul-raw", "trailing-garbage", "empty", "array", "string", "crlf",
    "long-string", "lone-surrogate", "nul-escaped",
]  # fmt: skip


@pytest.mark.parametrize("case", PUBLISH_CASES)
def test_publish_refuses_or_stores_each_document_as_the_value_it_spells(
    world: World, case: str
) -> None:
    """§2.1, Q-1, §2.4: a request that is no JSON object (10 000 levels, a raw NUL, garbage
    after it, nothing, an array, a string) is refused EINVAL, exit 1, and the
    queue is as it was; CRLF line ends, a 100 000-character string, ``\\ud800`` and
    ``\\u0000`` are data: one pending job whose request reads back as what was given."""
    document = request_docs()[case]
    queue = world.queue(f"pub-{case}")
    before = snapshot(queue.dir)
    run = queue.run("publish", "--name", "j1", world.file(document))
    if case in NOT_JSON | NOT_AN_OBJECT:
        refused(run, 1)
        assert run.out == "", run
        assert snapshot(queue.dir) == before
        return
    no_traceback(run)
    assert run.rc == 0 and run.out == f"j1{SUFFIX}\n", run
    stored = json.loads((queue.dir / "pending" / f"j1{SUFFIX}").read_text())
    assert stored["input"] == value_of(document)["input"], case
    assert queue.entries("inbox") == set()


BATCH_BAD = [
    "10000-deep", "nul-raw", "trailing-garbage", "array", "string", "infinity", "5000-digits",
]  # fmt: skip


def test_a_batch_names_each_bad_line_and_publishes_nothing(world: World) -> None:
    """Q-1, §2.4, docs/queue.md ("a batch with bad lines is refused whole, naming each bad
    line"): one good line, then each bad document on a line of its own, then a good line:
    EINVAL, exit 1, every bad line named by its number, nothing published, no temp."""
    docs = request_docs()
    good = b'{"tool": "fs.read", "input": {}}'
    data = b"\n".join([good, *(docs[case] for case in BATCH_BAD), good]) + b"\n"
    queue = world.queue("batch-bad")
    before = snapshot(queue.dir)
    run = queue.run("publish", "--batch", world.file(data, ".jsonl"))
    refused(run, 1)
    named = {int(n) for n in re.findall(r"\bline (\d+) (?:is|must|gives|holds)\b", run.err)}
    assert named == set(range(2, 2 + len(BATCH_BAD))), run
    assert run.out == "" and snapshot(queue.dir) == before


def test_a_batch_line_holding_unicode_line_separators_stays_one_request(world: World) -> None:
    """Q-1, §2.4 (one request per line): U+2028, U+2029 and U+0085 are characters a JSON
    string may hold as they are, and no line end of JSON Lines; CRLF ends a line.  Three
    lines give three jobs, each string whole, a lone surrogate and a 100 000-character
    string kept as given."""
    texts = ["a\u2028b\u2029c\u0085d", "\ud800", LONG.decode()]
    lines = [
        b'{"tool": "fs.read", "input": {"s": "a\xe2\x80\xa8b\xe2\x80\xa9c\xc2\x85d"}}',
        b'{"tool": "fs.read", "input": {"s": "\\ud800"}}',
        b'{"tool": "fs.read", "input": {"s": "' + LONG + b'"}}',
    ]
    queue = world.queue("batch-separators")
    run = queue.run("publish", "--batch", world.file(b"\r\n".join(lines) + b"\r\n", ".jsonl"))
    no_traceback(run)
    assert run.rc == 0 and len(run.lines()) == 3, run
    stored = [
        json.loads((queue.dir / "pending" / name).read_text())["input"]["s"] for name in run.lines()
    ]
    assert stored == texts


# --- §2.1, W-1: requests put in pending/ by hand ----------------------------------------------

BY_HAND = [
    "bom", "name-twice", "10000-deep", "5000-digits", "nul-raw", "trailing-garbage",
    "two-documents", "empty", "string",
]  # fmt: skip


def test_requests_put_in_pending_by_hand_fail_with_their_reason_and_nothing_runs(
    world: World,
) -> None:
    """§2.1, W-1, docs/queue.md ("one put in pending/ by hand is claimed as a malformed
    request, which a worker finishes in failed/ with the reason"): each document of the set
    that ``publish`` would refuse, placed in ``pending/`` by hand, is finished by ``ctx queue
    work --drain`` in ``failed/`` with EINVAL at stage ``request``; the worker exits 0."""
    docs = request_docs()
    queue = world.queue("by-hand")
    for case in BY_HAND:
        (queue.dir / "pending" / f"{case}{SUFFIX}").write_bytes(docs[case])
    run = queue.run("work", "--drain", "--agent", "coder", timeout=120)
    no_traceback(run)
    assert run.rc == 0, run
    for case in BY_HAND:
        state, result = queue.only_result(f"{case}{SUFFIX}")
        assert state == "failed", (case, result)
        assert result["error"]["error"] == "EINVAL", (case, result)
        assert result["error"]["stage"] == "request", (case, result)
    queue.assert_settled()


# --- finish RESULT_FILE -------------------------------------------------------------------


def result_docs() -> dict[str, bytes]:
    return documents(lambda v: b'{"answer": ' + v + b"}", b'{"a": 1, "a": 2}')


# What the result's output is: JSON when it parses, text otherwise (docs/queue.md).
FINISH_AS_TEXT = ["10000-deep", "5000-digits", "trailing-garbage", "two-documents", "empty"]
FINISH_AS_JSON = ["array", "string", "lone-surrogate", "long-string"]


@pytest.mark.parametrize("case", FINISH_AS_TEXT + FINISH_AS_JSON + ["infinity"])
def test_finish_stores_a_result_as_json_when_it_parses_as_text_otherwise(
    world: World, case: str
) -> None:
    """Q-4, docs/queue.md ("finish reads the result's output ... stored as JSON when it
    parses, as text otherwise"; NaN and the infinities are EINVAL): 10 000 levels, 5000
    digits, garbage after a value, two values and nothing are kept as the text given,
    whole; an array, a string, ``\\ud800`` and a long string as JSON; ``-Infinity`` is
    refused, exit 1, and the job stays claimed with no result."""
    document = result_docs()[case]
    queue = world.queue(f"fin-{case}")
    queue.publish(name="j1")
    job = queue.claim("--pid", str(os.getpid()))
    if case == "infinity":
        before = snapshot(queue.dir)
        run = queue.run("finish", job, "--ok", world.file(document))
        refused(run, 1)
        assert snapshot(queue.dir) == before and queue.state(job) == "claimed"
        return
    run = queue.run("finish", job, "--ok", world.file(document))
    no_traceback(run)
    assert run.rc == 0, run
    state, result = queue.only_result(job)
    expected = document.decode() if case in FINISH_AS_TEXT else value_of(document)
    assert state == "done" and result["output"] == expected, (case, str(result)[:300])


def test_a_whole_result_giving_its_status_twice_is_not_finished_ok(world: World) -> None:
    """Q-4, §2.1, docs/queue.md ("a whole result object ... gives its output, and its status
    must agree with --ok/--error (else EINVAL, exit 2)"), docs/tools.md (a name given twice
    in one object is one JSON readers disagree on): ``{"status": "error", ..., "status":
    "ok"}`` finished ``--ok`` is either refused or stored so that no reader of ``done/`` can
    take it for an error: the value first named is not dropped."""
    queue = world.queue("fin-status-twice")
    queue.publish(name="j1")
    job = queue.claim("--pid", str(os.getpid()))
    document = b'{"status": "error", "output": {"verdict": "reject"}, "status": "ok"}'
    run = queue.run("finish", job, "--ok", world.file(document))
    no_traceback(run)
    if run.rc == 0:
        raw = (queue.dir / "done" / f"{job}.result").read_text()
        assert '"error"' in raw and "reject" in raw, raw  # kept whole, as text
    else:
        assert run.rc in (1, 2) and "EINVAL: " in run.err, run
        assert queue.state(job) == "claimed"


# --- T-2, T-3: ctx run --native and a JSON argument --------------------------------------------


def native_docs() -> dict[str, bytes]:
    return documents(
        lambda v: b'{"path": "a.txt", "v": ' + v + b"}", b'{"v": 1, "path": "a.txt", "v": 2}'
    )


@pytest.mark.parametrize("case", CASES)
def test_native_input_is_refused_at_stage_schema_or_reaches_the_tool_as_given(
    world: World, case: str
) -> None:
    """T-3, docs/tools.md ("input that is not JSON is refused at stage schema ... so is
    input that JSON readers disagree on"; exit 2 for input not JSON or that its schema
    refuses): each refused document ends in a ``result`` frame of EINVAL at stage
    ``schema``, no ``call`` frame (the tool never started), exit 2; each accepted one reaches
    a tool that echoes its input as the value the document spells."""
    document = native_docs()[case]
    run, frames = world.native("json.echo", document, f"native-{case}")
    result = frames[-1]
    assert result["type"] == "result", frames
    accepted = case not in NOT_JSON | NOT_AN_OBJECT
    if case == "bom" and run.rc != 0:
        names_the_byte_order_mark(Run([], run.rc, "", result["error"]["message"]))
        accepted = False
    if not accepted:
        assert run.rc == 2, run
        assert result["error"]["error"] == "EINVAL" and result["error"]["stage"] == "schema"
        assert [f for f in frames if f["type"] == "call"] == [], frames
        assert result["exit_status"] is None, result
        return
    assert run.rc == 0 and result["status"] == "ok", (case, str(result)[:400])
    assert result["output"] == value_of(document), case


def argument_docs() -> dict[str, bytes]:
    return documents(lambda v: b'{"path": ' + v + b"}", b'{"path": "nope", "path": "a.txt"}')


ARGUMENT_CASES = [c for c in CASES if c != "nul-raw"]  # no argv holds a NUL


@pytest.mark.parametrize("case", ARGUMENT_CASES)
def test_a_json_argument_to_a_core_tool_is_refused_einval_or_read_as_docs_say(
    world: World, case: str
) -> None:
    """T-2, docs/tools.md ("input is a JSON object: the first argument ...; arguments that
    are not a JSON object are the tool's shorthand"; exit 2 for bad input, a lone surrogate
    included, EINVAL): ``fs.read DOCUMENT`` in terminal mode.  What is not JSON, or spells
    ``\\ud800`` or a NUL in its path, is EINVAL, exit 2, nothing printed; an array, a string
    or a byte order mark before the object is no JSON object, so it is the shorthand, a path
    that does not exist (ENOENT, exit 1); CRLF line ends read the file."""
    document = argument_docs()[case]
    run = world.ctx("run", "--agent", "coder", "--session", f"arg-{case}", "fs.read",
                    os.fsdecode(document))  # fmt: skip
    no_traceback(run)
    if case in ("array", "string", "bom", "not-utf8"):
        # The shorthand (or, for bytes that are not UTF-8, a file name holding that byte).
        refused(run, 1, "ENOENT")
    elif case == "crlf":
        assert run.rc == 0 and run.out == "hello\n", run
    elif case == "long-string":
        refused(run, 1, "ENAMETOOLONG")
    else:
        refused(run, 2)
        assert run.err.startswith("fs.read: EINVAL: "), run
    if run.rc != 0:
        assert run.out == "", run


# --- ctx agent create ---------------------------------------------------------------------


def agent_docs(name: str) -> dict[str, bytes]:
    n = name.encode()
    docs = documents(
        lambda v: b'{"name": "' + n + b'", "label": ' + v + b"}",
        b'{"name": "' + n + b'", "label": "' + n + b'_t", "label": "root_t"}',
    )
    docs["crlf"] = b'{\r\n"name": "' + n + b'",\r\n"label": "' + n + b'_t"\r\n}\r\n'
    docs["bom"] = BOM + b'{"name": "' + n + b'", "label": "' + n + b'_t"}'
    return docs


@pytest.mark.parametrize("case", CASES)
def test_agent_create_refuses_each_document_einval_and_makes_nothing(
    world: World, case: str
) -> None:
    """A-3, docs/tools.md ("every problem of a request is listed (EINVAL; the request is
    strict JSON ...)"): each document — the label the one value that changes — is refused
    EINVAL, exit 1, with one ``{"error", "errno", "message"}`` object under ``--json``, and
    neither ``agent/NAME`` nor ``agent/NAME.d`` nor anything in ``home/`` appears; a label
    that is ``\\ud800``, holds a NUL or is 100 000 characters long is no label.  CRLF line
    ends make the agent."""
    name = "a-" + case
    document = agent_docs(name)[case]
    agents = world.storage / "agent"
    before = snapshot(world.storage / "home"), sorted(os.listdir(agents))
    run = world.ctx("agent", "create", world.file(document), "--json")
    no_traceback(run)
    if case == "crlf" or (case == "bom" and run.rc == 0):
        assert run.rc == 0 and run.json()["name"] == name, run
        assert (agents / f"{name}.d" / "label").read_text().strip() == f"{name}_t"
        return
    if case == "bom":
        names_the_byte_order_mark(run)
    refused(run, 1)
    answer = run.json()
    assert (answer["error"], answer["errno"]) == ("EINVAL", 22), answer
    assert (snapshot(world.storage / "home"), sorted(os.listdir(agents))) == before


# --- T-8: ctx object check and install ---------------------------------------------------------


def manifest_docs(name: str) -> dict[str, bytes]:
    head = (
        b'{"manifest": 2, "kind": "tool", "name": "' + name.encode() + b'", "description": '
        b'"A test tool.", "cap": {}, "exec": "json.echo.sh", '
    )
    return documents(
        lambda v: head + b'"schema": {"type": "object", "description": ' + v + b"}}",
        head + b'"schema": {"type": "object"}, "exec": "/bin/true"}',
    )


@pytest.mark.parametrize("case", CASES)
def test_object_check_and_install_agree_on_each_manifest(world: World, case: str) -> None:
    """T-8, docs/tools.md ("the file is strict JSON: a key given twice ... is EINVAL, and so
    are NaN and Infinity"; a manifest holding a lone surrogate anywhere is refused naming the
    field; every reason listed, exit 1): ``object check`` and ``object install`` give the
    same answer for each manifest — refused EINVAL, exit 1, nothing new in ``tool/`` — or
    valid, installed, its schema control the schema given (a NUL escape, CRLF line ends, a
    description of 100 000 characters in the schema)."""
    name = "m-" + case
    path = world.top / "src" / f"{name}.json"
    path.write_bytes(manifest_docs(name)[case])
    tools = world.storage / "tool"
    before = sorted(os.listdir(tools))
    check = world.ctx("object", "check", path)
    install = world.ctx("object", "install", path, "--tier", "system")
    no_traceback(check)
    no_traceback(install)
    accepted = case in ("nul-escaped", "crlf", "long-string", "bom")
    if case == "bom" and check.rc != 0:
        names_the_byte_order_mark(check)
        accepted = False
    if not accepted:
        refused(check, 1)
        refused(install, 1)
        assert check.err.startswith(f"{path}: EINVAL: "), check
        assert sorted(os.listdir(tools)) == before
        return
    assert check.rc == 0 and check.out == f"{path}: valid ({name})\n", check
    assert install.rc == 0, install
    schema = json.loads((tools / f"{name}.d" / "schema").read_text())
    assert schema == value_of(manifest_docs(name)[case])["schema"]


def test_a_huge_integer_is_reported_where_it_stands(world: World) -> None:
    """T-8, §2.4 (``FILE: EINVAL: sentence``): a manifest written one member a line, whose
    schema on line 8 holds an integer of 5000 digits, is refused; the position the refusal
    gives, if any, is where the number stands, not the document's first byte."""
    lines = [
        b"{", b'  "manifest": 2,', b'  "kind": "tool",', b'  "name": "m-huge",',
        b'  "description": "A test tool.",', b'  "cap": {},', b'  "exec": "json.echo.sh",',
        b'  "schema": {"type": "object", "maximum": ' + DIGITS + b"}", b"}",
    ]  # fmt: skip
    path = world.file(b"\n".join(lines) + b"\n")
    check = world.ctx("object", "check", path)
    refused(check, 1)
    assert "line 1 column 1" not in check.err, check


# --- M-1: ctxmcp --config ----------------------------------------------------------------------

# ctxmcp cases not checked elsewhere (a name twice, NaN and a list are).
MCP_CASES = [c for c in CASES if c not in ("name-twice", "nan", "array")]


@pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed in the venv")
@pytest.mark.parametrize("case", MCP_CASES)
def test_ctxmcp_starts_no_server_from_a_configuration_that_is_no_json_object(
    world: World, case: str
) -> None:
    """M-1, docs/tools.md ("2 a configuration or server name that cannot be used"): each
    configuration document that is not a JSON object is EINVAL, exit 2, with the error
    object under ``--json``, and its server is never started; one with CRLF line ends, an
    unrelated member holding ``\\ud800``, ``\\u0000`` or 100 000 characters is read and its
    server listed."""
    here = world.top / f"mcp-{case}"
    here.mkdir()
    (here / "server.py").write_text(MCP_SERVER)
    marker = here / "started"
    entry = json.dumps({"command": str(PYTHON), "args": [str(here / "server.py"), str(marker)]})
    document = documents(
        lambda v: b'{"mcpServers": {"s": ' + entry.encode() + b'}, "note": ' + v + b"}", b""
    )[case]
    config = here / "mcp.json"
    config.write_bytes(document)
    argv = ["list", "--config", config, "--server", "s", "--json"]
    run = ctxmcp_run(*argv)
    no_traceback(run)
    accepted = case in ("crlf", "lone-surrogate", "nul-escaped", "long-string", "bom")
    if case == "bom" and run.rc != 0:
        names_the_byte_order_mark(run)
        accepted = False
    if not accepted:
        refused(run, 2)
        assert run.json()["error"] == "EINVAL", run
        assert not marker.exists()
        return
    assert run.rc == 0, run
    assert [t["name"] for t in run.json()["tools"]] == ["s.ping"], run
    assert marker.exists()


def ctxmcp_run(*args: str | os.PathLike) -> Run:
    argv = [str(CTXMCP), *map(str, args)]
    done = subprocess.run(argv, capture_output=True, env=clean_env(), timeout=60, input=b"")
    return Run(argv[1:], done.returncode, done.stdout.decode(errors="replace"),
               done.stderr.decode(errors="replace"))  # fmt: skip


# --- H-3, H-4: ctx tool tsh.config -------------------------------------------------------------


def tsh_docs() -> dict[str, bytes]:
    return documents(
        lambda v: b'{"set": {"cache_capacity": 40}, "v": ' + v + b"}",
        b'{"set": {"cache_capacity": 40}, "set": {"cache_capacity": 41}}',
    )


@pytest.mark.parametrize("case", CASES)
def test_tsh_config_changes_nothing_for_each_document_but_a_whole_object(
    world: World, case: str
) -> None:
    """H-3, H-4, docs/tools.md (an update is validated whole before anything is written;
    EINVAL, exit 2, not one setting changes; an argument that is not a JSON object is the
    ``key=value`` shorthand): each document, as the one argument of ``ctx tool tsh.config``
    and on its stdin, is refused EINVAL, exit 2, and ``tool/tsh.d/config`` keeps its bytes —
    a member the input does not know (``v``) included; an empty stdin only reads."""
    document = tsh_docs()[case]
    config = world.storage / "tool" / "tsh.d" / "config"
    before = config.read_bytes()
    runs = [("stdin", world.tsh_config(input=document))]
    if case != "nul-raw":
        runs.append(("argument", world.tsh_config(document)))
    for how, run in runs:
        no_traceback(run)
        if case == "empty" and how == "stdin":
            assert run.rc == 0 and "cache_capacity=" in run.out, run
        else:
            refused(run, 2)
            assert run.err.startswith("ctx: EINVAL: tsh.config: "), (how, run)
        assert config.read_bytes() == before, how


def test_tsh_config_takes_an_object_with_crlf_line_ends_and_drops_no_setting(
    world: World,
) -> None:
    """H-3, H-4: ``{"set": {...}}`` written with CRLF line ends, as the argument and on
    stdin, updates the setting it names and nothing else."""
    config = world.storage / "tool" / "tsh.d" / "config"
    kept = config.read_bytes()
    try:
        for value, how in ((40, "argument"), (48, "stdin")):
            document = b'{\r\n"set": {"cache_capacity": %d}\r\n}\r\n' % value
            args = (document,) if how == "argument" else ()
            run = world.tsh_config(*args, input=document if how == "stdin" else b"")
            no_traceback(run)
            assert run.rc == 0, (how, run)
            settings = dict(line.split("=") for line in run.out.split())
            assert settings == {
                "max_loaded_tools": "64",
                "cache_capacity": str(value),
                "window_percent": "1",
            }, run
    finally:
        config.write_bytes(kept)


def test_tsh_config_on_stdin_names_a_byte_order_mark_as_the_other_commands_do(
    world: World,
) -> None:
    """H-3, §2.4 (``ctx: ERRNO: sentence``): ``{"set": ...}`` saved with a byte order mark and
    piped to ``ctx tool tsh.config`` is taken, as ``ctx run --native`` and ``ctx agent create``
    take it, or refused naming the mark in a user's words, as ``publish`` does — not with a
    codec name to decode with."""
    config = world.storage / "tool" / "tsh.d" / "config"
    before = config.read_bytes()
    run = world.tsh_config(input=BOM + b'{"set": {"cache_capacity": 40}}')
    no_traceback(run)
    if run.rc != 0:
        refused(run, 2)
        assert config.read_bytes() == before
        names_the_byte_order_mark(run)


def test_a_tsh_config_saved_with_a_byte_order_mark_is_read_or_the_mark_is_named(
    world: World,
) -> None:
    """H-4 (``tool/tsh.d/config`` is data: ``key=value`` lines): a file an editor saved
    with a byte order mark either keeps its first setting, or the warning that drops it
    says why — the mark before ``max_loaded_tools`` — since the line looks right to
    whoever opens the file."""
    config = world.storage / "tool" / "tsh.d" / "config"
    kept = config.read_bytes()
    try:
        config.write_bytes(BOM + b"max_loaded_tools=8\ncache_capacity=32\nwindow_percent=1\n")
        run = world.tsh_config()
        no_traceback(run)
        assert run.rc == 0, run
        if "max_loaded_tools=8\n" not in run.out:
            assert "byte order mark" in run.err or "\\ufeff" in run.err, run
    finally:
        config.write_bytes(kept)


# --- §2.4: how a refusal reads ------------------------------------------------------------------


def test_a_raw_control_character_is_refused_in_a_sentence(world: World) -> None:
    """§2.4, Q-1 (``ctx: EINVAL: sentence``): a request whose string holds a raw NUL, as a
    file and as a line of a batch, is refused EINVAL, exit 1, nothing published, in a
    sentence that does not stutter ("at at")."""
    document = request_docs()["nul-raw"]
    queue = world.queue("control-char")
    runs = [
        queue.run("publish", world.file(document)),
        queue.run("publish", "--batch", world.file(document + b"\n", ".jsonl")),
    ]
    for run in runs:
        refused(run, 1)
    assert queue.entries("pending") == set() and queue.entries("inbox") == set()
    for run in runs:
        assert " at at " not in run.err, run
