"""Agent native mode with tools that write what a careful caller must still get framed, and
with inputs no tool should see (SPEC §6 T-3, T-7; §4 S-2, S-5; docs/tools.md "Agent native
mode and its frames", "The result", "Running a tool", "Process group and bounds").

The tools are real programs installed from v2 manifests (T-8) and granted to agent ``nf`` in
both layers of P-6: a Python program driven by its input (bytes on stdout and stderr, many
lines, partial last lines, a closed stdout, a wait for a file, an end by a signal or an exit
status), a shell script that keeps the exact line it was given, ``wc -c``, and a tool whose
schema holds a pattern that backtracks.  What is checked, call by call:

* stdout of ``ctx run --native`` is JSON Lines of the documented frames: one ``call`` first
  (exactly when the tool's process started; its fields ``call``, ``tool``, ``agent``,
  ``session``, ``pid``, ``ts``), ``stderr`` frames (``call``, ``text``) of its stderr lines in
  order, a partial last line included, a line over 64 KiB in pieces that split no character,
  and exactly one ``result`` frame, last, holding the whole result;
* ``output`` is the tool's JSON value when it printed one that every reader takes, else its
  text (``NaN``, ``Infinity``, ``1e999``, two values, nesting past 128 levels, bytes that are
  not UTF-8); output over 16 MiB is ``EFBIG`` at stage ``run``;
* ``exit_status`` is the tool's (0, 1, 2, 126, 127, 255; 128 + N after signal N), the error
  stage ``exit`` with no errno, and ``ctx run --native`` exits 0 for ``ok``, 2 for input that
  is not JSON or fails the schema, 1 otherwise, 74 when its frames cannot be written, 141
  when its reader left, 128 + N when it is stopped by signal N;
* input that is not one JSON object the schema takes (empty, blank, two values, an array, a
  number, a name given twice, ``NaN``, bytes that are not UTF-8, too deep) is refused at stage
  ``schema`` with a lone ``result`` frame and nothing started; input the runner takes reaches
  the tool as one ``json.dumps`` line (a byte order mark dropped); more than 16 MiB is
  ``EFBIG`` with nothing run or recorded;
* the session's ``tool_call``/``tool_result`` events and the tool's log line tell the same
  call as the ``result`` frame: status, exit status, errno, stage, duration.

Where SPEC and the docs say nothing (a name given twice in a tool's output, a byte order mark
before it, ``null`` printed by a tool), the tests pin the behaviour seen.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    rfc3339,
    scratch_top,
    wait_for,
)
from tests.acceptance.workercli import allow_in_tool_policy, make_agent
from tests.support.scratch_mounts import ScratchMounts
from tests.support.users import find_or_create_user, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root")

AGENT = "nf"
LABEL = "nf_t"
LIMIT = 16 * 1024 * 1024  # what a tool may print, and what a native input may hold
PIECE = 64 * 1024  # the largest stderr frame's piece of a line

CALL_KEYS = {"type", "call", "tool", "agent", "session", "pid", "ts"}
STDERR_KEYS = {"type", "call", "text"}
RESULT_KEYS = {
    "type", "status", "tool", "agent", "session", "call", "mode", "output", "exit_status",
    "error", "stderr", "post_hooks", "started", "finished", "timings_ms",
}  # fmt: skip
ERROR_KEYS = {"error", "errno", "stage", "step", "step_name", "message"}

# The tool most tests run: it does the steps its input lists, then exits or kills itself.
DO_PROGRAM = """\
#!/usr/bin/python3
import json, os, signal, sys, time


def put(fd, data):
    while data:
        data = data[os.write(fd, data):]


spec = json.loads(sys.stdin.readline())
for kind, *args in spec.get("steps", []):
    if kind == "out":
        put(1, bytes.fromhex(args[0]))
    elif kind == "err":
        put(2, bytes.fromhex(args[0]))
    elif kind == "out_times":
        put(1, bytes.fromhex(args[0]) * args[1])
    elif kind == "err_lines":
        put(2, b"".join(b"line %d\\n" % i for i in range(args[0])))
    elif kind == "out_lines":
        put(1, b"".join(b"row %d\\n" % i for i in range(args[0])))
    elif kind == "close_out":
        os.close(1)
    elif kind == "pid":
        put(1, json.dumps({"pid": os.getpid(), "pgid": os.getpgid(0)}).encode())
    elif kind == "wait_for":
        deadline = time.monotonic() + 20
        while not os.path.exists(args[0]) and time.monotonic() < deadline:
            time.sleep(0.01)
    elif kind == "touch":
        open(args[0], "w").close()
if "signal" in spec:
    os.kill(os.getpid(), getattr(signal, spec["signal"]))
    time.sleep(10)
