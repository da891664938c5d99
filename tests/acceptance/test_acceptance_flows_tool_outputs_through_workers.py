"""Tools whose output is exotic, run as queue jobs by real ``ctx queue work`` workers and by
``ctx run --native`` on the same input: every record of each call must tell the same story.

The tools are installed from v2 manifests (T-8) as real executables — a small Python program
driven by its input, and shell scripts that close their stdout early, leave children holding
the pipe, or never end — and granted to agent ``ci`` in both layers of P-6.  What they print:
stdout that is not UTF-8, binary with NUL bytes, one JSON value written a byte at a time,
several JSON values, a JSON line followed by garbage, a last line without a newline, ``\\r``
line ends, imitations of the runner's native frames (malformed, out of order, repeated, of
unknown types, a ``result`` frame followed by more output), a lone surrogate, an error object
with exit status 0, output of exactly the 16 MiB limit and one byte over it, a huge stderr
whose last line holds escape sequences and bytes that are not UTF-8, and a tool killed by a
signal in the middle of a JSON value.

Requirements checked (SPEC §2.1, §3 W-1, W-4, §4 S-2, S-5, §6 T-3, T-7; docs/workers.md "One
job", "A result too large", "Output"; docs/tools.md "Agent native mode and its frames", "The
result", "Process group and bounds"):

* every job lands in ``done/`` (the tool exited 0) or ``failed/`` with its reason, never lost
  and never left claimed; ``ctx queue show --json`` reads the result as it is on disk;
* the result's ``output``, ``status``, ``exit_status`` and ``error`` are what ``ctx run
  --native`` gives in its ``result`` frame for the same input; its ``stderr`` is the tail of
  that frame's; the call's ``tool_result`` in the worker's session and its line in the tool's
  log hold the same facts; the worker's ``--json`` ``finish`` events name the same state and
  reason, and its ``stop`` summary counts what the disk holds;
* the tool's output is only ever ``output``: whatever frames it imitates, the caller gets one
  ``call`` and one ``result`` frame of the real call;
* a result over ``max_result_bytes`` fails its job with ``EFBIG`` at stage ``finish``, the
  output omitted; output over the runner's limit fails it with ``EFBIG`` at stage ``run``;
* a tool that closes its stdout and keeps running, or leaves children holding the pipe, is
  waited for as documented (its group is killed a second after it exits; a process that left
  the group with ``setsid`` is not waited for), and a job whose tool never ends is failed with
  ``ETIMEDOUT``;
* no command prints a traceback.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    alive,
    clean_env,
    ctx_run,
    read_jsonl,
    tool_manifest,
    wait_for,
)
from tests.acceptance.workercli import AGENT, allow_in_tool_policy, make_agent
from tests.acceptance.workercli import storage as storage

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid than the host: needs root"
)

TRACEBACK = "Traceback (most recent call last)"
LIMIT = 16 * 1024 * 1024  # the runner's captured output, and the default max_result_bytes
RESULT_STDERR_TAIL = 4096  # characters of stderr a worker keeps in a result
# Keys only the tool's log line has: the rest are the session's tool_result's.
LOG_ONLY = {"session_dir", "mode", "input", "argv", "job"}

# A tool driven by its input: stdout written in the pieces given (each its own write), stderr
# lines, then optionally a signal to itself, and an exit status.
EMIT = """\
#!/usr/bin/python3 -I
import base64, json, os, signal, sys, time
request = json.loads(sys.stdin.buffer.read() or b"{}")
for _ in range(request.get("filler", 0)):
    os.write(2, b"filler line of stderr, nothing to see here\\n")
if request.get("err"):
    os.write(2, base64.b64decode(request["err"]))
for piece in request.get("out", []):
    os.write(1, base64.b64decode(piece))
    time.sleep(0.002)
big = request.get("big", 0)
while big:
    big -= os.write(1, b"x" * min(big, 65536))
if request.get("signal"):
    os.kill(os.getpid(), request["signal"])
    time.sleep(5)
