"""What CortexFS prints or stores as JSON, read the way programs in other languages read it:
Go's encoding/json, Rust's serde_json, JavaScript's ``JSON.parse`` behind a fatal
``TextDecoder``, jq.  Such readers take valid UTF-8 bytes only, no ``NaN``/``Infinity``, one
value per JSON Lines line, and (serde_json, I-JSON) no lone surrogate escape such as
``"\\ud800"``; a name given twice in one object is read differently by each of them.

Hostile inputs the product has to report or store: queue entries whose names are not UTF-8
(Q-8, ``status --json``), a storage root whose path is not UTF-8 (R-1), requests and results
holding NaN, names twice, deep nesting, huge numbers or lone surrogates (§2.1, §2.4), a
tool's stdout and stderr holding bytes that are not UTF-8 or JSON holding lone surrogates
(T-3 frames, W-1 worker lines and results), session event lines (S-2, S-5), an MCP server's
descriptions (M-1, M-3), agent requests (A-3) and policy files (P-8).

The checker below is the standard library's reader made strict (duplicate names, constants
and lone surrogates refused, the raw bytes decoded as strict UTF-8); ``jq`` and ``node`` read
the same bytes too when they are installed.  A file name that is not UTF-8 is named in JSON
with each odd byte as its surrogate escape (``"bad\\udcff"``, docs/tools.md for ``fs.list``);
where a test meets that convention it says so and allows exactly those escapes.  A request,
a result, a native input or a tool's output that spells a lone surrogate is data, kept as it
came (escaped), as the product's own tests of requests, sessions and tools require, and so
does a message naming such a file (its bytes come back from the JSON); this file holds the
rest to strict readers, and what ctx relays of others' words (an MCP server's)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.ctxcli import (
    REPO,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    new_scratch_dir,
    scratch_top,
)
from tests.support.mcp_wire import WIRE
from tests.support.storage import copy_of_root

SCRATCH = scratch_top(__file__)
JQ = shutil.which("jq")
NODE = shutil.which("node")
CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
PYTHON = REPO / ".venv" / "bin" / "python"
LABEL = "coder_t"

# --- the strict reader -------------------------------------------------------------------------


class NotStrict(AssertionError):
    """What a strict reader of another language would refuse in a document."""


def lone_surrogates(value: Any) -> list[str]:
    """Every name or string of ``value`` holding a lone surrogate (no UTF-8 text holds one)."""
    found: list[str] = []
    pending = [value]
    while pending:
        item = pending.pop()
        texts = [item] if isinstance(item, str) else list(item) if isinstance(item, dict) else []
        for text in texts:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                found.append(text)
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return found


def is_byte_escape(text: str) -> bool:
    """Whether every lone surrogate of ``text`` is Python's escape of a byte that is not
    UTF-8 (U+DC80..U+DCFF), so that ``os.fsencode`` gives the bytes back."""
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return False
    return True


def read_strictly(
    raw: bytes, *, lines: bool = False, allowed: Callable[[str], bool] | None = None
) -> list[Any]:
    """The JSON values of ``raw`` (one document, or JSON Lines when ``lines``) as a strict
    reader of another language takes them: strict UTF-8, every line one value, no name twice
    in an object, no NaN or infinities, no lone surrogate except in the strings ``allowed``
    accepts.  Raises :class:`NotStrict` naming every problem."""
    try:
        text = raw.decode("utf-8", "strict")
    except UnicodeDecodeError as exc:
        bad = raw[exc.start : exc.start + 8]
        raise NotStrict(f"byte {exc.start} is not UTF-8: {bad!r}") from None
    if lines:
        if text and not text.endswith("\n"):
            raise NotStrict(f"the last JSON Lines line is not ended: {text[-80:]!r}")
        documents = text.splitlines()
    else:
        documents = [text]
    problems: list[str] = []
    values: list[Any] = []
    for number, document in enumerate(documents, 1):

        def unique(pairs: list[tuple[str, Any]], number: int = number) -> dict[str, Any]:
            names = [name for name, _ in pairs]
            twice = sorted({name for name in names if names.count(name) > 1})
            if twice:
                problems.append(f"line {number}: names given twice: {twice!r}")
            return dict(pairs)

        def constant(spelling: str, number: int = number) -> float:
            problems.append(f"line {number}: {spelling} is no JSON number")
            return 0.0

        try:
            value = json.loads(document, object_pairs_hook=unique, parse_constant=constant)
        except ValueError as exc:
            problems.append(f"line {number}: not one JSON value ({exc}): {document[:120]!r}")
            continue
        for bad in lone_surrogates(value):
            if allowed is None or not allowed(bad):
                problems.append(f"line {number}: lone surrogate in {bad[:120]!r}")
        values.append(value)
    if problems:
        raise NotStrict("; ".join(problems))
    others_read(raw, len(values), lines=lines, allowed=allowed)
    return values


NODE_READER = r"""
const buffer = require("fs").readFileSync(0);
const text = new TextDecoder("utf-8", { fatal: true }).decode(buffer);
const documents = process.argv[1] === "lines" ? text.split("\n").slice(0, -1) : [text];
const illFormed = [];
const walk = (value) => {
  if (typeof value === "string") {
    if (!value.isWellFormed()) illFormed.push(value);
  } else if (Array.isArray(value)) {
    value.forEach(walk);
  } else if (value !== null && typeof value === "object") {
    for (const [name, item] of Object.entries(value)) {
      if (!name.isWellFormed()) illFormed.push(name);
      walk(item);
    }
  }
};
for (const document of documents) walk(JSON.parse(document));
process.stdout.write(JSON.stringify(illFormed));
"""


def others_read(
    raw: bytes, count: int, *, lines: bool, allowed: Callable[[str], bool] | None
) -> None:
    """jq and node (when installed) read ``raw`` too: jq as ``count`` values, node with a
    fatal UTF-8 decoder, naming no ill-formed string but those ``allowed``."""
    if JQ is not None:
        jq = subprocess.run([JQ, "-c", "."], input=raw, capture_output=True, timeout=30)
        assert jq.returncode == 0, jq.stderr
        assert len(jq.stdout.splitlines()) == count, jq.stdout[:300]
    if NODE is not None:
        mode = "lines" if lines else "document"
        node = subprocess.run(
            [NODE, "-e", NODE_READER, mode], input=raw, capture_output=True, timeout=30
        )
        assert node.returncode == 0, node.stderr.decode(errors="replace")
        ill_formed = json.loads(node.stdout)
        if any(allowed is None or not allowed(text) for text in ill_formed):
            raise NotStrict(f"node reads ill-formed strings: {ill_formed!r}")


def strict_run(run: Run, *, lines: bool = False, **kw: Any) -> list[Any]:
    """:func:`read_strictly` of what ``run`` printed on stdout (read again as bytes)."""
    assert "Traceback" not in run.err, run
    return read_strictly(run.raw, lines=lines, **kw)  # type: ignore[attr-defined]


def ctx_bytes(*args: str | os.PathLike, env: dict[str, str], input: bytes = b"") -> Run:
    """``ctx ARGS`` whose stdout is kept as bytes (``run.raw``) besides its text."""
    argv = [str(REPO / ".venv" / "bin" / "ctx"), *map(os.fsencode, args)]
    done = subprocess.run(argv, input=input, capture_output=True, env=env, timeout=60)
    run = Run(
        [os.fsdecode(a) for a in argv[1:]],
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )
    run.raw = done.stdout  # type: ignore[attr-defined]
    return run


# --- the world ---------------------------------------------------------------------------------

# Prints the bytes of the file its input names ("out") on stdout and those of "err" on
# stderr, then exits with "exit": whatever a test wants a tool to say, byte for byte.
ECHO_TOOL = """#!/usr/bin/python3
import json, sys
request = json.loads(sys.stdin.buffer.readline() or b"{}")
for key, stream in (("out", sys.stdout.buffer), ("err", sys.stderr.buffer)):
    if key in request:
        with open(request[key], "rb") as f:
            stream.write(f.read())
        stream.flush()