os._exit(spec.get("exit", 0))
"""

WC_PROGRAM = "#!/bin/sh\nwc -c\n"
REDOS_SCHEMA = {
    "type": "object",
    "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}},
}


def keep_program(box: Path) -> str:
    """Keeps the exact bytes it was given on stdin, named by session and call, once it has
    read them to their end (a tool killed before it was given its input keeps nothing)."""
    return (
        "#!/usr/bin/python3\nimport os, sys\ndata = sys.stdin.buffer.read()\n"
        f'name = "{box}/in." + os.environ["CTX_SESSION"] + "." + os.environ["CTX_CALL"]\n'
        'with open(name, "wb") as kept:\n    kept.write(data)\nprint("kept")\n'
    )


def strict_json(line: bytes):
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(line, parse_constant=refuse)


def step_input(*steps, exit: int = 0, signal_name: str | None = None) -> dict:
    """The input of ``x.do``: byte strings in steps are sent as hex."""
    encoded = [[a.hex() if isinstance(a, bytes) else a for a in step] for step in steps]
    value: dict = {"steps": encoded, "exit": exit}
    if signal_name is not None:
        value["signal"] = signal_name
    return value


@dataclass
class Native:
    """One ``ctx run --native``: the command's outcome and its frames."""

    run: Run
    raw: bytes
    frames: list[dict]

    @property
    def result(self) -> dict:
        return self.frames[-1]

    @property
    def texts(self) -> list[str]:
        return [f["text"] for f in self.frames if f["type"] == "stderr"]


@dataclass
class World:
    storage: Path
    box: Path  # every uid may write here: kept inputs and markers

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def native(self, tool: str, data: bytes | dict, session: str, *options: str) -> Native:
        if isinstance(data, dict):
            data = json.dumps(data).encode()
        argv = [*CTX_ARGV, "run", "--native", "--agent", AGENT, "--session", session]
        proc = subprocess.run([*argv, *options, tool], input=data, capture_output=True,
                              env=self.env, timeout=120)  # fmt: skip
        run = Run(argv[1:], proc.returncode, "", proc.stderr.decode("utf-8", "replace"))
        assert "Traceback" not in run.err, run.err
        frames = [strict_json(line) for line in proc.stdout.split(b"\n")[:-1]]
        assert proc.stdout.endswith(b"\n") or not proc.stdout, proc.stdout[-300:]
        return Native(run, proc.stdout, frames)

    def events(self, session_dir: str, call: str) -> list[dict]:
        path = self.storage / session_dir / "events.jsonl"
        return [e for e in map(strict_json, path.read_bytes().splitlines()) if e["call"] == call]

    def logged(self, tool: str, call: str) -> list[dict]:
        raw = (self.storage / f"tool/{tool}.d/log").read_bytes().splitlines()
        return [e for e in map(strict_json, raw) if e.get("call") == call]

    def kept(self, session: str) -> list[Path]:
        return sorted(self.box.glob(f"in.{session}.*"))


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    top = new_scratch_dir(scratch_top(__file__), "w")
    storage = top / "storage"
    box = top / "box"
    box.mkdir()
    box.chmod(0o1777)
    made = ctx_run("bootstrap", "--storage", storage)
    assert made.rc == 0, made
    src = top / "src"
    src.mkdir()
    tools = {
        "x.do": (DO_PROGRAM, {"type": "object"}),
        "x.keep": (keep_program(box), {"type": "object"}),
        "x.wc": (WC_PROGRAM, {"type": "object"}),
        "x.redos": ("#!/bin/sh\ncat >/dev/null\necho ran\n", REDOS_SCHEMA),
    }
    for name, (program, schema) in tools.items():
        (src / f"{name}.prog").write_text(program)
        manifest = src / f"{name}.json"
        manifest.write_text(json.dumps({
            "manifest": 2, "kind": "tool", "name": name, "description": f"The {name} tool.",
            "schema": schema, "cap": {"side_effects": False, "network": False},
            "exec": f"{name}.prog",
        }))  # fmt: skip
        r = ctx_run("object", "install", "--source", storage, manifest, "--tier", "system")
        assert r.rc == 0, r
    make_agent(storage, list(tools), name=AGENT)
    for name in tools:
        allow_in_tool_policy(storage, name, LABEL)
    yield World(storage, box)
    shutil.rmtree(top, ignore_errors=True)


def framed(native: Native, *, started: bool = True) -> dict:
    """The frames are those of docs/tools.md: ``call`` first exactly when the tool started,
    ``stderr`` frames, one ``result`` last, all of one call, each with its fields."""
    frames = native.frames
    kinds = [f["type"] for f in frames]
    assert kinds and kinds[-1] == "result" and kinds.count("result") == 1, kinds[:5]
    assert set(kinds) <= {"call", "stderr", "result"}, set(kinds)
    if started:
        assert kinds[0] == "call" and kinds.count("call") == 1, kinds[:5]
    else:
        assert kinds == ["result"], kinds[:5]
    assert len({f["call"] for f in frames}) == 1, frames[:3]
    result = frames[-1]
    assert set(result) == RESULT_KEYS, set(result) ^ RESULT_KEYS
    assert result["mode"] == "native" and result["agent"] == AGENT
    assert (result["status"] == "ok") == (result["error"] is None), result
    if result["error"] is not None:
        assert set(result["error"]) == ERROR_KEYS, result["error"]
    for stamp in (result["started"], result["finished"]):
        rfc3339(stamp)
    for frame in frames[:-1]:
        assert set(frame) == (CALL_KEYS if frame["type"] == "call" else STDERR_KEYS), frame
    if started:
        call = frames[0]
        assert (call["tool"], call["agent"], call["session"]) == (
            result["tool"], AGENT, result["session"],
        )  # fmt: skip
        assert isinstance(call["pid"], int) and call["pid"] > 1
        rfc3339(call["ts"])
    return result