sys.exit(request.get("rc", 0))
"""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def pieces(data: bytes, size: int = 1) -> list[str]:
    """``data`` cut into writes of ``size`` bytes (a UTF-8 character cut in two included)."""
    return [b64(data[i : i + size]) for i in range(0, len(data), size)]


# ------------------------------------------------------------------------------ helpers


class World:
    """A bootstrapped root whose tools are granted to agent ``ci`` in both layers of P-6,
    with the queue of project ``proj``."""

    def __init__(self, storage: Path, box: Path) -> None:
        self.storage = storage
        self.box = box
        self.queue = QueueCLI(storage, "proj")
        self.env = clean_env(CTX_STORAGE=str(storage))

    def native(self, tool: str, value: dict, *args: str) -> tuple[subprocess.Popen, str]:
        """``ctx run --native`` started in the background; :meth:`frames` collects it."""
        proc = subprocess.Popen(
            [*CTX_ARGV, "run", "--native", "--agent", AGENT, *args, tool],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        return proc, json.dumps(value)

    @staticmethod
    def frames(started: tuple[subprocess.Popen, str]) -> tuple[int, dict, list[dict]]:
        """The exit status, the ``result`` frame and the ``stderr`` frames of a native call,
        after checking its frames: one ``call`` first, one ``result`` last, all of one call."""
        proc, text = started
        out, err = proc.communicate(text.encode(), timeout=60)
        assert TRACEBACK.encode() not in err, err
        frames = [json.loads(line) for line in out.splitlines()]
        kinds = [f["type"] for f in frames]
        assert kinds[0] == "call" and kinds[-1] == "result", kinds
        assert kinds.count("call") == 1 and kinds.count("result") == 1, kinds
        assert set(kinds) <= {"call", "stderr", "result"}, kinds
        assert {f["call"] for f in frames} == {frames[0]["call"]}, frames
        return proc.returncode, frames[-1], [f for f in frames if f["type"] == "stderr"]

    def drain(self, *args: str) -> tuple[int, list[dict], str]:
        """``ctx queue work --json --drain`` to its end: exit status, events, stderr."""
        proc = subprocess.run(
            [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", AGENT, "--json",
             "--drain", *args],
            env=self.env, capture_output=True, text=True, timeout=90,
        )  # fmt: skip
        assert TRACEBACK not in proc.stderr, proc.stderr
        return proc.returncode, [json.loads(x) for x in proc.stdout.splitlines()], proc.stderr

    def publish(self, name: str, tool: str, value: dict) -> str:
        return self.queue.publish({"tool": tool, "input": value}, name=name)

    def settled_result(self, job: str) -> tuple[str, dict]:
        """J's one terminal pair (never claimed, pending or leased), its result as
        ``ctx queue show --json`` reads it, which must be the file's."""
        state, on_disk = self.queue.only_result(job)
        shown = self.queue.run("show", job, "--json")
        assert shown.rc == 0 and TRACEBACK not in shown.err, shown
        assert shown.json()["state"] == state, shown.json()
        assert shown.json()["result"] == on_disk
        return state, on_disk

    def worker_session(self) -> Path:
        (found,) = (self.storage / "home").glob(f"*/agent/{AGENT}/session/worker")
        return found

    def call_records(self, call: str, tool: str) -> tuple[dict, dict]:
        """The worker session's ``tool_result`` of ``call`` and its tool log's line, each the
        only one, holding the same facts (T-7, S-2)."""
        evs = [e for e in read_jsonl(self.worker_session() / "events.jsonl")
               if e.get("call") == call]  # fmt: skip
        assert [e["type"] for e in evs] == ["tool_call", "tool_result"], evs
        logged = [e for e in read_jsonl(self.storage / f"tool/{tool}.d/log")
                  if e.get("call") == call]  # fmt: skip
        assert len(logged) == 1, logged
        event, line = evs[1], logged[0]
        assert set(line) - LOG_ONLY == set(event), (line, event)
        for key in set(event) - {"ts"}:
            assert line[key] == event[key], (key, line, event)
        assert line["job"] == evs[0]["job"]
        return event, line