sys.exit(request.get("exit", 0))
"""


class World(OnStorage):
    def __init__(self, top: Path, storage: Path) -> None:
        self.top = top
        self.storage = storage
        self.payloads = top / "payloads"
        self.count = 0

    def payload(self, data: bytes) -> str:
        """A file holding ``data`` that the agent's tool may read; its path."""
        self.count += 1
        path = self.payloads / f"p{os.getpid()}-{self.count}"
        path.write_bytes(data)
        path.chmod(0o644)
        return str(path)

    def native(self, tool: str, request: dict | str, session: str) -> tuple[Run, list[dict]]:
        """``ctx run --native`` as coder: the run and its strictly read frames."""
        text = request if isinstance(request, str) else json.dumps(request)
        run = ctx_bytes(
            "run", "--agent", "coder", "--session", session, "--native", tool,
            env=self.env, input=text.encode(),
        )  # fmt: skip
        return run, strict_run(run, lines=True)

    def events(self, session: str) -> Path:
        return self.storage / "home" / str(self.uid) / "agent" / "coder" / "session" / session

    def queue(self, project: str) -> QueueCLI:
        made = self.ctx("queue", "init", "--project", project)
        assert made.rc == 0, made
        return QueueCLI(self.storage, project)


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "world-")
    try:
        world = World(top, copy_of_root(_template, top / "storage"))
        world.payloads.mkdir(mode=0o755)
        (top / "src").mkdir()
        (top / "src" / "bytes.echo.sh").write_text(ECHO_TOOL)
        (top / "src" / "bytes.echo.sh").chmod(0o755)
        manifest = {
            "manifest": 2, "kind": "tool", "name": "bytes.echo",
            "description": "Says the bytes of a file.", "schema": {"type": "object"},
            "cap": {"side_effects": False, "network": False}, "exec": "bytes.echo.sh",
        }  # fmt: skip
        (top / "src" / "bytes.echo.json").write_text(json.dumps(manifest))
        installed = world.ctx(
            "object", "install", top / "src" / "bytes.echo.json", "--tier", "system"
        )
        assert installed.rc == 0, installed
        request = {"name": "coder", "label": LABEL, "tools": ["bytes.echo", "fs.read"]}
        agent = world.create_agent(request)
        world.uid = agent["identity"]["uid"]
        world.allow_tool(LABEL, "bytes.echo", "fs.read")
        yield world
    finally:
        shutil.rmtree(top, ignore_errors=True)