def recorded(world: World, result: dict) -> dict:
    """The session's events and the tool's log hold the call as the ``result`` frame tells it
    (T-7, S-2): one ``tool_call`` and one ``tool_result``, one log line, the same facts."""
    events = world.events(result["session"], result["call"])
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    error = result["error"] or {}
    logged = world.logged(result["tool"], result["call"])
    assert len(logged) == 1, logged
    for record in (events[1], logged[0]):
        assert record["status"] == result["status"], (record, result["status"])
        assert record["exit_status"] == result["exit_status"], record
        assert record.get("errno") == error.get("error"), record
        assert record.get("stage") == error.get("stage"), record
        assert record["duration_ms"] == result["timings_ms"]["total"], record
        assert record["object"] == f"tool/{result['tool']}" and record["agent"] == AGENT
    assert logged[0]["session_dir"] == result["session"], logged[0]
    return events[1]


# ----------------------------------------------------------------------- what stdout holds

DEEP_OK = b"[" * 128 + b"]" * 128
DEEP_TOO = b"[" * 129 + b"]" * 129

OUTPUTS = [
    ("object", b'{"a": 1, "b": [true, null]}\n', {"a": 1, "b": [True, None]}),
    ("blank-around", b"  [1, 2] \n\n", [1, 2]),
    ("string", b'"just text"', "just text"),
    ("words", b"plain words\n", "plain words\n"),
    ("nan", b'{"a": NaN}', '{"a": NaN}'),
    ("infinity", b'{"a": -Infinity}\n', '{"a": -Infinity}\n'),
    ("beyond-float", b"[1e999]", "[1e999]"),
    ("two-values", b'{"a": 1}\n{"b": 2}\n', '{"a": 1}\n{"b": 2}\n'),
    ("json-then-text", b'{"a": 1} trailing', '{"a": 1} trailing'),
    ("deep-128", DEEP_OK, json.loads(DEEP_OK)),
    ("deep-129", DEEP_TOO, DEEP_TOO.decode()),
    ("not-utf8", b"\xff\x00ok\xe2\x82", "\ufffd\x00ok\ufffd"),
    ("nothing", b"", ""),
    # Not said by the docs; pinned as seen: the last of a name given twice counts, a byte
    # order mark makes the output text, and a printed null is null (as "never ran" is).
    ("name-twice", b'{"a": 1, "a": 2}', {"a": 2}),
    ("bom", b'\xef\xbb\xbf{"a": 1}', '\ufeff{"a": 1}'),
    ("null", b"null\n", None),
]


@pytest.mark.parametrize(("case", "stdout", "expected"), OUTPUTS, ids=[c[0] for c in OUTPUTS])
def test_the_output_is_the_json_value_every_reader_takes_else_the_text(
    world, case, stdout, expected
):
    """docs/tools.md "The result": ``output`` is the tool's JSON value when it printed one,
    else its text; JSON that readers disagree on (NaN, the infinities, a number beyond a
    float, nesting deeper than 128 levels), two values and bytes that are not UTF-8 stay
    text; the frames stay strict JSON whatever was printed, and the records agree."""
    native = world.native("x.do", step_input(("out", stdout)), f"out-{case}")
    assert native.run.rc == 0, native.run
    result = framed(native)
    assert result["status"] == "ok" and result["exit_status"] == 0
    assert result["output"] == expected
    assert native.texts == []
    event = recorded(world, result)
    if len(json.dumps(expected)) < 200:  # a longer one is summarised (S-4)
        assert event.get("output") == expected, event


# ----------------------------------------------------------------------- stderr frames


def test_stderr_lines_arrive_as_frames_partial_blank_and_not_utf8_ones_included(world):
    """A ``stderr`` frame per line, in order: blank lines are frames with empty text, a
    ``\\r`` stays in the text, bytes that are not UTF-8 become U+FFFD, Unicode line
    separators do not split a line, and a last line without a newline still arrives; the
    result's ``stderr`` is the whole of it (it is under 64 KiB), and the frames stay one per
    physical line for a reader that splits at any line boundary."""
    err = (
        b"first\n\n\r\n"
        b"a\r\nb\rc\n"
        b"\xff\xfebin\x00x\n"
        b"sep\xe2\x80\xa8nel\xc2\x85rs\x1eend\n"
        b"no newline at the end"
    )
    native = world.native("x.do", step_input(("out", b"out\n"), ("err", err)), "stderr-shapes")
    assert native.run.rc == 0, native.run
    result = framed(native)
    assert native.texts == [
        "first", "", "\r", "a\r", "b\rc", "\ufffd\ufffdbin\x00x",
        "sep\u2028nel\x85rs\x1eend", "no newline at the end",
    ]  # fmt: skip
    assert result["stderr"] == err.decode("utf-8", "replace")
    assert result["output"] == "out\n"
    text = native.raw.decode()
    assert len(text.splitlines()) == len(native.frames) == text.count("\n")
    recorded(world, result)