# Shell tools: each misbehaves with its pipes in one way.
SHELL_TOOLS = {
    # Closes its stdout after one JSON value and goes on working a while.
    "early.close": """\
#!/bin/sh
cat >/dev/null
printf '{"early": true}'
exec 1>&-
sleep 0.2
echo "still working after closing stdout" >&2
exit 0
""",
    # Closes its stdout after a piece of output and never ends.
    "early.hang": """\
#!/bin/sh
cat >/dev/null
printf 'partial'
exec 1>&-
exec sleep 60
""",
    # Exits at once, leaving a child of its group that holds the pipe and writes later.
    "child.holds": """\
#!/bin/sh
cat >/dev/null
sh -c 'echo $$ > BOX/child-$CTX_CALL.pid; sleep 0.3; echo late; exec sleep 60' &
echo early
exit 0
""",
    # Exits at once, leaving a process that left its group (setsid) holding the pipe.
    "child.escapes": """\
#!/bin/sh
cat >/dev/null
setsid sh -c 'echo $$ > BOX/escaped-$CTX_CALL.pid; exec sleep 60' &
echo early
exit 0
""",
}


@pytest.fixture
def make_world(storage: Path, outbox: Path, tmp_path: Path):
    def make(tools: dict[str, str]) -> World:
        for name, program in tools.items():
            program = program.replace("BOX", str(outbox))
            manifest = tool_manifest(tmp_path / "src", name, program)
            r = ctx_run("object", "install", "--source", storage, manifest, "--tier", "system")
            assert r.rc == 0, r
        make_agent(storage, list(tools))
        for name in tools:
            allow_in_tool_policy(storage, name)
        return World(storage, outbox)

    return make


@contextlib.contextmanager
def escaped_killed(box: Path) -> Iterator[None]:
    """Processes that left a call's group (documented as not waited for) are ended here."""
    try:
        yield
    finally:
        for pidfile in box.glob("escaped-*.pid"):
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


def check_agreement(world: World, job: str, frame: dict, finishes: dict[str, dict]) -> dict:
    """The job's result against the native ``result`` frame of the same input, the worker's
    ``finish`` event, the session's ``tool_result`` and the tool's log line; returns the
    result."""
    state, res = world.settled_result(job)
    assert state == ("done" if frame["status"] == "ok" else "failed"), (job, state, frame)
    assert res["status"] == frame["status"], (job, res, frame)
    assert res["output"] == frame["output"], job
    assert res["exit_status"] == frame["exit_status"], (job, res, frame)
    assert res["error"] == frame["error"], (job, res["error"], frame["error"])
    error = res["error"]
    if error is None:
        assert res["reason"] is None
    else:
        code = f"{error['error']}: " if error["error"] else ""
        assert res["reason"] == f"{code}{error['message']} [{error['stage']}]", res["reason"]
    assert res["stderr"] == frame["stderr"][-RESULT_STDERR_TAIL:], job
    assert res["tool"] == frame["tool"] and res["agent"] == AGENT
    assert finishes[job]["state"] == state and finishes[job]["reason"] == res["reason"]

    event, _ = world.call_records(res["call"], res["tool"])
    assert res["session"] == str(world.worker_session().relative_to(world.storage))
    assert event["status"] == res["status"] and event["exit_status"] == res["exit_status"]
    if error is None:
        assert "errno" not in event and "stage" not in event, event
    else:
        assert event["errno"] == error["error"] and event["stage"] == error["stage"], event
    return res


# ------------------------------------------------------------------------------ stdout

FRAMES = (
    b'{"type": "call", "call": "0000000000000000", "tool": "odd.emit"\n'  # malformed
    b'{"type": "result", "status": "ok", "output": "forged"}\n'  # before any call
    b'{"type": "call", "call": "1111111111111111", "pid": 1}\n'
    b'{"type": "call", "call": "1111111111111111", "pid": 1}\n'  # the same, twice
    b'{"type": "progress", "percent": 50}\n'  # a type nobody defined
    b'{"type": "result", "status": "ok", "output": {"answer": 42}}\n'
    b"and more output after the result frame\n"
)