# --- T-3: native frames ------------------------------------------------------------------------

LONG_STDERR = "é" * 40000 + "\xff" + "ü" * 1000  # longer than 64 KiB once UTF-8
NATIVE_CASES = {
    "bytes-not-utf8": (b'{"text": "caf\xe9 \xed\xa0\x80 \xc0\xaf end"}\n', b"err \xff\xfe\n"),
    "nan-and-infinity": (b'{"a": NaN, "b": -Infinity}\n', b""),
    "beyond-a-float": (b'{"a": 1e999}\n', b""),
    "name-twice": (b'{"a": 1, "a": 2}\n', b""),
    "deep": (b"[" * 300 + b"]" * 300 + b"\n", b""),
    "5000-digits": (b'{"n": ' + b"7" * 5000 + b"}\n", b""),
    "30-digits": (b'{"n": 123456789012345678901234567890, "f": 1e308}\n', b""),
    "long-stderr-line": (b"{}\n", LONG_STDERR.encode("utf-8", "surrogateescape") + b"\n"),
    "not-json": (b"plain \xff text\n", b"\xed\xa0\x80\n"),
}


@pytest.mark.parametrize("case", sorted(NATIVE_CASES))
def test_native_frames_and_events_of_a_tools_hostile_bytes_read_strictly(
    world: World, case: str
) -> None:
    """T-3, S-2, T-7: whatever a tool writes — bytes that are not UTF-8 (an encoded surrogate,
    an overlong form), NaN, 1e999, a name twice, 300 levels, a 5000-digit number, a stderr
    line longer than 64 KiB with a stray byte — the frames of ``ctx run --native`` are JSON
    Lines every strict reader takes: a ``call`` frame first with an integer pid, the
    ``result`` last with an integer exit status; the session's events read strictly too."""
    stdout, stderr = NATIVE_CASES[case]
    request = {"out": world.payload(stdout)}
    if stderr:
        request["err"] = world.payload(stderr)
    session = f"native-{case}"
    run, frames = world.native("bytes.echo", request, session)
    assert run.rc == 0, run
    assert frames[0]["type"] == "call" and type(frames[0]["pid"]) is int, frames[0]
    result = frames[-1]
    assert result["type"] == "result" and type(result["exit_status"]) is int, result
    if case in ("nan-and-infinity", "beyond-a-float", "not-json", "5000-digits"):
        assert isinstance(result["output"], str), result  # kept as the text it was
    if case == "long-stderr-line":
        pieces = [f["text"] for f in frames if f["type"] == "stderr"]
        assert len(pieces) >= 2 and all(len(p.encode()) <= 65536 for p in pieces), pieces
    events = world.events(session) / "events.jsonl"
    read_strictly(events.read_bytes(), lines=True)