def test_a_line_over_64_kib_arrives_in_pieces_that_split_no_character(world):
    """docs/tools.md: a stderr line longer than 64 KiB arrives in pieces of at most 64 KiB, no
    character split; a line of exactly 64 KiB is one frame; the pieces join to the line."""
    euro_line = "ab" + "\u20ac" * 30000
    emoji_line = "c" * (PIECE - 1) + "\U0001f600tail"
    err = (
        b"x" * PIECE + b"\n"
        + b"y" * (PIECE + 1) + b"\n"
        + euro_line.encode() + b"\n"
        + emoji_line.encode() + b"\n"
    )  # fmt: skip
    native = world.native("x.do", step_input(("err", err)), "pieces")
    assert native.run.rc == 0, native.run
    result = framed(native)
    texts = native.texts
    assert all(len(t.encode()) <= PIECE for t in texts), [len(t.encode()) for t in texts]
    assert texts[0] == "x" * PIECE
    assert texts[1:3] == ["y" * PIECE, "y"]
    rest = texts[3:]
    joined, lines = "", []
    for piece in rest:  # the pieces of the third and fourth lines, in order
        joined += piece
        if joined in (euro_line, emoji_line):
            lines.append(joined)
            joined = ""
    assert lines == [euro_line, emoji_line] and joined == "", [len(t) for t in rest]
    assert len(rest) == 4, [len(t) for t in rest]
    recorded(world, result)


def test_many_lines_on_both_streams(world):
    """20 000 stderr lines are 20 000 frames in order before the one ``result``; 20 000
    stdout lines are the output text, all of it; the result's ``stderr`` is the last 64 KiB."""
    native = world.native("x.do", step_input(("out_lines", 20000), ("err_lines", 20000)), "many")
    assert native.run.rc == 0, native.run
    result = framed(native)
    assert native.texts == [f"line {i}" for i in range(20000)]
    assert result["output"] == "".join(f"row {i}\n" for i in range(20000))
    whole = "".join(f"line {i}\n" for i in range(20000))
    assert len(result["stderr"].encode()) <= PIECE and whole.endswith(result["stderr"])
    assert len(result["stderr"]) > PIECE - 100
    event = recorded(world, result)
    assert len(json.dumps(event)) < 64 * 1024, len(json.dumps(event))


# ----------------------------------------------------------------------- size of the output


def test_output_of_exactly_the_limit_is_kept_and_one_byte_more_is_efbig(world):
    """docs/tools.md: captured output is limited to 16 MiB; exactly that much is the output,
    one byte more ends the call with ``EFBIG`` at stage ``run`` (exit 1), and so does far
    more; the session and the tool's log record the same error."""
    native = world.native("x.do", step_input(("out_times", b"a", LIMIT)), "big-ok")
    assert native.run.rc == 0, native.run
    result = framed(native)
    assert result["status"] == "ok" and result["output"] == "a" * LIMIT
    recorded(world, result)

    for session, size in (("big-over", LIMIT + 1), ("big-far", 3 * LIMIT)):
        native = world.native("x.do", step_input(("out_times", b"a", size)), session)
        assert native.run.rc == 1, native.run
        result = framed(native)
        assert result["status"] == "error", result["error"]
        assert (result["error"]["error"], result["error"]["stage"]) == ("EFBIG", "run")
        assert str(LIMIT) in result["error"]["message"]
        assert isinstance(result["output"], str) and len(result["output"]) <= LIMIT
        recorded(world, result)


# ----------------------------------------------------------------------- how the tool ends


@pytest.mark.parametrize("code", [0, 1, 2, 126, 127, 255])
def test_exit_statuses_are_the_tools_in_the_result_and_ctx_exits_0_or_1(world, code):
    """The result's ``exit_status`` is the tool's own, 126 and 127 included (a tool that ran
    and exited so, not one that could not start): stage ``exit`` without an errno and the
    last stderr line in the message; ``ctx run --native`` exits 0 for ``ok``, 1 otherwise,
    while terminal mode exits with the tool's status."""
    value = step_input(("out", b'{"partial": true}'), ("err", b"why: %d\n" % code), exit=code)
    native = world.native("x.do", value, f"exit-{code}")
    assert native.run.rc == (0 if code == 0 else 1), native.run
    result = framed(native)
    assert result["exit_status"] == code
    assert result["output"] == {"partial": True}
    assert native.texts == [f"why: {code}"]
    if code == 0:
        assert result["error"] is None
    else:
        assert result["error"]["stage"] == "exit" and result["error"]["errno"] is None
        assert result["error"]["message"] == f"x.do exited with status {code}: why: {code}"
    recorded(world, result)

    terminal = ctx_run("run", "--agent", AGENT, "--session", f"exit-{code}", "x.do",
                       input=json.dumps(value), env=world.env)  # fmt: skip
    assert terminal.rc == code, terminal


@pytest.mark.parametrize("name", ["SIGSEGV", "SIGKILL", "SIGTERM", "SIGABRT"])
def test_output_then_a_crash_by_signal(world, name):
    """A tool that printed output and a stderr line, then died by a signal: 128 + N as its
    exit status, stage ``exit``, the output and the stderr frame kept, exit 1; the records
    say the same."""
    number = getattr(signal, name)
    value = step_input(("out", b'{"half": '), ("err", b"about to go\n"), signal_name=name)
    native = world.native("x.do", value, f"crash-{name}")
    assert native.run.rc == 1, native.run
    result = framed(native)
    assert result["exit_status"] == 128 + number
    assert result["error"]["stage"] == "exit" and result["error"]["errno"] is None
    assert result["error"]["message"].endswith(": about to go"), result["error"]
    assert result["output"] == '{"half": '
    assert native.texts == ["about to go"]
    recorded(world, result)