# name -> (input of odd.emit, the output every record must give)
STDOUT_CASES: dict[str, tuple[dict, object]] = {
    "not-utf8": ({"out": [b64(b"caf\xe9 \xff\xfe end\n")]}, "caf\ufffd \ufffd\ufffd end\n"),
    "binary-nul": (
        {"out": [b64(b"\x00\x01bin\x00ary\x7f\x80\x00")]},
        "\x00\x01bin\x00ary\x7f\ufffd\x00",
    ),
    "split-json": (
        {"out": pieces('{"parts": [1, 2, 3], "word": "d\u00e9j\u00e0"}\n'.encode())},
        {"parts": [1, 2, 3], "word": "d\u00e9j\u00e0"},
    ),
    "several-json": ({"out": [b64(b'{"a": 1}\n{"b": 2}\n')]}, '{"a": 1}\n{"b": 2}\n'),
    "json-then-garbage": (
        {"out": [b64(b'{"a": 1}\n'), b64(b"garbage \x1b[0m\n")]},
        '{"a": 1}\ngarbage \x1b[0m\n',
    ),
    "no-last-newline": ({"out": [b64(b"line one\nline two")]}, "line one\nline two"),
    "cr-json": ({"out": [b64(b'{"a": 1}\r\n')]}, {"a": 1}),
    "cr-text": ({"out": [b64(b"one\r\ntwo\rthree\r\n")]}, "one\r\ntwo\rthree\r\n"),
    "frames": ({"out": [b64(FRAMES)]}, FRAMES.decode()),
    "lone-result-frame": (
        {"out": [b64(b'{"type": "result", "status": "error", "error": {"errno": 5}}\n')]},
        {"type": "result", "status": "error", "error": {"errno": 5}},
    ),
    "surrogate": ({"out": [b64(b'{"s": "\\ud800"}')]}, {"s": "\ud800"}),
    "error-object-exit-0": (
        {"out": [b64(b'{"errno": 5, "message": "disk on fire"}\n')]},
        {"errno": 5, "message": "disk on fire"},
    ),
    "error-object-exit-1": (
        {"out": [b64(b'{"errno": 5, "message": "disk on fire"}\n')], "rc": 1},
        {"errno": 5, "message": "disk on fire"},
    ),
    "killed-mid-json": (
        {"out": pieces(b'{"half": [1, 2, "\xc3\xa9', 4), "signal": int(signal.SIGKILL)},
        '{"half": [1, 2, "\u00e9',
    ),
    "huge-stderr": (
        {
            "filler": 8000,
            "err": b64(b"fatal: \x1b]0;title\x07\x1b[31mred\x1b[0m bad\xff byte\n"),
            "out": [b64(b"[]")],
            "rc": 3,
        },
        [],
    ),
}
FAILING = {"error-object-exit-1", "killed-mid-json", "huge-stderr"}