def test_fs_read_refuses_a_path_holding_a_lone_surrogate_in_strict_frames(
    world: World,
) -> None:
    """T-3 and docs/tools.md ("exits 1, or 2 for bad input — a lone surrogate (``"\\ud800"``,
    which JSON can spell but no file name or text can hold) included, EINVAL"): wherever the
    path points, the tool refuses it EINVAL, exit 2 (``ctx run`` exit 1, its input being
    JSON its schema takes), in frames a strict reader takes."""
    run = ctx_bytes(
        "run", "--agent", "coder", "--session", "lone-path", "--native", "fs.read",
        env=world.env, input=b'{"path": "/tmp/\\ud800"}',
    )  # fmt: skip
    frames = strict_run(run, lines=True)
    result = frames[-1]
    assert run.rc == 1 and (result["exit_status"], result["error"]["error"]) == (2, "EINVAL"), run


def test_fs_read_refuses_a_relative_path_holding_a_lone_surrogate(world: World) -> None:
    """T-3: the same path inside the agent's reach (relative) is EINVAL, tool exit 2, and the
    refusal quotes the surrogate escaped (``'\\\\ud800'``), so every frame reads strictly."""
    session = "lone-relative"
    run = ctx_bytes(
        "run", "--agent", "coder", "--session", session, "--native", "fs.read",
        env=world.env, input=b'{"path": "a\\ud800b"}',
    )  # fmt: skip
    frames = strict_run(run, lines=True)
    result = frames[-1]
    assert run.rc == 1 and (result["exit_status"], result["error"]["error"]) == (2, "EINVAL"), run
    assert "\\ud800" in result["error"]["message"], result


# --- §2.1, §2.4: requests and results ---------------------------------------------------------

REFUSED_REQUESTS = {
    "nan": b'{"tool": "fs.read", "input": {"x": NaN}}',
    "infinity": b'{"tool": "fs.read", "input": {"x": -Infinity}}',
    "beyond-a-float": b'{"tool": "fs.read", "input": {"x": 1e999}}',
    "name-twice": b'{"tool": "fs.read", "input": {}, "input": {"x": 1}}',
    "leading-plus": b'{"tool": "fs.read", "input": {"x": +1}}',
    "deep": b'{"tool": "fs.read", "input": ' + b"[" * 200 + b"]" * 200 + b"}",
    "5000-digits": b'{"tool": "fs.read", "input": {"x": ' + b"7" * 5000 + b"}}",
    "not-utf8": b'{"tool": "fs.read", "input": {"x": "caf\xe9"}}',
    "encoded-surrogate": b'{"tool": "fs.read", "input": {"x": "\xed\xa0\x80"}}',
    "two-values": b'{"tool": "fs.read", "input": {}} {"tool": "fs.read", "input": {}}',
}