def test_stderr_only_nothing_at_all_and_a_closed_stdout(world):
    """A tool that writes only to stderr, one that writes nothing, and one that closes its
    stdout first and goes on: each is ``ok`` with the empty text as output, its frames
    ``call``, its stderr lines, ``result``."""
    cases = {
        "err-only": (step_input(("err", b"only here\n")), ["only here"]),
        "silent": (step_input(), []),
        "closed-out": (step_input(("close_out",), ("err", b"still\n")), ["still"]),
    }
    for session, (value, texts) in cases.items():
        native = world.native("x.do", value, session)
        assert native.run.rc == 0, (session, native.run)
        result = framed(native)
        assert (result["status"], result["output"], result["exit_status"]) == ("ok", "", 0)
        assert native.texts == texts
        assert [f["type"] for f in native.frames] == ["call"] + ["stderr"] * len(texts) + ["result"]
        recorded(world, result)


def test_the_call_frame_names_the_tools_own_process_and_group(world):
    """The ``call`` frame's ``pid`` is the tool's process, the leader of its own process
    group (docs/tools.md "Process group and bounds")."""
    native = world.native("x.do", step_input(("pid",)), "pid")
    assert native.run.rc == 0, native.run
    result = framed(native)
    assert result["output"] == {"pid": native.frames[0]["pid"], "pgid": native.frames[0]["pid"]}
    recorded(world, result)


# ----------------------------------------------------------------------- the caller's side


def test_a_reader_that_left_ends_ctx_quietly_while_the_tool_runs_to_its_end(world):
    """docs/tools.md: a reader that left (``| head -1``) ends ``ctx run`` quietly with exit
    141; the tool, still writing stderr lines after that, runs to its end, and its result is
    recorded as usual."""
    go, done = world.box / "go-reader", world.box / "done-reader"
    value = step_input(("err", b"first\n"), ("wait_for", str(go)), ("err_lines", 3000),
                       ("touch", str(done)), ("out", b'{"n": 3000}'))  # fmt: skip
    argv = [*CTX_ARGV, "run", "--native", "--agent", AGENT, "--session", "reader", "x.do"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=world.env)  # fmt: skip
    try:
        proc.stdin.write(json.dumps(value).encode())
        proc.stdin.close()
        first = strict_json(proc.stdout.readline())
        second = strict_json(proc.stdout.readline())
        assert (first["type"], second["type"], second["text"]) == ("call", "stderr", "first")
        proc.stdout.close()
        go.touch()
        assert proc.wait(timeout=60) == 141
        assert proc.stderr.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert done.exists(), "the tool was not let run to its end"
    events = world.events(f"home/{uid_of(world)}/agent/{AGENT}/session/reader", first["call"])
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    assert events[1]["status"] == "ok" and events[1]["exit_status"] == 0, events[1]
    assert events[1]["output"] == {"n": 3000}
    assert len(world.logged("x.do", first["call"])) == 1


def uid_of(world: World) -> int:
    identity = world.storage / f"agent/{AGENT}.d/identity"
    return json.loads(identity.read_text())["uid"]


def output_stage_call(world: World, session: str) -> dict:
    """The one call of ``session``, which never reached the tool: its ``tool_result``."""
    path = world.storage / f"home/{uid_of(world)}/agent/{AGENT}/session/{session}/events.jsonl"
    events = [strict_json(line) for line in path.read_bytes().splitlines()]
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    assert world.kept(session) == [], "the tool was given its input"
    assert len(world.logged("x.keep", events[1]["call"])) == 1
    return events[1]


def test_an_output_that_cannot_take_the_call_frame_gives_the_tool_no_input(world):
    """docs/tools.md stage ``output``: with stdout on ``/dev/full`` ctx exits 74 saying the
    tool was killed before it was given its input; with a pipe nobody reads, quietly 141;
    either way the call is recorded at stage ``output``, exit status null."""
    with open("/dev/full", "wb") as full:
        proc = subprocess.run([*CTX_ARGV, "run", "--native", "--agent", AGENT, "--session",
                               "to-full", "x.keep"], input=b"{}", stdout=full,
                              stderr=subprocess.PIPE, env=world.env, timeout=60)  # fmt: skip
    assert proc.returncode == 74, proc
    said = proc.stderr.decode()
    assert said.startswith("ctx: ENOSPC: cannot write standard output"), said
    assert "x.keep was killed before it was given its input" in said, said
    assert "the call is recorded in session" in said, said
    event = output_stage_call(world, "to-full")
    assert (event["errno"], event["stage"], event["exit_status"]) == ("ENOSPC", "output", None)

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([*CTX_ARGV, "run", "--native", "--agent", AGENT, "--session",
                               "to-gone", "x.keep"], input=b"{}", stdout=write_end,
                              stderr=subprocess.PIPE, env=world.env, timeout=60)  # fmt: skip
    finally:
        os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == b"", proc
    event = output_stage_call(world, "to-gone")
    assert (event["errno"], event["stage"], event["exit_status"]) == ("EPIPE", "output", None)