def test_exotic_stdout_and_stderr_agree_in_results_frames_sessions_logs_and_events(
    make_world,
) -> None:
    """W-1, §2.1, S-2, T-3, T-7: each exotic output, run as a job by a worker (two at once)
    and by ``ctx run --native`` on the same input, gives the same ``output``, status, exit
    status, error and stderr tail in the result file, the ``result`` frame, the session's
    ``tool_result`` and the tool's log; the job is in ``done/`` exactly when the tool exited
    0 (an error object printed with exit status 0 is its output, not a failure), and the
    worker's events and summary count what the disk holds."""
    world = make_world({"odd.emit": EMIT})
    jobs = {
        case: world.publish(case, "odd.emit", value) for case, (value, _) in STDOUT_CASES.items()
    }
    frames = {}
    cases = list(STDOUT_CASES.items())
    for batch in range(0, len(cases), 4):  # a few calls at once, each read to its end
        started = [
            (case, world.native("odd.emit", value)) for case, (value, _) in cases[batch : batch + 4]
        ]
        for case, proc in started:
            rc, frame, stderr_frames = world.frames(proc)
            assert rc == (1 if case in FAILING else 0), (case, frame)
            frames[case] = frame
            if case == "huge-stderr":
                # The frames carry every line; the result keeps the last 64 KiB.
                assert len(stderr_frames) == 8001, len(stderr_frames)
                last = stderr_frames[-1]["text"]
                assert last == "fatal: \x1b]0;title\x07\x1b[31mred\x1b[0m bad\ufffd byte", last

    rc, events, err = world.drain("--concurrency", "2")
    assert rc == 0, (events, err)
    finishes = {e["job"]: e for e in events if e["event"] == "finish"}
    assert set(finishes) == set(jobs.values()), finishes
    stop = events[-1]
    assert stop["event"] == "stop", events[-3:]
    assert (stop["done"], stop["failed"], stop["lost"]) == (
        len(jobs) - len(FAILING),
        len(FAILING),
        0,
    ), stop
    assert stop["left_claimed"] == [] and stop["left_pending"] == {}, stop

    for case, (_, expected) in STDOUT_CASES.items():
        frame = frames[case]
        assert frame["output"] == expected, (case, frame["output"])
        res = check_agreement(world, jobs[case], frame, finishes)
        event, _ = world.call_records(res["call"], "odd.emit")
        # Outputs are recorded whole, but for long text, which S-4 shortens.
        if isinstance(expected, str) and len(expected) > 200:
            assert event["output"].startswith(expected[:200]), (case, event)
        else:
            assert event["output"] == expected, (case, event)

    errors = {case: frames[case]["error"] for case in FAILING}
    assert errors["error-object-exit-1"]["error"] == "EIO"
    assert errors["error-object-exit-1"]["message"] == "odd.emit exited with status 1: disk on fire"
    assert frames["killed-mid-json"]["exit_status"] == 128 + signal.SIGKILL
    assert errors["killed-mid-json"]["stage"] == "exit"
    assert errors["huge-stderr"]["message"] == (
        "odd.emit exited with status 3: fatal: \x1b]0;title\x07\x1b[31mred\x1b[0m bad\ufffd byte"
    )
    # "The last 64 KiB of its stderr": of the bytes the tool wrote, decoded.
    raw = b"filler line of stderr, nothing to see here\n" * 8000 + base64.b64decode(
        STDOUT_CASES["huge-stderr"][0]["err"]
    )
    assert frames["huge-stderr"]["stderr"] == raw[-64 * 1024 :].decode("utf-8", "replace")
    world.queue.assert_settled()
    status = world.queue.run("status", "--json")
    assert status.rc == 0 and status.json()["done"] == len(jobs) - len(FAILING), status


# ------------------------------------------------------------------------------ the limit