@pytest.mark.parametrize("case", sorted(REFUSED_REQUESTS))
def test_publish_refuses_what_other_readers_read_otherwise(world: World, case: str) -> None:
    """§2.1, Q-1: a request another language's reader would refuse or read as another
    document (NaN, 1e999, a name twice, ``+1``, 200 levels, a number of 5000 digits, bytes
    that are not UTF-8, two values) is refused, EINVAL and exit 1, and nothing is stored."""
    queue = world.queue(f"refuse-{case}")
    run = queue.run("publish", "-", input=REFUSED_REQUESTS[case])
    assert run.rc == 1 and "EINVAL" in run.err and "Traceback" not in run.err, run
    assert queue.entries("pending") == set() and queue.entries("inbox") == set()


def test_a_stored_request_and_every_json_view_of_it_read_strictly(world: World) -> None:
    """§2.1, §2.4: a request with a character beyond the first plane written as a surrogate
    pair, an accented letter, a 30-digit integer and 1e308 is stored as UTF-8 JSON a strict
    reader takes, and ``claim --json``, ``show --json``, ``list --json`` and
    ``status --json`` read strictly, the integer still an integer."""
    queue = world.queue("stored")
    text = (
        b'{"tool": "fs.read", "input": {"e": "\\ud83d\\ude00 caf\\u00e9",'
        b' "n": 123456789012345678901234567890, "f": 1e308}}'
    )
    published = queue.run("publish", "--name", "j1", "-", input=text)
    assert published.rc == 0, published
    (stored,) = read_strictly((queue.dir / "pending" / "j1.req.json").read_bytes())
    assert stored["input"]["e"] == "\U0001f600 café", stored
    assert stored["input"]["n"] == 123456789012345678901234567890, stored
    env = world.env
    project = ("--project", queue.project)
    (claimed,) = strict_run(ctx_bytes("queue", "claim", *project, "--json", env=env))
    assert claimed["request"]["input"] == stored["input"], claimed
    for args in (("show", "j1.req.json"), ("list",), ("status",)):
        run = ctx_bytes("queue", *args, *project, "--json", env=env)
        assert run.rc == 0, run
        strict_run(run)


def test_finish_keeps_bytes_that_are_not_json_as_strict_text(world: World) -> None:
    """§2.1, Q-4: a result that is not JSON and not UTF-8 (a stray byte, an encoded
    surrogate) is stored as text a strict reader takes; NaN is refused."""
    queue = world.queue("text-result")
    queue.publish(name="j1")
    queue.claim()
    refused = queue.run("finish", "j1", "--ok", "-", input=b'{"out": NaN}')
    assert refused.rc == 1 and "EINVAL" in refused.err, refused
    run = queue.run("finish", "j1", "--error", "-", input=b"plain \xff text \xed\xa0\x80")
    assert run.rc == 0, run
    (stored,) = read_strictly((queue.dir / "failed" / "j1.req.json.result").read_bytes())
    assert stored["status"] == "error" and stored["output"].startswith("plain "), stored