def test_frames_lost_to_a_full_disk_after_the_first_leave_the_call_recorded(world):
    """docs/tools.md: a frame after ``call`` that cannot be written lets the tool run to its
    end and its result be recorded; ctx exits 74 saying the tool ran and exited 0 and where
    the call is recorded; what reached the disk begins with the whole ``call`` frame."""
    mounts = ScratchMounts(new_scratch_dir(scratch_top(__file__), "m"))
    try:
        small = mounts.tmpfs("small", "size=4k")
        with open(small / "frames", "wb") as out:
            proc = subprocess.run([*CTX_ARGV, "run", "--native", "--agent", AGENT, "--session",
                                   "disk-full", "x.do"],
                                  input=json.dumps(step_input(("err_lines", 2000),
                                                              ("out", b'{"n": 2000}'))).encode(),
                                  stdout=out, stderr=subprocess.PIPE, env=world.env,
                                  timeout=60)  # fmt: skip
        written = (small / "frames").read_bytes()
    finally:
        mounts.close()
    assert proc.returncode == 74, proc
    said = proc.stderr.decode()
    assert said.startswith("ctx: ENOSPC: cannot write standard output"), said
    assert "x.do ran and exited 0; the call is recorded in session" in said, said
    call = strict_json(written.split(b"\n")[0])
    assert call["type"] == "call" and set(call) == CALL_KEYS
    session = f"home/{uid_of(world)}/agent/{AGENT}/session/disk-full"
    events = world.events(session, call["call"])
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    assert events[1]["status"] == "ok" and events[1]["output"] == {"n": 2000}
    assert len(world.logged("x.do", call["call"])) == 1


def test_a_closed_standard_output_is_no_place_for_the_frames(world):
    """A native call's whole answer is its frames.  Started with standard output closed, ctx
    must not act and print them into nothing: like an output that cannot take the ``call``
    frame (``1</dev/null`` is refused so, ``EBADF``), the tool is not given its input and ctx
    exits non-zero saying ``EBADF`` (docs/queue.md: a command whose answer is its standard
    output refuses to start without one)."""
    proc = subprocess.run([*CTX_ARGV, "run", "--native", "--agent", AGENT, "--session",
                           "closed-1", "x.keep"], input=b"{}", stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, env=world.env, timeout=60,
                          preexec_fn=lambda: os.close(1))  # fmt: skip
    assert proc.returncode != 0 and b"EBADF" in proc.stderr, proc
    assert world.kept("closed-1") == [], "the tool was given its input"


def stopped_call(world: World, name: str, session: str) -> tuple[Native, dict]:
    """``ctx run --native`` of a tool that printed ``{"printed": 1}`` and a stderr line and
    then waits, sent signal ``name`` once the stderr frame arrived: its frames and result."""
    never = world.box / f"never-{session}"
    value = step_input(("out", b'{"printed": 1}'), ("err", b"waiting\n"), ("wait_for", str(never)))
    argv = [*CTX_ARGV, "run", "--native", "--agent", AGENT, "--session", session, "x.do"]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=world.env)  # fmt: skip
    try:
        proc.stdin.write(json.dumps(value).encode())
        proc.stdin.close()
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        assert b'"waiting"' in lines[1], lines
        proc.send_signal(getattr(signal, name))
        rest, err = proc.stdout.read(), proc.stderr.read()
        status = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    raw = b"".join(lines) + rest
    native = Native(Run(argv[1:], status, "", err.decode()), raw,
                    [strict_json(x) for x in raw.split(b"\n")[:-1]])  # fmt: skip
    return native, framed(native)


@pytest.mark.parametrize(("name", "status"), [("SIGTERM", 143), ("SIGINT", 130)])
def test_ctx_stopped_by_a_signal_still_gives_one_result_frame(world, name, status):
    """SIGTERM or SIGINT to ``ctx run --native`` while its tool runs: the tool's group is
    killed, the caller still gets exactly one ``result`` frame (``EINTR`` at stage ``run``,
    the tool's exit status 137), ctx exits 128 + N naming the signal, and the records hold
    the same."""
    native, result = stopped_call(world, name, f"sig-{name}")
    assert native.run.rc == status, native.run
    assert (result["error"]["error"], result["error"]["stage"]) == ("EINTR", "run")
    assert result["exit_status"] == 137
    assert set(native.texts) == {"waiting"}
    assert f"({name})" in native.run.err, native.run.err
    recorded(world, result)


def test_a_stopped_call_keeps_what_the_tool_had_printed(world):
    """docs/tools.md "The result": ``output`` is the tool's stdout, null only when it never
    ran, and ``stderr`` the tail of its stderr.  A tool that printed both before its caller
    was stopped ran (its exit status 137 says so): as after a timeout, which keeps them, the
    ``result`` frame and the ``tool_result`` keep what it printed."""
    native, result = stopped_call(world, "SIGTERM", "sig-kept")
    assert result["exit_status"] == 137 and set(native.texts) == {"waiting"}
    event = recorded(world, result)
    assert result["stderr"] == "waiting\n", result["stderr"]
    assert result["output"] == {"printed": 1}, result["output"]
    assert event.get("output") == {"printed": 1}, event