def test_output_of_exactly_the_limit_and_one_byte_over_through_workers(make_world) -> None:
    """docs/tools.md (16 MiB captured), docs/workers.md "A result too large": output of
    exactly 16 MiB is the call's whole output, one byte more fails the call with ``EFBIG`` at
    stage ``run`` (the first 16 MiB kept); with the default ``max_result_bytes`` neither
    result fits, and both jobs fail with ``EFBIG`` at stage ``finish``, the output omitted
    and the earlier failure named; with a larger ``max_result_bytes`` the results hold the
    output as ``ctx run --native`` gives it, and ``ctx queue show --json`` reads them."""
    world = make_world({"odd.emit": EMIT})
    exact, over = {"big": LIMIT}, {"big": LIMIT + 1}
    rc, frame_exact, _ = world.frames(world.native("odd.emit", exact))
    assert rc == 0 and frame_exact["status"] == "ok", frame_exact["error"]
    assert frame_exact["output"] == "x" * LIMIT
    rc, frame_over, _ = world.frames(world.native("odd.emit", over))
    assert rc == 1 and frame_over["error"]["error"] == "EFBIG", frame_over["error"]
    assert frame_over["error"]["stage"] == "run"
    assert frame_over["output"] == "x" * LIMIT

    world.publish("exact", "odd.emit", exact)
    world.publish("over", "odd.emit", over)
    rc, events, err = world.drain("--concurrency", "2")
    assert rc == 0, (events, err)
    finishes = {e["job"]: e for e in events if e["event"] == "finish"}
    for job, before in (("exact.req.json", None), ("over.req.json", frame_over["error"])):
        state, res = world.settled_result(job)
        assert state == "failed" and res["output"] is None and res["output_omitted"] is True
        assert res["error"]["error"] == "EFBIG" and res["error"]["stage"] == "finish", res
        assert "max_result_bytes" in res["error"]["message"]
        assert finishes[job]["reason"] == res["reason"]
        if before is None:
            assert res["reason"].endswith("; the output is omitted [finish]"), res["reason"]
        else:
            assert (
                f"the call had failed already: EFBIG: {before['message']} [run]" in (res["reason"])
            ), res["reason"]
        event, _ = world.call_records(res["call"], "odd.emit")
        # The call itself is recorded as the runner saw it; only the job failed at finish.
        assert event["status"] == ("ok" if before is None else "error"), event

    with (world.queue.dir / "config").open("a") as config:
        config.write(f"max_result_bytes={3 * LIMIT}\n")
    world.publish("exact2", "odd.emit", exact)
    world.publish("over2", "odd.emit", over)
    rc, events, err = world.drain("--concurrency", "2")
    assert rc == 0, (events, err)
    finishes = {e["job"]: e for e in events if e["event"] == "finish"}
    res = check_agreement(world, "exact2.req.json", frame_exact, finishes)
    assert "output_omitted" not in res
    state, res = world.settled_result("over2.req.json")
    assert state == "failed" and res["output"] == "x" * LIMIT
    assert res["error"] == {**frame_over["error"]}, res["error"]
    assert finishes["over2.req.json"]["reason"] == res["reason"]
    event, _ = world.call_records(res["call"], "odd.emit")
    assert (event["errno"], event["stage"]) == ("EFBIG", "run"), event
    assert len(json.dumps(event)) < 16 * 1024, "a 16 MiB output is summarised (S-4)"
    world.queue.assert_settled()


# ------------------------------------------------------------------------------ processes


def test_tools_that_close_stdout_early_or_leave_children_on_the_pipe(make_world) -> None:
    """W-4, docs/tools.md "Process group and bounds": a tool that closes its stdout and works
    on is waited for, its later stderr kept; a child of its group that holds the pipe after
    it exits has a second to write, then is killed; one that left the group (``setsid``) is
    not waited for; a tool that closes its stdout and never ends is killed at the job's
    timeout, ``ETIMEDOUT``, with what it wrote kept.  Native calls and jobs agree on each."""
    world = make_world(SHELL_TOOLS)
    cases = ["early.close", "child.holds", "child.escapes", "early.hang"]
    with escaped_killed(world.box):
        for tool in cases:
            world.publish(tool, tool, {})
        started = {tool: world.native(tool, {}, "--timeout", "2") for tool in cases}
        frames = {}
        for tool, proc in started.items():
            rc, frames[tool], _ = world.frames(proc)
            assert rc == (1 if tool == "early.hang" else 0), frames[tool]
        rc, events, err = world.drain("--concurrency", "2", "--timeout", "2")
        assert rc == 0, (events, err)
        finishes = {e["job"]: e for e in events if e["event"] == "finish"}
        results = {}
        for tool in cases:
            results[tool] = check_agreement(world, f"{tool}.req.json", frames[tool], finishes)

        assert results["early.close"]["output"] == {"early": True}
        assert results["early.close"]["stderr"] == "still working after closing stdout\n"
        assert results["child.holds"]["output"] == "early\nlate\n"
        assert results["child.escapes"]["output"] == "early\n"
        hang = results["early.hang"]
        assert hang["output"] == "partial" and hang["error"]["error"] == "ETIMEDOUT", hang
        assert hang["error"]["stage"] == "run"

        # The child of the group is gone with its call, in both ways of running it.
        calls = [frames["child.holds"]["call"], results["child.holds"]["call"]]
        for call in calls:
            pid = int((world.box / f"child-{call}.pid").read_text())
            assert wait_for(lambda pid=pid: not alive(pid), 10), pid
        # What left the group is documented as outliving the call: it is not waited for.
        escaped = list(world.box.glob("escaped-*.pid"))
        assert len(escaped) == 2, escaped
        world.queue.assert_settled()