def test_a_workers_lines_results_and_events_read_strictly(world: World) -> None:
    """W-1, §2.1, §2.4, S-2: jobs whose tool writes bytes that are not UTF-8 on stdout and
    stderr, fails with such a stderr line, or answers a 30-digit integer: ``queue work
    --json`` prints JSON Lines a strict reader takes (integer pid and counts), each result
    file reads strictly, and so do ``show --json`` and the worker session's events."""
    queue = world.queue("worker")
    jobs = {
        "bytes": {"out": world.payload(b"caf\xe9 \xed\xa0\x80\n"), "err": world.payload(b"\xff\n")},
        "fails": {"err": world.payload(b"broke \xfe\xed\xa0\x80 here\n"), "exit": 3},
        "big": {"out": world.payload(b'{"n": 123456789012345678901234567890}')},
    }
    for name, tool_input in jobs.items():
        queue.publish({"tool": "bytes.echo", "input": tool_input}, name=name)
    run = ctx_bytes(
        "queue", "work", "--project", queue.project, "--agent", "coder", "--session",
        "worker-strict", "--drain", "--json", env=world.env,
    )  # fmt: skip
    assert run.rc == 0, run
    lines = strict_run(run, lines=True)
    assert lines[0]["event"] == "start" and type(lines[0]["pid"]) is int, lines
    assert lines[-1]["event"] == "stop" and (lines[-1]["done"], lines[-1]["failed"]) == (2, 1)
    for name in jobs:
        state, _ = queue.only_result(f"{name}.req.json")
        read_strictly((queue.dir / state / f"{name}.req.json.result").read_bytes())
        shown = ctx_bytes("queue", "show", name, "--project", queue.project, "--json",
                          env=world.env)  # fmt: skip
        strict_run(shown)
    read_strictly((world.events("worker-strict") / "events.jsonl").read_bytes(), lines=True)


# --- names that are not UTF-8 ----------------------------------------------------------


def test_status_json_names_ignored_entries_strictly_but_for_byte_escapes(world: World) -> None:
    """Q-8, §2.4: a queue holding an accented name, a dot-file, a symlink, a directory where
    a request belongs and names that are not UTF-8: ``status --json`` is UTF-8 JSON jq and
    node read, with integer counts; its reasons quote the odd bytes escaped, and the only
    lone surrogates are the byte escapes of the ignored paths, which give the bytes back."""
    queue = world.queue("ignored")
    pending = os.fsencode(queue.dir / "pending")
    planted = {b"caf\xc3\xa9.req.json", b".hidden", b"bad\xff.req.json", b"x\xed\xa0\x80"}
    for name in planted:
        with open(os.path.join(pending, name), "wb") as f:
            f.write(b"{}")
    os.symlink(b"/etc/passwd", os.path.join(pending, b"link\xfe.req.json"))
    os.mkdir(os.path.join(pending, b"dir.req.json"))
    planted |= {b"link\xfe.req.json", b"dir.req.json"}
    run = ctx_bytes("queue", "status", "--project", queue.project, "--json", env=world.env)
    assert run.rc in (0, 1), run
    paths: set[bytes] = set()

    def a_named_path(text: str) -> bool:
        return is_byte_escape(text) and text.startswith("pending/")

    (status,) = strict_run(run, allowed=a_named_path)
    assert all(type(n) is int for n in status["counts"].values()), status
    for entry in status["ignored"]:
        assert lone_surrogates(entry["reason"]) == [], entry
        paths.add(os.fsencode(entry["path"]))
    assert paths == {b"pending/" + name for name in planted}, paths


def test_a_storage_root_whose_path_is_not_utf8_is_named_by_byte_escapes_only(
    world: World, _template: Path
) -> None:
    """R-1, §2.4: a storage root at a path holding the byte 0xff: ``bootstrap --json``,
    ``queue init --json``, ``queue status --json`` and ``object list --json`` read strictly
    but for byte escapes, each of which names a path below that root."""
    top = new_scratch_dir(SCRATCH, "root-")
    try:
        root = copy_of_root(_template, Path(os.fsdecode(os.fsencode(top) + b"/r\xffoot")))
        env = clean_env(CTX_STORAGE=str(root))
        below = os.fsencode(root)

        def below_root(text: str) -> bool:
            return is_byte_escape(text) and os.fsencode(text).startswith(below)

        for args in (
            ("bootstrap", "--json"),
            ("queue", "init", "--project", "p", "--json"),
            ("queue", "status", "--project", "p", "--json"),
            ("object", "list", "--json"),
        ):
            run = ctx_bytes(*args, env=env)
            assert run.rc == 0, run
            strict_run(run, allowed=below_root)
    finally:
        shutil.rmtree(top, ignore_errors=True)