def blocked_writing(pid: int) -> bool:
    """Whether process ``pid`` sleeps in a write to a full pipe."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text().endswith("pipe_write")
    except OSError:
        return False


def test_a_stop_while_frames_wait_on_the_reader_repeats_no_frame(world):
    """A caller that reads its frames slower than the tool writes stderr lines, then stops
    ``ctx run --native`` (Ctrl-C, SIGTERM): what reaches it must still be each frame once,
    in order, then one ``result`` frame (the docs: "what it printed is done").  The stop
    comes while ctx waits to write a frame to the full pipe; a few tries, each a stop at
    that moment."""
    value = step_input(("err_lines", 200000))
    for attempt, name in enumerate(["SIGINT", "SIGTERM"] * 4):
        argv = [*CTX_ARGV, "run", "--native", "--agent", AGENT, "--session", f"full-{attempt}",
                "x.do"]  # fmt: skip
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=world.env, bufsize=0)  # fmt: skip
        try:
            proc.stdin.write(json.dumps(value).encode())
            proc.stdin.close()
            proc.stdin = None  # written and closed: nothing for communicate to send
            first = proc.stdout.readline()  # unbuffered: nothing read beyond the line
            wait_for(functools.partial(blocked_writing, proc.pid), seconds=10, step=0.01)
            proc.send_signal(getattr(signal, name))
            rest, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        raw = first + rest
        native = Native(Run(argv[1:], proc.returncode, "", err.decode()), raw,
                        [strict_json(x) for x in raw.split(b"\n")[:-1]])  # fmt: skip
        result = framed(native)
        assert result["error"]["error"] == "EINTR", result["error"]
        assert native.texts == [f"line {i}" for i in range(len(native.texts))], (
            name, [t for t in native.texts if native.texts.count(t) > 1][:3],
        )  # fmt: skip


# ----------------------------------------------------------------------- inputs

DEEP_INPUT = b'{"a": ' + b"[" * 128 + b"]" * 128 + b"}"

REFUSED_INPUTS = [
    ("empty", b"", "is not JSON"),
    ("blank", b"  \n\t \n", "is not JSON"),
    ("two-values", b"{} {}", "is not JSON"),
    ("two-lines", b'{"a": 1}\n{"b": 2}\n', "is not JSON"),
    ("array", b'[{"a": 1}]', "is not of type 'object'"),
    ("number", b"5", "is not of type 'object'"),
    ("string", b'"{}"', "is not of type 'object'"),
    ("null", b"null", "is not of type 'object'"),
    ("name-twice", b'{"a": 1, "a": 2}', "twice"),
    ("nan", b'{"a": NaN}', "is not JSON"),
    ("beyond-float", b'{"a": 1e999}', "is not JSON"),
    ("utf16-bom", b"\xff\xfe{\x00}\x00", "is not JSON"),
    ("bom-only", b"\xef\xbb\xbf", "is not JSON"),
    ("latin1", b'{"a": "caf\xe9"}', "is not JSON"),
    ("too-deep", DEEP_INPUT, "deeper than 128"),
]


@pytest.mark.parametrize(("case", "data", "says"), REFUSED_INPUTS,
                         ids=[c[0] for c in REFUSED_INPUTS])  # fmt: skip
def test_input_that_is_not_one_json_object_is_refused_before_the_tool_starts(
    world, case, data, says
):
    """docs/tools.md: input that is not JSON, or that JSON readers disagree on, or that the
    schema refuses, is a lone ``result`` frame with ``EINVAL`` at stage ``schema``, exit 2;
    no ``call`` frame, the tool never started, and the call recorded in the session."""
    native = world.native("x.keep", data, f"in-{case}")
    assert native.run.rc == 2, native.run
    result = framed(native, started=False)
    assert (result["error"]["error"], result["error"]["stage"]) == ("EINVAL", "schema")
    assert says in result["error"]["message"], result["error"]["message"]
    assert result["exit_status"] is None and result["output"] is None
    assert world.kept(f"in-{case}") == []
    recorded(world, result)


def test_input_reaches_the_tool_as_one_json_dumps_line(world):
    """docs/tools.md: the input is passed as one line in ``json.dumps``'s form: a byte order
    mark before it dropped, blanks and compact spellings normalised, non-ASCII escaped, a
    nesting of exactly 128 levels accepted."""
    cases = {
        "bom": (b'\xef\xbb\xbf{"a":1}', b'{"a": 1}\n'),
        "spaced": (b' \n{ "b" :[1,2] ,\n"c":{"d":null} }\n\n',
                   b'{"b": [1, 2], "c": {"d": null}}\n'),
        "accents": ('{"a":"\u00e9\u20ac"}'.encode(), b'{"a": "\\u00e9\\u20ac"}\n'),
        "deep": (b'{"a": ' + b"[" * 127 + b"]" * 127 + b"}", b'{"a": ' + b"[" * 127 + b"]" * 127
                 + b"}\n"),
    }  # fmt: skip
    for case, (data, line) in cases.items():
        native = world.native("x.keep", data, f"line-{case}")
        assert native.run.rc == 0, (case, native.run)
        result = framed(native)
        assert result["output"] == "kept\n"
        kept = world.kept(f"line-{case}")
        assert [p.name for p in kept] == [f"in.line-{case}.{result['call']}"]
        assert kept[0].read_bytes() == line, case
        recorded(world, result)


def test_input_of_the_limit_runs_and_more_is_efbig_with_nothing_run_or_recorded(world):
    """docs/tools.md: at most 16 MiB of input; exactly that much reaches the tool (as a
    compact line when ``json.dumps``'s escapes would make it longer); one byte more, or an
    endless stream, is ``ctx: EFBIG`` and exit 1, with no frame, nothing run, no session."""
    head = b'{"a": "'
    ascii_input = head + b"x" * (LIMIT - len(head) - 2) + b'"}'
    accents = "\u00e9" * ((LIMIT - 9) // 2)
    accented_input = ('{"a":"' + accents + '"}').encode()
    assert len(ascii_input) == LIMIT and len(accented_input) <= LIMIT
    for session, data in (("limit-ascii", ascii_input), ("limit-accents", accented_input)):
        native = world.native("x.wc", data, session)
        assert native.run.rc == 0, native.run
        result = framed(native)
        assert result["output"] == len(data) + 1, result["output"]
        recorded(world, result)

    session_root = world.storage / f"home/{uid_of(world)}/agent/{AGENT}/session"
    for session, data in (("over-1", ascii_input + b" "), ("over-many", b" " * (3 * LIMIT))):
        native = world.native("x.wc", data, session)
        assert native.run.rc == 1, native.run
        assert native.raw == b"", native.raw[:300]
        assert native.run.err.startswith("ctx: EFBIG: standard input holds more than 16777216")
        assert not (session_root / session).exists()


def test_a_schema_check_that_times_out_is_no_usage_error(world):
    """docs/tools.md: ``ctx run --native`` exits 2 when the input is not JSON or fails the
    schema, 1 otherwise.  An input whose check against a backtracking pattern ran out of the
    call's time has not failed the schema (a longer timeout may take it): ``ETIMEDOUT`` at
    stage ``schema`` is a failure of the tool's schema, and exits 1."""
    native = world.native("x.redos", {"s": "a" * 40 + "!"}, "redos", "--timeout", "1")
    result = framed(native, started=False)
    assert (result["error"]["error"], result["error"]["stage"]) == ("ETIMEDOUT", "schema")
    recorded(world, result)
    assert native.run.rc == 1, native.run


# ----------------------------------------------------------------------- a non-root host


def test_a_non_root_host_administrator_gets_the_same_frames():
    """docs/tools.md: the owner of a storage root may run its agents (their uid its own,
    the network cut by a user namespace): the same frames for a tool that writes partial
    lines and bytes that are not UTF-8 and then exits 3, the ``call`` frame's pid the tool's
    own, and the records agree."""
    user = find_or_create_user()
    top = new_scratch_dir(scratch_top(__file__), "u")
    try:
        os.chown(top, user.uid, user.gid)
        (top / "do.prog").write_text(DO_PROGRAM)
        (top / "do.json").write_text(json.dumps({
            "manifest": 2, "kind": "tool", "name": "x.do", "description": "The x.do tool.",
            "schema": {"type": "object"}, "cap": {}, "exec": "do.prog",
        }))  # fmt: skip
        for path in top.iterdir():
            os.chown(path, user.uid, user.gid)
        env = clean_env(CTX_STORAGE=str(top / "storage"), HOME=str(top))
        request = json.dumps({"name": "me", "label": "me_t", "tools": ["x.do"]})
        script = (
            f"set -e; {CTX_ARGV[0]} bootstrap >/dev/null; "
            f"{CTX_ARGV[0]} object install {top / 'do.json'} --tier system >/dev/null; "
            f"echo '{request}' | {CTX_ARGV[0]} agent create - >/dev/null; "
            f"echo 'allow me_t tool:x.do execute' >> {top}/storage/tool/x.do.d/policy"
        )
        made = run_as(user, ["sh", "-c", script], env=env, cwd=top)
        assert made.returncode == 0, made
        value = step_input(("pid",), ("err", b"half\xff"), ("err", b" line\nlast"), exit=3)
        ran = subprocess.run([*CTX_ARGV, "run", "--native", "--agent", "me", "x.do"],
                             input=json.dumps(value).encode(), capture_output=True, env=env,
                             cwd=top, user=user.uid, group=user.gid, extra_groups=[],
                             timeout=60)  # fmt: skip
        assert ran.returncode == 1, ran
        frames = [strict_json(line) for line in ran.stdout.split(b"\n")[:-1]]
        assert [f["type"] for f in frames] == ["call", "stderr", "stderr", "result"], frames
        assert [f["text"] for f in frames[1:3]] == ["half\ufffd line", "last"]
        result = frames[-1]
        assert set(result) == RESULT_KEYS and result["exit_status"] == 3
        assert result["output"]["pid"] == frames[0]["pid"] == result["output"]["pgid"]
        assert result["error"]["message"] == "x.do exited with status 3: last"
        session = top / "storage" / result["session"] / "events.jsonl"
        events = [strict_json(x) for x in session.read_bytes().splitlines()]
        assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
        assert events[1]["exit_status"] == 3 and events[1]["call"] == result["call"]
        assert events[1]["duration_ms"] == result["timings_ms"]["total"]
    finally:
        shutil.rmtree(top, ignore_errors=True)