# --- S-2, S-5: stored session events ----------------------------------------------------------

S2 = '"ts": "2026-06-22T12:00:0{n}Z", "type": "note", "agent": "coder", "session": "{s}", '
S2 += '"object": "tool/fs.read", "status": "ok"'


def plant(world: World, session: str, lines: list[bytes]) -> None:
    directory = world.events(session)
    directory.mkdir(parents=True)
    (directory / "events.jsonl").write_bytes(b"".join(line + b"\n" for line in lines))
    for path in (directory, directory / "events.jsonl"):
        os.chown(path, world.uid, world.uid)


def event(n: int, session: str, extra: bytes) -> bytes:
    return b"{" + S2.format(n=n, s=session).encode() + extra + b"}"


def test_session_views_skip_stored_lines_a_strict_reader_refuses(world: World) -> None:
    """S-2, S-5: event lines someone stored holding a byte that is not UTF-8, NaN, 1e999, or
    two values on one line are skipped as damaged by ``session show --json`` and ``session
    tail --json``, which print JSON Lines every strict reader takes; a line giving a name
    twice comes out, if at all, with that name once."""
    session = "planted-damaged"
    plant(world, session, [
        event(0, session, b', "text": "fine \\u00e9"'),
        event(1, session, b', "text": "caf\xe9"'),
        event(2, session, b', "n": NaN'),
        event(3, session, b', "n": 1, "n": 2'),
        event(4, session, b', "m": 1e999'),
        event(5, session, b"") + b' {"a": 1}',
    ])  # fmt: skip
    for args in (("show", "coder", session), ("tail", "coder", session, "-n", "10")):
        run = ctx_bytes("session", *args, "--json", env=world.env)
        assert run.rc == 0, run
        shown = strict_run(run, lines=True)  # refuses a name given twice
        assert [e.get("text") for e in shown if "n" not in e] == ["fine é"], shown
        assert len(shown) <= 2, shown


# --- A-3, P-8, T-8a: agents, policies, objects --------------------------------------------------


def test_agent_create_refusals_quote_other_hostile_values_strictly(world: World) -> None:
    """A-3, §2.4: refusals of a label holding a lone surrogate, an unknown key holding one
    and a mount mode holding one are EINVAL in documents a strict reader takes."""
    for text in (
        b'{"name": "hostile0", "label": "c\\ud800_t"}',
        b'{"name": "hostile1", "label": "hostile1_t", "name\\udcff": 1}',
        b'{"name": "hostile2", "label": "hostile2_t", "mount": [["/tmp", "/w", "r\\udcff"]]}',
    ):
        run = ctx_bytes("agent", "create", "-", "--json", env=world.env, input=text)
        assert run.rc == 1, run
        (refusal,) = strict_run(run)
        assert refusal["error"] == "EINVAL" and type(refusal["errno"]) is int, refusal
    listed = ctx_bytes("agent", "list", "--json", env=world.env)
    assert listed.rc == 0 and all(a["name"] == "coder" for a in strict_run(listed)[0]), listed


def test_policy_and_object_views_of_bytes_that_are_not_utf8_read_strictly(
    world: World,
) -> None:
    """P-8, T-8a: ``policy check --json`` of a file whose rules hold bytes that are not
    UTF-8, ``policy query --json`` of a subject that is not UTF-8, and ``object list
    --json`` of a tool whose description control holds such bytes all read strictly."""
    policy = world.top / "hostile.policy"
    policy.write_bytes(
        b"allow coder_t tool:fs.read execute\nallow c\xff_t tool:fs.read execute\n"
        b"allow coder_t tool:caf\xc3\xa9 execute\n"
    )
    checked = ctx_bytes("policy", "check", policy, "--json", env=world.env)
    assert checked.rc == 1, checked
    (report,) = strict_run(checked)
    assert [p["line"] for p in report["files"][0]["problems"]] == [2, 3], report
    query = ctx_bytes(
        "policy", "query", "--policy", policy, "--json", os.fsdecode(b"x\xff_t"),
        "tool:fs.read", "execute", env=world.env,
    )  # fmt: skip
    assert query.rc == 2, query
    strict_run(query)
    description = world.storage / "tool" / "bytes.echo.d" / "description"
    kept = description.read_bytes()
    try:
        description.write_bytes(b"Says \xff\xfe \xed\xa0\x80 bytes.\n")
        listed = ctx_bytes("object", "list", "--json", env=world.env)
        assert listed.rc == 0, listed
        (objects,) = strict_run(listed)
        assert any(o["name"] == "bytes.echo" for o in objects), objects
    finally:
        description.write_bytes(kept)


# --- M-1, M-3: an MCP server's words ------------------------------------------------------------

MCP_SERVER = (
    WIRE
    + r"""
MODE = sys.argv[1]
while True:
    message = receive()
    if "id" not in message:
        continue
    method, ident = message.get("method"), message["id"]
    if method == "initialize":
        name = "s\ud800" if MODE == "lone" else "s"
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": name, "version": "0"}}})
    elif method == "tools/list" and MODE == "bytes":
        send_bytes(b'{"jsonrpc": "2.0", "id": %d, "result": {"tools": [{"name": "good", '
                   b'"description": "caf\xff \xed\xa0\x80", "inputSchema": {}}]}}\n' % ident)
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": [
            {"name": "good", "description": "One \ud800 two", "inputSchema": {"type": "object"}},
            {"name": "k\udcff", "description": "x", "inputSchema": {"type": "object"}},
            {"name": "fine", "description": "y", "inputSchema": {"type": "object"}}]}})
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
"""
)


def ctxmcp_list(world: World, mode: str) -> Run:
    mcp = world.top / f"mcp-{mode}"
    mcp.mkdir()
    (mcp / "server.py").write_text(MCP_SERVER)
    entry = {"command": str(PYTHON), "args": [str(mcp / "server.py"), mode]}
    (mcp / "mcp.json").write_text(json.dumps({"mcpServers": {"m": entry}}))
    argv = [CTXMCP, "list", "--config", mcp / "mcp.json", "--server", "m", "--json"]
    done = subprocess.run(argv, capture_output=True, env=world.env, timeout=60)
    run = Run([str(a) for a in argv[1:]], done.returncode, done.stdout.decode(errors="replace"),
              done.stderr.decode(errors="replace"))  # fmt: skip
    run.raw = done.stdout  # type: ignore[attr-defined]
    return run


@pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed in the venv")
def test_ctxmcp_list_refuses_a_server_writing_bytes_that_are_not_utf8_strictly(
    world: World,
) -> None:
    """M-1: a server whose tools/list line holds bytes that are not UTF-8 broke the
    protocol: ``ctxmcp list --json`` answers EPROTO, exit 1, in a document a strict reader
    takes."""
    run = ctxmcp_list(world, "bytes")
    assert run.rc == 1, run
    (refusal,) = strict_run(run)
    assert refusal["error"] == "EPROTO", refusal


@pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed in the venv")
def test_ctxmcp_list_reports_lone_surrogates_without_printing_them(world: World) -> None:
    """M-1, M-3: a server whose name and one tool's description hold ``"\\ud800"`` and one
    of whose tool names holds ``"\\udcff"``: ``ctxmcp list --json`` reports the tools that
    cannot be projected, with the projectable one, in a document a strict reader takes."""
    run = ctxmcp_list(world, "lone")
    assert run.rc == 0, run
    (listed,) = strict_run(run)
    assert [t["name"] for t in listed["tools"] if t["name"]] == ["m.fine"], listed
